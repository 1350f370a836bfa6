//! Decision guards that limit fencing, end to end: the real controller binary against the
//! lab's real control plane, with simulated nodes (Node + Lease objects kept alive by the test)
//! whose FenceTargets are the machines' real BMCs, so a fence really powers a machine off.
//!
//! One lab and one controller serve four scenarios in turn (each with its own policy and
//! node names, cleaned up in between):
//! - `paused` (the gate that opens each limit scenario): silent nodes under a paused policy
//!   are held and nothing is powered off;
//! - the storm limit (`maxConcurrent: 1`): two silent nodes are fenced one after the other,
//!   never both in flight, and the waiting one is held with `ConcurrencyLimit`;
//! - the per-domain limit: two silent nodes of one zone are fenced one after the other while a
//!   silent node of another zone is fenced at the same time as the first;
//! - pausing a policy while one of its fences is under way does not abandon that fence;
//! - priority order: under `maxConcurrent: 1`, the node whose pods have the highest priority
//!   is fenced first, although the other went silent first and sorts first by name.

mod common;

use std::time::Duration;

use common::sim::{in_flight, overlap, powered, Sim, SimNode};
use common::*;
use palisade_model::nodefence::Phase;
use palisade_model::NodeFence;
use serde_json::json;

const ZONE: &str = "topology.kubernetes.io/zone";
const FENCED: Duration = Duration::from_secs(90);
const HELD: Duration = Duration::from_secs(60);

/// The scenario's policy spec with these limits, `paused` to start with.
fn spec(scenario: &str, limits: serde_json::Value) -> serde_json::Value {
    common::sim::spec(scenario, json!({"limits": limits, "paused": true}))
}

/// Silences `nodes`, waits until each is held by the paused policy and the controller has
/// re-decided for at least another 3 s (12 ticks of 250 ms; so every one is Unhealthy), checks
/// that nothing was fenced, then unpauses: every node becomes a candidate in the same round.
fn hold_paused_then_release(sim: &Sim<'_>, ctl: &Controller, policy: &str, nodes: &[&str]) {
    for n in nodes {
        sim.silence(n);
    }
    for n in nodes {
        let msg = sim.wait_event(n, "FenceHeldPaused", HELD);
        assert!(msg.contains(policy), "{n}: {msg}");
    }
    ctl.wait_ticks(12);
    for n in nodes {
        assert!(sim.fences(n).is_empty(), "paused: no NodeFence for {n}");
    }
    assert!(
        powered(sim.lab).iter().all(|p| *p),
        "paused: no machine powered off: {:?}",
        powered(sim.lab)
    );
    sim.patch_policy(policy, json!({"paused": false}));
}

/// The node's single NodeFence (asserting there is exactly one).
fn only_fence(sim: &Sim<'_>, node: &str) -> NodeFence {
    let mut f = sim.fences(node);
    assert_eq!(f.len(), 1, "exactly one NodeFence for {node}: {f:?}");
    f.remove(0)
}

fn storm_limit(sim: &Sim<'_>, ctl: &Controller) {
    eprintln!("== scenario: storm limit (maxConcurrent 1)");
    let labels = [("palisade.test/scenario", "storm")];
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new("storm-a", Some(0))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("storm-b", Some(1))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("storm-up", None)
        },
    ];
    sim.nodes(&nodes);
    // Only the cluster-wide limit binds: the domain limit (all three share the domain "") is
    // raised out of the way.
    sim.policy(
        "storm",
        spec(
            "storm",
            json!({"maxUnhealthy": "100%", "maxConcurrent": 1,
                   "perDomain": {"maxConcurrent": 10}}),
        ),
    );
    hold_paused_then_release(sim, ctl, "storm", &["storm-a", "storm-b"]);

    // One of the two is held by the limit while the other is fenced.
    let held = eventually("one node held by the concurrency limit", HELD, || {
        ["storm-a", "storm-b"]
            .into_iter()
            .find(|n| !sim.events(n, "FenceHeldConcurrencyLimit").is_empty())
    });
    let first = if held == "storm-a" {
        "storm-b"
    } else {
        "storm-a"
    };
    let msg = sim.wait_event(held, "FenceHeldConcurrencyLimit", HELD);
    assert!(msg.contains("maxConcurrent is 1"), "{msg}");
    assert!(
        sim.events(first, "FenceHeldConcurrencyLimit").is_empty(),
        "{first} was admitted first and never held"
    );
    // Both are fenced in the end: the limit delays, it does not drop.
    sim.wait_fence_phase(first, Phase::Released, FENCED);
    sim.wait_fence_phase(held, Phase::Released, FENCED);
    let (f1, f2) = (only_fence(sim, first), only_fence(sim, held));
    let (i1, i2) = (in_flight(&f1), in_flight(&f2));
    eprintln!("{first} in flight {i1:?}; {held} in flight {i2:?}");
    assert!(
        !overlap(i1, i2),
        "never two fences in flight with maxConcurrent 1: {first} {i1:?}, {held} {i2:?}"
    );
    assert!(
        i2.0 >= i1.1.unwrap(),
        "{held} started after {first} was released"
    );
    assert_eq!(powered(sim.lab)[..2], [false, false], "both machines off");
    assert!(sim.fences("storm-up").is_empty());
    sim.reset("storm", &nodes);
}

