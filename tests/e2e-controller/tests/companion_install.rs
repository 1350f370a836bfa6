//! The companion's install (`controller/manifests/companion`) on a real Kubernetes 1.34 API
//! server (a control-plane-only lab), with the credential a companion's pod really gets: a
//! service account token the API server binds to a pod on a node.
//!
//! - Every object of the kustomization is accepted as shipped (the DaemonSet by a server-side
//!   dry run: a lab without kubelets cannot run it; its pod template becomes a real pod bound to
//!   node `m0`, admitted by the namespace's Pod Security level).
//! - Before the admission policy, RBAC alone lets the companion's account patch *any* node's
//!   Lease: RBAC cannot say "its own". With the policy, the real `palisade-companion` writes its
//!   advertisement on `m0`'s Lease, and the API server refuses, with the policy's message, a
//!   write to `m1`'s Lease, to the Lease's spec (the kubelet's heartbeat), to a label or to
//!   another tool's annotation, and any write by a token bound to no pod; RBAC refuses a
//!   delete, a create and a write to the Node. The kubelet's own renewals are not matched.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{client, eventually, rt};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use palisade_lab::{KubeVersion, Lab};
use palisade_model::advertise::{BOOT_ID, RUNTIME_PODS, RUNTIME_SOURCE};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "palisade-companion";
const SA: &str = "palisade-companion";

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../controller/manifests/companion")
}

/// The objects of `file` in the companion's manifests, in order.
fn objects(file: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(manifests().join(file)).expect(file);
    text.split("\n---")
        .map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).expect(file))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The kustomization's resources, in its order.
fn kustomization() -> Vec<String> {
    let k = &objects("kustomization.yaml")[0];
    k["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

/// The API server's message in an error (the whole error if it is not the server's answer).
fn server_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({}, {})", s.message, s.reason, s.code),
        other => other.to_string(),
    }
}

/// Server-side applies `obj` (a dry run with `dry_run`), as the project ships it.
fn apply(c: &Client, rt: &tokio::runtime::Runtime, obj: &serde_json::Value, dry_run: bool) {
    let (group, version) = match obj["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (
            String::new(),
            obj["apiVersion"].as_str().unwrap().to_string(),
        ),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, obj["kind"].as_str().unwrap());
    let (resource, caps) = rt
        .block_on(kube::discovery::pinned_kind(c, &gvk))
        .expect("the server serves the kind");
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(c.clone(), ns, &resource)
        }
        _ => Api::all_with(c.clone(), &resource),
    };
    let name = obj["metadata"]["name"].as_str().unwrap();
    let mut pp = PatchParams::apply("palisade-e2e").force();
    pp.dry_run = dry_run;
    if let Err(e) = rt.block_on(api.patch(name, &pp, &Patch::Apply(obj))) {
        panic!(
            "the API server refused {} {name}: {}",
            obj["kind"],
            server_message(&e)
        );
    }
}

/// A kubeconfig for the lab's API server that authenticates with `token`.
fn token_kubeconfig(lab: &Lab, token: &str, file: &str) -> PathBuf {
    let cp = lab.control_plane().expect("control plane");
    let admin = std::fs::read_to_string(cp.admin_kubeconfig()).expect("admin kubeconfig");
    let mut cfg: serde_json::Value = serde_saphyr::from_str(&admin).expect("kubeconfig parses");
    cfg["users"][0]["user"] = json!({ "token": token });
    let path = lab.dir().join(format!("{file}.kubeconfig"));
    palisade_lab::write_secret(&path, serde_saphyr::to_string(&cfg).unwrap().as_bytes())
        .expect("write the kubeconfig");
    path
}

fn client_from(rt: &tokio::runtime::Runtime, kubeconfig: &Path) -> Client {
    rt.block_on(palisade_lab::client_from_kubeconfig(kubeconfig))
        .expect("a client from the kubeconfig")
}

/// A token of the companion's service account, bound to `pod` (name, uid) when given.
fn token(c: &Client, rt: &tokio::runtime::Runtime, pod: Option<(&str, &str)>) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(c.clone(), NS);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            bound_object_ref: pod.map(|(name, uid)| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
        },
        ..Default::default()
    };
    let answer = rt
        .block_on(sas.create_token_request(SA, &PostParams::default(), &request))
        .expect("a token for the companion's service account");
    answer.status.expect("a token").token
}

