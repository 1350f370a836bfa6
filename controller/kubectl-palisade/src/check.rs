//! `kubectl palisade check`: a preflight of the whole configuration, with the controller's own
//! rules. Exit 0 when nothing is wrong, [`crate::PROBLEMS`] otherwise.

use std::fmt::Write;
use std::net::ToSocketAddrs;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, ResourceExt};
use palisade_decide::acceptance;
use palisade_model::target::DeviceScheme;
use serde::Serialize;

use crate::output::OutputArg;
use crate::world::{age, secs, World};

/// What `check` found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// One line per thing checked, in the order checked.
    pub findings: Vec<Finding>,
    /// How many findings are problems.
    pub problems: usize,
}

/// One thing checked.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub level: Level,
    pub message: String,
}

/// Whether a finding is a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Level {
    Ok,
    Problem,
}

/// Every check, from what was read: the controller's leader Lease (`None`: there is none), and
/// whether each firmware-bridge `host:port` accepts connections.
pub fn findings(
    w: &World,
    controller_ns: &str,
    leader: Option<Lease>,
    reachable: impl Fn(&str) -> bool,
) -> Check {
    let mut all: Vec<Finding> = Vec::new();
    let mut push = |level: Level, message: String| all.push(Finding { level, message });
    let ok = Level::Ok;
    let bad = Level::Problem;
    // The controller.
    match leader {
        None => push(bad, format!("no controller leader Lease {controller_ns}/palisade-controller: is the controller running?")),
        Some(l) => {
            let spec = l.spec.unwrap_or_default();
            let holder = spec.holder_identity.unwrap_or_default();
            let renewed = spec.renew_time.map(|t| secs(t.0, w.now));
            let duration = f64::from(spec.lease_duration_seconds.unwrap_or(15));
            match renewed {
                Some(a) if a <= duration && !holder.is_empty() => push(ok, format!("controller leader {holder}, renewed {} ago", age(a))),
                Some(a) => push(bad, format!("the controller's leader Lease ({holder:?}) was renewed {} ago: no leader acts", age(a))),
                None => push(bad, "the controller's leader Lease was never renewed".into()),
            }
        }
    }
    // Policies.
    if w.policies.is_empty() {
        push(
            bad,
            "no FencingPolicy: Palisade reports silent nodes and never fences any".into(),
        );
    }
    for (name, v) in w.policy_verdicts() {
        if !v.accepted() {
            push(
                bad,
                format!("policy {name}: {} ({})", v.message, v.problems.join("; ")),
            );
        } else if v.covered.as_ref().is_some_and(Vec::is_empty) {
            push(bad, format!("policy {name} selects no node"));
        } else {
            push(ok, format!("policy {name}: {}", v.message));
        }
    }
    // Nodes, targets, trust.
    for n in &w.nodes {
        let name = n.name_any();
        let policies = w.policies_for(n);
        let Some(policy) = policies.first().filter(|_| policies.len() == 1) else {
            if policies.is_empty() {
                push(bad, format!("node {name}: no policy selects it"));
            }
            continue;
        };
        match w.targets.get(&name) {
            Some(t) => {
                let v = acceptance::target(&t.spec);
                if v.accepted() {
                    push(ok, format!("node {name}: {}", v.message));
                } else {
                    push(
                        bad,
                        format!(
                            "node {name}: FenceTarget not accepted: {}",
                            v.problems.join("; ")
                        ),
                    );
                }
                for l in &t.spec.levels {
                    for d in &l.devices {
                        if DeviceScheme::of(&d.url) != Some(DeviceScheme::Bridge) {
                            continue;
                        }
                        if let Some(authority) = bridge_authority(&d.url) {
                            if !reachable(authority) {
                                push(
                                    bad,
                                    format!(
                                        "firmware-bridge {authority} does not accept connections"
                                    ),
                                );
                            }
                        }
                    }
                }
            }
            None if policy.spec.trust_self_fence.enabled => {
                let ad = palisade_decide::convert::advertisement(w.leases.get(&name), Some(n));
                let margin =
                    Duration::from_secs(policy.spec.trust_self_fence.margin_seconds.max(0) as u64);
                match ad.trust(margin, policy.spec.trust_self_fence.virtual_machines) {
                    Err(why) => push(bad, format!("node {name}: no FenceTarget, and its self-fence earns no trust ({why}): a silent {name} will be held, never fenced")),
                    Ok(_) => push(ok, format!("node {name}: trusted self-fence (watchdog advertised)")),
                }
            }
            None => push(
                bad,
                format!(
                    "node {name}: no FenceTarget and self-fencing is not trusted: it cannot be fenced"
                ),
            ),
        }
    }
    let problems = all.iter().filter(|f| f.level == Level::Problem).count();
    Check {
        findings: all,
        problems,
    }
}

/// The findings as the text `check` prints.
pub fn text(c: &Check) -> String {
    let mut o = String::new();
    for f in &c.findings {
        let _ = match f.level {
            Level::Ok => writeln!(o, "ok       {}", f.message),
            Level::Problem => writeln!(o, "PROBLEM  {}", f.message),
        };
    }
    let _ = if c.problems == 0 {
        writeln!(o, "no problems found")
    } else {
        writeln!(o, "{} problem(s)", c.problems)
    };
    o
}

/// Runs every check and prints one line per finding.
pub async fn run(c: &Client, controller_ns: &str, out: OutputArg) -> anyhow::Result<u8> {
    let w = World::read(c).await?;
    let leases: Api<Lease> = Api::namespaced(c.clone(), controller_ns);
    let leader = leases.get_opt("palisade-controller").await?;
    let report = findings(&w, controller_ns, leader, reachable);
    crate::output::print(out, &report, text)?;
    Ok(if report.problems == 0 {
        0
    } else {
        crate::PROBLEMS
    })
}

/// The `host:port` of a `bridge://host:port/id` device.
fn bridge_authority(url: &str) -> Option<&str> {
    url.strip_prefix("bridge://")
        .and_then(|r| r.split('/').next())
}

/// Can a TCP connection to `host:port` be opened within 2 s?
fn reachable(authority: &str) -> bool {
    authority
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|addr| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::tests::{node, world};

    #[test]
    fn no_leader_no_policy_and_an_unselected_node_are_three_problems() {
        let mut w = world();
        w.nodes = vec![node("m1")];
        let c = findings(&w, "palisade-system", None, |_| true);
        assert_eq!(c.problems, 3);
        assert_eq!(
            text(&c),
            "PROBLEM  no controller leader Lease palisade-system/palisade-controller: is the controller running?\n\
             PROBLEM  no FencingPolicy: Palisade reports silent nodes and never fences any\n\
             PROBLEM  node m1: no policy selects it\n\
             3 problem(s)\n"
        );
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["problems"], 3);
        assert_eq!(json["findings"][2]["level"], "problem");
        assert_eq!(
            json["findings"][2]["message"],
            "node m1: no policy selects it"
        );
    }

    #[test]
    fn the_bridge_authority_is_the_url_host_and_port() {
        assert_eq!(
            bridge_authority("bridge://10.0.0.1:7443/m1"),
            Some("10.0.0.1:7443")
        );
        assert_eq!(bridge_authority("ipmi://10.0.0.1"), None);
    }
}
