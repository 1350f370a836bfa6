//! Power evidence: a machine its own fence device reports off is dead, and need not wait out
//! the silence threshold.
//!
//! The I/O layer reads each node's power devices continuously and feeds every read into a
//! [`PowerWatch`]; [`evident_at`] says when the reads and the node's own silence together are
//! evidence. The rule, for a node whose policy sets `detection.powerOffAfterSeconds` to `after`:
//!
//! 1. every read of an unbroken run says **off**, from a device pinned to the machine's identity
//!    (the caller turns anything else, an unpinned device, no answer, an error, a state neither on
//!    nor off, into [`PowerReading::Unknown`], which breaks the run: no answer is never evidence);
//! 2. the run spans at least `after` (two reads at least; a power cycle whose off time is
//!    shorter never gives evidence, and the node is judged by its silence);
//! 3. the run began after the last heartbeat change the controller observed (a node seen
//!    renewing after its device read off contradicts the device, which then proves nothing);
//! 4. the node is silent longer than one and a quarter of its own longest recent renewal
//!    interval ([`crate::detector::Detector::renewal_gap`]): it missed a renewal it would have
//!    made. A device that lies about the power cannot alone fence a live node: it takes a
//!    second fault, a renewal more than a quarter of an interval late (the simulation's
//!    `ReadsOff` BMC with late Lease writes shows it).
//!
//! Reads are never joined across a pause longer than [`MAX_READ_GAP`]. With reads every
//! `interval`, evidence takes about `after` plus one interval of off reads (the span counts
//! from the first read's answer to the latest read's sending).
//!
//! Assumptions: a device pinned to the machine's identity reports that machine's power; the
//! node renews at a rhythm the controller has seen at least twice.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::Mono;

/// One read of a node's power, as the I/O layer classified it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerReading {
    /// Every power device of some level, each pinned to the machine's identity, read off.
    Off,
    /// Some device read on.
    On,
    /// Anything else: no answer, an error, an unpinned or indirect device, a state neither on
    /// nor off. Never evidence.
    Unknown,
}

/// An unbroken run of off reads. Each read is known only to have seen the state somewhere
/// between when it was sent and when it was answered, so the run is counted conservatively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffRun {
    /// The run's reads as (sent, answered), oldest first; at most [`READS_KEPT`] (the oldest
    /// are dropped, which only shortens what the run can prove).
    reads: Vec<(Mono, Mono)>,
}

/// Off reads kept per run.
pub const READS_KEPT: usize = 64;

/// The longest pause between one read's answer and the next read's sending that a run spans:
/// after a longer one the run starts again (a watch interval above it never gives evidence).
pub const MAX_READ_GAP: Duration = Duration::from_secs(10);

/// What the reads of a run sent after some instant prove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffSpan {
    /// When the first of those reads was sent.
    pub first: Mono,
    /// When it was answered (the machine was off by then).
    pub first_answered: Mono,
    /// When the latest was sent (the machine was still off after then).
    pub last: Mono,
}

impl OffSpan {
    /// How long the reads prove the machine stayed off: from the first one's answer to the
    /// latest one's sending.
    pub fn span(&self) -> Duration {
        self.last.since(self.first_answered)
    }
}

impl OffRun {
    /// A run of one read.
    pub fn new(sent: Mono, answered: Mono) -> Self {
        Self {
            reads: vec![(sent, answered.max(sent))],
        }
    }

    fn push(&mut self, sent: Mono, answered: Mono) {
        if self.reads.last().is_some_and(|(last, _)| sent < *last) {
            return;
        }
        // Nothing was read for a while (a stalled watch, a read that hung): the machine may
        // have been on in between, so the run starts again.
        if self
            .reads
            .last()
            .is_some_and(|(_, answered)| sent.since(*answered) > MAX_READ_GAP)
        {
            self.reads.clear();
        }
        if self.reads.len() == READS_KEPT {
            self.reads.remove(0);
        }
        self.reads.push((sent, answered.max(sent)));
    }

    /// The run's reads sent strictly after `instant` (a heartbeat change observed later than a
    /// read was sent leaves that read, and those before it, out).
    pub fn sent_after(&self, instant: Mono) -> Option<OffSpan> {
        let i = self.reads.iter().position(|(sent, _)| *sent > instant)?;
        let (first, first_answered) = self.reads[i];
        let (last, _) = *self.reads.last()?;
        Some(OffSpan {
            first,
            first_answered,
            last,
        })
    }

