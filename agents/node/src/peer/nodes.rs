//! The peer set: the cluster's Nodes and their InternalIPs.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use tokio::sync::watch;

use super::Peer;

/// Keeps `out` equal to the cluster's Node list: names and InternalIPs.
///
/// LISTs the Nodes every `interval` (every 2 s after a failure, before the first success, and
/// while a member has no address yet),
/// each LIST bounded by `interval` (at least 1 s, at most 10 s). The LIST is served from the
/// API server's watch cache (`resourceVersion=0`): a thousand agents listing once a minute
/// cost the API server little, where a watch of every Node from every agent would carry every
/// Node status update to every node. Nodes without an InternalIP stay in the list with [`Peer::NO_ADDR`]: they are
/// members but are not asked. Logs changes at info. Returns when every receiver is gone.
///
/// Guarantees: a failed or timed-out LIST keeps the last list, so a control-plane outage never
/// empties the peer set (which would shrink the majority); `out` stays empty only until the
/// first successful LIST.
pub async fn node_list_loop(
    client: kube::Client,
    interval: Duration,
    out: watch::Sender<Vec<Peer>>,
) {
    let api: Api<Node> = Api::all(client);
    let limit = interval.clamp(Duration::from_secs(1), Duration::from_secs(10));
    let mut failing = false;
    loop {
        match tokio::time::timeout(limit, api.list(&ListParams::default().match_any())).await {
            Ok(Ok(list)) => {
                if failing {
                    tracing::info!("listing Nodes for the peer check works again");
                    failing = false;
                }
                let peers = peers_of(&list.items);
                out.send_if_modified(|cur| {
                    if *cur == peers {
                        return false;
                    }
                    let names: Vec<String> = peers
                        .iter()
                        .map(|p| match p.reachable() {
                            true => format!("{}@{}", p.name, p.addr),
                            false => format!("{} (no InternalIP)", p.name),
                        })
                        .collect();
                    tracing::info!(members = peers.len(), peers = ?names, "peer set changed");
                    *cur = peers;
                    true
                });
            }
            Ok(Err(e)) => {
                if !failing {
                    tracing::warn!(error = %e, "listing Nodes for the peer check failed; keeping the last list");
                    failing = true;
                }
            }
            Err(_) => {
                if !failing {
                    tracing::warn!(timeout = ?limit, "listing Nodes for the peer check timed out; keeping the last list");
                    failing = true;
                }
            }
        }
        if out.is_closed() {
            return;
        }
        // A Node registers before its status carries an address: until every member can be
        // asked, keep listing often, or the peers stay unreachable for a whole interval.
        let retry = failing || {
            let cur = out.borrow();
            cur.is_empty() || cur.iter().any(|p| !p.reachable())
        };
        tokio::time::sleep(if retry {
            interval.min(Duration::from_secs(2))
        } else {
            interval
        })
        .await;
    }
}

/// The peers of a Node list, sorted by name.
fn peers_of(nodes: &[Node]) -> Vec<Peer> {
    let mut peers: Vec<Peer> = nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            let addr = n
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
                .and_then(|a| a.address.parse::<IpAddr>().ok())
                .unwrap_or(Peer::NO_ADDR);
            Some(Peer { name, addr })
        })
        .collect();
    peers.sort_by(|a, b| a.name.cmp(&b.name));
    peers
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
    use kube::api::ObjectMeta;

    use super::*;

    fn node(name: &str, addrs: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                addresses: Some(
                    addrs
                        .iter()
                        .map(|(t, a)| NodeAddress {
                            type_: (*t).into(),
                            address: (*a).into(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn peers_take_the_internal_ip_and_keep_nodes_without_one() {
        let peers = peers_of(&[
            node("c", &[("Hostname", "c"), ("InternalIP", "10.0.0.3")]),
            node("a", &[("ExternalIP", "1.2.3.4")]),
            node("b", &[("InternalIP", "fd00::2")]),
        ]);
        let got: Vec<(&str, String)> = peers
            .iter()
            .map(|p| (p.name.as_str(), p.addr.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "0.0.0.0".to_string()),
                ("b", "fd00::2".into()),
                ("c", "10.0.0.3".into())
            ]
        );
        assert!(!peers[0].reachable() && peers[1].reachable());
    }
}
