//! Confirmation: a worker starts nothing before a fresh read of its pod, made after the worker
//! was registered in [`Ctx::managed`](super::Ctx::managed), shows the pod with the same UID
//! bound to this node.
//!
//! The watch that created the worker may be arbitrarily old: the controller may have released
//! the pod (force-deleted it) and, after that, written a recovery challenge that this agent has
//! already answered with an inventory that leaves the pod out. A read made after the worker's
//! registration comes after that answer was taken, so after the deletion: it answers 404 and
//! the worker never starts the pod ([`crate::inventory::answer`]). The same classification lifts
//! a self-fence ([`Worker::try_lift_fence`]).

use std::time::Duration;

use backon::BackoffBuilder as _;
use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::{normalize_sidecars, Worker};
use crate::backoff;
use crate::reporter::ReportError;

/// The first retry of a confirming read that failed, doubling up to [`CONFIRM_RETRY_MAX`].
const CONFIRM_RETRY_BASE: Duration = Duration::from_millis(200);
/// The longest wait between two confirming reads.
const CONFIRM_RETRY_MAX: Duration = Duration::from_secs(5);

/// What a fresh read of the pod says about running it on this node.
#[derive(Debug)]
pub(super) enum Verdict {
    /// The same UID, bound to this node, not being deleted: it may run here (the fetched pod).
    Belongs(Pod),
    /// The same UID, bound to this node, being deleted: the worker terminates it (the fetched
    /// pod, with its deletion grace period).
    Deleting(Pod),
    /// Not found, another UID, or bound elsewhere: the pod is gone from this node for good.
    Gone,
    /// The read failed otherwise: nothing is known, so nothing may start.
    Unknown(ReportError),
}

/// Classifies a read of the pod with UID `uid` made by the agent of node `node`.
///
/// Guarantees: [`Verdict::Belongs`] only for a pod with UID `uid` whose `spec.nodeName` is
/// `node` and that has no deletion timestamp; a 404 (or 409), another UID or another node is
/// [`Verdict::Gone`]; every other error is [`Verdict::Unknown`], never a confirmation. A fetched
/// pod comes back with its sidecars normalized, as every pod a worker holds.
pub(super) fn classify(read: Result<Pod, ReportError>, uid: &str, node: &str) -> Verdict {
    match read {
        Ok(mut p) => {
            let same = p.metadata.uid.as_deref() == Some(uid)
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
            if !same {
                return Verdict::Gone;
            }
            normalize_sidecars(&mut p);
            if p.metadata.deletion_timestamp.is_some() {
                Verdict::Deleting(p)
            } else {
                Verdict::Belongs(p)
            }
        }
        Err(e) if e.is_gone() => Verdict::Gone,
        Err(e) => Verdict::Unknown(e),
    }
}

