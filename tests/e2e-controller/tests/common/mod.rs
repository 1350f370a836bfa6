//! Helpers shared by the controller e2e tests: a lab whose machines run `palisade-node`, the
//! controller as a child process, Palisade objects, and polling with deadlines.
#![allow(dead_code)]

pub mod no_power_off;
pub mod sim;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use palisade_lab::Lab;
use palisade_model::NodeFence;
use serde_json::json;

pub use palisade_test_support::eventually;

/// Namespace of the controller's Lease and of the credential Secrets.
pub const SYSTEM_NS: &str = "palisade-system";

/// Starts a lab whose machines each run `palisade-node` (restarted by a small loop).
pub fn start_lab(machines: usize, pdu: bool) -> Lab {
    palisade_scenario::lab_with_agents(machines, pdu, &Default::default()).expect("lab starts")
}

/// A lab with nothing but a control plane of Kubernetes `kube` (no machines, no PDU).
pub fn control_plane_lab(kube: palisade_lab::KubeVersion) -> Lab {
    Lab::start(palisade_lab::LabConfig {
        kube: Some(kube),
        machines: 0,
        pdu: false,
        ..Default::default()
    })
    .expect("lab starts")
}

/// A tokio runtime for the test's API calls.
pub fn rt() -> tokio::runtime::Runtime {
    palisade_scenario::runtime().expect("runtime")
}

/// The admin client.
pub fn client(lab: &Lab, rt: &tokio::runtime::Runtime) -> Client {
    palisade_scenario::admin_client(lab, rt).expect("admin client")
}

/// Creates a namespace and waits for its default ServiceAccount token.
pub fn namespace(c: &Client, rt: &tokio::runtime::Runtime, name: &str) {
    palisade_scenario::namespace(c, rt, name).expect("namespace");
}

/// Waits until every machine's Node is Ready.
pub fn wait_nodes_ready(lab: &Lab, c: &Client, rt: &tokio::runtime::Runtime) {
    palisade_scenario::wait_nodes_ready(lab, c, rt).expect("nodes Ready");
}

/// Creates a Secret in the system namespace.
pub fn secret(c: &Client, rt: &tokio::runtime::Runtime, name: &str, data: &[(&str, &str)]) {
    palisade_scenario::secret(c, rt, name, data).expect("create secret");
}

/// The test policy: fast detection (Suspect 2 s, Unhealthy 4 s), no forgiveness, every silent
/// node is worth fencing, default quorum guard (40 %: 1 of 3 may be silent).
pub fn policy(c: &Client, rt: &tokio::runtime::Runtime) {
    policy_with(c, rt, json!({}));
}

