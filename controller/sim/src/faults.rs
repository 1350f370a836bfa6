//! Seeded schedules: the cluster's configuration and the faults injected into it, in time.

use palisade_decide::power::PowerReading;

use crate::rng::Rng;

/// How a node can be fenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// A BMC (power off, verified by reading the power state).
    Power,
    /// The storage firewall only.
    Storage,
    /// One level with both the BMC and the storage firewall.
    PowerAndStorage,
    /// A host that must not be powered off: one level with `powerOff: Disallowed` (the
    /// storage firewall blocks, then the BMC resets the machine).
    StorageThenReset,
    /// No FenceTarget: only a trusted self-fence, if any.
    None,
}

/// How a device answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceMode {
    /// Does what it is told; reads back the truth.
    Works,
    /// Refuses every command (an error).
    Fails,
    /// Acknowledges every command and does nothing (reads back the truth).
    Ignores,
    /// A BMC whose status reads lie: every read says off, whatever the machine's power; its
    /// commands still work.
    ReadsOff,
}

impl DeviceMode {
    /// Whether a command to the device takes effect.
    pub fn obeys(self) -> bool {
        matches!(self, DeviceMode::Works | DeviceMode::ReadsOff)
    }

    /// What a status read of a BMC in this mode says of a machine that is `powered` or not.
    pub fn read_power(self, powered: bool) -> PowerReading {
        match self {
            DeviceMode::Fails => PowerReading::Unknown,
            DeviceMode::ReadsOff => PowerReading::Off,
            DeviceMode::Works | DeviceMode::Ignores if powered => PowerReading::On,
            DeviceMode::Works | DeviceMode::Ignores => PowerReading::Off,
        }
    }
}

/// One node's configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Fencing levels.
    pub fencing: Fencing,
    /// The agent's self-fence timeout (seconds).
    pub self_fence_after: u64,
    /// An armed hardware watchdog's timeout (seconds), if any.
    pub watchdog: Option<u64>,
    /// Whether the watchdog is `nowayout`.
    pub nowayout: bool,
    /// How the BMC answers at first.
    pub power_mode: DeviceMode,
    /// How the storage firewall answers for this node at first.
    pub storage_mode: DeviceMode,
    /// The agent's peer check, if it runs one: (vouch after, answer valid), in seconds.
    pub peer_check: Option<(u64, u64)>,
    /// The bias of the node's wall clock against the controller's (milliseconds, within
    /// ±1 s: the skew the healthy majority assumes); each Lease stamp also jitters around it.
    pub skew_ms: i64,
    /// The machine is not in the cluster at first (powered off, no Node): it joins with
    /// [`Fault::Join`].
    pub joins_late: bool,
    /// The machine is a virtual machine (its hypervisor can pause it: [`Fault::Pause`]).
    pub virtual_machine: bool,
    /// The machine whose BMC answers at the address this node's FenceTarget names, when it is
    /// another machine's (a miswired or mistyped address); `None`: the node's own BMC.
    pub bmc_of: Option<usize>,
    /// The node's containers do not die when its agent kills them (processes in
    /// uninterruptible sleep on I/O to a hung device, which SIGKILL does not end): only a reset
    /// (its watchdog's, a BMC's) or a power loss ends them. Its agent's runtime inventory
    /// still names them.
    pub kill_hangs: bool,
    /// Some of the node's containers outlive their agent's kills and others die (one process
    /// in uninterruptible sleep on a dead mount, the others not): each container's kill is
    /// drawn when it starts, one in two hangs. A node with both a released pod that died and
    /// one that lives on returns naming only the living one.
    pub some_kills_hang: bool,
    /// A stock node: the kubelet renews the Lease (its `renewTime`) and Palisade's companion
    /// writes the advertisement with its write stamp, each on its own
    /// ([`Fault::CompanionCut`] fails the companion's writes alone). The companion stands in
    /// for the node agent in everything else (its self-fence, watchdog, peer check, the pods
    /// it reports), and vouches on its own writes.
    pub stock: bool,
}

impl NodeConfig {
    /// Whether its FenceTarget lists a BMC (a power device).
    pub fn has_bmc(&self) -> bool {
        matches!(
            self.fencing,
            Fencing::Power | Fencing::PowerAndStorage | Fencing::StorageThenReset
        )
    }

    /// A node of a schedule made by hand: `fencing`, working devices, a self-fence after 5 s,
    /// no watchdog, no peer check, a member from the start, bare metal, its own BMC, kills
    /// that work.
    pub fn plain(fencing: Fencing) -> NodeConfig {
        NodeConfig {
            fencing,
            self_fence_after: 5,
            watchdog: None,
            nowayout: true,
            power_mode: DeviceMode::Works,
            storage_mode: DeviceMode::Works,
            peer_check: None,
            skew_ms: 0,
            joins_late: false,
            virtual_machine: false,
            bmc_of: None,
            kill_hangs: false,
            some_kills_hang: false,
            stock: false,
        }
    }
}

