//! Decide: a pure function from a [`Snapshot`] to one typed [`Verdict`] per node that needs one.
//!
//! The gates run in a fixed order, and the first that objects gives the verdict:
//!
//! 1. policy: none selects the node → `Hold(NoPolicy)`; several → `Hold(ConflictingPolicies)`;
//!    malformed → `Hold(InvalidPolicy)`;
//! 2. health: a Healthy node gets no verdict at all unless a `NodeFence` asks for it;
//! 3. `paused`, then exclusions (opt-out annotation, maintenance);
//! 4. health again: a manual request for a non-Unhealthy node holds, a Suspect node waits;
//! 5. escalation limit, then cooldown (flapping nodes);
//! 6. the quorum guard: too many covered nodes silent (counting those that renewed late within
//!    the Unhealthy threshold, [`late_after`]: heartbeats reaching a starving API server late),
//!    or every zone fully silent;
//! 7. `fenceWhen`;
//! 8. forgiveness (pods' unreachable `tolerationSeconds`, shortened by an exhausted PDB);
//! 9. a plan: FenceTarget levels, or the trusted self-fence level;
//! 10. limits, admitting candidates highest pod priority first (then longest Unhealthy, then
//!     name): cluster-wide `maxConcurrent`, then per-domain;
//! 11. `dryRun` turns an admitted fence into `Hold(DryRun)`.
//!
//! Manual requests may skip only the guards their `overrides` name (quorum guard, forgiveness,
//! node health, escalation limit).

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use palisade_model::nodefence::{Coverage, Overrides, PlannedDevice, RequestedBy};
use palisade_model::policy::{Detection, FenceWhen, FencingPolicySpec};

use crate::clock::Mono;
use crate::detector::{classify, unhealthy_at, Health, Thresholds};
use crate::power;
use crate::selector;
use crate::snapshot::{FenceState, NodeSnapshot, PolicySnapshot, Snapshot, Tolerance};
use crate::verdict::{Cause, FencePlan, HoldReason, PlanLevel, Verdict, WaitReason};

/// One node's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The node.
    pub node: String,
    /// The verdict.
    pub verdict: Verdict,
}

/// A node that passed every per-node gate and now competes for the concurrency limits.
struct Candidate<'a> {
    node: &'a NodeSnapshot,
    policy: &'a PolicySnapshot,
    plan: FencePlan,
    since: Mono,
}

/// The policies whose quorum guard holds in this snapshot (too many covered nodes silent, or
/// every zone silent), by name: the caller remembers the round as each one's
/// [`PolicySnapshot::guard_held_at`] for the rounds that follow.
pub fn guards_holding(s: &Snapshot) -> Vec<String> {
    let nodes: Vec<&NodeSnapshot> = s.nodes.iter().collect();
    s.policies
        .iter()
        .filter(|p| quorum_hold(&p.spec, &nodes, s.now.mono).is_some())
        .map(|p| p.name.clone())
        .collect()
}

/// Decide for every node that is silent or has a pending `NodeFence`. Nodes that are Healthy
/// and unrequested, or whose fence is already under way, get no decision. The result is sorted
/// by node name and depends only on the snapshot (not on the order of its lists).
///
/// Guarantees: no `Fence` verdict when the node's policy is paused or in dry run, when the
/// quorum guard trips or tripped less than the Unhealthy threshold before the node's silence
/// would count (unless a manual request overrides it), for an excluded node, or beyond
/// `maxConcurrent` / `perDomain.maxConcurrent` counting the fences already in flight.
pub fn decide(s: &Snapshot) -> Vec<Decision> {
    let mut nodes: Vec<&NodeSnapshot> = s.nodes.iter().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut policies: Vec<&PolicySnapshot> = s.policies.iter().collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));

    let mut decisions = Vec::new();
    let mut candidates = Vec::new();
    let mut quorum = HashMap::new();
    for node in &nodes {
        match gate(s, &nodes, &policies, node, &mut quorum) {
            Gate::Skip => {}
            Gate::Verdict(verdict) => decisions.push(Decision {
                node: node.name.clone(),
                verdict,
            }),
            Gate::Candidate(c) => candidates.push(c),
        }
    }
    decisions.extend(admit(&nodes, candidates));
    decisions.sort_by(|a, b| a.node.cmp(&b.node));
    decisions
}

