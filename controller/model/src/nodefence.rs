//! `NodeFence`: one fencing operation, and its persisted state machine.
//!
//! The status is the single source of truth a (new) leader resumes from: an explicit [`Phase`]
//! plus everything already done (plan, device attempts, evidence, what was released, a
//! timestamp per transition). Conditions are *derived* from the phase by
//! [`NodeFenceStatus::transition`]; nothing writes them independently.
//!
//! "Fenced" means verified, not commanded: the only way to obtain a [`VerifiedFence`] is
//! [`NodeFenceStatus::verified_fence`], which requires a level recorded as verified *with
//! evidence*, and release steps (in `palisade-decide`) cannot be built without one.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::target::DeviceKind;

/// Spec of a `NodeFence` (cluster-scoped): a request to fence one node.
// kube's `printcolumn(...)` repeats `type_ = ...`, which clippy mistakes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "palisade.dev",
    version = "v1alpha1",
    kind = "NodeFence",
    plural = "nodefences",
    shortname = "nf",
    status = "NodeFenceStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "By",
        type_ = "string",
        json_path = ".spec.requestedBy",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeFenceSpec {
    /// The node to fence.
    #[schemars(length(min = 1))]
    pub node_name: String,
    /// Why the fence was requested (free text, shown in Events).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Who asked: the controller, or a person (the default when omitted).
    #[serde(default)]
    pub requested_by: RequestedBy,
    /// Guards a *manual* request may skip. Ignored on controller requests.
    #[serde(default)]
    pub overrides: Overrides,
}

/// Who requested a fence.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RequestedBy {
    /// The controller's own decision.
    Controller,
    /// A person (`kubectl create`).
    #[default]
    Manual,
}

/// Guards a manual `NodeFence` may skip. Everything else (no policy, exclusions, `paused`,
/// `dryRun`, concurrency limits, cooldown) still applies to manual requests.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overrides {
    /// Fence even if the quorum guard (too many silent nodes, all zones down) would hold.
    #[serde(default)]
    pub quorum_guard: bool,
    /// Fence without waiting for pod forgiveness.
    #[serde(default)]
    pub forgiveness: bool,
    /// Fence even if the controller does not see the node as Unhealthy (for example a node that
    /// heartbeats but is known to be broken).
    #[serde(default)]
    pub node_health: bool,
    /// Fence even after the escalation limit for a flapping node was reached, and within the
    /// cooldown after its last fence (for example a retry once a failed fence's device was
    /// fixed).
    #[serde(default)]
    pub escalation: bool,
}

/// The persisted phase of a fencing operation. Each variant documents what has **already been
/// done** when the status says so.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
pub enum Phase {
    /// Nothing has been done to the node. The request waits for the decision guards.
    #[default]
    Pending,
    /// A plan and a fencing token are recorded, and device commands may have been sent (levels
    /// tried so far are in `levels` and `attempts`). The node is NOT known to be fenced;
    /// nothing has been released.
    Fencing,
    /// One level was verified (the device reported power off / the storage reported the node
    /// blocked, evidence recorded). Nothing has been released yet.
    Fenced,
    /// The fence is verified and release has started: the out-of-service taint and some pods,
    /// attachments and attach records may already be released (listed in `release`).
    Releasing,
    /// Every pod, VolumeAttachment and attach record of the node is released. The node is still
    /// fenced and tainted.
    Released,
    /// Release is complete and the node is being brought back: it may be powered on, it may
    /// have rejoined, its storage fence may be lifted (see `recovery`).
    Recovering,
    /// Terminal. Either the node recovered (storage unfenced, taint removed as the policy says),
    /// or the request was withdrawn while Pending, before anything was done.
    Done,
    /// Terminal, alert-worthy. `failure` says why and in which phase. A failure in `Pending` or
    /// `Fencing` means nothing was released.
    Failed,
}

/// Slack added to the sum of device timeouts for the Fencing phase budget. It covers a leader
/// failover in the middle of a level (the new leader must still be inside the budget).
pub const FENCING_SLACK: Duration = Duration::from_secs(60);

impl Phase {
    /// Every phase, in lifecycle order.
    pub const ALL: [Phase; 8] = [
        Phase::Pending,
        Phase::Fencing,
        Phase::Fenced,
        Phase::Releasing,
        Phase::Released,
        Phase::Recovering,
        Phase::Done,
        Phase::Failed,
    ];

    /// Done or Failed: no further step.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Done | Phase::Failed)
    }

    /// The phase's time budget, or `None` when it may last indefinitely (Pending waits for the
    /// guards, Released may leave a node off for good, terminal phases are over). The Fencing
    /// budget is the sum of the planned devices' timeouts plus [`FENCING_SLACK`]; a self-fence
    /// level's wait is accounted for in [`NodeFenceStatus::deadline`].
    pub fn budget(self, plan: Option<&FencePlan>) -> Option<Duration> {
        match self {
            Phase::Pending | Phase::Released | Phase::Done | Phase::Failed => None,
            Phase::Fencing => {
                let devices: u64 = plan
                    .map(|p| {
                        p.levels
                            .iter()
                            .flat_map(|l| &l.devices)
                            .map(|d| d.timeout_seconds.max(0) as u64)
                            .sum()
                    })
                    .unwrap_or(0);
                Some(Duration::from_secs(devices) + FENCING_SLACK)
            }
            // Budgets after verification are generous: they exist to surface a stuck operation,
            // and must not fail a verified fence because a leader failover took a while.
            Phase::Fenced => Some(Duration::from_secs(120)),
            Phase::Releasing => Some(Duration::from_secs(300)),
            Phase::Recovering => Some(Duration::from_secs(900)),
        }
    }

    /// Whether the state machine may go from `self` to `to`.
    pub fn can_transition_to(self, to: Phase) -> bool {
        use Phase::*;
        matches!(
            (self, to),
            (Pending, Fencing | Done | Failed)
                | (Fencing, Fenced | Failed)
                | (Fenced, Releasing | Failed)
                | (Releasing, Released | Failed)
                | (Released, Recovering | Failed)
                | (Recovering, Done | Failed)
        )
    }

    /// Name as persisted (and as used in metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Fencing => "Fencing",
            Phase::Fenced => "Fenced",
            Phase::Releasing => "Releasing",
            Phase::Released => "Released",
            Phase::Recovering => "Recovering",
            Phase::Done => "Done",
            Phase::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Status of a `NodeFence`. Mutate it only through the methods here, so the invariants hold
