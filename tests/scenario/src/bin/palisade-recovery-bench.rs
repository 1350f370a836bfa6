//! `palisade-recovery-bench`: how long a StatefulSet with a ReadWriteOnce volume takes to
//! recover when its machine fails, with Palisade, for two faults (`--fault both|cut|power`,
//! default both), run alternately on fresh labs:
//!
//! - **cut**: m0 drops off the network and is judged by its silence (policy Unhealthy after
//!   4 s);
//! - **power**: m0 is switched off at its BMC (`ipmitool chassis power off`) and is judged on
//!   power evidence: the controller reads every identity-pinned BMC every 250 ms
//!   (`--power-watch-interval`), and a machine read off for 1 s (`powerOffAfterSeconds`) that
//!   missed a renewal is Unhealthy at once ([`headline::Options::power_off`]).
//!
//! p50, p99 (nearest rank) and max of `--runs` per fault (default 20), per series: a machine kind
//! (`--kind both|netns|qemu`, default both: namespace machines and QEMU machines) on a Kubernetes
//! release (`--kube both|1.20|1.34`, default both); and, in the same run, without Palisade (one
//! cut, on the first series, watched for `--without-seconds`, default 90; 0 skips it). Series
//! that differ in one respect are then printed side by side: each kind on 1.20 and 1.34, or,
//! with one release, the two kinds. With `--out FILE.json` the figures are written as JSON
//! (every run and every statistic, rewritten after each series) and as a Markdown table beside
//! it (`FILE.md`).
//!
//! After each scenario the lab's m2 is powered off and on through its BMC, to measure what the
//! machine kind costs: boot time (power on → new boot ID), power-off latency (command → BMC
//! reports off → no process of the machine left, QEMU gone for a VM) and memory per machine.
//!
//! Conditions: node Lease 4 s renewed every second (node agents self-fence after 3 s), Palisade's
//! policy Suspect 2 s / Unhealthy 4 s, controller resync 250 ms, kube-controller-manager on its
//! default settings. Offsets count from the instant the fault returned (the partition, or the
//! `chassis power off` command; the command's own time is reported beside it). Phases are
//! observed by polling the API every 200 ms and also read from the controller's own
//! timestamps; attachment, Running and writing are observed by polling.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use palisade_lab::{KubeVersion, MachineKind};
use palisade_model::nodefence::Phase;
use palisade_scenario::headline::{self, Options, Report, Timeline};
use palisade_scenario::*;
use palisade_test_support::bench::{self, Stat};
use serde_json::{json, Value};

/// The flags, each followed by its value.
const FLAGS: [&str; 6] = [
    "--kind",
    "--kube",
    "--fault",
    "--runs",
    "--without-seconds",
    "--out",
];

/// What the command line says, checked before anything runs.
struct Args {
    kinds: Vec<MachineKind>,
    kubes: Vec<KubeVersion>,
    faults: Vec<Fault>,
    runs: usize,
    /// `None`: no run without Palisade.
    without: Option<Duration>,
    out: Option<PathBuf>,
}

fn parse_args() -> Result<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut given = std::collections::BTreeMap::new();
    let mut it = args.iter();
    while let Some(name) = it.next() {
        if name == "--help" || name == "-h" {
            println!("usage: palisade-recovery-bench [--kind both|netns|qemu] [--kube both|1.20|1.34] [--fault both|cut|power] [--runs N (1-100, default 20)] [--without-seconds S (0 skips, else 10-900; default 90)] [--out FILE.json]");
            std::process::exit(0);
        }
        if !FLAGS.contains(&name.as_str()) {
            bail!(
                "unknown argument {name:?}; the flags are {}",
                FLAGS.join(", ")
            );
        }
        let value = it.next().with_context(|| format!("{name} needs a value"))?;
        given.insert(name.as_str(), value.as_str());
    }
    let number = |name: &str, default: u64| -> Result<u64> {
        given.get(name).map_or(Ok(default), |v| {
            v.parse()
                .with_context(|| format!("{name} must be a whole number, not {v:?}"))
        })
    };
    let runs = number("--runs", 20)?;
    if !(1..=100).contains(&runs) {
        bail!("--runs takes 1 to 100, not {runs}");
    }
    let without = match number("--without-seconds", 90)? {
        0 => None,
        s @ 10..=900 => Some(Duration::from_secs(s)),
        s => bail!("--without-seconds takes 0 (no run without Palisade) or 10 to 900, not {s}"),
    };
    let kinds = match given.get("--kind").copied().unwrap_or("both") {
        "both" => vec![MachineKind::Namespace, MachineKind::Qemu],
        "netns" => vec![MachineKind::Namespace],
        "qemu" => vec![MachineKind::Qemu],
        other => bail!("--kind takes both, netns or qemu, not {other:?}"),
    };
    let kubes = match given.get("--kube").copied().unwrap_or("both") {
        "both" => KubeVersion::ALL.to_vec(),
        other => KubeVersion::parse(other)
            .map(|v| vec![v])
            .with_context(|| {
                let valid: Vec<&str> = KubeVersion::ALL.iter().map(|v| v.minor()).collect();
                format!("--kube takes both, {}, not {other:?}", valid.join(" or "))
            })?,
    };
    let faults = match given.get("--fault").copied().unwrap_or("both") {
        "both" => vec![Fault::Cut, Fault::Power],
        "cut" => vec![Fault::Cut],
        "power" => vec![Fault::Power],
        other => bail!("--fault takes both, cut or power, not {other:?}"),
    };
    let out = given.get("--out").map(PathBuf::from);
    if let Some(out) = &out {
        if out.extension().and_then(|e| e.to_str()) != Some("json") {
            bail!("--out names a .json file (the Markdown goes beside it), not {out:?}");
        }
    }
    Ok(Args {
        kinds,
        kubes,
        faults,
        runs: usize::try_from(runs)?,
        without,
        out,
    })
}

