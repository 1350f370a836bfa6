//! Probes: the threshold logic ([`ProbeTracker`], pure) and the network probe actions
//! (httpGet over HTTP or HTTPS, tcpSocket, and grpc through [`crate::grpc_health`]), with
//! named ports resolved against the container's ports. Exec probes go through the runtime.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

pub use crate::probe_outcome::ProbeOutcome;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// startupProbe: gates the others; failure kills the container.
    Startup,
    /// livenessProbe: failure kills the container.
    Liveness,
    /// readinessProbe: failure marks the container unready.
    Readiness,
}

/// The threshold fields of a probe, defaulted as the API server does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// initialDelaySeconds (0).
    pub initial_delay: Duration,
    /// periodSeconds (10).
    pub period: Duration,
    /// timeoutSeconds (1).
    pub timeout: Duration,
    /// successThreshold (1).
    pub success_threshold: u32,
    /// failureThreshold (3).
    pub failure_threshold: u32,
}

fn secs(v: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(
        v.and_then(|v| u64::try_from(v).ok())
            .filter(|v| *v > 0)
            .unwrap_or(default),
    )
}

impl Thresholds {
    /// Reads the threshold fields of a probe.
    pub fn of(p: &Probe) -> Self {
        Self {
            initial_delay: Duration::from_secs(
                p.initial_delay_seconds
                    .and_then(|v| u64::try_from(v).ok())
                    .unwrap_or(0),
            ),
            period: secs(p.period_seconds, 10),
            timeout: secs(p.timeout_seconds, 1),
            success_threshold: p
                .success_threshold
                .and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(1),
            failure_threshold: p
                .failure_threshold
                .and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(3),
        }
    }
}

/// The threshold state of one probe of one container run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTracker {
    /// The thresholds.
    pub thresholds: Thresholds,
    next_due: Instant,
    successes: u32,
    failures: u32,
    /// The current verdict: `None` until a threshold is first crossed.
    pub healthy: Option<bool>,
    /// Whether a run is in flight.
    pub in_flight: bool,
}

impl ProbeTracker {
    /// A tracker for a container that started at `started`.
    pub fn new(thresholds: Thresholds, started: Instant) -> Self {
        Self {
            thresholds,
            next_due: started + thresholds.initial_delay,
            successes: 0,
            failures: 0,
            healthy: None,
            in_flight: false,
        }
    }

    /// Whether a run should start now.
    pub fn due(&self, now: Instant) -> bool {
        !self.in_flight && now >= self.next_due
    }

    /// Marks a run as started at `now`.
    pub fn started(&mut self, now: Instant) {
        self.in_flight = true;
        self.next_due = now + self.thresholds.period;
    }

    /// Records a result; returns the verdict if it changed.
    pub fn record(&mut self, ok: bool) -> Option<bool> {
        self.in_flight = false;
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            if self.successes >= self.thresholds.success_threshold && self.healthy != Some(true) {
                self.healthy = Some(true);
                return Some(true);
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.failures >= self.thresholds.failure_threshold && self.healthy != Some(false) {
                self.healthy = Some(false);
                return Some(false);
            }
        }
        None
    }

    /// After a liveness/startup failure killed the container, counting starts over.
    pub fn reset_counts(&mut self) {
        self.successes = 0;
        self.failures = 0;
    }
}

/// Resolves a probe or hook port as the kubelet's `extractPort` does: a number, or a name
/// looked up in the container's `ports[].name` (falling back to a number written as a
/// string), and always within 1..=65535.
pub fn resolve_port(p: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    let n: i32 = match p {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => match ports.iter().find(|cp| cp.name.as_deref() == Some(s)) {
            Some(cp) => cp.container_port,
            None => s.parse().map_err(|_| {
                let known: Vec<&str> = ports.iter().filter_map(|cp| cp.name.as_deref()).collect();
                format!("couldn't find port {s:?} in the container's named ports {known:?}")
            })?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("invalid port number: {n}"))
}

/// A certificate verifier that accepts any server certificate (the signature over the
/// handshake is still checked, so the connection is a real TLS session with *some* key).
///
/// Why this is right for probes: the kubelet's HTTPS probes set `InsecureSkipVerify: true`
/// because a probe targets the pod's own IP, for which no CA in the cluster issues a
/// certificate, and a probe asks "is the process serving" rather than "is it who it claims".
/// No credentials or data travel over a probe connection; only the status code is read.
#[derive(Debug)]
struct AcceptAnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS client configuration of HTTPS probes (see [`AcceptAnyCert`] for why the
/// certificate is not verified). Built once, with the ring provider.
fn probe_tls() -> Result<Arc<rustls::ClientConfig>, String> {
    static CFG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CFG.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
            .with_no_client_auth();
        Ok(Arc::new(cfg))
    })
    .clone()
}

