//! The watchdog is the proof, on a real (emulated) watchdog. m0 is a QEMU VM whose BMC is
//! `ipmi_sim`, with an i6300esb watchdog whose driver was loaded with a 30 s heartbeat and
//! `nowayout`; its `palisade-node` (the suite's own binary, run inside the guest) arms the
//! watchdog itself with a 6 s timeout, reads back what the driver holds, and advertises it
//! with every Lease renewal. Two simulated nodes keep quorum.
//!
//! With `trustSelfFence` on and no FenceTarget, the agent is frozen (SIGSTOP, inside the
//! guest): nothing pets the watchdog, the VM is powered off by it, and only after that does
//! the controller, on its own clock (last renewal + self-fence timeout + twice the advertised
//! watchdog timeout + margin), trust the self-fence and release the pod. The test fails if the agent
//! advertised a timeout the driver does not hold (the 30 s default would fire after the
//! release), or if the release came before the VM was gone.

mod common;

use std::time::Duration;

use common::sim::{released_on_self_fence, Sim, SimNode};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use palisade_model::advertise::{
    VIRTUALIZATION, WATCHDOG_ACTION, WATCHDOG_DRIVER, WATCHDOG_NOWAYOUT, WATCHDOG_TIMEOUT,
};
use serde_json::json;

/// The guest's command: the node agent with the watchdog, frozen when `/machine/freeze`
/// appears.
fn agent_command() -> String {
    let agent = palisade_lab::bin_path("palisade-node").expect("palisade-node is built");
    format!(
        r#"mkdir -p /var/lib/palisade-node
RUST_LOG=info,kube=warn '{agent}' --node-name "$PALISADE_MACHINE_NAME" --kubeconfig "$PALISADE_NODE_KUBECONFIG" \
  --address "$PALISADE_MACHINE_ADDRESS" --state-dir /var/lib/palisade-node --image-store /var/lib/palisade-node/images \
  --lease-duration 10s --renew-interval 1s --self-fence-after 4s --no-peer-check \
  --watchdog /dev/watchdog --watchdog-timeout 6s --watchdog-interval 1s \
  --metrics-addr 127.0.0.1:10255 >> /machine/agent.log 2>&1 &
echo $! > /machine/agent.pid
while [ ! -e /machine/freeze ]; do sleep 0.2; done
kill -STOP "$(cat /machine/agent.pid)" && echo frozen > /machine/frozen"#,
        agent = agent.display()
    )
}

#[test]
fn a_frozen_agent_is_powered_off_by_its_watchdog_before_the_controller_trusts_its_self_fence() {
    let lab = qemu_watchdog_lab(agent_command());
    let m = &lab.machines()[0];
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    namespace(&c, &rt, "app");

    // The machine's identity, as its agent reports it from inside the VM.
    let node = rt
        .block_on(Api::<Node>::all(c.clone()).get("m0"))
        .expect("Node m0");
    let info = node.status.and_then(|s| s.node_info).expect("nodeInfo");
    assert_eq!(Some(info.boot_id.as_str()), m.boot_id().as_deref());
    assert_eq!(info.system_uuid.to_lowercase(), m.system_uuid());

    // What the agent advertises is what the driver holds: 6 s (not the 30 s it was loaded
    // with), nowayout.
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let ad = eventually(
        "m0 advertises its armed watchdog",
        Duration::from_secs(60),
        || {
            let l = rt.block_on(leases.get_opt("m0")).ok().flatten()?;
            let a = l.metadata.annotations.unwrap_or_default();
            Some((
                a.get(WATCHDOG_TIMEOUT)?.clone(),
                a.get(WATCHDOG_NOWAYOUT)?.clone(),
                a.get(WATCHDOG_ACTION)?.clone(),
                a.get(WATCHDOG_DRIVER)?.clone(),
                a.get(VIRTUALIZATION)?.clone(),
            ))
        },
    );
    // The guest is a QEMU VM: its emulated i6300esb does what the hypervisor says, and the
    // agent says so (a policy must accept virtual machines to trust it, below).
    assert_eq!(
        (&ad.0[..], &ad.1[..], &ad.2[..], &ad.3[..]),
        ("6", "true", "hypervisor", "i6300esb"),
        "{ad:?}"
    );
    assert!(
        ad.4 != "none" && ad.4 != "unknown",
        "the guest is detected as a virtual machine: {ad:?}"
    );

    // The controller installs the CRDs.
    let _ctl = start_controller(&lab, "ctl-qemu-wd");
    let sim = Sim::new(&lab, &rt);
    sim.nodes(&[SimNode::new("s1", None), SimNode::new("s2", None)]);
    policy_with(
        &c,
        &rt,
        // The guest is a QEMU VM with an emulated i6300esb: the lab sets its action to reset
        // (or power off) and never pauses it, which is what accepting VMs asserts.
        json!({"trustSelfFence": {"enabled": true, "marginSeconds": 1, "virtualMachines": "Accept"}}),
    );
    let _pod = running_worker(&c, &rt, "m0");

    // Watch the VM from the host: the first moment its QEMU process is seen gone.
    let qemu = m.power_pid().expect("the VM runs");
    let watcher = watch_gone(qemu);

    std::fs::write(m.guest_dir().join("freeze"), b"").unwrap();
    eventually(
        "the agent in the guest is frozen",
        Duration::from_secs(30),
        || m.guest_dir().join("frozen").exists().then_some(()),
    );

    let releasing = released_on_self_fence(&c, &rt, "m0", Duration::from_secs(180));
    let gone = watcher
        .join()
        .unwrap()
        .expect("the watchdog powered the VM off");
    eprintln!("VM gone at {gone}, release began at {releasing}");
    assert!(
        gone < releasing,
        "the VM must be gone before anything is released (gone {gone}, releasing {releasing})"
    );
    m.wait_power(false, Duration::from_secs(60))
        .expect("the BMC reports the VM off");
}
