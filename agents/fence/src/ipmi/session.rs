//! One RMCP+ session with a BMC: the IPMI v1.5 Get Channel Authentication Capabilities that
//! starts every session (as ipmitool does), cipher negotiation, Open Session + RAKP,
//! privilege, IPMI commands with sequence numbers and retransmission, and Close Session
//! (always, also when the session is dropped on an error path or by a cancelled future).

use std::time::Duration;

use palisade_ipmi::command::{parse_response, Command, Outcome};
use palisade_ipmi::get_channel_auth_capabilities::{GetChannelAuthCapabilities, CURRENT_CHANNEL};
use palisade_ipmi::get_channel_cipher_suites::{parse_suite_ids, GetChannelCipherSuites};
use palisade_ipmi::message::Response;
use palisade_ipmi::open_session::is_algorithm_rejection;
use palisade_ipmi::rakp::{Established, Handshake, HandshakeError};
use palisade_ipmi::session::{self, PayloadType};
use palisade_ipmi::{close_session::CloseSession, CipherSuite, Privilege};

use super::transport::{Transport, Verdict};
use crate::error::FenceError;

/// Everything needed to open a session.
#[derive(Clone)]
pub(crate) struct SessionParams {
    pub(crate) username: String,
    pub(crate) password: crate::Secret,
    pub(crate) exchange_timeout: Duration,
    pub(crate) attempts: u32,
}

fn handshake_error(device: &str, e: HandshakeError) -> FenceError {
    if e.is_auth_refusal() {
        FenceError::AuthRefused {
            device: device.to_string(),
            detail: e.to_string(),
        }
    } else if matches!(
        e,
        HandshakeError::Decode(_)
            | HandshakeError::Mismatch(_)
            | HandshakeError::SuiteSubstituted { .. }
    ) {
        FenceError::Protocol {
            device: device.to_string(),
            detail: e.to_string(),
        }
    } else {
        FenceError::DeviceRefused {
            device: device.to_string(),
            detail: e.to_string(),
        }
    }
}

/// Sends a pre-session IPMI request in an RMCP+ packet with session ID 0 and returns the
/// parsed outcome.
pub(crate) async fn presession<C: Command>(
    t: &Transport,
    cmd: &C,
    timeout: Duration,
    attempts: u32,
) -> Result<Outcome<C::Output>, FenceError> {
    let req = cmd.request(0x01);
    let msg = req.encode();
    let resp = t
        .exchange(
            "pre-session command",
            timeout,
            attempts,
            || session::encode_v2(PayloadType::Ipmi, 0, 0, &msg, None, [0; 16]),
            |d| match session::decode(d, None).and_then(|p| Response::decode(&p.payload)) {
                Ok(r) if r.answers(&req) => Verdict::Accept(r),
                Ok(_) => Verdict::Ignore,
                Err(e) => Verdict::Garbage(e.to_string()),
            },
        )
        .await?;
    parse_response::<C>(&resp).map_err(|e| FenceError::Protocol {
        device: t.device().to_string(),
        detail: e.to_string(),
    })
}