/// A fault, applied at a point in simulated time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The node loses the control plane (it still reaches the storage).
    CutApi(usize),
    /// The node loses every link (control plane and storage).
    CutAll(usize),
    /// The node's links come back.
    Heal(usize),
    /// The node agent hangs (SIGSTOP): it renews nothing, kills nothing, pets nothing.
    HangAgent(usize),
    /// A hung agent resumes.
    ResumeAgent(usize),
    /// The node agent crashes and stays down (its containers keep running).
    CrashAgent(usize),
    /// The node agent restarts (from a crash or a hang), possibly while partitioned.
    RestartAgent(usize),
    /// The controller crashes (it loses its memory: detector, advertisements).
    ControllerCrash,
    /// The controller starts again.
    ControllerStart,
    /// The API server goes down for everyone.
    ApiDown,
    /// The API server comes back.
    ApiUp,
    /// The node's BMC starts answering this way.
    PowerDevice(usize, DeviceMode),
    /// The storage firewall starts answering this way for the node.
    StorageDevice(usize, DeviceMode),
    /// A person powers the node on.
    OperatorPowerOn(usize),
    /// The machine loses power (a failed supply or outlet): it is off, and its BMC still
    /// answers as its mode says. A person's power-on or the recovery's brings it back.
    PowerLoss(usize),
    /// The machine loses power and gets it back this many milliseconds later (a short power
    /// cycle): it boots again.
    PowerCycle(usize, u64),
    /// The node network splits: the nodes whose bit is set reach only each other (their
    /// links to the API are untouched).
    SplitNodes(u64),
    /// The node network heals.
    HealNodes,
    /// The controller's wall clock steps by this many milliseconds (an NTP correction, a
    /// mis-set clock): forward or back. Its monotonic clock does not move.
    ControllerClockStep(i64),
    /// The node's wall clock steps by this many milliseconds, beyond the skew the rules
    /// assume: its `renewTime` stamps move; its monotonic clocks (self-fence, watchdog) do not.
    NodeClockStep(usize, i64),
    /// The leader pauses (SIGSTOP, a VM or GC pause) right after its last leadership check,
    /// before its next device command is sent, for this many milliseconds. Past its Lease
    /// duration a standby takes over (a higher token, no memory); when the old leader
    /// resumes, its pending command still reaches the device, then it finds itself deposed and
    /// stops. A shorter pause only delays it.
    FreezeLeaderAtCommand(u64),
    /// The node's Lease writes time out (an overloaded API server, a stuck storage backend):
    /// the agent gives up on each. With `land`, each still lands on the API server, up to 4 s
    /// later; without, none lands. Reads (the pods bound to the node) still work.
    SlowWrites {
        /// The node.
        node: usize,
        /// Whether the writes land late (or never).
        land: bool,
    },
    /// The node's Lease writes are answered in time again.
    FastWrites(usize),
    /// A new machine joins the cluster: it is powered on for the first time, its agent
    /// registers its Node, and every agent that reaches the API from then on counts it.
    Join(usize),
    /// The hypervisor pauses the virtual machine for this many milliseconds (a migration, a
    /// snapshot, `werror=stop`, a host suspend): everything on it freezes, its watchdog and
    /// its clocks too, and its containers run on when it resumes, as if no time had passed.
    Pause(usize, u64),
    /// Another machine takes over the node's name (a reinstalled spare registered with the
    /// same hostname): its kubelet reports its own `systemUUID` on the Node and its agent
    /// renews the node's Lease with its own machine UUID, an empty runtime and the recovery
    /// challenge it reads. The original machine stays where it was (powered, on its storage,
    /// with whatever still runs on it), and never reaches the API again.
    Impostor(usize),
    /// A `NodeFence` for the node that this leader's decision did not create: a person's
    /// request (`manual`: `kubectl palisade fence`, with no overrides), or a second
    /// controller request from a deposed replica whose list-then-create raced the leader's
    /// (only while the node has an unfinished fence). Of two unfinished fences of one node
    /// only one may act.
    Request {
        /// The node.
        node: usize,
        /// A person's request (or a replica's).
        manual: bool,
    },
    /// A stock node's companion can no longer write its advertisement (its credentials, its
    /// API priority level, its own process's link), while its kubelet still renews the Lease.
    CompanionCut(usize),
    /// The companion's writes get through again.
    CompanionHeal(usize),
    /// A person deletes the node's newest `NodeFence` (`kubectl delete nodefence`), whatever
    /// its phase. The operator's finalizer (`palisade.dev/holds-node`) holds the deletion of a
    /// fence that holds something on its node (from `Fencing` on: a block, release taints,
    /// released pods) until its own recovery lifted it; the fence goes on meanwhile, unchanged.
    /// A fence that holds nothing (`Pending`, or finished) is gone at once, and the decision
    /// may fence its still-silent node again with a new one.
    DeleteFence(usize),
    /// A person edits the address of the power device in the node's FenceTarget (`kubectl
    /// edit fencetarget`): to the node's own BMC (`None`: correcting a miswired address), or
    /// to machine `m`'s (`Some(m)`: a typo that reaches another machine's BMC). As the
    /// operator meets it: the power watch reads through the new address from then on; a
    /// fence's persisted plan keeps the address it was planned with, and a planned device
    /// that is no longer listed in the FenceTarget is refused with nothing sent; every
    /// command and read is pinned to the Node's `systemUUID` (never to what an address
    /// answers), so an address that reaches another machine is refused by identity.
    EditTargetAddress(usize, Option<usize>),
}

