//! Palisade's resource types: the `palisade.dev/v1alpha1` custom resources, with no I/O.
//!
//! - [`policy`]: `FencingPolicy`, the operator's rules (detection thresholds, quorum and storm
//!   limits, forgiveness, PDB urgency, the self-fence trust rule, recovery, cooldown), with
//!   documented defaults and [`policy::FencingPolicySpec::validate`].
//! - [`target`]: `FenceTarget`, one node's ordered fencing levels and devices.
//! - [`acceptance`]: the status of policies and targets (`Accepted`, problems, covered nodes,
//!   overlaps), written by the controller as soon as they change;
//! - [`nodefence`]: `NodeFence`, one fencing operation, whose status is the persisted state
//!   machine (an explicit [`nodefence::Phase`] with budgets, evidence, attempts, the fencing
//!   token, what was released and a timestamp per transition).
//!
//! The CRDs are generated from these types ([`crds`], [`crds_yaml`], the `crdgen` binary) and
//! kept structural so that a 1.20 API server accepts them; [`crds_for`] adds the [`cel`] rules
//! for the API servers that evaluate them (1.25+). The decision logic that reads these
//! types lives in `palisade-decide`; the controller that does I/O depends on both.

pub mod acceptance;
pub mod advertise;
pub mod cel;
#[cfg(feature = "test-cases")]
#[doc(hidden)]
pub mod cel_cases;
pub mod duration;
pub mod identity;
pub mod nodefence;
pub mod policy;
pub mod reference;
pub mod target;

pub use nodefence::{NodeFence, NodeFenceSpec, NodeFenceStatus, Phase};
pub use policy::{FencingPolicy, FencingPolicySpec};
pub use target::{FenceTarget, FenceTargetSpec};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;

/// The API group of every Palisade resource.
pub const GROUP: &str = "palisade.dev";
/// The API version of every Palisade resource.
pub const VERSION: &str = "v1alpha1";

/// Node annotation: the node opts out of fencing (value `"true"`).
pub const ANNOTATION_EXCLUDE: &str = "palisade.dev/exclude";
/// Node annotation: the node is under maintenance (any value); it is not fenced.
pub const ANNOTATION_MAINTENANCE: &str = "palisade.dev/maintenance";
/// The self-fence timeout annotation. It is read only from the node's Lease, where the agent
/// writes it with every renewal ([`advertise`]); a Node annotation of this name is ignored.
pub const ANNOTATION_SELF_FENCE_AFTER: &str = advertise::SELF_FENCE_AFTER;
/// The taint applied to a fenced node before its pods are released, when the fence covers
/// every pod on it.
pub const OUT_OF_SERVICE_TAINT_KEY: &str = "node.kubernetes.io/out-of-service";
/// The `NoSchedule` taint applied to every fenced node before its pods are released (so their
/// replacements are scheduled elsewhere), and removed with the out-of-service taint.
pub const FENCED_TAINT_KEY: &str = "palisade.dev/fenced";
/// The finalizer every NodeFence carries from the moment it starts fencing until it holds
/// nothing on its node any more ([`nodefence::NodeFenceStatus::holds_node`]): deleting a fence
/// that still holds a storage block, release taints or released pods waits for its recovery,
/// so the record of what it released is never lost.
pub const NODEFENCE_FINALIZER: &str = "palisade.dev/holds-node";
/// Value of the out-of-service taint.
pub const OUT_OF_SERVICE_TAINT_VALUE: &str = "nodeshutdown";
/// Taint key whose `tolerationSeconds` gives pod forgiveness.
pub const UNREACHABLE_TAINT_KEY: &str = "node.kubernetes.io/unreachable";
/// Pod condition type set on the pods of a node the controller sees silent (Suspect or
/// Unhealthy), with `status.reason` `NodeSilent` so `kubectl get pods` shows it; cleared when
/// the node renews again.
pub const POD_CONDITION_NODE_SILENT: &str = "palisade.dev/NodeSilent";
/// Pod condition type set on pods released by Palisade.
pub const POD_CONDITION_FENCED: &str = "palisade.dev/Fenced";

/// Every Palisade CRD, in a stable order, as every supported API server (1.20+) accepts it:
/// no CEL rules.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![FencingPolicy::crd(), FenceTarget::crd(), NodeFence::crd()]
}

/// The first Kubernetes minor version (of 1.x) whose API server evaluates CEL rules
/// (`x-kubernetes-validations`, beta and on by default in 1.25).
pub const CEL_MINOR: u32 = 25;

/// The CRDs for an API server of version 1.`minor`: [`crds`], plus the [`cel`] rules from
/// 1.25 on.
///
/// *Guarantees:* never emits `x-kubernetes-validations` for a server older than 1.25 (whose
/// server-side apply would refuse the whole CRD).
pub fn crds_for(minor: u32) -> Vec<CustomResourceDefinition> {
    let mut crds = crds();
    if minor >= CEL_MINOR {
        crds.iter_mut().for_each(cel::add_rules);
    }
    crds
}

/// The minor version in a `/version` answer's `minor` field: digits, possibly followed by a
/// vendor suffix (`"25+"` on several managed clusters). `None` if it does not start with one.
pub fn parse_minor(minor: &str) -> Option<u32> {
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The CRDs as one multi-document YAML stream: with `cel`, the rules for 1.25+
/// (`controller/manifests/crds-cel.yaml`), else what every version accepts
/// (`controller/manifests/crds.yaml`). `crdgen [--cel]` prints it.
pub fn crds_yaml(cel: bool) -> Result<String, serde_saphyr::ser::Error> {
    let (crds, command) = if cel {
        (crds_for(CEL_MINOR), "crdgen --cel")
    } else {
        (crds(), "crdgen")
    };
    let mut out =
        format!("# Generated by `cargo run -p palisade-model --bin {command}`; do not edit.\n");
    if cel {
        out.push_str("# For Kubernetes 1.25 and later: crds.yaml plus CEL rules (x-kubernetes-validations).\n");
    }
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}
