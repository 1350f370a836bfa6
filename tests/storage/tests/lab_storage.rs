//! Storage in the lab: the real attach-detach controller with the lab attacher, and the
//! at-most-one controls with writers inside lab machines.
//!
//! Needs root, the lab's tools and the cached control-plane binaries (hack/install-deps.sh),
//! and the binaries built: `cargo build -p palisade-labstore --bins`.

mod common;

use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use palisade_lab::{Cut, Lab, LabConfig};
use palisade_labstore::attacher::{DRIVER, FINALIZER};
use palisade_labstore::kube_objects;
use palisade_storagefw::NodeRef;
use palisade_test_support::eventually_async;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn node(name: &str, addr: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": addr}]}
    }))
    .unwrap()
}

fn pod(name: &str, node: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{"name": "writer", "image": "palisade/writer"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        }
    }))
    .unwrap()
}

async fn attachments_on(api: &Api<VolumeAttachment>, node: &str) -> Vec<VolumeAttachment> {
    api.list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|va| va.spec.node_name == node && va.spec.attacher == DRIVER)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn attacher_follows_the_attachment_lifecycle_and_rwo_keeps_a_second_node_out() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lab = Lab::start(LabConfig {
        machines: 0,
        control_plane: true,
        pdu: false,
        ..Default::default()
    })
    .expect("lab starts");
    let cp = lab.control_plane().unwrap();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let srv = ServerProc::start_default(&pki, state.path(), &["web-0"]);
    let _attacher = Killed(
        Command::new(env!("CARGO_BIN_EXE_palisade-attacher"))
            .arg("--kubeconfig")
            .arg(cp.admin_kubeconfig())
            .args(["--admin-url", &format!("https://{}", srv.admin)])
            .arg("--ca-file")
            .arg(&pki.ca_pem)
            .arg("--token-file")
            .arg(&pki.token_file)
            .arg("--ensure-csi-driver")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn palisade-attacher"),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = palisade_lab::client_from_kubeconfig(cp.admin_kubeconfig())
            .await
            .unwrap();
        let admin = srv.admin_client(&pki);
        let nodes: Api<Node> = Api::all(client.clone());
        for (n, a) in [("n-a", "10.213.0.21"), ("n-b", "10.213.0.22")] {
            nodes
                .create(&PostParams::default(), &node(n, a))
                .await
                .unwrap();
            kube_objects::prepare_node(&client, n).await.unwrap();
        }
        kube_objects::ensure_volume(
            &client,
            "pv-web-0",
            "web-0",
            &srv.data.to_string(),
            "default",
            "data-web-0",
            kube_objects::Detach::Revokes,
        )
        .await
        .unwrap();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
        eventually_async("PVC bound", WAIT, || async {
            let pvc = pvcs.get("data-web-0").await.ok()?;
            (pvc.status?.phase? == "Bound").then_some(())
        })
        .await;

        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        eventually_async("pod p1 created", WAIT, || async {
            pods.create(&PostParams::default(), &pod("p1", "n-a", "data-web-0"))
                .await
                .ok()
        })
        .await;
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        let va = eventually_async("attachment on n-a attached", WAIT, || async {
            let va = attachments_on(&vas, "n-a").await.into_iter().next()?;
            va.status.as_ref()?.attached.then_some(va)
        })
        .await;
        assert!(va
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == FINALIZER));
        let node_a = admin.node("n-a").await.unwrap();
        assert_eq!(node_a["granted_volumes"], json!(["web-0"]), "{node_a}");

        // A second pod on another node wants the same RWO volume: the real attach-detach
        // controller refuses while the first attachment exists.
        eventually_async("pod p2 created", WAIT, || async {
            pods.create(&PostParams::default(), &pod("p2", "n-b", "data-web-0"))
                .await
                .ok()
        })
        .await;
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let msg = eventually_async("Multi-Attach error event for p2", WAIT, || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                let m = e.message.unwrap_or_default();
                (e.involved_object.name.as_deref() == Some("p2") && m.contains("Multi-Attach"))
                    .then_some(m)
            })
        })
        .await;
        // 1.20 words it "Volume is already used by pod(s) p1" when the user can see the
        // other pod, "already exclusively attached to one node" otherwise.
        assert!(msg.contains("pv-web-0") && msg.contains("already"), "{msg}");
        assert!(
            attachments_on(&vas, "n-b").await.is_empty(),
            "second node got an attachment"
        );
        assert_eq!(
            admin.node("n-b").await.unwrap()["granted_volumes"],
            json!([])
        );

        // The first pod goes away: the controller detaches (deletes the attachment), the
        // attacher revokes n-a and releases its finalizer, then n-b gets attached.
        pods.delete(
            "p1",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        eventually_async("attachment on n-a gone", WAIT, || async {
            attachments_on(&vas, "n-a").await.is_empty().then_some(())
        })
        .await;
        assert_eq!(
            admin.node("n-a").await.unwrap()["granted_volumes"],
            json!([])
        );
        eventually_async("attachment on n-b attached", WAIT, || async {
            let va = attachments_on(&vas, "n-b").await.into_iter().next()?;
            va.status.as_ref()?.attached.then_some(())
        })
        .await;
        let node_b = admin.node("n-b").await.unwrap();
        assert_eq!(node_b["granted_volumes"], json!(["web-0"]), "{node_b}");
        assert_eq!(node_b["granted_addresses"], json!(["10.213.0.22"]));
    });
}

