//! The install manifests on a bare control plane (no machines), applied the way a user applies
//! them (`kubectl apply -k`, through the lab's overlay: on 1.20 it serves the
//! PodDisruptionBudget as `policy/v1beta1`), proven against the real API server.
//!
//! - The user ClusterRoles (`controller/manifests/user-roles.yaml`) grant exactly a reviewed
//!   list each (a SelfSubjectRulesReview as a bound user, minus what an unbound user may do), so
//!   widening a verb fails here until the list is reviewed too. Real requests then show what
//!   each may and may not do: the fence operator runs `kubectl palisade` (fence, timeline,
//!   status, explain, check, cancel) and writes the confirm-clean annotation, but cannot write a
//!   FencingPolicy or read a Secret; the policy admin writes policies but cannot fence; the
//!   built-in `view`, `edit` and `admin` roles gain the reads by aggregation and none of them
//!   can create, patch or delete a NodeFence, nor write a FencingPolicy.
//! - The controller's pods get the `palisade-critical` priority, and its PodDisruptionBudget
//!   selects both replicas.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, ResourceExt};
use palisade_model::nodefence::{Overrides, RequestedBy, ANNOTATION_CONFIRM_CLEAN};
use palisade_model::{FencingPolicy, NodeFence, NodeFenceSpec};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

/// `palisade-view`: reads of Palisade's objects (`verb group/resource`, as in `rbac.rs`).
const VIEW: &[&str] = &[
    "get palisade.dev/fencetargets",
    "list palisade.dev/fencetargets",
    "watch palisade.dev/fencetargets",
    "get palisade.dev/fencetargets/status",
    "get palisade.dev/fencingpolicies",
    "list palisade.dev/fencingpolicies",
    "watch palisade.dev/fencingpolicies",
    "get palisade.dev/fencingpolicies/status",
    "get palisade.dev/nodefences",
    "list palisade.dev/nodefences",
    "watch palisade.dev/nodefences",
    "get palisade.dev/nodefences/status",
];

/// `palisade-fence-operator` beyond [`VIEW`]: fence, cancel, confirm-clean, and the reads of
/// `kubectl palisade status`, `explain` and `check`.
const FENCE_OPERATOR: &[&str] = &[
    "create palisade.dev/nodefences",
    "delete palisade.dev/nodefences",
    "patch palisade.dev/nodefences",
    "get core/nodes",
    "list core/nodes",
    "get coordination.k8s.io/leases",
    "list coordination.k8s.io/leases",
    "list core/events",
    "list core/persistentvolumeclaims",
    "list core/pods",
];

/// `palisade-policy-admin` beyond [`VIEW`]: write policies and targets.
const POLICY_ADMIN: &[&str] = &[
    "create palisade.dev/fencetargets",
    "delete palisade.dev/fencetargets",
    "patch palisade.dev/fencetargets",
    "update palisade.dev/fencetargets",
    "create palisade.dev/fencingpolicies",
    "delete palisade.dev/fencingpolicies",
    "patch palisade.dev/fencingpolicies",
    "update palisade.dev/fencingpolicies",
];

/// Applies `controller/manifests` with `kubectl apply -k` through the lab's overlay (the
/// manifests' own image name: no machine runs the replicas here).
fn install(lab: &palisade_lab::Lab) {
    let dir = palisade_scenario::in_cluster::overlay(lab, None, &[]).expect("write the overlay");
    let out = kubectl_output(lab, &["apply", "-k", &dir.display().to_string()]);
    assert!(
        out.ok,
        "kubectl apply -k controller/manifests:\n{}{}",
        out.stdout, out.stderr
    );
}

/// A client authenticated as `user` (a client certificate; no groups but
/// `system:authenticated`), and its kubeconfig.
fn user(lab: &palisade_lab::Lab, rt: &tokio::runtime::Runtime, name: &str) -> (Client, String) {
    let path = kubeconfig_as(lab, name, name);
    let c = rt
        .block_on(palisade_lab::client_from_kubeconfig(&path))
        .expect("client");
    (c, path.display().to_string())
}

