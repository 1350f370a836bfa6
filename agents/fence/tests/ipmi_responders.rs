//! The IPMI backend against small UDP responders written here: a BMC that offers only weak
//! cipher suites, a BMC that rejects every strong suite at Open Session, one that answers
//! with garbage, one that answers Open Session with another suite's algorithms (as pyghmi
//! does), one 150 ms away, and a dead port. These are cases `ipmi_sim` cannot produce.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::device::{Credentials, DeviceOptions, PowerDevice};
use palisade_fence::target::{IpmiTarget, Target};
use palisade_fence::{Device, FenceError, PowerState, Secret};
use palisade_ipmi::crypto::{user_key, SessionKeys};
use palisade_ipmi::get_channel_cipher_suites::encode_records;
use palisade_ipmi::message::{Request, Response};
use palisade_ipmi::open_session::{decode_request, OpenSessionResponse};
use palisade_ipmi::rakp::{rakp2_auth_code, rakp4_icv, sik, Rakp1, Rakp2, Rakp4};
use palisade_ipmi::session::{self, PayloadType};
use palisade_ipmi::CipherSuite;
use parking_lot::Mutex;
use tokio::net::UdpSocket;

const PASSWORD: &str = "s3cret";

#[derive(Default)]
struct Seen {
    open_session_suites: Vec<u8>,
    datagrams: usize,
    /// What arrived, in order: "auth-cap-v1.5", "auth-cap-v2", "cipher-suites", "open",
    /// "close".
    log: Vec<&'static str>,
}

