//! Pod workers: one task per pod UID, in one of three phases (`Syncing | Terminating |
//! Terminated`, see [`WorkerPhase`]), as in the kubelet's `pod_workers.go`.
//!
//! One file per phase or concern:
//! - `confirm.rs`: nothing starts before a read of the pod, made after the worker was
//!   registered in [`Ctx::managed`], shows it with the same UID bound to this node (what the
//!   recovery challenge's answer relies on, see [`crate::inventory::answer`]);
//! - `sync.rs` (*Syncing*): prepare volumes, notice exits and restart per `restartPolicy` with
//!   [`RestartBackoff`], and finish a pod that completed by itself;
//! - `start.rs`: init containers in order (sidecars stay up), then the main containers, each
//!   with its configuration built from `image.rs`, the environment and the mounts;
//! - `probes.rs`: startup, liveness and readiness probes and what their verdicts do;
//! - `termination.rs` (*Terminating*, *Terminated*): kill main and regular init containers in
//!   parallel (preStop, then TERM or the stop signal, then KILL at the deadline from
//!   [`crate::grace`]), then sidecars one by one in reverse order; the pod-level grace period
//!   only ever shrinks; once every process is confirmed dead, set the terminal phase, then
//!   DELETE the pod with grace 0 and a UID precondition (only when the API asked for the
//!   deletion);
//! - `self_fence.rs`: while [`FenceState::active`], the containers of fence-eligible pods are
//!   SIGKILLed and not restarted until the API confirms the pod still belongs here;
//! - `status.rs`: the pod status, sent to the [`StatusSink`] whenever it changes.
//!
//! This file holds the worker task itself: the shared [`Ctx`], the commands, the per-container
//! state and the loop that moves a pod from one phase to the next.

mod confirm;
mod image;
mod probes;
mod self_fence;
mod start;
mod status;
mod sync;
mod termination;
#[cfg(test)]
pub(crate) mod testing;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub use image::{sanitize_image, ImageConfig};

use crate::backoff::RestartBackoff;
use crate::metrics::Metrics;
use crate::probe::{ProbeKind, ProbeTracker, Thresholds};
use crate::reporter::{PodRef, StatusSink};
use crate::runtime::Runtime;
use crate::state::{ContainerRecord, PodRecord, StateStore, WorkerPhase};
use crate::status::is_sidecar;
use crate::volumes;

/// How often a syncing worker re-evaluates its pod.
const TICK: Duration = Duration::from_millis(100);

/// The self-fencing state the workers follow.
///
/// While `active`, a syncing worker of a fence-eligible pod SIGKILLs its containers within
/// one sync period (100 ms), again at every sync period for a container not confirmed dead,
/// and starts none until the API confirms the pod, and a terminating
/// one KILLs at once, without waiting for a running preStop hook or the grace period
/// (`self_fence.rs` and `termination.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceState {
    /// The Lease has not been renewed for `--self-fence-after`.
    pub active: bool,
    /// Fence every pod, not only those using a PVC.
    pub all_pods: bool,
}

/// What every worker shares.
pub struct Ctx {
    /// API access for what containers and volumes read: ConfigMaps, Secrets, PVCs, PVs and
    /// VolumeAttachments.
    pub client: kube::Client,
    /// Where the pods' status and Events go.
    pub status: Arc<dyn StatusSink>,
    /// The container runtime.
    pub runtime: Arc<dyn Runtime>,
    /// Durable state.
    pub store: StateStore,
    /// This node's name.
    pub node_name: String,
    /// The machine's address (podIP and hostIP).
    pub address: IpAddr,
    /// Where containers reach the API server (their `KUBERNETES_SERVICE_*` environment).
    pub api_service: crate::env::ApiService,
    /// The local image store.
    pub image_store: PathBuf,
    /// Images pulled from registries (for images not in `image_store`).
    pub images: crate::image::ImageService,
    /// Images that run host binaries without a chroot.
    pub host_images: Vec<String>,
    /// The maximum restart backoff.
    pub max_restart_backoff: Duration,
    /// Self-fencing state.
    pub fence: watch::Receiver<FenceState>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Pod UID → `kubernetes.io/csi/<driver>^<handle>` of its CSI volumes (for the Node's
    /// `status.volumesInUse`).
    pub volumes_in_use: volumes::VolumesInUse,
    /// The pods that have a worker ([`spawn`] registers them), listed in the runtime inventory.
    pub managed: crate::inventory::ManagedPods,
}

/// Commands to a worker besides pod updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerCmd {
    /// The pod object is gone (deleted, replaced, or bound elsewhere): kill at once and
    /// clean up.
    Gone,
}

