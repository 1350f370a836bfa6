//! A machine whose power is cut at its PDU: the BMC goes dark with it (the lab's PDU kills the
//! machine and its `ipmi_sim` once no outlet feeds it). A BMC that does not answer is no proof
//! of anything: it may have lost its power with the machine, or only its network.
//!
//! - With a PDU level behind the BMC, the fence is proven on the PDU's reading (its outlets
//!   read off), and the StatefulSet comes back elsewhere.
//! - With the BMC alone, nothing is released, and the fence says why in words an operator can
//!   act on.
//!
//! - Under `powerWithoutIdentity: AfterProof` (issue 32 item 8), the PDU acts only after a
//!   BMC of the FenceTarget answered as the Node's machine: a dark BMC keeps the outlet from
//!   acting (nothing released), an answering one lets it fence.
//!
//! What would make these fail: taking the BMC's silence as a power off (level 0 verified, or
//! a release with no PDU evidence), a failure that does not name the dark BMC, or a PDU that
//! acts under `AfterProof` with no BMC answering as the machine.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use palisade_lab::Cut;
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

/// m0's FenceTarget: its BMC, then a PDU level behind it. Returns db-0 as it runs on m0.
fn bmc_then_pdu(lab: &Lab, c: &kube::Client, rt: &tokio::runtime::Runtime) -> Pod {
    pdu_secret(lab, c, rt);
    let bmc = bmc_device(lab, c, rt);
    fence_target(
        c,
        rt,
        "m0",
        vec![
            ("ipmi", vec![bmc]),
            ("pdu", vec![device(&pdu_url(lab, 0), "pdu")]),
        ],
    );
    db_on_m0(c, rt)
}

/// db-0 is still `old`, the pod on m0: nothing released it.
fn assert_db_kept(c: &kube::Client, rt: &tokio::runtime::Runtime, old: &Pod) {
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
    let old = bmc_then_pdu(&lab, &c, &rt);
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
    assert_db_kept(&c, &rt, &old);
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

/// The policy `powerWithoutIdentity: AfterProof`: the PDU is the proof of a dark machine only
/// when a BMC answered as it first. Its BMC is dark, so the PDU is never used: the PDU's
/// reading (its outlets do read off) would otherwise have released the pods.
#[test]
fn after_proof_a_dark_bmc_keeps_the_pdu_from_acting_and_nothing_is_released() {
    let (lab, rt, c) = lab_ready(3, true);
    let _ctl = start_controller(&lab, "ctl-dark-proof");
    policy_with(
        &c,
        &rt,
        serde_json::json!({"powerWithoutIdentity": "AfterProof"}),
    );
    let old = bmc_then_pdu(&lab, &c, &rt);
    let t_cut = k8s_openapi::jiff::Timestamp::now();
    cut_m0_at_the_pdu(&lab);
    let nf = fence_in_phase(&c, &rt, "m0", Phase::Failed, Duration::from_secs(240));
    print_timeline(&nf, t_cut);
    let st = nf.status.clone().unwrap();
    assert_level_dark(&st, 0);
    let pdu: Vec<_> = st.attempts.iter().filter(|a| a.level == 1).collect();
    assert!(
        !pdu.is_empty()
            && pdu.iter().all(|a| a.outcome == AttemptOutcome::Failed
                && a.message
                    .contains("identity unproven (powerWithoutIdentity: AfterProof)")
                && a.message.contains("nothing sent")),
        "the PDU level failed for want of a proof, with nothing sent: {pdu:?}"
    );
    assert!(st.evidence.is_empty(), "no evidence: {:?}", st.evidence);
    assert!(st.release.pods.is_empty(), "nothing released");
    assert_db_kept(&c, &rt, &old);
}

/// The same rule with the machine alive and cut off from everything: its BMC (a later level),
/// pinned to m0's identity by its URL (the lab's Nodes report no `systemUUID`), answers as m0,
/// so the PDU, the first level, powers m0 off and the fence is proven on it.
#[test]
fn after_proof_an_answering_bmc_lets_the_pdu_fence() {
    let (lab, rt, c) = lab_ready(3, true);
    let _ctl = start_controller(&lab, "ctl-pdu-proof");
    policy_with(
        &c,
        &rt,
        serde_json::json!({"powerWithoutIdentity": "AfterProof"}),
    );
    pdu_secret(&lab, &c, &rt);
    let mut bmc = bmc_device(&lab, &c, &rt);
    bmc["url"] = serde_json::json!(format!(
        "{}&guid={}",
        ipmi_url(&lab, 0),
        lab.machines()[0].system_uuid()
    ));
    fence_target(
        &c,
        &rt,
        "m0",
        vec![
            ("pdu", vec![device(&pdu_url(&lab, 0), "pdu")]),
            ("ipmi", vec![bmc]),
        ],
    );
    let old = db_on_m0(&c, &rt);

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    lab.partition(0, Cut::All).unwrap();
    let nf = fence_in_phase(&c, &rt, "m0", Phase::Released, Duration::from_secs(240));
    print_timeline(&nf, t_cut);
    let st = nf.status.clone().unwrap();
    assert_eq!(
        st.levels.first().map(|l| l.result),
        Some(LevelResult::Verified)
    );
    assert!(
        !st.evidence.is_empty()
            && st.evidence.iter().all(|e| e.level == 0
                && e.kind == EvidenceKind::PowerOff
                && e.device.starts_with("snmp+pdu://")),
        "the proof is the PDU's: {:?}",
        st.evidence
    );
    assert!(!lab.machines()[0].is_powered(), "the PDU switched m0 off");
    assert!(
        st.release
            .pods
            .iter()
            .any(|p| Some(&p.uid) == old.uid().as_ref()),
        "db-0 released"
    );
}
