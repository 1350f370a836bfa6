//! Whether the controller accepts each `FencingPolicy` and `FenceTarget`, decided from the
//! objects and the Node list alone, so the controller can report it as soon as they change.
//!
//! Guarantees: the rules are the ones [`crate::decide()`] applies when a node goes silent (the
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

/// Admission of a `FencingPolicy` (create or update): every problem `validate()` finds.
pub fn admit_policy(spec: &palisade_model::policy::FencingPolicySpec) -> Result<(), Vec<String>> {
    spec.validate()
        .map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

/// Admission of a `FenceTarget` (create or update): every problem `validate()` finds, with
/// any credentials in a URL redacted.
pub fn admit_target(spec: &FenceTargetSpec) -> Result<(), Vec<String>> {
    spec.validate()
        .map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

/// Admission of a new `NodeFence`: the node must exist and have no unfinished fence.
///
/// `node_exists` and `active` (the names of unfinished fences for the same node) come from the
/// controller's caches, which may lag the API by a moment; a second fence that slips through
/// is still caught when it runs (the younger of two is `Superseded`).
pub fn admit_fence_create(
    spec: &palisade_model::NodeFenceSpec,
    node_exists: bool,
    active: &[String],
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    if spec.node_name.trim().is_empty() {
        problems.push("spec.nodeName must name a node".to_string());
    } else if !node_exists {
        problems.push(format!("no Node named {:?} exists", spec.node_name));
    }
    if let Some(first) = active.first() {
        problems.push(format!(
            "node {:?} already has an unfinished NodeFence ({first}); watch that one, or delete it first",
            spec.node_name
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Admission of an edited `NodeFence`: its spec is a request and never changes once made
/// (delete it and create another); status updates are not reviewed.
pub fn admit_fence_update(
    old: &palisade_model::NodeFenceSpec,
    new: &palisade_model::NodeFenceSpec,
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    if old.node_name != new.node_name {
        problems.push(format!(
            "spec.nodeName is immutable (was {:?}, now {:?})",
            old.node_name, new.node_name
        ));
    }
    if old.reason != new.reason {
        problems.push(
            "spec.reason is immutable (the record of why the fence was asked for)".to_string(),
        );
    }
    if old.requested_by != new.requested_by {
        problems.push("spec.requestedBy is immutable".to_string());
    }
    if old.overrides != new.overrides {
        problems.push(
            "spec.overrides is immutable: a request's guards cannot change while it runs"
                .to_string(),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
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
            guard_held_at: None,
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
    fn fences_are_admitted_only_for_existing_nodes_without_another_and_never_edited() {
        let spec: palisade_model::NodeFenceSpec = serde_json::from_value(serde_json::json!({
            "nodeName": "m0", "reason": "test"
        }))
        .unwrap();
        assert_eq!(admit_fence_create(&spec, true, &[]), Ok(()));
        let missing = admit_fence_create(&spec, false, &[]).unwrap_err();
        assert!(missing[0].contains("no Node named"), "{missing:?}");
        let second = admit_fence_create(&spec, true, &["m0-abc".into()]).unwrap_err();
        assert!(second[0].contains("m0-abc"), "{second:?}");
        let mut edited = spec.clone();
        assert_eq!(admit_fence_update(&spec, &edited), Ok(()));
        edited.node_name = "m1".into();
        edited.overrides.quorum_guard = true;
        assert_eq!(admit_fence_update(&spec, &edited).unwrap_err().len(), 2);
        // Every field is fixed, as the CRD's CEL rule (`self == oldSelf`) says on 1.25+.
        let mut reason = spec.clone();
        reason.reason = "another story".into();
        let err = admit_fence_update(&spec, &reason).unwrap_err();
        assert!(err[0].contains("spec.reason is immutable"), "{err:?}");
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