/// (transitions follow [`Phase::can_transition_to`], conditions follow the phase, a verified
/// level always has evidence).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeFenceStatus {
    /// Current phase.
    #[serde(default)]
    pub phase: Phase,
    /// The node this fence acts on, pinned by the controller's first step: its name and the
    /// UID of its Node object. A fence whose `spec.nodeName` changes later, or whose Node is
    /// replaced by one with another UID, fails and does nothing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<PinnedNode>,
    /// When this fence was superseded: the name of the older unfinished `NodeFence` for the
    /// same node, which alone acts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// The highest leadership fencing token that has acted on this fence. Device actions carry
    /// it; a leader holding a lower token must act on nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    /// The plan recorded when fencing started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<FencePlan>,
    /// The last decision verdict while Pending (why it waits or holds); while a self-fence
    /// level waits in Fencing, what it waits for (labels `fencing_wait_*`), which a
    /// `BudgetExceeded` failure then names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<VerdictRecord>,
    /// Conclusion of each level tried, in order.
    #[serde(default)]
    pub levels: Vec<LevelOutcome>,
    /// Every device action, in order.
    #[serde(default)]
    pub attempts: Vec<DeviceAttempt>,
    /// What proved the fence (device status readings, or the self-fence timeout).
    #[serde(default)]
    pub evidence: Vec<Evidence>,
    /// What was released.
    #[serde(default)]
    pub release: ReleaseProgress,
    /// Recovery progress.
    #[serde(default)]
    pub recovery: RecoveryProgress,
    /// Why the fence failed, when `phase` is Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// One entry per phase transition (the timeline).
    #[serde(default)]
    pub transitions: Vec<Transition>,
    /// Derived from `phase` on every transition; never written independently.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The node identity a fence acts on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedNode {
    /// `spec.nodeName` when pinned.
    pub name: String,
    /// The Node object's UID when pinned (empty if the Node did not exist then).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The machine this fence acts on: the machine UUID the node's last observed renewal
    /// advertised when pinned (the machine that fell silent), else the Node's
    /// `status.nodeInfo.systemUUID`; absent if neither names a comparable UUID
    /// ([`crate::identity::normalize_uuid`]).
    ///
    /// Guarantees (of the controller): while it is set, a recovery answer counts only from a
    /// renewal that advertises the same machine ([`crate::identity::same_machine`] with
    /// [`crate::advertise::Advertisement::system_uuid`]), and only while the Node reports no
    /// other machine; a fence pinned without one keeps the older rule (any answer counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_uuid: Option<String>,
}

/// The fencing plan persisted at Pending → Fencing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FencePlan {
    /// Levels, in the order they are tried.
    pub levels: Vec<PlannedLevel>,
}

/// One planned level.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedLevel {
    /// Name, from the FenceTarget level (or `self-fence`).
    pub name: String,
    /// Hardware devices, or the trusted self-fence.
    pub kind: LevelKind,
    /// Devices (empty for a self-fence level).
    #[serde(default)]
    pub devices: Vec<PlannedDevice>,
    /// For a self-fence level: from this time on, the node counts as fenced (never earlier
    /// than `silentSince` plus `trustWaitSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_after: Option<MicroTime>,
    /// For a self-fence level: the node's last renewal the controller observed before the
    /// silence. A renewal observed after it restarts the wait from that renewal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silent_since: Option<MicroTime>,
    /// For a self-fence level: the advertised self-fence timeout plus twice the advertised
    /// watchdog timeout plus the policy's margin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub trust_wait_seconds: Option<i64>,
    /// For a self-fence level: what the agent advertised its self-fence kills (`All`, or
    /// `Stateful`: the pods that mount a PersistentVolumeClaim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_fence_scope: Option<Coverage>,
    /// For a self-fence level: the node's heartbeat marker (its Lease `renewTime`) at
    /// `silentSince`. Any other marker later means the node renewed since, even if the
    /// controller that saw it was restarted in between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silent_marker: Option<String>,
}

/// What a verified level proves about the node's pods.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Coverage {
    /// Every process of the node is stopped (power off verified, or a trusted self-fence that
    /// kills every pod): every pod of the node may be released.
    All,
    /// Only the pods that mount a PersistentVolumeClaim are cut off (a verified storage block,
    /// or a trusted self-fence that kills only such pods). Any other pod may still run, so it
    /// is never released on this proof.
    Stateful,
}

impl Coverage {
    /// Whether a pod (that mounts a PersistentVolumeClaim or not) is covered.
    pub fn covers(self, mounts_claim: bool) -> bool {
        match self {
            Coverage::All => true,
            Coverage::Stateful => mounts_claim,
        }
    }

    /// Stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            Coverage::All => "All",
            Coverage::Stateful => "Stateful",
        }
    }
}

/// Kind of a planned level.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum LevelKind {
    /// Devices from the node's FenceTarget, commanded and verified.
    Hardware,
    /// The policy-enabled trust rule: the node's agent self-fences after a timeout it advertises.
    SelfFence,
    /// A FenceTarget level with `powerOff: Disallowed`: its storage devices block (verified),
    /// then its power devices restart the machine without powering it off
    /// ([`DeviceAction::Reset`], not evidence). Verified on the storage blocks alone; recovery
    /// never powers on and lifts the block only after a new boot ID.
    StorageThenReset,
}

/// A device in a planned level (no credentials: those stay in the Secret or the bridge).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedDevice {
    /// Device URL.
    pub url: String,
    /// Power or storage.
    pub kind: DeviceKind,
    /// Budget for command then verify.
    pub timeout_seconds: i64,
    /// For a storage device: what it fences, from the FenceTarget when the plan was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fences: Option<crate::target::StorageScope>,
    /// For a power device without an identity of its own under a policy with
    /// `powerWithoutIdentity: AfterProof`: the direct BMCs of the node's FenceTarget, one of
    /// which must answer as the Node's machine right before this device acts (empty: none can,
    /// so the device never acts). Absent: the device acts as planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_from: Option<Vec<String>>,
}

/// The last decision verdict, as shown to operators.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerdictRecord {
    /// Stable label (as in metrics), for example `hold_quorum_lost`.
    pub label: String,
    /// Human message (as in Events).
    pub message: String,
    /// When it was decided.
    pub at: MicroTime,
}

/// How a level ended.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LevelOutcome {
    /// Index into the plan's levels.
    #[schemars(range(min = 0))]
    pub level: i32,
    /// Verified or failed.
    pub result: LevelResult,
    /// When it concluded.
    pub at: MicroTime,
    /// Details for humans.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Result of a level.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum LevelResult {
    /// Every device of the level was commanded and verified.
    Verified,
    /// Some device failed or could not be verified in time.
    Failed,
}

/// One device action.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAttempt {
    /// Plan level index.
    #[schemars(range(min = 0))]
    pub level: i32,
    /// Device URL.
    pub device: String,
    /// What was asked.
    pub action: DeviceAction,
    /// What happened.
    pub outcome: AttemptOutcome,
    /// Fencing token carried by the action.
    pub token: i64,
    /// When it finished.
    pub at: MicroTime,
    /// Details (error text, device reply).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// For a [`AttemptOutcome::StaleToken`] refusal by the firmware-bridge: the target's token
    /// floor, from the refusal's typed `seen_token` field; `None` when the refusal did not say
    /// (a bridge older than the field, or this controller's own leadership check). Read it
    /// through [`DeviceAttempt::token_floor`].
    ///
    /// Never persisted (not part of the CRD): a refused step persists nothing, so the floor
    /// only travels from the device call to the leader's token floor, in memory.
    #[serde(skip)]
    pub seen_token: Option<i64>,
}

