//! The NodeFence state machine: scripted walks through every phase, and a property test that
//! drives it with random device outcomes, observations and leader changes.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::wall;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use palisade_decide::phase::{
    clean_proof, next_step, IdentityFrom, NodePod, NodeVolume, ObjectRef, Observations, PeerTrust,
    ProofFrom, ReleaseTaints, Step, WaitFor, UNTAINT_SETTLE_MARGIN,
};
use palisade_decide::record::{self, released, Answer, Facts, LevelRun};
use palisade_decide::verdict::{FencePlan, PlanLevel};
use palisade_decide::{Clocks, HoldReason, Mono, Verdict, WaitReason};
use palisade_model::advertise::{Advertisement, RuntimeSource};
use palisade_model::nodefence::{
    AttemptOutcome, Coverage, DeviceAction, DeviceAttempt, Evidence, EvidenceKind, FailureReason,
    NodeFenceSpec, NodeFenceStatus, Phase, PinnedNode, PlannedDevice, PowerRecheck, RecheckedPower,
    RequestedBy,
};
use palisade_model::policy::{Recovery, UntaintWhen};
use palisade_model::target::{ClaimBacking, DeviceKind, PowerOff, StorageScope};
use palisade_model::{FENCED_TAINT_KEY as FENCED, OUT_OF_SERVICE_TAINT_KEY as OUT_OF_SERVICE};
use proptest::prelude::*;

fn spec(by: RequestedBy) -> NodeFenceSpec {
    NodeFenceSpec {
        node_name: "m0".into(),
        reason: String::new(),
        requested_by: by,
        overrides: Default::default(),
    }
}

/// The StorageClass every storage device of these tests fences.
const FAST: &str = "fast";

fn dev(url: &str, kind: DeviceKind) -> PlannedDevice {
    PlannedDevice {
        url: url.into(),
        kind,
        timeout_seconds: 10,
        fences: (kind == DeviceKind::Storage).then(|| StorageScope {
            storage_classes: vec![FAST.into()],
            csi_drivers: vec!["csi.fast".into()],
        }),
        identity_from: None,
    }
}

/// Level 0: IPMI (power). Level 1: PDU + storage firewall.
fn plan() -> FencePlan {
    FencePlan {
        node: "m0".into(),
        policy: "p".into(),
        requested_by: RequestedBy::Controller,
        levels: vec![
            PlanLevel::Hardware {
                name: "ipmi".into(),
                devices: vec![dev("ipmi://bmc", DeviceKind::Power)],
                power_off: PowerOff::Allowed,
            },
            PlanLevel::Hardware {
                name: "pdu+storage".into(),
                devices: vec![
                    dev("snmp+pdu://pdu/1", DeviceKind::Power),
                    dev("storagefw+https://fw/m0", DeviceKind::Storage),
                ],
                power_off: PowerOff::Allowed,
            },
        ],
        priority: 0,
        forgiveness: Duration::ZERO,
        pdb_urgent: false,
        cause: palisade_decide::Cause::Silence,
    }
}

/// A pod that mounts one claim of class [`FAST`], or none.
fn pod(ns: &str, name: &str, mounts_claim: bool) -> NodePod {
    pod_with(ns, name, if mounts_claim { &[FAST] } else { &[] })
}

/// A pod that mounts one claim of each class in `classes`.
fn pod_with(ns: &str, name: &str, classes: &[&str]) -> NodePod {
    NodePod {
        pod: obj(ns, name),
        claims: classes
            .iter()
            .map(|c| ClaimBacking::Known {
                storage_class: c.to_string(),
                driver: None,
                volume: None,
            })
            .collect(),
    }
}

/// A volume of CSI driver `driver` tied to the node.
fn vol(name: &str, driver: &str) -> NodeVolume {
    NodeVolume {
        object: obj("", name),
        driver: Some(driver.into()),
    }
}

