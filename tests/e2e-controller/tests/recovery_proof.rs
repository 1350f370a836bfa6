//! Unfence needs positive proof. m0 is fenced through the storage firewall only and cut from
//! the control plane alone, so its old writer may keep running (cut off from the volume).
//! When m0 comes back, the storage block is lifted only after the controller has positive
//! proof that the released writer's container is gone from m0 (here: the node agent's
//! runtime inventory, advertised with a renewal observed after recovery began); lifting it on
//! a merely renewed Lease would let the old writer write beside the replacement. The
//! at-most-one checker judges every write of both writers, before and after the heal.

use palisade_lab::Cut;
use palisade_scenario::headline::{self, Options, Timeline};
use palisade_scenario::{lab_with_agents, AgentOptions, Cluster};

#[test]
fn a_storage_fence_is_lifted_only_after_the_old_writer_is_proven_gone() {
    let lab = lab_with_agents(3, true, &AgentOptions::default()).expect("lab");
    let c = Cluster::connect(&lab).expect("cluster");
    c.wait_nodes_ready(&lab).expect("nodes ready");
    let t = Timeline::new(false);
    let report = headline::run(
        &lab,
        &c,
        &t,
        Options {
            storage_only: true,
            cut: Cut::ControlPlane,
            recover: true,
            ..Options::default()
        },
    )
    .expect("the scenario runs to its verdict");
    assert!(report.verdict_pass, "the at-most-one checker must pass");
}
