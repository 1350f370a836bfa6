//! *Syncing*: one pass over a running pod. Confirm the pod with the API (once, before
//! anything starts: `confirm.rs`), prepare its volumes, notice container exits and
//! decide on restarts (`restartPolicy`, with [`RestartBackoff`](crate::backoff::RestartBackoff)
//! reported as CrashLoopBackOff), start what is due, run the probes, report the status, and
//! finish the pod once it completed by itself.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

use super::{Kind, Worker};
use crate::grace::KillReason;
use crate::state::WorkerPhase;
use crate::status;
use crate::volumes;

impl Worker {
    pub(super) async fn sync_once(&mut self) {
        // Self-fencing first: it overrides everything else. A kill that could not be
        // confirmed is retried at every sync while the fence is active.
        let fence = *self.ctx.fence.borrow();
        if fence.active && self.fence_eligible() && (!self.rec.fenced || self.fence_unconfirmed()) {
            self.self_fence().await;
        }
        if self.rec.fenced {
            if !fence.active {
                self.try_lift_fence().await;
            }
            self.report();
            return;
        }
        // Nothing (volumes included) before a read of the pod made after this worker was
        // registered confirms it (confirm.rs).
        if !self.confirm().await {
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
        self.rotate_tokens().await;
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

    /// Rotates the projected ServiceAccount tokens that are due (a failure keeps the old,
    /// still valid token, is reported as `FailedMount` and retried).
    async fn rotate_tokens(&mut self) {
        let Some(s) = self.sandbox.as_mut() else {
            return;
        };
        if !s.tokens.iter().any(|t| t.rotate_at <= Instant::now()) {
            return;
        }
        let r = volumes::projected::rotate(&self.ctx.client, &self.pod, &mut s.tokens).await;
        if let Err(e) = r {
            self.event(
                true,
                "FailedMount",
                format!("MountVolume.SetUp failed: {e}"),
            );
        }
    }

    pub(super) async fn check_exits(&mut self) {
        let policy = self.restart_policy();
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
        finished_at: Timestamp,
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
            started_at: Some(Time(started_at)),
            finished_at: Some(Time(finished_at)),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use crate::pod_worker::testing::{container, pod, until, Harness};
    use crate::runtime::fake::{Call, Script};

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn exits_after(s: u64, code: i32) -> Script {
        Script {
            exits_after: Some((secs(s), code)),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_crashing_container_restarts_at_once_then_after_10_20_and_40_seconds() {
        let h = Harness::new();
        h.runtime.script("app", exits_after(1, 1));
        let _w = h.spawn(&pod(json!({"containers": [container("app")]})));
        until("five starts", || h.runtime.starts("app").len() >= 5).await;

        let starts = h.runtime.starts("app");
        let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        for (gap, backoff) in gaps.iter().zip([0, 10, 20, 40]) {
            // 1 s of running plus the backoff, and at most one 100 ms tick to notice the exit.
            let least = secs(1 + backoff);
            assert!(
                *gap >= least && *gap <= least + Duration::from_millis(100),
                "restart after a {backoff} s backoff took {gap:?}: {gaps:?}"
            );
        }
        let backoffs: Vec<String> = h
            .sink
            .events()
            .into_iter()
            .filter(|(r, _)| r == "BackOff")
            .map(|(_, m)| m)
            .collect();
        assert_eq!(backoffs.len(), 3, "{backoffs:?}");
        assert!(
            backoffs[0].starts_with("back-off 10s restarting failed container=app pod=p_default"),
            "{backoffs:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_waiting_for_its_restart_is_reported_in_crash_loop_back_off() {
        let h = Harness::new();
        h.runtime.script("app", exits_after(1, 1));
        let _w = h.spawn(&pod(json!({"containers": [container("app")]})));
        until("two starts", || h.runtime.starts("app").len() >= 2).await;
        // The second run exits after 1 s; the third start waits 10 s.
        tokio::time::sleep(secs(5)).await;

        let status = h.sink.last_status().expect("status");
        let app = &status.container_statuses.expect("container statuses")[0];
        let waiting = app
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .expect("waiting");
        assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
        assert!(waiting
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("back-off 10s")));
        assert_eq!(app.restart_count, 1);
        let last = app.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        assert_eq!(last.map(|t| t.exit_code), Some(1));
        assert_eq!(h.runtime.starts("app").len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn restart_policy_never_fails_the_pod_and_on_failure_keeps_a_success() {
        let never = Harness::new();
        never.runtime.script("app", exits_after(1, 3));
        let _w = never.spawn(&pod(
            json!({"restartPolicy": "Never", "containers": [container("app")]}),
        ));
        let on_failure = Harness::new();
        on_failure.runtime.script("app", exits_after(1, 0));
        let _v = on_failure.spawn(&pod(
            json!({"restartPolicy": "OnFailure", "containers": [container("app")]}),
        ));
        let phase = |h: &Harness| h.sink.last_status().and_then(|s| s.phase);
        until("terminal phases", || {
            phase(&never).as_deref() == Some("Failed")
                && phase(&on_failure).as_deref() == Some("Succeeded")
        })
        .await;
        tokio::time::sleep(secs(600)).await;

        assert_eq!(never.runtime.starts("app").len(), 1);
        assert_eq!(on_failure.runtime.starts("app").len(), 1);
        assert_eq!(phase(&never).as_deref(), Some("Failed"));
        assert_eq!(phase(&on_failure).as_deref(), Some("Succeeded"));
    }

    #[tokio::test(start_paused = true)]
    async fn init_containers_run_one_after_another_and_sidecars_keep_running() {
        let h = Harness::new();
        h.runtime.script("init-a", exits_after(2, 0));
        h.runtime.script("init-b", exits_after(3, 0));
        let sidecar = |name: &str| {
            let mut c = container(name);
            c["restartPolicy"] = json!("Always");
            c
        };
        let _w = h.spawn(&pod(json!({
            "initContainers": [container("init-a"), sidecar("s1"), container("init-b"), sidecar("s2")],
            "containers": [container("app")],
        })));
        until("app starts", || !h.runtime.starts("app").is_empty()).await;

        let order: Vec<String> = h
            .runtime
            .calls()
            .into_iter()
            .filter_map(|(_, c)| match c {
                Call::Start { name, .. } => Some(name),
                _ => None,
            })
            .collect();
        assert_eq!(order, vec!["init-a", "s1", "init-b", "s2", "app"]);
        let first = |n: &str| h.runtime.starts(n)[0];
        assert!(
            first("s1") >= first("init-a") + secs(2),
            "s1 waits for init-a"
        );
        assert!(
            first("s2") >= first("init-b") + secs(3),
            "s2 waits for init-b"
        );

        tokio::time::sleep(secs(120)).await;
        for name in ["s1", "s2", "app"] {
            assert!(h.runtime.running(name), "{name} keeps running");
            assert_eq!(h.runtime.starts(name).len(), 1, "{name} started once");
        }
        for name in ["init-a", "init-b"] {
            assert_eq!(h.runtime.starts(name).len(), 1, "{name} ran once");
        }
        let status = h.sink.last_status().expect("status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
    }
}
