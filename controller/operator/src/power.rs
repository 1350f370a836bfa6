//! The power watch: the leader reads the power state of every fenceable machine through its own
//! fence devices, continuously, so that a machine its BMC reports off is fenced on that evidence
//! instead of after the silence threshold ([`palisade_decide::power`] has the rule).
//!
//! Every `--power-watch-interval` each FenceTarget's direct power devices are read, for the
//! nodes whose policy's power evidence can fence sooner than their silence (a read
//! only: [`crate::devices::watch_read`]). A node reads off when every power device of one of its
//! levels reads off, on when any reads on, and unknown otherwise. A read that has not answered
//! by the next round is not repeated (a dark BMC never queues reads); its answer, whenever it
//! comes, is recorded with the instant it was sent.
//!
//! Guarantees: no device is ever commanded here; nodes with a fence under way (past Pending,
//! not finished) are not read and their runs are forgotten (the fence reads and commands the
//! device itself, and a later decision needs a new run); a replica that does not lead reads nothing and remembers nothing,
//! so a new leader starts every run afresh. A level with a BMC that is not pinned to the
//! machine's identity is not read at all. Credentials are read from their Secrets at most
//! every [`SECRET_TTL`] per Secret (a failed read too), and never logged.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use palisade_decide::power::PowerReading;
use palisade_model::target::{DeviceKind, FenceTargetSpec};
use parking_lot::Mutex;

use crate::Ctx;

/// Devices read at once.
pub const CONCURRENCY: usize = 16;

/// How long a credential Secret read for the watch is reused.
pub const SECRET_TTL: Duration = Duration::from_secs(30);

/// The longest a watch read may take (a device's own `timeoutSeconds`, if shorter, bounds it).
pub const READ_BUDGET: Duration = Duration::from_secs(5);

/// The words of each node's latest power read (for the fence's Event).
pub type Said = Mutex<HashMap<String, String>>;

/// Each credential Secret's last read (or why it failed), and when.
type Secrets =
    Mutex<HashMap<(String, String), (Instant, Result<BTreeMap<String, String>, String>)>>;

/// Watches every `every` while this replica leads.
pub async fn run(ctx: Arc<Ctx>, every: Duration) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let limit = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let reading: Arc<Mutex<HashSet<String>>> = Arc::default();
    let secrets: Arc<Secrets> = Arc::default();
    loop {
        interval.tick().await;
        if ctx.leader.token().is_none() {
            *ctx.power.lock() = palisade_decide::power::PowerWatch::new();
            continue;
        }
        let busy: HashSet<String> = ctx
            .cache
            .fences
            .state()
            .iter()
            .filter(|f| under_way(f))
            .map(|f| f.spec.node_name.clone())
            .collect();
        let targets = ctx.cache.targets.state();
        let watched: HashSet<String> = targets
            .iter()
            .filter(|t| t.spec.validate().is_ok())
            .map(|t| (t.name_any(), t))
            .filter(|(n, t)| {
                !busy.contains(n) && evidence_counts(&ctx, n) && readable(&ctx, n, &t.spec)
            })
            .map(|(n, _)| n)
            .collect();
        ctx.power.lock().retain(|n| watched.contains(n));
        ctx.power_said.lock().retain(|n, _| watched.contains(n));
        for t in targets {
            let node = t.name_any();
            if !watched.contains(&node) || !reading.lock().insert(node.clone()) {
                continue;
            }
            let (ctx, limit, reading, secrets) =
                (ctx.clone(), limit.clone(), reading.clone(), secrets.clone());
            tokio::spawn(async move {
                let sent = ctx.now().mono;
                let (r, words) = read_node(&ctx, &node, &t.spec, &limit, &secrets).await;
                let answered = ctx.now().mono;
                ctx.metrics.power_read(label(r));
                tracing::debug!(%node, reading = label(r), %words, "power watch read");
                // A fence that started meanwhile owns the node now.
                let started = ctx
                    .cache
                    .fences
                    .state()
                    .iter()
                    .any(|f| f.spec.node_name == node && under_way(f));
                if ctx.leader.token().is_some() && !started {
                    let mut watch = ctx.power.lock();
                    let before = watch.off_run(&node).is_some();
                    watch.observe(&node, r, sent, answered);
                    // Released before the memory is locked: the detector's tick locks the
                    // memory first and the power watch inside it, never the other way round.
                    drop(watch);
                    if r == PowerReading::Off && !before {
                        let memory = ctx.memory.lock();
                        tracing::info!(
                            %node,
                            %words,
                            silent_for = ?memory.detector.last_change(&node).map(|c| sent.since(c)),
                            renewal_gap = ?memory.detector.renewal_gap(&node),
                            "power watch: the machine reads off"
                        );
                    }
                    ctx.power_said.lock().insert(node.clone(), words);
                }
                reading.lock().remove(&node);
            });
        }
    }
}

/// A fence past Pending and not finished: it reads and commands the node's devices itself.
/// (A Pending fence still needs the evidence that its decision rests on.)
fn under_way(f: &palisade_model::NodeFence) -> bool {
    let phase = crate::detect::phase_of(f);
    phase != palisade_model::nodefence::Phase::Pending && !phase.is_terminal()
}

/// Whether power evidence can change anything for `node`: exactly one policy covers it, and
/// its `powerOffAfterSeconds` is on and below its `unhealthyAfterSeconds` (otherwise the BMC
/// is not read at all).
fn evidence_counts(ctx: &Ctx, node: &str) -> bool {
    crate::reconcile::policy_for(ctx, node).is_some_and(|p| {
        let d = &p.detection;
        d.power_off_after_seconds > 0 && d.power_off_after_seconds < d.unhealthy_after_seconds
    })
}

