//! Outages in the middle of a fence. Both scenarios fence m0 through a slow first level (an
//! IPMI address where nothing answers, so the level times out after 5 s) and then its real BMC,
//! so the outage lands while a level is in flight.
//!
//! - The API server restarts (down for 6 s, longer than the controller's 4 s leader Lease):
//!   the controller cannot renew, so it stops acting until it has renewed again (no other term
//!   can begin while the API is down, so it keeps its token), and completes the fence once;
//!   and the outage, in which no heartbeat could be observed, fences no other node.
//! - The leader is frozen (SIGSTOP) mid-level: the standby takes over under a higher token and
//!   completes the fence; when the old leader wakes up it changes nothing.

mod common;

use std::time::Duration;

use common::*;
use kube::ResourceExt;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_lab::{Cut, Lab};
use palisade_model::nodefence::{EvidenceKind, LevelResult, Phase};
use palisade_model::NodeFence;
use serde_json::json;

/// m0's FenceTarget: a level whose BMC never answers (5 s budget), then its real BMC.
fn slow_then_real_target(lab: &Lab, c: &kube::Client, rt: &tokio::runtime::Runtime) {
    let silent_port = palisade_scenario::free_port();
    let b = lab.machines()[0].bmc();
    secret(c, rt, "bmc-m0", &[("password", &b.password().unwrap())]);
    let mut slow = device(
        &format!("ipmi://{}@127.0.0.1:{silent_port}", b.user),
        "bmc-m0",
    );
    slow["timeoutSeconds"] = json!(5);
    fence_target(
        c,
        rt,
        "m0",
        vec![
            ("silent-bmc", vec![slow]),
            ("bmc", vec![device(&ipmi_url(lab, 0), "bmc-m0")]),
        ],
    );
}

fn phase(nf: &NodeFence) -> Option<Phase> {
    nf.status.as_ref().map(|s| s.phase)
}

/// Waits until m0's NodeFence is Fencing.
fn wait_fencing(c: &kube::Client, rt: &tokio::runtime::Runtime) -> NodeFence {
    eventually("m0's NodeFence Fencing", Duration::from_secs(120), || {
        fences_for(c, rt, "m0")
            .into_iter()
            .find(|f| phase(f) == Some(Phase::Fencing))
    })
}

fn wait_released(c: &kube::Client, rt: &tokio::runtime::Runtime) -> NodeFence {
    eventually("m0's NodeFence Released", Duration::from_secs(240), || {
        fences_for(c, rt, "m0")
            .into_iter()
            .find(|f| phase(f) == Some(Phase::Released))
    })
}

/// The shape every completed fence here must have: each phase once, the slow level failed and
/// the real one verified under `token`, the machine off.
fn assert_completed_once(lab: &Lab, nf: &NodeFence, token: i64) {
    let st = nf.status.clone().unwrap();
    assert_each_phase_once(&st);
    assert_eq!(st.fencing_token, Some(token));
    let results: Vec<LevelResult> = st.levels.iter().map(|l| l.result).collect();
    assert_eq!(results, vec![LevelResult::Failed, LevelResult::Verified]);
    assert!(
        st.attempts.iter().all(|a| a.token == token),
        "every recorded attempt is the final leader's: {:?}",
        st.attempts
    );
    assert!(st
        .evidence
        .iter()
        .any(|e| e.kind == EvidenceKind::PowerOff && e.level == 1));
    assert_eq!(st.release.pods.len(), 1, "{:?}", st.release.pods);
    assert!(!lab.machines()[0].is_powered());
}

