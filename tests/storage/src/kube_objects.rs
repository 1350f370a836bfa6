//! The Kubernetes objects that put lab volumes under the real attach-detach controller.
//!
//! What the 1.20 attach-detach controller (ADC) needs before it creates a VolumeAttachment
//! for a pod's CSI volume (read from `pkg/controller/volume/attachdetach` and
//! `pkg/volume/csi` of 1.20):
//! - the pod is scheduled (`spec.nodeName`) and not terminated, and its PVC is bound to a PV
//!   with a `csi` source;
//! - the node carries the annotation `volumes.kubernetes.io/controller-managed-attach-detach:
//!   "true"` (otherwise the ADC leaves attach to the kubelet and creates nothing);
//! - the CSI plugin considers the driver attachable: a `CSIDriver` object with
//!   `attachRequired: true`, or no `CSIDriver` object at all;
//! - a `CSINode` listing the driver is not needed for attach in 1.20 (it matters for CSI
//!   migration and volume limits), but a real node plugin registers one, so the lab creates
//!   it too.
//!
//! The ADC names the attachment `csi-<sha256(volumeHandle + driver + nodeName)>` and then waits
//! for `status.attached`. For a PV whose access modes are only `ReadWriteOnce`, the ADC refuses
//! to attach it to a second node while it is attached to the first (a "Multi-Attach error"
//! event on the pod).
//!
//! Gap (1.20): that protection ends when the ADC detaches. After a force delete of the pod on
//! a partitioned node whose stale status still lists the volume in `volumesInUse`, the ADC
//! waits `maxWaitForUnmountDuration` (6 minutes) and then detaches anyway, with no fencing;
//! the replacement pod's node is attached right after. So multi-attach protection only delays
//! split-brain: the storage fence must come first, and Palisade's release step (delete the
//! node's VolumeAttachments) must run only after the fence is verified.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::attacher::DRIVER;

/// Annotation that hands a node's attach/detach to the attach-detach controller.
pub const CONTROLLER_MANAGED: &str = "volumes.kubernetes.io/controller-managed-attach-detach";

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v)
        .unwrap_or_else(|e| unreachable!("static object templates deserialize: {e}"))
}

/// The lab CSIDriver: attach required, persistent volumes only.
pub fn csi_driver() -> CSIDriver {
    from_json(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": true, "podInfoOnMount": false,
                 "volumeLifecycleModes": ["Persistent"]}
    }))
}

/// The CSINode a node plugin would register for `node`.
pub fn csi_node(node: &str) -> CSINode {
    from_json(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": node}]}
    }))
}

/// How a lab volume treats a node it is detached from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detach {
    /// The attacher revokes the node's access (an array with LUN masking).
    Revokes,
    /// The node keeps its access (NFS, or an array that cannot reach an unreachable node):
    /// only a fence stops its writes ([`crate::attacher::KEEPS_ACCESS_ATTRIBUTE`]).
    KeepsAccess,
}

/// A static RWO PV for lab volume `volume` served at `data_server` (host:port), pre-bound to
/// the claim `namespace/claim`.
pub fn persistent_volume(
    name: &str,
    volume: &str,
    data_server: &str,
    namespace: &str,
    claim: &str,
    detach: Detach,
) -> PersistentVolume {
    let mut attributes = json!({"server": data_server, "volume": volume});
    if detach == Detach::KeepsAccess {
        attributes[crate::attacher::KEEPS_ACCESS_ATTRIBUTE] = json!("true");
    }
    from_json(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": claim},
            "csi": {"driver": DRIVER, "volumeHandle": volume, "volumeAttributes": attributes}
        }
    }))
}

/// An RWO claim bound to PV `pv`.
pub fn persistent_volume_claim(namespace: &str, name: &str, pv: &str) -> PersistentVolumeClaim {
    from_json(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "",
            "volumeName": pv
        }
    }))
}

async fn create_or_keep<K>(api: &Api<K>, obj: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates the CSIDriver (idempotent).
pub async fn ensure_csi_driver(client: &Client) -> Result<(), kube::Error> {
    create_or_keep(&Api::<CSIDriver>::all(client.clone()), &csi_driver()).await
}

/// Makes `node` controller-managed for attach/detach and registers its CSINode (idempotent).
pub async fn prepare_node(client: &Client, node: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut ann = BTreeMap::new();
    ann.insert(CONTROLLER_MANAGED, "true");
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": ann}})),
        )
        .await?;
    create_or_keep(&Api::<CSINode>::all(client.clone()), &csi_node(node)).await
}

/// Creates a PV and its pre-bound PVC (idempotent).
///
/// The claim is created only once the PV controller has taken the volume in (its phase moved
/// past the API server's `Pending`), for up to 30 s: a claim it sees first waits for its periodic resync (15 s by
/// default) before it is bound, and the scheduler keeps a pod of an unbound claim pending.
pub async fn ensure_volume(
    client: &Client,
    pv_name: &str,
    volume: &str,
    data_server: &str,
    namespace: &str,
    claim: &str,
    detach: Detach,
) -> Result<(), kube::Error> {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    create_or_keep(
        &pvs,
        &persistent_volume(pv_name, volume, data_server, namespace, claim, detach),
    )
    .await?;
    for _ in 0..300 {
        let phase = pvs.get_opt(pv_name).await?.and_then(|pv| pv.status?.phase);
        if phase.is_some_and(|p| p != "Pending") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    create_or_keep(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace),
        &persistent_volume_claim(namespace, claim, pv_name),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pv_is_rwo_csi_with_server_and_volume_attributes() {
        let pv = persistent_volume(
            "pv-web-0",
            "web-0",
            "10.213.0.1:7000",
            "default",
            "data-web-0",
            Detach::Revokes,
        );
        let spec = pv.spec.unwrap();
        assert_eq!(spec.access_modes.unwrap(), vec!["ReadWriteOnce".to_owned()]);
        let csi = spec.csi.unwrap();
        assert_eq!(csi.driver, DRIVER);
        assert_eq!(csi.volume_handle, "web-0");
        let attributes = csi.volume_attributes.unwrap();
        assert_eq!(attributes["server"], "10.213.0.1:7000");
        assert!(!attributes.contains_key(crate::attacher::KEEPS_ACCESS_ATTRIBUTE));
        assert_eq!(spec.claim_ref.unwrap().name.unwrap(), "data-web-0");
        let nfs = persistent_volume("p", "v", "s:1", "d", "c", Detach::KeepsAccess);
        assert_eq!(
            nfs.spec.unwrap().csi.unwrap().volume_attributes.unwrap()
                [crate::attacher::KEEPS_ACCESS_ATTRIBUTE],
            "true"
        );
    }

    #[test]
    fn csi_driver_requires_attach_and_csinode_lists_it() {
        assert_eq!(csi_driver().spec.attach_required, Some(true));
        let n = csi_node("m0");
        assert_eq!(n.spec.drivers[0].name, DRIVER);
        assert_eq!(n.spec.drivers[0].node_id, "m0");
        let pvc = persistent_volume_claim("default", "data-web-0", "pv-web-0");
        assert_eq!(pvc.spec.unwrap().volume_name.unwrap(), "pv-web-0");
    }
}
