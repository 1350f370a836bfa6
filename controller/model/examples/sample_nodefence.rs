//! Print a `NodeFence` whose status went through a whole fence (every status field populated),
//! as JSON. Useful as documentation and to check that an API server keeps every field
//! (`kubectl get nodefence -o json` after writing it to the status subresource).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use palisade_model::nodefence::{
    AttemptOutcome, DeviceAction, DeviceAttempt, Evidence, EvidenceKind, FencePlan, LevelKind,
    NodeFence, NodeFenceSpec, NodeFenceStatus, Overrides, Phase, PlannedDevice, PlannedLevel,
    ReleasedObject, RequestedBy, VerdictRecord,
};
use palisade_model::target::DeviceKind;

fn main() -> anyhow::Result<()> {
    let t = |ms: i64| -> anyhow::Result<Timestamp> {
        Ok(Timestamp::from_millisecond(1_800_000_000_000 + ms)?)
    };
    let mut st = NodeFenceStatus::default();
    st.transition(Phase::Pending, t(0)?, "requested by the controller")?;
    st.verdict = Some(VerdictRecord {
        label: "fence".into(),
        message: "fencing m0 with 2 level(s)".into(),
        at: MicroTime(t(1)?),
    });
    st.plan = Some(FencePlan {
        levels: vec![
            PlannedLevel {
                name: "ipmi".into(),
                kind: LevelKind::Hardware,
                devices: vec![PlannedDevice {
                    url: "ipmi://127.0.0.1:6230".into(),
                    kind: DeviceKind::Power,
                    timeout_seconds: 20,
                    fences: None,
                    identity_from: None,
                }],
                trusted_after: None,
                silent_since: None,
                trust_wait_seconds: None,
                self_fence_scope: None,
                silent_marker: None,
            },
            PlannedLevel {
                name: "self-fence".into(),
                kind: LevelKind::SelfFence,
                devices: vec![],
                trusted_after: Some(MicroTime(t(30_000)?)),
                silent_since: Some(MicroTime(t(13_000)?)),
                trust_wait_seconds: Some(17),
                self_fence_scope: Some(palisade_model::nodefence::Coverage::All),
                silent_marker: Some("lease=2026-11-24T10:00:13.000000Z;ready=-".into()),
            },
        ],
    });
    st.fencing_token = Some(7);
    st.transition(Phase::Fencing, t(2)?, "fencing")?;
    st.attempts.push(DeviceAttempt {
        level: 0,
        device: "ipmi://127.0.0.1:6230".into(),
        action: DeviceAction::PowerOff,
        outcome: AttemptOutcome::Succeeded,
        token: 7,
        at: MicroTime(t(400)?),
        message: "chassis power off accepted".into(),
        seen_token: None,
    });
    st.record_level_verified(
        0,
        vec![Evidence {
            level: 0,
            device: "ipmi://127.0.0.1:6230".into(),
            kind: EvidenceKind::PowerOff,
            observed: "chassis power: off".into(),
            at: MicroTime(t(900)?),
        }],
        t(900)?,
        "power off verified",
    )?;
    st.transition(Phase::Fenced, t(901)?, "power off verified")?;
    st.transition(Phase::Releasing, t(902)?, "releasing")?;
    st.release.tainted_at = Some(MicroTime(t(950)?));
    let released = |ns: &str, name: &str, ms| -> anyhow::Result<ReleasedObject> {
        Ok(ReleasedObject {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            at: MicroTime(t(ms)?),
        })
    };
    st.release.pods.push(released("db", "db-0", 1000)?);
    st.release.attachments.push(released("", "csi-abc", 1100)?);
    st.release.attach_records.push(released("", "pv-1", 1200)?);
    st.transition(Phase::Released, t(1201)?, "released")?;
    st.transition(Phase::Recovering, t(60_000)?, "node is back")?;
    st.recovery.powered_on_at = Some(MicroTime(t(60_001)?));
    st.recovery.unfenced_at = Some(MicroTime(t(70_000)?));
    st.recovery.untainted_at = Some(MicroTime(t(70_001)?));
    st.transition(Phase::Done, t(70_002)?, "recovered")?;

    let mut nf = NodeFence::new(
        "m0-sample",
        NodeFenceSpec {
            node_name: "m0".into(),
            reason: "sample".into(),
            requested_by: RequestedBy::Controller,
            overrides: Overrides::default(),
        },
    );
    nf.metadata = ObjectMeta {
        name: Some("m0-sample".into()),
        ..Default::default()
    };
    nf.status = Some(st);
    println!("{}", serde_json::to_string_pretty(&nf)?);
    Ok(())
}
