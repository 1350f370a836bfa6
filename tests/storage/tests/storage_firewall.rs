//! The storage firewall agent against the real `palisade-storage-server` binary on loopback:
//! verified block/unblock/status, authentication, CA pinning, durability of blocks, cutting a
//! fenced client's connection, and clean errors on bad input.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::*;
use palisade_labstore::client::DataClient;
use palisade_labstore::error::ClientError;
use palisade_labstore::framing::FrameRead;
use palisade_labstore::pki::TestCa;
use palisade_labstore::protocol::{ErrorCode, Response, MAX_FRAME, MAX_RECORD};
use palisade_storagefw::{NodeRef, StorageFirewall, StorageFwError};
use palisade_test_support::eventually_async;
use tokio::io::AsyncReadExt;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn init() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[tokio::test]
async fn block_unblock_and_status_are_verified() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let srv = ServerProc::start_default(&pki, state.path(), &["vol-a"]);
    let fw = srv.agent(&pki);
    let node = NodeRef::new("m0", vec![ip("127.0.0.11")]).unwrap();

    assert!(!fw.status(&node).await.unwrap().blocked);
    let evidence = fw.block(&node).await.unwrap();
    assert_eq!(evidence.node(), "m0");
    assert_eq!(evidence.status()["blocked"], true);
    assert_eq!(evidence.status()["blocked_addresses"][0], "127.0.0.11");
    let st = fw.status(&node).await.unwrap();
    assert!(st.blocked);
    // Blocking again is idempotent.
    fw.block(&node).await.unwrap();
    // The block stays until an explicit unfence, which consumes the evidence.
    let mut access = palisade_storagefw::WriteAccess::fence(evidence.clone());
    assert!(fw.status(&node).await.unwrap().blocked);
    let proof = fw.unfence(evidence).await.unwrap();
    assert!(access.unfence(&proof));
    assert!(access.may_write());
    assert!(!fw.status(&node).await.unwrap().blocked);
    // Unblock of a node that is not blocked is idempotent and verified too.
    fw.unblock(&node).await.unwrap();
}

#[tokio::test]
async fn block_of_a_node_without_known_addresses_is_refused_not_faked() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let srv = ServerProc::start_default(&pki, state.path(), &[]);
    let fw = srv.agent(&pki);
    let err = fw
        .block(&NodeRef::new("ghost", vec![]).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(err, StorageFwError::Http { status: 400, .. }),
        "{err}"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn wrong_or_missing_token_is_refused_as_terminal() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let srv = ServerProc::start_default(&pki, state.path(), &[]);
    let node = NodeRef::new("m0", vec![ip("127.0.0.11")]).unwrap();
    for token in [Some("wrong-token"), None] {
        let fw = StorageFirewall::new(srv.agent_config(&pki.ca.cert_pem(), token)).unwrap();
        let err = fw.block(&node).await.unwrap_err();
        assert!(
            matches!(err, StorageFwError::Http { status: 401, .. }),
            "{err}"
        );
        assert!(!err.is_retryable());
    }
    // Nothing was blocked by the refused requests.
    assert!(!srv.agent(&pki).status(&node).await.unwrap().blocked);
}

#[tokio::test]
async fn server_certificate_from_another_ca_is_refused() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let srv = ServerProc::start_default(&pki, state.path(), &[]);
    let other = TestCa::new("some other CA").unwrap();
    let fw = StorageFirewall::new(srv.agent_config(&other.cert_pem(), Some(TOKEN))).unwrap();
    let node = NodeRef::new("m0", vec![ip("127.0.0.11")]).unwrap();
    let err = fw.block(&node).await.unwrap_err();
    assert!(matches!(err, StorageFwError::Transport { .. }), "{err}");
    assert!(!srv.agent(&pki).status(&node).await.unwrap().blocked);
}

