//! Release: what the controller does to the API once (and only once) the node is verified
//! fenced. Every function takes the [`VerifiedFence`] proof, which only a status with a level
//! verified with evidence can produce, so none of this can run on an unfenced node.
//!
//! 1. taint the node `palisade.dev/fenced:NoSchedule` (no replacement is scheduled back onto
//!    it) and, when the fence covers every pod on it,
//!    `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`;
//! 2. for each pod: add the `palisade.dev/Fenced` condition and phase Failed (status patch),
//!    then DELETE with grace 0 and a UID precondition;
//! 3. once no pod of the node remains, DELETE its VolumeAttachments with a UID precondition;
//! 4. clear the node's attach records: the volumes its last status still lists in
//!    `volumesInUse`, which Kubernetes 1.20's attach-detach controller honours for 6 minutes
//!    before it detaches a ReadWriteOnce volume from an unreachable node.
//!
//! Each function is idempotent: an object already gone (404) or already replaced by another of
//! the same name (409 on the UID precondition) counts as released.

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, Taint};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, ResourceExt};
use palisade_decide::phase::{NodePod, NodeVolume, ObjectRef, ReleaseTaints};
use palisade_model::nodefence::{
    release_taints_added_by, release_taints_forgotten, release_taints_recorded, VerifiedFence,
    ANNOTATION_RELEASE_TAINTS,
};
use palisade_model::target::ClaimBacking;
use palisade_model::{
    FENCED_TAINT_KEY, OUT_OF_SERVICE_TAINT_KEY, OUT_OF_SERVICE_TAINT_VALUE, POD_CONDITION_FENCED,
};

use crate::error::{is_not_found, Error};

fn gone(e: &kube::Error) -> bool {
    // 404: deleted; 409: the UID precondition failed (a new object with the same name).
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

fn is_release_taint(t: &Taint) -> bool {
    t.key == OUT_OF_SERVICE_TAINT_KEY || t.key == FENCED_TAINT_KEY
}

/// The release taints (out-of-service, `palisade.dev/fenced`) on `node`, split into those the
/// fence whose UID is `uid` recorded adding ([`ANNOTATION_RELEASE_TAINTS`]) and the others (a
/// person's, medik8s', another fence's). Keys, sorted.
pub fn release_taints_on(node: &Node, uid: &str) -> (Vec<String>, Vec<String>) {
    let added = recorded_by(node, uid);
    let (mut ours, mut foreign): (Vec<String>, Vec<String>) = taints(node)
        .iter()
        .filter(|t| is_release_taint(t))
        .map(|t| t.key.clone())
        .partition(|k| added.contains(k));
    ours.sort();
    ours.dedup();
    foreign.sort();
    foreign.dedup();
    (ours, foreign)
}

fn recorded_by(node: &Node, uid: &str) -> Vec<String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_RELEASE_TAINTS))
        .map(|v| release_taints_added_by(v, uid))
        .unwrap_or_default()
}

/// Adds the taints `which` asks for that `n` does not carry yet, and records them as added by
/// the fence whose UID is `uid` in the same object ([`ANNOTATION_RELEASE_TAINTS`]). Returns
/// whether `n` changed.
///
/// Guarantees: a taint `n` already carries (whoever put it there) is neither added nor
/// recorded, so [`untaint_node`] never removes it; the record names exactly the taints this
/// function added for `uid`, because both go out in one Node update.
pub fn taint_node(n: &mut Node, uid: &str, which: ReleaseTaints) -> bool {
    let missing: Vec<Taint> = wanted(which)
        .into_iter()
        .filter(|w| !taints(n).iter().any(|t| t.key == w.key))
        .collect();
    if missing.is_empty() {
        return false;
    }
    let annotations = n.metadata.annotations.get_or_insert_with(Default::default);
    let value = release_taints_recorded(
        annotations
            .get(ANNOTATION_RELEASE_TAINTS)
            .map(String::as_str),
        uid,
        missing.iter().map(|t| t.key.as_str()),
    );
    annotations.insert(ANNOTATION_RELEASE_TAINTS.to_string(), value);
    let spec = n.spec.get_or_insert_with(Default::default);
    spec.taints.get_or_insert_with(Vec::new).extend(missing);
    true
}

