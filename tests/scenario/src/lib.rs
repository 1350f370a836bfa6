//! End-to-end scenarios on the lab, shared by the demo and the scenario tests: machines that
//! run `palisade-node`, the controller as a child process, the lab storage server in the hub,
//! and the Palisade objects (policy, fence targets, credential Secrets).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Secret, ServiceAccount};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use palisade_lab::{KubeVersion, Lab, LabConfig, MachineKind, QemuConfig};
use palisade_model::{FenceTarget, FencingPolicy, NodeFence};
use serde_json::json;

pub mod bridge;
pub mod headline;
pub mod in_cluster;

pub use bridge::{BridgeOptions, FirmwareBridge};

/// Namespace of the controller's Lease and of the credential Secrets.
pub const SYSTEM_NS: &str = "palisade-system";
/// Where the lab storage server's data path listens, inside the lab (the hub).
pub const STORAGE_DATA: &str = "10.213.0.1:7000";

/// How the machines' node agents run.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Lease duration, seconds (renewed every second).
    pub lease_seconds: u32,
    /// Self-fence after this many seconds without a renewed Lease.
    pub self_fence_seconds: f64,
    /// A lowered maximum restart backoff, seconds.
    pub max_restart_backoff_seconds: Option<u64>,
    /// More flags, appended as they are (no shell quoting: keep them to plain words).
    pub extra_args: Vec<String>,
    /// Watchdog-backed agents: on QEMU machines the guest gets an i6300esb watchdog (driver
    /// heartbeat 30 s, `nowayout`, resetting the VM) and the agent arms it with a 6 s timeout,
    /// petting it every second while it renews its Lease, and advertises it. A hung agent
    /// gets its machine reset. Namespace machines have no watchdog: [`lab_of_kind`] refuses.
    pub watchdog: bool,
    /// The peer check (`--peer-key-file`), as docs/install.md asks wherever the watchdog is
    /// armed: [`lab_of_kind`] writes one random key (0600) into every machine's directory,
    /// where the supervisor waits for it before it starts the agent. Without it the agent gets
    /// `--no-peer-check` (the agent's default is the peer check, with a key at a path the lab
    /// does not fill), unless [`AgentOptions::extra_args`] names `--peer-key-file` (a test's
    /// own key) or `--no-peer-check` itself.
    pub peer_check: bool,
    /// The lab's Kubernetes release: `None` takes `PALISADE_KUBE`, else the current one
    /// ([`KubeVersion::from_env`]).
    pub kube: Option<KubeVersion>,
    /// The lab's API server reaches etcd through a relay a test can slow
    /// ([`LabConfig::etcd_relay`]).
    pub etcd_relay: bool,
}

/// The key file of the peer check, in a machine's directory (`$PALISADE_MACHINE_DIR`).
pub const PEER_KEY_FILE: &str = "peer.key";

/// The watchdog timeout a watchdog-backed agent sets ([`AgentOptions::watchdog`]), seconds.
pub const AGENT_WATCHDOG_SECONDS: u32 = 6;

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            lease_seconds: 10,
            self_fence_seconds: 4.0,
            max_restart_backoff_seconds: None,
            extra_args: Vec::new(),
            watchdog: false,
            peer_check: false,
            kube: None,
            etcd_relay: false,
        }
    }
}

/// The boot command of a machine that runs `palisade-node` under a supervisor loop (as a
/// service manager would) that restarts it unless `<machine dir>/agent-stopped` exists (and,
/// with the peer check, only once the key is in the machine directory).
pub fn node_agent_command(o: &AgentOptions) -> Result<String> {
    let agent = palisade_lab::bin_path("palisade-node")?;
    let backoff = o
        .max_restart_backoff_seconds
        .map(|s| format!(" --max-restart-backoff {s}s"))
        .unwrap_or_default();
    let mut extra: String = o.extra_args.iter().map(|a| format!(" {a}")).collect();
    extra.push_str(&peer_check_args(o));
    if o.watchdog {
        extra.push_str(&format!(
            " --watchdog /dev/watchdog --watchdog-timeout {AGENT_WATCHDOG_SECONDS}s --watchdog-interval 1s"
        ));
    }
    Ok(format!(
        r#"D="$PALISADE_MACHINE_DIR"
mkdir -p "$D/node-state"
while true; do
  if [ ! -e "$D/agent-stopped" ]{wait_key}; then
    RUST_LOG=info,kube=warn '{agent}' --node-name "$PALISADE_MACHINE_NAME" --kubeconfig "$PALISADE_NODE_KUBECONFIG" \
      --address "$PALISADE_MACHINE_ADDRESS" --state-dir "$D/node-state" --image-store "$D/images" \
      --lease-duration {lease}s --renew-interval 1s --self-fence-after {fence}s{backoff}{extra} \
      --metrics-addr 127.0.0.1:10255 >> "$D/agent.log" 2>&1
  fi
  sleep 0.2
done"#,
        agent = agent.display(),
        wait_key = if o.peer_check {
            format!(" && [ -e \"$D/{PEER_KEY_FILE}\" ]")
        } else {
            String::new()
        },
        lease = o.lease_seconds,
        fence = o.self_fence_seconds,
    ))
}