impl DeviceAttempt {
    /// The token floor this attempt proves: for a stale-token refusal whose typed floor is
    /// above the refused token, that floor; otherwise `None`, "refused, no floor".
    ///
    /// Guarantees: never below or equal to `self.token`, never from the attempt's message, and
    /// `None` for any attempt that is not a stale-token refusal.
    pub fn token_floor(&self) -> Option<i64> {
        self.seen_token
            .filter(|f| self.outcome == AttemptOutcome::StaleToken && *f > self.token)
    }
}

/// Device actions.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeviceAction {
    /// Power off.
    PowerOff,
    /// Read power status.
    PowerStatus,
    /// Power on.
    PowerOn,
    /// Restart without powering off (IPMI chassis hard reset, Redfish `ForceRestart`): a
    /// command, never evidence.
    Reset,
    /// Block the node at the storage.
    Block,
    /// Read the storage block status.
    BlockStatus,
    /// Lift the storage block.
    Unblock,
}

/// Outcome of one device action.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AttemptOutcome {
    /// It did what was asked (for status reads: the state read is in the message).
    Succeeded,
    /// The device reported an error.
    Failed,
    /// No answer: nothing verified within the budget, the device's own exchanges timed out,
    /// or it could not be reached at all (a dark BMC). Never evidence of anything: a device
    /// that does not answer may have lost its power with the machine, or only its network.
    TimedOut,
    /// The device or bridge refused the fencing token as stale.
    StaleToken,
}

/// One piece of evidence that the node is fenced.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    /// Plan level index.
    #[schemars(range(min = 0))]
    pub level: i32,
    /// Device URL (empty for self-fence).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device: String,
    /// What it proves.
    pub kind: EvidenceKind,
    /// What was observed, verbatim (for example `chassis power: off`).
    pub observed: String,
    /// When it was observed.
    pub at: MicroTime,
}

/// What a piece of evidence proves.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EvidenceKind {
    /// The device reported the power off.
    PowerOff,
    /// The storage reported the node blocked.
    StorageBlocked,
    /// The advertised self-fence timeout plus margin elapsed with the node silent.
    SelfFenceTimeout,
}

/// What release has done so far.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseProgress {
    /// When the node was tainted `palisade.dev/fenced:NoSchedule`, before the first release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tainted_at: Option<MicroTime>,
    /// When the node was tainted `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`:
    /// only when the fence covers every pod on the node, and only after this fence released
    /// them all itself (the taint is a release of its own: Kubernetes' taint eviction and pod
    /// garbage collector force-delete the node's pods, and the attach-detach controller
    /// detaches its volumes, none of them recorded here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_service_at: Option<MicroTime>,
    /// Pods marked Failed and deleted (grace 0, UID precondition).
    #[serde(default)]
    pub pods: Vec<ReleasedObject>,
    /// The pod whose release has started: recorded *before* its deletion is sent, and moved to
    /// `pods` once the deletion is confirmed. A leader that dies in between leaves it here, and
    /// the next one re-sends the deletion (UID precondition) or, the pod being gone, records it
    /// in `pods`: no pod is ever deleted without a record of it in this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub releasing: Option<ReleasedObject>,
    /// VolumeAttachments deleted (UID precondition).
    #[serde(default)]
    pub attachments: Vec<ReleasedObject>,
    /// PV attach records cleared (PV names in `name`).
    #[serde(default)]
    pub attach_records: Vec<ReleasedObject>,
    /// Pods the verified fence does not cover (`NotCoveredByFence`): never released by this
    /// fence; they stay bound to the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<ReleasedObject>,
    /// Fresh reads of the verified level's power devices (a status read, never a command),
    /// taken before the first release and again before the next release under a leader whose
    /// fencing token differs from the last re-read's. A release needs every such device to have
    /// read `Off` under the current token; one that read `On` fails the fence
    /// (`PowerNotOff`), one that could not be read is read again, a few times, then fails it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub power_rechecks: Vec<PowerRecheck>,
}

/// One re-read of a power device's state before a release ([`ReleaseProgress::power_rechecks`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerRecheck {
    /// The power device (URL, as planned).
    pub device: String,
    /// The fencing token of the leader that read it.
    pub token: i64,
    /// What it read.
    pub state: RecheckedPower,
    /// What the device reported, verbatim, or why it could not be read.
    pub observed: String,
    /// When it was read.
    pub at: MicroTime,
}

/// What a power re-read found ([`PowerRecheck`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RecheckedPower {
    /// The device reads the machine off: the fence still holds.
    Off,
    /// The device reads the machine on (something powered it back on since the verify).
    On,
    /// The device could not be read, or read neither on nor off.
    Unknown,
}

/// A released object.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleasedObject {
    /// Namespace (empty for cluster-scoped objects).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID used as the delete precondition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// When it was released.
    pub at: MicroTime,
}

/// Recovery progress.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryProgress {
    /// When power-on was commanded (if the policy powers nodes back on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub powered_on_at: Option<MicroTime>,
    /// When the storage fence was lifted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfenced_at: Option<MicroTime>,
    /// When the release taints this fence added were removed (by the controller; a person
    /// removes them under `untaintWhen: Manual`, and then this stays empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untainted_at: Option<MicroTime>,
    /// When the controller first observed the Node carrying neither a release taint this fence
    /// added nor any out-of-service taint (wall time, for people and for a new leader). The
    /// storage block is lifted only a margin after it, on the wall clock and on the observing
    /// process's monotonic clock, and once the node's VolumeAttachments have settled: a
    /// lagging pod garbage collector or attach-detach cache can still act on the taint after
    /// it is gone (kubernetes/kubernetes #141887, #141888, #142331).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untaint_observed_at: Option<MicroTime>,
    /// The node's boot ID when fencing started (from its last renewal); a different boot ID
    /// observed after the verified fence proves the machine restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id_at_fence: Option<String>,
    /// The positive proof that none of the released pods' containers exists on the node any
    /// more, and when it was observed (required before unfence and untaint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_proof: Option<String>,
}

/// Why a fence failed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// Machine-readable reason.
    pub reason: FailureReason,
    /// The phase it failed in.
    pub phase: Phase,
    /// Details for humans.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Machine-readable failure reasons.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FailureReason {
    /// Every planned level failed; nothing was released.
    AllLevelsFailed,
    /// The phase's time budget ran out.
    BudgetExceeded,
    /// A phase after Fencing was found without a verified fence (corrupted or hand-edited status).
    NoVerifiedFence,
    /// Fencing was entered without a plan, or with an empty one.
    NoPlan,
    /// The node renewed its Lease after a trusted self-fence was verified and before every
    /// covered pod was released: its agent is alive and may restart what it had killed, so
    /// nothing more is released on the self-fence proof.
    NodeReturned,
    /// `spec.nodeName` changed after the fence pinned its node: nothing more is done.
    SpecChanged,
    /// The Node was deleted and registered again with another UID: nothing more is done.
    NodeReplaced,
    /// An older unfinished `NodeFence` for the same node exists (`supersededBy`); only that one
    /// acts.
    Superseded,
    /// No Node of the requested name existed while the fence was Pending (after a short
    /// grace); nothing was done.
    NodeNotFound,
    /// A re-read of a power device before a release found the machine on, or could not read
    /// it ([`ReleaseProgress::power_rechecks`]): nothing more is released.
    PowerNotOff,
}

