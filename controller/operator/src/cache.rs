//! Reflector caches of everything the detector and the decision read.
//!
//! Every cache is fed by a watch with the default backoff, so it survives API server restarts.
//! The decision and the state machine read these caches; the steps that mutate objects re-read
//! the object from the API first (fresh `resourceVersion`, UID preconditions).
//!
//! The caches hold what the controller reads, not whole objects: every object is kept without
//! its `managedFields`, and a Node's status and a Pod's spec and status with only what the
//! controller reads (see [`Trim`]). On a real cluster
//! those are most of an object's size (a Node lists every image it holds, often tens of
//! kilobytes), and at 10,000 nodes they were most of the controller's memory.

use std::fmt::Debug;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Node, NodeStatus, PersistentVolumeClaim, Pod, PodSpec, PodStatus,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use palisade_model::{FenceTarget, FencingPolicy, NodeFence};
use serde::de::DeserializeOwned;

use crate::error::Error;

/// Namespace of node heartbeat Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The reflector stores.
#[derive(Clone)]
pub struct Cache {
    /// Nodes.
    pub nodes: Store<Node>,
    /// Node Leases in `kube-node-lease`.
    pub leases: Store<Lease>,
    /// Pods, all namespaces.
    pub pods: Store<Pod>,
    /// PersistentVolumeClaims (access modes for `fenceWhen: StatefulOnly`).
    pub pvcs: Store<PersistentVolumeClaim>,
    /// PodDisruptionBudgets in whichever version the server serves.
    pub pdbs: Store<DynamicObject>,
    /// The PDB API version in use (`policy/v1` or `policy/v1beta1`).
    pub pdb_version: String,
    /// VolumeAttachments.
    pub attachments: Store<VolumeAttachment>,
    /// Fencing policies.
    pub policies: Store<FencingPolicy>,
    /// Fence targets.
    pub targets: Store<FenceTarget>,
    /// Node fences.
    pub fences: Store<NodeFence>,
    /// This replica's sight of the API server, fed by the heartbeat watches (Nodes, node
    /// Leases) and the election rounds.
    pub sight: std::sync::Arc<crate::sight::Sight>,
}

/// What a cache keeps of an object: the parts the controller never reads are dropped as the
/// watch delivers it.
///
/// Guarantees: only fields no reader of the caches uses are dropped; every write re-reads the
/// object from the API first (and a `managedFields` left out of an update keeps the server's).
pub trait Trim {
    /// Drops what the caches need not keep: `managedFields` by default.
    fn trim(&mut self);
}

fn without_managed_fields<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

macro_rules! trim_metadata_only {
    ($($kind:ty),*) => {$(
        impl Trim for $kind {
            fn trim(&mut self) {
                without_managed_fields(self);
            }
        }
    )*};
}

trim_metadata_only!(
    Lease,
    PersistentVolumeClaim,
    VolumeAttachment,
    DynamicObject,
    FencingPolicy,
    FenceTarget,
    NodeFence
);

impl Trim for Node {
    /// Of the status, keeps only the conditions (the Ready heartbeat), `nodeInfo` (boot ID and
    /// machine identity) and the addresses: the images a node holds (often tens of kilobytes),
    /// its capacity and the rest are never read from the cache (the attach records are read
    /// fresh), and a field a later Kubernetes adds is dropped too.
    fn trim(&mut self) {
        without_managed_fields(self);
        if let Some(status) = self.status.take() {
            self.status = Some(NodeStatus {
                conditions: status.conditions,
                node_info: status.node_info,
                addresses: status.addresses,
                ..NodeStatus::default()
            });
        }
    }
}

impl Trim for Pod {
    /// Keeps what the decision and the pod marks read: the node it is bound to, its
    /// tolerations, priority and volumes (its claims), and its phase, reason and conditions.
    /// Containers, their statuses and the rest are never read from the cache (a release lists
    /// the pods fresh), and at tens of pods per node they were most of a large cluster's cache.
    fn trim(&mut self) {
        without_managed_fields(self);
        if let Some(spec) = self.spec.take() {
            self.spec = Some(PodSpec {
                node_name: spec.node_name,
                tolerations: spec.tolerations,
                priority: spec.priority,
                volumes: spec.volumes,
                ..PodSpec::default()
            });
        }
        if let Some(status) = self.status.take() {
            self.status = Some(PodStatus {
                phase: status.phase,
                reason: status.reason,
                conditions: status.conditions,
                ..PodStatus::default()
            });
        }
    }
}

