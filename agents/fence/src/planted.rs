//! Planted bugs, for the negative controls of the lab nemesis: `PALISADE_PLANTED_BUGS` (a
//! comma-separated list of [`Planted`] names) makes a *debug* build of Palisade's processes
//! commit one of the mistakes the nemesis must catch:
//! - `TrustCommand`, in this crate's level runner ([`crate::levels::run`], what the
//!   firmware-bridge and `palisade-fence` run): an off that failed or was never answered
//!   counts as verified;
//! - `ReleaseUnverified`, in the controller: the node's pods are released as fencing starts;
//! - `ReleaseUncovered`, in the controller: a pod the verified fence does not cover (one with
//!   no PersistentVolumeClaim, behind a storage-only fence) is released anyway;
//! - `IgnoreStaleTokens`, in the firmware-bridge: a request whose fencing token is below the
//!   target's floor (a deposed controller's late request) is acted on instead of refused;
//! - `TrustWithoutWatchdog`, in the controller: a node that advertises a self-fence timeout
//!   but no armed watchdog is treated as if a `nowayout` watchdog backed it, so its
//!   self-fence is trusted after the timeout;
//! - `FenceOnWatchedSilence`, in the controller: a NodeFence is created on the watch's view of
//!   a node's silence alone, without reading from the API whether the node renewed since;
//! - `IgnoreCompanionWrites`, in the controller: a companion's write stamp is not part of the
//!   node's heartbeat, so its self-fence is timed from the kubelet's last renewal even when
//!   the companion wrote (and so went on petting its watchdog) after it.
//!
//! One lab fault lives here too, for the same reason (it must never be reachable in what
//! ships): [`watch_stalled`], a controller watch that stops delivering one object's changes.
//!
//! A release build never reads the variables (the code that reads it is not compiled in), so no
//! setting can plant a bug in what ships. The same mistakes are planted in the deterministic
//! simulation (`palisade-sim`'s `Bug`); here they run against the real API server, devices and
//! machines.

use std::sync::OnceLock;

/// A known mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planted {
    /// Count a power off that failed (or was never answered) as verified.
    TrustCommand,
    /// Release the node's pods as soon as fencing starts, before any level is verified.
    ReleaseUnverified,
    /// Release a pod the verified fence does not cover instead of holding it.
    ReleaseUncovered,
    /// Act on a request whose fencing token is below the target's floor.
    IgnoreStaleTokens,
    /// Trust a self-fence that no armed watchdog backs.
    TrustWithoutWatchdog,
    /// Fence a node on the watch's view of its silence alone.
    FenceOnWatchedSilence,
    /// Leave a companion's write stamp out of the node's heartbeat.
    IgnoreCompanionWrites,
}

impl Planted {
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    fn parse(s: &str) -> Option<Planted> {
        match s.trim() {
            "TrustCommand" => Some(Planted::TrustCommand),
            "ReleaseUnverified" => Some(Planted::ReleaseUnverified),
            "ReleaseUncovered" => Some(Planted::ReleaseUncovered),
            "IgnoreStaleTokens" => Some(Planted::IgnoreStaleTokens),
            "TrustWithoutWatchdog" => Some(Planted::TrustWithoutWatchdog),
            "FenceOnWatchedSilence" => Some(Planted::FenceOnWatchedSilence),
            "IgnoreCompanionWrites" => Some(Planted::IgnoreCompanionWrites),
            _ => None,
        }
    }
}

#[cfg(debug_assertions)]
fn configured() -> &'static [Planted] {
    static BUGS: OnceLock<Vec<Planted>> = OnceLock::new();
    BUGS.get_or_init(|| {
        let Ok(spec) = std::env::var("PALISADE_PLANTED_BUGS") else {
            return Vec::new();
        };
        let mut bugs = Vec::new();
        for name in spec.split(',').filter(|s| !s.trim().is_empty()) {
            match Planted::parse(name) {
                Some(b) => bugs.push(b),
                None => tracing::error!(name, "PALISADE_PLANTED_BUGS: unknown bug; ignored"),
            }
        }
        if !bugs.is_empty() {
            tracing::error!(
                ?bugs,
                "PLANTED BUGS ACTIVE: this process is unsafe on purpose (a negative control)"
            );
        }
        bugs
    })
}

#[cfg(not(debug_assertions))]
fn configured() -> &'static [Planted] {
    static NONE: OnceLock<Vec<Planted>> = OnceLock::new();
    NONE.get_or_init(Vec::new)
}

/// Whether `bug` is planted in this process (never in a release build).
pub fn active(bug: Planted) -> bool {
    configured().contains(&bug)
}

/// A lab fault (debug builds only): whether the controller's watch of `kind` must drop the
/// changes of the object `name`, as a stalled informer or an API server's lagging watch cache
/// would deliver them late. `PALISADE_STALLED_WATCH_FILE` names a file the lab writes; while
/// it holds a line `<kind>/<name>` (for example `Lease/m0`), that object's changes are not
/// delivered, so the controller's cache keeps the last version it had. The file is read at
/// every change, so the lab starts and ends the stall by writing it.
///
/// *Guarantees:* false in a release build, and when the variable is unset or the file is
/// missing.
pub fn watch_stalled(kind: &str, name: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        let Some(path) = std::env::var_os("PALISADE_STALLED_WATCH_FILE") else {
            return false;
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return false;
        };
        text.lines()
            .any(|l| l.trim().split_once('/') == Some((kind, name)))
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = (kind, name);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_nothing_is_planted_by_default() {
        for bug in [
            Planted::TrustCommand,
            Planted::ReleaseUnverified,
            Planted::ReleaseUncovered,
            Planted::IgnoreStaleTokens,
            Planted::TrustWithoutWatchdog,
            Planted::FenceOnWatchedSilence,
            Planted::IgnoreCompanionWrites,
        ] {
            assert_eq!(Planted::parse(&format!(" {bug:?}")), Some(bug));
            // The unit tests never set the variable.
            assert!(!active(bug));
        }
        assert_eq!(Planted::parse("trustcommand"), None);
        // The unit tests never set the stall's file either.
        assert!(!watch_stalled("Lease", "m0"));
    }
}
