//! CEL validation rules (`x-kubernetes-validations`) for API servers that evaluate them
//! (Kubernetes 1.25 and later).
//!
//! The same cross-field rules live in three places, deliberately: `validate()` on each spec
//! (the source of truth, run by the controller on every object it reads and by the admission
//! webhook), the webhook (optional), and these CEL rules (the API server, at the door, without
//! the webhook). The CEL text is a translation of `validate()`. The tables of objects in
//! `cel_cases` (feature `test-cases`) prove it twice: `tests/cel.rs` evaluates every rule with
//! a CEL interpreter, and `tests/e2e-controller/tests/cel_server.rs` applies the CRDs to a real
//! Kubernetes 1.34 API server and sends it every object; both check that the rules refuse
//! exactly what `validate()` refuses, for the same reason (the rule's message).
//!
//! *Assumptions:* a 1.20–1.24 API server does not know `x-kubernetes-validations` (its
//! server-side apply rejects the whole CRD), so [`crate::crds_for`] emits these rules only for
//! 1.25 and later. CEL's regular expressions are RE2; the patterns below use nothing beyond
//! what RE2 and Rust's `regex` both accept (a 1.34 server compiles every one and agrees with
//! the interpreter on every case).
//!
//! *Guarantees:* never weaker than nothing: a rule only refuses; an object these rules pass is
//! still checked by `validate()` before the controller acts on it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, ValidationRule,
};

/// One CEL rule, attached to the schema node at `path` of the CRD for `kind`.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The resource kind (`FencingPolicy`, `FenceTarget`, `NodeFence`).
    pub kind: &'static str,
    /// Property names from the root of the object; `"[]"` steps into a list's items.
    pub path: &'static [&'static str],
    /// The CEL expression; `self` is the value at `path` (and `oldSelf` its previous value,
    /// for transition rules).
    pub rule: &'static str,
    /// What the API server answers when the rule is false.
    pub message: &'static str,
}

/// Bounds (`maxItems`) on the lists the rules iterate over, as (kind, path, maxItems).
///
/// The API server estimates a rule's cost from the largest list the schema allows and refuses
/// a CRD whose estimate is over its budget. What the real server taught: Kubernetes 1.34
/// accepts these rules even without the bounds (the selector rule costs a constant per
/// requirement, and the request size caps the list), tried against the lab's server. They stay
/// as limits no selector needs to exceed, and as a margin for the 1.25–1.33 estimators, which
/// the lab does not run.
pub const LIST_BOUNDS: &[(&str, &[&str], i64)] = &[
    (
        "FencingPolicy",
        &["spec", "nodeSelector", "matchExpressions"],
        64,
    ),
    (
        "FencingPolicy",
        &["spec", "nodeSelector", "matchExpressions", "[]", "values"],
        256,
    ),
];

