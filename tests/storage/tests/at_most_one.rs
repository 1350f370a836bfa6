//! The at-most-one proof on loopback, with the real binaries: server, writers (one per pod
//! incarnation, each from its own loopback address standing for a node) and checker.
//!
//! - Negative control: an old writer that keeps running while its replacement writes (what
//!   a force delete without fencing allows) is reported as split-brain.
//! - With the old node blocked at the storage firewall first, the same sequence passes.
//! - Killing the server with SIGKILL while writers run loses no acknowledged write.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::*;
use palisade_labstore::checker::{analyze, entries_from};
use palisade_labstore::record::parse_ack_log;
use palisade_storagefw::NodeRef;
use palisade_test_support::eventually_async;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn init() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

const WAIT: Duration = Duration::from_secs(60);

async fn wait_acks(path: &std::path::Path, at_least: usize) {
    eventually_async(
        &format!("{} acks in {}", at_least, path.display()),
        WAIT,
        || async { (ack_count(path) >= at_least).then_some(()) },
    )
    .await;
}

/// Runs old writer A on node-a, then replacement B on node-b; fences node-a first when
/// `fence` is set. Returns the checker's exit code and output.
async fn handover(fence: bool) -> (i32, String, usize, usize) {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let srv = ServerProc::start_default(&pki, state.path(), &["web-0"]);
    let admin = srv.admin_client(&pki);
    admin
        .grant("web-0", "node-a", &[ip("127.0.0.61")])
        .await
        .unwrap();
    admin
        .grant("web-0", "node-b", &[ip("127.0.0.62")])
        .await
        .unwrap();
    let logs = tempfile::tempdir().unwrap();
    let (ack_a, ack_b) = (logs.path().join("a.acks"), logs.path().join("b.acks"));

    let mut a = spawn_writer(
        srv.data,
        "web-0",
        "uid-a",
        "node-a",
        "127.0.0.61",
        &ack_a,
        5,
    );
    wait_acks(&ack_a, 20).await;
    let mut a_acks_at_fence = None;
    if fence {
        srv.agent(&pki)
            .block(&NodeRef::new("node-a", vec![]).unwrap())
            .await
            .unwrap();
        a_acks_at_fence = Some(ack_count(&ack_a));
    }
    // The replacement starts while the old writer is still running.
    let mut b = spawn_writer(
        srv.data,
        "web-0",
        "uid-b",
        "node-b",
        "127.0.0.62",
        &ack_b,
        5,
    );
    wait_acks(&ack_b, 30).await;
    if !fence {
        // Let the old writer demonstrably keep writing after the replacement started.
        let now = ack_count(&ack_a);
        wait_acks(&ack_a, now + 10).await;
    }
    stop(&mut a);
    stop(&mut b);
    if let Some(n) = a_acks_at_fence {
        assert_eq!(ack_count(&ack_a), n, "fenced writer got acknowledgements");
    }
    let (code, out) = run_checker(&volume_file(state.path(), "web-0"), &[&ack_a, &ack_b]);
    (code, out, ack_count(&ack_a), ack_count(&ack_b))
}

#[tokio::test]
async fn unfenced_old_writer_beside_its_replacement_is_reported_as_split_brain() {
    let (code, out, a, b) = handover(false).await;
    assert!(a > 0 && b > 0);
    assert_eq!(code, 1, "checker must fail:\n{out}");
    assert!(out.contains("SPLIT-BRAIN"), "{out}");
    assert!(out.contains("VERDICT: FAIL"), "{out}");
}

#[tokio::test]
async fn fencing_the_old_node_first_gives_a_clean_verdict() {
    let (code, out, a, b) = handover(true).await;
    assert!(a > 0 && b > 0);
    assert_eq!(code, 0, "checker must pass:\n{out}");
    assert!(out.contains("VERDICT: PASS"), "{out}");
    assert!(
        out.contains("handover uid-a (node-a) -> uid-b (node-b)"),
        "{out}"
    );
}

#[tokio::test]
async fn sigkill_of_the_server_mid_write_loses_no_acknowledged_write() {
    init();
    let pki = Pki::new();
    let state = tempfile::tempdir().unwrap();
    let vols = ["vol-d0", "vol-d1", "vol-d2"];
    let opts = ServerOpts::usual(&pki, state.path(), &vols);
    let mut srv = ServerProc::start(&opts);
    let admin = srv.admin_client(&pki);
    let logs = tempfile::tempdir().unwrap();
    let mut writers = Vec::new();
    let mut ack_logs = Vec::new();
    for (i, v) in vols.iter().enumerate() {
        let src = format!("127.0.0.{}", 71 + i);
        admin.grant(v, &format!("n{i}"), &[ip(&src)]).await.unwrap();
        let log = logs.path().join(format!("{v}.acks"));
        writers.push(spawn_writer(
            srv.data,
            v,
            &format!("uid-{i}"),
            &format!("n{i}"),
            &src,
            &log,
            1,
        ));
        ack_logs.push(log);
    }
    for _round in 0..3 {
        for log in &ack_logs {
            let now = ack_count(log);
            wait_acks(log, now + 30).await;
        }
        srv.sigkill();
        srv = ServerProc::start(&opts);
    }
    for log in &ack_logs {
        let now = ack_count(log);
        wait_acks(log, now + 10).await;
    }
    for w in &mut writers {
        stop(w);
    }
    drop(srv);
    for (v, log) in vols.iter().zip(&ack_logs) {
        let records = palisade_labstore::volume::read_file(&volume_file(state.path(), v)).unwrap();
        let acks = parse_ack_log(&std::fs::read_to_string(log).unwrap()).unwrap();
        assert!(acks.len() >= 100, "{v}: only {} acks", acks.len());
        let report = analyze(&entries_from(&records), &acks);
        assert!(report.lost.is_empty(), "{v}:\n{}", report.render());
        let (code, out) = run_checker(&volume_file(state.path(), v), &[log]);
        assert_eq!(code, 0, "{out}");
    }
}
