//! Guards the controller checks immediately before it starts a fence: pure rules, no I/O.
//!
//! - [`own_node`]: the leader never fences the node it runs on. Fencing that node (power off,
//!   storage block) would also stop the fencer half-way, with the node's pods neither fenced
//!   nor released; leadership must move to a replica on another node first.
//! - [`start_limit`]: how many fences may be in flight at once, from counts the caller took
//!   from a fresh read of the API (never from a lagging cache).
//! - [`older_sibling`]: of two unfinished fences of one node, which acts (the other is
//!   superseded).

use std::fmt;

/// What the leader does with a fence whose target is `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnNode {
    /// The target is another node (or the leader's node is unknown and the target is not it
    /// by name): proceed.
    Proceed,
    /// The target is the node this leader runs on: hand leadership over (release the Lease so
    /// a replica on another node takes it) and do not start.
    HandOver,
}

/// Whether a leader running on `own` may fence `target`.
///
/// Guarantees: returns [`OwnNode::HandOver`] whenever `own` names the target (names compare
/// exactly, as Kubernetes node names are case-sensitive DNS names).
/// Assumptions: `own` comes from the downward API (`spec.nodeName` of the controller's pod);
/// `None` means the controller was started without it (a process outside the cluster, as in
/// the lab), and then no node is the leader's.
pub fn own_node(target: &str, own: Option<&str>) -> OwnNode {
    match own {
        Some(own) if own == target => OwnNode::HandOver,
        _ => OwnNode::Proceed,
    }
}

/// Why a fence may not start now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtLimit {
    /// `in_flight` other fences are already in flight, the cluster-wide limit is `max`.
    Cluster {
        /// Fences in Fencing, Fenced or Releasing (other than the one asking).
        in_flight: usize,
        /// `limits.maxConcurrent`.
        max: usize,
    },
    /// `in_flight` other fences are in flight in the same topology domain.
    Domain {
        /// The domain (the value of the policy's topology key; empty when unlabelled).
        domain: String,
        /// Fences in flight in that domain (other than the one asking).
        in_flight: usize,
        /// `limits.perDomain.maxConcurrent`.
        max: usize,
    },
}

impl fmt::Display for AtLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cluster { in_flight, max } => {
                write!(f, "{in_flight} fence(s) in flight, maxConcurrent is {max}")
            }
            Self::Domain {
                domain,
                in_flight,
                max,
            } => write!(
                f,
                "{in_flight} fence(s) in flight in domain {domain:?}, perDomain.maxConcurrent is {max}"
            ),
        }
    }
}

