//! The Redfish backend against two peers:
//!
//! - sushy-tools' `sushy-emulator` (fake driver, HTTPS with a generated CA, Basic auth from a
//!   bcrypt htpasswd file, 127.0.0.1 only), whose power changes land 0–11 s after the command:
//!   discovery, a verified off and on, refusals, certificate pins and the CLI, and a fence
//!   that really stops a lab machine (sushy's power notifications drive the machine's BMC);
//! - a scripted BMC written here, for what sushy cannot do: sessions (`X-Auth-Token`) and
//!   their logout, a 202 task monitor, a BMC that says OK and stays on, garbage JSON, a
//!   refused ResetType, an error body, a redirect to another host, a huge body, and
//!   cancellation.
//!
//! No test measures time: verification is bounded by the device's timeout, and every wait
//! for the scripted BMC to see something is a bounded poll.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::device::{Credentials, DeviceOptions, PowerDevice};
use palisade_fence::redfish::tls::{fingerprint_of_der, format_fingerprint};
use palisade_fence::target::{RedfishAuth, RedfishTarget, RedfishTls, Target};
use palisade_fence::verify::VerifyPolicy;
use palisade_fence::{Device, FenceError, PowerState, Secret};
use palisade_lab::{Lab, LabConfig, Sushy, SushySystem};
use palisade_test_support::eventually_async;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PASSWORD: &str = "redfish-pw";
const UUID_A: &str = "11111111-1111-1111-1111-111111111111";
const UUID_B: &str = "22222222-2222-2222-2222-222222222222";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Device options: verification long enough for the fake driver's 0–11 s delay on a loaded
/// machine (a bound on the device, not a budget on the test).
fn options(verify_timeout: Duration) -> DeviceOptions {
    DeviceOptions {
        exchange_timeout: Duration::from_secs(5),
        retries: 2,
        verify: VerifyPolicy {
            timeout: verify_timeout,
            interval: Duration::from_millis(500),
        },
        ..Default::default()
    }
}

fn creds(password: &str) -> Credentials {
    Credentials {
        password: Some(Secret::new(password)),
        ..Default::default()
    }
}

fn target(port: u16, tls: RedfishTls) -> RedfishTarget {
    RedfishTarget {
        host: "127.0.0.1".into(),
        port,
        username: "admin".into(),
        systems_uri: None,
        system: None,
        system_uuid: None,
        tls,
        auth: RedfishAuth::Auto,
    }
}

fn device(t: RedfishTarget, password: &str, opts: DeviceOptions) -> Device {
    Device::new(Target::Redfish(t), &creds(password), opts).expect("device builds")
}

// ---------------------------------------------------------------------------------------
// sushy-emulator

fn sushy(dir: &tempfile::TempDir) -> Sushy {
    let systems = [("node-a", UUID_A), ("node-b", UUID_B)].map(|(name, uuid)| SushySystem {
        name: name.into(),
        uuid: uuid.into(),
        power_on: true,
    });
    Sushy::start(&dir.path().join("sushy"), &systems, "admin", PASSWORD)
        .expect("sushy-emulator starts (hack/install-deps.sh installs it)")
}

fn ca_pinned(s: &Sushy) -> RedfishTls {
    RedfishTls::CaFile(s.ca_file())
}

#[test]
fn forced_off_through_sushy_is_verified_by_a_read_of_off_and_on_recovers_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = sushy(&dir);
    let rt = rt();
    let mut t = target(s.port(), ca_pinned(&s));
    t.system_uuid = Some(UUID_A.into());
    let a = device(t, PASSWORD, options(Duration::from_secs(60)));
    let mut tb = target(s.port(), ca_pinned(&s));
    tb.systems_uri = Some(format!("/redfish/v1/Systems/{UUID_B}"));
    let b = device(tb, PASSWORD, options(Duration::from_secs(60)));
    rt.block_on(async {
        assert_eq!(a.status().await.unwrap(), PowerState::On);
        let off = a.off().await.expect("off is verified");
        assert!(off.device().contains("uuid=11111111"), "{}", off.device());
        assert!(off.polls() >= 1 && off.verified_at() >= off.commanded_at());
        assert_eq!(a.status().await.unwrap(), PowerState::Off);
        assert_eq!(
            b.status().await.unwrap(),
            PowerState::On,
            "node-b untouched"
        );
        // Repeating an off on a machine that is off is a success, verified again.
        a.off().await.expect("a second off is verified too");
        a.on().await.expect("on is verified");
        assert_eq!(a.status().await.unwrap(), PowerState::On);
    });
}

