//! Termination grace-period arithmetic, exactly as the kubelet does it.
//!
//! Two functions mirror the two kubelet functions that define it:
//! - [`effective_pod_grace_period`] is `calculateEffectiveGracePeriod` (pod workers): the
//!   pod-level grace period, which only ever shrinks once a termination has begun;
//! - [`container_grace_period`] and [`stop_window`] are `killContainer`: the per-container
//!   period, minus the time the preStop hook took, never below
//!   [`MINIMUM_GRACE_PERIOD_SECONDS`], then replaced by an explicit override (eviction).
//!
//! Everything here is pure and in whole seconds, like the kubelet.

use std::time::Duration;

/// `minimumGracePeriodInSeconds` in the kubelet: a container always gets at least this long
/// between TERM and KILL. It is also the one-off extension a preStop hook that overran its
/// grace period gets.
pub const MINIMUM_GRACE_PERIOD_SECONDS: i64 = 2;

/// The API server's default for `spec.terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

/// Why a container is being killed (`containerKillReason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// The pod is being deleted or otherwise terminated.
    PodTermination,
    /// The container's startup probe failed.
    StartupProbe,
    /// The container's liveness probe failed.
    LivenessProbe,
}

/// The grace-period fields of a pod and one container that the arithmetic reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraceInputs {
    /// `metadata.deletionGracePeriodSeconds`, written by the API server on a graceful DELETE.
    pub deletion_grace_period_seconds: Option<i64>,
    /// `spec.terminationGracePeriodSeconds`; `None` means the API default of 30 s.
    pub termination_grace_period_seconds: Option<i64>,
    /// The container's `startupProbe.terminationGracePeriodSeconds`.
    pub startup_probe_grace_period_seconds: Option<i64>,
    /// The container's `livenessProbe.terminationGracePeriodSeconds`.
    pub liveness_probe_grace_period_seconds: Option<i64>,
}

/// The first step of `killContainer`: the grace period before the preStop hook runs.
///
/// `deletionGracePeriodSeconds` wins when set; otherwise the spec's value (default 30), which a
/// failed startup or liveness probe replaces with its own `terminationGracePeriodSeconds`.
pub fn container_grace_period(inputs: &GraceInputs, reason: KillReason) -> i64 {
    if let Some(deletion) = inputs.deletion_grace_period_seconds {
        return deletion;
    }
    let spec = inputs
        .termination_grace_period_seconds
        .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    match reason {
        KillReason::StartupProbe => inputs.startup_probe_grace_period_seconds.unwrap_or(spec),
        KillReason::LivenessProbe => inputs.liveness_probe_grace_period_seconds.unwrap_or(spec),
        KillReason::PodTermination => spec,
    }
}

/// Whether the preStop hook runs at all: only when there is one and the grace period is
/// positive (`gracePeriod > 0`).
pub fn runs_pre_stop(has_pre_stop: bool, grace_period: i64) -> bool {
    has_pre_stop && grace_period > 0
}

/// Seconds the kubelet charges for a preStop hook that took `elapsed`: whole seconds,
/// truncated (`int64(time.Since(start).Seconds())`).
pub fn pre_stop_charge(elapsed: Duration) -> i64 {
    i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
}

/// The rest of `killContainer`: the TERM→KILL window handed to the runtime.
///
/// - `grace_period` is [`container_grace_period`] (or the pod's effective period);
/// - `pre_stop_elapsed` is how long the preStop hook ran (`None` if it did not run). A hook
///   runs with `grace_period` as its timeout, so an overrunning hook is charged the whole
///   period and the container gets the one-off [`MINIMUM_GRACE_PERIOD_SECONDS`] extension;
/// - the window is never below [`MINIMUM_GRACE_PERIOD_SECONDS`];
/// - `override_seconds` (an eviction or explicit kill) replaces the result, as in the kubelet.
pub fn stop_window(
    grace_period: i64,
    pre_stop_elapsed: Option<Duration>,
    override_seconds: Option<i64>,
) -> i64 {
    let mut window = grace_period;
    if let Some(elapsed) = pre_stop_elapsed {
        window = window.saturating_sub(pre_stop_charge(elapsed));
    }
    if window < MINIMUM_GRACE_PERIOD_SECONDS {
        window = MINIMUM_GRACE_PERIOD_SECONDS;
    }
    if let Some(o) = override_seconds {
        window = o;
    }
    window
}

