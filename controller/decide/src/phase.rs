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
//! - after a power-off proof, a release under a token follows a fresh read of the proving
//!   power devices under that token that found them off ([`Step::RecheckPower`]);
//! - when every level has failed the step is `Fail(AllLevelsFailed)` and nothing was released
//!   (release begins only after Fenced);
//! - a phase whose time budget has run out fails; terminal phases yield [`Step::Nothing`];
//! - a fence acts only on the node it pinned first (name and Node UID): an edited
//!   `spec.nodeName` or a replaced Node fails it (`SpecChanged`, `NodeReplaced`), and of two
//!   unfinished fences for one node only the older acts (the younger is `Superseded`).

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use palisade_model::advertise::RuntimeSource;
use palisade_model::nodefence::{
    FailureReason, LevelKind, NodeFenceSpec, NodeFenceStatus, Phase, PlannedDevice,
    ReleaseProgress, RequestedBy, VerifiedFence,
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
    /// Pods still bound to the node (not yet deleted), with whether each mounts a claim.
    pub pods_on_node: Vec<NodePod>,
    /// VolumeAttachments still naming the node.
    pub attachments: Vec<NodeVolume>,
    /// Volumes the node's `status.volumesInUse` still lists (`name` = the unique volume name).
    pub attach_records: Vec<NodeVolume>,
    /// The detector sees the node Healthy again (fresh Lease renewals observed).
    pub node_healthy: bool,
    /// When the controller observed the renewal that wrote [`Self::heartbeat_marker`], in wall
    /// time; `None` if it did not observe that very renewal (then a restarted wait counts from
    /// now).
    pub last_renewal: Option<Timestamp>,
    /// The node's current heartbeat marker ([`crate::detector::Detector::marker`]); `None` if
    /// the controller does not see the node's heartbeat at all.
    pub heartbeat_marker: Option<String>,
    /// How long this controller process has itself watched the node without a heartbeat
    /// change, on its monotonic clock (since it observed the last change, or since it first
    /// saw the node); `None` unless what it watched is [`Self::heartbeat_marker`]. A self-fence
    /// is trusted only once this covers the whole wait, so a step of the wall clock (which
    /// `trustedAfter` is written in) can never shorten the wait.
    pub watched_silence: Option<std::time::Duration>,
    /// The self-fence wait the node's latest observed advertisement earns ([`palisade_model::advertise::Advertisement::trust_wait`]
    /// with the policy's margin); `None` when it earns no trust.
    pub self_fence_wait: Option<std::time::Duration>,
    /// The healthy-majority bound on trusting the node's self-fence ([`PeerTrust`]).
    pub peer_trust: PeerTrust,
    /// Positive proof that none of the released pods' containers exists on the node
    /// ([`clean_proof`]); `None` without one.
    pub clean_proof: Option<String>,
    /// The Node carries this fence's recovery challenge now
    /// ([`palisade_model::advertise::RECOVERY_CHALLENGE`]).
    pub challenge_posted: bool,
    /// The release taints (`palisade.dev/fenced`, out-of-service) on the Node now that this
    /// fence added (keys, as its [`palisade_model::nodefence::ANNOTATION_RELEASE_TAINTS`] record
    /// names them); only these are ever removed.
    pub taints_added: Vec<String>,
    /// The release taints on the Node now that this fence did not add (a person's, medik8s',
    /// another fence's): never removed; an out-of-service one keeps the storage block.
    pub taints_foreign: Vec<String>,
    /// The node's VolumeAttachments that have not settled ([`attachment_settled`] is false),
    /// read live while Recovering.
    pub unsettled_attachments: Vec<ObjectRef>,
    /// How long this controller process has watched the Node carry neither a taint of
    /// [`Self::taints_added`] nor an out-of-service taint, on its monotonic clock (since it
    /// first observed that, counting again whenever a taint reappears); `None` when it does not
    /// observe that now. The [`UNTAINT_SETTLE_MARGIN`] runs on it as well as on the wall clock,
    /// so a step of the wall clock never shortens it.
    pub untainted_for: Option<std::time::Duration>,
    /// The UID of the Node object named by `spec.nodeName` now (`None`: no such Node).
    pub node_uid: Option<String>,
    /// The `status.nodeInfo.systemUUID` of that Node now (`None`: no such Node, or it reports
    /// none). Pinned when the fence starts ([`palisade_model::nodefence::PinnedNode`]) unless
    /// [`Self::advertised_system_uuid`] names a machine.
    pub node_system_uuid: Option<String>,
    /// The machine UUID the node's latest observed Lease advertisement names
    /// ([`palisade_model::advertise::Advertisement::system_uuid`]): the machine that renewed
    /// last, before the silence; `None` when it names none (an older agent, a kubelet-only
    /// node). Pinned in preference to [`Self::node_system_uuid`]: the machine that fell silent
    /// is the one the fence acts on, whatever registered under the node's name since (a
    /// reinstalled spare's kubelet rewrites the Node's `systemUUID` at once, its agent's
    /// renewals are seen only after the watch's lag).
    pub advertised_system_uuid: Option<String>,
    /// Who gave [`Self::clean_proof`] (meaningless without one): a person's confirmation, or
    /// the agent's answer with the machine UUID its renewal advertised.
    pub proof_from: ProofFrom,
    /// The oldest *other* unfinished `NodeFence` for the same node, if it is older than this
    /// one (by creation time, then name): then this one is superseded.
    pub older_sibling: Option<String>,
    /// How long this controller process has seen the fence in its current phase, on its
    /// monotonic clock (since it first read the status in that phase); `None` when the caller
    /// does not track it (then the phase's budget runs on the wall clock alone). See
    /// [`crate::budget::exceeded`].
    pub phase_seen_for: Option<std::time::Duration>,
}

/// The healthy-majority bound on trusting a self-fence, from the node's peer check (see
/// [`crate::majority`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerTrust {
    /// The node's last advertisement runs no peer check: it never excuses itself, no bound.
    NotPeerChecked,
    /// It runs one and no healthy strict majority is seen now: its peers may be excusing it.
    NoMajority,
    /// It runs one: trusted no earlier than this instant of the controller's monotonic clock
    /// ([`crate::majority::peer_checked_trust`]), whatever the wall clock reads.
    From(crate::clock::Mono),
}