fn spawn_reflector<K>(
    api: Api<K>,
    writer: Writer<K>,
    sight: Option<(std::sync::Arc<crate::sight::Sight>, &'static str)>,
) -> Store<K>
where
    K: Resource + Trim + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let reader = writer.as_reader();
    let kind = K::kind(&Default::default()).into_owned();
    // The lab's stalled-watch fault (debug builds only; never true in a release build). Only
    // changes are held back: a relist's objects replace the whole store, so dropping one of
    // them would remove the object instead of keeping its last version (a relist ends a real
    // stall too).
    let delivered = watcher(api, watcher::Config::default())
        .filter(move |ev| {
            let stalled = match ev {
                Ok(watcher::Event::Apply(o)) => {
                    palisade_fence::planted::watch_stalled(&kind, &o.name_any())
                }
                _ => false,
            };
            std::future::ready(!stalled)
        })
        .modify(Trim::trim);
    let stream = reflector::reflector(writer, delivered)
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Err(e) => {
                    tracing::warn!(error = %e, kind = %K::kind(&Default::default()), "watch error; retrying");
                    // Renewals may have been missed until the watch is back.
                    if let Some((s, watch)) = &sight {
                        s.lost(watch);
                    }
                }
                Ok(_) => {
                    if let Some((s, watch)) = &sight {
                        s.delivered(watch, std::time::Instant::now());
                    }
                }
            }
        }
    });
    reader
}

fn spawn<K>(api: Api<K>) -> Store<K>
where
    K: Resource + Trim + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    spawn_reflector(api, Writer::default(), None)
}

/// Finds the PDB API: `policy/v1` when served, else `policy/v1beta1` (Kubernetes < 1.21).
pub async fn discover_pdb_version(client: &Client) -> Result<String, Error> {
    for version in ["policy/v1", "policy/v1beta1"] {
        match client.list_api_group_resources(version).await {
            Ok(list)
                if list
                    .resources
                    .iter()
                    .any(|r| r.name == "poddisruptionbudgets") =>
            {
                return Ok(version.to_string());
            }
            Ok(_) => {}
            Err(e) if crate::error::is_not_found(&e) => {}
            Err(e) => return Err(Error::kube(format!("discovering {version}"), e)),
        }
    }
    Err(Error::Config(
        "the API server serves no PodDisruptionBudget API".into(),
    ))
}

