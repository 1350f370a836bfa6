//! The application of a [`Step`] to a `NodeFence`'s status: the one place where what a step
//! did becomes the fence's record, shared by the operator and the simulation.
//!
//! [`next_step`](crate::phase::next_step) says what to do; the caller does the I/O (a device
//! command, a pod deletion, a taint) and hands what the world answered to [`apply`], which
//! changes the status and says what to tell: the Event, the fence metric, the phase left. The
//! operator persists the status and then tells; the simulation keeps it in memory. Neither
//! writes a status field of its own, so the simulation proves the record the operator keeps.
//!
//! Guarantees:
//! - a level is recorded verified only with evidence of that level (a run that reports no
//!   failure and no evidence is recorded failed: nothing is released on it);
//! - a recovery action's time is recorded only when it succeeded;
//! - every transition goes through the status's state machine (an illegal one is an error and
//!   changes nothing the caller persists).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use palisade_model::nodefence::{
    DeviceAttempt, Evidence, EvidenceKind, FailureReason, NodeFenceStatus, Phase, PowerRecheck,
    RecheckedPower, ReleasedObject, StatusError, VerdictRecord,
};

use crate::phase::{ObjectRef, ReleaseTaints, Step, POWER_REREADS, POWER_REREAD_RETRY};

/// The prefix of the verdict labels a fence records while it waits to fence (a self-fence, a
/// healthy majority): a budget that runs out names what it waited for.
pub const FENCING_WAIT: &str = "fencing_wait_";

/// What the devices of one level did ([`Step::RunLevel`]).
#[derive(Debug, Clone, Default)]
pub struct LevelRun {
    /// Every attempt, in order.
    pub attempts: Vec<DeviceAttempt>,
    /// Evidence, one per verified device.
    pub evidence: Vec<Evidence>,
    /// `None` when every device was verified; otherwise why the level failed.
    pub failure: Option<String>,
    /// For a level that resets instead of powering off: the resets that were not accepted
    /// (they do not fail the level, whose proof is the storage block).
    pub resets_failed: Vec<String>,
}

/// What the world answered to the step being applied: the result of its I/O.
#[derive(Debug, Clone, Default)]
pub enum Answer {
    /// A step with no I/O, or whose I/O returns nothing the record keeps.
    #[default]
    Nothing,
    /// [`Step::StartFencing`]: the node's boot ID when the fence starts (what recovery waits
    /// to see change) and the verdict that started it.
    Started {
        /// The boot ID the node last advertised.
        boot_id: Option<String>,
        /// The verdict's label and message.
        verdict: Option<(String, String)>,
    },
    /// [`Step::RunLevel`].
    Level(LevelRun),
    /// [`Step::RecheckPower`]: each device's read.
    Power(Vec<PowerRecheck>),
    /// [`Step::PowerOn`] or [`Step::Unfence`]: the attempts and whether the action succeeded
    /// (else why not).
    Recovery {
        /// Every attempt, in order.
        attempts: Vec<DeviceAttempt>,
        /// `Ok` when every device did it.
        result: Result<(), String>,
    },
    /// [`Step::RemoveTaint`]: the release taints that stay on the node (not this fence's).
    Untainted {
        /// Their keys.
        left: Vec<String>,
    },
}

/// The facts about the fence a record needs besides its status.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The fenced node.
    pub node: &'a str,
    /// When the step's result is recorded.
    pub at: Timestamp,
    /// The fencing token the step ran under.
    pub token: i64,
    /// The controller replica that records it.
    pub leader: &'a str,
    /// The fence's recovery challenge (its UID).
    pub challenge: &'a str,
    /// The release taints on the node that this fence did not add (named when it is done).
    pub kept_taints: &'a [String],
}

/// An Event to tell once the record is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// A warning (else normal).
    pub warning: bool,
    /// The Event's reason.
    pub reason: &'static str,
    /// The Event's message.
    pub message: String,
}

/// What [`apply`] did besides changing the status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// The status changed: persist it.
    pub changed: bool,
    /// What to tell, after the status is persisted.
    pub note: Option<Note>,
    /// The fence outcome to count (`cancelled`, `released`, `done`, `failed`).
    pub outcome: Option<&'static str>,
    /// The phase the fence left and when it had entered it.
    pub left: Option<(Phase, Timestamp)>,
}

