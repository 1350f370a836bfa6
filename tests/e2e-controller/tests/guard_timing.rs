//! Decision guards about *when* to fence, end to end: the real controller binary against the
//! lab's real control plane, with simulated nodes (Node + Lease objects kept alive by the test)
//! whose FenceTargets are the machines' real BMCs, so a fence really powers a machine off.
//!
//! One lab and one controller serve four scenarios in turn (each with its own policy and node
//! names, cleaned up in between):
//! - PDB urgency: with 600 s of forgiveness, a silent node whose pod is covered by a
//!   `policy/v1beta1` PDB at `disruptionsAllowed == 0` is fenced at once, while a silent node
//!   whose pod's PDB still allows a disruption waits out its forgiveness;
//! - forgiveness from tolerations: a silent node whose pod tolerates unreachability for 3 s is
//!   fenced after 3 s, one whose pod got the admission default (300 s) waits;
//! - flapping: a node fenced, powered back on by the controller and recovered (`Done`) that
//!   goes silent again is held, not fenced in a loop: by the cooldown (`FenceHeldCooldown`),
//!   and, with no cooldown, by the escalation limit (`FenceHeldEscalationLimit`).
//!
//! A second test shows that a manual retry (every override) after a Failed fence is not held
//! by the cooldown that holds automatic fences.

mod common;

use std::time::Duration;

use common::sim::{metric, powered, spec, Sim, SimNode};
use common::*;
use palisade_model::nodefence::Phase;
use serde_json::json;

const FENCED: Duration = Duration::from_secs(90);
const HELD: Duration = Duration::from_secs(60);

fn pdb_urgency(sim: &Sim<'_>, ctl: &Controller) {
    eprintln!("== scenario: PDB urgency (policy/v1beta1)");
    let labels = [("palisade.test/scenario", "pdb")];
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new("pdb-exhausted", Some(0))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("pdb-slack", Some(1))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("pdb-up", None)
        },
    ];
    sim.nodes(&nodes);
    namespace(&sim.c, sim.rt, "pdb");
    sim.pod("pdb", "db-0", "pdb-exhausted", &[("app", "db")], None);
    sim.pod("pdb", "web-0", "pdb-slack", &[("app", "web")], None);
    // No agent runs the pods: db-0 stays not Ready, so a PDB demanding one available db pod
    // is exhausted; web-0 is marked Ready, so a PDB demanding none allows one disruption.
    sim.mark_ready("pdb", "web-0");
    sim.pdb("pdb", "db", &[("app", "db")], 1, 0);
    sim.pdb("pdb", "web", &[("app", "web")], 0, 1);
    sim.policy(
        "pdb",
        spec(
            "pdb",
            json!({"forgiveness": {"respectTolerations": false, "defaultSeconds": 600,
                                   "maxSeconds": 600},
                   "pdb": {"urgentWhenExhausted": true, "urgentForgivenessSeconds": 0}}),
        ),
    );
    let waits_before = metric(
        ctl,
        "palisade_decisions_total{verdict=\"wait_forgiveness\"}",
    );
    sim.silence("pdb-exhausted");
    sim.silence("pdb-slack");
    let nf = sim.wait_fence_phase("pdb-exhausted", Phase::Released, FENCED);
    eprintln!("pdb-exhausted fenced: {}", nf.spec.reason);
    assert!(
        nf.spec.reason.contains("forgiveness 0s")
            && nf.spec.reason.contains("a PDB allows no disruption"),
        "fenced at once because of the PDB: {}",
        nf.spec.reason
    );
    // The other node is Unhealthy too, but its PDB still allows a disruption, so it waits out
    // its 600 s: the controller produced its wait_forgiveness verdict (the only one in this
    // lab's life), and nothing else.
    eventually("a wait_forgiveness verdict for pdb-slack", HELD, || {
        (metric(
            ctl,
            "palisade_decisions_total{verdict=\"wait_forgiveness\"}",
        ) > waits_before)
            .then_some(())
    });
    ctl.wait_ticks(12);
    assert!(
        sim.fences("pdb-slack").is_empty(),
        "a PDB with disruptions left does not shorten forgiveness"
    );
    assert_eq!(powered(sim.lab)[..2], [false, true]);
    sim.reset("pdb", &nodes);
}

