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

use std::time::Duration;

use palisade_nemesis::schedule::{self, Fault, Target};
use palisade_nemesis::{run, Config};

const MACHINES: usize = 3;
const WRITERS: usize = 1;

/// The first seed whose first event is `wanted` aimed at the writer's machine.
fn seed_whose_first_event(wanted: impl Fn(&Fault) -> bool) -> u64 {
    (1..100_000u64)
        .find(|&seed| {
            let events = schedule::generate(seed, 1, MACHINES, WRITERS);
            wanted(&events[0].fault) && events[0].fault.target() == Some(Target::WriterHost(0))
        })
        .expect("some seed draws the wanted fault under the writer first")
}

/// Runs a one-event campaign with `planted` and asserts every check in `expected` fired.
fn campaign_catches(seed: u64, planted: &[&str], expected: &[&str]) {
    let cfg = Config {
        seed,
        events: 1,
        minutes: 30,
        machines: MACHINES,
        writers: WRITERS,
        out: std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("nemesis-planted-{}-{seed}", planted.join("-"))),
        // A machine fenced by a planted bug may never settle: do not wait long for it.
        settle_timeout: Duration::from_secs(90),
        planted: planted.iter().map(|p| p.to_string()).collect(),
        only: Vec::new(),
    };
    let outcome = run(&cfg).expect("the campaign runs to its verdict");
    println!("{}", outcome.report);
    let found: Vec<&str> = outcome.violations.iter().map(|v| v.check).collect();
    for check in expected {
        assert!(
            found.contains(check),
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