    /// The whole run.
    pub fn whole(&self) -> Option<OffSpan> {
        self.sent_after(Mono::default()).or_else(|| {
            let (first, first_answered) = *self.reads.first()?;
            Some(OffSpan {
                first,
                first_answered,
                last: self.reads.last()?.0,
            })
        })
    }
}

/// The per-node memory of power reads.
#[derive(Debug, Clone, Default)]
pub struct PowerWatch {
    runs: BTreeMap<String, OffRun>,
}

impl PowerWatch {
    /// An empty watch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a read of `node` sent at `sent` and answered at `answered`.
    ///
    /// Guarantees: only [`PowerReading::Off`] extends or starts a run; anything else ends it;
    /// a run never extends backwards in time.
    pub fn observe(&mut self, node: &str, reading: PowerReading, sent: Mono, answered: Mono) {
        match reading {
            PowerReading::Off => match self.runs.get_mut(node) {
                Some(run) => run.push(sent, answered),
                None => {
                    self.runs
                        .insert(node.to_string(), OffRun::new(sent, answered));
                }
            },
            PowerReading::On | PowerReading::Unknown => {
                self.runs.remove(node);
            }
        }
    }

    /// The node's current run of off reads, if its latest read was off.
    ///
    /// Guarantees: an answer that arrives after a later read's never undoes it: reads of one
    /// node are not overlapped by the caller (the watch never sends a node's next read before
    /// the previous one answered).
    pub fn off_run(&self, node: &str) -> Option<OffRun> {
        self.runs.get(node).cloned()
    }

    /// Forgets a node (deleted, or its fence started: a new run must begin from scratch).
    pub fn forget(&mut self, node: &str) {
        self.runs.remove(node);
    }

    /// Keeps only the nodes `keep` says to.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.runs.retain(|n, _| keep(n));
    }
}

/// The silence that proves a missed renewal: one and a quarter of the node's renewal interval.
pub fn missed_renewal(gap: Duration) -> Duration {
    gap + gap / 4
}

