//! The CEL rules emitted for 1.25+ API servers, evaluated by a CEL interpreter: each refuses
//! exactly what `validate()` refuses for the same reason, and passes what it accepts.
//!
//! No 1.25+ API server runs here (the lab builds Kubernetes 1.20 from Debian's sources), so
//! the rules are evaluated by the `cel` crate with Kubernetes' conventions: `self` is the value
//! at the rule's schema node, integers are `int`, absent optional fields fail `has()`, defaults
//! are applied first (the typed objects below serialize every defaulted field), and transition
//! rules (`oldSelf`) run on updates only.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use cel::{Context, Program, Value as Cel};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use palisade_model::cel::{Rule, RULES};
use palisade_model::policy::PolicyError;
use palisade_model::target::{
    DeviceKind, FenceDevice, FenceLevel, PowerOff, SecretRef, StorageScope, TargetError,
};
use palisade_model::{FenceTargetSpec, FencingPolicySpec, NodeFenceSpec};
use serde_json::{json, Value};

fn to_cel(v: &Value) -> Cel {
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => n
            .as_i64()
            .map_or_else(|| Cel::Float(n.as_f64().unwrap()), Cel::Int),
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(a) => a.iter().map(to_cel).collect::<Vec<_>>().into(),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| (k.clone(), to_cel(v)))
            .collect::<HashMap<_, _>>()
            .into(),
    }
}

/// The values at `path` (every element where a step is `"[]"`); none if the path is absent.
fn at<'a>(v: &'a Value, path: &[&str]) -> Vec<&'a Value> {
    let Some((step, rest)) = path.split_first() else {
        return vec![v];
    };
    match *step {
        "[]" => v
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|e| at(e, rest))
            .collect(),
        name => v.get(name).map(|e| at(e, rest)).unwrap_or_default(),
    }
}

fn holds(rule: &Rule, value: &Value, old: Option<&Value>) -> bool {
    let program = Program::compile(rule.rule)
        .unwrap_or_else(|e| panic!("{} {:?}: {}: {e:?}", rule.kind, rule.path, rule.rule));
    let mut ctx = Context::default();
    ctx.add_variable_from_value("self", to_cel(value));
    if let Some(old) = old {
        ctx.add_variable_from_value("oldSelf", to_cel(old));
    }
    match program.execute(&ctx) {
        Ok(Cel::Bool(b)) => b,
        other => panic!("{}: {} on {value} gave {other:?}", rule.kind, rule.rule),
    }
}

/// The messages of the rules `object` (of `kind`) breaks; `old` is the stored object on an
/// update (transition rules run only then, and only where both have the value).
fn refused(kind: &str, object: &Value, old: Option<&Value>) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    for rule in RULES.iter().filter(|r| r.kind == kind) {
        let transition = rule.rule.contains("oldSelf");
        let news = at(object, rule.path);
        let olds = old.map(|o| at(o, rule.path)).unwrap_or_default();
        for (i, value) in news.iter().enumerate() {
            let old_value = if transition {
                match olds.get(i) {
                    Some(o) => Some(*o),
                    None => continue,
                }
            } else {
                None
            };
            if !holds(rule, value, old_value) {
                out.insert(rule.message);
            }
        }
    }
    out
}

fn message_of(kind: &str, needle: &str) -> &'static str {
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

#[test]
fn every_rule_compiles_and_sits_on_a_node_the_schema_has() {
    for rule in RULES {
        Program::compile(rule.rule).unwrap_or_else(|e| panic!("{}: {e:?}", rule.rule));
    }
    // add_rules panics on a path the schema lacks.
    let crds = palisade_model::crds_for(palisade_model::CEL_MINOR);
    assert_eq!(crds.len(), 3);
}

fn policy(edit: impl FnOnce(&mut FencingPolicySpec)) -> FencingPolicySpec {
    let mut spec = FencingPolicySpec::default();
    edit(&mut spec);
    spec
}

fn requirement(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
    }
}

fn with_selector(reqs: Vec<LabelSelectorRequirement>) -> FencingPolicySpec {
    policy(|s| s.node_selector.match_expressions = Some(reqs))
}

