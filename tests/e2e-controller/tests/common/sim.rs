//! Simulated nodes for decision-guard scenarios: a lab whose machines run only
//! `sleep infinity` (each with a real `ipmi_sim` BMC and a real power state), Node and
//! `kube-node-lease` Lease objects created by the test, and a background task that renews the
//! Leases of the nodes that should look alive. A node whose Lease stops being renewed goes
//! silent for the controller exactly as a dead node does; its `FenceTarget` points at a real
//! BMC, so a fence really powers a machine off.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, ResourceExt};
use palisade_lab::{Lab, LabConfig};
use palisade_model::nodefence::Phase;
use palisade_model::{FenceTarget, FencingPolicy, NodeFence};
use parking_lot::Mutex;
use serde_json::json;

use super::{eventually, Controller};

/// Namespace of node heartbeat Leases.
pub const LEASE_NS: &str = "kube-node-lease";

/// A lab with `machines` machines that run nothing but `sleep infinity`: each has a real BMC
/// and power state, and no node agent.
pub fn bare_lab(machines: usize) -> Lab {
    Lab::start(LabConfig {
        machines,
        control_plane: true,
        pdu: false,
        machine_command: "exec sleep infinity".into(),
        ..Default::default()
    })
    .expect("lab starts")
}

/// Renews the Leases of the nodes marked alive, every 300 ms, on the test's runtime.
pub struct Heartbeats {
    alive: Arc<Mutex<BTreeSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeats {
    /// Starts the renewal task.
    pub fn start(c: &Client, rt: &tokio::runtime::Runtime) -> Heartbeats {
        let alive: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let set = alive.clone();
        let leases: Api<Lease> = Api::namespaced(c.clone(), LEASE_NS);
        let nodes: Api<Node> = Api::all(c.clone());
        let task = rt.spawn(async move {
            loop {
                let names: Vec<String> = set.lock().iter().cloned().collect();
                for n in names {
                    // As a node agent does: the recovery challenge is read from the Node
                    // first, then the renewal answers it with the (empty, complete) inventory
                    // the node was created with.
                    let challenge = nodes.get_opt(&n).await.ok().flatten().and_then(|node| {
                        node.metadata
                            .annotations?
                            .get(palisade_model::advertise::RECOVERY_CHALLENGE)
                            .cloned()
                    });
                    let patch = json!({
                        "metadata": {"annotations": {
                            palisade_model::advertise::CHALLENGE_ANSWERED: challenge,
                        }},
                        "spec": {"renewTime": MicroTime(Timestamp::now())},
                    });
                    let _ = leases
                        .patch(&n, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Heartbeats { alive, task }
    }

    /// Keeps renewing `node`'s Lease (`true`) or stops (`false`: the node goes silent).
    pub fn set_alive(&self, node: &str, alive: bool) {
        let mut set = self.alive.lock();
        if alive {
            set.insert(node.to_string());
        } else {
            set.remove(node);
        }
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One simulated node: its name, labels, annotations, and the machine whose BMC fences it
/// (`None`: a node with no FenceTarget, used only to keep quorum and zones alive).
pub struct SimNode<'a> {
    /// Node name.
    pub name: &'a str,
    /// Node labels.
    pub labels: &'a [(&'a str, &'a str)],
    /// Node annotations.
    pub annotations: &'a [(&'a str, &'a str)],
    /// Lease annotations (what a node agent advertises with each renewal; kept by renewals).
    pub lease_annotations: &'a [(&'a str, &'a str)],
    /// Index of the lab machine whose BMC is this node's only fencing level.
    pub machine: Option<usize>,
}

impl<'a> SimNode<'a> {
    /// A node without labels or annotations.
    pub fn new(name: &'a str, machine: Option<usize>) -> Self {
        SimNode {
            name,
            labels: &[],
            annotations: &[],
            lease_annotations: &[],
            machine,
        }
    }
}

/// The test's view of one scenario's cluster.
pub struct Sim<'l> {
    /// The lab.
    pub lab: &'l Lab,
    /// The runtime API calls run on.
    pub rt: &'l tokio::runtime::Runtime,
    /// The admin client.
    pub c: Client,
    /// Lease renewals.
    pub hb: Heartbeats,
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl<'l> Sim<'l> {
    /// Connects to the lab and starts the Lease renewal task.
    pub fn new(lab: &'l Lab, rt: &'l tokio::runtime::Runtime) -> Sim<'l> {
        let c = super::client(lab, rt);
        let hb = Heartbeats::start(&c, rt);
        Sim { lab, rt, c, hb }
    }

    /// Creates the node, its Lease (renewed from now on), and, when it has a machine, its
    /// BMC credential Secret and IPMI FenceTarget.
    pub fn node(&self, n: &SimNode<'_>) {
        let nodes: Api<Node> = Api::all(self.c.clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": n.name, "labels": map(n.labels), "annotations": map(n.annotations)},
        }))
        .unwrap();
        self.rt
            .block_on(nodes.create(&PostParams::default(), &node))
            .unwrap_or_else(|e| panic!("create Node {}: {e}", n.name));
        let leases: Api<Lease> = Api::namespaced(self.c.clone(), LEASE_NS);
        // A simulated node runs no process: its "agent" advertises a complete, empty runtime
        // inventory (recovery's positive proof that released pods are gone).
        let mut annotations = map(n.lease_annotations);
        annotations
            .entry(palisade_model::advertise::RUNTIME_COMPLETE.to_string())
            .or_insert_with(|| "true".to_string());
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": n.name, "namespace": LEASE_NS, "annotations": annotations},
            "spec": {"holderIdentity": n.name, "leaseDurationSeconds": 40,
                     "renewTime": MicroTime(Timestamp::now())},
        }))
        .unwrap();
        self.rt
            .block_on(leases.create(&PostParams::default(), &lease))
            .unwrap_or_else(|e| panic!("create Lease {}: {e}", n.name));
        self.hb.set_alive(n.name, true);
        if let Some(i) = n.machine {
            let m = &self.lab.machines()[i];
            let secret = format!("bmc-{}", n.name);
            super::secret(
                &self.c,
                self.rt,
                &secret,
                &[("password", &m.bmc().password().unwrap())],
            );
            super::fence_target(
                &self.c,
                self.rt,
                n.name,
                vec![(
                    "ipmi",
                    vec![super::device(&super::ipmi_url(self.lab, i), &secret)],
                )],
            );
        }
    }

    /// Creates every node of a scenario.
    pub fn nodes(&self, nodes: &[SimNode<'_>]) {
        for n in nodes {
            self.node(n);
        }
    }

    /// Stops renewing `node`'s Lease: from now on it is silent.
    pub fn silence(&self, node: &str) {
        self.hb.set_alive(node, false);
    }

    /// Renews `node`'s Lease again.
    pub fn revive(&self, node: &str) {
        self.hb.set_alive(node, true);
    }

    /// Creates a FencingPolicy `name` with `spec`.
    pub fn policy(&self, name: &str, spec: serde_json::Value) {
        palisade_scenario::policy(&self.c, self.rt, name, spec).expect("FencingPolicy created");
    }

    /// Merge-patches the spec of FencingPolicy `name`.
    pub fn patch_policy(&self, name: &str, spec: serde_json::Value) {
        let api: Api<FencingPolicy> = Api::all(self.c.clone());
        self.rt
            .block_on(api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            ))
            .expect("patch FencingPolicy");
    }

    /// Merge-patches `node`'s annotations (`None` removes one).
    pub fn annotate(&self, node: &str, annotations: serde_json::Value) {
        let api: Api<Node> = Api::all(self.c.clone());
        self.rt
            .block_on(api.patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            ))
            .expect("annotate Node");
    }