/// Who gave a recovery's clean proof ([`Observations::clean_proof`]), for the machine identity
/// check against [`palisade_model::nodefence::PinnedNode::system_uuid`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProofFrom {
    /// A person's confirmation for this fence: no machine answered, nothing to compare.
    Person,
    /// The node agent's answer to the recovery challenge, from a renewal that advertised this
    /// machine UUID ([`palisade_model::advertise::Advertisement::system_uuid`]; `None`: it
    /// advertised none, as an older agent does).
    Agent(Option<String>),
}

/// Where a machine identity that differs from the pinned one was seen
/// ([`WaitFor::IdentityMismatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityFrom {
    /// The Node object's `status.nodeInfo.systemUUID` now.
    Node,
    /// The machine UUID advertised with the renewal that answered the recovery challenge.
    Answer,
}

/// A pod bound to the node, as release sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodePod {
    /// The pod.
    pub pod: ObjectRef,
    /// What backs each PersistentVolumeClaim its spec mounts, read live (empty: it mounts
    /// none). What a storage fence covers ([`VerifiedFence::covers`]).
    pub claims: Vec<palisade_model::target::ClaimBacking>,
}

impl NodePod {
    /// Whether its spec mounts a PersistentVolumeClaim.
    pub fn mounts_claim(&self) -> bool {
        !self.claims.is_empty()
    }
}

/// A volume still tied to the node: a VolumeAttachment, or an entry of the Node's
/// `status.volumesInUse`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeVolume {
    /// The object to release (for an attach record: `name` is the unique volume name).
    pub object: ObjectRef,
    /// The CSI driver it belongs to (a VolumeAttachment's `spec.attacher`; the driver of a
    /// `kubernetes.io/csi/<driver>^<handle>` volume name), if known.
    pub driver: Option<String>,
}

impl NodeVolume {
    /// Whether a release on `proof` may detach it or clear it, given whether a pod this fence
    /// holds (not covered) still mounts a claim on the node.
    ///
    /// Guarantees: under a storage block that names what it fences, a volume is released only
    /// when its CSI driver is named, or when no held pod on the node mounts a claim (every
    /// claim still in use there is then one the block covers, or its pod is gone); under any
    /// other proof, always.
    pub fn covered(&self, proof: &VerifiedFence, held_claims: bool) -> bool {
        match proof.storage_scope() {
            None => true,
            Some(scope) => {
                !held_claims
                    || self
                        .driver
                        .as_ref()
                        .is_some_and(|d| scope.csi_drivers.iter().any(|n| n == d))
            }
        }
    }
}

/// The positive proof that no container of a pod the API does not bind to the node (this
/// fence's released pods first of all) exists on the node any more, or ever will again, from
/// the advertisement the node's agent wrote after it read this fence's recovery `challenge`
/// ([`Step::PostChallenge`]), and `bound`: the UIDs of the pods the API binds to the node,
/// read live after that advertisement was observed.
///
/// The proof is per node, not per fence: the storage block it lifts is the node's. A pod
/// another fence released (one that failed, or was deleted, before its own recovery), or one
/// deleted by anyone else, whose container still lives (a hung agent, a process in D state)
/// blocks the unfence like one of this fence's own.
///
/// Guarantees: `Some` only when the advertisement answers `challenge`, its runtime inventory
/// is complete, names none of the released pods and no pod outside `bound`, and, when the
/// verified level reset the
/// machine instead of powering it off ([`LevelKind::StorageThenReset`]) or the inventory was
/// read from the CRI, its boot ID differs from the one recorded when fencing started. No clock takes part: the challenge is written
/// only after every released pod was deleted, so the answer orders the inventory after the
/// release by causality (a Lease write composed earlier, however late it lands or is observed,
/// cannot carry it). A boot ID alone is never the proof: a boot that began before the release
/// (a watchdog reset before the fence, a machine powered on early) may have started a
/// released pod while the API still listed it.
///
/// After a reset fence the new boot ID is needed on top of the inventory: the reset is the
/// fence's promise that nothing of the old boot touches the storage once it is unblocked (its
/// page cache, its mounts, processes outside any pod), and only a new boot shows it happened. A
/// node that advertised no boot ID when fencing began never gets that proof (it waits, and says
/// so).
///
/// An inventory read from the CRI by the companion beside a stock kubelet
/// ([`RuntimeSource::Cri`]) also needs a new boot, whatever the fence: the companion cannot
/// see processes started outside the CRI, and it does not start pods; the kubelet does, from
/// its own view of the API, which the challenge does not order (a kubelet that was partitioned
/// with a released pod in its memory may start it again after the inventory, until it sees the
/// deletion). A new boot ends both: the old boot's processes are gone, and the boot's kubelet
/// learned its pods from the API after the fence powered the machine off or reset it. Such an
/// inventory names every pod of which the runtime holds any record, live or exited, so a
/// kubelet of the new boot that still manages a released pod keeps the proof away.
///
/// Assumptions: the agent keeps [`palisade_model::advertise::Advertisement::challenge`]'s
/// guarantee: its inventory names every pod with a live container and every pod it manages,
/// and it starts a pod only after a read of the pod that follows the challenge it answered.
pub fn clean_proof(
    status: &NodeFenceStatus,
    ad: &palisade_model::advertise::Advertisement,
    challenge: &str,
    bound: &BTreeSet<String>,
) -> Option<String> {
    if ad.challenge.as_deref() != Some(challenge) {
        return None;
    }
    let reset_fence = status.verified_fence().is_some_and(|v| {
        usize::try_from(v.level())
            .ok()
            .and_then(|i| status.plan.as_ref()?.levels.get(i))
            .is_some_and(|l| l.kind == LevelKind::StorageThenReset)
    });
    let new_boot = match (&status.recovery.boot_id_at_fence, &ad.boot_id) {
        (Some(before), Some(now)) if before != now => {
            Some(format!("; the boot ID changed from {before} to {now}"))
        }
        _ => None,
    };
    let from_cri = ad.runtime_source == RuntimeSource::Cri;
    if (reset_fence || from_cri) && new_boot.is_none() {
        return None;
    }
    let inventory = ad.runtime_pods.as_ref()?;
    let none_left = !status
        .release
        .pods
        .iter()
        .any(|p| inventory.contains(&p.uid))
        && unbound_in_inventory(ad, bound).is_empty();
    none_left.then(|| {
        format!(
            "the {}, taken after it read recovery challenge {challenge}, lists none of the {} released pod(s) and only pods the API binds to the node ({} listed){}",
            if from_cri {
                "companion's inventory of the container runtime (CRI; blind to processes outside it)"
            } else {
                "node agent's runtime inventory"
            },
            status.release.pods.len(),
            inventory.len(),
            new_boot.unwrap_or_default()
        )
    })
}

