//! `palisade-nemesis`: runs one fault campaign on a fresh lab and prints its report. Exit 0 on
//! PASS, 1 on a safety violation, 3 when no safety rule broke but a writer was not writing
//! again after the last heal, 2 when the campaign could not run.
//!
//! `--record FILE` appends the finished campaign to a history of campaigns (JSON lines,
//! `docs/data/campaigns.jsonl`) and regenerates the page `--page` from it; `--report FILE`
//! prints that page and starts no lab ([`palisade_nemesis::report`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use palisade_lab::MachineKind;
use palisade_nemesis::{report, run, Config, Outcome};

/// A seeded random fault campaign on the lab, judged by the at-most-one checker.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The schedule's seed (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Fault events to run.
    #[arg(long, default_value_t = 20)]
    events: usize,
    /// Start no new event after this many minutes.
    #[arg(long, default_value_t = 60)]
    minutes: u64,
    /// Machines in the lab (4 to 8).
    #[arg(long, default_value_t = 5)]
    machines: usize,
    /// StatefulSet writers (1 to machines - 2).
    #[arg(long, default_value_t = 2)]
    writers: usize,
    /// Seconds to wait for the lab to settle between events.
    #[arg(long, default_value_t = 240)]
    settle_seconds: u64,
    /// Plant a bug in the controllers and the bridge (a negative control; debug builds only):
    /// `TrustCommand`, `ReleaseUnverified`, `ReleaseUncovered`, `IgnoreStaleTokens` or
    /// `TrustWithoutWatchdog` (with --no-fence-devices). Repeatable. The campaign must then
    /// fail.
    #[arg(long = "plant")]
    planted: Vec<String>,
    /// Draw only this fault class (repeatable; default: every class). `--only list` prints
    /// the classes.
    #[arg(long = "only")]
    only: Vec<String>,
    /// Create no FenceTarget and let the policy trust a watchdog-backed self-fence. The
    /// namespace machines advertise no watchdog, so nothing may be released.
    #[arg(long)]
    no_fence_devices: bool,
    /// Judge a saved history (`history.jsonl`) with this build's checks and exit: 0 when it
    /// passes, 1 with the violations. No lab is started. For re-judging old campaigns after
    /// a check changed. Violations recorded in the file by the campaign are not counted.
    #[arg(long, value_name = "HISTORY")]
    judge: Option<PathBuf>,
    /// Print the schedule the seed draws (one JSON event per line) and exit; no lab is
    /// started.
    #[arg(long)]
    print_schedule: bool,
    /// QEMU virtual machines instead of namespace machines: the agents and pods run in the
    /// guests (TCG), the watchdog is a real i6300esb, and the `machine-clock-step` class steps
    /// a guest's own clock.
    #[arg(long)]
    qemu: bool,
    /// With --qemu: the agents leave their guest's watchdog unarmed (for the negative control
    /// `--no-fence-devices --plant TrustWithoutWatchdog`: a hung agent is then not reset).
    #[arg(long, requires = "qemu")]
    no_watchdog: bool,
    /// Output directory (history.jsonl, report.txt, logs/ on failure); default
    /// target/chaos/lab-seed<SEED>.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Append the finished campaign (violations included) to this history of campaigns
    /// (`docs/data/campaigns.jsonl`) and regenerate `--page` from it.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["judge", "print_schedule", "report"])]
    record: Option<PathBuf>,
    /// With --record: the commit the campaign was built from (`git rev-parse --short HEAD`).
    #[arg(long, requires = "record")]
    commit: Option<String>,
    /// With --record: what else the machine was doing (a build, another campaign, its load).
    #[arg(long, requires = "record")]
    conditions: Option<String>,
    /// With --record: the page regenerated from the history.
    #[arg(long, requires = "record", default_value = "docs/campaign-report.md")]
    page: PathBuf,
    /// Print a history of campaigns (`docs/data/campaigns.jsonl`) as the Markdown page and
    /// exit; no lab is started.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["judge", "print_schedule"])]
    report: Option<PathBuf>,
}

/// Turns SIGINT and SIGTERM into a stop request (before any other thread exists, so every
/// thread inherits the blocked mask and only the waiting thread receives them).
fn stop_on_signals() -> anyhow::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    std::thread::spawn(move || {
        if let Ok(sig) = set.wait() {
            eprintln!("palisade-nemesis: {sig:?}: healing the current fault, then judging and tearing down");
            palisade_nemesis::campaign::request_stop();
        }
    });
    Ok(())
}

/// `--judge`: the checks over a saved history.
fn judge(path: &std::path::Path) -> ExitCode {
    let records = match palisade_nemesis::history::read(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("palisade-nemesis: --judge: {e}");
            return ExitCode::from(2);
        }
    };
    let violations = palisade_nemesis::check::check_all(&records);
    for v in &violations {
        println!("[{}] {}", v.check, v.detail);
    }
    println!(
        "{}: {} records, {} violation(s)",
        path.display(),
        records.len(),
        violations.len()
    );
    if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Reads a history of campaigns and renders its page.
