//! The companion's peer check, on the real `palisade-companion` and a real Kubernetes 1.34 API
//! server (a control-plane-only lab).
//!
//! Four stock nodes, m0 to m3, whose kubelets the test plays (it renews each Lease every
//! second). Each runs the companion with `--watchdog` on a regular file that stands in for the
//! device (petted, never armed: nothing is promised, but the petting follows the self-fence
//! rule exactly), reaches the API server through one relay that the test can black-hole, and
//! answers its peers on its own loopback address (127.0.0.11 to .14, its Node's InternalIP).
//! m0, m1 and m2 hold the cluster's peer key; m3 holds another one, so its peers refuse it
//! and it them: the control, in the same run.
//!
//! Before the outage every companion writes its stamp and its peer check (vouch delay,
//! members) on its Lease. Then the control plane goes away for every companion and kubelet:
//! no write gets through. Past `--self-fence-after` (12 s) m0, m1 and m2 are excused by a
//! strict majority (three of the four members: each other and themselves) and keep petting;
//! m3, excused by no one, stops petting and self-fences. The test fails if a keyed companion
//! stops petting or self-fences during the outage, or if m3 keeps petting (then the excuse is
//! not what kept the others petting). Once the control plane is back, every companion writes
//! again and m3 lifts its self-fence.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{client, eventually, rt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use palisade_lab::forwarder::{relay, CutSet};
use palisade_lab::KubeVersion;
use palisade_model::advertise::{MemberSet, COMPANION_WRITTEN, PEER_MEMBERS, PEER_VOUCH_AFTER};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const NODES: [&str; 4] = ["m0", "m1", "m2", "m3"];
const SELF_FENCE_AFTER: Duration = Duration::from_secs(12);

fn address(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 11 + u8::try_from(i).unwrap()))
}

/// Creates node `i` (its InternalIP on loopback) and its Lease.
fn node_and_lease(c: &kube::Client, rt: &tokio::runtime::Runtime, i: usize) {
    let name = NODES[i];
    let nodes: Api<Node> = Api::all(c.clone());
    let node: Node = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    rt.block_on(nodes.create(&PostParams::default(), &node))
        .expect("create the Node");
    let status = json!({ "status": { "addresses": [
        { "type": "InternalIP", "address": address(i).to_string() }
    ] } });
    rt.block_on(nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)))
        .expect("the Node's address");
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "holderIdentity": name, "leaseDurationSeconds": 10 },
    }))
    .unwrap();
    rt.block_on(leases.create(&PostParams::default(), &lease))
        .expect("create the Lease");
}