/// Binds ClusterRole `role` to `user` cluster-wide (every Palisade object is cluster-scoped).
fn bind(c: &Client, rt: &tokio::runtime::Runtime, user: &str, role: &str) {
    let b: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{user}-{role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .unwrap();
    rt.block_on(Api::<ClusterRoleBinding>::all(c.clone()).create(&PostParams::default(), &b))
        .expect("create the ClusterRoleBinding");
}

/// Asserts that `c`'s user may do exactly `want` beyond what `nobody` may.
fn assert_grants_exactly(
    who: &str,
    c: &Client,
    nobody: &BTreeSet<String>,
    want: &[&[&str]],
    rt: &tokio::runtime::Runtime,
) {
    let want: BTreeSet<String> = want
        .iter()
        .flat_map(|l| l.iter())
        .map(|s| s.to_string())
        .collect();
    let granted: BTreeSet<String> = rules_review(c, rt, "default")
        .difference(nobody)
        .cloned()
        .collect();
    let extra: Vec<&String> = granted.difference(&want).collect();
    let missing: Vec<&String> = want.difference(&granted).collect();
    assert_eq!(
        (extra, missing),
        (vec![], vec![]),
        "{who}: (granted but not reviewed, reviewed but not granted)"
    );
}

/// Asserts that the API server refused `who` the request `what` for lack of permission (403),
/// neither accepting it nor failing it for another reason.
#[track_caller]
fn assert_forbidden<T>(who: &str, what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        Ok(_) => panic!("{who} may {what}: the API server accepted it"),
        Err(e) => panic!("{who} {what}: expected a 403, got {e}"),
    }
}

fn manual_fence(node: &str) -> NodeFence {
    let mut nf = NodeFence::new(
        "",
        NodeFenceSpec {
            node_name: node.to_string(),
            reason: "user_roles test".to_string(),
            requested_by: RequestedBy::Manual,
            overrides: Overrides::default(),
        },
    );
    nf.metadata.name = None;
    nf.metadata.generate_name = Some(format!("{node}-manual-"));
    nf
}

fn policy(name: &str) -> FencingPolicy {
    serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "FencingPolicy",
        "metadata": {"name": name},
        "spec": {"detection": {"suspectAfterSeconds": 2, "unhealthyAfterSeconds": 4}},
    }))
    .expect("a FencingPolicy")
}

/// The confirm-clean patch exactly as `kubectl palisade confirm-clean` sends it (a merge patch
/// carrying the UID as a precondition).
fn confirm_clean_patch(nf: &NodeFence) -> serde_json::Value {
    json!({"metadata": {
        "uid": nf.uid(),
        "annotations": {ANNOTATION_CONFIRM_CLEAN: format!("{}: checked from the console", nf.uid().unwrap())},
    }})
}

/// Runs `kubectl palisade` with `kubeconfig`; returns the exit code and the output.
fn plugin(kubeconfig: &str, args: &[&str]) -> (i32, String) {
    let o = plugin_with(std::ffi::OsStr::new(kubeconfig), args);
    (o.code, o.text())
}

