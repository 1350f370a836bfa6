//! The CEL rules and the ValidatingAdmissionPolicy on a real Kubernetes 1.34 API server (a
//! control-plane-only lab).
//!
//! - The server accepts `palisade_model::crds_for(34)` by server-side apply: its CEL compiler
//!   (RE2 patterns, `has()`, `int` arithmetic) and its cost estimate take every rule. Then every
//!   case of the tables `controller/model/tests/cel.rs` evaluates with an interpreter
//!   (`palisade_model::cel_cases`) goes to the server: a dry-run create, or for a transition
//!   rule a real create and a dry-run update. The server refuses exactly what `validate()`
//!   refuses, and its answer quotes each refusing rule's message.
//! - `controller/manifests/admission-policy.yaml` (policy and binding), applied as shipped:
//!   the server type-checks it without a warning, refuses a second unfinished NodeFence for a
//!   node with the policy's message, and admits one for another node, or once the first is
//!   over.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{client, eventually, rt};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::Status;
use kube::{Api, Client};
use palisade_lab::{KubeVersion, Lab};
use palisade_model::cel::RULES;
use palisade_model::cel_cases::{self, Case};
use palisade_model::{FenceTarget, FencingPolicy, NodeFence};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// A lab with nothing but a Kubernetes 1.34 control plane.
fn control_plane_lab() -> Lab {
    common::control_plane_lab(KubeVersion::V1_34)
}

/// Server-side applies the CRDs for this server's minor version and waits until each is
/// Established and served. A refusal (a rule that does not compile, or whose estimated cost is
/// over the budget) panics with the server's message.
fn install_crds(c: &Client, rt: &tokio::runtime::Runtime) {
    let minor = rt.block_on(c.apiserver_version()).expect("/version").minor;
    let minor = palisade_model::parse_minor(&minor).expect("a numeric minor version");
    assert_eq!(minor, 34, "the lab runs Kubernetes 1.34");
    let crds = palisade_model::crds_for(minor);
    assert!(
        serde_json::to_string(&crds)
            .unwrap()
            .contains("x-kubernetes-validations"),
        "1.34 gets the CEL rules"
    );
    let api: Api<CustomResourceDefinition> = Api::all(c.clone());
    let pp = PatchParams::apply("palisade-e2e").force();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap();
        if let Err(e) = rt.block_on(api.patch(&name, &pp, &Patch::Apply(crd))) {
            panic!("the API server refused CRD {name}: {}", server_message(&e));
        }
    }
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap();
        eventually(&format!("CRD {name} Established"), WAIT, || {
            let got = rt.block_on(api.get(&name)).ok()?;
            let conditions = got.status?.conditions.unwrap_or_default();
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        });
    }
    // Established can come a moment before the endpoints serve.
    for kind in ["FencingPolicy", "FenceTarget", "NodeFence"] {
        let api = dynamic(c, kind);
        eventually(&format!("{kind} served"), WAIT, || {
            rt.block_on(api.list(&Default::default())).ok()
        });
    }
}

/// The API server's message in an error (the whole error if it is not the server's answer).
fn server_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({}, {})", s.message, s.reason, s.code),
        other => other.to_string(),
    }
}

fn dynamic(c: &Client, kind: &str) -> Api<DynamicObject> {
    let resource = match kind {
        "FencingPolicy" => ApiResource::erase::<FencingPolicy>(&()),
        "FenceTarget" => ApiResource::erase::<FenceTarget>(&()),
        "NodeFence" => ApiResource::erase::<NodeFence>(&()),
        other => panic!("no resource of kind {other}"),
    };
    Api::all_with(c.clone(), &resource)
}

fn object(kind: &str, name: &str, body: &serde_json::Value) -> DynamicObject {
    let mut obj = body.clone();
    obj["apiVersion"] = json!(format!(
        "{}/{}",
        palisade_model::GROUP,
        palisade_model::VERSION
    ));
    obj["kind"] = json!(kind);
    obj["metadata"] = json!({ "name": name });
    serde_json::from_value(obj).expect("a Kubernetes object")
}

const DRY_RUN: PostParams = PostParams {
    dry_run: true,
    field_manager: None,
};

/// Sends `case` to the server as object `name`: a dry-run create, or, for an update, a real
/// create of the stored object and a dry-run replace of its spec. The server's refusal, if any.
fn send(c: &Client, rt: &tokio::runtime::Runtime, case: &Case, name: &str) -> Option<Status> {
    let api = dynamic(c, case.kind);
    let answer = match &case.old {
        None => rt.block_on(api.create(&DRY_RUN, &object(case.kind, name, &case.object))),
        Some(old) => {
            let stored = rt
                .block_on(api.create(&PostParams::default(), &object(case.kind, name, old)))
                .unwrap_or_else(|e| panic!("{}: storing {old}: {}", case.name, server_message(&e)));
            let mut updated = stored.clone();
            updated.data["spec"] = case.object["spec"].clone();
            rt.block_on(api.replace(name, &DRY_RUN, &updated))
        }
    };
    match answer {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(*status),
        Err(e) => panic!("{}: the API server did not answer: {e}", case.name),
    }
}

/// The messages of `kind`'s rules that a refusal quotes.
fn quoted(kind: &str, refusal: &Status) -> BTreeSet<&'static str> {
    RULES
        .iter()
        .filter(|r| r.kind == kind && refusal.message.contains(r.message))
        .map(|r| r.message)
        .collect()
}

