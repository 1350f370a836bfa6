//! Storage fencing through a real `firmware-bridge` process (real executor, driving
//! `palisade-storagefw`) against the real lab storage server (`palisade-storage-server`):
//! block, status and unblock through the bridge (with the raw client and with a `bridge://`
//! `BridgeDevice`), each checked by reading the storage directly; stale tokens cannot unfence.
//!
//! Needs `cargo build -p palisade-labstore --bins` (the server binary is located next to the
//! test executable).

mod common;

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{install_provider, write_private, BridgeProcess, Ca};
use palisade_bridge::executor::{StorageAction, StorageState};
use palisade_fence::bridge::{BridgeClient, BridgeDevice, BridgeIdentity, ClientSettings};
use palisade_fence::{DeviceOptions, Target};
use palisade_storagefw::{NodeRef, StorageFirewall, StorageFwConfig};

const TOKEN: &str = "storage-token-3c9e71";

struct StorageServer {
    child: Child,
    admin_port: u16,
}

impl Drop for StorageServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_storage(dir: &std::path::Path, ca: &Ca) -> StorageServer {
    let (cert, key) = ca.server();
    std::fs::write(dir.join("storage.crt"), cert).unwrap();
    write_private(&dir.join("storage.key"), &key);
    write_private(&dir.join("storage-token"), &format!("{TOKEN}\n"));
    std::fs::create_dir_all(dir.join("storage-state")).unwrap();
    let bin = palisade_lab::bin_path("palisade-storage-server")
        .expect("palisade-storage-server built (cargo build -p palisade-labstore --bins)");
    let admin_port = free_port();
    let mut child = Command::new(bin)
        .arg("--data-listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--admin-listen")
        .arg(format!("127.0.0.1:{admin_port}"))
        .arg("--state-dir")
        .arg(dir.join("storage-state"))
        .arg("--tls-cert")
        .arg(dir.join("storage.crt"))
        .arg("--tls-key")
        .arg(dir.join("storage.key"))
        .arg("--token-file")
        .arg(dir.join("storage-token"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn palisade-storage-server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready "), "storage server: {line:?}");
    StorageServer { child, admin_port }
}

/// A storage agent talking to the storage server directly, out of band of the bridge.
fn direct(ca: &Ca, admin_port: u16) -> StorageFirewall {
    let target = palisade_storagefw::Target::parse(&format!(
        "storagefw+https://127.0.0.1:{admin_port}/?profile=lab"
    ))
    .unwrap();
    let mut cfg = StorageFwConfig::new(target, ca.pem().into_bytes()).unwrap();
    cfg.token = Some(palisade_storagefw::Secret::new(TOKEN));
    StorageFirewall::new(cfg).unwrap()
}

#[test]
fn storage_block_status_and_unblock_go_through_the_bridge_to_the_real_storage_server() {
    install_provider();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("bridge-storage-ca");
    let storage = start_storage(d, &ca);

    let server = ca.server();
    write_private(&d.join("server.key"), &server.1);
    std::fs::write(d.join("server.crt"), &server.0).unwrap();
    std::fs::write(d.join("ca.crt"), ca.pem()).unwrap();
    let cfg = format!(
        "listen = \"127.0.0.1:0\"\nstate_dir = \"state\"\n[tls]\ncert = \"server.crt\"\nkey = \"server.key\"\nclient_ca = \"ca.crt\"\n\
         [[policy]]\nclient = \"cn:palisade-controller\"\ntargets = [\"*\"]\n\
         [[targets]]\nid = \"m0\"\n[[targets.storage]]\nurl = \"storagefw+https://127.0.0.1:{port}/?profile=lab\"\n\
         ca_bundle = \"ca.crt\"\nnode = \"node-m0\"\naddresses = [\"10.213.0.11\"]\n\
         secrets = {{ token = {{ file = \"storage-token\" }} }}\n",
        port = storage.admin_port
    );
    let path = d.join("bridge.toml");
    std::fs::write(&path, cfg).unwrap();
    let bridge = BridgeProcess::spawn(&path);

    let (client_cert, client_key) = ca.client("palisade-controller");
    let client = BridgeClient::new(&ClientSettings::new(
        format!("https://127.0.0.1:{}/", bridge.port)
            .parse()
            .unwrap(),
        ca.pem().into_bytes(),
        client_cert.clone().into_bytes(),
        client_key.clone().into_bytes(),
    ))
    .unwrap();
    let fw = direct(&ca, storage.admin_port);
    let node = NodeRef::new("node-m0", vec![IpAddr::from([10, 213, 0, 11])]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let s = rt.block_on(client.storage_status("m0")).unwrap();
    assert_eq!(s.storage_state(), Some(StorageState::Unblocked), "{s:?}");
    assert!(!rt.block_on(fw.status(&node)).unwrap().blocked);

    let b = rt
        .block_on(client.storage("m0", StorageAction::Block, 4, "block-m0-1", Some("test")))
        .unwrap();
    assert_eq!(b.storage_state(), Some(StorageState::Blocked));
    assert!(b.verified);
    assert_eq!(
        b.evidence["devices"][0]["result"], "blocked_verified",
        "{}",
        b.evidence
    );
    assert!(
        rt.block_on(fw.status(&node)).unwrap().blocked,
        "the storage itself reports the node blocked"
    );
    let s = rt.block_on(client.storage_status("m0")).unwrap();
    assert_eq!(s.storage_state(), Some(StorageState::Blocked));

    // A stale token cannot unblock (unfence) the node.
    let e = rt
        .block_on(client.storage("m0", StorageAction::Unblock, 3, "unblock-old", None))
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(rt.block_on(fw.status(&node)).unwrap().blocked);

    let u = rt
        .block_on(client.storage("m0", StorageAction::Unblock, 4, "unblock-m0-1", None))
        .unwrap();
    assert_eq!(u.storage_state(), Some(StorageState::Unblocked));
    assert_eq!(u.evidence["devices"][0]["result"], "unblocked_verified");
    assert!(!rt.block_on(fw.status(&node)).unwrap().blocked);

    let m = rt.block_on(client.monitor("m0")).unwrap();
    assert_eq!(
        m.health(),
        Some(palisade_fence::bridge::wire::Health::Ok),
        "{m:?}"
    );

    // The same through a `bridge://` device of palisade-fence.
    let identity = BridgeIdentity {
        ca_pem: ca.pem().into_bytes(),
        cert_pem: client_cert.into_bytes(),
        key_pem: palisade_fence::Secret::new(client_key),
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(60),
    };
    let device = |token: u64| {
        let Target::Bridge(t) =
            Target::parse(&format!("bridge://127.0.0.1:{}/m0", bridge.port)).unwrap()
        else {
            panic!("a bridge target")
        };
        let options = DeviceOptions {
            fencing_token: Some(token),
            ..Default::default()
        };
        BridgeDevice::new(t, &identity, options).unwrap()
    };
    let r = rt
        .block_on(device(5).block_storage())
        .expect("verified block");
    assert_eq!(r.evidence["devices"][0]["result"], "blocked_verified");
    assert!(rt.block_on(fw.status(&node)).unwrap().blocked);
    assert_eq!(
        rt.block_on(device(5).storage_status()).unwrap(),
        StorageState::Blocked
    );
    let e = rt.block_on(device(4).unblock_storage()).unwrap_err();
    assert_eq!(e.kind(), "stale_fencing_token", "{e}");
    assert!(rt.block_on(fw.status(&node)).unwrap().blocked);
    rt.block_on(device(5).unblock_storage())
        .expect("verified unblock");
    assert!(!rt.block_on(fw.status(&node)).unwrap().blocked);

    drop(bridge);
    drop(storage);
}