/// The pods the advertisement's runtime inventory lists that the API does not bind to the
/// node (`bound`): each blocks [`clean_proof`]. Empty when the inventory is incomplete (that
/// blocks the proof on its own).
pub fn unbound_in_inventory<'a>(
    ad: &'a palisade_model::advertise::Advertisement,
    bound: &BTreeSet<String>,
) -> Vec<&'a str> {
    ad.runtime_pods
        .iter()
        .flatten()
        .filter(|uid| !bound.contains(*uid))
        .map(String::as_str)
        .collect()
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
    /// Fencing: the node runs a peer check and the controller does not see a healthy strict
    /// majority of nodes, so the node may be excused by its peers (a control-plane outage).
    HealthyMajority,
    /// Recovering: the node is back but no positive proof that the released pods' containers
    /// are gone (the agent's runtime inventory answering the recovery challenge, and after a
    /// reset fence a new boot ID) was observed yet.
    CleanProof,
    /// Released: the policy leaves the node off; nothing to do until it comes back.
    NodeLeftOff,
    /// Recovering: the node agent must renew its Lease and report no stale pods.
    Rejoin,
    /// Recovering: `untaintWhen: Manual`; a person removes the taint.
    ManualUntaint,
    /// Recovering: no policy covers the node now.
    Policy,
    /// Pending: no Node of this name exists; the fence fails with `NodeNotFound` at `until`
    /// unless one registers.
    NodeExists,
    /// Recovering: the release taints this fence removed are still on the observed Node (the
    /// controller's cache has not seen the removal yet).
    Untaint,
    /// Recovering: an out-of-service taint this fence did not add (its key) is on the Node; the
    /// storage block stays while any out-of-service taint is there, since Kubernetes may still
    /// force-delete pods and force-detach volumes because of it. Palisade never removes it.
    ForeignOutOfService(String),
    /// Recovering: these VolumeAttachments of the node (names) have not settled
    /// ([`attachment_settled`]).
    AttachmentsSettle(Vec<String>),
    /// Recovering: the untaint was observed; the storage block stays for
    /// [`UNTAINT_SETTLE_MARGIN`] after it, for caches that still act on the old taint.
    UntaintMargin,
    /// Releasing: a power device could not be read before a release; it is read again at
    /// `until` (at most [`POWER_REREADS`] times under one token, then the fence fails).
    PowerRecheck,
    /// Recovering: a recovery action (power on, storage unblock) on these devices failed; it is
    /// tried again at `until` ([`recovery_retry_at`]).
    RecoveryRetry,
    /// Recovering: another machine answers under the node's name. The fence pinned machine
    /// `pinned` ([`palisade_model::nodefence::PinnedNode::system_uuid`]), and `from` shows
    /// `found` (`None`: an answer that advertises no machine UUID, as an older agent's): no
    /// recovery answer counts until the pinned machine gives one.
    IdentityMismatch {
        /// The machine UUID pinned when the fence started.
        pinned: String,
        /// What was seen instead.
        found: Option<String>,
        /// Where it was seen.
        from: IdentityFrom,
    },
}

/// How long after the untaint was observed (and with the node's VolumeAttachments settled) the
/// storage block stays, on the wall clock and the controller's monotonic clock: a lagging pod
/// garbage collector or attach-detach cache can still force-delete pods or force-detach volumes
/// after the out-of-service taint is gone (kubernetes/kubernetes #141887, #141888, #142331).
/// It covers an informer's lag behind the Node update, not a controller that is down: the
/// settled-attachment check is what covers a detach already under way.
pub const UNTAINT_SETTLE_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a VolumeAttachment of the node has settled: nothing is detaching it.
///
/// Unsettled means observably on its way to a detach: the object is being deleted
/// (`deletionTimestamp` set: the attacher's finalizer holds it until the detach is done), or
/// a detach was tried and failed (`status.detachError` set: the attach-detach controller
/// retries it). An attachment being attached (a new pod on the rejoined node) is settled: an
/// attach does not take a volume away from anyone.
pub fn attachment_settled(being_deleted: bool, detach_error: bool) -> bool {
    !being_deleted && !detach_error
}

/// How many times, under one fencing token, the power devices are read before a release while
/// one cannot be read; then the fence fails (`PowerNotOff`): never a release on doubt.
pub const POWER_REREADS: usize = 3;

