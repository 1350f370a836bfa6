//! Close Session (App 0x3C, IPMI 2.0 section 22.19). Always sent, also after errors: BMCs
//! have few session slots and `ipmi_sim` locks out clients that leak them.

use crate::command::Command;
use crate::error::DecodeError;
use crate::message::NETFN_APP;

/// The request: the managed system (BMC) session ID to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseSession {
    /// The BMC's session ID.
    pub session_id: u32,
}

impl Command for CloseSession {
    type Output = ();
    const NETFN: u8 = NETFN_APP;
    const CMD: u8 = 0x3c;

    fn request_data(&self) -> Vec<u8> {
        self.session_id.to_le_bytes().to_vec()
    }

    fn parse(_data: &[u8]) -> Result<(), DecodeError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_request() {
        let req = CloseSession {
            session_id: 0x11223344,
        }
        .request(3);
        let mut expected = vec![0x20, 0x18, 0xc8, 0x81, 0x0c, 0x3c, 0x44, 0x33, 0x22, 0x11];
        expected.push(crate::message::checksum(&expected[3..]));
        assert_eq!(req.encode(), expected);
    }
}
