//! The `palisade-node` binary: flags, wiring, and the container shim modes.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use palisade_node::cgroup::Hierarchies;
use palisade_node::metrics::Metrics;
use palisade_node::node::{self, NodeConfig};
use palisade_node::pod_worker::{Ctx, FenceState};
use palisade_node::reporter::Reporter;
use palisade_node::runtime::process::ProcessRuntime;
use palisade_node::watchdog_device;
use palisade_node::{shim, source, state::StateStore};

fn parse_duration(s: &str) -> Result<Duration, String> {
    palisade_model::duration::parse(s)
}

/// Palisade's node agent: registers the Node, renews its Lease, runs the pods bound to it as
/// processes, and self-fences when it cannot renew its Lease.
///
/// The peer check is on by default and needs the cluster's shared key: create it once with
/// `palisade-node peer-key generate /etc/palisade-node/peer.key` and copy that file to every
/// node.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    otlp: palisade_telemetry::OtlpArgs,
    /// This node's name.
    #[arg(long, env = "PALISADE_NODE_NAME")]
    node_name: String,
    /// Kubeconfig with this node's client certificate.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The machine's address (InternalIP, podIP and hostIP).
    #[arg(long)]
    address: IpAddr,
    /// Where containers reach the API server, as `HOST:PORT`: set in every container as
    /// `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` (what in-cluster clients read).
    /// Without it, the server address of --kubeconfig (the agent reaches the API there from
    /// this machine; there is no kube-proxy to make the `kubernetes` Service's ClusterIP work).
    #[arg(long)]
    api_service_address: Option<String>,
    /// Directory for durable state.
    #[arg(long, default_value = "/var/lib/palisade-node")]
    state_dir: PathBuf,
    /// Lease duration.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// Lease renew interval (also the node status interval).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    renew_interval: Duration,
    /// Kill the containers of PVC-using pods when the Lease was not renewed for this long
    /// (must be shorter than --lease-duration).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    self_fence_after: Duration,
    /// Self-fence every pod, not only those using a PVC.
    #[arg(long)]
    self_fence_all_pods: bool,
    /// Local image store: `<dir>/<image with / and : as _>/rootfs` (+ optional config.json).
    #[arg(long, default_value = "/var/lib/palisade-node/images")]
    image_store: PathBuf,
    /// Pull images that are not in --image-store from their registries, verifying TLS
    /// against the CA certificates in this PEM file (no other roots are trusted). Without
    /// it, registry pulls are off.
    #[arg(long)]
    registry_ca: Option<PathBuf>,
    /// The content-addressed store of pulled images (default: `<state-dir>/oci`).
    #[arg(long)]
    oci_store: Option<PathBuf>,
    /// Images that run host binaries without a chroot (comma separated).
    #[arg(long, default_value = "host,busybox", value_delimiter = ',')]
    host_images: Vec<String>,
    /// Maximum container restart backoff (1s..300s).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    max_restart_backoff: Duration,
    /// Pod capacity advertised on the Node.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Address of /metrics and /healthz.
    #[arg(long, default_value = "127.0.0.1:10255")]
    metrics_addr: SocketAddr,
    /// Pet this watchdog device (e.g. /dev/watchdog) while the Lease is being renewed, so a
    /// hung agent or one that lost the API gets the machine rebooted. Off by default.
    #[arg(long)]
    watchdog: Option<PathBuf>,
    /// How often to pet the watchdog (less than half of --watchdog-timeout).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    watchdog_interval: Duration,
    /// The timeout the agent sets on the watchdog (whole seconds; the driver may round it, and
    /// the agent advertises what the driver holds).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    watchdog_timeout: Duration,
    /// Do not make the watchdog `nowayout`. A watchdog that a magic close can disarm is never
    /// advertised as one the controller may trust.
    #[arg(long)]
    watchdog_allow_disarm: bool,
    #[command(flatten)]
    peer: palisade_node::peer::args::PeerArgs,
}

