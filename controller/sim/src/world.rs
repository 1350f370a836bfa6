//! The simulated world and the harness that performs the pure core's steps in it.
//!
//! The harness mirrors what the I/O controller (`palisade-controller`'s `detect` and
//! `reconcile`) does with each step: the same observations, the same records in the status.
//! The controller's watch lags by up to 1.5 s; a crash loses its memory and a restart takes a
//! higher token. A leader can also freeze between its last leadership check and a device
//! command: a standby takes over after the leader's Lease duration, and the old leader's
//! pending command reaches the device when it resumes (its status writes would fail their
//! precondition, so only the device sees it). The storage firewall keeps one hold per fence
//! that blocked a node, and a fence's unblock lifts only its own, as the lab storage server
//! does for a controller's direct storage device. The cluster can grow: each agent counts the
//! Node list of its last successful renewal (and of every attempt since), which its renewals
//! advertise, and the controller judges a silent node against the set it advertised. Agents with a peer check poll their peers over the
//! node network every second while their Lease is stale and keep their pods (and pet their
//! watchdog) while a strict majority vouches; the controller bounds its trust in their
//! self-fence by the healthy majority it observed (`palisade_decide::majority`), like
//! `reconcile::peer_trust`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use palisade_decide::detector::{Heartbeat, Thresholds};
use palisade_decide::majority::Streaks;
use palisade_decide::memory::Memory;
use palisade_decide::phase::{
    clean_proof, NodePod, ObjectRef, Observations, PeerTrust, ReleaseTaints, Step,
    UNTAINT_SETTLE_MARGIN,
};
use palisade_decide::power::{OffRun, PowerReading, PowerWatch};
use palisade_decide::record::{self, Answer, LevelRun};
use palisade_decide::snapshot::{
    FenceState, NodeSnapshot, PodSnapshot, PolicySnapshot, Snapshot, Tolerance,
};
use palisade_decide::verdict::Cause;
use palisade_decide::{decide, guards_holding, next_step, Clocks, Mono, Verdict};
use palisade_model::advertise::{
    Advertisement, MemberSet, PeerCheck, RuntimeSource, SelfFenceScope, Virtualization, Watchdog,
    WatchdogAction,
};
use palisade_model::nodefence::{
    Evidence, EvidenceKind, LevelKind, NodeFenceSpec, NodeFenceStatus, Phase, PlannedDevice,
    RequestedBy,
};
use palisade_model::policy::FencingPolicySpec;
use palisade_model::target::{
    ClaimBacking, DeviceKind, FenceDevice, FenceLevel, FenceTargetSpec, PowerOff, SecretRef,
    StorageScope,
};
use palisade_model::{FENCED_TAINT_KEY, OUT_OF_SERVICE_TAINT_KEY};

use crate::faults::{DeviceMode, Fault, Fencing, Schedule};
use crate::power::{NodeView, Watch};
use crate::rng::Rng;

/// A known mistake planted in the harness, to prove the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// Count a device command as verified without reading the device back.
    TrustCommand,
    /// Release the node's pods as soon as fencing starts, before any level is verified.
    ReleaseUnverified,
    /// Release every pod, also those the verified fence does not cover.
    ReleaseUncovered,
    /// Trust a self-fence that no armed watchdog backs.
    TrustWithoutWatchdog,
    /// The firmware-bridge acts on a request whose fencing token is below the highest it has
    /// seen for the target (a deposed leader's late command reaches the devices).
    IgnoreStaleTokens,
    /// Ignore the healthy-majority bound: judge a peer-checked node's self-fence as if it ran
    /// no peer check (its peers may still be excusing it).
    IgnoreMajorityBound,
    /// The agents count half the members (rounded down) as a majority.
    LooseMajority,
    /// The controller times a stock node's healthy streak on the kubelet's renewals, as
    /// before the companion's peer check (its companion, whose requests do not get through,
    /// vouches while the controller counts its node healthy).
    KubeletRenewalKeepsCompanionHealthy,
    /// Record a released pod only after its deletion (no write-ahead record): a controller
    /// that dies in between leaves a deleted pod the status does not name.
    RecordAfterDelete,
    /// The old release order (before stop 45): the out-of-service taint goes on with the
    /// NoSchedule taint, before the power re-read and before Palisade released and recorded
    /// the node's pods. Kubernetes' pod GC then deletes pods no NodeFence records (the CI
    /// failure of `in_cluster.rs`), and may do so after the machine came back on.
    OutOfServiceFirst,
    /// Measure the self-fence wait on the wall clock only (a step of the controller's wall
    /// clock shortens it).
    WallClockOnly,
    /// Power a host that must not power off off anyway (ignore the level's reset).
    PowerOffInsteadOfReset,
    /// Accept the runtime inventory as the clean proof after a reset fence (unblock the
    /// storage without a new boot).
    UnblockWithoutNewBoot,
    /// The old rule of seed 3348633: accept a runtime inventory as the clean proof whether or
    /// not it answers the fence's recovery challenge (an inventory taken before the release
    /// counts). Rare by nature (see [`Bug::RECORDED`]).
    IgnoreChallenge,
    /// The old rule found at seed 3210097 (recorded at seed 4000404 since the simulated
    /// controller remembers its quorum guard's holds): a boot ID that differs from the one
    /// recorded at the fence is the clean proof on its own, whenever that boot began.
    BootIdAlone,
    /// The old rule of seeds 3537759 and 3978628: judge the healthy majority's streaks on the
    /// controller's wall clock (a step back revives streaks that ended).
    WallClockStreaks,
    /// The old rule of seed 4107866: forget the controller's blind spells (the API down, the
    /// controller paused): silence counts through them, and a write first observed after one
    /// extends a streak if the (stepped) wall clock says it is recent.
    IgnoreBlindSpell,
    /// Lift every block of the node on unfence (a node-wide unblock) instead of only the
    /// fence's own hold: a deposed leader's late unblock lifts a newer fence's block.
    NodeWideUnblock,
    /// The agent counts a Lease write whose request timed out as made: its self-fence clock
    /// restarts although the write may land late or never.
    CountUnackedRenewal,
    /// The old rule for Node list changes: the agent counts its latest Node list and the
    /// controller today's, whatever the node advertised (two majorities of different lists
    /// need not intersect).
    LatestListOnly,
    /// The old recovery order: lift the storage block before removing the release taints (a
    /// lagging pod-GC or attach-detach cache can still act on the out-of-service taint).
    UnfenceBeforeUntaint,
    /// The old coverage rule (issue 32, item 6): a storage block covers every pod that mounts
    /// a claim, also one whose claim is on storage the block does not cut.
    IgnoreStorageScope,
    /// Power evidence without a missed renewal: the simulated controller hands `decide()` the
    /// node's whole off run as if every read had been sent after its last observed renewal,
    /// and a zero renewal interval, so a BMC whose reads lie fences a live node on its own
    /// (caught by the causeless-fence check: the fence powers the machine off cleanly).
    PowerWithoutMissedRenewal,
    /// The agent's vouch clock counts from its last successful renewal instead of its last
    /// Lease write attempt, so an agent whose writes time out but still land vouches for a
    /// peer while the controller sees it renew and bounds its trust on that (seed
    /// 10,729,556, found by a recorded 800,000-schedule campaign, when the simulated agent
    /// had this rule and the product did not: `WriteClock` stamps every attempt; recorded at
    /// seed 11,094,389 since late renewals count against the quorum guard).
    VouchSinceLastRenewal,
    /// The old agent (issue 32 item 4): it reads no hypervisor, and a virtual machine
    /// advertises itself as bare metal, so a self-fence is trusted on a machine its hypervisor
    /// can pause (and resume beside its pods' replacements).
    VirtualAsBareMetal,
    /// The old pin (issue 32 item 7): a fence records the Node's name and UID but not its
    /// `systemUUID`, so another machine that takes over the name answers the recovery
    /// challenge, and the block of the original machine is lifted.
    PinWithoutMachine,
    /// The old direct BMC (issue 32 item 8): commands and reads go to whatever BMC the
    /// FenceTarget's address reaches, unpinned, and a miswired address powers off another
    /// machine.
    IgnoreBmcIdentity,
    /// Bound a peer-checked node's self-fence without its watchdog's timeout (the term of
    /// `peer_checked_trust` that issue 31 found no schedule needed, before nodes whose kills
    /// hang): trust comes when the node's excuse ended, although its containers may live on
    /// until its watchdog resets it.
    PeerTrustWithoutWatchdog,
    /// Wait for a self-fence only for its timeout and the margin, not its watchdog's timeout
    /// (`Advertisement::trust` without that term): the node's agent kills its containers on
    /// time, but a kill that hangs leaves them running until the watchdog resets the machine.
    TrustBeforeWatchdog,
    /// The old agent start: it opens (so arms and pets) its watchdog at every start, also
    /// after a stale renewal record, so an agent restarted after its self-fence began moves
    /// the watchdog's reset later than the controller counts.
    ArmWhileStale,
    /// The old trust rule: the controller counts the watchdog's timeout once, although the
    /// death of an agent that held the device (a crash, a kill while hung) pets it once more
    /// (the kernel's unexpected close).
    OneWatchdogPeriod,
    /// A standby that records no quorum-guard holds (only the leader does): after it takes
    /// over, a node silent through a hold is judged as if no guard had ever held.
    StandbyForgetsGuard,
    /// A standby that takes over forgets it was blind (its watches failed with the leader's,
    /// or it stood still): after an API outage longer than the leader's Lease it takes the
    /// Lease over and judges every node silent through the outage.
    StandbyIgnoresBlindSpell,
    /// The clean proof checks only the first released pod against the node's inventory
    /// (issue 31's one-line change to `clean_proof`): a node that returns still running
    /// another released pod is proven clean.
    FirstReleasedPodOnly,
    /// The old creation rule: fence on the silence the watch shows, without reading the
    /// node's heartbeat from the API first, so a renewal the watch has not delivered yet does
    /// not stop the fence.
    FenceOnWatchedSilence,
    /// Two unfinished fences of one node both act (no fence is superseded by its older
    /// sibling): one recovers the machine while the other still releases on a fence that no
    /// longer holds.
    IgnoreSibling,
    /// No finalizer on a NodeFence: a person's deletion removes it at once whatever it holds
    /// on its node, and its worker stops: its record of the pods it released goes while the
    /// node is still fenced, and its block and taints stay with no fence to lift them (caught
    /// at seed 255 by [`Invariant::ReleaseRecorded`]).
    DeleteWithoutFinalizer,
    /// The pin of a direct BMC re-learnt when a person edits its address: the controller takes
    /// the identity the new address answers as the node's machine (trusting the edit) instead
    /// of comparing it with the Node's `systemUUID`, so a mistyped address that reaches another
    /// machine's BMC is read and commanded as the node's (caught at seed 21 by
    /// [`Invariant::Promise`]: the other machine powered off as the node's proof).
    RepinOnAddressEdit,
}

impl Bug {
    /// Every planted bug.
    pub const ALL: [Bug; 24] = [
        Bug::TrustCommand,
        Bug::ReleaseUnverified,
        Bug::ReleaseUncovered,
        Bug::TrustWithoutWatchdog,
        Bug::IgnoreStaleTokens,
        Bug::IgnoreMajorityBound,
        Bug::LooseMajority,
        Bug::RecordAfterDelete,
        Bug::OutOfServiceFirst,
        Bug::PowerOffInsteadOfReset,
        Bug::UnblockWithoutNewBoot,
        Bug::CountUnackedRenewal,
        Bug::LatestListOnly,
        Bug::UnfenceBeforeUntaint,
        Bug::IgnoreStorageScope,
        Bug::VirtualAsBareMetal,
        Bug::PinWithoutMachine,
        Bug::IgnoreBmcIdentity,
        Bug::TrustBeforeWatchdog,
        Bug::OneWatchdogPeriod,
        Bug::FenceOnWatchedSilence,
        Bug::KubeletRenewalKeepsCompanionHealthy,
        Bug::DeleteWithoutFinalizer,
        Bug::RepinOnAddressEdit,
    ];

    /// Parses a bug's name (as printed by `{:?}`).
    pub fn parse(s: &str) -> Option<Bug> {
        Bug::ALL
            .into_iter()
            .chain(Bug::RECORDED.map(|(b, _)| b))
            .chain(Bug::COVERED)
            .chain(Bug::AIMED)
            .chain(Bug::SEARCHED)
            .find(|b| format!("{b:?}") == s)
    }

    /// Planted bugs that random schedules rarely meet, each proven on a schedule made for it
    /// ([`Bug::aimed_schedule`]). `ArmWhileStale` needs an agent that dies more than a second
    /// after its last pet and a restart more than a watchdog timeout after that pet, on a
    /// node whose kills hang: none in 150,000 schedules from seed 10,001 (the two-timeout wait
    /// covers a restart within one timeout of the pet). `FirstReleasedPodOnly` needs a node
    /// fenced by its storage alone whose kills hang for one released pod and not another, and
    /// a released pod a finalizer keeps bound to the node when it returns (else the proof's
    /// other term, only pods the API binds, refuses it too).
    ///
    /// `IgnoreBlindSpell` was recorded at seed 4,107,866 until leaders' terms lapsed in long
    /// API outages (2026-11-30): that seed's leader then loses its Lease to the standby at
    /// 59.75 s and the history parts. A search with the bug planted then found seed 66,782,
    /// which the read of a node's heartbeat before its fence (the same day) made clean again.
    /// The faults of seed 4,107,866 still break at-most-one with it, and not without it, under
    /// the world's draws (watch lag, takeover races) of seed 1: that is its schedule.
    pub const AIMED: [Bug; 3] = [
        Bug::ArmWhileStale,
        Bug::FirstReleasedPodOnly,
        Bug::IgnoreBlindSpell,
    ];

    /// Planted bugs of a new model that no schedule is known to break yet: the model cannot
    /// be said to see their rule until one does. `StandbyForgetsGuard` (warm standbys,
    /// 2026-11-30): 30,000 schedules from seed 1 with it planted, 0 violations; a guard hold
    /// must meet a takeover, then a node silent through the hold must be one whose fence
    /// harms (a live writer). `StandbyIgnoresBlindSpell` (leaders' terms that lapse in long API
    /// outages, 2026-11-30): 30,000 schedules from seed 1, 8,312 lapsed terms and about 4,000
    /// Lease takeovers after an outage, 0 violations: after an outage every node is silent at
    /// once and the quorum guard holds, so a blind standby's judgement is not acted on. Kept
    /// plantable (`--bug`) for the search. `IgnoreSibling` (second fences of a node, a
    /// person's and a racing replica's, 2026-12-02): 20,000 schedules from seed 1 with it
    /// planted, 3,090 second fences, 0 violations. The decision itself withholds any
    /// verdict from a `Pending` fence while a sibling is in flight or settled
    /// ([`palisade_decide::snapshot::FenceState::of`]: the most advanced wins), so two fences
    /// act only when both were `Pending` in one round; they then run one plan under one token,
    /// and every step they repeat (a verified level, a recorded release) is idempotent. The
    /// rule stays: the start gate reads siblings from the API, so two replicas with lagging
    /// caches still start one fence.
    pub const SEARCHED: [Bug; 3] = [
        Bug::StandbyForgetsGuard,
        Bug::StandbyIgnoresBlindSpell,
        Bug::IgnoreSibling,
    ];

    /// The schedule made for a bug of [`Bug::AIMED`] (`None` for the others).
    ///
    /// `ArmWhileStale`: three nodes with no fence device under a policy that trusts
    /// self-fences; m0 (self-fence after 5 s, a 20 s `nowayout` watchdog, kills that hang)
    /// is cut from the control plane at 10 s, self-fences about 15 s, its agent crashes at
    /// 23 s (the kernel's close pets the watchdog: reset due at 43 s) and is restarted at 38 s
    /// with its renewal record stale. The controller trusts the self-fence about 56 s (5 s +
    /// 2 × 20 s + 1 s after the last renewal). An agent that opens the watchdog at that start
    /// pets it again, and m0's pod writes beside its replacement until 58 s.
    ///
    /// `FirstReleasedPodOnly`: m0 runs all five identities (m1 and m2 join at 1 s), is fenced
    /// by its storage firewall alone, and the draws of its seed (24) make the kill of
    /// `db` work and that of `ledger` hang, and keep `ledger`'s released pod in the API (its
    /// finalizer) until 56 s. m0 is cut off at 10 s and fenced at 14 s (`db` and `ledger`
    /// released), and heals at 40 s still running `ledger`: a proof that reads only `db`
    /// lifts the block at 52 s, and `ledger`'s replacement starts beside it at 56 s.
    ///
    /// `IgnoreBlindSpell`: the faults of seed 4,107,866, under the world's draws of seed 1.
    pub fn aimed_schedule(self) -> Option<Schedule> {
        let node = |watchdog: Option<u64>, kill_hangs: bool| crate::faults::NodeConfig {
            watchdog,
            kill_hangs,
            ..crate::faults::NodeConfig::plain(Fencing::None)
        };
        match self {
            Bug::ArmWhileStale => Some(Schedule {
                trust_self_fence: true,
                ..hand_made(
                    1,
                    vec![node(Some(20), true), node(None, false), node(None, false)],
                    vec![
                        (10_000, Fault::CutApi(0)),
                        (23_000, Fault::CrashAgent(0)),
                        (38_000, Fault::RestartAgent(0)),
                    ],
                )
            }),
            Bug::IgnoreBlindSpell => Some(Schedule {
                seed: 1,
                ..Schedule::generate_before_stock(4_107_866)
            }),
            Bug::FirstReleasedPodOnly => {
                let partly_hung = crate::faults::NodeConfig {
                    some_kills_hang: true,
                    ..crate::faults::NodeConfig::plain(Fencing::Storage)
                };
                let joins = crate::faults::NodeConfig {
                    joins_late: true,
                    ..crate::faults::NodeConfig::plain(Fencing::Storage)
                };
                Some(hand_made(
                    FIRST_POD_SEED,
                    vec![partly_hung, joins.clone(), joins],
                    vec![
                        (1_000, Fault::Join(1)),
                        (1_000, Fault::Join(2)),
                        (10_000, Fault::CutAll(0)),
                        (40_000, Fault::Heal(0)),
                    ],
                ))
            }
            _ => None,
        }
    }

