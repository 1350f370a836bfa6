//! The healthy majority a peer-checked self-fence is judged against.
//!
//! A node agent that cannot renew its Lease keeps its pods (and keeps petting its watchdog)
//! only while a strict majority of the cluster's nodes *vouch* that they cannot reach the API
//! either (a control-plane outage, see [`palisade_model::advertise::PeerCheck`]). A node vouches
//! at instant `a` only if it sent no Lease write in `(a - vouch_after, a]`. This module keeps,
//! per node, the current *streak* of Lease writes: writes whose `renewTime` stamps follow each
//! other within the node's window `W = vouch_after - 4 × MAX_CLOCK_SKEW`. A node counts as
//! healthy from `first + 2 × MAX_CLOCK_SKEW` to `last + W` of its streak, and in that interval it
//! provably sent a write less than `vouch_after` before every instant: it could not vouch.
//!
//! Those instants are kept on the controller's **monotonic** clock ([`Mono`]): each stamp is
//! translated once, when its write is observed, by the wall and monotonic readings of that
//! moment (the timeliness checks bound how far the stamp is from the wall reading). A later
//! step of the controller's wall clock moves nothing: a backward step cannot make a streak
//! that ended look current, a forward step cannot shorten the trust bound. A step *before* an
//! observation makes that write untimely (future or late), which breaks the streak.
//!
//! So while the controller sees a strict majority healthy without a break since `t_h`
//! ([`Streaks::majority_since_among`], over the member set the node advertised), no strict majority can have vouched for anyone after `t_h`
//! (two strict majorities of one set share a node; the silent node is not healthy). A silent
//! node's excuse therefore ends by `t_h + answer_valid`, its watchdog resets it by
//! `+ 2 × watchdog timeout` (one for its agent's last pet, one for the pet the kernel adds if
//! that agent dies first), and [`peer_checked_trust`] adds both, the policy's margin and the
//! clock skew before it trusts the self-fence.
//!
//! Assumptions: node and controller wall clocks differ by at most [`MAX_CLOCK_SKEW`] (a write
//! stamped in the future beyond it, or observed more than [`MAX_OBSERVATION_DELAY`] after its
//! stamp, breaks the streak: a clock that is off makes a node *less* healthy, never more); the
//! controller's Node list is the set the agents count their majority over.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use palisade_model::advertise::MemberSet;

use crate::clock::{Clocks, Mono};

/// The largest wall-clock difference assumed between any node and the controller (one
/// constant for the controller and the node agents, in the model crate).
pub use palisade_model::advertise::MAX_CLOCK_SKEW;
/// A write observed later than this after its `renewTime` stamp does not count as healthy
/// (it is indistinguishable from a node whose clock is behind).
pub const MAX_OBSERVATION_DELAY: Duration = Duration::from_secs(3);

/// The window of a node that runs no peer check (it never vouches, so counting it healthy is
/// always safe; the window only has to outlast its renew interval).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(40);

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(signed(d)).unwrap_or(Timestamp::MAX)
}

/// The window within which a node's writes must follow each other to stay healthy: the
/// advertised vouch delay minus four clock skews, or `default` for a node that runs no peer
/// check (it never vouches, so any window is safe for it).
pub fn window(vouch_after: Option<Duration>, default: Duration) -> Duration {
    match vouch_after {
        Some(a) => palisade_model::advertise::PeerCheck::healthy_window(a),
        None => default,
    }
}

