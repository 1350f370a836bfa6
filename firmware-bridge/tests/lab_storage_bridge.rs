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
use palisade_fence::bridge::wire::StorageHold;
use palisade_fence::bridge::{
    BridgeClient, BridgeDevice, BridgeIdentity, ClientError, ClientSettings, STORAGE_STILL_HELD,
};
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

/// A lab storage server with a bridge in front of it (target `m0`, node `node-m0` at the
/// storage), a client of the bridge and a direct agent for checking the storage out of band.
struct Lab {
    // Fields drop in order: the bridge before the storage, both before the directory.
    bridge: BridgeProcess,
    _storage: StorageServer,
    client: BridgeClient,
    identity: BridgeIdentity,
    fw: StorageFirewall,
    node: NodeRef,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Lab {
    fn start() -> Self {
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
             [[policy]]\nclient = \"cn:palisade-controller\"\ntargets = [\"*\"]\nread_audit = true\n\
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
        let identity = BridgeIdentity {
            ca_pem: ca.pem().into_bytes(),
            cert_pem: client_cert.into_bytes(),
            key_pem: palisade_fence::Secret::new(client_key),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            trace_context: None,
        };
        let fw = direct(&ca, storage.admin_port);
        let node = NodeRef::new("node-m0", vec![IpAddr::from([10, 213, 0, 11])]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Lab {
            bridge,
            _storage: storage,
            client,
            identity,
            fw,
            node,
            rt,
            _dir: dir,
        }
    }

    /// A `bridge://` device of palisade-fence for `m0`, acting under `token`.
    fn device(&self, token: u64) -> BridgeDevice {
        let Target::Bridge(t) =
            Target::parse(&format!("bridge://127.0.0.1:{}/m0", self.bridge.port)).unwrap()
        else {
            panic!("a bridge target")
        };
        let options = DeviceOptions {
            fencing_token: Some(token),
            ..Default::default()
        };
        BridgeDevice::new(t, &self.identity, options).unwrap()
    }

    /// What the storage itself says of `node-m0`: blocked, and the holds on it.
    fn storage_says(&self) -> (bool, Vec<String>) {
        let s = self.rt.block_on(self.fw.status(&self.node)).unwrap();
        let holds = serde_json::from_value(s.raw["holds"].clone()).unwrap_or_default();
        (s.blocked, holds)
    }

    /// The bridge's audit records of `m0`, oldest first.
    fn audit(&self) -> Vec<palisade_fence::bridge::AuditRecord> {
        self.rt
            .block_on(self.client.audit(Some("m0"), 100))
            .unwrap()
    }
}

#[test]
fn storage_block_status_and_unblock_go_through_the_bridge_to_the_real_storage_server() {
    let lab = Lab::start();
    let (client, fw, node, rt) = (&lab.client, &lab.fw, &lab.node, &lab.rt);

    let s = rt.block_on(client.storage_status("m0")).unwrap();
    assert_eq!(s.storage_state(), Some(StorageState::Unblocked), "{s:?}");
    assert!(!rt.block_on(fw.status(node)).unwrap().blocked);

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
        rt.block_on(fw.status(node)).unwrap().blocked,
        "the storage itself reports the node blocked"
    );
    let s = rt.block_on(client.storage_status("m0")).unwrap();
    assert_eq!(s.storage_state(), Some(StorageState::Blocked));

    // A stale token cannot unblock (unfence) the node.
    let e = rt
        .block_on(client.storage("m0", StorageAction::Unblock, 3, "unblock-old", None))
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(rt.block_on(fw.status(node)).unwrap().blocked);

    let u = rt
        .block_on(client.storage("m0", StorageAction::Unblock, 4, "unblock-m0-1", None))
        .unwrap();
    assert_eq!(u.storage_state(), Some(StorageState::Unblocked));
    assert_eq!(u.evidence["devices"][0]["result"], "unblocked_verified");
    assert!(!rt.block_on(fw.status(node)).unwrap().blocked);

    let m = rt.block_on(client.monitor("m0")).unwrap();
    assert_eq!(
        m.health(),
        Some(palisade_fence::bridge::wire::Health::Ok),
        "{m:?}"
    );

    // The same through a `bridge://` device of palisade-fence.
    let device = |token: u64| lab.device(token);
    let r = rt
        .block_on(device(5).block_storage())
        .expect("verified block");
    assert_eq!(r.evidence["devices"][0]["result"], "blocked_verified");
    assert!(rt.block_on(fw.status(node)).unwrap().blocked);
    assert_eq!(
        rt.block_on(device(5).storage_status()).unwrap(),
        StorageState::Blocked
    );
    let e = rt.block_on(device(4).unblock_storage()).unwrap_err();
    assert_eq!(e.kind(), "stale_fencing_token", "{e}");
    assert!(rt.block_on(fw.status(node)).unwrap().blocked);
    rt.block_on(device(5).unblock_storage())
        .expect("verified unblock");
    assert!(!rt.block_on(fw.status(node)).unwrap().blocked);

    // Without a hold (an older controller) the bridge acts node-wide, and its audit says so.
    let unblock = lab.audit().pop().expect("audit records");
    assert_eq!(
        (
            unblock.action.as_str(),
            unblock.result.as_str(),
            unblock.hold
        ),
        ("storage.unblock", "ok", None)
    );
    let message = unblock.message.unwrap_or_default();
    assert!(message.contains("no hold"), "{message}");
}

#[test]
fn a_fences_unblock_through_the_bridge_lifts_only_its_own_hold_and_is_not_reported_unblocked() {
    let lab = Lab::start();
    let rt = &lab.rt;
    let (a, b) = (
        StorageHold::new("palisade-fence-a").unwrap(),
        StorageHold::new("palisade-fence-b").unwrap(),
    );
    let storage = |action, key: &str, hold: &StorageHold| {
        rt.block_on(lab.device(4).storage(action, key, Some(hold)))
    };

    // Two fences block m0, each under its own hold.
    let r = storage(StorageAction::Block, "block-a", &a).expect("fence a verified blocked");
    assert_eq!(r.evidence["devices"][0]["hold"], "palisade-fence-a");
    storage(StorageAction::Block, "block-b", &b).expect("fence b verified blocked");
    let both = vec![a.to_string(), b.to_string()];
    assert_eq!(lab.storage_says(), (true, both));

    // Fence a's unblock lifts its hold only: m0 stays blocked under b, and the bridge says so.
    let e = storage(StorageAction::Unblock, "unblock-a", &a).unwrap_err();
    assert_eq!(e.kind(), "device_refused", "{e}");
    assert!(e.to_string().contains(STORAGE_STILL_HELD), "{e}");
    assert_eq!(lab.storage_says(), (true, vec![b.to_string()]));
    let s = rt.block_on(lab.client.storage_status("m0")).unwrap();
    assert_eq!(s.storage_state(), Some(StorageState::Blocked));
    // Its recorded answer (a retry under the same key) is the same refusal, with evidence.
    let retry = rt.block_on(lab.client.storage_with_hold(
        "m0",
        StorageAction::Unblock,
        4,
        "unblock-a",
        None,
        Some(&a),
    ));
    let Err(ClientError::Api {
        status, code, body, ..
    }) = retry
    else {
        panic!("a held unblock is refused: {retry:?}")
    };
    assert_eq!((status, code.as_str()), (409, STORAGE_STILL_HELD), "{body}");
    assert_eq!(
        body["evidence"]["devices"][0]["result"], "still_held",
        "{body}"
    );
    assert_ne!(body["state"], "unblocked", "{body}");
    // The key names one request: under another hold it is refused, not replayed.
    let reused = rt
        .block_on(lab.client.storage_with_hold(
            "m0",
            StorageAction::Unblock,
            4,
            "unblock-a",
            None,
            Some(&b),
        ))
        .unwrap_err();
    assert_eq!(reused.status(), Some(422), "{reused}");
    assert_eq!(lab.storage_says(), (true, vec![b.to_string()]));
    let held = lab
        .audit()
        .into_iter()
        .find(|r| r.idempotency_key.as_deref() == Some("unblock-a") && r.result != "replayed")
        .expect("the held unblock is audited");
    assert_eq!(
        (held.action.as_str(), held.result.as_str(), held.status),
        ("storage.unblock", "still_held", 409)
    );
    assert_eq!(held.hold.as_deref(), Some("palisade-fence-a"));
    let message = held.message.unwrap_or_default();
    assert!(message.contains("still"), "{message}");

    // Fence b's unblock lifts the last hold: m0 is unblocked, verified.
    let r = storage(StorageAction::Unblock, "unblock-b", &b).expect("verified unblock");
    assert_eq!(r.storage_state(), Some(StorageState::Unblocked));
    assert_eq!(r.evidence["devices"][0]["result"], "unblocked_verified");
    assert_eq!(lab.storage_says(), (false, vec![]));
    let lifted = lab.audit().pop().expect("audit records");
    assert_eq!(
        (lifted.result.as_str(), lifted.hold.as_deref()),
        ("ok", Some("palisade-fence-b"))
    );
}

#[test]
fn a_malformed_hold_is_refused_and_changes_nothing() {
    let lab = Lab::start();
    let rt = &lab.rt;
    let post = |action: &str, key: &str, token: &str, body: &str| {
        rt.block_on(lab.client.raw(
            reqwest::Method::POST,
            &format!("v1/targets/m0/storage/{action}"),
            &[("Idempotency-Key", key), ("Fencing-Token", token)],
            body.as_bytes().to_vec(),
        ))
        .unwrap()
    };
    let refused = |(status, text): (u16, String)| {
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (status, v["error"].as_str()),
            (400, Some("invalid_hold")),
            "{text}"
        );
        assert!(v["message"].as_str().unwrap().contains("hold"), "{text}");
    };

