//! A host that must not be powered off (its BMC shares the host's NIC and is lost when the host
//! is off): its only level says `powerOff: Disallowed`, with its BMC listed *before* the storage
//! firewall.
//!
//! The controller blocks the storage first (verified), then asks the BMC for a warm reset. The
//! lab's namespace-machine BMC (`ipmi_sim` with no VM behind it) refuses a hard reset ("invalid
//! data field"), as some real BMCs do: the level is still verified on the storage block alone,
//! and the refusal is on record. The machine is never sent a power command, neither to fence
//! nor in recovery (although the policy asks for `powerOn`). When the node comes back in the
//! same boot, the storage stays blocked and the `NodeFence` stays Recovering; only after the
//! machine has booted again (a person cycles it) is the block lifted and the fence Done.

mod common;

use std::time::Duration;

use common::no_power_off::{assert_no_power_command, reset_target, storage_then_reset};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use palisade_lab::Cut;
use palisade_model::nodefence::{AttemptOutcome, Phase};
use serde_json::json;

/// `ipmitool` against m0's BMC (the lab's login; the password stays in its file).
fn ipmitool(bmc: &palisade_lab::BmcInfo, args: &[&str]) -> String {
    let out = bmc.ipmitool().args(args).output().expect("run ipmitool");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_host_that_must_not_power_off_is_fenced_at_its_storage_and_unblocked_only_after_a_new_boot() {
    let (lab, rt, c) = lab_ready(3, false);
    let storage = palisade_scenario::Storage::start(&lab, &["db"]).expect("storage server");
    let ctl = start_controller(&lab, "ctl-no-power-off");
    policy_with(
        &c,
        &rt,
        json!({"recovery": {"powerOn": true, "untaintWhen": "NodeReady"}}),
    );
    let m0 = &lab.machines()[0];
    let bmc = m0.bmc();
    reset_target(&lab, &c, &rt, &storage, true);
    let status = || ipmitool(bmc, &["chassis", "power", "status"]);
    assert_eq!(status(), "Chassis Power is on");
    let first_boot = m0.boot_id().expect("m0 has a boot ID");

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    lab.partition(0, Cut::All).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let nf = loop {
        let fences = fences_for(&c, &rt, "m0");
        // Released, then at once Recovering (the policy has a recovery; nothing to power on).
        if let Some(f) = fences.iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| matches!(s.phase, Phase::Released | Phase::Recovering))
        }) {
            break f.clone();
        }
        if std::time::Instant::now() > deadline {
            let log = ctl.log_text();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            panic!(
                "m0's NodeFence not Released in 180 s: {:#?}\ncontroller log (last lines, newest first):\n{}",
                fences.iter().map(|f| &f.status).collect::<Vec<_>>(),
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    print_timeline(&nf, t_cut);
    let st = nf.status.clone().unwrap();
    // Verified on the storage block alone, the block before the reset, never a power command;
    // this BMC refuses the reset.
    let reset = storage_then_reset(&st);
    assert_ne!(
        reset.outcome,
        AttemptOutcome::Succeeded,
        "this lab BMC refuses a hard reset"
    );
    assert!(m0.is_powered(), "m0 was never powered off");
    assert_eq!(status(), "Chassis Power is on");

    // The node comes back in the same boot: the fence waits for a new boot ID, the storage
    // stays blocked, and still no power command is sent (the policy's powerOn does not apply).
    let t_heal = k8s_openapi::jiff::Timestamp::now();
    lab.heal(0).unwrap();
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    eventually(
        "m0 renews its Lease after the heal",
        Duration::from_secs(120),
        || {
            let renew = rt.block_on(leases.get("m0")).ok()?.spec?.renew_time?;
            (renew.0 > t_heal).then_some(())
        },
    );
    eventually("m0's NodeFence Recovering", Duration::from_secs(60), || {
        fences_for(&c, &rt, "m0").into_iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Recovering)
        })
    });
    ctl.wait_ticks(10);
    let waiting = fences_for(&c, &rt, "m0")
        .into_iter()
        .find(|f| f.metadata.name == nf.metadata.name)
        .and_then(|f| f.status)
        .unwrap();
    assert_eq!(
        waiting.phase,
        Phase::Recovering,
        "{:?}",
        waiting.transitions
    );
    assert!(waiting.recovery.clean_proof.is_none());
    assert!(
        waiting.recovery.unfenced_at.is_none(),
        "storage still blocked"
    );
    assert!(waiting.recovery.powered_on_at.is_none());
    // The release taints stay too: without the clean proof nothing is lifted.
    assert!(waiting.recovery.untainted_at.is_none());
    assert_eq!(m0.boot_id().as_deref(), Some(first_boot.as_str()));

    // A person cycles the machine: it boots again with a new boot ID, and only then is the
    // block lifted and the fence Done.
    assert_eq!(
        ipmitool(bmc, &["chassis", "power", "off"]),
        "Chassis Power Control: Down/Off"
    );
    m0.wait_power(false, Duration::from_secs(30))
        .expect("m0 off");
    ipmitool(bmc, &["chassis", "power", "on"]);
    m0.wait_power(true, Duration::from_secs(30)).expect("m0 on");
    let done = eventually("m0's NodeFence Done", Duration::from_secs(180), || {
        fences_for(&c, &rt, "m0").into_iter().find(|f| {
            f.metadata.name == nf.metadata.name
                && f.status.as_ref().is_some_and(|s| s.phase == Phase::Done)
        })
    });
    let st = done.status.unwrap();
    let proof = st.recovery.clean_proof.clone().unwrap_or_default();
    eprintln!("clean proof: {proof}");
    assert!(proof.contains("boot ID changed"), "proof: {proof:?}");
    assert!(st.recovery.unfenced_at.is_some(), "storage unblocked");
    assert!(st.recovery.powered_on_at.is_none());
    assert_no_power_command(&st);
    // The untaint first, and the storage block lifted only once it has settled: the release
    // taints removed, their absence observed, then the margin, then the unblock.
    let at = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>| {
        t.as_ref().map(|t| t.0).expect("recorded")
    };
    let (untainted, observed, unfenced) = (
        at(&st.recovery.untainted_at),
        at(&st.recovery.untaint_observed_at),
        at(&st.recovery.unfenced_at),
    );
    // `palisade_decide::phase::UNTAINT_SETTLE_MARGIN` (this crate does not depend on it).
    let margin = Duration::from_secs(10);
    assert!(
        untainted <= observed && observed + margin <= unfenced,
        "untainted {untainted}, observed {observed}, unfenced {unfenced}"
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    let n = rt.block_on(nodes.get("m0")).unwrap();
    let keys: Vec<String> = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert!(
        !keys
            .iter()
            .any(|k| k == palisade_model::OUT_OF_SERVICE_TAINT_KEY
                || k == palisade_model::FENCED_TAINT_KEY),
        "{keys:?}"
    );
    assert!(
        !n.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(palisade_model::nodefence::ANNOTATION_RELEASE_TAINTS),
        "the fence's record of its taints goes with them"
    );
}
