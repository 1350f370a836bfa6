//! The peer set: the cluster's Nodes and their InternalIPs.
//!
//! A LIST gives the set (names and addresses); a metadata-only watch of the Nodes says when
//! to LIST again: at once when a Node is added or deleted, not an interval later.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PartialObjectMeta};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::sync::watch;

use super::Peer;

/// Keeps `out` equal to the cluster's Node list: names and InternalIPs.
///
/// LISTs the Nodes every `interval`, and at once when a metadata-only watch of the Nodes sees
/// one added or deleted (`WatchedNames`); every 2 s after a failure, before the first
/// success, while a member has no address yet, and while the last LIST disagrees with the
/// names the watch holds (a LIST served from a cache that lags the watch). Each LIST is bounded
/// by `interval` (at least 1 s, at most 10 s) and served from the API server's watch cache
/// (`resourceVersion=0`). The watch carries metadata only, and a Node's status updates wake
/// nothing (only a change of the set of names does), so an agent that listed before every Node
/// registered advertises the full set within a LIST of the last registration, not up to an
/// `interval` later. Nodes without an InternalIP stay in the list with [`Peer::NO_ADDR`]: they
/// are members but are not asked. Logs changes at info. Returns when every receiver is gone.
///
/// Guarantees: `out` changes only when a LIST returns a different list (a watch event alone
/// never changes it, so the member set changes only when the Nodes do); a failed or timed-out
/// LIST keeps the last list, so a control-plane outage never empties the peer set (which would
/// shrink the majority); `out` stays empty only until the first successful LIST. Without the
/// watch (it fails or ends), the periodic LIST still runs.
pub async fn node_list_loop(
    client: kube::Client,
    interval: Duration,
    out: watch::Sender<Vec<Peer>>,
) {
    let api: Api<Node> = Api::all(client.clone());
    let limit = interval.clamp(Duration::from_secs(1), Duration::from_secs(10));
    let (names_tx, mut names_rx) = watch::channel(None);
    let watch = tokio::spawn(watch_node_names(Api::all(client), names_tx));
    let _stop_watch = AbortOnDrop(watch);
    let mut watching = true;
    let mut failing = false;
    loop {
        // Marked seen before the LIST: a change during it wakes the next one.
        names_rx.borrow_and_update();
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
        let soon = relist_soon(failing, &out.borrow(), names_rx.borrow().as_ref());
        let wait = tokio::time::sleep(if soon {
            interval.min(Duration::from_secs(2))
        } else {
            interval
        });
        tokio::select! {
            _ = wait => {}
            r = names_rx.changed(), if watching => {
                if r.is_err() {
                    tracing::warn!("the Node watch ended: listing the peers every interval only");
                    watching = false;
                }
            }
        }
    }
}

/// Whether to LIST again after the short retry delay rather than the full interval: the last
/// LIST failed, nothing was listed yet, a member has no address yet (a Node registers before
/// its status carries one), or the listed names differ from the names the Node watch holds
/// (`watched`, `None` before its first complete list).
fn relist_soon(failing: bool, listed: &[Peer], watched: Option<&BTreeSet<String>>) -> bool {
    failing
        || listed.is_empty()
        || listed.iter().any(|p| !p.reachable())
        || watched.is_some_and(|w| !w.iter().eq(listed.iter().map(|p| &p.name)))
}

/// Aborts a task when dropped (the Node watch ends with the loop that owns it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Publishes the names of the cluster's Nodes, as a metadata-only watch sees them, into `out`:
/// a new value only when the set of names changes ([`WatchedNames`]). Watch errors are retried
/// with the watcher's default backoff; returns when `out` has no receiver.
async fn watch_node_names(
    api: Api<PartialObjectMeta<Node>>,
    out: watch::Sender<Option<BTreeSet<String>>>,
) {
    let mut names = WatchedNames::default();
    let mut failing = false;
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => {
                failing = false;
                names.apply(name_event(ev));
                let now = names.current();
                out.send_if_modified(|cur| {
                    if *cur == now {
                        return false;
                    }
                    *cur = now;
                    true
                });
            }
            Err(e) => {
                if !failing {
                    tracing::debug!(error = %e, "Node watch for the peer check failed; retrying");
                    failing = true;
                }
            }
        }
        if out.is_closed() {
            return;
        }
    }
}

