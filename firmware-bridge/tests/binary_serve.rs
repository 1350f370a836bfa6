//! The `firmware-bridge` binary end to end: serves mTLS, reloads policy on SIGHUP without
//! dropping its connections, keeps the token floor and audit log across a restart, stops
//! cleanly on SIGTERM, and never logs a secret even at TRACE. Its traces, exported over OTLP,
//! name each action's target, client, token and answer, and carry no secret either.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{write_config, Ca, BMC_PASSWORD, PDU_COMMUNITY, PDU_ENV};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_bridge::executor::PowerAction;
use palisade_fence::bridge::{BridgeClient, ClientSettings};
use palisade_test_support::eventually_async;
use parking_lot::Mutex;

struct Running {
    child: Child,
    port: u16,
    log: Arc<Mutex<String>>,
}

/// The trace context a traced request carries (W3C: version, trace ID, parent span ID, sampled).
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn spawn(config: &std::path::Path, otlp: &str) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_firmware-bridge"))
        .arg("--config")
        .arg(config)
        .arg("--otlp-endpoint")
        .arg(otlp)
        .arg("--log-format")
        .arg("json")
        .env("RUST_LOG", "trace")
        .env(PDU_ENV, PDU_COMMUNITY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let log2 = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if let Some(l) = v["fields"]["listen"].as_str() {
                    let _ = tx.send(l.rsplit(':').next().unwrap().parse::<u16>().unwrap());
                }
            }
            let mut g = log2.lock();
            g.push_str(&line);
            g.push('\n');
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("bridge did not start: {}", log.lock()));
    Running { child, port, log }
}

impl Running {
    fn client(&self, ca: &Ca, cn: &str) -> BridgeClient {
        self.client_traced(ca, cn, None)
    }

    /// A client whose requests carry the trace context `trace` gives.
    fn client_traced(
        &self,
        ca: &Ca,
        cn: &str,
        trace: Option<palisade_fence::bridge::TraceContext>,
    ) -> BridgeClient {
        let (c, k) = ca.client(cn);
        let mut s = ClientSettings::new(
            format!("https://127.0.0.1:{}/", self.port).parse().unwrap(),
            ca.pem().into_bytes(),
            c.into_bytes(),
            k.into_bytes(),
        );
        s.request_timeout = Duration::from_secs(60);
        s.trace_context = trace;
        BridgeClient::new(&s).unwrap()
    }

    fn stop(mut self) -> String {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "clean exit on SIGTERM: {status}");
        std::thread::sleep(Duration::from_millis(100)); // let the reader thread drain the pipe
        let log = self.log.lock().clone();
        log
    }
}