fn node_and_lease(c: &Client, rt: &tokio::runtime::Runtime, name: &str) {
    let nodes: Api<Node> = Api::all(c.clone());
    let node: Node = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    rt.block_on(nodes.create(&PostParams::default(), &node))
        .expect("create the Node");
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": { "example.com/kept": "yes" },
            "annotations": { "example.com/other-tool": "kept" },
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": 40,
            "renewTime": "2026-01-01T00:00:00.000000Z",
        },
    }))
    .unwrap();
    rt.block_on(leases.create(&PostParams::default(), &lease))
        .expect("create the Lease");
}

/// A merge patch of `body` on `name`'s Lease; the server's refusal, if any.
fn patch_lease(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    name: &str,
    body: serde_json::Value,
) -> Result<(), String> {
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    rt.block_on(leases.patch(name, &PatchParams::default(), &Patch::Merge(body)))
        .map(|_| ())
        .map_err(|e| server_message(&e))
}

fn palisade_annotation(value: &str) -> serde_json::Value {
    json!({ "metadata": { "annotations": { BOOT_ID: value } } })
}

/// Asserts `answer` is a refusal quoting `expected`.
fn refused(what: &str, answer: Result<(), String>, expected: &str) {
    match answer {
        Ok(()) => panic!("{what}: accepted, but must be refused ({expected})"),
        Err(m) => assert!(
            m.contains(expected),
            "{what}: refused, but not for {expected:?}: {m}"
        ),
    }
}

