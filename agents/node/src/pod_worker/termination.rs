//! *Terminating* and *Terminated*: killing the pod's containers and the final steps.
//!
//! Main and regular init containers are killed in parallel, sidecars afterwards one by one in
//! reverse order. Each kill runs the preStop hook, sends TERM (or the image's stop signal) and
//! KILLs at the deadline computed by [`crate::grace`]. The pod-level grace period only ever
//! shrinks, and a self-fence turns every deadline into "now" and abandons running preStop hooks
//! (fence-eligible pods: KILL at once, no stop signal). Once every process is confirmed
//! dead, the terminal phase is reported and the pod object deleted with grace 0 and a UID
//! precondition (only when the API asked for the deletion).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use nix::sys::signal::Signal;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{image, normalize_sidecars, FenceState, Kind, Worker, WorkerCmd};
use crate::grace::{effective_pod_grace_period, GraceInputs, KillPlan, KillReason};
use crate::metrics::Metrics;
use crate::probe::ProbeOutcome;
use crate::reporter::{PodRef, StatusSink};
use crate::runtime::{Runtime, RuntimeError};
use crate::state::WorkerPhase;
use crate::volumes;

/// The pod-level hard deadline of a termination, shared by every container kill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct KillBy {
    /// KILL no later than this: a shortened grace period, or "now" for a self-fence.
    pub(super) at: Option<Instant>,
    /// A self-fence is active for this (fence-eligible) pod: a running preStop hook is
    /// abandoned and every container is KILLed at once, without a stop signal.
    pub(super) fenced: bool,
}

impl Worker {
    pub(super) async fn terminate(
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
        let (kill_by, _) = watch::channel(KillBy::default());
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
                    match self.ctx.status.delete_pod(&self.pref).await {
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
        self.ctx.volumes_in_use.lock().remove(&self.pref.uid);
        let _ = self.ctx.store.remove(&self.pref.uid);
    }

    /// Kills main and regular init containers in parallel, then sidecars in reverse order.
    ///
    /// `kill_by` carries the pod-level hard deadline: a shortened grace period read from
    /// `pod_rx` ([`Worker::shrink_grace`]), or "now" and [`KillBy::fenced`] when a self-fence
    /// is or becomes active.
    ///
    /// Guarantees:
    /// - no sidecar is stopped before every main and regular init container is dead;
    /// - while the main containers are being killed, a self-fence that is (or becomes) active
    ///   for a [fence-eligible](Worker::fence_eligible) pod marks `kill_by` fenced with the
    ///   deadline now: a container whose preStop hook is running has the hook abandoned and is
    ///   KILLed at once, one waiting for its grace period after the stop signal is KILLed at
    ///   once, and one not yet started on its kill gets no hook and no stop signal, only KILL.
    ///   The sidecars after them inherit that state;
    /// - while the sidecars are being stopped, the self-fence is followed the same way: one
    ///   that becomes active then KILLs the sidecar being stopped at once (hook abandoned) and
    ///   every sidecar after it without a hook or a stop signal.
    ///
    /// Assumptions: a grace period shortened while the sidecars are being stopped is not read
    /// (only the main phase follows `pod_rx`); an abandoned exec hook's processes die with the
    /// container's KILL (the runtime runs them in the container's cgroup, and kills the hook's
    /// process group when its exec is dropped).
    pub(super) async fn kill_all_with(
        &mut self,
        override_seconds: Option<i64>,
        reason: KillReason,
        kill_by: &watch::Sender<KillBy>,
        mut pod_rx: Option<&mut watch::Receiver<Pod>>,
        started: Option<Instant>,
    ) {
        let k = KillCtx {
            runtime: self.ctx.runtime.clone(),
            status: self.ctx.status.clone(),
            pref: self.pref.clone(),
            address: self.ctx.address,
            metrics: self.ctx.metrics.clone(),
        };
        // Already fenced: no container starts its preStop hook or gets a stop signal.
        self.follow_fence(kill_by);
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
        // A self-fence overrides the grace period: a pod already terminating is killed now.
        let mut fence = Some(self.ctx.fence.clone());
        if let Some(f) = fence.as_mut() {
            f.mark_changed();
        }
        self.follow(
            futures::future::join_all(futs),
            kill_by,
            &mut fence,
            &mut pod_rx,
            started,
        )
        .await;
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
            self.follow_fence(kill_by);
            let kill = kill_one(
                &k,
                &id,
                &spec,
                plan,
                override_seconds,
                sig,
                Some(kill_by.subscribe()),
            );
            // The sidecars follow the fence too; a grace period shortened now is not read.
            self.follow(kill, kill_by, &mut fence, &mut None, started)
                .await;
            self.record_killed(i).await;
        }
    }

