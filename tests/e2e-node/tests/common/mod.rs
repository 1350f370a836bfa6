//! Helpers shared by the e2e tests: the lab with `palisade-node` on every machine, an admin
//! client, polling, and agent stop/start.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use palisade_lab::{Lab, LabConfig};

/// Agent settings the tests rely on.
pub const SELF_FENCE_AFTER_S: f64 = 4.0;
/// The lowered maximum restart backoff.
pub const MAX_BACKOFF_S: u64 = 20;

/// Starts a lab with `machines` machines, each running `palisade-node` under a supervisor
/// loop that restarts it unless `<machine dir>/agent-stopped` exists.
pub fn start_lab(machines: usize) -> Lab {
    let agent = palisade_lab::bin_path("palisade-node")
        .expect("build the agent first: cargo build -p palisade-node --bins");
    let command = format!(
        r#"D="$PALISADE_MACHINE_DIR"
mkdir -p "$D/node-state"
while true; do
  if [ ! -e "$D/agent-stopped" ]; then
    RUST_LOG=info,kube=warn '{agent}' --node-name "$PALISADE_MACHINE_NAME" --kubeconfig "$PALISADE_NODE_KUBECONFIG" \
      --address "$PALISADE_MACHINE_ADDRESS" --state-dir "$D/node-state" --image-store "$D/images" \
      --lease-duration 10s --renew-interval 1s --self-fence-after {fence}s --max-restart-backoff {backoff}s \
      --metrics-addr 127.0.0.1:10255 >> "$D/agent.log" 2>&1
  fi
  sleep 0.2
done"#,
        agent = agent.display(),
        fence = SELF_FENCE_AFTER_S,
        backoff = MAX_BACKOFF_S,
    );
    Lab::start(LabConfig {
        machines,
        control_plane: true,
        pdu: false,
        machine_command: command,
        ..Default::default()
    })
    .expect("lab starts")
}

/// A tokio runtime for the test's API calls.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The admin client.
pub fn client(lab: &Lab, rt: &tokio::runtime::Runtime) -> Client {
    let cp = lab.control_plane().expect("control plane");
    rt.block_on(palisade_lab::client_from_kubeconfig(cp.admin_kubeconfig()))
        .unwrap()
}

/// Polls `f` until it returns `Some`, or panics after `timeout`.
pub fn eventually<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Creates a namespace and waits for its default ServiceAccount.
pub fn namespace(c: &Client, rt: &tokio::runtime::Runtime, name: &str) {
    let api: Api<Namespace> = Api::all(c.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    let _ = rt.block_on(api.create(&PostParams::default(), &ns));
    let sa: Api<ServiceAccount> = Api::namespaced(c.clone(), name);
    eventually(
        "default service account with its token",
        Duration::from_secs(60),
        || {
            let a = rt.block_on(sa.get_opt("default")).ok().flatten()?;
            a.secrets.is_some_and(|s| !s.is_empty()).then_some(())
        },
    );
}

/// Waits until every machine's Node is Ready.
pub fn wait_nodes_ready(lab: &Lab, c: &Client, rt: &tokio::runtime::Runtime) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    for m in lab.machines() {
        eventually(
            &format!("node {} Ready", m.name()),
            Duration::from_secs(90),
            || {
                let n = rt.block_on(nodes.get_opt(m.name())).ok().flatten()?;
                let ready = n
                    .status?
                    .conditions?
                    .into_iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(())
            },
        );
    }
}

/// Creates a pod from JSON.
pub fn create_pod(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    pod: serde_json::Value,
) -> Pod {
    let api: Api<Pod> = Api::namespaced(c.clone(), ns);
    let p: Pod = serde_json::from_value(pod).unwrap();
    eventually("pod created", Duration::from_secs(30), || {
        match rt.block_on(api.create(&PostParams::default(), &p)) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("create pod: {e}; retrying");
                None
            }
        }
    })
}

/// Gets a pod.
pub fn get_pod(c: &Client, rt: &tokio::runtime::Runtime, ns: &str, name: &str) -> Option<Pod> {
    let api: Api<Pod> = Api::namespaced(c.clone(), ns);
    rt.block_on(api.get_opt(name)).ok().flatten()
}

/// Gracefully deletes a pod (the API server sets deletionGracePeriodSeconds).
pub fn delete_pod(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    name: &str,
    grace: Option<i64>,
) {
    let api: Api<Pod> = Api::namespaced(c.clone(), ns);
    let dp = DeleteParams {
        grace_period_seconds: grace.and_then(|g| u32::try_from(g).ok()),
        ..Default::default()
    };
    rt.block_on(api.delete(name, &dp)).expect("delete pod");
}

/// Whether the pod's container `name` is in state running and its `ready` flag.
pub fn container(p: &Pod, name: &str) -> Option<k8s_openapi::api::core::v1::ContainerStatus> {
    let st = p.status.as_ref()?;
    st.container_statuses
        .iter()
        .flatten()
        .chain(st.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
        .cloned()
}

/// The pod's condition status.
pub fn condition(p: &Pod, t: &str) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| c.status.clone())
}

/// A scratch directory inside the lab dir, visible to the machines.
pub fn scratch(lab: &Lab, name: &str) -> PathBuf {
    let d = lab.dir().join("scratch").join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Reads a `date +%s.%N` file as seconds since the epoch.
pub fn read_ts(path: &std::path::Path) -> Option<f64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Now, seconds since the epoch.
pub fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The agent's pid on machine `i` (not the shims).
pub fn agent_pid(lab: &Lab, i: usize) -> Option<i32> {
    lab.machines()[i].processes().into_iter().find(|p| {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        args.first().is_some_and(|a| a.ends_with(b"palisade-node"))
            && args.get(1).is_some_and(|a| !a.starts_with(b"__shim"))
    })
}

/// Stops the agent on machine `i` (SIGKILL, so it cannot clean up) and keeps it stopped.
pub fn stop_agent(lab: &Lab, i: usize) {
    let dir = lab.machines()[i].dir().to_path_buf();
    std::fs::write(dir.join("agent-stopped"), b"").unwrap();
    if let Some(pid) = agent_pid(lab, i) {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    eventually("agent stopped", Duration::from_secs(10), || {
        agent_pid(lab, i).is_none().then_some(())
    });
}

/// Lets the supervisor start the agent on machine `i` again.
pub fn start_agent(lab: &Lab, i: usize) {
    let dir = lab.machines()[i].dir().to_path_buf();
    let _ = std::fs::remove_file(dir.join("agent-stopped"));
    eventually("agent started", Duration::from_secs(10), || {
        agent_pid(lab, i)
    });
}

/// The agent's log on machine `i`.
pub fn agent_log(lab: &Lab, i: usize) -> String {
    std::fs::read_to_string(lab.machines()[i].dir().join("agent.log")).unwrap_or_default()
}
