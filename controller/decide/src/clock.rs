//! The controller's monotonic time, as a plain value so decisions are pure and testable.

use std::ops::Add;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// An instant on the controller's own monotonic clock: time since an arbitrary origin (the I/O
/// layer uses `Instant::now() - start`). Never derived from any node's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Mono(pub Duration);

impl Mono {
    /// The instant `secs` seconds after the origin (handy in tests).
    pub fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// The instant `ms` milliseconds after the origin.
    pub fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Mono) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Mono {
    type Output = Mono;
    fn add(self, rhs: Duration) -> Mono {
        Mono(self.0.saturating_add(rhs))
    }
}

/// One reading of both clocks at the same moment, to translate a monotonic deadline into a
/// wall-clock time for persisting (a new leader has a different monotonic origin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clocks {
    /// Monotonic now.
    pub mono: Mono,
    /// Wall-clock now.
    pub wall: Timestamp,
}

impl Clocks {
    /// The wall-clock time corresponding to monotonic `at` (may be in the past).
    pub fn to_wall(&self, at: Mono) -> Timestamp {
        let delta = if at >= self.mono {
            SignedDuration::try_from(at.since(self.mono)).unwrap_or(SignedDuration::MAX)
        } else {
            -SignedDuration::try_from(self.mono.since(at)).unwrap_or(SignedDuration::MAX)
        };
        self.wall.saturating_add(delta).unwrap_or(self.wall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mono_to_wall_translates_both_directions() {
        let wall = Timestamp::from_second(1_800_000_000).unwrap();
        let c = Clocks {
            mono: Mono::from_secs(100),
            wall,
        };
        assert_eq!(c.to_wall(Mono::from_secs(130)).as_second(), 1_800_000_030);
        assert_eq!(c.to_wall(Mono::from_secs(40)).as_second(), 1_799_999_940);
        assert_eq!(Mono::from_secs(3).since(Mono::from_secs(5)), Duration::ZERO);
    }
}
