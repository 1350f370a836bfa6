//! Fencing levels against the lab: IPMI first, PDU second.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use palisade_fence::levels::{run, AttemptResult, FenceOutcome, Level, LevelPolicy};
use palisade_fence::{PowerAction, PowerDevice};
use palisade_test_support::eventually;

#[test]
fn bad_ipmi_credentials_fall_through_to_the_pdu_level_which_fences() {
    let lab = lab(1, true, 1);
    let rt = rt();
    let m = &lab.machines()[0];
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
    let outlets = m.outlets().to_vec();
    let levels = vec![
        Level {
            devices: vec![Arc::new(ipmi(&lab, 0, Some("wrong"))) as Arc<dyn PowerDevice>],
        },
        Level {
            devices: vec![Arc::new(pdu(&lab, &outlets, "apc", Snmp::V2c)) as Arc<dyn PowerDevice>],
        },
    ];
    let report = rt.block_on(run(&levels, PowerAction::Off, LevelPolicy::default()));
    let FenceOutcome::Fenced { level, evidence } = &report.outcome else {
        panic!("not fenced: {report:?}");
    };
    assert_eq!(*level, 1);
    assert_eq!(evidence.len(), 1);
    assert_eq!(report.attempts.len(), 2);
    match &report.attempts[0].result {
        AttemptResult::Failed(e) => assert_eq!(e.kind(), "auth_refused"),
        other => panic!("{other:?}"),
    }
    m.wait_power(false, Duration::from_secs(10))
        .expect("machine is off");
}

#[test]
fn when_every_level_fails_the_result_is_failure_with_every_attempt() {
    let lab = lab(1, true, 1);
    let rt = rt();
    let m = &lab.machines()[0];
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
    let outlets = m.outlets().to_vec();
    let levels = vec![
        Level {
            devices: vec![Arc::new(ipmi(&lab, 0, Some("wrong"))) as Arc<dyn PowerDevice>],
        },
        Level {
            devices: vec![
                Arc::new(pdu(&lab, &outlets, "apc", Snmp::V2c)) as Arc<dyn PowerDevice>,
                Arc::new(pdu(&lab, &outlets, "apc", Snmp::V2cWrong)) as Arc<dyn PowerDevice>,
            ],
        },
    ];
    let report = rt.block_on(run(&levels, PowerAction::Off, LevelPolicy::default()));
    assert!(!report.is_fenced(), "{report:?}");
    assert_eq!(report.attempts.len(), 3);
    assert!(report.attempts.iter().all(|a| !a.device.is_empty()));
    // A level where one device succeeded but another failed is still not a fence.
    assert!(matches!(report.attempts[1].result, AttemptResult::Off(_)));
    assert!(matches!(
        report.attempts[2].result,
        AttemptResult::Failed(_)
    ));
}