#[tokio::test]
async fn client_certificate_authenticates_without_a_token() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let srv = ServerProc::start(&ServerOpts {
        pki: &pki,
        state_dir: state.path(),
        data_port: free_port(),
        admin_port: free_port(),
        client_ca: true,
        token: false,
        volumes: &[],
    });
    let node = NodeRef::new("m0", vec![ip("127.0.0.11")]).unwrap();
    let client = pki.ca.issue_client("palisade-controller").unwrap();
    let mut cfg = srv.agent_config(&pki.ca.cert_pem(), None);
    cfg.client_identity = Some((
        client.cert_pem.into_bytes(),
        palisade_storagefw::Secret::new(client.key_pem),
    ));
    let fw = StorageFirewall::new(cfg).unwrap();
    fw.block(&node).await.unwrap();
    // Without the certificate (and without a token) the same request is refused.
    let anon = StorageFirewall::new(srv.agent_config(&pki.ca.cert_pem(), None)).unwrap();
    let err = anon.status(&node).await.unwrap_err();
    assert!(
        matches!(err, StorageFwError::Http { status: 401, .. }),
        "{err}"
    );
    // A client certificate from another CA is rejected in the handshake.
    let other = TestCa::new("rogue CA")
        .unwrap()
        .issue_client("rogue")
        .unwrap();
    let mut cfg = srv.agent_config(&pki.ca.cert_pem(), None);
    cfg.client_identity = Some((
        other.cert_pem.into_bytes(),
        palisade_storagefw::Secret::new(other.key_pem),
    ));
    let rogue = StorageFirewall::new(cfg).unwrap();
    assert!(rogue.status(&node).await.is_err());
}

#[tokio::test]
async fn server_restart_keeps_blocks_and_grants_and_unblocking_restores_writes() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let (data_port, admin_port) = (free_port(), free_port());
    let opts = ServerOpts {
        pki: &pki,
        state_dir: state.path(),
        data_port,
        admin_port,
        client_ca: false,
        token: true,
        volumes: &["vol-a"],
    };
    let mut srv = ServerProc::start(&opts);
    let admin = srv.admin_client(&pki);
    admin
        .grant("vol-a", "m0", &[ip("127.0.0.11")])
        .await
        .unwrap();
    let mut c = DataClient::connect(srv.data, Some(ip("127.0.0.11")))
        .await
        .unwrap();
    assert_eq!(c.append("vol-a", b"before".to_vec()).await.unwrap(), 0);
    let node = NodeRef::new("m0", vec![]).unwrap();
    srv.agent(&pki).block(&node).await.unwrap();

    srv.sigkill();
    let srv = ServerProc::start(&opts);
    let fw = srv.agent(&pki);
    assert!(
        fw.status(&node).await.unwrap().blocked,
        "block lost in restart"
    );
    let mut c = DataClient::connect(srv.data, Some(ip("127.0.0.11"))).await;
    // A fenced client is cut right after connecting, or refused on its first write.
    if let Ok(c) = c.as_mut() {
        match c.append("vol-a", b"while fenced".to_vec()).await {
            Err(ClientError::Closed { .. }) | Err(ClientError::Io { .. }) => {}
            Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::Blocked),
            other => panic!("fenced write was not refused: {other:?}"),
        }
    }
    fw.unblock(&node).await.unwrap();
    let mut c = DataClient::connect(srv.data, Some(ip("127.0.0.11")))
        .await
        .unwrap();
    assert_eq!(c.append("vol-a", b"after".to_vec()).await.unwrap(), 1);
    let all = c.read_all("vol-a").await.unwrap();
    let payloads: Vec<&[u8]> = all.iter().map(|r| r.payload.as_slice()).collect();
    assert_eq!(payloads, [b"before".as_slice(), b"after".as_slice()]);
    // The grant survived the restart too.
    let st = admin.status().await.unwrap();
    assert_eq!(st["grants"]["vol-a"]["m0"][0], "127.0.0.11");
}

