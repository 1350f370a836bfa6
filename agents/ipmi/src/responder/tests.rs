//! The BMC against the crate's own console side ([`Handshake`]), without I/O.

use super::*;
use crate::chassis_control::ChassisControl;
use crate::close_session::CloseSession;
use crate::command::{parse_response, Command, Outcome};
use crate::get_channel_cipher_suites::{parse_suite_ids, GetChannelCipherSuites};
use crate::get_chassis_status::GetChassisStatus;
use crate::message::Response;
use crate::rakp::{Established, Handshake, HandshakeError, Rakp3};
use crate::session::PayloadType;
use crate::set_session_privilege_level::SetSessionPrivilegeLevel;

fn bmc() -> Bmc {
    let mut c = BmcConfig::suite_17("bmc7", "pw-of-bmc7");
    c.keep_events = true;
    Bmc::with_seed(c, [1; 32])
}

fn clear(t: PayloadType, payload: &[u8]) -> Vec<u8> {
    session::encode_v2(t, 0, 0, payload, None, [0; 16])
}

/// The payload of a cleartext answer.
fn payload(reply: Option<Vec<u8>>) -> Vec<u8> {
    session::decode(&reply.expect("an answer"), None)
        .expect("a cleartext answer")
        .payload
}

fn handshake(suite: u8, user: &str, password: &str) -> Handshake {
    Handshake::new(
        CipherSuite::from_id(suite).unwrap(),
        user.as_bytes(),
        password.as_bytes(),
        Privilege::Administrator,
        0x1234_5679,
        [7; 16],
        5,
    )
    .unwrap()
}

/// Open Session and RAKP 1 to 4, as `palisade-fence` runs them.
fn login(
    bmc: &mut Bmc,
    suite: u8,
    user: &str,
    password: &str,
) -> Result<Established, HandshakeError> {
    let mut hs = handshake(suite, user, password);
    let osr = clear(PayloadType::OpenSessionRequest, &hs.open_session_request());
    hs.accept_open_session(&payload(bmc.handle(&osr)))?;
    let r1 = clear(PayloadType::Rakp1, &hs.rakp1());
    let r3 = hs.accept_rakp2(&payload(bmc.handle(&r1)))?;
    let r3 = clear(PayloadType::Rakp3, &r3);
    hs.accept_rakp4(&payload(bmc.handle(&r3)))
}

/// The datagram of `cmd` in the session, with sequence number `seq`.
fn datagram<C: Command>(est: &Established, seq: u32, cmd: &C) -> Vec<u8> {
    let msg = cmd.request(seq as u8 & 0x3f).encode();
    session::encode_v2(
        PayloadType::Ipmi,
        est.bmc_session_id,
        seq,
        &msg,
        Some(&est.keys),
        [9; 16],
    )
}

/// Sends `cmd` in the session and reads the answer, which must be encrypted and
/// authenticated and addressed to the console's session.
fn send<C: Command>(bmc: &mut Bmc, est: &Established, seq: u32, cmd: &C) -> Outcome<C::Output> {
    let reply = bmc.handle(&datagram(est, seq, cmd)).expect("an answer");
    let p = session::decode(&reply, Some(&est.keys)).unwrap();
    assert!(p.encrypted && p.authenticated);
    assert_eq!(p.session_id, est.console_session_id);
    parse_response::<C>(&Response::decode(&p.payload).unwrap()).unwrap()
}

#[test]
fn a_console_logs_in_with_suite_17_reads_the_power_encrypted_and_closes() {
    let mut b = bmc();
    let est = login(&mut b, 17, "bmc7", "pw-of-bmc7").unwrap();
    assert_eq!(est.keys.suite().id, 17);
    let Outcome::Ok(st) = send(&mut b, &est, 1, &GetChassisStatus) else {
        panic!("refused")
    };
    assert!(st.power_on);
    b.set_power(false);
    let Outcome::Ok(st) = send(&mut b, &est, 2, &GetChassisStatus) else {
        panic!("refused")
    };
    assert!(!st.power_on);
    let close = CloseSession {
        session_id: est.bmc_session_id,
    };
    assert_eq!(send(&mut b, &est, 3, &close), Outcome::Ok(()));
    assert_eq!(b.open_sessions(), 0);
    let r = b.record();
    assert_eq!(
        (r.sessions_established, r.sessions_closed, r.status_reads),
        (1, 1, 2)
    );
    assert_eq!(r.open_session_suites(), vec![17]);
    assert_eq!(r.events.last(), Some(&Event::CloseSession));
}

#[test]
fn chassis_control_needs_operator_privilege_which_the_session_must_raise() {
    let mut b = bmc();
    let est = login(&mut b, 17, "bmc7", "pw-of-bmc7").unwrap();
    assert_eq!(
        send(&mut b, &est, 1, &ChassisControl::PowerDown),
        Outcome::CompletionCode(0xd4)
    );
    assert!(b.power_on());
    assert_eq!(
        send(
            &mut b,
            &est,
            2,
            &SetSessionPrivilegeLevel(Privilege::Administrator)
        ),
        Outcome::Ok(4)
    );
    assert_eq!(
        send(&mut b, &est, 3, &ChassisControl::PowerDown),
        Outcome::Ok(())
    );
    assert!(!b.power_on());
}

