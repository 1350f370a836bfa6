//! `palisade-recovery-bench`: how long a StatefulSet with a ReadWriteOnce volume takes to
//! recover when its machine drops off the network, with Palisade (median of `--runs`, default 5,
//! each on a fresh lab) on namespace machines and on QEMU machines side by side (`--kind
//! both|netns|qemu`, default both), and, in the same run, without it (one run, watched for
//! `--without-seconds`, default 90).
//!
//! After each scenario the lab's m2 is powered off and on through its BMC, to measure what the
//! machine kind costs: boot time (power on → new boot ID), power-off latency (command → BMC
//! reports off → no process of the machine left, QEMU gone for a VM) and memory per machine.
//!
//! Conditions: node Lease 4 s renewed every second (node agents self-fence after 3 s), Palisade's
//! policy Suspect 2 s / Unhealthy 4 s, controller resync 250 ms, kube-controller-manager on its
//! default settings. Offsets are observed by polling the API every 200 ms from the cut.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use palisade_lab::MachineKind;
use palisade_model::nodefence::Phase;
use palisade_scenario::headline::{self, Options, Report, Timeline};
use palisade_scenario::*;

fn arg(name: &str, default: u64) -> Result<u64> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .with_context(|| format!("{name} needs a value"))?
            .parse()
            .with_context(|| format!("{name} must be a whole number")),
        None => Ok(default),
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

fn one(kind: MachineKind, palisade: bool, watch: Duration) -> Result<(Report, MachineFigures)> {
    let agents = AgentOptions {
        lease_seconds: 4,
        self_fence_seconds: 3.0,
        ..AgentOptions::default()
    };
    let lab = lab_of_kind(kind, 3, true, &agents).context("starting the lab")?;
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
            ..Options::default()
        },
    )?;
    let figures = machine_figures(&lab)?;
    Ok((report, figures))
}

fn secs(d: Option<Duration>) -> String {
    d.map(|d| format!("{:6.2}", d.as_secs_f64()))
        .unwrap_or_else(|| "     -".into())
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn kinds() -> Result<Vec<MachineKind>> {
    let args: Vec<String> = std::env::args().collect();
    let kind = args
        .iter()
        .position(|a| a == "--kind")
        .map(|i| args.get(i + 1).map(String::as_str).unwrap_or(""))
        .unwrap_or("both");
    Ok(match kind {
        "both" => vec![MachineKind::Namespace, MachineKind::Qemu],
        "netns" => vec![MachineKind::Namespace],
        "qemu" => vec![MachineKind::Qemu],
        other => bail!("--kind takes both, netns or qemu, not {other:?}"),
    })
}

fn kind_label(kind: MachineKind) -> &'static str {
    match kind {
        MachineKind::Namespace => "namespace machines",
        MachineKind::Qemu => "QEMU machines (TCG)",
    }
}

/// The medians of one machine kind's runs.
struct Medians {
    kind: MachineKind,
    decided: Option<f64>,
    fenced: Option<f64>,
    released: Option<f64>,
    attached: Option<f64>,
    running: Option<f64>,
    writing: Option<f64>,
    memory_mib: Option<f64>,
    off_reported: Option<f64>,
    off_gone: Option<f64>,
    boot: Option<f64>,
}

fn fmt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:6.2}"))
        .unwrap_or_else(|| "     -".into())
}