/// A watch event with each Node reduced to its name.
fn name_event(ev: watcher::Event<PartialObjectMeta<Node>>) -> watcher::Event<String> {
    let name = |m: PartialObjectMeta<Node>| m.metadata.name.unwrap_or_default();
    match ev {
        watcher::Event::Apply(m) => watcher::Event::Apply(name(m)),
        watcher::Event::Delete(m) => watcher::Event::Delete(name(m)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(m) => watcher::Event::InitApply(name(m)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The set of Node names a watch has seen, changed only by a Node added or deleted (a Node's
/// updates leave it as it is) and, after the watch re-lists, replaced whole once the re-list
/// is complete.
#[derive(Debug, Default)]
struct WatchedNames {
    /// `None` until the first complete list.
    names: Option<BTreeSet<String>>,
    /// The names of a re-list in progress.
    relisting: Option<BTreeSet<String>>,
}

impl WatchedNames {
    fn apply(&mut self, ev: watcher::Event<String>) {
        match ev {
            watcher::Event::Init => self.relisting = Some(BTreeSet::new()),
            watcher::Event::InitApply(n) => {
                self.relisting.get_or_insert_with(BTreeSet::new).insert(n);
            }
            watcher::Event::InitDone => {
                self.names = Some(self.relisting.take().unwrap_or_default());
            }
            watcher::Event::Apply(n) => {
                if let Some(names) = self.names.as_mut() {
                    names.insert(n);
                }
            }
            watcher::Event::Delete(n) => {
                if let Some(names) = self.names.as_mut() {
                    names.remove(&n);
                }
            }
        }
    }

    /// The names after the last complete list and the events since.
    fn current(&self) -> Option<BTreeSet<String>> {
        self.names.clone()
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

    fn set(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|n| n.to_string()).collect())
    }

    /// The watch's names change only when a Node is added or deleted: updates of a known Node
    /// (its status, every renew interval) and a re-list that finds the same Nodes change
    /// nothing, so they never wake a LIST.
    #[test]
    fn the_watched_names_change_only_when_a_node_is_added_or_deleted() {
        use watcher::Event::*;
        let mut w = WatchedNames::default();
        let mut seen = Vec::new();
        let events = [
            Init,
            InitApply("a".to_string()),
            InitApply("b".into()),
            InitDone,
            Apply("a".into()),
            Apply("c".into()),
            Apply("c".into()),
            Delete("b".into()),
            // The watch restarts: nothing changes until the re-list completes, and then only
            // if the Nodes did.
            Init,
            InitApply("a".into()),
            InitApply("c".into()),
            InitDone,
            Init,
            InitApply("c".into()),
            InitDone,
        ];
        for ev in events {
            w.apply(ev);
            if seen.last() != Some(&w.current()) {
                seen.push(w.current());
            }
        }
        assert_eq!(
            seen,
            vec![
                None,
                set(&["a", "b"]),
                set(&["a", "b", "c"]),
                set(&["a", "c"]),
                set(&["c"]),
            ]
        );
    }

    #[test]
    fn a_node_the_watch_saw_added_or_deleted_makes_the_next_list_come_soon() {
        let up = |name: &str| Peer {
            name: name.into(),
            addr: "10.0.0.1".parse().unwrap(),
        };
        let listed = [up("a"), up("b")];
        assert!(
            !relist_soon(false, &listed, None),
            "no watch yet: the interval"
        );
        assert!(!relist_soon(false, &listed, set(&["a", "b"]).as_ref()));
        assert!(
            relist_soon(false, &listed, set(&["a", "b", "c"]).as_ref()),
            "added"
        );
        assert!(relist_soon(false, &listed, set(&["a"]).as_ref()), "deleted");
        assert!(
            relist_soon(true, &listed, set(&["a", "b"]).as_ref()),
            "failing"
        );
        assert!(relist_soon(false, &[], None), "never listed");
        let no_addr = [
            up("a"),
            Peer {
                name: "b".into(),
                addr: Peer::NO_ADDR,
            },
        ];
        assert!(relist_soon(false, &no_addr, set(&["a", "b"]).as_ref()));
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
