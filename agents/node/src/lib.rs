//! `palisade-node`: Palisade's node agent, a small kubelet that runs pods as real processes
//! and self-fences when it loses the API.
//!
//! The layering follows the kubelet:
//! - pure core: [`grace`] (the termination arithmetic: TERM, the grace period, KILL), [`backoff`] (restart and retry
//!   backoff), [`status`] (phase and conditions), [`probe`]'s threshold logic;
//! - [`source`] watches the pods bound to this node and hands each to a [`pod_worker`]
//!   (`Syncing | Terminating | Terminated`);
//! - workers drive the [`runtime`] trait ([`runtime::process`]: a process per container,
//!   launched by the [`shim`], tracked in a [`cgroup`]);
//! - [`reporter`] patches pod status and records Events, behind the
//!   [`reporter::StatusSink`] trait the workers use;
//! - [`node`] registers the Node and renews its Lease, and its self-fence monitor kills fence-eligible
//!   pods when the Lease cannot be renewed; [`state`] keeps what the agent was doing on disk;
//! - [`inventory`] is what each renewal advertises for recovery: the pods with a live container
//!   or a pod worker, taken after reading the controller's recovery challenge, which it answers;
//! - [`image`] resolves container images: the directory store, or OCI images pulled from a
//!   registry into a content-addressed store shared by the pods;
//! - [`mod@env`] resolves container environments (fieldRef, configMap/secret keys, envFrom);
//! - [`volumes`] prepares pod volumes and [`mounts`] mounts them at their `mountPath`;
//!   [`server`] serves `/metrics` and `/healthz`;
//!   [`self_fence`] kills fence-eligible containers straight from the runtime;
//!   [`watchdog`] pets a hardware watchdog while the Lease is renewed, and
//!   [`watchdog_device`] sets its timeout and `nowayout`, reads them back and determines what
//!   its expiry does; [`virt`] detects whether the machine is virtual (which a hypervisor can
//!   pause);
//!   [`grpc_health`] is the gRPC health-check client of grpc probes, and [`probe_outcome`]
//!   the outcome type every probe action returns;
//! - [`cri`] reads and stops a stock node's containers through its runtime's CRI socket, over
//!   the gRPC call of [`grpc`]; [`companion`] (the `palisade-companion` binary) runs beside a
//!   stock kubelet and answers the recovery challenge from that inventory;
//! - [`peer`] asks the other nodes, when the Lease cannot be renewed, whether they lost the API
//!   too: a strict majority that did excuses the node from self-fencing.

pub mod backoff;
pub mod cgroup;
pub mod companion;
pub mod cri;
pub mod env;
#[cfg(test)]
mod fake_tree;
pub mod grace;
pub mod grpc;
pub mod grpc_health;
pub mod image;
pub mod inventory;
pub mod ktime;
pub mod metrics;
pub mod mounts;
pub mod node;
pub mod peer;
pub mod pod_worker;
pub mod probe;
pub mod probe_outcome;
pub mod reporter;
pub mod runtime;
pub mod self_fence;
pub mod server;
pub mod shim;
pub mod source;
pub mod state;
pub mod status;
pub mod virt;
pub mod volumes;
pub mod watchdog;
pub mod watchdog_device;

/// What a node-side binary (`palisade-node`, `palisade-companion`) starts with: rustls' `ring`
/// provider, a tokio runtime of two workers, and its telemetry (logs to stderr, as JSON lines
/// with `json`; spans to `otlp`'s endpoint, if any) set up within that runtime. Keep the guard
/// alive for as long as the binary runs.
pub fn start(
    service: &'static str,
    json: bool,
    otlp: palisade_telemetry::OtlpArgs,
) -> anyhow::Result<(tokio::runtime::Runtime, palisade_telemetry::Guard)> {
    use anyhow::Context as _;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let guard = {
        let _in = rt.enter();
        palisade_telemetry::init(palisade_telemetry::Setup {
            service,
            default_filter: "info,kube=warn",
            json,
            otlp,
        })?
    };
    Ok((rt, guard))
}