/// The test policy with extra spec fields (for example `{"recovery": {"powerOn": true}}`).
pub fn policy_with(c: &Client, rt: &tokio::runtime::Runtime, extra: serde_json::Value) {
    let mut spec = json!({
        "detection": {"suspectAfterSeconds": 2, "unhealthyAfterSeconds": 4},
        "forgiveness": {"respectTolerations": false, "defaultSeconds": 0},
        "fenceWhen": "Always",
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    palisade_scenario::policy(c, rt, "lab", spec).expect("FencingPolicy created");
}

/// The IPMI device URL of machine `i`.
pub fn ipmi_url(lab: &Lab, i: usize) -> String {
    palisade_scenario::ipmi_url(lab, i)
}

/// The PDU device URL of machine `i` (SNMP v2c, APC profile).
pub fn pdu_url(lab: &Lab, i: usize) -> String {
    palisade_scenario::pdu_url(lab, i).expect("lab has a PDU")
}

/// The Secret `pdu` with the lab PDU's read-write community (what `pdu_url` devices name).
pub fn pdu_secret(lab: &Lab, c: &Client, rt: &tokio::runtime::Runtime) {
    let info = lab.pdu().expect("lab has a PDU").info().clone();
    let community = palisade_lab::PduInfo::secret(&info.community_rw_file).unwrap();
    secret(c, rt, "pdu", &[("community", &community)]);
}

/// m0's FenceTarget: one Redfish level, the ComputerSystem of m0 (pinned by its UUID) served
/// at `127.0.0.1:port`, its certificate trusted through the CA in the device's Secret
/// (`ca=secret`, not a file on the controller's host) with the lab's `admin` login.
pub fn redfish_target_m0(
    lab: &Lab,
    c: &Client,
    rt: &tokio::runtime::Runtime,
    port: u16,
    password: &str,
    ca_pem: &str,
) {
    secret(
        c,
        rt,
        "bmc-redfish",
        &[("password", password), ("caBundle", ca_pem)],
    );
    let url = format!(
        "redfish+https://admin@127.0.0.1:{port}?uuid={}&ca=secret",
        lab.machines()[0].system_uuid(),
    );
    fence_target(
        c,
        rt,
        "m0",
        vec![("redfish", vec![device(&url, "bmc-redfish")])],
    );
}

/// One power device: (url, secret name).
pub fn device(url: &str, secret: &str) -> serde_json::Value {
    palisade_scenario::device(url, "Power", secret)
}

/// Creates the FenceTarget of `node` with these levels (name, devices).
pub fn fence_target(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    node: &str,
    levels: Vec<(&str, Vec<serde_json::Value>)>,
) {
    palisade_scenario::fence_target(c, rt, node, levels).expect("create FenceTarget");
}

/// IPMI FenceTargets for every machine, with the right passwords.
pub fn ipmi_targets(lab: &Lab, c: &Client, rt: &tokio::runtime::Runtime) {
    for (i, m) in lab.machines().iter().enumerate() {
        let name = format!("bmc-{}", m.name());
        secret(c, rt, &name, &[("password", &m.bmc().password().unwrap())]);
        fence_target(
            c,
            rt,
            m.name(),
            vec![("ipmi", vec![device(&ipmi_url(lab, i), &name)])],
        );
    }
}

/// The controller, as a child process; killed on drop.
pub struct Controller {
    child: Child,
    /// Its log file.
    pub log: PathBuf,
    /// Its metrics address.
    pub metrics_addr: String,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `palisade-controller` with the admin kubeconfig.
pub fn start_controller(lab: &Lab, identity: &str) -> Controller {
    start_controller_with_env(lab, identity, &[])
}

/// [`start_controller`] with extra environment (e.g. the firmware-bridge client identity).
pub fn start_controller_with_env(lab: &Lab, identity: &str, env: &[(&str, String)]) -> Controller {
    let cp = lab.control_plane().expect("control plane");
    start_controller_as(lab, identity, cp.admin_kubeconfig(), env, &[])
}

/// The controller's ServiceAccount, as `controller/manifests/rbac.yaml` names it.
pub const CONTROLLER_SA: &str = "system:serviceaccount:palisade-system:palisade-controller";

/// Applies `controller/manifests/rbac.yaml` (ServiceAccount, ClusterRole and Role with their
/// bindings) as the project ships it.
pub fn apply_rbac(c: &Client, rt: &tokio::runtime::Runtime) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    const RBAC: &str = include_str!("../../../../controller/manifests/rbac.yaml");
    fn create<K>(api: kube::Api<K>, doc: serde_json::Value, rt: &tokio::runtime::Runtime)
    where
        K: kube::Resource
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + k8s_openapi::serde::Serialize
            + std::fmt::Debug,
    {
        let obj: K = serde_json::from_value(doc).expect("an RBAC object");
        rt.block_on(api.create(&PostParams::default(), &obj))
            .expect("create RBAC object");
    }
    for text in RBAC.split("\n---") {
        let doc: serde_json::Value = serde_saphyr::from_str(text).expect("rbac.yaml parses");
        if doc.is_null() {
            continue;
        }
        let ns = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or(SYSTEM_NS)
            .to_string();
        match doc["kind"].as_str() {
            Some("ServiceAccount") => {
                create::<ServiceAccount>(Api::namespaced(c.clone(), &ns), doc, rt)
            }
            Some("ClusterRole") => create::<ClusterRole>(Api::all(c.clone()), doc, rt),
            Some("ClusterRoleBinding") => {
                create::<ClusterRoleBinding>(Api::all(c.clone()), doc, rt)
            }
            Some("Role") => create::<Role>(Api::namespaced(c.clone(), &ns), doc, rt),
            Some("RoleBinding") => create::<RoleBinding>(Api::namespaced(c.clone(), &ns), doc, rt),
            other => panic!("rbac.yaml: unexpected kind {other:?}"),
        }
    }
}

/// A kubeconfig that authenticates as the controller's ServiceAccount (a client certificate
/// from the lab CA whose common name is [`CONTROLLER_SA`]; RBAC matches ServiceAccount subjects
/// by that user name), so the controller runs with exactly the shipped permissions.
pub fn controller_sa_kubeconfig(lab: &Lab) -> PathBuf {
    kubeconfig_as(lab, CONTROLLER_SA, "controller-sa")
}

/// A kubeconfig that authenticates as user `user` (a client certificate from the lab CA, no
/// groups beyond `system:authenticated`), written to `<lab dir>/<file>.kubeconfig`.
pub fn kubeconfig_as(lab: &Lab, user: &str, file: &str) -> PathBuf {
    use base64::Engine;
    let cp = lab.control_plane().expect("control plane");
    let admin = std::fs::read_to_string(cp.admin_kubeconfig()).expect("admin kubeconfig");
    let mut cfg: serde_json::Value = serde_saphyr::from_str(&admin).expect("kubeconfig parses");
    let id = lab
        .ca()
        .issue_client_cert(user, None)
        .expect("issue the client certificate");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let user = &mut cfg["users"][0]["user"];
    user["client-certificate-data"] = b64(&id.cert_pem).into();
    user["client-key-data"] = b64(&id.key_pem).into();
    let path = lab.dir().join(format!("{file}.kubeconfig"));
    palisade_lab::write_secret(&path, serde_saphyr::to_string(&cfg).unwrap().as_bytes())
        .expect("write the kubeconfig");
    path
}

/// Starts `palisade-controller` with `kubeconfig`, extra environment and extra arguments (a
/// `--resync` among them replaces the lab's 250 ms).
pub fn start_controller_as(
    lab: &Lab,
    identity: &str,
    kubeconfig: &std::path::Path,
    env: &[(&str, String)],
    args: &[String],
) -> Controller {
    let bin = palisade_lab::bin_path("palisade-controller")
        .expect("build the controller first: cargo build -p palisade-controller --bins");
    let log = lab.dir().join(format!("controller-{identity}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--namespace",
            SYSTEM_NS,
            "--lease-name",
            "palisade-controller",
            "--identity",
            identity,
            "--metrics-addr",
            &metrics_addr,
            "--lease-duration",
            "4s",
            "--renew-interval",
            "1s",
        ])
        .args(
            (!args.iter().any(|a| a == "--resync"))
                .then_some(["--resync", "250ms"])
                .into_iter()
                .flatten(),
        )
        .args(args)
        .env("RUST_LOG", "info,kube=warn,palisade_controller=debug")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("spawn palisade-controller");
    Controller {
        child,
        log,
        metrics_addr,
    }
}

impl Controller {
    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Its exit status, once it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// `GET /metrics`, if it answers.
    pub fn metrics(&self) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.metrics_addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        Some(body)
    }

    /// The status code of `GET /readyz`, if it answers.
    pub fn readyz(&self) -> Option<u16> {
        readyz_at(&self.metrics_addr)
    }

    /// The `palisade_ticks_total` counter.
    pub fn ticks(&self) -> Option<u64> {
        self.metrics()?
            .lines()
            .find_map(|l| l.strip_prefix("palisade_ticks_total "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Waits until the controller has run `n` more detection ticks (synchronises on the
    /// controller's progress, not on wall-clock time).
    pub fn wait_ticks(&self, n: u64) {
        let start = eventually("controller metrics", Duration::from_secs(30), || {
            self.ticks()
        });
        eventually(
            &format!("{n} more controller ticks"),
            Duration::from_secs(120),
            || self.ticks().filter(|t| *t >= start + n).map(|_| ()),
        );
    }

    /// The controller's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `Some` once Node `name` reports Ready (read from the API).
pub fn node_ready(c: &Client, rt: &tokio::runtime::Runtime, name: &str) -> Option<()> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(c.clone());
    let node = rt.block_on(nodes.get(name)).ok()?;
    node.status?
        .conditions?
        .into_iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
        .then_some(())
}

/// Every NodeFence for `node`.
/// What `c`'s user may do in `ns`, one `verb group/resource[:name]` per permission, plus
/// `nonResource verb path` lines.
pub fn rules_review(
    c: &kube::Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
) -> std::collections::BTreeSet<String> {
    let review = k8s_openapi::api::authorization::v1::SelfSubjectRulesReview {
        spec: k8s_openapi::api::authorization::v1::SelfSubjectRulesReviewSpec {
            namespace: Some(ns.to_string()),
        },
        ..Default::default()
    };
    let api: Api<k8s_openapi::api::authorization::v1::SelfSubjectRulesReview> = Api::all(c.clone());
    let status = rt
        .block_on(api.create(&PostParams::default(), &review))
        .expect("SelfSubjectRulesReview")
        .status
        .expect("a review has a status");
    assert!(
        !status.incomplete,
        "the review is complete: {:?}",
        status.evaluation_error
    );
    let mut out = std::collections::BTreeSet::new();
    for r in &status.resource_rules {
        let groups = r.api_groups.clone().unwrap_or_default();
        let resources = r.resources.clone().unwrap_or_default();
        let names = r.resource_names.clone().unwrap_or_default();
        for verb in &r.verbs {
            for g in &groups {
                let g = if g.is_empty() { "core" } else { g.as_str() };
                for res in &resources {
                    if names.is_empty() {
                        out.insert(format!("{verb} {g}/{res}"));
                    }
                    for n in &names {
                        out.insert(format!("{verb} {g}/{res}:{n}"));
                    }
                }
            }
        }
    }
    for r in &status.non_resource_rules {
        for verb in &r.verbs {
            for u in r.non_resource_urls.clone().unwrap_or_default() {
                out.insert(format!("nonResource {verb} {u}"));
            }
        }
    }
    out
}

/// What one run of `kubectl palisade` returned.
pub struct PluginOut {
    /// Its exit code (-1: killed by a signal).
    pub code: i32,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl PluginOut {
    /// Standard output, then standard error.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// The plugin with `KUBECONFIG` set to `kubeconfig` (a list of files, as kubectl takes it).
pub fn plugin_with(kubeconfig: &std::ffi::OsStr, args: &[&str]) -> PluginOut {
    let bin = palisade_lab::bin_path("kubectl-palisade")
        .expect("build the plugin first: cargo build -p kubectl-palisade");
    let out = std::process::Command::new(bin)
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl-palisade");
    let o = PluginOut {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!(
        "$ kubectl palisade {}\n{}{}(exit {})",
        args.join(" "),
        o.stdout,
        o.stderr,
        o.code
    );
    o
}

/// When the API server received the audited request `e`.
pub fn audit_at(e: &palisade_lab::control_plane::AuditEvent) -> k8s_openapi::jiff::Timestamp {
    e.request_received_timestamp
        .parse()
        .unwrap_or_else(|err| panic!("audit timestamp {:?}: {err}", e.request_received_timestamp))
}

/// Asserts that the VolumeAttachment `va` (UID `uid`) was released after the fence `st` was
/// verified: Palisade recorded deleting it, or, on a release with the out-of-service taint
/// (Kubernetes 1.26 and later), the attach-detach controller deleted it first once the pod was
/// gone, after the fence was verified (the API server's audit log says who, and when).
pub fn assert_attachment_released(
    lab: &Lab,
    st: &palisade_model::nodefence::NodeFenceStatus,
    va: &str,
    uid: &str,
) {
    if st.release.attachments.iter().any(|a| a.uid == uid) {
        return;
    }
    let fenced = st
        .transitions
        .iter()
        .find(|t| t.phase == palisade_model::nodefence::Phase::Fenced)
        .expect("a Fenced transition")
        .at
        .0;
    let audit = lab.control_plane().expect("a control plane").audit();
    let deletes: Vec<_> = audit
        .iter()
        .filter(|e| e.verb == "delete" && e.on("volumeattachments", va))
        .collect();
    let by_kubernetes = deletes.iter().find(|e| {
        e.succeeded()
            && (e.user.username == "system:kube-controller-manager"
                || e.user.username.ends_with(":attachdetach-controller"))
    });
    let Some(e) = by_kubernetes else {
        panic!(
            "VolumeAttachment {va} released neither by Palisade ({:?}) nor by the attach-detach controller ({deletes:?})",
            st.release.attachments
        );
    };
    assert!(
        audit_at(e) >= fenced,
        "the attach-detach controller deleted {va} at {} only after the fence was verified at {fenced}",
        audit_at(e)
    );
    assert!(
        deletes.iter().all(|d| audit_at(d) >= fenced),
        "nothing deletes {va} before the fence is verified: {deletes:?}"
    );
}

/// Deletes NodeFence `name` as a person abandoning it would: the delete, then its finalizer
/// ([`palisade_model::NODEFENCE_FINALIZER`]) removed by hand, so it goes even though it still
/// holds its node (a test harness clearing a scenario, or a controller that is gone).
pub fn abandon_fence(c: &Client, rt: &tokio::runtime::Runtime, name: &str) {
    let api: Api<NodeFence> = Api::all(c.clone());
    let _ = rt.block_on(api.delete(name, &Default::default()));
    let _ = rt.block_on(api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
    ));
}

pub fn fences_for(c: &Client, rt: &tokio::runtime::Runtime, node: &str) -> Vec<NodeFence> {
    palisade_scenario::fences_for(c, rt, node)
}

/// Events in `ns` whose reason is `reason` about an object named `name`.
pub fn events(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    name: &str,
    reason: &str,
) -> Vec<Event> {
    palisade_scenario::events(c, rt, ns, name, reason).unwrap_or_default()
}

/// Sets `spec.unschedulable` on a node.
pub fn cordon(c: &Client, rt: &tokio::runtime::Runtime, node: &str, on: bool) {
    palisade_scenario::cordon(c, rt, node, on).expect("cordon");
}

/// Creates a long-running pod bound to `node` (nodeName set: no scheduler involved).
pub fn pinned_pod(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    name: &str,
    node: &str,
) -> Pod {
    let api: Api<Pod> = Api::namespaced(c.clone(), ns);
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "app", "image": "host", "command": ["/bin/sh", "-c", "exec sleep 100000"]}]
        }
    }))
    .unwrap();
    eventually("pod created", Duration::from_secs(30), || {
        rt.block_on(api.create(&PostParams::default(), &p)).ok()
    })
}

/// A lab of `machines` (node agents running, Nodes Ready, a PDU if `pdu`), its runtime, an
/// admin client, and the system and `app` namespaces.
pub fn lab_ready(machines: usize, pdu: bool) -> (Lab, tokio::runtime::Runtime, Client) {
    ready(start_lab(machines, pdu))
}

/// [`lab_ready`] on the Kubernetes release `kube`, whatever `PALISADE_KUBE` says.
pub fn lab_ready_on(
    kube: palisade_lab::KubeVersion,
    machines: usize,
    pdu: bool,
) -> (Lab, tokio::runtime::Runtime, Client) {
    let agents = palisade_scenario::AgentOptions {
        kube: Some(kube),
        ..Default::default()
    };
    ready(palisade_scenario::lab_with_agents(machines, pdu, &agents).expect("lab starts"))
}

fn ready(lab: Lab) -> (Lab, tokio::runtime::Runtime, Client) {
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    namespace(&c, &rt, "app");
    (lab, rt, c)
}

/// Creates `app/worker` bound to `node` and waits until it runs.
pub fn running_worker(c: &Client, rt: &tokio::runtime::Runtime, node: &str) -> Pod {
    let pod = pinned_pod(c, rt, "app", "worker", node);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");
    eventually(
        &format!("worker Running on {node}"),
        Duration::from_secs(90),
        || {
            let p = rt.block_on(pods.get_opt("worker")).ok().flatten()?;
            (pod_phase(&p) == "Running").then_some(())
        },
    );
    pod
}

/// The pod's phase.
pub fn pod_phase(p: &Pod) -> String {
    palisade_scenario::pod_phase(p)
}

/// Seconds between two API timestamps.
pub fn secs_between(a: k8s_openapi::jiff::Timestamp, b: k8s_openapi::jiff::Timestamp) -> f64 {
    b.duration_since(a).as_secs_f64()
}

/// Prints the NodeFence timeline relative to `t0`.
pub fn print_timeline(nf: &NodeFence, t0: k8s_openapi::jiff::Timestamp) {
    eprintln!("NodeFence {} for {}:", nf.name_any(), nf.spec.node_name);
    if let Some(c) = nf.metadata.creation_timestamp.as_ref() {
        eprintln!("  +{:6.2}s  created (decision)", secs_between(t0, c.0));
    }
    for t in nf.status.iter().flat_map(|s| &s.transitions) {
        eprintln!(
            "  +{:6.2}s  {:<10} {}",
            secs_between(t0, t.at.0),
            t.phase.as_str(),
            t.message
        );
    }
    for e in nf.status.iter().flat_map(|s| &s.evidence) {
        eprintln!(
            "  evidence: level {} {} {:?}: {}",
            e.level, e.device, e.kind, e.observed
        );
    }
    for a in nf.status.iter().flat_map(|s| &s.attempts) {
        eprintln!(
            "  attempt: level {} {} {:?} -> {:?} (token {}): {}",
            a.level, a.device, a.action, a.outcome, a.token, a.message
        );
    }
}

/// The holder and fencing token of the controller's leader Lease.
pub fn holder_and_token(lease: &k8s_openapi::api::coordination::v1::Lease) -> (String, i64) {
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default();
    let token = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("palisade.dev/fencing-token"))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    (holder, token)
}

