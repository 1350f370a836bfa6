//! Pod workers: one task per pod UID, in one of three phases (`Syncing | Terminating |
//! Terminated`, see [`WorkerPhase`]), as in the kubelet's `pod_workers.go`.
//!
//! - *Syncing*: prepare volumes, run init containers in order (sidecars stay up), then the
//!   main containers; restart per `restartPolicy` with [`RestartBackoff`]; run probes; report
//!   status whenever it changes.
//! - *Terminating*: kill main and regular init containers in parallel (preStop, then TERM or
//!   the stop signal, then KILL at the deadline from [`crate::grace`]), then sidecars one by
//!   one in reverse order. The pod-level grace period only ever shrinks.
//! - *Terminated*: every process is confirmed dead; set the terminal phase, then DELETE the
//!   pod with grace 0 and a UID precondition (only when the API asked for the deletion).
//!
//! Self-fencing: while [`FenceState::active`], the containers of fence-eligible pods are
//! SIGKILLed and not restarted until the API confirms the pod still belongs here.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, LifecycleHandler, Pod, PodIP, PodStatus,
};
use nix::sys::signal::Signal;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::backoff::RestartBackoff;
use crate::grace::{effective_pod_grace_period, GraceInputs, KillPlan, KillReason};
use crate::metrics::Metrics;
use crate::probe::{ProbeKind, ProbeOutcome, ProbeTracker, Thresholds};
use crate::reporter::{PodRef, Reporter};
use crate::runtime::{ContainerConfig, Runtime, RuntimeError};
use crate::state::{ContainerRecord, PodRecord, StateStore, WorkerPhase};
use crate::status::{self, is_sidecar, ConditionInputs};
use crate::volumes;

/// How often a syncing worker re-evaluates its pod.
const TICK: Duration = Duration::from_millis(100);

/// The self-fencing state the workers follow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceState {
    /// The Lease has not been renewed for `--self-fence-after`.
    pub active: bool,
    /// Fence every pod, not only those using a PVC.
    pub all_pods: bool,
}

