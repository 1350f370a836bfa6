//! One read of everything the commands look at, from the API server. Pods are read only for
//! the nodes a command asks about, one LIST per node with a `spec.nodeName` field selector, never
//! every pod of the cluster.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use palisade_decide::detector::{Health, Thresholds};
use palisade_model::policy::Detection;
use palisade_model::{FenceTarget, FencingPolicy, NodeFence};

/// The cluster as the commands see it.
pub struct World {
    pub now: Timestamp,
    pub nodes: Vec<Node>,
    pub leases: BTreeMap<String, Lease>,
    pub policies: Vec<FencingPolicy>,
    pub targets: BTreeMap<String, FenceTarget>,
    pub fences: Vec<NodeFence>,
    /// The pods of the nodes read with [`World::read_pods_on`].
    pub pods: Vec<Pod>,
    pub claims: Vec<PersistentVolumeClaim>,
    pub events: Vec<Event>,
}

async fn list<K>(api: Api<K>, what: &str) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    list_with(api, &ListParams::default(), what).await
}

async fn list_with<K>(api: Api<K>, params: &ListParams, what: &str) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(params)
        .await
        .with_context(|| format!("listing {what}"))?
        .items)
}

/// The field selector of the pods bound to `node`.
pub fn on_node(node: &str) -> String {
    format!("spec.nodeName={node}")
}

impl World {
    /// Reads everything but pods (one LIST per kind).
    pub async fn read(c: &Client) -> anyhow::Result<World> {
        Ok(World {
            now: Timestamp::now(),
            nodes: list(Api::all(c.clone()), "Nodes").await?,
            leases: list::<Lease>(Api::namespaced(c.clone(), "kube-node-lease"), "node Leases")
                .await?
                .into_iter()
                .map(|l| (l.name_any(), l))
                .collect(),
            policies: list(Api::all(c.clone()), "FencingPolicies").await?,
            targets: list::<FenceTarget>(Api::all(c.clone()), "FenceTargets")
                .await?
                .into_iter()
                .map(|t| (t.name_any(), t))
                .collect(),
            fences: list(Api::all(c.clone()), "NodeFences").await?,
            pods: Vec::new(),
            claims: list(Api::all(c.clone()), "PersistentVolumeClaims").await?,
            events: list(Api::namespaced(c.clone(), "default"), "Events").await?,
        })
    }

    /// Reads the pods bound to each of `nodes` (a field selector each, so the API server sends
    /// only those).
    pub async fn read_pods_on(&mut self, c: &Client, nodes: &[String]) -> anyhow::Result<()> {
        for node in nodes {
            let params = ListParams::default().fields(&on_node(node));
            let pods = list_with(Api::<Pod>::all(c.clone()), &params, "Pods").await;
            self.pods
                .extend(pods.with_context(|| format!("on node {node}"))?);
        }
        Ok(())
    }

