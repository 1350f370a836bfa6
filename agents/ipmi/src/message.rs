//! The IPMI LAN message carried in an IPMI payload (IPMI 2.0 section 13.8): responder and
//! requester addresses, NetFn/LUN, sequence number, command, data, and two checksums.

use crate::error::{need, DecodeError};

/// Slave address of the BMC.
pub const BMC_ADDR: u8 = 0x20;
/// Software ID of a remote console.
pub const REMOTE_CONSOLE_ADDR: u8 = 0x81;

/// NetFn Chassis (requests).
pub const NETFN_CHASSIS: u8 = 0x00;
/// NetFn Application (requests).
pub const NETFN_APP: u8 = 0x06;

/// Two's complement checksum: the byte that makes the sum of `bytes` plus itself zero.
pub fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |acc, b| acc.wrapping_add(*b))
        .wrapping_neg()
}

/// A request from the remote console to the BMC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Network function (even, request).
    pub netfn: u8,
    /// Command number.
    pub cmd: u8,
    /// Requester sequence number (6 bits), echoed in the response.
    pub rq_seq: u8,
    /// Request data.
    pub data: Vec<u8>,
}

impl Request {
    /// Encodes the request as an IPMI LAN message.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(7 + self.data.len());
        out.push(BMC_ADDR);
        out.push(self.netfn << 2);
        out.push(checksum(&out[0..2]));
        out.push(REMOTE_CONSOLE_ADDR);
        out.push((self.rq_seq & 0x3f) << 2);
        out.push(self.cmd);
        out.extend_from_slice(&self.data);
        let c = checksum(&out[3..]);
        out.push(c);
        out
    }

    /// Decodes a request (used by test responders).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        need("IPMI request", bytes, 7)?;
        check_sums(bytes)?;
        Ok(Self {
            netfn: bytes[1] >> 2,
            rq_seq: bytes[4] >> 2,
            cmd: bytes[5],
            data: bytes[6..bytes.len() - 1].to_vec(),
        })
    }
}

/// A response from the BMC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Network function of the response (request NetFn + 1).
    pub netfn: u8,
    /// Command number.
    pub cmd: u8,
    /// Requester sequence number echoed from the request.
    pub rq_seq: u8,
    /// Completion code (0 = success).
    pub completion_code: u8,
    /// Response data after the completion code.
    pub data: Vec<u8>,
}

fn check_sums(bytes: &[u8]) -> Result<(), DecodeError> {
    if checksum(&bytes[0..2]) != bytes[2] {
        return Err(DecodeError::BadChecksum { which: "header" });
    }
    if checksum(&bytes[3..bytes.len() - 1]) != bytes[bytes.len() - 1] {
        return Err(DecodeError::BadChecksum { which: "data" });
    }
    Ok(())
}

impl Response {
    /// Decodes an IPMI LAN response message.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        need("IPMI response", bytes, 8)?;
        check_sums(bytes)?;
        Ok(Self {
            netfn: bytes[1] >> 2,
            rq_seq: bytes[4] >> 2,
            cmd: bytes[5],
            completion_code: bytes[6],
            data: bytes[7..bytes.len() - 1].to_vec(),
        })
    }

    /// Encodes a response (used by test responders).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![REMOTE_CONSOLE_ADDR, self.netfn << 2];
        out.push(checksum(&out));
        out.push(BMC_ADDR);
        out.push((self.rq_seq & 0x3f) << 2);
        out.push(self.cmd);
        out.push(self.completion_code);
        out.extend_from_slice(&self.data);
        let c = checksum(&out[3..]);
        out.push(c);
        out
    }

    /// Whether this response answers `req` (NetFn + 1, same command, same sequence).
    pub fn answers(&self, req: &Request) -> bool {
        self.netfn == req.netfn | 1 && self.cmd == req.cmd && self.rq_seq == req.rq_seq & 0x3f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_chassis_status_request_golden_bytes() {
        // rsAddr 20, NetFn chassis (0) << 2 = 00, chk1 = -(0x20) = e0,
        // rqAddr 81, seq 5 << 2 = 14, cmd 01, chk2 = -(81+14+01) = 0x6a.
        let req = Request {
            netfn: NETFN_CHASSIS,
            cmd: 0x01,
            rq_seq: 5,
            data: vec![],
        };
        assert_eq!(req.encode(), vec![0x20, 0x00, 0xe0, 0x81, 0x14, 0x01, 0x6a]);
        assert_eq!(Request::decode(&req.encode()).unwrap(), req);
    }

    #[test]
    fn chassis_status_response_golden_bytes_decode() {
        // 81 04 7b 20 14 01 00 | 01 00 00 | chk
        let mut bytes = vec![0x81, 0x04, 0x7b, 0x20, 0x14, 0x01, 0x00, 0x01, 0x00, 0x00];
        bytes.push(checksum(&bytes[3..]));
        let resp = Response::decode(&bytes).unwrap();
        assert_eq!(resp.netfn, 0x01);
        assert_eq!(resp.rq_seq, 5);
        assert_eq!(resp.completion_code, 0);
        assert_eq!(resp.data, vec![1, 0, 0]);
        assert_eq!(resp.encode(), bytes);
        let req = Request {
            netfn: 0,
            cmd: 1,
            rq_seq: 5,
            data: vec![],
        };
        assert!(resp.answers(&req));
        let mut bad = bytes.clone();
        bad[8] ^= 0x40;
        assert_eq!(
            Response::decode(&bad),
            Err(DecodeError::BadChecksum { which: "data" })
        );
    }
}
