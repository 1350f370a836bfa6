//! The real [`Executor`]: power operations through `palisade-fence` devices and fencing levels.
//!
//! Each target's power levels become `palisade_fence::levels::Level`s of
//! `palisade_fence::Device`s (IPMI or switched PDU). `off` and `reboot` run the levels with
//! Pacemaker semantics and succeed only with `VerifiedOff` evidence from every device of one
//! level; `on` succeeds when every device of one level verified on. The evidence returned is
//! the full attempt record (level, device, step, result, timings), never a credential.
//!
//! Each target's `storage` devices (`storagefw+https://`) become `palisade_storagefw`
//! agents (CA bundle pinned, bearer token from the `token` secret, node name and addresses
//! from the inventory). `block`/`unblock` must verify on every storage device of the target.
//! A request's hold (`palisade-<NodeFence UID>`, [`StorageHold`]) goes to the agent as
//! `NodeRef::with_hold`: the block adds it and the unblock lifts only it. A held unblock that
//! a read-back still reports blocked (another fence's hold remains) is
//! [`ExecError::StillHeld`], never `unblocked_verified`; the storage agent reports that case as
//! "not verified" (it polled until its verify timeout), and this executor reads the status once
//! more to tell "still held" from a failed read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use palisade_fence::levels::{self, AttemptResult, FenceOutcome, FenceReport, LevelPolicy, Step};
use palisade_fence::{Credentials, Device, DeviceOptions, PowerDevice};
use palisade_storagefw::{NodeRef, StorageFirewall, StorageFwConfig, StorageFwError};
use serde_json::{json, Value};

use crate::config::{self, Inventory, Target};
use crate::executor::{
    ExecError, Executor, Health, Outcome, PowerAction, PowerState, StorageAction, StorageHold,
    StorageState,
};

/// Errors building the executor from the inventory.
#[derive(Debug, thiserror::Error)]
pub enum FenceExecutorError {
    /// A device URL or its credentials were refused by the agents.
    #[error("target {target}, device {url}: {source}")]
    Device {
        /// Target id.
        target: String,
        /// Device URL.
        url: String,
        /// The agent's error.
        #[source]
        source: palisade_fence::FenceError,
    },
    /// A storage firewall device could not be built (bad URL, profile, CA bundle or node).
    #[error("target {target}, storage device {url}: {reason}")]
    Storage {
        /// Target id.
        target: String,
        /// Device URL.
        url: String,
        /// Why (never contains a credential).
        reason: String,
    },
    /// A storage device was placed in a power level.
    #[error("target {target}: device {url} is a storage device; list it under `storage`, not in a power level")]
    StorageInPowerLevel {
        /// Target id.
        target: String,
        /// Device URL.
        url: String,
    },
}

struct PowerTarget {
    names: Vec<String>,
    levels: Vec<levels::Level>,
    storage: Vec<StorageDevice>,
}

struct StorageDevice {
    url: String,
    agent: StorageFirewall,
    node: NodeRef,
}

fn build_storage(target: &str, d: &config::Device) -> Result<StorageDevice, FenceExecutorError> {
    let err = |reason: String| FenceExecutorError::Storage {
        target: target.into(),
        url: d.url.to_string(),
        reason,
    };
    let parsed =
        palisade_storagefw::Target::parse(d.url.as_str()).map_err(|e| err(e.to_string()))?;
    let ca = d
        .ca_bundle
        .as_ref()
        .ok_or_else(|| err("no ca_bundle".into()))?;
    let ca_pem = std::fs::read(ca).map_err(|e| err(format!("CA bundle {}: {e}", ca.display())))?;
    let mut cfg = StorageFwConfig::new(parsed, ca_pem).map_err(|e| err(e.to_string()))?;
    cfg.token = d
        .secrets
        .get("token")
        .map(|s| palisade_storagefw::Secret::new(s.expose()));
    let node_name = d.node.as_deref().ok_or_else(|| err("no node".into()))?;
    let node = NodeRef::new(node_name, d.addresses.clone()).map_err(|e| err(e.to_string()))?;
    let agent = StorageFirewall::new(cfg).map_err(|e| err(e.to_string()))?;
    Ok(StorageDevice {
        url: d.url.to_string(),
        agent,
        node,
    })
}

/// Drives power devices through `palisade-fence`.
pub struct FenceExecutor {
    targets: BTreeMap<String, PowerTarget>,
    policy: LevelPolicy,
}

