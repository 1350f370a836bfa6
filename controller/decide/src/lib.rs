//! Palisade's fencing decisions, as pure functions with no I/O (no tokio, no kube client).
//!
//! The controller's loop is detect → decide → fence → release → recover. This crate holds the
//! parts of it that can be decided from facts alone:
//!
//! - [`acceptance`]: whether each policy and target is accepted (the same rules decide uses),
//!   reported as soon as they change;
//! - [`budget`]: when a fence phase's time budget runs out (on the wall clock and on the
//!   controller's monotonic clock, so a clock step never fails a fence mid-phase);
//! - [`detector`]: per-node Healthy / Suspect / Unhealthy from the controller's own monotonic
//!   observations of heartbeat *changes* ([`clock::Mono`]), never from node clocks;
//! - [`mod@decide`]: from a cluster [`snapshot::Snapshot`] to one typed [`verdict::Verdict`] per
//!   node (`Fence(plan)`, `Wait(until)`, `Hold(reason)`), with every safety gate (policy,
//!   exclusions, quorum, all-zones-down, forgiveness and PDB urgency, limits, priority, the
//!   self-fence trust rule, cooldown, dry run);
//! - [`escalation`]: which finished fences count toward a node's cooldown and escalation
//!   limit (not those that ended before fencing began);
//! - [`convert`]: pure conversions from cached Kubernetes objects (Node, Lease, Pod, PVC, PDB)
//!   to the snapshot types;
//! - [`guard`]: the last checks before a fence starts (never the leader's own node, limits
//!   from counts read from the API);
//! - [`memory`]: what one replica remembers of what it observed (heartbeat clocks, the
//!   advertisements, streaks, Node sets, guard holds, verdicts);
//! - [`power`]: power evidence, a machine its own identity-pinned device reads off, which makes
//!   a node that missed a renewal Unhealthy without waiting out the silence threshold;
//! - [`phase`]: the `NodeFence` state machine, `next_step(spec, status, observations) -> Step`,
//!   which never repeats an unsafe step and cannot release without a verified fence;
//! - [`record`]: the application of a step, and of what its I/O answered, to the fence's
//!   status (the record and the Event to tell).
//!
//! The I/O controller builds the inputs from its caches, performs the returned step, records
//! its result with [`record::apply`], and asks again. The simulation drives the same
//! functions against its simulated world.

pub mod acceptance;
pub mod budget;
pub mod clock;
pub mod convert;
pub mod decide;
pub mod detector;
pub mod escalation;
pub mod guard;
pub mod majority;
pub mod memory;
pub mod phase;
pub mod power;
pub mod record;
pub mod selector;
pub mod snapshot;
pub mod verdict;

pub use clock::{Clocks, Mono};
pub use decide::{decide, guards_holding, Decision};
pub use phase::{next_step, Observations, Step};
pub use verdict::{Cause, FencePlan, HoldReason, Verdict, WaitReason};