/// A whole run: configuration plus the faults in time (milliseconds).
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The seed (replays this schedule).
    pub seed: u64,
    /// Nodes.
    pub nodes: Vec<NodeConfig>,
    /// Whether the policy trusts self-fencing.
    pub trust_self_fence: bool,
    /// Whether the policy powers fenced nodes back on.
    pub power_on: bool,
    /// The policy's `detection.powerOffAfterSeconds`: 0 (no power evidence) or 1–3 s, below
    /// its `unhealthyAfterSeconds` (4 s), so that power evidence can come first.
    pub power_off_after: u64,
    /// Faults, sorted by time.
    pub events: Vec<(u64, Fault)>,
    /// Simulated length (milliseconds).
    pub length_ms: u64,
    /// The time scale of the node agents' and the policy's timing: 1 (the lab's: 1 s
    /// renewals, Suspect after 2 s, Unhealthy after 4 s) or [`PRODUCTION_SCALE`] (production:
    /// 5 s renewals, thresholds of 10 s and 20 s). The schedule's faults, self-fence and
    /// watchdog timeouts and peer-check windows are drawn at scale 1 and stretched with it
    /// ([`Schedule::scaled`]); what is not the product's to set keeps its real value at every
    /// scale: the leader's 15 s Lease, watch lag, the controller's ticks and settle time, the
    /// power watch, clock jitter, late writes, the pod GC.
    pub scale: u64,
}

/// The time scale of production timing ([`Schedule::scale`]).
pub const PRODUCTION_SCALE: u64 = 5;

impl Schedule {
    /// The schedule of `seed`: in a quarter of them (drawn apart from the rest) the cluster
    /// grows while part of it is cut off (as [`Schedule::generate_with_joins`] does in every one).
    ///
    /// Then the machines' identity and nature (`add_machine_faults`: a miswired BMC, paused
    /// virtual machines, another machine under a name), nodes whose kills hang
    /// (`add_hung_kills`), second fences of a node (`add_requests`) and stock nodes
    /// (`add_stock`), each drawn apart too.
    ///
    /// Then a person's deletions of a node's NodeFence (`add_deletions`) and edits of a
    /// FenceTarget's BMC address (`add_edits`), each drawn apart too.
    ///
    /// Last, in one schedule of eight (drawn apart), production timing
    /// ([`PRODUCTION_SCALE`]).
    pub fn generate(seed: u64) -> Schedule {
        Schedule::drawn(seed, true, true, true)
    }

    /// The schedule of `seed` as drawn before stock nodes were (`add_stock`, 2026-12-02): the
    /// seeds recorded before then replay as they were found.
    pub fn generate_before_stock(seed: u64) -> Schedule {
        Schedule::drawn(seed, false, false, false)
    }

    /// The schedule of `seed` as drawn before a person's deletions of NodeFences were
    /// (`add_deletions`, 2026-12-02): the seeds recorded before then replay as they were found.
    pub fn generate_before_deletions(seed: u64) -> Schedule {
        Schedule::drawn(seed, true, false, false)
    }

    /// The schedule of `seed` as drawn before a person's edits of a FenceTarget's BMC address
    /// were (`add_edits`, 2026-12-02): the seeds recorded before then replay as they were
    /// found.
    pub fn generate_before_edits(seed: u64) -> Schedule {
        Schedule::drawn(seed, true, true, false)
    }

    fn drawn(seed: u64, stock: bool, deletions: bool, edits: bool) -> Schedule {
        let mut s = Schedule::generate_without_machine_faults(seed);
        s.add_machine_faults(&mut Rng::new(seed ^ 0x1DE7_7171));
        add_hung_kills(&mut s.nodes, &mut Rng::new(seed ^ 0x0D57_A7E5));
        add_partly_hung_kills(&mut s.nodes, &mut Rng::new(seed ^ 0x5E1E_C7ED));
        s.add_requests(&mut Rng::new(seed ^ 0x5EC0_4D15));
        if stock {
            s.add_stock(&mut Rng::new(seed ^ 0x5700_C4ED));
        }
        if deletions {
            s.add_deletions(&mut Rng::new(seed ^ 0xDE1E_7E5F));
        }
        if edits {
            s.add_edits(&mut Rng::new(seed ^ 0xED17_ADD5));
        }
        if Rng::new(seed ^ 0x7141_1E55).chance(12) {
            s = s.scaled(PRODUCTION_SCALE);
        }
        s
    }

    /// The same schedule at time scale `k` times its own: every fault's time and duration,
    /// every node's self-fence and watchdog timeouts and peer-check windows, the policy's
    /// power-off delay and the run's length (the world scales the renew and poll intervals,
    /// the request timeout and the policy's thresholds by [`Schedule::scale`]; the trust
    /// margin stays 1 s, as tight against the unscaled skews as at the lab's timing).
    pub fn scaled(mut self, k: u64) -> Schedule {
        let ki = i64::try_from(k).unwrap_or(1);
        for (at, f) in &mut self.events {
            *at *= k;
            match f {
                Fault::PowerCycle(_, ms)
                | Fault::FreezeLeaderAtCommand(ms)
                | Fault::Pause(_, ms) => *ms *= k,
                Fault::ControllerClockStep(ms) | Fault::NodeClockStep(_, ms) => *ms *= ki,
                _ => {}
            }
        }
        for n in &mut self.nodes {
            n.self_fence_after *= k;
            n.watchdog = n.watchdog.map(|w| w * k);
            n.peer_check = n.peer_check.map(|(vouch, valid)| (vouch * k, valid * k));
        }
        self.power_off_after *= k;
        self.length_ms *= k;
        self.scale *= k;
        self
    }

    /// The schedule of `seed` as drawn before the machines' identity and nature were (no
    /// miswired BMC, no virtual machine, no other machine under a name): the schedules the
    /// simulation found before then replay as they were found.
    pub fn generate_without_machine_faults(seed: u64) -> Schedule {
        let mut s = Schedule::base(seed);
        let mut joins = Rng::new(seed ^ 0x0010_1175);
        if joins.chance(25) {
            s.add_joins(&mut joins);
        }
        s
    }