    /// Old rules that a later rule also blocks: no schedule is known on which the old rule
    /// alone breaks at-most-one any more. Kept plantable (`--bug`) for searches.
    ///
    /// - `BootIdAlone` (recorded at seed 4000404 until then): since recovery lifts a storage
    ///   block only after the untaint has settled (issue 39, a 10 s margin), the false clean
    ///   proof comes too late to matter; about 700,000 schedules with the bug planted (from
    ///   seed 4000405) found no other. The rule stays fixed (only an inventory answering the
    ///   recovery challenge is a clean proof) and seed 4000404 stays in the clean list.
    /// - `IgnoreChallenge` (recorded at seed 3348633 until then): the same margin lets the node
    ///   renew with an inventory that answers the challenge before the block is lifted, at that
    ///   schedule; no new seed is known yet. The rule stays fixed and 3348633 stays clean.
    /// - `WallClockStreaks` (recorded at seed 3537759 until then): since the self-fence waits
    ///   count two watchdog timeouts (2026-11-30), the streaks the stepped-back clock revives
    ///   at that schedule end before the longer bound, and 500,000 schedules with the bug
    ///   planted from seed 3537760 found no other. The rule stays
    ///   fixed (streaks live on the monotonic clock, proven by `majority.rs`'s tests) and
    ///   3537759 stays in the clean list.
    /// - `PowerWithoutMissedRenewal` (caught by random campaigns until then): since the
    ///   controller reads the node's heartbeat from the API before it creates a fence
    ///   (2026-11-30), a BMC whose reads lie fences no node that renews on time even without
    ///   the missed-renewal rule: the power evidence outlasts the last observed renewal only
    ///   when a newer one has landed that the watch has not delivered, and the read finds it.
    ///   10,000 schedules from seed 1 with it planted, none broken; test
    ///   `a_bmc_that_reads_a_live_machine_off_fences_nothing_even_with_the_planted_bug`. The
    ///   rule stays: it is what keeps a node whose renewals land late from being fenced on a
    ///   lying BMC.
    pub const COVERED: [Bug; 4] = [
        Bug::BootIdAlone,
        Bug::IgnoreChallenge,
        Bug::WallClockStreaks,
        Bug::PowerWithoutMissedRenewal,
    ];

    /// Planted bugs too rare for a short random campaign to meet (the simulator found each
    /// after millions of schedules, or tens of thousands), each with a schedule seed that breaks
    /// at-most-one with it (and must not without it), drawn as before stock nodes
    /// ([`Schedule::generate_before_stock`]: two of them became stock schedules, whose added
    /// faults change what happens). `NodeWideUnblock` was met once in the first 10,000 schedules from seed 1 (at
    /// seed 6860) until the power faults changed that schedule; the next is seed 43369 (no
    /// power fault: an aimed leader freeze).
    ///
    /// `VouchSinceLastRenewal` was recorded at seed 10729556 until late renewals counted
    /// against the quorum guard (issue 32 item 2): that schedule slows two nodes' writes, and
    /// the guard now holds the fence until the late one renews on time, past the moment the
    /// wrong vouch mattered. 364,833 schedules with the bug planted from seed 10729557 found
    /// the next, 11094389 (one node's writes land late, another is cut off: shrunk to those
    /// two faults, one node late is within what the guard allows); 10729556 joined the clean
    /// list.
    ///
    /// `PeerTrustWithoutWatchdog` (the watchdog term of `peer_checked_trust`, which issue 31
    /// found no schedule needed) needs a peer-checked node whose kills hang, excused until
    /// its peers' majority returns, with a watchdog longer than the bound's skews and margin:
    /// found after 102,517 schedules from seed 10,001, at seed 112,517.
    ///
    /// `WallClockOnly` was caught at seed 8934 until the trust wait counted two watchdog
    /// timeouts (2026-11-30): a step of the controller's wall clock must now outrun a longer
    /// wait. Found again after 9,987 schedules from seed 10,001, at seed 19,987.
    pub const RECORDED: [(Bug, u64); 4] = [
        (Bug::NodeWideUnblock, 43_369),
        (Bug::VouchSinceLastRenewal, 11_094_389),
        (Bug::PeerTrustWithoutWatchdog, 112_517),
        (Bug::WallClockOnly, 19_987),
    ];
}

/// A peer request answered late: the peer judges it when it arrives (`judged_at`), and its
/// answer reaches the asking agent later still (`arrives`).
#[derive(Debug, Clone)]
struct InFlight {
    peer: usize,
    sent: u64,
    judged_at: u64,
    arrives: u64,
    /// The peer's answer once judged (`None` inside: the request failed).
    answer: Option<Option<bool>>,
}

/// The invariants the world's checker asserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invariant {
    /// At most one copy of each identity can do harm.
    AtMostOne,
    /// Every pod a release deleted is named in a NodeFence status.
    ReleaseRecorded,
    /// A promise of the devices and recovery is kept: no power command to a host that must not
    /// power off, nor an unblock of its storage in the boot it had when fencing began; no
    /// command acted on below a bridge's token floor; no unblock before the untaint settled.
    Promise,
    /// Every NodeFence the controller creates has a cause: its machine was not able to renew
    /// for the whole [`CAUSELESS_WINDOW_MS`] before.
    CauselessFence,
}

/// An invariant broken.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Simulated time (milliseconds).
    pub at_ms: u64,
    /// Which invariant.
    pub invariant: Invariant,
    /// What broke.
    pub what: String,
    /// The last events of the history before it broke.
    pub history: Vec<String>,
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// NodeFences created.
    pub fences: u64,
    /// NodeFences created on power evidence (before the node's silence alone would have).
    pub power_fences: u64,
    /// Pods released.
    pub released: u64,
    /// Pods held as not covered.
    pub held: u64,
    /// Times a stale agent was excused by its peers (kept its pods and its watchdog petted).
    pub excused: u64,
    /// Warm resets a fence of a host that must not power off sent (and the BMC carried out).
    pub resets: u64,
    /// NodeFences created beside the leader's decision ([`Fault::Request`]).
    pub requests: u64,
    /// NodeFences superseded by an older sibling.
    pub superseded: u64,
    /// Stock nodes' companions cut off while their kubelets renew ([`Fault::CompanionCut`]).
    pub companion_cuts: u64,
    /// NodeFences a person deleted ([`Fault::DeleteFence`]).
    pub deletions: u64,
    /// Of those, deletions the finalizer held while the fence still held its node (it went
    /// on, and went once its recovery had lifted what it held).
    pub deletions_held: u64,
    /// Fences the decision created for a node whose `Pending` fence a person had deleted.
    pub refenced: u64,
    /// Edits of a FenceTarget's BMC address a person made ([`Fault::EditTargetAddress`]).
    pub edits: u64,
    /// Of those, edits to another machine's BMC (a typo).
    pub edits_elsewhere: u64,
    /// Levels verified by a power off through an address a person wrote.
    pub edited_verified: u64,
    /// Fence steps (commands, re-reads) through an address a person wrote that the identity
    /// check refused: it reached another machine's BMC.
    pub edited_refused: u64,
    /// Fence steps whose planned BMC is no longer listed in the FenceTarget: the BMC it lists
    /// now stood in for it (`FenceTargetSpec::acting_for`), pinned to the Node's machine.
    pub stood_in: u64,
    /// Device commands a deposed leader delivered after it resumed from a freeze.
    pub stale_commands: u64,
    /// Lease writes that landed after their agent had given up on them.
    pub late_writes: u64,
    /// Takeovers by a standby with its memory (warm).
    pub warm_takeovers: u64,
    /// Leader terms that lapsed in an API outage longer than the leader's Lease.
    pub lapsed_terms: u64,
    /// The whole history of the run.
    pub history: Vec<String>,
}

const TICK_MS: u64 = 250;
/// The StorageClass of the claims on the world's storage array, and what its fence names.
const ARRAY_CLASS: &str = "array";
/// The StorageClass of claims on other storage (an NFS share the array's fence does not cut).
const ELSEWHERE_CLASS: &str = "nfs-elsewhere";

/// What backs an identity's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// No claim.
    None,
    /// A claim on the storage array (what its storage fence blocks).
    Array,
    /// A claim on other storage, which no fence of the world blocks.
    Elsewhere,
}
/// The longest gap between two controller ticks that is not a blind spell (as the operator's
/// three election rounds; an API outage is one whatever its length, as its watches fail).
const BLIND_GAP_MS: u64 = 3_000;
/// The leader's Lease duration: a standby takes over a leader frozen this long.
const LEADER_LEASE_MS: u64 = 15_000;
/// The agents' renew interval at time scale 1 ([`Schedule::scale`] stretches it, and the poll
/// interval and request timeout below, with the policy's thresholds).
const RENEW_MS: u64 = 1_000;
const SETTLE: Duration = Duration::from_secs(2);
/// The longest watch lag simulated. The controller's settle time (2 s) must exceed it: a
/// renewal written before the fence and delivered late must not count as the node's return.
const MAX_WATCH_LAG_MS: u64 = 1_500;
/// How often an agent that cannot renew asks its peers.
const POLL_MS: u64 = 1_000;
/// The agent's peer request timeout (0.8 of the poll interval, as `palisade-node` sets it).
const REQUEST_TIMEOUT_MS: u64 = 800;
/// How long a machine must have been able to renew (powered, its agent running, reaching an
/// API that is up and answers its writes) before the controller creates its NodeFence for
/// that fence to have no cause ([`Invariant::CauselessFence`]): one renew interval plus a
/// tick.
///
/// Within the first renew interval of the window the agent writes its Lease (it tries once
/// per interval, and every try lands at once), a tick before the fence's creation at the
/// latest. The controller creates a NodeFence only when the API still holds the heartbeat
/// its detector judged silent (the operator's `detect::create_fence` reads it from the API,
/// since 2026-11-30; before, this window had to add the longest watch lag): so its detector
/// had observed that write, and a node it observed renewing so recently is not silent for the
/// policy's 4 s. And every read of its BMC sent after that renewal reached the BMC while the
/// machine was powered: only a BMC that lies can read it off, and the power rule then still
/// demands a renewal the node missed, which a node that renews on time never does. At
/// production timing the renew interval is 5 s and the window 5.25 s, short of the 20 s
/// threshold in the same way. `FenceOnWatchedSilence` (the old creation rule, planted back)
/// fences nodes inside this window.
pub const CAUSELESS_WINDOW_MS: u64 = causeless_window_ms(1);

/// [`CAUSELESS_WINDOW_MS`] at time scale `scale` ([`Schedule::scale`]).
pub const fn causeless_window_ms(scale: u64) -> u64 {
    RENEW_MS * scale + TICK_MS
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agent {
    Running,
    Hung,
    Crashed,
}

#[derive(Debug, Clone)]
struct Machine {
    name: String,
    powered: bool,
    boot: u64,
    agent: Agent,
    cut_api: bool,
    cut_all: bool,
    /// A stock node's companion cannot get its requests through ([`Fault::CompanionCut`]).
    companion_cut: bool,
    /// When a stock node's kubelet last renewed its Lease.
    kubelet_last: Option<u64>,
    /// The storage firewall's holds on the node, one per fence that blocked it (the fence's
    /// name): the node is blocked while any is held, and a fence's unblock lifts only its own.
    storage_holds: BTreeSet<String>,
    /// When the last renewal the agent saw succeed was sent (its self-fence clock).
    last_renew_sent: Option<u64>,
    /// When the agent last tried to renew (it tries once per renew interval).
    last_attempt: Option<u64>,
    /// Whether the node's Lease writes time out, and whether they land late
    /// ([`Fault::SlowWrites`]).
    slow_writes: Option<bool>,
    /// Whether the machine is in the cluster (its Node exists).
    member: bool,
    /// The Node list its agent saw last (refreshed whenever it reaches the API).
    known: Vec<usize>,
    /// The list its last successful renewal advertised, and the lists of the renewal attempts
    /// after it (which may still land): a strict majority of each must excuse it.
    counted: Option<Vec<usize>>,
    offered: Vec<Vec<usize>>,
    /// The watchdog runs (opened since the machine booted, not disarmed): it resets the
    /// machine its timeout after the last pet.
    watchdog_armed: bool,
    /// The running agent holds the watchdog device open: it opened it (which arms it, and
    /// pets it) at a start whose renewal record was fresh, or at its first pet after a stale
    /// one. When that agent dies, the kernel's unexpected close pets the watchdog once more.
    watchdog_held: bool,
    last_pet: u64,
    containers: BTreeSet<String>,
    /// The containers whose kills hang ([`crate::faults::NodeConfig::some_kills_hang`]).
    unkillable: BTreeSet<String>,
    power_mode: DeviceMode,
    storage_mode: DeviceMode,
    /// When power returns after a [`Fault::PowerCycle`].
    power_back_at: Option<u64>,
    /// Since when the machine has been able to renew without a break (ground truth, for
    /// [`Invariant::CauselessFence`]).
    able_since: Option<u64>,
    /// The last Lease write attempt sent (the agent's write clock; starts at its start, and
    /// is stamped by every attempt, landed or not).
    last_write: u64,
    /// The self-fence latch: once active, lifted only by a successful renewal.
    fence_active: bool,
    /// Per peer: the send time of the request its standing vouch answered.
    vouches: BTreeMap<usize, u64>,
    /// Peer requests whose answers are late.
    in_flight: Vec<InFlight>,
    /// The excuse published by the last poll round (`until`, exclusive).
    excused_until: Option<u64>,
    next_poll: u64,
    /// Whether the agent is stale and excused (for counting and the history).
    excusing: bool,
    /// The node-network side the machine is on (0 unless the node network is split).
    net_side: bool,
    /// How far the node's wall clock has stepped (beyond its bounded skew), in ms: its
    /// `renewTime` stamps carry it; its monotonic clocks do not.
    clock_step_ms: i64,
    /// The recovery challenge the agent read from its Node when it last reached the API
    /// (a fresh agent has read none).
    challenge_read: Option<String>,
    /// Paused by its hypervisor (since, until) ([`Fault::Pause`]): nothing on it runs, its
    /// watchdog and its clocks stand still.
    paused: Option<(u64, u64)>,
    /// Another machine took over its name ([`Fault::Impostor`]): it never reaches the API
    /// again.
    displaced: bool,
}

impl Machine {
    /// The agent pets its watchdog (`has_watchdog`: the node has one), opening it first if
    /// it does not hold it yet (opening arms it).
    fn pet(&mut self, has_watchdog: bool, now: u64) {
        self.last_pet = now;
        if has_watchdog && !self.watchdog_held {
            self.watchdog_held = true;
            self.watchdog_armed = true;
        }
    }

    /// The agent's process dies (a crash, or killed while hung): the kernel closes the
    /// watchdog device it held, and an unexpected close (no magic close, or `nowayout`) pets a
    /// running watchdog once more (`watchdog_release` in the kernel).
    fn agent_dies(&mut self, now: u64) {
        if self.watchdog_held && self.watchdog_armed {
            self.last_pet = now;
        }
        self.watchdog_held = false;
    }

    /// The machine boots: no watchdog runs until an agent opens it.
    /// Its agent kills every container not in `keep`; those whose kills hang live on (every
    /// one with `all_hang`).
    fn kill_except(&mut self, keep: &BTreeSet<String>, all_hang: bool) {
        if !all_hang {
            let unkillable = &self.unkillable;
            self.containers
                .retain(|c| keep.contains(c) || unkillable.contains(c));
        }
    }

    fn boots(&mut self) {
        self.watchdog_armed = false;
        self.watchdog_held = false;
    }

    /// The machine resumes from a pause of `ms`: its monotonic clocks did not move meanwhile,
    /// so every instant its agent and its watchdog measure from moves forward by the pause
    /// (the agent resumes as if no time had passed), and its peer requests are gone.
    fn resume(&mut self, ms: u64) {
        self.paused = None;
        for t in [
            &mut self.last_write,
            &mut self.last_pet,
            &mut self.next_poll,
        ] {
            *t += ms;
        }
        for t in [
            &mut self.last_renew_sent,
            &mut self.last_attempt,
            &mut self.excused_until,
        ]
        .into_iter()
        .flatten()
        {
            *t += ms;
        }
        for sent in self.vouches.values_mut() {
            *sent += ms;
        }
        self.in_flight.clear();
    }

    /// The agent's peer state starts over at `now`: it just wrote (or started), pets, holds no
    /// answers, no excuse and no fence.
    fn fresh_start(&mut self, now: u64) {
        self.last_write = now;
        self.fence_active = false;
        self.vouches.clear();
        self.in_flight.clear();
        self.excused_until = None;
        self.excusing = false;
    }
}

#[derive(Debug, Clone)]
struct Pod {
    uid: String,
    identity: usize,
    node: usize,
    deleted: bool,
    /// A deleted pod whose object a finalizer keeps in the API (terminating, still bound to
    /// its node) until this instant (true time, ms).
    object_until: Option<u64>,
}

impl Pod {
    /// Whether its object is in the API at `now` (not deleted, or held by a finalizer).
    fn in_api(&self, now: u64) -> bool {
        !self.deleted || self.object_until.is_some_and(|t| now < t)
    }
}

/// An out-of-service taint on a Node, and Kubernetes acting on it (1.26+): taint eviction
/// marks the node's pods terminating at once, and the pod GC force-deletes them on its next
/// pass, every [`POD_GC_PERIOD_MS`]. The simulated pod GC does not wait for the Node to be
/// `NotReady`, as the real one does: it acts on more Nodes than the real one, never fewer.
#[derive(Debug, Clone, Copy)]
struct OutOfService {
    /// The fence that added it, as the Node's record says (`None`: another actor's).
    owner: Option<usize>,
    /// The pod GC's next pass (true time, ms).
    gc_at: u64,
}

/// How often Kubernetes' pod GC runs (`kube-controller-manager`'s default, 20 s).
const POD_GC_PERIOD_MS: u64 = 20_000;

#[derive(Debug, Clone)]
struct Fence {
    name: String,
    node: usize,
    spec: NodeFenceSpec,
    status: NodeFenceStatus,
    /// Its `creationTimestamp`: the API server's true time, to the second.
    created: Timestamp,
    /// A person's deletion of it ([`Fault::DeleteFence`]).
    deletion: Deletion,
}

/// Where a `NodeFence` is in its deletion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deletion {
    /// Not asked.
    None,
    /// Asked (its `deletionTimestamp` is set) while it held something on its node: the
    /// operator's finalizer keeps it, and it goes on, until it holds nothing.
    Waiting,
    /// Gone from the API. `holding`: it still held something on its node when it went (only
    /// under [`Bug::DeleteWithoutFinalizer`]), so its record of what it released was lost
    /// while it still mattered.
    Gone {
        /// It still held its node.
        holding: bool,
    },
}

