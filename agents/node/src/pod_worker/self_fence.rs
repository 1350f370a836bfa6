//! Self-fencing inside a worker: while [`FenceState::active`](super::FenceState), the
//! containers of a fence-eligible pod are SIGKILLed and not restarted until the API confirms
//! that the pod still belongs to this node.

use chrono::Utc;
use tokio::time::Instant;

use super::{Kind, Worker};
use crate::volumes;

impl Worker {
    pub(super) fn fence_eligible(&self) -> bool {
        let f = *self.ctx.fence.borrow();
        f.all_pods || volumes::uses_pvc(&self.pod)
    }

    pub(super) async fn self_fence(&mut self) {
        tracing::warn!(
            "self-fencing: Lease not renewed in time, SIGKILLing every container of the pod"
        );
        let policy = "Never";
        for i in 0..self.ctrs.len() {
            let Some(id) = self.ctrs[i].id.clone() else {
                continue;
            };
            let _ = self.ctx.runtime.kill_all(&id).await;
            let was_finished = self.ctrs[i].finished;
            self.on_exit(
                i,
                137,
                Some(9),
                "SelfFenced",
                Some("killed by palisade-node self-fencing".into()),
                Utc::now(),
                policy,
            )
            .await;
            // Fencing is not the container's fault: it neither finishes nor fails the pod.
            self.ctrs[i].finished = was_finished;
            self.ctrs[i].init_done = self.ctrs[i].init_done && self.ctrs[i].kind == Kind::Init;
        }
        self.pod_failed = false;
        self.rec.fenced = true;
        self.save();
        self.ctx
            .metrics
            .self_fences
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.event(
            true,
            "SelfFenced",
            "palisade-node could not renew its Lease: killed every container of this pod".into(),
        );
    }

    pub(super) async fn try_lift_fence(&mut self) {
        match self.ctx.status.get(&self.pref).await {
            Ok(p) => {
                let same = p.metadata.uid.as_deref() == Some(self.pref.uid.as_str())
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(self.ctx.node_name.as_str());
                if !same {
                    self.gone = true;
                    return;
                }
                if p.metadata.deletion_timestamp.is_some() {
                    self.pod = p;
                    return;
                }
                tracing::info!("API confirms the pod still belongs here: lifting the self-fence");
                self.pod = p;
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
            Err(e) if e.is_gone() => self.gone = true,
            Err(e) => tracing::debug!(error = %e, "cannot confirm pod after self-fence yet"),
        }
    }
}