fn obj(ns: &str, name: &str) -> ObjectRef {
    ObjectRef {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

/// The machine `m0` (its SMBIOS system UUID), and another machine.
const M0_UUID: &str = "4c4c4544-0042-3510-8056-b4c04f335331";
const OTHER_UUID: &str = "4c4c4544-0043-3510-8056-b4c04f335331";

/// The outside world the steps act on, as the I/O controller would see it.
#[derive(Debug, Clone)]
struct World {
    now: i64,
    token: i64,
    pods: Vec<NodePod>,
    attachments: Vec<NodeVolume>,
    attach_records: Vec<NodeVolume>,
    node_healthy: bool,
    agent_clean: bool,
    /// The Node carries the fence's recovery challenge.
    challenge: bool,
    last_renewal: Option<Timestamp>,
    marker: Option<String>,
    /// When the controller's detector last saw the node's heartbeat change (monotonic).
    watched_since: Option<Mono>,
    /// How far the controller's wall clock has stepped from true time (seconds).
    wall_step: i64,
    self_fence_wait: Option<Duration>,
    peer_trust: PeerTrust,
    /// The release taints this fence added are on the Node.
    taint: bool,
    /// Release taints on the Node that this fence did not add.
    foreign: Vec<String>,
    /// The node's VolumeAttachments that have not settled.
    unsettled: Vec<ObjectRef>,
    /// Since when the controller has watched the Node without this fence's taints and without
    /// an out-of-service taint (monotonic), updated on every observation.
    untainted_since: std::cell::Cell<Option<Mono>>,
    node_uid: Option<String>,
    /// The Node's `status.nodeInfo.systemUUID` now.
    node_system_uuid: Option<String>,
    /// The machine UUID the agent's renewals advertise (with its answer).
    answer_uuid: Option<String>,
    /// The machine UUID the latest observed advertisement names when the fence pins the node
    /// (`None`: pin what the Node reports).
    advertised_uuid: Option<String>,
    /// The clean proof is a person's confirmation, not the agent's answer.
    confirmed_by_person: bool,
    /// What the power devices read when re-read before a release.
    power_reads: RecheckedPower,
    older_sibling: Option<String>,
    /// When this controller process first saw the fence in its current phase (monotonic).
    phase_seen_since: Option<Mono>,
    recovery: Recovery,
    verdict: Option<Verdict>,
    /// The next this many recovery actions (power on, unblock) are refused by their devices.
    refused_recoveries: u32,
}

impl World {
    fn new() -> Self {
        Self {
            now: 0,
            token: 1,
            pods: vec![pod("db", "db-0", true), pod("web", "web-1", false)],
            attachments: vec![vol("csi-va-1", "csi.fast")],
            attach_records: vec![vol("kubernetes.io/csi/csi.fast^pv-1", "csi.fast")],
            node_healthy: false,
            agent_clean: false,
            challenge: false,
            last_renewal: None,
            marker: Some("renew-0".into()),
            watched_since: Some(Mono::from_secs(1000)),
            wall_step: 0,
            self_fence_wait: None,
            peer_trust: PeerTrust::NotPeerChecked,
            taint: false,
            foreign: Vec::new(),
            unsettled: Vec::new(),
            untainted_since: std::cell::Cell::new(None),
            node_uid: Some("uid-m0".into()),
            node_system_uuid: Some(M0_UUID.into()),
            answer_uuid: Some(M0_UUID.into()),
            advertised_uuid: None,
            confirmed_by_person: false,
            power_reads: RecheckedPower::Off,
            older_sibling: None,
            phase_seen_since: None,
            recovery: Recovery {
                power_on: true,
                untaint_when: UntaintWhen::NodeReady,
            },
            verdict: Some(Verdict::Fence(plan())),
            refused_recoveries: 0,
        }
    }

    fn clocks(&self) -> Clocks {
        Clocks {
            mono: Mono::from_secs(1000 + self.now as u64),
            wall: wall(self.now + self.wall_step),
        }
    }

    /// Whether the Node carries neither this fence's taints nor an out-of-service taint.
    fn untainted(&self) -> bool {
        !self.taint && !self.foreign.iter().any(|k| k == OUT_OF_SERVICE)
    }

    fn obs(&self) -> Observations<'_> {
        let mono = self.clocks().mono;
        self.untainted_since.set(if self.untainted() {
            Some(self.untainted_since.get().unwrap_or(mono))
        } else {
            None
        });
        Observations {
            now: self.clocks(),
            token: self.token,
            verdict: self.verdict.as_ref(),
            recovery: Some(&self.recovery),
            pods_on_node: self.pods.clone(),
            attachments: self.attachments.clone(),
            attach_records: self.attach_records.clone(),
            node_healthy: self.node_healthy,
            last_renewal: self.last_renewal,
            heartbeat_marker: self.marker.clone(),
            watched_silence: self.watched_since.map(|c| self.clocks().mono.since(c)),
            self_fence_wait: self.self_fence_wait,
            peer_trust: self.peer_trust,
            // The agent can only answer a challenge the Node carries.
            clean_proof: (self.agent_clean && self.challenge)
                .then(|| "the agent's runtime lists none of the released pods".to_string()),
            challenge_posted: self.challenge,
            taints_added: if self.taint {
                vec![FENCED.to_string(), OUT_OF_SERVICE.to_string()]
            } else {
                Vec::new()
            },
            taints_foreign: self.foreign.clone(),
            unsettled_attachments: self.unsettled.clone(),
            untainted_for: self.untainted_since.get().map(|c| mono.since(c)),
            node_uid: self.node_uid.clone(),
            node_system_uuid: self.node_system_uuid.clone(),
            advertised_system_uuid: self.advertised_uuid.clone(),
            proof_from: if self.confirmed_by_person {
                ProofFrom::Person
            } else {
                ProofFrom::Agent(self.answer_uuid.clone())
            },
            older_sibling: self.older_sibling.clone(),
            phase_seen_for: self.phase_seen_since.map(|c| self.clocks().mono.since(c)),
        }
    }
}

/// Perform `step` as the I/O controller would, with `level_ok(level)` deciding device outcomes:
/// the world's side here, the record by the controller's core
/// ([`palisade_decide::record::apply`]). Panics if a step asks for something the status
/// methods refuse (an illegal transition).
fn apply(step: &Step, st: &mut NodeFenceStatus, w: &mut World, level_ok: &dyn Fn(i32) -> bool) {
    let at = wall(w.now);
    let answer = match step {
        Step::RunLevel {
            level,
            devices,
            reset,
        } => {
            // A reset is never evidence.
            let evidence = devices
                .iter()
                .filter(|d| !(*reset && d.kind == DeviceKind::Power))
                .map(|d| Evidence {
                    level: *level,
                    device: d.url.clone(),
                    kind: match d.kind {
                        DeviceKind::Power => EvidenceKind::PowerOff,
                        DeviceKind::Storage => EvidenceKind::StorageBlocked,
                    },
                    observed: "off".into(),
                    at: MicroTime(at),
                })
                .collect();
            Answer::Level(LevelRun {
                evidence,
                failure: (!level_ok(*level)).then(|| "device error".to_string()),
                ..LevelRun::default()
            })
        }
        Step::StartFencing { .. } => Answer::Started {
            boot_id: None,
            verdict: None,
        },
        Step::PostChallenge => {
            w.challenge = true;
            Answer::Nothing
        }
        Step::ApplyTaint(..) => {
            w.taint = true;
            Answer::Nothing
        }
        Step::ReleasePod(_, p) => {
            w.pods.retain(|x| x.pod != *p);
            Answer::Nothing
        }
        Step::DeleteAttachment(_, a) => {
            w.attachments.retain(|x| x.object != *a);
            Answer::Nothing
        }
        Step::ClearAttachRecord(_, r) => {
            w.attach_records.retain(|x| x.object != *r);
            Answer::Nothing
        }
        Step::PowerOn(devices) | Step::Unfence(devices) if w.refused_recoveries > 0 => {
            w.refused_recoveries -= 1;
            Answer::Recovery {
                attempts: devices
                    .iter()
                    .map(|d| DeviceAttempt {
                        level: 0,
                        device: d.url.clone(),
                        action: match d.kind {
                            DeviceKind::Power => DeviceAction::PowerOn,
                            DeviceKind::Storage => DeviceAction::Unblock,
                        },
                        outcome: AttemptOutcome::Failed,
                        token: w.token,
                        at: MicroTime(at),
                        message: "refused: a power-on right after a power-off".into(),
                        seen_token: None,
                    })
                    .collect(),
                result: Err("refused".into()),
            }
        }
        Step::PowerOn(_) | Step::Unfence(_) => Answer::Recovery {
            attempts: Vec::new(),
            result: Ok(()),
        },
        Step::RemoveTaint => {
            w.taint = false;
            Answer::Untainted { left: Vec::new() }
        }
        Step::RecheckPower(devices) => Answer::Power(
            devices
                .iter()
                .map(|d| PowerRecheck {
                    device: d.url.clone(),
                    token: w.token,
                    state: w.power_reads,
                    observed: format!("{:?}", w.power_reads),
                    at: MicroTime(at),
                })
                .collect(),
        ),
        _ => Answer::Nothing,
    };
    let facts = Facts {
        node: "m0",
        at,
        token: w.token,
        leader: "test",
        challenge: "uid-1",
        kept_taints: &[],
    };
    record::apply(st, step, answer, facts).unwrap();
}

/// A new fence, its node already pinned (the controller's first step).
fn created() -> NodeFenceStatus {
    let mut st = unpinned();
    st.pinned = Some(PinnedNode {
        name: "m0".into(),
        uid: "uid-m0".into(),
        system_uuid: Some(M0_UUID.into()),
    });
    st
}

fn unpinned() -> NodeFenceStatus {
    let mut st = NodeFenceStatus::default();
    st.transition(Phase::Pending, wall(0), "created").unwrap();
    st
}

#[test]
fn happy_path_walks_every_phase_in_order() {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    let level_ok = |l: i32| l == 1; // IPMI fails (bad credentials), PDU + storage level works.
    let mut labels = Vec::new();
    for _ in 0..60 {
        let step = next_step(&sp, &st, &w.obs());
        labels.push(match &step {
            Step::Enter(p) => format!("enter:{p}"),
            Step::RunLevel { level, .. } => format!("run_level:{level}"),
            Step::ReleasePod(_, p) => format!("release_pod:{}", p.name),
            Step::Wait { why, .. } => format!("wait:{why:?}"),
            other => other.label().to_string(),
        });
        if step == Step::Nothing {
            break;
        }
        if matches!(
            step,
            Step::Wait {
                why: WaitFor::Rejoin,
                ..
            }
        ) {
            // The powered-on node's agent comes back clean.
            w.node_healthy = true;
            w.agent_clean = true;
        }
        apply(&step, &mut st, &mut w, &level_ok);
        w.now += 1;
    }
    // One label per run of identical waits (the untaint margin takes several ticks).
    labels.dedup();
    assert_eq!(
        labels,
        vec![
            "start_fencing",
            "run_level:0",
            "run_level:1",
            "enter:Fenced",
            "enter:Releasing",
            "apply_taint",
            "recheck_power",
            "release_pod:db-0",
            "release_pod:web-1",
            "apply_taint",
            "delete_attachment",
            "clear_attach_record",
            "enter:Released",
            "enter:Recovering",
            "post_challenge",
            "power_on",
            "wait:Rejoin",
            "record_clean_proof",
            "remove_taint",
            "record_untaint_observed",
            "wait:UntaintMargin",
            "unfence",
            "enter:Done",
            "nothing",
        ]
    );
    let phases: Vec<Phase> = st.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(
        phases,
        vec![
            Phase::Pending,
            Phase::Fencing,
            Phase::Fenced,
            Phase::Releasing,
            Phase::Released,
            Phase::Recovering,
            Phase::Done
        ]
    );
    assert_eq!(st.verified_fence().unwrap().level(), 1);
    assert_eq!(st.release.pods.len(), 2);
    assert!(st.recovery.unfenced_at.is_some() && st.recovery.untainted_at.is_some());
}

#[test]
fn recovery_reverses_every_level_that_was_tried() {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    for _ in 0..40 {
        let step = next_step(&sp, &st, &w.obs());
        match &step {
            // Level 0 (IPMI) failed but may have cut power; both power devices are switched on.
            Step::PowerOn(d) => assert_eq!(
                d,
                &vec![
                    dev("ipmi://bmc", DeviceKind::Power),
                    dev("snmp+pdu://pdu/1", DeviceKind::Power)
                ]
            ),
            Step::Unfence(d) => assert_eq!(
                d,
                &vec![dev("storagefw+https://fw/m0", DeviceKind::Storage)]
            ),
            Step::Wait {
                why: WaitFor::Rejoin,
                ..
            } => {
                w.node_healthy = true;
                w.agent_clean = true;
            }
            Step::Nothing => return,
            _ => {}
        }
        apply(&step, &mut st, &mut w, &|l| l == 1);
        w.now += 1;
    }
    panic!("did not finish: {st:?}");
}

#[test]
fn all_levels_failing_fails_with_nothing_released() {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    let mut steps = Vec::new();
    for _ in 0..10 {
        let step = next_step(&sp, &st, &w.obs());
        steps.push(step.label());
        if step == Step::Nothing {
            break;
        }
        apply(&step, &mut st, &mut w, &|_| false);
    }
    assert_eq!(
        steps,
        vec!["start_fencing", "run_level", "run_level", "fail", "nothing"]
    );
    assert_eq!(st.phase, Phase::Failed);
    assert_eq!(
        st.failure.as_ref().unwrap().reason,
        FailureReason::AllLevelsFailed
    );
    assert_eq!(st.failure.as_ref().unwrap().phase, Phase::Fencing);
    assert!(!st.released_anything());
    assert_eq!(w.pods.len(), 2, "pods must stay bound");
}

#[test]
fn pending_follows_the_decision() {
    let st = created();
    let mut w = World::new();
    w.verdict = Some(Verdict::Hold(HoldReason::NoPolicy));
    assert_eq!(
        next_step(&spec(RequestedBy::Manual), &st, &w.obs()),
        Step::Hold(HoldReason::NoPolicy)
    );
    w.verdict = Some(Verdict::Wait {
        until: Mono::from_secs(1000 + 30),
        reason: WaitReason::Suspect,
    });
    assert_eq!(
        next_step(&spec(RequestedBy::Manual), &st, &w.obs()),
        Step::Wait {
            why: WaitFor::Verdict("wait_suspect".into()),
            until: Some(wall(30))
        }
    );
    w.verdict = None;
    assert_eq!(
        next_step(&spec(RequestedBy::Manual), &st, &w.obs()),
        Step::Wait {
            why: WaitFor::Decision,
            until: None
        }
    );
    // The node came back before anything was done: a controller request is withdrawn, a
    // manual one is not (a person suspects the node).
    w.node_healthy = true;
    assert_eq!(
        next_step(&spec(RequestedBy::Controller), &st, &w.obs()),
        Step::Cancel
    );
    assert_ne!(
        next_step(&spec(RequestedBy::Manual), &st, &w.obs()),
        Step::Cancel
    );
}

#[test]
fn a_fence_for_a_node_that_does_not_exist_fails_after_the_grace_and_only_in_pending() {
    let mut w = World::new();
    w.node_uid = None;
    let mut st = NodeFenceStatus::default();
    st.transition(Phase::Pending, wall(0), "created").unwrap();
    st.pinned = Some(PinnedNode {
        name: "m0".into(),
        uid: String::new(),
        system_uuid: None,
    });
    let grace = palisade_decide::phase::NODE_NOT_FOUND_GRACE.as_secs() as i64;
    assert_eq!(
        next_step(&spec(RequestedBy::Manual), &st, &w.obs()),
        Step::Wait {
            why: WaitFor::NodeExists,
            until: Some(wall(grace))
        }
    );
    w.now = grace + 1;
    assert_eq!(
        next_step(&spec(RequestedBy::Manual), &st, &w.obs()),
        Step::Fail(FailureReason::NodeNotFound)
    );
    // The Node registers in time: the fence follows the decision as usual.
    w.node_uid = Some("uid-m0".into());
    assert!(matches!(
        next_step(&spec(RequestedBy::Manual), &st, &w.obs()),
        Step::StartFencing { .. }
    ));
    // Once fencing began, a Node object that disappears never fails the fence half-way: the
    // machine is still there and the fence must finish.
    let mut fencing = fencing_status(1);
    fencing.pinned = st.pinned.clone();
    w.node_uid = None;
    assert!(!matches!(
        next_step(&spec(RequestedBy::Manual), &fencing, &w.obs()),
        Step::Fail(FailureReason::NodeNotFound)
    ));
}

fn fencing_status(token: i64) -> NodeFenceStatus {
    let mut st = created();
    st.plan = Some(plan().to_status(&World::new().clocks()));
    st.fencing_token = Some(token);
    st.transition(Phase::Fencing, wall(0), "fencing").unwrap();
    st
}

#[test]
fn a_deposed_leader_acts_on_nothing_and_a_new_one_records_its_token_first() {
    let sp = spec(RequestedBy::Controller);
    let st = fencing_status(5);
    let mut w = World::new();
    w.token = 4;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Refuse {
            ours: 4,
            recorded: 5
        }
    );
    w.token = 6;
    assert_eq!(next_step(&sp, &st, &w.obs()), Step::RecordToken(6));
    w.token = 5;
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::RunLevel { level: 0, .. }
    ));
}

#[test]
fn budgets_exceeded_fail_the_fence() {
    let sp = spec(RequestedBy::Controller);
    let st = fencing_status(1);
    let mut w = World::new();
    // Budget: 3 devices x 10 s + 60 s slack = 90 s.
    w.now = 90;
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::RunLevel { .. }
    ));
    w.now = 91;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::BudgetExceeded)
    );
}

/// Drives a fence (PDU + storage level verified) until it is Releasing, entered at `wall(0)`.
fn releasing_world() -> (NodeFenceSpec, NodeFenceStatus, World) {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    while st.phase != Phase::Releasing {
        let step = next_step(&sp, &st, &w.obs());
        apply(&step, &mut st, &mut w, &|l| l == 1);
    }
    assert_eq!(st.entered_at(), Some(wall(0)));
    (sp, st, w)
}

/// A forward step of the controller's wall clock (NTP, a mis-set clock) must not fail a fence
/// mid-release: the budget also runs on this process's monotonic clock, from when it first saw
/// the phase.
#[test]
fn a_forward_wall_clock_step_never_fails_a_fence_mid_release() {
    let (sp, st, mut w) = releasing_world();
    // Releasing's budget is 300 s; this process saw the phase begin.
    w.phase_seen_since = Some(w.clocks().mono);
    w.now = 10;
    w.wall_step = 3600;
    assert_ne!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::BudgetExceeded),
        "the wall clock says an hour passed, the monotonic clock 10 s"
    );
    w.now = 300;
    assert_ne!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::BudgetExceeded)
    );
    w.now = 301;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::BudgetExceeded),
        "the whole budget ran on both clocks"
    );
}

