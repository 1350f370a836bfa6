//! Exhaustive table tests and properties for `decide`.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use palisade_decide::snapshot::{Exclusion, FenceState, Lent, PdbSnapshot, Snapshot, Tolerance};
use palisade_decide::verdict::PlanLevel;
use palisade_decide::{decide, guards_holding, HoldReason, Mono, Verdict, WaitReason};
use palisade_model::nodefence::{Overrides, RequestedBy};
use palisade_model::policy::{FenceWhen, VirtualMachines};
use palisade_model::target::DeviceKind;
use proptest::prelude::*;

fn verdict_of(s: &Snapshot, node: &str) -> Option<Verdict> {
    decide(s)
        .into_iter()
        .find(|d| d.node == node)
        .map(|d| d.verdict)
}

fn label_of(s: &Snapshot, node: &str) -> String {
    verdict_of(s, node).map_or("none".into(), |v| v.label())
}

fn pdb(ns: &str, app: &str, allowed: i32, selector: bool) -> PdbSnapshot {
    PdbSnapshot {
        namespace: ns.into(),
        name: format!("{app}-pdb"),
        selector: selector.then(|| LabelSelector {
            match_labels: Some([("app".to_string(), app.to_string())].into()),
            match_expressions: None,
        }),
        disruptions_allowed: Some(allowed),
    }
}

fn manual(f: impl FnOnce(&mut Overrides)) -> FenceState {
    let mut o = Overrides::default();
    f(&mut o);
    FenceState::Pending { manual: Some(o) }
}

type Case = (&'static str, fn(&mut Snapshot), &'static str);