impl Args {
    fn validate(&self) -> anyhow::Result<()> {
        if self.renew_interval.is_zero() || self.renew_interval >= self.lease_duration {
            bail!("--renew-interval must be positive and shorter than --lease-duration");
        }
        if self.self_fence_after >= self.lease_duration {
            bail!("--self-fence-after must be shorter than --lease-duration, or the controller could release pods that still run");
        }
        if self.self_fence_after <= self.renew_interval {
            bail!("--self-fence-after must be longer than --renew-interval");
        }
        if self.max_restart_backoff < Duration::from_secs(1)
            || self.max_restart_backoff > Duration::from_secs(300)
        {
            bail!("--max-restart-backoff must be between 1s and 300s");
        }
        if let Some(ca) = &self.registry_ca {
            let pem =
                std::fs::read(ca).with_context(|| format!("--registry-ca {}", ca.display()))?;
            palisade_node::image::registry::https_client(&pem)
                .map_err(|e| anyhow::anyhow!("--registry-ca {}: {e}", ca.display()))?;
        }
        if let Some(w) = &self.watchdog {
            if self.watchdog_interval.is_zero() {
                bail!("--watchdog-interval must be positive");
            }
            if self.watchdog_timeout <= self.watchdog_interval * 2 {
                bail!("--watchdog-timeout must be more than twice --watchdog-interval");
            }
            if !w.exists() {
                bail!("--watchdog {} does not exist", w.display());
            }
        }
        self.peer
            .validate(self.renew_interval, self.self_fence_after)?;
        if !self.kubeconfig.exists() {
            bail!("--kubeconfig {} does not exist", self.kubeconfig.display());
        }
        Ok(())
    }
}

impl Args {
    /// The peer check's key file, or `None` when the peer check is off (`--no-peer-check`).
    #[cfg(test)]
    fn peer_key_path(&self) -> Option<PathBuf> {
        self.peer.key_path()
    }

    /// Reads the peer check's key, or `None` when the peer check is off (see
    /// [`palisade_node::peer::args::PeerArgs::key`]).
    fn peer_key(&self) -> anyhow::Result<Option<palisade_node::peer::PeerKey>> {
        self.peer.key()
    }

    /// The vouch delay (see [`palisade_node::peer::args::PeerArgs::vouch_after`]).
    #[cfg(test)]
    fn vouch_after(&self) -> Duration {
        self.peer
            .vouch_after(self.renew_interval, self.self_fence_after)
    }

    fn peer_config(&self) -> palisade_node::peer::PeerConfig {
        self.peer
            .config(&self.node_name, self.renew_interval, self.self_fence_after)
    }
}

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    match argv.get(1).map(String::as_str) {
        Some(shim::SHIM_ARG) => {
            let dir = argv.get(2).context("shim: missing directory")?;
            std::process::exit(shim::run_container(std::path::Path::new(dir)));
        }
        Some(shim::SHIM_EXEC_ARG) => {
            let dir = argv.get(2).context("shim-exec: missing directory")?;
            std::process::exit(shim::run_exec(std::path::Path::new(dir), &argv[3..]));
        }
        Some(PEER_KEY_ARG) => return peer_key_command(&argv[1..]),
        _ => {}
    }
    let args = Args::parse();
    args.validate()?;
    let (rt, _telemetry) = palisade_node::start("palisade-node", false, args.otlp.clone())?;
    // Read after the telemetry is up, so that a world-readable key's warning is logged.
    let peer_key = args.peer_key()?;
    rt.block_on(run(args, peer_key))
}

/// The first argument of the key commands (`palisade-node peer-key generate <file>`).
const PEER_KEY_ARG: &str = "peer-key";

/// The peer check's key.
#[derive(Debug, Parser)]
#[command(name = "palisade-node peer-key", bin_name = "palisade-node peer-key")]
enum PeerKeyCommand {
    /// Write a fresh random key to FILE (mode 0600; an existing file is never overwritten).
    /// Run it once and copy the file to every node: the key must be the SAME everywhere.
    Generate {
        /// The key file to create (the agent's default is /etc/palisade-node/peer.key).
        file: PathBuf,
    },
}

/// Runs `palisade-node peer-key ...`; `argv[0]` is `peer-key`.
fn peer_key_command(argv: &[String]) -> anyhow::Result<()> {
    match PeerKeyCommand::parse_from(argv) {
        PeerKeyCommand::Generate { file } => {
            if let Err(e) = palisade_node::peer::generate_key_file(&file) {
                match &e {
                    palisade_node::peer::PeerError::KeyWrite { source, .. }
                        if source.kind() == std::io::ErrorKind::AlreadyExists =>
                    {
                        bail!("{e}: an existing key is never overwritten (to replace the key, remove the file, generate a new one and copy it to every node)")
                    }
                    _ => return Err(e.into()),
                }
            }
            println!(
                "wrote a new peer key to {}: copy this same file (mode 0600) to every node",
                file.display()
            );
            Ok(())
        }
    }
}

