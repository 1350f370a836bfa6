//! The bridge's wire vocabulary: actions and observed states as they appear in `/v1` JSON.
//!
//! Shared by the bridge (`palisade-bridge`, which re-exports them from its `executor`) and the
//! `bridge://` client, so both sides of the API use one definition.

use serde::{Deserialize, Serialize};

/// The optional JSON body of a mutating request (`POST /v1/targets/{id}/power/{action}` and
/// `POST /v1/targets/{id}/storage/{action}`).
///
/// Guarantees: unknown fields are refused (`deny_unknown_fields`), so a request the bridge
/// does not fully understand is never acted on; in particular a bridge that predates `hold`
/// refuses a request carrying one instead of unblocking the node node-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionBody {
    /// Free text recorded in the audit log (e.g. the NodeFence name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fence's own hold at the storage (storage actions only; see [`StorageHold`]).
    /// Absent: the block and unblock are node-wide (a controller older than holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<StorageHold>,
}

/// A fence's own hold on a node's storage, `palisade-<NodeFence UID>`: a block adds it, an
/// unblock lifts only it, and the node stays blocked while any other hold remains (so a
/// deposed leader's late unblock cannot lift a newer fence's block).
///
/// Guarantees: 1..=253 characters, each a lowercase ASCII letter, a digit, `-` or `.`: the
/// rule of `palisade_storagefw::NodeRef::with_hold`, so a hold accepted here is accepted by
/// the storage agent (the bridge's tests pin the two rules together). Deserializing checks
/// the rule too, so no value of this type breaks it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct StorageHold(String);

/// A hold that breaks the rule of [`StorageHold`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hold {hold:?} must be 1..=253 lowercase alphanumerics, '-' or '.'")]
pub struct InvalidHold {
    /// The refused hold.
    pub hold: String,
}

impl StorageHold {
    /// Checks `hold` against the rule of [`StorageHold`].
    pub fn new(hold: &str) -> Result<Self, InvalidHold> {
        let ok = !hold.is_empty()
            && hold.len() <= 253
            && hold
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if ok {
            Ok(Self(hold.to_owned()))
        } else {
            Err(InvalidHold { hold: hold.into() })
        }
    }

    /// The hold as sent on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for StorageHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for StorageHold {
    type Error = InvalidHold;
    fn try_from(s: String) -> Result<Self, InvalidHold> {
        Self::new(&s)
    }
}

impl From<StorageHold> for String {
    fn from(h: StorageHold) -> String {
        h.0
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_lowercase_names_of_at_most_253_characters() {
        for ok in [
            "palisade-0f8d3a52-1c2e-4b7a-9d3e-5a1b2c3d4e5f",
            "a",
            "x.y-1",
        ] {
            assert_eq!(StorageHold::new(ok).unwrap().as_str(), ok);
        }
        let long = "a".repeat(254);
        for bad in ["", "Upper", "a/b", "a b", "x\"y", "a_b", "ü", long.as_str()] {
            assert!(StorageHold::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(StorageHold::new(&"a".repeat(253)).is_ok());
    }

    #[test]
    fn the_body_carries_the_hold_as_a_checked_string_and_refuses_unknown_fields() {
        let body = ActionBody {
            reason: Some("nf-1".into()),
            hold: Some(StorageHold::new("palisade-1").unwrap()),
        };
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"reason": "nf-1", "hold": "palisade-1"})
        );
        assert_eq!(serde_json::from_value::<ActionBody>(json).unwrap(), body);
        // Without a hold the body is what older clients sent.
        assert_eq!(
            serde_json::to_value(ActionBody::default()).unwrap(),
            serde_json::json!({})
        );
        assert!(serde_json::from_str::<ActionBody>(r#"{"hold":"Bad/Hold"}"#).is_err());
        assert!(serde_json::from_str::<ActionBody>(r#"{"hold":7}"#).is_err());
        assert!(serde_json::from_str::<ActionBody>(r#"{"holds":["a"]}"#).is_err());
    }
}
