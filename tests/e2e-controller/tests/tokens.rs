//! Tokens only go up. A controller reinstalled from scratch (its leader Lease and every
//! NodeFence gone) starts its token count again, but the firmware-bridge remembers the highest
//! token it has seen per target and refuses older ones. The refusal is reported as what it is
//! (`StaleFencingToken`, not a device failure): the controller steps down, re-elects above the
//! bridge's floor, and the fence completes with the higher token.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use palisade_lab::Cut;
use palisade_model::nodefence::Phase;
use palisade_model::NodeFence;
use palisade_scenario::{BridgeOptions, FirmwareBridge};
use serde_json::json;

const LEASE: &str = "palisade-controller";

fn released(c: &kube::Client, rt: &tokio::runtime::Runtime) -> NodeFence {
    eventually("m0's NodeFence Released", Duration::from_secs(180), || {
        fences_for(c, rt, "m0").into_iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Released)
        })
    })
}

#[test]
fn a_controller_reinstalled_from_scratch_re_elects_above_the_bridge_floor() {
    let (lab, rt, c) = lab_ready(3, true);
    let bridge = FirmwareBridge::start(
        &lab,
        BridgeOptions {
            wrong_bmc_password: &[],
            storage: None,
            ..Default::default()
        },
    )
    .expect("firmware-bridge starts");
    // An earlier life of the cluster left the leader Lease at token 5.
    let leases: Api<Lease> = Api::namespaced(c.clone(), SYSTEM_NS);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": LEASE, "namespace": SYSTEM_NS,
                     "annotations": {"palisade.dev/fencing-token": "5"}},
        "spec": {}
    }))
    .unwrap();
    rt.block_on(leases.create(&PostParams::default(), &lease))
        .expect("create the leader Lease");
    // First life: token 6 fences m0 through the bridge.
    let first = start_controller_with_env(&lab, "ctl-life-1", &bridge.controller_env());
    policy(&c, &rt);
    fence_target(
        &c,
        &rt,
        "m0",
        vec![(
            "bridge",
            vec![json!({"url": bridge.url("m0"), "kind": "Power"})],
        )],
    );
    lab.partition(0, Cut::All).unwrap();
    let nf = released(&c, &rt);
    assert_eq!(nf.status.as_ref().and_then(|s| s.fencing_token), Some(6));
    drop(first);

    // The machine comes back by hand; the controller is reinstalled from scratch.
    lab.heal(0).unwrap();
    let m0 = &lab.machines()[0];
    let b = m0.bmc();
    let on = std::process::Command::new("ipmitool")
        .args(["-I", "lanplus", "-C", "3", "-H"])
        .arg(b.host.to_string())
        .args(["-p", &b.port.to_string(), "-U", &b.user, "-f"])
        .arg(&b.password_file)
        .args(["chassis", "power", "on"])
        .output()
        .expect("ipmitool");
    assert!(on.status.success(), "{on:?}");
    wait_nodes_ready(&lab, &c, &rt);
    // Its controller is gone: a person abandons the fence (it still holds m0).
    abandon_fence(&c, &rt, &nf.name_any());
    rt.block_on(leases.delete(LEASE, &DeleteParams::default()))
        .expect("delete the leader Lease");
    eventually("old NodeFence gone", Duration::from_secs(30), || {
        fences_for(&c, &rt, "m0").is_empty().then_some(())
    });

    // Second life: it starts at token 1, the bridge refuses it for m0 (it has seen 6), and
    // the controller re-elects above 6 instead of failing the fence.
    let _second = start_controller_with_env(&lab, "ctl-life-2", &bridge.controller_env());
    lab.partition(0, Cut::All).unwrap();
    let nf = released(&c, &rt);
    let st = nf.status.clone().unwrap();
    let token = st.fencing_token.expect("token");
    assert!(
        token > 6,
        "the fence completed above the bridge's floor (token {token})"
    );
    assert!(
        st.levels
            .iter()
            .all(|l| l.result == palisade_model::nodefence::LevelResult::Verified),
        "the stale refusal is not recorded as a failed level: {:?}",
        st.levels
    );
    let stale = events(&c, &rt, "default", &nf.name_any(), "StaleFencingToken");
    assert!(
        !stale.is_empty(),
        "the refusal is reported as a stale token, with a clear reason"
    );
    eprintln!("{}", stale[0].message.clone().unwrap_or_default());
}
