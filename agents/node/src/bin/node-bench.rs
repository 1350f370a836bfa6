//! `node-bench`: measures `palisade-node` on a lab machine (real API server, real processes).
//!
//! - **Bind → process start latency.** Pods are created one at a time with `spec.nodeName`
//!   set (creating a bound pod is the binding). Each container's first action is to write
//!   `date +%s.%N`; the latency is that time minus the moment the API server answered the
//!   create (the pod was bound by then). Reported as p50/p90/max.
//! - **Resident memory** (`VmRSS`, and `VmHWM` as the peak) of the agent process once every
//!   pod is Running, after the agent has settled.
//!
//! - **KILL time against the kubelet's deadline** (KILL once the grace period, less the
//!   preStop hook's time and at least 2 s, has passed since TERM). After the above (and once those pods are
//!   gone), `KILL_PODS` pods whose container ignores TERM are created with several grace
//!   periods and preStop hooks, deleted through the API, and for each one the moment its
//!   process died is compared with the deadline the kubelet's grace arithmetic (`palisade_node::grace`) gives. The
//!   measurement does not trust the agent: the container itself writes when TERM reached it
//!   (a `trap` that logs and carries on), the preStop hook writes when it started and ended,
//!   the bench writes when it sent the DELETE, and the death is observed from the host by
//!   polling the container's `/proc/<pid>/stat` (gone or a zombie) every
//!   [`DEATH_POLL`]. The window is computed here from the seed (not from `grace.rs`):
//!   grace minus the whole seconds the hook ran (cut at the grace period), never below 2 s.
//!   Two errors are reported: against TERM receipt + window (the agent's timer and KILL
//!   path), and against DELETE + hook time + window (end to end, including the watch
//!   delay). The agent's own view (`late_ms` of each deadline KILL in its log, and the
//!   `palisade_node_kill_lateness_max_seconds` metric) is printed beside them.
//!
//! Bounded in count and time: at most 200 pods, each start awaited for at most 60 s; at most
//! 60 KILL pods, each awaited for at most 60 s to start and 60 s to die.
//! Needs the feature `bench` (it links the lab): `cargo build -p palisade-node --features
//! bench --bin node-bench`, and the `palisade-node` binary built beside it.
//!
//! Usage: `node-bench [PODS] [KILL_PODS]` (defaults 100 and 20).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
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
    use palisade_lab::process::memory_kib as field;
    Some((field(pid, "VmRSS")?, field(pid, "VmHWM")?))
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
    let kill_pods: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()
        .context("KILL_PODS must be a number")?
        .unwrap_or(20);
    if !(1..=60).contains(&kill_pods) {
        bail!("KILL_PODS must be 1..=60");
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

    // The KILL phase runs alone: the start-latency pods go first (they exit on TERM).
    eprintln!("deleting the {pods} start-latency pods ...");
    rt.block_on(api.delete_collection(&DeleteParams::default(), &ListParams::default()))?;
    wait_no_pods(&rt, &api, Duration::from_secs(120))?;
    let k = kill_error(&lab, &rt, &api, &node, &dir, kill_pods)?;
    k.print();
    Ok(())
}

/// Waits until the namespace has no pods left, for at most `timeout`.
fn wait_no_pods(
    rt: &tokio::runtime::Runtime,
    api: &Api<Pod>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = rt.block_on(api.list(&ListParams::default()))?.items.len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} pods still present after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How often the host polls each container's `/proc/<pid>/stat` for its death.
const DEATH_POLL: Duration = Duration::from_millis(2);

/// One KILL case: the pod's `terminationGracePeriodSeconds`, and an optional exec preStop
/// hook that sleeps this many seconds.
#[derive(Debug, Clone, Copy)]
struct KillCase {
    grace: i64,
    hook: Option<u64>,
}

/// The cases, used round-robin: plain windows, a hook's whole seconds subtracted, the 2 s
/// floor, and an overrunning hook (cut at the grace period, then the one-off 2 s).
const KILL_CASES: [KillCase; 6] = [
    KillCase {
        grace: 2,
        hook: None,
    },
    KillCase {
        grace: 3,
        hook: None,
    },
    KillCase {
        grace: 2,
        hook: Some(1),
    },
    KillCase {
        grace: 3,
        hook: Some(1),
    },
    KillCase {
        grace: 4,
        hook: Some(1),
    },
    KillCase {
        grace: 2,
        hook: Some(5),
    },
];

