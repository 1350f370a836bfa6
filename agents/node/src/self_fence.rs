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
#[tracing::instrument(name = "self_fence_sweep", skip_all)]
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
    use super::*;
    use crate::runtime::fake::{FakeRuntime, Script};
    use crate::runtime::ContainerConfig;

    /// Starts containers `(name, pod UID)`; returns their ids.
    async fn started(rt: &FakeRuntime, ctrs: &[(&str, &str)]) -> Vec<String> {
        let mut ids = Vec::new();
        for (name, pod) in ctrs {
            let cfg = ContainerConfig {
                pod_uid: pod.to_string(),
                name: name.to_string(),
                attempt: 0,
                argv: vec!["run".into()],
                env: Vec::new(),
                working_dir: None,
                rootfs: None,
            };
            ids.push(rt.start(&cfg).await.expect("start").id);
        }
        ids
    }

    #[tokio::test(start_paused = true)]
    async fn kills_every_eligible_container_and_leaves_the_rest() {
        let rt = FakeRuntime::default();
        let ids = started(&rt, &[("a1", "pa"), ("a2", "pa"), ("b1", "pb")]).await;
        let m = Metrics::default();
        let out = sweep(&rt, &|c: &ContainerInfo| c.pod_uid == "pa", &m).await;
        assert_eq!(out.killed, vec![ids[0].clone(), ids[1].clone()]);
        assert!(out.complete());
        assert!(!rt.any_alive(&ids[0]) && !rt.any_alive(&ids[1]));
        assert!(rt.any_alive(&ids[2]), "an ineligible pod is left alone");
        assert_eq!(m.self_fence_kill_failures.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_that_survives_or_a_failed_kill_is_reported_not_ignored() {
        let rt = FakeRuntime::default();
        rt.script(
            "stuck",
            Script {
                survives_kill: true,
                ..Default::default()
            },
        );
        rt.script(
            "err",
            Script {
                kill_fails: true,
                ..Default::default()
            },
        );
        let ids = started(&rt, &[("ok", "p"), ("stuck", "p"), ("err", "p")]).await;
        let m = Metrics::default();
        let out = sweep(&rt, &|_: &ContainerInfo| true, &m).await;
        assert_eq!(out.killed, vec![ids[0].clone()]);
        assert_eq!(out.unconfirmed, vec![ids[2].clone(), ids[1].clone()]);
        assert!(!out.complete());
        assert_eq!(m.self_fence_kill_failures.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn dead_containers_are_not_killed_again() {
        let rt = FakeRuntime::default();
        let ids = started(&rt, &[("x", "p")]).await;
        rt.kill_all(&ids[0]).await.expect("kill");
        let out = sweep(&rt, &|_: &ContainerInfo| true, &Metrics::default()).await;
        assert_eq!(out, SweepOutcome::default());
        assert_eq!(rt.kills("x").len(), 1, "killed once, before the sweep");
    }
}
