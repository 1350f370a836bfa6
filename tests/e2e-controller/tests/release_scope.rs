//! Release is never wider than the fence: a verified storage block covers only the pods whose
//! every claim is on the storage it names. A volume-less StatefulSet pod on the same node may
//! still run (it is only cut off from the storage), so it is held, `NotCoveredByFence`, never
//! force-deleted, and no second copy of its identity starts elsewhere. So is a pod whose claim
//! lives on other storage (another StorageClass, which the firewall does not block): it may
//! still write there (issue 32, item 6; it was released before the fix).
//!
//! On Kubernetes 1.34 the test goes on: the held pods stay because no out-of-service taint
//! lands (Kubernetes would evict and force-delete them otherwise). Then a person adds the
//! taint anyway: Kubernetes' own controllers delete the held pod while its process still runs
//! on the partitioned machine (the audit log names them), which is why Palisade never adds
//! it while it holds a pod; and Palisade never removes a taint another actor put there, nor
//! lifts its storage block while it stays.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use palisade_lab::Cut;
use palisade_model::nodefence::{Coverage, Phase};
use serde_json::json;

/// The marker in the volume-less pod's command line, to find its process on the machine.
const MARKER: &str = "4242421";

fn web_statefulset() -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "app"},
        "spec": {
            "replicas": 1, "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 5,
                    "volumes": [{"name": "scratch", "emptyDir": {}}],
                    "containers": [{"name": "app", "image": "host",
                                    "command": ["/bin/sh", "-c", format!("exec sleep {MARKER}")]}]
                }
            }
        }
    }))
    .unwrap()
}

/// The StatefulSet `app/files`: one replica whose claim is on storage the lab's firewall does
/// not fence (StorageClass [`OTHER_CLASS`], a host directory).
fn files_statefulset() -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": "files", "namespace": "app"},
        "spec": {
            "replicas": 1, "serviceName": "files",
            "selector": {"matchLabels": {"app": "files"}},
            "template": {
                "metadata": {"labels": {"app": "files"}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "app", "image": "host",
                                    "command": ["/bin/sh", "-c", "exec sleep 4242422"],
                                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]
                }
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": OTHER_CLASS,
                         "resources": {"requests": {"storage": "1Gi"}}}
            }]
        }
    }))
    .unwrap()
}

/// A StorageClass the lab's storage firewall does not fence.
const OTHER_CLASS: &str = "nfs-elsewhere";

/// Whether a process of machine `i` (in its PID namespace) runs the volume-less pod's command.
fn web_process_alive(lab: &palisade_lab::Lab, i: usize) -> bool {
    let ns_of = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let host_ns = ns_of("self");
    let Some(machine_ns) = lab.machines()[i]
        .processes()
        .iter()
        .filter_map(|p| ns_of(&p.to_string()))
        .find(|ns| Some(ns) != host_ns.as_ref())
    else {
        return false;
    };
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| pid.chars().all(|c| c.is_ascii_digit()))
        .any(|pid| {
            ns_of(&pid).as_ref() == Some(&machine_ns)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains(MARKER))
                    .unwrap_or(false)
        })
}