/// Get Channel Authentication Capabilities in IPMI v1.5 framing: what ipmitool sends before
/// every session. Returns the time the answered exchange took (a round trip, or more when a
/// retransmission was needed), which sizes the cipher-suite probe.
///
/// Guarantees: a BMC that answers with a completion code, or without IPMI v2.0 (RMCP+)
/// support on the channel, is refused here, before any session is opened.
///
/// Assumptions: every IPMI 2.0 BMC answers this request in v1.5 framing (the specification
/// requires it; ipmitool fails without it). pyghmi-based BMCs (virtualbmc) also use it to
/// forget a stale session of the same client address and port: without it, a client whose
/// source port repeats lands in the previous client's session.
pub(crate) async fn hello(
    t: &Transport,
    privilege: Privilege,
    timeout: Duration,
    attempts: u32,
) -> Result<Duration, FenceError> {
    let cmd = GetChannelAuthCapabilities {
        channel: CURRENT_CHANNEL,
        privilege,
    };
    let req = cmd.request(0);
    let started = tokio::time::Instant::now();
    let resp = t
        .exchange(
            "Get Channel Authentication Capabilities",
            timeout,
            attempts,
            || cmd.v15_datagram(0),
            |d| match session::decode(d, None).and_then(|p| Response::decode(&p.payload)) {
                Ok(r) if r.answers(&req) => Verdict::Accept(r),
                Ok(_) => Verdict::Ignore,
                Err(e) => Verdict::Garbage(e.to_string()),
            },
        )
        .await?;
    let took = started.elapsed();
    let refused = |detail: String| FenceError::DeviceRefused {
        device: t.device().to_string(),
        detail,
    };
    match parse_response::<GetChannelAuthCapabilities>(&resp) {
        Ok(Outcome::Ok(caps)) if caps.ipmi_v2 => Ok(took),
        Ok(Outcome::Ok(_)) => Err(refused(
            "Get Channel Authentication Capabilities: the BMC does not offer IPMI v2.0 (RMCP+) on this channel".into(),
        )),
        Ok(Outcome::CompletionCode(cc)) => Err(refused(format!(
            "Get Channel Authentication Capabilities: completion code {cc:#04x} ({})",
            cc_text(cc)
        ))),
        Err(e) => Err(FenceError::Protocol {
            device: t.device().to_string(),
            detail: format!("Get Channel Authentication Capabilities: {e}"),
        }),
    }
}

/// How long to wait for Get Channel Cipher Suites: at least `configured`, four times the
/// round trip [`hello`] just measured, and at most the exchange timeout (unless `configured`
/// is longer). A fixed 100 ms gave up on every BMC 150 ms away.
pub(crate) fn probe_timeout(configured: Duration, rtt: Duration, exchange: Duration) -> Duration {
    configured
        .max(rtt.saturating_mul(4))
        .min(exchange.max(configured))
}

