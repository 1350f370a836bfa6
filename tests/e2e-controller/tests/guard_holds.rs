//! Decision guards that hold fencing, end to end: the real controller binary against
//! the lab's real control plane, with simulated nodes (Node + Lease objects kept alive by the
//! test) whose FenceTargets are the machines' real BMCs, so a fence really powers a machine off.
//!
//! One lab and one controller serve five scenarios in turn (each with its own policy and node
//! names, cleaned up in between):
//! - `dryRun`: a silent node is reported (`FenceHeldDryRun`) and its machine stays on; turning
//!   dry run off fences it (so the hold, not the setup, kept it on);
//! - nodes nothing may fence: selected by no policy (`FenceHeldNoPolicy`), by two
//!   (`FenceHeldConflictingPolicies`, fenced once only one remains), or with no FenceTarget
//!   (`FenceHeldNoFenceTarget`); all stay on;
//! - the self-fence trust rule: a node that advertises self-fencing and has no hardware level
//!   is held while the policy does not trust it, and once it does, counts as fenced only after
//!   its advertised timeout plus the margin; a companion's promise whose stamp stopped long
//!   before the kubelet's renewals is held as not current;
//! - exclusions: a silent node with `palisade.dev/exclude: "true"` and one with
//!   `palisade.dev/maintenance` are held and stay on; a cordoned node is *not* excluded;
//!   lifting the maintenance annotation lets that node be fenced;
//! - `fenceWhen: StatefulOnly`: a silent node whose pod uses a ReadWriteOnce claim is fenced;
//!   one whose pods use only a ReadWriteMany claim or none is held (`FenceHeldNotStateful`);

mod common;

use std::time::Duration;

use common::sim::{powered, spec, Sim, SimNode};
use common::*;
use palisade_model::nodefence::Phase;
use serde_json::json;

const FENCED: Duration = Duration::from_secs(90);
const HELD: Duration = Duration::from_secs(60);

fn dry_run(sim: &Sim<'_>, ctl: &Controller) {
    eprintln!("== scenario: dryRun");
    let labels = [("palisade.test/scenario", "dry")];
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new("dry-a", Some(0))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("dry-up", None)
        },
    ];
    sim.nodes(&nodes);
    sim.policy("dry", spec("dry", json!({"dryRun": true})));
    sim.silence("dry-a");
    let msg = sim.wait_event("dry-a", "FenceHeldDryRun", HELD);
    assert!(msg.contains("would fence with 1 level"), "{msg}");
    // Let the controller re-decide for another 3 s with the verdict standing.
    ctl.wait_ticks(12);
    assert!(sim.fences("dry-a").is_empty(), "dryRun: no NodeFence");
    assert!(sim.lab.machines()[0].is_powered(), "dryRun: machine on");
    // The same node, the same policy without dryRun: fenced. The hold was the only obstacle.
    sim.patch_policy("dry", json!({"dryRun": false}));
    sim.wait_fence_phase("dry-a", Phase::Released, FENCED);
    assert!(
        !sim.lab.machines()[0].is_powered(),
        "fenced once dryRun is off"
    );
    sim.reset("dry", &nodes);
}

