//! Issue 35: a fenced stock node rejoins without a person. Three stock machines (the real
//! kubelet with containerd and runc) each run Palisade's companion beside the kubelet. The
//! machine that runs `db-0` is cut off, fenced through its BMC and released; when its link
//! comes back the controller powers it on, and the companion answers the recovery challenge
//! with an inventory read from containerd's CRI. The fence recovers on that answer (the
//! node's own boot changed, and containerd holds no record of the released pod any more),
//! with no `confirm-clean` annotation from anyone.
//!
//! Before the fix, a stock node's recovery waited for a person: nothing on the node answered
//! the challenge, so the fence stayed `Recovering` until its budget ran out.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, ResourceExt};
use palisade_lab::stock::{StockLab, BUSYBOX_IMAGE};
use palisade_lab::{Cut, LabConfig};
use palisade_model::advertise::{Advertisement, RuntimeSource};
use palisade_model::nodefence::{Phase, ANNOTATION_CONFIRM_CLEAN};
use serde_json::json;

fn advertisement(c: &kube::Client, rt: &tokio::runtime::Runtime, node: &str) -> Advertisement {
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let lease = rt.block_on(leases.get_opt(node)).ok().flatten();
    let a: BTreeMap<String, String> = lease.map(|l| l.annotations().clone()).unwrap_or_default();
    Advertisement::from_annotations(&a)
}