/// The agent's peer-check flags beyond [`AgentOptions::extra_args`]: the machine's key with
/// [`AgentOptions::peer_check`], else `--no-peer-check` unless the extra flags already say
/// either.
fn peer_check_args(o: &AgentOptions) -> String {
    let names = |flag: &str| o.extra_args.iter().any(|a| a == flag);
    if o.peer_check {
        format!(" --peer-key-file \"$D/{PEER_KEY_FILE}\"")
    } else if names("--peer-key-file") || names("--no-peer-check") {
        String::new()
    } else {
        " --no-peer-check".into()
    }
}

/// Starts a lab whose machines run `palisade-node`.
pub fn lab_with_agents(machines: usize, pdu: bool, agents: &AgentOptions) -> Result<Lab> {
    lab_of_kind(MachineKind::Namespace, machines, pdu, agents)
}

/// Starts a lab whose machines, of the given kind, run `palisade-node`. QEMU machines boot
/// together (the lab waits for each guest to report ready), with the default [`QemuConfig`].
pub fn lab_of_kind(
    kind: MachineKind,
    machines: usize,
    pdu: bool,
    agents: &AgentOptions,
) -> Result<Lab> {
    let qemu = match (agents.watchdog, kind) {
        (false, _) => QemuConfig::default(),
        (true, MachineKind::Qemu) => QemuConfig {
            // The driver's own heartbeat, until the agent sets its timeout.
            watchdog_seconds: 30,
            watchdog_action: palisade_lab::WatchdogAction::Reset,
            ..QemuConfig::default()
        },
        (true, MachineKind::Namespace) => {
            anyhow::bail!(
                "watchdog-backed agents need QEMU machines: a namespace machine has no watchdog"
            )
        }
    };
    let lab = Lab::start(LabConfig {
        machines,
        control_plane: true,
        kube: agents.kube,
        pdu,
        machine_command: node_agent_command(agents)?,
        machine_kind: kind,
        qemu,
        etcd_relay: agents.etcd_relay,
        ..Default::default()
    })?;
    node_agent_rbac(&lab)?;
    if agents.peer_check {
        let mut key = [0u8; 48];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut key)?;
        for m in lab.machines() {
            // Where the supervisor's `$D` points.
            palisade_lab::write_secret(&m.command_dir().join(PEER_KEY_FILE), &key)?;
        }
    }
    Ok(lab)
}

/// How the timeline names a machine kind: "a QEMU VM whose BMC is ipmi_sim" or "a set of
/// namespaces whose BMC is ipmi_sim".
pub fn kind_phrase(kind: MachineKind) -> &'static str {
    match kind {
        MachineKind::Qemu => "a QEMU VM whose BMC is ipmi_sim",
        MachineKind::Namespace => "a set of Linux namespaces whose BMC is ipmi_sim",
    }
}