#[test]
fn several_sushy_systems_and_none_named_is_refused_before_any_power_action() {
    let dir = tempfile::tempdir().unwrap();
    let s = sushy(&dir);
    let rt = rt();
    let unnamed = device(
        target(s.port(), ca_pinned(&s)),
        PASSWORD,
        options(Duration::from_secs(20)),
    );
    let mut by_name = target(s.port(), ca_pinned(&s));
    by_name.system = Some("node-b".into());
    let by_name = device(by_name, PASSWORD, options(Duration::from_secs(20)));
    let mut wrong_uuid = target(s.port(), ca_pinned(&s));
    wrong_uuid.systems_uri = Some(format!("/redfish/v1/Systems/{UUID_A}"));
    wrong_uuid.system_uuid = Some(UUID_B.into());
    let wrong_uuid = device(wrong_uuid, PASSWORD, options(Duration::from_secs(20)));
    rt.block_on(async {
        let e = unnamed.off().await.unwrap_err();
        assert_eq!(e.kind(), "config", "{e}");
        assert!(e.to_string().contains("2 systems"), "{e}");
        let mut missing = target(s.port(), ca_pinned(&s));
        missing.systems_uri = Some("/redfish/v1/Systems/no-such-system".into());
        let e = device(missing, PASSWORD, options(Duration::from_secs(20)))
            .off()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "device_refused", "{e}");
        assert!(e.to_string().contains("HTTP 404"), "{e}");
        let e = wrong_uuid.off().await.unwrap_err();
        assert_eq!(e.kind(), "identity_mismatch", "{e}");
        let FenceError::IdentityMismatch { found, .. } = &e else {
            panic!("{e}")
        };
        assert!(found.contains(UUID_A), "{found}");
        match by_name {
            Device::Redfish(ref d) => assert_eq!(
                d.system_uri().await.unwrap(),
                format!("/redfish/v1/Systems/{UUID_B}")
            ),
            _ => panic!("not a Redfish device"),
        }
        assert_eq!(by_name.status().await.unwrap(), PowerState::On);
        assert_eq!(
            {
                let mut l = unnamed.list().await.unwrap();
                l.sort();
                l
            },
            [
                (UUID_A.to_string(), "node-a".to_string()),
                (UUID_B.to_string(), "node-b".to_string())
            ],
            "list names what plug may name, even when several systems make discovery refuse"
        );
        let mut a = target(s.port(), ca_pinned(&s));
        a.system = Some(UUID_A.into());
        let a = device(a, PASSWORD, options(Duration::from_secs(20)));
        assert_eq!(
            a.status().await.unwrap(),
            PowerState::On,
            "nothing was sent"
        );
    });
}

#[test]
fn sushy_answers_a_wrong_password_with_auth_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = sushy(&dir);
    let mut t = target(s.port(), ca_pinned(&s));
    t.system = Some("node-a".into());
    let d = device(t, "not-the-password", options(Duration::from_secs(20)));
    let e = rt().block_on(d.off()).unwrap_err();
    assert_eq!(e.kind(), "auth_refused", "{e}");
    assert!(!e.is_retryable());
    assert!(!e.to_string().contains("not-the-password"), "{e}");
}