/// How m0 fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Cut off the network: judged by its silence.
    Cut,
    /// Switched off at its BMC: judged on power evidence.
    Power,
}

impl Fault {
    fn flag(self) -> &'static str {
        match self {
            Fault::Cut => "cut",
            Fault::Power => "power",
        }
    }

    /// What the offsets count from.
    fn origin(self) -> &'static str {
        match self {
            Fault::Cut => "cut",
            Fault::Power => "power off",
        }
    }
}

/// What powering one machine off and on again cost, measured through its BMC on the lab the
/// scenario ran on (m2, which the scenario leaves alone).
#[derive(Debug, Clone, Copy)]
struct MachineFigures {
    /// Memory of the powered machine (proportional set size of its processes: the QEMU
    /// process for a VM), MiB.
    memory_mib: f64,
    /// `chassis power off` sent → the BMC reports off.
    off_reported: Duration,
    /// `chassis power off` sent → no process of the machine is left (QEMU gone).
    off_gone: Duration,
    /// `chassis power on` sent → the machine booted with a new boot ID (a VM's guest init
    /// has brought up its network and share).
    boot: Duration,
}

fn ipmi(m: &palisade_lab::Machine, args: &[&str]) -> Result<String> {
    let out = m.bmc().ipmitool().args(args).output()?;
    if !out.status.success() {
        bail!(
            "ipmitool {args:?} on {}: {}",
            m.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn machine_figures(lab: &palisade_lab::Lab) -> Result<MachineFigures> {
    let m = lab.machine("m2")?;
    let memory_kib: u64 = m
        .processes()
        .into_iter()
        .filter_map(|p| palisade_lab::process::memory_kib(p, "Pss"))
        .sum();
    let before = m.boot_id();
    let t0 = Instant::now();
    // The processes are watched from a thread (every 5 ms) while ipmitool polls the BMC.
    let gone = std::thread::scope(|s| -> Result<(Duration, Duration)> {
        let watcher = s.spawn(|| {
            while !m.processes().is_empty() && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(5));
            }
            t0.elapsed()
        });
        ipmi(m, &["chassis", "power", "off"])?;
        let reported = loop {
            if ipmi(m, &["chassis", "power", "status"])?.ends_with("off") {
                break t0.elapsed();
            }
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("{}: the BMC never reported off", m.name());
            }
        };
        let gone = watcher.join().expect("the watcher does not panic");
        Ok((reported, gone))
    })?;
    if !m.processes().is_empty() {
        bail!("{}: processes left 30 s after power off", m.name());
    }
    let t1 = Instant::now();
    ipmi(m, &["chassis", "power", "on"])?;
    m.wait_booted(before.as_deref(), Duration::from_secs(180))?;
    Ok(MachineFigures {
        memory_mib: memory_kib as f64 / 1024.0,
        off_reported: gone.0,
        off_gone: gone.1,
        boot: t1.elapsed(),
    })
}

/// One series of runs: a machine kind on a Kubernetes release.
#[derive(Debug, Clone, Copy)]
struct Series {
    kind: MachineKind,
    kube: KubeVersion,
}

