//! `kubectl palisade explain NODE`: why Palisade did or did not fence a node, guard by guard,
//! from the same objects and rules the controller uses (policy selection and validation, the
//! advertisement's trust, the FenceTarget's acceptance), plus the controller's own last word
//! (its Events and the NodeFence's recorded verdict).

use std::fmt::Write;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Client, ResourceExt};
use palisade_decide::acceptance;
use palisade_model::policy::MaxUnhealthy;
use serde::Serialize;

use crate::output::OutputArg;
use crate::world::{age, to_ms, World};

/// What `explain` shows, guard by guard.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub node: String,
    pub policy: PolicyFinding,
    pub heartbeat: Heartbeat,
    pub exclusion: Exclusion,
    /// Over the nodes the policy covers; `None` without one policy.
    pub quorum: Option<Quorum>,
    pub pods: Pods,
    pub fencing: Fencing,
    /// The unfinished NodeFence of the node, if any.
    pub node_fence: Option<NodeFenceState>,
    /// The controller's latest `FenceHeld*` Event on the node, if any.
    pub controller: Option<HeldEvent>,
}

/// Which policy selects the node.
#[derive(Debug, Clone, Serialize)]
#[serde(
    tag = "verdict",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum PolicyFinding {
    /// None does (NoPolicy): reported, never fenced.
    None,
    /// One does, and the controller's rules reject it: the node is held.
    NotAccepted {
        name: String,
        reason: String,
        problems: Vec<String>,
    },
    /// One does, and it is accepted.
    Selected {
        name: String,
        suspect_after_seconds: i64,
        unhealthy_after_seconds: i64,
        fence_when: String,
        paused: bool,
        dry_run: bool,
    },
    /// Several do (ConflictingPolicies): held until only one does.
    Conflict { names: Vec<String> },
}

/// The node's heartbeat.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    /// Seconds since its Lease was renewed (by the node's clock); `None`: never.
    pub age_seconds: Option<f64>,
    /// `Healthy`, `Suspect` or `Unhealthy`.
    pub health: String,
}

/// Whether an annotation keeps the node out of fencing.
#[derive(Debug, Clone, Serialize)]
#[serde(
    tag = "verdict",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Exclusion {
    None,
    /// Never fenced.
    Excluded {
        annotation: String,
    },
    /// Not fenced during maintenance.
    Maintenance {
        annotation: String,
    },
}

/// The quorum guard.
#[derive(Debug, Clone, Serialize)]
#[serde(
    tag = "verdict",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Quorum {
    Counted {
        silent: usize,
        covered: usize,
        allowed: usize,
        max_unhealthy: IntOrString,
        /// The guard holds (this side may be the partitioned one).
        holds: bool,
    },
    /// `maxUnhealthy` does not parse.
    Invalid { message: String },
}

/// The node's pods.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pods {
    pub total: usize,
    /// With a ReadWriteOnce claim, or an unreadable one.
    pub stateful: usize,
    /// `fenceWhen: StatefulOnly` and no stateful pod: nothing calls for a fence.
    pub nothing_calls_for_fence: bool,
}

/// How the node would be fenced.
#[derive(Debug, Clone, Serialize)]
#[serde(
    tag = "verdict",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Fencing {
    /// An accepted FenceTarget with these levels, in order.
    Target { levels: Vec<String> },
    /// A FenceTarget the controller's rules reject.
    TargetNotAccepted {
        reason: String,
        problems: Vec<String>,
    },
    /// No FenceTarget, and the policy does not trust self-fencing (NoFencingLevel).
    NoFencingLevel,
    /// No FenceTarget, and the node's advertisement earns no trust (SelfFenceNotTrusted).
    SelfFenceNotTrusted { why: String },
    /// A trusted self-fence after this much silence (self-fence + 2 × watchdog + margin).
    TrustedSelfFence { after_seconds: u64 },
}

/// The unfinished NodeFence.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFenceState {
    pub name: String,
    pub phase: String,
    pub verdict: Option<HeldEvent>,
}

/// A reason and its message (an Event, or a recorded verdict's label and message).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldEvent {
    pub reason: String,
    pub message: String,
}