fn exclusions(sim: &Sim<'_>, ctl: &Controller) {
    eprintln!("== scenario: exclusions (opt-out annotation, maintenance, cordon)");
    let labels = [("palisade.test/scenario", "excl")];
    let nodes = [
        SimNode {
            labels: &labels,
            annotations: &[("palisade.dev/exclude", "true")],
            ..SimNode::new("excl-optout", Some(0))
        },
        SimNode {
            labels: &labels,
            annotations: &[("palisade.dev/maintenance", "disk swap")],
            ..SimNode::new("excl-maint", Some(1))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("excl-cordoned", Some(2))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("excl-up", None)
        },
    ];
    sim.nodes(&nodes);
    cordon(&sim.c, sim.rt, "excl-cordoned", true);
    sim.policy(
        "excl",
        spec(
            "excl",
            json!({"limits": {"maxUnhealthy": "100%", "maxConcurrent": 3,
                              "perDomain": {"maxConcurrent": 3}}}),
        ),
    );
    for n in ["excl-optout", "excl-maint", "excl-cordoned"] {
        sim.silence(n);
    }
    let m = sim.wait_event("excl-optout", "FenceHeldExcludedOptOut", HELD);
    assert!(m.contains("palisade.dev/exclude"), "{m}");
    let m = sim.wait_event("excl-maint", "FenceHeldExcludedMaintenance", HELD);
    assert!(m.contains("maintenance"), "{m}");
    // A cordon alone is not an exclusion (only the annotations are): that node is fenced,
    // which also shows the silent nodes were fenceable had they not been excluded.
    sim.wait_fence_phase("excl-cordoned", Phase::Released, FENCED);
    ctl.wait_ticks(12);
    for n in ["excl-optout", "excl-maint"] {
        assert!(sim.fences(n).is_empty(), "excluded: no NodeFence for {n}");
    }
    assert_eq!(
        powered(sim.lab),
        vec![true, true, false],
        "only the cordoned node's machine is off"
    );
    // Lifting maintenance makes the node fenceable again.
    sim.annotate("excl-maint", json!({"palisade.dev/maintenance": null}));
    sim.wait_fence_phase("excl-maint", Phase::Released, FENCED);
    assert!(!sim.lab.machines()[1].is_powered());
    assert!(sim.fences("excl-optout").is_empty());
    assert!(
        sim.lab.machines()[0].is_powered(),
        "the opted-out node stays on"
    );
    sim.reset("excl", &nodes);
}

fn fence_when_stateful_only(sim: &Sim<'_>, ctl: &Controller) {
    eprintln!("== scenario: fenceWhen StatefulOnly");
    let labels = [("palisade.test/scenario", "sw")];
    let nodes = [
        SimNode {
            labels: &labels,
            ..SimNode::new("sw-rwo", Some(0))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("sw-rwx", Some(1))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("sw-up", None)
        },
    ];
    sim.nodes(&nodes);
    namespace(&sim.c, sim.rt, "sw");
    sim.claim("sw", "data", "ReadWriteOnce");
    sim.claim("sw", "shared", "ReadWriteMany");
    sim.pod_with_claim("sw", "db-0", "sw-rwo", "data");
    sim.pod_with_claim("sw", "web-0", "sw-rwx", "shared");
    sim.pod("sw", "plain", "sw-rwx", &[], None);
    sim.policy("sw", spec("sw", json!({"fenceWhen": "StatefulOnly"})));
    sim.silence("sw-rwo");
    sim.silence("sw-rwx");
    let m = sim.wait_event("sw-rwx", "FenceHeldNotStateful", HELD);
    assert!(m.contains("ReadWriteOnce"), "{m}");
    sim.wait_fence_phase("sw-rwo", Phase::Released, FENCED);
    ctl.wait_ticks(12);
    assert!(sim.fences("sw-rwx").is_empty(), "no RWO volume: not fenced");
    assert_eq!(powered(sim.lab)[..2], [false, true]);
    sim.reset("sw", &nodes);
}

