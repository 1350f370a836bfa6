//! Guards the controller checks immediately before it starts a fence: pure rules, no I/O.
//!
//! - [`own_node`]: the leader never fences the node it runs on. Fencing that node (power off,
//!   storage block) would also stop the fencer half-way, with the node's pods neither fenced
//!   nor released; leadership must move to a replica on another node first.
//! - [`start_limit`]: how many fences may be in flight at once, from counts the caller took
//!   from a fresh read of the API (never from a lagging cache).

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
