//! Storage firewall fencing agent for Palisade.
//!
//! Power fencing proves a node is dead; storage fencing proves a node can no longer write to
//! shared storage even if it is alive. This crate talks to a storage array's HTTPS admin API
//! (target scheme `storagefw+https://host:port/?profile=NAME`) to block a node's addresses,
//! unblock them (the explicit *unfence*), and read the node's status back.
//!
//! - [`target`] parses the URL; [`profile`] holds the vendor request templates (a generic JSON
//!   profile plus the built-in `lab` profile) and renders them without I/O;
//! - [`client`] sends requests over rustls with CA pinning (only the configured CA is trusted),
//!   an optional client certificate and an optional bearer token ([`secret::Secret`], redacted
//!   in logs), and verifies every command by reading the status back;
//! - [`evidence`] holds the verified outcomes: only a confirming status read constructs a
//!   [`VerifiedBlocked`];
//! - [`error`] classifies every failure as retryable or terminal.

pub mod client;
pub mod error;
pub mod evidence;
pub mod profile;
pub mod secret;
pub mod target;

pub use client::{StorageFirewall, StorageFwConfig};
pub use error::StorageFwError;
pub use evidence::{NodeStatus, VerifiedBlocked, VerifiedUnblocked, WriteAccess};
pub use profile::{NodeRef, Profile, RequestTemplate};
pub use secret::Secret;
pub use target::Target;
