//! A lightweight BMC for tests and benchmarks (feature `responder`; no release build of the
//! product enables it): the BMC side of everything the crate's console side speaks, enough
//! for a power read or a power command by `palisade-fence` or `ipmitool -I lanplus`.
//!
//! [`Bmc`] is sans-IO like the rest of the crate: [`Bmc::handle`] takes one datagram and
//! returns the answer, if any. It answers Get Channel Authentication Capabilities (IPMI v1.5
//! or v2.0 framing), Get Channel Cipher Suites, Open Session, RAKP 1 and 3, and inside an
//! established session Set Session Privilege Level, Get Device ID, Get System GUID, Get
//! Chassis Status, Chassis Control and Close Session. [`udp`] serves one on a UDP socket.
//!
//! The session is real: the BMC checks the user name and the RAKP3 auth code (the password),
//! derives the keys from its own random number, and inside the session accepts only packets
//! whose integrity code verifies and whose payload is encrypted when the suite says so, with
//! fresh sequence numbers. A session starts at User privilege; Chassis Control needs
//! Operator. How it deviates from a plain BMC (which suites it lists and accepts, an ignored
//! Chassis Control) is set in [`BmcConfig`], for the tests of the console's negotiation.
//!
//! - `handshake`: Open Session and RAKP;
//! - `commands`: the IPMI commands before and inside a session.

mod commands;
mod handshake;
pub mod udp;

use std::hash::{BuildHasher, Hasher};

use crate::crypto::{hmac_sha256, SessionKeys};
use crate::error::le32;
use crate::session::{self, AUTH_TYPE_NONE, AUTH_TYPE_RMCP_PLUS};
use crate::{rmcp, CipherSuite, Privilege};

/// How a BMC answers an Open Session Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenSessionPolicy {
    /// Accepts a proposed suite it lists ([`BmcConfig::suites`]) and refuses any other with
    /// status 0x11 (no cipher suite match): what a BMC should do.
    Listed,
    /// Accepts whatever suite is proposed (a BMC whose list is incomplete or misconfigured).
    Any,
    /// Refuses every proposal with status 0x11.
    None,
    /// Accepts every proposal with the algorithms of this suite, whatever was proposed
    /// (pyghmi-based BMCs answer with suite 3).
    Substitute(u8),
}

/// What a BMC is and how it behaves.
#[derive(Debug, Clone)]
pub struct BmcConfig {
    /// The one user it knows (at most 16 bytes), with Administrator as its highest privilege.
    pub username: Vec<u8>,
    /// That user's password (at most 20 bytes).
    pub password: Vec<u8>,
    /// The system GUID (sent in RAKP2 and answered to Get System GUID).
    pub guid: [u8; 16],
    /// The suites listed by Get Channel Cipher Suites, in order.
    pub suites: Vec<u8>,
    /// Whether it answers Get Channel Cipher Suites at all (`ipmi_sim` never does).
    pub lists_suites: bool,
    /// How it answers Open Session.
    pub open_session: OpenSessionPolicy,
    /// The chassis power at the start.
    pub power_on: bool,
    /// Whether it answers Chassis Control; `false`: the command is never answered (a BMC that
    /// hangs after login).
    pub answers_chassis_control: bool,
    /// How many sessions may be open (or half-open) at once; one more is refused with status
    /// 0x01 (insufficient resources), so a console that leaks sessions runs out.
    pub max_sessions: usize,
    /// Whether [`Record::events`] keeps every event (tests), or only the counters (benches).
    pub keep_events: bool,
}

impl BmcConfig {
    /// A BMC that lists and accepts only suite 17, with the chassis on: what a well
    /// configured BMC offers.
    pub fn suite_17(username: &str, password: &str) -> Self {
        Self {
            username: username.as_bytes().to_vec(),
            password: password.as_bytes().to_vec(),
            guid: [0x42; 16],
            suites: vec![17],
            lists_suites: true,
            open_session: OpenSessionPolicy::Listed,
            power_on: true,
            answers_chassis_control: true,
            max_sessions: 8,
            keep_events: false,
        }
    }
}