enum Gate<'a> {
    Skip,
    Verdict(Verdict),
    Candidate(Box<Candidate<'a>>),
}

/// The quorum guard of `spec` over this round's nodes: `Some` when the controller's side may be
/// the partitioned one (too many covered nodes silent, or every zone silent).
fn quorum_hold(spec: &FencingPolicySpec, nodes: &[&NodeSnapshot], now: Mono) -> Option<HoldReason> {
    let covered: Vec<&&NodeSnapshot> = nodes
        .iter()
        .filter(|n| selector::matches(&spec.node_selector, &n.labels))
        .collect();
    let (silent, answering): (Vec<&&NodeSnapshot>, Vec<&&NodeSnapshot>) = covered
        .iter()
        .partition(|n| judge(n, spec, now, n.last_heartbeat_change).health != Health::Healthy);
    let allowed = spec.max_unhealthy().allowed_silent(covered.len());
    if silent.len() > allowed {
        return Some(HoldReason::QuorumLost {
            silent: silent.len(),
            total: covered.len(),
            allowed,
        });
    }
    let late = answering
        .iter()
        .filter(|n| renewed_late(n, spec, now))
        .count();
    if silent.len() + late > allowed {
        return Some(HoldReason::HeartbeatsLate {
            silent: silent.len(),
            late,
            total: covered.len(),
            allowed,
        });
    }
    // Every zone (over all nodes, not only covered ones) fully silent: act on nothing.
    let key = &spec.limits.per_domain.topology_key;
    let mut zones: BTreeMap<&str, bool> = BTreeMap::new();
    for n in nodes {
        let zone = n.labels.get(key).map_or("", String::as_str);
        let up = judge(n, spec, now, n.last_heartbeat_change).health == Health::Healthy;
        *zones.entry(zone).or_insert(false) |= up;
    }
    (!zones.is_empty() && zones.values().all(|up| !up))
        .then_some(HoldReason::AllZonesDown { zones: zones.len() })
}

/// Whether `node`, answering now, renewed late recently: an interval between two of its
/// observed renewals longer than [`late_after`] ended within the last Unhealthy threshold. A
/// dead node delays nobody else's renewals; an API server that answers some nodes and not
/// others (flow control, a slow etcd, a congested control-plane link) delays many, and the
/// nodes it starves completely look dead. So the quorum guard counts such nodes with the
/// silent ones.
fn renewed_late(node: &NodeSnapshot, spec: &FencingPolicySpec, now: Mono) -> bool {
    let t = Thresholds::from(&spec.detection);
    let late = late_after(t);
    node.long_gaps
        .iter()
        .any(|g| g.length > late && now.since(g.ended) < t.unhealthy_after)
}

/// How long an interval between two renewals must be to count as late: halfway from the
/// Suspect threshold to the Unhealthy one (15 s with the defaults of 10 s and 20 s). Not the
/// Suspect threshold itself: with the defaults a node agent or kubelet renews every 10 s, so
/// ordinary jitter crosses it.
pub fn late_after(t: Thresholds) -> Duration {
    t.suspect_after + t.unhealthy_after.saturating_sub(t.suspect_after) / 2
}

fn hold(reason: HoldReason) -> Gate<'static> {
    Gate::Verdict(Verdict::Hold(reason))
}

