//! RAKP messages 1 to 4 (IPMI 2.0 sections 13.20 to 13.31) and the [`Handshake`] state machine
//! that drives Open Session and RAKP to an established session with derived keys.
//!
//! The key exchange, with SIDm/SIDc the console/BMC session IDs, Rm/Rc the console/BMC
//! random numbers, ROLEm the requested role byte and Kuid the user key:
//!
//! - RAKP2 auth code = HMAC(Kuid, SIDm | SIDc | Rm | Rc | GUIDc | ROLEm | ULENm | UNAMEm)
//! - RAKP3 auth code = HMAC(Kuid, Rc | SIDm | ROLEm | ULENm | UNAMEm)
//! - SIK = HMAC(Kuid, Rm | Rc | ROLEm | ULENm | UNAMEm)
//! - RAKP4 ICV = HMAC(SIK, Rm | SIDc | GUIDc), truncated to 12 (SHA1) or 16 (SHA256) bytes

use crate::cipher_suite::{AuthAlgorithm, CipherSuite};
use crate::crypto::{ct_eq, rakp_hmac, user_key, SessionKeys};
use crate::error::{le32, need, DecodeError};
use crate::open_session::{status_text, OpenSessionRequest, OpenSessionResponse};
use crate::Privilege;

/// Maximum user name length in RAKP1.
pub const MAX_USERNAME_LEN: usize = 16;
/// Role bit 4: name-only lookup (the BMC finds the user by name, not name + privilege).
pub const NAME_ONLY_LOOKUP: u8 = 0x10;

/// Why a session could not be established.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The BMC sent something undecodable.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The BMC answered a step with a non-zero RMCP+ status code.
    #[error("{stage}: BMC returned RMCP+ status {code:#04x} ({})", status_text(*code))]
    Status {
        /// Which message carried the status.
        stage: &'static str,
        /// The RMCP+ status code.
        code: u8,
    },
    /// A key exchange auth code did not verify: wrong password (RAKP2) or a broken BMC (RAKP4).
    #[error("{stage}: key exchange auth code mismatch (wrong password?)")]
    AuthCodeMismatch {
        /// Which message failed to verify.
        stage: &'static str,
    },
    /// The BMC echoed a session ID or tag that is not ours.
    #[error("{0}: session ID or message tag mismatch")]
    Mismatch(&'static str),
    /// The BMC accepted Open Session with the algorithms of another suite than the one
    /// proposed, instead of refusing it (pyghmi-based BMCs answer with suite 3 whatever is
    /// asked), and the caller does not allow that suite.
    #[error(
        "Open Session: proposed cipher suite {proposed}, the BMC answered with the algorithms of {} instead of refusing",
        match answered { Some(id) => format!("suite {id}"), None => "no known suite".to_string() }
    )]
    SuiteSubstituted {
        /// The suite we proposed.
        proposed: u8,
        /// The suite whose algorithms the BMC chose, when they form a known suite.
        answered: Option<u8>,
    },
    /// The user name is longer than 16 bytes.
    #[error("user name longer than {MAX_USERNAME_LEN} bytes")]
    UsernameTooLong,
}

impl HandshakeError {
    /// True if the BMC refused the credentials (wrong user, wrong password, wrong role).
    pub fn is_auth_refusal(&self) -> bool {
        match self {
            Self::AuthCodeMismatch { stage } => *stage == "RAKP2",
            Self::Status { stage, code } => {
                *stage != "Open Session" && matches!(code, 0x09 | 0x0a | 0x0c | 0x0d | 0x0f)
                    || *stage == "Open Session" && *code == 0x0a
            }
            _ => false,
        }
    }
}

/// RAKP2 key exchange auth code, as the BMC computes it.
#[allow(clippy::too_many_arguments)]
pub fn rakp2_auth_code(
    alg: AuthAlgorithm,
    kuid: &[u8],
    console_sid: u32,
    bmc_sid: u32,
    rm: &[u8; 16],
    rc: &[u8; 16],
    guid: &[u8; 16],
    role: u8,
    username: &[u8],
) -> Vec<u8> {
    rakp_hmac(
        alg,
        kuid,
        &[
            &console_sid.to_le_bytes(),
            &bmc_sid.to_le_bytes(),
            rm,
            rc,
            guid,
            &[role, username.len() as u8],
            username,
        ],
    )
}