    // Not blocked, and a block under a malformed hold does not block (nor raise the floor).
    refused(post("block", "k-bad", "9", r#"{"hold":"Palisade_A"}"#));
    refused(post("block", "k-bad", "9", r#"{"hold":""}"#));
    refused(post("block", "k-bad", "9", r#"{"hold":7}"#));
    assert_eq!(lab.storage_says(), (false, vec![]));

    // Blocked under a good hold, an unblock under a malformed one does not unblock.
    let (status, text) = post("block", "k-good", "4", r#"{"hold":"palisade-fence-a"}"#);
    assert_eq!(status, 200, "{text}");
    refused(post(
        "unblock",
        "k-bad2",
        "4",
        r#"{"hold":"palisade-fence-a/.."}"#,
    ));
    refused(post(
        "unblock",
        "k-bad2",
        "4",
        r#"{"hold":"PALISADE-FENCE-A"}"#,
    ));
    assert_eq!(
        lab.storage_says(),
        (true, vec!["palisade-fence-a".to_string()])
    );
    // Unknown fields are still refused, hold or not.
    let (status, text) = post(
        "unblock",
        "k-bad3",
        "4",
        r#"{"hold":"palisade-fence-a","force":true}"#,
    );
    assert_eq!(status, 400, "{text}");
    assert!(lab.storage_says().0);

    // Neither the refused keys nor the refused tokens were recorded: token 4 still acts, and
    // the refused key is free for a well-formed request.
    let (status, text) = post("unblock", "k-bad2", "4", r#"{"hold":"palisade-fence-a"}"#);
    assert_eq!(status, 200, "{text}");
    assert_eq!(lab.storage_says(), (false, vec![]));
    let audited: Vec<_> = lab
        .audit()
        .into_iter()
        .map(|r| (r.idempotency_key.unwrap_or_default(), r.result))
        .collect();
    assert_eq!(
        audited,
        vec![
            ("k-good".to_string(), "ok".to_string()),
            ("k-bad2".to_string(), "ok".to_string())
        ],
        "refused requests did nothing to audit"
    );
}