/// The explanation for `node`, from what was read (pods: those of `node`); `None` when the
/// node does not exist.
pub fn report(w: &World, node: &str) -> Option<Explanation> {
    let n = w.node(node)?;
    // 1. Policy.
    let policies = w.policies_for(n);
    let (policy, policy_finding) = match policies.as_slice() {
        [] => (None, PolicyFinding::None),
        [p] => {
            let finding = match w.policy_verdicts().remove(&p.name_any()) {
                Some(v) if !v.accepted() => PolicyFinding::NotAccepted {
                    name: p.name_any(),
                    reason: v.reason.as_str().to_string(),
                    problems: v.problems,
                },
                _ => PolicyFinding::Selected {
                    name: p.name_any(),
                    suspect_after_seconds: p.spec.detection.suspect_after_seconds,
                    unhealthy_after_seconds: p.spec.detection.unhealthy_after_seconds,
                    fence_when: format!("{:?}", p.spec.fence_when),
                    paused: p.spec.paused,
                    dry_run: p.spec.dry_run,
                },
            };
            (Some(*p), finding)
        }
        many => (
            None,
            PolicyFinding::Conflict {
                names: many.iter().map(|p| p.name_any()).collect(),
            },
        ),
    };
    // 2. Health.
    let detection = policy.map(|p| p.spec.detection.clone()).unwrap_or_default();
    let (health, hb) = w.health(node, &detection);
    // 3. Exclusions.
    let annotations = n.annotations();
    let exclusion = if annotations
        .get(palisade_model::ANNOTATION_EXCLUDE)
        .is_some_and(|v| v == "true")
    {
        Exclusion::Excluded {
            annotation: palisade_model::ANNOTATION_EXCLUDE.to_string(),
        }
    } else if annotations.contains_key(palisade_model::ANNOTATION_MAINTENANCE) {
        Exclusion::Maintenance {
            annotation: palisade_model::ANNOTATION_MAINTENANCE.to_string(),
        }
    } else {
        Exclusion::None
    };
    // 4. Quorum guard, over the nodes the policy covers.
    let quorum = policy.map(|p| {
        let covered: Vec<String> = w
            .nodes
            .iter()
            .filter(|x| palisade_decide::selector::matches(&p.spec.node_selector, x.labels()))
            .map(|x| x.name_any())
            .collect();
        let silent = covered
            .iter()
            .filter(|x| w.health(x, &detection).0 != palisade_decide::detector::Health::Healthy)
            .count();
        match MaxUnhealthy::parse(&p.spec.limits.max_unhealthy) {
            Ok(m) => {
                let allowed = m.allowed_silent(covered.len());
                Quorum::Counted {
                    silent,
                    covered: covered.len(),
                    allowed,
                    max_unhealthy: p.spec.limits.max_unhealthy.clone(),
                    holds: silent > allowed,
                }
            }
            Err(e) => Quorum::Invalid {
                message: e.to_string(),
            },
        }
    });
    // 5. Pods.
    let pods = w.pods_on(node);
    let stateful = pods.iter().filter(|p| w.stateful(p)).count();
    let pods = Pods {
        total: pods.len(),
        stateful,
        nothing_calls_for_fence: policy.map(|p| p.spec.fence_when)
            == Some(palisade_model::policy::FenceWhen::StatefulOnly)
            && stateful == 0,
    };
    // 6. The plan: FenceTarget or trusted self-fence.
    let fencing = match w.targets.get(node) {
        Some(t) => {
            let v = acceptance::target(&t.spec);
            if v.accepted() {
                Fencing::Target {
                    levels: t
                        .spec
                        .levels
                        .iter()
                        .enumerate()
                        .map(|(i, l)| {
                            if l.name.is_empty() {
                                format!("level-{i}")
                            } else {
                                l.name.clone()
                            }
                        })
                        .collect(),
                }
            } else {
                Fencing::TargetNotAccepted {
                    reason: v.reason.as_str().to_string(),
                    problems: v.problems,
                }
            }
        }
        None => {
            let ad = palisade_decide::convert::advertisement(w.leases.get(node), Some(n));
            let margin = policy.map_or(10, |p| p.spec.trust_self_fence.margin_seconds);
            let trust = policy.is_some_and(|p| p.spec.trust_self_fence.enabled);
            let vms = policy
                .map(|p| p.spec.trust_self_fence.virtual_machines)
                .unwrap_or_default();
            match (
                trust,
                ad.trust(std::time::Duration::from_secs(margin.max(0) as u64), vms),
            ) {
                (false, _) => Fencing::NoFencingLevel,
                (true, Err(why)) => Fencing::SelfFenceNotTrusted {
                    why: why.to_string(),
                },
                (true, Ok(wait)) => Fencing::TrustedSelfFence {
                    after_seconds: wait.as_secs(),
                },
            }
        }
    };
    // 7. The controller's own word.
    let node_fence = w.active_fence(node).map(|f| {
        let st = f.status.as_ref();
        NodeFenceState {
            name: f.name_any(),
            phase: st.map_or("Pending", |s| s.phase.as_str()).to_string(),
            verdict: st.and_then(|s| s.verdict.as_ref()).map(|v| HeldEvent {
                reason: v.label.to_string(),
                message: v.message.clone(),
            }),
        }
    });
    let controller = w.latest_event(node, "FenceHeld").map(|e| HeldEvent {
        reason: e.reason.clone().unwrap_or_default(),
        message: e.message.clone().unwrap_or_default(),
    });
    Some(Explanation {
        node: node.to_string(),
        policy: policy_finding,
        heartbeat: Heartbeat {
            age_seconds: hb.map(to_ms),
            health: format!("{health:?}"),
        },
        exclusion,
        quorum,
        pods,
        fencing,
        node_fence,
        controller,
    })
}