/// How long after an unreadable power re-read the next one is made.
pub const POWER_REREAD_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a `NodeFence` waits in Pending for its Node to exist before it fails with
/// `NodeNotFound` (long enough for a Node that is registering, or a cache that is catching up).
pub const NODE_NOT_FOUND_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

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
    /// Pin the node this fence acts on (name and Node UID), before anything else.
    PinNode(palisade_model::nodefence::PinnedNode),
    /// Another, older unfinished `NodeFence` for the node acts; this one fails as superseded.
    Supersede(String),
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
    ///
    /// With `reset` (a `powerOff: Disallowed` level, [`LevelKind::StorageThenReset`]): the
    /// storage devices (first in `devices`) block, verified; only if every one is verified, the
    /// power devices are sent a warm reset ([`palisade_model::nodefence::DeviceAction::Reset`]),
    /// never a power off. The level is verified on the storage evidence; a failed reset is
    /// recorded as an attempt and does not fail it.
    RunLevel {
        /// Plan level index.
        level: i32,
        /// Its devices.
        devices: Vec<PlannedDevice>,
        /// Whether power devices restart the machine instead of powering it off.
        reset: bool,
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
    /// Fencing: the node renewed during a self-fence level's wait: the wait restarts from
    /// that renewal (never shorter than before).
    RestartSelfFenceWait {
        /// Plan level index.
        level: i32,
        /// The renewal observed.
        silent_since: Timestamp,
        /// The new trust time.
        trusted_after: Timestamp,
        /// The heartbeat marker of that renewal.
        marker: Option<String>,
    },
    /// Fencing: conclude a level as failed without acting (a self-fence the node's newest
    /// advertisement no longer earns, or a plan that predates the re-checked trust rule).
    FailLevel {
        /// Plan level index.
        level: i32,
        /// Why.
        why: String,
    },
    /// Releasing: this pod is not covered by the verified fence (`NotCoveredByFence`): record
    /// it as held; it is never released by this fence.
    HoldPod(ObjectRef),
    /// Recovering: persist the positive proof before lifting anything.
    RecordCleanProof(String),
    /// Recovering, before any proof: write this fence's recovery challenge (its UID) on the
    /// Node ([`palisade_model::advertise::RECOVERY_CHALLENGE`]). Only an advertisement that
    /// answers it can prove the node clean ([`clean_proof`]).
    PostChallenge,
    /// Release 1, before any pod is released: taint the node so no replacement is scheduled
    /// back onto it (`palisade.dev/fenced:NoSchedule`, [`ReleaseTaints::NoSchedule`]). Release
    /// 3, once this fence released every pod itself and held none:
    /// `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` ([`ReleaseTaints::OutOfService`]).
    ApplyTaint(VerifiedFence, ReleaseTaints),
    /// Release 2: record the pod in `status.release.releasing` (persisted first), then mark it
    /// fenced, patch it Failed, DELETE it with grace 0 and UID precondition, and move its record
    /// to `status.release.pods`.
    ReleasePod(VerifiedFence, ObjectRef),
    /// Release 2, resumed: the pod in `status.release.releasing` is gone from the node (a
    /// previous leader's deletion landed before it could record it): move its record to
    /// `status.release.pods`.
    RecordReleased(ObjectRef),
    /// Release 4: DELETE a VolumeAttachment (UID precondition), once no pod of the node remains.
    DeleteAttachment(VerifiedFence, ObjectRef),
    /// Release 5: clear a PV's attach record.
    ClearAttachRecord(VerifiedFence, ObjectRef),
    /// Recover: power the node on through these devices (every power device of every tried level).
    PowerOn(Vec<PlannedDevice>),
    /// Recover: lift the storage fence on these devices (every storage device of every tried level).
    Unfence(Vec<PlannedDevice>),
    /// Recover: remove the release taints this fence added (never one it did not add), with
    /// their record ([`palisade_model::nodefence::ANNOTATION_RELEASE_TAINTS`]), in one Node
    /// update.
    RemoveTaint,
    /// Recovering: the Node carries neither a release taint of this fence nor an out-of-service
    /// taint: record when this was first observed (`status.recovery.untaintObservedAt`).
    RecordUntaintObserved,
    /// Releasing, before the first release and before the next one under a new fencing token:
    /// read the power state of these devices (the verified level's power devices that proved
    /// it off) and record each reading (`status.release.powerRechecks`). A read, never a
    /// command.
    RecheckPower(Vec<PlannedDevice>),
}

/// The taints a release puts on the fenced node ([`Step::ApplyTaint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseTaints {
    /// `palisade.dev/fenced:NoSchedule`: before the first release (`status.release.taintedAt`).
    NoSchedule,
    /// `palisade.dev/fenced:NoSchedule` and
    /// `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
    /// (`status.release.outOfServiceAt`): the fence covers every pod, none is held, and this
    /// fence released them all. Never while a held pod is on the node: Kubernetes 1.26+ would
    /// delete it.
    OutOfService,
}

impl ReleaseTaints {
    /// Records in `release` that these taints were applied at `at`: the NoSchedule taint in
    /// `taintedAt`, the out-of-service taint in `outOfServiceAt` (what [`next_step`] reads to
    /// go on).
    pub fn record(self, release: &mut ReleaseProgress, at: MicroTime) {
        match self {
            ReleaseTaints::NoSchedule => release.tainted_at = Some(at),
            ReleaseTaints::OutOfService => release.out_of_service_at = Some(at),
        }
    }
}

