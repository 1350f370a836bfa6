//! `palisade-scale-bench`: the scale benchmark of `palisade-controller`: thousands of simulated nodes renewing against the real API server, a hundred silenced at once.
//!
//! It starts a lab with the real control plane and no machines, creates N simulated nodes
//! (a Node with a Ready condition, its `kube-node-lease` Lease and a `FenceTarget` each, with
//! bounded concurrency), and renews every healthy node's Lease every 10 s, spread evenly over
//! the period (the kubelet's load shape). It runs the real `palisade-controller` with a
//! `FencingPolicy` in `dryRun`, so a decision to fence is a `Hold(DryRun)` verdict: the
//! controller logs it (`decision … verdict=hold_dry_run`) and records a `FenceHeldDryRun`
//! Event on the Node, and never creates a `NodeFence` or touches a device. Then it silences K
//! nodes, one every ~2 s, and measures for each the time from its threshold (last `renewTime`
//! plus `unhealthyAfterSeconds`) to the decision, the controller's and the
//! kube-controller-manager's resident memory, and the node lifecycle controller's own
//! detection latency (Ready → Unknown, or the `node.kubernetes.io/unreachable` taint) for the
//! same nodes. Everything is bounded in count and by a global deadline. With `--out FILE.json`
//! the run is written as a bench document (`palisade_test_support::bench`): the headline
//! figures beside kube-controller-manager's, and the whole report (per node) as its details.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use palisade_lab::{Lab, LabConfig};
use palisade_model::{FenceTarget, NodeFence};
use palisade_scenario::SYSTEM_NS;
use palisade_test_support::bench::{self, Figure, Stat};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

/// Label on every simulated node (the policy selects it).
const BENCH_LABEL: &str = "palisade.dev/scale-bench";
/// Topology label: the simulated nodes are spread over four zones.
const ZONE_KEY: &str = "topology.kubernetes.io/zone";
/// Node heartbeat Leases.
const LEASE_NS: &str = "kube-node-lease";
/// Namespace of the simulated pods.
const POD_NS: &str = "scale-bench";
/// The taint the node lifecycle controller puts on a node whose heartbeat stopped.
const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
/// The kube-controller-manager's `--node-monitor-grace-period` default (the lab keeps it).
const KCM_GRACE: Duration = Duration::from_secs(40);
/// Event reason of a dry-run decision to fence.
const DRY_RUN_REASON: &str = "FenceHeldDryRun";
/// Credential Secret named by every FenceTarget device. It is never created: `dryRun` never
/// reaches a device, and if anything ever tried, the missing Secret would stop it.
const NEVER_READ_SECRET: &str = "palisade-scale-bench-never-read";
/// How much longer than two renew periods the warm-up may wait for every node to renew.
const WARM_UP_MORE: Duration = Duration::from_secs(120);
/// How long ago a live node's last renewal may have been acknowledged before node creation
/// pauses for the renewer: a node's renewal gap must stay inside the silence thresholds (15 s
/// and 20 s against a 10 s period). Measured 2026-12-03: creating nodes as fast as the API
/// server takes them left renewal gaps of up to 31.8 s at 10,000 nodes (575 nodes truly
/// silent by the API's record, and decided on); pausing on the renewer's lateness instead
/// stalled creation for good, since a renewer running late by a steady offset still renews
/// every period. In the steady state of 10,000 nodes the longest gap was 15 s (recorded
/// 2026-12-02), so a lower limit would stall the last nodes' creation.
const OLDEST_ACK_LIMIT: Duration = Duration::from_secs(16);
/// The device of every FenceTarget: port 1 on loopback, where nothing listens.
const UNUSED_DEVICE: &str = "ipmi://admin@127.0.0.1:1?cipher=3";

/// The scale benchmark of palisade-controller (see the crate documentation).
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    /// Simulated nodes (a Node, its Lease and its FenceTarget each).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=10000))]
    nodes: u32,
    /// Nodes silenced during the measurement (at most 30% of --nodes: the quorum guard
    /// holds everything beyond the policy's 40%).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    silence: u32,
    /// Seconds between two silenced nodes.
    #[arg(long, default_value_t = 2.0)]
    silence_every: f64,
    /// Lease renew period of every healthy node, seconds (the kubelet's default is 10).
    #[arg(long, default_value_t = 10.0)]
    renew_every: f64,
    /// The policy's `detection.suspectAfterSeconds`.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(1..=600))]
    suspect_after: u32,
    /// The policy's `detection.unhealthyAfterSeconds`.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=600))]
    unhealthy_after: u32,
    /// Pods bound to each simulated node (Pending forever: no kubelet runs them). They make
    /// the controller's per-tick snapshot carry pods, as a real cluster's does.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=20))]
    pods_per_node: u32,
    /// Concurrent API requests while creating the objects.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=256))]
    create_concurrency: u32,
    /// Lease renewals in flight at most.
    #[arg(long, default_value_t = 96, value_parser = clap::value_parser!(u32).range(1..=256))]
    renew_concurrency: u32,
    /// Seconds of steady state (every node renewing) over which CPU is measured, before
    /// memory is sampled and nodes are silenced.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    settle: u64,
    /// After the last node is silenced, how long to wait at most for the decisions and the
    /// node lifecycle controller (which needs 40 s plus its 5 s monitor period), seconds.
    #[arg(long, default_value_t = 75, value_parser = clap::value_parser!(u64).range(1..=900))]
    wait_after: u64,
    /// Global deadline, seconds: past it, every phase stops and the run reports what it has.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(60..=3600))]
    deadline: u64,
    /// Write the figures and the whole report as JSON to this file (the controller's log is
    /// copied beside it).
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    if u64::from(args.silence) * 100 > u64::from(args.nodes) * 30 {
        bail!(
            "--silence {} is more than 30% of --nodes {}: the quorum guard would hold",
            args.silence,
            args.nodes
        );
    }
    if !(args.silence_every > 0.0 && args.silence_every <= 60.0) {
        bail!("--silence-every must be in (0, 60] seconds");
    }
    if !(args.renew_every >= 1.0 && args.renew_every <= 60.0) {
        bail!("--renew-every must be in [1, 60] seconds");
    }
    if args.suspect_after >= args.unhealthy_after {
        bail!("--suspect-after must be shorter than --unhealthy-after");
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.deadline);
    let bench_run = bench::Run::start("scale");
    eprintln!(
        "[bench] {} nodes, {} to silence; {} cores, load {}; deadline {} s",
        args.nodes,
        args.silence,
        std::thread::available_parallelism().map_or(0, usize::from),
        bench::load_average().unwrap_or_default(),
        args.deadline
    );

    let lab = Lab::start(LabConfig {
        machines: 0,
        control_plane: true,
        pdu: false,
        ..Default::default()
    })
    .context("starting the lab (control plane only)")?;
    let lab_start_s = started.elapsed().as_secs_f64();
    eprintln!("[bench] lab {} up in {lab_start_s:.1} s", lab.id());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the runtime")?;
    let client = palisade_scenario::admin_client(&lab, &rt)?;
    palisade_scenario::namespace(&client, &rt, SYSTEM_NS)?;
    if args.pods_per_node > 0 {
        palisade_scenario::namespace(&client, &rt, POD_NS)?;
    }
    let (controller, metrics_addr) = palisade_scenario::start_controller(&lab, "scale-bench")?;
    palisade_scenario::policy(&client, &rt, "scale-bench", policy_spec(&args))?;
    eprintln!("[bench] controller started, dry-run policy created");

    let setup = Setup {
        lab_id: lab.id().to_string(),
        controller_log: controller.log.clone(),
        metrics_addr,
        lab_start_s,
    };
    let report = rt.block_on(run(&args, &setup, client, deadline));
    let mut report = report?;
    report["memory_total"] = json!(std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(str::to_string)));
    report["total_seconds"] = json!(started.elapsed().as_secs_f64());
    let parameters = report
        .as_object_mut()
        .and_then(|m| m.remove("parameters"))
        .unwrap_or_default();
    let figures = figures(&parameters, &report);
    let doc = bench_run.document(parameters, &figures, report);
    print_table(&doc);
    if let Some(path) = &args.out {
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("[bench] JSON written to {}", path.display());
    }
    drop(controller);
    drop(rt);
    drop(lab);
    Ok(())
}