/// Each case mutates the five-node world (m0 dead, forgiveness just run out) and states the
/// verdict label for m0.
const CASES: &[Case] = &[
    ("base world fences the dead node", |_| {}, "fence"),
    ("no policy", |s| s.policies.clear(), "hold_no_policy"),
    (
        "selector matches nothing",
        |s| {
            s.policies[0].spec.node_selector.match_labels =
                Some([("role".into(), "db".into())].into())
        },
        "hold_no_policy",
    ),
    (
        "two policies",
        |s| s.policies.push(policy("q", policy_spec())),
        "hold_conflicting_policies",
    ),
    (
        "invalid policy",
        |s| s.policies[0].spec.detection.unhealthy_after_seconds = 1,
        "hold_invalid_policy",
    ),
    (
        "paused",
        |s| s.policies[0].spec.paused = true,
        "hold_paused",
    ),
    (
        "dry run",
        |s| s.policies[0].spec.dry_run = true,
        "hold_dry_run",
    ),
    (
        "opt-out annotation",
        |s| node_mut(s, "m0").exclusion = Some(Exclusion::OptOut),
        "hold_excluded_opt_out",
    ),
    (
        "maintenance",
        |s| node_mut(s, "m0").exclusion = Some(Exclusion::Maintenance),
        "hold_excluded_maintenance",
    ),
    (
        "healthy node gets no decision",
        |s| node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW),
        "none",
    ),
    (
        "healthy node: paused policy says nothing either",
        |s| {
            node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW);
            s.policies[0].spec.paused = true;
        },
        "none",
    ),
    (
        "suspect waits",
        |s| node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 3),
        "wait_suspect",
    ),
    (
        "silent through a quorum-guard hold a second ago waits its threshold from the hold",
        |s| s.policies[0].guard_held_at = Some(Mono::from_secs(NOW - 1)),
        "wait_after_quorum_guard",
    ),
    (
        "forgiveness not yet run out",
        |s| node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 20),
        "wait_forgiveness",
    ),
    (
        "exhausted PDB makes it urgent",
        |s| {
            node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 20);
            s.pdbs.push(pdb("db", "m0-db", 0, true));
        },
        "fence",
    ),
    (
        "PDB with room is not urgent",
        |s| {
            node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 20);
            s.pdbs.push(pdb("db", "m0-db", 1, true));
        },
        "wait_forgiveness",
    ),
    (
        "PDB in another namespace does not cover",
        |s| {
            node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 20);
            s.pdbs.push(pdb("other", "m0-db", 0, true));
        },
        "wait_forgiveness",
    ),
    (
        "v1beta1 empty selector covers nothing",
        |s| {
            node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 20);
            s.pdbs.push(pdb("db", "m0-db", 0, false));
        },
        "wait_forgiveness",
    ),
    (
        "PDB urgency disabled by policy",
        |s| {
            node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 20);
            s.pdbs.push(pdb("db", "m0-db", 0, true));
            s.policies[0].spec.pdb.urgent_when_exhausted = false;
        },
        "wait_forgiveness",
    ),
    (
        "pods tolerating forever fall back to maxSeconds",
        |s| {
            node_mut(s, "m0").pods[0].unreachable = Tolerance::Forever;
        },
        "wait_forgiveness",
    ),
    (
        "pod without toleration: no forgiveness",
        |s| {
            let n = node_mut(s, "m0");
            n.last_heartbeat_change = Mono::from_secs(NOW - 5);
            n.pods[0].unreachable = Tolerance::None;
        },
        "fence",
    ),
    (
        "maxSeconds caps tolerations",
        |s| {
            let n = node_mut(s, "m0");
            n.last_heartbeat_change = Mono::from_secs(NOW - 5);
            n.pods[0].unreachable = Tolerance::For(Duration::from_secs(3000));
            s.policies[0].spec.forgiveness.max_seconds = 0;
        },
        "fence",
    ),
    (
        "ignoring tolerations uses defaultSeconds",
        |s| {
            node_mut(s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 5);
            s.policies[0].spec.forgiveness.respect_tolerations = false;
            s.policies[0].spec.forgiveness.default_seconds = 10;
        },
        "wait_forgiveness",
    ),
    (
        "3 of 5 silent loses quorum",
        |s| {
            node_mut(s, "m2").last_heartbeat_change = Mono::from_secs(0);
            node_mut(s, "m4").last_heartbeat_change = Mono::from_secs(NOW - 3);
        },
        "hold_quorum_lost",
    ),
    (
        "2 of 5 silent keeps quorum (40%)",
        |s| node_mut(s, "m2").last_heartbeat_change = Mono::from_secs(NOW - 3),
        "fence",
    ),
    (
        "every zone fully down",
        |s| {
            s.policies[0].spec.limits.max_unhealthy = IntOrString::String("100%".into());
            for n in &mut s.nodes {
                n.last_heartbeat_change = Mono::from_secs(DEAD);
            }
        },
        "hold_all_zones_down",
    ),
    (
        "one zone fully down, others up",
        |s| {
            s.policies[0].spec.limits.max_unhealthy = IntOrString::Int(2);
            node_mut(s, "m1").last_heartbeat_change = Mono::from_secs(DEAD);
        },
        "fence",
    ),
    (
        "quorum override on a manual request",
        |s| {
            node_mut(s, "m2").last_heartbeat_change = Mono::from_secs(0);
            node_mut(s, "m4").last_heartbeat_change = Mono::from_secs(0);
            node_mut(s, "m0").fence = manual(|o| o.quorum_guard = true);
        },
        "fence",
    ),
    (
        "manual request without override still guarded",
        |s| {
            node_mut(s, "m2").last_heartbeat_change = Mono::from_secs(0);
            node_mut(s, "m4").last_heartbeat_change = Mono::from_secs(0);
            node_mut(s, "m0").fence = manual(|_| {});
        },
        "hold_quorum_lost",
    ),
    (
        "not stateful",
        |s| node_mut(s, "m0").pods[0].uses_rwo_volume = false,
        "hold_not_stateful",
    ),
    (
        "no pods at all",
        |s| node_mut(s, "m0").pods.clear(),
        "hold_not_stateful",
    ),
    (
        "fenceWhen Always fences stateless nodes",
        |s| {
            node_mut(s, "m0").pods[0].uses_rwo_volume = false;
            s.policies[0].spec.fence_when = FenceWhen::Always;
        },
        "fence",
    ),
    (
        "no fence target",
        |s| node_mut(s, "m0").fence_target = None,
        "hold_no_fence_target",
    ),
    (
        "the bridge's own host with only bridge levels",
        |s| {
            let n = node_mut(s, "m0");
            n.hosts_bridge = true;
            n.fence_target = Some(Lent::from(target(vec![vec![(
                "bridge://fw:9443/m0".into(),
                DeviceKind::Power,
            )]])));
        },
        "hold_bridge_host",
    ),
    (
        "self-fence advertised but trust disabled",
        |s| {
            let n = node_mut(s, "m0");
            n.fence_target = None;
            n.advertisement = advertised(15, Some(10));
        },
        "hold_no_fence_target",
    ),
    (
        "self-fence with a nowayout watchdog trusted by policy",
        |s| {
            let n = node_mut(s, "m0");
            n.fence_target = None;
            n.advertisement = advertised(15, Some(10));
            s.policies[0].spec.trust_self_fence.enabled = true;
        },
        "fence",
    ),
    (
        "self-fence advertised without a watchdog is not trusted",
        |s| {
            let n = node_mut(s, "m0");
            n.fence_target = None;
            n.advertisement = advertised(15, None);
            s.policies[0].spec.trust_self_fence.enabled = true;
        },
        "hold_self_fence_not_trusted",
    ),
    (
        "a watchdog that can be disarmed is not trusted",
        |s| {
            let n = node_mut(s, "m0");
            n.fence_target = None;
            n.advertisement = advertised(15, Some(10));
            if let Some(w) = n.advertisement.watchdog.as_mut() {
                w.nowayout = false;
            }
            s.policies[0].spec.trust_self_fence.enabled = true;
        },
        "hold_self_fence_not_trusted",
    ),
    (
        "trust enabled but nothing advertised",
        |s| {
            node_mut(s, "m0").fence_target = None;
            s.policies[0].spec.trust_self_fence.enabled = true;
        },
        "hold_self_fence_not_trusted",
    ),
    (
        "invalid fence target",
        |s| {
            node_mut(s, "m0").fence_target = Some(Lent::from(target(vec![vec![(
                "ftp://x".into(),
                DeviceKind::Power,
            )]])));
        },
        "hold_invalid_fence_target",
    ),
    (
        "another fence in flight",
        |s| node_mut(s, "m3").fence = FenceState::InFlight,
        "hold_concurrency_limit",
    ),
    (
        "settled fences do not count against the limit",
        |s| node_mut(s, "m3").fence = FenceState::Settled,
        "fence",
    ),
    (
        "room overall but the zone is busy",
        |s| {
            s.policies[0].spec.limits.max_concurrent = 3;
            node_mut(s, "m1").fence = FenceState::InFlight;
        },
        "hold_domain_limit",
    ),
    (
        "room overall and in the zone",
        |s| {
            s.policies[0].spec.limits.max_concurrent = 3;
            node_mut(s, "m2").fence = FenceState::InFlight;
        },
        "fence",
    ),
    (
        "own fence in flight: no new decision",
        |s| node_mut(s, "m0").fence = FenceState::InFlight,
        "none",
    ),
    (
        "recent fence: cooldown",
        |s| node_mut(s, "m0").past_fences = vec![wall(-300)],
        "hold_cooldown",
    ),
    (
        "cooldown over",
        |s| node_mut(s, "m0").past_fences = vec![wall(-601)],
        "fence",
    ),
    (
        "escalation limit",
        |s| {
            node_mut(s, "m0").past_fences = vec![wall(-4000), wall(-3000), wall(-2000)];
        },
        "hold_escalation_limit",
    ),
    (
        "old fences fall out of the window",
        |s| {
            node_mut(s, "m0").past_fences = vec![wall(-90_000), wall(-3000), wall(-2000)];
        },
        "fence",
    ),
    (
        "manual escalation override",
        |s| {
            let n = node_mut(s, "m0");
            n.past_fences = vec![wall(-4000), wall(-3000), wall(-2000)];
            n.fence = manual(|o| o.escalation = true);
        },
        "fence",
    ),
    (
        "manual request for a healthy node",
        |s| {
            let n = node_mut(s, "m0");
            n.last_heartbeat_change = Mono::from_secs(NOW);
            n.fence = manual(|_| {});
        },
        "hold_node_not_unhealthy",
    ),
    (
        "manual request for a suspect node waits",
        |s| {
            let n = node_mut(s, "m0");
            n.last_heartbeat_change = Mono::from_secs(NOW - 3);
            n.fence = manual(|_| {});
        },
        "wait_suspect",
    ),
    (
        "manual nodeHealth override still waits for forgiveness",
        |s| {
            let n = node_mut(s, "m0");
            n.last_heartbeat_change = Mono::from_secs(NOW);
            n.fence = manual(|o| o.node_health = true);
        },
        "wait_forgiveness",
    ),
    (
        "manual nodeHealth + forgiveness overrides",
        |s| {
            let n = node_mut(s, "m0");
            n.last_heartbeat_change = Mono::from_secs(NOW);
            n.fence = manual(|o| {
                o.node_health = true;
                o.forgiveness = true;
            });
        },
        "fence",
    ),
    (
        "manual nodeHealth override never earns a self-fence on a live node",
        |s| {
            let n = node_mut(s, "m0");
            n.last_heartbeat_change = Mono::from_secs(NOW);
            n.fence_target = None;
            n.advertisement = advertised(15, Some(10));
            n.fence = manual(|o| {
                o.node_health = true;
                o.forgiveness = true;
            });
            s.policies[0].spec.trust_self_fence.enabled = true;
        },
        "hold_self_fence_not_trusted",
    ),
    (
        "manual request: paused still holds",
        |s| {
            node_mut(s, "m0").fence = manual(|o| {
                o.quorum_guard = true;
                o.forgiveness = true;
                o.node_health = true;
                o.escalation = true;
            });
            s.policies[0].spec.paused = true;
        },
        "hold_paused",
    ),
    (
        "manual request: exclusion still holds",
        |s| {
            let n = node_mut(s, "m0");
            n.fence = manual(|o| o.quorum_guard = true);
            n.exclusion = Some(Exclusion::OptOut);
        },
        "hold_excluded_opt_out",
    ),
    (
        "controller-created pending fence is decided normally",
        |s| {
            node_mut(s, "m0").fence = FenceState::Pending { manual: None };
        },
        "fence",
    ),
];

