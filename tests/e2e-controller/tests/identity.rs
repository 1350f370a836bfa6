//! A fence acts only on the node it pinned, and only one fence per node acts. Against the real
//! controller and API server, with simulated nodes:
//! - a NodeFence whose `spec.nodeName` is edited mid-fence (from the silent node to a live
//!   one) is refused at the door by the CRD's CEL rule (1.25+), or, on 1.20, is stored and
//!   fails with `SpecChanged`; either way the live node is never tainted, released or fenced;
//! - a second, manual NodeFence for a node that already has an unfinished one is marked
//!   `Superseded`, names the active one, and never acts.

mod common;

use std::time::Duration;

use common::sim::{spec, Sim, SimNode};
use common::*;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use palisade_model::advertise as ad;
use palisade_model::nodefence::{FailureReason, Phase};
use palisade_model::NodeFence;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn an_edited_node_name_fails_the_fence_and_a_second_fence_is_superseded() {
    let lab = common::sim::bare_lab(1);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    let _ctl = start_controller(&lab, "ctl-identity");
    let labels = [("palisade.test/scenario", "identity")];
    // A long trusted self-fence wait keeps the fence in Fencing while the test edits it.
    let armed = [
        (ad::SELF_FENCE_AFTER, "60"),
        (ad::WATCHDOG_TIMEOUT, "10"),
        (ad::WATCHDOG_NOWAYOUT, "true"),
        (ad::WATCHDOG_ACTION, "reset"),
        (ad::VIRTUALIZATION, "none"),
        (ad::SELF_FENCE_SCOPE, "all"),
    ];
    let nodes = [
        SimNode {
            labels: &labels,
            lease_annotations: &armed,
            ..SimNode::new("id-silent", None)
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("id-live", None)
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("id-live2", None)
        },
    ];
    sim.nodes(&nodes);
    sim.policy(
        "identity",
        spec("identity", json!({"trustSelfFence": {"enabled": true}})),
    );
    sim.silence("id-silent");
    let nf = sim.wait_fence_phase("id-silent", Phase::Fencing, WAIT);
    let name = nf.name_any();
    let pinned = nf
        .status
        .as_ref()
        .and_then(|s| s.pinned.clone())
        .expect("pinned");
    assert_eq!(pinned.name, "id-silent");
    assert!(!pinned.uid.is_empty(), "the Node's UID is pinned");

    // A person creates a second NodeFence for the same node: superseded, never acts.
    let api: Api<NodeFence> = Api::all(sim.c.clone());
    let second: NodeFence = serde_json::from_value(json!({
        "metadata": {"name": "id-silent-manual"},
        "spec": {"nodeName": "id-silent", "reason": "a second request", "requestedBy": "Manual"}
    }))
    .unwrap();
    rt.block_on(api.create(&PostParams::default(), &second))
        .expect("create the second NodeFence");
    let superseded = eventually("the second NodeFence superseded", WAIT, || {
        let f = rt.block_on(api.get("id-silent-manual")).ok()?;
        let st = f.status.clone()?;
        (st.phase == Phase::Failed).then_some(st)
    });
    assert_eq!(
        superseded.failure.as_ref().map(|f| f.reason),
        Some(FailureReason::Superseded)
    );
    assert_eq!(superseded.superseded_by.as_deref(), Some(name.as_str()));
    assert!(
        superseded.plan.is_none() && superseded.fencing_token.is_none(),
        "it never acted"
    );

    // Someone edits the active fence to point at a live node. On a 1.25+ server the CRD's CEL
    // rule refuses the edit at the door; on 1.20 it is stored, and the fence fails. Either
    // way nothing is done to the live node.
    let edit = rt.block_on(api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"nodeName": "id-live"}})),
    ));
    if server_has_cel(&sim.c, &rt) {
        let err = edit.expect_err("CEL refuses the edit").to_string();
        assert!(err.contains("spec cannot change"), "{err}");
        let f = rt.block_on(api.get(&name)).expect("the fence");
        assert_eq!(
            f.spec.node_name, "id-silent",
            "the stored spec is unchanged"
        );
    } else {
        edit.expect("a 1.20 API server stores the edit");
        let failed = eventually("the edited NodeFence failed", WAIT, || {
            let f = rt.block_on(api.get(&name)).ok()?;
            let st = f.status.clone()?;
            (st.phase == Phase::Failed).then_some(st)
        });
        assert_eq!(
            failed.failure.as_ref().map(|f| f.reason),
            Some(FailureReason::SpecChanged)
        );
        assert!(!failed.released_anything(), "nothing was released");
    }
    let node: k8s_openapi::api::core::v1::Node =
        rt.block_on(Api::all(sim.c.clone()).get("id-live")).unwrap();
    assert!(
        !node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "node.kubernetes.io/out-of-service"),
        "the live node is never tainted"
    );
}
