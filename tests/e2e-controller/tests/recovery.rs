//! Recovery: with `recovery.powerOn`, the released machine is powered back on through its BMC,
//! its node agent renews the Lease again, the out-of-service taint is removed and the
//! `NodeFence` is Done.
//!
//! The fence is deleted by a person while it still holds m0 (issue 32, item 3): its finalizer
//! keeps it, and its record, until its recovery has lifted what it held; only then is it gone.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::TryStreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use palisade_lab::Cut;
use palisade_model::nodefence::Phase;
use palisade_model::{NodeFence, NODEFENCE_FINALIZER};
use parking_lot::Mutex;
use serde_json::json;

/// The latest version of NodeFence `name` the API server sent, and whether it was deleted (a
/// deletion carries the final version), followed from now on.
type Followed = Arc<Mutex<(Option<NodeFence>, bool)>>;

fn follow(c: &kube::Client, rt: &tokio::runtime::Runtime, name: &str) -> Followed {
    let seen: Followed = Arc::default();
    let api: Api<NodeFence> = Api::all(c.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let s = seen.clone();
    rt.spawn(async move {
        let mut events = std::pin::pin!(watcher(api, config));
        while let Ok(Some(ev)) = events.try_next().await {
            match ev {
                watcher::Event::Apply(f) | watcher::Event::InitApply(f) => s.lock().0 = Some(f),
                watcher::Event::Delete(f) => *s.lock() = (Some(f), true),
                watcher::Event::Init | watcher::Event::InitDone => {}
            }
        }
    });
    seen
}

#[test]
fn released_machine_is_powered_on_rejoins_and_is_untainted() {
    let lab = start_lab(3, false);
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    let _ctl = start_controller(&lab, "ctl-r");
    policy_with(
        &c,
        &rt,
        json!({"recovery": {"powerOn": true, "untaintWhen": "NodeReady"}}),
    );
    ipmi_targets(&lab, &c, &rt);

    let t_cut = k8s_openapi::jiff::Timestamp::now();
    lab.partition(0, Cut::All).unwrap();
    eventually(
        "m0 powered off by the controller",
        Duration::from_secs(120),
        || {
            fences_for(&c, &rt, "m0").into_iter().find(|f| {
                f.status
                    .as_ref()
                    .is_some_and(|s| s.verified_fence().is_some())
            })
        },
    );
    // A person deletes the fence while it holds m0: it stays, with its finalizer, and says why.
    let name = fences_for(&c, &rt, "m0")[0].name_any();
    let followed = follow(&c, &rt, &name);
    let fences: Api<NodeFence> = Api::all(c.clone());
    rt.block_on(fences.delete(&name, &Default::default()))
        .expect("delete the NodeFence");
    let deleting = eventually("the deletion recorded", Duration::from_secs(30), || {
        rt.block_on(fences.get_opt(&name))
            .ok()
            .flatten()
            .filter(|f| f.metadata.deletion_timestamp.is_some())
    });
    assert!(
        deleting
            .finalizers()
            .iter()
            .any(|f| f == NODEFENCE_FINALIZER),
        "{:?}",
        deleting.finalizers()
    );
    let warned = eventually(
        "a DeletionWaitsForRecovery Event",
        Duration::from_secs(30),
        || {
            events(&c, &rt, "default", &name, "DeletionWaitsForRecovery")
                .into_iter()
                .next()
        },
    );
    eprintln!("{}", warned.message.unwrap_or_default());
    assert!(
        rt.block_on(fences.get_opt(&name)).unwrap().is_some(),
        "the fence is kept while it holds m0"
    );
    // The link comes back; the controller powers the machine on and waits for its agent. The
    // fence goes once it is Done, and not before.
    lab.heal(0).unwrap();
    let nf = eventually(
        "m0's NodeFence Done, then gone",
        Duration::from_secs(180),
        || {
            let (last, deleted) = followed.lock().clone();
            deleted.then_some(last).flatten()
        },
    );
    print_timeline(&nf, t_cut);
    assert_eq!(nf.status.as_ref().map(|s| s.phase), Some(Phase::Done));
    let st = nf.status.unwrap();
    let phases: Vec<Phase> = st.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(
        phases,
        vec![
            Phase::Pending,
            Phase::Fencing,
            Phase::Fenced,
            Phase::Releasing,
            Phase::Released,
            Phase::Recovering,
            Phase::Done
        ]
    );
    assert!(st.recovery.powered_on_at.is_some() && st.recovery.untainted_at.is_some());
    // Untainted only on positive proof that the released pods are gone: the power cycle gave
    // the machine a new boot ID.
    let proof = st.recovery.clean_proof.clone().unwrap_or_default();
    assert!(proof.contains("boot ID changed"), "proof: {proof:?}");
    assert!(lab.machines()[0].is_powered());
    // The rejoin is the new boot's agent: its Lease renewal is later than the power-on (one
    // host, one clock).
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let renew = rt
        .block_on(leases.get("m0"))
        .unwrap()
        .spec
        .and_then(|s| s.renew_time)
        .expect("m0 renews its Lease");
    let powered_on = st.recovery.powered_on_at.clone().unwrap();
    assert!(
        renew.0 > powered_on.0,
        "renewed {:?} after power-on {:?}",
        renew.0,
        powered_on.0
    );
    eprintln!(
        "power-on at +{:.2}s, Lease renewed by the new boot at +{:.2}s",
        secs_between(t_cut, powered_on.0),
        secs_between(t_cut, renew.0)
    );
    let nodes: Api<Node> = Api::all(c.clone());
    let n = rt.block_on(nodes.get("m0")).unwrap();
    let taints: Vec<String> = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    // Both release taints are lifted: the node takes pods again.
    assert!(
        !taints
            .iter()
            .any(|k| k == "node.kubernetes.io/out-of-service" || k == "palisade.dev/fenced"),
        "{taints:?}"
    );
}
