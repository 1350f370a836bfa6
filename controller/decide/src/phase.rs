//! The `NodeFence` state machine as a pure function: given the persisted status and what the
//! controller observes now, what is the one next step?
//!
//! The I/O controller performs the step, records its result in the status (through the
//! `NodeFenceStatus` methods), persists it, and asks again. Because the next step is computed
//! only from persisted facts plus fresh observations, a restarted or new leader resumes exactly
//! where the last one stopped.
//!
//! Guarantees:
//! - a leader whose token is lower than the recorded one gets [`Step::Refuse`] and nothing else;
//! - every action step (device or API mutation) happens under the recorded token, after
//!   [`Step::RecordToken`] has persisted ours;
//! - release steps carry a [`VerifiedFence`], which only a status with a level verified *with
//!   evidence* can produce, so release is unreachable without a verified fence;
//! - when every level has failed the step is `Fail(AllLevelsFailed)` and nothing was released
//!   (release begins only after Fenced);
//! - a phase whose time budget has run out fails; terminal phases yield [`Step::Nothing`].

use k8s_openapi::jiff::Timestamp;
use palisade_model::nodefence::{
    FailureReason, LevelKind, NodeFenceSpec, NodeFenceStatus, Phase, PlannedDevice, RequestedBy,
    VerifiedFence,
};
use palisade_model::policy::{Recovery, UntaintWhen};
use palisade_model::target::DeviceKind;

use crate::clock::Clocks;
use crate::verdict::{HoldReason, Verdict};

/// A Kubernetes object the controller will release, identified for a UID-precondition delete.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectRef {
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (the delete precondition).
    pub uid: String,
}

/// What the controller observes now, besides the persisted status.
#[derive(Debug, Clone)]
pub struct Observations<'a> {
    /// Both clocks.
    pub now: Clocks,
    /// The token of our current leadership term.
    pub token: i64,
    /// The decision for this node (used while Pending).
    pub verdict: Option<&'a Verdict>,
    /// The node's policy recovery rule (`None`: no policy now; recovery waits).
    pub recovery: Option<&'a Recovery>,
    /// Pods still bound to the node (not yet deleted).
    pub pods_on_node: Vec<ObjectRef>,
    /// VolumeAttachments still naming the node.
    pub attachments: Vec<ObjectRef>,
    /// PVs whose attach record still names the node (`name` = PV name).
    pub attach_records: Vec<ObjectRef>,
    /// The detector sees the node Healthy again (fresh Lease renewals observed).
    pub node_healthy: bool,
    /// The node agent reports it runs no stale pods.
    pub agent_clean: bool,
    /// The out-of-service taint is present on the node.
    pub taint_present: bool,
}

/// What is being waited for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitFor {
    /// Pending: no decision was supplied.
    Decision,
    /// Pending: the decision waits (Suspect, forgiveness).
    Verdict(String),
    /// Fencing: the self-fence level's trust time.
    SelfFence,
    /// Released: the policy leaves the node off; nothing to do until it comes back.
    NodeLeftOff,
    /// Recovering: the node agent must renew its Lease and report no stale pods.
    Rejoin,
    /// Recovering: `untaintWhen: Manual`; a person removes the taint.
    ManualUntaint,
    /// Recovering: no policy covers the node now.
    Policy,
}

/// The one next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Terminal phase: nothing to do.
    Nothing,
    /// Our token is lower than the recorded one: we are deposed; act on nothing.
    Refuse {
        /// Our token.
        ours: i64,
        /// The recorded token.
        recorded: i64,
    },
    /// Persist our (higher) token in the status before any action.
    RecordToken(i64),
    /// Pending and the decision holds: record the reason, emit an Event, stay.
    Hold(HoldReason),
    /// Nothing to do before `until` (if known); requeue.
    Wait {
        /// What it waits for.
        why: WaitFor,
        /// When to look again, if known.
        until: Option<Timestamp>,
    },
    /// Pending, controller-requested, and the node is healthy again: Pending → Done, nothing was done.
    Cancel,
    /// Pending → Fencing: persist this plan and the token.
    StartFencing {
        /// The plan to persist.
        plan: palisade_model::nodefence::FencePlan,
        /// The token to persist.
        token: i64,
    },
    /// Run one hardware level: command every device, then verify; record each attempt, then
    /// the level as verified (with evidence) or failed.
    RunLevel {
        /// Plan level index.
        level: i32,
        /// Its devices.
        devices: Vec<PlannedDevice>,
    },
    /// The self-fence trust time has passed: record the level verified with
    /// `SelfFenceTimeout` evidence.
    TrustSelfFence {
        /// Plan level index.
        level: i32,
    },
    /// A bookkeeping transition with no side effect (Fencing → Fenced, Fenced → Releasing,
    /// Releasing → Released, Released → Recovering, Recovering → Done).
    Enter(Phase),
    /// Enter Failed for this reason.
    Fail(FailureReason),
    /// Release 1: taint the node `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`.
    ApplyTaint(VerifiedFence),
    /// Release 2: mark the pod fenced, patch it Failed, DELETE it with grace 0 and UID precondition.
    ReleasePod(VerifiedFence, ObjectRef),
    /// Release 3: DELETE a VolumeAttachment (UID precondition), once no pod of the node remains.
    DeleteAttachment(VerifiedFence, ObjectRef),
    /// Release 4: clear a PV's attach record.
    ClearAttachRecord(VerifiedFence, ObjectRef),
    /// Recover: power the node on through these devices (every power device of every tried level).
    PowerOn(Vec<PlannedDevice>),
    /// Recover: lift the storage fence on these devices (every storage device of every tried level).
    Unfence(Vec<PlannedDevice>),
    /// Recover: remove the out-of-service taint.
    RemoveTaint,
}

