//! The validating admission webhook, through the real API server's admission path: the
//! shipped `controller/manifests/webhook.yaml` (pointed at the lab's controller with the lab
//! CA) refuses malformed policies and targets, a NodeFence for a node that does not exist or
//! that already has an unfinished fence, and an edited NodeFence spec, each with its message.
//! When the controller is down, NodeFence creation fails closed and policy edits fail open.
//! On 1.25+ the CRDs' CEL rules refuse the malformed policies and targets before the webhook
//! is asked (same reasons); on 1.20 the webhook refuses them itself.

mod common;

use std::time::Duration;

use common::sim::{Sim, SimNode};
use common::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use palisade_model::{FenceTarget, FencingPolicy, NodeFence};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn the_webhook_refuses_bad_objects_at_the_door_and_fails_closed_only_for_fences() {
    use base64::Engine;
    let lab = common::sim::bare_lab(1);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    let issued = lab.ca().issue_server_cert(&["127.0.0.1"]).expect("cert");
    let (cert, key) = (lab.dir().join("webhook.crt"), lab.dir().join("webhook.key"));
    std::fs::write(&cert, &issued.cert_pem).unwrap();
    palisade_lab::write_secret(&key, issued.key_pem.as_bytes()).unwrap();
    let port = free_port();
    let cp = lab.control_plane().expect("control plane");
    let mut ctl = start_controller_as(
        &lab,
        "ctl-webhook",
        cp.admin_kubeconfig(),
        &[],
        &[
            "--webhook-addr".into(),
            format!("127.0.0.1:{port}"),
            "--webhook-cert".into(),
            cert.display().to_string(),
            "--webhook-key".into(),
            key.display().to_string(),
        ],
    );
    ctl.wait_ticks(2);
    sim.nodes(&[SimNode::new("adm-m0", None)]);

    // Register the shipped configuration, pointed at this controller with the lab CA.
    let mut cfg: serde_json::Value =
        serde_saphyr::from_str(include_str!("../../../controller/manifests/webhook.yaml"))
            .expect("webhook.yaml parses");
    let ca = base64::engine::general_purpose::STANDARD.encode(lab.ca().cert_pem());
    for w in cfg["webhooks"].as_array_mut().unwrap() {
        w["clientConfig"] =
            json!({"url": format!("https://127.0.0.1:{port}/validate"), "caBundle": ca});
    }
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(cfg).unwrap();
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(sim.c.clone());
    rt.block_on(hooks.create(&PostParams::default(), &vwc))
        .expect("register the webhook");

    let policies: Api<FencingPolicy> = Api::all(sim.c.clone());
    let targets: Api<FenceTarget> = Api::all(sim.c.clone());
    let fences: Api<NodeFence> = Api::all(sim.c.clone());
    let post = |kind: &str, name: &str, spec: serde_json::Value| -> Result<(), String> {
        let body = json!({"metadata": {"name": name}, "spec": spec});
        let pp = PostParams::default();
        let r = match kind {
            "policy" => rt
                .block_on(policies.create(&pp, &serde_json::from_value(body).unwrap()))
                .map(drop),
            "target" => rt
                .block_on(targets.create(&pp, &serde_json::from_value(body).unwrap()))
                .map(drop),
            _ => rt
                .block_on(fences.create(&pp, &serde_json::from_value(body).unwrap()))
                .map(drop),
        };
        r.map_err(|e| e.to_string())
    };
    // The API server may take a moment to start calling a new webhook: wait until it refuses
    // what only the webhook can judge on every release (a fence for a node that does not
    // exist).
    let err = eventually(
        "the webhook refuses a fence for a node that does not exist",
        WAIT,
        || match post(
            "fence",
            "ghost",
            json!({"nodeName": "ghost", "reason": "test"}),
        ) {
            Err(e) => Some(e),
            Ok(()) => {
                let _ = rt.block_on(fences.delete("ghost", &Default::default()));
                None
            }
        },
    );
    assert!(
        err.contains("denied the request") && err.contains("no Node named"),
        "{err}"
    );
    // Policies and targets: the webhook runs validate() on every release; on 1.25+ the CRDs'
    // schema and CEL rules refuse these first, with the same reason.
    let cel = server_has_cel(&sim.c, &rt);
    let inverted = json!({"detection": {"suspectAfterSeconds": 50, "unhealthyAfterSeconds": 10}});
    let err = post("policy", "inverted", inverted).expect_err("an inverted policy is refused");
    assert!(err.contains("must exceed"), "{err}");
    assert_eq!(err.contains("denied the request"), !cel, "{err}");
    let secret_ref = json!({"name": "bmc", "namespace": SYSTEM_NS});
    let err = post(
        "target",
        "adm-m0",
        json!({"levels": [{"devices": [{"url": "bridge://127.0.0.1:9443/adm-m0", "kind": "Power",
            "credentialsSecretRef": secret_ref}]}]}),
    )
    .expect_err("a bridge device with a Secret is refused");
    assert!(err.contains("take no credentials"), "{err}");

    // A valid fence (held: no policy covers the node) is admitted; a second one is not.
    post(
        "fence",
        "adm-first",
        json!({"nodeName": "adm-m0", "reason": "test"}),
    )
    .expect("a fence for an existing node is admitted");
    eventually("the controller sees the first fence", WAIT, || {
        rt.block_on(fences.get("adm-first")).ok()?.status.map(drop)
    });
    let err = post(
        "fence",
        "adm-second",
        json!({"nodeName": "adm-m0", "reason": "again"}),
    )
    .expect_err("a second unfinished fence for the node is refused");
    assert!(err.contains("adm-first"), "{err}");
    let err = rt
        .block_on(fences.patch(
            "adm-first",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "other"}})),
        ))
        .expect_err("the spec of a fence never changes");
    // The CRD's CEL rule on 1.25+, the webhook on 1.20.
    let why = if cel {
        "spec cannot change"
    } else {
        "immutable"
    };
    assert!(err.to_string().contains(why), "{err}");
    let denied = |kind: &str| -> u64 {
        ctl.metrics()
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "palisade_admission_denied_total{{kind=\"{kind}\"}} "
                ))
            })
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    // At least one review per refusal above that reached the webhook (the API server may
    // review an update again; on 1.25+ CEL refuses the edit first).
    let fence_refusals = if cel { 2 } else { 3 };
    assert!(denied("NodeFence") >= fence_refusals, "{:?}", ctl.metrics());
    if !cel {
        assert!(denied("FencingPolicy") >= 1 && denied("FenceTarget") >= 1);
    }
    post("policy", "good", json!({})).expect("a valid policy is admitted");

    // The controller goes away: fences fail closed, policies fail open.
    ctl.kill();
    let err = post(
        "fence",
        "adm-unreviewed",
        json!({"nodeName": "adm-m0", "reason": "x"}),
    )
    .expect_err("no NodeFence is created unreviewed");
    assert!(err.contains("nodefences.palisade.dev"), "{err}");
    post(
        "policy",
        "while-down",
        json!({"nodeSelector": {"matchLabels": {"none": "x"}}}),
    )
    .expect("policies stay editable while the controller is down");
}