/// Sends the GET request and reads the status code of the response.
async fn exchange<S>(s: &mut S, req: &str) -> Result<u16, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    s.flush().await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        let r = s.read(&mut buf[n..]).await.map_err(|e| e.to_string())?;
        if r == 0 {
            break;
        }
        n += r;
    }
    let line = String::from_utf8_lossy(&buf[..n]).to_string();
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("malformed HTTP response {line:?}"))
}

/// Runs an httpGet action (`scheme` HTTP or HTTPS): success on a 2xx or 3xx status. `ports`
/// are the container's ports, for a named `port`.
pub async fn http_get(
    action: &HTTPGetAction,
    pod_ip: IpAddr,
    ports: &[ContainerPort],
    timeout: Duration,
) -> ProbeOutcome {
    let host: IpAddr = match action.host.as_deref() {
        Some(h) if !h.is_empty() => match h.parse() {
            Ok(ip) => ip,
            Err(_) => return ProbeOutcome::Error(format!("host {h:?} is not an IP address")),
        },
        _ => pod_ip,
    };
    let tls = match action.scheme.as_deref().unwrap_or("HTTP") {
        s if s.eq_ignore_ascii_case("HTTP") => false,
        s if s.eq_ignore_ascii_case("HTTPS") => true,
        s => return ProbeOutcome::Error(format!("unsupported scheme {s:?}")),
    };
    let port = match resolve_port(&action.port, ports) {
        Ok(p) => p,
        Err(e) => return ProbeOutcome::Error(e),
    };
    let scheme = if tls { "https" } else { "http" };
    let path = action.path.clone().unwrap_or_else(|| "/".into());
    let mut req = format!(
        "GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/palisade\r\n"
    );
    for h in action.http_headers.iter().flatten() {
        req.push_str(&format!("{}: {}\r\n", h.name, h.value));
    }
    req.push_str("\r\n");
    let fut = async move {
        let mut s = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| e.to_string())?;
        if tls {
            let connector = tokio_rustls::TlsConnector::from(probe_tls()?);
            let name = rustls::pki_types::ServerName::IpAddress(host.into());
            let mut t = connector
                .connect(name, s)
                .await
                .map_err(|e| format!("TLS handshake: {e}"))?;
            exchange(&mut t, &req).await
        } else {
            exchange(&mut s, &req).await
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(code)) if (200..400).contains(&code) => ProbeOutcome::Success,
        Ok(Ok(code)) => ProbeOutcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
        Ok(Err(e)) => ProbeOutcome::Failure(format!("Get {scheme}://{host}:{port}{path}: {e}")),
        Err(_) => ProbeOutcome::Failure(format!(
            "Get {scheme}://{host}:{port}{path}: timeout after {timeout:?}"
        )),
    }
}

/// Runs a tcpSocket action: success when the connection opens. `ports` are the container's
/// ports, for a named `port`.
pub async fn tcp(
    host: IpAddr,
    port: &IntOrString,
    ports: &[ContainerPort],
    timeout: Duration,
) -> ProbeOutcome {
    let port = match resolve_port(port, ports) {
        Ok(p) => p,
        Err(e) => return ProbeOutcome::Error(e),
    };
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => ProbeOutcome::Success,
        Ok(Err(e)) => ProbeOutcome::Failure(format!("dial tcp {host}:{port}: {e}")),
        Err(_) => ProbeOutcome::Failure(format!("dial tcp {host}:{port}: timeout")),
    }
}

