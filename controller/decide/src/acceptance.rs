//! Whether the controller accepts each `FencingPolicy` and `FenceTarget`, decided from the
//! objects and the Node list alone, so the controller can report it as soon as they change.
//!
//! Guarantees: the rules are the ones [`crate::decide`] applies when a node goes silent (the
//! same `validate()` functions, the same selector matching), so a policy or target reported
//! accepted is one a silent node's decision will use, and one reported not accepted is one it
//! will hold on (`InvalidPolicy`, `ConflictingPolicies`, `InvalidFenceTarget`).

use std::collections::{BTreeMap, BTreeSet};

use palisade_model::acceptance::{Reason, Verdict};
use palisade_model::target::{FenceTargetSpec, TargetError};

use crate::selector;
use crate::snapshot::PolicySnapshot;

/// A node as policies see it: its name and labels.
#[derive(Debug, Clone)]
pub struct NodeLabels {
    /// The node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// The verdict for every policy, by name.
pub fn policies(policies: &[PolicySnapshot], nodes: &[NodeLabels]) -> BTreeMap<String, Verdict> {
    let covered: BTreeMap<&str, Vec<String>> = policies
        .iter()
        .map(|p| {
            let mut names: Vec<String> = nodes
                .iter()
                .filter(|n| selector::matches(&p.spec.node_selector, &n.labels))
                .map(|n| n.name.clone())
                .collect();
            names.sort();
            (p.name.as_str(), names)
        })
        .collect();
    policies
        .iter()
        .map(|p| {
            let mine: BTreeSet<&String> = covered[p.name.as_str()].iter().collect();
            let overlaps: BTreeMap<String, Vec<String>> = covered
                .iter()
                .filter(|(other, _)| **other != p.name)
                .filter_map(|(other, theirs)| {
                    let both: Vec<String> =
                        theirs.iter().filter(|n| mine.contains(n)).cloned().collect();
                    (!both.is_empty()).then(|| (other.to_string(), both))
                })
                .collect();
            let problems: Vec<String> = match p.spec.validate() {
                Ok(()) => Vec::new(),
                Err(errors) => errors.iter().map(ToString::to_string).collect(),
            };
            let count = mine.len();
            let (reason, message) = if !problems.is_empty() {
                (
                    Reason::Invalid,
                    format!(
                        "{} problem(s), the nodes it selects are held (InvalidPolicy): {}",
                        problems.len(),
                        problems[0]
                    ),
                )
            } else if !overlaps.is_empty() {
                let nodes: BTreeSet<&String> = overlaps.values().flatten().collect();
                (
                    Reason::Conflict,
                    format!(
                        "{} node(s) are also selected by {}; they are held (ConflictingPolicies) until only one policy selects them",
                        nodes.len(),
                        overlaps.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                )
            } else {
                (Reason::Valid, format!("in force for {count} node(s)"))
            };
            (
                p.name.clone(),
                Verdict {
                    reason,
                    message,
                    problems,
                    covered: Some(covered[p.name.as_str()].clone()),
                    overlaps,
                },
            )
        })
        .collect()
}

/// The verdict for one `FenceTarget`.
pub fn target(spec: &FenceTargetSpec) -> Verdict {
    let errors = spec.validate().err().unwrap_or_default();
    let problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let (reason, message) = if errors
        .iter()
        .any(|e| matches!(e, TargetError::CredentialsInUrl { .. }))
    {
        (
            Reason::CredentialsInUrl,
            "a device URL carries credentials: this target is never used for fencing; move them to a Secret and remove them from the URL".to_string(),
        )
    } else if let Some(first) = problems.first() {
        (
            Reason::Invalid,
            format!(
                "{} problem(s), the node is held (InvalidFenceTarget): {first}",
                problems.len()
            ),
        )
    } else {
        (
            Reason::Valid,
            format!("{} level(s) ready to use", spec.levels.len()),
        )
    };
    Verdict {
        reason,
        message,
        problems,
        covered: None,
        overlaps: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_model::policy::FencingPolicySpec;

    fn node(name: &str, zone: &str) -> NodeLabels {
        NodeLabels {
            name: name.into(),
            labels: [("zone".to_string(), zone.to_string())].into(),
        }
    }

    fn policy(name: &str, spec: serde_json::Value) -> PolicySnapshot {
        PolicySnapshot {
            name: name.into(),
            spec: serde_json::from_value::<FencingPolicySpec>(spec).unwrap(),
        }
    }

    #[test]
    fn policies_report_problems_overlaps_and_coverage() {
        let nodes = [node("m0", "a"), node("m1", "a"), node("m2", "b")];
        let out = policies(
            &[
                policy("all", serde_json::json!({})),
                policy(
                    "zone-b",
                    serde_json::json!({"nodeSelector": {"matchLabels": {"zone": "b"}}}),
                ),
                policy(
                    "bad",
                    serde_json::json!({
                        "nodeSelector": {"matchLabels": {"zone": "none"}},
                        "limits": {"maxUnhealthy": "250%"},
                        "detection": {"suspectAfterSeconds": 50, "unhealthyAfterSeconds": 10}
                    }),
                ),
                policy(
                    "zone-c",
                    serde_json::json!({"nodeSelector": {"matchLabels": {"zone": "c"}}}),
                ),
            ],
            &nodes,
        );
        let all = &out["all"];
        assert_eq!(all.reason, Reason::Conflict);
        assert_eq!(all.overlaps["zone-b"], vec!["m2".to_string()]);
        assert_eq!(all.covered.as_ref().unwrap().len(), 3);
        assert_eq!(out["zone-b"].reason, Reason::Conflict);
        assert_eq!(out["zone-b"].overlaps["all"], vec!["m2".to_string()]);
        let bad = &out["bad"];
        assert_eq!(bad.reason, Reason::Invalid);
        assert_eq!(bad.problems.len(), 2, "{:?}", bad.problems);
        assert!(bad.problems.iter().any(|p| p.contains("250%")));
        assert!(bad.problems.iter().any(|p| p.contains("must exceed")));
        let c = &out["zone-c"];
        assert_eq!(c.reason, Reason::Valid);
        assert_eq!(c.message, "in force for 0 node(s)");
    }

    #[test]
    fn targets_with_credentials_in_urls_are_refused_without_echoing_them() {
        let spec: FenceTargetSpec = serde_json::from_value(serde_json::json!({
            "levels": [{"devices": [{"url": "ipmi://admin:hunter2@127.0.0.1:623", "kind": "Power",
              "credentialsSecretRef": {"name": "b", "namespace": "n"}}]}]
        }))
        .unwrap();
        let v = target(&spec);
        assert_eq!(v.reason, Reason::CredentialsInUrl);
        let shown = format!("{v:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let ok: FenceTargetSpec = serde_json::from_value(serde_json::json!({
            "levels": [{"devices": [{"url": "bridge://127.0.0.1:9443/m0", "kind": "Power"}]}]
        }))
        .unwrap();
        assert_eq!(target(&ok).reason, Reason::Valid);
    }
}