/// A running worker.
pub struct WorkerHandle {
    /// Latest pod object.
    pub pod_tx: watch::Sender<Pod>,
    /// Commands.
    pub cmd_tx: mpsc::UnboundedSender<WorkerCmd>,
    /// The task.
    pub join: tokio::task::JoinHandle<()>,
}

/// Starts the worker of `pod`, resuming `record` if the agent had one on disk.
///
/// Guarantees: the pod's UID is registered in [`Ctx::managed`] before this returns (so before
/// the worker reads its pod or starts anything), and released only once the worker has finished
/// terminating, every process of the pod's containers confirmed dead. The worker starts no
/// container before a read of the pod made after that registration confirms it (`confirm.rs`),
/// also when it resumes a `record` (its adopted containers keep running meanwhile).
pub fn spawn(ctx: Arc<Ctx>, pod: Pod, record: Option<PodRecord>) -> WorkerHandle {
    let (pod_tx, pod_rx) = watch::channel(pod.clone());
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let pref = PodRef::of(&pod);
    let span = tracing::info_span!("pod", pod = %pref, uid = %pref.uid);
    ctx.managed.register(&pref.uid);
    let join = tokio::spawn(tracing::Instrument::instrument(
        async move {
            let mut w = Worker::new(ctx.clone(), pod, record);
            w.run(pod_rx, cmd_rx).await;
            // Terminated: every process of the pod is confirmed dead, nothing starts again.
            // (A panic skips this: the pod stays listed, the safe side.)
            ctx.managed.release(&pref.uid);
        },
        span,
    ));
    WorkerHandle {
        pod_tx,
        cmd_tx,
        join,
    }
}

/// Kills and forgets the containers of a pod that no longer exists (found on disk only).
pub async fn reap_orphan(ctx: &Ctx, uid: &str) {
    for c in ctx.runtime.list().into_iter().filter(|c| c.pod_uid == uid) {
        if let Err(e) = ctx.runtime.remove(&c.id).await {
            tracing::error!(container = %c.id, error = %e, "cannot kill orphaned container");
            return;
        }
        tracing::info!(container = %c.id, "killed container of a pod that is gone");
    }
    volumes::cleanup(&ctx.store.pod_dir(uid));
    let _ = ctx.store.remove(uid);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Init,
    Sidecar,
    Main,
}

struct Ctr {
    spec: Container,
    kind: Kind,
    id: Option<String>,
    started: Option<(Instant, Timestamp)>,
    state: ContainerState,
    last_state: Option<ContainerStateTerminated>,
    restart_count: i32,
    next_attempt: u32,
    backoff: RestartBackoff,
    restart_at: Option<Instant>,
    init_done: bool,
    ready: bool,
    startup_ok: bool,
    probes: HashMap<ProbeKind, ProbeTracker>,
    /// No restart will happen (policy) and the container has exited.
    finished: bool,
    /// Since when this container has waited for its image to be pulled (the `Pulling` Event
    /// was sent); `None` when no pull is awaited.
    pulling_since: Option<Instant>,
}

impl Ctr {
    fn running(&self) -> bool {
        self.id.is_some() && self.state.running.is_some()
    }

    fn record(&self) -> ContainerRecord {
        ContainerRecord {
            id: self.id.clone(),
            restart_count: self.restart_count,
            next_attempt: self.next_attempt,
            init_done: self.init_done,
        }
    }

