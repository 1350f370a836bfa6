//! The `palisade-companion` binary: the companion beside a stock kubelet (see
//! `palisade_node::companion`).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use palisade_node::companion::{self, CompanionConfig};
use palisade_node::peer::args::PeerArgs;

fn parse_duration(s: &str) -> Result<Duration, String> {
    palisade_model::duration::parse(s)
}

/// Palisade's companion beside a stock kubelet: answers the controller's recovery challenge
/// with an inventory read from the container runtime's CRI, written on the node's Lease, so
/// that a fenced node rejoins without a person's confirmation.
///
/// With --watchdog it also self-fences: it arms the hardware watchdog (nowayout) after its
/// first write, pets it only while its writes succeed, and past --self-fence-after without one
/// stops every pod through the CRI and lets the watchdog reset the machine, unless a strict
/// majority of the nodes vouch that they cannot write either (the peer check, on by default
/// with --watchdog: a control-plane outage resets no machine). Without it, it promises no
/// self-fence: the node is fenced through its devices, never trusted to have fenced itself.
#[derive(Debug, Parser)]
#[command(name = "palisade-companion", version)]
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
    /// How often the advertisement is written (with --watchdog, at most a quarter of
    /// --watchdog-timeout).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    interval: Duration,
    /// The bound of each call to the API server, and of the whole runtime listing.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    timeout: Duration,
    /// Self-fence with this hardware watchdog device (normally /dev/watchdog; it must exist).
    /// It is armed nowayout: once opened, only a reset or a running companion stops it.
    #[arg(long)]
    watchdog: Option<PathBuf>,
    /// The timeout set on the watchdog (whole seconds).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    watchdog_timeout: Duration,
    /// How often the watchdog is petted (at most a quarter of --watchdog-timeout).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    watchdog_interval: Duration,
    /// With --watchdog: how long after its last successful write the companion stops the pods
    /// and stops petting (more than twice --interval plus four --timeout).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    self_fence_after: Duration,
    /// The companion's own pod UID, which its self-fence spares (a DaemonSet sets it from the
    /// downward API; a host process leaves it out).
    #[arg(long, env = "PALISADE_POD_UID")]
    own_pod_uid: Option<String>,
    /// This node's address, its InternalIP (a DaemonSet sets it from the downward API's
    /// status.hostIP, with hostNetwork): the peer check listens there and peers reach it
    /// there. Needed with the peer check.
    #[arg(long, env = "PALISADE_NODE_ADDRESS")]
    address: Option<IpAddr>,
    /// Logs as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// The peer check (with --watchdog only: it excuses the self-fence during a control-plane
    /// outage).
    #[command(flatten)]
    peer: PeerArgs,
}

impl Args {
    /// The peer check, or `None` when it is off (no --watchdog, or --no-peer-check).
    fn peer(&self) -> anyhow::Result<Option<companion::peer::PeerSetup>> {
        if self.watchdog.is_none() {
            if self.peer.peer_key_file.is_some() {
                bail!("--peer-key-file needs --watchdog: the peer check only excuses a self-fence, and without --watchdog the companion promises none");
            }
            return Ok(None);
        }
        self.peer.validate(self.interval, self.self_fence_after)?;
        let Some(key) = self.peer.key()? else {
            tracing::warn!("peer check off (--no-peer-check): a control-plane outage longer than --self-fence-after resets every machine this companion runs on");
            return Ok(None);
        };
        let Some(address) = self.address else {
            bail!("the peer check needs this node's address (--address or PALISADE_NODE_ADDRESS: its InternalIP, where the peers reach it); or opt out with --no-peer-check");
        };
        Ok(Some(companion::peer::PeerSetup {
            config: self
                .peer
                .config(&self.node_name, self.interval, self.self_fence_after),
            key: Arc::new(key),
            address,
            list_interval: self.peer.peer_list_interval,
        }))
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.interval.is_zero() || args.timeout.is_zero() {
        bail!("--interval and --timeout must be positive");
    }
    palisade_node::cri::parse_endpoint(&args.cri_endpoint)
        .with_context(|| format!("--cri-endpoint {:?}", args.cri_endpoint))?;
    let self_fence = match &args.watchdog {
        Some(path) => {
            if !path.exists() {
                bail!("--watchdog {} does not exist", path.display());
            }
            let sf = companion::SelfFenceConfig {
                watchdog: path.clone(),
                watchdog_timeout: args.watchdog_timeout,
                watchdog_interval: args.watchdog_interval,
                self_fence_after: args.self_fence_after,
                own_pod: args.own_pod_uid.clone().filter(|u| !u.is_empty()),
            };
            if let Some(why) = sf.invalid(args.interval, args.timeout) {
                bail!("{why}");
            }
            Some(sf)
        }
        None => None,
    };
    let (rt, _telemetry) = palisade_node::start(
        "palisade-companion",
        args.log_json,
        palisade_telemetry::OtlpArgs::default(),
    )?;
    let peer = args.peer()?;
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
        tracing::info!(node = %args.node_name, cri = %args.cri_endpoint, watchdog = ?args.watchdog, "companion started: answering recovery challenges from the container runtime");
        companion::run(
            client,
            CompanionConfig {
                node: args.node_name,
                cri_endpoint: args.cri_endpoint,
                interval: args.interval,
                timeout: args.timeout,
                self_fence,
                peer,
            },
        )
        .await
        .context("peer check: listen on --address at --peer-port")?;
        Ok(())
    })
}

/// The companion's reference page (`docs/reference/companion.md`), rendered from the flags'
/// clap definitions and checked against the page on disk.
#[cfg(test)]
mod reference {
    use clap::CommandFactory;
    use palisade_test_support::reference::{self, Page};

    const PAGE: Page = Page {
        path: "docs/reference/companion.md",
        test: "cargo test -p palisade-node --bin palisade-companion reference",
    };

    #[test]
    fn reference_page_is_current() {
        let page = format!(
            "# Reference: the companion\n\n\
             Generated from the code by `{}`; do not edit. The flags come from the command \
             line's definition (`agents/node/src/bin/palisade-companion.rs`); what the \
             companion writes and promises is in `palisade_node::companion` and \
             [choices](../choices.md).\n\n\
             {}",
            PAGE.regenerate(),
            reference::flags_tables(&super::Args::command()),
        );
        PAGE.check(&page);
        for want in ["`--watchdog`", "`--self-fence-after`", "`--cri-endpoint`"] {
            assert!(page.contains(want), "{want}");
        }
    }
}
