//! Typed verdicts with reasons: what [`crate::decide::decide`] returns for a node.
//!
//! Every reason has a stable [`label`](Verdict::label) for metrics and a human
//! [`message`](Verdict::message) for Events and `NodeFence` status.

use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use palisade_model::nodefence::{self, Coverage, LevelKind, PlannedDevice, RequestedBy};
use palisade_model::target::PowerOff;

use crate::clock::{Clocks, Mono};
use crate::snapshot::Exclusion;

/// The decision for one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Fence the node with this plan.
    Fence(FencePlan),
    /// Not yet: re-decide at `until` (the clock runs on requeues).
    Wait {
        /// When the reason expires, on the controller's monotonic clock.
        until: Mono,
        /// Why it waits.
        reason: WaitReason,
    },
    /// Do not fence, for this reason, until the situation changes.
    Hold(HoldReason),
}

/// Why a decision waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    /// The node is Suspect: silent, not yet Unhealthy.
    Suspect,
    /// The policy's quorum guard held until recently: the node, silent through it, gets the
    /// Unhealthy threshold counted from the guard's last hold (silence during a control-plane
    /// outage is no evidence that the node is dead).
    AfterQuorumGuard,
    /// The node is Unhealthy; its pods' forgiveness has not run out.
    Forgiveness {
        /// The forgiveness applied.
        forgiveness: Duration,
        /// Whether a PDB at `disruptionsAllowed == 0` shortened it.
        pdb_urgent: bool,
    },
}

/// Why a decision holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldReason {
    /// No `FencingPolicy` selects the node: report, never fence.
    NoPolicy,
    /// More than one policy selects the node; fail closed.
    ConflictingPolicies {
        /// Their names.
        policies: Vec<String>,
    },
    /// The node's policy is malformed (see its validation errors).
    InvalidPolicy {
        /// Policy name.
        policy: String,
    },
    /// The node's policy is paused.
    Paused {
        /// Policy name.
        policy: String,
    },
    /// The node is excluded (opt-out annotation or maintenance).
    Excluded(Exclusion),
    /// A manual request for a node the controller does not see as Unhealthy, without the
    /// `nodeHealth` override.
    NodeNotUnhealthy,
    /// The node was fenced recently; fencing it again waits for the cooldown.
    Cooldown {
        /// When the cooldown ends (wall clock, as persisted fences are).
        until: Timestamp,
    },
    /// The node was fenced too often within the window: a person must decide.
    EscalationLimit {
        /// Fences within the window.
        fences: usize,
        /// The window.
        window: Duration,
    },
    /// Too many covered nodes are silent: the controller's side may be the partitioned one.
    QuorumLost {
        /// Silent covered nodes.
        silent: usize,
        /// Covered nodes.
        total: usize,
        /// How many may be silent.
        allowed: usize,
    },
    /// Heartbeats reach the API late: the covered nodes silent now are few enough, but counted
    /// with those that renewed late ([`crate::decide::late_after`]) within the last Unhealthy
    /// threshold they are too many. An API server that answers some nodes and not
    /// others (flow control, a slow etcd) looks like this; dead nodes do not delay the others.
    HeartbeatsLate {
        /// Covered nodes silent now.
        silent: usize,
        /// Covered nodes that answer again, but whose last renewals came late.
        late: usize,
        /// Covered nodes.
        total: usize,
        /// How many may be silent.
        allowed: usize,
    },
    /// Every topology zone is fully silent: act on nothing (the node lifecycle controller's rule).
    AllZonesDown {
        /// Number of zones.
        zones: usize,
    },
    /// `fenceWhen: StatefulOnly` and no pod on the node uses a ReadWriteOnce volume.
    NotStateful,
    /// No `FenceTarget` level and no trusted self-fence: nothing can fence this node.
    NoFenceTarget,
    /// No `FenceTarget` level, `trustSelfFence` is on, but the node's last observed renewal did
    /// not advertise what trust needs (a self-fence timeout, a known scope, an armed `nowayout`
    /// hardware watchdog whose expiry resets or powers off the machine, on a machine that is
    /// not virtual unless the policy accepts virtual machines), or a manual request overrides
    /// node health.
    SelfFenceNotTrusted {
        /// What was missing, in words.
        why: String,
    },
    /// The node hosts the firmware-bridge and every level of its FenceTarget goes through the
    /// bridge: fencing it would stop the fencer half-way.
    BridgeHost,
    /// The node's `FenceTarget` is malformed.
    InvalidFenceTarget {
        /// Number of validation problems.
        problems: usize,
    },
    /// The cluster-wide concurrency limit is reached.
    ConcurrencyLimit {
        /// Fences in flight (including those admitted earlier in this round).
        in_flight: usize,
        /// `maxConcurrent`.
        max: usize,
    },
    /// The node's topology domain is at its concurrency limit.
    DomainLimit {
        /// Domain (label value; empty when the node lacks the label).
        domain: String,
        /// Fences in flight in the domain (including this round's).
        in_flight: usize,
        /// `perDomain.maxConcurrent`.
        max: usize,
    },
    /// `dryRun`: everything passed and the node would be fenced with this many levels.
    DryRun {
        /// The plan that would run.
        would: Box<FencePlan>,
    },
}