/// Removes from `n` the release taints the fence whose UID is `uid` recorded adding, and its
/// record, in the same object. Returns whether `n` changed.
///
/// Guarantees: a taint this fence did not record adding stays, whatever its key; so does
/// every other fence's record.
pub fn untaint_node(n: &mut Node, uid: &str) -> bool {
    // `taint_node` never writes an entry without a key.
    let ours = recorded_by(n, uid);
    if ours.is_empty() {
        return false;
    }
    let Some(annotations) = n.metadata.annotations.as_mut() else {
        return false;
    };
    let Some(value) = annotations.get(ANNOTATION_RELEASE_TAINTS).cloned() else {
        return false;
    };
    match release_taints_forgotten(&value, uid) {
        Some(rest) => annotations.insert(ANNOTATION_RELEASE_TAINTS.to_string(), rest),
        None => annotations.remove(ANNOTATION_RELEASE_TAINTS),
    };
    if let Some(ts) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        ts.retain(|t| !(is_release_taint(t) && ours.contains(&t.key)));
    }
    true
}

/// The taints `which` asks for.
fn wanted(which: ReleaseTaints) -> Vec<Taint> {
    let mut out = vec![Taint {
        key: FENCED_TAINT_KEY.into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    }];
    if which == ReleaseTaints::OutOfService {
        out.push(Taint {
            key: OUT_OF_SERVICE_TAINT_KEY.into(),
            value: Some(OUT_OF_SERVICE_TAINT_VALUE.into()),
            effect: "NoExecute".into(),
            time_added: None,
        });
    }
    out
}

/// Reads `node` and, when `edit` changed it, writes it back (compare-and-swap on its
/// resourceVersion, read again and edited again on a conflict). `None`: no such Node (nothing
/// was written); `Some(written)` otherwise.
async fn edit_node(
    client: &kube::Client,
    node: &str,
    what: &str,
    mut edit: impl FnMut(&mut Node) -> bool,
) -> Result<Option<bool>, Error> {
    let api: Api<Node> = Api::all(client.clone());
    loop {
        let Some(mut n) = api
            .get_opt(node)
            .await
            .map_err(|e| Error::kube(format!("reading node {node}"), e))?
        else {
            return Ok(None);
        };
        if !edit(&mut n) {
            return Ok(Some(false));
        }
        match api.replace(node, &PostParams::default(), &n).await {
            Ok(_) => return Ok(Some(true)),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(Error::kube(format!("{what} node {node}"), e)),
        }
    }
}

/// Release 1: adds the release's taints that the Node does not carry yet, with the record
/// that this fence (`uid`) added them, in one update ([`taint_node`]; compare-and-swap on the
/// Node's resourceVersion).
pub async fn apply_taint(
    client: &kube::Client,
    node: &str,
    uid: &str,
    _proof: &VerifiedFence,
    which: ReleaseTaints,
) -> Result<(), Error> {
    let edited = edit_node(client, node, "tainting", |n| taint_node(n, uid, which)).await?;
    match edited {
        Some(_) => Ok(()),
        None => Err(Error::kube(
            format!("tainting node {node}"),
            kube::Error::Api(Box::new(
                kube::core::Status::failure(&format!("node {node} not found"), "NotFound")
                    .with_code(404),
            )),
        )),
    }
}

/// Recover: removes the release taints the fence whose UID is `uid` added, and its record,
/// in one update ([`untaint_node`]); a missing Node has none. Returns the release taints left
/// on the Node (keys): another actor's, never removed.
pub async fn remove_taint(
    client: &kube::Client,
    node: &str,
    uid: &str,
) -> Result<Vec<String>, Error> {
    let mut left = Vec::new();
    edit_node(client, node, "untainting", |n| {
        let changed = untaint_node(n, uid);
        left = release_taints_on(n, uid).1;
        changed
    })
    .await?;
    Ok(left)
}

/// The node's VolumeAttachments that have not settled
/// ([`palisade_decide::phase::attachment_settled`]: being deleted, or with a detach error),
/// read live.
pub async fn unsettled_attachments(
    client: &kube::Client,
    node: &str,
) -> Result<Vec<ObjectRef>, Error> {
    Ok(node_attachments(client, node)
        .await?
        .iter()
        .filter(|v| {
            !palisade_decide::phase::attachment_settled(
                v.metadata.deletion_timestamp.is_some(),
                v.status.as_ref().is_some_and(|s| s.detach_error.is_some()),
            )
        })
        .map(attachment_ref)
        .collect())
}

