//! The companion's self-fence, on a real (emulated) watchdog, timed from the companion's own
//! writes. m0 is a QEMU VM with an i6300esb watchdog (driver loaded with a 30 s heartbeat and
//! `nowayout`, expiry: power off). In the guest runs `palisade-companion` (the suite's own
//! binary) with `--watchdog` and `--no-peer-check` (one machine has no peers; the peer check
//! has its own test, `companion_peer_check.rs`): it arms the watchdog with a 6 s timeout, self-fences 12 s after
//! its last write, and writes its promise with a stamp on m0's Lease. m0's kubelet is played
//! by the test, renewing m0's Lease from the host, its last renewal right after a companion
//! write as on a real node (see `last_renewal_after_a_companion_write`). There is no CRI in
//! the guest: the companion's CRI stop fails, and the watchdog alone fences, as it must when
//! the runtime cannot confirm. Two simulated nodes keep quorum; no FenceTarget exists, so only a trusted self-fence can
//! release m0's pod.
//!
//! Then the kubelet stops renewing while the companion, still connected, keeps writing: it
//! stops only once the kubelet's `renewTime` has stood still for the Lease's 20 s duration,
//! and its self-fence (and so the power-off) comes 12 s plus a watchdog timeout after that,
//! about 38 s after the kubelet's last renewal. The controller must count the companion's
//! stamps as the node's writes: timed from the kubelet's last renewal instead, it trusts the
//! self-fence 25 s after it (12 s + 2 x 6 s + 1 s) and releases the pod while the VM still
//! runs, which the planted control (`IgnoreCompanionWrites`) shows. The test fails if the
//! release comes before the VM is gone, if the controller never trusts the promise (a
//! companion that never stops writing, or a promise not taken), or if the companion did not
//! write after the kubelet's last renewal (the case not exercised).
//!
//! Last, the hypervisor pauses the whole VM (QMP `stop`) and resumes it later: its watchdog's
//! timer stands still with it, so the promise is worth nothing while it sleeps. Under the
//! default policy (`trustSelfFence.virtualMachines: Refuse`) the controller holds m0's fence
//! and says why, releases nothing through a 60 s pause (ten watchdog timeouts), and the VM
//! runs on when resumed. The control accepts VMs: the pod is released about 25 s into the
//! pause, and the VM then runs on beside its replacement. Both runs check that the VM ran on
//! (its watchdog never fired, its companion wrote again), so neither passes on a VM that died.

mod common;

use std::time::Duration;

use common::sim::{released_on_self_fence, Sim, SimNode};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::Api;
use palisade_model::advertise::{
    COMPANION_WRITTEN, RUNTIME_SOURCE, SELF_FENCE_AFTER, WATCHDOG_ACTION, WATCHDOG_DRIVER,
    WATCHDOG_NOWAYOUT, WATCHDOG_TIMEOUT,
};
use serde_json::json;

/// The guest's command: the companion with the watchdog, against a CRI socket that does not
/// exist in the guest.
fn companion_command() -> String {
    let companion =
        palisade_lab::bin_path("palisade-companion").expect("palisade-companion is built");
    format!(
        r#"RUST_LOG=info,kube=warn '{companion}' --node-name "$PALISADE_MACHINE_NAME" --kubeconfig "$PALISADE_NODE_KUBECONFIG" \
  --cri-endpoint unix:///run/containerd/containerd.sock --interval 1s --timeout 1s \
  --watchdog /dev/watchdog --watchdog-timeout 6s --watchdog-interval 1s --self-fence-after 12s --no-peer-check \
  >> /machine/companion.log 2>&1"#,
        companion = companion.display()
    )
}

fn annotation(l: &Lease, key: &str) -> Option<String> {
    l.metadata.annotations.as_ref()?.get(key).cloned()
}