fn toleration_forgiveness(sim: &Sim<'_>, ctl: &Controller) {
    eprintln!("== scenario: forgiveness from the pods' unreachable tolerations");
    let labels = [("palisade.test/scenario", "tol")];
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new("tol-short", Some(0))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("tol-default", Some(1))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("tol-up", None)
        },
    ];
    sim.nodes(&nodes);
    namespace(&sim.c, sim.rt, "tol");
    let tolerate = |secs: i64| {
        json!({"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                "effect": "NoExecute", "tolerationSeconds": secs}]})
    };
    sim.pod_with("tol", "quick", "tol-short", &[], tolerate(3));
    // No toleration given: the API server's DefaultTolerationSeconds admission adds 300 s.
    let plain = sim.pod("tol", "plain", "tol-default", &[], None);
    let added = plain
        .spec
        .and_then(|s| s.tolerations)
        .unwrap_or_default()
        .into_iter()
        .find(|t| t.key.as_deref() == Some("node.kubernetes.io/unreachable"))
        .and_then(|t| t.toleration_seconds);
    assert_eq!(added, Some(300), "admission added the default toleration");
    sim.policy(
        "tol",
        spec(
            "tol",
            json!({"forgiveness": {"respectTolerations": true, "defaultSeconds": 0,
                                   "maxSeconds": 600}}),
        ),
    );
    let waits = || {
        metric(
            ctl,
            "palisade_decisions_total{verdict=\"wait_forgiveness\"}",
        )
    };
    let before = waits();
    let silenced = k8s_openapi::jiff::Timestamp::now();
    sim.silence("tol-short");
    sim.silence("tol-default");
    let nf = sim.wait_fence_phase("tol-short", Phase::Released, FENCED);
    assert!(
        nf.spec.reason.contains("forgiveness 3s"),
        "the pod's 3 s toleration is the forgiveness: {}",
        nf.spec.reason
    );
    // Unhealthy after 4 s of silence, then 3 s of forgiveness (1 s of slack for the last
    // renewal and tick granularity).
    let started = common::sim::phase_at(&nf, Phase::Fencing).expect("Fencing");
    let after = secs_between(silenced, started);
    eprintln!("tol-short: fencing began {after:.2}s after its Lease stopped");
    assert!(
        after >= 6.0,
        "fenced only after its forgiveness: {after:.2}s"
    );
    // Both nodes waited out their forgiveness (two wait_forgiveness verdicts); one still does.
    eventually("two wait_forgiveness verdicts", HELD, || {
        (waits() >= before + 2).then_some(())
    });
    ctl.wait_ticks(12);
    assert!(
        sim.fences("tol-default").is_empty(),
        "300 s of forgiveness: not fenced yet"
    );
    assert_eq!(powered(sim.lab)[..2], [false, true]);
    sim.reset("tol", &nodes);
}

/// A node fenced, powered back on by the controller and recovered (`Done`), then silent again:
/// held with `reason` (an Event whose message contains `message`), not fenced a second time.
fn flapping(
    sim: &Sim<'_>,
    ctl: &Controller,
    scenario: &str,
    escalation: serde_json::Value,
    reason: &str,
    message: &str,
) {
    eprintln!("== scenario: flapping node ({scenario}: {escalation})");
    let labels = [("palisade.test/scenario", scenario)];
    let node = format!("{scenario}-a");
    let up = format!("{scenario}-up");
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new(&node, Some(0))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new(&up, None)
        },
    ];
    sim.nodes(&nodes);
    sim.policy(
        scenario,
        spec(
            scenario,
            json!({"recovery": {"powerOn": true, "untaintWhen": "NodeReady"},
                   "escalation": escalation}),
        ),
    );
    sim.silence(&node);
    // Fenced, then powered on again by the controller.
    sim.wait_fence_phase(&node, Phase::Recovering, FENCED);
    sim.lab.machines()[0]
        .wait_power(true, FENCED)
        .expect("the controller powers the machine back on");
    // The node comes back (its Lease is renewed again): the fence completes.
    sim.revive(&node);
    let done = sim.wait_fence_phase(&node, Phase::Done, FENCED);
    let phases: Vec<Phase> = done
        .status
        .iter()
        .flat_map(|s| &s.transitions)
        .map(|t| t.phase)
        .collect();
    assert_eq!(
        phases,
        [
            Phase::Pending,
            Phase::Fencing,
            Phase::Fenced,
            Phase::Releasing,
            Phase::Released,
            Phase::Recovering,
            Phase::Done
        ]
    );
    // It goes silent again: held, not fenced in a loop.
    sim.silence(&node);
    let msg = sim.wait_event(&node, reason, HELD);
    assert!(msg.contains(message), "{msg}");
    ctl.wait_ticks(12);
    assert_eq!(sim.fences(&node).len(), 1, "no second NodeFence");
    assert!(sim.lab.machines()[0].is_powered(), "not powered off again");
    sim.reset(scenario, &nodes);
}