/// A multi-threaded runtime for a scenario's API calls.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// The node agents' RBAC as shipped (`controller/manifests/node-agent-rbac.yaml`): read
/// access to every Node for the peer check, which the Node authorizer no longer gives a node
/// from Kubernetes 1.32 on. Objects that exist already are left as they are.
pub fn node_agent_rbac(lab: &Lab) -> Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    const RBAC: &str = include_str!("../../../controller/manifests/node-agent-rbac.yaml");
    let rt = runtime()?;
    let c = admin_client(lab, &rt)?;
    let pp = PostParams::default();
    let ok_or_exists = |r: kube::Result<()>| match r {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        other => other,
    };
    for text in RBAC.split("\n---") {
        let doc: serde_json::Value = serde_saphyr::from_str(text)?;
        let created = match doc["kind"].as_str() {
            Some("ClusterRole") => {
                let role: ClusterRole = serde_json::from_value(doc)?;
                rt.block_on(Api::all(c.clone()).create(&pp, &role))
                    .map(drop)
            }
            Some("ClusterRoleBinding") => {
                let binding: ClusterRoleBinding = serde_json::from_value(doc)?;
                rt.block_on(Api::all(c.clone()).create(&pp, &binding))
                    .map(drop)
            }
            other => anyhow::bail!("node-agent-rbac.yaml: unexpected kind {other:?}"),
        };
        ok_or_exists(created).context("applying node-agent-rbac.yaml")?;
    }
    Ok(())
}

/// The lab's admin client.
pub fn admin_client(lab: &Lab, rt: &tokio::runtime::Runtime) -> Result<Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cp = lab
        .control_plane()
        .context("the lab has no control plane")?;
    Ok(rt.block_on(palisade_lab::client_from_kubeconfig(cp.admin_kubeconfig()))?)
}

/// Waits until every machine's Node is Ready.
pub fn wait_nodes_ready(lab: &Lab, c: &Client, rt: &tokio::runtime::Runtime) -> Result<()> {
    let nodes: Api<Node> = Api::all(c.clone());
    for m in lab.machines() {
        eventually(
            &format!("node {} Ready", m.name()),
            Duration::from_secs(120),
            || {
                let n = rt.block_on(nodes.get_opt(m.name())).ok().flatten()?;
                n.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
                    .then_some(())
            },
        )?;
    }
    Ok(())
}

/// Waits until every machine's agent advertises a peer check over all the lab's machines.
///
/// The controller judges a silent node's excuse against the member set it advertised, and only
/// a set the controller has seen counts. An agent that listed its peers before every machine
/// had registered advertises a smaller set until it lists them again (every 60 s): one that a
/// controller started later never saw, so its self-fence earns no trust until then (a known
/// limit, docs/install.md). Scenarios that rely on a trusted self-fence wait for this first.
pub fn wait_full_peer_sets(lab: &Lab, c: &Client, rt: &tokio::runtime::Runtime) -> Result<()> {
    use palisade_model::advertise::{MemberSet, PEER_MEMBERS};
    let all = MemberSet::of(lab.machines().iter().map(|m| m.name()));
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.clone(), "kube-node-lease");
    for m in lab.machines() {
        eventually(
            &format!("{} advertises a peer check over every machine", m.name()),
            Duration::from_secs(120),
            || {
                let l = rt.block_on(leases.get_opt(m.name())).ok()??;
                let set = l.metadata.annotations?.get(PEER_MEMBERS)?.clone();
                (MemberSet::parse(&set) == Some(all)).then_some(())
            },
        )?;
    }
    Ok(())
}

/// Creates a namespace and waits for its default ServiceAccount (and, on releases that
/// still make one, its token Secret, which pods of that release mount).
pub fn namespace(c: &Client, rt: &tokio::runtime::Runtime, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(c.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    let _ = rt.block_on(api.create(&PostParams::default(), &ns));
    let sa: Api<ServiceAccount> = Api::namespaced(c.clone(), name);
    let server = rt.block_on(c.apiserver_version())?;
    let version = KubeVersion::parse(&server.git_version)
        .with_context(|| format!("the lab runs no Kubernetes {}", server.git_version))?;
    eventually(
        "default ServiceAccount with its token",
        Duration::from_secs(60),
        || {
            let a = rt.block_on(sa.get_opt("default")).ok().flatten()?;
            let token = a.secrets.is_some_and(|s| !s.is_empty());
            (token || !version.service_accounts_get_token_secrets()).then_some(())
        },
    )
}

/// Polls `f` until it returns `Some`, failing with `what` after `timeout`.
pub fn eventually<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> Result<T> {
    Ok(palisade_test_support::try_eventually(what, timeout, f)?)
}

/// A scenario's view of the cluster: a runtime for API calls and the admin client.
pub struct Cluster {
    /// The runtime the API calls run on.
    pub rt: tokio::runtime::Runtime,
    /// The admin client.
    pub client: Client,
}

impl Cluster {
    /// Connects to the lab's API server as admin.
    pub fn connect(lab: &Lab) -> Result<Cluster> {
        let rt = runtime()?;
        let client = admin_client(lab, &rt)?;
        Ok(Cluster { rt, client })
    }

    /// Waits until every machine's Node is Ready.
    pub fn wait_nodes_ready(&self, lab: &Lab) -> Result<()> {
        wait_nodes_ready(lab, &self.client, &self.rt)
    }

    /// Creates a namespace and waits for its default ServiceAccount ([`namespace`]).
    pub fn namespace(&self, name: &str) -> Result<()> {
        namespace(&self.client, &self.rt, name)
    }
}

/// Creates a Secret in the system namespace.
pub fn secret(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    name: &str,
    data: &[(&str, &str)],
) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(c.clone(), SYSTEM_NS);
    let string_data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": SYSTEM_NS},
        "stringData": string_data,
    }))?;
    rt.block_on(api.create(&PostParams::default(), &s))?;
    Ok(())
}

