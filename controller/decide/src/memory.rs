//! The controller's decision memory: everything a decision reads that is not in the API
//! server, kept by one replica from what it observed, shared by the operator and the
//! simulation.
//!
//! A replica remembers, per node, when it saw the heartbeat change ([`Detector`]), what the
//! node advertised with the renewal it last saw ([`Memory::advertised`]), the node's streak
//! of timely Lease writes ([`Streaks`]), the Node sets it saw ([`MemberHistory`]), and, per
//! policy, the last tick in which the policy's quorum guard held.
//!
//! Guarantees:
//! - an advertisement is taken only with a renewal this replica observed (a first sighting or
//!   a change): trust is judged on what a node said when it was last seen alive, never on what
//!   appears later;
//! - a node that leaves the Node list is forgotten (its clock starts afresh if it returns);
//! - after a blind spell ([`Memory::blind`]), silence and streaks count from its end.
//!
//! Assumptions: the memory is lost with the process, which is safe because a new replica's
//! detector starts every node's clock at its first sighting and its streaks start blind
//! ([`Memory::new`]).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use palisade_model::advertise::{Advertisement, MemberSet};

use crate::clock::{Clocks, Mono};
use crate::detector::{Detector, Heartbeat, Observed};
use crate::majority::{peer_checked_trust, MemberHistory, Streaks, Write, DEFAULT_WINDOW};
use crate::phase::PeerTrust;
use crate::verdict::Verdict;

/// One replica's decision memory (see the module).
#[derive(Debug, Clone)]
pub struct Memory {
    /// Heartbeat markers and when they were seen to change.
    pub detector: Detector,
    /// The advertisement observed with each node's latest observed renewal.
    pub advertised: HashMap<String, Advertisement>,
    /// When a heartbeat *change* (not a first sighting) was last observed, per node.
    pub changed_at: HashMap<String, Mono>,
    /// Each node's current streak of timely Lease writes.
    pub streaks: Streaks,
    /// The Node sets seen, for the member set a peer check advertises.
    pub members: MemberHistory,
    /// Per policy, the last tick in which its quorum guard held.
    pub guard_held: HashMap<String, Mono>,
    /// The latest verdict per node.
    pub verdicts: HashMap<String, Verdict>,
    /// The Node set of the last [`Memory::nodes_now`] that forgot every node not in it, while
    /// no node was sighted for the first time since: the nodes the memory holds are all in
    /// it, so the same set again has nothing to forget.
    settled: Option<MemberSet>,
}

impl Default for Memory {
    fn default() -> Self {
        Self::new()
    }
}

impl Memory {
    /// The memory of a replica whose monotonic clock starts now (at zero).
    pub fn new() -> Self {
        Self::started(Mono(std::time::Duration::ZERO))
    }

    /// The memory of a replica that starts at `at` on its monotonic clock: it saw nothing
    /// before, so its first observations may be of writes made at any time (its streaks
    /// start blind).
    pub fn started(at: Mono) -> Self {
        let mut streaks = Streaks::new();
        streaks.blind(at);
        Self {
            detector: Detector::new(),
            advertised: HashMap::new(),
            changed_at: HashMap::new(),
            streaks,
            members: MemberHistory::new(),
            guard_held: HashMap::new(),
            verdicts: HashMap::new(),
            settled: None,
        }
    }

    /// The advertisement observed with `node`'s latest observed renewal (the default, which
    /// earns no trust, when none was).
    pub fn advertised_by(&self, node: &str) -> Advertisement {
        self.advertised.get(node).cloned().unwrap_or_default()
    }

    /// A blind spell of this replica ended at `restored`: silence and streaks count from it.
    pub fn blind(&mut self, restored: Mono) {
        self.detector.blind(restored);
        self.streaks.blind(restored);
    }

