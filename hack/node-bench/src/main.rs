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
//! - **Image pull, side by side with `buildah`** (last, once the pods above are gone). The
//!   controller image (`palisade-controller`, stripped, with the shared libraries it loads:
//!   the layout of [`palisade_lab::Registry::push_binary`]) is pushed to the lab's registry
//!   `PULL_RUNS` times, each under a fresh tag and with a small distinct file, so each pull is
//!   cold (the agent's store is keyed by the config digest). For each run: a pod of that
//!   image (`IfNotPresent`) makes the agent pull and unpack it; its own `took_ms` (the
//!   `pulled image` line of its log) and the pod's `Pulled` Event are read back, and the
//!   create → process start time is measured from the host: the container is the controller
//!   itself, told to read `--bridge-key` from a FIFO on a hostPath volume, and the bench sees
//!   the moment it opens it (a non-blocking open for writing succeeds once a reader is there;
//!   the controller then reads nothing and exits on a missing kubeconfig). A second pod of
//!   the same image is a warm start (its Event must say `already present`). `buildah pull`
//!   (vfs storage: it unpacks the layer; TLS verified against the lab CA) pulls the same tag
//!   into a fresh `--root`, timed around the process: from the host over loopback, and from
//!   the machine's network namespace through the hub relay the agent also goes through; a
//!   `buildah images` on a fresh root gives its process and storage start-up alone. The
//!   order of the agent and buildah alternates between runs. Needs `docker-registry` (else
//!   the phase is skipped); without `buildah` the peer column is skipped.
//!
//! Bounded in count and time: at most 200 pods, each start awaited for at most 60 s; at most
//! 60 KILL pods, each awaited for at most 60 s to start and 60 s to die; at most 20 pull runs,
//! each cold start awaited for at most 180 s, each warm one 60 s, each buildah run 300 s.
//! A crate of its own (it links the lab; the node agent's crate carries no benchmark):
//! `cargo build -p palisade-node-bench`, with the `palisade-node` and `palisade-controller`
//! binaries built beside it.
//!
//! Usage: `node-bench [PODS] [KILL_PODS] [PULL_RUNS] [--out FILE.json]` (defaults 100, 20 and
//! 5; `PULL_RUNS` 0 skips the pull phase). With `--out`, every figure (p50 and p99, the pull
//! beside buildah's) is written as a bench document (`palisade_test_support::bench`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use palisade_test_support::bench::{self, nearest_rank, Figure, Stat};
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

/// The nearest-rank percentile `p` of `sorted`, NaN for an empty sample (for the tables).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    nearest_rank(sorted, p).unwrap_or(f64::NAN)
}

/// `kib` in MiB, as a one-sample figure.
fn mib(quantity: impl Into<String>, kib: u64) -> Figure {
    Figure::new(quantity, "MiB", Stat::of([kib as f64 / 1024.0]))
}

