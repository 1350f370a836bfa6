//! When a `NodeFence` phase's time budget has run out.
//!
//! Budgets surface stuck operations ([`palisade_model::nodefence::Phase::budget`]). The
//! persisted deadline ([`NodeFenceStatus::deadline`]) is wall-clock time, so that a new leader
//! can read it, but a forward step of the controller's wall clock (NTP, a mis-set clock) would
//! then end a budget early and fail a fence mid-release. So the budget also runs on the
//! controller's own monotonic clock, from when this process first saw the phase.

use std::time::Duration;

use palisade_model::nodefence::NodeFenceStatus;

use crate::clock::Clocks;

/// Whether the current phase's budget has run out at `now`. `seen_for` is how long this
/// process has seen the fence in this phase on its monotonic clock (`None`: not tracked).
///
/// Guarantees: never before the persisted wall-clock deadline; and, when `seen_for` is known,
/// never before this process has itself watched the phase for the whole budget (the span from
/// the phase's recorded entry to its deadline), so no step of the wall clock, forward or back,
/// ends a budget early. A phase without a budget (or without a recorded entry) never runs out.
///
/// Assumptions: `seen_for` is measured from a moment at or after the phase was entered (the
/// process read the status in that phase), so it never exceeds the true time spent in it; a
/// new leader therefore counts the whole budget again from its first look, which only
/// lengthens the budget.
pub fn exceeded(status: &NodeFenceStatus, now: Clocks, seen_for: Option<Duration>) -> bool {
    let (Some(deadline), Some(entered)) = (status.deadline(), status.entered_at()) else {
        return false;
    };
    if now.wall <= deadline {
        return false;
    }
    let Some(seen_for) = seen_for else {
        return true;
    };
    let span = Duration::try_from(deadline.duration_since(entered)).unwrap_or(Duration::ZERO);
    seen_for > span
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use palisade_model::nodefence::Phase;

    use super::*;
    use crate::clock::Mono;

    fn wall(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// Releasing (budget 300 s), entered at `wall(0)`.
    fn releasing() -> NodeFenceStatus {
        let mut st = NodeFenceStatus::default();
        for p in [
            Phase::Pending,
            Phase::Fencing,
            Phase::Fenced,
            Phase::Releasing,
        ] {
            st.transition(p, wall(0), "").unwrap();
        }
        st
    }

    #[test]
    fn a_budget_runs_out_only_when_the_wall_clock_and_the_watched_time_both_say_so() {
        let st = releasing();
        let s = Duration::from_secs;
        // (wall now, watched on the monotonic clock, exceeded?)
        let cases: &[(i64, Option<Duration>, bool)] = &[
            (300, None, false),
            (301, None, true),
            (300, Some(s(400)), false),
            (301, Some(s(301)), true),
            // A forward step of the wall clock: 10 s watched.
            (3600, Some(s(10)), false),
            (3600, Some(s(300)), false),
            (3600, Some(s(301)), true),
            // A backward step: the wall deadline still holds.
            (200, Some(s(1000)), false),
            // A leader that first looked late counts from its first look.
            (700, Some(s(250)), false),
        ];
        for (at, seen, want) in cases {
            let now = Clocks {
                mono: Mono::from_secs(0),
                wall: wall(*at),
            };
            assert_eq!(
                exceeded(&st, now, *seen),
                *want,
                "wall {at} s, watched {seen:?}"
            );
        }
    }

    #[test]
    fn phases_without_a_budget_never_run_out() {
        let mut st = releasing();
        st.transition(Phase::Released, wall(0), "").unwrap();
        let now = Clocks {
            mono: Mono::from_secs(0),
            wall: wall(1_000_000),
        };
        assert!(!exceeded(&st, now, Some(Duration::MAX)));
        assert!(!exceeded(&NodeFenceStatus::default(), now, None));
    }
}
