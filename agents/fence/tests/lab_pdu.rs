//! The PDU backend against the lab's real Net-SNMP `snmpd` PDU.

mod common;

use std::time::Duration;

use common::*;
use palisade_fence::{Device, PowerDevice, PowerState};
use palisade_test_support::eventually;

fn boots(lab: &palisade_lab::Lab, i: usize) {
    let m = &lab.machines()[i];
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
}

fn off_on_cycle(lab: &palisade_lab::Lab, dev: &Device) {
    let rt = rt();
    let m = &lab.machines()[0];
    boots(lab, 0);
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::On);
    let ev = rt.block_on(dev.off()).expect("off verified");
    assert!(ev.polls() >= 1);
    m.wait_power(false, Duration::from_secs(10))
        .expect("machine is off");
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::Off);
    rt.block_on(dev.on()).expect("on verified");
    m.wait_power(true, Duration::from_secs(20))
        .expect("machine boots");
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::On);
}

#[test]
fn pdu_v2c_off_on_status_with_the_apc_spdu_profile() {
    let lab = lab(1, true, 1);
    let outlets = lab.machines()[0].outlets().to_vec();
    off_on_cycle(&lab, &pdu(&lab, &outlets, "apc", Snmp::V2c));
}

#[test]
fn pdu_v3_authpriv_off_on_status_with_the_apc_rpdu_profile() {
    let lab = lab(1, true, 1);
    let outlets = lab.machines()[0].outlets().to_vec();
    off_on_cycle(&lab, &pdu(&lab, &outlets, "apc-rpdu", Snmp::V3));
}

#[test]
fn pdu_v2c_off_on_status_with_the_cyberpower_profile() {
    let lab = lab(1, true, 1);
    let outlets = lab.machines()[0].outlets().to_vec();
    off_on_cycle(&lab, &pdu(&lab, &outlets, "cyberpower", Snmp::V2c));
}

#[test]
fn a_dual_outlet_machine_is_off_only_when_every_outlet_is_off() {
    let lab = lab(1, true, 2);
    let rt = rt();
    let m = &lab.machines()[0];
    let outlets = m.outlets().to_vec();
    assert_eq!(outlets.len(), 2);
    boots(&lab, 0);
    // One outlet alone does not take the machine down, and the two-outlet device says so.
    let first = pdu(&lab, &outlets[..1], "apc", Snmp::V2c);
    let both = pdu(&lab, &outlets, "apc", Snmp::V2c);
    rt.block_on(first.off()).expect("first outlet off");
    assert!(m.is_powered(), "one supply still feeds the machine");
    assert_ne!(rt.block_on(both.status()).unwrap(), PowerState::Off);
    rt.block_on(first.on()).expect("first outlet on");
    // Off on the machine's device switches both and reads both back.
    rt.block_on(both.off()).expect("both outlets off, verified");
    m.wait_power(false, Duration::from_secs(10))
        .expect("machine is off");
    let Device::Pdu(p) = &both else { panic!() };
    for o in &outlets {
        assert_eq!(rt.block_on(p.outlet_state(*o)).unwrap(), PowerState::Off);
    }
    rt.block_on(both.on()).expect("both on");
    m.wait_power(true, Duration::from_secs(20))
        .expect("machine boots");
}

#[test]
fn wrong_or_read_only_community_and_wrong_v3_key_change_nothing() {
    let lab = lab(1, true, 1);
    let rt = rt();
    let m = &lab.machines()[0];
    let outlets = m.outlets().to_vec();
    boots(&lab, 0);
    let wrong = rt
        .block_on(pdu(&lab, &outlets, "apc", Snmp::V2cWrong).off())
        .unwrap_err();
    // snmpd drops requests with an unknown community: all we can see is silence.
    assert_eq!(wrong.kind(), "timeout", "{wrong}");
    let ro = rt
        .block_on(pdu(&lab, &outlets, "apc", Snmp::V2cReadOnly).off())
        .unwrap_err();
    // A read-only community is answered with noAccess.
    assert_eq!(ro.kind(), "auth_refused", "{ro}");
    let v3 = rt
        .block_on(pdu(&lab, &outlets, "apc", Snmp::V3WrongKey).off())
        .unwrap_err();
    assert_eq!(v3.kind(), "auth_refused", "{v3}");
    assert!(!v3.to_string().contains("wrong-auth-passphrase"));
    eprintln!("wrong community: {wrong}\nread-only community: {ro}\nwrong v3 key: {v3}");
    assert!(m.is_powered(), "no refused request may cut power");
    // The read-only community can still read.
    assert_eq!(
        rt.block_on(pdu(&lab, &outlets, "apc", Snmp::V2cReadOnly).status())
            .unwrap(),
        PowerState::On
    );
}

#[test]
fn list_names_the_outlets() {
    let lab = lab(2, true, 1);
    let rt = rt();
    let outlets = lab.machines()[0].outlets().to_vec();
    let plugs = rt
        .block_on(pdu(&lab, &outlets, "apc", Snmp::V2c).list())
        .unwrap();
    assert!(plugs.len() >= 2, "{plugs:?}");
    assert!(
        plugs.iter().any(|(n, _)| *n == outlets[0].to_string()),
        "{plugs:?}"
    );
}

#[test]
fn list_shows_the_outlet_names_the_pdu_exposes_in_every_profile() {
    let lab = lab(2, true, 1);
    let rt = rt();
    let outlets = lab.machines()[0].outlets().to_vec();
    let other = lab.machines()[1].outlets()[0];
    for profile in ["apc", "apc-rpdu", "cyberpower", "auto"] {
        let plugs = rt
            .block_on(pdu(&lab, &outlets, profile, Snmp::V2c).list())
            .unwrap();
        // Every outlet of the PDU, not only the configured ones, under the PDU's own names.
        assert!(
            plugs.iter().any(|(n, _)| *n == other.to_string()),
            "{profile}: {plugs:?}"
        );
        for (n, name) in &plugs {
            assert!(
                !name.is_empty() && *name != format!("Outlet {n}"),
                "{profile}: outlet {n} is listed as {name:?}, not by the PDU's name: {plugs:?}"
            );
        }
    }
}

#[test]
fn pdu_profile_auto_reads_sys_object_id_and_says_what_it_chose() {
    // The lab's PDU reports an APC rack PDU's sysObjectID (.1.3.6.1.4.1.318.1.3.4.5): the
    // agent reads it (once) and drives the rPDU tables, as fence_apc_snmp does.
    let lab = lab(1, true, 1);
    let outlets = lab.machines()[0].outlets().to_vec();
    let dev = pdu(&lab, &outlets, "auto", Snmp::V2c);
    let Device::Pdu(p) = &dev else {
        panic!("a PDU device");
    };
    let rt = rt();
    assert_eq!(
        rt.block_on(p.profile()).expect("sysObjectID read").name,
        "apc-rpdu"
    );
    off_on_cycle(&lab, &dev);
}
