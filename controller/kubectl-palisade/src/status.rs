//! `kubectl palisade status`.

use std::fmt::Write;

use kube::{Client, ResourceExt};
use palisade_decide::detector::Health;
use palisade_model::policy::Detection;
use serde::Serialize;

use crate::output::OutputArg;
use crate::world::{age, secs, to_ms, World};

/// What `status` shows.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Every node, with its health by Lease renewTime against the covering policy's thresholds.
    pub nodes: Vec<NodeRow>,
    /// Every NodeFence.
    pub node_fences: Vec<FenceRow>,
    /// The controller's latest `FenceHeld*` Event on each node that has one.
    pub held_decisions: Vec<Held>,
    /// The pods bound to nodes that are not Healthy.
    pub pods_on_silent_nodes: Vec<SilentPod>,
}

/// One node.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    pub name: String,
    /// Seconds since its Lease was renewed (by the node's clock); `None`: never.
    pub heartbeat_age_seconds: Option<f64>,
    /// `Healthy`, `Suspect` or `Unhealthy`.
    pub health: String,
    /// The policies that select it (more than one is a conflict).
    pub policies: Vec<String>,
    /// Its FenceTarget; `None`: it has none.
    pub target: Option<TargetState>,
    /// Its unfinished NodeFence, if any.
    pub fence: Option<ActiveFence>,
}

/// A node's FenceTarget.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetState {
    /// How many levels it has.
    pub levels: usize,
    /// Whether the controller accepted it; `None`: not checked yet.
    pub accepted: Option<bool>,
    /// The reason of its Accepted condition.
    pub reason: Option<String>,
}

/// An unfinished NodeFence.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveFence {
    pub name: String,
    pub phase: String,
}

/// One NodeFence.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FenceRow {
    pub name: String,
    pub node: String,
    pub phase: String,
    pub fencing_token: Option<i64>,
    /// Seconds since it was created.
    pub age_seconds: Option<f64>,
    /// Its failure, else the controller's verdict, else the request's reason.
    pub reason: String,
}

/// A held decision.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    pub node: String,
    pub reason: String,
    pub message: String,
}

/// A pod on a silent node.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SilentPod {
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// Whether it mounts a ReadWriteOnce claim (or an unreadable one): it waits for a fence.
    pub stateful: bool,
}

/// The nodes that are not Healthy, by the covering policy's thresholds.
pub fn silent_nodes(w: &World) -> Vec<String> {
    w.nodes
        .iter()
        .map(|n| n.name_any())
        .filter(|name| {
            let detection = detection(w, name);
            w.health(name, &detection).0 != Health::Healthy
        })
        .collect()
}

fn detection(w: &World, node: &str) -> Detection {
    match w.node(node).map(|n| w.policies_for(n)).as_deref() {
        Some([p]) => p.spec.detection.clone(),
        _ => Detection::default(),
    }
}