#[test]
fn sushy_is_trusted_only_through_its_pinned_ca_or_certificate_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let s = sushy(&dir);
    let rt = rt();
    let der = CertificateDer::from_pem_slice(s.cert_pem().as_bytes()).unwrap();
    let real = fingerprint_of_der(&der);
    let other_ca = dir.path().join("other-ca.pem");
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    std::fs::write(&other_ca, other.cert.pem()).unwrap();
    let with = |tls: RedfishTls| {
        let mut t = target(s.port(), tls);
        t.system = Some("node-a".into());
        device(t, PASSWORD, options(Duration::from_secs(20)))
    };
    rt.block_on(async {
        assert_eq!(
            with(RedfishTls::Fingerprint(real)).status().await.unwrap(),
            PowerState::On
        );
        let mut wrong = real;
        wrong[0] ^= 1;
        let e = with(RedfishTls::Fingerprint(wrong))
            .off()
            .await
            .unwrap_err();
        let FenceError::IdentityMismatch { found, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(found, &format_fingerprint(&real));
        let e = with(RedfishTls::CaFile(other_ca.clone()))
            .off()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "identity_mismatch", "{e}");
        assert_eq!(
            with(RedfishTls::Insecure).status().await.unwrap(),
            PowerState::On,
            "ssl_insecure, asked for by name, connects"
        );
    });
    assert!(
        Target::parse(&format!("redfish+https://admin@127.0.0.1:{}", s.port())).is_err(),
        "no trust named: refused before connecting"
    );
}

/// sushy's libvirt backend on libvirt's in-process test driver: the same Redfish surface,
/// with power changes that land at once (the first read after the command sees them).
#[test]
fn libvirt_backed_sushy_is_fenced_on_the_first_read_and_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let systems = [("node-a", UUID_A), ("node-b", UUID_B)].map(|(name, uuid)| SushySystem {
        name: name.into(),
        uuid: uuid.into(),
        power_on: true,
    });
    let s = Sushy::start_libvirt(&dir.path().join("sushy"), &systems, "admin", PASSWORD)
        .expect("sushy-emulator starts on libvirt's test driver (python3-libvirt)");
    let with = |uuid: &str| {
        let mut t = target(s.port(), ca_pinned(&s));
        t.system_uuid = Some(uuid.into());
        device(t, PASSWORD, options(Duration::from_secs(30)))
    };
    let (a, b) = (with(UUID_A), with(UUID_B));
    let unnamed = device(
        target(s.port(), ca_pinned(&s)),
        PASSWORD,
        options(Duration::from_secs(30)),
    );
    rt().block_on(async {
        // node-a, node-b and the test driver's own "test" domain.
        assert!(unnamed
            .off()
            .await
            .unwrap_err()
            .to_string()
            .contains("3 systems"));
        let off = a.off().await.expect("off is verified");
        assert_eq!(off.polls(), 1, "the test driver powers off at once");
        assert_eq!(a.status().await.unwrap(), PowerState::Off);
        assert_eq!(
            b.status().await.unwrap(),
            PowerState::On,
            "node-b untouched"
        );
        let on = a.on().await.expect("on is verified");
        assert_eq!(on.polls(), 1);
        // A warm reset (a host that must not power off): ForceRestart, never a power off.
        let sent = a.warm_reset().await.expect("ForceRestart is accepted");
        assert_eq!(sent.command, "ComputerSystem.Reset ForceRestart");
        assert_eq!(a.status().await.unwrap(), PowerState::On);
    });
}

/// The lab machine behind a sushy system: sushy's applied power changes are carried out on
/// the machine through its IPMI BMC (ipmitool), and sushy's read of the new state waits until
/// the machine's processes are gone (off) or its boot process runs (on).
#[test]
fn a_redfish_fence_really_stops_a_lab_machine() {
    let lab = Lab::start(LabConfig {
        machines: 1,
        control_plane: false,
        pdu: false,
        ..Default::default()
    })
    .expect("lab starts");
    let m = &lab.machines()[0];
    assert!(m.is_powered());
    let hook = palisade_lab::redfish::machine_power_hook(m);
    let dir = tempfile::tempdir().unwrap();
    let s = Sushy::start_with_power_hook(
        &dir.path().join("sushy"),
        &[SushySystem {
            name: m.name().into(),
            uuid: m.system_uuid().into(),
            power_on: true,
        }],
        "admin",
        PASSWORD,
        hook,
    )
    .expect("sushy-emulator starts");
    let mut t = target(s.port(), ca_pinned(&s));
    t.system_uuid = Some(m.system_uuid().into());
    let d = device(t, PASSWORD, options(Duration::from_secs(60)));
    rt().block_on(async {
        d.off().await.expect("off is verified");
        // No waiting here: the verified read of Off implies the machine is already down.
        assert!(!m.is_powered(), "the machine's boot process is gone");
        assert!(m.processes().is_empty(), "{:?}", m.processes());
        d.on().await.expect("on is verified");
        assert!(m.is_powered(), "the machine booted again");
    });
}

