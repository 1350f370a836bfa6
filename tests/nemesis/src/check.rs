//! The checks that judge a history. Pure: they read [`Record`]s and return [`Violation`]s, so
//! each is unit-tested here, including on histories with planted mistakes.
//!
//! - **release-without-verified-fence**: a NodeFence status that lists a released pod must, in
//!   the same status, record a verified level with evidence for it, observed no later than
//!   the first release;
//! - **release-outside-fence**: a released pod must have been bound to the fenced node;
//! - **replacement-without-fence**: a pod replaced by a new incarnation on another node was
//!   seen only after a NodeFence of the old node had recorded `Fenced` (this also covers
//!   releases a status does not list, for example by a leader killed before it recorded them);
//! - **illegal-transition**: phases follow the state machine (`Phase::can_transition_to`);
//! - **at-most-one** and **acknowledged-write-lost**: the storage checker's verdict over each
//!   writer's volume and acknowledgement logs (recorded as [`Record::Writer`]);
//! - **at-most-one-process**: two incarnations of a volume-less identity alive at once
//!   ([`Record::TwoIncarnations`], proven by the observer);
//! - **token-regressed**: a bridge action accepted with a lower fencing token than one it
//!   accepted earlier for the same target;
//! - **power-off-not-true**: a fence that claims power-off evidence while the lab's ground
//!   truth says the machine never went off: at the fence's last observation the machine still
//!   runs the boot it ran (sampled before a read that claimed no power off yet) before the
//!   fence; any power off and on changes the boot ID;
//! - **fence-without-cause**: every NodeFence follows, within a time window, a fault that
//!   silenced its node or a reboot the lab saw;
//! - **fence-while-heard**: no NodeFence is created while the API server was hearing its node:
//!   a renewal of the node's Lease that surely landed within the policy's Unhealthy threshold
//!   before the creation (and not within [`HEARD_MARGIN_US`] of it) is a violation, unless the
//!   lab saw the machine go down since. Ground truth on the host's clock only (the observer's
//!   [`Record::Renewal`]s and the API server's `creationTimestamp`), so it needs no fault to
//!   blame and no clock fault can fool it.
//!
//! Two checks compare times the controller wrote (its wall clock) with each other or with
//! the nemesis' clock. When the campaign steps the controllers' wall clock
//! ([`Fault::ControllerClockStep`]), those times may be off by any offset the campaign set
//! ([`ClockSkew`]): the checks then find a violation only where every such offset gives one.
//! They are that much more lenient; the ground-truth checks (the storage checker, process
//! presence, the power truth) do not read the controller's clock and are unchanged.

use std::collections::{BTreeMap, BTreeSet};

use palisade_model::nodefence::Phase;

use crate::history::{FenceSnapshot, Record};
use crate::schedule::Fault;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which check found it.
    pub check: &'static str,
    /// What it found, naming the objects involved.
    pub detail: String,
}

/// The offsets the campaign gave the controllers' wall clocks: each controller timestamp is
/// the true time plus an offset in `min_us..=max_us` (both 0 when nothing was stepped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockSkew {
    /// The largest step back (≤ 0), µs.
    pub min_us: i64,
    /// The largest step forward (≥ 0), µs.
    pub max_us: i64,
}

impl ClockSkew {
    /// The skew the given faults can cause.
    pub fn of<'a>(faults: impl IntoIterator<Item = &'a Fault>) -> ClockSkew {
        faults
            .into_iter()
            .flat_map(Fault::clock_steps_ms)
            .fold(ClockSkew::default(), |s, ms| ClockSkew {
                min_us: s.min_us.min(ms * 1_000),
                max_us: s.max_us.max(ms * 1_000),
            })
    }

    /// The skew of the faults a history records.
    pub fn of_history(history: &[Record]) -> ClockSkew {
        ClockSkew::of(history.iter().filter_map(|r| match r {
            Record::Fault { fault, .. } => Some(fault),
            _ => None,
        }))
    }

    /// How far apart two controller timestamps can be from the true order of their events
    /// (they may come from different replicas, or from one before and after a step).
    pub fn spread_us(&self) -> i64 {
        self.max_us - self.min_us
    }
}

/// Every check over a history.
pub fn check_all(history: &[Record]) -> Vec<Violation> {
    let mut out = check_so_far(history);
    out.extend(check_power_truth(history));
    out
}

/// Every check that a history still being written can be judged by (the observer runs it
/// during the campaign, so a finding that spans several statuses, such as a replacement
/// before its old node was fenced, a bridge token going down or a fence without a cause,
/// shows when it happens). Only the power-off truth waits for the end: it judges a fence's
/// last observation, which a running campaign has not made yet.
///
/// Assumptions: for a replacement, the fence that allowed it is already in the history; a
/// status read just before the release and a pod list just after it can put the replacement
/// first, so the observer judges a pod only once it has been seen for a few seconds. With
/// that, a violation reported on a prefix is reported on the complete history too.
pub fn check_so_far(history: &[Record]) -> Vec<Violation> {
    let mut out = Vec::new();
    let pods = pod_nodes(history);
    let skew = ClockSkew::of_history(history);
    let mut seen = BTreeSet::new();
    for r in history {
        let snap = match r {
            Record::Phase { snapshot, .. }
            | Record::Release { snapshot, .. }
            | Record::FenceFinal { snapshot, .. } => snapshot,
            Record::Writer {
                writer,
                split_brain,
                lost,
                report,
                ..
            } => {
                if *split_brain > 0 {
                    out.push(Violation {
                        check: "at-most-one",
                        detail: format!(
                            "writer {writer}: {split_brain} split-brain write(s)\n{report}"
                        ),
                    });
                }
                if *lost > 0 {
                    out.push(Violation {
                        check: "acknowledged-write-lost",
                        detail: format!(
                            "writer {writer}: {lost} acknowledged write(s) lost\n{report}"
                        ),
                    });
                }
                continue;
            }
            Record::TwoIncarnations {
                identity,
                processes,
                ..
            } => {
                let detail =
                    format!("identity {identity}: two incarnations alive at once: {processes:?}");
                if seen.insert(("at-most-one-process", detail.clone())) {
                    out.push(Violation {
                        check: "at-most-one-process",
                        detail,
                    });
                }
                continue;
            }
            _ => continue,
        };
        for v in check_snapshot(snap, &pods, skew) {
            // The same status is observed many times: report each finding once.
            if seen.insert((v.check, v.detail.clone())) {
                out.push(v);
            }
        }
    }
    out.extend(check_tokens(history));
    out.extend(check_replacements(history, skew));
    out.extend(check_causes(history, skew));
    out.extend(check_heard(
        history,
        crate::world::UNHEALTHY_AFTER_S * 1_000_000,
    ));
    out
}

