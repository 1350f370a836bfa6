//! Probes: running the startup, liveness and readiness probes that are due (exec probes
//! through the runtime, the others over the network) and acting on their verdicts. A startup
//! probe gates the others; a failed liveness or startup probe kills the container (with that
//! probe's grace period, if it has one) so that it restarts; readiness only flips `ready`.
//! A self-fence that begins during such a kill does not wait for that grace period: it KILLs
//! at once and fences the pod (see `termination.rs`, `Worker::kill_container`).

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
                self.kill_container(i, reason, None).await;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::Signal;
    use serde_json::json;
    use tokio::time::Instant;

    use crate::pod_worker::testing::{
        condition, container, pod, ready_flags, until, Harness, CLAIM,
    };
    use crate::pod_worker::{FenceState, TICK};
    use crate::runtime::fake::{ExecScript, Script};

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn exits_with(code: i32) -> ExecScript {
        ExecScript {
            code,
            takes: Duration::ZERO,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_liveness_probe_restarts_the_container_with_the_probe_grace_period() {
        let h = Harness::new();
        h.runtime.script(
            "app",
            Script {
                ignores_term: true,
                ..Default::default()
            },
        );
        h.runtime.exec_script("alive", exits_with(0));
        let mut app = container("app");
        app["livenessProbe"] = json!({
            "exec": {"command": ["alive"]},
            "periodSeconds": 1, "failureThreshold": 3, "terminationGracePeriodSeconds": 5,
        });
        let _w = h.spawn(&pod(
            json!({"terminationGracePeriodSeconds": 60, "containers": [app]}),
        ));
        until("app runs", || h.runtime.running("app")).await;
        tokio::time::sleep(secs(30)).await;
        assert!(
            h.runtime.signals("app", Signal::SIGTERM).is_empty(),
            "healthy: left alone"
        );

        h.runtime.exec_script("alive", exits_with(1));
        let failing = Instant::now();
        until("restarted", || h.runtime.starts("app").len() == 2).await;

        let terms = h.runtime.signals("app", Signal::SIGTERM);
        assert_eq!(terms.len(), 1);
        assert!(
            terms[0] <= failing + secs(4),
            "three failed runs, one per second: {:?}",
            terms[0] - failing
        );
        assert_eq!(h.runtime.kills("app"), vec![terms[0] + secs(5)]);
        assert!(h.sink.events().iter().any(|(r, m)| r == "Killing"
            && m == "Container app failed Liveness probe, will be restarted"));
        until("restart counted", || {
            h.sink.last_status().is_some_and(|s| {
                s.container_statuses
                    .is_some_and(|c| c[0].restart_count == 1)
            })
        })
        .await;
    }

    /// Issue 32 item 15: a self-fence that begins while a liveness probe's kill waits out the
    /// probe's grace period KILLs at once; it does not wait for that grace period.
    #[tokio::test(start_paused = true)]
    async fn a_self_fence_does_not_wait_for_a_liveness_kill_grace_period() {
        let h = Harness::new();
        h.runtime.script(
            "db",
            Script {
                ignores_term: true,
                ..Default::default()
            },
        );
        h.runtime.exec_script("alive", exits_with(1));
        let mut db = container("db");
        db["livenessProbe"] = json!({
            "exec": {"command": ["alive"]},
            "periodSeconds": 1, "failureThreshold": 1, "terminationGracePeriodSeconds": 60,
        });
        let _w = h.spawn(&pod(json!({
            "terminationGracePeriodSeconds": 60,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
            "containers": [db],
        })));
        until("probe kill under way", || {
            !h.runtime.signals("db", Signal::SIGTERM).is_empty()
        })
        .await;
        let term = h.runtime.signals("db", Signal::SIGTERM)[0];
        tokio::time::sleep(secs(5)).await;
        h.fence.send_replace(FenceState {
            active: true,
            all_pods: false,
        });
        let fenced = Instant::now();
        until("db killed", || !h.runtime.kills("db").is_empty()).await;

        let kills = h.runtime.kills("db");
        assert!(
            kills[0] < term + secs(60),
            "killed at the fence, not at the end of the probe's grace period"
        );
        assert!(
            kills[0] - fenced <= TICK,
            "killed within one tick of the fence"
        );
        tokio::time::sleep(secs(120)).await;
        assert_eq!(
            h.runtime.starts("db").len(),
            1,
            "not restarted while fenced"
        );
        let status = h.sink.last_status().expect("status");
        assert_eq!(status.reason.as_deref(), Some("SelfFenced"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_readiness_probe_flips_ready_and_restarts_nothing() {
        let h = Harness::new();
        h.runtime.exec_script("ready", exits_with(0));
        let mut app = container("app");
        app["readinessProbe"] = json!({
            "exec": {"command": ["ready"]}, "periodSeconds": 1, "failureThreshold": 2,
        });
        let _w = h.spawn(&pod(json!({"containers": [app]})));
        let ready = |h: &Harness| {
            h.sink
                .last_status()
                .map(|s| (condition(&s, "Ready"), ready_flags(&s).get("app").copied()))
        };
        until("ready", || {
            ready(&h) == Some((Some("True".into()), Some(true)))
        })
        .await;

        h.runtime.exec_script("ready", exits_with(1));
        until("unready", || {
            ready(&h) == Some((Some("False".into()), Some(false)))
        })
        .await;
        h.runtime.exec_script("ready", exits_with(0));
        until("ready again", || {
            ready(&h) == Some((Some("True".into()), Some(true)))
        })
        .await;

        assert_eq!(h.runtime.starts("app").len(), 1);
        assert!(h.runtime.signals("app", Signal::SIGTERM).is_empty());
        assert!(h.runtime.kills("app").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn no_liveness_probe_runs_before_the_startup_probe_succeeds() {
        let h = Harness::new();
        h.runtime.exec_script("started", exits_with(1));
        h.runtime.exec_script("alive", exits_with(1));
        let mut app = container("app");
        app["startupProbe"] = json!({
            "exec": {"command": ["started"]}, "periodSeconds": 1, "failureThreshold": 100,
        });
        app["livenessProbe"] = json!({
            "exec": {"command": ["alive"]}, "periodSeconds": 1, "failureThreshold": 1,
        });
        let _w = h.spawn(&pod(json!({"containers": [app]})));
        until("app runs", || h.runtime.running("app")).await;
        tokio::time::sleep(secs(30)).await;

        let ran = |cmd: &str| {
            h.runtime
                .calls()
                .into_iter()
                .filter(|(_, c)| {
                    matches!(c, crate::runtime::fake::Call::Exec { argv, .. } if argv[0] == cmd)
                })
                .count()
        };
        assert!(ran("started") >= 29, "startup probe runs every second");
        assert_eq!(ran("alive"), 0, "liveness waits for the startup probe");
        assert_eq!(h.runtime.starts("app").len(), 1);
    }
}
