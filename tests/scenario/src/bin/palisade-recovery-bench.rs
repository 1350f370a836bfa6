//! `palisade-recovery-bench`: how long a StatefulSet with a ReadWriteOnce volume takes to
//! recover when its machine drops off the network, with Palisade (median of `--runs`, default 5,
//! each on a fresh lab) and, side by side in the same run, without it (one run, watched for
//! `--without-seconds`, default 90).
//!
//! Conditions: node Lease 4 s renewed every second (node agents self-fence after 3 s), Palisade's
//! policy Suspect 2 s / Unhealthy 4 s, controller resync 250 ms, kube-controller-manager on its
//! default settings. Offsets are observed by polling the API every 200 ms from the cut.

use std::time::Duration;

use anyhow::{bail, Context, Result};
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

fn one(palisade: bool, watch: Duration) -> Result<Report> {
    let agents = AgentOptions {
        lease_seconds: 4,
        self_fence_seconds: 3.0,
        ..AgentOptions::default()
    };
    let lab = lab_with_agents(3, true, &agents).context("starting the lab")?;
    let c = Cluster::connect(&lab)?;
    c.wait_nodes_ready(&lab)?;
    let t = Timeline::new(palisade);
    headline::run(
        &lab,
        &c,
        &t,
        Options {
            palisade,
            watch_without: watch,
            ..Options::default()
        },
    )
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

fn main() -> Result<()> {
    let runs = arg("--runs", 5)?.clamp(1, 50);
    let without = Duration::from_secs(arg("--without-seconds", 90)?.clamp(10, 900));
    println!("recovery benchmark: {runs} run(s) with Palisade, 1 without (watched {without:?})");
    println!("seconds after the cut:");
    println!("  run  decided  fenced  released  attached  running  writing  verdict");
    let mut reports = Vec::new();
    for i in 0..runs {
        let r = one(true, Duration::ZERO).with_context(|| format!("run {i}"))?;
        println!(
            "  {i:>3}  {}  {}  {}    {}   {}  {}  {}",
            secs(r.phase(Phase::Pending)),
            secs(r.phase(Phase::Fenced)),
            secs(r.phase(Phase::Released)),
            secs(r.attached),
            secs(r.running),
            secs(r.writing),
            if r.verdict_pass { "PASS" } else { "FAIL" }
        );
        if !r.verdict_pass {
            bail!("run {i}: the at-most-one checker failed");
        }
        reports.push(r);
    }
    let col = |f: &dyn Fn(&Report) -> Option<Duration>| {
        median(
            reports
                .iter()
                .filter_map(|r| f(r).map(|d| d.as_secs_f64()))
                .collect(),
        )
    };
    let decided = col(&|r| r.phase(Phase::Pending));
    let fenced = col(&|r| r.phase(Phase::Fenced));
    let released = col(&|r| r.phase(Phase::Released));
    let attached = col(&|r| r.attached);
    let running = col(&|r| r.running);
    let writing = col(&|r| r.writing);
    let fmt = |v: Option<f64>| v.map(|v| format!("{v:6.2}")).unwrap_or_default();
    println!(
        "  med  {}  {}  {}    {}   {}  {}",
        fmt(decided),
        fmt(fenced),
        fmt(released),
        fmt(attached),
        fmt(running),
        fmt(writing)
    );
    if let (Some(d), Some(f), Some(rl), Some(a), Some(rn)) =
        (decided, fenced, released, attached, running)
    {
        let share = |x: f64| 100.0 * x / rn;
        println!("\nwhere the median recovery ({rn:.2} s to Running) goes:");
        println!(
            "  detect + decide (silence → NodeFence)   {d:5.2} s  {:4.1} %",
            share(d)
        );
        println!(
            "  fence (power off + storage block, verified) {:5.2} s  {:4.1} %",
            f - d,
            share(f - d)
        );
        println!(
            "  release (taint, pod, attachment, volumesInUse) {:5.2} s  {:4.1} %",
            rl - f,
            share(rl - f)
        );
        println!(
            "  re-attach (attach-detach controller + attacher) {:5.2} s  {:4.1} %",
            a - rl,
            share(a - rl)
        );
        println!(
            "  start (scheduler, node agent, container)  {:5.2} s  {:4.1} %",
            rn - a,
            share(rn - a)
        );
    }

    println!("\nwithout Palisade (same lab, same cut), watched for {without:?}:");
    let r = one(false, without)?;
    let stuck = r.stuck.unwrap_or_default();
    println!("  after {:.0} s: {stuck}", without.as_secs_f64());
    if let Some(rn) = running {
        println!(
            "  with Palisade the replacement ran after {rn:.2} s; without it, none ran in {:.0} s (ratio > {:.0}x; Kubernetes alone never releases the pod)",
            without.as_secs_f64(),
            without.as_secs_f64() / rn
        );
    }
    Ok(())
}
