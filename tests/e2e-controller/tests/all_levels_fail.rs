//! All levels failing: the fence ends Failed with a Warning Event, and NOTHING is released.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, ResourceExt};
use palisade_lab::Cut;
use palisade_model::nodefence::{FailureReason, LevelResult, Phase};

#[test]
fn wrong_bmc_password_fails_the_fence_and_releases_nothing() {
    let (lab, rt, c) = lab_ready(3, false);
    let _ctl = start_controller(&lab, "ctl-f");
    policy(&c, &rt);
    secret(&c, &rt, "bmc-wrong", &[("password", "not-the-password")]);
    fence_target(
        &c,
        &rt,
        "m0",
        vec![("ipmi", vec![device(&ipmi_url(&lab, 0), "bmc-wrong")])],
    );
    let pod = running_worker(&c, &rt, "m0");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    lab.partition(0, Cut::All).unwrap();
    let nf = eventually("m0's NodeFence Failed", Duration::from_secs(180), || {
        fences_for(&c, &rt, "m0")
            .into_iter()
            .find(|f| f.status.as_ref().is_some_and(|s| s.phase == Phase::Failed))
    });
    print_timeline(&nf, t_cut);
    let st = nf.status.clone().unwrap();
    assert_eq!(
        st.failure.as_ref().map(|f| f.reason),
        Some(FailureReason::AllLevelsFailed)
    );
    assert!(st.levels.iter().all(|l| l.result == LevelResult::Failed));
    assert!(st.evidence.is_empty());
    // Nothing released: no taint, no pod touched, the machine still runs.
    assert!(st.release.tainted_at.is_none() && st.release.pods.is_empty());
    let p = rt.block_on(pods.get("worker")).unwrap();
    assert_eq!(p.uid(), pod.uid(), "the pod object is untouched");
    assert!(p.metadata.deletion_timestamp.is_none());
    let nodes: Api<Node> = Api::all(c.clone());
    let n = rt.block_on(nodes.get("m0")).unwrap();
    assert!(!n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == "node.kubernetes.io/out-of-service"));
    let m0 = &lab.machines()[0];
    assert!(m0.is_powered() && !m0.processes().is_empty());
    let warn = events(&c, &rt, "default", &nf.name_any(), "FenceFailed");
    assert!(
        warn.iter().any(|e| e.type_.as_deref() == Some("Warning")),
        "a Warning FenceFailed Event"
    );
}