fn domain_limit(sim: &Sim<'_>, ctl: &Controller) {
    eprintln!("== scenario: per-domain limit (perDomain.maxConcurrent 1, maxConcurrent 3)");
    let a = [("palisade.test/scenario", "domain"), (ZONE, "a")];
    let b = [("palisade.test/scenario", "domain"), (ZONE, "b")];
    let nodes = [
        SimNode {
            labels: &a,
            ..SimNode::new("dom-a1", Some(0))
        },
        SimNode {
            labels: &a,
            ..SimNode::new("dom-a2", Some(1))
        },
        SimNode {
            labels: &b,
            ..SimNode::new("dom-b1", Some(2))
        },
        SimNode {
            labels: &b,
            ..SimNode::new("dom-b-up", None)
        },
    ];
    sim.nodes(&nodes);
    sim.policy(
        "domain",
        spec(
            "domain",
            json!({"maxUnhealthy": "100%", "maxConcurrent": 3,
                   "perDomain": {"topologyKey": ZONE, "maxConcurrent": 1}}),
        ),
    );
    hold_paused_then_release(sim, ctl, "domain", &["dom-a1", "dom-a2", "dom-b1"]);

    let held = eventually("one zone-a node held by the domain limit", HELD, || {
        ["dom-a1", "dom-a2"]
            .into_iter()
            .find(|n| !sim.events(n, "FenceHeldDomainLimit").is_empty())
    });
    let first = if held == "dom-a1" { "dom-a2" } else { "dom-a1" };
    let msg = sim.wait_event(held, "FenceHeldDomainLimit", HELD);
    assert!(
        msg.contains("domain \"a\"") && msg.contains("perDomain.maxConcurrent is 1"),
        "{msg}"
    );
    sim.wait_fence_phase(first, Phase::Released, FENCED);
    sim.wait_fence_phase("dom-b1", Phase::Released, FENCED);
    sim.wait_fence_phase(held, Phase::Released, FENCED);
    let fa1 = in_flight(&only_fence(sim, first));
    let fa2 = in_flight(&only_fence(sim, held));
    let fb = in_flight(&only_fence(sim, "dom-b1"));
    eprintln!("{first} {fa1:?}; {held} {fa2:?}; dom-b1 {fb:?}");
    assert!(
        !overlap(fa1, fa2),
        "never two fences in flight in zone a: {first} {fa1:?}, {held} {fa2:?}"
    );
    assert!(
        overlap(fa1, fb),
        "zone b's fence ran at the same time as zone a's first: {fa1:?}, {fb:?}"
    );
    for reason in ["FenceHeldDomainLimit", "FenceHeldConcurrencyLimit"] {
        assert!(
            sim.events("dom-b1", reason).is_empty(),
            "dom-b1 is alone in its zone: never {reason}"
        );
    }
    assert_eq!(powered(sim.lab)[..3], [false, false, false]);
    assert!(sim.fences("dom-b-up").is_empty());
    sim.reset("domain", &nodes);
}

