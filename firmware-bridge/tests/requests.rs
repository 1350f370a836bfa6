//! Malformed and out-of-contract requests get clean JSON 4xx errors and never act.

mod common;

use common::Harness;
use reqwest::Method;
use serde_json::Value;

/// (name, method, path, headers, body, expected status, expected error code)
type Case<'a> = (
    &'a str,
    Method,
    &'a str,
    Vec<(&'a str, &'a str)>,
    Vec<u8>,
    u16,
    &'a str,
);

const HDRS: &[(&str, &str)] = &[("Idempotency-Key", "k1"), ("Fencing-Token", "1")];

fn json_error(status: u16, text: &str) -> (u16, String) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v["error"].as_str().unwrap_or_default().to_string())
}

#[tokio::test]
async fn bad_requests_get_json_4xx_and_never_act() {
    let h = Harness::start("").await;
    let c = h.client("palisade-controller");
    let post = "v1/targets/m0/power/off";
    let cases: Vec<Case> = vec![
        (
            "garbage JSON",
            Method::POST,
            post,
            HDRS.to_vec(),
            b"{not json".to_vec(),
            400,
            "bad_json",
        ),
        (
            "unknown field",
            Method::POST,
            post,
            HDRS.to_vec(),
            br#"{"raw_ipmi":"00 01"}"#.to_vec(),
            400,
            "bad_json",
        ),
        (
            "malformed storage hold",
            Method::POST,
            "v1/targets/m0/storage/block",
            HDRS.to_vec(),
            br#"{"hold":"Palisade/../x"}"#.to_vec(),
            400,
            "invalid_hold",
        ),
        (
            "storage hold that is not a string",
            Method::POST,
            "v1/targets/m0/storage/unblock",
            HDRS.to_vec(),
            br#"{"hold":["palisade-a"]}"#.to_vec(),
            400,
            "invalid_hold",
        ),
        (
            "hold on a power action",
            Method::POST,
            post,
            HDRS.to_vec(),
            br#"{"hold":"palisade-a"}"#.to_vec(),
            400,
            "invalid_hold",
        ),
        (
            "unknown field beside a good hold",
            Method::POST,
            "v1/targets/m0/storage/block",
            HDRS.to_vec(),
            br#"{"hold":"palisade-a","node_wide":true}"#.to_vec(),
            400,
            "bad_json",
        ),
        (
            "oversized body",
            Method::POST,
            post,
            HDRS.to_vec(),
            vec![b' '; 64 * 1024],
            413,
            "body_too_large",
        ),
        (
            "unknown version",
            Method::POST,
            "v2/targets/m0/power/off",
            HDRS.to_vec(),
            vec![],
            404,
            "not_found",
        ),
        (
            "unknown version read",
            Method::GET,
            "v0/targets/m0/power",
            vec![],
            vec![],
            404,
            "not_found",
        ),
        (
            "no passthrough",
            Method::POST,
            "v1/targets/m0/ipmi/raw",
            HDRS.to_vec(),
            vec![],
            404,
            "not_found",
        ),
        (
            "unknown action",
            Method::POST,
            "v1/targets/m0/power/explode",
            HDRS.to_vec(),
            vec![],
            404,
            "unknown_action",
        ),
        (
            "unknown target",
            Method::POST,
            "v1/targets/m9/power/off",
            HDRS.to_vec(),
            vec![],
            404,
            "unknown_target",
        ),
        (
            "no idempotency key",
            Method::POST,
            post,
            vec![("Fencing-Token", "1")],
            vec![],
            400,
            "missing_idempotency_key",
        ),
        (
            "no fencing token",
            Method::POST,
            post,
            vec![("Idempotency-Key", "k")],
            vec![],
            400,
            "missing_fencing_token",
        ),
        (
            "negative token",
            Method::POST,
            post,
            vec![("Idempotency-Key", "k"), ("Fencing-Token", "-1")],
            vec![],
            400,
            "missing_fencing_token",
        ),
        (
            "bad audit query",
            Method::GET,
            "v1/audit?limit=many",
            vec![],
            vec![],
            400,
            "bad_query",
        ),
    ];
    for (name, method, path, headers, body, want_status, want_code) in cases {
        let (status, text) = c.raw(method, path, &headers, body).await.unwrap();
        assert_eq!(
            json_error(status, &text),
            (want_status, want_code.to_string()),
            "{name}: {text}"
        );
    }
    assert_eq!(h.exec.action_count(), 0);
    // A well-formed body with a reason is accepted.
    let (status, text) = c
        .raw(Method::POST, post, HDRS, br#"{"reason":"test"}"#.to_vec())
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(h.exec.action_count(), 1);
}

#[tokio::test]
async fn responses_carry_verification_evidence() {
    let h = Harness::start("").await;
    let c = h.client("palisade-controller");
    let r = c
        .power(
            "m0",
            palisade_bridge::executor::PowerAction::Off,
            1,
            "e1",
            None,
        )
        .await
        .unwrap();
    assert!(r.verified);
    assert_eq!(r.evidence["devices"][0], "ipmi://127.0.0.1:9623");
    assert_eq!(r.token, Some(1));
    let s = c
        .storage(
            "m0",
            palisade_bridge::executor::StorageAction::Block,
            1,
            "e2",
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        s.storage_state(),
        Some(palisade_bridge::executor::StorageState::Blocked)
    );
    assert_eq!(
        c.storage_status("m0").await.unwrap().storage_state(),
        Some(palisade_bridge::executor::StorageState::Blocked)
    );
    assert_eq!(
        c.monitor("m0").await.unwrap().health(),
        Some(palisade_bridge::executor::Health::Ok)
    );
    // m1 has no storage device: refused before acting.
    let e = c
        .storage(
            "m1",
            palisade_bridge::executor::StorageAction::Block,
            1,
            "e3",
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(422), "{e}");
}

#[tokio::test]
async fn healthz_metrics_and_audit_scope() {
    let h = Harness::start("[[policy]]\nclient = \"cn:no-audit\"\ntargets = [\"m0\"]\n").await;
    let admin = h.client("palisade-controller");
    admin.healthz().await.unwrap();
    admin
        .power(
            "m1",
            palisade_bridge::executor::PowerAction::Off,
            1,
            "x1",
            None,
        )
        .await
        .unwrap();
    let m0 = h.client("m0-only");
    m0.power(
        "m0",
        palisade_bridge::executor::PowerAction::Off,
        1,
        "x2",
        None,
    )
    .await
    .unwrap();

    let (status, text) = admin
        .raw(Method::GET, "metrics", &[], vec![])
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        text.contains("# TYPE palisade_bridge_requests counter"),
        "{text}"
    );
    assert!(
        text.contains("palisade_bridge_actions_total{action=\"power.off\",result=\"ok\"} 2"),
        "{text}"
    );

    // The m0-only client sees only m0 records, and may not ask for m1's.
    let recs = m0.audit(None, 100).await.unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].target, "m0");
    assert_eq!(
        m0.audit(Some("m1"), 10).await.unwrap_err().status(),
        Some(403)
    );
    assert_eq!(admin.audit(None, 100).await.unwrap().len(), 2);
    // A client without read_audit may not read it at all.
    assert_eq!(
        h.client("no-audit")
            .audit(None, 10)
            .await
            .unwrap_err()
            .status(),
        Some(403)
    );
    let rec = &recs[0];
    assert_eq!(
        (
            rec.client.as_str(),
            rec.action.as_str(),
            rec.token,
            rec.idempotency_key.as_deref()
        ),
        ("m0-only", "power.off", Some(1), Some("x2"))
    );
    assert!(rec.evidence.is_object());
}