/// Something that arrived, as [`Record::events`] keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Get Channel Authentication Capabilities in IPMI v1.5 framing (ipmitool's first).
    AuthCapabilitiesV15,
    /// Get Channel Authentication Capabilities in RMCP+ framing.
    AuthCapabilitiesV2,
    /// Get Channel Cipher Suites (one request per chunk).
    CipherSuites,
    /// An Open Session Request proposing this suite.
    OpenSession {
        /// The proposed suite.
        suite: u8,
    },
    /// RAKP Message 1.
    Rakp1,
    /// RAKP Message 3 (also one that aborts the handshake).
    Rakp3,
    /// An IPMI command inside an established session.
    Command {
        /// Its NetFn (request).
        netfn: u8,
        /// Its command number.
        cmd: u8,
    },
    /// Close Session.
    CloseSession,
}

/// What a BMC has seen and done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// Datagrams received, valid or not.
    pub datagrams: u64,
    /// Datagrams dropped without an answer (undecodable, failed integrity, replayed, or for
    /// no session).
    pub dropped: u64,
    /// Sessions established (RAKP4 sent).
    pub sessions_established: u64,
    /// Sessions closed by Close Session.
    pub sessions_closed: u64,
    /// Get Chassis Status answered.
    pub status_reads: u64,
    /// Every event, in order, when [`BmcConfig::keep_events`] is set.
    pub events: Vec<Event>,
}

impl Record {
    /// The suites proposed at Open Session, in order (needs [`BmcConfig::keep_events`]).
    pub fn open_session_suites(&self) -> Vec<u8> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::OpenSession { suite } => Some(*suite),
                _ => None,
            })
            .collect()
    }
}

/// One session slot.
struct Slot {
    bmc_sid: u32,
    console_sid: u32,
    suite: CipherSuite,
    state: SlotState,
}

/// Where a session is in its life.
enum SlotState {
    /// Open Session answered; RAKP1 expected.
    Opened,
    /// RAKP2 sent; RAKP3 expected.
    Challenged(Challenge),
    /// RAKP4 sent: the session is established.
    Active(Active),
}

/// What RAKP1 and RAKP2 exchanged.
#[derive(Clone)]
struct Challenge {
    rm: [u8; 16],
    rc: [u8; 16],
    role: u8,
    username: Vec<u8>,
}

/// An established session.
struct Active {
    keys: SessionKeys,
    /// The session's current privilege (it starts at User).
    privilege: Privilege,
    /// The highest privilege the session may raise itself to (from RAKP1's role).
    max_privilege: Privilege,
    out_seq: u32,
    window: Window,
    /// The RAKP3 that established it and the RAKP4 answered, for a retransmitted RAKP3.
    rakp3: Vec<u8>,
    rakp4: Vec<u8>,
}

/// The inbound sequence numbers of a session: a number already seen, or 32 or more below the
/// highest seen, is a replay.
#[derive(Default)]
struct Window {
    highest: u32,
    seen: u32,
}