/// Stops m0's kubelet with a last renewal sent right after a companion write, as on a real
/// node, where both share the machine's clock and the companion writes every second: the
/// Lease the controller sees at that renewal carries a stamp at most a second old. The lab's
/// kubelet is the test, on the host's clock, renewing every 300 ms at any phase of the
/// companion's writes, which a busy TCG guest may delay by seconds: a last renewal a few
/// seconds after the stamp it carries reads as a companion no longer current (more than half
/// its watchdog timeout behind), and the planted controller, which reads what the Lease
/// advertises only when the kubelet renews, would never trust the promise. The fixed
/// controller reads it at every companion write too, and is not helped by the alignment.
fn last_renewal_after_a_companion_write(s: &Stage) {
    s.sim.silence("m0");
    // A renewal already under way when the kubelet was silenced ends well within this.
    std::thread::sleep(Duration::from_secs(2));
    let before = annotation(
        &s.rt.block_on(s.leases.get("m0")).expect("m0's Lease"),
        COMPANION_WRITTEN,
    );
    let written = eventually(
        "a companion write after the kubelet was silenced",
        Duration::from_secs(60),
        || {
            let now = stamp(s)?;
            (Some(&now) != before.as_ref()).then_some(now)
        },
    );
    let renewed = Timestamp::now();
    s.rt.block_on(s.leases.patch(
        "m0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"renewTime": MicroTime(renewed)}})),
    ))
    .expect("the kubelet's last renewal");
    eprintln!(
        "the kubelet's last renewal {renewed}, right after the companion's write stamped {written}"
    );
}

/// What the scenarios act on: m0 (a QEMU VM running the companion with its watchdog), the
/// controller's API, the simulated nodes, and m0's Lease.
struct Stage<'a> {
    lab: &'a palisade_lab::Lab,
    rt: &'a tokio::runtime::Runtime,
    c: &'a kube::Client,
    sim: &'a Sim<'a>,
    leases: &'a Api<Lease>,
}

/// Brings up m0 with its companion, a controller with `planted` bugs, two simulated nodes
/// for quorum, a policy that trusts self-fences (with `virtual_machines` as its
/// `trustSelfFence.virtualMachines`, the default when `None`) and m0's pod; then runs
/// `scenario`.
fn staged<T>(
    identity: &str,
    planted: &[&str],
    virtual_machines: Option<&str>,
    scenario: impl FnOnce(&Stage) -> T,
) -> T {
    let lab = qemu_watchdog_lab(companion_command());
    let rt = rt();
    let c = client(&lab, &rt);

    // The controller installs the CRDs. The test is m0's kubelet: it creates the Node and
    // the Lease (20 s duration, like a kubelet's 40 s scaled down) and renews it.
    namespace(&c, &rt, SYSTEM_NS);
    namespace(&c, &rt, "app");
    let env: Vec<(&str, String)> = if planted.is_empty() {
        Vec::new()
    } else {
        vec![("PALISADE_PLANTED_BUGS", planted.join(","))]
    };
    let _ctl = start_controller_with_env(&lab, identity, &env);
    let sim = Sim::new(&lab, &rt);
    sim.nodes(&[
        SimNode::new("m0", None),
        SimNode::new("s1", None),
        SimNode::new("s2", None),
    ]);
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    rt.block_on(leases.patch(
        "m0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"leaseDurationSeconds": 20}})),
    ))
    .expect("m0's Lease duration set");

    // What the companion promises is what the driver holds: 6 s (not the 30 s it was loaded
    // with), nowayout, with its stamp.
    let ad = eventually(
        "m0's companion advertises its armed watchdog and its stamp",
        Duration::from_secs(120),
        || {
            let l = rt.block_on(leases.get_opt("m0")).ok().flatten()?;
            annotation(&l, COMPANION_WRITTEN)?;
            Some((
                annotation(&l, WATCHDOG_TIMEOUT)?,
                annotation(&l, WATCHDOG_NOWAYOUT)?,
                annotation(&l, WATCHDOG_ACTION)?,
                annotation(&l, WATCHDOG_DRIVER)?,
                annotation(&l, SELF_FENCE_AFTER)?,
                annotation(&l, RUNTIME_SOURCE)?,
            ))
        },
    );
    assert_eq!(
        (
            &ad.0[..],
            &ad.1[..],
            &ad.2[..],
            &ad.3[..],
            &ad.4[..],
            &ad.5[..]
        ),
        ("6", "true", "hypervisor", "i6300esb", "12", "cri"),
        "{ad:?}"
    );

    let mut trust = json!({"enabled": true, "marginSeconds": 1});
    if let Some(vms) = virtual_machines {
        trust["virtualMachines"] = json!(vms);
    }
    policy_with(&c, &rt, json!({ "trustSelfFence": trust }));
    sim.pod("app", "worker", "m0", &[], None);
    sim.mark_ready("app", "worker");
    scenario(&Stage {
        lab: &lab,
        rt: &rt,
        c: &c,
        sim: &sim,
        leases: &leases,
    })
}