    /// Creates a PriorityClass.
    pub fn priority_class(&self, name: &str, value: i32) {
        let api: Api<PriorityClass> = Api::all(self.c.clone());
        let pc: PriorityClass = serde_json::from_value(json!({
            "metadata": {"name": name}, "value": value,
        }))
        .unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &pc))
            .expect("create PriorityClass");
    }

    /// Creates a pod bound to `node` (it stays Pending: no agent runs it; the controller reads
    /// only its binding, labels, priority and tolerations). Returns it as created, with the
    /// priority the API server's admission resolved.
    pub fn pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        labels: &[(&str, &str)],
        priority_class: Option<&str>,
    ) -> Pod {
        let mut spec = json!({});
        if let Some(pc) = priority_class {
            spec["priorityClassName"] = json!(pc);
        }
        self.pod_with(ns, name, node, labels, spec)
    }

    /// Creates a pod bound to `node` that mounts PersistentVolumeClaim `claim`.
    pub fn pod_with_claim(&self, ns: &str, name: &str, node: &str, claim: &str) -> Pod {
        let spec =
            json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]});
        self.pod_with(ns, name, node, &[], spec)
    }

    /// Creates a pod bound to `node`, with `extra` merged into its spec.
    pub fn pod_with(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        labels: &[(&str, &str)],
        extra: serde_json::Value,
    ) -> Pod {
        let api: Api<Pod> = Api::namespaced(self.c.clone(), ns);
        let mut spec = json!({
            "nodeName": node,
            "containers": [{"name": "app", "image": "host", "command": ["sleep", "100000"]}],
        });
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            spec[k] = v;
        }
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": map(labels)},
            "spec": spec,
        }))
        .unwrap();
        eventually(
            &format!("pod {ns}/{name} created"),
            Duration::from_secs(30),
            || {
                self.rt
                    .block_on(api.create(&PostParams::default(), &p))
                    .ok()
            },
        )
    }

    /// Marks a pod Running and Ready through its status subresource, as a kubelet would (no
    /// agent runs it; the disruption controller counts it as healthy).
    pub fn mark_ready(&self, ns: &str, name: &str) {
        let api: Api<Pod> = Api::namespaced(self.c.clone(), ns);
        let now = Timestamp::now();
        let status = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)},
        ]}});
        self.rt
            .block_on(api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)))
            .expect("patch pod status");
    }

    /// Creates a PersistentVolumeClaim with these access modes (it stays Pending: the
    /// controller reads only its access modes).
    pub fn claim(&self, ns: &str, name: &str, access_mode: &str) {
        let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
            Api::namespaced(self.c.clone(), ns);
        let pvc = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"accessModes": [access_mode], "storageClassName": "none",
                     "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &pvc))
            .expect("create PVC");
    }

    /// Creates a PodDisruptionBudget (`policy/v1`, or `policy/v1beta1` on a 1.20 lab, which
    /// serves no other) and waits until the disruption controller reports
    /// `disruptionsAllowed == want`.
    pub fn pdb(
        &self,
        ns: &str,
        name: &str,
        match_labels: &[(&str, &str)],
        min_available: i32,
        want: i64,
    ) {
        let version = if super::server_minor(&self.c, self.rt) >= 21 {
            "v1"
        } else {
            "v1beta1"
        };
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "policy",
            version,
            "PodDisruptionBudget",
        ));
        let api: Api<DynamicObject> = Api::namespaced_with(self.c.clone(), ns, &ar);
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("policy/{version}"), "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"minAvailable": min_available,
                     "selector": {"matchLabels": map(match_labels)}},
        }))
        .unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &obj))
            .expect("create PDB");
        eventually(
            &format!("PDB {ns}/{name} status: disruptionsAllowed {want}"),
            Duration::from_secs(60),
            || {
                let p = self.rt.block_on(api.get(name)).ok()?;
                let st = p.data.get("status")?;
                // The status is computed once observedGeneration is set.
                st.get("observedGeneration")?;
                (st.get("disruptionsAllowed")
                    .and_then(|v| v.as_i64())
                    .unwrap_or(0)
                    == want)
                    .then_some(())
            },
        )
    }

    /// Every NodeFence for `node`.
    pub fn fences(&self, node: &str) -> Vec<NodeFence> {
        super::fences_for(&self.c, self.rt, node)
    }

    /// Waits until `node` has a NodeFence that reached `phase` (or a later one) and returns it.
    pub fn wait_fence_phase(&self, node: &str, phase: Phase, timeout: Duration) -> NodeFence {
        eventually(
            &format!("a NodeFence for {node} reached {}", phase.as_str()),
            timeout,
            || {
                self.fences(node)
                    .into_iter()
                    .find(|f| phase_at(f, phase).is_some())
            },
        )
    }

    /// Events in `default` about object `name` with reason `reason`.
    pub fn events(&self, name: &str, reason: &str) -> Vec<Event> {
        super::events(&self.c, self.rt, "default", name, reason)
    }

    /// Waits for an Event with `reason` about node `node` and returns its message.
    pub fn wait_event(&self, node: &str, reason: &str, timeout: Duration) -> String {
        let ev = eventually(&format!("Event {reason} on {node}"), timeout, || {
            self.events(node, reason).into_iter().next()
        });
        ev.message.unwrap_or_default()
    }

    /// Powers machine `i` back on through its BMC (ipmitool, password from the BMC's file,
    /// never in argv) and waits until it runs.
    pub fn power_on(&self, i: usize) {
        let m = &self.lab.machines()[i];
        let b = m.bmc();
        let out = std::process::Command::new("ipmitool")
            .args(["-I", "lanplus", "-C", "3", "-H"])
            .arg(b.host.to_string())
            .args(["-p", &b.port.to_string(), "-U", &b.user, "-f"])
            .arg(&b.password_file)
            .args(["chassis", "power", "on"])
            .output()
            .expect("run ipmitool");
        assert!(
            out.status.success(),
            "ipmitool power on {}: {}",
            m.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        m.wait_power(true, Duration::from_secs(30))
            .expect("machine powered on");
    }

    /// Removes a scenario's objects (its policy, NodeFences, Nodes, Leases and FenceTargets)
    /// and powers every machine back on, so the next scenario starts from a clean cluster.
    pub fn reset(&self, policy: &str, nodes: &[SimNode<'_>]) {
        let dp = DeleteParams::default();
        let policies: Api<FencingPolicy> = Api::all(self.c.clone());
        let _ = self.rt.block_on(policies.delete(policy, &dp));
        // With no policy nothing new starts; wait until no fence of ours is mid-action.
        let fences: Api<NodeFence> = Api::all(self.c.clone());
        let names: Vec<&str> = nodes.iter().map(|n| n.name).collect();
        eventually(
            "no NodeFence of the scenario mid-action",
            Duration::from_secs(60),
            || {
                let list = self.rt.block_on(fences.list(&ListParams::default())).ok()?;
                (!list.items.iter().any(|f| {
                    names.contains(&f.spec.node_name.as_str())
                        && f.status.as_ref().is_some_and(|s| {
                            matches!(s.phase, Phase::Fencing | Phase::Fenced | Phase::Releasing)
                        })
                }))
                .then_some(())
            },
        );
        let list = self
            .rt
            .block_on(fences.list(&ListParams::default()))
            .expect("list NodeFences");
        for f in list.items {
            if names.contains(&f.spec.node_name.as_str()) {
                super::abandon_fence(&self.c, self.rt, &f.name_any());
            }
        }
        let node_api: Api<Node> = Api::all(self.c.clone());
        let leases: Api<Lease> = Api::namespaced(self.c.clone(), LEASE_NS);
        let targets: Api<FenceTarget> = Api::all(self.c.clone());
        for n in nodes {
            self.hb.set_alive(n.name, false);
            let _ = self.rt.block_on(node_api.delete(n.name, &dp));
            let _ = self.rt.block_on(leases.delete(n.name, &dp));
            let _ = self.rt.block_on(targets.delete(n.name, &dp));
        }
        for i in 0..self.lab.machines().len() {
            if !self.lab.machines()[i].is_powered() {
                self.power_on(i);
            }
        }
    }
}

/// A scenario's FencingPolicy spec: only nodes labelled `palisade.test/scenario: <scenario>`,
/// fast detection (Suspect 2 s, Unhealthy 4 s), no forgiveness, every silent node worth
/// fencing, a quorum guard that tolerates every silent node (each scenario keeps a healthy
/// node, so the all-zones-down rule does not trip), two fences at once; `extra` replaces
/// top-level fields.
pub fn spec(scenario: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut s = json!({
        "nodeSelector": {"matchLabels": {"palisade.test/scenario": scenario}},
        "detection": {"suspectAfterSeconds": 2, "unhealthyAfterSeconds": 4},
        "forgiveness": {"respectTolerations": false, "defaultSeconds": 0},
        "fenceWhen": "Always",
        "limits": {"maxUnhealthy": "100%", "maxConcurrent": 2,
                   "perDomain": {"maxConcurrent": 2}},
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        s[k] = v;
    }
    s
}

/// When `nf` entered `phase` (controller clock), if it did.
pub fn phase_at(nf: &NodeFence, phase: Phase) -> Option<Timestamp> {
    nf.status
        .as_ref()?
        .transitions
        .iter()
        .find(|t| t.phase == phase)
        .map(|t| t.at.0)
}

/// The interval during which `nf` counted against the concurrency limits: from entering
/// Fencing to entering Released (`None` end: still in flight).
pub fn in_flight(nf: &NodeFence) -> (Timestamp, Option<Timestamp>) {
    (
        phase_at(nf, Phase::Fencing).expect("the fence entered Fencing"),
        phase_at(nf, Phase::Released),
    )
}

/// Whether two in-flight intervals overlap.
pub fn overlap(a: (Timestamp, Option<Timestamp>), b: (Timestamp, Option<Timestamp>)) -> bool {
    let ends_after = |end: Option<Timestamp>, start: Timestamp| end.is_none_or(|e| e > start);
    ends_after(a.1, b.0) && ends_after(b.1, a.0)
}

/// The value of one metric sample (`name{labels}` exactly as rendered), 0 when absent.
pub fn metric(ctl: &Controller, sample: &str) -> u64 {
    ctl.metrics()
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// The power state of every lab machine, in order.
pub fn powered(lab: &Lab) -> Vec<bool> {
    lab.machines().iter().map(|m| m.is_powered()).collect()
}

/// Waits (up to `timeout`) for a NodeFence of `node` that reached Releasing, checks that it was
/// released on the trusted self-fence, and returns when it began releasing.
pub fn released_on_self_fence(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    node: &str,
    timeout: Duration,
) -> Timestamp {
    let nf = super::eventually(
        &format!("{node} released on its trusted self-fence"),
        timeout,
        || {
            super::fences_for(c, rt, node)
                .into_iter()
                .find(|nf| phase_at(nf, Phase::Releasing).is_some())
        },
    );
    super::assert_released_on_self_fence(&nf);
    phase_at(&nf, Phase::Releasing).expect("Releasing")
}
