//! What this replica could see of the API server, and when it last regained sight.
//!
//! A replica learns of heartbeats only through the API server. While it cannot reach the
//! server (an outage, a broken watch, the replica itself paused or starved), its detector
//! sees no renewal from anyone, so every node looks silent since before the blind spell. When
//! sight returns, a node that is merely slow to reconnect (a straggler) would look silent for
//! the outage plus its delay and be fenced at once, by the old leader or by a warm standby
//! that takes over.
//!
//! [`Sight`] records the end of the latest blind spell. The decision treats it like a quorum
//! guard's hold: silence is counted from the later of the node's last heartbeat change and
//! the end of the blind spell, so a node gets the full Unhealthy threshold of visible silence
//! before it can be fenced.
//!
//! Every replica records its own sight (leader or not), from two sources: the leader-election
//! round (every replica reads or renews the leader Lease every renew interval, so a gap
//! between two successful rounds longer than [`Sight::max_gap`] is a blind spell, whatever
//! its cause), and the watches that feed heartbeats (Nodes and node Leases: an error is the
//! start of a blind spell, and it ends only when every failed watch delivers again, not when
//! some other request succeeds: until its relist, a watch's cache holds what it held before).
//!
//! The same end also bounds the healthy-majority streaks
//! ([`palisade_decide::majority::Streaks::blind`]): a write first observed right after a blind
//! spell may have been made at any time during it.
//!
//! A process that starts has seen nothing before: its detector starts every node's clock at
//! its first sighting, which re-baselines silence the same way, and its streaks start blind
//! (see `Ctx::new`), so nothing needs to survive a restart.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// This replica's sight of the API server.
///
/// Guarantees: [`Sight::restored_at`] is never earlier than the end of any blind spell this
/// replica noticed: a contact after a reported loss, or after a gap longer than the maximum.
///
/// Assumptions: the election round runs about every renew interval on every replica, so a
/// missing contact is noticed; watch errors on the heartbeat watches are reported with
/// [`Sight::lost`].
#[derive(Debug)]
pub struct Sight {
    max_gap: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last_contact: Option<Instant>,
    /// The heartbeat watches that failed and have not delivered since.
    lost: std::collections::BTreeSet<&'static str>,
    restored_at: Option<Instant>,
}

impl State {
    fn restore(&mut self, at: Instant) {
        self.restored_at = Some(self.restored_at.map_or(at, |r| r.max(at)));
    }
}

impl Sight {
    /// Sight whose contacts (successful election rounds) must be at most `max_gap` apart.
    pub fn new(max_gap: Duration) -> Self {
        Self {
            max_gap,
            state: Mutex::new(State::default()),
        }
    }

    /// The longest gap between two contacts that is not a blind spell.
    pub fn max_gap(&self) -> Duration {
        self.max_gap
    }

    /// The API server answered at `at` (an election round, or any watch event). Ends a blind
    /// spell if the previous contact was longer than the maximum gap ago and no heartbeat
    /// watch is still lost.
    pub fn contact(&self, at: Instant) {
        let mut s = self.state.lock();
        let gap = s
            .last_contact
            .is_some_and(|last| at.saturating_duration_since(last) > self.max_gap);
        if gap {
            s.restore(at);
        }
        s.last_contact = Some(s.last_contact.map_or(at, |l| l.max(at)));
    }

    /// The heartbeat watch `watch` failed: this replica may miss renewals until it delivers
    /// again.
    pub fn lost(&self, watch: &'static str) {
        self.state.lock().lost.insert(watch);
    }

    /// The heartbeat watch `watch` delivered at `at`: a contact, and the end of the blind
    /// spell once no heartbeat watch is lost any more.
    pub fn delivered(&self, watch: &'static str, at: Instant) {
        let mut s = self.state.lock();
        if s.lost.remove(watch) && s.lost.is_empty() {
            s.restore(at);
        }
        drop(s);
        self.contact(at);
    }

    /// Whether a blind spell is going on (a heartbeat watch lost, or no contact for longer
    /// than the maximum gap).
    pub fn blind(&self, now: Instant) -> bool {
        let s = self.state.lock();
        !s.lost.is_empty()
            || s.last_contact
                .is_some_and(|last| now.saturating_duration_since(last) > self.max_gap)
    }

    /// When this replica last regained sight (`None`: it never lost it).
    pub fn restored_at(&self) -> Option<Instant> {
        self.state.lock().restored_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn regular_contacts_are_no_blind_spell() {
        let t0 = Instant::now();
        let sight = Sight::new(3 * S);
        for i in 0..10 {
            sight.contact(t0 + i * S);
        }
        assert_eq!(sight.restored_at(), None);
        assert!(!sight.blind(t0 + 10 * S));
    }

    #[test]
    fn a_gap_between_contacts_ends_in_a_restoration() {
        let t0 = Instant::now();
        let sight = Sight::new(3 * S);
        sight.contact(t0);
        assert!(
            sight.blind(t0 + 4 * S),
            "no contact for longer than the gap"
        );
        sight.contact(t0 + 12 * S);
        assert_eq!(sight.restored_at(), Some(t0 + 12 * S));
        assert!(!sight.blind(t0 + 13 * S));
        // The next regular contact does not move it.
        sight.contact(t0 + 13 * S);
        assert_eq!(sight.restored_at(), Some(t0 + 12 * S));
    }

    #[test]
    fn a_watch_error_ends_only_when_every_lost_watch_delivers_again() {
        let t0 = Instant::now();
        let sight = Sight::new(3 * S);
        sight.contact(t0);
        sight.lost("Lease");
        sight.lost("Node");
        assert!(sight.blind(t0 + S));
        // The election round answers: the watches' caches are still what they were.
        sight.contact(t0 + 2 * S);
        assert!(sight.blind(t0 + 2 * S));
        assert_eq!(sight.restored_at(), None);
        sight.delivered("Node", t0 + 3 * S);
        assert!(sight.blind(t0 + 3 * S), "the Lease watch has not relisted");
        sight.delivered("Lease", t0 + 4 * S);
        assert_eq!(sight.restored_at(), Some(t0 + 4 * S));
        assert!(!sight.blind(t0 + 4 * S));
    }

    #[test]
    fn a_late_report_never_moves_the_restoration_back() {
        let t0 = Instant::now();
        let sight = Sight::new(3 * S);
        sight.contact(t0);
        sight.contact(t0 + 10 * S);
        sight.lost("Lease");
        sight.delivered("Lease", t0 + 5 * S);
        assert_eq!(sight.restored_at(), Some(t0 + 10 * S));
    }
}