fn cli(stdin: &str) -> (i32, String, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_palisade-fence"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_cli_fences_a_sushy_system_with_fence_redfish_options_on_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let s = sushy(&dir);
    let opts = |action: &str| {
        format!(
            "agent=fence_redfish\naction={action}\nip=127.0.0.1\nipport={}\nusername=admin\npassword={PASSWORD}\nssl=1\nssl_ca_file={}\nplug=node-b\npower_timeout=60\nshell_timeout=5\n",
            s.port(),
            s.ca_file().display()
        )
    };
    let (code, out, err) = cli(&opts("status"));
    assert_eq!((code, out.trim()), (0, "Status: ON"), "{err}");
    let (code, out, err) = cli(&opts("off"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Powered OFF (verified"), "{out}");
    assert!(!err.contains(PASSWORD) && !out.contains(PASSWORD));
    let (code, out, err) = cli(&opts("status"));
    assert_eq!((code, out.trim()), (2, "Status: OFF"), "{err}");
    let (code, _, err) = cli(&opts("monitor").replace(PASSWORD, "wrong"));
    assert_eq!(code, 1);
    assert!(err.contains("authentication refused"), "{err}");
}

// ---------------------------------------------------------------------------------------
// A scripted BMC

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ResetMode {
    /// 204 and the power follows at once.
    Immediate,
    /// 202 with a task monitor that answers 202 twice, then completes (and the power follows).
    Task,
    /// 204 and nothing happens.
    Lies,
    /// 500 with a Redfish error body.
    Error,
}

#[derive(Clone, Debug)]
struct Script {
    sessions: bool,
    reset: ResetMode,
    allowable: Vec<&'static str>,
    /// The system resource answers this instead of JSON.
    system_body: Option<String>,
    /// The system resource redirects here.
    system_redirect: Option<String>,
    /// The system resource never answers.
    system_hangs: bool,
    /// The serving certificate is a self-signed CA certificate (`openssl req -x509`)
    /// instead of a self-signed end-entity certificate.
    self_signed_ca: bool,
    /// Error answers carry no Content-Length and end with a bare TCP close, without TLS
    /// close_notify (as some BMC web servers do).
    abrupt_errors: bool,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            sessions: true,
            reset: ResetMode::Immediate,
            allowable: vec!["On", "ForceOff", "GracefulShutdown", "ForceRestart"],
            system_body: None,
            system_redirect: None,
            system_hangs: false,
            self_signed_ca: false,
            abrupt_errors: false,
        }
    }
}

#[derive(Default, Debug)]
struct Seen {
    /// Requests for the system resource left unanswered (`system_hangs`).
    hung: usize,
    /// "METHOD path auth" where auth is none, basic or token.
    requests: Vec<String>,
    created: Vec<String>,
    deleted: Vec<String>,
    resets: Vec<String>,
    monitor_reads: u32,
    power_on: bool,
    monitor_left: u32,
}

struct Fake {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    fingerprint: [u8; 32],
    cert_pem: String,
}

impl Fake {
    fn target(&self) -> RedfishTarget {
        target(self.addr.port(), RedfishTls::Fingerprint(self.fingerprint))
    }
    fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock())
    }
}

async fn fake_bmc(script: Script) -> Fake {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    if script.self_signed_ca {
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    }
    let cert = params.self_signed(&key).unwrap();
    let fingerprint = fingerprint_of_der(cert.der());
    let cert_pem = cert.pem();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen {
        power_on: true,
        ..Default::default()
    }));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let seen = seen2.clone();
            let script = script.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Some((method, path, headers, body)) = read_request(&mut tls).await else {
                    return;
                };
                if script.system_hangs && path == SYSTEM {
                    seen.lock().hung += 1;
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                let (status, extra, body) =
                    respond(&script, &mut seen.lock(), &method, &path, &headers, &body);
                let abrupt = script.abrupt_errors && status >= 400;
                let mut head = if abrupt {
                    format!("HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nConnection: close\r\n")
                } else {
                    format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                        body.len()
                    )
                };
                for (k, v) in extra {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = tls.write_all(head.as_bytes()).await;
                let _ = tls.write_all(&body).await;
                if abrupt {
                    let _ = tls.flush().await;
                    let _ = tls.get_mut().0.shutdown().await;
                    return;
                }
                let _ = tls.shutdown().await;
            });
        }
    });
    Fake {
        addr,
        seen,
        fingerprint,
        cert_pem,
    }
}

