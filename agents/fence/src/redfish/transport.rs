//! HTTPS exchanges with one BMC: every request bounded in time, every body bounded in size,
//! redirects followed only within the BMC's own origin, and every failure turned into a
//! [`FenceError`] that names the device and, for an HTTP error, carries the Redfish error
//! message.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use url::Url;

use crate::error::FenceError;
use crate::secret::Secret;
use crate::target::RedfishTls;

/// The largest response body read from a BMC. A ComputerSystem is a few KiB; anything near
/// this is not an answer we can use.
pub(crate) const MAX_BODY: usize = 1 << 20;

/// The header a Redfish session token travels in.
pub(crate) const X_AUTH_TOKEN: &str = "X-Auth-Token";

/// How requests authenticate.
#[derive(Clone)]
pub(crate) enum Auth {
    /// Nothing (the service root, which is readable without credentials).
    None,
    /// HTTP Basic on every request.
    Basic {
        /// Account name.
        user: String,
        /// Its password.
        password: Secret,
    },
    /// A Redfish session.
    Token(Secret),
}

/// An answer: status, headers and a bounded body.
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

/// Status and size only: the headers may hold a session token.
impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply")
            .field("status", &self.status)
            .field("bytes", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl Reply {
    /// The body as JSON (an empty body is `null`).
    pub(crate) fn json(&self, device: &str, what: &str) -> Result<Value, FenceError> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&self.body).map_err(|e| FenceError::Protocol {
            device: device.to_string(),
            detail: format!(
                "{what}: the answer is not JSON ({e}): {}",
                excerpt(&self.body)
            ),
        })
    }

    /// A header's value, when it is text.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The HTTPS client of one BMC.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    client: reqwest::Client,
    base: Url,
    device: String,
    request_timeout: Duration,
    retries: u32,
    insecure: bool,
    /// What the BMC's certificate is pinned to, for identity errors ("the CA in /ca.pem").
    trust: String,
    /// The operation budget (`power_timeout`) that bounds retries.
    budget: Duration,
}

