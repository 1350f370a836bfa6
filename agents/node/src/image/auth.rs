//! Registry credentials: `kubernetes.io/dockerconfigjson` pull secrets, and the
//! `WWW-Authenticate` challenges of the distribution API (Basic, or Bearer with a token
//! service).

use std::collections::BTreeMap;

use base64::Engine as _;

/// A user name and password for one registry. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The registry host a `.dockerconfigjson` key names: `https://reg.example:5000/v1/` and
/// `reg.example:5000` are the same registry; Docker Hub's legacy keys mean `docker.io`.
pub fn normalize_key(key: &str) -> String {
    let k = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = k.split('/').next().unwrap_or_default().to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".into(),
        _ => host,
    }
}

/// Parses a `.dockerconfigjson`: registry host → credentials. Entries without usable
/// credentials are skipped.
pub fn parse_docker_config(raw: &[u8]) -> Result<BTreeMap<String, Credentials>, String> {
    let cfg: DockerConfig =
        serde_json::from_slice(raw).map_err(|e| format!("not a dockerconfigjson: {e}"))?;
    let mut out = BTreeMap::new();
    for (key, e) in cfg.auths {
        let creds = match (e.username, e.password, e.auth) {
            (Some(u), Some(p), _) if !u.is_empty() => Credentials {
                username: u,
                password: p,
            },
            (_, _, Some(a)) => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(a.trim())
                    .map_err(|e| format!("auths[{key:?}].auth: not base64: {e}"))?;
                let s = String::from_utf8(raw)
                    .map_err(|_| format!("auths[{key:?}].auth: not UTF-8"))?;
                let (u, p) = s
                    .split_once(':')
                    .ok_or_else(|| format!("auths[{key:?}].auth: not user:password"))?;
                Credentials {
                    username: u.into(),
                    password: p.into(),
                }
            }
            _ => continue,
        };
        out.insert(normalize_key(&key), creds);
    }
    Ok(out)
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// Send the credentials as HTTP Basic.
    Basic,
    /// Get a token from `realm` (with `service` and `scope`) and send it as Bearer.
    Bearer {
        /// Token endpoint.
        realm: String,
        /// `service` parameter.
        service: Option<String>,
        /// `scope` parameter.
        scope: Option<String>,
    },
}

/// Parses a `WWW-Authenticate` header value.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    let mut params = BTreeMap::new();
    let mut s = rest.trim();
    while !s.is_empty() {
        let (k, after) = s.split_once('=')?;
        let after = after.trim_start();
        let (v, next) = match after.strip_prefix('"') {
            Some(q) => {
                let end = q.find('"')?;
                (&q[..end], q[end + 1..].trim_start())
            }
            None => match after.find(',') {
                Some(i) => (&after[..i], &after[i..]),
                None => (after, ""),
            },
        };
        params.insert(k.trim().to_ascii_lowercase(), v.to_string());
        s = next.trim_start_matches(',').trim_start();
    }
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: params.remove("realm")?,
            service: params.remove("service"),
            scope: params.remove("scope"),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerconfigjson_entries_are_found_by_registry_host() {
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        let raw = format!(
            r#"{{"auths":{{"https://10.213.0.1:5000/v1/":{{"auth":"{auth}"}},"https://index.docker.io/v1/":{{"username":"bob","password":"pw"}},"empty.example":{{}}}}}}"#
        );
        let m = parse_docker_config(raw.as_bytes()).unwrap();
        assert_eq!(m["10.213.0.1:5000"].username, "alice");
        assert_eq!(m["10.213.0.1:5000"].password, "s3cret");
        assert_eq!(m["docker.io"].username, "bob");
        assert!(!m.contains_key("empty.example"));
        assert!(!format!("{:?}", m["docker.io"]).contains("pw"));
        assert!(parse_docker_config(br#"{"auths":{"r":{"auth":"!!"}}}"#).is_err());
    }

    #[test]
    fn challenges_are_parsed() {
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull".into()),
            })
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Negotiate"), None);
    }
}
