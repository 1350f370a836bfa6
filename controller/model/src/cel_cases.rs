//! The tables of objects that prove the [`crate::cel`] rules, shared by the two tests that
//! evaluate them: `controller/model/tests/cel.rs` (a CEL interpreter, in milliseconds) and
//! `tests/e2e-controller/tests/cel_server.rs` (a real 1.34 API server).
//!
//! Each [`Case`] is an object (and, for a transition rule, the stored object it replaces) with
//! the rule messages the server must answer. For policies and targets the expectation is
//! derived from what `validate()` refuses ([`Case::from_validate`]), so "the rules refuse
//! exactly what `validate()` refuses, for the same reason" is what both tests check.
//!
//! Compiled only with the `test-cases` feature, which no binary enables: test data, kept off
//! product paths.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use serde_json::{json, Value};

use crate::cel::RULES;
use crate::policy::PolicyError;
use crate::target::{
    DeviceKind, FenceDevice, FenceLevel, PowerOff, SecretRef, StorageScope, TargetError,
};
use crate::{FenceTargetSpec, FencingPolicySpec, NodeFenceSpec};

/// One object to admit or refuse.
#[derive(Debug, Clone)]
pub struct Case {
    /// What the case is (unique across [`all`]).
    pub name: String,
    /// The resource kind (`FencingPolicy`, `FenceTarget`, `NodeFence`).
    pub kind: &'static str,
    /// The object, `{"spec": …}`: every defaulted field serialized, as the API server stores it.
    pub object: Value,
    /// On an update, the stored object it replaces (transition rules run only then).
    pub old: Option<Value>,
    /// What the rules must answer.
    pub expect: Expect,
    /// What `validate()` said, for failure messages (empty for NodeFences).
    pub validate: Vec<String>,
}

/// What the rules must answer for a [`Case`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// The rules refuse with exactly these messages; none: the object is admitted.
    Exactly(BTreeSet<&'static str>),
    /// `validate()` stops at a URL that carries credentials (it must not parse it further); the
    /// rules check everything, so they refuse with at least this message.
    AtLeast(&'static str),
}

impl Expect {
    /// Whether `refused` (the messages of the rules that refused) is what is expected.
    pub fn agrees(&self, refused: &BTreeSet<&'static str>) -> bool {
        match self {
            Expect::Exactly(messages) => refused == messages,
            Expect::AtLeast(message) => refused.contains(message),
        }
    }

    /// Whether the object is expected to be admitted.
    pub fn admits(&self) -> bool {
        matches!(self, Expect::Exactly(m) if m.is_empty())
    }
}

impl Case {
    /// A case whose expectation is what `validate()` refuses, translated to rule messages by
    /// `message_for` (`None`: no CEL rule says it, so the rules need not refuse it).
    fn from_validate<E: std::fmt::Display>(
        name: String,
        kind: &'static str,
        spec: &impl serde::Serialize,
        errors: Vec<E>,
        message_for: impl Fn(&E) -> Option<&'static str>,
        stops_early: impl Fn(&E) -> bool,
    ) -> Case {
        let expect = match errors.iter().find(|e| stops_early(e)) {
            Some(e) => Expect::AtLeast(message_for(e).expect("an early stop has a rule")),
            None => Expect::Exactly(errors.iter().filter_map(&message_for).collect()),
        };
        Case {
            name,
            kind,
            object: json!({ "spec": spec }),
            old: None,
            expect,
            validate: errors.iter().map(ToString::to_string).collect(),
        }
    }
}

/// The message of the one `kind` rule whose message contains `needle`.
///
/// Panics if none or several do: the tables name rules by their messages.
pub fn message_of(kind: &str, needle: &str) -> &'static str {
    let mut found = RULES
        .iter()
        .filter(|r| r.kind == kind && r.message.contains(needle));
    let rule = found
        .next()
        .unwrap_or_else(|| panic!("no {kind} rule says {needle:?}"));
    assert!(
        found.next().is_none(),
        "several {kind} rules say {needle:?}"
    );
    rule.message
}

/// Every case of every table.
pub fn all() -> Vec<Case> {
    [
        policies(),
        devices(),
        levels(),
        storage_scopes(),
        node_fences(),
    ]
    .concat()
}

fn policy_message_for(e: &PolicyError) -> Option<&'static str> {
    let needle = match e {
        PolicyError::ThresholdsOutOfOrder { .. } => "unhealthyAfterSeconds",
        PolicyError::WindowShorterThanCooldown { .. } => "windowSeconds",
        PolicyError::EmptyTopologyKey => "topologyKey",
        PolicyError::BadSelector { .. } => "matchExpressions",
        _ => return None,
    };
    Some(message_of("FencingPolicy", needle))
}

fn policy(name: &str, edit: impl FnOnce(&mut FencingPolicySpec)) -> Case {
    let mut spec = FencingPolicySpec::default();
    edit(&mut spec);
    let errors = spec.validate().err().unwrap_or_default();
    Case::from_validate(
        format!("policy: {name}"),
        "FencingPolicy",
        &spec,
        errors,
        policy_message_for,
        |_| false,
    )
}

