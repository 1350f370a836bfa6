//! RMCP+ Open Session Request and Response (IPMI 2.0 section 13.17 and 13.18): the console
//! proposes one cipher suite and its session ID; the BMC accepts with its own session ID or
//! answers with an RMCP+ status code.

use crate::cipher_suite::{
    AuthAlgorithm, CipherSuite, ConfidentialityAlgorithm, IntegrityAlgorithm,
};
use crate::error::{le32, need, DecodeError};

/// Open Session Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenSessionRequest {
    /// Message tag echoed in the response.
    pub tag: u8,
    /// Requested maximum privilege (0 = highest the proposed algorithms allow).
    pub max_privilege: u8,
    /// The remote console's session ID (the BMC addresses us with it).
    pub console_session_id: u32,
    /// The proposed suite.
    pub suite: CipherSuite,
}

impl OpenSessionRequest {
    /// Encodes the 32-byte payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.tag, self.max_privilege, 0, 0];
        out.extend_from_slice(&self.console_session_id.to_le_bytes());
        for (kind, alg) in [
            (0u8, self.suite.auth as u8),
            (1, self.suite.integrity as u8),
            (2, self.suite.confidentiality as u8),
        ] {
            out.extend_from_slice(&[kind, 0, 0, 8, alg, 0, 0, 0]);
        }
        out
    }
}

/// Open Session Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenSessionResponse {
    /// Message tag.
    pub tag: u8,
    /// RMCP+ status code (0 = success; see [`status_text`]).
    pub status: u8,
    /// Maximum privilege the BMC grants.
    pub max_privilege: u8,
    /// Our session ID, echoed.
    pub console_session_id: u32,
    /// The BMC's session ID (0 on error).
    pub bmc_session_id: u32,
    /// The suite the BMC accepted (None on error).
    pub suite: Option<CipherSuite>,
}

impl OpenSessionResponse {
    /// Decodes the payload. An error status carries only the first 8 bytes.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        // Some BMCs (ipmi_sim) answer an error with only the tag and the status code.
        need("Open Session Response", b, 2)?;
        if b[1] != 0 && b.len() < 8 {
            return Ok(Self {
                tag: b[0],
                status: b[1],
                max_privilege: 0,
                console_session_id: 0,
                bmc_session_id: 0,
                suite: None,
            });
        }
        need("Open Session Response", b, 8)?;
        let mut resp = Self {
            tag: b[0],
            status: b[1],
            max_privilege: b[2] & 0x0f,
            console_session_id: le32(b, 4),
            bmc_session_id: 0,
            suite: None,
        };
        if resp.status != 0 {
            return Ok(resp);
        }
        need("Open Session Response", b, 36)?;
        resp.bmc_session_id = le32(b, 8);
        let alg = |at: usize, kind: u8| -> Result<u8, DecodeError> {
            if b[at] != kind {
                return Err(DecodeError::InvalidField {
                    what: "algorithm payload type",
                    value: b[at].into(),
                });
            }
            Ok(b[at + 4])
        };
        let auth = alg(12, 0)?;
        let integrity = alg(20, 1)?;
        let conf = alg(28, 2)?;
        let invalid = |what, value: u8| DecodeError::InvalidField {
            what,
            value: value.into(),
        };
        let suite = CipherSuite::from_algorithms(
            AuthAlgorithm::from_u8(auth).ok_or(invalid("auth algorithm", auth))?,
            IntegrityAlgorithm::from_u8(integrity)
                .ok_or(invalid("integrity algorithm", integrity))?,
            ConfidentialityAlgorithm::from_u8(conf)
                .ok_or(invalid("confidentiality algorithm", conf))?,
        )
        .ok_or(invalid("algorithm combination", auth))?;
        resp.suite = Some(suite);
        Ok(resp)
    }

    /// Encodes a response (used by test responders).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.tag, self.status, self.max_privilege, 0];
        out.extend_from_slice(&self.console_session_id.to_le_bytes());
        if let Some(s) = self.suite {
            out.extend_from_slice(&self.bmc_session_id.to_le_bytes());
            for (kind, alg) in [
                (0u8, s.auth as u8),
                (1, s.integrity as u8),
                (2, s.confidentiality as u8),
            ] {
                out.extend_from_slice(&[kind, 0, 0, 8, alg, 0, 0, 0]);
            }
        }
        out
    }
}