/// The monotonic budget never makes the wall deadline shorter, and a process that first saw
/// the phase late (a new leader) counts the whole budget from then.
#[test]
fn the_budget_ends_when_both_clocks_say_so() {
    let (sp, st, mut w) = releasing_world();
    w.phase_seen_since = Some(w.clocks().mono);
    // The wall clock stepped back: 400 s watched, the wall clock reads 300 s.
    w.now = 400;
    w.wall_step = -100;
    assert_ne!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::BudgetExceeded)
    );
    w.now = 401;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::BudgetExceeded)
    );
    // A new leader first reads the status 200 s into the phase.
    w.wall_step = 0;
    w.now = 200;
    w.phase_seen_since = Some(w.clocks().mono);
    w.now = 500;
    assert_ne!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::BudgetExceeded)
    );
    w.now = 501;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::BudgetExceeded)
    );
}

#[test]
fn release_is_unreachable_without_a_verified_fence() {
    // A status claiming Releasing, with a verified level but no evidence (hand-edited).
    let sp = spec(RequestedBy::Controller);
    let mut st = fencing_status(1);
    st.record_level_verified(
        0,
        vec![Evidence {
            level: 0,
            device: "ipmi://bmc".into(),
            kind: EvidenceKind::PowerOff,
            observed: "off".into(),
            at: MicroTime(wall(1)),
        }],
        wall(1),
        "ok",
    )
    .unwrap();
    st.transition(Phase::Fenced, wall(1), "fenced").unwrap();
    st.transition(Phase::Releasing, wall(1), "releasing")
        .unwrap();
    st.evidence.clear();
    let w = World::new();
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::NoVerifiedFence)
    );
}

#[test]
fn attachments_wait_for_every_pod_to_be_released() {
    let sp = spec(RequestedBy::Controller);
    let mut st = fencing_status(1);
    let mut w = World::new();
    apply(&next_step(&sp, &st, &w.obs()), &mut st, &mut w, &|_| true); // level 0 verified
    apply(&next_step(&sp, &st, &w.obs()), &mut st, &mut w, &|_| true); // Fenced
    apply(&next_step(&sp, &st, &w.obs()), &mut st, &mut w, &|_| true); // Releasing
    apply(&next_step(&sp, &st, &w.obs()), &mut st, &mut w, &|_| true); // taint
    let recheck = next_step(&sp, &st, &w.obs());
    assert!(matches!(recheck, Step::RecheckPower(_)), "{recheck:?}");
    apply(&recheck, &mut st, &mut w, &|_| true);
    // A pod reappears (a stale cache); pods always go before attachments.
    let s = next_step(&sp, &st, &w.obs());
    assert!(
        matches!(s, Step::ReleasePod(_, ref p) if p.name == "db-0"),
        "{s:?}"
    );
    w.pods = vec![pod("db", "late", true)];
    assert!(
        matches!(next_step(&sp, &st, &w.obs()), Step::ReleasePod(_, ref p) if p.name == "late")
    );
    w.pods.clear();
    let out_of_service = next_step(&sp, &st, &w.obs());
    assert!(
        matches!(
            out_of_service,
            Step::ApplyTaint(_, ReleaseTaints::OutOfService)
        ),
        "{out_of_service:?}"
    );
    apply(&out_of_service, &mut st, &mut w, &|_| true);
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::DeleteAttachment(..)
    ));
}

#[test]
fn a_release_a_dead_leader_started_is_finished_first_and_always_recorded() {
    let sp = spec(RequestedBy::Controller);
    let mut st = fencing_status(1);
    let mut w = World::new();
    for _ in 0..5 {
        // level 0 verified, Fenced, Releasing, taint, power re-read
        apply(&next_step(&sp, &st, &w.obs()), &mut st, &mut w, &|_| true);
    }
    // A leader recorded its intent to release web-1, then died before (or after) deleting it.
    let web = obj("web", "web-1");
    st.release.releasing = Some(released(&web, wall(w.now)));
    let s = next_step(&sp, &st, &w.obs());
    assert!(
        matches!(s, Step::ReleasePod(_, ref p) if *p == web),
        "the started release is resumed before db-0: {s:?}"
    );
    // Its deletion had landed: the pod is gone, and the next step records it (and only that).
    w.pods.retain(|p| p.pod != web);
    let s = next_step(&sp, &st, &w.obs());
    assert_eq!(s, Step::RecordReleased(web.clone()));
    assert!(
        !s.is_action(),
        "recording acts on nothing outside the status"
    );
    apply(&s, &mut st, &mut w, &|_| true);
    assert!(st.release.releasing.is_none());
    assert_eq!(st.release.pods.len(), 1);
    assert!(
        matches!(next_step(&sp, &st, &w.obs()), Step::ReleasePod(_, ref p) if p.name == "db-0")
    );
}

#[test]
fn self_fence_level_waits_for_its_trust_time() {
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    let mut p = plan();
    p.levels = vec![PlanLevel::SelfFence {
        silent_since: Mono::from_secs(1000),
        wait: Duration::from_secs(20),
        scope: Coverage::All,
        marker: Some("renew-0".into()),
    }];
    w.verdict = Some(Verdict::Fence(p));
    let mut st = created();
    let step = next_step(&sp, &st, &w.obs());
    apply(&step, &mut st, &mut w, &|_| true);
    w.now = 19;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::SelfFence,
            until: Some(wall(20))
        }
    );
    w.now = 20;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::TrustSelfFence { level: 0 }
    );
    // The Fencing budget stretches to the trust time + slack.
    w.now = 79;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::TrustSelfFence { level: 0 }
    );
    w.now = 81;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::BudgetExceeded)
    );
}

/// A step of the controller's wall clock (NTP, a mis-set clock) never shortens the self-fence
/// wait: the wall deadline is also checked against what this process watched on its monotonic
/// clock. (Found by the simulation's clock-step fault: a forward step of 28 s trusted a
/// self-fence at once and two copies of a pod ran.)
#[test]
fn a_forward_wall_clock_step_does_not_shorten_the_self_fence_wait() {
    let (sp, st, mut w) = self_fenced_world(Coverage::All);
    w.now = 5;
    w.wall_step = 30;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::SelfFence,
            until: Some(wall(35 + 15))
        },
        "the wall clock says 35 s, past the 20 s deadline, but only 5 s were watched"
    );
    w.now = 19;
    assert!(matches!(next_step(&sp, &st, &w.obs()), Step::Wait { .. }));
    w.now = 20;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::TrustSelfFence { level: 0 }
    );
    // A restarted controller counts from when it first saw the node, and a detector that
    // does not watch the marker trusts nothing.
    w.watched_since = Some(Mono::from_secs(1000 + 18));
    assert!(matches!(next_step(&sp, &st, &w.obs()), Step::Wait { .. }));
    w.now = 38;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::TrustSelfFence { level: 0 }
    );
    w.watched_since = None;
    assert!(matches!(next_step(&sp, &st, &w.obs()), Step::Wait { .. }));
}

/// A world whose plan is one trusted self-fence level (wait 20 s from t=0, scope `scope`),
/// driven to Fencing.
fn self_fenced_world(scope: Coverage) -> (NodeFenceSpec, NodeFenceStatus, World) {
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    let mut p = plan();
    p.levels = vec![PlanLevel::SelfFence {
        silent_since: Mono::from_secs(1000),
        wait: Duration::from_secs(20),
        scope,
        marker: Some("renew-0".into()),
    }];
    w.verdict = Some(Verdict::Fence(p));
    w.last_renewal = Some(wall(0));
    w.self_fence_wait = Some(Duration::from_secs(20));
    let mut st = created();
    let step = next_step(&sp, &st, &w.obs());
    apply(&step, &mut st, &mut w, &|_| true);
    assert_eq!(st.phase, Phase::Fencing);
    (sp, st, w)
}

#[test]
fn a_peer_checked_self_fence_waits_for_a_healthy_majority_and_its_bound() {
    let (sp, st, mut w) = self_fenced_world(Coverage::All);
    // Past the node's own trust time, but no healthy majority: its peers may be excusing it.
    w.now = 25;
    w.peer_trust = PeerTrust::NoMajority;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::HealthyMajority,
            until: None
        }
    );
    // A majority came back at t=18: trust waits for the later bound (here t=33), on the
    // monotonic clock.
    w.peer_trust = PeerTrust::From(Mono::from_secs(1000 + 33));
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::SelfFence,
            until: Some(wall(33))
        }
    );
    // A forward step of the wall clock does not shorten the bound.
    w.wall_step = 10;
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::SelfFence,
            ..
        }
    ));
    w.wall_step = 0;
    w.now = 33;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::TrustSelfFence { level: 0 }
    );
    // A bound earlier than the node's own trust time never shortens it.
    w.now = 19;
    w.peer_trust = PeerTrust::From(Mono::from_secs(1000 + 5));
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::SelfFence,
            until: Some(wall(20))
        }
    );
}

#[test]
fn a_renewal_during_the_self_fence_wait_restarts_it_from_that_renewal() {
    let (sp, mut st, mut w) = self_fenced_world(Coverage::All);
    // The node renews once at t=15 (it was not dead), then goes silent again.
    w.now = 16;
    w.last_renewal = Some(wall(15));
    w.marker = Some("renew-15".into());
    let step = next_step(&sp, &st, &w.obs());
    assert_eq!(
        step,
        Step::RestartSelfFenceWait {
            level: 0,
            silent_since: wall(15),
            trusted_after: wall(35),
            marker: Some("renew-15".into()),
        }
    );
    apply(&step, &mut st, &mut w, &|_| true);
    // At the old trust time nothing is trusted: the node's own fence clock restarted at 15.
    w.now = 20;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::SelfFence,
            until: Some(wall(35))
        }
    );
    w.now = 35;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::TrustSelfFence { level: 0 }
    );
}

#[test]
fn only_a_new_heartbeat_marker_restarts_the_wait_not_clock_jitter() {
    // The persisted silence start has microsecond precision; the observed time of the same
    // renewal, recomputed from the monotonic clock, can read a little later. Without a new
    // marker nothing renewed: the wait must not restart (it once looped every step).
    let (sp, st, mut w) = self_fenced_world(Coverage::All);
    w.now = 5;
    w.last_renewal = Some(
        wall(0)
            .checked_add(k8s_openapi::jiff::SignedDuration::from_nanos(700))
            .unwrap(),
    );
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::SelfFence,
            until: Some(wall(20))
        }
    );
}

#[test]
fn a_renewal_no_controller_saw_restarts_the_wait_from_now() {
    // Found by the deterministic simulation: the controller crashed during the wait, the node
    // renewed while it was down and went silent again; the new controller never observed that
    // renewal (its detector starts empty), so only the persisted marker reveals it.
    let (sp, st, mut w) = self_fenced_world(Coverage::All);
    w.now = 30;
    w.last_renewal = None;
    w.marker = Some("renew-24".into());
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::RestartSelfFenceWait {
            level: 0,
            silent_since: wall(30),
            trusted_after: wall(50),
            marker: Some("renew-24".into()),
        }
    );
    // The heartbeat cannot be read at all: silence cannot be confirmed, no trust.
    w.marker = None;
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::FailLevel { level: 0, .. }
    ));
}

