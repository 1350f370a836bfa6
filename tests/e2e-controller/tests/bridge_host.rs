//! The node that hosts the firmware-bridge is never fenced through the bridge (that would stop
//! the fencer half-way). Against the real controller (told `PALISADE_BRIDGE_NODE`) and API
//! server, with simulated nodes: the bridge's host, silent, whose only level goes through the
//! bridge, is held (`FenceHeldBridgeHost`, no NodeFence); another silent node with the same
//! kind of FenceTarget is fenced as usual (its NodeFence starts).

mod common;

use std::time::Duration;

use common::sim::{spec, Sim, SimNode};
use common::*;
use palisade_model::nodefence::Phase;
use serde_json::json;

#[test]
fn the_bridge_host_is_held_when_every_level_goes_through_the_bridge() {
    let lab = common::sim::bare_lab(1);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    let _ctl = start_controller_with_env(
        &lab,
        "ctl-bridge-host",
        &[("PALISADE_BRIDGE_NODE", "bh-host".to_string())],
    );
    let labels = [("palisade.test/scenario", "bridgehost")];
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new("bh-host", None)
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("bh-other", None)
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("bh-up", None)
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("bh-up2", None)
        },
    ];
    sim.nodes(&nodes);
    for n in ["bh-host", "bh-other"] {
        fence_target(
            &sim.c,
            &rt,
            n,
            vec![(
                "bridge",
                vec![json!({"url": format!("bridge://127.0.0.1:1/{n}"), "kind": "Power"})],
            )],
        );
    }
    sim.policy("bridgehost", spec("bridgehost", json!({})));
    sim.silence("bh-host");
    sim.silence("bh-other");
    let msg = sim.wait_event("bh-host", "FenceHeldBridgeHost", Duration::from_secs(60));
    assert!(msg.contains("firmware-bridge"), "{msg}");
    // The other node, configured the same way, is fenced (its NodeFence starts).
    sim.wait_fence_phase("bh-other", Phase::Fencing, Duration::from_secs(60));
    assert!(
        sim.fences("bh-host").is_empty(),
        "no NodeFence for the bridge's host"
    );
}