/// RAKP3 key exchange auth code, as the console computes it.
pub fn rakp3_auth_code(
    alg: AuthAlgorithm,
    kuid: &[u8],
    rc: &[u8; 16],
    console_sid: u32,
    role: u8,
    username: &[u8],
) -> Vec<u8> {
    rakp_hmac(
        alg,
        kuid,
        &[
            rc,
            &console_sid.to_le_bytes(),
            &[role, username.len() as u8],
            username,
        ],
    )
}

/// The Session Integrity Key.
pub fn sik(
    alg: AuthAlgorithm,
    kg: &[u8],
    rm: &[u8; 16],
    rc: &[u8; 16],
    role: u8,
    username: &[u8],
) -> Vec<u8> {
    rakp_hmac(alg, kg, &[rm, rc, &[role, username.len() as u8], username])
}

/// RAKP4 integrity check value.
pub fn rakp4_icv(
    alg: AuthAlgorithm,
    sik: &[u8],
    rm: &[u8; 16],
    bmc_sid: u32,
    guid: &[u8; 16],
) -> Vec<u8> {
    let mut v = rakp_hmac(alg, sik, &[rm, &bmc_sid.to_le_bytes(), guid]);
    v.truncate(match alg {
        AuthAlgorithm::None => 0,
        AuthAlgorithm::HmacSha1 => 12,
        AuthAlgorithm::HmacSha256 => 16,
    });
    v
}

/// RAKP Message 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rakp1 {
    /// Message tag.
    pub tag: u8,
    /// The BMC's session ID.
    pub bmc_session_id: u32,
    /// Console random number Rm.
    pub console_random: [u8; 16],
    /// Requested role byte (privilege | lookup bit).
    pub role: u8,
    /// User name.
    pub username: Vec<u8>,
}

impl Rakp1 {
    /// Encodes the payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.tag, 0, 0, 0];
        out.extend_from_slice(&self.bmc_session_id.to_le_bytes());
        out.extend_from_slice(&self.console_random);
        out.extend_from_slice(&[self.role, 0, 0, self.username.len() as u8]);
        out.extend_from_slice(&self.username);
        out
    }

    /// Decodes the payload (used by test responders).
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("RAKP1", b, 28)?;
        let len = b[27] as usize;
        need("RAKP1 user name", &b[28..], len)?;
        Ok(Self {
            tag: b[0],
            bmc_session_id: le32(b, 4),
            console_random: b[8..24].try_into().expect("16 bytes"),
            role: b[24],
            username: b[28..28 + len].to_vec(),
        })
    }
}

/// RAKP Message 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rakp2 {
    /// Message tag.
    pub tag: u8,
    /// RMCP+ status code.
    pub status: u8,
    /// The console's session ID.
    pub console_session_id: u32,
    /// BMC random number Rc.
    pub bmc_random: [u8; 16],
    /// BMC GUID.
    pub guid: [u8; 16],
    /// Key exchange auth code.
    pub auth_code: Vec<u8>,
}

impl Rakp2 {
    /// Decodes the payload. An error status carries only the first 8 bytes.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("RAKP2", b, 2)?;
        if b[1] != 0 && b.len() < 8 {
            return Ok(Self {
                tag: b[0],
                status: b[1],
                console_session_id: 0,
                bmc_random: [0; 16],
                guid: [0; 16],
                auth_code: Vec::new(),
            });
        }
        need("RAKP2", b, 8)?;
        let mut r = Self {
            tag: b[0],
            status: b[1],
            console_session_id: le32(b, 4),
            bmc_random: [0; 16],
            guid: [0; 16],
            auth_code: Vec::new(),
        };
        if r.status == 0 {
            need("RAKP2", b, 40)?;
            r.bmc_random = b[8..24].try_into().expect("16 bytes");
            r.guid = b[24..40].try_into().expect("16 bytes");
            r.auth_code = b[40..].to_vec();
        }
        Ok(r)
    }

    /// Encodes the payload (used by test responders).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.tag, self.status, 0, 0];
        out.extend_from_slice(&self.console_session_id.to_le_bytes());
        if self.status == 0 {
            out.extend_from_slice(&self.bmc_random);
            out.extend_from_slice(&self.guid);
            out.extend_from_slice(&self.auth_code);
        }
        out
    }
}

