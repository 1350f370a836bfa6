//! Which finished fences count toward a node's cooldown and escalation limit (the daily limit,
//! `escalation.maxFencesPerWindow` per `escalation.windowSeconds`).
//!
//! Both limits exist to stop Palisade from fencing a flapping node again and again. A fence
//! that ended before fencing began (a controller request cancelled because the node renewed
//! again, or one failed while Pending: superseded, spec changed, node not found) did nothing to
//! the node; counting it would let benign heartbeat flaps hold a later, real fence of the node
//! (issue 32, item 2).

use k8s_openapi::jiff::Timestamp;
use palisade_model::nodefence::{NodeFenceStatus, Phase};

/// The time a finished fence counts from in [`crate::snapshot::NodeSnapshot::past_fences`], or
/// `None` when it does not count: unfinished, or finished before fencing began.
///
/// `status` is the fence's status (`None` when it has none yet), `created` its creation time.
/// A counted fence counts from its last transition, else from its creation.
///
/// Guarantees: a finished fence that may have acted on the node counts: one whose status
/// records any step past Pending (a Fencing or later transition, a fencing token, a plan, a
/// device attempt, a level, evidence or a release), or whose status records no transition at
/// all (unknown history counts, DESIGN §5.7). Only a fence whose recorded history is Pending,
/// then Done or Failed, with nothing done, is left out.
///
/// Assumptions: the controller records the Fencing transition, the token and the plan in the
/// same status write as the first step past Pending, before any device command is sent.
pub fn counted_end(
    status: Option<&NodeFenceStatus>,
    created: Option<Timestamp>,
) -> Option<Timestamp> {
    let status = status?;
    if !status.phase.is_terminal() || ended_before_fencing(status) {
        return None;
    }
    status.transitions.last().map(|t| t.at.0).or(created)
}

/// A finished fence whose record says it never left Pending and did nothing.
fn ended_before_fencing(status: &NodeFenceStatus) -> bool {
    let only_pending_then_end = !status.transitions.is_empty()
        && status
            .transitions
            .iter()
            .all(|t| matches!(t.phase, Phase::Pending | Phase::Done | Phase::Failed));
    let nothing_done = status.fencing_token.is_none()
        && status.plan.is_none()
        && status.attempts.is_empty()
        && status.levels.is_empty()
        && status.evidence.is_empty()
        && !status.released_anything();
    only_pending_then_end && nothing_done
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use palisade_model::nodefence::{FencePlan, Transition};

    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn status(path: &[Phase]) -> NodeFenceStatus {
        NodeFenceStatus {
            phase: path.last().copied().unwrap_or_default(),
            transitions: path
                .iter()
                .enumerate()
                .map(|(i, p)| Transition {
                    phase: *p,
                    at: MicroTime(at(i as i64 * 10)),
                    message: String::new(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn only_finished_fences_that_may_have_acted_count_toward_cooldown_and_limit() {
        use Phase::*;
        let created = Some(at(-5));
        let last = |path: &[Phase]| Some(at((path.len() as i64 - 1) * 10));
        let with_token = |mut s: NodeFenceStatus| {
            s.fencing_token = Some(7);
            s
        };
        let with_plan = |mut s: NodeFenceStatus| {
            s.plan = Some(FencePlan { levels: vec![] });
            s
        };
        let cases: Vec<(&str, Option<NodeFenceStatus>, Option<Timestamp>)> = vec![
            // Cancelled (the node renewed again) or failed while Pending: nothing was done.
            ("cancelled", Some(status(&[Pending, Done])), None),
            ("failed in Pending", Some(status(&[Pending, Failed])), None),
            // Did something, or may have: counts from its last transition.
            (
                "recovered",
                Some(status(&[
                    Pending, Fencing, Fenced, Releasing, Released, Recovering, Done,
                ])),
                last(&[
                    Pending, Fencing, Fenced, Releasing, Released, Recovering, Done,
                ]),
            ),
            (
                "all levels failed",
                Some(status(&[Pending, Fencing, Failed])),
                last(&[Pending, Fencing, Failed]),
            ),
            (
                "failed after release",
                Some(status(&[Pending, Fencing, Fenced, Releasing, Failed])),
                last(&[Pending, Fencing, Fenced, Releasing, Failed]),
            ),
            // A record that contradicts itself counts (a token or plan is a step past Pending).
            (
                "Done with a token",
                Some(with_token(status(&[Pending, Done]))),
                last(&[Pending, Done]),
            ),
            (
                "Failed with a plan",
                Some(with_plan(status(&[Pending, Failed]))),
                last(&[Pending, Failed]),
            ),
            // No recorded history: unknown counts, from the creation time.
            (
                "no transitions",
                Some(NodeFenceStatus {
                    phase: Done,
                    ..Default::default()
                }),
                created,
            ),
            // Unfinished fences are not past fences.
            ("no status", None, None),
            ("pending", Some(status(&[Pending])), None),
            ("in flight", Some(status(&[Pending, Fencing])), None),
            (
                "released",
                Some(status(&[Pending, Fencing, Fenced, Releasing, Released])),
                None,
            ),
        ];
        for (name, st, want) in cases {
            assert_eq!(counted_end(st.as_ref(), created), want, "{name}");
        }
    }
}