/// The status code of `GET /readyz` on a controller's metrics address, if it answers.
pub fn readyz_at(addr: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = String::new();
    s.read_to_string(&mut head).ok()?;
    head.split_whitespace().nth(1)?.parse().ok()
}

/// Runs kubectl as the lab's admin; returns its stdout (whatever its exit status).
pub fn kubectl(lab: &Lab, args: &[&str]) -> String {
    kubectl_output(lab, args).stdout
}

/// What a kubectl run printed, and how it ended.
pub struct KubectlOutput {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Whether it exited 0.
    pub ok: bool,
}

/// Runs kubectl as the lab's admin.
pub fn kubectl_output(lab: &Lab, args: &[&str]) -> KubectlOutput {
    let out = palisade_scenario::in_cluster::kubectl(lab, args).unwrap_or_else(|e| panic!("{e:#}"));
    KubectlOutput {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        ok: out.status.success(),
    }
}

/// The fence went through every phase once, in order, and ended `Released` (no failure, no
/// phase entered twice: what "completed once" means).
pub fn assert_each_phase_once(st: &palisade_model::nodefence::NodeFenceStatus) {
    use palisade_model::nodefence::Phase;
    let phases: Vec<Phase> = st.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::Pending,
            Phase::Fencing,
            Phase::Fenced,
            Phase::Releasing,
            Phase::Released
        ],
        "each phase entered once, in order"
    );
}

