//! The [`Executor`] trait: the only way the bridge touches devices.
//!
//! The HTTP layer knows nothing about IPMI or SNMP: it calls an executor with a loaded
//! [`Target`] and gets back a typed [`Outcome`] plus verification evidence (JSON). The real
//! executor drives the fencing agents; [`RecordingExecutor`] is an in-memory test double that
//! records every call so tests can count actions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::Target;

pub use palisade_fence::bridge::wire::{
    Health, PowerAction, PowerState, StorageAction, StorageHold, StorageState,
};

/// The typed result of an executor call plus its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome<S> {
    /// The state observed after the action (read back from the device).
    pub state: S,
    /// True when `state` was read back from the device after the action (command *then*
    /// verify), false for a plain status read.
    pub verified: bool,
    /// Per-device evidence from the agents (which level, device, attempts, readings).
    pub evidence: Value,
}

/// Errors from an executor.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecError {
    /// The target has no device for this kind of operation.
    #[error("target {target} has no {kind} device")]
    NoDevice {
        /// Target id.
        target: String,
        /// `power` or `storage`.
        kind: &'static str,
    },
    /// All levels failed, or verification did not match.
    #[error("target {target}: {message}")]
    Failed {
        /// Target id.
        target: String,
        /// What went wrong (never contains credentials).
        message: String,
        /// Evidence gathered before failing.
        evidence: Value,
    },
    /// An unblock under a hold lifted that hold, but a read-back after the command still
    /// reports the target blocked: another fence's hold (or a block without a hold) remains.
    /// Not an unblock: the target stays fenced (HTTP 409 `storage_still_held`).
    #[error("target {target}: {message}")]
    StillHeld {
        /// Target id.
        target: String,
        /// Which hold was lifted and what the storage still reports.
        message: String,
        /// Per-device evidence (the held devices say `still_held`).
        evidence: Value,
    },
    /// The operation exceeded its budget.
    #[error("target {target}: operation timed out after {secs}s")]
    Timeout {
        /// Target id.
        target: String,
        /// The budget.
        secs: u64,
    },
}

impl ExecError {
    /// Evidence attached to the error, if any.
    pub fn evidence(&self) -> Value {
        match self {
            ExecError::Failed { evidence, .. } | ExecError::StillHeld { evidence, .. } => {
                evidence.clone()
            }
            _ => Value::Null,
        }
    }
}

/// The device-facing side of the bridge.
///
/// # Assumptions
/// Callers serialize calls per target (the bridge holds a per-target mutex), so
/// implementations need not guard against concurrent commands to one device.
#[async_trait::async_trait]
pub trait Executor: Send + Sync + 'static {
    /// Performs a power action through the target's fencing levels, then verifies it.
    async fn power(
        &self,
        target: &Target,
        action: PowerAction,
    ) -> Result<Outcome<PowerState>, ExecError>;
    /// Reads the power state.
    async fn power_status(&self, target: &Target) -> Result<Outcome<PowerState>, ExecError>;
    /// Performs a storage action on every storage device under the fence's `hold`, then
    /// verifies it.
    ///
    /// # Guarantees
    /// - With a hold, a block adds it and an unblock lifts only it; an unblock returns `Ok`
    ///   only when a read-back after the command reports every device unblocked, and
    ///   [`ExecError::StillHeld`] when a device lifted the hold but still reports the target
    ///   blocked (another hold remains).
    /// - Without a hold, both act node-wide (an unblock lifts every hold), as before holds.
    async fn storage(
        &self,
        target: &Target,
        action: StorageAction,
        hold: Option<&StorageHold>,
    ) -> Result<Outcome<StorageState>, ExecError>;
    /// Reads the storage state.
    async fn storage_status(&self, target: &Target) -> Result<Outcome<StorageState>, ExecError>;
    /// Checks that every device of the target answers.
    async fn monitor(&self, target: &Target) -> Result<Outcome<Health>, ExecError>;
}

/// One call recorded by [`RecordingExecutor`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// A power action.
    Power(String, PowerAction),
    /// A power status read.
    PowerStatus(String),
    /// A storage action, with its hold.
    Storage(String, StorageAction, Option<StorageHold>),
    /// A storage status read.
    StorageStatus(String),
    /// A monitor call.
    Monitor(String),
}

#[derive(Debug, Default)]
struct FakeState {
    off: BTreeMap<String, bool>,
    /// Per target, its storage holds (`""`: a block without one); blocked while any remains.
    holds: BTreeMap<String, BTreeSet<String>>,
    calls: Vec<Call>,
    fail_power: BTreeMap<String, String>,
}

/// An in-memory executor for tests and benchmarks: every target starts powered on and
/// unblocked; actions flip the state and are recorded. Storage keeps holds as the lab storage
/// server does: a block adds its hold, a held unblock lifts only its own, a node-wide unblock
/// lifts them all.
#[derive(Debug, Clone, Default)]
pub struct RecordingExecutor {
    state: Arc<Mutex<FakeState>>,
    delay: Duration,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

impl RecordingExecutor {
    /// A new executor with no delay.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new executor whose mutating actions take `delay` (to exercise serialization).
    pub fn with_delay(delay: Duration) -> Self {
        Self {
            delay,
            ..Self::default()
        }
    }