fn page(history: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(history)
        .with_context(|| format!("reading {}", history.display()))?;
    report::render(&text).map_err(|e| anyhow::anyhow!("{}: {e}", history.display()))
}

/// `--record`: appends the campaign to the history and regenerates the page from it.
fn record(args: &Args, outcome: &Outcome, history: &Path) -> anyhow::Result<()> {
    let mut line = outcome.record.clone();
    line.commit = args.commit.clone();
    line.conditions = args.conditions.clone();
    report::append(history, &line).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::write(&args.page, page(history)?)
        .with_context(|| format!("writing {}", args.page.display()))?;
    println!(
        "palisade-nemesis: recorded in {}; {} regenerated",
        history.display(),
        args.page.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(path) = &args.judge {
        return judge(path);
    }
    if let Some(path) = &args.report {
        return match page(path) {
            Ok(page) => {
                print!("{page}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("palisade-nemesis: --report: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    if let Err(e) = stop_on_signals() {
        eprintln!("palisade-nemesis: cannot handle signals: {e}");
        return ExitCode::from(2);
    }
    if !(4..=8).contains(&args.machines) {
        eprintln!(
            "palisade-nemesis: --machines must be 4 to 8 (got {})",
            args.machines
        );
        return ExitCode::from(2);
    }
    if args.writers == 0 || args.writers + 2 > args.machines {
        eprintln!(
            "palisade-nemesis: --writers must be 1 to machines - 2 (got {} with {} machines)",
            args.writers, args.machines
        );
        return ExitCode::from(2);
    }
    if args.only.iter().any(|c| c == "list") {
        for c in palisade_nemesis::schedule::classes() {
            println!("{c}");
        }
        return ExitCode::SUCCESS;
    }
    if let Some(bad) = args
        .only
        .iter()
        .find(|c| !palisade_nemesis::schedule::classes().any(|k| k == c.as_str()))
    {
        eprintln!("palisade-nemesis: --only {bad}: no such fault class (--only list prints them)");
        return ExitCode::from(2);
    }
    let kind = if args.qemu {
        MachineKind::Qemu
    } else {
        MachineKind::Namespace
    };
    if let Some(bad) = args
        .only
        .iter()
        .find(|c| !palisade_nemesis::schedule::class_fits(c, kind))
    {
        eprintln!("palisade-nemesis: --only {bad}: needs QEMU machines (--qemu)");
        return ExitCode::from(2);
    }
    if args.no_fence_devices && args.only.iter().any(|c| c == "vm-pause") {
        eprintln!(
            "palisade-nemesis: --only vm-pause needs fence devices: without them the campaign's \
             policy trusts self-fences on VMs it asserts are never paused (trustSelfFence.virtualMachines: Accept)"
        );
        return ExitCode::from(2);
    }
    if args.events == 0 || args.minutes == 0 {
        eprintln!("palisade-nemesis: --events and --minutes must be positive");
        return ExitCode::from(2);
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() % 1_000_000_007)
            .unwrap_or(1)
    });
    if args.print_schedule {
        for ev in palisade_nemesis::schedule::generate_only(
            seed,
            args.events,
            args.machines,
            args.writers,
            &args.only,
            kind,
        ) {
            match serde_json::to_string(&ev) {
                Ok(line) => println!("{line}"),
                Err(e) => {
                    eprintln!("palisade-nemesis: event {}: {e}", ev.index);
                    return ExitCode::from(2);
                }
            }
        }
        return ExitCode::SUCCESS;
    }
    // A history the campaign could not be appended to is found now, not after an hour.
    if let Some(history) = &args.record {
        if history.exists() {
            if let Err(e) = page(history) {
                eprintln!("palisade-nemesis: --record: {e:#}");
                return ExitCode::from(2);
            }
        }
    }
    let cfg = Config {
        seed,
        events: args.events,
        minutes: args.minutes,
        machines: args.machines,
        writers: args.writers,
        out: args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("target/chaos/lab-seed{seed}"))),
        settle_timeout: Duration::from_secs(args.settle_seconds),
        planted: args.planted.clone(),
        only: args.only.clone(),
        no_fence_devices: args.no_fence_devices,
        machine_kind: kind,
        agents_without_watchdog: args.no_watchdog,
    };
    println!(
        "palisade-nemesis: seed {seed}; replay with: {}",
        cfg.replay()
    );
    match run(&cfg) {
        Ok(outcome) => {
            println!("\n{}", outcome.report);
            if let Some(history) = &args.record {
                if let Err(e) = record(&args, &outcome, history) {
                    eprintln!("palisade-nemesis: --record: {e:#}");
                    return ExitCode::from(2);
                }
            }
            if !outcome.safe() {
                eprintln!(
                    "palisade-nemesis: VIOLATION with seed {seed}; replay: {}",
                    cfg.replay()
                );
                ExitCode::from(1)
            } else if !outcome.live {
                eprintln!(
                    "palisade-nemesis: a writer did not recover after the last heal (seed {seed}); replay: {}",
                    cfg.replay()
                );
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!(
                "palisade-nemesis: the campaign could not run (seed {seed}): {e:#}\nreplay: {}",
                cfg.replay()
            );
            ExitCode::from(2)
        }
    }
}
