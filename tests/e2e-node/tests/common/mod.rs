//! Helpers shared by the e2e tests: the lab with `palisade-node` on every machine, an admin
//! client, polling, and agent stop/start.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use palisade_lab::Lab;

pub use palisade_test_support::eventually;

/// Agent settings the tests rely on.
pub const SELF_FENCE_AFTER_S: f64 = 4.0;
/// The lowered maximum restart backoff.
pub const MAX_BACKOFF_S: u64 = 20;

/// Starts a lab with `machines` machines, each running `palisade-node` under a supervisor
/// loop that restarts it unless `<machine dir>/agent-stopped` exists.
pub fn start_lab(machines: usize) -> Lab {
    start_lab_with(machines, &[])
}

/// [`start_lab`] with extra arguments for every agent.
pub fn start_lab_with(machines: usize, extra_args: &[String]) -> Lab {
    let agents = palisade_scenario::AgentOptions {
        self_fence_seconds: SELF_FENCE_AFTER_S,
        max_restart_backoff_seconds: Some(MAX_BACKOFF_S),
        extra_args: extra_args.to_vec(),
        ..Default::default()
    };
    palisade_scenario::lab_with_agents(machines, false, &agents).expect("lab starts")
}

/// [`start_lab`], then waits until every Node is Ready.
pub fn start_ready_lab(machines: usize) -> Lab {
    let lab = start_lab(machines);
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    lab
}

/// A tokio runtime for the test's API calls.
pub fn rt() -> tokio::runtime::Runtime {
    palisade_scenario::runtime().expect("runtime")
}

/// The admin client.
pub fn client(lab: &Lab, rt: &tokio::runtime::Runtime) -> Client {
    palisade_scenario::admin_client(lab, rt).expect("admin client")
}

/// Creates a namespace and waits for its default ServiceAccount.
pub fn namespace(c: &Client, rt: &tokio::runtime::Runtime, name: &str) {
    palisade_scenario::namespace(c, rt, name).expect("namespace");
}

/// Waits until every machine's Node is Ready.
pub fn wait_nodes_ready(lab: &Lab, c: &Client, rt: &tokio::runtime::Runtime) {
    palisade_scenario::wait_nodes_ready(lab, c, rt).expect("nodes Ready");
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

/// The host pid of the process whose command line is exactly `sleep <arg>` (tests give each
/// container its own duration to find it).
pub fn pid_of_sleep(arg: &str) -> Option<i32> {
    let want = format!("sleep\0{arg}\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .ok()
            .filter(|c| c == want.as_bytes())
            .map(|_| pid)
    })
}

/// Whether `pid` is alive (exists and is not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// The Events in `ns` about the object named `name` with reason `reason`.
pub fn events(
    c: &kube::Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    name: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::core::v1::Event> {
    palisade_scenario::events(c, rt, ns, name, reason).unwrap_or_default()
}

/// The messages of [`events`].
pub fn event_messages(
    c: &kube::Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    name: &str,
    reason: &str,
) -> Vec<String> {
    events(c, rt, ns, name, reason)
        .into_iter()
        .filter_map(|e| e.message)
        .collect()
}
