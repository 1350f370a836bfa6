//! Self-fencing inside a worker: while [`FenceState::active`](super::FenceState), the
//! containers of a fence-eligible pod are SIGKILLed and not restarted until the API confirms
//! that the pod still belongs to this node.
//!
//! A pod that is already terminating is fenced by the termination code instead
//! ([`Worker::kill_all_with`] turns every kill deadline into "now"), and containers that have
//! no worker at all are covered by [`crate::self_fence::sweep`].

use jiff::Timestamp;
use tokio::time::Instant;

use super::confirm::{classify, Verdict};
use super::{Kind, Worker};
use crate::volumes;

impl Worker {
    /// Whether this pod is killed by a self-fence: every pod when
    /// [`FenceState::all_pods`](super::FenceState::all_pods), else only a pod that uses a
    /// PersistentVolumeClaim (the state another node could take over).
    pub(super) fn fence_eligible(&self) -> bool {
        let f = *self.ctx.fence.borrow();
        f.all_pods || volumes::uses_pvc(&self.pod)
    }

    /// SIGKILLs every container of the pod at once, with no preStop hook and no grace period,
    /// and marks the pod fenced (on disk too) so that nothing restarts until
    /// [`Worker::try_lift_fence`] succeeds. Called again at every sync while a container of
    /// the fenced pod could not be confirmed dead.
    ///
    /// Guarantees:
    /// - the pod is marked fenced and saved before any kill, and a fenced pod starts no
    ///   container (the sync returns before starting anything); the `SelfFenced` Event and
    ///   the `self_fences` metric happen once per fence, not per retry;
    /// - every container this worker knows to be started gets [`Runtime::kill_all`]
    ///   (every process of it, grandchildren included) before this returns;
    /// - a container is recorded as killed (terminated, `SelfFenced`, removed from the
    ///   runtime) only when `kill_all` succeeded and [`Runtime::any_alive`] then reports no
    ///   process of it. Otherwise the failure is logged, counted in
    ///   `self_fence_kill_failures`, and the container stays known to the worker (and on
    ///   disk) as possibly alive, so the next sync period kills it again;
    /// - being fenced neither finishes nor fails a container: once lifted, the pod resumes
    ///   (init containers that had not completed run again).
    ///
    /// Assumptions:
    /// - the runtime's `any_alive` is truthful (process liveness from the kernel);
    /// - the caller has checked [`FenceState::active`](super::FenceState::active) and
    ///   [`Worker::fence_eligible`], and calls this again at the next sync while
    ///   [`Worker::fence_unconfirmed`] holds.
    ///
    /// [`Runtime::kill_all`]: crate::runtime::Runtime::kill_all
    /// [`Runtime::any_alive`]: crate::runtime::Runtime::any_alive
    #[tracing::instrument(name = "self_fence", skip_all, fields(pod = %self.pref, first = !self.rec.fenced))]
    pub(super) async fn self_fence(&mut self) {
        let first = !self.rec.fenced;
        if first {
            tracing::warn!(
                "self-fencing: Lease not renewed in time, SIGKILLing every container of the pod"
            );
            self.pod_failed = false;
            self.rec.fenced = true;
            self.save();
        }
        let policy = "Never";
        for i in 0..self.ctrs.len() {
            let Some(id) = self.ctrs[i].id.clone() else {
                continue;
            };
            let res = self.ctx.runtime.kill_all(&id).await;
            let alive = self.ctx.runtime.any_alive(&id);
            if res.is_err() || alive {
                tracing::error!(
                    container = %id,
                    error = ?res.err(),
                    still_alive = alive,
                    "self-fence: cannot confirm the container is dead; retrying at the next sync"
                );
                self.ctx
                    .metrics
                    .self_fence_kill_failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            let was_finished = self.ctrs[i].finished;
            self.on_exit(
                i,
                137,
                Some(9),
                "SelfFenced",
                Some("killed by palisade-node self-fencing".into()),
                Timestamp::now(),
                policy,
            )
            .await;
            // Fencing is not the container's fault: it neither finishes nor fails the pod.
            self.ctrs[i].finished = was_finished;
            self.ctrs[i].init_done = self.ctrs[i].init_done && self.ctrs[i].kind == Kind::Init;
        }
        self.pod_failed = false;
        self.save();
        if first {
            self.ctx
                .metrics
                .self_fences
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.event(
                true,
                "SelfFenced",
                "palisade-node could not renew its Lease: killed every container of this pod"
                    .into(),
            );
        }
    }

    /// Whether a container of this fenced pod could not be confirmed dead yet: a container
    /// [`Worker::self_fence`] killed for sure no longer has an id.
    pub(super) fn fence_unconfirmed(&self) -> bool {
        self.rec.fenced && self.ctrs.iter().any(|c| c.id.is_some())
    }

    /// Lifts the self-fence once the API server is reachable again and still shows this pod
    /// (same UID) bound to this node; the containers then restart at once.
    ///
    /// Guarantees: the fence is lifted only on that positive answer ([`classify`]), which also
    /// confirms the pod (the read is this worker's, so made after its registration: see
    /// `confirm.rs`). A pod that is gone, replaced or bound elsewhere makes the worker
    /// terminate it instead (it never runs here again), and a pod being deleted stays fenced
    /// and terminates. Any other error keeps the fence.
    ///
    /// Assumptions: the caller calls this only while
    /// [`FenceState::active`](super::FenceState::active) is false.
    pub(super) async fn try_lift_fence(&mut self) {
        let read = self.ctx.status.get(&self.pref).await;
        match classify(read, &self.pref.uid, &self.ctx.node_name) {
            Verdict::Gone => self.gone = true,
            Verdict::Deleting(p) => self.pod = p,
            Verdict::Belongs(p) => {
                tracing::info!("API confirms the pod still belongs here: lifting the self-fence");
                self.pod = p;
                self.confirmed = true;
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
            Verdict::Unknown(e) => {
                tracing::debug!(error = %e, "cannot confirm pod after self-fence yet")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use nix::sys::signal::Signal;
    use serde_json::json;
    use tokio::time::Instant;

    use crate::pod_worker::testing::{container, deleted, pod, until, Harness, CLAIM};
    use crate::pod_worker::{FenceState, TICK};
    use crate::runtime::fake::Script;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn claim_pod(grace: i64) -> k8s_openapi::api::core::v1::Pod {
        pod(json!({
            "terminationGracePeriodSeconds": grace,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
            "containers": [container("db")],
        }))
    }

    fn ignores_term() -> Script {
        Script {
            ignores_term: true,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_active_fence_kills_a_pod_with_a_claim_at_once_and_keeps_it_down() {
        let h = Harness::new();
        h.runtime.script("db", ignores_term());
        let p = claim_pod(30);
        let _w = h.spawn(&p);
        until("db runs", || h.runtime.running("db")).await;

        h.fence.send_replace(FenceState {
            active: true,
            all_pods: false,
        });
        let fenced = Instant::now();
        until("db killed", || !h.runtime.running("db")).await;
        let kills = h.runtime.kills("db");
        assert_eq!(kills.len(), 1);
        assert!(kills[0] - fenced <= TICK, "killed within one tick");
        assert!(
            h.runtime.signals("db", Signal::SIGTERM).is_empty(),
            "no grace period"
        );

        tokio::time::sleep(secs(120)).await;
        assert_eq!(
            h.runtime.starts("db").len(),
            1,
            "not restarted while fenced"
        );
        let status = h.sink.last_status().expect("status");
        assert_eq!(status.reason.as_deref(), Some("SelfFenced"));
        assert!(h.sink.events().iter().any(|(r, _)| r == "SelfFenced"));
        assert_eq!(h.ctx.metrics.self_fences.load(Ordering::Relaxed), 1);

        // Once the API is back and confirms the pod still belongs here, it runs again.
        h.sink.set_pod(Some(p.clone()));
        h.fence.send_replace(FenceState::default());
        until("db restarted", || h.runtime.starts("db").len() == 2).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_without_a_claim_keeps_running_unless_every_pod_is_fenced() {
        let h = Harness::new();
        let _w = h.spawn(&pod(json!({"containers": [container("web")]})));
        until("web runs", || h.runtime.running("web")).await;

        h.fence.send_replace(FenceState {
            active: true,
            all_pods: false,
        });
        tokio::time::sleep(secs(60)).await;
        assert!(h.runtime.running("web"));
        assert!(h.runtime.kills("web").is_empty());

        h.fence.send_replace(FenceState {
            active: true,
            all_pods: true,
        });
        let fenced = Instant::now();
        until("web killed", || !h.runtime.running("web")).await;
        assert!(h.runtime.kills("web")[0] - fenced <= TICK);
    }

    #[tokio::test(start_paused = true)]
    async fn a_terminating_pod_with_a_claim_is_killed_without_waiting_for_its_grace_period() {
        let h = Harness::new();
        h.runtime.script("db", ignores_term());
        let p = claim_pod(60);
        let w = h.spawn(&p);
        until("db runs", || h.runtime.running("db")).await;

        w.pod_tx.send_replace(deleted(&p, 60));
        let t0 = Instant::now();
        tokio::time::sleep(secs(5)).await;
        h.fence.send_replace(FenceState {
            active: true,
            all_pods: false,
        });
        w.join.await.expect("worker");

        assert_eq!(h.runtime.signals("db", Signal::SIGTERM), vec![t0]);
        assert_eq!(h.runtime.kills("db"), vec![t0 + secs(5)]);
    }

    /// A self-fence that activates while a preStop hook runs abandons the hook and KILLs at
    /// once, instead of waiting for the hook (up to the whole grace period).
    #[tokio::test(start_paused = true)]
    async fn a_self_fence_does_not_wait_for_a_running_pre_stop_hook() {
        let h = Harness::new();
        h.runtime.script("db", ignores_term());
        h.runtime.exec_script(
            "pre-stop",
            crate::runtime::fake::ExecScript {
                code: 0,
                takes: secs(50),
            },
        );
        let mut p = claim_pod(60);
        if let Some(c) = p.spec.as_mut().map(|s| &mut s.containers[0]) {
            c.lifecycle =
                serde_json::from_value(json!({"preStop": {"exec": {"command": ["pre-stop"]}}}))
                    .ok();
        }
        let w = h.spawn(&p);
        until("db runs", || h.runtime.running("db")).await;

        w.pod_tx.send_replace(deleted(&p, 60));
        let t0 = Instant::now();
        tokio::time::sleep(secs(5)).await;
        h.fence.send_replace(FenceState {
            active: true,
            all_pods: false,
        });
        w.join.await.expect("worker");

        assert_eq!(h.runtime.kills("db"), vec![t0 + secs(5)]);
        assert!(
            h.runtime.signals("db", Signal::SIGTERM).is_empty(),
            "no stop signal once fenced"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_that_activates_while_sidecars_are_stopped_kills_them_at_once() {
        let h = Harness::new();
        h.runtime.script("s1", ignores_term());
        h.runtime.script("s2", ignores_term());
        let sidecar = |name: &str| {
            let mut c = container(name);
            c["restartPolicy"] = json!("Always");
            c
        };
        let p = pod(json!({
            "terminationGracePeriodSeconds": 60,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
            "initContainers": [sidecar("s1"), sidecar("s2")],
            "containers": [container("db")],
        }));
        let w = h.spawn(&p);
        until("db runs", || h.runtime.running("db")).await;

        // db obeys TERM at once, so the sidecar phase (s2 first) starts right away.
        w.pod_tx.send_replace(deleted(&p, 60));
        let t0 = Instant::now();
        until("s2 stopping", || {
            !h.runtime.signals("s2", Signal::SIGTERM).is_empty()
        })
        .await;
        assert!(!h.runtime.running("db"), "main container dead first");
        tokio::time::sleep(secs(5)).await;
        h.fence.send_replace(FenceState {
            active: true,
            all_pods: false,
        });
        let fenced = Instant::now();
        w.join.await.expect("worker");

        assert!(fenced - t0 < secs(6));
        assert_eq!(h.runtime.kills("s2"), vec![fenced]);
        assert_eq!(h.runtime.kills("s1"), vec![fenced]);
        assert!(
            h.runtime.signals("s1", Signal::SIGTERM).is_empty(),
            "no stop signal once fenced"
        );
    }

    /// Fences a pod whose `db` container behaves as `script` under KILL, and checks that the
    /// kill is not taken for granted: counted as a failure, not recorded as dead, retried.
    async fn fence_kill_is_confirmed(script: Script) {
        let h = Harness::new();
        h.runtime.script("db", script);
        let p = claim_pod(30);
        let _w = h.spawn(&p);
        until("db runs", || h.runtime.running("db")).await;

        h.fence.send_replace(FenceState {
            active: true,
            all_pods: false,
        });
        until("db killed once", || !h.runtime.kills("db").is_empty()).await;
        tokio::time::sleep(secs(1)).await;

        let kills = h.runtime.kills("db").len();
        assert!(kills >= 5, "retried every sync period: {kills} kills");
        let failures = h
            .ctx
            .metrics
            .self_fence_kill_failures
            .load(Ordering::Relaxed);
        assert!(
            failures as usize >= kills - 1,
            "{failures} failures counted"
        );
        assert!(
            h.runtime.running("db"),
            "still known to the runtime, and alive"
        );
        assert_eq!(h.ctx.metrics.self_fences.load(Ordering::Relaxed), 1);
        assert_eq!(h.runtime.starts("db").len(), 1, "nothing restarts");
        let status = h.sink.last_status().expect("status");
        assert_eq!(status.reason.as_deref(), Some("SelfFenced"));
        let db = status
            .container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == "db")
            .expect("db status");
        assert!(
            db.state.as_ref().is_some_and(|s| s.terminated.is_none()),
            "not recorded as dead: {:?}",
            db.state
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_fence_kill_is_counted_not_recorded_as_dead_and_retried() {
        fence_kill_is_confirmed(Script {
            kill_fails: true,
            ..Default::default()
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_kill_that_leaves_the_container_alive_is_counted_and_retried() {
        fence_kill_is_confirmed(Script {
            survives_kill: true,
            ..Default::default()
        })
        .await;
    }
}