/// The companion's last write stamp on m0's Lease.
fn stamp(s: &Stage) -> Option<String> {
    annotation(&s.rt.block_on(s.leases.get("m0")).ok()?, COMPANION_WRITTEN)
}

/// What one run saw: the VM's power-off and the release's start.
struct Outcome {
    gone: Option<Timestamp>,
    releasing: Timestamp,
}

/// The kubelet stops while the companion, still connected, keeps writing until its kubelet's
/// Lease has stood still for its duration, then self-fences.
fn kubelet_stops(s: &Stage) -> Outcome {
    let Stage {
        lab, rt, c, leases, ..
    } = *s;
    let m = &lab.machines()[0];
    // Watch the VM from the host: the first moment its QEMU process is seen gone.
    let qemu = m.power_pid().expect("the VM runs");
    let watcher = watch_gone(qemu);

    // The kubelet stops; the companion's link stays up.
    last_renewal_after_a_companion_write(s);
    let releasing = released_on_self_fence(c, rt, "m0", Duration::from_secs(240));
    let gone = watcher.join().unwrap();

    // The case this test is about: the companion wrote after the kubelet's last renewal.
    let l = rt.block_on(leases.get("m0")).expect("m0's Lease");
    let renewed = l
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0)
        .expect("the kubelet's renewTime");
    let stamp: Timestamp = annotation(&l, COMPANION_WRITTEN)
        .expect("the companion's last stamp")
        .parse()
        .expect("an RFC 3339 stamp");
    eprintln!(
        "kubelet's last renewal {renewed}, companion's last write {stamp}, VM gone at {gone:?}, release began at {releasing}"
    );
    assert!(
        stamp > renewed + Duration::from_secs(10),
        "the companion kept writing after the kubelet stopped (last renewal {renewed}, last stamp {stamp})"
    );
    Outcome { gone, releasing }
}

#[test]
fn a_companion_still_writing_after_its_kubelet_stopped_is_trusted_only_after_its_watchdog_fired() {
    let Outcome { gone, releasing } =
        staged("ctl-qemu-companion", &[], Some("Accept"), kubelet_stops);
    let gone = gone.expect("the watchdog powered the VM off");
    assert!(
        gone < releasing,
        "the VM must be gone before anything is released (gone {gone}, releasing {releasing})"
    );
}

/// The negative control: with the companion's stamps left out of the heartbeat, the same run
/// releases the pod while the VM still runs.
#[test]
fn with_the_companions_writes_ignored_the_pod_is_released_while_the_vm_runs() {
    let Outcome { gone, releasing } = staged(
        "ctl-qemu-companion-planted",
        &["IgnoreCompanionWrites"],
        Some("Accept"),
        kubelet_stops,
    );
    assert!(
        gone.is_none_or(|gone| releasing < gone),
        "the planted controller releases before the VM is gone (gone {gone:?}, releasing {releasing})"
    );
}