/// Decodes the request (used by test responders).
pub fn decode_request(b: &[u8]) -> Result<OpenSessionRequest, DecodeError> {
    need("Open Session Request", b, 32)?;
    let invalid = |value: u8| DecodeError::InvalidField {
        what: "proposed algorithms",
        value: value.into(),
    };
    let suite = CipherSuite::from_algorithms(
        AuthAlgorithm::from_u8(b[12]).ok_or(invalid(b[12]))?,
        IntegrityAlgorithm::from_u8(b[20]).ok_or(invalid(b[20]))?,
        ConfidentialityAlgorithm::from_u8(b[28]).ok_or(invalid(b[28]))?,
    )
    .ok_or(invalid(b[12]))?;
    Ok(OpenSessionRequest {
        tag: b[0],
        max_privilege: b[1],
        console_session_id: le32(b, 4),
        suite,
    })
}

/// Human-readable RMCP+ status code (IPMI 2.0 table 13-15).
pub fn status_text(code: u8) -> &'static str {
    match code {
        0x00 => "no errors",
        0x01 => "insufficient resources to create a session",
        0x02 => "invalid session ID",
        0x03 => "invalid payload type",
        0x04 => "invalid authentication algorithm",
        0x05 => "invalid integrity algorithm",
        0x06 => "no matching authentication payload",
        0x07 => "no matching integrity payload",
        0x08 => "inactive session ID",
        0x09 => "invalid role",
        0x0a => "unauthorized role or privilege level requested",
        0x0b => "insufficient resources to create a session at the requested role",
        0x0c => "invalid name length",
        0x0d => "unauthorized name",
        0x0e => "unauthorized GUID",
        0x0f => "invalid integrity check value",
        0x10 => "invalid confidentiality algorithm",
        0x11 => "no cipher suite match with proposed security algorithms",
        0x12 => "illegal or unrecognized parameter",
        _ => "unknown status code",
    }
}

/// Whether an Open Session status code means "the BMC does not support this suite" (so the
/// console should try the next one) rather than a hard refusal.
pub fn is_algorithm_rejection(code: u8) -> bool {
    matches!(code, 0x04 | 0x05 | 0x06 | 0x07 | 0x10 | 0x11)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_request_for_suite_17() {
        let req = OpenSessionRequest {
            tag: 0,
            max_privilege: 4,
            console_session_id: 0xa0a2a3a4,
            suite: CipherSuite::from_id(17).unwrap(),
        };
        assert_eq!(
            req.encode(),
            vec![
                0x00, 0x04, 0x00, 0x00, 0xa4, 0xa3, 0xa2, 0xa0, //
                0x00, 0x00, 0x00, 0x08, 0x03, 0x00, 0x00, 0x00, //
                0x01, 0x00, 0x00, 0x08, 0x04, 0x00, 0x00, 0x00, //
                0x02, 0x00, 0x00, 0x08, 0x01, 0x00, 0x00, 0x00,
            ]
        );
        assert_eq!(decode_request(&req.encode()).unwrap(), req);
    }

    #[test]
    fn decodes_success_and_error_responses() {
        let mut ok = vec![
            0x00, 0x00, 0x04, 0x00, 0xa4, 0xa3, 0xa2, 0xa0, 0x01, 0x02, 0x03, 0x04,
        ];
        ok.extend_from_slice(&[0x00, 0, 0, 8, 0x01, 0, 0, 0]);
        ok.extend_from_slice(&[0x01, 0, 0, 8, 0x01, 0, 0, 0]);
        ok.extend_from_slice(&[0x02, 0, 0, 8, 0x01, 0, 0, 0]);
        let r = OpenSessionResponse::decode(&ok).unwrap();
        assert_eq!(r.status, 0);
        assert_eq!(r.bmc_session_id, 0x04030201);
        assert_eq!(r.suite.unwrap().id, 3);
        assert_eq!(r.encode(), ok);
        let err = OpenSessionResponse::decode(&[0, 0x11, 0, 0, 0xa4, 0xa3, 0xa2, 0xa0]).unwrap();
        assert_eq!(err.status, 0x11);
        assert!(err.suite.is_none());
        assert!(is_algorithm_rejection(err.status));
        assert!(!is_algorithm_rejection(0x0d));
        assert!(OpenSessionResponse::decode(&ok[..20]).is_err());
        // ipmi_sim's short error answer: tag and status only.
        let short = OpenSessionResponse::decode(&[7, 0x04]).unwrap();
        assert_eq!((short.tag, short.status), (7, 0x04));
        assert!(OpenSessionResponse::decode(&[7]).is_err());
    }
}
