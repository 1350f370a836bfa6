//! The simulated controller's power watch, as `palisade-controller`'s `power.rs` runs it: every
//! [`WATCH_MS`] the leader reads the BMC of each watched node (a FenceTarget with a power
//! device, a policy whose power evidence can come before its silence, no fence under way), one
//! read per node in flight; each read reaches its BMC and answers after a small latency, and
//! its answer goes into the product's [`PowerWatch`], whose runs the snapshot hands to
//! `decide()`. The watch lives in the controller's memory: a crash or a standby's takeover
//! starts it empty.

use std::collections::BTreeMap;

use palisade_decide::power::{OffRun, PowerReading, PowerWatch};
use palisade_decide::Mono;

use crate::rng::Rng;

/// How often the leader reads every watched BMC (the operator's default
/// `--power-watch-interval`).
pub const WATCH_MS: u64 = 1_000;

/// A node as the watch sees it at one tick of the world.
#[derive(Debug, Clone)]
pub struct NodeView<'a> {
    /// The Node's name.
    pub name: &'a str,
    /// What a read reaching its BMC now would say.
    pub says: PowerReading,
    /// Whether the operator reads it at all: its FenceTarget has a power device and its
    /// policy's `powerOffAfterSeconds` is on and below its `unhealthyAfterSeconds`.
    pub watchable: bool,
    /// A fence past Pending and not finished owns the node: it is not read, its run is
    /// forgotten, and an answer that arrives meanwhile is dropped.
    pub fence_under_way: bool,
}

/// A read sent and not yet answered.
#[derive(Debug, Clone)]
struct Read {
    sent: u64,
    /// When it reaches the BMC, which reads the machine then.
    reaches_at: u64,
    answers_at: u64,
    reading: Option<PowerReading>,
}

/// The leader's power watch.
#[derive(Debug, Clone, Default)]
pub struct Watch {
    runs: PowerWatch,
    next_round: u64,
    reading: BTreeMap<String, Read>,
}

impl Watch {
    /// The node's current run of off reads (the snapshot's `power_off`).
    pub fn off_run(&self, node: &str) -> Option<OffRun> {
        self.runs.off_run(node)
    }

    /// One tick at `now` (milliseconds) of a leader that runs: a round starts when one is due
    /// (a node whose read is still out is not read again), reads reach their BMCs, and the
    /// answered ones are recorded with the instants they were sent and answered. Latencies are
    /// drawn from `rng`: mostly under a second, one read in ten slow (up to 4 s, skipping rounds).
    pub fn tick(&mut self, now: u64, nodes: &[NodeView], rng: &mut Rng) {
        if now >= self.next_round {
            self.next_round = now + WATCH_MS;
            let watched = |n: &&NodeView| n.watchable && !n.fence_under_way;
            self.runs
                .retain(|name| nodes.iter().filter(watched).any(|n| n.name == name));
            for n in nodes.iter().filter(watched) {
                if self.reading.contains_key(n.name) {
                    continue;
                }
                let latency = if rng.chance(10) {
                    1_000 + rng.below(3_001)
                } else {
                    rng.below(751)
                };
                self.reading.insert(
                    n.name.to_string(),
                    Read {
                        sent: now,
                        reaches_at: now + rng.below(latency + 1),
                        answers_at: now + latency,
                        reading: None,
                    },
                );
            }
        }
        for n in nodes {
            let Some(read) = self.reading.get_mut(n.name) else {
                continue;
            };
            if read.reading.is_none() && now >= read.reaches_at {
                read.reading = Some(n.says);
            }
            if now < read.answers_at {
                continue;
            }
            // Read by now: it reaches the BMC no later than it answers.
            let (sent, reading) = (read.sent, read.reading.unwrap_or(PowerReading::Unknown));
            self.reading.remove(n.name);
            if !n.fence_under_way {
                let (sent, now) = (Mono::from_millis(sent), Mono::from_millis(now));
                self.runs.observe(n.name, reading, sent, now);
            }
        }
    }
}
