//! The companion beside a stock kubelet: on a node whose pods the kubelet runs with
//! containerd (or any CRI runtime), it answers the controller's recovery challenge with an
//! inventory read from the runtime's CRI, so that a fenced stock node rejoins without a
//! person's `confirm-clean`.
//!
//! Each pass reads the recovery challenge from the Node ([`RECOVERY_CHALLENGE`]), *then* lists
//! every pod sandbox and container through the CRI, and writes both with the machine's boot ID
//! and system UUID as annotations on the node's Lease (`kube-node-lease/<node>`), with a JSON
//! merge patch that touches nothing else and applies only to the Lease the pass read (its
//! `resourceVersion`). The kubelet owns that Lease and renews it; its renewals keep
//! annotations (a renewal that meets the companion's write conflicts, reads the Lease again
//! and retries, and so does a companion write that meets a renewal). The companion never
//! writes the kubelet's `renewTime`; its own write stamp, when it writes one, counts as the
//! node's write too (see the self-fence and [`peer`]).
//!
//! **The self-fence** (with `--watchdog`): the companion opens the hardware watchdog after
//! its first successful write, arms it `nowayout`, and pets it only while its last successful
//! write was sent at most `--self-fence-after` ago. Each write then carries the promise (the
//! timeout, the armed watchdog as the kernel reported it, the machine's virtualization, scope
//! `all`) and its write stamp ([`COMPANION_WRITTEN`]). The companion writes only while it
//! sees the kubelet renew: once the kubelet's `renewTime` has not moved for the Lease's own
//! `leaseDurationSeconds`, it stops writing, so that the controller, which counts each stamp
//! as the node's write, sees the node go silent. Past `--self-fence-after` without a write it
//! stops every pod's containers and sandboxes through the CRI (its own pod excepted), again
//! every pass, and the watchdog resets the machine a timeout after the last pet.
//!
//! Guarantees:
//! - the advertisement says [`RuntimeSource::Cri`], names every pod UID of which the runtime
//!   holds any record (a sandbox or a container, live or exited), and answers a challenge only
//!   with an inventory taken after that challenge was read; when the runtime gives no complete
//!   answer (a missing, hung or lying socket), it advertises no inventory and no answer, and
//!   says why in its log;
//! - a self-fence is promised only with a watchdog the kernel reported armed, by a write that
//!   carries a stamp; no pet follows a moment when the last successful write is older than
//!   `--self-fence-after`, so the machine resets within that plus the watchdog timeout (twice
//!   it, when the companion dies: the kernel pets once more on close) of its last write;
//! - without `--watchdog` it advertises no self-fence, no watchdog and no stamp: nothing on
//!   its word earns a self-fence's trust, and it runs no peer check;
//! - with the peer check ([`peer`]; on by default with `--watchdog`), a companion that cannot
//!   write keeps petting and stops no pod while a strict majority of the nodes vouch that
//!   they cannot write either (a control-plane outage), as the node agent does; every write
//!   is then stamped and conditional on the `resourceVersion` it read.
//!
//! The CRI stop is not the fence: a stock kubelet restarts what it stops (by restart policy,
//! even while it cannot reach the API), so only the watchdog's reset is trusted. The stop ends
//! the writers sooner; the reset ends them for good.
//!
//! Assumptions: what the CRI cannot see ([`crate::cri::BLIND_SPOT`]) and the kubelet's own view
//! of the API (it starts pods, not the companion) are covered by the controller's rule for
//! such an inventory: a proof only from a boot that began after the fence started (see
//! `palisade_decide::phase::clean_proof`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
#[cfg(doc)]
use palisade_model::advertise::COMPANION_WRITTEN;
use palisade_model::advertise::{
    Advertisement, PeerCheck, RuntimeSource, SelfFenceScope, Virtualization, RECOVERY_CHALLENGE,
};
use tokio::sync::watch;
use tokio::time::Instant;

pub mod peer;

