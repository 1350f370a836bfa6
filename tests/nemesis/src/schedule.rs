//! The fault schedule: a pure function of the seed. The same seed, machine count and writer
//! count always give the same events in the same order, so a failing campaign replays.
//!
//! Targets are named by role ([`Target::WriterHost`]: "wherever writer k runs when the fault
//! is applied") or by index; the runner resolves them against the lab and records the machine
//! it chose in the history.

use palisade_lab::MachineKind;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

/// Which machine a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// The machine writer `k` runs on when the fault is applied.
    WriterHost(usize),
    /// Machine `i` (`m<i>`).
    Machine(usize),
}

/// Which controller replicas a [`Fault::ControllerClockStep`] steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Replicas {
    /// The replica holding the Lease when the fault is applied.
    Leader,
    /// The other one.
    Standby,
    /// Both, by the same step.
    Both,
}

/// One fault and how long it lasts. Durations are milliseconds of wall-clock time on the
/// nemesis' side; they drive the fault, they are not assertions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "fault"
)]
pub enum Fault {
    /// The machine's link goes down (it reaches nothing), then comes back.
    CutAll {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
    },
    /// Only the machine's API traffic is black-holed; storage and peers still reachable.
    CutControlPlane {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
    },
    /// The machine is cut off the control plane past the Unhealthy threshold, healed for a
    /// moment (long enough for one renewal to land), then cut again and held (issue 38: a
    /// node whose watchdog resets it in the second cut must still be released on its trusted
    /// self-fence). QEMU machines only, drawn only when named (`--only cut-heal-cut`).
    CutHealCut {
        /// Whom.
        target: Target,
        /// The first cut.
        first_ms: u64,
        /// The healed moment.
        heal_ms: u64,
        /// The second cut.
        hold_ms: u64,
    },
    /// Cut and heal repeatedly, each cut shorter than the policy's Unhealthy threshold.
    Flap {
        /// Whom.
        target: Target,
        /// How many cut/heal cycles.
        cycles: u32,
        /// Each cut.
        cut_ms: u64,
        /// Each healed interval.
        heal_ms: u64,
    },
    /// The node agent is SIGKILLed (its supervisor restarts it).
    AgentKill {
        /// Whom.
        target: Target,
    },
    /// The node agent is SIGSTOPped, then SIGCONTed.
    AgentStop {
        /// Whom.
        target: Target,
        /// How long it stays stopped.
        hold_ms: u64,
    },
    /// The node agent is restarted gracefully (SIGTERM; its supervisor restarts it).
    AgentRestart {
        /// Whom.
        target: Target,
    },
    /// The machine is cut off the control plane and its agent restarted while cut.
    AgentRestartWhilePartitioned {
        /// Whom.
        target: Target,
        /// How long the cut lasts.
        hold_ms: u64,
    },
    /// The leading controller is SIGKILLed; it is started again after `down_ms`.
    LeaderKill {
        /// How long it stays dead.
        down_ms: u64,
    },
    /// The leading controller is SIGSTOPped and resumed later (the standby takes over).
    LeaderStop {
        /// How long it stays frozen.
        hold_ms: u64,
    },
    /// A machine is cut off completely, and the leader SIGKILLed while the fence runs.
    LeaderKillDuringCut {
        /// Whom.
        target: Target,
        /// How long the cut lasts.
        hold_ms: u64,
        /// When, after the cut, the leader dies (it is restarted at the heal).
        kill_after_ms: u64,
    },
    /// kube-apiserver is stopped for `down_ms` and started again.
    ApiRestart {
        /// How long it is down.
        down_ms: u64,
    },
    /// The machine's BMC (`ipmi_sim`) is SIGSTOPped (it answers nothing), then resumed.
    BmcFreeze {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
    },
    /// The BMC is frozen and the machine cut off: the fence must fall through to the PDU.
    BmcFrozenDuringCut {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
    },
    /// A node–node partition: the machine's traffic to and from every other machine is
    /// black-holed; the control plane and storage stay reachable.
    PeerCut {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
    },
    /// The machine is cut off the control plane and from its peers but still reaches its
    /// storage: its writer could keep writing, so only a verified fence may release it.
    IsolatedButStorage {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
    },
    /// kube-apiserver is down while a machine is cut off from its peers: that machine cannot
    /// learn that the outage is everyone's.
    ApiRestartDuringPeerCut {
        /// Whom.
        target: Target,
        /// How long the API server is down (the peer cut lasts as long, plus the restart).
        down_ms: u64,
    },
    /// etcd is SIGSTOPped (the API server answers, but can neither read nor write), then
    /// resumed: every Lease looks stale at once when it returns.
    EtcdFreeze {
        /// How long.
        hold_ms: u64,
    },
    /// etcd is stopped and started again on its data.
    EtcdRestart {
        /// How long it is down.
        down_ms: u64,
    },
    /// Both controller replicas are SIGKILLed and started again at the same instant (both
    /// race for the Lease).
    ControllersRestartTogether {
        /// How long both stay dead.
        down_ms: u64,
    },
    /// A machine is cut off completely and the firmware-bridge crashes (SIGKILL) while the
    /// fence runs; it is started again on its state after `down_ms`.
    BridgeCrashDuringCut {
        /// Whom.
        target: Target,
        /// How long the cut lasts.
        hold_ms: u64,
        /// When, after the cut, the bridge crashes.
        crash_after_ms: u64,
        /// How long it stays down.
        down_ms: u64,
    },
    /// The machine is cut off completely while its BMC's answers reach the bridge as garbage
    /// (the same length, no meaning): no power evidence may come of them, so the fence falls
    /// through to the PDU.
    BmcGarbageDuringCut {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
    },
    /// The machine is cut off completely while its BMC's answers reach the bridge late.
    BmcSlowDuringCut {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
        /// How late each answer arrives.
        delay_ms: u64,
    },
    /// The leader is SIGKILLed (deposed) as the machine is cut off completely; the standby
    /// takes over with a higher fencing token and fences the machine. After the heal, the
    /// deposed leader's power off for the machine arrives late, with its old token: the
    /// firmware-bridge must refuse it (its floor for the target is higher).
    DeposedLeaderLateRequest {
        /// Whom.
        target: Target,
        /// How long the cut lasts.
        hold_ms: u64,
    },
    /// The machine is cut off completely while the storage server's admin API (its firewall,
    /// which a storage fence and the CSI attacher drive) is black-holed: connections open and
    /// new ones go silent, while the data path keeps serving the writers. The power level's
    /// storage device cannot verify; the storage-only level cannot either. The cut heals
    /// first; the admin API comes back 2 s later.
    StorageAdminDownDuringCut {
        /// Whom.
        target: Target,
        /// How long the cut lasts.
        hold_ms: u64,
    },
    /// The machine is cut off completely while every device that could fence it is frozen
    /// (its BMC and the PDU's agent): nothing can verify a fence, so nothing may be released.
    /// The cut heals first; the devices come back 2 s later.
    DevicesDownDuringCut {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
    },
    /// The wall clock (`CLOCK_REALTIME`) of the running controller replicas steps by
    /// `step_ms`, as a bad NTP step would; their monotonic clock runs on. After `hold_ms` the
    /// clock steps back to the true time (a second step, the other way: the correction), so
    /// every step tries both directions and no offset outlives its event.
    ControllerClockStep {
        /// Whose clock.
        replicas: Replicas,
        /// The step, in either direction (2 s to 25 s).
        step_ms: i64,
        /// How long the clock stays off.
        hold_ms: u64,
    },
    /// The wall clock (`CLOCK_REALTIME`) of one machine steps by `step_ms` (whole seconds),
    /// as a bad NTP step on the node would: its agent stamps its Lease renewals and reads its
    /// own deadlines with it; its monotonic clock runs on. After `hold_ms` it steps back.
    /// QEMU machines only (a namespace machine shares the host's clock).
    MachineClockStep {
        /// Whose clock.
        target: Target,
        /// The step, whole seconds in either direction (2 s to 25 s).
        step_ms: i64,
        /// How long the clock stays off.
        hold_ms: u64,
    },
    /// The hypervisor pauses the whole machine (QMP `stop`: its vCPU, watchdog timer and
    /// clocks stand still; its BMC reports it on) and resumes it after `hold_ms`, from 1 s
    /// (a hiccup no fence may follow) to 20 s (past the Unhealthy threshold: a fence through
    /// its BMC, whose power off ends the paused VM). QEMU machines in a world with fence
    /// devices only: the campaign's policy accepts VMs as never paused, which is what a
    /// self-fence's trust on a VM rests on. Drawn only when named (`--only vm-pause`).
    VmPause {
        /// Whom.
        target: Target,
        /// How long the machine stays paused.
        hold_ms: u64,
    },
    /// Both controllers' watches stop delivering the changes of one node's Lease for
    /// `hold_ms`, while the node renews it on time (the lab's stalled-watch fault, read by
    /// debug builds only: a stalled informer, or an API server whose watch cache lags). The
    /// detector sees the node silent; nothing may be fenced, because the API still hears it.
    /// Drawn only when named (`--only watch-stall`).
    WatchStall {
        /// Whose Lease.
        target: Target,
        /// How long the watches hold its changes back.
        hold_ms: u64,
    },
    /// A one-way partition of the machine from the control plane (the relay's
    /// [`palisade_lab::forwarder::Link::Deaf`]): what it sends on its open connections lands
    /// (a renewal it sends is heard), nothing comes back until the heal, and new connections
    /// go unanswered. The node cannot tell its renewals landed; the controller hears those
    /// that did, and must count the node's silence from the last of them, no earlier. Drawn
    /// only when named (`--only one-way-cut`).
    OneWayCut {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
    },
    /// The machine's link to the control plane carries every byte `delay_ms` late, each way
    /// (a congested link, or an API server slow to answer this machine and not the others):
    /// renewals land late, or not at all once a round trip outlasts the agent's request
    /// timeout (its renew interval). Drawn only when named (`--only slow-link`).
    SlowLink {
        /// Whom.
        target: Target,
        /// How long.
        hold_ms: u64,
        /// How late each byte arrives, each way.
        delay_ms: u64,
    },
    /// Every byte between the API server and etcd is `delay_ms` late, each way (a slow disk
    /// or a distant etcd member): every write is late for every node at once, and a node's
    /// renewal may time out. A starved API server is no node's fault: no fence may follow it
    /// alone. Drawn only when named (`--only slow-etcd`).
    SlowEtcd {
        /// How long.
        hold_ms: u64,
        /// How late each byte arrives, each way.
        delay_ms: u64,
    },
    /// The machine is cut off completely and, `delete_after_ms` after a NodeFence of its node
    /// first appears, a person deletes that NodeFence (`kubectl delete nodefence`), in
    /// whatever phase it has reached: a fence deleted before it acted never starts (the next
    /// round may decide again), one that holds the node keeps its finalizer until its
    /// recovery lifted what it holds. Drawn only when named (`--only fence-deleted`).
    FenceDeleted {
        /// Whom.
        target: Target,
        /// How long the cut lasts.
        hold_ms: u64,
        /// When, after the NodeFence first appears, it is deleted.
        delete_after_ms: u64,
    },
    /// Two faults at once: `first` on a machine, and `second_after_ms` later `second` (on
    /// another machine, or on the controllers or the control plane), each held and healed on
    /// its own schedule, so they overlap; the event ends once both are healed. The faults a
    /// single event cannot give: a fence in flight when a second node goes silent, a leader
    /// lost while one node is cut off and another's agent hangs.
    TwoAtOnce {
        /// A machine fault ([`Fault::composable`]).
        first: Box<Fault>,
        /// A machine fault for another machine, or a controller or control-plane fault.
        second: Box<Fault>,
        /// When, after `first` is applied, `second` is.
        second_after_ms: u64,
    },
}

