//! A host that must not be powered off, on a real (emulated) machine: m0 is a QEMU VM whose
//! BMC is `ipmi_sim`, running `palisade-node` inside the guest; its only level says
//! `powerOff: Disallowed` (the lab storage firewall, then its BMC). Two simulated nodes keep
//! quorum.
//!
//! When m0 is cut off, the controller blocks its storage (verified), then the BMC's hard reset
//! really restarts the VM in place: the same QEMU process (the power never went off), a new boot
//! ID inside the guest. When the link comes back, the new boot's agent renews, its boot ID is the
//! clean proof, the block is lifted and the fence is Done, without any power command.

mod common;

use std::time::Duration;

use common::no_power_off::{assert_no_power_command, reset_target, storage_then_reset};
use common::sim::{Sim, SimNode};
use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use palisade_lab::{Cut, Lab, LabConfig, MachineKind, QemuConfig};
use palisade_model::nodefence::{AttemptOutcome, DeviceAction, Phase};
use serde_json::json;

#[test]
fn a_qemu_machine_that_must_not_power_off_is_reset_in_place_and_unblocked_on_its_new_boot() {
    let command =
        palisade_scenario::node_agent_command(&Default::default()).expect("palisade-node is built");
    let lab = Lab::start(LabConfig {
        machines: 1,
        control_plane: true,
        pdu: false,
        machine_command: command,
        machine_kind: MachineKind::Qemu,
        qemu: QemuConfig::default(),
        ..Default::default()
    })
    .expect("lab with a QEMU machine starts");
    let m0 = &lab.machines()[0];
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    let storage = palisade_scenario::Storage::start(&lab, &["db"]).expect("storage server");
    let ctl = start_controller(&lab, "ctl-qemu-reset");
    let sim = Sim::new(&lab, &rt);
    sim.nodes(&[SimNode::new("s1", None), SimNode::new("s2", None)]);
    policy_with(
        &c,
        &rt,
        json!({"recovery": {"powerOn": true, "untaintWhen": "NodeReady"}}),
    );
    reset_target(&lab, &c, &rt, &storage, false);

    let qemu = m0.power_pid().expect("the VM runs");
    let first_boot = m0.boot_id().expect("the guest wrote its boot ID");
    let nodes: Api<Node> = Api::all(c.clone());
    let reported = rt
        .block_on(nodes.get("m0"))
        .ok()
        .and_then(|n| n.status?.node_info)
        .map(|i| i.boot_id);
    assert_eq!(reported.as_deref(), Some(first_boot.as_str()));

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    lab.partition(0, Cut::All).unwrap();
    let nf = eventually(
        "m0 fenced and its reset sent",
        Duration::from_secs(180),
        || {
            fences_for(&c, &rt, "m0").into_iter().find(|f| {
                f.status.as_ref().is_some_and(|s| {
                    s.verified_fence().is_some()
                        && s.attempts.iter().any(|a| a.action == DeviceAction::Reset)
                })
            })
        },
    );
    let st = nf.status.clone().unwrap();
    let reset = storage_then_reset(&st);
    assert_eq!(
        reset.outcome,
        AttemptOutcome::Succeeded,
        "the QEMU machine's BMC accepts a hard reset"
    );
    // The VM restarts in place: a new boot ID inside the guest, the same QEMU process.
    let second_boot = m0
        .wait_booted(Some(&first_boot), Duration::from_secs(240))
        .expect("the guest boots again after the reset");
    assert_ne!(second_boot, first_boot);
    assert_eq!(m0.power_pid(), Some(qemu), "the power never went off");
    assert!(m0.is_powered());

    // The link comes back: the new boot's agent renews; its boot ID is the proof.
    lab.heal(0).unwrap();
    let done = eventually("m0's NodeFence Done", Duration::from_secs(240), || {
        fences_for(&c, &rt, "m0").into_iter().find(|f| {
            f.metadata.name == nf.metadata.name
                && f.status.as_ref().is_some_and(|s| s.phase == Phase::Done)
        })
    });
    print_timeline(&done, t_cut);
    let st = done.status.unwrap();
    let proof = st.recovery.clean_proof.clone().unwrap_or_default();
    eprintln!("clean proof: {proof}");
    assert!(proof.contains(&second_boot), "proof: {proof:?}");
    assert!(st.recovery.unfenced_at.is_some(), "storage unblocked");
    assert!(st.recovery.powered_on_at.is_none());
    assert_no_power_command(&st);
    assert_eq!(m0.power_pid(), Some(qemu), "the same VM process throughout");
    drop(ctl);
}