use crate::cri::inventory::Inventory;
use crate::cri::{CriClient, CriError};
use crate::node::{bounded, NodeError};
use crate::watchdog::Held;

/// What the companion needs to know.
#[derive(Debug, Clone)]
pub struct CompanionConfig {
    /// The node's name (its Node and its Lease).
    pub node: String,
    /// The runtime's CRI endpoint (`unix:///run/containerd/containerd.sock`).
    pub cri_endpoint: String,
    /// How often a pass runs.
    pub interval: Duration,
    /// The bound of each API call, and of the whole runtime listing.
    pub timeout: Duration,
    /// The self-fence, when the companion has a watchdog (`None`: it promises none).
    pub self_fence: Option<SelfFenceConfig>,
    /// The peer check (`None`: off; only with a self-fence, which it excuses).
    pub peer: Option<peer::PeerSetup>,
}

/// The companion's self-fence.
#[derive(Debug, Clone)]
pub struct SelfFenceConfig {
    /// The watchdog device (`/dev/watchdog`).
    pub watchdog: PathBuf,
    /// The timeout set on it.
    pub watchdog_timeout: Duration,
    /// How often it is petted.
    pub watchdog_interval: Duration,
    /// How long after its last successful write was sent the companion stops petting and
    /// stops the pods.
    pub self_fence_after: Duration,
    /// The companion's own pod UID, spared by the CRI stop (`None`: it runs as a host
    /// process).
    pub own_pod: Option<String>,
}

impl SelfFenceConfig {
    /// Why this self-fence cannot keep its promise with passes every `interval`, each call
    /// bounded by `timeout` (`None`: it can).
    ///
    /// Guarantees: `None` only when the watchdog is petted, and the Lease written, at least
    /// four times per watchdog timeout (what [`Advertisement::companion_current`] assumes) and the self-fence waits longer
    /// than two of the slowest passes (four bounded calls each, plus the interval), so that
    /// one slow or failed pass never self-fences a node whose API server answers.
    pub fn invalid(&self, interval: Duration, timeout: Duration) -> Option<String> {
        if self.watchdog_interval.is_zero() || self.watchdog_interval * 4 > self.watchdog_timeout {
            return Some(format!(
                "--watchdog-interval ({:?}) must be positive and at most a quarter of --watchdog-timeout ({:?})",
                self.watchdog_interval, self.watchdog_timeout
            ));
        }
        if interval * 4 > self.watchdog_timeout {
            return Some(format!(
                "--interval ({interval:?}) must be at most a quarter of --watchdog-timeout ({:?}): the controller takes the promise only from a companion that wrote within half a watchdog timeout of the kubelet's last renewal",
                self.watchdog_timeout
            ));
        }
        let slowest = interval + timeout * 4;
        if self.self_fence_after <= slowest * 2 {
            return Some(format!(
                "--self-fence-after ({:?}) must exceed two of the slowest passes (2 x (--interval + 4 x --timeout) = {:?})",
                self.self_fence_after,
                slowest * 2
            ));
        }
        None
    }
}

/// What the companion promises with a write: the self-fence and the armed watchdog, or
/// nothing.
#[derive(Debug, Clone, Default)]
pub struct Promise {
    /// The self-fence timeout.
    pub self_fence_after: Option<Duration>,
    /// The armed watchdog as the kernel reported it (`None`: not armed, which promises
    /// nothing).
    pub watchdog: Option<palisade_model::advertise::Watchdog>,
    /// Whether the machine is virtual.
    pub virtualization: Option<Virtualization>,
}

/// The kubelet's renewals as the companion sees them on the Lease: whether they still move.
///
/// Guarantees: [`KubeletRenewals::silent`] once the `renewTime` read has not changed for the
/// Lease's `leaseDurationSeconds` (40 s when the Lease says none), counted from the send
/// instant of the read that first returned it; a first read counts as a change.
#[derive(Debug, Clone, Default)]
pub struct KubeletRenewals {
    last: Option<(Option<String>, Instant)>,
    duration: Option<Duration>,
}

