//! The BMC's side of Open Session and RAKP 1 to 4: a session slot, the user's check, the
//! RAKP3 auth code's check, and the session keys.

use super::{Active, Bmc, Challenge, Event, OpenSessionPolicy, Slot, SlotState, Window};
use crate::crypto::{ct_eq, user_key, SessionKeys};
use crate::error::le32;
use crate::open_session::{decode_request, OpenSessionResponse};
use crate::rakp::{rakp2_auth_code, rakp3_auth_code, rakp4_icv, sik, Rakp1, Rakp2, Rakp3, Rakp4};
use crate::session::{self, PayloadType};
use crate::{CipherSuite, Privilege};

/// RMCP+ status codes the BMC answers with (IPMI 2.0 table 13-15).
const INSUFFICIENT_RESOURCES: u8 = 0x01;
const INVALID_SESSION_ID: u8 = 0x02;
const INVALID_ROLE: u8 = 0x09;
const UNAUTHORIZED_NAME: u8 = 0x0d;
const INVALID_INTEGRITY_CHECK_VALUE: u8 = 0x0f;
const NO_CIPHER_SUITE_MATCH: u8 = 0x11;

fn clear(payload_type: PayloadType, payload: &[u8]) -> Vec<u8> {
    session::encode_v2(payload_type, 0, 0, payload, None, [0; 16])
}

impl Bmc {
    /// Open Session: a slot for a suite the BMC accepts, or a refusal.
    pub(super) fn open_session(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        let refuse = |tag: u8, console_sid: u32, status: u8| {
            let r = OpenSessionResponse {
                tag,
                status,
                max_privilege: 0,
                console_session_id: console_sid,
                bmc_session_id: 0,
                suite: None,
            };
            Some(clear(PayloadType::OpenSessionResponse, &r.encode()))
        };
        let req = match decode_request(payload) {
            Ok(r) => r,
            // Well framed, but algorithms that form no suite this BMC knows.
            Err(_) if payload.len() >= 32 => {
                return refuse(payload[0], le32(payload, 4), NO_CIPHER_SUITE_MATCH)
            }
            Err(_) => return None,
        };
        self.event(Event::OpenSession {
            suite: req.suite.id,
        });
        let accepted = match self.config.open_session {
            OpenSessionPolicy::Listed => self
                .config
                .suites
                .contains(&req.suite.id)
                .then_some(req.suite),
            OpenSessionPolicy::Any => Some(req.suite),
            OpenSessionPolicy::None => None,
            OpenSessionPolicy::Substitute(id) => CipherSuite::from_id(id),
        };
        let Some(suite) = accepted else {
            return refuse(req.tag, req.console_session_id, NO_CIPHER_SUITE_MATCH);
        };
        if self.slots.len() >= self.config.max_sessions {
            return refuse(req.tag, req.console_session_id, INSUFFICIENT_RESOURCES);
        }
        let bmc_sid = loop {
            self.next_sid = self.next_sid.wrapping_add(1);
            let sid = self.next_sid;
            if sid != 0 && !self.slots.iter().any(|s| s.bmc_sid == sid) {
                break sid;
            }
        };
        self.slots.push(Slot {
            bmc_sid,
            console_sid: req.console_session_id,
            suite,
            state: SlotState::Opened,
        });
        let r = OpenSessionResponse {
            tag: req.tag,
            status: 0,
            max_privilege: Privilege::Administrator as u8,
            console_session_id: req.console_session_id,
            bmc_session_id: bmc_sid,
            suite: Some(suite),
        };
        Some(clear(PayloadType::OpenSessionResponse, &r.encode()))
    }

