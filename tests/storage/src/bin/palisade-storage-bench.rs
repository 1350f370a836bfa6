//! `palisade-storage-bench`: verified block latency and data-path throughput of the lab
//! storage server, in process, on loopback. Bounded in count and time.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use palisade_labstore::admin_client::AdminClient;
use palisade_labstore::client::DataClient;
use palisade_labstore::pki::TestCa;
use palisade_labstore::server::{self, ServerConfig};
use palisade_storagefw::{NodeRef, Secret, StorageFirewall, StorageFwConfig, Target};

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
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

async fn run(args: Args) -> anyhow::Result<()> {
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
        lat.push(t.elapsed());
        fw.unblock(&node).await.context("verified unblock")?;
    }
    lat.sort();

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

    println!(
        "verified block latency over {rounds} rounds: median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        pct(&lat, 0.5).as_secs_f64() * 1e3,
        pct(&lat, 0.9).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    println!(
        "data path: 3 concurrent writers, {} B records, fsync per record: {total} records in {elapsed:.2} s = {:.0} records/s",
        args.record_bytes,
        total as f64 / elapsed
    );
    println!(
        "{}",
        serde_json::json!({
            "block_latency_ms_median": pct(&lat, 0.5).as_secs_f64() * 1e3,
            "block_latency_ms_p90": pct(&lat, 0.9).as_secs_f64() * 1e3,
            "rounds": rounds,
            "writers": 3,
            "records": total,
            "seconds": elapsed,
            "records_per_second": total as f64 / elapsed,
        })
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    tokio::runtime::Runtime::new()?.block_on(run(args))
}