/// RAKP Message 3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rakp3 {
    /// Message tag.
    pub tag: u8,
    /// RMCP+ status code (non-zero tells the BMC to abandon the session).
    pub status: u8,
    /// The BMC's session ID.
    pub bmc_session_id: u32,
    /// Key exchange auth code.
    pub auth_code: Vec<u8>,
}

impl Rakp3 {
    /// Encodes the payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.tag, self.status, 0, 0];
        out.extend_from_slice(&self.bmc_session_id.to_le_bytes());
        out.extend_from_slice(&self.auth_code);
        out
    }

    /// Decodes the payload (used by test responders).
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("RAKP3", b, 8)?;
        Ok(Self {
            tag: b[0],
            status: b[1],
            bmc_session_id: le32(b, 4),
            auth_code: b[8..].to_vec(),
        })
    }
}

/// RAKP Message 4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rakp4 {
    /// Message tag.
    pub tag: u8,
    /// RMCP+ status code.
    pub status: u8,
    /// The console's session ID.
    pub console_session_id: u32,
    /// Integrity check value.
    pub icv: Vec<u8>,
}

impl Rakp4 {
    /// Decodes the payload.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("RAKP4", b, 2)?;
        if b[1] != 0 && b.len() < 8 {
            return Ok(Self {
                tag: b[0],
                status: b[1],
                console_session_id: 0,
                icv: Vec::new(),
            });
        }
        need("RAKP4", b, 8)?;
        Ok(Self {
            tag: b[0],
            status: b[1],
            console_session_id: le32(b, 4),
            icv: b[8..].to_vec(),
        })
    }

    /// Encodes the payload (used by test responders).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.tag, self.status, 0, 0];
        out.extend_from_slice(&self.console_session_id.to_le_bytes());
        out.extend_from_slice(&self.icv);
        out
    }
}

/// An established session: IDs and keys.
#[derive(Debug, Clone)]
pub struct Established {
    /// Our session ID (the BMC puts it in the packets it sends).
    pub console_session_id: u32,
    /// The BMC's session ID (we put it in the packets we send).
    pub bmc_session_id: u32,
    /// Keys for integrity and confidentiality.
    pub keys: SessionKeys,
}

/// Drives Open Session and RAKP 1 to 4 without I/O.
///
/// Usage: send [`Handshake::open_session_request`], feed the answer to
/// [`Handshake::accept_open_session`], send [`Handshake::rakp1`], feed RAKP2 to
/// [`Handshake::accept_rakp2`] which returns RAKP3 to send, and feed RAKP4 to
/// [`Handshake::accept_rakp4`] which returns the [`Established`] session.
pub struct Handshake {
    suite: CipherSuite,
    tag: u8,
    username: Vec<u8>,
    kuid: [u8; 20],
    role: u8,
    console_sid: u32,
    bmc_sid: u32,
    rm: [u8; 16],
    rc: [u8; 16],
    guid: [u8; 16],
    sik: Vec<u8>,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("suite", &self.suite.id)
            .field("console_sid", &self.console_sid)
            .field("bmc_sid", &self.bmc_sid)
            .finish_non_exhaustive()
    }
}

impl Handshake {
    /// Starts a handshake. `console_random` (Rm) and `console_session_id` must come from a
    /// good random source; `tag` is echoed by the BMC in every answer.
    pub fn new(
        suite: CipherSuite,
        username: &[u8],
        password: &[u8],
        privilege: Privilege,
        console_session_id: u32,
        console_random: [u8; 16],
        tag: u8,
    ) -> Result<Self, HandshakeError> {
        if username.len() > MAX_USERNAME_LEN {
            return Err(HandshakeError::UsernameTooLong);
        }
        Ok(Self {
            suite,
            tag,
            username: username.to_vec(),
            kuid: user_key(password),
            role: privilege as u8 | NAME_ONLY_LOOKUP,
            console_sid: console_session_id,
            bmc_sid: 0,
            rm: console_random,
            rc: [0; 16],
            guid: [0; 16],
            sik: Vec::new(),
        })
    }

    /// The suite being negotiated.
    pub fn suite(&self) -> CipherSuite {
        self.suite
    }

    /// The BMC's session ID once Open Session succeeded (0 before).
    pub fn bmc_session_id(&self) -> u32 {
        self.bmc_sid
    }