type Request = (String, String, Vec<(String, String)>, Vec<u8>);

async fn read_request<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((method, path, headers, body))
}

const SYSTEM: &str = "/redfish/v1/Systems/s1";
const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";

fn respond(
    script: &Script,
    seen: &mut Seen,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    use serde_json::json;
    let header = |k: &str| {
        headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    let token_ok = header("x-auth-token").is_some_and(|t| {
        seen.created.iter().any(|c| c == t) && !seen.deleted.iter().any(|d| d.ends_with(t))
    });
    let basic = format!(
        "Basic {}",
        base64_encode(format!("admin:{PASSWORD}").as_bytes())
    );
    let basic_ok = header("authorization") == Some(basic.as_str());
    let auth = if header("x-auth-token").is_some() {
        "token"
    } else if header("authorization").is_some() {
        "basic"
    } else {
        "none"
    };
    seen.requests.push(format!("{method} {path} {auth}"));
    let ok = |v: serde_json::Value| (200, Vec::new(), v.to_string().into_bytes());
    let error = |status: u16, msg: &str| {
        (
            status,
            Vec::new(),
            json!({"error": {"code": "Base.1.0.GeneralError", "message": msg}})
                .to_string()
                .into_bytes(),
        )
    };
    match (method, path) {
        ("GET", "/redfish/v1/") => {
            let mut root = json!({"@odata.id": "/redfish/v1/", "Systems": {"@odata.id": "/redfish/v1/Systems"}});
            if script.sessions {
                root["SessionService"] = json!({"@odata.id": "/redfish/v1/SessionService"});
                root["Links"] = json!({"Sessions": {"@odata.id": SESSIONS}});
            }
            return ok(root);
        }
        ("POST", SESSIONS) if script.sessions => {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            if v["UserName"] != "admin" || v["Password"] != PASSWORD {
                return error(401, "Invalid username or password");
            }
            let token = format!("tok{}", seen.created.len() + 1);
            seen.created.push(token.clone());
            return (
                201,
                vec![
                    ("X-Auth-Token".into(), token.clone()),
                    ("Location".into(), format!("{SESSIONS}/{token}")),
                ],
                json!({"@odata.id": format!("{SESSIONS}/{token}")})
                    .to_string()
                    .into_bytes(),
            );
        }
        _ => {}
    }
    if !(token_ok || (basic_ok && !script.sessions)) {
        return error(401, "authentication required");
    }
    if method == "DELETE" && path.starts_with(SESSIONS) {
        seen.deleted.push(path.to_string());
        return (204, Vec::new(), Vec::new());
    }
    match (method, path) {
        ("GET", "/redfish/v1/Systems") => ok(json!({"Members": [{"@odata.id": SYSTEM}]})),
        ("GET", SYSTEM) => {
            if let Some(to) = &script.system_redirect {
                return (307, vec![("Location".into(), to.clone())], Vec::new());
            }
            if let Some(b) = &script.system_body {
                return (200, Vec::new(), b.clone().into_bytes());
            }
            ok(json!({
                "@odata.id": SYSTEM, "Id": "s1", "Name": "node-a",
                "UUID": UUID_A,
                "PowerState": if seen.power_on { "On" } else { "Off" },
                "Actions": {"#ComputerSystem.Reset": {
                    "target": format!("{SYSTEM}/Actions/ComputerSystem.Reset"),
                    "ResetType@Redfish.AllowableValues": script.allowable}}
            }))
        }
        ("POST", p) if p == format!("{SYSTEM}/Actions/ComputerSystem.Reset") => {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let t = v["ResetType"].as_str().unwrap_or("").to_string();
            seen.resets.push(t.clone());
            let apply = |seen: &mut Seen| match t.as_str() {
                "ForceOff" => seen.power_on = false,
                "On" | "ForceOn" => seen.power_on = true,
                _ => {}
            };
            match script.reset {
                ResetMode::Immediate => {
                    apply(seen);
                    (204, Vec::new(), Vec::new())
                }
                ResetMode::Lies => (204, Vec::new(), Vec::new()),
                ResetMode::Error => error(500, "The BMC is on fire"),
                ResetMode::Task => {
                    // The power changes when the task completes (the monitor, below).
                    seen.monitor_left = 2;
                    (
                        202,
                        vec![
                            ("Location".into(), "/redfish/v1/TaskMonitors/1".into()),
                            ("Retry-After".into(), "0".into()),
                        ],
                        Vec::new(),
                    )
                }
            }
        }
        ("GET", "/redfish/v1/TaskMonitors/1") => {
            seen.monitor_reads += 1;
            if seen.monitor_left > 0 {
                seen.monitor_left -= 1;
                return (
                    202,
                    vec![("Retry-After".into(), "0".into())],
                    json!({"TaskState": "Running"}).to_string().into_bytes(),
                );
            }
            seen.power_on = false;
            ok(json!({"TaskState": "Completed", "TaskStatus": "OK"}))
        }
        _ => error(404, "no such resource"),
    }
}

fn base64_encode(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// How long to wait for work the client does in the background, such as the logout of a
/// cancelled operation.
const BACKGROUND_WORK: Duration = Duration::from_secs(100);

fn short() -> DeviceOptions {
    options(Duration::from_secs(3))
}

#[tokio::test]
async fn a_session_token_is_used_for_the_off_and_the_session_is_logged_out() {
    let bmc = fake_bmc(Script::default()).await;
    let d = device(bmc.target(), PASSWORD, short());
    let off = d.off().await.expect("verified off");
    assert!(off.polls() >= 1);
    bmc.seen(|s| {
        assert_eq!(s.resets, ["ForceOff"]);
        assert_eq!(s.created, ["tok1"]);
        assert_eq!(s.deleted, [format!("{SESSIONS}/tok1")]);
        let after_login: Vec<&String> = s
            .requests
            .iter()
            .filter(|r| {
                !r.starts_with("GET /redfish/v1/ ")
                    && !r.starts_with("POST /redfish/v1/SessionService")
            })
            .collect();
        assert!(
            after_login.iter().all(|r| r.ends_with(" token")),
            "{after_login:?}"
        );
    });
    d.on().await.expect("verified on");
    bmc.seen(|s| assert_eq!((s.created.len(), s.deleted.len()), (2, 2)));
}

#[tokio::test]
async fn a_bmc_without_sessions_gets_basic_auth() {
    let bmc = fake_bmc(Script {
        sessions: false,
        ..Default::default()
    })
    .await;
    let d = device(bmc.target(), PASSWORD, short());
    d.off().await.expect("verified off");
    bmc.seen(|s| {
        assert!(s.created.is_empty());
        assert!(s.requests.iter().any(|r| r.ends_with(" basic")));
    });
    let mut session_only = bmc.target();
    session_only.auth = RedfishAuth::Session;
    let e = device(session_only, PASSWORD, short())
        .off()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "device_refused", "{e}");
}

#[tokio::test]
async fn a_wrong_password_at_login_is_refused_without_trying_basic() {
    let bmc = fake_bmc(Script::default()).await;
    let e = device(bmc.target(), "wrong", short())
        .off()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "auth_refused", "{e}");
    assert!(
        e.to_string().contains("Invalid username or password"),
        "{e}"
    );
    bmc.seen(|s| {
        assert!(s.resets.is_empty());
        assert!(
            !s.requests.iter().any(|r| r.ends_with(" basic")),
            "{:?}",
            s.requests
        );
    });
}

