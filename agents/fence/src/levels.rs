//! Fencing levels with Pacemaker semantics.
//!
//! - Levels are tried in order; the first level whose every device succeeds fences the node.
//! - Within a level every device must succeed. For `off` the devices are switched
//!   concurrently; for `reboot` every device is switched off (verified) before any is switched
//!   on again, so a dual-supply machine really loses power.
//! - Each device operation runs under its own timeout, and the whole run under an overall
//!   budget. Every attempt is recorded (device, action, result, evidence, durations).
//! - A failed level is never reported as a fence: [`FenceOutcome::Fenced`] can only be built
//!   from [`VerifiedOff`] evidence of every device of the level.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use futures::future::join_all;

use crate::device::PowerDevice;
use crate::error::FenceError;
use crate::power::PowerAction;
use crate::verify::VerifiedOff;

/// One level: devices that must all succeed.
#[derive(Clone)]
pub struct Level {
    /// Devices of the level.
    pub devices: Vec<Arc<dyn PowerDevice>>,
}

impl std::fmt::Debug for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.devices.iter().map(|d| d.name().to_string()))
            .finish()
    }
}

/// Bounds of a fencing run.
#[derive(Debug, Clone, Copy)]
pub struct LevelPolicy {
    /// Timeout of one device operation (command + verification).
    pub device_timeout: Duration,
    /// Budget of the whole run across all levels.
    pub budget: Duration,
}

impl Default for LevelPolicy {
    fn default() -> Self {
        Self {
            device_timeout: Duration::from_secs(30),
            budget: Duration::from_secs(120),
        }
    }
}

/// What one device attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Power off (verified).
    Off,
    /// Power on (verified).
    On,
}

