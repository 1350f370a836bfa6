//! Session framing: the IPMI v1.5 header (used only for pre-session Get Channel
//! Authentication Capabilities) and the IPMI v2.0 RMCP+ header with its integrity trailer and
//! encrypted payloads (IPMI 2.0 section 13.6 and table 13-8).

use crate::crypto::{ct_eq, SessionKeys};
use crate::error::{le32, need, DecodeError};
use crate::rmcp;

/// Auth type byte of an unauthenticated IPMI v1.5 session header.
pub const AUTH_TYPE_NONE: u8 = 0x00;
/// Auth type byte that announces an RMCP+ (IPMI v2.0) session header.
pub const AUTH_TYPE_RMCP_PLUS: u8 = 0x06;
/// Next Header byte of the integrity trailer.
pub const NEXT_HEADER: u8 = 0x07;

/// RMCP+ payload types used by this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PayloadType {
    /// An IPMI message.
    Ipmi = 0x00,
    /// RMCP+ Open Session Request.
    OpenSessionRequest = 0x10,
    /// RMCP+ Open Session Response.
    OpenSessionResponse = 0x11,
    /// RAKP Message 1.
    Rakp1 = 0x12,
    /// RAKP Message 2.
    Rakp2 = 0x13,
    /// RAKP Message 3.
    Rakp3 = 0x14,
    /// RAKP Message 4.
    Rakp4 = 0x15,
}

impl PayloadType {
    /// Parses the low 6 bits of the payload type byte.
    pub fn from_u8(v: u8) -> Result<Self, DecodeError> {
        Ok(match v & 0x3f {
            0x00 => Self::Ipmi,
            0x10 => Self::OpenSessionRequest,
            0x11 => Self::OpenSessionResponse,
            0x12 => Self::Rakp1,
            0x13 => Self::Rakp2,
            0x14 => Self::Rakp3,
            0x15 => Self::Rakp4,
            other => return Err(DecodeError::UnknownPayloadType(other)),
        })
    }
}

/// A decoded datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Payload type (IPMI v1.5 packets are always [`PayloadType::Ipmi`]).
    pub payload_type: PayloadType,
    /// Whether the payload was encrypted on the wire.
    pub encrypted: bool,
    /// Whether the packet carried a verified integrity AuthCode.
    pub authenticated: bool,
    /// Session ID from the header (for RMCP+: the receiver's session ID).
    pub session_id: u32,
    /// Session sequence number.
    pub sequence: u32,
    /// The (decrypted) payload.
    pub payload: Vec<u8>,
}

/// Encodes an RMCP + IPMI v1.5 datagram with auth type none (pre-session).
pub fn encode_v15(session_id: u32, sequence: u32, message: &[u8]) -> Vec<u8> {
    let mut out = rmcp::IPMI_HEADER.to_vec();
    out.push(AUTH_TYPE_NONE);
    out.extend_from_slice(&sequence.to_le_bytes());
    out.extend_from_slice(&session_id.to_le_bytes());
    out.push(message.len() as u8);
    out.extend_from_slice(message);
    out
}