impl Fault {
    /// The fault's class, as counted in the report.
    pub fn class(&self) -> &'static str {
        match self {
            Fault::CutAll { .. } => "cut-all",
            Fault::CutControlPlane { .. } => "cut-control-plane",
            Fault::Flap { .. } => "flap",
            Fault::CutHealCut { .. } => "cut-heal-cut",
            Fault::AgentKill { .. } => "agent-kill",
            Fault::AgentStop { .. } => "agent-stop",
            Fault::AgentRestart { .. } => "agent-restart",
            Fault::AgentRestartWhilePartitioned { .. } => "agent-restart-partitioned",
            Fault::LeaderKill { .. } => "leader-kill",
            Fault::LeaderStop { .. } => "leader-stop",
            Fault::LeaderKillDuringCut { .. } => "leader-kill-during-cut",
            Fault::ApiRestart { .. } => "api-restart",
            Fault::BmcFreeze { .. } => "bmc-freeze",
            Fault::BmcFrozenDuringCut { .. } => "bmc-frozen-during-cut",
            Fault::PeerCut { .. } => "peer-cut",
            Fault::IsolatedButStorage { .. } => "isolated-but-storage",
            Fault::ApiRestartDuringPeerCut { .. } => "api-restart-during-peer-cut",
            Fault::EtcdFreeze { .. } => "etcd-freeze",
            Fault::EtcdRestart { .. } => "etcd-restart",
            Fault::ControllersRestartTogether { .. } => "controllers-restart-together",
            Fault::BridgeCrashDuringCut { .. } => "bridge-crash-during-cut",
            Fault::DevicesDownDuringCut { .. } => "devices-down-during-cut",
            Fault::StorageAdminDownDuringCut { .. } => "storage-admin-down-during-cut",
            Fault::BmcGarbageDuringCut { .. } => "bmc-garbage-during-cut",
            Fault::BmcSlowDuringCut { .. } => "bmc-slow-during-cut",
            Fault::DeposedLeaderLateRequest { .. } => "deposed-leader-late-request",
            Fault::ControllerClockStep { .. } => "controller-clock-step",
            Fault::MachineClockStep { .. } => "machine-clock-step",
            Fault::VmPause { .. } => "vm-pause",
            Fault::WatchStall { .. } => "watch-stall",
            Fault::OneWayCut { .. } => "one-way-cut",
            Fault::SlowLink { .. } => "slow-link",
            Fault::SlowEtcd { .. } => "slow-etcd",
            Fault::FenceDeleted { .. } => "fence-deleted",
            Fault::TwoAtOnce { .. } => "two-at-once",
        }
    }

    /// Whether the fault may be one of [`Fault::TwoAtOnce`]'s: a fault that touches one
    /// machine only (as `first` or `second`) or the controllers, the API server or etcd (as
    /// `second` only). Faults that already combine a cut with a controller or device fault,
    /// restart the bridge or etcd, or move the controllers together, are not: two of them
    /// would act on the same process.
    pub fn composable(&self, as_second: bool) -> bool {
        match self {
            Fault::CutAll { .. }
            | Fault::CutControlPlane { .. }
            | Fault::Flap { .. }
            | Fault::CutHealCut { .. }
            | Fault::AgentKill { .. }
            | Fault::AgentStop { .. }
            | Fault::AgentRestart { .. }
            | Fault::AgentRestartWhilePartitioned { .. }
            | Fault::BmcFreeze { .. }
            | Fault::BmcFrozenDuringCut { .. }
            | Fault::PeerCut { .. }
            | Fault::IsolatedButStorage { .. }
            | Fault::MachineClockStep { .. }
            | Fault::VmPause { .. }
            | Fault::WatchStall { .. }
            | Fault::OneWayCut { .. }
            | Fault::SlowLink { .. } => true,
            Fault::LeaderKill { .. }
            | Fault::LeaderStop { .. }
            | Fault::ApiRestart { .. }
            | Fault::EtcdFreeze { .. }
            | Fault::SlowEtcd { .. }
            | Fault::ControllerClockStep { .. } => as_second,
            _ => false,
        }
    }

    /// The machine the fault hits, if it hits one.
    pub fn target(&self) -> Option<Target> {
        match self {
            Fault::CutAll { target, .. }
            | Fault::CutControlPlane { target, .. }
            | Fault::Flap { target, .. }
            | Fault::CutHealCut { target, .. }
            | Fault::AgentKill { target }
            | Fault::AgentStop { target, .. }
            | Fault::AgentRestart { target }
            | Fault::AgentRestartWhilePartitioned { target, .. }
            | Fault::LeaderKillDuringCut { target, .. }
            | Fault::BmcFreeze { target, .. }
            | Fault::BmcFrozenDuringCut { target, .. }
            | Fault::PeerCut { target, .. }
            | Fault::IsolatedButStorage { target, .. }
            | Fault::ApiRestartDuringPeerCut { target, .. }
            | Fault::BridgeCrashDuringCut { target, .. }
            | Fault::DevicesDownDuringCut { target, .. }
            | Fault::StorageAdminDownDuringCut { target, .. }
            | Fault::BmcGarbageDuringCut { target, .. }
            | Fault::BmcSlowDuringCut { target, .. }
            | Fault::DeposedLeaderLateRequest { target, .. }
            | Fault::MachineClockStep { target, .. }
            | Fault::VmPause { target, .. }
            | Fault::WatchStall { target, .. }
            | Fault::OneWayCut { target, .. }
            | Fault::SlowLink { target, .. }
            | Fault::FenceDeleted { target, .. } => Some(*target),
            Fault::TwoAtOnce { first, .. } => first.target(),
            Fault::LeaderKill { .. }
            | Fault::LeaderStop { .. }
            | Fault::ApiRestart { .. }
            | Fault::EtcdFreeze { .. }
            | Fault::EtcdRestart { .. }
            | Fault::SlowEtcd { .. }
            | Fault::ControllersRestartTogether { .. }
            | Fault::ControllerClockStep { .. } => None,
        }
    }

    /// The controller clock steps the fault makes, in milliseconds (with those of a
    /// [`Fault::TwoAtOnce`]'s two faults).
    pub fn clock_steps_ms(&self) -> Vec<i64> {
        match self {
            Fault::ControllerClockStep { step_ms, .. } => vec![*step_ms],
            Fault::TwoAtOnce { first, second, .. } => {
                let mut steps = first.clock_steps_ms();
                steps.extend(second.clock_steps_ms());
                steps
            }
            _ => Vec::new(),
        }
    }

    /// True when the fault silences a node long enough that a fence is expected (with the
    /// campaign's policy: Unhealthy after 4 s).
    pub fn expects_fence(&self) -> bool {
        matches!(
            self,
            Fault::CutAll { .. }
                | Fault::CutControlPlane { .. }
                | Fault::AgentRestartWhilePartitioned { .. }
                | Fault::LeaderKillDuringCut { .. }
                | Fault::BmcFrozenDuringCut { .. }
                | Fault::IsolatedButStorage { .. }
                | Fault::BridgeCrashDuringCut { .. }
                | Fault::DevicesDownDuringCut { .. }
                | Fault::StorageAdminDownDuringCut { .. }
                | Fault::BmcGarbageDuringCut { .. }
                | Fault::BmcSlowDuringCut { .. }
                | Fault::DeposedLeaderLateRequest { .. }
                | Fault::FenceDeleted { .. }
        ) || matches!(self, Fault::TwoAtOnce { first, second, .. }
            if first.expects_fence() || second.expects_fence())
    }
}

