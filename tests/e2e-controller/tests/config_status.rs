//! Bad configuration is refused at the door or reported at once. Against the real API server
//! and the controller running with the shipped least-privilege RBAC (as its ServiceAccount):
//! - the CRD schemas refuse a `maxUnhealthy` above 100 % and a device URL carrying
//!   credentials (the password never reaches etcd);
//! - cross-field rules (an inverted policy, targets with malformed devices) are refused at the
//!   door by the CRDs' CEL rules on a 1.25+ server; on an older one (1.20) they are stored, and
//!   the controller reports them within a few seconds in the object's status (`Accepted` with
//!   every problem) and an Event, and `Accepted` again once fixed;
//! - what only the controller can judge on any release (overlapping policies) is reported the
//!   same way;
//! - a NodeFence for a node that does not exist fails with `NodeNotFound` after its grace;
//! - no log line, Event or status of the run contains the credential.

mod common;

use std::time::Duration;

use common::sim::{Sim, SimNode};
use common::*;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use palisade_model::nodefence::{FailureReason, Phase};
use palisade_model::{FenceTarget, FencingPolicy, NodeFence};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const SECRET_WORD: &str = "hunter2-config-status";

fn accepted(status: Option<&palisade_model::acceptance::ConfigStatus>) -> Option<(String, String)> {
    status?
        .accepted()
        .map(|(s, r)| (s.to_string(), r.to_string()))
}

