//! The bridge's wire vocabulary: actions and observed states as they appear in `/v1` JSON.
//!
//! Shared by the bridge (`palisade-bridge`, which re-exports them from its `executor`) and the
//! `bridge://` client, so both sides of the API use one definition.

use serde::{Deserialize, Serialize};

/// A power action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerAction {
    /// Power off (and verify off).
    Off,
    /// Power on (and verify on).
    On,
    /// Power cycle (off, verify, on).
    Reboot,
}

/// A storage-firewall action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageAction {
    /// Firewall the target off its storage (and verify blocked).
    Block,
    /// Lift the firewall (and verify unblocked).
    Unblock,
}

/// Observed power state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off.
    Off,
    /// The devices answered but disagree or report neither on nor off.
    Unknown,
}

/// Observed storage state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageState {
    /// The target is firewalled off its storage.
    Blocked,
    /// The target may reach its storage.
    Unblocked,
}

/// Device reachability, for `monitor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Every device of the target answered.
    Ok,
    /// At least one device did not answer (evidence says which).
    Degraded,
}
