//! Builders shared by the decide and phase tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use palisade_decide::snapshot::{
    FenceState, NodeSnapshot, PodSnapshot, PolicySnapshot, Snapshot, Tolerance,
};
use palisade_decide::{Clocks, Mono};
use palisade_model::policy::FencingPolicySpec;
use palisade_model::target::{DeviceKind, FenceDevice, FenceLevel, FenceTargetSpec, SecretRef};

/// Monotonic "now" of the test world, in seconds.
pub const NOW: u64 = 100;
/// The zone label.
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// A wall-clock time `secs` after a fixed origin.
pub fn wall(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

/// Suspect after 2 s, Unhealthy after 4 s, 40% silent allowed, 1 concurrent, 1 per zone.
pub fn policy_spec() -> FencingPolicySpec {
    let mut spec = FencingPolicySpec::default();
    spec.detection.suspect_after_seconds = 2;
    spec.detection.unhealthy_after_seconds = 4;
    spec.limits.max_unhealthy = IntOrString::String("40%".into());
    spec
}

/// A named policy.
pub fn policy(name: &str, spec: FencingPolicySpec) -> PolicySnapshot {
    PolicySnapshot {
        name: name.into(),
        spec,
        guard_held_at: None,
    }
}

/// A FenceTarget with one level per inner list.
pub fn target(levels: Vec<Vec<(String, DeviceKind)>>) -> FenceTargetSpec {
    FenceTargetSpec {
        levels: levels
            .iter()
            .enumerate()
            .map(|(i, devs)| FenceLevel {
                name: format!("l{i}"),
                devices: devs
                    .iter()
                    .map(|(url, kind)| FenceDevice {
                        url: url.clone(),
                        kind: *kind,
                        credentials_secret_ref: (!url.starts_with("bridge://")).then(|| {
                            SecretRef {
                                name: "creds".into(),
                                namespace: "palisade-system".into(),
                                keys: BTreeMap::new(),
                            }
                        }),
                        timeout_seconds: 10,
                        fences: (*kind == DeviceKind::Storage).then(|| {
                            palisade_model::target::StorageScope {
                                storage_classes: vec!["fast".into()],
                                csi_drivers: vec![],
                            }
                        }),
                    })
                    .collect(),
                power_off: Default::default(),
            })
            .collect(),
    }
}

/// A pod labelled `app=<name>`.
pub fn pod(ns: &str, name: &str, priority: i32, tol: Tolerance, rwo: bool) -> PodSnapshot {
    PodSnapshot {
        namespace: ns.into(),
        name: name.into(),
        labels: [("app".to_string(), name.to_string())].into(),
        priority,
        unreachable: tol,
        uses_rwo_volume: rwo,
    }
}

/// A healthy node in `zone` with one stateful pod tolerating unreachable for 30 s and an IPMI level.
pub fn node(name: &str, zone: &str) -> NodeSnapshot {
    NodeSnapshot {
        name: name.into(),
        labels: std::collections::BTreeMap::from([(ZONE.to_string(), zone.to_string())]).into(),
        last_heartbeat_change: Mono::from_secs(NOW),
        exclusion: None,
        advertisement: Default::default(),
        heartbeat_marker: Some("lease=1;ready=-".into()),
        renewal_gap: None,
        long_gaps: vec![],
        power_off: None,
        hosts_bridge: false,
        fence_target: Some(palisade_decide::snapshot::Lent::from(target(vec![vec![(
            format!("ipmi://bmc-{name}"),
            DeviceKind::Power,
        )]]))),
        pods: vec![pod(
            "db",
            &format!("{name}-db"),
            100,
            Tolerance::For(Duration::from_secs(30)),
            true,
        )],
        fence: FenceState::None,
        past_fences: vec![],
    }
}

/// Silent long enough that Unhealthy (at +4 s) plus 30 s forgiveness has just run out at NOW.
pub const DEAD: u64 = NOW - 34;

/// Five nodes m0..m4 in zones a, a, b, b, c; m0 dead; one policy `p`.
pub fn world() -> Snapshot {
    let mut nodes: Vec<NodeSnapshot> = [
        ("m0", "a"),
        ("m1", "a"),
        ("m2", "b"),
        ("m3", "b"),
        ("m4", "c"),
    ]
    .iter()
    .map(|(n, z)| node(n, z))
    .collect();
    nodes[0].last_heartbeat_change = Mono::from_secs(DEAD);
    Snapshot {
        now: Clocks {
            mono: Mono::from_secs(NOW),
            wall: wall(0),
        },
        policies: vec![policy("p", policy_spec())],
        nodes,
        pdbs: vec![],
    }
}

/// The named node of the snapshot.
pub fn node_mut<'a>(s: &'a mut Snapshot, name: &str) -> &'a mut NodeSnapshot {
    s.nodes.iter_mut().find(|n| n.name == name).unwrap()
}

/// An advertisement as a node agent with a self-fence timeout of `after` seconds writes it on
/// bare metal, with an armed `nowayout` watchdog of `watchdog` seconds if given (a hardware
/// `iTCO_wdt` that resets the machine), and scope `all`.
#[allow(dead_code)]
pub fn advertised(after: u64, watchdog: Option<u64>) -> palisade_model::advertise::Advertisement {
    use palisade_model::advertise::{
        Advertisement, SelfFenceScope, Virtualization, Watchdog, WatchdogAction,
    };
    Advertisement {
        self_fence_after: Some(std::time::Duration::from_secs(after)),
        watchdog: watchdog.map(|w| Watchdog {
            timeout: std::time::Duration::from_secs(w),
            nowayout: true,
            action: Some(WatchdogAction::Reset),
            driver: Some("iTCO_wdt".into()),
        }),
        scope: Some(SelfFenceScope::All),
        virtualization: Some(Virtualization::None),
        ..Default::default()
    }
}

/// As [`advertised`], from an agent on a `kind` virtual machine (`kvm`, `qemu`, ...) whose
/// watchdog is an emulated `i6300esb` (its expiry action is the hypervisor's).
#[allow(dead_code)]
pub fn advertised_vm(
    after: u64,
    watchdog: u64,
    kind: &str,
) -> palisade_model::advertise::Advertisement {
    use palisade_model::advertise::{Virtualization, WatchdogAction};
    let mut ad = advertised(after, Some(watchdog));
    if let Some(w) = ad.watchdog.as_mut() {
        w.action = Some(WatchdogAction::Hypervisor);
        w.driver = Some("i6300esb".into());
    }
    ad.virtualization = Some(Virtualization::Virtual(kind.into()));
    ad
}