/// The dry-run policy: every simulated node, fenced whenever silent (no pods needed), no
/// forgiveness (pods' default 300 s unreachable tolerations ignored), limits far above the silenced count, the quorum guard at its default 40%.
fn policy_spec(args: &Args) -> Value {
    json!({
        "nodeSelector": {"matchLabels": {BENCH_LABEL: "true"}},
        "detection": {
            "suspectAfterSeconds": args.suspect_after,
            "unhealthyAfterSeconds": args.unhealthy_after,
        },
        "limits": {
            "maxUnhealthy": "40%",
            "maxConcurrent": 1000,
            "perDomain": {"maxConcurrent": 1000},
        },
        "forgiveness": {"respectTolerations": false, "defaultSeconds": 0},
        "fenceWhen": "Always",
        "dryRun": true,
    })
}

/// What `main` set up for the async part.
struct Setup {
    lab_id: String,
    controller_log: PathBuf,
    metrics_addr: String,
    lab_start_s: f64,
}

/// The simulated nodes and their renewal bookkeeping.
struct Sim {
    names: Vec<String>,
    /// Renewed while `true` (set once the node's Lease exists; cleared to silence it).
    alive: Vec<AtomicBool>,
    /// The `renewTime` of the node's last successful renewal.
    last_renew: Vec<Mutex<Option<Timestamp>>>,
    /// When the API server acknowledged that renewal (its write is visible from then on).
    last_ack: Vec<Mutex<Option<Timestamp>>>,
    stop: AtomicBool,
    /// How long ago the live node least recently renewed was acknowledged, ms (refreshed
    /// every 250 ms by [`watch_oldest_ack`]). Node creation waits while it is over
    /// [`OLDEST_ACK_LIMIT`]: the renewals are the load the controller judges, so setting up
    /// more nodes must never starve them.
    oldest_ack_ms: AtomicU64,
    /// The longest gap between two acknowledged renewals of one live node so far, µs.
    max_gap_us: AtomicU64,
    renew_ok: AtomicU64,
    renew_err: AtomicU64,
    /// Request latency of each successful renewal, ms.
    renew_ms: Mutex<Vec<f64>>,
    /// Gap between two successive successful renewals of the same node, seconds.
    gaps: Mutex<Vec<f64>>,
}

impl Sim {
    fn new(n: usize) -> Self {
        Sim {
            names: (0..n).map(|i| format!("sim-{i:05}")).collect(),
            alive: (0..n).map(|_| AtomicBool::new(false)).collect(),
            last_renew: (0..n).map(|_| Mutex::new(None)).collect(),
            last_ack: (0..n).map(|_| Mutex::new(None)).collect(),
            stop: AtomicBool::new(false),
            oldest_ack_ms: AtomicU64::new(0),
            max_gap_us: AtomicU64::new(0),
            renew_ok: AtomicU64::new(0),
            renew_err: AtomicU64::new(0),
            renew_ms: Mutex::new(Vec::new()),
            gaps: Mutex::new(Vec::new()),
        }
    }

    fn last_renew(&self, i: usize) -> Option<Timestamp> {
        *self.last_renew[i].lock()
    }

    fn last_ack(&self, i: usize) -> Option<Timestamp> {
        *self.last_ack[i].lock()
    }

    /// How long ago the live node least recently renewed was acknowledged (zero without
    /// live nodes).
    fn oldest_ack_age(&self) -> Duration {
        let now = Timestamp::now();
        (0..self.names.len())
            .filter(|i| self.alive[*i].load(Ordering::Relaxed))
            .filter_map(|i| self.last_ack(i))
            .map(|t| now.duration_since(t).unsigned_abs())
            .max()
            .unwrap_or_default()
    }

    /// Takes the renewal samples gathered so far: (request ms, gaps s).
    fn take_samples(&self) -> (Vec<f64>, Vec<f64>) {
        (
            std::mem::take(&mut *self.renew_ms.lock()),
            std::mem::take(&mut *self.gaps.lock()),
        )
    }
}

/// What the watches saw, with the wall-clock instant each was observed.
#[derive(Default)]
struct Seen {
    /// `FenceHeldDryRun` Events per node (first observation of each Event).
    decisions: Mutex<HashMap<String, Vec<Timestamp>>>,
    event_uids: Mutex<HashSet<String>>,
    /// Instants a node was seen Ready≠True or with the unreachable taint.
    kcm: Mutex<HashMap<String, Vec<Timestamp>>>,
    kcm_state: Mutex<HashMap<String, bool>>,
}

