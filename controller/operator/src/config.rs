//! Reports, as soon as this replica leads and then at most every [`REPORT_EVERY`], whether
//! each `FencingPolicy` and `FenceTarget` is accepted: their status (`Accepted` with every
//! problem, the policy's covered nodes and overlaps), an Event whenever acceptance changes,
//! and the `palisade_config_rejected` gauge. It runs as a task of its own ([`run`]), and
//! decisions never wait for it: `decide` applies the same acceptance rules to the objects it
//! reads, every tick. (A round writes one status and sends one Event per changed object, in
//! sequence: inside the decision tick, a round after 10,000 FenceTargets were created at once
//! ran for minutes, and no silent node was decided meanwhile. Every tick, the report was
//! 17 % of the controller's samples at 2,000 nodes: each round reads every object and every
//! Node's labels.)
//!
//! Guarantees: the verdicts come from [`palisade_decide::acceptance`], the same rules a silent
//! node's decision applies; a status is written only when it differs from the one stored
//! (nothing is rewritten on a quiet cluster); credentials found in a device URL are never
//! written, logged or sent in an Event (the messages carry the redacted URL only).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use palisade_decide::acceptance::{self, NodeLabels};
use palisade_decide::snapshot::PolicySnapshot;
use palisade_model::acceptance::{ConfigStatus, Verdict};
use palisade_model::{FenceTarget, FencingPolicy};

use crate::events::{Kind, Recorder};
use crate::Ctx;

/// The longest a change of acceptance waits to be reported.
pub const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What was last announced per object (`kind/name` → `status/reason`), so an Event is sent
/// once per change of acceptance, also when the status write itself failed.
pub type Announced = HashMap<String, String>;

/// Reports forever, beside the decision tick: a round as soon as this replica leads, then at
/// most every [`REPORT_EVERY`], checked every `ctx.settings.tick`.
///
/// Guarantees: no round starts while this replica does not lead, and two rounds never
/// overlap; what was announced is forgotten when it stops leading, so a later term announces
/// only real changes. The decision tick never waits for a round.
pub async fn run(ctx: Arc<Ctx>) {
    let mut interval = tokio::time::interval(ctx.settings.tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut announced = Announced::new();
    // When the last round ended (`None`: none since this replica led).
    let mut reported: Option<std::time::Instant> = None;
    loop {
        interval.tick().await;
        if ctx.leader.token().is_none() {
            announced.clear();
            reported = None;
            continue;
        }
        if reported.is_none_or(|at| at.elapsed() >= REPORT_EVERY) {
            report(&ctx, &mut announced).await;
            reported = Some(std::time::Instant::now());
        }
    }
}

/// One report: computes every verdict, writes changed statuses, announces changes.
pub async fn report(ctx: &Ctx, announced: &mut Announced) {
    let nodes: Vec<NodeLabels> = ctx
        .cache
        .nodes
        .state()
        .iter()
        .map(|n| NodeLabels {
            name: n.name_any(),
            labels: n.labels().clone(),
        })
        .collect();
    let policies = ctx.cache.policies.state();
    let snaps: Vec<PolicySnapshot> = policies
        .iter()
        .map(|p| PolicySnapshot {
            name: p.name_any(),
            spec: p.spec.clone(),
            guard_held_at: None,
        })
        .collect();
    let verdicts = acceptance::policies(&snaps, &nodes);
    let mut rejected: BTreeMap<String, u64> = BTreeMap::new();
    // Every configuration object that still exists, by key: a set, because every object is
    // looked up in it once per round (a list made the round quadratic in the FenceTargets).
    let mut live = std::collections::HashSet::new();
    for p in &policies {
        let Some(v) = verdicts.get(&p.name_any()) else {
            continue;
        };
        live.insert(key::<FencingPolicy>(p.as_ref()));
        apply::<FencingPolicy>(ctx, p.as_ref(), v, announced, &mut rejected).await;
    }
    for t in ctx.cache.targets.state() {
        let v = acceptance::target(&t.spec);
        live.insert(key::<FenceTarget>(t.as_ref()));
        apply::<FenceTarget>(ctx, t.as_ref(), &v, announced, &mut rejected).await;
    }
    announced.retain(|k, _| live.contains(k));
    ctx.metrics.set_rejected(rejected);
}

fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}",
        K::kind(&()),
        obj.meta().name.clone().unwrap_or_default()
    )
}

/// The configuration kinds, with their status.
trait Configured:
    Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
    fn config_status(&self) -> Option<&ConfigStatus>;
}

impl Configured for FencingPolicy {
    fn config_status(&self) -> Option<&ConfigStatus> {
        self.status.as_ref()
    }
}

impl Configured for FenceTarget {
    fn config_status(&self) -> Option<&ConfigStatus> {
        self.status.as_ref()
    }
}

async fn apply<K: Configured>(
    ctx: &Ctx,
    obj: &K,
    verdict: &Verdict,
    announced: &mut Announced,
    rejected: &mut BTreeMap<String, u64>,
) {
    let kind = K::kind(&()).into_owned();
    let name = obj.meta().name.clone().unwrap_or_default();
    let previous = obj.config_status();
    let status = verdict.to_status(
        obj.meta().generation,
        previous,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    if !verdict.accepted() {
        *rejected
            .entry(format!("{kind}/{}", verdict.reason.as_str()))
            .or_default() += 1;
    }
    if previous != Some(&status) {
        let api: Api<K> = Api::all(ctx.client.clone());
        let patch = serde_json::json!({ "status": merge_body(&status) });
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(%kind, %name, error = %e, "could not write the acceptance status");
        }
    }
    let (st, reason) = status.accepted().unwrap_or(("Unknown", ""));
    let now = format!("{st}/{reason}");
    let k = key(obj);
    if announced.get(&k) != Some(&now) {
        let before = previous.and_then(ConfigStatus::accepted);
        // A replica that takes over announces only real changes, not what it finds settled.
        if announced.contains_key(&k) || before != Some((st, reason)) {
            let (level, event_reason) = if verdict.accepted() {
                (Kind::Normal, "Accepted".to_string())
            } else {
                (
                    Kind::Warning,
                    format!("Rejected{}", verdict.reason.as_str()),
                )
            };
            let message = match verdict.problems.as_slice() {
                [] | [_] => verdict.message.clone(),
                more => format!(
                    "{} (and {} more problem(s) in status.problems)",
                    verdict.message,
                    more.len() - 1
                ),
            };
            tracing::info!(%kind, %name, accepted = verdict.accepted(), reason = verdict.reason.as_str(), %message, "configuration acceptance");
            ctx.events
                .publish(Recorder::reference(obj), level, &event_reason, &message)
                .await;
        }
        announced.insert(k, now);
    }
}

/// The status as a JSON merge patch body: fields that are empty now are sent as `null`, so a
/// problem that was fixed disappears from the stored status.
fn merge_body(status: &ConfigStatus) -> serde_json::Value {
    let mut v = serde_json::to_value(status).unwrap_or_default();
    if let Some(map) = v.as_object_mut() {
        // Readiness is written by its own loop; a stale copy from the cache must not clobber it.
        map.remove("readiness");
        for field in [
            "observedGeneration",
            "problems",
            "coveredNodeCount",
            "coveredNodes",
            "overlaps",
        ] {
            map.entry(field).or_insert(serde_json::Value::Null);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_body_clears_fields_that_became_empty() {
        let body = merge_body(&ConfigStatus::default());
        assert_eq!(body["problems"], serde_json::Value::Null);
        assert_eq!(body["overlaps"], serde_json::Value::Null);
        assert!(body.get("conditions").is_some());
    }
}
