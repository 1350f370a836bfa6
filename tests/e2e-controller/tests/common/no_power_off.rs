//! Shared by the tests of hosts that must not be powered off (`powerOff: Disallowed`).

use std::time::Duration;

use kube::api::PostParams;
use kube::{Api, Client};
use palisade_lab::Lab;
use palisade_model::nodefence::{
    AttemptOutcome, Coverage, DeviceAction, DeviceAttempt, NodeFenceStatus,
};
use palisade_model::FenceTarget;
use serde_json::json;

use super::{eventually, ipmi_url, secret};

/// The credentials and the FenceTarget of machine 0 (`m0`): one level, `powerOff:
/// Disallowed`, with its BMC and the lab storage firewall, the BMC listed first if
/// `bmc_first` (the controller must still block the storage first).
pub fn reset_target(
    lab: &Lab,
    c: &Client,
    rt: &tokio::runtime::Runtime,
    storage: &palisade_scenario::Storage,
    bmc_first: bool,
) {
    let bmc = lab.machines()[0].bmc();
    secret(c, rt, "bmc-m0", &[("password", &bmc.password().unwrap())]);
    secret(
        c,
        rt,
        "storage-m0",
        &[("caBundle", &storage.ca_pem), ("token", &storage.token)],
    );
    let power = palisade_scenario::device(&ipmi_url(lab, 0), "Power", "bmc-m0");
    let block = palisade_scenario::device(&storage.fence_url(), "Storage", "storage-m0");
    let devices = if bmc_first {
        vec![power, block]
    } else {
        vec![block, power]
    };
    let target: FenceTarget = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "FenceTarget",
        "metadata": {"name": "m0"},
        "spec": {"levels": [{
            "name": "storage+reset",
            "powerOff": "Disallowed",
            "devices": devices,
        }]},
    }))
    .unwrap();
    let targets: Api<FenceTarget> = Api::all(c.clone());
    eventually("FenceTarget created", Duration::from_secs(30), || {
        rt.block_on(targets.create(&PostParams::default(), &target))
            .ok()
    });
}

/// Prints the attempts and checks the fence: verified on the storage block alone, the block
/// verified before the reset was asked for, and no power command. Returns the reset attempt.
pub fn storage_then_reset(st: &NodeFenceStatus) -> &DeviceAttempt {
    for a in &st.attempts {
        eprintln!(
            "attempt: {:?} {} {:?}: {}",
            a.action, a.device, a.outcome, a.message
        );
    }
    assert_eq!(st.verified_fence().unwrap().coverage(), Coverage::Stateful);
    let block = st
        .attempts
        .iter()
        .position(|a| a.action == DeviceAction::Block && a.outcome == AttemptOutcome::Succeeded)
        .expect("a verified storage block");
    let reset = st
        .attempts
        .iter()
        .position(|a| a.action == DeviceAction::Reset)
        .expect("a reset was asked for");
    assert!(block < reset, "storage before the reset: {:?}", st.attempts);
    assert_no_power_command(st);
    &st.attempts[reset]
}

/// No power off and no power on was ever sent.
pub fn assert_no_power_command(st: &NodeFenceStatus) {
    assert!(
        !st.attempts
            .iter()
            .any(|a| matches!(a.action, DeviceAction::PowerOff | DeviceAction::PowerOn)),
        "no power command: {:?}",
        st.attempts
    );
}