#[test]
fn a_storage_only_fence_holds_a_volume_less_statefulset_pod_whose_process_still_runs() {
    let (lab, rt, c) = lab_ready(3, false);
    let storage = palisade_scenario::Storage::start(&lab, &["db"]).expect("storage server");
    let ctl = start_controller(&lab, "ctl-scope");
    policy(&c, &rt);
    // m0's only level: the storage firewall.
    secret(
        &c,
        &rt,
        "storage-m0",
        &[("caBundle", &storage.ca_pem), ("token", &storage.token)],
    );
    fence_target(
        &c,
        &rt,
        "m0",
        vec![(
            "storage",
            vec![palisade_scenario::device(
                &storage.fence_url(),
                "Storage",
                "storage-m0",
            )],
        )],
    );

    cordon(&c, &rt, "m1", true);
    cordon(&c, &rt, "m2", true);
    let sts_api: Api<StatefulSet> = Api::namespaced(c.clone(), "app");
    rt.block_on(sts_api.create(&PostParams::default(), &web_statefulset()))
        .expect("create StatefulSet");
    // files-0's volume: a host directory of class OTHER_CLASS, bound to its claim.
    let dir = lab.dir().join("files-pv");
    std::fs::create_dir_all(&dir).unwrap();
    let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "files-pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": OTHER_CLASS,
                 "claimRef": {"namespace": "app", "name": "data-files-0"},
                 "hostPath": {"path": dir.display().to_string()}}
    }))
    .unwrap();
    rt.block_on(
        Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(c.clone())
            .create(&PostParams::default(), &pv),
    )
    .expect("create files-pv");
    rt.block_on(sts_api.create(&PostParams::default(), &files_statefulset()))
        .expect("create StatefulSet files");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");
    let old = eventually("web-0 Running on m0", Duration::from_secs(120), || {
        let p = rt.block_on(pods.get_opt("web-0")).ok().flatten()?;
        let on_m0 = p.spec.as_ref()?.node_name.as_deref() == Some("m0");
        (on_m0 && pod_phase(&p) == "Running").then_some(p)
    });
    let old_uid = old.uid().unwrap();
    let files = eventually("files-0 Running on m0", Duration::from_secs(120), || {
        let p = rt.block_on(pods.get_opt("files-0")).ok().flatten()?;
        let on_m0 = p.spec.as_ref()?.node_name.as_deref() == Some("m0");
        (on_m0 && pod_phase(&p) == "Running").then_some(p)
    });
    let files_uid = files.uid().unwrap();
    cordon(&c, &rt, "m1", false);
    cordon(&c, &rt, "m2", false);
    assert!(
        web_process_alive(&lab, 0),
        "web-0 runs on m0 before the cut"
    );

    lab.partition(0, Cut::All).unwrap();
    let nf = eventually("m0's NodeFence Released", Duration::from_secs(180), || {
        fences_for(&c, &rt, "m0").into_iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Released)
        })
    });
    let st = nf.status.as_ref().unwrap();
    eprintln!(
        "released {:?}, held {:?}",
        st.release.pods.iter().map(|p| &p.name).collect::<Vec<_>>(),
        st.release.held.iter().map(|p| &p.name).collect::<Vec<_>>()
    );
    assert_eq!(st.verified_fence().unwrap().coverage(), Coverage::Stateful);
    assert!(
        st.release.pods.iter().all(|p| p.uid != old_uid),
        "web-0 must not be released on a storage-only fence"
    );
    assert!(
        st.release.held.iter().any(|p| p.uid == old_uid),
        "web-0 is recorded as held"
    );
    assert!(
        st.release.pods.iter().all(|p| p.uid != files_uid)
            && st.release.held.iter().any(|p| p.uid == files_uid),
        "files-0 mounts a claim on storage the block does not fence: held, not released"
    );
    // The node is tainted NoSchedule (no replacement may land on it), but not out-of-service
    // while an uncovered pod is bound to it.
    assert!(
        st.release.tainted_at.is_some(),
        "m0 is tainted before release"
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    let taints: Vec<String> = rt
        .block_on(nodes.get("m0"))
        .expect("read m0")
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    assert!(
        taints.iter().any(|t| t == "palisade.dev/fenced:NoSchedule"),
        "m0 tainted palisade.dev/fenced:NoSchedule: {taints:?}"
    );
    assert!(
        !taints
            .iter()
            .any(|t| t.starts_with("node.kubernetes.io/out-of-service")),
        "no out-of-service taint while an uncovered pod is bound to the node: {taints:?}"
    );
    let ev = events(&c, &rt, "default", &nf.name_any(), "NotCoveredByFence");
    assert!(
        ev.iter()
            .any(|e| e.message.as_deref().unwrap_or("").contains("web-0")),
        "a NotCoveredByFence Event names web-0"
    );
    // Some time later: the old process still runs on the partitioned m0, its pod object is
    // still bound there, and no second web-0 exists anywhere.
    ctl.wait_ticks(12);
    assert!(web_process_alive(&lab, 0), "web-0 still runs on m0");
    let now = rt.block_on(pods.get("web-0")).expect("web-0 still exists");
    assert_eq!(now.uid().as_deref(), Some(old_uid.as_str()));
    let files_now = rt
        .block_on(pods.get("files-0"))
        .expect("files-0 still exists");
    assert_eq!(files_now.uid().as_deref(), Some(files_uid.as_str()));
    assert_eq!(
        now.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("m0")
    );
    assert!(!web_process_alive(&lab, 1) && !web_process_alive(&lab, 2));
    if lab.control_plane().unwrap().version() != palisade_lab::KubeVersion::V1_20 {
        a_persons_out_of_service_taint_releases_what_palisade_held(
            &lab, &rt, &c, &ctl, &old_uid, &nf,
        );
    }
}

