//! The companion beside a stock kubelet: on a node whose pods the kubelet runs with
//! containerd (or any CRI runtime), it answers the controller's recovery challenge with an
//! inventory read from the runtime's CRI, so that a fenced stock node rejoins without a
//! person's `confirm-clean`.
//!
//! Each pass reads the recovery challenge from the Node ([`RECOVERY_CHALLENGE`]), *then* lists
//! every pod sandbox and container through the CRI, and writes both with the machine's boot ID
//! and system UUID as annotations on the node's Lease (`kube-node-lease/<node>`), with a JSON
//! merge patch that touches nothing else. The kubelet owns that Lease and renews it; its
//! renewals keep annotations (a renewal that meets the companion's write conflicts, reads the
//! Lease again and retries), and the controller's heartbeat is the kubelet's `renewTime`
//! alone, which the companion never writes.
//!
//! Guarantees:
//! - the advertisement says [`RuntimeSource::Cri`], names every pod UID of which the runtime
//!   holds any record (a sandbox or a container, live or exited), and answers a challenge only
//!   with an inventory taken after that challenge was read; when the runtime gives no complete
//!   answer (a missing, hung or lying socket), it advertises no inventory and no answer, and
//!   says why in its log;
//! - it advertises no self-fence, no watchdog and no peer check: nothing on its word earns a
//!   self-fence's trust.
//!
//! Assumptions: what the CRI cannot see ([`crate::cri::BLIND_SPOT`]) and the kubelet's own view
//! of the API (it starts pods, not the companion) are covered by the controller's rule for
//! such an inventory: a proof only from a boot that began after the fence started (see
//! `palisade_decide::phase::clean_proof`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use palisade_model::advertise::{Advertisement, RuntimeSource, RECOVERY_CHALLENGE};

use crate::cri::inventory::Inventory;
use crate::cri::{CriClient, CriError};
use crate::node::{bounded, NodeError};

/// What the companion needs to know.
#[derive(Debug, Clone)]
pub struct CompanionConfig {
    /// The node's name (its Node and its Lease).
    pub node: String,
    /// The runtime's CRI endpoint (`unix:///run/containerd/containerd.sock`).
    pub cri_endpoint: String,
    /// How often a pass runs.
    pub interval: Duration,
    /// The bound of each API and CRI call.
    pub timeout: Duration,
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
pub fn advertisement(
    challenge: Option<String>,
    inventory: Result<&Inventory, &CriError>,
    boot_id: Option<String>,
    system_uuid: Option<String>,
) -> Advertisement {
    let runtime_pods = inventory.ok().map(|inv| inv.pods.keys().cloned().collect());
    Advertisement {
        version: Some(env!("CARGO_PKG_VERSION").to_string()),
        boot_id,
        system_uuid,
        challenge: challenge.filter(|_| runtime_pods.is_some()),
        runtime_pods,
        runtime_source: RuntimeSource::Cri,
        ..Advertisement::default()
    }
}

/// The JSON merge patch that writes `ad` on the Lease: its annotations only (a key the
/// advertisement leaves out is removed).
pub fn lease_patch(ad: &Advertisement) -> serde_json::Value {
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
    serde_json::json!({ "metadata": { "annotations": annotations } })
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

/// Lists the runtime once: connects (the runtime's `Version` first) and takes the inventory.
async fn list(cfg: &CompanionConfig) -> Result<Inventory, CriError> {
    let cri = CriClient::connect(&cfg.cri_endpoint, cfg.timeout).await?;
    crate::cri::inventory::inventory(&cri).await
}

/// One pass: the challenge, then the inventory, then the Lease write. Returns what was
/// written.
pub async fn pass(client: &Client, cfg: &CompanionConfig) -> Result<Advertisement, PassError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let node = bounded("read node", &cfg.node, cfg.timeout, nodes.get(&cfg.node)).await?;
    let challenge = challenge_of(&node);
    let inventory = list(cfg).await;
    if let Err(e) = &inventory {
        tracing::warn!(error = %e, "the container runtime gave no complete inventory: none is advertised");
    }
    let ad = advertisement(
        challenge,
        inventory.as_ref(),
        crate::node::boot_id(),
        crate::node::system_uuid(),
    );
    let patch = Patch::Merge(lease_patch(&ad));
    match bounded(
        "write advertisement",
        &cfg.node,
        cfg.timeout,
        leases.patch(&cfg.node, &PatchParams::default(), &patch),
    )
    .await
    {
        Ok(_) => Ok(ad),
        Err(e) if e.is_not_found() => Err(PassError::NoLease(cfg.node.clone())),
        Err(e) => Err(e.into()),
    }
}

/// Runs a pass every `cfg.interval`, for ever; a failed pass is logged and the next one runs
/// on time.
pub async fn run(client: Client, cfg: CompanionConfig) {
    let mut last = None;
    loop {
        match pass(&client, &cfg).await {
            Ok(ad) => {
                let now = Some((ad.challenge.clone(), ad.runtime_pods.clone()));
                if now != last {
                    tracing::info!(challenge = ?ad.challenge, pods = ?ad.runtime_pods, "advertised: the challenge answered and the pods the container runtime holds");
                    last = now;
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

    #[test]
    fn every_pod_the_runtime_holds_a_record_of_is_advertised_live_or_not() {
        let inv = inventory();
        let ad = advertisement(Some("nf-1".into()), Ok(&inv), Some("b".into()), None);
        let pods = ad.runtime_pods.as_ref().unwrap();
        assert!(pods.contains("live") && pods.contains("exited"), "{pods:?}");
        assert_eq!(ad.challenge.as_deref(), Some("nf-1"));
        assert_eq!(ad.runtime_source, RuntimeSource::Cri);
        // Nothing of a self-fence is promised.
        assert_eq!(ad.self_fence_after, None);
        assert_eq!(ad.watchdog, None);
        assert_eq!(ad.peer_check, None);
    }

    #[test]
    fn a_runtime_without_a_complete_answer_advertises_no_inventory_and_no_answer() {
        let e = CriError::Timeout {
            method: "ListContainers",
            after: Duration::from_secs(2),
        };
        let ad = advertisement(Some("nf-1".into()), Err(&e), Some("b".into()), None);
        assert_eq!(ad.runtime_pods, None);
        assert_eq!(ad.challenge, None);
        let patch = lease_patch(&ad);
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
        );
        let patch = lease_patch(&ad);
        let a: BTreeMap<String, String> = patch["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        assert_eq!(Advertisement::from_annotations(&a), ad);
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
}