/// The report, from what was read (pods: those of the silent nodes).
pub fn report(w: &World) -> Status {
    let nodes = w
        .nodes
        .iter()
        .map(|n| {
            let name = n.name_any();
            let (health, hb) = w.health(&name, &detection(w, &name));
            NodeRow {
                heartbeat_age_seconds: hb.map(to_ms),
                health: format!("{health:?}"),
                policies: w.policies_for(n).iter().map(|p| p.name_any()).collect(),
                target: w.targets.get(&name).map(|t| {
                    let accepted = t.status.as_ref().and_then(|s| s.accepted());
                    TargetState {
                        levels: t.spec.levels.len(),
                        accepted: accepted.map(|(status, _)| status == "True"),
                        reason: accepted.map(|(_, reason)| reason.to_string()),
                    }
                }),
                fence: w.active_fence(&name).map(|f| ActiveFence {
                    name: f.name_any(),
                    phase: f
                        .status
                        .as_ref()
                        .map_or("Pending", |s| s.phase.as_str())
                        .to_string(),
                }),
                name,
            }
        })
        .collect();
    let node_fences = w
        .fences
        .iter()
        .map(|f| {
            let st = f.status.as_ref();
            let created = f.metadata.creation_timestamp.as_ref().map(|t| t.0);
            FenceRow {
                name: f.name_any(),
                node: f.spec.node_name.clone(),
                phase: st.map_or("Pending", |s| s.phase.as_str()).to_string(),
                fencing_token: st.and_then(|s| s.fencing_token),
                age_seconds: created.map(|t| to_ms(secs(t, w.now))),
                reason: st
                    .and_then(|s| {
                        s.failure
                            .as_ref()
                            .map(|f| format!("{}: {}", f.reason.as_str(), f.message))
                    })
                    .or_else(|| st.and_then(|s| s.verdict.as_ref().map(|v| v.message.clone())))
                    .unwrap_or_else(|| f.spec.reason.clone()),
            }
        })
        .collect();
    let held_decisions = w
        .nodes
        .iter()
        .filter_map(|n| {
            let e = w.latest_event(&n.name_any(), "FenceHeld")?;
            Some(Held {
                node: n.name_any(),
                reason: e.reason.clone().unwrap_or_default(),
                message: e.message.clone().unwrap_or_default(),
            })
        })
        .collect();
    let pods_on_silent_nodes = silent_nodes(w)
        .into_iter()
        .flat_map(|node| {
            w.pods_on(&node)
                .into_iter()
                .map(|p| SilentPod {
                    namespace: p.namespace().unwrap_or_default(),
                    name: p.name_any(),
                    node: node.clone(),
                    stateful: w.stateful(p),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    Status {
        nodes,
        node_fences,
        held_decisions,
        pods_on_silent_nodes,
    }
}

/// The report as the text `status` prints.
pub fn text(s: &Status) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "NODES (health by Lease renewTime against the covering policy's thresholds)"
    );
    let _ = writeln!(
        o,
        "{:<20} {:<10} {:<11} {:<10} {:<14} FENCE",
        "NODE", "HEARTBEAT", "HEALTH", "POLICY", "TARGET"
    );
    for n in &s.nodes {
        let policy = match n.policies.as_slice() {
            [] => "none",
            [p] => p.as_str(),
            _ => "CONFLICT",
        };
        let target = match &n.target {
            None => "none".to_string(),
            Some(t) => match (t.accepted, &t.reason) {
                (Some(true), _) => format!("{} level(s)", t.levels),
                (Some(false), reason) => format!("NOT {}", reason.as_deref().unwrap_or_default()),
                (None, _) => "unchecked".to_string(),
            },
        };
        let fence = n
            .fence
            .as_ref()
            .map_or_else(|| "-".into(), |f| format!("{} {}", f.name, f.phase));
        let _ = writeln!(
            o,
            "{:<20} {:<10} {:<11} {policy:<10} {target:<14} {fence}",
            n.name,
            n.heartbeat_age_seconds
                .map(age)
                .unwrap_or_else(|| "never".into()),
            n.health,
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "NODEFENCES");
    let _ = writeln!(
        o,
        "{:<28} {:<16} {:<11} {:<6} {:<9} REASON",
        "NAME", "NODE", "PHASE", "TOKEN", "AGE"
    );
    for f in &s.node_fences {
        let _ = writeln!(
            o,
            "{:<28} {:<16} {:<11} {:<6} {:<9} {}",
            f.name,
            f.node,
            f.phase,
            f.fencing_token.map_or("-".into(), |t| t.to_string()),
            f.age_seconds.map_or("-".into(), age),
            f.reason,
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "HELD DECISIONS (the controller's latest word on each node)"
    );
    for h in &s.held_decisions {
        let _ = writeln!(o, "{:<20} {:<28} {}", h.node, h.reason, h.message);
    }
    if s.held_decisions.is_empty() {
        let _ = writeln!(o, "(none)");
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "PODS ON SILENT NODES");
    for p in &s.pods_on_silent_nodes {
        let _ = writeln!(
            o,
            "{:<40} {:<16} {}",
            format!("{}/{}", p.namespace, p.name),
            p.node,
            if p.stateful {
                "stateful (RWO volume): waits for a fence"
            } else {
                "stateless"
            }
        );
    }
    if s.pods_on_silent_nodes.is_empty() {
        let _ = writeln!(o, "(none)");
    }
    o
}

/// Prints nodes, fences, held decisions and pods on silent nodes.
pub async fn run(c: &Client, _controller_ns: &str, out: OutputArg) -> anyhow::Result<u8> {
    let mut w = World::read(c).await?;
    let silent = silent_nodes(&w);
    w.read_pods_on(c, &silent).await?;
    crate::output::print(out, &report(&w), text)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::tests::{lease, node, pod, world};

    #[test]
    fn a_silent_node_and_its_pods_are_reported_in_text_and_json_alike() {
        let mut w = world();
        w.nodes = vec![node("m1"), node("m2")];
        w.leases = [lease(&w, "m1", 1.0), lease(&w, "m2", 600.0)]
            .into_iter()
            .collect();
        w.pods = vec![pod("kp", "web-0", "m2")];
        assert_eq!(silent_nodes(&w), ["m2"]);
        let s = report(&w);
        let t = text(&s);
        assert!(
            t.contains("m1                   1.0s       Healthy     none       none           -"),
            "{t}"
        );
        assert!(
            t.contains("m2                   10m00s     Unhealthy"),
            "{t}"
        );
        assert!(
            t.contains("kp/web-0                                 m2               stateless"),
            "{t}"
        );
        assert!(
            t.contains("HELD DECISIONS (the controller's latest word on each node)\n(none)"),
            "{t}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["nodes"][1]["name"], "m2");
        assert_eq!(json["nodes"][1]["health"], "Unhealthy");
        assert_eq!(json["nodes"][1]["heartbeatAgeSeconds"], 600.0);
        assert_eq!(json["nodes"][0]["policies"], serde_json::json!([]));
        assert_eq!(
            json["podsOnSilentNodes"],
            serde_json::json!([{"namespace": "kp", "name": "web-0", "node": "m2", "stateful": false}])
        );
        assert_eq!(json["nodeFences"], serde_json::json!([]));
        assert_eq!(json["heldDecisions"], serde_json::json!([]));
    }
}
