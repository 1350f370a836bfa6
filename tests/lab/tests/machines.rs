//! Machines, BMCs and the PDU, driven with the operators' own tools (`ipmitool`, `snmpset`).

mod common;

use std::time::Duration;

use common::*;
use palisade_lab::{Lab, LabConfig, SnmpCred};
use palisade_test_support::eventually;

const TREE: &str = "sh -c 'sleep infinity & sleep infinity' & exec sleep infinity";

fn lab(machines: usize, outlets_per_machine: usize) -> Lab {
    Lab::start(LabConfig {
        machines,
        control_plane: false,
        pdu: true,
        outlets_per_machine,
        machine_command: TREE.into(),
        pdu_reboot_delay: Duration::from_millis(500),
        ..Default::default()
    })
    .expect("lab starts")
}

#[test]
fn bmc_power_off_kills_every_process_and_power_on_boots_again() {
    let lab = lab(1, 1);
    let m = &lab.machines()[0];
    // init, the shell, its two sleeps, and the top-level sleep: a tree with grandchildren.
    let before = eventually("machine processes", Duration::from_secs(10), || {
        let p = m.processes();
        (p.len() >= 4).then_some(p)
    });
    assert_eq!(
        stdout(&ipmitool(&lab, 0, &["chassis", "power", "status"])),
        "Chassis Power is on"
    );

    let boot_id = |m: &palisade_lab::Machine| {
        std::fs::read_to_string(m.dir().join("boot_id")).unwrap_or_default()
    };
    let first_boot = boot_id(m);
    assert!(!first_boot.trim().is_empty(), "each boot has a boot ID");
    let off = ipmitool(&lab, 0, &["chassis", "power", "off"]);
    assert!(off.status.success(), "{off:?}");
    // The moment the BMC says off, every process of the machine is already gone (the BMC
    // must never report off while a process of the machine still runs).
    eventually("BMC reports off", Duration::from_secs(30), || {
        (stdout(&ipmitool(&lab, 0, &["chassis", "power", "status"])) == "Chassis Power is off")
            .then_some(())
    });
    for pid in &before {
        assert!(
            !palisade_lab::process::alive(*pid),
            "process {pid} outlived the BMC's \"off\""
        );
    }
    assert!(m.processes().is_empty(), "no machine process outlives off");
    m.wait_power(false, Duration::from_secs(15))
        .expect("machine powers off");

    assert!(ipmitool(&lab, 0, &["chassis", "power", "on"])
        .status
        .success());
    m.wait_power(true, Duration::from_secs(15))
        .expect("machine boots");
    eventually(
        "machine processes after boot",
        Duration::from_secs(10),
        || (m.processes().len() >= 4).then_some(()),
    );
    assert_eq!(
        stdout(&ipmitool(&lab, 0, &["chassis", "power", "status"])),
        "Chassis Power is on"
    );
    assert!(
        m.processes().iter().all(|p| !before.contains(p)),
        "a booted machine runs new processes"
    );
    assert_ne!(boot_id(m), first_boot, "a new boot has a new boot ID");
}

#[test]
fn bmc_refuses_a_wrong_password_and_changes_nothing() {
    let lab = lab(1, 1);
    let m = &lab.machines()[0];
    let wrong = lab.dir().join("wrong-password");
    palisade_lab::write_secret(&wrong, b"not-the-password\n").unwrap();
    let out = ipmitool_with(
        m.bmc().port,
        &m.bmc().user,
        &wrong,
        &["chassis", "power", "off"],
    );
    assert!(!out.status.success());
    std::thread::sleep(Duration::from_millis(1500)); // longer than ipmi_sim's power tick
    assert!(
        m.is_powered(),
        "a refused command must not power the machine off"
    );
}