#[tokio::test]
async fn blocking_a_node_cuts_its_open_connections_and_refuses_its_writes() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let srv = ServerProc::start_default(&pki, state.path(), &["vol-a"]);
    let admin = srv.admin_client(&pki);
    admin
        .grant("vol-a", "m0", &[ip("127.0.0.11")])
        .await
        .unwrap();
    admin
        .grant("vol-a", "m1", &[ip("127.0.0.12")])
        .await
        .unwrap();

    // An idle raw connection from m0: the server must close it on block.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.11:0".parse().unwrap()).unwrap();
    let mut idle = sock.connect(srv.data).await.unwrap();
    let mut m0 = DataClient::connect(srv.data, Some(ip("127.0.0.11")))
        .await
        .unwrap();
    let mut m1 = DataClient::connect(srv.data, Some(ip("127.0.0.12")))
        .await
        .unwrap();
    m0.append("vol-a", b"m0".to_vec()).await.unwrap();
    eventually_async(
        "server registered both connections",
        Duration::from_secs(10),
        || async {
            let st = admin.status().await.ok()?;
            (st["connections"].as_u64()? >= 3).then_some(())
        },
    )
    .await;

    srv.agent(&pki)
        .block(&NodeRef::new("m0", vec![]).unwrap())
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf))
        .await
        .expect("fenced connection was not cut")
        .unwrap_or(0);
    assert_eq!(n, 0, "expected EOF on the fenced connection");
    assert!(m0.append("vol-a", b"m0 again".to_vec()).await.is_err());
    // A new connection from the fenced node is refused too.
    if let Ok(mut again) = DataClient::connect(srv.data, Some(ip("127.0.0.11"))).await {
        assert!(again.append("vol-a", b"m0 new".to_vec()).await.is_err());
    }
    // The other node is unaffected.
    assert_eq!(m1.append("vol-a", b"m1".to_vec()).await.unwrap(), 1);
}

#[tokio::test]
async fn malformed_unknown_and_oversized_requests_get_clean_errors() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let srv = ServerProc::start_default(&pki, state.path(), &["vol-a"]);
    let admin = srv.admin_client(&pki);
    admin
        .grant("vol-a", "m0", &[ip("127.0.0.11")])
        .await
        .unwrap();

    // Admin API.
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(
            palisade_telemetry::tls::pinned(pki.ca.cert_pem().as_bytes()).unwrap(),
        )
        .no_proxy()
        .build()
        .unwrap();
    let base = format!("https://{}", srv.admin);
    let send = |method: reqwest::Method, path: &str, body: &'static str| {
        http.request(method, format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .body(body)
            .send()
    };
    for (method, path, body, want) in [
        (
            reqwest::Method::POST,
            "/v1/nodes/m0/block",
            "{not json",
            400,
        ),
        (
            reqwest::Method::POST,
            "/v1/nodes/m0/block",
            r#"{"addresses":["nope"]}"#,
            400,
        ),
        (
            reqwest::Method::POST,
            "/v1/nodes/m0/block",
            r#"{"adresses":[]}"#,
            400,
        ),
        (reqwest::Method::POST, "/v1/nodes/Bad_Name/block", "{}", 400),
        (
            reqwest::Method::PUT,
            "/v1/volumes/nope/grants/m0",
            r#"{"addresses":["127.0.0.1"]}"#,
            404,
        ),
        (
            reqwest::Method::PUT,
            "/v1/volumes/vol-a/grants/m0",
            r#"{"addresses":[]}"#,
            400,
        ),
        (
            reqwest::Method::PUT,
            "/v1/volumes/BAD!/grants/m0",
            "{}",
            400,
        ),
        (reqwest::Method::GET, "/v1/volumes/nope", "", 404),
        (reqwest::Method::GET, "/v1/nothing-here", "", 404),
    ] {
        let resp = send(method.clone(), path, body).await.unwrap();
        assert_eq!(resp.status().as_u16(), want, "{method} {path} {body}");
        let j: serde_json::Value = resp.json().await.unwrap();
        assert!(j["error"].is_string(), "{method} {path}: {j}");
    }
    let big = "x".repeat(100 << 10);
    let resp = http
        .post(format!("{base}/v1/nodes/m0/block"))
        .bearer_auth(TOKEN)
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);

    // Data path.
    let mut c = DataClient::connect(srv.data, Some(ip("127.0.0.11")))
        .await
        .unwrap();
    match c.append("nope", b"x".to_vec()).await {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::UnknownVolume),
        other => panic!("{other:?}"),
    }
    match c.read("nope", 0, 10).await {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::UnknownVolume),
        other => panic!("{other:?}"),
    }
    match c.append("vol-a", vec![0u8; MAX_RECORD + 1]).await {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::TooLarge),
        other => panic!("{other:?}"),
    }
    // Unknown opcode: a Malformed error, and the connection stays usable.
    match c.raw(&[0, 0, 0, 1, 9]).await.unwrap() {
        FrameRead::Frame(b) => assert!(matches!(
            Response::decode(&b).unwrap(),
            Response::Error {
                code: ErrorCode::Malformed,
                ..
            }
        )),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.append("vol-a", b"still fine".to_vec()).await.unwrap(), 0);
    // A frame larger than the limit: TooLarge, then the server closes the stream.
    let len = (MAX_FRAME as u32 + 1).to_be_bytes();
    match c.raw(&len).await.unwrap() {
        FrameRead::Frame(b) => assert!(matches!(
            Response::decode(&b).unwrap(),
            Response::Error {
                code: ErrorCode::TooLarge,
                ..
            }
        )),
        other => panic!("{other:?}"),
    }
    assert!(c.append("vol-a", b"x".to_vec()).await.is_err());
}

