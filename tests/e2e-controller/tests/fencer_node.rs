//! Never fence the fencer: when the node the leader runs on goes silent, the leader hands
//! leadership over (releases its Lease) before anything is fenced, and the replica on another
//! node fences it with a higher token. The leader's node is told to each replica the way the
//! downward API tells it in a cluster (`PALISADE_NODE_NAME`).

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, ResourceExt};
use palisade_lab::Cut;
use palisade_model::nodefence::Phase;

#[test]
fn the_leaders_own_node_is_fenced_only_after_leadership_moved() {
    let lab = start_lab(3, false);
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    let leases: Api<Lease> = Api::namespaced(c.clone(), SYSTEM_NS);

    // ctl-a "runs on" m2, ctl-b on m0.
    let a = start_controller_with_env(&lab, "ctl-a", &[("PALISADE_NODE_NAME", "m2".into())]);
    let (_, t1) = eventually("ctl-a leads", Duration::from_secs(60), || {
        let l = rt
            .block_on(leases.get_opt("palisade-controller"))
            .ok()
            .flatten()?;
        let (h, t) = holder_and_token(&l);
        (h == "ctl-a").then_some((h, t))
    });
    let b = start_controller_with_env(&lab, "ctl-b", &[("PALISADE_NODE_NAME", "m0".into())]);
    b.wait_ticks(8);

    policy(&c, &rt);
    ipmi_targets(&lab, &c, &rt);
    lab.partition(2, Cut::All).unwrap();

    let nf = eventually("m2's NodeFence Released", Duration::from_secs(240), || {
        fences_for(&c, &rt, "m2").into_iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Released)
        })
    });
    let l = rt.block_on(leases.get("palisade-controller")).unwrap();
    let (holder, t2) = holder_and_token(&l);
    assert_eq!(holder, "ctl-b", "leadership moved to the replica on m0");
    assert!(t2 > t1, "token {t2} > {t1}");

    let st = nf.status.clone().unwrap();
    let token = st.fencing_token.expect("a fencing token recorded");
    assert!(
        token > t1,
        "fenced under ctl-b's token {token}, not ctl-a's {t1}"
    );
    assert!(
        st.attempts.iter().all(|at| at.token > t1),
        "no device attempt under the leader that runs on m2: {:?}",
        st.attempts
    );
    assert!(
        !events(&c, &rt, "default", &nf.name_any(), "LeaderOnTarget").is_empty(),
        "an Event says the leader handed over"
    );
    assert!(a.log_text().contains("handing leadership over"));
    assert!(!a.log_text().contains("fencing node m2 with levels"));
    assert!(lab.machines()[2].processes().is_empty());
}
