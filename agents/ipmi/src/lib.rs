//! Sans-IO IPMI 2.0 / RMCP+ protocol layer for Palisade's power-fencing agent.
//!
//! Nothing in this crate touches a socket or a clock: every function turns bytes into typed
//! values or typed values into bytes, so the whole protocol is testable with golden bytes.
//! The layers, outermost first:
//!
//! - [`rmcp`]: the 4-byte RMCP header carried by every UDP datagram;
//! - [`session`]: IPMI v1.5 and v2.0 (RMCP+) session framing, including the integrity trailer
//!   and AES-CBC-128 confidentiality of authenticated sessions;
//! - [`message`]: the IPMI LAN message (addresses, NetFn, sequence, checksums) inside a payload;
//! - [`cipher_suite`] and [`crypto`]: the cipher suite table and the HMAC / AES / key-derivation
//!   primitives (SIK, K1, K2);
//! - one module per command or message: [`open_session`], [`rakp`] (messages 1 to 4 and the
//!   [`rakp::Handshake`] state machine), [`get_channel_auth_capabilities`],
//!   [`get_channel_cipher_suites`], [`set_session_privilege_level`], [`chassis_control`],
//!   [`get_chassis_status`] and [`close_session`].
//!
//! The I/O (UDP, retransmission, timeouts) lives in `palisade-fence`. With the feature
//! `responder` (tests and benchmarks only), the `responder` module is the BMC's side: a
//! sans-IO BMC and a tokio UDP server for it.

pub mod chassis_control;
pub mod cipher_suite;
pub mod close_session;
pub mod command;
pub mod crypto;
pub mod error;
pub mod get_channel_auth_capabilities;
pub mod get_channel_cipher_suites;
pub mod get_chassis_status;
pub mod get_system_guid;
pub mod message;
pub mod open_session;
pub mod rakp;
#[cfg(feature = "responder")]
pub mod responder;
pub mod rmcp;
pub mod session;
pub mod set_session_privilege_level;

pub use cipher_suite::CipherSuite;
pub use command::Command;
pub use error::DecodeError;

/// IPMI privilege levels (IPMI 2.0 table 22-19).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Privilege {
    /// Callback level.
    Callback = 1,
    /// User level: enough for Get Chassis Status.
    User = 2,
    /// Operator level: enough for Chassis Control on most BMCs.
    Operator = 3,
    /// Administrator level: what a fencing agent asks for.
    Administrator = 4,
}

impl Privilege {
    /// Parses the low nibble of a privilege byte.
    pub fn from_u8(value: u8) -> Option<Self> {
        match value & 0x0f {
            1 => Some(Self::Callback),
            2 => Some(Self::User),
            3 => Some(Self::Operator),
            4 => Some(Self::Administrator),
            _ => None,
        }
    }
}