    /// The Open Session Request payload.
    pub fn open_session_request(&self) -> Vec<u8> {
        OpenSessionRequest {
            tag: self.tag,
            max_privilege: self.role & 0x0f,
            console_session_id: self.console_sid,
            suite: self.suite,
        }
        .encode()
    }

    /// Accepts the Open Session Response payload. An answer with another suite's algorithms
    /// is a [`HandshakeError::SuiteSubstituted`].
    pub fn accept_open_session(&mut self, payload: &[u8]) -> Result<(), HandshakeError> {
        self.accept_open_session_allowing(payload, &|_| false)
    }

    /// Like [`Handshake::accept_open_session`], but when the BMC answers with the algorithms
    /// of another suite that `allow` accepts, the handshake continues with that suite (the
    /// keys, auth codes and [`Established`] are then those of the answered suite).
    ///
    /// Guarantees: a suite `allow` refuses is never used; the substitution is an error.
    pub fn accept_open_session_allowing(
        &mut self,
        payload: &[u8],
        allow: &dyn Fn(CipherSuite) -> bool,
    ) -> Result<(), HandshakeError> {
        let r = match OpenSessionResponse::decode(payload) {
            // Valid framing, but algorithms that form no known suite.
            Err(DecodeError::InvalidField {
                what: "algorithm combination",
                ..
            }) => {
                return Err(HandshakeError::SuiteSubstituted {
                    proposed: self.suite.id,
                    answered: None,
                })
            }
            r => r?,
        };
        if r.tag != self.tag || r.status == 0 && r.console_session_id != self.console_sid {
            return Err(HandshakeError::Mismatch("Open Session"));
        }
        if r.status != 0 {
            return Err(HandshakeError::Status {
                stage: "Open Session",
                code: r.status,
            });
        }
        match r.suite {
            Some(s) if s == self.suite => {}
            Some(s) if allow(s) => self.suite = s,
            answered => {
                return Err(HandshakeError::SuiteSubstituted {
                    proposed: self.suite.id,
                    answered: answered.map(|s| s.id),
                })
            }
        }
        self.bmc_sid = r.bmc_session_id;
        Ok(())
    }

    /// The RAKP1 payload.
    pub fn rakp1(&self) -> Vec<u8> {
        Rakp1 {
            tag: self.tag,
            bmc_session_id: self.bmc_sid,
            console_random: self.rm,
            role: self.role,
            username: self.username.clone(),
        }
        .encode()
    }

    /// Accepts RAKP2 and returns the RAKP3 payload to send.
    ///
    /// On an auth code mismatch (wrong password) the caller should send
    /// [`Handshake::rakp3_abort`] so the BMC frees the session slot.
    pub fn accept_rakp2(&mut self, payload: &[u8]) -> Result<Vec<u8>, HandshakeError> {
        let r = Rakp2::decode(payload)?;
        self.check_reply("RAKP2", r.tag, r.status, r.console_session_id)?;
        let expected = rakp2_auth_code(
            self.suite.auth,
            &self.kuid,
            self.console_sid,
            self.bmc_sid,
            &self.rm,
            &r.bmc_random,
            &r.guid,
            self.role,
            &self.username,
        );
        if !ct_eq(&expected, &r.auth_code) {
            return Err(HandshakeError::AuthCodeMismatch { stage: "RAKP2" });
        }
        self.rc = r.bmc_random;
        self.guid = r.guid;
        self.sik = sik(
            self.suite.auth,
            &self.kuid,
            &self.rm,
            &self.rc,
            self.role,
            &self.username,
        );
        Ok(Rakp3 {
            tag: self.tag,
            status: 0,
            bmc_session_id: self.bmc_sid,
            auth_code: rakp3_auth_code(
                self.suite.auth,
                &self.kuid,
                &self.rc,
                self.console_sid,
                self.role,
                &self.username,
            ),
        }
        .encode())
    }

    /// A RAKP3 carrying status 0x0F (invalid integrity check value): tells the BMC to drop the
    /// half-open session after a failed RAKP2 verification.
    pub fn rakp3_abort(&self) -> Vec<u8> {
        Rakp3 {
            tag: self.tag,
            status: 0x0f,
            bmc_session_id: self.bmc_sid,
            auth_code: Vec::new(),
        }
        .encode()
    }

