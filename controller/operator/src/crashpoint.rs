//! Crash points for the crash tests: `PALISADE_CRASH_AT=<step>:<before|after>` makes the
//! controller abort (as a crash would: no cleanup, no graceful release of the Lease) just
//! before or just after it persists the outcome of the `NodeFence` step `<step>` (a
//! [`palisade_decide::phase::Step::label`], e.g. `run_level`, `release_pod`).
//!
//! `before` is the nasty case: the step's action happened (a device was powered off, a pod
//! deleted) but the `NodeFence` does not say so, and the next leader must redo it safely.
//! Unset (the default), nothing happens. The variable is read once, and only by debug builds
//! (the ones the crash tests run): a release build never reads it, so no environment can make
//! a production controller abort mid-step.

use std::sync::OnceLock;

/// Which side of the status write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// After the step acted, before its outcome is persisted.
    BeforePersist,
    /// After the outcome is persisted.
    AfterPersist,
}

fn parse(spec: &str) -> Option<(String, When)> {
    let (step, when) = spec.trim().rsplit_once(':')?;
    let when = match when {
        "before" => When::BeforePersist,
        "after" => When::AfterPersist,
        _ => return None,
    };
    (!step.is_empty()).then(|| (step.to_string(), when))
}

fn configured() -> Option<&'static (String, When)> {
    if cfg!(not(debug_assertions)) {
        return None;
    }
    static AT: OnceLock<Option<(String, When)>> = OnceLock::new();
    AT.get_or_init(|| {
        let spec = std::env::var("PALISADE_CRASH_AT").ok()?;
        let parsed = parse(&spec);
        if parsed.is_none() {
            tracing::error!(%spec, "PALISADE_CRASH_AT must be <step>:<before|after>; ignored");
        }
        parsed
    })
    .as_ref()
}

/// Aborts the process if the configured crash point is `step` at `when`.
pub fn reached(step: &str, when: When) {
    if let Some((s, w)) = configured() {
        if s == step && *w == when {
            tracing::error!(step, ?when, "PALISADE_CRASH_AT reached: aborting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_or_are_refused() {
        assert_eq!(
            parse("run_level:before"),
            Some(("run_level".into(), When::BeforePersist))
        );
        assert_eq!(
            parse("release_pod:after"),
            Some(("release_pod".into(), When::AfterPersist))
        );
        for bad in ["run_level", ":before", "run_level:during", ""] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
