//! [`FenceError`]: what failed, on which device, and whether retrying can help.

use std::time::Duration;

use crate::power::PowerState;

/// A fencing operation failed.
///
/// [`FenceError::is_retryable`] is the one place that decides whether a retry can help.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The device refused the credentials (wrong user, password, community or key, or a role
    /// the account does not have). Terminal: retrying only locks the account out.
    #[error("{device}: authentication refused: {detail}")]
    AuthRefused {
        /// Device description (never contains a secret).
        device: String,
        /// What the device said.
        detail: String,
    },
    /// The device could not be reached at all (socket error, address resolution).
    #[error("{device}: unreachable: {source}")]
    Unreachable {
        /// Device description.
        device: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// No valid answer within the deadline, after the configured retransmissions.
    #[error("{device}: {operation} timed out after {after:?}")]
    Timeout {
        /// Device description.
        device: String,
        /// Which exchange timed out.
        operation: String,
        /// How long we waited in total.
        after: Duration,
    },
    /// The device answered with something that is not valid protocol.
    #[error("{device}: protocol error: {detail}")]
    Protocol {
        /// Device description.
        device: String,
        /// What was wrong.
        detail: String,
    },
    /// The device understood and said no (completion code, SNMP error status, ...).
    #[error("{device}: device refused: {detail}")]
    DeviceRefused {
        /// Device description.
        device: String,
        /// What the device said.
        detail: String,
    },
    /// The BMC offers no cipher suite we accept (0/1/2 are refused unless
    /// `allow_weak_cipher_suites` is set).
    #[error(
        "{device}: no acceptable cipher suite (BMC offers {offered:?}; weak suites not allowed)"
    )]
    NoAcceptableCipherSuite {
        /// Device description.
        device: String,
        /// Suites the BMC listed, or tried and refused.
        offered: Vec<u8>,
    },
    /// The command was accepted but the device did not report the expected state in time.
    #[error(
        "{device}: not verified: expected {expected}, last reported {} after {after:?}",
        match last { Some(s) => s.to_string(), None => "nothing (every read failed)".to_string() }
    )]
    NotVerified {
        /// Device description.
        device: String,
        /// The state we waited for.
        expected: PowerState,
        /// The last state the device reported (None if every poll failed).
        last: Option<PowerState>,
        /// How long we polled.
        after: Duration,
    },
    /// The device is not the one the target pins: it reported another identity (for IPMI,
    /// the managed system's GUID). Nothing was commanded.
    #[error("{device}: identity mismatch: pinned {expected}, the device reports {found}; refusing to act")]
    IdentityMismatch {
        /// Device description.
        device: String,
        /// The pinned identity.
        expected: String,
        /// What the device reported.
        found: String,
    },
    /// A firmware-bridge refused the request's fencing token: it has already seen a newer
    /// one, so this controller is no longer the leader. Terminal: retrying cannot help; step
    /// down.
    #[error("{device}: stale fencing token refused: {detail}")]
    StaleFencingToken {
        /// Device description.
        device: String,
        /// What the bridge said, for people.
        detail: String,
        /// The target's token floor, from the refusal's typed `seen_token` field; `None` when
        /// the bridge did not send it (a bridge older than the field). Never read from
        /// `detail`.
        seen_token: Option<u64>,
    },
    /// The configuration is invalid (bad URL, missing credential, unknown profile).
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl FenceError {
    /// Whether retrying the same operation later can succeed.
    ///
    /// Timeouts, unreachable devices and unverified state can be transient. Refused
    /// credentials, refused commands, protocol garbage and configuration errors are not.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. } | Self::Timeout { .. } | Self::NotVerified { .. }
        )
    }

    /// A short machine-readable kind, for attempt records and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::AuthRefused { .. } => "auth_refused",
            Self::Unreachable { .. } => "unreachable",
            Self::Timeout { .. } => "timeout",
            Self::Protocol { .. } => "protocol",
            Self::DeviceRefused { .. } => "device_refused",
            Self::NoAcceptableCipherSuite { .. } => "no_acceptable_cipher_suite",
            Self::NotVerified { .. } => "not_verified",
            Self::StaleFencingToken { .. } => "stale_fencing_token",
            Self::IdentityMismatch { .. } => "identity_mismatch",
            Self::Config(_) => "config",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_verified_names_the_last_state_as_a_word() {
        let e = FenceError::NotVerified {
            device: "bmc".into(),
            expected: PowerState::Off,
            last: Some(PowerState::On),
            after: Duration::from_secs(20),
        };
        assert_eq!(
            e.to_string(),
            "bmc: not verified: expected off, last reported on after 20s"
        );
        let e = FenceError::NotVerified {
            device: "bmc".into(),
            expected: PowerState::Off,
            last: None,
            after: Duration::from_secs(20),
        };
        assert!(e
            .to_string()
            .contains("last reported nothing (every read failed)"));
    }

    #[test]
    fn only_transient_failures_are_retryable() {
        let d = || "d".to_string();
        assert!(FenceError::Timeout {
            device: d(),
            operation: "x".into(),
            after: Duration::from_secs(1)
        }
        .is_retryable());
        assert!(!FenceError::AuthRefused {
            device: d(),
            detail: "x".into()
        }
        .is_retryable());
        assert!(!FenceError::Protocol {
            device: d(),
            detail: "x".into()
        }
        .is_retryable());
        assert!(!FenceError::DeviceRefused {
            device: d(),
            detail: "x".into()
        }
        .is_retryable());
    }
}
