//! Registration and heartbeats: the Node object (capacity, addresses, Ready condition,
//! volumesInUse), the Lease in `kube-node-lease` with the self-fence advertisement written on
//! every renewal ([`palisade_model::advertise`]), the recovery challenge read back from the
//! Node with each status update ([`crate::inventory::RecoveryChallenge`]), and the self-fence monitor that turns
//! a stale Lease into [`FenceState::active`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use palisade_model::advertise::Advertisement;

use crate::backoff;
pub use crate::inventory::RecoveryChallenge;
use crate::metrics::Metrics;
use crate::pod_worker::{Ctx, FenceState};
use crate::source::ManagerCmd;

/// The self-fence timeout annotation. The agent writes it only on its Lease, with every
/// renewal; registration removes it from the Node object, where an older agent wrote it once
/// and never withdrew it.
pub const SELF_FENCE_ANNOTATION: &str = palisade_model::advertise::SELF_FENCE_AFTER;

/// Builds the advertisement written with each renewal (called once per renewal, so what it
/// reads — the runtime's containers, the boot ID, the watchdog — is current).
pub type Advertiser = Arc<dyn Fn() -> Advertisement + Send + Sync>;

/// Told each advertisement a successful renewal wrote (the peer check counts the member list
/// the last one carried).
pub type Written = Arc<dyn Fn(&Advertisement) + Send + Sync>;

/// What each renewal writes besides the Lease's own fields, and when it must not wait.
#[derive(Clone)]
pub struct Advertising {
    /// Builds the advertisement for each renewal.
    pub advertise: Advertiser,
    /// Told what a successful renewal wrote.
    pub written: Written,
    /// Notified when the advertisement changed in a way that must reach the API at once (the
    /// peer check's member list: until a renewal carries it, no peer can excuse the node). A
    /// notification while a renewal is in flight is kept and acted on after it.
    pub renew_now: Arc<tokio::sync::Notify>,
}

/// Errors talking to the API about the Node and its Lease.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// An API call failed.
    #[error("{what} for node {node}: {source}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// The node.
        node: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },
    /// An API call timed out.
    #[error("{what} for node {node}: timed out")]
    Timeout {
        /// What was being done.
        what: &'static str,
        /// The node.
        node: String,
    },
}

impl NodeError {
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, NodeError::Api { source: kube::Error::Api(s), .. } if s.code == 404)
    }

    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, NodeError::Api { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// Registration settings.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Node name.
    pub name: String,
    /// Machine address (InternalIP).
    pub address: IpAddr,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Lease renew interval (also the node status interval).
    pub renew_interval: Duration,
    /// Self-fence timeout.
    pub self_fence_after: Duration,
    /// Fence all pods, not only PVC users.
    pub fence_all_pods: bool,
    /// Pod capacity.
    pub max_pods: u32,
}

pub(crate) async fn bounded<T>(
    what: &'static str,
    node: &str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, NodeError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(NodeError::Api {
            what,
            node: node.to_string(),
            source,
        }),
        Err(_) => Err(NodeError::Timeout {
            what,
            node: node.to_string(),
        }),
    }
}

fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// The Node object this agent registers.
pub fn node_object(cfg: &NodeConfig) -> Node {
    let mut labels = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".to_string(), cfg.name.clone());
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert(
        "kubernetes.io/arch".to_string(),
        std::env::consts::ARCH.replace("x86_64", "amd64"),
    );
    let mut annotations = BTreeMap::new();
    annotations.insert(
        "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
        "true".to_string(),
    );
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The Node status: capacity, addresses, conditions (Ready with a fresh heartbeat) and
/// volumesInUse.
pub fn node_status(
    cfg: &NodeConfig,
    volumes_in_use: Vec<String>,
    ready_since: &Time,
) -> NodeStatus {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut cap = BTreeMap::new();
    cap.insert("cpu".to_string(), Quantity(cpus.to_string()));
    cap.insert(
        "memory".to_string(),
        Quantity(format!("{}Ki", memory_bytes() / 1024)),
    );
    cap.insert("pods".to_string(), Quantity(cfg.max_pods.to_string()));
    let now = crate::ktime::now();
    let cond = |t: &str, status: &str, reason: &str, msg: &str| NodeCondition {
        type_: t.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(msg.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(ready_since.clone()),
    };
    NodeStatus {
        capacity: Some(cap.clone()),
        allocatable: Some(cap),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: cfg.address.to_string(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: cfg.name.clone(),
            },
        ]),
        conditions: Some(vec![
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "palisade-node has sufficient memory available",
            ),
            cond(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "palisade-node has no disk pressure",
            ),
            cond(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "palisade-node has sufficient PID available",
            ),
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "palisade-node is posting ready status",
            ),
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints::default()),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.replace("x86_64", "amd64"),
            operating_system: "linux".into(),
            kubelet_version: format!("v1.20.2-palisade-{}", env!("CARGO_PKG_VERSION")),
            kube_proxy_version: String::new(),
            container_runtime_version: "palisade-process://0.1".into(),
            kernel_version: nix::sys::utsname::uname()
                .map(|u| u.release().to_string_lossy().to_string())
                .unwrap_or_default(),
            os_image: "palisade".into(),
            machine_id: cfg.name.clone(),
            system_uuid: system_uuid().unwrap_or_else(|| cfg.name.clone()),
            boot_id: boot_id().unwrap_or_default(),
            ..Default::default()
        }),
        // Always written, also when empty: a merge patch that omits the field leaves the old
        // list on the Node, and the attach-detach controller then waits 6 minutes for volumes
        // this node no longer uses.
        volumes_in_use: Some(volumes_in_use),
        ..Default::default()
    }
}