impl FailureReason {
    /// Stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllLevelsFailed => "AllLevelsFailed",
            Self::BudgetExceeded => "BudgetExceeded",
            Self::NoVerifiedFence => "NoVerifiedFence",
            Self::NoPlan => "NoPlan",
            Self::NodeReturned => "NodeReturned",
            Self::SpecChanged => "SpecChanged",
            Self::NodeReplaced => "NodeReplaced",
            Self::Superseded => "Superseded",
            Self::NodeNotFound => "NodeNotFound",
            Self::PowerNotOff => "PowerNotOff",
        }
    }
}

/// One phase transition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Transition {
    /// Phase entered.
    pub phase: Phase,
    /// When.
    pub at: MicroTime,
    /// Why (shown in Events).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Proof that a level was verified with evidence. Only [`NodeFenceStatus::verified_fence`]
/// constructs it; the release steps require it.
///
/// Guarantees: no other code can build one: the fields are private and there is no other
/// constructor, `Default` or `Deserialize`. Code outside this module can only read it:
///
/// ```
/// use palisade_model::nodefence::{Coverage, VerifiedFence};
/// fn covers_everything(proof: &VerifiedFence) -> bool {
///     proof.coverage() == Coverage::All
/// }
/// ```
///
/// A struct literal does not compile (private fields; the same literal compiles inside the
/// module, see the unit test `verified_fence_literal_compiles_only_inside_its_module`):
///
/// ```compile_fail,E0451
/// let _ = palisade_model::nodefence::VerifiedFence {
///     level: 0,
///     at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
///     coverage: palisade_model::nodefence::Coverage::All,
///     scope: None,
/// };
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedFence {
    level: i32,
    at: Timestamp,
    coverage: Coverage,
    scope: Option<crate::target::StorageScope>,
}

impl VerifiedFence {
    /// Whether the proof covers a pod that mounts these claims (one entry per
    /// PersistentVolumeClaim volume; empty: it mounts none).
    ///
    /// Guarantees: `All` covers every pod; otherwise only a pod that mounts a claim is covered,
    /// and, for a storage block, only when every claim it mounts is in the scope its blocking
    /// devices named ([`crate::target::StorageScope::includes`]; an unknown claim never is).
    pub fn covers(&self, claims: &[crate::target::ClaimBacking]) -> bool {
        self.coverage.covers(!claims.is_empty())
            && self
                .scope
                .as_ref()
                .is_none_or(|s| claims.iter().all(|c| s.includes(c)))
    }

    /// For a storage block, what its blocking devices fence (`None` for any other proof).
    pub fn storage_scope(&self) -> Option<&crate::target::StorageScope> {
        self.scope.as_ref()
    }

    /// What the proof covers ([`Coverage`]): `All` only with power-off evidence or a trusted
    /// self-fence advertised to kill every pod.
    pub fn coverage(&self) -> Coverage {
        self.coverage
    }
    /// Whether the proof came from a trusted self-fence (silence re-checked until release).
    pub fn is_self_fence(&self, plan: Option<&FencePlan>) -> bool {
        usize::try_from(self.level)
            .ok()
            .and_then(|i| plan?.levels.get(i))
            .is_some_and(|l| l.kind == LevelKind::SelfFence)
    }
    /// The verified plan level.
    pub fn level(&self) -> i32 {
        self.level
    }
    /// When the level was verified.
    pub fn at(&self) -> Timestamp {
        self.at
    }
}

/// A forbidden mutation of a `NodeFenceStatus`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatusError {
    /// The transition is not an edge of the state machine.
    #[error("illegal NodeFence transition {from} -> {to}")]
    IllegalTransition {
        /// Current phase.
        from: Phase,
        /// Requested phase.
        to: Phase,
    },
    /// A level recorded as verified without evidence.
    #[error("level {level} cannot be recorded verified without evidence")]
    NoEvidence {
        /// Level index.
        level: i32,
    },
    /// A level outside the plan, or one already concluded.
    #[error("level {level} is not the next unconcluded level of the plan")]
    WrongLevel {
        /// Level index.
        level: i32,
    },
}

/// Condition types derived from the phase.
pub const CONDITION_TYPES: [&str; 4] = ["Fenced", "Released", "Complete", "Failed"];

fn condition_holds(kind: &str, phase: Phase) -> bool {
    use Phase::*;
    match kind {
        "Fenced" => matches!(phase, Fenced | Releasing | Released | Recovering),
        "Released" => matches!(phase, Released | Recovering | Done),
        "Complete" => matches!(phase, Done),
        "Failed" => matches!(phase, Failed),
        _ => false,
    }
}

impl NodeFenceStatus {
    /// Whether the fence may still hold something on its node that only its own recovery
    /// lifts (and whose record only its status keeps): a fence between Fencing and Recovering
    /// (a command may be in flight), or a Failed one that asked for a storage block (whatever
    /// the answer: a block that timed out may have landed), tainted the node or released a pod.
    /// A Pending fence has done nothing; a Done one has lifted all it held.
    ///
    /// Guarantees: conservative; `false` only when nothing of the fence can remain on the node
    /// beyond a power-off (which the node's next fence or a person undoes, and which no record
    /// is needed to undo safely).
    pub fn holds_node(&self) -> bool {
        match self.phase {
            Phase::Pending | Phase::Done => false,
            Phase::Failed => {
                self.attempts
                    .iter()
                    .any(|a| a.action == DeviceAction::Block)
                    || self.release.tainted_at.is_some()
                    || self.release.releasing.is_some()
                    || !self.release.pods.is_empty()
            }
            _ => true,
        }
    }

    /// Whether the fence's finalizer ([`crate::NODEFENCE_FINALIZER`]) may go, the fence being
    /// `deleting` (its `deletionTimestamp` set) or not: it holds nothing on its node
    /// ([`NodeFenceStatus::holds_node`]) and either a person deleted it or it finished. The
    /// operator's worker and the simulation both remove it by this rule, and the operator
    /// starts a worker for a finished fence that still carries it (a crash between the
    /// persisted end and the removal).
    ///
    /// Guarantees: never while the fence may still hold something on its node, so its record
    /// of what it released stays until its recovery lifted it.
    pub fn finalizer_may_go(&self, deleting: bool) -> bool {
        !self.holds_node() && (deleting || self.phase.is_terminal())
    }

    /// When the current phase was entered (`None` before the first transition).
    pub fn entered_at(&self) -> Option<Timestamp> {
        self.transitions
            .iter()
            .rev()
            .find(|t| t.phase == self.phase)
            .map(|t| t.at.0)
    }

