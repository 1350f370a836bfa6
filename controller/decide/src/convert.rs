//! Pure conversions from Kubernetes objects (as the I/O controller's caches hold them) to the
//! plain snapshot types [`crate::decide::decide`] reads. No client, no I/O: the caller passes
//! the objects it already has.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::detector::Heartbeat;
use palisade_model::advertise::Advertisement;

use crate::snapshot::{Exclusion, PdbSnapshot, PodSnapshot, Tolerance, TolerationSnapshot};

/// The heartbeat markers of a node, as opaque strings (compared only for change; never as
/// times).
///
/// Only the node's own writes count as life. The node lifecycle controller rewrites the Ready
/// condition of a silent node (status `Unknown` after its grace period), so when the node has
/// a Lease with a `renewTime`, the Lease alone is the heartbeat and the Ready condition is
/// ignored entirely. Without one, the Ready condition's `lastHeartbeatTime` (which the
/// lifecycle controller preserves when it marks the node `Unknown`) is the marker, whatever
/// the condition's status.
///
/// A companion beside a stock kubelet writes on the kubelet's Lease too: its write stamp
/// ([`palisade_model::advertise::COMPANION_WRITTEN`]) is part of the marker, because its
/// self-fence is timed from its own last write, which may follow the kubelet's last renewal;
/// the companion stops writing once the kubelet's renewals stop.
///
/// Guarantees: a change of the Ready condition made by anyone but the node itself never
/// changes the marker of a node that has a Lease. Assumptions: the Lease passed is the node's
/// own (namespace `kube-node-lease`, named after the node), read from the same cache on every
/// tick; the marker strings are persisted, so their format must stay stable.
pub fn heartbeat(node: &Node, lease: Option<&Lease>) -> Heartbeat {
    let lease_renew_time = lease
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0.to_string());
    if lease_renew_time.is_some() {
        return Heartbeat {
            lease_renew_time,
            ready_heartbeat: None,
            companion_written: lease
                .and_then(|l| l.metadata.annotations.as_ref())
                .and_then(|a| a.get(palisade_model::advertise::COMPANION_WRITTEN))
                .cloned(),
        };
    }
    Heartbeat {
        lease_renew_time: None,
        companion_written: None,
        ready_heartbeat: node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .map(|t| t.0.to_string()),
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

/// The agent's advertisement carried by its Lease (the one written with its latest renewal),
/// judged with `node` when a companion wrote it: a companion's self-fence promise that is not
/// current ([`Advertisement::companion_current`], against the Lease's `renewTime` and the
/// Node's reported boot ID) is marked stale and earns no trust.
pub fn advertisement(lease: Option<&Lease>, node: Option<&Node>) -> Advertisement {
    let Some(lease) = lease else {
        return Advertisement::default();
    };
    let mut ad = lease
        .metadata
        .annotations
        .as_ref()
        .map(Advertisement::from_annotations)
        .unwrap_or_default();
    let renew_time = lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0);
    let boot_id = node
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.as_str());
    ad.companion_stale = ad.companion_current(renew_time, boot_id).err();
    ad
}

/// Whether the pod has finished (phase Succeeded or Failed): such pods hold nothing and are
/// left out of snapshots.
pub fn pod_is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether a claim may be written by one node only (ReadWriteOnce or ReadWriteOncePod), which
/// makes the pods mounting it stateful: they need a fence that covers storage users.
///
/// The access modes are read from the status once the claim is bound (what the volume
/// actually grants), else from the spec (what was asked for).
///
/// Guarantees (fail safe): a claim whose access modes cannot be read (neither status nor spec
/// lists any) counts as `true`, stateful.
pub fn claim_is_rwo(pvc: &PersistentVolumeClaim) -> bool {
    let modes = pvc
        .status
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .filter(|m| !m.is_empty())
        .or_else(|| {
            pvc.spec
                .as_ref()
                .and_then(|s| s.access_modes.as_ref())
                .filter(|m| !m.is_empty())
        });
    modes.is_none_or(|m| {
        m.iter()
            .any(|a| a == "ReadWriteOnce" || a == "ReadWriteOncePod")
    })
}

