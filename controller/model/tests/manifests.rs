//! The install manifests meet the ecosystem's expectations that can be checked without a
//! cluster: the controller's Deployment passes the restricted Pod Security level, and its
//! namespace enforces that level.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;

fn manifest<T: serde::de::DeserializeOwned>(file: &str) -> T {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The restricted level's rules for a pod (Kubernetes Pod Security Standards): non-root,
/// a RuntimeDefault (or Localhost) seccomp profile, no privilege escalation, every capability
/// dropped, no host namespaces, no privileged container.
#[test]
fn the_controller_deployment_meets_the_restricted_pod_security_level() {
    let d: Deployment = manifest("deployment.yaml");
    let pod = d.spec.unwrap().template.spec.unwrap();
    let psc = pod.security_context.clone().unwrap_or_default();
    let seccomp = psc.seccomp_profile.as_ref().map(|p| p.type_.as_str());
    assert!(
        matches!(seccomp, Some("RuntimeDefault" | "Localhost")),
        "{seccomp:?}"
    );
    assert!(!pod.host_network.unwrap_or(false) && !pod.host_pid.unwrap_or(false));
    assert!(!pod.host_ipc.unwrap_or(false));
    for c in &pod.containers {
        let sc = c.security_context.clone().unwrap_or_default();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert!(!sc.privileged.unwrap_or(false), "{}", c.name);
        assert!(
            sc.run_as_non_root.or(psc.run_as_non_root) == Some(true),
            "{} runs as non-root",
            c.name
        );
        let drop = sc.capabilities.and_then(|c| c.drop).unwrap_or_default();
        assert!(
            drop.iter().any(|d| d == "ALL"),
            "{} drops every capability",
            c.name
        );
    }
}

#[test]
fn the_controller_namespace_enforces_the_restricted_level() {
    let ns: Namespace = manifest("namespace.yaml");
    let labels = ns.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted")
    );
}