/// The result of one attempt.
#[derive(Debug)]
pub enum AttemptResult {
    /// Power off verified.
    Off(VerifiedOff),
    /// Power on verified.
    On,
    /// Failed.
    Failed(FenceError),
    /// Not attempted because the budget ran out or an earlier step of the level failed.
    Skipped(&'static str),
}

/// A record of one device operation.
#[derive(Debug)]
pub struct Attempt {
    /// Level index (0-based).
    pub level: usize,
    /// Device description.
    pub device: String,
    /// What was attempted.
    pub step: Step,
    /// What happened.
    pub result: AttemptResult,
    /// Wall-clock start.
    pub started_at: SystemTime,
    /// Duration of the attempt.
    pub duration: Duration,
}

/// The outcome of a run.
#[derive(Debug)]
pub enum FenceOutcome {
    /// Level `level` succeeded; `evidence` holds one verified off per device of that level.
    Fenced {
        /// Which level fenced.
        level: usize,
        /// The evidence, one per device.
        evidence: Vec<VerifiedOff>,
    },
    /// Every level failed (or the budget ran out).
    Failed,
}

/// A run's outcome and every attempt made.
#[derive(Debug)]
pub struct FenceReport {
    /// Fenced or failed.
    pub outcome: FenceOutcome,
    /// Every attempt, in order.
    pub attempts: Vec<Attempt>,
    /// Total duration.
    pub duration: Duration,
}

impl FenceReport {
    /// True only for [`FenceOutcome::Fenced`].
    pub fn is_fenced(&self) -> bool {
        matches!(self.outcome, FenceOutcome::Fenced { .. })
    }
}

/// A failed off: reported as failed, unless the planted bug `TrustCommand` ([`crate::planted`],
/// debug builds only) counts it as verified.
#[cfg_attr(not(debug_assertions), allow(unused_variables))]
fn off_failed(device: &str, e: FenceError) -> AttemptResult {
    #[cfg(debug_assertions)]
    if crate::planted::active(crate::planted::Planted::TrustCommand) {
        tracing::error!(device, error = %e, "planted bug TrustCommand: counting an unverified off as verified");
        return AttemptResult::Off(crate::verify::trusted_off(device));
    }
    AttemptResult::Failed(e)
}

async fn attempt(
    level: usize,
    device: &Arc<dyn PowerDevice>,
    step: Step,
    timeout: Duration,
) -> Attempt {
    let started_at = SystemTime::now();
    let t0 = Instant::now();
    let result = match step {
        Step::Off => match tokio::time::timeout(timeout, device.off()).await {
            Ok(Ok(ev)) => AttemptResult::Off(ev),
            Ok(Err(e)) => off_failed(device.name(), e),
            Err(_) => off_failed(
                device.name(),
                FenceError::Timeout {
                    device: device.name().to_string(),
                    operation: "off".into(),
                    after: timeout,
                },
            ),
        },
        Step::On => match tokio::time::timeout(timeout, device.on()).await {
            Ok(Ok(_)) => AttemptResult::On,
            Ok(Err(e)) => AttemptResult::Failed(e),
            Err(_) => AttemptResult::Failed(FenceError::Timeout {
                device: device.name().to_string(),
                operation: "on".into(),
                after: timeout,
            }),
        },
    };
    Attempt {
        level,
        device: device.name().to_string(),
        step,
        result,
        started_at,
        duration: t0.elapsed(),
    }
}

/// Runs the levels for `action` (`Off` or `Reboot`; `On` switches the first level that
/// succeeds on and never reports fenced).
///
/// Guarantees: the outcome is `Fenced` only if every device of one level returned
/// [`VerifiedOff`]; for reboot, the on phase runs only after all offs of the level verified.
pub async fn run(levels: &[Level], action: PowerAction, policy: LevelPolicy) -> FenceReport {
    let t0 = Instant::now();
    let deadline = t0 + policy.budget;
    let mut attempts = Vec::new();
    for (i, level) in levels.iter().enumerate() {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            for d in &level.devices {
                attempts.push(skipped(i, d, Step::Off, "overall budget exhausted"));
            }
            continue;
        }
        let per_device = policy.device_timeout.min(remaining);
        if action == PowerAction::On {
            let results = join_all(
                level
                    .devices
                    .iter()
                    .map(|d| attempt(i, d, Step::On, per_device)),
            )
            .await;
            let ok = results
                .iter()
                .all(|a| matches!(a.result, AttemptResult::On));
            attempts.extend(results);
            if ok {
                break;
            }
            continue;
        }
        let results = join_all(
            level
                .devices
                .iter()
                .map(|d| attempt(i, d, Step::Off, per_device)),
        )
        .await;
        let all_off = !results.is_empty()
            && results
                .iter()
                .all(|a| matches!(a.result, AttemptResult::Off(_)));
        let evidence: Vec<VerifiedOff> = results
            .iter()
            .filter_map(|a| match &a.result {
                AttemptResult::Off(ev) => Some(ev.clone()),
                _ => None,
            })
            .collect();
        attempts.extend(results);
        if !all_off {
            continue;
        }
        if action == PowerAction::Reboot {
            // All off verified; now all on. A failure to power on does not undo the fence.
            let remaining = deadline.saturating_duration_since(Instant::now());
            let per_device = policy.device_timeout.min(remaining);
            if per_device.is_zero() {
                for d in &level.devices {
                    attempts.push(skipped(i, d, Step::On, "overall budget exhausted"));
                }
            } else {
                let ons = join_all(
                    level
                        .devices
                        .iter()
                        .map(|d| attempt(i, d, Step::On, per_device)),
                )
                .await;
                attempts.extend(ons);
            }
        }
        return FenceReport {
            outcome: FenceOutcome::Fenced { level: i, evidence },
            attempts,
            duration: t0.elapsed(),
        };
    }
    FenceReport {
        outcome: FenceOutcome::Failed,
        attempts,
        duration: t0.elapsed(),
    }
}