#[test]
fn a_restarted_wait_is_never_shorter_and_a_withdrawn_advertisement_fails_the_level() {
    let (sp, st, mut w) = self_fenced_world(Coverage::All);
    w.now = 5;
    w.last_renewal = Some(wall(1));
    w.marker = Some("renew-1".into());
    // The new advertisement promises a shorter wait: the longer one stands.
    w.self_fence_wait = Some(Duration::from_secs(3));
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::RestartSelfFenceWait {
            level: 0,
            silent_since: wall(1),
            trusted_after: wall(21),
            marker: Some("renew-1".into()),
        }
    );
    // The renewal no longer advertises a watchdog: no trust at all.
    w.self_fence_wait = None;
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::FailLevel { level: 0, .. }
    ));
}

#[test]
fn a_node_that_renews_after_a_trusted_self_fence_is_not_released_further() {
    let (sp, mut st, mut w) = self_fenced_world(Coverage::All);
    w.now = 20;
    let step = next_step(&sp, &st, &w.obs());
    assert_eq!(step, Step::TrustSelfFence { level: 0 });
    apply(&step, &mut st, &mut w, &|_| true);
    for _ in 0..4 {
        let step = next_step(&sp, &st, &w.obs());
        if matches!(step, Step::ReleasePod(..)) {
            break;
        }
        apply(&step, &mut st, &mut w, &|_| true);
    }
    assert_eq!(st.phase, Phase::Releasing);
    // The agent comes back mid-release: it would restart what it killed.
    w.last_renewal = Some(wall(21));
    w.marker = Some("renew-21".into());
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::NodeReturned)
    );
}

/// Drives a fence to Released with `level_ok`, recording every release step.
fn release_all(
    sp: &NodeFenceSpec,
    st: &mut NodeFenceStatus,
    w: &mut World,
    level_ok: &dyn Fn(i32) -> bool,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for _ in 0..40 {
        if st.phase == Phase::Released {
            return steps;
        }
        let step = next_step(sp, st, &w.obs());
        steps.push(step.clone());
        apply(&step, st, w, level_ok);
    }
    panic!("did not reach Released: {st:?}");
}

/// A storage-only plan: the storage firewall alone, fencing class [`FAST`] (and driver
/// `csi.fast`).
fn storage_only(w: &mut World) {
    let mut p = plan();
    p.levels = vec![PlanLevel::Hardware {
        name: "storage".into(),
        devices: vec![dev("storagefw+https://fw/m0", DeviceKind::Storage)],
        power_off: PowerOff::Allowed,
    }];
    w.verdict = Some(Verdict::Fence(p));
}

/// What the storage-only plan's storage device fences ([`storage_only`]), to change it.
fn storage_scope(w: &mut World) -> &mut Option<StorageScope> {
    match w.verdict.as_mut() {
        Some(Verdict::Fence(p)) => match &mut p.levels[0] {
            PlanLevel::Hardware { devices, .. } => &mut devices[0].fences,
            other => panic!("not a hardware level: {other:?}"),
        },
        other => panic!("no fence verdict: {other:?}"),
    }
}

#[test]
fn a_storage_only_fence_releases_only_pods_that_mount_a_claim() {
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    storage_only(&mut w);
    let mut st = created();
    let steps = release_all(&sp, &mut st, &mut w, &|_| true);
    assert_eq!(st.verified_fence().unwrap().coverage(), Coverage::Stateful);
    // web-1 (no claim) is held, never released, and the out-of-service taint is not applied;
    // the node is still tainted NoSchedule before db-0 is released, so db-0's replacement is
    // not scheduled back onto the fenced node.
    assert!(steps.contains(&Step::HoldPod(obj("web", "web-1"))));
    assert!(!steps
        .iter()
        .any(|s| matches!(s, Step::ApplyTaint(_, ReleaseTaints::OutOfService))));
    let taint = steps
        .iter()
        .position(|s| matches!(s, Step::ApplyTaint(_, ReleaseTaints::NoSchedule)))
        .expect("the node is tainted NoSchedule");
    let first_release = steps
        .iter()
        .position(|s| matches!(s, Step::ReleasePod(..)))
        .expect("db-0 is released");
    assert!(taint < first_release, "{steps:?}");
    let released: Vec<&str> = st.release.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(released, vec!["db-0"]);
    assert_eq!(st.release.held.len(), 1);
    assert!(w.pods.iter().any(|p| p.pod.name == "web-1"));
}

/// Issue 32, item 6: a storage block covers the claims its devices name, not every claim.
#[test]
fn a_storage_fence_holds_a_pod_with_a_claim_it_does_not_fence_and_keeps_its_volume_attached() {
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    storage_only(&mut w);
    w.pods = vec![
        pod("db", "db-0", true),
        // A claim on other storage (class `slow`), and one mounting both: neither is covered.
        pod_with("nfs", "files-0", &["slow"]),
        pod_with("mixed", "both-0", &[FAST, "slow"]),
        // A claim whose PersistentVolumeClaim could not be read.
        NodePod {
            pod: obj("lost", "lost-0"),
            claims: vec![ClaimBacking::Unknown],
        },
    ];
    w.attachments = vec![vol("va-fast", "csi.fast"), vol("va-nfs", "nfs.csi.k8s.io")];
    w.attach_records = vec![
        vol("kubernetes.io/csi/csi.fast^pv-fast", "csi.fast"),
        vol("kubernetes.io/csi/nfs.csi.k8s.io^pv-nfs", "nfs.csi.k8s.io"),
    ];
    let mut st = created();
    let steps = release_all(&sp, &mut st, &mut w, &|_| true);
    let released: Vec<&str> = st.release.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(released, vec!["db-0"], "{steps:?}");
    let mut held: Vec<&str> = st.release.held.iter().map(|p| p.name.as_str()).collect();
    held.sort();
    assert_eq!(held, vec!["both-0", "files-0", "lost-0"]);
    // The held pods' volumes stay attached and in use: only the fenced driver's are released.
    let detached: Vec<&str> = st
        .release
        .attachments
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(detached, vec!["va-fast"]);
    let cleared: Vec<&str> = st
        .release
        .attach_records
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(cleared, vec!["kubernetes.io/csi/csi.fast^pv-fast"]);
    assert!(w.attachments.iter().any(|v| v.object.name == "va-nfs"));
}

/// A storage scope that names only StorageClasses releases no volume while a held pod mounts
/// a claim (a volume's class is not known from its attachment), and every volume once none
/// does.
#[test]
fn volumes_of_a_class_scoped_storage_fence_are_released_only_when_no_held_pod_mounts_a_claim() {
    for (held_claim, want) in [(true, 0), (false, 2)] {
        let sp = spec(RequestedBy::Controller);
        let mut w = World::new();
        storage_only(&mut w);
        storage_scope(&mut w).as_mut().unwrap().csi_drivers.clear();
        w.pods = vec![pod("db", "db-0", true)];
        if held_claim {
            w.pods.push(pod_with("nfs", "files-0", &["slow"]));
        }
        w.attachments = vec![vol("va-a", "csi.fast"), vol("va-b", "nfs.csi.k8s.io")];
        w.attach_records = vec![];
        let mut st = created();
        release_all(&sp, &mut st, &mut w, &|_| true);
        assert_eq!(st.release.pods.len(), 1);
        assert_eq!(
            st.release.attachments.len(),
            want,
            "held claim: {held_claim}"
        );
    }
}

/// A plan written before storage devices named what they fence: its block covers no claim.
#[test]
fn a_storage_device_that_named_nothing_covers_no_pod() {
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    storage_only(&mut w);
    *storage_scope(&mut w) = None;
    let mut st = created();
    release_all(&sp, &mut st, &mut w, &|_| true);
    assert!(st.release.pods.is_empty());
    assert_eq!(st.release.held.len(), 2);
    assert!(st.release.attachments.is_empty() && st.release.attach_records.is_empty());
}

#[test]
fn a_power_fence_releases_every_pod() {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    let steps = release_all(&sp, &mut st, &mut w, &|l| l == 0);
    assert_eq!(st.verified_fence().unwrap().coverage(), Coverage::All);
    assert!(!steps.iter().any(|s| matches!(s, Step::HoldPod(_))));
    assert_eq!(st.release.pods.len(), 2);
    // The order: NoSchedule, the power re-read, every pod released by this fence, and only
    // then the out-of-service taint (a release of its own on Kubernetes 1.26+: a pod its pod
    // GC deleted first would be missing from the record), before the attachments.
    let at = |what: &dyn Fn(&Step) -> bool| steps.iter().position(what);
    let no_schedule = at(&|s| matches!(s, Step::ApplyTaint(_, ReleaseTaints::NoSchedule)));
    let recheck = at(&|s| matches!(s, Step::RecheckPower(_)));
    let last_pod = steps
        .iter()
        .rposition(|s| matches!(s, Step::ReleasePod(..)));
    let out_of_service = at(&|s| matches!(s, Step::ApplyTaint(_, ReleaseTaints::OutOfService)));
    let attachment = at(&|s| matches!(s, Step::DeleteAttachment(..)));
    assert!(
        no_schedule < recheck
            && recheck < last_pod
            && last_pod < out_of_service
            && out_of_service.is_some()
            && attachment.is_none_or(|a| Some(a) > out_of_service),
        "{steps:?}"
    );
    assert!(st.release.out_of_service_at.is_some());
}

#[test]
fn a_stateful_scope_self_fence_covers_only_claim_pods() {
    let (sp, mut st, mut w) = self_fenced_world(Coverage::Stateful);
    w.now = 20;
    release_all(&sp, &mut st, &mut w, &|_| true);
    let released: Vec<&str> = st.release.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(released, vec!["db-0"]);
    assert_eq!(st.release.held[0].name, "web-1");
}

/// What an agent that booted with `boot_id` advertises after reading `challenge`, with an
/// empty inventory.
fn answered(boot_id: &str, challenge: &str) -> Advertisement {
    Advertisement {
        boot_id: Some(boot_id.into()),
        runtime_pods: Some(Default::default()),
        challenge: Some(challenge.into()),
        ..Default::default()
    }
}

/// [`clean_proof`] for challenge `nf-uid`, with no pod bound to the node.
fn proof(st: &NodeFenceStatus, ad: &Advertisement) -> Option<String> {
    clean_proof(st, ad, "nf-uid", &BTreeSet::new())
}

#[test]
fn clean_proof_needs_an_inventory_taken_after_the_challenge_without_the_released_pods() {
    let mut st = NodeFenceStatus::default();
    st.release.pods.push(released(&obj("db", "db-0"), wall(1)));
    st.recovery.boot_id_at_fence = Some("boot-a".into());
    let mut ad = Advertisement {
        boot_id: Some("boot-a".into()),
        challenge: Some("nf-uid".into()),
        ..Default::default()
    };
    // Same boot, no inventory: nothing proves the old containers are gone.
    assert_eq!(proof(&st, &ad), None);
    // The agent's inventory still lists the released pod.
    ad.runtime_pods = Some(["uid-db-0".to_string()].into_iter().collect());
    assert_eq!(proof(&st, &ad), None);
    // The inventory no longer lists it: proof, but only with the challenge answered.
    ad.runtime_pods = Some(Default::default());
    assert!(proof(&st, &ad).is_some());
    let mut unanswered = ad.clone();
    unanswered.challenge = None;
    assert_eq!(proof(&st, &unanswered), None);
    // An inventory taken after another fence's challenge proves nothing for this one.
    unanswered.challenge = Some("older-nf-uid".into());
    assert_eq!(proof(&st, &unanswered), None);
}

