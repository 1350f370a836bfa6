//! Silence the controller could not see is no evidence (issue 32 item 1).
//!
//! One node (m1) is cut off from the control plane; when it has been silent for the Suspect
//! threshold, the controller is frozen (SIGSTOP) for five seconds, so m1's silence crosses the
//! Unhealthy threshold while the controller cannot see. m1 comes back three seconds after the
//! controller wakes. The other nodes renewed all along and were silent for less than the Suspect
//! threshold when the controller woke, so no quorum guard holds: only the controller's own
//! memory of its blind spell stands between the straggler and a fence. Before the fix, the
//! woken controller fenced m1 at once; now silence counts from the end of the blind spell (the
//! rule: no replica fences a node whose silence overlaps a time it could not see the API).

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_lab::Cut;
use serde_json::json;

/// The policy's Suspect threshold (seconds).
const SUSPECT: u64 = 8;
/// The policy's Unhealthy threshold (seconds).
const UNHEALTHY: u64 = 12;
/// How long the controller is frozen: longer than three election rounds (a blind spell),
/// shorter than the Suspect threshold minus a renewal (so the others look healthy on waking),
/// and long enough for m1's silence to cross the Unhealthy threshold in it.
const FREEZE: u64 = 5;

#[test]
fn a_straggler_silent_through_the_controllers_blind_spell_is_not_fenced() {
    let (lab, rt, c) = lab_ready(3, false);
    let ctl = start_controller(&lab, "ctl-a");
    eventually(
        "ready once it reaches the API server",
        Duration::from_secs(30),
        || (ctl.readyz() == Some(200)).then_some(()),
    );
    policy_with(
        &c,
        &rt,
        json!({"detection": {"suspectAfterSeconds": SUSPECT, "unhealthyAfterSeconds": UNHEALTHY}}),
    );
    // m1 has a real fence device: a fence, had one started, would switch it off.
    let b = lab.machines()[1].bmc();
    secret(&c, &rt, "bmc-m1", &[("password", &b.password().unwrap())]);
    fence_target(
        &c,
        &rt,
        "m1",
        vec![("bmc", vec![device(&ipmi_url(&lab, 1), "bmc-m1")])],
    );
    ctl.wait_ticks(8);

    // m1 drops off the control plane; once it is Suspect the controller freezes, and m1's
    // silence crosses the Unhealthy threshold during the freeze. The others renew throughout.
    lab.partition(1, Cut::All).unwrap();
    std::thread::sleep(Duration::from_secs(SUSPECT));
    kill(Pid::from_raw(ctl.pid()), Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_secs(FREEZE));
    kill(Pid::from_raw(ctl.pid()), Signal::SIGCONT).unwrap();
    // The straggler needs three more seconds to come back.
    std::thread::sleep(Duration::from_secs(3));
    lab.heal(1).unwrap();

    eventually("m1 Ready again", Duration::from_secs(60), || {
        node_ready(&c, &rt, "m1")
    });
    // Long enough for any decision taken on the blind spell to have been made.
    ctl.wait_ticks(4 * UNHEALTHY);
    let fences = fences_for(&c, &rt, "m1");
    assert!(
        fences.is_empty(),
        "m1 was fenced for silence the controller could not see: {:?}\n{}",
        fences
            .iter()
            .map(|f| f.status.as_ref().map(|s| s.phase))
            .collect::<Vec<_>>(),
        ctl.log_text()
            .lines()
            .filter(|l| l.contains("m1") && !l.contains("DEBUG"))
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(lab.machines()[1].is_powered(), "m1 still runs");
}

// The timing the scenario rests on (see the module doc).
const _: () = assert!(SUSPECT + FREEZE > UNHEALTHY && FREEZE > 3 && FREEZE + 2 < SUSPECT);
