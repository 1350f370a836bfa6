//! The distribution API v2 client: manifests and blobs over HTTPS, verified against one CA
//! bundle, authenticating as the registry's challenge asks (Basic, or a Bearer token fetched
//! with the pull secret's credentials).
//!
//! [`RegistryApi`] is the seam the pull logic uses; tests put an in-memory registry behind it.

use std::io::Write;
use std::time::Duration;

use parking_lot::Mutex;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::StatusCode;

use super::auth::{parse_challenge, Challenge, Credentials};
use super::error::PullError;
use super::reference::Reference;

/// How long a manifest or token request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a blob download may stall between two chunks.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A manifest as served: body, `Content-Type`, and `Docker-Content-Digest` if given.
#[derive(Debug, Clone)]
pub struct ManifestResponse {
    /// The raw bytes (their digest is the manifest's identity).
    pub body: Vec<u8>,
    /// The media type the registry declared.
    pub content_type: Option<String>,
}

/// What a pull needs from a registry.
#[async_trait::async_trait]
pub trait RegistryApi: Send + Sync {
    /// `GET /v2/<repo>/manifests/<reference>` (a tag or a digest).
    async fn manifest(&self, r: &Reference, reference: &str)
        -> Result<ManifestResponse, PullError>;
    /// `GET /v2/<repo>/blobs/<digest>`, written into `sink` as it arrives.
    async fn blob(
        &self,
        r: &Reference,
        digest: &str,
        sink: &mut (dyn Write + Send),
    ) -> Result<(), PullError>;
}

/// Builds the HTTPS client every pull shares: TLS verified against `ca_pem` only (no
/// built-in roots, no way to turn verification off).
pub fn https_client(ca_pem: &[u8]) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(palisade_telemetry::tls::pinned(ca_pem)?)
        .https_only(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .build()
        .map_err(|e| format!("HTTPS client: {e}"))
}

/// A registry over HTTPS, with the credentials of one pull.
pub struct HttpRegistry {
    client: reqwest::Client,
    creds: Option<Credentials>,
    /// The `Authorization` header value that the registry accepted (or asked for) last.
    authorization: Mutex<Option<String>>,
}

impl HttpRegistry {
    /// A client for one pull.
    pub fn new(client: reqwest::Client, creds: Option<Credentials>) -> Self {
        HttpRegistry {
            client,
            creds,
            authorization: Mutex::new(None),
        }
    }

    fn url(r: &Reference, kind: &str, reference: &str) -> String {
        format!(
            "https://{}/v2/{}/{kind}/{reference}",
            r.api_host(),
            r.repository
        )
    }

    fn basic(&self) -> Option<String> {
        use base64::Engine as _;
        self.creds.as_ref().map(|c| {
            let raw = format!("{}:{}", c.username, c.password);
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(raw)
            )
        })
    }

    /// Sends a GET, answering one authentication challenge if the registry sends one.
    async fn get(
        &self,
        url: &str,
        accept: Option<&str>,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, PullError> {
        let send = |auth: Option<String>| {
            let mut req = self.client.get(url);
            if let Some(a) = accept {
                req = req.header(ACCEPT, a);
            }
            if let Some(a) = auth {
                req = req.header(AUTHORIZATION, a);
            }
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            req.send()
        };
        let http = |source| PullError::Http {
            url: url.to_string(),
            source,
        };
        let current = self.authorization.lock().clone();
        let resp = send(current).await.map_err(http)?;
        if resp.status() != StatusCode::UNAUTHORIZED {
            return check(url, resp).await;
        }
        let challenge = resp
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_challenge);
        let auth = match challenge {
            Some(Challenge::Basic) => self.basic().ok_or_else(|| PullError::Unauthorized {
                url: url.to_string(),
                message:
                    "the registry asks for credentials and the pod has no imagePullSecret for it"
                        .into(),
            })?,
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                format!("Bearer {}", self.token(&realm, service, scope).await?)
            }
            None => {
                return Err(PullError::Unauthorized {
                    url: url.to_string(),
                    message: "no usable WWW-Authenticate challenge".into(),
                })
            }
        };
        *self.authorization.lock() = Some(auth.clone());
        check(url, send(Some(auth)).await.map_err(http)?).await
    }

    async fn token(
        &self,
        realm: &str,
        service: Option<String>,
        scope: Option<String>,
    ) -> Result<String, PullError> {
        let mut req = self.client.get(realm).timeout(REQUEST_TIMEOUT);
        let q: Vec<(&str, String)> = [("service", service), ("scope", scope)]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        req = req.query(&q);
        if let Some(b) = self.basic() {
            req = req.header(AUTHORIZATION, b);
        }
        let resp = req.send().await.map_err(|source| PullError::Http {
            url: realm.into(),
            source,
        })?;
        let resp = check(realm, resp).await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = resp.json().await.map_err(|source| PullError::Http {
            url: realm.into(),
            source,
        })?;
        t.token
            .or(t.access_token)
            .ok_or_else(|| PullError::Unauthorized {
                url: realm.into(),
                message: "the token service returned no token".into(),
            })
    }
}

/// Maps an error status to a [`PullError`].
async fn check(url: &str, resp: reqwest::Response) -> Result<reqwest::Response, PullError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body: String = resp
        .text()
        .await
        .unwrap_or_default()
        .chars()
        .take(300)
        .collect();
    Err(match status {
        StatusCode::NOT_FOUND => PullError::NotFound { url: url.into() },
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => PullError::Unauthorized {
            url: url.into(),
            message: body,
        },
        s => PullError::Status {
            url: url.into(),
            status: s.as_u16(),
            body,
        },
    })
}

#[async_trait::async_trait]
impl RegistryApi for HttpRegistry {
    async fn manifest(
        &self,
        r: &Reference,
        reference: &str,
    ) -> Result<ManifestResponse, PullError> {
        let url = Self::url(r, "manifests", reference);
        let resp = self
            .get(&url, Some(super::manifest::ACCEPT), Some(REQUEST_TIMEOUT))
            .await?;
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp.bytes().await.map_err(|source| PullError::Http {
            url: url.clone(),
            source,
        })?;
        Ok(ManifestResponse {
            body: body.to_vec(),
            content_type,
        })
    }

    async fn blob(
        &self,
        r: &Reference,
        digest: &str,
        sink: &mut (dyn Write + Send),
    ) -> Result<(), PullError> {
        let url = Self::url(r, "blobs", digest);
        let mut resp = self.get(&url, None, None).await?;
        while let Some(chunk) = resp.chunk().await.map_err(|source| PullError::Http {
            url: url.clone(),
            source,
        })? {
            sink.write_all(&chunk).map_err(|source| PullError::Layer {
                digest: digest.into(),
                source,
            })?;
        }
        Ok(())
    }
}
