//! The headline: a silent machine is power-fenced through its BMC, its StatefulSet pod is
//! released, and the replacement is scheduled on another machine. The controller runs as its
//! ServiceAccount with `controller/manifests/rbac.yaml` as shipped: no step of the scenario
//! may be refused a permission.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::{Api, ResourceExt};
use palisade_lab::Cut;
use palisade_model::nodefence::{EvidenceKind, Phase};

#[test]
fn silent_machine_is_power_fenced_then_its_statefulset_pod_runs_elsewhere() {
    let (lab, rt, c) = lab_ready(3, false);
    let (ctl, old, va) = controller_and_db_on_m0(&lab, &c, &rt, "ctl-a");
    let old_uid = old.uid().unwrap();
    let va_uid = va.uid().unwrap();
    let vas: Api<VolumeAttachment> = Api::all(c.clone());

    assert!(
        !lab.machines()[0].processes().is_empty(),
        "m0 runs processes before the cut"
    );
    let t_cut = k8s_openapi::jiff::Timestamp::now();
    lab.partition(0, Cut::All).unwrap();

    let nf = fence_in_phase(&c, &rt, "m0", Phase::Released, Duration::from_secs(180));
    let st = nf.status.clone().unwrap();
    print_timeline(&nf, t_cut);

    // Fenced through IPMI, verified: the machine is off and every process on it is dead.
    let m0 = &lab.machines()[0];
    assert!(!m0.is_powered(), "m0 is powered off");
    assert!(
        m0.processes().is_empty(),
        "no process survives on m0: {:?}",
        m0.processes()
    );
    assert!(
        st.evidence
            .iter()
            .any(|e| e.kind == EvidenceKind::PowerOff && e.device.starts_with("ipmi://")),
        "power-off evidence from the BMC: {:?}",
        st.evidence
    );
    assert!(st.fencing_token.is_some_and(|t| t >= 1));
    // Released in order: taint, then the pod (by UID), then the attachment.
    assert!(st.release.tainted_at.is_some());
    assert!(
        st.release.pods.iter().any(|p| p.uid == old_uid),
        "{:?}",
        st.release.pods
    );
    assert_attachment_released(&lab, &st, &va.name_any(), &va_uid);
    // Before the first release the BMC was read again, under the releasing token, and read off.
    let reread = st
        .release
        .power_rechecks
        .iter()
        .find(|r| Some(r.token) == st.fencing_token && r.device.starts_with("ipmi://"))
        .unwrap_or_else(|| panic!("a power re-read before the release: {st:?}"));
    assert_eq!(
        reread.state,
        palisade_model::nodefence::RecheckedPower::Off,
        "{reread:?}"
    );
    let first_release = st.release.pods.iter().map(|p| p.at.0).min().unwrap();
    assert!(
        reread.at.0 <= first_release,
        "{reread:?} before {first_release}"
    );
    assert_each_phase_once(&st);
    let nodes: Api<Node> = Api::all(c.clone());
    let n = rt.block_on(nodes.get("m0")).unwrap();
    assert!(n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == "node.kubernetes.io/out-of-service"
            && t.value.as_deref() == Some("nodeshutdown")
            && t.effect == "NoExecute"));
    assert!(rt.block_on(vas.get_opt("db-data-m0")).unwrap().is_none());

    // The replacement: same name, new UID, on another machine, running.
    let new = db_replaced_elsewhere(&c, &rt, &old_uid, Duration::from_secs(120));
    let t_running = k8s_openapi::jiff::Timestamp::now();
    eprintln!(
        "replacement db-0 on {} Running (observed) at +{:.2}s",
        new.spec.as_ref().unwrap().node_name.as_deref().unwrap(),
        secs_between(t_cut, t_running)
    );

    // Nothing else was fenced, and the transitions are in Events.
    assert!(fences_for(&c, &rt, "m1").is_empty());
    assert!(fences_for(&c, &rt, "m2").is_empty());
    let nf_name = nf.name_any();
    for reason in [
        "Fencing",
        "LevelVerified",
        "Fenced",
        "Tainted",
        "PowerRechecked",
        "PodReleased",
        "Released",
    ] {
        assert!(
            !events(&c, &rt, "default", &nf_name, reason).is_empty(),
            "Event {reason} on {nf_name}"
        );
    }
    let metrics = ctl.metrics().unwrap_or_default();
    assert!(
        metrics.contains("palisade_fences_total{outcome=\"released\"} 1"),
        "{metrics}"
    );
    let log = ctl.log_text();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
        .collect();
    assert!(
        refused.is_empty(),
        "the shipped RBAC covers every step: {refused:#?}"
    );
}