    /// The schedule of `seed` without Node list changes.
    fn base(seed: u64) -> Schedule {
        let mut r = Rng::new(seed);
        let n = 3 + r.below(3) as usize;
        // Half the schedules run the agents' peer check, on most of their nodes.
        let peer = r.chance(50);
        let nodes = (0..n)
            .map(|_| {
                let fencing = match r.below(5) {
                    0 => Fencing::Power,
                    1 => Fencing::Storage,
                    2 => Fencing::PowerAndStorage,
                    _ => Fencing::None,
                };
                let mut self_fence_after = 3 + r.below(6);
                let watchdog = r.chance(if peer { 80 } else { 60 }).then(|| 2 + r.below(5));
                let nowayout = r.chance(if peer { 90 } else { 80 });
                let power_mode = initial_mode(&mut r);
                let storage_mode = initial_mode(&mut r);
                let peer_check = (peer && r.chance(80)).then(|| {
                    // The healthy window (vouch after − 4 s) must outlast the renew interval
                    // and the stamps' jitter for the node ever to count as healthy: mostly so,
                    // sometimes not (a node the controller never counts healthy).
                    self_fence_after = 8 + r.below(7);
                    let vouch_after = if r.chance(75) {
                        6 + r.below(self_fence_after - 7)
                    } else {
                        2 + r.below(self_fence_after - 3)
                    };
                    (vouch_after, 2 + r.below(6))
                });
                let skew_ms = if peer {
                    r.below(2_001) as i64 - 1_000
                } else {
                    0
                };
                NodeConfig {
                    fencing,
                    self_fence_after,
                    watchdog,
                    nowayout,
                    power_mode,
                    storage_mode,
                    peer_check,
                    skew_ms,
                    joins_late: false,
                    virtual_machine: false,
                    bmc_of: None,
                    kill_hangs: false,
                    some_kills_hang: false,
                    stock: false,
                }
            })
            .collect();
        let length_ms = 120_000;
        let mut events = Vec::new();
        let count = 2 + r.below(7);
        for _ in 0..count {
            let at = 3_000 + r.below(70_000);
            let node = r.below(n as u64) as usize;
            let heal_at = at + 500 + r.below(25_000);
            match r.below(if peer { 21 } else { 12 }) {
                0 => {
                    events.push((at, Fault::CutApi(node)));
                    events.push((heal_at, Fault::Heal(node)));
                }
                1 => {
                    events.push((at, Fault::CutAll(node)));
                    events.push((heal_at, Fault::Heal(node)));
                }
                2 => {
                    // Flapping: cut and heal faster than the thresholds, a few times.
                    let mut t = at;
                    for _ in 0..3 {
                        events.push((t, Fault::CutApi(node)));
                        t += 500 + r.below(3_000);
                        events.push((t, Fault::Heal(node)));
                        t += 500 + r.below(3_000);
                    }
                }
                3 => {
                    events.push((at, Fault::HangAgent(node)));
                    if r.chance(50) {
                        events.push((heal_at, Fault::ResumeAgent(node)));
                    }
                }
                4 => {
                    events.push((at, Fault::CrashAgent(node)));
                    if r.chance(60) {
                        events.push((heal_at, Fault::RestartAgent(node)));
                    }
                }
                5 => {
                    // Restarted while partitioned.
                    events.push((at, Fault::CutApi(node)));
                    events.push((at + 200, Fault::CrashAgent(node)));
                    events.push((at + 4_000 + r.below(8_000), Fault::RestartAgent(node)));
                    events.push((heal_at + 10_000, Fault::Heal(node)));
                }
                6 => {
                    events.push((at, Fault::ControllerCrash));
                    events.push((heal_at, Fault::ControllerStart));
                }
                7 => {
                    events.push((at, Fault::ApiDown));
                    events.push((at + 1_000 + r.below(15_000), Fault::ApiUp));
                }
                8 => events.push((at, Fault::PowerDevice(node, mode(&mut r)))),
                9 => events.push((at, Fault::StorageDevice(node, mode(&mut r)))),
                10 => events.push((at, Fault::OperatorPowerOn(node))),
                11 => {
                    events.push((at, Fault::CutApi(node)));
                    events.push((at + 100, Fault::HangAgent(node)));
                    events.push((heal_at, Fault::Heal(node)));
                }
                12..=14 => {
                    // A group of nodes loses the control plane, one after the other (a minority
                    // vouches for each other but is no majority; a majority is excused, also a
                    // node whose fence started while it was cut alone).
                    let mut t = at;
                    let others: Vec<usize> =
                        (0..n).filter(|&i| i != node && r.chance(60)).collect();
                    for i in std::iter::once(node).chain(others) {
                        events.push((t, Fault::CutApi(i)));
                        events.push((t + 10_000 + r.below(30_000), Fault::Heal(i)));
                        t += r.below(6_000);
                    }
                }
                15..=17 => {
                    // An outage long enough to excuse, during which one node (or a few) is cut,
                    // hangs or crashes, and stays so after the API returns.
                    let up = at + 8_000 + r.below(20_000);
                    events.push((at, Fault::ApiDown));
                    events.push((up, Fault::ApiUp));
                    // Anywhere in the outage, or just before the API returns.
                    let cut_at = if r.chance(50) {
                        at + r.below(up - at + 2_000)
                    } else {
                        up - r.below(6_000)
                    };
                    let heal = up + 2_000 + r.below(30_000);
                    let hit: Vec<usize> = (0..n).filter(|&i| i == node || r.chance(20)).collect();
                    for i in hit {
                        match r.below(5) {
                            0 => {
                                events.push((cut_at, Fault::CutAll(i)));
                                events.push((heal, Fault::Heal(i)));
                            }
                            1 => {
                                events.push((cut_at, Fault::HangAgent(i)));
                                events.push((heal, Fault::ResumeAgent(i)));
                            }
                            2 => {
                                events.push((cut_at, Fault::CutApi(i)));
                                events.push((cut_at + 100, Fault::HangAgent(i)));
                                events.push((heal, Fault::Heal(i)));
                                events.push((heal, Fault::ResumeAgent(i)));
                            }
                            _ => {
                                events.push((cut_at, Fault::CutApi(i)));
                                events.push((heal, Fault::Heal(i)));
                            }
                        }
                    }
                }
                18 => {
                    // The node network splits, with or without an API outage.
                    let mask = r.below(1 << n).max(1);
                    events.push((at, Fault::SplitNodes(mask)));
                    events.push((heal_at + 5_000, Fault::HealNodes));
                    if r.chance(60) {
                        events.push((at + r.below(3_000), Fault::ApiDown));
                        events.push((at + 8_000 + r.below(20_000), Fault::ApiUp));
                    }
                }
                19 => {
                    // One node cut from the control plane for long (alone it is no majority).
                    events.push((at, Fault::CutApi(node)));
                    events.push((at + 15_000 + r.below(30_000), Fault::Heal(node)));
                }
                _ => {
                    // A long outage: everyone excused, then the API returns.
                    events.push((at, Fault::ApiDown));
                    events.push((at + 8_000 + r.below(30_000), Fault::ApiUp));
                }
            }
        }
        // Wall-clock steps of the controller's host, drawn apart from `r` so that every other
        // part of a schedule stays what it was for its seed.
        let mut clock = Rng::new(seed ^ 0xC10C_57E9);
        if clock.chance(30) {
            for _ in 0..1 + clock.below(2) {
                let at = 3_000 + clock.below(90_000);
                let size = 1_000 + clock.below(30_000) as i64;
                let step = if clock.chance(70) { size } else { -size };
                events.push((at, Fault::ControllerClockStep(step)));
            }
        }
        if clock.chance(30) {
            for _ in 0..1 + clock.below(2) {
                let at = 3_000 + clock.below(90_000);
                let node = clock.below(n as u64) as usize;
                let size = 1_500 + clock.below(30_000) as i64;
                let step = if clock.chance(50) { size } else { -size };
                events.push((at, Fault::NodeClockStep(node, step)));
            }
        }
        // Frozen leaders, drawn apart from `r` too. Half of them are aimed: a node is fenced,
        // heals, and the leader freezes at its next command (often the unblock of that
        // recovery) for long enough that a standby finishes the recovery and fences the node
        // again, with its agent hung, while the old leader's command waits to be delivered.
        let mut freeze = Rng::new(seed ^ 0x0F2E_E2E5);
        let mut aimed_at = None;
        if freeze.chance(25) {
            // The freeze starts about when the recovery unblocks (a few seconds after the
            // heal); the standby takes over 15 s later and finishes that recovery; then the node
            // is cut again with its agent hung, fenced and released while the old leader waits.
            let node = freeze.below(n as u64) as usize;
            let at = 3_000 + freeze.below(30_000);
            let heal = at + 8_000 + freeze.below(8_000);
            events.push((at, Fault::CutApi(node)));
            events.push((heal, Fault::Heal(node)));
            let again = heal + 24_000 + freeze.below(10_000);
            let thaw = again - heal + 8_000 + freeze.below(20_000);
            events.push((heal, Fault::FreezeLeaderAtCommand(thaw)));
            events.push((again, Fault::CutApi(node)));
            events.push((again + 100, Fault::HangAgent(node)));
            let back = again + 20_000 + freeze.below(20_000);
            events.push((back, Fault::Heal(node)));
            events.push((back, Fault::ResumeAgent(node)));
            if freeze.chance(60) {
                aimed_at = Some(node);
            }
        } else if freeze.chance(20) {
            let at = 3_000 + freeze.below(90_000);
            events.push((
                at,
                Fault::FreezeLeaderAtCommand(1_000 + freeze.below(40_000)),
            ));
        }
        // Lease writes that time out, drawn apart from `r` too.
        let mut slow = Rng::new(seed ^ 0x1EA5_E1A7);
        if slow.chance(30) {
            for _ in 0..1 + slow.below(2) {
                let node = slow.below(n as u64) as usize;
                let at = 3_000 + slow.below(90_000);
                let land = slow.chance(50);
                let until = at + 3_000 + slow.below(30_000);
                events.push((at, Fault::SlowWrites { node, land }));
                events.push((until, Fault::FastWrites(node)));
                // Half the time the node is then cut off while its writes still time out.
                if slow.chance(50) {
                    let cut = at + slow.below(until - at);
                    events.push((cut, Fault::CutApi(node)));
                    events.push((cut + 5_000 + slow.below(20_000), Fault::Heal(node)));
                }
            }
        }
        // The policy's power evidence and power faults, drawn apart from `r` too: evidence after
        // 1 s in half the schedules, 2–3 s in a fifth, none in the rest.
        let mut power = Rng::new(seed ^ 0x0B0F_F0FF);
        let power_off_after = match power.below(10) {
            0..=2 => 0,
            3..=7 => 1,
            _ => 2 + power.below(2),
        };
        add_power_faults(&mut events, n, &mut power);
        events.sort_by_key(|(t, _)| *t);
        // Hosts that must not power off, drawn apart from `r` too: some power-and-storage
        // nodes reset instead of powering off.
        let mut no_power_off = Rng::new(seed ^ 0x00FF_05E7);
        let mut nodes: Vec<NodeConfig> = nodes;
        for node in &mut nodes {
            if node.fencing == Fencing::PowerAndStorage && no_power_off.chance(50) {
                node.fencing = Fencing::StorageThenReset;
            }
        }
        // An aimed freeze's node is fenced by its storage alone (its hung processes live on).
        if let Some(k) = aimed_at {
            nodes[k].fencing = Fencing::Storage;
            nodes[k].storage_mode = DeviceMode::Works;
            nodes[k].watchdog = None;
        }
        Schedule {
            seed,
            nodes,
            trust_self_fence: r.chance(if peer { 85 } else { 60 }),
            power_on: r.chance(50),
            power_off_after,
            events,
            length_ms,
            scale: 1,
        }
    }
}

