//! Redfish BMCs that answer like real vendors' do: [`QuirkProxy`] is an HTTPS reverse proxy in
//! front of a [`Sushy`] emulator that, on demand, refuses or swallows power requests the way
//! field firmware does ([`Quirk`]), and forwards everything else unchanged.
//!
//! sushy-emulator itself is a compliant BMC: it accepts `ForceOff` on a system that is already
//! off (204, nothing changes) and a power-on at any time. Field BMCs do not:
//! - Dell iDRAC answers `ForceOff` on a system that is off with 409 Conflict
//!   ([`Quirk::OffConflict`]);
//! - HPE iLO answers it with 400 Bad Request ([`Quirk::OffBadRequest`]);
//! - some HPE firmware answers it with success and does nothing ([`Quirk::OffIgnored`]);
//! - Fujitsu iRMC refuses a power-on that comes soon after a power-off with 400
//!   ([`Quirk::QuickOnBadRequest`]);
//! - a BMC whose web server hangs or crashed accepts TCP and answers nothing ([`Quirk::Dark`]).
//!
//! The proxy decides with [`decide`], a pure function of the quirk, the request, the
//! `PowerState` sushy reports right now (read with the client's own credentials, so the proxy
//! holds no secret) and the time since the last power-off it forwarded. It serves TLS with a
//! certificate from its own CA ([`QuirkProxy::ca_pem`]), so a client that verifies TLS, as the
//! product does by default, keeps verifying; it verifies sushy's certificate in turn.
//!
//! One request per connection: each forwarded request goes to sushy with `Connection: close`,
//! and each answer tells the client `Connection: close`. Every exchange is bounded (sizes and
//! socket timeouts); connection threads end with their connection.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::error::{LabError, Result};
use crate::pki::Ca;
use crate::redfish::Sushy;

/// How the BMC behind a [`QuirkProxy`] misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quirk {
    /// Everything is forwarded: sushy's own, compliant answers.
    None,
    /// `ForceOff`/`GracefulShutdown` while `PowerState` is `Off`: 409 Conflict with a Redfish
    /// error body (Dell iDRAC).
    OffConflict,
    /// `ForceOff`/`GracefulShutdown` while `PowerState` is `Off`: 400 Bad Request (HPE iLO).
    OffBadRequest,
    /// `ForceOff`/`GracefulShutdown` while `PowerState` is `Off`: 204 and nothing is done
    /// (some HPE firmware).
    OffIgnored,
    /// `On`/`ForceOn` within `window` of the last power-off this proxy forwarded: 400 Bad
    /// Request (Fujitsu iRMC).
    QuickOnBadRequest {
        /// How long after a power-off a power-on is refused.
        window: Duration,
    },
    /// Connections are accepted and closed at once, before TLS: no answer at all.
    Dark,
}

/// What a request asks of the system's power.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerRequest {
    /// A `ComputerSystem.Reset` with `ForceOff` or `GracefulShutdown`.
    Off,
    /// A `ComputerSystem.Reset` with `On` or `ForceOn`.
    On,
    /// Anything else (reads, sessions, other reset types).
    Other,
}

impl PowerRequest {
    /// Classifies a request by its method, path and JSON body.
    pub fn of(method: &str, path: &str, body: &[u8]) -> PowerRequest {
        if !method.eq_ignore_ascii_case("POST") || !path.ends_with("/ComputerSystem.Reset") {
            return PowerRequest::Other;
        }
        let reset = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("ResetType")?.as_str().map(str::to_string));
        match reset.as_deref() {
            Some("ForceOff" | "GracefulShutdown") => PowerRequest::Off,
            Some("On" | "ForceOn") => PowerRequest::On,
            _ => PowerRequest::Other,
        }
    }
}

/// A reply the proxy makes up instead of forwarding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// A Redfish error body (`{"error": …}`), if any.
    pub body: Option<serde_json::Value>,
}

