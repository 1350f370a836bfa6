//! Makes a silent node visible in plain `kubectl get pods`: while the controller sees a node
//! Suspect or Unhealthy, each of its pods carries the `palisade.dev/NodeSilent` condition and
//! `status.reason: NodeSilent` (the STATUS column); both are withdrawn when the node renews
//! again. A released pod's reason is `NodeFenced` (set by the release itself).
//!
//! Guarantees: informational only — nothing reads these marks to decide anything; a pod whose
//! `status.reason` is someone else's is never overwritten (only the condition is set); marks
//! are written only on a change (silent ↔ renewing), by the leader, off the decision path.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use palisade_decide::detector::{classify, Health, Thresholds};
use palisade_model::POD_CONDITION_NODE_SILENT;

use crate::Ctx;

/// The `status.reason` written on the pods of a silent node.
pub const REASON: &str = "NodeSilent";

/// What to write on one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// The node is silent: set the condition (and the reason, when it is free).
    Set {
        /// `NodeSuspect` or `NodeUnhealthy`.
        reason: &'static str,
        /// Why, in words.
        message: String,
        /// Also write `status.reason`.
        with_reason: bool,
    },
    /// The node renews again: withdraw the condition (and our reason).
    Clear {
        /// Also clear `status.reason` (it is ours).
        with_reason: bool,
    },
}

/// The mark `pod` needs, given its node's health (`None` when nothing changes).
pub fn plan(pod: &Pod, health: Health, message: &str) -> Option<Mark> {
    let status = pod.status.as_ref();
    let marked = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == POD_CONDITION_NODE_SILENT && c.status == "True");
    let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or_default();
    match health {
        Health::Healthy if marked => Some(Mark::Clear {
            with_reason: reason == REASON,
        }),
        Health::Healthy => None,
        _ if marked => None,
        h => Some(Mark::Set {
            reason: if h == Health::Unhealthy {
                "NodeUnhealthy"
            } else {
                "NodeSuspect"
            },
            message: message.to_string(),
            with_reason: reason.is_empty(),
        }),
    }
}

fn patch_body(mark: &Mark, now: Timestamp) -> serde_json::Value {
    match mark {
        Mark::Set {
            reason,
            message,
            with_reason,
        } => {
            let mut status = serde_json::json!({"conditions": [{
                "type": POD_CONDITION_NODE_SILENT, "status": "True", "reason": reason,
                "message": message, "lastTransitionTime": now.to_string(),
            }]});
            if *with_reason {
                status["reason"] = REASON.into();
                status["message"] = message.clone().into();
            }
            serde_json::json!({ "status": status })
        }
        Mark::Clear { with_reason } => {
            let mut status = serde_json::json!({"conditions": [{
                "type": POD_CONDITION_NODE_SILENT, "status": "False", "reason": "NodeRenewed",
                "message": "the node renews its Lease again", "lastTransitionTime": now.to_string(),
            }]});
            if *with_reason {
                status["reason"] = serde_json::Value::Null;
                status["message"] = serde_json::Value::Null;
            }
            serde_json::json!({ "status": status })
        }
    }
}

/// How `node` looks to this replica at `now`, with the words a pod's condition carries (`None`:
/// never observed).
fn node_health(
    ctx: &Ctx,
    node: &str,
    now: palisade_decide::clock::Clocks,
) -> Option<(Health, String)> {
    let detection = crate::reconcile::policy_for(ctx, node)
        .map(|p| p.detection)
        .unwrap_or_default();
    let last = ctx.memory.lock().detector.last_change(node)?;
    let h = classify(last, now.mono, Thresholds::from(&detection));
    let message = format!(
        "node {node} has been silent for {}s as the controller sees it ({h:?}): this pod may still run, unreachable",
        now.mono.since(last).as_secs()
    );
    Some((h, message))
}

/// Marks and unmarks pods every tick while this replica leads.
///
/// A node's health is worked out once per tick, and only for nodes that have an unfinished
/// pod: the work follows the pods, not the size of the cluster.
pub async fn run(ctx: Arc<Ctx>) {
    let mut interval = tokio::time::interval(ctx.settings.tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if ctx.leader.token().is_none() {
            continue;
        }
        let now = ctx.now();
        let mut health: HashMap<String, Option<(Health, String)>> = HashMap::new();
        for pod in ctx.cache.pods.state() {
            if palisade_decide::convert::pod_is_terminal(&pod) {
                continue;
            }
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
                continue;
            };
            let known = health
                .entry(node.to_string())
                .or_insert_with(|| node_health(&ctx, node, now));
            let Some((h, message)) = known else {
                continue;
            };
            let Some(mark) = plan(&pod, *h, message) else {
                continue;
            };
            let api: Api<Pod> =
                Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
            if let Err(e) = api
                .patch_status(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Strategic(patch_body(&mark, now.wall)),
                )
                .await
            {
                tracing::debug!(pod = %pod.name_any(), error = %e, "could not mark the pod of a silent node");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(reason: Option<&str>, silent: Option<&str>) -> Pod {
        let mut status = serde_json::json!({"phase": "Running"});
        if let Some(r) = reason {
            status["reason"] = r.into();
        }
        if let Some(s) = silent {
            status["conditions"] =
                serde_json::json!([{"type": POD_CONDITION_NODE_SILENT, "status": s}]);
        }
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status}))
            .unwrap()
    }

    #[test]
    fn marks_only_on_change_and_never_takes_someone_elses_reason() {
        assert_eq!(plan(&pod(None, None), Health::Healthy, "m"), None);
        assert_eq!(
            plan(&pod(None, None), Health::Suspect, "m"),
            Some(Mark::Set {
                reason: "NodeSuspect",
                message: "m".into(),
                with_reason: true
            })
        );
        assert_eq!(
            plan(&pod(Some("Evicted"), None), Health::Unhealthy, "m"),
            Some(Mark::Set {
                reason: "NodeUnhealthy",
                message: "m".into(),
                with_reason: false
            })
        );
        assert_eq!(
            plan(&pod(Some(REASON), Some("True")), Health::Unhealthy, "m"),
            None
        );
        assert_eq!(
            plan(&pod(Some(REASON), Some("True")), Health::Healthy, "m"),
            Some(Mark::Clear { with_reason: true })
        );
        assert_eq!(
            plan(&pod(Some("Evicted"), Some("True")), Health::Healthy, "m"),
            Some(Mark::Clear { with_reason: false })
        );
        assert_eq!(plan(&pod(None, Some("False")), Health::Healthy, "m"), None);
        let body = patch_body(&Mark::Clear { with_reason: true }, Timestamp::UNIX_EPOCH);
        assert!(body["status"]["reason"].is_null());
    }
}