/// Polls `f` every 250 ms until it returns `Some`, or calls `dump` after `timeout`.
fn wait_for<T>(
    what: &str,
    timeout: Duration,
    dump: &dyn Fn(&str),
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            dump(what);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_fenced_stock_node_rejoins_on_its_companions_answer_from_containerd() {
    let lab = StockLab::start_with(
        LabConfig {
            machines: 3,
            pdu: false,
            ..Default::default()
        },
        true,
    )
    .expect("a lab of three stock machines with the companion starts");
    for i in 0..3 {
        let took = lab
            .wait_node_ready(i, Duration::from_secs(240))
            .expect("the stock machine's node is Ready");
        println!("m{i}: boot-to-Ready {:.2} s", took.as_secs_f64());
    }
    let rt = rt();
    let c = client(lab.lab(), &rt);
    namespace(&c, &rt, SYSTEM_NS);
    namespace(&c, &rt, "app");
    let ctl = start_controller(lab.lab(), "ctl-stock");
    // On a failed wait: the end of the controller's log and m0's fences, then the panic.
    let dump = |what: &str| {
        let log = ctl.log_text();
        let tail: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("DEBUG"))
            .rev()
            .take(30)
            .collect();
        for l in tail.into_iter().rev() {
            eprintln!("controller: {l}");
        }
        for f in fences_for(&c, &rt, "m0") {
            for cond in f.status.iter().flat_map(|s| &s.conditions) {
                eprintln!(
                    "{}: {} {}: {}",
                    f.name_any(),
                    cond.type_,
                    cond.status,
                    cond.message
                );
            }
        }
        eprintln!("m0's advertisement: {:?}", advertisement(&c, &rt, "m0"));
        let m0 = &lab.lab().machines()[0];
        for file in ["companion.log", "kubelet.log"] {
            let text = std::fs::read_to_string(palisade_lab::stock::stock_dir(m0).join(file))
                .unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            for l in tail.into_iter().rev() {
                eprintln!("m0 {file}: {l}");
            }
        }
        panic!("timed out waiting for {what}");
    };
    policy_with(
        &c,
        &rt,
        json!({"recovery": {"powerOn": true, "untaintWhen": "NodeReady"}}),
    );
    ipmi_targets(lab.lab(), &c, &rt);

    // db-0 on m0, from the lab's registry.
    let old = db_on_m0_running(
        &c,
        &rt,
        json!({"name": "app", "image": lab.image(BUSYBOX_IMAGE),
               "command": ["/bin/busybox", "sleep", "100000"]}),
        true,
    );
    let old_uid = old.uid().expect("a UID");

    // The companion advertises on the kubelet's Lease: its boot, and the pod containerd runs.
    let before = eventually(
        "m0's companion advertises db-0 from containerd",
        Duration::from_secs(60),
        || {
            let ad = advertisement(&c, &rt, "m0");
            (ad.runtime_source == RuntimeSource::Cri
                && ad.boot_id.is_some()
                && ad.runtime_pods.as_ref()?.contains(&old_uid))
            .then_some(ad)
        },
    );
    assert_eq!(
        before.self_fence_after, None,
        "the companion promises no self-fence"
    );
    assert_eq!(before.watchdog, None);

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    lab.lab().partition(0, Cut::All).unwrap();
    // Released (with `recovery.powerOn` the machine is powered on at once, behind its cut).
    let released = wait_for(
        "m0's NodeFence released db-0",
        Duration::from_secs(120),
        &dump,
        || {
            fences_for(&c, &rt, "m0").into_iter().find(|f| {
                f.status
                    .as_ref()
                    .is_some_and(|s| s.release.pods.iter().any(|p| p.uid == old_uid))
            })
        },
    );
    let name = released.name_any();
    db_replaced_elsewhere(&c, &rt, &old_uid, Duration::from_secs(120));

    // The link comes back: the controller powers m0 on, its kubelet rejoins, and the
    // companion answers the challenge from containerd. Nobody confirms anything.
    let healed = Instant::now();
    lab.lab().heal(0).unwrap();
    let fences: Api<palisade_model::NodeFence> = Api::all(c.clone());
    let done = wait_for(
        "m0's NodeFence Done on the companion's answer",
        Duration::from_secs(420),
        &dump,
        || {
            let f = rt.block_on(fences.get_opt(&name)).ok().flatten()?;
            (f.status.as_ref()?.phase == Phase::Done).then_some(f)
        },
    );
    println!("heal → Done {:.1} s", healed.elapsed().as_secs_f64());
    print_timeline(&done, t_cut);
    assert!(
        !done.annotations().contains_key(ANNOTATION_CONFIRM_CLEAN),
        "no person confirmed the node clean"
    );
    let st = done.status.expect("a status");
    let proof = st.recovery.clean_proof.clone().unwrap_or_default();
    println!("clean proof: {proof}");
    println!("recovery: {:?}", st.recovery);
    let m0 = &lab.lab().machines()[0];
    let log = std::fs::read_to_string(palisade_lab::stock::stock_dir(m0).join("companion.log"))
        .unwrap_or_default();
    // While containerd still held a record of the released db-0 (its exited sandbox, until the
    // kubelet's container GC), the companion's answers named it, and nothing was lifted on
    // them: the untaint follows the last answer that named it.
    let untainted = st.recovery.untainted_at.as_ref().expect("untainted").0;
    for l in log
        .lines()
        .map(palisade_test_support::strip_ansi)
        .filter(|l| l.contains("advertised"))
    {
        println!("m0 companion: {l}");
        let answered = !l.contains("challenge=None");
        if answered && l.contains(old_uid.as_str()) {
            let at: k8s_openapi::jiff::Timestamp = l
                .split_whitespace()
                .next()
                .and_then(|t| t.parse().ok())
                .expect("a timestamp opens each log line");
            println!(
                "  an answer that names the released db-0; the untaint came {:.1} s later",
                secs_between(at, untainted)
            );
            assert!(
                at < untainted,
                "the untaint came before an answer that named the released db-0"
            );
        }
    }
    assert!(proof.contains("(CRI;"), "proved from the CRI: {proof}");
    assert!(proof.contains("boot ID changed"), "on a new boot: {proof}");
    let after = advertisement(&c, &rt, "m0");
    assert_eq!(after.challenge.as_deref(), done.metadata.uid.as_deref());
    assert_ne!(after.boot_id, before.boot_id, "m0 booted again");
    assert!(
        !after.runtime_pods.unwrap_or_default().contains(&old_uid),
        "containerd holds no record of the released db-0"
    );
}