/// The instant on the controller's monotonic clock that wall time `t` was at when the
/// controller read `at` (saturating at the clock's origin, which only starts a streak later).
fn to_mono(at: Clocks, t: Timestamp) -> Mono {
    let ahead = t.duration_since(at.wall);
    let magnitude = ahead.unsigned_abs();
    if ahead.is_negative() {
        Mono(at.mono.0.saturating_sub(magnitude))
    } else {
        at.mono + magnitude
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Streak {
    /// The first write's stamp, on the controller's monotonic clock.
    first: Mono,
    /// The last write's stamp (the node's clock: streak continuity and order are judged on
    /// the stamps alone) and the same instant on the controller's monotonic clock.
    last_stamp: Timestamp,
    last: Mono,
    window: Duration,
    vouch_after: Option<Duration>,
}

/// What one observed write did to the node's streak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// It extended the current streak.
    Extended,
    /// It started a new streak (first write, a gap longer than the window, or a changed vouch
    /// delay).
    Started,
    /// Not newer than the last counted write: nothing changed.
    Old,
    /// Stamped in the future or observed too late: the streak is broken.
    Untimely,
}

/// Per-node write streaks.
#[derive(Debug, Clone, Default)]
pub struct Streaks {
    nodes: BTreeMap<String, Streak>,
    /// The end of the controller's latest blind spell ([`Streaks::blind`]).
    blind_until: Option<Mono>,
}

impl Streaks {
    /// No streaks.
    pub fn new() -> Self {
        Self::default()
    }

    /// The controller could not see the API server until `restored` (an outage, a broken
    /// watch, the controller paused, or its start): a write it observes before `restored` plus
    /// [`MAX_OBSERVATION_DELAY`] may have been made at any time during the blind spell, so it
    /// ends the node's streak instead of extending it.
    ///
    /// Guarantees: no streak is extended or started by a write observed within
    /// [`MAX_OBSERVATION_DELAY`] of the end of a blind spell, whatever the clocks read. The
    /// late check alone judges lateness on the controller's wall clock, which a step back
    /// defeats: a write made before a blind spell, first observed after it by a controller
    /// whose clock stepped back, would otherwise look fresh and count toward a healthy
    /// majority that never was (simulation seed 4107866).
    ///
    /// Assumptions: after a blind spell the controller lists the Leases afresh, so a write it
    /// observes later than [`MAX_OBSERVATION_DELAY`] after `restored` was made after the list.
    pub fn blind(&mut self, restored: Mono) {
        self.blind_until = Some(self.blind_until.map_or(restored, |b| b.max(restored)));
    }

    /// Records a Lease write of `node` stamped `renew` (its `renewTime`), observed when the
    /// controller's clocks read `observed`, advertising `vouch_after`.
    ///
    /// Guarantees: a streak only ever grows by writes stamped within its window of the previous
    /// one, with the same vouch delay; an untimely write ends it. The stamp is placed on the
    /// monotonic clock now, never again.
    pub fn observe(
        &mut self,
        node: &str,
        renew: Timestamp,
        observed: Clocks,
        vouch_after: Option<Duration>,
        default_window: Duration,
    ) -> Write {
        let future = renew > add(observed.wall, MAX_CLOCK_SKEW);
        let late = add(renew, MAX_OBSERVATION_DELAY) < observed.wall;
        if let Some(s) = self.nodes.get(node) {
            if renew <= s.last_stamp {
                return Write::Old;
            }
        }
        let unseen = self
            .blind_until
            .is_some_and(|b| observed.mono < b + MAX_OBSERVATION_DELAY);
        if future || late || unseen {
            self.nodes.remove(node);
            return Write::Untimely;
        }
        let w = window(vouch_after, default_window);
        let at = to_mono(observed, renew);
        match self.nodes.get_mut(node) {
            Some(s) if s.vouch_after == vouch_after && renew <= add(s.last_stamp, s.window) => {
                s.last_stamp = renew;
                // Never earlier than the previous write's instant (the wall clock may have
                // stepped back between the two observations).
                s.last = s.last.max(at);
                Write::Extended
            }
            _ => {
                self.nodes.insert(
                    node.to_string(),
                    Streak {
                        first: at,
                        last_stamp: renew,
                        last: at,
                        window: w,
                        vouch_after,
                    },
                );
                Write::Started
            }
        }
    }

    /// Forgets a node (its Node object is gone).
    pub fn forget(&mut self, node: &str) {
        self.nodes.remove(node);
    }

    /// Nodes with a streak.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// Since when a strict majority of `members` nodes, any nodes with a streak, has been
    /// healthy (tests of the streak arithmetic; the controller counts one member set, with
    /// `majority_since_among`).
    #[cfg(test)]
    fn majority_since(&self, members: usize, now: Mono) -> Option<Mono> {
        if members == 0 {
            return None;
        }
        let mut starts: Vec<Mono> = self
            .nodes
            .values()
            .filter(|s| s.last + s.window >= now)
            .map(|s| s.first + MAX_CLOCK_SKEW * 2)
            .filter(|start| *start <= now)
            .collect();
        starts.sort();
        starts.get(members / 2).copied()
    }
}

impl Streaks {
    /// Since when (controller monotonic time) a strict majority of `members` (the Node names a
    /// silent node's peer check counts) has been healthy without a break, as of `now`,
    /// counting only those nodes; `None` when no strict majority of them is healthy now.
    ///
    /// Guarantees: every node counted is in `members` and was, at every instant from the
    /// result to `now`, within its window of a write it sent before that instant (see the
    /// module docs), so the healthy majority intersects any strict majority of the same set
    /// (the peers that may excuse the node). Members without a streak count as not healthy.
    pub fn majority_since_among(&self, members: &Members, now: Mono) -> Option<Mono> {
        if members.is_empty() {
            return None;
        }
        let mut starts: Vec<Mono> = members
            .iter()
            .filter_map(|m| self.nodes.get(m))
            .filter(|s| s.last + s.window >= now)
            .map(|s| s.first + MAX_CLOCK_SKEW * 2)
            .filter(|start| *start <= now)
            .collect();
        starts.sort();
        starts.get(members.len() / 2).copied()
    }
}

impl Streaks {
    /// The members of `members` counted healthy at `now` (a current streak), in name order:
    /// what an operator needs to see when a peer-checked self-fence waits for a majority.
    pub fn healthy_among<'a>(&self, members: &'a Members, now: Mono) -> Vec<&'a str> {
        members
            .iter()
            .filter(|m| {
                self.nodes.get(*m).is_some_and(|s| {
                    s.last + s.window >= now && s.first + MAX_CLOCK_SKEW * 2 <= now
                })
            })
            .collect()
    }
}