/// How long after a fault's heal a fence it caused may first be observed (detection, a
/// leader change, a slow status write, the observer's poll).
const CAUSE_WINDOW_S: f64 = 120.0;

/// How long after a fence was last observed a reboot of its machine may still be its own
/// (the recovery's power on, seen at the next poll).
const REBOOT_SLACK_S: f64 = 5.0;

/// True when `fault` may silence its machine's heartbeat long enough to justify a fence. A
/// peer cut, a frozen BMC alone and the control plane's own outages do not: a fence after
/// them means the controller fenced a node that only looked silent because the controller's
/// side was blind (the quorum guard's case) or for a reason that is not the node's. Nor does a
/// stalled watch: the node renews throughout, only the controller's view of it lags.
fn may_silence(fault: &Fault) -> bool {
    !matches!(
        fault,
        Fault::PeerCut { .. }
            | Fault::BmcFreeze { .. }
            | Fault::ApiRestartDuringPeerCut { .. }
            | Fault::WatchStall { .. }
    ) && fault.target().is_some()
}

/// Never fence on doubt: every NodeFence has a cause in the history, a fault that silenced
/// its node ([`may_silence`]) and was applied before the fence was first seen and healed at
/// most [`CAUSE_WINDOW_S`] before, or a reboot or power loss of the machine that the lab saw
/// ([`Record::Boot`]) at most [`CAUSE_WINDOW_S`] before, outside every fence of that machine
/// (a watchdog that reset it: the node really went silent, whatever made its watchdog fire). A fence after an API server or etcd outage alone (every
/// heartbeat stale at once), after a peer cut, or of a node no fault touched is a violation.
fn check_causes(history: &[Record], skew: ClockSkew) -> Vec<Violation> {
    // Per event and machine (a two-at-once event hits two): (fault, applied at, last heal of
    // the event at).
    let mut events: BTreeMap<(usize, &str), (&Fault, f64, f64)> = BTreeMap::new();
    let mut first_seen: BTreeMap<&str, (&str, f64)> = BTreeMap::new();
    // Per fence UID, the last time it was observed; per machine, when the lab saw it go off or
    // boot anew.
    let mut last_seen: BTreeMap<&str, f64> = BTreeMap::new();
    // Per fence UID, when its controller says it was requested (its wall clock, µs).
    let mut requested: BTreeMap<&str, i64> = BTreeMap::new();
    let mut reboots: Vec<(&str, f64, i64)> = Vec::new();
    for r in history {
        match r {
            Record::Boot {
                t, machine, at_us, ..
            } => reboots.push((machine.as_str(), *t, *at_us)),
            Record::Fault {
                t,
                event,
                fault,
                machine: Some(m),
                ..
            } => {
                events
                    .entry((*event, m.as_str()))
                    .or_insert((fault, *t, f64::INFINITY));
            }
            Record::Heal { t, event, .. } => {
                for (_, e) in events
                    .range_mut((*event, "")..)
                    .take_while(|(k, _)| k.0 == *event)
                {
                    e.2 = *t;
                }
            }
            Record::Phase { t, snapshot, .. } => {
                first_seen
                    .entry(snapshot.uid.as_str())
                    .or_insert((snapshot.node.as_str(), *t));
                last_seen.insert(snapshot.uid.as_str(), *t);
                if let Some((_, at, _)) = snapshot.transitions.first() {
                    requested.entry(snapshot.uid.as_str()).or_insert(*at);
                }
            }
            _ => {}
        }
    }
    // A reboot no fence made: not inside any fence of that machine (its power cycle and its
    // recovery's power on), with a little slack for the observer's poll.
    let spans: Vec<(&str, f64, f64)> = first_seen
        .iter()
        .map(|(uid, (node, first))| (*node, *first, last_seen[uid] + REBOOT_SLACK_S))
        .collect();
    let unfenced_reboots: Vec<(&str, f64, i64)> = reboots
        .into_iter()
        .filter(|(m, b, _)| {
            !spans
                .iter()
                .any(|(n, from, to)| n == m && from <= b && b <= to)
        })
        .collect();
    let mut out = Vec::new();
    for (uid, (node, seen)) in first_seen {
        let caused = events.iter().any(|((_, m), (fault, applied, healed))| {
            *m == node && may_silence(fault) && *applied <= seen && seen <= healed + CAUSE_WINDOW_S
        }) || unfenced_reboots.iter().any(|(m, b, b_us)| {
            // Seen before the fence was requested (the observer sees a fence's first status
            // only at its next poll, by which time the fence's own power off may be seen
            // first): the controller's request time, moved back by the most its clock was
            // ahead, and a second for the observer's poll.
            let before_request = requested
                .get(uid)
                .is_some_and(|req| *b_us < req - skew.max_us - 1_000_000);
            *m == node && before_request && *b <= seen && seen <= b + CAUSE_WINDOW_S
        });
        if !caused {
            let near: Vec<String> = events
                .iter()
                .filter(|(_, (_, applied, healed))| {
                    *applied <= seen && seen <= healed + CAUSE_WINDOW_S
                })
                .map(|((i, m), (f, applied, _))| {
                    format!("event {i} {} on {m} at {applied:.1}s", f.class())
                })
                .collect();
            out.push(Violation {
                check: "fence-without-cause",
                detail: format!(
                    "NodeFence uid {uid} for {node}, first seen at {seen:.1}s: no fault silenced {node} before it (faults in the window: {})",
                    if near.is_empty() { "none".to_string() } else { near.join(", ") }
                ),
            });
        }
    }
    out
}

/// How much later than a renewal landed a NodeFence may still be created without the
/// controller having seen it: the watch's delivery to the controller's cache, the detection
/// tick that observes the cache (250 ms in the lab), and the round trips between the tick's
/// decision and the create (`detect::create_fence` lists the NodeFences first, and a round
/// that fences several nodes creates them one after the other). Measured locally these are
/// tens of milliseconds; 1.5 s leaves room for a loaded lab.
pub const HEARD_MARGIN_US: i64 = 1_500_000;

/// A NodeFence's `creationTimestamp` is truncated to the second: it was created within this
/// after it.
const CREATION_TRUNCATED_US: i64 = 1_000_000;

