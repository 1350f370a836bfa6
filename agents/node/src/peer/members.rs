//! The member lists the peer check counts: those the controller may judge the node against.
//!
//! The controller judges a silent node's excuse against the member set that node advertised
//! with the last renewal it observed (`palisade.dev/peer-members`), because two strict
//! majorities intersect only within one set. That renewal is the agent's last *successful* one,
//! or a later attempt whose answer the agent never saw but which the API server may still have
//! applied (the Lease is replaced with its resourceVersion, so once a renewal succeeded no
//! earlier attempt can land any more). So the agent is excused only by a strict majority of
//! *each* of those lists: [`MemberBook::offer`] records the list each renewal advertises,
//! [`MemberBook::written`] marks the one a successful renewal carried (dropping the attempts
//! before it), and [`MemberBook::advertised`] gives the lists the poller must satisfy.

use std::collections::VecDeque;

use palisade_model::advertise::MemberSet;
use parking_lot::Mutex;

use super::Peer;

/// The lists offered to renewals since the last successful one, and that one's list.
///
/// Guarantees: [`MemberBook::advertised`] is `Some` only after a successful renewal wrote a
/// member set, and then holds that set's list and the list of every later attempt (this node
/// included in each set); `None` when more distinct lists were attempted than it keeps.
#[derive(Debug)]
pub struct MemberBook {
    node: String,
    inner: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    /// Lists offered since the last successful renewal, oldest first, distinct.
    offered: VecDeque<(MemberSet, Vec<Peer>)>,
    /// More distinct lists were offered than kept: some may land unknown, so none counts.
    overflow: bool,
    /// The list the last successful renewal carried.
    written: Option<(MemberSet, Vec<Peer>)>,
    /// The latest list offered: the freshest addresses (a member set is names only, so a
    /// member that had no InternalIP when its list was advertised is asked at the address it
    /// has now).
    latest: Vec<Peer>,
}

impl MemberBook {
    /// How many distinct lists attempted since the last success are kept.
    const KEEP: usize = 8;

    /// An empty book for node `node`.
    pub fn new(node: &str) -> Self {
        MemberBook {
            node: node.to_string(),
            inner: Mutex::new(Book::default()),
        }
    }

    /// The member set of `peers` (this node included) to advertise with the next renewal
    /// attempt, recorded as an attempt that may land; `None` for an empty list (never listed:
    /// the node is never excused).
    pub fn offer(&self, peers: &[Peer]) -> Option<MemberSet> {
        if peers.is_empty() {
            return None;
        }
        let set = MemberSet::of(
            peers
                .iter()
                .map(|p| p.name.as_str())
                .chain(std::iter::once(self.node.as_str())),
        );
        let mut b = self.inner.lock();
        b.latest = peers.to_vec();
        if !b.offered.iter().any(|(s, _)| *s == set) {
            b.offered.push_back((set, peers.to_vec()));
            if b.offered.len() > Self::KEEP {
                b.offered.pop_front();
                b.overflow = true;
            }
        }
        Some(set)
    }

    /// A renewal that advertised `set` succeeded: its list counts, and no earlier attempt can
    /// land any more.
    pub fn written(&self, set: MemberSet) {
        let mut b = self.inner.lock();
        let entry = b.offered.iter().find(|(s, _)| *s == set).cloned();
        b.written = entry;
        b.offered.clear();
        b.overflow = false;
    }

    /// The lists a strict majority of each of which must excuse the node: the last successful
    /// renewal's and every later attempt's, each member at its latest known address. `None`:
    /// never renewed with a list, or too many attempts to know.
    pub fn advertised(&self) -> Option<Vec<Vec<Peer>>> {
        let b = self.inner.lock();
        if b.overflow {
            return None;
        }
        let (written, list) = b.written.as_ref()?;
        let fresh = |l: &[Peer]| -> Vec<Peer> {
            l.iter()
                .map(|p| {
                    b.latest
                        .iter()
                        .find(|q| q.name == p.name && q.reachable())
                        .unwrap_or(p)
                        .clone()
                })
                .collect()
        };
        let mut lists = vec![fresh(list)];
        lists.extend(
            b.offered
                .iter()
                .filter(|(s, _)| s != written)
                .map(|(_, l)| fresh(l)),
        );
        Some(lists)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str) -> Peer {
        Peer {
            name: name.into(),
            addr: Peer::NO_ADDR,
        }
    }

    #[test]
    fn the_written_list_and_every_later_attempt_count() {
        let book = MemberBook::new("a");
        assert_eq!(book.offer(&[]), None);
        let old = book.offer(&[peer("b"), peer("c")]).unwrap();
        assert_eq!(old, MemberSet::of(["a", "b", "c"]));
        assert_eq!(book.advertised(), None, "attempted, never written");
        book.written(old);
        assert_eq!(lens(&book), Some(vec![2]));
        // Two Nodes join; the renewal advertising them times out (it may still land): both
        // lists count until a renewal succeeds.
        let new = book
            .offer(&[peer("b"), peer("c"), peer("d"), peer("e")])
            .unwrap();
        assert_eq!(new.count, 5);
        assert_eq!(lens(&book), Some(vec![2, 4]));
        book.offer(&[peer("b"), peer("c"), peer("d"), peer("e")]);
        assert_eq!(lens(&book), Some(vec![2, 4]), "the same list once");
        book.written(new);
        assert_eq!(lens(&book), Some(vec![4]));
        // More distinct attempts than kept: nothing counts until the next success.
        for i in 0..=MemberBook::KEEP {
            book.offer(&[peer(&format!("x{i}"))]);
        }
        assert_eq!(book.advertised(), None);
        let last = book.offer(&[peer("b")]).unwrap();
        book.written(last);
        assert_eq!(lens(&book), Some(vec![1]));
    }

    #[test]
    fn a_member_is_asked_at_its_latest_address() {
        let book = MemberBook::new("a");
        // Advertised while b had no InternalIP yet; the next renewal (with b's address, and c
        // new) does not succeed: b is asked at its new address, c counts only in its own list.
        let early = book.offer(&[peer("b")]).unwrap();
        book.written(early);
        let b_now = Peer {
            name: "b".into(),
            addr: "10.0.0.2".parse().unwrap(),
        };
        book.offer(&[b_now.clone(), peer("c")]);
        let lists = book.advertised().unwrap();
        assert_eq!(lists[0], vec![b_now.clone()]);
        assert_eq!(lists[1], vec![b_now, peer("c")]);
    }

    fn lens(book: &MemberBook) -> Option<Vec<usize>> {
        book.advertised().map(|l| l.iter().map(Vec::len).collect())
    }
}