#[test]
fn a_real_api_server_takes_the_cel_rules_and_refuses_exactly_what_validate_refuses() {
    let lab = control_plane_lab();
    let rt = rt();
    let c = client(&lab, &rt);
    install_crds(&c, &rt);

    let cases = cel_cases::all();
    let mut disagreements = Vec::new();
    let mut exercised = BTreeSet::new();
    for (i, case) in cases.iter().enumerate() {
        let refusal = send(&c, &rt, case, &format!("cel-{i}"));
        let refused = refusal
            .as_ref()
            .map(|r| quoted(case.kind, r))
            .unwrap_or_default();
        // A refusal must be the rules' (422 Invalid), and quote at least one of them: a
        // refusal by the schema or for another reason proves nothing about the rules.
        let theirs = refusal
            .as_ref()
            .is_none_or(|r| r.code == 422 && !refused.is_empty());
        if !theirs || !case.expect.agrees(&refused) {
            disagreements.push(format!(
                "{}: expected {:?}; the server said {:?}; validate said {:?}",
                case.name,
                case.expect,
                refusal.map(|r| format!("{} {}: {}", r.code, r.reason, r.message)),
                case.validate,
            ));
        }
        exercised.extend(refused);
    }
    assert!(
        disagreements.is_empty(),
        "the API server disagrees with validate() on {} of {} cases:\n{}",
        disagreements.len(),
        cases.len(),
        disagreements.join("\n")
    );
    for rule in RULES {
        assert!(
            exercised.contains(rule.message),
            "the server never refused with {}'s rule {:?}",
            rule.kind,
            rule.message
        );
    }
}

const POLICY: &str = include_str!("../../../controller/manifests/admission-policy.yaml");

/// The policy and its binding, as shipped.
fn admission_policy() -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let docs: Vec<serde_json::Value> = POLICY
        .split("\n---")
        .map(|text| serde_saphyr::from_str(text).expect("admission-policy.yaml parses"))
        .filter(|doc: &serde_json::Value| !doc.is_null())
        .collect();
    assert_eq!(docs.len(), 2, "a policy and its binding");
    let policy = serde_json::from_value(docs[0].clone()).expect("the first is the policy");
    let binding = serde_json::from_value(docs[1].clone()).expect("the second is its binding");
    (policy, binding)
}

#[test]
fn the_admission_policy_refuses_a_second_unfinished_fence_for_a_node_without_the_webhook() {
    let (policy, binding) = admission_policy();
    assert_eq!(
        binding
            .spec
            .as_ref()
            .and_then(|s| s.validation_actions.clone()),
        Some(vec!["Deny".to_string()]),
        "the binding denies (not only warns or audits)"
    );
    let lab = control_plane_lab();
    let rt = rt();
    let c = client(&lab, &rt);
    install_crds(&c, &rt);

    let policies: Api<ValidatingAdmissionPolicy> = Api::all(c.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(c.clone());
    let pp = PostParams::default();
    let name = policy.metadata.name.clone().unwrap();
    if let Err(e) = rt.block_on(policies.create(&pp, &policy)) {
        panic!("the API server refused the policy: {}", server_message(&e));
    }
    if let Err(e) = rt.block_on(bindings.create(&pp, &binding)) {
        panic!("the API server refused the binding: {}", server_message(&e));
    }
    // The server type-checks every expression against the NodeFence schema (object and
    // params) and reports what it doubts in the status.
    let checking = eventually("the policy is type-checked", WAIT, || {
        let got = rt.block_on(policies.get(&name)).ok()?;
        let status = got.status?;
        (status.observed_generation == got.metadata.generation).then_some(status.type_checking)
    });
    let warnings = checking
        .and_then(|t| t.expression_warnings)
        .unwrap_or_default();
    assert!(warnings.is_empty(), "type-checking warnings: {warnings:?}");

    let fences = dynamic(&c, "NodeFence");
    let fence = |name: &str, node: &str| {
        object(
            "NodeFence",
            name,
            &json!({"spec": {"nodeName": node, "reason": "test"}}),
        )
    };
    rt.block_on(fences.create(&pp, &fence("first", "m0")))
        .expect("the first fence for m0 is admitted");
    // The server loads a new policy, and the params (NodeFences) it reads, a moment later.
    let refusal = eventually(
        "the policy refuses a second fence for m0",
        WAIT,
        || match rt.block_on(fences.create(&DRY_RUN, &fence("second", "m0"))) {
            Err(kube::Error::Api(s)) => Some(s),
            Err(e) => panic!("the API server did not answer: {e}"),
            Ok(_) => None,
        },
    );
    assert!(
        refusal.message.contains(&format!("ValidatingAdmissionPolicy '{name}'"))
            && refusal.message.contains(
                "node \"m0\" already has an unfinished NodeFence (first); watch that one, or delete it first"
            ),
        "{}",
        refusal.message
    );
    rt.block_on(fences.create(&DRY_RUN, &fence("other", "m1")))
        .unwrap_or_else(|e| panic!("a fence for another node: {}", server_message(&e)));

    // Once the first is over, another fence for m0 is admitted.
    rt.block_on(fences.patch_status(
        "first",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Done"}})),
    ))
    .unwrap_or_else(|e| panic!("finishing the first fence: {}", server_message(&e)));
    eventually(
        "a fence for m0 is admitted once the first is Done",
        WAIT,
        || {
            rt.block_on(fences.create(&DRY_RUN, &fence("second", "m0")))
                .ok()
        },
    );
}