impl Schedule {
    /// The schedule of `seed` with a cluster that grows while part of it is cut off
    /// (`palisade-sim --joins`): one or two machines join 10–40 s in, while a group of the
    /// first members that is a majority of the Node list before the join, but not after, is
    /// cut from the control plane from just before the join for 20–60 s. (An agent cut off
    /// before the join still counts the old list; the controller must judge it against that
    /// list, not today's.)
    pub fn generate_with_joins(seed: u64) -> Schedule {
        let mut s = Schedule::base(seed);
        s.add_joins(&mut Rng::new(seed ^ 0x0010_1175));
        s.add_machine_faults(&mut Rng::new(seed ^ 0x1DE7_7171));
        s
    }

    /// One or two machines join 10–40 s in, while a group of the first members that is a
    /// majority of the Node list before the join, but not after, is cut from the control plane
    /// from just before the join for 20–60 s. Drawn from `r`, apart from the rest of the
    /// schedule. (An agent cut off before the join still counts the old list; the controller
    /// must judge it against that list, not today's.)
    fn add_joins(&mut self, r: &mut Rng) {
        let n = self.nodes.len();
        let joiners = 1 + r.below(2) as usize;
        if n < joiners + 2 {
            return;
        }
        let first = n - joiners;
        for node in &mut self.nodes[first..] {
            node.joins_late = true;
        }
        let at = 10_000 + r.below(30_000);
        for i in first..n {
            self.events.push((at + r.below(2_000), Fault::Join(i)));
        }
        // A majority of the `first` members, a minority of all `n`.
        let group = first / 2 + 1;
        if 2 * group < n {
            let cut = at.saturating_sub(1_000 + r.below(4_000));
            let heal = at + 20_000 + r.below(40_000);
            for i in 0..group {
                self.events.push((cut, Fault::CutApi(i)));
                self.events.push((heal, Fault::Heal(i)));
            }
        }
        // Faults drawn for a machine that is not in the cluster yet do nothing to it.
        self.events.sort_by_key(|(t, _)| *t);
    }
}