/// What the proxy does with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Forward it to sushy and relay sushy's answer.
    Forward,
    /// Answer it without forwarding.
    Reply(Reply),
    /// Close the connection without answering.
    Drop,
}

/// Whether [`decide`] needs the system's current `PowerState` for this request (the proxy
/// reads it from sushy only then).
pub fn needs_power_state(quirk: Quirk, request: PowerRequest) -> bool {
    request == PowerRequest::Off
        && matches!(
            quirk,
            Quirk::OffConflict | Quirk::OffBadRequest | Quirk::OffIgnored
        )
}

/// What the BMC with `quirk` does with `request`, given the `PowerState` sushy reports now
/// (`None`: not read, or unreadable) and the time since the last power-off the proxy forwarded
/// to this system (`None`: none).
///
/// Guarantees: only a power request is ever refused or swallowed, and only in the state the
/// vendor refuses it in; an unreadable `PowerState` forwards (the proxy never invents a
/// state). [`Quirk::Dark`] answers nothing at all.
pub fn decide(
    quirk: Quirk,
    request: PowerRequest,
    power_state: Option<&str>,
    since_last_off: Option<Duration>,
) -> Answer {
    let off_while_off = request == PowerRequest::Off && power_state == Some("Off");
    match quirk {
        Quirk::Dark => Answer::Drop,
        Quirk::None => Answer::Forward,
        Quirk::OffConflict if off_while_off => Answer::Reply(Reply {
            status: 409,
            body: Some(redfish_error(
                "Base.1.8.GeneralError",
                "IDRAC.2.8.PSU501",
                "Server is already powered OFF.",
            )),
        }),
        Quirk::OffBadRequest if off_while_off => Answer::Reply(Reply {
            status: 400,
            body: Some(redfish_error(
                "iLO.0.10.ExtendedInfo",
                "iLO.2.14.InvalidOperationForSystemState",
                "The operation was not successful due to the current power state \
                 (for example, attempting to turn the power off when it is already off).",
            )),
        }),
        Quirk::OffIgnored if off_while_off => Answer::Reply(Reply {
            status: 204,
            body: None,
        }),
        Quirk::QuickOnBadRequest { window }
            if request == PowerRequest::On && since_last_off.is_some_and(|s| s < window) =>
        {
            Answer::Reply(Reply {
                status: 400,
                body: Some(redfish_error(
                    "Base.1.4.GeneralError",
                    "Base.1.4.ActionNotSupported",
                    &format!(
                        "Power on is not possible within {} s of a power off; try again later.",
                        window.as_secs()
                    ),
                )),
            })
        }
        Quirk::OffConflict
        | Quirk::OffBadRequest
        | Quirk::OffIgnored
        | Quirk::QuickOnBadRequest { .. } => Answer::Forward,
    }
}

fn redfish_error(code: &str, message_id: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"error": {
        "code": code,
        "message": "A general error has occurred. See ExtendedInfo for more information.",
        "@Message.ExtendedInfo": [{
            "@odata.type": "#Message.v1_1_1.Message",
            "MessageId": message_id,
            "Message": message,
            "Severity": "Warning",
            "Resolution": "No response action is required.",
        }],
    }})
}

/// One answer the quirk made up (a forwarded request is not recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuirkAnswer {
    /// The quirk in force.
    pub quirk: Quirk,
    /// What the request asked.
    pub request: PowerRequest,
    /// The status answered.
    pub status: u16,
}

struct Shared {
    quirk: Mutex<Quirk>,
    answers: Mutex<Vec<QuirkAnswer>>,
    /// The last power-off forwarded and accepted, per system URI.
    last_off: Mutex<HashMap<String, Instant>>,
    server: Arc<rustls::ServerConfig>,
    upstream: Upstream,
    port: u16,
}

/// sushy, as the proxy reaches it.
#[derive(Clone)]
struct Upstream {
    port: u16,
    tls: Arc<rustls::ClientConfig>,
}

