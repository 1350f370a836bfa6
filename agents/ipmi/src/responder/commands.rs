//! The IPMI commands the BMC answers: before a session (authentication capabilities, cipher
//! suites) and inside one (privilege, device ID, system GUID, chassis status and control,
//! close).

use super::{Bmc, Event, SlotState};
use crate::get_channel_cipher_suites::{encode_records, CHUNK};
use crate::message::{Request, Response, NETFN_APP, NETFN_CHASSIS};
use crate::session::{self, PayloadType};
use crate::{CipherSuite, Privilege};

/// Get Channel Authentication Capabilities data: channel 1; v1.5 auth types none, MD2, MD5
/// and password, with the extended-data bit; per-message authentication; IPMI v1.5 and v2.0.
const AUTH_CAPABILITIES: [u8; 8] = [0x01, 0x97, 0x04, 0x03, 0, 0, 0, 0];

/// Completion codes (IPMI 2.0 table 5-2 and the commands' own).
const INVALID_COMMAND: u8 = 0xc1;
const INVALID_DATA_FIELD: u8 = 0xcc;
const INSUFFICIENT_PRIVILEGE: u8 = 0xd4;
const PRIVILEGE_ABOVE_LIMIT: u8 = 0x81;
const INVALID_SESSION_ID: u8 = 0x87;

fn answer(req: &Request, completion_code: u8, data: Vec<u8>) -> Vec<u8> {
    Response {
        netfn: req.netfn | 1,
        cmd: req.cmd,
        rq_seq: req.rq_seq,
        completion_code,
        data,
    }
    .encode()
}

impl Bmc {
    /// A pre-session request in IPMI v1.5 framing: only Get Channel Authentication
    /// Capabilities is answered (this BMC has no v1.5 sessions).
    pub(super) fn presession_v15(&mut self, datagram: &[u8]) -> Option<Vec<u8>> {
        let p = session::decode(datagram, None).ok()?;
        let req = Request::decode(&p.payload).ok()?;
        if p.session_id != 0 || (req.netfn, req.cmd) != (NETFN_APP, 0x38) {
            return None;
        }
        self.event(Event::AuthCapabilitiesV15);
        let resp = answer(&req, 0, AUTH_CAPABILITIES.to_vec());
        Some(session::encode_v15(0, 0, &resp))
    }

    /// A datagram with session ID 0 in RMCP+ framing: a pre-session command, Open Session
    /// or RAKP.
    pub(super) fn presession_v2(&mut self, datagram: &[u8]) -> Option<Vec<u8>> {
        // Without keys, a packet claiming integrity or confidentiality does not decode.
        let p = session::decode(datagram, None).ok()?;
        match p.payload_type {
            PayloadType::Ipmi => {
                let req = Request::decode(&p.payload).ok()?;
                let data = match (req.netfn, req.cmd) {
                    (NETFN_APP, 0x38) => {
                        self.event(Event::AuthCapabilitiesV2);
                        AUTH_CAPABILITIES.to_vec()
                    }
                    (NETFN_APP, 0x54) => {
                        self.event(Event::CipherSuites);
                        if !self.config.lists_suites {
                            return None;
                        }
                        self.cipher_suites(&req)
                    }
                    _ => return None,
                };
                let resp = answer(&req, 0, data);
                Some(session::encode_v2(
                    PayloadType::Ipmi,
                    0,
                    0,
                    &resp,
                    None,
                    [0; 16],
                ))
            }
            PayloadType::OpenSessionRequest => self.open_session(&p.payload),
            PayloadType::Rakp1 => self.rakp1(&p.payload),
            PayloadType::Rakp3 => self.rakp3(&p.payload),
            _ => None,
        }
    }

