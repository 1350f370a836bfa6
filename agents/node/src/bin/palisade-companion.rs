//! The `palisade-companion` binary: the companion beside a stock kubelet (see
//! `palisade_node::companion`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use palisade_node::companion::{self, CompanionConfig};

fn parse_duration(s: &str) -> Result<Duration, String> {
    palisade_model::duration::parse(s)
}

/// Palisade's companion beside a stock kubelet: answers the controller's recovery challenge
/// with an inventory read from the container runtime's CRI, written on the node's Lease, so
/// that a fenced node rejoins without a person's confirmation.
///
/// It promises no self-fence: a node that runs only the companion is fenced through its
/// devices, never trusted to have fenced itself.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// This node's name.
    #[arg(long, env = "PALISADE_NODE_NAME")]
    node_name: String,
    /// A kubeconfig with this node's credentials (the kubelet's own: a node may write only its
    /// own Lease). Without it, the in-cluster service account.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The container runtime's CRI endpoint.
    #[arg(long, default_value = palisade_node::cri::DEFAULT_ENDPOINT)]
    cri_endpoint: String,
    /// How often the advertisement is written.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    interval: Duration,
    /// The bound of each call to the API server or the runtime.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    timeout: Duration,
    /// Logs as JSON lines.
    #[arg(long)]
    log_json: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.interval.is_zero() || args.timeout.is_zero() {
        bail!("--interval and --timeout must be positive");
    }
    palisade_node::cri::parse_endpoint(&args.cri_endpoint)
        .with_context(|| format!("--cri-endpoint {:?}", args.cri_endpoint))?;
    let (rt, _telemetry) = palisade_node::start(
        "palisade-companion",
        args.log_json,
        palisade_telemetry::OtlpArgs::default(),
    )?;
    rt.block_on(async {
        let config = match &args.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("read kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                    .await
                    .context("kubeconfig")?
            }
            None => kube::Config::incluster().context("in-cluster config")?,
        };
        let client = kube::Client::try_from(config).context("kube client")?;
        tracing::info!(node = %args.node_name, cri = %args.cri_endpoint, "companion started: answering recovery challenges from the container runtime");
        companion::run(
            client,
            CompanionConfig {
                node: args.node_name,
                cri_endpoint: args.cri_endpoint,
                interval: args.interval,
                timeout: args.timeout,
            },
        )
        .await;
        Ok(())
    })
}