#[test]
fn decision_table() {
    let mut failures = Vec::new();
    for (name, mutate, want) in CASES {
        let mut s = world();
        mutate(&mut s);
        let got = label_of(&s, "m0");
        if got != *want {
            failures.push(format!(
                "{name}: want {want}, got {got} ({:?})",
                verdict_of(&s, "m0")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_hold_label_is_listed_and_distinct() {
    let mut labels = HoldReason::LABELS.to_vec();
    labels.sort();
    labels.dedup();
    assert_eq!(labels.len(), HoldReason::LABELS.len());
    for (_, mutate, want) in CASES {
        if let Some(h) = want.strip_prefix("hold_") {
            assert!(HoldReason::LABELS.contains(&h), "{h} missing from LABELS");
        }
        let _ = mutate;
    }
}

#[test]
fn verdict_details_carry_the_numbers() {
    // Quorum: 3 of 5 silent, 2 allowed.
    let mut s = world();
    node_mut(&mut s, "m2").last_heartbeat_change = Mono::from_secs(0);
    node_mut(&mut s, "m4").last_heartbeat_change = Mono::from_secs(0);
    let v = verdict_of(&s, "m0").unwrap();
    assert_eq!(
        v,
        Verdict::Hold(HoldReason::QuorumLost {
            silent: 3,
            total: 5,
            allowed: 2
        })
    );
    assert!(v.message().contains("3 of 5"), "{}", v.message());

    // Suspect waits until Unhealthy (last change + 4 s).
    let mut s = world();
    node_mut(&mut s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 3);
    assert_eq!(
        verdict_of(&s, "m0"),
        Some(Verdict::Wait {
            until: Mono::from_secs(NOW + 1),
            reason: WaitReason::Suspect
        })
    );

    // Forgiveness waits until Unhealthy + 30 s.
    let mut s = world();
    node_mut(&mut s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 20);
    assert_eq!(
        verdict_of(&s, "m0"),
        Some(Verdict::Wait {
            until: Mono::from_secs(NOW - 20 + 4 + 30),
            reason: WaitReason::Forgiveness {
                forgiveness: Duration::from_secs(30),
                pdb_urgent: false
            }
        })
    );

    // Exhausted PDB: fence now, flagged urgent, forgiveness 0.
    s.pdbs.push(pdb("db", "m0-db", 0, true));
    let Some(Verdict::Fence(plan)) = verdict_of(&s, "m0") else {
        panic!("expected fence")
    };
    assert!(plan.pdb_urgent);
    assert_eq!(plan.forgiveness, Duration::ZERO);
    assert_eq!(plan.requested_by, RequestedBy::Controller);
    assert_eq!(plan.policy, "p");
    assert_eq!(plan.levels.len(), 1);
    assert!(
        matches!(&plan.levels[0], PlanLevel::Hardware { devices, .. } if devices[0].url == "ipmi://bmc-m0")
    );

    // Cooldown reports its end.
    let mut s = world();
    node_mut(&mut s, "m0").past_fences = vec![wall(-300)];
    assert_eq!(
        verdict_of(&s, "m0"),
        Some(Verdict::Hold(HoldReason::Cooldown { until: wall(300) }))
    );
    // A manual request overriding escalation is not held by the cooldown.
    node_mut(&mut s, "m0").fence = FenceState::Pending {
        manual: Some(Overrides {
            escalation: true,
            ..Overrides::default()
        }),
    };
    assert!(
        matches!(verdict_of(&s, "m0"), Some(Verdict::Fence(_))),
        "{:?}",
        verdict_of(&s, "m0")
    );
}

#[test]
fn the_bridge_host_is_fenced_only_through_direct_levels() {
    let mut s = world();
    let n = node_mut(&mut s, "m0");
    n.hosts_bridge = true;
    n.fence_target = Some(Lent::from(target(vec![
        vec![("bridge://fw:9443/m0".into(), DeviceKind::Power)],
        vec![("ipmi://bmc-m0:623".into(), DeviceKind::Power)],
    ])));
    let Some(Verdict::Fence(plan)) = verdict_of(&s, "m0") else {
        panic!("expected fence through the direct level")
    };
    assert_eq!(plan.levels.len(), 1);
    assert!(
        matches!(&plan.levels[0], PlanLevel::Hardware { devices, .. } if devices[0].url.starts_with("ipmi://"))
    );
    // Any other node still uses the bridge.
    node_mut(&mut s, "m0").hosts_bridge = false;
    let Some(Verdict::Fence(plan)) = verdict_of(&s, "m0") else {
        panic!("expected fence")
    };
    assert_eq!(plan.levels.len(), 2);
}

#[test]
fn self_fence_plan_trusts_after_timeout_plus_margin() {
    let mut s = world();
    s.policies[0].spec.trust_self_fence.enabled = true;
    s.policies[0].spec.trust_self_fence.margin_seconds = 5;
    let n = node_mut(&mut s, "m0");
    n.fence_target = None;
    n.advertisement = advertised(15, Some(10));
    let Some(Verdict::Fence(plan)) = verdict_of(&s, "m0") else {
        panic!("expected fence")
    };
    // Self-fence timeout + twice the watchdog timeout + margin, from the last observed
    // renewal.
    assert_eq!(
        plan.levels,
        vec![PlanLevel::SelfFence {
            silent_since: Mono::from_secs(DEAD),
            wait: Duration::from_secs(15 + 2 * 10 + 5),
            scope: palisade_model::nodefence::Coverage::All,
            marker: Some("lease=1;ready=-".into()),
        }]
    );
    // Persisted in wall-clock terms relative to the round's clocks.
    let persisted = plan.to_status(&s.now);
    let t = persisted.levels[0].trusted_after.as_ref().unwrap().0;
    assert_eq!(t, wall(DEAD as i64 + 40 - NOW as i64));
    assert_eq!(persisted.levels[0].trust_wait_seconds, Some(40));
    assert_eq!(
        persisted.levels[0].silent_since.as_ref().unwrap().0,
        wall(DEAD as i64 - NOW as i64)
    );
    // A hardware level takes precedence over trust.
    node_mut(&mut s, "m0").fence_target = Some(Lent::from(target(vec![vec![(
        "bridge://127.0.0.1:9443/m0".into(),
        DeviceKind::Power,
    )]])));
    let Some(Verdict::Fence(plan)) = verdict_of(&s, "m0") else {
        panic!("expected fence")
    };
    assert!(matches!(plan.levels[0], PlanLevel::Hardware { .. }));
}

/// Issue 38: agents whose peer check vouched after 3.3 s (the old default with
/// `--self-fence-after 8s`) left the controller a healthy window of zero, so the fence waited
/// for a healthy majority until its budget ran out. Such a self-fence is held, with a reason
/// that says what to change.
#[test]
fn a_peer_check_that_leaves_no_healthy_window_earns_no_trust_and_says_why() {
    let mut s = world();
    s.policies[0].spec.trust_self_fence.enabled = true;
    let n = node_mut(&mut s, "m0");
    n.fence_target = None;
    n.advertisement = advertised(8, Some(6));
    let peer = |vouch_ms: u64| palisade_model::advertise::PeerCheck {
        vouch_after: Duration::from_millis(vouch_ms),
        answer_valid: Duration::from_secs(10),
        members: None,
    };
    node_mut(&mut s, "m0").advertisement.peer_check = Some(peer(3_333));
    let Some(Verdict::Hold(HoldReason::SelfFenceNotTrusted { why })) = verdict_of(&s, "m0") else {
        panic!("expected a hold, got {:?}", verdict_of(&s, "m0"))
    };
    assert!(why.contains("--peer-vouch-after"), "{why}");
    // A vouch delay that leaves a window plans the self-fence as before.
    node_mut(&mut s, "m0").advertisement.peer_check = Some(peer(6_000));
    assert!(matches!(verdict_of(&s, "m0"), Some(Verdict::Fence(_))));
}

/// Issue 32 item 4: a hypervisor can pause a virtual machine, freezing its watchdog and its
/// clocks, and resume it beside its pods' replacements. By default such a machine's
/// self-fence is held, with a reason naming what the agent detected.
#[test]
fn a_virtual_machines_self_fence_is_not_trusted_by_default_and_the_reason_names_the_hypervisor() {
    use palisade_model::advertise::WatchdogAction;
    let mut s = world();
    s.policies[0].spec.trust_self_fence.enabled = true;
    let n = node_mut(&mut s, "m0");
    n.fence_target = None;
    // A softdog that resets the guest: its own action is known, the machine is still a VM.
    n.advertisement = advertised_vm(8, 6, "kvm");
    if let Some(w) = n.advertisement.watchdog.as_mut() {
        w.action = Some(WatchdogAction::Reset);
        w.driver = Some("softdog".into());
    }
    let Some(Verdict::Hold(HoldReason::SelfFenceNotTrusted { why })) = verdict_of(&s, "m0") else {
        panic!("expected a hold, got {:?}", verdict_of(&s, "m0"))
    };
    assert!(why.contains("machine is a kvm virtual machine"), "{why}");
    // The operator asserts its hypervisor never pauses it and resets it on expiry.
    s.policies[0].spec.trust_self_fence.virtual_machines = VirtualMachines::Accept;
    assert!(matches!(verdict_of(&s, "m0"), Some(Verdict::Fence(_))));
}

/// Issue 32 item 5: an emulated watchdog (the lab's i6300esb) does what the hypervisor was
/// told (`reset`, but also `none` or `pause`): trusted only when the policy accepts VMs.
#[test]
fn an_emulated_watchdog_is_trusted_only_when_the_policy_accepts_virtual_machines() {
    let mut s = world();
    s.policies[0].spec.trust_self_fence.enabled = true;
    let n = node_mut(&mut s, "m0");
    n.fence_target = None;
    n.advertisement = advertised_vm(8, 6, "kvm");
    // Even were it detected as bare metal, the action is the hypervisor's.
    n.advertisement.virtualization = Some(palisade_model::advertise::Virtualization::None);
    let Some(Verdict::Hold(HoldReason::SelfFenceNotTrusted { why })) = verdict_of(&s, "m0") else {
        panic!("expected a hold, got {:?}", verdict_of(&s, "m0"))
    };
    assert!(
        why.contains("watchdog i6300esb's expiry action is decided by the hypervisor"),
        "{why}"
    );
    s.policies[0].spec.trust_self_fence.virtual_machines = VirtualMachines::Accept;
    assert!(matches!(verdict_of(&s, "m0"), Some(Verdict::Fence(_))));
}

/// Issue 32 item 5: a watchdog known not to reset (softdog with `soft_noboot`) or not
/// classified is never trusted, not even on a policy that accepts virtual machines.
#[test]
fn a_watchdog_that_never_resets_is_not_trusted_even_when_virtual_machines_are_accepted() {
    use palisade_model::advertise::WatchdogAction;
    for (action, words) in [
        (
            WatchdogAction::None,
            "watchdog softdog's expiry does not reset the machine",
        ),
        (
            WatchdogAction::Unknown,
            "watchdog softdog's expiry action is unknown",
        ),
    ] {
        let mut s = world();
        s.policies[0].spec.trust_self_fence.enabled = true;
        s.policies[0].spec.trust_self_fence.virtual_machines = VirtualMachines::Accept;
        let n = node_mut(&mut s, "m0");
        n.fence_target = None;
        n.advertisement = advertised(8, Some(6));
        if let Some(w) = n.advertisement.watchdog.as_mut() {
            w.action = Some(action);
            w.driver = Some("softdog".into());
        }
        let Some(Verdict::Hold(HoldReason::SelfFenceNotTrusted { why })) = verdict_of(&s, "m0")
        else {
            panic!("expected a hold, got {:?}", verdict_of(&s, "m0"))
        };
        assert!(why.contains(words), "{why}");
    }
}

/// An agent older than issue 32 advertises neither the watchdog's action nor the machine:
/// it is not trusted, and the reason says to upgrade it.
#[test]
fn an_older_agent_that_advertises_no_expiry_action_is_not_trusted() {
    let mut s = world();
    s.policies[0].spec.trust_self_fence.enabled = true;
    s.policies[0].spec.trust_self_fence.virtual_machines = VirtualMachines::Accept;
    let n = node_mut(&mut s, "m0");
    n.fence_target = None;
    n.advertisement = advertised(8, Some(6));
    n.advertisement.virtualization = None;
    if let Some(w) = n.advertisement.watchdog.as_mut() {
        w.action = None;
        w.driver = None;
    }
    let Some(Verdict::Hold(HoldReason::SelfFenceNotTrusted { why })) = verdict_of(&s, "m0") else {
        panic!("expected a hold, got {:?}", verdict_of(&s, "m0"))
    };
    assert!(why.contains("upgrade the node agent"), "{why}");
}

#[test]
fn highest_priority_pods_are_fenced_first_when_limited() {
    let mut s = world();
    s.policies[0].spec.limits.max_unhealthy = IntOrString::Int(3);
    // m0 (priority 100, zone a), m2 (priority 1000, zone b), m4 (priority 100, zone c, dead longer).
    node_mut(&mut s, "m2").last_heartbeat_change = Mono::from_secs(DEAD);
    node_mut(&mut s, "m2").pods[0].priority = 1000;
    node_mut(&mut s, "m4").last_heartbeat_change = Mono::from_secs(DEAD - 10);
    assert_eq!(label_of(&s, "m2"), "fence");
    assert_eq!(label_of(&s, "m0"), "hold_concurrency_limit");
    assert_eq!(label_of(&s, "m4"), "hold_concurrency_limit");
    // With two slots, the tie on priority goes to the node Unhealthy longest (m4).
    s.policies[0].spec.limits.max_concurrent = 2;
    assert_eq!(label_of(&s, "m2"), "fence");
    assert_eq!(label_of(&s, "m4"), "fence");
    assert_eq!(
        verdict_of(&s, "m0"),
        Some(Verdict::Hold(HoldReason::ConcurrencyLimit {
            in_flight: 2,
            max: 2
        }))
    );
}

#[test]
fn per_domain_limit_admits_one_per_zone_in_a_round() {
    let mut s = world();
    s.policies[0].spec.limits.max_unhealthy = IntOrString::Int(3);
    s.policies[0].spec.limits.max_concurrent = 5;
    node_mut(&mut s, "m1").last_heartbeat_change = Mono::from_secs(DEAD);
    node_mut(&mut s, "m1").pods[0].priority = 500;
    node_mut(&mut s, "m2").last_heartbeat_change = Mono::from_secs(DEAD);
    assert_eq!(label_of(&s, "m1"), "fence");
    assert_eq!(
        verdict_of(&s, "m0"),
        Some(Verdict::Hold(HoldReason::DomainLimit {
            domain: "a".into(),
            in_flight: 1,
            max: 1
        }))
    );
    assert_eq!(label_of(&s, "m2"), "fence");
}

#[test]
fn silent_nodes_without_policy_are_reported_healthy_ones_are_not() {
    let mut s = world();
    s.policies.clear();
    let d = decide(&s);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].node, "m0");
    assert_eq!(d[0].verdict, Verdict::Hold(HoldReason::NoPolicy));
}

#[test]
fn a_partitioned_controller_sees_everything_silent_and_acts_on_nothing() {
    let mut s = world();
    s.policies[0].spec.limits.max_unhealthy = IntOrString::String("100%".into());
    for n in &mut s.nodes {
        n.last_heartbeat_change = Mono::from_secs(0);
    }
    let d = decide(&s);
    assert_eq!(d.len(), 5);
    assert!(
        d.iter().all(|d| d.verdict.label() == "hold_all_zones_down"),
        "{d:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Properties over random snapshots.

fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
    let arb_node = (
        0usize..3,     // zone
        0u64..=NOW,    // last heartbeat change
        0u8..6,        // exclusion / fence state selector
        any::<bool>(), // rwo
        -10i32..1000,  // priority
        0u64..60,      // toleration seconds
        0u8..4,        // manual overrides bitmask selector
    );
    (
        proptest::collection::vec(arb_node, 1..9),
        any::<bool>(),
        any::<bool>(),
        1i32..4,
        1i32..3,
        0i32..6,
        any::<bool>(),
    )
        .prop_map(
            |(nodes, paused, dry_run, max_conc, per_domain, max_unhealthy, trust)| {
                let mut s = world();
                s.nodes.clear();
                for (i, (zone, last, sel, rwo, prio, tol, ov)) in nodes.into_iter().enumerate() {
                    let mut n = node(&format!("n{i}"), ["a", "b", "c"][zone]);
                    n.last_heartbeat_change = Mono::from_secs(last);
                    n.pods[0].uses_rwo_volume = rwo;
                    n.pods[0].priority = prio;
                    n.pods[0].unreachable = Tolerance::For(Duration::from_secs(tol));
                    match sel {
                        1 => n.exclusion = Some(Exclusion::OptOut),
                        2 => n.fence = FenceState::InFlight,
                        3 => {
                            n.fence = manual(|o| {
                                o.quorum_guard = ov & 1 == 1;
                                o.forgiveness = ov & 2 == 2;
                            })
                        }
                        4 => n.fence_target = None,
                        _ => {}
                    }
                    n.advertisement = advertised(5, Some(5));
                    s.nodes.push(n);
                }
                let p = &mut s.policies[0].spec;
                p.paused = paused;
                p.dry_run = dry_run;
                p.limits.max_concurrent = max_conc;
                p.limits.per_domain.max_concurrent = per_domain;
                p.limits.max_unhealthy = IntOrString::Int(max_unhealthy);
                p.trust_self_fence.enabled = trust;
                s
            },
        )
}

fn silent(s: &Snapshot, n: &palisade_decide::snapshot::NodeSnapshot) -> bool {
    s.now.mono.since(n.last_heartbeat_change) >= Duration::from_secs(2)
}

fn fenced(s: &Snapshot) -> Vec<String> {
    decide(s)
        .into_iter()
        .filter(|d| d.verdict.is_fence())
        .map(|d| d.node)
        .collect()
}

fn quorum_override(s: &Snapshot, node: &str) -> bool {
    s.nodes.iter().any(|n| {
        n.name == node
            && matches!(n.fence, FenceState::Pending { manual: Some(o) } if o.quorum_guard)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn verdict_is_deterministic_and_order_independent(s in arb_snapshot()) {
        let a = decide(&s);
        prop_assert_eq!(&a, &decide(&s));
        let mut r = s.clone();
        r.nodes.reverse();
        prop_assert_eq!(a, decide(&r));
    }

    #[test]
    fn never_fence_when_paused_or_dry_run(mut s in arb_snapshot(), dry in any::<bool>()) {
        if dry { s.policies[0].spec.dry_run = true } else { s.policies[0].spec.paused = true }
        prop_assert!(fenced(&s).is_empty());
    }

    #[test]
    fn never_fence_when_quorum_lost_without_override(s in arb_snapshot()) {
        let silent_count = s.nodes.iter().filter(|n| silent(&s, n)).count();
        let allowed = usize::try_from(match &s.policies[0].spec.limits.max_unhealthy {
            IntOrString::Int(i) => *i,
            IntOrString::String(_) => unreachable!(),
        }).unwrap();
        let zones_all_down = ["a", "b", "c"].iter().all(|z| {
            s.nodes.iter().filter(|n| n.labels[ZONE] == *z).all(|n| silent(&s, n))
        });
        if silent_count > allowed || zones_all_down {
            for n in fenced(&s) {
                prop_assert!(quorum_override(&s, &n), "{n} fenced with quorum lost");
            }
        }
    }

    #[test]
    fn never_exceed_concurrency_limits(s in arb_snapshot()) {
        let spec = &s.policies[0].spec;
        let in_flight: Vec<_> = s.nodes.iter().filter(|n| n.fence == FenceState::InFlight).collect();
        let f = fenced(&s);
        prop_assert!(in_flight.len() + f.len() <= spec.limits.max_concurrent as usize || f.is_empty());
        for z in ["a", "b", "c"] {
            let busy = in_flight.iter().filter(|n| n.labels[ZONE] == z).count();
            let new = s.nodes.iter().filter(|n| n.labels[ZONE] == z && f.contains(&n.name)).count();
            prop_assert!(new == 0 || busy + new <= spec.limits.per_domain.max_concurrent as usize);
        }
    }

    #[test]
    fn every_wait_is_for_a_future_instant(s in arb_snapshot()) {
        for d in decide(&s) {
            if let Verdict::Wait { until, .. } = d.verdict {
                prop_assert!(until > s.now.mono, "{} waits for the past: {until:?}", d.node);
            }
        }
    }

    #[test]
    fn never_fence_excluded_healthy_or_unplanned_nodes(s in arb_snapshot()) {
        for name in fenced(&s) {
            let n = s.nodes.iter().find(|n| n.name == name).unwrap();
            prop_assert!(n.exclusion.is_none());
            prop_assert!(s.now.mono.since(n.last_heartbeat_change) >= Duration::from_secs(4), "{name} not Unhealthy");
            prop_assert!(n.pods.iter().any(|p| p.uses_rwo_volume));
            prop_assert!(n.fence_target.is_some() || s.policies[0].spec.trust_self_fence.enabled);
            let open = matches!(n.fence, FenceState::None | FenceState::Pending { .. });
            prop_assert!(open, "{} already fencing", name);
        }
    }
}

#[test]
fn the_random_snapshots_exercise_fences_and_holds() {
    // Guard against vacuous properties: the generator must produce fences, quorum holds and
    // limit holds often enough.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = arb_snapshot();
    let mut labels = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..2000 {
        let s = strategy.new_tree(&mut runner).unwrap().current();
        for d in decide(&s) {
            *labels.entry(d.verdict.label()).or_default() += 1;
        }
    }
    for want in [
        "fence",
        "hold_quorum_lost",
        "hold_all_zones_down",
        "hold_concurrency_limit",
        "hold_domain_limit",
        "hold_dry_run",
        "hold_paused",
    ] {
        assert!(
            labels.get(want).copied().unwrap_or(0) > 0,
            "{want} never produced: {labels:?}"
        );
    }
}

#[test]
fn a_level_that_must_not_power_off_is_planned_storage_first() {
    let mut s = world();
    let mut t = target(vec![vec![
        ("ipmi://bmc-m0".to_string(), DeviceKind::Power),
        ("storagefw+https://fw/m0".to_string(), DeviceKind::Storage),
    ]]);
    t.levels[0].power_off = palisade_model::target::PowerOff::Disallowed;
    node_mut(&mut s, "m0").fence_target = Some(Lent::from(t));
    let Some(Verdict::Fence(plan)) = verdict_of(&s, "m0") else {
        panic!("expected fence")
    };
    let PlanLevel::Hardware {
        devices, power_off, ..
    } = &plan.levels[0]
    else {
        panic!("expected a hardware level: {plan:?}")
    };
    assert_eq!(*power_off, palisade_model::target::PowerOff::Disallowed);
    let kinds: Vec<DeviceKind> = devices.iter().map(|d| d.kind).collect();
    assert_eq!(kinds, vec![DeviceKind::Storage, DeviceKind::Power]);
    // Persisted as a level that resets instead of powering off.
    let persisted = plan.to_status(&palisade_decide::Clocks {
        mono: Mono::from_secs(NOW),
        wall: wall(0),
    });
    assert_eq!(
        persisted.levels[0].kind,
        palisade_model::nodefence::LevelKind::StorageThenReset
    );
}

/// Found by the nemesis on QEMU machines (campaign seed 20261132): the control plane stalled
/// under load, every node went silent and the quorum guard held; the moment most nodes had
/// renewed again it let go, and a node whose renewal was still on its way was fenced for a
/// silence it could not help (its writes could not land). A node silent through a guard's hold
/// now gets the full Unhealthy threshold counted from the guard's last hold.
#[test]
fn after_the_quorum_guard_lets_go_a_node_silent_through_it_gets_the_full_threshold() {
    let mut s = world();
    assert_eq!(label_of(&s, "m0"), "fence", "the baseline: m0 is dead");
    assert!(guards_holding(&s).is_empty());
    let mut outage = s.clone();
    for n in ["m2", "m4"] {
        node_mut(&mut outage, n).last_heartbeat_change = Mono::from_secs(DEAD);
    }
    assert_eq!(
        guards_holding(&outage),
        ["p"],
        "3 of 5 silent: the guard holds"
    );
    assert_eq!(label_of(&outage, "m0"), "hold_quorum_lost");

    // The guard held a second ago: m0 waits out the Unhealthy threshold from then.
    s.policies[0].guard_held_at = Some(Mono::from_secs(NOW - 1));
    assert_eq!(
        verdict_of(&s, "m0"),
        Some(Verdict::Wait {
            until: Mono::from_secs(NOW - 1 + 4),
            reason: WaitReason::AfterQuorumGuard,
        })
    );
    // Still silent once the threshold has run from the hold (the others renewing): fenced.
    s.now.mono = Mono::from_secs(NOW + 3);
    for n in ["m1", "m2", "m3", "m4"] {
        node_mut(&mut s, n).last_heartbeat_change = Mono::from_secs(NOW + 3);
    }
    assert_eq!(label_of(&s, "m0"), "fence");
    // A node that renewed after the hold is judged by its own silence, as before.
    s.now.mono = Mono::from_secs(NOW);
    node_mut(&mut s, "m0").last_heartbeat_change = Mono::from_secs(NOW - 1);
    assert_eq!(label_of(&s, "m0"), "none");
    // A person's request that overrides the quorum guard overrides this too.
    node_mut(&mut s, "m0").last_heartbeat_change = Mono::from_secs(DEAD);
    node_mut(&mut s, "m0").fence = manual(|o| o.quorum_guard = true);
    assert_eq!(label_of(&s, "m0"), "fence");
}

/// m1 renewed at NOW-1.3 s (every second, as observed), its BMC has read it off since
/// NOW-1.1 s; forgiveness 0, power evidence after 1 s; every other node healthy.
fn powered_off() -> Snapshot {
    use palisade_decide::power::PowerReading;
    let mut s = world();
    let spec = &mut s.policies[0].spec;
    spec.detection.power_off_after_seconds = 1;
    spec.forgiveness.respect_tolerations = false;
    spec.forgiveness.default_seconds = 0;
    let ms = |v: u64| Mono::from_millis(NOW * 1000 - v);
    node_mut(&mut s, "m0").last_heartbeat_change = Mono::from_secs(NOW);
    let m1 = node_mut(&mut s, "m1");
    m1.last_heartbeat_change = ms(1_300);
    m1.renewal_gap = Some(Duration::from_secs(1));
    let mut watch = palisade_decide::power::PowerWatch::new();
    for at in [1_100, 900, 700, 500, 300, 50] {
        watch.observe("m1", PowerReading::Off, ms(at), ms(at - 10));
    }
    m1.power_off = watch.off_run("m1");
    s
}

#[test]
fn a_machine_its_bmc_reads_off_is_fenced_before_the_silence_threshold() {
    let s = powered_off();
    let v = verdict_of(&s, "m1").expect("a verdict for m1");
    let Verdict::Fence(plan) = &v else {
        panic!("expected a fence, got {v:?}")
    };
    assert!(matches!(
        plan.cause,
        palisade_decide::Cause::PowerOff { .. }
    ));
    assert!(v.message().contains("on power evidence"), "{}", v.message());
    // The same node, judged by its silence alone, is still healthy (1.3 s of silence).
    let mut by_silence = s.clone();
    node_mut(&mut by_silence, "m1").power_off = None;
    assert_eq!(label_of(&by_silence, "m1"), "none");
}

#[test]
fn power_evidence_needs_every_part_of_its_rule() {
    type Edit = fn(&mut Snapshot);
    let cases: [(&str, Edit); 6] = [
        ("turned off by the policy", |s| {
            s.policies[0].spec.detection.power_off_after_seconds = 0
        }),
        ("the run is shorter than powerOffAfterSeconds", |s| {
            s.policies[0].spec.detection.power_off_after_seconds = 2
        }),
        ("renewed after the first off read", |s| {
            node_mut(s, "m1").last_heartbeat_change = Mono::from_millis(NOW * 1000 - 1_000)
        }),
        ("no renewal missed: it renews every 2 s", |s| {
            node_mut(s, "m1").renewal_gap = Some(Duration::from_secs(2))
        }),
        ("its rhythm is unknown", |s| {
            node_mut(s, "m1").renewal_gap = None
        }),
        ("paused", |s| s.policies[0].spec.paused = true),
    ];
    for (why, edit) in cases {
        let mut s = powered_off();
        edit(&mut s);
        let v = verdict_of(&s, "m1");
        assert!(
            !matches!(v, Some(Verdict::Fence(_))),
            "{why}: fenced anyway: {v:?}"
        );
    }
}

#[test]
fn nodes_read_off_count_toward_the_quorum_guard() {
    // A PDU or a BMC firmware that reads every machine off at once is not believed past the
    // guard: three of five read off is more than 40% silent.
    let mut s = powered_off();
    let run = node_mut(&mut s, "m1").power_off.clone();
    for n in ["m2", "m3"] {
        let m = node_mut(&mut s, n);
        m.last_heartbeat_change = Mono::from_millis(NOW * 1000 - 1_300);
        m.renewal_gap = Some(Duration::from_secs(1));
        m.power_off = run.clone();
    }
    assert!(
        !guards_holding(&s).is_empty(),
        "the guard must count machines read off as silent"
    );
    assert!(decide(&s)
        .iter()
        .all(|d| !matches!(d.verdict, Verdict::Fence(_))));
}

/// Issue 32 item 2: an API server that answers some nodes and not others. The node it starves
/// completely looks dead; the others' renewals arrive late. Counted with the silent ones, the
/// late nodes trip the quorum guard, and the guard's memory then re-baselines silence.
#[test]
fn renewals_arriving_late_elsewhere_hold_a_fence_of_a_silent_node() {
    use palisade_decide::detector::LongGap;
    // Thresholds 2 s and 4 s: an interval longer than 3 s is late.
    assert_eq!(
        palisade_decide::decide::late_after(palisade_decide::detector::Thresholds {
            suspect_after: Duration::from_secs(2),
            unhealthy_after: Duration::from_secs(4),
        }),
        Duration::from_secs(3)
    );
    let late = |ended: u64| LongGap {
        ended: Mono::from_secs(ended),
        length: Duration::from_millis(3_500),
    };
    // m0 silent long enough; 40 % of 5 lets 2 be silent. Alone it is fenced.
    let mut s = world();
    assert!(matches!(verdict_of(&s, "m0"), Some(Verdict::Fence(_))));

    // One late node elsewhere: 1 silent + 1 late is within what the guard allows.
    node_mut(&mut s, "m1").long_gaps = vec![late(NOW - 1)];
    assert!(matches!(verdict_of(&s, "m0"), Some(Verdict::Fence(_))));

    // Two late nodes: heartbeats are reaching the API late, so m0's silence is no evidence.
    node_mut(&mut s, "m3").long_gaps = vec![late(NOW - 3)];
    let want = Verdict::Hold(HoldReason::HeartbeatsLate {
        silent: 1,
        late: 2,
        total: 5,
        allowed: 2,
    });
    assert_eq!(verdict_of(&s, "m0"), Some(want.clone()));
    assert!(want.message().contains("late"), "{}", want.message());
    assert_eq!(
        guards_holding(&s),
        vec!["p".to_string()],
        "remembered as a hold"
    );

    // A late renewal older than the Unhealthy threshold (4 s) is over: fenced again.
    node_mut(&mut s, "m3").long_gaps = vec![late(NOW - 4)];
    assert!(matches!(verdict_of(&s, "m0"), Some(Verdict::Fence(_))));

    // An interval past the Suspect threshold but short of halfway to Unhealthy is jitter
    // (with the defaults, a 10 s renewal a little late).
    node_mut(&mut s, "m3").long_gaps = vec![LongGap {
        ended: Mono::from_secs(NOW - 1),
        length: Duration::from_secs(3),
    }];
    assert!(matches!(verdict_of(&s, "m0"), Some(Verdict::Fence(_))));

    // A silent node's own earlier lateness does not count twice.
    let mut s = world();
    node_mut(&mut s, "m0").long_gaps = vec![late(DEAD)];
    node_mut(&mut s, "m1").long_gaps = vec![late(NOW - 1)];
    assert!(matches!(verdict_of(&s, "m0"), Some(Verdict::Fence(_))));
}

/// Issue 32 item 8: a PDU outlet cannot prove which machine it powers. Under
/// `powerWithoutIdentity: AfterProof` the plan names, for each such device, the direct BMCs that
/// must answer as the node's machine before it acts; by default it names none.
#[test]
fn a_power_device_without_identity_names_its_provers_when_the_policy_requires_proof() {
    use palisade_model::policy::PowerWithoutIdentity;
    let mut s = world();
    node_mut(&mut s, "m0").fence_target = Some(Lent::from(target(vec![
        vec![("ipmi://bmc-m0".into(), DeviceKind::Power)],
        vec![
            ("snmp+pdu://pdu:161/outlets/3".into(), DeviceKind::Power),
            ("bridge://127.0.0.1:44881/m0".into(), DeviceKind::Power),
        ],
        vec![("redfish+https://bmc2-m0".into(), DeviceKind::Power)],
    ])));
    let devices = |s: &Snapshot| {
        let v = verdict_of(s, "m0");
        let Some(Verdict::Fence(plan)) = v else {
            panic!("expected fence, got {v:?}")
        };
        plan.levels
            .iter()
            .flat_map(|l| match l {
                PlanLevel::Hardware { devices, .. } => devices.clone(),
                _ => vec![],
            })
            .map(|d| (d.url, d.identity_from))
            .collect::<Vec<_>>()
    };
    assert!(
        devices(&s).iter().all(|(_, from)| from.is_none()),
        "by default every device acts as the FenceTarget says"
    );
    s.policies[0].spec.power_without_identity = PowerWithoutIdentity::AfterProof;
    let provers = Some(vec![
        "ipmi://bmc-m0".to_string(),
        "redfish+https://bmc2-m0".to_string(),
    ]);
    assert_eq!(
        devices(&s),
        vec![
            ("ipmi://bmc-m0".to_string(), None),
            ("snmp+pdu://pdu:161/outlets/3".to_string(), provers.clone()),
            ("bridge://127.0.0.1:44881/m0".to_string(), provers),
            ("redfish+https://bmc2-m0".to_string(), None),
        ]
    );
    // A FenceTarget with no direct BMC: the outlet names no prover, so it never acts.
    node_mut(&mut s, "m0").fence_target = Some(Lent::from(target(vec![vec![(
        "snmp+pdu://pdu:161/outlets/3".into(),
        DeviceKind::Power,
    )]])));
    assert_eq!(
        devices(&s),
        vec![("snmp+pdu://pdu:161/outlets/3".to_string(), Some(vec![]))]
    );
}
