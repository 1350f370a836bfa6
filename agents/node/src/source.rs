//! The pod source and worker manager: watches the pods bound to this node (`spec.nodeName`)
//! and keeps exactly one [`pod_worker`] per pod UID.
//!
//! On start it reconciles the state directory with the API: a recorded pod that the first
//! full list does not contain (deleted, replaced by a pod with another UID, or bound
//! elsewhere) has its containers killed and is forgotten. It never resumes a UID the API
//! no longer has.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::Api;
use tokio::sync::{mpsc, oneshot};

use crate::pod_worker::{self, Ctx, WorkerCmd, WorkerHandle};

/// Commands to the manager.
#[derive(Debug)]
pub enum ManagerCmd {
    /// Kill every pod and forget it (the Node object was deleted: that means "permanently
    /// partitioned", its pods may run elsewhere, so nothing may keep running here). Replies when done; the
    /// manager then runs no pods until [`ManagerCmd::Resume`].
    KillAll(oneshot::Sender<()>),
    /// Run pods again (after re-registration).
    Resume,
}

fn terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Runs the manager until the process ends.
pub async fn run(ctx: Arc<Ctx>, mut cmds: mpsc::Receiver<ManagerCmd>) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node_name));
    let mut stream = watcher(api, cfg).boxed();
    let mut workers: HashMap<String, WorkerHandle> = HashMap::new();
    let mut listing: HashSet<String> = HashSet::new();
    let mut first_list_done = false;
    let mut paused = false;
    // Pods killed because the Node object was deleted: released by the cluster, never run
    // again by this agent even if their objects still name this node.
    let mut tombstones: HashSet<String> = HashSet::new();
    let mut gc = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                Some(ManagerCmd::KillAll(reply)) => {
                    paused = true;
                    tombstones.extend(workers.keys().cloned());
                    tombstones.extend(ctx.store.all().into_iter().map(|r| r.uid));
                    for (_, w) in workers.drain() {
                        let _ = w.cmd_tx.send(WorkerCmd::Gone);
                        let _ = w.join.await;
                    }
                    for rec in ctx.store.all() {
                        pod_worker::reap_orphan(&ctx, &rec.uid).await;
                    }
                    for c in ctx.runtime.list() {
                        pod_worker::reap_orphan(&ctx, &c.pod_uid).await;
                    }
                    let _ = reply.send(());
                }
                Some(ManagerCmd::Resume) => paused = false,
                None => return,
            },
            _ = gc.tick() => {
                workers.retain(|_, w| !w.join.is_finished());
            }
            ev = stream.next() => {
                let Some(ev) = ev else { return };
                match ev {
                    Ok(watcher::Event::Init) => listing.clear(),
                    Ok(watcher::Event::InitApply(p)) => {
                        if let Some(uid) = p.metadata.uid.clone() { listing.insert(uid); }
                        if !paused { apply(&ctx, &mut workers, &tombstones, p); }
                    }
                    Ok(watcher::Event::InitDone) => {
                        for (uid, w) in &workers {
                            if !listing.contains(uid) {
                                let _ = w.cmd_tx.send(WorkerCmd::Gone);
                            }
                        }
                        if !first_list_done {
                            first_list_done = true;
                            reap_unknown(&ctx, &listing).await;
                        }
                    }
                    Ok(watcher::Event::Apply(p)) => { if !paused { apply(&ctx, &mut workers, &tombstones, p); } }
                    Ok(watcher::Event::Delete(p)) => {
                        if let Some(w) = p.metadata.uid.as_ref().and_then(|u| workers.get(u)) {
                            let _ = w.cmd_tx.send(WorkerCmd::Gone);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "pod watch error");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }
    }
}

fn apply(
    ctx: &Arc<Ctx>,
    workers: &mut HashMap<String, WorkerHandle>,
    tombstones: &HashSet<String>,
    p: Pod,
) {
    let Some(uid) = p.metadata.uid.clone() else {
        return;
    };
    if tombstones.contains(&uid) {
        return;
    }
    if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(ctx.node_name.as_str()) {
        return;
    }
    if let Some(w) = workers.get(&uid) {
        if !w.join.is_finished() {
            let _ = w.pod_tx.send(p);
            return;
        }
    }
    let record = ctx.store.load(&uid);
    if record.is_none() && terminal(&p) {
        // A finished pod this agent never ran (or already cleaned up).
        return;
    }
    if workers.get(&uid).is_some_and(|w| w.join.is_finished()) && record.is_none() {
        // Already terminated and cleaned up; the object is on its way out.
        return;
    }
    tracing::info!(pod = %crate::reporter::PodRef::of(&p), "starting pod worker");
    workers.insert(uid, pod_worker::spawn(ctx.clone(), p, record));
}

async fn reap_unknown(ctx: &Arc<Ctx>, listed: &HashSet<String>) {
    let mut uids: HashSet<String> = ctx.store.all().into_iter().map(|r| r.uid).collect();
    uids.extend(ctx.runtime.list().into_iter().map(|c| c.pod_uid));
    for uid in uids.difference(listed) {
        tracing::warn!(uid = %uid, "pod is gone, replaced or bound elsewhere: killing its containers");
        pod_worker::reap_orphan(ctx, uid).await;
    }
}