/// One Node set's names, sorted and without duplicates, shared cheaply between the sets of a
/// [`MemberHistory`]: the names are cut into chunks where the content says (after a name whose
/// hash ends a chunk, about one in 32), so a join or a departure changes only
/// the chunk that holds the name, and a recorded set takes every other chunk from the set
/// recorded before it. 64 sets of 10,000 nodes cost one set of pointers and names plus 64
/// times a few hundred chunk pointers, not 64 × 10,000 pointers (a heap profile at 10,000
/// nodes found 10.8 MB in the per-name sharing this replaced).
///
/// Guarantees: the chunks follow from the names alone, so two sets with the same names are
/// equal, whichever set each shares its chunks with; the names iterate sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Members {
    chunks: std::sync::Arc<[Chunk]>,
    len: usize,
}

/// A run of consecutive names of a [`Members`].
type Chunk = std::sync::Arc<[std::sync::Arc<str>]>;

impl Members {
    /// The mean number of names per chunk (a power of two).
    const CHUNK: u64 = 32;

    /// The names, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter())
            .map(|n| n.as_ref())
    }

    /// How many names.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `name` ends its chunk: FNV-1a of the name, so the cut depends on the name only.
    fn ends_chunk(name: &str) -> bool {
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        hash % Self::CHUNK == 0
    }

    /// `names` (sorted and unique, as a `BTreeSet` iterates), each chunk taken from `like`
    /// where it holds the same chunk.
    fn sharing(names: BTreeSet<String>, like: Option<&Members>) -> Self {
        let old: std::collections::HashMap<&str, &Chunk> = like
            .into_iter()
            .flat_map(|m| m.chunks.iter())
            .filter_map(|c| Some((c.first()?.as_ref(), c)))
            .collect();
        let len = names.len();
        let mut chunks = Vec::new();
        let mut run: Vec<String> = Vec::new();
        let mut names = names.into_iter().peekable();
        while let Some(name) = names.next() {
            let last = Self::ends_chunk(&name) || names.peek().is_none();
            run.push(name);
            if last {
                let same = old.get(run[0].as_str()).filter(|c| {
                    c.len() == run.len() && c.iter().zip(&run).all(|(a, b)| **a == **b)
                });
                chunks.push(match same {
                    Some(c) => Chunk::clone(c),
                    None => run.drain(..).map(std::sync::Arc::from).collect(),
                });
                run.clear();
            }
        }
        Members {
            chunks: chunks.into(),
            len,
        }
    }
}

impl FromIterator<String> for Members {
    fn from_iter<I: IntoIterator<Item = String>>(names: I) -> Self {
        Members::sharing(names.into_iter().collect(), None)
    }
}

