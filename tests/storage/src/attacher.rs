//! The lab CSI external-attacher for driver [`DRIVER`].
//!
//! It does what the CSI `external-attacher` sidecar does for a real array, with the lab
//! storage server's admin API in place of `ControllerPublishVolume`:
//! - a VolumeAttachment for this driver appears (created by the attach-detach controller):
//!   add the finalizer [`FINALIZER`], record the volume name in an annotation, grant the node's
//!   addresses write access to the volume, then set `status.attached: true`;
//! - the VolumeAttachment gets a `deletionTimestamp` (detach): revoke the node's access
//!   (unless [`Context::revoke_on_detach`] is off), then remove the finalizer so that the
//!   object goes away.
//!
//! A revoke is not a fence: it is not read back and does not cut open connections. After a
//! force delete, the attach-detach controller detaches on its own schedule; only a verified
//! storage fence (`palisade-storagefw`) proves the old node can no longer write.
//!
//! Guarantees: `attached: true` is set only after the storage server confirmed the grant, and
//! the finalizer is removed only after it confirmed the revoke. Assumption: the node's storage
//! addresses are its `InternalIP`s, or the annotation [`ADDRESSES_ANNOTATION`] when present.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::admin_client::AdminClient;
use crate::error::{AdminError, AttacherError};

/// The lab CSI driver name.
pub const DRIVER: &str = "lab.palisade.dev";
/// The finalizer an external-attacher puts on its VolumeAttachments.
pub const FINALIZER: &str = "external-attacher/lab-palisade-dev";
/// Annotation recording which lab volume an attachment granted (used on detach even if the PV
/// is gone by then).
pub const VOLUME_ANNOTATION: &str = "lab.palisade.dev/volume";
/// Annotation recording that the granted volume keeps a detached node's access (copied from
/// the PV's [`KEEPS_ACCESS_ATTRIBUTE`] at attach, used on detach even if the PV is gone).
pub const KEEPS_ACCESS_ANNOTATION: &str = "lab.palisade.dev/keeps-access-on-detach";
/// PV `volumeAttributes` key: `"true"` makes the volume behave like NFS or an array that
/// cannot reach an unreachable node: detaching it never revokes the node's access, whatever
/// [`Context::revoke_on_detach`] says, so only a fence stops an old node's writes.
pub const KEEPS_ACCESS_ATTRIBUTE: &str = "keepsAccessOnDetach";
/// Optional node annotation overriding the node's storage addresses (comma-separated).
pub const ADDRESSES_ANNOTATION: &str = "lab.palisade.dev/storage-addresses";

/// What the reconciler needs.
#[derive(Clone)]
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Storage admin API client.
    pub storage: AdminClient,
    /// Revoke the node's access on detach (what `ControllerUnpublishVolume` does on an array
    /// with LUN masking). When false, detach only releases the finalizer, like a driver with
    /// no unpublish step (NFS): then only a storage fence stops an old node's writes.
    pub revoke_on_detach: bool,
}

fn kube_err(context: String) -> impl FnOnce(kube::Error) -> AttacherError {
    move |source| AttacherError::Kube { context, source }
}

fn storage_err(context: String) -> impl FnOnce(AdminError) -> AttacherError {
    move |source| AttacherError::Storage { context, source }
}

