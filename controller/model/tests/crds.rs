//! The generated CRDs: the checked-in manifest is current, and every schema is structural in
//! the sense a 1.20 API server (apiextensions.k8s.io/v1) enforces.

use kube_core::CustomResourceExt;
use serde_json::{json, Value};

const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../manifests");

#[test]
fn checked_in_crds_match_the_generator() {
    for (file, cel, args) in [
        ("crds.yaml", false, ""),
        ("crds-cel.yaml", true, " -- --cel"),
    ] {
        let path = format!("{MANIFESTS}/{file}");
        let fix = format!(
            "run `cargo run -p palisade-model --bin crdgen{args} > controller/manifests/{file}`"
        );
        let generated = palisade_model::crds_yaml(cel).unwrap();
        let on_disk =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}; {fix}"));
        assert!(on_disk == generated, "{path} is out of date; {fix}");
    }
}

#[test]
fn cel_rules_go_only_to_servers_that_evaluate_them() {
    let count = |minor| {
        serde_json::to_string(&palisade_model::crds_for(minor))
            .unwrap()
            .matches("x-kubernetes-validations")
            .count()
    };
    assert_eq!(count(20), 0);
    assert_eq!(count(24), 0);
    assert_eq!(count(25), count(33));
    // One list per schema node that carries rules (several rules may share a node).
    let nodes: std::collections::BTreeSet<_> = palisade_model::cel::RULES
        .iter()
        .map(|r| (r.kind, r.path))
        .collect();
    assert_eq!(count(25), nodes.len());
    assert_eq!(palisade_model::parse_minor("20"), Some(20));
    assert_eq!(palisade_model::parse_minor("27+"), Some(27));
    assert_eq!(palisade_model::parse_minor(""), None);
    assert_eq!(palisade_model::parse_minor("x1"), None);
}

/// Formats the 1.20 validator knows (kube-openapi's strfmt registry plus the integer/number ones).
const KNOWN_FORMATS: &[&str] = &[
    "int32",
    "int64",
    "float",
    "double",
    "byte",
    "date",
    "date-time",
    "duration",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "password",
];

/// Collect every violation of the structural-schema rules (plus the constructs 1.20 lacks) under `path`.
fn structural_violations(schema: &Value, path: &str, out: &mut Vec<String>) {
    structural(schema, path, false, out)
}

