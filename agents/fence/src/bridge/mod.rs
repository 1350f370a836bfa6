//! The `bridge://` client: how the cluster side (controller, agents) talks to the
//! firmware-bridge, and the [`BridgeDevice`] backend behind `bridge://host:port/target-id`.
//!
//! The client presents a client certificate, trusts **only** the configured CA (pinning: no
//! system roots), and bounds every request with connect and request timeouts. It lives here,
//! not in `palisade-bridge`, because the bridge depends on this crate.
//!
//! - [`wire`]: actions, states, the request body and storage holds as they appear in the
//!   bridge's JSON;
//! - [`BridgeClient`]: the typed HTTP client (`/v1` power, storage, monitor, audit);
//! - [`device`]: [`BridgeDevice`], a [`crate::PowerDevice`] that fences through the bridge.

use std::time::Duration;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

pub mod device;
pub mod wire;

pub use device::{BridgeDevice, BridgeIdentity};
use wire::{ActionBody, Health, PowerAction, PowerState, StorageAction, StorageHold, StorageState};

/// Response header set when the bridge answered from its idempotency cache.
pub const REPLAYED: &str = "idempotent-replayed";

/// The `error` code (HTTP 409) of a storage unblock under a hold that the storage did not lift:
/// the bridge lifted the request's hold, but a read-back after the command still reports the
/// target blocked, because another fence's hold (or a block without a hold) remains. The
/// target stays fenced; this is never an unblock.
pub const STORAGE_STILL_HELD: &str = "storage_still_held";

/// Errors of the bridge client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The TLS material given to the client is unusable.
    #[error("bridge client TLS setup: {0}")]
    Setup(String),
    /// A `bridge://` URL is malformed.
    #[error("invalid bridge URL {url:?}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The request did not complete (connect, TLS, timeout).
    #[error("request to bridge {url} failed: {chain}")]
    Transport {
        /// The request URL.
        url: String,
        /// The full error chain, including TLS alerts.
        chain: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// The bridge answered with an error status.
    #[error("bridge refused {url}: HTTP {status} {code}: {message}")]
    Api {
        /// The request URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// Error code from the body (e.g. `stale_fencing_token`).
        code: String,
        /// Message from the body.
        message: String,
        /// The full JSON body (may hold evidence).
        body: Value,
    },
}

impl ClientError {
    /// The HTTP status, for [`ClientError::Api`].
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether retrying with the *same* idempotency key may help (transport errors, 429,
    /// 5xx other than a device failure). Stale tokens, policy denials and bad requests never.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Transport { .. } => true,
            ClientError::Api { status, .. } => *status == 429 || *status == 503 || *status == 504,
            _ => false,
        }
    }
}

/// Parses `bridge://host:port/target-id` into the bridge's base URL
/// (`https://host:port/`) and the target id.
pub fn parse_bridge_url(s: &str) -> Result<(Url, String), ClientError> {
    let err = |reason: &str| ClientError::Url {
        url: s.into(),
        reason: reason.into(),
    };
    let u = Url::parse(s).map_err(|e| err(&e.to_string()))?;
    if u.scheme() != "bridge" {
        return Err(err("scheme must be bridge://"));
    }
    if !u.username().is_empty() || u.password().is_some() || u.query().is_some() {
        return Err(err("only bridge://host:port/target-id is allowed"));
    }
    let host = u.host_str().ok_or_else(|| err("missing bridge host"))?;
    let port = u.port().ok_or_else(|| err("missing bridge port"))?;
    let segs: Vec<&str> = u
        .path_segments()
        .map(|p| p.filter(|x| !x.is_empty()).collect())
        .unwrap_or_default();
    let [id] = segs.as_slice() else {
        return Err(err("expected exactly one path segment, the target id"));
    };
    let base = Url::parse(&format!("https://{host}:{port}/")).map_err(|e| err(&e.to_string()))?;
    Ok((base, (*id).to_string()))
}