impl std::fmt::Debug for FenceExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceExecutor")
            .field("targets", &self.targets.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn secret(d: &config::Device, names: &[&str]) -> Option<palisade_fence::Secret> {
    names
        .iter()
        .find_map(|n| d.secrets.get(*n))
        .map(|s| palisade_fence::Secret::new(s.expose()))
}

fn build_device(
    target: &str,
    d: &config::Device,
    options: DeviceOptions,
) -> Result<Device, FenceExecutorError> {
    let err = |source| FenceExecutorError::Device {
        target: target.into(),
        url: d.url.to_string(),
        source,
    };
    let mut url = d.url.clone();
    if let Some(user) = &d.username {
        if url.username().is_empty() {
            // Url::set_username only fails for cannot-be-a-base URLs, which we never have.
            let _ = url.set_username(user);
        }
    }
    let parsed = palisade_fence::Target::parse(url.as_str()).map_err(err)?;
    let creds = Credentials {
        password: secret(d, &["password"]),
        community: secret(d, &["community"]),
        v3_auth_password: secret(d, &["v3_auth_password", "auth_password"]),
        v3_priv_password: secret(d, &["v3_priv_password", "priv_password"]),
    };
    Device::new(parsed, &creds, options).map_err(err)
}

impl FenceExecutor {
    /// Builds devices for every power level of every target (nothing is sent yet).
    pub fn new(inventory: &Inventory) -> Result<Self, FenceExecutorError> {
        Self::with_options(inventory, DeviceOptions::default(), LevelPolicy::default())
    }

    /// Like [`FenceExecutor::new`] with explicit device options and level bounds.
    pub fn with_options(
        inventory: &Inventory,
        options: DeviceOptions,
        policy: LevelPolicy,
    ) -> Result<Self, FenceExecutorError> {
        let mut targets = BTreeMap::new();
        for (id, t) in &inventory.targets {
            let mut names = Vec::new();
            let mut lv = Vec::new();
            for l in &t.levels {
                let mut devices: Vec<Arc<dyn PowerDevice>> = Vec::new();
                for d in &l.devices {
                    if d.url.scheme() == "storagefw+https" {
                        return Err(FenceExecutorError::StorageInPowerLevel {
                            target: id.clone(),
                            url: d.url.to_string(),
                        });
                    }
                    devices.push(Arc::new(build_device(id, d, options)?));
                }
                names.push(l.name.clone());
                lv.push(levels::Level { devices });
            }
            let storage = t
                .storage
                .iter()
                .map(|d| build_storage(id, d))
                .collect::<Result<Vec<_>, _>>()?;
            targets.insert(
                id.clone(),
                PowerTarget {
                    names,
                    levels: lv,
                    storage,
                },
            );
        }
        Ok(Self { targets, policy })
    }

    fn storage_devices(&self, t: &Target) -> Result<&[StorageDevice], ExecError> {
        self.targets
            .get(&t.id)
            .map(|p| p.storage.as_slice())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ExecError::NoDevice {
                target: t.id.clone(),
                kind: "storage",
            })
    }

    fn power_target(&self, t: &Target) -> Result<&PowerTarget, ExecError> {
        self.targets
            .get(&t.id)
            .filter(|p| !p.levels.is_empty())
            .ok_or_else(|| ExecError::NoDevice {
                target: t.id.clone(),
                kind: "power",
            })
    }
}

/// RFC 3339 in UTC, to the millisecond (a time before 1970 or after 9999 reads as the epoch):
/// the bridge's evidence and audit times.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    format!(
        "{:.3}",
        jiff::Timestamp::try_from(t).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
    )
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Renders a fencing report as JSON evidence.
fn report_evidence(pt: &PowerTarget, action: PowerAction, r: &FenceReport) -> Value {
    let level_name = |i: usize| pt.names.get(i).cloned().unwrap_or_default();
    let attempts: Vec<Value> = r
        .attempts
        .iter()
        .map(|a| {
            let mut v = json!({
                "level": a.level,
                "level_name": level_name(a.level),
                "device": a.device,
                "step": match a.step { Step::Off => "off", Step::On => "on" },
                "started_at": rfc3339(a.started_at),
                "duration_ms": ms(a.duration),
            });
            match &a.result {
                AttemptResult::Off(ev) => {
                    v["result"] = json!("off_verified");
                    v["commanded_at"] = json!(rfc3339(ev.commanded_at()));
                    v["verified_at"] = json!(rfc3339(ev.verified_at()));
                    v["command_to_verified_ms"] = json!(ms(ev.command_to_verified()));
                    v["polls"] = json!(ev.polls());
                }
                AttemptResult::On => v["result"] = json!("on_verified"),
                AttemptResult::Failed(e) => {
                    v["result"] = json!("failed");
                    v["error"] = json!(e.to_string());
                    v["retryable"] = json!(e.is_retryable());
                }
                AttemptResult::Skipped(why) => {
                    v["result"] = json!("skipped");
                    v["reason"] = json!(why);
                }
            }
            v
        })
        .collect();
    let (outcome, level) = match &r.outcome {
        FenceOutcome::Fenced { level, .. } => ("fenced", Some(*level)),
        FenceOutcome::Failed => ("failed", None),
    };
    json!({
        "executor": "palisade-fence",
        "action": format!("{:?}", action).to_lowercase(),
        "outcome": outcome,
        "level": level,
        "level_name": level.map(level_name),
        "attempts": attempts,
        "duration_ms": ms(r.duration),
    })
}

