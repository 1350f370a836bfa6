//! Status reporting: the pod status computed from the containers' states, sent latest-wins
//! by a background task so that a slow API server never blocks the worker, and the terminal
//! status reported (with retries) before the pod object is deleted.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, HostIP, PodIP, PodStatus};
use tokio::sync::watch;

use super::{Ctr, Kind, Worker};
use crate::reporter::{PodRef, StatusSink};
use crate::status::{self, ConditionInputs};

impl Worker {
    pub(super) fn report(&self) {
        let mut s = self.compute_status(false);
        // Transition times are kept by the computation; compare without them.
        let same = {
            let cur = self.status_tx.borrow();
            cur.as_ref()
                .is_some_and(|c| strip_times(c) == strip_times(&s))
        };
        if !same {
            s.start_time = s.start_time.or_else(|| Some(crate::ktime::now()));
            self.status_tx.send_replace(Some(s));
        }
    }

    pub(super) async fn report_final(&mut self) {
        let s = self.compute_status(true);
        self.status_tx.send_replace(None);
        for _ in 0..30 {
            match self.ctx.status.patch_status(&self.pref, &s).await {
                Ok(()) => return,
                Err(e) if e.is_gone() => return,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot report terminal status; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    pub(super) fn compute_status(&self, terminal: bool) -> PodStatus {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let (inits, mains) = self.statuses();
        let mut phase = status::pod_phase(&spec, &inits, &mains).to_string();
        if terminal {
            // Since 1.27 the kubelet moves a stopped pod to a terminal phase before deleting it.
            let all_ok = self.ctrs.iter().filter(|c| c.kind == Kind::Main).all(|c| {
                c.state
                    .terminated
                    .as_ref()
                    .is_some_and(|t| t.exit_code == 0)
            });
            phase = if all_ok {
                status::phase::SUCCEEDED
            } else {
                status::phase::FAILED
            }
            .to_string();
        }
        if self.pod_failed {
            phase = status::phase::FAILED.into();
        }
        let previous = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let now = crate::ktime::now();
        let conditions = status::pod_conditions(
            &ConditionInputs {
                spec: &spec,
                init_statuses: &inits,
                statuses: &mains,
                phase: &phase,
                sandbox_ready: self.sandbox.is_some() && !self.rec.fenced,
                previous: &previous,
            },
            &now,
        );
        let ip = self.ctx.address.to_string();
        let start_time = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.clone())
            .or_else(|| Some(crate::ktime::now()));
        PodStatus {
            phase: Some(phase),
            conditions: Some(conditions),
            container_statuses: Some(mains),
            init_container_statuses: if inits.is_empty() { None } else { Some(inits) },
            pod_ip: Some(ip.clone()),
            pod_ips: Some(vec![PodIP { ip: ip.clone() }]),
            host_ip: Some(ip.clone()),
            host_ips: Some(vec![HostIP { ip }]),
            start_time,
            message: self.sandbox_error.clone(),
            reason: if self.rec.fenced {
                Some("SelfFenced".into())
            } else {
                None
            },
            ..Default::default()
        }
    }

    pub(super) fn statuses(&self) -> (Vec<ContainerStatus>, Vec<ContainerStatus>) {
        let img = |c: &Ctr| c.spec.image.clone().unwrap_or_default();
        // The digest a pulled image resolved to, once the container is no longer Waiting.
        let status = |c: &Ctr| ContainerStatus {
            image_id: (c.state.waiting.is_none())
                .then(|| self.ctx.images.image_id(&img(c)))
                .flatten()
                .unwrap_or_default(),
            ..c.status(&img(c))
        };
        let inits = self
            .ctrs
            .iter()
            .filter(|c| c.kind != Kind::Main)
            .map(status)
            .collect();
        let mains = self
            .ctrs
            .iter()
            .filter(|c| c.kind == Kind::Main)
            .map(status)
            .collect();
        (inits, mains)
    }
}

fn strip_times(s: &PodStatus) -> serde_json::Value {
    let mut s = s.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_transition_time = None;
    }
    s.start_time = None;
    serde_json::to_value(s).unwrap_or_default()
}

/// Patches the latest status, latest-wins, so a slow API never blocks the worker.
pub(super) async fn status_loop(
    sink: Arc<dyn StatusSink>,
    pref: PodRef,
    mut rx: watch::Receiver<Option<PodStatus>>,
) {
    while rx.changed().await.is_ok() {
        let Some(s) = rx.borrow_and_update().clone() else {
            continue;
        };
        if let Err(e) = sink.patch_status(&pref, &s).await {
            if e.is_gone() {
                continue;
            }
            tracing::debug!(error = %e, "status patch failed; will retry");
            tokio::time::sleep(Duration::from_secs(1)).await;
            rx.mark_changed();
        }
    }
}