/// Issue 32, item 3: the proof is per node. Fence A released `db-0` and failed (or was
/// deleted) before its own recovery; `db-0`'s container survived (a hung agent). Fence B of the
/// same node released only `web-0`. B's proof used to check B's released pods only, so the
/// inventory that still listed `db-0` lifted the node's storage block under a live writer.
#[test]
fn a_live_container_of_a_pod_the_api_does_not_bind_to_the_node_blocks_the_proof() {
    let mut st = NodeFenceStatus::default();
    st.release
        .pods
        .push(released(&obj("web", "web-0"), wall(1)));
    let mut ad = answered("boot-a", "nf-uid");
    ad.runtime_pods = Some(["uid-db-0".to_string()].into_iter().collect());
    // db-0 (fence A's, force-deleted) is bound nowhere: its live container blocks.
    assert_eq!(proof(&st, &ad), None);
    assert_eq!(
        palisade_decide::phase::unbound_in_inventory(&ad, &BTreeSet::new()),
        ["uid-db-0"]
    );
    // A pod the API binds to the node now (a DaemonSet's, a held pod) is the node's own.
    let bound: BTreeSet<String> = ["uid-db-0".to_string()].into_iter().collect();
    assert!(clean_proof(&st, &ad, "nf-uid", &bound)
        .unwrap()
        .contains("only pods the API binds to the node (1 listed)"));
    // Once the container is gone, no binding is needed.
    ad.runtime_pods = Some(Default::default());
    assert!(proof(&st, &ad).is_some());
}

/// Issue 31: a planted `clean_proof` that checked only the first released pod against the
/// inventory passed 60,000 simulated schedules, because the per-node term masks it there: a
/// released pod is force-deleted, so it is bound nowhere and its live container blocks the
/// proof anyway. The released-pods term is the one that holds when the API still binds a
/// released pod to the node: a finalizer keeps a force-deleted pod's object (with its
/// `nodeName`) until its controller removes it. The simulation has modelled finalizers (and
/// kills that part between a node's containers) since 2026-11-30, and the planted bug
/// (`FirstReleasedPodOnly`) breaks at-most-one there on the schedule made for it. Every
/// released pod counts, not only the first.
#[test]
fn every_released_pod_blocks_the_proof_while_a_finalizer_keeps_it_bound_to_the_node() {
    let mut st = NodeFenceStatus::default();
    for (name, pod) in [("db", "db-0"), ("ledger", "ledger-0"), ("queue", "queue-0")] {
        st.release.pods.push(released(&obj(name, pod), wall(1)));
    }
    // Every released pod's object is still bound to the node (finalizers), so the per-node
    // term passes each of them.
    let bound: BTreeSet<String> = ["uid-db-0", "uid-ledger-0", "uid-queue-0"]
        .into_iter()
        .map(String::from)
        .collect();
    for live in ["uid-db-0", "uid-ledger-0", "uid-queue-0"] {
        let mut ad = answered("boot-a", "nf-uid");
        ad.runtime_pods = Some([live.to_string()].into_iter().collect());
        assert!(
            palisade_decide::phase::unbound_in_inventory(&ad, &bound).is_empty(),
            "the per-node term alone passes {live}"
        );
        assert_eq!(
            clean_proof(&st, &ad, "nf-uid", &bound),
            None,
            "a live container of released pod {live} must block the proof"
        );
    }
    let mut ad = answered("boot-a", "nf-uid");
    ad.runtime_pods = Some(Default::default());
    assert!(clean_proof(&st, &ad, "nf-uid", &bound).is_some());
}

/// Seed 3210097 of the simulator: a watchdog reset the node *before* the storage fence, the new
/// boot restarted the pod (the API still listed it), the fence released it. A boot ID that
/// differs from the one recorded at the fence said nothing about when that boot began: it was
/// taken as the proof and the storage was unblocked under a running writer.
#[test]
fn a_new_boot_id_alone_is_never_a_clean_proof() {
    let mut st = NodeFenceStatus::default();
    st.release.pods.push(released(&obj("db", "db-0"), wall(1)));
    st.recovery.boot_id_at_fence = Some("boot-a".into());
    // The new boot's agent never answered (it crashed, or the API was down).
    let rebooted = Advertisement {
        boot_id: Some("boot-b".into()),
        ..Default::default()
    };
    assert_eq!(proof(&st, &rebooted), None);
    // Its inventory from before the challenge (it still ran the pod, or had not started it
    // yet) proves nothing either.
    let early = Advertisement {
        runtime_pods: Some(Default::default()),
        ..rebooted.clone()
    };
    assert_eq!(proof(&st, &early), None);
    // Its answer lists the pod it restarted: no proof.
    let mut running = answered("boot-b", "nf-uid");
    running.runtime_pods = Some(["uid-db-0".to_string()].into_iter().collect());
    assert_eq!(proof(&st, &running), None);
    // Only an answer without it is.
    assert!(proof(&st, &answered("boot-b", "nf-uid"))
        .unwrap()
        .contains("boot-b"));
}

/// Issue 35: a stock node's companion answers the challenge from the CRI. The kubelet, not
/// the companion, starts pods, from its own view of the API: a kubelet partitioned with a
/// released pod in its memory may start it again after an inventory that did not list it.
/// So such an inventory is a proof only from a boot that began after the fence started.
#[test]
fn an_inventory_read_from_the_cri_is_a_proof_only_from_a_new_boot() {
    let mut st = NodeFenceStatus::default();
    st.release.pods.push(released(&obj("db", "db-0"), wall(1)));
    st.recovery.boot_id_at_fence = Some("boot-a".into());
    let mut same_boot = answered("boot-a", "nf-uid");
    // The node agent's answer on the same boot is a proof (it starts nothing unread) ...
    assert!(proof(&st, &same_boot).is_some());
    // ... the companion's is not.
    same_boot.runtime_source = RuntimeSource::Cri;
    assert_eq!(proof(&st, &same_boot), None);
    // No boot ID recorded when fencing began: no boot can be shown to be new.
    let mut unknown = st.clone();
    unknown.recovery.boot_id_at_fence = None;
    let mut new_boot = answered("boot-b", "nf-uid");
    new_boot.runtime_source = RuntimeSource::Cri;
    assert_eq!(proof(&unknown, &new_boot), None);
    // A new boot whose runtime still holds a record of the released pod: no proof.
    let mut still = new_boot.clone();
    still.runtime_pods = Some(["uid-db-0".to_string()].into_iter().collect());
    assert_eq!(proof(&st, &still), None);
    // A new boot, an answer without it: the proof, and it says what it could not see.
    let p = proof(&st, &new_boot).expect("a proof");
    assert!(p.contains("CRI; blind to processes outside it"), "{p}");
    assert!(p.contains("boot-b"), "{p}");
}

#[test]
fn a_fence_acts_only_on_the_node_it_pinned() {
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    let mut st = unpinned();
    // The first step pins the node's name and UID.
    let step = next_step(&sp, &st, &w.obs());
    assert!(matches!(&step, Step::PinNode(p) if p.name == "m0" && p.uid == "uid-m0"));
    apply(&step, &mut st, &mut w, &|_| true);
    let fencing = next_step(&sp, &st, &w.obs());
    assert!(matches!(fencing, Step::StartFencing { .. }));
    apply(&fencing, &mut st, &mut w, &|_| true);
    // spec.nodeName edited to another node: fail, never apply m0's proof to it.
    let mut edited = sp.clone();
    edited.node_name = "m1".into();
    assert_eq!(
        next_step(&edited, &st, &w.obs()),
        Step::Fail(FailureReason::SpecChanged)
    );
    // The Node deleted and registered again (another UID): fail.
    w.node_uid = Some("uid-m0-reborn".into());
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::NodeReplaced)
    );
}

#[test]
fn of_two_unfinished_fences_for_one_node_only_the_older_acts() {
    let sp = spec(RequestedBy::Manual);
    let mut w = World::new();
    w.older_sibling = Some("m0-older".into());
    let mut st = created();
    let step = next_step(&sp, &st, &w.obs());
    assert_eq!(step, Step::Supersede("m0-older".into()));
    apply(&step, &mut st, &mut w, &|_| true);
    assert_eq!(st.phase, Phase::Failed);
    assert_eq!(st.superseded_by.as_deref(), Some("m0-older"));
    assert_eq!(next_step(&sp, &st, &w.obs()), Step::Nothing);
}

#[test]
fn the_recovery_challenge_goes_out_first_and_only_to_a_node_that_exists() {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    w.recovery.power_on = false;
    while st.phase != Phase::Released {
        let step = next_step(&sp, &st, &w.obs());
        apply(&step, &mut st, &mut w, &|_| true);
    }
    w.node_healthy = true;
    apply(&Step::Enter(Phase::Recovering), &mut st, &mut w, &|_| true);
    // The agent reports a clean inventory, but it cannot have answered a challenge not yet
    // posted: the challenge goes out before anything else.
    w.agent_clean = true;
    assert_eq!(next_step(&sp, &st, &w.obs()), Step::PostChallenge);
    // No Node object (deleted; it may register again): nothing to post on, the fence waits.
    w.node_uid = None;
    w.node_healthy = false;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::Rejoin,
            until: None
        }
    );
}

#[test]
fn recovery_rules() {
    let sp = spec(RequestedBy::Controller);
    // Drive to Released with power-on disabled.
    let mut st = created();
    let mut w = World::new();
    w.recovery.power_on = false;
    loop {
        let step = next_step(&sp, &st, &w.obs());
        if st.phase == Phase::Released {
            assert_eq!(
                step,
                Step::Wait {
                    why: WaitFor::NodeLeftOff,
                    until: None
                }
            );
            break;
        }
        apply(&step, &mut st, &mut w, &|_| true);
    }
    // An operator powers it on; it rejoins.
    w.node_healthy = true;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Enter(Phase::Recovering)
    );
    apply(&Step::Enter(Phase::Recovering), &mut st, &mut w, &|_| true);
    // The recovery challenge goes on the Node first.
    assert_eq!(next_step(&sp, &st, &w.obs()), Step::PostChallenge);
    apply(&Step::PostChallenge, &mut st, &mut w, &|_| true);
    // Rejoined, but no positive proof that the released pods' containers are gone: wait.
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::CleanProof,
            until: None
        }
    );
    w.agent_clean = true;
    let step = next_step(&sp, &st, &w.obs());
    assert!(matches!(step, Step::RecordCleanProof(_)), "{step:?}");
    apply(&step, &mut st, &mut w, &|_| true);
    // Level 0 (IPMI only) was verified: no storage to unfence; untaint is manual.
    w.recovery.untaint_when = UntaintWhen::Manual;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::ManualUntaint,
            until: None
        }
    );
    w.taint = false;
    assert_eq!(next_step(&sp, &st, &w.obs()), Step::Enter(Phase::Done));
}

