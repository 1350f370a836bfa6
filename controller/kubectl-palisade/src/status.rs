//! `kubectl palisade status`.

use kube::{Client, ResourceExt};
use palisade_model::policy::Detection;

use crate::world::{age, secs, World};

/// Prints nodes, fences, held decisions and pods on silent nodes.
pub async fn run(c: &Client, _controller_ns: &str) -> anyhow::Result<u8> {
    let w = World::read(c).await?;
    println!("NODES (health by Lease renewTime against the covering policy's thresholds)");
    println!(
        "{:<20} {:<10} {:<11} {:<10} {:<14} FENCE",
        "NODE", "HEARTBEAT", "HEALTH", "POLICY", "TARGET"
    );
    let mut silent = Vec::new();
    for n in &w.nodes {
        let name = n.name_any();
        let policies = w.policies_for(n);
        let (policy, detection) = match policies.as_slice() {
            [] => ("none".to_string(), Detection::default()),
            [p] => (p.name_any(), p.spec.detection.clone()),
            _ => ("CONFLICT".to_string(), Detection::default()),
        };
        let (health, hb) = w.health(&name, &detection);
        if health != palisade_decide::detector::Health::Healthy {
            silent.push(name.clone());
        }
        let target = match w.targets.get(&name) {
            None => "none".to_string(),
            Some(t) => match t.status.as_ref().and_then(|s| s.accepted()) {
                Some(("True", _)) => format!("{} level(s)", t.spec.levels.len()),
                Some((_, reason)) => format!("NOT {reason}"),
                None => "unchecked".to_string(),
            },
        };
        let fence = w
            .active_fence(&name)
            .map(|f| {
                let phase = f.status.as_ref().map_or("Pending", |s| s.phase.as_str());
                format!("{} {phase}", f.name_any())
            })
            .unwrap_or_else(|| "-".into());
        println!(
            "{name:<20} {:<10} {:<11} {policy:<10} {target:<14} {fence}",
            hb.map(age).unwrap_or_else(|| "never".into()),
            format!("{health:?}"),
        );
    }
    println!();
    println!("NODEFENCES");
    println!(
        "{:<28} {:<16} {:<11} {:<6} {:<9} REASON",
        "NAME", "NODE", "PHASE", "TOKEN", "AGE"
    );
    for f in &w.fences {
        let st = f.status.as_ref();
        let created = f.metadata.creation_timestamp.as_ref().map(|t| t.0);
        println!(
            "{:<28} {:<16} {:<11} {:<6} {:<9} {}",
            f.name_any(),
            f.spec.node_name,
            st.map_or("Pending", |s| s.phase.as_str()),
            st.and_then(|s| s.fencing_token)
                .map_or("-".into(), |t| t.to_string()),
            created.map_or("-".into(), |t| age(secs(t, w.now))),
            st.and_then(|s| s.failure.as_ref().map(|f| format!(
                "{}: {}",
                f.reason.as_str(),
                f.message
            )))
            .or_else(|| st.and_then(|s| s.verdict.as_ref().map(|v| v.message.clone())))
            .unwrap_or_else(|| f.spec.reason.clone()),
        );
    }
    println!();
    println!("HELD DECISIONS (the controller's latest word on each node)");
    let mut any = false;
    for n in &w.nodes {
        if let Some(e) = w.latest_event(&n.name_any(), "FenceHeld") {
            any = true;
            println!(
                "{:<20} {:<28} {}",
                n.name_any(),
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default()
            );
        }
    }
    if !any {
        println!("(none)");
    }
    println!();
    println!("PODS ON SILENT NODES");
    let mut any = false;
    for node in &silent {
        for p in w.pods_on(node) {
            any = true;
            println!(
                "{:<40} {:<16} {}",
                format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
                node,
                if w.stateful(p) {
                    "stateful (RWO volume): waits for a fence"
                } else {
                    "stateless"
                }
            );
        }
    }
    if !any {
        println!("(none)");
    }
    Ok(0)
}
