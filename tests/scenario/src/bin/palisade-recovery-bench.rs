//! `palisade-recovery-bench`: how long a StatefulSet with a ReadWriteOnce volume takes to
//! recover when its machine drops off the network, with Palisade (median and worst of `--runs`,
//! default 5, each on a fresh lab), per series: a machine kind (`--kind both|netns|qemu`,
//! default both: namespace machines and QEMU machines) on a Kubernetes release (`--kube
//! both|1.20|1.34`, default both), and, in the same run, without it (one run, on the first
//! series, watched for `--without-seconds`, default 90). Series that differ in one respect are
//! then printed side by side: each kind on 1.20 and 1.34, or, with one release, the two kinds.
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
use palisade_lab::{KubeVersion, MachineKind};
use palisade_model::nodefence::Phase;
use palisade_scenario::headline::{self, Options, Report, Timeline};
use palisade_scenario::*;

/// The value after `name` on the command line, if `name` is there.
fn flag(name: &str) -> Result<Option<String>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(Some(
            args.get(i + 1)
                .with_context(|| format!("{name} needs a value"))?
                .clone(),
        )),
        None => Ok(None),
    }
}

fn arg(name: &str, default: u64) -> Result<u64> {
    match flag(name)? {
        Some(v) => v
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

fn one(series: Series, palisade: bool, watch: Duration) -> Result<(Report, MachineFigures)> {
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

/// The median and the worst (largest) of one figure over a series' runs. With at most 50 runs
/// the worst is what a nearest-rank p99 would be.
#[derive(Debug, Clone, Copy, Default)]
struct Stat {
    median: Option<f64>,
    worst: Option<f64>,
}

fn stat(mut v: Vec<f64>) -> Stat {
    if v.is_empty() {
        return Stat::default();
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Stat {
        median: Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }),
        worst: v.last().copied(),
    }
}

fn kinds() -> Result<Vec<MachineKind>> {
    let kind = flag("--kind")?;
    Ok(match kind.as_deref().unwrap_or("both") {
        "both" => vec![MachineKind::Namespace, MachineKind::Qemu],
        "netns" => vec![MachineKind::Namespace],
        "qemu" => vec![MachineKind::Qemu],
        other => bail!("--kind takes both, netns or qemu, not {other:?}"),
    })
}

fn kubes() -> Result<Vec<KubeVersion>> {
    let kube = flag("--kube")?;
    match kube.as_deref().unwrap_or("both") {
        "both" => Ok(KubeVersion::ALL.to_vec()),
        other => KubeVersion::parse(other).map(|v| vec![v]).with_context(|| {
            let valid: Vec<&str> = KubeVersion::ALL.iter().map(|v| v.minor()).collect();
            format!("--kube takes both, {}, not {other:?}", valid.join(" or "))
        }),
    }
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

/// The medians and worst runs of one series.
struct Summary {
    series: Series,
    decided: Stat,
    fenced: Stat,
    released: Stat,
    attached: Stat,
    running: Stat,
    writing: Stat,
    memory_mib: Stat,
    off_reported: Stat,
    off_gone: Stat,
    boot: Stat,
}

impl Summary {
    /// The figures compared side by side: name, figure, unit.
    fn rows(&self) -> [(&'static str, Stat, &'static str); 9] {
        [
            ("cut → decided", self.decided, "s"),
            ("cut → fenced (verified)", self.fenced, "s"),
            ("cut → released", self.released, "s"),
            ("cut → replacement Running", self.running, "s"),
            ("cut → replacement writing", self.writing, "s"),
            ("power on → booted", self.boot, "s"),
            ("power off → BMC reports off", self.off_reported, "s"),
            ("power off → nothing left", self.off_gone, "s"),
            ("memory per machine", self.memory_mib, "MiB"),
        ]
    }
}

fn fmt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:6.2}"))
        .unwrap_or_else(|| "     -".into())
}

fn bench_series(series: Series, runs: u64) -> Result<Summary> {
    let label = series.label();
    println!("\n{label} — {runs} run(s) with Palisade, seconds after the cut:");
    println!("  run  decided  fenced  released  attached  running  writing  verdict   boot  off(bmc)  off(gone)  memory");
    let mut reports = Vec::new();
    let mut figures = Vec::new();
    for i in 0..runs {
        let (r, f) =
            one(series, true, Duration::ZERO).with_context(|| format!("{label} run {i}"))?;
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
            bail!("{label} run {i}: the at-most-one checker failed");
        }
        reports.push(r);
        figures.push(f);
    }
    let col = |f: &dyn Fn(&Report) -> Option<Duration>| {
        stat(
            reports
                .iter()
                .filter_map(|r| f(r).map(|d| d.as_secs_f64()))
                .collect(),
        )
    };
    let fig = |f: &dyn Fn(&MachineFigures) -> f64| stat(figures.iter().map(f).collect());
    let m = Summary {
        series,
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
    for (tag, worst) in [("med", false), ("max", true)] {
        let pick = |s: Stat| if worst { s.worst } else { s.median };
        println!(
            "  {tag}  {}  {}  {}    {}   {}  {}          {} {}    {}     {:5.0} MiB",
            fmt(pick(m.decided)),
            fmt(pick(m.fenced)),
            fmt(pick(m.released)),
            fmt(pick(m.attached)),
            fmt(pick(m.running)),
            fmt(pick(m.writing)),
            fmt(pick(m.boot)),
            fmt(pick(m.off_reported)),
            fmt(pick(m.off_gone)),
            pick(m.memory_mib).unwrap_or(0.0),
        );
    }
    if let (Some(d), Some(f), Some(rl), Some(a), Some(rn)) = (
        m.decided.median,
        m.fenced.median,
        m.released.median,
        m.attached.median,
        m.running.median,
    ) {
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

/// Two series that differ in one respect (kind or release), side by side: medians and worst
/// runs, ratio = `b` / `a`.
fn side_by_side(a: &Summary, b: &Summary) {
    let ((a_name, same), (b_name, _)) = (a.series.differs(b.series), b.series.differs(a.series));
    println!(
        "\nside by side, {same} (median, then worst run; ratio = {b_name} / {a_name} of each):"
    );
    println!(
        "  {:<34} {a_name:>6} {:>6}      {b_name:>6} {:>6}      {:>7}  {:>7}",
        "", "worst", "worst", "ratio", "worst"
    );
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if x > 0.0 => format!("{:6.2}x", y / x),
        _ => "      -".into(),
    };
    for ((name, x, unit), (_, y, _)) in a.rows().into_iter().zip(b.rows()) {
        println!(
            "  {name:<34} {} {} {unit:<3}  {} {} {unit:<3}  {}  {}",
            fmt(x.median),
            fmt(x.worst),
            fmt(y.median),
            fmt(y.worst),
            ratio(x.median, y.median),
            ratio(x.worst, y.worst),
        );
    }
}

fn main() -> Result<()> {
    let runs = arg("--runs", 5)?.clamp(1, 50);
    let without = Duration::from_secs(arg("--without-seconds", 90)?.clamp(10, 900));
    let kinds = kinds()?;
    let kubes = kubes()?;
    // Kind by kind, each on every release: consecutive pairs differ in one respect.
    let series: Vec<Series> = kinds
        .iter()
        .flat_map(|&kind| kubes.iter().map(move |&kube| Series { kind, kube }))
        .collect();
    println!(
        "recovery benchmark: {runs} run(s) with Palisade per series ({}), 1 without (watched {without:?})",
        series.iter().map(|s| s.label()).collect::<Vec<_>>().join("; ")
    );
    println!("columns: NodeFence phases, attachment, replacement Running and writing (seconds after the cut);");
    println!("then, on m2 after the scenario: power on → booted (new boot ID), power off → BMC reports off,");
    println!("power off → no process left, and the machine's memory (PSS) while it ran.");
    println!("med is the median of the runs; max the worst run, which stands in for the p99 (at most 50 runs).");
    let mut summaries = Vec::new();
    for s in &series {
        summaries.push(bench_series(*s, runs)?);
    }
    // Two releases: each kind on 1.20 beside 1.34; one release and two kinds: the kinds.
    for pair in summaries.chunks_exact(2) {
        side_by_side(&pair[0], &pair[1]);
    }

    let first = series[0];
    println!(
        "\nwithout Palisade ({}, same cut), watched for {without:?}:",
        first.label()
    );
    let (r, _) = one(first, false, without)?;
    let stuck = r.stuck.unwrap_or_default();
    println!("  after {:.0} s: {stuck}", without.as_secs_f64());
    if let Some(rn) = summaries[0].running.median {
        println!(
            "  with Palisade the replacement ran after {rn:.2} s; without it, none ran in {:.0} s (ratio > {:.0}x; Kubernetes alone never releases the pod)",
            without.as_secs_f64(),
            without.as_secs_f64() / rn
        );
    }
    Ok(())
}