impl Series {
    fn label(self) -> String {
        format!(
            "{}, Kubernetes {}",
            kind_label(self.kind),
            self.kube.minor()
        )
    }

    /// What sets this series apart from `other`: its kind, or else its release.
    fn differs(self, other: Series) -> (&'static str, String) {
        if self.kind != other.kind {
            (
                kind_flag(self.kind),
                format!("Kubernetes {}", self.kube.minor()),
            )
        } else {
            (self.kube.minor(), kind_label(self.kind).to_string())
        }
    }
}

fn one(
    series: Series,
    fault: Fault,
    palisade: bool,
    watch: Duration,
) -> Result<(Report, MachineFigures)> {
    let agents = AgentOptions {
        lease_seconds: 4,
        self_fence_seconds: 3.0,
        kube: Some(series.kube),
        ..AgentOptions::default()
    };
    let lab = lab_of_kind(series.kind, 3, true, &agents).context("starting the lab")?;
    let c = Cluster::connect(&lab)?;
    c.wait_nodes_ready(&lab)?;
    let t = Timeline::new(palisade);
    let report = headline::run(
        &lab,
        &c,
        &t,
        Options {
            palisade,
            watch_without: watch,
            power_off: fault == Fault::Power,
            ..Options::default()
        },
    )?;
    let figures = machine_figures(&lab)?;
    Ok((report, figures))
}

fn secs(d: Option<Duration>) -> String {
    fmt(d.map(|d| d.as_secs_f64()))
}

fn fmt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:6.2}"))
        .unwrap_or_else(|| "     -".into())
}

/// The machine kind's costs, over every run of a series.
struct MachineSummary {
    memory_mib: Stat,
    off_reported: Stat,
    off_gone: Stat,
    boot: Stat,
}

/// One fault's runs in one series.
struct FaultRuns {
    fault: Fault,
    reports: Vec<Report>,
    /// The attempts that failed (and were run again), with their errors.
    failures: Vec<String>,
}

/// Attempts of one run before the bench gives up. A lab that fails, say a scheduling timeout
/// before the fault on a loaded machine, measures nothing; every failure is printed and kept in
/// the JSON.
const ATTEMPTS: usize = 3;

/// A figure of a run: its key (in the JSON), its name (in the tables) and how to take it.
struct Figure {
    key: &'static str,
    name: &'static str,
    of: fn(&Report) -> Option<Duration>,
}

/// The recovery figures, as offsets from the fault's return.
const FIGURES: [Figure; 11] = [
    Figure {
        key: "power_command",
        name: "power off command (sent → returned)",
        of: |r| r.power_command,
    },
    Figure {
        key: "first_off_read",
        name: "→ first off read (controller log)",
        of: |r| r.first_off_read,
    },
    Figure {
        key: "decided",
        name: "→ decided (NodeFence Pending)",
        of: |r| r.phase(Phase::Pending),
    },
    Figure {
        key: "fenced",
        name: "→ fenced (verified)",
        of: |r| r.phase(Phase::Fenced),
    },
    Figure {
        key: "released",
        name: "→ released",
        of: |r| r.phase(Phase::Released),
    },
    Figure {
        key: "attached",
        name: "→ volume attached elsewhere",
        of: |r| r.attached,
    },
    Figure {
        key: "running",
        name: "→ replacement Running",
        of: |r| r.running,
    },
    Figure {
        key: "running_from_command_sent",
        name: "→ replacement Running, from the command's sending",
        of: |r| Some(r.running? + r.power_command?),
    },
    Figure {
        key: "writing",
        name: "→ replacement writing",
        of: |r| r.writing,
    },
    Figure {
        key: "decided_stamped",
        name: "→ decided (controller's timestamp)",
        of: |r| r.stamped(Phase::Pending),
    },
    Figure {
        key: "released_stamped",
        name: "→ released (controller's timestamp)",
        of: |r| r.stamped(Phase::Released),
    },
];

impl FaultRuns {
    fn stat(&self, of: impl Fn(&Report) -> Option<Duration>) -> Stat {
        Stat::of(
            self.reports
                .iter()
                .filter_map(|r| of(r).map(|d| d.as_secs_f64())),
        )
    }

    fn figure(&self, key: &str) -> Stat {
        FIGURES
            .iter()
            .find(|f| f.key == key)
            .map(|f| self.stat(f.of))
            .unwrap_or_default()
    }