/// A deposed controller's late unblock: fence A blocked m0 and later lifted its hold; fence B
/// blocked m0 again. The old controller, frozen after its last leadership check, now delivers
/// fence A's unblock. It lifts A's hold only (already gone): m0 stays blocked for B, its
/// writes refused, across a server restart; B's own unblock opens it. The node-wide unblock
/// (no hold: the operator's) lifts every hold.
#[tokio::test]
async fn a_late_unblock_of_an_older_fence_leaves_a_newer_fence_block_in_place() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let opts = ServerOpts::usual(&pki, state.path(), &["vol-a"]);
    let mut srv = ServerProc::start(&opts);
    srv.admin_client(&pki)
        .grant("vol-a", "m0", &[ip("127.0.0.11")])
        .await
        .unwrap();
    let fw = srv.agent(&pki);
    let m0 = || NodeRef::new("m0", vec![]).unwrap();
    let fence_a = m0().with_hold("palisade-fence-a").unwrap();
    let fence_b = m0().with_hold("palisade-fence-b").unwrap();

    fw.block(&fence_a).await.unwrap();
    let late = fw.block(&fence_a).await.unwrap(); // what the frozen leader still holds
    fw.unblock(&fence_a).await.unwrap();
    let b = fw.block(&fence_b).await.unwrap();
    assert_eq!(b.status()["holds"], serde_json::json!(["palisade-fence-b"]));

    // The late unblock: refused as evidence (m0 is still blocked), and it changed nothing.
    let err = fw.unfence(late).await.unwrap_err();
    assert!(err.to_string().contains("not confirmed"), "{err}");
    let st = fw.status(&m0()).await.unwrap();
    assert!(st.blocked, "the newer fence's block was lifted");
    let write = async {
        let mut c = DataClient::connect(srv.data, Some(ip("127.0.0.11"))).await?;
        c.append("vol-a", b"old writer".to_vec()).await
    };
    match write.await {
        Err(ClientError::Closed { .. }) | Err(ClientError::Io { .. }) => {}
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::Blocked),
        other => panic!("a write from the fenced node was not refused: {other:?}"),
    }

    // The holds are durable.
    srv.sigkill();
    let srv = ServerProc::start(&opts);
    let fw = srv.agent(&pki);
    assert!(
        fw.status(&m0()).await.unwrap().blocked,
        "block lost in restart"
    );
    fw.unblock(&fence_a).await.unwrap_err();
    assert!(fw.status(&m0()).await.unwrap().blocked);

    // Two holds at once; fence B's unblock leaves C's; the operator's unblock lifts all.
    let fence_c = m0().with_hold("palisade-fence-c").unwrap();
    fw.block(&fence_c).await.unwrap();
    fw.unblock(&fence_b).await.unwrap_err();
    assert!(fw.status(&m0()).await.unwrap().blocked);
    fw.block(&fence_b).await.unwrap();
    fw.unblock(&m0()).await.unwrap();
    let st = fw.status(&m0()).await.unwrap();
    assert!(!st.blocked);
    let mut c = DataClient::connect(srv.data, Some(ip("127.0.0.11")))
        .await
        .unwrap();
    assert_eq!(c.append("vol-a", b"after".to_vec()).await.unwrap(), 0);
}
