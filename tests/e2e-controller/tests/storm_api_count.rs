//! Limits counted from the API: six simulated nodes (each with a real BMC) go silent in the
//! same decision round under `maxConcurrent: 2`. While they are fenced, the test polls the API
//! (a fresh LIST of NodeFences each time) and never sees more than two fences in flight
//! (Fencing, Fenced or Releasing), by phase at the moment of the read and by the recorded
//! transition times; every node is fenced in the end.

mod common;

use std::time::Duration;

use common::sim::{in_flight, powered, Sim, SimNode};
use common::*;
use kube::api::ListParams;
use kube::Api;
use palisade_model::nodefence::Phase;
use palisade_model::NodeFence;
use serde_json::json;

const MAX: usize = 2;
const SILENT: [&str; 6] = ["st-0", "st-1", "st-2", "st-3", "st-4", "st-5"];

#[test]
fn never_more_fences_in_flight_than_max_concurrent() {
    let lab = common::sim::bare_lab(SILENT.len());
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    let ctl = start_controller(&lab, "ctl-storm");

    let labels = [("palisade.test/scenario", "storm6")];
    let mut nodes: Vec<SimNode<'_>> = SILENT
        .iter()
        .enumerate()
        .map(|(i, n)| SimNode {
            labels: &labels,
            ..SimNode::new(n, Some(i))
        })
        .collect();
    nodes.push(SimNode {
        labels: &labels,
        ..SimNode::new("st-up", None)
    });
    sim.nodes(&nodes);
    sim.policy(
        "storm6",
        common::sim::spec(
            "storm6",
            json!({"limits": {"maxUnhealthy": "100%", "maxConcurrent": MAX,
                              "perDomain": {"maxConcurrent": 10}},
                   "paused": true}),
        ),
    );
    // Every node silent and Unhealthy while the policy is paused, then all become candidates
    // in the same round.
    for n in SILENT {
        sim.silence(n);
    }
    for n in SILENT {
        sim.wait_event(n, "FenceHeldPaused", Duration::from_secs(60));
    }
    ctl.wait_ticks(12);
    assert!(SILENT.iter().all(|n| sim.fences(n).is_empty()));
    sim.patch_policy("storm6", json!({"paused": false}));

    // Poll the API until every node is Released (bounded in time and count).
    let api: Api<NodeFence> = Api::all(sim.c.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    let mut most = 0;
    let mut polls = 0u32;
    let fences = loop {
        assert!(
            std::time::Instant::now() < deadline && polls < 100_000,
            "every node Released within the deadline"
        );
        polls += 1;
        let all: Vec<NodeFence> = rt
            .block_on(api.list(&ListParams::default()))
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|f| SILENT.contains(&f.spec.node_name.as_str()))
            .collect();
        let phase = |f: &NodeFence| f.status.as_ref().map(|s| s.phase);
        let flying: Vec<String> = all
            .iter()
            .filter(|f| {
                matches!(
                    phase(f),
                    Some(Phase::Fencing | Phase::Fenced | Phase::Releasing)
                )
            })
            .map(|f| f.spec.node_name.clone())
            .collect();
        most = most.max(flying.len());
        assert!(
            flying.len() <= MAX,
            "at most {MAX} fences in flight, the API shows {flying:?}"
        );
        let released = all
            .iter()
            .filter(|f| phase(f) == Some(Phase::Released))
            .count();
        if released == SILENT.len() {
            break all;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("{polls} polls, at most {most} fences in flight at once");
    assert_eq!(most, MAX, "the limit was reached (the test exercised it)");

    // The recorded intervals agree: no instant is covered by more than MAX of them.
    let spans: Vec<_> = fences.iter().map(in_flight).collect();
    for (i, a) in spans.iter().enumerate() {
        // Each start is an instant: count the spans that contain it.
        let covering = spans
            .iter()
            .filter(|b| b.0 <= a.0 && b.1.is_none_or(|end| end > a.0))
            .count();
        assert!(
            covering <= MAX,
            "{} fences in flight when {} started: {spans:?}",
            covering,
            fences[i].spec.node_name
        );
    }
    assert_eq!(fences.len(), SILENT.len(), "one NodeFence per node");
    assert!(powered(&lab).iter().all(|p| !p), "every machine off");
    assert!(sim.fences("st-up").is_empty());
}