fn skipped(level: usize, d: &Arc<dyn PowerDevice>, step: Step, why: &'static str) -> Attempt {
    Attempt {
        level,
        device: d.name().to_string(),
        step,
        result: AttemptResult::Skipped(why),
        started_at: SystemTime::now(),
        duration: Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::power::PowerState;
    use crate::verify::{verify_off, verify_on, Commanded, StatusProbe, VerifiedOn, VerifyPolicy};
    use async_trait::async_trait;
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A recording fake device whose state is flipped by commands.
    struct Fake {
        name: String,
        powered: AtomicBool,
        fail_off: bool,
        log: Arc<Mutex<Vec<String>>>,
    }

    struct FakeProbe<'a>(&'a Fake);

    #[async_trait]
    impl StatusProbe for FakeProbe<'_> {
        async fn probe(&mut self) -> Result<PowerState, FenceError> {
            Ok(if self.0.powered.load(Ordering::SeqCst) {
                PowerState::On
            } else {
                PowerState::Off
            })
        }
    }

    #[async_trait]
    impl PowerDevice for Fake {
        fn name(&self) -> &str {
            &self.name
        }
        async fn status(&self) -> Result<PowerState, FenceError> {
            FakeProbe(self).probe().await
        }
        async fn off(&self) -> Result<VerifiedOff, FenceError> {
            self.log.lock().push(format!("{} off", self.name));
            if self.fail_off {
                return Err(FenceError::AuthRefused {
                    device: self.name.clone(),
                    detail: "bad password".into(),
                });
            }
            let c = Commanded::now();
            self.powered.store(false, Ordering::SeqCst);
            verify_off(&self.name, c, &mut FakeProbe(self), VerifyPolicy::default()).await
        }
        async fn on(&self) -> Result<VerifiedOn, FenceError> {
            self.log.lock().push(format!("{} on", self.name));
            let c = Commanded::now();
            self.powered.store(true, Ordering::SeqCst);
            verify_on(&self.name, c, &mut FakeProbe(self), VerifyPolicy::default()).await
        }
        async fn monitor(&self) -> Result<(), FenceError> {
            Ok(())
        }
    }

    fn fake(name: &str, fail_off: bool, log: &Arc<Mutex<Vec<String>>>) -> Arc<dyn PowerDevice> {
        Arc::new(Fake {
            name: name.into(),
            powered: AtomicBool::new(true),
            fail_off,
            log: log.clone(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_level_falls_through_to_the_next() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let levels = vec![
            Level {
                devices: vec![fake("ipmi", true, &log)],
            },
            Level {
                devices: vec![fake("pdu-a", false, &log), fake("pdu-b", false, &log)],
            },
        ];
        let r = run(&levels, PowerAction::Off, LevelPolicy::default()).await;
        match &r.outcome {
            FenceOutcome::Fenced { level, evidence } => {
                assert_eq!(*level, 1);
                assert_eq!(evidence.len(), 2);
            }
            FenceOutcome::Failed => panic!("not fenced"),
        }
        assert_eq!(r.attempts.len(), 3);
        assert!(matches!(r.attempts[0].result, AttemptResult::Failed(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_level_with_one_failing_device_is_not_a_fence() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let levels = vec![Level {
            devices: vec![fake("a", false, &log), fake("b", true, &log)],
        }];
        let r = run(&levels, PowerAction::Off, LevelPolicy::default()).await;
        assert!(!r.is_fenced());
        assert_eq!(r.attempts.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn reboot_on_a_multi_device_level_is_all_off_then_all_on() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let levels = vec![Level {
            devices: vec![fake("a", false, &log), fake("b", false, &log)],
        }];
        let r = run(&levels, PowerAction::Reboot, LevelPolicy::default()).await;
        assert!(r.is_fenced());
        let log = log.lock().clone();
        let first_on = log.iter().position(|l| l.ends_with(" on")).unwrap();
        let last_off = log.iter().rposition(|l| l.ends_with(" off")).unwrap();
        assert!(last_off < first_on, "{log:?}");
        assert_eq!(r.attempts.len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn an_exhausted_budget_skips_remaining_levels() {
        struct Hang;
        #[async_trait]
        impl PowerDevice for Hang {
            fn name(&self) -> &str {
                "hang"
            }
            async fn status(&self) -> Result<PowerState, FenceError> {
                std::future::pending().await
            }
            async fn off(&self) -> Result<VerifiedOff, FenceError> {
                std::future::pending().await
            }
            async fn on(&self) -> Result<VerifiedOn, FenceError> {
                std::future::pending().await
            }
            async fn monitor(&self) -> Result<(), FenceError> {
                Ok(())
            }
        }
        let levels = vec![
            Level {
                devices: vec![Arc::new(Hang)],
            },
            Level {
                devices: vec![Arc::new(Hang)],
            },
        ];
        let policy = LevelPolicy {
            device_timeout: Duration::from_secs(10),
            budget: Duration::from_secs(10),
        };
        let r = run(&levels, PowerAction::Off, policy).await;
        assert!(!r.is_fenced());
        assert_eq!(r.attempts.len(), 2);
        assert!(matches!(r.attempts[1].result, AttemptResult::Skipped(_)));
    }
}
