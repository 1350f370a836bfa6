//! The recovery challenge: the controller writes it on the Node once it has released the
//! node's pods, and the agent answers it on its Lease, with every renewal, together with a
//! complete runtime inventory taken after it read the challenge. Withdrawn from the Node, the
//! answer is withdrawn from the Lease.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::Api;
use palisade_model::advertise::{
    CHALLENGE_ANSWERED, RECOVERY_CHALLENGE, RUNTIME_COMPLETE, RUNTIME_PODS,
};
use serde_json::json;

#[test]
fn the_lease_answers_the_nodes_recovery_challenge_with_a_complete_inventory() {
    let lab = start_ready_lab(1);
    let rt = rt();
    let c = client(&lab, &rt);
    namespace(&c, &rt, "challenge");
    let pod = create_pod(
        &c,
        &rt,
        "challenge",
        json!({"metadata": {"name": "runs"}, "spec": {"nodeName": "m0",
            "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", "exec sleep 100041"]}]}}),
    );
    let uid = pod.metadata.uid.expect("uid");
    eventually("pod running", Duration::from_secs(60), || {
        pid_of_sleep("100041")
    });
    let nodes: Api<Node> = Api::all(c.clone());
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let lease_annotations = || -> Option<BTreeMap<String, String>> {
        rt.block_on(leases.get_opt("m0"))
            .ok()
            .flatten()?
            .metadata
            .annotations
    };
    let challenge = |value: Option<&str>| {
        let patch = json!({"metadata": {"annotations": {RECOVERY_CHALLENGE: value}}});
        rt.block_on(nodes.patch("m0", &PatchParams::default(), &Patch::Merge(&patch)))
            .expect("annotate the Node");
    };

    challenge(Some("x"));
    let answered = eventually("the Lease answers x", Duration::from_secs(60), || {
        let a = lease_annotations()?;
        (a.get(CHALLENGE_ANSWERED).map(String::as_str) == Some("x")).then_some(a)
    });
    assert_eq!(
        answered.get(RUNTIME_COMPLETE).map(String::as_str),
        Some("true"),
        "the answer comes with a complete inventory: {answered:?}"
    );
    let pods = answered.get(RUNTIME_PODS).cloned().unwrap_or_default();
    assert!(
        pods.split(',').any(|p| p == uid),
        "the inventory names the running pod {uid}: {pods:?}"
    );

    challenge(None);
    eventually("the answer is withdrawn", Duration::from_secs(60), || {
        let a = lease_annotations()?;
        (!a.contains_key(CHALLENGE_ANSWERED)).then_some(())
    });
}