/// As [`structural_violations`], with `cel` allowing `x-kubernetes-validations` (1.25+).
fn structural(schema: &Value, path: &str, cel: bool, out: &mut Vec<String>) {
    let Some(obj) = schema.as_object() else {
        out.push(format!("{path}: schema is not an object"));
        return;
    };
    for banned in [
        "$ref",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "definitions",
        "$defs",
    ] {
        if obj.contains_key(banned) {
            out.push(format!("{path}: uses {banned}"));
        }
    }
    if !cel && obj.contains_key("x-kubernetes-validations") {
        out.push(format!("{path}: uses x-kubernetes-validations"));
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&json!(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    let ty = obj.get("type").and_then(Value::as_str);
    if ty.is_none() && !int_or_string && !preserve {
        out.push(format!("{path}: no type"));
    }
    if let Some(t) = obj.get("type") {
        if !t.is_string() {
            out.push(format!("{path}: type must be a single string, got {t}"));
        }
    }
    if let Some(f) = obj.get("format").and_then(Value::as_str) {
        if !KNOWN_FORMATS.contains(&f) {
            out.push(format!("{path}: unknown format {f}"));
        }
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        out.push(format!(
            "{path}: properties and additionalProperties together"
        ));
    }
    if let (Some(default), Some(t)) = (obj.get("default"), ty) {
        let ok = match t {
            "object" => default.is_object(),
            "array" => default.is_array(),
            "string" => default.is_string(),
            "integer" => default.is_i64() || default.is_u64(),
            "number" => default.is_number(),
            "boolean" => default.is_boolean(),
            _ => false,
        };
        if !ok {
            out.push(format!("{path}: default {default} does not match type {t}"));
        }
    }
    // 1.20 turns an empty-string default into null and then rejects it as not a string.
    if obj.get("default") == Some(&json!("")) {
        out.push(format!("{path}: empty-string default (1.20 rejects it)"));
    }
    if ty == Some("array") && !obj.contains_key("items") {
        out.push(format!("{path}: array without items"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            structural(sub, &format!("{path}.{name}"), cel, out);
        }
    }
    if let Some(items) = obj.get("items") {
        structural(items, &format!("{path}[]"), cel, out);
    }
    if let Some(ap) = obj.get("additionalProperties") {
        if ap.is_object() {
            structural(ap, &format!("{path}{{}}"), cel, out);
        }
    }
}

#[test]
fn every_crd_schema_is_structural_for_its_apiserver() {
    let all = palisade_model::crds().into_iter().map(|c| (c, false));
    let cel = palisade_model::crds_for(palisade_model::CEL_MINOR)
        .into_iter()
        .map(|c| (c, true));
    for (crd, cel) in all.chain(cel) {
        let crd = serde_json::to_value(&crd).unwrap();
        let name = crd["metadata"]["name"].as_str().unwrap().to_string();
        assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1", "{name}");
        assert_eq!(crd["spec"]["scope"], "Cluster", "{name}");
        assert_eq!(crd["spec"]["group"], "palisade.dev", "{name}");
        let versions = crd["spec"]["versions"].as_array().unwrap();
        assert_eq!(versions.len(), 1, "{name}");
        let v = &versions[0];
        assert_eq!(v["name"], "v1alpha1");
        assert_eq!(v["served"], true);
        assert_eq!(v["storage"], true);
        let schema = &v["schema"]["openAPIV3Schema"];
        assert_eq!(schema["type"], "object", "{name}: root must be an object");
        assert!(
            schema["properties"].get("metadata").is_none()
                || schema["properties"]["metadata"]["properties"].is_null(),
            "{name}: metadata may not be constrained"
        );
        let mut violations = Vec::new();
        structural(schema, &name, cel, &mut violations);
        assert!(violations.is_empty(), "{name}:\n{}", violations.join("\n"));
    }
}

#[test]
fn the_structural_check_catches_what_1_20_rejects() {
    let bad = json!({
        "type": "object",
        "properties": {
            "a": { "anyOf": [{ "type": "string" }, { "type": "integer" }] },
            "b": { "type": "integer", "format": "uint32" },
            "c": { "type": ["string", "null"] },
            "d": { "type": "array" },
            "e": { "type": "boolean", "default": "yes" },
            "g": { "type": "string", "default": "" },
            "f": { "$ref": "#/definitions/F" },
            "ok": { "x-kubernetes-int-or-string": true },
        }
    });
    let mut v = Vec::new();
    structural_violations(&bad, "bad", &mut v);
    let text = v.join("\n");
    for needle in [
        "bad.a: uses anyOf",
        "bad.a: no type",
        "bad.b: unknown format uint32",
        "bad.c: type must be a single string",
        "bad.d: array without items",
        "bad.e: default \"yes\" does not match type boolean",
        "bad.f: uses $ref",
        "bad.g: empty-string default",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(!text.contains("bad.ok"), "{text}");
}

#[test]
fn nodefence_has_status_subresource_and_printer_columns() {
    let crd = serde_json::to_value(palisade_model::NodeFence::crd()).unwrap();
    let v = &crd["spec"]["versions"][0];
    assert!(v["subresources"]["status"].is_object());
    let cols: Vec<(&str, &str)> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        cols,
        vec![
            ("Node", ".spec.nodeName"),
            ("Phase", ".status.phase"),
            ("By", ".spec.requestedBy"),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
    let phases =
        &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"]["enum"];
    assert_eq!(
        phases,
        &json!([
            "Pending",
            "Fencing",
            "Fenced",
            "Releasing",
            "Released",
            "Recovering",
            "Done",
            "Failed"
        ])
    );
}

#[test]
fn policy_defaults_are_published_in_the_schema() {
    let crd = serde_json::to_value(palisade_model::FencingPolicy::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(
        spec["properties"]["detection"]["properties"]["unhealthyAfterSeconds"]["default"],
        20
    );
    assert_eq!(
        spec["properties"]["limits"]["properties"]["maxUnhealthy"]["default"],
        "40%"
    );
    assert_eq!(spec["properties"]["fenceWhen"]["default"], "StatefulOnly");
    assert_eq!(spec["properties"]["dryRun"]["default"], false);
}