#[test]
fn each_user_role_grants_its_reviewed_verbs_and_edit_or_admin_cannot_fence() {
    let lab = common::sim::bare_lab(0);
    let rt = rt();
    let admin = client(&lab, &rt);
    install(&lab);
    // A Node to fence (no machine behind it: nothing runs here to act on the fence).
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "m0"}})).unwrap();
    rt.block_on(Api::<Node>::all(admin.clone()).create(&PostParams::default(), &node))
        .expect("create Node m0");
    secret(
        &admin,
        &rt,
        "bmc-m0",
        &[("username", "u"), ("password", "p")],
    );

    for (u, role) in [
        ("ur-viewer", "palisade-view"),
        ("ur-fencer", "palisade-fence-operator"),
        ("ur-policy", "palisade-policy-admin"),
        ("ur-view", "view"),
        ("ur-edit", "edit"),
        ("ur-admin", "admin"),
    ] {
        bind(&admin, &rt, u, role);
    }
    let (viewer, _) = user(&lab, &rt, "ur-viewer");
    let (fencer, fencer_cfg) = user(&lab, &rt, "ur-fencer");
    let (policy_admin, _) = user(&lab, &rt, "ur-policy");
    let (nobody, _) = user(&lab, &rt, "ur-nobody");

    // Exactly the reviewed lists.
    let base = rules_review(&nobody, &rt, "default");
    assert!(
        base.iter().any(|r| r.contains("selfsubjectrulesreviews")),
        "the review sees the unbound user's own rights: {base:?}"
    );
    assert_grants_exactly("palisade-view", &viewer, &base, &[VIEW], &rt);
    assert_grants_exactly(
        "palisade-fence-operator",
        &fencer,
        &base,
        &[VIEW, FENCE_OPERATOR],
        &rt,
    );
    assert_grants_exactly(
        "palisade-policy-admin",
        &policy_admin,
        &base,
        &[VIEW, POLICY_ADMIN],
        &rt,
    );

    // The CRDs serve (the install created them a moment ago).
    let fences = |c: &Client| Api::<NodeFence>::all(c.clone());
    let policies = |c: &Client| Api::<FencingPolicy>::all(c.clone());
    eventually("the NodeFence CRD serves", WAIT, || {
        rt.block_on(fences(&admin).list(&ListParams::default()))
            .ok()
    });
    eventually("the FencingPolicy CRD serves", WAIT, || {
        rt.block_on(policies(&admin).list(&ListParams::default()))
            .ok()
    });

    // palisade-view reads, and nothing more.
    let pp = PostParams::default();
    rt.block_on(fences(&viewer).list(&ListParams::default()))
        .expect("palisade-view lists NodeFences");
    assert_forbidden(
        "palisade-view",
        "create a NodeFence",
        rt.block_on(fences(&viewer).create(&pp, &manual_fence("m0"))),
    );

    // palisade-policy-admin writes policies, and cannot fence.
    rt.block_on(policies(&policy_admin).create(&pp, &policy("ur-lab")))
        .expect("palisade-policy-admin creates a FencingPolicy");
    rt.block_on(policies(&policy_admin).patch(
        "ur-lab",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"fenceWhen": "Always"}})),
    ))
    .expect("palisade-policy-admin patches a FencingPolicy");
    assert_forbidden(
        "palisade-policy-admin",
        "create a NodeFence",
        rt.block_on(fences(&policy_admin).create(&pp, &manual_fence("m0"))),
    );

    // palisade-fence-operator: every command of `kubectl palisade` but the forced pod
    // deletion, as that user.
    let (code, out) = plugin(&fencer_cfg, &["fence", "m0", "--reason", "user_roles test"]);
    assert_eq!(code, 0, "fence as palisade-fence-operator: {out}");
    let name = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("nodefence/"))
        .expect("fence names the NodeFence")
        .to_string();
    for args in [
        vec!["timeline", name.as_str()],
        vec!["status"],
        vec!["explain", "m0"],
    ] {
        let (code, out) = plugin(&fencer_cfg, &args);
        assert_eq!(code, 0, "{args:?} as palisade-fence-operator: {out}");
    }
    // `check` finds problems here (no controller leads): exit 4, not an error (1).
    let (code, out) = plugin(&fencer_cfg, &["check"]);
    assert_eq!(code, 4, "check as palisade-fence-operator: {out}");
    // `confirm-clean` refuses a Pending fence before it patches: its patch, sent directly.
    let nf = rt.block_on(fences(&fencer).get(&name)).unwrap();
    rt.block_on(fences(&fencer).patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(confirm_clean_patch(&nf)),
    ))
    .expect("palisade-fence-operator writes the confirm-clean annotation");
    let (code, out) = plugin(&fencer_cfg, &["cancel", &name]);
    assert_eq!(code, 0, "cancel as palisade-fence-operator: {out}");
    assert!(
        rt.block_on(fences(&admin).get_opt(&name))
            .unwrap()
            .is_none(),
        "the Pending NodeFence was cancelled"
    );
    let who = "palisade-fence-operator";
    assert_forbidden(
        who,
        "create a FencingPolicy",
        rt.block_on(policies(&fencer).create(&pp, &policy("ur-fencer"))),
    );
    assert_forbidden(
        who,
        "patch a FencingPolicy",
        rt.block_on(policies(&fencer).patch(
            "ur-lab",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"fenceWhen": "StatefulOnly"}})),
        )),
    );
    let secrets = Api::<Secret>::namespaced(fencer.clone(), SYSTEM_NS);
    assert_forbidden(
        who,
        "read a device Secret",
        rt.block_on(secrets.get("bmc-m0")),
    );
    assert_forbidden(
        who,
        "list Secrets",
        rt.block_on(secrets.list(&ListParams::default())),
    );

    // The built-in roles: each gains the reads by aggregation (waited for: the aggregation
    // controller fills them in, so the refusals below are not from before it did), and none
    // may fence or configure fencing.
    let target = rt
        .block_on(fences(&admin).create(&pp, &manual_fence("m0")))
        .expect("the admin fences");
    let target_name = target.name_any();
    for (u, role) in [
        ("ur-view", "view"),
        ("ur-edit", "edit"),
        ("ur-admin", "admin"),
    ] {
        let (c, _) = user(&lab, &rt, u);
        eventually(
            &format!("{role} lists NodeFences (aggregated)"),
            WAIT,
            || rt.block_on(fences(&c).list(&ListParams::default())).ok(),
        );
        assert_forbidden(
            role,
            "create a NodeFence",
            rt.block_on(fences(&c).create(&pp, &manual_fence("m0"))),
        );
        assert_forbidden(
            role,
            "patch a NodeFence",
            rt.block_on(fences(&c).patch(
                &target_name,
                &PatchParams::default(),
                &Patch::Merge(confirm_clean_patch(&target)),
            )),
        );
        assert_forbidden(
            role,
            "delete a NodeFence",
            rt.block_on(fences(&c).delete(&target_name, &DeleteParams::default())),
        );
        assert_forbidden(
            role,
            "create a FencingPolicy",
            rt.block_on(policies(&c).create(&pp, &policy(u))),
        );
    }
}