impl KubeletRenewals {
    /// Records a read of the Lease sent at `sent`.
    pub fn read(&mut self, lease: &Lease, sent: Instant) {
        let spec = lease.spec.as_ref();
        let renew = spec
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.to_string());
        self.duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|d| u64::try_from(d).ok())
            .filter(|d| *d > 0)
            .map(Duration::from_secs);
        if self.last.as_ref().is_none_or(|(r, _)| *r != renew) {
            self.last = Some((renew, sent));
        }
    }

    /// Whether the kubelet has stopped renewing, at `now` (`false` before any read).
    pub fn silent(&self, now: Instant) -> bool {
        let duration = self.duration.unwrap_or(Duration::from_secs(40));
        self.last
            .as_ref()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) > duration)
    }
}

/// Why a pass wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The API server did not answer (reading the Node, or writing the Lease).
    #[error(transparent)]
    Api(#[from] NodeError),
    /// The kubelet has not created the node's Lease yet: the companion never creates it.
    #[error("node {0}: no Lease in kube-node-lease yet (the kubelet creates it)")]
    NoLease(String),
}

/// What one pass advertises: `challenge` (read from the Node before the runtime was listed)
/// answered by `inventory`, or neither when the runtime gave no complete answer.
///
/// With a `promise` whose watchdog is armed, it also promises the self-fence (scope `all`:
/// the reset ends every pod). It carries the stamp `written` with a promise or a
/// `peer_check` (which it advertises), and without either no stamp.
pub fn advertisement(
    challenge: Option<String>,
    inventory: Result<&Inventory, &CriError>,
    boot_id: Option<String>,
    system_uuid: Option<String>,
    promise: &Promise,
    peer_check: Option<PeerCheck>,
    written: Timestamp,
) -> Advertisement {
    let runtime_pods = inventory.ok().map(|inv| inv.pods.keys().cloned().collect());
    let promised = promise.watchdog.is_some() && promise.self_fence_after.is_some();
    let stamped = promised || peer_check.is_some();
    Advertisement {
        version: Some(env!("CARGO_PKG_VERSION").to_string()),
        boot_id,
        system_uuid,
        challenge: challenge.filter(|_| runtime_pods.is_some()),
        runtime_pods,
        runtime_source: RuntimeSource::Cri,
        self_fence_after: promise.self_fence_after.filter(|_| promised),
        watchdog: promise.watchdog.clone().filter(|_| promised),
        virtualization: promise.virtualization.clone().filter(|_| promised),
        scope: promised.then_some(SelfFenceScope::All),
        peer_check,
        companion_written: stamped.then_some(written),
        ..Advertisement::default()
    }
}

/// The JSON merge patch that writes `ad` on the Lease: its annotations only (a key the
/// advertisement leaves out is removed), on the condition that the Lease is still at
/// `resource_version` (the API server refuses it with a conflict otherwise).
pub fn lease_patch(ad: &Advertisement, resource_version: Option<&str>) -> serde_json::Value {
    let annotations: BTreeMap<String, serde_json::Value> = ad
        .to_annotations()
        .into_iter()
        .map(|(k, v)| {
            (
                k,
                v.map_or(serde_json::Value::Null, serde_json::Value::String),
            )
        })
        .collect();
    match resource_version {
        Some(rv) => serde_json::json!({
            "metadata": { "annotations": annotations, "resourceVersion": rv }
        }),
        None => serde_json::json!({ "metadata": { "annotations": annotations } }),
    }
}

