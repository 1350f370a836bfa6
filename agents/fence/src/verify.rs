//! Verification: the only place that can construct [`VerifiedOff`] (and [`VerifiedOn`]).
//!
//! A power fence counts only when the device *reports* the power off after the command.
//! `verify_off` polls a [`StatusProbe`] until it reports [`PowerState::Off`], bounded by a
//! timeout, and only then hands out the evidence; `off_from_bridge` turns a firmware-bridge's
//! answer into evidence only when the bridge itself read the state back as off.
//!
//! Every constructor is private to this crate (`pub(crate)`): the evidence types have private
//! fields, and the functions that return them (`verify_off`, `verify_on`, `off_from_bridge`,
//! `on_from_bridge`) and the command timestamp they need (`Commanded::now`) are reachable only
//! from the device backends of this crate, which call them after sending a real command. Other
//! crates receive evidence only from [`crate::PowerDevice`] methods, and can read it, clone
//! it and pass it on, never make it:
//!
//! ```
//! use palisade_fence::VerifiedOff;
//! fn device_of(evidence: &VerifiedOff) -> &str {
//!     evidence.device()
//! }
//! ```
//!
//! A struct literal does not compile outside this module (private fields):
//!
//! ```compile_fail,E0451
//! let _ = palisade_fence::VerifiedOff {
//!     device: "bmc".into(),
//!     commanded_at: std::time::SystemTime::now(),
//!     verified_at: std::time::SystemTime::now(),
//!     command_to_verified: std::time::Duration::ZERO,
//!     polls: 1,
//!     bridge_evidence: None,
//!     refusal: None,
//! };
//! ```
//!
//! Nor does taking a command timestamp (the first thing every constructor needs):
//!
//! ```compile_fail,E0624
//! let _ = palisade_fence::verify::Commanded::now();
//! ```
//!
//! Nor claiming a bridge's answer as evidence:
//!
//! ```compile_fail,E0603
//! use palisade_fence::verify::off_from_bridge;
//! ```
//!
//! Nor polling a hand-written probe that always says "off":
//!
//! ```compile_fail,E0603
//! use palisade_fence::verify::verify_off;
//! ```
//!
//! (Stable rustdoc does not check the error code of a `compile_fail` example, so the unit test
//! `compile_fail_examples_compile_inside_this_crate` holds the same code, word for word, and
//! shows that privacy is the only reason these fail.)

use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;

use crate::error::FenceError;
use crate::power::PowerState;

/// Something that can read the current power state, e.g. an open IPMI session.
#[async_trait]
pub trait StatusProbe: Send {
    /// Reads the power state once.
    async fn probe(&mut self) -> Result<PowerState, FenceError>;
}

/// When the power command was sent. Taken just before sending it.
#[derive(Debug, Clone, Copy)]
pub struct Commanded {
    wall: SystemTime,
    mono: Instant,
}

impl Commanded {
    /// Records "the command is being sent now". Crate-private: only a backend about to send a
    /// real command may take one.
    pub(crate) fn now() -> Self {
        Self {
            wall: SystemTime::now(),
            mono: Instant::now(),
        }
    }
}

/// Evidence that a device reported the power of its machine off after an off command.
///
/// Guarantees: constructed only in this module, by `verify_off` after a status read that
/// returned [`PowerState::Off`] and was issued after the command was sent, or by
/// `off_from_bridge` when a firmware-bridge answered that it read the state back as off.
/// No other crate can construct it. The one exception is compiled into debug builds only:
/// `trusted_off`, for the planted bug `TrustCommand` ([`crate::planted`]), the negative
/// control that proves the nemesis catches a fence that was never verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedOff {
    device: String,
    commanded_at: SystemTime,
    verified_at: SystemTime,
    command_to_verified: Duration,
    polls: u32,
    bridge_evidence: Option<String>,
    refusal: Option<String>,
}

/// Evidence that a device reported the power on after an on command. Constructed only in this
/// module (`verify_on`, `on_from_bridge`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedOn {
    device: String,
    verified_at: SystemTime,
    command_to_verified: Duration,
    polls: u32,
}

/// The planted bug `TrustCommand` ([`crate::planted`]; debug builds only): "evidence" for a
/// power off that was never read back.
#[cfg(debug_assertions)]
pub(crate) fn trusted_off(device: &str) -> VerifiedOff {
    let now = SystemTime::now();
    VerifiedOff {
        device: device.to_string(),
        commanded_at: now,
        verified_at: now,
        command_to_verified: Duration::ZERO,
        polls: 0,
        bridge_evidence: None,
        refusal: None,
    }
}

