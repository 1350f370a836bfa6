//! Probes: running the startup, liveness and readiness probes that are due (exec probes
//! through the runtime, the others over the network) and acting on their verdicts. A startup
//! probe gates the others; a failed liveness or startup probe kills the container (with that
//! probe's grace period, if it has one) so that it restarts; readiness only flips `ready`.

use tokio::time::Instant;

use super::Worker;
use crate::grace::KillReason;
use crate::probe::{ProbeKind, ProbeOutcome};

impl Worker {
    pub(super) fn run_probes(&mut self) {
        let now = Instant::now();
        for c in &mut self.ctrs {
            let Some(id) = c.id.clone() else { continue };
            if !c.running() {
                continue;
            }
            let kinds: Vec<ProbeKind> = if c.startup_ok {
                vec![ProbeKind::Liveness, ProbeKind::Readiness]
            } else {
                vec![ProbeKind::Startup]
            };
            for kind in kinds {
                let Some(t) = c.probes.get_mut(&kind) else {
                    continue;
                };
                if !t.due(now) {
                    continue;
                }
                t.started(now);
                let probe = match kind {
                    ProbeKind::Startup => c.spec.startup_probe.clone(),
                    ProbeKind::Liveness => c.spec.liveness_probe.clone(),
                    ProbeKind::Readiness => c.spec.readiness_probe.clone(),
                };
                let Some(probe) = probe else { continue };
                let timeout = t.thresholds.timeout;
                let rt = self.ctx.runtime.clone();
                let tx = self.probe_tx.clone();
                let addr = self.ctx.address;
                let name = c.spec.name.clone();
                let ports = c.spec.ports.clone().unwrap_or_default();
                let id = id.clone();
                tokio::spawn(async move {
                    let outcome = if let Some(e) = &probe.exec {
                        let argv = e.command.clone().unwrap_or_default();
                        match rt.exec(&id, &argv, timeout).await {
                            Ok(0) => ProbeOutcome::Success,
                            Ok(code) => ProbeOutcome::Failure(format!(
                                "command {argv:?} exited with {code}"
                            )),
                            Err(e) => ProbeOutcome::Failure(e.to_string()),
                        }
                    } else {
                        crate::probe::run_network(&probe, addr, &ports, timeout)
                            .await
                            .unwrap_or_else(|| ProbeOutcome::Error("probe has no handler".into()))
                    };
                    let _ = tx.send(ProbeResult {
                        name,
                        id,
                        kind,
                        outcome,
                    });
                });
            }
        }
    }

    pub(super) async fn on_probe(&mut self, res: ProbeResult) {
        let Some(i) = self
            .ctrs
            .iter()
            .position(|c| c.spec.name == res.name && c.id.as_deref() == Some(&res.id))
        else {
            return;
        };
        let ok = res.outcome == ProbeOutcome::Success;
        let Some(t) = self.ctrs[i].probes.get_mut(&res.kind) else {
            return;
        };
        let verdict = t.record(ok);
        let kind = format!("{:?}", res.kind);
        match &res.outcome {
            ProbeOutcome::Success => {}
            ProbeOutcome::Failure(msg) => {
                self.event(true, "Unhealthy", format!("{kind} probe failed: {msg}"))
            }
            ProbeOutcome::Error(msg) => {
                self.event(true, "Unhealthy", format!("{kind} probe errored: {msg}"))
            }
        }
        let Some(v) = verdict else { return };
        let name = res.name.clone();
        match (res.kind, v) {
            (ProbeKind::Readiness, r) => self.ctrs[i].ready = r,
            (ProbeKind::Startup, true) => {
                self.ctrs[i].startup_ok = true;
                self.ctrs[i].ready = self.ctrs[i].spec.readiness_probe.is_none();
            }
            (ProbeKind::Liveness, true) => {}
            (kind @ (ProbeKind::Startup | ProbeKind::Liveness), false) => {
                let reason = if kind == ProbeKind::Startup {
                    KillReason::StartupProbe
                } else {
                    KillReason::LivenessProbe
                };
                self.event(
                    false,
                    "Killing",
                    format!("Container {name} failed {kind:?} probe, will be restarted"),
                );
                self.kill_container(i, reason, None, None).await;
            }
        }
    }
}

pub(super) struct ProbeResult {
    name: String,
    id: String,
    kind: ProbeKind,
    outcome: ProbeOutcome,
}