/// The VolumeAttachments naming `node`, read live.
async fn node_attachments(
    client: &kube::Client,
    node: &str,
) -> Result<Vec<VolumeAttachment>, Error> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("listing VolumeAttachments", e))?;
    Ok(list
        .items
        .into_iter()
        .filter(|v| v.spec.node_name == node)
        .collect())
}

fn attachment_ref(v: &VolumeAttachment) -> ObjectRef {
    ObjectRef {
        namespace: String::new(),
        name: v.name_any(),
        uid: v.uid().unwrap_or_default(),
    }
}

/// The recovery challenge `node` carries now
/// ([`palisade_model::advertise::RECOVERY_CHALLENGE`]), read live (`None`: no such Node, or no
/// challenge on it).
pub async fn challenge_on_node(client: &kube::Client, node: &str) -> Result<Option<String>, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let n = api
        .get_opt(node)
        .await
        .map_err(|e| Error::kube(format!("reading node {node}"), e))?;
    Ok(n.and_then(|n| {
        n.metadata
            .annotations?
            .get(palisade_model::advertise::RECOVERY_CHALLENGE)
            .map(|v| v.trim().to_string())
    }))
}

/// Recover: writes `challenge` (the fence's UID) as the Node's recovery challenge. Only a
/// Lease renewal whose inventory the agent took after reading it can prove the node clean
/// ([`palisade_decide::phase::clean_proof`]).
///
/// Guarantees: called only once the release is recorded (the decision core asks for it in
/// Recovering), so the agent reads it after every released pod was deleted. Idempotent; a
/// missing Node is left alone.
pub async fn post_challenge(
    client: &kube::Client,
    node: &str,
    challenge: &str,
) -> Result<(), Error> {
    edit_node(client, node, "posting the recovery challenge on", |n| {
        let annotations = n.metadata.annotations.get_or_insert_with(Default::default);
        let key = palisade_model::advertise::RECOVERY_CHALLENGE;
        if annotations.get(key).is_some_and(|v| v == challenge) {
            return false;
        }
        annotations.insert(key.to_string(), challenge.to_string());
        true
    })
    .await?;
    Ok(())
}

/// Pods bound to `node`, read live from the API (not the cache: release must not act on a stale
/// list).
pub async fn pods_on_node(client: &kube::Client, node: &str) -> Result<Vec<NodePod>, Error> {
    let api: Api<Pod> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|e| Error::kube(format!("listing pods on {node}"), e))?;
    let mut pods = Vec::with_capacity(list.items.len());
    for p in &list.items {
        let namespace = p.namespace().unwrap_or_default();
        let mut claims = Vec::new();
        for claim in claim_names(p) {
            claims.push(claim_backing(client, &namespace, claim).await?);
        }
        pods.push(NodePod {
            pod: ObjectRef {
                namespace,
                name: p.name_any(),
                uid: p.uid().unwrap_or_default(),
            },
            claims,
        });
    }
    Ok(pods)
}

/// The claims a pod's spec mounts (PersistentVolumeClaim volumes), by name: what a storage
/// fence (within what its devices name), or a self-fence of scope `stateful`, covers. (A
/// generic ephemeral volume does not count: the node agent's `stateful` self-fence does not
/// kill such pods, so they are held on such proofs.)
fn claim_names(p: &Pod) -> impl Iterator<Item = &str> {
    p.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
}

/// What backs claim `namespace/name`, read live (the claim, then the PersistentVolume it is
/// bound to, for its CSI driver): a claim that does not exist is
/// [`ClaimBacking::Unknown`] (no storage scope includes it); a failed read is an error (the
/// release step is tried again, never taken on doubt).
async fn claim_backing(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<ClaimBacking, Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let pvc = api
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("reading claim {namespace}/{name}"), e))?;
    let Some(spec) = pvc.map(|c| c.spec.unwrap_or_default()) else {
        return Ok(ClaimBacking::Unknown);
    };
    let volume = spec.volume_name.filter(|v| !v.is_empty());
    let driver = match &volume {
        Some(v) => Api::<PersistentVolume>::all(client.clone())
            .get_opt(v)
            .await
            .map_err(|e| Error::kube(format!("reading volume {v} of claim {namespace}/{name}"), e))?
            .and_then(|pv| pv.spec?.csi.map(|c| c.driver)),
        None => None,
    };
    Ok(ClaimBacking::Known {
        storage_class: spec.storage_class_name.unwrap_or_default(),
        driver,
        volume,
    })
}