    /// When the current phase's budget runs out, if it has one. For Fencing with a self-fence
    /// level, the deadline is at least that level's `trustedAfter` plus [`FENCING_SLACK`].
    pub fn deadline(&self) -> Option<Timestamp> {
        let entered = self.entered_at()?;
        let budget = self.phase.budget(self.plan.as_ref())?;
        let mut deadline = entered.checked_add(budget).ok()?;
        if self.phase == Phase::Fencing {
            let trusted = self
                .plan
                .iter()
                .flat_map(|p| &p.levels)
                .filter_map(|l| l.trusted_after.as_ref())
                .filter_map(|t| t.0.checked_add(FENCING_SLACK).ok())
                .max();
            if let Some(t) = trusted {
                deadline = deadline.max(t);
            }
        }
        Some(deadline)
    }

    /// Move to `to`, recording the transition and re-deriving the conditions.
    pub fn transition(
        &mut self,
        to: Phase,
        at: Timestamp,
        message: impl Into<String>,
    ) -> Result<(), StatusError> {
        // The very first transition records entering Pending (creation); allow it once.
        let first_pending = self.transitions.is_empty() && to == Phase::Pending;
        if !first_pending && !self.phase.can_transition_to(to) {
            return Err(StatusError::IllegalTransition {
                from: self.phase,
                to,
            });
        }
        self.phase = to;
        self.transitions.push(Transition {
            phase: to,
            at: MicroTime(at),
            message: message.into(),
        });
        self.conditions = self.derived_conditions();
        Ok(())
    }

    /// Enter Failed with a reason.
    pub fn fail(
        &mut self,
        reason: FailureReason,
        at: Timestamp,
        message: impl Into<String>,
    ) -> Result<(), StatusError> {
        let message = message.into();
        let phase = self.phase;
        self.transition(Phase::Failed, at, message.clone())?;
        self.failure = Some(Failure {
            reason,
            phase,
            message,
        });
        Ok(())
    }

    /// The conditions implied by the phase and the transition history.
    pub fn derived_conditions(&self) -> Vec<Condition> {
        CONDITION_TYPES
            .iter()
            .map(|kind| {
                let holds = condition_holds(kind, self.phase);
                // The last transition at which this condition's truth changed.
                let mut last_change = None;
                let mut prev: Option<bool> = None;
                for t in &self.transitions {
                    let now = condition_holds(kind, t.phase);
                    if prev != Some(now) {
                        last_change = Some(t.at.0);
                    }
                    prev = Some(now);
                }
                let message = match (self.phase, &self.failure) {
                    (Phase::Failed, Some(f)) => f.message.clone(),
                    _ => self
                        .transitions
                        .last()
                        .map(|t| t.message.clone())
                        .unwrap_or_default(),
                };
                Condition {
                    type_: (*kind).to_string(),
                    status: if holds { "True" } else { "False" }.to_string(),
                    reason: self.phase.as_str().to_string(),
                    message,
                    // Condition times are serialized with whole seconds; truncate so a round
                    // trip through the API server is lossless.
                    last_transition_time: Time(
                        last_change
                            .and_then(|t| Timestamp::from_second(t.as_second()).ok())
                            .unwrap_or(Timestamp::UNIX_EPOCH),
                    ),
                    observed_generation: None,
                }
            })
            .collect()
    }

    /// The index of the next planned level that has not concluded, if any.
    pub fn next_level(&self) -> Option<i32> {
        let plan = self.plan.as_ref()?;
        let concluded = self.levels.len();
        (concluded < plan.levels.len())
            .then(|| i32::try_from(concluded).ok())
            .flatten()
    }

    /// Record that `level` was verified, with its evidence (which must not be empty).
    pub fn record_level_verified(
        &mut self,
        level: i32,
        evidence: Vec<Evidence>,
        at: Timestamp,
        message: impl Into<String>,
    ) -> Result<(), StatusError> {
        if self.next_level() != Some(level) {
            return Err(StatusError::WrongLevel { level });
        }
        if evidence.is_empty() || evidence.iter().any(|e| e.level != level) {
            return Err(StatusError::NoEvidence { level });
        }
        self.evidence.extend(evidence);
        self.levels.push(LevelOutcome {
            level,
            result: LevelResult::Verified,
            at: MicroTime(at),
            message: message.into(),
        });
        Ok(())
    }

    /// Record that `level` failed.
    pub fn record_level_failed(
        &mut self,
        level: i32,
        at: Timestamp,
        message: impl Into<String>,
    ) -> Result<(), StatusError> {
        if self.next_level() != Some(level) {
            return Err(StatusError::WrongLevel { level });
        }
        self.levels.push(LevelOutcome {
            level,
            result: LevelResult::Failed,
            at: MicroTime(at),
            message: message.into(),
        });
        Ok(())
    }

    /// The devices asked to power the node off that gave no answer
    /// ([`AttemptOutcome::TimedOut`]), each once, in the order first asked.
    ///
    /// Guarantees: only `PowerOff` attempts count; a device that answered any later attempt
    /// of this fence (with a refusal or a reading) is not listed. Never evidence: it names
    /// what an operator must check, because a dark BMC may have lost its power with the
    /// machine, or only its network.
    pub fn dark_power_devices(&self) -> Vec<&str> {
        let mut dark: Vec<&str> = Vec::new();
        for a in &self.attempts {
            if a.action != DeviceAction::PowerOff {
                continue;
            }
            let here = dark.iter().position(|d| *d == a.device);
            match (a.outcome == AttemptOutcome::TimedOut, here) {
                (true, None) => dark.push(&a.device),
                (false, Some(i)) => {
                    dark.remove(i);
                }
                _ => {}
            }
        }
        dark
    }

    /// The proof that the node is fenced: a level recorded verified, with evidence for it.
    ///
    /// Guarantees: the proof's [`Coverage`] is `All` only when the level has `PowerOff`
    /// evidence, or `SelfFenceTimeout` evidence on a level whose advertised scope was `All`;
    /// storage evidence alone covers only the pods that mount a claim; anything unknown covers
    /// the least.
    pub fn verified_fence(&self) -> Option<VerifiedFence> {
        let o = self
            .levels
            .iter()
            .find(|o| o.result == LevelResult::Verified)
            .filter(|o| self.evidence.iter().any(|e| e.level == o.level))?;
        let planned = usize::try_from(o.level)
            .ok()
            .and_then(|i| self.plan.as_ref()?.levels.get(i));
        let kinds: Vec<EvidenceKind> = self
            .evidence
            .iter()
            .filter(|e| e.level == o.level)
            .map(|e| e.kind)
            .collect();
        let power_off = kinds.contains(&EvidenceKind::PowerOff);
        let whole_self_fence = kinds.contains(&EvidenceKind::SelfFenceTimeout)
            && planned.and_then(|p| p.self_fence_scope) == Some(Coverage::All);
        let coverage = if power_off || whole_self_fence {
            Coverage::All
        } else {
            Coverage::Stateful
        };
        // A storage block covers what its devices named when the plan was made; a device
        // that named nothing (a plan older than the field) adds nothing.
        let scope = (coverage == Coverage::Stateful
            && kinds.contains(&EvidenceKind::StorageBlocked))
        .then(|| {
            planned
                .into_iter()
                .flat_map(|p| &p.devices)
                .filter(|d| d.kind == DeviceKind::Storage)
                .filter_map(|d| d.fences.as_ref())
                .fold(crate::target::StorageScope::default(), |a, b| a.union(b))
        });
        Some(VerifiedFence {
            level: o.level,
            at: o.at.0,
            coverage,
            scope,
        })
    }