/// The storage addresses of a node object.
pub fn node_addresses(node: &Node) -> Vec<IpAddr> {
    if let Some(list) = node.annotations().get(ADDRESSES_ANNOTATION) {
        return list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
    }
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|addrs| {
            addrs
                .iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The lab volume an attachment grants, and whether detaching it keeps the node's access.
async fn volume_of(ctx: &Context, va: &VolumeAttachment) -> Result<(String, bool), AttacherError> {
    let name = va.name_any();
    if let Some(v) = va.annotations().get(VOLUME_ANNOTATION) {
        let keeps = va
            .annotations()
            .get(KEEPS_ACCESS_ANNOTATION)
            .is_some_and(|k| k == "true");
        return Ok((v.clone(), keeps));
    }
    let pv_name = va
        .spec
        .source
        .persistent_volume_name
        .clone()
        .ok_or_else(|| AttacherError::Invalid {
            name: name.clone(),
            reason: "only PV sources are supported".into(),
        })?;
    let pv = Api::<PersistentVolume>::all(ctx.client.clone())
        .get(&pv_name)
        .await
        .map_err(kube_err(format!("get PV {pv_name}")))?;
    let csi = pv
        .spec
        .and_then(|s| s.csi)
        .ok_or_else(|| AttacherError::Invalid {
            name: name.clone(),
            reason: format!("PV {pv_name} has no CSI source"),
        })?;
    if csi.driver != DRIVER {
        return Err(AttacherError::Invalid {
            name,
            reason: format!("PV {pv_name} belongs to driver {}", csi.driver),
        });
    }
    let keeps = csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get(KEEPS_ACCESS_ATTRIBUTE))
        .is_some_and(|k| k == "true");
    Ok((csi.volume_handle, keeps))
}

/// Reconciles one VolumeAttachment (idempotent).
pub async fn reconcile(
    va: Arc<VolumeAttachment>,
    ctx: Arc<Context>,
) -> Result<Action, AttacherError> {
    if va.spec.attacher != DRIVER {
        return Ok(Action::await_change());
    }
    let name = va.name_any();
    let node = va.spec.node_name.clone();
    let api: Api<VolumeAttachment> = Api::all(ctx.client.clone());
    let has_finalizer = va.finalizers().iter().any(|f| f == FINALIZER);
    let rv = va.resource_version();

    if va.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        let (volume, keeps_access) = volume_of(&ctx, &va).await?;
        if ctx.revoke_on_detach && !keeps_access {
            match ctx.storage.revoke(&volume, &node).await {
                Ok(_) => {}
                // The volume is gone at the server: nothing left to revoke.
                Err(AdminError::Http { status: 404, .. }) => {}
                Err(e) => return Err(storage_err(format!("revoke {node} on {volume}"))(e)),
            }
        }
        let rest: Vec<String> = va
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": rest, "resourceVersion": rv}})),
        )
        .await
        .map_err(kube_err(format!("remove finalizer from {name}")))?;
        if ctx.revoke_on_detach && !keeps_access {
            tracing::info!(attachment = name, node, volume, "detached: access revoked");
        } else {
            tracing::info!(
                attachment = name,
                node,
                volume,
                "detached: the node keeps its access (no revoke on detach)"
            );
        }
        return Ok(Action::await_change());
    }

    let (volume, keeps_access) = volume_of(&ctx, &va).await?;
    if !has_finalizer || !va.annotations().contains_key(VOLUME_ANNOTATION) {
        let mut finalizers = va.finalizers().to_vec();
        if !has_finalizer {
            finalizers.push(FINALIZER.to_owned());
        }
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "finalizers": finalizers,
                "annotations": {
                    VOLUME_ANNOTATION: volume,
                    KEEPS_ACCESS_ANNOTATION: if keeps_access { Some("true") } else { None },
                },
                "resourceVersion": rv,
            }})),
        )
        .await
        .map_err(kube_err(format!("add finalizer to {name}")))?;
    }
    let node_obj = Api::<Node>::all(ctx.client.clone())
        .get(&node)
        .await
        .map_err(kube_err(format!("get node {node}")))?;
    let addrs = node_addresses(&node_obj);
    if addrs.is_empty() {
        return Err(AttacherError::Invalid {
            name,
            reason: format!("node {node} has no InternalIP address"),
        });
    }
    ctx.storage
        .grant(&volume, &node, &addrs)
        .await
        .map_err(storage_err(format!("grant {node} on {volume}")))?;
    let attached = va.status.as_ref().is_some_and(|s| s.attached);
    if !attached {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "attached": true,
                "attachmentMetadata": {"volume": volume},
            }})),
        )
        .await
        .map_err(kube_err(format!("set {name} attached")))?;
        tracing::info!(attachment = name, node, volume, "attached: access granted");
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(va: Arc<VolumeAttachment>, err: &AttacherError, _: Arc<Context>) -> Action {
    tracing::warn!(attachment = va.name_any(), error = %err, "attach reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// Runs the attacher until the stream ends (or the process is stopped).
pub async fn run(ctx: Context) {
    let api: Api<VolumeAttachment> = Api::all(ctx.client.clone());
    Controller::new(api, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(ctx))
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "attacher controller event");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_prefer_annotation_then_internal_ip() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "m0"},
            "status": {"addresses": [
                {"type": "Hostname", "address": "m0"},
                {"type": "InternalIP", "address": "10.213.0.11"}
            ]}
        }))
        .unwrap();
        assert_eq!(
            node_addresses(&node),
            vec!["10.213.0.11".parse::<IpAddr>().unwrap()]
        );
        node.annotations_mut()
            .insert(ADDRESSES_ANNOTATION.into(), "127.0.0.5, 127.0.0.6".into());
        assert_eq!(node_addresses(&node).len(), 2);
    }
}