/// Refreshes [`Sim::oldest_ack_ms`] every 250 ms until the run stops.
async fn watch_oldest_ack(sim: Arc<Sim>) {
    while !sim.stop.load(Ordering::Relaxed) {
        let age = sim.oldest_ack_age().as_millis() as u64;
        sim.oldest_ack_ms.store(age, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Renews the Lease of every alive node once per `period`, node `i` at offset `i·period/N`,
/// with at most `concurrency` requests in flight.
async fn renewer(sim: Arc<Sim>, client: Client, period: Duration, concurrency: usize) {
    let leases: Api<Lease> = Api::namespaced(client, LEASE_NS);
    let n = sim.names.len();
    let slot = period.div_f64(n as f64);
    let sem = Arc::new(Semaphore::new(concurrency));
    let start = tokio::time::Instant::now();
    let mut k: u64 = 0;
    while !sim.stop.load(Ordering::Relaxed) {
        tokio::time::sleep_until(start + slot.mul_f64(k as f64)).await;
        let i = (k % n as u64) as usize;
        k += 1;
        if !sim.alive[i].load(Ordering::Relaxed) {
            continue;
        }
        let Ok(permit) = sem.clone().acquire_owned().await else {
            break;
        };
        let (sim, leases) = (sim.clone(), leases.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let t = Timestamp::now();
            let began = Instant::now();
            let patch = json!({"spec": {"renewTime": MicroTime(t)}});
            let r = tokio::time::timeout(
                Duration::from_secs(10),
                leases.patch(
                    &sim.names[i],
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                ),
            )
            .await;
            if matches!(r, Ok(Ok(_))) {
                sim.renew_ok.fetch_add(1, Ordering::Relaxed);
                sim.renew_ms
                    .lock()
                    .push(began.elapsed().as_secs_f64() * 1000.0);
                let prev = sim.last_renew[i].lock().replace(t);
                *sim.last_ack[i].lock() = Some(Timestamp::now());
                if let Some(prev) = prev {
                    let gap = t.duration_since(prev);
                    sim.gaps.lock().push(gap.as_secs_f64());
                    let us = u64::try_from(gap.as_micros()).unwrap_or(0);
                    sim.max_gap_us.fetch_max(us, Ordering::Relaxed);
                }
            } else {
                sim.renew_err.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

/// Creates node `i`: the Node, its Ready condition, its Lease (then marks it alive) and its
/// FenceTarget.
async fn create_node(client: &Client, sim: &Sim, i: usize, pods: u32) -> Result<()> {
    let name = &sim.names[i];
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            BENCH_LABEL: "true",
            ZONE_KEY: format!("zone-{}", i % 4),
            "kubernetes.io/hostname": name,
        }},
    }))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating Node {name}"))?;
    let now = Time(Timestamp::now());
    let resources = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
    let status = json!({"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "simulated by palisade-scale-bench",
            "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("setting Node {name} Ready"))?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NS);
    let t = Timestamp::now();
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": LEASE_NS},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": MicroTime(t)},
    }))?;
    leases
        .create(&PostParams::default(), &lease)
        .await
        .with_context(|| format!("creating Lease {name}"))?;
    *sim.last_renew[i].lock() = Some(t);
    *sim.last_ack[i].lock() = Some(Timestamp::now());
    sim.alive[i].store(true, Ordering::Relaxed);
    let targets: Api<FenceTarget> = Api::all(client.clone());
    let target: FenceTarget = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "FenceTarget",
        "metadata": {"name": name},
        "spec": {"levels": [{"name": "ipmi", "devices": [{
            "url": UNUSED_DEVICE, "kind": "Power", "timeoutSeconds": 20,
            "credentialsSecretRef": {"name": NEVER_READ_SECRET, "namespace": SYSTEM_NS},
        }]}]},
    }))?;
    targets
        .create(&PostParams::default(), &target)
        .await
        .with_context(|| format!("creating FenceTarget {name}"))?;
    let api: Api<Pod> = Api::namespaced(client.clone(), POD_NS);
    for j in 0..pods {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-{j}"), "namespace": POD_NS,
                         "labels": {"app": "scale-bench"}},
            "spec": {"nodeName": name, "containers": [{"name": "c", "image": "none"}]},
        }))?;
        api.create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating Pod {name}-{j}"))?;
    }
    Ok(())
}

/// Records the `FenceHeldDryRun` Events (the controller publishes them in `default`).
async fn watch_decisions(client: Client, seen: Arc<Seen>) {
    let api: Api<Event> = Api::namespaced(client, "default");
    let cfg = watcher::Config::default().fields(&format!("reason={DRY_RUN_REASON}"));
    let stream = watcher(api, cfg).default_backoff().applied_objects();
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        let Ok(ev) = ev else { continue };
        let at = Timestamp::now();
        let uid = ev.uid().unwrap_or_default();
        if !seen.event_uids.lock().insert(uid) {
            continue;
        }
        if let Some(node) = ev.involved_object.name {
            seen.decisions.lock().entry(node).or_default().push(at);
        }
    }
}

/// Records when the node lifecycle controller marks a simulated node unreachable.
async fn watch_nodes(client: Client, seen: Arc<Seen>) {
    let api: Api<Node> = Api::all(client);
    let cfg = watcher::Config::default().labels(&format!("{BENCH_LABEL}=true"));
    let stream = watcher(api, cfg).default_backoff().applied_objects();
    futures::pin_mut!(stream);
    while let Some(node) = stream.next().await {
        let Ok(node) = node else { continue };
        let at = Timestamp::now();
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone());
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == UNREACHABLE_TAINT));
        // No Ready condition yet is a node being created, not a lost one.
        let lost = tainted || ready.is_some_and(|s| s != "True");
        let name = node.name_any();
        let was = seen.kcm_state.lock().insert(name.clone(), lost);
        if lost && was != Some(true) {
            seen.kcm.lock().entry(name).or_default().push(at);
        }
    }
}

/// One line of the controller's log: `decision node=… verdict=…`.
#[derive(Debug, Clone, PartialEq)]
struct LogDecision {
    at: Timestamp,
    node: String,
    verdict: String,
}

/// The controller's decision lines (its `tracing` output, timestamps in UTC to the µs).
fn parse_decisions(log: &str) -> Vec<LogDecision> {
    log.lines()
        .filter_map(|line| {
            let line = palisade_test_support::strip_ansi(line);
            if !line.contains(" decision ") {
                return None;
            }
            let mut words = line.split_whitespace();
            let at: Timestamp = words.next()?.parse().ok()?;
            let field = |key: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .map(str::to_string)
            };
            Some(LogDecision {
                at,
                node: field("node=")?,
                verdict: field("verdict=")?,
            })
        })
        .collect()
}

