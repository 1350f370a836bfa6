//! The peer check: a control-plane outage is not a partition of one node.
//!
//! Three machines each run a PVC pod, with agents that self-fence 12 s after their last
//! renewal and run the peer check. With the API server down for 60 s (five times the
//! self-fence timeout), no pod is killed: every agent finds a strict majority of its peers
//! vouching that they cannot reach the API either. Cut one machine from the control plane
//! while it still reaches its peers: they can renew, so none vouches, and it self-fences within
//! its timeout while the others keep running.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::PostParams;
use kube::Api;
use palisade_lab::Cut;
use serde_json::json;

const FENCE_AFTER_S: f64 = 12.0;
/// What an agent logs when it self-fences with no excuse.
const SELF_FENCED: &str = "no majority of peers excuses it: self-fencing";

/// Numbers this process's labs, so that labs of tests run side by side (`--test-threads` above
/// one) never share a container's `sleep` argument or a key file.
static LABS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The `sleep` argument of machine `i`'s container in lab `lab` of this process: unique on the
/// host while both live.
fn sleep_arg(lab: u64, i: usize) -> u64 {
    1_000_000 * (1 + u64::from(std::process::id() % 1_000)) + lab * 100 + i as u64
}

/// The host pid of machine `i`'s container in lab `lab` (a `sleep` with its own duration).
fn pid_of(lab: u64, i: usize) -> Option<i32> {
    pid_of_sleep(&sleep_arg(lab, i).to_string())
}

/// Removes the key file when the test ends, however it ends.
struct KeyFile(std::path::PathBuf);

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A lab of `machines` peer-checked machines, each running one PVC pod `db-<i>`; returns the
/// lab, runtime, client, the key file and the containers' host pids.
fn peer_lab(
    machines: usize,
) -> (
    palisade_lab::Lab,
    tokio::runtime::Runtime,
    kube::Client,
    KeyFile,
    Vec<i32>,
) {
    peer_lab_with(machines, &[])
}

/// [`peer_lab`] with `extra` arguments for every agent.
fn peer_lab_with(
    machines: usize,
    extra: &[&str],
) -> (
    palisade_lab::Lab,
    tokio::runtime::Runtime,
    kube::Client,
    KeyFile,
    Vec<i32>,
) {
    let lab_no = LABS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let key = KeyFile(
        std::env::temp_dir().join(format!("palisade-peer-{}-{lab_no}.key", std::process::id())),
    );
    let mut secret = [0u8; 48];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").unwrap(),
        &mut secret,
    )
    .unwrap();
    palisade_lab::write_secret(&key.0, &secret).unwrap();
    let agents = palisade_scenario::AgentOptions {
        lease_seconds: 20,
        self_fence_seconds: FENCE_AFTER_S,
        max_restart_backoff_seconds: Some(MAX_BACKOFF_S),
        extra_args: vec![
            "--peer-key-file".into(),
            key.0.display().to_string(),
            "--peer-vouch-after".into(),
            "6s".into(),
            "--peer-answer-valid".into(),
            "8s".into(),
        ]
        .into_iter()
        .chain(extra.iter().map(|a| a.to_string()))
        .collect(),
        watchdog: false,
        peer_check: false,
        kube: None,
        etcd_relay: false,
    };
    let lab = palisade_scenario::lab_with_agents(machines, false, &agents).expect("lab starts");
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    let ns = "peers";
    namespace(&c, &rt, ns);
    for i in 0..machines {
        let dir = scratch(&lab, &format!("pv{i}"));
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": format!("peer-pv-{i}")},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                     "claimRef": {"namespace": ns, "name": format!("data-{i}")},
                     "hostPath": {"path": dir.display().to_string()}}
        }))
        .unwrap();
        rt.block_on(Api::<PersistentVolume>::all(c.clone()).create(&PostParams::default(), &pv))
            .unwrap();
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": format!("data-{i}")},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual", "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .unwrap();
        rt.block_on(
            Api::<PersistentVolumeClaim>::namespaced(c.clone(), ns)
                .create(&PostParams::default(), &pvc),
        )
        .unwrap();
        create_pod(
            &c,
            &rt,
            ns,
            json!({"metadata": {"name": format!("db-{i}")}, "spec": {"nodeName": format!("m{i}"),
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{i}")}}],
                "containers": [{"name": "main", "image": "host", "command": ["/bin/sh", "-c", format!("exec sleep {}", sleep_arg(lab_no, i))]}]}}),
        );
    }
    let pids: Vec<i32> = (0..machines)
        .map(|i| {
            eventually(&format!("db-{i} running"), Duration::from_secs(90), || {
                let p = get_pod(&c, &rt, ns, &format!("db-{i}"))?;
                (p.status?.phase.as_deref() == Some("Running")).then_some(())?;
                pid_of(lab_no, i).filter(|p| alive(*p))
            })
        })
        .collect();
    // The outage must find every agent's Lease advertising the whole member list: until a
    // renewal carries it, the controller judges the node against an older list (or none) and
    // so does the agent, which then self-fences (the safe side) — a different scenario from
    // the one these tests prove. A new list is written at once, not at the next renewal.
    let everyone = palisade_model::advertise::MemberSet::of((0..machines).map(|i| format!("m{i}")));
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    eventually(
        "every Lease advertises every member",
        Duration::from_secs(120),
        || {
            (0..machines)
                .all(|i| {
                    rt.block_on(leases.get_opt(&format!("m{i}")))
                        .ok()
                        .flatten()
                        .and_then(|l| l.metadata.annotations)
                        .and_then(|a| a.get(palisade_model::advertise::PEER_MEMBERS).cloned())
                        .and_then(|v| palisade_model::advertise::MemberSet::parse(&v))
                        == Some(everyone)
                })
                .then_some(())
        },
    );
    // Nor may the outage come before every agent knows where its peers are: a Node registers
    // before its status carries an InternalIP, an agent does not ask a peer without one, and
    // an agent that asks nobody self-fences (the safe side) — again a different scenario.
    for i in 0..machines {
        eventually(
            &format!("m{i} knows every peer's address"),
            Duration::from_secs(60),
            || {
                let log = palisade_test_support::strip_ansi(&agent_log(&lab, i));
                let last = log.lines().rev().find(|l| l.contains("peer set changed"))?;
                (0..machines)
                    .all(|j| last.contains(&format!("\"m{j}@")))
                    .then_some(())
            },
        );
    }
    for i in 0..machines {
        assert!(
            palisade_test_support::strip_ansi(&agent_log(&lab, i))
                .contains("advertisement changed: renewing the Lease now"),
            "m{i} renewed its Lease as soon as its member list changed"
        );
    }
    (lab, rt, c, key, pids)
}