/// In 30 % of the schedules, one or two power faults among `n` nodes, drawn from `r`: a machine
/// that loses power (and half the time is powered on by a person later), a power cycle of
/// 0.2–4.2 s (on both sides of a 1 s `powerOffAfterSeconds`: a longer one is fenced by design),
/// or a BMC whose status reads start lying about a live machine (and half the time stop).
fn add_power_faults(events: &mut Vec<(u64, Fault)>, n: usize, r: &mut Rng) {
    if r.chance(30) {
        for _ in 0..1 + r.below(2) {
            let node = r.below(n as u64) as usize;
            let at = 3_000 + r.below(90_000);
            match r.below(3) {
                0 => {
                    events.push((at, Fault::PowerLoss(node)));
                    if r.chance(50) {
                        let on = at + 5_000 + r.below(40_000);
                        events.push((on, Fault::OperatorPowerOn(node)));
                    }
                }
                1 => events.push((at, Fault::PowerCycle(node, 200 + r.below(4_000)))),
                _ => {
                    events.push((at, Fault::PowerDevice(node, DeviceMode::ReadsOff)));
                    if r.chance(50) {
                        let fixed = at + 5_000 + r.below(30_000);
                        events.push((fixed, Fault::PowerDevice(node, DeviceMode::Works)));
                    }
                }
            }
        }
    }
}

impl Schedule {
    /// Faults of the machines' identity and nature, drawn from `r` apart from the rest of a
    /// schedule (see [`add_machine_faults`]).
    /// Second fences of a node ([`Fault::Request`]), drawn from `r` apart from the rest of a
    /// schedule: in 15 % of the schedules, one or two, each a person's request of a random
    /// node at a random time or, as often, a racing replica's request 4–16 s after a fault
    /// that silences a node (while the leader's own fence of it is likely under way).
    fn add_requests(&mut self, r: &mut Rng) {
        if !r.chance(15) {
            return;
        }
        let silencing = self.silencing(false);
        for _ in 0..1 + r.below(2) {
            let event = if silencing.is_empty() || r.chance(50) {
                let node = r.below(self.nodes.len() as u64) as usize;
                (
                    3_000 + r.below(90_000),
                    Fault::Request { node, manual: true },
                )
            } else {
                let (at, node) = silencing[r.below(silencing.len() as u64) as usize];
                let manual = r.chance(30);
                (
                    at + 4_000 + r.below(12_000),
                    Fault::Request { node, manual },
                )
            };
            self.events.push(event);
        }
        self.events.sort_by_key(|(t, _)| *t);
    }