    /// Whether anything at all has been released.
    pub fn released_anything(&self) -> bool {
        let r = &self.release;
        r.tainted_at.is_some()
            || r.releasing.is_some()
            || !r.pods.is_empty()
            || !r.attachments.is_empty()
            || !r.attach_records.is_empty()
    }
}

/// Node annotation naming the release taints each `NodeFence` added to the Node: entries
/// `<NodeFence UID>=<taint key>,<taint key>` separated by `;` ([`release_taints_recorded`]
/// writes a fence's entry, [`release_taints_forgotten`] drops it, [`release_taints_added_by`]
/// reads it).
///
/// A fence's entry is written in the same Node update (one compare-and-swap on the Node's
/// resourceVersion) that adds its taints, and dropped in the same update that removes them,
/// so the taints and the record of who added them never disagree, whichever write a crashed
/// controller did or did not make. (A status field written before the taint would name a taint
/// that was never added if the controller crashed before the Node update, after which someone
/// else may add it; one written after would miss a taint that was.) A release taint the Node
/// carried before the fence tainted it (a person's, medik8s') is not named, and that fence's
/// recovery never removes it.
pub const ANNOTATION_RELEASE_TAINTS: &str = "palisade.dev/release-taints";

fn release_taint_entries(value: &str) -> impl Iterator<Item = (&str, &str)> {
    value
        .split(';')
        .filter_map(|e| e.split_once('='))
        .map(|(u, k)| (u.trim(), k))
        .filter(|(u, _)| !u.is_empty())
}

/// The [`ANNOTATION_RELEASE_TAINTS`] value `value` (`None`: no annotation) with the entry of
/// the fence whose UID is `uid` naming `keys` as well as what it named already (sorted,
/// deduplicated); other fences' entries are kept.
pub fn release_taints_recorded<'a>(
    value: Option<&str>,
    uid: &str,
    keys: impl IntoIterator<Item = &'a str>,
) -> String {
    let mut ours: std::collections::BTreeSet<String> = value
        .map(|v| release_taints_added_by(v, uid))
        .unwrap_or_default()
        .into_iter()
        .collect();
    ours.extend(
        keys.into_iter()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(String::from),
    );
    let mut entries: Vec<String> = value
        .map(|v| {
            release_taint_entries(v)
                .filter(|(u, _)| *u != uid)
                .map(|(u, k)| format!("{u}={}", k.trim()))
                .collect()
        })
        .unwrap_or_default();
    entries.push(format!(
        "{uid}={}",
        ours.into_iter().collect::<Vec<_>>().join(",")
    ));
    entries.join(";")
}

/// The [`ANNOTATION_RELEASE_TAINTS`] value `value` without the entry of the fence whose UID is
/// `uid` (`None`: no entry left, remove the annotation).
pub fn release_taints_forgotten(value: &str, uid: &str) -> Option<String> {
    let rest: Vec<String> = release_taint_entries(value)
        .filter(|(u, _)| *u != uid)
        .map(|(u, k)| format!("{u}={}", k.trim()))
        .collect();
    (!rest.is_empty()).then(|| rest.join(";"))
}

/// The taint keys the [`ANNOTATION_RELEASE_TAINTS`] value `value` says the fence whose UID is
/// `uid` added (empty when no entry names it).
///
/// Guarantees: only the entry naming exactly `uid` counts, and an empty `uid` yields no key: a
/// fence removes only taints it recorded adding itself.
///
/// Assumptions: Kubernetes UIDs contain no `=` or `;`, taint keys no `,` or `;`.
pub fn release_taints_added_by(value: &str, uid: &str) -> Vec<String> {
    if uid.is_empty() {
        return Vec::new();
    }
    release_taint_entries(value)
        .filter(|(u, _)| *u == uid)
        .flat_map(|(_, keys)| keys.split(','))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect()
}

/// Annotation a person sets on a `NodeFence` to confirm, after checking the machine, that none
/// of the released pods runs there any more. It stands in for the positive proof recovery
/// otherwise waits for (DESIGN §5.4), for that one fence only.
///
/// Its value is the UID of the `NodeFence` it confirms, optionally followed by a colon and who
/// checked what (`<uid>: alice, host rebooted from its console`); [`confirm_clean_value`] writes
/// it, [`confirmed_clean_for`] reads it.
pub const ANNOTATION_CONFIRM_CLEAN: &str = "palisade.dev/confirm-clean";

/// The [`ANNOTATION_CONFIRM_CLEAN`] value confirming the fence whose UID is `uid` clean, with a
/// note saying who checked what (may be empty).
pub fn confirm_clean_value(uid: &str, note: &str) -> String {
    let note = note.trim();
    if note.is_empty() {
        uid.to_string()
    } else {
        format!("{uid}: {note}")
    }
}

/// Whether the [`ANNOTATION_CONFIRM_CLEAN`] value `value` confirms the fence whose UID is `uid`;
/// if so, the note after the UID (possibly empty).
///
/// Guarantees: only a value whose UID part (all of it before the first `:`, trimmed) is exactly
/// `uid` confirms, and an empty `uid` confirms nothing. A value naming another fence (an
/// annotation copied from an older NodeFence for the same node, whose released pods are not
/// this fence's), or a bare legacy value (`yes`, `checked by alice`), confirms nothing: a
/// confirmation vouches for the pods one fence released, never for whichever fence reads it.
///
/// Assumptions: Kubernetes UIDs contain no `:` and no whitespace.
pub fn confirmed_clean_for<'a>(value: &'a str, uid: &str) -> Option<&'a str> {
    let (head, note) = value.split_once(':').unwrap_or((value, ""));
    (!uid.is_empty() && head.trim() == uid).then(|| note.trim())
}

#[cfg(test)]
mod token_floor_tests {
    use super::*;

    #[test]
    fn only_a_stale_refusal_with_a_typed_floor_above_its_token_raises_the_floor() {
        let at = MicroTime(Timestamp::from_second(1_800_000_000).unwrap());
        let attempt = |outcome, seen_token, message: &str| DeviceAttempt {
            level: 0,
            device: "bridge://127.0.0.1:1/m0".into(),
            action: DeviceAction::PowerOff,
            outcome,
            token: 6,
            at: at.clone(),
            message: message.into(),
            seen_token,
        };
        use AttemptOutcome::*;
        let english = "stale fencing token 6: target m0 has already seen token 99";
        let cases = [
            (StaleToken, Some(7), "", Some(7)),
            (StaleToken, None, english, None),
            (StaleToken, Some(6), "", None),
            (StaleToken, Some(-1), "", None),
            (Failed, Some(7), english, None),
            (Succeeded, Some(7), "", None),
        ];
        for (outcome, seen, message, want) in cases {
            assert_eq!(
                attempt(outcome, seen, message).token_floor(),
                want,
                "{outcome:?} {seen:?} {message:?}"
            );
        }
    }
}