#[test]
fn the_companion_writes_only_palisades_annotations_on_its_own_nodes_lease() {
    let lab = common::control_plane_lab(KubeVersion::V1_34);
    let rt = rt();
    let c = client(&lab, &rt);
    node_and_lease(&c, &rt, "m0");
    node_and_lease(&c, &rt, "m1");

    let resources = kustomization();
    assert_eq!(
        resources,
        [
            "namespace.yaml",
            "rbac.yaml",
            "admission-policy.yaml",
            "daemonset.yaml"
        ],
        "the kustomization installs what this test proves"
    );
    for file in ["namespace.yaml", "rbac.yaml"] {
        for obj in objects(file) {
            apply(&c, &rt, &obj, false);
        }
    }
    let daemonset = objects("daemonset.yaml").remove(0);
    apply(&c, &rt, &daemonset, true);

    // The companion's pod on m0, as the DaemonSet's controller would create it (the lab has no
    // kubelet to run it): the namespace's Pod Security level admits its template.
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "palisade-companion-m0",
            "namespace": NS,
            "labels": daemonset["spec"]["template"]["metadata"]["labels"],
        },
        "spec": daemonset["spec"]["template"]["spec"],
    });
    pod["spec"]["nodeName"] = json!("m0");
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let pod = rt
        .block_on(pods.create(&PostParams::default(), &pod))
        .unwrap_or_else(|e| panic!("the companion's pod is refused: {}", server_message(&e)));
    let uid = pod.metadata.uid.clone().expect("a uid");
    let on_m0 = token(&c, &rt, Some(("palisade-companion-m0", &uid)));
    let companion = client_from(&rt, &token_kubeconfig(&lab, &on_m0, "companion-m0"));
    let unbound = client_from(
        &rt,
        &token_kubeconfig(&lab, &token(&c, &rt, None), "companion-unbound"),
    );

    // RBAC alone cannot keep a companion to its own node: the test can see the hole the policy
    // closes.
    let write_m1 = |tag: &str| patch_lease(&companion, &rt, "m1", palisade_annotation(tag));
    eventually(
        "RBAC lets the companion's account patch a Lease",
        WAIT,
        || write_m1("before-the-policy").ok(),
    );

    for obj in objects("admission-policy.yaml") {
        apply(&c, &rt, &obj, false);
    }
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(c.clone());
    let checked = eventually("the policy is type-checked", WAIT, || {
        let p = rt
            .block_on(policies.get("companion-leases.palisade.dev"))
            .ok()?;
        p.status?.type_checking
    });
    assert!(
        checked.expression_warnings.unwrap_or_default().is_empty(),
        "the server type-checks every expression without a warning"
    );
    let other_node = "may not write the Lease of node \"m1\"";
    eventually(
        "the policy refuses m0's companion a write on m1's Lease",
        WAIT,
        || {
            write_m1("after-the-policy")
                .err()
                .filter(|m| m.contains(other_node))
        },
    );

    // The real companion, with that token, writes its advertisement on m0's Lease (its CRI
    // socket is missing: it advertises the runtime it reads and no inventory).
    let kubeconfig = token_kubeconfig(&lab, &on_m0, "companion-m0");
    let log = lab.dir().join("companion.log");
    let mut child = Command::new(palisade_lab::bin_path("palisade-companion").expect("built"))
        .args(["--node-name", "m0", "--interval", "1s", "--timeout", "3s"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cri-endpoint")
        .arg(format!(
            "unix://{}",
            lab.dir().join("no-runtime.sock").display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("palisade-companion starts");
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let written = eventually("the companion's advertisement on m0's Lease", WAIT, || {
        let l = rt.block_on(leases.get("m0")).ok()?;
        let a = l.metadata.annotations?;
        (a.get(RUNTIME_SOURCE).map(String::as_str) == Some("cri") && a.contains_key(BOOT_ID))
            .then_some(a)
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !written.contains_key(RUNTIME_PODS),
        "no runtime, no inventory: {written:?}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("no complete inventory") && !log.contains('\u{1b}'),
        "the companion says why it advertises no inventory, in plain text (a file is no \
         terminal): {log}"
    );
    assert_eq!(
        written.get("example.com/other-tool").map(String::as_str),
        Some("kept"),
        "another tool's annotation is left alone"
    );

    // What the policy refuses, each for its reason.
    refused(
        "m0's companion writes m1's Lease",
        patch_lease(&companion, &rt, "m1", palisade_annotation("x")),
        other_node,
    );
    refused(
        "m0's companion renews m0's Lease",
        patch_lease(
            &companion,
            &rt,
            "m0",
            json!({ "spec": { "renewTime": "2026-11-30T00:00:00.000000Z" } }),
        ),
        "never writes a Lease's spec",
    );
    refused(
        "m0's companion labels m0's Lease",
        patch_lease(
            &companion,
            &rt,
            "m0",
            json!({ "metadata": { "labels": { "example.com/kept": "no" } } }),
        ),
        "never changes a Lease's labels",
    );
    refused(
        "m0's companion removes another tool's annotation",
        patch_lease(
            &companion,
            &rt,
            "m0",
            json!({ "metadata": { "annotations": { "example.com/other-tool": null } } }),
        ),
        "only palisade.dev/ annotations",
    );
    refused(
        "a token bound to no pod writes m0's Lease",
        patch_lease(&unbound, &rt, "m0", palisade_annotation("x")),
        "this token names no node",
    );
    // RBAC refuses the rest.
    let leases_as_companion: Api<Lease> = Api::namespaced(companion.clone(), "kube-node-lease");
    refused(
        "m0's companion deletes m0's Lease",
        rt.block_on(leases_as_companion.delete("m0", &DeleteParams::default()))
            .map(|_| ())
            .map_err(|e| server_message(&e)),
        "Forbidden",
    );
    let nodes_as_companion: Api<Node> = Api::all(companion.clone());
    refused(
        "m0's companion annotates its Node",
        rt.block_on(nodes_as_companion.patch(
            "m0",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "palisade.dev/x": "y" } } })),
        ))
        .map(|_| ())
        .map_err(|e| server_message(&e)),
        "Forbidden",
    );
    // What it needs: its Node's recovery challenge, and its own Lease's Palisade annotations.
    rt.block_on(nodes_as_companion.get("m0"))
        .expect("the companion reads its Node");
    patch_lease(&companion, &rt, "m0", palisade_annotation("mine"))
        .expect("the companion writes its own Lease's Palisade annotations");
    // The kubelet's renewals (here the admin's) are not the companion's: not matched.
    patch_lease(
        &c,
        &rt,
        "m0",
        json!({ "spec": { "renewTime": "2026-11-30T00:00:01.000000Z" } }),
    )
    .expect("the kubelet renews its Lease");
    let lease = rt.block_on(leases.get("m0")).unwrap();
    assert_eq!(
        lease
            .metadata
            .labels
            .unwrap_or_default()
            .get("example.com/kept")
            .map(String::as_str),
        Some("yes")
    );
}