/// A fence verified at level 1 (PDU + storage), released, Recovering, the node back with its
/// clean proof recorded: everything before the untaint is done.
fn recovering_with_clean_proof(
    untaint_when: UntaintWhen,
) -> (NodeFenceSpec, NodeFenceStatus, World) {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    w.recovery.untaint_when = untaint_when;
    for _ in 0..40 {
        if st.recovery.clean_proof.is_some() {
            break;
        }
        let step = next_step(&sp, &st, &w.obs());
        if matches!(
            step,
            Step::Wait {
                why: WaitFor::Rejoin,
                ..
            }
        ) {
            w.node_healthy = true;
            w.agent_clean = true;
        }
        apply(&step, &mut st, &mut w, &|l| l == 1);
        w.now += 1;
    }
    assert!(st.recovery.clean_proof.is_some() && st.recovery.unfenced_at.is_none());
    assert!(w.taint, "the release taints are on the node");
    (sp, st, w)
}

/// Steps `w` forward by `secs` seconds, one second at a time, asserting every step is a wait
/// (never an unfence), performing none.
fn only_waits_for(sp: &NodeFenceSpec, st: &NodeFenceStatus, w: &mut World, secs: i64) {
    for _ in 0..secs {
        let step = next_step(sp, st, &w.obs());
        assert!(matches!(step, Step::Wait { .. }), "at {}: {step:?}", w.now);
        w.now += 1;
    }
}

#[test]
fn the_storage_block_is_lifted_only_after_the_untaint_settled() {
    let (sp, mut st, mut w) = recovering_with_clean_proof(UntaintWhen::NodeReady);
    // The untaint comes first, while the block holds.
    let step = next_step(&sp, &st, &w.obs());
    assert_eq!(step, Step::RemoveTaint);
    apply(&step, &mut st, &mut w, &|_| true);
    // The controller's cache still shows the taint: wait for it, do not remove again.
    w.taint = true;
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::Untaint,
            until: None
        }
    );
    w.taint = false;
    let step = next_step(&sp, &st, &w.obs());
    assert_eq!(step, Step::RecordUntaintObserved);
    apply(&step, &mut st, &mut w, &|_| true);
    let observed = st.recovery.untaint_observed_at.clone().unwrap().0;
    // A VolumeAttachment of the node is still being detached: the block stays.
    w.unsettled = vec![obj("", "csi-va-9")];
    only_waits_for(&sp, &st, &mut w, 30);
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::AttachmentsSettle(vec!["csi-va-9".into()]),
            until: None
        }
    );
    w.unsettled.clear();
    // Settled, and more than the margin since the untaint: unfence, then Done.
    let step = next_step(&sp, &st, &w.obs());
    assert!(
        matches!(step, Step::Unfence(ref d) if d.iter().any(|d| d.kind == DeviceKind::Storage)),
        "{step:?}"
    );
    assert!(wall(w.now) >= observed + UNTAINT_SETTLE_MARGIN);
    apply(&step, &mut st, &mut w, &|_| true);
    assert_eq!(next_step(&sp, &st, &w.obs()), Step::Enter(Phase::Done));
}

#[test]
fn the_unfence_waits_the_margin_after_the_untaint_on_both_clocks() {
    let (sp, mut st, mut w) = recovering_with_clean_proof(UntaintWhen::NodeReady);
    apply(&Step::RemoveTaint, &mut st, &mut w, &|_| true);
    apply(&Step::RecordUntaintObserved, &mut st, &mut w, &|_| true);
    let margin = UNTAINT_SETTLE_MARGIN.as_secs() as i64;
    // Just short of the margin: wait, until the margin's end.
    only_waits_for(&sp, &st, &mut w, margin - 1);
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::UntaintMargin,
            until: Some(_)
        }
    ));
    // A forward step of the wall clock does not shorten it (the monotonic watch is short; the
    // phase's budget runs on the monotonic clock too).
    w.phase_seen_since = Some(w.clocks().mono);
    w.wall_step = 3600;
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::UntaintMargin,
            ..
        }
    ));
    w.wall_step = 0;
    w.now += 1;
    assert!(matches!(next_step(&sp, &st, &w.obs()), Step::Unfence(_)));
    // A new leader (no monotonic watch yet) counts the margin again from its first look.
    let mut fresh = w;
    fresh.untainted_since.set(None);
    assert!(matches!(
        next_step(&sp, &st, &fresh.obs()),
        Step::Wait {
            why: WaitFor::UntaintMargin,
            ..
        }
    ));
    fresh.now += margin;
    assert!(matches!(
        next_step(&sp, &st, &fresh.obs()),
        Step::Unfence(_)
    ));
}

#[test]
fn an_out_of_service_taint_that_reappears_restarts_the_margin() {
    let (sp, mut st, mut w) = recovering_with_clean_proof(UntaintWhen::NodeReady);
    apply(&Step::RemoveTaint, &mut st, &mut w, &|_| true);
    apply(&Step::RecordUntaintObserved, &mut st, &mut w, &|_| true);
    only_waits_for(&sp, &st, &mut w, 5);
    // Someone taints the node out-of-service again: the block stays while it is there.
    w.foreign = vec![OUT_OF_SERVICE.to_string()];
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Wait {
            why: WaitFor::ForeignOutOfService(OUT_OF_SERVICE.into()),
            until: None
        }
    );
    only_waits_for(&sp, &st, &mut w, 20);
    w.foreign.clear();
    // The wall-clock margin from the first observation is long over; the watch starts again.
    only_waits_for(&sp, &st, &mut w, UNTAINT_SETTLE_MARGIN.as_secs() as i64);
    assert!(matches!(next_step(&sp, &st, &w.obs()), Step::Unfence(_)));
}

#[test]
fn a_release_taint_another_actor_put_there_is_never_removed_and_its_out_of_service_keeps_the_block()
{
    let (sp, mut st, mut w) = recovering_with_clean_proof(UntaintWhen::NodeReady);
    // The node carried both taints before the fence tainted it (medik8s, a person): the fence
    // added none of them.
    w.taint = false;
    w.foreign = vec![FENCED.to_string(), OUT_OF_SERVICE.to_string()];
    for _ in 0..60 {
        let step = next_step(&sp, &st, &w.obs());
        assert_eq!(
            step,
            Step::Wait {
                why: WaitFor::ForeignOutOfService(OUT_OF_SERVICE.into()),
                until: None
            }
        );
        w.now += 1;
    }
    // Its owner lifts the out-of-service taint; the foreign NoSchedule taint stays, and
    // recovery neither removes it nor waits for it.
    w.foreign = vec![FENCED.to_string()];
    let mut steps = Vec::new();
    for _ in 0..40 {
        let step = next_step(&sp, &st, &w.obs());
        if step == Step::Nothing {
            break;
        }
        assert_ne!(step, Step::RemoveTaint);
        steps.push(step.label());
        apply(&step, &mut st, &mut w, &|_| true);
        w.now += 1;
    }
    steps.dedup();
    assert_eq!(
        steps,
        vec!["record_untaint_observed", "wait", "unfence", "enter"]
    );
    assert_eq!(st.phase, Phase::Done);
    assert_eq!(w.foreign, vec![FENCED.to_string()]);
}

#[test]
fn with_manual_untaint_the_block_stays_until_the_person_removed_the_taint_and_it_settled() {
    let (sp, mut st, mut w) = recovering_with_clean_proof(UntaintWhen::Manual);
    for _ in 0..30 {
        assert_eq!(
            next_step(&sp, &st, &w.obs()),
            Step::Wait {
                why: WaitFor::ManualUntaint,
                until: None
            }
        );
        w.now += 1;
    }
    // The person removes the taints.
    w.taint = false;
    let step = next_step(&sp, &st, &w.obs());
    assert_eq!(step, Step::RecordUntaintObserved);
    apply(&step, &mut st, &mut w, &|_| true);
    only_waits_for(&sp, &st, &mut w, UNTAINT_SETTLE_MARGIN.as_secs() as i64);
    assert!(matches!(next_step(&sp, &st, &w.obs()), Step::Unfence(_)));
    assert_eq!(
        st.recovery.untainted_at, None,
        "the controller removed nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// Property: random runs never break the invariants.

#[derive(Debug, Clone)]
enum Event {
    /// Ask for the next step and perform it.
    Step,
    /// Time passes.
    Tick(i64),
    /// Leadership changes (token goes up or a stale leader wakes up).
    Leader(i64),
    /// The node's heartbeat / agent state changes.
    Node(bool, bool),
    /// Another actor's out-of-service taint appears on (or leaves) the node.
    Foreign(bool),
    /// One of the node's VolumeAttachments starts (or stops) being detached.
    Detaching(bool),
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => Just(Event::Step),
        1 => (1i64..40).prop_map(Event::Tick),
        1 => (0i64..4).prop_map(Event::Leader),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(h, c)| Event::Node(h, c)),
        1 => any::<bool>().prop_map(Event::Foreign),
        1 => any::<bool>().prop_map(Event::Detaching),
    ]
}

/// What a random run went through (for the vacuity check).
#[derive(Debug, Default)]
struct Seen {
    refused: bool,
    released: bool,
    phase: Option<Phase>,
    failure: Option<FailureReason>,
}

#[derive(Debug, Clone)]
struct Run {
    events: Vec<Event>,
    ok0: bool,
    ok1: bool,
    manual: bool,
    power_on: bool,
}

fn arb_run() -> impl Strategy<Value = Run> {
    (
        proptest::collection::vec(arb_event(), 1..80),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(events, ok0, ok1, manual, power_on)| Run {
            events,
            ok0,
            ok1,
            manual,
            power_on,
        })
}