#[tokio::test]
async fn binary_reloads_on_sighup_and_keeps_state_across_restart() {
    common::install_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("bin-ca");
    let config = write_config(dir.path(), &ca, &ca.server(), "");
    let collector = palisade_telemetry::receiver::Receiver::start().unwrap();
    let bridge = spawn(&config, &collector.endpoint());
    let admin = bridge.client(&ca, "palisade-controller");
    let m0only = bridge.client(&ca, "m0-only");
    admin.healthz().await.unwrap();
    // A request that carries the controller's trace context: its action span joins that trace
    // as a child of the sending span (checked with the traces below).
    let traced = bridge.client_traced(
        &ca,
        "palisade-controller",
        Some(|| Some(TRACEPARENT.into())),
    );
    let e = traced
        .power("m0", PowerAction::Off, 1, "bin-traced", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(502), "{e}");

    // Raise m1's floor to 5. The devices do not exist, so the action fails (502) after the
    // floor was persisted.
    let e = admin
        .power("m1", PowerAction::Off, 5, "bin-1", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(502), "{e}");
    // m0-only may not touch m1.
    let e = m0only
        .power("m1", PowerAction::Off, 1, "bin-2", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(403), "{e}");

    // Allow m0-only on m1 and send SIGHUP: the same client (same keep-alive connection) is
    // now authorized, and stopped by the token floor instead.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("targets = [\"m0\"]", "targets = [\"m0\", \"m1\"]");
    std::fs::write(&config, text).unwrap();
    kill(Pid::from_raw(bridge.child.id() as i32), Signal::SIGHUP).unwrap();
    let e = eventually_async("policy reload", Duration::from_secs(10), || async {
        let e = m0only
            .power("m1", PowerAction::Off, 1, "bin-3", None)
            .await
            .unwrap_err();
        (e.status() != Some(403)).then_some(e)
    })
    .await;
    assert_eq!(e.status(), Some(409), "{e}");
    let log1 = bridge.stop();
    assert!(log1.contains("reloaded certificates and policy"), "{log1}");

    // Restart: the floor and the audit log survive.
    let audit_before = std::fs::read_to_string(dir.path().join("state/audit.jsonl")).unwrap();
    let bridge = spawn(&config, &collector.endpoint());
    let admin = bridge.client(&ca, "palisade-controller");
    let e = admin
        .power("m1", PowerAction::Off, 4, "bin-4", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(e.to_string().contains("already seen token 5"), "{e}");
    let replay = admin
        .power("m1", PowerAction::Off, 5, "bin-1", None)
        .await
        .unwrap_err();
    assert_eq!(
        replay.status(),
        Some(502),
        "the first (failed) result is replayed: {replay}"
    );
    let recs = admin.audit(Some("m1"), 100).await.unwrap();
    let results: Vec<&str> = recs.iter().map(|r| r.result.as_str()).collect();
    // (The polling loop may have been refused more than once before the reload landed.)
    let n = results.len();
    assert!(n >= 5, "{results:?}");
    assert_eq!(results[..2], ["error", "forbidden"], "{results:?}");
    assert!(
        results[2..n - 3].iter().all(|r| *r == "forbidden"),
        "{results:?}"
    );
    assert_eq!(
        results[n - 3..],
        ["stale_fencing_token", "stale_fencing_token", "replayed"],
        "{results:?}"
    );
    let log2 = bridge.stop();
    let audit_after = std::fs::read_to_string(dir.path().join("state/audit.jsonl")).unwrap();
    assert!(audit_after.starts_with(&audit_before));

    // TRACE-level logs of both runs and the audit log hold no secret.
    assert!(log1.contains("acting"), "the test must see the action logs");
    for secret in [BMC_PASSWORD, PDU_COMMUNITY] {
        assert!(
            !log1.contains(secret) && !log2.contains(secret),
            "secret in logs"
        );
        assert!(!audit_after.contains(secret), "secret in audit log");
    }

    // The traces of both runs (each flushed at its SIGTERM): one span per action, naming the
    // target, the action, the client, the token and the answer; no secret in any attribute.
    let spans = collector.spans();
    let actions: Vec<_> = spans.iter().filter(|s| s.name == "bridge_action").collect();
    let find = |client: &str, token: &str, status: &str| {
        actions.iter().any(|s| {
            s.service == "firmware-bridge"
                && s.attributes.get("target").map(String::as_str) == Some("m1")
                && s.attributes.get("action").map(String::as_str) == Some("power.off")
                && s.attributes.get("client").map(String::as_str) == Some(client)
                && s.attributes.get("token").map(String::as_str) == Some(token)
                && s.attributes.get("status").map(String::as_str) == Some(status)
        })
    };
    assert!(find("palisade-controller", "5", "502"), "{actions:?}");
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let traced: Vec<_> = actions
        .iter()
        .filter(|s| s.attributes.get("target").map(String::as_str) == Some("m0"))
        .collect();
    assert_eq!(traced.len(), 1, "{actions:?}");
    let want: Vec<&str> = TRACEPARENT.split('-').collect();
    assert_eq!(hex(&traced[0].trace_id), want[1], "{traced:?}");
    assert_eq!(hex(&traced[0].parent_span_id), want[2], "{traced:?}");
    // Requests without a trace context start traces of their own.
    assert!(
        actions
            .iter()
            .filter(|s| s.attributes.get("target").map(String::as_str) == Some("m1"))
            .all(|s| hex(&s.trace_id) != want[1] && s.parent_span_id.is_empty()),
        "{actions:?}"
    );
    assert!(find("m0-only", "1", "409"), "{actions:?}");
    assert!(find("palisade-controller", "4", "409"), "{actions:?}");
    for secret in [BMC_PASSWORD, PDU_COMMUNITY] {
        assert!(
            spans
                .iter()
                .all(|s| s.attributes.values().all(|v| !v.contains(secret))),
            "secret in a span"
        );
    }
}
