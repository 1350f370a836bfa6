//! Identity by default (issue 32 item 8): a BMC address wired to the wrong machine never
//! powers a healthy machine off. m0 and m1 are QEMU VMs, each with an `ipmi_sim` BMC that
//! reports its own machine's SMBIOS UUID as its system GUID (in the SMBIOS byte order, as real
//! BMCs do); their agents report that UUID as the Node's `systemUUID`. m0's FenceTarget names
//! m1's BMC (a miswired or mistyped address) with m1's credentials, and no `guid=` pin: nobody
//! set one. Two simulated nodes keep quorum.
//!
//! Before the fix, cutting m0 switched the healthy m1 off and released m0's pod while m0 still
//! ran. Now the controller pins every direct BMC to the Node's `systemUUID`: the readiness
//! check reports the mismatch, the fence's level fails with `identity_mismatch`, nothing is
//! commanded, m1 keeps running and m0's pod is not released.

mod common;

use std::time::Duration;

use common::sim::{Sim, SimNode};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use palisade_lab::{Cut, MachineKind};
use palisade_model::nodefence::{DeviceAction, Phase};
use palisade_model::FenceTarget;

#[test]
fn a_fence_target_naming_another_machines_bmc_never_powers_it_off() {
    let lab = palisade_scenario::lab_of_kind(MachineKind::Qemu, 2, false, &Default::default())
        .expect("lab of two QEMU machines starts");
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    namespace(&c, &rt, "app");
    let (m0, m1) = (&lab.machines()[0], &lab.machines()[1]);
    let _ctl = start_controller(&lab, "ctl-qemu-identity");
    let sim = Sim::new(&lab, &rt);
    sim.nodes(&[SimNode::new("s1", None), SimNode::new("s2", None)]);
    policy(&c, &rt);
    // m0's FenceTarget names m1's BMC, with m1's password: the wiring mistake.
    secret(
        &c,
        &rt,
        "bmc-miswired",
        &[("password", &m1.bmc().password().unwrap())],
    );
    fence_target(
        &c,
        &rt,
        "m0",
        vec![("ipmi", vec![device(&ipmi_url(&lab, 1), "bmc-miswired")])],
    );
    let pod = running_worker(&c, &rt, "m0");

    // Readiness already says so, before anything fails.
    let targets: Api<FenceTarget> = Api::all(c.clone());
    let why = eventually(
        "m0's FenceTarget reports the identity mismatch",
        Duration::from_secs(120),
        || {
            let t = rt.block_on(targets.get_opt("m0")).ok()??;
            let r = t.status?.readiness?;
            let d = r.levels.first()?.devices.first()?.clone();
            (!r.ready && d.last_error.contains("identity")).then_some(d.last_error)
        },
    );
    eprintln!("readiness: {why}");

    let qemu_m0 = m0.power_pid().expect("m0 runs");
    let qemu_m1 = m1.power_pid().expect("m1 runs");
    lab.partition(0, Cut::All).unwrap();
    let nf = eventually(
        "m0's fence fails on the identity mismatch",
        Duration::from_secs(120),
        || {
            fences_for(&c, &rt, "m0")
                .into_iter()
                .find(|f| f.status.as_ref().is_some_and(|s| s.phase == Phase::Failed))
        },
    );
    let st = nf.status.clone().unwrap();
    eprintln!("{:?}", st.failure);
    assert!(st.verified_fence().is_none(), "no verified fence: {st:?}");
    let offs: Vec<_> = st
        .attempts
        .iter()
        .filter(|a| a.action == DeviceAction::PowerOff)
        .collect();
    assert!(!offs.is_empty(), "the level was tried: {st:?}");
    assert!(
        offs.iter().all(|a| a.message.contains("identity")),
        "every power-off attempt was refused on the identity: {offs:?}"
    );
    assert!(st.release.pods.is_empty(), "nothing released: {st:?}");
    // The healthy m1 was never switched off, and m0 still runs its pod.
    assert!(palisade_lab::process::alive(qemu_m1), "m1 still runs");
    assert!(m1.is_powered(), "m1's BMC reports it on");
    assert!(palisade_lab::process::alive(qemu_m0), "m0 still runs");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");
    let still = rt
        .block_on(pods.get_opt("worker"))
        .unwrap()
        .expect("the pod was not deleted");
    assert_eq!(still.metadata.uid, pod.metadata.uid);
}