impl Http {
    /// Builds the client (nothing is sent). Each request is bounded by `request_timeout`, and
    /// retries by `budget`.
    pub(crate) fn new(
        device: &str,
        host: &str,
        port: u16,
        trust: &RedfishTls,
        request_timeout: Duration,
        retries: u32,
        budget: Duration,
    ) -> Result<Self, FenceError> {
        let config = |e: String| FenceError::Config(format!("{device}: {e}"));
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let base: Url = format!("https://{host}:{port}/")
            .parse()
            .map_err(|e| config(format!("{e}")))?;
        let origin = base.origin();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(super::tls::client_config(trust).map_err(config)?)
            .connect_timeout(request_timeout)
            .timeout(request_timeout)
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                // sushy answers a system by name with 307 to its UUID URL; a redirect to
                // another host would carry our credentials there: stop, and report it.
                if attempt.previous().len() > 3 || attempt.url().origin() != origin {
                    attempt.stop()
                } else {
                    attempt.follow()
                }
            }))
            .http1_only()
            .no_proxy()
            .build()
            .map_err(|e| config(super::chain(&e)))?;
        Ok(Self {
            client,
            base,
            device: device.to_string(),
            request_timeout,
            retries,
            insecure: matches!(trust, RedfishTls::Insecure),
            trust: super::tls::describe(trust),
            budget,
        })
    }

    /// The device description errors carry.
    pub(crate) fn device(&self) -> &str {
        &self.device
    }

    /// Whether certificate checks are off (`ssl_insecure`).
    pub(crate) fn insecure(&self) -> bool {
        self.insecure
    }

    /// Resolves a Redfish URI (`@odata.id`, `Location`) against the BMC, refusing one that
    /// points at another origin: the BMC must not send our credentials elsewhere.
    pub(crate) fn url(&self, uri: &str) -> Result<Url, FenceError> {
        let url = self.base.join(uri).map_err(|e| FenceError::Protocol {
            device: self.device.clone(),
            detail: format!("bad URI {uri:?}: {e}"),
        })?;
        if url.origin() != self.base.origin() {
            return Err(FenceError::Protocol {
                device: self.device.clone(),
                detail: format!("the BMC pointed at another origin ({url}); refusing to follow"),
            });
        }
        Ok(url)
    }

    /// Sends one request and reads its answer, whatever the status.
    pub(crate) async fn send(
        &self,
        method: Method,
        uri: &str,
        auth: &Auth,
        body: Option<&Value>,
    ) -> Result<Reply, FenceError> {
        let url = self.url(uri)?;
        let what = format!("{method} {}", url.path());
        let mut req = self
            .client
            .request(method, url.clone())
            .header(ACCEPT, "application/json");
        match auth {
            Auth::None => {}
            Auth::Basic { user, password } => {
                req = req.basic_auth(user, Some(password.expose()));
            }
            Auth::Token(token) => {
                let mut v =
                    HeaderValue::from_str(token.expose()).map_err(|_| FenceError::Protocol {
                        device: self.device.clone(),
                        detail: "the session token is not a valid header value".into(),
                    })?;
                v.set_sensitive(true);
                req = req.header(X_AUTH_TOKEN, v);
            }
        }
        if let Some(b) = body {
            req = req
                .header(CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| self.transport_error(&what, &e))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let mut body = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    if body.len() + c.len() > MAX_BODY {
                        return Err(FenceError::Protocol {
                            device: self.device.clone(),
                            detail: format!("{what}: answer larger than {MAX_BODY} bytes"),
                        });
                    }
                    body.extend_from_slice(&c);
                }
                Ok(None) => break,
                // An error answer whose body ends in a bare close (no length, no TLS
                // close_notify, as some BMC web servers send a 404): the status is the news,
                // not the way the connection ended.
                Err(e) if !status.is_success() => {
                    tracing::debug!(device = %self.device, request = %what, status = status.as_u16(), error = %super::chain(&e), "error answer ended abruptly");
                    break;
                }
                Err(e) => return Err(self.transport_error(&what, &e)),
            }
        }
        tracing::debug!(device = %self.device, request = %what, status = status.as_u16(), bytes = body.len(), "redfish exchange");
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// Sends a request and fails unless the status is 2xx.
    pub(crate) async fn send_ok(
        &self,
        method: Method,
        uri: &str,
        auth: &Auth,
        body: Option<&Value>,
    ) -> Result<Reply, FenceError> {
        let what = format!("{method} {uri}");
        let r = self.send(method, uri, auth, body).await?;
        self.check(&what, r)
    }

    /// GETs a resource as JSON, retrying transport failures (not HTTP errors) up to the
    /// device's retry count.
    ///
    /// Guarantees: retries stop once another whole request would end past the operation
    /// budget (`power_timeout`), and a timeout reports the time really spent over all attempts.
    pub(crate) async fn get_json(&self, uri: &str, auth: &Auth) -> Result<Value, FenceError> {
        let mut attempt = 0;
        let started = tokio::time::Instant::now();
        loop {
            match self.send_ok(Method::GET, uri, auth, None).await {
                Ok(r) => {
                    let v = r.json(&self.device, &format!("GET {uri}"))?;
                    if !v.is_object() {
                        return Err(FenceError::Protocol {
                            device: self.device.clone(),
                            detail: format!("GET {uri}: the answer is not a JSON object"),
                        });
                    }
                    return Ok(v);
                }
                Err(e)
                    if e.is_retryable()
                        && attempt < self.retries
                        && started.elapsed() + self.request_timeout <= self.budget =>
                {
                    attempt += 1;
                    tracing::debug!(device = %self.device, error = %e, attempt, "retrying GET");
                }
                Err(FenceError::Timeout {
                    device, operation, ..
                }) => {
                    return Err(FenceError::Timeout {
                        device,
                        operation: match attempt {
                            0 => operation,
                            n => format!("{operation} ({} attempts)", n + 1),
                        },
                        after: started.elapsed(),
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Turns a non-2xx answer into an error carrying the Redfish error message.
    pub(crate) fn check(&self, what: &str, r: Reply) -> Result<Reply, FenceError> {
        if r.status.is_success() {
            return Ok(r);
        }
        let detail = format!(
            "{what}: HTTP {}{}",
            r.status.as_u16(),
            match error_message(&r.body) {
                Some(m) => format!(": {m}"),
                None => String::new(),
            }
        );
        Err(match r.status.as_u16() {
            401 | 403 => FenceError::AuthRefused {
                device: self.device.clone(),
                detail,
            },
            300..=399 => FenceError::Protocol {
                device: self.device.clone(),
                detail: format!(
                    "{detail}: redirect to {} not followed (another origin, or too many)",
                    r.header("location").unwrap_or("nowhere")
                ),
            },
            _ => FenceError::DeviceRefused {
                device: self.device.clone(),
                detail,
            },
        })
    }

    fn transport_error(&self, what: &str, e: &reqwest::Error) -> FenceError {
        if let Some(found) = super::tls::certificate_refusal(e) {
            return FenceError::IdentityMismatch {
                device: self.device.clone(),
                expected: self.trust.clone(),
                found,
            };
        }
        if e.is_timeout() {
            return FenceError::Timeout {
                device: self.device.clone(),
                operation: what.to_string(),
                after: self.request_timeout,
            };
        }
        let text = super::chain(e);
        if e.is_connect() {
            return FenceError::Unreachable {
                device: self.device.clone(),
                source: std::io::Error::other(format!("{what}: {text}")),
            };
        }
        FenceError::Protocol {
            device: self.device.clone(),
            detail: format!("{what}: {text}"),
        }
    }
}

/// The message of a Redfish error body (`error.message` and each
/// `@Message.ExtendedInfo[].Message`), or an excerpt of a body that is not one.
pub(crate) fn error_message(body: &[u8]) -> Option<String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Some(excerpt(body));
    };
    let Some(err) = v.get("error") else {
        return Some(excerpt(body));
    };
    let mut parts = Vec::new();
    for key in ["code", "message"] {
        if let Some(s) = err.get(key).and_then(Value::as_str) {
            parts.push(s.to_string());
        }
    }
    if let Some(infos) = err.get("@Message.ExtendedInfo").and_then(Value::as_array) {
        for i in infos {
            if let Some(s) = i.get("Message").and_then(Value::as_str) {
                parts.push(s.to_string());
            }
        }
    }
    Some(if parts.is_empty() {
        excerpt(body)
    } else {
        parts.join("; ")
    })
}

/// The first 200 characters of a body, printable only.
pub(crate) fn excerpt(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(body);
    let mut out: String = s
        .chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.chars().count() > 200 {
        out.push('…');
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redfish_error_bodies_are_reported_with_their_messages() {
        let body = br#"{"error":{"code":"Base.1.0.GeneralError","message":"A general error has occurred.","@Message.ExtendedInfo":[{"MessageId":"Base.1.0.ActionParameterValueNotInList","Message":"The value PowerCycle for ResetType is not supported."}]}}"#;
        assert_eq!(
            error_message(body).unwrap(),
            "Base.1.0.GeneralError; A general error has occurred.; The value PowerCycle for ResetType is not supported."
        );
        assert_eq!(error_message(b"  \n"), None);
        assert_eq!(
            error_message(b"<html>\nNope</html>").unwrap(),
            "<html> Nope</html>"
        );
        assert_eq!(error_message(br#"{"x":1}"#).unwrap(), r#"{"x":1}"#);
        let long = "x".repeat(500);
        assert_eq!(error_message(long.as_bytes()).unwrap().chars().count(), 201);
    }
}