    /// RAKP1: the user is looked up by name; RAKP2 proves the BMC knows the password.
    pub(super) fn rakp1(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        let r1 = Rakp1::decode(payload).ok()?;
        self.event(Event::Rakp1);
        let refuse = |console_sid: u32, status: u8| {
            let r = Rakp2 {
                tag: r1.tag,
                status,
                console_session_id: console_sid,
                bmc_random: [0; 16],
                guid: [0; 16],
                auth_code: Vec::new(),
            };
            Some(clear(PayloadType::Rakp2, &r.encode()))
        };
        let Some(slot) = self.slot(r1.bmc_session_id) else {
            return refuse(0, INVALID_SESSION_ID);
        };
        // A retransmitted RAKP1 is answered afresh; after RAKP4 it is ignored.
        if matches!(slot.state, SlotState::Active(_)) {
            return None;
        }
        let (console_sid, suite) = (slot.console_sid, slot.suite);
        let status = if Privilege::from_u8(r1.role).is_none() {
            INVALID_ROLE
        } else if r1.username != self.config.username {
            UNAUTHORIZED_NAME
        } else {
            0
        };
        if status != 0 {
            self.drop_slot(r1.bmc_session_id);
            return refuse(console_sid, status);
        }
        let rc = self.random16();
        let auth_code = rakp2_auth_code(
            suite.auth,
            &user_key(&self.config.password),
            console_sid,
            r1.bmc_session_id,
            &r1.console_random,
            &rc,
            &self.config.guid,
            r1.role,
            &r1.username,
        );
        let guid = self.config.guid;
        let slot = self.slot(r1.bmc_session_id)?;
        slot.state = SlotState::Challenged(Challenge {
            rm: r1.console_random,
            rc,
            role: r1.role,
            username: r1.username,
        });
        let r2 = Rakp2 {
            tag: r1.tag,
            status: 0,
            console_session_id: console_sid,
            bmc_random: rc,
            guid,
            auth_code,
        };
        Some(clear(PayloadType::Rakp2, &r2.encode()))
    }

    /// RAKP3: the console's proof of the password; RAKP4 establishes the session. A RAKP3
    /// with a non-zero status (the console gave up) drops the half-open session silently.
    pub(super) fn rakp3(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        let r3 = Rakp3::decode(payload).ok()?;
        self.event(Event::Rakp3);
        let rakp4 = |console_sid: u32, status: u8, icv: Vec<u8>| {
            let r = Rakp4 {
                tag: r3.tag,
                status,
                console_session_id: console_sid,
                icv,
            };
            clear(PayloadType::Rakp4, &r.encode())
        };
        let kuid = user_key(&self.config.password);
        let guid = self.config.guid;
        let Some(slot) = self.slot(r3.bmc_session_id) else {
            return Some(rakp4(0, INVALID_SESSION_ID, Vec::new()));
        };
        let (console_sid, suite) = (slot.console_sid, slot.suite);
        let c = match &slot.state {
            SlotState::Challenged(c) => c.clone(),
            // RAKP4 was lost: the same RAKP3 gets the same answer.
            SlotState::Active(a) if a.rakp3 == payload => return Some(a.rakp4.clone()),
            _ => return None,
        };
        if r3.status != 0 {
            self.drop_slot(r3.bmc_session_id);
            return None;
        }
        let expected = rakp3_auth_code(suite.auth, &kuid, &c.rc, console_sid, c.role, &c.username);
        if !ct_eq(&expected, &r3.auth_code) {
            self.drop_slot(r3.bmc_session_id);
            return Some(rakp4(
                console_sid,
                INVALID_INTEGRITY_CHECK_VALUE,
                Vec::new(),
            ));
        }
        let sik = sik(suite.auth, &kuid, &c.rm, &c.rc, c.role, &c.username);
        let icv = rakp4_icv(suite.auth, &sik, &c.rm, r3.bmc_session_id, &guid);
        let answer = rakp4(console_sid, 0, icv);
        let max_privilege = Privilege::from_u8(c.role).expect("checked at RAKP1");
        slot.state = SlotState::Active(Active {
            keys: SessionKeys::derive(suite, &sik),
            privilege: Privilege::User.min(max_privilege),
            max_privilege,
            out_seq: 0,
            window: Window::default(),
            rakp3: payload.to_vec(),
            rakp4: answer.clone(),
        });
        self.record.sessions_established += 1;
        Some(answer)
    }
}