/// What to fence and how: the levels to run, in order, and the facts that justified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencePlan {
    /// The node.
    pub node: String,
    /// The policy that allowed it.
    pub policy: String,
    /// Who asked.
    pub requested_by: RequestedBy,
    /// Levels in order.
    pub levels: Vec<PlanLevel>,
    /// Highest pod priority on the node (ordering key when limited).
    pub priority: i32,
    /// Forgiveness that was applied.
    pub forgiveness: Duration,
    /// Whether a PDB at zero shortened forgiveness.
    pub pdb_urgent: bool,
    /// What made the node Unhealthy.
    pub cause: Cause,
}

/// What made a node Unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Its silence reached the policy's `unhealthyAfterSeconds` (or a person asked).
    Silence,
    /// Power evidence ([`crate::power`]): its own identity-pinned device read the machine off.
    PowerOff {
        /// How long the device had read it off, on every read, when the evidence was complete.
        off_for: Duration,
        /// How long the node had been silent then.
        silent_for: Duration,
        /// The node's renewal interval (it missed a renewal).
        renewal_gap: Duration,
    },
}

impl Cause {
    /// Words for the NodeFence's reason and its Events (empty for silence).
    pub fn words(&self) -> String {
        match self {
            Cause::Silence => String::new(),
            Cause::PowerOff {
                off_for,
                silent_for,
                renewal_gap,
            } => format!(
                "; on power evidence: its own fence device read the machine off on every read for \
                 {:.1}s, and the node is silent {:.1}s (it renews every {:.1}s), before the silence \
                 threshold",
                off_for.as_secs_f64(),
                silent_for.as_secs_f64(),
                renewal_gap.as_secs_f64()
            ),
        }
    }
}

/// One level of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanLevel {
    /// Hardware devices from the node's FenceTarget.
    Hardware {
        /// Level name.
        name: String,
        /// Its devices (a `powerOff: Disallowed` level: storage first).
        devices: Vec<PlannedDevice>,
        /// Whether the level may power the machine off.
        power_off: PowerOff,
    },
    /// The policy-enabled trust rule: the node counts as fenced from `silent_since + wait`.
    SelfFence {
        /// The node's last renewal the controller observed (its own monotonic clock).
        silent_since: Mono,
        /// Advertised self-fence timeout + advertised watchdog timeout + the policy's margin.
        wait: Duration,
        /// What the agent advertised its self-fence kills.
        scope: Coverage,
        /// The heartbeat marker of that renewal (persisted: a restarted controller compares it
        /// with the Lease to learn whether the node renewed while it was down).
        marker: Option<String>,
    },
}