/// The answer to an action or status request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpResponse {
    /// Target id.
    pub target: String,
    /// Action name (`power.off`, `storage.status`, ...).
    pub action: String,
    /// `ok` (errors come back as [`ClientError::Api`]).
    pub result: String,
    /// Observed state (`on`/`off`, `blocked`/`unblocked`, `ok`/`degraded`).
    #[serde(default)]
    pub state: Value,
    /// Whether the state was read back after acting.
    #[serde(default)]
    pub verified: bool,
    /// Verification evidence from the agents.
    #[serde(default)]
    pub evidence: Value,
    /// The fencing token the action carried.
    #[serde(default)]
    pub token: Option<u64>,
    /// The idempotency key the action carried.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// True when the bridge answered from its idempotency cache (the device was not touched).
    #[serde(skip)]
    pub replayed: bool,
}

impl OpResponse {
    /// The power state, if this is a power response.
    pub fn power_state(&self) -> Option<PowerState> {
        serde_json::from_value(self.state.clone()).ok()
    }
    /// The storage state, if this is a storage response.
    pub fn storage_state(&self) -> Option<StorageState> {
        serde_json::from_value(self.state.clone()).ok()
    }
    /// The health, if this is a monitor response.
    pub fn health(&self) -> Option<Health> {
        serde_json::from_value(self.state.clone()).ok()
    }
}

/// One audit record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// RFC 3339 UTC time the request finished.
    pub time: String,
    /// Client identity (certificate CN or first SAN).
    pub client: String,
    /// Action, e.g. `power.off`, `storage.block`, `power.status`.
    pub action: String,
    /// Target id.
    pub target: String,
    /// Fencing token, for mutating requests.
    pub token: Option<u64>,
    /// Idempotency key, for mutating requests.
    pub idempotency_key: Option<String>,
    /// The fence's storage hold the request named (storage actions only); `None` for a
    /// node-wide storage action, any other action, and records written before holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    /// `ok`, `replayed`, `denied`, `stale_token`, `rate_limited`, `still_held`, `error`, ...
    pub result: String,
    /// HTTP status returned.
    pub status: u16,
    /// Human-readable detail.
    pub message: Option<String>,
    /// Verification evidence from the executor.
    pub evidence: Value,
    /// Wall time spent handling the request, milliseconds.
    pub duration_ms: u64,
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// Bridge base URL, e.g. `https://127.0.0.1:8443/`.
    pub base_url: Url,
    /// PEM of the CA that signed the bridge's server certificate (the only trusted root).
    pub ca_pem: Vec<u8>,
    /// PEM of this client's certificate chain.
    pub cert_pem: Vec<u8>,
    /// PEM of this client's private key.
    pub key_pem: Vec<u8>,
    /// TCP+TLS connect timeout. Default 5 s.
    pub connect_timeout: Duration,
    /// Whole-request timeout (covers a verified power-off). Default 150 s.
    pub request_timeout: Duration,
    /// The W3C `traceparent` of the caller's current span, sent with every request so the
    /// bridge's spans join the caller's trace (the controller passes
    /// `palisade_telemetry::traceparent`). Default none: no header.
    pub trace_context: Option<TraceContext>,
}

/// A source of the W3C `traceparent` header for the request being sent (`None`: no header).
pub type TraceContext = fn() -> Option<String>;