/// The level (index) whose every `On` attempt verified, if any.
fn level_on(r: &FenceReport) -> Option<usize> {
    let mut by_level: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for a in r.attempts.iter().filter(|a| a.step == Step::On) {
        let e = by_level.entry(a.level).or_default();
        e.0 += 1;
        e.1 += usize::from(matches!(a.result, AttemptResult::On));
    }
    by_level
        .into_iter()
        .find(|(_, (n, ok))| n == ok && *n > 0)
        .map(|(l, _)| l)
}

fn to_fence_action(a: PowerAction) -> palisade_fence::PowerAction {
    match a {
        PowerAction::Off => palisade_fence::PowerAction::Off,
        PowerAction::On => palisade_fence::PowerAction::On,
        PowerAction::Reboot => palisade_fence::PowerAction::Reboot,
    }
}

/// Reads every storage device's status: `(all blocked, readings)`; `None` if one failed.
async fn storage_readings(devs: &[StorageDevice]) -> (Option<bool>, Vec<Value>) {
    let mut all_blocked = Some(true);
    let mut readings = Vec::new();
    for d in devs {
        match d.agent.status(&d.node).await {
            Ok(s) => {
                if let Some(b) = all_blocked.as_mut() {
                    *b &= s.blocked;
                }
                readings.push(json!({ "device": d.url, "node": s.node, "blocked": s.blocked, "status": s.raw }));
            }
            Err(e) => {
                all_blocked = None;
                readings.push(json!({ "device": d.url, "node": d.node.name(), "error": e.to_string(), "retryable": e.is_retryable() }));
            }
        }
    }
    (all_blocked, readings)
}

/// One storage device's answer to an action, as evidence.
enum DeviceResult {
    /// Commanded and verified (`blocked_verified`, `unblocked_verified`).
    Verified(Value),
    /// A held unblock that a read-back after the command still reports blocked (`still_held`).
    StillHeld(Value),
    /// Not verified, refused or unreachable (`failed`).
    Failed(Value),
}

/// Blocks or unblocks the node at one storage device, under `hold` when given.
///
/// Guarantees: `Verified` only from the agent's verified evidence (a status read after the
/// command), or, for a held unblock the agent could not verify, from a status read after that
/// reporting the node unblocked; `StillHeld` only for a held unblock whose last read reports
/// the node blocked. Without a hold an unverified unblock is `Failed`, as before holds.
async fn storage_one(
    d: &StorageDevice,
    action: StorageAction,
    hold: Option<&StorageHold>,
) -> DeviceResult {
    let failed = |node: &str, e: &StorageFwError| {
        DeviceResult::Failed(json!({
            "device": d.url, "node": node, "hold": hold, "result": "failed",
            "error": e.to_string(), "retryable": e.is_retryable() }))
    };
    let node = match hold {
        None => d.node.clone(),
        Some(h) => match d.node.clone().with_hold(h.as_str()) {
            Ok(n) => n,
            // Not reached: a StorageHold keeps the rule of NodeRef::with_hold (tested).
            Err(e) => return failed(d.node.name(), &e),
        },
    };
    match action {
        StorageAction::Block => match d.agent.block(&node).await {
            Ok(ev) => DeviceResult::Verified(json!({
                "device": d.url, "node": ev.node(), "hold": hold, "result": "blocked_verified",
                "addresses": ev.addresses(), "verified_at": rfc3339(ev.verified_at()),
                "status": ev.status() })),
            Err(e) => failed(node.name(), &e),
        },
        StorageAction::Unblock => match d.agent.unblock(&node).await {
            Ok(ev) => DeviceResult::Verified(json!({
                "device": d.url, "node": ev.node(), "hold": hold, "result": "unblocked_verified",
                "verified_at": rfc3339(ev.verified_at()) })),
            // With a hold, "still blocked" after the command means another hold remains.
            Err(e @ StorageFwError::NotVerified { .. }) if hold.is_some() => {
                match d.agent.status(&node).await {
                    Ok(s) if s.blocked => DeviceResult::StillHeld(json!({
                        "device": d.url, "node": s.node, "hold": hold, "result": "still_held",
                        "error": e.to_string(), "status": s.raw })),
                    Ok(s) => DeviceResult::Verified(json!({
                        "device": d.url, "node": s.node, "hold": hold,
                        "result": "unblocked_verified",
                        "verified_at": rfc3339(SystemTime::now()), "status": s.raw })),
                    Err(e) => failed(node.name(), &e),
                }
            }
            Err(e) => failed(node.name(), &e),
        },
    }
}