impl FencePlan {
    /// The plan as persisted in `NodeFence.status.plan` (monotonic times become wall-clock).
    pub fn to_status(&self, clocks: &Clocks) -> nodefence::FencePlan {
        nodefence::FencePlan {
            levels: self
                .levels
                .iter()
                .map(|l| match l {
                    PlanLevel::Hardware {
                        name,
                        devices,
                        power_off,
                    } => nodefence::PlannedLevel {
                        name: name.clone(),
                        kind: match power_off {
                            PowerOff::Allowed => LevelKind::Hardware,
                            PowerOff::Disallowed => LevelKind::StorageThenReset,
                        },
                        devices: devices.clone(),
                        trusted_after: None,
                        silent_since: None,
                        trust_wait_seconds: None,
                        self_fence_scope: None,
                        silent_marker: None,
                    },
                    PlanLevel::SelfFence {
                        silent_since,
                        wait,
                        scope,
                        marker,
                    } => nodefence::PlannedLevel {
                        name: "self-fence".into(),
                        kind: LevelKind::SelfFence,
                        devices: vec![],
                        trusted_after: Some(MicroTime(clocks.to_wall(*silent_since + *wait))),
                        silent_since: Some(MicroTime(clocks.to_wall(*silent_since))),
                        trust_wait_seconds: Some(
                            i64::try_from(wait.as_secs().max(1)).unwrap_or(i64::MAX),
                        ),
                        self_fence_scope: Some(*scope),
                        silent_marker: marker.clone(),
                    },
                })
                .collect(),
        }
    }
}

impl HoldReason {
    /// Stable metric label (`hold_<reason>` in [`Verdict::label`]).
    pub fn label(&self) -> &'static str {
        match self {
            HoldReason::NoPolicy => "no_policy",
            HoldReason::ConflictingPolicies { .. } => "conflicting_policies",
            HoldReason::InvalidPolicy { .. } => "invalid_policy",
            HoldReason::Paused { .. } => "paused",
            HoldReason::Excluded(Exclusion::OptOut) => "excluded_opt_out",
            HoldReason::Excluded(Exclusion::Maintenance) => "excluded_maintenance",
            HoldReason::NodeNotUnhealthy => "node_not_unhealthy",
            HoldReason::Cooldown { .. } => "cooldown",
            HoldReason::EscalationLimit { .. } => "escalation_limit",
            HoldReason::QuorumLost { .. } => "quorum_lost",
            HoldReason::HeartbeatsLate { .. } => "heartbeats_late",
            HoldReason::AllZonesDown { .. } => "all_zones_down",
            HoldReason::NotStateful => "not_stateful",
            HoldReason::NoFenceTarget => "no_fence_target",
            HoldReason::SelfFenceNotTrusted { .. } => "self_fence_not_trusted",
            HoldReason::BridgeHost => "bridge_host",
            HoldReason::InvalidFenceTarget { .. } => "invalid_fence_target",
            HoldReason::ConcurrencyLimit { .. } => "concurrency_limit",
            HoldReason::DomainLimit { .. } => "domain_limit",
            HoldReason::DryRun { .. } => "dry_run",
        }
    }

    /// Every hold label, for pre-registering metric series.
    pub const LABELS: [&'static str; 20] = [
        "no_policy",
        "conflicting_policies",
        "invalid_policy",
        "paused",
        "excluded_opt_out",
        "excluded_maintenance",
        "node_not_unhealthy",
        "cooldown",
        "escalation_limit",
        "quorum_lost",
        "heartbeats_late",
        "all_zones_down",
        "not_stateful",
        "no_fence_target",
        "self_fence_not_trusted",
        "bridge_host",
        "invalid_fence_target",
        "concurrency_limit",
        "domain_limit",
        "dry_run",
    ];
}