/// Runs any probe action except exec (which needs the runtime): httpGet, tcpSocket or grpc,
/// against `addr` (the pod's IP). Returns `None` for an exec probe.
pub async fn run_network(
    probe: &Probe,
    addr: IpAddr,
    ports: &[ContainerPort],
    timeout: Duration,
) -> Option<ProbeOutcome> {
    if let Some(g) = &probe.http_get {
        return Some(http_get(g, addr, ports, timeout).await);
    }
    if let Some(t) = &probe.tcp_socket {
        let host = match t.host.as_deref() {
            Some(h) if !h.is_empty() => match h.parse() {
                Ok(ip) => ip,
                Err(_) => {
                    return Some(ProbeOutcome::Error(format!(
                        "host {h:?} is not an IP address"
                    )))
                }
            },
            _ => addr,
        };
        return Some(tcp(host, &t.port, ports, timeout).await);
    }
    if let Some(g) = &probe.grpc {
        let Some(port) = u16::try_from(g.port).ok().filter(|p| *p > 0) else {
            return Some(ProbeOutcome::Error(format!(
                "invalid port number: {}",
                g.port
            )));
        };
        return Some(crate::grpc_health::check(addr, port, g.service.as_deref(), timeout).await);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn th(success: u32, failure: u32) -> Thresholds {
        Thresholds {
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    #[test]
    fn defaults_follow_the_api() {
        let t = Thresholds::of(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        assert_eq!(t.initial_delay, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn initial_delay_and_period_schedule_runs() {
        let t0 = Instant::now();
        let mut p = ProbeTracker::new(th(1, 3), t0);
        assert!(!p.due(t0 + Duration::from_secs(4)));
        assert!(p.due(t0 + Duration::from_secs(5)));
        p.started(t0 + Duration::from_secs(5));
        assert!(!p.due(t0 + Duration::from_secs(6)), "in flight");
        p.record(true);
        assert!(!p.due(t0 + Duration::from_secs(6)));
        assert!(p.due(t0 + Duration::from_secs(7)));
    }

    #[tokio::test(start_paused = true)]
    async fn thresholds_need_consecutive_results() {
        let mut p = ProbeTracker::new(th(2, 3), Instant::now());
        assert_eq!(p.record(true), None);
        assert_eq!(p.record(true), Some(true));
        assert_eq!(p.record(false), None);
        assert_eq!(p.record(false), None);
        assert_eq!(p.record(true), None, "a success resets the failure count");
        assert_eq!(p.record(false), None);
        assert_eq!(p.record(false), None);
        assert_eq!(p.record(false), Some(false));
        assert_eq!(p.record(false), None, "verdict reported once");
        assert_eq!(p.record(true), None);
        assert_eq!(p.record(true), Some(true));
    }

    #[tokio::test]
    async fn http_probe_accepts_2xx_3xx_and_rejects_others() {
        for (status, ok) in [("200 OK", true), ("302 Found", true), ("500 Oops", false)] {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = l.local_addr().unwrap().port();
            let status = status.to_string();
            tokio::spawn(async move {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(format!("HTTP/1.0 {status}\r\n\r\n").as_bytes())
                    .await;
            });
            let action = HTTPGetAction {
                port: IntOrString::Int(port.into()),
                path: Some("/healthz".into()),
                ..Default::default()
            };
            let got = http_get(
                &action,
                "127.0.0.1".parse().unwrap(),
                &[],
                Duration::from_secs(5),
            )
            .await;
            assert_eq!(got == ProbeOutcome::Success, ok, "{got:?}");
        }
    }

    #[tokio::test]
    async fn tcp_probe_detects_closed_port() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let ip = "127.0.0.1".parse().unwrap();
        assert_eq!(
            tcp(
                ip,
                &IntOrString::Int(port.into()),
                &[],
                Duration::from_secs(5)
            )
            .await,
            ProbeOutcome::Success
        );
        drop(l);
        assert!(matches!(
            tcp(
                ip,
                &IntOrString::Int(port.into()),
                &[],
                Duration::from_secs(5)
            )
            .await,
            ProbeOutcome::Failure(_)
        ));
    }
}
