//! A controller that crashes in the middle of a fence, on either side of a status write, and
//! the next leader that resumes the `NodeFence` from its persisted phase: the fence completes,
//! every phase is entered once, every pod is released once, and the new leader acts under its
//! own, higher token. The crash is `PALISADE_CRASH_AT=<step>:<before|after>` (an abort, as a
//! crash: no hand-over of the Lease). `before` is the hard case: the step acted but its record
//! was never written.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use palisade_lab::Cut;
use palisade_model::nodefence::{EvidenceKind, Phase};

fn crash_then_resume(crash_at: &str) {
    let (lab, rt, c) = lab_ready(3, false);
    let mut a = start_controller_with_env(
        &lab,
        "ctl-a",
        &[("PALISADE_CRASH_AT", crash_at.to_string())],
    );
    policy(&c, &rt);
    ipmi_targets(&lab, &c, &rt);
    let pod = running_worker(&c, &rt, "m0");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");

    lab.partition(0, Cut::All).unwrap();
    let status = eventually(
        &format!("ctl-a crashes at {crash_at}"),
        Duration::from_secs(120),
        || a.exited(),
    );
    assert_eq!(status.signal(), Some(6), "ctl-a aborted: {status:?}");
    let at_crash = fences_for(&c, &rt, "m0");
    assert_eq!(at_crash.len(), 1, "one NodeFence for m0");
    let token_a = at_crash[0]
        .status
        .as_ref()
        .and_then(|s| s.fencing_token)
        .unwrap_or(0);
    eprintln!(
        "ctl-a crashed at {crash_at}; NodeFence phase then: {:?}",
        at_crash[0].status.as_ref().map(|s| s.phase)
    );

    let _b = start_controller(&lab, "ctl-b");
    let nf = eventually("m0's NodeFence Released", Duration::from_secs(180), || {
        fences_for(&c, &rt, "m0").into_iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Released)
        })
    });
    print_timeline(&nf, nf.metadata.creation_timestamp.clone().unwrap().0);
    assert_eq!(fences_for(&c, &rt, "m0").len(), 1, "still one NodeFence");
    let st = nf.status.clone().unwrap();
    let token_b = st.fencing_token.expect("token");
    assert!(
        token_b > token_a,
        "the resumed fence runs under the new leader's token ({token_b} > {token_a})"
    );
    assert_each_phase_once(&st);
    assert!(st
        .evidence
        .iter()
        .any(|e| e.kind == EvidenceKind::PowerOff && e.device.starts_with("ipmi://")));
    assert!(!lab.machines()[0].is_powered(), "m0 is off");
    assert!(lab.machines()[0].processes().is_empty());
    // Released and recorded exactly once, whichever side of the deletion the leader died on
    // (the release is written ahead, so the next leader finishes its record), and the pod
    // object is gone.
    let uid = pod.uid().unwrap();
    let records = st.release.pods.iter().filter(|p| p.uid == uid).count();
    assert_eq!(
        records, 1,
        "pod released and recorded once: {:?}",
        st.release
    );
    assert!(st.release.releasing.is_none(), "{:?}", st.release);
    assert!(rt.block_on(pods.get_opt("worker")).unwrap().is_none());
    let left = rt
        .block_on(
            Api::<Pod>::all(c.clone()).list(&ListParams::default().fields("spec.nodeName=m0")),
        )
        .unwrap();
    assert!(left.items.is_empty(), "no pod left on m0");
    assert!(st.release.tainted_at.is_some());
    // Attempts made after the crash carry the new token; none carries a token from the future.
    assert!(st.attempts.iter().all(|x| x.token <= token_b));
    assert!(st.attempts.iter().any(|x| x.token == token_b) || crash_at != "run_level:before");
}

#[test]
fn crash_after_a_level_acted_but_before_it_was_recorded() {
    crash_then_resume("run_level:before");
}