/// A target with a level whose power devices are all direct BMCs (the only ones that may give
/// evidence) pinned to `node`'s identity: only such a level is read. Worked out before a read
/// is started, so a target with nothing to read costs no task and no memory (at 10,000 nodes
/// the reads that could only say "not pinned" were a fifth of the controller's work).
fn readable(ctx: &Ctx, node: &str, spec: &FenceTargetSpec) -> bool {
    spec.levels.iter().any(|l| {
        evidence_level(l).is_some_and(|devices| {
            devices
                .iter()
                .all(|d| crate::devices::identity_pinned(ctx, node, &d.url))
        })
    })
}

/// The power devices of a level that can give evidence, or `None` when some power device of
/// the level cannot (a PDU outlet or the bridge: the level's off proves nothing about identity).
fn evidence_level(
    l: &palisade_model::target::FenceLevel,
) -> Option<Vec<&palisade_model::target::FenceDevice>> {
    let power: Vec<_> = l
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Power)
        .collect();
    let direct = power.iter().all(|d| d.is_direct_bmc());
    (!power.is_empty() && direct).then_some(power)
}

fn label(r: PowerReading) -> &'static str {
    match r {
        PowerReading::Off => "off",
        PowerReading::On => "on",
        PowerReading::Unknown => "unknown",
    }
}

/// Off when every power device of some level reads off; on when any device reads on.
async fn read_node(
    ctx: &Ctx,
    node: &str,
    spec: &FenceTargetSpec,
    limit: &tokio::sync::Semaphore,
    secrets: &Secrets,
) -> (PowerReading, String) {
    let mut said = Vec::new();
    let mut off_level = false;
    for l in &spec.levels {
        let Some(devices) = evidence_level(l) else {
            continue;
        };
        // A level with a device that cannot prove whose power it reads gives no evidence:
        // nothing of it is read (no Secret, no BMC session).
        if !devices
            .iter()
            .all(|d| crate::devices::identity_pinned(ctx, node, &d.url))
        {
            said.push(format!(
                "level {}: a BMC not pinned to the machine's identity (no Node system UUID, no pin in the URL): never power evidence",
                l.name
            ));
            continue;
        }
        let mut all_off = true;
        for d in devices {
            let secret = match secret_for(ctx, d, secrets).await {
                Ok(s) => s,
                Err(e) => {
                    said.push(e);
                    all_off = false;
                    continue;
                }
            };
            let budget = Duration::from_secs(u64::try_from(d.timeout_seconds).unwrap_or(5))
                .clamp(Duration::from_secs(1), READ_BUDGET);
            let (r, words) = {
                let _permit = limit.acquire().await;
                crate::devices::watch_read(ctx, node, d, &secret, budget).await
            };
            said.push(words);
            match r {
                PowerReading::On => return (PowerReading::On, said.join("; ")),
                PowerReading::Off => {}
                PowerReading::Unknown => all_off = false,
            }
        }
        off_level |= all_off;
    }
    let r = if off_level {
        PowerReading::Off
    } else {
        PowerReading::Unknown
    };
    (r, said.join("; "))
}

async fn secret_for(
    ctx: &Ctx,
    d: &palisade_model::target::FenceDevice,
    secrets: &Secrets,
) -> Result<BTreeMap<String, String>, String> {
    let Some(r) = &d.credentials_secret_ref else {
        return Ok(BTreeMap::new());
    };
    let key = (r.namespace.clone(), r.name.clone());
    if let Some((at, s)) = secrets.lock().get(&key) {
        if at.elapsed() < SECRET_TTL {
            return s.clone();
        }
    }
    // A failed read is kept as long as a good one: a missing Secret costs one read per
    // SECRET_TTL, not one per node and round.
    let s = crate::devices::read_secret(ctx, r)
        .await
        .map_err(|e| e.to_string());
    secrets.lock().insert(key, (Instant::now(), s.clone()));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_model::target::{FenceDevice, FenceLevel};

    fn device(url: &str, kind: DeviceKind) -> FenceDevice {
        serde_json::from_value(serde_json::json!({"url": url, "kind": kind})).unwrap()
    }

    fn level(devices: Vec<FenceDevice>) -> FenceLevel {
        serde_json::from_value(serde_json::json!({"devices": devices})).unwrap()
    }

    #[test]
    fn only_levels_of_direct_bmcs_can_give_evidence() {
        let bmc = device("ipmi://admin@10.0.0.1", DeviceKind::Power);
        let redfish = device(
            "redfish+https://10.0.0.2/redfish/v1/Systems/1",
            DeviceKind::Power,
        );
        let pdu = device("snmp+pdu://10.0.0.3/4", DeviceKind::Power);
        let bridge = device("bridge://10.0.0.4:44881/m0", DeviceKind::Power);
        let storage = device("storagefw+https://10.0.0.5", DeviceKind::Storage);
        assert!(evidence_level(&level(vec![bmc.clone(), storage.clone()])).is_some());
        assert_eq!(
            evidence_level(&level(vec![bmc.clone(), redfish])).map(|v| v.len()),
            Some(2)
        );
        assert!(evidence_level(&level(vec![bmc.clone(), pdu])).is_none());
        assert!(evidence_level(&level(vec![bridge])).is_none());
        assert!(evidence_level(&level(vec![storage])).is_none());
    }
}