impl VerifiedOff {
    /// The device that reported off.
    pub fn device(&self) -> &str {
        &self.device
    }
    /// Wall-clock time the command was sent.
    pub fn commanded_at(&self) -> SystemTime {
        self.commanded_at
    }
    /// Wall-clock time the device reported off.
    pub fn verified_at(&self) -> SystemTime {
        self.verified_at
    }
    /// Monotonic time from command to the status read that reported off.
    pub fn command_to_verified(&self) -> Duration {
        self.command_to_verified
    }
    /// Status reads it took.
    pub fn polls(&self) -> u32 {
        self.polls
    }
    /// For an off done through a firmware-bridge: the bridge's own evidence (JSON text).
    pub fn bridge_evidence(&self) -> Option<&str> {
        self.bridge_evidence.as_deref()
    }
    /// The device's refusal of the off command, when it refused it on a machine that already
    /// read off (iDRAC 409, iLO 400): on the record beside the evidence, which is the read.
    pub fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }
    /// This evidence, with the device's refusal of the command on the record.
    pub(crate) fn refused(mut self, refusal: String) -> Self {
        self.refusal = Some(refusal);
        self
    }
}

impl VerifiedOn {
    /// The device that reported on.
    pub fn device(&self) -> &str {
        &self.device
    }
    /// Wall-clock time the device reported on.
    pub fn verified_at(&self) -> SystemTime {
        self.verified_at
    }
    /// Monotonic time from command to the status read that reported on.
    pub fn command_to_verified(&self) -> Duration {
        self.command_to_verified
    }
    /// Status reads it took.
    pub fn polls(&self) -> u32 {
        self.polls
    }
}

/// How to poll.
#[derive(Debug, Clone, Copy)]
pub struct VerifyPolicy {
    /// Give up after this long since the command.
    pub timeout: Duration,
    /// Pause between status reads.
    pub interval: Duration,
}

impl Default for VerifyPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(20),
            interval: Duration::from_millis(20),
        }
    }
}

/// Polls until `expected` is reported; returns (polls, elapsed since command).
async fn poll_until(
    device: &str,
    expected: PowerState,
    commanded: Commanded,
    probe: &mut dyn StatusProbe,
    policy: VerifyPolicy,
) -> Result<(u32, Duration), FenceError> {
    let deadline = tokio::time::Instant::from_std(commanded.mono) + policy.timeout;
    let mut polls = 0u32;
    let mut last = None;
    let mut final_poll = false;
    loop {
        let started = tokio::time::Instant::now();
        let remaining = deadline.saturating_duration_since(started);
        polls += 1;
        match tokio::time::timeout(remaining, probe.probe()).await {
            Ok(Ok(state)) => {
                if state == expected {
                    return Ok((polls, commanded.mono.elapsed()));
                }
                last = Some(state);
            }
            // Transient failures (a lost datagram) are polled through; terminal ones end it.
            Ok(Err(e)) if !e.is_retryable() => return Err(e),
            Ok(Err(e)) => tracing::debug!(device, error = %e, "status poll failed"),
            Err(_) => {}
        }
        let now = tokio::time::Instant::now();
        // The latest start for a read that takes as long as this one and still ends by the
        // deadline: polling goes on up to the deadline, not up to one interval before it.
        let latest = deadline.checked_sub(now - started).unwrap_or(now);
        let mut next = now + policy.interval;
        if next > latest {
            if final_poll || latest <= now {
                return Err(FenceError::NotVerified {
                    device: device.to_string(),
                    expected,
                    last,
                    after: commanded.mono.elapsed(),
                });
            }
            final_poll = true;
            next = latest;
        }
        tokio::time::sleep_until(next).await;
    }
}

