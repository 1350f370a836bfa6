//! The negative controls of the lab nemesis: short campaigns against controllers with planted
//! bugs (`PALISADE_PLANTED_BUGS`, compiled into debug builds only) must report violations.
//!
//! - A writer's machine is cut off while its BMC is frozen. `ReleaseUnverified` deletes the
//!   writer's pod as fencing starts, before any level is verified; `TrustCommand` counts the
//!   frozen BMC's unanswered power off as verified. The history's checks must find both: a
//!   release before the evidence (`release-without-verified-fence`), and power-off evidence
//!   for a machine the lab saw powered (`power-off-not-true`).
//! - A writer's machine is cut off while its BMC and the PDU are frozen: only the storage-only
//!   level can verify, which covers the writer (behind its RWO volume) but not the volume-less
//!   identity placed beside it. `ReleaseUncovered` releases the identity anyway: the checks
//!   must find `release-not-covered`.
//! - The leader is killed as a writer's machine is cut off; the standby fences it with a
//!   higher token; after the heal the deposed leader's power off arrives with its old token.
//!   `IgnoreStaleTokens` makes the bridge act on it: the audit's tokens go down for the
//!   target, and the checks must find `token-regressed`.
//! - In a world without fence devices (no FenceTarget, self-fences trusted only with an armed
//!   watchdog, which the namespace machines do not have), a writer's node agent hangs for
//!   longer than detection plus its self-fence timeout while its pods keep running.
//!   `TrustWithoutWatchdog` trusts the hung agent's self-fence: the replacements start beside
//!   the still-running pods, and the checks must find two live incarnations of one identity
//!   (`at-most-one-process` for the volume-less pod, `at-most-one` for the writer). The same
//!   on QEMU machines whose agents leave their watchdog unarmed: there the host cannot see
//!   the guests' processes, and the identity's beats must prove the overlap.
//! - The controllers' watches stop delivering the writer's node's Lease (the opt-in
//!   `watch-stall` class) while the node renews on time. `FenceOnWatchedSilence` fences on
//!   the watch's view alone: the checks must find `fence-while-heard` (a fence created while
//!   the API had just heard the node) and `fence-without-cause`.

use palisade_lab::MachineKind;
use std::time::Duration;

use palisade_nemesis::schedule::{self, Fault, Target};
use palisade_nemesis::{run, Config};

const MACHINES: usize = 3;
const WRITERS: usize = 1;

/// The first seed whose first event is `wanted` aimed at the writer's machine.
fn seed_whose_first_event(wanted: impl Fn(&Fault) -> bool) -> u64 {
    seed_whose_first_event_on(MachineKind::Namespace, wanted)
}

/// As [`seed_whose_first_event`], for machines of `kind` (QEMU machines draw more classes).
fn seed_whose_first_event_on(kind: MachineKind, wanted: impl Fn(&Fault) -> bool) -> u64 {
    (1..100_000u64)
        .find(|&seed| {
            let events = schedule::generate_only(seed, 1, MACHINES, WRITERS, &[], kind);
            wanted(&events[0].fault) && events[0].fault.target() == Some(Target::WriterHost(0))
        })
        .expect("some seed draws the wanted fault under the writer first")
}

/// Runs a one-event campaign with `planted` and asserts that, for every entry of
/// `expected`, one of its checks (`a|b`: either) fired.
fn campaign_catches(seed: u64, planted: &[&str], expected: &[&str]) {
    campaign_in_world_catches(seed, false, MachineKind::Namespace, planted, expected)
}

/// As [`campaign_catches`], drawing only the classes named in `only` (opt-in classes too).
fn campaign_in_world_with(seed: u64, only: &[String], planted: &[&str], expected: &[&str]) {
    campaign(seed, only, false, MachineKind::Namespace, planted, expected)
}

/// As [`campaign_catches`], in the world `no_fence_devices` names, on machines of `kind`
/// (QEMU agents then leave their watchdog unarmed: the planted bug is what must be caught).
fn campaign_in_world_catches(
    seed: u64,
    no_fence_devices: bool,
    kind: MachineKind,
    planted: &[&str],
    expected: &[&str],
) {
    campaign(seed, &[], no_fence_devices, kind, planted, expected)
}