fn gate<'a>(
    s: &Snapshot,
    nodes: &[&'a NodeSnapshot],
    policies: &[&'a PolicySnapshot],
    node: &'a NodeSnapshot,
    quorum: &mut HashMap<String, Option<HoldReason>>,
) -> Gate<'a> {
    let now = s.now.mono;
    let (requested, manual): (bool, Option<Overrides>) = match node.fence {
        FenceState::InFlight | FenceState::Settled => return Gate::Skip,
        FenceState::None => (false, None),
        FenceState::Pending { manual } => (true, manual),
    };
    let overrides = manual.unwrap_or_default();

    // 1. Policy.
    let matching: Vec<&&PolicySnapshot> = policies
        .iter()
        .filter(|p| selector::matches(&p.spec.node_selector, &node.labels))
        .collect();
    let policy = match matching.as_slice() {
        [only] => **only,
        other => {
            // Without a (single) policy, report only silent or requested nodes, judged by the
            // default thresholds.
            let t = Thresholds::from(&Detection::default());
            if !requested && classify(node.last_heartbeat_change, now, t) == Health::Healthy {
                return Gate::Skip;
            }
            return if other.is_empty() {
                hold(HoldReason::NoPolicy)
            } else {
                hold(HoldReason::ConflictingPolicies {
                    policies: other.iter().map(|p| p.name.clone()).collect(),
                })
            };
        }
    };
    let spec = &policy.spec;
    let t = Thresholds::from(&spec.detection);

    // 2. Health: healthy, unrequested nodes need no decision.
    let judged = judge(node, spec, now, node.last_heartbeat_change);
    let health = judged.health;
    if health == Health::Healthy && !requested {
        return Gate::Skip;
    }
    if spec.validate().is_err() {
        return hold(HoldReason::InvalidPolicy {
            policy: policy.name.clone(),
        });
    }

    // 3. Paused, exclusions.
    if spec.paused {
        return hold(HoldReason::Paused {
            policy: policy.name.clone(),
        });
    }
    if let Some(ex) = node.exclusion {
        return hold(HoldReason::Excluded(ex));
    }

    // 4. Health proper.
    let unhealthy_since = judged.unhealthy_since;
    let since = match health {
        Health::Unhealthy => unhealthy_since,
        _ if overrides.node_health => now.min(unhealthy_since),
        Health::Healthy => return hold(HoldReason::NodeNotUnhealthy),
        Health::Suspect => {
            return Gate::Verdict(Verdict::Wait {
                until: unhealthy_since,
                reason: WaitReason::Suspect,
            })
        }
    };

    // 5. Flapping: escalation limit, then cooldown.
    let wall = s.now.wall;
    let secs = |v: i64| Duration::from_secs(u64::try_from(v).unwrap_or(0));
    let window = secs(spec.escalation.window_seconds);
    let in_window = node
        .past_fences
        .iter()
        .filter(|end| wall.duration_since(**end).as_secs_f64() < window.as_secs_f64())
        .count();
    let max_fences = usize::try_from(spec.escalation.max_fences_per_window).unwrap_or(0);
    if in_window >= max_fences && !overrides.escalation {
        return hold(HoldReason::EscalationLimit {
            fences: in_window,
            window,
        });
    }
    // A manual request overriding `escalation` is a person deciding to fence anyway (after a
    // failed fence was fixed, say): the cooldown does not hold it either.
    if let Some(last) = node
        .past_fences
        .iter()
        .max()
        .filter(|_| !overrides.escalation)
    {
        let cooldown = secs(spec.escalation.cooldown_seconds);
        if let Ok(until) = last.checked_add(cooldown) {
            if wall < until {
                return hold(HoldReason::Cooldown { until });
            }
        }
    }

    // 6. Quorum guard (the same for every node of a policy in a round: computed once).
    if !overrides.quorum_guard {
        let guard = quorum
            .entry(policy.name.clone())
            .or_insert_with(|| quorum_hold(spec, nodes, now));
        if let Some(reason) = guard {
            return hold(reason.clone());
        }
    }

    // 6b. After the guard let go: silence during a control-plane outage is no evidence, so a
    // node gets the full Unhealthy threshold from the guard's last hold.
    if !overrides.quorum_guard {
        if let Some(held) = policy.guard_held_at {
            // Power evidence too must come after the guard's hold: the off reads begin, and the
            // missed renewal counts, from then.
            let until =
                judge(node, spec, now, node.last_heartbeat_change.max(held)).unhealthy_since;
            if now < until {
                return Gate::Verdict(Verdict::Wait {
                    until,
                    reason: WaitReason::AfterQuorumGuard,
                });
            }
        }
    }

    // 7. fenceWhen.
    if spec.fence_when == FenceWhen::StatefulOnly && !node.pods.iter().any(|p| p.uses_rwo_volume) {
        return hold(HoldReason::NotStateful);
    }

    // 8. Forgiveness.
    let (forgiveness, pdb_urgent) = forgiveness(s, policy, node);
    let deadline = since + forgiveness;
    if !overrides.forgiveness && now < deadline {
        return Gate::Verdict(Verdict::Wait {
            until: deadline,
            reason: WaitReason::Forgiveness {
                forgiveness,
                pdb_urgent,
            },
        });
    }

    // 9. Plan.
    let hardware = node.fence_target.as_ref().filter(|t| !t.levels.is_empty());
    let levels = match hardware {
        Some(target) => {
            if let Err(problems) = target.validate() {
                return hold(HoldReason::InvalidFenceTarget {
                    problems: problems.len(),
                });
            }
            // The node that hosts the firmware-bridge cannot be fenced through the bridge:
            // fencing it stops the bridge half-way. Only levels with no `bridge://` device run.
            let usable: Vec<(usize, &palisade_model::target::FenceLevel)> = target
                .levels
                .iter()
                .enumerate()
                .filter(|(_, l)| {
                    !node.hosts_bridge
                        || l.devices.iter().all(|d| {
                            palisade_model::target::DeviceScheme::of(&d.url)
                                != Some(palisade_model::target::DeviceScheme::Bridge)
                        })
                })
                .collect();
            if usable.is_empty() {
                return hold(HoldReason::BridgeHost);
            }
            usable
                .into_iter()
                .map(|(i, l)| PlanLevel::Hardware {
                    name: if l.name.is_empty() {
                        format!("level-{i}")
                    } else {
                        l.name.clone()
                    },
                    devices: planned_devices(l, target, spec.power_without_identity),
                    power_off: l.power_off,
                })
                .collect()
        }
        None if !spec.trust_self_fence.enabled => return hold(HoldReason::NoFenceTarget),
        // Trust in a self-fence counts from silence alone (power evidence needs a device).
        None => match self_fence_level(spec, node, classify(node.last_heartbeat_change, now, t)) {
            Ok(level) => vec![level],
            Err(why) => return hold(HoldReason::SelfFenceNotTrusted { why }),
        },
    };
    Gate::Candidate(Box::new(Candidate {
        node,
        policy,
        since,
        plan: FencePlan {
            node: node.name.clone(),
            policy: policy.name.clone(),
            requested_by: if manual.is_some() {
                RequestedBy::Manual
            } else {
                RequestedBy::Controller
            },
            levels,
            priority: node.pods.iter().map(|p| p.priority).max().unwrap_or(0),
            forgiveness,
            pdb_urgent,
            cause: judged.cause,
        },
    }))
}