/// The StatefulSet `app/db` (one replica whose container only sleeps, a host image), placed
/// on m0 (m1 and m2 are cordoned until it runs there); returns its Running pod.
pub fn db_on_m0(c: &Client, rt: &tokio::runtime::Runtime) -> Pod {
    db_on_m0_running(
        c,
        rt,
        json!({"name": "app", "image": "host",
               "command": ["/bin/sh", "-c", "exec sleep 100000"]}),
        false,
    )
}

/// [`db_on_m0`] with `container` as the StatefulSet's only container, on the host's network
/// when `host_network` is set (a stock machine's pod then needs no CNI address).
pub fn db_on_m0_running(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    container: serde_json::Value,
    host_network: bool,
) -> Pod {
    use k8s_openapi::api::apps::v1::StatefulSet;
    cordon(c, rt, "m1", true);
    cordon(c, rt, "m2", true);
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "app"},
        "spec": {
            "replicas": 1, "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "hostNetwork": host_network,
                    "terminationGracePeriodSeconds": 5,
                    "containers": [container]
                }
            }
        }
    }))
    .unwrap();
    rt.block_on(
        Api::<StatefulSet>::namespaced(c.clone(), "app").create(&PostParams::default(), &sts),
    )
    .expect("create StatefulSet");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");
    let old = eventually("db-0 Running on m0", Duration::from_secs(120), || {
        let p = rt.block_on(pods.get_opt("db-0")).ok().flatten()?;
        let on_m0 = p.spec.as_ref()?.node_name.as_deref() == Some("m0");
        (on_m0 && pod_phase(&p) == "Running").then_some(p)
    });
    cordon(c, rt, "m1", false);
    cordon(c, rt, "m2", false);
    old
}