impl ClientSettings {
    /// Settings with default timeouts.
    pub fn new(base_url: Url, ca_pem: Vec<u8>, cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Self {
        Self {
            base_url,
            ca_pem,
            cert_pem,
            key_pem,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(150),
            trace_context: None,
        }
    }
}

/// A client of one bridge.
#[derive(Debug, Clone)]
pub struct BridgeClient {
    http: reqwest::Client,
    base: Url,
    trace: Option<TraceContext>,
}

fn tls_config(s: &ClientSettings) -> Result<ClientConfig, ClientError> {
    let setup = |what: &str, e: &dyn std::fmt::Display| ClientError::Setup(format!("{what}: {e}"));
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&s.ca_pem) {
        let c = c.map_err(|e| setup("CA PEM", &e))?;
        roots.add(c).map_err(|e| setup("CA certificate", &e))?;
    }
    if roots.is_empty() {
        return Err(ClientError::Setup("CA PEM holds no certificate".into()));
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&s.cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| setup("client certificate PEM", &e))?;
    if certs.is_empty() {
        return Err(ClientError::Setup(
            "client certificate PEM holds no certificate".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&s.key_pem).map_err(|e| match e {
        pem::Error::NoItemsFound => ClientError::Setup("client key PEM holds no key".into()),
        other => setup("client key PEM", &other),
    })?;
    let mut cfg = ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| setup("protocol versions", &e))?
    .with_root_certificates(roots)
    .with_client_auth_cert(certs, key)
    .map_err(|e| setup("client certificate", &e))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Renders an error and all its sources (`a: b: c`), so causes such as TLS alerts or a refused
/// connection reach the status, the Event and the log instead of stopping at the outermost
/// message.
///
/// Guarantees: a source whose text the message already contains (an error that prints its
/// source inline and also returns it from `source()`) is not repeated.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !text.is_empty() && !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod chain_tests {
    use super::chain;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn every_source_once() {
        let refused = E("connection refused", None);
        let sending = E("error sending request", Some(Box::new(refused)));
        let outer = E("bridge unreachable", Some(Box::new(sending)));
        assert_eq!(
            chain(&outer),
            "bridge unreachable: error sending request: connection refused"
        );
        // An outer message that already prints its source inline does not repeat it.
        let inline = E(
            "m0: unreachable: connection refused",
            Some(Box::new(E("connection refused", None))),
        );
        assert_eq!(chain(&inline), "m0: unreachable: connection refused");
    }
}

impl BridgeClient {
    /// Builds a client.
    pub fn new(s: &ClientSettings) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config(s)?)
            .connect_timeout(s.connect_timeout)
            .timeout(s.request_timeout)
            .http1_only()
            .no_proxy()
            .build()
            .map_err(|e| ClientError::Setup(chain(&e)))?;
        Ok(Self {
            http,
            base: s.base_url.clone(),
            trace: s.trace_context,
        })
    }

    fn url(&self, path: &str) -> Result<Url, ClientError> {
        self.base.join(path).map_err(|e| ClientError::Url {
            url: path.into(),
            reason: e.to_string(),
        })
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        url: &Url,
    ) -> Result<(Value, bool), ClientError> {
        let req = match self.trace.and_then(|f| f()) {
            Some(tp) => req.header("traceparent", tp),
            None => req,
        };
        let resp = req.send().await.map_err(|e| ClientError::Transport {
            url: url.to_string(),
            chain: chain(&e),
            source: e,
        })?;
        let status = resp.status().as_u16();
        let replayed = resp.headers().get(REPLAYED).is_some();
        let text = resp.text().await.map_err(|e| ClientError::Transport {
            url: url.to_string(),
            chain: chain(&e),
            source: e,
        })?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !(200..300).contains(&status) {
            let field = |k: &str| {
                body.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            return Err(ClientError::Api {
                url: url.to_string(),
                status,
                code: field("error"),
                message: field("message"),
                body,
            });
        }
        Ok((body, replayed))
    }

    async fn op(&self, req: reqwest::RequestBuilder, url: &Url) -> Result<OpResponse, ClientError> {
        let (body, replayed) = self.send(req, url).await?;
        let mut r: OpResponse =
            serde_json::from_value(body.clone()).map_err(|e| ClientError::Api {
                url: url.to_string(),
                status: 200,
                code: "bad_response".into(),
                message: e.to_string(),
                body,
            })?;
        r.replayed = replayed;
        Ok(r)
    }

    async fn mutate(
        &self,
        path: &str,
        token: u64,
        key: &str,
        body: ActionBody,
    ) -> Result<OpResponse, ClientError> {
        let url = self.url(path)?;
        let mut req = self
            .http
            .post(url.clone())
            .header("Idempotency-Key", key)
            .header("Fencing-Token", token.to_string());
        if body != ActionBody::default() {
            req = req.json(&body);
        }
        self.op(req, &url).await
    }

    /// Power action on `target`, carrying the fencing token and idempotency key.
    pub async fn power(
        &self,
        target: &str,
        action: PowerAction,
        token: u64,
        key: &str,
        reason: Option<&str>,
    ) -> Result<OpResponse, ClientError> {
        let a = match action {
            PowerAction::Off => "off",
            PowerAction::On => "on",
            PowerAction::Reboot => "reboot",
        };
        let body = ActionBody {
            reason: reason.map(str::to_owned),
            hold: None,
        };
        self.mutate(&format!("v1/targets/{target}/power/{a}"), token, key, body)
            .await
    }

    /// Node-wide storage action on `target` (no hold), carrying the fencing token and
    /// idempotency key: [`Self::storage_with_hold`] without a hold.
    pub async fn storage(
        &self,
        target: &str,
        action: StorageAction,
        token: u64,
        key: &str,
        reason: Option<&str>,
    ) -> Result<OpResponse, ClientError> {
        self.storage_with_hold(target, action, token, key, reason, None)
            .await
    }

    /// Storage action on `target` under the fence's `hold`, carrying the fencing token and
    /// idempotency key. With a hold, a block adds it and an unblock lifts only it: if another
    /// hold remains, the bridge refuses with HTTP 409 [`STORAGE_STILL_HELD`] (the target stays
    /// blocked). Without one, both are node-wide.
    ///
    /// Assumptions: the bridge knows `hold` (a bridge older than holds refuses the request as
    /// bad JSON and does nothing; it is never silently unblocked node-wide).
    pub async fn storage_with_hold(
        &self,
        target: &str,
        action: StorageAction,
        token: u64,
        key: &str,
        reason: Option<&str>,
        hold: Option<&StorageHold>,
    ) -> Result<OpResponse, ClientError> {
        let a = match action {
            StorageAction::Block => "block",
            StorageAction::Unblock => "unblock",
        };
        let body = ActionBody {
            reason: reason.map(str::to_owned),
            hold: hold.cloned(),
        };
        self.mutate(
            &format!("v1/targets/{target}/storage/{a}"),
            token,
            key,
            body,
        )
        .await
    }

    async fn get_op(&self, path: &str) -> Result<OpResponse, ClientError> {
        let url = self.url(path)?;
        self.op(self.http.get(url.clone()), &url).await
    }

    /// Power status of `target`.
    pub async fn power_status(&self, target: &str) -> Result<OpResponse, ClientError> {
        self.get_op(&format!("v1/targets/{target}/power")).await
    }

    /// Storage status of `target`.
    pub async fn storage_status(&self, target: &str) -> Result<OpResponse, ClientError> {
        self.get_op(&format!("v1/targets/{target}/storage")).await
    }

    /// Device reachability of `target`.
    pub async fn monitor(&self, target: &str) -> Result<OpResponse, ClientError> {
        self.get_op(&format!("v1/targets/{target}/monitor")).await
    }

    /// Audit records (most recent `limit`), optionally for one target.
    pub async fn audit(
        &self,
        target: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, ClientError> {
        let mut url = self.url("v1/audit")?;
        url.query_pairs_mut()
            .append_pair("limit", &limit.to_string());
        if let Some(t) = target {
            url.query_pairs_mut().append_pair("target", t);
        }
        let (body, _) = self.send(self.http.get(url.clone()), &url).await?;
        serde_json::from_value(body.get("records").cloned().unwrap_or(Value::Null)).map_err(|e| {
            ClientError::Api {
                url: url.to_string(),
                status: 200,
                code: "bad_response".into(),
                message: e.to_string(),
                body,
            }
        })
    }

    /// `GET /healthz`.
    pub async fn healthz(&self) -> Result<(), ClientError> {
        let url = self.url("healthz")?;
        self.send(self.http.get(url.clone()), &url)
            .await
            .map(|_| ())
    }

    /// A raw request (for tests and tools): returns status and body text.
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<(u16, String), ClientError> {
        let url = self.url(path)?;
        let mut req = self.http.request(method, url.clone()).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.map_err(|e| ClientError::Transport {
            url: url.to_string(),
            chain: chain(&e),
            source: e,
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| ClientError::Transport {
            url: url.to_string(),
            chain: chain(&e),
            source: e,
        })?;
        Ok((status, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_urls() {
        let (base, id) = parse_bridge_url("bridge://127.0.0.1:8443/m0").unwrap();
        assert_eq!(base.as_str(), "https://127.0.0.1:8443/");
        assert_eq!(id, "m0");
        assert!(parse_bridge_url("https://127.0.0.1:8443/m0").is_err());
        assert!(
            parse_bridge_url("bridge://m0").is_err(),
            "host, port and id required"
        );
        assert!(parse_bridge_url("bridge://h:1/m0/extra").is_err());
        assert!(parse_bridge_url("bridge://u:p@h:1/m0").is_err());
        assert!(parse_bridge_url("bridge://h:1/m0?x=1").is_err());
    }
}