/// A running quirk proxy in front of one [`Sushy`]. Dropping it stops it.
pub struct QuirkProxy {
    shared: Arc<Shared>,
    ca_pem: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for QuirkProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuirkProxy")
            .field("port", &self.shared.port)
            .field("quirk", &*self.shared.quirk.lock())
            .finish()
    }
}

/// The bound of a request or response head, and of a body.
const MAX_HEAD: usize = 64 << 10;
const MAX_BODY: usize = 4 << 20;
/// Socket timeout of every read and write, on both sides.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(what: &str) -> impl FnOnce(rustls::Error) -> LabError + '_ {
    move |e| LabError::Other(format!("quirk proxy {what}: {e}"))
}

impl QuirkProxy {
    /// Starts a proxy on a free port of 127.0.0.1 in front of `sushy`, with [`Quirk::None`],
    /// serving a certificate for 127.0.0.1 from a fresh CA.
    pub fn start(sushy: &Sushy) -> Result<QuirkProxy> {
        let ca = Ca::new("palisade-lab-redfish-quirks-ca")?;
        let issued = ca.issue_server_cert(&["127.0.0.1", "localhost"])?;
        let chain = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| LabError::Other(format!("quirk proxy certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes())
            .map_err(|e| LabError::Other(format!("quirk proxy key: {e}")))?;
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_error("server"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(tls_error("server"))?;

        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(sushy.ca_pem().as_bytes()) {
            let c = c.map_err(|e| LabError::Other(format!("sushy CA: {e}")))?;
            roots.add(c).map_err(tls_error("sushy CA"))?;
        }
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_error("client"))?
            .with_root_certificates(roots)
            .with_no_client_auth();

        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| LabError::Other(format!("quirk proxy listener: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| LabError::Other(format!("quirk proxy listener: {e}")))?
            .port();
        let shared = Arc::new(Shared {
            quirk: Mutex::new(Quirk::None),
            answers: Mutex::new(Vec::new()),
            last_off: Mutex::new(HashMap::new()),
            server: Arc::new(server),
            upstream: Upstream {
                port: sushy.port(),
                tls: Arc::new(client),
            },
            port,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    if *shared.quirk.lock() == Quirk::Dark {
                        let _ = conn.shutdown(Shutdown::Both);
                        continue;
                    }
                    let shared = shared.clone();
                    std::thread::spawn(move || serve(conn, &shared));
                }
            })
        };
        Ok(QuirkProxy {
            shared,
            ca_pem: ca.cert_pem(),
            stop,
            thread: Some(thread),
        })
    }

    /// The HTTPS port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.shared.port
    }

    /// PEM of the CA that issued the proxy's certificate (what a device's `caBundle` trusts).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Switches the quirk; it applies to every request that arrives from now on.
    pub fn set_quirk(&self, quirk: Quirk) {
        *self.shared.quirk.lock() = quirk;
    }

    /// The quirk in force.
    pub fn quirk(&self) -> Quirk {
        *self.shared.quirk.lock()
    }

    /// Every answer a quirk made up so far, oldest first.
    pub fn quirk_answers(&self) -> Vec<QuirkAnswer> {
        self.shared.answers.lock().clone()
    }

    /// Powers `system` (its UUID) on or off straight at sushy, as a person at the BMC's console
    /// would (no quirk applies, and the proxy records no power-off), and waits until sushy
    /// reads the new `PowerState` (its power hook has then run). Bounded by `timeout`, with
    /// reads 500 ms apart.
    pub fn power_directly(
        &self,
        system: &str,
        on: bool,
        user: &str,
        password: &str,
        timeout: Duration,
    ) -> Result<()> {
        use base64::Engine as _;
        let auth = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );
        let uri = format!("/redfish/v1/Systems/{system}");
        let want = if on { "On" } else { "Off" };
        let body = serde_json::json!({"ResetType": if on { "On" } else { "ForceOff" }}).to_string();
        let req = Request {
            method: "POST".into(),
            path: format!("{uri}/Actions/ComputerSystem.Reset"),
            headers: vec![
                ("Authorization".into(), auth.clone()),
                ("Content-Type".into(), "application/json".into()),
            ],
            body: body.into_bytes(),
        };
        let reply = self.shared.upstream.exchange(&req)?;
        let status = reply.status();
        if !(200..300).contains(&status) {
            return Err(LabError::Other(format!(
                "sushy refused {want} for {system}: HTTP {status}"
            )));
        }
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            last = self
                .shared
                .upstream
                .power_state(&uri, &[("Authorization".into(), auth.clone())]);
            if last.as_deref() == Some(want) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err(LabError::Other(format!(
            "{system} did not read {want} within {timeout:?} (last read {last:?})"
        )))
    }
}