#[test]
fn pdu_outlet_off_cuts_machine_and_bmc_and_on_boots_both_over_v2c_and_v3() {
    let lab = lab(2, 1);
    let (m0, m1) = (&lab.machines()[0], &lab.machines()[1]);
    let rw = cred_dir(&lab, SnmpCred::V2cWrite);
    let v3 = cred_dir(&lab, SnmpCred::V3);
    let ctl = |n: u32| format!(".1.3.6.1.4.1.318.1.1.4.4.2.1.3.{n}");
    let state = |n: u32| format!(".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.{n}");

    // sysObjectID identifies an APC rack PDU, as fence_apc_snmp expects.
    let sys = snmp(
        &lab,
        &cred_dir(&lab, SnmpCred::V2cRead),
        "snmpget",
        &[".1.3.6.1.2.1.1.2.0"],
    );
    assert!(stdout(&sys).contains(".1.3.6.1.4.1.318.1.3.4.5"), "{sys:?}");

    // v2c off
    let out = snmp(&lab, &rw, "snmpset", &[&ctl(1), "i", "2"]);
    assert!(out.status.success(), "{out:?}");
    m0.wait_power(false, Duration::from_secs(10)).unwrap();
    eventually("BMC dies with its outlet", Duration::from_secs(5), || {
        (!m0.bmc_running()).then_some(())
    });
    assert!(m1.is_powered(), "the other machine is untouched");
    assert!(stdout(&snmp(&lab, &rw, "snmpget", &[&state(1)])).ends_with("INTEGER: 2"));
    // The BMC is gone with the power: IPMI gets no answer.
    assert!(!ipmitool(&lab, 0, &["chassis", "power", "status"])
        .status
        .success());

    // v3 on: the BMC comes back and boots the machine.
    let out = snmp(&lab, &v3, "snmpset", &[&ctl(1), "i", "1"]);
    assert!(out.status.success(), "{out:?}");
    m0.wait_power(true, Duration::from_secs(10)).unwrap();
    lab.wait_bmc(m0).unwrap();
    assert!(stdout(&snmp(&lab, &v3, "snmpget", &[&state(1)])).ends_with("INTEGER: 1"));

    // The CyberPower table reads the same outlet.
    let cp = snmp(
        &lab,
        &v3,
        "snmpget",
        &[".1.3.6.1.4.1.3808.1.1.3.3.5.1.1.4.1"],
    );
    assert!(stdout(&cp).ends_with("INTEGER: 1"), "{cp:?}");

    // Reboot: off, then on again by itself.
    assert!(snmp(&lab, &rw, "snmpset", &[&ctl(2), "i", "3"])
        .status
        .success());
    m1.wait_power(false, Duration::from_secs(10)).unwrap();
    m1.wait_power(true, Duration::from_secs(10)).unwrap();
}

