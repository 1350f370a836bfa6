//! `palisade-checker`: the at-most-one verdict for one volume. Exit 0 on PASS, 1 on a
//! violation (split-brain or data loss), 2 when the logs cannot be read.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Parser;
use palisade_labstore::checker::{analyze, entries_from};
use palisade_labstore::client::DataClient;
use palisade_labstore::record::parse_ack_log;

/// At-most-one checker: split-brain, data loss and handover gap of one volume.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Read the volume file directly (the server's `volumes/NAME.vol`).
    #[arg(long, conflicts_with_all = ["server", "volume"])]
    volume_file: Option<PathBuf>,
    /// Read the volume from the server's data path.
    #[arg(long, requires = "volume")]
    server: Option<SocketAddr>,
    /// Volume name (with --server).
    #[arg(long)]
    volume: Option<String>,
    /// Writer acknowledgement logs (repeatable).
    #[arg(long = "ack-log")]
    ack_logs: Vec<PathBuf>,
}

/// Reads the acknowledgement logs, *then* the volume: the writers may still be writing, and a
/// writer acknowledges a write only once the volume stored it, so every acknowledgement read
/// first has its record in the volume read after. (Read the other way round, a write stored
/// and acknowledged between the two reads looked lost.)
fn run(args: Args) -> anyhow::Result<bool> {
    let mut acks = Vec::new();
    for path in &args.ack_logs {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let parsed = parse_ack_log(&text)
            .map_err(|(line, e)| anyhow::anyhow!("ack log {} line {line}: {e}", path.display()))?;
        acks.extend(parsed);
    }
    let records = match (&args.volume_file, &args.server, &args.volume) {
        (Some(path), _, _) => palisade_labstore::volume::read_file(path)
            .with_context(|| format!("reading {}", path.display()))?,
        (None, Some(server), Some(volume)) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async {
                DataClient::connect(*server, None)
                    .await?
                    .read_all(volume)
                    .await
            })?,
        _ => bail!("give --volume-file, or --server with --volume"),
    };
    let report = analyze(&entries_from(&records), &acks);
    print!("{}", report.render());
    Ok(report.passed())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("palisade-checker: {e:#}");
            ExitCode::from(2)
        }
    }
}
