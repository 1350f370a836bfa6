//! The kubelet's container restart backoff, pure: [`RestartBackoff`].
//!
//! The first restart is immediate, then 10 s, 20 s, 40 s … capped at the maximum restart
//! period (default 300 s, configurable between 1 s and 300 s; a maximum below 10 s is also the
//! initial delay), and reset once a container ran cleanly for 10 minutes. This is a rule of
//! the pod lifecycle, not a retry policy: retries of calls (API requests, image pulls) use the
//! project's one backoff type, [`retry`] (`backon`'s exponential backoff).

use std::time::Duration;

/// The kubelet's initial restart delay.
pub const INITIAL_RESTART_DELAY: Duration = Duration::from_secs(10);
/// The kubelet's default (and largest allowed) maximum restart delay.
pub const DEFAULT_MAX_RESTART_DELAY: Duration = Duration::from_secs(300);
/// How long a container must run for its backoff to reset.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);

/// Restart backoff of one container. Times are monotonic durations since any fixed origin.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RestartBackoff {
    max: Duration,
    /// Delay the next restart will wait; `None` before the first exit (restart at once).
    next: Option<Duration>,
}

impl RestartBackoff {
    /// A fresh backoff with the given maximum (clamped to 1 s..=300 s).
    pub fn new(max: Duration) -> Self {
        Self {
            max: max.clamp(Duration::from_secs(1), DEFAULT_MAX_RESTART_DELAY),
            next: None,
        }
    }

    /// The configured maximum.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The initial delay: 10 s, or the maximum if that is smaller.
    pub fn initial(&self) -> Duration {
        INITIAL_RESTART_DELAY.min(self.max)
    }

    /// Records that the container exited after running `ran_for`, and returns how long to
    /// wait before restarting it.
    pub fn on_exit(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= BACKOFF_RESET_AFTER {
            self.next = None;
        }
        let delay = self.next.unwrap_or(Duration::ZERO);
        self.next = Some(match self.next {
            None => self.initial(),
            Some(d) => (d * 2).min(self.max),
        });
        delay
    }

    /// Whether a restart delay is currently in force (the container is in CrashLoopBackOff
    /// while it waits).
    pub fn in_backoff(&self) -> bool {
        self.next.is_some()
    }
}

/// The retry policy of a call that is retried until it succeeds: `base`, doubling up to `max`,
/// never giving up, without jitter (so a retry comes at most `max` after a failure: the Lease
/// renewal relies on that bound).
pub fn retry(base: Duration, max: Duration) -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::new()
        .with_min_delay(base)
        .with_max_delay(max.max(base))
        .without_max_times()
}

/// The next delay of a backoff built by [`retry`] (which never runs out; `max` if it did).
pub fn next_delay(backoff: &mut backon::ExponentialBackoff, max: Duration) -> Duration {
    backoff.next().unwrap_or(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn restart_sequence_doubles_from_ten_to_the_cap() {
        let mut b = RestartBackoff::new(DEFAULT_MAX_RESTART_DELAY);
        let got: Vec<u64> = (0..9).map(|_| b.on_exit(secs(1)).as_secs()).collect();
        assert_eq!(got, vec![0, 10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn lowered_maximum_caps_the_sequence() {
        let mut b = RestartBackoff::new(secs(30));
        let got: Vec<u64> = (0..5).map(|_| b.on_exit(secs(1)).as_secs()).collect();
        assert_eq!(got, vec![0, 10, 20, 30, 30]);
    }

    #[test]
    fn maximum_below_ten_seconds_is_also_the_initial_delay() {
        let mut b = RestartBackoff::new(secs(4));
        let got: Vec<u64> = (0..4).map(|_| b.on_exit(secs(1)).as_secs()).collect();
        assert_eq!(got, vec![0, 4, 4, 4]);
    }

    #[test]
    fn maximum_is_clamped_to_the_allowed_range() {
        assert_eq!(RestartBackoff::new(secs(0)).max(), secs(1));
        assert_eq!(RestartBackoff::new(secs(900)).max(), secs(300));
    }

    #[test]
    fn ten_minutes_of_clean_running_resets_the_backoff() {
        let mut b = RestartBackoff::new(DEFAULT_MAX_RESTART_DELAY);
        for _ in 0..4 {
            b.on_exit(secs(1));
        }
        assert!(b.in_backoff());
        assert_eq!(b.on_exit(secs(599)).as_secs(), 80);
        assert_eq!(b.on_exit(secs(600)).as_secs(), 0);
        assert_eq!(b.on_exit(secs(1)).as_secs(), 10);
    }

    #[test]
    fn retries_double_up_to_the_cap_and_never_give_up() {
        use backon::BackoffBuilder as _;
        let max = secs(2);
        let mut b = retry(Duration::from_millis(200), max).build();
        let got: Vec<u128> = (0..1000)
            .map(|_| next_delay(&mut b, max).as_millis())
            .collect();
        assert_eq!(got[..6], [200, 400, 800, 1600, 2000, 2000]);
        assert!(
            got.iter().all(|d| *d <= 2000),
            "a retry waits at most the cap"
        );
        // A fresh build starts over (what a success does).
        assert_eq!(
            next_delay(&mut retry(Duration::from_millis(200), max).build(), max).as_millis(),
            200
        );
        // A cap below the base is the base.
        let mut low = retry(secs(1), Duration::from_millis(10)).build();
        assert_eq!(next_delay(&mut low, secs(1)), secs(1));
    }
}
