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
