//! `palisade-controller`: the fencing controller binary. Parses flags, installs the CRDs,
//! starts the caches, the leader election, the detection tick and the metrics server, and
//! drains on SIGTERM / Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use palisade_controller::{cache, crds, detect, leader, server, Ctx, Settings};

/// jemalloc, not the C library's allocator: every tick builds a snapshot of every node and
/// drops it, and with glibc's per-thread arenas that churn held on to memory (330 MiB resident
/// at 10,000 nodes; see `docs/benchmarks.md`). Freed pages go back after a second, purged by
/// jemalloc's background thread (`.cargo/config.toml`, the crate's `background_threads`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Palisade's fencing controller.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    otlp: palisade_telemetry::OtlpArgs,
    /// Kubeconfig to use (default: in-cluster config, then `$KUBECONFIG` / `~/.kube/config`).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Address for `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, default_value = "127.0.0.1:9464")]
    metrics_addr: SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "palisade-system")]
    namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "palisade-controller")]
    lease_name: String,
    /// This replica's identity (default: the host name and process id).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// The node this replica runs on (from the downward API's `spec.nodeName`): the leader
    /// never fences it, it hands leadership over first.
    #[arg(long, env = "PALISADE_NODE_NAME")]
    node_name: Option<String>,
    /// The node that hosts the firmware-bridge, when it runs in the cluster: it is fenced only
    /// through levels with no `bridge://` device (fencing it through the bridge would stop the
    /// bridge half-way).
    #[arg(long, env = "PALISADE_BRIDGE_NODE")]
    bridge_node: Option<String>,
    /// Leader Lease duration.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// Leader Lease renewal interval (must be shorter than the duration).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    renew_interval: Duration,
    /// Detection and requeue period: how often silent nodes are re-evaluated (a node whose
    /// silence reaches a policy threshold between two periods is judged at that moment).
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    resync: Duration,
    /// Do not install the CRDs at start (they are managed elsewhere).
    #[arg(long)]
    skip_crd_install: bool,
    /// Whether the installed CRDs carry the CEL rules: `auto` from Kubernetes 1.25 on (by the
    /// server's reported version), `always`, or `never`. A server that refuses them gets the
    /// CRDs without, and the refusal is logged with its words.
    #[arg(long, value_enum, default_value = "auto")]
    crd_cel: crds::CelMode,
    /// PEM of the CA that signed the firmware-bridge's server certificate (the only root
    /// trusted for `bridge://` devices). With --bridge-cert and --bridge-key.
    #[arg(long, env = "PALISADE_BRIDGE_CA", requires_all = ["bridge_cert", "bridge_key"])]
    bridge_ca: Option<PathBuf>,
    /// PEM of this controller's client certificate for the firmware-bridge.
    #[arg(long, env = "PALISADE_BRIDGE_CERT", requires_all = ["bridge_ca", "bridge_key"])]
    bridge_cert: Option<PathBuf>,
    /// PEM of the key of --bridge-cert (a file, never a flag value).
    #[arg(long, env = "PALISADE_BRIDGE_KEY", requires_all = ["bridge_ca", "bridge_cert"])]
    bridge_key: Option<PathBuf>,
    /// How often the leader checks every FenceTarget's devices (read-only).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    readiness_interval: Duration,
    /// How often the leader reads the power state of every machine with a direct BMC (power
    /// evidence: see the policy's `detection.powerOffAfterSeconds`).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    power_watch_interval: Duration,
    /// Serve the validating admission webhook (HTTPS) on this address; needs --webhook-cert
    /// and --webhook-key.
    #[arg(long, requires_all = ["webhook_cert", "webhook_key"])]
    webhook_addr: Option<std::net::SocketAddr>,
    /// The webhook's serving certificate chain (PEM), e.g. a mounted Secret's tls.crt.
    #[arg(long, requires = "webhook_addr")]
    webhook_cert: Option<PathBuf>,
    /// The webhook's private key (PEM), e.g. a mounted Secret's tls.key.
    #[arg(long, requires = "webhook_addr")]
    webhook_key: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    palisade_model::duration::parse_positive(s)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let _telemetry = palisade_telemetry::init(palisade_telemetry::Setup {
        service: "palisade-controller",
        default_filter: "info,kube=warn",
        json: false,
        otlp: args.otlp.clone(),
    })?;
    if args.renew_interval >= args.lease_duration {
        bail!(
            "--renew-interval ({:?}) must be shorter than --lease-duration ({:?})",
            args.renew_interval,
            args.lease_duration
        );
    }
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let bridge = match (&args.bridge_ca, &args.bridge_cert, &args.bridge_key) {
        (Some(ca), Some(cert), Some(key)) => Some(palisade_fence::bridge::BridgeIdentity {
            // Every bridge request carries the current span's trace context, so the bridge's
            // action spans join the fence's trace.
            trace_context: Some(palisade_telemetry::traceparent),
            ..palisade_fence::bridge::BridgeIdentity::from_files(ca, cert, key)
                .context("loading the firmware-bridge client identity")?
        }),
        _ => None,
    };
    let client = palisade_controller::client(args.kubeconfig.as_deref()).await?;
    if !args.skip_crd_install {
        crds::ensure(&client, Duration::from_secs(60), args.crd_cel)
            .await
            .context("installing the CRDs")?;
    }
    // Election rounds run every renew interval on every replica: three missed in a row are a
    // blind spell (see palisade_controller::sight).
    let sight = std::sync::Arc::new(palisade_controller::sight::Sight::new(
        args.renew_interval.saturating_mul(3),
    ));
    let cache = cache::Cache::start(&client, sight.clone())
        .await
        .context("starting the caches")?;
    tracing::info!(pdb = %cache.pdb_version, "caches ready");
    let leadership =
        leader::Leadership::new(client.clone(), &args.namespace, &args.lease_name, &identity);
    let settings = Settings {
        namespace: args.namespace.clone(),
        lease_name: args.lease_name.clone(),
        identity: identity.clone(),
        lease_duration: args.lease_duration,
        renew_interval: args.renew_interval,
        tick: args.resync,
        bridge,
        node_name: args.node_name.clone().filter(|n| !n.is_empty()),
        bridge_node: args.bridge_node.clone().filter(|n| !n.is_empty()),
    };
    let ctx = Ctx::new(client, settings, cache, leadership.clone());
    let election = tokio::spawn(leadership.run(args.lease_duration, args.renew_interval, sight));
    let ticker = tokio::spawn(detect::run(ctx.clone()));
    tokio::spawn(palisade_controller::config::run(ctx.clone()));
    tokio::spawn(palisade_controller::silent::run(ctx.clone()));
    tokio::spawn(palisade_controller::readiness::run(
        ctx.clone(),
        args.readiness_interval,
    ));
    tokio::spawn(palisade_controller::power::run(
        ctx.clone(),
        args.power_watch_interval,
    ));
    let http = tokio::spawn(server::serve(args.metrics_addr, ctx.clone()));
    if let (Some(addr), Some(cert), Some(key)) =
        (args.webhook_addr, &args.webhook_cert, &args.webhook_key)
    {
        let tls = palisade_controller::webhook::tls_config(cert, key)?;
        let ctx = ctx.clone();
        tokio::spawn(async move {
            if let Err(e) = palisade_controller::webhook::serve(addr, tls, ctx).await {
                tracing::error!(error = %e, "the admission webhook stopped");
            }
        });
    }
    tracing::info!(%identity, lease = %args.lease_name, namespace = %args.namespace, "palisade-controller started");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; shutting down"),
        _ = term.recv() => tracing::info!("terminated; shutting down"),
        r = http => bail!("metrics server stopped: {r:?}"),
    }
    // One shutdown path: stop deciding and renewing; in-flight workers are dropped with the
    // runtime. Every step is persisted before the next begins, so the next leader resumes.
    ticker.abort();
    election.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use palisade_test_support::reference::{self, Page};

    /// The controller's reference page, and the test that writes it.
    const PAGE: Page = Page {
        path: "docs/reference/controller.md",
        test: "cargo test -p palisade-controller --bin palisade-controller reference",
    };

    /// The controller's reference page: every flag from the command line's own definition,
    /// every metric from the registry, every shipped alert.
    fn reference_markdown() -> String {
        use clap::CommandFactory;
        format!(
            "# Reference: the controller\n\n\
             Generated from the code by `{}`; do not edit. The flags come from the command line's \
             definition (`controller/operator/src/main.rs`), the metrics from the registry \
             (`controller/operator/src/metrics.rs`), the alerts from `{}` (their runbooks are in \
             [operations](../operations.md#runbooks-for-the-shipped-alerts-controllermanifestsprometheus-rulesyaml)).\n\n\
             {}\n\
             ## Metrics\n\nServed on `--metrics-addr` at `/metrics` (OpenMetrics text).\n\n\
             {}\n\
             ## Alerts\n\n\
             {}",
            PAGE.regenerate(),
            reference::RULES,
            reference::flags_tables(&Args::command()),
            reference::metrics_table(&reference::metrics(
                &palisade_controller::metrics::Metrics::default().render()
            )),
            reference::alerts_table(&reference::shipped_alerts()),
        )
    }

    #[test]
    fn reference_page_is_current() {
        let page = reference_markdown();
        PAGE.check(&page);
        for want in [
            "`--power-watch-interval`",
            "`palisade_power_reads_total` | counter",
            "`PalisadeFenceFailed`",
        ] {
            assert!(page.contains(want), "{want}");
        }
    }

    #[test]
    fn durations_parse_with_units_and_reject_nonsense() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("4s"), Ok(Duration::from_secs(4)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("0s").is_err());
        assert_eq!(parse_duration("3h"), Ok(Duration::from_secs(3 * 3600)));
        assert!(parse_duration("3d").is_err());
        assert!(parse_duration("x").is_err());
    }
}