#[cfg(test)]
mod release_taints_tests {
    use super::*;

    #[test]
    fn the_release_taints_record_names_only_the_fence_that_wrote_it() {
        let uid = "3f6c1a52-8d0e-4b1f-9a57-0c2de1b1a001";
        let older = "0b9e77aa-1c42-4d1d-8f0f-55e3c2d7b002";
        let first = release_taints_recorded(None, older, ["palisade.dev/fenced"]);
        let v = release_taints_recorded(Some(&first), uid, ["x/b", "x/b", " "]);
        let v = release_taints_recorded(Some(&v), uid, ["a/b"]);
        assert_eq!(v, format!("{older}=palisade.dev/fenced;{uid}=a/b,x/b"));
        assert_eq!(release_taints_added_by(&v, uid), vec!["a/b", "x/b"]);
        assert_eq!(
            release_taints_added_by(&v, older),
            vec!["palisade.dev/fenced"]
        );
        assert!(release_taints_added_by(&v, "").is_empty());
        assert!(release_taints_added_by("palisade.dev/fenced", uid).is_empty());
        assert_eq!(release_taints_forgotten(&v, uid), Some(first.clone()));
        assert_eq!(release_taints_forgotten(&first, older), None);
    }
}

#[cfg(test)]
mod confirm_clean_tests {
    use super::*;

    const UID: &str = "3f6c1a52-8d0e-4b1f-9a57-0c2de1b1a001";
    const OLDER: &str = "0b9e77aa-1c42-4d1d-8f0f-55e3c2d7b002";