/// How long the hypervisor keeps m0 paused at most: well past what a controller that trusts
/// the promise waits (12 s + 2 x 6 s + 1 s after the last write), and ten watchdog timeouts.
const PAUSE: Duration = Duration::from_secs(60);

/// What a paused run saw.
struct Paused {
    /// When a fence of m0 began releasing while the VM was paused.
    releasing: Option<Timestamp>,
    /// The controller's held decision, if it held one while the VM was paused.
    held: Option<String>,
}

/// The hypervisor pauses the whole VM (QMP `stop`: vCPU, watchdog timer and guest clocks
/// stand still) right after a companion write and the kubelet's last renewal, keeps it paused
/// until a fence of m0 begins releasing or [`PAUSE`] has passed, then resumes it. The test
/// then checks the machine ran on: its QEMU process lives and its companion writes again.
fn hypervisor_pauses(s: &Stage) -> Paused {
    let m = &s.lab.machines()[0];
    last_renewal_after_a_companion_write(s);
    m.pause().expect("the hypervisor pauses m0");
    let paused = std::time::Instant::now();
    let frozen = stamp(s);
    let mut releasing = None;
    while releasing.is_none() && paused.elapsed() < PAUSE {
        std::thread::sleep(Duration::from_millis(500));
        releasing = fences_for(s.c, s.rt, "m0")
            .iter()
            .find_map(|nf| common::sim::phase_at(nf, palisade_model::nodefence::Phase::Releasing));
    }
    let held = s
        .sim
        .events("m0", "FenceHeldSelfFenceNotTrusted")
        .into_iter()
        .find_map(|e| e.message);
    assert_eq!(stamp(s), frozen, "a paused VM's companion wrote");
    m.resume().expect("the hypervisor resumes m0");
    s.sim.revive("m0");
    eprintln!(
        "m0 paused for {:.1}s; a release began at {releasing:?}; held: {held:?}",
        paused.elapsed().as_secs_f64()
    );

    // The machine ran on: its watchdog, frozen with it, never fired, and its companion
    // (with its pods, on a real node) carries on.
    eventually(
        "m0's companion writes again after the resume",
        Duration::from_secs(60),
        || (stamp(s) != frozen).then_some(()),
    );
    assert!(m.is_powered(), "the paused VM's watchdog powered it off");
    Paused { releasing, held }
}

/// A VM its hypervisor pauses: its watchdog stands still with it, so its self-fence promise
/// is worth nothing while it is paused, and the default policy (`virtualMachines: Refuse`)
/// never trusts it. The controller holds the fence and says why; nothing is released while
/// the VM sleeps, and it runs on when resumed, with nothing of it released.
#[test]
fn a_paused_vm_is_never_released_on_its_frozen_watchdog_by_default() {
    let Paused { releasing, held } =
        staged("ctl-qemu-companion-paused", &[], None, hypervisor_pauses);
    assert_eq!(
        releasing, None,
        "a fence of the paused VM began releasing on its frozen watchdog"
    );
    let held = held.expect("the controller held m0's fence (FenceHeldSelfFenceNotTrusted)");
    assert!(
        held.contains("does not accept virtual machines"),
        "held for another reason: {held}"
    );
}

/// The control: a policy that asserts its VMs are never paused (`virtualMachines: Accept`)
/// trusts the frozen watchdog, and m0's pod is released while the VM sleeps and runs on after.
/// This is the two-writer risk the default refuses.
#[test]
fn accepting_vms_releases_a_paused_vm_that_then_runs_on() {
    let Paused { releasing, .. } = staged(
        "ctl-qemu-companion-paused-accept",
        &[],
        Some("Accept"),
        hypervisor_pauses,
    );
    assert!(
        releasing.is_some(),
        "the controller that accepts VMs released nothing within {PAUSE:?} of the pause"
    );
}