#[derive(Clone, Copy)]
enum Behaviour {
    /// Lists only the given suites in Get Channel Cipher Suites and accepts whatever is
    /// proposed at Open Session (a BMC configured with weak suites only).
    Offers(&'static [u8]),
    /// Never answers Get Channel Cipher Suites and rejects every suite with status 0x11.
    RejectsAll,
    /// Answers every datagram with bytes that are not valid IPMI.
    Garbage,
    /// Offers suite 3 but holds another password for the user.
    OtherPassword,
    /// Never answers Get Channel Cipher Suites and accepts every Open Session with the
    /// algorithms of this suite, whatever was proposed (pyghmi answers with suite 3).
    Substitutes(u8),
}

/// A minimal BMC: enough of RMCP+ for a status read.
async fn responder(behaviour: Behaviour) -> (SocketAddr, Arc<Mutex<Seen>>) {
    responder_with(behaviour, Duration::ZERO).await
}

/// A minimal BMC whose every answer leaves `latency` after the request arrived.
async fn responder_with(behaviour: Behaviour, latency: Duration) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        let mut state: Option<(u32, u32, CipherSuite)> = None; // console sid, bmc sid, suite
        let mut rakp: Option<(Vec<u8>, [u8; 16])> = None; // SIK, Rm
        let mut keys: Option<SessionKeys> = None;
        let mut out_seq = 0u32;
        let guid = [0x42u8; 16];
        let rc = [0x24u8; 16];
        let kuid = user_key(match behaviour {
            Behaviour::OtherPassword => b"something-else".as_slice(),
            _ => PASSWORD.as_bytes(),
        });
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            seen2.lock().datagrams += 1;
            let d = &buf[..n];
            if let Behaviour::Garbage = behaviour {
                let mut junk = vec![0x06, 0x00, 0xff, 0x07, 0x06, 0xc0];
                junk.extend_from_slice(&d[..d.len().min(40)]);
                let _ = sock.send_to(&junk, peer).await;
                let _ = sock.send_to(&[0xde, 0xad], peer).await;
                continue;
            }
            let Ok(p) = session::decode(d, keys.as_ref()) else {
                continue;
            };
            let v15 = d.get(4) == Some(&session::AUTH_TYPE_NONE);
            let reply = match p.payload_type {
                PayloadType::Ipmi => {
                    let Ok(req) = Request::decode(&p.payload) else {
                        continue;
                    };
                    seen2.lock().log.push(match (req.netfn, req.cmd, v15) {
                        (6, 0x38, true) => "auth-cap-v1.5",
                        (6, 0x38, false) => "auth-cap-v2",
                        (6, 0x54, _) => "cipher-suites",
                        (6, 0x3c, _) => "close",
                        _ => "command",
                    });
                    let data = match (req.netfn, req.cmd) {
                        // Channel 1, none/MD2/MD5/password, v1.5 and v2.0.
                        (6, 0x38) => vec![0x01, 0x97, 0x04, 0x03, 0, 0, 0, 0],
                        (6, 0x54) => match behaviour {
                            Behaviour::Offers(_) | Behaviour::OtherPassword => {
                                let ids: &[u8] = if let Behaviour::Offers(ids) = behaviour {
                                    ids
                                } else {
                                    &[3]
                                };
                                let suites: Vec<_> = ids
                                    .iter()
                                    .map(|i| CipherSuite::from_id(*i).unwrap())
                                    .collect();
                                let mut d = vec![1];
                                d.extend(encode_records(&suites));
                                d
                            }
                            _ => continue,
                        },
                        (6, 0x3b) => vec![4],
                        (0, 0x01) => vec![0x01, 0x00, 0x00],
                        (6, 0x3c) => vec![],
                        _ => continue,
                    };
                    let resp = Response {
                        netfn: req.netfn | 1,
                        cmd: req.cmd,
                        rq_seq: req.rq_seq,
                        completion_code: 0,
                        data,
                    }
                    .encode();
                    if v15 {
                        // Pre-session requests in v1.5 framing get v1.5 answers.
                        tokio::time::sleep(latency).await;
                        let _ = sock.send_to(&session::encode_v15(0, 0, &resp), peer).await;
                        continue;
                    }
                    let sid = state.map(|s| s.0).unwrap_or(0);
                    out_seq += u32::from(keys.is_some());
                    session::encode_v2(
                        PayloadType::Ipmi,
                        sid,
                        out_seq,
                        &resp,
                        keys.as_ref(),
                        [7; 16],
                    )
                }
                PayloadType::OpenSessionRequest => {
                    let Ok(req) = decode_request(&p.payload) else {
                        continue;
                    };
                    seen2.lock().open_session_suites.push(req.suite.id);
                    seen2.lock().log.push("open");
                    let accept = matches!(
                        behaviour,
                        Behaviour::Offers(_) | Behaviour::OtherPassword | Behaviour::Substitutes(_)
                    );
                    let suite = match behaviour {
                        Behaviour::Substitutes(id) => CipherSuite::from_id(id).unwrap(),
                        _ => req.suite,
                    };
                    state = Some((req.console_session_id, 0x5000_0001, suite));
                    let resp = OpenSessionResponse {
                        tag: req.tag,
                        status: if accept { 0 } else { 0x11 },
                        max_privilege: 4,
                        console_session_id: req.console_session_id,
                        bmc_session_id: 0x5000_0001,
                        suite: accept.then_some(suite),
                    };
                    session::encode_v2(
                        PayloadType::OpenSessionResponse,
                        0,
                        0,
                        &resp.encode(),
                        None,
                        [0; 16],
                    )
                }
                PayloadType::Rakp1 => {
                    let (Ok(r1), Some((csid, bsid, suite))) = (Rakp1::decode(&p.payload), state)
                    else {
                        continue;
                    };
                    let code = rakp2_auth_code(
                        suite.auth,
                        &kuid,
                        csid,
                        bsid,
                        &r1.console_random,
                        &rc,
                        &guid,
                        r1.role,
                        &r1.username,
                    );
                    let s = sik(
                        suite.auth,
                        &kuid,
                        &r1.console_random,
                        &rc,
                        r1.role,
                        &r1.username,
                    );
                    rakp = Some((s, r1.console_random));
                    let r2 = Rakp2 {
                        tag: r1.tag,
                        status: 0,
                        console_session_id: csid,
                        bmc_random: rc,
                        guid,
                        auth_code: code,
                    };
                    session::encode_v2(PayloadType::Rakp2, 0, 0, &r2.encode(), None, [0; 16])
                }
                PayloadType::Rakp3 => {
                    let (Some((csid, bsid, suite)), Some((s, rm))) = (state, rakp.clone()) else {
                        continue;
                    };
                    keys = Some(SessionKeys::derive(suite, &s));
                    let r4 = Rakp4 {
                        tag: p.payload[0],
                        status: 0,
                        console_session_id: csid,
                        icv: rakp4_icv(suite.auth, &s, &rm, bsid, &guid),
                    };
                    session::encode_v2(PayloadType::Rakp4, 0, 0, &r4.encode(), None, [0; 16])
                }
                _ => continue,
            };
            if !latency.is_zero() {
                // The emulated distance to the BMC, not a wait for anything.
                tokio::time::sleep(latency).await;
            }
            let _ = sock.send_to(&reply, peer).await;
        }
    });
    (addr, seen)
}