    /// Drives `work` (kills that do not borrow the worker) to completion while following the
    /// self-fence into `kill_by` ([`Worker::follow_fence`]) and, when `pod_rx` is given, the
    /// pod's grace period ([`Worker::shrink_grace`]). A closed channel is no longer followed
    /// (set to `None`).
    async fn follow<T>(
        &mut self,
        work: impl std::future::Future<Output = T>,
        kill_by: &watch::Sender<KillBy>,
        fence: &mut Option<watch::Receiver<FenceState>>,
        pod_rx: &mut Option<&mut watch::Receiver<Pod>>,
        started: Option<Instant>,
    ) -> T {
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                r = async { match fence.as_mut() { Some(f) => f.changed().await, None => std::future::pending().await } } => {
                    match (r, fence.as_mut()) {
                        (Ok(()), Some(f)) => { f.borrow_and_update(); self.follow_fence(kill_by); }
                        _ => *fence = None,
                    }
                }
                r = async { match pod_rx.as_mut() { Some(rx) => rx.changed().await, None => std::future::pending().await } } => {
                    if r.is_err() { *pod_rx = None; continue; }
                    if let Some(rx) = pod_rx.as_mut() {
                        let mut p = rx.borrow_and_update().clone();
                        normalize_sidecars(&mut p);
                        self.shrink_grace(&p, kill_by, started);
                        self.pod = p;
                    }
                }
            }
        }
    }

    pub(super) async fn kill_all_gracefully(
        &mut self,
        override_seconds: Option<i64>,
        reason: KillReason,
    ) {
        let (tx, _) = watch::channel(KillBy::default());
        self.kill_all_with(override_seconds, reason, &tx, None, None)
            .await;
    }

    /// `killContainer` for one container of a running pod (a failed liveness or startup
    /// probe): preStop, TERM (or the stop signal), KILL at the deadline, and every remaining
    /// process of the container after that.
    ///
    /// Guarantees: the kill follows the self-fence ([`Worker::follow_fence`]). A self-fence
    /// that is active for this pod when the kill starts, or becomes active while its preStop
    /// hook runs or its grace period runs out, KILLs at once (hook abandoned, no stop signal),
    /// and the pod is then fenced at once ([`Worker::self_fence`]: every container KILLed,
    /// none restarted until the API confirms the pod). A self-fence never waits for a probe's
    /// grace period.
    pub(super) async fn kill_container(
        &mut self,
        i: usize,
        reason: KillReason,
        override_seconds: Option<i64>,
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
            status: self.ctx.status.clone(),
            pref: self.pref.clone(),
            address: self.ctx.address,
            metrics: self.ctx.metrics.clone(),
        };
        let stop_signal = self.stop_signal(&spec);
        // Issue 32 item 15: the kill used to run outside the self-fence, so a fence that began
        // meanwhile waited for the probe's whole grace period.
        let (kill_by, rx) = watch::channel(KillBy::default());
        self.follow_fence(&kill_by);
        let mut fence = Some(self.ctx.fence.clone());
        let kill = kill_one(
            &k,
            &id,
            &spec,
            plan,
            override_seconds,
            stop_signal,
            Some(rx),
        );
        self.follow(kill, &kill_by, &mut fence, &mut None, None)
            .await;
        if kill_by.borrow().fenced {
            // Recorded as fenced, not as a probe kill, and nothing restarts.
            self.self_fence().await;
            return;
        }
        let exit = self.ctx.runtime.exit_status(&id).ok().flatten();
        let (code, signal, at) = exit.map(|e| (e.code, e.signal, e.finished_at)).unwrap_or((
            137,
            Some(9),
            Timestamp::now(),
        ));
        let policy = match reason {
            KillReason::PodTermination => "Never".to_string(),
            _ => self.restart_policy(),
        };
        let r = if code == 0 { "Completed" } else { "Error" };
        self.on_exit(i, code, signal, r, None, at, &policy).await;
    }

    /// Marks `kill_by` fenced, with the deadline now, when a self-fence is active and the pod
    /// is [fence-eligible](Worker::fence_eligible) (once: later calls change nothing).
    pub(super) fn follow_fence(&self, kill_by: &watch::Sender<KillBy>) {
        if !self.ctx.fence.borrow().active || !self.fence_eligible() {
            return;
        }
        kill_by.send_if_modified(|d| {
            if d.fenced {
                return false;
            }
            tracing::warn!("self-fencing a terminating pod: SIGKILL at once, without waiting for a preStop hook or the grace period");
            let now = Instant::now();
            *d = KillBy {
                at: Some(d.at.map_or(now, |cur| cur.min(now))),
                fenced: true,
            };
            true
        });
    }

    pub(super) fn shrink_grace(
        &mut self,
        p: &Pod,
        kill_by: &watch::Sender<KillBy>,
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
            kill_by.send_modify(|d| d.at = Some(d.at.map_or(at, |cur| cur.min(at))));
        }
    }

    pub(super) async fn record_killed(&mut self, i: usize) {
        let Some(id) = self.ctrs[i].id.clone() else {
            return;
        };
        let exit = self.ctx.runtime.exit_status(&id).ok().flatten();
        let (code, signal, at) = exit.map(|e| (e.code, e.signal, e.finished_at)).unwrap_or((
            137,
            Some(9),
            Timestamp::now(),
        ));
        let r = if code == 0 { "Completed" } else { "Error" };
        self.on_exit(i, code, signal, r, None, at, "Never").await;
        self.ctrs[i].finished = true;
    }

    pub(super) fn grace_inputs(&self, c: &Container) -> GraceInputs {
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

    pub(super) fn stop_signal(&self, c: &Container) -> Signal {
        // Never a pull at kill time: what is already on the node, or the default.
        let img = image::local_config_of(&self.ctx, c);
        img.stop_signal
            .as_deref()
            .and_then(|s| {
                let s = s.trim_start_matches("SIG");
                format!("SIG{s}").parse::<Signal>().ok()
            })
            .unwrap_or(Signal::SIGTERM)
    }
}