/// When the power evidence for a node became complete (see the module's rule), if it is by
/// `now`: `run` is the node's off run, `last_change` when the controller last observed its
/// heartbeat change, `gap` its renewal interval, `after` the policy's
/// `powerOffAfterSeconds` (zero: never).
///
/// Guarantees: `None` unless all four conditions of the rule hold at `now`; the instant
/// returned is never before the run's first off read plus `after`, nor before the missed
/// renewal.
pub fn evident_at(
    run: Option<&OffRun>,
    last_change: Mono,
    gap: Option<Duration>,
    after: Duration,
    now: Mono,
) -> Option<Mono> {
    let gap = gap?;
    let counted = run?.sent_after(last_change)?;
    if after.is_zero() || counted.span() < after {
        return None;
    }
    let at = (counted.first_answered + after).max(last_change + missed_renewal(gap));
    (now >= at).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Mono {
        Mono::from_millis(v)
    }

    const AFTER: Duration = Duration::from_secs(1);
    const GAP: Option<Duration> = Some(Duration::from_secs(1));

    /// Off reads every 100 ms from `first` to `last`, each answered at once.
    fn run(first: u64, last: u64) -> OffRun {
        let mut w = PowerWatch::new();
        let mut at = first;
        while at <= last {
            w.observe("n", PowerReading::Off, ms(at), ms(at));
            at += 100;
        }
        w.off_run("n").unwrap()
    }

    #[test]
    fn the_rule_case_by_case() {
        // Renewed at 10 s; off from 10.2 s, read off until 11.3 s; missed renewal at 11.25 s.
        let r = run(10_200, 11_300);
        assert_eq!(
            evident_at(Some(&r), ms(10_000), GAP, AFTER, ms(11_300)),
            Some(ms(11_250))
        );
        // The reads do not yet span `after`.
        let short = run(10_200, 11_100);
        assert_eq!(
            evident_at(Some(&short), ms(10_000), GAP, AFTER, ms(11_300)),
            None
        );
        // A renewal observed at 10.5 s: only the reads sent after it count (10.6 s on), and
        // they span `after` only once read until 11.6 s.
        assert_eq!(
            evident_at(Some(&r), ms(10_500), GAP, AFTER, ms(11_300)),
            None
        );
        let longer = run(10_200, 11_700);
        assert_eq!(
            evident_at(Some(&longer), ms(10_500), GAP, AFTER, ms(11_800)),
            Some(ms(11_750))
        );
        // Renewed after every read: nothing counts.
        assert_eq!(
            evident_at(Some(&r), ms(11_400), GAP, AFTER, ms(13_000)),
            None
        );
        // The node renews slowly (every 10 s): off reads alone do not make it dead until it
        // has missed a renewal.
        let slow = Some(Duration::from_secs(10));
        assert_eq!(
            evident_at(Some(&r), ms(10_000), slow, AFTER, ms(13_000)),
            None
        );
        assert_eq!(
            evident_at(Some(&r), ms(10_000), slow, AFTER, ms(22_600)),
            Some(ms(22_500))
        );
        // No rhythm known, no power evidence; zero turns it off.
        assert_eq!(
            evident_at(Some(&r), ms(10_000), None, AFTER, ms(13_000)),
            None
        );
        assert_eq!(
            evident_at(Some(&r), ms(10_000), GAP, Duration::ZERO, ms(13_000)),
            None
        );
        assert_eq!(evident_at(None, ms(10_000), GAP, AFTER, ms(13_000)), None);
    }

    #[test]
    fn anything_but_off_ends_the_run() {
        let mut w = PowerWatch::new();
        let read = |w: &mut PowerWatch, r, at| w.observe("m0", r, ms(at), ms(at));
        read(&mut w, PowerReading::Off, 1_000);
        read(&mut w, PowerReading::Off, 1_500);
        assert_eq!(
            w.off_run("m0").and_then(|r| r.whole()).map(|s| s.span()),
            Some(Duration::from_millis(500))
        );
        read(&mut w, PowerReading::Unknown, 1_700);
        assert_eq!(w.off_run("m0"), None, "no answer is never evidence");
        read(&mut w, PowerReading::Off, 2_000);
        read(&mut w, PowerReading::Off, 1_900);
        assert_eq!(
            w.off_run("m0")
                .and_then(|r| r.whole())
                .map(|s| (s.first, s.last)),
            Some((ms(2_000), ms(2_000))),
            "never backwards"
        );
        read(&mut w, PowerReading::On, 2_500);
        assert_eq!(w.off_run("m0"), None);
        w.observe("m1", PowerReading::Off, ms(2_500), ms(2_500));
        w.retain(|n| n != "m1");
        assert_eq!(w.off_run("m1"), None);
    }

    #[test]
    fn a_slow_read_counts_from_when_it_was_sent_and_when_it_answered() {
        // A read sent at 10.0 s answers off at 10.8 s; the node's last renewal was observed at
        // 10.3 s: the machine may have been on at 10.3 s, so that read does not count.
        let mut w = PowerWatch::new();
        w.observe("m0", PowerReading::Off, ms(10_000), ms(10_800));
        w.observe("m0", PowerReading::Off, ms(11_700), ms(11_710));
        let r = w.off_run("m0").unwrap();
        assert_eq!(
            r.whole().map(|s| s.span()),
            Some(Duration::from_millis(900))
        );
        assert_eq!(
            evident_at(Some(&r), ms(10_300), GAP, AFTER, ms(20_000)),
            None
        );
        // Observed before the first read was sent: evidence, but only once the span from the
        // first answer reaches `after`.
        assert_eq!(
            evident_at(Some(&r), ms(9_000), GAP, AFTER, ms(20_000)),
            None
        );
        w.observe("m0", PowerReading::Off, ms(11_900), ms(11_910));
        assert_eq!(
            evident_at(w.off_run("m0").as_ref(), ms(9_000), GAP, AFTER, ms(20_000)),
            Some(ms(11_800))
        );
    }

    #[test]
    fn a_pause_in_the_reads_starts_the_run_again() {
        let mut w = PowerWatch::new();
        w.observe("m0", PowerReading::Off, ms(1_000), ms(1_010));
        w.observe("m0", PowerReading::Off, ms(12_000), ms(12_010));
        let whole = w.off_run("m0").and_then(|r| r.whole()).unwrap();
        assert_eq!(whole.first, ms(12_000), "11 s without a read: a new run");
    }

    #[test]
    fn a_long_run_keeps_its_latest_reads() {
        let r = run(0, 100 * (READS_KEPT as u64 + 10));
        let whole = r.whole().unwrap();
        assert_eq!(whole.first, ms(1_100), "the oldest reads dropped");
        assert_eq!(whole.last, ms(100 * (READS_KEPT as u64 + 10)));
    }
}