fn requirement(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
    }
}

fn selector(name: &str, reqs: Vec<LabelSelectorRequirement>) -> Case {
    policy(name, |s| s.node_selector.match_expressions = Some(reqs))
}

fn thresholds(name: &str, suspect: i64, unhealthy: i64) -> Case {
    policy(name, |s| {
        s.detection.suspect_after_seconds = suspect;
        s.detection.unhealthy_after_seconds = unhealthy;
    })
}

fn escalation(name: &str, window: i64, cooldown: i64) -> Case {
    policy(name, |s| {
        s.escalation.window_seconds = window;
        s.escalation.cooldown_seconds = cooldown;
    })
}

/// FencingPolicies: threshold order, escalation window, topology key, node selector.
pub fn policies() -> Vec<Case> {
    vec![
        policy("defaults", |_| {}),
        thresholds("suspect 50 > unhealthy 10", 50, 10),
        thresholds("suspect == unhealthy", 20, 20),
        escalation("window shorter than cooldown", 60, 600),
        escalation("window equal to cooldown", 600, 600),
        policy("blank topology key", |s| {
            s.limits.per_domain.topology_key = "  ".into()
        }),
        selector("In without values", vec![requirement("rack", "In", None)]),
        selector(
            "NotIn with empty values",
            vec![requirement("rack", "NotIn", Some(&[]))],
        ),
        selector(
            "Exists with values",
            vec![requirement("rack", "Exists", Some(&["a"]))],
        ),
        selector(
            "unknown operator",
            vec![requirement("rack", "Gt", Some(&["1"]))],
        ),
        selector("empty key", vec![requirement("", "Exists", None)]),
        selector(
            "a good selector after a bad one",
            vec![
                requirement("rack", "In", Some(&["r1"])),
                requirement("zone", "DoesNotExist", None),
            ],
        ),
    ]
}

/// The rule message that stands for a `validate()` error on a target, if CEL covers it.
fn target_message_for(e: &TargetError) -> Option<&'static str> {
    let needle = match e {
        TargetError::Credentials { .. } => "take no credentialsSecretRef",
        TargetError::KindMismatch { kind, .. } => match kind {
            DeviceKind::Power => "of kind Storage",
            DeviceKind::Storage => "of kind Power",
        },
        TargetError::BridgeUrl { .. } => "bridge://<host>",
        TargetError::CredentialsInUrl { .. } => "may name a user",
        TargetError::NoStorageToReset { .. } => "needs a Storage device",
        TargetError::CannotReset { .. } => "restarts through direct",
        TargetError::StorageScope { problem, .. } if problem.starts_with("a Storage device") => {
            "must name what it fences"
        }
        TargetError::StorageScope { .. } => "fences is for Storage",
        _ => return None,
    };
    Some(message_of("FenceTarget", needle))
}

fn target(name: String, levels: Vec<FenceLevel>) -> Case {
    let spec = FenceTargetSpec { levels };
    let errors = spec.validate().err().unwrap_or_default();
    Case::from_validate(
        name,
        "FenceTarget",
        &spec,
        errors,
        target_message_for,
        |e| matches!(e, TargetError::CredentialsInUrl { .. }),
    )
}

fn secret() -> SecretRef {
    SecretRef {
        name: "bmc".into(),
        namespace: "palisade-system".into(),
        keys: Default::default(),
    }
}

fn scope(classes: &[&str], drivers: &[&str]) -> StorageScope {
    StorageScope {
        storage_classes: classes.iter().map(|c| c.to_string()).collect(),
        csi_drivers: drivers.iter().map(|c| c.to_string()).collect(),
    }
}

/// A device with the Secret a direct device needs (none for a bridge) and, for storage, a
/// class to fence.
fn device(url: &str, kind: DeviceKind) -> FenceDevice {
    FenceDevice {
        url: url.into(),
        kind,
        credentials_secret_ref: (!url.starts_with("bridge://")).then(secret),
        timeout_seconds: 20,
        fences: (kind == DeviceKind::Storage).then(|| scope(&["fast"], &[])),
    }
}

fn level(devices: Vec<FenceDevice>, power_off: PowerOff) -> FenceLevel {
    FenceLevel {
        name: "l".into(),
        devices,
        power_off,
    }
}

/// Device URLs of every scheme, with and without a user, and bridge URLs of every shape; each
/// passes the schema's URL pattern, so only the rules decide.
pub const DEVICE_URLS: &[&str] = &[
    "ipmi://10.0.0.1:623",
    "ipmi://admin@10.0.0.1:623",
    "redfish+https://bmc.example:443/redfish/v1/Systems/1",
    "redfish+https://admin@bmc.example",
    "snmp+pdu://10.0.0.2:161/4",
    "snmp+pdu://public@10.0.0.2:161/4",
    "snmp+pdu://ops@10.0.0.2:161/4?version=3",
    "storagefw+https://array.example:8443/hosts/m0",
    "storagefw+https://user@array.example:8443/hosts/m0",
    "bridge://bridge.palisade-system:8443/m0-ipmi",
    "bridge://[fd00::1]:8443/m0",
    "bridge://bridge:0/m0",
    "bridge://bridge:65536/m0",
    "bridge://bridge/m0",
    "bridge://bridge:8443/",
    "bridge://bridge:8443/m0/extra",
    "bridge://ops@bridge:8443/m0",
];