/// Never fence a node the API server was hearing (from ground truth, not from a time window):
/// the controller counts a node's silence from when it observed its last Lease renewal, and an
/// observation is never earlier than the renewal's landing, so a NodeFence created at `C`
/// requires that the controller had seen no renewal that landed after `C − unhealthy_after_us`.
/// A renewal ([`Record::Renewal`]) that surely landed in
/// `[C_hi − unhealthy_after_us, C_lo − HEARD_MARGIN_US]` is a violation, whatever faults were
/// about: `C_lo` is the fence's `creationTimestamp` and `C_hi` the earlier of that plus a
/// second and the observer's first sight of it (`seen_us` of its first [`Record::Phase`]), all
/// on the host's clock. The only excuse is a reboot or power loss of the machine the lab saw
/// ([`Record::Boot`]) after the renewal's earliest landing and no later than `C_hi`: the
/// machine truly went down after it was heard.
///
/// Guarantees: no finding from a slow observer (a renewal is known only to have landed
/// somewhere in its interval, and every bound is taken on the side that excuses the fence) or
/// from a clock fault (only the host's clock is read: the API server's `creationTimestamp` and
/// the observer's; the controller's and the machines' stamps are not).
///
/// Assumptions: the controller sees a renewal, decides and creates its NodeFence within
/// [`HEARD_MARGIN_US`] of the renewal's landing; `unhealthy_after_us` is the campaign policy's
/// threshold and the policy fences on silence alone (its power evidence, 5 s by default, is
/// above the threshold and so off). Fences recorded without a `creationTimestamp` (older
/// histories) are not judged.
fn check_heard(history: &[Record], unhealthy_after_us: i64) -> Vec<Violation> {
    // Per fence UID: its node, creationTimestamp and first sight (µs).
    let mut fences: BTreeMap<&str, (&str, Option<i64>, Option<i64>)> = BTreeMap::new();
    // (node, after_us, seen_us), in the order they were seen.
    let mut renewals: Vec<(&str, i64, i64)> = Vec::new();
    let mut boots: Vec<(&str, i64)> = Vec::new();
    for r in history {
        let (snapshot, seen) = match r {
            Record::Renewal {
                node,
                after_us,
                seen_us,
                ..
            } => {
                renewals.push((node.as_str(), *after_us, *seen_us));
                continue;
            }
            Record::Boot { machine, at_us, .. } => {
                boots.push((machine.as_str(), *at_us));
                continue;
            }
            Record::Phase {
                snapshot, seen_us, ..
            } => (snapshot, *seen_us),
            Record::Release { snapshot, .. } | Record::FenceFinal { snapshot, .. } => {
                (snapshot, None)
            }
            _ => continue,
        };
        let f = fences
            .entry(snapshot.uid.as_str())
            .or_insert((snapshot.node.as_str(), None, None));
        f.1 = f.1.or(snapshot.created_us);
        f.2 = match (f.2, seen) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let mut out = Vec::new();
    for (uid, (node, created, first_seen)) in fences {
        let Some(c_lo) = created else {
            continue;
        };
        let c_hi = first_seen.map_or(c_lo + CREATION_TRUNCATED_US, |s| {
            s.min(c_lo + CREATION_TRUNCATED_US)
        });
        // The machine names its node: a Boot of `node` is this node's machine.
        let went_down = |after: i64| {
            boots
                .iter()
                .any(|(m, at)| *m == node && *at > after && *at <= c_hi)
        };
        let heard = renewals.iter().rev().find(|(n, after, seen)| {
            *n == node
                && *after >= c_hi - unhealthy_after_us
                && *seen <= c_lo - HEARD_MARGIN_US
                && !went_down(*after)
        });
        if let Some((_, after, seen)) = heard {
            let s = |us: i64| format!("{:.3}s", (c_lo - us) as f64 / 1e6);
            out.push(Violation {
                check: "fence-while-heard",
                detail: format!(
                    "NodeFence uid {uid} for {node} was created in [{c_lo}, {c_hi}] µs \
                     (creationTimestamp, first seen {}), but a renewal of its Lease landed in \
                     [{after}, {seen}] µs ({} to {} before the creationTimestamp), within the \
                     Unhealthy threshold of {:.1}s, and the lab saw no reboot of {node} since",
                    first_seen.map_or("never".to_string(), |s| format!("at {s} µs")),
                    s(*after),
                    s(*seen),
                    unhealthy_after_us as f64 / 1e6,
                ),
            });
        }
    }
    out
}

/// Power-off evidence must be true: a machine whose fence claims a power off is never seen,
/// at the fence's last observation, still running the boot it ran before the fence (any power
/// off changes the boot ID). The last observation, not the first after the claim: the lab's
/// samples and the status reads are not atomic, and a sample taken while recovery powers the
/// machine on may still read the old boot ID; a machine that never went off keeps it for good.
fn check_power_truth(history: &[Record]) -> Vec<Violation> {
    // Per NodeFence UID: the boot sampled before a read that showed no power-off claim yet.
    let mut before_claim: BTreeMap<String, String> = BTreeMap::new();
    // Per NodeFence UID: the latest read that claims a power off, with the boot sampled after.
    let mut last_claim: BTreeMap<String, (&FenceSnapshot, Option<&String>, f64)> = BTreeMap::new();
    for r in history {
        let Record::Phase {
            snapshot,
            boot_before,
            boot_after,
            t,
            ..
        } = r
        else {
            continue;
        };
        if snapshot.evidence.iter().any(|e| e.kind == "PowerOff") {
            last_claim.insert(snapshot.uid.clone(), (snapshot, boot_after.as_ref(), *t));
        } else if let Some(b) = boot_before {
            before_claim
                .entry(snapshot.uid.clone())
                .or_insert_with(|| b.clone());
        }
    }
    let mut out = Vec::new();
    for (uid, (snapshot, after, t)) in last_claim {
        let (Some(after), Some(before)) = (after, before_claim.get(&uid)) else {
            continue;
        };
        if after == before {
            let claims: Vec<&str> = snapshot
                .evidence
                .iter()
                .filter(|e| e.kind == "PowerOff")
                .map(|e| e.device.as_str())
                .collect();
            out.push(Violation {
                check: "power-off-not-true",
                detail: format!(
                    "NodeFence {} ({}) claims power-off evidence from {claims:?} but machine {} still runs boot {after} it ran before the fence (last seen t={t:.1}s)",
                    snapshot.fence, snapshot.phase, snapshot.node
                ),
            });
        }
    }
    out
}

/// Every pod replaced on another node was seen only after a fence of its old node was
/// verified (a `Fenced` transition, by the controller's clock, before the nemesis saw the
/// replacement: sound, because the replacement exists only after the old pod was deleted).
fn check_replacements(history: &[Record], skew: ClockSkew) -> Vec<Violation> {
    // Per node: the times its fences recorded Fenced.
    let mut fenced: BTreeMap<&str, BTreeSet<i64>> = BTreeMap::new();
    for r in history {
        if let Record::Phase { snapshot, .. }
        | Record::Release { snapshot, .. }
        | Record::FenceFinal { snapshot, .. } = r
        {
            for (phase, at, _) in &snapshot.transitions {
                if phase == "Fenced" {
                    fenced
                        .entry(snapshot.node.as_str())
                        .or_default()
                        .insert(*at);
                }
            }
        }
    }
    let mut last: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    let mut out = Vec::new();
    for r in history {
        let Record::Pod {
            name,
            uid,
            node,
            seen_us,
            ..
        } = r
        else {
            continue;
        };
        if let Some((old_uid, old_node)) = last.insert(name, (uid, node)) {
            let verified_before = fenced
                .get(old_node)
                .and_then(|times| times.iter().next())
                // The controller's clock may have been ahead by up to `max_us`.
                .is_some_and(|first| first - skew.max_us <= *seen_us);
            if old_node != node && !verified_before {
                out.push(Violation {
                    check: "replacement-without-fence",
                    detail: format!(
                        "{name} (uid {old_uid} on {old_node}) was replaced by uid {uid} on {node}, seen at {seen_us} µs, with no fence of {old_node} verified before"
                    ),
                });
            }
        }
    }
    out
}

/// The node each writer pod was seen bound to, by UID.
fn pod_nodes(history: &[Record]) -> BTreeMap<String, String> {
    history
        .iter()
        .filter_map(|r| match r {
            Record::Pod { uid, node, .. } => Some((uid.clone(), node.clone())),
            _ => None,
        })
        .collect()
}

/// The checks on one observed NodeFence status.
pub fn check_snapshot(
    s: &FenceSnapshot,
    pod_nodes: &BTreeMap<String, String>,
    skew: ClockSkew,
) -> Vec<Violation> {
    let mut out = Vec::new();
    if let Some(first_release) = s.released.iter().map(|p| p.at_us).min() {
        let verified_at = s
            .evidence
            .iter()
            .filter(|e| s.verified_levels.contains(&e.level))
            .map(|e| e.at_us)
            .min();
        match verified_at {
            None => out.push(Violation {
                check: "release-without-verified-fence",
                detail: format!(
                    "NodeFence {} ({}) lists {} released pod(s) ({}) but no verified level with evidence (verified levels {:?}, evidence {:?})",
                    s.fence,
                    s.node,
                    s.released.len(),
                    names(s),
                    s.verified_levels,
                    s.evidence
                ),
            }),
            Some(at) if at > first_release + skew.spread_us() => out.push(Violation {
                check: "release-without-verified-fence",
                detail: format!(
                    "NodeFence {} ({}): first release at {first_release} µs precedes the first verified evidence at {at} µs ({})",
                    s.fence,
                    s.node,
                    names(s)
                ),
            }),
            Some(_) => {}
        }
    }
    // What the verified levels cover: a power off (or a trusted self-fence) stops every
    // process of the node; a storage block alone stops only I/O to the blocked volumes.
    let stops_processes = s.evidence.iter().any(|e| {
        s.verified_levels.contains(&e.level)
            && matches!(e.kind.as_str(), "PowerOff" | "SelfFenceTimeout")
    });
    for p in &s.released {
        // The writers' pods are each behind an RWO volume; the volume-less identity's pod
        // keeps running unless the node's processes were stopped. Judged by name: a pod may
        // be released before the observer ever lists it.
        let volume_less = p.name.starts_with(&format!("{}-", crate::world::IDENTITY));
        if volume_less && !stops_processes && !s.verified_levels.is_empty() {
            out.push(Violation {
                check: "release-not-covered",
                detail: format!(
                    "NodeFence {} ({}) released {}/{} (uid {}), which mounts no volume, on storage evidence alone ({:?}): its process may still run",
                    s.fence, s.node, p.namespace, p.name, p.uid, s.evidence
                ),
            });
        }
        if let Some(node) = pod_nodes.get(&p.uid) {
            if node != &s.node {
                out.push(Violation {
                    check: "release-outside-fence",
                    detail: format!(
                        "NodeFence {} fences {} but released {}/{} (uid {}), which was bound to {node}",
                        s.fence, s.node, p.namespace, p.name, p.uid
                    ),
                });
            }
        }
    }
    let mut prev: Option<Phase> = None;
    for (name, _, _) in &s.transitions {
        let Ok(phase) = serde_json::from_value::<Phase>(serde_json::Value::String(name.clone()))
        else {
            out.push(Violation {
                check: "illegal-transition",
                detail: format!("NodeFence {}: unknown phase {name}", s.fence),
            });
            continue;
        };
        if let Some(p) = prev {
            if p != phase && !p.can_transition_to(phase) {
                out.push(Violation {
                    check: "illegal-transition",
                    detail: format!("NodeFence {} ({}): {p} -> {phase}", s.fence, s.node),
                });
            }
        }
        prev = Some(phase);
    }
    out
}

fn names(s: &FenceSnapshot) -> String {
    s.released
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An audit record of an action the bridge accepted (not a status read): its action, target
/// and fencing token.
pub fn accepted_action(record: &serde_json::Value) -> Option<(&str, &str, i64)> {
    let action = record["action"].as_str().unwrap_or("");
    if action.contains("status") || record["result"].as_str() != Some("ok") {
        return None;
    }
    Some((
        action,
        record["target"].as_str()?,
        record["token"].as_i64()?,
    ))
}

/// Per target, the tokens of the bridge's accepted actions never go down.
fn check_tokens(history: &[Record]) -> Vec<Violation> {
    let mut highest: BTreeMap<String, i64> = BTreeMap::new();
    let mut out = Vec::new();
    for r in history {
        let Record::Audit { record, .. } = r else {
            continue;
        };
        let Some((action, target, token)) = accepted_action(record) else {
            continue;
        };
        let h = highest.entry(target.to_string()).or_insert(token);
        if token < *h {
            out.push(Violation {
                check: "token-regressed",
                detail: format!(
                    "bridge accepted {action} on {target} with token {token} after token {h}"
                ),
            });
        } else {
            *h = token;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{EvidenceRec, ReleasedRec};

    fn snapshot() -> FenceSnapshot {
        FenceSnapshot {
            fence: "m0-abcde".into(),
            uid: "nf-1".into(),
            node: "m0".into(),
            phase: "Released".into(),
            token: Some(3),
            verified_levels: vec![0],
            evidence: vec![EvidenceRec {
                level: 0,
                device: "bridge://127.0.0.1:1/m0".into(),
                kind: "PowerOff".into(),
                observed: "off".into(),
                at_us: 1_000,
            }],
            released: vec![ReleasedRec {
                namespace: "app".into(),
                name: "w0-0".into(),
                uid: "pod-1".into(),
                at_us: 2_000,
            }],
            transitions: ["Pending", "Fencing", "Fenced", "Releasing", "Released"]
                .iter()
                .enumerate()
                .map(|(i, p)| (p.to_string(), i as i64, String::new()))
                .collect(),
            failure: None,
            created_us: None,
        }
    }

    /// A fault that explains a fence of m0: m0 cut off at 0 s, healed at 1 s.
    fn cut_m0(event: usize, fault: Fault, healed: f64) -> Vec<Record> {
        vec![
            Record::Fault {
                t: 0.0,
                event,
                fault,
                machine: Some("m0".into()),
                detail: String::new(),
            },
            Record::Heal {
                t: healed,
                event,
                detail: String::new(),
            },
        ]
    }

    fn with_cause(h: &[Record]) -> Vec<Record> {
        let cut = Fault::CutAll {
            target: crate::schedule::Target::Machine(0),
            hold_ms: 1_000,
        };
        let mut out = cut_m0(0, cut, 1.0);
        out.extend_from_slice(h);
        out
    }

    #[test]
    fn a_reboot_the_lab_saw_outside_every_fence_is_a_cause_and_a_fence_s_own_is_not() {
        let only = |v: Vec<Violation>| -> Vec<&'static str> {
            v.into_iter()
                .map(|v| v.check)
                .filter(|c| *c == "fence-without-cause")
                .collect()
        };
        // The host's and the controller's wall clocks read `t` seconds as `t * 1e6` µs here.
        let boot = |t: f64, machine: &str| Record::Boot {
            t,
            machine: machine.into(),
            boot: Some(format!("boot-{t}")),
            at_us: (t * 1e6) as i64,
        };
        let requested_at = |t: f64, seen: f64, uid: &str| {
            let mut snap = snapshot();
            snap.uid = uid.into();
            snap.transitions = vec![("Pending".into(), (t * 1e6) as i64, String::new())];
            Record::Phase {
                t: seen,
                phase: "Pending".into(),
                message: String::new(),
                snapshot: snap,
                boot_before: None,
                boot_after: None,
                seen_us: None,
            }
        };
        let phase = |t: f64, uid: &str| requested_at(t, t, uid);
        // m0's watchdog reset it (a new boot, no fence about), then m0 was fenced: a cause.
        assert!(only(check_all(&[boot(0.5, "m0"), phase(2.0, "nf-1")])).is_empty());
        // Another machine's reboot explains nothing; nor does one after the fence was seen,
        // nor one long before.
        assert_eq!(
            only(check_all(&[boot(1.0, "m1"), phase(2.0, "nf-1")])),
            ["fence-without-cause"]
        );
        assert_eq!(
            only(check_all(&[phase(2.0, "nf-1"), boot(3.0, "m0")])),
            ["fence-without-cause"]
        );
        assert_eq!(
            only(check_all(&[
                boot(1.0, "m0"),
                phase(2.0 + CAUSE_WINDOW_S, "nf-1")
            ])),
            ["fence-without-cause"]
        );
        // A reboot made by an earlier fence of m0 (inside its span: its power cycle and its
        // recovery) does not excuse the next fence of m0.
        let late = 1.0 + CAUSE_WINDOW_S;
        let h = [
            boot(0.5, "m0"),
            phase(2.0, "nf-0"),
            boot(3.0, "m0"),
            phase(late, "nf-0"),
            boot(late + 2.0, "m0"),
            phase(late + 10.0, "nf-1"),
        ];
        let v = check_all(&h);
        assert_eq!(
            only(v.clone()),
            ["fence-without-cause"],
            "nf-0 has a cause, nf-1 none of its own: {v:?}"
        );
        assert!(v[0].detail.contains("nf-1"), "{}", v[0].detail);
        // The fence's own power off, seen by the observer before its first status (requested
        // at 20 s, off seen at 20.4 s, the status first read at 20.6 s): no cause.
        assert_eq!(
            only(check_all(&[
                boot(20.4, "m0"),
                requested_at(20.0, 20.6, "nf-1")
            ])),
            ["fence-without-cause"]
        );
        // Nor one seen within a second before the request (the observer's poll), nor one the
        // controller's clock, stepped ahead, would place before its request.
        assert_eq!(
            only(check_all(&[
                boot(19.5, "m0"),
                requested_at(20.0, 20.6, "nf-1")
            ])),
            ["fence-without-cause"]
        );
        assert!(only(check_all(&[
            boot(18.9, "m0"),
            requested_at(20.0, 20.6, "nf-1")
        ]))
        .is_empty());
    }

    #[test]
    fn a_fence_needs_a_fault_that_silenced_its_node() {
        use crate::schedule::Target;
        let fence = || seen(snapshot(), None, None); // first seen at 2 s
        let only = |v: Vec<Violation>| -> Vec<&'static str> {
            v.into_iter()
                .map(|v| v.check)
                .filter(|c| *c == "fence-without-cause")
                .collect()
        };
        // No fault at all: a fence from nowhere.
        assert_eq!(only(check_all(&[fence()])), ["fence-without-cause"]);
        // m0 cut off before: explained.
        assert!(only(check_all(&with_cause(&[fence()]))).is_empty());
        // A peer cut or a frozen BMC does not silence a node's heartbeat.
        for f in [
            Fault::PeerCut {
                target: Target::Machine(0),
                hold_ms: 1_000,
            },
            Fault::BmcFreeze {
                target: Target::Machine(0),
                hold_ms: 1_000,
            },
        ] {
            let mut h = cut_m0(0, f, 1.0);
            h.push(fence());
            assert_eq!(only(check_all(&h)), ["fence-without-cause"]);
        }
        // An etcd freeze makes every heartbeat stale at once: the quorum guard's case.
        let mut h = vec![Record::Fault {
            t: 0.0,
            event: 0,
            fault: Fault::EtcdFreeze { hold_ms: 1_000 },
            machine: None,
            detail: String::new(),
        }];
        h.push(fence());
        let v = check_all(&h);
        assert_eq!(only(v.clone()), ["fence-without-cause"]);
        assert!(
            v[0].detail.contains("first seen at 2.0s"),
            "{}",
            v[0].detail
        );
        // A cut of another machine does not explain m0's fence.
        let mut h = with_cause(&[]);
        if let Record::Fault { machine, .. } = &mut h[0] {
            *machine = Some("m1".into());
        }
        h.push(fence());
        assert_eq!(only(check_all(&h)), ["fence-without-cause"]);
        // A cut healed long before the fence is no cause.
        let cut = Fault::CutAll {
            target: Target::Machine(0),
            hold_ms: 1_000,
        };
        let mut h = cut_m0(0, cut, 1.0);
        h.push(Record::Phase {
            t: 1.0 + CAUSE_WINDOW_S + 1.0,
            phase: "Pending".into(),
            message: String::new(),
            snapshot: snapshot(),
            boot_before: None,
            boot_after: None,
            seen_us: None,
        });
        assert_eq!(only(check_all(&h)), ["fence-without-cause"]);
        // Two faults at once: the event records itself (no machine), then each fault with its
        // machine. A fence of m0 is explained by the event's second fault, which hit m0, and
        // the event's last heal closes the window for both.
        let two = |second_machine: &str| {
            let first = Fault::AgentStop {
                target: Target::Machine(1),
                hold_ms: 1_000,
            };
            let second = Fault::CutAll {
                target: Target::Machine(0),
                hold_ms: 1_000,
            };
            let rec = |fault: Fault, machine: Option<&str>, t: f64| Record::Fault {
                t,
                event: 4,
                fault,
                machine: machine.map(String::from),
                detail: String::new(),
            };
            vec![
                rec(
                    Fault::TwoAtOnce {
                        first: Box::new(first.clone()),
                        second: Box::new(second.clone()),
                        second_after_ms: 500,
                    },
                    None,
                    0.0,
                ),
                rec(first, Some("m1"), 0.0),
                rec(second, Some(second_machine), 0.5),
                Record::Heal {
                    t: 1.0,
                    event: 4,
                    detail: String::new(),
                },
                Record::Heal {
                    t: 1.5,
                    event: 4,
                    detail: String::new(),
                },
                fence(),
            ]
        };
        assert!(only(check_all(&two("m0"))).is_empty());
        // The same event with its cut on m2 does not explain m0's fence.
        assert_eq!(only(check_all(&two("m2"))), ["fence-without-cause"]);
    }

    /// The host's clock reads `t` seconds as `t * 1e6` µs here.
    fn us(t: f64) -> i64 {
        (t * 1e6).round() as i64
    }

    /// A renewal of `node`'s Lease that landed somewhere in `[after, seen]` seconds.
    fn renewal(node: &str, after: f64, seen: f64) -> Record {
        Record::Renewal {
            t: seen,
            node: node.into(),
            after_us: us(after),
            seen_us: us(seen),
        }
    }

    /// m0's NodeFence with `creationTimestamp` `created` s, first seen at `seen` s (if at all).
    fn created(created: f64, seen: Option<f64>) -> Record {
        let mut snap = snapshot();
        snap.created_us = Some(us(created));
        Record::Phase {
            t: seen.unwrap_or(created),
            phase: "Pending".into(),
            message: String::new(),
            snapshot: snap,
            boot_before: None,
            boot_after: None,
            seen_us: seen.map(us),
        }
    }

    fn heard(h: &[Record]) -> Vec<Violation> {
        check_all(h)
            .into_iter()
            .filter(|v| v.check == "fence-while-heard")
            .collect()
    }

    // The policy's threshold is 4 s and the margin 1.5 s: created at 20 s (seen at 20.3 s), a
    // renewal that landed in [16.3 s, 18.5 s] was heard.

    #[test]
    fn a_fence_created_two_seconds_after_its_node_renewed_is_a_violation() {
        assert_eq!(
            crate::world::UNHEALTHY_AFTER_S,
            4,
            "the examples below assume 4 s"
        );
        let v = heard(&[renewal("m0", 17.9, 18.4), created(20.0, Some(20.3))]);
        assert_eq!(v.len(), 1, "{v:?}");
        for part in ["nf-1", "m0", "[17900000, 18400000]", "[20000000, 20300000]"] {
            assert!(v[0].detail.contains(part), "{part}: {}", v[0].detail);
        }
        // Whatever faults were about: a cut of m0 just before does not excuse it.
        assert_eq!(
            heard(&with_cause(&[
                renewal("m0", 17.9, 18.4),
                created(20.0, Some(20.3))
            ]))
            .len(),
            1
        );
        // Another node's renewal says nothing about m0.
        assert!(heard(&[renewal("m1", 17.9, 18.4), created(20.0, Some(20.3))]).is_empty());
    }

    #[test]
    fn a_fence_created_past_the_threshold_after_the_last_renewal_is_not_a_violation() {
        // Landed by 15 s, the fence created at 20 s: 5 s of silence, threshold + 1 s.
        assert!(heard(&[renewal("m0", 14.5, 15.0), created(20.0, Some(20.3))]).is_empty());
    }

    #[test]
    fn the_observer_s_first_sight_narrows_the_creation_time() {
        // Landed after 16.5 s: within the threshold of a creation seen by 20.3 s, but not of
        // one known only to lie in [20 s, 21 s) (the creationTimestamp's second).
        let h = |seen| [renewal("m0", 16.5, 17.0), created(20.0, seen)];
        assert_eq!(heard(&h(Some(20.3))).len(), 1);
        assert!(heard(&h(None)).is_empty());
        assert!(heard(&h(Some(23.0))).is_empty());
    }

    #[test]
    fn a_renewal_seen_by_a_slow_observer_proves_nothing() {
        // The previous successful list started at 14 s: the write may have landed then, 6 s
        // before the fence.
        assert!(heard(&[renewal("m0", 14.0, 18.4), created(20.0, Some(20.3))]).is_empty());
    }

    #[test]
    fn a_machine_the_lab_saw_go_down_after_it_was_heard_may_be_fenced() {
        let boot = |machine: &str, at: f64| Record::Boot {
            t: at,
            machine: machine.into(),
            boot: None,
            at_us: us(at),
        };
        let fence = |b: Record| [renewal("m0", 17.9, 18.4), b, created(20.0, Some(20.3))];
        assert!(heard(&fence(boot("m0", 18.8))).is_empty());
        // Another machine's power loss, or m0's only after the fence (its own power off),
        // excuses nothing.
        assert_eq!(heard(&fence(boot("m1", 18.8))).len(), 1);
        let mut h = fence(boot("m0", 17.0)).to_vec();
        h.push(boot("m0", 20.6));
        assert_eq!(
            heard(&h).len(),
            1,
            "a boot before the renewal, then the fence's own"
        );
    }

    #[test]
    fn a_renewal_landing_after_the_fence_or_just_before_it_is_not_a_violation() {
        // After: the node came back.
        assert!(heard(&[created(20.0, Some(20.3)), renewal("m0", 19.9, 20.4)]).is_empty());
        // Within the margin before the creation: the controller may have decided before it
        // reached its cache.
        assert!(heard(&[renewal("m0", 18.6, 19.1), created(20.0, Some(20.3))]).is_empty());
    }

    #[test]
    fn an_older_history_without_renewals_or_creation_times_yields_no_fence_while_heard() {
        let lines = [
            r#"{"type":"fault","t":0.0,"event":0,"fault":{"fault":"cutAll","target":{"machine":0},"holdMs":8000},"machine":"m0","detail":""}"#,
            r#"{"type":"phase","t":20.3,"phase":"Pending","message":"","snapshot":{"fence":"m0-abcde","uid":"nf-1","node":"m0","phase":"Pending","token":null,"verifiedLevels":[],"evidence":[],"released":[],"transitions":[["Pending",20000000,""]],"failure":null}}"#,
        ];
        let h: Vec<Record> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let Record::Phase {
            snapshot, seen_us, ..
        } = &h[1]
        else {
            panic!("{:?}", h[1]);
        };
        assert_eq!((snapshot.created_us, *seen_us), (None, None));
        assert!(heard(&h).is_empty());
        // A renewal beside a fence recorded without its creationTimestamp: not judged.
        let mut h = h;
        h.insert(1, renewal("m0", 17.9, 18.4));
        assert!(heard(&h).is_empty());
    }

    fn seen(s: FenceSnapshot, before: Option<&str>, after: Option<&str>) -> Record {
        Record::Phase {
            t: 2.0,
            phase: s.phase.clone(),
            message: String::new(),
            snapshot: s,
            boot_before: before.map(String::from),
            boot_after: after.map(String::from),
            seen_us: None,
        }
    }

    #[test]
    fn the_online_round_judges_everything_but_the_power_truth() {
        let mut fencing = snapshot();
        fencing.phase = "Fencing".into();
        fencing.evidence.clear();
        fencing.released.clear();
        fencing.verified_levels.clear();
        // A raced sample now can be followed by a new boot later: not judged online.
        let raced_so_far = with_cause(&[
            seen(fencing.clone(), Some("boot-1"), Some("boot-1")),
            seen(snapshot(), Some("boot-1"), Some("boot-1")),
        ]);
        assert!(check_so_far(&raced_so_far).is_empty());
        assert_eq!(check_all(&raced_so_far)[0].check, "power-off-not-true");
        // A fence that nothing explains is judged online.
        let v = check_so_far(&[seen(fencing, None, None)]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "fence-without-cause");
    }

    #[test]
    fn power_off_evidence_from_a_machine_that_never_rebooted_is_a_violation() {
        let mut fencing = snapshot();
        fencing.phase = "Fencing".into();
        fencing.evidence.clear();
        fencing.released.clear();
        fencing.verified_levels.clear();
        let released = snapshot();
        // Off and on again (recovery), even within one poll: a new boot. Fine.
        let cycled = [
            seen(fencing.clone(), Some("boot-1"), Some("boot-1")),
            seen(released.clone(), Some("boot-1"), Some("boot-2")),
        ];
        assert!(
            check_all(&with_cause(&cycled)).is_empty(),
            "{:?}",
            check_all(&with_cause(&cycled))
        );
        // A sample that raced recovery's power on read the old boot; the next one, the new.
        let raced = [
            seen(fencing.clone(), Some("boot-1"), Some("boot-1")),
            seen(released.clone(), Some("boot-1"), Some("boot-1")),
            seen(released.clone(), Some("boot-1"), Some("boot-2")),
        ];
        assert!(
            check_all(&with_cause(&raced)).is_empty(),
            "{:?}",
            check_all(&with_cause(&raced))
        );
        // Still off after the claim: fine.
        let off = [
            seen(fencing.clone(), Some("boot-1"), Some("boot-1")),
            seen(released.clone(), Some("boot-1"), None),
        ];
        assert!(check_all(&with_cause(&off)).is_empty());
        // The boot it ran before the claim, after the claim: it never went off.
        let never_off = [
            seen(fencing.clone(), Some("boot-1"), Some("boot-1")),
            seen(released.clone(), Some("boot-1"), Some("boot-1")),
        ];
        let v = check_all(&with_cause(&never_off));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "power-off-not-true");
        // Seen first only after the claim: nothing to compare with, nothing said.
        assert!(check_all(&with_cause(&[seen(
            released,
            Some("boot-1"),
            Some("boot-1")
        )]))
        .is_empty());
        // Evidence that is not a power off (a storage block) claims nothing about power.
        let mut storage = snapshot();
        storage.evidence[0].kind = "StorageBlocked".into();
        storage.released.clear();
        let blocked = [
            seen(fencing, Some("boot-1"), Some("boot-1")),
            seen(storage, Some("boot-1"), Some("boot-1")),
        ];
        assert!(check_all(&with_cause(&blocked)).is_empty());
    }

    fn release(s: FenceSnapshot) -> Vec<Record> {
        vec![
            Record::Pod {
                t: 0.0,
                writer: "w0".into(),
                name: "w0-0".into(),
                uid: "pod-1".into(),
                node: "m0".into(),
                seen_us: 0,
            },
            Record::Release {
                t: 1.0,
                pods: s.released.clone(),
                snapshot: s,
            },
        ]
    }

    #[test]
    fn a_release_after_verified_evidence_passes() {
        assert_eq!(check_all(&release(snapshot())), vec![]);
    }

    #[test]
    fn a_release_without_any_verified_level_is_a_violation() {
        let mut s = snapshot();
        s.verified_levels.clear();
        let v = check_all(&release(s));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "release-without-verified-fence");
    }

    #[test]
    fn a_release_with_a_commanded_but_unevidenced_fence_is_a_violation() {
        let mut s = snapshot();
        s.evidence.clear();
        let v = check_all(&release(s));
        assert_eq!(v[0].check, "release-without-verified-fence");
    }

    #[test]
    fn a_release_before_the_evidence_was_observed_is_a_violation() {
        let mut s = snapshot();
        s.evidence[0].at_us = 5_000;
        let v = check_all(&release(s));
        assert_eq!(v[0].check, "release-without-verified-fence");
        assert!(v[0].detail.contains("precedes"), "{}", v[0].detail);
    }

    #[test]
    fn a_controller_clock_step_excuses_only_as_much_disorder_as_it_could_cause() {
        let step = |step_ms| Record::Fault {
            t: 0.5,
            event: 0,
            fault: Fault::ControllerClockStep {
                replicas: crate::schedule::Replicas::Leader,
                step_ms,
                hold_ms: 5_000,
            },
            machine: None,
            detail: String::new(),
        };
        // Evidence stamped 3 ms after the release, by a clock that was stepped 2 s at some
        // point: the two stamps may come from clocks 2 s apart.
        let mut s = snapshot();
        s.evidence[0].at_us = 5_000;
        let mut h = vec![step(-2_000)];
        h.extend(release(s.clone()));
        assert_eq!(check_all(&h), vec![]);
        // 3 s of disorder is more than a 2 s step explains.
        s.evidence[0].at_us = 2_000 + 3_000_000;
        let mut h = vec![step(2_000)];
        h.extend(release(s));
        let v = check_all(&h);
        assert_eq!(v[0].check, "release-without-verified-fence", "{v:?}");
        // A replacement seen 1 s before a Fenced stamped by a clock 2 s ahead is excused; by a
        // clock that was only ever stepped back, it is not.
        let mut fenced = snapshot();
        fenced.released.clear();
        for t in &mut fenced.transitions {
            t.1 += 1_000_000;
        }
        for (steps, violations) in [(step(2_000), 0), (step(-2_000), 1)] {
            let h = vec![
                steps,
                pod("pod-1", "m0", 0),
                Record::Phase {
                    t: 1.0,
                    phase: "Fenced".into(),
                    message: String::new(),
                    snapshot: fenced.clone(),
                    boot_before: None,
                    boot_after: None,
                    seen_us: None,
                },
                pod("pod-2", "m1", 10),
            ];
            let v: Vec<_> = check_all(&with_cause(&h))
                .into_iter()
                .filter(|v| v.check == "replacement-without-fence")
                .collect();
            assert_eq!(v.len(), violations, "{v:?}");
        }
    }

    #[test]
    fn releasing_a_pod_of_another_node_is_a_violation() {
        let mut h = release(snapshot());
        h[0] = Record::Pod {
            t: 0.0,
            writer: "w0".into(),
            name: "w0-0".into(),
            uid: "pod-1".into(),
            node: "m3".into(),
            seen_us: 0,
        };
        let v = check_all(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "release-outside-fence");
    }

    #[test]
    fn releasing_a_volume_less_pod_on_storage_evidence_alone_is_a_violation() {
        let mut s = snapshot();
        s.evidence[0].kind = "StorageBlocked".into();
        // The writer's pod (behind its volume): covered.
        assert_eq!(check_all(&release(s.clone())), vec![]);
        // The volume-less identity's pod, even one the observer never listed.
        s.released[0].uid = "pod-identity".into();
        s.released[0].name = format!("{}-0", crate::world::IDENTITY);
        let v = check_all(&release(s.clone()));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "release-not-covered");
        // The same release behind a power off: covered.
        s.evidence.push(EvidenceRec {
            level: 0,
            device: "bridge://127.0.0.1:1/m0".into(),
            kind: "PowerOff".into(),
            observed: "off".into(),
            at_us: 1_000,
        });
        assert_eq!(check_all(&release(s)), vec![]);
    }

    #[test]
    fn a_skipped_verification_phase_is_an_illegal_transition() {
        let mut s = snapshot();
        s.transitions.remove(2); // Fencing -> Releasing, never Fenced
        let v = check_all(&release(s));
        assert!(v.iter().any(|v| v.check == "illegal-transition"), "{v:?}");
    }

    #[test]
    fn the_same_violation_seen_in_many_observations_is_reported_once() {
        let mut s = snapshot();
        s.verified_levels.clear();
        let mut h = release(s.clone());
        h.push(Record::FenceFinal {
            t: 2.0,
            snapshot: s,
        });
        assert_eq!(check_all(&h).len(), 1);
    }

    #[test]
    fn writer_verdicts_become_violations() {
        let h = vec![Record::Writer {
            t: 0.0,
            writer: "w1".into(),
            pods: vec![],
            log_writes: 10,
            split_brain: 2,
            lost: 1,
            report: String::new(),
        }];
        let checks: Vec<&str> = check_all(&h).iter().map(|v| v.check).collect();
        assert_eq!(checks, vec!["at-most-one", "acknowledged-write-lost"]);
    }

    fn pod(uid: &str, node: &str, seen_us: i64) -> Record {
        Record::Pod {
            t: 0.0,
            writer: "w0".into(),
            name: "w0-0".into(),
            uid: uid.into(),
            node: node.into(),
            seen_us,
        }
    }

    #[test]
    fn a_replacement_seen_after_the_old_node_was_verified_fenced_passes() {
        // The snapshot's Fenced transition is at 2 µs.
        let mut h = release(snapshot());
        h.push(pod("pod-2", "m1", 10));
        assert_eq!(check_all(&h), vec![]);
    }

    #[test]
    fn a_replacement_on_another_node_without_a_verified_fence_is_a_violation() {
        let h = vec![pod("pod-1", "m0", 0), pod("pod-2", "m1", 10)];
        let v = check_all(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "replacement-without-fence");
        // A fence verified only after the replacement was seen does not count.
        let mut s = snapshot();
        s.released.clear();
        let mut h = vec![pod("pod-1", "m0", 0)];
        h.push(Record::FenceFinal {
            t: 0.0,
            snapshot: s,
        });
        h.push(pod("pod-2", "m1", 1));
        assert_eq!(check_all(&h)[0].check, "replacement-without-fence");
    }

    #[test]
    fn two_live_incarnations_of_a_volume_less_identity_are_a_violation() {
        let h = vec![Record::TwoIncarnations {
            t: 3.0,
            identity: "v0-0".into(),
            processes: vec![
                ("lab/m0".into(), "a".into(), 10),
                ("lab/m2".into(), "b".into(), 20),
            ],
        }];
        assert_eq!(check_all(&h)[0].check, "at-most-one-process");
    }

    #[test]
    fn a_lower_token_accepted_after_a_higher_one_is_a_violation() {
        let audit = |token: i64, action: &str| Record::Audit {
            t: 0.0,
            record: serde_json::json!({"target": "m0", "token": token, "action": action, "result": "ok"}),
        };
        assert!(check_all(&[audit(1, "power.off"), audit(2, "power.off")]).is_empty());
        assert!(check_all(&[audit(2, "power.off"), audit(0, "power.status")]).is_empty());
        let v = check_all(&[audit(2, "power.off"), audit(1, "storage.block")]);
        assert_eq!(v[0].check, "token-regressed");
    }
}
