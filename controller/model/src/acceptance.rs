//! The status of the operator's configuration objects (`FencingPolicy`, `FenceTarget`): whether
//! the controller accepted the object, every problem it found, and for a policy the nodes it
//! covers and the policies it overlaps with.
//!
//! The controller writes it as soon as an object changes, so a malformed policy or target is
//! reported where the operator looks, not when a node it covers dies.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The condition type every configuration object carries.
pub const ACCEPTED: &str = "Accepted";

/// Most nodes listed by name in a policy's status (the count is always exact).
pub const MAX_LISTED_NODES: usize = 100;

/// Why an object is, or is not, accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// Valid and in force.
    Valid,
    /// `validate()` found problems: the object is never used for fencing.
    Invalid,
    /// A device URL carries credentials: the target is never used for fencing.
    CredentialsInUrl,
    /// The policy selects nodes another policy also selects: those nodes are held.
    Conflict,
}

impl Reason {
    /// The stable label (condition reason, metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Valid => "Valid",
            Self::Invalid => "Invalid",
            Self::CredentialsInUrl => "CredentialsInUrl",
            Self::Conflict => "Conflict",
        }
    }
}

/// Another policy selecting some of the same nodes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overlap {
    /// The other policy.
    pub policy: String,
    /// The nodes both select (at most [`MAX_LISTED_NODES`]).
    pub nodes: Vec<String>,
}

/// Status of a `FencingPolicy` or a `FenceTarget`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`: `True` when the object is in force; otherwise its reason says why not.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Every problem found, one line each (credentials are never shown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Policies: how many nodes the selector matches now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub covered_node_count: Option<i64>,
    /// Policies: the nodes the selector matches now (at most [`MAX_LISTED_NODES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covered_nodes: Vec<String>,
    /// Policies: other policies selecting some of the same nodes; those nodes are held
    /// (`ConflictingPolicies`) until the overlap is removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlaps: Vec<Overlap>,
    /// Targets: whether each level and device could fence the node now, from the controller's
    /// periodic read-only checks (written when it changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
}

/// A FenceTarget's readiness: could the controller fence this node now?
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Readiness {
    /// At least one level has every device ready.
    pub ready: bool,
    /// When `ready` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// Per level, in order.
    #[serde(default)]
    pub levels: Vec<LevelReadiness>,
}

/// One level's readiness.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LevelReadiness {
    /// The level's name.
    pub name: String,
    /// Every device of the level answered.
    pub ready: bool,
    /// Its devices, in order.
    #[serde(default)]
    pub devices: Vec<DeviceReadiness>,
}

/// One device's readiness, from a read-only check (never a power or storage action).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceReadiness {
    /// The device URL, credentials redacted.
    pub url: String,
    /// It answered the last check.
    pub ready: bool,
    /// What it reported (for example `power On`), when it answered.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reported: String,
    /// Why the last check failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_error: String,
    /// When this device's `ready` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// What the controller concluded about one object, before it is written as a [`ConfigStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Accepted or why not.
    pub reason: Reason,
    /// A one-line summary for the condition and the Event.
    pub message: String,
    /// Every problem found.
    pub problems: Vec<String>,
    /// Policies: covered nodes, sorted.
    pub covered: Option<Vec<String>>,
    /// Policies: overlaps, by other policy, sorted.
    pub overlaps: BTreeMap<String, Vec<String>>,
}

impl Verdict {
    /// Whether the object is in force.
    pub fn accepted(&self) -> bool {
        self.reason == Reason::Valid
    }

    /// The status for an object of this `generation`. The condition's transition time is kept
    /// from `previous` when its status and reason did not change, so rewriting an unchanged
    /// status is a no-op.
    pub fn to_status(
        &self,
        generation: Option<i64>,
        previous: Option<&ConfigStatus>,
        now: Time,
    ) -> ConfigStatus {
        let status = if self.accepted() { "True" } else { "False" };
        let reason = self.reason.as_str();
        let last_transition_time = previous
            .and_then(|p| p.conditions.iter().find(|c| c.type_ == ACCEPTED))
            .filter(|c| c.status == status && c.reason == reason)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(now);
        ConfigStatus {
            observed_generation: generation,
            conditions: vec![Condition {
                type_: ACCEPTED.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message: self.message.clone(),
                last_transition_time,
                observed_generation: generation,
            }],
            problems: self.problems.clone(),
            covered_node_count: self
                .covered
                .as_ref()
                .map(|c| i64::try_from(c.len()).unwrap_or(i64::MAX)),
            covered_nodes: self
                .covered
                .iter()
                .flatten()
                .take(MAX_LISTED_NODES)
                .cloned()
                .collect(),
            overlaps: self
                .overlaps
                .iter()
                .map(|(policy, nodes)| Overlap {
                    policy: policy.clone(),
                    nodes: nodes.iter().take(MAX_LISTED_NODES).cloned().collect(),
                })
                .collect(),
            readiness: previous.and_then(|p| p.readiness.clone()),
        }
    }
}

impl ConfigStatus {
    /// The `Accepted` condition's status and reason, if the status has one.
    pub fn accepted(&self) -> Option<(&str, &str)> {
        self.conditions
            .iter()
            .find(|c| c.type_ == ACCEPTED)
            .map(|c| (c.status.as_str(), c.reason.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn transition_time_is_kept_while_status_and_reason_hold() {
        let v = Verdict {
            reason: Reason::Invalid,
            message: "1 problem".into(),
            problems: vec!["p".into()],
            covered: Some(vec!["m0".into()]),
            overlaps: BTreeMap::new(),
        };
        let first = v.to_status(Some(1), None, at(10));
        let again = v.to_status(Some(2), Some(&first), at(20));
        assert_eq!(again.conditions[0].last_transition_time, at(10));
        assert_eq!(again.observed_generation, Some(2));
        let fixed = Verdict {
            reason: Reason::Valid,
            ..v
        }
        .to_status(Some(3), Some(&again), at(30));
        assert_eq!(fixed.conditions[0].last_transition_time, at(30));
        assert_eq!(fixed.accepted(), Some(("True", "Valid")));
        assert_eq!(fixed.covered_node_count, Some(1));
    }
}