#[test]
fn bad_configuration_is_refused_at_the_door_or_reported_at_once() {
    let lab = common::sim::bare_lab(1);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    apply_rbac(&sim.c, &rt);
    let kubeconfig = controller_sa_kubeconfig(&lab);
    let ctl = start_controller_as(&lab, "ctl-config", &kubeconfig, &[], &[]);
    // The controller installs the CRDs before its first tick.
    ctl.wait_ticks(2);
    let a = [("palisade.test/zone", "a")];
    let b = [("palisade.test/zone", "b")];
    sim.nodes(&[
        SimNode {
            labels: &a,
            ..SimNode::new("cfg-a0", None)
        },
        SimNode {
            labels: &a,
            ..SimNode::new("cfg-a1", None)
        },
        SimNode {
            labels: &b,
            ..SimNode::new("cfg-b0", None)
        },
    ]);
    let policies: Api<FencingPolicy> = Api::all(sim.c.clone());
    let targets: Api<FenceTarget> = Api::all(sim.c.clone());
    let create_policy = |name: &str, spec: serde_json::Value| {
        let p: FencingPolicy =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
        rt.block_on(policies.create(&PostParams::default(), &p))
    };
    let create_target = |name: &str, spec: serde_json::Value| {
        let t: FenceTarget =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
        rt.block_on(targets.create(&PostParams::default(), &t))
    };

    // At the door: the schema refuses what it can express.
    for (name, bad) in [
        ("pct-250", json!({"limits": {"maxUnhealthy": "250%"}})),
        ("pct-word", json!({"limits": {"maxUnhealthy": "most"}})),
        ("count-negative", json!({"limits": {"maxUnhealthy": -1}})),
    ] {
        let err = create_policy(name, bad).expect_err("the API server refuses it");
        assert!(err.to_string().contains("maxUnhealthy"), "{name}: {err}");
    }
    let creds_url = format!("ipmi://admin:{SECRET_WORD}@127.0.0.1:623");
    let err = create_target(
        "cfg-a0",
        json!({"levels": [{"devices": [{"url": creds_url, "kind": "Power",
            "credentialsSecretRef": {"name": "bmc", "namespace": SYSTEM_NS}}]}]}),
    )
    .expect_err("a URL with credentials is refused at the door");
    assert!(err.to_string().contains("url"), "{err}");
    assert!(
        rt.block_on(targets.get_opt("cfg-a0")).unwrap().is_none(),
        "nothing was stored"
    );

    // Cross-field mistakes: refused at the door where the server runs the CEL rules, else
    // reported at once by the controller.
    let cel = server_has_cel(&sim.c, &rt);
    let inverted = create_policy(
        "inverted",
        json!({"nodeSelector": {"matchLabels": {"palisade.test/zone": "c"}},
               "detection": {"suspectAfterSeconds": 50, "unhealthyAfterSeconds": 10},
               "escalation": {"cooldownSeconds": 600, "windowSeconds": 60}}),
    );
    if cel {
        let err = inverted
            .expect_err("CEL refuses a cross-field mistake")
            .to_string();
        assert!(
            err.contains("must exceed") && err.contains("windowSeconds"),
            "both problems at once: {err}"
        );
    } else {
        inverted.expect("a 1.20 API server accepts a cross-field mistake");
    }
    create_policy("everything", json!({})).expect("create");
    create_policy(
        "zone-b",
        json!({"nodeSelector": {"matchLabels": {"palisade.test/zone": "b"}}}),
    )
    .expect("create");
    if !cel {
        let inverted = eventually("the inverted policy reported Invalid", WAIT, || {
            let p = rt.block_on(policies.get("inverted")).ok()?;
            (accepted(p.status.as_ref())? == ("False".into(), "Invalid".into())).then_some(p)
        });
        let st = inverted.status.unwrap();
        assert_eq!(st.problems.len(), 2, "{:?}", st.problems);
        assert!(
            st.problems.iter().any(|p| p.contains("must exceed")),
            "{:?}",
            st.problems
        );
        assert!(
            st.problems.iter().any(|p| p.contains("windowSeconds")),
            "{:?}",
            st.problems
        );
        assert_eq!(st.covered_node_count, Some(0));
        assert_eq!(st.observed_generation, inverted.metadata.generation);
        sim.wait_event("inverted", "RejectedInvalid", WAIT);
    }
    for name in ["everything", "zone-b"] {
        let p = eventually(&format!("{name} reported Conflict"), WAIT, || {
            let p = rt.block_on(policies.get(name)).ok()?;
            (accepted(p.status.as_ref())? == ("False".into(), "Conflict".into())).then_some(p)
        });
        let overlaps = p.status.unwrap().overlaps;
        assert_eq!(overlaps.len(), 1, "{name}: {overlaps:?}");
        assert_eq!(overlaps[0].nodes, vec!["cfg-b0".to_string()], "{name}");
        sim.wait_event(name, "RejectedConflict", WAIT);
    }
    // Fixed: the overlap goes away, the remaining policy is accepted, covering every node.
    rt.block_on(policies.delete("zone-b", &DeleteParams::default()))
        .expect("delete");
    let everything = eventually("everything accepted", WAIT, || {
        let p = rt.block_on(policies.get("everything")).ok()?;
        (accepted(p.status.as_ref())? == ("True".into(), "Valid".into())).then_some(p)
    });
    let st = everything.status.unwrap();
    assert_eq!(st.covered_node_count, Some(3));
    assert!(st.overlaps.is_empty());
    sim.wait_event("everything", "Accepted", WAIT);

    // Targets: every cross-field rule validate() knows, each refused at the door by its CEL
    // rule (the CEL message) or reported with its problem (validate()'s message).
    let secret_ref = json!({"name": "bmc", "namespace": SYSTEM_NS});
    for (node, spec, needle, cel_needle) in [
        (
            "cfg-a0",
            json!({"levels": [{"devices": [{"url": "bridge://127.0.0.1:9443/cfg-a0", "kind": "Power",
                "credentialsSecretRef": secret_ref}]}]}),
            "take no credentials",
            "take no credentialsSecretRef",
        ),
        (
            "cfg-a1",
            json!({"levels": [{"devices": [{"url": "ipmi://127.0.0.1:623", "kind": "Power"}]}]}),
            "need credentialsSecretRef",
            "direct devices need one",
        ),
        (
            "cfg-b0",
            json!({"levels": [{"devices": [{"url": "ipmi://127.0.0.1:623", "kind": "Storage",
                "credentialsSecretRef": secret_ref}]}]}),
            "contradicts",
            "are of kind Power",
        ),
        (
            "cfg-c0",
            json!({"levels": [{"devices": [{"url": "bridge://fw-bridge/cfg-c0", "kind": "Power"}]}]}),
            "bridge://<host>:<port>/<target-id>",
            "bridge://<host>:<port>/<target-id>",
        ),
    ] {
        if cel {
            let err = create_target(node, spec)
                .expect_err("CEL refuses it at the door")
                .to_string();
            assert!(err.contains(cel_needle), "{node}: {err}");
            continue;
        }
        create_target(node, spec).expect("a 1.20 API server accepts it");
        let t = eventually(&format!("target {node} reported Invalid"), WAIT, || {
            let t = rt.block_on(targets.get(node)).ok()?;
            (accepted(t.status.as_ref())? == ("False".into(), "Invalid".into())).then_some(t)
        });
        let problems = t.status.unwrap().problems;
        assert!(
            problems.iter().any(|p| p.contains(needle)),
            "{node}: {problems:?}"
        );
        sim.wait_event(node, "RejectedInvalid", WAIT);
    }
    let fixed = json!({"levels": [{"devices": [{"url": "bridge://127.0.0.1:9443/cfg-a0", "kind": "Power"}]}]});
    if cel {
        create_target("cfg-a0", fixed).expect("a valid target is admitted");
    } else {
        rt.block_on(targets.patch(
            "cfg-a0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": fixed})),
        ))
        .expect("patch");
    }
    eventually("target cfg-a0 accepted once fixed", WAIT, || {
        let t = rt.block_on(targets.get("cfg-a0")).ok()?;
        (accepted(t.status.as_ref())? == ("True".into(), "Valid".into())).then_some(())
    });

    // The gauge counts what is rejected now: the inverted policy and three targets (nothing
    // where CEL kept them out: the gauge then has no Invalid sample at all).
    eventually("palisade_config_rejected", WAIT, || {
        let m = ctl.metrics()?;
        let ok = if cel {
            m.contains("# TYPE palisade_config_rejected gauge")
                && !m
                    .contains("palisade_config_rejected{kind=\"FencingPolicy\",reason=\"Invalid\"}")
                && !m.contains("palisade_config_rejected{kind=\"FenceTarget\",reason=\"Invalid\"}")
        } else {
            m.contains("palisade_config_rejected{kind=\"FencingPolicy\",reason=\"Invalid\"} 1")
                && m.contains("palisade_config_rejected{kind=\"FenceTarget\",reason=\"Invalid\"} 3")
        };
        ok.then_some(())
    });

    // A NodeFence for a node that does not exist fails, visibly, instead of waiting forever.
    let fences: Api<NodeFence> = Api::all(sim.c.clone());
    let ghost: NodeFence = serde_json::from_value(json!({
        "metadata": {"name": "ghost-fence"},
        "spec": {"nodeName": "ghost", "reason": "test", "requestedBy": "Manual"}
    }))
    .unwrap();
    rt.block_on(fences.create(&PostParams::default(), &ghost))
        .expect("create");
    sim.wait_event("ghost-fence", "NodeNotFound", WAIT);
    let failed = eventually("the ghost fence failed", WAIT, || {
        let f = rt.block_on(fences.get("ghost-fence")).ok()?;
        let st = f.status.clone()?;
        (st.phase == Phase::Failed).then_some(st)
    });
    assert_eq!(
        failed.failure.as_ref().map(|f| f.reason),
        Some(FailureReason::NodeNotFound)
    );
    assert!(
        failed.plan.is_none(),
        "nothing was planned, let alone fenced"
    );

    // The credential never appears: not in the controller's log, not in any Event, not in any
    // stored policy, target or fence.
    let log = ctl.log_text();
    assert!(!log.contains(SECRET_WORD));
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the shipped RBAC lets the controller do its work:\n{log}"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(sim.c.clone(), "default");
    let all_events = rt.block_on(events.list(&Default::default())).unwrap();
    let stored = format!(
        "{:?}{:?}{:?}{:?}",
        all_events.items,
        rt.block_on(policies.list(&Default::default()))
            .unwrap()
            .items,
        rt.block_on(targets.list(&Default::default()))
            .unwrap()
            .items,
        rt.block_on(fences.list(&Default::default())).unwrap().items,
    );
    assert!(!stored.contains(SECRET_WORD));
    assert!(fences_for(&sim.c, &rt, "cfg-a0").is_empty());
}