#[test]
fn an_api_server_restart_mid_fence_is_survived_and_fences_nothing_else() {
    let (lab, rt, c) = lab_ready(3, false);
    let _ctl = start_controller(&lab, "ctl-a");
    eventually(
        "ready once it reaches the API server",
        Duration::from_secs(30),
        || (_ctl.readyz() == Some(200)).then_some(()),
    );
    policy(&c, &rt);
    slow_then_real_target(&lab, &c, &rt);
    running_worker(&c, &rt, "m0");

    lab.partition(0, Cut::All).unwrap();
    let before = wait_fencing(&c, &rt);
    let token_before = before
        .status
        .as_ref()
        .and_then(|s| s.fencing_token)
        .unwrap();
    // /readyz, polled while the API server is down: 503 at some point, 200 again after.
    let unready_seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (seen, stop, addr) = (
            unready_seen.clone(),
            stop.clone(),
            _ctl.metrics_addr.clone(),
        );
        std::thread::spawn(move || {
            for _ in 0..600 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                if readyz_at(&addr) == Some(503) {
                    seen.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    lab.control_plane()
        .unwrap()
        .restart_api_server(Duration::from_secs(6))
        .expect("the API server restarts");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poller.join().unwrap();
    assert!(
        unready_seen.load(std::sync::atomic::Ordering::Relaxed),
        "/readyz said 503 while the API server was down"
    );
    eventually("/readyz ready again", Duration::from_secs(60), || {
        (_ctl.readyz() == Some(200)).then_some(())
    });
    // A fresh client: the old connections died with the server.
    let c = client(&lab, &rt);
    let nf = wait_released(&c, &rt);
    print_timeline(&nf, nf.metadata.creation_timestamp.clone().unwrap().0);
    let token = nf.status.as_ref().and_then(|s| s.fencing_token).unwrap();
    assert_eq!(token, token_before, "no other term began during the outage");
    assert_completed_once(&lab, &nf, token);
    // The outage hid every heartbeat for as long as it lasted; once the API is back and the
    // agents renew, m1 and m2 are healthy again and were never fenced.
    let ready = |n: &str| node_ready(&c, &rt, n);
    eventually("m1 and m2 Ready", Duration::from_secs(60), || {
        ready("m1").and(ready("m2"))
    });
    _ctl.wait_ticks(16);
    assert!(fences_for(&c, &rt, "m1").is_empty(), "m1 not fenced");
    assert!(fences_for(&c, &rt, "m2").is_empty(), "m2 not fenced");
    assert!(lab.machines()[1].is_powered() && lab.machines()[2].is_powered());
}

#[test]
fn a_frozen_leader_that_wakes_up_changes_nothing() {
    let (lab, rt, c) = lab_ready(3, false);
    let a = start_controller(&lab, "ctl-a");
    policy(&c, &rt);
    slow_then_real_target(&lab, &c, &rt);
    running_worker(&c, &rt, "m0");
    a.wait_ticks(4);
    let b = start_controller(&lab, "ctl-b");

    lab.partition(0, Cut::All).unwrap();
    let fencing = wait_fencing(&c, &rt);
    let token_a = fencing
        .status
        .as_ref()
        .and_then(|s| s.fencing_token)
        .unwrap();
    kill(Pid::from_raw(a.pid()), Signal::SIGSTOP).unwrap();
    let nf = wait_released(&c, &rt);
    let token_b = nf.status.as_ref().and_then(|s| s.fencing_token).unwrap();
    assert!(token_b > token_a, "{token_b} > {token_a}");
    assert_completed_once(&lab, &nf, token_b);
    let settled = nf.resource_version();

    // Wake the old leader: its level finishes, but nothing it does lands.
    kill(Pid::from_raw(a.pid()), Signal::SIGCONT).unwrap();
    a.wait_ticks(16);
    b.wait_ticks(4);
    let after = fences_for(&c, &rt, "m0");
    assert_eq!(after.len(), 1);
    assert_eq!(
        after[0].resource_version(),
        settled,
        "the woken leader changed the NodeFence"
    );
    let metrics = a.metrics().unwrap_or_default();
    assert!(
        metrics.contains("palisade_leader 0"),
        "the woken controller knows it does not lead: {metrics}"
    );
}