/// Every fault class with its weight in the draw.
const CLASSES: &[(&str, u32)] = &[
    ("cut-all", 3),
    ("cut-control-plane", 3),
    ("flap", 2),
    ("agent-kill", 2),
    ("agent-stop", 2),
    ("agent-restart", 1),
    ("agent-restart-partitioned", 1),
    ("leader-kill", 2),
    ("leader-stop", 2),
    ("leader-kill-during-cut", 2),
    ("api-restart", 1),
    ("bmc-freeze", 1),
    ("bmc-frozen-during-cut", 2),
    ("peer-cut", 2),
    ("isolated-but-storage", 2),
    ("api-restart-during-peer-cut", 1),
    ("etcd-freeze", 1),
    ("etcd-restart", 1),
    ("controllers-restart-together", 1),
    ("bridge-crash-during-cut", 2),
    ("devices-down-during-cut", 1),
    ("storage-admin-down-during-cut", 1),
    ("bmc-garbage-during-cut", 1),
    ("bmc-slow-during-cut", 1),
    ("deposed-leader-late-request", 1),
    ("controller-clock-step", 2),
    ("two-at-once", 2),
];

/// The classes only QEMU machines can take (their kernel is their own), drawn after
/// [`CLASSES`] so a namespace campaign's schedule is the same as before they existed.
const QEMU_CLASSES: &[(&str, u32)] = &[("machine-clock-step", 2)];