impl Fence {
    /// Whether the API still lists it.
    fn listed(&self) -> bool {
        !matches!(self.deletion, Deletion::Gone { .. })
    }

    /// Whether it is listed and unfinished.
    fn open(&self) -> bool {
        self.listed() && !self.status.phase.is_terminal()
    }

    /// The fence as the sibling rule sees it.
    fn sibling(&self) -> palisade_decide::guard::Sibling<'_> {
        palisade_decide::guard::Sibling {
            name: &self.name,
            node: &self.spec.node_name,
            phase: self.status.phase,
            created: Some(self.created),
        }
    }
}

struct Controller {
    up: bool,
    token: i64,
    /// Its sight and decision memory (the operator's own `palisade_decide::memory`; quorum
    /// guard holds under the policy name `sim`, and, as the operator's sight counts it, at the
    /// end of the controller's latest blind spell).
    sight: Sight,
    /// Per fence: since when this controller has watched its node carry neither the fence's
    /// release taint nor another's out-of-service taint (as `reconcile::untainted_for`).
    untainted_since: HashMap<usize, Mono>,
    /// Its power watch (read only while it leads).
    power: Watch,
}

/// What a controller replica sees of the API and remembers of it.
#[derive(Default)]
struct Sight {
    /// Its decision memory.
    memory: Memory,
    /// When it last ticked (simulated ms): a longer gap than [`BLIND_GAP_MS`] is a blind
    /// spell.
    last_tick: Option<u64>,
    /// The API went down since its last tick (its watches failed): a blind spell.
    lost_api: bool,
}

/// A leader frozen between its last leadership check and a device command.
struct Frozen {
    /// When it resumes.
    until: u64,
    /// When its Lease runs out and a standby takes over.
    takeover_at: u64,
    /// Its token.
    token: i64,
    /// The command it had checked its leadership for: (fence, step).
    pending: (usize, Step),
    /// Whether a standby took over.
    deposed: bool,
    /// The node's FenceTarget BMC address when it froze (what its command was resolved
    /// against).
    listed: String,
}

/// The heartbeat of a Lease renewed `count` times (the simulation's `renewTime`) that
/// carries `ad` (a stock node's companion stamp counts too, as in `convert::heartbeat`).
fn lease_heartbeat(count: u64, ad: &Advertisement) -> Heartbeat {
    Heartbeat {
        lease_renew_time: Some(count.to_string()),
        ready_heartbeat: None,
        companion_written: ad.companion_written.map(|t| t.to_string()),
    }
}

/// A schedule made by hand: `nodes` and `events` over 90 s at the lab's timing, under a policy
/// that neither trusts self-fences nor powers nodes on nor counts power evidence.
fn hand_made(
    seed: u64,
    nodes: Vec<crate::faults::NodeConfig>,
    events: Vec<(u64, Fault)>,
) -> Schedule {
    Schedule {
        seed,
        nodes,
        trust_self_fence: false,
        power_on: false,
        power_off_after: 0,
        events,
        length_ms: 90_000,
        scale: 1,
    }
}

/// The seed of the schedule made for [`Bug::FirstReleasedPodOnly`]: its draws make the
/// first released pod's kill work and the second's hang.
const FIRST_POD_SEED: u64 = 24;

/// The name of the simulation's one policy.
const SIM_POLICY: &str = "sim";

/// The world of one run.
pub struct World<'s> {
    s: &'s Schedule,
    bug: Option<Bug>,
    rng: Rng,
    now: u64,
    machines: Vec<Machine>,
    leases: Vec<(u64, Advertisement)>,
    /// Every Lease write (time, renewal count, renewTime stamp in ms, advertisement), for
    /// watch lag: the controller sees each Lease as it was up to [`MAX_WATCH_LAG_MS`] ago.
    lease_log: Vec<Vec<(u64, u64, i64, Advertisement)>>,
    /// Draws the jitter of the node clocks' stamps (apart from `rng`, so the rest of a
    /// history does not depend on it).
    skew_rng: Rng,
    /// Draws the controller crashes in the middle of a release (apart from `rng`, as above).
    crash_rng: Rng,
    /// Draws the fate of each peer request (answered at once, late, or lost), apart from
    /// `rng` as above.
    net_rng: Rng,
    /// Pods a release deleted, for the check that the status names every one of them.
    released_uids: BTreeSet<String>,
    /// A promise broken by a device command: to a host that must not power off (a power off
    /// or on, or a storage unblock without a new boot since fencing began), or the bridge's
    /// (a command acted on with a token below the target's floor).
    broken_promise: Option<String>,
    /// Per machine, the highest fencing token its firmware-bridge has seen (machines with an
    /// even index are fenced through a bridge; odd ones' devices are reached directly and
    /// obey any command, tokens or not).
    floors: Vec<i64>,
    pods: Vec<Pod>,
    identities: Vec<(String, Backing)>,
    fences: Vec<Fence>,
    /// Per Node: whether it carries the NoSchedule release taint (`palisade.dev/fenced`).
    tainted: Vec<bool>,
    /// Per Node: the fence that added its NoSchedule release taint, as the Node's record of it
    /// says (`None`: not tainted, or tainted before any fence, by another actor).
    taint_owner: Vec<Option<usize>>,
    /// Per Node: the out-of-service taint, if it carries one, and what Kubernetes does
    /// because of it.
    out_of_service: Vec<Option<OutOfService>>,
    /// Draws when Kubernetes' pod GC acts on an out-of-service taint (a stream of its own, so
    /// that the other draws of a schedule do not depend on it).
    podgc_rng: Rng,
    /// Per Node: when its release taints were last removed (true time, ms).
    untainted_at: Vec<Option<u64>>,
    /// Per Node: its recovery challenge annotation (the name of the fence that wrote it).
    node_challenge: Vec<Option<String>>,
    api_up: bool,
    /// Since when the API server has been down (true time, ms).
    api_down_at: Option<u64>,
    /// How far the controller's wall clock is from true time (clock steps), in ms.
    ctl_wall_offset_ms: i64,
    ctl: Controller,
    /// An armed freeze: the leader freezes for this long at its next device command.
    freeze_trap: Option<u64>,
    /// The frozen leader, if any (the running one is `ctl`, once a standby took over).
    frozen: Option<Frozen>,
    /// Lease writes the agents gave up on that will still land: (when, node, sent, stamp,
    /// what).
    late_writes: Vec<(u64, usize, u64, i64, Advertisement)>,
    /// Draws the fate of a timed-out write (late, and how late, or lost), apart from `rng`.
    write_rng: Rng,
    /// Draws the latency of the power watch's reads, apart from `rng`.
    watch_rng: Rng,
    /// Draws which containers' kills hang on a node where some do, apart from `rng`.
    kill_rng: Rng,
    /// The identity whose pods carry a finalizer (another controller's, removed some time
    /// after the pod's deletion): in a quarter of the schedules, `ledger`. A released pod of
    /// it stays bound to its node for a while, so that only the released pods' record, not
    /// the node's bound pods, keeps a returning node that still runs it from its clean proof.
    finalized: Option<usize>,
    /// Draws whether an identity's pods carry a finalizer, and how long each lingers.
    finalizer_rng: Rng,
    /// The first fence created without a cause ([`Invariant::CauselessFence`]).
    causeless: Option<String>,
    policy: FencingPolicySpec,
    /// Per Node: another machine that took over its name ([`Fault::Impostor`]), and when it
    /// last wrote the node's Lease.
    impostors: Vec<Option<Impostor>>,
    next_event: usize,
    uid_counter: u64,
    history: Vec<String>,
    out: Outcome,
    /// The warm standby replica: it observes and remembers as the leader does, and takes over
    /// with that memory when the leader dies or is deposed ([`World::take_over`]).
    standby: Sight,
    /// Its watch lag, and whether a takeover is warm (a stream of its own, so that earlier
    /// schedules keep their leader's draws).
    standby_rng: Rng,
    /// Per node: a person deleted its `Pending` fence, and the decision has not fenced it
    /// again since.
    pending_deleted: Vec<bool>,
    /// Per node: the address of the BMC its FenceTarget lists now ([`World::initial_bmc_url`],
    /// or one a person wrote: [`Fault::EditTargetAddress`]).
    bmc_url: Vec<String>,
    /// Per node: the identity learnt from what an edited address answered (only under
    /// [`Bug::RepinOnAddressEdit`]).
    learnt_pin: Vec<Option<String>>,
    /// The FenceTarget's BMC address a frozen leader's command was resolved against before it
    /// froze (the operator reads the FenceTarget before its last leadership check), while
    /// that command is delivered.
    resolved_before_freeze: Option<String>,
}

/// Another machine under a node's name ([`Fault::Impostor`]): a reinstalled spare with the
/// same hostname. Its agent renews the node's Lease every renew interval while it reaches the
/// API, advertising its own machine UUID, an empty runtime and the challenge it read.
#[derive(Debug, Clone)]
struct Impostor {
    system_uuid: String,
    last_attempt: Option<u64>,
}

fn epoch() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The wall time `ms` milliseconds after the simulation's epoch (may be before it).
fn at_ms(ms: i64) -> Timestamp {
    epoch()
        .checked_add(SignedDuration::from_millis(ms))
        .unwrap_or(epoch())
}

impl<'s> World<'s> {
    /// The initial world of `s`.
    pub fn new(s: &'s Schedule, bug: Option<Bug>) -> Self {
        let machines = (0..s.nodes.len())
            .map(|i| Machine {
                name: format!("m{i}"),
                powered: !s.nodes[i].joins_late,
                member: !s.nodes[i].joins_late,
                known: (0..s.nodes.len())
                    .filter(|&j| !s.nodes[j].joins_late)
                    .collect(),
                counted: None,
                offered: Vec::new(),
                boot: 1,
                agent: Agent::Running,
                cut_api: false,
                cut_all: false,
                companion_cut: false,
                kubelet_last: None,
                storage_holds: BTreeSet::new(),
                last_renew_sent: None,
                last_attempt: None,
                slow_writes: None,
                watchdog_armed: s.nodes[i].watchdog.is_some(),
                watchdog_held: s.nodes[i].watchdog.is_some(),
                last_pet: 0,
                containers: BTreeSet::new(),
                unkillable: BTreeSet::new(),
                power_mode: s.nodes[i].power_mode,
                storage_mode: s.nodes[i].storage_mode,
                power_back_at: None,
                able_since: None,
                last_write: 0,
                fence_active: false,
                vouches: BTreeMap::new(),
                in_flight: Vec::new(),
                excused_until: None,
                next_poll: 0,
                excusing: false,
                net_side: false,
                clock_step_ms: 0,
                challenge_read: None,
                paused: None,
                displaced: false,
            })
            .collect();
        let policy: FencingPolicySpec = serde_json::from_value(serde_json::json!({
            "detection": {
                "suspectAfterSeconds": 2 * s.scale,
                "unhealthyAfterSeconds": 4 * s.scale,
                "powerOffAfterSeconds": s.power_off_after,
            },
            "forgiveness": {"respectTolerations": false, "defaultSeconds": 0},
            "fenceWhen": "Always",
            "trustSelfFence": {"enabled": s.trust_self_fence, "marginSeconds": 1},
            "recovery": {"powerOn": s.power_on, "untaintWhen": "NodeReady"},
            "escalation": {"cooldownSeconds": 0},
        }))
        .unwrap_or_default();
        let mut finalizer_rng = Rng::new(s.seed ^ 0xF1A1_12E5);
        let finalized = finalizer_rng.chance(25).then_some(1);
        World {
            s,
            bug,
            rng: Rng::new(s.seed ^ 0xD1CE),
            now: 0,
            leases: vec![(0, Advertisement::default()); s.nodes.len()],
            lease_log: vec![vec![(0, 0, 0, Advertisement::default())]; s.nodes.len()],
            skew_rng: Rng::new(s.seed ^ 0x5EED_C10C),
            crash_rng: Rng::new(s.seed ^ 0x0C2A_54ED),
            podgc_rng: Rng::new(s.seed ^ 0x9D6C_0005),
            net_rng: Rng::new(s.seed ^ 0x0A75_DE1A),
            released_uids: BTreeSet::new(),
            broken_promise: None,
            floors: vec![0; s.nodes.len()],
            machines,
            pods: Vec::new(),
            identities: vec![
                ("db".into(), Backing::Array),
                ("ledger".into(), Backing::Array),
                ("web".into(), Backing::None),
                ("queue".into(), Backing::Elsewhere),
                ("cache".into(), Backing::None),
            ],
            fences: Vec::new(),
            tainted: vec![false; s.nodes.len()],
            taint_owner: vec![None; s.nodes.len()],
            out_of_service: vec![None; s.nodes.len()],
            untainted_at: vec![None; s.nodes.len()],
            node_challenge: vec![None; s.nodes.len()],
            api_up: true,
            api_down_at: None,
            ctl_wall_offset_ms: 0,
            ctl: Controller {
                up: true,
                token: 1,
                sight: Sight::default(),
                untainted_since: HashMap::new(),
                power: Watch::default(),
            },
            freeze_trap: None,
            standby: Sight::default(),
            standby_rng: Rng::new(s.seed ^ 0x57A4_DB1E),
            pending_deleted: vec![false; s.nodes.len()],
            bmc_url: (0..s.nodes.len()).map(Self::initial_bmc_url).collect(),
            learnt_pin: vec![None; s.nodes.len()],
            resolved_before_freeze: None,
            frozen: None,
            late_writes: Vec::new(),
            write_rng: Rng::new(s.seed ^ 0x0D1A_7E5E),
            watch_rng: Rng::new(s.seed ^ 0x0BAD_5EAD),
            kill_rng: Rng::new(s.seed ^ 0x0C1D_4A26),
            finalized,
            finalizer_rng,
            causeless: None,
            policy,
            impostors: vec![None; s.nodes.len()],
            next_event: 0,
            uid_counter: 0,
            history: Vec::new(),
            out: Outcome::default(),
        }
    }

    fn log(&mut self, what: String) {
        self.history
            .push(format!("[{:>7.2}s] {what}", self.now as f64 / 1000.0));
    }

    /// The controller's wall clock: true time plus the steps it took.
    fn wall(&self) -> Timestamp {
        epoch()
            .checked_add(SignedDuration::from_millis(
                self.now as i64 + self.ctl_wall_offset_ms,
            ))
            .unwrap_or(epoch())
    }

    /// The agents' renew interval at the schedule's time scale.
    fn renew_ms(&self) -> u64 {
        RENEW_MS * self.s.scale
    }

    /// Node `i`'s heartbeat marker as a quorum read of its Lease returns it now (not the
    /// watch's).
    fn stored_marker(&self, i: usize) -> String {
        lease_heartbeat(self.leases[i].0, &self.leases[i].1).marker()
    }