impl Step {
    /// Stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Step::Nothing => "nothing",
            Step::Refuse { .. } => "refuse_stale_token",
            Step::RecordToken(_) => "record_token",
            Step::PinNode(_) => "pin_node",
            Step::Supersede(_) => "supersede",
            Step::Hold(_) => "hold",
            Step::Wait { .. } => "wait",
            Step::Cancel => "cancel",
            Step::StartFencing { .. } => "start_fencing",
            Step::RunLevel { .. } => "run_level",
            Step::TrustSelfFence { .. } => "trust_self_fence",
            Step::Enter(_) => "enter",
            Step::Fail(_) => "fail",
            Step::RestartSelfFenceWait { .. } => "restart_self_fence_wait",
            Step::FailLevel { .. } => "fail_level",
            Step::HoldPod(_) => "hold_pod",
            Step::RecordCleanProof(_) => "record_clean_proof",
            Step::PostChallenge => "post_challenge",
            Step::ApplyTaint(..) => "apply_taint",
            Step::ReleasePod(..) => "release_pod",
            Step::RecordReleased(_) => "record_released",
            Step::DeleteAttachment(..) => "delete_attachment",
            Step::ClearAttachRecord(..) => "clear_attach_record",
            Step::PowerOn(_) => "power_on",
            Step::Unfence(_) => "unfence",
            Step::RemoveTaint => "remove_taint",
            Step::RecordUntaintObserved => "record_untaint_observed",
            Step::RecheckPower(_) => "recheck_power",
        }
    }

    /// Whether the step changes anything outside the status (devices or API objects).
    pub fn is_action(&self) -> bool {
        matches!(
            self,
            Step::RunLevel { .. }
                | Step::ApplyTaint(..)
                | Step::ReleasePod(..)
                | Step::DeleteAttachment(..)
                | Step::ClearAttachRecord(..)
                | Step::PowerOn(_)
                | Step::PostChallenge
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
    if let Some(older) = &obs.older_sibling {
        return Step::Supersede(older.clone());
    }
    match &status.pinned {
        None => {
            return Step::PinNode(palisade_model::nodefence::PinnedNode {
                name: spec.node_name.clone(),
                uid: obs.node_uid.clone().unwrap_or_default(),
                system_uuid: [&obs.advertised_system_uuid, &obs.node_system_uuid]
                    .into_iter()
                    .flatten()
                    .find(|u| palisade_model::identity::normalize_uuid(u).is_some())
                    .cloned(),
            })
        }
        Some(p) if p.name != spec.node_name => return Step::Fail(FailureReason::SpecChanged),
        Some(p) => {
            if let Some(uid) = &obs.node_uid {
                if !p.uid.is_empty() && *uid != p.uid {
                    return Step::Fail(FailureReason::NodeReplaced);
                }
            }
        }
    }
    if phase == Phase::Pending {
        return pending(spec, status, obs);
    }
    if status.fencing_token != Some(obs.token) {
        return Step::RecordToken(obs.token);
    }
    // The budget runs on the wall clock and on this process's monotonic clock: a step of the
    // wall clock never fails a fence mid-phase.
    if crate::budget::exceeded(status, obs.now, obs.phase_seen_for) {
        return Step::Fail(FailureReason::BudgetExceeded);
    }
    if phase == Phase::Fencing {
        return fencing(status, obs);
    }
    // Every later phase requires the proof.
    let Some(proof) = status.verified_fence() else {
        return Step::Fail(FailureReason::NoVerifiedFence);
    };
    if matches!(phase, Phase::Fenced | Phase::Releasing)
        && returned_after_self_fence(status, obs, &proof)
    {
        return Step::Fail(FailureReason::NodeReturned);
    }
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

/// Pending: fail a fence whose Node does not exist after [`NODE_NOT_FOUND_GRACE`] (nothing was
/// done; the request names nothing to fence), else cancel, hold, wait or start as decided.
fn pending(spec: &NodeFenceSpec, status: &NodeFenceStatus, obs: &Observations<'_>) -> Step {
    if obs.node_uid.is_none() {
        let created = status
            .transitions
            .iter()
            .find(|t| t.phase == Phase::Pending)
            .map(|t| t.at.0);
        if let Some(deadline) = created.and_then(|c| c.checked_add(NODE_NOT_FOUND_GRACE).ok()) {
            if obs.now.wall > deadline {
                return Step::Fail(FailureReason::NodeNotFound);
            }
            return Step::Wait {
                why: WaitFor::NodeExists,
                until: Some(deadline),
            };
        }
    }
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
            reset: false,
        },
        // No storage device: nothing could prove this level (refused by validation; an
        // edited or hand-written plan still never resets on nothing).
        LevelKind::StorageThenReset
            if !planned
                .devices
                .iter()
                .any(|d| d.kind == DeviceKind::Storage) =>
        {
            Step::Fail(FailureReason::NoPlan)
        }
        LevelKind::StorageThenReset => Step::RunLevel {
            level,
            devices: planned.devices.clone(),
            reset: true,
        },
        LevelKind::SelfFence => self_fence_level(level, planned, obs),
    }
}

/// A self-fence level: wait out the trust time, re-checking the silence on every step.
///
/// Guarantees: trusted only once the node has been silent, as observed by the controller, for
/// the whole wait since its last observed renewal; a renewal during the wait restarts it from
/// that renewal (never shortening it), and a renewal whose advertisement no longer earns trust
/// fails the level. For a node that runs a peer check, also only while a healthy strict
/// majority is seen, and no earlier than its [`PeerTrust::From`] bound.
fn self_fence_level(
    level: i32,
    planned: &palisade_model::nodefence::PlannedLevel,
    obs: &Observations<'_>,
) -> Step {
    let (Some(trusted_after), Some(since), Some(wait)) = (
        planned.trusted_after.as_ref().map(|t| t.0),
        planned.silent_since.as_ref().map(|t| t.0),
        planned
            .trust_wait_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(std::time::Duration::from_secs),
    ) else {
        return Step::FailLevel {
            level,
            why: "the self-fence level records no silence start or wait; not trusted".into(),
        };
    };
    let Some(marker) = planned.silent_marker.as_ref() else {
        return Step::FailLevel {
            level,
            why: "the self-fence level records no heartbeat marker; not trusted".into(),
        };
    };
    let Some(current) = obs.heartbeat_marker.as_ref() else {
        return Step::FailLevel {
            level,
            why: "the node's heartbeat can no longer be read; silence cannot be confirmed".into(),
        };
    };
    // The marker alone says whether the node renewed since (timestamps are compared only to
    // place the restart): the renewal's observed time when the controller saw this very
    // renewal, else (a controller restart in between, or the watch behind the fresh read)
    // now, the latest it can have been.
    let renewed = (current != marker).then(|| {
        obs.last_renewal
            .filter(|r| *r > since)
            .unwrap_or(obs.now.wall)
    });
    if let Some(renewed) = renewed {
        let Some(new_wait) = obs.self_fence_wait else {
            return Step::FailLevel {
                level,
                why: format!("the node renewed at {renewed} during the self-fence wait and no longer advertises a trusted self-fence"),
            };
        };
        let wait = wait.max(new_wait);
        let restarted = jiff_add(renewed, wait).max(trusted_after);
        return Step::RestartSelfFenceWait {
            level,
            silent_since: renewed,
            trusted_after: restarted,
            marker: obs.heartbeat_marker.clone(),
        };
    }
    let peer_from = match obs.peer_trust {
        PeerTrust::NotPeerChecked => None,
        PeerTrust::NoMajority => {
            return Step::Wait {
                why: WaitFor::HealthyMajority,
                until: None,
            }
        }
        PeerTrust::From(t) => Some(t),
    };
    // Both clocks must agree the wait is over: the wall clock (the deadline persisted for any
    // controller) and this process's monotonic clock (immune to wall-clock steps; after a
    // restart it counts from when this process first saw the node, which only waits longer).
    // The healthy-majority bound is on the monotonic clock alone.
    let watched = obs.watched_silence.unwrap_or_default();
    let peer_over = peer_from.is_none_or(|t| obs.now.mono >= t);
    if obs.now.wall >= trusted_after && watched >= wait && peer_over {
        Step::TrustSelfFence { level }
    } else {
        let until = trusted_after.max(jiff_add(obs.now.wall, wait.saturating_sub(watched)));
        Step::Wait {
            why: WaitFor::SelfFence,
            until: Some(peer_from.map_or(until, |t| until.max(obs.now.to_wall(t)))),
        }
    }
}