/// The file the boot ID is read from: `PALISADE_BOOT_ID_FILE` when set (the lab's namespace
/// machines give each boot its own ID there), else the kernel's.
pub fn boot_id_file() -> std::path::PathBuf {
    std::env::var_os("PALISADE_BOOT_ID_FILE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/proc/sys/kernel/random/boot_id".into())
}

/// The machine's boot ID (changes on every boot), if readable.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string(boot_id_file())
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The file that holds the machine's SMBIOS system UUID: `PALISADE_PRODUCT_UUID_FILE` (the
/// lab's namespace machines, which have no DMI table of their own) or
/// `/sys/class/dmi/id/product_uuid`.
pub fn product_uuid_file() -> std::path::PathBuf {
    std::env::var_os("PALISADE_PRODUCT_UUID_FILE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/sys/class/dmi/id/product_uuid".into())
}

/// The machine's SMBIOS system UUID, if readable.
pub fn system_uuid() -> Option<String> {
    std::fs::read_to_string(product_uuid_file())
        .ok()
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
}

/// Creates or updates the Node object.
pub async fn register(client: &Client, cfg: &NodeConfig) -> Result<(), NodeError> {
    let api: Api<Node> = Api::all(client.clone());
    let t = cfg.renew_interval.max(Duration::from_secs(5));
    let want = node_object(cfg);
    match bounded(
        "create node",
        &cfg.name,
        t,
        api.create(&PostParams::default(), &want),
    )
    .await
    {
        Ok(_) => {
            tracing::info!(node = %cfg.name, "registered node");
            Ok(())
        }
        Err(NodeError::Api {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 409 => {
            let mut annotations = serde_json::json!(want.metadata.annotations);
            annotations[SELF_FENCE_ANNOTATION] = serde_json::Value::Null;
            let patch = serde_json::json!({"metadata": {"labels": want.metadata.labels, "annotations": annotations}});
            bounded(
                "update node",
                &cfg.name,
                t,
                api.patch(&cfg.name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
            .map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Patches the Node's status; returns the whole Node as the API server answered.
async fn patch_status(
    client: &Client,
    cfg: &NodeConfig,
    status: &NodeStatus,
) -> Result<Node, NodeError> {
    let api: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({ "status": status });
    bounded(
        "patch node status",
        &cfg.name,
        cfg.renew_interval.max(Duration::from_secs(2)),
        api.patch_status(&cfg.name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
}

/// Keeps the Node registered and its status fresh, and `challenge` as each successful status
/// update returned it. If the Node object disappears, every pod is killed first and the Node is
/// registered again afterwards (a deleted Node means its pods were released and may run
/// elsewhere).
///
/// Guarantees: `challenge` is set from the response of a status update, so after the API server
/// served it ([`RecoveryChallenge`]).
pub async fn status_loop(
    client: Client,
    cfg: NodeConfig,
    ctx: Arc<Ctx>,
    manager: mpsc::Sender<ManagerCmd>,
    challenge: RecoveryChallenge,
) {
    const REGISTER_RETRY_MAX: Duration = Duration::from_secs(10);
    let policy = backoff::retry(Duration::from_millis(500), REGISTER_RETRY_MAX);
    let mut retries = policy.build();
    loop {
        match register(&client, &cfg).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %e, "cannot register node; retrying");
                tokio::time::sleep(backoff::next_delay(&mut retries, REGISTER_RETRY_MAX)).await;
            }
        }
    }
    let ready_since = crate::ktime::now();
    loop {
        let in_use: Vec<String> = {
            let m = ctx.volumes_in_use.lock();
            let mut v: Vec<String> = m.values().flatten().cloned().collect();
            v.sort();
            v.dedup();
            v
        };
        match patch_status(&client, &cfg, &node_status(&cfg, in_use, &ready_since)).await {
            Ok(node) => {
                challenge.observe(&node);
                retries = policy.build();
            }
            Err(e) if e.is_not_found() => {
                tracing::warn!(
                    "Node object was deleted: killing every pod before registering again"
                );
                let (tx, rx) = oneshot::channel();
                if manager.send(ManagerCmd::KillAll(tx)).await.is_ok() {
                    let _ = rx.await;
                }
                while let Err(e) = register(&client, &cfg).await {
                    tracing::warn!(error = %e, "cannot re-register node; retrying");
                    tokio::time::sleep(backoff::next_delay(&mut retries, REGISTER_RETRY_MAX)).await;
                }
                let _ = manager.send(ManagerCmd::Resume).await;
                continue;
            }
            Err(e) => tracing::debug!(error = %e, "cannot update node status"),
        }
        tokio::time::sleep(cfg.renew_interval).await;
    }
}

/// Renews the Lease forever, writing `ads.advertise()` with every renewal; publishes on
/// `renewed` the instant each successful renewal request was *sent*, and tells `ads.written`
/// the advertisement it wrote. A successful renewal is followed by the next after
/// `renew_interval`, or at once when `ads.renew_now` is notified.
///
/// Guarantees: the self-fence clock counts from when the request left, never from when the
/// answer arrived, so a slow answer cannot extend it: the API server recorded the renewal no
/// earlier than the send, and the controller's clock for the node starts no earlier than that.
/// `writes` is stamped before every request that may write the Lease (whatever its outcome),
/// so the agent never vouches to a peer while a write of its own may count as healthy.
pub async fn lease_loop(
    client: Client,
    cfg: NodeConfig,
    renewed: watch::Sender<Instant>,
    metrics: Arc<Metrics>,
    ads: Advertising,
    writes: crate::peer::WriteClock,
) {
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client);
    // A failed renewal is retried at most a renew interval later, like a successful one.
    let retry_max = cfg.renew_interval.max(Duration::from_millis(400));
    let policy = backoff::retry(Duration::from_millis(200), retry_max);
    let mut retries = policy.build();
    let timeout = cfg.renew_interval.max(Duration::from_millis(500));
    loop {
        let sent = Instant::now();
        let ad = (ads.advertise)();
        let res = renew_once(&api, &nodes, &cfg, timeout, &ad, &writes).await;
        match res {
            Ok(()) => {
                (ads.written)(&ad);
                renewed.send_replace(sent);
                metrics
                    .lease_renewals
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                retries = policy.build();
                tokio::select! {
                    _ = tokio::time::sleep(cfg.renew_interval) => {}
                    _ = ads.renew_now.notified() => {
                        tracing::info!("advertisement changed: renewing the Lease now");
                    }
                }
            }
            Err(e) => {
                metrics
                    .lease_failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let d = backoff::next_delay(&mut retries, retry_max);
                tracing::debug!(error = %e, retry_in_ms = d.as_millis() as u64, "lease renewal failed");
                tokio::time::sleep(d).await;
            }
        }
    }
}

/// Sets the advertisement's keys in `annotations` (removing those it leaves out).
pub fn apply_advertisement(annotations: &mut BTreeMap<String, String>, ad: &Advertisement) {
    for (k, v) in ad.to_annotations() {
        match v {
            Some(v) => {
                annotations.insert(k, v);
            }
            None => {
                annotations.remove(&k);
            }
        }
    }
}

async fn renew_once(
    api: &Api<Lease>,
    nodes: &Api<Node>,
    cfg: &NodeConfig,
    timeout: Duration,
    ad: &Advertisement,
    writes: &crate::peer::WriteClock,
) -> Result<(), NodeError> {
    let dur = i32::try_from(cfg.lease_duration.as_secs().max(1)).unwrap_or(40);
    match bounded("get lease", &cfg.name, timeout, api.get_opt(&cfg.name)).await? {
        Some(mut l) => {
            apply_advertisement(l.metadata.annotations.get_or_insert_with(BTreeMap::new), ad);
            let spec = l.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(cfg.name.clone());
            spec.lease_duration_seconds = Some(dur);
            // Stamped right before the write is sent (the controller's healthy majority reads
            // the stamp as the send time, within the clock skew it assumes), and from here the
            // write may land: no vouch to peers for a while (see crate::peer).
            spec.renew_time = Some(crate::ktime::micro_now());
            writes.record_write();
            bounded(
                "renew lease",
                &cfg.name,
                timeout,
                api.replace(&cfg.name, &PostParams::default(), &l),
            )
            .await?;
        }
        None => {
            // Owned by the *current* Node object, so a deleted Node takes its Lease along
            // and a re-registered one gets a fresh Lease.
            let node_uid = bounded("get node", &cfg.name, timeout, nodes.get_opt(&cfg.name))
                .await?
                .and_then(|n| n.metadata.uid);
            let mut annotations = BTreeMap::new();
            apply_advertisement(&mut annotations, ad);
            let l = Lease {
                metadata: ObjectMeta {
                    annotations: Some(annotations),
                    name: Some(cfg.name.clone()),
                    namespace: Some("kube-node-lease".into()),
                    owner_references: node_uid.as_deref().map(|uid| {
                        vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: cfg.name.clone(),
                            uid: uid.to_string(),
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.name.clone()),
                    lease_duration_seconds: Some(dur),
                    renew_time: Some(crate::ktime::micro_now()),
                    ..Default::default()
                }),
            };
            writes.record_write();
            bounded(
                "create lease",
                &cfg.name,
                timeout,
                api.create(&PostParams::default(), &l),
            )
            .await?;
        }
    }
    Ok(())
}

/// The file in the state directory that holds the wall-clock time (Unix milliseconds) of the
/// last successful Lease renewal, so a restarted agent keeps its self-fence clock.
pub const RENEWED_FILE: &str = "lease-renewed";

/// Records a successful renewal at `at` (write, then rename: a crash never leaves it torn).
pub fn record_renewal(
    state_dir: &std::path::Path,
    at: std::time::SystemTime,
) -> std::io::Result<()> {
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let tmp = state_dir.join(format!("{RENEWED_FILE}.tmp"));
    std::fs::write(&tmp, ms.to_string())?;
    std::fs::rename(tmp, state_dir.join(RENEWED_FILE))
}

/// The wall-clock time of the monotonic instant `sent`, read at the monotonic `now` and the
/// wall-clock `wall_now` (taken together). An instant after `now` maps to `wall_now`.
pub fn wall_time_of(
    sent: Instant,
    now: Instant,
    wall_now: std::time::SystemTime,
) -> std::time::SystemTime {
    wall_now
        .checked_sub(now.saturating_duration_since(sent))
        .unwrap_or(std::time::UNIX_EPOCH)
}

/// Records every renewal `renewed` reports in `state_dir` ([`record_renewal`]) until the sender
/// is dropped.
///
/// Guarantees: each record is stamped with the time the renewal's request was *sent* (the
/// instant the lease loop reports), never the time its answer arrived or the time it is
/// written: a restarted agent's self-fence clock ([`initial_renewal`]) then starts no later
/// than the controller's wait for it, which counts from a renewal it could only have observed
/// after the send.
pub async fn record_renewals(mut renewed: watch::Receiver<Instant>, state_dir: std::path::PathBuf) {
    while renewed.changed().await.is_ok() {
        let sent = *renewed.borrow_and_update();
        let at = wall_time_of(sent, Instant::now(), std::time::SystemTime::now());
        let dir = state_dir.clone();
        match tokio::task::spawn_blocking(move || record_renewal(&dir, at)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot record the Lease renewal"),
            Err(e) => tracing::warn!(error = %e, "cannot record the Lease renewal"),
        }
    }
}

/// How long ago (at `now`) the last recorded renewal was; `None` if none was ever recorded.
/// A record in the future (the wall clock stepped back) counts as infinitely old: the safe side.
pub fn renewal_age(state_dir: &std::path::Path, now: std::time::SystemTime) -> Option<Duration> {
    let raw = std::fs::read_to_string(state_dir.join(RENEWED_FILE)).ok()?;
    let ms: u64 = raw.trim().parse().ok()?;
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    Some(now.duration_since(at).unwrap_or(Duration::MAX))
}

/// The instant a restarted agent starts its self-fence clock from: as old as the last
/// recorded renewal (capped at `lease_duration`, by which the Lease has expired anyway), or
/// `now` when none was recorded.
///
/// Guarantees: an agent restarted after being down longer than `--self-fence-after` fences at
/// once, rather than granting its pods another full `--self-fence-after` while the Lease the
/// controller watches may already have expired.
pub fn initial_renewal(age: Option<Duration>, lease_duration: Duration, now: Instant) -> Instant {
    let age = age.unwrap_or_default().min(lease_duration);
    now.checked_sub(age).unwrap_or(now)
}

/// The instant until which the node's peers excuse it from self-fencing (a control-plane
/// outage vouched by a strict majority; see [`crate::peer`]), `None` when they do not. Without a
/// peer check the channel simply stays `None`.
pub type Excused = watch::Receiver<Option<Instant>>;

/// Whether `excused` holds at `now`.
pub fn excused_at(excused: &Excused, now: Instant) -> bool {
    excused.borrow().is_some_and(|until| now < until)
}

/// The next fence state: active once the last renewal is older than `self_fence_after` and the
/// peers do not excuse the node; once active, lifted only by a renewal.
///
/// Guarantees: the latch means an excuse that lapses and comes back never resumes pods the
/// self-fence killed (the controller may have released them meanwhile); only a renewal does.
pub fn next_fence_active(
    active: bool,
    lease_age: Duration,
    after: Duration,
    excused: bool,
) -> bool {
    let stale = lease_age > after;
    if active {
        stale
    } else {
        stale && !excused
    }
}

/// Turns Lease staleness into the fence state: active once the last renewal is older than
/// `self_fence_after` (unless the peers excuse it: a control-plane outage), inactive again
/// after a renewal.
///
/// Guarantees: fencing starts no later than `self_fence_after` + 50 ms after the last
/// successful renewal, or 50 ms after the peers' excuse lapses, whichever is later; the
/// controller trusts neither before its own bounds ([`palisade_model::advertise`]).
pub async fn fence_monitor(
    cfg: NodeConfig,
    renewed: watch::Receiver<Instant>,
    excused: Excused,
    fence: watch::Sender<FenceState>,
    metrics: Arc<Metrics>,
) {
    let mut excuse_logged = false;
    loop {
        let age = renewed.borrow().elapsed();
        metrics.lease_age_ms.store(
            u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
        let ex = excused_at(&excused, Instant::now());
        let active = fence.borrow().active;
        let want = FenceState {
            active: next_fence_active(active, age, cfg.self_fence_after, ex),
            all_pods: cfg.fence_all_pods,
        };
        let excusing = !want.active && age > cfg.self_fence_after;
        if excusing != excuse_logged {
            if excusing {
                tracing::warn!(
                    age_ms = age.as_millis() as u64,
                    "Lease not renewed within --self-fence-after, but a majority of peers vouch that they cannot reach the API either (a control-plane outage): not self-fencing"
                );
            }
            excuse_logged = excusing;
        }
        if *fence.borrow() != want {
            if want.active {
                tracing::warn!(
                    age_ms = age.as_millis() as u64,
                    "Lease not renewed within --self-fence-after and no majority of peers excuses it: self-fencing"
                );
            } else {
                tracing::info!("Lease renewed again: self-fence lifted (pods resume once the API confirms them)");
            }
            fence.send_replace(want);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NodeConfig {
        NodeConfig {
            name: "m0".into(),
            address: "10.213.0.11".parse().unwrap(),
            lease_duration: Duration::from_secs(40),
            renew_interval: Duration::from_secs(10),
            self_fence_after: Duration::from_secs(20),
            fence_all_pods: false,
            max_pods: 110,
        }
    }

    #[test]
    fn the_node_object_carries_no_sticky_self_fence_promise() {
        let n = node_object(&cfg());
        let a = n.metadata.annotations.unwrap();
        assert_eq!(a.get(SELF_FENCE_ANNOTATION), None);
        assert_eq!(
            a.get("volumes.kubernetes.io/controller-managed-attach-detach")
                .map(String::as_str),
            Some("true")
        );
    }

    #[test]
    fn status_has_capacity_addresses_and_ready() {
        let s = node_status(
            &cfg(),
            vec!["kubernetes.io/csi/d^h".into()],
            &crate::ktime::now(),
        );
        let cap = s.capacity.unwrap();
        assert_eq!(cap.get("pods").unwrap().0, "110");
        assert!(cap.contains_key("cpu") && cap.contains_key("memory"));
        let addrs = s.addresses.unwrap();
        assert_eq!(addrs[0].type_, "InternalIP");
        assert_eq!(addrs[0].address, "10.213.0.11");
        let ready = s
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        assert_eq!(
            s.volumes_in_use.unwrap(),
            vec!["kubernetes.io/csi/d^h".to_string()]
        );
        // The last volume unmounted: an empty list, which a merge patch writes (an absent
        // field would leave the old list on the Node forever).
        let s = node_status(&cfg(), vec![], &crate::ktime::now());
        let patch = serde_json::json!({ "status": s });
        assert_eq!(patch["status"]["volumesInUse"], serde_json::json!([]));
    }

    #[test]
    fn the_advertisement_replaces_the_previous_one_on_the_lease() {
        use palisade_model::advertise as ad;
        let mut a: BTreeMap<String, String> = [
            (ad::WATCHDOG_TIMEOUT.to_string(), "10".to_string()),
            ("other".to_string(), "kept".to_string()),
        ]
        .into();
        let now = Advertisement {
            self_fence_after: Some(Duration::from_secs(8)),
            scope: Some(ad::SelfFenceScope::All),
            runtime_pods: Some(["u1".to_string()].into()),
            peer_check: None,
            ..Default::default()
        };
        apply_advertisement(&mut a, &now);
        assert_eq!(
            a.get(ad::WATCHDOG_TIMEOUT),
            None,
            "a withdrawn watchdog is removed"
        );
        assert_eq!(a.get(ad::SELF_FENCE_AFTER).map(String::as_str), Some("8"));
        assert_eq!(a.get(ad::RUNTIME_PODS).map(String::as_str), Some("u1"));
        assert_eq!(a.get("other").map(String::as_str), Some("kept"));
        assert_eq!(Advertisement::from_annotations(&a), now);
    }

    /// An API server that registers Node `m0` and answers every status patch with the Node
    /// carrying `challenge` (`None`: no such annotation), or a 500 while `fail` is set.
    fn node_api(
        challenge: Arc<parking_lot::Mutex<Option<String>>>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    ) -> Client {
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (challenge, fail) = (challenge.clone(), fail.clone());
            async move {
                let patch = req.method() == http::Method::PATCH
                    && req.uri().path() == "/api/v1/nodes/m0/status";
                let mut node = serde_json::json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "m0", "uid": "node-uid"},
                });
                if let Some(c) = challenge.lock().clone() {
                    node["metadata"]["annotations"] =
                        serde_json::json!({ palisade_model::advertise::RECOVERY_CHALLENGE: c });
                }
                let (code, body) = if patch && fail.load(std::sync::atomic::Ordering::SeqCst) {
                    (
                        500,
                        serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                            "reason": "InternalError", "message": "down", "code": 500}),
                    )
                } else if req.method() == http::Method::POST || patch {
                    (200, node)
                } else {
                    (
                        404,
                        serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                            "reason": "NotFound", "message": "not found", "code": 404}),
                    )
                };
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(body.to_string().into_bytes()))
                        .expect("valid response"),
                )
            }
        });
        Client::new(svc, "default")
    }

    #[test]
    fn the_challenge_is_read_trimmed_from_the_node_annotation() {
        let node = |v: Option<&str>| Node {
            metadata: ObjectMeta {
                annotations: v.map(|v| {
                    [(
                        palisade_model::advertise::RECOVERY_CHALLENGE.to_string(),
                        v.to_string(),
                    )]
                    .into()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let c = RecoveryChallenge::default();
        c.observe(&node(Some(" fence-uid \n")));
        assert_eq!(c.get().as_deref(), Some("fence-uid"));
        for cleared in [None, Some(""), Some("  ")] {
            c.set(Some("old".into()));
            c.observe(&node(cleared));
            assert_eq!(c.get(), None, "{cleared:?} clears it");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_challenge_in_a_status_response_reaches_the_advertisement_with_a_later_inventory() {
        use crate::runtime::Runtime as _;
        let on_node = Arc::new(parking_lot::Mutex::new(Some("fence-1".to_string())));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let h = crate::pod_worker::testing::Harness::new();
        let (mgr_tx, _mgr_rx) = mpsc::channel(1);
        let challenge = RecoveryChallenge::default();
        let answer = || crate::inventory::answer(&challenge, h.runtime.as_ref(), &h.ctx.managed);
        tokio::spawn(status_loop(
            node_api(on_node.clone(), fail.clone()),
            cfg(),
            h.ctx.clone(),
            mgr_tx,
            challenge.clone(),
        ));
        crate::pod_worker::testing::until("challenge read", || challenge.get().is_some()).await;
        h.runtime
            .start(&crate::runtime::ContainerConfig {
                pod_uid: "u-live".into(),
                name: "c".into(),
                attempt: 0,
                argv: vec!["run".into()],
                env: Vec::new(),
                working_dir: None,
                rootfs: None,
            })
            .await
            .expect("start");
        let a = answer();
        assert_eq!(a.challenge.as_deref(), Some("fence-1"));
        assert_eq!(a.runtime_pods, ["u-live".to_string()].into());

        // A failed update keeps what was read; a Node without the annotation clears it.
        fail.store(true, std::sync::atomic::Ordering::SeqCst);
        *on_node.lock() = None;
        tokio::time::sleep(cfg().renew_interval * 3).await;
        assert_eq!(answer().challenge.as_deref(), Some("fence-1"));
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        crate::pod_worker::testing::until("challenge cleared", || challenge.get().is_none()).await;
        assert_eq!(answer().challenge, None);
    }

    #[test]
    fn renewal_record_survives_a_restart_and_ages() {
        let d = tempfile::tempdir().unwrap();
        let t0 = std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(renewal_age(d.path(), t0), None, "nothing recorded yet");
        record_renewal(d.path(), t0).unwrap();
        assert_eq!(
            renewal_age(d.path(), t0 + Duration::from_secs(7)),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            renewal_age(d.path(), t0 - Duration::from_secs(5)),
            Some(Duration::MAX),
            "a record from the future is treated as stale"
        );
    }

    /// A Lease write whose answer never comes (the API server may still apply it later)
    /// stamps the write clock before it is sent, so the agent does not vouch to a peer for a
    /// whole vouch delay after it: a vouch counted from the last *successful* renewal would
    /// let a node whose late writes land look healthy to the controller while it vouches (the
    /// simulation's recorded control `VouchSinceLastRenewal`, seed 10,729,556).
    #[tokio::test(start_paused = true)]
    async fn a_lease_write_that_never_answers_still_stamps_the_write_clock() {
        let svc = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
            if req.method() == http::Method::PUT {
                std::future::pending::<()>().await;
            }
            let lease = serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "m0", "namespace": "kube-node-lease", "resourceVersion": "7"},
                "spec": {"holderIdentity": "m0"},
            });
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(lease.to_string().into_bytes()))
                    .expect("valid response"),
            )
        });
        let client = Client::new(svc, "default");
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        let nodes: Api<Node> = Api::all(client);
        let writes = crate::peer::WriteClock::starting_at(Instant::now() - Duration::from_secs(60));
        let before = Instant::now();
        let res = renew_once(
            &leases,
            &nodes,
            &cfg(),
            Duration::from_secs(1),
            &Advertisement::default(),
            &writes,
        )
        .await;
        assert!(res.is_err(), "the write never answered: {res:?}");
        let sent = writes.last_write();
        assert!(sent >= before, "the attempt was not stamped");
        assert!(
            sent < before + Duration::from_secs(1),
            "stamped at the timeout, not at the sending"
        );
        // The answer never came; from the sending, a whole vouch delay must pass.
        let vouch_after = Duration::from_secs(6);
        assert!(!crate::peer::may_vouch(sent, Instant::now(), vouch_after));
        tokio::time::advance(sent + vouch_after - Instant::now()).await;
        assert!(
            !crate::peer::may_vouch(writes.last_write(), Instant::now(), vouch_after),
            "vouching within the vouch delay of a write that may still land"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_renewal_is_as_old_as_its_send_not_its_answer() {
        let d = tempfile::tempdir().unwrap();
        let (tx, rx) = watch::channel(Instant::now());
        let recorder = tokio::spawn(record_renewals(rx, d.path().to_owned()));
        let sent = Instant::now();
        // The API server answers the renewal 30 s after it was sent.
        tokio::time::advance(Duration::from_secs(30)).await;
        tx.send_replace(sent);
        drop(tx);
        recorder.await.unwrap();
        let age = renewal_age(d.path(), std::time::SystemTime::now()).expect("recorded");
        assert!(
            age >= Duration::from_secs(30),
            "the record must date from the send, 30 s before the answer: {age:?}"
        );
    }

    #[test]
    fn a_send_instant_maps_to_the_wall_clock_of_its_time() {
        let now = Instant::now();
        let wall = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let sent = now.checked_sub(Duration::from_millis(2_500)).unwrap();
        assert_eq!(
            wall_time_of(sent, now, wall),
            wall - Duration::from_millis(2_500)
        );
        assert_eq!(wall_time_of(now + Duration::from_secs(1), now, wall), wall);
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_agent_keeps_its_fence_clock() {
        let now = Instant::now() + Duration::from_secs(100);
        let lease = Duration::from_secs(40);
        assert_eq!(initial_renewal(None, lease, now), now);
        assert_eq!(
            initial_renewal(Some(Duration::from_secs(25)), lease, now),
            now - Duration::from_secs(25)
        );
        assert_eq!(
            initial_renewal(Some(Duration::MAX), lease, now),
            now - lease,
            "capped at the Lease duration"
        );
        // Down longer than --self-fence-after: the monitor fences immediately.
        let m = Arc::new(Metrics::default());
        let start = initial_renewal(Some(Duration::from_secs(25)), lease, Instant::now());
        let (_rtx, rrx) = watch::channel(start);
        let (ftx, mut frx) = watch::channel(FenceState::default());
        let (_etx, erx) = watch::channel(None);
        tokio::spawn(fence_monitor(cfg(), rrx, erx, ftx, m));
        let t0 = Instant::now();
        frx.changed().await.unwrap();
        assert!(frx.borrow().active);
        assert!(
            t0.elapsed() <= Duration::from_millis(100),
            "{:?}",
            t0.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn fence_activates_after_timeout_and_lifts_on_renewal() {
        let m = Arc::new(Metrics::default());
        let (rtx, rrx) = watch::channel(Instant::now());
        let (ftx, mut frx) = watch::channel(FenceState::default());
        let c = NodeConfig {
            self_fence_after: Duration::from_secs(3),
            ..cfg()
        };
        let (_etx, erx) = watch::channel(None);
        tokio::spawn(fence_monitor(c, rrx, erx, ftx, m));
        let t0 = Instant::now();
        frx.changed().await.unwrap();
        assert!(frx.borrow().active);
        let waited = t0.elapsed();
        assert!(
            waited > Duration::from_secs(3) && waited <= Duration::from_millis(3_100),
            "{waited:?}"
        );
        rtx.send_replace(Instant::now());
        frx.changed().await.unwrap();
        assert!(!frx.borrow().active);
    }

    #[tokio::test(start_paused = true)]
    async fn an_excuse_holds_the_fence_only_while_it_lasts_and_a_lapse_latches() {
        let m = Arc::new(Metrics::default());
        let (_rtx, rrx) = watch::channel(Instant::now());
        let (ftx, frx) = watch::channel(FenceState::default());
        let (etx, erx) = watch::channel(Some(Instant::now() + Duration::from_secs(5)));
        let c = NodeConfig {
            self_fence_after: Duration::from_secs(3),
            ..cfg()
        };
        tokio::spawn(fence_monitor(c, rrx, erx, ftx, m));
        // Stale at 3 s, excused until 5 s: no fence yet.
        tokio::time::sleep(Duration::from_millis(4_500)).await;
        assert!(!frx.borrow().active, "excused by the peers");
        // The excuse lapses at 5 s: fenced.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(frx.borrow().active, "the excuse lapsed");
        // It comes back: the fence stays (only a renewal lifts it).
        etx.send_replace(Some(Instant::now() + Duration::from_secs(60)));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            frx.borrow().active,
            "a returning excuse never resumes killed pods"
        );
    }

    #[test]
    fn the_fence_latch() {
        let f = Duration::from_secs(3);
        let (fresh, stale) = (Duration::from_secs(1), Duration::from_secs(4));
        assert!(!next_fence_active(false, fresh, f, false));
        assert!(next_fence_active(false, stale, f, false));
        assert!(!next_fence_active(false, stale, f, true));
        assert!(next_fence_active(true, stale, f, true));
        assert!(
            !next_fence_active(true, fresh, f, false),
            "a renewal lifts it"
        );
    }
}
