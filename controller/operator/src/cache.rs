//! Reflector caches of everything the detector and the decision read.
//!
//! Every cache is fed by a watch with the default backoff, so it survives API server restarts.
//! The decision and the state machine read these caches; the steps that mutate objects re-read
//! the object from the API first (fresh `resourceVersion`, UID preconditions).

use std::fmt::Debug;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
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

fn spawn_reflector<K>(
    api: Api<K>,
    writer: Writer<K>,
    sight: Option<(std::sync::Arc<crate::sight::Sight>, &'static str)>,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let reader = writer.as_reader();
    let kind = K::kind(&Default::default()).into_owned();
    // The lab's stalled-watch fault (debug builds only; never true in a release build). Only
    // changes are held back: a relist's objects replace the whole store, so dropping one of
    // them would remove the object instead of keeping its last version (a relist ends a real
    // stall too).
    let delivered = watcher(api, watcher::Config::default()).filter(move |ev| {
        let stalled = match ev {
            Ok(watcher::Event::Apply(o)) => {
                palisade_fence::planted::watch_stalled(&kind, &o.name_any())
            }
            _ => false,
        };
        std::future::ready(!stalled)
    });
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
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
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
            let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
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
