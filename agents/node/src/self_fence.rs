//! Self-fencing straight from the runtime: killing every fence-eligible container the runtime
//! lists, whether or not a pod worker exists for it.
//!
//! Pod workers fence the pods they run, but some containers have no worker that would: an
//! agent restarted while cut off from the API never completes its first LIST, so it starts no
//! worker for the containers it adopted from durable state. The sweep here works from the
//! runtime alone, so it covers those too: once at start when the last renewal is already too
//! old, and periodically while the fence is active ([`sweep_while_fenced`], in the
//! [`Scope`] the records on disk allow).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::pod_worker::FenceState;
use crate::runtime::{ContainerInfo, Runtime};
use crate::state::{PodRecord, StateStore};

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

/// Which containers a self-fence kills, judged from the runtime and the durable pod records
/// alone (no API): every container when `all_pods`, else every container except those of pods
/// whose record says they use no PersistentVolumeClaim.
///
/// Guarantees: a container is left out only on a positive record of a pod without a claim
/// (`uses_pvc == Some(false)`); a pod without a record, with an unreadable one, or with one
/// written before the field existed counts as in scope (doubt counts toward killing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    all_pods: bool,
    without_claim: HashSet<String>,
}

impl Scope {
    /// The scope of a self-fence that fences every pod (`all_pods`) or only pods with a
    /// claim, given the records in the state directory.
    pub fn of(all_pods: bool, records: &[PodRecord]) -> Self {
        Self {
            all_pods,
            without_claim: records
                .iter()
                .filter(|r| r.uses_pvc == Some(false))
                .map(|r| r.uid.clone())
                .collect(),
        }
    }

    /// Whether the self-fence kills container `c`.
    pub fn covers(&self, c: &ContainerInfo) -> bool {
        self.all_pods || !self.without_claim.contains(&c.pod_uid)
    }
}

