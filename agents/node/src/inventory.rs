//! The runtime inventory the agent advertises with every Lease renewal: the UIDs of the pods
//! that still have a live process in its runtime, and of every pod that has a pod worker (which
//! may start or restart its containers), together with the recovery challenge it answers.
//!
//! It comes from the runtime (processes, and the containers adopted from durable state after a
//! restart) and from the agent's own workers, never from the API: after a release the API lists
//! no pod on the node whatever still runs there, so only this inventory can prove the released
//! pods' containers are gone. The challenge orders the inventory after the release by
//! causality, with no clock: see [`answer`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use palisade_model::advertise::RECOVERY_CHALLENGE;
use parking_lot::Mutex;

use crate::runtime::Runtime;

/// The recovery challenge last read from this agent's Node (annotation [`RECOVERY_CHALLENGE`],
/// written by the controller after it released the node's pods), shared by [`crate::node::status_loop`],
/// which reads it from every Node status update, and the advertiser, which echoes it with the
/// inventory ([`crate::inventory::answer`]).
///
/// Guarantees: it only ever holds a value (trimmed, non-empty) that the API server returned,
/// and a response without one clears it; a failed update leaves it as it was, still a value
/// read earlier, which is all an answer needs.
///
/// Assumptions: a status update's response is the Node as stored by that write, so the value
/// was on the Node when the update was served (the controller writes it only after the release).
#[derive(Debug, Clone, Default)]
pub struct RecoveryChallenge(
    Arc<parking_lot::Mutex<Option<String>>>,
    Arc<tokio::sync::Notify>,
);

impl RecoveryChallenge {
    /// The challenge last read.
    pub fn get(&self) -> Option<String> {
        self.0.lock().clone()
    }

    /// Completes once the challenge read changes after the last completion (a change that
    /// nobody awaits is remembered), so the next renewal can answer it without waiting a
    /// renew interval.
    pub async fn changed(&self) {
        self.1.notified().await;
    }

    /// Takes the challenge from `node`, as the API server returned it.
    pub(crate) fn observe(&self, node: &Node) {
        let value = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RECOVERY_CHALLENGE))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let mut cur = self.0.lock();
        if *cur != value {
            tracing::info!(challenge = ?value, "recovery challenge read from the Node");
            *cur = value;
            self.1.notify_one();
        }
    }

    #[cfg(test)]
    pub(crate) fn set(&self, value: Option<String>) {
        *self.0.lock() = value;
    }
}

/// The pods that have a pod worker, by UID: the pods whose containers the agent may start or
/// restart.
///
/// Guarantees (kept by [`crate::pod_worker::spawn`]): a worker's UID is registered before its
/// task starts, so before the worker reads its pod and before it starts anything, and released
/// only once the worker has finished terminating (every process of its containers confirmed
/// dead). Registrations are counted, so one worker's release never unlists another worker of
/// the same UID. A worker whose task panics is never released: its pod stays listed, the safe
/// side.
#[derive(Debug, Default)]
pub struct ManagedPods(Mutex<BTreeMap<String, usize>>);

impl ManagedPods {
    /// Registers one worker of `uid`.
    pub(crate) fn register(&self, uid: &str) {
        *self.0.lock().entry(uid.to_string()).or_default() += 1;
    }

    /// Releases one registration of `uid` (made by [`ManagedPods::register`]).
    pub(crate) fn release(&self, uid: &str) {
        let mut m = self.0.lock();
        if let Some(n) = m.get_mut(uid) {
            *n -= 1;
            if *n == 0 {
                m.remove(uid);
            }
        }
    }

    /// The UIDs with at least one registered worker.
    pub fn uids(&self) -> BTreeSet<String> {
        self.0.lock().keys().cloned().collect()
    }
}

/// Pod UIDs with at least one container that has a live process.
///
/// Guarantees: a container is left out only when the runtime reports none of its processes
/// alive; a container the runtime still lists is counted while any process of it runs.
pub fn live_pods(runtime: &dyn Runtime) -> BTreeSet<String> {
    runtime
        .list()
        .into_iter()
        .filter(|c| runtime.any_alive(&c.id))
        .map(|c| c.pod_uid)
        .collect()
}

/// The runtime inventory: [`live_pods`] ∪ the [`ManagedPods`].
///
/// Guarantees: a pod left out had no live container when the runtime was read, and no worker
/// when the managed pods were read just after; so at that second moment it is neither running
/// (only a worker starts containers, and a worker that started one in between is either still
/// registered, hence listed, or has confirmed every process dead) nor managed.
///
/// Assumptions: only pod workers start containers, and [`ManagedPods`] keeps its guarantees.
pub fn runtime_pods(runtime: &dyn Runtime, managed: &ManagedPods) -> BTreeSet<String> {
    // The runtime first, then the workers: see the guarantee.
    let mut pods = live_pods(runtime);
    pods.extend(managed.uids());
    pods
}

/// What one renewal advertises for recovery: a runtime inventory and the recovery challenge
/// read before it was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The recovery challenge read before [`Answer::runtime_pods`] was taken.
    pub challenge: Option<String>,
    /// The runtime inventory ([`runtime_pods`]).
    pub runtime_pods: BTreeSet<String>,
}