/// A node's health under its policy, judged at `now` with heartbeat changes counted from
/// `silent_from` (its last observed change, or later when silence before some instant is no
/// evidence).
struct Judged {
    health: Health,
    /// When the node is (or will be, if it stays silent) Unhealthy.
    unhealthy_since: Mono,
    cause: Cause,
}

/// Silence, or power evidence when it comes first ([`crate::power::evident_at`]).
///
/// Guarantees: never healthier than silence alone says; power evidence only makes a node
/// Unhealthy sooner, and only by the rule of [`crate::power`].
fn judge(node: &NodeSnapshot, spec: &FencingPolicySpec, now: Mono, silent_from: Mono) -> Judged {
    let t = Thresholds::from(&spec.detection);
    let by_silence = unhealthy_at(silent_from, t);
    let after =
        Duration::from_secs(u64::try_from(spec.detection.power_off_after_seconds).unwrap_or(0));
    if let (Some(run), Some(gap)) = (node.power_off.as_ref(), node.renewal_gap) {
        if let Some(at) = power::evident_at(Some(run), silent_from, Some(gap), after, now)
            .filter(|at| *at < by_silence)
        {
            return Judged {
                health: Health::Unhealthy,
                unhealthy_since: at,
                cause: Cause::PowerOff {
                    off_for: run
                        .sent_after(silent_from)
                        .map_or(Duration::ZERO, |s| s.span()),
                    silent_for: now.since(silent_from),
                    renewal_gap: gap,
                },
            };
        }
    }
    Judged {
        health: classify(silent_from, now, t),
        unhealthy_since: by_silence,
        cause: Cause::Silence,
    }
}

