//! The excuse: which peers vouched, and until when a strict majority covers this node.
//!
//! Pure state: no I/O, no clock reads. The poller feeds it answers and asks it
//! [`Excuse::excused_until`].

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::may_vouch;

/// Peers' latest vouches, and the majority arithmetic over them.
///
/// Guarantees: [`Excuse::excused_until`] is `Some` only when a strict majority of the members
/// has vouched, each peer's vouch answering a request sent no more than `answer_valid` before
/// the returned instant. A vouch stands for `answer_valid` from its request, whatever the peer
/// answers later: the controller's bound already covers every vouch for that long, and a peer
/// that renews again after an outage (and so answers "no") must not cut short the time a
/// slower node has to renew too.
///
/// Assumptions: `members` is the size of the Node list last seen, this node included, and
/// answers come from the peers of that list (the poller drops the answers of departed peers
/// with [`Excuse::retain`]).
#[derive(Debug, Clone)]
pub struct Excuse {
    vouch_after: Duration,
    answer_valid: Duration,
    members: usize,
    /// Per peer: the send time of the request its latest standing vouch answered.
    vouches: HashMap<String, Instant>,
}

impl Excuse {
    /// An excuse with no members and no answers: not excused.
    pub fn new(vouch_after: Duration, answer_valid: Duration) -> Self {
        Excuse {
            vouch_after,
            answer_valid,
            members: 0,
            vouches: HashMap::new(),
        }
    }

    /// The peer set changed: `members` is the size of the Node list, this node included
    /// (0: unknown, never excused).
    pub fn set_members(&mut self, members: usize) {
        self.members = members;
    }