fn unfenceable_nodes(sim: &Sim<'_>, ctl: &Controller) {
    eprintln!("== scenario: no policy, conflicting policies, no fence target");
    let rep = [("palisade.test/scenario", "rep")];
    let both = [
        ("palisade.test/scenario", "rep"),
        ("palisade.test/overlap", "yes"),
    ];
    let nodes = [
        // Selected by no policy at all.
        SimNode::new("rep-nopolicy", Some(0)),
        // Selected by two policies.
        SimNode {
            labels: &both,
            ..SimNode::new("rep-conflict", Some(1))
        },
        // Covered, but with no FenceTarget and no self-fence advertisement.
        SimNode {
            labels: &rep,
            ..SimNode::new("rep-notarget", None)
        },
        SimNode {
            labels: &rep,
            ..SimNode::new("rep-up", None)
        },
    ];
    sim.nodes(&nodes);
    sim.policy("rep", spec("rep", json!({})));
    sim.policy(
        "rep-overlap",
        json!({"nodeSelector": {"matchLabels": {"palisade.test/overlap": "yes"}}}),
    );
    for n in ["rep-nopolicy", "rep-conflict", "rep-notarget"] {
        sim.silence(n);
    }
    let m = sim.wait_event("rep-conflict", "FenceHeldConflictingPolicies", HELD);
    assert!(m.contains("rep, rep-overlap"), "{m}");
    sim.wait_event("rep-notarget", "FenceHeldNoFenceTarget", HELD);
    // Without a policy, the default thresholds judge silence (Suspect after 10 s).
    let m = sim.wait_event("rep-nopolicy", "FenceHeldNoPolicy", HELD);
    assert!(m.contains("never fences"), "{m}");
    ctl.wait_ticks(12);
    for n in ["rep-nopolicy", "rep-conflict", "rep-notarget"] {
        assert!(sim.fences(n).is_empty(), "no NodeFence for {n}");
    }
    assert_eq!(powered(sim.lab), vec![true, true, true]);
    // Once a single policy selects it, the conflicting node is fenced: the conflict was the
    // only obstacle.
    let api: kube::Api<palisade_model::FencingPolicy> = kube::Api::all(sim.c.clone());
    sim.rt
        .block_on(api.delete("rep-overlap", &Default::default()))
        .expect("delete policy rep-overlap");
    sim.wait_fence_phase("rep-conflict", Phase::Released, FENCED);
    assert_eq!(powered(sim.lab), vec![true, false, true]);
    assert!(sim.fences("rep-nopolicy").is_empty());
    sim.reset("rep", &nodes);
}