/// Waits (at most `timeout`) for a NodeFence of `node` in `phase`; returns it.
pub fn fence_in_phase(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    node: &str,
    phase: palisade_model::nodefence::Phase,
    timeout: Duration,
) -> NodeFence {
    eventually(&format!("{node}'s NodeFence {phase:?}"), timeout, || {
        fences_for(c, rt, node)
            .into_iter()
            .find(|f| f.status.as_ref().is_some_and(|s| s.phase == phase))
    })
}

/// Waits (at most `timeout`) for `app/db-0` recreated (a UID other than `old_uid`) and Running
/// on a machine other than m0; returns it.
pub fn db_replaced_elsewhere(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    old_uid: &str,
    timeout: Duration,
) -> Pod {
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");
    eventually("db-0 recreated and Running elsewhere", timeout, || {
        let p = rt.block_on(pods.get_opt("db-0")).ok().flatten()?;
        let node = p.spec.as_ref()?.node_name.clone()?;
        (p.uid().as_deref() != Some(old_uid) && node != "m0" && pod_phase(&p) == "Running")
            .then_some(p)
    })
}

/// Asserts that `nf`'s verified evidence is a trusted self-fence (`SelfFenceTimeout`).
pub fn assert_released_on_self_fence(nf: &NodeFence) {
    let evidence: Vec<palisade_model::nodefence::EvidenceKind> = nf
        .status
        .iter()
        .flat_map(|s| &s.evidence)
        .map(|e| e.kind)
        .collect();
    assert!(
        evidence.contains(&palisade_model::nodefence::EvidenceKind::SelfFenceTimeout),
        "released on the self-fence: {evidence:?}"
    );
}

