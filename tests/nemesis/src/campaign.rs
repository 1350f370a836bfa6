//! One campaign: bring the world up, run the seeded schedule while the observer records, let
//! the lab settle after each event (bounded), judge the history, write the report.
//!
//! Every loop is bounded: the schedule has `events` entries and no new event starts after
//! `minutes`; each settle has a deadline; the observer stops when the runner is done.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use palisade_labstore::checker::{analyze, entries_from};
use palisade_labstore::record::parse_ack_log;

use crate::check::{check_all, Violation};
use crate::history::{History, Record};
use crate::observer::{self, list_fences, snapshot};
use crate::report::{Build, CampaignRecord, Tally};
use crate::schedule::{self, Event};
use crate::world::{World, WorldConfig};
use palisade_lab::MachineKind;

/// A campaign's parameters.
#[derive(Clone, Debug)]
pub struct Config {
    /// The seed of the schedule.
    pub seed: u64,
    /// Events to run.
    pub events: usize,
    /// No new event starts after this many minutes.
    pub minutes: u64,
    /// Machines in the lab.
    pub machines: usize,
    /// StatefulSet writers.
    pub writers: usize,
    /// Where the history, the report and (on failure) the logs go.
    pub out: PathBuf,
    /// How long to wait for the lab to settle between events.
    pub settle_timeout: Duration,
    /// Bugs planted in the controllers (`palisade_controller::planted` names; debug builds
    /// only): a negative control, which must end in violations.
    pub planted: Vec<String>,
    /// Draw only these fault classes ([`schedule::classes`] names; empty: every class).
    pub only: Vec<String>,
    /// The world without fence devices ([`WorldConfig::no_fence_devices`]): nothing may be
    /// released, whatever the faults.
    pub no_fence_devices: bool,
    /// The machines' kind ([`WorldConfig::machine_kind`]); QEMU machines also draw the
    /// classes only they can take ([`schedule::class_fits`]).
    pub machine_kind: MachineKind,
    /// [`WorldConfig::agents_without_watchdog`].
    pub agents_without_watchdog: bool,
}

impl Config {
    /// The command that replays this campaign.
    pub fn replay(&self) -> String {
        let mut cmd = format!(
            "hack/chaos.sh --lab --seed {} --events {} --minutes {} --machines {} --writers {}",
            self.seed, self.events, self.minutes, self.machines, self.writers
        );
        for c in &self.only {
            cmd.push_str(&format!(" --only {c}"));
        }
        for p in &self.planted {
            cmd.push_str(&format!(" --plant {p}"));
        }
        if self.no_fence_devices {
            cmd.push_str(" --no-fence-devices");
        }
        if self.machine_kind == MachineKind::Qemu {
            cmd.push_str(" --qemu");
        }
        if self.agents_without_watchdog {
            cmd.push_str(" --no-watchdog");
        }
        cmd
    }
}

/// What a campaign found.
#[derive(Debug)]
pub struct Outcome {
    /// Safety violations (empty: PASS).
    pub violations: Vec<Violation>,
    /// Whether every writer was writing again after the last heal (within the settle bound).
    pub live: bool,
    /// The rendered report.
    pub report: String,
    /// The history file.
    pub history: PathBuf,
    /// The campaign as a line of the campaigns' history (`--record`); the date and build
    /// are filled, the commit and conditions left to the caller.
    pub record: CampaignRecord,
}

impl Outcome {
    /// No safety violation.
    pub fn safe(&self) -> bool {
        self.violations.is_empty()
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

/// Asks a running campaign to stop: the fault under way is healed, no new event starts, the
/// history is judged and the lab torn down (`palisade-nemesis` calls it on SIGINT/SIGTERM).
pub fn request_stop() {
    STOP.store(true, Ordering::Relaxed);
}

/// Whether a stop was requested.
pub fn stopping() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Sleeps `d`, or less if a stop is requested (in 100 ms steps).
pub fn sleep(d: Duration) {
    let end = Instant::now() + d;
    while !stopping() {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(100)));
    }
}

fn say(start: Instant, what: &str) {
    println!("[{:>8.1}s] {what}", start.elapsed().as_secs_f64());
}