struct KillCtx {
    runtime: Arc<dyn Runtime>,
    status: Arc<dyn StatusSink>,
    pref: PodRef,
    address: IpAddr,
    metrics: Arc<Metrics>,
}

/// The runtime half of `killContainer`: the preStop hook, the stop signal, and KILL of every
/// process of the container at the deadline.
///
/// Guarantees:
/// - [`Runtime::kill_all`] is always called before this returns, at the latest at the
///   deadline of `plan` or `kill_by`, whichever is earlier;
/// - once `kill_by` is [fenced](KillBy::fenced) (before or during the hook or the grace
///   period), no hook is started, a running hook is abandoned at once (its future dropped)
///   and no stop signal is sent: KILL follows immediately.
///
/// Assumptions: dropping a running exec hook does not leave its processes running past the
/// KILL (they run in the container's cgroup and the runtime kills the hook's process group on
/// drop); an abandoned HTTP or sleep hook has nothing left to kill.
async fn kill_one(
    k: &KillCtx,
    id: &str,
    spec: &Container,
    plan: KillPlan,
    override_seconds: Option<i64>,
    stop_signal: Signal,
    kill_by: Option<watch::Receiver<KillBy>>,
) {
    if k.runtime.exit_status(id).ok().flatten().is_some() {
        let _ = k.runtime.kill_all(id).await;
        return;
    }
    let name = &spec.name;
    let mut kill_by = kill_by;
    let mut fenced = kill_by.as_ref().is_some_and(|rx| rx.borrow().fenced);
    let mut pre_stop_elapsed = None;
    if plan.run_pre_stop && !fenced {
        if let Some(h) = spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
            let t0 = Instant::now();
            let hook = run_pre_stop(k, id, spec, h, plan.pre_stop_timeout());
            tokio::pin!(hook);
            let res = tokio::select! {
                r = &mut hook => Some(r),
                _ = until_fenced(&mut kill_by) => None,
            };
            let elapsed = t0.elapsed();
            pre_stop_elapsed = Some(elapsed);
            match res {
                None => {
                    fenced = true;
                    tracing::warn!(container = %name, elapsed_ms = elapsed.as_millis() as u64, "self-fence: preStop hook abandoned");
                }
                Some(res) => {
                    let msg = match res {
                        Ok(Ok(())) => None,
                        Ok(Err(m)) => Some(m),
                        Err(_) => Some(format!(
                            "preStop hook did not finish within {}s",
                            plan.grace_period
                        )),
                    };
                    if let Some(m) = msg {
                        let r = k.status.clone();
                        let p = k.pref.clone();
                        let text = format!("PreStopHook failed for {name}: {m}");
                        tokio::spawn(
                            async move { r.event(&p, true, "FailedPreStopHook", &text).await },
                        );
                    }
                    tracing::info!(container = %name, elapsed_ms = elapsed.as_millis() as u64, "preStop hook done");
                }
            }
        }
    }
    if !fenced {
        let window = plan.window(pre_stop_elapsed, override_seconds);
        let term_at = Instant::now();
        let mut deadline = term_at + Duration::from_secs(u64::try_from(window.max(0)).unwrap_or(0));
        if window > 0 {
            tracing::info!(container = %name, signal = %stop_signal, window_s = window, "sending stop signal");
            let _ = k.runtime.signal(id, stop_signal);
        }
        loop {
            if let Some(rx) = kill_by.as_ref() {
                if let Some(d) = rx.borrow().at {
                    deadline = deadline.min(d);
                }
            }
            tokio::select! {
                _ = k.runtime.wait(id) => break,
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
    } else {
        tracing::warn!(container = %name, "self-fence: SIGKILL without a stop signal");
    }
    if let Err(e) = k.runtime.kill_all(id).await {
        tracing::error!(container = %name, error = %e, "cannot kill container");
    }
}

/// Resolves once `kill_by` is [fenced](KillBy::fenced); never without a `kill_by` or once its
/// sender is gone.
async fn until_fenced(kill_by: &mut Option<watch::Receiver<KillBy>>) {
    if let Some(rx) = kill_by.as_mut() {
        if rx.wait_for(|d| d.fenced).await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// Runs a preStop handler, bounded by `timeout`: `Err(())` when it overran, `Ok(Err(_))` when
/// it failed.
async fn run_pre_stop(
    k: &KillCtx,
    id: &str,
    spec: &Container,
    h: &LifecycleHandler,
    timeout: Duration,
) -> Result<Result<(), String>, ()> {
    // Each handler is bounded by the hook timeout itself; an exec hook that overruns has its
    // whole process group killed.
    if let Some(e) = &h.exec {
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
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::Signal;
    use serde_json::json;
    use tokio::time::Instant;

    use k8s_openapi::api::core::v1::Pod;

    use crate::pod_worker::testing::{container, deleted, pod, until, Harness, UID};
    use crate::runtime::fake::{Call, ExecScript, Script};

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ignores_term() -> Script {
        Script {
            ignores_term: true,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn term_comes_first_and_kill_when_the_grace_period_runs_out() {
        let h = Harness::new();
        h.runtime.script("app", ignores_term());
        let p = pod(json!({"terminationGracePeriodSeconds": 30, "containers": [container("app")]}));
        let w = h.spawn(&p);
        until("app runs", || h.runtime.running("app")).await;

        w.pod_tx.send_replace(deleted(&p, 30));
        let t0 = Instant::now();
        w.join.await.expect("worker");

        assert_eq!(h.runtime.signals("app", Signal::SIGTERM), vec![t0]);
        assert_eq!(h.runtime.kills("app"), vec![t0 + secs(30)]);
        let status = h.sink.last_status().expect("terminal status");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let deleted = h.sink.deleted();
        assert_eq!(deleted.len(), 1, "the pod object is deleted once");
        assert_eq!(deleted[0].1.uid, UID);
        assert!(deleted[0].0 >= t0 + secs(30), "deleted only after the kill");
    }

    /// A pod whose container `app` ignores TERM and has a preStop hook that takes `takes`, with
    /// a grace period of `grace` seconds.
    fn pre_stop_pod(takes: Duration, grace: u64) -> (Harness, Pod) {
        let h = Harness::new();
        h.runtime.script("app", ignores_term());
        h.runtime
            .exec_script("pre-stop", ExecScript { code: 0, takes });
        let mut app = container("app");
        app["lifecycle"] = json!({"preStop": {"exec": {"command": ["pre-stop"]}}});
        let p = pod(json!({"terminationGracePeriodSeconds": grace, "containers": [app]}));
        (h, p)
    }

    #[tokio::test(start_paused = true)]
    async fn the_pre_stop_hook_uses_up_part_of_the_grace_period() {
        let (h, p) = pre_stop_pod(secs(12), 30);
        let w = h.spawn(&p);
        until("app runs", || h.runtime.running("app")).await;

        w.pod_tx.send_replace(deleted(&p, 30));
        let t0 = Instant::now();
        w.join.await.expect("worker");

        let hooks: Vec<Instant> = h
            .runtime
            .calls()
            .into_iter()
            .filter_map(|(at, c)| {
                matches!(c, Call::Exec { ref argv, .. } if argv[0] == "pre-stop").then_some(at)
            })
            .collect();
        assert_eq!(hooks, vec![t0]);
        assert_eq!(
            h.runtime.signals("app", Signal::SIGTERM),
            vec![t0 + secs(12)]
        );
        assert_eq!(h.runtime.kills("app"), vec![t0 + secs(30)]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_overrunning_pre_stop_hook_is_cut_off_and_leaves_a_two_second_window() {
        let (h, p) = pre_stop_pod(secs(100), 10);
        let w = h.spawn(&p);
        until("app runs", || h.runtime.running("app")).await;

        w.pod_tx.send_replace(deleted(&p, 10));
        let t0 = Instant::now();
        w.join.await.expect("worker");

        assert_eq!(
            h.runtime.signals("app", Signal::SIGTERM),
            vec![t0 + secs(10)]
        );
        assert_eq!(h.runtime.kills("app"), vec![t0 + secs(12)]);
        assert!(
            h.sink
                .events()
                .iter()
                .any(|(r, _)| r == "FailedPreStopHook"),
            "{:?}",
            h.sink.events()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_grace_period_of_a_terminating_pod_only_ever_shrinks() {
        let h = Harness::new();
        h.runtime.script("app", ignores_term());
        let p = pod(json!({"terminationGracePeriodSeconds": 60, "containers": [container("app")]}));
        let w = h.spawn(&p);
        until("app runs", || h.runtime.running("app")).await;

        w.pod_tx.send_replace(deleted(&p, 60));
        let t0 = Instant::now();
        tokio::time::sleep(secs(5)).await;
        // A second DELETE with a shorter grace period: the kill moves to 10 s after the start.
        w.pod_tx.send_replace(deleted(&p, 10));
        tokio::time::sleep(secs(2)).await;
        // A longer one is ignored.
        w.pod_tx.send_replace(deleted(&p, 40));
        w.join.await.expect("worker");

        assert_eq!(h.runtime.signals("app", Signal::SIGTERM), vec![t0]);
        assert_eq!(h.runtime.kills("app"), vec![t0 + secs(10)]);
    }

    #[tokio::test(start_paused = true)]
    async fn sidecars_are_stopped_after_the_main_containers_in_reverse_order() {
        let h = Harness::new();
        h.runtime.script("app", ignores_term());
        let sidecar = |name: &str| {
            let mut c = container(name);
            c["restartPolicy"] = json!("Always");
            c
        };
        let p = pod(json!({
            "terminationGracePeriodSeconds": 10,
            "initContainers": [sidecar("s1"), sidecar("s2")],
            "containers": [container("app")],
        }));
        let w = h.spawn(&p);
        until("app runs", || h.runtime.running("app")).await;

        w.pod_tx.send_replace(deleted(&p, 10));
        let t0 = Instant::now();
        w.join.await.expect("worker");

        let stops: Vec<(Instant, String)> = h
            .runtime
            .calls()
            .into_iter()
            .filter_map(|(at, c)| match c {
                Call::Signal {
                    name, alive: true, ..
                } => Some((at, format!("TERM {name}"))),
                Call::KillAll { name, alive: true } => Some((at, format!("KILL {name}"))),
                _ => None,
            })
            .collect();
        let order: Vec<&str> = stops.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(order, vec!["TERM app", "KILL app", "TERM s2", "TERM s1"]);
        assert_eq!(stops[1].0, t0 + secs(10));
        assert!(
            stops[2].0 >= stops[1].0,
            "sidecars only after the main container is dead"
        );
    }
}