/// Classes for QEMU machines that a campaign draws only when named (`only`): adding them to
/// the default draw would change every recorded seed's schedule.
const OPT_IN_QEMU_CLASSES: &[(&str, u32)] = &[("cut-heal-cut", 2), ("vm-pause", 2)];

/// Classes for any machine that a campaign draws only when named (`only`), for the same
/// reason.
const OPT_IN_CLASSES: &[(&str, u32)] = &[
    ("watch-stall", 2),
    ("one-way-cut", 2),
    ("slow-link", 2),
    ("slow-etcd", 2),
    ("fence-deleted", 2),
];

/// The names of every fault class the nemesis can draw, on any kind of machine.
pub fn classes() -> impl Iterator<Item = &'static str> {
    CLASSES
        .iter()
        .chain(QEMU_CLASSES)
        .chain(OPT_IN_QEMU_CLASSES)
        .chain(OPT_IN_CLASSES)
        .map(|(c, _)| *c)
}

/// Whether machines of `kind` can take faults of `class`.
pub fn class_fits(class: &str, kind: MachineKind) -> bool {
    kind == MachineKind::Qemu
        || !QEMU_CLASSES
            .iter()
            .chain(OPT_IN_QEMU_CLASSES)
            .any(|(c, _)| *c == class)
}