fn bench_kind(kind: MachineKind, runs: u64) -> Result<Medians> {
    println!(
        "\n{} — {runs} run(s) with Palisade, seconds after the cut:",
        kind_label(kind)
    );
    println!("  run  decided  fenced  released  attached  running  writing  verdict   boot  off(bmc)  off(gone)  memory");
    let mut reports = Vec::new();
    let mut figures = Vec::new();
    for i in 0..runs {
        let (r, f) = one(kind, true, Duration::ZERO)
            .with_context(|| format!("{} run {i}", kind_label(kind)))?;
        println!(
            "  {i:>3}  {}  {}  {}    {}   {}  {}  {}    {} {}    {}     {:5.0} MiB",
            secs(r.phase(Phase::Pending)),
            secs(r.phase(Phase::Fenced)),
            secs(r.phase(Phase::Released)),
            secs(r.attached),
            secs(r.running),
            secs(r.writing),
            if r.verdict_pass { "PASS" } else { "FAIL" },
            secs(Some(f.boot)),
            secs(Some(f.off_reported)),
            secs(Some(f.off_gone)),
            f.memory_mib,
        );
        if !r.verdict_pass {
            bail!(
                "{} run {i}: the at-most-one checker failed",
                kind_label(kind)
            );
        }
        reports.push(r);
        figures.push(f);
    }
    let col = |f: &dyn Fn(&Report) -> Option<Duration>| {
        median(
            reports
                .iter()
                .filter_map(|r| f(r).map(|d| d.as_secs_f64()))
                .collect(),
        )
    };
    let fig = |f: &dyn Fn(&MachineFigures) -> f64| median(figures.iter().map(f).collect());
    let m = Medians {
        kind,
        decided: col(&|r| r.phase(Phase::Pending)),
        fenced: col(&|r| r.phase(Phase::Fenced)),
        released: col(&|r| r.phase(Phase::Released)),
        attached: col(&|r| r.attached),
        running: col(&|r| r.running),
        writing: col(&|r| r.writing),
        memory_mib: fig(&|f| f.memory_mib),
        off_reported: fig(&|f| f.off_reported.as_secs_f64()),
        off_gone: fig(&|f| f.off_gone.as_secs_f64()),
        boot: fig(&|f| f.boot.as_secs_f64()),
    };
    println!(
        "  med  {}  {}  {}    {}   {}  {}          {} {}    {}     {:5.0} MiB",
        fmt(m.decided),
        fmt(m.fenced),
        fmt(m.released),
        fmt(m.attached),
        fmt(m.running),
        fmt(m.writing),
        fmt(m.boot),
        fmt(m.off_reported),
        fmt(m.off_gone),
        m.memory_mib.unwrap_or(0.0),
    );
    if let (Some(d), Some(f), Some(rl), Some(a), Some(rn)) =
        (m.decided, m.fenced, m.released, m.attached, m.running)
    {
        let share = |x: f64| 100.0 * x / rn;
        println!("  where the median recovery ({rn:.2} s to Running) goes:");
        println!(
            "    detect + decide (silence → NodeFence)        {d:5.2} s  {:4.1} %",
            share(d)
        );
        println!(
            "    fence (power off + storage block, verified)  {:5.2} s  {:4.1} %",
            f - d,
            share(f - d)
        );
        println!(
            "    release (taint, pod, attachment, volumesInUse) {:5.2} s  {:4.1} %",
            rl - f,
            share(rl - f)
        );
        println!(
            "    re-attach (attach-detach controller + attacher) {:5.2} s  {:4.1} %",
            a - rl,
            share(a - rl)
        );
        println!(
            "    start (scheduler, node agent, container)     {:5.2} s  {:4.1} %",
            rn - a,
            share(rn - a)
        );
    }
    Ok(m)
}

fn main() -> Result<()> {
    let runs = arg("--runs", 5)?.clamp(1, 50);
    let without = Duration::from_secs(arg("--without-seconds", 90)?.clamp(10, 900));
    let kinds = kinds()?;
    println!(
        "recovery benchmark: {runs} run(s) with Palisade per machine kind ({}), 1 without (watched {without:?})",
        kinds.iter().map(|k| kind_label(*k)).collect::<Vec<_>>().join(", ")
    );
    println!("columns: NodeFence phases, attachment, replacement Running and writing (seconds after the cut);");
    println!("then, on m2 after the scenario: power on → booted (new boot ID), power off → BMC reports off,");
    println!("power off → no process left, and the machine's memory (PSS) while it ran.");
    let mut medians = Vec::new();
    for kind in &kinds {
        medians.push(bench_kind(*kind, runs)?);
    }
    if let [a, b] = medians.as_slice() {
        println!(
            "\nside by side (medians; ratio = {} / {}):",
            kind_label(b.kind),
            kind_label(a.kind)
        );
        let row = |name: &str, x: Option<f64>, y: Option<f64>, unit: &str| {
            let ratio = match (x, y) {
                (Some(x), Some(y)) if x > 0.0 => format!("{:6.2}x", y / x),
                _ => "      -".into(),
            };
            println!("  {name:<34} {} {unit}  {} {unit}  {ratio}", fmt(x), fmt(y));
        };
        row("cut → decided", a.decided, b.decided, "s");
        row("cut → fenced (verified)", a.fenced, b.fenced, "s");
        row("cut → released", a.released, b.released, "s");
        row("cut → replacement Running", a.running, b.running, "s");
        row("cut → replacement writing", a.writing, b.writing, "s");
        row("power on → booted", a.boot, b.boot, "s");
        row(
            "power off → BMC reports off",
            a.off_reported,
            b.off_reported,
            "s",
        );
        row("power off → nothing left", a.off_gone, b.off_gone, "s");
        row("memory per machine", a.memory_mib, b.memory_mib, "MiB");
    }

    let kind = kinds[0];
    println!(
        "\nwithout Palisade ({}, same cut), watched for {without:?}:",
        kind_label(kind)
    );
    let (r, _) = one(kind, false, without)?;
    let stuck = r.stuck.unwrap_or_default();
    println!("  after {:.0} s: {stuck}", without.as_secs_f64());
    if let Some(rn) = medians.first().and_then(|m| m.running) {
        println!(
            "  with Palisade the replacement ran after {rn:.2} s; without it, none ran in {:.0} s (ratio > {:.0}x; Kubernetes alone never releases the pod)",
            without.as_secs_f64(),
            without.as_secs_f64() / rn
        );
    }
    Ok(())
}
