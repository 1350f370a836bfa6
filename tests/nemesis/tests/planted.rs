//! The negative control of the lab nemesis: a short campaign against controllers with planted
//! bugs (`PALISADE_PLANTED_BUGS`, compiled into debug builds only) must report violations. One
//! event: a writer's machine is cut off while its BMC is frozen. `ReleaseUnverified` deletes
//! the writer's pod as fencing starts, before any level is verified; `TrustCommand` counts the
//! frozen BMC's unanswered power off as verified. The history's checks must find both: a
//! release before the evidence (`release-without-verified-fence`), and power-off evidence for a
//! machine the lab saw powered (`power-off-not-true`).

use std::time::Duration;

use palisade_nemesis::schedule::{self, Fault, Target};
use palisade_nemesis::{run, Config};

const MACHINES: usize = 3;
const WRITERS: usize = 1;

/// The first seed whose first event cuts a writer's machine off while its BMC is frozen.
fn seed_with_frozen_bmc_under_a_writer() -> u64 {
    (1..100_000u64)
        .find(|&seed| {
            let events = schedule::generate(seed, 1, MACHINES, WRITERS);
            matches!(
                &events[0].fault,
                Fault::BmcFrozenDuringCut {
                    target: Target::WriterHost(_),
                    ..
                }
            )
        })
        .expect("some seed draws a frozen BMC under a writer first")
}

#[test]
fn a_campaign_against_planted_bugs_reports_both_violations() {
    let seed = seed_with_frozen_bmc_under_a_writer();
    let cfg = Config {
        seed,
        events: 1,
        minutes: 30,
        machines: MACHINES,
        writers: WRITERS,
        out: std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("nemesis-planted-{seed}")),
        // The unverified machine never powers off: do not wait long for it to settle.
        settle_timeout: Duration::from_secs(90),
        planted: vec!["ReleaseUnverified".into(), "TrustCommand".into()],
    };
    let outcome = run(&cfg).expect("the campaign runs to its verdict");
    println!("{}", outcome.report);
    let found: Vec<&str> = outcome.violations.iter().map(|v| v.check).collect();
    for check in ["release-without-verified-fence", "power-off-not-true"] {
        assert!(
            found.contains(&check),
            "the planted bugs must be caught by {check}; found {found:?}\n{}",
            outcome.report
        );
    }
}
