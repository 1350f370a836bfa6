//! The lab tour that `hack/demo.sh` ends with (`palisade-lab demo`), on both machine kinds: it
//! fences one machine through its BMC and another through its PDU outlet with
//! `palisade-fence`, and each comes back with a new boot ID. The tour checks each step itself
//! (it fails if a machine does not power off, leaves a process behind, or does not boot
//! again); these tests run it as an operator would and read what it printed.

mod common;

use std::process::Command;

use palisade_lab::process::{pids_with_env, LAB_ENV};

/// Runs the tour and returns its output, failing the test if it failed.
fn tour(args: &[&str]) -> String {
    let bin = palisade_lab::bin_path("palisade-lab").expect("build the palisade-lab binary first");
    let out = Command::new(bin)
        .arg("demo")
        .args(args)
        .output()
        .expect("run palisade-lab demo");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "the tour failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
    stdout
}

/// The lab id from the tour's status table ("lab <id> in <dir>"); nothing of it is left.
fn assert_torn_down(stdout: &str) {
    let id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("lab ")?.split_whitespace().next())
        .expect("the tour names its lab");
    assert!(
        pids_with_env(LAB_ENV, id).is_empty(),
        "lab {id} left processes behind"
    );
}

/// The boot IDs in "a new boot ID <new> (was <old>)".
fn boot_change(stdout: &str) -> (String, String) {
    let line = stdout
        .lines()
        .find(|l| l.contains("booted again with a new boot ID"))
        .expect("the BMC power on is reported");
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "ID").expect("a boot ID");
    (
        words[at + 1].to_string(),
        words[at + 3].trim_end_matches("),").to_string(),
    )
}

#[test]
fn the_lab_tour_power_cycles_qemu_machines_into_new_boots() {
    let out = tour(&[]);
    assert!(out.contains("3 QEMU VMs whose BMCs are ipmi_sim"), "{out}");
    assert_eq!(
        out.matches(" qemu-vm ").count(),
        6,
        "two status tables of 3 VMs"
    );
    // Off means the VM's process is gone, through the BMC and through the PDU outlet.
    assert!(out.contains("m1: no VM process left"), "{out}");
    assert!(out.contains("m2: machine down (no VM process)"), "{out}");
    let (new, old) = boot_change(&out);
    assert_ne!(new, old, "a power cycle is a new boot");
    assert!(out.contains("BMC back, machine booted with a new boot ID"));
    assert_torn_down(&out);
}

#[test]
fn the_lab_tour_runs_on_namespace_machines() {
    let out = tour(&["--netns"]);
    assert!(out.contains("3 namespace machines"), "{out}");
    assert_eq!(out.matches(" namespace  ").count(), 6, "{out}");
    assert!(out.contains("m1: 0 processes left"), "{out}");
    assert!(out.contains("m2: machine down (0 processes)"), "{out}");
    let (new, old) = boot_change(&out);
    assert_ne!(new, old);
    assert_torn_down(&out);
}
