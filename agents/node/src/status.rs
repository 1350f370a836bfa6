//! Pure computation of a pod's phase and conditions from its container statuses, following
//! the kubelet's `getPhase` and status manager.

use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Pod phases.
pub mod phase {
    /// Accepted, not all containers running yet.
    pub const PENDING: &str = "Pending";
    /// Bound, all containers created, at least one running or restarting.
    pub const RUNNING: &str = "Running";
    /// All containers terminated successfully and will not restart.
    pub const SUCCEEDED: &str = "Succeeded";
    /// All containers terminated, at least one failed, none will restart.
    pub const FAILED: &str = "Failed";
}

/// Whether an init container is a sidecar (`restartPolicy: Always`).
pub fn is_sidecar(c: &k8s_openapi::api::core::v1::Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn find<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

fn terminated_code(s: &ContainerStatus) -> Option<i32> {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .map(|t| t.exit_code)
}

fn last_terminated_code(s: &ContainerStatus) -> Option<i32> {
    s.last_state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .map(|t| t.exit_code)
}

fn is_running(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .and_then(|st| st.running.as_ref())
        .is_some()
}

fn is_waiting(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .and_then(|st| st.waiting.as_ref())
        .is_some()
}

/// Counts of the regular init containers' progress.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct InitProgress {
    /// Not yet finished successfully.
    pub pending: usize,
    /// Finished with a non-zero code.
    pub failed: usize,
}

/// The progress of the regular (non-sidecar) init containers.
pub fn init_progress(spec: &PodSpec, init_statuses: &[ContainerStatus]) -> InitProgress {
    let mut p = InitProgress::default();
    for c in spec.init_containers.iter().flatten() {
        if is_sidecar(c) {
            continue;
        }
        let Some(s) = find(init_statuses, &c.name) else {
            p.pending += 1;
            continue;
        };
        if is_running(s) {
            p.pending += 1;
        } else if let Some(code) = terminated_code(s) {
            if code != 0 {
                p.failed += 1;
            }
        } else if is_waiting(s) {
            match last_terminated_code(s) {
                Some(0) => {}
                Some(_) => p.failed += 1,
                None => p.pending += 1,
            }
        } else {
            p.pending += 1;
        }
    }
    p
}