/// Polls `probe` until it reports off and returns the evidence.
///
/// Guarantees: `Ok` only if a status read started after `commanded` returned
/// [`PowerState::Off`] within `policy.timeout` of `commanded`. Assumptions: `commanded` was
/// taken before the off command was sent; `probe` reads the device, not a cache.
pub(crate) async fn verify_off(
    device: &str,
    commanded: Commanded,
    probe: &mut dyn StatusProbe,
    policy: VerifyPolicy,
) -> Result<VerifiedOff, FenceError> {
    let (polls, elapsed) = poll_until(device, PowerState::Off, commanded, probe, policy).await?;
    Ok(VerifiedOff {
        device: device.to_string(),
        commanded_at: commanded.wall,
        verified_at: SystemTime::now(),
        command_to_verified: elapsed,
        polls,
        bridge_evidence: None,
        refusal: None,
    })
}

/// Turns a firmware-bridge's answer to an off request into evidence: the one way the bridge
/// client (`crate::bridge`) rebuilds, on this side of the wire, the proof the bridge made on
/// its side.
///
/// Guarantees: `Ok` only if the bridge said it verified the target (`verified == true`, i.e.
/// it read the state back from the devices after commanding them) *and* the state it read is
/// [`PowerState::Off`]. Anything else is [`FenceError::NotVerified`]. Assumptions: `commanded`
/// was taken before the request was sent; `verified`/`state` come from the response of a bridge
/// authenticated by mutual TLS against a pinned CA, which itself returns `verified` only after
/// its own read-back (the bridge is trusted to do so).
pub(crate) fn off_from_bridge(
    device: &str,
    commanded: Commanded,
    verified: bool,
    state: Option<PowerState>,
    evidence: &serde_json::Value,
) -> Result<VerifiedOff, FenceError> {
    if !verified || state != Some(PowerState::Off) {
        return Err(FenceError::NotVerified {
            device: device.to_string(),
            expected: PowerState::Off,
            last: state,
            after: commanded.mono.elapsed(),
        });
    }
    Ok(VerifiedOff {
        device: device.to_string(),
        commanded_at: commanded.wall,
        verified_at: SystemTime::now(),
        command_to_verified: commanded.mono.elapsed(),
        polls: 1,
        bridge_evidence: Some(evidence.to_string()),
        refusal: None,
    })
}

/// Turns a firmware-bridge's answer to an on request into evidence (verified and on, only).
pub(crate) fn on_from_bridge(
    device: &str,
    commanded: Commanded,
    verified: bool,
    state: Option<PowerState>,
) -> Result<VerifiedOn, FenceError> {
    if !verified || state != Some(PowerState::On) {
        return Err(FenceError::NotVerified {
            device: device.to_string(),
            expected: PowerState::On,
            last: state,
            after: commanded.mono.elapsed(),
        });
    }
    Ok(VerifiedOn {
        device: device.to_string(),
        verified_at: SystemTime::now(),
        command_to_verified: commanded.mono.elapsed(),
        polls: 1,
    })
}