/// Resident set size and its high-water mark, kB, from `/proc/<pid>/status`.
fn memory_kb(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The fields of `/proc/<pid>/stat` after the command name (field 3 onwards).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// User plus system CPU time of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let f = stat_fields(pid)?;
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The first process whose executable is named `exe` and that `accept`s.
fn find_pid(exe: &str, accept: impl Fn(u32) -> bool) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .is_some_and(|p| p.file_name().is_some_and(|n| n == exe))
                && accept(*pid)
        })
}

/// A control-plane process of lab `lab_id` (the lab marks every process it starts).
fn lab_pid(exe: &str, lab_id: &str) -> Option<u32> {
    let marker = format!("{}={lab_id}", "PALISADE_LAB_ID");
    find_pid(exe, |pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .ok()
            .is_some_and(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
    })
}

/// The controller: our child running `palisade-controller`.
fn controller_pid() -> Option<u32> {
    let me = std::process::id().to_string();
    find_pid("palisade-controller", |pid| {
        stat_fields(pid).is_some_and(|f| f.get(1) == Some(&me))
    })
}

/// `palisade_ticks_total` from the controller's `/metrics`.
async fn ticks_total(addr: &str) -> Option<f64> {
    metric(addr, "palisade_ticks_total").await
}

/// One unlabelled sample from the controller's `/metrics`.
async fn metric(addr: &str, name: &str) -> Option<f64> {
    let mut s = tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The processes measured, by role.
struct Pids(Vec<(&'static str, u32)>);

impl Pids {
    fn find(lab_id: &str) -> Result<Self> {
        let mut v = vec![(
            "palisade-controller",
            controller_pid().context("the controller process is not running")?,
        )];
        for exe in ["kube-controller-manager", "kube-apiserver", "etcd"] {
            if let Some(pid) = lab_pid(exe, lab_id) {
                v.push((exe, pid));
            }
        }
        // The load generator itself, to show whether it kept up.
        v.push(("palisade-scale-bench", std::process::id()));
        Ok(Pids(v))
    }

    fn memory(&self) -> Value {
        let mut m = serde_json::Map::new();
        for (role, pid) in &self.0 {
            if let Some((rss, hwm)) = memory_kb(*pid) {
                m.insert(
                    role.to_string(),
                    json!({"vm_rss_kib": rss, "vm_hwm_kib": hwm}),
                );
            }
        }
        Value::Object(m)
    }

    fn cpu(&self) -> BTreeMap<&'static str, u64> {
        self.0
            .iter()
            .filter_map(|(role, pid)| Some((*role, cpu_ticks(*pid)?)))
            .collect()
    }
}

/// Nearest-rank percentiles of a sample, in its unit.
fn stats(v: Vec<f64>) -> Value {
    Stat::of(v).json()
}

/// The headline figures of a run's report (what [`run`] returns): memory and CPU beside
/// kube-controller-manager's, the decision latency, Palisade's detection beside the node
/// lifecycle controller's, and the false alarms.
fn figures(parameters: &Value, r: &Value) -> Vec<Figure> {
    const KCM: &str = "kube-controller-manager";
    const US: &str = "palisade-controller";
    let one = |v: &Value| Stat::of(v.as_f64());
    let mib = |v: &Value| Stat::of(v.as_f64().map(|k| k / 1024.0));
    let stat = |v: &Value| Stat::from_json(v).unwrap_or_default();
    let nodes = &parameters["nodes"];
    let (steady, end) = (&r["steady"]["memory_kib"], &r["memory_end_kib"]);
    let l = &r["latency"];
    vec![
        Figure::new(
            format!("{US} resident memory (VmRSS), steady, {nodes} nodes"),
            "MiB",
            mib(&steady[US]["vm_rss_kib"]),
        )
        .beside(KCM, mib(&steady[KCM]["vm_rss_kib"])),
        Figure::new(
            format!("{US} resident memory (VmRSS), after the silenced nodes"),
            "MiB",
            mib(&end[US]["vm_rss_kib"]),
        )
        .beside(KCM, mib(&end[KCM]["vm_rss_kib"])),
        Figure::new(
            format!("{US} CPU, steady"),
            "% of a core",
            one(&r["steady"]["cpu_percent_of_one_core"][US]),
        )
        .beside(KCM, one(&r["steady"]["cpu_percent_of_one_core"][KCM])),
        Figure::new(
            format!("{US} CPU, while nodes are silenced"),
            "% of a core",
            one(&r["silence_phase"]["cpu_percent_of_one_core"][US]),
        )
        .beside(
            KCM,
            one(&r["silence_phase"]["cpu_percent_of_one_core"][KCM]),
        ),
        Figure::new(
            "threshold → decision (the dry-run Event, seen by a watch)",
            "s",
            stat(&l["threshold_to_decision_event_s"]),
        ),
        Figure::new(
            "threshold → decision (the controller's log)",
            "s",
            stat(&l["threshold_to_decision_log_s"]),
        ),
        Figure::new(
            "last renewal → Palisade's decision",
            "s",
            stat(&l["palisade_detection_s"]),
        )
        .beside(
            format!("{KCM}: last renewal → Unknown or unreachable"),
            stat(&l["kcm_detection_s"]),
        ),
        Figure::new(
            "silenced nodes decided",
            "nodes",
            one(&r["silenced_found"]["decided"]),
        )
        .beside(
            format!("{KCM}: silenced nodes detected"),
            one(&r["silenced_found"]["kcm_detected"]),
        ),
        Figure::new(
            "false alarms: dry-run Events about nodes never silenced",
            "Events",
            one(&r["false_alarms"]["dry_run_events"]),
        ),
        Figure::new(
            format!("false alarms: nodes never silenced that {KCM} marked unreachable"),
            "nodes",
            one(&r["false_alarms"]["kcm_nodes_marked_unreachable"]),
        ),
        Figure::new(
            "NodeFences created (dry run: none may be)",
            "NodeFences",
            one(&r["nodefences_created"]),
        ),
        Figure::new(
            "Lease renewal request of the load generator, steady and silencing",
            "ms",
            stat(&r["renewals"]["request_ms"]),
        ),
        Figure::new(
            "longest gap between two renewals of a live node, creation and warm-up",
            "s",
            one(&r["renewals_create_and_warmup"]["longest_gap_s"]),
        ),
        Figure::new(
            "longest gap between two renewals of a live node, steady and silencing",
            "s",
            one(&r["renewals"]["longest_gap_s"]),
        ),
    ]
}

fn secs_between(later: Timestamp, earlier: Timestamp) -> f64 {
    later.duration_since(earlier).as_secs_f64()
}

/// Samples the controller's `palisade_leader` gauge every 250 ms until `stop`: (seconds since
/// `t0`, leading). A leader whose Lease renewal lapses stops deciding until it renews again.
async fn sample_leadership(
    addr: String,
    t0: Instant,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<Vec<(f64, bool)>>>,
) {
    while !stop.load(Ordering::Relaxed) {
        if let Some(v) = metric(&addr, "palisade_leader").await {
            out.lock().push((t0.elapsed().as_secs_f64(), v > 0.5));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Lapses of leadership in the samples: (count, seconds not leading, longest lapse).
fn lapses(samples: &[(f64, bool)]) -> (usize, f64, f64) {
    let (mut count, mut total, mut longest) = (0, 0.0f64, 0.0f64);
    let mut since: Option<f64> = None;
    for (t, leading) in samples {
        match (since, leading) {
            (None, false) => {
                count += 1;
                since = Some(*t);
            }
            (Some(s), true) => {
                total += t - s;
                longest = longest.max(t - s);
                since = None;
            }
            _ => {}
        }
    }
    if let (Some(s), Some((t, _))) = (since, samples.last()) {
        total += t - s;
        longest = longest.max(t - s);
    }
    (count, total, longest)
}

/// Which nodes to silence: spread evenly over the index range (so over all zones).
fn silenced_indices(n: usize, k: usize) -> Vec<usize> {
    (0..k).map(|j| (j * n) / k + (n / k) / 2).collect()
}

async fn run(args: &Args, setup: &Setup, client: Client, deadline: Instant) -> Result<Value> {
    let deadline_tk = tokio::time::Instant::from_std(deadline);
    let n = args.nodes as usize;
    let sim = Arc::new(Sim::new(n));
    let seen = Arc::new(Seen::default());
    let watches = [
        tokio::spawn(watch_decisions(client.clone(), seen.clone())),
        tokio::spawn(watch_nodes(client.clone(), seen.clone())),
    ];
    tokio::spawn(watch_oldest_ack(sim.clone()));
    let renew = tokio::spawn(renewer(
        sim.clone(),
        client.clone(),
        Duration::from_secs_f64(args.renew_every),
        args.renew_concurrency as usize,
    ));
    let pids = Pids::find(&setup.lab_id)?;
    let mut report = json!({
        "parameters": {
            "nodes": n, "pods_per_node": args.pods_per_node, "silenced": args.silence, "silence_every_s": args.silence_every,
            "renew_every_s": args.renew_every, "suspect_after_s": args.suspect_after,
            "unhealthy_after_s": args.unhealthy_after,
            "create_concurrency": args.create_concurrency,
            "renew_concurrency": args.renew_concurrency,
            "controller_resync": "250ms (palisade_scenario::start_controller)",
            "kcm_node_monitor_grace_s": KCM_GRACE.as_secs(),
            "controller_binary": palisade_lab::bin_path("palisade-controller")?.display().to_string(),
        },
        "lab_start_s": setup.lab_start_s,
        "memory_idle_kib": pids.memory(),
    });

    // 1. Create the nodes, with bounded concurrency.
    eprintln!(
        "[bench] creating {n} nodes (Node, Ready, Lease, FenceTarget, {} pod(s))",
        args.pods_per_node
    );
    let began = Instant::now();
    let created = tokio::time::timeout_at(
        deadline_tk,
        futures::stream::iter(0..n)
            .map(|i| {
                let (client, sim) = (client.clone(), sim.clone());
                async move {
                    // Renewals first: wait while a live node's renewal is overdue.
                    while sim.oldest_ack_ms.load(Ordering::Relaxed)
                        > OLDEST_ACK_LIMIT.as_millis() as u64
                    {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    create_node(&client, &sim, i, args.pods_per_node).await
                }
            })
            .buffer_unordered(args.create_concurrency as usize)
            .collect::<Vec<Result<()>>>(),
    )
    .await;
    let create_s = began.elapsed().as_secs_f64();
    let (ok, errors): (Vec<_>, Vec<_>) = created
        .unwrap_or_default()
        .into_iter()
        .partition(Result::is_ok);
    if let Some(Err(e)) = errors.first() {
        eprintln!("[bench] {} creations failed; first: {e:#}", errors.len());
    }
    eprintln!(
        "[bench] {} nodes created in {create_s:.1} s ({:.0} nodes/s)",
        ok.len(),
        ok.len() as f64 / create_s
    );
    report["create"] = json!({
        "nodes_ok": ok.len(), "nodes_failed": errors.len(), "seconds": create_s,
        "objects_per_s": (ok.len() * (4 + args.pods_per_node as usize)) as f64 / create_s,
    });
    if ok.len() < n {
        eprintln!("[bench] not every node was created; the figures below cover what was");
    }

    // 2. Steady state: two full renew periods at least, and until every node has renewed
    //    within 1.5 periods (bounded), then a CPU window of --settle seconds.
    let warm_began = Instant::now();
    let warm = Duration::from_secs_f64(args.renew_every * 2.0);
    tokio::time::sleep_until((tokio::time::Instant::now() + warm).min(deadline_tk)).await;
    let fresh = Duration::from_secs_f64(args.renew_every * 1.5);
    let warm_until = (tokio::time::Instant::now() + WARM_UP_MORE).min(deadline_tk);
    while tokio::time::Instant::now() < warm_until && sim.oldest_ack_age() > fresh {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (warm_ms, warm_gaps) = sim.take_samples();
    let max_gap = Duration::from_micros(sim.max_gap_us.swap(0, Ordering::Relaxed));
    report["renewals_create_and_warmup"] = json!({
        "warm_up_s": warm_began.elapsed().as_secs_f64(),
        "every_node_renewed_within_s": fresh.as_secs_f64(),
        "steady_at_the_end": sim.oldest_ack_age() <= fresh,
        "request_ms": stats(warm_ms),
        "gap_between_renewals_s": stats(warm_gaps),
        "longest_gap_s": max_gap.as_secs_f64(),
    });
    let renew_before = sim.renew_ok.load(Ordering::Relaxed);
    let fp_before: usize = seen.decisions.lock().values().map(Vec::len).sum();
    eprintln!(
        "[bench] steady state: measuring CPU for {} s ({fp_before} dry-run Events so far)",
        args.settle
    );
    let hz = clock_ticks_per_second();
    let lead_t0 = Instant::now();
    let lead_stop = Arc::new(AtomicBool::new(false));
    let lead_samples: Arc<Mutex<Vec<(f64, bool)>>> = Arc::default();
    let lead_task = tokio::spawn(sample_leadership(
        setup.metrics_addr.clone(),
        lead_t0,
        lead_stop.clone(),
        lead_samples.clone(),
    ));
    let cpu0 = pids.cpu();
    let ticks0 = ticks_total(&setup.metrics_addr).await;
    let t0 = Instant::now();
    tokio::time::sleep_until(
        (tokio::time::Instant::now() + Duration::from_secs(args.settle)).min(deadline_tk),
    )
    .await;
    let window = t0.elapsed().as_secs_f64();
    let cpu1 = pids.cpu();
    let ticks1 = ticks_total(&setup.metrics_addr).await;
    let cpu: BTreeMap<&str, f64> = cpu1
        .iter()
        .filter_map(|(role, t1)| {
            let t0 = cpu0.get(role)?;
            Some((*role, (t1 - t0) as f64 / hz / window * 100.0))
        })
        .collect();
    let renew_rate = (sim.renew_ok.load(Ordering::Relaxed) - renew_before) as f64 / window;
    report["steady"] = json!({
        "window_s": window,
        "cpu_percent_of_one_core": cpu,
        "controller_ticks_per_s": match (ticks0, ticks1) {
            (Some(a), Some(b)) => json!((b - a) / window),
            _ => Value::Null,
        },
        "controller_ticks_expected_per_s": 4.0,
        "lease_renewals_per_s": renew_rate,
        "load_average": bench::load_average(),
        "memory_kib": pids.memory(),
    });
    eprintln!("[bench] steady: {}", report["steady"]);

    // 3. Silence K nodes, one every --silence-every seconds.
    let chosen = silenced_indices(n, args.silence as usize)
        .into_iter()
        .filter(|i| sim.alive[*i].load(Ordering::Relaxed))
        .collect::<Vec<_>>();
    let mut silenced: Vec<(usize, Timestamp)> = Vec::new();
    let silence_t0 = Instant::now();
    let silence_lead_from = lead_t0.elapsed().as_secs_f64();
    let (cpu_s0, ticks_s0) = (pids.cpu(), ticks_total(&setup.metrics_addr).await);
    let every = Duration::from_secs_f64(args.silence_every);
    let mut next = tokio::time::Instant::now();
    for i in &chosen {
        if tokio::time::Instant::now() > deadline_tk {
            break;
        }
        tokio::time::sleep_until(next).await;
        sim.alive[*i].store(false, Ordering::Relaxed);
        silenced.push((*i, Timestamp::now()));
        eprintln!("[bench] silenced {}", sim.names[*i]);
        next += every;
    }

    // 4. Wait for every decision and every node lifecycle detection, bounded.
    let wait_until =
        (tokio::time::Instant::now() + Duration::from_secs(args.wait_after)).min(deadline_tk);
    loop {
        let done = silenced.iter().all(|(i, at)| {
            let name = &sim.names[*i];
            let after = |m: &HashMap<String, Vec<Timestamp>>| {
                m.get(name).is_some_and(|v| v.iter().any(|t| t >= at))
            };
            after(&seen.decisions.lock()) && after(&seen.kcm.lock())
        });
        if done || tokio::time::Instant::now() >= wait_until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let window = silence_t0.elapsed().as_secs_f64();
    let (cpu_s1, ticks_s1) = (pids.cpu(), ticks_total(&setup.metrics_addr).await);
    lead_stop.store(true, Ordering::Relaxed);
    let _ = lead_task.await;
    let samples = std::mem::take(&mut *lead_samples.lock());
    let (steady_lapses, _, _) = lapses(
        &samples
            .iter()
            .copied()
            .filter(|(t, _)| *t < silence_lead_from)
            .collect::<Vec<_>>(),
    );
    let after: Vec<(f64, bool)> = samples
        .iter()
        .copied()
        .filter(|(t, _)| *t >= silence_lead_from)
        .collect();
    let (n_lapses, lapsed_s, longest) = lapses(&after);
    report["silence_phase"] = json!({
        "window_s": window,
        "cpu_percent_of_one_core": cpu_s1.iter().filter_map(|(role, t1)| {
            Some((*role, (t1 - cpu_s0.get(role)?) as f64 / hz / window * 100.0))
        }).collect::<BTreeMap<&str, f64>>(),
        "controller_ticks_per_s": match (ticks_s0, ticks_s1) {
            (Some(a), Some(b)) => json!((b - a) / window),
            _ => Value::Null,
        },
        "leadership_lapses": n_lapses,
        "seconds_not_leading": lapsed_s,
        "longest_lapse_s": longest,
        "leadership_lapses_in_steady_state": steady_lapses,
        "load_average": bench::load_average(),
    });
    report["memory_end_kib"] = pids.memory();
    // dryRun must have produced no NodeFence (nothing that could reach a device).
    let fences: Api<NodeFence> = Api::all(client.clone());
    report["nodefences_created"] = match fences.list(&Default::default()).await {
        Ok(l) => json!(l.items.len()),
        Err(e) => json!(format!("could not list: {e}")),
    };
    sim.stop.store(true, Ordering::Relaxed);
    renew.abort();
    for w in &watches {
        w.abort();
    }

    // 5. Results.
    let log = std::fs::read_to_string(&setup.controller_log).unwrap_or_default();
    let decisions = parse_decisions(&log);
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    report["controller_log"] = json!({
        "leader_election_rounds_failed": count("leader election round failed"),
        "lost_leadership": count("lost leadership"),
        "became_leader": count("became leader"),
        "decision_lines": decisions.len(),
    });
    if let Some(out) = &args.out {
        let copy = out.with_extension("controller.log");
        if std::fs::write(&copy, &log).is_ok() {
            report["controller_log"]["copy"] = json!(copy.display().to_string());
        }
    }
    let silenced_names: HashSet<&str> = silenced
        .iter()
        .map(|(i, _)| sim.names[*i].as_str())
        .collect();
    let unhealthy = Duration::from_secs(u64::from(args.unhealthy_after));
    let mut rows = Vec::new();
    let (mut to_log, mut to_event, mut to_log_ack) = (Vec::new(), Vec::new(), Vec::new());
    let mut to_suspect = Vec::new();
    let (mut pal_detect, mut kcm_detect, mut kcm_over) = (Vec::new(), Vec::new(), Vec::new());
    for (i, silenced_at) in &silenced {
        let name = &sim.names[*i];
        let last = sim.last_renew(*i);
        let threshold = last.and_then(|t| t.checked_add(unhealthy).ok());
        let ack = sim.last_ack(*i);
        let threshold_ack = ack.and_then(|t| t.checked_add(unhealthy).ok());
        let first_after = |v: Option<&Vec<Timestamp>>| {
            v.and_then(|v| v.iter().filter(|t| *t >= silenced_at).min().copied())
        };
        let by_log = decisions
            .iter()
            .filter(|d| &d.node == name && d.verdict == "hold_dry_run" && d.at >= *silenced_at)
            .map(|d| d.at)
            .min();
        let by_event = first_after(seen.decisions.lock().get(name));
        // The controller's own view: when it first called the node Suspect, and every verdict
        // it logged for the node after the silence (a quorum hold on the way shows here).
        let mine: Vec<&LogDecision> = decisions
            .iter()
            .filter(|d| &d.node == name && d.at >= *silenced_at)
            .collect();
        let suspect_log = mine
            .iter()
            .find(|d| d.verdict == "wait_suspect")
            .map(|d| d.at);
        let suspect_ack = ack.and_then(|t| {
            t.checked_add(Duration::from_secs(u64::from(args.suspect_after)))
                .ok()
        });
        let verdicts: Vec<String> = mine
            .iter()
            .map(|d| format!("{}@{}", d.verdict, d.at))
            .collect();
        let kcm = first_after(seen.kcm.lock().get(name));
        let lat = |a: Option<Timestamp>, b: Option<Timestamp>| Some(secs_between(a?, b?));
        let row = json!({
            "node": name, "silenced_at": silenced_at.to_string(),
            "last_renew": last.map(|t| t.to_string()),
            "threshold": threshold.map(|t| t.to_string()),
            "threshold_to_decision_log_s": lat(by_log, threshold),
            "threshold_to_decision_event_s": lat(by_event, threshold),
            "last_renew_ack": ack.map(|t| t.to_string()),
            "ack_threshold_to_decision_log_s": lat(by_log, threshold_ack),
            "ack_suspect_threshold_to_suspect_log_s": lat(suspect_log, suspect_ack),
            "controller_verdicts_after_silence": verdicts,
            "palisade_detection_s": lat(by_event, last),
            "kcm_detection_s": lat(kcm, last),
        });
        to_log.extend(lat(by_log, threshold));
        to_event.extend(lat(by_event, threshold));
        to_log_ack.extend(lat(by_log, threshold_ack));
        to_suspect.extend(lat(suspect_log, suspect_ack));
        pal_detect.extend(lat(by_event, last));
        if let Some(k) = lat(kcm, last) {
            kcm_detect.push(k);
            kcm_over.push(k - KCM_GRACE.as_secs_f64());
        }
        rows.push(row);
    }
    let median = |v: &Vec<f64>| stats(v.clone())["p50"].as_f64();
    let ratio = match (median(&pal_detect), median(&kcm_detect)) {
        (Some(p), Some(k)) if k > 0.0 => json!(p / k),
        _ => Value::Null,
    };
    // Decisions about nodes that were never silenced: false alarms under load.
    let mut false_alarms: BTreeMap<String, usize> = BTreeMap::new();
    for d in decisions
        .iter()
        .filter(|d| !silenced_names.contains(d.node.as_str()))
    {
        *false_alarms.entry(d.verdict.clone()).or_default() += 1;
    }
    let kcm_false = seen
        .kcm
        .lock()
        .keys()
        .filter(|k| !silenced_names.contains(k.as_str()))
        .count();
    let event_false: usize = seen
        .decisions
        .lock()
        .iter()
        .filter(|(k, _)| !silenced_names.contains(k.as_str()))
        .map(|(_, v)| v.len())
        .sum();
    report["per_node"] = json!(rows);
    report["latency"] = json!({
        "threshold_to_decision_log_s": stats(to_log),
        "threshold_to_decision_event_s": stats(to_event),
        "ack_threshold_to_decision_log_s": stats(to_log_ack),
        "ack_suspect_threshold_to_suspect_log_s": stats(to_suspect),
        "palisade_detection_s": stats(pal_detect),
        "kcm_detection_s": stats(kcm_detect),
        "kcm_detection_minus_grace_s": stats(kcm_over),
        "palisade_over_kcm_detection_median_ratio": ratio,
    });
    report["false_alarms"] = json!({
        "controller_log_decisions_by_verdict": false_alarms,
        "dry_run_events": event_false,
        "kcm_nodes_marked_unreachable": kcm_false,
    });
    let (ms, gaps) = sim.take_samples();
    let suspect = f64::from(args.suspect_after);
    report["renewals"] = json!({
        "window": "steady state and silencing (after creation and warm-up)",
        "ok": sim.renew_ok.load(Ordering::Relaxed),
        "failed": sim.renew_err.load(Ordering::Relaxed),
        "request_ms": stats(ms),
        "gaps_longer_than_suspect_after": gaps.iter().filter(|g| **g >= suspect).count(),
        "longest_gap_s": Duration::from_micros(sim.max_gap_us.load(Ordering::Relaxed)).as_secs_f64(),
        "gap_between_renewals_s": stats(gaps),
    });
    report["silenced_found"] = json!({
        "decided": report["latency"]["threshold_to_decision_event_s"]["count"],
        "kcm_detected": report["latency"]["kcm_detection_s"]["count"],
        "of": silenced.len(),
    });
    Ok(report)
}

fn fmt_stats(v: &Value, unit: &str) -> String {
    let f = |k: &str| v[k].as_f64().map_or("-".into(), |x| format!("{x:.3}"));
    format!(
        "n={:<4} p50={:>8} p99={:>8} max={:>8} {unit}",
        v["count"],
        f("p50"),
        f("p99"),
        f("max")
    )
}

/// The console table, from the bench document (the report is its details).
fn print_table(doc: &Value) {
    let r = &doc["details"];
    let parameters = &doc["parameters"];
    let kib = |v: &Value| {
        v.as_u64()
            .map_or("-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
    };
    println!();
    println!("== palisade-scale-bench ==");
    println!(
        "nodes {} (created {} in {:.1} s), silenced {}, renew every {} s, unhealthyAfter {} s, dryRun",
        parameters["nodes"],
        r["create"]["nodes_ok"],
        r["create"]["seconds"].as_f64().unwrap_or(0.0),
        parameters["silenced"],
        parameters["renew_every_s"],
        parameters["unhealthy_after_s"],
    );
    println!(
        "conditions: {} cores, load {} -> {}",
        doc["cpus"], doc["load_average_start"], doc["load_average"]
    );
    println!();
    println!(
        "{:<26} {:>14} {:>14} {:>14} {:>10}",
        "process", "VmRSS steady", "VmHWM steady", "VmRSS end", "CPU steady"
    );
    let steady = &r["steady"]["memory_kib"];
    let end = &r["memory_end_kib"];
    for role in [
        "palisade-controller",
        "kube-controller-manager",
        "kube-apiserver",
        "etcd",
        "palisade-scale-bench",
    ] {
        println!(
            "{:<26} {:>14} {:>14} {:>14} {:>9}%",
            role,
            kib(&steady[role]["vm_rss_kib"]),
            kib(&steady[role]["vm_hwm_kib"]),
            kib(&end[role]["vm_rss_kib"]),
            r["steady"]["cpu_percent_of_one_core"][role]
                .as_f64()
                .map_or("-".into(), |c| format!("{c:.1}")),
        );
    }
    println!(
        "controller ticks/s {} (expected 4), lease renewals/s {:.1}",
        r["steady"]["controller_ticks_per_s"],
        r["steady"]["lease_renewals_per_s"].as_f64().unwrap_or(0.0)
    );
    println!();
    let l = &r["latency"];
    println!(
        "threshold -> decision (controller log)   {}",
        fmt_stats(&l["threshold_to_decision_log_s"], "s")
    );
    println!(
        "threshold -> decision (Event via watch)  {}",
        fmt_stats(&l["threshold_to_decision_event_s"], "s")
    );
    println!(
        "ack-based threshold -> decision (log)    {}",
        fmt_stats(&l["ack_threshold_to_decision_log_s"], "s")
    );
    println!(
        "ack-based suspect thr. -> Suspect (log)  {}",
        fmt_stats(&l["ack_suspect_threshold_to_suspect_log_s"], "s")
    );
    println!(
        "last renew -> Palisade decision          {}",
        fmt_stats(&l["palisade_detection_s"], "s")
    );
    println!(
        "last renew -> KCM Unknown/unreachable    {}",
        fmt_stats(&l["kcm_detection_s"], "s")
    );
    println!(
        "KCM detection minus its 40 s grace       {}",
        fmt_stats(&l["kcm_detection_minus_grace_s"], "s")
    );
    println!(
        "Palisade / KCM detection (medians)       {}",
        l["palisade_over_kcm_detection_median_ratio"]
    );
    println!();
    println!(
        "renewals ok {} failed {}; request {}",
        r["renewals"]["ok"],
        r["renewals"]["failed"],
        fmt_stats(&r["renewals"]["request_ms"], "ms")
    );
    println!(
        "gap between renewals of a node           {} ({} >= suspectAfter)",
        fmt_stats(&r["renewals"]["gap_between_renewals_s"], "s"),
        r["renewals"]["gaps_longer_than_suspect_after"]
    );
    println!("false alarms (never-silenced nodes): {}", r["false_alarms"]);
    println!(
        "silenced nodes decided / detected by KCM: {}",
        r["silenced_found"]
    );
    println!("silence phase: {}", r["silence_phase"]);
    println!("controller log: {}", r["controller_log"]);
    println!(
        "NodeFences created (dryRun: must be 0): {}",
        r["nodefences_created"]
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_lines_parse_with_and_without_colours() {
        let log = "\u{1b}[2m2026-11-22T11:01:34.868669Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[2mpalisade_controller::detect\u{1b}[0m\u{1b}[2m:\u{1b}[0m decision \u{1b}[3mnode\u{1b}[0m\u{1b}[2m=\u{1b}[0msim-00001 \u{1b}[3mverdict\u{1b}[0m\u{1b}[2m=\u{1b}[0mhold_dry_run would fence\n\
                   2026-11-22T11:01:35.000001Z  INFO palisade_controller::detect: decision node=m2 verdict=wait_suspect the node is silent\n\
                   2026-11-22T11:01:35.5Z  INFO palisade_controller::detect: NodeFence created node=m2\n";
        let d = parse_decisions(log);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].node, "sim-00001");
        assert_eq!(d[0].verdict, "hold_dry_run");
        assert_eq!(
            d[0].at,
            "2026-11-22T11:01:34.868669Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(d[1].node, "m2");
        assert_eq!(d[1].verdict, "wait_suspect");
    }

    #[test]
    fn leadership_lapses_are_counted_and_timed() {
        let s = [
            (0.0, true),
            (1.0, false),
            (2.0, false),
            (3.0, true),
            (4.0, false),
            (4.5, true),
            (5.0, false),
        ];
        let (n, total, longest) = lapses(&s);
        assert_eq!(n, 3);
        assert!((total - 2.5).abs() < 1e-9);
        assert!((longest - 2.0).abs() < 1e-9);
        assert_eq!(lapses(&[(0.0, true), (1.0, true)]), (0, 0.0, 0.0));
    }

    #[test]
    fn silenced_nodes_are_distinct_and_spread() {
        let v = silenced_indices(2000, 20);
        assert_eq!(v.len(), 20);
        assert_eq!(v.iter().collect::<HashSet<_>>().len(), 20);
        assert!(v.iter().all(|i| *i < 2000));
        assert_eq!(v[1] - v[0], 100);
        let small = silenced_indices(50, 5);
        assert!(small.iter().all(|i| *i < 50));
        assert_eq!(small.iter().collect::<HashSet<_>>().len(), 5);
    }

    #[test]
    fn policy_is_dry_run_and_fences_silent_nodes_without_pods() {
        let args = Args::parse_from(["bench"]);
        let spec = policy_spec(&args);
        assert_eq!(spec["dryRun"], json!(true));
        assert_eq!(spec["fenceWhen"], json!("Always"));
        assert_eq!(spec["detection"]["unhealthyAfterSeconds"], json!(20));
        let parsed: palisade_model::FencingPolicySpec = serde_json::from_value(spec).unwrap();
        assert!(parsed.validate().is_ok());
        assert!(parsed.dry_run);
    }
}
