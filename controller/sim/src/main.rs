//! `palisade-sim`: runs the deterministic simulation.
//!
//! ```text
//! palisade-sim [--seed S] [--schedules N] [--bug NAME] [--joins] [--trace]
//!              [--record FILE --label TEXT]
//! palisade-sim --controls [--record FILE --label TEXT]
//! palisade-sim --report FILE
//! ```
//!
//! `--record` appends the campaign (or, with `--controls`, every planted control's verdict)
//! to a history file as JSON lines; `--report` renders such a file as Markdown
//! ([`palisade_sim::report`]).
//!
//! `--joins` draws schedules whose cluster grows while part of it is cut off
//! in every schedule ([`Schedule::generate_with_joins`]; the default campaign does in a quarter).
//!
//! Prints a report (schedules, fault events, fences and those on power evidence, releases,
//! held pods, violations, runtime, seed). A violation exits 1 after printing the shrunk schedule, its history and the command
//! that replays it.

use std::time::Instant;

use std::io::Write as _;

use palisade_sim::{campaign_of, report, run, shrink, Bug, Schedule};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// Appends `lines` to the history file `path`.
fn record(path: &str, lines: &[serde_json::Value]) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| die(&format!("--record {path}: {e}")));
    for l in lines {
        writeln!(f, "{l}").unwrap_or_else(|e| die(&format!("--record {path}: {e}")));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(path) = arg(&args, "--report") {
        let history = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| die(&format!("--report {path}: {e}")));
        match report::render(&history) {
            Ok(page) => print!("{page}"),
            Err(e) => die(&format!("--report {path}: {e}")),
        }
        return;
    }
    let label = arg(&args, "--label").unwrap_or_else(|| "unlabelled".into());
    let record_to = arg(&args, "--record");
    if args.iter().any(|a| a == "--controls") {
        let lines = report::controls(&label);
        let mut missed = 0;
        for l in &lines {
            println!(
                "{}: caught at {} after {} schedule(s) ({})",
                l["bug"], l["caught_at"], l["schedules"], l["invariant"]
            );
            missed += usize::from(l["caught_at"].is_null());
        }
        if let Some(path) = &record_to {
            record(path, &lines);
        }
        if missed > 0 {
            die(&format!("{missed} planted control(s) not caught"));
        }
        return;
    }
    let seed = arg(&args, "--seed")
        .map(|s| {
            s.parse::<u64>()
                .unwrap_or_else(|_| die("--seed takes a number"))
        })
        .unwrap_or(1);
    let count = arg(&args, "--schedules")
        .map(|s| {
            s.parse::<u64>()
                .unwrap_or_else(|_| die("--schedules takes a number"))
        })
        .unwrap_or(10_000);
    let bug = arg(&args, "--bug").map(|b| {
        Bug::parse(&b).unwrap_or_else(|| die(&format!("unknown bug {b}; one of {:?}", Bug::ALL)))
    });
    let generate: fn(u64) -> Schedule = if args.iter().any(|a| a == "--joins") {
        Schedule::generate_with_joins
    } else {
        Schedule::generate
    };
    let joins = if args.iter().any(|a| a == "--joins") {
        " --joins"
    } else {
        ""
    };
    if args.iter().any(|a| a == "--trace") {
        let s = generate(seed);
        println!(
            "nodes: {:?}\ntrust: {} powerOn: {} powerOffAfterSeconds: {}",
            s.nodes, s.trust_self_fence, s.power_on, s.power_off_after
        );
        for line in run(&s, bug).history {
            println!("  {line}");
        }
    }
    let start = Instant::now();
    let c = campaign_of(generate, seed, count, bug);
    println!("palisade-sim report");
    println!("  seed:        {seed}");
    println!(
        "  planted bug: {}",
        bug.map_or("none".to_string(), |b| format!("{b:?}"))
    );
    println!("  schedules:   {}", c.schedules);
    println!("  fault events: {}", c.faults);
    println!("  fences:      {}", c.fences);
    println!(
        "  on power:    {} (fences on power evidence)",
        c.power_fences
    );
    println!("  released:    {}", c.released);
    println!("  held:        {}", c.held);
    println!("  excused:     {}", c.excused);
    println!("  resets:      {}", c.resets);
    println!(
        "  requests:    {} (fences beside the leader's decision), {} superseded",
        c.requests, c.superseded
    );
    println!(
        "  stock:       {} companion cuts (its kubelet renewing)",
        c.companion_cuts
    );
    println!(
        "  deletions:   {} (a person's kubectl delete nodefence), {} held by the finalizer, {} pending fences created again",
        c.deletions, c.deletions_held, c.refenced
    );
    println!(
        "  edits:       {} (a person's edit of a FenceTarget's BMC address), {} to another machine's BMC; {} levels verified through an edited address, {} steps through one refused by identity, {} steps through the BMC listed now, standing in for a planned address no longer listed",
        c.edits, c.edits_elsewhere, c.edited_verified, c.edited_refused, c.stood_in
    );
    println!(
        "  stale cmds:  {} (device commands a deposed leader delivered after a freeze)",
        c.stale_commands
    );
    println!(
        "  late writes: {} (Lease writes that landed after their agent gave up)",
        c.late_writes
    );
    println!(
        "  takeovers:   {} warm; {} leader terms lapsed in API outages",
        c.warm_takeovers, c.lapsed_terms
    );
    println!("  violations:  {}", u8::from(c.failure.is_some()));
    let runtime = start.elapsed().as_secs_f64();
    println!("  runtime:     {runtime:.1}s");
    if let Some(path) = &record_to {
        let joined = args.iter().any(|a| a == "--joins");
        record(
            path,
            &[report::campaign_line(
                &label, seed, joined, bug, &c, runtime,
            )],
        );
    }
    if let Some((s, v)) = c.failure {
        let small = shrink(&generate(s), bug);
        let out = run(&small, bug);
        println!("VIOLATION at seed {s} ({:?}): {}", v.invariant, v.what);
        println!(
            "shrunk schedule ({} fault events): {:#?}",
            small.events.len(),
            small.events
        );
        println!("nodes: {:#?}", small.nodes);
        if let Some(v) = out.violation {
            println!("history of the shrunk run:");
            for line in v.history {
                println!("  {line}");
            }
        }
        println!(
            "replay: palisade-sim --seed {s} --schedules 1{joins}{}",
            bug.map_or(String::new(), |b| format!(" --bug {b:?}"))
        );
        std::process::exit(1);
    }
}

fn die(msg: &str) -> ! {
    eprintln!("palisade-sim: {msg}");
    std::process::exit(2)
}
