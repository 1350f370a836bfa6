//! Continuous readiness: could Palisade fence each node *now*? The leader reads every accepted
//! FenceTarget's devices periodically (status only, never an action; at most
//! [`CONCURRENCY`] at once; through the firmware-bridge for `bridge://`), writes the result to
//! the target's `status.readiness` when it changes, sends an Event when a target becomes ready
//! or not, and exports `palisade_fence_target_ready{node,level}`,
//! `palisade_nodes_without_working_fence` and the check latency.
//!
//! Guarantees: a check never changes a device's state ([`crate::devices::probe`]); readiness
//! never gates a fence (a node whose levels all look unready is still tried: the device may
//! have recovered), it only informs the operator and the fence's Events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use palisade_model::acceptance::{DeviceReadiness, LevelReadiness, Readiness};
use palisade_model::target::redact_url;
use palisade_model::FenceTarget;

use crate::events::{Kind, Recorder};
use crate::Ctx;

/// Devices checked at once.
pub const CONCURRENCY: usize = 4;

/// Checks every target every `every`, while this replica leads.
pub async fn run(ctx: Arc<Ctx>, every: Duration) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if ctx.leader.token().is_none() {
            continue;
        }
        // At most CONCURRENCY targets in flight, each a future of this task, each probing its
        // devices one after another: so at most CONCURRENCY probes at once. (A task per target,
        // all spawned at once and queued on permits, held ~10 MiB at 10,000 nodes.)
        let targets = ctx.cache.targets.state();
        let mut checks =
            futures::stream::iter(targets.into_iter().filter(|t| t.spec.validate().is_ok()))
                .map(|t| {
                    let ctx = &ctx;
                    async move {
                        let r = check(ctx, &t).await;
                        (t, r)
                    }
                })
                .buffer_unordered(CONCURRENCY);
        let mut ready_by_node: BTreeMap<String, bool> = BTreeMap::new();
        while let Some((t, r)) = checks.next().await {
            ready_by_node.insert(t.name_any(), r.ready);
            publish(&ctx, &t, r).await;
        }
        ctx.metrics
            .set_without_working_fence(without_working_fence(&ctx, &ready_by_node));
    }
}

async fn check(ctx: &Ctx, t: &FenceTarget) -> Readiness {
    let node = t.name_any();
    let previous = t.status.as_ref().and_then(|s| s.readiness.clone());
    let now = Time(Timestamp::now());
    let mut levels = Vec::new();
    for (i, l) in t.spec.levels.iter().enumerate() {
        let name = if l.name.is_empty() {
            format!("level-{i}")
        } else {
            l.name.clone()
        };
        let mut devices = Vec::new();
        for (j, d) in l.devices.iter().enumerate() {
            let started = Instant::now();
            let answer = crate::devices::probe(ctx, &node, d).await;
            ctx.metrics.check_latency(started.elapsed().as_secs_f64());
            let (ready, reported, last_error) = match answer {
                Ok(r) => (true, r, String::new()),
                Err(e) => (false, String::new(), e),
            };
            let before = previous
                .as_ref()
                .and_then(|p| p.levels.get(i))
                .and_then(|l| l.devices.get(j));
            let since = match before {
                Some(b) if b.ready == ready => b.since.clone(),
                _ => Some(now.clone()),
            };
            devices.push(DeviceReadiness {
                url: redact_url(&d.url),
                ready,
                reported,
                last_error,
                since,
            });
        }
        let ready = devices.iter().all(|d| d.ready);
        ctx.metrics.set_target_ready(&node, &name, ready);
        levels.push(LevelReadiness {
            name,
            ready,
            devices,
        });
    }
    let ready = levels.iter().any(|l| l.ready);
    let since = match &previous {
        Some(p) if p.ready == ready => p.since.clone(),
        _ => Some(now),
    };
    Readiness {
        ready,
        since,
        levels,
    }
}

async fn publish(ctx: &Ctx, t: &FenceTarget, r: Readiness) {
    let previous = t.status.as_ref().and_then(|s| s.readiness.as_ref());
    if previous == Some(&r) {
        return;
    }
    let name = t.name_any();
    let api: Api<FenceTarget> = Api::all(ctx.client.clone());
    let body = serde_json::json!({"status": {"readiness": r}});
    if let Err(e) = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        tracing::warn!(target = %name, error = %e, "could not write the fence readiness");
        return;
    }
    if previous.map(|p| p.ready) != Some(r.ready) {
        let (kind, reason, message) = if r.ready {
            (
                Kind::Normal,
                "FenceReady",
                format!("node {name} can be fenced: {}", summary(&r)),
            )
        } else {
            (
                Kind::Warning,
                "FenceNotReady",
                format!("node {name} has no working fence level: {}", summary(&r)),
            )
        };
        tracing::info!(target = %name, ready = r.ready, %message, "fence readiness changed");
        ctx.events
            .publish(Recorder::reference(t), kind, reason, &message)
            .await;
    }
}

/// One line: each level, ready or why not.
pub fn summary(r: &Readiness) -> String {
    r.levels
        .iter()
        .map(|l| {
            if l.ready {
                format!("{} ready", l.name)
            } else {
                let why: Vec<String> = l
                    .devices
                    .iter()
                    .filter(|d| !d.ready)
                    .map(|d| format!("{}: {}", d.url, d.last_error))
                    .collect();
                format!("{} NOT ready ({})", l.name, why.join("; "))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Nodes covered by exactly one policy that could not be fenced now: their FenceTarget has no
/// ready level, or they have none and their self-fence earns no trust.
fn without_working_fence(ctx: &Ctx, ready_by_node: &BTreeMap<String, bool>) -> u64 {
    let mut count = 0;
    for n in ctx.cache.nodes.state() {
        let name = n.name_any();
        let Some(policy) = crate::reconcile::policy_for(ctx, &name) else {
            continue;
        };
        let working = match ready_by_node.get(&name) {
            Some(ready) => *ready,
            None => {
                let ad = ctx.memory.lock().advertised_by(&name);
                let margin =
                    Duration::from_secs(policy.trust_self_fence.margin_seconds.max(0) as u64);
                policy.trust_self_fence.enabled
                    && ad
                        .trust_wait(margin, policy.trust_self_fence.virtual_machines)
                        .is_some()
            }
        };
        if !working {
            count += 1;
        }
    }
    count
}
