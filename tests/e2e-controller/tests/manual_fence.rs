//! Manual fencing: a person's `NodeFence` for a healthy node holds unless it carries the
//! documented `nodeHealth` override (and `forgiveness`, since a live node never exhausts its
//! pods' forgiveness); with them, the node is fenced and released. The controller exports its
//! traces over OTLP: the fence's steps and device commands arrive as spans that name the node,
//! the NodeFence, the phase, the token and the device.

mod common;

use std::time::Duration;

use common::*;
use kube::api::PostParams;
use kube::Api;
use palisade_model::nodefence::Phase;
use palisade_model::NodeFence;
use serde_json::json;

fn manual(node: &str, overrides: serde_json::Value) -> NodeFence {
    serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "NodeFence",
        "metadata": {"name": format!("manual-{node}")},
        "spec": {"nodeName": node, "reason": "operator suspects the disk controller",
                 "requestedBy": "Manual", "overrides": overrides},
    }))
    .unwrap()
}

#[test]
fn manual_fence_of_a_healthy_node_needs_the_node_health_override() {
    let lab = start_lab(3, false);
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    let collector = palisade_telemetry::receiver::Receiver::start().expect("OTLP receiver");
    let cp = lab.control_plane().expect("control plane");
    let _ctl = start_controller_as(
        &lab,
        "ctl-m",
        cp.admin_kubeconfig(),
        &[],
        &["--otlp-endpoint".to_string(), collector.endpoint()],
    );
    policy(&c, &rt);
    ipmi_targets(&lab, &c, &rt);
    let api: Api<NodeFence> = Api::all(c.clone());

    rt.block_on(api.create(&PostParams::default(), &manual("m1", json!({}))))
        .expect("create manual NodeFence for m1");
    let held = eventually("m1's request held", Duration::from_secs(60), || {
        let f = rt.block_on(api.get("manual-m1")).ok()?;
        let st = f.status?;
        st.verdict
            .filter(|v| v.label == "hold_node_not_unhealthy")
            .map(|v| (st.phase, v.message))
    });
    assert_eq!(held.0, Phase::Pending);
    eprintln!("m1 held: {}", held.1);

    rt.block_on(api.create(
        &PostParams::default(),
        &manual("m2", json!({"nodeHealth": true, "forgiveness": true})),
    ))
    .expect("create manual NodeFence for m2");
    let t0 = k8s_openapi::jiff::Timestamp::now();
    let nf = eventually("m2 Released", Duration::from_secs(120), || {
        rt.block_on(api.get("manual-m2")).ok().filter(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Released)
        })
    });
    print_timeline(&nf, t0);
    assert!(
        lab.machines()[2].processes().is_empty(),
        "m2 is powered off"
    );
    // m1 was never touched.
    let m1 = rt.block_on(api.get("manual-m1")).unwrap();
    assert_eq!(m1.status.unwrap().phase, Phase::Pending);
    assert!(!lab.machines()[1].processes().is_empty());

    // The traces: the batch exporter sends every few seconds.
    let (step, device) = eventually("m2's fence in the traces", Duration::from_secs(60), || {
        let spans = collector.spans();
        let attr = |s: &palisade_telemetry::receiver::ReceivedSpan, k: &str| {
            s.attributes.get(k).cloned().unwrap_or_default()
        };
        let device = spans.iter().find(|s| {
            s.name == "device" && attr(s, "node") == "m2" && attr(s, "outcome") == "Succeeded"
        })?;
        let step = spans.iter().find(|s| s.span_id == device.parent_span_id)?;
        Some((step.clone(), device.clone()))
    });
    assert_eq!(step.service, "palisade-controller");
    assert_eq!(step.name, "step");
    assert_eq!(step.attributes["nodefence"], "manual-m2");
    assert_eq!(step.attributes["node"], "m2");
    assert_eq!(step.attributes["phase"], "Fencing");
    assert_eq!(step.attributes["token"], device.attributes["token"]);
    assert!(
        device.attributes["device"].starts_with("ipmi://"),
        "{device:?}"
    );
    assert_eq!(collector.rejected(), 0);
    assert!(
        collector
            .spans()
            .iter()
            .all(|s| !(s.name == "device"
                && s.attributes.get("node").map(String::as_str) == Some("m1"))),
        "no device was commanded for the held m1"
    );
}
