//! A small client for the lab server's admin API (volumes and grants), used by the attacher,
//! the bench and the tests. Fencing itself goes through `palisade-storagefw`.

use std::net::IpAddr;

use palisade_storagefw::Secret;
use serde_json::{json, Value};

use crate::error::AdminError;

/// Admin API client with a pinned CA and a bearer token.
#[derive(Debug, Clone)]
pub struct AdminClient {
    base: String,
    token: Secret,
    http: reqwest::Client,
}

impl AdminClient {
    /// `base` is `https://host:port`; `ca_pem` is the only trusted CA.
    pub fn new(base: &str, ca_pem: &[u8], token: Secret) -> Result<Self, AdminError> {
        let setup = |e: &dyn std::fmt::Display| AdminError::Setup {
            reason: e.to_string(),
        };
        let mut tls = palisade_telemetry::tls::pinned(ca_pem).map_err(|e| setup(&e))?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .no_proxy()
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| setup(&e))?;
        Ok(AdminClient {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http,
        })
    }

    async fn call(
        &self,
        op: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, AdminError> {
        let mut rb = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(self.token.expose());
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let transport = |source| AdminError::Transport {
            op: op.to_owned(),
            source,
        };
        let resp = rb.send().await.map_err(transport)?;
        let status = resp.status();
        let text = resp.text().await.map_err(transport)?;
        if !status.is_success() {
            return Err(AdminError::Http {
                op: op.to_owned(),
                status: status.as_u16(),
                body: text,
            });
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Creates a volume (idempotent).
    pub async fn create_volume(&self, volume: &str) -> Result<Value, AdminError> {
        let path = format!("/v1/volumes/{volume}");
        self.call("create volume", reqwest::Method::PUT, &path, None)
            .await
    }

    /// Grants `node` write access to `volume` from `addresses`.
    pub async fn grant(
        &self,
        volume: &str,
        node: &str,
        addresses: &[IpAddr],
    ) -> Result<Value, AdminError> {
        let path = format!("/v1/volumes/{volume}/grants/{node}");
        let body = json!({ "addresses": addresses });
        self.call("grant", reqwest::Method::PUT, &path, Some(body))
            .await
    }

    /// Revokes `node`'s write access to `volume`.
    pub async fn revoke(&self, volume: &str, node: &str) -> Result<Value, AdminError> {
        let path = format!("/v1/volumes/{volume}/grants/{node}");
        self.call("revoke", reqwest::Method::DELETE, &path, None)
            .await
    }

    /// The whole server status.
    pub async fn status(&self) -> Result<Value, AdminError> {
        self.call("status", reqwest::Method::GET, "/v1/status", None)
            .await
    }

    /// One node's status.
    pub async fn node(&self, node: &str) -> Result<Value, AdminError> {
        let path = format!("/v1/nodes/{node}");
        self.call("node status", reqwest::Method::GET, &path, None)
            .await
    }
}