impl Worker {
    /// Confirms the pod before the worker's first start: whether the sync may go on to start
    /// containers now.
    ///
    /// Guarantees: `true` only once a read of the pod made by this worker (so after its
    /// registration in [`Ctx::managed`](super::Ctx::managed)) was [`Verdict::Belongs`]; the
    /// worker then holds the fetched pod, and stays confirmed. A pod that is
    /// [`Verdict::Gone`] marks the worker gone (it terminates, killing any adopted container at
    /// once); one being deleted is taken as fetched (the worker's loop terminates it). A failed
    /// read is retried with [`backoff::retry`], at most [`CONFIRM_RETRY_MAX`] apart; until then
    /// this returns `false` at once, so the worker keeps following its commands, pod updates
    /// and the self-fence.
    ///
    /// Assumptions: [`StatusSink::get`](crate::reporter::StatusSink::get) is a quorum read, so
    /// it sees every write the API server completed before the read was sent (a 404 once the
    /// pod was deleted).
    pub(super) async fn confirm(&mut self) -> bool {
        if self.confirmed {
            return true;
        }
        if self
            .confirm_retry
            .as_ref()
            .is_some_and(|(_, at)| Instant::now() < *at)
        {
            return false;
        }
        let read = self.ctx.status.get(&self.pref).await;
        match classify(read, &self.pref.uid, &self.ctx.node_name) {
            Verdict::Belongs(p) => {
                tracing::debug!("API confirms the pod belongs here");
                self.pod = p;
                self.confirmed = true;
                self.confirm_retry = None;
                true
            }
            Verdict::Deleting(p) => {
                self.pod = p;
                false
            }
            Verdict::Gone => {
                tracing::info!("pod is gone, replaced or bound elsewhere: never starting it");
                self.gone = true;
                false
            }
            Verdict::Unknown(e) => {
                let (backoff, at) = self.confirm_retry.get_or_insert_with(|| {
                    (
                        backoff::retry(CONFIRM_RETRY_BASE, CONFIRM_RETRY_MAX).build(),
                        Instant::now(),
                    )
                });
                let delay = backoff::next_delay(backoff, CONFIRM_RETRY_MAX);
                *at = Instant::now() + delay;
                tracing::warn!(error = %e, retry_in = ?delay, "cannot confirm the pod before starting it; retrying");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::CONFIRM_RETRY_MAX;
    use crate::pod_worker::testing::{container, deleted, pod, until, Harness, NAME, UID};
    use crate::runtime::fake::FakeRuntime;
    use crate::runtime::{ContainerConfig, Runtime};
    use crate::state::{ContainerRecord, PodRecord, WorkerPhase};

    fn app_pod() -> k8s_openapi::api::core::v1::Pod {
        pod(json!({"containers": [container("app")]}))
    }

    /// Starts container `app` of the test pod in `rt`, as a previous agent left it, and returns
    /// the record a restarted agent resumes.
    async fn adopted(rt: &FakeRuntime) -> PodRecord {
        let info = rt
            .start(&ContainerConfig {
                pod_uid: UID.into(),
                name: "app".into(),
                attempt: 0,
                argv: vec!["run".into(), "app".into()],
                env: Vec::new(),
                working_dir: None,
                rootfs: None,
            })
            .await
            .expect("start");
        PodRecord {
            uid: UID.into(),
            namespace: "default".into(),
            name: NAME.into(),
            phase: WorkerPhase::Syncing,
            fenced: false,
            containers: [(
                "app".to_string(),
                ContainerRecord {
                    id: Some(info.id),
                    restart_count: 0,
                    next_attempt: 1,
                    init_done: false,
                },
            )]
            .into(),
            uses_pvc: Some(false),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_registers_its_pod_before_its_task_runs() {
        let h = Harness::new();
        let _w = h.spawn(&app_pod());
        // No await since the spawn: the task has not run yet.
        assert!(h.ctx.managed.uids().contains(UID));
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_whose_pod_the_api_no_longer_has_never_starts_it() {
        let h = Harness::new();
        let w = h.spawn_with(&app_pod(), None, None);
        until("worker ends", || w.join.is_finished()).await;

        assert!(h.runtime.starts("app").is_empty());
        assert!(h.ctx.managed.uids().is_empty(), "released once it ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_resumed_worker_whose_pod_is_gone_kills_its_adopted_container_and_starts_none() {
        let h = Harness::new();
        let record = adopted(&h.runtime).await;
        assert!(h.runtime.running("app"));
        let w = h.spawn_with(&app_pod(), Some(record), None);
        until("worker ends", || w.join.is_finished()).await;

        assert_eq!(h.runtime.starts("app").len(), 1, "only the adopted run");
        assert_eq!(h.runtime.kills("app").len(), 1, "the adopted run is killed");
        assert!(!h.runtime.running("app"));
        assert!(h.ctx.managed.uids().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_whose_pod_is_bound_elsewhere_or_replaced_never_starts_it() {
        let mut elsewhere = app_pod();
        if let Some(s) = elsewhere.spec.as_mut() {
            s.node_name = Some("node-b".into());
        }
        let mut replaced = app_pod();
        replaced.metadata.uid = Some("uid-2".into());
        for (what, api) in [("bound elsewhere", elsewhere), ("replaced", replaced)] {
            let h = Harness::new();
            let w = h.spawn_with(&app_pod(), None, Some(api));
            until(&format!("worker of a pod {what} ends"), || {
                w.join.is_finished()
            })
            .await;
            assert!(h.runtime.starts("app").is_empty(), "{what}: started");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_whose_pod_is_being_deleted_terminates_it_without_starting_it() {
        let h = Harness::new();
        let p = app_pod();
        let w = h.spawn_with(&p, None, Some(deleted(&p, 30)));
        until("worker ends", || w.join.is_finished()).await;

        assert!(h.runtime.starts("app").is_empty());
        let gone = h.sink.deleted();
        assert_eq!(gone.len(), 1, "the deletion is completed");
        assert_eq!(gone[0].1.uid, UID);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_starts_nothing_until_a_failed_read_of_its_pod_succeeds() {
        let h = Harness::new();
        let p = app_pod();
        h.sink.fail_gets(Some(503));
        let _w = h.spawn(&p);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(h.runtime.starts("app").is_empty());
        let gets = h.sink.gets();
        assert!(gets.len() >= 5, "retried: {} reads", gets.len());
        assert!(
            gets.len() <= 25,
            "backed off, not read at every tick: {} reads",
            gets.len()
        );
        let gaps: Vec<Duration> = gets.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps
            .iter()
            .all(|g| *g <= CONFIRM_RETRY_MAX + super::super::TICK));

        h.sink.fail_gets(None);
        until("app starts", || !h.runtime.starts("app").is_empty()).await;
        let last_read = *h.sink.gets().last().expect("a read");
        assert!(h.runtime.starts("app")[0] >= last_read);
        assert!(h.runtime.running("app"));
    }
}
