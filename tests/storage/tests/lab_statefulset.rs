//! The at-most-one proof through Kubernetes: StatefulSet writer pods run by `palisade-node`
//! on lab machines, volumes attached by the real attach-detach controller and the lab
//! attacher (in no-revoke mode: a driver without an unpublish step, like NFS).
//!
//! The old pod's machine is cut off from the control plane but still reaches storage, its
//! node agent does not self-fence (`--self-fence-after` far away), and the pod is force
//! deleted. The StatefulSet starts the replacement on another machine; after the 1.20
//! controller's 6-minute force detach, the replacement writes.
//! - Without a storage fence the checker reports split-brain (negative control).
//! - With the old machine blocked at the storage first, the checker passes.
//!
//! Needs `cargo build -p palisade-node -p palisade-labstore --bins`. Takes about 8 minutes.

mod common;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_port, run_checker, volume_file, Pki, ServerProc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use palisade_lab::{Cut, Lab, LabConfig};
use palisade_labstore::kube_objects;
use palisade_labstore::record::parse_ack_log;
use palisade_storagefw::NodeRef;
use palisade_test_support::eventually;
use serde_json::json;

const DATA: &str = "10.213.0.1:7000";

fn start_lab() -> Lab {
    let agent = palisade_lab::bin_path("palisade-node")
        .expect("build the node agent first: cargo build -p palisade-node --bins");
    let command = format!(
        r#"D="$PALISADE_MACHINE_DIR"
mkdir -p "$D/node-state"
exec '{agent}' --node-name "$PALISADE_MACHINE_NAME" --kubeconfig "$PALISADE_NODE_KUBECONFIG" \
  --address "$PALISADE_MACHINE_ADDRESS" --state-dir "$D/node-state" --image-store "$D/images" \
  --lease-duration 7200s --renew-interval 1s --self-fence-after 3600s --no-peer-check >> "$D/agent.log" 2>&1"#,
        agent = agent.display()
    );
    Lab::start(LabConfig {
        machines: 3,
        control_plane: true,
        pdu: false,
        machine_command: command,
        ..Default::default()
    })
    .expect("lab starts")
}

fn cordon(rt: &tokio::runtime::Runtime, c: &Client, node: &str, on: bool) {
    let nodes: Api<Node> = Api::all(c.clone());
    rt.block_on(nodes.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"unschedulable": on}})),
    ))
    .unwrap();
}

fn node_ready(rt: &tokio::runtime::Runtime, c: &Client, node: &str) -> Option<bool> {
    let n = rt.block_on(Api::<Node>::all(c.clone()).get(node)).ok()?;
    Some(
        n.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
    )
}

fn statefulset(name: &str, acks: &Path) -> StatefulSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "serviceName": name, "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "writer", "image": "host",
                        "command": [env!("CARGO_BIN_EXE_palisade-writer")],
                        "env": [
                            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                            {"name": "STORAGE_SERVER", "value": DATA},
                            {"name": "STORAGE_VOLUME", "value": name},
                            {"name": "ACK_LOG", "value": format!("{}/acks-$(POD_UID).log", acks.display())},
                            {"name": "WRITE_INTERVAL_MS", "value": "50"},
                            {"name": "WRITE_SECONDS", "value": "1500"}
                        ],
                        // Host-image container: the mount point lives next to the acks.
                        "volumeMounts": [{"name": "data", "mountPath": acks.join("mnt-data").display().to_string()}]
                    }]
                }
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                         "resources": {"requests": {"storage": "1Gi"}}}
            }]
        }
    }))
    .unwrap()
}

fn pod_on(rt: &tokio::runtime::Runtime, c: &Client, name: &str) -> Option<(String, String)> {
    let p = rt
        .block_on(Api::<Pod>::namespaced(c.clone(), "default").get(name))
        .ok()?;
    Some((p.metadata.uid?, p.spec?.node_name?))
}

fn acks(dir: &Path, uid: &str) -> usize {
    std::fs::read_to_string(dir.join(format!("acks-{uid}.log")))
        .ok()
        .and_then(|t| parse_ack_log(&t).ok())
        .map(|a| a.len())
        .unwrap_or(0)
}