#[async_trait::async_trait]
impl Executor for FenceExecutor {
    async fn power(
        &self,
        t: &Target,
        action: PowerAction,
    ) -> Result<Outcome<PowerState>, ExecError> {
        let pt = self.power_target(t)?;
        let report = levels::run(&pt.levels, to_fence_action(action), self.policy).await;
        let evidence = report_evidence(pt, action, &report);
        let fail = |message: &str| ExecError::Failed {
            target: t.id.clone(),
            message: message.into(),
            evidence: evidence.clone(),
        };
        match action {
            PowerAction::Off if report.is_fenced() => Ok(Outcome {
                state: PowerState::Off,
                verified: true,
                evidence,
            }),
            PowerAction::Off => Err(fail(
                "every fencing level failed; the target is NOT verified off",
            )),
            PowerAction::Reboot if report.is_fenced() && level_on(&report).is_some() => {
                Ok(Outcome {
                    state: PowerState::On,
                    verified: true,
                    evidence,
                })
            }
            PowerAction::Reboot if report.is_fenced() => {
                Err(fail("powered off (verified) but power on did not verify"))
            }
            PowerAction::Reboot => Err(fail("every fencing level failed to power off")),
            PowerAction::On if level_on(&report).is_some() => Ok(Outcome {
                state: PowerState::On,
                verified: true,
                evidence,
            }),
            PowerAction::On => Err(fail("no fencing level verified power on")),
        }
    }

    async fn power_status(&self, t: &Target) -> Result<Outcome<PowerState>, ExecError> {
        let pt = self.power_target(t)?;
        let mut readings = Vec::new();
        // The first level whose devices all answer gives the state.
        for (i, level) in pt.levels.iter().enumerate() {
            let mut states = Vec::new();
            for d in &level.devices {
                match d.status().await {
                    Ok(s) => {
                        readings.push(
                            json!({ "level": i, "device": d.name(), "state": s.to_string() }),
                        );
                        states.push(s);
                    }
                    Err(e) => readings
                        .push(json!({ "level": i, "device": d.name(), "error": e.to_string() })),
                }
            }
            if states.len() == level.devices.len() {
                use palisade_fence::PowerState as F;
                let state = if states.iter().all(|s| *s == F::Off) {
                    PowerState::Off
                } else if states.iter().all(|s| *s == F::On) {
                    PowerState::On
                } else {
                    PowerState::Unknown
                };
                let evidence = json!({ "executor": "palisade-fence", "level": i, "level_name": pt.names[i], "readings": readings });
                return Ok(Outcome {
                    state,
                    verified: false,
                    evidence,
                });
            }
        }
        Err(ExecError::Failed {
            target: t.id.clone(),
            message: "no fencing level answered a status request".into(),
            evidence: json!({ "executor": "palisade-fence", "readings": readings }),
        })
    }