/// Polls `probe` until it reports on.
pub(crate) async fn verify_on(
    device: &str,
    commanded: Commanded,
    probe: &mut dyn StatusProbe,
    policy: VerifyPolicy,
) -> Result<VerifiedOn, FenceError> {
    let (polls, elapsed) = poll_until(device, PowerState::On, commanded, probe, policy).await?;
    Ok(VerifiedOn {
        device: device.to_string(),
        verified_at: SystemTime::now(),
        command_to_verified: elapsed,
        polls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    struct Script(VecDeque<Result<PowerState, FenceError>>);

    #[async_trait]
    impl StatusProbe for Script {
        async fn probe(&mut self) -> Result<PowerState, FenceError> {
            self.0.pop_front().unwrap_or(Ok(PowerState::On))
        }
    }

    fn timeout_err() -> FenceError {
        FenceError::Timeout {
            device: "d".into(),
            operation: "status".into(),
            after: Duration::from_millis(1),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn off_is_verified_only_after_the_device_reports_off() {
        let mut probe = Script(VecDeque::from([
            Ok(PowerState::On),
            Err(timeout_err()),
            Ok(PowerState::Unknown),
            Ok(PowerState::Off),
        ]));
        let ev = verify_off("d", Commanded::now(), &mut probe, VerifyPolicy::default())
            .await
            .unwrap();
        assert_eq!(ev.polls(), 4);
        assert_eq!(ev.device(), "d");
        assert!(ev.verified_at() >= ev.commanded_at());
    }

    #[tokio::test(start_paused = true)]
    async fn a_machine_that_stays_on_is_not_verified() {
        let mut probe = Script(VecDeque::new());
        let policy = VerifyPolicy {
            timeout: Duration::from_secs(1),
            interval: Duration::from_millis(100),
        };
        let err = verify_off("d", Commanded::now(), &mut probe, policy)
            .await
            .unwrap_err();
        match err {
            FenceError::NotVerified { last, expected, .. } => {
                assert_eq!(last, Some(PowerState::On));
                assert_eq!(expected, PowerState::Off);
            }
            other => panic!("unexpected {other}"),
        }
    }

    /// A machine that powers off `off_after` its creation, read by a status request that
    /// takes `took`.
    struct SlowMachine {
        born: tokio::time::Instant,
        off_after: Duration,
        took: Duration,
    }

    #[async_trait::async_trait]
    impl StatusProbe for SlowMachine {
        async fn probe(&mut self) -> Result<PowerState, FenceError> {
            let asked = tokio::time::Instant::now();
            tokio::time::sleep(self.took).await;
            Ok(if asked - self.born >= self.off_after {
                PowerState::Off
            } else {
                PowerState::On
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn polling_goes_on_up_to_the_deadline_not_one_interval_before_it() {
        // Reads at 0 and 0.6 s see on; the machine is off from 1.0 s; the interval would put
        // the next read at 1.2 s, the deadline: a last read at 1.1 s still ends by then.
        let mut probe = SlowMachine {
            born: tokio::time::Instant::now(),
            off_after: Duration::from_millis(1000),
            took: Duration::from_millis(100),
        };
        let policy = VerifyPolicy {
            timeout: Duration::from_millis(1200),
            interval: Duration::from_millis(500),
        };
        let ev = verify_off("d", Commanded::now(), &mut probe, policy)
            .await
            .unwrap();
        assert_eq!(ev.polls(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_machine_that_stays_on_is_given_up_at_the_deadline_not_before_it() {
        let policy = VerifyPolicy {
            timeout: Duration::from_millis(1200),
            interval: Duration::from_millis(500),
        };
        let mut probe = SlowMachine {
            born: tokio::time::Instant::now(),
            off_after: Duration::from_secs(3600),
            took: Duration::from_millis(100),
        };
        let t0 = tokio::time::Instant::now();
        let err = verify_off("d", Commanded::now(), &mut probe, policy)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "not_verified", "{err}");
        // Virtual time: the last read ended at the deadline.
        assert!(
            t0.elapsed() >= Duration::from_millis(1200),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn bridge_answers_become_evidence_only_when_verified_off() {
        let ev = serde_json::json!({"outcome": "fenced"});
        let c = Commanded::now();
        let off = off_from_bridge("b", c, true, Some(PowerState::Off), &ev).unwrap();
        assert_eq!(off.bridge_evidence(), Some(ev.to_string().as_str()));
        for (verified, state) in [
            (false, Some(PowerState::Off)),
            (true, Some(PowerState::On)),
            (true, Some(PowerState::Unknown)),
            (true, None),
        ] {
            let e = off_from_bridge("b", c, verified, state, &ev).unwrap_err();
            assert_eq!(e.kind(), "not_verified", "{verified} {state:?}");
        }
        assert!(on_from_bridge("b", c, true, Some(PowerState::On)).is_ok());
        assert!(on_from_bridge("b", c, false, Some(PowerState::On)).is_err());
    }

    /// The `compile_fail` examples of the module docs, word for word: they compile here, so
    /// outside this crate they fail only because the constructors are private.
    #[test]
    #[allow(unused_imports)]
    fn compile_fail_examples_compile_inside_this_crate() {
        use crate as palisade_fence;
        let _ = palisade_fence::VerifiedOff {
            device: "bmc".into(),
            commanded_at: std::time::SystemTime::now(),
            verified_at: std::time::SystemTime::now(),
            command_to_verified: std::time::Duration::ZERO,
            polls: 1,
            bridge_evidence: None,
            refusal: None,
        };
        let _ = palisade_fence::verify::Commanded::now();
        use palisade_fence::verify::off_from_bridge;
        use palisade_fence::verify::verify_off;
    }

    #[tokio::test(start_paused = true)]
    async fn terminal_errors_stop_polling() {
        let mut probe = Script(VecDeque::from([Err(FenceError::AuthRefused {
            device: "d".into(),
            detail: "no".into(),
        })]));
        let err = verify_off("d", Commanded::now(), &mut probe, VerifyPolicy::default())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "auth_refused");
    }
}