impl Drop for QuirkProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.shared.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One HTTP/1.1 request, as read from a client.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The request as sent to sushy: its own Host, `Connection: close`, the body's length.
    fn to_upstream(&self, port: u16) -> Vec<u8> {
        let mut out = format!(
            "{} {} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n",
            self.method, self.path
        );
        for (k, v) in &self.headers {
            if !hop_by_hop(k) && !k.eq_ignore_ascii_case("host") {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut out = out.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

fn hop_by_hop(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "content-length",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-connection",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// An HTTP response: its head's lines and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Response {
    status_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn status(&self) -> u16 {
        self.status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    fn made_up(reply: &Reply) -> Response {
        let body = reply
            .body
            .as_ref()
            .map(|b| b.to_string().into_bytes())
            .unwrap_or_default();
        let mut headers = vec![("OData-Version".into(), "4.0".into())];
        if !body.is_empty() {
            headers.push(("Content-Type".into(), "application/json".into()));
        }
        Response {
            status_line: format!("HTTP/1.1 {} {}", reply.status, reason(reply.status)),
            headers,
            body,
        }
    }

    /// The response as sent to the client: `Connection: close`, the body's length, and a
    /// `Location` on sushy's origin moved to the proxy's.
    fn to_client(&self, upstream_port: u16, port: u16) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.status_line);
        for (k, v) in &self.headers {
            if hop_by_hop(k) {
                continue;
            }
            let v = if k.eq_ignore_ascii_case("location") {
                v.replace(
                    &format!("127.0.0.1:{upstream_port}"),
                    &format!("127.0.0.1:{port}"),
                )
            } else {
                v.clone()
            };
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        // A 204 carries neither a body nor a length (RFC 9110 §8.6).
        if self.status() != 204 {
            out.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        out.push_str("Connection: close\r\n\r\n");
        let mut out = out.into_bytes();
        if self.status() != 204 {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        409 => "Conflict",
        502 => "Bad Gateway",
        _ => "",
    }
}

/// Splits a head (without its blank line) into its first line and headers.
fn parse_head(head: &[u8]) -> Option<(String, Vec<(String, String)>)> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let first = lines.next()?.to_string();
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((first, headers))
}

fn content_length(headers: &[(String, String)]) -> Option<usize> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
}

/// Reads one request (head, then a `Content-Length` body); `None` on EOF, a malformed or
/// oversized request, or a chunked body (no Redfish client this lab serves sends one).
fn read_request(s: &mut impl Read) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let (first, headers) = parse_head(&buf[..end])?;
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    if headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding"))
    {
        return None;
    }
    let len = content_length(&headers).unwrap_or(0);
    if len > MAX_BODY {
        return None;
    }
    let mut body = buf[end + 4..].to_vec();
    while body.len() < len {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    body.truncate(len);
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

/// Parses a whole response read until the server closed (or until its `Content-Length` was
/// complete).
fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let (status_line, headers) = parse_head(&raw[..end])?;
    let mut body = raw[end + 4..].to_vec();
    if let Some(len) = content_length(&headers) {
        if body.len() < len {
            return None;
        }
        body.truncate(len);
    }
    Some(Response {
        status_line,
        headers,
        body,
    })
}

impl Upstream {
    /// One request to sushy on a fresh TLS connection, read until sushy closes it.
    fn exchange(&self, req: &Request) -> Result<Response> {
        let fail = |e: String| LabError::Other(format!("sushy {} {}: {e}", req.method, req.path));
        let tcp = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| fail(e.to_string()))?;
        tcp.set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| tcp.set_write_timeout(Some(IO_TIMEOUT)))
            .map_err(|e| fail(e.to_string()))?;
        let name = ServerName::try_from("127.0.0.1").map_err(|e| fail(e.to_string()))?;
        let conn = rustls::ClientConnection::new(self.tls.clone(), name.to_owned())
            .map_err(|e| fail(e.to_string()))?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(&req.to_upstream(self.port))
            .and_then(|()| tls.flush())
            .map_err(|e| fail(e.to_string()))?;
        let mut raw = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            // sushy's server may close without a TLS close_notify: an unexpected EOF after a
            // complete response is the end of it.
            match tls.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&chunk[..n]),
                Err(e) if parse_response(&raw).is_some() => {
                    tracing::debug!(error = %e, "sushy closed without close_notify");
                    break;
                }
                Err(e) => return Err(fail(e.to_string())),
            }
            if raw.len() > MAX_HEAD + MAX_BODY {
                return Err(fail("response too large".into()));
            }
        }
        parse_response(&raw).ok_or_else(|| fail("incomplete response".into()))
    }

    /// `PowerState` of the system at `uri`, read with `auth` (the client's own credential
    /// headers); `None` if unreadable.
    fn power_state(&self, uri: &str, auth: &[(String, String)]) -> Option<String> {
        let req = Request {
            method: "GET".into(),
            path: uri.to_string(),
            headers: auth.to_vec(),
            body: Vec::new(),
        };
        let r = self.exchange(&req).ok()?;
        if r.status() != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
        v.get("PowerState")?.as_str().map(str::to_string)
    }
}