fn trusted_self_fence(sim: &Sim<'_>, ctl: &Controller) {
    use palisade_model::advertise as ad;
    eprintln!("== scenario: trusted self-fence (no hardware level)");
    let labels = [("palisade.test/scenario", "trust")];
    // A renewal that advertises a self-fence backed by an armed, nowayout watchdog known to
    // reset the machine, on bare metal (these simulated nodes stand for physical machines).
    let armed = [
        (ad::SELF_FENCE_AFTER, "8"),
        (ad::WATCHDOG_TIMEOUT, "3"),
        (ad::WATCHDOG_NOWAYOUT, "true"),
        (ad::WATCHDOG_ACTION, "reset"),
        (ad::WATCHDOG_DRIVER, "iTCO_wdt"),
        (ad::VIRTUALIZATION, "none"),
        (ad::SELF_FENCE_SCOPE, "all"),
    ];
    let companion_gone: Vec<(&str, &str)> = armed
        .iter()
        .copied()
        .chain([
            (ad::RUNTIME_SOURCE, "cri"),
            (ad::COMPANION_WRITTEN, "2026-01-01T00:00:00Z"),
        ])
        .collect();
    let nodes = [
        SimNode {
            labels: &labels,
            lease_annotations: &armed,
            ..SimNode::new("trust-self", None)
        },
        // Self-fences, but no watchdog backs it: a hung agent would never kill anything.
        SimNode {
            labels: &labels,
            lease_annotations: &[(ad::SELF_FENCE_AFTER, "8"), (ad::SELF_FENCE_SCOPE, "all")],
            ..SimNode::new("trust-nowd", None)
        },
        // A companion's promise left on the kubelet's Lease by a companion that stopped
        // writing long before the kubelet's renewals (which keep the annotations): whatever
        // it promised, nobody keeps it now.
        SimNode {
            labels: &labels,
            lease_annotations: &companion_gone,
            ..SimNode::new("trust-companion-gone", None)
        },
        // The old sticky Node annotation alone earns nothing.
        SimNode {
            labels: &labels,
            annotations: &[("palisade.dev/self-fence-after-seconds", "8")],
            ..SimNode::new("trust-sticky", None)
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("trust-up", None)
        },
    ];
    sim.nodes(&nodes);
    sim.policy(
        "trust",
        spec(
            "trust",
            json!({"trustSelfFence": {"enabled": false, "marginSeconds": 2}}),
        ),
    );
    sim.silence("trust-self");
    // Not trusted by the policy: nothing can fence it.
    sim.wait_event("trust-self", "FenceHeldNoFenceTarget", HELD);
    ctl.wait_ticks(4);
    assert!(sim.fences("trust-self").is_empty());
    // Trusted by the policy, but not every advertisement earns trust.
    sim.patch_policy("trust", json!({"trustSelfFence": {"enabled": true}}));
    sim.silence("trust-nowd");
    sim.silence("trust-sticky");
    for n in ["trust-nowd", "trust-sticky"] {
        let m = sim.wait_event(n, "FenceHeldSelfFenceNotTrusted", HELD);
        assert!(
            m.contains("watchdog") || m.contains("self-fence timeout"),
            "{m}"
        );
        assert!(sim.fences(n).is_empty(), "{n} must not be fenced on trust");
    }
    let m = sim.wait_event("trust-nowd", "FenceHeldSelfFenceNotTrusted", HELD);
    assert!(m.contains("no armed hardware watchdog"), "{m}");
    sim.silence("trust-companion-gone");
    let m = sim.wait_event("trust-companion-gone", "FenceHeldSelfFenceNotTrusted", HELD);
    assert!(
        m.contains("companion's self-fence promise is not current"),
        "{m}"
    );
    assert!(sim.fences("trust-companion-gone").is_empty());
    // Flap: once the fence waits, the node renews once and goes silent again. Its own fence
    // clock restarts at that renewal, so the controller's wait restarts too.
    let waiting = sim.wait_fence_phase("trust-self", Phase::Fencing, FENCED);
    let first = waiting
        .status
        .as_ref()
        .expect("status")
        .plan
        .as_ref()
        .expect("plan")
        .levels[0]
        .silent_since
        .clone()
        .expect("silentSince")
        .0;
    sim.revive("trust-self");
    sim.wait_event(
        &waiting.metadata.name.clone().unwrap(),
        "SelfFenceWaitRestarted",
        HELD,
    );
    sim.silence("trust-self");
    // It counts as fenced once its advertised 8 s, plus twice the watchdog's 3 s, plus the
    // 2 s margin have passed since its last observed renewal, and never before.
    let nf = sim.wait_fence_phase("trust-self", Phase::Released, FENCED);
    let st = nf.status.as_ref().expect("status");
    let level = &st.plan.as_ref().expect("plan").levels[0];
    assert_eq!(level.kind, palisade_model::nodefence::LevelKind::SelfFence);
    assert_eq!(level.trust_wait_seconds, Some(16));
    let since = level.silent_since.as_ref().expect("silentSince").0;
    assert!(since > first, "the wait restarted from the later renewal");
    let trusted_after = level.trusted_after.as_ref().expect("trusted_after").0;
    let ev = st
        .evidence
        .iter()
        .find(|e| e.kind == palisade_model::nodefence::EvidenceKind::SelfFenceTimeout)
        .expect("self-fence evidence");
    eprintln!(
        "silent since {since} (first {first}), trusted after {trusted_after}, verified at {}",
        ev.at.0
    );
    assert!(
        trusted_after
            >= since
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(13))
                .unwrap(),
        "the trust time counts the whole wait from the last renewal"
    );
    assert!(
        ev.at.0 >= trusted_after,
        "not counted as fenced before its trust time"
    );
    sim.reset("trust", &nodes);
}

#[test]
fn dry_run_exclusions_and_unfenceable_nodes_are_held() {
    let lab = common::sim::bare_lab(3);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    let ctl = start_controller(&lab, "ctl-holds");
    type Scenario = fn(&Sim<'_>, &Controller);
    let scenarios: [(&str, Scenario); 5] = [
        ("dryRun", dry_run),
        ("unfenceable nodes", unfenceable_nodes),
        ("trusted self-fence", trusted_self_fence),
        ("exclusions", exclusions),
        ("fenceWhen", fence_when_stateful_only),
    ];
    for (name, run) in scenarios {
        let t = std::time::Instant::now();
        run(&sim, &ctl);
        eprintln!("{name}: {:.1}s", t.elapsed().as_secs_f64());
    }
}