    fn clocks(&self) -> Clocks {
        Clocks {
            mono: Mono(Duration::from_millis(self.now)),
            wall: self.wall(),
        }
    }

    /// Runs the whole schedule, checking the invariants after every tick.
    pub fn run(mut self) -> Outcome {
        while self.now <= self.s.length_ms {
            self.faults();
            self.power_returns();
            for i in 0..self.machines.len() {
                self.judge_in_flight(i);
                self.agent(i);
                self.watchdog(i);
                self.track_ability(i);
                self.impostor(i);
            }
            self.pod_gc();
            self.statefulsets();
            self.land_late_writes();
            self.frozen_leader();
            let leader_frozen = self.frozen.as_ref().is_some_and(|f| !f.deposed);
            // The leader's power watch reads the BMCs directly, also while the API is down.
            if self.ctl.up && !leader_frozen {
                self.power_watch();
            }
            if self.ctl.up && self.api_up && self.now.is_multiple_of(500) && !leader_frozen {
                self.controller();
            }
            // The standby runs while the controller's Deployment does (a crash of it stops both).
            if self.ctl.up && self.api_up && self.now.is_multiple_of(500) {
                self.standby_tick();
            }
            if let Some(v) = self.check() {
                self.out.violation = Some(v);
                self.out.history = self.history;
                return self.out;
            }
            self.now += TICK_MS;
        }
        self.out.history = self.history;
        self.out
    }

    fn faults(&mut self) {
        while let Some((at, f)) = self.s.events.get(self.next_event).cloned() {
            if at > self.now {
                return;
            }
            self.next_event += 1;
            self.log(format!("fault: {f:?}"));
            match f {
                Fault::CutApi(i) => self.machines[i].cut_api = true,
                Fault::CutAll(i) => self.machines[i].cut_all = true,
                Fault::Heal(i) => {
                    self.machines[i].cut_api = false;
                    self.machines[i].cut_all = false;
                }
                Fault::HangAgent(i) => {
                    if self.machines[i].agent == Agent::Running {
                        self.machines[i].agent = Agent::Hung;
                    }
                }
                Fault::ResumeAgent(i) => {
                    if self.machines[i].agent == Agent::Hung {
                        self.machines[i].agent = Agent::Running;
                    }
                }
                Fault::CrashAgent(i) => {
                    let now = self.now;
                    let m = &mut self.machines[i];
                    if m.agent != Agent::Crashed {
                        m.agent_dies(now);
                    }
                    m.agent = Agent::Crashed;
                    // A watchdog that is not nowayout is disarmed by a clean stop.
                    if !self.s.nodes[i].nowayout {
                        m.watchdog_armed = false;
                    }
                }
                Fault::RestartAgent(i) => {
                    let now = self.now;
                    let m = &mut self.machines[i];
                    if m.powered && m.paused.is_none() && m.agent != Agent::Running {
                        // A hung agent is killed first.
                        if m.agent == Agent::Hung {
                            m.agent_dies(now);
                        }
                        self.start_agent(i);
                    }
                }
                Fault::ControllerCrash => {
                    self.ctl.up = false;
                    // A frozen leader killed before it resumed sends nothing.
                    if self.frozen.as_ref().is_some_and(|f| !f.deposed) {
                        self.frozen = None;
                    }
                }
                Fault::FreezeLeaderAtCommand(ms) => self.freeze_trap = Some(ms),
                Fault::SlowWrites { node, land } => self.machines[node].slow_writes = Some(land),
                Fault::FastWrites(i) => self.machines[i].slow_writes = None,
                Fault::Join(i) => {
                    self.machines[i].member = true;
                    self.power_on(i);
                }
                Fault::ControllerStart => {
                    if !self.ctl.up {
                        // Both replicas start afresh.
                        self.standby = self.fresh_sight();
                        self.restart_controller();
                    }
                }
                Fault::ControllerClockStep(ms) => self.ctl_wall_offset_ms += ms,
                Fault::NodeClockStep(i, ms) => self.machines[i].clock_step_ms += ms,
                Fault::ApiDown => {
                    if self.api_up {
                        self.api_down_at = Some(self.now);
                    }
                    self.api_up = false;
                    self.ctl.sight.lost_api = true;
                    self.standby.lost_api = true;
                }
                Fault::ApiUp => {
                    self.api_up = true;
                    let down_since = self.api_down_at.take();
                    if down_since.is_some_and(|t| self.now - t > LEADER_LEASE_MS) {
                        self.term_lapsed();
                    }
                }
                Fault::PowerDevice(i, m) => self.machines[i].power_mode = m,
                Fault::StorageDevice(i, m) => self.machines[i].storage_mode = m,
                Fault::OperatorPowerOn(i) => self.power_on(i),
                Fault::PowerLoss(i) => self.power_off(i),
                Fault::PowerCycle(i, off_ms) => {
                    self.power_off(i);
                    self.machines[i].power_back_at = Some(self.now + off_ms);
                }
                Fault::SplitNodes(mask) => {
                    for (i, m) in self.machines.iter_mut().enumerate() {
                        m.net_side = mask & (1 << i) != 0;
                    }
                }
                Fault::HealNodes => {
                    for m in &mut self.machines {
                        m.net_side = false;
                    }
                }
                Fault::Pause(i, ms) => {
                    let m = &mut self.machines[i];
                    if self.s.nodes[i].virtual_machine && m.powered && m.paused.is_none() {
                        m.paused = Some((self.now, self.now + ms));
                    }
                }
                Fault::Request { node, manual } => self.request(node, manual),
                Fault::CompanionCut(i) => {
                    self.machines[i].companion_cut = true;
                    self.out.companion_cuts += 1;
                }
                Fault::CompanionHeal(i) => self.machines[i].companion_cut = false,
                Fault::DeleteFence(i) => self.delete_fence(i),
                Fault::EditTargetAddress(i, to) => self.edit_address(i, to),
                Fault::Impostor(i) => {
                    self.machines[i].displaced = true;
                    self.impostors[i] = Some(Impostor {
                        system_uuid: format!("1a1a0000-0000-4000-8000-{:012x}", i + 1),
                        last_attempt: None,
                    });
                }
            }
        }
    }

    /// Power returns to machines whose power cycle is over; paused machines whose pause is
    /// over resume.
    fn power_returns(&mut self) {
        for i in 0..self.machines.len() {
            if let Some((since, _)) = self.machines[i].paused.filter(|p| p.1 <= self.now) {
                self.machines[i].resume(self.now - since);
                self.log(format!("m{i} resumes"));
            }
            if self.machines[i]
                .power_back_at
                .is_some_and(|t| t <= self.now)
            {
                self.machines[i].power_back_at = None;
                self.power_on(i);
            }
        }
    }

    /// Whether machine `i` can renew now: powered, its agent running, reaching an API that is
    /// up and answers its writes in time; [`Machine::able_since`] follows it.
    fn track_ability(&mut self, i: usize) {
        let m = &self.machines[i];
        let able = m.member
            && m.powered
            && m.paused.is_none()
            && !m.displaced
            && m.agent == Agent::Running
            && !m.cut_api
            && !m.cut_all
            && m.slow_writes.is_none()
            && self.api_up;
        let since = m.able_since;
        self.machines[i].able_since = able.then(|| since.unwrap_or(self.now));
    }

    /// An agent (re)starts: a stale renewal record means it was partitioned or down longer
    /// than its self-fence timeout, so it kills every container it finds first, and it opens
    /// its watchdog only once it renewed (opening pets it); with a fresh record (or none) it
    /// opens it at once.
    fn start_agent(&mut self, i: usize) {
        let after = self.s.nodes[i].self_fence_after * 1000;
        let has_watchdog = self.s.nodes[i].watchdog.is_some();
        let now = self.now;
        let bug = self.bug;
        let m = &mut self.machines[i];
        m.agent = Agent::Running;
        m.watchdog_held = false;
        // A fresh agent: its write clock starts now (a previous incarnation may just have
        // written), no answers, no excuse, no fence yet.
        m.fresh_start(now);
        if bug == Some(Bug::ArmWhileStale)
            || m.last_renew_sent
                .is_none_or(|t| now.saturating_sub(t) <= after)
        {
            m.pet(has_watchdog, now);
        }
        m.next_poll = now;
        m.last_attempt = None;
        m.challenge_read = None;
        let stale = m
            .last_renew_sent
            .is_none_or(|t| now.saturating_sub(t) > after);
        if stale {
            m.kill_except(&BTreeSet::new(), self.s.nodes[i].kill_hangs);
        }
    }

    fn power_on(&mut self, i: usize) {
        if self.machines[i].powered || !self.machines[i].member {
            return;
        }
        let m = &mut self.machines[i];
        m.powered = true;
        m.boot += 1;
        m.containers.clear();
        m.boots();
        self.start_agent(i);
        self.log(format!("m{i} powered on (boot {})", self.machines[i].boot));
    }

    /// Restarts a powered machine in place (a BMC's warm reset): its containers die, it boots
    /// again with a new boot ID, and its power never goes off.
    fn reset_machine(&mut self, i: usize) {
        if !self.machines[i].powered {
            return;
        }
        let m = &mut self.machines[i];
        m.paused = None;
        m.containers.clear();
        m.boot += 1;
        m.boots();
        self.out.resets += 1;
        self.start_agent(i);
        self.log(format!("m{i} reset (boot {})", self.machines[i].boot));
    }

    /// A command of a fence of node `i` that the BMC of machine `b` (the one its address
    /// reaches) carries out: a broken promise when `b` is another machine (the device acted on
    /// a machine whose identity does not match).
    fn bmc_command(&mut self, i: usize, b: usize, what: &str) {
        if b != i && self.broken_promise.is_none() {
            self.broken_promise = Some(format!(
                "a fence of m{i} sent {what} through a miswired BMC address to machine m{b}, not the node's machine"
            ));
        }
    }

    /// A power command (off or on) of a fence of node `i` through machine `b`'s BMC
    /// ([`Self::bmc_command`]): also a broken promise for a host that must not power off.
    fn power_command(&mut self, i: usize, b: usize, what: &str) {
        self.bmc_command(i, b, what);
        if self.s.nodes[i].fencing == Fencing::StorageThenReset && self.broken_promise.is_none() {
            self.broken_promise = Some(format!(
                "m{i} must not power off, and the controller sent it {what}"
            ));
        }
    }

    /// The machine's SMBIOS system UUID: its agent advertises it, its BMC answers it, and its
    /// Node reports it until another machine takes over the name ([`Fault::Impostor`]).
    fn system_uuid(i: usize) -> String {
        format!("5a5a0000-0000-4000-8000-{:012x}", i + 1)
    }

    /// The `systemUUID` node `i`'s Node reports now: its machine's, or the impostor's.
    fn node_uuid(&self, i: usize) -> String {
        self.impostors[i]
            .as_ref()
            .map_or_else(|| Self::system_uuid(i), |m| m.system_uuid.clone())
    }

    /// The BMC address node `i`'s FenceTarget lists at first (a name that reaches machine
    /// [`crate::faults::NodeConfig::bmc_of`] when miswired).
    fn initial_bmc_url(i: usize) -> String {
        format!("ipmi://bmc-m{i}:623")
    }

    /// The address a person writes for machine `m`'s BMC ([`Fault::EditTargetAddress`]).
    fn bmc_address(m: usize) -> String {
        format!("ipmi://10.20.0.{}:623", m + 1)
    }

    /// The machine whose BMC answers at `url`, an address node `i`'s FenceTarget lists or
    /// listed: its first one reaches its own machine unless miswired; one a person wrote
    /// reaches the machine it names.
    fn machine_at(&self, i: usize, url: &str) -> usize {
        if url == Self::initial_bmc_url(i) {
            return self.s.nodes[i].bmc_of.unwrap_or(i);
        }
        (0..self.machines.len())
            .find(|&m| Self::bmc_address(m) == url)
            .unwrap_or(i)
    }

    /// The machine whose BMC answers at the address node `i`'s FenceTarget lists now: its own,
    /// unless miswired or mistyped.
    fn bmc(&self, i: usize) -> usize {
        self.machine_at(i, &self.bmc_url[i])
    }

    /// Whether the controller acts through machine `b`'s BMC for node `i`: it pins the direct
    /// BMC to the `systemUUID` the Node reports, and the BMC must answer as that machine
    /// before anything is read or commanded (`devices.rs::pin_identity` and the fence agents'
    /// identity check, with the model's [`palisade_model::identity::same_machine`]); a
    /// mismatch sends nothing. The pin is the Node's at every step, never stored with an
    /// address, so an edited address is pinned as the first one was. Under
    /// [`Bug::IgnoreBmcIdentity`] nothing is compared; under [`Bug::RepinOnAddressEdit`] an
    /// edited address is compared with what it answered when it was written.
    fn answers_as_node(&self, i: usize, b: usize) -> bool {
        let expected = match (&self.learnt_pin[i], self.bug) {
            (Some(pin), Some(Bug::RepinOnAddressEdit)) => pin.clone(),
            _ => self.node_uuid(i),
        };
        self.bug == Some(Bug::IgnoreBmcIdentity)
            || palisade_model::identity::same_machine(&Self::system_uuid(b), &expected)
    }

    /// Whether the BMC at node `i`'s FenceTarget address answers as the node's machine.
    fn bmc_answers_as_node(&self, i: usize) -> bool {
        self.answers_as_node(i, self.bmc(i))
    }

    /// A status read through node `i`'s BMC (the address its FenceTarget lists now, as the
    /// power watch reads it): what the BMC reached says of its machine, or nothing when it
    /// does not answer as the node's machine.
    fn bmc_read(&self, i: usize) -> PowerReading {
        if !self.bmc_answers_as_node(i) {
            return PowerReading::Unknown;
        }
        let m = &self.machines[self.bmc(i)];
        m.power_mode.read_power(m.powered)
    }

    /// The FenceTarget BMC address a step for node `i` is resolved against: the one listed
    /// now, or, for a frozen leader's command, the one listed before it froze.
    fn listed_bmc_url(&self, i: usize) -> String {
        self.resolved_before_freeze
            .clone()
            .unwrap_or_else(|| self.bmc_url[i].clone())
    }

    /// The machine a step of fence `f` through its planned BMC `url` reaches, as the
    /// operator's `devices.rs` resolves it: against the node's FenceTarget as listed now
    /// ([`FenceTargetSpec::acting_for`]: the planned BMC, or the BMC listed now standing in for
    /// one no longer listed), and the BMC at that address must answer as the Node's machine
    /// (`pin_identity`); else nothing is sent (`None`, logged).
    fn planned_bmc(&mut self, f: usize, url: &str) -> Option<usize> {
        use palisade_model::target::Acting;
        let i = self.fences[f].node;
        let target = self.target_listing(i, &self.listed_bmc_url(i));
        let acting = target
            .as_ref()
            .and_then(|t| t.acting_for(url, DeviceKind::Power));
        let at = match acting {
            None => {
                self.log(format!(
                    "{}: {url} is no longer listed in FenceTarget m{i}, and nothing stands in: nothing sent",
                    self.fences[f].name
                ));
                return None;
            }
            Some(Acting::Listed(d)) => d.url.clone(),
            Some(Acting::StandIn(d)) => {
                self.out.stood_in += 1;
                self.log(format!(
                    "{}: {url} is no longer listed in FenceTarget m{i}: {} stands in",
                    self.fences[f].name, d.url
                ));
                d.url.clone()
            }
        };
        let b = self.machine_at(i, &at);
        if !self.answers_as_node(i, b) {
            if at != Self::initial_bmc_url(i) {
                self.out.edited_refused += 1;
            }
            self.log(format!(
                "{}: m{i}'s BMC address answers as machine m{b}, not the Node's: IdentityMismatch, nothing sent",
                self.fences[f].name
            ));
            return None;
        }
        Some(b)
    }

    /// A power-on for fence `f` through its planned power `devices`: whether each took it
    /// (listed, answers as the node's machine, does not fail); stops at the first that does
    /// not, as the operator's recovery does.
    fn bmc_power_on(&mut self, f: usize, devices: &[PlannedDevice]) -> bool {
        let i = self.fences[f].node;
        for d in devices.iter().filter(|d| d.kind == DeviceKind::Power) {
            let Some(b) = self.planned_bmc(f, &d.url) else {
                return false;
            };
            self.power_command(i, b, "a power on");
            if self.machines[b].power_mode.obeys() {
                self.power_on(b);
            }
            if self.machines[b].power_mode == DeviceMode::Fails {
                return false;
            }
        }
        true
    }

    /// A person edits the BMC address in node `i`'s FenceTarget ([`Fault::EditTargetAddress`])
    /// to the BMC of machine `to` (its own when `None`), through the API server (the admission
    /// webhook accepts any valid address). Nothing else changes: fences keep their plans, and
    /// every step is pinned to the Node's `systemUUID` as before.
    fn edit_address(&mut self, i: usize, to: Option<usize>) {
        if !self.api_up {
            self.log(format!("edit of m{i}'s FenceTarget fails: the API is down"));
            return;
        }
        let m = to.unwrap_or(i);
        let url = Self::bmc_address(m);
        if !self.s.nodes[i].has_bmc() || url == self.bmc_url[i] {
            return;
        }
        self.out.edits += 1;
        if m != i {
            self.out.edits_elsewhere += 1;
        }
        let old = std::mem::replace(&mut self.bmc_url[i], url.clone());
        if self.bug == Some(Bug::RepinOnAddressEdit) {
            self.learnt_pin[i] = Some(Self::system_uuid(m));
        }
        self.log(format!(
            "a person edits m{i}'s FenceTarget: BMC {old} -> {url} (machine m{m}'s)"
        ));
    }