    /// The faults that silence a node, with their times and nodes (and the hypervisor's
    /// pauses with `pauses`).
    fn silencing(&self, pauses: bool) -> Vec<(u64, usize)> {
        self.events
            .iter()
            .filter_map(|(at, f)| match f {
                Fault::CutApi(i)
                | Fault::CutAll(i)
                | Fault::HangAgent(i)
                | Fault::CrashAgent(i)
                | Fault::PowerLoss(i) => Some((*at, *i)),
                Fault::Pause(i, _) if pauses => Some((*at, *i)),
                _ => None,
            })
            .collect()
    }

    /// A person's deletions of a node's NodeFence ([`Fault::DeleteFence`]), drawn from `r`
    /// apart from the rest of a schedule: in 10 % of the schedules, one or two, each (three in
    /// four) 2–14 s after a fault that silences the node, while its fence is likely pending,
    /// fencing, waiting on a self-fence, releasing or recovering, or else of a random node at a
    /// random time. A second deletion of the same node often meets the fence the decision
    /// created after the first.
    fn add_deletions(&mut self, r: &mut Rng) {
        if !r.chance(10) {
            return;
        }
        let silencing = self.silencing(true);
        for _ in 0..1 + r.below(2) {
            let event = if silencing.is_empty() || r.chance(25) {
                let node = r.below(self.nodes.len() as u64) as usize;
                (3_000 + r.below(90_000), Fault::DeleteFence(node))
            } else {
                let (at, node) = silencing[r.below(silencing.len() as u64) as usize];
                (at + 2_000 + r.below(12_000), Fault::DeleteFence(node))
            };
            self.events.push(event);
        }
        self.events.sort_by_key(|(t, _)| *t);
    }

    /// A person's edits of the BMC address in a node's FenceTarget
    /// ([`Fault::EditTargetAddress`]), drawn from `r` apart from the rest of a schedule: in
    /// 10 % of the schedules, of a node with a BMC. A miswired node's address is mostly
    /// corrected (four in five), another's mostly mistyped to another machine's BMC (four in
    /// five; else rewritten to its own BMC under a new address); a typo is corrected again
    /// 3–30 s later in half of them. Three in four come from 10 s before to 14 s after a fault
    /// that silences the node (before its fence is planned, while it is pending, or while it
    /// fences, releases or recovers), the others at a random time.
    fn add_edits(&mut self, r: &mut Rng) {
        if !r.chance(10) {
            return;
        }
        let with_bmc: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].has_bmc())
            .collect();
        if with_bmc.is_empty() {
            return;
        }
        let silencing: Vec<(u64, usize)> = self
            .silencing(true)
            .into_iter()
            .filter(|&(_, i)| self.nodes[i].has_bmc())
            .collect();
        let n = self.nodes.len() as u64;
        let (at, i) = if silencing.is_empty() || r.chance(25) {
            let i = with_bmc[r.below(with_bmc.len() as u64) as usize];
            (3_000 + r.below(90_000), i)
        } else {
            let (at, i) = silencing[r.below(silencing.len() as u64) as usize];
            ((at + r.below(24_000)).saturating_sub(10_000).max(1_000), i)
        };
        let correct = if self.nodes[i].bmc_of.is_some() {
            r.chance(80)
        } else {
            r.chance(20)
        };
        if correct {
            self.events.push((at, Fault::EditTargetAddress(i, None)));
        } else {
            let m = (i + 1 + r.below(n - 1) as usize) % self.nodes.len();
            self.events.push((at, Fault::EditTargetAddress(i, Some(m))));
            if r.chance(50) {
                let fixed = at + 3_000 + r.below(27_000);
                self.events.push((fixed, Fault::EditTargetAddress(i, None)));
            }
        }
        self.events.sort_by_key(|(t, _)| *t);
    }

    /// In a fifth of the schedules whose nodes run the peer check, stock nodes: each
    /// peer-checked node runs a kubelet and a companion (seven in ten), and the companions of
    /// half the nodes (rounded down, stock ones only) stop getting their requests through
    /// while their kubelets renew, around the moment another node (one only its self-fence
    /// can fence, when there is one) is cut off from the control plane, whom they may then
    /// excuse. Drawn from `r`, apart from the rest of the schedule.
    fn add_stock(&mut self, r: &mut Rng) {
        if !self.nodes.iter().any(|n| n.peer_check.is_some()) || !r.chance(20) {
            return;
        }
        for n in self.nodes.iter_mut().filter(|n| n.peer_check.is_some()) {
            n.stock = r.chance(70);
        }
        let n = self.nodes.len();
        // The node cut off: one that only its own self-fence can fence, when there is one.
        let self_fenced: Vec<usize> = (0..n)
            .filter(|&i| self.nodes[i].fencing == Fencing::None && self.nodes[i].watchdog.is_some())
            .collect();
        let cut_off = if self_fenced.is_empty() {
            r.below(n as u64) as usize
        } else {
            self_fenced[r.below(self_fenced.len() as u64) as usize]
        };
        let at = 5_000 + r.below(40_000);
        let mut stock: Vec<usize> = (0..n)
            .filter(|&i| i != cut_off && self.nodes[i].stock)
            .collect();
        for _ in 0..(n / 2).min(stock.len()) {
            let k = stock.remove(r.below(stock.len() as u64) as usize);
            self.events.push((at, Fault::CompanionCut(k)));
            let heal = at + 20_000 + r.below(40_000);
            self.events.push((heal, Fault::CompanionHeal(k)));
        }
        self.events
            .push((at + r.below(3_000), Fault::CutApi(cut_off)));
        self.events
            .push((at + 30_000 + r.below(40_000), Fault::Heal(cut_off)));
        self.events.sort_by_key(|(t, _)| *t);
    }

    fn add_machine_faults(&mut self, r: &mut Rng) {
        add_machine_faults(&mut self.events, &mut self.nodes, r);
        self.events.sort_by_key(|(t, _)| *t);
    }
}