/// Drive the state machine through `run`, checking every invariant after every step.
fn check_run(run: &Run) -> Result<Seen, TestCaseError> {
    let (ok0, ok1) = (run.ok0, run.ok1);
    let sp = spec(if run.manual {
        RequestedBy::Manual
    } else {
        RequestedBy::Controller
    });
    let mut st = created();
    let mut w = World::new();
    let mut seen = Seen::default();
    w.recovery.power_on = run.power_on;
    let level_ok = move |l: i32| if l == 0 { ok0 } else { ok1 };
    for e in run.events.iter().cloned() {
        match e {
            Event::Tick(s) => w.now += s,
            Event::Leader(t) => w.token = t,
            Event::Node(h, c) => {
                w.node_healthy = h;
                w.agent_clean = c;
            }
            Event::Foreign(on) => {
                w.foreign = if on {
                    vec![OUT_OF_SERVICE.to_string()]
                } else {
                    Vec::new()
                };
            }
            Event::Detaching(on) => {
                w.unsettled = if on {
                    vec![obj("", "csi-va-2")]
                } else {
                    Vec::new()
                };
            }
            Event::Step => {
                let before = st.clone();
                let step = next_step(&sp, &st, &w.obs());
                // Terminal phases do nothing.
                if before.phase.is_terminal() {
                    prop_assert_eq!(&step, &Step::Nothing);
                }
                // A stale leader is refused, and only a stale leader is.
                let stale = before.fencing_token.is_some_and(|r| w.token < r)
                    && !before.phase.is_terminal();
                prop_assert_eq!(stale, matches!(step, Step::Refuse { .. }));
                seen.refused |= stale;
                // Actions only under the recorded token.
                if step.is_action() {
                    prop_assert_eq!(before.fencing_token, Some(w.token));
                }
                // Release actions only from Releasing with a verified fence.
                if matches!(
                    step,
                    Step::ApplyTaint(..)
                        | Step::ReleasePod(..)
                        | Step::DeleteAttachment(..)
                        | Step::ClearAttachRecord(..)
                ) {
                    prop_assert_eq!(before.phase, Phase::Releasing);
                    prop_assert!(before.verified_fence().is_some());
                }
                // The storage block is lifted only after the untaint settled: no taint of the
                // fence's and no out-of-service taint on the node, its attachments settled, and
                // the margin passed since the recorded untaint on both clocks.
                if matches!(step, Step::Unfence(_)) {
                    let obs = w.obs();
                    prop_assert!(w.untainted() && w.unsettled.is_empty());
                    let observed = before.recovery.untaint_observed_at.as_ref().map(|t| t.0);
                    prop_assert!(
                        observed.is_some_and(|o| w.clocks().wall >= o + UNTAINT_SETTLE_MARGIN)
                    );
                    prop_assert!(obs
                        .untainted_for
                        .is_some_and(|d| d >= UNTAINT_SETTLE_MARGIN));
                    prop_assert!(before.recovery.clean_proof.is_some());
                }
                // Only the fence's own taints are removed, and only after the clean proof.
                if matches!(step, Step::RemoveTaint) {
                    prop_assert!(w.taint && before.recovery.clean_proof.is_some());
                }
                // `apply` unwraps every status mutation: an illegal transition panics here.
                apply(&step, &mut st, &mut w, &level_ok);
                // Anything released implies a verified fence.
                if st.released_anything() {
                    prop_assert!(st.verified_fence().is_some());
                    seen.released = true;
                }
                if st
                    .failure
                    .as_ref()
                    .is_some_and(|f| f.reason == FailureReason::AllLevelsFailed)
                {
                    prop_assert!(!st.released_anything());
                    prop_assert!(!ok0 && !ok1);
                }
                // Conditions are always exactly the derived ones.
                prop_assert_eq!(&st.conditions, &st.derived_conditions());
            }
        }
    }
    // With both levels failing, nothing is ever released.
    if !ok0 && !ok1 {
        prop_assert!(!st.released_anything());
        prop_assert_eq!(w.pods.len(), 2);
    }
    seen.phase = Some(st.phase);
    seen.failure = st.failure.as_ref().map(|f| f.reason);
    Ok(seen)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn random_runs_keep_every_invariant(run in arb_run()) {
        check_run(&run)?;
    }
}

#[test]
fn the_random_runs_reach_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = arb_run();
    let mut phases = std::collections::BTreeMap::<String, usize>::new();
    let (mut refused, mut released) = (0, 0);
    for _ in 0..3000 {
        let run = strategy.new_tree(&mut runner).unwrap().current();
        let seen = check_run(&run).unwrap();
        refused += usize::from(seen.refused);
        released += usize::from(seen.released);
        let key = format!("{:?}/{:?}", seen.phase.unwrap(), seen.failure);
        *phases.entry(key).or_default() += 1;
    }
    assert!(
        refused > 0 && released > 0,
        "refused {refused}, released {released}"
    );
    for want in [
        "Done/None",
        "Failed/Some(AllLevelsFailed)",
        "Failed/Some(BudgetExceeded)",
        "Released/None",
        "Recovering/None",
        "Releasing/None",
        "Fencing/None",
        "Pending/None",
    ] {
        assert!(
            phases.contains_key(want),
            "{want} never reached: {phases:?}"
        );
    }
}

/// One level for a host that must not power off: storage firewall, then the BMC's reset.
fn reset_plan() -> FencePlan {
    let mut p = plan();
    p.levels = vec![PlanLevel::Hardware {
        name: "storage+reset".into(),
        devices: vec![
            dev("storagefw+https://fw/m0", DeviceKind::Storage),
            dev("ipmi://bmc", DeviceKind::Power),
        ],
        power_off: PowerOff::Disallowed,
    }];
    p
}

#[test]
fn a_host_that_must_not_power_off_is_reset_released_on_storage_and_never_powered() {
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    w.verdict = Some(Verdict::Fence(reset_plan()));
    let mut st = created();
    let mut steps = release_all(&sp, &mut st, &mut w, &|_| true);
    let run = steps
        .iter()
        .find(|s| matches!(s, Step::RunLevel { .. }))
        .expect("the level ran");
    assert!(
        matches!(run, Step::RunLevel { reset: true, .. }),
        "the level resets instead of powering off: {run:?}"
    );
    // Verified on the storage block alone: only the pod that mounts a claim is released.
    assert_eq!(st.verified_fence().unwrap().coverage(), Coverage::Stateful);
    let released: Vec<&str> = st.release.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(released, vec!["db-0"]);
    // Recovery, with power_on in the policy: never a power command; the block is lifted only
    // after a clean proof.
    assert!(w.recovery.power_on);
    for _ in 0..30 {
        let step = next_step(&sp, &st, &w.obs());
        if let Step::Wait {
            why: WaitFor::Rejoin,
            ..
        } = step
        {
            w.node_healthy = true;
            w.agent_clean = true;
        }
        if step == Step::Nothing {
            break;
        }
        apply(&step, &mut st, &mut w, &|_| true);
        steps.push(step);
        w.now += 1;
    }
    assert_eq!(st.phase, Phase::Done, "{steps:?}");
    assert!(
        !steps.iter().any(|s| matches!(s, Step::PowerOn(_))),
        "a host that must not power off gets no power command: {steps:?}"
    );
    let proof = steps
        .iter()
        .position(|s| matches!(s, Step::RecordCleanProof(_)))
        .expect("a clean proof was recorded");
    let unfence = steps
        .iter()
        .position(|s| matches!(s, Step::Unfence(d) if d == &vec![dev("storagefw+https://fw/m0", DeviceKind::Storage)]))
        .expect("the storage block was lifted");
    assert!(proof < unfence);
}

#[test]
fn after_a_reset_fence_a_clean_proof_needs_a_new_boot_id_as_well() {
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    w.verdict = Some(Verdict::Fence(reset_plan()));
    let mut st = created();
    release_all(&sp, &mut st, &mut w, &|_| true);
    st.recovery.boot_id_at_fence = Some("boot-a".into());
    // The same boot, with an answered inventory that lists none of the released pods: that
    // proves a power-off fence clean, but not this one (nothing shows the reset happened).
    let same_boot = answered("boot-a", "nf-uid");
    assert_eq!(proof(&st, &same_boot), None);
    // No boot ID advertised at all: no proof either.
    let no_boot = Advertisement {
        boot_id: None,
        ..same_boot.clone()
    };
    assert_eq!(proof(&st, &no_boot), None);
    // A new boot ID with the answered inventory is the proof; without the answer it is not.
    assert!(proof(&st, &answered("boot-b", "nf-uid"))
        .unwrap()
        .contains("boot-b"));
    let unanswered = Advertisement {
        challenge: None,
        ..answered("boot-b", "nf-uid")
    };
    assert_eq!(proof(&st, &unanswered), None);
    // The same status on a power-off plan accepts the inventory (the rule is the level's).
    let mut powered = st.clone();
    powered.plan.as_mut().unwrap().levels[0].kind = palisade_model::nodefence::LevelKind::Hardware;
    assert!(proof(&powered, &same_boot).is_some());
}

#[test]
fn a_reset_level_without_a_storage_device_fails_without_acting() {
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    let mut p = reset_plan();
    if let PlanLevel::Hardware { devices, .. } = &mut p.levels[0] {
        devices.retain(|d| d.kind == DeviceKind::Power);
    }
    w.verdict = Some(Verdict::Fence(p));
    let mut st = created();
    let start = next_step(&sp, &st, &w.obs());
    assert!(matches!(start, Step::StartFencing { .. }));
    apply(&start, &mut st, &mut w, &|_| true);
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::NoPlan)
    );
}

/// Performs `step`, then moves the clock one second on; a node awaited to rejoin comes back
/// clean first.
fn recovery_tick(
    step: &Step,
    st: &mut NodeFenceStatus,
    w: &mut World,
    level_ok: &dyn Fn(i32) -> bool,
) {
    if let Step::Wait {
        why: WaitFor::Rejoin,
        ..
    } = step
    {
        w.node_healthy = true;
        w.agent_clean = true;
    }
    apply(step, st, w, level_ok);
    w.now += 1;
}

/// Drives a fence verified at level 1 and released through recovery until it records its clean
/// proof, or waits on a machine identity mismatch (then returns that wait).
fn recover_until_proof_or_mismatch(st: &mut NodeFenceStatus, w: &mut World) -> Option<Step> {
    let sp = spec(RequestedBy::Controller);
    for _ in 0..40 {
        if st.recovery.clean_proof.is_some() {
            return None;
        }
        let step = next_step(&sp, st, &w.obs());
        if let Step::Wait {
            why: WaitFor::IdentityMismatch { .. },
            ..
        } = &step
        {
            return Some(step);
        }
        recovery_tick(&step, st, w, &|l| l == 1);
    }
    panic!("recovery neither recorded a proof nor refused the machine: {st:?}");
}

#[test]
fn the_pin_records_the_machine_the_node_reports() {
    let w = World::new();
    assert_eq!(
        next_step(&spec(RequestedBy::Controller), &unpinned(), &w.obs()),
        Step::PinNode(PinnedNode {
            name: "m0".into(),
            uid: "uid-m0".into(),
            system_uuid: Some(M0_UUID.into()),
        })
    );
    // A Node that reports no comparable UUID (its name, all zeros) pins none.
    for reported in [
        Some("m0"),
        Some("00000000-0000-0000-0000-000000000000"),
        None,
    ] {
        let mut w = World::new();
        w.node_system_uuid = reported.map(str::to_string);
        let Step::PinNode(p) = next_step(&spec(RequestedBy::Controller), &unpinned(), &w.obs())
        else {
            panic!("the first step pins the node");
        };
        assert_eq!(p.system_uuid, None, "{reported:?}");
    }
}

/// Another machine took over the node's name just before the fence pinned it (its kubelet
/// rewrote the Node's `systemUUID`, its agent's renewals not yet observed): the pin names the
/// machine whose renewals fell silent, and the newcomer's clean answer never lifts the block
/// (the planted `PinWithoutMachine`'s schedule in the simulation, seed 20269216, found that
/// pinning the Node's report alone let it).
#[test]
fn the_pin_names_the_machine_that_fell_silent_not_one_registered_since() {
    let mut w = World::new();
    w.node_system_uuid = Some(OTHER_UUID.into());
    w.advertised_uuid = Some(M0_UUID.into());
    let Step::PinNode(p) = next_step(&spec(RequestedBy::Controller), &unpinned(), &w.obs()) else {
        panic!("the first step pins the node");
    };
    assert_eq!(p.system_uuid.as_deref(), Some(M0_UUID));
    // An advertisement without a comparable UUID leaves the Node's report.
    w.advertised_uuid = Some("m0".into());
    let Step::PinNode(p) = next_step(&spec(RequestedBy::Controller), &unpinned(), &w.obs()) else {
        panic!("the first step pins the node");
    };
    assert_eq!(p.system_uuid.as_deref(), Some(OTHER_UUID));
    // Pinned on the silent machine, the newcomer's answer waits on the mismatch.
    let mut st = created();
    w.advertised_uuid = Some(M0_UUID.into());
    w.answer_uuid = Some(OTHER_UUID.into());
    assert!(matches!(
        recover_until_proof_or_mismatch(&mut st, &mut w),
        Some(Step::Wait {
            why: WaitFor::IdentityMismatch { .. },
            ..
        })
    ));
    assert!(st.recovery.clean_proof.is_none());
}

