//! QEMU machines: real virtual machines powered by their `ipmi_sim` BMC, driven with the
//! operators' own tools (`ipmitool`, `snmpset`). Each test boots one to three VMs, one at a
//! time; every wait is a generous deadline (a TCG boot takes seconds of a busy core).

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;
use palisade_lab::process::{alive, pids_with_env, LAB_ENV};
use palisade_lab::{
    Cut, Lab, LabConfig, LabError, MachineKind, QemuConfig, SnmpCred, WatchdogAction,
};
use palisade_test_support::eventually;

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

#[test]
fn bmc_cycle_and_reset_reboot_the_vm() {
    let lab = lab(1);
    let m = &lab.machines()[0];
    let boot0 = m.boot_id().unwrap();
    let qemu0 = m.power_pid().unwrap();

    // cycle: a new VM process, a new boot.
    let out = ipmitool(&lab, 0, &["chassis", "power", "cycle"]);
    assert!(out.status.success(), "{out:?}");
    let boot1 = m
        .wait_booted(Some(&boot0), BOOT)
        .expect("boots after cycle");
    let qemu1 = m.power_pid().unwrap();
    assert_ne!(qemu1, qemu0, "cycle stops the VM and starts a new one");
    assert!(!alive(qemu0));

    // reset: the same VM process reboots in place.
    let out = ipmitool(&lab, 0, &["chassis", "power", "reset"]);
    assert!(out.status.success(), "{out:?}");
    let boot2 = m
        .wait_booted(Some(&boot1), BOOT)
        .expect("boots after reset");
    assert_ne!(boot2, boot0);
    assert_eq!(m.power_pid(), Some(qemu1), "reset keeps the VM process");
}

#[test]
fn pdu_outlet_off_kills_the_vm_and_its_bmc_and_on_boots_both() {
    let lab = lab(2);
    let (m0, m1) = (&lab.machines()[0], &lab.machines()[1]);
    let boot0 = m0.boot_id().unwrap();
    let qemu0 = m0.power_pid().unwrap();
    let other = (m1.boot_id().unwrap(), m1.power_pid().unwrap());
    let rw = cred_dir(&lab, SnmpCred::V2cWrite);
    let ctl = |n: u32| format!(".1.3.6.1.4.1.318.1.1.4.4.2.1.3.{n}");

    let out = snmp(&lab, &rw, "snmpset", &[&ctl(m0.outlets()[0]), "i", "2"]);
    assert!(out.status.success(), "{out:?}");
    m0.wait_power(false, Duration::from_secs(30)).unwrap();
    assert!(!alive(qemu0), "the VM dies with its outlet");
    eventually("BMC dies with its outlet", Duration::from_secs(30), || {
        (!m0.bmc_running()).then_some(())
    });
    assert!(!ipmitool(&lab, 0, &["chassis", "power", "status"])
        .status
        .success());
    assert_eq!(
        (m1.boot_id().unwrap(), m1.power_pid().unwrap()),
        other,
        "the other machine is untouched"
    );

    let out = snmp(&lab, &rw, "snmpset", &[&ctl(m0.outlets()[0]), "i", "1"]);
    assert!(out.status.success(), "{out:?}");
    m0.wait_booted(Some(&boot0), BOOT)
        .expect("the BMC comes back and boots the VM");
    lab.wait_bmc(m0).unwrap();
    assert_eq!(power_status(&lab, 0), "Chassis Power is on");
}

/// What the guest's probe loop last saw: (sample number, hub pingable, API door answers).
fn probe(m: &palisade_lab::Machine) -> Option<(u64, bool, bool)> {
    let s = std::fs::read_to_string(m.guest_dir().join("probe")).ok()?;
    let mut w = s.split_whitespace();
    let n = w.next()?.parse().ok()?;
    Some((n, w.next()? == "ping=up", w.next()? == "api=up"))
}

