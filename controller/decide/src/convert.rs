//! Pure conversions from Kubernetes objects (as the I/O controller's caches hold them) to the
//! plain snapshot types [`crate::decide::decide`] reads. No client, no I/O: the caller passes
//! the objects it already has.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::fmt::strtime;

use crate::detector::Heartbeat;
use palisade_model::advertise::Advertisement;

use crate::snapshot::{Exclusion, PdbSnapshot, PodSnapshot, Tolerance, TolerationSnapshot};

/// The heartbeat markers of a node: its Lease `renewTime` and its Ready condition's
/// `lastHeartbeatTime`, as opaque strings (compared only for change; never as times).
pub fn heartbeat(node: &Node, lease: Option<&Lease>) -> Heartbeat {
    let fmt = |t: k8s_openapi::jiff::Timestamp| {
        strtime::format("%Y-%m-%dT%H:%M:%S%.fZ", t).unwrap_or_default()
    };
    Heartbeat {
        lease_renew_time: lease
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| fmt(t.0)),
        ready_heartbeat: node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .map(|t| fmt(t.0)),
    }
}

/// The node's labels and exclusion, from its metadata. (A self-fence advertisement on the Node
/// object is ignored: only the one on the Lease, written with every renewal, counts; see
/// [`advertisement`].)
pub fn node_facts(node: &Node) -> (BTreeMap<String, String>, Option<Exclusion>) {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    (labels, Exclusion::from_annotations(&annotations))
}

/// The agent's advertisement carried by its Lease (the one written with its latest renewal).
pub fn advertisement(lease: Option<&Lease>) -> Advertisement {
    lease
        .and_then(|l| l.metadata.annotations.as_ref())
        .map(Advertisement::from_annotations)
        .unwrap_or_default()
}

/// Whether the pod has finished (phase Succeeded or Failed): such pods hold nothing and are
/// left out of snapshots.
pub fn pod_is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether a claim is ReadWriteOnce or ReadWriteOncePod (from its status once bound, else spec).
pub fn claim_is_rwo(pvc: &PersistentVolumeClaim) -> bool {
    let modes = pvc
        .status
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .or_else(|| pvc.spec.as_ref().and_then(|s| s.access_modes.as_ref()));
    modes.is_some_and(|m| {
        m.iter()
            .any(|a| a == "ReadWriteOnce" || a == "ReadWriteOncePod")
    })
}

/// The pod as the decision sees it. `claim_is_rwo(namespace, claim_name)` answers from the
/// caller's PVC cache (see [`claim_is_rwo`]); an unknown claim should answer `true` (fail safe:
/// treat the pod as stateful).
pub fn pod_snapshot(pod: &Pod, claim_is_rwo: impl Fn(&str, &str) -> bool) -> PodSnapshot {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let tolerations: Vec<TolerationSnapshot> = spec
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .map(|t| TolerationSnapshot {
            key: t.key.clone().unwrap_or_default(),
            operator: t.operator.clone().unwrap_or_else(|| "Equal".into()),
            effect: t.effect.clone().unwrap_or_default(),
            toleration_seconds: t.toleration_seconds,
        })
        .collect();
    let uses_rwo_volume = spec
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .any(|c| claim_is_rwo(&namespace, &c.claim_name));
    PodSnapshot {
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace,
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        unreachable: Tolerance::from_tolerations(&tolerations),
        uses_rwo_volume,
    }
}

/// A policy/v1 PDB. In policy/v1 an empty selector selects every pod in the namespace.
pub fn pdb_v1(pdb: &PodDisruptionBudget) -> PdbSnapshot {
    pdb_parts(
        pdb.metadata.namespace.clone().unwrap_or_default(),
        pdb.metadata.name.clone().unwrap_or_default(),
        pdb.spec.as_ref().and_then(|s| s.selector.clone()),
        pdb.status
            .as_ref()
            .filter(|s| s.observed_generation >= pdb.metadata.generation)
            .map(|s| s.disruptions_allowed),
        false,
    )
}