/// Runs one campaign.
pub fn run(cfg: &Config) -> Result<Outcome> {
    let start = Instant::now();
    std::fs::create_dir_all(&cfg.out).with_context(|| format!("creating {}", cfg.out.display()))?;
    let schedule = schedule::generate_only(
        cfg.seed,
        cfg.events,
        cfg.machines,
        cfg.writers,
        &cfg.only,
        cfg.machine_kind,
    );
    let world = World::start(
        &WorldConfig {
            machines: cfg.machines,
            writers: cfg.writers,
            planted: cfg.planted.clone(),
            no_fence_devices: cfg.no_fence_devices,
            // Only a schedule that steps the controllers' clock preloads libfaketime.
            controller_clock: schedule
                .iter()
                .any(|e| !e.fault.clock_steps_ms().is_empty()),
            machine_kind: cfg.machine_kind,
            agents_without_watchdog: cfg.agents_without_watchdog,
        },
        &|s| say(start, s),
    )?;
    let h = History::create(&cfg.out.join("history.jsonl"))?;
    h.push(Record::Start {
        t: h.t(),
        seed: cfg.seed,
        machines: cfg.machines,
        writers: cfg.writers,
        events: cfg.events,
    });
    let stop = AtomicBool::new(false);
    let mut settles = (0usize, 0usize);
    let skew = crate::check::ClockSkew::of(schedule.iter().map(|e| &e.fault));
    let live = std::thread::scope(|s| -> Result<bool> {
        let observer = s.spawn(|| observer::run(&world.cluster, &world.lab, &h, &stop, skew));
        let leases = s.spawn(|| observer::run_leases(&world.cluster, &h, &stop));
        let result = (|| -> Result<bool> {
            let deadline = start + Duration::from_secs(cfg.minutes * 60);
            for ev in &schedule {
                if stopping() {
                    say(start, "stop requested: no more events");
                    break;
                }
                if Instant::now() > deadline {
                    say(
                        start,
                        &format!("{} minutes are up: no more events", cfg.minutes),
                    );
                    break;
                }
                let settled = settle(&world, &h, cfg.settle_timeout);
                settles.0 += 1;
                settles.1 += usize::from(settled);
                say(
                    start,
                    &format!(
                        "event {}/{}: {} {}",
                        ev.index + 1,
                        schedule.len(),
                        ev.fault.class(),
                        describe(&world, ev)
                    ),
                );
                crate::faults::apply(&world, ev, &h)?;
            }
            say(
                start,
                "last fault healed; waiting for every writer to write again",
            );
            // Liveness gets a generous bound; a campaign against planted bugs is judged on
            // safety, and a planted bug may leave a machine that never returns.
            let bound = if cfg.planted.is_empty() {
                cfg.settle_timeout.max(Duration::from_secs(300))
            } else {
                cfg.settle_timeout
            };
            Ok(settle(&world, &h, bound))
        })();
        stop.store(true, Ordering::Relaxed);
        let _ = observer.join();
        let _ = leases.join();
        result
    })?;

    // The final state of every fence, the bridge's audit, the writers' verdicts.
    if let Some(fences) = list_fences(&world.cluster) {
        for nf in &fences {
            h.push(Record::FenceFinal {
                t: h.t(),
                snapshot: snapshot(nf),
            });
        }
    }
    for record in world.bridge().audit() {
        h.push(Record::Audit { t: h.t(), record });
    }
    for w in &world.writers {
        h.push(judge_writer(&world, w, h.t())?);
    }
    let records = h.records();
    let violations = check_all(&records);
    for v in &violations {
        h.push(Record::Violation {
            t: h.t(),
            check: v.check.to_string(),
            detail: v.detail.clone(),
        });
    }
    let wall_s = start.elapsed().as_secs_f64();
    let report = render(cfg, &schedule, &records, &violations, live, settles, wall_s);
    std::fs::write(cfg.out.join("report.txt"), &report)?;
    let mut record = CampaignRecord::of(cfg, schedule.len(), &records, &violations, live, wall_s);
    record.date = Some(k8s_openapi::jiff::Timestamp::now().to_string()[..10].to_string());
    record.build = Build::of_lab_binaries();
    if stopping() {
        record.remarks = Some("interrupted: a stop was requested before the schedule ended".into());
    }
    if !violations.is_empty() || !live {
        world.save_logs(&cfg.out);
    }
    Ok(Outcome {
        violations,
        live,
        report,
        history: h.path().to_path_buf(),
        record,
    })
}

fn describe(world: &World, ev: &Event) -> String {
    let target = ev
        .fault
        .target()
        .map(|t| {
            format!(
                "on {}",
                world.lab.machines()[crate::faults::resolve(world, t)].name()
            )
        })
        .unwrap_or_default();
    format!(
        "{target} {}",
        serde_json::to_string(&ev.fault).unwrap_or_default()
    )
}

