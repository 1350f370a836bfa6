//! A deterministic simulation of Palisade's controller core against a simulated cluster,
//! judged by the at-most-one checker.
//!
//! The controller's core runs unchanged: the decision memory ([`palisade_decide::memory`]),
//! [`palisade_decide::decide()`], the `NodeFence` state machine [`palisade_decide::next_step`]
//! and the record of each step ([`palisade_decide::record`]), the same the operator drives.
//! Around it, [`world`] simulates what the I/O controller talks to — an API (pods, Leases with the agents' advertisements, NodeFences, the
//! release taints, and Kubernetes' pod GC, which force-deletes the pods of a Node with the
//! out-of-service taint), machines with power and a storage path, node agents that renew,
//! start and kill containers and self-fence, hardware watchdogs, BMCs and a storage firewall
//! that succeed, fail or ignore commands — and a clock the simulation owns. [`power`] is the
//! simulated controller's power watch: the leader reads the BMCs and hands the product's off
//! runs to `decide()` (power evidence). [`faults`] draws a
//! seeded schedule of faults (partitions, hung, crashed and restarted agents, controller
//! crashes, leaders frozen before a device command while a standby takes over, API outages,
//! Lease writes that time out and land late or never, Nodes that join while part of the cluster
//! is cut off, clock steps, node-network splits, lying
//! devices, BMCs whose status reads say off, machines that lose power or are power-cycled,
//! flapping; agents with a peer check that excuse each other during an outage); the
//! world's checker asserts the invariants ([`Invariant`])
//! after every tick:
//!
//! - at most one live copy of each StatefulSet identity can do harm (a process whose writes
//!   can land on the storage for a pod with a claim; any live process for a pod without one);
//! - a pod is released only by a fence whose verified proof covers it;
//! - every fence has a cause: none is created for a machine that, in truth, was able to renew
//!   all along for long enough that neither its silence nor its BMC's reads could justify it
//!   ([`world::CAUSELESS_WINDOW_MS`]).
//!
//! Every run is a seed: the same seed replays the same history. A failing schedule is shrunk
//! ([`shrink`]) to the fewest fault events that still fail. [`Bug`]s plant known mistakes in
//! the harness that performs the core's steps, so a test proves the checker catches each.

pub mod faults;
pub mod power;
pub mod report;
pub mod rng;
pub mod world;

pub use faults::{Fault, Schedule};
pub use world::{Bug, Invariant, Outcome, Violation};

/// Runs one schedule and returns what happened.
pub fn run(schedule: &Schedule, bug: Option<Bug>) -> Outcome {
    world::World::new(schedule, bug).run()
}

/// Runs `count` schedules from `seed`, stopping at the first violation (returned with its
/// seed). Returns the number of schedules run and totals over them.
pub fn campaign(seed: u64, count: u64, bug: Option<Bug>) -> Campaign {
    campaign_of(Schedule::generate, seed, count, bug)
}

/// [`campaign`] over the schedules `generate` draws (for example
/// [`Schedule::generate_with_joins`]).
pub fn campaign_of(
    generate: fn(u64) -> Schedule,
    seed: u64,
    count: u64,
    bug: Option<Bug>,
) -> Campaign {
    let mut c = Campaign::default();
    for i in 0..count {
        let s = seed.wrapping_add(i);
        let schedule = generate(s);
        let out = run(&schedule, bug);
        c.schedules += 1;
        c.faults += schedule.events.len() as u64;
        c.fences += out.fences;
        c.power_fences += out.power_fences;
        c.released += out.released;
        c.held += out.held;
        c.excused += out.excused;
        c.resets += out.resets;
        c.requests += out.requests;
        c.superseded += out.superseded;
        c.companion_cuts += out.companion_cuts;
        c.deletions += out.deletions;
        c.deletions_held += out.deletions_held;
        c.refenced += out.refenced;
        c.edits += out.edits;
        c.edits_elsewhere += out.edits_elsewhere;
        c.edited_verified += out.edited_verified;
        c.edited_refused += out.edited_refused;
        c.stood_in += out.stood_in;
        c.stale_commands += out.stale_commands;
        c.late_writes += out.late_writes;
        c.warm_takeovers += out.warm_takeovers;
        c.lapsed_terms += out.lapsed_terms;
        if let Some(v) = out.violation {
            c.failure = Some((s, v));
            return c;
        }
    }
    c
}

/// Totals of a campaign.
#[derive(Debug, Default, Clone)]
pub struct Campaign {
    /// Schedules run.
    pub schedules: u64,
    /// Fault events injected.
    pub faults: u64,
    /// NodeFences created.
    pub fences: u64,
    /// NodeFences created on power evidence.
    pub power_fences: u64,
    /// Pods released.
    pub released: u64,
    /// Pods held as not covered.
    pub held: u64,
    /// Times a stale agent was excused by its peers' vouches.
    pub excused: u64,
    /// Warm resets of hosts that must not power off.
    pub resets: u64,
    /// NodeFences created beside the leader's decision (a person's, a racing replica's).
    pub requests: u64,
    /// NodeFences superseded by an older sibling.
    pub superseded: u64,
    /// Stock nodes' companions cut off while their kubelets renewed.
    pub companion_cuts: u64,
    /// NodeFences a person deleted.
    pub deletions: u64,
    /// Of those, deletions held by the finalizer while the fence held its node.
    pub deletions_held: u64,
    /// Fences created again for a node whose `Pending` fence a person deleted.
    pub refenced: u64,
    /// Edits of a FenceTarget's BMC address a person made.
    pub edits: u64,
    /// Of those, edits to another machine's BMC (a typo).
    pub edits_elsewhere: u64,
    /// Levels verified by a power off through an address a person wrote.
    pub edited_verified: u64,
    /// Fence steps through an address a person wrote that the identity check refused.
    pub edited_refused: u64,
    /// Fence steps whose planned BMC was no longer listed: the BMC listed now stood in for it.
    pub stood_in: u64,
    /// Device commands delivered by a deposed leader after a freeze.
    pub stale_commands: u64,
    /// Lease writes that landed after their agent gave up on them.
    pub late_writes: u64,
    /// Takeovers by a warm standby.
    pub warm_takeovers: u64,
    /// Leader terms that lapsed in an API outage.
    pub lapsed_terms: u64,
    /// The first failing seed and its violation.
    pub failure: Option<(u64, Violation)>,
}

/// Shrinks a failing schedule: removes fault events one at a time while the run still fails,
/// until no single removal keeps it failing. Returns the shrunk schedule.
pub fn shrink(schedule: &Schedule, bug: Option<Bug>) -> Schedule {
    let mut best = schedule.clone();
    loop {
        let mut smaller = None;
        for i in 0..best.events.len() {
            let mut candidate = best.clone();
            candidate.events.remove(i);
            if run(&candidate, bug).violation.is_some() {
                smaller = Some(candidate);
                break;
            }
        }
        match smaller {
            Some(s) => best = s,
            None => return best,
        }
    }
}