fn read_ts(p: &Path) -> Option<f64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn main() -> anyhow::Result<()> {
    let run = bench::Run::start("node");
    let (out, positional) = bench::out_flag(std::env::args().skip(1).collect())?;
    let arg = |i: usize| positional.get(i).map(|s| s.parse::<usize>()).transpose();
    let pods: usize = arg(0).context("PODS must be a number")?.unwrap_or(100);
    if !(1..=200).contains(&pods) {
        bail!("PODS must be 1..=200");
    }
    let kill_pods: usize = arg(1).context("KILL_PODS must be a number")?.unwrap_or(20);
    if !(1..=60).contains(&kill_pods) {
        bail!("KILL_PODS must be 1..=60");
    }
    let pull_runs: usize = arg(2).context("PULL_RUNS must be a number")?.unwrap_or(5);
    if pull_runs > 20 {
        bail!("PULL_RUNS must be 0..=20");
    }
    let controller = match pull_runs {
        0 => None,
        _ => Some(palisade_lab::bin_path("palisade-controller").context(
            "the pull phase pushes the palisade-controller binary: build it \
             (cargo build -p palisade-controller), or pass PULL_RUNS 0",
        )?),
    };
    let registry = controller.is_some() && palisade_lab::require_tool("docker-registry").is_ok();
    if controller.is_some() && !registry {
        eprintln!(
            "docker-registry is not installed (hack/install-deps.sh installs it): skipping the image pull phase"
        );
    }
    let lab = if registry {
        eprintln!("starting a lab with 1 machine running palisade-node and a registry ...");
        let cfg = palisade_scenario::in_cluster::lab_config(
            palisade_lab::MachineKind::Namespace,
            1,
            false,
            &Default::default(),
        )?;
        palisade_lab::Lab::start(cfg)?
    } else {
        eprintln!("starting a lab with 1 machine running palisade-node ...");
        palisade_scenario::lab_with_agents(1, false, &Default::default())?
    };
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

    let mut figures: Vec<Figure> = idle
        .map(|(idle_rss, _)| mib("agent RSS, no pods", idle_rss))
        .into_iter()
        .collect();
    figures.extend([
        mib(format!("agent RSS, {pods} pods Running"), rss),
        mib(format!("agent peak RSS (VmHWM), {pods} pods Running"), hwm),
        Figure::new(
            "bind → process start",
            "ms",
            Stat::of(latencies.iter().copied()),
        ),
        Figure::new(
            format!("time to start {pods} pods one by one"),
            "s",
            Stat::of([fill.as_secs_f64()]),
        ),
    ]);
    figures.extend(k.figures());
    if let (true, Some(bin)) = (registry, controller) {
        let p = pull_phase(&lab, &rt, &c, &node, &dir, &bin, pull_runs)?;
        p.print();
        figures.extend(p.figures());
    }
    if let Some(out) = &out {
        run.write(
            out,
            json!({"pods": pods, "kill_pods": kill_pods, "pull_runs": pull_runs,
                "pull_phase": registry, "death_poll_ms": DEATH_POLL.as_millis()}),
            &figures,
            json!({"bind_to_start_ms": latencies}),
        )
        .with_context(|| format!("writing {}", out.display()))?;
        println!("figures written to {}", out.display());
    }
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

/// `late_ms` of every "grace period over: SIGKILL" line after byte `from` of the agent log.
fn agent_late_ms(log: &Path, from: u64) -> Option<Vec<f64>> {
    let bytes = std::fs::read(log).ok()?;
    let tail = bytes.get(usize::try_from(from).ok()?..)?;
    let text = palisade_test_support::strip_ansi(&String::from_utf8_lossy(tail));
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

/// The statistics of `v`, seconds, in ms (made absolute first when `abs`).
fn stat_ms(v: impl Iterator<Item = f64>, abs: bool) -> Stat {
    Stat::of(v.map(|x| if abs { x.abs() * 1000.0 } else { x * 1000.0 }))
}

/// p50, p99 and max of `v` (made absolute first when `abs`), in ms, and the count.
fn summary_ms(v: impl Iterator<Item = f64>, abs: bool) -> (f64, f64, f64, usize) {
    let s = stat_ms(v, abs);
    let f = |x: Option<f64>| x.unwrap_or(f64::NAN);
    (f(s.p50), f(s.p99), f(s.max), s.count)
}

impl KillReport {
    /// The phase's figures, as [`KillReport::print`] shows them.
    fn figures(&self) -> Vec<Figure> {
        let n = self.samples.len();
        let signed = stat_ms(self.samples.iter().filter_map(|s| s.vs_term), false);
        let mut v = vec![
            Figure::new(
                format!(
                    "|KILL − (TERM received + window)|, {n} TERM-ignoring pods deleted at once"
                ),
                "ms",
                stat_ms(self.samples.iter().filter_map(|s| s.vs_term), true),
            ),
            Figure::new(
                "|KILL − (DELETE + preStop + window)|",
                "ms",
                stat_ms(self.samples.iter().map(|s| s.vs_delete), true),
            ),
            Figure::new(
                "earliest KILL − (TERM received + window) (above 0: never early)",
                "ms",
                Stat::of(signed.min),
            ),
            Figure::new(
                "DELETE sent → TERM received (pods without preStop)",
                "ms",
                stat_ms(self.samples.iter().filter_map(|s| s.delete_to_term), false),
            ),
        ];
        if let Some(late) = &self.agent_late_ms {
            v.push(Figure::new(
                "the agent's own late_ms per deadline KILL (its log)",
                "ms",
                Stat::of(late.iter().copied()),
            ));
        }
        v
    }

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

/// The pull phase's repository in the lab registry.
const PULL_REPO: &str = "bench/controller";
/// Each cold pod's start (the pull included) is awaited for at most this long.
const COLD_START_TIMEOUT: Duration = Duration::from_secs(180);
/// Each warm pod's start is awaited for at most this long.
const WARM_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Each buildah process is given at most this long.
const BUILDAH_TIMEOUT: Duration = Duration::from_secs(300);

/// A pod of `image` whose container is the controller reading `--bridge-key` from the FIFO
/// `key` in `vol` (a hostPath volume at `/bench`): it blocks there until the bench opens the
/// FIFO, then reads nothing and exits on its missing kubeconfig (it never reaches the API).
fn fifo_pod(name: &str, node: &str, image: &str, vol: &Path) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "volumes": [{"name": "bench", "hostPath": {"path": vol.display().to_string(), "type": "Directory"}}],
            "containers": [{
                "name": "main",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/palisade-controller",
                    "--bridge-key", "/bench/key", "--bridge-ca", "/bench/ca", "--bridge-cert", "/bench/cert",
                    "--kubeconfig", "/bench/absent"],
                "volumeMounts": [{"name": "bench", "mountPath": "/bench"}],
            }],
        }
    }))?)
}