/// What every worker shares.
pub struct Ctx {
    /// API access.
    pub reporter: Reporter,
    /// The container runtime.
    pub runtime: Arc<dyn Runtime>,
    /// Durable state.
    pub store: StateStore,
    /// This node's name.
    pub node_name: String,
    /// The machine's address (podIP and hostIP).
    pub address: IpAddr,
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
    pub volumes_in_use: std::sync::Mutex<std::collections::BTreeMap<String, Vec<String>>>,
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
pub fn spawn(ctx: Arc<Ctx>, pod: Pod, record: Option<PodRecord>) -> WorkerHandle {
    let (pod_tx, pod_rx) = watch::channel(pod.clone());
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let pref = PodRef::of(&pod);
    let span = tracing::info_span!("pod", pod = %pref, uid = %pref.uid);
    let join = tokio::spawn(tracing::Instrument::instrument(
        async move {
            let mut w = Worker::new(ctx, pod, record);
            w.run(pod_rx, cmd_rx).await;
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
    started: Option<(Instant, chrono::DateTime<Utc>)>,
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

struct ProbeResult {
    name: String,
    id: String,
    kind: ProbeKind,
    outcome: ProbeOutcome,
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
    probe_tx: mpsc::UnboundedSender<ProbeResult>,
    probe_rx: mpsc::UnboundedReceiver<ProbeResult>,
    pod_grace: i64,
    pod_failed: bool,
    gone: bool,
}

fn wait_reason(e: &RuntimeError) -> String {
    e.to_string()
}

impl Worker {
    fn new(ctx: Arc<Ctx>, mut pod: Pod, record: Option<PodRecord>) -> Self {
        normalize_sidecars(&mut pod);
        let pref = PodRef::of(&pod);
        let rec = record.unwrap_or_else(|| PodRecord {
            uid: pref.uid.clone(),
            namespace: pref.namespace.clone(),
            name: pref.name.clone(),
            phase: WorkerPhase::Syncing,
            fenced: false,
            containers: Default::default(),
        });
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
                let started_at = info.map(|i| i.started_at).unwrap_or_else(Utc::now);
                ctr.id = Some(id);
                ctr.started = Some((Instant::now(), started_at));
                ctr.state = ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(crate::ktime::time(started_at)),
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
        tokio::spawn(status_loop(ctx.reporter.clone(), pref.clone(), status_rx));
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

    fn event(&self, warning: bool, reason: &str, message: String) {
        let r = self.ctx.reporter.clone();
        let p = self.pref.clone();
        let reason = reason.to_string();
        tokio::spawn(async move { r.event(&p, warning, &reason, &message).await });
    }

    fn fence_eligible(&self) -> bool {
        let f = *self.ctx.fence.borrow();
        f.all_pods || volumes::uses_pvc(&self.pod)
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

    // ---------------------------------------------------------------- syncing

    async fn sync_once(&mut self) {
        // Self-fencing first: it overrides everything else.
        let fence = *self.ctx.fence.borrow();
        if fence.active && self.fence_eligible() && !self.rec.fenced {
            self.self_fence().await;
        }
        if self.rec.fenced {
            if !fence.active {
                self.try_lift_fence().await;
            }
            self.report();
            return;
        }
        if self.sandbox.is_none() {
            if self.sandbox_retry_at.is_some_and(|t| Instant::now() < t) {
                return;
            }
            match volumes::prepare(&self.ctx, &self.pod).await {
                Ok(p) => {
                    self.sandbox = Some(p);
                    self.sandbox_error = None;
                }
                Err(e) => {
                    let msg = format!("MountVolume.SetUp failed: {e}");
                    if self.sandbox_error.as_deref() != Some(&msg) {
                        self.event(true, "FailedMount", msg.clone());
                    }
                    // No container starts without its volumes; each says why it waits.
                    for c in self.ctrs.iter_mut().filter(|c| c.id.is_none()) {
                        c.set_waiting("ContainerCreating", Some(msg.clone()));
                    }
                    self.sandbox_error = Some(msg);
                    self.sandbox_retry_at = Some(Instant::now() + Duration::from_secs(1));
                    self.report();
                    return;
                }
            }
        }
        self.check_exits().await;
        if self.pod_failed {
            self.finish_pod().await;
            return;
        }
        self.start_due().await;
        self.run_probes();
        self.check_completion().await;
        self.report();
    }

    async fn check_exits(&mut self) {
        let policy = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into());
        for i in 0..self.ctrs.len() {
            let Some(id) = self.ctrs[i].id.clone() else {
                continue;
            };
            if !self.ctrs[i].running() {
                continue;
            }
            let exit = match self.ctx.runtime.exit_status(&id) {
                Ok(Some(e)) => e,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(container = %id, error = %e, "cannot read exit status");
                    continue;
                }
            };
            // The main process is gone: nothing else of the container may survive it.
            if let Err(e) = self.ctx.runtime.kill_all(&id).await {
                tracing::error!(container = %id, error = %e, "cannot kill the rest of the container");
            }
            let reason = if exit.code == 0 { "Completed" } else { "Error" };
            self.on_exit(
                i,
                exit.code,
                exit.signal,
                reason,
                None,
                exit.finished_at,
                &policy,
            )
            .await;
        }
    }

    /// Records a container exit and decides on its restart.
    #[allow(clippy::too_many_arguments)]
    async fn on_exit(
        &mut self,
        i: usize,
        code: i32,
        signal: Option<i32>,
        reason: &str,
        message: Option<String>,
        finished_at: chrono::DateTime<Utc>,
        policy: &str,
    ) {
        let pref = self.pref.clone();
        let c = &mut self.ctrs[i];
        let started_at = c.started.map(|s| s.1).unwrap_or(finished_at);
        let ran_for = c.started.map(|s| s.0.elapsed()).unwrap_or_default();
        let term = ContainerStateTerminated {
            exit_code: code,
            signal,
            reason: Some(reason.into()),
            message,
            started_at: Some(crate::ktime::time(started_at)),
            finished_at: Some(crate::ktime::time(finished_at)),
            container_id: c.id.as_ref().map(|i| format!("palisade://{i}")),
        };
        tracing::info!(container = %c.spec.name, code, reason, "container exited");
        c.state = ContainerState {
            terminated: Some(term.clone()),
            ..Default::default()
        };
        c.ready = false;
        c.startup_ok = false;
        c.probes.clear();
        let old = c.id.take();
        let restart = match c.kind {
            Kind::Sidecar => true,
            Kind::Init => {
                if code == 0 {
                    c.init_done = true;
                    false
                } else {
                    policy != "Never"
                }
            }
            Kind::Main => match policy {
                "Never" => false,
                "OnFailure" => code != 0,
                _ => true,
            },
        };
        if c.kind == Kind::Init && code != 0 && !restart {
            self.pod_failed = true;
        }
        if restart {
            let delay = c.backoff.on_exit(ran_for);
            c.last_state = Some(term);
            c.restart_at = Some(Instant::now() + delay);
            if !delay.is_zero() {
                let msg = format!(
                    "back-off {}s restarting failed container={} pod={}_{}({})",
                    delay.as_secs(),
                    c.spec.name,
                    pref.name,
                    pref.namespace,
                    pref.uid
                );
                c.set_waiting("CrashLoopBackOff", Some(msg.clone()));
                self.event(true, "BackOff", msg);
            }
        } else {
            c.finished = c.kind != Kind::Init || code != 0;
        }
        if let Some(id) = old {
            if let Err(e) = self.ctx.runtime.remove(&id).await {
                tracing::warn!(container = %id, error = %e, "cannot remove exited container");
            }
        }
        self.save();
    }

    fn image_of(
        &self,
        c: &Container,
    ) -> Result<(Option<PathBuf>, ImageConfig), crate::image::ImageError> {
        let image = c.image.clone().unwrap_or_default();
        if self
            .ctx
            .host_images
            .iter()
            .any(|h| *h == image || image.starts_with(&format!("{h}:")))
        {
            return Ok((None, ImageConfig::default()));
        }
        // The directory store first (the lab's fast path), then the registry's images.
        let mut dir = self.ctx.image_store.join(sanitize_image(&image));
        if !dir.join("rootfs").is_dir() {
            let secrets = self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.image_pull_secrets.as_ref());
            let req = crate::image::ImageRequest {
                image: &image,
                policy: c.image_pull_policy.as_deref(),
                namespace: &self.pref.namespace,
                pull_secrets: secrets
                    .into_iter()
                    .flatten()
                    .map(|r| r.name.clone())
                    .collect(),
                pod_uid: &self.pref.uid,
            };
            dir = self.ctx.images.resolve(&req)?.dir;
        }
        let cfg = std::fs::read(dir.join("config.json"))
            .ok()
            .and_then(|raw| serde_json::from_slice(&raw).ok())
            .unwrap_or_default();
        Ok((Some(dir.join("rootfs")), cfg))
    }

    /// Resolves a `fieldRef` path of this pod.
    fn field(&self, path: &str) -> Result<String, String> {
        let m = &self.pod.metadata;
        Ok(match path {
            "metadata.name" => self.pref.name.clone(),
            "metadata.namespace" => self.pref.namespace.clone(),
            "metadata.uid" => self.pref.uid.clone(),
            "spec.nodeName" => self.ctx.node_name.clone(),
            "spec.serviceAccountName" => self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
            "status.podIP" | "status.hostIP" => self.ctx.address.to_string(),
            p => {
                let map = if p.starts_with("metadata.labels['") {
                    &m.labels
                } else if p.starts_with("metadata.annotations['") {
                    &m.annotations
                } else {
                    return Err(format!("unsupported fieldRef {p:?}"));
                };
                let key = p
                    .split_once("['")
                    .map(|(_, k)| k.trim_end_matches("']"))
                    .unwrap_or_default();
                map.as_ref()
                    .and_then(|l| l.get(key).cloned())
                    .unwrap_or_default()
            }
        })
    }

    fn env_of(
        &self,
        c: &Container,
        sources: &crate::env::Sources,
    ) -> Result<crate::env::Resolved, crate::env::EnvError> {
        let mut env = vec![
            (
                "PATH".to_string(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            ),
            ("HOSTNAME".to_string(), self.pref.name.clone()),
        ];
        if let Some(s) = &self.sandbox {
            for (name, dir) in &s.dirs {
                env.push((volumes::env_name(name), dir.display().to_string()));
            }
            for (k, v) in &s.env {
                env.push((k.clone(), v.clone()));
            }
        }
        crate::env::resolve(&self.pref.namespace, c, env, sources, |p| self.field(p))
    }

    fn config_of(
        &self,
        c: &Ctr,
        sources: &crate::env::Sources,
    ) -> Result<(ContainerConfig, ImageConfig, Vec<crate::mounts::Mount>), (String, String)> {
        let (rootfs, img) = self
            .image_of(&c.spec)
            .map_err(|e| (e.reason().to_string(), e.to_string()))?;
        let resolved = self
            .env_of(&c.spec, sources)
            .map_err(|e| ("CreateContainerConfigError".to_string(), e.to_string()))?;
        if !resolved.skipped.is_empty() {
            self.event(
                true,
                "InvalidEnvironmentVariableNames",
                format!(
                    "Keys [{}] were skipped since they are considered invalid environment variable names",
                    resolved.skipped.join(", ")
                ),
            );
        }
        let mut env = resolved.vars;
        for (k, v) in &img.env {
            if !env.iter().any(|(ek, _)| ek == k) {
                env.push((k.clone(), v.clone()));
            }
        }
        let mut argv: Vec<String> = match &c.spec.command {
            Some(cmd) if !cmd.is_empty() => cmd.iter().map(|s| expand(s, &env)).collect(),
            _ => img.entrypoint.clone(),
        };
        match &c.spec.args {
            Some(a) if !a.is_empty() || c.spec.command.is_some() => {
                argv.extend(a.iter().map(|s| expand(s, &env)))
            }
            _ if c.spec.command.is_none() => argv.extend(img.cmd.iter().cloned()),
            _ => {}
        }
        if argv.is_empty() {
            return Err((
                "CreateContainerError".into(),
                "no command specified: the container has no command and its image no entrypoint"
                    .into(),
            ));
        }
        let no_dirs = std::collections::BTreeMap::new();
        let dirs = self.sandbox.as_ref().map_or(&no_dirs, |s| &s.dirs);
        let mounts = crate::mounts::plan(
            c.spec.volume_mounts.as_deref().unwrap_or_default(),
            dirs,
            rootfs.is_none(),
        )
        .map_err(|e| ("CreateContainerError".to_string(), e.to_string()))?;
        Ok((
            ContainerConfig {
                pod_uid: self.pref.uid.clone(),
                name: c.spec.name.clone(),
                attempt: c.next_attempt,
                argv,
                env,
                working_dir: c.spec.working_dir.clone().or(img.working_dir.clone()),
                rootfs,
            },
            img,
            mounts,
        ))
    }

    async fn start_due(&mut self) {
        let now = Instant::now();
        // Init containers in order; sidecars stay running.
        for i in 0..self.ctrs.len() {
            let kind = self.ctrs[i].kind;
            if kind == Kind::Main {
                break;
            }
            let c = &self.ctrs[i];
            let done = match kind {
                Kind::Init => c.init_done,
                _ => c.running() && c.startup_ok,
            };
            if c.id.is_none()
                && !(kind == Kind::Init && c.init_done)
                && c.restart_at.is_none_or(|t| t <= now)
            {
                self.start(i).await;
                return;
            }
            if !done {
                return;
            }
        }
        for i in 0..self.ctrs.len() {
            let c = &self.ctrs[i];
            if c.kind == Kind::Main
                && c.id.is_none()
                && !c.finished
                && c.restart_at.is_none_or(|t| t <= now)
            {
                self.start(i).await;
            }
        }
    }

    async fn start(&mut self, i: usize) {
        let started = Instant::now();
        let sources = crate::env::fetch(
            self.ctx.reporter.client(),
            &self.pref.namespace,
            &self.ctrs[i].spec,
        )
        .await;
        let prepared = sources
            .map_err(|e| ("CreateContainerConfigError".to_string(), e.to_string()))
            .and_then(|s| self.config_of(&self.ctrs[i], &s));
        let (cfg, _img, mounts) = match prepared {
            Ok(v) => v,
            Err((reason, msg)) => {
                let c = &mut self.ctrs[i];
                let already =
                    c.state.waiting.as_ref().and_then(|w| w.message.as_deref()) == Some(&msg);
                c.set_waiting(&reason, Some(msg.clone()));
                c.restart_at = Some(Instant::now() + Duration::from_secs(5));
                if !already {
                    let name = c.spec.name.clone();
                    self.event(
                        true,
                        "Failed",
                        format!("Error: {reason}: container {name}: {msg}"),
                    );
                }
                return;
            }
        };
        let name = self.ctrs[i].spec.name.clone();
        if self.ctrs[i].next_attempt > 0 {
            self.ctrs[i].restart_count += 1;
        }
        self.ctrs[i].next_attempt += 1;
        self.ctrs[i].restart_at = None;
        match self.ctx.runtime.start_with_mounts(&cfg, &mounts).await {
            Ok(info) => {
                self.ctx.metrics.observe_start(started.elapsed());
                let c = &mut self.ctrs[i];
                c.id = Some(info.id.clone());
                c.started = Some((Instant::now(), info.started_at));
                c.state = ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(crate::ktime::time(info.started_at)),
                    }),
                    ..Default::default()
                };
                c.startup_ok = c.spec.startup_probe.is_none();
                c.ready = c.startup_ok && c.spec.readiness_probe.is_none();
                Self::make_probes(c);
                self.save();
                self.event(false, "Started", format!("Started container {name}"));
                if let Some(h) = self.ctrs[i]
                    .spec
                    .lifecycle
                    .as_ref()
                    .and_then(|l| l.post_start.clone())
                {
                    let ports = self.ctrs[i].spec.ports.clone();
                    if let Err(msg) = self
                        .run_hook(&info.id, &h, ports, Duration::from_secs(30))
                        .await
                    {
                        self.event(
                            true,
                            "FailedPostStartHook",
                            format!("PostStartHook failed for {name}: {msg}"),
                        );
                        let _ = self.ctx.runtime.kill_all(&info.id).await;
                    }
                }
            }
            Err(RuntimeError::MountFailed { message, .. }) => {
                // As the kubelet's CreateContainerError: the container never ran, so it
                // waits (no restart counted) and the agent retries.
                let _ = self.ctx.runtime.remove(&cfg.id()).await;
                let c = &mut self.ctrs[i];
                c.next_attempt -= 1;
                if c.next_attempt > 0 {
                    c.restart_count = c.restart_count.saturating_sub(1);
                }
                let already =
                    c.state.waiting.as_ref().and_then(|w| w.message.as_deref()) == Some(&message);
                c.set_waiting("CreateContainerError", Some(message.clone()));
                c.restart_at = Some(Instant::now() + Duration::from_secs(5));
                self.save();
                if !already {
                    self.event(
                        true,
                        "Failed",
                        format!("Error: CreateContainerError: container {name}: {message}"),
                    );
                }
            }
            Err(e) => {
                self.save();
                let msg = wait_reason(&e);
                self.event(
                    true,
                    "Failed",
                    format!("Error: failed to start container {name}: {msg}"),
                );
                let policy = self
                    .pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.restart_policy.clone())
                    .unwrap_or_else(|| "Always".into());
                self.ctrs[i].started = Some((Instant::now(), Utc::now()));
                if let Some(id) = Some(cfg.id()) {
                    let _ = self.ctx.runtime.remove(&id).await;
                }
                self.on_exit(i, 128, None, "StartError", Some(msg), Utc::now(), &policy)
                    .await;
            }
        }
    }

    async fn run_hook(
        &self,
        id: &str,
        h: &LifecycleHandler,
        ports: Option<Vec<ContainerPort>>,
        timeout: Duration,
    ) -> Result<(), String> {
        if let Some(e) = &h.exec {
            let argv = e.command.clone().unwrap_or_default();
            return match self.ctx.runtime.exec(id, &argv, timeout).await {
                Ok(0) => Ok(()),
                Ok(code) => Err(format!("command {argv:?} exited with {code}")),
                Err(e) => Err(e.to_string()),
            };
        }
        if let Some(g) = &h.http_get {
            let ports = ports.unwrap_or_default();
            return match crate::probe::http_get(g, self.ctx.address, &ports, timeout).await {
                ProbeOutcome::Success => Ok(()),
                ProbeOutcome::Failure(m) | ProbeOutcome::Error(m) => Err(m),
            };
        }
        if let Some(s) = &h.sleep {
            tokio::time::sleep(
                Duration::from_secs(u64::try_from(s.seconds).unwrap_or(0)).min(timeout),
            )
            .await;
            return Ok(());
        }
        Err("unsupported hook handler".into())
    }

    fn run_probes(&mut self) {
        let now = Instant::now();
        for c in &mut self.ctrs {
            let Some(id) = c.id.clone() else { continue };
            if !c.running() {
                continue;
            }
            let kinds: Vec<ProbeKind> = if c.startup_ok {
                vec![ProbeKind::Liveness, ProbeKind::Readiness]
            } else {
                vec![ProbeKind::Startup]
            };
            for kind in kinds {
                let Some(t) = c.probes.get_mut(&kind) else {
                    continue;
                };
                if !t.due(now) {
                    continue;
                }
                t.started(now);
                let probe = match kind {
                    ProbeKind::Startup => c.spec.startup_probe.clone(),
                    ProbeKind::Liveness => c.spec.liveness_probe.clone(),
                    ProbeKind::Readiness => c.spec.readiness_probe.clone(),
                };
                let Some(probe) = probe else { continue };
                let timeout = t.thresholds.timeout;
                let rt = self.ctx.runtime.clone();
                let tx = self.probe_tx.clone();
                let addr = self.ctx.address;
                let name = c.spec.name.clone();
                let ports = c.spec.ports.clone().unwrap_or_default();
                let id = id.clone();
                tokio::spawn(async move {
                    let outcome = if let Some(e) = &probe.exec {
                        let argv = e.command.clone().unwrap_or_default();
                        match rt.exec(&id, &argv, timeout).await {
                            Ok(0) => ProbeOutcome::Success,
                            Ok(code) => ProbeOutcome::Failure(format!(
                                "command {argv:?} exited with {code}"
                            )),
                            Err(e) => ProbeOutcome::Failure(e.to_string()),
                        }
                    } else {
                        crate::probe::run_network(&probe, addr, &ports, timeout)
                            .await
                            .unwrap_or_else(|| ProbeOutcome::Error("probe has no handler".into()))
                    };
                    let _ = tx.send(ProbeResult {
                        name,
                        id,
                        kind,
                        outcome,
                    });
                });
            }
        }
    }

    async fn on_probe(&mut self, res: ProbeResult) {
        let Some(i) = self
            .ctrs
            .iter()
            .position(|c| c.spec.name == res.name && c.id.as_deref() == Some(&res.id))
        else {
            return;
        };
        let ok = res.outcome == ProbeOutcome::Success;
        let Some(t) = self.ctrs[i].probes.get_mut(&res.kind) else {
            return;
        };
        let verdict = t.record(ok);
        let kind = format!("{:?}", res.kind);
        match &res.outcome {
            ProbeOutcome::Success => {}
            ProbeOutcome::Failure(msg) => {
                self.event(true, "Unhealthy", format!("{kind} probe failed: {msg}"))
            }
            ProbeOutcome::Error(msg) => {
                self.event(true, "Unhealthy", format!("{kind} probe errored: {msg}"))
            }
        }
        let Some(v) = verdict else { return };
        let name = res.name.clone();
        match (res.kind, v) {
            (ProbeKind::Readiness, r) => self.ctrs[i].ready = r,
            (ProbeKind::Startup, true) => {
                self.ctrs[i].startup_ok = true;
                self.ctrs[i].ready = self.ctrs[i].spec.readiness_probe.is_none();
            }
            (ProbeKind::Liveness, true) => {}
            (kind @ (ProbeKind::Startup | ProbeKind::Liveness), false) => {
                let reason = if kind == ProbeKind::Startup {
                    KillReason::StartupProbe
                } else {
                    KillReason::LivenessProbe
                };
                self.event(
                    false,
                    "Killing",
                    format!("Container {name} failed {kind:?} probe, will be restarted"),
                );
                self.kill_container(i, reason, None, None).await;
            }
        }
    }

    async fn check_completion(&mut self) {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let (inits, mains) = self.statuses();
        let phase = status::pod_phase(&spec, &inits, &mains);
        let all_main_done = self
            .ctrs
            .iter()
            .filter(|c| c.kind == Kind::Main)
            .all(|c| c.finished);
        if (phase == status::phase::SUCCEEDED || phase == status::phase::FAILED) && all_main_done {
            self.finish_pod().await;
        }
    }

    /// The pod reached a terminal phase by itself: stop sidecars, report, keep the object.
    async fn finish_pod(&mut self) {
        self.kill_all_gracefully(None, KillReason::PodTermination)
            .await;
        self.rec.phase = WorkerPhase::Terminated;
        self.save();
        self.report_final().await;
    }

    // ---------------------------------------------------------------- fencing

    async fn self_fence(&mut self) {
        tracing::warn!(
            "self-fencing: Lease not renewed in time, SIGKILLing every container of the pod"
        );
        let policy = "Never";
        for i in 0..self.ctrs.len() {
            let Some(id) = self.ctrs[i].id.clone() else {
                continue;
            };
            let _ = self.ctx.runtime.kill_all(&id).await;
            let was_finished = self.ctrs[i].finished;
            self.on_exit(
                i,
                137,
                Some(9),
                "SelfFenced",
                Some("killed by palisade-node self-fencing".into()),
                Utc::now(),
                policy,
            )
            .await;
            // Fencing is not the container's fault: it neither finishes nor fails the pod.
            self.ctrs[i].finished = was_finished;
            self.ctrs[i].init_done = self.ctrs[i].init_done && self.ctrs[i].kind == Kind::Init;
        }
        self.pod_failed = false;
        self.rec.fenced = true;
        self.save();
        self.ctx
            .metrics
            .self_fences
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.event(
            true,
            "SelfFenced",
            "palisade-node could not renew its Lease: killed every container of this pod".into(),
        );
    }

    async fn try_lift_fence(&mut self) {
        match self.ctx.reporter.get(&self.pref).await {
            Ok(p) => {
                let same = p.metadata.uid.as_deref() == Some(self.pref.uid.as_str())
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(self.ctx.node_name.as_str());
                if !same {
                    self.gone = true;
                    return;
                }
                if p.metadata.deletion_timestamp.is_some() {
                    self.pod = p;
                    return;
                }
                tracing::info!("API confirms the pod still belongs here: lifting the self-fence");
                self.pod = p;
                self.rec.fenced = false;
                for c in &mut self.ctrs {
                    if c.id.is_none() && !c.finished {
                        c.restart_at = Some(Instant::now());
                    }
                }
                self.save();
                self.event(
                    false,
                    "SelfFenceLifted",
                    "API reachable again and the pod still belongs to this node".into(),
                );
            }
            Err(e) if e.is_gone() => self.gone = true,
            Err(e) => tracing::debug!(error = %e, "cannot confirm pod after self-fence yet"),
        }
    }

    // ---------------------------------------------------------------- termination

    fn grace_inputs(&self, c: &Container) -> GraceInputs {
        GraceInputs {
            deletion_grace_period_seconds: if self.pod_grace > 0 || self.gone {
                Some(self.pod_grace)
            } else {
                self.pod.metadata.deletion_grace_period_seconds
            },
            termination_grace_period_seconds: self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds),
            startup_probe_grace_period_seconds: c
                .startup_probe
                .as_ref()
                .and_then(|p| p.termination_grace_period_seconds),
            liveness_probe_grace_period_seconds: c
                .liveness_probe
                .as_ref()
                .and_then(|p| p.termination_grace_period_seconds),
        }
    }