#[test]
fn a_wrong_password_fails_at_rakp2_and_a_forged_rakp3_is_refused() {
    let mut b = bmc();
    assert_eq!(
        login(&mut b, 17, "bmc7", "not-the-password").unwrap_err(),
        HandshakeError::AuthCodeMismatch { stage: "RAKP2" }
    );
    // A console that goes on without knowing the password: its RAKP3 does not verify.
    let mut hs = handshake(17, "bmc7", "not-the-password");
    let osr = clear(PayloadType::OpenSessionRequest, &hs.open_session_request());
    hs.accept_open_session(&payload(b.handle(&osr))).unwrap();
    let _ = b.handle(&clear(PayloadType::Rakp1, &hs.rakp1()));
    let forged = Rakp3 {
        tag: 5,
        status: 0,
        bmc_session_id: hs.bmc_session_id(),
        auth_code: vec![0; 32],
    };
    let r4 = payload(b.handle(&clear(PayloadType::Rakp3, &forged.encode())));
    assert_eq!(r4[1], 0x0f, "invalid integrity check value");
    // The forged session is dropped; the first console never aborted, so its half-open
    // session stays (a BMC's own timeout would end it).
    assert_eq!(b.open_sessions(), 1);
    assert_eq!(b.record().sessions_established, 0);
}

#[test]
fn an_unknown_user_is_refused_at_rakp1() {
    let mut b = bmc();
    assert_eq!(
        login(&mut b, 17, "root", "pw-of-bmc7").unwrap_err(),
        HandshakeError::Status {
            stage: "RAKP2",
            code: 0x0d
        }
    );
    assert_eq!(b.open_sessions(), 0);
}

#[test]
fn a_replayed_tampered_or_unprotected_command_is_dropped() {
    let mut b = bmc();
    let est = login(&mut b, 17, "bmc7", "pw-of-bmc7").unwrap();
    let d = datagram(&est, 1, &GetChassisStatus);
    assert!(b.handle(&d).is_some());
    assert_eq!(b.handle(&d), None, "replayed");
    let mut bad = datagram(&est, 2, &GetChassisStatus);
    bad[20] ^= 1;
    assert_eq!(b.handle(&bad), None, "tampered");
    let plain = session::encode_v2(
        PayloadType::Ipmi,
        est.bmc_session_id,
        3,
        &GetChassisStatus.request(3).encode(),
        None,
        [0; 16],
    );
    assert_eq!(b.handle(&plain), None, "without integrity or encryption");
    // Out of order but within the window: still accepted.
    assert!(b.handle(&datagram(&est, 9, &GetChassisStatus)).is_some());
    assert!(b.handle(&datagram(&est, 4, &GetChassisStatus)).is_some());
    assert_eq!(b.record().dropped, 3);
}

#[test]
fn a_suite_it_does_not_list_is_refused_and_sessions_are_bounded() {
    let mut b = bmc();
    assert_eq!(
        login(&mut b, 3, "bmc7", "pw-of-bmc7").unwrap_err(),
        HandshakeError::Status {
            stage: "Open Session",
            code: 0x11
        }
    );
    for _ in 0..8 {
        let hs = handshake(17, "bmc7", "pw-of-bmc7");
        let osr = clear(PayloadType::OpenSessionRequest, &hs.open_session_request());
        assert_eq!(payload(b.handle(&osr))[1], 0, "accepted");
    }
    let err = login(&mut b, 17, "bmc7", "pw-of-bmc7").unwrap_err();
    assert_eq!(
        err,
        HandshakeError::Status {
            stage: "Open Session",
            code: 0x01
        }
    );
}

#[test]
fn cipher_suites_are_listed_in_chunks_of_16_bytes() {
    let mut c = BmcConfig::suite_17("u", "p");
    c.suites = vec![3, 17, 16, 2];
    let mut b = Bmc::with_seed(c, [2; 32]);
    let mut records = Vec::new();
    for index in 0..2 {
        let req = GetChannelCipherSuites {
            channel: 0x0e,
            index,
        }
        .request(index);
        let reply = payload(b.handle(&clear(PayloadType::Ipmi, &req.encode())));
        let resp = Response::decode(&reply).unwrap();
        let Outcome::Ok(chunk) = parse_response::<GetChannelCipherSuites>(&resp).unwrap() else {
            panic!("refused")
        };
        assert_eq!(chunk.records.len(), [16, 4][usize::from(index)]);
        records.extend(chunk.records);
    }
    assert_eq!(parse_suite_ids(&records).unwrap(), vec![3, 17, 16, 2]);
}
