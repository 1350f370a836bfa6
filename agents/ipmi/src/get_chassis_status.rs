//! Get Chassis Status (Chassis 0x01, IPMI 2.0 section 28.2).

use crate::command::Command;
use crate::error::{need, DecodeError};
use crate::message::NETFN_CHASSIS;

/// The request (no data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetChassisStatus;

/// The parts of the answer a fencing agent needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChassisStatus {
    /// System power is on (byte 1 bit 0).
    pub power_on: bool,
    /// Power overload (byte 1 bit 1).
    pub power_overload: bool,
    /// Power fault (byte 1 bit 3).
    pub power_fault: bool,
    /// Power control fault (byte 1 bit 4).
    pub power_control_fault: bool,
    /// Last power event byte, raw.
    pub last_power_event: u8,
    /// Misc chassis state byte, raw.
    pub misc: u8,
}

impl Command for GetChassisStatus {
    type Output = ChassisStatus;
    const NETFN: u8 = NETFN_CHASSIS;
    const CMD: u8 = 0x01;

    fn request_data(&self) -> Vec<u8> {
        Vec::new()
    }

    fn parse(data: &[u8]) -> Result<ChassisStatus, DecodeError> {
        need("Get Chassis Status response", data, 3)?;
        Ok(ChassisStatus {
            power_on: data[0] & 0x01 != 0,
            power_overload: data[0] & 0x02 != 0,
            power_fault: data[0] & 0x08 != 0,
            power_control_fault: data[0] & 0x10 != 0,
            last_power_event: data[1],
            misc: data[2],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{parse_response, Outcome};
    use crate::message::Response;

    #[test]
    fn parses_on_and_off() {
        let on = GetChassisStatus::parse(&[0x61, 0x00, 0x40]).unwrap();
        assert!(on.power_on && !on.power_fault);
        let off = GetChassisStatus::parse(&[0x60, 0x10, 0x40, 0x00]).unwrap();
        assert!(!off.power_on);
        assert_eq!(off.last_power_event, 0x10);
        assert!(GetChassisStatus::parse(&[0x01]).is_err());
    }

    #[test]
    fn completion_code_is_reported_not_parsed() {
        let resp = Response {
            netfn: 1,
            cmd: 1,
            rq_seq: 0,
            completion_code: 0xd4,
            data: vec![],
        };
        assert_eq!(
            parse_response::<GetChassisStatus>(&resp).unwrap(),
            Outcome::CompletionCode(0xd4)
        );
    }
}
