//! The decoding error shared by every layer of the crate.

/// Why a datagram, payload or response could not be decoded.
///
/// Every variant is a protocol error: the peer sent something that is not valid IPMI for the
/// state we are in. None of them is retryable by resending the same request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the structure needs.
    #[error("{what}: truncated, need {need} bytes, got {got}")]
    Truncated {
        /// Which structure was being decoded.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// The RMCP header is not version 6 / class IPMI.
    #[error("not an RMCP IPMI datagram (version {version:#04x}, class {class:#04x})")]
    NotRmcpIpmi {
        /// RMCP version byte.
        version: u8,
        /// RMCP message class byte.
        class: u8,
    },
    /// The session authentication type is one we do not speak.
    #[error("unsupported session auth type {0:#04x}")]
    UnsupportedAuthType(u8),
    /// The payload type is unknown.
    #[error("unknown payload type {0:#04x}")]
    UnknownPayloadType(u8),
    /// A checksum in an IPMI message is wrong.
    #[error("bad IPMI message checksum ({which})")]
    BadChecksum {
        /// Which checksum: "header" or "data".
        which: &'static str,
    },
    /// The integrity trailer is malformed or the AuthCode does not verify.
    #[error("integrity check failed: {0}")]
    Integrity(&'static str),
    /// A protected packet arrived where keys are not established, or an unprotected one where
    /// they are required.
    #[error("unexpected protection: {0}")]
    UnexpectedProtection(&'static str),
    /// Decryption failed (length or padding).
    #[error("confidentiality: {0}")]
    Confidentiality(&'static str),
    /// A field holds a value the spec does not allow.
    #[error("{what}: invalid value {value:#04x}")]
    InvalidField {
        /// Which field.
        what: &'static str,
        /// The offending value.
        value: u32,
    },
    /// The response does not answer the request it was matched to.
    #[error("response mismatch: {0}")]
    Mismatch(&'static str),
}

/// Checks that `bytes` holds at least `need` bytes.
pub(crate) fn need(what: &'static str, bytes: &[u8], need: usize) -> Result<(), DecodeError> {
    if bytes.len() < need {
        Err(DecodeError::Truncated {
            what,
            need,
            got: bytes.len(),
        })
    } else {
        Ok(())
    }
}

/// Reads a little-endian u32 at `at` (caller checked the length).
pub(crate) fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}
