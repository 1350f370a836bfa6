//! `firmware-bridge`: serve the bridge API on the management network.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use palisade_bridge::config::{FileConfig, Inventory};
use palisade_bridge::executor::Executor;
use palisade_bridge::{error_chain, server, Bridge};

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(
    name = "firmware-bridge",
    version,
    about = "Palisade firmware-bridge: mTLS fencing API in front of BMCs, PDUs and storage firewalls"
)]
struct Args {
    /// Config file (TOML).
    #[arg(
        long,
        env = "FIRMWARE_BRIDGE_CONFIG",
        default_value = "/etc/firmware-bridge/bridge.toml"
    )]
    config: PathBuf,
    /// Validate the config, TLS material and credentials, then exit.
    #[arg(long)]
    check: bool,
    /// Log format: `text` or `json` (one object per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    otlp: palisade_telemetry::OtlpArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn build_executor(inventory: &Inventory) -> anyhow::Result<Arc<dyn Executor>> {
    let ex = palisade_bridge::fence_executor::FenceExecutor::new(inventory)
        .map_err(|e| anyhow::anyhow!(error_chain(&e)))?;
    Ok(Arc::new(ex))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let failed = |e: anyhow::Error| {
        let msg = e
            .chain()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(": ");
        tracing::error!("{msg}");
        eprintln!("firmware-bridge: {msg}");
        std::process::ExitCode::FAILURE
    };
    let rt = match server::runtime().context("starting the tokio runtime") {
        Ok(rt) => rt,
        Err(e) => return failed(e),
    };
    let telemetry = {
        let _in = rt.enter();
        palisade_telemetry::init(palisade_telemetry::Setup {
            service: "firmware-bridge",
            default_filter: "info",
            json: matches!(args.log_format, LogFormat::Json),
            otlp: args.otlp.clone(),
        })
    };
    let _telemetry = match telemetry {
        Ok(guard) => guard,
        Err(e) => return failed(e),
    };
    match run(args, &rt) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => failed(e),
    }
}

fn run(args: Args, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = FileConfig::load(&args.config)?;
    let inventory = Inventory::load(&cfg)?;
    // Check the TLS material before touching any device.
    palisade_bridge::tls::server_config(&cfg.tls).map_err(|e| anyhow::anyhow!(error_chain(&e)))?;
    let executor = build_executor(&inventory)?;
    let bridge = Bridge::new(&cfg, inventory, executor, Some(args.config.clone()))
        .map_err(|e| anyhow::anyhow!(error_chain(&e)))?;
    if args.check {
        println!(
            "config {} OK: {} targets",
            args.config.display(),
            cfg.targets.len()
        );
        return Ok(());
    }
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("binding {}", cfg.listen))?;
        tracing::info!(listen = %listener.local_addr()?, targets = bridge_targets(&bridge), "firmware-bridge serving");
        tokio::spawn(server::reload_on_sighup(bridge.clone()));
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("installing the SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        };
        server::serve(bridge, listener, shutdown).await.context("serving")?;
        tracing::info!("stopped");
        Ok(())
    })
}

fn bridge_targets(b: &Bridge) -> String {
    format!("{b:?}")
}

#[cfg(test)]
mod reference;
