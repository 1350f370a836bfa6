//! Measure `decide` on a large snapshot: 2,000 nodes in 20 zones, 100 of them silent.
//!
//! `cargo run --release -p palisade-decide --example scale` prints the time per decision round
//! (median and p99 over 200 rounds). A measurement, not a test.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use palisade_decide::snapshot::{
    FenceState, Lent, NodeSnapshot, PodSnapshot, PolicySnapshot, Snapshot, Tolerance,
};
use palisade_decide::{decide, Clocks, Mono};
use palisade_model::policy::FencingPolicySpec;
use palisade_model::target::{DeviceKind, FenceDevice, FenceLevel, FenceTargetSpec};

fn main() {
    let nodes = 2000usize;
    let silent = 100usize;
    let now = Mono::from_secs(10_000);
    let mut spec = FencingPolicySpec::default();
    spec.limits.max_concurrent = 10;
    let snapshot = Snapshot {
        now: Clocks {
            mono: now,
            wall: Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH),
        },
        policies: vec![PolicySnapshot {
            name: "default".into(),
            spec,
            guard_held_at: None,
        }],
        pdbs: vec![],
        nodes: (0..nodes)
            .map(|i| NodeSnapshot {
                name: format!("node-{i:04}"),
                labels: Lent::from(BTreeMap::from([(
                    "topology.kubernetes.io/zone".to_string(),
                    format!("zone-{}", (i / 7) % 20),
                )])),
                last_heartbeat_change: if i % (nodes / silent) == 0 {
                    Mono::from_secs(1_000)
                } else {
                    now
                },
                exclusion: None,
                advertisement: Default::default(),
                heartbeat_marker: None,
                renewal_gap: None,
                long_gaps: vec![],
                power_off: None,
                hosts_bridge: false,
                fence_target: Some(Lent::from(FenceTargetSpec {
                    levels: vec![FenceLevel {
                        name: "bridge".into(),
                        devices: vec![FenceDevice {
                            url: format!("bridge://node-{i:04}"),
                            kind: DeviceKind::Power,
                            credentials_secret_ref: None,
                            timeout_seconds: 20,
                            fences: None,
                        }],
                        power_off: Default::default(),
                    }],
                })),
                pods: (0..10)
                    .map(|p| PodSnapshot {
                        namespace: "ns".into(),
                        name: format!("pod-{i}-{p}"),
                        labels: BTreeMap::new(),
                        priority: p * 100,
                        unreachable: Tolerance::For(Duration::from_secs(300)),
                        uses_rwo_volume: p == 0,
                    })
                    .collect(),
                fence: FenceState::None,
                past_fences: vec![],
            })
            .collect(),
    };
    let mut times = Vec::new();
    let mut fences = 0;
    for _ in 0..200 {
        let start = Instant::now();
        let d = decide(&snapshot);
        times.push(start.elapsed());
        fences = d.iter().filter(|d| d.verdict.is_fence()).count();
    }
    times.sort();
    println!(
        "decide over {nodes} nodes ({silent} silent): median {:?}, p99 {:?}, max {:?}; {fences} fence verdicts per round",
        times[times.len() / 2],
        times[times.len() * 99 / 100],
        times[times.len() - 1]
    );
}