/// A writer running inside machine `netns`, talking to the server in the hub.
fn writer_in(netns: &str, server: &str, pod_uid: &str, node: &str, ack_log: &Path) -> Killed {
    Killed(
        Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(env!("CARGO_BIN_EXE_palisade-writer"))
            .env("STORAGE_SERVER", server)
            .env("STORAGE_VOLUME", "web-0")
            .env("POD_UID", pod_uid)
            .env("POD_NAME", "web-0")
            .env("NODE_NAME", node)
            .env("ACK_LOG", ack_log)
            .env("WRITE_INTERVAL_MS", "10")
            .env("WRITE_SECONDS", "300")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn writer in machine"),
    )
}

async fn wait_acks(path: &Path, at_least: usize) {
    eventually_async(
        &format!("{at_least} acks in {}", path.display()),
        WAIT,
        || async { (ack_count(path) >= at_least).then_some(()) },
    )
    .await;
}

/// Old pod on m0, m0 cut off from the control plane but still reaching storage, replacement
/// on m1 (what a force delete without fencing lets the StatefulSet do). Returns the checker's
/// exit code and output, and m0's acknowledgements at the fence and at the end.
fn partitioned_handover(lab: &Lab, fence: bool) -> (i32, String, usize, usize) {
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let data_addr = "10.213.0.1:7000";
    let admin_port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade-storage-server"))
        .args(["--data-listen", data_addr, "--data-netns", lab.hub_netns()])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .arg("--state-dir")
        .arg(state.path())
        .arg("--tls-cert")
        .arg(&pki.cert)
        .arg("--tls-key")
        .arg(&pki.key)
        .arg("--token-file")
        .arg(&pki.token_file)
        .args(["--volume", "web-0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("ready"), "{line}");
    let srv = ServerProc {
        child,
        data: data_addr.parse().unwrap(),
        admin: format!("127.0.0.1:{admin_port}").parse().unwrap(),
        state_dir: state.path().to_owned(),
    };
    let (m0, m1) = (&lab.machines()[0], &lab.machines()[1]);
    let logs = tempfile::tempdir().unwrap();
    let (ack_a, ack_b) = (logs.path().join("a.acks"), logs.path().join("b.acks"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let admin = srv.admin_client(&pki);
        for m in [m0, m1] {
            admin
                .grant("web-0", m.name(), &[IpAddr::V4(m.address())])
                .await
                .unwrap();
        }
        let mut a = writer_in(m0.netns(), data_addr, "uid-a", m0.name(), &ack_a);
        wait_acks(&ack_a, 20).await;
        lab.partition(0, Cut::ControlPlane).unwrap();
        let mut at_fence = 0;
        if fence {
            srv.agent(&pki)
                .block(&NodeRef::new(m0.name(), vec![IpAddr::V4(m0.address())]).unwrap())
                .await
                .unwrap();
            at_fence = ack_count(&ack_a);
        }
        let mut b = writer_in(m1.netns(), data_addr, "uid-b", m1.name(), &ack_b);
        wait_acks(&ack_b, 30).await;
        if !fence {
            let now = ack_count(&ack_a);
            wait_acks(&ack_a, now + 10).await;
        }
        stop(&mut a.0);
        stop(&mut b.0);
        lab.heal(0).unwrap();
        let (code, out) = run_checker(&volume_file(state.path(), "web-0"), &[&ack_a, &ack_b]);
        (code, out, at_fence, ack_count(&ack_a))
    })
}

#[test]
fn partitioned_old_writer_is_split_brain_without_a_storage_fence_and_clean_with_one() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lab = Lab::start(LabConfig {
        machines: 2,
        control_plane: true,
        pdu: false,
        ..Default::default()
    })
    .expect("lab starts");

    // Negative control: no fence, the checker must catch the split-brain.
    let (code, out, _, _) = partitioned_handover(&lab, false);
    assert_eq!(code, 1, "checker must report the unfenced handover:\n{out}");
    assert!(out.contains("SPLIT-BRAIN: old pod uid-a on m0"), "{out}");

    // Fence m0 at the storage first: its writes are refused and the verdict is clean.
    let (code, out, at_fence, at_end) = partitioned_handover(&lab, true);
    assert_eq!(code, 0, "checker must pass with the storage fence:\n{out}");
    assert_eq!(
        at_fence, at_end,
        "fenced m0 got acknowledgements after the fence"
    );
    assert!(out.contains("handover uid-a (m0) -> uid-b (m1)"), "{out}");
}