fn device(addr: SocketAddr, allow_weak: bool) -> Device {
    device_with(addr, allow_weak, None, Duration::from_millis(200))
}

fn device_with(
    addr: SocketAddr,
    allow_weak: bool,
    cipher: Option<u8>,
    exchange_timeout: Duration,
) -> Device {
    let creds = Credentials {
        password: Some(Secret::new(PASSWORD)),
        ..Default::default()
    };
    let opts = DeviceOptions {
        exchange_timeout,
        retries: 2,
        cipher_probe_timeout: Duration::from_millis(100),
        ..Default::default()
    };
    Device::new(
        Target::Ipmi(IpmiTarget {
            host: addr.ip().to_string(),
            port: addr.port(),
            username: "admin".into(),
            cipher,
            allow_weak_cipher_suites: allow_weak,
            system_guid: None,
        }),
        &creds,
        opts,
    )
    .unwrap()
}

#[tokio::test]
async fn a_bmc_offering_only_weak_suites_is_refused_without_opening_a_session() {
    let (addr, seen) = responder(Behaviour::Offers(&[0, 1, 2])).await;
    let err = device(addr, false).status().await.unwrap_err();
    match err {
        FenceError::NoAcceptableCipherSuite { offered, .. } => assert_eq!(offered, vec![0, 1, 2]),
        other => panic!("expected NoAcceptableCipherSuite, got {other}"),
    }
    assert!(seen.lock().open_session_suites.is_empty());
}

#[tokio::test]
async fn weak_suites_are_used_only_when_explicitly_allowed() {
    let (addr, seen) = responder(Behaviour::Offers(&[0, 1, 2])).await;
    let d = device(addr, true);
    assert_eq!(d.status().await.unwrap(), PowerState::On);
    // The strongest offered weak suite (2: SHA1 auth + integrity, no encryption) was chosen.
    assert_eq!(seen.lock().open_session_suites, vec![2]);
}

#[tokio::test]
async fn a_bmc_rejecting_17_and_3_is_refused_after_one_try_each() {
    let (addr, seen) = responder(Behaviour::RejectsAll).await;
    let err = device(addr, false).status().await.unwrap_err();
    assert_eq!(err.kind(), "no_acceptable_cipher_suite", "{err}");
    assert_eq!(seen.lock().open_session_suites, vec![17, 3]);
}

#[tokio::test]
async fn a_garbage_responder_gives_a_clean_protocol_error() {
    let (addr, seen) = responder(Behaviour::Garbage).await;
    let err = device(addr, false).status().await.unwrap_err();
    assert_eq!(err.kind(), "protocol", "{err}");
    assert!(!err.is_retryable());
    // Bounded: the cipher probe plus at most 3 transmissions of one Open Session.
    assert!(seen.lock().datagrams <= 4, "{}", seen.lock().datagrams);
}

#[tokio::test]
async fn a_dead_port_gives_a_timeout_error() {
    let port = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let err = device(addr, false).status().await.unwrap_err();
    assert_eq!(err.kind(), "timeout", "{err}");
    assert!(err.is_retryable());
}

#[tokio::test]
async fn a_wrong_password_fails_once_without_retransmissions() {
    let (addr, seen) = responder(Behaviour::OtherPassword).await;
    let err = device(addr, false).off().await.unwrap_err();
    assert_eq!(err.kind(), "auth_refused", "{err}");
    // Auth capabilities, cipher probe, Open Session, RAKP1, and the RAKP3 that aborts the
    // half-open session: one datagram each, no retries, no second login. Every exchange
    // completes before `off` returns; only the fire-and-forget abort may still be in flight,
    // so wait for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while seen.lock().datagrams < 5 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = seen.lock();
    assert_eq!(seen.open_session_suites, vec![3]);
    assert_eq!(seen.datagrams, 5);
}

