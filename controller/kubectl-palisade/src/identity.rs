//! Who the API server says we are: a SelfSubjectReview (what `kubectl auth whoami` asks), so a
//! forced deletion records the authenticated user, never a local guess such as `$USER`.

use serde::Serialize;

/// The versions of the SelfSubjectReview API, newest first (v1 from Kubernetes 1.28, v1beta1
/// from 1.27, v1alpha1 from 1.26 behind a feature gate), as `kubectl auth whoami` tries them.
pub const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];

/// The authenticated user, as the API server reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// The username (for example `kubernetes-admin`, `system:serviceaccount:ns:name`).
    pub username: String,
    /// The groups the user is a member of.
    pub groups: Vec<String>,
    /// Whether the API server named this user (false: a local name, recorded as unverified).
    pub verified: bool,
}

impl Identity {
    /// Reads `status.userInfo` of a SelfSubjectReview response; `None` without a username.
    pub fn from_review(review: &serde_json::Value) -> Option<Identity> {
        let info = review.get("status")?.get("userInfo")?;
        let username = info.get("username")?.as_str()?.to_string();
        if username.is_empty() {
            return None;
        }
        let groups = info
            .get("groups")
            .and_then(|g| g.as_array())
            .map(|g| {
                g.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Some(Identity {
            username,
            groups,
            verified: true,
        })
    }

    /// For an API server that serves no SelfSubjectReview at all (Kubernetes before 1.26):
    /// the local user (`$USER`, else `$LOGNAME`), which [`Identity::describe`] marks unverified.
    /// Only for that case: an API server that refuses to say, or names nobody, gets no record
    /// and no deletion.
    pub fn unverified_local() -> Identity {
        let user = ["USER", "LOGNAME"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
            .unwrap_or_else(|| "(unknown)".into());
        Identity {
            username: user,
            groups: Vec::new(),
            verified: false,
        }
    }

    /// `alice (groups: ops, system:authenticated)`, as the forced deletion records it; a
    /// local name is recorded as `unverified local user alice (…)`.
    pub fn describe(&self) -> String {
        if !self.verified {
            return format!(
                "unverified local user {} (the API server serves no SelfSubjectReview: Kubernetes before 1.26)",
                self.username
            );
        }
        if self.groups.is_empty() {
            self.username.clone()
        } else {
            format!("{} (groups: {})", self.username, self.groups.join(", "))
        }
    }
}

/// Why the identity could not be established.
#[derive(Debug)]
pub enum Unknown {
    /// No version of the API is served (Kubernetes before 1.26, or the alpha gate off).
    NotServed,
    /// The API server answered with an error (403: the user may not ask).
    Refused(kube::Error),
    /// The review came back without a username.
    NoUsername,
}

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unknown::NotServed => write!(
                f,
                "SelfSubjectReview is not served (authentication.k8s.io {}; Kubernetes 1.28 or later serves v1)",
                VERSIONS.join(", ")
            ),
            Unknown::Refused(e) => write!(f, "the API server refused the SelfSubjectReview: {e}"),
            Unknown::NoUsername => write!(f, "the SelfSubjectReview named no user"),
        }
    }
}

/// Asks the API server who this client is (POST `selfsubjectreviews`, newest version first).
pub async fn whoami(c: &kube::Client) -> Result<Identity, Unknown> {
    for version in VERSIONS {
        let body = serde_json::json!({
            "apiVersion": format!("authentication.k8s.io/{version}"),
            "kind": "SelfSubjectReview",
        });
        let req = http::Request::post(format!(
            "/apis/authentication.k8s.io/{version}/selfsubjectreviews"
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
        .map_err(|e| Unknown::Refused(kube::Error::HttpError(e)))?;
        match c.request::<serde_json::Value>(req).await {
            Ok(review) => return Identity::from_review(&review).ok_or(Unknown::NoUsername),
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(Unknown::Refused(e)),
        }
    }
    Err(Unknown::NotServed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_review_names_the_user_and_groups() {
        let review = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "SelfSubjectReview",
            "status": {"userInfo": {
                "username": "alice",
                "uid": "u-1",
                "groups": ["ops", "system:authenticated"]
            }}
        });
        let id = Identity::from_review(&review).unwrap();
        assert_eq!(id.username, "alice");
        assert_eq!(id.describe(), "alice (groups: ops, system:authenticated)");
    }

    #[test]
    fn a_review_without_a_username_establishes_no_identity() {
        for review in [
            serde_json::json!({}),
            serde_json::json!({"status": {}}),
            serde_json::json!({"status": {"userInfo": {"groups": ["g"]}}}),
            serde_json::json!({"status": {"userInfo": {"username": ""}}}),
        ] {
            assert_eq!(Identity::from_review(&review), None, "{review}");
        }
        let bare = serde_json::json!({"status": {"userInfo": {"username": "bob"}}});
        assert_eq!(Identity::from_review(&bare).unwrap().describe(), "bob");
    }

    /// A client whose API server answers each SelfSubjectReview version with `answer(version)`
    /// (status code and body), and the paths it was asked, in order.
    fn api_server(
        answer: fn(&str) -> (u16, serde_json::Value),
    ) -> (kube::Client, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = asked.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let path = req.uri().path().to_string();
            assert_eq!(req.method(), http::Method::POST);
            log.lock().unwrap().push(path.clone());
            let version = path
                .strip_prefix("/apis/authentication.k8s.io/")
                .and_then(|r| r.strip_suffix("/selfsubjectreviews"))
                .unwrap_or("?")
                .to_string();
            let (code, body) = answer(&version);
            async move {
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(body.to_string().into_bytes()))
                        .unwrap(),
                )
            }
        });
        (kube::Client::new(service, "default"), asked)
    }

    fn status(code: u16, reason: &str) -> (u16, serde_json::Value) {
        (
            code,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": reason, "reason": reason, "code": code}),
        )
    }

    fn review(version: &str) -> (u16, serde_json::Value) {
        (
            201,
            serde_json::json!({"apiVersion": format!("authentication.k8s.io/{version}"),
                "kind": "SelfSubjectReview",
                "status": {"userInfo": {"username": format!("user-{version}"), "groups": ["g"]}}}),
        )
    }

    #[tokio::test]
    async fn whoami_asks_the_newest_version_first_and_falls_back_on_not_found() {
        let (c, asked) = api_server(|v| match v {
            "v1" => status(404, "NotFound"),
            v => review(v),
        });
        let id = whoami(&c).await.unwrap();
        assert_eq!(id.username, "user-v1beta1");
        assert_eq!(
            *asked.lock().unwrap(),
            [
                "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                "/apis/authentication.k8s.io/v1beta1/selfsubjectreviews"
            ]
        );
        let (c, _) = api_server(review);
        assert_eq!(whoami(&c).await.unwrap().describe(), "user-v1 (groups: g)");
    }

    #[tokio::test]
    async fn an_api_server_that_names_nobody_establishes_no_identity() {
        let (c, asked) = api_server(|_| status(404, "NotFound"));
        assert!(matches!(whoami(&c).await, Err(Unknown::NotServed)));
        assert_eq!(asked.lock().unwrap().len(), VERSIONS.len());
        let (c, asked) = api_server(|_| status(403, "Forbidden"));
        let err = whoami(&c).await.unwrap_err();
        assert!(matches!(err, Unknown::Refused(_)), "{err}");
        assert_eq!(asked.lock().unwrap().len(), 1, "a refusal is final");
        let (c, _) = api_server(|_| (201, serde_json::json!({"status": {"userInfo": {}}})));
        assert!(matches!(whoami(&c).await, Err(Unknown::NoUsername)));
    }
}
