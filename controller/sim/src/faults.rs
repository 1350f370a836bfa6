//! Seeded schedules: the cluster's configuration and the faults injected into it, in time.

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
    /// Faults, sorted by time.
    pub events: Vec<(u64, Fault)>,
    /// Simulated length (milliseconds).
    pub length_ms: u64,
}

impl Schedule {
    /// The schedule of `seed`.
    pub fn generate(seed: u64) -> Schedule {
        let mut r = Rng::new(seed);
        let n = 3 + r.below(3) as usize;
        let nodes = (0..n)
            .map(|_| {
                let fencing = match r.below(5) {
                    0 => Fencing::Power,
                    1 => Fencing::Storage,
                    2 => Fencing::PowerAndStorage,
                    _ => Fencing::None,
                };
                NodeConfig {
                    fencing,
                    self_fence_after: 3 + r.below(6),
                    watchdog: r.chance(60).then(|| 2 + r.below(5)),
                    nowayout: r.chance(80),
                    power_mode: initial_mode(&mut r),
                    storage_mode: initial_mode(&mut r),
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
            match r.below(12) {
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
                _ => {
                    events.push((at, Fault::CutApi(node)));
                    events.push((at + 100, Fault::HangAgent(node)));
                    events.push((heal_at, Fault::Heal(node)));
                }
            }
        }
        events.sort_by_key(|(t, _)| *t);
        Schedule {
            seed,
            nodes,
            trust_self_fence: r.chance(60),
            power_on: r.chance(50),
            events,
            length_ms,
        }
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