/// Waits (at most `timeout`) until the lab is quiet: every NodeFence finished, every machine
/// powered, every node renewing its Lease, both controllers running, every writer writing.
/// Meanwhile it repairs what a technician would: it powers on a machine that is off with no
/// fence in progress (through its BMC, or its PDU outlets if the BMC has no power) and starts
/// a controller replica that is not running. Returns whether it settled.
fn settle(world: &World, h: &History, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut prev: BTreeMap<String, usize> = BTreeMap::new();
    let mut waiting = Vec::new();
    while Instant::now() < deadline && !stopping() {
        waiting.clear();
        let fences = list_fences(&world.cluster);
        match &fences {
            Some(f) => {
                for nf in f {
                    let s = snapshot(nf);
                    if !matches!(s.phase.as_str(), "Done" | "Failed") {
                        waiting.push(format!("NodeFence {} {}", s.fence, s.phase));
                    }
                }
            }
            None => waiting.push("the API server".into()),
        }
        for m in world.lab.machines() {
            if m.is_powered() {
                continue;
            }
            waiting.push(format!("{} powered off", m.name()));
            let fencing = fences.as_ref().is_none_or(|f| {
                f.iter().any(|nf| {
                    nf.spec.node_name == m.name()
                        && !nf.status.as_ref().is_some_and(|s| s.phase.is_terminal())
                })
            });
            if !fencing {
                h.push(Record::Repair {
                    t: h.t(),
                    detail: format!("{}: {}", m.name(), power_on(world, m.index())),
                });
            }
        }
        for id in world.controllers().down() {
            let r = world.controllers().spawn(&id);
            h.push(Record::Repair {
                t: h.t(),
                detail: format!("controller {id} was not running; started again: {r:?}"),
            });
        }
        for m in world.lab.machines() {
            if !lease_fresh(world, m.name()) {
                waiting.push(format!("{} Lease not renewed", m.name()));
            }
        }
        if world
            .identity_pod()
            .is_none_or(|p| palisade_scenario::pod_phase(&p) != "Running")
        {
            waiting.push(format!("identity {} not Running", crate::world::IDENTITY));
        }
        for w in &world.writers {
            let n = world.ack_count(w);
            if prev.get(w).is_none_or(|p| n <= *p) {
                waiting.push(format!("writer {w} not writing"));
            }
            prev.insert(w.clone(), n);
        }
        if waiting.is_empty() {
            h.push(Record::Settle {
                t: h.t(),
                settled: true,
                waiting_for: String::new(),
            });
            return true;
        }
        sleep(Duration::from_secs(1));
    }
    h.push(Record::Settle {
        t: h.t(),
        settled: false,
        waiting_for: waiting.join("; "),
    });
    false
}

