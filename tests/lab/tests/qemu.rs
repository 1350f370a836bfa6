//! QEMU machines: real virtual machines powered by their `ipmi_sim` BMC, driven with the
//! operators' own tools (`ipmitool`, `snmpset`). Each test boots one to three VMs, one at a
//! time; every wait is a generous deadline (a TCG boot takes seconds of a busy core).

mod common;

use std::time::Duration;

use common::*;
use palisade_lab::{Lab, LabConfig, MachineKind, QemuConfig};

/// Generous: a boot is a few seconds alone, but the machine may be busy with a build.
const BOOT: Duration = Duration::from_secs(120);

fn lab_with(machines: usize, command: &str, qemu: QemuConfig) -> Lab {
    Lab::start(LabConfig {
        machines,
        control_plane: false,
        pdu: true,
        machine_command: command.into(),
        pdu_reboot_delay: Duration::from_millis(500),
        machine_kind: MachineKind::Qemu,
        qemu,
        ..Default::default()
    })
    .expect("lab with QEMU machines starts")
}

fn lab(machines: usize) -> Lab {
    lab_with(machines, "exec sleep 100000", QemuConfig::default())
}

fn power_status(lab: &Lab, i: usize) -> String {
    stdout(&ipmitool(lab, i, &["chassis", "power", "status"]))
}

fn wait_status(lab: &Lab, i: usize, want: &str) {
    let want = format!("Chassis Power is {want}");
    eventually(&want, Duration::from_secs(60), || {
        (power_status(lab, i) == want).then_some(())
    });
}

#[test]
fn bmc_power_off_stops_the_vm_and_power_on_boots_it_with_a_new_boot_id() {
    let lab = lab(1);
    let m = &lab.machines()[0];
    let first_boot = m.boot_id().expect("a booted machine has a boot ID");
    let qemu = m.power_pid().expect("QEMU runs while the machine is on");
    assert_eq!(power_status(&lab, 0), "Chassis Power is on");
    let console = std::fs::read_to_string(m.console_log()).unwrap();
    assert!(
        console.contains(&format!("PLGUEST ready boot_id={first_boot}")),
        "the guest reports its boot on the serial console: {console}"
    );

    let off = ipmitool(&lab, 0, &["chassis", "power", "off"]);
    assert!(off.status.success(), "{off:?}");
    wait_status(&lab, 0, "off");
    // The moment the BMC says off, the VM is already gone.
    assert!(
        !palisade_lab::process::alive(qemu),
        "QEMU {qemu} outlived the BMC's \"off\""
    );
    assert!(m.processes().is_empty(), "nothing of the machine runs");
    assert!(!m.is_powered());

    let on = ipmitool(&lab, 0, &["chassis", "power", "on"]);
    assert!(on.status.success(), "{on:?}");
    let second_boot = m.wait_booted(Some(&first_boot), BOOT).expect("boots again");
    assert_ne!(second_boot, first_boot, "a new boot has a new boot ID");
    assert_ne!(m.power_pid(), Some(qemu), "a new VM process");
    assert_eq!(power_status(&lab, 0), "Chassis Power is on");
}