    /// Another machine under node `i`'s name renews the node's Lease once per renew interval
    /// while the API is up, as a fresh agent on an empty machine that answers the challenge it
    /// read ([`Fault::Impostor`]).
    fn impostor(&mut self, i: usize) {
        let now = self.now;
        let Some(imp) = &self.impostors[i] else {
            return;
        };
        if !self.api_up || imp.last_attempt.is_some_and(|t| now - t < self.renew_ms()) {
            return;
        }
        let ad = Advertisement {
            self_fence_after: Some(Duration::from_secs(self.s.nodes[i].self_fence_after)),
            watchdog: None,
            virtualization: Some(Virtualization::None),
            scope: Some(SelfFenceScope::All),
            version: None,
            boot_id: Some(format!("{}-impostor-boot-1", self.machines[i].name)),
            system_uuid: Some(imp.system_uuid.clone()),
            runtime_pods: Some(BTreeSet::new()),
            runtime_source: RuntimeSource::NodeAgent,
            challenge: self.node_challenge[i].clone(),
            peer_check: None,
            companion_written: None,
            companion_stale: None,
        };
        if let Some(imp) = &mut self.impostors[i] {
            imp.last_attempt = Some(now);
        }
        self.write_lease(i, now as i64, ad);
    }

    /// The boot ID the machine's agent advertises.
    fn boot_id(&self, i: usize) -> String {
        format!("{}-boot-{}", self.machines[i].name, self.machines[i].boot)
    }

    fn power_off(&mut self, i: usize) {
        let m = &mut self.machines[i];
        // A hypervisor powers a paused machine off too.
        m.paused = None;
        if m.powered {
            m.powered = false;
            m.containers.clear();
            self.log(format!("m{i} powered off"));
        }
    }

    fn agent(&mut self, i: usize) {
        let s = self.s;
        let cfg = &s.nodes[i];
        let now = self.now;
        let api_up = self.api_up;
        let m = &self.machines[i];
        if !m.powered || m.agent != Agent::Running || m.paused.is_some() {
            return;
        }
        let kubelet_reaches = api_up && !m.cut_api && !m.cut_all && !m.displaced;
        // On a stock node the kubelet renews on its own; the companion (which stands for the
        // agent below) gets no request through while it is cut, and so sends no write.
        let reaches = kubelet_reaches && !(cfg.stock && m.companion_cut);
        if cfg.stock && kubelet_reaches {
            self.kubelet_renews(i);
        }
        if reaches {
            // The Node list, read while the API answers.
            let members = self.members();
            self.machines[i].known = members;
            // The Node read also brings the recovery challenge (before the inventory below
            // is taken).
            self.machines[i].challenge_read = self.node_challenge[i].clone();
        }
        let m = &self.machines[i];
        if reaches && m.last_attempt.is_none_or(|t| now - t >= self.renew_ms()) {
            let ad = Advertisement {
                self_fence_after: Some(Duration::from_secs(cfg.self_fence_after)),
                // A watchdog that resets the machine (a hardware one, or the hypervisor's
                // emulated one with a reset action).
                watchdog: cfg.watchdog.filter(|_| m.watchdog_held).map(|w| Watchdog {
                    timeout: Duration::from_secs(w),
                    nowayout: cfg.nowayout,
                    action: Some(WatchdogAction::Reset),
                    driver: Some(
                        if cfg.virtual_machine {
                            "i6300esb"
                        } else {
                            "iTCO_wdt"
                        }
                        .into(),
                    ),
                }),
                virtualization: Some(
                    if cfg.virtual_machine && self.bug != Some(Bug::VirtualAsBareMetal) {
                        Virtualization::Virtual("kvm".into())
                    } else {
                        Virtualization::None
                    },
                ),
                scope: Some(SelfFenceScope::All),
                version: None,
                boot_id: Some(self.boot_id(i)),
                system_uuid: Some(Self::system_uuid(i)),
                // Taken from the runtime at this renewal, before this tick's kills.
                runtime_pods: Some(m.containers.clone()),
                runtime_source: RuntimeSource::NodeAgent,
                challenge: m.challenge_read.clone(),
                peer_check: cfg.peer_check.map(|(vouch_after, answer_valid)| PeerCheck {
                    vouch_after: Duration::from_secs(vouch_after),
                    answer_valid: Duration::from_secs(answer_valid),
                    members: (!m.known.is_empty()).then(|| self.member_set(&m.known)),
                }),
                companion_written: None,
                companion_stale: None,
            };
            let stamp = self.node_stamp(i);
            self.machines[i].last_attempt = Some(now);
            // The write clock is stamped before every write that may land, whatever its
            // outcome (the agent's `WriteClock`): no vouch while a write of its own may count.
            if self.bug != Some(Bug::VouchSinceLastRenewal) {
                self.machines[i].last_write = now;
            }
            let list = self.machines[i].known.clone();
            if !self.machines[i].offered.contains(&list) {
                self.machines[i].offered.push(list);
            }
            if let Some(land) = self.machines[i].slow_writes {
                // The request times out and the agent gives up on it; the API server may
                // still apply it 0.9–4 s later.
                if land {
                    let land = now + 900 + self.write_rng.below(3_101);
                    self.late_writes.push((land, i, now, stamp, ad));
                }
                if self.bug == Some(Bug::CountUnackedRenewal) {
                    self.renewed(i);
                }
            } else {
                self.write_own(i, stamp, ad);
                self.renewed(i);
            }
        }
        let m = &self.machines[i];
        let age = now.saturating_sub(m.last_renew_sent.unwrap_or(0));
        let stale = age > cfg.self_fence_after * 1000;
        if reaches && !m.fence_active && !stale {
            // Sync with the API: run what is bound here, kill what is not; pet while the Lease
            // is fresh.
            let want: BTreeSet<String> = self
                .pods
                .iter()
                .filter(|p| p.node == i && !p.deleted)
                .map(|p| p.uid.clone())
                .collect();
            let m = &mut self.machines[i];
            m.kill_except(&want, cfg.kill_hangs);
            for uid in want {
                if cfg.some_kills_hang && !m.containers.contains(&uid) && self.kill_rng.chance(50) {
                    m.unkillable.insert(uid.clone());
                }
                m.containers.insert(uid);
            }
            m.pet(cfg.watchdog.is_some(), now);
        } else {
            // The poller runs while the last renewal is older than the renew interval.
            if let Some((vouch_after, answer_valid)) = cfg.peer_check {
                if age > self.renew_ms() {
                    if now >= self.machines[i].next_poll {
                        self.poll(i, vouch_after, answer_valid);
                    }
                } else {
                    let m = &mut self.machines[i];
                    m.vouches.clear();
                    m.in_flight.clear();
                    m.excused_until = None;
                }
            }
            let m = &mut self.machines[i];
            let excused = m.excused_until.is_some_and(|u| now < u);
            if !m.fence_active && stale && !excused {
                m.fence_active = true;
            }
            if m.fence_active {
                m.kill_except(&BTreeSet::new(), cfg.kill_hangs);
            }
            let excusing = stale && !m.fence_active;
            let newly = excusing && !m.excusing;
            m.excusing = excusing;
            // Pet while the Lease is fresh, or while excused and not fenced.
            if !stale || excusing {
                m.pet(cfg.watchdog.is_some(), now);
            }
            if newly {
                self.out.excused += 1;
                self.log(format!("m{i}: stale, excused by its peers"));
            }
        }
    }

    /// The member set of machines `list` (their Node names).
    fn member_set(&self, list: &[usize]) -> MemberSet {
        MemberSet::of(list.iter().map(|&j| self.machines[j].name.as_str()))
    }

    /// The machines in the cluster (the Node list), in order.
    fn members(&self) -> Vec<usize> {
        (0..self.machines.len())
            .filter(|&i| self.machines[i].member)
            .collect()
    }

    /// A Lease write reaches the API server now, with its send-time stamp.
    fn write_lease(&mut self, i: usize, stamp: i64, ad: Advertisement) {
        self.leases[i].0 += 1;
        self.leases[i].1 = ad.clone();
        self.lease_log[i].push((self.now, self.leases[i].0, stamp, ad));
    }

    /// The node's own write of its advertisement stamped `stamp` (its clock): the node agent's
    /// renewal, or on a stock node the companion's write, which carries the stamp and leaves
    /// the kubelet's `renewTime` as it was.
    fn write_own(&mut self, i: usize, stamp: i64, mut ad: Advertisement) {
        if !self.s.nodes[i].stock {
            self.write_lease(i, stamp, ad);
            return;
        }
        ad.companion_written = Some(at_ms(stamp));
        let (count, renewed) = self.lease_log[i]
            .last()
            .map_or((0, 0), |(_, c, st, _)| (*c, *st));
        self.leases[i].1 = ad.clone();
        self.lease_log[i].push((self.now, count, renewed, ad));
    }

    /// A write's stamp (its `renewTime`, or a companion's stamp): the send time on node `i`'s
    /// clock, off the controller's by its bias plus a jitter (within the assumed 1 s), plus
    /// any step its clock took (beyond it).
    fn node_stamp(&mut self, i: usize) -> i64 {
        let jitter = self.skew_rng.below(601) as i64 - 300;
        self.now as i64
            + (self.s.nodes[i].skew_ms + jitter).clamp(-1_000, 1_000)
            + self.machines[i].clock_step_ms
    }

    /// A stock node's kubelet renews the Lease (once per renew interval while it reaches the
    /// API): a new `renewTime`, the companion's advertisement kept.
    fn kubelet_renews(&mut self, i: usize) {
        let now = self.now;
        let m = &self.machines[i];
        if m.kubelet_last.is_some_and(|t| now - t < self.renew_ms()) {
            return;
        }
        let stamp = self.node_stamp(i);
        self.machines[i].kubelet_last = Some(now);
        let ad = self.leases[i].1.clone();
        self.write_lease(i, stamp, ad);
    }

    /// The agent saw its renewal succeed: its self-fence clock restarts, the latch lifts, the
    /// poller stops and forgets.
    fn renewed(&mut self, i: usize) {
        let now = self.now;
        let m = &mut self.machines[i];
        // The list this renewal advertised counts; no earlier attempt can land any more.
        m.counted = Some(m.known.clone());
        m.offered.clear();
        m.last_renew_sent = Some(now);
        m.fresh_start(now);
    }