    /// Whether each policy is accepted, by name (the controller's own rules).
    pub fn policy_verdicts(&self) -> BTreeMap<String, palisade_model::acceptance::Verdict> {
        let snaps: Vec<palisade_decide::snapshot::PolicySnapshot> = self
            .policies
            .iter()
            .map(|p| palisade_decide::snapshot::PolicySnapshot {
                name: p.name_any(),
                spec: p.spec.clone(),
                // The plugin sees one round: it cannot know when a guard last held.
                guard_held_at: None,
            })
            .collect();
        let nodes: Vec<palisade_decide::acceptance::NodeLabels> = self
            .nodes
            .iter()
            .map(|n| palisade_decide::acceptance::NodeLabels {
                name: n.name_any(),
                labels: n.labels().clone(),
            })
            .collect();
        palisade_decide::acceptance::policies(&snaps, &nodes)
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name_any() == name)
    }

    /// Seconds since the node's Lease was renewed, by its `renewTime` (the node's clock: the
    /// controller itself judges on its own clock, from when it *observed* renewals).
    pub fn heartbeat_age(&self, node: &str) -> Option<f64> {
        let renewed = self.leases.get(node)?.spec.as_ref()?.renew_time.as_ref()?.0;
        Some(
            (self.now - renewed)
                .total(k8s_openapi::jiff::Unit::Millisecond)
                .ok()?
                / 1000.0,
        )
    }

    /// The policies whose selector matches `node`.
    pub fn policies_for(&self, node: &Node) -> Vec<&FencingPolicy> {
        self.policies
            .iter()
            .filter(|p| palisade_decide::selector::matches(&p.spec.node_selector, node.labels()))
            .collect()
    }

    /// Health by the heartbeat age and these thresholds.
    pub fn health(&self, node: &str, detection: &Detection) -> (Health, Option<f64>) {
        let t = Thresholds::from(detection);
        match self.heartbeat_age(node) {
            None => (Health::Unhealthy, None),
            Some(age) if age >= t.unhealthy_after.as_secs_f64() => (Health::Unhealthy, Some(age)),
            Some(age) if age >= t.suspect_after.as_secs_f64() => (Health::Suspect, Some(age)),
            Some(age) => (Health::Healthy, Some(age)),
        }
    }

    /// The unfinished NodeFence for `node`, if any.
    pub fn active_fence(&self, node: &str) -> Option<&NodeFence> {
        self.fences
            .iter()
            .filter(|f| f.spec.node_name == node)
            .find(|f| !f.status.as_ref().is_some_and(|s| s.phase.is_terminal()))
    }

    /// Non-terminal pods bound to `node`.
    pub fn pods_on(&self, node: &str) -> Vec<&Pod> {
        self.pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter(|p| !palisade_decide::convert::pod_is_terminal(p))
            .collect()
    }

    /// Whether the pod mounts a ReadWriteOnce claim (unknown claims count as such: fail safe).
    pub fn stateful(&self, pod: &Pod) -> bool {
        palisade_decide::convert::pod_snapshot(pod, |ns, claim| {
            self.claims
                .iter()
                .find(|c| c.namespace().as_deref() == Some(ns) && c.name_any() == claim)
        })
        .uses_rwo_volume
    }

    /// The controller's latest Event about object `name` whose reason starts with `prefix`.
    pub fn latest_event(&self, name: &str, prefix: &str) -> Option<&Event> {
        self.events
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .filter(|e| e.reason.as_deref().is_some_and(|r| r.starts_with(prefix)))
            .max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0))
    }
}

/// "12.3s", "4m05s", "2h10m".
pub fn age(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{}h{:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}

/// Seconds to the millisecond, as the reports carry them (no binary-fraction noise).
pub fn to_ms(secs: f64) -> f64 {
    (secs * 1000.0).round() / 1000.0
}

/// Seconds between two timestamps.
pub fn secs(from: Timestamp, to: Timestamp) -> f64 {
    (to - from)
        .total(k8s_openapi::jiff::Unit::Millisecond)
        .unwrap_or(0.0)
        / 1000.0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    /// An empty world at a fixed moment.
    pub fn world() -> World {
        World {
            now: "2026-01-02T03:04:05Z".parse().unwrap(),
            nodes: Vec::new(),
            leases: BTreeMap::new(),
            policies: Vec::new(),
            targets: BTreeMap::new(),
            fences: Vec::new(),
            pods: Vec::new(),
            claims: Vec::new(),
            events: Vec::new(),
        }
    }

    pub fn node(name: &str) -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
    }

    /// The node Lease of `name`, renewed `age` seconds before `w.now`.
    pub fn lease(w: &World, name: &str, age: f64) -> (String, Lease) {
        let mut l: Lease =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": {}}))
                .unwrap();
        let renewed = w.now - k8s_openapi::jiff::SignedDuration::from_secs_f64(age);
        l.spec.as_mut().unwrap().renew_time = Some(MicroTime(renewed));
        (name.to_string(), l)
    }

    pub fn pod(ns: &str, name: &str, node: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]}
        }))
        .unwrap()
    }

    #[test]
    fn pods_are_selected_by_their_node_name_field() {
        assert_eq!(on_node("m1"), "spec.nodeName=m1");
    }
}