    fn status(&self, image: &str) -> ContainerStatus {
        ContainerStatus {
            name: self.spec.name.clone(),
            image: image.to_string(),
            image_id: String::new(),
            container_id: self.id.as_ref().map(|i| format!("palisade://{i}")),
            ready: self.ready,
            started: Some(self.running() && self.startup_ok),
            restart_count: self.restart_count,
            state: Some(self.state.clone()),
            last_state: self.last_state.clone().map(|t| ContainerState {
                terminated: Some(t),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn set_waiting(&mut self, reason: &str, message: Option<String>) {
        self.state = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message,
            }),
            ..Default::default()
        };
    }
}

struct Worker {
    ctx: Arc<Ctx>,
    pod: Pod,
    pref: PodRef,
    rec: PodRecord,
    ctrs: Vec<Ctr>,
    sandbox: Option<volumes::Prepared>,
    sandbox_error: Option<String>,
    sandbox_retry_at: Option<Instant>,
    status_tx: watch::Sender<Option<PodStatus>>,
    probe_tx: mpsc::UnboundedSender<probes::ProbeResult>,
    probe_rx: mpsc::UnboundedReceiver<probes::ProbeResult>,
    pod_grace: i64,
    pod_failed: bool,
    gone: bool,
    /// A read of the pod made after this worker was registered showed it with the same UID
    /// bound to this node (`confirm.rs`); nothing starts before.
    confirmed: bool,
    /// After a failed confirming read: its backoff, and when the next read is due.
    confirm_retry: Option<(backon::ExponentialBackoff, Instant)>,
}

impl Worker {
    fn new(ctx: Arc<Ctx>, mut pod: Pod, record: Option<PodRecord>) -> Self {
        normalize_sidecars(&mut pod);
        let pref = PodRef::of(&pod);
        let mut rec = record.unwrap_or_else(|| PodRecord {
            uid: pref.uid.clone(),
            namespace: pref.namespace.clone(),
            name: pref.name.clone(),
            phase: WorkerPhase::Syncing,
            fenced: false,
            containers: Default::default(),
            uses_pvc: None,
        });
        // Saved with the record (first thing the worker does), for the runtime-level sweep.
        rec.uses_pvc = Some(volumes::uses_pvc(&pod));
        let spec = pod.spec.clone().unwrap_or_default();
        let mut ctrs = Vec::new();
        let specs = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                (
                    c.clone(),
                    if is_sidecar(c) {
                        Kind::Sidecar
                    } else {
                        Kind::Init
                    },
                )
            })
            .chain(spec.containers.iter().map(|c| (c.clone(), Kind::Main)));
        for (c, kind) in specs {
            let r = rec.containers.get(&c.name).cloned().unwrap_or_default();
            let mut ctr = Ctr {
                spec: c,
                kind,
                id: None,
                started: None,
                state: ContainerState::default(),
                last_state: None,
                restart_count: r.restart_count,
                next_attempt: r.next_attempt,
                backoff: RestartBackoff::new(ctx.max_restart_backoff),
                restart_at: None,
                pulling_since: None,
                init_done: r.init_done,
                ready: false,
                startup_ok: false,
                probes: HashMap::new(),
                finished: false,
            };
            ctr.set_waiting("ContainerCreating", None);
            if let Some(id) = r.id {
                // Adopt: the next tick notices if it has exited meanwhile.
                let info = ctx.runtime.list().into_iter().find(|i| i.id == id);
                let started_at = info.map(|i| i.started_at).unwrap_or_else(Timestamp::now);
                ctr.id = Some(id);
                ctr.started = Some((Instant::now(), started_at));
                ctr.state = ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(started_at)),
                    }),
                    ..Default::default()
                };
                ctr.startup_ok = ctr.spec.startup_probe.is_none();
                ctr.ready = ctr.startup_ok && ctr.spec.readiness_probe.is_none();
                Self::make_probes(&mut ctr);
            }
            ctrs.push(ctr);
        }
        let (status_tx, status_rx) = watch::channel(None);
        tokio::spawn(status::status_loop(
            ctx.status.clone(),
            pref.clone(),
            status_rx,
        ));
        let (probe_tx, probe_rx) = mpsc::unbounded_channel();
        Self {
            ctx,
            pod,
            pref,
            rec,
            ctrs,
            sandbox: None,
            sandbox_error: None,
            sandbox_retry_at: None,
            status_tx,
            probe_tx,
            probe_rx,
            pod_grace: 0,
            pod_failed: false,
            gone: false,
            confirmed: false,
            confirm_retry: None,
        }
    }

    fn make_probes(ctr: &mut Ctr) {
        let now = Instant::now();
        ctr.probes.clear();
        for (kind, p) in [
            (ProbeKind::Startup, &ctr.spec.startup_probe),
            (ProbeKind::Liveness, &ctr.spec.liveness_probe),
            (ProbeKind::Readiness, &ctr.spec.readiness_probe),
        ] {
            if let Some(p) = p {
                ctr.probes
                    .insert(kind, ProbeTracker::new(Thresholds::of(p), now));
            }
        }
    }

    fn save(&mut self) {
        self.rec.containers = self
            .ctrs
            .iter()
            .map(|c| (c.spec.name.clone(), c.record()))
            .collect();
        if let Err(e) = self.ctx.store.save(&self.rec) {
            tracing::error!(error = %e, "cannot save pod state");
        }
    }

    /// The pod's `restartPolicy`, `Always` when unset (the API server's default).
    fn restart_policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    fn event(&self, warning: bool, reason: &str, message: String) {
        let r = self.ctx.status.clone();
        let p = self.pref.clone();
        let reason = reason.to_string();
        tokio::spawn(async move { r.event(&p, warning, &reason, &message).await });
    }

    async fn run(
        &mut self,
        mut pod_rx: watch::Receiver<Pod>,
        mut cmd_rx: mpsc::UnboundedReceiver<WorkerCmd>,
    ) {
        self.ctx
            .metrics
            .workers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let resumed_terminating = self.rec.phase == WorkerPhase::Terminating;
        if resumed_terminating {
            tracing::info!("agent restarted mid-termination: starting termination over with the full grace period");
        }
        self.save();
        loop {
            if self.gone || self.pod.metadata.deletion_timestamp.is_some() {
                break;
            }
            if self.rec.phase == WorkerPhase::Terminated {
                // Completed pod (nothing restarts): wait for the API to remove it.
                tokio::select! {
                    r = pod_rx.changed() => { if r.is_err() { self.gone = true; } else { self.pod = pod_rx.borrow_and_update().clone(); normalize_sidecars(&mut self.pod); } }
                    c = cmd_rx.recv() => { if matches!(c, Some(WorkerCmd::Gone) | None) { self.gone = true; } }
                }
                continue;
            }
            self.sync_once().await;
            tokio::select! {
                r = pod_rx.changed() => {
                    if r.is_err() { self.gone = true; } else { self.pod = pod_rx.borrow_and_update().clone(); normalize_sidecars(&mut self.pod); }
                }
                c = cmd_rx.recv() => {
                    if matches!(c, Some(WorkerCmd::Gone) | None) { self.gone = true; }
                }
                Some(res) = self.probe_rx.recv() => { self.on_probe(res).await; }
                _ = tokio::time::sleep(TICK) => {}
            }
        }
        self.terminate(pod_rx, cmd_rx).await;
        self.ctx
            .metrics
            .workers
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The annotation that marks init containers as sidecars on API servers older than 1.28,
/// which drop the container-level `restartPolicy` field: a comma-separated list of names.
pub const SIDECARS_ANNOTATION: &str = "palisade.dev/sidecars";

/// Applies [`SIDECARS_ANNOTATION`]: the listed init containers get `restartPolicy: Always`.
pub fn normalize_sidecars(pod: &mut Pod) {
    let names: Vec<String> = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIDECARS_ANNOTATION))
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        return;
    }
    for c in pod
        .spec
        .iter_mut()
        .flat_map(|s| s.init_containers.iter_mut().flatten())
    {
        if names.contains(&c.name) {
            c.restart_policy = Some("Always".into());
        }
    }
}

/// Path helper for tests and the binary.
pub fn containers_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("containers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_annotation_marks_init_containers() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"annotations": {"palisade.dev/sidecars": "s1, s2"}},
            "spec": {"initContainers": [{"name": "i"}, {"name": "s1"}, {"name": "s2"}], "containers": [{"name": "m"}]}
        }))
        .unwrap();
        normalize_sidecars(&mut pod);
        let inits = pod.spec.unwrap().init_containers.unwrap();
        let flags: Vec<bool> = inits.iter().map(is_sidecar).collect();
        assert_eq!(flags, vec![false, true, true]);
    }
}