/// Every CEL rule Palisade emits for 1.25+ API servers.
pub const RULES: &[Rule] = &[
    Rule {
        kind: "FencingPolicy",
        path: &["spec", "detection"],
        rule: "self.unhealthyAfterSeconds > self.suspectAfterSeconds",
        message: "detection.unhealthyAfterSeconds must exceed detection.suspectAfterSeconds",
    },
    Rule {
        kind: "FencingPolicy",
        path: &["spec", "escalation"],
        rule: "self.windowSeconds >= self.cooldownSeconds",
        message: "escalation.windowSeconds must be at least escalation.cooldownSeconds",
    },
    Rule {
        kind: "FencingPolicy",
        path: &["spec", "limits", "perDomain"],
        rule: r"self.topologyKey.matches('\\S')",
        message: "limits.perDomain.topologyKey must not be empty",
    },
    Rule {
        kind: "FencingPolicy",
        path: &["spec", "nodeSelector"],
        rule: "!has(self.matchExpressions) || self.matchExpressions.all(r, size(r.key) > 0 && \
               ((r.operator == 'In' || r.operator == 'NotIn') ? (has(r.values) && size(r.values) > 0) : \
               ((r.operator == 'Exists' || r.operator == 'DoesNotExist') && (!has(r.values) || size(r.values) == 0))))",
        message: "nodeSelector.matchExpressions: every key is non-empty; In/NotIn need values; \
                  Exists/DoesNotExist take none; no other operator",
    },
    Rule {
        kind: "FenceTarget",
        path: &["spec", "levels", "[]", "devices", "[]"],
        rule: "self.url.startsWith('bridge://') ? !has(self.credentialsSecretRef) : has(self.credentialsSecretRef)",
        message: "bridge:// devices take no credentialsSecretRef (the bridge holds them); direct devices need one",
    },
    Rule {
        kind: "FenceTarget",
        path: &["spec", "levels", "[]", "devices", "[]"],
        rule: r"!self.url.matches('^(ipmi|snmp\\+pdu|redfish\\+https)://') || self.kind == 'Power'",
        message: "ipmi, snmp+pdu and redfish+https devices are of kind Power",
    },
    Rule {
        kind: "FenceTarget",
        path: &["spec", "levels", "[]", "devices", "[]"],
        rule: "!self.url.startsWith('storagefw+https://') || self.kind == 'Storage'",
        message: "storagefw+https devices are of kind Storage",
    },
    Rule {
        kind: "FenceTarget",
        path: &["spec", "levels", "[]", "devices", "[]"],
        rule: r"!self.url.startsWith('bridge://') || self.url.matches('^bridge://(\\[[^\\]/@]+\\]|[A-Za-z0-9.-]+):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])/[A-Za-z0-9._-]+$')",
        message: "a bridge device is bridge://<host>:<port>/<target-id>",
    },
    Rule {
        kind: "FenceTarget",
        path: &["spec", "levels", "[]", "devices", "[]"],
        rule: "self.kind != 'Storage' || (has(self.fences) && ((has(self.fences.storageClasses) && size(self.fences.storageClasses) > 0) || (has(self.fences.csiDrivers) && size(self.fences.csiDrivers) > 0)))",
        message: "a Storage device must name what it fences (fences.storageClasses or fences.csiDrivers)",
    },
    Rule {
        kind: "FenceTarget",
        path: &["spec", "levels", "[]", "devices", "[]"],
        rule: "self.kind != 'Power' || !has(self.fences)",
        message: "fences is for Storage devices: a power device fences the whole machine",
    },
    Rule {
        kind: "FenceTarget",
        path: &["spec", "levels", "[]", "devices", "[]"],
        rule: r"!self.url.matches('^[a-z+]+://[^/]*@') || self.url.matches('^(ipmi|redfish\\+https)://') || (self.url.startsWith('snmp+pdu://') && self.url.matches('[?&]version=3(&|$)'))",
        message: "only ipmi, redfish+https and SNMPv3 PDU URLs may name a user; credentials belong in the Secret named by credentialsSecretRef",
    },
    Rule {
        kind: "FenceTarget",
        path: &["spec", "levels", "[]"],
        rule: "!has(self.powerOff) || self.powerOff != 'Disallowed' || self.devices.exists(d, d.kind == 'Storage')",
        message: "a powerOff: Disallowed level needs a Storage device (a reset proves nothing; only a verified storage block can)",
    },
    Rule {
        kind: "FenceTarget",
        path: &["spec", "levels", "[]"],
        rule: r"!has(self.powerOff) || self.powerOff != 'Disallowed' || self.devices.all(d, d.kind != 'Power' || d.url.matches('^(ipmi|redfish\\+https)://'))",
        message: "a powerOff: Disallowed level restarts through direct ipmi:// or redfish+https:// BMCs only",
    },
    Rule {
        kind: "NodeFence",
        path: &["spec"],
        rule: "self == oldSelf",
        message: "a NodeFence's spec cannot change; cancel it and request another",
    },
];

/// Adds [`RULES`] and [`LIST_BOUNDS`] to `crd`'s schema (every version).
///
/// Panics if a rule names a path the schema does not have: the rules and the types are
/// compiled together, so that is a programming error, caught by the model's tests.
pub fn add_rules(crd: &mut CustomResourceDefinition) {
    let kind = crd.spec.names.kind.clone();
    for version in &mut crd.spec.versions {
        let Some(root) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        for (k, path, max) in LIST_BOUNDS {
            if *k == kind {
                node(root, path, &kind).max_items = Some(*max);
            }
        }
        for rule in RULES.iter().filter(|r| r.kind == kind) {
            node(root, rule.path, &kind)
                .x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(ValidationRule {
                    rule: rule.rule.to_string(),
                    message: Some(rule.message.to_string()),
                    ..ValidationRule::default()
                });
        }
    }
}

fn node<'a>(mut at: &'a mut JSONSchemaProps, path: &[&str], kind: &str) -> &'a mut JSONSchemaProps {
    for step in path {
        at = if *step == "[]" {
            match at.items.as_mut() {
                Some(JSONSchemaPropsOrArray::Schema(s)) => s,
                _ => panic!("{kind}: no list items at {path:?}"),
            }
        } else {
            at.properties
                .as_mut()
                .and_then(|p| p.get_mut(*step))
                .unwrap_or_else(|| panic!("{kind}: no property {step} on the path {path:?}"))
        };
    }
    at
}