/// The guest's view after `lab` changed something: a sample that started after the change.
fn guest_view(m: &palisade_lab::Machine) -> (bool, bool) {
    let after = probe(m).map_or(0, |p| p.0) + 1;
    eventually(
        "a fresh probe from the guest",
        Duration::from_secs(60),
        || probe(m).filter(|p| p.0 > after).map(|p| (p.1, p.2)),
    )
}

fn hub_pings(lab: &Lab, m: &palisade_lab::Machine) -> bool {
    std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            lab.hub_netns(),
            "busybox",
            "ping",
            "-c1",
            "-W2",
        ])
        .arg(m.address().to_string())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Every second: ping the hub, and send plain HTTP to the API front door (the API server
/// answers 400 over TLS; a black hole answers nothing).
const PROBE: &str = r#"hub=10.213.0.1
i=0
while :; do
  i=$((i+1))
  if ping -c1 -W1 $hub >/dev/null 2>&1; then p=up; else p=down; fi
  if printf 'GET / HTTP/1.0\r\n\r\n' | timeout 3 nc -w 2 $hub 6443 2>/dev/null | grep -q HTTP; then a=up; else a=down; fi
  echo "$i ping=$p api=$a" > /machine/probe.tmp && mv /machine/probe.tmp /machine/probe
  sleep 1
done"#;

#[test]
fn partitions_cut_the_vm_both_ways_heal_restores_it_and_the_vm_keeps_running() {
    let lab = Lab::start(LabConfig {
        machines: 1,
        control_plane: true,
        pdu: false,
        machine_command: PROBE.into(),
        machine_kind: MachineKind::Qemu,
        ..Default::default()
    })
    .expect("lab with a QEMU machine and a control plane starts");
    let m = &lab.machines()[0];
    let (boot, qemu) = (m.boot_id().unwrap(), m.power_pid().unwrap());
    eventually(
        "the guest reaches hub and API",
        Duration::from_secs(60),
        || (probe(m).is_some_and(|p| p.1 && p.2) && hub_pings(&lab, m)).then_some(()),
    );

    lab.partition(0, Cut::All).unwrap();
    assert!(!hub_pings(&lab, m), "hub -> guest must be cut");
    assert_eq!(guest_view(m), (false, false), "guest -> hub must be cut");
    lab.heal(0).unwrap();
    eventually(
        "hub pings the guest after heal",
        Duration::from_secs(30),
        || hub_pings(&lab, m).then_some(()),
    );
    eventually(
        "the guest reaches both after heal",
        Duration::from_secs(60),
        || probe(m).filter(|p| p.1 && p.2).map(|_| ()),
    );

    lab.partition(0, Cut::ControlPlane).unwrap();
    assert_eq!(
        guest_view(m),
        (true, false),
        "only control-plane traffic is cut"
    );
    assert!(hub_pings(&lab, m));
    lab.heal(0).unwrap();
    eventually(
        "the API answers after heal",
        Duration::from_secs(60),
        || probe(m).filter(|p| p.2).map(|_| ()),
    );
    assert_eq!(
        (m.boot_id().unwrap(), m.power_pid().unwrap()),
        (boot, qemu),
        "a partition never touches the machine"
    );
}

fn netns_with_prefix(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn teardown_leaves_no_vm_bmc_tap_or_namespace() {
    let mut lab = lab(1);
    let m = &lab.machines()[0];
    let qemu = m.power_pid().unwrap();
    let bmc: i32 = std::fs::read_to_string(m.dir().join("bmc.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let tap = m
        .exec_in_netns("ip", &["-o", "link", "show", "tap0"])
        .unwrap();
    assert!(tap.contains("master br0"), "the VM's tap is bridged: {tap}");
    let (id, dir) = (lab.id().to_string(), lab.dir().to_path_buf());
    lab.stop();
    assert!(!alive(qemu), "QEMU is gone");
    assert!(!alive(bmc), "the BMC is gone");
    assert!(
        pids_with_env(LAB_ENV, &id).is_empty(),
        "no lab process is left"
    );
    assert!(
        netns_with_prefix(&format!("pl{id}-")).is_empty(),
        "no namespace (so no tap) is left"
    );
    assert!(!dir.exists());
}

/// Pets the watchdog 10 times, a second apart, counting in /machine/pets; then hangs with
/// the device open, as a hung node agent would.
const PET_THEN_HANG: &str = r#"exec 3>/dev/watchdog
i=0
while [ $i -lt 10 ]; do printf . >&3; i=$((i+1)); echo $i > /machine/pets; sleep 1; done
exec sleep 100000"#;

fn watchdog(action: WatchdogAction) -> QemuConfig {
    QemuConfig {
        watchdog_seconds: 4,
        watchdog_action: action,
        ..Default::default()
    }
}

fn pets(m: &palisade_lab::Machine) -> u32 {
    std::fs::read_to_string(m.guest_dir().join("pets"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_guest_that_stops_petting_the_watchdog_is_reset_with_a_new_boot_id() {
    let lab = lab_with(1, PET_THEN_HANG, watchdog(WatchdogAction::Reset));
    let m = &lab.machines()[0];
    let (boot, qemu) = (m.boot_id().unwrap(), m.power_pid().unwrap());
    // Eight pets a second apart outlast the 4 s heartbeat: petting keeps the machine up.
    eventually("the guest pets 8 times", Duration::from_secs(60), || {
        (pets(m) >= 8).then_some(())
    });
    assert_eq!(
        m.boot_id().as_deref(),
        Some(boot.as_str()),
        "a petted watchdog never fires"
    );

    let after = m
        .wait_booted(Some(&boot), BOOT)
        .expect("the watchdog resets the guest");
    assert_ne!(after, boot);
    assert_eq!(m.power_pid(), Some(qemu), "a watchdog reset is in place");
    assert_eq!(power_status(&lab, 0), "Chassis Power is on");
}

#[test]
fn a_guest_that_stops_petting_a_poweroff_watchdog_is_off_at_the_bmc() {
    let lab = lab_with(1, PET_THEN_HANG, watchdog(WatchdogAction::Poweroff));
    let m = &lab.machines()[0];
    let qemu = m.power_pid().unwrap();
    eventually("the guest starts petting", Duration::from_secs(60), || {
        (pets(m) >= 1).then_some(())
    });
    wait_status(&lab, 0, "off");
    assert!(!alive(qemu), "QEMU exited on the watchdog");
    assert!(
        pets(m) >= 10,
        "the watchdog fired only after petting stopped"
    );
}

#[test]
fn the_guest_sees_its_configured_smbios_uuid_and_the_bmc_reports_it_as_its_guid() {
    let lab = lab(1);
    let m = &lab.machines()[0];
    let seen = std::fs::read_to_string(m.guest_dir().join("product_uuid")).unwrap();
    assert_eq!(seen.trim().to_lowercase(), m.system_uuid());
    // Get System GUID (NetFn App 0x06, command 0x37), read raw: ipmitool's `mc guid` guesses
    // the encoding from the version field (and ignores an explicit one in 1.8.19), so a random
    // GUID is sometimes shown byte-swapped. The lab configures the bytes in this order.
    let out = ipmitool(&lab, 0, &["raw", "0x06", "0x37"]);
    assert!(out.status.success(), "{out:?}");
    let raw: String = stdout(&out).split_whitespace().collect();
    assert_eq!(raw.len(), 32, "16 bytes of GUID: {raw}");
    assert_eq!(raw.to_lowercase(), m.bmc_guid().replace('-', ""));
    // The BMC names its own machine, as on real hardware: the SMBIOS UUID in the SMBIOS byte
    // order.
    assert_eq!(
        m.bmc_guid(),
        palisade_lab::smbios_swapped(m.system_uuid()),
        "the BMC's GUID is the machine's SMBIOS UUID"
    );
}

/// The lab id in a path under the lab directory (`.../palisade-lab-<id>/...`).
fn lab_id_in(path: &std::path::Path) -> String {
    let s = path.display().to_string();
    let at = s.find("palisade-lab-").expect("a lab path") + "palisade-lab-".len();
    s[at..at + 6].to_string()
}

fn assert_nothing_left(id: &str) {
    assert!(
        pids_with_env(LAB_ENV, id).is_empty(),
        "no process of lab {id} is left"
    );
    assert!(
        netns_with_prefix(&format!("pl{id}-")).is_empty(),
        "no namespace of lab {id} is left"
    );
}

#[test]
fn a_missing_kernel_a_qemu_that_will_not_start_and_a_silent_guest_are_clear_errors() {
    let start = |qemu: QemuConfig| {
        Lab::start(LabConfig {
            machines: 1,
            control_plane: false,
            pdu: false,
            machine_kind: MachineKind::Qemu,
            qemu,
            ..Default::default()
        })
        .expect_err("the lab must not start")
    };
    let cases = [
        (
            "missing kernel",
            QemuConfig {
                guest_kernel: Some("/nonexistent/guest-kernel".into()),
                ..Default::default()
            },
            "no guest kernel",
        ),
        (
            "QEMU cannot allocate the guest's memory",
            QemuConfig {
                memory_mib: 64 * 1024 * 1024,
                ..Default::default()
            },
            "is not running",
        ),
        (
            "the guest never reports ready in time",
            QemuConfig {
                boot_timeout: Duration::from_millis(1),
                ..Default::default()
            },
            "did not report a new boot",
        ),
    ];
    for (what, qemu, says) in cases {
        match start(qemu) {
            LabError::Guest {
                machine,
                console_log,
                reason,
            } => {
                assert_eq!(machine, "m0", "{what}");
                assert!(console_log.ends_with("machines/m0/console.log"), "{what}");
                assert!(reason.contains(says), "{what}: {reason}");
                assert_nothing_left(&lab_id_in(&console_log));
            }
            other => panic!("{what}: not a guest error: {other}"),
        }
    }
}

/// Every second: a tick from a shell named by its argument `ticker`, the guest's wall clock, and
/// a ping of every other machine of a two-machine lab and the hub; beside them a long-lived
/// shell with another argument. The ticker forks nothing once it ticks (it waits with the builtin `read -t` on a
/// FIFO no one writes and counts with shell arithmetic), so the one process signalled by name
/// is the one that ticks: a ticker that ran `sleep` would leave a race, since a signal sent to a
/// `sleep` that is just exiting (a zombie not yet reaped) is accepted and does nothing.
const PEERS: &str = r#"sh -c 'sleep 100000; :' idle & echo $! > /machine/long.pid
sh -c 'mkfifo /tmp/tick.fifo; exec 3<>/tmp/tick.fifo; i=0; while :; do read -t 1 x <&3; i=$((i+1)); echo $i > /machine/tick; done' ticker &
(while :; do date +%s > /machine/clock.tmp && mv /machine/clock.tmp /machine/clock; sleep 1; done) &
i=0
while :; do
  i=$((i+1)); r="$i"
  for a in 10.213.0.1 10.213.0.11 10.213.0.12; do
    [ "$a" = "$PALISADE_MACHINE_ADDRESS" ] && continue
    if ping -c1 -W1 $a >/dev/null 2>&1; then r="$r $a=up"; else r="$r $a=down"; fi
  done
  echo "$r" > /machine/peers.tmp && mv /machine/peers.tmp /machine/peers
  sleep 1
done"#;

/// What machine `m`'s ping loop last saw: (sample, the addresses it reached).
fn peers(m: &palisade_lab::Machine) -> Option<(u64, Vec<String>)> {
    let s = std::fs::read_to_string(m.guest_dir().join("peers")).ok()?;
    let mut w = s.split_whitespace();
    let n = w.next()?.parse().ok()?;
    let up = w
        .filter_map(|x| x.strip_suffix("=up"))
        .map(str::to_string)
        .collect();
    Some((n, up))
}

/// The addresses `m` reaches in a sample that started after now.
fn reached_now(m: &palisade_lab::Machine) -> Vec<String> {
    let after = peers(m).map_or(0, |p| p.0) + 1;
    eventually("a fresh ping sample", Duration::from_secs(60), || {
        peers(m).filter(|p| p.0 > after).map(|p| p.1)
    })
}

fn tick(m: &palisade_lab::Machine) -> Option<String> {
    std::fs::read_to_string(m.guest_dir().join("tick")).ok()
}

#[test]
fn the_guest_control_loop_signals_steps_the_clock_and_peer_cuts_isolate_a_vm_from_its_peers() {
    let lab = lab_with(2, PEERS, QemuConfig::default());
    let (m0, m1) = (&lab.machines()[0], &lab.machines()[1]);
    let hub = "10.213.0.1".to_string();
    let (a0, a1) = (m0.address().to_string(), m1.address().to_string());
    eventually("both guests reach the hub and each other", BOOT, || {
        (peers(m0).is_some_and(|p| p.1 == [hub.clone(), a1.clone()])
            && peers(m1).is_some_and(|p| p.1 == [hub.clone(), a0.clone()]))
        .then_some(())
    });

    // A peer cut of m0: neither reaches the other; both still reach the hub.
    lab.partition(0, Cut::Peers).unwrap();
    assert_eq!(reached_now(m0), [hub.as_str()], "m0 -> m1 must be cut");
    assert_eq!(reached_now(m1), [hub.as_str()], "m1 -> m0 must be cut");
    lab.heal(0).unwrap();
    assert_eq!(reached_now(m0), [hub.clone(), a1.clone()]);
    assert_eq!(reached_now(m1), [hub.clone(), a0.clone()]);

    // SIGSTOP by name through the guest: the ticker stops; SIGCONT: it ticks again.
    eventually("a tick", BOOT, || tick(m0));
    let stopped = m0.signal("sh", "ticker", Signal::SIGSTOP).unwrap();
    assert_eq!(
        stopped.len(),
        1,
        "one shell has the argument `ticker`: {stopped:?}"
    );
    let long: i32 = std::fs::read_to_string(m0.guest_dir().join("long.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !stopped.contains(&long),
        "the idle shell has another argument: it must not be signalled ({stopped:?})"
    );
    // A stopped ticker writes nothing; a running one ticks every second.
    let frozen = tick(m0);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(tick(m0), frozen, "stopped {stopped:?}: no tick may follow");
    assert_eq!(m0.signal("sh", "ticker", Signal::SIGCONT).unwrap(), stopped);
    eventually("ticking again", Duration::from_secs(30), || {
        (tick(m0) != frozen).then_some(())
    });
    assert!(
        m0.signal("no-such-process", "x", Signal::SIGKILL)
            .unwrap()
            .is_empty(),
        "no process of that name: nothing signalled"
    );

    // A clock step moves the guest's wall clock only, and back.
    let host = |_: ()| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let ahead = m0.set_clock_offset(100).unwrap();
    assert!(
        (ahead - host(()) - 100).abs() <= 3,
        "the guest's clock is 100 s ahead: {ahead} against the host's {}",
        host(())
    );
    eventually(
        "the guest's clock loop writes the stepped time",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(m0.guest_dir().join("clock"))
                .ok()
                .and_then(|t| t.trim().parse::<i64>().ok())
                .filter(|t| t - host(()) >= 97)
        },
    );
    let back = m0.set_clock_offset(0).unwrap();
    assert!((back - host(())).abs() <= 3, "stepped back: {back}");
    let behind = m1.set_clock_offset(-30).unwrap();
    assert!(
        (behind - host(()) + 30).abs() <= 3,
        "m1 30 s behind: {behind}"
    );
    assert!(
        (m0.set_clock_offset(0).unwrap() - host(())).abs() <= 3,
        "m0's clock did not follow m1's"
    );

    // A namespace machine has no clock of its own: a clear error, nothing moves.
    let ns = Lab::start(LabConfig {
        machines: 1,
        machine_command: "exec sleep 100000".into(),
        ..Default::default()
    })
    .unwrap();
    let err = ns.machines()[0]
        .set_clock_offset(5)
        .unwrap_err()
        .to_string();
    assert!(err.contains("only a QEMU machine"), "{err}");
}