async fn run(args: Args, peer_key: Option<palisade_node::peer::PeerKey>) -> anyhow::Result<()> {
    let kc = kube::config::Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("read kubeconfig {}", args.kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .context("kubeconfig")?;
    let api_service = match &args.api_service_address {
        Some(a) => palisade_node::env::ApiService::parse(a)
            .with_context(|| format!("--api-service-address {a:?}"))?,
        None => palisade_node::env::ApiService::of_url(&config.cluster_url)
            .context("the server address of --kubeconfig")?,
    };
    let client = kube::Client::try_from(config).context("kube client")?;
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("create {}", args.state_dir.display()))?;
    let shim_path = std::env::current_exe().context("locate own binary")?;
    let mut cgroups = Hierarchies::detect(std::path::Path::new("/sys/fs/cgroup"));
    if cgroups.is_empty() {
        match Hierarchies::mount_private_v2(&args.state_dir.join("cgroup2")) {
            Ok(h) => cgroups = h,
            Err(e) => {
                tracing::warn!(error = %e, "no cgroup hierarchy: containers are tracked by session only")
            }
        }
    }
    let cgroups = cgroups.nested(&args.node_name);
    tracing::info!(hierarchies = ?cgroups.parents, "cgroup hierarchies");
    let runtime =
        ProcessRuntime::new(&args.state_dir, shim_path, cgroups.clone()).context("runtime")?;
    {
        use palisade_node::runtime::Runtime;
        let known: Vec<String> = runtime.list().into_iter().map(|c| c.id).collect();
        cgroups.remove_stale(&known);
    }
    let store = StateStore::open(&args.state_dir).context("state store")?;
    let metrics = Arc::new(Metrics::default());
    let (fence_tx, fence_rx) = tokio::sync::watch::channel(FenceState {
        active: false,
        all_pods: args.self_fence_all_pods,
    });
    let fence_rx_monitor = fence_rx.clone();
    let images = match &args.registry_ca {
        Some(ca) => {
            let pem = std::fs::read(ca).with_context(|| format!("read {}", ca.display()))?;
            let connector = palisade_node::image::HttpConnector::new(&pem, client.clone())
                .map_err(|e| anyhow::anyhow!("--registry-ca {}: {e}", ca.display()))?;
            let root = args
                .oci_store
                .clone()
                .unwrap_or_else(|| args.state_dir.join("oci"));
            palisade_node::image::ImageService::new(
                &root,
                Arc::new(connector),
                args.image_store.clone(),
            )
            .with_context(|| format!("image store {}", root.display()))?
        }
        None => palisade_node::image::ImageService::disabled(args.image_store.clone()),
    };
    {
        // Images no pod on this node uses go after a grace period.
        let (images, store) = (
            images.clone(),
            StateStore::open(&args.state_dir).context("state store")?,
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(300));
            loop {
                tick.tick().await;
                let live = store.all().into_iter().map(|r| r.uid).collect();
                let removed = images.collect_garbage(&live);
                if !removed.is_empty() {
                    tracing::info!(images = ?removed, "removed images no pod uses");
                }
            }
        });
    }
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        status: Arc::new(Reporter::new(client.clone(), args.node_name.clone())),
        runtime: Arc::new(runtime),
        store,
        node_name: args.node_name.clone(),
        address: args.address,
        api_service,
        image_store: args.image_store.clone(),
        images,
        host_images: args.host_images.clone(),
        max_restart_backoff: args.max_restart_backoff,
        fence: fence_rx.clone(),
        metrics: metrics.clone(),
        volumes_in_use: Default::default(),
        managed: Default::default(),
    });
    let ncfg = NodeConfig {
        name: args.node_name.clone(),
        address: args.address,
        lease_duration: args.lease_duration,
        renew_interval: args.renew_interval,
        self_fence_after: args.self_fence_after,
        fence_all_pods: args.self_fence_all_pods,
        max_pods: args.max_pods,
    };
    // The self-fence clock survives restarts: it starts from the last recorded renewal.
    let last_renewal = node::renewal_age(&args.state_dir, std::time::SystemTime::now());
    if let Some(age) = last_renewal.filter(|a| *a > args.self_fence_after) {
        tracing::warn!(
            age_s = age.as_secs(),
            "last Lease renewal is older than --self-fence-after: self-fencing until it is renewed"
        );
        // Before anything else (no LIST, no worker): kill every container the runtime still
        // holds. Without the API the agent cannot tell which pods use a PVC, so every
        // container counts as eligible; workers restart the others once the API confirms them.
        let out = palisade_node::self_fence::sweep(
            ctx.runtime.as_ref(),
            &|_: &palisade_node::runtime::ContainerInfo| true,
            &metrics,
        )
        .await;
        tracing::warn!(
            killed = out.killed.len(),
            unconfirmed = out.unconfirmed.len(),
            "stale Lease at start: killed the containers found in the runtime"
        );
        if !out.complete() {
            // No watchdog has been opened yet, so none is petted; say so loudly.
            tracing::error!(
                containers = ?out.unconfirmed,
                "stale Lease at start: some containers could not be confirmed dead"
            );
        }
    }
    // While self-fenced, sweep the runtime too: workers fence only the pods they run, and an
    // agent restarted within --self-fence-after while cut off runs none (issue 32 item 11).
    tokio::spawn(palisade_node::self_fence::sweep_while_fenced(
        ctx.runtime.clone(),
        ctx.store.clone(),
        fence_rx.clone(),
        metrics.clone(),
        palisade_node::self_fence::SWEEP_PERIOD,
    ));
    let (renew_tx, renew_rx) = tokio::sync::watch::channel(node::initial_renewal(
        last_renewal,
        args.lease_duration,
        tokio::time::Instant::now(),
    ));
    // Each renewal is recorded as of its send, not its answer.
    tokio::spawn(node::record_renewals(
        renew_rx.clone(),
        args.state_dir.clone(),
    ));
    // The peer check: the write clock the lease loop stamps, the server that answers peers,
    // and the poller that publishes how long a majority excuses us.
    let writes = palisade_node::peer::WriteClock::new();
    let (excused_tx, excused_rx) = tokio::sync::watch::channel(None);
    let peer_check = match peer_key {
        Some(key) => {
            let key = Arc::new(key);
            let pcfg = args.peer_config();
            let listen = SocketAddr::new(args.address, args.peer.peer_port);
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("peer check: listen on {listen}"))?;
            tracing::info!(%listen, vouch_after = ?pcfg.vouch_after, answer_valid = ?pcfg.answer_valid, "peer check enabled");
            tokio::spawn(palisade_node::peer::serve(
                pcfg.clone(),
                key.clone(),
                listener,
                writes.clone(),
                metrics.peer.clone(),
            ));
            let (peers_tx, peers_rx) = tokio::sync::watch::channel(Vec::new());
            // Each renewal advertises the list it was built from; the poller counts the list
            // of the last successful renewal, the set the controller judges us against.
            let book = Arc::new(palisade_node::peer::MemberBook::new(&args.node_name));
            tokio::spawn(palisade_node::peer::node_list_loop(
                client.clone(),
                args.peer.peer_list_interval,
                peers_tx,
            ));
            let needed: Arc<dyn Fn() -> bool + Send + Sync> = {
                let renewed = renew_rx.clone();
                let overdue = args.renew_interval;
                Arc::new(move || renewed.borrow().elapsed() > overdue)
            };
            tokio::spawn(palisade_node::peer::poll(
                pcfg.clone(),
                key,
                book.clone(),
                writes.clone(),
                needed,
                excused_tx,
                metrics.peer.clone(),
            ));
            Some((
                palisade_model::advertise::PeerCheck {
                    vouch_after: pcfg.vouch_after,
                    answer_valid: pcfg.answer_valid,
                    members: None,
                },
                book,
                peers_rx,
            ))
        }
        None => {
            tracing::warn!("peer check off (--no-peer-check): every lost Lease self-fences, so an API-server outage longer than --self-fence-after stops every stateful pod");
            drop(excused_tx);
            None
        }
    };
    let (fence_state_tx, fence_state_rx) = (fence_tx, fence_rx_monitor);
    let (mgr_tx, mgr_rx) = tokio::sync::mpsc::channel(4);
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let watchdog_held = palisade_node::watchdog::Held::default();
    // Whether a hypervisor could pause this machine (freezing its watchdog and clocks), and
    // what the watchdog's expiry does: both advertised, both read once (neither changes while
    // the agent runs; softdog's parameters are read-only).
    let virtualization = palisade_node::virt::detect(&palisade_node::virt::Roots::host());
    tracing::info!(virtualization = virtualization.as_str(), "machine detected");
    let watchdog = match &args.watchdog {
        Some(path) => {
            // Opening a watchdog (and arming it) pets it. After a stale renewal record the
            // self-fence is already under way and the controller counts on the reset the
            // last pet scheduled: open it only once the Lease is renewed again.
            let opens_now =
                palisade_node::watchdog::opens_at_start(last_renewal, args.self_fence_after);
            let opened = if opens_now {
                Some(palisade_node::watchdog::open(path)?)
            } else {
                tracing::warn!(device = %path.display(), "stale Lease at start: the watchdog is opened (which pets it) only once the Lease is renewed");
                None
            };
            // Disarm only once no container has a live process (every container counts: the
            // runtime alone cannot tell which pods use a PVC).
            let may_disarm: Arc<dyn Fn() -> bool + Send + Sync> = {
                let runtime = ctx.runtime.clone();
                Arc::new(move || palisade_node::inventory::live_pods(runtime.as_ref()).is_empty())
            };
            let (m1, m2) = (metrics.clone(), metrics.clone());
            Some(tokio::spawn(palisade_node::watchdog::serve(
                palisade_node::watchdog::Service {
                    cfg: palisade_node::watchdog::WatchdogConfig {
                        path: path.clone(),
                        interval: args.watchdog_interval,
                        max_lease_age: args.self_fence_after,
                    },
                    request: watchdog_device::ArmRequest {
                        timeout: args.watchdog_timeout,
                        nowayout: !args.watchdog_allow_disarm,
                        interval: args.watchdog_interval,
                    },
                    opened,
                    virtualization: virtualization.clone(),
                    held: watchdog_held.clone(),
                    renewed: renew_rx.clone(),
                    excused: excused_rx.clone(),
                    fence: fence_state_rx.clone(),
                    shutdown: shutdown_rx,
                    may_disarm,
                    on_armed: Arc::new(move |a| m1.watchdog_armed(a)),
                    on_arm_failure: Arc::new(move || {
                        m2.watchdog_arm_failures.fetch_add(1, Ordering::Relaxed);
                    }),
                },
            )))
        }
        None => None,
    };
    tokio::spawn(node::fence_monitor(
        ncfg.clone(),
        renew_rx,
        excused_rx,
        fence_state_tx,
        metrics.clone(),
    ));
    let book = peer_check.as_ref().map(|(_, book, _)| book.clone());
    let renew_now = Arc::new(tokio::sync::Notify::new());
    if let Some((_, _, peers)) = &peer_check {
        // A new member list reaches the Lease at once: until a renewal carries it, the
        // controller judges the node against the old list (or none), and so does the poller.
        let (mut peers, renew_now) = (peers.clone(), renew_now.clone());
        tokio::spawn(async move {
            while peers.changed().await.is_ok() {
                renew_now.notify_one();
            }
        });
    }
    // The recovery challenge: the status loop reads it from the Node, each renewal answers it.
    let challenge = node::RecoveryChallenge::default();
    {
        // A new challenge is answered by a renewal at once, not a renew interval later.
        let (challenge, renew_now) = (challenge.clone(), renew_now.clone());
        tokio::spawn(async move {
            loop {
                challenge.changed().await;
                renew_now.notify_one();
            }
        });
    }
    let advertise: node::Advertiser = {
        let ctx = ctx.clone();
        let challenge = challenge.clone();
        let watchdog_held = watchdog_held.clone();
        let virtualization = virtualization.clone();
        // The machine the kubelet's Node reports (`status.nodeInfo.systemUUID`), advertised
        // so that recovery counts an answer only from the machine a fence pinned.
        let system_uuid = node::system_uuid();
        let after = args.self_fence_after;
        let scope = if args.self_fence_all_pods {
            palisade_model::advertise::SelfFenceScope::All
        } else {
            palisade_model::advertise::SelfFenceScope::Stateful
        };
        std::sync::Arc::new(move || {
            // The challenge is read first and the inventory taken after it, inside `answer`:
            // that order is what lets the controller trust the inventory as taken after its
            // release (see palisade_node::inventory::answer).
            let answer =
                palisade_node::inventory::answer(&challenge, ctx.runtime.as_ref(), &ctx.managed);
            palisade_model::advertise::Advertisement {
                self_fence_after: Some(after),
                // What the kernel reported when the agent armed it, while the agent pets it.
                watchdog: watchdog_held.advertised(),
                virtualization: Some(virtualization.clone()),
                scope: Some(scope),
                version: Some(env!("CARGO_PKG_VERSION").to_string()),
                boot_id: node::boot_id(),
                system_uuid: system_uuid.clone(),
                runtime_pods: Some(answer.runtime_pods),
                runtime_source: palisade_model::advertise::RuntimeSource::NodeAgent,
                challenge: answer.challenge,
                peer_check: peer_check.as_ref().map(|(p, book, peers)| {
                    palisade_model::advertise::PeerCheck {
                        members: book.offer(&peers.borrow()),
                        ..*p
                    }
                }),
                companion_written: None,
                companion_stale: None,
            }
        })
    };
    let written: node::Written = {
        Arc::new(move |ad: &palisade_model::advertise::Advertisement| {
            if let (Some(book), Some(set)) = (&book, ad.peer_check.and_then(|p| p.members)) {
                book.written(set);
            }
        })
    };
    tokio::spawn(node::lease_loop(
        client.clone(),
        ncfg.clone(),
        renew_tx,
        metrics.clone(),
        node::Advertising {
            advertise,
            written,
            renew_now,
        },
        writes,
    ));
    tokio::spawn(node::status_loop(
        client.clone(),
        ncfg.clone(),
        ctx.clone(),
        mgr_tx,
        challenge,
    ));
    let metrics_addr = args.metrics_addr;
    tokio::spawn(async move {
        if let Err(e) = palisade_node::server::serve(metrics_addr, metrics).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    tracing::info!(node = %args.node_name, address = %args.address, "palisade-node started");
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("install SIGTERM handler")?;
    tokio::select! {
        _ = source::run(ctx, mgr_rx) => bail!("pod source ended"),
        _ = tokio::signal::ctrl_c() => {}
        _ = sigterm.recv() => {}
    }
    // The one shutdown path. Containers keep running: a restarted agent adopts them.
    tracing::info!("stopping: exiting, containers keep running");
    shutdown_tx.send_replace(true);
    if let Some(w) = watchdog {
        match tokio::time::timeout(Duration::from_secs(2), w).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::error!(error = %e, "watchdog"),
            Ok(Err(e)) => tracing::error!(error = %e, "watchdog task"),
            Err(_) => tracing::error!("watchdog did not disarm in time"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_model::advertise::PeerCheck;
    use std::path::Path;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec![
            "palisade-node",
            "--node-name",
            "n0",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--address",
            "127.0.0.1",
            "--lease-duration",
            "10s",
            "--renew-interval",
            "1s",
            "--peer-key-file",
            "/nonexistent/peer.key",
        ];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("flags parse")
    }

    /// Issue 38: with `--self-fence-after 8s` the default vouch delay was 3.3 s, which leaves
    /// the controller no window to count any node healthy: every peer-checked self-fence then
    /// waited for a healthy majority until its budget ran out.
    #[test]
    fn the_default_vouch_delay_leaves_the_controller_a_healthy_window() {
        let a = args(&["--self-fence-after", "8s"]);
        assert_eq!(a.vouch_after(), Duration::from_secs(6));
        assert_eq!(
            PeerCheck::healthy_window(a.vouch_after()),
            Duration::from_secs(2)
        );
        // The validation gets past the peer check (it stops at the missing kubeconfig).
        let e = a.validate().unwrap_err().to_string();
        assert!(e.contains("--kubeconfig"), "{e}");
    }

    #[test]
    fn a_vouch_delay_the_controller_cannot_use_is_refused_with_the_floor() {
        let e = args(&["--self-fence-after", "8s", "--peer-vouch-after", "3s"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("too short") && e.contains("6s"), "{e}");
        // A self-fence timeout with no room above the floor is refused too.
        let e = args(&["--self-fence-after", "5s"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--self-fence-after"), "{e}");
    }

    /// `args` without its `--peer-key-file`.
    fn args_without_key(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec![
            "palisade-node",
            "--node-name",
            "n0",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--address",
            "127.0.0.1",
            "--lease-duration",
            "10s",
            "--renew-interval",
            "1s",
        ];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)
    }

    /// Issue 32 item 18: the safe setting is the default.
    #[test]
    fn the_peer_check_is_on_by_default_with_the_default_key_path() {
        let a = args_without_key(&["--self-fence-after", "8s"]).unwrap();
        assert_eq!(
            a.peer_key_path(),
            Some(PathBuf::from("/etc/palisade-node/peer.key"))
        );
        // Its timing rules apply without any peer flag: 5 s leaves no room above the floor.
        let e = args_without_key(&["--self-fence-after", "5s"])
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--peer-vouch-after"), "{e}");
        let a = args(&["--self-fence-after", "8s"]);
        assert_eq!(
            a.peer_key_path(),
            Some(PathBuf::from("/nonexistent/peer.key"))
        );
    }

    #[test]
    fn no_peer_check_turns_it_off_and_its_timing_rules_with_it() {
        let a = args_without_key(&["--self-fence-after", "4s", "--no-peer-check"]).unwrap();
        assert_eq!(a.peer_key_path(), None);
        assert!(a.peer_key().unwrap().is_none());
        let e = a.validate().unwrap_err().to_string();
        assert!(e.contains("--kubeconfig"), "{e}");
    }

    #[test]
    fn no_peer_check_with_a_key_file_is_refused() {
        let e = args_without_key(&["--no-peer-check", "--peer-key-file", "/k"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
    }

    /// The error names the path, the command that creates the key, that it must be the same
    /// on every node, and the opt-out with its cost.
    fn assert_explains_the_key(e: &str, path: &Path) {
        for want in [
            &path.display().to_string() as &str,
            "palisade-node peer-key generate",
            "SAME key",
            "--no-peer-check",
            "every lost write self-fences",
            "API-server outage",
        ] {
            assert!(e.contains(want), "{want:?} missing from: {e}");
        }
    }

    #[test]
    fn a_missing_unreadable_or_short_key_is_refused_with_how_to_create_it_or_opt_out() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.key");
        let a = args_without_key(&["--peer-key-file", &missing.display().to_string()]).unwrap();
        let e = a.peer_key().unwrap_err().to_string();
        assert_explains_the_key(&e, &missing);
        assert!(e.contains("--peer-key-file"), "{e}");
        // A directory cannot be read as a key.
        let e = args_without_key(&["--peer-key-file", &dir.path().display().to_string()])
            .unwrap()
            .peer_key()
            .unwrap_err()
            .to_string();
        assert_explains_the_key(&e, dir.path());
        let short = dir.path().join("short.key");
        std::fs::write(&short, [7u8; 31]).unwrap();
        let e = args_without_key(&["--peer-key-file", &short.display().to_string()])
            .unwrap()
            .peer_key()
            .unwrap_err()
            .to_string();
        assert_explains_the_key(&e, &short);
        assert!(e.contains("31 bytes"), "{e}");
        // The default path, in a test environment that has no key there.
        if !Path::new(palisade_node::peer::DEFAULT_KEY_FILE).exists() {
            let e = args_without_key(&[])
                .unwrap()
                .peer_key()
                .unwrap_err()
                .to_string();
            assert_explains_the_key(&e, Path::new(palisade_node::peer::DEFAULT_KEY_FILE));
        }
    }

    #[test]
    fn a_generated_key_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peer.key");
        peer_key_command(&[
            "peer-key".into(),
            "generate".into(),
            path.display().to_string(),
        ])
        .unwrap();
        let a = args_without_key(&["--peer-key-file", &path.display().to_string()]).unwrap();
        assert!(a.peer_key().unwrap().is_some());
        // A second run leaves the key as it was.
        let before = std::fs::read(&path).unwrap();
        assert!(peer_key_command(&[
            "peer-key".into(),
            "generate".into(),
            path.display().to_string(),
        ])
        .is_err());
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn a_peer_list_interval_below_a_second_is_refused() {
        let e = args(&["--self-fence-after", "8s", "--peer-list-interval", "500ms"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--peer-list-interval"), "{e}");
        assert_eq!(
            args(&["--self-fence-after", "8s"]).peer.peer_list_interval,
            Duration::from_secs(60)
        );
    }
}

#[cfg(test)]
mod reference;