#[tokio::test]
async fn a_held_unblock_lifts_its_own_hold_and_is_refused_while_another_remains() {
    use palisade_bridge::executor::{Call, StorageAction, StorageHold, StorageState};
    use palisade_fence::bridge::{ClientError, STORAGE_STILL_HELD};
    let h = Harness::start("").await;
    let c = h.client("palisade-controller");
    let (a, b) = (
        StorageHold::new("palisade-a").unwrap(),
        StorageHold::new("palisade-b").unwrap(),
    );
    for (key, hold) in [("block-a", &a), ("block-b", &b)] {
        let r = c
            .storage_with_hold("m0", StorageAction::Block, 1, key, None, Some(hold))
            .await
            .unwrap();
        assert_eq!(r.storage_state(), Some(StorageState::Blocked));
    }
    let e = c
        .storage_with_hold("m0", StorageAction::Unblock, 1, "unblock-a", None, Some(&a))
        .await
        .unwrap_err();
    let ClientError::Api { status, code, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!((*status, code.as_str()), (409, STORAGE_STILL_HELD), "{e}");
    assert_eq!(
        c.storage_status("m0").await.unwrap().storage_state(),
        Some(StorageState::Blocked)
    );
    let r = c
        .storage_with_hold("m0", StorageAction::Unblock, 1, "unblock-b", None, Some(&b))
        .await
        .unwrap();
    assert_eq!(r.storage_state(), Some(StorageState::Unblocked));
    // The executor was handed each request's hold.
    let holds: Vec<_> = h
        .exec
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Storage(_, action, hold) => Some((action, hold)),
            _ => None,
        })
        .collect();
    assert_eq!(
        holds,
        vec![
            (StorageAction::Block, Some(a.clone())),
            (StorageAction::Block, Some(b.clone())),
            (StorageAction::Unblock, Some(a)),
            (StorageAction::Unblock, Some(b)),
        ]
    );
    let audit = c.audit(Some("m0"), 10).await.unwrap();
    let results: Vec<_> = audit
        .iter()
        .map(|r| (r.result.as_str(), r.hold.as_deref()))
        .collect();
    assert_eq!(
        results,
        vec![
            ("ok", Some("palisade-a")),
            ("ok", Some("palisade-b")),
            ("still_held", Some("palisade-a")),
            ("ok", Some("palisade-b")),
        ]
    );

    // Without a hold (an older controller) the unblock is node-wide, and the audit says so.
    c.storage_with_hold(
        "m0",
        StorageAction::Block,
        1,
        "block-c",
        None,
        Some(&StorageHold::new("palisade-c").unwrap()),
    )
    .await
    .unwrap();
    c.storage("m0", StorageAction::Block, 1, "block-old", None)
        .await
        .unwrap();
    let r = c
        .storage("m0", StorageAction::Unblock, 1, "unblock-old", None)
        .await
        .unwrap();
    assert_eq!(r.storage_state(), Some(StorageState::Unblocked));
    let last = c.audit(Some("m0"), 1).await.unwrap().pop().unwrap();
    assert_eq!(last.hold, None);
    assert!(
        last.message
            .as_deref()
            .unwrap_or_default()
            .contains("no hold"),
        "{last:?}"
    );
}