#[test]
fn an_api_outage_kills_no_pod_and_a_node_cut_alone_self_fences() {
    let (lab, rt, c, _key, pids) = peer_lab(3);

    // 1. The API server is gone for five self-fence timeouts: nobody is killed.
    let cp = lab.control_plane().expect("control plane");
    let down = Duration::from_secs(60);
    let outage = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let pids = pids.clone();
        let outage = outage.clone();
        std::thread::spawn(move || {
            // Watch the containers throughout the outage and until the API server is ready
            // again, not only at its end.
            let mut dead = Vec::new();
            while outage.load(std::sync::atomic::Ordering::SeqCst) {
                for (i, p) in pids.iter().enumerate() {
                    if !alive(*p) && !dead.contains(&i) {
                        dead.push(i);
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            dead
        })
    };
    cp.restart_api_server(down).expect("API server back");
    // The first renewals after the outage: an agent slower to renew than its peers is no
    // longer vouched for, and must still keep its pod.
    std::thread::sleep(Duration::from_secs(15));
    outage.store(false, std::sync::atomic::Ordering::SeqCst);
    let dead = watcher.join().unwrap();
    // What the peer check did, without the stream of refused API connections.
    let tail = |i: usize| {
        let log = agent_log(&lab, i);
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("client error (Connect)"))
            .collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    };
    for i in 0..3 {
        let log = agent_log(&lab, i);
        let peer_lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("peer") || l.contains("self-fenc") || l.contains("excuse"))
            .collect();
        eprintln!("--- m{i}: the peer check\n{}", peer_lines.join("\n"));
    }
    if !dead.is_empty() {
        // Kept for the post-mortem: the lab directory goes with the lab.
        for i in 0..3 {
            let keep = std::env::temp_dir().join(format!("palisade-peer-check-m{i}.log"));
            let _ = std::fs::write(&keep, agent_log(&lab, i));
            eprintln!("m{i}'s whole agent log: {}", keep.display());
        }
    }
    assert!(
        dead.is_empty(),
        "no pod may be killed by a control-plane outage; killed on machines {dead:?}; logs:\n{}",
        dead.iter()
            .map(|i| format!("--- m{i}\n{}", tail(*i)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    for (i, p) in pids.iter().enumerate() {
        assert!(alive(*p), "db-{i}'s container survived the outage");
        let log = agent_log(&lab, i);
        assert!(
            log.contains("a majority of peers vouch"),
            "m{i} kept its pod because its peers excused it (log: {})",
            tail(i)
        );
        assert!(
            !log.contains(SELF_FENCED),
            "m{i} never self-fenced during the outage"
        );
    }

    // 2. m0 alone is cut from the control plane but reaches its peers: they renew, so they do
    //    not vouch, and m0 self-fences within its timeout; m1 and m2 keep running.
    wait_nodes_ready(&lab, &c, &rt);
    std::thread::sleep(Duration::from_secs(3));
    let cut_at = now_s();
    lab.partition(0, Cut::ControlPlane).unwrap();
    let killed_at = eventually("m0's PVC pod killed", Duration::from_secs(40), || {
        (!alive(pids[0])).then(now_s)
    });
    let after = killed_at - cut_at;
    eprintln!("m0's PVC pod killed {after:.2}s after the cut (self-fence-after {FENCE_AFTER_S}s)");
    // An excuse would keep it alive for as long as its peers vouch, i.e. for good: any bound
    // well short of that proves the peers refused.
    assert!(
        after <= FENCE_AFTER_S + 8.0,
        "m0 self-fenced {after:.2}s after the cut (self-fence-after {FENCE_AFTER_S}s)"
    );
    assert!(
        agent_log(&lab, 0).contains(SELF_FENCED),
        "m0 logged its self-fence"
    );
    assert!(alive(pids[1]) && alive(pids[2]), "m1 and m2 keep running");
    lab.heal(0).unwrap();
}

/// Five machines; m0 and m1 are cut from the control plane together (they still reach each
/// other and the rest). They vouch for each other, but two of five is no majority: the three
/// that renew refuse, and both self-fence on time while the others keep running.
#[test]
fn a_minority_cut_from_the_control_plane_together_self_fences() {
    let (lab, _rt, _c, _key, pids) = peer_lab(5);
    std::thread::sleep(Duration::from_secs(3));
    let cut_at = now_s();
    lab.partition(0, Cut::ControlPlane).unwrap();
    lab.partition(1, Cut::ControlPlane).unwrap();
    for (i, pid) in pids.iter().enumerate().take(2) {
        let killed_at = eventually(
            &format!("m{i}'s PVC pod killed"),
            Duration::from_secs(40),
            || (!alive(*pid)).then(now_s),
        );
        let after = killed_at - cut_at;
        eprintln!("m{i}'s PVC pod killed {after:.2}s after the cut");
        assert!(
            after <= FENCE_AFTER_S + 8.0,
            "m{i} self-fenced {after:.2}s after the cut: a minority must not excuse itself"
        );
        assert!(agent_log(&lab, i).contains(SELF_FENCED));
    }
    for (i, p) in pids.iter().enumerate().skip(2) {
        assert!(alive(*p), "m{i} keeps running");
    }
    lab.heal(0).unwrap();
    lab.heal(1).unwrap();
}

/// An agent's advertised member set follows a Node added or deleted through its Node watch,
/// not at its next periodic LIST (set to an hour here, so only the watch can bring the
/// change): an agent that listed before every Node registered no longer advertises a smaller
/// set that a later controller never saw.
#[test]
fn a_node_added_or_deleted_reaches_the_advertised_member_set_through_the_node_watch() {
    use k8s_openapi::api::core::v1::Node;
    use palisade_model::advertise::{MemberSet, PEER_MEMBERS};
    let (_lab, rt, c, _key, _pids) = peer_lab_with(1, &["--peer-list-interval", "3600s"]);
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let advertised = || {
        rt.block_on(leases.get_opt("m0"))
            .ok()
            .flatten()
            .and_then(|l| l.metadata.annotations)
            .and_then(|a| a.get(PEER_MEMBERS).cloned())
            .and_then(|v| MemberSet::parse(&v))
    };
    let nodes: Api<Node> = Api::all(c.clone());
    let ghost: Node = serde_json::from_value(json!({"metadata": {"name": "ghost"}})).unwrap();
    rt.block_on(nodes.create(&PostParams::default(), &ghost))
        .unwrap();
    eventually(
        "m0 advertises the added Node",
        Duration::from_secs(120),
        || (advertised() == Some(MemberSet::of(["m0", "ghost"]))).then_some(()),
    );
    rt.block_on(nodes.delete("ghost", &Default::default()))
        .unwrap();
    eventually(
        "m0 advertises the set without the deleted Node",
        Duration::from_secs(120),
        || (advertised() == Some(MemberSet::of(["m0"]))).then_some(()),
    );
}
