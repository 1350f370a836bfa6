//! Self-fencing straight from the runtime: killing every fence-eligible container the runtime
//! lists, whether or not a pod worker exists for it.
//!
//! Pod workers fence the pods they run, but some containers have no worker that would: an
//! agent restarted while cut off from the API never completes its first LIST, so it starts no
//! worker for the containers it adopted from durable state. The sweep here works from the
//! runtime alone, so it covers those too.

use std::sync::atomic::Ordering;

use crate::metrics::Metrics;
use crate::runtime::{ContainerInfo, Runtime};

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Containers that had a live process and were killed (confirmed dead).
    pub killed: Vec<String>,
    /// Eligible containers that could not be confirmed dead (the kill failed or a process is
    /// still alive afterwards).
    pub unconfirmed: Vec<String>,
}

impl SweepOutcome {
    /// Every eligible container is confirmed dead.
    pub fn complete(&self) -> bool {
        self.unconfirmed.is_empty()
    }
}

/// SIGKILLs every container of `runtime` for which `eligible` holds and that still has a live
/// process, and checks afterwards that none of its processes is left.
///
/// Guarantees: a container is reported in [`SweepOutcome::killed`] only when the runtime no
/// longer reports any process of it alive; every other eligible container with a live process
/// is in [`SweepOutcome::unconfirmed`], with a warning logged and
/// `self_fence_kill_failures` counted. A kill failure is never ignored.
///
/// Assumptions: the runtime's `any_alive` is truthful (process liveness from the kernel).
pub async fn sweep(
    runtime: &dyn Runtime,
    eligible: &(dyn Fn(&ContainerInfo) -> bool + Send + Sync),
    metrics: &Metrics,
) -> SweepOutcome {
    let mut out = SweepOutcome::default();
    for c in runtime.list() {
        if !eligible(&c) || !runtime.any_alive(&c.id) {
            continue;
        }
        let res = runtime.kill_all(&c.id).await;
        let alive = runtime.any_alive(&c.id);
        match res {
            Ok(()) if !alive => out.killed.push(c.id),
            other => {
                tracing::warn!(
                    container = %c.id,
                    pod_uid = %c.pod_uid,
                    error = ?other.err(),
                    still_alive = alive,
                    "self-fence: cannot confirm the container is dead"
                );
                metrics
                    .self_fence_kill_failures
                    .fetch_add(1, Ordering::Relaxed);
                out.unconfirmed.push(c.id);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex;
    use std::time::Duration;

    use chrono::Utc;

    use super::*;
    use crate::runtime::{ContainerConfig, ExitStatus, RuntimeError};

    /// A runtime of containers that are alive until killed; some refuse to die.
    #[derive(Default)]
    struct Fake {
        ctrs: BTreeMap<String, String>,
        alive: Mutex<BTreeSet<String>>,
        unkillable: BTreeSet<String>,
        failing: BTreeSet<String>,
    }

    impl Fake {
        fn with(ctrs: &[(&str, &str)]) -> Self {
            Fake {
                ctrs: ctrs
                    .iter()
                    .map(|(id, p)| (id.to_string(), p.to_string()))
                    .collect(),
                alive: Mutex::new(ctrs.iter().map(|(id, _)| id.to_string()).collect()),
                ..Default::default()
            }
        }
    }

    #[async_trait::async_trait]
    impl Runtime for Fake {
        async fn start_with_mounts(
            &self,
            _: &ContainerConfig,
            _: &[crate::mounts::Mount],
        ) -> Result<ContainerInfo, RuntimeError> {
            Err(RuntimeError::StartFailed {
                id: "fake".into(),
                message: "the fake runtime starts nothing".into(),
            })
        }
        fn signal(&self, _: &str, _: nix::sys::signal::Signal) -> Result<(), RuntimeError> {
            Ok(())
        }
        async fn kill_all(&self, id: &str) -> Result<(), RuntimeError> {
            // A kill takes time: the sweep must wait for it, not fire and forget.
            tokio::time::sleep(Duration::from_millis(100)).await;
            if self.failing.contains(id) {
                return Err(RuntimeError::NotFound { id: id.to_string() });
            }
            if !self.unkillable.contains(id) {
                self.alive.lock().unwrap().remove(id);
            }
            Ok(())
        }
        fn exit_status(&self, _: &str) -> Result<Option<ExitStatus>, RuntimeError> {
            Ok(None)
        }
        async fn wait(&self, id: &str) -> Result<ExitStatus, RuntimeError> {
            Err(RuntimeError::NotFound { id: id.to_string() })
        }
        fn any_alive(&self, id: &str) -> bool {
            self.alive.lock().unwrap().contains(id)
        }
        async fn exec(&self, _: &str, _: &[String], _: Duration) -> Result<i32, RuntimeError> {
            Ok(0)
        }
        fn list(&self) -> Vec<ContainerInfo> {
            self.ctrs
                .iter()
                .map(|(id, pod)| ContainerInfo {
                    id: id.clone(),
                    pod_uid: pod.clone(),
                    name: id.clone(),
                    attempt: 0,
                    started_at: Utc::now(),
                })
                .collect()
        }
        async fn remove(&self, _: &str) -> Result<(), RuntimeError> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn kills_every_eligible_container_and_leaves_the_rest() {
        let rt = Fake::with(&[("a1", "pa"), ("a2", "pa"), ("b1", "pb")]);
        let m = Metrics::default();
        let out = sweep(&rt, &|c: &ContainerInfo| c.pod_uid == "pa", &m).await;
        assert_eq!(out.killed, vec!["a1".to_string(), "a2".to_string()]);
        assert!(out.complete());
        assert!(!rt.any_alive("a1") && !rt.any_alive("a2"));
        assert!(rt.any_alive("b1"), "an ineligible pod is left alone");
        assert_eq!(m.self_fence_kill_failures.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_that_survives_or_a_failed_kill_is_reported_not_ignored() {
        let mut rt = Fake::with(&[("ok", "p"), ("stuck", "p"), ("err", "p")]);
        rt.unkillable.insert("stuck".into());
        rt.failing.insert("err".into());
        let m = Metrics::default();
        let out = sweep(&rt, &|_: &ContainerInfo| true, &m).await;
        assert_eq!(out.killed, vec!["ok".to_string()]);
        assert_eq!(
            out.unconfirmed,
            vec!["err".to_string(), "stuck".to_string()]
        );
        assert!(!out.complete());
        assert_eq!(m.self_fence_kill_failures.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn dead_containers_are_not_killed_again() {
        let rt = Fake::with(&[("x", "p")]);
        rt.alive.lock().unwrap().clear();
        let out = sweep(&rt, &|_: &ContainerInfo| true, &Metrics::default()).await;
        assert_eq!(out, SweepOutcome::default());
    }
}
