//! `kubectl palisade explain NODE`: why Palisade did or did not fence a node, guard by guard,
//! from the same objects and rules the controller uses (policy selection and validation, the
//! advertisement's trust, the FenceTarget's acceptance), plus the controller's own last word
//! (its Events and the NodeFence's recorded verdict).

use kube::{Client, ResourceExt};
use palisade_decide::acceptance;
use palisade_model::policy::MaxUnhealthy;

use crate::world::{age, World};

/// Prints the explanation; exit 1 when the node does not exist.
pub async fn run(c: &Client, _controller_ns: &str, node: &str) -> anyhow::Result<u8> {
    let w = World::read(c).await?;
    let Some(n) = w.node(node) else {
        anyhow::bail!("no Node named {node:?}");
    };
    println!("Node {node}");
    // 1. Policy.
    let policies = w.policies_for(n);
    let policy = match policies.as_slice() {
        [] => {
            println!("  policy:      none selects it: Palisade reports this node and never fences it (NoPolicy)");
            None
        }
        [p] => {
            let verdict = w.policy_verdicts().remove(&p.name_any());
            match verdict {
                Some(v) if !v.accepted() => println!(
                    "  policy:      {} is NOT accepted ({}): {}; the node is held",
                    p.name_any(),
                    v.reason.as_str(),
                    v.problems.join("; ")
                ),
                _ => println!("  policy:      {} (suspect after {}s, unhealthy after {}s, fenceWhen {:?}{}{})",
                    p.name_any(),
                    p.spec.detection.suspect_after_seconds,
                    p.spec.detection.unhealthy_after_seconds,
                    p.spec.fence_when,
                    if p.spec.paused { ", PAUSED: nothing new is fenced" } else { "" },
                    if p.spec.dry_run { ", DRY RUN: decisions only" } else { "" },
                ),
            }
            Some(*p)
        }
        many => {
            println!(
                "  policy:      {} policies select it ({}): held until only one does (ConflictingPolicies)",
                many.len(),
                many.iter().map(|p| p.name_any()).collect::<Vec<_>>().join(", ")
            );
            None
        }
    };
    // 2. Health.
    let detection = policy.map(|p| p.spec.detection.clone()).unwrap_or_default();
    let (health, hb) = w.health(node, &detection);
    match hb {
        Some(a) => println!(
            "  heartbeat:   Lease renewed {} ago (by the node's clock) → {health:?}",
            age(a)
        ),
        None => println!("  heartbeat:   no Lease renewal on record → {health:?}"),
    }
    // 3. Exclusions.
    let annotations = n.annotations();
    if annotations
        .get(palisade_model::ANNOTATION_EXCLUDE)
        .is_some_and(|v| v == "true")
    {
        println!(
            "  exclusion:   {} = true: never fenced",
            palisade_model::ANNOTATION_EXCLUDE
        );
    } else if annotations.contains_key(palisade_model::ANNOTATION_MAINTENANCE) {
        println!(
            "  exclusion:   {} set: not fenced during maintenance",
            palisade_model::ANNOTATION_MAINTENANCE
        );
    } else {
        println!("  exclusion:   none");
    }
    // 4. Quorum guard, over the nodes the policy covers.
    if let Some(p) = policy {
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
                println!(
                    "  quorum:      {silent} of {} covered node(s) silent, at most {allowed} allowed ({:?}){}",
                    covered.len(),
                    p.spec.limits.max_unhealthy,
                    if silent > allowed { ": the guard HOLDS (this side may be the partitioned one)" } else { "" }
                );
            }
            Err(e) => println!("  quorum:      {e}"),
        }
    }
    // 5. Pods.
    let pods = w.pods_on(node);
    let stateful = pods.iter().filter(|p| w.stateful(p)).count();
    println!(
        "  pods:        {} on the node, {stateful} stateful (a ReadWriteOnce claim, or an unreadable one){}",
        pods.len(),
        match policy.map(|p| p.spec.fence_when) {
            Some(palisade_model::policy::FenceWhen::StatefulOnly) if stateful == 0 =>
                ": fenceWhen StatefulOnly, so nothing calls for a fence",
            _ => "",
        }
    );
    // 6. The plan: FenceTarget or trusted self-fence.
    match w.targets.get(node) {
        Some(t) => {
            let v = acceptance::target(&t.spec);
            if v.accepted() {
                let levels: Vec<String> = t
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
                    .collect();
                println!(
                    "  fencing:     FenceTarget with {} level(s): {}",
                    levels.len(),
                    levels.join(" → ")
                );
            } else {
                println!(
                    "  fencing:     FenceTarget NOT accepted ({}): {}",
                    v.reason.as_str(),
                    v.problems.join("; ")
                );
            }
        }
        None => {
            let ad = palisade_decide::convert::advertisement(w.leases.get(node));
            let margin = policy.map_or(10, |p| p.spec.trust_self_fence.margin_seconds);
            let trust = policy.is_some_and(|p| p.spec.trust_self_fence.enabled);
            let vms = policy
                .map(|p| p.spec.trust_self_fence.virtual_machines)
                .unwrap_or_default();
            match (trust, ad.trust(std::time::Duration::from_secs(margin.max(0) as u64), vms)) {
                (false, _) => println!("  fencing:     no FenceTarget, and the policy does not trust self-fencing: held (NoFencingLevel)"),
                (true, Err(why)) => println!("  fencing:     no FenceTarget; the node's last advertisement earns no trust ({why}): held (SelfFenceNotTrusted)"),
                (true, Ok(wait)) => println!("  fencing:     trusted self-fence after {}s of silence (self-fence + watchdog + margin)", wait.as_secs()),
            }
        }
    }
    // 7. The controller's own word.
    match w.active_fence(node) {
        Some(f) => {
            let st = f.status.as_ref();
            println!(
                "  NodeFence:   {} {} {}",
                f.name_any(),
                st.map_or("Pending", |s| s.phase.as_str()),
                st.and_then(|s| s.verdict.as_ref())
                    .map(|v| format!("({}: {})", v.label, v.message))
                    .unwrap_or_default()
            );
        }
        None => println!("  NodeFence:   none in progress"),
    }
    match w.latest_event(node, "FenceHeld") {
        Some(e) => println!(
            "  controller:  last said {}: {}",
            e.reason.clone().unwrap_or_default(),
            e.message.clone().unwrap_or_default()
        ),
        None => println!("  controller:  no hold reported for this node"),
    }
    Ok(0)
}