impl Step {
    /// Stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Step::Nothing => "nothing",
            Step::Refuse { .. } => "refuse_stale_token",
            Step::RecordToken(_) => "record_token",
            Step::Hold(_) => "hold",
            Step::Wait { .. } => "wait",
            Step::Cancel => "cancel",
            Step::StartFencing { .. } => "start_fencing",
            Step::RunLevel { .. } => "run_level",
            Step::TrustSelfFence { .. } => "trust_self_fence",
            Step::Enter(_) => "enter",
            Step::Fail(_) => "fail",
            Step::ApplyTaint(_) => "apply_taint",
            Step::ReleasePod(..) => "release_pod",
            Step::DeleteAttachment(..) => "delete_attachment",
            Step::ClearAttachRecord(..) => "clear_attach_record",
            Step::PowerOn(_) => "power_on",
            Step::Unfence(_) => "unfence",
            Step::RemoveTaint => "remove_taint",
        }
    }

    /// Whether the step changes anything outside the status (devices or API objects).
    pub fn is_action(&self) -> bool {
        matches!(
            self,
            Step::RunLevel { .. }
                | Step::ApplyTaint(_)
                | Step::ReleasePod(..)
                | Step::DeleteAttachment(..)
                | Step::ClearAttachRecord(..)
                | Step::PowerOn(_)
                | Step::Unfence(_)
                | Step::RemoveTaint
        )
    }
}

/// The next step for a `NodeFence` with `spec` and persisted `status`.
pub fn next_step(spec: &NodeFenceSpec, status: &NodeFenceStatus, obs: &Observations<'_>) -> Step {
    let phase = status.phase;
    if phase.is_terminal() {
        return Step::Nothing;
    }
    if let Some(recorded) = status.fencing_token {
        if obs.token < recorded {
            return Step::Refuse {
                ours: obs.token,
                recorded,
            };
        }
    }
    if phase == Phase::Pending {
        return pending(spec, obs);
    }
    if status.fencing_token != Some(obs.token) {
        return Step::RecordToken(obs.token);
    }
    if let Some(deadline) = status.deadline() {
        if obs.now.wall > deadline {
            return Step::Fail(FailureReason::BudgetExceeded);
        }
    }
    if phase == Phase::Fencing {
        return fencing(status, obs);
    }
    // Every later phase requires the proof.
    let Some(proof) = status.verified_fence() else {
        return Step::Fail(FailureReason::NoVerifiedFence);
    };
    match phase {
        Phase::Fenced => Step::Enter(Phase::Releasing),
        Phase::Releasing => releasing(status, obs, proof),
        Phase::Released => {
            let power_on = obs.recovery.is_some_and(|r| r.power_on);
            if power_on || obs.node_healthy {
                Step::Enter(Phase::Recovering)
            } else {
                Step::Wait {
                    why: WaitFor::NodeLeftOff,
                    until: None,
                }
            }
        }
        Phase::Recovering => recovering(status, obs),
        Phase::Pending | Phase::Fencing | Phase::Done | Phase::Failed => Step::Nothing,
    }
}