    /// The figures this fault has (a cut has no power command nor off read).
    fn figures(&self) -> impl Iterator<Item = (&'static Figure, Stat)> + '_ {
        FIGURES
            .iter()
            .map(|f| (f, self.stat(f.of)))
            .filter(|(_, s)| s.count > 0)
    }

    /// Where the time goes, run by run, as consecutive steps (the p50 of each step over the
    /// runs): the controller's timestamps for its phases, polling for the rest.
    fn steps(&self) -> Vec<(&'static str, Stat)> {
        let step = |from: fn(&Report) -> Option<f64>, to: fn(&Report) -> Option<f64>| {
            Stat::of(self.reports.iter().filter_map(|r| Some(to(r)? - from(r)?)))
        };
        let mut steps = Vec::new();
        if self.fault == Fault::Power {
            steps.push((
                "ipmitool chassis power off (sent → returned)",
                self.stat(|r| r.power_command),
            ));
            steps.push((
                "returned → the power watch reads it off",
                self.stat(|r| r.first_off_read),
            ));
            steps.push((
                "first off read → decided (1 s off, a missed renewal)",
                step(
                    |r| r.first_off_read.map(|d| d.as_secs_f64()),
                    |r| r.stamped(Phase::Pending).map(|d| d.as_secs_f64()),
                ),
            ));
        } else {
            steps.push((
                "cut → decided (silence past the threshold)",
                self.stat(|r| r.stamped(Phase::Pending)),
            ));
        }
        steps.push((
            "decided → fenced (power off + storage block, verified)",
            step(
                |r| r.stamped(Phase::Pending).map(|d| d.as_secs_f64()),
                |r| r.stamped(Phase::Fenced).map(|d| d.as_secs_f64()),
            ),
        ));
        steps.push((
            "fenced → released (taint, pod, attachment, volumesInUse)",
            step(
                |r| r.stamped(Phase::Fenced).map(|d| d.as_secs_f64()),
                |r| r.stamped(Phase::Released).map(|d| d.as_secs_f64()),
            ),
        ));
        steps.push((
            "released → re-attached (attach-detach controller, attacher)",
            step(
                |r| r.stamped(Phase::Released).map(|d| d.as_secs_f64()),
                |r| r.attached.map(|d| d.as_secs_f64()),
            ),
        ));
        steps.push((
            "re-attached → Running (scheduler, node agent, container)",
            step(
                |r| r.attached.map(|d| d.as_secs_f64()),
                |r| r.running.map(|d| d.as_secs_f64()),
            ),
        ));
        steps
    }
}

/// Every run of one series.
struct SeriesRuns {
    series: Series,
    faults: Vec<FaultRuns>,
    figures: Vec<MachineFigures>,
}

impl SeriesRuns {
    fn machine(&self) -> MachineSummary {
        let fig = |f: fn(&MachineFigures) -> f64| Stat::of(self.figures.iter().map(f));
        MachineSummary {
            memory_mib: fig(|f| f.memory_mib),
            off_reported: fig(|f| f.off_reported.as_secs_f64()),
            off_gone: fig(|f| f.off_gone.as_secs_f64()),
            boot: fig(|f| f.boot.as_secs_f64()),
        }
    }

    fn fault(&self, fault: Fault) -> Option<&FaultRuns> {
        self.faults.iter().find(|f| f.fault == fault)
    }

    /// The figures compared between series: name, figure, unit.
    fn rows(&self) -> Vec<(String, Stat, &'static str)> {
        let mut rows = Vec::new();
        for f in &self.faults {
            for key in ["decided", "released", "running", "writing"] {
                let name = FIGURES
                    .iter()
                    .find(|x| x.key == key)
                    .map_or(key, |x| x.name);
                rows.push((
                    format!("{} {}", f.fault.origin(), name.trim_start_matches("→ ")),
                    f.figure(key),
                    "s",
                ));
            }
        }
        let m = self.machine();
        rows.extend([
            ("power on → booted".to_string(), m.boot, "s"),
            (
                "power off → BMC reports off".to_string(),
                m.off_reported,
                "s",
            ),
            ("power off → nothing left".to_string(), m.off_gone, "s"),
            ("memory per machine".to_string(), m.memory_mib, "MiB"),
        ]);
        rows
    }