#[test]
fn pdu_refuses_wrong_community_and_wrong_v3_key_and_changes_nothing() {
    let lab = lab(1, 1);
    let m = &lab.machines()[0];
    let bad_v2c = lab.dir().join("bad-v2c");
    std::fs::create_dir_all(&bad_v2c).unwrap();
    palisade_lab::write_secret(
        &bad_v2c.join("snmp.conf"),
        b"defVersion 2c\ndefCommunity guess\n",
    )
    .unwrap();
    let out = snmp(
        &lab,
        &bad_v2c,
        "snmpset",
        &[".1.3.6.1.4.1.318.1.1.4.4.2.1.3.1", "i", "2"],
    );
    assert!(!out.status.success(), "wrong community must fail: {out:?}");

    // The read-only community cannot switch outlets either.
    let ro = cred_dir(&lab, SnmpCred::V2cRead);
    let out = snmp(
        &lab,
        &ro,
        "snmpset",
        &[".1.3.6.1.4.1.318.1.1.4.4.2.1.3.1", "i", "2"],
    );
    assert!(
        !out.status.success(),
        "read-only community must not write: {out:?}"
    );

    let good = std::fs::read_to_string(cred_dir(&lab, SnmpCred::V3).join("snmp.conf")).unwrap();
    let bad_v3 = lab.dir().join("bad-v3");
    std::fs::create_dir_all(&bad_v3).unwrap();
    let wrong: String = good
        .lines()
        .map(|l| {
            if l.starts_with("defAuthPassphrase") {
                "defAuthPassphrase wrong-passphrase".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    palisade_lab::write_secret(&bad_v3.join("snmp.conf"), wrong.as_bytes()).unwrap();
    let out = snmp(
        &lab,
        &bad_v3,
        "snmpset",
        &[".1.3.6.1.4.1.318.1.1.4.4.2.1.3.1", "i", "2"],
    );
    assert!(!out.status.success(), "wrong v3 key must fail: {out:?}");

    std::thread::sleep(Duration::from_millis(500));
    assert!(m.is_powered());
    assert!(lab.pdu().unwrap().outlets().unwrap().iter().all(|o| o.on));
}

#[test]
fn a_machine_on_two_outlets_stays_up_until_both_are_off() {
    let lab = lab(1, 2);
    let m = &lab.machines()[0];
    assert_eq!(m.outlets(), &[1, 2]);
    let rw = cred_dir(&lab, SnmpCred::V2cWrite);
    assert!(snmp(
        &lab,
        &rw,
        "snmpset",
        &[".1.3.6.1.4.1.318.1.1.12.3.3.1.1.4.1", "i", "2"]
    )
    .status
    .success());
    std::thread::sleep(Duration::from_millis(500));
    assert!(m.is_powered(), "one power supply still feeds the machine");
    let out = snmp(
        &lab,
        &rw,
        "snmpset",
        &[".1.3.6.1.4.1.318.1.1.12.3.3.1.1.4.2", "i", "2"],
    );
    assert!(out.status.success(), "{out:?}");
    m.wait_power(false, Duration::from_secs(10)).unwrap();
}

/// A namespace machine's BMC has no VM to reset: it refuses a hard reset (as some real BMCs
/// do) and changes nothing. The QEMU machine's BMC resets its VM (`tests/qemu.rs`).
#[test]
fn a_namespace_machine_bmc_refuses_a_hard_reset_and_changes_nothing() {
    let lab = lab(1, 1);
    let m = &lab.machines()[0];
    let before = eventually("machine processes", Duration::from_secs(10), || {
        let p = m.processes();
        (p.len() >= 4).then_some(p)
    });
    let boot = std::fs::read_to_string(m.dir().join("boot_id")).unwrap();
    let reset = ipmitool(&lab, 0, &["chassis", "power", "reset"]);
    assert!(!reset.status.success(), "{reset:?}");
    assert!(
        String::from_utf8_lossy(&reset.stderr).contains("Invalid data field"),
        "{reset:?}"
    );
    assert_eq!(
        std::fs::read_to_string(m.dir().join("boot_id")).unwrap(),
        boot
    );
    assert!(before.iter().all(|p| palisade_lab::process::alive(*p)));
    assert_eq!(
        stdout(&ipmitool(&lab, 0, &["chassis", "power", "status"])),
        "Chassis Power is on"
    );
}

/// A slow chassis: with a power-off delay the BMC reports the machine on, with every process
/// alive, until the delay has passed; then off, with none left. A second power off while the
/// first is under way changes nothing.
#[test]
fn a_slow_chassis_reports_on_until_its_power_off_delay_has_passed() {
    let lab = Lab::start(LabConfig {
        machines: 1,
        control_plane: false,
        pdu: false,
        machine_command: TREE.into(),
        bmc_kill_wait: Duration::from_secs(40),
        ..Default::default()
    })
    .expect("lab starts");
    let m = &lab.machines()[0];
    let before = eventually("machine processes", Duration::from_secs(10), || {
        let p = m.processes();
        (p.len() >= 4).then_some(p)
    });
    let delay = Duration::from_secs(8);
    m.set_power_off_delay(delay).unwrap();
    assert!(!m.power_off_requested());
    let sent = std::time::Instant::now();
    assert!(ipmitool(&lab, 0, &["chassis", "power", "off"])
        .status
        .success());
    eventually(
        "the BMC asked the machine to stop",
        Duration::from_secs(10),
        || m.power_off_requested().then_some(()),
    );
    assert!(ipmitool(&lab, 0, &["chassis", "power", "off"])
        .status
        .success());
    // Sampled until shortly before the delay ends: on, every process alive.
    while sent.elapsed() + Duration::from_secs(2) < delay {
        assert_eq!(
            stdout(&ipmitool(&lab, 0, &["chassis", "power", "status"])),
            "Chassis Power is on",
            "{:?} after the command",
            sent.elapsed()
        );
        assert!(m.is_powered());
        for pid in &before {
            assert!(palisade_lab::process::alive(*pid), "{pid} still runs");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    eventually("BMC reports off", Duration::from_secs(40), || {
        (stdout(&ipmitool(&lab, 0, &["chassis", "power", "status"])) == "Chassis Power is off")
            .then_some(())
    });
    assert!(sent.elapsed() >= delay, "off only after the delay");
    assert!(m.processes().is_empty(), "no machine process outlives off");
}