/// A PDB from its parts, for policy/v1beta1 (read as a dynamic object on 1.20) or v1.
/// In v1beta1 an empty (or missing) selector selects no pod; in v1 an empty selector selects
/// every pod of the namespace and a missing one selects none.
pub fn pdb_parts(
    namespace: String,
    name: String,
    selector: Option<LabelSelector>,
    disruptions_allowed: Option<i32>,
    v1beta1: bool,
) -> PdbSnapshot {
    let empty = |s: &LabelSelector| {
        s.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
            && s.match_expressions.as_ref().is_none_or(Vec::is_empty)
    };
    let selector = match selector {
        Some(s) if v1beta1 && empty(&s) => None,
        other => other,
    };
    PdbSnapshot {
        namespace,
        name,
        selector,
        disruptions_allowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{
        NodeCondition, NodeStatus, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
        PodSpec, PodStatus, Toleration, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use std::time::Duration;

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    #[test]
    fn heartbeat_reads_lease_and_ready_condition() {
        let node = Node {
            status: Some(NodeStatus {
                conditions: Some(vec![
                    NodeCondition {
                        type_: "MemoryPressure".into(),
                        status: "False".into(),
                        last_heartbeat_time: Some(Time(ts(0))),
                        ..Default::default()
                    },
                    NodeCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_heartbeat_time: Some(Time(ts(5000))),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let lease = Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(ts(1234))),
                ..Default::default()
            }),
            ..Default::default()
        };
        let a = heartbeat(&node, Some(&lease));
        assert_eq!(a.ready_heartbeat.as_deref(), Some("2027-01-15T08:00:05Z"));
        assert_eq!(
            a.lease_renew_time.as_deref(),
            Some("2027-01-15T08:00:01.234Z")
        );
        // A renewal 1 ms later is a change.
        let later = Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(ts(1235))),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_ne!(heartbeat(&node, Some(&later)), a);
        assert_eq!(heartbeat(&Node::default(), None), Heartbeat::default());
    }

    #[test]
    fn node_facts_read_annotations() {
        let node = Node {
            metadata: ObjectMeta {
                labels: Some([("topology.kubernetes.io/zone".to_string(), "a".to_string())].into()),
                annotations: Some(
                    [
                        ("palisade.dev/maintenance".to_string(), "".to_string()),
                        (
                            "palisade.dev/self-fence-after-seconds".to_string(),
                            "12".to_string(),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        let (labels, ex) = node_facts(&node);
        assert_eq!(labels["topology.kubernetes.io/zone"], "a");
        assert_eq!(ex, Some(Exclusion::Maintenance));
        // The sticky Node annotation earns nothing: only the Lease's advertisement counts.
        let lease = Lease {
            metadata: ObjectMeta {
                annotations: node.metadata.annotations.clone(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            advertisement(Some(&lease)).self_fence_after,
            Some(Duration::from_secs(12))
        );
        assert_eq!(advertisement(None), Advertisement::default());
    }

    fn pod_with(volumes: &[&str], tolerations: Vec<Toleration>, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("db-0".into()),
                namespace: Some("db".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                priority: Some(1000),
                tolerations: Some(tolerations),
                volumes: Some(
                    volumes
                        .iter()
                        .map(|c| Volume {
                            name: format!("v-{c}"),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: (*c).into(),
                                read_only: None,
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn pod_snapshot_reads_priority_tolerations_and_rwo_claims() {
        let tol = Toleration {
            key: Some("node.kubernetes.io/unreachable".into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(7),
            ..Default::default()
        };
        let pod = pod_with(&["data", "shared"], vec![tol], "Running");
        let s = pod_snapshot(&pod, |ns, claim| ns == "db" && claim == "data");
        assert_eq!(
            (s.namespace.as_str(), s.name.as_str(), s.priority),
            ("db", "db-0", 1000)
        );
        assert_eq!(s.unreachable, Tolerance::For(Duration::from_secs(7)));
        assert!(s.uses_rwo_volume);
        let s = pod_snapshot(&pod, |_, claim| claim == "other");
        assert!(!s.uses_rwo_volume);
        assert!(!pod_is_terminal(&pod));
        assert!(pod_is_terminal(&pod_with(&[], vec![], "Succeeded")));
        assert_eq!(
            pod_snapshot(&pod_with(&[], vec![], "Running"), |_, _| true).unreachable,
            Tolerance::None
        );
    }

    #[test]
    fn claim_access_modes() {
        let pvc = |spec: &[&str], status: Option<&[&str]>| PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(spec.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            }),
            status: status.map(
                |st| k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
                    access_modes: Some(st.iter().map(|s| s.to_string()).collect()),
                    ..Default::default()
                },
            ),
            ..Default::default()
        };
        assert!(claim_is_rwo(&pvc(&["ReadWriteOnce"], None)));
        assert!(claim_is_rwo(&pvc(&["ReadWriteOncePod"], None)));
        assert!(!claim_is_rwo(&pvc(&["ReadWriteMany"], None)));
        assert!(!claim_is_rwo(&pvc(
            &["ReadWriteOnce"],
            Some(&["ReadOnlyMany"])
        )));
    }

    #[test]
    fn pdb_empty_selector_semantics_differ_by_version() {
        let empty = Some(LabelSelector::default());
        assert_eq!(
            pdb_parts("ns".into(), "a".into(), empty.clone(), Some(0), true).selector,
            None
        );
        assert_eq!(
            pdb_parts("ns".into(), "a".into(), empty.clone(), Some(0), false).selector,
            empty
        );
        assert_eq!(
            pdb_parts("ns".into(), "a".into(), None, Some(0), false).selector,
            None
        );
        let pdb = PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(Default::default()),
            status: Some(k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus {
                disruptions_allowed: 0,
                ..Default::default()
            }),
        };
        let s = pdb_v1(&pdb);
        assert_eq!(
            (s.namespace.as_str(), s.name.as_str(), s.disruptions_allowed),
            ("ns", "p", Some(0))
        );
        // Edited (generation 2) but the status is of generation 1: not known yet.
        let mut stale = pdb.clone();
        stale.metadata.generation = Some(2);
        stale.status.as_mut().unwrap().observed_generation = Some(1);
        assert_eq!(pdb_v1(&stale).disruptions_allowed, None);
        stale.status = None;
        assert_eq!(pdb_v1(&stale).disruptions_allowed, None);
    }
}
