//! The IPMI backend against small UDP BMCs (`palisade_ipmi::responder`, the one the power
//! watch bench serves a thousand of): a BMC that offers only weak cipher suites, a BMC that
//! rejects every strong suite at Open Session, one that answers Open Session with another
//! suite's algorithms (as pyghmi does), one that never answers Chassis Control, one 150 ms
//! away; and, written here, a responder that answers with garbage and a dead port. These are
//! cases `ipmi_sim` cannot produce.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::device::{Credentials, DeviceOptions, PowerDevice};
use palisade_fence::target::{IpmiTarget, Target};
use palisade_fence::{Device, FenceError, PowerState, Secret};
use palisade_ipmi::responder::udp::Responder;
use palisade_ipmi::responder::{Bmc, BmcConfig, Event, OpenSessionPolicy};
use tokio::net::UdpSocket;

const PASSWORD: &str = "s3cret";

#[derive(Clone, Copy)]
enum Behaviour {
    /// Lists only the given suites in Get Channel Cipher Suites and accepts whatever is
    /// proposed at Open Session (a BMC configured with weak suites only).
    Offers(&'static [u8]),
    /// Never answers Get Channel Cipher Suites and rejects every suite with status 0x11.
    RejectsAll,
    /// Offers suite 3 but holds another password for the user.
    OtherPassword,
    /// Never answers Get Channel Cipher Suites and accepts every Open Session with the
    /// algorithms of this suite, whatever was proposed (pyghmi answers with suite 3).
    Substitutes(u8),
    /// Offers suite 3 and never answers Chassis Control.
    HangsAtChassisControl,
}

impl Behaviour {
    /// The BMC (user `admin`, every event kept) that behaves so.
    fn config(self) -> BmcConfig {
        let mut c = BmcConfig::suite_17("admin", PASSWORD);
        c.keep_events = true;
        c.open_session = OpenSessionPolicy::Any;
        match self {
            Behaviour::Offers(ids) => c.suites = ids.to_vec(),
            Behaviour::RejectsAll => {
                c.lists_suites = false;
                c.open_session = OpenSessionPolicy::None;
            }
            Behaviour::OtherPassword => {
                c.suites = vec![3];
                c.password = b"something-else".to_vec();
            }
            Behaviour::Substitutes(id) => {
                c.lists_suites = false;
                c.open_session = OpenSessionPolicy::Substitute(id);
            }
            Behaviour::HangsAtChassisControl => {
                c.suites = vec![3];
                c.answers_chassis_control = false;
            }
        }
        c
    }
}

/// A BMC (`palisade_ipmi::responder`) that behaves as told.
async fn responder(behaviour: Behaviour) -> Responder {
    responder_with(behaviour, Duration::ZERO).await
}

/// A BMC whose every answer leaves `latency` after the request arrived.
async fn responder_with(behaviour: Behaviour, latency: Duration) -> Responder {
    let any = "127.0.0.1:0".parse().unwrap();
    Responder::bind_with_latency(any, Bmc::new(behaviour.config()), latency)
        .await
        .unwrap()
}

/// Not a BMC: answers every datagram with bytes that are not valid IPMI. Returns its address
/// and how many datagrams it received.
async fn garbage_responder() -> (SocketAddr, Arc<AtomicUsize>) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let datagrams = Arc::new(AtomicUsize::new(0));
    let seen = datagrams.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
            seen.fetch_add(1, Ordering::SeqCst);
            let mut junk = vec![0x06, 0x00, 0xff, 0x07, 0x06, 0xc0];
            junk.extend_from_slice(&buf[..n.min(40)]);
            let _ = sock.send_to(&junk, peer).await;
            let _ = sock.send_to(&[0xde, 0xad], peer).await;
        }
    });
    (addr, datagrams)
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
    let bmc = responder(Behaviour::Offers(&[0, 1, 2])).await;
    let err = device(bmc.addr(), false).status().await.unwrap_err();
    match err {
        FenceError::NoAcceptableCipherSuite { offered, .. } => assert_eq!(offered, vec![0, 1, 2]),
        other => panic!("expected NoAcceptableCipherSuite, got {other}"),
    }
    assert!(bmc.record().open_session_suites().is_empty());
}

#[tokio::test]
async fn weak_suites_are_used_only_when_explicitly_allowed() {
    let bmc = responder(Behaviour::Offers(&[0, 1, 2])).await;
    let d = device(bmc.addr(), true);
    assert_eq!(d.status().await.unwrap(), PowerState::On);
    // The strongest offered weak suite (2: SHA1 auth + integrity, no encryption) was chosen.
    assert_eq!(bmc.record().open_session_suites(), vec![2]);
}

#[tokio::test]
async fn a_bmc_rejecting_17_and_3_is_refused_after_one_try_each() {
    let bmc = responder(Behaviour::RejectsAll).await;
    let err = device(bmc.addr(), false).status().await.unwrap_err();
    assert_eq!(err.kind(), "no_acceptable_cipher_suite", "{err}");
    assert_eq!(bmc.record().open_session_suites(), vec![17, 3]);
}