/// The classes, with their weights, a campaign on machines of `kind` draws from.
fn classes_for(kind: MachineKind) -> Vec<(&'static str, u32)> {
    let mut all = CLASSES.to_vec();
    if kind == MachineKind::Qemu {
        all.extend_from_slice(QEMU_CLASSES);
    }
    all
}

/// One scheduled event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Position in the schedule, from 0.
    pub index: usize,
    /// What happens.
    pub fault: Fault,
}

/// Draws `events` faults for a lab of `machines` machines running `writers` writers.
///
/// Guarantees: deterministic in its arguments; every machine index is below `machines`, every
/// writer index below `writers`; every duration is bounded (no hold longer than 25 s).
pub fn generate(seed: u64, events: usize, machines: usize, writers: usize) -> Vec<Event> {
    generate_only(seed, events, machines, writers, &[], MachineKind::Namespace)
}

/// As [`generate`], for machines of `kind`, drawing only the classes named in `only` (empty:
/// every class that fits `kind`, [`class_fits`]), with their usual weights. Names that are
/// not classes, or do not fit `kind`, are ignored; callers check them with [`classes`] and
/// [`class_fits`].
pub fn generate_only(
    seed: u64,
    events: usize,
    machines: usize,
    writers: usize,
    only: &[String],
    kind: MachineKind,
) -> Vec<Event> {
    let fitting = classes_for(kind);
    let mut drawn: Vec<(&str, u32)> = fitting
        .iter()
        .filter(|(c, _)| only.is_empty() || only.iter().any(|o| o == c))
        .copied()
        .collect();
    let opt_in = OPT_IN_CLASSES.iter().chain(if kind == MachineKind::Qemu {
        OPT_IN_QEMU_CLASSES
    } else {
        &[]
    });
    drawn.extend(opt_in.filter(|(c, _)| only.iter().any(|o| o == c)));
    let drawn = if drawn.is_empty() { fitting } else { drawn };
    let mut rng = StdRng::seed_from_u64(seed);
    let total: u32 = drawn.iter().map(|(_, w)| w).sum();
    (0..events)
        .map(|index| {
            let mut pick = rng.random_range(0..total);
            let class = drawn
                .iter()
                .find(|(_, w)| {
                    if pick < *w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .map(|(c, _)| *c)
                .unwrap_or("cut-all");
            let fault = if class == "two-at-once" {
                two_at_once(&mut rng, machines, writers, kind)
            } else {
                draw(class, &mut rng, machines, writers)
            };
            Event { index, fault }
        })
        .collect()
}

/// Draws one fault of `class` (not `two-at-once`).
fn draw(class: &str, rng: &mut StdRng, machines: usize, writers: usize) -> Fault {
    // Most faults hit a writer's machine: that is where a mistake costs data.
    let target = if writers > 0 && rng.random_bool(0.65) {
        Target::WriterHost(rng.random_range(0..writers))
    } else {
        Target::Machine(rng.random_range(0..machines.max(1)))
    };
    let cut_hold = rng.random_range(6_000..=20_000);
    match class {
        "cut-all" => Fault::CutAll {
            target,
            hold_ms: cut_hold,
        },
        "cut-control-plane" => Fault::CutControlPlane {
            target,
            hold_ms: cut_hold,
        },
        "cut-heal-cut" => Fault::CutHealCut {
            target,
            first_ms: rng.random_range(5_000..=7_000),
            heal_ms: rng.random_range(1_000..=2_000),
            // Past the agent's self-fence (8 s), its watchdog (6 s) and the controller's wait
            // (8 s + 2 × 6 s + the margin after the last renewal).
            hold_ms: rng.random_range(28_000..=31_000),
        },
        "flap" => Fault::Flap {
            target,
            cycles: rng.random_range(3..=6),
            cut_ms: rng.random_range(800..=2_000),
            heal_ms: rng.random_range(1_000..=3_000),
        },
        "agent-kill" => Fault::AgentKill { target },
        // Up to longer than detection plus a self-fence timeout: a hung agent that
        // keeps its pods running while its node is judged.
        "agent-stop" => Fault::AgentStop {
            target,
            hold_ms: rng.random_range(2_000..=20_000),
        },
        "agent-restart" => Fault::AgentRestart { target },
        "agent-restart-partitioned" => Fault::AgentRestartWhilePartitioned {
            target,
            hold_ms: cut_hold,
        },
        "leader-kill" => Fault::LeaderKill {
            down_ms: rng.random_range(1_000..=8_000),
        },
        "leader-stop" => Fault::LeaderStop {
            hold_ms: rng.random_range(3_000..=12_000),
        },
        "leader-kill-during-cut" => Fault::LeaderKillDuringCut {
            target,
            hold_ms: cut_hold.max(10_000),
            kill_after_ms: rng.random_range(3_000..=7_000),
        },
        "api-restart" => Fault::ApiRestart {
            down_ms: rng.random_range(1_000..=5_000),
        },
        "bmc-freeze" => Fault::BmcFreeze {
            target,
            hold_ms: rng.random_range(3_000..=15_000),
        },
        "bmc-frozen-during-cut" => Fault::BmcFrozenDuringCut {
            target,
            hold_ms: cut_hold.max(12_000),
        },
        "peer-cut" => Fault::PeerCut {
            target,
            hold_ms: cut_hold,
        },
        "isolated-but-storage" => Fault::IsolatedButStorage {
            target,
            hold_ms: cut_hold,
        },
        "api-restart-during-peer-cut" => Fault::ApiRestartDuringPeerCut {
            target,
            down_ms: rng.random_range(2_000..=8_000),
        },
        "etcd-freeze" => Fault::EtcdFreeze {
            hold_ms: rng.random_range(2_000..=12_000),
        },
        "etcd-restart" => Fault::EtcdRestart {
            down_ms: rng.random_range(1_000..=6_000),
        },
        "controllers-restart-together" => Fault::ControllersRestartTogether {
            down_ms: rng.random_range(500..=5_000),
        },
        "bridge-crash-during-cut" => Fault::BridgeCrashDuringCut {
            target,
            hold_ms: cut_hold.max(12_000),
            crash_after_ms: rng.random_range(3_000..=6_000),
            down_ms: rng.random_range(1_000..=5_000),
        },
        "storage-admin-down-during-cut" => Fault::StorageAdminDownDuringCut {
            target,
            hold_ms: cut_hold.max(10_000),
        },
        "devices-down-during-cut" => Fault::DevicesDownDuringCut {
            target,
            hold_ms: cut_hold.max(10_000),
        },
        "bmc-garbage-during-cut" => Fault::BmcGarbageDuringCut {
            target,
            hold_ms: cut_hold.max(12_000),
        },
        "deposed-leader-late-request" => Fault::DeposedLeaderLateRequest {
            target,
            hold_ms: cut_hold.max(15_000),
        },
        // Steps of several seconds, beyond the detection thresholds (2 s and 4 s) and the
        // Lease's 4 s, held as long as a cut: long enough for a fence to run under it.
        "controller-clock-step" => Fault::ControllerClockStep {
            replicas: match rng.random_range(0..3) {
                0 => Replicas::Leader,
                1 => Replicas::Standby,
                _ => Replicas::Both,
            },
            step_ms: rng.random_range(2_000..=25_000) * if rng.random_bool(0.5) { 1 } else { -1 },
            hold_ms: cut_hold,
        },
        // As the controllers' steps: beyond the detection thresholds and the Lease, held as
        // long as a cut. Whole seconds: the guest's `date -s` takes no fraction.
        "machine-clock-step" => Fault::MachineClockStep {
            target,
            step_ms: rng.random_range(2..=25) * 1_000 * if rng.random_bool(0.5) { 1 } else { -1 },
            hold_ms: cut_hold,
        },
        // From a hiccup well inside the Unhealthy threshold (4 s) to as long as a cut.
        "vm-pause" => Fault::VmPause {
            target,
            hold_ms: rng.random_range(1_000..=20_000),
        },
        // Past the Unhealthy threshold (4 s), up to as long as a cut.
        "watch-stall" => Fault::WatchStall {
            target,
            hold_ms: cut_hold.max(8_000),
        },
        // Past the Unhealthy threshold (4 s), up to as long as a cut.
        "one-way-cut" => Fault::OneWayCut {
            target,
            hold_ms: cut_hold,
        },
        // From a delay the 1 s renewals absorb to one (2 × 2.5 s round trips) that leaves
        // the API server without a renewal for longer than the Unhealthy threshold (4 s).
        "slow-link" => Fault::SlowLink {
            target,
            hold_ms: cut_hold,
            delay_ms: rng.random_range(100..=2_500),
        },
        // From late writes every renewal absorbs to round trips (a write is at least one)
        // longer than the agents' request timeout.
        "slow-etcd" => Fault::SlowEtcd {
            hold_ms: cut_hold,
            delay_ms: rng.random_range(100..=2_500),
        },
        // Long enough for the fence to run its course under the cut; deleted from the moment
        // it appears (Pending) to well into its release.
        "fence-deleted" => Fault::FenceDeleted {
            target,
            hold_ms: cut_hold.max(12_000),
            delete_after_ms: rng.random_range(0..=4_000),
        },
        _ => Fault::BmcSlowDuringCut {
            target,
            hold_ms: cut_hold.max(12_000),
            delay_ms: rng.random_range(500..=6_000),
        },
    }
}

/// Draws two composable faults ([`Fault::composable`]) and when the second begins: within
/// the first's first 8 s, so the two overlap.
fn two_at_once(rng: &mut StdRng, machines: usize, writers: usize, kind: MachineKind) -> Fault {
    let composable: Vec<&str> = classes_for(kind)
        .into_iter()
        .map(|(c, _)| c)
        .filter(|c| *c != "two-at-once")
        .collect();
    let mut pick = |as_second: bool| loop {
        let class = composable[rng.random_range(0..composable.len())];
        let f = draw(class, rng, machines, writers);
        if f.composable(as_second) {
            return f;
        }
    };
    let first = pick(false);
    let second = pick(true);
    Fault::TwoAtOnce {
        first: Box::new(first),
        second: Box::new(second),
        second_after_ms: rng.random_range(1_000..=8_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        assert_eq!(generate(7, 50, 5, 2), generate(7, 50, 5, 2));
        assert_ne!(generate(7, 50, 5, 2), generate(8, 50, 5, 2));
    }

    #[test]
    fn targets_and_durations_stay_in_bounds() {
        fn check(f: &Fault, json: &serde_json::Value) {
            match f.target() {
                Some(Target::Machine(i)) => assert!(i < 4),
                Some(Target::WriterHost(k)) => assert!(k < 2),
                None => {}
            }
            for key in [
                "holdMs",
                "downMs",
                "cutMs",
                "healMs",
                "crashAfterMs",
                "delayMs",
                "secondAfterMs",
            ] {
                if let Some(ms) = json.get(key).and_then(|v| v.as_u64()) {
                    assert!(ms <= 25_000, "{f:?}");
                }
            }
            if let Some(step) = json.get("stepMs").and_then(|v| v.as_i64()) {
                assert!((2_000..=25_000).contains(&step.abs()), "{f:?}");
                assert_eq!(f.clock_steps_ms(), vec![step]);
            }
        }
        let mut pairs = 0;
        for seed in 0..200 {
            for e in generate(seed, 40, 4, 2) {
                let json = serde_json::to_value(&e.fault).unwrap();
                check(&e.fault, &json);
                if let Fault::TwoAtOnce { first, second, .. } = &e.fault {
                    pairs += 1;
                    assert!(first.composable(false), "{first:?}");
                    assert!(second.composable(true), "{second:?}");
                    check(first, &json["first"]);
                    check(second, &json["second"]);
                }
            }
        }
        assert!(pairs > 0, "no two-at-once drawn in 8,000 events");
    }

    #[test]
    fn a_restricted_schedule_draws_only_the_named_classes() {
        let only = vec!["peer-cut".to_string(), "etcd-freeze".to_string()];
        let events = generate_only(3, 60, 5, 2, &only, MachineKind::Namespace);
        let drawn: std::collections::BTreeSet<&str> =
            events.iter().map(|e| e.fault.class()).collect();
        assert_eq!(drawn, ["etcd-freeze", "peer-cut"].into_iter().collect());
        // No restriction is the full draw.
        assert_eq!(
            generate_only(3, 60, 5, 2, &[], MachineKind::Namespace),
            generate(3, 60, 5, 2)
        );
    }

    #[test]
    fn cut_heal_cut_is_drawn_on_qemu_machines_only_when_named() {
        let classes_of = |only: &[String], kind| -> std::collections::BTreeSet<&'static str> {
            generate_only(7, 400, 3, 1, only, kind)
                .iter()
                .flat_map(|e| match &e.fault {
                    Fault::TwoAtOnce { first, second, .. } => vec![first.class(), second.class()],
                    f => vec![f.class()],
                })
                .collect()
        };
        // The default draws (and so every recorded seed) never hold it.
        assert!(!classes_of(&[], MachineKind::Qemu).contains("cut-heal-cut"));
        let only = vec!["cut-heal-cut".to_string()];
        assert_eq!(
            classes_of(&only, MachineKind::Qemu),
            ["cut-heal-cut"].into_iter().collect()
        );
        assert!(classes().any(|c| c == "cut-heal-cut"));
        assert!(!class_fits("cut-heal-cut", MachineKind::Namespace));
        for e in generate_only(3, 20, 3, 1, &only, MachineKind::Qemu) {
            let Fault::CutHealCut {
                first_ms,
                heal_ms,
                hold_ms,
                ..
            } = e.fault
            else {
                panic!("{:?}", e.fault)
            };
            assert!(first_ms > 4_000 && heal_ms >= 1_000 && (28_000..=31_000).contains(&hold_ms));
        }
    }

    #[test]
    fn machine_clock_steps_are_drawn_for_qemu_machines_only() {
        let drawn = |kind| -> std::collections::BTreeSet<&'static str> {
            generate_only(11, 400, 5, 2, &[], kind)
                .iter()
                .flat_map(|e| match &e.fault {
                    Fault::TwoAtOnce { first, second, .. } => vec![first.class(), second.class()],
                    f => vec![f.class()],
                })
                .collect()
        };
        assert!(!drawn(MachineKind::Namespace).contains("machine-clock-step"));
        assert!(drawn(MachineKind::Qemu).contains("machine-clock-step"));
        assert!(class_fits("machine-clock-step", MachineKind::Qemu));
        assert!(!class_fits("machine-clock-step", MachineKind::Namespace));
        assert!(class_fits("peer-cut", MachineKind::Namespace));
        // Asking a namespace campaign for it alone falls back to the full draw, which has none.
        let only = vec!["machine-clock-step".to_string()];
        assert!(generate_only(5, 50, 5, 2, &only, MachineKind::Namespace)
            .iter()
            .all(|e| e.fault.class() != "machine-clock-step"));
        for e in generate_only(5, 50, 5, 2, &only, MachineKind::Qemu) {
            let Fault::MachineClockStep {
                step_ms, hold_ms, ..
            } = e.fault
            else {
                panic!("{:?} drawn from --only machine-clock-step", e.fault);
            };
            assert!((2_000..=25_000).contains(&step_ms.abs()) && step_ms % 1_000 == 0);
            assert!(hold_ms <= 25_000);
        }
    }

    #[test]
    fn controller_clock_steps_are_drawn_both_ways_for_every_replica_and_print_as_json() {
        let mut seen = std::collections::BTreeSet::new();
        let mut in_pairs = 0;
        for e in generate(5, 1_000, 4, 2) {
            if let Fault::TwoAtOnce { second, .. } = &e.fault {
                if matches!(**second, Fault::ControllerClockStep { .. }) {
                    in_pairs += 1;
                }
            }
            let Fault::ControllerClockStep {
                replicas, step_ms, ..
            } = e.fault
            else {
                continue;
            };
            seen.insert((format!("{replicas:?}"), step_ms > 0));
            // What `--print-schedule` prints, and reads back the same.
            let line = serde_json::to_string(&e).unwrap();
            assert!(line.contains(r#""fault":"controllerClockStep""#), "{line}");
            assert!(line.contains(r#""stepMs":"#), "{line}");
            assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);
        }
        assert_eq!(
            seen.len(),
            6,
            "every replica choice in both directions: {seen:?}"
        );
        assert!(in_pairs > 0, "never the second fault of a two-at-once");
    }

    #[test]
    fn a_long_campaign_draws_every_class() {
        let drawn: std::collections::BTreeSet<&str> =
            generate_only(1, 500, 5, 2, &[], MachineKind::Qemu)
                .iter()
                .map(|e| e.fault.class())
                .collect();
        let opt_in = || OPT_IN_QEMU_CLASSES.iter().chain(OPT_IN_CLASSES);
        for c in classes().filter(|c| !opt_in().any(|(o, _)| o == c)) {
            assert!(drawn.contains(c), "class {c} never drawn");
        }
        // An opt-in class is drawn when named, and never otherwise.
        for (c, _) in opt_in() {
            assert!(!drawn.contains(c), "opt-in class {c} drawn unasked");
            let named = generate_only(1, 5, 5, 2, &[c.to_string()], MachineKind::Qemu);
            assert!(named.iter().all(|e| e.fault.class() == *c), "{named:?}");
        }
    }
}
