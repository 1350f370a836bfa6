//! Seed 002's hazard: a deleted Node object means "permanently partitioned", so the agent
//! kills every pod before it registers the Node again, and never runs those pods again.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::DeleteParams;
use kube::Api;
use serde_json::json;

#[test]
fn deleted_node_kills_its_pods_before_registering_again() {
    let lab = start_lab(1);
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, "nodedel");
    create_pod(
        &c,
        &rt,
        "nodedel",
        json!({"metadata": {"name": "victim"}, "spec": {"nodeName": "m0",
            "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", "exec sleep 100003"]}]}}),
    );
    eventually("victim running", Duration::from_secs(60), || {
        pid_of_sleep("100003")
    });
    let nodes: Api<Node> = Api::all(c.clone());
    let old_uid = rt.block_on(nodes.get("m0")).unwrap().metadata.uid;
    rt.block_on(nodes.delete("m0", &DeleteParams::default()))
        .unwrap();
    // Until the process is dead, the Node must not come back.
    let mut killed = false;
    eventually("node registered again", Duration::from_secs(60), || {
        let alive = pid_of_sleep("100003").is_some();
        let node = rt.block_on(nodes.get_opt("m0")).ok().flatten();
        let back = node.is_some_and(|n| n.metadata.uid != old_uid);
        if !alive {
            killed = true;
        }
        assert!(
            !(back && alive),
            "Node re-registered while a pod process still ran"
        );
        (back && killed).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        pid_of_sleep("100003").is_none(),
        "the released pod is not started again"
    );
}
