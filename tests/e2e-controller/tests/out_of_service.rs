//! The release on current Kubernetes (1.34), where the `node.kubernetes.io/out-of-service`
//! taint is itself a release: once it lands on a NotReady node, Kubernetes' own controllers
//! evict and force-delete the node's pods (taint eviction, then the pod garbage collector) and
//! the attach-detach controller detaches its volumes without waiting for the node. So Palisade
//! may add it only after the fence is verified, only when the fence covers every pod on the
//! node (`release_scope.rs` proves that on the same release), and only once it released each
//! of those pods itself: a pod the taint's pod garbage collector deleted first would be
//! missing from the fence's record of what it released.
//!
//! The API server's audit log says who deleted what, and when: these tests read it rather than
//! the objects, so a delete by anyone (Palisade, a Kubernetes controller) before the fence was
//! verified is seen even when the object is gone.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};
use palisade_lab::control_plane::AuditEvent;
use palisade_lab::{Cut, KubeVersion};
use palisade_model::nodefence::Phase;

use common::audit_at as at;

/// One line of the printed timeline.
fn line(t0: Timestamp, e: &AuditEvent) -> String {
    let o = e.object_ref.as_ref();
    format!(
        "  +{:6.2}s  {:<6} {}/{} by {} ({})",
        secs_between(t0, at(e)),
        e.verb,
        o.and_then(|o| o.resource.as_deref()).unwrap_or("?"),
        o.and_then(|o| o.name.as_deref()).unwrap_or("?"),
        e.user.username,
        e.response_status
            .as_ref()
            .and_then(|s| s.code)
            .map_or("-".into(), |c| c.to_string())
    )
}

#[test]
fn the_out_of_service_taint_lands_after_the_verified_fence_and_after_the_pod_was_released() {
    let (lab, rt, c) = lab_ready_on(KubeVersion::V1_34, 3, false);
    let cp = lab.control_plane().expect("control plane");
    assert_eq!(cp.version(), KubeVersion::V1_34);
    let (_ctl, old, _va) = controller_and_db_on_m0(&lab, &c, &rt, "ctl-oos");
    let old_uid = old.uid().unwrap();
    let vas: Api<VolumeAttachment> = Api::all(c.clone());

    let t_cut = Timestamp::now();
    lab.partition(0, Cut::All).unwrap();
    let nf = fence_in_phase(&c, &rt, "m0", Phase::Released, Duration::from_secs(180));
    print_timeline(&nf, t_cut);
    let st = nf.status.clone().unwrap();
    let fenced = st
        .transitions
        .iter()
        .find(|t| t.phase == Phase::Fenced)
        .expect("a Fenced transition")
        .at
        .0;
    assert!(st.release.pods.iter().any(|p| p.uid == old_uid));
    let _new = db_replaced_elsewhere(&c, &rt, &old_uid, Duration::from_secs(120));

    let audit = cp.audit();
    let about_m0: Vec<&AuditEvent> = audit
        .iter()
        .filter(|e| {
            at(e) >= t_cut
                && (e.on("nodes", "m0") && e.verb != "create"
                    || e.on("pods", "db-0")
                    || e.on("volumeattachments", "db-data-m0"))
        })
        .collect();
    eprintln!(
        "audit, from the cut (fenced at +{:.2}s):",
        secs_between(t_cut, fenced)
    );
    for e in &about_m0 {
        eprintln!("{}", line(t_cut, e));
    }

    // The taint: added by Palisade, after the fence was verified.
    let taint = about_m0
        .iter()
        .find(|e| {
            e.succeeded()
                && e.on("nodes", "m0")
                && e.request_object
                    .as_ref()
                    .is_some_and(|r| r.to_string().contains("node.kubernetes.io/out-of-service"))
        })
        .expect("an audited change of m0 that adds the out-of-service taint");
    assert_eq!(taint.user.username, CONTROLLER_SA, "{}", line(t_cut, taint));
    assert!(
        at(taint) >= fenced,
        "the out-of-service taint at {} is added after the fence is verified at {fenced}",
        at(taint)
    );
    // db-0 was gone before the taint: Palisade's release (marking it Failed, which the
    // StatefulSet controller may act on with a delete of its own, then its grace-0 delete)
    // removed it, and no controller acting on the taint could delete it unrecorded.
    let gone = about_m0
        .iter()
        .find(|e| e.verb == "delete" && e.on("pods", "db-0") && e.succeeded())
        .expect("db-0 was deleted");
    assert!(
        at(gone) <= at(taint),
        "db-0 is deleted ({}) before the out-of-service taint lands ({})",
        line(t_cut, gone),
        line(t_cut, taint)
    );
    // Every delete of the old pod and of its attachment, by whoever asked, came after the
    // fence was verified; the attachment is gone and db-0 was deleted at least once.
    let deletes: Vec<&&AuditEvent> = about_m0
        .iter()
        .filter(|e| e.verb == "delete" && !e.on("nodes", "m0"))
        .collect();
    for e in &deletes {
        assert!(
            at(e) >= fenced,
            "nothing is deleted before the fence is verified: {}",
            line(t_cut, e)
        );
    }
    assert!(
        deletes
            .iter()
            .any(|e| e.on("pods", "db-0") && e.succeeded()),
        "db-0 was deleted"
    );
    assert!(rt.block_on(vas.get_opt("db-data-m0")).unwrap().is_none());
    let who: std::collections::BTreeSet<&str> = deletes
        .iter()
        .filter(|e| e.succeeded())
        .map(|e| e.user.username.as_str())
        .collect();
    eprintln!("deleted by: {who:?}");
}