/// Encodes an RMCP + IPMI v2.0 datagram.
///
/// With `keys`, the payload is encrypted (if the suite has confidentiality) and an integrity
/// trailer is appended (if the suite has integrity). Without, the packet is sent in the clear,
/// as pre-session and RAKP messages are. `iv` is the fresh random IV for AES-CBC.
pub fn encode_v2(
    payload_type: PayloadType,
    session_id: u32,
    sequence: u32,
    payload: &[u8],
    keys: Option<&SessionKeys>,
    iv: [u8; 16],
) -> Vec<u8> {
    let (encrypt, authenticate) = match keys {
        Some(k) => (
            k.suite().confidentiality != crate::cipher_suite::ConfidentialityAlgorithm::None,
            k.suite().integrity != crate::cipher_suite::IntegrityAlgorithm::None,
        ),
        None => (false, false),
    };
    let body = match keys {
        Some(k) if encrypt => k.encrypt(payload, iv),
        _ => payload.to_vec(),
    };
    let mut out = rmcp::IPMI_HEADER.to_vec();
    out.push(AUTH_TYPE_RMCP_PLUS);
    out.push(
        payload_type as u8 | if encrypt { 0x80 } else { 0 } | if authenticate { 0x40 } else { 0 },
    );
    out.extend_from_slice(&session_id.to_le_bytes());
    out.extend_from_slice(&sequence.to_le_bytes());
    out.extend_from_slice(&(body.len() as u16).to_le_bytes());
    out.extend_from_slice(&body);
    if let (Some(k), true) = (keys, authenticate) {
        // Pad so that AuthType..NextHeader is a multiple of 4 bytes.
        let covered = out.len() - rmcp::HEADER_LEN;
        let pad = (4 - (covered + 2) % 4) % 4;
        out.extend(std::iter::repeat_n(0xff, pad));
        out.push(pad as u8);
        out.push(NEXT_HEADER);
        let code = k.auth_code(&out[rmcp::HEADER_LEN..]);
        out.extend_from_slice(&code);
    }
    out
}

/// Decodes a datagram.
///
/// `keys` are the session keys once a session is active. A packet that claims integrity or
/// encryption is rejected unless `keys` are given and the AuthCode verifies; with `keys` given,
/// an unauthenticated IPMI payload is rejected when the suite has integrity.
pub fn decode(datagram: &[u8], keys: Option<&SessionKeys>) -> Result<Packet, DecodeError> {
    let rest = rmcp::strip(datagram)?;
    need("session header", rest, 1)?;
    match rest[0] {
        AUTH_TYPE_NONE => decode_v15(rest),
        AUTH_TYPE_RMCP_PLUS => decode_v2(rest, keys),
        other => Err(DecodeError::UnsupportedAuthType(other)),
    }
}

fn decode_v15(rest: &[u8]) -> Result<Packet, DecodeError> {
    need("IPMI v1.5 session header", rest, 10)?;
    let sequence = le32(rest, 1);
    let session_id = le32(rest, 5);
    let len = rest[9] as usize;
    need("IPMI v1.5 message", &rest[10..], len)?;
    Ok(Packet {
        payload_type: PayloadType::Ipmi,
        encrypted: false,
        authenticated: false,
        session_id,
        sequence,
        payload: rest[10..10 + len].to_vec(),
    })
}

