//! Palisade's fencing agents: the hands that cut the power, and the proof that they did.
//!
//! - [`power`]: [`PowerState`] (on, off, unknown) and [`PowerAction`];
//! - [`secret`]: [`Secret`], a credential whose `Debug`/`Display` never show it;
//! - [`target`]: devices addressed by URL (`ipmi://user@host:port`,
//!   `snmp+pdu://host:port/outlet/N`, `redfish+https://user@host`), credentials passed separately;
//! - [`error`]: [`FenceError`], which says what failed and whether a retry can help;
//! - [`verify`]: the only code that can construct [`VerifiedOff`] evidence: the device
//!   reported power off after the command, within a bounded time;
//! - [`device`]: the [`PowerDevice`] trait and the enum-dispatched [`Device`];
//! - [`ipmi`]: the IPMI 2.0 RMCP+ backend (async UDP over the sans-IO `palisade-ipmi`);
//! - [`bridge`]: the `bridge://host:port/target-id` backend and the firmware-bridge client
//!   (mTLS with a pinned CA, fencing token and idempotency key on every mutating call);
//! - [`pdu`]: the switched-PDU backend over SNMP v1/v2c/v3, with vendor profiles as data;
//! - [`redfish`]: the Redfish backend (`redfish+https://`): ComputerSystem discovery,
//!   `ComputerSystem.Reset`, sessions, and TLS pinned to a CA or a certificate fingerprint;
//! - [`levels`]: Pacemaker-style fencing levels with a structured record of every attempt;
//! - [`cli`]: the ClusterLabs fence-agents compatible option parsing behind the
//!   `palisade-fence` binary.

pub mod bridge;
pub mod cli;
pub mod device;
pub mod error;
pub mod ipmi;
pub mod levels;
pub mod pdu;
pub mod planted;
pub mod power;
pub mod redfish;
pub mod secret;
mod spelling;
pub mod target;
pub mod verify;

pub use device::{Credentials, Device, DeviceOptions, PowerDevice};
pub use error::FenceError;
pub use power::{PowerAction, PowerState, ResetSent};
pub use secret::Secret;
pub use target::Target;
pub use verify::{VerifiedOff, VerifiedOn};
