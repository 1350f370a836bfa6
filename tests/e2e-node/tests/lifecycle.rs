//! Pod lifecycle on real machines: scheduling, termination arithmetic (TERM, grace period, KILL), restart
//! backoff, probes, init containers and sidecars, agent restarts.
//!
//! One lab (3 machines) is shared by the tests of this file; each test uses its own
//! namespace. Pods are pinned: termination timing on m0, restarts, probes, ordering and bad
//! input on m1, and the agent-restart test alone on m2 (it stops that machine's agent).

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::Api;
use palisade_lab::Lab;
use serde_json::json;

fn lab() -> &'static Lab {
    static LAB: OnceLock<Lab> = OnceLock::new();
    LAB.get_or_init(|| start_ready_lab(3))
}

fn host_pod(name: &str, node: &str, script: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", script]}]
        }
    })
}

#[test]
fn statefulset_of_three_runs_ready_on_three_machines() {
    let lab = lab();
    let rt = rt();
    let c = client(lab, &rt);
    namespace(&c, &rt, "sts");
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "serviceName": "web",
            "replicas": 3,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
                    ]}},
                    "containers": [{
                        "name": "app", "image": "host",
                        "command": ["/bin/sh", "-c", "echo $POD_NAME on $NODE; exec sleep 100000"],
                        "env": [
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                        ],
                        "readinessProbe": {"exec": {"command": ["/bin/true"]}, "periodSeconds": 1}
                    }]
                }
            }
        }
    }))
    .unwrap();
    let api: Api<StatefulSet> = Api::namespaced(c.clone(), "sts");
    rt.block_on(api.create(&PostParams::default(), &sts))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(c.clone(), "sts");
    let list = eventually("3 pods Running and Ready", Duration::from_secs(120), || {
        let l = rt.block_on(pods.list(&ListParams::default())).ok()?;
        let ok = l.items.len() == 3
            && l.items.iter().all(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && condition(p, "Ready").as_deref() == Some("True")
            });
        ok.then_some(l.items)
    });
    let mut nodes: Vec<String> = list
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    nodes.sort();
    assert_eq!(nodes, vec!["m0", "m1", "m2"], "one replica per machine");
    for p in &list {
        let node = p.spec.as_ref().unwrap().node_name.clone().unwrap();
        let m = lab.machine(&node).unwrap();
        let st = p.status.as_ref().unwrap();
        assert_eq!(
            st.pod_ip.as_deref(),
            Some(m.address().to_string().as_str()),
            "podIP is the machine address"
        );
        assert_eq!(
            st.host_ip.as_deref(),
            Some(m.address().to_string().as_str())
        );
        for t in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
            assert_eq!(condition(p, t).as_deref(), Some("True"), "{t}");
        }
        let cs = container(p, "app").unwrap();
        assert!(cs.state.unwrap().running.is_some());
        assert_eq!(cs.restart_count, 0);
    }
    // kubectl shows the same picture.
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(lab.control_plane().unwrap().admin_kubeconfig())
        .args(["get", "pods", "-n", "sts", "-o", "wide", "--no-headers"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(text.lines().count(), 3, "{text}");
    for line in text.lines() {
        assert!(
            line.contains("1/1") && line.contains("Running") && line.contains("10.213.0."),
            "{line}"
        );
    }
}

/// Measures, on a thread of its own, how late a 20 ms sleep wakes: the machine's timer
/// lateness while it runs (the worst seen so far).
struct TimerLateness {
    worst_us: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TimerLateness {
    fn start() -> Self {
        use std::sync::atomic::Ordering;
        let worst_us = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (w, s) = (worst_us.clone(), stop.clone());
        // Bounded: at most 10 minutes of 20 ms naps, and it stops with the test.
        std::thread::spawn(move || {
            let nap = Duration::from_millis(20);
            for _ in 0..30_000 {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let t = std::time::Instant::now();
                std::thread::sleep(nap);
                let over = t.elapsed().saturating_sub(nap).as_micros() as u64;
                w.fetch_max(over, Ordering::Relaxed);
            }
        });
        Self { worst_us, stop }
    }

    /// The worst lateness seen so far, in seconds.
    fn worst(&self) -> f64 {
        self.worst_us.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6
    }
}

impl Drop for TimerLateness {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One termination case: pod spec grace `g`, an optional preStop sleeping `p` seconds, a
/// container that ignores TERM and writes a heartbeat every 50 ms.
struct TermCase {
    name: &'static str,
    grace: i64,
    pre_stop: Option<u64>,
    /// The kubelet's TERM-to-KILL window after the preStop hook (or after TERM without one).
    want_window: f64,
    /// How long the hook is charged (min(p, g)).
    hook: f64,
}

#[test]
fn term_ignoring_pods_get_prestop_then_kill_at_the_seed_003_deadline() {
    let lab = lab();
    let rt = rt();
    let c = client(lab, &rt);
    namespace(&c, &rt, "term");
    let dir = scratch(lab, "term");
    let cases = [
        // No preStop: KILL at TERM + grace.
        TermCase {
            name: "plain",
            grace: 3,
            pre_stop: None,
            want_window: 3.0,
            hook: 0.0,
        },
        // preStop took 2 s of a 6 s grace: 4 s left.
        TermCase {
            name: "prestop",
            grace: 6,
            pre_stop: Some(2),
            want_window: 4.0,
            hook: 2.0,
        },
        // preStop overran a 3 s grace: cut at 3 s, then the one-off 2 s extension.
        TermCase {
            name: "overrun",
            grace: 3,
            pre_stop: Some(30),
            want_window: 2.0,
            hook: 3.0,
        },
        // A 1 s grace is raised to the 2 s minimum window.
        TermCase {
            name: "minimum",
            grace: 1,
            pre_stop: None,
            want_window: 2.0,
            hook: 0.0,
        },
    ];
    for tc in &cases {
        let d = dir.display();
        let n = tc.name;
        let script = format!("trap '' TERM; while true; do date +%s.%N > {d}/{n}.alive.tmp; mv {d}/{n}.alive.tmp {d}/{n}.alive; sleep 0.05; done");
        let mut pod = host_pod(n, "m0", &script);
        pod["spec"]["terminationGracePeriodSeconds"] = json!(tc.grace);
        if let Some(p) = tc.pre_stop {
            pod["spec"]["containers"][0]["lifecycle"] = json!({"preStop": {"exec": {"command": [
                "/bin/sh", "-c", format!("date +%s.%N > {d}/{n}.prestop-start; sleep {p}; date +%s.%N > {d}/{n}.prestop-end")
            ]}}});
        }
        create_pod(&c, &rt, "term", pod);
    }
    for tc in &cases {
        eventually(
            &format!("{} running", tc.name),
            Duration::from_secs(60),
            || {
                let p = get_pod(&c, &rt, "term", tc.name)?;
                (p.status?.phase.as_deref() == Some("Running")
                    && read_ts(&dir.join(format!("{}.alive", tc.name))).is_some())
                .then_some(())
            },
        );
    }
    // How late a timer wakes on this machine while the agent's timers run: a KILL may be late
    // by that much and no more (the agent has no other excuse).
    let lateness = TimerLateness::start();
    let mut deleted_at = Vec::new();
    for tc in &cases {
        deleted_at.push(now_s());
        delete_pod(&c, &rt, "term", tc.name, None);
    }
    for (tc, t_del) in cases.iter().zip(deleted_at) {
        // The pod object disappears only once the process is gone.
        let gone_at = eventually(
            &format!("{} deleted", tc.name),
            Duration::from_secs(60),
            || get_pod(&c, &rt, "term", tc.name).is_none().then(now_s),
        );
        let last_alive = read_ts(&dir.join(format!("{}.alive", tc.name))).unwrap();
        assert!(
            last_alive < gone_at,
            "{}: process outlived its pod object",
            tc.name
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            read_ts(&dir.join(format!("{}.alive", tc.name))),
            Some(last_alive),
            "{}: still running",
            tc.name
        );
        // The kill time is within one heartbeat after the last heartbeat.
        let expected_kill = match tc.pre_stop {
            Some(_) => {
                let start =
                    read_ts(&dir.join(format!("{}.prestop-start", tc.name))).expect("preStop ran");
                start + tc.hook + tc.want_window
            }
            None => t_del + tc.want_window,
        };
        let err = last_alive - expected_kill;
        let late = lateness.worst();
        eprintln!(
            "{}: KILL error vs computed deadline {:+.3}s (timers woke up to {late:.3}s late)",
            tc.name, err
        );
        // Early bound: the reference points (the hook's first `date`, the test's own clock
        // before DELETE) lag the agent's timers by process start-up, and the heartbeat by up
        // to one period, so a correct KILL can look up to ~1 s early under CPU load. Late
        // bound: half a second, plus how late this machine's timers woke meanwhile (measured,
        // not assumed: on an idle machine that is milliseconds).
        assert!(
            err > -1.0 && err < 0.5 + late,
            "{}: last heartbeat {last_alive:.3}, computed KILL {expected_kill:.3} (error {err:+.3}s; timers woke up to {late:.3}s late)",
            tc.name
        );
        if tc.name == "overrun" {
            assert!(
                !dir.join("overrun.prestop-end").exists(),
                "overrunning preStop is cut at the grace period"
            );
        }
        if tc.name == "prestop" {
            let end = read_ts(&dir.join("prestop.prestop-end")).expect("preStop finished");
            assert!(end < last_alive, "KILL comes after the hook");
        }
    }
}

#[test]
fn crashing_container_backs_off_10_then_20_seconds_and_reports_crash_loop() {
    let lab = lab();
    let rt = rt();
    let c = client(lab, &rt);
    namespace(&c, &rt, "crash");
    let lateness = TimerLateness::start();
    create_pod(&c, &rt, "crash", host_pod("crasher", "m1", "exit 3"));
    let mut restart_seen: Vec<(i32, f64)> = Vec::new();
    let mut saw_crash_loop = false;
    eventually("three restarts", Duration::from_secs(90), || {
        let p = get_pod(&c, &rt, "crash", "crasher")?;
        let cs = container(&p, "main")?;
        if cs
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            == Some("CrashLoopBackOff")
        {
            saw_crash_loop = true;
        }
        if restart_seen.last().map(|r| r.0) != Some(cs.restart_count) {
            restart_seen.push((cs.restart_count, now_s()));
            if cs.restart_count > 0 {
                let last = cs.last_state.as_ref()?.terminated.as_ref()?;
                assert_eq!(last.exit_code, 3);
            }
        }
        (cs.restart_count >= 3).then_some(())
    });
    assert!(saw_crash_loop, "CrashLoopBackOff reported");
    let at = |n: i32| restart_seen.iter().find(|r| r.0 == n).map(|r| r.1);
    let (r1, r2, r3) = (at(1).unwrap(), at(2).unwrap(), at(3).unwrap());
    let gap2 = r2 - r1;
    let gap3 = r3 - r2;
    // A restart may be seen late by how late this machine's timers woke (measured), and no
    // more; never early.
    let late = lateness.worst();
    eprintln!("restart gaps: {gap2:.2}s {gap3:.2}s (timers woke up to {late:.3}s late)");
    assert!(
        gap2 >= 9.0 && gap2 < 13.0 + late,
        "second restart after ~10 s, got {gap2:.2} (timers woke up to {late:.3}s late)"
    );
    assert!(
        gap3 >= 19.0 && gap3 < 23.0 + late,
        "third restart after ~20 s (the lowered cap), got {gap3:.2} (timers woke up to {late:.3}s late)"
    );
    let p = get_pod(&c, &rt, "crash", "crasher").unwrap();
    assert_eq!(
        p.status.unwrap().phase.as_deref(),
        Some("Running"),
        "restartPolicy Always keeps the pod Running"
    );
}

#[test]
fn failed_liveness_restarts_and_failed_readiness_only_unreadies() {
    let lab = lab();
    let rt = rt();
    let c = client(lab, &rt);
    namespace(&c, &rt, "probes");
    let dir = scratch(lab, "probes");
    let (live, ready) = (dir.join("live"), dir.join("ready"));
    std::fs::write(&live, b"").unwrap();
    std::fs::write(&ready, b"").unwrap();
    let mut pod = host_pod("probed", "m1", "exec sleep 100000");
    pod["spec"]["terminationGracePeriodSeconds"] = json!(2);
    pod["spec"]["containers"][0]["livenessProbe"] = json!({"exec": {"command": ["/bin/test", "-e", live.display().to_string()]}, "periodSeconds": 1, "failureThreshold": 2});
    pod["spec"]["containers"][0]["readinessProbe"] = json!({"exec": {"command": ["/bin/test", "-e", ready.display().to_string()]}, "periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1});
    create_pod(&c, &rt, "probes", pod);
    let ready_is = |want: &str| {
        eventually(&format!("Ready={want}"), Duration::from_secs(60), || {
            let p = get_pod(&c, &rt, "probes", "probed")?;
            (condition(&p, "Ready").as_deref() == Some(want)).then_some(p)
        })
    };
    ready_is("True");
    std::fs::remove_file(&ready).unwrap();
    let p = ready_is("False");
    assert_eq!(
        container(&p, "main").unwrap().restart_count,
        0,
        "readiness failure does not restart"
    );
    assert!(container(&p, "main")
        .unwrap()
        .state
        .unwrap()
        .running
        .is_some());
    std::fs::write(&ready, b"").unwrap();
    ready_is("True");
    std::fs::remove_file(&live).unwrap();
    eventually("liveness restart", Duration::from_secs(60), || {
        let p = get_pod(&c, &rt, "probes", "probed")?;
        (container(&p, "main")?.restart_count >= 1).then_some(())
    });
    std::fs::write(&live, b"").unwrap();
    ready_is("True");
}

#[test]
fn init_containers_run_in_order_and_sidecars_stop_last_in_reverse() {
    let lab = lab();
    let rt = rt();
    let c = client(lab, &rt);
    namespace(&c, &rt, "order");
    let dir = scratch(lab, "order");
    let log = dir.join("log");
    let l = log.display().to_string();
    let step = |name: &str| format!("echo start-{name} >> {l}");
    let side = |name: &str| {
        format!("echo start-{name} >> {l}; trap 'echo stop-{name} >> {l}; exit 0' TERM; while true; do sleep 0.05; done")
    };
    let pod = json!({
        // The 1.20 API drops the container-level restartPolicy, so the lab marks sidecars
        // with the agent's annotation as well.
        "metadata": {"name": "ordered", "annotations": {"palisade.dev/sidecars": "side1,side2"}},
        "spec": {
            "nodeName": "m1",
            "terminationGracePeriodSeconds": 5,
            "initContainers": [
                {"name": "init1", "image": "host", "command": ["/bin/sh", "-c", step("init1")]},
                {"name": "side1", "image": "host", "restartPolicy": "Always", "command": ["/bin/sh", "-c", side("side1")]},
                {"name": "init2", "image": "host", "command": ["/bin/sh", "-c", step("init2")]},
                {"name": "side2", "image": "host", "restartPolicy": "Always", "command": ["/bin/sh", "-c", side("side2")]}
            ],
            "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", side("main")]}]
        }
    });
    create_pod(&c, &rt, "order", pod);
    eventually("Running", Duration::from_secs(60), || {
        let p = get_pod(&c, &rt, "order", "ordered")?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    });
    eventually("main started", Duration::from_secs(30), || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("start-main")
            .then_some(())
    });
    delete_pod(&c, &rt, "order", "ordered", None);
    eventually("pod deleted", Duration::from_secs(60), || {
        get_pod(&c, &rt, "order", "ordered").is_none().then_some(())
    });
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(
        lines,
        vec![
            "start-init1",
            "start-side1",
            "start-init2",
            "start-side2",
            "start-main",
            "stop-main",
            "stop-side2",
            "stop-side1"
        ],
        "start order and termination order"
    );
}

#[test]
fn bad_image_and_missing_command_wait_with_reason_and_other_pods_run() {
    let lab = lab();
    let rt = rt();
    let c = client(lab, &rt);
    namespace(&c, &rt, "bad");
    let mut bad_image = host_pod("badimage", "m1", "sleep 1000");
    bad_image["spec"]["containers"][0]["image"] = json!("registry.invalid/nope:1");
    create_pod(&c, &rt, "bad", bad_image);
    let mut no_cmd = host_pod("nocmd", "m1", "");
    no_cmd["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("command");
    create_pod(&c, &rt, "bad", no_cmd);
    create_pod(&c, &rt, "bad", host_pod("good", "m1", "exec sleep 100000"));
    for (name, reason) in [
        ("badimage", "ErrImageNeverPull"),
        ("nocmd", "CreateContainerError"),
    ] {
        eventually(
            &format!("{name} waiting with {reason}"),
            Duration::from_secs(60),
            || {
                let p = get_pod(&c, &rt, "bad", name)?;
                let w = container(&p, "main")?.state?.waiting?;
                (w.reason.as_deref() == Some(reason) && w.message.is_some_and(|m| !m.is_empty()))
                    .then_some(())
            },
        );
    }
    eventually("good pod running", Duration::from_secs(60), || {
        let p = get_pod(&c, &rt, "bad", "good")?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    });
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), "bad");
    eventually("Warning events", Duration::from_secs(30), || {
        let l = rt.block_on(events.list(&ListParams::default())).ok()?;
        let has = |pod: &str| {
            l.items.iter().any(|e| {
                e.involved_object.name.as_deref() == Some(pod)
                    && e.type_.as_deref() == Some("Warning")
            })
        };
        (has("badimage") && has("nocmd")).then_some(())
    });
}