fn priority_order(sim: &Sim<'_>, ctl: &Controller) {
    eprintln!("== scenario: priority order (maxConcurrent 1)");
    let labels = [("palisade.test/scenario", "prio")];
    // The low-priority node sorts first by name and goes silent first: only priority can put
    // the other one first.
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new("prio-a-low", Some(0))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("prio-b-high", Some(1))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("prio-up", None)
        },
    ];
    sim.nodes(&nodes);
    namespace(&sim.c, sim.rt, "prio");
    sim.priority_class("palisade-test-low", 100);
    sim.priority_class("palisade-test-high", 1_000_000);
    let low = sim.pod(
        "prio",
        "batch",
        "prio-a-low",
        &[],
        Some("palisade-test-low"),
    );
    let high = sim.pod("prio", "db", "prio-b-high", &[], Some("palisade-test-high"));
    sim.pod("prio", "plain", "prio-a-low", &[], None);
    assert_eq!(low.spec.unwrap().priority, Some(100));
    assert_eq!(high.spec.unwrap().priority, Some(1_000_000));
    sim.policy(
        "prio",
        spec(
            "prio",
            json!({"maxUnhealthy": "100%", "maxConcurrent": 1,
                   "perDomain": {"maxConcurrent": 10}}),
        ),
    );
    sim.silence("prio-a-low");
    sim.wait_event("prio-a-low", "FenceHeldPaused", HELD);
    hold_paused_then_release(sim, ctl, "prio", &["prio-a-low", "prio-b-high"]);

    let msg = sim.wait_event("prio-a-low", "FenceHeldConcurrencyLimit", HELD);
    assert!(msg.contains("maxConcurrent is 1"), "{msg}");
    assert!(sim
        .events("prio-b-high", "FenceHeldConcurrencyLimit")
        .is_empty());
    let hi = sim.wait_fence_phase("prio-b-high", Phase::Released, FENCED);
    let lo = sim.wait_fence_phase("prio-a-low", Phase::Released, FENCED);
    let (ih, il) = (in_flight(&hi), in_flight(&lo));
    eprintln!("high {ih:?}; low {il:?}");
    assert!(
        il.0 >= ih.1.unwrap(),
        "the high-priority node was fenced first: high {ih:?}, low {il:?}"
    );
    assert_eq!(powered(sim.lab)[..2], [false, false]);
    sim.reset("prio", &nodes);
}

fn paused_mid_fence(sim: &Sim<'_>, _ctl: &Controller) {
    eprintln!("== scenario: pausing does not abandon a fence under way");
    let labels = [("palisade.test/scenario", "midpause")];
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new("midpause-a", None)
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("midpause-up", None)
        },
    ];
    sim.nodes(&nodes);
    // A first level whose BMC never answers (4 s timeout) keeps the fence in Fencing long
    // enough to pause the policy under it; the second level is machine 0's real BMC.
    let m = &sim.lab.machines()[0];
    secret(
        &sim.c,
        sim.rt,
        "bmc-midpause-a",
        &[("password", &m.bmc().password().unwrap())],
    );
    let dead = format!(
        "ipmi://admin@127.0.0.1:{}?cipher=3",
        palisade_scenario::free_port()
    );
    let mut dead_device = device(&dead, "bmc-midpause-a");
    dead_device["timeoutSeconds"] = json!(4);
    fence_target(
        &sim.c,
        sim.rt,
        "midpause-a",
        vec![
            ("silent-bmc", vec![dead_device]),
            (
                "ipmi",
                vec![device(&ipmi_url(sim.lab, 0), "bmc-midpause-a")],
            ),
        ],
    );
    let mut s = spec(
        "midpause",
        json!({"maxUnhealthy": "100%", "maxConcurrent": 1}),
    );
    s["paused"] = json!(false);
    sim.policy("midpause", s);
    sim.silence("midpause-a");
    eventually("midpause-a's fence in Fencing", FENCED, || {
        sim.fences("midpause-a").into_iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|st| st.phase == Phase::Fencing)
        })
    });
    sim.patch_policy("midpause", json!({"paused": true}));
    let paused_at = k8s_openapi::jiff::Timestamp::now();
    let nf = sim.wait_fence_phase("midpause-a", Phase::Released, FENCED);
    let verified = common::sim::phase_at(&nf, Phase::Fenced).expect("Fenced");
    eprintln!("paused at {paused_at}, verified fenced at {verified}");
    assert!(
        verified > paused_at,
        "the fence was still unverified when the policy was paused"
    );
    assert!(!sim.lab.machines()[0].is_powered(), "the fence completed");
    sim.reset("midpause", &nodes);
}

#[test]
fn storm_domain_and_priority_limits_order_fences() {
    let lab = common::sim::bare_lab(3);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    let ctl = start_controller(&lab, "ctl-limits");
    let t0 = std::time::Instant::now();
    storm_limit(&sim, &ctl);
    eprintln!("storm limit: {:.1}s", t0.elapsed().as_secs_f64());
    let t1 = std::time::Instant::now();
    domain_limit(&sim, &ctl);
    eprintln!("domain limit: {:.1}s", t1.elapsed().as_secs_f64());
    let t2 = std::time::Instant::now();
    priority_order(&sim, &ctl);
    eprintln!("priority order: {:.1}s", t2.elapsed().as_secs_f64());
    let t3 = std::time::Instant::now();
    paused_mid_fence(&sim, &ctl);
    eprintln!("paused mid-fence: {:.1}s", t3.elapsed().as_secs_f64());
    let m = ctl.metrics().unwrap_or_default();
    for reason in ["paused", "concurrency_limit", "domain_limit"] {
        assert!(
            common::sim::metric(
                &ctl,
                &format!("palisade_held_decisions_total{{reason=\"{reason}\"}}")
            ) >= 1,
            "held decisions by reason {reason} counted: {m}"
        );
    }
}
