//! Safety: fencing tokens, idempotency, per-target serialization, rate limits, persistence.

mod common;

use std::time::Duration;

use common::Harness;
use palisade_bridge::executor::{Call, PowerAction, PowerState, RecordingExecutor, StorageAction};

#[tokio::test]
async fn stale_fencing_token_is_refused_and_equal_token_is_allowed() {
    let h = Harness::start("").await;
    let c = h.client("palisade-controller");
    c.power("m0", PowerAction::Off, 7, "a", None).await.unwrap();
    let e = c
        .power("m0", PowerAction::On, 6, "b", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(e.to_string().contains("stale fencing token 6"), "{e}");
    assert!(e.to_string().contains("already seen token 7"), "{e}");
    assert!(!e.is_retryable());
    // The floor is a typed field of the refusal, never only words in its message.
    let palisade_fence::bridge::ClientError::Api { body, .. } = &e else {
        panic!("not an API refusal: {e}")
    };
    assert_eq!(body["error"], "stale_fencing_token", "{body}");
    assert_eq!(body["seen_token"].as_u64(), Some(7), "{body}");
    assert_eq!(body["token"].as_u64(), Some(6), "{body}");
    assert_eq!(h.exec.action_count(), 1, "the stale request must not act");
    // Equal token: the same leader acting again.
    let r = c.power("m0", PowerAction::On, 7, "c", None).await.unwrap();
    assert_eq!(r.power_state(), Some(PowerState::On));
    // Floors are per target.
    c.power("m1", PowerAction::Off, 1, "d", None).await.unwrap();
    assert_eq!(h.bridge.token_floor("m0"), 7);
    assert_eq!(h.bridge.token_floor("m1"), 1);
    let recs = c.audit(Some("m0"), 10).await.unwrap();
    assert!(recs
        .iter()
        .any(|r| r.result == "stale_fencing_token" && r.token == Some(6) && r.status == 409));
}

#[tokio::test]
async fn idempotent_retry_acts_once_and_returns_the_first_result() {
    let h = Harness::start("").await;
    let c = h.client("palisade-controller");
    let first = c
        .power(
            "m0",
            PowerAction::Reboot,
            3,
            "reboot-1",
            Some("nodefence/m0"),
        )
        .await
        .unwrap();
    assert!(!first.replayed);
    let second = c
        .power(
            "m0",
            PowerAction::Reboot,
            3,
            "reboot-1",
            Some("nodefence/m0"),
        )
        .await
        .unwrap();
    assert!(second.replayed, "the retry must be answered from the cache");
    assert_eq!(first.evidence, second.evidence);
    assert_eq!(first.state, second.state);
    assert_eq!(
        h.exec
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::Power(_, PowerAction::Reboot)))
            .count(),
        1
    );
    // Even after a newer token raised the floor, the retry returns the first result.
    c.power("m0", PowerAction::Off, 9, "off-9", None)
        .await
        .unwrap();
    let third = c
        .power("m0", PowerAction::Reboot, 3, "reboot-1", None)
        .await
        .unwrap();
    assert!(third.replayed);
    assert_eq!(h.exec.action_count(), 2);
    // Reusing a key for a different request is refused.
    let e = c
        .power("m0", PowerAction::On, 9, "off-9", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(422), "{e}");
    assert_eq!(h.exec.action_count(), 2);
}

#[tokio::test]
async fn concurrent_duplicate_requests_act_once() {
    let h = Harness::start_with(
        "",
        RecordingExecutor::with_delay(Duration::from_millis(200)),
    )
    .await;
    let c = h.client("palisade-controller");
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let c = c.clone();
        set.spawn(async move {
            c.power("m0", PowerAction::Off, 1, "same-key", None)
                .await
                .unwrap()
        });
    }
    let mut replays = 0;
    while let Some(r) = set.join_next().await {
        replays += usize::from(r.unwrap().replayed);
    }
    assert_eq!(h.exec.action_count(), 1);
    assert_eq!(replays, 4);
}

