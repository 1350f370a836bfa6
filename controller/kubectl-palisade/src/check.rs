//! `kubectl palisade check`: a preflight of the whole configuration, with the controller's own
//! rules. Exit 0 when nothing is wrong, [`crate::PROBLEMS`] otherwise.

use std::net::ToSocketAddrs;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, ResourceExt};
use palisade_decide::acceptance;
use palisade_model::target::DeviceScheme;

use crate::world::{age, secs, World};

/// Runs every check and prints one line per finding.
pub async fn run(c: &Client, controller_ns: &str) -> anyhow::Result<u8> {
    let w = World::read(c).await?;
    let mut problems = 0usize;
    let mut bad = |line: String| {
        problems += 1;
        println!("PROBLEM  {line}");
    };
    // The controller.
    let leases: Api<Lease> = Api::namespaced(c.clone(), controller_ns);
    match leases.get_opt("palisade-controller").await? {
        None => bad(format!("no controller leader Lease {controller_ns}/palisade-controller: is the controller running?")),
        Some(l) => {
            let spec = l.spec.unwrap_or_default();
            let holder = spec.holder_identity.unwrap_or_default();
            let renewed = spec.renew_time.map(|t| secs(t.0, w.now));
            let duration = f64::from(spec.lease_duration_seconds.unwrap_or(15));
            match renewed {
                Some(a) if a <= duration && !holder.is_empty() => println!("ok       controller leader {holder}, renewed {} ago", age(a)),
                Some(a) => bad(format!("the controller's leader Lease ({holder:?}) was renewed {} ago: no leader acts", age(a))),
                None => bad("the controller's leader Lease was never renewed".into()),
            }
        }
    }
    // Policies.
    if w.policies.is_empty() {
        bad("no FencingPolicy: Palisade reports silent nodes and never fences any".into());
    }
    for (name, v) in w.policy_verdicts() {
        if !v.accepted() {
            bad(format!(
                "policy {name}: {} ({})",
                v.message,
                v.problems.join("; ")
            ));
        } else if v.covered.as_ref().is_some_and(Vec::is_empty) {
            bad(format!("policy {name} selects no node"));
        } else {
            println!("ok       policy {name}: {}", v.message);
        }
    }
    // Nodes, targets, trust.
    for n in &w.nodes {
        let name = n.name_any();
        let policies = w.policies_for(n);
        let Some(policy) = policies.first().filter(|_| policies.len() == 1) else {
            if policies.is_empty() {
                bad(format!("node {name}: no policy selects it"));
            }
            continue;
        };
        match w.targets.get(&name) {
            Some(t) => {
                let v = acceptance::target(&t.spec);
                if v.accepted() {
                    println!("ok       node {name}: {}", v.message);
                } else {
                    bad(format!(
                        "node {name}: FenceTarget not accepted: {}",
                        v.problems.join("; ")
                    ));
                }
                for l in &t.spec.levels {
                    for d in &l.devices {
                        if DeviceScheme::of(&d.url) == Some(DeviceScheme::Bridge) {
                            check_reachable(&d.url, &mut bad);
                        }
                    }
                }
            }
            None if policy.spec.trust_self_fence.enabled => {
                let ad = palisade_decide::convert::advertisement(w.leases.get(&name));
                let margin =
                    Duration::from_secs(policy.spec.trust_self_fence.margin_seconds.max(0) as u64);
                match ad.trust(margin, policy.spec.trust_self_fence.virtual_machines) {
                    Err(why) => bad(format!("node {name}: no FenceTarget, and its self-fence earns no trust ({why}): a silent {name} will be held, never fenced")),
                    Ok(_) => println!("ok       node {name}: trusted self-fence (watchdog advertised)"),
                }
            }
            None => bad(format!(
                "node {name}: no FenceTarget and self-fencing is not trusted: it cannot be fenced"
            )),
        }
    }
    if problems == 0 {
        println!("no problems found");
        Ok(0)
    } else {
        println!("{problems} problem(s)");
        Ok(crate::PROBLEMS)
    }
}

/// A `bridge://host:port/id` device: can a TCP connection be opened within 2 s?
fn check_reachable(url: &str, bad: &mut impl FnMut(String)) {
    let Some(authority) = url
        .strip_prefix("bridge://")
        .and_then(|r| r.split('/').next())
    else {
        return;
    };
    let reachable = authority
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|addr| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
        });
    if !reachable {
        bad(format!(
            "firmware-bridge {authority} does not accept connections"
        ));
    }
}
