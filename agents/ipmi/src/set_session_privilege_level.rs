//! Set Session Privilege Level (App 0x3B, IPMI 2.0 section 22.18). A session starts at User
//! level; Chassis Control needs Operator or Administrator, so the agent raises it explicitly.

use crate::command::Command;
use crate::error::{need, DecodeError};
use crate::message::NETFN_APP;
use crate::Privilege;

/// The request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetSessionPrivilegeLevel(pub Privilege);

impl Command for SetSessionPrivilegeLevel {
    /// The new privilege level the BMC granted.
    type Output = u8;
    const NETFN: u8 = NETFN_APP;
    const CMD: u8 = 0x3b;

    fn request_data(&self) -> Vec<u8> {
        vec![self.0 as u8]
    }

    fn parse(data: &[u8]) -> Result<u8, DecodeError> {
        need("Set Session Privilege Level response", data, 1)?;
        Ok(data[0] & 0x0f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_request() {
        let req = SetSessionPrivilegeLevel(Privilege::Administrator).request(2);
        // chk2 = -(81 + 08 + 3b + 04) = -(0xc8) = 0x38
        assert_eq!(
            req.encode(),
            vec![0x20, 0x18, 0xc8, 0x81, 0x08, 0x3b, 0x04, 0x38]
        );
        assert_eq!(SetSessionPrivilegeLevel::parse(&[0x04]).unwrap(), 4);
    }
}