/// Whether the lab's API server evaluates the CRDs' CEL rules (1.25 and later), so that the
/// controller installs them and cross-field mistakes are refused at the door.
pub fn server_has_cel(c: &Client, rt: &tokio::runtime::Runtime) -> bool {
    server_minor(c, rt) >= palisade_model::CEL_MINOR
}

/// The minor version the lab's API server reports (0 if it reports none).
pub fn server_minor(c: &Client, rt: &tokio::runtime::Runtime) -> u32 {
    let v = rt.block_on(c.apiserver_version()).expect("/version");
    palisade_model::parse_minor(&v.minor).unwrap_or(0)
}

/// The headline's set-up: the shipped RBAC, the controller (`identity`) running as its
/// ServiceAccount, the default policy, IPMI targets, the StatefulSet's pod `db-0` Running on
/// m0 and a VolumeAttachment `db-data-m0` naming m0, as a CSI attacher would have made it (no
/// CSI driver in the lab: the object is what is released).
pub fn controller_and_db_on_m0(
    lab: &Lab,
    c: &Client,
    rt: &tokio::runtime::Runtime,
    identity: &str,
) -> (
    Controller,
    Pod,
    k8s_openapi::api::storage::v1::VolumeAttachment,
) {
    apply_rbac(c, rt);
    let ctl = start_controller_as(lab, identity, &controller_sa_kubeconfig(lab), &[], &[]);
    policy(c, rt);
    ipmi_targets(lab, c, rt);
    let db = db_on_m0(c, rt);
    let vas: Api<k8s_openapi::api::storage::v1::VolumeAttachment> = Api::all(c.clone());
    let va = serde_json::from_value(json!({
        "metadata": {"name": "db-data-m0"},
        "spec": {"attacher": "lab.palisade.dev", "nodeName": "m0",
                 "source": {"persistentVolumeName": "db-data"}}
    }))
    .unwrap();
    let va = rt
        .block_on(vas.create(&PostParams::default(), &va))
        .expect("create VolumeAttachment");
    (ctl, db, va)
}