/// The trusted self-fence level for a node with no hardware level, or why there is none.
///
/// Guarantees: a level only for a node the detector itself sees Unhealthy (a manual
/// `nodeHealth` override never earns trust: a live node has not self-fenced), and only from an
/// advertisement observed with the node's last renewal that says an armed `nowayout` watchdog
/// known to reset or power off the machine backs the self-fence, on a machine advertised as
/// bare metal unless the policy accepts virtual machines
/// ([`palisade_model::advertise::Advertisement::trust`]); the wait counts from that renewal, on
/// the controller's clock.
fn self_fence_level(
    spec: &FencingPolicySpec,
    node: &NodeSnapshot,
    health: Health,
) -> Result<PlanLevel, String> {
    if health != Health::Unhealthy {
        return Err("the node is not silent; a self-fence is trusted only for a silent node (nodeHealth overrides apply to hardware levels only)".into());
    }
    let ad = &node.advertisement;
    let margin =
        Duration::from_secs(u64::try_from(spec.trust_self_fence.margin_seconds).unwrap_or(0));
    let wait = ad
        .trust(margin, spec.trust_self_fence.virtual_machines)
        .map_err(|why| why.to_string())?;
    // A peer check whose vouch delay leaves the controller no window to count the node's
    // peers healthy (agents share one configuration) could never earn trust: say so now
    // instead of waiting out the fence's budget for a healthy majority that cannot appear.
    if let Some(why) = ad.peer_check.as_ref().and_then(|p| p.unusable_window()) {
        return Err(why);
    }
    let scope = match ad.scope {
        Some(palisade_model::advertise::SelfFenceScope::All) => Coverage::All,
        _ => Coverage::Stateful,
    };
    Ok(PlanLevel::SelfFence {
        silent_since: node.last_heartbeat_change,
        wait,
        scope,
        marker: node.heartbeat_marker.as_deref().map(str::to_string),
    })
}

/// The node's forgiveness and whether an exhausted PDB shortened it.
fn forgiveness(s: &Snapshot, policy: &PolicySnapshot, node: &NodeSnapshot) -> (Duration, bool) {
    let rule = &policy.spec.forgiveness;
    let secs = |v: i64| Duration::from_secs(u64::try_from(v).unwrap_or(0));
    let max = secs(rule.max_seconds);
    let mut f = if !rule.respect_tolerations || node.pods.is_empty() {
        secs(rule.default_seconds)
    } else {
        node.pods
            .iter()
            .filter_map(|p| match p.unreachable {
                Tolerance::None => Some(Duration::ZERO),
                Tolerance::For(d) => Some(d),
                Tolerance::Forever => None,
            })
            .min()
            .unwrap_or(max)
    };
    f = f.min(max);
    let pdb = &policy.spec.pdb;
    if pdb.urgent_when_exhausted {
        let exhausted = node.pods.iter().any(|pod| {
            s.pdbs.iter().any(|b| {
                b.namespace == pod.namespace
                    && b.disruptions_allowed.is_some_and(|d| d <= 0)
                    && b.selector
                        .as_ref()
                        .is_some_and(|sel| selector::matches(sel, &pod.labels))
            })
        });
        let urgent = secs(pdb.urgent_forgiveness_seconds);
        if exhausted && urgent < f {
            return (urgent, true);
        }
    }
    (f, false)
}