    /// `killContainer`: preStop, TERM (or the stop signal), KILL at the deadline, and every
    /// remaining process of the container after that. `kill_by` is the pod-level hard
    /// deadline (a shrunk grace period), if any.
    async fn kill_container(
        &mut self,
        i: usize,
        reason: KillReason,
        override_seconds: Option<i64>,
        kill_by: Option<watch::Receiver<Option<Instant>>>,
    ) {
        let Some(id) = self.ctrs[i].id.clone() else {
            return;
        };
        let spec = self.ctrs[i].spec.clone();
        let plan = KillPlan::new(
            &self.grace_inputs(&spec),
            reason,
            spec.lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .is_some(),
        );
        let k = KillCtx {
            runtime: self.ctx.runtime.clone(),
            reporter: self.ctx.reporter.clone(),
            pref: self.pref.clone(),
            address: self.ctx.address,
            metrics: self.ctx.metrics.clone(),
        };
        let stop_signal = self.stop_signal(&spec);
        kill_one(&k, &id, &spec, plan, override_seconds, stop_signal, kill_by).await;
        let exit = self.ctx.runtime.exit_status(&id).ok().flatten();
        let (code, signal, at) =
            exit.map(|e| (e.code, e.signal, e.finished_at))
                .unwrap_or((137, Some(9), Utc::now()));
        let policy = match reason {
            KillReason::PodTermination => "Never".to_string(),
            _ => self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.clone())
                .unwrap_or_else(|| "Always".into()),
        };
        let r = if code == 0 { "Completed" } else { "Error" };
        self.on_exit(i, code, signal, r, None, at, &policy).await;
    }

    fn stop_signal(&self, c: &Container) -> Signal {
        let img = self.image_of(c).map(|(_, cfg)| cfg).unwrap_or_default();
        img.stop_signal
            .as_deref()
            .and_then(|s| {
                let s = s.trim_start_matches("SIG");
                format!("SIG{s}").parse::<Signal>().ok()
            })
            .unwrap_or(Signal::SIGTERM)
    }

    async fn kill_all_gracefully(&mut self, override_seconds: Option<i64>, reason: KillReason) {
        let (tx, _) = watch::channel(None);
        self.kill_all_with(override_seconds, reason, &tx, None, None)
            .await;
    }

    /// Kills main and regular init containers in parallel, then sidecars in reverse order.
    async fn kill_all_with(
        &mut self,
        override_seconds: Option<i64>,
        reason: KillReason,
        kill_by: &watch::Sender<Option<Instant>>,
        mut pod_rx: Option<&mut watch::Receiver<Pod>>,
        started: Option<Instant>,
    ) {
        let k = KillCtx {
            runtime: self.ctx.runtime.clone(),
            reporter: self.ctx.reporter.clone(),
            pref: self.pref.clone(),
            address: self.ctx.address,
            metrics: self.ctx.metrics.clone(),
        };
        let first: Vec<usize> = (0..self.ctrs.len())
            .filter(|&i| self.ctrs[i].kind != Kind::Sidecar && self.ctrs[i].id.is_some())
            .collect();
        let mut futs = Vec::new();
        for &i in &first {
            let id = self.ctrs[i].id.clone().unwrap_or_default();
            let spec = self.ctrs[i].spec.clone();
            let has_pre_stop = spec
                .lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .is_some();
            let plan = KillPlan::new(&self.grace_inputs(&spec), reason, has_pre_stop);
            let sig = self.stop_signal(&spec);
            let k = &k;
            let rx = kill_by.subscribe();
            futs.push(async move {
                kill_one(k, &id, &spec, plan, override_seconds, sig, Some(rx)).await
            });
        }
        let all = futures::future::join_all(futs);
        tokio::pin!(all);
        // A self-fence overrides the grace period: a pod already terminating is killed now.
        let mut fence = Some(self.ctx.fence.clone());
        if let Some(f) = fence.as_mut() {
            f.mark_changed();
        }
        loop {
            tokio::select! {
                _ = &mut all => break,
                r = async { match fence.as_mut() { Some(f) => f.changed().await, None => std::future::pending().await } } => {
                    let active = match (r, fence.as_mut()) {
                        (Ok(()), Some(f)) => f.borrow_and_update().active,
                        _ => { fence = None; false }
                    };
                    if active && self.fence_eligible() {
                        tracing::warn!("self-fencing a terminating pod: SIGKILL without waiting for its grace period");
                        kill_by.send_replace(Some(Instant::now()));
                    }
                }
                r = async { match pod_rx.as_mut() { Some(rx) => rx.changed().await, None => std::future::pending().await } } => {
                    if r.is_err() { pod_rx = None; continue; }
                    if let Some(rx) = pod_rx.as_mut() {
                        let mut p = rx.borrow_and_update().clone();
                        normalize_sidecars(&mut p);
                        self.shrink_grace(&p, kill_by, started);
                        self.pod = p;
                    }
                }
            }
        }
        for &i in &first {
            self.record_killed(i).await;
        }
        let sidecars: Vec<usize> = (0..self.ctrs.len())
            .rev()
            .filter(|&i| self.ctrs[i].kind == Kind::Sidecar && self.ctrs[i].id.is_some())
            .collect();
        for i in sidecars {
            let id = self.ctrs[i].id.clone().unwrap_or_default();
            let spec = self.ctrs[i].spec.clone();
            let has_pre_stop = spec
                .lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .is_some();
            let plan = KillPlan::new(&self.grace_inputs(&spec), reason, has_pre_stop);
            let sig = self.stop_signal(&spec);
            kill_one(
                &k,
                &id,
                &spec,
                plan,
                override_seconds,
                sig,
                Some(kill_by.subscribe()),
            )
            .await;
            self.record_killed(i).await;
        }
    }

    fn shrink_grace(
        &mut self,
        p: &Pod,
        kill_by: &watch::Sender<Option<Instant>>,
        started: Option<Instant>,
    ) {
        let (g, changed) = effective_pod_grace_period(
            self.pod_grace,
            p.metadata.deletion_grace_period_seconds,
            None,
            p.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds),
        );
        // Only ever shrinking: a longer result (a 0 request falling back to the spec) is ignored.
        if changed && g < self.pod_grace {
            tracing::info!(from = self.pod_grace, to = g, "grace period shortened");
            self.pod_grace = g;
            let at = started.unwrap_or_else(Instant::now)
                + Duration::from_secs(u64::try_from(g).unwrap_or(0));
            kill_by.send_modify(|d| *d = Some(d.map_or(at, |cur| cur.min(at))));
        }
    }

    async fn record_killed(&mut self, i: usize) {
        let Some(id) = self.ctrs[i].id.clone() else {
            return;
        };
        let exit = self.ctx.runtime.exit_status(&id).ok().flatten();
        let (code, signal, at) =
            exit.map(|e| (e.code, e.signal, e.finished_at))
                .unwrap_or((137, Some(9), Utc::now()));
        let r = if code == 0 { "Completed" } else { "Error" };
        self.on_exit(i, code, signal, r, None, at, "Never").await;
        self.ctrs[i].finished = true;
    }

    async fn terminate(
        &mut self,
        mut pod_rx: watch::Receiver<Pod>,
        _cmd_rx: mpsc::UnboundedReceiver<WorkerCmd>,
    ) {
        let started = Instant::now();
        self.rec.phase = WorkerPhase::Terminating;
        self.save();
        let spec_grace = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds);
        let override_seconds = if self.gone { Some(0) } else { None };
        if self.gone {
            self.pod_grace = 0;
        } else {
            self.pod_grace = effective_pod_grace_period(
                0,
                self.pod.metadata.deletion_grace_period_seconds,
                None,
                spec_grace,
            )
            .0;
        }
        tracing::info!(grace = self.pod_grace, gone = self.gone, "terminating pod");
        if !self.gone {
            self.event(
                false,
                "Killing",
                format!("Stopping pod with a grace period of {}s", self.pod_grace),
            );
        }
        let (kill_by, _) = watch::channel(None);
        if self.gone {
            self.kill_all_with(
                override_seconds,
                KillReason::PodTermination,
                &kill_by,
                None,
                Some(started),
            )
            .await;
        } else {
            self.kill_all_with(
                override_seconds,
                KillReason::PodTermination,
                &kill_by,
                Some(&mut pod_rx),
                Some(started),
            )
            .await;
        }
        // Every process of every container must be confirmed dead before anything else.
        loop {
            let alive: Vec<String> = self
                .ctx
                .runtime
                .list()
                .into_iter()
                .filter(|c| c.pod_uid == self.pref.uid && self.ctx.runtime.any_alive(&c.id))
                .map(|c| c.id)
                .collect();
            if alive.is_empty() {
                break;
            }
            for id in alive {
                if let Err(e) = self.ctx.runtime.kill_all(&id).await {
                    tracing::error!(container = %id, error = %e, "processes survive SIGKILL; retrying");
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for c in self
            .ctx
            .runtime
            .list()
            .into_iter()
            .filter(|c| c.pod_uid == self.pref.uid)
        {
            let _ = self.ctx.runtime.remove(&c.id).await;
        }
        self.rec.phase = WorkerPhase::Terminated;
        self.save();
        if !self.gone {
            self.report_final().await;
            // Only the agent completes a deletion the API asked for (a released pod is never restarted).
            if self.pod.metadata.deletion_timestamp.is_some() {
                loop {
                    match self.ctx.reporter.delete_pod(&self.pref).await {
                        Ok(()) => {
                            tracing::info!("every process is dead: pod object deleted");
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot delete pod yet; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            }
        }
        volumes::cleanup(&self.ctx.store.pod_dir(&self.pref.uid));
        if let Ok(mut m) = self.ctx.volumes_in_use.lock() {
            m.remove(&self.pref.uid);
        }
        let _ = self.ctx.store.remove(&self.pref.uid);
    }

    // ---------------------------------------------------------------- status

    fn statuses(&self) -> (Vec<ContainerStatus>, Vec<ContainerStatus>) {
        let img = |c: &Ctr| c.spec.image.clone().unwrap_or_default();
        // The digest a pulled image resolved to, once the container has run.
        let status = |c: &Ctr| ContainerStatus {
            image_id: (c.state.waiting.is_none())
                .then(|| self.ctx.images.image_id(&img(c)))
                .flatten()
                .unwrap_or_default(),
            ..c.status(&img(c))
        };
        let inits = self
            .ctrs
            .iter()
            .filter(|c| c.kind != Kind::Main)
            .map(status)
            .collect();
        let mains = self
            .ctrs
            .iter()
            .filter(|c| c.kind == Kind::Main)
            .map(status)
            .collect();
        (inits, mains)
    }

    fn compute_status(&self, terminal: bool) -> PodStatus {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let (inits, mains) = self.statuses();
        let mut phase = status::pod_phase(&spec, &inits, &mains).to_string();
        if terminal {
            // Since 1.27 the kubelet moves a stopped pod to a terminal phase before deleting it.
            let all_ok = self.ctrs.iter().filter(|c| c.kind == Kind::Main).all(|c| {
                c.state
                    .terminated
                    .as_ref()
                    .is_some_and(|t| t.exit_code == 0)
            });
            phase = if all_ok {
                status::phase::SUCCEEDED
            } else {
                status::phase::FAILED
            }
            .to_string();
        }
        if self.pod_failed {
            phase = status::phase::FAILED.into();
        }
        let previous = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let now = crate::ktime::now();
        let conditions = status::pod_conditions(
            &ConditionInputs {
                spec: &spec,
                init_statuses: &inits,
                statuses: &mains,
                phase: &phase,
                sandbox_ready: self.sandbox.is_some() && !self.rec.fenced,
                previous: &previous,
            },
            &now,
        );
        let ip = self.ctx.address.to_string();
        let start_time = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.clone())
            .or_else(|| Some(crate::ktime::now()));
        PodStatus {
            phase: Some(phase),
            conditions: Some(conditions),
            container_statuses: Some(mains),
            init_container_statuses: if inits.is_empty() { None } else { Some(inits) },
            pod_ip: Some(ip.clone()),
            pod_ips: Some(vec![PodIP { ip: ip.clone() }]),
            host_ip: Some(ip.clone()),
            host_ips: Some(vec![HostIP { ip }]),
            start_time,
            message: self.sandbox_error.clone(),
            reason: if self.rec.fenced {
                Some("SelfFenced".into())
            } else {
                None
            },
            ..Default::default()
        }
    }

    fn report(&self) {
        let mut s = self.compute_status(false);
        // Transition times are kept by the computation; compare without them.
        let same = {
            let cur = self.status_tx.borrow();
            cur.as_ref()
                .is_some_and(|c| strip_times(c) == strip_times(&s))
        };
        if !same {
            s.start_time = s.start_time.or_else(|| Some(crate::ktime::now()));
            self.status_tx.send_replace(Some(s));
        }
    }

    async fn report_final(&mut self) {
        let s = self.compute_status(true);
        self.status_tx.send_replace(None);
        for _ in 0..30 {
            match self.ctx.reporter.patch_status(&self.pref, &s).await {
                Ok(()) => return,
                Err(e) if e.is_gone() => return,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot report terminal status; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

fn strip_times(s: &PodStatus) -> serde_json::Value {
    let mut s = s.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_transition_time = None;
    }
    s.start_time = None;
    serde_json::to_value(s).unwrap_or_default()
}

/// Patches the latest status, latest-wins, so a slow API never blocks the worker.
async fn status_loop(reporter: Reporter, pref: PodRef, mut rx: watch::Receiver<Option<PodStatus>>) {
    while rx.changed().await.is_ok() {
        let Some(s) = rx.borrow_and_update().clone() else {
            continue;
        };
        if let Err(e) = reporter.patch_status(&pref, &s).await {
            if e.is_gone() {
                continue;
            }
            tracing::debug!(error = %e, "status patch failed; will retry");
            tokio::time::sleep(Duration::from_secs(1)).await;
            rx.mark_changed();
        }
    }
}

struct KillCtx {
    runtime: Arc<dyn Runtime>,
    reporter: Reporter,
    pref: PodRef,
    address: IpAddr,
    metrics: Arc<Metrics>,
}

/// The runtime half of `killContainer`.
async fn kill_one(
    k: &KillCtx,
    id: &str,
    spec: &Container,
    plan: KillPlan,
    override_seconds: Option<i64>,
    stop_signal: Signal,
    kill_by: Option<watch::Receiver<Option<Instant>>>,
) {
    if k.runtime.exit_status(id).ok().flatten().is_some() {
        let _ = k.runtime.kill_all(id).await;
        return;
    }
    let name = &spec.name;
    let mut pre_stop_elapsed = None;
    if plan.run_pre_stop {
        if let Some(h) = spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
            let t0 = Instant::now();
            let timeout = plan.pre_stop_timeout();
            // Each handler is bounded by the hook timeout itself; an exec hook that overruns
            // has its whole process group killed.
            let res: Result<Result<(), String>, ()> = if let Some(e) = &h.exec {
                let argv = e.command.clone().unwrap_or_default();
                match k.runtime.exec(id, &argv, timeout).await {
                    Ok(0) => Ok(Ok(())),
                    Ok(c) => Ok(Err(format!("command {argv:?} exited with {c}"))),
                    Err(RuntimeError::ExecTimeout { .. }) => Err(()),
                    Err(e) => Ok(Err(e.to_string())),
                }
            } else if let Some(g) = &h.http_get {
                let ports = spec.ports.clone().unwrap_or_default();
                match crate::probe::http_get(g, k.address, &ports, timeout).await {
                    ProbeOutcome::Success => Ok(Ok(())),
                    ProbeOutcome::Failure(m) | ProbeOutcome::Error(m) => Ok(Err(m)),
                }
            } else if let Some(s) = &h.sleep {
                let d = Duration::from_secs(u64::try_from(s.seconds).unwrap_or(0));
                tokio::time::sleep(d.min(timeout)).await;
                if d > timeout {
                    Err(())
                } else {
                    Ok(Ok(()))
                }
            } else {
                Ok(Err("unsupported preStop handler".into()))
            };
            let elapsed = t0.elapsed();
            pre_stop_elapsed = Some(elapsed);
            let msg = match res {
                Ok(Ok(())) => None,
                Ok(Err(m)) => Some(m),
                Err(_) => Some(format!(
                    "preStop hook did not finish within {}s",
                    plan.grace_period
                )),
            };
            if let Some(m) = msg {
                let r = k.reporter.clone();
                let p = k.pref.clone();
                let text = format!("PreStopHook failed for {name}: {m}");
                tokio::spawn(async move { r.event(&p, true, "FailedPreStopHook", &text).await });
            }
            tracing::info!(container = %name, elapsed_ms = elapsed.as_millis() as u64, "preStop hook done");
        }
    }
    let window = plan.window(pre_stop_elapsed, override_seconds);
    let term_at = Instant::now();
    let mut deadline = term_at + Duration::from_secs(u64::try_from(window.max(0)).unwrap_or(0));
    if window > 0 {
        tracing::info!(container = %name, signal = %stop_signal, window_s = window, "sending stop signal");
        let _ = k.runtime.signal(id, stop_signal);
    }
    let mut kill_by = kill_by;
    loop {
        if let Some(rx) = kill_by.as_ref() {
            if let Some(d) = *rx.borrow() {
                deadline = deadline.min(d);
            }
        }
        tokio::select! {
            r = k.runtime.wait(id) => {
                if r.is_ok() { break; }
                break;
            }
            _ = tokio::time::sleep_until(deadline) => {
                let late = Instant::now().saturating_duration_since(deadline);
                tracing::info!(container = %name, late_ms = late.as_millis() as u64, "grace period over: SIGKILL");
                k.metrics.observe_kill_lateness(late);
                break;
            }
            r = async { match kill_by.as_mut() { Some(rx) => rx.changed().await, None => std::future::pending().await } } => {
                if r.is_err() { kill_by = None; }
            }
        }
    }
    if let Err(e) = k.runtime.kill_all(id).await {
        tracing::error!(container = %name, error = %e, "cannot kill container");
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

/// Image configuration read from `<image-store>/<image>/config.json`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ImageConfig {
    /// ENTRYPOINT.
    pub entrypoint: Vec<String>,
    /// CMD.
    pub cmd: Vec<String>,
    /// ENV.
    pub env: Vec<(String, String)>,
    /// WORKDIR.
    pub working_dir: Option<String>,
    /// STOPSIGNAL (e.g. `SIGINT`).
    pub stop_signal: Option<String>,
}

/// The directory name of an image in the store (`/` and `:` become `_`).
pub fn sanitize_image(image: &str) -> String {
    image.replace(['/', ':', '@'], "_")
}

/// Expands `$(VAR)` references as the kubelet does (`$$` escapes).
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            if b[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if b[i + 1] == b'(' {
                if let Some(end) = s[i + 2..].find(')') {
                    let name = &s[i + 2..i + 2 + end];
                    if let Some((_, v)) = env.iter().rev().find(|(k, _)| k == name) {
                        out.push_str(v);
                        i += 3 + end;
                        continue;
                    }
                }
            }
        }
        let ch = s[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Path helper for tests and the binary.
pub fn containers_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("containers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_follows_kubelet_rules() {
        let env = vec![("A".to_string(), "x".to_string())];
        assert_eq!(expand("$(A)/$(B)/$$(A)/$", &env), "x/$(B)/$(A)/$");
        assert_eq!(expand("plain é", &env), "plain é");
    }

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

    #[test]
    fn image_names_map_to_directories() {
        assert_eq!(
            sanitize_image("registry.local/app:1.0"),
            "registry.local_app_1.0"
        );
    }
}
