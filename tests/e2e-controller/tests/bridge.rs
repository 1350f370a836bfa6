//! The controller fences through the firmware-bridge: its FenceTarget lists only `bridge://`
//! devices (no credentials in the cluster), the bridge's IPMI level fails (wrong BMC password
//! in the bridge's inventory) and its PDU level cuts the outlet, the storage firewall blocks
//! the node, and the bridge's audit log tells the story with the controller's token and the
//! NodeFence's idempotency keys.

mod common;

use std::time::Duration;

use common::*;
use kube::ResourceExt;
use palisade_lab::Cut;
use palisade_model::nodefence::{DeviceAction, EvidenceKind, LevelResult, Phase};
use palisade_scenario::{BridgeOptions, FirmwareBridge, Storage};
use serde_json::{json, Value};

fn attempts_of(record: &Value) -> Vec<(String, String)> {
    record["evidence"]["attempts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x["level_name"].as_str().unwrap_or_default().to_string(),
                        x["result"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn controller_fences_through_the_bridge_ipmi_then_pdu_and_the_audit_log_tells_the_story() {
    let (lab, rt, c) = lab_ready(3, true);
    let storage = Storage::start(&lab, &[]).expect("storage server");
    let bridge = FirmwareBridge::start(
        &lab,
        BridgeOptions {
            wrong_bmc_password: &[0],
            storage: Some(&storage),
            ..Default::default()
        },
    )
    .expect("firmware-bridge starts");
    let ctl = start_controller_with_env(&lab, "ctl-b", &bridge.controller_env());
    policy(&c, &rt);
    let url = bridge.url("m0");
    fence_target(
        &c,
        &rt,
        "m0",
        vec![(
            "bridge",
            vec![
                json!({"url": url, "kind": "Power"}),
                json!({"url": url, "kind": "Storage", "fences": palisade_scenario::lab_storage_scope()}),
            ],
        )],
    );
    let pod = running_worker(&c, &rt, "m0");

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
    let token = u64::try_from(st.fencing_token.expect("token recorded")).unwrap();
    let uid = nf.uid().unwrap();

    // The controller's record: one level, verified, with power and storage evidence from the
    // bridge, which names its PDU level.
    let results: Vec<LevelResult> = st.levels.iter().map(|l| l.result).collect();
    assert_eq!(results, vec![LevelResult::Verified]);
    let power = st
        .evidence
        .iter()
        .find(|e| e.kind == EvidenceKind::PowerOff)
        .expect("power-off evidence");
    assert_eq!(power.device, url);
    assert!(
        power.observed.contains("\"level_name\":\"pdu\""),
        "the bridge's evidence names the PDU level: {}",
        power.observed
    );
    assert!(st
        .evidence
        .iter()
        .any(|e| e.kind == EvidenceKind::StorageBlocked && e.device == url));
    let m0 = &lab.machines()[0];
    assert!(m0.processes().is_empty(), "no process survives on m0");
    assert!(!m0.bmc_running(), "the PDU outlet cut the BMC too");
    assert!(st
        .release
        .pods
        .iter()
        .any(|p| Some(&p.uid) == pod.uid().as_ref()));

    // The bridge's record: who, what, which target, the token, the NodeFence's keys, and
    // the fall-through from IPMI to the PDU.
    let audit = bridge.audit();
    let acted: Vec<&Value> = audit
        .iter()
        .filter(|r| r["target"] == "m0" && r["result"] == "ok")
        .collect();
    let off = acted
        .iter()
        .find(|r| r["action"] == "power.off")
        .unwrap_or_else(|| panic!("a power.off record for m0: {audit:#?}"));
    assert_eq!(off["client"], "palisade-controller");
    assert_eq!(off["token"].as_u64(), Some(token));
    let key = off["idempotency_key"].as_str().unwrap_or_default();
    assert!(
        key.starts_with(&format!("nf-{uid}-t{token}-")) && key.ends_with("PowerOff"),
        "the key names the NodeFence step: {key}"
    );
    let steps = attempts_of(off);
    assert_eq!(
        steps.first().map(|(l, r)| (l.as_str(), r.as_str())),
        Some(("ipmi", "failed")),
        "{steps:?}"
    );
    assert_eq!(
        steps.last().map(|(l, r)| (l.as_str(), r.as_str())),
        Some(("pdu", "off_verified")),
        "{steps:?}"
    );
    let block = acted
        .iter()
        .find(|r| r["action"] == "storage.block")
        .unwrap_or_else(|| panic!("a storage.block record for m0: {audit:#?}"));
    assert_eq!(block["token"].as_u64(), Some(token));
    assert_eq!(
        acted
            .iter()
            .filter(|r| r["action"] == "power.off" || r["action"] == "storage.block")
            .count(),
        2,
        "each device was acted on once: {acted:#?}"
    );
    // The controller's attempts and the bridge's records agree on the keys.
    let attempt_actions: Vec<DeviceAction> = st.attempts.iter().map(|a| a.action).collect();
    assert_eq!(
        attempt_actions,
        vec![DeviceAction::PowerOff, DeviceAction::Block]
    );
    // No credential the bridge used reached its log, its audit log or the controller's log.
    let community =
        palisade_lab::PduInfo::secret(&lab.pdu().unwrap().info().community_rw_file).unwrap();
    let bmc_password = lab.machines()[1].bmc().password().unwrap();
    for log in [&ctl.log, &bridge.proc.log, &bridge.audit_log] {
        let text = palisade_scenario::read_or_empty(log);
        assert!(!text.is_empty(), "{} is empty", log.display());
        for secret in [&community, &bmc_password, &storage.token] {
            assert!(
                !text.contains(secret.as_str()),
                "a secret in {}",
                log.display()
            );
        }
    }
}