#[test]
fn policy_rules_refuse_what_validate_refuses_for_the_same_reason() {
    let order = message_of("FencingPolicy", "unhealthyAfterSeconds");
    let window = message_of("FencingPolicy", "windowSeconds");
    let topology = message_of("FencingPolicy", "topologyKey");
    let selector = message_of("FencingPolicy", "matchExpressions");
    type Check = fn(&PolicyError) -> bool;
    type Expect = Option<(&'static str, Check)>;
    let cases: Vec<(&str, FencingPolicySpec, Expect)> = vec![
        ("defaults", FencingPolicySpec::default(), None),
        (
            "suspect 50 > unhealthy 10",
            policy(|s| {
                s.detection.suspect_after_seconds = 50;
                s.detection.unhealthy_after_seconds = 10;
            }),
            Some((order, |e| {
                matches!(e, PolicyError::ThresholdsOutOfOrder { .. })
            })),
        ),
        (
            "suspect == unhealthy",
            policy(|s| {
                s.detection.suspect_after_seconds = 20;
                s.detection.unhealthy_after_seconds = 20;
            }),
            Some((order, |e| {
                matches!(e, PolicyError::ThresholdsOutOfOrder { .. })
            })),
        ),
        (
            "window shorter than cooldown",
            policy(|s| {
                s.escalation.window_seconds = 60;
                s.escalation.cooldown_seconds = 600;
            }),
            Some((window, |e| {
                matches!(e, PolicyError::WindowShorterThanCooldown { .. })
            })),
        ),
        (
            "window equal to cooldown",
            policy(|s| {
                s.escalation.window_seconds = 600;
                s.escalation.cooldown_seconds = 600;
            }),
            None,
        ),
        (
            "blank topology key",
            policy(|s| s.limits.per_domain.topology_key = "  ".into()),
            Some((topology, |e| matches!(e, PolicyError::EmptyTopologyKey))),
        ),
        (
            "In without values",
            with_selector(vec![requirement("rack", "In", None)]),
            Some((selector, |e| matches!(e, PolicyError::BadSelector { .. }))),
        ),
        (
            "NotIn with empty values",
            with_selector(vec![requirement("rack", "NotIn", Some(&[]))]),
            Some((selector, |e| matches!(e, PolicyError::BadSelector { .. }))),
        ),
        (
            "Exists with values",
            with_selector(vec![requirement("rack", "Exists", Some(&["a"]))]),
            Some((selector, |e| matches!(e, PolicyError::BadSelector { .. }))),
        ),
        (
            "unknown operator",
            with_selector(vec![requirement("rack", "Gt", Some(&["1"]))]),
            Some((selector, |e| matches!(e, PolicyError::BadSelector { .. }))),
        ),
        (
            "empty key",
            with_selector(vec![requirement("", "Exists", None)]),
            Some((selector, |e| matches!(e, PolicyError::BadSelector { .. }))),
        ),
        (
            "a good selector after a bad one",
            with_selector(vec![
                requirement("rack", "In", Some(&["r1"])),
                requirement("zone", "DoesNotExist", None),
            ]),
            None,
        ),
    ];
    for (name, spec, expect) in cases {
        let object = json!({ "spec": spec });
        let cel = refused("FencingPolicy", &object, None);
        let validate = spec.validate().err().unwrap_or_default();
        match expect {
            None => {
                assert!(cel.is_empty(), "{name}: CEL refused {cel:?}");
                assert!(validate.is_empty(), "{name}: validate refused {validate:?}");
            }
            Some((message, reason)) => {
                assert_eq!(cel, BTreeSet::from([message]), "{name}");
                assert!(
                    validate.len() == 1 && reason(&validate[0]),
                    "{name}: validate said {validate:?}"
                );
            }
        }
    }
}

fn secret() -> Option<SecretRef> {
    Some(SecretRef {
        name: "bmc".into(),
        namespace: "palisade-system".into(),
        keys: Default::default(),
    })
}

/// The rule message that stands for a `validate()` error on a device, if CEL covers it.
fn cel_message_for(e: &TargetError) -> Option<&'static str> {
    Some(match e {
        TargetError::Credentials { .. } => {
            message_of("FenceTarget", "take no credentialsSecretRef")
        }
        TargetError::KindMismatch { kind, .. } => match kind {
            DeviceKind::Power => message_of("FenceTarget", "of kind Storage"),
            DeviceKind::Storage => message_of("FenceTarget", "of kind Power"),
        },
        TargetError::BridgeUrl { .. } => message_of("FenceTarget", "bridge://<host>"),
        TargetError::CredentialsInUrl { .. } => message_of("FenceTarget", "may name a user"),
        TargetError::NoStorageToReset { .. } => message_of("FenceTarget", "needs a Storage device"),
        TargetError::CannotReset { .. } => message_of("FenceTarget", "restarts through direct"),
        TargetError::StorageScope { problem, .. } if problem.starts_with("a Storage device") => {
            message_of("FenceTarget", "must name what it fences")
        }
        TargetError::StorageScope { .. } => message_of("FenceTarget", "fences is for Storage"),
        _ => return None,
    })
}