fn jiff_add(t: Timestamp, d: std::time::Duration) -> Timestamp {
    k8s_openapi::jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Whether the node renewed after the silence a verified self-fence proof counted from: its
/// agent is alive and would restart what it killed, so nothing more may be released on it.
fn returned_after_self_fence(
    status: &NodeFenceStatus,
    obs: &Observations<'_>,
    proof: &VerifiedFence,
) -> bool {
    if !proof.is_self_fence(status.plan.as_ref()) {
        return false;
    }
    let planned = usize::try_from(proof.level())
        .ok()
        .and_then(|i| status.plan.as_ref()?.levels.get(i));
    // No recorded marker: never trust more than what is already done.
    let marker = planned.and_then(|l| l.silent_marker.as_ref());
    marker.is_none() || obs.heartbeat_marker.as_ref() != marker
}

/// Guarantees: a pod is released only when the proof covers it ([`VerifiedFence::covers`]: a
/// storage block only the pods whose every claim is in what its devices named); every other
/// pod is recorded as held first and never released by this fence. The node is tainted
/// `NoSchedule` before the first release, so the replacements of released pods are not
/// scheduled back onto the fenced node (where they would be released again, or wait for a
/// node that may never return) while Kubernetes still counts it Ready.
///
/// The out-of-service taint is a release of its own: on Kubernetes 1.26+ taint eviction and the
/// pod garbage collector force-delete the pods of a NotReady node that carries it, and the
/// attach-detach controller detaches its volumes. So it is applied only when no pod is held
/// (it would release uncovered pods behind the fence's back), only after this fence released
/// every pod on the node itself (each one recorded, none left for Kubernetes to delete
/// unrecorded), and before the attachments. Every release (the out-of-service taint, pod,
/// VolumeAttachment, attach record) waits on `power_recheck`: after a power-off proof, the
/// proving devices must have read off under the current token.
fn releasing(status: &NodeFenceStatus, obs: &Observations<'_>, proof: VerifiedFence) -> Step {
    let held: std::collections::HashSet<&str> =
        status.release.held.iter().map(|h| h.uid.as_str()).collect();
    let (held_pods, mut pods): (Vec<&NodePod>, Vec<&NodePod>) = obs
        .pods_on_node
        .iter()
        .partition(|p| held.contains(p.pod.uid.as_str()));
    pods.sort();
    if let Some(p) = pods.iter().find(|p| !proof.covers(&p.claims)) {
        return Step::HoldPod(p.pod.clone());
    }
    let held_claims = held_pods.iter().any(|p| p.mounts_claim());
    let attachments: Vec<&NodeVolume> = obs
        .attachments
        .iter()
        .filter(|v| v.covered(&proof, held_claims))
        .collect();
    let attach_records: Vec<&NodeVolume> = obs
        .attach_records
        .iter()
        .filter(|v| v.covered(&proof, held_claims))
        .collect();
    // A release a previous leader started: finish it before anything else, so the status names
    // every pod this fence deleted.
    if let Some(r) = status.release.releasing.as_ref() {
        return match pods.iter().find(|p| p.pod.uid == r.uid) {
            Some(p) => power_recheck(status, obs, &proof)
                .unwrap_or_else(|| Step::ReleasePod(proof, p.pod.clone())),
            None => Step::RecordReleased(ObjectRef {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                uid: r.uid.clone(),
            }),
        };
    }
    if status.release.tainted_at.is_none() {
        return Step::ApplyTaint(proof, ReleaseTaints::NoSchedule);
    }
    let next = pods.first().map(|p| p.pod.clone());
    let out_of_service = held.is_empty() && status.release.out_of_service_at.is_none();
    if next.is_some() || out_of_service || !attachments.is_empty() || !attach_records.is_empty() {
        if let Some(step) = power_recheck(status, obs, &proof) {
            return step;
        }
    }
    if let Some(p) = next {
        return Step::ReleasePod(proof, p);
    }
    if out_of_service {
        return Step::ApplyTaint(proof, ReleaseTaints::OutOfService);
    }
    // Only once no covered pod of the node remains are attachments broken, and only those
    // the proof covers (a held pod's volume stays attached: [`NodeVolume::covered`]).
    if let Some(va) = attachments.into_iter().min() {
        return Step::DeleteAttachment(proof, va.object.clone());
    }
    if let Some(pv) = attach_records.into_iter().min() {
        return Step::ClearAttachRecord(proof, pv.object.clone());
    }
    Step::Enter(Phase::Released)
}

/// The verified level's power devices whose evidence is a power off
/// ([`palisade_model::nodefence::EvidenceKind::PowerOff`]): what a release re-reads.
///
/// A storage-only level, a reset level ([`LevelKind::StorageThenReset`]: its machine is
/// meant to run again, its proof is the storage block) and a self-fence level (its proof is
/// the trust time) have none: nothing was powered off, so there is no power state to re-read.
fn powered_off_devices(status: &NodeFenceStatus, proof: &VerifiedFence) -> Vec<PlannedDevice> {
    let Some(level) = usize::try_from(proof.level())
        .ok()
        .and_then(|i| status.plan.as_ref()?.levels.get(i))
    else {
        return vec![];
    };
    let mut out: Vec<PlannedDevice> = Vec::new();
    for d in level.devices.iter().filter(|d| d.kind == DeviceKind::Power) {
        let proved_off = status.evidence.iter().any(|e| {
            e.level == proof.level()
                && e.device == d.url
                && e.kind == palisade_model::nodefence::EvidenceKind::PowerOff
        });
        if proved_off && !out.iter().any(|o| o.url == d.url) {
            out.push(d.clone());
        }
    }
    out
}

/// Before a release: the power re-read still owed under the current token, or why nothing is
/// released; `None` when every device that proved the fence off has read `Off` under this
/// token (or there is none).
///
/// Guarantees: a release (pod, attachment, attach record) under token `t` follows a re-read
/// under `t` in which each such device read `Off` as its latest reading; so the first release
/// of a fence, and the first after a leader change, comes after a fresh read. A device whose
/// latest reading under `t` is `On` fails the fence (`PowerNotOff`): something powered the
/// machine on since the verify, and no release follows. One that could not be read is read
/// again after [`POWER_REREAD_RETRY`], at most [`POWER_REREADS`] times under one token, then
/// the fence fails the same way: never a release on doubt.
///
/// Assumptions: a device's status read reflects the machine's power (the same read the verify
/// polled); a re-read is a read and never changes the machine's power.
fn power_recheck(
    status: &NodeFenceStatus,
    obs: &Observations<'_>,
    proof: &VerifiedFence,
) -> Option<Step> {
    use palisade_model::nodefence::RecheckedPower;
    let devices = powered_off_devices(status, proof);
    if devices.is_empty() {
        return None;
    }
    let ours: Vec<_> = status
        .release
        .power_rechecks
        .iter()
        .filter(|r| r.token == obs.token)
        .collect();
    let latest = |url: &str| ours.iter().rev().find(|r| r.device == url);
    let mut unreadable = None;
    for d in &devices {
        match latest(&d.url).map(|r| (r.state, r.at.0)) {
            None => return Some(Step::RecheckPower(devices)),
            Some((RecheckedPower::On, _)) => return Some(Step::Fail(FailureReason::PowerNotOff)),
            Some((RecheckedPower::Unknown, at)) => unreadable = Some(at),
            Some((RecheckedPower::Off, _)) => {}
        }
    }
    let at = unreadable?;
    // Every re-read reads every device: one device's readings count the rounds.
    let reads = ours.iter().filter(|r| r.device == devices[0].url).count();
    if reads >= POWER_REREADS {
        return Some(Step::Fail(FailureReason::PowerNotOff));
    }
    let again = jiff_add(at, POWER_REREAD_RETRY);
    Some(if obs.now.wall >= again {
        Step::RecheckPower(devices)
    } else {
        Step::Wait {
            why: WaitFor::PowerRecheck,
            until: Some(again),
        }
    })
}

/// Devices of `kind` in every level that was tried (concluded), deduplicated by URL.
///
/// A failed level may still have blocked the node at the storage or cut its power (one device
/// succeeded, another did not), so recovery reverses every tried level, not only the verified
/// one. Power-on and unblock are idempotent.
///
/// The power devices of a level that must not power the machine off
/// ([`LevelKind::StorageThenReset`]) are never listed: they only reset it, and a host that
/// loses its BMC when off is never sent a power command in recovery either.
fn tried_devices(status: &NodeFenceStatus, kind: DeviceKind) -> Vec<PlannedDevice> {
    let Some(plan) = status.plan.as_ref() else {
        return vec![];
    };
    let mut out: Vec<PlannedDevice> = Vec::new();
    for outcome in &status.levels {
        let level = usize::try_from(outcome.level)
            .ok()
            .and_then(|i| plan.levels.get(i))
            .filter(|l| !(kind == DeviceKind::Power && l.kind == LevelKind::StorageThenReset));
        for d in level.iter().flat_map(|l| &l.devices) {
            if d.kind == kind && !out.iter().any(|o| o.url == d.url) {
                out.push(d.clone());
            }
        }
    }
    out
}

/// Whether another machine than the one this fence pinned stands behind the node's name now:
/// the Node reports another `systemUUID`, or the renewal that answered the recovery challenge
/// advertises another machine UUID, or none.
///
/// Guarantees: with a pinned UUID, an agent's answer counts only when it advertises the same
/// machine ([`palisade_model::identity::same_machine`], either byte order) and the Node
/// reports no other machine (a Node that reports none is not a mismatch: the answer's own
/// UUID must still match). A fence pinned without a UUID, and a person's confirmation
/// ([`ProofFrom::Person`]), are never refused here (today's rule: the challenge alone orders
/// the answer).
///
/// Assumptions: an agent advertises the UUID of the machine it runs on
/// ([`palisade_model::advertise::SYSTEM_UUID`]), read as the kubelet reads it; two machines
/// never share an SMBIOS UUID.
fn other_machine(status: &NodeFenceStatus, obs: &Observations<'_>) -> Option<WaitFor> {
    use palisade_model::identity::same_machine;
    let pinned = status.pinned.as_ref()?.system_uuid.as_ref()?;
    if let Some(node) = obs.node_system_uuid.as_ref().filter(|u| !u.is_empty()) {
        if !same_machine(pinned, node) {
            return Some(WaitFor::IdentityMismatch {
                pinned: pinned.clone(),
                found: Some(node.clone()),
                from: IdentityFrom::Node,
            });
        }
    }
    match (&obs.clean_proof, &obs.proof_from) {
        (Some(_), ProofFrom::Agent(answered))
            if !answered.as_ref().is_some_and(|a| same_machine(pinned, a)) =>
        {
            Some(WaitFor::IdentityMismatch {
                pinned: pinned.clone(),
                found: answered.clone(),
                from: IdentityFrom::Answer,
            })
        }
        _ => None,
    }
}

/// The least and the most a failed recovery action (power on, unblock) waits before it is
/// tried again: doubling from the least after each failure.
pub const RECOVERY_RETRY: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(30),
);

