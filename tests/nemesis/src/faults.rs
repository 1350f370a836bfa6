//! Applying and healing faults on the world. Each fault is applied, held for its scheduled
//! time and healed before [`apply`] returns, so no fault outlives its event; every step is
//! recorded in the history with the machine, pid or replica it hit.

use std::time::Duration;

use anyhow::Result;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_lab::forwarder::{Link, Replies};
use palisade_lab::Cut;

use crate::history::{History, Record};
use crate::schedule::{Event, Fault, Replicas, Target};
use crate::world::Controllers;
use crate::world::World;

/// Where the bridge and the CSI attacher come from to the storage admin API's relay.
const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// Holds a fault; cut short by a stop request, so the heal still follows.
fn sleep_ms(ms: u64) {
    crate::campaign::sleep(Duration::from_millis(ms));
}

fn signal(pid: i32, sig: Signal) -> String {
    match kill(Pid::from_raw(pid), sig) {
        Ok(()) => format!("{sig:?} pid {pid}"),
        Err(e) => format!("{sig:?} pid {pid} failed: {e}"),
    }
}

/// Sends `sig` to machine `i`'s node agent (from the host, or through a QEMU guest's control
/// loop) and says what was done; `None` when no agent runs there.
fn signal_agent(world: &World, i: usize, sig: Signal) -> Option<String> {
    // The agent itself (`--node-name`), not the container shims it runs from its binary.
    match world.lab.machines()[i].signal("palisade-node", "--node-name", sig) {
        Ok(pids) if pids.is_empty() => None,
        Ok(pids) => Some(format!("{sig:?} palisade-node pid {pids:?}")),
        // Recorded as done: the request may have been carried out (a guest that took it and
        // froze), and the history must not miss a fault that happened.
        Err(e) => Some(format!("{sig:?} palisade-node: {e}")),
    }
}

