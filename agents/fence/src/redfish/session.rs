//! Authentication: a Redfish session (`SessionService`, `X-Auth-Token`) when the BMC has one,
//! HTTP Basic otherwise, and logout on every path.
//!
//! [`Session::open`] reads the service root (readable without credentials), then, unless the
//! target asks for Basic, POSTs the credentials to the sessions collection. A BMC without
//! sessions (no link in the root, or 404/405/501 from the collection) gets Basic auth instead
//! (unless the target asks for sessions only). A 401/403 is a refusal, never a reason to try
//! Basic: the password is wrong, and retrying only locks the account.
//!
//! Guarantees: a session that was created is deleted by [`Session::close`], which every
//! operation of [`super::RedfishDevice`] calls on success and on error; if the operation's
//! future is dropped (cancelled, or timed out by the caller) before that, `Drop` spawns the
//! DELETE on the current tokio runtime. Assumptions: a runtime is still running when a
//! cancelled session is dropped (otherwise the BMC expires the session itself).

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::transport::{Auth, Http, X_AUTH_TOKEN};
use crate::error::FenceError;
use crate::secret::Secret;
use crate::target::RedfishAuth;

/// Where a service root says the sessions collection is, if it has a SessionService.
pub(crate) fn sessions_uri(root: &Value) -> Option<String> {
    if let Some(s) = root
        .pointer("/Links/Sessions/@odata.id")
        .and_then(Value::as_str)
    {
        return Some(s.to_string());
    }
    root.get("SessionService")
        .map(|_| "/redfish/v1/SessionService/Sessions".to_string())
}

/// An authenticated conversation with the BMC.
pub(crate) struct Session {
    http: Http,
    auth: Auth,
    /// The session resource to DELETE on logout (token sessions only, until closed).
    logout_uri: Option<String>,
    /// The service root, as read when the session was opened.
    root: Value,
}

impl Session {
    /// Reads the service root and authenticates as `mode` says.
    pub(crate) async fn open(
        http: &Http,
        user: &str,
        password: &Secret,
        mode: RedfishAuth,
    ) -> Result<Self, FenceError> {
        if http.insecure() {
            tracing::warn!(device = %http.device(), "TLS certificate verification is OFF for this BMC (ssl_insecure): anyone on the path can impersonate it and read its password");
        }
        let root = http.get_json("/redfish/v1/", &Auth::None).await?;
        let basic = Auth::Basic {
            user: user.to_string(),
            password: password.clone(),
        };
        let sessions = sessions_uri(&root);
        let sessions = match (mode, sessions) {
            (RedfishAuth::Basic, _) => None,
            (RedfishAuth::Session, None) => {
                return Err(FenceError::DeviceRefused {
                    device: http.device().to_string(),
                    detail: "auth=session, but the service root links no SessionService".into(),
                })
            }
            (_, s) => s,
        };
        let Some(sessions) = sessions else {
            return Ok(Self {
                http: http.clone(),
                auth: basic,
                logout_uri: None,
                root,
            });
        };
        let body = json!({"UserName": user, "Password": password.expose()});
        let r = http
            .send(Method::POST, &sessions, &Auth::None, Some(&body))
            .await?;
        let fallback = matches!(
            r.status,
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED
        );
        if fallback && mode == RedfishAuth::Auto {
            tracing::info!(device = %http.device(), status = r.status.as_u16(), "the BMC creates no sessions; using HTTP Basic");
            return Ok(Self {
                http: http.clone(),
                auth: basic,
                logout_uri: None,
                root,
            });
        }
        let r = http.check(&format!("POST {sessions} (login)"), r)?;
        let logout_uri = r.header("location").map(str::to_string).or_else(|| {
            r.json(http.device(), "login")
                .ok()?
                .get("@odata.id")?
                .as_str()
                .map(str::to_string)
        });
        let token = r.header(X_AUTH_TOKEN).filter(|t| !t.is_empty());
        let Some(token) = token else {
            // A session may exist that we cannot name; delete it if we can.
            let detail = "login answered without an X-Auth-Token".to_string();
            if let Some(uri) = &logout_uri {
                let _ = http.send(Method::DELETE, uri, &basic, None).await;
            }
            return Err(FenceError::Protocol {
                device: http.device().to_string(),
                detail,
            });
        };
        let auth = Auth::Token(Secret::new(token));
        let Some(logout_uri) = logout_uri else {
            // Without the session's URI we could never log out: leave no session behind.
            return Err(FenceError::Protocol {
                device: http.device().to_string(),
                detail: "login answered without the session's Location".into(),
            });
        };
        tracing::debug!(device = %http.device(), session = %logout_uri, "redfish session opened");
        Ok(Self {
            http: http.clone(),
            auth,
            logout_uri: Some(logout_uri),
            root,
        })
    }

    /// How requests of this session authenticate.
    pub(crate) fn auth(&self) -> &Auth {
        &self.auth
    }

    /// The service root.
    pub(crate) fn root(&self) -> &Value {
        &self.root
    }

    /// Whether this is a token session (not Basic).
    pub(crate) fn is_token(&self) -> bool {
        matches!(self.auth, Auth::Token(_))
    }

    /// Logs out (a token session is deleted; Basic has nothing to undo). Failures are logged,
    /// not returned: the operation's own result matters more, and the BMC expires sessions.
    pub(crate) async fn close(mut self) {
        if let Some(uri) = self.logout_uri.take() {
            logout(&self.http, &uri, &self.auth).await;
        }
    }
}

async fn logout(http: &Http, uri: &str, auth: &Auth) {
    match http.send_ok(Method::DELETE, uri, auth, None).await {
        Ok(_) => tracing::debug!(device = %http.device(), session = %uri, "redfish session closed"),
        Err(e) => {
            tracing::warn!(device = %http.device(), session = %uri, error = %e, "redfish logout failed")
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let Some(uri) = self.logout_uri.take() else {
            return;
        };
        // Dropped without close(): the operation was cancelled. Log out in the background.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let http = self.http.clone();
                let auth = self.auth.clone();
                rt.spawn(async move { logout(&http, &uri, &auth).await });
            }
            Err(_) => {
                tracing::warn!(device = %self.http.device(), session = %uri, "redfish session dropped outside a runtime; the BMC will expire it")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sessions_collection_comes_from_the_service_root() {
        let root = json!({"Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}, "SessionService": {"@odata.id": "/redfish/v1/SessionService"}});
        assert_eq!(
            sessions_uri(&root).as_deref(),
            Some("/redfish/v1/SessionService/Sessions")
        );
        let only_service = json!({"SessionService": {"@odata.id": "/redfish/v1/SessionService"}});
        assert_eq!(
            sessions_uri(&only_service).as_deref(),
            Some("/redfish/v1/SessionService/Sessions")
        );
        // sushy-emulator's root: no SessionService at all.
        let sushy = json!({"Systems": {"@odata.id": "/redfish/v1/Systems"}});
        assert_eq!(sessions_uri(&sushy), None);
    }
}