    /// Drops the answers of peers for which `keep` is false (peers no longer in the Node list).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.vouches.retain(|name, _| keep(name));
    }

    /// Forgets every answer (the members stay).
    pub fn clear(&mut self) {
        self.vouches.clear();
    }

    /// Peer `name` answered a request sent at `sent`. A vouch counts from `sent`; of several
    /// vouches the latest send time counts (once). A "no" adds nothing and takes nothing away:
    /// an earlier vouch lapses on its own, `answer_valid` after its request.
    pub fn answer(&mut self, name: &str, sent: Instant, vouched: bool) {
        if !vouched {
            return;
        }
        self.vouches
            .entry(name.to_string())
            .and_modify(|t| *t = (*t).max(sent))
            .or_insert(sent);
    }

    /// The instant until which a strict majority of the members vouches for this node, or
    /// `None` when there is no such majority at `now`.
    ///
    /// This node is one voter when [`may_vouch`]`(self_last_write, now, vouch_after)`; its own
    /// vote holds at `now` and, like a peer's, counts for `answer_valid`. With `k =
    /// members / 2 + 1` voters needed and `n` of them peers, the result is the `n`-th newest
    /// peer vouch's send time plus `answer_valid`, if that is after `now`. When this node's
    /// own vote is the whole majority (a one-member cluster) the result is `now +
    /// answer_valid`.
    ///
    /// Guarantees: `None` when `members` is 0; `Some(t)` only with `t > now`, and only when at
    /// least `n` distinct peers vouched in answer to requests sent at or after `t -
    /// answer_valid`.
    pub fn excused_until(&self, self_last_write: Instant, now: Instant) -> Option<Instant> {
        if self.members == 0 {
            return None;
        }
        let k = self.members / 2 + 1;
        let self_votes = may_vouch(self_last_write, now, self.vouch_after);
        let need = k - usize::from(self_votes);
        let until = if need == 0 {
            now.checked_add(self.answer_valid)?
        } else {
            let mut valid: Vec<Instant> = self
                .vouches
                .values()
                .filter_map(|sent| sent.checked_add(self.answer_valid))
                .filter(|&until| until > now)
                .collect();
            if valid.len() < need {
                return None;
            }
            valid.sort_unstable_by(|a, b| b.cmp(a));
            valid[need - 1]
        };
        (until > now).then_some(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const A: Duration = Duration::from_secs(10);
    const C: Duration = Duration::from_secs(20);

    /// t0, and a self-write old enough that this node votes, and one so recent it does not.
    fn times() -> (Instant, Instant, Instant) {
        let t0 = Instant::now() + 100 * S;
        (t0, t0 - 60 * S, t0)
    }

    fn excuse(members: usize) -> Excuse {
        let mut e = Excuse::new(A, C);
        e.set_members(members);
        e
    }

    #[test]
    fn three_members_self_and_one_peer_excuse_until_that_peers_send_plus_c() {
        let (t0, self_quiet, _) = times();
        let mut e = excuse(3);
        assert_eq!(e.excused_until(self_quiet, t0), None);
        e.answer("b", t0 - 2 * S, true);
        assert_eq!(e.excused_until(self_quiet, t0), Some(t0 - 2 * S + C));
    }

    #[test]
    fn an_answer_older_than_c_does_not_excuse() {
        let (t0, self_quiet, _) = times();
        let mut e = excuse(3);
        e.answer("b", t0 - C, true);
        assert_eq!(e.excused_until(self_quiet, t0), None);
        assert_eq!(
            e.excused_until(self_quiet, t0 - S),
            Some(t0),
            "still valid a second earlier"
        );
    }

    #[test]
    fn a_later_no_neither_extends_nor_cuts_short_a_vouch() {
        let (t0, self_quiet, _) = times();
        let mut e = excuse(3);
        e.answer("b", t0 - 2 * S, true);
        e.answer("b", t0 - S, false);
        assert_eq!(
            e.excused_until(self_quiet, t0),
            Some(t0 - 2 * S + C),
            "the vouch stands until it lapses"
        );
        assert_eq!(e.excused_until(self_quiet, t0 - 2 * S + C), None);
    }

    #[test]
    fn self_with_a_recent_write_does_not_vote_so_two_peers_are_needed() {
        let (t0, _, self_busy) = times();
        let mut e = excuse(3);
        e.answer("b", t0 - 3 * S, true);
        assert_eq!(e.excused_until(self_busy, t0), None);
        e.answer("c", t0 - 1 * S, true);
        // The older of the two bounds the excuse.
        assert_eq!(e.excused_until(self_busy, t0), Some(t0 - 3 * S + C));
        // Self's write exactly A ago still forbids its vote.
        assert_eq!(e.excused_until(t0 - A, t0), Some(t0 - 3 * S + C));
    }

    #[test]
    fn five_members_need_three_voters() {
        let (t0, self_quiet, self_busy) = times();
        let mut e = excuse(5);
        e.answer("b", t0 - 5 * S, true);
        assert_eq!(e.excused_until(self_quiet, t0), None);
        e.answer("c", t0 - 4 * S, true);
        assert_eq!(e.excused_until(self_quiet, t0), Some(t0 - 5 * S + C));
        assert_eq!(e.excused_until(self_busy, t0), None);
        e.answer("d", t0 - 6 * S, true);
        assert_eq!(e.excused_until(self_busy, t0), Some(t0 - 6 * S + C));
        // With self voting, the two newest peers bound it.
        assert_eq!(e.excused_until(self_quiet, t0), Some(t0 - 5 * S + C));
    }

    #[test]
    fn unknown_peer_set_is_never_excused() {
        let (t0, self_quiet, _) = times();
        let mut e = excuse(0);
        e.answer("b", t0 - S, true);
        e.answer("c", t0 - S, true);
        assert_eq!(e.excused_until(self_quiet, t0), None);
    }

    #[test]
    fn duplicate_answers_from_one_peer_count_once_at_the_latest_send() {
        let (t0, self_quiet, self_busy) = times();
        let mut e = excuse(3);
        e.answer("b", t0 - 4 * S, true);
        e.answer("b", t0 - 2 * S, true);
        e.answer("b", t0 - 3 * S, true);
        assert_eq!(
            e.excused_until(self_busy, t0),
            None,
            "one peer is one voter"
        );
        assert_eq!(e.excused_until(self_quiet, t0), Some(t0 - 2 * S + C));
    }

    #[test]
    fn four_members_need_three_voters_not_two() {
        let (t0, self_quiet, _) = times();
        let mut e = excuse(4);
        e.answer("b", t0 - S, true);
        assert_eq!(
            e.excused_until(self_quiet, t0),
            None,
            "half is not a majority"
        );
        e.answer("c", t0 - S, true);
        assert!(e.excused_until(self_quiet, t0).is_some());
    }

    #[test]
    fn a_one_member_cluster_rests_on_self_alone() {
        let (t0, self_quiet, self_busy) = times();
        let e = excuse(1);
        assert_eq!(e.excused_until(self_quiet, t0), Some(t0 + C));
        assert_eq!(e.excused_until(self_busy, t0), None);
    }

    #[test]
    fn departed_peers_and_clear_drop_answers() {
        let (t0, _, self_busy) = times();
        let mut e = excuse(3);
        e.answer("b", t0 - S, true);
        e.answer("c", t0 - S, true);
        e.retain(|n| n != "c");
        assert_eq!(e.excused_until(self_busy, t0), None);
        e.answer("c", t0 - S, true);
        e.clear();
        assert_eq!(e.excused_until(self_busy, t0), None);
    }
}