/// One device per case: every URL of [`DEVICE_URLS`] × both kinds × with and without a Secret.
pub fn devices() -> Vec<Case> {
    let mut cases = Vec::new();
    for url in DEVICE_URLS {
        for kind in [DeviceKind::Power, DeviceKind::Storage] {
            for creds in [None, Some(secret())] {
                let name = format!("device: {url} {kind:?} secret={}", creds.is_some());
                let device = FenceDevice {
                    credentials_secret_ref: creds,
                    ..device(url, kind)
                };
                cases.push(target(name, vec![level(vec![device], PowerOff::Allowed)]));
            }
        }
    }
    cases
}

/// Levels of hosts that must not power off (`powerOff: Disallowed`) and the same devices with
/// power off allowed.
pub fn levels() -> Vec<Case> {
    let storage = || device("storagefw+https://fw:8443/nodes/m0", DeviceKind::Storage);
    let sets = [
        vec![storage(), device("ipmi://bmc:623", DeviceKind::Power)],
        vec![storage(), device("redfish+https://bmc", DeviceKind::Power)],
        vec![storage()],
        vec![device("bridge://b:8443/m0", DeviceKind::Storage)],
        vec![device("ipmi://bmc:623", DeviceKind::Power)],
        vec![storage(), device("snmp+pdu://pdu:161/4", DeviceKind::Power)],
        vec![storage(), device("bridge://b:8443/m0", DeviceKind::Power)],
        vec![device("snmp+pdu://pdu:161/4", DeviceKind::Power)],
    ];
    let mut cases = Vec::new();
    for devices in sets {
        for power_off in [PowerOff::Allowed, PowerOff::Disallowed] {
            let urls: Vec<&str> = devices.iter().map(|d| d.url.as_str()).collect();
            let name = format!("level: {power_off:?} {urls:?}");
            cases.push(target(name, vec![level(devices.clone(), power_off)]));
        }
    }
    cases
}

/// What a storage device fences, and power devices that name it anyway.
pub fn storage_scopes() -> Vec<Case> {
    let fw = "storagefw+https://fw:8443/nodes/m0";
    let cases = [
        (fw, DeviceKind::Storage, None),
        (fw, DeviceKind::Storage, Some(scope(&[], &[]))),
        (fw, DeviceKind::Storage, Some(scope(&[""], &[]))),
        (fw, DeviceKind::Storage, Some(scope(&[], &["csi.x"]))),
        ("bridge://b:8443/m0", DeviceKind::Storage, None),
        (
            "bridge://b:8443/m0",
            DeviceKind::Storage,
            Some(scope(&["fast"], &[])),
        ),
        ("ipmi://bmc:623", DeviceKind::Power, None),
        (
            "ipmi://bmc:623",
            DeviceKind::Power,
            Some(scope(&["fast"], &[])),
        ),
        (
            "bridge://b:8443/m0",
            DeviceKind::Power,
            Some(scope(&[], &[])),
        ),
    ];
    cases
        .into_iter()
        .map(|(url, kind, fences)| {
            let name = format!("scope: {url} {kind:?} {fences:?}");
            let device = FenceDevice {
                fences,
                ..device(url, kind)
            };
            target(name, vec![level(vec![device], PowerOff::Allowed)])
        })
        .collect()
}

/// A NodeFence created, updated with the same spec, and updated with another node or reason.
pub fn node_fences() -> Vec<Case> {
    let spec: NodeFenceSpec = serde_json::from_value(json!({ "nodeName": "m0", "reason": "test" }))
        .expect("a NodeFence spec");
    let object = json!({ "spec": spec });
    let fixed = message_of("NodeFence", "cannot change");
    let case = |name: &str, new: Value, old: Option<&Value>, refused: &[&'static str]| Case {
        name: format!("fence: {name}"),
        kind: "NodeFence",
        object: new,
        old: old.cloned(),
        expect: Expect::Exactly(refused.iter().copied().collect()),
        validate: Vec::new(),
    };
    let mut moved = object.clone();
    moved["spec"]["nodeName"] = json!("m1");
    let mut reasoned = object.clone();
    reasoned["spec"]["reason"] = json!("other");
    vec![
        case("create", object.clone(), None, &[]),
        case("same spec", object.clone(), Some(&object), &[]),
        case("another node", moved, Some(&object), &[fixed]),
        case("another reason", reasoned, Some(&object), &[fixed]),
    ]
}