#[cfg(test)]
#[test]
fn the_csi_driver_of_a_volume_in_use_is_its_name_prefix() {
    assert_eq!(
        csi_driver_of_volume("kubernetes.io/csi/csi.array.example^vol-1"),
        Some("csi.array.example")
    );
    assert_eq!(csi_driver_of_volume("kubernetes.io/csi/^vol-1"), None);
    assert_eq!(csi_driver_of_volume("kubernetes.io/host-path/pv-1"), None);
    assert_eq!(csi_driver_of_volume("kubernetes.io/csi/no-handle"), None);
}

/// The CSI driver of a unique volume name as `status.volumesInUse` lists it
/// (`kubernetes.io/csi/<driver>^<handle>`); `None` for any other volume plugin.
pub fn csi_driver_of_volume(unique_name: &str) -> Option<&str> {
    unique_name
        .strip_prefix("kubernetes.io/csi/")?
        .split_once('^')
        .map(|(driver, _)| driver)
        .filter(|d| !d.is_empty())
}

/// VolumeAttachments naming `node`, read live, each with its CSI driver (`spec.attacher`).
pub async fn attachments_on_node(
    client: &kube::Client,
    node: &str,
) -> Result<Vec<NodeVolume>, Error> {
    Ok(node_attachments(client, node)
        .await?
        .iter()
        .map(|v| NodeVolume {
            object: attachment_ref(v),
            driver: Some(v.spec.attacher.clone()).filter(|a| !a.is_empty()),
        })
        .collect())
}

/// Release 2: marks the pod fenced and Failed, then deletes it with grace 0 and a UID
/// precondition.
pub async fn release_pod(
    client: &kube::Client,
    node: &str,
    pod: &ObjectRef,
    _proof: &VerifiedFence,
) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let now = Timestamp::now();
    let patch = serde_json::json!({
        "metadata": {"uid": pod.uid},
        "status": {
            "phase": "Failed",
            "reason": "NodeFenced",
            "message": format!("node {node} was fenced by Palisade (verified); the pod's processes are gone"),
            "conditions": [{
                "type": POD_CONDITION_FENCED,
                "status": "True",
                "reason": "NodeFenced",
                "message": format!("node {node} verified fenced"),
                "lastTransitionTime": now.to_string(),
                "lastProbeTime": null,
            }],
        }
    });
    match api
        .patch_status(
            &pod.name,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(e) if gone(&e) => return Ok(()),
        Err(e) => {
            return Err(Error::kube(
                format!("marking pod {}/{} fenced", pod.namespace, pod.name),
                e,
            ))
        }
    }
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&pod.name, &dp).await {
        Ok(_) => Ok(()),
        Err(e) if gone(&e) => Ok(()),
        Err(e) => Err(Error::kube(
            format!("deleting pod {}/{}", pod.namespace, pod.name),
            e,
        )),
    }
}

/// Release 3: deletes a VolumeAttachment with a UID precondition.
pub async fn delete_attachment(
    client: &kube::Client,
    va: &ObjectRef,
    _proof: &VerifiedFence,
) -> Result<(), Error> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(va.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&va.name, &dp).await {
        Ok(_) => Ok(()),
        Err(e) if gone(&e) || is_not_found(&e) => Ok(()),
        Err(e) => Err(Error::kube(
            format!("deleting VolumeAttachment {}", va.name),
            e,
        )),
    }
}

/// The node's attach records: the volumes its `status.volumesInUse` still lists, read live.
///
/// Kubernetes 1.20's attach-detach controller does not detach a volume the node reports in
/// use (for up to 6 minutes), so a ReadWriteOnce volume cannot follow its pod to another node
/// while a fenced node's last status claims it. Each entry is an [`ObjectRef`] whose `name` is
/// the volume's unique name and whose `uid` is the Node's UID (the precondition of the patch).
pub async fn attach_records(client: &kube::Client, node: &str) -> Result<Vec<NodeVolume>, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let Some(n) = api
        .get_opt(node)
        .await
        .map_err(|e| Error::kube(format!("reading node {node}"), e))?
    else {
        return Ok(Vec::new());
    };
    let uid = n.uid().unwrap_or_default();
    Ok(n.status
        .and_then(|s| s.volumes_in_use)
        .unwrap_or_default()
        .into_iter()
        .map(|v| NodeVolume {
            driver: csi_driver_of_volume(&v).map(String::from),
            object: ObjectRef {
                namespace: String::new(),
                name: v,
                uid: uid.clone(),
            },
        })
        .collect())
}

