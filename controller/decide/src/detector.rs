//! Detect: per-node health from the controller's *own* observations.
//!
//! For every node the detector remembers the last heartbeat markers it saw (the Lease
//! `renewTime` and the Ready condition's `lastHeartbeatTime`, treated as opaque values) and the
//! monotonic instant at which it last saw either of them *change*. The node's own clock is never
//! compared with ours: only "did it change, and when did we notice". A dead node produces no
//! events, so the I/O layer re-evaluates [`classify`] on requeues, scheduling the next one at
//! [`next_change`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use palisade_model::policy::Detection;

use crate::clock::Mono;

/// Heartbeat markers read from the API, compared only for equality.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heartbeat {
    /// The node Lease's `spec.renewTime`, verbatim.
    pub lease_renew_time: Option<String>,
    /// The node's Ready condition `lastHeartbeatTime`, verbatim.
    pub ready_heartbeat: Option<String>,
    /// The companion's write stamp on the Lease, verbatim (`None`: no companion writes).
    pub companion_written: Option<String>,
}

impl Heartbeat {
    /// Both markers as one opaque string, for equality checks that must survive a controller
    /// restart (they are persisted).
    ///
    /// The companion's stamp is appended only when present, so the markers of nodes without a
    /// companion (persisted by earlier versions) are unchanged.
    pub fn marker(&self) -> String {
        let mut m = format!(
            "lease={};ready={}",
            self.lease_renew_time.as_deref().unwrap_or("-"),
            self.ready_heartbeat.as_deref().unwrap_or("-")
        );
        if let Some(c) = &self.companion_written {
            m.push_str(";companion=");
            m.push_str(c);
        }
        m
    }
}

/// Health of a node as the controller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Health {
    /// A heartbeat change was observed within `suspectAfterSeconds`.
    Healthy,
    /// Silent for at least `suspectAfterSeconds`.
    Suspect,
    /// Silent for at least `unhealthyAfterSeconds`.
    Unhealthy,
}

impl Health {
    /// Stable label (metrics).
    pub fn label(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Suspect => "suspect",
            Health::Unhealthy => "unhealthy",
        }
    }
}

/// Detection thresholds as durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Silent this long: Suspect.
    pub suspect_after: Duration,
    /// Silent this long: Unhealthy.
    pub unhealthy_after: Duration,
}

impl From<&Detection> for Thresholds {
    fn from(d: &Detection) -> Self {
        let secs = |s: i64| Duration::from_secs(u64::try_from(s).unwrap_or(0));
        Self {
            suspect_after: secs(d.suspect_after_seconds),
            unhealthy_after: secs(d.unhealthy_after_seconds),
        }
    }
}

/// Classify a node last observed changing at `last_change`, at `now`.
///
/// Boundaries are inclusive: silent exactly `suspect_after` is Suspect.
pub fn classify(last_change: Mono, now: Mono, t: Thresholds) -> Health {
    let silent = now.since(last_change);
    if silent >= t.unhealthy_after {
        Health::Unhealthy
    } else if silent >= t.suspect_after {
        Health::Suspect
    } else {
        Health::Healthy
    }
}

/// The instant at which the node becomes Unhealthy if it stays silent.
pub fn unhealthy_at(last_change: Mono, t: Thresholds) -> Mono {
    last_change + t.unhealthy_after
}

/// When the classification will next change if the node stays silent (`None` once Unhealthy):
/// the requeue time that keeps the clock running for a dead node.
pub fn next_change(last_change: Mono, now: Mono, t: Thresholds) -> Option<Mono> {
    match classify(last_change, now, t) {
        Health::Healthy => Some(last_change + t.suspect_after),
        Health::Suspect => Some(last_change + t.unhealthy_after),
        Health::Unhealthy => None,
    }
}

/// What an observation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// First sighting of the node: its clock starts now (full grace after a controller restart).
    New,
    /// A marker changed: the node is alive as of now.
    Changed,
    /// Same markers as before: no news.
    Unchanged,
}