fn decode_v2(rest: &[u8], keys: Option<&SessionKeys>) -> Result<Packet, DecodeError> {
    need("RMCP+ session header", rest, 12)?;
    let type_byte = rest[1];
    let encrypted = type_byte & 0x80 != 0;
    let authenticated = type_byte & 0x40 != 0;
    let payload_type = PayloadType::from_u8(type_byte)?;
    let session_id = le32(rest, 2);
    let sequence = le32(rest, 6);
    let len = u16::from_le_bytes([rest[10], rest[11]]) as usize;
    need("RMCP+ payload", &rest[12..], len)?;
    let body = &rest[12..12 + len];
    let suite = keys.map(|k| k.suite());
    if authenticated {
        let k = keys.ok_or(DecodeError::UnexpectedProtection(
            "authenticated packet outside a session",
        ))?;
        let n = k.suite().integrity.auth_code_len();
        if n == 0 {
            return Err(DecodeError::UnexpectedProtection(
                "authenticated packet but suite has no integrity",
            ));
        }
        let trailer = &rest[12 + len..];
        if trailer.len() < n + 2 {
            return Err(DecodeError::Integrity("trailer too short"));
        }
        let code_at = rest.len() - n;
        if rest[code_at - 1] != NEXT_HEADER {
            return Err(DecodeError::Integrity("next header"));
        }
        let pad = rest[code_at - 2] as usize;
        if 12 + len + pad + 2 != code_at || rest[12 + len..code_at - 2].iter().any(|b| *b != 0xff) {
            return Err(DecodeError::Integrity("pad"));
        }
        if !ct_eq(&k.auth_code(&rest[..code_at]), &rest[code_at..]) {
            return Err(DecodeError::Integrity("AuthCode mismatch"));
        }
    } else if let Some(s) = suite {
        if payload_type == PayloadType::Ipmi
            && s.integrity != crate::cipher_suite::IntegrityAlgorithm::None
        {
            return Err(DecodeError::UnexpectedProtection(
                "unauthenticated IPMI payload inside an integrity-protected session",
            ));
        }
    }
    let payload = if encrypted {
        let k = keys.ok_or(DecodeError::UnexpectedProtection(
            "encrypted packet outside a session",
        ))?;
        k.decrypt(body)?
    } else {
        body.to_vec()
    };
    Ok(Packet {
        payload_type,
        encrypted,
        authenticated,
        session_id,
        sequence,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cipher_suite::CipherSuite;

    #[test]
    fn v15_get_channel_auth_capabilities_golden_bytes() {
        // ipmitool's first packet: RMCP, auth none, seq 0, id 0, len 9, message.
        let msg = [0x20, 0x18, 0xc8, 0x81, 0x00, 0x38, 0x8e, 0x04, 0xb5];
        let bytes = encode_v15(0, 0, &msg);
        let mut expected = vec![0x06, 0x00, 0xff, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x09];
        expected.extend_from_slice(&msg);
        assert_eq!(bytes, expected);
        let p = decode(&bytes, None).unwrap();
        assert_eq!(p.payload, msg);
        assert_eq!(p.payload_type, PayloadType::Ipmi);
    }

    #[test]
    fn v2_cleartext_golden_bytes() {
        let bytes = encode_v2(
            PayloadType::OpenSessionRequest,
            0,
            0,
            &[1, 2, 3],
            None,
            [0; 16],
        );
        assert_eq!(
            bytes,
            vec![0x06, 0x00, 0xff, 0x07, 0x06, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0x03, 0x00, 1, 2, 3]
        );
        let p = decode(&bytes, None).unwrap();
        assert_eq!(p.payload_type, PayloadType::OpenSessionRequest);
        assert_eq!(p.payload, vec![1, 2, 3]);
    }

    #[test]
    fn v2_protected_layout_and_round_trip() {
        let keys = SessionKeys::derive(CipherSuite::from_id(3).unwrap(), &[0x55; 20]);
        let payload = [0x20, 0x00, 0xe0, 0x81, 0x14, 0x01, 0x6a];
        let bytes = encode_v2(
            PayloadType::Ipmi,
            0x0a0b0c0d,
            7,
            &payload,
            Some(&keys),
            [3; 16],
        );
        // Header: auth type 6, payload type 0xC0 (encrypted + authenticated), id LE, seq LE.
        assert_eq!(&bytes[4..12], &[0x06, 0xc0, 0x0d, 0x0c, 0x0b, 0x0a, 7, 0]);
        // Encrypted length: IV 16 + one block 16.
        assert_eq!(u16::from_le_bytes([bytes[14], bytes[15]]), 32);
        // 12 + 32 = 44; pad to (44 + pad + 2) % 4 == 0 -> pad 2.
        assert_eq!(&bytes[16 + 32..16 + 32 + 4], &[0xff, 0xff, 0x02, 0x07]);
        assert_eq!(bytes.len(), 16 + 32 + 4 + 12);
        assert_eq!(
            &bytes[bytes.len() - 12..],
            &keys.auth_code(&bytes[4..bytes.len() - 12])[..]
        );
        let p = decode(&bytes, Some(&keys)).unwrap();
        assert!(p.encrypted && p.authenticated);
        assert_eq!(p.payload, payload);
        assert_eq!(p.sequence, 7);
        // Flip one bit of the ciphertext: the AuthCode no longer verifies.
        let mut bad = bytes.clone();
        bad[30] ^= 1;
        assert_eq!(
            decode(&bad, Some(&keys)),
            Err(DecodeError::Integrity("AuthCode mismatch"))
        );
        // Other keys: rejected.
        let other = SessionKeys::derive(CipherSuite::from_id(3).unwrap(), &[0x56; 20]);
        assert!(decode(&bytes, Some(&other)).is_err());
        // No keys: rejected.
        assert!(decode(&bytes, None).is_err());
    }
}