/// The Node sets the controller has seen, by [`MemberSet`], newest last (at most
/// [`MemberHistory::CAPACITY`]): a silent node's peer check counts the set it advertised, which
/// may be an older one than today's Node list.
///
/// Guarantees: [`MemberHistory::get`] returns only a set that was recorded and whose
/// [`MemberSet`] is the one asked for; a set not seen (or forgotten) gives `None`, which must
/// earn no peer trust.
#[derive(Debug, Clone, Default)]
pub struct MemberHistory {
    sets: std::collections::VecDeque<(MemberSet, Members)>,
}

impl MemberHistory {
    /// How many distinct sets are kept.
    pub const CAPACITY: usize = 64;

    /// No sets.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the current Node names (a no-op when they are the newest set already) and
    /// returns their [`MemberSet`].
    pub fn record(&mut self, names: BTreeSet<String>) -> MemberSet {
        let set = MemberSet::of_sorted(names.iter().map(String::as_str));
        if self.sets.back().is_some_and(|(s, _)| *s == set) {
            return set;
        }
        self.sets.retain(|(s, _)| *s != set);
        let names = Members::sharing(names, self.sets.back().map(|(_, m)| m));
        self.sets.push_back((set, names));
        while self.sets.len() > Self::CAPACITY {
            self.sets.pop_front();
        }
        set
    }

    /// The newest set recorded.
    pub fn latest(&self) -> Option<MemberSet> {
        self.sets.back().map(|(s, _)| *s)
    }

    /// The Node names of `set`, if it was recorded.
    pub fn get(&self, set: MemberSet) -> Option<&Members> {
        self.sets.iter().find(|(s, _)| *s == set).map(|(_, n)| n)
    }
}

