//! Self-fencing: a machine cut off from the API kills its PVC-using pods within
//! `--self-fence-after`, leaves other pods running, and resumes them only once the API
//! confirms they still belong to it. The agent exports its traces over OTLP (to a collector
//! on the management side that the partition does not cut): the self-fence is a span under
//! the pod's.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::PostParams;
use kube::Api;
use palisade_lab::Cut;
use serde_json::json;

/// The host pid of the `stateful` or `stateless` container.
fn pid_of(n: &str) -> Option<i32> {
    pid_of_sleep(if n == "stateful" { "100001" } else { "100002" })
}

/// A one-machine lab running a PVC pod (`stateful`) and a pod without one (`stateless`) on
/// m0; returns the lab, runtime, client and the two containers' host pids.
fn lab_with_two_pods(
    ns: &str,
    agent_args: &[String],
) -> (
    palisade_lab::Lab,
    tokio::runtime::Runtime,
    kube::Client,
    i32,
    i32,
) {
    let lab = start_lab_with(1, agent_args);
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, ns);
    let dir = scratch(&lab, ns);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("pv-{ns}")},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                 "hostPath": {"path": dir.join("pv").display().to_string()}}
    }))
    .unwrap();
    rt.block_on(Api::<PersistentVolume>::all(c.clone()).create(&PostParams::default(), &pv))
        .unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual", "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    rt.block_on(
        Api::<PersistentVolumeClaim>::namespaced(c.clone(), ns)
            .create(&PostParams::default(), &pvc),
    )
    .unwrap();
    // Each container is a `sleep` with its own duration, so the test finds its host pid.
    let run = |n: &str| {
        format!(
            "{}sleep {}",
            // The PVC pod ignores SIGTERM (inherited by its sleep), so only a SIGKILL ends it.
            if n == "stateful" {
                "trap '' TERM; "
            } else {
                "exec "
            },
            if n == "stateful" { 100001 } else { 100002 }
        )
    };
    create_pod(
        &c,
        &rt,
        ns,
        json!({"metadata": {"name": "stateful"}, "spec": {"nodeName": "m0", "terminationGracePeriodSeconds": 600,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", run("stateful")]}]}}),
    );
    create_pod(
        &c,
        &rt,
        ns,
        json!({"metadata": {"name": "stateless"}, "spec": {"nodeName": "m0",
            "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", run("stateless")]}]}}),
    );
    for n in ["stateful", "stateless"] {
        eventually(&format!("{n} running"), Duration::from_secs(90), || {
            let p = get_pod(&c, &rt, ns, n)?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())?;
            pid_of(n).filter(|p| alive(*p))
        });
    }
    let (stateful, stateless) = (pid_of("stateful").unwrap(), pid_of("stateless").unwrap());
    (lab, rt, c, stateful, stateless)
}