#[tokio::test]
async fn a_garbage_responder_gives_a_clean_protocol_error() {
    let (addr, datagrams) = garbage_responder().await;
    let err = device(addr, false).status().await.unwrap_err();
    assert_eq!(err.kind(), "protocol", "{err}");
    assert!(!err.is_retryable());
    // Bounded: the cipher probe plus at most 3 transmissions of one Open Session.
    let n = datagrams.load(Ordering::SeqCst);
    assert!(n <= 4, "{n}");
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
    let bmc = responder(Behaviour::OtherPassword).await;
    let err = device(bmc.addr(), false).off().await.unwrap_err();
    assert_eq!(err.kind(), "auth_refused", "{err}");
    // Auth capabilities, cipher probe, Open Session, RAKP1, and the RAKP3 that aborts the
    // half-open session: one datagram each, no retries, no second login. Every exchange
    // completes before `off` returns; only the fire-and-forget abort may still be in flight,
    // so wait for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while bmc.record().datagrams < 5 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = bmc.record();
    assert_eq!(seen.open_session_suites(), vec![3]);
    assert_eq!(seen.datagrams, 5);
    // The abort dropped the half-open session.
    assert_eq!(bmc.lock().open_sessions(), 0);
}

#[tokio::test]
async fn every_session_starts_with_v15_auth_capabilities_and_ends_with_close_session() {
    let bmc = responder(Behaviour::Offers(&[3, 17])).await;
    let d = device(bmc.addr(), false);
    for _ in 0..3 {
        assert_eq!(d.status().await.unwrap(), PowerState::On);
    }
    let log = bmc.record().events;
    // Split the log into sessions at each Open Session: each one is preceded by a v1.5 Get
    // Channel Authentication Capabilities since the previous session's Close Session.
    let mut since_close: Vec<Event> = Vec::new();
    let (mut opens, mut closes) = (0, 0);
    for e in &log {
        match e {
            Event::OpenSession { .. } => {
                assert!(
                    since_close.contains(&Event::AuthCapabilitiesV15),
                    "an Open Session without a v1.5 auth capabilities first: {log:?}"
                );
                opens += 1;
            }
            Event::CloseSession => {
                closes += 1;
                since_close.clear();
            }
            other => since_close.push(*other),
        }
    }
    assert_eq!((opens, closes), (3, 3), "{log:?}");
    assert!(!log.contains(&Event::AuthCapabilitiesV2), "{log:?}");
    assert_eq!(log.first(), Some(&Event::AuthCapabilitiesV15), "{log:?}");
    assert_eq!(bmc.lock().open_sessions(), 0);
}

#[tokio::test]
async fn a_session_that_fails_after_login_is_still_closed() {
    let bmc = responder(Behaviour::HangsAtChassisControl).await;
    let Device::Ipmi(d) = device(bmc.addr(), false) else {
        panic!()
    };
    // Power Down is never answered: a timeout, then the close.
    let err = d
        .chassis_control(palisade_ipmi::chassis_control::ChassisControl::PowerDown)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "timeout", "{err}");
    let log = bmc.record().events;
    assert_eq!(log.last(), Some(&Event::CloseSession), "{log:?}");
    assert_eq!(bmc.lock().open_sessions(), 0);
}

#[tokio::test]
async fn a_bmc_answering_with_suite_3_algorithms_is_followed_to_suite_3() {
    let bmc = responder(Behaviour::Substitutes(3)).await;
    let d = device(bmc.addr(), false);
    assert_eq!(d.status().await.unwrap(), PowerState::On);
    let Device::Ipmi(i) = &d else { panic!() };
    assert_eq!(i.negotiated_suite(), Some(3));
    // One proposal (17), followed to the answered suite 3: no second Open Session.
    assert_eq!(bmc.record().open_session_suites(), vec![17]);
}

#[tokio::test]
async fn a_substituted_suite_is_refused_by_name_when_a_suite_is_configured() {
    let bmc = responder(Behaviour::Substitutes(3)).await;
    let err = device_with(bmc.addr(), false, Some(17), Duration::from_millis(200))
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
    let bmc = responder(Behaviour::Substitutes(2)).await;
    let err = device(bmc.addr(), false).status().await.unwrap_err();
    assert_eq!(err.kind(), "device_refused", "{err}");
    assert!(err.to_string().contains("suite 2 is weak"), "{err}");
    let bmc = responder(Behaviour::Substitutes(2)).await;
    assert_eq!(
        device(bmc.addr(), true).status().await.unwrap(),
        PowerState::On,
        "allowed explicitly"
    );
}

#[tokio::test]
async fn a_bmc_150_ms_away_has_its_cipher_suite_list_read_not_skipped() {
    // The BMC lists only suite 3 but would accept 17 at Open Session: proposing 17 means the
    // list was not waited for.
    let bmc = responder_with(Behaviour::Offers(&[3]), Duration::from_millis(150)).await;
    let d = device_with(bmc.addr(), false, None, Duration::from_secs(1));
    assert_eq!(d.status().await.unwrap(), PowerState::On);
    let seen = bmc.record();
    assert_eq!(seen.open_session_suites(), vec![3], "{:?}", seen.events);
}

#[tokio::test]
async fn off_and_on_are_verified_against_a_bmc_that_obeys_chassis_control() {
    let bmc = responder(Behaviour::Offers(&[17])).await;
    let d = device(bmc.addr(), false);
    d.off().await.unwrap();
    assert!(!bmc.lock().power_on());
    assert_eq!(d.status().await.unwrap(), PowerState::Off);
    d.on().await.unwrap();
    assert!(bmc.lock().power_on());
    assert_eq!(bmc.lock().open_sessions(), 0);
}
