//! Helpers shared by Palisade's tests, so that each is written once.
//!
//! Polling with a deadline: end-to-end tests wait for the world to reach a state (a machine
//! boots, a metric appears, a pod is replaced) with [`eventually`] instead of bare sleeps.
//! [`try_eventually`] is the same for library code that reports a [`Timeout`] instead of
//! panicking, and [`eventually_async`] polls an async condition on tokio's clock, so it also
//! works under `tokio::time::pause()`.
//!
//! All three call the condition at once, then again after pauses that start at 50 ms and
//! double up to 250 ms (the project's one backoff type, `backon`'s), never sleeping past the
//! deadline.
//!
//! [`mod@reference`] renders and checks the generated reference pages in `docs/reference/`.
//! [`mod@bench`] is how every benchmark summarises and writes its figures (nearest-rank
//! percentiles, beside the peer tool's, with when and where they were measured), and
//! [`bench::page`] renders `docs/benchmarks.md` from the recorded documents.
//! [`strip_ansi`] reads a Palisade binary's log as plain text.

pub mod bench;
pub mod reference;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

/// The first pause between two polls.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two polls.
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// A condition did not hold before its deadline.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for: {what}")]
pub struct Timeout {
    /// What was awaited, as the caller described it.
    pub what: String,
    /// How long it was awaited.
    pub timeout: Duration,
}

/// Polls `f` until it returns `Some`, and returns its value; panics with a message naming
/// `what` and `timeout` if that does not happen within `timeout`.
///
/// For a condition without a value, return `cond.then_some(())`.
#[track_caller]
pub fn eventually<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    match try_eventually(what, timeout, f) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// Polls `f` until it returns `Some`, and returns its value, or a [`Timeout`] naming `what`
/// if that does not happen within `timeout`.
///
/// Guarantees: `f` is called at least once, even with a zero `timeout`, and the pauses between
/// calls (which block the thread) never extend past the deadline.
pub fn try_eventually<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T, Timeout> {
    let deadline = Instant::now().checked_add(timeout);
    let mut pauses = pauses();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        let remaining = deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        });
        if remaining.is_zero() {
            return Err(Timeout {
                what: what.to_string(),
                timeout,
            });
        }
        std::thread::sleep(next_pause(&mut pauses, remaining));
    }
}

/// Polls the future that `f` makes until it resolves to `Some`, and returns its value; panics
/// with a message naming `what` and `timeout` if that does not happen within `timeout`.
///
/// Sleeps with `tokio::time::sleep` and measures the deadline on tokio's clock, so under
/// `tokio::time::pause()` the wait takes no real time. For a condition without a value,
/// return `cond.then_some(())`.
pub async fn eventually_async<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    let mut pauses = pauses();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        let remaining = deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(tokio::time::Instant::now())
        });
        if remaining.is_zero() {
            let e = Timeout {
                what: what.to_string(),
                timeout,
            };
            panic!("{e}");
        }
        tokio::time::sleep(next_pause(&mut pauses, remaining)).await;
    }
}

/// The pauses between polls: [`FIRST_PAUSE`], doubling up to [`MAX_PAUSE`], without end.
fn pauses() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::new()
        .with_min_delay(FIRST_PAUSE)
        .with_max_delay(MAX_PAUSE)
        .without_max_times()
        .build()
}

/// The pause before the next poll, but no longer than `remaining`.
fn next_pause(pauses: &mut backon::ExponentialBackoff, remaining: Duration) -> Duration {
    pauses.next().unwrap_or(MAX_PAUSE).min(remaining)
}