#[test]
fn force_deleted_writer_on_a_partitioned_machine_is_split_brain_unless_storage_fenced() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lab = start_lab();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cp = lab.control_plane().unwrap();
    let c = rt
        .block_on(palisade_lab::client_from_kubeconfig(cp.admin_kubeconfig()))
        .unwrap();
    for m in lab.machines() {
        eventually(
            &format!("{} Ready", m.name()),
            Duration::from_secs(120),
            || node_ready(&rt, &c, m.name())?.then_some(()),
        );
    }

    // Storage server in the hub, attacher without revoke-on-detach.
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade-storage-server"))
        .args(["--data-listen", DATA, "--data-netns", lab.hub_netns()])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .arg("--state-dir")
        .arg(state.path())
        .arg("--tls-cert")
        .arg(&pki.cert)
        .arg("--tls-key")
        .arg(&pki.key)
        .arg("--token-file")
        .arg(&pki.token_file)
        .args(["--volume", "neg", "--volume", "pos"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let srv = ServerProc {
        child,
        data: DATA.parse().unwrap(),
        admin: format!("127.0.0.1:{admin_port}").parse().unwrap(),
        state_dir: state.path().to_owned(),
    };
    let mut attacher = Command::new(env!("CARGO_BIN_EXE_palisade-attacher"))
        .arg("--kubeconfig")
        .arg(cp.admin_kubeconfig())
        .args(["--admin-url", &format!("https://{}", srv.admin)])
        .arg("--ca-file")
        .arg(&pki.ca_pem)
        .arg("--token-file")
        .arg(&pki.token_file)
        .args(["--ensure-csi-driver", "--no-revoke-on-detach"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    for v in ["neg", "pos"] {
        rt.block_on(kube_objects::ensure_volume(
            &c,
            &format!("pv-{v}"),
            v,
            DATA,
            "default",
            &format!("data-{v}-0"),
            kube_objects::Detach::Revokes,
        ))
        .unwrap();
    }
    let acks_dir: PathBuf = lab.dir().join("storage-acks");
    std::fs::create_dir_all(&acks_dir).unwrap();
    let sts: Api<StatefulSet> = Api::namespaced(c.clone(), "default");

    // neg-0 on m0, pos-0 on m1 (cordon the others while each is placed).
    let place = |name: &str, node: &str| {
        for m in ["m0", "m1", "m2"] {
            cordon(&rt, &c, m, m != node);
        }
        eventually("statefulset created", Duration::from_secs(60), || {
            rt.block_on(sts.create(&PostParams::default(), &statefulset(name, &acks_dir)))
                .ok()
        });
        let pod = format!("{name}-0");
        let (uid, n) = eventually(
            &format!("{pod} scheduled"),
            Duration::from_secs(120),
            || pod_on(&rt, &c, &pod),
        );
        assert_eq!(n, node);
        eventually(&format!("{pod} writing"), Duration::from_secs(180), || {
            (acks(&acks_dir, &uid) >= 20).then_some(())
        });
        uid
    };
    let neg_old = place("neg", "m0");
    let pos_old = place("pos", "m1");
    // Replacements may only go to m2.
    cordon(&rt, &c, "m2", false);

    lab.partition(0, Cut::ControlPlane).unwrap();
    lab.partition(1, Cut::ControlPlane).unwrap();
    // Fence m1 (pos) at the storage, verified; m0 (neg) is left unfenced.
    rt.block_on(async {
        let fw = srv.agent(&pki);
        let m1 = &lab.machines()[1];
        fw.block(&NodeRef::new(m1.name(), vec![IpAddr::V4(m1.address())]).unwrap())
            .await
            .unwrap();
    });
    let pos_old_at_fence = acks(&acks_dir, &pos_old);
    for n in ["m0", "m1"] {
        eventually(&format!("{n} NotReady"), Duration::from_secs(180), || {
            (!node_ready(&rt, &c, n)?).then_some(())
        });
    }
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    for p in ["neg-0", "pos-0"] {
        rt.block_on(pods.delete(
            p,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        ))
        .unwrap();
    }
    let replacement = |name: &str, old: &str| {
        let pod = format!("{name}-0");
        let (uid, node) = eventually(&format!("{pod} replaced"), Duration::from_secs(120), || {
            pod_on(&rt, &c, &pod).filter(|(u, _)| u != old)
        });
        assert_eq!(node, "m2");
        uid
    };
    let neg_new = replacement("neg", &neg_old);
    let pos_new = replacement("pos", &pos_old);
    // The 1.20 attach-detach controller force-detaches after 6 minutes.
    for uid in [&neg_new, &pos_new] {
        eventually("replacement writing", Duration::from_secs(720), || {
            (acks(&acks_dir, uid) >= 20).then_some(())
        });
    }
    let neg_old_now = acks(&acks_dir, &neg_old);
    eventually(
        "unfenced old writer still acknowledged",
        Duration::from_secs(60),
        || (acks(&acks_dir, &neg_old) >= neg_old_now + 10).then_some(()),
    );
    assert_eq!(
        acks(&acks_dir, &pos_old),
        pos_old_at_fence,
        "fenced old writer got acknowledgements after the fence"
    );
    let _ = attacher.kill();
    let _ = attacher.wait();

    let logs = |a: &str, b: &str| {
        [
            acks_dir.join(format!("acks-{a}.log")),
            acks_dir.join(format!("acks-{b}.log")),
        ]
    };
    let [a, b] = logs(&neg_old, &neg_new);
    let (code, out) = run_checker(&volume_file(state.path(), "neg"), &[&a, &b]);
    assert_eq!(code, 1, "unfenced handover must be split-brain:\n{out}");
    assert!(out.contains("SPLIT-BRAIN"), "{out}");
    eprintln!("{out}");
    let [a, b] = logs(&pos_old, &pos_new);
    let (code, out) = run_checker(&volume_file(state.path(), "pos"), &[&a, &b]);
    assert_eq!(code, 0, "fenced handover must pass:\n{out}");
    eprintln!("{out}");
}