/// When a recovery action on `devices` may be tried again: `None` when none of their recovery
/// attempts failed; else the last failure's time plus a delay that doubles with each failure
/// ([`RECOVERY_RETRY`]).
///
/// Guarantees: a BMC or storage array that keeps refusing (a power-on right after a power-off,
/// a session limit) is asked at most about once per 30 s, and the attempts the status keeps
/// stay bounded by the Recovering budget over that delay (not by the reconcile rate).
pub fn recovery_retry_at(status: &NodeFenceStatus, devices: &[PlannedDevice]) -> Option<Timestamp> {
    use palisade_model::nodefence::DeviceAction;
    let failed: Vec<Timestamp> = status
        .attempts
        .iter()
        .filter(|a| matches!(a.action, DeviceAction::PowerOn | DeviceAction::Unblock))
        .filter(|a| a.outcome != palisade_model::nodefence::AttemptOutcome::Succeeded)
        .filter(|a| devices.iter().any(|d| d.url == a.device))
        .map(|a| a.at.0)
        .collect();
    let last = failed.iter().max()?;
    let (least, most) = RECOVERY_RETRY;
    let doublings = u32::try_from(failed.len().saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(16);
    let delay = least.saturating_mul(1 << doublings).min(most);
    Some(*last + delay)
}

/// `action` on `devices`, unless a recovery action on them failed and its retry is not due
/// yet ([`recovery_retry_at`]): then a wait until it is.
fn recovery_action(
    status: &NodeFenceStatus,
    obs: &Observations<'_>,
    devices: Vec<PlannedDevice>,
    action: fn(Vec<PlannedDevice>) -> Step,
) -> Step {
    match recovery_retry_at(status, &devices) {
        Some(at) if obs.now.wall < at => Step::Wait {
            why: WaitFor::RecoveryRetry,
            until: Some(at),
        },
        _ => action(devices),
    }
}

/// Recovering, in this order: the recovery challenge, power-on, the node's rejoin, the clean
/// proof; then the untaint, and only after it settled the storage unblock; then Done.
///
/// Guarantees: the storage block is lifted ([`Step::Unfence`]) only when the Node is observed
/// carrying no release taint this fence added and no out-of-service taint at all (a foreign
/// one, which this fence never removes, keeps the block and is waited on by name), the
/// untaint's first observation is persisted, none of the node's VolumeAttachments is
/// unsettled, and [`UNTAINT_SETTLE_MARGIN`] has passed since that observation on the wall
/// clock and on this process's monotonic watch. Only taints this fence recorded adding are
/// removed ([`Step::RemoveTaint`]), and only after the clean proof. An agent's answer becomes
/// the clean proof only from the machine the fence pinned (`other_machine`): another machine
/// under the node's name waits ([`WaitFor::IdentityMismatch`]).
///
/// Assumptions: [`Observations::untainted_for`] is reset whenever the observed Node carries
/// such a taint again, and never exceeds the time this process has watched it without one.
/// A foreign out-of-service taint that stays keeps the fence Recovering until the phase's
/// budget fails it (`BudgetExceeded`), with the block still in place: a person decides.
fn recovering(status: &NodeFenceStatus, obs: &Observations<'_>) -> Step {
    let Some(recovery) = obs.recovery else {
        return Step::Wait {
            why: WaitFor::Policy,
            until: None,
        };
    };
    let rec = &status.recovery;
    // The challenge goes out first (the release is recorded by now), so a machine that boots
    // can answer it with its first renewal. A Node that does not exist carries nothing: a
    // re-registered one gets the challenge when it appears.
    if rec.clean_proof.is_none() && !obs.challenge_posted && obs.node_uid.is_some() {
        return Step::PostChallenge;
    }
    if recovery.power_on && rec.powered_on_at.is_none() {
        let power = tried_devices(status, DeviceKind::Power);
        if !power.is_empty() {
            return recovery_action(status, obs, power, Step::PowerOn);
        }
    }
    if !obs.node_healthy {
        return Step::Wait {
            why: WaitFor::Rejoin,
            until: None,
        };
    }
    if rec.clean_proof.is_none() {
        if let Some(why) = other_machine(status, obs) {
            return Step::Wait { why, until: None };
        }
        return match &obs.clean_proof {
            Some(p) => Step::RecordCleanProof(p.clone()),
            None => Step::Wait {
                why: WaitFor::CleanProof,
                until: None,
            },
        };
    }
    // The untaint first: the release taints this fence added go (or, `Manual`, a person
    // removes them) while the storage block still holds.
    if !obs.taints_added.is_empty() {
        return match recovery.untaint_when {
            UntaintWhen::NodeReady if rec.untainted_at.is_none() => Step::RemoveTaint,
            UntaintWhen::NodeReady => Step::Wait {
                why: WaitFor::Untaint,
                until: None,
            },
            UntaintWhen::Manual => Step::Wait {
                why: WaitFor::ManualUntaint,
                until: None,
            },
        };
    }
    let storage = tried_devices(status, DeviceKind::Storage);
    if rec.unfenced_at.is_some() || storage.is_empty() {
        return Step::Enter(Phase::Done);
    }
    // Then the block stays while any out-of-service taint is on the node, whoever put it there.
    if let Some(key) = obs
        .taints_foreign
        .iter()
        .find(|k| k.as_str() == palisade_model::OUT_OF_SERVICE_TAINT_KEY)
    {
        return Step::Wait {
            why: WaitFor::ForeignOutOfService(key.clone()),
            until: None,
        };
    }
    let Some(observed) = rec.untaint_observed_at.as_ref().map(|t| t.0) else {
        return Step::RecordUntaintObserved;
    };
    if !obs.unsettled_attachments.is_empty() {
        let mut names: Vec<String> = obs
            .unsettled_attachments
            .iter()
            .map(|a| a.name.clone())
            .collect();
        names.sort();
        return Step::Wait {
            why: WaitFor::AttachmentsSettle(names),
            until: None,
        };
    }
    // Both clocks must agree the margin is over (see `self_fence_level`): the wall clock from
    // the persisted observation, and this process's own watch, which a restarted or new leader
    // counts again from its first look.
    let watched = obs.untainted_for.unwrap_or_default();
    let deadline = jiff_add(observed, UNTAINT_SETTLE_MARGIN);
    if obs.now.wall >= deadline && watched >= UNTAINT_SETTLE_MARGIN {
        recovery_action(status, obs, storage, Step::Unfence)
    } else {
        Step::Wait {
            why: WaitFor::UntaintMargin,
            until: Some(deadline.max(jiff_add(
                obs.now.wall,
                UNTAINT_SETTLE_MARGIN.saturating_sub(watched),
            ))),
        }
    }
}
