//! Verified outcomes. Only the verification step in [`crate::client`] can construct them, so
//! code holding a [`VerifiedBlocked`] knows the storage itself reported the node blocked.

use std::net::IpAddr;
use std::time::SystemTime;

/// A node's status as the storage reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStatus {
    /// The node name.
    pub node: String,
    /// Whether the profile's pointer says "blocked".
    pub blocked: bool,
    /// The raw status document, for audit.
    pub raw: serde_json::Value,
}

/// Evidence that the storage reported `node` blocked after a block command.
///
/// Guarantees: constructed only after a status read returned "blocked" for this node on this
/// endpoint. Fields are private to this crate; there is no public constructor, so no other
/// crate can build one (the same literal compiles inside this crate, in its unit tests):
///
/// ```compile_fail,E0451
/// let _ = palisade_storagefw::VerifiedBlocked {
///     node: "m0".into(),
///     addresses: vec![],
///     endpoint: "https://x".into(),
///     profile: "lab".into(),
///     verified_at: std::time::SystemTime::UNIX_EPOCH,
///     status: serde_json::Value::Null,
///     hold: None,
/// };
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedBlocked {
    pub(crate) node: String,
    pub(crate) addresses: Vec<IpAddr>,
    pub(crate) endpoint: String,
    pub(crate) profile: String,
    pub(crate) verified_at: SystemTime,
    pub(crate) status: serde_json::Value,
    pub(crate) hold: Option<String>,
}

impl VerifiedBlocked {
    /// The fenced node.
    pub fn node(&self) -> &str {
        &self.node
    }
    /// The addresses named in the block command.
    pub fn addresses(&self) -> &[IpAddr] {
        &self.addresses
    }
    /// The storage admin endpoint that confirmed the block.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
    /// The profile used.
    pub fn profile(&self) -> &str {
        &self.profile
    }
    /// When the confirming status was read.
    pub fn verified_at(&self) -> SystemTime {
        self.verified_at
    }
    /// The confirming status document.
    pub fn status(&self) -> &serde_json::Value {
        &self.status
    }
}

/// Evidence that the storage reported `node` no longer blocked after an explicit unfence.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedUnblocked {
    pub(crate) node: String,
    pub(crate) endpoint: String,
    pub(crate) verified_at: SystemTime,
}

impl VerifiedUnblocked {
    /// The unfenced node.
    pub fn node(&self) -> &str {
        &self.node
    }
    /// The storage admin endpoint that confirmed the unblock.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
    /// When the confirming status was read.
    pub fn verified_at(&self) -> SystemTime {
        self.verified_at
    }
}

/// Whether a node may write to shared storage, as far as verified storage-fence operations
/// know. Storage fencing is sticky (Pacemaker's "unfencing"): once fenced, only a verified
/// unfence of the same node moves it back to [`WriteAccess::Allowed`]; a reboot, a restart of
/// the agent or a healed partition does not.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteAccess {
    /// Never fenced, or unfenced with verification.
    Allowed,
    /// Fenced, with the evidence.
    Fenced(VerifiedBlocked),
}

impl WriteAccess {
    /// Records a verified fence.
    pub fn fence(evidence: VerifiedBlocked) -> Self {
        WriteAccess::Fenced(evidence)
    }

    /// Applies a verified unfence. Returns whether the state changed: it does not when the
    /// proof is for another node, or when the node was not fenced.
    pub fn unfence(&mut self, proof: &VerifiedUnblocked) -> bool {
        match self {
            WriteAccess::Fenced(e) if e.node == proof.node => {
                *self = WriteAccess::Allowed;
                true
            }
            _ => false,
        }
    }

    /// Whether the node may write.
    pub fn may_write(&self) -> bool {
        matches!(self, WriteAccess::Allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same literal as the `compile_fail` example of [`VerifiedBlocked`]: it compiles
    /// here, so outside the crate it fails only because the fields are private.
    fn blocked(node: &str) -> VerifiedBlocked {
        crate::VerifiedBlocked {
            node: node.into(),
            addresses: vec![],
            endpoint: "https://x".into(),
            profile: "lab".into(),
            verified_at: SystemTime::UNIX_EPOCH,
            status: serde_json::Value::Null,
            hold: None,
        }
    }

    fn unblocked(node: &str) -> VerifiedUnblocked {
        VerifiedUnblocked {
            node: node.into(),
            endpoint: "https://x".into(),
            verified_at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn only_a_verified_unfence_of_the_same_node_restores_write_access() {
        let mut access = WriteAccess::fence(blocked("m0"));
        assert!(!access.may_write());
        assert!(!access.unfence(&unblocked("m1")));
        assert!(!access.may_write());
        assert!(access.unfence(&unblocked("m0")));
        assert!(access.may_write());
        // Unfencing a node that is not fenced is not a transition.
        assert!(!WriteAccess::Allowed.unfence(&unblocked("m0")));
    }
}