    /// Lease writes their agents gave up on land now (if the API server is up).
    fn land_late_writes(&mut self) {
        let now = self.now;
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.late_writes)
            .into_iter()
            .partition(|w| w.0 <= now);
        self.late_writes = rest;
        for (_, i, sent, stamp, ad) in due {
            // The Lease is replaced with the resourceVersion read before the write was sent:
            // it lands only if no other write landed since.
            let conflict = self.lease_log[i].last().is_some_and(|w| w.0 >= sent);
            if self.api_up && !conflict {
                self.write_own(i, stamp, ad);
                self.out.late_writes += 1;
                self.log(format!("m{i}: a Lease write its agent gave up on lands"));
            }
        }
    }

    /// One poll round of agent `i`: asks every peer, then publishes until when a strict
    /// majority of the members (itself one voter when it may vouch) excuses it.
    ///
    /// Requests are lost (10 %), answered late (30 %: the peer judges it up to 0.6 s after it
    /// was sent, and its answer arrives up to 0.6 s after that; the agent drops an answer later
    /// than its request timeout, and tallies the others at the first round after they arrived)
    /// or at once. A late vouch counts from its request's send time, as in the agent.
    fn poll(&mut self, i: usize, vouch_after: u64, answer_valid: u64) {
        let now = self.now;
        // The lists a strict majority of each must excuse this agent (its last successful
        // renewal's and every later attempt's), and the peers it asks: all of theirs.
        let lists: Vec<Vec<usize>> = {
            let m = &self.machines[i];
            let mut l: Vec<Vec<usize>> = m.counted.iter().cloned().collect();
            if self.bug != Some(Bug::LatestListOnly) {
                l.extend(
                    m.offered
                        .iter()
                        .filter(|o| Some(*o) != m.counted.as_ref())
                        .cloned(),
                );
            }
            if m.counted.is_none() || self.bug == Some(Bug::LatestListOnly) {
                l = vec![m.known.clone()];
            }
            l
        };
        let mut asked: Vec<usize> = lists.iter().flatten().copied().collect();
        asked.sort_unstable();
        asked.dedup();
        let mut answers: Vec<(usize, u64, Option<bool>)> = Vec::new();
        let (arrived, late): (Vec<_>, Vec<_>) = std::mem::take(&mut self.machines[i].in_flight)
            .into_iter()
            .partition(|r| r.arrives <= now && r.answer.is_some());
        self.machines[i].in_flight = late;
        for r in arrived {
            // The agent gives up on a request after its timeout (0.8 of the poll interval):
            // a later answer is dropped.
            if r.arrives - r.sent <= REQUEST_TIMEOUT_MS * self.s.scale {
                answers.push((r.peer, r.sent, r.answer.flatten()));
            }
        }
        for j in asked.into_iter().filter(|&j| j != i) {
            let fate = self.net_rng.below(100);
            if fate < 10 {
                continue;
            }
            if fate < 40 {
                let judged_at = now + self.net_rng.below(600);
                let arrives = judged_at + 1 + self.net_rng.below(600);
                self.machines[i].in_flight.push(InFlight {
                    peer: j,
                    sent: now,
                    judged_at,
                    arrives,
                    answer: None,
                });
                continue;
            }
            answers.push((j, now, self.answer(i, j)));
        }
        let loose = self.bug == Some(Bug::LooseMajority);
        let m = &mut self.machines[i];
        for (j, sent_at, a) in answers {
            // A "no" or no answer adds nothing and takes nothing away: an earlier vouch
            // lapses on its own, `answer_valid` after its request (as in the agent).
            if a == Some(true) {
                let sent = m.vouches.entry(j).or_insert(sent_at);
                *sent = (*sent).max(sent_at);
            }
        }
        m.next_poll = now + POLL_MS * self.s.scale;
        let self_votes = now.saturating_sub(m.last_write) > vouch_after * 1000;
        let valid_for = answer_valid * 1000;
        // Excused until the earliest of what each list's strict majority gives.
        let each: Option<Vec<u64>> = lists
            .iter()
            .map(|list| {
                let n = list.len();
                if n == 0 {
                    return None;
                }
                let k = if loose { n / 2 } else { n / 2 + 1 };
                let need = k.saturating_sub(usize::from(self_votes));
                if need == 0 {
                    return Some(now + valid_for);
                }
                let mut valid: Vec<u64> = m
                    .vouches
                    .iter()
                    .filter(|(j, _)| list.contains(j))
                    .map(|(_, sent)| sent + valid_for)
                    .filter(|&u| u > now)
                    .collect();
                valid.sort_unstable_by(|a, b| b.cmp(a));
                valid.get(need - 1).copied()
            })
            .collect();
        let until = each.and_then(|u| u.into_iter().min());
        m.excused_until = until.filter(|&u| u > now);
    }

    /// The peers judge the late requests that reached them by now.
    fn judge_in_flight(&mut self, i: usize) {
        let now = self.now;
        for k in 0..self.machines[i].in_flight.len() {
            let r = &self.machines[i].in_flight[k];
            if r.answer.is_none() && r.judged_at <= now {
                let answer = self.answer(i, r.peer);
                self.machines[i].in_flight[k].answer = Some(answer);
            }
        }
    }

    /// What peer `to` answers agent `from` now: `None` when the request fails (unreachable over
    /// the node network, powered off, its agent hung or down, or it runs no peer check), else
    /// whether it may vouch (no Lease write attempt within its vouch delay).
    fn answer(&self, from: usize, to: usize) -> Option<bool> {
        // A request for node `to` goes to the address its Node reports: once another machine
        // took over the name, that is the newcomer's, which runs no peer check (the original
        // machine is never asked again).
        if self.impostors[to].is_some() {
            return None;
        }
        let (a, b) = (&self.machines[from], &self.machines[to]);
        if !b.powered
            || b.agent != Agent::Running
            || b.paused.is_some()
            || a.cut_all
            || b.cut_all
            || a.net_side != b.net_side
        {
            return None;
        }
        let (vouch_after, _) = self.s.nodes[to].peer_check?;
        Some(self.now.saturating_sub(b.last_write) > vouch_after * 1000)
    }

    fn watchdog(&mut self, i: usize) {
        let Some(w) = self.s.nodes[i].watchdog else {
            return;
        };
        let now = self.now;
        let m = &mut self.machines[i];
        if m.powered
            && m.paused.is_none()
            && m.watchdog_armed
            && now.saturating_sub(m.last_pet) > w * 1000
        {
            m.containers.clear();
            m.boot += 1;
            m.boots();
            self.log(format!("m{i} reset by its watchdog"));
            self.start_agent(i);
        }
    }

    /// The StatefulSet controller and the scheduler: an identity without a pod object gets a
    /// new pod, bound to a node that looks usable.
    fn statefulsets(&mut self) {
        if !self.api_up {
            return;
        }
        for id in 0..self.identities.len() {
            // The StatefulSet creates a pod only once the old one's object is gone.
            let now = self.now;
            if self.pods.iter().any(|p| p.identity == id && p.in_api(now)) {
                continue;
            }
            let usable: Vec<usize> = (0..self.machines.len())
                .filter(|&i| {
                    let m = &self.machines[i];
                    m.member && m.powered && !m.cut_api && !m.cut_all && !self.any_taint(i)
                })
                .collect();
            if usable.is_empty() {
                continue;
            }
            // The first placement spreads the identities over every node; later ones are random.
            let node = if self.now == 0 {
                usable[id % usable.len()]
            } else {
                usable[self.rng.below(usable.len() as u64) as usize]
            };
            self.uid_counter += 1;
            let uid = format!("{}-0-u{}", self.identities[id].0, self.uid_counter);
            self.log(format!("pod {uid} created on m{node}"));
            self.pods.push(Pod {
                uid,
                identity: id,
                node,
                deleted: false,
                object_until: None,
            });
        }
    }

    /// The frozen leader: a standby takes over once its Lease ran out; when it resumes, its
    /// pending command is delivered (a deposed leader's reaches the devices only: its status
    /// writes fail their resourceVersion precondition, and it stops).
    fn frozen_leader(&mut self) {
        let Some(fz) = &mut self.frozen else {
            return;
        };
        if !fz.deposed && self.now >= fz.takeover_at && self.now < fz.until {
            fz.deposed = true;
            let token = fz.token;
            self.log(format!(
                "leader (token {token}) frozen past its Lease: a standby takes over"
            ));
            self.take_over();
            return;
        }
        if self.now < fz.until {
            return;
        }
        let Some(fz) = self.frozen.take() else {
            return;
        };
        let (f, step) = fz.pending;
        self.resolved_before_freeze = Some(fz.listed);
        if fz.deposed {
            self.log(format!(
                "deposed leader (token {}) resumes: its {} for {} reaches the devices",
                fz.token,
                step.label(),
                self.fences[f].name
            ));
            self.out.stale_commands += 1;
            self.stale_command(f, fz.token, step);
        } else if !self.fences[f].listed() {
            // Its fence went while it was frozen: the command still reaches the devices, and
            // the status write after it finds no fence.
            self.log(format!(
                "leader (token {}) resumes: its {} reaches the devices; {} is gone",
                fz.token,
                step.label(),
                self.fences[f].name
            ));
            self.stale_command(f, fz.token, step);
        } else {
            self.log(format!("leader (token {}) resumes", fz.token));
            self.apply(f, step);
        }
        self.resolved_before_freeze = None;
    }

    /// A deposed leader's device command, delivered late: what the devices do with it (a
    /// bridge refuses it when its token is below the target's floor).
    fn stale_command(&mut self, f: usize, token: i64, step: Step) {
        let i = self.fences[f].node;
        if !self.bridge_admits(i, token) {
            return;
        }
        match step {
            Step::RunLevel {
                level,
                devices,
                reset,
            } => {
                let _ = self.drive_devices(f, level, &devices, reset);
            }
            Step::Unfence(_) => {
                let _ = self.unblock_storage(f);
            }
            Step::PowerOn(devices) => {
                self.bmc_power_on(f, &devices);
            }
            _ => {}
        }
    }

    /// Whether machine `i`'s devices act on a command carrying `token`. A bridge (even
    /// machines) raises its floor to the token and refuses a lower one, as the firmware-bridge
    /// does; directly reached devices (odd machines) act on anything.
    fn bridge_admits(&mut self, i: usize, token: i64) -> bool {
        if i % 2 == 1 {
            return true;
        }
        let floor = self.floors[i];
        if token >= floor {
            self.floors[i] = token;
            return true;
        }
        if self.bug == Some(Bug::IgnoreStaleTokens) {
            if self.broken_promise.is_none() {
                self.broken_promise = Some(format!(
                    "the firmware-bridge of m{i} acted on fencing token {token} after token {floor}: tokens only go up per target"
                ));
            }
            return true;
        }
        self.log(format!(
            "the firmware-bridge of m{i} refuses stale token {token} (floor {floor})"
        ));
        false
    }

    /// Sends a level's device commands for fence `f` and reads each back: whether every device
    /// verified, and the evidence. A reset level resets the machine (power devices) only once
    /// every storage block before it was verified, as the controller does; a reset proves
    /// nothing and fails nothing.
    fn drive_devices(
        &mut self,
        f: usize,
        level: i32,
        devices: &[PlannedDevice],
        reset: bool,
    ) -> (bool, Vec<Evidence>) {
        let i = self.fences[f].node;
        let wall = self.wall();
        let reset = reset && self.bug != Some(Bug::PowerOffInsteadOfReset);
        let mut evidence = Vec::new();
        let mut ok = true;
        for d in devices {
            let b = match d.kind {
                DeviceKind::Power => match self.planned_bmc(f, &d.url) {
                    Some(b) => b,
                    None => {
                        ok = false;
                        continue;
                    }
                },
                DeviceKind::Storage => i,
            };
            if reset && d.kind == DeviceKind::Power {
                if ok && self.machines[b].power_mode.obeys() {
                    self.bmc_command(i, b, "a reset");
                    self.reset_machine(b);
                }
                continue;
            }
            if d.kind == DeviceKind::Power {
                self.power_command(i, b, "a power off");
            }
            let (mode, kind) = match d.kind {
                DeviceKind::Power => (self.machines[b].power_mode, EvidenceKind::PowerOff),
                DeviceKind::Storage => {
                    (self.machines[i].storage_mode, EvidenceKind::StorageBlocked)
                }
            };
            if mode == DeviceMode::Fails {
                ok = false;
                continue;
            }
            if mode.obeys() {
                match d.kind {
                    DeviceKind::Power => self.power_off(b),
                    DeviceKind::Storage => {
                        let hold = self.fences[f].name.clone();
                        self.machines[i].storage_holds.insert(hold);
                    }
                }
            }
            let verified = match d.kind {
                // Read through the same pinned BMC.
                DeviceKind::Power => {
                    let m = &self.machines[b];
                    m.power_mode.read_power(m.powered) == PowerReading::Off
                }
                DeviceKind::Storage => !self.machines[i].storage_holds.is_empty(),
            };
            if verified || self.bug == Some(Bug::TrustCommand) {
                evidence.push(Evidence {
                    level,
                    device: d.url.clone(),
                    kind,
                    observed: "read back".into(),
                    at: MicroTime(wall),
                });
            } else {
                ok = false;
            }
        }
        (ok, evidence)
    }

    /// Sends fence `f`'s storage unblock: the firewall lifts the fence's own hold (every hold,
    /// under [`Bug::NodeWideUnblock`]). Returns whether the firewall acknowledged it.
    fn unblock_storage(&mut self, f: usize) -> bool {
        let i = self.fences[f].node;
        let name = self.fences[f].name.clone();
        let at_fence = self.fences[f].status.recovery.boot_id_at_fence.clone();
        let now_boot = self.boot_id(i);
        if self.s.nodes[i].fencing == Fencing::StorageThenReset
            && self.broken_promise.is_none()
            && at_fence.as_ref().is_none_or(|b| *b == now_boot)
        {
            self.broken_promise = Some(format!(
                "{name}: storage of a host that must not power off unblocked in boot {now_boot}, not newer than {at_fence:?} when fencing began"
            ));
        }
        if self.machines[i].storage_mode == DeviceMode::Works {
            if self.bug == Some(Bug::NodeWideUnblock) {
                self.machines[i].storage_holds.clear();
            } else {
                self.machines[i].storage_holds.remove(&name);
            }
        }
        self.machines[i].storage_mode != DeviceMode::Fails
    }

    /// A new controller: a higher token, no memory (its streaks start blind, as the
    /// operator's `Ctx::new`).
    fn restart_controller(&mut self) {
        let sight = self.fresh_sight();
        self.replace_controller(sight);
    }

    /// The standby takes over (the leader died at once, or was deposed): in three takeovers
    /// of four it is warm, with its memory (as the operator's replicas keep theirs); in the
    /// others it had just restarted itself. A new cold standby starts beside it.
    fn take_over(&mut self) {
        let warm = self.standby_rng.below(4) != 0;
        let fresh = self.fresh_sight();
        let mut standby = std::mem::replace(&mut self.standby, fresh);
        if self.bug == Some(Bug::StandbyIgnoresBlindSpell) {
            standby.lost_api = false;
            standby.last_tick = Some(self.now);
        }
        if warm {
            self.log("a warm standby takes over with its memory".to_string());
            self.out.warm_takeovers += 1;
            self.replace_controller(standby);
        } else {
            self.restart_controller();
        }
    }

    /// The API came back after an outage longer than the leader's Lease: the leader's term
    /// lapsed (the operator's `Leadership::token` is `None` once its last renewal is older
    /// than the lease duration), and the replicas' election rounds race for the Lease. The
    /// standby, which saw the Lease unchanged for longer than its duration, takes it over
    /// with a higher token half the time (warm, as [`World::take_over`] draws it), and the
    /// deposed leader stands by with its memory; otherwise the leader renews its own term.
    fn term_lapsed(&mut self) {
        let leader_frozen = self.frozen.as_ref().is_some_and(|f| !f.deposed);
        if !self.ctl.up || leader_frozen {
            return;
        }
        self.out.lapsed_terms += 1;
        if self.standby_rng.below(2) == 0 {
            self.log("the leader's term lapsed in the outage: it renews it".to_string());
            return;
        }
        self.log("the leader's term lapsed in the outage: the standby takes the Lease".to_string());
        let deposed = std::mem::take(&mut self.ctl.sight);
        self.take_over();
        self.standby = deposed;
    }

    /// The sight of a replica that starts now (it has seen nothing yet).
    fn fresh_sight(&self) -> Sight {
        let mut memory = Memory::started(self.clocks().mono);
        if self.bug == Some(Bug::IgnoreBlindSpell) {
            memory.streaks = Streaks::new();
        }
        Sight {
            memory,
            ..Sight::default()
        }
    }

    /// A new leader with `sight`, a higher token, and none of the old leader's in-process
    /// state (its watch of untaints, its power watch).
    fn replace_controller(&mut self, sight: Sight) {
        self.ctl = Controller {
            up: true,
            token: self.ctl.token + 1,
            sight,
            untainted_since: HashMap::new(),
            power: Watch::default(),
        };
    }

    /// The invariants.
    /// The claims of a pod of an identity backed by `backing`, as release reads them.
    fn claims(&self, backing: Backing) -> Vec<ClaimBacking> {
        let class = match backing {
            Backing::None => return Vec::new(),
            Backing::Array => ARRAY_CLASS,
            // The old rule: a storage block covers any claim, whatever backs it.
            Backing::Elsewhere if self.bug == Some(Bug::IgnoreStorageScope) => ARRAY_CLASS,
            Backing::Elsewhere => ELSEWHERE_CLASS,
        };
        vec![ClaimBacking::Known {
            storage_class: class.into(),
            driver: None,
            volume: None,
        }]
    }

    /// The advertisement the controller last observed for node `name`, as its rules read it
    /// (with [`Bug::TrustBeforeWatchdog`], the watchdog's timeout read as none; with
    /// [`Bug::OneWatchdogPeriod`], as half, which the rules count twice).
    fn advertisement_for_decide(&self, name: &str) -> Advertisement {
        let mut ad = self.ctl.sight.memory.advertised_by(name);
        if let Some(w) = ad.watchdog.as_mut() {
            match self.bug {
                Some(Bug::TrustBeforeWatchdog) => w.timeout = Duration::ZERO,
                Some(Bug::OneWatchdogPeriod) => w.timeout /= 2,
                _ => {}
            }
        }
        ad
    }

    fn check(&self) -> Option<Violation> {
        if let Some(what) = &self.broken_promise {
            return Some(self.violation(Invariant::Promise, what.clone()));
        }
        if let Some(what) = &self.causeless {
            return Some(self.violation(Invariant::CauselessFence, what.clone()));
        }
        // A fence that went (deleted) once it held nothing more on its node (its recovery
        // proved its released pods gone) counts; one that went while it held does not.
        if let Some(uid) = self.released_uids.iter().find(|uid| {
            !self
                .fences
                .iter()
                .filter(|f| f.deletion != Deletion::Gone { holding: true })
                .any(|f| {
                    let r = &f.status.release;
                    r.pods
                        .iter()
                        .chain(r.releasing.iter())
                        .any(|p| &p.uid == *uid)
                })
        }) {
            return Some(self.violation(
                Invariant::ReleaseRecorded,
                format!("pod {uid} was deleted by a release that no NodeFence status records"),
            ));
        }
        for (id, (name, backing)) in self.identities.iter().enumerate() {
            let mut live: BTreeMap<&str, usize> = BTreeMap::new();
            for (i, m) in self.machines.iter().enumerate() {
                if !m.powered {
                    continue;
                }
                // Only the array's claims are cut off by its block; a claim elsewhere (and a
                // pod without one) still does harm from a powered machine.
                let harmful = match backing {
                    Backing::Array => m.storage_holds.is_empty() && !m.cut_all,
                    Backing::Elsewhere => !m.cut_all,
                    Backing::None => true,
                };
                for c in &m.containers {
                    let ours = self.pods.iter().any(|p| &p.uid == c && p.identity == id);
                    if ours && harmful {
                        live.insert(c, i);
                    }
                }
            }
            if live.len() > 1 {
                return Some(self.violation(
                    Invariant::AtMostOne,
                    format!(
                        "at-most-one broken for {name}-0: live copies {live:?} (uid → machine)"
                    ),
                ));
            }
        }
        None
    }

    fn violation(&self, invariant: Invariant, what: String) -> Violation {
        let from = self.history.len().saturating_sub(40);
        Violation {
            at_ms: self.now,
            invariant,
            what,
            history: self.history[from..].to_vec(),
        }
    }

    fn target(&self, i: usize) -> Option<FenceTargetSpec> {
        self.target_listing(i, &self.bmc_url[i])
    }

    /// Node `i`'s FenceTarget with its BMC at `bmc_url`.
    fn target_listing(&self, i: usize, bmc_url: &str) -> Option<FenceTargetSpec> {
        let dev = |url: &str, kind| FenceDevice {
            url: url.into(),
            kind,
            credentials_secret_ref: Some(SecretRef {
                name: "device".into(),
                namespace: "palisade-system".into(),
                keys: BTreeMap::new(),
            }),
            timeout_seconds: 10,
            fences: (kind == DeviceKind::Storage).then(|| StorageScope {
                storage_classes: vec![ARRAY_CLASS.into()],
                csi_drivers: vec![],
            }),
        };
        let power = dev(bmc_url, DeviceKind::Power);
        let storage = dev("storagefw+https://array:8443/", DeviceKind::Storage);
        let devices = match self.s.nodes[i].fencing {
            Fencing::Power => vec![power],
            Fencing::Storage => vec![storage],
            Fencing::PowerAndStorage => vec![power, storage],
            // Listed power first: the plan must still block the storage before the reset.
            Fencing::StorageThenReset => vec![power, storage],
            Fencing::None => return None,
        };
        let power_off = if self.s.nodes[i].fencing == Fencing::StorageThenReset {
            PowerOff::Disallowed
        } else {
            PowerOff::Allowed
        };
        Some(FenceTargetSpec {
            levels: vec![FenceLevel {
                name: "level".into(),
                devices,
                power_off,
            }],
        })
    }

    /// One tick of a replica's sight and memory, as the operator's detector tick
    /// (`detect::observe` with `sight.rs`): a gap between two ticks (the API down, the replica
    /// frozen) is a blind spell, from whose end silence counts and after which writes first
    /// observed start no streak; then every Node's heartbeat, through a watch that lags by
    /// `lag` ms. Every replica does this, the leader and its warm standby alike.
    fn observe_into(&self, sight: &mut Sight, lag: u64) {
        let clocks = self.clocks();
        let blind = std::mem::take(&mut sight.lost_api)
            || sight
                .last_tick
                .is_some_and(|t| self.now.saturating_sub(t) > BLIND_GAP_MS);
        let memory = &mut sight.memory;
        if blind && self.bug == Some(Bug::IgnoreBlindSpell) {
            // Not part of the planted bug: the old controller that forgot its blind spells
            // had no late-renewal evidence either, and this keeps that evidence from standing
            // in for the rule the bug removes.
            memory.detector.blind(clocks.mono);
        } else if blind {
            memory.blind(clocks.mono);
            memory.guard_held(SIM_POLICY, clocks.mono);
        }
        sight.last_tick = Some(self.now);
        let seen_at = self.now.saturating_sub(lag);
        memory.nodes_now(
            self.members()
                .into_iter()
                .map(|i| self.machines[i].name.as_str()),
        );
        let trust_without_watchdog = self.bug == Some(Bug::TrustWithoutWatchdog);
        for i in self.members() {
            let name = self.machines[i].name.clone();
            let (count, stamp, lease_ad) = self.lease_log[i]
                .iter()
                .rev()
                .find(|(t, _, _, _)| *t <= seen_at)
                .map(|(_, c, st, a)| (*c, *st, a.clone()))
                .unwrap_or_default();
            let hb = lease_heartbeat(count, &lease_ad);
            let kubelet_times_companions =
                self.bug == Some(Bug::KubeletRenewalKeepsCompanionHealthy);
            // The healthy majority: every observed Lease write (count 0: never written, no
            // renewTime), stamped by the node's clock, observed now.
            let renew = (count > 0).then(|| at_ms(stamp));
            memory.observe(&name, hb, renew, clocks, || {
                let mut ad = lease_ad;
                if kubelet_times_companions {
                    ad.companion_written = None;
                }
                if trust_without_watchdog && ad.self_fence_after.is_some() {
                    ad.watchdog = Some(Watchdog {
                        timeout: Duration::from_secs(1),
                        nowayout: true,
                        action: Some(WatchdogAction::Reset),
                        driver: None,
                    });
                }
                ad
            });
        }
    }

    /// The warm standby's tick: it observes as the leader does (its own watch lag) and
    /// records when the policy's quorum guard holds in its own snapshot, so that it takes over
    /// with its history, as the operator's replicas do.
    fn standby_tick(&mut self) {
        let lag = self.standby_rng.below(MAX_WATCH_LAG_MS + 1);
        let mut sight = std::mem::take(&mut self.standby);
        self.observe_into(&mut sight, lag);
        // Its guard holds from its own memory: the snapshot reads the leader's fields, so the
        // standby's memory stands in for them while it is taken.
        std::mem::swap(&mut self.ctl.sight.memory, &mut sight.memory);
        let clocks = self.clocks();
        let holding = guards_holding(&self.snapshot(clocks));
        std::mem::swap(&mut self.ctl.sight.memory, &mut sight.memory);
        if self.bug == Some(Bug::StandbyForgetsGuard) {
            sight.memory.guard_held.clear();
        } else {
            for policy in holding {
                sight.memory.guard_held(&policy, clocks.mono);
            }
        }
        self.standby = sight;
    }

    fn controller(&mut self) {
        let clocks = self.clocks();
        // Observe heartbeats, through a watch that lags by up to MAX_WATCH_LAG_MS.
        let lag = self.rng.below(MAX_WATCH_LAG_MS + 1);
        let mut sight = std::mem::take(&mut self.ctl.sight);
        self.observe_into(&mut sight, lag);
        self.ctl.sight = sight;
        // Decide (in node order: a replay creates the same fences in the same order).
        let snapshot = self.snapshot(clocks);
        let verdicts: BTreeMap<String, Verdict> = decide(&snapshot)
            .into_iter()
            .map(|d| (d.node, d.verdict))
            .collect();
        for policy in guards_holding(&snapshot) {
            self.ctl.sight.memory.guard_held(&policy, clocks.mono);
        }
        for (node, v) in &verdicts {
            let Some(i) = self.machines.iter().position(|m| &m.name == node) else {
                continue;
            };
            let open = self.fences.iter().any(|f| f.node == i && f.open());
            if let (Verdict::Fence(plan), false) = (v, open) {
                // As the operator's `detect::create_fence`: fence only if the API itself still
                // holds the heartbeat the detector judged silent (a renewal the watch has not
                // delivered yet is not silence).
                let watched = self.ctl.sight.memory.detector.marker(node);
                if self.bug != Some(Bug::FenceOnWatchedSilence)
                    && watched != Some(self.stored_marker(i))
                {
                    self.log(format!("not fencing m{i}: the watch is behind"));
                    continue;
                }
                let name = self.create_fence(i, RequestedBy::Controller);
                self.log(format!("NodeFence {name} created{}", plan.cause.words()));
                if std::mem::take(&mut self.pending_deleted[i]) {
                    self.out.refenced += 1;
                }
                if matches!(plan.cause, Cause::PowerOff { .. }) {
                    self.out.power_fences += 1;
                }
                self.check_cause(i, &name);
            }
        }
        // Reconcile every unfinished fence (the worker re-reads its fence at every step: one
        // that is gone acts no more).
        for f in 0..self.fences.len() {
            if !self.fences[f].listed() {
                continue;
            }
            if self.remove_finalizer(f) {
                continue;
            }
            for _ in 0..16 {
                if self.fences[f].status.phase.is_terminal() {
                    break;
                }
                let node = self.fences[f].node;
                let verdict = verdicts.get(&self.machines[node].name).cloned();
                self.watch_untaint(f);
                let step = {
                    let obs = self.observations(f, verdict.as_ref());
                    next_step(&self.fences[f].spec, &self.fences[f].status, &obs)
                };
                if matches!(
                    step,
                    Step::Nothing | Step::Wait { .. } | Step::Hold(_) | Step::Refuse { .. }
                ) {
                    break;
                }
                let command = matches!(
                    step,
                    Step::RunLevel { .. } | Step::Unfence(_) | Step::PowerOn(_)
                );
                if let Some(ms) = self.freeze_trap.filter(|_| command) {
                    self.freeze_trap = None;
                    self.log(format!(
                        "leader (token {}) freezes for {ms} ms before its {} for {}",
                        self.ctl.token,
                        step.label(),
                        self.fences[f].name
                    ));
                    self.frozen = Some(Frozen {
                        until: self.now + ms,
                        takeover_at: self.now + LEADER_LEASE_MS,
                        token: self.ctl.token,
                        pending: (f, step),
                        deposed: false,
                        listed: self.bmc_url[node].clone(),
                    });
                    return;
                }
                self.apply(f, step);
            }
            self.remove_finalizer(f);
        }
    }

    /// As the operator's worker (`reconcile::work`): a deleted fence whose finalizer held it
    /// while it held its node goes once it holds nothing
    /// ([`palisade_model::nodefence::NodeFenceStatus::holds_node`]: its recovery lifted its
    /// block and taints after the clean proof). Whether it went.
    fn remove_finalizer(&mut self, f: usize) -> bool {
        if self.fences[f].deletion != Deletion::Waiting
            || !self.fences[f].status.finalizer_may_go(true)
        {
            return false;
        }
        self.fences[f].deletion = Deletion::Gone { holding: false };
        let name = self.fences[f].name.clone();
        self.log(format!(
            "{name}: holds nothing more ({}): finalizer removed, deleted",
            self.fences[f].status.phase
        ));
        true
    }

    /// A person deletes node `i`'s newest NodeFence ([`Fault::DeleteFence`]) through the API
    /// server, as the operator meets it: one that holds nothing on its node carries no
    /// finalizer and is gone at once; one that holds something (from `Fencing` on) is kept by
    /// its finalizer, goes on as before, and goes when it holds nothing
    /// ([`World::remove_finalizer`]). A `Pending` fence deleted leaves the node to the
    /// decision, which fences it again, with a new fence, while it stays silent.
    fn delete_fence(&mut self, i: usize) {
        if !self.api_up {
            self.log(format!(
                "deletion of m{i}'s NodeFence fails: the API is down"
            ));
            return;
        }
        let Some(f) = (0..self.fences.len())
            .rev()
            .find(|&f| self.fences[f].node == i && self.fences[f].listed())
        else {
            return;
        };
        if self.fences[f].deletion == Deletion::Waiting {
            return;
        }
        self.out.deletions += 1;
        let name = self.fences[f].name.clone();
        let phase = self.fences[f].status.phase;
        let holds = self.fences[f].status.holds_node();
        if self.bug == Some(Bug::DeleteWithoutFinalizer) {
            self.fences[f].deletion = Deletion::Gone { holding: holds };
            let held = if holds {
                format!(" while it holds m{i}")
            } else {
                String::new()
            };
            self.log(format!(
                "{name} deleted by a person in {phase}: gone at once (no finalizer){held}"
            ));
        } else if holds {
            self.fences[f].deletion = Deletion::Waiting;
            self.out.deletions_held += 1;
            self.log(format!(
                "{name} deleted by a person in {phase}: its finalizer keeps it until its recovery"
            ));
        } else {
            self.fences[f].deletion = Deletion::Gone { holding: false };
            self.log(format!("{name} deleted by a person in {phase}: gone"));
        }
        if phase == Phase::Pending {
            self.pending_deleted[i] = true;
        }
    }

    /// A `NodeFence` for machine `i` that this leader's decision did not create
    /// ([`Fault::Request`]): a person's (any time the API answers), or a deposed replica's
    /// (only beside an unfinished fence of the node, as its list before the create let it
    /// through). Neither is checked for a cause: a person's is one, the replica's shares the
    /// first fence's.
    fn request(&mut self, i: usize, manual: bool) {
        let open = self.fences.iter().any(|f| f.node == i && f.open());
        if !self.api_up || !self.machines[i].member || (!manual && !open) {
            return;
        }
        let by = if manual {
            RequestedBy::Manual
        } else {
            RequestedBy::Controller
        };
        let name = self.create_fence(i, by);
        self.out.requests += 1;
        self.log(format!(
            "NodeFence {name} created by {by:?}, beside this leader's decision"
        ));
    }

    /// A `NodeFence` for machine `i`, created now on the API server by `by`; its name.
    fn create_fence(&mut self, i: usize, by: RequestedBy) -> String {
        let mut status = NodeFenceStatus::default();
        let _ = status.transition(Phase::Pending, self.wall(), "requested");
        let name = format!("{}-nf{}", self.machines[i].name, self.fences.len());
        self.out.fences += 1;
        let seconds = i64::try_from(self.now / 1_000).unwrap_or(0);
        let created = epoch()
            .checked_add(SignedDuration::from_secs(seconds))
            .unwrap_or(epoch());
        self.fences.push(Fence {
            name: name.clone(),
            node: i,
            spec: NodeFenceSpec {
                node_name: self.machines[i].name.clone(),
                reason: "silent".into(),
                requested_by: by,
                overrides: Default::default(),
            },
            status,
            created,
            deletion: Deletion::None,
        });
        name
    }

    /// The check that the fence the controller creates now for machine `i` has a cause: it
    /// has none when the machine was able to renew for the whole [`CAUSELESS_WINDOW_MS`]
    /// before.
    fn check_cause(&mut self, i: usize, fence: &str) {
        let Some(since) = self.machines[i].able_since else {
            return;
        };
        if self.now >= since + causeless_window_ms(self.s.scale) && self.causeless.is_none() {
            self.causeless = Some(format!(
                "causeless fence: {fence} created for m{i}, which was able to renew all along for the last {} ms (since {since} ms)",
                self.now - since
            ));
        }
    }

    /// A tick of the leader's power watch ([`crate::power`]) over the machines in the cluster:
    /// those whose FenceTarget has a power device are watched while the policy's power
    /// evidence can come before its silence, as the operator's `evidence_counts` says.
    fn power_watch(&mut self) {
        let d = &self.policy.detection;
        let counts =
            d.power_off_after_seconds > 0 && d.power_off_after_seconds < d.unhealthy_after_seconds;
        let members = self.members();
        let watchable: Vec<bool> = members
            .iter()
            .map(|&i| {
                counts
                    && self.target(i).is_some_and(|t| {
                        t.levels
                            .iter()
                            .flat_map(|l| &l.devices)
                            .any(|d| d.kind == DeviceKind::Power)
                    })
            })
            .collect();
        let under_way: Vec<bool> = members
            .iter()
            .map(|&i| {
                self.fences
                    .iter()
                    .any(|f| f.node == i && f.open() && f.status.phase != Phase::Pending)
            })
            .collect();
        let says: Vec<PowerReading> = members.iter().map(|&i| self.bmc_read(i)).collect();
        let views: Vec<NodeView> = members
            .iter()
            .enumerate()
            .map(|(k, &i)| NodeView {
                name: &self.machines[i].name,
                says: says[k],
                watchable: watchable[k],
                fence_under_way: under_way[k],
            })
            .collect();
        self.ctl.power.tick(self.now, &views, &mut self.watch_rng);
    }

    /// The renewal interval and off run the snapshot hands `decide()` for node `name`, whose
    /// last observed heartbeat change was at `last_change`: the detector's and the power
    /// watch's, or under [`Bug::PowerWithoutMissedRenewal`] a zero interval and the whole run
    /// moved to just after that change.
    fn power_evidence(&self, name: &str, last_change: Mono) -> (Option<Duration>, Option<OffRun>) {
        let gap = self.ctl.sight.memory.detector.renewal_gap(name);
        let run = self.ctl.power.off_run(name);
        if self.bug != Some(Bug::PowerWithoutMissedRenewal) {
            return (gap, run);
        }
        let mut forged = PowerWatch::new();
        if let Some(whole) = run.and_then(|r| r.whole()) {
            let first = last_change + Duration::from_millis(1);
            let last = first + whole.span();
            forged.observe(name, PowerReading::Off, first, first);
            forged.observe(name, PowerReading::Off, last, last);
        }
        (Some(Duration::ZERO), forged.off_run(name))
    }

    /// The controller's watch of fence `f`'s untaint (`reconcile::untainted_for`): since
    /// when, while the fence is Recovering, it has seen the node without release taints.
    fn watch_untaint(&mut self, f: usize) {
        let i = self.fences[f].node;
        if self.fences[f].status.phase == Phase::Recovering && !self.any_taint(i) {
            let now = self.clocks().mono;
            self.ctl.untainted_since.entry(f).or_insert(now);
        } else {
            self.ctl.untainted_since.remove(&f);
        }
    }

    /// The invariant that recovery keeps the storage block until the untaint has settled:
    /// before fence `f`'s unblock, its node carries no release taint and lost it at least
    /// [`UNTAINT_SETTLE_MARGIN`] ago (true time), else the promise is broken.
    fn untaint_settled_before_unblock(&mut self, f: usize) {
        let i = self.fences[f].node;
        let settled = !self.any_taint(i)
            && self.untainted_at[i]
                .is_some_and(|t| self.now >= t + UNTAINT_SETTLE_MARGIN.as_millis() as u64);
        if !settled && self.broken_promise.is_none() {
            self.broken_promise = Some(format!(
                "{}: storage of m{i} unblocked before the untaint settled (tainted {}, untainted at {:?} ms, now {} ms)",
                self.fences[f].name, self.any_taint(i), self.untainted_at[i], self.now
            ));
        }
    }

    fn snapshot(&self, now: Clocks) -> Snapshot {
        let nodes = self
            .members()
            .into_iter()
            .map(|i| {
                let name = self.machines[i].name.clone();
                let (fence, past) = FenceState::of(
                    self.fences
                        .iter()
                        .filter(|f| f.node == i && f.listed())
                        .map(|f| (&f.spec, Some(&f.status), Some(f.created))),
                );
                let last_change = self
                    .ctl
                    .sight
                    .memory
                    .detector
                    .last_change(&name)
                    .unwrap_or(now.mono);
                let (renewal_gap, power_off) = self.power_evidence(&name, last_change);
                NodeSnapshot {
                    labels: Default::default(),
                    last_heartbeat_change: last_change,
                    heartbeat_marker: self
                        .ctl
                        .sight
                        .memory
                        .detector
                        .sighting(&name)
                        .map(|s| s.marker),
                    renewal_gap,
                    long_gaps: self.ctl.sight.memory.detector.long_gaps(&name),
                    power_off,
                    hosts_bridge: false,
                    exclusion: None,
                    advertisement: self.advertisement_for_decide(&name),
                    fence_target: self.target(i).map(palisade_decide::snapshot::Lent::from),
                    pods: self
                        .pods
                        .iter()
                        .filter(|p| p.node == i && !p.deleted)
                        .map(|p| PodSnapshot {
                            namespace: "app".into(),
                            name: format!("{}-0", self.identities[p.identity].0),
                            labels: BTreeMap::new(),
                            priority: 0,
                            unreachable: Tolerance::from_tolerations(&[]),
                            uses_rwo_volume: self.identities[p.identity].1 != Backing::None,
                        })
                        .collect(),
                    fence,
                    past_fences: past,
                    name,
                }
            })
            .collect();
        Snapshot {
            now,
            policies: vec![PolicySnapshot {
                name: SIM_POLICY.into(),
                spec: self.policy.clone(),
                guard_held_at: self.ctl.sight.memory.guard_held.get(SIM_POLICY).copied(),
            }],
            nodes,
            pdbs: vec![],
        }
    }

    fn observations<'a>(&'a self, f: usize, verdict: Option<&'a Verdict>) -> Observations<'a> {
        let fence = &self.fences[f];
        let i = fence.node;
        let name = &self.machines[i].name;
        let now = self.clocks();
        let st = &fence.status;
        let since = st
            .verified_fence()
            .map(|v| v.at())
            .or_else(|| st.transitions.first().map(|t| t.at.0))
            .unwrap_or(now.wall);
        let node_healthy = self.ctl.sight.memory.healthy_since(
            name,
            since,
            Thresholds::from(&self.policy.detection),
            SETTLE,
            now,
        );
        let advertised = self.ctl.sight.memory.advertised_by(name);
        let margin = Duration::from_secs(
            u64::try_from(self.policy.trust_self_fence.margin_seconds).unwrap_or(0),
        );
        // As `reconcile::peer_trust`, through the shared memory; the planted bugs change
        // its inputs (the member set, the instant judged, the watchdog) or skip it.
        let mut ad = self.advertisement_for_decide(name);
        if self.bug == Some(Bug::PeerTrustWithoutWatchdog) {
            ad.watchdog = None;
        }
        let memory = &self.ctl.sight.memory;
        let peer_trust = match self.bug {
            Some(Bug::IgnoreMajorityBound) => PeerTrust::NotPeerChecked,
            Some(Bug::LatestListOnly) => {
                let latest: palisade_decide::majority::Members = self
                    .members()
                    .into_iter()
                    .map(|i| self.machines[i].name.clone())
                    .collect();
                memory.peer_trust_among(Some(&latest), &ad, margin, now.mono)
            }
            Some(Bug::WallClockStreaks) => {
                // Judged at the instant the wall clock reads, as if it had never stepped (and
                // the bound compared with it the same way).
                let step = Duration::from_millis(self.ctl_wall_offset_ms.unsigned_abs());
                let shift = |m: Mono, back: bool| {
                    if back {
                        Mono(m.0.saturating_sub(step))
                    } else {
                        m + step
                    }
                };
                let stepped_back = self.ctl_wall_offset_ms < 0;
                let members = ad
                    .peer_check
                    .and_then(|p| p.members)
                    .and_then(|m| memory.members.get(m));
                match memory.peer_trust_among(members, &ad, margin, shift(now.mono, stepped_back)) {
                    PeerTrust::From(t) => PeerTrust::From(shift(t, !stepped_back)),
                    other => other,
                }
            }
            _ => memory.peer_trust(&ad, margin, now.mono),
        };
        // The planted bug forgets that the fence reset the machine (any proof will do).
        let forgetful;
        let st_for_proof = if self.bug == Some(Bug::UnblockWithoutNewBoot) {
            let mut copy = st.clone();
            for l in copy.plan.iter_mut().flat_map(|p| p.levels.iter_mut()) {
                if l.kind == LevelKind::StorageThenReset {
                    l.kind = LevelKind::Hardware;
                }
            }
            forgetful = copy;
            &forgetful
        } else if self.bug == Some(Bug::FirstReleasedPodOnly) {
            let mut copy = st.clone();
            copy.release.pods.truncate(1);
            forgetful = copy;
            &forgetful
        } else {
            st
        };
        // The planted bug takes any inventory as if it answered the challenge.
        let answered = if self.bug == Some(Bug::IgnoreChallenge) {
            Advertisement {
                challenge: Some(fence.name.clone()),
                ..advertised.clone()
            }
        } else {
            advertised.clone()
        };
        // The pods the API binds to the node now (the proof is per node), terminating ones
        // whose finalizer holds them included, as a list of the node's pods returns them.
        let bound: BTreeSet<String> = self
            .pods
            .iter()
            .filter(|p| p.node == i && p.in_api(self.now))
            .map(|p| p.uid.clone())
            .collect();
        let clean = (st.phase == Phase::Recovering)
            .then(|| clean_proof(st_for_proof, &answered, &fence.name, &bound))
            .flatten();
        // The planted bug takes a changed boot ID as the proof on its own.
        let clean = match (&st.recovery.boot_id_at_fence, &advertised.boot_id) {
            (Some(before), Some(now))
                if self.bug == Some(Bug::BootIdAlone)
                    && st.phase == Phase::Recovering
                    && before != now =>
            {
                Some(format!("boot ID changed from {before} to {now}"))
            }
            _ => clean,
        };
        let released: BTreeSet<&str> = st.release.pods.iter().map(|p| p.uid.as_str()).collect();
        let pods_on_node = if st.phase == Phase::Releasing {
            self.pods
                .iter()
                .filter(|p| p.node == i && !p.deleted && !released.contains(p.uid.as_str()))
                .map(|p| NodePod {
                    pod: ObjectRef {
                        namespace: "app".into(),
                        name: format!("{}-0", self.identities[p.identity].0),
                        uid: p.uid.clone(),
                    },
                    claims: self.claims(self.identities[p.identity].1),
                })
                .collect()
        } else {
            Vec::new()
        };
        // While a self-fence may be trusted or released on, the controller reads the Lease
        // fresh from the API (a quorum read): watch lag must not hide a renewal.
        let fresh_or_watched =
            if matches!(st.phase, Phase::Fencing | Phase::Fenced | Phase::Releasing) {
                Some(self.stored_marker(i))
            } else {
                self.ctl.sight.memory.detector.marker(name)
            };
        let (last_renewal, watched_silence) =
            self.ctl
                .sight
                .memory
                .renewal_seen(name, fresh_or_watched.as_deref(), now);
        Observations {
            now,
            token: self.ctl.token,
            verdict,
            recovery: Some(&self.policy.recovery),
            pods_on_node,
            attachments: vec![],
            attach_records: vec![],
            node_healthy,
            last_renewal,
            watched_silence: if self.bug == Some(Bug::WallClockOnly) {
                Some(std::time::Duration::MAX)
            } else {
                watched_silence
            },
            heartbeat_marker: fresh_or_watched,
            self_fence_wait: self
                .advertisement_for_decide(name)
                .trust_wait(margin, self.policy.trust_self_fence.virtual_machines),
            peer_trust,
            clean_proof: clean,
            challenge_posted: self.node_challenge[i].as_deref() == Some(fence.name.as_str()),
            taints_added: self.taint_keys(i, |owner| owner == Some(f)),
            taints_foreign: self.taint_keys(i, |owner| owner != Some(f)),
            // No VolumeAttachments are simulated: nothing detaches.
            unsettled_attachments: vec![],
            untainted_for: self.ctl.untainted_since.get(&f).map(|c| now.mono.since(*c)),
            node_uid: Some(format!("uid-{name}")),
            node_system_uuid: Some(self.node_uuid(i)),
            advertised_system_uuid: advertised.system_uuid.clone(),
            proof_from: palisade_decide::phase::ProofFrom::Agent(answered.system_uuid.clone()),
            older_sibling: palisade_decide::guard::older_sibling(
                self.fences
                    .iter()
                    .filter(|f| f.listed())
                    .map(Fence::sibling),
                &fence.sibling(),
            )
            .filter(|_| self.bug != Some(Bug::IgnoreSibling)),
            // Budgets on the wall clock alone, as the recorded schedules were found with.
            phase_seen_for: None,
        }
    }

    /// Whether Node `i` carries any release taint (either key, anyone's).
    fn any_taint(&self, i: usize) -> bool {
        self.tainted[i] || self.out_of_service[i].is_some()
    }

    /// The release-taint keys on Node `i` whose recorded owner passes `whose`.
    fn taint_keys(&self, i: usize, whose: impl Fn(Option<usize>) -> bool) -> Vec<String> {
        let mut keys = Vec::new();
        if self.tainted[i] && whose(self.taint_owner[i]) {
            keys.push(FENCED_TAINT_KEY.into());
        }
        if self.out_of_service[i].is_some_and(|o| whose(o.owner)) {
            keys.push(OUT_OF_SERVICE_TAINT_KEY.into());
        }
        keys
    }

    /// Fence `f` puts the out-of-service taint on Node `i`. Kubernetes' pod GC first acts on
    /// it within a pass: half the time within 2 s (a pass that was about to run), else
    /// anywhere in its 20 s period.
    fn taint_out_of_service(&mut self, i: usize, f: usize) {
        let within = if self.podgc_rng.below(2) == 0 {
            2_000
        } else {
            POD_GC_PERIOD_MS
        };
        let gc_at = self.now + self.podgc_rng.below(within / TICK_MS + 1) * TICK_MS;
        self.out_of_service[i] = Some(OutOfService {
            owner: Some(f),
            gc_at,
        });
        self.log(format!(
            "{}: out-of-service taint on m{i} (pod GC in {} ms)",
            self.fences[f].name,
            gc_at - self.now
        ));
    }

    /// Kubernetes acting on out-of-service taints: on each pass, the pod GC force-deletes
    /// every pod still bound to a tainted Node. Such a deletion is a release (the StatefulSet
    /// replaces the pod at once), and the checker holds it to the same rule as Palisade's:
    /// some NodeFence must record it.
    fn pod_gc(&mut self) {
        if !self.api_up {
            return;
        }
        for i in 0..self.out_of_service.len() {
            let Some(o) = self.out_of_service[i] else {
                continue;
            };
            if self.now < o.gc_at {
                continue;
            }
            self.out_of_service[i] = Some(OutOfService {
                gc_at: self.now + POD_GC_PERIOD_MS,
                ..o
            });
            let doomed: Vec<String> = self
                .pods
                .iter()
                .filter(|p| p.node == i && !p.deleted)
                .map(|p| p.uid.clone())
                .collect();
            for uid in doomed {
                self.delete_pod(&uid);
                self.released_uids.insert(uid.clone());
                self.log(format!(
                    "pod GC force-deleted pod {uid} on m{i} (out-of-service taint)"
                ));
            }
        }
    }

    /// Releases `pod` as the operator's reconcile does: the write-ahead record, then the deletion. One
    /// release in eight, the controller dies right after the deletion and another takes over
    /// at once (its next round finishes the record): then `false`, else the caller records
    /// the release through the core.
    /// Deletes a pod: a pod of the identity whose pods carry a finalizer
    /// ([`World::finalized`]) stays in the API, terminating and bound to its node, until its
    /// own controller removes the finalizer 1–90 s later.
    fn delete_pod(&mut self, uid: &str) {
        let now = self.now;
        let linger = 1_000 + self.finalizer_rng.below(89_001);
        if let Some(p) = self.pods.iter_mut().find(|p| p.uid == uid && !p.deleted) {
            p.deleted = true;
            if Some(p.identity) == self.finalized {
                p.object_until = Some(now + linger);
            }
        }
    }

    fn release_pod(&mut self, f: usize, pod: &ObjectRef) -> bool {
        if self.bug != Some(Bug::RecordAfterDelete) {
            let wall = self.wall();
            record::intend_release(&mut self.fences[f].status, pod, wall);
        }
        self.delete_pod(&pod.uid);
        self.released_uids.insert(pod.uid.clone());
        if self.crash_rng.below(8) == 0 {
            self.log(format!(
                "{}: controller crashed after deleting pod {}, before recording it",
                self.fences[f].name, pod.uid
            ));
            self.take_over();
            return false;
        }
        self.out.released += 1;
        true
    }

    /// A planted release outside the state machine (the pod deleted, then its release
    /// recorded as a leader that resumes would).
    fn planted_release(&mut self, f: usize, pod: ObjectRef) {
        if self.release_pod(f, &pod) {
            self.record(f, &Step::RecordReleased(pod), Answer::Nothing);
        }
    }

    /// Records `step`, whose simulated I/O answered `answer`, in fence `f`'s status through
    /// the controller's core ([`record::apply`]). A step the status refuses (a stale command
    /// applied after the fence moved on) changes nothing, as the operator's failed write would.
    fn record(&mut self, f: usize, step: &Step, answer: Answer) {
        let wall = self.wall();
        let i = self.fences[f].node;
        let node = self.machines[i].name.clone();
        let name = self.fences[f].name.clone();
        let token = self.ctl.token;
        let mut status = self.fences[f].status.clone();
        let facts = record::Facts {
            node: &node,
            at: wall,
            token,
            leader: "sim",
            challenge: &name,
            kept_taints: &[],
        };
        match record::apply(&mut status, step, answer, facts) {
            Ok(r) => {
                self.fences[f].status = status;
                if let Some(note) = r.note {
                    self.log(format!("{name}: {}: {}", note.reason, note.message));
                }
            }
            Err(e) => self.log(format!("{name}: {} not recorded: {e}", step.label())),
        }
    }

    fn apply(&mut self, f: usize, mut step: Step) {
        let i = self.fences[f].node;
        if matches!(step, Step::Supersede(_)) {
            self.out.superseded += 1;
        }
        let label = step.label();
        let name = self.fences[f].name.clone();
        if matches!(
            step,
            Step::RunLevel { .. } | Step::PowerOn(_) | Step::Unfence(_)
        ) && !self.bridge_admits(i, self.ctl.token)
        {
            // The leader's own token is never below a floor it or an older leader raised.
            self.log(format!("{name}: {label} refused for a stale token"));
            return;
        }
        if let (Step::PinNode(p), Some(Bug::PinWithoutMachine)) = (&mut step, self.bug) {
            p.system_uuid = None;
        }
        // The step's simulated I/O; its answer is recorded by the core below.
        let answer = match &step {
            Step::StartFencing { .. } => Answer::Started {
                boot_id: self
                    .ctl
                    .sight
                    .memory
                    .advertised
                    .get(&self.machines[i].name)
                    .and_then(|a| a.boot_id.clone()),
                verdict: None,
            },
            Step::RunLevel {
                level,
                devices,
                reset,
            } => {
                let (ok, evidence) = self.drive_devices(f, *level, devices, *reset);
                let first = Self::initial_bmc_url(i);
                if ok
                    && evidence
                        .iter()
                        .any(|e| e.kind == EvidenceKind::PowerOff && e.device != first)
                {
                    self.out.edited_verified += 1;
                }
                Answer::Level(LevelRun {
                    evidence,
                    failure: (!ok).then(|| "a device did not verify".to_string()),
                    ..LevelRun::default()
                })
            }
            Step::HoldPod(pod) if self.bug == Some(Bug::ReleaseUncovered) => {
                self.planted_release(f, pod.clone());
                return;
            }
            Step::HoldPod(_) => {
                self.out.held += 1;
                Answer::Nothing
            }
            Step::PostChallenge => {
                self.node_challenge[i] = Some(name.clone());
                Answer::Nothing
            }
            Step::ApplyTaint(_, which) => {
                // A taint already there is not this fence's (and not recorded as its).
                let no_schedule = *which == ReleaseTaints::NoSchedule;
                if !self.tainted[i] {
                    self.tainted[i] = true;
                    self.taint_owner[i] = Some(f);
                }
                let old_order = no_schedule && self.bug == Some(Bug::OutOfServiceFirst);
                if (!no_schedule || old_order) && self.out_of_service[i].is_none() {
                    self.taint_out_of_service(i, f);
                }
                Answer::Nothing
            }
            Step::ReleasePod(_, pod) => {
                if !self.release_pod(f, pod) {
                    return;
                }
                Answer::Nothing
            }
            Step::PowerOn(devices) => Answer::Recovery {
                attempts: Vec::new(),
                result: if self.bmc_power_on(f, devices) {
                    Ok(())
                } else {
                    Err("the BMC did not power the machine on".into())
                },
            },
            Step::Unfence(_) => {
                self.untaint_settled_before_unblock(f);
                Answer::Recovery {
                    attempts: Vec::new(),
                    result: if self.unblock_storage(f) {
                        Ok(())
                    } else {
                        Err("the storage did not lift the block".into())
                    },
                }
            }
            Step::RemoveTaint => {
                if self.bug == Some(Bug::UnfenceBeforeUntaint)
                    && self.fences[f].status.recovery.unfenced_at.is_none()
                {
                    self.untaint_settled_before_unblock(f);
                    if self.unblock_storage(f) {
                        let wall = self.wall();
                        self.fences[f].status.recovery.unfenced_at = Some(MicroTime(wall));
                        self.log(format!("{name}: storage unfenced before the untaint"));
                    }
                }
                // Only the taints this fence recorded adding (one Node update with the record).
                let oos_owned = self.out_of_service[i].is_some_and(|o| o.owner == Some(f));
                if self.taint_owner[i] == Some(f) || oos_owned {
                    if self.taint_owner[i] == Some(f) {
                        self.tainted[i] = false;
                        self.taint_owner[i] = None;
                    }
                    if oos_owned {
                        self.out_of_service[i] = None;
                    }
                    self.untainted_at[i] = Some(self.now);
                    self.log(format!("{name}: release taints removed from m{i}"));
                }
                Answer::Untainted { left: Vec::new() }
            }
            Step::RecheckPower(devices) => {
                use palisade_model::nodefence::{PowerRecheck, RecheckedPower};
                // A status read of the BMC (one that fails reads nothing, one that lies says
                // off; its commands work, so the machine is off after its verify anyway). No
                // planted control skips it: a leader's steps from the verify to the releases run
                // within one tick, and no fault powers a machine on between them.
                let wall = self.wall();
                let token = self.ctl.token;
                let mut rechecks = Vec::new();
                for d in devices {
                    let state = match self.planned_bmc(f, &d.url).map(|b| {
                        let m = &self.machines[b];
                        m.power_mode.read_power(m.powered)
                    }) {
                        None | Some(PowerReading::Unknown) => RecheckedPower::Unknown,
                        Some(PowerReading::On) => RecheckedPower::On,
                        Some(PowerReading::Off) => RecheckedPower::Off,
                    };
                    rechecks.push(PowerRecheck {
                        device: d.url.clone(),
                        token,
                        state,
                        observed: format!("{state:?}"),
                        at: MicroTime(wall),
                    });
                }
                Answer::Power(rechecks)
            }
            _ => Answer::Nothing,
        };
        self.record(f, &step, answer);
        if matches!(step, Step::StartFencing { .. }) && self.bug == Some(Bug::ReleaseUnverified) {
            let bound: Vec<ObjectRef> = self
                .pods
                .iter()
                .filter(|p| p.node == i && !p.deleted)
                .map(|p| ObjectRef {
                    namespace: "app".into(),
                    name: String::new(),
                    uid: p.uid.clone(),
                })
                .collect();
            for p in bound {
                self.planted_release(f, p);
            }
        }
    }
}