/// A lab of one QEMU machine running `command`, whose i6300esb watchdog driver is loaded with
/// a 30 s heartbeat and `nowayout` and powers the VM off on expiry: the 30 s is far longer
/// than any controller here waits, so only the guest's own `WDIOC_SETTIMEOUT` makes the
/// watchdog fire in time.
pub fn qemu_watchdog_lab(command: String) -> Lab {
    Lab::start(palisade_lab::LabConfig {
        machines: 1,
        control_plane: true,
        pdu: false,
        machine_command: command,
        machine_kind: palisade_lab::MachineKind::Qemu,
        qemu: palisade_lab::QemuConfig {
            watchdog_seconds: 30,
            watchdog_action: palisade_lab::WatchdogAction::Poweroff,
            ..Default::default()
        },
        ..Default::default()
    })
    .expect("lab with a QEMU machine starts")
}

/// Watches the process `pid` (a VM's QEMU) from the host; the thread returns the first moment
/// it was seen gone, or `None` after 5 minutes of 20 ms polls.
pub fn watch_gone(pid: i32) -> std::thread::JoinHandle<Option<k8s_openapi::jiff::Timestamp>> {
    std::thread::spawn(move || {
        for _ in 0..15_000 {
            if !palisade_lab::process::alive(pid) {
                return Some(k8s_openapi::jiff::Timestamp::now());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    })
}