    /// Checks a RAKP reply's header against this handshake: the tag must match, a successful
    /// reply must name our console session, and a non-zero status is the BMC's refusal.
    fn check_reply(
        &self,
        stage: &'static str,
        tag: u8,
        status: u8,
        console_session_id: u32,
    ) -> Result<(), HandshakeError> {
        if tag != self.tag || status == 0 && console_session_id != self.console_sid {
            return Err(HandshakeError::Mismatch(stage));
        }
        if status != 0 {
            return Err(HandshakeError::Status {
                stage,
                code: status,
            });
        }
        Ok(())
    }

    /// Accepts RAKP4 and returns the established session.
    pub fn accept_rakp4(self, payload: &[u8]) -> Result<Established, HandshakeError> {
        let r = Rakp4::decode(payload)?;
        self.check_reply("RAKP4", r.tag, r.status, r.console_session_id)?;
        let expected = rakp4_icv(
            self.suite.auth,
            &self.sik,
            &self.rm,
            self.bmc_sid,
            &self.guid,
        );
        if !ct_eq(&expected, &r.icv) {
            return Err(HandshakeError::AuthCodeMismatch { stage: "RAKP4" });
        }
        Ok(Established {
            console_session_id: self.console_sid,
            bmc_session_id: self.bmc_sid,
            keys: SessionKeys::derive(self.suite, &self.sik),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::hmac_sha1;

    #[test]
    fn rakp1_golden_bytes() {
        let r = Rakp1 {
            tag: 1,
            bmc_session_id: 0x01020304,
            console_random: [0xaa; 16],
            role: 0x14,
            username: b"admin".to_vec(),
        };
        let mut expected = vec![1, 0, 0, 0, 4, 3, 2, 1];
        expected.extend_from_slice(&[0xaa; 16]);
        expected.extend_from_slice(&[0x14, 0, 0, 5, b'a', b'd', b'm', b'i', b'n']);
        assert_eq!(r.encode(), expected);
        assert_eq!(Rakp1::decode(&expected).unwrap(), r);
    }

    #[test]
    fn rakp2_auth_code_is_hmac_sha1_over_the_documented_fields() {
        let kuid = user_key(b"secret");
        let got = rakp2_auth_code(
            AuthAlgorithm::HmacSha1,
            &kuid,
            0x11111111,
            0x22222222,
            &[1; 16],
            &[2; 16],
            &[3; 16],
            0x14,
            b"ab",
        );
        let mut data = vec![0x11; 4];
        data.extend_from_slice(&[0x22; 4]);
        data.extend_from_slice(&[1; 16]);
        data.extend_from_slice(&[2; 16]);
        data.extend_from_slice(&[3; 16]);
        data.extend_from_slice(&[0x14, 2, b'a', b'b']);
        let mut key = b"secret".to_vec();
        key.resize(20, 0);
        assert_eq!(got, hmac_sha1(&key, &[&data]).to_vec());
    }

    /// Plays the BMC side with the public helper functions.
    fn bmc_side(suite: CipherSuite, password: &[u8]) -> Result<Established, HandshakeError> {
        bmc_side_answering(suite, suite, password, &|_| false)
    }

    /// Plays a BMC that accepts Open Session with `answered`'s algorithms whatever was
    /// `proposed`, and then uses `answered`.
    fn bmc_side_answering(
        proposed: CipherSuite,
        answered: CipherSuite,
        password: &[u8],
        allow: &dyn Fn(CipherSuite) -> bool,
    ) -> Result<Established, HandshakeError> {
        let suite = answered;
        let mut hs = Handshake::new(
            proposed,
            b"admin",
            b"secret",
            Privilege::Administrator,
            0xc0c0c0c0,
            [7; 16],
            9,
        )?;
        let req = crate::open_session::decode_request(&hs.open_session_request())?;
        let resp = OpenSessionResponse {
            tag: req.tag,
            status: 0,
            max_privilege: 4,
            console_session_id: req.console_session_id,
            bmc_session_id: 0xb0b0b0b0,
            suite: Some(answered),
        };
        hs.accept_open_session_allowing(&resp.encode(), allow)?;
        let r1 = Rakp1::decode(&hs.rakp1())?;
        assert_eq!(r1.role, 0x14);
        let kuid = user_key(password);
        let (rc, guid) = ([5u8; 16], [6u8; 16]);
        let r2 = Rakp2 {
            tag: r1.tag,
            status: 0,
            console_session_id: 0xc0c0c0c0,
            bmc_random: rc,
            guid,
            auth_code: rakp2_auth_code(
                suite.auth,
                &kuid,
                0xc0c0c0c0,
                0xb0b0b0b0,
                &r1.console_random,
                &rc,
                &guid,
                r1.role,
                &r1.username,
            ),
        };
        let r3 = Rakp3::decode(&hs.accept_rakp2(&r2.encode())?)?;
        assert_eq!(
            r3.auth_code,
            rakp3_auth_code(suite.auth, &kuid, &rc, 0xc0c0c0c0, r1.role, &r1.username)
        );
        let sik = sik(
            suite.auth,
            &kuid,
            &r1.console_random,
            &rc,
            r1.role,
            &r1.username,
        );
        let r4 = Rakp4 {
            tag: r1.tag,
            status: 0,
            console_session_id: 0xc0c0c0c0,
            icv: rakp4_icv(suite.auth, &sik, &r1.console_random, 0xb0b0b0b0, &guid),
        };
        hs.accept_rakp4(&r4.encode())
    }

    #[test]
    fn full_handshake_for_suites_3_and_17() {
        for id in [3, 17] {
            let s = CipherSuite::from_id(id).unwrap();
            let est = bmc_side(s, b"secret").unwrap();
            assert_eq!(est.bmc_session_id, 0xb0b0b0b0);
            assert_eq!(est.keys.suite().id, id);
        }
    }

    #[test]
    fn wrong_password_is_detected_at_rakp2_as_auth_refusal() {
        let err = bmc_side(CipherSuite::from_id(3).unwrap(), b"other").unwrap_err();
        assert_eq!(err, HandshakeError::AuthCodeMismatch { stage: "RAKP2" });
        assert!(err.is_auth_refusal());
    }

    #[test]
    fn unauthorized_name_status_is_auth_refusal() {
        let mut hs = Handshake::new(
            CipherSuite::from_id(3).unwrap(),
            b"nobody",
            b"x",
            Privilege::Administrator,
            1,
            [0; 16],
            0,
        )
        .unwrap();
        let err = hs.accept_rakp2(&[0, 0x0d, 0, 0, 1, 0, 0, 0]).unwrap_err();
        assert!(err.is_auth_refusal(), "{err}");
        assert!(Handshake::new(
            CipherSuite::from_id(3).unwrap(),
            &[b'a'; 17],
            b"",
            Privilege::User,
            1,
            [0; 16],
            0
        )
        .is_err());
    }

    #[test]
    fn a_bmc_answering_with_another_suite_is_named_as_such_not_as_a_tag_mismatch() {
        let (s17, s3) = (
            CipherSuite::from_id(17).unwrap(),
            CipherSuite::from_id(3).unwrap(),
        );
        let err = bmc_side_answering(s17, s3, b"secret", &|_| false).unwrap_err();
        assert_eq!(
            err,
            HandshakeError::SuiteSubstituted {
                proposed: 17,
                answered: Some(3)
            }
        );
        assert_eq!(
            err.to_string(),
            "Open Session: proposed cipher suite 17, the BMC answered with the algorithms of suite 3 instead of refusing"
        );
        assert!(!err.is_auth_refusal());
    }

    #[test]
    fn an_allowed_substituted_suite_completes_the_handshake_with_its_own_keys() {
        let (s17, s3) = (
            CipherSuite::from_id(17).unwrap(),
            CipherSuite::from_id(3).unwrap(),
        );
        let est = bmc_side_answering(s17, s3, b"secret", &|s| s.id == 3).unwrap();
        assert_eq!(est.keys.suite().id, 3);
        assert_eq!(est.bmc_session_id, 0xb0b0b0b0);
    }

    #[test]
    fn a_substituted_suite_the_caller_refuses_is_never_used() {
        let (s3, s2) = (
            CipherSuite::from_id(3).unwrap(),
            CipherSuite::from_id(2).unwrap(),
        );
        let err = bmc_side_answering(s3, s2, b"secret", &|s| !s.is_weak()).unwrap_err();
        assert_eq!(
            err,
            HandshakeError::SuiteSubstituted {
                proposed: 3,
                answered: Some(2)
            }
        );
    }
}