#[derive(Debug, Clone)]
struct NodeClock {
    last: Heartbeat,
    /// `last.marker()`, made once per change: a snapshot of every node each tick reads it,
    /// and formatting it each time was a tenth of a tick's work at 10,000 nodes.
    marker: Arc<str>,
    last_change: Mono,
    /// The intervals between the last few observed changes, newest last (at most
    /// [`GAPS_KEPT`]; the interval from a first sighting is not one).
    gaps: Vec<Duration>,
    /// A change was observed since the first sighting (intervals count from it).
    changed: bool,
    /// The node's longest recent intervals ([`Detector::long_gaps`]).
    long: Vec<LongGap>,
}

impl NodeClock {
    /// [`Detector::renewal_gap`].
    fn renewal_gap(&self) -> Option<Duration> {
        if self.gaps.len() < 2 {
            return None;
        }
        self.gaps.iter().max().copied()
    }
}

/// One observed interval between two heartbeat changes of a node, kept by
/// [`Detector::long_gaps`] while no later interval is at least as long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongGap {
    /// When the change that ended the interval was observed.
    pub ended: Mono,
    /// How long the interval was.
    pub length: Duration,
}

/// What the detector knows of one node ([`Detector::sighting`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    /// [`Detector::last_change`].
    pub last_change: Mono,
    /// [`Detector::marker`] (shared with the detector: reading it copies nothing).
    pub marker: Arc<str>,
    /// [`Detector::renewal_gap`].
    pub renewal_gap: Option<Duration>,
    /// [`Detector::long_gaps`].
    pub long_gaps: Vec<LongGap>,
}

/// Long intervals kept per node for [`Detector::long_gaps`].
pub const LONG_GAPS_KEPT: usize = 8;

/// Observed renewal intervals kept per node for [`Detector::renewal_gap`].
pub const GAPS_KEPT: usize = 4;

/// The per-node observation memory.
#[derive(Debug, Clone, Default)]
pub struct Detector {
    /// By node name (hashed: a tick looks up every node several times, and node names often
    /// share long prefixes, which made an ordered map's comparisons most of a tick's work).
    nodes: HashMap<String, NodeClock>,
    /// The end of the controller's latest blind spell ([`Detector::blind`]).
    blind_until: Option<Mono>,
}

impl Detector {
    /// An empty detector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record the markers seen for `node` at monotonic `at`.
    ///
    /// Guarantees: `last_change` never moves backwards, even if observations arrive with an
    /// older `at`; an unchanged marker never refreshes the node.
    pub fn observe(&mut self, node: &str, heartbeat: Heartbeat, at: Mono) -> Observed {
        match self.nodes.get_mut(node) {
            None => {
                self.nodes.insert(
                    node.to_string(),
                    NodeClock {
                        marker: heartbeat.marker().into(),
                        last: heartbeat,
                        last_change: at,
                        gaps: Vec::new(),
                        changed: false,
                        long: Vec::new(),
                    },
                );
                Observed::New
            }
            Some(clock) if clock.last != heartbeat => {
                clock.marker = heartbeat.marker().into();
                clock.last = heartbeat;
                let previous = clock.last_change;
                clock.last_change = previous.max(at);
                if clock.changed {
                    if clock.gaps.len() == GAPS_KEPT {
                        clock.gaps.remove(0);
                    }
                    let length = clock.last_change.since(previous);
                    clock.gaps.push(length);
                    // An interval that began before the end of the controller's own blind spell
                    // measures the controller, not the node: never a long gap.
                    if self.blind_until.is_none_or(|b| previous >= b) {
                        // A later interval at least as long makes every earlier one redundant
                        // for "the longest interval that ended after T".
                        clock.long.retain(|g| g.length > length);
                        if clock.long.len() == LONG_GAPS_KEPT {
                            clock.long.remove(0);
                        }
                        clock.long.push(LongGap {
                            ended: clock.last_change,
                            length,
                        });
                    }
                }
                clock.changed = true;
                Observed::Changed
            }
            Some(_) => Observed::Unchanged,
        }
    }

    /// The controller regained sight of the API server at `restored` after a blind spell (an
    /// outage, a broken watch, the controller paused): an interval between two renewals that
    /// began before then is the controller's blindness, not the node's lateness, so it is
    /// never kept as a long gap ([`Detector::long_gaps`]). The blind spell itself already
    /// re-baselines every node's silence (the caller's sight).
    ///
    /// Guarantees: no interval that began before the latest `restored` given is kept as a
    /// long gap after this call.
    pub fn blind(&mut self, restored: Mono) {
        self.blind_until = Some(self.blind_until.map_or(restored, |b| b.max(restored)));
    }

