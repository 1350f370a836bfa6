//! Power evidence: a machine switched off at its BMC is fenced on its BMC's reading, long
//! before its silence would count, and a BMC wired to another machine gives no evidence.
//!
//! The policy's silence thresholds are long (10 s and 20 s, production-like): the fence's
//! reason says which rule fenced. m1's FenceTarget pins m1's identity at m0's BMC address (a
//! wiring mistake): that BMC reads off too once m0 is switched off, but it answers with m0's
//! identity, not m1's, and m1 keeps renewing; m1 is never fenced.
//!
//! What would make this fail: a power watch that does not read, reads that are not recorded,
//! evidence that waits for the silence threshold (the reason would not say "on power
//! evidence"), evidence taken from a BMC of another machine, or a fence that does not release.

mod common;

use std::time::Duration;

use common::*;
use kube::ResourceExt;
use palisade_model::nodefence::{EvidenceKind, Phase};
use serde_json::json;

#[test]
fn a_machine_switched_off_at_its_bmc_is_fenced_on_that_evidence_and_a_miswired_bmc_proves_nothing()
{
    let (lab, rt, c) = lab_ready(3, false);
    let cp = lab.control_plane().expect("control plane");
    let _ctl = start_controller_as(
        &lab,
        "ctl-power-evidence",
        cp.admin_kubeconfig(),
        &[],
        &["--power-watch-interval".into(), "250ms".into()],
    );
    policy_with(
        &c,
        &rt,
        json!({"detection": {"suspectAfterSeconds": 10, "unhealthyAfterSeconds": 20,
                             "powerOffAfterSeconds": 1}}),
    );
    let m0 = &lab.machines()[0];
    secret(
        &c,
        &rt,
        "bmc-m0",
        &[("password", &m0.bmc().password().unwrap())],
    );
    // The lab's namespace machines report no SMBIOS UUID on their Nodes: the identity comes
    // from the inventory, as a `guid=` pin in the URL.
    let pinned = |address_of: usize, identity_of: usize| {
        format!(
            "{}&guid={}",
            ipmi_url(&lab, address_of),
            lab.machines()[identity_of].system_uuid()
        )
    };
    fence_target(
        &c,
        &rt,
        "m0",
        vec![("ipmi", vec![device(&pinned(0, 0), "bmc-m0")])],
    );
    // The wiring mistake: m1's target has m1's identity but m0's BMC address (and password).
    fence_target(
        &c,
        &rt,
        "m1",
        vec![("ipmi", vec![device(&pinned(0, 1), "bmc-m0")])],
    );
    let old = db_on_m0(&c, &rt);
    // Power evidence needs the node's rhythm: the controller must have seen m0 renew a few
    // times (it started moments ago).
    renewals(&c, &rt, "m0", 4);

    let t_off = k8s_openapi::jiff::Timestamp::now();
    let out = m0
        .bmc()
        .ipmitool()
        .args(["chassis", "power", "off"])
        .output()
        .expect("ipmitool runs");
    assert!(out.status.success(), "chassis power off: {out:?}");
    let nf = fence_in_phase(&c, &rt, "m0", Phase::Released, Duration::from_secs(120));
    print_timeline(&nf, t_off);
    assert!(
        nf.spec.reason.contains("on power evidence") && nf.spec.reason.contains("reads power off"),
        "m0 was fenced on its BMC's reading, before its silence counted: {:?}",
        nf.spec.reason
    );
    let st = nf.status.clone().unwrap();
    assert!(
        st.evidence
            .iter()
            .any(|e| e.kind == EvidenceKind::PowerOff && e.device.starts_with("ipmi://")),
        "the fence itself was verified off at the BMC: {:?}",
        st.evidence
    );
    let new = db_replaced_elsewhere(&c, &rt, &old.uid().unwrap(), Duration::from_secs(120));
    let at = |phase: Phase| {
        let t = st.transitions.iter().find(|t| t.phase == phase).unwrap();
        secs_between(t_off, t.at.0)
    };
    eprintln!(
        "power off at the BMC (ipmitool sent) → Pending {:.2}s → Released {:.2}s → db-0 Running on {} {:.2}s",
        at(Phase::Pending),
        at(Phase::Released),
        new.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap(),
        secs_between(t_off, k8s_openapi::jiff::Timestamp::now())
    );
    // m1's "BMC" has read off all along; it named another machine, and m1 renews.
    assert!(
        fences_for(&c, &rt, "m1").is_empty(),
        "m1 fenced on a BMC wired to m0: {:?}",
        fences_for(&c, &rt, "m1")
            .iter()
            .map(|f| f.spec.reason.clone())
            .collect::<Vec<_>>()
    );
}

/// Waits until `node`'s Lease was renewed `n` times from now.
fn renewals(c: &kube::Client, rt: &tokio::runtime::Runtime, node: &str, n: usize) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: kube::Api<Lease> = kube::Api::namespaced(c.clone(), "kube-node-lease");
    let mut seen = std::collections::BTreeSet::new();
    eventually(
        &format!("{node} renewed {n} times"),
        Duration::from_secs(60),
        || {
            let l = rt.block_on(leases.get(node)).ok()?;
            seen.insert(l.spec?.renew_time?.0);
            (seen.len() > n).then_some(())
        },
    );
}
