//! `palisade-nemesis`: runs one fault campaign on a fresh lab and prints its report. Exit 0 on
//! PASS, 1 on a safety violation, 3 when no safety rule broke but a writer was not writing
//! again after the last heal, 2 when the campaign could not run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use palisade_lab::MachineKind;
use palisade_nemesis::{run, Config};

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

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(path) = &args.judge {
        return judge(path);
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
    let cfg = Config {
        seed,
        events: args.events,
        minutes: args.minutes,
        machines: args.machines,
        writers: args.writers,
        out: args
            .out
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
