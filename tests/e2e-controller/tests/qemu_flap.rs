//! A flapping node whose own watchdog resets it is released on its trusted self-fence (issue
//! 38). Three QEMU machines whose agents arm the i6300esb watchdog and run the peer check; a
//! policy that trusts watchdog-backed self-fences and no FenceTarget. m0 runs a pod and is cut
//! off the control plane (it still reaches its peers), healed for 1.5 s, then cut again for
//! good: its agent self-fences, stops petting the watchdog, and the VM is reset. The
//! controller must release the pod within the advertised wait plus margin of the last
//! renewal it saw, and the release must come after the reset.
//!
//! Without the fix, the NodeFence sat in `Fencing` until `BudgetExceeded`.

mod common;

use std::time::Duration;

use common::sim::phase_at;
use common::*;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use palisade_lab::{Cut, MachineKind};
use palisade_model::nodefence::Phase;
use palisade_scenario::AgentOptions;
use serde_json::json;

/// The boot ID m0 reports through its Node (read by the test from the API).
fn node_boot_id(c: &kube::Client, rt: &tokio::runtime::Runtime, node: &str) -> Option<String> {
    let n = rt
        .block_on(Api::<Node>::all(c.clone()).get_opt(node))
        .ok()??;
    Some(n.status?.node_info?.boot_id)
}

#[test]
fn a_flapping_node_reset_by_its_own_watchdog_is_released_on_its_trusted_self_fence() {
    let agents = AgentOptions {
        lease_seconds: 10,
        self_fence_seconds: 8.0,
        watchdog: true,
        peer_check: true,
        // The worker mounts no claim: a self-fence that kills every pod covers it.
        extra_args: vec!["--self-fence-all-pods".into()],
        ..AgentOptions::default()
    };
    let lab = palisade_scenario::lab_of_kind(MachineKind::Qemu, 3, false, &agents)
        .expect("lab of three QEMU machines starts");
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    namespace(&c, &rt, "app");
    let _ctl = start_controller(&lab, "ctl-qemu-flap");
    policy_with(
        &c,
        &rt,
        // QEMU guests with the i6300esb the lab sets to reset them, never paused.
        json!({"trustSelfFence": {"enabled": true, "marginSeconds": 2, "virtualMachines": "Accept"}}),
    );
    let pod = running_worker(&c, &rt, "m0");
    let boot_before = node_boot_id(&c, &rt, "m0").expect("m0 reports its boot ID");
    // Only a member set the controller has seen earns trust (see the helper).
    palisade_scenario::wait_full_peer_sets(&lab, &c, &rt).expect("full peer sets");
    let m0 = &lab.machines()[0];

    // The flap: cut, 5.5 s later heal for 1.5 s, cut again and leave it cut.
    lab.partition(0, Cut::ControlPlane).unwrap();
    std::thread::sleep(Duration::from_millis(5_500));
    lab.heal(0).unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    let cut = Timestamp::now();
    lab.partition(0, Cut::ControlPlane).unwrap();

    // The agent self-fences 8 s after its last renewal and the watchdog (6 s) resets the VM;
    // the controller trusts the self-fence 8 + 2 × 6 + 2 s after the last renewal it saw. The
    // deadline only bounds the test: the assertion is that the fence releases at all, and
    // after the reset.
    let nf = eventually(
        "m0 released on its trusted self-fence after the flap",
        Duration::from_secs(150),
        || {
            let fences = fences_for(&c, &rt, "m0");
            if let Some(failed) = fences
                .iter()
                .find(|nf| phase_at(nf, Phase::Failed).is_some())
            {
                panic!(
                    "a NodeFence of m0 failed instead of releasing: {:?}",
                    failed.status
                );
            }
            fences
                .into_iter()
                .find(|nf| phase_at(nf, Phase::Releasing).is_some())
        },
    );
    print_timeline(&nf, cut);
    assert_released_on_self_fence(&nf);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let released = eventually("the worker released", Duration::from_secs(60), || {
        let nf = fences_for(&c, &rt, "m0")
            .into_iter()
            .find(|f| f.metadata.uid == nf.metadata.uid)?;
        let s = nf.status?;
        s.release
            .pods
            .iter()
            .any(|p| p.uid == uid)
            .then_some(s.phase)
    });
    eprintln!("the worker was released ({released:?})");
    // The machine was reset by its watchdog: a new boot ID inside the guest.
    let boot_after = eventually(
        "m0 booted again after its watchdog reset",
        Duration::from_secs(120),
        || m0.boot_id().filter(|b| *b != boot_before),
    );
    eprintln!("m0 boot {boot_before} -> {boot_after}");
}
