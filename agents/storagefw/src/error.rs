//! Errors of the storage firewall agent, classified once as retryable or terminal.

/// Everything that can go wrong while fencing a node at a storage array.
#[derive(Debug, thiserror::Error)]
pub enum StorageFwError {
    /// The target URL is not a valid `storagefw+https://` URL.
    #[error("invalid storage firewall target {url:?}: {reason}")]
    InvalidTarget {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The profile (built-in name or JSON document) is unknown or malformed.
    #[error("invalid storage firewall profile {name:?}: {reason}")]
    InvalidProfile {
        /// Profile name or path.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// TLS material (CA, client certificate or key) could not be loaded.
    #[error("TLS configuration for {what}: {reason}")]
    Tls {
        /// Which piece of TLS material.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// A node name or address is not acceptable in a request.
    #[error("invalid node {node:?}: {reason}")]
    InvalidNode {
        /// The node name.
        node: String,
        /// Why it was refused.
        reason: String,
    },
    /// The request could not be sent or no response arrived (connection refused, TLS handshake
    /// failure, timeout).
    #[error("{action} for node {node} at {endpoint}: transport error")]
    Transport {
        /// block, unblock or status.
        action: &'static str,
        /// The node being fenced.
        node: String,
        /// Storage firewall endpoint.
        endpoint: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// The storage API answered with an unexpected HTTP status.
    #[error("{action} for node {node}: storage API answered HTTP {status}: {body}")]
    Http {
        /// block, unblock or status.
        action: &'static str,
        /// The node being fenced.
        node: String,
        /// HTTP status code.
        status: u16,
        /// The (truncated) response body.
        body: String,
    },
    /// The status response could not be interpreted with the profile's pointer.
    #[error("status for node {node}: cannot read {pointer:?} from the response: {reason}")]
    BadStatus {
        /// The node.
        node: String,
        /// The JSON pointer from the profile.
        pointer: String,
        /// Why it failed.
        reason: String,
    },
    /// The command was accepted but the status never confirmed it within the deadline.
    #[error(
        "{action} for node {node} was not confirmed by the storage status within {waited_ms} ms"
    )]
    NotVerified {
        /// block or unblock.
        action: &'static str,
        /// The node.
        node: String,
        /// How long verification polled.
        waited_ms: u64,
    },
}

impl StorageFwError {
    /// Whether retrying the same operation later may succeed. Authentication failures (401/403),
    /// bad requests and configuration errors are terminal: retrying cannot fix them.
    pub fn is_retryable(&self) -> bool {
        match self {
            StorageFwError::Transport { source, .. } => !source.is_builder(),
            StorageFwError::Http { status, .. } => {
                *status == 408 || *status == 429 || *status >= 500
            }
            StorageFwError::NotVerified { .. } => true,
            StorageFwError::BadStatus { .. }
            | StorageFwError::InvalidTarget { .. }
            | StorageFwError::InvalidProfile { .. }
            | StorageFwError::Tls { .. }
            | StorageFwError::InvalidNode { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16) -> StorageFwError {
        StorageFwError::Http {
            action: "block",
            node: "m0".into(),
            status,
            body: String::new(),
        }
    }

    #[test]
    fn auth_and_client_errors_are_terminal_server_errors_retryable() {
        assert!(!http(401).is_retryable());
        assert!(!http(403).is_retryable());
        assert!(!http(400).is_retryable());
        assert!(!http(404).is_retryable());
        assert!(http(429).is_retryable());
        assert!(http(500).is_retryable());
        assert!(http(503).is_retryable());
        let nv = StorageFwError::NotVerified {
            action: "block",
            node: "m0".into(),
            waited_ms: 1,
        };
        assert!(nv.is_retryable());
    }
}
