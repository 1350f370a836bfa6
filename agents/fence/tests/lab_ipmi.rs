//! The IPMI backend against the lab's real `ipmi_sim` BMCs.

mod common;

use std::time::Duration;

use common::*;
use palisade_fence::{Device, FenceError, PowerDevice, PowerState};
use palisade_test_support::eventually;

#[test]
fn ipmi_off_kills_the_machine_with_verified_evidence_and_on_boots_it() {
    let lab = lab(1, false, 1);
    let rt = rt();
    let m = &lab.machines()[0];
    let dev = ipmi(&lab, 0, None);
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::On);

    let ev = rt.block_on(dev.off()).expect("off is verified");
    assert_eq!(ev.device(), dev.name());
    assert!(ev.polls() >= 1);
    assert!(ev.verified_at() >= ev.commanded_at());
    // The device's report is true: everything on the machine is gone.
    m.wait_power(false, Duration::from_secs(10))
        .expect("machine is off");
    assert!(m.processes().is_empty());
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::Off);
    // Off again is idempotent and still verified.
    rt.block_on(dev.off()).expect("repeated off is verified");

    rt.block_on(dev.on()).expect("on is verified");
    m.wait_power(true, Duration::from_secs(10))
        .expect("machine boots");
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::On);
    // ipmi_sim has no suite 17: negotiation fell back to 3.
    let Device::Ipmi(i) = &dev else { panic!() };
    assert_eq!(i.negotiated_suite(), Some(3));
}

#[test]
fn ipmi_reboot_powers_off_verified_then_boots_a_new_instance() {
    let lab = lab(1, false, 1);
    let rt = rt();
    let m = &lab.machines()[0];
    let dev = ipmi(&lab, 0, None);
    eventually("machine boots", Duration::from_secs(20), || {
        (m.is_powered() && boot_pid(&lab, 0).is_some()).then_some(())
    });
    let before = boot_pid(&lab, 0);
    let (off, _on) = rt.block_on(dev.reboot()).expect("reboot");
    assert!(off.polls() >= 1);
    eventually("machine rebooted", Duration::from_secs(20), || {
        (m.is_powered() && boot_pid(&lab, 0) != before).then_some(())
    });
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::On);
}

#[test]
fn a_wrong_password_is_refused_fences_nothing_and_does_not_lock_the_bmc() {
    let lab = lab(1, false, 1);
    let rt = rt();
    let m = &lab.machines()[0];
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
    let bad = ipmi(&lab, 0, Some("not-the-password"));
    let err = rt.block_on(bad.off()).unwrap_err();
    assert!(matches!(err, FenceError::AuthRefused { .. }), "{err}");
    assert!(!err.is_retryable());
    assert!(
        m.is_powered(),
        "a refused login must not power anything off"
    );
    // No retry storm and no leaked half-open sessions: many refused logins in a row leave
    // the BMC fully usable (ipmi_sim locks out after ~62 leaked sessions).
    for _ in 0..70 {
        let e = rt.block_on(bad.status()).unwrap_err();
        assert_eq!(e.kind(), "auth_refused");
    }
    let good = ipmi(&lab, 0, None);
    assert_eq!(rt.block_on(good.status()).unwrap(), PowerState::On);
}

#[test]
fn sessions_are_always_closed_so_many_operations_never_exhaust_the_bmc() {
    let lab = lab(1, false, 1);
    let rt = rt();
    eventually("machine boots", Duration::from_secs(20), || {
        lab.machines()[0].is_powered().then_some(())
    });
    let dev = ipmi(&lab, 0, None);
    for _ in 0..100 {
        assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::On);
    }
    rt.block_on(dev.monitor()).expect("monitor");
}

#[test]
fn an_operator_account_fences_with_verified_evidence() {
    // ipmi_sim lets an operator-level account raise its session and switch the chassis, so
    // such an account fences (ipmi-rs reports it as a wrong password instead).
    let lab = lab(1, false, 1);
    let rt = rt();
    let m = &lab.machines()[0];
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
    let b = m.bmc();
    let dev = Device::new(
        palisade_fence::Target::Ipmi(palisade_fence::target::IpmiTarget {
            host: b.host.to_string(),
            port: b.port,
            username: "operator".into(),
            cipher: Some(3),
            allow_weak_cipher_suites: false,
            system_guid: None,
        }),
        &palisade_fence::Credentials {
            password: Some(palisade_fence::Secret::from_file(&b.password_file).unwrap()),
            ..Default::default()
        },
        options(),
    )
    .unwrap();
    rt.block_on(dev.off()).expect("verified off");
    m.wait_power(false, Duration::from_secs(10))
        .expect("machine is off");
}

#[test]
fn a_pinned_system_guid_must_match_before_anything_is_commanded() {
    let lab = lab(1, false, 1);
    let rt = rt();
    let m = &lab.machines()[0];
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
    let b = m.bmc();
    let device = |guid: &str| {
        Device::new(
            palisade_fence::Target::Ipmi(palisade_fence::target::IpmiTarget {
                host: b.host.to_string(),
                port: b.port,
                username: b.user.clone(),
                cipher: Some(3),
                allow_weak_cipher_suites: false,
                system_guid: Some(guid.to_string()),
            }),
            &palisade_fence::Credentials {
                password: Some(palisade_fence::Secret::from_file(&b.password_file).unwrap()),
                ..Default::default()
            },
            options(),
        )
        .unwrap()
    };
    // Another machine's BMC (a GUID this one does not have): refused, nothing commanded.
    let wrong = device("00000000-1111-2222-3333-444444444444");
    let e = rt
        .block_on(wrong.status())
        .expect_err("status through the wrong BMC is refused");
    assert!(
        matches!(e, palisade_fence::FenceError::IdentityMismatch { .. }),
        "{e}"
    );
    let e = rt
        .block_on(wrong.off())
        .expect_err("off through the wrong BMC is refused");
    assert!(e.to_string().contains("identity mismatch"), "{e}");
    assert!(m.is_powered(), "nothing was commanded");
    // The right one (the GUID the lab configured): status and a verified off.
    let right = device(m.bmc_guid());
    assert_eq!(
        rt.block_on(right.status()).unwrap(),
        palisade_fence::PowerState::On
    );
    rt.block_on(right.off()).expect("verified off");
    m.wait_power(false, Duration::from_secs(10))
        .expect("machine is off");
}
