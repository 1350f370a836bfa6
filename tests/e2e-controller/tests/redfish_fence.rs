//! A node fenced through Redfish by the controller: m0's FenceTarget names one device, a
//! sushy-emulator ComputerSystem (pinned by UUID, its certificate trusted through the CA in
//! the device's Secret, `ca=secret`) whose power is m0's
//! (`palisade_lab::redfish::machine_power_hook`). m0 is cut off; the controller powers it
//! off through Redfish, verifies `PowerState: Off`, and only then
//! releases its pod. m0 is really off: not one of its processes is left.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use palisade_lab::redfish::Sushy;
use palisade_lab::Cut;
use palisade_model::nodefence::{EvidenceKind, LevelResult, Phase};

#[test]
fn the_controller_fences_a_node_through_redfish_and_the_machine_is_off() {
    let (lab, rt, c) = lab_ready(3, false);
    let m0 = &lab.machines()[0];
    let password = format!("redfish-{}", std::process::id());
    let sushy = Sushy::for_machine(&lab.dir().join("sushy"), m0, "admin", &password)
        .expect("sushy-emulator starts (hack/install-deps.sh installs it)");
    let ctl = start_controller(&lab, "ctl-redfish");
    policy(&c, &rt);
    // The BMC's CA comes from the device's Secret (`ca=secret`), not from a file on the
    // controller's host.
    redfish_target_m0(&lab, &c, &rt, sushy.port(), &password, sushy.ca_pem());
    let pod = running_worker(&c, &rt, "m0");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    lab.partition(0, Cut::All).unwrap();
    let nf =
        palisade_scenario::eventually("m0's NodeFence Released", Duration::from_secs(180), || {
            fences_for(&c, &rt, "m0").into_iter().find(|f| {
                f.status
                    .as_ref()
                    .is_some_and(|s| s.phase == Phase::Released)
            })
        })
        .unwrap_or_else(|e| {
            panic!(
                "{e}\nfences: {:#?}\ncontroller log tail:\n{}",
                fences_for(&c, &rt, "m0")
                    .iter()
                    .map(|f| f.status.clone())
                    .collect::<Vec<_>>(),
                ctl.log_text()
                    .lines()
                    .rev()
                    .take(60)
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        });
    print_timeline(&nf, t_cut);
    let st = nf.status.clone().unwrap();
    let results: Vec<LevelResult> = st.levels.iter().map(|l| l.result).collect();
    assert_eq!(results, vec![LevelResult::Verified]);
    assert!(!st.evidence.is_empty());
    assert!(
        st.evidence
            .iter()
            .all(|e| e.kind == EvidenceKind::PowerOff && e.device.starts_with("redfish+https://")),
        "{:?}",
        st.evidence
    );
    assert!(!m0.is_powered(), "m0 is off");
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
    assert!(
        !sushy.log().exists()
            || !std::fs::read_to_string(sushy.log())
                .unwrap_or_default()
                .contains(&password),
        "the password never reaches the emulator's log"
    );
}