impl Cache {
    /// Starts every reflector and waits until each has listed once.
    pub async fn start(
        client: &Client,
        sight: std::sync::Arc<crate::sight::Sight>,
    ) -> Result<Self, Error> {
        let pdb_version = discover_pdb_version(client).await?;
        let (group, version) = pdb_version.split_once('/').unwrap_or(("policy", "v1"));
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
            group,
            version,
            "PodDisruptionBudget",
        ));
        let pdbs = {
            let writer = Writer::<DynamicObject>::new(ar.clone());
            let reader = writer.as_reader();
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let stream = reflector::reflector(
                writer,
                watcher(api, watcher::Config::default()).modify(Trim::trim),
            )
            .default_backoff()
            .applied_objects();
            tokio::spawn(async move {
                futures::pin_mut!(stream);
                while let Some(ev) = stream.next().await {
                    if let Err(e) = ev {
                        tracing::warn!(error = %e, "PDB watch error; retrying");
                    }
                }
            });
            reader
        };
        let cache = Cache {
            nodes: spawn_reflector(
                Api::<Node>::all(client.clone()),
                Writer::default(),
                Some((sight.clone(), "Node")),
            ),
            leases: spawn_reflector(
                Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
                Writer::default(),
                Some((sight.clone(), "Lease")),
            ),
            pods: spawn(Api::<Pod>::all(client.clone())),
            pvcs: spawn(Api::<PersistentVolumeClaim>::all(client.clone())),
            pdbs,
            pdb_version,
            attachments: spawn(Api::<VolumeAttachment>::all(client.clone())),
            policies: spawn(Api::<FencingPolicy>::all(client.clone())),
            targets: spawn(Api::<FenceTarget>::all(client.clone())),
            fences: spawn(Api::<NodeFence>::all(client.clone())),
            sight,
        };
        let ready = |what: &'static str| {
            move |r: Result<(), reflector::store::WriterDropped>| {
                r.map_err(|_| Error::Config(format!("{what} reflector stopped")))
            }
        };
        cache
            .nodes
            .wait_until_ready()
            .await
            .map_err(|_| Error::Config("nodes reflector stopped".into()))?;
        ready("leases")(cache.leases.wait_until_ready().await)?;
        ready("pods")(cache.pods.wait_until_ready().await)?;
        ready("pvcs")(cache.pvcs.wait_until_ready().await)?;
        ready("pdbs")(cache.pdbs.wait_until_ready().await)?;
        ready("attachments")(cache.attachments.wait_until_ready().await)?;
        ready("policies")(cache.policies.wait_until_ready().await)?;
        ready("targets")(cache.targets.wait_until_ready().await)?;
        ready("fences")(cache.fences.wait_until_ready().await)?;
        Ok(cache)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_node_keeps_what_the_controller_reads_and_drops_the_rest_of_its_status() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "n1", "uid": "u1", "labels": {"zone": "a"},
                "annotations": {"palisade.dev/exclude": "true"},
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {"taints": [{"key": "k", "effect": "NoExecute"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"bootID": "b", "systemUUID": "s", "machineID": "", "kernelVersion": "",
                    "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "",
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "images": [{"names": ["registry/app:1"], "sizeBytes": 1}],
                "capacity": {"cpu": "4"}, "allocatable": {"cpu": "4"},
                "volumesInUse": ["kubernetes.io/csi/lab^v1"],
            },
        }))
        .unwrap();
        let mut expected = node.clone();
        node.trim();
        expected.metadata.managed_fields = None;
        let status = expected.status.as_mut().unwrap();
        status.images = None;
        status.capacity = None;
        status.allocatable = None;
        status.volumes_in_use = None;
        assert_eq!(node, expected);
        assert!(node.status.unwrap().node_info.is_some());
    }

    #[test]
    fn a_cached_lease_keeps_its_renewal_and_annotations_without_managed_fields() {
        let mut lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "n1", "annotations": {"palisade.dev/companion-written": "t"},
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {"renewTime": "2026-12-01T00:00:00.000000Z"},
        }))
        .unwrap();
        let before = lease.clone();
        lease.trim();
        assert_eq!(lease.metadata.managed_fields, None);
        assert_eq!(lease.metadata.annotations, before.metadata.annotations);
        assert_eq!(lease.spec, before.spec);
    }

    #[test]
    fn a_cached_pod_keeps_what_the_decision_and_the_marks_read() {
        let full = serde_json::json!({
            "metadata": {"name": "db-0", "namespace": "prod", "uid": "u", "labels": {"app": "db"},
                "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "spec": {
                "nodeName": "n1", "priority": 1000,
                "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                    "effect": "NoExecute", "tolerationSeconds": 300}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}],
                "containers": [{"name": "db", "image": "postgres", "env": [{"name": "A", "value": "b"}]}],
            },
            "status": {
                "phase": "Running", "reason": "NodeSuspect",
                "conditions": [{"type": "palisade.dev/NodeSilent", "status": "True"}],
                "containerStatuses": [{"name": "db", "image": "postgres", "imageID": "", "ready": true,
                    "restartCount": 0}],
            },
        });
        let mut pod: Pod = serde_json::from_value(full).unwrap();
        let before = pod.clone();
        pod.trim();
        let (spec, was) = (pod.spec.as_ref().unwrap(), before.spec.as_ref().unwrap());
        assert_eq!(spec.node_name, was.node_name);
        assert_eq!(spec.tolerations, was.tolerations);
        assert_eq!(spec.priority, was.priority);
        assert_eq!(spec.volumes, was.volumes);
        assert!(spec.containers.is_empty());
        let (status, was) = (
            pod.status.as_ref().unwrap(),
            before.status.as_ref().unwrap(),
        );
        assert_eq!(status.phase, was.phase);
        assert_eq!(status.reason, was.reason);
        assert_eq!(status.conditions, was.conditions);
        assert_eq!(status.container_statuses, None);
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(pod.metadata.labels, before.metadata.labels);
        // What the decision sees of the pod is the same.
        let no_claims = |_: &str, _: &str| None::<std::sync::Arc<PersistentVolumeClaim>>;
        assert_eq!(
            palisade_decide::convert::pod_snapshot(&pod, no_claims),
            palisade_decide::convert::pod_snapshot(&before, no_claims)
        );
    }
}
