//! `palisade-controller`: the fencing controller binary. Parses flags, installs the CRDs,
//! starts the caches, the leader election, the detection tick and the metrics server, and
//! drains on SIGTERM / Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use palisade_controller::{cache, crds, detect, leader, server, Ctx, Settings};

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
    /// Detection and requeue period: how often silent nodes are re-evaluated.
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
        (Some(ca), Some(cert), Some(key)) => Some(
            palisade_fence::bridge::BridgeIdentity::from_files(ca, cert, key)
                .context("loading the firmware-bridge client identity")?,
        ),
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

    /// The controller's reference page (`docs/reference/controller.md`): every flag from the
    /// command line's own definition, every metric from the registry, every shipped alert from
    /// `controller/manifests/prometheus-rules.yaml`.
    fn reference_markdown(rules_yaml: &str) -> anyhow::Result<String> {
        use clap::CommandFactory;
        use std::fmt::Write as _;
        let cell = |s: &str| {
            s.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .replace('|', "\\|")
        };
        let mut out = String::from(
            "# Reference: the controller\n\n\
             Generated from the code by `PALISADE_WRITE_REFERENCE=1 cargo test -p \
             palisade-controller --bin palisade-controller reference`; do not edit. The flags come \
             from the command line's definition (`controller/operator/src/main.rs`), the metrics \
             from the registry (`controller/operator/src/metrics.rs`), the alerts from \
             `controller/manifests/prometheus-rules.yaml` (their runbooks are in \
             [operations](../operations.md#runbooks-for-the-shipped-alerts-controllermanifestsprometheus-rulesyaml)).\n\n\
             ## Flags of `palisade-controller`\n\n\
             | Flag | Environment | Default | Description |\n|---|---|---|---|\n",
        );
        for a in Args::command().get_arguments() {
            let Some(long) = a.get_long() else { continue };
            let default: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            writeln!(
                out,
                "| `--{long}` | {} | {} | {} |",
                a.get_env()
                    .map(|e| format!("`{}`", e.to_string_lossy()))
                    .unwrap_or_default(),
                if default.is_empty() {
                    String::new()
                } else {
                    format!("`{}`", default.join(","))
                },
                cell(
                    &a.get_long_help()
                        .or(a.get_help())
                        .map(|h| h.to_string())
                        .unwrap_or_default()
                )
            )?;
        }
        out.push_str("\n## Metrics\n\nServed on `--metrics-addr` at `/metrics` (OpenMetrics text).\n\n| Metric | Type | Help |\n|---|---|---|\n");
        let text = palisade_controller::metrics::Metrics::default().render();
        let mut kinds = std::collections::BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, kind)) = rest.split_once(' ') {
                    kinds.insert(name.to_string(), kind.to_string());
                }
            }
        }
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                let kind = kinds.get(name).cloned().unwrap_or_default();
                let shown = if kind == "counter" {
                    format!("{name}_total")
                } else {
                    name.to_string()
                };
                writeln!(out, "| `{shown}` | {kind} | {} |", cell(help))?;
            }
        }
        out.push_str("\n## Alerts\n\n| Alert | Severity | For | Expression | Summary |\n|---|---|---|---|---|\n");
        let rules: serde_json::Value = serde_yaml_ng::from_str(rules_yaml)?;
        for group in rules["groups"].as_array().into_iter().flatten() {
            for r in group["rules"].as_array().into_iter().flatten() {
                let Some(alert) = r["alert"].as_str() else {
                    continue;
                };
                writeln!(
                    out,
                    "| `{alert}` | {} | {} | `{}` | {} |",
                    r["labels"]["severity"].as_str().unwrap_or(""),
                    r["for"].as_str().unwrap_or(""),
                    cell(r["expr"].as_str().unwrap_or("")),
                    cell(r["annotations"]["summary"].as_str().unwrap_or(""))
                )?;
            }
        }
        Ok(out)
    }

    #[test]
    fn reference_page_is_current() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let rules =
            std::fs::read_to_string(format!("{root}/controller/manifests/prometheus-rules.yaml"))
                .unwrap();
        let page = reference_markdown(&rules).unwrap();
        let path = format!("{root}/docs/reference/controller.md");
        if std::env::var("PALISADE_WRITE_REFERENCE").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &page).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == page,
            "docs/reference/controller.md is out of date; run `PALISADE_WRITE_REFERENCE=1 cargo test -p palisade-controller --bin palisade-controller reference`"
        );
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