#[tokio::test]
async fn a_202_task_monitor_is_followed_before_the_power_is_read() {
    let bmc = fake_bmc(Script {
        reset: ResetMode::Task,
        ..Default::default()
    })
    .await;
    let d = device(bmc.target(), PASSWORD, options(Duration::from_secs(20)));
    d.off().await.expect("verified off");
    bmc.seen(|s| {
        assert_eq!(s.monitor_reads, 3, "{:?}", s.requests);
        assert!(!s.power_on);
        assert_eq!(s.deleted.len(), 1);
    });
}

#[tokio::test]
async fn a_bmc_that_says_ok_but_stays_on_is_never_reported_off() {
    let bmc = fake_bmc(Script {
        reset: ResetMode::Lies,
        ..Default::default()
    })
    .await;
    let e = device(bmc.target(), PASSWORD, short())
        .off()
        .await
        .unwrap_err();
    let FenceError::NotVerified { last, expected, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!((*expected, *last), (PowerState::Off, Some(PowerState::On)));
    bmc.seen(|s| {
        assert_eq!(s.resets, ["ForceOff"]);
        assert_eq!(s.deleted.len(), 1, "logged out after the failure");
    });
}

#[tokio::test]
async fn garbage_json_is_a_protocol_error_and_nothing_is_commanded() {
    let bmc = fake_bmc(Script {
        system_body: Some("{\"PowerState\": \"Off\",,, <html>".into()),
        ..Default::default()
    })
    .await;
    let e = device(bmc.target(), PASSWORD, short())
        .off()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "protocol", "{e}");
    assert!(e.to_string().contains("not JSON"), "{e}");
    bmc.seen(|s| {
        assert!(s.resets.is_empty());
        assert_eq!(s.deleted.len(), 1, "logged out after the failure");
    });
}

