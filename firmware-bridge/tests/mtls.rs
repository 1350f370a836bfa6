//! Mutual TLS: every unauthenticated or unauthorized client is refused with a clear error,
//! and SIGHUP-style reloads swap certificates and policy without dropping connections.

mod common;

use std::time::Duration;

use common::{raw_request, Ca, Harness};
use palisade_bridge::executor::PowerAction;
use palisade_test_support::eventually_async;

const GET_HEALTH: &str = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

async fn handshake_failures(h: &Harness, reason: &str) -> Option<()> {
    let text = h
        .client("palisade-controller")
        .raw(reqwest::Method::GET, "metrics", &[], vec![])
        .await
        .ok()?
        .1;
    let line = format!("palisade_bridge_tls_handshake_failures_total{{reason=\"{reason}\"}} 1");
    text.contains(&line).then_some(())
}

#[tokio::test]
async fn valid_client_certificate_is_served() {
    let h = Harness::start("").await;
    let resp = raw_request(
        h.addr,
        &h.server_ca_pem,
        Some(&h.ca.client("palisade-controller")),
        GET_HEALTH,
    )
    .await
    .unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
}

#[tokio::test]
async fn no_client_certificate_is_refused_with_certificate_required() {
    let h = Harness::start("").await;
    let err = raw_request(h.addr, &h.server_ca_pem, None, GET_HEALTH)
        .await
        .unwrap_err();
    assert!(err.contains("CertificateRequired"), "client saw: {err}");
    eventually_async("server-side metric", Duration::from_secs(10), || {
        handshake_failures(&h, "no_client_certificate")
    })
    .await;
}

#[tokio::test]
async fn certificate_from_another_ca_is_refused_with_unknown_ca() {
    let h = Harness::start("").await;
    let rogue = Ca::new("rogue-ca").client("palisade-controller");
    let err = raw_request(h.addr, &h.server_ca_pem, Some(&rogue), GET_HEALTH)
        .await
        .unwrap_err();
    assert!(err.contains("UnknownCA"), "client saw: {err}");
    // The bridge client reports the alert too, and never gets as far as acting.
    let e = h
        .client_with(&rogue)
        .power("m0", PowerAction::Off, 1, "k-rogue", None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("UnknownCA"), "{e}");
    assert_eq!(h.exec.action_count(), 0);
    eventually_async("server-side metric", Duration::from_secs(10), || async {
        let text = h
            .client("palisade-controller")
            .raw(reqwest::Method::GET, "metrics", &[], vec![])
            .await
            .ok()?
            .1;
        text.contains("palisade_bridge_tls_handshake_failures_total{reason=\"unknown_ca\"} 2")
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn expired_certificate_is_refused_with_certificate_expired() {
    let h = Harness::start("").await;
    let expired = h.ca.expired_client("palisade-controller");
    let err = raw_request(h.addr, &h.server_ca_pem, Some(&expired), GET_HEALTH)
        .await
        .unwrap_err();
    assert!(err.contains("CertificateExpired"), "client saw: {err}");
    eventually_async("server-side metric", Duration::from_secs(10), || {
        handshake_failures(&h, "certificate_expired")
    })
    .await;
}

#[tokio::test]
async fn valid_certificate_on_a_target_it_may_not_touch_gets_403() {
    let h = Harness::start("").await;
    let c = h.client("m0-only");
    let e = c
        .power("m1", PowerAction::Off, 1, "k1", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(403), "{e}");
    assert!(
        e.to_string().contains("not allowed to act on target m1"),
        "{e}"
    );
    let e = c.power_status("m1").await.unwrap_err();
    assert_eq!(e.status(), Some(403));
    // A certificate from the right CA whose identity is in no rule is denied everything.
    let e = h.client("stranger").power_status("m0").await.unwrap_err();
    assert_eq!(e.status(), Some(403));
    assert!(e.to_string().contains("not in the bridge policy"), "{e}");
    assert_eq!(h.exec.action_count(), 0);
    // Allowed on its own target.
    c.power("m0", PowerAction::Off, 1, "k2", None)
        .await
        .unwrap();
    assert_eq!(h.exec.action_count(), 1);
    // The denial is in the audit log.
    let recs = h
        .client("palisade-controller")
        .audit(Some("m1"), 10)
        .await
        .unwrap();
    assert!(
        recs.iter()
            .any(|r| r.client == "m0-only" && r.status == 403 && r.result == "forbidden"),
        "{recs:?}"
    );
}

#[tokio::test]
async fn reload_swaps_policy_and_certificates_without_dropping_connections() {
    let mut h = Harness::start("").await;
    let c = h.client("m0-only");
    c.power_status("m0").await.unwrap(); // opens a keep-alive connection
    assert_eq!(c.power_status("m1").await.unwrap_err().status(), Some(403));

    // New policy (m0-only may now act on m1) and a new server certificate from a new CA.
    let new_ca = Ca::new("palisade-test-ca-2");
    let server = new_ca.server();
    let text = std::fs::read_to_string(&h.config)
        .unwrap()
        .replace("targets = [\"m0\"]", "targets = [\"m0\", \"m1\"]");
    std::fs::write(&h.config, text).unwrap();
    common::write_private(&h.dir.path().join("server.key"), &server.1);
    std::fs::write(h.dir.path().join("server.crt"), &server.0).unwrap();
    h.bridge.reload().unwrap();

    // The established connection keeps working and is judged by the new policy.
    c.power_status("m1").await.unwrap();
    // New connections get the new server certificate: a client pinned to the old CA fails,
    // one pinned to the new CA succeeds.
    let old = raw_request(
        h.addr,
        &h.server_ca_pem,
        Some(&h.ca.client("m0-only")),
        GET_HEALTH,
    )
    .await;
    assert!(old.unwrap_err().contains("handshake"));
    h.server_ca_pem = new_ca.pem();
    h.client("m0-only").power_status("m1").await.unwrap();

    // A broken config is refused and the running one stays.
    std::fs::write(&h.config, "this is not toml = [").unwrap();
    assert!(h.bridge.reload().is_err());
    h.client("m0-only").power_status("m1").await.unwrap();
}