/// The earliest instant (controller monotonic time) a peer-checked node's self-fence may be
/// trusted, given the healthy majority's start `majority_since` (`None`: no healthy majority
/// now, no trust yet).
///
/// Guarantees: at least the node's vouch validity plus twice its watchdog timeout plus
/// `margin` plus two clock skews after the majority's start: any excuse the node held ended by
/// the first, its agent stopped petting then, and its watchdog reset it within two timeouts of
/// that last pet: one for the pet, one for the pet the kernel adds when the agent that held
/// the device dies before the reset (an unexpected close; see
/// `palisade_model::advertise::Advertisement::trust`).
pub fn peer_checked_trust(
    majority_since: Option<Mono>,
    answer_valid: Duration,
    watchdog: Duration,
    margin: Duration,
) -> Option<Mono> {
    majority_since.map(|t| t + answer_valid + watchdog * 2 + margin + MAX_CLOCK_SKEW * 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wall time `ms` milliseconds into the test.
    fn tm(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }
    fn t(s: i64) -> Timestamp {
        tm(s * 1000)
    }
    /// The same instants on the monotonic clock (its origin 100 s before the test's).
    fn mm(ms: i64) -> Mono {
        Mono(Duration::from_millis(u64::try_from(100_000 + ms).unwrap()))
    }
    fn m(s: i64) -> Mono {
        mm(s * 1000)
    }
    /// Both clocks read at `ms`, the wall clock right.
    fn at(ms: i64) -> Clocks {
        Clocks {
            mono: mm(ms),
            wall: tm(ms),
        }
    }
    const A: Option<Duration> = Some(Duration::from_secs(8));
    const DEF: Duration = Duration::from_secs(10);

    /// Writes every second from `from` to `to` (inclusive), observed 100 ms later.
    fn renew(s: &mut Streaks, node: &str, from: i64, to: i64) {
        for x in from..=to {
            s.observe(node, t(x), at(x * 1000 + 100), A, DEF);
        }
    }

    #[test]
    fn the_healthy_members_are_those_a_majority_would_count() {
        let mut s = Streaks::new();
        renew(&mut s, "a", 0, 20);
        renew(&mut s, "b", 0, 10);
        let members: Members = ["a", "b", "c"].iter().map(|x| x.to_string()).collect();
        assert_eq!(s.healthy_among(&members, m(20)), vec!["a"]);
        assert_eq!(s.healthy_among(&members, m(12)), vec!["a", "b"]);
        assert_eq!(s.majority_since_among(&members, m(12)), Some(m(2)));
        assert_eq!(s.majority_since_among(&members, m(20)), None);
    }

    #[test]
    fn the_window_leaves_four_skews_below_the_vouch_delay() {
        assert_eq!(window(A, DEF), Duration::from_secs(4));
        assert_eq!(window(Some(Duration::from_secs(3)), DEF), Duration::ZERO);
        assert_eq!(window(None, DEF), DEF);
    }

    #[test]
    fn a_majority_is_healthy_since_its_kth_streak_start() {
        let mut s = Streaks::new();
        renew(&mut s, "a", 0, 20);
        renew(&mut s, "b", 5, 20);
        renew(&mut s, "c", 10, 20);
        // 3 members: need 2; starts (+2 s skew) are 2, 7, 12: the 2nd is 7.
        assert_eq!(s.majority_since(3, m(20)), Some(m(7)));
        // 5 members: need 3.
        assert_eq!(s.majority_since(5, m(20)), Some(m(12)));
        assert_eq!(s.majority_since(7, m(20)), None);
        assert_eq!(s.majority_since(0, m(20)), None);
    }

    #[test]
    fn a_majority_among_a_member_set_counts_only_its_members() {
        let mut s = Streaks::new();
        // Five Nodes now; a silent node's peer check still counts the old three (a, b, c),
        // of which only c is healthy. The newcomers d and e are healthy too.
        for n in ["c", "d", "e"] {
            renew(&mut s, n, 0, 20);
        }
        let old: Members = ["a", "b", "c"].map(String::from).into_iter().collect();
        let new: Members = ["a", "b", "c", "d", "e"]
            .map(String::from)
            .into_iter()
            .collect();
        // Three of five are healthy: a majority of the new set, none of the old one.
        assert_eq!(s.majority_since_among(&new, m(20)), Some(m(2)));
        assert_eq!(s.majority_since(5, m(20)), Some(m(2)));
        assert_eq!(s.majority_since_among(&old, m(20)), None);
        renew(&mut s, "b", 10, 20);
        assert_eq!(s.majority_since_among(&old, m(20)), Some(m(12)));
        assert_eq!(s.majority_since_among(&Members::default(), m(20)), None);
    }

    #[test]
    fn the_member_history_finds_recorded_sets_only() {
        let mut h = MemberHistory::new();
        let names = |n: &[&str]| -> BTreeSet<String> { n.iter().map(|s| s.to_string()).collect() };
        let old = h.record(names(&["a", "b", "c"]));
        assert_eq!(h.record(names(&["a", "b", "c"])), old);
        let new = h.record(names(&["a", "b", "c", "d", "e"]));
        assert_eq!(
            h.get(old),
            Some(&names(&["a", "b", "c"]).into_iter().collect())
        );
        assert_eq!(h.get(new).map(Members::len), Some(5));
        assert_eq!(
            h.get(new).unwrap().iter().collect::<Vec<_>>(),
            ["a", "b", "c", "d", "e"]
        );
        assert_eq!(h.get(MemberSet::of(["x"])), None);
        for i in 0..MemberHistory::CAPACITY {
            h.record(names(&[&format!("n{i}")]));
        }
        assert_eq!(h.get(old), None, "the oldest set is forgotten");
    }

    #[test]
    fn a_recorded_set_shares_every_chunk_but_the_changed_ones_and_equals_a_fresh_one() {
        let names = |n: std::ops::Range<usize>, skip: usize| -> BTreeSet<String> {
            n.filter(|i| *i != skip)
                .map(|i| format!("node-{i:05}"))
                .collect()
        };
        let mut h = MemberHistory::new();
        let all = h.record(names(0..10_000, usize::MAX));
        let less = h.record(names(0..10_000, 4_321));
        let more = h.record(names(0..10_001, 4_321));
        let (all, less, more) = (
            h.get(all).unwrap(),
            h.get(less).unwrap(),
            h.get(more).unwrap(),
        );
        assert!(
            all.chunks.len() > 100,
            "about one chunk per {} names",
            Members::CHUNK
        );
        for (set, fresh) in [
            (less, names(0..10_000, 4_321)),
            (more, names(0..10_001, 4_321)),
        ] {
            assert_eq!(set.len(), fresh.len());
            assert!(set.iter().eq(fresh.iter().map(String::as_str)));
            assert_eq!(*set, fresh.into_iter().collect::<Members>());
        }
        let fresh = |a: &Members, b: &Members| {
            a.chunks
                .iter()
                .filter(|c| !b.chunks.iter().any(|d| std::sync::Arc::ptr_eq(c, d)))
                .count()
        };
        assert_eq!(fresh(less, all), 1, "a departure changes one chunk");
        assert!(
            fresh(more, less) <= 2,
            "a join changes at most the last chunk and its own"
        );
    }

    #[test]
    fn a_gap_longer_than_the_window_restarts_the_streak() {
        let mut s = Streaks::new();
        renew(&mut s, "a", 0, 10);
        renew(&mut s, "b", 0, 10);
        // b is silent from 10 to 15 (gap 5 s > window 4 s): its streak restarts at 15.
        assert_eq!(s.observe("b", t(15), at(15_100), A, DEF), Write::Started);
        renew(&mut s, "a", 11, 20);
        renew(&mut s, "b", 16, 20);
        assert_eq!(s.majority_since(2, m(20)), Some(m(17)));
        // A node whose last write is older than its window is not healthy now.
        assert_eq!(s.majority_since(2, m(25)), None);
    }

    #[test]
    fn writes_stamped_in_the_future_or_seen_late_break_the_streak() {
        let mut s = Streaks::new();
        renew(&mut s, "a", 0, 10);
        assert_eq!(s.observe("a", t(11), at(14_500), A, DEF), Write::Untimely);
        assert_eq!(s.majority_since(1, m(12)), None);
        assert_eq!(s.observe("a", t(20), at(18_000), A, DEF), Write::Untimely);
        assert_eq!(s.observe("a", t(21), at(21_100), A, DEF), Write::Started);
        assert_eq!(s.observe("a", t(21), at(21_200), A, DEF), Write::Old);
    }

    #[test]
    fn a_changed_vouch_delay_starts_a_new_streak() {
        let mut s = Streaks::new();
        renew(&mut s, "a", 0, 10);
        let other = Some(Duration::from_secs(9));
        assert_eq!(
            s.observe("a", t(11), at(11_100), other, DEF),
            Write::Started
        );
        assert_eq!(s.majority_since(1, m(12)), None, "counts from 11 + 2 s");
        assert_eq!(s.majority_since(1, m(13)), Some(m(13)));
    }

    /// Seeds 3537759 and 3978628 of the simulator: the controller's wall clock stepped back
    /// (14.8 s, 22.4 s) after it had seen a cut-off node's last write. Judged on the wall
    /// clock, that streak looked current again and the node counted toward a healthy majority
    /// while it was in fact vouching for its peers, and the controller trusted a self-fence
    /// that had not happened.
    #[test]
    fn a_step_of_the_wall_clock_after_the_writes_does_not_revive_a_streak() {
        let mut s = Streaks::new();
        renew(&mut s, "a", 0, 10);
        // The last write (10 s) keeps a healthy until 14 s (window 4 s), on the monotonic clock.
        assert_eq!(s.majority_since(1, m(14)), Some(m(2)));
        // 25 s into the run the wall clock reads 10 s (a step back of 15 s): a is not healthy.
        assert_eq!(s.majority_since(1, m(25)), None);
        // A write observed after the step reads as stamped in the future: it breaks the streak
        // rather than extending it.
        let stepped = Clocks {
            mono: m(25),
            wall: t(10),
        };
        assert_eq!(s.observe("a", t(25), stepped, A, DEF), Write::Untimely);
        assert_eq!(s.majority_since(1, m(25)), None);
        // A step forward cannot stretch a streak either: its end was fixed at observation.
        renew(&mut s, "b", 30, 40);
        assert_eq!(s.majority_since(1, m(44)), Some(m(32)));
        assert_eq!(s.majority_since(1, m(45)), None);
    }

    #[test]
    fn a_write_first_seen_after_a_blind_spell_never_counts_whatever_the_clock() {
        // a writes until 10 s; its write at 11 s is made just as the controller goes blind
        // (an API outage) and is first observed when sight returns at 28 s, by a controller
        // whose wall clock has stepped back 16 s (it reads 12 s): not late by the wall clock.
        let stepped = Clocks {
            mono: m(28),
            wall: t(12),
        };
        let mut without = Streaks::new();
        renew(&mut without, "a", 0, 10);
        assert_eq!(
            without.observe("a", t(11), stepped, A, DEF),
            Write::Extended,
            "the wall clock alone takes the old write as fresh"
        );
        assert!(without.majority_since(1, m(28)).is_some());

        let mut s = Streaks::new();
        renew(&mut s, "a", 0, 10);
        s.blind(m(28));
        assert_eq!(s.observe("a", t(11), stepped, A, DEF), Write::Untimely);
        assert_eq!(s.majority_since(1, m(28)), None);
        // Writes observed once the list is behind us start a new streak.
        let later = Clocks {
            mono: m(32),
            wall: t(16),
        };
        assert_eq!(s.observe("a", t(16), later, A, DEF), Write::Started);
    }

    #[test]
    fn trust_waits_for_validity_two_watchdog_timeouts_margin_and_skew() {
        let trust = peer_checked_trust(
            Some(m(100)),
            Duration::from_secs(3),
            Duration::from_secs(10),
            Duration::from_secs(2),
        );
        // 100 + 3 + 2 × 10 + 2 + 2 × 1.
        assert_eq!(trust, Some(m(127)));
        assert_eq!(
            peer_checked_trust(None, Duration::ZERO, Duration::ZERO, Duration::ZERO),
            None
        );
    }

    /// The boundary case: the last write before a quiet spell stamped a skew late, the first
    /// after it a skew early. The stamps are less than the vouch delay apart, the sends more.
    #[test]
    fn opposite_skews_around_a_quiet_spell_do_not_bridge_it() {
        let mut s = Streaks::new();
        for (sent, skew) in [(0, 0), (1_000, 0), (3_000, 1_000), (11_500, -1_000)] {
            s.observe("q", tm(sent + skew), at(sent), A, DEF);
        }
        // No write was sent in (3 s, 11 s]: q may vouch at 11 s.
        let since = s.majority_since(1, mm(11_600));
        assert!(
            since.is_none_or(|h| h > mm(11_000)),
            "q counted healthy since {since:?}, across its quiet spell"
        );
    }

    /// The safety property itself, on random schedules: whenever a node could vouch (no write
    /// sent within `vouch_after` before the instant), the controller, judging later with
    /// everything it observed by then, never counts it healthy without a break since that
    /// instant, for a node clock anywhere within the bound at each write and any observation
    /// delay.
    #[test]
    fn a_node_that_may_vouch_is_never_counted_healthy() {
        use proptest::prelude::*;
        let cfg = ProptestConfig::with_cases(40_000);
        proptest!(cfg, |(gaps in proptest::collection::vec(500i64..14_000, 1..30),
                    skews in proptest::collection::vec(-1000i64..=1000, 30),
                    delay in 0i64..4000,
                    probe_after in 0usize..30,
                    probe_offset in 0i64..10_000,
                    later in 0i64..3_000)| {
            let a = Duration::from_secs(8);
            let mut sends = vec![];
            let mut sent = 0i64;
            for g in gaps {
                sent += g;
                sends.push(sent);
            }
            // Probe just after one of the sends, where the interesting boundaries are.
            let probe = sends[probe_after % sends.len()] + probe_offset;
            // The controller judges at real time `now`, having observed the writes whose
            // observation (send + delay) is due by then; stamps carry the node's skew.
            let now = probe + later;
            let mut s = Streaks::new();
            // The node's clock wanders anywhere within the bound between writes.
            for (i, &x) in sends.iter().enumerate().filter(|(_, &x)| x + delay <= now) {
                s.observe("q", tm(x + skews[i]), at(x + delay), Some(a), DEF);
            }
            let healthy_since_probe = s.majority_since(1, mm(now)).is_some_and(|h| h <= mm(probe));
            let may_vouch = !sends
                .iter()
                .any(|&x| x <= probe && x > probe - a.as_millis() as i64);
            prop_assert!(!(may_vouch && healthy_since_probe),
                "q may vouch at {probe} yet is counted healthy since then at {now} (sends {sends:?}, skews {skews:?}, delay {delay})");
        });
    }
}