/// The kubelet's `getPhase`.
pub fn pod_phase(
    spec: &PodSpec,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
) -> &'static str {
    let restart = spec.restart_policy.as_deref().unwrap_or("Always");
    let init = init_progress(spec, init_statuses);
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in &spec.containers {
        let Some(s) = find(statuses, &c.name) else {
            unknown += 1;
            continue;
        };
        if is_running(s) {
            running += 1;
        } else if let Some(code) = terminated_code(s) {
            stopped += 1;
            if code == 0 {
                succeeded += 1;
            }
        } else if is_waiting(s) {
            if last_terminated_code(s).is_some() {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if init.failed > 0 && restart == "Never" {
        return phase::FAILED;
    }
    if init.pending > 0 || waiting > 0 {
        return phase::PENDING;
    }
    if running > 0 && unknown == 0 {
        return phase::RUNNING;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if restart == "Always" {
            return phase::RUNNING;
        }
        if stopped == succeeded {
            return phase::SUCCEEDED;
        }
        if restart == "Never" {
            return phase::FAILED;
        }
        return phase::RUNNING;
    }
    phase::PENDING
}

/// Inputs of the condition computation that are not in the container statuses.
#[derive(Debug, Clone, Copy)]
pub struct ConditionInputs<'a> {
    /// The pod spec.
    pub spec: &'a PodSpec,
    /// Init container statuses (sidecars included).
    pub init_statuses: &'a [ContainerStatus],
    /// Regular container statuses.
    pub statuses: &'a [ContainerStatus],
    /// The pod's current phase.
    pub phase: &'a str,
    /// The sandbox (volumes, directories) is set up.
    pub sandbox_ready: bool,
    /// Current pod conditions, for readiness gates and for keeping transition times.
    pub previous: &'a [PodCondition],
}

fn condition(
    previous: &[PodCondition],
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    now: &Time,
) -> PodCondition {
    let status = if ok { "True" } else { "False" }.to_string();
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .or_else(|| Some(now.clone()));
    PodCondition {
        type_: type_.to_string(),
        status,
        reason: if ok { None } else { reason.map(str::to_string) },
        message: if ok { None } else { message },
        last_transition_time,
        last_probe_time: None,
        observed_generation: None,
    }
}

/// The five pod conditions (PodScheduled, PodReadyToStartContainers, Initialized,
/// ContainersReady, Ready), readiness gates included.
pub fn pod_conditions(input: &ConditionInputs<'_>, now: &Time) -> Vec<PodCondition> {
    let prev = input.previous;
    let terminal = input.phase == phase::SUCCEEDED || input.phase == phase::FAILED;
    let init = init_progress(input.spec, input.init_statuses);
    let sidecars_unstarted: Vec<&str> = input
        .spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c))
        .filter(|c| find(input.init_statuses, &c.name).is_none_or(|s| s.started != Some(true)))
        .map(|c| c.name.as_str())
        .collect();
    let initialized =
        terminal || (init.pending == 0 && init.failed == 0 && sidecars_unstarted.is_empty());

    let mut unready: Vec<&str> = input
        .spec
        .containers
        .iter()
        .filter(|c| !find(input.statuses, &c.name).is_some_and(|s| s.ready))
        .map(|c| c.name.as_str())
        .collect();
    unready.extend(
        input
            .spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| is_sidecar(c))
            .filter(|c| !find(input.init_statuses, &c.name).is_some_and(|s| s.ready))
            .map(|c| c.name.as_str()),
    );
    let containers_ready = !terminal && initialized && unready.is_empty();
    let (cr_reason, cr_message) = if terminal {
        ("PodCompleted", None)
    } else {
        (
            "ContainersNotReady",
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };

    let gates_false: Vec<&str> = input
        .spec
        .readiness_gates
        .iter()
        .flatten()
        .map(|g| g.condition_type.as_str())
        .filter(|t| !prev.iter().any(|c| c.type_ == *t && c.status == "True"))
        .collect();
    let ready = containers_ready && gates_false.is_empty();
    let (r_reason, r_message) = if !containers_ready {
        (cr_reason, cr_message.clone())
    } else {
        (
            "ReadinessGatesNotReady",
            Some(format!(
                "corresponding condition of pod readiness gate \"{}\" does not exist.",
                gates_false.join(", ")
            )),
        )
    };

    let mut out = vec![
        condition(
            prev,
            "PodReadyToStartContainers",
            input.sandbox_ready && !terminal,
            None,
            None,
            now,
        ),
        condition(
            prev,
            "Initialized",
            initialized,
            Some("ContainersNotInitialized"),
            Some("containers with incomplete status: init containers".into()),
            now,
        ),
        condition(prev, "Ready", ready, Some(r_reason), r_message, now),
        condition(
            prev,
            "ContainersReady",
            containers_ready,
            Some(cr_reason),
            cr_message,
            now,
        ),
        condition(prev, "PodScheduled", true, None, None, now),
    ];
    // Keep the conditions other writers own (readiness gates, DisruptionTarget, ...).
    for c in prev {
        if !out.iter().any(|o| o.type_ == c.type_) {
            out.push(c.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting, PodReadinessGate,
    };

    fn spec(restart: &str, init: &[&str], sidecars: &[&str], containers: &[&str]) -> PodSpec {
        let c = |n: &&str| Container {
            name: n.to_string(),
            ..Default::default()
        };
        let mut inits: Vec<Container> = init.iter().map(c).collect();
        inits.extend(sidecars.iter().map(|n| Container {
            name: n.to_string(),
            restart_policy: Some("Always".into()),
            ..Default::default()
        }));
        PodSpec {
            restart_policy: Some(restart.into()),
            init_containers: Some(inits),
            containers: containers.iter().map(c).collect(),
            ..Default::default()
        }
    }

    fn running(name: &str, ready: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready,
            started: Some(true),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn terminated(name: &str, code: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn waiting(name: &str, last_code: Option<i32>) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("CrashLoopBackOff".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            last_state: last_code.map(|c| ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: c,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn phase_table() {
        let s_always = spec("Always", &[], &[], &["a", "b"]);
        let s_never = spec("Never", &[], &[], &["a", "b"]);
        let s_onf = spec("OnFailure", &[], &[], &["a", "b"]);
        let cases: Vec<(&PodSpec, Vec<ContainerStatus>, &str)> = vec![
            (&s_always, vec![], phase::PENDING),
            (&s_always, vec![running("a", true)], phase::PENDING),
            (
                &s_always,
                vec![running("a", true), running("b", false)],
                phase::RUNNING,
            ),
            (
                &s_always,
                vec![running("a", true), waiting("b", None)],
                phase::PENDING,
            ),
            (
                &s_always,
                vec![running("a", true), waiting("b", Some(1))],
                phase::RUNNING,
            ),
            (
                &s_always,
                vec![terminated("a", 0), terminated("b", 0)],
                phase::RUNNING,
            ),
            (
                &s_never,
                vec![terminated("a", 0), terminated("b", 0)],
                phase::SUCCEEDED,
            ),
            (
                &s_never,
                vec![terminated("a", 0), terminated("b", 3)],
                phase::FAILED,
            ),
            (
                &s_never,
                vec![running("a", true), terminated("b", 3)],
                phase::RUNNING,
            ),
            (
                &s_onf,
                vec![terminated("a", 0), terminated("b", 0)],
                phase::SUCCEEDED,
            ),
            (
                &s_onf,
                vec![terminated("a", 0), terminated("b", 1)],
                phase::RUNNING,
            ),
        ];
        for (i, (spec, statuses, want)) in cases.into_iter().enumerate() {
            assert_eq!(pod_phase(spec, &[], &statuses), want, "case {i}");
        }
    }

    #[test]
    fn init_containers_gate_the_phase() {
        let s = spec("Never", &["i1", "i2"], &[], &["a"]);
        assert_eq!(pod_phase(&s, &[terminated("i1", 0)], &[]), phase::PENDING);
        assert_eq!(pod_phase(&s, &[terminated("i1", 1)], &[]), phase::FAILED);
        let s = spec("Always", &["i1"], &[], &["a"]);
        assert_eq!(
            pod_phase(&s, &[waiting("i1", Some(1))], &[]),
            phase::PENDING
        );
        assert_eq!(
            pod_phase(&s, &[terminated("i1", 0)], &[running("a", false)]),
            phase::RUNNING
        );
    }

    #[test]
    fn sidecars_do_not_block_initialization_once_started() {
        let s = spec("Always", &["i1"], &["side"], &["a"]);
        let now = crate::ktime::now();
        let inits = [terminated("i1", 0), running("side", true)];
        let statuses = [running("a", true)];
        let conds = pod_conditions(
            &ConditionInputs {
                spec: &s,
                init_statuses: &inits,
                statuses: &statuses,
                phase: phase::RUNNING,
                sandbox_ready: true,
                previous: &[],
            },
            &now,
        );
        let get = |t: &str| conds.iter().find(|c| c.type_ == t).unwrap().status.clone();
        assert_eq!(get("Initialized"), "True");
        assert_eq!(get("ContainersReady"), "True");
        assert_eq!(get("Ready"), "True");
        assert_eq!(get("PodScheduled"), "True");
        assert_eq!(get("PodReadyToStartContainers"), "True");
    }

    #[test]
    fn unready_container_and_readiness_gate_keep_ready_false() {
        let s = spec("Always", &[], &[], &["a", "b"]);
        let now = crate::ktime::now();
        let statuses = [running("a", true), running("b", false)];
        let input = ConditionInputs {
            spec: &s,
            init_statuses: &[],
            statuses: &statuses,
            phase: phase::RUNNING,
            sandbox_ready: true,
            previous: &[],
        };
        let conds = pod_conditions(&input, &now);
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        assert!(ready.message.as_deref().unwrap().contains("[b]"));

        let mut s2 = s.clone();
        s2.readiness_gates = Some(vec![PodReadinessGate {
            condition_type: "example.com/gate".into(),
        }]);
        let statuses = [running("a", true), running("b", true)];
        let input = ConditionInputs {
            spec: &s2,
            statuses: &statuses,
            ..input
        };
        let conds = pod_conditions(&input, &now);
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.reason.as_deref(), Some("ReadinessGatesNotReady"));
        let gate = PodCondition {
            type_: "example.com/gate".into(),
            status: "True".into(),
            ..Default::default()
        };
        let prev = [gate];
        let conds = pod_conditions(
            &ConditionInputs {
                previous: &prev,
                ..input
            },
            &now,
        );
        assert_eq!(
            conds.iter().find(|c| c.type_ == "Ready").unwrap().status,
            "True"
        );
        assert!(conds.iter().any(|c| c.type_ == "example.com/gate"));
    }

    #[test]
    fn transition_time_is_kept_while_status_is_unchanged() {
        let s = spec("Always", &[], &[], &["a"]);
        let t0 = Time(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(100));
        let t1 = crate::ktime::now();
        let statuses = [running("a", true)];
        let input = ConditionInputs {
            spec: &s,
            init_statuses: &[],
            statuses: &statuses,
            phase: phase::RUNNING,
            sandbox_ready: true,
            previous: &[],
        };
        let first = pod_conditions(&input, &t0);
        let second = pod_conditions(
            &ConditionInputs {
                previous: &first,
                ..input
            },
            &t1,
        );
        for c in &second {
            assert_eq!(c.last_transition_time.as_ref(), Some(&t0), "{}", c.type_);
        }
    }
}