#[tokio::test]
async fn operations_on_one_target_are_serialized() {
    let h = Harness::start_with(
        "",
        RecordingExecutor::with_delay(Duration::from_millis(100)),
    )
    .await;
    let c = h.client("palisade-controller");
    let mut set = tokio::task::JoinSet::new();
    for i in 0..4u64 {
        let c = c.clone();
        set.spawn(async move {
            if i.is_multiple_of(2) {
                c.power("m0", PowerAction::Off, 1, &format!("k{i}"), None)
                    .await
                    .unwrap();
            } else {
                c.storage("m0", StorageAction::Block, 1, &format!("k{i}"), None)
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    assert_eq!(h.exec.action_count(), 4);
    assert_eq!(h.exec.max_concurrent_actions(), 1);
}

#[tokio::test]
async fn restart_keeps_token_floor_idempotency_and_audit_log() {
    let mut h = Harness::start("").await;
    let c = h.client("palisade-controller");
    let first = c
        .power("m0", PowerAction::Off, 42, "off-42", None)
        .await
        .unwrap();
    let before = std::fs::read_to_string(h.audit_path()).unwrap();
    assert_eq!(before.lines().count(), 1);

    h.restart(RecordingExecutor::new()).await;
    assert_eq!(h.bridge.token_floor("m0"), 42);
    let c = h.client("palisade-controller");
    let e = c
        .power("m0", PowerAction::On, 41, "on-41", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    let again = c
        .power("m0", PowerAction::Off, 42, "off-42", None)
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.evidence, first.evidence);
    assert_eq!(
        h.exec.action_count(),
        0,
        "the restarted bridge must not act for a stale or repeated request"
    );
    let after = std::fs::read_to_string(h.audit_path()).unwrap();
    assert!(
        after.starts_with(&before),
        "the audit log is append-only across restarts"
    );
    let recs = c.audit(Some("m0"), 100).await.unwrap();
    let results: Vec<&str> = recs.iter().map(|r| r.result.as_str()).collect();
    assert_eq!(results, ["ok", "stale_fencing_token", "replayed"]);
}

#[tokio::test]
async fn interrupted_attempt_is_never_repeated_after_restart() {
    let mut h = Harness::start("").await;
    // Simulate a crash between "pending" and "done": record pending directly in the journal.
    h.stop().await;
    let journal = h.dir.path().join("state").join("state.jsonl");
    std::fs::write(&journal, "{\"kind\":\"floor\",\"target\":\"m0\",\"token\":5}\n{\"kind\":\"pending\",\"key\":\"k-crash\",\"fingerprint\":\"m0 power.reboot 5\"}\n").unwrap();
    h.restart(RecordingExecutor::new()).await;
    let c = h.client("palisade-controller");
    let e = c
        .power("m0", PowerAction::Reboot, 5, "k-crash", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409));
    assert!(e.to_string().contains("outcome is unknown"), "{e}");
    assert_eq!(h.exec.action_count(), 0);
}

#[tokio::test]
async fn per_client_rate_limit_returns_429_with_retry_after() {
    let h = Harness::start("[rate_limit]\nburst = 3\nper_second = 0.01\n").await;
    let c = h.client("palisade-controller");
    for _ in 0..3 {
        c.power_status("m0").await.unwrap();
    }
    let e = c.power_status("m0").await.unwrap_err();
    assert_eq!(e.status(), Some(429), "{e}");
    assert!(e.is_retryable());
    // Another client has its own bucket.
    h.client("m0-only").power_status("m0").await.unwrap();
}

#[tokio::test]
async fn device_failure_is_reported_with_evidence_and_cached() {
    let h = Harness::start("").await;
    h.exec
        .fail_power("m1", "BMC did not answer; PDU level failed too");
    let c = h.client("palisade-controller");
    let e = c
        .power("m1", PowerAction::Off, 1, "f1", None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(502), "{e}");
    let palisade_fence::bridge::ClientError::Api { body, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(body["evidence"]["reading"], "failed");
    let e2 = c
        .power("m1", PowerAction::Off, 1, "f1", None)
        .await
        .unwrap_err();
    assert_eq!(e2.status(), Some(502));
    assert_eq!(
        h.exec.action_count(),
        1,
        "a retried key never acts twice, even after a failure"
    );
}