/// The recovery challenge on `node`, trimmed (`None`: none, or empty).
pub fn challenge_of(node: &Node) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()?
        .get(RECOVERY_CHALLENGE)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Lists the runtime once: connects (the runtime's `Version` first) and takes the inventory,
/// the whole bounded by `cfg.timeout`.
async fn list(cfg: &CompanionConfig) -> Result<Inventory, CriError> {
    let listing = async {
        let cri = CriClient::connect(&cfg.cri_endpoint, cfg.timeout).await?;
        crate::cri::inventory::inventory(&cri).await
    };
    tokio::time::timeout(cfg.timeout, listing)
        .await
        .unwrap_or(Err(CriError::Timeout {
            method: "inventory",
            after: cfg.timeout,
        }))
}

/// What one pass did.
#[derive(Debug)]
pub enum Pass {
    /// It wrote this advertisement, with a request sent at this instant.
    Wrote(Box<Advertisement>, Instant),
    /// The kubelet's renewals have stopped: it wrote nothing.
    KubeletSilent,
}

/// One pass: the Lease (is the kubelet still renewing?), the challenge, then the inventory,
/// then the Lease write, conditional on the Lease read. A write that meets a concurrent
/// change (the kubelet's renewal) reads the Lease again and is sent once more; with the peer
/// check (`peer`), each attempt is recorded on its write clock.
pub async fn pass(
    client: &Client,
    cfg: &CompanionConfig,
    kubelet: &mut KubeletRenewals,
    promise: &Promise,
    peer: Option<&peer::PeerWrites>,
) -> Result<Pass, PassError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let read_lease = || async {
        let sent = Instant::now();
        match bounded(
            "read lease",
            &cfg.node,
            cfg.timeout,
            leases.get_opt(&cfg.node),
        )
        .await?
        {
            Some(lease) => Ok((lease, sent)),
            None => Err(PassError::NoLease(cfg.node.clone())),
        }
    };
    let (mut lease, sent) = read_lease().await?;
    kubelet.read(&lease, sent);
    if kubelet.silent(Instant::now()) {
        return Ok(Pass::KubeletSilent);
    }
    let node = bounded("read node", &cfg.node, cfg.timeout, nodes.get(&cfg.node)).await?;
    let challenge = challenge_of(&node);
    let inventory = list(cfg).await;
    if let Err(e) = &inventory {
        tracing::warn!(error = %e, "the container runtime gave no complete inventory: none is advertised");
    }
    let mut retried = false;
    loop {
        let ad = advertisement(
            challenge.clone(),
            inventory.as_ref(),
            crate::node::boot_id(),
            crate::node::system_uuid(),
            promise,
            peer.map(peer::PeerWrites::offer),
            Timestamp::now(),
        );
        let patch = Patch::Merge(lease_patch(&ad, lease.metadata.resource_version.as_deref()));
        if let Some(p) = peer {
            p.sending();
        }
        let sent = Instant::now();
        match bounded(
            "write advertisement",
            &cfg.node,
            cfg.timeout,
            leases.patch(&cfg.node, &PatchParams::default(), &patch),
        )
        .await
        {
            Ok(_) => {
                if let Some(p) = peer {
                    p.written(&ad);
                }
                return Ok(Pass::Wrote(Box::new(ad), sent));
            }
            Err(e) if e.is_not_found() => return Err(PassError::NoLease(cfg.node.clone())),
            Err(e) if e.is_conflict() && !retried => {
                retried = true;
                let (again, sent) = read_lease().await?;
                kubelet.read(&again, sent);
                if kubelet.silent(Instant::now()) {
                    return Ok(Pass::KubeletSilent);
                }
                lease = again;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether the self-fence is due: the last successful write was sent more than `after` ago.
pub fn fence_due(last_write: Instant, after: Duration, now: Instant) -> bool {
    now.saturating_duration_since(last_write) > after
}

/// Stops, through the CRI, every live pod but `own`; returns what is still live after, or why
/// the runtime could not confirm it.
async fn stop_all_but(
    cfg: &CompanionConfig,
    own: Option<&str>,
) -> Result<BTreeSet<String>, CriError> {
    let cri = CriClient::connect(&cfg.cri_endpoint, cfg.timeout).await?;
    let report = crate::cri::stop::stop_pods(&cri, |uid| Some(uid) != own).await?;
    for e in &report.errors {
        tracing::warn!(error = %e, "self-fence: a stop failed");
    }
    Ok(report.still_live)
}

/// The self-fence loop: every `cfg.interval`, once [`fence_due`] and not excused by the
/// peers, stops the pods through the CRI (again each time: the kubelet restarts them). The
/// watchdog, unpetted by then, is what ends them for good.
async fn self_fence(
    cfg: CompanionConfig,
    sf: SelfFenceConfig,
    renewed: watch::Receiver<Instant>,
    excused: crate::node::Excused,
) {
    let mut fenced = false;
    let mut was_excused = false;
    loop {
        tokio::time::sleep(cfg.interval).await;
        let now = Instant::now();
        let late = fence_due(*renewed.borrow(), sf.self_fence_after, now);
        let excused_now = late && crate::node::excused_at(&excused, now);
        if excused_now != was_excused {
            if excused_now {
                tracing::warn!("no successful write for --self-fence-after, but a majority of peers cannot write either: no self-fence (the watchdog is still petted)");
            }
            was_excused = excused_now;
        }
        let due = late && !excused_now;
        if due != fenced {
            if due {
                tracing::error!(after = ?sf.self_fence_after, "self-fence: no successful write for --self-fence-after: stopping every pod through the CRI; the watchdog is no longer petted and resets the machine at its timeout");
            } else {
                tracing::info!(
                    "written again: the self-fence is lifted (the watchdog is petted again)"
                );
            }
            fenced = due;
        }
        if !due {
            continue;
        }
        match stop_all_but(&cfg, sf.own_pod.as_deref()).await {
            Ok(live) if live.is_empty() => {
                tracing::info!("self-fence: the runtime lists no live pod (but the kubelet may start them again: the watchdog is the fence)");
            }
            Ok(live) => tracing::warn!(?live, "self-fence: pods still live after the stop"),
            Err(e) => {
                tracing::error!(error = %e, "self-fence: the runtime cannot confirm the stop; the watchdog resets the machine")
            }
        }
    }
}

/// Runs a pass every `cfg.interval`, for ever; a failed pass is logged and the next one runs
/// on time. With [`CompanionConfig::self_fence`], also the watchdog's service (opened after
/// the first successful write) and the self-fence loop.
///
/// Errors: the peer check's port cannot be bound.
pub async fn run(client: Client, cfg: CompanionConfig) -> std::io::Result<()> {
    let (renewed_tx, renewed_rx) = watch::channel(Instant::now());
    let held = Held::default();
    // Without the peer check the node is never excused: the sender stays here, unused.
    let (_excused_tx, mut excused) = watch::channel(None);
    let mut peer = None;
    if let Some(setup) = cfg.peer.clone() {
        let started = peer::start(
            client.clone(),
            setup,
            renewed_rx.clone(),
            cfg.interval + cfg.timeout,
        )
        .await?;
        excused = started.excused;
        peer = Some(started.writes);
    }
    let mut promise = Promise::default();
    if let Some(sf) = cfg.self_fence.clone() {
        let virtualization = crate::virt::detect(&crate::virt::Roots::host());
        tracing::info!(virtualization = virtualization.as_str(), "machine detected");
        promise.self_fence_after = Some(sf.self_fence_after);
        promise.virtualization = Some(virtualization.clone());
        let (_fence_tx, fence) = watch::channel(crate::pod_worker::FenceState::default());
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let service = crate::watchdog::Service {
            cfg: crate::watchdog::WatchdogConfig {
                path: sf.watchdog.clone(),
                interval: sf.watchdog_interval,
                max_lease_age: sf.self_fence_after,
            },
            request: crate::watchdog_device::ArmRequest {
                timeout: sf.watchdog_timeout,
                nowayout: true,
                interval: sf.watchdog_interval,
            },
            // Opened only after the first successful write: a restarted companion never pets
            // a watchdog its predecessor left unpetted before it wrote again.
            opened: None,
            virtualization,
            held: held.clone(),
            renewed: renewed_rx.clone(),
            excused: excused.clone(),
            fence,
            shutdown,
            // Never disarmed: the companion cannot tell, at its stop, what the kubelet runs.
            may_disarm: Arc::new(|| false),
            on_armed: Arc::new(|_| {}),
            on_arm_failure: Arc::new(|| {}),
        };
        tokio::spawn(async move {
            // Keep the channels' senders for as long as the service runs.
            let _keep = (_fence_tx, _shutdown_tx);
            if let Err(e) = crate::watchdog::serve(service).await {
                tracing::error!(error = %e, "watchdog stopped: no self-fence is promised");
            }
        });
        tokio::spawn(self_fence(cfg.clone(), sf, renewed_rx, excused));
    }
    let mut kubelet = KubeletRenewals::default();
    let mut last = None;
    let mut silent = false;
    loop {
        promise.watchdog = held.advertised();
        match pass(&client, &cfg, &mut kubelet, &promise, peer.as_ref()).await {
            Ok(Pass::Wrote(ad, sent)) => {
                let _ = renewed_tx.send(sent);
                if silent {
                    tracing::info!("the kubelet renews again: writing again");
                    silent = false;
                }
                let now = Some((
                    ad.challenge.clone(),
                    ad.runtime_pods.clone(),
                    ad.watchdog.is_some(),
                ));
                if now != last {
                    tracing::info!(challenge = ?ad.challenge, pods = ?ad.runtime_pods, self_fence = ad.self_fence_after.is_some(), "advertised: the challenge answered, the pods the container runtime holds, and the self-fence promise");
                    last = now;
                }
            }
            Ok(Pass::KubeletSilent) => {
                if !silent {
                    tracing::warn!("the kubelet's renewals stopped (its Lease's renewTime has not moved for its leaseDurationSeconds): writing nothing, so the node is seen silent");
                    silent = true;
                }
            }
            Err(e) => tracing::warn!(error = %e, "advertisement not written"),
        }
        tokio::time::sleep(cfg.interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::inventory::PodInRuntime;
    use palisade_model::advertise::{CHALLENGE_ANSWERED, RUNTIME_PODS, RUNTIME_SOURCE};

    fn inventory() -> Inventory {
        let mut pods = BTreeMap::new();
        pods.insert(
            "live".to_string(),
            PodInRuntime {
                name: "app/db-0".into(),
                sandboxes: vec![("s1".into(), true)],
                containers: vec![("c1".into(), true)],
            },
        );
        pods.insert(
            "exited".to_string(),
            PodInRuntime {
                name: "app/old-0".into(),
                sandboxes: vec![("s2".into(), false)],
                containers: vec![("c2".into(), false)],
            },
        );
        Inventory { pods }
    }

    /// The advertisement of a companion without a self-fence or a peer check, answering
    /// challenge `nf-1` with `inventory`.
    fn plain(inventory: Result<&Inventory, &CriError>) -> Advertisement {
        advertisement(
            Some("nf-1".into()),
            inventory,
            Some("b".into()),
            None,
            &Promise::default(),
            None,
            Timestamp::UNIX_EPOCH,
        )
    }

    /// `ad` as the controller reads it back from the annotations its patch writes.
    fn read_back(ad: &Advertisement) -> Advertisement {
        let patch = lease_patch(ad, None);
        let a: BTreeMap<String, String> = patch["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        Advertisement::from_annotations(&a)
    }

    #[test]
    fn every_pod_the_runtime_holds_a_record_of_is_advertised_live_or_not() {
        let inv = inventory();
        let ad = plain(Ok(&inv));
        let pods = ad.runtime_pods.as_ref().unwrap();
        assert!(pods.contains("live") && pods.contains("exited"), "{pods:?}");
        assert_eq!(ad.challenge.as_deref(), Some("nf-1"));
        assert_eq!(ad.runtime_source, RuntimeSource::Cri);
        // Nothing of a self-fence is promised.
        assert_eq!(ad.self_fence_after, None);
        assert_eq!(ad.watchdog, None);
        assert_eq!(ad.peer_check, None);
        assert_eq!(ad.companion_written, None);
    }

    #[test]
    fn a_runtime_without_a_complete_answer_advertises_no_inventory_and_no_answer() {
        let e = CriError::Timeout {
            method: "ListContainers",
            after: Duration::from_secs(2),
        };
        let ad = plain(Err(&e));
        assert_eq!(ad.runtime_pods, None);
        assert_eq!(ad.challenge, None);
        let patch = lease_patch(&ad, None);
        let a = &patch["metadata"]["annotations"];
        // Earlier answers are withdrawn, not left standing.
        assert!(
            a[RUNTIME_PODS].is_null() && a[CHALLENGE_ANSWERED].is_null(),
            "{a}"
        );
        assert_eq!(a[RUNTIME_SOURCE], "cri");
        // The patch writes annotations only (never the kubelet's renewTime).
        assert_eq!(patch.as_object().unwrap().len(), 1);
        assert_eq!(patch["metadata"].as_object().unwrap().len(), 1);
    }

    #[test]
    fn the_advertisement_reads_back_as_written() {
        let inv = inventory();
        let ad = advertisement(
            Some("nf-1".into()),
            Ok(&inv),
            Some("b".into()),
            Some("u".into()),
            &armed(),
            None,
            "2026-11-30T12:00:00.250Z".parse().unwrap(),
        );
        assert!(ad.companion_written.is_some() && ad.watchdog.is_some());
        assert_eq!(read_back(&ad), ad);
    }

    fn armed() -> Promise {
        Promise {
            self_fence_after: Some(Duration::from_secs(30)),
            watchdog: Some(palisade_model::advertise::Watchdog {
                timeout: Duration::from_secs(20),
                nowayout: true,
                action: Some(palisade_model::advertise::WatchdogAction::Reset),
                driver: Some("iTCO_wdt".into()),
            }),
            virtualization: Some(Virtualization::None),
        }
    }

    #[test]
    fn a_self_fence_is_promised_only_with_an_armed_watchdog_and_with_a_stamp() {
        let inv = inventory();
        let at: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        let ad = advertisement(None, Ok(&inv), Some("b".into()), None, &armed(), None, at);
        assert_eq!(ad.self_fence_after, Some(Duration::from_secs(30)));
        assert_eq!(ad.scope, Some(SelfFenceScope::All));
        assert_eq!(ad.companion_written, Some(at));
        assert_eq!(ad.virtualization, Some(Virtualization::None));
        // The stamp and the promise are current against a renewal stamped at the same time.
        assert_eq!(ad.companion_current(Some(at), Some("b")), Ok(()));
        // A watchdog not (or no longer) armed: nothing is promised, no stamp is written.
        let unarmed = Promise {
            watchdog: None,
            ..armed()
        };
        let ad = advertisement(None, Ok(&inv), Some("b".into()), None, &unarmed, None, at);
        assert_eq!(ad.self_fence_after, None);
        assert_eq!(ad.watchdog, None);
        assert_eq!(ad.scope, None);
        assert_eq!(ad.companion_written, None);
        let a = &lease_patch(&ad, None)["metadata"]["annotations"];
        assert!(
            a[palisade_model::advertise::COMPANION_WRITTEN].is_null()
                && a[palisade_model::advertise::SELF_FENCE_AFTER].is_null(),
            "an earlier promise is withdrawn: {a}"
        );
    }

    fn lease(renew: Option<&str>, duration: Option<i32>) -> Lease {
        Lease {
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                renew_time: renew.map(|r| {
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(r.parse().unwrap())
                }),
                lease_duration_seconds: duration,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_kubelet_is_silent_once_its_renew_time_stood_still_for_its_lease_duration() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut k = KubeletRenewals::default();
        assert!(!k.silent(t0 + s(3600)), "no read yet: nothing is known");
        k.read(&lease(Some("2026-11-30T12:00:00Z"), Some(4)), t0);
        assert!(!k.silent(t0 + s(4)));
        // The same renewTime read again later does not restart the count.
        k.read(&lease(Some("2026-11-30T12:00:00Z"), Some(4)), t0 + s(3));
        assert!(k.silent(t0 + s(5)));
        // A renewal read is a change: counted from that read's send instant.
        k.read(&lease(Some("2026-11-30T12:00:06Z"), Some(4)), t0 + s(6));
        assert!(!k.silent(t0 + s(10)));
        assert!(k.silent(t0 + s(11)));
        // Without a lease duration, the kubelet's default of 40 s.
        let mut k = KubeletRenewals::default();
        k.read(&lease(Some("2026-11-30T12:00:00Z"), None), t0);
        assert!(!k.silent(t0 + s(40)) && k.silent(t0 + s(41)));
    }

    #[test]
    fn the_self_fence_is_due_only_past_its_timeout_since_the_last_write_sent() {
        let t0 = Instant::now();
        let after = Duration::from_secs(30);
        assert!(!fence_due(t0, after, t0 + after));
        assert!(fence_due(t0, after, t0 + after + Duration::from_millis(1)));
    }

    #[test]
    fn a_self_fence_that_could_not_keep_its_promise_is_refused() {
        let s = Duration::from_secs;
        let sf = |timeout: u64, interval: u64, after: u64| SelfFenceConfig {
            watchdog: "/dev/watchdog".into(),
            watchdog_timeout: s(timeout),
            watchdog_interval: s(interval),
            self_fence_after: s(after),
            own_pod: None,
        };
        // Defaults: 20 s watchdog petted every 2 s, 60 s, passes every 5 s with 5 s calls.
        assert_eq!(sf(20, 2, 60).invalid(s(5), s(5)), None);
        assert!(sf(20, 6, 60)
            .invalid(s(5), s(5))
            .unwrap()
            .contains("quarter"));
        assert!(sf(20, 0, 60).invalid(s(5), s(5)).is_some());
        assert!(sf(20, 2, 60)
            .invalid(s(10), s(5))
            .unwrap()
            .contains("--interval"));
        assert!(sf(20, 2, 50)
            .invalid(s(5), s(5))
            .unwrap()
            .contains("two of the slowest"));
    }

    #[test]
    fn the_challenge_is_read_trimmed_from_the_node() {
        let mut n = Node::default();
        assert_eq!(challenge_of(&n), None);
        n.metadata.annotations = Some(
            [(RECOVERY_CHALLENGE.to_string(), "  nf-uid \n".to_string())]
                .into_iter()
                .collect(),
        );
        assert_eq!(challenge_of(&n).as_deref(), Some("nf-uid"));
    }

    #[test]
    fn with_the_peer_check_every_write_is_stamped_and_advertises_it() {
        let inv = inventory();
        let at: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        let check = PeerCheck {
            vouch_after: Duration::from_secs(23),
            answer_valid: Duration::from_secs(10),
            members: Some(palisade_model::advertise::MemberSet::of(["m0", "m1", "m2"])),
        };
        // The watchdog could not be armed: no promise, but the stamp and the peer check are
        // written all the same (the controller times the node's health on the stamp, and the
        // node's vouches on its window).
        let unarmed = Promise {
            watchdog: None,
            ..armed()
        };
        let ad = advertisement(None, Ok(&inv), None, None, &unarmed, Some(check), at);
        assert_eq!(ad.self_fence_after, None);
        assert_eq!(ad.companion_written, Some(at));
        assert_eq!(ad.peer_check, Some(check));
        assert_eq!(ad.companion_current(Some(at), None), Ok(()));
        assert_eq!(read_back(&ad), ad);
    }

    #[test]
    fn a_write_is_conditional_on_the_lease_it_read() {
        let ad = plain(Ok(&inventory()));
        let patch = lease_patch(&ad, Some("4711"));
        assert_eq!(patch["metadata"]["resourceVersion"], "4711");
        assert!(patch.get("spec").is_none(), "{patch}");
    }
}