/// `calculateEffectiveGracePeriod`: the pod-level grace period of a termination.
///
/// `current` is the period already in force for this termination (0 when none yet). The
/// API server's `deletionGracePeriodSeconds` and an eviction override may only *shorten* it;
/// with nothing set it falls back to the spec's value, and it is never below 1 s.
/// Returns the period and whether it changed an already-running termination.
pub fn effective_pod_grace_period(
    current: i64,
    deletion_grace_period_seconds: Option<i64>,
    override_seconds: Option<i64>,
    termination_grace_period_seconds: Option<i64>,
) -> (i64, bool) {
    let mut grace = current;
    if let Some(d) = deletion_grace_period_seconds {
        if grace == 0 || d < grace {
            grace = d;
        }
    }
    if let Some(o) = override_seconds {
        if grace == 0 || o < grace {
            grace = o;
        }
    }
    if grace == 0 {
        if let Some(spec) = termination_grace_period_seconds {
            grace = spec;
        }
    }
    if grace < 1 {
        grace = 1;
    }
    (grace, current != 0 && current != grace)
}

/// The whole plan for one container: grace period, whether preStop runs, and, once the
/// hook is done, the window. Convenience for callers and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillPlan {
    /// Grace period before the preStop hook (also the hook's timeout).
    pub grace_period: i64,
    /// Whether the preStop hook is run.
    pub run_pre_stop: bool,
}

impl KillPlan {
    /// Plans the kill of a container.
    pub fn new(inputs: &GraceInputs, reason: KillReason, has_pre_stop: bool) -> Self {
        let grace_period = container_grace_period(inputs, reason);
        Self {
            grace_period,
            run_pre_stop: runs_pre_stop(has_pre_stop, grace_period),
        }
    }