#[tokio::test]
async fn every_session_starts_with_v15_auth_capabilities_and_ends_with_close_session() {
    let (addr, seen) = responder(Behaviour::Offers(&[3, 17])).await;
    let d = device(addr, false);
    for _ in 0..3 {
        assert_eq!(d.status().await.unwrap(), PowerState::On);
    }
    let log = seen.lock().log.clone();
    // Split the log into sessions at each Open Session: each one is preceded by a v1.5 Get
    // Channel Authentication Capabilities since the previous session's Close Session.
    let mut since_close: Vec<&str> = Vec::new();
    let (mut opens, mut closes) = (0, 0);
    for e in &log {
        match *e {
            "open" => {
                assert!(
                    since_close.contains(&"auth-cap-v1.5"),
                    "an Open Session without a v1.5 auth capabilities first: {log:?}"
                );
                opens += 1;
            }
            "close" => {
                closes += 1;
                since_close.clear();
            }
            other => since_close.push(other),
        }
    }
    assert_eq!((opens, closes), (3, 3), "{log:?}");
    assert!(!log.contains(&"auth-cap-v2"), "{log:?}");
    assert_eq!(log.first(), Some(&"auth-cap-v1.5"), "{log:?}");
}

#[tokio::test]
async fn a_session_that_fails_after_login_is_still_closed() {
    let (addr, seen) = responder(Behaviour::Offers(&[3])).await;
    let Device::Ipmi(d) = device(addr, false) else {
        panic!()
    };
    // Power Down is not implemented by the responder: no answer, a timeout, then the close.
    let err = d
        .chassis_control(palisade_ipmi::chassis_control::ChassisControl::PowerDown)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "timeout", "{err}");
    let log = seen.lock().log.clone();
    assert_eq!(log.last(), Some(&"close"), "{log:?}");
}

#[tokio::test]
async fn a_bmc_answering_with_suite_3_algorithms_is_followed_to_suite_3() {
    let (addr, seen) = responder(Behaviour::Substitutes(3)).await;
    let d = device(addr, false);
    assert_eq!(d.status().await.unwrap(), PowerState::On);
    let Device::Ipmi(i) = &d else { panic!() };
    assert_eq!(i.negotiated_suite(), Some(3));
    // One proposal (17), followed to the answered suite 3: no second Open Session.
    assert_eq!(seen.lock().open_session_suites, vec![17]);
}

#[tokio::test]
async fn a_substituted_suite_is_refused_by_name_when_a_suite_is_configured() {
    let (addr, _) = responder(Behaviour::Substitutes(3)).await;
    let err = device_with(addr, false, Some(17), Duration::from_millis(200))
        .status()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("proposed cipher suite 17, the BMC answered with the algorithms of suite 3 instead of refusing; not used: suite 3 is not the configured cipher=17"),
        "{err}"
    );
}

#[tokio::test]
async fn a_weak_substituted_suite_is_refused_unless_allowed() {
    let (addr, _) = responder(Behaviour::Substitutes(2)).await;
    let err = device(addr, false).status().await.unwrap_err();
    assert_eq!(err.kind(), "device_refused", "{err}");
    assert!(err.to_string().contains("suite 2 is weak"), "{err}");
    let (addr, _) = responder(Behaviour::Substitutes(2)).await;
    assert_eq!(
        device(addr, true).status().await.unwrap(),
        PowerState::On,
        "allowed explicitly"
    );
}

#[tokio::test]
async fn a_bmc_150_ms_away_has_its_cipher_suite_list_read_not_skipped() {
    // The BMC lists only suite 3 but would accept 17 at Open Session: proposing 17 means the
    // list was not waited for.
    let (addr, seen) = responder_with(Behaviour::Offers(&[3]), Duration::from_millis(150)).await;
    let d = device_with(addr, false, None, Duration::from_secs(1));
    assert_eq!(d.status().await.unwrap(), PowerState::On);
    let log = seen.lock().log.clone();
    assert_eq!(seen.lock().open_session_suites, vec![3], "{log:?}");
}