impl KillCase {
    fn label(&self) -> String {
        match self.hook {
            None => format!("grace {}s, no preStop", self.grace),
            Some(h) => format!("grace {}s, preStop sleep {h}s", self.grace),
        }
    }
}

/// Seed 003's TERM→KILL window, written out from the seed rather than taken from the agent's
/// `grace.rs`, so the bench checks the agent against the seed: the grace period minus the
/// whole seconds (truncated) the preStop hook ran, the hook being cut off at the grace
/// period; never below 2 s (which is also the one-off extension of an overrunning hook).
fn seed003_window(grace: i64, hook_seconds: Option<f64>) -> i64 {
    let charged = hook_seconds.map_or(0, |h| h.min(grace as f64).max(0.0).floor() as i64);
    (grace - charged).max(2)
}

/// One measured KILL.
struct KillSample {
    case: KillCase,
    window: i64,
    /// Death − (TERM receipt + window), seconds; `None` if the container logged no TERM.
    vs_term: Option<f64>,
    /// Death − (DELETE + hook time + window), seconds.
    vs_delete: f64,
    /// TERM receipt − DELETE, seconds, for pods without a hook (the watch and worker delay).
    delete_to_term: Option<f64>,
}

/// The KILL phase's results.
struct KillReport {
    samples: Vec<KillSample>,
    /// `late_ms` of each deadline KILL the agent logged during the phase.
    agent_late_ms: Option<Vec<f64>>,
    /// `palisade_node_deadline_kills_total` before and after, and the lateness maximum.
    agent_metric: Option<(f64, f64, f64)>,
}

/// `(state, ppid, start ticks)` from `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Option<(char, i32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((
        f.first()?.chars().next()?,
        f.get(1)?.parse().ok()?,
        f.get(19)?.parse().ok()?,
    ))
}

/// The host pid of the container's main shell: a `/bin/sh` whose script contains `marker`
/// (a path inside this lab's directory, so unique to it) and whose parent is not one (a
/// forked subshell has the same argv). All of `/proc` is searched: containers do not inherit
/// the machine's environment, by which the lab finds a machine's processes.
fn container_pid(marker: &str) -> Option<(i32, u64)> {
    let cands: Vec<i32> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| *a == b"/bin/sh")
                && args
                    .get(2)
                    .is_some_and(|a| String::from_utf8_lossy(a).contains(marker))
        })
        .collect();
    cands.iter().find_map(|&p| {
        let (_, ppid, ticks) = proc_stat(p)?;
        (!cands.contains(&ppid)).then_some((p, ticks))
    })
}

/// Polls every pid until it is gone or a zombie (or another process took the pid), and
/// returns the wall-clock time each was first seen dead.
fn watch_deaths(pids: Vec<(i32, u64)>, timeout: Duration) -> Vec<Option<f64>> {
    let mut dead = vec![None; pids.len()];
    let end = Instant::now() + timeout;
    while dead.iter().any(Option::is_none) && Instant::now() < end {
        for (i, &(pid, ticks)) in pids.iter().enumerate() {
            if dead[i].is_some() {
                continue;
            }
            let gone = match proc_stat(pid) {
                None => true,
                Some((state, _, t)) => matches!(state, 'Z' | 'X') || t != ticks,
            };
            if gone {
                dead[i] = Some(now_s());
            }
        }
        std::thread::sleep(DEATH_POLL);
    }
    dead
}

