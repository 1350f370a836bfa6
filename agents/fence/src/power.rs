//! Power states and actions.

use std::fmt;

/// What a device reports about the power of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off.
    Off,
    /// The device answered but the state is neither on nor off (e.g. an outlet rebooting, or
    /// outlets of one machine disagreeing).
    Unknown,
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::On => "on",
            Self::Off => "off",
            Self::Unknown => "unknown",
        })
    }
}

/// A power command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PowerAction {
    /// Power off (hard).
    Off,
    /// Power on.
    On,
    /// Off, verified, then on.
    Reboot,
}

impl fmt::Display for PowerAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Off => "off",
            Self::On => "on",
            Self::Reboot => "reboot",
        })
    }
}

/// A receipt for a warm reset ([`crate::PowerDevice::warm_reset`]): the device accepted a
/// restart command that does not turn the power off.
///
/// Guarantees: nothing. It is not evidence of anything: the machine may not have restarted
/// (firmware may ignore the command, or the host may hang in its reset). A fence that resets
/// instead of powering off is proven by another device (a verified storage block), and a
/// restart is proven only by the node itself (a new boot ID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetSent {
    /// The device, as named in logs (never a secret).
    pub device: String,
    /// The command sent, for example `chassis hard reset` or `ComputerSystem.Reset ForceRestart`.
    pub command: String,
}
