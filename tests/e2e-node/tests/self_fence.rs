//! Self-fencing: a machine cut off from the API kills its PVC-using pods within
//! `--self-fence-after`, leaves other pods running, and resumes them only once the API
//! confirms they still belong to it.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::PostParams;
use kube::Api;
use palisade_lab::Cut;
use serde_json::json;

#[test]
fn partitioned_machine_kills_pvc_pods_within_self_fence_after_and_keeps_others() {
    let lab = start_lab(1);
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    let nodes: Api<Node> = Api::all(c.clone());
    let node = rt.block_on(nodes.get("m0")).unwrap();
    assert_eq!(
        node.metadata
            .annotations
            .unwrap()
            .get("palisade.dev/self-fence-after-seconds")
            .map(String::as_str),
        Some("4"),
        "self-fencing is advertised on the Node"
    );
    namespace(&c, &rt, "fence");
    let dir = scratch(&lab, "fence");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-fence"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                 "hostPath": {"path": dir.join("pv").display().to_string()}}
    }))
    .unwrap();
    rt.block_on(Api::<PersistentVolume>::all(c.clone()).create(&PostParams::default(), &pv))
        .unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual", "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    rt.block_on(
        Api::<PersistentVolumeClaim>::namespaced(c.clone(), "fence")
            .create(&PostParams::default(), &pvc),
    )
    .unwrap();
    // Each container is a `sleep` with its own duration, so the test finds its host pid.
    let run = |n: &str| {
        format!(
            "exec sleep {}",
            if n == "stateful" { 100001 } else { 100002 }
        )
    };
    create_pod(
        &c,
        &rt,
        "fence",
        json!({"metadata": {"name": "stateful"}, "spec": {"nodeName": "m0",
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", run("stateful")]}]}}),
    );
    create_pod(
        &c,
        &rt,
        "fence",
        json!({"metadata": {"name": "stateless"}, "spec": {"nodeName": "m0",
            "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", run("stateless")]}]}}),
    );
    // Containers get a clean environment (no lab marker), so look at every process.
    let pid_of = |n: &str| -> Option<i32> {
        let want = format!("sleep\0{}\0", if n == "stateful" { 100001 } else { 100002 });
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .ok()
                .filter(|c| c == want.as_bytes())
                .map(|_| pid)
        })
    };
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    for n in ["stateful", "stateless"] {
        eventually(&format!("{n} running"), Duration::from_secs(90), || {
            let p = get_pod(&c, &rt, "fence", n)?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())?;
            pid_of(n).filter(|p| alive(*p))
        });
    }
    let (stateful, stateless) = (pid_of("stateful").unwrap(), pid_of("stateless").unwrap());
    let cut_at = now_s();
    lab.partition(0, Cut::ControlPlane).unwrap();
    let killed_at = eventually("PVC pod killed", Duration::from_secs(30), || {
        (!alive(stateful)).then(now_s)
    });
    let after = killed_at - cut_at;
    eprintln!("PVC pod killed {after:.2}s after the cut (self-fence-after {SELF_FENCE_AFTER_S}s)");
    assert!(
        after <= SELF_FENCE_AFTER_S + 0.5,
        "killed {after:.2}s after the cut"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        pid_of("stateful"),
        None,
        "a fenced pod is not restarted while the API is unreachable"
    );
    assert!(alive(stateless), "the pod without a PVC keeps running");
    lab.heal(0).unwrap();
    eventually(
        "PVC pod resumes once the API confirms it",
        Duration::from_secs(60),
        || pid_of("stateful").filter(|p| *p != stateful && alive(*p)),
    );
    assert!(alive(stateless), "the pod without a PVC was never touched");
    let log = agent_log(&lab, 0);
    assert!(log.contains("self-fencing"), "agent logged the self-fence");
}
