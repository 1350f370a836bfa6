//! Chassis Control (Chassis 0x02, IPMI 2.0 section 28.3): power down, up, cycle, hard reset
//! and soft (ACPI) shutdown.

use crate::command::Command;
use crate::error::DecodeError;
use crate::message::NETFN_CHASSIS;

/// The control action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ChassisControl {
    /// Power down immediately (the fencing action).
    PowerDown = 0x00,
    /// Power up.
    PowerUp = 0x01,
    /// Power cycle.
    PowerCycle = 0x02,
    /// Hard reset.
    HardReset = 0x03,
    /// Pulse a diagnostic interrupt.
    DiagnosticInterrupt = 0x04,
    /// Soft shutdown through ACPI (not a fence: the OS may ignore it).
    SoftShutdown = 0x05,
}

impl Command for ChassisControl {
    type Output = ();
    const NETFN: u8 = NETFN_CHASSIS;
    const CMD: u8 = 0x02;

    fn request_data(&self) -> Vec<u8> {
        vec![*self as u8]
    }

    fn parse(_data: &[u8]) -> Result<(), DecodeError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_power_down_request() {
        // 20 00 e0 81 10 02 00 chk = -(81+10+02+00) = -(0x93) = 0x6d
        assert_eq!(
            ChassisControl::PowerDown.request(4).encode(),
            vec![0x20, 0x00, 0xe0, 0x81, 0x10, 0x02, 0x00, 0x6d]
        );
        assert_eq!(ChassisControl::SoftShutdown.request_data(), vec![5]);
    }
}