impl fmt::Display for HoldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldReason::NoPolicy => write!(f, "no FencingPolicy selects this node; Palisade reports but never fences it"),
            HoldReason::ConflictingPolicies { policies } => write!(f, "several FencingPolicies select this node ({}); not fencing until exactly one does", policies.join(", ")),
            HoldReason::InvalidPolicy { policy } => write!(f, "FencingPolicy {policy} is invalid; not fencing"),
            HoldReason::Paused { policy } => write!(f, "FencingPolicy {policy} is paused"),
            HoldReason::Excluded(Exclusion::OptOut) => write!(f, "the node opts out of fencing (annotation palisade.dev/exclude=true)"),
            HoldReason::Excluded(Exclusion::Maintenance) => write!(f, "the node is under maintenance (annotation palisade.dev/maintenance)"),
            HoldReason::NodeNotUnhealthy => write!(f, "manual fence requested, but the node is not Unhealthy (set overrides.nodeHealth to fence anyway)"),
            HoldReason::Cooldown { until } => write!(f, "the node was fenced recently; cooldown until {until}"),
            HoldReason::EscalationLimit { fences, window } => write!(f, "the node was fenced {fences} times within {}s; a person must decide (manual NodeFence with overrides.escalation)", window.as_secs()),
            HoldReason::QuorumLost { silent, total, allowed } => write!(f, "quorum guard: {silent} of {total} covered nodes are silent (at most {allowed} allowed); this controller may be the partitioned side"),
            HoldReason::HeartbeatsLate { silent, late, total, allowed } => write!(f, "quorum guard: {silent} of {total} covered nodes are silent and {late} more renewed late within the Unhealthy threshold (at most {allowed} allowed together); heartbeats are reaching the API server late (a starving API server or etcd), so silence is no evidence of death"),
            HoldReason::AllZonesDown { zones } => write!(f, "all {zones} zone(s) are fully silent; acting on nothing"),
            HoldReason::NotStateful => write!(f, "fenceWhen is StatefulOnly and no pod on the node uses a ReadWriteOnce volume"),
            HoldReason::NoFenceTarget => write!(f, "no FenceTarget level for this node and no trusted self-fence"),
            HoldReason::SelfFenceNotTrusted { why } => write!(f, "no FenceTarget level for this node, and its self-fence is not trusted: {why}"),
            HoldReason::BridgeHost => write!(f, "this node hosts the firmware-bridge and every level of its FenceTarget goes through the bridge; give it a direct level (IPMI, PDU or storage firewall)"),
            HoldReason::InvalidFenceTarget { problems } => write!(f, "the node's FenceTarget is invalid ({problems} problem(s))"),
            HoldReason::ConcurrencyLimit { in_flight, max } => write!(f, "{in_flight} fence(s) in flight, maxConcurrent is {max}"),
            HoldReason::DomainLimit { domain, in_flight, max } => write!(f, "{in_flight} fence(s) in flight in domain {domain:?}, perDomain.maxConcurrent is {max}"),
            HoldReason::DryRun { would } => write!(f, "dryRun: would fence with {} level(s)", would.levels.len()),
        }
    }
}

impl Verdict {
    /// Stable metric label: `fence`, `wait_suspect`, `wait_after_quorum_guard`,
    /// `wait_forgiveness`, or `hold_<reason>`.
    pub fn label(&self) -> String {
        match self {
            Verdict::Fence(_) => "fence".into(),
            Verdict::Wait {
                reason: WaitReason::Suspect,
                ..
            } => "wait_suspect".into(),
            Verdict::Wait {
                reason: WaitReason::AfterQuorumGuard,
                ..
            } => "wait_after_quorum_guard".into(),
            Verdict::Wait {
                reason: WaitReason::Forgiveness { .. },
                ..
            } => "wait_forgiveness".into(),
            Verdict::Hold(h) => format!("hold_{}", h.label()),
        }
    }

