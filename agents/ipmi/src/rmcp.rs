//! The RMCP header (DMTF ASF 2.0 section 3.2.2.1) that starts every IPMI-over-LAN datagram.

use crate::error::{need, DecodeError};

/// RMCP version 1.0 is encoded as 0x06.
pub const RMCP_VERSION: u8 = 0x06;
/// Sequence number 0xFF: "no RMCP ACK".
pub const RMCP_NO_ACK: u8 = 0xff;
/// Message class IPMI (normal, not an ACK).
pub const CLASS_IPMI: u8 = 0x07;
/// Length of the header.
pub const HEADER_LEN: usize = 4;

/// The RMCP header used for all IPMI traffic: version 6, no ACK, class IPMI.
pub const IPMI_HEADER: [u8; HEADER_LEN] = [RMCP_VERSION, 0x00, RMCP_NO_ACK, CLASS_IPMI];

/// Checks the RMCP header and returns the bytes after it.
pub fn strip(datagram: &[u8]) -> Result<&[u8], DecodeError> {
    need("RMCP header", datagram, HEADER_LEN)?;
    if datagram[0] != RMCP_VERSION || datagram[3] & 0x1f != CLASS_IPMI {
        return Err(DecodeError::NotRmcpIpmi {
            version: datagram[0],
            class: datagram[3],
        });
    }
    Ok(&datagram[HEADER_LEN..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_a_valid_header_and_rejects_asf() {
        assert_eq!(strip(&[6, 0, 0xff, 7, 0xaa]).unwrap(), &[0xaa]);
        // ASF class (0x06) is not IPMI.
        assert!(matches!(
            strip(&[6, 0, 0xff, 6]),
            Err(DecodeError::NotRmcpIpmi { .. })
        ));
        assert!(matches!(strip(&[6, 0]), Err(DecodeError::Truncated { .. })));
    }
}