/// Runs a one-event campaign and asserts that, for every entry of `expected`, one of its
/// checks (`a|b`: either) fired.
fn campaign(
    seed: u64,
    only: &[String],
    no_fence_devices: bool,
    kind: MachineKind,
    planted: &[&str],
    expected: &[&str],
) {
    let cfg = Config {
        seed,
        events: 1,
        minutes: 30,
        machines: MACHINES,
        writers: WRITERS,
        out: std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "nemesis-planted-{}-{kind:?}-{seed}",
            planted.join("-")
        )),
        // A machine fenced by a planted bug may never settle: do not wait long for it.
        settle_timeout: Duration::from_secs(90),
        planted: planted.iter().map(|p| p.to_string()).collect(),
        only: only.to_vec(),
        no_fence_devices,
        machine_kind: kind,
        agents_without_watchdog: kind == MachineKind::Qemu,
    };
    let outcome = run(&cfg).expect("the campaign runs to its verdict");
    println!("{}", outcome.report);
    let found: Vec<&str> = outcome.violations.iter().map(|v| v.check).collect();
    for check in expected {
        assert!(
            check.split('|').any(|c| found.contains(&c)),
            "the planted bugs {planted:?} must be caught by {check}; found {found:?}\n{}",
            outcome.report
        );
    }
}

#[test]
fn a_campaign_against_planted_bugs_reports_both_violations() {
    let seed = seed_whose_first_event(|f| matches!(f, Fault::BmcFrozenDuringCut { .. }));
    campaign_catches(
        seed,
        &["ReleaseUnverified", "TrustCommand"],
        &["release-without-verified-fence", "power-off-not-true"],
    );
}

#[test]
fn a_campaign_against_a_release_beyond_the_fence_reports_it() {
    let seed = seed_whose_first_event(|f| matches!(f, Fault::DevicesDownDuringCut { .. }));
    campaign_catches(seed, &["ReleaseUncovered"], &["release-not-covered"]);
}

#[test]
fn a_campaign_against_a_bridge_that_ignores_stale_tokens_reports_it() {
    let seed = seed_whose_first_event(|f| matches!(f, Fault::DeposedLeaderLateRequest { .. }));
    campaign_catches(seed, &["IgnoreStaleTokens"], &["token-regressed"]);
}

#[test]
fn a_campaign_against_a_controller_that_trusts_a_self_fence_without_a_watchdog_reports_it() {
    // Hung for longer than detection (4 s) plus the self-fence timeout (4 s), the policy's
    // margin (1 s) and a replacement's start: the old and new incarnations overlap.
    let seed = seed_whose_first_event(
        |f| matches!(f, Fault::AgentStop { hold_ms, .. } if *hold_ms >= 16_000),
    );
    campaign_in_world_catches(
        seed,
        true,
        MachineKind::Namespace,
        &["TrustWithoutWatchdog"],
        &["at-most-one-process|at-most-one"],
    );
}

/// The controllers' watches stop delivering the writer's node's Lease while it renews on time.
/// `FenceOnWatchedSilence` (a NodeFence created on the watch's view alone) fences that live
/// node: the ground-truth check must find a fence created while the API had just heard the
/// node (`fence-while-heard`), and the cause check must find no fault that silenced it.
#[test]
fn a_campaign_against_a_controller_that_fences_on_its_watch_alone_reports_it() {
    let only = ["watch-stall".to_string()];
    let seed = (1..1_000u64)
        .find(|&seed| {
            let events =
                schedule::generate_only(seed, 1, MACHINES, WRITERS, &only, MachineKind::Namespace);
            events[0].fault.target() == Some(Target::WriterHost(0))
        })
        .expect("some seed stalls the writer's node's Lease");
    campaign_in_world_with(
        seed,
        &only,
        &["FenceOnWatchedSilence"],
        &["fence-while-heard", "fence-without-cause"],
    );
}

/// The same control on QEMU machines whose agents leave the guest's watchdog unarmed: the
/// identity's two incarnations run in two guests' kernels, where the host sees no process,
/// and the beats of their containers must prove them alive at once (`presence::Beats`).
#[test]
fn on_qemu_machines_the_beats_of_two_guests_prove_two_live_incarnations() {
    let seed = seed_whose_first_event_on(
        MachineKind::Qemu,
        |f| matches!(f, Fault::AgentStop { hold_ms, .. } if *hold_ms >= 16_000),
    );
    campaign_in_world_catches(
        seed,
        true,
        MachineKind::Qemu,
        &["TrustWithoutWatchdog"],
        &["at-most-one-process"],
    );
}