#[test]
fn crash_after_the_level_was_recorded() {
    crash_then_resume("run_level:after");
}

#[test]
fn crash_after_tainting_before_recording_it() {
    crash_then_resume("apply_taint:before");
}

#[test]
fn crash_after_deleting_the_pod_before_recording_it() {
    crash_then_resume("release_pod:before");
}

#[test]
fn crash_after_recording_the_released_pod() {
    crash_then_resume("release_pod:after");
}

/// A person edits m0's BMC URL while m0's fence is under way (the same BMC, now pinned in its
/// URL to m0's machine, written while the leader that powered m0 off is down): the next
/// leader resumes the fence, and its power re-read before the release acts through the device
/// listed now, standing in for the planned one no longer listed. Before, the re-read was
/// refused ("no longer listed"), three times, and the fence failed `PowerNotOff` with nothing
/// released; without the pin (these Nodes report no comparable `systemUUID`), the stand-in is
/// refused the same way, as it must be.
#[test]
fn a_bmc_url_edited_mid_fence_is_followed_by_the_resumed_fence() {
    use kube::api::{Patch, PatchParams};
    use palisade_model::nodefence::RecheckedPower;
    use palisade_model::FenceTarget;
    let (lab, rt, c) = lab_ready(3, false);
    let mut a = start_controller_with_env(
        &lab,
        "ctl-a",
        &[("PALISADE_CRASH_AT", "run_level:after".to_string())],
    );
    policy(&c, &rt);
    ipmi_targets(&lab, &c, &rt);
    let pod = running_worker(&c, &rt, "m0");
    lab.partition(0, Cut::All).unwrap();
    let status = eventually(
        "ctl-a crashes once m0's level is recorded",
        Duration::from_secs(120),
        || a.exited(),
    );
    assert_eq!(status.signal(), Some(6), "ctl-a aborted: {status:?}");
    // The namespace lab's Nodes report no comparable systemUUID (their machines have no
    // SMBIOS table): a stand-in must then be pinned by its URL, or it is refused.
    let planned = ipmi_url(&lab, 0);
    let edited = format!("{planned}&guid={}", lab.machines()[0].system_uuid());
    let targets: Api<FenceTarget> = Api::all(c.clone());
    let levels = serde_json::json!({"spec": {"levels": [
        {"name": "ipmi", "devices": [device(&edited, "bmc-m0")]}
    ]}});
    rt.block_on(targets.patch("m0", &PatchParams::default(), &Patch::Merge(&levels)))
        .expect("edit m0's FenceTarget");

    let _b = start_controller(&lab, "ctl-b");
    let nf = eventually(
        "m0's NodeFence Released or Failed",
        Duration::from_secs(180),
        || {
            fences_for(&c, &rt, "m0").into_iter().find(|f| {
                f.status
                    .as_ref()
                    .is_some_and(|s| matches!(s.phase, Phase::Released | Phase::Failed))
            })
        },
    );
    print_timeline(&nf, nf.metadata.creation_timestamp.clone().unwrap().0);
    let st = nf.status.clone().unwrap();
    assert_eq!(st.phase, Phase::Released, "{:?}", st.failure);
    assert_eq!(fences_for(&c, &rt, "m0").len(), 1, "one NodeFence");
    assert!(st
        .evidence
        .iter()
        .any(|e| e.kind == EvidenceKind::PowerOff && e.device == planned));
    let rechecks = &st.release.power_rechecks;
    assert!(
        rechecks.iter().any(|r| r.device == planned
            && r.state == RecheckedPower::Off
            && r.observed.contains("standing in")),
        "the re-read went through the edited URL: {rechecks:?}"
    );
    let uid = pod.uid().unwrap();
    assert!(
        st.release.pods.iter().any(|p| p.uid == uid),
        "{:?}",
        st.release
    );
    assert!(!lab.machines()[0].is_powered(), "m0 is off");
}
