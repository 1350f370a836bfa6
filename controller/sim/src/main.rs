//! `palisade-sim`: runs the deterministic simulation.
//!
//! ```text
//! palisade-sim [--seed S] [--schedules N] [--bug NAME] [--joins] [--trace]
//! ```
//!
//! `--joins` draws schedules whose cluster grows while part of it is cut off
//! in every schedule ([`Schedule::generate_with_joins`]; the default campaign does in a quarter).
//!
//! Prints a report (schedules, fault events, fences and those on power evidence, releases,
//! held pods, violations, runtime, seed). A violation exits 1 after printing the shrunk schedule, its history and the command
//! that replays it.

use std::time::Instant;

use palisade_sim::{campaign_of, run, shrink, Bug, Schedule};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
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
        "  stale cmds:  {} (device commands a deposed leader delivered after a freeze)",
        c.stale_commands
    );
    println!(
        "  late writes: {} (Lease writes that landed after their agent gave up)",
        c.late_writes
    );
    println!("  violations:  {}", u8::from(c.failure.is_some()));
    println!("  runtime:     {:.1}s", start.elapsed().as_secs_f64());
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