    /// Forget a node (its Node object was deleted).
    pub fn forget(&mut self, node: &str) {
        self.nodes.remove(node);
    }

    /// When a heartbeat change was last observed for `node`.
    pub fn last_change(&self, node: &str) -> Option<Mono> {
        self.nodes.get(node).map(|c| c.last_change)
    }

    /// How long the node takes between renewals, as observed: the longest of its last
    /// [`GAPS_KEPT`] intervals between heartbeat changes, once at least two were observed
    /// (`None` before: a node's rhythm is not known from one interval, and the interval from a
    /// first sighting starts mid-way, so it is never one).
    ///
    /// Guarantees: never shorter than any of the intervals it covers, so a node silent for
    /// longer than this has missed a renewal it made in each of them.
    pub fn renewal_gap(&self, node: &str) -> Option<Duration> {
        self.nodes.get(node)?.renewal_gap()
    }

    /// The node's longest recent renewal intervals, oldest first: each kept interval is longer
    /// than every interval observed after it (at most [`LONG_GAPS_KEPT`], the oldest dropped
    /// first). The longest interval that ended at or after any instant `t` is the first one
    /// whose `ended` is at or after `t`, as long as that instant is no older than the oldest
    /// kept.
    ///
    /// A node whose renewals reach the controller late (a starving API server, a congested
    /// link) shows here as a long interval that ended recently, even when it looks healthy
    /// now: the decision counts it as a sign that the control plane, not the node, is failing
    /// (see [`crate::decide::late_after`], the quorum guard).
    pub fn long_gaps(&self, node: &str) -> Vec<LongGap> {
        self.nodes
            .get(node)
            .map(|c| c.long.clone())
            .unwrap_or_default()
    }

    /// The node's last observed heartbeat markers as one opaque string (compared only for
    /// equality: a different marker means the node wrote a heartbeat since).
    pub fn marker(&self, node: &str) -> Option<String> {
        self.nodes.get(node).map(|c| c.marker.to_string())
    }

    /// Everything the detector knows of `node` that a decision reads, in one lookup (a
    /// snapshot of every node each tick looks each node up once, not four times): the same
    /// values as [`Self::last_change`], [`Self::marker`], [`Self::renewal_gap`] and
    /// [`Self::long_gaps`]. `None` if never observed.
    pub fn sighting(&self, node: &str) -> Option<Sighting> {
        let clock = self.nodes.get(node)?;
        Some(Sighting {
            last_change: clock.last_change,
            marker: Arc::clone(&clock.marker),
            renewal_gap: clock.renewal_gap(),
            long_gaps: clock.long.clone(),
        })
    }

    /// The node's health at `now`, `None` if never observed.
    pub fn health(&self, node: &str, now: Mono, t: Thresholds) -> Option<Health> {
        self.last_change(node).map(|c| classify(c, now, t))
    }

    /// The earliest moment after `after` at which some node's silence reaches one of
    /// `thresholds` (its last observed change plus the threshold): when a round must run for
    /// a verdict to change on time rather than at the next periodic tick. `None` if no node
    /// has such a moment.
    ///
    /// Guarantees: every moment before the one returned and after `after` is no node's
    /// crossing of any of `thresholds`.
    pub fn next_crossing(&self, after: Mono, thresholds: &[Duration]) -> Option<Mono> {
        self.nodes
            .values()
            .flat_map(|c| {
                thresholds
                    .iter()
                    .filter_map(|t| c.last_change.0.checked_add(*t))
            })
            .map(Mono)
            .filter(|at| *at > after)
            .min()
    }