/// The explanation as the text `explain` prints.
pub fn text(e: &Explanation) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Node {}", e.node);
    let _ = match &e.policy {
        PolicyFinding::None => writeln!(
            o,
            "  policy:      none selects it: Palisade reports this node and never fences it (NoPolicy)"
        ),
        PolicyFinding::NotAccepted {
            name,
            reason,
            problems,
        } => writeln!(
            o,
            "  policy:      {name} is NOT accepted ({reason}): {}; the node is held",
            problems.join("; ")
        ),
        PolicyFinding::Selected {
            name,
            suspect_after_seconds,
            unhealthy_after_seconds,
            fence_when,
            paused,
            dry_run,
        } => writeln!(
            o,
            "  policy:      {name} (suspect after {suspect_after_seconds}s, unhealthy after {unhealthy_after_seconds}s, fenceWhen {fence_when}{}{})",
            if *paused { ", PAUSED: nothing new is fenced" } else { "" },
            if *dry_run { ", DRY RUN: decisions only" } else { "" },
        ),
        PolicyFinding::Conflict { names } => writeln!(
            o,
            "  policy:      {} policies select it ({}): held until only one does (ConflictingPolicies)",
            names.len(),
            names.join(", ")
        ),
    };
    let health = &e.heartbeat.health;
    let _ = match e.heartbeat.age_seconds {
        Some(a) => writeln!(
            o,
            "  heartbeat:   Lease renewed {} ago (by the node's clock) → {health}",
            age(a)
        ),
        None => writeln!(o, "  heartbeat:   no Lease renewal on record → {health}"),
    };
    let _ = match &e.exclusion {
        Exclusion::Excluded { annotation } => {
            writeln!(o, "  exclusion:   {annotation} = true: never fenced")
        }
        Exclusion::Maintenance { annotation } => writeln!(
            o,
            "  exclusion:   {annotation} set: not fenced during maintenance"
        ),
        Exclusion::None => writeln!(o, "  exclusion:   none"),
    };
    let _ = match &e.quorum {
        Some(Quorum::Counted {
            silent,
            covered,
            allowed,
            max_unhealthy,
            holds,
        }) => writeln!(
            o,
            "  quorum:      {silent} of {covered} covered node(s) silent, at most {allowed} allowed ({max_unhealthy:?}){}",
            if *holds { ": the guard HOLDS (this side may be the partitioned one)" } else { "" }
        ),
        Some(Quorum::Invalid { message }) => writeln!(o, "  quorum:      {message}"),
        None => Ok(()),
    };
    let _ = writeln!(
        o,
        "  pods:        {} on the node, {} stateful (a ReadWriteOnce claim, or an unreadable one){}",
        e.pods.total,
        e.pods.stateful,
        if e.pods.nothing_calls_for_fence {
            ": fenceWhen StatefulOnly, so nothing calls for a fence"
        } else {
            ""
        }
    );
    let _ = match &e.fencing {
        Fencing::Target { levels } => writeln!(
            o,
            "  fencing:     FenceTarget with {} level(s): {}",
            levels.len(),
            levels.join(" → ")
        ),
        Fencing::TargetNotAccepted { reason, problems } => writeln!(
            o,
            "  fencing:     FenceTarget NOT accepted ({reason}): {}",
            problems.join("; ")
        ),
        Fencing::NoFencingLevel => writeln!(o, "  fencing:     no FenceTarget, and the policy does not trust self-fencing: held (NoFencingLevel)"),
        Fencing::SelfFenceNotTrusted { why } => writeln!(o, "  fencing:     no FenceTarget; the node's last advertisement earns no trust ({why}): held (SelfFenceNotTrusted)"),
        Fencing::TrustedSelfFence { after_seconds } => writeln!(o, "  fencing:     trusted self-fence after {after_seconds}s of silence (self-fence + 2 × watchdog + margin)"),
    };
    let _ = match &e.node_fence {
        Some(f) => writeln!(
            o,
            "  NodeFence:   {} {} {}",
            f.name,
            f.phase,
            f.verdict
                .as_ref()
                .map(|v| format!("({}: {})", v.reason, v.message))
                .unwrap_or_default()
        ),
        None => writeln!(o, "  NodeFence:   none in progress"),
    };
    let _ = match &e.controller {
        Some(h) => writeln!(o, "  controller:  last said {}: {}", h.reason, h.message),
        None => writeln!(o, "  controller:  no hold reported for this node"),
    };
    o
}