#[test]
fn agent_restart_mid_termination_restarts_the_full_grace_and_deleted_pods_die_on_restart() {
    let lab = lab();
    let rt = rt();
    let c = client(lab, &rt);
    namespace(&c, &rt, "restart");
    let dir = scratch(lab, "restart");
    let d = dir.display();
    let script = |n: &str| {
        format!("trap '' TERM; while true; do date +%s.%N > {d}/{n}.tmp; mv {d}/{n}.tmp {d}/{n}; sleep 0.05; done")
    };
    let mut slow = host_pod("slow", "m2", &script("slow"));
    slow["spec"]["terminationGracePeriodSeconds"] = json!(6);
    create_pod(&c, &rt, "restart", slow);
    create_pod(
        &c,
        &rt,
        "restart",
        host_pod("orphan", "m2", &script("orphan")),
    );
    for n in ["slow", "orphan"] {
        eventually(&format!("{n} running"), Duration::from_secs(60), || {
            read_ts(&dir.join(n)).map(|_| ())
        });
    }
    // Mid-termination restart: 3 s into a 6 s grace period, the agent dies.
    delete_pod(&c, &rt, "restart", "slow", None);
    std::thread::sleep(Duration::from_secs(3));
    stop_agent(lab, 2);
    // While the agent is down, the other pod is force-deleted: its process must die when
    // the agent comes back.
    delete_pod(&c, &rt, "restart", "orphan", Some(0));
    std::thread::sleep(Duration::from_secs(1));
    let restarted_at = now_s();
    start_agent(lab, 2);
    let gone = eventually("slow deleted", Duration::from_secs(60), || {
        get_pod(&c, &rt, "restart", "slow").is_none().then(now_s)
    });
    let last = read_ts(&dir.join("slow")).unwrap();
    assert!(last < gone);
    let full = last - restarted_at;
    eprintln!("after agent restart the process lived {full:.2}s more");
    assert!(
        full > 5.0,
        "termination started over with the full 6 s grace, lived {full:.2}s"
    );
    eventually(
        "orphan killed after restart",
        Duration::from_secs(30),
        || {
            let t = read_ts(&dir.join("orphan"))?;
            (now_s() - t > 1.0).then_some(())
        },
    );
}