fn cooldown(sim: &Sim<'_>, ctl: &Controller) {
    flapping(
        sim,
        ctl,
        "cool",
        json!({"cooldownSeconds": 600, "maxFencesPerWindow": 3, "windowSeconds": 86400}),
        "FenceHeldCooldown",
        "cooldown until",
    );
}

fn escalation_limit(sim: &Sim<'_>, ctl: &Controller) {
    // No cooldown at all: only the escalation limit (1 fence per day) stops the second fence.
    flapping(
        sim,
        ctl,
        "esc",
        json!({"cooldownSeconds": 0, "maxFencesPerWindow": 1, "windowSeconds": 86400}),
        "FenceHeldEscalationLimit",
        "fenced 1 times within 86400s",
    );
}

#[test]
fn forgiveness_pdb_urgency_and_flapping_guards() {
    let lab = common::sim::bare_lab(2);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    let ctl = start_controller(&lab, "ctl-timing");
    type Scenario = fn(&Sim<'_>, &Controller);
    let scenarios: [(&str, Scenario); 4] = [
        ("PDB urgency", pdb_urgency),
        ("toleration forgiveness", toleration_forgiveness),
        ("cooldown", cooldown),
        ("escalation limit", escalation_limit),
    ];
    for (name, run) in scenarios {
        let t = std::time::Instant::now();
        run(&sim, &ctl);
        eprintln!("{name}: {:.1}s", t.elapsed().as_secs_f64());
    }
}

/// After a fence that Failed (its only level is a BMC that never answers), the operator fixes
/// the FenceTarget and asks for the still-silent node to be fenced with a manual `NodeFence`
/// carrying every override. That request fences the node: nothing was ever done to it, its
/// pods are still stuck. The cooldown, counted from the Failed fence's end, holds automatic
/// retries (no BMC hammering), but the `escalation` override lets a person through.
#[test]
fn manual_retry_after_a_failed_fence_is_not_held_by_the_cooldown() {
    let lab = common::sim::bare_lab(1);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    let _ctl = start_controller(&lab, "ctl-retry");
    let labels = [("palisade.test/scenario", "retry")];
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new("retry-a", None)
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("retry-up", None)
        },
    ];
    sim.nodes(&nodes);
    let m = &lab.machines()[0];
    secret(
        &sim.c,
        &rt,
        "bmc-retry-a",
        &[("password", &m.bmc().password().unwrap())],
    );
    let dead = format!(
        "ipmi://admin@127.0.0.1:{}?cipher=3",
        palisade_scenario::free_port()
    );
    let mut dead_device = device(&dead, "bmc-retry-a");
    dead_device["timeoutSeconds"] = json!(2);
    fence_target(
        &sim.c,
        &rt,
        "retry-a",
        vec![("wrong-bmc", vec![dead_device])],
    );
    sim.policy("retry", spec("retry", json!({})));
    sim.silence("retry-a");
    sim.wait_fence_phase("retry-a", Phase::Failed, FENCED);
    assert!(m.is_powered(), "nothing was done to the machine");
    // The operator fixes the FenceTarget and asks for a fence, overriding every guard.
    let targets: kube::Api<palisade_model::FenceTarget> = kube::Api::all(sim.c.clone());
    let fixed = json!({"spec": {"levels": [{"name": "ipmi",
        "devices": [device(&ipmi_url(&lab, 0), "bmc-retry-a")]}]}});
    rt.block_on(targets.patch(
        "retry-a",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&fixed),
    ))
    .expect("fix the FenceTarget");
    let fences: kube::Api<palisade_model::NodeFence> = kube::Api::all(sim.c.clone());
    let manual: palisade_model::NodeFence = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "NodeFence",
        "metadata": {"name": "manual-retry-a"},
        "spec": {"nodeName": "retry-a", "reason": "BMC address fixed; retry",
                 "requestedBy": "Manual",
                 "overrides": {"quorumGuard": true, "forgiveness": true,
                               "nodeHealth": true, "escalation": true}},
    }))
    .unwrap();
    rt.block_on(fences.create(&kube::api::PostParams::default(), &manual))
        .expect("create the manual NodeFence");
    let first = eventually("the manual request decided", HELD, || {
        let st = rt.block_on(fences.get("manual-retry-a")).ok()?.status?;
        (st.phase != Phase::Pending || st.verdict.is_some()).then_some(st)
    });
    let label = first.verdict.map(|v| format!("{}: {}", v.label, v.message));
    assert!(
        first.phase != Phase::Pending,
        "the manual retry was held: {label:?}"
    );
    sim.wait_fence_phase("retry-a", Phase::Released, FENCED);
    assert!(!m.is_powered(), "fenced by the manual retry");
}
