//! The quorum guard: with two of three machines silent, the controller's side may be the
//! partitioned one, so nothing is fenced and the hold is reported.

mod common;

use std::time::Duration;

use common::*;
use palisade_lab::Cut;

#[test]
fn two_of_three_silent_machines_are_held_not_fenced() {
    let lab = start_lab(3, false);
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    let ctl = start_controller(&lab, "ctl-q");
    policy(&c, &rt);
    ipmi_targets(&lab, &c, &rt);

    lab.partition(0, Cut::All).unwrap();
    lab.partition(1, Cut::All).unwrap();

    // The hold is reported on a silent node, with its reason.
    let ev = eventually(
        "a FenceHeldQuorumLost Event",
        Duration::from_secs(90),
        || {
            ["m0", "m1"]
                .iter()
                .flat_map(|n| events(&c, &rt, "default", n, "FenceHeldQuorumLost"))
                .next()
        },
    );
    eprintln!("held: {}", ev.message.clone().unwrap_or_default());
    assert!(ev.message.unwrap_or_default().contains("2 of 3"));
    // Let the controller re-decide many times (8 s of 250 ms ticks) with both nodes silent.
    ctl.wait_ticks(32);
    for n in ["m0", "m1", "m2"] {
        assert!(fences_for(&c, &rt, n).is_empty(), "no NodeFence for {n}");
    }
    for i in [0, 1] {
        let m = &lab.machines()[i];
        assert!(
            m.is_powered() && !m.processes().is_empty(),
            "{} still runs",
            m.name()
        );
    }
    let metrics = ctl.metrics().unwrap_or_default();
    assert!(
        metrics.contains("palisade_held_decisions_total{reason=\"quorum_lost\"}"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("palisade_fences_total{outcome="),
        "{metrics}"
    );
}
