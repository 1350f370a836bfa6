//! A hung node agent is not a self-fenced node. With `trustSelfFence` on and no FenceTarget,
//! the node agent on m0 is stopped (SIGSTOP): m0 goes silent while its pods keep running.
//! The agent advertises no armed watchdog (namespace machines have none), so nothing would
//! ever reset m0: the controller holds the decision with `SelfFenceNotTrusted`, creates no
//! NodeFence and releases nothing, and the pod keeps running on m0 (no second copy).

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

/// The pid of `palisade-node` on machine `i`.
fn agent_pid(lab: &palisade_lab::Lab, i: usize) -> i32 {
    lab.machines()[i]
        .processes()
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "palisade-node")
        })
        .expect("palisade-node runs on the machine")
}

#[test]
fn a_stopped_agent_without_a_watchdog_is_never_trusted_to_have_self_fenced() {
    let (lab, rt, c) = lab_ready(3, false);
    let ctl = start_controller(&lab, "ctl-hung");
    policy_with(
        &c,
        &rt,
        // Virtual machines accepted (the lab's machines share this VM host), so what holds
        // the decision is the missing watchdog, not the machine.
        json!({"trustSelfFence": {"enabled": true, "marginSeconds": 1, "virtualMachines": "Accept"}}),
    );
    let pod = running_worker(&c, &rt, "m0");
    let uid = pod.uid().unwrap();

    let agent = Pid::from_raw(agent_pid(&lab, 0));
    kill(agent, Signal::SIGSTOP).expect("SIGSTOP the agent");
    let held = eventually(
        "the decision for m0 held: self-fence not trusted",
        Duration::from_secs(90),
        || {
            events(&c, &rt, "default", "m0", "FenceHeldSelfFenceNotTrusted")
                .into_iter()
                .next()
        },
    );
    let msg = held.message.unwrap_or_default();
    eprintln!("held: {msg}");
    assert!(
        msg.contains("watchdog"),
        "the reason names the missing watchdog: {msg}"
    );
    // Well past the node's advertised self-fence time plus margin: still nothing released.
    ctl.wait_ticks(40);
    assert!(fences_for(&c, &rt, "m0").is_empty(), "no NodeFence for m0");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");
    let now = rt
        .block_on(pods.get("worker"))
        .expect("the pod still exists");
    assert_eq!(now.uid().as_deref(), Some(uid.as_str()));
    assert_eq!(
        now.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("m0")
    );
    kill(agent, Signal::SIGCONT).expect("SIGCONT the agent");
}
