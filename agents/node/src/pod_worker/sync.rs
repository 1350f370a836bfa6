//! *Syncing*: one pass over a running pod. Prepare its volumes, notice container exits and
//! decide on restarts (`restartPolicy`, with [`RestartBackoff`](crate::backoff::RestartBackoff)
//! reported as CrashLoopBackOff), start what is due, run the probes, report the status, and
//! finish the pod once it completed by itself.

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};
use tokio::time::Instant;

use super::{Kind, Worker};
use crate::grace::KillReason;
use crate::state::WorkerPhase;
use crate::status;
use crate::volumes;

impl Worker {
    pub(super) async fn sync_once(&mut self) {
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
            match volumes::prepare(
                &self.ctx.client,
                &self.ctx.store,
                &self.ctx.node_name,
                &self.ctx.volumes_in_use,
                &self.pod,
            )
            .await
            {
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

    pub(super) async fn check_exits(&mut self) {
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
    pub(super) async fn on_exit(
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

    pub(super) async fn check_completion(&mut self) {
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
    pub(super) async fn finish_pod(&mut self) {
        self.kill_all_gracefully(None, KillReason::PodTermination)
            .await;
        self.rec.phase = WorkerPhase::Terminated;
        self.save();
        self.report_final().await;
    }
}