    /// Get Channel Cipher Suites: the chunk of record data the request's index names.
    fn cipher_suites(&self, req: &Request) -> Vec<u8> {
        let suites: Vec<CipherSuite> = self
            .config
            .suites
            .iter()
            .filter_map(|id| CipherSuite::from_id(*id))
            .collect();
        let records = encode_records(&suites);
        let index = usize::from(req.data.get(2).copied().unwrap_or(0) & 0x3f);
        let from = (index * CHUNK).min(records.len());
        let to = (from + CHUNK).min(records.len());
        let mut data = vec![0x01];
        data.extend_from_slice(&records[from..to]);
        data
    }

    /// A command inside the established session `sid`: the answer's message, and the
    /// session Close Session closes (after the answer is sent in it). `None`: not answered.
    pub(super) fn command(&mut self, sid: u32, payload: &[u8]) -> Option<(Vec<u8>, Option<u32>)> {
        let req = Request::decode(payload).ok()?;
        self.event(match (req.netfn, req.cmd) {
            (NETFN_APP, 0x3c) => Event::CloseSession,
            (netfn, cmd) => Event::Command { netfn, cmd },
        });
        let SlotState::Active(active) = &self.slot(sid)?.state else {
            return None;
        };
        let (privilege, max_privilege) = (active.privilege, active.max_privilege);
        let (cc, data, close) = match (req.netfn, req.cmd) {
            // Set Session Privilege Level (0: report the current level).
            (NETFN_APP, 0x3b) => match req.data.first().map(|b| b & 0x0f) {
                Some(0) => (0, vec![privilege as u8], None),
                Some(b) => match Privilege::from_u8(b) {
                    Some(p) if p <= max_privilege => {
                        let slot = self.slot(sid)?;
                        if let SlotState::Active(a) = &mut slot.state {
                            a.privilege = p;
                        }
                        (0, vec![p as u8], None)
                    }
                    Some(_) => (PRIVILEGE_ABOVE_LIMIT, vec![], None),
                    None => (INVALID_DATA_FIELD, vec![], None),
                },
                None => (INVALID_DATA_FIELD, vec![], None),
            },
            // Get Device ID (ipmitool asks before some commands): device 0x20, revision 1,
            // firmware 1.0 and available, IPMI 2.0, a chassis device, no manufacturer.
            (NETFN_APP, 0x01) => (
                0,
                vec![0x20, 0x01, 0x01, 0x00, 0x02, 0x80, 0, 0, 0, 0, 0],
                None,
            ),
            // Get System GUID.
            (NETFN_APP, 0x37) => (0, self.config.guid.to_vec(), None),
            // Close Session: this session or another one of this BMC.
            (NETFN_APP, 0x3c) => match req.data.get(..4) {
                Some(b) => {
                    let target = u32::from_le_bytes(b.try_into().expect("4 bytes"));
                    if self.slots.iter().any(|s| s.bmc_sid == target) {
                        (0, vec![], Some(target))
                    } else {
                        (INVALID_SESSION_ID, vec![], None)
                    }
                }
                None => (INVALID_DATA_FIELD, vec![], None),
            },
            // Get Chassis Status: power on or off, no fault.
            (NETFN_CHASSIS, 0x01) => {
                self.record.status_reads += 1;
                (0, vec![u8::from(self.power_on), 0x00, 0x00], None)
            }
            // Chassis Control.
            (NETFN_CHASSIS, 0x02) => {
                if !self.config.answers_chassis_control {
                    return None;
                }
                if privilege < Privilege::Operator {
                    (INSUFFICIENT_PRIVILEGE, vec![], None)
                } else {
                    match req.data.first().map(|b| b & 0x0f) {
                        // Power down, soft shutdown.
                        Some(0x00 | 0x05) => {
                            self.power_on = false;
                            (0, vec![], None)
                        }
                        // Power up, power cycle.
                        Some(0x01 | 0x02) => {
                            self.power_on = true;
                            (0, vec![], None)
                        }
                        // Hard reset, diagnostic interrupt: the power stays as it is.
                        Some(0x03 | 0x04) => (0, vec![], None),
                        _ => (INVALID_DATA_FIELD, vec![], None),
                    }
                }
            }
            _ => (INVALID_COMMAND, vec![], None),
        };
        Some((answer(&req, cc, data), close))
    }
}