/// The pod as the decision sees it.
///
/// `find_claim(namespace, claim_name)` answers from the caller's PVC cache.
///
/// Guarantees (fail safe): the pod counts as using a single-writer volume
/// (`uses_rwo_volume`, stateful) if any of its claims is ReadWriteOnce or ReadWriteOncePod
/// (see [`claim_is_rwo`]), *or is unknown* (`find_claim` returns `None`: not yet in the
/// cache, deleted, or unreadable). A stateful pod is released only after a fence that covers
/// storage users, so a wrong "stateful" can only delay a release, never cause a second writer.
pub fn pod_snapshot<C>(pod: &Pod, find_claim: impl Fn(&str, &str) -> Option<C>) -> PodSnapshot
where
    C: std::ops::Deref<Target = PersistentVolumeClaim>,
{
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
        .any(|c| find_claim(&namespace, &c.claim_name).is_none_or(|pvc| claim_is_rwo(&pvc)));
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
        NodeCondition, NodeStatus, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeClaimVolumeSource, PodSpec, PodStatus, Toleration, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use palisade_model::advertise::Distrust;
    use std::time::Duration;

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    fn node_ready(status: &str, heartbeat_ms: i64) -> Node {
        Node {
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
                        status: status.into(),
                        last_heartbeat_time: Some(Time(ts(heartbeat_ms))),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn lease_renewed(ms: Option<i64>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                renew_time: ms.map(|ms| MicroTime(ts(ms))),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn heartbeat_is_the_lease_alone_when_there_is_one_else_the_ready_heartbeat() {
        let l = |ms| Some(lease_renewed(Some(ms)));
        // (node, lease, expected lease marker, expected ready marker)
        type Row = (
            Node,
            Option<Lease>,
            Option<&'static str>,
            Option<&'static str>,
        );
        let table: Vec<Row> = vec![
            // A Lease: the Ready condition is ignored entirely, whatever its status.
            (
                node_ready("True", 5000),
                l(1234),
                Some("2027-01-15T08:00:01.234Z"),
                None,
            ),
            (
                node_ready("Unknown", 9000),
                l(1234),
                Some("2027-01-15T08:00:01.234Z"),
                None,
            ),
            (Node::default(), l(0), Some("2027-01-15T08:00:00Z"), None),
            // No Lease (or one never renewed): the Ready condition's lastHeartbeatTime.
            (
                node_ready("True", 5000),
                None,
                None,
                Some("2027-01-15T08:00:05Z"),
            ),
            (
                node_ready("Unknown", 5000),
                Some(lease_renewed(None)),
                None,
                Some("2027-01-15T08:00:05Z"),
            ),
            (Node::default(), None, None, None),
        ];
        for (i, (node, lease, renew, ready)) in table.iter().enumerate() {
            let hb = heartbeat(node, lease.as_ref());
            assert_eq!(hb.lease_renew_time.as_deref(), *renew, "row {i}");
            assert_eq!(hb.ready_heartbeat.as_deref(), *ready, "row {i}");
        }
    }

    #[test]
    fn lifecycle_controller_marking_ready_unknown_is_not_a_heartbeat() {
        let lease = lease_renewed(Some(1234));
        // The lifecycle controller flips Ready to Unknown and stamps a new transition: with a
        // Lease, the marker does not move.
        assert_eq!(
            heartbeat(&node_ready("True", 5000), Some(&lease)),
            heartbeat(&node_ready("Unknown", 7000), Some(&lease))
        );
        // Without a Lease, it preserves lastHeartbeatTime: the status alone is no change.
        assert_eq!(
            heartbeat(&node_ready("True", 5000), None),
            heartbeat(&node_ready("Unknown", 5000), None)
        );
        // A renewal 1 ms later is a change.
        assert_ne!(
            heartbeat(&Node::default(), Some(&lease_renewed(Some(1235)))),
            heartbeat(&Node::default(), Some(&lease))
        );
    }

    /// A companion's Lease: the kubelet renewed at `renew_ms`, the companion wrote at
    /// `stamp_ms` on boot `boot`, promising a self-fence with a 10 s watchdog.
    fn companion_lease(renew_ms: i64, stamp_ms: Option<i64>, boot: &str) -> Lease {
        use palisade_model::advertise as a;
        let mut annotations: BTreeMap<String, String> = [
            (a::SELF_FENCE_AFTER, "30"),
            (a::WATCHDOG_TIMEOUT, "10"),
            (a::WATCHDOG_NOWAYOUT, "true"),
            (a::WATCHDOG_ACTION, "reset"),
            (a::VIRTUALIZATION, "none"),
            (a::SELF_FENCE_SCOPE, "all"),
            (a::RUNTIME_SOURCE, "cri"),
            (a::BOOT_ID, boot),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(ms) = stamp_ms {
            annotations.insert(a::COMPANION_WRITTEN.into(), ts(ms).to_string());
        }
        Lease {
            metadata: ObjectMeta {
                annotations: Some(annotations),
                ..Default::default()
            },
            ..lease_renewed(Some(renew_ms))
        }
    }

    fn booted(boot: &str) -> Node {
        Node {
            status: Some(NodeStatus {
                node_info: Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                    boot_id: boot.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_companions_stamp_is_the_nodes_write() {
        let node = Node::default();
        let a = heartbeat(&node, Some(&companion_lease(1000, Some(1500), "b")));
        let b = heartbeat(&node, Some(&companion_lease(1000, Some(2500), "b")));
        assert_ne!(
            a.marker(),
            b.marker(),
            "a companion write alone moves the marker"
        );
        // Without a companion, the marker is what earlier versions persisted.
        assert_eq!(
            heartbeat(&node, Some(&lease_renewed(Some(1000)))).marker(),
            format!("lease={};ready=-", ts(1000))
        );
    }

    #[test]
    fn a_companions_promise_is_trusted_only_while_current() {
        let trust = |lease: &Lease, node: &Node| {
            advertisement(Some(lease), Some(node)).trust(Duration::ZERO, Default::default())
        };
        let b = booted("b");
        // Written 1 s before the kubelet's renewal, on the Node's boot: 30 s + 2 x 10 s.
        assert_eq!(
            trust(&companion_lease(10_000, Some(9_000), "b"), &b),
            Ok(Duration::from_secs(50))
        );
        // Written after the kubelet's last renewal (a kubelet hung, the companion not yet
        // stopped): current.
        assert!(trust(&companion_lease(10_000, Some(14_000), "b"), &b).is_ok());
        // Half the watchdog timeout behind is the bound; past it, a companion that stopped.
        assert!(trust(&companion_lease(10_000, Some(5_000), "b"), &b).is_ok());
        let stale = trust(&companion_lease(10_000, Some(4_999), "b"), &b);
        assert!(
            matches!(&stale, Err(Distrust::CompanionNotCurrent { why }) if why.contains("before the kubelet's renewal")),
            "{stale:?}"
        );
        // Another boot than the Node reports: the machine restarted since the companion wrote.
        let other = trust(&companion_lease(10_000, Some(9_000), "b"), &booted("c"));
        assert!(
            matches!(&other, Err(Distrust::CompanionNotCurrent { why }) if why.contains("boot")),
            "{other:?}"
        );
        // No stamp at all.
        assert!(matches!(
            trust(&companion_lease(10_000, None, "b"), &b),
            Err(Distrust::CompanionNotCurrent { .. })
        ));
        // The node agent's promise (no runtime source) needs no stamp.
        let mut agent = companion_lease(10_000, None, "b");
        agent
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(palisade_model::advertise::RUNTIME_SOURCE);
        assert!(trust(&agent, &b).is_ok());
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
            advertisement(Some(&lease), None).self_fence_after,
            Some(Duration::from_secs(12))
        );
        assert_eq!(advertisement(None, None), Advertisement::default());
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

    fn pvc(spec: Option<&[&str]>, status: Option<&[&str]>) -> PersistentVolumeClaim {
        let modes = |m: &[&str]| Some(m.iter().map(|s| s.to_string()).collect());
        PersistentVolumeClaim {
            spec: spec.map(|m| PersistentVolumeClaimSpec {
                access_modes: modes(m),
                ..Default::default()
            }),
            status: status.map(|m| PersistentVolumeClaimStatus {
                access_modes: modes(m),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pod_snapshot_reads_priority_and_tolerations() {
        let tol = Toleration {
            key: Some("node.kubernetes.io/unreachable".into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(7),
            ..Default::default()
        };
        let pod = pod_with(&[], vec![tol], "Running");
        let s = pod_snapshot(&pod, |_, _| None::<&PersistentVolumeClaim>);
        assert_eq!(
            (s.namespace.as_str(), s.name.as_str(), s.priority),
            ("db", "db-0", 1000)
        );
        assert_eq!(s.unreachable, Tolerance::For(Duration::from_secs(7)));
        assert!(!s.uses_rwo_volume, "no claim: stateless");
        assert!(!pod_is_terminal(&pod));
        assert!(pod_is_terminal(&pod_with(&[], vec![], "Succeeded")));
        assert!(pod_is_terminal(&pod_with(&[], vec![], "Failed")));
        assert_eq!(
            pod_snapshot(&pod_with(&[], vec![], "Running"), |_, _| None::<
                &PersistentVolumeClaim,
            >)
            .unreachable,
            Tolerance::None
        );
    }

    #[test]
    fn a_pod_is_stateful_if_any_claim_is_single_writer_or_unknown() {
        let rwo = pvc(Some(&["ReadWriteOnce"]), None);
        let rwx = pvc(Some(&["ReadWriteMany"]), None);
        // (claims of the pod, claims in the cache (namespace db), stateful?)
        type Cache<'a> = Vec<(&'a str, &'a PersistentVolumeClaim)>;
        let table: Vec<(&[&str], Cache, bool)> = vec![
            (&[], vec![], false),
            (&["data"], vec![("data", &rwo)], true),
            (&["shared"], vec![("shared", &rwx)], false),
            (
                &["data", "shared"],
                vec![("data", &rwo), ("shared", &rwx)],
                true,
            ),
            // Fail safe: a claim missing from the cache counts as stateful.
            (&["gone"], vec![], true),
            (&["shared", "gone"], vec![("shared", &rwx)], true),
        ];
        for (i, (claims, cache, stateful)) in table.into_iter().enumerate() {
            let pod = pod_with(claims, vec![], "Running");
            let s = pod_snapshot(&pod, |ns, name| {
                assert_eq!(ns, "db", "claims are looked up in the pod's namespace");
                cache.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
            });
            assert_eq!(s.uses_rwo_volume, stateful, "row {i}: {claims:?}");
        }
    }

    #[test]
    fn claim_access_modes_come_from_status_then_spec_and_unknown_is_single_writer() {
        // (spec modes, status modes, single writer?)
        type Modes = Option<&'static [&'static str]>;
        let table: &[(Modes, Modes, bool)] = &[
            (Some(&["ReadWriteOnce"]), None, true),
            (Some(&["ReadWriteOncePod"]), None, true),
            (Some(&["ReadWriteMany"]), None, false),
            (Some(&["ReadOnlyMany", "ReadWriteOnce"]), None, true),
            // Bound: the status (what the volume grants) wins over the spec.
            (Some(&["ReadWriteOnce"]), Some(&["ReadOnlyMany"]), false),
            (Some(&["ReadWriteMany"]), Some(&["ReadWriteOnce"]), true),
            // An empty status list is not an answer: fall back to the spec.
            (Some(&["ReadWriteMany"]), Some(&[]), false),
            // Unreadable (no modes anywhere): fail safe, single writer.
            (None, None, true),
            (Some(&[]), None, true),
            (Some(&[]), Some(&[]), true),
        ];
        for (i, (spec, status, rwo)) in table.iter().enumerate() {
            assert_eq!(
                claim_is_rwo(&pvc(*spec, *status)),
                *rwo,
                "row {i}: spec {spec:?} status {status:?}"
            );
        }
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