/// The 1.34 tail of the test above: a person taints m0 out-of-service while web-0 is held.
fn a_persons_out_of_service_taint_releases_what_palisade_held(
    lab: &palisade_lab::Lab,
    rt: &tokio::runtime::Runtime,
    c: &kube::Client,
    ctl: &Controller,
    old_uid: &str,
    nf: &palisade_model::NodeFence,
) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    let nodes: Api<Node> = Api::all(c.clone());
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");
    let t_taint = k8s_openapi::jiff::Timestamp::now();
    let mut taints = rt
        .block_on(nodes.get("m0"))
        .unwrap()
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default();
    taints.push(
        serde_json::from_value(json!({"key": palisade_model::OUT_OF_SERVICE_TAINT_KEY,
            "value": "person", "effect": "NoExecute"}))
        .unwrap(),
    );
    rt.block_on(nodes.patch(
        "m0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"taints": taints}})),
    ))
    .expect("a person taints m0 out-of-service");
    // Kubernetes deletes the held pod although its process still runs on m0.
    eventually(
        "Kubernetes deletes the held web-0",
        Duration::from_secs(120),
        || {
            let p = rt.block_on(pods.get_opt("web-0")).ok()?;
            (p.and_then(|p| p.uid()).as_deref() != Some(old_uid)).then_some(())
        },
    );
    assert!(web_process_alive(lab, 0), "its process still runs on m0");
    let by: Vec<String> = lab
        .control_plane()
        .unwrap()
        .audit()
        .into_iter()
        .filter(|e| e.on("pods", "web-0") && e.verb == "delete" && e.succeeded())
        .filter(|e| {
            e.request_received_timestamp
                .parse::<k8s_openapi::jiff::Timestamp>()
                .is_ok_and(|t| t >= t_taint)
        })
        .map(|e| e.user.username)
        .collect();
    eprintln!("web-0 deleted after the person's taint by {by:?}");
    assert!(
        !by.is_empty()
            && by
                .iter()
                .all(|u| u.starts_with("system:serviceaccount:kube-system:")),
        "Kubernetes' own controllers, not Palisade, delete it: {by:?}"
    );
    // Palisade leaves the person's taint alone and keeps its storage block.
    ctl.wait_ticks(10);
    let n = rt.block_on(nodes.get("m0")).unwrap();
    assert!(
        n.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == palisade_model::OUT_OF_SERVICE_TAINT_KEY
                && t.value.as_deref() == Some("person")),
        "the person's taint stays"
    );
    let now = fences_for(c, rt, "m0")
        .into_iter()
        .find(|f| f.metadata.name == nf.metadata.name)
        .and_then(|f| f.status)
        .unwrap();
    assert!(
        now.recovery.unfenced_at.is_none(),
        "the storage block stays"
    );
}