/// Release 4: removes one volume from the fenced node's `status.volumesInUse`, writing the
/// status back with the resourceVersion it read (a concurrent change makes the write fail with
/// a conflict, and the step is retried on the next tick). A volume already gone, or a Node
/// replaced by another of the same name, counts as done.
///
/// Only a verified fence ([`VerifiedFence`]) may do this: a node powered off or cut off from
/// the storage mounts nothing, so its stale claim is all that keeps the volume from moving.
pub async fn clear_attach_record(
    client: &kube::Client,
    node: &str,
    record: &ObjectRef,
    _proof: &VerifiedFence,
) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    let mut n = match api.get_status(node).await {
        Ok(n) => n,
        Err(e) if is_not_found(&e) => return Ok(()),
        Err(e) => return Err(Error::kube(format!("reading node {node}"), e)),
    };
    if n.uid().as_deref() != Some(record.uid.as_str()) {
        return Ok(());
    }
    let Some(in_use) = n.status.as_mut().and_then(|s| s.volumes_in_use.as_mut()) else {
        return Ok(());
    };
    if !in_use.contains(&record.name) {
        return Ok(());
    }
    in_use.retain(|v| *v != record.name);
    api.replace_status(node, &PostParams::default(), &n)
        .await
        .map_err(|e| {
            Error::kube(
                format!("removing {} from node {node}'s volumesInUse", record.name),
                e,
            )
        })?;
    Ok(())
}

#[cfg(test)]
mod taint_tests {
    use super::*;

    const UID: &str = "3f6c1a52-8d0e-4b1f-9a57-0c2de1b1a001";

    fn node(taint_keys: &[&str]) -> Node {
        let mut n = Node::default();
        n.spec.get_or_insert_with(Default::default).taints = Some(
            taint_keys
                .iter()
                .map(|k| Taint {
                    key: (*k).into(),
                    effect: "NoExecute".into(),
                    ..Default::default()
                })
                .collect(),
        );
        n
    }

    fn keys(n: &Node) -> Vec<&str> {
        taints(n).iter().map(|t| t.key.as_str()).collect()
    }

    #[test]
    fn recovery_removes_only_the_release_taints_this_fence_added() {
        // medik8s (or a person) put the out-of-service taint there first.
        let mut n = node(&["other/taint", OUT_OF_SERVICE_TAINT_KEY]);
        assert!(taint_node(&mut n, UID, ReleaseTaints::OutOfService));
        assert_eq!(
            keys(&n),
            vec!["other/taint", OUT_OF_SERVICE_TAINT_KEY, FENCED_TAINT_KEY]
        );
        assert_eq!(
            release_taints_on(&n, UID),
            (
                vec![FENCED_TAINT_KEY.to_string()],
                vec![OUT_OF_SERVICE_TAINT_KEY.to_string()]
            )
        );
        // A retried taint (a crash before the status write) changes nothing.
        assert!(!taint_node(&mut n, UID, ReleaseTaints::OutOfService));
        // Another fence's UID removes nothing.
        assert!(!untaint_node(
            &mut n,
            "0b9e77aa-1c42-4d1d-8f0f-55e3c2d7b002"
        ));
        assert!(untaint_node(&mut n, UID));
        assert_eq!(keys(&n), vec!["other/taint", OUT_OF_SERVICE_TAINT_KEY]);
        assert!(n
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(ANNOTATION_RELEASE_TAINTS)));
        assert_eq!(
            release_taints_on(&n, UID),
            (vec![], vec![OUT_OF_SERVICE_TAINT_KEY.to_string()])
        );
        // Removing again is a no-op.
        assert!(!untaint_node(&mut n, UID));
    }

    #[test]
    fn a_fence_that_added_both_taints_removes_both() {
        let mut n = node(&[]);
        assert!(taint_node(&mut n, UID, ReleaseTaints::OutOfService));
        assert_eq!(release_taints_on(&n, UID).1, Vec::<String>::new());
        assert!(untaint_node(&mut n, UID));
        assert!(keys(&n).is_empty());
    }
}