/// Nodes whose containers outlive their agent's kills ([`NodeConfig::kill_hangs`]), drawn from
/// `r` apart from the rest of a schedule: in 30 % of the schedules, one or two nodes. Only a
/// reset or a power loss ends such a node's containers, so a self-fence is complete only when
/// its watchdog has reset the machine: every term of the controller's trust that waits for
/// the watchdog is needed. In half of those schedules the watchdogs have the long timeouts
/// of production hardware (10–30 s, as `iTCO_wdt`'s 30 s default), longer than the skews and
/// margins that otherwise cover a short one.
fn add_hung_kills(nodes: &mut [NodeConfig], r: &mut Rng) {
    if r.chance(30) {
        if r.chance(50) {
            for node in nodes.iter_mut() {
                if node.watchdog.is_some() {
                    node.watchdog = Some(10 + r.below(21));
                }
            }
        }
        // Mostly among the nodes with a watchdog, the only ones whose self-fence can be
        // trusted: there a hung kill tests the trust's terms; elsewhere the clean proof.
        let watched: Vec<usize> = (0..nodes.len())
            .filter(|&i| nodes[i].watchdog.is_some())
            .collect();
        for _ in 0..1 + r.below(2) {
            let i = if !watched.is_empty() && r.chance(80) {
                watched[r.below(watched.len() as u64) as usize]
            } else {
                r.below(nodes.len() as u64) as usize
            };
            nodes[i].kill_hangs = true;
        }
    }
}

/// Nodes on which some containers outlive their agent's kills
/// ([`NodeConfig::some_kills_hang`]), drawn from `r` apart from the rest of a schedule: in
/// 20 % of the schedules, one node whose kills otherwise work. Such a node's released pods
/// part: the dead ones leave its runtime, the living ones stay in it, so a clean proof must
/// read every released pod against the inventory, not only the first.
fn add_partly_hung_kills(nodes: &mut [NodeConfig], r: &mut Rng) {
    if r.chance(20) {
        let i = r.below(nodes.len() as u64) as usize;
        if !nodes[i].kill_hangs {
            nodes[i].some_kills_hang = true;
        }
    }
}

/// Faults of the machines' identity and nature, drawn from `r` apart from the rest of a
/// schedule (so every other part of a schedule stays what it was for its seed):
///
/// - in 10 % of the schedules, one node with a BMC names another machine's BMC from the start
///   (a miswired address: issue 32 item 8);
/// - in 15 %, every machine is a virtual machine, and one or two of them are paused by their
///   hypervisor for 2–40 s, some while cut off from the control plane (item 4);
/// - in 6 %, a node's agent hangs for good (no watchdog, a storage-only fence, so its
///   containers live on behind the block), and 8–30 s later another machine takes over its
///   name (item 7).
fn add_machine_faults(events: &mut Vec<(u64, Fault)>, nodes: &mut [NodeConfig], r: &mut Rng) {
    let n = nodes.len();
    if r.chance(10) {
        let with_bmc: Vec<usize> = (0..n)
            .filter(|&i| {
                matches!(
                    nodes[i].fencing,
                    Fencing::Power | Fencing::PowerAndStorage | Fencing::StorageThenReset
                )
            })
            .collect();
        if !with_bmc.is_empty() {
            let i = with_bmc[r.below(with_bmc.len() as u64) as usize];
            let j = (i + 1 + r.below(n as u64 - 1) as usize) % n;
            nodes[i].bmc_of = Some(j);
        }
    }
    if r.chance(15) {
        for node in nodes.iter_mut() {
            node.virtual_machine = true;
        }
        for _ in 0..1 + r.below(2) {
            let node = r.below(n as u64) as usize;
            let at = 3_000 + r.below(80_000);
            if r.chance(40) {
                events.push((at.saturating_sub(1_000), Fault::CutApi(node)));
                events.push((at + 5_000 + r.below(30_000), Fault::Heal(node)));
            }
            events.push((at, Fault::Pause(node, 2_000 + r.below(38_000))));
        }
    }
    if r.chance(6) {
        // A member from the start (one that joins late has no name to take over yet).
        let k = r.below(n as u64) as usize;
        if nodes[k].joins_late {
            return;
        }
        nodes[k].fencing = Fencing::Storage;
        nodes[k].storage_mode = DeviceMode::Works;
        nodes[k].watchdog = None;
        nodes[k].bmc_of = None;
        let at = 3_000 + r.below(60_000);
        events.push((at, Fault::HangAgent(k)));
        events.push((at + 8_000 + r.below(22_000), Fault::Impostor(k)));
    }
}

fn initial_mode(r: &mut Rng) -> DeviceMode {
    match r.below(10) {
        0 => DeviceMode::Fails,
        1 | 2 => DeviceMode::Ignores,
        _ => DeviceMode::Works,
    }
}

fn mode(r: &mut Rng) -> DeviceMode {
    match r.below(3) {
        0 => DeviceMode::Works,
        1 => DeviceMode::Fails,
        _ => DeviceMode::Ignores,
    }
}
