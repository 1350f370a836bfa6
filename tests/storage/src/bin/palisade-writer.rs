//! `palisade-writer`: the StatefulSet writer workload. Appends `(pod UID, node, sequence,
//! timestamp)` records to its volume at a steady rate and logs every acknowledgement.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Parser;
use palisade_labstore::client::DataClient;
use palisade_labstore::error::ClientError;
use palisade_labstore::record::{Ack, WriterRecord};

/// Writer workload for the at-most-one proof.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Data path address of the storage server (default: the `server` attribute the node
    /// agent exports for the pod volume, `PALISADE_VOLUME_<POD_VOLUME>_ATTR_SERVER`).
    #[arg(long, env = "STORAGE_SERVER")]
    server: Option<SocketAddr>,
    /// Volume to write (default: the pod volume's CSI handle,
    /// `PALISADE_VOLUME_<POD_VOLUME>_HANDLE`).
    #[arg(long, env = "STORAGE_VOLUME")]
    volume: Option<String>,
    /// Name of the pod volume (in the pod spec) holding the lab CSI volume.
    #[arg(long, env = "WRITER_POD_VOLUME", default_value = "data")]
    pod_volume: String,
    /// This pod's UID.
    #[arg(long, env = "POD_UID")]
    pod_uid: String,
    /// This pod's name (StatefulSet identity).
    #[arg(long, env = "POD_NAME", default_value = "")]
    pod_name: String,
    /// Node this pod runs on.
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// Acknowledgement log (JSON lines, appended).
    #[arg(long, env = "ACK_LOG")]
    ack_log: PathBuf,
    /// Pause between records, ms.
    #[arg(long, env = "WRITE_INTERVAL_MS", default_value_t = 50)]
    interval_ms: u64,
    /// Stop after this many acknowledged records.
    #[arg(long, env = "WRITE_COUNT")]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, env = "WRITE_SECONDS")]
    seconds: Option<u64>,
    /// Local address to connect from (a loopback alias standing for a node).
    #[arg(long, env = "WRITE_SOURCE")]
    source: Option<IpAddr>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The environment prefix the node agent uses for a pod volume's variables.
fn volume_env(pod_volume: &str) -> String {
    let up: String = pod_volume
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("PALISADE_VOLUME_{up}")
}

/// Resolves the server and volume from flags, else from the node agent's volume variables.
fn target(args: &Args) -> anyhow::Result<(SocketAddr, String)> {
    let prefix = volume_env(&args.pod_volume);
    let server = match args.server {
        Some(s) => s,
        None => {
            let var = format!("{prefix}_ATTR_SERVER");
            std::env::var(&var)
                .with_context(|| format!("no --server/STORAGE_SERVER and no {var}"))?
                .parse()
                .with_context(|| format!("{var} is not host:port"))?
        }
    };
    let volume = match &args.volume {
        Some(v) => v.clone(),
        None => {
            let var = format!("{prefix}_HANDLE");
            std::env::var(&var)
                .with_context(|| format!("no --volume/STORAGE_VOLUME and no {var}"))?
        }
    };
    palisade_labstore::volume::validate_name(&volume)?;
    Ok((server, volume))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let (server, volume) = target(&args)?;
    let mut ack_log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.ack_log)
        .with_context(|| format!("opening ack log {}", args.ack_log.display()))?;
    let started = Instant::now();
    let interval = Duration::from_millis(args.interval_ms);
    let mut client: Option<DataClient> = None;
    let (mut seq, mut refused, mut errors) = (0u64, 0u64, 0u64);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        if args.count.is_some_and(|c| seq >= c)
            || args
                .seconds
                .is_some_and(|s| started.elapsed() >= Duration::from_secs(s))
        {
            break;
        }
        if client.is_none() {
            match DataClient::connect(server, args.source).await {
                Ok(c) => client = Some(c),
                Err(e) => {
                    errors += 1;
                    tracing::debug!(error = %e, "connect failed");
                }
            }
        }
        if let Some(c) = client.as_mut() {
            let rec = WriterRecord {
                pod_uid: args.pod_uid.clone(),
                pod: args.pod_name.clone(),
                node: args.node.clone(),
                seq,
                ts_ms: now_ms(),
            };
            match c.append(&volume, serde_json::to_vec(&rec)?).await {
                Ok(offset) => {
                    let ack = Ack {
                        pod_uid: args.pod_uid.clone(),
                        node: args.node.clone(),
                        seq,
                        offset,
                        ack_ms: now_ms(),
                    };
                    let mut line = serde_json::to_vec(&ack)?;
                    line.push(b'\n');
                    ack_log.write_all(&line).context("writing ack log")?;
                    seq += 1;
                }
                Err(ClientError::Refused { code, message }) => {
                    if refused.is_multiple_of(20) {
                        tracing::warn!(?code, message, "write refused");
                    }
                    refused += 1;
                }
                Err(e) => {
                    errors += 1;
                    tracing::info!(error = %e, "write failed; reconnecting");
                    client = None;
                }
            }
        }
        // Back off while the storage refuses us or is unreachable, as a real initiator does.
        let pause = if client.is_none() {
            interval.max(Duration::from_millis(200))
        } else {
            interval
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    println!(
        "writer {} on {}: {} acknowledged, {} refused, {} errors",
        args.pod_uid, args.node, seq, refused, errors
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.pod_uid.is_empty() || args.node.is_empty() {
        bail!("POD_UID and NODE_NAME must not be empty");
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}
