//! Get Channel Cipher Suites (App 0x54, IPMI 2.0 section 22.15): lists the RMCP+ cipher
//! suites a channel supports, 16 bytes of record data per call.

use crate::command::Command;
use crate::error::{need, DecodeError};
use crate::message::NETFN_APP;

/// Record start byte of a standard cipher suite record.
pub const STANDARD_RECORD: u8 = 0xc0;
/// Record start byte of an OEM cipher suite record (followed by a 3-byte IANA number).
pub const OEM_RECORD: u8 = 0xc1;
/// Record data carried by one full response.
pub const CHUNK: usize = 16;

/// One request: list the suites of `channel` for IPMI payloads, starting at chunk `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetChannelCipherSuites {
    /// Channel, normally 0x0E (current).
    pub channel: u8,
    /// Chunk index (0..=0x3f); each chunk is 16 bytes of record data.
    pub index: u8,
}

/// One chunk of record data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CipherSuiteChunk {
    /// Channel answered for.
    pub channel: u8,
    /// Up to 16 bytes of record data. Fewer than 16 means this was the last chunk.
    pub records: Vec<u8>,
}

impl Command for GetChannelCipherSuites {
    type Output = CipherSuiteChunk;
    const NETFN: u8 = NETFN_APP;
    const CMD: u8 = 0x54;

    fn request_data(&self) -> Vec<u8> {
        // Payload type 0 (IPMI); bit 7 of the index: "list algorithms by cipher suite".
        vec![self.channel & 0x0f, 0x00, 0x80 | (self.index & 0x3f)]
    }

    fn parse(data: &[u8]) -> Result<CipherSuiteChunk, DecodeError> {
        need("Get Channel Cipher Suites response", data, 1)?;
        if data.len() > 1 + CHUNK {
            return Err(DecodeError::InvalidField {
                what: "cipher suite record data length",
                value: data.len() as u32,
            });
        }
        Ok(CipherSuiteChunk {
            channel: data[0] & 0x0f,
            records: data[1..].to_vec(),
        })
    }
}

/// Extracts the suite IDs from the concatenated record data of all chunks.
///
/// Each record is a start byte (0xC0 standard, 0xC1 OEM + 3-byte IANA), the suite ID, then
/// algorithm bytes tagged 00b (auth), 01b (integrity) or 10b (confidentiality).
pub fn parse_suite_ids(records: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let mut ids = Vec::new();
    let mut i = 0;
    while i < records.len() {
        let start = records[i];
        let header = match start {
            STANDARD_RECORD => 2,
            OEM_RECORD => 5,
            other => {
                return Err(DecodeError::InvalidField {
                    what: "cipher suite record start",
                    value: other.into(),
                })
            }
        };
        need("cipher suite record", &records[i..], header)?;
        ids.push(records[i + 1]);
        i += header;
        // Skip algorithm bytes until the next record start (tags 11b mark a record start).
        while i < records.len() && records[i] & 0xc0 != 0xc0 {
            i += 1;
        }
    }
    Ok(ids)
}

/// Encodes standard records for the given suites (used by test responders).
pub fn encode_records(suites: &[crate::CipherSuite]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in suites {
        out.extend_from_slice(&[
            STANDARD_RECORD,
            s.id,
            s.auth as u8,
            0x40 | s.integrity as u8,
            0x80 | s.confidentiality as u8,
        ]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CipherSuite;

    #[test]
    fn golden_request() {
        let req = GetChannelCipherSuites {
            channel: 0x0e,
            index: 0,
        }
        .request(1);
        // 20 18 c8 81 04 54 | 0e 00 80 | chk = -(81+04+54+0e+00+80) = -(0x167 & 0xff = 0x67) = 0x99
        assert_eq!(
            req.encode(),
            vec![0x20, 0x18, 0xc8, 0x81, 0x04, 0x54, 0x0e, 0x00, 0x80, 0x99]
        );
    }

    #[test]
    fn parses_records_of_a_typical_bmc() {
        // Suites 3 and 17 as a Dell iDRAC lists them, and an OEM record.
        let records = [
            0xc0, 0x03, 0x01, 0x41, 0x81, 0xc0, 0x11, 0x03, 0x44, 0x81, 0xc1, 0x80, 0xa2, 0x02,
            0x00, 0x01, 0x41,
        ];
        assert_eq!(parse_suite_ids(&records).unwrap(), vec![3, 17, 0x80]);
        let suites: Vec<_> = [0, 1, 2]
            .iter()
            .map(|i| CipherSuite::from_id(*i).unwrap())
            .collect();
        let enc = encode_records(&suites);
        assert_eq!(&enc[..5], &[0xc0, 0x00, 0x00, 0x40, 0x80]);
        assert_eq!(parse_suite_ids(&enc).unwrap(), vec![0, 1, 2]);
        assert!(parse_suite_ids(&[0x12]).is_err());
        assert!(parse_suite_ids(&[0xc1, 3]).is_err());
    }
}
