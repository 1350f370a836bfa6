//! A machine whose power is cut at its PDU: the BMC goes dark with it (the lab's PDU kills the
//! machine and its `ipmi_sim` once no outlet feeds it). A BMC that does not answer is no proof
//! of anything: it may have lost its power with the machine, or only its network.
//!
//! - With a PDU level behind the BMC, the fence is proven on the PDU's reading (its outlets
//!   read off), and the StatefulSet comes back elsewhere.
//! - With the BMC alone, nothing is released, and the fence says why in words an operator can
//!   act on.
//!
//! What would make these fail: taking the BMC's silence as a power off (level 0 verified, or
//! a release with no PDU evidence), or a failure that does not name the dark BMC.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use palisade_lab::Lab;
use palisade_model::nodefence::{
    AttemptOutcome, DeviceAction, EvidenceKind, FailureReason, LevelResult, NodeFenceStatus, Phase,
};

/// Cuts every outlet that feeds m0, as a tripped breaker would: m0 and its BMC go dark.
fn cut_m0_at_the_pdu(lab: &Lab) {
    let pdu = lab.pdu().expect("lab has a PDU");
    for o in lab.machines()[0].outlets() {
        pdu.switch(*o, false).expect("outlet switched off");
    }
    let m0 = &lab.machines()[0];
    eventually("m0 and its BMC dark", Duration::from_secs(20), || {
        (!m0.is_powered() && !m0.bmc_running()).then_some(())
    });
}

/// m0's BMC, with the right password (its silence must be the only thing wrong with it).
fn bmc_device(lab: &Lab, c: &kube::Client, rt: &tokio::runtime::Runtime) -> serde_json::Value {
    let m0 = &lab.machines()[0];
    secret(
        c,
        rt,
        "bmc-m0",
        &[("password", &m0.bmc().password().unwrap())],
    );
    device(&ipmi_url(lab, 0), "bmc-m0")
}

/// Every power-off of `level` gave no answer, and none was evidence.
fn assert_level_dark(st: &NodeFenceStatus, level: i32) {
    let asked: Vec<_> = st
        .attempts
        .iter()
        .filter(|a| a.level == level && a.action == DeviceAction::PowerOff)
        .collect();
    assert!(!asked.is_empty(), "the BMC was asked: {:?}", st.attempts);
    assert!(
        asked.iter().all(|a| a.outcome == AttemptOutcome::TimedOut),
        "a dark BMC gives no answer: {asked:?}"
    );
    assert!(
        st.evidence.iter().all(|e| e.level != level),
        "no evidence from the dark BMC: {:?}",
        st.evidence
    );
}

#[test]
fn a_power_cut_at_the_pdu_is_fenced_on_the_pdus_reading_and_the_statefulset_recovers() {
    let (lab, rt, c) = lab_ready(3, true);
    let _ctl = start_controller(&lab, "ctl-dark-pdu");
    policy(&c, &rt);
    pdu_secret(&lab, &c, &rt);
    let bmc = bmc_device(&lab, &c, &rt);
    fence_target(
        &c,
        &rt,
        "m0",
        vec![
            ("ipmi", vec![bmc]),
            ("pdu", vec![device(&pdu_url(&lab, 0), "pdu")]),
        ],
    );
    let old = db_on_m0(&c, &rt);

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    cut_m0_at_the_pdu(&lab);
    let nf = fence_in_phase(&c, &rt, "m0", Phase::Released, Duration::from_secs(240));
    print_timeline(&nf, t_cut);
    let st = nf.status.clone().unwrap();
    let results: Vec<LevelResult> = st.levels.iter().map(|l| l.result).collect();
    assert_eq!(results, vec![LevelResult::Failed, LevelResult::Verified]);
    assert_level_dark(&st, 0);
    assert!(
        !st.evidence.is_empty()
            && st.evidence.iter().all(|e| e.level == 1
                && e.kind == EvidenceKind::PowerOff
                && e.device.starts_with("snmp+pdu://")),
        "the proof is the PDU's reading: {:?}",
        st.evidence
    );
    assert!(
        st.release
            .pods
            .iter()
            .any(|p| Some(&p.uid) == old.uid().as_ref()),
        "db-0 released on the PDU's proof"
    );
    let new = db_replaced_elsewhere(&c, &rt, &old.uid().unwrap(), Duration::from_secs(120));
    eprintln!(
        "db-0 Running again on {} {:.1}s after the cut",
        new.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap(),
        secs_between(t_cut, k8s_openapi::jiff::Timestamp::now())
    );
}

#[test]
fn a_dark_bmc_alone_is_no_proof_and_the_fence_says_so() {
    let (lab, rt, c) = lab_ready(3, true);
    let _ctl = start_controller(&lab, "ctl-dark-alone");
    policy(&c, &rt);
    let bmc = bmc_device(&lab, &c, &rt);
    fence_target(&c, &rt, "m0", vec![("ipmi", vec![bmc])]);
    let old = db_on_m0(&c, &rt);

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    cut_m0_at_the_pdu(&lab);
    let nf = fence_in_phase(&c, &rt, "m0", Phase::Failed, Duration::from_secs(240));
    print_timeline(&nf, t_cut);
    let st = nf.status.clone().unwrap();
    let failure = st.failure.clone().expect("a failure on record");
    assert_eq!(failure.reason, FailureReason::AllLevelsFailed);
    assert_level_dark(&st, 0);
    assert!(st.release.pods.is_empty(), "nothing released");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");
    let still = rt
        .block_on(pods.get_opt("db-0"))
        .unwrap()
        .expect("db-0 kept");
    assert_eq!(
        still.uid(),
        old.uid(),
        "db-0 is the pod on m0, not replaced"
    );
    // The reason, in words an operator can act on: which BMC, why it proves nothing, what to do.
    let said = events(&c, &rt, "default", &nf.name_any(), "FenceFailed")
        .iter()
        .filter_map(|e| e.message.clone())
        .collect::<Vec<_>>()
        .join("\n");
    for want in [
        "No answer from ipmi://",
        "no proof that node m0 is off",
        "PDU or storage level",
        "kubectl palisade delete-pod",
    ] {
        assert!(
            failure.message.contains(want) && said.contains(want),
            "the failure says {want:?}: status {:?}; Events {said:?}",
            failure.message
        );
    }
}
