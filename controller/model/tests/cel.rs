//! The CEL rules emitted for 1.25+ API servers, evaluated by a CEL interpreter: each refuses
//! exactly what `validate()` refuses for the same reason, and passes what it accepts.
//!
//! This is the fast half of the proof: the `cel` crate evaluates the rules with Kubernetes'
//! conventions (`self` is the value at the rule's schema node, integers are `int`, absent
//! optional fields fail `has()`, defaults are applied first: the typed objects serialize every
//! defaulted field, and transition rules (`oldSelf`) run on updates only), in milliseconds.
//! The same tables (`palisade_model::cel_cases`) go to a real Kubernetes 1.34 API server in
//! `tests/e2e-controller/tests/cel_server.rs`, which also proves what an interpreter cannot:
//! that the server accepts the CRDs (its cost estimate, RE2 patterns) and answers each rule's
//! message.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use cel::{Context, Program, Value as Cel};
use palisade_model::cel::{Rule, RULES};
use palisade_model::cel_cases::{self, Case};
use serde_json::Value;

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

/// Evaluates every case; panics on the first that disagrees. Returns how many refusals (rule
/// messages) there were.
fn check(cases: &[Case]) -> usize {
    let mut refusals = 0;
    for case in cases {
        let refused = refused(case.kind, &case.object, case.old.as_ref());
        assert!(
            case.expect.agrees(&refused),
            "{}: CEL refused {refused:?}, expected {:?}; validate said {:?}",
            case.name,
            case.expect,
            case.validate
        );
        refusals += refused.len();
    }
    refusals
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

#[test]
fn every_rule_refuses_some_case_and_every_kind_admits_one() {
    let cases = cel_cases::all();
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), cases.len(), "case names are unique");
    for rule in RULES {
        assert!(
            cases.iter().any(|c| c.kind == rule.kind
                && refused(c.kind, &c.object, c.old.as_ref()).contains(rule.message)),
            "no case exercises {}: {}",
            rule.kind,
            rule.message
        );
    }
    for kind in ["FencingPolicy", "FenceTarget", "NodeFence"] {
        assert!(
            cases.iter().any(|c| c.kind == kind && c.expect.admits()),
            "no {kind} is admitted"
        );
    }
}

#[test]
fn policy_rules_refuse_what_validate_refuses_for_the_same_reason() {
    // Every case but the defaults, "window equal to cooldown" and "a good selector after a
    // bad one" is refused, by exactly one rule.
    assert_eq!(check(&cel_cases::policies()), 9);
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
    for url in cel_cases::DEVICE_URLS {
        assert!(
            pattern.is_match(url),
            "{url} must pass the schema pattern to be a fair case"
        );
    }
    let cases = cel_cases::devices();
    assert_eq!(cases.len(), cel_cases::DEVICE_URLS.len() * 4);
    check(&cases);
}

#[test]
fn level_rules_for_hosts_that_must_not_power_off_agree_with_validate() {
    // The table exercises both rules (not a vacuous agreement on "nothing refused").
    assert_eq!(check(&cel_cases::levels()), 5);
}

#[test]
fn storage_scope_rules_agree_with_validate() {
    // Both rules refuse something (not a vacuous agreement on "nothing refused").
    assert_eq!(check(&cel_cases::storage_scopes()), 5);
}

#[test]
fn a_nodefence_spec_is_fixed_once_created() {
    assert_eq!(check(&cel_cases::node_fences()), 2);
}
