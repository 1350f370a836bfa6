//! Bad IPMI credentials fall through to the PDU level, which cuts the machine's outlet.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use palisade_lab::Cut;
use palisade_model::nodefence::{EvidenceKind, LevelResult, Phase};

#[test]
fn bad_ipmi_credentials_fall_through_to_the_pdu_level() {
    let (lab, rt, c) = lab_ready(3, true);
    let _ctl = start_controller(&lab, "ctl-p");
    policy(&c, &rt);
    secret(&c, &rt, "bmc-wrong", &[("password", "not-the-password")]);
    pdu_secret(&lab, &c, &rt);
    fence_target(
        &c,
        &rt,
        "m0",
        vec![
            ("ipmi", vec![device(&ipmi_url(&lab, 0), "bmc-wrong")]),
            ("pdu", vec![device(&pdu_url(&lab, 0), "pdu")]),
        ],
    );
    let pod = running_worker(&c, &rt, "m0");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    lab.partition(0, Cut::All).unwrap();
    let nf = eventually("m0's NodeFence Released", Duration::from_secs(180), || {
        fences_for(&c, &rt, "m0").into_iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Released)
        })
    });
    print_timeline(&nf, t_cut);
    let st = nf.status.clone().unwrap();
    let results: Vec<LevelResult> = st.levels.iter().map(|l| l.result).collect();
    assert_eq!(results, vec![LevelResult::Failed, LevelResult::Verified]);
    assert!(st.evidence.iter().all(|e| e.level == 1
        && e.kind == EvidenceKind::PowerOff
        && e.device.starts_with("snmp+pdu://")));
    assert!(!st.evidence.is_empty());
    let m0 = &lab.machines()[0];
    assert!(m0.processes().is_empty(), "no process survives on m0");
    assert!(st
        .release
        .pods
        .iter()
        .any(|p| Some(&p.uid) == pod.uid().as_ref()));
    assert!(
        rt.block_on(pods.get_opt("worker")).unwrap().is_none(),
        "the pod object is released"
    );
}