    #[test]
    fn a_confirmation_counts_only_for_the_fence_whose_uid_it_names() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            (UID, UID, Some("")),
            (
                "3f6c1a52-8d0e-4b1f-9a57-0c2de1b1a001: alice, rebooted",
                UID,
                Some("alice, rebooted"),
            ),
            (
                "  3f6c1a52-8d0e-4b1f-9a57-0c2de1b1a001 :  bob ",
                UID,
                Some("bob"),
            ),
            // Another (older) fence's confirmation, copied or left behind.
            (OLDER, UID, None),
            ("0b9e77aa-1c42-4d1d-8f0f-55e3c2d7b002: alice", UID, None),
            // Legacy, unbound values.
            ("yes", UID, None),
            ("checked by alice", UID, None),
            ("true", UID, None),
            ("", UID, None),
            // A UID inside the note, or a prefix of it, is not a binding.
            ("alice: 3f6c1a52-8d0e-4b1f-9a57-0c2de1b1a001", UID, None),
            ("3f6c1a52-8d0e-4b1f-9a57-0c2de1b1a001 checked", UID, None),
            ("3f6c1a52", UID, None),
            // A fence without a UID (never stored) is confirmed by nothing.
            ("", "", None),
            (": alice", "", None),
        ];
        for (value, uid, want) in cases {
            assert_eq!(
                confirmed_clean_for(value, uid),
                *want,
                "{value:?} for {uid:?}"
            );
        }
    }

    #[test]
    fn the_written_value_reads_back_for_its_fence_only() {
        let v = confirm_clean_value(UID, " alice, host rebooted ");
        assert_eq!(v, format!("{UID}: alice, host rebooted"));
        assert_eq!(confirmed_clean_for(&v, UID), Some("alice, host rebooted"));
        assert_eq!(confirmed_clean_for(&v, OLDER), None);
        assert_eq!(
            confirmed_clean_for(&confirm_clean_value(UID, ""), UID),
            Some("")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn plan(levels: usize) -> FencePlan {
        FencePlan {
            levels: (0..levels)
                .map(|i| PlannedLevel {
                    name: format!("l{i}"),
                    kind: LevelKind::Hardware,
                    devices: vec![PlannedDevice {
                        url: format!("ipmi://bmc{i}"),
                        kind: DeviceKind::Power,
                        timeout_seconds: 20,
                        fences: None,
                        identity_from: None,
                    }],
                    trusted_after: None,
                    silent_since: None,
                    trust_wait_seconds: None,
                    self_fence_scope: None,
                    silent_marker: None,
                })
                .collect(),
        }
    }

    fn evidence(level: i32) -> Vec<Evidence> {
        vec![Evidence {
            level,
            device: "ipmi://bmc".into(),
            kind: EvidenceKind::PowerOff,
            observed: "chassis power: off".into(),
            at: MicroTime(ts(5)),
        }]
    }

    #[test]
    fn transition_table_matches_the_documented_lifecycle() {
        use Phase::*;
        let allowed = [
            (Pending, Fencing),
            (Pending, Done),
            (Pending, Failed),
            (Fencing, Fenced),
            (Fencing, Failed),
            (Fenced, Releasing),
            (Fenced, Failed),
            (Releasing, Released),
            (Releasing, Failed),
            (Released, Recovering),
            (Released, Failed),
            (Recovering, Done),
            (Recovering, Failed),
        ];
        for from in Phase::ALL {
            for to in Phase::ALL {
                assert_eq!(
                    from.can_transition_to(to),
                    allowed.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn a_fence_holds_its_node_from_fencing_until_done_and_failed_only_with_a_trace() {
        let mut st = NodeFenceStatus::default();
        assert!(!st.holds_node(), "Pending: nothing done");
        for p in [
            Phase::Fencing,
            Phase::Fenced,
            Phase::Releasing,
            Phase::Released,
            Phase::Recovering,
        ] {
            st.phase = p;
            assert!(st.holds_node(), "{p}");
        }
        st.phase = Phase::Done;
        assert!(!st.holds_node());
        st.phase = Phase::Failed;
        st.attempts.push(DeviceAttempt {
            level: 0,
            device: "ipmi://bmc".into(),
            action: DeviceAction::PowerOff,
            outcome: AttemptOutcome::TimedOut,
            token: 1,
            at: MicroTime(Timestamp::UNIX_EPOCH),
            message: String::new(),
            seen_token: None,
        });
        assert!(
            !st.holds_node(),
            "a power-off leaves nothing a record must undo"
        );
        st.attempts.push(DeviceAttempt {
            action: DeviceAction::Block,
            ..st.attempts[0].clone()
        });
        assert!(
            st.holds_node(),
            "a block asked for, even one that timed out, may hold"
        );
        st.attempts.clear();
        st.release.tainted_at = Some(MicroTime(Timestamp::UNIX_EPOCH));
        assert!(st.holds_node(), "its release taints");
    }

    #[test]
    fn terminal_phases_have_no_exits_and_no_budget() {
        for p in [Phase::Done, Phase::Failed] {
            assert!(p.is_terminal());
            assert!(Phase::ALL.iter().all(|to| !p.can_transition_to(*to)));
            assert_eq!(p.budget(None), None);
        }
    }

    #[test]
    fn fencing_budget_sums_device_timeouts_plus_slack() {
        assert_eq!(
            Phase::Fencing.budget(Some(&plan(3))),
            Some(Duration::from_secs(60) + FENCING_SLACK)
        );
        assert_eq!(Phase::Fencing.budget(None), Some(FENCING_SLACK));
    }

    #[test]
    fn self_fence_level_extends_the_fencing_deadline() {
        let mut st = NodeFenceStatus::default();
        st.transition(Phase::Pending, ts(0), "created").unwrap();
        st.plan = Some(FencePlan {
            levels: vec![PlannedLevel {
                name: "self-fence".into(),
                kind: LevelKind::SelfFence,
                devices: vec![],
                trusted_after: Some(MicroTime(ts(100))),
                silent_since: None,
                trust_wait_seconds: None,
                self_fence_scope: None,
                silent_marker: None,
            }],
        });
        st.transition(Phase::Fencing, ts(10), "go").unwrap();
        assert_eq!(st.deadline(), Some(ts(160)));
    }

    #[test]
    fn illegal_transitions_are_refused_and_leave_status_untouched() {
        let mut st = NodeFenceStatus::default();
        st.transition(Phase::Pending, ts(0), "created").unwrap();
        let before = st.clone();
        assert_eq!(
            st.transition(Phase::Releasing, ts(1), "skip"),
            Err(StatusError::IllegalTransition {
                from: Phase::Pending,
                to: Phase::Releasing
            })
        );
        assert_eq!(st, before);
    }

    #[test]
    fn conditions_follow_the_phase_with_transition_times() {
        let mut st = NodeFenceStatus::default();
        st.transition(Phase::Pending, ts(0), "created").unwrap();
        st.plan = Some(plan(1));
        st.transition(Phase::Fencing, ts(1), "fencing").unwrap();
        st.record_level_verified(0, evidence(0), ts(2), "off")
            .unwrap();
        st.transition(Phase::Fenced, ts(3), "verified").unwrap();
        st.transition(Phase::Releasing, ts(4), "release").unwrap();
        let get = |st: &NodeFenceStatus, t: &str| {
            st.conditions
                .iter()
                .find(|c| c.type_ == t)
                .cloned()
                .unwrap()
        };
        let fenced = get(&st, "Fenced");
        assert_eq!(fenced.status, "True");
        assert_eq!(fenced.last_transition_time, Time(ts(3)));
        assert_eq!(get(&st, "Released").status, "False");
        st.transition(Phase::Released, ts(5), "released").unwrap();
        assert_eq!(get(&st, "Released").last_transition_time, Time(ts(5)));
        assert_eq!(get(&st, "Fenced").last_transition_time, Time(ts(3)));
        assert_eq!(st.conditions, st.derived_conditions());
    }

    #[test]
    fn dark_power_devices_are_those_that_never_answered_a_power_off() {
        let attempt = |device: &str, action, outcome| DeviceAttempt {
            level: 0,
            device: device.into(),
            action,
            outcome,
            token: 1,
            at: MicroTime(ts(1)),
            message: String::new(),
            seen_token: None,
        };
        let st = NodeFenceStatus {
            attempts: vec![
                attempt("ipmi://a", DeviceAction::PowerOff, AttemptOutcome::TimedOut),
                attempt("ipmi://a", DeviceAction::PowerOff, AttemptOutcome::TimedOut),
                attempt(
                    "redfish://b",
                    DeviceAction::PowerOff,
                    AttemptOutcome::TimedOut,
                ),
                attempt(
                    "redfish://b",
                    DeviceAction::PowerOff,
                    AttemptOutcome::Failed,
                ),
                attempt(
                    "snmp+pdu://c",
                    DeviceAction::PowerStatus,
                    AttemptOutcome::TimedOut,
                ),
                attempt("storage://d", DeviceAction::Block, AttemptOutcome::TimedOut),
            ],
            ..Default::default()
        };
        assert_eq!(st.dark_power_devices(), vec!["ipmi://a"]);
        assert!(NodeFenceStatus::default().dark_power_devices().is_empty());
    }

    #[test]
    fn verified_fence_needs_evidence_and_the_right_level() {
        let mut st = NodeFenceStatus {
            plan: Some(plan(2)),
            ..Default::default()
        };
        assert_eq!(
            st.record_level_verified(0, vec![], ts(1), "x"),
            Err(StatusError::NoEvidence { level: 0 })
        );
        assert_eq!(
            st.record_level_verified(1, evidence(1), ts(1), "x"),
            Err(StatusError::WrongLevel { level: 1 })
        );
        st.record_level_failed(0, ts(1), "bad credentials").unwrap();
        assert_eq!(st.verified_fence(), None);
        st.record_level_verified(1, evidence(1), ts(2), "pdu off")
            .unwrap();
        let proof = st.verified_fence().unwrap();
        assert_eq!((proof.level(), proof.at()), (1, ts(2)));
        assert_eq!(st.next_level(), None);
        // A hand-edited status claiming verification without evidence is not a proof.
        st.evidence.clear();
        assert_eq!(st.verified_fence(), None);
    }

    #[test]
    fn failure_records_the_phase_it_failed_in() {
        let mut st = NodeFenceStatus::default();
        st.transition(Phase::Pending, ts(0), "created").unwrap();
        st.plan = Some(plan(1));
        st.transition(Phase::Fencing, ts(1), "go").unwrap();
        st.fail(FailureReason::AllLevelsFailed, ts(9), "all levels failed")
            .unwrap();
        assert_eq!(st.phase, Phase::Failed);
        let f = st.failure.clone().unwrap();
        assert_eq!(
            (f.reason, f.phase),
            (FailureReason::AllLevelsFailed, Phase::Fencing)
        );
        let failed = st.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
        assert_eq!(
            (failed.status.as_str(), failed.message.as_str()),
            ("True", "all levels failed")
        );
    }

    #[test]
    fn status_round_trips_through_json_with_microsecond_times() {
        let mut st = NodeFenceStatus::default();
        st.transition(
            Phase::Pending,
            Timestamp::from_microsecond(1_800_000_000_123_456).unwrap(),
            "created",
        )
        .unwrap();
        let json = serde_json::to_string(&st).unwrap();
        assert!(json.contains(".123456Z"), "{json}");
        let back: NodeFenceStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(back, st);
    }
}

#[cfg(test)]
mod proof_privacy {
    /// The `compile_fail` example of [`super::VerifiedFence`]'s docs, word for word: it compiles
    /// here, so outside this module it fails only because the fields are private.
    #[test]
    fn verified_fence_literal_compiles_only_inside_its_module() {
        use crate as palisade_model;
        let _ = palisade_model::nodefence::VerifiedFence {
            level: 0,
            at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            coverage: palisade_model::nodefence::Coverage::All,
            scope: None,
        };
    }
}