/// Whether one more fence may start, given the fences already in flight.
///
/// Guarantees: after a start that this allows, at most `max` fences are in flight in the
/// cluster and at most `per_domain_max` in `domain` (a limit of 0 allows none).
/// Assumptions: the counts exclude the fence asking and were taken from the API under a lock
/// that serializes starts, so two starts cannot both see the same room.
pub fn start_limit(
    in_flight: usize,
    max: usize,
    domain: &str,
    in_domain: usize,
    per_domain_max: usize,
) -> Option<AtLimit> {
    if in_flight >= max {
        return Some(AtLimit::Cluster { in_flight, max });
    }
    if in_domain >= per_domain_max {
        return Some(AtLimit::Domain {
            domain: domain.to_string(),
            in_flight: in_domain,
            max: per_domain_max,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_two_unfinished_fences_one_acts_and_a_started_one_is_never_superseded() {
        use palisade_model::nodefence::Phase;
        let at = |s: i64| k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).ok();
        let f = |name, node, phase, created| Sibling {
            name,
            node,
            phase,
            created: at(created),
        };
        let older = f("m0-a", "m0", Phase::Pending, 100);
        let ours = f("m0-b", "m0", Phase::Pending, 200);
        let started = f("m0-c", "m0", Phase::Fencing, 300);
        let done = f("m0-d", "m0", Phase::Done, 50);
        let other = f("m1-a", "m1", Phase::Fencing, 10);
        assert_eq!(older_sibling([ours], &ours), None);
        assert_eq!(older_sibling([older, ours], &ours).as_deref(), Some("m0-a"));
        assert_eq!(older_sibling([older, ours], &older), None);
        assert_eq!(
            older_sibling([older, started, ours], &ours).as_deref(),
            Some("m0-c")
        );
        assert_eq!(
            older_sibling([older, started], &older).as_deref(),
            Some("m0-c")
        );
        assert_eq!(older_sibling([older, started], &started), None);
        assert_eq!(older_sibling([done, other, ours], &ours), None);
        // Created in the same second: the name decides, and exactly one of the two acts.
        let twin = f("m0-0", "m0", Phase::Pending, 200);
        assert_eq!(older_sibling([twin, ours], &ours).as_deref(), Some("m0-0"));
        assert_eq!(older_sibling([twin, ours], &twin), None);
    }

    #[test]
    fn own_node_table() {
        let cases: &[(&str, Option<&str>, OwnNode)] = &[
            ("m0", Some("m0"), OwnNode::HandOver),
            ("m0", Some("m1"), OwnNode::Proceed),
            ("m0", None, OwnNode::Proceed),
            ("M0", Some("m0"), OwnNode::Proceed),
            ("m0", Some(""), OwnNode::Proceed),
            ("m10", Some("m1"), OwnNode::Proceed),
        ];
        for (target, own, want) in cases {
            assert_eq!(own_node(target, *own), *want, "target {target} own {own:?}");
        }
    }

    #[test]
    fn start_limit_table() {
        let cluster = |in_flight, max| Some(AtLimit::Cluster { in_flight, max });
        let domain = |in_flight, max| {
            Some(AtLimit::Domain {
                domain: "z1".into(),
                in_flight,
                max,
            })
        };
        // (in_flight, max, in_domain, per_domain_max, want)
        let cases = [
            (0, 1, 0, 1, None),
            (1, 1, 0, 1, cluster(1, 1)),
            (1, 2, 0, 1, None),
            (2, 2, 0, 5, cluster(2, 2)),
            (3, 2, 0, 5, cluster(3, 2)),
            (0, 0, 0, 5, cluster(0, 0)),
            (1, 5, 1, 1, domain(1, 1)),
            (0, 5, 0, 0, domain(0, 0)),
            (4, 5, 1, 2, None),
        ];
        for (i, (in_flight, max, in_domain, per, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                start_limit(in_flight, max, "z1", in_domain, per),
                want,
                "case {i}"
            );
        }
    }

    #[test]
    fn limit_messages_name_the_limit() {
        assert_eq!(
            start_limit(2, 2, "z", 0, 9).unwrap().to_string(),
            "2 fence(s) in flight, maxConcurrent is 2"
        );
        assert!(start_limit(0, 2, "z", 1, 1)
            .unwrap()
            .to_string()
            .contains("perDomain.maxConcurrent is 1"));
    }
}

/// A `NodeFence` as the sibling rule ([`older_sibling`]) sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sibling<'a> {
    /// Its name.
    pub name: &'a str,
    /// The node it fences (`spec.nodeName`).
    pub node: &'a str,
    /// Its phase (a missing status is `Pending`).
    pub phase: palisade_model::nodefence::Phase,
    /// Its creation time (the API server's, one-second resolution).
    pub created: Option<k8s_openapi::jiff::Timestamp>,
}

impl Sibling<'_> {
    /// The order in which siblings act: one that has left `Pending` first, then the older by
    /// creation time, then by name.
    fn rank(&self) -> (bool, Option<k8s_openapi::jiff::Timestamp>, &str) {
        (
            self.phase == palisade_model::nodefence::Phase::Pending,
            self.created,
            self.name,
        )
    }
}

/// The other unfinished fence of `ours`'s node among `fences` that acts instead of `ours`, if
/// any.
///
/// Guarantees: a fence that has started (it may hold a token and have commanded devices) is
/// never superseded by one still `Pending`; of any set of unfinished fences of one node,
/// exactly one gets `None` (the order is total: names are unique). Creation times have
/// one-second resolution, so two fences created in the same second are otherwise ordered by
/// name alone, which must not let a new request displace the one already fencing.
/// Assumptions: `fences` is a fresh enough view that a started sibling is in it (the start
/// gate reads the API again before a fence leaves `Pending`).
pub fn older_sibling<'a, 'b>(
    fences: impl IntoIterator<Item = Sibling<'b>>,
    ours: &Sibling<'a>,
) -> Option<String> {
    let mine = ours.rank();
    fences
        .into_iter()
        .filter(|f| f.node == ours.node && f.name != ours.name && !f.phase.is_terminal())
        .filter(|f| f.rank() < mine)
        .min_by(|a, b| a.rank().cmp(&b.rank()))
        .map(|f| f.name.to_string())
}
