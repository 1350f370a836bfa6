//! A server that refuses the CRDs' CEL rules does not stop the controller. Run against the
//! 1.20 API server with `--crd-cel always`, the controller's server-side apply of the CRDs with
//! their rules is refused (1.20 does not know `x-kubernetes-validations`): the refusal is
//! logged with the server's own words, the CRDs are applied without the rules, and the
//! controller goes on (it and its webhook run the same rules, so no check is lost).

mod common;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use palisade_lab::KubeVersion;

#[test]
fn cel_rules_a_server_refuses_are_logged_in_its_words_and_the_controller_goes_on() {
    let lab = common::control_plane_lab(KubeVersion::V1_20);
    let rt = rt();
    let c = client(&lab, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    let cp = lab.control_plane().expect("control plane");
    let ctl = start_controller_as(
        &lab,
        "ctl-crd-cel",
        cp.admin_kubeconfig(),
        &[],
        &["--crd-cel".into(), "always".into()],
    );
    ctl.wait_ticks(2);
    let log = ctl.log_text();
    // The server's answer spans several lines of the log entry.
    let at = log
        .find("refused the CRDs with their CEL rules")
        .unwrap_or_else(|| panic!("the refusal is logged:\n{log}"));
    let refusal: String = log[at..].lines().take(12).collect::<Vec<_>>().join("\n");
    assert!(
        refusal.contains("x-kubernetes-validations"),
        "in the server's words: {refusal}"
    );
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    let policy = rt
        .block_on(crds.get("fencingpolicies.palisade.dev"))
        .expect("the CRD is installed");
    let text = serde_json::to_string(&policy.spec).unwrap();
    assert!(
        !text.contains("x-kubernetes-validations"),
        "without the rules"
    );
}