    /// The hook's timeout.
    pub fn pre_stop_timeout(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.grace_period.max(0)).unwrap_or(0))
    }

    /// The TERM→KILL window once the hook took `pre_stop_elapsed`.
    pub fn window(&self, pre_stop_elapsed: Option<Duration>, override_seconds: Option<i64>) -> i64 {
        let elapsed = if self.run_pre_stop {
            // The hook is cut off at its timeout: it is never charged more than the period.
            pre_stop_elapsed.map(|e| e.min(self.pre_stop_timeout()))
        } else {
            None
        };
        stop_window(self.grace_period, elapsed, override_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inputs(d: Option<i64>, s: Option<i64>, sp: Option<i64>, lp: Option<i64>) -> GraceInputs {
        GraceInputs {
            deletion_grace_period_seconds: d,
            termination_grace_period_seconds: s,
            startup_probe_grace_period_seconds: sp,
            liveness_probe_grace_period_seconds: lp,
        }
    }

    #[test]
    fn grace_period_source_table() {
        use KillReason::*;
        let cases = [
            // (deletion, spec, startup, liveness, reason, expected)
            (None, None, None, None, PodTermination, 30),
            (None, Some(10), None, None, PodTermination, 10),
            (Some(5), Some(10), None, None, PodTermination, 5),
            (Some(0), Some(10), None, None, PodTermination, 0),
            (None, Some(10), Some(3), Some(4), PodTermination, 10),
            (None, Some(10), Some(3), Some(4), StartupProbe, 3),
            (None, Some(10), Some(3), Some(4), LivenessProbe, 4),
            (None, Some(10), None, None, LivenessProbe, 10),
            (None, None, None, Some(7), LivenessProbe, 7),
            (None, None, Some(8), None, LivenessProbe, 30),
            // The API server's deletion value beats the probe override.
            (Some(6), Some(10), Some(3), Some(4), LivenessProbe, 6),
        ];
        for (d, s, sp, lp, reason, want) in cases {
            assert_eq!(
                container_grace_period(&inputs(d, s, sp, lp), reason),
                want,
                "{d:?} {s:?} {sp:?} {lp:?} {reason:?}"
            );
        }
    }

    #[test]
    fn pre_stop_time_is_subtracted_in_whole_seconds() {
        assert_eq!(stop_window(10, Some(Duration::from_millis(3_900)), None), 7);
        assert_eq!(stop_window(10, Some(Duration::from_millis(999)), None), 10);
        assert_eq!(stop_window(10, None, None), 10);
    }

    #[test]
    fn window_never_below_two_seconds() {
        assert_eq!(stop_window(10, Some(Duration::from_secs(9)), None), 2);
        assert_eq!(stop_window(1, None, None), 2);
        assert_eq!(stop_window(0, None, None), 2);
        assert_eq!(stop_window(-3, None, None), 2);
    }

    #[test]
    fn overrunning_pre_stop_gets_a_one_off_two_second_extension() {
        let plan = KillPlan::new(
            &inputs(Some(4), None, None, None),
            KillReason::PodTermination,
            true,
        );
        assert!(plan.run_pre_stop);
        assert_eq!(plan.pre_stop_timeout(), Duration::from_secs(4));
        // The hook would have run 60 s; it is cut at 4 s, then the container gets 2 s.
        assert_eq!(plan.window(Some(Duration::from_secs(60)), None), 2);
    }

    #[test]
    fn pre_stop_skipped_when_grace_is_zero() {
        let plan = KillPlan::new(
            &inputs(Some(0), None, None, None),
            KillReason::PodTermination,
            true,
        );
        assert!(!plan.run_pre_stop);
        assert_eq!(plan.window(Some(Duration::from_secs(5)), None), 2);
    }

    #[test]
    fn override_replaces_the_window() {
        assert_eq!(stop_window(30, Some(Duration::from_secs(1)), Some(5)), 5);
        assert_eq!(stop_window(30, None, Some(0)), 0);
    }

    #[test]
    fn effective_grace_table() {
        let cases = [
            // (current, deletion, override, spec, want, changed)
            (0, Some(30), None, Some(30), 30, false),
            (30, Some(10), None, Some(30), 10, true),
            (10, Some(30), None, Some(30), 10, false),
            (10, None, Some(3), Some(30), 3, true),
            (10, None, Some(20), Some(30), 10, false),
            (0, None, None, Some(45), 45, false),
            (0, None, None, None, 1, false),
            (0, Some(0), None, Some(30), 30, false),
            (0, None, Some(0), Some(0), 1, false),
        ];
        for (cur, d, o, s, want, changed) in cases {
            assert_eq!(
                effective_pod_grace_period(cur, d, o, s),
                (want, changed),
                "{cur} {d:?} {o:?} {s:?}"
            );
        }
    }

    #[test]
    fn zero_request_falls_back_to_the_spec() {
        // The kubelet's quirk, kept exactly: 0 means "unset" and the spec's value is used.
        assert_eq!(
            effective_pod_grace_period(1, Some(0), None, Some(2)),
            (2, true)
        );
    }

    proptest! {
        #[test]
        // For positive requests. A request of 0 falls back to the spec's value, exactly as in
        // the kubelet (see `zero_request_falls_back_to_the_spec`); the worker ignores any
        // result that is not smaller than the period in force.
        fn effective_grace_only_shrinks(cur in 1i64..1000, d in proptest::option::of(1i64..1000),
                                        o in proptest::option::of(1i64..1000), s in proptest::option::of(0i64..1000)) {
            let (g, _) = effective_pod_grace_period(cur, d, o, s);
            prop_assert!(g <= cur);
            prop_assert!(g >= 1);
        }

        #[test]
        fn window_is_at_least_minimum_without_override(g in -10i64..1000, e in 0u64..2000) {
            let w = stop_window(g, Some(Duration::from_secs(e)), None);
            prop_assert!(w >= MINIMUM_GRACE_PERIOD_SECONDS);
            prop_assert!(w <= g.max(MINIMUM_GRACE_PERIOD_SECONDS));
        }
    }
}
