//! The `storagefw+https://host:port/[prefix]?profile=NAME` target URL.

use crate::error::StorageFwError;

/// URL scheme of a storage firewall fencing target.
pub const SCHEME: &str = "storagefw+https";

/// A parsed storage firewall target: where the array's admin API is and which request profile
/// speaks its dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host name or IP address of the admin API.
    pub host: String,
    /// TCP port (default 443).
    pub port: u16,
    /// Path prefix prepended to every profile path (empty, or starting with `/` without a
    /// trailing `/`).
    pub prefix: String,
    /// Profile name from `?profile=` (default `lab`).
    pub profile: String,
}

impl Target {
    /// Parses a `storagefw+https://` URL. Credentials in the URL are refused: they would end up
    /// in logs and process listings.
    pub fn parse(raw: &str) -> Result<Self, StorageFwError> {
        let invalid = |reason: &str| StorageFwError::InvalidTarget {
            url: raw.to_owned(),
            reason: reason.to_owned(),
        };
        let url = url::Url::parse(raw).map_err(|e| invalid(&e.to_string()))?;
        if url.scheme() != SCHEME {
            return Err(invalid("scheme must be storagefw+https"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid(
                "credentials must not be in the URL; use a token file",
            ));
        }
        let host = url
            .host_str()
            .ok_or_else(|| invalid("missing host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port().unwrap_or(443);
        let prefix = url.path().trim_end_matches('/').to_owned();
        let mut profile = "lab".to_owned();
        for (k, v) in url.query_pairs() {
            match k.as_ref() {
                "profile" => profile = v.into_owned(),
                other => {
                    return Err(invalid(&format!(
                        "unknown query parameter {other:?}; valid: profile"
                    )))
                }
            }
        }
        Ok(Target {
            host,
            port,
            prefix,
            profile,
        })
    }

    /// The `https://` base URL the requests go to (no trailing slash).
    pub fn base_url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("https://{host}:{}{}", self.port, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lab_target() {
        let t = Target::parse("storagefw+https://127.0.0.1:8443/?profile=lab").unwrap();
        assert_eq!(t.host, "127.0.0.1");
        assert_eq!(t.port, 8443);
        assert_eq!(t.profile, "lab");
        assert_eq!(t.base_url(), "https://127.0.0.1:8443");
    }

    #[test]
    fn default_port_profile_and_prefix() {
        let t = Target::parse("storagefw+https://array.example/api/").unwrap();
        assert_eq!(t.port, 443);
        assert_eq!(t.profile, "lab");
        assert_eq!(t.base_url(), "https://array.example:443/api");
    }

    #[test]
    fn refuses_wrong_scheme_credentials_and_unknown_params() {
        assert!(Target::parse("https://127.0.0.1:8443/").is_err());
        assert!(Target::parse("storagefw+https://u:p@127.0.0.1:8443/").is_err());
        let e = Target::parse("storagefw+https://127.0.0.1:8443/?profle=lab").unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown query parameter \"profle\"; valid: profile"),
            "{e}"
        );
        assert!(Target::parse("not a url").is_err());
    }
}