impl Record {
    fn changed(note: Option<Note>) -> Self {
        Self {
            changed: true,
            note,
            ..Self::default()
        }
    }
}

fn normal(reason: &'static str, message: String) -> Option<Note> {
    Some(Note {
        warning: false,
        reason,
        message,
    })
}

fn warning(reason: &'static str, message: String) -> Option<Note> {
    Some(Note {
        warning: true,
        reason,
        message,
    })
}

/// The record of a released object at `at`.
pub fn released(o: &ObjectRef, at: Timestamp) -> ReleasedObject {
    ReleasedObject {
        namespace: o.namespace.clone(),
        name: o.name.clone(),
        uid: o.uid.clone(),
        at: MicroTime(at),
    }
}

/// The write-ahead record of a pod release: the status names `pod` before its deletion is
/// sent, so a controller that dies after the deletion leaves a record the next one completes
/// ([`Step::RecordReleased`]).
pub fn intend_release(status: &mut NodeFenceStatus, pod: &ObjectRef, at: Timestamp) {
    status.release.releasing = Some(released(pod, at));
}

/// Whether `pod`'s release intent is already recorded.
pub fn release_intended(status: &NodeFenceStatus, pod: &ObjectRef) -> bool {
    status.release.releasing.as_ref().map(|r| r.uid.as_str()) == Some(pod.uid.as_str())
}