/// Prints the explanation; exit 1 when the node does not exist.
pub async fn run(
    c: &Client,
    _controller_ns: &str,
    node: &str,
    out: OutputArg,
) -> anyhow::Result<u8> {
    let mut w = World::read(c).await?;
    if w.node(node).is_none() {
        anyhow::bail!("no Node named {node:?}");
    }
    w.read_pods_on(c, &[node.to_string()]).await?;
    let Some(e) = report(&w, node) else {
        anyhow::bail!("no Node named {node:?}");
    };
    crate::output::print(out, &e, text)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::tests::{lease, node, pod, world};

    #[test]
    fn a_node_without_policy_is_explained_in_text_and_json_alike() {
        let mut w = world();
        w.nodes = vec![node("m1")];
        w.leases = [lease(&w, "m1", 30.0)].into_iter().collect();
        w.pods = vec![pod("kp", "web-0", "m1")];
        assert!(report(&w, "nope").is_none());
        let e = report(&w, "m1").unwrap();
        let t = text(&e);
        assert_eq!(
            t,
            "Node m1\n\
             \x20 policy:      none selects it: Palisade reports this node and never fences it (NoPolicy)\n\
             \x20 heartbeat:   Lease renewed 30.0s ago (by the node's clock) → Unhealthy\n\
             \x20 exclusion:   none\n\
             \x20 pods:        1 on the node, 0 stateful (a ReadWriteOnce claim, or an unreadable one)\n\
             \x20 fencing:     no FenceTarget, and the policy does not trust self-fencing: held (NoFencingLevel)\n\
             \x20 NodeFence:   none in progress\n\
             \x20 controller:  no hold reported for this node\n"
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "node": "m1",
                "policy": {"verdict": "none"},
                "heartbeat": {"ageSeconds": 30.0, "health": "Unhealthy"},
                "exclusion": {"verdict": "none"},
                "quorum": null,
                "pods": {"total": 1, "stateful": 0, "nothingCallsForFence": false},
                "fencing": {"verdict": "noFencingLevel"},
                "nodeFence": null,
                "controller": null,
            })
        );
    }
}
