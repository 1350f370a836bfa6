//! `palisade-storage-server`: the lab storage server (data path + HTTPS storage firewall API).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use palisade_labstore::server::{self, ServerConfig};
use palisade_storagefw::Secret;

/// Lab storage server: durable volumes over TCP and an HTTPS admin API that blocks nodes.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Data path listen address.
    #[arg(long)]
    data_listen: SocketAddr,
    /// Create the data listener inside this network namespace (`/run/netns/NAME`).
    #[arg(long)]
    data_netns: Option<String>,
    /// Admin API listen address (loopback).
    #[arg(long)]
    admin_listen: SocketAddr,
    /// Directory for state.json and volume files.
    #[arg(long)]
    state_dir: PathBuf,
    /// Admin API certificate chain (PEM).
    #[arg(long)]
    tls_cert: PathBuf,
    /// Admin API private key (PEM).
    #[arg(long)]
    tls_key: PathBuf,
    /// File holding the admin bearer token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// CA (PEM) whose client certificates are accepted instead of the token.
    #[arg(long)]
    client_ca: Option<PathBuf>,
    /// Volume to create at start (repeatable).
    #[arg(long = "volume")]
    volumes: Vec<String>,
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
    if args.token_file.is_none() && args.client_ca.is_none() {
        bail!("configure --token-file or --client-ca (the admin API never runs unauthenticated)");
    }
    for v in &args.volumes {
        palisade_labstore::volume::validate_name(v)?;
    }
    let token = match &args.token_file {
        Some(p) => {
            let t = Secret::from_file(p).with_context(|| format!("reading {}", p.display()))?;
            if t.is_empty() {
                bail!("token file {} is empty", p.display());
            }
            Some(t)
        }
        None => None,
    };
    let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let tls_cert_pem = read(&args.tls_cert)?;
    let tls_key_pem = Secret::new(String::from_utf8(read(&args.tls_key)?)?);
    let client_ca_pem = args.client_ca.as_ref().map(read).transpose()?;
    let data_listener = match &args.data_netns {
        Some(ns) => palisade_labstore::netns::bind_tcp_in(ns, args.data_listen)
            .with_context(|| format!("binding {} in netns {ns}", args.data_listen))?,
        None => std::net::TcpListener::bind(args.data_listen)
            .with_context(|| format!("binding {}", args.data_listen))?,
    };
    let admin_listener = std::net::TcpListener::bind(args.admin_listen)
        .with_context(|| format!("binding {}", args.admin_listen))?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let running = server::start(ServerConfig {
            state_dir: args.state_dir,
            data_listener,
            admin_listener,
            tls_cert_pem,
            tls_key_pem,
            token,
            client_ca_pem,
            volumes: args.volumes,
        })
        .await?;
        // Readiness line for scripts and tests.
        println!(
            "ready data={} admin={}",
            running.data_addr, running.admin_addr
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        running.shutdown().await;
        anyhow::Ok(())
    })
}