/// The agent's `/metrics`, fetched inside the machine's network namespace.
fn agent_metrics(lab: &palisade_lab::Lab) -> Option<String> {
    let addr = "127.0.0.1:10255".parse().ok()?;
    let mut s = palisade_lab::netns::connect_tcp_in(lab.machines()[0].netns(), addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Removes ANSI escape sequences (the agent's log may be coloured).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `late_ms` of every "grace period over: SIGKILL" line after byte `from` of the agent log.
fn agent_late_ms(log: &Path, from: u64) -> Option<Vec<f64>> {
    let bytes = std::fs::read(log).ok()?;
    let tail = bytes.get(usize::try_from(from).ok()?..)?;
    let text = strip_ansi(&String::from_utf8_lossy(tail));
    Some(
        text.lines()
            .filter(|l| l.contains("grace period over: SIGKILL"))
            .filter_map(|l| {
                let v = &l[l.find("late_ms=")? + "late_ms=".len()..];
                let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().ok()
            })
            .collect(),
    )
}

/// Creates `n` TERM-ignoring pods, deletes them, and measures each KILL against the grace-period deadline.
fn kill_error(
    lab: &palisade_lab::Lab,
    rt: &tokio::runtime::Runtime,
    api: &Api<Pod>,
    node: &str,
    dir: &Path,
    n: usize,
) -> anyhow::Result<KillReport> {
    let file = |i: usize, what: &str| -> PathBuf { dir.join(format!("kill-{i}.{what}")) };
    let stamp = |p: PathBuf| format!("date +%s.%N > {p}.tmp && mv {p}.tmp {p}", p = p.display());
    eprintln!("KILL phase: {n} TERM-ignoring pods ...");
    let cases: Vec<KillCase> = (0..n).map(|i| KILL_CASES[i % KILL_CASES.len()]).collect();
    for (i, case) in cases.iter().enumerate() {
        // The trap logs TERM and carries on; `wait` returns at once on a trapped signal,
        // so the log is written within a fork of the signal's arrival.
        let script = format!(
            "trap '{term}' TERM; {up}; while :; do sleep 1 & wait $!; done",
            term = stamp(file(i, "term")),
            up = stamp(file(i, "up")),
        );
        let mut pod = json!({
            "metadata": {"name": format!("k{i}")},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": case.grace,
                "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", script]}],
            }
        });
        if let Some(h) = case.hook {
            let hook = format!(
                "{}; sleep {h}; {}",
                stamp(file(i, "hook-start")),
                stamp(file(i, "hook-end"))
            );
            pod["spec"]["containers"][0]["lifecycle"] =
                json!({"preStop": {"exec": {"command": ["/bin/sh", "-c", hook]}}});
        }
        let pod: Pod = serde_json::from_value(pod)?;
        rt.block_on(api.create(&PostParams::default(), &pod))
            .with_context(|| format!("create pod k{i}"))?;
    }
    let mut pids = Vec::with_capacity(n);
    for i in 0..n {
        let marker = file(i, "term").display().to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        let pid = loop {
            if read_ts(&file(i, "up")).is_some() {
                if let Some(p) = container_pid(&marker) {
                    break p;
                }
            }
            if Instant::now() > deadline {
                bail!("KILL pod k{i} did not start within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        pids.push(pid);
    }
    // Let the agent see every pod Running before the deletions.
    std::thread::sleep(Duration::from_secs(2));

    let log = lab.machines()[0].dir().join("agent.log");
    let log_from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let before = agent_metrics(lab).and_then(|t| metric(&t, "palisade_node_deadline_kills_total"));

    let watcher = std::thread::spawn(move || watch_deaths(pids, Duration::from_secs(60)));
    let mut deleted_at = Vec::with_capacity(n);
    for i in 0..n {
        deleted_at.push(now_s());
        rt.block_on(api.delete(&format!("k{i}"), &DeleteParams::default()))
            .with_context(|| format!("delete pod k{i}"))?;
    }
    let deaths = watcher
        .join()
        .map_err(|_| anyhow::anyhow!("death watcher panicked"))?;

    let mut samples = Vec::with_capacity(n);
    for (i, case) in cases.iter().enumerate() {
        let died = deaths[i].with_context(|| format!("KILL pod k{i}: process alive after 60 s"))?;
        let (hook_seconds, hook_time) = match case.hook {
            None => (None, 0.0),
            Some(_) => {
                let start = read_ts(&file(i, "hook-start"))
                    .with_context(|| format!("KILL pod k{i}: preStop did not run"))?;
                match read_ts(&file(i, "hook-end")) {
                    Some(end) => (Some(end - start), end - start),
                    // Cut off at the grace period: charged the whole period.
                    None => (Some(case.grace as f64), case.grace as f64),
                }
            }
        };
        let window = seed003_window(case.grace, hook_seconds);
        let term = read_ts(&file(i, "term"));
        let vs_term = term.map(|t| died - (t + window as f64));
        let delete_to_term = term
            .filter(|_| case.hook.is_none())
            .map(|t| t - deleted_at[i]);
        let vs_delete = died - (deleted_at[i] + hook_time + window as f64);
        samples.push(KillSample {
            case: *case,
            window,
            vs_term,
            vs_delete,
            delete_to_term,
        });
    }

    // The pod objects go once the processes are gone; wait so the agent has logged all.
    wait_no_pods(rt, api, Duration::from_secs(60))?;
    let after = agent_metrics(lab);
    let agent_metric = match (before, after) {
        (Some(b), Some(t)) => Some((
            b,
            metric(&t, "palisade_node_deadline_kills_total").unwrap_or(f64::NAN),
            metric(&t, "palisade_node_kill_lateness_max_seconds").unwrap_or(f64::NAN),
        )),
        _ => None,
    };
    Ok(KillReport {
        samples,
        agent_late_ms: agent_late_ms(&log, log_from),
        agent_metric,
    })
}

/// p50, p99 and max of `v` (made absolute first when `abs`), in ms.
fn summary_ms(v: impl Iterator<Item = f64>, abs: bool) -> (f64, f64, f64, usize) {
    let mut v: Vec<f64> = v
        .map(|x| if abs { x.abs() * 1000.0 } else { x * 1000.0 })
        .collect();
    v.sort_by(f64::total_cmp);
    (
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        v.last().copied().unwrap_or(f64::NAN),
        v.len(),
    )
}

impl KillReport {
    fn print(&self) {
        let n = self.samples.len();
        println!();
        println!(
            "KILL time vs the kubelet's deadline ({n} TERM-ignoring pods deleted at once; death seen from the host, polled every {} ms)",
            DEATH_POLL.as_millis()
        );
        println!("| metric | p50 | p99 | max | n | target |");
        println!("| --- | --- | --- | --- | --- | --- |");
        let (p50, p99, max, m) = summary_ms(self.samples.iter().filter_map(|s| s.vs_term), true);
        println!(
            "| abs(KILL - (TERM received + window)) | {p50:.1} ms | {p99:.1} ms | {max:.1} ms | {m} | <= 100 ms |"
        );
        let (p50, p99, max, m) = summary_ms(self.samples.iter().map(|s| s.vs_delete), true);
        println!(
            "| abs(KILL - (DELETE + preStop + window)) | {p50:.1} ms | {p99:.1} ms | {max:.1} ms | {m} | <= 100 ms |"
        );
        let (p50, _, _, _) = summary_ms(self.samples.iter().filter_map(|s| s.vs_term), false);
        let min = self
            .samples
            .iter()
            .filter_map(|s| s.vs_term)
            .fold(f64::INFINITY, f64::min);
        println!(
            "| signed KILL - (TERM received + window): p50, min | {p50:+.1} ms | | min {:+.1} ms | | > 0 (never early) |",
            min * 1000.0
        );
        let (p50, p99, max, m) =
            summary_ms(self.samples.iter().filter_map(|s| s.delete_to_term), false);
        println!(
            "| DELETE sent -> TERM received (pods without preStop) | {p50:.1} ms | {p99:.1} ms | {max:.1} ms | {m} | |"
        );
        match &self.agent_late_ms {
            Some(v) => {
                let (p50, p99, max, m) = summary_ms(v.iter().map(|x| x / 1000.0), false);
                println!(
                    "| agent's own late_ms per deadline KILL (its log) | {p50:.0} ms | {p99:.0} ms | {max:.0} ms | {m} | |"
                );
            }
            None => println!("| agent's own late_ms per deadline KILL (its log) | n/a | | | | |"),
        }
        match self.agent_metric {
            Some((before, after, max)) => println!(
                "| agent metric palisade_node_kill_lateness_max_seconds | | | {:.1} ms | {} kills | |",
                max * 1000.0,
                after - before
            ),
            None => println!("| agent metric palisade_node_kill_lateness_max_seconds | n/a | | | | |"),
        }
        println!();
        println!("| case | window | n | p50 signed vs TERM+window | p50 signed vs DELETE+preStop+window |");
        println!("| --- | --- | --- | --- | --- |");
        for case in KILL_CASES {
            let of_case: Vec<&KillSample> = self
                .samples
                .iter()
                .filter(|s| s.case.grace == case.grace && s.case.hook == case.hook)
                .collect();
            if of_case.is_empty() {
                continue;
            }
            let (t50, _, _, _) = summary_ms(of_case.iter().filter_map(|s| s.vs_term), false);
            let (d50, _, _, _) = summary_ms(of_case.iter().map(|s| s.vs_delete), false);
            println!(
                "| {} | {} s | {} | {t50:+.1} ms | {d50:+.1} ms |",
                case.label(),
                of_case[0].window,
                of_case.len()
            );
        }
    }
}
