//! One actor: two replicas, one leader; the fencing token in the Lease increases when the other
//! replica takes over, and the new leader fences with the higher token.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use palisade_lab::Cut;
use palisade_model::nodefence::Phase;

#[test]
fn standby_takes_over_with_a_higher_token_and_fences_with_it() {
    let lab = start_lab(3, false);
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, SYSTEM_NS);
    let leases: Api<Lease> = Api::namespaced(c.clone(), SYSTEM_NS);
    let a = start_controller(&lab, "ctl-a");
    let (_, t1) = eventually("ctl-a leads", Duration::from_secs(60), || {
        let l = rt
            .block_on(leases.get_opt("palisade-controller"))
            .ok()
            .flatten()?;
        let (h, t) = holder_and_token(&l);
        (h == "ctl-a").then_some((h, t))
    });
    let b = start_controller(&lab, "ctl-b");
    // B runs its ticks as a follower: it never takes the Lease while A renews.
    b.wait_ticks(16);
    let l = rt.block_on(leases.get("palisade-controller")).unwrap();
    assert_eq!(holder_and_token(&l), ("ctl-a".to_string(), t1));
    assert!(b
        .metrics()
        .unwrap_or_default()
        .contains("palisade_leader 0"));

    drop(a); // SIGKILL: no hand-over.
    let (_, t2) = eventually("ctl-b takes over", Duration::from_secs(60), || {
        let l = rt
            .block_on(leases.get_opt("palisade-controller"))
            .ok()
            .flatten()?;
        let (h, t) = holder_and_token(&l);
        (h == "ctl-b").then_some((h, t))
    });
    assert!(t2 > t1, "token {t2} > {t1}");

    policy(&c, &rt);
    ipmi_targets(&lab, &c, &rt);
    lab.partition(2, Cut::All).unwrap();
    let nf = eventually("m2's NodeFence Released", Duration::from_secs(180), || {
        fences_for(&c, &rt, "m2").into_iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Released)
        })
    });
    let st = nf.status.unwrap();
    assert_eq!(st.fencing_token, Some(t2));
    assert!(st.attempts.iter().all(|a| a.token == t2));
    assert!(lab.machines()[2].processes().is_empty());
}