impl Window {
    /// Accepts `seq` (and remembers it) unless it is zero or a replay.
    fn accept(&mut self, seq: u32) -> bool {
        if seq == 0 {
            return false;
        }
        if seq > self.highest {
            let shift = seq - self.highest;
            self.seen = if shift >= 32 { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.highest = seq;
            return true;
        }
        let back = self.highest - seq;
        if back >= 32 || self.seen & (1 << back) != 0 {
            return false;
        }
        self.seen |= 1 << back;
        true
    }
}

/// A BMC, without I/O: feed it datagrams with [`Bmc::handle`].
pub struct Bmc {
    config: BmcConfig,
    power_on: bool,
    seed: [u8; 32],
    counter: u64,
    next_sid: u32,
    slots: Vec<Slot>,
    record: Record,
}

impl std::fmt::Debug for Bmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bmc")
            .field("power_on", &self.power_on)
            .field("sessions", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Bmc {
    /// A BMC whose random numbers (its RAKP random, session IDs and IVs) come from a seed
    /// drawn from the process's hash randomness.
    pub fn new(config: BmcConfig) -> Self {
        let mut seed = [0u8; 32];
        for (i, chunk) in seed.chunks_mut(8).enumerate() {
            // Every RandomState has fresh keys: each hash is a random 64-bit number.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
        Self::with_seed(config, seed)
    }

    /// A BMC whose random numbers derive from `seed` (the same seed gives the same numbers).
    pub fn with_seed(config: BmcConfig, seed: [u8; 32]) -> Self {
        let next_sid =
            u32::from_le_bytes(hmac_sha256(&seed, &[b"sid"])[..4].try_into().expect("4"));
        Self {
            power_on: config.power_on,
            config,
            seed,
            counter: 0,
            next_sid,
            slots: Vec::new(),
            record: Record::default(),
        }
    }

    /// Whether the chassis is on.
    pub fn power_on(&self) -> bool {
        self.power_on
    }

    /// Switches the chassis on or off (as if by hand).
    pub fn set_power(&mut self, on: bool) {
        self.power_on = on;
    }

    /// What it has seen and done so far.
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// Sessions open or half-open now.
    pub fn open_sessions(&self) -> usize {
        self.slots.len()
    }

    /// Answers one datagram: `None` when a BMC would stay silent (undecodable, a failed
    /// integrity check, a replay, a session it does not know, an ignored command).
    pub fn handle(&mut self, datagram: &[u8]) -> Option<Vec<u8>> {
        self.record.datagrams += 1;
        let reply = self.dispatch(datagram);
        if reply.is_none() {
            self.record.dropped += 1;
        }
        reply
    }

    fn dispatch(&mut self, datagram: &[u8]) -> Option<Vec<u8>> {
        let rest = rmcp::strip(datagram).ok()?;
        match *rest.first()? {
            AUTH_TYPE_NONE => self.presession_v15(datagram),
            AUTH_TYPE_RMCP_PLUS if rest.len() >= 6 => match le32(rest, 2) {
                0 => self.presession_v2(datagram),
                sid => self.in_session(sid, datagram),
            },
            _ => None,
        }
    }

    fn event(&mut self, e: Event) {
        if self.config.keep_events {
            self.record.events.push(e);
        }
    }

    /// 16 fresh bytes from the seed (HMAC-SHA256 of a counter).
    fn random16(&mut self) -> [u8; 16] {
        self.counter += 1;
        let h = hmac_sha256(&self.seed, &[b"rnd", &self.counter.to_le_bytes()]);
        h[..16].try_into().expect("16 of 32 bytes")
    }

    fn slot(&mut self, bmc_sid: u32) -> Option<&mut Slot> {
        self.slots.iter_mut().find(|s| s.bmc_sid == bmc_sid)
    }

    fn drop_slot(&mut self, bmc_sid: u32) {
        self.slots.retain(|s| s.bmc_sid != bmc_sid);
    }

    /// A datagram for an established session: verified, decrypted, answered in the session.
    fn in_session(&mut self, sid: u32, datagram: &[u8]) -> Option<Vec<u8>> {
        let slot = self.slot(sid)?;
        let SlotState::Active(active) = &mut slot.state else {
            return None;
        };
        let suite = slot.suite;
        let p = session::decode(datagram, Some(&active.keys)).ok()?;
        let needs_integrity = suite.integrity != crate::cipher_suite::IntegrityAlgorithm::None;
        let needs_confidentiality =
            suite.confidentiality != crate::cipher_suite::ConfidentialityAlgorithm::None;
        if p.payload_type != session::PayloadType::Ipmi
            || p.authenticated != needs_integrity
            || p.encrypted != needs_confidentiality
            || !active.window.accept(p.sequence)
        {
            return None;
        }
        let console_sid = slot.console_sid;
        let (resp, close) = self.command(sid, &p.payload)?;
        let iv = self.random16();
        let slot = self.slot(sid)?;
        let SlotState::Active(active) = &mut slot.state else {
            return None;
        };
        active.out_seq = active.out_seq.wrapping_add(1).max(1);
        let out = session::encode_v2(
            session::PayloadType::Ipmi,
            console_sid,
            active.out_seq,
            &resp,
            Some(&active.keys),
            iv,
        );
        if let Some(closed) = close {
            self.drop_slot(closed);
            self.record.sessions_closed += 1;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests;