/// The system a `ComputerSystem.Reset` target belongs to.
fn system_of(action_path: &str) -> Option<&str> {
    action_path
        .split_once("/Actions/")
        .map(|(system, _)| system)
}

/// Serves one client connection: one request, one answer.
fn serve(tcp: TcpStream, shared: &Shared) {
    let _ = tcp.set_read_timeout(Some(IO_TIMEOUT));
    let _ = tcp.set_write_timeout(Some(IO_TIMEOUT));
    let Ok(conn) = rustls::ServerConnection::new(shared.server.clone()) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let Some(req) = read_request(&mut tls) else {
        return;
    };
    let quirk = *shared.quirk.lock();
    let request = PowerRequest::of(&req.method, &req.path, &req.body);
    let system = system_of(&req.path).map(str::to_string);
    let power = match (&system, needs_power_state(quirk, request)) {
        (Some(system), true) => {
            let auth: Vec<(String, String)> = ["Authorization", "X-Auth-Token"]
                .iter()
                .filter_map(|h| req.header(h).map(|v| (h.to_string(), v.to_string())))
                .collect();
            shared.upstream.power_state(system, &auth)
        }
        _ => None,
    };
    let since_off = system
        .as_ref()
        .and_then(|s| shared.last_off.lock().get(s).map(Instant::elapsed));
    let response = match decide(quirk, request, power.as_deref(), since_off) {
        Answer::Drop => {
            let _ = tls.sock.shutdown(Shutdown::Both);
            return;
        }
        Answer::Reply(reply) => {
            tracing::info!(?quirk, ?request, status = reply.status, path = %req.path, "quirk answers");
            shared.answers.lock().push(QuirkAnswer {
                quirk,
                request,
                status: reply.status,
            });
            Response::made_up(&reply)
        }
        Answer::Forward => match shared.upstream.exchange(&req) {
            Ok(r) => {
                if request == PowerRequest::Off && (200..300).contains(&r.status()) {
                    if let Some(s) = system {
                        shared.last_off.lock().insert(s, Instant::now());
                    }
                }
                r
            }
            Err(e) => {
                tracing::warn!(error = %e, "quirk proxy: sushy did not answer");
                Response::made_up(&Reply {
                    status: 502,
                    body: None,
                })
            }
        },
    };
    let _ = tls.write_all(&response.to_client(shared.upstream.port, shared.port));
    tls.conn.send_close_notify();
    let _ = tls.flush();
    let _ = tls.sock.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(30);

    fn status(a: &Answer) -> Option<u16> {
        match a {
            Answer::Reply(r) => Some(r.status),
            _ => None,
        }
    }

    #[test]
    fn reset_requests_are_classified_by_their_reset_type() {
        let reset = "/redfish/v1/Systems/u/Actions/ComputerSystem.Reset";
        let of = |m, p, b: &str| PowerRequest::of(m, p, b.as_bytes());
        assert_eq!(
            of("POST", reset, r#"{"ResetType":"ForceOff"}"#),
            PowerRequest::Off
        );
        assert_eq!(
            of("POST", reset, r#"{"ResetType":"GracefulShutdown"}"#),
            PowerRequest::Off
        );
        assert_eq!(of("POST", reset, r#"{"ResetType":"On"}"#), PowerRequest::On);
        assert_eq!(
            of("post", reset, r#"{"ResetType":"ForceOn"}"#),
            PowerRequest::On
        );
        assert_eq!(
            of("POST", reset, r#"{"ResetType":"ForceRestart"}"#),
            PowerRequest::Other
        );
        assert_eq!(of("POST", reset, "not json"), PowerRequest::Other);
        assert_eq!(
            of("GET", reset, r#"{"ResetType":"ForceOff"}"#),
            PowerRequest::Other
        );
        assert_eq!(
            of(
                "POST",
                "/redfish/v1/SessionService/Sessions",
                r#"{"ResetType":"ForceOff"}"#
            ),
            PowerRequest::Other
        );
    }

    /// Every quirk against every request in every power state: (quirk, request, power state,
    /// since last off) → answered status (`None`: forwarded; `Some(0)`: dropped).
    #[test]
    fn each_quirk_refuses_only_what_its_vendor_refuses() {
        use PowerRequest::{Off, On, Other};
        let recent = Some(Duration::from_secs(5));
        let old = Some(Duration::from_secs(300));
        let quick = Quirk::QuickOnBadRequest { window: WINDOW };
        type Row<'a> = (
            Quirk,
            PowerRequest,
            Option<&'a str>,
            Option<Duration>,
            Option<u16>,
        );
        let table: &[Row<'_>] = &[
            (Quirk::None, Off, Some("Off"), None, None),
            (Quirk::None, On, Some("Off"), recent, None),
            (Quirk::OffConflict, Off, Some("Off"), None, Some(409)),
            (Quirk::OffConflict, Off, Some("On"), None, None),
            (Quirk::OffConflict, Off, Some("PoweringOff"), None, None),
            (Quirk::OffConflict, Off, None, None, None),
            (Quirk::OffConflict, On, Some("Off"), recent, None),
            (Quirk::OffConflict, Other, Some("Off"), None, None),
            (Quirk::OffBadRequest, Off, Some("Off"), None, Some(400)),
            (Quirk::OffBadRequest, Off, Some("On"), None, None),
            (Quirk::OffBadRequest, Off, None, None, None),
            (Quirk::OffBadRequest, On, Some("Off"), None, None),
            (Quirk::OffIgnored, Off, Some("Off"), None, Some(204)),
            (Quirk::OffIgnored, Off, Some("On"), None, None),
            (Quirk::OffIgnored, Other, Some("Off"), None, None),
            (quick, On, Some("Off"), recent, Some(400)),
            (quick, On, None, recent, Some(400)),
            (quick, On, Some("Off"), old, None),
            (quick, On, Some("Off"), Some(WINDOW), None),
            (quick, On, Some("Off"), None, None),
            (quick, Off, Some("Off"), recent, None),
            (quick, Other, Some("Off"), recent, None),
            (Quirk::Dark, Other, None, None, Some(0)),
            (Quirk::Dark, Off, Some("On"), None, Some(0)),
        ];
        for &(quirk, request, power, since, want) in table {
            let got = decide(quirk, request, power, since);
            let got = match &got {
                Answer::Drop => Some(0),
                a => status(a),
            };
            assert_eq!(got, want, "{quirk:?} {request:?} {power:?} {since:?}");
        }
    }

    #[test]
    fn the_power_state_is_read_only_for_an_off_under_an_off_quirk() {
        for q in [Quirk::OffConflict, Quirk::OffBadRequest, Quirk::OffIgnored] {
            assert!(needs_power_state(q, PowerRequest::Off));
            assert!(!needs_power_state(q, PowerRequest::On));
            assert!(!needs_power_state(q, PowerRequest::Other));
        }
        for q in [
            Quirk::None,
            Quirk::Dark,
            Quirk::QuickOnBadRequest { window: WINDOW },
        ] {
            assert!(!needs_power_state(q, PowerRequest::Off));
        }
    }

    #[test]
    fn refusals_carry_a_redfish_error_message() {
        let Answer::Reply(r) = decide(Quirk::OffConflict, PowerRequest::Off, Some("Off"), None)
        else {
            panic!("a reply");
        };
        let info = &r.body.expect("a body")["error"]["@Message.ExtendedInfo"][0];
        assert_eq!(info["MessageId"], "IDRAC.2.8.PSU501");
        assert_eq!(info["Message"], "Server is already powered OFF.");
        let Answer::Reply(r) = decide(Quirk::OffIgnored, PowerRequest::Off, Some("Off"), None)
        else {
            panic!("a reply");
        };
        assert_eq!(r.body, None);
    }

    #[test]
    fn requests_are_read_and_forwarded_with_connection_close() {
        let raw = b"POST /redfish/v1/Systems/u/Actions/ComputerSystem.Reset HTTP/1.1\r\n\
            Host: 127.0.0.1:1\r\nConnection: keep-alive\r\nContent-Length: 24\r\n\
            Authorization: Basic eA==\r\n\r\n{\"ResetType\":\"ForceOff\"}";
        let req = read_request(&mut &raw[..]).expect("a request");
        assert_eq!(req.method, "POST");
        assert_eq!(system_of(&req.path), Some("/redfish/v1/Systems/u"));
        assert_eq!(req.header("authorization"), Some("Basic eA=="));
        assert_eq!(
            PowerRequest::of(&req.method, &req.path, &req.body),
            PowerRequest::Off
        );
        let up = String::from_utf8(req.to_upstream(7)).unwrap();
        assert!(up.starts_with("POST /redfish/v1/Systems/u/Actions/ComputerSystem.Reset HTTP/1.1\r\nHost: 127.0.0.1:7\r\n"), "{up}");
        assert!(up.contains("Connection: close\r\n"), "{up}");
        assert!(!up.contains("keep-alive"), "{up}");
        assert_eq!(up.matches("Content-Length").count(), 1, "{up}");
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(read_request(&mut &chunked[..]), None);
        assert_eq!(read_request(&mut &b"GET / HTTP/1.1\r\n"[..]), None);
    }

    #[test]
    fn responses_reach_the_client_on_the_proxys_origin() {
        let raw = b"HTTP/1.1 201 CREATED\r\nLocation: https://127.0.0.1:7/redfish/v1/SessionService/Sessions/1\r\n\
            X-Auth-Token: t\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}";
        let r = parse_response(raw).expect("a response");
        assert_eq!(r.status(), 201);
        let out = String::from_utf8(r.to_client(7, 9)).unwrap();
        assert!(
            out.contains("Location: https://127.0.0.1:9/redfish/v1/SessionService/Sessions/1\r\n"),
            "{out}"
        );
        assert!(out.contains("X-Auth-Token: t\r\n"), "{out}");
        assert!(out.ends_with("Connection: close\r\n\r\n{}"), "{out}");
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}"),
            None
        );
        let made = Response::made_up(&Reply {
            status: 204,
            body: None,
        });
        let out = String::from_utf8(made.to_client(7, 9)).unwrap();
        assert!(out.starts_with("HTTP/1.1 204 No Content\r\n"), "{out}");
        assert!(!out.contains("Content-Length"), "{out}");
        assert!(out.ends_with("Connection: close\r\n\r\n"), "{out}");
    }

    /// The proxy in front of a real sushy-emulator (one system, off): reads are forwarded,
    /// each quirk answers as its vendor does, and a forwarded power-off starts the quick-on
    /// window. Power changes are only requested, never waited for (sushy applies them lazily).
    /// Needs sushy-tools (`hack/install-deps.sh`); about a second.
    #[test]
    fn the_proxy_answers_like_each_vendor_in_front_of_a_real_sushy() {
        let dir = std::env::temp_dir().join(format!("palisade-quirks-{}", std::process::id()));
        let uuid = "7b7e8a4e-3c1d-4f7e-9a31-0c2d5e6f7a80";
        let system = crate::redfish::SushySystem {
            name: "q0".into(),
            uuid: uuid.into(),
            power_on: false,
        };
        let sushy = Sushy::start(&dir, &[system], "admin", "quirk-pw")
            .expect("sushy-emulator starts (hack/install-deps.sh installs it)");
        let proxy = QuirkProxy::start(&sushy).expect("the proxy starts");
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(proxy.ca_pem().as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let client = Upstream {
            port: proxy.port(),
            tls: Arc::new(
                rustls::ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(roots)
                    .with_no_client_auth(),
            ),
        };
        use base64::Engine as _;
        let auth = vec![(
            "Authorization".to_string(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("admin:quirk-pw")
            ),
        )];
        let uri = format!("/redfish/v1/Systems/{uuid}");
        let reset = |t: &str| {
            let mut headers = auth.clone();
            headers.push(("Content-Type".into(), "application/json".into()));
            client.exchange(&Request {
                method: "POST".into(),
                path: format!("{uri}/Actions/ComputerSystem.Reset"),
                headers,
                body: format!(r#"{{"ResetType":"{t}"}}"#).into_bytes(),
            })
        };

        assert_eq!(client.power_state(&uri, &auth).as_deref(), Some("Off"));
        assert_eq!(
            reset("ForceOff").unwrap().status(),
            204,
            "sushy's own answer"
        );
        for (quirk, want) in [
            (Quirk::OffConflict, 409),
            (Quirk::OffBadRequest, 400),
            (Quirk::OffIgnored, 204),
        ] {
            proxy.set_quirk(quirk);
            let r = reset("ForceOff").unwrap();
            assert_eq!(r.status(), want, "{quirk:?}");
            if want != 204 {
                let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                assert!(body["error"]["@Message.ExtendedInfo"][0]["Message"].is_string());
            }
        }
        let statuses: Vec<u16> = proxy.quirk_answers().iter().map(|a| a.status).collect();
        assert_eq!(statuses, [409, 400, 204]);

        // The first ForceOff, forwarded under Quirk::None, started the window; the refused
        // and swallowed ones did not.
        proxy.set_quirk(Quirk::QuickOnBadRequest {
            window: Duration::from_secs(600),
        });
        assert_eq!(reset("On").unwrap().status(), 400, "too soon after the off");
        proxy.set_quirk(Quirk::QuickOnBadRequest {
            window: Duration::ZERO,
        });
        assert_eq!(reset("On").unwrap().status(), 204, "the window is over");
        let last = proxy.quirk_answers().pop().unwrap();
        assert_eq!((last.request, last.status), (PowerRequest::On, 400));

        proxy.set_quirk(Quirk::Dark);
        assert!(client.power_state(&uri, &auth).is_none(), "no answer");
        assert!(reset("On").is_err(), "no answer");
        proxy.set_quirk(Quirk::None);
        assert!(client.power_state(&uri, &auth).is_some(), "answers again");
        drop(proxy);
        drop(sushy);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
