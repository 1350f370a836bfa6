//! `kubectl palisade fence NODE` and `cancel NODEFENCE`.

use std::time::Duration;

use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use palisade_model::nodefence::{Overrides, Phase, RequestedBy};
use palisade_model::{NodeFence, NodeFenceSpec};

/// Creates a manual NodeFence and, with `wait`, prints each transition until it ends: exit 0
/// once it released the node's pods (or ended), 1 when it failed, [`crate::TIMED_OUT`] when it
/// was still under way after `wait`.
pub async fn request(
    c: &Client,
    node: &str,
    reason: &str,
    overrides: Overrides,
    wait: Option<Duration>,
) -> anyhow::Result<u8> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    if nodes.get_opt(node).await?.is_none() {
        anyhow::bail!("no Node named {node:?}: nothing requested");
    }
    let api: Api<NodeFence> = Api::all(c.clone());
    let mut nf = NodeFence::new(
        "",
        NodeFenceSpec {
            node_name: node.to_string(),
            reason: reason.to_string(),
            requested_by: RequestedBy::Manual,
            overrides,
        },
    );
    nf.metadata.name = None;
    nf.metadata.generate_name = Some(format!("{node}-manual-"));
    let created = api.create(&PostParams::default(), &nf).await?;
    let name = created.name_any();
    println!("nodefence/{name} requested for node {node}");
    let Some(limit) = wait else {
        return Ok(0);
    };
    let deadline = tokio::time::Instant::now() + limit;
    let mut shown = 0;
    // A follow, not a retry: the status is shown twice a second until the fence ends.
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let f = api.get(&name).await?;
        if let Some(st) = &f.status {
            for t in st.transitions.iter().skip(shown) {
                println!("{}  {:<11} {}", t.at.0, t.phase.as_str(), t.message);
            }
            shown = st.transitions.len();
            if st.phase.is_terminal() || st.phase == Phase::Released {
                return Ok(if st.phase == Phase::Failed { 1 } else { 0 });
            }
        }
        if tokio::time::Instant::now() >= deadline {
            println!(
                "still in progress after {}s: follow it with `kubectl palisade timeline {name}`",
                limit.as_secs()
            );
            return Ok(crate::TIMED_OUT);
        }
    }
}

/// Deletes a NodeFence that is still Pending (nothing was done); refuses once fencing began.
pub async fn cancel(c: &Client, name: &str) -> anyhow::Result<u8> {
    let api: Api<NodeFence> = Api::all(c.clone());
    let Some(f) = api.get_opt(name).await? else {
        anyhow::bail!("no NodeFence named {name:?}");
    };
    let phase = f.status.as_ref().map_or(Phase::Pending, |s| s.phase);
    if phase != Phase::Pending {
        eprintln!(
            "refused: nodefence/{name} is {}: fencing has begun, and deleting the request would not undo it; \
             it ends by itself (Released, then Recovering once the node returns with proof)",
            phase.as_str()
        );
        return Ok(crate::REFUSED);
    }
    // The UID and resourceVersion preconditions: never delete a fence that moved on meanwhile.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: f.metadata.uid.clone(),
            resource_version: f.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => {
            println!("nodefence/{name} cancelled (it was Pending: nothing had been done)");
            Ok(0)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            eprintln!("refused: nodefence/{name} changed while cancelling; look again with `kubectl palisade timeline {name}`");
            Ok(crate::REFUSED)
        }
        Err(e) => Err(e.into()),
    }
}

/// Confirms, for one NodeFence, that none of the pods it released runs on the machine any more
/// (after a person checked it): writes `palisade.dev/confirm-clean: <uid>: <note>` on it.
///
/// Guarantees: the confirmation names the NodeFence's UID, so it vouches for that fence's
/// released pods only; the controller ignores it on any other fence of the node (a later one
/// released other pods). Refused (exit 3) unless the fence has released (`Released` or
/// `Recovering`): before that there is nothing to confirm.
pub async fn confirm_clean(c: &Client, name: &str, note: &str) -> anyhow::Result<u8> {
    use palisade_model::nodefence::{confirm_clean_value, ANNOTATION_CONFIRM_CLEAN};
    let api: Api<NodeFence> = Api::all(c.clone());
    let Some(f) = api.get_opt(name).await? else {
        anyhow::bail!("no NodeFence named {name:?}");
    };
    let phase = f.status.as_ref().map_or(Phase::Pending, |s| s.phase);
    if !matches!(phase, Phase::Released | Phase::Recovering) {
        eprintln!(
            "refused: nodefence/{name} is {}: only a fence that released pods (Released or Recovering) waits for a confirmation",
            phase.as_str()
        );
        return Ok(crate::REFUSED);
    }
    let Some(uid) = f.metadata.uid.clone() else {
        anyhow::bail!("nodefence/{name} has no UID");
    };
    let value = confirm_clean_value(&uid, note);
    // The UID in the patch is a precondition: a NodeFence recreated under the same name meanwhile
    // is not confirmed by mistake.
    let patch = serde_json::json!({
        "metadata": { "uid": uid, "annotations": { ANNOTATION_CONFIRM_CLEAN: value } }
    });
    match api
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            println!("nodefence/{name} confirmed clean ({ANNOTATION_CONFIRM_CLEAN}: {value})");
            Ok(0)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            eprintln!("refused: nodefence/{name} was replaced while confirming; look again with `kubectl palisade timeline {name}`");
            Ok(crate::REFUSED)
        }
        Err(e) => Err(e.into()),
    }
}