    /// All calls so far.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Number of mutating calls (power and storage actions) so far.
    pub fn action_count(&self) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|c| matches!(c, Call::Power(..) | Call::Storage(..)))
            .count()
    }

    /// The highest number of mutating actions ever running at once.
    pub fn max_concurrent_actions(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Makes power actions on `target` fail with `message`.
    pub fn fail_power(&self, target: &str, message: &str) {
        self.lock().fail_power.insert(target.into(), message.into());
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, FakeState> {
        self.state.lock()
    }

    async fn act(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    fn power_state(&self, id: &str) -> PowerState {
        if self.lock().off.get(id).copied().unwrap_or(false) {
            PowerState::Off
        } else {
            PowerState::On
        }
    }
}

fn fake_evidence(target: &Target, reading: &str) -> Value {
    let devices: Vec<String> = target
        .levels
        .iter()
        .flat_map(|l| l.devices.iter().map(|d| d.url.to_string()))
        .collect();
    json!({ "executor": "recording", "target": target.id, "devices": devices, "reading": reading })
}

#[async_trait::async_trait]
impl Executor for RecordingExecutor {
    async fn power(
        &self,
        target: &Target,
        action: PowerAction,
    ) -> Result<Outcome<PowerState>, ExecError> {
        self.lock()
            .calls
            .push(Call::Power(target.id.clone(), action));
        self.act().await;
        if let Some(msg) = self.lock().fail_power.get(&target.id).cloned() {
            return Err(ExecError::Failed {
                target: target.id.clone(),
                message: msg,
                evidence: fake_evidence(target, "failed"),
            });
        }
        let off = action == PowerAction::Off;
        self.lock().off.insert(target.id.clone(), off);
        let state = self.power_state(&target.id);
        Ok(Outcome {
            state,
            verified: true,
            evidence: fake_evidence(target, &format!("{state:?}")),
        })
    }

    async fn power_status(&self, target: &Target) -> Result<Outcome<PowerState>, ExecError> {
        self.lock().calls.push(Call::PowerStatus(target.id.clone()));
        let state = self.power_state(&target.id);
        Ok(Outcome {
            state,
            verified: false,
            evidence: fake_evidence(target, &format!("{state:?}")),
        })
    }

    async fn storage(
        &self,
        target: &Target,
        action: StorageAction,
        hold: Option<&StorageHold>,
    ) -> Result<Outcome<StorageState>, ExecError> {
        if target.storage.is_empty() {
            return Err(ExecError::NoDevice {
                target: target.id.clone(),
                kind: "storage",
            });
        }
        self.lock()
            .calls
            .push(Call::Storage(target.id.clone(), action, hold.cloned()));
        self.act().await;
        let name = hold.map(StorageHold::as_str).unwrap_or_default();
        let blocked = {
            let mut st = self.lock();
            let holds = st.holds.entry(target.id.clone()).or_default();
            match (action, hold) {
                (StorageAction::Block, _) => {
                    holds.insert(name.to_owned());
                }
                (StorageAction::Unblock, Some(_)) => {
                    holds.remove(name);
                }
                (StorageAction::Unblock, None) => holds.clear(),
            }
            !holds.is_empty()
        };
        let state = if blocked {
            StorageState::Blocked
        } else {
            StorageState::Unblocked
        };
        let evidence = fake_evidence(target, &format!("{state:?}"));
        if action == StorageAction::Unblock && blocked {
            return Err(ExecError::StillHeld {
                target: target.id.clone(),
                message: format!("hold {name} lifted, but another hold keeps the target blocked"),
                evidence,
            });
        }
        Ok(Outcome {
            state,
            verified: true,
            evidence,
        })
    }

    async fn storage_status(&self, target: &Target) -> Result<Outcome<StorageState>, ExecError> {
        if target.storage.is_empty() {
            return Err(ExecError::NoDevice {
                target: target.id.clone(),
                kind: "storage",
            });
        }
        self.lock()
            .calls
            .push(Call::StorageStatus(target.id.clone()));
        let blocked = self
            .lock()
            .holds
            .get(&target.id)
            .is_some_and(|h| !h.is_empty());
        let state = if blocked {
            StorageState::Blocked
        } else {
            StorageState::Unblocked
        };
        Ok(Outcome {
            state,
            verified: false,
            evidence: fake_evidence(target, &format!("{state:?}")),
        })
    }

    async fn monitor(&self, target: &Target) -> Result<Outcome<Health>, ExecError> {
        self.lock().calls.push(Call::Monitor(target.id.clone()));
        Ok(Outcome {
            state: Health::Ok,
            verified: false,
            evidence: fake_evidence(target, "ok"),
        })
    }
}