    async fn storage(
        &self,
        t: &Target,
        action: StorageAction,
        hold: Option<&StorageHold>,
    ) -> Result<Outcome<StorageState>, ExecError> {
        let devs = self.storage_devices(t)?;
        let mut results = Vec::new();
        let (mut failed, mut held) = (false, false);
        // Every device is commanded even if one fails: a partial block is still worth having,
        // and the evidence shows exactly which devices verified.
        for d in devs {
            let r = match storage_one(d, action, hold).await {
                DeviceResult::Verified(v) => v,
                DeviceResult::StillHeld(v) => {
                    held = true;
                    v
                }
                DeviceResult::Failed(v) => {
                    failed = true;
                    v
                }
            };
            results.push(r);
        }
        let (state, verb) = match action {
            StorageAction::Block => (StorageState::Blocked, "block"),
            StorageAction::Unblock => (StorageState::Unblocked, "unblock"),
        };
        let evidence = json!({ "executor": "palisade-storagefw", "action": verb,
                               "hold": hold, "devices": results });
        if failed {
            return Err(ExecError::Failed {
                target: t.id.clone(),
                message: format!("storage {verb} did not verify on every storage device"),
                evidence,
            });
        }
        if held {
            return Err(ExecError::StillHeld {
                target: t.id.clone(),
                message: format!(
                    "storage unblock lifted hold {} only: the storage still reports the target blocked, so another fence still holds it; the target stays fenced",
                    hold.map(StorageHold::as_str).unwrap_or_default()
                ),
                evidence,
            });
        }
        Ok(Outcome {
            state,
            verified: true,
            evidence,
        })
    }

    async fn storage_status(&self, t: &Target) -> Result<Outcome<StorageState>, ExecError> {
        let devs = self.storage_devices(t)?;
        let (all_blocked, readings) = storage_readings(devs).await;
        let evidence = json!({ "executor": "palisade-storagefw", "readings": readings });
        match all_blocked {
            // Blocked only when every storage device says so; anything less is not fenced.
            Some(b) => Ok(Outcome {
                state: if b {
                    StorageState::Blocked
                } else {
                    StorageState::Unblocked
                },
                verified: false,
                evidence,
            }),
            None => Err(ExecError::Failed {
                target: t.id.clone(),
                message: "a storage device did not answer a status request".into(),
                evidence,
            }),
        }
    }

    async fn monitor(&self, t: &Target) -> Result<Outcome<Health>, ExecError> {
        let pt = self
            .targets
            .get(&t.id)
            .filter(|p| !p.levels.is_empty() || !p.storage.is_empty())
            .ok_or_else(|| ExecError::NoDevice {
                target: t.id.clone(),
                kind: "power or storage",
            })?;
        let mut checks = Vec::new();
        let mut ok = true;
        for (i, level) in pt.levels.iter().enumerate() {
            for d in &level.devices {
                match d.monitor().await {
                    Ok(()) => {
                        checks.push(json!({ "level": i, "device": d.name(), "result": "ok" }))
                    }
                    Err(e) => {
                        ok = false;
                        checks.push(json!({ "level": i, "device": d.name(), "result": "failed", "error": e.to_string() }));
                    }
                }
            }
        }
        for d in &pt.storage {
            match d.agent.status(&d.node).await {
                Ok(_) => checks.push(json!({ "storage": d.url, "result": "ok" })),
                Err(e) => {
                    ok = false;
                    checks.push(
                        json!({ "storage": d.url, "result": "failed", "error": e.to_string() }),
                    );
                }
            }
        }
        let state = if ok { Health::Ok } else { Health::Degraded };
        Ok(Outcome {
            state,
            verified: false,
            evidence: json!({ "executor": "palisade-fence", "checks": checks }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evidence times are UTC, to the millisecond, whatever the clock's precision.
    #[test]
    fn evidence_times_are_rfc3339_utc_to_the_millisecond() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_234_567_891);
        assert_eq!(rfc3339(t), "1970-01-01T00:00:01.234Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    /// The wire's rule for a hold and the storage agent's are one rule: a hold the bridge
    /// accepts is one the agent accepts, and a hold the agent would refuse is refused at the
    /// bridge's door (400 `invalid_hold`), before anything is done.
    #[test]
    fn a_hold_is_valid_on_the_wire_exactly_when_the_storage_agent_accepts_it() {
        let long = "a".repeat(253);
        let too_long = "a".repeat(254);
        let cases = [
            "palisade-0f8d3a52-1c2e-4b7a-9d3e-5a1b2c3d4e5f",
            "a",
            "x.y-1",
            "-lead",
            "trail.",
            long.as_str(),
            "",
            "Upper",
            "a/b",
            "a b",
            "a_b",
            "x\"y",
            "ü",
            "a\n",
            too_long.as_str(),
        ];
        let node = NodeRef::new("m0", vec![]).unwrap();
        for h in cases {
            assert_eq!(
                StorageHold::new(h).is_ok(),
                node.clone().with_hold(h).is_ok(),
                "{h:?}"
            );
        }
    }
}