#[test]
fn device_rules_agree_with_validate_on_every_url_kind_and_secret() {
    let schema = serde_json::to_value(palisade_model::crds()).unwrap();
    let pattern = at(
        &schema[1]["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
        &[
            "properties",
            "spec",
            "properties",
            "levels",
            "items",
            "properties",
            "devices",
        ],
    )[0]["items"]["properties"]["url"]["pattern"]
        .as_str()
        .unwrap()
        .to_string();
    let pattern = regex::Regex::new(&pattern).unwrap();
    let urls = [
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
    let mut compared = 0;
    for url in urls {
        assert!(
            pattern.is_match(url),
            "{url} must pass the schema pattern to be a fair case"
        );
        for kind in [DeviceKind::Power, DeviceKind::Storage] {
            for creds in [None, secret()] {
                let device = FenceDevice {
                    url: url.into(),
                    kind,
                    credentials_secret_ref: creds.clone(),
                    timeout_seconds: 20,
                    fences: (kind == DeviceKind::Storage).then(|| StorageScope {
                        storage_classes: vec!["fast".into()],
                        csi_drivers: vec![],
                    }),
                };
                let spec = FenceTargetSpec {
                    levels: vec![FenceLevel {
                        name: "only".into(),
                        devices: vec![device],
                        power_off: Default::default(),
                    }],
                };
                let cel = refused("FenceTarget", &json!({ "spec": spec }), None);
                let errors = spec.validate().err().unwrap_or_default();
                let expected: BTreeSet<_> = errors.iter().filter_map(cel_message_for).collect();
                let case = format!("{url} {kind:?} secret={}", creds.is_some());
                // validate() stops at a URL with credentials; CEL reports every rule.
                if errors
                    .iter()
                    .any(|e| matches!(e, TargetError::CredentialsInUrl { .. }))
                {
                    assert!(
                        cel.contains(message_of("FenceTarget", "may name a user")),
                        "{case}: {cel:?}"
                    );
                } else {
                    assert_eq!(cel, expected, "{case}: validate said {errors:?}");
                }
                compared += 1;
            }
        }
    }
    assert_eq!(compared, urls.len() * 4);
}

#[test]
fn level_rules_for_hosts_that_must_not_power_off_agree_with_validate() {
    let dev = |url: &str, kind: DeviceKind| FenceDevice {
        url: url.into(),
        kind,
        credentials_secret_ref: (!url.starts_with("bridge://")).then(|| secret().unwrap()),
        timeout_seconds: 20,
        fences: (kind == DeviceKind::Storage).then(|| StorageScope {
            storage_classes: vec!["fast".into()],
            csi_drivers: vec![],
        }),
    };
    let storage = || dev("storagefw+https://fw:8443/nodes/m0", DeviceKind::Storage);
    let cases = [
        vec![storage(), dev("ipmi://bmc:623", DeviceKind::Power)],
        vec![storage(), dev("redfish+https://bmc", DeviceKind::Power)],
        vec![storage()],
        vec![dev("bridge://b:8443/m0", DeviceKind::Storage)],
        vec![dev("ipmi://bmc:623", DeviceKind::Power)],
        vec![storage(), dev("snmp+pdu://pdu:161/4", DeviceKind::Power)],
        vec![storage(), dev("bridge://b:8443/m0", DeviceKind::Power)],
        vec![dev("snmp+pdu://pdu:161/4", DeviceKind::Power)],
    ];
    let mut refusals = 0;
    for devices in cases {
        for power_off in [PowerOff::Allowed, PowerOff::Disallowed] {
            let spec = FenceTargetSpec {
                levels: vec![FenceLevel {
                    name: "l".into(),
                    devices: devices.clone(),
                    power_off,
                }],
            };
            let cel = refused("FenceTarget", &json!({ "spec": spec }), None);
            let errors = spec.validate().err().unwrap_or_default();
            let expected: BTreeSet<_> = errors.iter().filter_map(cel_message_for).collect();
            assert_eq!(
                cel, expected,
                "{power_off:?} {devices:?}: validate said {errors:?}"
            );
            refusals += cel.len();
        }
    }
    // The table exercises both rules (not a vacuous agreement on "nothing refused").
    assert_eq!(refusals, 5);
}

#[test]
fn storage_scope_rules_agree_with_validate() {
    let scope = |classes: &[&str], drivers: &[&str]| StorageScope {
        storage_classes: classes.iter().map(|c| c.to_string()).collect(),
        csi_drivers: drivers.iter().map(|c| c.to_string()).collect(),
    };
    let cases = [
        (
            "storagefw+https://fw:8443/nodes/m0",
            DeviceKind::Storage,
            None,
        ),
        (
            "storagefw+https://fw:8443/nodes/m0",
            DeviceKind::Storage,
            Some(scope(&[], &[])),
        ),
        (
            "storagefw+https://fw:8443/nodes/m0",
            DeviceKind::Storage,
            Some(scope(&[""], &[])),
        ),
        (
            "storagefw+https://fw:8443/nodes/m0",
            DeviceKind::Storage,
            Some(scope(&[], &["csi.x"])),
        ),
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
    let mut refusals = 0;
    for (url, kind, fences) in cases {
        let spec = FenceTargetSpec {
            levels: vec![FenceLevel {
                name: "l".into(),
                devices: vec![FenceDevice {
                    url: url.into(),
                    kind,
                    credentials_secret_ref: (!url.starts_with("bridge://"))
                        .then(|| secret().unwrap()),
                    timeout_seconds: 20,
                    fences: fences.clone(),
                }],
                power_off: Default::default(),
            }],
        };
        let cel = refused("FenceTarget", &json!({ "spec": spec }), None);
        let errors = spec.validate().err().unwrap_or_default();
        let expected: BTreeSet<_> = errors.iter().filter_map(cel_message_for).collect();
        assert_eq!(
            cel, expected,
            "{url} {kind:?} {fences:?}: validate said {errors:?}"
        );
        refusals += cel.len();
    }
    // Both rules refuse something (not a vacuous agreement on "nothing refused").
    assert_eq!(refusals, 5);
}

#[test]
fn a_nodefence_spec_is_fixed_once_created() {
    let spec: NodeFenceSpec =
        serde_json::from_value(json!({ "nodeName": "m0", "reason": "test" })).unwrap();
    let object = json!({ "spec": spec });
    assert!(refused("NodeFence", &object, None).is_empty(), "create");
    assert!(
        refused("NodeFence", &object, Some(&object)).is_empty(),
        "same spec"
    );
    let mut moved = object.clone();
    moved["spec"]["nodeName"] = json!("m1");
    let mut reasoned = object.clone();
    reasoned["spec"]["reason"] = json!("other");
    for changed in [moved, reasoned] {
        assert_eq!(
            refused("NodeFence", &changed, Some(&object)),
            BTreeSet::from([message_of("NodeFence", "cannot change")]),
            "{changed}"
        );
    }
}
