//! Secrets never appear in the tracing output or the audit log, whatever happens.
//! (One test in this binary: it installs the global tracing subscriber at TRACE.)

mod common;

use std::io::Write;
use std::sync::Arc;

use common::{Harness, BMC_PASSWORD, PDU_COMMUNITY};
use palisade_bridge::executor::{PowerAction, StorageAction};
use parking_lot::Mutex;

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn secrets_never_reach_logs_or_audit() {
    let buf = Buf::default();
    let w = buf.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || w.clone())
        .init();
    let h = Harness::start("").await;
    h.exec.fail_power("m1", "device failed");
    tracing::debug!(bridge = ?h.bridge, "bridge state");
    let inv = palisade_bridge::config::Inventory::load(
        &palisade_bridge::config::FileConfig::load(&h.config).unwrap(),
    )
    .unwrap();
    tracing::debug!(inventory = ?inv, "inventory (Debug must redact)");
    let c = h.client("palisade-controller");
    c.power("m0", PowerAction::Off, 1, "s1", Some("test"))
        .await
        .unwrap();
    c.power("m0", PowerAction::Off, 1, "s1", None)
        .await
        .unwrap();
    let _ = c.power("m0", PowerAction::On, 0, "s2", None).await;
    let _ = c.power("m1", PowerAction::Off, 1, "s3", None).await;
    c.storage("m0", StorageAction::Block, 2, "s4", None)
        .await
        .unwrap();
    let _ = h
        .client("m0-only")
        .power("m1", PowerAction::Off, 3, "s5", None)
        .await;
    h.bridge.reload().unwrap();

    let logs = String::from_utf8(buf.0.lock().clone()).unwrap();
    let audit = std::fs::read_to_string(h.audit_path()).unwrap();
    let state = std::fs::read_to_string(h.dir.path().join("state/state.jsonl")).unwrap();
    assert!(
        logs.contains("acting") && logs.contains("<redacted>"),
        "the test must see real log output: {logs}"
    );
    assert!(audit.lines().count() >= 5, "{audit}");
    for secret in [BMC_PASSWORD, PDU_COMMUNITY] {
        assert!(!logs.contains(secret), "secret in tracing output");
        assert!(!audit.contains(secret), "secret in audit log");
        assert!(!state.contains(secret), "secret in state journal");
    }
}