#[tokio::test]
async fn a_reset_type_the_system_does_not_allow_is_never_sent() {
    let bmc = fake_bmc(Script {
        allowable: vec!["On", "GracefulShutdown"],
        ..Default::default()
    })
    .await;
    let e = device(bmc.target(), PASSWORD, short())
        .off()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "device_refused", "{e}");
    assert!(e.to_string().contains("GracefulShutdown"), "{e}");
    bmc.seen(|s| {
        assert!(s.resets.is_empty());
        assert_eq!(s.deleted.len(), 1);
    });
}

#[tokio::test]
async fn the_bmcs_error_body_is_reported() {
    let bmc = fake_bmc(Script {
        reset: ResetMode::Error,
        ..Default::default()
    })
    .await;
    let e = device(bmc.target(), PASSWORD, short())
        .off()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "device_refused", "{e}");
    assert!(e.to_string().contains("HTTP 500"), "{e}");
    assert!(e.to_string().contains("The BMC is on fire"), "{e}");
    bmc.seen(|s| assert_eq!(s.deleted.len(), 1));
}

#[tokio::test]
async fn a_redirect_to_another_host_and_a_huge_body_are_refused() {
    let bmc = fake_bmc(Script {
        system_redirect: Some("https://127.0.0.2:1/redfish/v1/Systems/s1".into()),
        ..Default::default()
    })
    .await;
    let e = device(bmc.target(), PASSWORD, short())
        .off()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "protocol", "{e}");
    assert!(e.to_string().contains("redirect"), "{e}");
    bmc.seen(|s| assert_eq!(s.deleted.len(), 1));

    let huge = format!("{{\"x\": \"{}\"}}", "a".repeat(2 << 20));
    let bmc = fake_bmc(Script {
        system_body: Some(huge),
        ..Default::default()
    })
    .await;
    let e = device(bmc.target(), PASSWORD, short())
        .off()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("larger than"), "{e}");
    bmc.seen(|s| assert!(s.resets.is_empty()));
}

#[tokio::test]
async fn a_bmc_that_never_answers_is_a_timeout_and_the_session_is_still_closed() {
    let bmc = fake_bmc(Script {
        system_hangs: true,
        ..Default::default()
    })
    .await;
    let mut opts = short();
    opts.retries = 0; // one request, bounded by MIN_REQUEST_TIMEOUT
    let e = device(bmc.target(), PASSWORD, opts)
        .off()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "timeout", "{e}");
    assert!(e.is_retryable());
    bmc.seen(|s| {
        assert!(s.resets.is_empty());
        assert_eq!(s.deleted.len(), 1);
    });
}

#[tokio::test]
async fn a_404_ended_without_close_notify_is_reported_as_the_404() {
    let bmc = fake_bmc(Script {
        abrupt_errors: true,
        ..Default::default()
    })
    .await;
    let mut t = bmc.target();
    t.systems_uri = Some("/redfish/v1/Systems/missing".into());
    let e = device(t, PASSWORD, short()).status().await.unwrap_err();
    let m = e.to_string();
    assert!(m.contains("HTTP 404"), "{m}");
    assert!(m.contains("no such resource"), "{m}");
    assert!(!m.to_lowercase().contains("close_notify"), "{m}");
}

