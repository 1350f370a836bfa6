//! Palisade's fencing controller: the I/O half of detect → decide → fence → release → recover.
//!
//! The pure parts live elsewhere: the resource types in `palisade-model`, the detector, the
//! decision gates and the `NodeFence` state machine in `palisade-decide`. This crate feeds them
//! from the API server and performs what they return:
//!
//! - [`crds`]: installs (server-side applies) the CRDs at start;
//! - [`cache`]: reflectors for Nodes, node Leases, Pods, PVCs, PDBs (`policy/v1`, or
//!   `policy/v1beta1` on older servers, found by discovery), VolumeAttachments and the Palisade
//!   resources;
//! - [`config`]: the acceptance status of policies and targets, an Event on every change;
//! - [`leader`]: leader election on a coordination Lease with a monotonic fencing token stored
//!   in the Lease; a deposed leader acts on nothing;
//! - [`detect`]: the periodic tick (dead nodes send no events): observe heartbeats on our own
//!   monotonic clock, build a snapshot, decide, create `NodeFence`s, report held decisions;
//! - [`reconcile`]: one worker per unfinished `NodeFence`, asking `palisade_decide::next_step`
//!   for the one next step, performing it and persisting the result before asking again;
//! - [`devices`]: fencing devices (IPMI, SNMP PDU, storage firewall) with credentials from
//!   Secrets; [`release`]: taint, pod release, VolumeAttachment deletion;
//! - [`power`]: the leader's continuous read-only power watch of every direct BMC, the
//!   evidence that fences a machine reported off before the silence threshold;
//! - [`readiness`]: periodic read-only checks of every FenceTarget's devices (status, Events,
//!   metrics);
//! - [`silent`]: the `NodeSilent` mark on the pods of silent nodes (`kubectl get pods` shows it);
//! - [`webhook`]: the validating admission webhook (the same rules, at the door);
//! - [`events`], [`metrics`], [`server`]: Kubernetes Events, metrics (OpenMetrics text on `prometheus-client`), `/healthz`.

pub mod cache;
pub mod config;
pub mod crashpoint;
pub mod crds;
pub mod detect;
pub mod devices;
pub mod error;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod power;
pub mod readiness;
pub mod reconcile;
pub mod release;
pub mod server;
pub mod sight;
pub mod silent;
pub mod webhook;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_decide::{Clocks, Mono};
use parking_lot::Mutex;

pub use error::Error;

/// An API client from `kubeconfig`, or else the usual inference (`$KUBECONFIG`,
/// `~/.kube/config`, in-cluster service account).
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no kubeconfig found (set KUBECONFIG or --kubeconfig), and not in a cluster",
        )?,
    };
    kube::Client::try_from(config).context("building the API client")
}

/// Controller settings (from the command line).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Namespace of the leader-election Lease (and where Events about the controller go).
    pub namespace: String,
    /// Name of the leader-election Lease.
    pub lease_name: String,
    /// This replica's identity in the Lease.
    pub identity: String,
    /// Leader Lease duration.
    pub lease_duration: Duration,
    /// How often the leader renews its Lease.
    pub renew_interval: Duration,
    /// Detection / decision tick.
    pub tick: Duration,
    /// The client identity (pinned CA, client certificate and key) for `bridge://` devices;
    /// `None` when this controller does not fence through a firmware-bridge.
    pub bridge: Option<palisade_fence::bridge::BridgeIdentity>,
    /// The node this replica runs on (the downward API's `spec.nodeName`); the leader hands
    /// leadership over instead of fencing it. `None` when the controller runs outside the
    /// cluster.
    pub node_name: Option<String>,
    /// The node that hosts the firmware-bridge, when it runs in the cluster: it is fenced only
    /// through levels that do not go through the bridge.
    pub bridge_node: Option<String>,
}

/// Everything the loops share.
pub struct Ctx {
    /// API client.
    pub client: kube::Client,
    /// Settings.
    pub settings: Settings,
    /// Reflector stores.
    pub cache: cache::Cache,
    /// Leadership and fencing token.
    pub leader: leader::Leadership,
    /// Metrics registry.
    pub metrics: metrics::Metrics,
    /// Event recorder.
    pub events: events::Recorder,
    /// What this replica remembers of what it observed (heartbeat clocks, advertisements,
    /// streaks, Node sets, quorum-guard holds, verdicts): the decision memory the simulation
    /// shares. Lost with the process: a restarted replica starts every node's clock afresh
    /// and its streaks blind. Lock order: this before [`Ctx::power`].
    pub memory: Mutex<palisade_decide::memory::Memory>,
    /// Held while a worker counts fences in flight and records its own start, so two workers
    /// never both see room under `maxConcurrent` and both start.
    pub start_gate: tokio::sync::Mutex<()>,
    /// `NodeFence`s that have a running worker.
    pub workers: Mutex<HashSet<String>>,
    /// The power watch's runs of off reads ([`power`]; the leader's only).
    pub power: Mutex<palisade_decide::power::PowerWatch>,
    /// The words of each node's latest power read.
    pub power_said: power::Said,
    start: Instant,
}

impl Ctx {
    /// Builds the shared context.
    pub fn new(
        client: kube::Client,
        settings: Settings,
        cache: cache::Cache,
        leader: leader::Leadership,
    ) -> Arc<Self> {
        let metrics = metrics::Metrics::default();
        Arc::new(Self {
            events: events::Recorder::new(client.clone(), settings.identity.clone())
                .counting_drops_in(metrics.events_dropped()),
            client,
            settings,
            cache,
            leader,
            metrics,
            memory: Mutex::new(palisade_decide::memory::Memory::new()),
            start_gate: tokio::sync::Mutex::new(()),
            workers: Mutex::new(HashSet::new()),
            power: Mutex::new(palisade_decide::power::PowerWatch::new()),
            power_said: Mutex::new(HashMap::new()),
            start: Instant::now(),
        })
    }

    /// `at` on our monotonic clock (an instant before the start reads as the start).
    pub fn mono_of(&self, at: Instant) -> Mono {
        Mono(at.saturating_duration_since(self.start))
    }

    /// The instant of `at` on our monotonic clock (the inverse of [`Ctx::mono_of`]).
    pub fn instant_of(&self, at: Mono) -> Instant {
        self.start + at.0
    }

    /// Both clocks now: our monotonic clock (since start) and the wall clock (for persisted
    /// timestamps only).
    pub fn now(&self) -> Clocks {
        Clocks {
            mono: Mono(self.start.elapsed()),
            wall: k8s_openapi::jiff::Timestamp::now(),
        }
    }
}