/// Admit candidates against the concurrency limits, highest priority first.
fn admit(nodes: &[&NodeSnapshot], mut candidates: Vec<Box<Candidate<'_>>>) -> Vec<Decision> {
    candidates.sort_by(|a, b| {
        (Reverse(a.plan.priority), a.since, &a.node.name).cmp(&(
            Reverse(b.plan.priority),
            b.since,
            &b.node.name,
        ))
    });
    let in_flight: Vec<&&NodeSnapshot> = nodes
        .iter()
        .filter(|n| n.fence == FenceState::InFlight)
        .collect();
    // Admitted this round: node names with their labels, so each policy's topology key applies.
    let mut admitted: Vec<&NodeSnapshot> = Vec::new();
    let mut out = Vec::new();
    for c in candidates {
        let spec = &c.policy.spec;
        let max = usize::try_from(spec.limits.max_concurrent).unwrap_or(0);
        let busy = in_flight.len() + admitted.len();
        let verdict = if busy >= max {
            Verdict::Hold(HoldReason::ConcurrencyLimit {
                in_flight: busy,
                max,
            })
        } else {
            let key = &spec.limits.per_domain.topology_key;
            let domain = c.node.labels.get(key).cloned().unwrap_or_default();
            let in_domain =
                |n: &NodeSnapshot| n.labels.get(key).map_or("", String::as_str) == domain;
            let busy_domain = in_flight.iter().filter(|n| in_domain(n)).count()
                + admitted.iter().filter(|n| in_domain(n)).count();
            let max_domain = usize::try_from(spec.limits.per_domain.max_concurrent).unwrap_or(0);
            if busy_domain >= max_domain {
                Verdict::Hold(HoldReason::DomainLimit {
                    domain,
                    in_flight: busy_domain,
                    max: max_domain,
                })
            } else {
                admitted.push(c.node);
                if spec.dry_run {
                    Verdict::Hold(HoldReason::DryRun {
                        would: Box::new(c.plan),
                    })
                } else {
                    Verdict::Fence(c.plan)
                }
            }
        };
        out.push(Decision {
            node: c.node.name.clone(),
            verdict,
        });
    }
    out
}

/// A level's devices as planned: in the FenceTarget's order, except that a level that must
/// not power the machine off runs its storage devices first (no reset before every block is
/// verified).
///
/// Under `powerWithoutIdentity: AfterProof`, a power device that cannot prove its machine's
/// identity (anything but a direct IPMI or Redfish BMC) names the target's direct BMCs, one of
/// which must answer as the node's machine before it acts ([`PlannedDevice::identity_from`]).
fn planned_devices(
    l: &palisade_model::target::FenceLevel,
    target: &palisade_model::target::FenceTargetSpec,
    rule: palisade_model::policy::PowerWithoutIdentity,
) -> Vec<PlannedDevice> {
    use palisade_model::target::DeviceKind;
    let provers: Vec<String> = target
        .levels
        .iter()
        .flat_map(|l| &l.devices)
        .filter(|d| d.is_direct_bmc())
        .map(|d| d.url.clone())
        .collect();
    let mut devices: Vec<PlannedDevice> = l
        .devices
        .iter()
        .map(|d| PlannedDevice {
            url: d.url.clone(),
            kind: d.kind,
            timeout_seconds: d.timeout_seconds,
            fences: d.fences.clone(),
            identity_from: (rule == palisade_model::policy::PowerWithoutIdentity::AfterProof
                && d.kind == DeviceKind::Power
                && !d.is_direct_bmc())
            .then(|| provers.clone()),
        })
        .collect();
    if l.power_off == palisade_model::target::PowerOff::Disallowed {
        devices.sort_by_key(|d| d.kind != palisade_model::target::DeviceKind::Storage);
    }
    devices
}