/// Powers machine `i` on as a technician would: `ipmitool chassis power on` when its BMC
/// runs, else its PDU outlets on (which starts the BMC, which boots the machine).
fn power_on(world: &World, i: usize) -> String {
    let m = &world.lab.machines()[i];
    if m.bmc_running() {
        let b = m.bmc();
        let out = std::process::Command::new("ipmitool")
            .args(["-I", "lanplus", "-C", "3", "-N", "2", "-R", "2", "-H"])
            .arg(b.host.to_string())
            .arg("-p")
            .arg(b.port.to_string())
            .args(["-U", &b.user, "-f"])
            .arg(&b.password_file)
            .args(["chassis", "power", "on"])
            .stdin(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => "powered on through its BMC".into(),
            Ok(o) => format!(
                "BMC power on failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => format!("ipmitool: {e}"),
        }
    } else if let Some(pdu) = world.lab.pdu() {
        let r: Vec<String> = m
            .outlets()
            .iter()
            .map(|o| match pdu.switch(*o, true) {
                Ok(()) => format!("outlet {o} on"),
                Err(e) => format!("outlet {o}: {e}"),
            })
            .collect();
        format!("BMC unpowered; PDU {}", r.join(", "))
    } else {
        "off, and no PDU to power it".into()
    }
}

/// The node's Lease was renewed within the last 6 s.
fn lease_fresh(world: &World, node: &str) -> bool {
    let leases: Api<Lease> = Api::namespaced(world.cluster.client.clone(), "kube-node-lease");
    let Some(renew) = world
        .cluster
        .rt
        .block_on(leases.get_opt(node))
        .ok()
        .flatten()
        .and_then(|l| l.spec?.renew_time)
    else {
        return false;
    };
    k8s_openapi::jiff::Timestamp::now()
        .duration_since(renew.0)
        .as_secs_f64()
        < 6.0
}

/// The storage checker over one writer's volume and every acknowledgement log it wrote.
fn judge_writer(world: &World, w: &str, t: f64) -> Result<Record> {
    // The writers are still running: read the acknowledgements first, then the volume. The
    // server makes a write durable before it acknowledges it, so every acknowledgement read
    // here must be in the volume read after it; the other order would count a write
    // acknowledged in between as lost.
    let mut acks = Vec::new();
    let mut pods = Vec::new();
    let mut firsts = Vec::new();
    for log in world.ack_logs(w) {
        let text = std::fs::read_to_string(&log)?;
        let parsed = parse_ack_log(&text)
            .map_err(|(line, e)| anyhow::anyhow!("{} line {line}: {e}", log.display()))?;
        let uid = ack_log_uid(&log);
        let node = parsed.first().map(|a| a.node.clone()).unwrap_or_default();
        firsts.push(parsed.first().map(|a| a.ack_ms).unwrap_or(u64::MAX));
        pods.push((uid, node, parsed.len()));
        acks.extend(parsed);
    }
    // Incarnations in the order they first wrote.
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by_key(|i| firsts[*i]);
    let pods: Vec<(String, String, usize)> = order.into_iter().map(|i| pods[i].clone()).collect();
    let volume = world.storage.volume_file(w);
    let records = palisade_labstore::volume::read_file(&volume)
        .with_context(|| format!("reading {}", volume.display()))?;
    let report = analyze(&entries_from(&records), &acks);
    Ok(Record::Writer {
        t,
        writer: w.to_string(),
        pods,
        log_writes: report.log_writes,
        split_brain: report.split_brain.len(),
        lost: report.lost.len(),
        report: report.render(),
    })
}

fn ack_log_uid(p: &Path) -> String {
    p.file_stem()
        .and_then(|s| s.to_str())
        .map(|s| s.trim_start_matches("acks-").to_string())
        .unwrap_or_default()
}

/// The report: stable in format, so campaigns can be compared.
fn render(
    cfg: &Config,
    schedule: &[Event],
    records: &[Record],
    violations: &[Violation],
    live: bool,
    settles: (usize, usize),
    wall_s: f64,
) -> String {
    let mut s = String::new();
    let tally = Tally::of(records);
    let _ = writeln!(
        s,
        "nemesis campaign: seed {}, {} of {} events applied ({} skipped), {} {}machines, {} writers, {:.0} s",
        cfg.seed,
        tally.applied.len(),
        schedule.len(),
        tally.skipped,
        cfg.machines,
        // Unchanged for namespace machines, so earlier reports compare line by line.
        if cfg.machine_kind == MachineKind::Qemu {
            "QEMU "
        } else {
            ""
        },
        cfg.writers,
        wall_s
    );
    let by_class: Vec<String> = tally
        .by_class
        .iter()
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    let _ = writeln!(s, "faults by class: {}", by_class.join(", "));
    let phase_list: Vec<String> = tally
        .phases
        .iter()
        .map(|(p, n)| format!("{p} {n}"))
        .collect();
    let _ = write!(
        s,
        "fences: {} NodeFences ({}), {} pods released",
        tally.finals.len(),
        phase_list.join(", "),
        tally.released
    );
    let _ = match tally.gone {
        0 => writeln!(s),
        n => writeln!(s, "; {n} more observed and deleted before the end"),
    };
    for f in tally.finals.iter().filter(|f| f.failure.is_some()) {
        let _ = writeln!(
            s,
            "  {} ({}) failed: {}",
            f.fence,
            f.node,
            f.failure.as_deref().unwrap_or("")
        );
    }
    let repairs = records
        .iter()
        .filter(|r| matches!(r, Record::Repair { .. }))
        .count();
    let _ = writeln!(
        s,
        "settled before {} of {} events; {} repairs by the nemesis",
        settles.1, settles.0, repairs
    );
    for r in records {
        if let Record::Writer {
            writer,
            pods,
            log_writes,
            split_brain,
            lost,
            ..
        } = r
        {
            let acks: usize = pods.iter().map(|p| p.2).sum();
            let nodes: Vec<&str> = pods.iter().map(|p| p.1.as_str()).collect();
            let _ = writeln!(
                s,
                "writer {writer}: {} incarnation(s) on [{}], {acks} acknowledged, {log_writes} accepted, split-brain {split_brain}, lost {lost}",
                pods.len(),
                nodes.join(", ")
            );
        }
    }
    let _ = writeln!(
        s,
        "identity {}-0 (no volume): {} incarnation(s), {} time(s) two alive at once",
        crate::world::IDENTITY,
        tally.identity_incarnations,
        tally.overlaps
    );
    let _ = writeln!(
        s,
        "liveness: {}",
        if live {
            "every writer writing again after the last heal"
        } else {
            "NOT every writer was writing again within the bound after the last heal"
        }
    );
    if stopping() {
        let _ = writeln!(
            s,
            "interrupted: a stop was requested before the schedule ended"
        );
    }
    let _ = writeln!(s, "violations: {}", violations.len());
    for v in violations {
        let _ = writeln!(s, "  [{}] {}", v.check, v.detail);
    }
    let _ = writeln!(
        s,
        "VERDICT: {}",
        if violations.is_empty() {
            "PASS"
        } else {
            "FAIL"
        }
    );
    let _ = writeln!(s, "history: {}", cfg.out.join("history.jsonl").display());
    let _ = writeln!(s, "replay: {}", cfg.replay());
    s
}