#[test]
fn partitioned_machine_kills_pvc_pods_within_self_fence_after_and_keeps_others() {
    const OTLP_HUB_PORT: u16 = 4318;
    let collector = palisade_telemetry::receiver::Receiver::start().expect("OTLP receiver");
    let otlp = format!("http://{}:{OTLP_HUB_PORT}", palisade_lab::netns::HUB_ADDR);
    let (lab, rt, c, stateful, stateless) =
        lab_with_two_pods("fence", &["--otlp-endpoint".into(), otlp]);
    lab.expose_on_hub(OTLP_HUB_PORT, collector.addr())
        .expect("the collector on the hub");
    let nodes: Api<Node> = Api::all(c.clone());
    let node = rt.block_on(nodes.get("m0")).unwrap();
    assert_eq!(
        node.metadata
            .annotations
            .unwrap_or_default()
            .get("palisade.dev/self-fence-after-seconds"),
        None,
        "no sticky self-fence promise on the Node"
    );
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let lease = rt.block_on(leases.get("m0")).unwrap();
    assert_eq!(
        lease
            .metadata
            .annotations
            .unwrap_or_default()
            .get("palisade.dev/self-fence-after-seconds")
            .map(String::as_str),
        Some("4"),
        "self-fencing is advertised on the Lease"
    );
    let cut_at = now_s();
    lab.partition(0, Cut::ControlPlane).unwrap();
    let killed_at = eventually("PVC pod killed", Duration::from_secs(30), || {
        (!alive(stateful)).then(now_s)
    });
    let after = killed_at - cut_at;
    eprintln!("PVC pod killed {after:.2}s after the cut (self-fence-after {SELF_FENCE_AFTER_S}s)");
    assert!(
        after <= SELF_FENCE_AFTER_S + 0.5,
        "killed {after:.2}s after the cut"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        pid_of("stateful"),
        None,
        "a fenced pod is not restarted while the API is unreachable"
    );
    assert!(alive(stateless), "the pod without a PVC keeps running");
    lab.heal(0).unwrap();
    eventually(
        "PVC pod resumes once the API confirms it",
        Duration::from_secs(60),
        || pid_of("stateful").filter(|p| *p != stateful && alive(*p)),
    );
    assert!(alive(stateless), "the pod without a PVC was never touched");
    let log = agent_log(&lab, 0);
    assert!(log.contains("self-fencing"), "agent logged the self-fence");
    // The self-fence in the agent's traces: a span naming the pod it killed, a child of the
    // pod worker's span (which stays open while the pod runs, so only its ID is seen here).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let fence = loop {
        let found = collector.spans().into_iter().find(|s| {
            s.name == "self_fence"
                && s.service == "palisade-node"
                && s.attributes.get("first").map(String::as_str) == Some("true")
        });
        if let Some(f) = found {
            break f;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no self-fence span in 30 s; received {:?}; the agent logged:\n{}",
            collector.spans(),
            agent_log(&lab, 0)
                .lines()
                .filter(|l| l.contains("OTLP") || l.contains("otlp") || l.contains("export"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(fence.attributes["pod"].contains("stateful"), "{fence:?}");
    assert!(
        !fence.parent_span_id.is_empty(),
        "under the pod's span: {fence:?}"
    );
    assert_eq!(collector.rejected(), 0);
}

/// An agent restarted while cut off from the API never completes its first LIST, so no pod
/// worker exists for the containers it adopts; with a stale Lease record it must kill them
/// from its runtime before anything else.
#[test]
fn an_agent_restarted_while_partitioned_with_a_stale_lease_kills_its_containers() {
    let (lab, _rt, _c, stateful, stateless) = lab_with_two_pods("restart", &[]);
    stop_agent(&lab, 0);
    lab.partition(0, Cut::ControlPlane).unwrap();
    let stopped_at = now_s();
    // Let the last recorded renewal grow older than --self-fence-after.
    eventually(
        "the last renewal is older than --self-fence-after",
        Duration::from_secs(60),
        || (now_s() - stopped_at > SELF_FENCE_AFTER_S + 2.0).then_some(()),
    );
    assert!(alive(stateful), "the stopped agent killed nothing");
    start_agent(&lab, 0);
    eventually(
        "the PVC pod's container killed by the restarted agent",
        Duration::from_secs(60),
        || (!alive(stateful)).then_some(()),
    );
    // Without the API the agent cannot tell which pods use a PVC: it kills every one.
    eventually(
        "the other pod's container killed too",
        Duration::from_secs(60),
        || (!alive(stateless)).then_some(()),
    );
    // The line follows the last kill, so it may land just after the process is gone.
    eventually(
        "the agent logged the start-up sweep",
        Duration::from_secs(30),
        || {
            agent_log(&lab, 0)
                .contains("stale Lease at start: killed the containers found in the runtime")
                .then_some(())
        },
    );
    lab.heal(0).unwrap();
}

/// Issue 32 item 11: an agent restarted *within* `--self-fence-after` while cut off finds a
/// fresh enough renewal (no start-up sweep) and never completes its first LIST (no pod
/// worker); when its fence activates, the runtime sweep kills the PVC pod's container it
/// adopted, and leaves the pod its records show without a claim.
#[test]
fn an_agent_restarted_within_self_fence_after_while_partitioned_kills_its_adopted_pvc_pods() {
    let (lab, _rt, _c, stateful, stateless) = lab_with_two_pods("readopt", &[]);
    stop_agent(&lab, 0);
    lab.partition(0, Cut::ControlPlane).unwrap();
    start_agent(&lab, 0);
    eventually(
        "the adopted PVC pod's container killed by the restarted agent",
        Duration::from_secs(60),
        || (!alive(stateful)).then_some(()),
    );
    let log = agent_log(&lab, 0);
    assert!(
        !log.contains("stale Lease at start"),
        "the restart was meant to find a fresh renewal (no start-up sweep); the agent logged:\n{log}"
    );
    eventually(
        "the agent logged the runtime sweep",
        Duration::from_secs(30),
        || {
            agent_log(&lab, 0)
                .contains("self-fence: killed containers found in the runtime")
                .then_some(())
        },
    );
    assert!(
        alive(stateless),
        "the pod recorded without a PVC keeps running"
    );
    lab.heal(0).unwrap();
}

/// A pod already terminating (a long grace period, SIGTERM ignored) is killed by the
/// self-fence, not left to run out its grace period.
#[test]
fn a_terminating_pvc_pod_is_killed_by_the_self_fence() {
    let (lab, rt, c, stateful, _stateless) = lab_with_two_pods("term", &[]);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), "term");
    rt.block_on(pods.delete("stateful", &Default::default()))
        .unwrap();
    eventually("the pod is terminating", Duration::from_secs(30), || {
        get_pod(&c, &rt, "term", "stateful")?
            .metadata
            .deletion_timestamp
            .map(|_| ())
    });
    assert!(alive(stateful), "SIGTERM is ignored: the grace period runs");
    lab.partition(0, Cut::ControlPlane).unwrap();
    // The grace period is 600 s: only the self-fence can end it within this deadline.
    eventually(
        "the terminating PVC pod killed by the self-fence",
        Duration::from_secs(90),
        || (!alive(stateful)).then_some(()),
    );
    lab.heal(0).unwrap();
}
