//! Palisade lab storage: a storage system that behaves like a real one, and the tools that
//! prove at-most-one on it.
//!
//! - [`protocol`] (sans-IO wire format) and [`framing`] define the data path;
//!   [`volume`] stores records durably (fsync before acknowledgement); [`state`] holds the
//!   storage firewall (blocks and per-volume grants) and persists it atomically;
//! - [`server`] runs the data path and the HTTPS admin API (`palisade-storage-server`);
//! - [`client`] and [`admin_client`] talk to it; [`record`] is what writers store and
//!   acknowledge (`palisade-writer`);
//! - [`checker`] is the pure at-most-one analysis (`palisade-checker`): split-brain, data
//!   loss and handover gap;
//! - [`attacher`] is the lab CSI external-attacher (`palisade-attacher`) and [`kube_objects`]
//!   builds the PV, PVC, CSIDriver and CSINode objects the attach-detach controller needs;
//! - [`pki`] issues throwaway certificates for tests and the bench.

pub mod admin_client;
pub mod attacher;
pub mod checker;
pub mod client;
pub mod error;
pub mod framing;
pub mod kube_objects;
pub mod netns;
pub mod pki;
pub mod protocol;
pub mod record;
pub mod server;
pub mod state;
pub mod volume;
