//! `bridge-bench`: what the bridge adds on top of the executor, measured on loopback.
//!
//! 1. p50/p99 latency of N power-status calls made directly on the executor, then through the
//!    bridge (mTLS, keep-alive connection, policy, rate limit, metrics) with the same executor;
//!    the difference is the bridge's added latency.
//! 2. Throughput of status requests with C concurrent clients (each its own connection and
//!    certificate), bounded by a request count and a wall-clock limit.
//!
//! Everything runs in-process on 127.0.0.1 with the recording executor, so the figures are
//! the bridge's own overhead, not a device's. With `--out FILE.json` the figures are written
//! as a bench document (`palisade_test_support::bench`). Built with the `bench` feature
//! (`cargo build -p palisade-bridge --features bench`), so the daemon's own build carries no
//! benchmark code.

#[path = "common/pki.rs"]
mod pki;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use palisade_bridge::config::{FileConfig, Inventory};
use palisade_bridge::executor::{Executor, RecordingExecutor};
use palisade_bridge::Bridge;
use palisade_fence::bridge::{BridgeClient, ClientSettings};
use palisade_test_support::bench::{self, Figure, Stat};
use pki::Pki;

/// Flags.
#[derive(Debug, Parser)]
#[command(
    name = "bridge-bench",
    about = "Measure the firmware-bridge's added latency and throughput (loopback only)"
)]
struct Args {
    /// Status requests for the latency comparison.
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// Concurrent clients for the throughput run.
    #[arg(long, default_value_t = 50)]
    clients: usize,
    /// Status requests per client in the throughput run.
    #[arg(long, default_value_t = 100)]
    per_client: usize,
    /// Wall-clock limit for the throughput run, seconds.
    #[arg(long, default_value_t = 60)]
    max_seconds: u64,
    /// Use the real executor (`palisade-fence`) on the inventory of this bridge config
    /// instead of the recording executor (its TLS, policy and state settings are replaced by
    /// the bench's own). Only loopback devices, please.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// The statistics of `v`, in microseconds.
fn micros(v: &[Duration]) -> Stat {
    Stat::of(v.iter().map(|d| d.as_secs_f64() * 1e6))
}

fn us(v: Option<f64>) -> String {
    format!("{:.1} µs", v.unwrap_or(f64::NAN))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = palisade_bridge::server::runtime().context("tokio runtime")?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let bench_run = bench::Run::start("bridge");
    let dir = tempfile_dir()?;
    let pki = Pki::new()?;
    let server = pki.issue(vec!["127.0.0.1".into()], "firmware-bridge", true)?;
    let write_private = |name: &str, data: &str| -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, data)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
        Ok(())
    };
    write_private("server.key", &server.1)?;
    std::fs::write(dir.join("server.crt"), &server.0)?;
    std::fs::write(dir.join("ca.crt"), pki.ca.pem())?;
    let mut cfg = String::from(
        "listen = \"127.0.0.1:0\"\nstate_dir = \"state\"\n[tls]\ncert = \"server.crt\"\nkey = \"server.key\"\nclient_ca = \"ca.crt\"\n\
         [rate_limit]\nburst = 1000000\nper_second = 1000000.0\n[[policy]]\nclient = \"cn:bench\"\ntargets = [\"*\"]\n",
    );
    let targets = 10;
    for i in 0..targets {
        cfg.push_str(&format!(
            "[[targets]]\nid = \"m{i}\"\n[[targets.levels]]\ndevices = [{{ url = \"ipmi://admin@127.0.0.1:{}\" }}]\n",
            9000 + i
        ));
    }
    let cfg_path = dir.join("bridge.toml");
    std::fs::write(&cfg_path, cfg)?;
    let mut cfg = FileConfig::load(&cfg_path)?;
    if let Some(path) = &args.config {
        cfg.targets = FileConfig::load(path)?.targets;
    }
    let inv = Inventory::load(&cfg)?;
    let exec: Arc<dyn Executor> = match &args.config {
        None => Arc::new(RecordingExecutor::new()),
        Some(_) => Arc::new(
            palisade_bridge::fence_executor::FenceExecutor::new(&inv)
                .map_err(|e| anyhow::anyhow!(palisade_bridge::error_chain(&e)))?,
        ),
    };
    let executor_name = if args.config.is_some() {
        "palisade-fence executor"
    } else {
        "recording executor"
    };
    let ids: Vec<String> = inv.targets.keys().cloned().collect();
    let first = ids.first().context("the inventory has no target")?.clone();
    let target = inv.targets[&first].clone();
    let bridge = Bridge::new(&cfg, inv, exec.clone(), None)
        .map_err(|e| anyhow::anyhow!(palisade_bridge::error_chain(&e)))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server_task = tokio::spawn(palisade_bridge::server::serve(bridge, listener, async {
        let _ = stop_rx.await;
    }));
    let url: url::Url = format!("https://127.0.0.1:{}/", addr.port()).parse()?;
    let client_for = |cn: &str| -> anyhow::Result<BridgeClient> {
        let (c, k) = pki.issue(vec![], cn, false)?;
        let s = ClientSettings::new(
            url.clone(),
            pki.ca.pem().into_bytes(),
            c.into_bytes(),
            k.into_bytes(),
        );
        Ok(BridgeClient::new(&s)?)
    };

    // 1. Direct executor calls.
    let mut direct = Vec::with_capacity(args.requests);
    for _ in 0..args.requests {
        let t = Instant::now();
        exec.power_status(&target).await?;
        direct.push(t.elapsed());
    }
    // 2. Through the bridge (one client, keep-alive; first request warms the connection).
    let c = client_for("bench")?;
    c.power_status(&first).await?;
    let mut bridged = Vec::with_capacity(args.requests);
    for _ in 0..args.requests {
        let t = Instant::now();
        c.power_status(&first).await?;
        bridged.push(t.elapsed());
    }
    let (direct, bridged) = (micros(&direct), micros(&bridged));
    let added = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
    let added = Stat {
        count: bridged.count,
        min: None,
        p50: added(bridged.p50, direct.p50),
        p99: added(bridged.p99, direct.p99),
        max: None,
    };
    println!(
        "latency over {} power-status requests of target {first} (loopback, {executor_name}):",
        args.requests
    );
    println!(
        "  direct executor : p50 {}  p99 {}",
        us(direct.p50),
        us(direct.p99)
    );
    println!(
        "  through bridge  : p50 {}  p99 {}",
        us(bridged.p50),
        us(bridged.p99)
    );
    println!(
        "  added by bridge : p50 {}  p99 {}",
        us(added.p50),
        us(added.p99)
    );

    // 3. Throughput with N concurrent clients, spread over the targets.
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(client_for("bench")?);
    }
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in clients.into_iter().enumerate() {
        let per = args.per_client;
        let ids = ids.clone();
        set.spawn(async move {
            let (mut ok, mut err) = (0usize, 0usize);
            let mut first_err: Option<String> = None;
            let target = ids[i % ids.len()].clone();
            for _ in 0..per {
                if Instant::now() > deadline {
                    break;
                }
                match c.power_status(&target).await {
                    Ok(_) => ok += 1,
                    Err(e) => {
                        err += 1;
                        first_err.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            (ok, err, first_err)
        });
    }
    let (mut ok, mut err, mut first_err) = (0, 0, None);
    while let Some(r) = set.join_next().await {
        let (o, e, fe) = r?;
        ok += o;
        err += e;
        first_err = first_err.or(fe);
    }
    if let Some(e) = first_err {
        println!("first error: {e}");
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "throughput: {} clients x {} status requests over {} targets: {ok} ok, {err} errors in {secs:.2} s = {:.0} req/s",
        args.clients,
        args.per_client,
        ids.len(),
        ok as f64 / secs
    );
    let _ = stop_tx.send(());
    server_task.await??;
    std::fs::remove_dir_all(&dir).ok();
    if let Some(out) = &args.out {
        let figures = [
            Figure::new(
                format!("power status through the bridge (mTLS, keep-alive), {executor_name}"),
                "µs",
                bridged,
            )
            .beside(format!("the {executor_name} called directly"), direct),
            Figure::new(
                "added by the bridge (through it minus direct, p50 and p99 each)",
                "µs",
                added,
            ),
            Figure::new(
                format!(
                    "throughput: {} clients x {} status requests over {} targets",
                    args.clients,
                    args.per_client,
                    ids.len()
                ),
                "requests/s",
                Stat::of([ok as f64 / secs]),
            ),
            Figure::new(
                "throughput run: failed requests",
                "requests",
                Stat::of([err as f64]),
            ),
        ];
        bench_run
            .write(
                out,
                serde_json::json!({"requests": args.requests, "clients": args.clients,
                    "per_client": args.per_client, "max_seconds": args.max_seconds,
                    "targets": ids.len(), "executor": executor_name}),
                &figures,
                serde_json::json!({"throughput_ok": ok, "throughput_seconds": secs}),
            )
            .with_context(|| format!("writing {}", out.display()))?;
        println!("figures written to {}", out.display());
    }
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("bridge-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
