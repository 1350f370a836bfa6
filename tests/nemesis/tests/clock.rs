//! The controller clock fault acts on the real controller: a replica started under libfaketime
//! (`WorldConfig::controller_clock`) and stepped by `Controllers::step_clock` stamps its Lease
//! renewals with the stepped wall clock, while its timers, on the monotonic clock, run on.
//!
//! The leader is stepped 20 s back. Its Lease's `renewTime` (its wall clock, written every
//! second) must fall 20 s behind the true time: the wall clock moved. Its renewals must go on
//! every second and it must keep the Lease with the same fencing token: had the step moved its
//! monotonic clock too, its renew timer (tokio, monotonic) would stall for 20 s, the 4 s Lease
//! would lapse and the standby would take it. Stepped back to the true time, the stamps return.
//! Torn down, the replicas leave none of libfaketime's shared memory behind.

use palisade_lab::MachineKind;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use palisade_nemesis::world::{World, WorldConfig, LEADER_LEASE};
use palisade_scenario::{eventually, SYSTEM_NS};

/// The step, ms: far beyond the Lease's 4 s and the renew interval's 1 s.
const STEP_MS: i64 = -20_000;

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The Lease's holder and `renewTime` (µs since the epoch, on the holder's wall clock).
fn lease(world: &World) -> Option<(String, i64)> {
    let api: Api<Lease> = Api::namespaced(world.cluster.client.clone(), SYSTEM_NS);
    let spec = world
        .cluster
        .rt
        .block_on(api.get(LEADER_LEASE))
        .ok()?
        .spec?;
    Some((spec.holder_identity?, spec.renew_time?.0.as_microsecond()))
}

#[test]
fn a_stepped_controller_stamps_the_stepped_wall_clock_and_keeps_renewing_on_its_monotonic_clock() {
    let world = World::start(
        &WorldConfig {
            machines: 3,
            writers: 0,
            planted: Vec::new(),
            no_fence_devices: false,
            controller_clock: true,
            machine_kind: MachineKind::Namespace,
            agents_without_watchdog: false,
        },
        &|s| println!("{s}"),
    )
    .expect("the world starts with the controllers under libfaketime");
    let (leader, renewed) = eventually(
        "a leader renewing the Lease at the true time",
        Duration::from_secs(120),
        || lease(&world).filter(|(_, at)| (at - now_us()).abs() < 3_000_000),
    )
    .expect("a controller leads, its clock at the true time (offset +0)");
    let token = world
        .leader_token()
        .expect("the Lease carries a fencing token");
    println!("{leader} leads with token {token}, last renewed at {renewed} µs");

    world
        .controllers()
        .step_clock(&leader, STEP_MS)
        .expect("the leader's clock file is written");
    let behind = STEP_MS.unsigned_abs() as i64 * 1_000;
    // The renewals after the step are stamped below the last one before it (the clock went
    // back 20 s); renewals stamped above it ran on the true time. None at all: the renew timer
    // stalled, as it would had the step moved the monotonic clock too.
    let (mut stepped, mut unstepped) = (BTreeSet::new(), BTreeSet::new());
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        match lease(&world) {
            Some((holder, at)) if holder == leader && at < renewed => {
                stepped.insert(at);
                if now_us() - at > behind - 3_000_000 {
                    break;
                }
            }
            Some((holder, at)) if holder == leader && at > renewed => {
                unstepped.insert(at);
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        !stepped.is_empty() || unstepped.len() > 2,
        "{leader} did not renew in the 15 s after its wall clock stepped: its timers stalled, as \
         if its monotonic clock had stepped too"
    );
    assert!(
        stepped.iter().any(|at| now_us() - at > behind - 3_000_000),
        "{leader}'s renewals after the step are not 20 s behind the true time (stepped \
         {stepped:?}, at the true time {unstepped:?}): libfaketime did not step its wall clock"
    );

    // Eight renew intervals: the leader renews on its monotonic clock as if nothing happened.
    let mut stamps = BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        if let Some((holder, at)) = lease(&world) {
            assert_eq!(
                holder, leader,
                "the Lease changed hands after a wall-clock step: the leader's renewals stalled"
            );
            assert!(
                now_us() - at > behind - 3_000_000,
                "a renewal stamped near the true time while the leader's clock is stepped"
            );
            stamps.insert(at);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        world.leader_token(),
        Some(token),
        "the fencing token changed: the leader lost the Lease"
    );
    assert!(
        stamps.len() >= 4,
        "only {} renewals in 8 s at a 1 s interval: the leader's timers stalled ({stamps:?})",
        stamps.len()
    );

    world
        .controllers()
        .step_clock(&leader, 0)
        .expect("the leader's clock file is written");
    eventually(
        "the leader's renewals at the true time again",
        Duration::from_secs(15),
        || {
            lease(&world)
                .filter(|(holder, at)| *holder == leader && (at - now_us()).abs() < 3_000_000)
        },
    )
    .expect("the leader's wall clock stepped back to the true time");

    // libfaketime keeps shared memory per pid, removed only at a normal exit; a SIGKILLed
    // replica's must not outlive it, or the next process given its pid under libfaketime
    // fails to start.
    let shm: Vec<String> = ["palisade-0", "palisade-1"]
        .iter()
        .filter_map(|id| world.controllers().pid(id))
        .map(|pid| format!("/dev/shm/faketime_shm_{pid}"))
        .collect();
    assert_eq!(shm.len(), 2, "both replicas run");
    for f in &shm {
        assert!(
            Path::new(f).exists(),
            "{f}: libfaketime runs in the replica"
        );
    }
    drop(world);
    for f in &shm {
        assert!(!Path::new(f).exists(), "{f} outlived its SIGKILLed replica");
    }
}
