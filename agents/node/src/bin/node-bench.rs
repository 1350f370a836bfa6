//! `node-bench`: measures `palisade-node` on a lab machine (real API server, real processes).
//!
//! - **Bind → process start latency.** Pods are created one at a time with `spec.nodeName`
//!   set (creating a bound pod is the binding). Each container's first action is to write
//!   `date +%s.%N`; the latency is that time minus the moment the API server answered the
//!   create (the pod was bound by then). Reported as p50/p90/max.
//! - **Resident memory** (`VmRSS`, and `VmHWM` as the peak) of the agent process once every
//!   pod is Running, after the agent has settled.
//!
//! Bounded in count and time: at most 200 pods, each start awaited for at most 60 s.
//! Needs the feature `bench` (it links the lab): `cargo build -p palisade-node --features
//! bench --bin node-bench`, and the `palisade-node` binary built beside it.
//!
//! Usage: `node-bench [PODS]` (default 100).

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::Api;
use serde_json::json;

const NS: &str = "bench";

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// The agent's process on the machine (not the container shims, which share the binary).
fn agent_pid(lab: &palisade_lab::Lab) -> Option<i32> {
    lab.machines()[0].processes().into_iter().find(|p| {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        args.first().is_some_and(|a| a.ends_with(b"palisade-node"))
            && args.get(1).is_some_and(|a| !a.starts_with(b"__shim"))
    })
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn memory_kib(pid: i32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn read_ts(p: &Path) -> Option<f64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn main() -> anyhow::Result<()> {
    let pods: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()
        .context("PODS must be a number")?
        .unwrap_or(100);
    if !(1..=200).contains(&pods) {
        bail!("PODS must be 1..=200");
    }
    eprintln!("starting a lab with 1 machine running palisade-node ...");
    let lab = palisade_scenario::lab_with_agents(1, false, &Default::default())?;
    let rt = palisade_scenario::runtime()?;
    let c = palisade_scenario::admin_client(&lab, &rt)?;
    palisade_scenario::wait_nodes_ready(&lab, &c, &rt)?;
    palisade_scenario::namespace(&c, &rt, NS)?;
    let node = lab.machines()[0].name().to_string();
    let dir = lab.dir().join("scratch").join("node-bench");
    std::fs::create_dir_all(&dir)?;
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    let idle = agent_pid(&lab).and_then(memory_kib);

    let mut latencies = Vec::with_capacity(pods);
    let started = Instant::now();
    for i in 0..pods {
        let ts = dir.join(format!("start-{i}"));
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("p{i}")},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "main", "image": "host",
                    "command": ["/bin/sh", "-c", format!("date +%s.%N > {p}.tmp && mv {p}.tmp {p}; exec sleep 100000", p = ts.display())],
                }],
            }
        }))?;
        rt.block_on(api.create(&PostParams::default(), &pod))
            .with_context(|| format!("create pod p{i}"))?;
        let bound = now_s();
        let deadline = Instant::now() + Duration::from_secs(60);
        let start = loop {
            if let Some(t) = read_ts(&ts) {
                break t;
            }
            if Instant::now() > deadline {
                bail!("pod p{i} did not start within 60 s");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        latencies.push((start - bound) * 1000.0);
    }
    let fill = started.elapsed();

    // Every pod Running in the API, then let the agent settle before reading its memory.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let l = rt.block_on(api.list(&ListParams::default()))?;
        let running = l
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == pods {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {running} of {pods} pods Running after 120 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(5));
    let pid = agent_pid(&lab).context("agent process not found")?;
    let (rss, hwm) = memory_kib(pid).context("agent memory")?;

    latencies.sort_by(f64::total_cmp);
    println!("palisade-node benchmark ({pods} pods on one lab machine)");
    println!("| metric | value | target |");
    println!("| --- | --- | --- |");
    if let Some((idle_rss, _)) = idle {
        println!(
            "| agent RSS, no pods | {:.1} MiB | |",
            idle_rss as f64 / 1024.0
        );
    }
    println!(
        "| agent RSS, {pods} pods Running | {:.1} MiB | <= 30 MB |",
        rss as f64 / 1024.0
    );
    println!(
        "| agent peak RSS (VmHWM) | {:.1} MiB | |",
        hwm as f64 / 1024.0
    );
    println!(
        "| bind -> process start, p50 | {:.1} ms | <= 100 ms |",
        percentile(&latencies, 0.5)
    );
    println!(
        "| bind -> process start, p90 | {:.1} ms | |",
        percentile(&latencies, 0.9)
    );
    println!(
        "| bind -> process start, max | {:.1} ms | |",
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "| time to start {pods} pods one by one | {:.1} s | |",
        fill.as_secs_f64()
    );
    Ok(())
}