/// How often [`sweep_while_fenced`] sweeps the runtime while the self-fence is active.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// Sweeps the runtime ([`sweep`]) as soon as the self-fence becomes active and then every
/// `period` while it stays active, over the containers in its [`Scope`] (read from `store`
/// before each sweep). Returns when the fence's sender is gone.
///
/// This covers what no pod worker fences (issue 32 item 11): an agent restarted within
/// `--self-fence-after` while cut off never completes its first LIST, so it starts no worker
/// for the containers it adopted, and a container of a pod that has no worker (or one that a
/// worker does not know of) would otherwise run on. Containers that workers fence are swept
/// too; a second kill of a dead container is harmless.
///
/// Guarantees: while `fence` is active, every container of the runtime in scope that has a
/// live process gets [`Runtime::kill_all`] within one `period` of the fence activating or of
/// the container appearing, and again at every later sweep while it survives (each failure
/// logged and counted in `self_fence_kill_failures`). Nothing is killed while the fence is
/// inactive.
///
/// Assumptions: `fence` is the state the workers follow; the runtime lists every container
/// it runs (adopted ones included) and its `any_alive` is truthful.
pub async fn sweep_while_fenced(
    runtime: Arc<dyn Runtime>,
    store: StateStore,
    mut fence: watch::Receiver<FenceState>,
    metrics: Arc<Metrics>,
    period: Duration,
) {
    loop {
        if fence.wait_for(|f| f.active).await.is_err() {
            return;
        }
        let all_pods = fence.borrow_and_update().all_pods;
        let scope = Scope::of(all_pods, &store.all());
        let out = sweep(
            runtime.as_ref(),
            &|c: &ContainerInfo| scope.covers(c),
            &metrics,
        )
        .await;
        if !out.killed.is_empty() {
            tracing::warn!(
                containers = ?out.killed,
                "self-fence: killed containers found in the runtime"
            );
        }
        if !out.complete() {
            tracing::error!(
                containers = ?out.unconfirmed,
                "self-fence: some containers could not be confirmed dead; sweeping again"
            );
        }
        // The next sweep after `period`, or at once when the fence changes (lifted: wait).
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            r = fence.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_worker::testing::until;
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

    fn record(uid: &str, uses_pvc: Option<bool>) -> PodRecord {
        PodRecord {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            phase: crate::state::WorkerPhase::Syncing,
            fenced: false,
            containers: Default::default(),
            uses_pvc,
        }
    }

    #[test]
    fn the_scope_leaves_out_only_pods_recorded_without_a_claim() {
        let recs = [
            record("claim", Some(true)),
            record("no-claim", Some(false)),
            record("old", None),
        ];
        let info = |pod: &str| ContainerInfo {
            id: format!("{pod}_c_0"),
            pod_uid: pod.into(),
            name: "c".into(),
            attempt: 0,
            started_at: jiff::Timestamp::now(),
        };
        let stateful = Scope::of(false, &recs);
        let covered = |s: &Scope| {
            ["claim", "no-claim", "old", "unrecorded"]
                .into_iter()
                .filter(|p| s.covers(&info(p)))
                .collect::<Vec<_>>()
        };
        assert_eq!(covered(&stateful), vec!["claim", "old", "unrecorded"]);
        assert_eq!(
            covered(&Scope::of(true, &recs)),
            vec!["claim", "no-claim", "old", "unrecorded"]
        );
    }

    /// Issue 32 item 11: an agent restarted within `--self-fence-after` while cut off starts no
    /// worker (no LIST), so when its fence activates later only a runtime sweep kills what it
    /// adopted; and it sweeps again while fenced, so a container that appears or survives a
    /// kill is killed at the next sweep.
    #[tokio::test(start_paused = true)]
    async fn a_fence_kills_adopted_containers_no_worker_owns_and_sweeps_again_while_fenced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = StateStore::open(dir.path()).expect("store");
        store.save(&record("pc", Some(true))).expect("save");
        store.save(&record("pn", Some(false))).expect("save");
        let rt = Arc::new(FakeRuntime::default());
        rt.script(
            "stuck",
            Script {
                survives_kill: true,
                ..Default::default()
            },
        );
        // Adopted from a previous agent: no worker runs for any of these.
        started(&rt, &[("claimed", "pc"), ("plain", "pn"), ("stray", "px")]).await;
        let (fence, rx) = watch::channel(FenceState::default());
        let m = Arc::new(Metrics::default());
        let task = tokio::spawn(sweep_while_fenced(
            rt.clone(),
            store.clone(),
            rx,
            m.clone(),
            SWEEP_PERIOD,
        ));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            rt.running("claimed") && rt.running("plain") && rt.running("stray"),
            "nothing is killed before the fence"
        );

        fence.send_replace(FenceState {
            active: true,
            all_pods: false,
        });
        let fenced = tokio::time::Instant::now();
        until("adopted containers in scope killed", || {
            !rt.running("claimed") && !rt.running("stray")
        })
        .await;
        assert!(rt.kills("claimed")[0] - fenced < SWEEP_PERIOD);
        assert!(
            rt.running("plain"),
            "a pod recorded without a claim is left"
        );

        // A container that appears while fenced, and one that survives its kill.
        started(&rt, &[("late", "pc"), ("stuck", "px")]).await;
        until("the late one killed", || !rt.running("late")).await;
        until("the stuck one killed twice", || {
            rt.kills("stuck").len() >= 2
        })
        .await;
        assert!(m.self_fence_kill_failures.load(Ordering::Relaxed) >= 2);
        assert!(rt.running("stuck"), "it survives: retried, not ignored");

        // Lifted: nothing more is killed.
        fence.send_replace(FenceState::default());
        tokio::time::sleep(SWEEP_PERIOD).await;
        let kills = rt.kills("stuck").len();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(rt.kills("stuck").len(), kills, "no sweep once lifted");
        assert!(rt.running("plain"));
        drop(fence);
        task.await.expect("the sweeper ends with its fence");
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