    /// Nodes known to the detector, in no particular order.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: Thresholds = Thresholds {
        suspect_after: Duration::from_secs(2),
        unhealthy_after: Duration::from_secs(4),
    };

    fn hb(renew: &str) -> Heartbeat {
        Heartbeat {
            lease_renew_time: Some(renew.into()),
            ready_heartbeat: None,
            companion_written: None,
        }
    }

    #[test]
    fn the_next_crossing_is_the_first_threshold_a_node_reaches_after_the_last_round() {
        let mut d = Detector::new();
        d.observe("a", hb("1"), Mono::from_secs(10));
        d.observe("b", hb("1"), Mono::from_secs(11));
        let t = [T.suspect_after, T.unhealthy_after];
        // a: 12 and 14, b: 13 and 15.
        assert_eq!(
            d.next_crossing(Mono::from_secs(0), &t),
            Some(Mono::from_secs(12))
        );
        assert_eq!(
            d.next_crossing(Mono::from_secs(12), &t),
            Some(Mono::from_secs(13))
        );
        assert_eq!(
            d.next_crossing(Mono::from_secs(14), &t),
            Some(Mono::from_secs(15))
        );
        assert_eq!(d.next_crossing(Mono::from_secs(15), &t), None);
        // A renewal moves the node's crossings with it.
        d.observe("b", hb("2"), Mono::from_secs(14));
        assert_eq!(
            d.next_crossing(Mono::from_secs(14), &t),
            Some(Mono::from_secs(16))
        );
        assert_eq!(d.next_crossing(Mono::from_secs(0), &[]), None);
    }

    #[test]
    fn classification_table() {
        let last = Mono::from_secs(10);
        let cases = [
            (10, Health::Healthy, Some(12)),
            (11, Health::Healthy, Some(12)),
            (12, Health::Suspect, Some(14)),
            (13, Health::Suspect, Some(14)),
            (14, Health::Unhealthy, None),
            (1000, Health::Unhealthy, None),
            // "now" before the last change (clock readings out of order): healthy.
            (5, Health::Healthy, Some(12)),
        ];
        for (now, want, next) in cases {
            let now = Mono::from_secs(now);
            assert_eq!(classify(last, now, T), want, "{now:?}");
            assert_eq!(
                next_change(last, now, T),
                next.map(Mono::from_secs),
                "{now:?}"
            );
        }
        assert_eq!(unhealthy_at(last, T), Mono::from_secs(14));
    }

    #[test]
    fn only_a_changed_marker_refreshes_a_node() {
        let mut d = Detector::new();
        assert_eq!(d.observe("m0", hb("a"), Mono::from_secs(0)), Observed::New);
        assert_eq!(
            d.observe("m0", hb("a"), Mono::from_secs(3)),
            Observed::Unchanged
        );
        assert_eq!(d.health("m0", Mono::from_secs(3), T), Some(Health::Suspect));
        assert_eq!(
            d.observe("m0", hb("b"), Mono::from_secs(5)),
            Observed::Changed
        );
        assert_eq!(d.health("m0", Mono::from_secs(5), T), Some(Health::Healthy));
        assert_eq!(
            d.health("m0", Mono::from_secs(9), T),
            Some(Health::Unhealthy)
        );
        // A Ready heartbeat change alone also counts.
        let both = Heartbeat {
            lease_renew_time: Some("b".into()),
            ready_heartbeat: Some("x".into()),
            companion_written: None,
        };
        assert_eq!(d.observe("m0", both, Mono::from_secs(9)), Observed::Changed);
        assert_eq!(d.health("m0", Mono::from_secs(9), T), Some(Health::Healthy));
        assert_eq!(d.health("m1", Mono::from_secs(9), T), None);
        d.forget("m0");
        assert_eq!(d.last_change("m0"), None);
    }

    #[test]
    fn the_renewal_gap_is_the_longest_recent_interval_between_changes() {
        let mut d = Detector::new();
        let at = |s: u64| Mono::from_secs(s);
        d.observe("m0", hb("a"), at(0));
        d.observe("m0", hb("b"), at(1));
        assert_eq!(
            d.renewal_gap("m0"),
            None,
            "from a first sighting: no rhythm"
        );
        d.observe("m0", hb("c"), at(4));
        assert_eq!(d.renewal_gap("m0"), None, "one interval is no rhythm");
        d.observe("m0", hb("d"), at(6));
        assert_eq!(d.renewal_gap("m0"), Some(Duration::from_secs(3)));
        d.observe("m0", hb("d"), at(9));
        assert_eq!(
            d.renewal_gap("m0"),
            Some(Duration::from_secs(3)),
            "no change, no interval"
        );
        for (i, m) in ["e", "f", "g", "h"].iter().enumerate() {
            d.observe("m0", hb(m), at(10 + i as u64));
        }
        // Intervals 4 (6 → 10), then 1, 1, 1: the longest of the last four.
        assert_eq!(d.renewal_gap("m0"), Some(Duration::from_secs(4)));
        d.observe("m0", hb("i"), at(14));
        assert_eq!(d.renewal_gap("m0"), Some(Duration::from_secs(1)));
        assert_eq!(d.renewal_gap("m1"), None);
    }

    #[test]
    fn long_gaps_keep_the_longest_interval_after_any_instant() {
        let mut d = Detector::new();
        let at = |s: u64| Mono::from_secs(s);
        let secs = |g: &[LongGap]| {
            g.iter()
                .map(|g| (g.ended.since(Mono::default()).as_secs(), g.length.as_secs()))
                .collect::<Vec<_>>()
        };
        d.observe("m0", hb("a"), at(0));
        d.observe("m0", hb("b"), at(5));
        assert!(
            d.long_gaps("m0").is_empty(),
            "a first sighting is no interval"
        );
        d.observe("m0", hb("c"), at(6));
        d.observe("m0", hb("d"), at(16));
        d.observe("m0", hb("e"), at(17));
        d.observe("m0", hb("f"), at(20));
        assert_eq!(secs(&d.long_gaps("m0")), [(16, 10), (20, 3)]);
        // A later interval as long as an earlier one replaces it.
        d.observe("m0", hb("g"), at(23));
        assert_eq!(secs(&d.long_gaps("m0")), [(16, 10), (23, 3)]);
        d.observe("m0", hb("h"), at(40));
        assert_eq!(secs(&d.long_gaps("m0")), [(40, 17)]);
        // Bounded: a falling run keeps the newest LONG_GAPS_KEPT.
        let mut t = 40;
        for (i, step) in (1..=10).rev().enumerate() {
            t += step;
            d.observe("m0", hb(&format!("r{i}")), at(t));
        }
        let kept = d.long_gaps("m0");
        assert_eq!(kept.len(), LONG_GAPS_KEPT);
        assert_eq!(kept.last().unwrap().length, Duration::from_secs(1));
        assert!(kept
            .windows(2)
            .all(|w| w[0].length > w[1].length && w[0].ended < w[1].ended));
        assert!(d.long_gaps("m1").is_empty());

        // An interval that spans the controller's own blind spell is no long gap.
        let mut d = Detector::new();
        for (m, t) in [("a", 0), ("b", 1), ("c", 2)] {
            d.observe("m0", hb(m), at(t));
        }
        d.blind(at(8));
        d.observe("m0", hb("d"), at(9));
        assert_eq!(
            secs(&d.long_gaps("m0")),
            [(2, 1)],
            "2 → 9 began before the spell ended"
        );
        d.observe("m0", hb("e"), at(20));
        assert_eq!(secs(&d.long_gaps("m0")), [(20, 11)]);
    }

    #[test]
    fn a_renew_time_far_in_the_past_or_future_is_only_a_change() {
        // The node's clock is wrong by hours; we never look at the value, only whether it changed.
        let mut d = Detector::new();
        d.observe("m0", hb("1999-01-01T00:00:00Z"), Mono::from_secs(0));
        d.observe("m0", hb("2999-01-01T00:00:00Z"), Mono::from_secs(1));
        assert_eq!(d.last_change("m0"), Some(Mono::from_secs(1)));
        assert_eq!(d.health("m0", Mono::from_secs(2), T), Some(Health::Healthy));
    }

    proptest! {
        #[test]
        fn last_change_is_monotonic_and_health_worsens_with_silence(
            obs in proptest::collection::vec((0u8..3, 0u64..100), 1..40),
            probe in 0u64..200,
        ) {
            let mut d = Detector::new();
            let mut prev = None;
            for (marker, at) in obs {
                d.observe("n", hb(&marker.to_string()), Mono::from_secs(at));
                let now = d.last_change("n");
                prop_assert!(prev <= now);
                prev = now;
            }
            let last = d.last_change("n").unwrap();
            let a = classify(last, Mono::from_secs(probe), T);
            let b = classify(last, Mono::from_secs(probe + 1), T);
            prop_assert!(a <= b, "health improved with more silence: {a:?} -> {b:?}");
        }
    }
}