fn pending(spec: &NodeFenceSpec, obs: &Observations<'_>) -> Step {
    if spec.requested_by == RequestedBy::Controller && obs.node_healthy {
        return Step::Cancel;
    }
    match obs.verdict {
        None => Step::Wait {
            why: WaitFor::Decision,
            until: None,
        },
        Some(Verdict::Hold(reason)) => Step::Hold(reason.clone()),
        Some(v @ Verdict::Wait { until, .. }) => Step::Wait {
            why: WaitFor::Verdict(v.label()),
            until: Some(obs.now.to_wall(*until)),
        },
        Some(Verdict::Fence(plan)) => Step::StartFencing {
            plan: plan.to_status(&obs.now),
            token: obs.token,
        },
    }
}

fn fencing(status: &NodeFenceStatus, obs: &Observations<'_>) -> Step {
    let Some(plan) = status.plan.as_ref().filter(|p| !p.levels.is_empty()) else {
        return Step::Fail(FailureReason::NoPlan);
    };
    if status.verified_fence().is_some() {
        return Step::Enter(Phase::Fenced);
    }
    let Some(level) = status.next_level() else {
        return Step::Fail(FailureReason::AllLevelsFailed);
    };
    let Some(planned) = usize::try_from(level).ok().and_then(|i| plan.levels.get(i)) else {
        return Step::Fail(FailureReason::NoPlan);
    };
    match planned.kind {
        LevelKind::Hardware if planned.devices.is_empty() => Step::Fail(FailureReason::NoPlan),
        LevelKind::Hardware => Step::RunLevel {
            level,
            devices: planned.devices.clone(),
        },
        LevelKind::SelfFence => match &planned.trusted_after {
            None => Step::Fail(FailureReason::NoPlan),
            Some(t) if obs.now.wall >= t.0 => Step::TrustSelfFence { level },
            Some(t) => Step::Wait {
                why: WaitFor::SelfFence,
                until: Some(t.0),
            },
        },
    }
}

fn releasing(status: &NodeFenceStatus, obs: &Observations<'_>, proof: VerifiedFence) -> Step {
    if status.release.tainted_at.is_none() {
        return Step::ApplyTaint(proof);
    }
    if let Some(pod) = obs.pods_on_node.iter().min() {
        return Step::ReleasePod(proof, pod.clone());
    }
    // Only once no pod of the node remains (so none uses a volume) are attachments broken.
    if let Some(va) = obs.attachments.iter().min() {
        return Step::DeleteAttachment(proof, va.clone());
    }
    if let Some(pv) = obs.attach_records.iter().min() {
        return Step::ClearAttachRecord(proof, pv.clone());
    }
    Step::Enter(Phase::Released)
}

/// Devices of `kind` in every level that was tried (concluded), deduplicated by URL.
///
/// A failed level may still have blocked the node at the storage or cut its power (one device
/// succeeded, another did not), so recovery reverses every tried level, not only the verified
/// one. Power-on and unblock are idempotent.
fn tried_devices(status: &NodeFenceStatus, kind: DeviceKind) -> Vec<PlannedDevice> {
    let Some(plan) = status.plan.as_ref() else {
        return vec![];
    };
    let mut out: Vec<PlannedDevice> = Vec::new();
    for outcome in &status.levels {
        let level = usize::try_from(outcome.level)
            .ok()
            .and_then(|i| plan.levels.get(i));
        for d in level.iter().flat_map(|l| &l.devices) {
            if d.kind == kind && !out.iter().any(|o| o.url == d.url) {
                out.push(d.clone());
            }
        }
    }
    out
}

fn recovering(status: &NodeFenceStatus, obs: &Observations<'_>) -> Step {
    let Some(recovery) = obs.recovery else {
        return Step::Wait {
            why: WaitFor::Policy,
            until: None,
        };
    };
    let rec = &status.recovery;
    if recovery.power_on && rec.powered_on_at.is_none() {
        let power = tried_devices(status, DeviceKind::Power);
        if !power.is_empty() {
            return Step::PowerOn(power);
        }
    }
    if !(obs.node_healthy && obs.agent_clean) {
        return Step::Wait {
            why: WaitFor::Rejoin,
            until: None,
        };
    }
    if rec.unfenced_at.is_none() {
        let storage = tried_devices(status, DeviceKind::Storage);
        if !storage.is_empty() {
            return Step::Unfence(storage);
        }
    }
    match recovery.untaint_when {
        UntaintWhen::NodeReady if obs.taint_present => Step::RemoveTaint,
        UntaintWhen::Manual if obs.taint_present => Step::Wait {
            why: WaitFor::ManualUntaint,
            until: None,
        },
        UntaintWhen::NodeReady | UntaintWhen::Manual => Step::Enter(Phase::Done),
    }
}