#[test]
fn the_controller_pods_get_the_critical_priority_and_a_budget_over_both_replicas() {
    let lab = common::sim::bare_lab(0);
    let rt = rt();
    let admin = client(&lab, &rt);
    install(&lab);
    // No machine: the replicas are created and stay Pending, which is enough for both.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), SYSTEM_NS);
    let selector = palisade_scenario::in_cluster::CONTROLLER_SELECTOR;
    let replicas = eventually("both controller pods created", WAIT, || {
        let l = rt
            .block_on(pods.list(&ListParams::default().labels(selector)))
            .ok()?;
        (l.items.len() == 2).then_some(l.items)
    });
    for p in &replicas {
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            (spec.priority_class_name.as_deref(), spec.priority),
            (Some("palisade-critical"), Some(1_000_000_000)),
            "{}: the admission plugin resolved the class",
            p.name_any()
        );
    }
    // policy/v1 from 1.21; the lab's overlay made it policy/v1beta1 on 1.20.
    let version = if server_minor(&admin, &rt) >= 21 {
        "v1"
    } else {
        "v1beta1"
    };
    let gvk = GroupVersionKind::gvk("policy", version, "PodDisruptionBudget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "poddisruptionbudgets");
    let pdbs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), SYSTEM_NS, &ar);
    let status = eventually("the PDB's status counts both replicas", WAIT, || {
        let pdb = rt.block_on(pdbs.get_opt("palisade-controller")).ok()??;
        let st = pdb.data.get("status")?.clone();
        (st["expectedPods"] == 2).then_some(st)
    });
    // Neither replica is healthy (nowhere to run), so no eviction is allowed.
    assert_eq!(status["disruptionsAllowed"], 0, "{status}");
}