/// The kubelets: renews every node's Lease every second while `up` holds.
fn kubelets(c: kube::Client, rt: &tokio::runtime::Runtime, up: Arc<AtomicBool>) {
    rt.spawn(async move {
        let leases: Api<Lease> = Api::namespaced(c, "kube-node-lease");
        loop {
            if up.load(Ordering::SeqCst) {
                for name in NODES {
                    let renew = json!({ "spec": { "renewTime": MicroTime(Timestamp::now()) } });
                    let _ = leases
                        .patch(name, &PatchParams::default(), &Patch::Merge(&renew))
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

/// A copy of the admin kubeconfig whose server is `server`.
fn kubeconfig_via(admin: &Path, server: SocketAddr, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(admin).expect("admin kubeconfig");
    let mut cfg: serde_json::Value = serde_saphyr::from_str(&text).expect("kubeconfig parses");
    for cluster in cfg["clusters"].as_array_mut().expect("clusters") {
        cluster["cluster"]["server"] = json!(format!("https://{server}"));
    }
    let path = dir.join("via-relay.kubeconfig");
    palisade_lab::write_secret(&path, serde_saphyr::to_string(&cfg).unwrap().as_bytes())
        .expect("write the kubeconfig");
    path
}

struct Companion {
    child: Child,
    log: PathBuf,
    watchdog: PathBuf,
}

impl Companion {
    fn pets(&self) -> usize {
        std::fs::read(&self.watchdog).map_or(0, |b| b.len())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Companion {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn companion(dir: &Path, i: usize, kubeconfig: &Path, key: &Path, port: u16) -> Companion {
    let name = NODES[i];
    let log = dir.join(format!("companion-{name}.log"));
    let watchdog = dir.join(format!("watchdog-{name}"));
    std::fs::write(&watchdog, b"").unwrap();
    let child = Command::new(palisade_lab::bin_path("palisade-companion").expect("built"))
        .args(["--node-name", name, "--interval", "1s", "--timeout", "1s"])
        .args(["--watchdog-timeout", "6s", "--watchdog-interval", "1s"])
        .args(["--self-fence-after", "12s"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cri-endpoint")
        .arg(format!("unix://{}", dir.join("no-runtime.sock").display()))
        .arg("--watchdog")
        .arg(&watchdog)
        .arg("--address")
        .arg(address(i).to_string())
        .args(["--peer-port", &port.to_string()])
        .arg("--peer-key-file")
        .arg(key)
        .env("RUST_LOG", "info,kube=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("palisade-companion starts");
    Companion {
        child,
        log,
        watchdog,
    }
}

const SELF_FENCES: &str = "self-fence: no successful write for --self-fence-after";
const EXCUSED: &str = "a majority of peers cannot reach the API either";

#[test]
fn companions_that_cannot_write_keep_petting_while_a_majority_vouches_and_not_otherwise() {
    let lab = common::control_plane_lab(KubeVersion::V1_34);
    let rt = rt();
    let c = client(&lab, &rt);
    for i in 0..NODES.len() {
        node_and_lease(&c, &rt, i);
    }
    let up = Arc::new(AtomicBool::new(true));
    kubelets(c.clone(), &rt, up.clone());

    // One relay in front of the API server for every companion: cutting loopback there is
    // the control-plane outage.
    let cp = lab.control_plane().expect("control plane");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_addr = listener.local_addr().unwrap();
    let cuts = CutSet::default();
    let upstream = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), cp.api_port());
    rt.spawn(relay(listener, upstream, cuts.clone()));
    let kubeconfig = kubeconfig_via(cp.admin_kubeconfig(), relay_addr, lab.dir());

    let (shared, other) = (lab.dir().join("peer.key"), lab.dir().join("other.key"));
    palisade_lab::write_secret(&shared, format!("{}\n", "5eed".repeat(16)).as_bytes()).unwrap();
    palisade_lab::write_secret(&other, format!("{}\n", "0dd5".repeat(16)).as_bytes()).unwrap();
    let port = common::free_port();
    let companions: Vec<Companion> = (0..NODES.len())
        .map(|i| {
            let key = if i == 3 { &other } else { &shared };
            companion(lab.dir(), i, &kubeconfig, key, port)
        })
        .collect();

    // Every companion writes its stamp and its peer check over all four members.
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    for name in NODES {
        let a = eventually(&format!("{name}'s peer check on its Lease"), WAIT, || {
            let a = rt.block_on(leases.get(name)).ok()?.metadata.annotations?;
            (a.contains_key(COMPANION_WRITTEN)
                && a.contains_key(PEER_VOUCH_AFTER)
                && a.get(PEER_MEMBERS) == Some(&MemberSet::of(NODES).to_string()))
            .then_some(a)
        });
        println!("{name}: {a:?}");
    }
    // Long enough for every member set offered to have landed once more.
    std::thread::sleep(Duration::from_secs(3));

    // The control plane goes away for every companion and every kubelet.
    cuts.cut(IpAddr::V4(Ipv4Addr::LOCALHOST));
    up.store(false, Ordering::SeqCst);
    println!("outage from {}", Timestamp::now());
    std::thread::sleep(SELF_FENCE_AFTER + Duration::from_secs(4));
    let before: Vec<usize> = companions.iter().map(Companion::pets).collect();
    std::thread::sleep(Duration::from_secs(8));
    let after: Vec<usize> = companions.iter().map(Companion::pets).collect();
    println!("pets 16 s into the outage {before:?}, 24 s into it {after:?}");

    for (i, c) in companions.iter().enumerate().take(3) {
        let log = c.log();
        assert!(
            after[i] > before[i] && !log.contains(SELF_FENCES) && log.contains(EXCUSED),
            "{}: a keyed companion, excused by a majority, must keep petting and not \
             self-fence (pets {} then {}):\n{log}",
            NODES[i],
            before[i],
            after[i]
        );
    }
    let m3 = &companions[3];
    assert!(
        after[3] == before[3] && m3.log().contains(SELF_FENCES) && !m3.log().contains(EXCUSED),
        "m3, whose key no peer shares, must stop petting and self-fence (pets {} then {}):\n{}",
        before[3],
        after[3],
        m3.log()
    );

    // The control plane is back: every companion writes again, m3 lifts its self-fence.
    cuts.heal(IpAddr::V4(Ipv4Addr::LOCALHOST));
    up.store(true, Ordering::SeqCst);
    eventually("m3 writes again and lifts its self-fence", WAIT, || {
        m3.log().contains("the self-fence is lifted").then_some(())
    });
}