/// Creates a FencingPolicy from its spec, retrying while the controller installs the CRDs.
pub fn policy(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    name: &str,
    spec: serde_json::Value,
) -> Result<()> {
    let api: Api<FencingPolicy> = Api::all(c.clone());
    let p: FencingPolicy = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "FencingPolicy",
        "metadata": {"name": name}, "spec": spec,
    }))?;
    eventually(
        "FencingPolicy created (CRDs installed)",
        Duration::from_secs(60),
        || rt.block_on(api.create(&PostParams::default(), &p)).ok(),
    )?;
    Ok(())
}

/// Creates the FenceTarget of `node` with these levels: (name, devices).
pub fn fence_target(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    node: &str,
    levels: Vec<(&str, Vec<serde_json::Value>)>,
) -> Result<()> {
    let api: Api<FenceTarget> = Api::all(c.clone());
    let levels: Vec<serde_json::Value> = levels
        .into_iter()
        .map(|(name, devices)| json!({"name": name, "devices": devices}))
        .collect();
    let t: FenceTarget = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "FenceTarget",
        "metadata": {"name": node}, "spec": {"levels": levels},
    }))?;
    // A CRD can be Established a moment before its endpoint serves: retry briefly, and say
    // what the API server last answered if it never accepts it.
    let mut last = String::new();
    eventually("FenceTarget created", Duration::from_secs(30), || {
        rt.block_on(api.create(&PostParams::default(), &t))
            .map_err(|e| last = e.to_string())
            .ok()
    })
    .map_err(|e| e.context(format!("the API server last answered: {last}")))?;
    Ok(())
}

/// Every NodeFence for `node`.
pub fn fences_for(c: &Client, rt: &tokio::runtime::Runtime, node: &str) -> Vec<NodeFence> {
    let api: Api<NodeFence> = Api::all(c.clone());
    rt.block_on(api.list(&ListParams::default()))
        .map(|l| {
            l.items
                .into_iter()
                .filter(|f| f.spec.node_name == node)
                .collect()
        })
        .unwrap_or_default()
}

/// The Events in `ns` about the object named `name` with reason `reason`.
pub fn events(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    name: &str,
    reason: &str,
) -> Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(c.clone(), ns);
    Ok(rt
        .block_on(api.list(&ListParams::default()))?
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason)
        })
        .collect())
}

/// Sets `spec.unschedulable` on a node.
pub fn cordon(c: &Client, rt: &tokio::runtime::Runtime, node: &str, on: bool) -> Result<()> {
    let api: Api<Node> = Api::all(c.clone());
    rt.block_on(api.patch(
        node,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"unschedulable": on}})),
    ))?;
    Ok(())
}