/// Reads the recovery challenge, then takes the runtime inventory.
///
/// Guarantees (what [`palisade_model::advertise::Advertisement::challenge`] promises): the
/// challenge was read from the API server before the inventory was taken. A pod the inventory
/// leaves out is then neither running nor managed ([`runtime_pods`]), and a worker created for
/// it later starts nothing before a read of the pod, made after its registration and so after
/// the challenge was read, shows it with the same UID bound to this node (`pod_worker`'s
/// confirmation). When the controller wrote the challenge only after deleting a released pod,
/// that read answers 404: an inventory that answers the challenge and leaves the pod out stays
/// true.
///
/// Assumptions: `challenge` holds only values the API server returned ([`RecoveryChallenge`]);
/// [`runtime_pods`]'s assumptions.
pub fn answer(
    challenge: &RecoveryChallenge,
    runtime: &dyn Runtime,
    managed: &ManagedPods,
) -> Answer {
    // The order is the proof: the challenge first, then the inventory. Swapped, an inventory
    // taken before the release could be advertised as the answer to a challenge written after.
    let challenge = challenge.get();
    let runtime_pods = runtime_pods(runtime, managed);
    Answer {
        challenge,
        runtime_pods,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::pod_worker::testing::{container, deleted, pod, until, Harness, UID};
    use crate::runtime::fake::{FakeRuntime, Script};
    use crate::runtime::{ContainerConfig, ContainerInfo, ExitStatus, RuntimeError};

    fn config(pod_uid: &str, name: &str) -> ContainerConfig {
        ContainerConfig {
            pod_uid: pod_uid.into(),
            name: name.into(),
            attempt: 0,
            argv: vec!["run".into()],
            env: Vec::new(),
            working_dir: None,
            rootfs: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn live_containers_are_listed_and_dead_ones_are_not() {
        let rt = FakeRuntime::default();
        let managed = ManagedPods::default();
        rt.start(&config("live", "a")).await.expect("start");
        let dead = rt.start(&config("dead", "b")).await.expect("start");
        rt.kill_all(&dead.id).await.expect("kill");
        assert_eq!(runtime_pods(&rt, &managed), BTreeSet::from(["live".into()]));
    }

    #[test]
    fn registrations_are_counted() {
        let m = ManagedPods::default();
        m.register("u");
        m.register("u");
        m.release("u");
        assert_eq!(m.uids(), BTreeSet::from(["u".into()]), "one worker is left");
        m.release("u");
        m.release("u");
        assert!(m.uids().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_managed_pod_without_a_live_container_is_listed_until_its_worker_ends() {
        let h = Harness::new();
        h.runtime.script(
            "app",
            Script {
                exits_after: Some((Duration::from_secs(1), 1)),
                ..Default::default()
            },
        );
        let p = pod(json!({"containers": [container("app")]}));
        let w = h.spawn(&p);
        until("app restarted once", || h.runtime.starts("app").len() == 2).await;
        // The second run exited after 1 s; the next start waits 10 s: nothing is live.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!h.runtime.running("app"));
        assert!(live_pods(h.runtime.as_ref()).is_empty());
        assert_eq!(
            runtime_pods(h.runtime.as_ref(), &h.ctx.managed),
            BTreeSet::from([UID.to_string()]),
            "its worker may restart it"
        );

        w.pod_tx.send_replace(deleted(&p, 30));
        w.join.await.expect("worker");
        assert!(runtime_pods(h.runtime.as_ref(), &h.ctx.managed).is_empty());
    }

    /// A runtime whose `list` stands for the moment the inventory is taken: it records that a
    /// new challenge was read at that moment.
    struct ChallengedWhileListing {
        inner: FakeRuntime,
        challenge: RecoveryChallenge,
    }

    #[async_trait::async_trait]
    impl Runtime for ChallengedWhileListing {
        async fn start_with_mounts(
            &self,
            config: &ContainerConfig,
            mounts: &[crate::mounts::Mount],
        ) -> Result<ContainerInfo, RuntimeError> {
            self.inner.start_with_mounts(config, mounts).await
        }
        fn signal(&self, id: &str, signal: nix::sys::signal::Signal) -> Result<(), RuntimeError> {
            self.inner.signal(id, signal)
        }
        async fn kill_all(&self, id: &str) -> Result<(), RuntimeError> {
            self.inner.kill_all(id).await
        }
        fn exit_status(&self, id: &str) -> Result<Option<ExitStatus>, RuntimeError> {
            self.inner.exit_status(id)
        }
        async fn wait(&self, id: &str) -> Result<ExitStatus, RuntimeError> {
            self.inner.wait(id).await
        }
        fn any_alive(&self, id: &str) -> bool {
            self.inner.any_alive(id)
        }
        async fn exec(
            &self,
            id: &str,
            argv: &[String],
            timeout: Duration,
        ) -> Result<i32, RuntimeError> {
            self.inner.exec(id, argv, timeout).await
        }
        fn list(&self) -> Vec<ContainerInfo> {
            self.challenge.set(Some("read-during-the-inventory".into()));
            self.inner.list()
        }
        async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
            self.inner.remove(id).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_answered_challenge_is_the_one_read_before_the_inventory() {
        let challenge = RecoveryChallenge::default();
        challenge.set(Some("c-1".into()));
        let rt = ChallengedWhileListing {
            inner: FakeRuntime::default(),
            challenge: challenge.clone(),
        };
        rt.start(&config("p1", "a")).await.expect("start");
        let managed = ManagedPods::default();
        managed.register("p2");

        let a = answer(&challenge, &rt, &managed);
        assert_eq!(a.challenge.as_deref(), Some("c-1"));
        assert_eq!(
            a.runtime_pods,
            BTreeSet::from(["p1".to_string(), "p2".to_string()])
        );
    }
}