/// The sample lines of a Prometheus or OpenMetrics text exposition: each series (name and
/// labels, as exposed) to its value. Comment lines (`# HELP`, `# TYPE`, `# EOF`) are skipped.
///
/// Panics on a line that is not `series value` with a numeric value: a test reading metrics
/// wants to fail on a malformed exposition.
pub fn samples(text: &str) -> BTreeMap<&str, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            (series, value.parse().expect("a numeric sample value"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn pauses_double_from_50_ms_up_to_250_ms() {
        let mut p = pauses();
        let got: Vec<u64> = (0..5)
            .map(|_| next_pause(&mut p, Duration::MAX).as_millis() as u64)
            .collect();
        assert_eq!(got, [50, 100, 200, 250, 250]);
    }

    #[test]
    fn a_pause_never_reaches_past_the_deadline() {
        let mut p = pauses();
        assert_eq!(
            next_pause(&mut p, Duration::from_millis(30)),
            Duration::from_millis(30)
        );
    }

    #[test]
    fn a_condition_that_comes_true_after_some_polls_returns_its_value() {
        let calls = Cell::new(0);
        let v = eventually("the third poll", Duration::from_secs(60), || {
            calls.set(calls.get() + 1);
            (calls.get() == 3).then_some("ready")
        });
        assert_eq!(v, "ready");
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn a_condition_that_already_holds_is_polled_once_even_with_no_time_left() {
        let calls = Cell::new(0);
        let v = try_eventually("nothing", Duration::ZERO, || {
            calls.set(calls.get() + 1);
            Some(7)
        });
        assert_eq!(v, Ok(7));
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn a_condition_that_never_holds_is_a_timeout_naming_what_was_awaited() {
        let calls = Cell::new(0);
        let e = try_eventually("the moon turning blue", Duration::from_millis(120), || {
            calls.set(calls.get() + 1);
            None::<()>
        })
        .unwrap_err();
        assert_eq!(
            e,
            Timeout {
                what: "the moon turning blue".into(),
                timeout: Duration::from_millis(120),
            }
        );
        assert_eq!(
            e.to_string(),
            "timed out after 120ms waiting for: the moon turning blue"
        );
        assert!(calls.get() >= 2, "polled again before giving up");
    }

    #[test]
    #[should_panic(expected = "timed out after 100ms waiting for: the moon turning blue")]
    fn eventually_panics_naming_what_was_awaited() {
        eventually("the moon turning blue", Duration::from_millis(100), || {
            None::<()>
        });
    }

    #[tokio::test(start_paused = true)]
    async fn an_async_condition_that_comes_true_later_returns_its_value() {
        let start = tokio::time::Instant::now();
        let ready_at = start + Duration::from_secs(3);
        let v = eventually_async("three seconds", Duration::from_secs(10), || async {
            (tokio::time::Instant::now() >= ready_at).then_some(42)
        })
        .await;
        assert_eq!(v, 42);
        // On the paused clock: found on the first poll at or after 3 s, pauses of 250 ms.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(3) && waited <= Duration::from_millis(3250),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 60s waiting for: the moon turning blue")]
    async fn an_async_condition_that_never_holds_panics_naming_what_was_awaited() {
        eventually_async("the moon turning blue", Duration::from_secs(60), || async {
            None::<()>
        })
        .await;
    }

    #[test]
    fn samples_reads_series_and_values_and_skips_comments() {
        let text = "# HELP a_total An a\n# TYPE a counter\na_total{x=\"1\"} 3\nb 2.5\n# EOF\n";
        let s = samples(text);
        assert_eq!(s.len(), 2);
        assert_eq!(s["a_total{x=\"1\"}"], 3.0);
        assert_eq!(s["b"], 2.5);
    }
}

/// `text` without its terminal escape sequences (`ESC [ … <letter>`): a Palisade binary's log
/// colours its levels and field names (`name\x1b[2m=\x1b[0mvalue`), also in a file.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod ansi_tests {
    #[test]
    fn colour_codes_are_removed_and_text_kept() {
        let coloured = "\u{1b}[2m2026-11-30T03:22:45Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m challenge\u{1b}[2m=\u{1b}[0mNone";
        assert_eq!(
            super::strip_ansi(coloured),
            "2026-11-30T03:22:45Z  INFO challenge=None"
        );
        assert_eq!(super::strip_ansi("plain=text"), "plain=text");
    }
}
