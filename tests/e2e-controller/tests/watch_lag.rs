//! A lagging watch is not silence (issue 31). The controller's watch stops delivering m0's
//! Lease (the lab's stalled-watch fault, `palisade_fence::planted::watch_stalled`, debug
//! builds only) while m0's agent renews it on time: the detector sees m0 silent past the
//! Unhealthy threshold. Before it creates a NodeFence the controller reads m0's Lease from the
//! API, finds renewals the watch has not delivered, and holds (`watch_behind`): no NodeFence,
//! m0 keeps running. With the old rule planted back (`FenceOnWatchedSilence`: fence on the
//! watch's view alone) the same stall fences the live node, so the test can fail for the
//! reason it exists.
//!
//! The other side of the same question: a silence the API truly has is judged the moment it
//! reaches the threshold, not at the detection loop's next tick (issue 37).

mod common;

use std::time::Duration;

use common::*;

/// Starts a 3-machine lab and a controller whose watch can be stalled, with the test policy,
/// IPMI targets and a pod on m0; then stalls m0's Lease in the controller's watch. Returns the
/// lab, runtime, client, controller and the stall's file (empty it to end the stall).
fn stalled_m0(
    identity: &str,
    planted: &[&str],
) -> (
    palisade_lab::Lab,
    tokio::runtime::Runtime,
    kube::Client,
    Controller,
    std::path::PathBuf,
) {
    let (lab, rt, c) = lab_ready(3, false);
    let stall = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("stalled-watch-{identity}-{}", std::process::id()));
    std::fs::write(&stall, "").unwrap();
    let mut env = vec![("PALISADE_STALLED_WATCH_FILE", stall.display().to_string())];
    if !planted.is_empty() {
        env.push(("PALISADE_PLANTED_BUGS", planted.join(",")));
    }
    let ctl = start_controller_with_env(&lab, identity, &env);
    policy(&c, &rt);
    ipmi_targets(&lab, &c, &rt);
    running_worker(&c, &rt, "m0");
    // Every node heard by the controller before the stall.
    ctl.wait_ticks(8);
    std::fs::write(&stall, "Lease/m0\n").unwrap();
    (lab, rt, c, ctl, stall)
}

#[test]
fn a_node_the_watch_stopped_delivering_is_not_fenced_while_the_api_hears_it() {
    let (lab, rt, c, ctl, stall) = stalled_m0("ctl-lag", &[]);
    // The detector judged m0 silent and the API's heartbeat held the fence back.
    let held = "palisade_held_decisions_total{reason=\"watch_behind\"}";
    eventually(
        "the decision for m0 held: the watch is behind",
        Duration::from_secs(60),
        || ctl.metrics().filter(|m| m.contains(held)),
    );
    // Many more decisions (8 s of 250 ms ticks) with the watch still stalled.
    ctl.wait_ticks(32);
    assert!(fences_for(&c, &rt, "m0").is_empty(), "no NodeFence for m0");
    let m0 = &lab.machines()[0];
    assert!(
        m0.is_powered() && !m0.processes().is_empty(),
        "m0 still runs"
    );
    // The watch delivers again: m0 is heard, and still nothing is fenced.
    std::fs::write(&stall, "").unwrap();
    ctl.wait_ticks(16);
    for n in ["m0", "m1", "m2"] {
        assert!(fences_for(&c, &rt, n).is_empty(), "no NodeFence for {n}");
    }
    let metrics = ctl.metrics().unwrap_or_default();
    assert!(
        !metrics.contains("palisade_fences_total{outcome="),
        "{metrics}"
    );
}

/// The negative control: the old creation rule fences the node the API still hears.
#[test]
fn with_the_old_rule_planted_the_stalled_watch_fences_a_live_node() {
    // Nothing cuts m0 off or stops its agent: it renews on time throughout.
    let (_lab, rt, c, _ctl, _stall) = stalled_m0("ctl-lag-planted", &["FenceOnWatchedSilence"]);
    eventually(
        "a NodeFence for m0, whose agent renews on time",
        Duration::from_secs(60),
        || fences_for(&c, &rt, "m0").into_iter().next(),
    );
}

/// Issue 37: a node's silence is judged the moment it reaches the policy's threshold, not at
/// the detection loop's next tick. The controller runs with a resync of ten minutes, so its
/// only round after the silence within that time is one it runs at the crossing
/// (`Detector::next_crossing`): a NodeFence within two minutes of the silence comes from it,
/// and without it none would come for ten. The nodes and the policy exist before that
/// controller starts (its first round observes them; a node that first appears between two
/// ticks is observed at the next); a first controller, killed before, installs the CRDs.
#[test]
fn a_silence_is_judged_when_it_reaches_the_threshold_not_at_the_next_tick() {
    let lab = common::sim::bare_lab(1);
    let rt = rt();
    let sim = common::sim::Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    // A first controller installs the CRDs; it is gone before the nodes are judged.
    let mut installer = start_controller(&lab, "ctl-crds");
    let labels = [("palisade.test/scenario", "crossing")];
    let nodes = [
        common::sim::SimNode {
            labels: &labels,
            ..common::sim::SimNode::new("crossing-a", Some(0))
        },
        common::sim::SimNode {
            labels: &labels,
            ..common::sim::SimNode::new("crossing-up", None)
        },
    ];
    sim.nodes(&nodes);
    sim.policy(
        "crossing",
        common::sim::spec("crossing", serde_json::json!({})),
    );
    installer.kill();
    let cp = lab.control_plane().expect("control plane");
    let _ctl = start_controller_as(
        &lab,
        "ctl-crossing",
        cp.admin_kubeconfig(),
        &[],
        &["--resync".into(), "600s".into()],
    );
    // Alive for longer than both thresholds: the rounds at each crossing observe the
    // renewals and find nothing to judge.
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        sim.fences("crossing-a").is_empty(),
        "a live node was fenced"
    );
    sim.silence("crossing-a");
    let nf = sim.wait_fence_phase(
        "crossing-a",
        palisade_model::nodefence::Phase::Fencing,
        Duration::from_secs(120),
    );
    eprintln!("crossing-a fenced: {}", nf.spec.reason);
    assert!(
        sim.fences("crossing-up").is_empty(),
        "the live node was fenced"
    );
}