    /// The Node list now: the set is recorded, and nodes no longer in it are forgotten.
    ///
    /// Every tick calls this with every Node's name: the same set as last time costs a sort
    /// of borrowed names, nothing is copied or looked up (at 10,000 nodes, copying and
    /// comparing every name four times a second was a tenth of the controller's work).
    pub fn nodes_now<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let mut names: Vec<&str> = names.into_iter().collect();
        names.sort_unstable();
        names.dedup();
        let set = MemberSet::of_sorted(names.iter().copied());
        if self.settled == Some(set) && self.members.latest() == Some(set) {
            return;
        }
        let gone: Vec<String> = self
            .detector
            .nodes()
            .chain(self.streaks.nodes())
            .filter(|n| names.binary_search(n).is_err())
            .map(str::to_string)
            .collect();
        for n in gone {
            self.detector.forget(&n);
            self.streaks.forget(&n);
        }
        self.members
            .record(names.iter().map(|n| n.to_string()).collect());
        self.settled = Some(set);
    }

    /// Node `name`'s heartbeat as observed `now`, with its Lease's `renewTime` (stamped by the
    /// node's clock) and, read only when the heartbeat is new to this replica, what the Lease
    /// advertises. Returns what the detector saw and, for a renewal observed, whether it was
    /// a timely write.
    ///
    /// Guarantees: a Lease that carries a companion's write stamp
    /// ([`palisade_model::advertise::COMPANION_WRITTEN`]) extends the node's healthy streak
    /// by that stamp alone, never by the kubelet's `renewTime`: the companion's peer check
    /// vouches on its own writes, which the kubelet's renewals say nothing about (a companion
    /// whose writes fail while its kubelet renews may vouch, so it must not count healthy).
    pub fn observe(
        &mut self,
        name: &str,
        heartbeat: Heartbeat,
        renew_time: Option<Timestamp>,
        now: Clocks,
        advertisement: impl FnOnce() -> Advertisement,
    ) -> (Observed, Option<Write>) {
        let seen = self.detector.observe(name, heartbeat, now.mono);
        if seen == Observed::New {
            // A node the last Node set may not hold: the next nodes_now looks again.
            self.settled = None;
        }
        let mut write = None;
        if seen != Observed::Unchanged {
            let ad = advertisement();
            let written = match ad.companion_written {
                Some(stamp) => Some(stamp),
                None => renew_time,
            };
            write = written.map(|renew| {
                self.streaks.observe(
                    name,
                    renew,
                    now,
                    ad.peer_check.map(|p| p.vouch_after),
                    DEFAULT_WINDOW,
                )
            });
            self.advertised.insert(name.to_string(), ad);
        }
        if seen == Observed::Changed {
            self.changed_at.insert(name.to_string(), now.mono);
        }
        (seen, write)
    }

    /// The healthy-majority bound on trusting the self-fence of a node that advertised `ad`
    /// with its last observed renewal, judged `now`: counted among the member set it
    /// advertised (an older Node list, if it was cut off before Nodes joined or left).
    ///
    /// Guarantees: a node without a peer check gets no bound; a member set it did not
    /// advertise, or one this replica never saw, earns no trust
    /// ([`PeerTrust::NoMajority`]); the bound covers the advertised watchdog twice
    /// ([`crate::majority::peer_checked_trust`]).
    pub fn peer_trust(&self, ad: &Advertisement, margin: Duration, now: Mono) -> PeerTrust {
        let members = ad
            .peer_check
            .and_then(|p| p.members)
            .and_then(|m| self.members.get(m));
        self.peer_trust_among(members, ad, margin, now)
    }

    /// [`Memory::peer_trust`] counted among `members` (`None`: a set this replica never saw)
    /// and judged at `judge`.
    pub fn peer_trust_among(
        &self,
        members: Option<&crate::majority::Members>,
        ad: &Advertisement,
        margin: Duration,
        judge: Mono,
    ) -> PeerTrust {
        let Some(peer) = ad.peer_check else {
            return PeerTrust::NotPeerChecked;
        };
        let since = members.and_then(|s| self.streaks.majority_since_among(s, judge));
        // Without an advertised watchdog the self-fence earns no trust anyway; count none here.
        let watchdog = ad.watchdog.as_ref().map(|w| w.timeout).unwrap_or_default();
        match peer_checked_trust(since, peer.answer_valid, watchdog, margin) {
            Some(t) => PeerTrust::From(t),
            None => PeerTrust::NoMajority,
        }
    }

    /// Whether `node` is back since `since` (a fence's verified time, or its creation): Healthy
    /// now under `thresholds`, with a heartbeat *change* observed later than `since` plus
    /// `settle`.
    ///
    /// Guarantees: a first sighting never counts, nor a marker the node wrote just before it
    /// was powered off that reached this replica a little later (within `settle`).
    pub fn healthy_since(
        &self,
        node: &str,
        since: Timestamp,
        thresholds: crate::detector::Thresholds,
        settle: Duration,
        now: Clocks,
    ) -> bool {
        let Some(changed) = self.changed_at.get(node) else {
            return false;
        };
        let healthy = self.detector.health(node, now.mono, thresholds)
            == Some(crate::detector::Health::Healthy);
        let settle = k8s_openapi::jiff::SignedDuration::try_from(settle)
            .unwrap_or(k8s_openapi::jiff::SignedDuration::from_secs(2));
        let after = since.saturating_add(settle).unwrap_or(since);
        healthy && now.to_wall(*changed) > after
    }

    /// The last renewal of `node` this replica observed (as a wall time from its own
    /// monotonic clock) and how long it has watched the node silent since, as a fence reads
    /// them with heartbeat `marker` (the watched one, or one read fresh from the API).
    ///
    /// Guarantees: both are `None` unless `marker` is the one this replica's watch holds: a
    /// time observed with an older marker never stands for a renewal read fresh.
    pub fn renewal_seen(
        &self,
        node: &str,
        marker: Option<&str>,
        now: Clocks,
    ) -> (Option<Timestamp>, Option<Duration>) {
        if self.detector.marker(node).as_deref() != marker {
            return (None, None);
        }
        (
            self.changed_at.get(node).map(|c| now.to_wall(*c)),
            self.detector.last_change(node).map(|c| now.mono.since(c)),
        )
    }

    /// Records that `policy`'s quorum guard held at `at`.
    pub fn guard_held(&mut self, policy: &str, at: Mono) {
        self.guard_held.insert(policy.to_string(), at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clocks(s: u64) -> Clocks {
        Clocks {
            mono: Mono(Duration::from_secs(s)),
            wall: Timestamp::from_second(1_800_000_000 + i64::try_from(s).unwrap()).unwrap(),
        }
    }

    fn hb(marker: &str) -> Heartbeat {
        Heartbeat {
            lease_renew_time: Some(marker.into()),
            ready_heartbeat: None,
            companion_written: None,
        }
    }

    #[test]
    fn an_advertisement_is_taken_only_with_an_observed_renewal() {
        let mut m = Memory::new();
        let ad = |boot: &str| {
            let boot = boot.to_string();
            move || Advertisement {
                boot_id: Some(boot),
                ..Advertisement::default()
            }
        };
        let (seen, _) = m.observe("m0", hb("1"), None, clocks(1), ad("a"));
        assert_eq!(seen, Observed::New);
        // The same heartbeat: what the Lease says now is not read.
        let (seen, _) = m.observe("m0", hb("1"), None, clocks(2), || {
            panic!("read without a renewal")
        });
        assert_eq!(seen, Observed::Unchanged);
        assert_eq!(m.advertised["m0"].boot_id.as_deref(), Some("a"));
        assert!(
            !m.changed_at.contains_key("m0"),
            "a first sighting is no change"
        );
        m.observe("m0", hb("2"), None, clocks(3), ad("b"));
        assert_eq!(m.advertised["m0"].boot_id.as_deref(), Some("b"));
        assert_eq!(m.changed_at["m0"], Mono(Duration::from_secs(3)));
    }

    #[test]
    fn a_companion_stamp_alone_keeps_a_stock_node_healthy_never_the_kubelet_renewal() {
        use crate::majority::Write;
        let mut m = Memory::new();
        let wall = |s: u64| clocks(s).wall;
        let companion = |stamp: u64| {
            move || Advertisement {
                peer_check: Some(palisade_model::advertise::PeerCheck {
                    vouch_after: Duration::from_secs(20),
                    answer_valid: Duration::from_secs(10),
                    members: None,
                }),
                companion_written: Some(wall(stamp)),
                ..Advertisement::default()
            }
        };
        // The kubelet renewed at `renew` and the companion last wrote at `stamp`, seen `at`.
        let mut seen = |renew: u64, stamp: u64, at: u64| {
            let beat = Heartbeat {
                companion_written: Some(wall(stamp).to_string()),
                ..hb(&format!("r{renew}"))
            };
            m.observe("m0", beat, Some(wall(renew)), clocks(at), companion(stamp))
                .1
        };
        assert_eq!(seen(10, 10, 10), Some(Write::Started));
        // The kubelet renews; the companion has not written since 10 s (its writes fail, so
        // it may vouch 20 s later): the renewal extends nothing.
        assert_eq!(
            seen(20, 10, 20),
            Some(Write::Old),
            "a kubelet renewal counted as a companion write"
        );
        // The companion's next write does.
        assert_eq!(seen(20, 24, 24), Some(Write::Extended));
        // A node agent's Lease (no stamp) is timed by its renewals, as before.
        let agent = || Advertisement::default();
        let (_, w) = m.observe("m1", hb("r10"), Some(wall(10)), clocks(10), agent);
        assert_eq!(w, Some(Write::Started));
        let (_, w) = m.observe("m1", hb("r20"), Some(wall(20)), clocks(20), agent);
        assert_eq!(w, Some(Write::Extended));
    }

    #[test]
    fn a_node_that_leaves_the_list_is_forgotten() {
        let mut m = Memory::new();
        m.observe("m0", hb("1"), None, clocks(1), Advertisement::default);
        m.nodes_now(["m1"]);
        assert_eq!(m.detector.marker("m0"), None);
        let (seen, _) = m.observe("m0", hb("1"), None, clocks(2), Advertisement::default);
        assert_eq!(seen, Observed::New, "its clock starts afresh");
    }

    #[test]
    fn the_same_node_set_again_still_forgets_a_node_first_seen_since() {
        let mut m = Memory::new();
        m.observe("m1", hb("1"), None, clocks(1), Advertisement::default);
        m.nodes_now(["m1"]);
        m.nodes_now(["m1"]);
        assert!(m.detector.marker("m1").is_some(), "a listed node is kept");
        // Sighted after the set settled, and not in it: the same set must look again.
        m.observe("m0", hb("1"), None, clocks(2), Advertisement::default);
        m.nodes_now(["m1"]);
        assert_eq!(m.detector.marker("m0"), None);
        assert_eq!(
            m.members.latest(),
            Some(MemberSet::of(["m1"])),
            "the set recorded is the list's"
        );
    }
}