#[test]
fn a_recovery_answer_from_another_machine_under_the_same_name_is_refused() {
    let mut st = created();
    let mut w = World::new();
    w.answer_uuid = Some(OTHER_UUID.into());
    let refused = recover_until_proof_or_mismatch(&mut st, &mut w);
    assert_eq!(
        refused,
        Some(Step::Wait {
            why: WaitFor::IdentityMismatch {
                pinned: M0_UUID.into(),
                found: Some(OTHER_UUID.into()),
                from: IdentityFrom::Answer,
            },
            until: None,
        })
    );
    assert!(st.recovery.clean_proof.is_none());
    // The pinned machine answers (in the other byte order of the same 16 bytes): it counts.
    w.answer_uuid = Some(palisade_model::identity::swapped(M0_UUID));
    assert_eq!(recover_until_proof_or_mismatch(&mut st, &mut w), None);
    assert!(st.recovery.clean_proof.is_some());
}

#[test]
fn an_answer_that_advertises_no_machine_is_refused_when_the_fence_pinned_one() {
    let mut st = created();
    let mut w = World::new();
    w.answer_uuid = None;
    assert_eq!(
        recover_until_proof_or_mismatch(&mut st, &mut w),
        Some(Step::Wait {
            why: WaitFor::IdentityMismatch {
                pinned: M0_UUID.into(),
                found: None,
                from: IdentityFrom::Answer,
            },
            until: None,
        })
    );
    assert!(st.recovery.clean_proof.is_none());
}

#[test]
fn a_node_that_reports_another_machine_refuses_the_recovery_answer() {
    let mut st = created();
    let mut w = World::new();
    // The agent still advertises the pinned machine, but the Node now reports another one.
    w.node_system_uuid = Some(OTHER_UUID.into());
    assert_eq!(
        recover_until_proof_or_mismatch(&mut st, &mut w),
        Some(Step::Wait {
            why: WaitFor::IdentityMismatch {
                pinned: M0_UUID.into(),
                found: Some(OTHER_UUID.into()),
                from: IdentityFrom::Node,
            },
            until: None,
        })
    );
    assert!(st.recovery.clean_proof.is_none());
}

#[test]
fn a_fence_pinned_without_a_machine_accepts_any_answer_and_a_person_needs_no_machine() {
    // Pinned before machine identities were pinned (or a Node without one): today's rule.
    let mut st = created();
    st.pinned.as_mut().unwrap().system_uuid = None;
    let mut w = World::new();
    w.answer_uuid = None;
    assert_eq!(recover_until_proof_or_mismatch(&mut st, &mut w), None);
    // A person's confirmation is no machine's answer: nothing to compare.
    let mut st = created();
    let mut w = World::new();
    w.answer_uuid = Some(OTHER_UUID.into());
    w.confirmed_by_person = true;
    assert_eq!(recover_until_proof_or_mismatch(&mut st, &mut w), None);
}

/// Drives a fence (verified at level 1: PDU + storage) into Releasing up to its first release
/// decision: the taint is applied. Returns the next step.
fn releasing_after_taint(st: &mut NodeFenceStatus, w: &mut World) -> Step {
    let sp = spec(RequestedBy::Controller);
    for _ in 0..20 {
        let step = next_step(&sp, st, &w.obs());
        if st.release.tainted_at.is_some() {
            return step;
        }
        apply(&step, st, w, &|l| l == 1);
        w.now += 1;
    }
    panic!("never tainted: {st:?}");
}

#[test]
fn power_is_read_again_before_the_first_release_and_after_a_leader_change() {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    // Only the level's power device that proved it off is read (not the storage firewall).
    assert_eq!(
        releasing_after_taint(&mut st, &mut w),
        Step::RecheckPower(vec![dev("snmp+pdu://pdu/1", DeviceKind::Power)])
    );
    let step = next_step(&sp, &st, &w.obs());
    apply(&step, &mut st, &mut w, &|l| l == 1);
    let Step::ReleasePod(_, first) = next_step(&sp, &st, &w.obs()) else {
        panic!("the device read off: the release goes ahead");
    };
    apply(
        &Step::ReleasePod(st.verified_fence().unwrap(), first),
        &mut st,
        &mut w,
        &|_| true,
    );
    // Under the same token, no second read before the next release.
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::ReleasePod(..)
    ));
    // A new leader (a higher token) reads again before its first release.
    w.token = 2;
    let step = next_step(&sp, &st, &w.obs());
    assert_eq!(step, Step::RecordToken(2));
    apply(&step, &mut st, &mut w, &|_| true);
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::RecheckPower(_)
    ));
}

#[test]
fn a_machine_powered_on_since_the_verify_fails_the_fence_before_any_release() {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    let step = releasing_after_taint(&mut st, &mut w);
    w.power_reads = RecheckedPower::On;
    apply(&step, &mut st, &mut w, &|l| l == 1);
    assert_eq!(
        next_step(&sp, &st, &w.obs()),
        Step::Fail(FailureReason::PowerNotOff)
    );
    assert!(st.release.pods.is_empty());
}

#[test]
fn an_unreadable_power_device_is_read_again_a_few_times_then_fails_the_fence() {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    let mut step = releasing_after_taint(&mut st, &mut w);
    w.power_reads = RecheckedPower::Unknown;
    let mut reads = 0;
    for _ in 0..60 {
        match &step {
            Step::RecheckPower(_) => reads += 1,
            Step::Wait {
                why: WaitFor::PowerRecheck,
                until: Some(_),
            } => {}
            Step::Fail(FailureReason::PowerNotOff) => break,
            other => panic!("never a release on an unreadable device: {other:?}"),
        }
        apply(&step, &mut st, &mut w, &|l| l == 1);
        w.now += 1;
        step = next_step(&sp, &st, &w.obs());
    }
    assert_eq!(step, Step::Fail(FailureReason::PowerNotOff));
    assert_eq!(reads, palisade_decide::phase::POWER_REREADS);
    // A device that reads off on a retry lets the release go ahead.
    let mut st = created();
    let mut w = World::new();
    let step = releasing_after_taint(&mut st, &mut w);
    w.power_reads = RecheckedPower::Unknown;
    apply(&step, &mut st, &mut w, &|l| l == 1);
    w.power_reads = RecheckedPower::Off;
    w.now += palisade_decide::phase::POWER_REREAD_RETRY.as_secs() as i64;
    let step = next_step(&sp, &st, &w.obs());
    assert!(matches!(step, Step::RecheckPower(_)), "{step:?}");
    apply(&step, &mut st, &mut w, &|l| l == 1);
    assert!(matches!(
        next_step(&sp, &st, &w.obs()),
        Step::ReleasePod(..)
    ));
}

#[test]
fn no_power_is_read_again_for_a_level_that_did_not_power_off() {
    // A storage-only level: nothing powered off, nothing to re-read.
    let sp = spec(RequestedBy::Controller);
    let mut w = World::new();
    let mut p = plan();
    if let PlanLevel::Hardware { devices, .. } = &mut p.levels[1] {
        devices.retain(|d| d.kind == DeviceKind::Storage);
    }
    w.verdict = Some(Verdict::Fence(p));
    let mut st = created();
    assert!(matches!(
        releasing_after_taint(&mut st, &mut w),
        Step::ReleasePod(..)
    ));
    // A reset level (powerOff: Disallowed) and a self-fence level prove nothing by power.
    let mut w = World::new();
    w.verdict = Some(Verdict::Fence(reset_plan()));
    let mut st = created();
    let sp2 = spec(RequestedBy::Controller);
    let mut step = next_step(&sp2, &st, &w.obs());
    for _ in 0..20 {
        if st.release.tainted_at.is_some() {
            break;
        }
        apply(&step, &mut st, &mut w, &|_| true);
        w.now += 1;
        step = next_step(&sp2, &st, &w.obs());
    }
    assert!(st.release.tainted_at.is_some());
    assert!(!matches!(step, Step::RecheckPower(_)), "{step:?}");
    let _ = sp;
}

/// A device attempt on `device` at wall second `1_000 + s`.
fn attempt(device: &str, action: DeviceAction, outcome: AttemptOutcome, s: i64) -> DeviceAttempt {
    DeviceAttempt {
        level: 0,
        device: device.into(),
        action,
        outcome,
        token: 1,
        at: MicroTime(Timestamp::from_second(1_000 + s).unwrap()),
        message: String::new(),
        seen_token: None,
    }
}

/// Found on the lab (a Fujitsu-like BMC refusing a power-on right after a power-off): a
/// refused power-on was retried on every reconcile, about twice a second, each attempt
/// kept in the status.
#[test]
fn a_refused_recovery_action_waits_longer_after_each_failure_up_to_a_bound() {
    let bmc = PlannedDevice {
        url: "redfish+https://bmc".into(),
        kind: DeviceKind::Power,
        timeout_seconds: 20,
        fences: None,
        identity_from: None,
    };
    let mut st = NodeFenceStatus::default();
    // The fence's own power-off and another device's failures do not count.
    st.attempts.push(attempt(
        &bmc.url,
        DeviceAction::PowerOff,
        AttemptOutcome::Failed,
        0,
    ));
    st.attempts.push(attempt(
        "ipmi://other",
        DeviceAction::PowerOn,
        AttemptOutcome::Failed,
        0,
    ));
    assert_eq!(
        palisade_decide::phase::recovery_retry_at(&st, std::slice::from_ref(&bmc)),
        None
    );
    let mut delays = Vec::new();
    for n in 0..8 {
        st.attempts.push(attempt(
            &bmc.url,
            DeviceAction::PowerOn,
            AttemptOutcome::Failed,
            10 * n,
        ));
        let at =
            palisade_decide::phase::recovery_retry_at(&st, std::slice::from_ref(&bmc)).unwrap();
        delays.push(at.as_second() - (1_000 + 10 * n));
    }
    assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30, 30]);
}

/// A recovery action its device refuses is tried again only after a wait that doubles
/// ([`palisade_decide::phase::recovery_retry_at`]), in the core that the operator and the
/// simulation share: the fence waits (`RecoveryRetry`) between the tries, then goes on.
#[test]
fn a_refused_power_on_is_tried_again_after_doubling_waits_then_recovery_goes_on() {
    let sp = spec(RequestedBy::Controller);
    let mut st = created();
    let mut w = World::new();
    w.refused_recoveries = 3;
    let level_ok = |l: i32| l == 1;
    let mut tries = Vec::new();
    let mut waited = 0;
    for _ in 0..200 {
        let step = next_step(&sp, &st, &w.obs());
        match &step {
            Step::Nothing => break,
            Step::PowerOn(_) => tries.push(w.now),
            Step::Wait {
                why: WaitFor::RecoveryRetry,
                until,
            } => {
                assert!(until.is_some_and(|u| u > wall(w.now)), "{until:?}");
                waited += 1;
            }
            _ => {}
        }
        recovery_tick(&step, &mut st, &mut w, &level_ok);
    }
    let gaps: Vec<i64> = tries.windows(2).map(|p| p[1] - p[0]).collect();
    // Refused three times (each try sends both planned power devices), then it goes through.
    assert_eq!(gaps.len(), 3, "{tries:?}");
    assert!(gaps[0] >= 1 && gaps[1] >= 2 && gaps[2] >= 4, "{gaps:?}");
    assert!(waited >= 4, "{waited} waits");
    assert_eq!(st.phase, Phase::Done, "{:?}", st.failure);
}
