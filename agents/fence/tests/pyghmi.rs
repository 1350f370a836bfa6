//! The IPMI backend against a BMC no one here wrote: pyghmi's (the base of virtualbmc, which
//! OpenStack and Metal3 labs use), installed by `hack/install-deps.sh` into a cached
//! virtualenv and run by `tests/peers/pyghmi_bmc.py`.
//!
//! pyghmi keeps one session per client address and port and never expires it; it forgets a
//! stale one only when a session starts with an IPMI v1.5 Get Channel Authentication
//! Capabilities. It also answers Open Session with suite 3's algorithms whatever is
//! proposed. The relays here make both matter: one sends every client through a single
//! source port (as NAT and the bridge's own relays do), the other adds 150 ms of round trip
//! on top.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::device::{Credentials, DeviceOptions, PowerDevice};
use palisade_fence::target::{IpmiTarget, Target};
use palisade_fence::{Device, PowerState, Secret};
use parking_lot::Mutex;
use tokio::net::UdpSocket;

const PYGHMI_VERSION: &str = "1.6.19";
const USER: &str = "admin";
const PASSWORD: &str = "pyghmi-s3cret";

/// The virtualenv `hack/install-deps.sh` builds for pyghmi.
fn pyghmi_venv() -> PathBuf {
    if let Some(v) = std::env::var_os("PALISADE_PYGHMI_VENV") {
        return PathBuf::from(v);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"))
        .join("palisade")
        .join(format!("pyghmi-{PYGHMI_VERSION}"))
}

/// A running pyghmi BMC on a loopback UDP port; killed on drop.
struct Pyghmi {
    child: Child,
    addr: SocketAddr,
}

impl Pyghmi {
    fn start() -> Self {
        let python = pyghmi_venv().join("bin/python");
        assert!(
            python.exists(),
            "{} is missing: hack/install-deps.sh installs pyghmi",
            python.display()
        );
        // A free port: the BMC binds it itself once we let it go.
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .unwrap()
            .port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/pyghmi_bmc.py");
        let mut child = Command::new(python)
            .args([script, &port.to_string(), USER, PASSWORD])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the pyghmi BMC did not start");
        Self {
            child,
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
        }
    }
}

impl Drop for Pyghmi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A UDP relay in front of `bmc` that sends every client through one source port (so the BMC
/// sees each new client as the previous one) and delays each datagram by `one_way` in each
/// direction. Answers go to the client that spoke last. Returns the address clients use.
async fn same_port_relay(bmc: SocketAddr, one_way: Duration) -> SocketAddr {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    back.connect(bmc).await.unwrap();
    let addr = front.local_addr().unwrap();
    let client: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let delayed = move |sock: Arc<UdpSocket>, to: Option<SocketAddr>, d: Vec<u8>| async move {
        if !one_way.is_zero() {
            // The emulated distance, not a wait for anything.
            tokio::time::sleep(one_way).await;
        }
        let _ = match to {
            Some(to) => sock.send_to(&d, to).await,
            None => sock.send(&d).await,
        };
    };
    {
        let (front, back, client) = (front.clone(), back.clone(), client.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            while let Ok((n, from)) = front.recv_from(&mut buf).await {
                *client.lock() = Some(from);
                tokio::spawn(delayed(back.clone(), None, buf[..n].to_vec()));
            }
        });
    }
    tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        while let Ok(n) = back.recv(&mut buf).await {
            let to = *client.lock();
            if to.is_some() {
                tokio::spawn(delayed(front.clone(), to, buf[..n].to_vec()));
            }
        }
    });
    addr
}

fn device(addr: SocketAddr) -> Device {
    let creds = Credentials {
        password: Some(Secret::new(PASSWORD)),
        ..Default::default()
    };
    Device::new(
        Target::Ipmi(IpmiTarget {
            host: addr.ip().to_string(),
            port: addr.port(),
            username: USER.into(),
            cipher: None,
            allow_weak_cipher_suites: false,
            system_guid: None,
        }),
        &creds,
        DeviceOptions::default(),
    )
    .unwrap()
}

/// `reads` status reads, then `cycles` verified off / on cycles, each in its own session (a
/// fresh device each time, as separate CLI runs are).
async fn exercise(addr: SocketAddr, reads: usize, cycles: usize) {
    for i in 0..reads {
        let s = device(addr).status().await;
        assert!(
            matches!(s, Ok(PowerState::On)),
            "status read {} of {reads}: {s:?}",
            i + 1
        );
    }
    for i in 0..cycles {
        let d = device(addr);
        let off = d.off().await;
        assert!(off.is_ok(), "off {} of {cycles}: {off:?}", i + 1);
        let on = d.on().await;
        assert!(on.is_ok(), "on {} of {cycles}: {on:?}", i + 1);
    }
    let Device::Ipmi(d) = device(addr) else {
        panic!()
    };
    d.status().await.unwrap();
    // pyghmi offers suite 3 only, whatever is proposed: followed, never refused.
    assert_eq!(d.negotiated_suite(), Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_reads_and_twenty_off_on_cycles_on_loopback() {
    let bmc = Pyghmi::start();
    exercise(bmc.addr, 200, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_reads_and_twenty_off_on_cycles_through_a_relay_that_keeps_the_source_port() {
    let bmc = Pyghmi::start();
    let relay = same_port_relay(bmc.addr, Duration::ZERO).await;
    exercise(relay, 200, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_off_on_cycles_150_ms_away_through_the_same_port() {
    let bmc = Pyghmi::start();
    let relay = same_port_relay(bmc.addr, Duration::from_millis(75)).await;
    // The suite samples 20 reads and 3 cycles; `PALISADE_PYGHMI_FULL=1` runs the whole 200
    // and 20 (several minutes at 150 ms a round trip).
    let (reads, cycles) = if std::env::var("PALISADE_PYGHMI_FULL").is_ok_and(|v| v == "1") {
        (200, 20)
    } else {
        (20, 3)
    };
    exercise(relay, reads, cycles).await;
}
