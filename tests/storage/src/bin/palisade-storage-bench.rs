//! `palisade-storage-bench`: verified block latency and data-path throughput of the lab
//! storage server, in process, on loopback. Bounded in count and time. With `--out FILE.json`
//! the figures are written as a bench document (`palisade_test_support::bench`).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use palisade_labstore::admin_client::AdminClient;
use palisade_labstore::client::DataClient;
use palisade_labstore::pki::TestCa;
use palisade_labstore::server::{self, ServerConfig};
use palisade_storagefw::{NodeRef, Secret, StorageFirewall, StorageFwConfig, Target};
use palisade_test_support::bench::{self, nearest_rank, Figure, Stat};

/// Storage benchmark (loopback only).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Verified block+unblock rounds for the latency figure (max 1000).
    #[arg(long, default_value_t = 50)]
    rounds: u32,
    /// Seconds of the throughput run (max 60).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Record size in bytes for the throughput run.
    #[arg(long, default_value_t = 128)]
    record_bytes: usize,
    /// Directory for the server state (default: a temporary directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

async fn run(args: Args) -> anyhow::Result<()> {
    let bench_run = bench::Run::start("storage");
    let rounds = args.rounds.clamp(1, 1000);
    let seconds = args.seconds.clamp(1, 60);
    let tmp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    let ca = TestCa::new("palisade bench CA")?;
    let srv = ca.issue_server(&["127.0.0.1"])?;
    let token = Secret::new(format!("bench-{}", std::process::id()));
    let running = server::start(ServerConfig {
        state_dir: dir.join("state"),
        data_listener: std::net::TcpListener::bind("127.0.0.1:0")?,
        admin_listener: std::net::TcpListener::bind("127.0.0.1:0")?,
        tls_cert_pem: srv.cert_pem.into_bytes(),
        tls_key_pem: Secret::new(srv.key_pem),
        token: Some(token.clone()),
        client_ca_pem: None,
        volumes: vec!["bench-0".into(), "bench-1".into(), "bench-2".into()],
    })
    .await?;
    let base = format!("https://{}", running.admin_addr);
    let admin = AdminClient::new(&base, ca.cert_pem().as_bytes(), token.clone())?;

    // 1. Verified block latency.
    let target = Target::parse(&format!(
        "storagefw+https://{}/?profile=lab",
        running.admin_addr
    ))?;
    let mut cfg = StorageFwConfig::new(target, ca.cert_pem().into_bytes())?;
    cfg.token = Some(token.clone());
    cfg.verify_interval = Duration::from_millis(5);
    let fw = StorageFirewall::new(cfg)?;
    let node = NodeRef::new("bench-node", vec!["127.0.0.99".parse()?])?;
    let mut lat = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        let t = Instant::now();
        fw.block(&node).await.context("verified block")?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        fw.unblock(&node).await.context("verified unblock")?;
    }
    lat.sort_by(f64::total_cmp);
    let block = Stat::of(lat.iter().copied());
    let p90 = nearest_rank(&lat, 0.9);

    // 2. Throughput with 3 concurrent writers, one volume and one node address each.
    let mut tasks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    for i in 0..3u8 {
        let src: IpAddr = format!("127.0.0.{}", 41 + i).parse()?;
        let vol = format!("bench-{i}");
        admin.grant(&vol, &format!("writer-{i}"), &[src]).await?;
        let data: SocketAddr = running.data_addr;
        let payload = vec![b'x'; args.record_bytes];
        tasks.push(tokio::spawn(async move {
            let mut c = DataClient::connect(data, Some(src)).await?;
            let mut n = 0u64;
            while Instant::now() < deadline && n < 10_000_000 {
                c.append(&vol, payload.clone()).await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let t = Instant::now();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    let elapsed = t.elapsed().as_secs_f64();
    running.shutdown().await;

    let ms = |v: Option<f64>| v.unwrap_or(f64::NAN);
    println!(
        "verified block latency over {rounds} rounds: median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        ms(block.p50),
        ms(p90),
        ms(block.max)
    );
    println!(
        "data path: 3 concurrent writers, {} B records, fsync per record: {total} records in {elapsed:.2} s = {:.0} records/s",
        args.record_bytes,
        total as f64 / elapsed
    );
    println!(
        "{}",
        serde_json::json!({
            "block_latency_ms_median": block.p50,
            "block_latency_ms_p90": p90,
            "rounds": rounds,
            "writers": 3,
            "records": total,
            "seconds": elapsed,
            "records_per_second": total as f64 / elapsed,
        })
    );
    if let Some(out) = &args.out {
        let figures = [
            Figure::new(
                "verified block (block, then read back blocked)",
                "ms",
                block,
            ),
            Figure::new(
                "data path: records appended, 3 writers, fsync per record",
                "records/s",
                Stat::of([total as f64 / elapsed]),
            ),
        ];
        bench_run
            .write(
                out,
                serde_json::json!({"rounds": rounds, "seconds": seconds, "writers": 3,
                    "record_bytes": args.record_bytes}),
                &figures,
                serde_json::json!({"block_latency_ms": lat, "records": total,
                    "throughput_seconds": elapsed}),
            )
            .with_context(|| format!("writing {}", out.display()))?;
        println!("figures written to {}", out.display());
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    tokio::runtime::Runtime::new()?.block_on(run(args))
}