/// Asks the BMC which suites it supports. `None` if it does not answer within `timeout`
/// (`ipmi_sim` never answers this command).
pub(crate) async fn list_cipher_suites(
    t: &Transport,
    timeout: Duration,
) -> Result<Option<Vec<u8>>, FenceError> {
    let mut records = Vec::new();
    for index in 0..8u8 {
        let cmd = GetChannelCipherSuites {
            channel: 0x0e,
            index,
        };
        match presession(t, &cmd, timeout, 1).await {
            Ok(Outcome::Ok(chunk)) => {
                let last = chunk.records.len() < 16;
                records.extend_from_slice(&chunk.records);
                if last {
                    break;
                }
            }
            // No answer, an error code or an answer we cannot read: fall back to trying
            // suites at Open Session, which every BMC must answer.
            Ok(Outcome::CompletionCode(_))
            | Err(FenceError::Timeout { .. } | FenceError::Protocol { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    match parse_suite_ids(&records) {
        Ok(ids) => Ok(Some(ids)),
        Err(e) => {
            tracing::debug!(device = t.device(), error = %e, "unreadable cipher suite records");
            Ok(None)
        }
    }
}

/// An open RMCP+ session.
pub(crate) struct Session {
    t: Transport,
    est: Established,
    out_seq: u32,
    rq_seq: u8,
    params: SessionParams,
    closed: bool,
}

/// Outcome of one Open Session + RAKP attempt.
pub(crate) enum OpenError {
    /// The BMC does not support this suite: try the next one.
    SuiteRejected,
    /// The BMC accepted with the algorithms of `answered` (None: no known suite) instead of
    /// refusing, and that suite may not be followed.
    SuiteSubstituted {
        /// The suite whose algorithms the BMC chose.
        answered: Option<u8>,
    },
    /// Anything else.
    Fatal(FenceError),
}

impl Session {
    /// Opens a session with `suite`, or with the suite whose algorithms the BMC answers with
    /// instead when `allow` accepts it (see [`Handshake::accept_open_session_allowing`]).
    pub(crate) async fn open(
        t: &Transport,
        suite: CipherSuite,
        p: &SessionParams,
        allow: &(dyn Fn(CipherSuite) -> bool + Sync),
    ) -> Result<Self, OpenError> {
        let device = t.device().to_string();
        let console_sid = rand::random::<u32>() | 1;
        let tag = rand::random::<u8>();
        let mut hs = Handshake::new(
            suite,
            p.username.as_bytes(),
            p.password.expose().as_bytes(),
            Privilege::Administrator,
            console_sid,
            rand::random(),
            tag,
        )
        .map_err(|e| OpenError::Fatal(handshake_error(&device, e)))?;

        let osr = hs.open_session_request();
        let resp = t
            .exchange(
                "open session",
                p.exchange_timeout,
                p.attempts,
                || session::encode_v2(PayloadType::OpenSessionRequest, 0, 0, &osr, None, [0; 16]),
                expect(PayloadType::OpenSessionResponse),
            )
            .await
            .map_err(OpenError::Fatal)?;
        match hs.accept_open_session_allowing(&resp, allow) {
            Ok(()) => {}
            Err(HandshakeError::Status { code, .. }) if is_algorithm_rejection(code) => {
                return Err(OpenError::SuiteRejected)
            }
            Err(HandshakeError::SuiteSubstituted { answered, .. }) => {
                return Err(OpenError::SuiteSubstituted { answered })
            }
            Err(e) => return Err(OpenError::Fatal(handshake_error(&device, e))),
        }

        let r1 = hs.rakp1();
        let r2 = t
            .exchange(
                "RAKP1",
                p.exchange_timeout,
                p.attempts,
                || session::encode_v2(PayloadType::Rakp1, 0, 0, &r1, None, [0; 16]),
                expect(PayloadType::Rakp2),
            )
            .await
            .map_err(OpenError::Fatal)?;
        let r3 = match hs.accept_rakp2(&r2) {
            Ok(r3) => r3,
            Err(e) => {
                if matches!(e, HandshakeError::AuthCodeMismatch { .. }) {
                    // Tell the BMC to drop the half-open session; no answer expected.
                    let abort = hs.rakp3_abort();
                    t.send_only(&session::encode_v2(
                        PayloadType::Rakp3,
                        0,
                        0,
                        &abort,
                        None,
                        [0; 16],
                    ))
                    .await;
                }
                return Err(OpenError::Fatal(handshake_error(&device, e)));
            }
        };
        let r4 = t
            .exchange(
                "RAKP3",
                p.exchange_timeout,
                p.attempts,
                || session::encode_v2(PayloadType::Rakp3, 0, 0, &r3, None, [0; 16]),
                expect(PayloadType::Rakp4),
            )
            .await
            .map_err(OpenError::Fatal)?;
        let est = hs
            .accept_rakp4(&r4)
            .map_err(|e| OpenError::Fatal(handshake_error(&device, e)))?;
        Ok(Self {
            t: t.clone(),
            est,
            out_seq: 0,
            rq_seq: 0,
            params: p.clone(),
            closed: false,
        })
    }

    /// The negotiated suite.
    pub(crate) fn suite(&self) -> u8 {
        self.est.keys.suite().id
    }

    /// Sends `cmd` in the session and returns its outcome.
    pub(crate) async fn command<C: Command>(
        &mut self,
        cmd: &C,
    ) -> Result<Outcome<C::Output>, FenceError> {
        self.rq_seq = (self.rq_seq + 1) & 0x3f;
        let req = cmd.request(self.rq_seq);
        let msg = req.encode();
        let Self {
            t,
            est,
            out_seq,
            params,
            ..
        } = self;
        let keys = &est.keys;
        let bmc_sid = est.bmc_session_id;
        let console_sid = est.console_session_id;
        let resp = t
            .exchange(
                "IPMI command",
                params.exchange_timeout,
                params.attempts,
                || {
                    // Every transmission, retransmissions included, gets a fresh sequence
                    // number so the BMC's replay window accepts it.
                    *out_seq = out_seq.wrapping_add(1).max(1);
                    session::encode_v2(
                        PayloadType::Ipmi,
                        bmc_sid,
                        *out_seq,
                        &msg,
                        Some(keys),
                        rand::random(),
                    )
                },
                |d| match session::decode(d, Some(keys)) {
                    Ok(p) if p.session_id != console_sid || p.payload_type != PayloadType::Ipmi => {
                        Verdict::Ignore
                    }
                    Ok(p) => match Response::decode(&p.payload) {
                        Ok(r) if r.answers(&req) => Verdict::Accept(r),
                        Ok(_) => Verdict::Ignore,
                        Err(e) => Verdict::Garbage(e.to_string()),
                    },
                    Err(e) => Verdict::Garbage(e.to_string()),
                },
            )
            .await?;
        parse_response::<C>(&resp).map_err(|e| FenceError::Protocol {
            device: t.device().to_string(),
            detail: e.to_string(),
        })
    }

    /// Like [`Session::command`], but a non-zero completion code is a `DeviceRefused` error.
    pub(crate) async fn command_ok<C: Command>(
        &mut self,
        cmd: &C,
        what: &str,
    ) -> Result<C::Output, FenceError> {
        match self.command(cmd).await? {
            Outcome::Ok(v) => Ok(v),
            Outcome::CompletionCode(cc) => {
                let detail = format!("{what}: completion code {cc:#04x} ({})", cc_text(cc));
                Err(if cc == 0xd4 || cc == 0x81 || cc == 0x82 {
                    FenceError::AuthRefused {
                        device: self.t.device().to_string(),
                        detail,
                    }
                } else {
                    FenceError::DeviceRefused {
                        device: self.t.device().to_string(),
                        detail,
                    }
                })
            }
        }
    }

    /// Closes the session, waiting briefly for the answer.
    pub(crate) async fn close(mut self) {
        self.closed = true;
        let cmd = CloseSession {
            session_id: self.est.bmc_session_id,
        };
        self.params.attempts = self.params.attempts.min(2);
        if let Err(e) = self.command(&cmd).await {
            tracing::debug!(device = self.t.device(), error = %e, "close session failed");
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        // Dropped on an error path or by a cancelled future: close in the background so the
        // BMC does not run out of session slots.
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let s = Session {
            t: self.t.clone(),
            est: self.est.clone(),
            out_seq: self.out_seq.wrapping_add(8),
            rq_seq: self.rq_seq.wrapping_add(8),
            params: self.params.clone(),
            closed: false,
        };
        self.closed = true;
        handle.spawn(s.close());
    }
}

fn expect(want: PayloadType) -> impl FnMut(&[u8]) -> Verdict<Vec<u8>> {
    move |d| match session::decode(d, None) {
        Ok(p) if p.payload_type == want => Verdict::Accept(p.payload),
        Ok(_) => Verdict::Ignore,
        Err(e) => Verdict::Garbage(e.to_string()),
    }
}

/// Text for common IPMI completion codes.
pub(crate) fn cc_text(cc: u8) -> &'static str {
    match cc {
        0xc0 => "node busy",
        0xc1 => "invalid command",
        0xc3 => "timeout",
        0xc7 => "request data length invalid",
        0xc9 => "parameter out of range",
        0xcc => "invalid data field",
        0xd4 => "insufficient privilege level",
        0xd5 => "not supported in present state",
        0x81..=0x85 => "privilege or session error",
        _ => "unspecified",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cipher_probe_waits_for_a_slow_bmc_within_the_exchange_timeout() {
        let ms = Duration::from_millis;
        for (configured, rtt, exchange, want) in [
            // Loopback: the configured floor.
            (ms(100), ms(1), ms(500), ms(100)),
            // 150 ms away: four round trips, capped by the exchange timeout.
            (ms(100), ms(150), ms(500), ms(500)),
            (ms(100), ms(150), ms(2000), ms(600)),
            // A configured probe longer than the exchange timeout is honoured.
            (ms(800), ms(1), ms(500), ms(800)),
            (ms(100), ms(60), ms(500), ms(240)),
        ] {
            assert_eq!(
                probe_timeout(configured, rtt, exchange),
                want,
                "{configured:?} {rtt:?} {exchange:?}"
            );
        }
    }
}