#[tokio::test]
async fn a_hung_bmc_fails_within_power_timeout_and_says_how_long_it_waited() {
    let bmc = fake_bmc(Script {
        system_hangs: true,
        ..Default::default()
    })
    .await;
    // exchange 5 s x 3 attempts: before, each request could take 15 s and be tried 3 times.
    let opts = options(Duration::from_secs(2));
    let e = device(bmc.target(), PASSWORD, opts)
        .status()
        .await
        .unwrap_err();
    let FenceError::Timeout { after, .. } = &e else {
        panic!("{e}")
    };
    // One request, bounded by power_timeout; no retry that would end past it.
    bmc.seen(|s| assert_eq!(s.hung, 1));
    // The message says the time really waited.
    assert!(*after >= Duration::from_secs(2), "{e}");
    assert!(e.to_string().contains(&format!("{after:?}")), "{e}");
}

#[tokio::test]
async fn a_certificate_that_does_not_match_its_pin_gets_no_credentials() {
    let bmc = fake_bmc(Script::default()).await;
    let mut t = bmc.target();
    t.tls = RedfishTls::Fingerprint([7; 32]);
    let e = device(t, PASSWORD, short()).off().await.unwrap_err();
    let FenceError::IdentityMismatch { found, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(found, &format_fingerprint(&bmc.fingerprint));
    bmc.seen(|s| assert!(s.requests.is_empty(), "{:?}", s.requests));
}

#[tokio::test]
async fn a_self_signed_ca_certificate_is_accepted_as_its_own_ca_file() {
    // What `openssl req -x509` makes: a self-signed certificate with CA:TRUE, served as the
    // BMC's certificate and given as ssl_ca_file (webpki alone says CaUsedAsEndEntity).
    let bmc = fake_bmc(Script {
        self_signed_ca: true,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("bmc.pem");
    std::fs::write(&ca, &bmc.cert_pem).unwrap();
    let mut t = bmc.target();
    t.tls = RedfishTls::CaFile(ca.clone());
    assert_eq!(
        device(t.clone(), PASSWORD, short()).status().await.unwrap(),
        PowerState::On
    );
    // The exact certificate is trusted, not its name: the host name is still checked.
    let mut wrong_name = t.clone();
    wrong_name.host = "localhost".into();
    let e = device(wrong_name, PASSWORD, short())
        .status()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "identity_mismatch", "{e}");
    // Another self-signed CA certificate in the file is no trust for this one.
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    std::fs::write(&ca, other.cert.pem()).unwrap();
    let e = device(t, PASSWORD, short()).status().await.unwrap_err();
    assert_eq!(e.kind(), "identity_mismatch", "{e}");
    let text = e.to_string();
    assert!(!text.contains("pinned the pinned"), "{text}");
    assert!(text.contains(&ca.display().to_string()), "{text}");
}

#[tokio::test]
async fn a_cancelled_off_still_logs_out() {
    let bmc = fake_bmc(Script {
        reset: ResetMode::Lies,
        ..Default::default()
    })
    .await;
    let d = device(bmc.target(), PASSWORD, options(Duration::from_secs(600)));
    // Cancel once the reset was sent (the verification would poll for 600 s).
    let sent = eventually_async("the reset sent", BACKGROUND_WORK, || async {
        bmc.seen(|s| !s.resets.is_empty()).then_some(())
    });
    tokio::select! {
        r = d.off() => panic!("the lying BMC cannot be verified off: {r:?}"),
        _ = sent => {}
    }
    eventually_async(
        "the session of the cancelled off was deleted",
        BACKGROUND_WORK,
        || async { bmc.seen(|s| s.deleted.len() == 1).then_some(()) },
    )
    .await;
}

#[test]
fn the_device_name_never_holds_the_password() {
    let d = device(
        target(1, RedfishTls::Fingerprint([0; 32])),
        "hunter2",
        short(),
    );
    assert!(!format!("{d:?}").contains("hunter2"));
    assert!(!d.name().contains("hunter2"));
}