/// The first unfinished NodeFence of `node` to appear before `until` (polled every 100 ms):
/// its name and UID.
fn first_unfinished_fence(
    world: &World,
    node: &str,
    until: std::time::Instant,
) -> Option<(String, String)> {
    let api: kube::Api<palisade_model::NodeFence> = kube::Api::all(world.cluster.client.clone());
    while std::time::Instant::now() < until && !crate::campaign::stopping() {
        if let Ok(list) = world.cluster.rt.block_on(api.list(&Default::default())) {
            let found = list.items.into_iter().find(|f| {
                f.spec.node_name == node
                    && f.metadata.deletion_timestamp.is_none()
                    && !f.status.as_ref().is_some_and(|s| s.phase.is_terminal())
            });
            if let Some(f) = found {
                return Some((
                    f.metadata.name.unwrap_or_default(),
                    f.metadata.uid.unwrap_or_default(),
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Deletes the NodeFence `(name, uid)` as a person would (`kubectl delete nodefence`, with a
/// UID precondition) and says what was done and in which phase the fence was.
fn delete_fence(world: &World, (name, uid): &(String, String)) -> String {
    let api: kube::Api<palisade_model::NodeFence> = kube::Api::all(world.cluster.client.clone());
    let phase = world
        .cluster
        .rt
        .block_on(api.get_opt(name))
        .ok()
        .flatten()
        .map(|f| {
            f.status
                .map(|s| s.phase.to_string())
                .unwrap_or("Pending".into())
        })
        .unwrap_or_else(|| "gone".into());
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match world.cluster.rt.block_on(api.delete(name, &params)) {
        Ok(_) => format!("kubectl delete nodefence {name} (phase {phase})"),
        Err(e) => format!("kubectl delete nodefence {name} (phase {phase}) failed: {e}"),
    }
}

/// Resolves a target to a machine index: a writer's current node, else a fixed machine.
pub fn resolve(world: &World, target: Target) -> usize {
    let n = world.lab.machines().len();
    match target {
        Target::Machine(i) => i % n,
        Target::WriterHost(k) => world
            .writers
            .get(k)
            .and_then(|w| world.writer_pod(w))
            .and_then(|p| p.spec?.node_name)
            .and_then(|node| world.machine_index(&node))
            .unwrap_or(k % n),
    }
}

/// Applies the event's fault, holds it, heals it. Errors are lab errors (a command that could
/// not run), not findings.
pub fn apply(world: &World, ev: &Event, h: &History) -> Result<()> {
    let machine = ev.fault.target().map(|t| resolve(world, t));
    match &ev.fault {
        Fault::TwoAtOnce {
            first,
            second,
            second_after_ms,
        } => {
            // The event itself, counted once in the report; each of its faults is recorded with
            // the machine it hit (the cause check reads those).
            h.push(Record::Fault {
                t: h.t(),
                event: ev.index,
                fault: ev.fault.clone(),
                machine: None,
                detail: format!(
                    "{} and, {second_after_ms} ms later, {}",
                    first.class(),
                    second.class()
                ),
            });
            let second_machine = second.target().map(|t| {
                let j = resolve(world, t);
                // Another machine than the first's: two faults on one machine undo each other's
                // heals.
                match machine {
                    Some(i) if i == j => (j + 1) % world.lab.machines().len(),
                    _ => j,
                }
            });
            std::thread::scope(|scope| {
                let a = scope.spawn(|| apply_fault(world, ev.index, first, machine, h));
                sleep_ms(*second_after_ms);
                let b = apply_fault(world, ev.index, second, second_machine, h);
                let a = a
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the first fault's thread panicked")));
                a.and(b)
            })
        }
        fault => apply_fault(world, ev.index, fault, machine, h),
    }
}

/// Applies one fault on `machine` (its resolved target), holds it, heals it.
fn apply_fault(
    world: &World,
    event: usize,
    f: &Fault,
    machine: Option<usize>,
    h: &History,
) -> Result<()> {
    let name = machine.map(|i| world.lab.machines()[i].name().to_string());
    let fault = |detail: String| Record::Fault {
        t: h.t(),
        event,
        fault: f.clone(),
        machine: name.clone(),
        detail,
    };
    let heal = |detail: String| Record::Heal {
        t: h.t(),
        event,
        detail,
    };
    let skip = |reason: String| Record::Skipped {
        t: h.t(),
        event,
        reason,
    };
    let i = machine.unwrap_or(0);
    match f {
        Fault::CutAll { hold_ms, .. } | Fault::CutControlPlane { hold_ms, .. } => {
            let cut = if matches!(f, Fault::CutAll { .. }) {
                Cut::All
            } else {
                Cut::ControlPlane
            };
            world.lab.partition(i, cut)?;
            h.push(fault(format!("{cut:?} for {hold_ms} ms")));
            sleep_ms(*hold_ms);
            world.lab.heal(i)?;
            h.push(heal("link and control plane restored".into()));
        }
        Fault::CutHealCut {
            first_ms,
            heal_ms,
            hold_ms,
            ..
        } => {
            h.push(fault(format!(
                "ControlPlane for {first_ms} ms, healed {heal_ms} ms, ControlPlane again for {hold_ms} ms"
            )));
            world.lab.partition(i, Cut::ControlPlane)?;
            sleep_ms(*first_ms);
            world.lab.heal(i)?;
            sleep_ms(*heal_ms);
            world.lab.partition(i, Cut::ControlPlane)?;
            sleep_ms(*hold_ms);
            world.lab.heal(i)?;
            h.push(heal("link and control plane restored".into()));
        }
        Fault::Flap {
            cycles,
            cut_ms,
            heal_ms,
            ..
        } => {
            h.push(fault(format!(
                "{cycles} cycles: cut {cut_ms} ms, healed {heal_ms} ms"
            )));
            for _ in 0..*cycles {
                world.lab.partition(i, Cut::All)?;
                sleep_ms(*cut_ms);
                world.lab.heal(i)?;
                sleep_ms(*heal_ms);
            }
            h.push(heal("flapping stopped (healed)".into()));
        }
        Fault::AgentKill { .. } | Fault::AgentRestart { .. } => {
            let sig = if matches!(f, Fault::AgentKill { .. }) {
                Signal::SIGKILL
            } else {
                Signal::SIGTERM
            };
            match signal_agent(world, i, sig) {
                Some(done) => {
                    h.push(fault(done));
                    h.push(heal("the supervisor restarts the agent".into()));
                }
                None => h.push(skip(format!("no palisade-node on m{i}"))),
            }
        }
        Fault::AgentStop { hold_ms, .. } => match signal_agent(world, i, Signal::SIGSTOP) {
            Some(done) => {
                h.push(fault(done));
                sleep_ms(*hold_ms);
                // By name: a stopped agent is still the one running (the supervisor waits).
                let resumed = signal_agent(world, i, Signal::SIGCONT)
                    .unwrap_or_else(|| "no palisade-node left to resume".into());
                h.push(heal(resumed));
            }
            None => h.push(skip(format!("no palisade-node on m{i}"))),
        },
        Fault::AgentRestartWhilePartitioned { hold_ms, .. } => {
            world.lab.partition(i, Cut::ControlPlane)?;
            let half = hold_ms / 2;
            // Recorded when applied: the history's time of a fault is when it began (the
            // cause check relies on it).
            h.push(fault(format!(
                "ControlPlane cut for {hold_ms} ms; the agent restarts after {half} ms"
            )));
            sleep_ms(half);
            let detail = signal_agent(world, i, Signal::SIGTERM)
                .unwrap_or_else(|| "no palisade-node to restart".into());
            h.push(fault(format!("during the cut: {detail}")));
            sleep_ms(hold_ms - half);
            world.lab.heal(i)?;
            h.push(heal("control plane restored".into()));
        }
        Fault::MachineClockStep {
            step_ms, hold_ms, ..
        } => {
            let m = &world.lab.machines()[i];
            let secs = step_ms / 1_000;
            if !m.is_powered() {
                h.push(skip(format!("m{i} is off: no clock to step")));
                return Ok(());
            }
            // Recorded whatever the answer: a guest that took the request and did not answer
            // may have stepped.
            let stepped = match m.set_clock_offset(secs) {
                Ok(now) => format!("wall clock stepped {secs:+} s (guest time now {now})"),
                Err(e) => format!("wall clock step {secs:+} s, unconfirmed: {e}"),
            };
            h.push(fault(stepped));
            sleep_ms(*hold_ms);
            // Back to the true time (absolute: also right for a machine fenced and rebooted
            // meanwhile). A machine that is off has no clock to correct.
            let healed = if m.is_powered() {
                match m.set_clock_offset(0) {
                    Ok(now) => format!("wall clock back on time (guest time now {now})"),
                    Err(e) => format!("stepping the clock back failed: {e}"),
                }
            } else {
                "the machine is off (it boots on the true time)".into()
            };
            h.push(heal(healed));
        }
        Fault::VmPause { hold_ms, .. } => {
            let m = &world.lab.machines()[i];
            let Some(vm) = m.power_pid() else {
                h.push(skip(format!("m{i} is off: nothing to pause")));
                return Ok(());
            };
            // Recorded whatever the answer: QEMU may have paused without answering.
            let paused = match m.pause() {
                Ok(()) => format!("the hypervisor paused m{i} for {hold_ms} ms"),
                Err(e) => format!("pausing m{i} for {hold_ms} ms, unconfirmed: {e}"),
            };
            h.push(fault(paused));
            sleep_ms(*hold_ms);
            // A machine fenced meanwhile is off (its BMC's power off ended the paused VM) or
            // powered on anew, a new VM that runs: there is nothing to resume.
            let healed = match m.power_pid() {
                Some(now) if now == vm => match m.resume() {
                    Ok(()) => format!("m{i} resumed"),
                    Err(e) => format!("resuming m{i} failed: {e}"),
                },
                Some(_) => format!("m{i} was powered off while paused, and is on again"),
                None => format!("m{i} was powered off while paused"),
            };
            h.push(heal(healed));
        }
        Fault::LeaderKill { down_ms } => match leader_pid(world) {
            Some((id, _)) => {
                world.controllers().kill(&id);
                h.push(fault(format!("SIGKILL leader {id}")));
                sleep_ms(*down_ms);
                world.controllers().spawn(&id)?;
                h.push(heal(format!("{id} started again")));
            }
            None => h.push(skip("no leader holds the Lease".into())),
        },
        Fault::WatchStall { hold_ms, .. } => {
            let node = world.lab.machines()[i].name().to_string();
            world.controllers().stall_watch(Some(&node))?;
            h.push(fault(format!(
                "the controllers' watches hold {node}'s Lease back for {hold_ms} ms"
            )));
            sleep_ms(*hold_ms);
            world.controllers().stall_watch(None)?;
            h.push(heal("the watches deliver again".into()));
        }
        Fault::OneWayCut { hold_ms, .. } | Fault::SlowLink { hold_ms, .. } => {
            let (link, detail) = match f {
                Fault::SlowLink { delay_ms, .. } => (
                    Link::Slow(Duration::from_millis(*delay_ms)),
                    format!(
                        "m{i}'s control-plane link {delay_ms} ms late each way for {hold_ms} ms"
                    ),
                ),
                _ => (
                    Link::Deaf,
                    format!(
                        "one-way cut for {hold_ms} ms: m{i}'s requests land, nothing comes back"
                    ),
                ),
            };
            world.lab.impair_control_plane(i, link)?;
            h.push(fault(detail));
            sleep_ms(*hold_ms);
            world.lab.heal(i)?;
            h.push(heal("control plane restored, both ways and on time".into()));
        }
        Fault::FenceDeleted {
            hold_ms,
            delete_after_ms,
            ..
        } => {
            let cut_at = std::time::Instant::now();
            world.lab.partition(i, Cut::All)?;
            h.push(fault(format!(
                "All cut for {hold_ms} ms; the node's NodeFence deleted {delete_after_ms} ms \
                 after it appears"
            )));
            let node = world.lab.machines()[i].name().to_string();
            let hold = Duration::from_millis(*hold_ms);
            match first_unfinished_fence(world, &node, cut_at + hold) {
                Some(first) => {
                    sleep_ms(*delete_after_ms);
                    h.push(fault(delete_fence(world, &first)));
                }
                None => h.push(skip(format!(
                    "no NodeFence of {node} appeared during the cut: nothing to delete"
                ))),
            }
            crate::campaign::sleep(hold.saturating_sub(cut_at.elapsed()));
            world.lab.heal(i)?;
            h.push(heal("cut healed".into()));
        }
        Fault::LeaderStop { hold_ms } => match leader_pid(world) {
            Some((id, pid)) => {
                h.push(fault(format!(
                    "leader {id}: {}",
                    signal(pid, Signal::SIGSTOP)
                )));
                sleep_ms(*hold_ms);
                h.push(heal(format!("{id}: {}", signal(pid, Signal::SIGCONT))));
            }
            None => h.push(skip("no leader holds the Lease".into())),
        },
        Fault::LeaderKillDuringCut {
            hold_ms,
            kill_after_ms,
            ..
        } => {
            world.lab.partition(i, Cut::All)?;
            h.push(fault(format!(
                "All cut for {hold_ms} ms; the leader dies after {kill_after_ms} ms"
            )));
            sleep_ms(*kill_after_ms);
            let killed = leader_pid(world).map(|(id, _)| id);
            if let Some(id) = &killed {
                world.controllers().kill(id);
                h.push(fault(format!("SIGKILL leader {id} during the cut")));
            }
            sleep_ms(hold_ms.saturating_sub(*kill_after_ms));
            world.lab.heal(i)?;
            if let Some(id) = &killed {
                world.controllers().spawn(id)?;
            }
            h.push(heal(format!(
                "cut healed; {}",
                killed.map_or("no leader was found to kill".into(), |id| format!(
                    "{id} started again"
                ))
            )));
        }
        Fault::ApiRestart { down_ms } => {
            h.push(fault(format!("kube-apiserver down for {down_ms} ms")));
            control_plane(world)?.restart_api_server(Duration::from_millis(*down_ms))?;
            h.push(heal("kube-apiserver ready again".into()));
        }
        Fault::BmcFreeze { hold_ms, .. } => match world.bmc_pid(i) {
            Some(pid) => {
                h.push(fault(format!("BMC {}", signal(pid, Signal::SIGSTOP))));
                sleep_ms(*hold_ms);
                h.push(heal(format!("BMC {}", signal(pid, Signal::SIGCONT))));
            }
            None => h.push(skip(format!("m{i}'s BMC is not running"))),
        },
        Fault::BmcFrozenDuringCut { hold_ms, .. } => match world.bmc_pid(i) {
            Some(pid) => {
                let frozen = signal(pid, Signal::SIGSTOP);
                world.lab.partition(i, Cut::All)?;
                h.push(fault(format!("BMC {frozen}; All cut for {hold_ms} ms")));
                sleep_ms(*hold_ms);
                world.lab.heal(i)?;
                // The PDU level may have cut the BMC's power meanwhile: then there is
                // nothing left to resume.
                h.push(heal(format!(
                    "cut healed; BMC {}",
                    signal(pid, Signal::SIGCONT)
                )));
            }
            None => h.push(skip(format!("m{i}'s BMC is not running"))),
        },
        Fault::PeerCut { hold_ms, .. } => {
            world.lab.partition(i, Cut::Peers)?;
            h.push(fault(format!("Peers cut for {hold_ms} ms")));
            sleep_ms(*hold_ms);
            world.lab.heal(i)?;
            h.push(heal("peer links restored".into()));
        }
        Fault::IsolatedButStorage { hold_ms, .. } => {
            world.lab.partition(i, Cut::ControlPlane)?;
            world.lab.partition(i, Cut::Peers)?;
            h.push(fault(format!(
                "ControlPlane and Peers cut for {hold_ms} ms (storage reachable)"
            )));
            sleep_ms(*hold_ms);
            world.lab.heal(i)?;
            h.push(heal("control plane and peer links restored".into()));
        }
        Fault::ApiRestartDuringPeerCut { down_ms, .. } => {
            world.lab.partition(i, Cut::Peers)?;
            h.push(fault(format!(
                "Peers cut; kube-apiserver down for {down_ms} ms"
            )));
            let restarted =
                control_plane(world)?.restart_api_server(Duration::from_millis(*down_ms));
            world.lab.heal(i)?;
            restarted?;
            h.push(heal(
                "kube-apiserver ready again; peer links restored".into(),
            ));
        }
        Fault::EtcdFreeze { hold_ms } => {
            let cp = control_plane(world)?;
            match cp.pid("etcd") {
                Some(pid) => {
                    let pid = pid as i32;
                    h.push(fault(format!("etcd {}", signal(pid, Signal::SIGSTOP))));
                    sleep_ms(*hold_ms);
                    h.push(heal(format!("etcd {}", signal(pid, Signal::SIGCONT))));
                }
                None => h.push(skip("etcd is not running".into())),
            }
        }
        Fault::SlowEtcd { hold_ms, delay_ms } => {
            let cp = control_plane(world)?;
            cp.slow_etcd(Some(Duration::from_millis(*delay_ms)))?;
            h.push(fault(format!(
                "etcd {delay_ms} ms late each way for {hold_ms} ms"
            )));
            sleep_ms(*hold_ms);
            cp.slow_etcd(None)?;
            h.push(heal("etcd on time again".into()));
        }
        Fault::EtcdRestart { down_ms } => {
            h.push(fault(format!("etcd down for {down_ms} ms")));
            control_plane(world)?.restart("etcd", Duration::from_millis(*down_ms))?;
            h.push(heal("etcd back; kube-apiserver ready".into()));
        }
        Fault::ControllersRestartTogether { down_ms } => {
            let mut c = world.controllers();
            let ids = ["palisade-0", "palisade-1"];
            for id in ids {
                c.kill(id);
            }
            h.push(fault(format!("SIGKILL {ids:?}")));
            sleep_ms(*down_ms);
            for id in ids {
                c.spawn(id)?;
            }
            h.push(heal(format!("{ids:?} started together")));
        }
        Fault::BridgeCrashDuringCut {
            hold_ms,
            crash_after_ms,
            down_ms,
            ..
        } => {
            world.lab.partition(i, Cut::All)?;
            h.push(fault(format!(
                "All cut for {hold_ms} ms; the bridge crashes after {crash_after_ms} ms for \
                 {down_ms} ms"
            )));
            sleep_ms(*crash_after_ms);
            world.bridge().proc.kill();
            h.push(fault("SIGKILL firmware-bridge during the cut".into()));
            sleep_ms(*down_ms);
            let started = world.bridge().start_again();
            h.push(heal(match &started {
                Ok(()) => "firmware-bridge started again".into(),
                Err(e) => format!("firmware-bridge did not start again: {e:#}"),
            }));
            sleep_ms(hold_ms.saturating_sub(crash_after_ms + down_ms));
            world.lab.heal(i)?;
            h.push(heal("cut healed".into()));
            started?;
        }
        Fault::BmcGarbageDuringCut { hold_ms, .. } | Fault::BmcSlowDuringCut { hold_ms, .. } => {
            let replies = match f {
                Fault::BmcSlowDuringCut { delay_ms, .. } => {
                    Replies::Delay(Duration::from_millis(*delay_ms))
                }
                _ => Replies::Garbage,
            };
            let relay = &world.bmc_replies[i];
            relay.set(replies);
            world.lab.partition(i, Cut::All)?;
            h.push(fault(format!(
                "BMC replies {replies:?}; All cut for {hold_ms} ms"
            )));
            sleep_ms(*hold_ms);
            world.lab.heal(i)?;
            relay.set(Replies::Pass);
            h.push(heal("cut healed; BMC replies pass".into()));
        }
        Fault::DeposedLeaderLateRequest { hold_ms, .. } => {
            let Some((id, _)) = leader_pid(world) else {
                h.push(skip("no leader holds the Lease".into()));
                return Ok(());
            };
            let Some(token) = world.leader_token() else {
                h.push(skip(format!(
                    "the Lease held by {id} carries no fencing token"
                )));
                return Ok(());
            };
            world.controllers().kill(&id);
            world.lab.partition(i, Cut::All)?;
            h.push(fault(format!(
                "SIGKILL leader {id} (token {token}); All cut for {hold_ms} ms"
            )));
            sleep_ms(*hold_ms);
            world.lab.heal(i)?;
            world.controllers().spawn(&id)?;
            h.push(heal(format!("cut healed; {id} started again")));
            let target = world.lab.machines()[i].name().to_string();
            // Only once the bridge has acted on the target with a newer token: before that,
            // the old token is not stale and the request would be a real fence.
            let newer = palisade_scenario::eventually(
                &format!("the bridge acting on {target} with a token above {token}"),
                Duration::from_secs(60),
                || newer_action(&world.bridge().audit(), &target, token).then_some(()),
            );
            let detail = match newer {
                Ok(()) => format!(
                    "{id}'s late power off for {target} with token {token}: {}",
                    world.late_power_off(&target, token)?
                ),
                Err(_) => format!(
                    "no late request: the bridge never acted on {target} with a token above {token}"
                ),
            };
            h.push(fault(detail));
            h.push(heal("the late request is answered".into()));
        }
        Fault::DevicesDownDuringCut { hold_ms, .. } => {
            let bmc = world.bmc_pid(i);
            let pdu = world.lab.pdu().map(|p| p.pid() as i32);
            let frozen: Vec<String> = bmc
                .iter()
                .map(|pid| format!("BMC {}", signal(*pid, Signal::SIGSTOP)))
                .chain(
                    pdu.iter()
                        .map(|pid| format!("PDU {}", signal(*pid, Signal::SIGSTOP))),
                )
                .collect();
            world.lab.partition(i, Cut::All)?;
            h.push(fault(format!(
                "{}; All cut for {hold_ms} ms",
                frozen.join("; ")
            )));
            sleep_ms(*hold_ms);
            world.lab.heal(i)?;
            h.push(heal("cut healed; devices still frozen".into()));
            sleep_ms(2_000);
            let resumed: Vec<String> = pdu
                .iter()
                .map(|pid| format!("PDU {}", signal(*pid, Signal::SIGCONT)))
                .chain(
                    bmc.iter()
                        .map(|pid| format!("BMC {}", signal(*pid, Signal::SIGCONT))),
                )
                .collect();
            h.push(heal(resumed.join("; ")));
        }
        Fault::StorageAdminDownDuringCut { hold_ms, .. } => {
            world.storage_admin.cut(LOOPBACK);
            world.lab.partition(i, Cut::All)?;
            h.push(fault(format!(
                "storage admin API black-holed; All cut for {hold_ms} ms"
            )));
            sleep_ms(*hold_ms);
            world.lab.heal(i)?;
            h.push(heal("cut healed; storage admin API still down".into()));
            sleep_ms(2_000);
            world.storage_admin.heal(LOOPBACK);
            h.push(heal("storage admin API answers again".into()));
        }
        Fault::ControllerClockStep {
            replicas,
            step_ms,
            hold_ms,
        } => {
            // Resolved now: "the leader" is whoever holds the Lease when the step happens.
            let leader = world.leader();
            let ids: Vec<String> = match (replicas, &leader) {
                (Replicas::Both, _) => vec!["palisade-0".into(), "palisade-1".into()],
                (Replicas::Leader, Some(l)) => vec![l.clone()],
                (Replicas::Standby, Some(l)) => vec![Controllers::other(l).into()],
                (_, None) => {
                    h.push(skip("no leader holds the Lease".into()));
                    return Ok(());
                }
            };
            let role = |id: &str| {
                if leader.as_deref() == Some(id) {
                    "leader"
                } else {
                    "standby"
                }
            };
            let who = ids
                .iter()
                .map(|id| format!("{id} ({})", role(id)))
                .collect::<Vec<_>>()
                .join(" and ");
            for id in &ids {
                world.controllers().step_clock(id, *step_ms)?;
            }
            h.push(fault(format!(
                "{who}: wall clock stepped {step_ms:+} ms (monotonic clock untouched) for \
                 {hold_ms} ms"
            )));
            sleep_ms(*hold_ms);
            for id in &ids {
                world.controllers().step_clock(id, 0)?;
            }
            h.push(heal(format!(
                "{who}: wall clock stepped back to the true time ({:+} ms)",
                -step_ms
            )));
        }
        Fault::TwoAtOnce { .. } => {
            h.push(skip("two-at-once nested in two-at-once".into()));
        }
    }
    Ok(())
}

fn control_plane(world: &World) -> Result<&palisade_lab::ControlPlane> {
    world
        .lab
        .control_plane()
        .ok_or_else(|| anyhow::anyhow!("the lab has no control plane"))
}

/// Whether the bridge's audit shows an accepted action (not a status read) on `target` with
/// a token above `token`.
fn newer_action(audit: &[serde_json::Value], target: &str, token: u64) -> bool {
    audit.iter().any(|r| {
        crate::check::accepted_action(r).is_some_and(|(_, t, tok)| {
            t == target && u64::try_from(tok).is_ok_and(|tok| tok > token)
        })
    })
}

/// The leading replica and its pid, if one holds the Lease and runs here.
fn leader_pid(world: &World) -> Option<(String, i32)> {
    let id = world.leader()?;
    let pid = world.controllers().pid(&id)?;
    Some((id, pid))
}
