//! `palisade-bridge`: the firmware-bridge daemon.
//!
//! The bridge runs on the management network and is the only holder of BMC, PDU and storage
//! firewall credentials. The cluster reaches it over mutual TLS with a narrow, versioned API
//! (`/v1`). Modules, from the outside in:
//! - [`server`]: TLS accept loop (client certificates required, SIGHUP reload, drain);
//! - [`api`]: the HTTP routes and the safety sequence of a mutating request;
//! - [`policy`]: which client identity may act on which target (deny by default);
//! - [`store`]: persisted fencing-token floors and idempotency records (fsync'd journal);
//! - [`audit`]: the append-only, fsync'd JSON-lines audit log;
//! - [`ratelimit`], [`metrics`]: per-client token buckets and Prometheus counters;
//! - [`executor`]: the trait through which the bridge touches devices, plus a recording fake;
//! - [`fence_executor`]: the real executor, on `palisade-fence` devices and fencing levels;
//! - [`config`], [`secret`], [`tls`]: the config file, credentials and TLS material;
//!
//! The `bridge://` client used by the controller and agents is `palisade_fence::bridge`
//! (it lives there because this crate depends on `palisade-fence`).

pub mod api;
pub mod audit;
pub mod bridge;
pub mod config;
pub mod executor;
pub mod fence_executor;
pub mod metrics;
pub mod policy;
pub mod ratelimit;
pub mod secret;
pub mod server;
pub mod store;
pub mod tls;

pub use bridge::{Bridge, BridgeError};

/// Renders an error with all its sources (`a: b: c`).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    palisade_fence::bridge::chain(e)
}