/// A fresh directory for one [`fifo_pod`]: the FIFO `key` and the empty files `ca`, `cert`.
fn fifo_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    nix::unistd::mkfifo(
        &dir.join("key"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .with_context(|| format!("mkfifo in {}", dir.display()))?;
    std::fs::write(dir.join("ca"), b"")?;
    std::fs::write(dir.join("cert"), b"")?;
    Ok(dir.to_path_buf())
}

/// Waits until a process opens the FIFO `vol/key` for reading (a non-blocking open for
/// writing fails with ENXIO until then), polled every millisecond; returns the wall-clock
/// time it was first seen, and closes it (the reader gets EOF).
fn wait_fifo_reader(
    rt: &tokio::runtime::Runtime,
    api: &Api<Pod>,
    pod: &str,
    vol: &Path,
    timeout: Duration,
) -> anyhow::Result<f64> {
    use std::os::unix::fs::OpenOptionsExt;
    let fifo = vol.join("key");
    let deadline = Instant::now() + timeout;
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(&fifo)
        {
            Ok(f) => {
                let t = now_s();
                drop(f);
                return Ok(t);
            }
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENXIO as i32) => {}
            Err(e) => return Err(e).with_context(|| format!("open {}", fifo.display())),
        }
        if Instant::now() > deadline {
            let why = rt
                .block_on(api.get_opt(pod))
                .ok()
                .flatten()
                .and_then(|p| p.status)
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().next())
                .and_then(|c| c.state)
                .map(|s| format!("{s:?}"))
                .unwrap_or_else(|| "no container status".into());
            bail!("pod {pod}: its process did not start within {timeout:?} ({why})");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The message of `pod`'s `Pulled` Event, awaited for at most `timeout`.
fn pulled_event(
    rt: &tokio::runtime::Runtime,
    c: &kube::Client,
    pod: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    use k8s_openapi::api::core::v1::Event;
    let events: Api<Event> = Api::namespaced(c.clone(), NS);
    let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
    let deadline = Instant::now() + timeout;
    loop {
        let found = rt
            .block_on(events.list(&lp))?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Pulled"))
            .and_then(|e| e.message);
        if let Some(m) = found {
            return Ok(m);
        }
        if Instant::now() > deadline {
            bail!("pod {pod}: no Pulled Event within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The seconds of a `Successfully pulled image "X" in 1.234s` message.
fn event_seconds(message: &str) -> Option<f64> {
    message
        .strip_prefix("Successfully pulled image")?
        .rsplit_once(" in ")?
        .1
        .strip_suffix('s')?
        .parse()
        .ok()
}

/// `took_ms` of the agent's `pulled image` line for `image` (exactly: the next character
/// does not continue the reference) after byte `from` of its log, awaited for at most
/// `timeout`.
fn agent_took_ms(log: &Path, from: u64, image: &str, timeout: Duration) -> anyhow::Result<f64> {
    let deadline = Instant::now() + timeout;
    loop {
        let bytes = std::fs::read(log).with_context(|| format!("read {}", log.display()))?;
        let tail = bytes
            .get(usize::try_from(from).unwrap_or(usize::MAX)..)
            .unwrap_or_default();
        let text = palisade_test_support::strip_ansi(&String::from_utf8_lossy(tail));
        let took = text
            .lines()
            .filter(|l| l.contains("pulled image"))
            .filter(|l| {
                l.match_indices(image).any(|(i, _)| {
                    !l[i + image.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || "._-:@".contains(c))
                })
            })
            .find_map(|l| {
                let v = &l[l.find("took_ms=")? + "took_ms=".len()..];
                let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().ok()
            });
        if let Some(t) = took {
            return Ok(t);
        }
        if Instant::now() > deadline {
            bail!(
                "no `pulled image` line with took_ms for {image} in {} within {timeout:?}",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `cmd` (stdout discarded, stderr to `stderr`), for at most [`BUILDAH_TIMEOUT`];
/// returns its wall time, from just before the spawn to the exit seen (polled every ms).
fn timed(mut cmd: std::process::Command, what: &str, stderr: &Path) -> anyhow::Result<Duration> {
    let err = std::fs::File::create(stderr)?;
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err);
    let t0 = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("run {what}"))?;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t0.elapsed() > BUILDAH_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what}: still running after {BUILDAH_TIMEOUT:?}, killed");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let took = t0.elapsed();
    if !status.success() {
        let msg = std::fs::read_to_string(stderr).unwrap_or_default();
        bail!("{what} failed ({status}): {}", msg.trim());
    }
    Ok(took)
}

/// `buildah` with its storage (vfs) in a fresh `root` (removed first), run from the host or,
/// with `netns`, inside that network namespace (`nsenter --net`).
fn buildah(root: &Path, netns: Option<&str>) -> anyhow::Result<std::process::Command> {
    if root.exists() {
        std::fs::remove_dir_all(root)?;
    }
    std::fs::create_dir_all(root)?;
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = std::process::Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{ns}")).arg("buildah");
            c
        }
        None => std::process::Command::new("buildah"),
    };
    cmd.arg("--root")
        .arg(root.join("root"))
        .arg("--runroot")
        .arg(root.join("run"))
        .args(["--storage-driver", "vfs"]);
    Ok(cmd)
}

/// Times `buildah pull` of `reference` into a fresh vfs root (so cold), TLS verified against
/// the CA in `cert_dir`, and checks the layer was unpacked (`entry` is a file in a vfs layer
/// directory). The root is removed afterwards.
fn buildah_pull(
    root: &Path,
    netns: Option<&str>,
    cert_dir: &Path,
    reference: &str,
    entry: &str,
) -> anyhow::Result<Duration> {
    let mut cmd = buildah(root, netns)?;
    cmd.args(["pull", "--quiet", "--cert-dir"])
        .arg(cert_dir)
        .arg(format!("docker://{reference}"));
    let took = timed(
        cmd,
        &format!("buildah pull {reference}"),
        &root.with_extension("stderr"),
    )?;
    let layers = root.join("root/vfs/dir");
    let unpacked = std::fs::read_dir(&layers)
        .with_context(|| format!("buildah left no vfs layers in {}", layers.display()))?
        .filter_map(Result::ok)
        .any(|d| d.path().join(entry.trim_start_matches('/')).is_file());
    if !unpacked {
        bail!(
            "buildah pull {reference}: {entry} not found unpacked under {}",
            layers.display()
        );
    }
    std::fs::remove_dir_all(root)?;
    Ok(took)
}

/// The median (nearest rank), min and max of `v`; NaN for an empty sample.
fn mid_min_max(v: &[f64]) -> (f64, f64, f64) {
    let s = Stat::of(v.iter().copied());
    let f = |x: Option<f64>| x.unwrap_or(f64::NAN);
    (f(s.p50), f(s.min), f(s.max))
}

/// The pull phase's results (times in ms).
struct PullReport {
    runs: usize,
    bin: PathBuf,
    libs: usize,
    files_bytes: u64,
    layer_bytes: Option<u64>,
    agent_took_ms: Vec<f64>,
    event_ms: Vec<f64>,
    cold_start_ms: Vec<f64>,
    warm_start_ms: Vec<f64>,
    /// `None`: buildah is not installed.
    buildah_loopback_ms: Option<Vec<f64>>,
    /// `None`: buildah or nsenter missing, or the namespace not found.
    buildah_relay_ms: Option<Vec<f64>>,
    buildah_idle_ms: Option<Vec<f64>>,
    registry_local: String,
    rss_before: Option<(u64, u64)>,
    rss_after: Option<(u64, u64)>,
}

/// The compressed size of the layers of `repo:tag`, from its manifest in the registry.
fn layer_bytes(
    rt: &tokio::runtime::Runtime,
    local: std::net::SocketAddr,
    ca: &Path,
    tag: &str,
) -> anyhow::Result<u64> {
    let pem = std::fs::read(ca)?;
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(
            palisade_telemetry::tls::pinned(&pem).map_err(anyhow::Error::msg)?,
        )
        .timeout(Duration::from_secs(30))
        .build()?;
    let url = format!("https://{local}/v2/{PULL_REPO}/manifests/{tag}");
    let m: serde_json::Value = rt.block_on(async {
        http.get(&url)
            .header("accept", "application/vnd.oci.image.manifest.v1+json")
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    })?;
    m["layers"]
        .as_array()
        .context("manifest without layers")?
        .iter()
        .map(|l| l["size"].as_u64().context("layer without size"))
        .sum()
}

/// Cold pulls of the controller image by the agent and by buildah, and warm starts.
fn pull_phase(
    lab: &palisade_lab::Lab,
    rt: &tokio::runtime::Runtime,
    c: &kube::Client,
    node: &str,
    dir: &Path,
    bin: &Path,
    runs: usize,
) -> anyhow::Result<PullReport> {
    eprintln!(
        "pull phase: {runs} runs of the controller image ({}) ...",
        bin.display()
    );
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    let pdir = dir.join("pull");
    std::fs::create_dir_all(&pdir)?;
    let (files, entry) = palisade_lab::registry::binary_image_files(&pdir, bin)?;
    let files_bytes = files
        .iter()
        .map(|f| std::fs::metadata(&f.source).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    let (host, local, ca) = {
        let r = lab.registry().context("the lab has no registry")?;
        (r.host(), r.local_addr(), r.ca_file())
    };
    let cert_dir = pdir.join("certs");
    std::fs::create_dir_all(&cert_dir)?;
    std::fs::copy(&ca, cert_dir.join("ca.crt"))?;

    let have = |tool: &str| palisade_lab::require_tool(tool).is_ok();
    let with_buildah = have("buildah");
    if !with_buildah {
        eprintln!(
            "buildah is not installed (hack/install-deps.sh installs it): skipping the peer column"
        );
    }
    let netns = lab.machines()[0].netns().to_string();
    let relay =
        with_buildah && have("nsenter") && Path::new(&format!("/run/netns/{netns}")).exists();
    if with_buildah && !relay {
        eprintln!("nsenter or /run/netns/{netns} missing: skipping buildah through the hub relay");
    }

    let log = lab.machines()[0].dir().join("agent.log");
    let rss_before = agent_pid(lab).and_then(memory_kib);
    let mut r = PullReport {
        runs,
        bin: bin.to_path_buf(),
        libs: files.len() - 1,
        files_bytes,
        layer_bytes: None,
        agent_took_ms: Vec::new(),
        event_ms: Vec::new(),
        cold_start_ms: Vec::new(),
        warm_start_ms: Vec::new(),
        buildah_loopback_ms: with_buildah.then(Vec::new),
        buildah_relay_ms: relay.then(Vec::new),
        buildah_idle_ms: with_buildah.then(Vec::new),
        registry_local: local.to_string(),
        rss_before,
        rss_after: None,
    };

    for i in 0..runs {
        // A fresh tag and a distinct file: a new layer, config and manifest, so nothing of
        // it is in the agent's store or in buildah's (a fresh root each time).
        let tag = format!("cold-{i}");
        let marker = pdir.join(format!("run-{i}"));
        std::fs::write(
            &marker,
            format!("node-bench {} run {i} {}\n", lab.id(), now_s()),
        )?;
        let mut image_files = files.clone();
        image_files.push(palisade_lab::ImageFile {
            path: "etc/node-bench-run".into(),
            source: marker,
            mode: 0o644,
        });
        lab.registry()
            .context("the lab has no registry")?
            .push(PULL_REPO, &tag, &image_files, &[entry.as_str()])
            .with_context(|| format!("push {PULL_REPO}:{tag}"))?;
        if i == 0 {
            r.layer_bytes = layer_bytes(rt, local, &ca, &tag)
                .map_err(|e| eprintln!("cannot read the layer size from the manifest: {e:#}"))
                .ok();
        }
        let image = format!("{host}/{PULL_REPO}:{tag}");

        let peer = |r: &mut PullReport| -> anyhow::Result<()> {
            if let Some(v) = r.buildah_loopback_ms.as_mut() {
                let t = buildah_pull(
                    &pdir.join(format!("buildah-{i}")),
                    None,
                    &cert_dir,
                    &format!("{local}/{PULL_REPO}:{tag}"),
                    &entry,
                )?;
                v.push(t.as_secs_f64() * 1000.0);
            }
            if let Some(v) = r.buildah_relay_ms.as_mut() {
                let t = buildah_pull(
                    &pdir.join(format!("buildah-relay-{i}")),
                    Some(&netns),
                    &cert_dir,
                    &format!("{host}/{PULL_REPO}:{tag}"),
                    &entry,
                )?;
                v.push(t.as_secs_f64() * 1000.0);
            }
            if let Some(v) = r.buildah_idle_ms.as_mut() {
                let root = pdir.join(format!("buildah-idle-{i}"));
                let mut cmd = buildah(&root, None)?;
                cmd.args(["images", "--quiet"]);
                let t = timed(cmd, "buildah images", &root.with_extension("stderr"))?;
                std::fs::remove_dir_all(&root)?;
                v.push(t.as_secs_f64() * 1000.0);
            }
            Ok(())
        };

        // The order alternates, so neither always meets the registry right after the push.
        if i % 2 == 1 {
            peer(&mut r)?;
        }

        // Cold: the agent pulls and unpacks, then starts the controller.
        let name = format!("cold-{i}");
        let vol = fifo_dir(&pdir.join(&name))?;
        let log_from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        rt.block_on(api.create(
            &PostParams::default(),
            &fifo_pod(&name, node, &image, &vol)?,
        ))
        .with_context(|| format!("create pod {name}"))?;
        let bound = now_s();
        let started = wait_fifo_reader(rt, &api, &name, &vol, COLD_START_TIMEOUT)?;
        r.cold_start_ms.push((started - bound) * 1000.0);
        r.agent_took_ms.push(agent_took_ms(
            &log,
            log_from,
            &image,
            Duration::from_secs(30),
        )?);
        let msg = pulled_event(rt, c, &name, Duration::from_secs(30))?;
        let secs = event_seconds(&msg).with_context(|| {
            format!("pod {name}: not a fresh pull, its Pulled Event says: {msg}")
        })?;
        r.event_ms.push(secs * 1000.0);

        // Warm: the same image again, already in the store.
        let name = format!("warm-{i}");
        let vol = fifo_dir(&pdir.join(&name))?;
        rt.block_on(api.create(
            &PostParams::default(),
            &fifo_pod(&name, node, &image, &vol)?,
        ))
        .with_context(|| format!("create pod {name}"))?;
        let bound = now_s();
        let started = wait_fifo_reader(rt, &api, &name, &vol, WARM_START_TIMEOUT)?;
        r.warm_start_ms.push((started - bound) * 1000.0);
        let msg = pulled_event(rt, c, &name, Duration::from_secs(30))?;
        if !msg.contains("already present") {
            bail!("pod {name}: expected a warm start, its Pulled Event says: {msg}");
        }

        if i.is_multiple_of(2) {
            peer(&mut r)?;
        }
        eprintln!(
            "  run {i}: agent took_ms {:.0}, buildah {}",
            r.agent_took_ms[i],
            r.buildah_loopback_ms
                .as_ref()
                .and_then(|v| v.last())
                .map_or("skipped".into(), |t| format!("{t:.0} ms")),
        );
    }

    // The agent's memory once the pulls are over and it has settled.
    std::thread::sleep(Duration::from_secs(2));
    r.rss_after = agent_pid(lab).and_then(memory_kib);
    rt.block_on(api.delete_collection(&DeleteParams::default(), &ListParams::default()))?;
    wait_no_pods(rt, &api, Duration::from_secs(60))?;
    Ok(r)
}

impl PullReport {
    /// The phase's figures: the agent's pull beside buildah's, the starts, the memory.
    fn figures(&self) -> Vec<Figure> {
        let ms = |v: &[f64]| Stat::of(v.iter().copied());
        let pull = format!(
            "palisade-node: pull + unpack of the controller image, cold ({} libraries; its took_ms)",
            self.libs
        );
        let mut v = Vec::new();
        match &self.buildah_loopback_ms {
            Some(b) => v.push(Figure::new(&pull, "ms", ms(&self.agent_took_ms)).beside(
                "buildah pull, vfs, over loopback (process wall time)",
                ms(b),
            )),
            None => v.push(Figure::new(&pull, "ms", ms(&self.agent_took_ms))),
        }
        if let Some(b) = &self.buildah_relay_ms {
            v.push(Figure::new(&pull, "ms", ms(&self.agent_took_ms)).beside(
                "buildah pull, vfs, through the hub relay (the agent's path)",
                ms(b),
            ));
        }
        if let Some(b) = &self.buildah_idle_ms {
            v.push(Figure::new(
                "buildah images on a fresh vfs root (its start-up alone, no pull)",
                "ms",
                ms(b),
            ));
        }
        v.push(Figure::new(
            "palisade-node: Pulled Event (pull started → seen done)",
            "ms",
            ms(&self.event_ms),
        ));
        v.push(Figure::new(
            "bind → controller process start, cold (pull included)",
            "ms",
            ms(&self.cold_start_ms),
        ));
        v.push(Figure::new(
            "bind → controller process start, warm (already present)",
            "ms",
            ms(&self.warm_start_ms),
        ));
        if let Some(b) = self.layer_bytes {
            v.push(mib("the controller image's gzip layer", b / 1024));
        }
        v.push(mib(
            "the controller image's files, uncompressed",
            self.files_bytes / 1024,
        ));
        for (when, m) in [("before", self.rss_before), ("after", self.rss_after)] {
            if let Some((rss, hwm)) = m {
                v.push(mib(format!("agent RSS {when} the pulls"), rss));
                v.push(mib(format!("agent peak RSS (VmHWM) {when} the pulls"), hwm));
            }
        }
        v
    }

    fn print(&self) {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        println!();
        println!(
            "Image pull: the controller image, {} runs, each a fresh tag with distinct content (cold for both tools; buildah into a fresh vfs root each time)",
            self.runs
        );
        println!(
            "image: {} stripped, with {} shared libraries, one gzip layer: {} compressed (registry manifest), {:.1} MiB of files uncompressed",
            self.bin.display(),
            self.libs,
            self.layer_bytes
                .map_or("n/a".into(), |b| format!("{:.1} MiB", mib(b))),
            mib(self.files_bytes)
        );
        let (agent, amin, amax) = mid_min_max(&self.agent_took_ms);
        println!("| pull+unpack controller image (cold) | palisade-node | buildah | palisade-node / buildah |");
        println!("| --- | --- | --- | --- |");
        match &self.buildah_loopback_ms {
            Some(b) => {
                let (bm, bmin, bmax) = mid_min_max(b);
                println!(
                    "| median | {agent:.0} ms | {bm:.0} ms | {:.2} |",
                    agent / bm
                );
                println!("| min / max | {amin:.0} / {amax:.0} ms | {bmin:.0} / {bmax:.0} ms | |");
            }
            None => {
                println!("| median | {agent:.0} ms | skipped (buildah not installed) | |");
                println!("| min / max | {amin:.0} / {amax:.0} ms | | |");
            }
        }
        println!();
        println!("| metric | median | min | max | n |");
        println!("| --- | --- | --- | --- | --- |");
        let row = |what: &str, v: &[f64]| {
            let (m, lo, hi) = mid_min_max(v);
            println!(
                "| {what} | {m:.0} ms | {lo:.0} ms | {hi:.0} ms | {} |",
                v.len()
            );
        };
        row(
            "palisade-node: agent's took_ms (its log; manifest to unpacked in its store, in-process)",
            &self.agent_took_ms,
        );
        row(
            "palisade-node: Pulled Event (pod worker: pull started to seen done)",
            &self.event_ms,
        );
        match &self.buildah_loopback_ms {
            Some(v) => row(
                &format!(
                    "buildah pull, vfs, from the host over loopback {} (process wall time)",
                    self.registry_local
                ),
                v,
            ),
            None => println!("| buildah pull | skipped: buildah not installed | | | |"),
        }
        if let Some(v) = &self.buildah_relay_ms {
            row(
                "buildah pull, vfs, from the machine's netns through the hub relay (the agent's path)",
                v,
            );
        }
        if let Some(v) = &self.buildah_idle_ms {
            row(
                "buildah images on a fresh vfs root (its process and storage start-up, no pull)",
                v,
            );
        }
        row(
            "bind -> controller process start, cold (pull included)",
            &self.cold_start_ms,
        );
        row(
            "bind -> controller process start, warm (`already present`)",
            &self.warm_start_ms,
        );
        let mem = |v: Option<(u64, u64)>, i: usize| {
            v.map_or("n/a".into(), |m| {
                format!("{:.1} MiB", [m.0, m.1][i] as f64 / 1024.0)
            })
        };
        println!(
            "| agent RSS before the pulls / after | {} / {} | | | |",
            mem(self.rss_before, 0),
            mem(self.rss_after, 0)
        );
        println!(
            "| agent peak RSS (VmHWM) before the pulls / after | {} / {} | | | |",
            mem(self.rss_before, 1),
            mem(self.rss_after, 1)
        );
    }
}