/// A pod's phase, empty if it has none yet.
pub fn pod_phase(p: &k8s_openapi::api::core::v1::Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// One fencing device of a FenceTarget: its URL, kind and credential Secret.
pub fn device(url: &str, kind: &str, secret: &str) -> serde_json::Value {
    let mut d = json!({
        "url": url, "kind": kind, "timeoutSeconds": 20,
        "credentialsSecretRef": {"name": secret, "namespace": SYSTEM_NS},
    });
    if kind == "Storage" {
        d["fences"] = lab_storage_scope();
    }
    d
}

/// What a storage device on the lab fences (its `fences`): the claims bound to the lab
/// storage's volumes (static, without a class), by their CSI driver.
pub fn lab_storage_scope() -> serde_json::Value {
    json!({ "csiDrivers": [palisade_labstore::attacher::DRIVER] })
}

/// The IPMI device URL of machine `i`.
pub fn ipmi_url(lab: &Lab, i: usize) -> String {
    let b = lab.machines()[i].bmc();
    format!("ipmi://{}@{}:{}?cipher=3", b.user, b.host, b.port)
}

/// The PDU device URL of machine `i` (SNMP v2c, APC profile).
pub fn pdu_url(lab: &Lab, i: usize) -> Option<String> {
    let info = lab.pdu()?.info();
    let outlets: Vec<String> = lab.machines()[i]
        .outlets()
        .iter()
        .map(u32::to_string)
        .collect();
    Some(format!(
        "snmp+pdu://{}:{}/outlet/{}?profile=apc&version=2c",
        info.host,
        info.port,
        outlets.join(",")
    ))
}

/// A workspace binary run as a child process, killed on drop, its output in a log file.
pub struct Proc {
    child: Child,
    /// Its log file.
    pub log: PathBuf,
    // What it was started with, for [`Proc::start_again`].
    path: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Proc {
    /// Starts workspace binary `bin` with `args`, logging to `<lab dir>/<log_name>.log`.
    pub fn spawn(
        lab: &Lab,
        bin: &str,
        log_name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        let path = palisade_lab::bin_path(bin)?;
        let log = lab.dir().join(format!("{log_name}.log"));
        std::fs::File::create(&log)?;
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        // Marked with the lab id, like every lab process: if this test process dies without
        // dropping the `Proc`, the lab's reaper still finds and kills it.
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([(
                palisade_lab::process::LAB_ENV.to_string(),
                lab.id().to_string(),
            )])
            .collect();
        let child = Self::launch(&path, &args, &env, &log)?;
        Ok(Proc {
            child,
            log,
            path,
            args,
            env,
        })
    }

    fn launch(path: &Path, args: &[String], env: &[(String, String)], log: &Path) -> Result<Child> {
        let out = std::fs::File::options().append(true).open(log)?;
        Command::new(path)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .spawn()
            .with_context(|| format!("starting {}", path.display()))
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILLs the process and reaps it (a crash, for a fault).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the process again with the same command line and environment, appending to
    /// the same log. The old process is killed first if it still runs.
    pub fn start_again(&mut self) -> Result<()> {
        self.kill();
        self.child = Self::launch(&self.path, &self.args, &self.env, &self.log)?;
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    palisade_lab::ports::free_port()
}

/// Starts `palisade-controller` with the admin kubeconfig and lab-speed leader election.
pub fn start_controller(lab: &Lab, identity: &str) -> Result<(Proc, String)> {
    start_controller_with(lab, identity, &[])
}

/// [`start_controller`] with extra environment (e.g. [`FirmwareBridge::controller_env`]).
pub fn start_controller_with(
    lab: &Lab,
    identity: &str,
    env: &[(&str, String)],
) -> Result<(Proc, String)> {
    start_controller_with_args(lab, identity, env, &[])
}

/// [`start_controller_with`] plus extra flags (e.g. `--power-watch-interval`).
pub fn start_controller_with_args(
    lab: &Lab,
    identity: &str,
    env: &[(&str, String)],
    args: &[&str],
) -> Result<(Proc, String)> {
    let cp = lab
        .control_plane()
        .context("the lab has no control plane")?;
    let metrics = format!("127.0.0.1:{}", free_port());
    let kubeconfig = cp.admin_kubeconfig().display().to_string();
    let p = Proc::spawn(
        lab,
        "palisade-controller",
        &format!("controller-{identity}"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            SYSTEM_NS,
            "--lease-name",
            "palisade-controller",
            "--identity",
            identity,
            "--metrics-addr",
            &metrics,
            "--lease-duration",
            "4s",
            "--renew-interval",
            "1s",
            "--resync",
            "250ms",
        ]
        .into_iter()
        .chain(args.iter().copied())
        .collect::<Vec<_>>(),
        &std::iter::once(("RUST_LOG", "info,kube=warn"))
            .chain(env.iter().map(|(k, v)| (*k, v.as_str())))
            .collect::<Vec<_>>(),
    )?;
    Ok((p, metrics))
}

/// The lab storage server: its data path in the hub, its HTTPS admin API on loopback with a
/// certificate from the lab CA and a bearer token.
pub struct Storage {
    /// The server process.
    pub proc: Proc,
    /// The admin API's address.
    pub admin: String,
    /// The server's state directory (volumes live under `volumes/`).
    pub state_dir: PathBuf,
    /// The lab CA (PEM) that signs the admin API's certificate.
    pub ca_pem: String,
    /// The admin bearer token.
    pub token: String,
    /// The token's file.
    pub token_file: PathBuf,
    /// The CA's file.
    pub ca_file: PathBuf,
}

impl Storage {
    /// Starts the storage server with the given volumes.
    pub fn start(lab: &Lab, volumes: &[&str]) -> Result<Storage> {
        let dir = lab.dir().join("storage");
        std::fs::create_dir_all(&dir)?;
        let issued = lab.ca().issue_server_cert(&["127.0.0.1", "localhost"])?;
        let (crt, key) = issued.write(&dir, "admin")?;
        let token = format!("storage-{:016x}", std::process::id() as u64 * 7919 + 17);
        let token_file = dir.join("token");
        palisade_lab::write_secret(&token_file, token.as_bytes())?;
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, lab.ca().cert_pem())?;
        let admin = format!("127.0.0.1:{}", free_port());
        let state_dir = dir.join("state");
        let mut args: Vec<String> = vec![
            "--data-listen".into(),
            STORAGE_DATA.into(),
            "--data-netns".into(),
            lab.hub_netns().into(),
            "--admin-listen".into(),
            admin.clone(),
            "--state-dir".into(),
            state_dir.display().to_string(),
            "--tls-cert".into(),
            crt.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
            "--token-file".into(),
            token_file.display().to_string(),
        ];
        for v in volumes {
            args.push("--volume".into());
            args.push(v.to_string());
        }
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let proc = Proc::spawn(
            lab,
            "palisade-storage-server",
            "storage-server",
            &arg_refs,
            &[],
        )?;
        eventually(
            "storage admin API listening",
            Duration::from_secs(30),
            || std::net::TcpStream::connect(&admin).ok().map(|_| ()),
        )?;
        Ok(Storage {
            proc,
            admin,
            state_dir,
            ca_pem: lab.ca().cert_pem(),
            token,
            token_file,
            ca_file,
        })
    }

    /// The storage firewall device URL.
    pub fn fence_url(&self) -> String {
        format!("storagefw+https://{}/?profile=lab", self.admin)
    }

    /// Starts the lab CSI attacher for this storage (it registers the CSIDriver, and grants a
    /// node a volume when the attach-detach controller attaches it there; detaching revokes).
    pub fn start_attacher(&self, lab: &Lab) -> Result<Proc> {
        let cp = lab
            .control_plane()
            .context("the lab has no control plane")?;
        let kubeconfig = cp.admin_kubeconfig().display().to_string();
        let admin_url = format!("https://{}", self.admin);
        let ca = self.ca_file.display().to_string();
        let token = self.token_file.display().to_string();
        Proc::spawn(
            lab,
            "palisade-attacher",
            "attacher",
            &[
                "--kubeconfig",
                &kubeconfig,
                "--admin-url",
                &admin_url,
                "--ca-file",
                &ca,
                "--token-file",
                &token,
                "--ensure-csi-driver",
            ],
            &[],
        )
    }

    /// A volume's log file.
    pub fn volume_file(&self, volume: &str) -> PathBuf {
        self.state_dir.join("volumes").join(format!("{volume}.vol"))
    }
}

/// Reads a file, empty if it does not exist.
pub fn read_or_empty(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32 item 18: the agent runs the peer check unless told not to, so an agent the lab
    /// starts without it must say so.
    #[test]
    fn an_agent_without_the_peer_check_is_told_so_explicitly() {
        let with = |peer_check, extra: &[&str]| {
            peer_check_args(&AgentOptions {
                peer_check,
                extra_args: extra.iter().map(|a| a.to_string()).collect(),
                ..AgentOptions::default()
            })
        };
        assert_eq!(with(false, &[]), " --no-peer-check");
        assert_eq!(with(false, &["--self-fence-all-pods"]), " --no-peer-check");
        assert_eq!(
            with(true, &[]),
            format!(" --peer-key-file \"$D/{PEER_KEY_FILE}\"")
        );
        // A test's own key, or its own opt-out, is not contradicted.
        assert_eq!(with(false, &["--peer-key-file", "/k"]), "");
        assert_eq!(with(false, &["--no-peer-check"]), "");
    }
}