/// Applies `step`, whose I/O answered `answer`, to `status`.
///
/// Steps that record nothing ([`Step::Nothing`], [`Step::Refuse`], [`Step::Hold`],
/// [`Step::Wait`]: the caller records its own waits) return an unchanged [`Record`].
///
/// Guarantees: see the module. Assumptions: `answer` is the one that belongs to `step` (any
/// other is read as [`Answer::Nothing`]: a level without its run is recorded failed, a
/// recovery action without its result not done).
pub fn apply(
    status: &mut NodeFenceStatus,
    step: &Step,
    answer: Answer,
    facts: Facts<'_>,
) -> Result<Record, StatusError> {
    let Facts {
        node,
        at,
        token,
        leader,
        challenge,
        kept_taints,
    } = facts;
    let record = match step {
        Step::Nothing | Step::Refuse { .. } | Step::Hold(_) | Step::Wait { .. } => {
            Record::default()
        }
        Step::PinNode(pinned) => {
            status.pinned = Some(pinned.clone());
            Record::changed(None)
        }
        Step::RecordToken(t) => {
            status.fencing_token = Some(*t);
            Record::changed(normal(
                "TokenRecorded",
                format!("leader {leader} resumes with fencing token {t}"),
            ))
        }
        Step::Supersede(older) => {
            let msg = format!(
                "NodeFence {older} for node {node} is older and unfinished: only it acts; this one does nothing"
            );
            status.superseded_by = Some(older.clone());
            status.fail(FailureReason::Superseded, at, msg.clone())?;
            Record::changed(warning("Superseded", msg))
        }
        Step::Cancel => {
            let left = enter(
                status,
                Phase::Done,
                at,
                format!("node {node} renewed its heartbeat again before anything was done; cancelled"),
            )?;
            Record {
                changed: true,
                note: normal(
                    "Cancelled",
                    format!("node {node} is healthy again; nothing was done"),
                ),
                outcome: Some("cancelled"),
                left,
            }
        }
        Step::StartFencing { plan, token: t } => {
            let Answer::Started { boot_id, verdict } = answer else {
                return Ok(Record::default());
            };
            let levels: Vec<&str> = plan.levels.iter().map(|l| l.name.as_str()).collect();
            let msg = format!("fencing node {node} with levels {levels:?} under token {t}");
            status.plan = Some(plan.clone());
            status.recovery.boot_id_at_fence = boot_id;
            status.fencing_token = Some(*t);
            if let Some((label, message)) = verdict {
                status.verdict = Some(VerdictRecord {
                    label,
                    message,
                    at: MicroTime(at),
                });
            }
            let left = enter(status, Phase::Fencing, at, msg.clone())?;
            Record {
                changed: true,
                note: normal("Fencing", msg),
                outcome: None,
                left,
            }
        }
        Step::RunLevel { level, reset, .. } => {
            let run = match answer {
                Answer::Level(run) => run,
                _ => LevelRun {
                    failure: Some("no answer from the level's devices".into()),
                    ..LevelRun::default()
                },
            };
            status.attempts.extend(run.attempts);
            let failure = run.failure.or_else(|| {
                run.evidence
                    .is_empty()
                    .then(|| "no device gave evidence".to_string())
            });
            match failure {
                None => {
                    let mut msg = format!(
                        "level {level} verified: {}",
                        run.evidence
                            .iter()
                            .map(|e| e.observed.as_str())
                            .collect::<Vec<_>>()
                            .join("; ")
                    );
                    if *reset {
                        msg.push_str(&if run.resets_failed.is_empty() {
                            "; the machine was reset, not powered off (recovery waits for a new boot ID)".to_string()
                        } else {
                            format!(
                                "; reset not accepted ({}): the storage block stays until the node reports a new boot ID",
                                run.resets_failed.join("; ")
                            )
                        });
                    }
                    status.record_level_verified(*level, run.evidence, at, msg.clone())?;
                    Record::changed(normal("LevelVerified", msg))
                }
                Some(why) => fail_level(status, *level, &why, at)?,
            }
        }
        Step::TrustSelfFence { level } => {
            let observed =
                format!("node {node} silent past its advertised self-fence timeout plus margin");
            let evidence = vec![Evidence {
                level: *level,
                device: String::new(),
                kind: EvidenceKind::SelfFenceTimeout,
                observed: observed.clone(),
                at: MicroTime(at),
            }];
            status.record_level_verified(*level, evidence, at, observed.clone())?;
            Record::changed(normal("LevelVerified", observed))
        }
        Step::Enter(phase) => {
            let msg = match phase {
                Phase::Fenced => format!("node {node} is verified fenced"),
                Phase::Releasing => format!("releasing node {node}'s pods and volumes"),
                Phase::Released => format!(
                    "node {node} released: {} pod(s), {} VolumeAttachment(s)",
                    status.release.pods.len(),
                    status.release.attachments.len()
                ),
                Phase::Recovering => format!("recovering node {node}"),
                Phase::Done if !kept_taints.is_empty() => format!(
                    "node {node} recovered; release taint(s) {} stay: this fence did not add them",
                    kept_taints.join(", ")
                ),
                Phase::Done => format!("node {node} recovered"),
                other => format!("entered {}", other.as_str()),
            };
            let left = enter(status, *phase, at, msg.clone())?;
            Record {
                changed: true,
                note: normal(phase.as_str(), msg),
                outcome: match phase {
                    Phase::Released => Some("released"),
                    Phase::Done => Some("done"),
                    _ => None,
                },
                left,
            }
        }
        Step::Fail(reason) => {
            let msg = failure_message(status, node, *reason);
            status.fail(*reason, at, msg.clone())?;
            Record {
                changed: true,
                note: warning("FenceFailed", msg),
                outcome: Some("failed"),
                left: None,
            }
        }
        Step::RestartSelfFenceWait {
            level,
            silent_since,
            trusted_after,
            marker,
        } => {
            let planned = status.plan.as_mut().and_then(|p| {
                p.levels
                    .get_mut(usize::try_from(*level).unwrap_or(usize::MAX))
            });
            let Some(planned) = planned else {
                return Ok(Record::default());
            };
            planned.silent_since = Some(MicroTime(*silent_since));
            planned.silent_marker = marker.clone();
            planned.trusted_after = Some(MicroTime(*trusted_after));
            Record::changed(normal(
                "SelfFenceWaitRestarted",
                format!("node {node} renewed at {silent_since} during the self-fence wait; its self-fence is trusted from {trusted_after} at the earliest"),
            ))
        }
        Step::FailLevel { level, why } => fail_level(status, *level, why, at)?,
        Step::HoldPod(pod) => {
            let coverage = status
                .verified_fence()
                .map(|v| v.coverage().as_str())
                .unwrap_or("nothing");
            let msg = format!(
                "pod {}/{} (uid {}) is NOT released: the verified fence covers {coverage} pods and this pod mounts no PersistentVolumeClaim, so it may still run on {node}",
                pod.namespace, pod.name, pod.uid
            );
            status.release.held.push(released(pod, at));
            Record::changed(warning("NotCoveredByFence", msg))
        }
        Step::RecordCleanProof(proof) => {
            status.recovery.clean_proof = Some(proof.clone());
            Record::changed(normal("ReleasedPodsGone", format!("node {node}: {proof}")))
        }
        Step::PostChallenge => Record {
            changed: false,
            note: normal(
                "RecoveryChallengePosted",
                format!("node {node}: recovery challenge {challenge} posted; the node's agent must answer it with a runtime inventory that lists none of the released pods"),
            ),
            ..Record::default()
        },
        Step::ApplyTaint(_, which) => {
            which.record(&mut status.release, MicroTime(at));
            let taints = match which {
                ReleaseTaints::OutOfService => "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute (every pod on it released by this fence)",
                ReleaseTaints::NoSchedule => "palisade.dev/fenced:NoSchedule",
            };
            Record::changed(normal("Tainted", format!("node {node} tainted {taints}")))
        }
        Step::ReleasePod(_, pod) => record_released(status, pod, at, "marked Failed and deleted with grace 0"),
        Step::RecordReleased(pod) => record_released(
            status,
            pod,
            at,
            "is gone: its release, started before a leader change, is recorded",
        ),
        Step::DeleteAttachment(_, va) => {
            status.release.attachments.push(released(va, at));
            Record::changed(normal(
                "AttachmentReleased",
                format!("VolumeAttachment {} (uid {}) deleted", va.name, va.uid),
            ))
        }
        Step::ClearAttachRecord(_, record) => {
            status.release.attach_records.push(released(record, at));
            Record::changed(normal(
                "AttachRecordCleared",
                format!(
                    "volume {} removed from node {node}'s volumesInUse (the node is fenced and mounts nothing)",
                    record.name
                ),
            ))
        }
        Step::PowerOn(_) | Step::Unfence(_) => {
            let power_on = matches!(step, Step::PowerOn(_));
            let (attempts, result) = match answer {
                Answer::Recovery { attempts, result } => (attempts, result),
                _ => (Vec::new(), Err("no answer from the devices".to_string())),
            };
            status.attempts.extend(attempts);
            let note = match (&result, power_on) {
                (Ok(()), true) => normal("PoweredOn", format!("node {node} powered on")),
                (Ok(()), false) => {
                    normal("Unfenced", format!("node {node}'s storage fence lifted"))
                }
                (Err(e), true) => warning("PowerOnFailed", e.clone()),
                (Err(e), false) => warning("UnfenceFailed", e.clone()),
            };
            if result.is_ok() {
                let mark = if power_on {
                    &mut status.recovery.powered_on_at
                } else {
                    &mut status.recovery.unfenced_at
                };
                *mark = Some(MicroTime(at));
            }
            Record::changed(note)
        }
        Step::RecheckPower(_) => {
            let Answer::Power(read) = answer else {
                return Ok(Record::default());
            };
            let said = read
                .iter()
                .map(|r| r.observed.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            let note = if read.iter().all(|r| r.state == RecheckedPower::Off) {
                normal("PowerRechecked", format!("node {node}: power re-read before releasing under fencing token {token}: {said}"))
            } else if read.iter().any(|r| r.state == RecheckedPower::On) {
                warning("PowerOnBeforeRelease", format!("node {node} is powered on again since its fence was verified ({said}); nothing more is released and the fence fails (PowerNotOff)"))
            } else {
                warning("PowerUnreadable", format!("node {node}: a power device could not be read before releasing ({said}); nothing is released on doubt: it is read again in {} s, at most {POWER_REREADS} times under fencing token {token}, then the fence fails (PowerNotOff)", POWER_REREAD_RETRY.as_secs()))
            };
            status.release.power_rechecks.extend(read);
            Record::changed(note)
        }
        Step::RemoveTaint => {
            let left = match answer {
                Answer::Untainted { left } => left,
                _ => Vec::new(),
            };
            status.recovery.untainted_at = Some(MicroTime(at));
            let mut msg = format!("the release taints this fence added were removed from node {node}; the storage block stays until the untaint has settled");
            if !left.is_empty() {
                msg.push_str(&format!(
                    "; taint(s) {} stay: this fence did not add them",
                    left.join(", ")
                ));
            }
            Record::changed(normal("Untainted", msg))
        }
        Step::RecordUntaintObserved => {
            status.recovery.untaint_observed_at = Some(MicroTime(at));
            Record::changed(normal(
                "UntaintObserved",
                format!("node {node} carries no release taint of this fence and no out-of-service taint; the storage block is lifted once its VolumeAttachments have settled and {} s have passed", crate::phase::UNTAINT_SETTLE_MARGIN.as_secs()),
            ))
        }
    };
    Ok(record)
}

/// A transition that returns the phase left and when it was entered.
fn enter(
    status: &mut NodeFenceStatus,
    to: Phase,
    at: Timestamp,
    message: String,
) -> Result<Option<(Phase, Timestamp)>, StatusError> {
    let from = status.phase;
    let entered = status.entered_at();
    status.transition(to, at, message)?;
    Ok(entered.map(|e| (from, e)))
}

fn fail_level(
    status: &mut NodeFenceStatus,
    level: i32,
    why: &str,
    at: Timestamp,
) -> Result<Record, StatusError> {
    let msg = format!("level {level} failed: {why}");
    status.record_level_failed(level, at, msg.clone())?;
    Ok(Record::changed(warning("LevelFailed", msg)))
}

fn record_released(
    status: &mut NodeFenceStatus,
    pod: &ObjectRef,
    at: Timestamp,
    what: &str,
) -> Record {
    status.release.releasing = None;
    status.release.pods.push(released(pod, at));
    Record::changed(normal(
        "PodReleased",
        format!(
            "pod {}/{} (uid {}) {what}",
            pod.namespace, pod.name, pod.uid
        ),
    ))
}

/// Why the fence failed, in words an operator can act on.
fn failure_message(status: &NodeFenceStatus, node: &str, reason: FailureReason) -> String {
    match reason {
        FailureReason::AllLevelsFailed => format!(
            "every fencing level failed for node {node}; NOTHING was released: {}{}",
            status
                .levels
                .iter()
                .map(|l| l.message.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            dark_advice(node, &status.dark_power_devices())
        ),
        // What the fence was waiting for when its budget ran out (recorded by the wait itself).
        FailureReason::BudgetExceeded => match status
            .verdict
            .as_ref()
            .filter(|v| v.label.starts_with(FENCING_WAIT))
        {
            Some(v) => format!(
                "fence of node {node} failed: BudgetExceeded while {}",
                v.message
            ),
            None => format!("fence of node {node} failed: BudgetExceeded"),
        },
        FailureReason::PowerNotOff => format!(
            "fence of node {node} failed: PowerNotOff: before a release its power device read on, or could not be read {POWER_REREADS} times; nothing more is released: {}",
            status
                .release
                .power_rechecks
                .last()
                .map(|r| r.observed.as_str())
                .unwrap_or_default()
        ),
        other => format!("fence of node {node} failed: {}", other.as_str()),
    }
}

/// What an operator must know when a fence failed with power devices that gave no answer
/// (`dark`, from [`NodeFenceStatus::dark_power_devices`]): empty when none did.
///
/// Guarantees: never suggests that a dark device proves anything; names every dark device and
/// the two ways on (another level that can prove the power off without the BMC, or a person).
pub fn dark_advice(node: &str, dark: &[&str]) -> String {
    if dark.is_empty() {
        return String::new();
    }
    format!(
        ". No answer from {}: a BMC that does not answer is no proof that node {node} is off \
         (the machine may have lost its power, or only the BMC its network), so nothing is released on it; \
         a later fence tries again after the cooldown, within the escalation limit. To fence without the BMC, give the \
         node's FenceTarget a PDU or storage level; or check the machine and, once a person knows \
         it is off, release its pods with `kubectl palisade delete-pod NAMESPACE/POD --confirm`",
        dark.iter()
            .map(|d| palisade_model::target::redact_url(d))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_model::nodefence::{FencePlan, PlannedDevice};

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn facts(s: i64) -> Facts<'static> {
        Facts {
            node: "m0",
            at: at(s),
            token: 3,
            leader: "replica-a",
            challenge: "uid-1",
            kept_taints: &[],
        }
    }

    /// A fence in Fencing with one hardware level.
    fn fencing() -> NodeFenceStatus {
        let plan: FencePlan = serde_json::from_value(serde_json::json!({
            "levels": [{"name": "bmc", "kind": "Hardware", "devices": []}]
        }))
        .unwrap();
        let mut status = NodeFenceStatus::default();
        status
            .transition(Phase::Pending, at(0), "requested")
            .unwrap();
        let step = Step::StartFencing { plan, token: 3 };
        let answer = Answer::Started {
            boot_id: Some("boot-1".into()),
            verdict: Some(("unhealthy".into(), "silent".into())),
        };
        let r = apply(&mut status, &step, answer, facts(1)).unwrap();
        assert_eq!(r.left, Some((Phase::Pending, at(0))));
        assert_eq!(status.phase, Phase::Fencing);
        assert_eq!(status.recovery.boot_id_at_fence.as_deref(), Some("boot-1"));
        status
    }

    fn run_level() -> Step {
        Step::RunLevel {
            level: 0,
            devices: Vec::<PlannedDevice>::new(),
            reset: false,
        }
    }

    #[test]
    fn a_level_is_verified_only_with_its_evidence() {
        // No failure reported, and no evidence: failed, nothing to release on.
        let mut status = fencing();
        let r = apply(
            &mut status,
            &run_level(),
            Answer::Level(LevelRun::default()),
            facts(2),
        )
        .unwrap();
        assert!(r.note.unwrap().warning);
        assert!(status.verified_fence().is_none());
        // Without the level's run at all: failed too.
        let mut status = fencing();
        apply(&mut status, &run_level(), Answer::Nothing, facts(2)).unwrap();
        assert!(status.verified_fence().is_none());
        assert_eq!(status.levels.len(), 1);
        // With evidence of the level: verified.
        let mut status = fencing();
        let evidence = vec![Evidence {
            level: 0,
            device: "ipmi://bmc".into(),
            kind: EvidenceKind::PowerOff,
            observed: "chassis power is off".into(),
            at: MicroTime(at(2)),
        }];
        let run = LevelRun {
            evidence,
            ..LevelRun::default()
        };
        let r = apply(&mut status, &run_level(), Answer::Level(run), facts(2)).unwrap();
        assert_eq!(r.note.unwrap().reason, "LevelVerified");
        assert!(status.verified_fence().is_some());
    }

    #[test]
    fn a_recovery_action_is_marked_done_only_when_it_succeeded() {
        let mut status = fencing();
        let failed = Answer::Recovery {
            attempts: Vec::new(),
            result: Err("refused".into()),
        };
        let r = apply(&mut status, &Step::Unfence(Vec::new()), failed, facts(5)).unwrap();
        assert_eq!(r.note.unwrap().reason, "UnfenceFailed");
        assert!(status.recovery.unfenced_at.is_none());
        let done = Answer::Recovery {
            attempts: Vec::new(),
            result: Ok(()),
        };
        apply(&mut status, &Step::Unfence(Vec::new()), done, facts(6)).unwrap();
        assert_eq!(status.recovery.unfenced_at, Some(MicroTime(at(6))));
        assert!(status.recovery.powered_on_at.is_none());
    }

    #[test]
    fn a_release_is_written_ahead_and_then_recorded() {
        let mut status = fencing();
        let pod = ObjectRef {
            namespace: "app".into(),
            name: "db-0".into(),
            uid: "pod-1".into(),
        };
        assert!(!release_intended(&status, &pod));
        intend_release(&mut status, &pod, at(7));
        assert!(release_intended(&status, &pod));
        let r = apply(
            &mut status,
            &Step::RecordReleased(pod.clone()),
            Answer::Nothing,
            facts(8),
        )
        .unwrap();
        assert_eq!(r.note.unwrap().reason, "PodReleased");
        assert!(status.release.releasing.is_none());
        assert_eq!(status.release.pods.len(), 1);
        assert_eq!(status.release.pods[0].uid, "pod-1");
    }

    #[test]
    fn an_illegal_transition_is_an_error() {
        let mut status = fencing();
        assert!(apply(
            &mut status,
            &Step::Enter(Phase::Done),
            Answer::Nothing,
            facts(9)
        )
        .is_err());
    }
}
