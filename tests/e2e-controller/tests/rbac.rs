//! The controller's ServiceAccount may do what a reviewed list says, and nothing more.
//!
//! `kubectl auth can-i --list` is a SelfSubjectRulesReview; this test asks the real API server
//! the same, with `controller/manifests/rbac.yaml` applied as shipped, once as the
//! ServiceAccount and once as a user bound to nothing, in the controller's namespace and in
//! another. What the ServiceAccount may do beyond that unbound user must be exactly the
//! reviewed list below, so widening the manifest (or narrowing it) fails here until the list
//! is reviewed too. That these permissions *suffice* is proven by the tests that run the
//! controller as this ServiceAccount (`config_status`, `headline`).

mod common;

use std::collections::BTreeSet;

use common::*;

/// Cluster-wide: `verb group/resource[:name]` (`core` for the core group).
const CLUSTER: &[&str] = &[
    "create apiextensions.k8s.io/customresourcedefinitions",
    "get apiextensions.k8s.io/customresourcedefinitions:fencetargets.palisade.dev",
    "get apiextensions.k8s.io/customresourcedefinitions:fencingpolicies.palisade.dev",
    "get apiextensions.k8s.io/customresourcedefinitions:nodefences.palisade.dev",
    "patch apiextensions.k8s.io/customresourcedefinitions:fencetargets.palisade.dev",
    "patch apiextensions.k8s.io/customresourcedefinitions:fencingpolicies.palisade.dev",
    "patch apiextensions.k8s.io/customresourcedefinitions:nodefences.palisade.dev",
    "get coordination.k8s.io/leases",
    "list coordination.k8s.io/leases",
    "watch coordination.k8s.io/leases",
    "create core/events",
    "patch core/events",
    "get core/nodes",
    "list core/nodes",
    "update core/nodes",
    "watch core/nodes",
    "get core/nodes/status",
    "update core/nodes/status",
    "get core/persistentvolumeclaims",
    "list core/persistentvolumeclaims",
    "watch core/persistentvolumeclaims",
    "get core/persistentvolumes",
    "delete core/pods",
    "get core/pods",
    "list core/pods",
    "watch core/pods",
    "patch core/pods/status",
    "get palisade.dev/fencetargets",
    "list palisade.dev/fencetargets",
    "watch palisade.dev/fencetargets",
    "patch palisade.dev/fencetargets/status",
    "get palisade.dev/fencingpolicies",
    "list palisade.dev/fencingpolicies",
    "watch palisade.dev/fencingpolicies",
    "patch palisade.dev/fencingpolicies/status",
    "create palisade.dev/nodefences",
    "get palisade.dev/nodefences",
    "list palisade.dev/nodefences",
    "patch palisade.dev/nodefences",
    "watch palisade.dev/nodefences",
    "get palisade.dev/nodefences/status",
    "update palisade.dev/nodefences/status",
    "get policy/poddisruptionbudgets",
    "list policy/poddisruptionbudgets",
    "watch policy/poddisruptionbudgets",
    "delete storage.k8s.io/volumeattachments",
    "get storage.k8s.io/volumeattachments",
    "list storage.k8s.io/volumeattachments",
    "watch storage.k8s.io/volumeattachments",
];

/// In the controller's namespace only: its leader-election Lease and the device Secrets.
const IN_SYSTEM_NS: &[&str] = &[
    "create coordination.k8s.io/leases",
    "get coordination.k8s.io/leases:palisade-controller",
    "update coordination.k8s.io/leases:palisade-controller",
    "get core/secrets",
];

fn diff(a: &BTreeSet<String>, b: &BTreeSet<String>) -> Vec<String> {
    a.difference(b).cloned().collect()
}

#[test]
fn the_service_account_may_do_exactly_the_reviewed_list() {
    let lab = common::sim::bare_lab(0);
    let rt = rt();
    let admin = client(&lab, &rt);
    namespace(&admin, &rt, SYSTEM_NS);
    namespace(&admin, &rt, "rbac-other");
    apply_rbac(&admin, &rt);
    let as_user = |user: &str, file: &str| {
        let path = kubeconfig_as(&lab, user, file);
        rt.block_on(palisade_lab::client_from_kubeconfig(&path))
            .expect("client")
    };
    let sa = as_user(CONTROLLER_SA, "controller-sa");
    let nobody = as_user("palisade-rbac-nobody", "nobody");

    let cluster: BTreeSet<String> = CLUSTER.iter().map(|s| s.to_string()).collect();
    let in_system: BTreeSet<String> = cluster
        .iter()
        .cloned()
        .chain(IN_SYSTEM_NS.iter().map(|s| s.to_string()))
        .collect();
    for (ns, want) in [(SYSTEM_NS, &in_system), ("rbac-other", &cluster)] {
        let base = rules_review(&nobody, &rt, ns);
        let granted: BTreeSet<String> = rules_review(&sa, &rt, ns)
            .difference(&base)
            .cloned()
            .collect();
        assert!(
            !granted.is_empty() && base.iter().any(|r| r.contains("selfsubjectrulesreviews")),
            "the review sees the bindings and the unbound user's own rights"
        );
        assert_eq!(
            (diff(&granted, want), diff(want, &granted)),
            (vec![], vec![]),
            "in namespace {ns}: (granted but not reviewed, reviewed but not granted)"
        );
    }
}
