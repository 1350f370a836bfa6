//! `palisade-attacher`: the lab CSI external-attacher for driver `lab.palisade.dev`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use palisade_labstore::admin_client::AdminClient;
use palisade_labstore::attacher::{self, Context as AttacherContext};
use palisade_storagefw::Secret;

/// Lab CSI attacher: grants nodes at the storage server for VolumeAttachments.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Kubeconfig of the attacher (default: KUBECONFIG or in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Storage admin API base URL, `https://host:port`.
    #[arg(long)]
    admin_url: String,
    /// CA (PEM) of the storage admin API certificate.
    #[arg(long)]
    ca_file: PathBuf,
    /// File holding the admin bearer token.
    #[arg(long)]
    token_file: PathBuf,
    /// Create the CSIDriver object at start.
    #[arg(long)]
    ensure_csi_driver: bool,
    /// Keep the node's grant on detach (model a driver without an unpublish step, such as
    /// NFS, where only a storage fence stops an old node's writes).
    #[arg(long)]
    no_revoke_on_detach: bool,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    if !args.admin_url.starts_with("https://") {
        anyhow::bail!("--admin-url must be https://");
    }
    let ca = std::fs::read(&args.ca_file)
        .with_context(|| format!("reading {}", args.ca_file.display()))?;
    let token = Secret::from_file(&args.token_file)
        .with_context(|| format!("reading {}", args.token_file.display()))?;
    let storage = AdminClient::new(&args.admin_url, &ca, token)?;
    tokio::runtime::Runtime::new()?.block_on(async move {
        let client = match &args.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
                kube::Client::try_from(cfg)?
            }
            None => kube::Client::try_default().await?,
        };
        if args.ensure_csi_driver {
            palisade_labstore::kube_objects::ensure_csi_driver(&client).await?;
        }
        tracing::info!("lab attacher running for driver {}", attacher::DRIVER);
        attacher::run(AttacherContext {
            client,
            storage,
            revoke_on_detach: !args.no_revoke_on_detach,
        })
        .await;
        anyhow::Ok(())
    })
}