    /// Human message for Events and status.
    pub fn message(&self) -> String {
        match self {
            Verdict::Fence(p) => format!(
                "fencing {} with {} level(s) (policy {}, forgiveness {}s{}){}",
                p.node,
                p.levels.len(),
                p.policy,
                p.forgiveness.as_secs(),
                if p.pdb_urgent {
                    ", shortened: a PDB allows no disruption"
                } else {
                    ""
                },
                p.cause.words()
            ),
            Verdict::Wait {
                reason: WaitReason::Suspect,
                ..
            } => "the node is silent (Suspect); waiting for the Unhealthy threshold".into(),
            Verdict::Wait {
                reason: WaitReason::AfterQuorumGuard,
                ..
            } => "the quorum guard held until recently (a control-plane outage): the node gets \
                  the Unhealthy threshold counted from then"
                .into(),
            Verdict::Wait {
                reason:
                    WaitReason::Forgiveness {
                        forgiveness,
                        pdb_urgent,
                    },
                ..
            } => format!(
                "the node is Unhealthy; waiting out pod forgiveness of {}s{}",
                forgiveness.as_secs(),
                if *pdb_urgent {
                    " (shortened: a PDB allows no disruption)"
                } else {
                    ""
                }
            ),
            Verdict::Hold(h) => h.to_string(),
        }
    }

    /// Whether this verdict fences.
    pub fn is_fence(&self) -> bool {
        matches!(self, Verdict::Fence(_))
    }

    /// The verdict as recorded in `NodeFence.status.verdict`.
    pub fn record(&self, at: Timestamp) -> nodefence::VerdictRecord {
        nodefence::VerdictRecord {
            label: self.label(),
            message: self.message(),
            at: MicroTime(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> FencePlan {
        FencePlan {
            node: "m0".into(),
            policy: "p".into(),
            requested_by: RequestedBy::Controller,
            levels: vec![],
            priority: 0,
            forgiveness: Duration::ZERO,
            pdb_urgent: false,
            cause: Cause::Silence,
        }
    }

    #[test]
    fn every_hold_reason_has_a_listed_distinct_label_and_a_message() {
        let t = Timestamp::UNIX_EPOCH;
        let all = vec![
            HoldReason::NoPolicy,
            HoldReason::ConflictingPolicies {
                policies: vec!["a".into(), "b".into()],
            },
            HoldReason::InvalidPolicy { policy: "p".into() },
            HoldReason::Paused { policy: "p".into() },
            HoldReason::Excluded(Exclusion::OptOut),
            HoldReason::Excluded(Exclusion::Maintenance),
            HoldReason::NodeNotUnhealthy,
            HoldReason::Cooldown { until: t },
            HoldReason::EscalationLimit {
                fences: 3,
                window: Duration::from_secs(60),
            },
            HoldReason::QuorumLost {
                silent: 3,
                total: 5,
                allowed: 2,
            },
            HoldReason::HeartbeatsLate {
                silent: 1,
                late: 2,
                total: 5,
                allowed: 2,
            },
            HoldReason::AllZonesDown { zones: 2 },
            HoldReason::NotStateful,
            HoldReason::NoFenceTarget,
            HoldReason::SelfFenceNotTrusted {
                why: "no watchdog".into(),
            },
            HoldReason::BridgeHost,
            HoldReason::InvalidFenceTarget { problems: 1 },
            HoldReason::ConcurrencyLimit {
                in_flight: 1,
                max: 1,
            },
            HoldReason::DomainLimit {
                domain: "a".into(),
                in_flight: 1,
                max: 1,
            },
            HoldReason::DryRun {
                would: Box::new(plan()),
            },
        ];
        let labels: Vec<&str> = all.iter().map(HoldReason::label).collect();
        assert_eq!(labels, HoldReason::LABELS.to_vec());
        for h in &all {
            let v = Verdict::Hold(h.clone());
            assert_eq!(v.label(), format!("hold_{}", h.label()));
            assert!(!v.message().is_empty());
            assert_eq!(v.record(t).label, v.label());
        }
        assert_eq!(Verdict::Fence(plan()).label(), "fence");
    }
}