    fn json(&self) -> Value {
        let m = self.machine();
        json!({
            "kind": kind_flag(self.series.kind),
            "kube": self.series.kube.minor(),
            "faults": self.faults.iter().map(|f| json!({
                "fault": f.fault.flag(),
                "runs": f.reports.iter().map(run_json).collect::<Vec<_>>(),
                "stats": FIGURES.iter().map(|x| (x.key.to_string(), f.stat(x.of).json())).collect::<serde_json::Map<_, _>>(),
                "decided_on_power_evidence": f.reports.iter().filter(|r| r.on_power_evidence()).count(),
                "failed_attempts": f.failures,
                "steps": f.steps().into_iter().map(|(name, s)| json!({"step": name, "p50": s.p50, "p99": s.p99})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "machine": {
                "memory_mib": m.memory_mib.json(),
                "power_off_bmc_reports_off": m.off_reported.json(),
                "power_off_nothing_left": m.off_gone.json(),
                "power_on_booted": m.boot.json(),
            },
        })
    }
}

fn run_json(r: &Report) -> Value {
    let s = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    json!({
        "figures": FIGURES.iter().map(|x| (x.key.to_string(), json!(s((x.of)(r))))).collect::<serde_json::Map<_, _>>(),
        "phases_polled": r.phases.iter().map(|(p, d)| json!([p.as_str(), d.as_secs_f64()])).collect::<Vec<_>>(),
        "phases_stamped": r.stamped.iter().map(|(p, d)| json!([p.as_str(), d.as_secs_f64()])).collect::<Vec<_>>(),
        "reason": r.reason,
        "verdict_pass": r.verdict_pass,
    })
}

fn kind_label(kind: MachineKind) -> &'static str {
    match kind {
        MachineKind::Namespace => "namespace machines",
        MachineKind::Qemu => "QEMU machines (TCG)",
    }
}

/// The kind as `--kind` names it.
fn kind_flag(kind: MachineKind) -> &'static str {
    match kind {
        MachineKind::Namespace => "netns",
        MachineKind::Qemu => "qemu",
    }
}

fn bench_series(series: Series, faults: &[Fault], runs: usize) -> Result<SeriesRuns> {
    let label = series.label();
    println!(
        "\n{label}: {runs} run(s) of each fault with Palisade ({}), alternating, seconds after the fault returned:",
        faults.iter().map(|f| f.flag()).collect::<Vec<_>>().join(", ")
    );
    println!("  run  fault  decided  fenced  released  attached  running  writing  on       verdict   cmd  1st-off   boot  off(bmc)  off(gone)  memory");
    let mut by_fault: Vec<FaultRuns> = faults
        .iter()
        .map(|&fault| FaultRuns {
            fault,
            reports: Vec::new(),
            failures: Vec::new(),
        })
        .collect();
    let mut figures = Vec::new();
    for i in 0..runs {
        for fr in &mut by_fault {
            let fault = fr.fault;
            let mut attempt = 1;
            let (r, f) = loop {
                match one(series, fault, true, Duration::ZERO) {
                    Ok(done) => break done,
                    Err(e) if attempt < ATTEMPTS => {
                        println!(
                            "  {i:>3}  {:<5}  attempt {attempt} failed, running it again: {e:#}",
                            fault.flag()
                        );
                        fr.failures.push(format!("run {i} attempt {attempt}: {e:#}"));
                        attempt += 1;
                    }
                    Err(e) => {
                        return Err(e.context(format!(
                            "{label}, {} run {i}, attempt {attempt} of {ATTEMPTS} (PALISADE_KEEP_LAB=1 keeps the labs' logs)",
                            fault.flag()
                        )))
                    }
                }
            };
            println!(
                "  {i:>3}  {:<5}  {}  {}  {}    {}   {}  {}  {:<7}  {}  {} {}  {}  {}    {}     {:5.0} MiB",
                fault.flag(),
                secs(r.phase(Phase::Pending)),
                secs(r.phase(Phase::Fenced)),
                secs(r.phase(Phase::Released)),
                secs(r.attached),
                secs(r.running),
                secs(r.writing),
                if r.on_power_evidence() { "power" } else { "silence" },
                if r.verdict_pass { "PASS" } else { "FAIL" },
                secs(r.power_command),
                secs(r.first_off_read),
                secs(Some(f.boot)),
                secs(Some(f.off_reported)),
                secs(Some(f.off_gone)),
                f.memory_mib,
            );
            if !r.verdict_pass {
                bail!(
                    "{label}, {} run {i}: the at-most-one checker failed",
                    fault.flag()
                );
            }
            fr.reports.push(r);
            figures.push(f);
        }
    }
    let s = SeriesRuns {
        series,
        faults: by_fault,
        figures,
    };
    for f in &s.faults {
        println!(
            "  {} ({} runs, {} failed attempt(s) run again; decided on power evidence in {}):",
            f.fault.flag(),
            f.reports.len(),
            f.failures.len(),
            f.reports.iter().filter(|r| r.on_power_evidence()).count()
        );
        println!(
            "    {:<52} {:>6} {:>6} {:>6} {:>6}",
            "seconds after the fault returned", "p50", "p99", "max", "min"
        );
        for (fig, st) in f.figures() {
            println!(
                "    {:<52} {} {} {} {}",
                fig.name,
                fmt(st.p50),
                fmt(st.p99),
                fmt(st.max),
                fmt(st.min)
            );
        }
        println!("    where the time goes (each step over the runs: p50, p99):");
        for (name, st) in f.steps() {
            println!("      {name:<62} {} {}", fmt(st.p50), fmt(st.p99));
        }
    }
    let m = s.machine();
    println!(
        "  the machine (m2, after each run; p50, max): power on → booted {} {} s, power off → BMC reports off {} {} s, → nothing left {} {} s, memory {:.0} {:.0} MiB",
        fmt(m.boot.p50),
        fmt(m.boot.max),
        fmt(m.off_reported.p50),
        fmt(m.off_reported.max),
        fmt(m.off_gone.p50),
        fmt(m.off_gone.max),
        m.memory_mib.p50.unwrap_or(0.0),
        m.memory_mib.max.unwrap_or(0.0),
    );
    done_when(&s);
    Ok(s)
}

/// The targets, against this series: power loss → Running within 2 s at p50, a
/// partition → Running within the Unhealthy threshold (4 s) + 2 s at p99.
fn done_when(s: &SeriesRuns) {
    let verdict = |v: Option<f64>, limit: f64| match v {
        Some(v) if v <= limit => "met",
        Some(_) => "not met",
        None => "no figure",
    };
    if let Some(p) = s.fault(Fault::Power) {
        let (ret, sent) = (p.figure("running"), p.figure("running_from_command_sent"));
        println!(
            "  target: power off → Running p50 ≤ 2 s: {} s after the command returned ({}), {} s after it was sent ({})",
            fmt(ret.p50).trim(),
            verdict(ret.p50, 2.0),
            fmt(sent.p50).trim(),
            verdict(sent.p50, 2.0),
        );
    }
    if let Some(c) = s.fault(Fault::Cut) {
        let run = c.figure("running");
        println!(
            "  target: cut → Running p99 ≤ threshold + 2 s = 6 s: {} s ({})",
            fmt(run.p99).trim(),
            verdict(run.p99, 6.0),
        );
    }
}

/// Two series that differ in one respect (kind or release), side by side: p50 and p99,
/// ratio = `b` / `a`.
fn side_by_side(a: &SeriesRuns, b: &SeriesRuns) {
    let ((a_name, same), (b_name, _)) = (a.series.differs(b.series), b.series.differs(a.series));
    println!("\nside by side, {same} (p50, then p99; ratio = {b_name} / {a_name} of each):");
    println!(
        "  {:<38} {a_name:>6} {:>6}      {b_name:>6} {:>6}      {:>7}  {:>7}",
        "", "p99", "p99", "ratio", "p99"
    );
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if x > 0.0 => format!("{:6.2}x", y / x),
        _ => "      -".into(),
    };
    for ((name, x, unit), (_, y, _)) in a.rows().into_iter().zip(b.rows()) {
        println!(
            "  {name:<38} {} {} {unit:<3}  {} {} {unit:<3}  {}  {}",
            fmt(x.p50),
            fmt(x.p99),
            fmt(y.p50),
            fmt(y.p99),
            ratio(x.p50, y.p50),
            ratio(x.p99, y.p99),
        );
    }
}

/// The series' recovery figures as Markdown tables (one per series: each fault's p50, p99 and
/// max), for the benchmark page.
/// The report page, rendered from the JSON document alone (what [`write_out`] writes, or
/// `docs/data/recovery.json`), so the page in `docs/` is generated from data.
///
/// Guarantees: a document without the fields the page shows is an error, never a page with
/// holes; a figure no run of a series has is left out of that series' table.
fn markdown(doc: &Value) -> Result<String> {
    let get = |v: &Value, key: &str| -> Result<Value> {
        v.get(key)
            .cloned()
            .with_context(|| format!("the recovery document has no {key:?}"))
    };
    let text = |v: Value| match v {
        Value::String(s) => s,
        Value::Null => "-".to_string(),
        other => other.to_string(),
    };
    let runs = get(doc, "runs_per_fault")?;
    let mut md = format!(
        "# Recovery report\n\n\
         Generated from `docs/data/recovery.json` (written by `hack/bench.sh recovery`; \
         `RECORD=1` copies it here) by `palisade-recovery-bench`; do not edit. Measured {} at \
         commit {} ({} build, {} CPUs, load average {} at the end), {} runs per fault; every \
         run's figures are in the data file. Conditions: node Lease 4 s renewed every second, Suspect 2 s, Unhealthy 4 s, \
         power evidence after {} s read off; seconds after the fault returned (the partition, \
         or `ipmitool chassis power off`), nearest-rank percentiles.\n",
        text(get(doc, "measured_at")?),
        text(get(doc, "commit")?),
        text(get(doc, "build")?),
        text(get(doc, "cpus")?),
        text(doc.get("load_average").cloned().unwrap_or(Value::Null)),
        text(runs.clone()),
        text(get(&get(&get(doc, "conditions")?, "power")?, "power_off_after_seconds")?),
    );
    let series = get(doc, "series")?;
    for s in series.as_array().context("\"series\" is not a list")? {
        let kind = text(get(s, "kind")?);
        let kind = [MachineKind::Namespace, MachineKind::Qemu]
            .into_iter()
            .find(|k| kind_flag(*k) == kind)
            .map(kind_label)
            .with_context(|| format!("unknown machine kind {kind:?}"))?;
        md.push_str(&format!(
            "\n## {kind}, Kubernetes {}\n\n",
            text(get(s, "kube")?)
        ));
        let faults = get(s, "faults")?;
        let faults = faults.as_array().context("\"faults\" is not a list")?;
        let head: Vec<String> = faults
            .iter()
            .map(|f| Ok(text(get(f, "fault")?)))
            .collect::<Result<Vec<_>>>()?
            .iter()
            .flat_map(|f| ["p50", "p99", "max"].map(|p| format!("{f} {p}")))
            .collect();
        md.push_str(&format!("| | {} |\n", head.join(" | ")));
        md.push_str(&format!("|---|{}\n", "---|".repeat(head.len())));
        for fig in &FIGURES {
            let mut cells = Vec::new();
            for f in faults {
                let st = get(&get(f, "stats")?, fig.key)?;
                for p in ["p50", "p99", "max"] {
                    cells.push(
                        get(&st, p)?
                            .as_f64()
                            .map_or("-".to_string(), |v| format!("{v:.2}")),
                    );
                }
            }
            if cells.iter().all(|c| c == "-") {
                continue;
            }
            md.push_str(&format!("| {} | {} |\n", fig.name, cells.join(" | ")));
        }
    }
    if let Some(w) = doc.get("without_palisade").filter(|w| !w.is_null()) {
        md.push_str(&format!(
            "\nWithout Palisade (kube-controller-manager alone, one cut, watched {} s), at the \
             end: {}.\n",
            text(get(w, "watched_seconds")?),
            text(get(w, "stuck")?),
        ));
    }
    Ok(md)
}

/// Writes the JSON (and the Markdown beside it) with what has been measured so far.
fn write_out(
    out: &Path,
    args: &Args,
    all: &[SeriesRuns],
    without: Option<&(Report, Duration)>,
) -> Result<()> {
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut doc = json!({
        "bench": "recovery",
        "runs_per_fault": args.runs,
        "conditions": {
            "node_lease_seconds": 4, "node_renew_seconds": 1, "self_fence_after_seconds": 3,
            "suspect_after_seconds": 2, "unhealthy_after_seconds": 4, "controller_resync_ms": 250,
            "power": {
                "power_off_after_seconds": headline::POWER_OFF_AFTER_SECONDS,
                "power_watch_interval": headline::POWER_WATCH_INTERVAL,
            },
            "poll_ms": 200,
            "offsets_from": "the instant the fault returned (the partition, or ipmitool chassis power off)",
            "percentiles": "nearest rank",
        },
        "series": all.iter().map(SeriesRuns::json).collect::<Vec<_>>(),
        "without_palisade": without.map(|(r, watched)| json!({
            "watched_seconds": watched.as_secs_f64(),
            "stuck": r.stuck,
        })),
    });
    // When, where and how: the date, the commit, the build, the cores and the load average
    // (at the end), as every bench's document records them.
    if let Value::Object(m) = &mut doc {
        m.extend(bench::provenance());
    }
    std::fs::write(out, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", out.display()))?;
    let md = out.with_extension("md");
    std::fs::write(&md, markdown(&doc)?).with_context(|| format!("writing {}", md.display()))?;
    Ok(())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    // Kind by kind, each on every release: consecutive pairs differ in one respect.
    let series: Vec<Series> = args
        .kinds
        .iter()
        .flat_map(|&kind| args.kubes.iter().map(move |&kube| Series { kind, kube }))
        .collect();
    println!(
        "recovery benchmark: {} run(s) of each fault ({}) with Palisade per series ({}){}",
        args.runs,
        args.faults
            .iter()
            .map(|f| f.flag())
            .collect::<Vec<_>>()
            .join(", "),
        series
            .iter()
            .map(|s| s.label())
            .collect::<Vec<_>>()
            .join("; "),
        match args.without {
            Some(w) => format!(", 1 without (watched {w:?})"),
            None => String::new(),
        }
    );
    println!("faults: cut = m0 off the network, judged by its silence (Unhealthy after 4 s); power = m0 switched off at its BMC,");
    println!(
        "judged on power evidence (powerOffAfterSeconds {}, --power-watch-interval {}, the BMC pinned to the machine's identity).",
        headline::POWER_OFF_AFTER_SECONDS,
        headline::POWER_WATCH_INTERVAL
    );
    println!("columns: NodeFence phases, attachment, replacement Running and writing (seconds after the fault returned, polled");
    println!("every 200 ms), what the fence was decided on, the verdict, the power-off command's own time and the power watch's");
    println!("first off read; then, on m2 after the scenario: power on → booted (new boot ID), power off → BMC reports off,");
    println!("power off → no process left, and the machine's memory (PSS) while it ran. Percentiles are nearest rank: below");
    println!("100 runs the p99 is the worst run.");
    let mut all = Vec::new();
    for s in &series {
        all.push(bench_series(*s, &args.faults, args.runs)?);
        if let Some(out) = &args.out {
            write_out(out, &args, &all, None)?;
        }
    }
    // Two releases: each kind on 1.20 beside 1.34; one release and two kinds: the kinds.
    for pair in all.chunks_exact(2) {
        side_by_side(&pair[0], &pair[1]);
    }

    let Some(without) = args.without else {
        if let Some(out) = &args.out {
            println!(
                "\nfigures written to {} and {}",
                out.display(),
                out.with_extension("md").display()
            );
        }
        return Ok(());
    };
    let first = series[0];
    println!(
        "\nwithout Palisade ({}, a cut), watched for {without:?}:",
        first.label()
    );
    let (r, _) = one(first, Fault::Cut, false, without)?;
    let stuck = r.stuck.clone().unwrap_or_default();
    println!("  after {:.0} s: {stuck}", without.as_secs_f64());
    if let Some(rn) = all[0]
        .fault(Fault::Cut)
        .and_then(|f| f.figure("running").p50)
    {
        println!(
            "  with Palisade the replacement ran after {rn:.2} s; without it, none ran in {:.0} s (ratio > {:.0}x; Kubernetes alone never releases the pod)",
            without.as_secs_f64(),
            without.as_secs_f64() / rn
        );
    }
    if let Some(out) = &args.out {
        write_out(out, &args, &all, Some(&(r, without)))?;
        println!(
            "\nfigures written to {} and {}",
            out.display(),
            out.with_extension("md").display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/recovery-report.md` is generated from `docs/data/recovery.json`;
    /// `PALISADE_WRITE_REPORTS=1` rewrites it.
    #[test]
    fn the_recovery_report_is_current_with_its_data() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let data = std::fs::read_to_string(format!("{root}/docs/data/recovery.json")).unwrap();
        let page = markdown(&serde_json::from_str(&data).unwrap()).unwrap();
        let path = format!("{root}/docs/recovery-report.md");
        if std::env::var("PALISADE_WRITE_REPORTS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &page).unwrap();
        }
        assert!(
            std::fs::read_to_string(&path).unwrap_or_default() == page,
            "docs/recovery-report.md is out of date; run `PALISADE_WRITE_REPORTS=1 cargo test -p palisade-scenario --bin palisade-recovery-bench`"
        );
    }

    #[test]
    fn a_document_without_a_field_the_page_shows_is_an_error() {
        assert!(markdown(&json!({})).is_err());
        let doc = json!({"runs_per_fault": 1, "measured_at": "t", "commit": "c", "build": "debug",
            "cpus": 2, "conditions": {"power": {"power_off_after_seconds": 1}},
            "series": [{"kind": "netns", "kube": "1.34", "faults": [{"fault": "cut", "stats": {}}]}]});
        let err = markdown(&doc).unwrap_err().to_string();
        assert!(err.contains("power_command"), "{err}");
    }
}
