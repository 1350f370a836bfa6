//! Fencing targets addressed by URL. Credentials never go in the URL: they come separately in
//! [`crate::Credentials`].
//!
//! - `ipmi://user@host[:port][?cipher=17|3&allow_weak_cipher_suites=true&guid=G]` (port 623)
//! - `snmp+pdu://[v3user@]host[:port]/outlet/N[,M...][?profile=apc&version=2c]` (port 161);
//!   for v3: `version=3&auth=sha&priv=aes&sec_level=authPriv` (authPriv SHA + AES-128 is the
//!   default).
//! - `bridge://host:port/target-id`: a target of a firmware-bridge (see [`crate::bridge`]); no
//!   query keys.
//! - `redfish+https://user@host[:port][/redfish/v1/Systems/ID][?system=ID&uuid=U]` (port 443)
//!   with exactly one TLS trust: `ca_file=/path/ca.pem`, `ca=secret`, `fingerprint=<SHA-256 of
//!   the BMC certificate>` or, only when asked for, `ssl_insecure=true`; `auth=session|basic`
//!   (default: a session when the BMC has a SessionService, else Basic). See [`crate::redfish`].
//!
//! A query key that is not in the scheme's list ([`IPMI_KEYS`], [`PDU_KEYS`],
//! [`REDFISH_KEYS`]), a key given twice, a fragment, or a boolean that is not `true`/`false`
//! (`1`/`0`, `yes`/`no`) is an error: a misspelt `?giud=` must not silently drop a pin.

use std::fmt;

use crate::error::FenceError;

/// A parsed target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A BMC reached over IPMI 2.0 RMCP+.
    Ipmi(IpmiTarget),
    /// Outlets of a switched PDU reached over SNMP.
    Pdu(PduTarget),
    /// A target of a firmware-bridge, which holds the device credentials.
    Bridge(BridgeTarget),
    /// A ComputerSystem of a Redfish service (a BMC) over HTTPS.
    Redfish(RedfishTarget),
}

/// How the Redfish client trusts the BMC's certificate. There is no default: a target names
/// one, and "trust anything" must be asked for by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedfishTls {
    /// Only certificates issued by the CA in this PEM file (host name checked).
    CaFile(std::path::PathBuf),
    /// Only the certificate whose DER encoding has this SHA-256 digest (self-signed BMC
    /// certificates; host name and validity dates are not checked: the key is pinned).
    Fingerprint([u8; 32]),
    /// Any certificate (`ssl_insecure`). Logged as a warning on every use.
    Insecure,
    /// Only certificates issued by the CA in this PEM text (host name checked): the
    /// `caBundle` of the device's credentials Secret, for `ca=secret`.
    CaPem(String),
    /// `ca=secret` as parsed from a URL: the CA is the `caBundle` of the device's credentials
    /// Secret. The caller replaces it with [`RedfishTls::CaPem`] once it has read the Secret
    /// ([`RedfishTls::with_secret_ca`]); left unresolved, the client refuses to connect.
    CaFromSecret,
}

impl RedfishTls {
    /// Resolves [`RedfishTls::CaFromSecret`] with the Secret's `caBundle` (`None` when the
    /// Secret has none: an error naming what is missing). Any other trust is kept as it is.
    pub fn with_secret_ca(self, ca_bundle: Option<&str>) -> Result<Self, String> {
        match (self, ca_bundle) {
            (Self::CaFromSecret, Some(pem)) => Ok(Self::CaPem(pem.to_string())),
            (Self::CaFromSecret, None) => Err(
                "ca=secret: the device's credentials Secret has no caBundle (the CA that issued the BMC certificate)"
                    .into(),
            ),
            (other, _) => Ok(other),
        }
    }
}

/// How the Redfish client authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedfishAuth {
    /// A session (`X-Auth-Token`) when the service root links a SessionService, else Basic.
    Auto,
    /// A session only; fail if the BMC has none.
    Session,
    /// HTTP Basic on every request.
    Basic,
}

/// A Redfish ComputerSystem: the BMC's address and which system of its Systems collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedfishTarget {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// BMC account name.
    pub username: String,
    /// The system's URI (`systems_uri`, e.g. `/redfish/v1/Systems/1`); `None`: discover it.
    pub systems_uri: Option<String>,
    /// Chooses the system by its `Id`, `Name` or `UUID` (`plug`); `None`: not by name.
    pub system: Option<String>,
    /// The UUID the system must report: chooses it when neither of the above is given, and
    /// is checked before any power command otherwise.
    pub system_uuid: Option<String>,
    /// Certificate trust.
    pub tls: RedfishTls,
    /// Authentication.
    pub auth: RedfishAuth,
}

/// `bridge://host:port/target-id`: a target in a firmware-bridge's inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeTarget {
    /// Bridge host name or address.
    pub host: String,
    /// Bridge TCP port (required: the bridge has no well-known port).
    pub port: u16,
    /// The target's id in the bridge inventory.
    pub target_id: String,
}

/// An IPMI BMC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpmiTarget {
    /// Host name or address.
    pub host: String,
    /// UDP port.
    pub port: u16,
    /// BMC user name.
    pub username: String,
    /// A fixed cipher suite, or None to negotiate (prefer 17, then 3).
    pub cipher: Option<u8>,
    /// Accept suites without integrity or confidentiality (0, 1, 2). Off by default.
    pub allow_weak_cipher_suites: bool,
    /// The managed system's GUID this BMC must report (Get System GUID) before any power
    /// command or status read is trusted (`?guid=` in the URL); `None`: not pinned.
    pub system_guid: Option<String>,
}

/// SNMP protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnmpVersion {
    /// SNMPv1 (community).
    V1,
    /// SNMPv2c (community).
    V2c,
    /// SNMPv3 (user-based security).
    V3,
}

/// SNMPv3 authentication protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnmpAuthProtocol {
    /// HMAC-MD5-96.
    Md5,
    /// HMAC-SHA-96.
    Sha1,
    /// HMAC-SHA-256.
    Sha256,
}

/// SNMPv3 security level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnmpSecurityLevel {
    /// No authentication, no privacy.
    NoAuthNoPriv,
    /// Authentication only.
    AuthNoPriv,
    /// Authentication and AES privacy.
    AuthPriv,
}

/// A PDU target: one or more outlets feeding one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PduTarget {
    /// Host name or address.
    pub host: String,
    /// UDP port.
    pub port: u16,
    /// Outlet numbers (1-based). Off means every one of them off.
    pub outlets: Vec<u32>,
    /// Vendor profile name (see [`crate::pdu::profile`]); `auto` (the default) detects it from
    /// the device's `sysObjectID`.
    pub profile: String,
    /// SNMP version.
    pub version: SnmpVersion,
    /// SNMPv3 user name.
    pub v3_user: Option<String>,
    /// SNMPv3 authentication protocol.
    pub v3_auth: SnmpAuthProtocol,
    /// SNMPv3 security level.
    pub v3_level: SnmpSecurityLevel,
}

fn bad(url: &str, why: impl fmt::Display) -> FenceError {
    FenceError::Config(format!("target {url}: {why}"))
}

/// The query keys of `ipmi://` URLs.
pub const IPMI_KEYS: &[&str] = &["cipher", "allow_weak_cipher_suites", "guid"];
/// The query keys of `snmp+pdu://` URLs.
pub const PDU_KEYS: &[&str] = &["profile", "version", "auth", "sec_level", "priv"];
/// The query keys of `redfish+https://` URLs.
pub const REDFISH_KEYS: &[&str] = &[
    "ca",
    "ca_file",
    "fingerprint",
    "ssl_insecure",
    "auth",
    "system",
    "uuid",
];

/// The query of `url`, refusing keys outside `valid`, keys given twice and fragments.
fn strict_query(
    s: &str,
    url: &url::Url,
    valid: &[&str],
) -> Result<Vec<(String, String)>, FenceError> {
    if url.fragment().is_some() {
        return Err(bad(s, "a fragment (#...) is not part of a target URL"));
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in url.query_pairs() {
        if !valid.contains(&k.as_ref()) {
            let what = format!("query key of {}://", url.scheme());
            return Err(bad(s, crate::spelling::unknown(&what, &k, valid)));
        }
        if out.iter().any(|(n, _)| *n == k) {
            return Err(bad(s, format!("query key {k:?} given twice")));
        }
        out.push((k.into_owned(), v.into_owned()));
    }
    Ok(out)
}

/// A boolean query value: absent is `false`; anything but true/false, 1/0, yes/no is an error.
fn strict_bool(s: &str, key: &str, v: Option<&str>) -> Result<bool, FenceError> {
    match v.map(str::to_ascii_lowercase).as_deref() {
        None | Some("false" | "0" | "no") => Ok(false),
        Some("true" | "1" | "yes") => Ok(true),
        Some(other) => Err(bad(
            s,
            format!("{key}={other}: not a boolean (true or false)"),
        )),
    }
}

impl Target {
    /// Parses a target URL.
    pub fn parse(s: &str) -> Result<Self, FenceError> {
        let url = url::Url::parse(s).map_err(|e| bad(s, e))?;
        if url.password().is_some() {
            return Err(bad(s, "credentials must not be in the URL"));
        }
        let host = url
            .host_str()
            .ok_or_else(|| bad(s, "missing host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let valid: &[&str] = match url.scheme() {
            "ipmi" => IPMI_KEYS,
            "snmp+pdu" => PDU_KEYS,
            "redfish+https" => REDFISH_KEYS,
            _ => &[],
        };
        let query = strict_query(s, &url, valid)?;
        let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        match url.scheme() {
            "ipmi" => {
                if url.username().is_empty() {
                    return Err(bad(s, "missing user (ipmi://user@host)"));
                }
                let cipher = match get("cipher") {
                    None | Some("auto") => None,
                    Some(c) => Some(c.parse::<u8>().map_err(|_| {
                        bad(s, format!("cipher={c}: not a suite number (17, 3) or auto"))
                    })?),
                };
                let allow_weak_cipher_suites = strict_bool(
                    s,
                    "allow_weak_cipher_suites",
                    get("allow_weak_cipher_suites"),
                )?;
                let system_guid = match get("guid") {
                    None => None,
                    Some(g) => {
                        let hex = g.replace('-', "");
                        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                            return Err(bad(s, "guid must be 32 hex digits (dashes allowed)"));
                        }
                        Some(g.to_ascii_lowercase())
                    }
                };
                Ok(Self::Ipmi(IpmiTarget {
                    host,
                    port: url.port().unwrap_or(623),
                    username: url.username().to_string(),
                    cipher,
                    allow_weak_cipher_suites,
                    system_guid,
                }))
            }
            "snmp+pdu" => {
                let segs: Vec<&str> = url
                    .path_segments()
                    .map(|p| p.filter(|x| !x.is_empty()).collect())
                    .unwrap_or_default();
                let mut outlets = Vec::new();
                let mut it = segs.iter();
                while let Some(seg) = it.next() {
                    if *seg != "outlet" && *seg != "outlets" {
                        return Err(bad(s, format!("unexpected path segment {seg:?}")));
                    }
                    let list = it.next().ok_or_else(|| bad(s, "missing outlet number"))?;
                    for n in list.split(',') {
                        let n: u32 = n.parse().map_err(|_| bad(s, "bad outlet number"))?;
                        if n == 0 {
                            return Err(bad(s, "outlets are 1-based"));
                        }
                        if !outlets.contains(&n) {
                            outlets.push(n);
                        }
                    }
                }
                if outlets.is_empty() {
                    return Err(bad(s, "no outlet (snmp+pdu://host/outlet/N)"));
                }
                let version = match get("version").unwrap_or("2c") {
                    "1" => SnmpVersion::V1,
                    "2c" | "2" => SnmpVersion::V2c,
                    "3" => SnmpVersion::V3,
                    v => return Err(bad(s, format!("unknown SNMP version {v}"))),
                };
                let v3_auth = match get("auth").unwrap_or("sha") {
                    "md5" | "MD5" => SnmpAuthProtocol::Md5,
                    "sha" | "SHA" | "sha1" => SnmpAuthProtocol::Sha1,
                    "sha256" | "SHA256" => SnmpAuthProtocol::Sha256,
                    v => return Err(bad(s, format!("unknown auth protocol {v}"))),
                };
                let v3_level = match get("sec_level").unwrap_or("authPriv") {
                    "noAuthNoPriv" => SnmpSecurityLevel::NoAuthNoPriv,
                    "authNoPriv" => SnmpSecurityLevel::AuthNoPriv,
                    "authPriv" => SnmpSecurityLevel::AuthPriv,
                    v => return Err(bad(s, format!("unknown security level {v}"))),
                };
                if let Some(p) = get("priv") {
                    if !p.eq_ignore_ascii_case("aes") {
                        return Err(bad(s, "only AES privacy is supported"));
                    }
                }
                let profile = get("profile")
                    .unwrap_or(crate::pdu::profile::AUTO)
                    .to_string();
                if profile != crate::pdu::profile::AUTO {
                    crate::pdu::profile::Profile::by_name(&profile)?;
                }
                Ok(Self::Pdu(PduTarget {
                    host,
                    port: url.port().unwrap_or(161),
                    outlets,
                    profile,
                    version,
                    v3_user: (!url.username().is_empty()).then(|| url.username().to_string()),
                    v3_auth,
                    v3_level,
                }))
            }
            "bridge" => {
                let (_, target_id) = crate::bridge::parse_bridge_url(s).map_err(|e| bad(s, e))?;
                Ok(Self::Bridge(BridgeTarget {
                    host,
                    port: url.port().ok_or_else(|| bad(s, "missing bridge port"))?,
                    target_id,
                }))
            }
            "redfish+https" => {
                if url.username().is_empty() {
                    return Err(bad(s, "missing user (redfish+https://user@host)"));
                }
                let systems_uri = match url.path() {
                    "" | "/" => None,
                    p => Some(
                        crate::redfish::discovery::check_systems_uri(p).map_err(|e| bad(s, e))?,
                    ),
                };
                let named = ["ca_file", "fingerprint", "ssl_insecure"]
                    .iter()
                    .any(|k| get(k).is_some());
                let tls = match get("ca") {
                    Some("secret") if !named => RedfishTls::CaFromSecret,
                    Some("secret") => {
                        return Err(bad(
                            s,
                            "give exactly one of ca=secret, ca_file, fingerprint and ssl_insecure",
                        ))
                    }
                    Some(v) => {
                        return Err(bad(
                            s,
                            format!("ca={v}: the only value is secret (the caBundle of the device's Secret)"),
                        ))
                    }
                    None => crate::redfish::tls::parse_trust(
                        get("ca_file"),
                        get("fingerprint"),
                        get("ssl_insecure"),
                    )
                    .map_err(|e| bad(s, e))?,
                };
                let auth = match get("auth").unwrap_or("auto") {
                    "auto" => RedfishAuth::Auto,
                    "session" => RedfishAuth::Session,
                    "basic" => RedfishAuth::Basic,
                    v => return Err(bad(s, format!("unknown auth {v} (auto, session, basic)"))),
                };
                let system_uuid = match get("uuid") {
                    None => None,
                    Some(u) => {
                        Some(crate::redfish::discovery::check_uuid(u).map_err(|e| bad(s, e))?)
                    }
                };
                Ok(Self::Redfish(RedfishTarget {
                    host,
                    port: url.port().unwrap_or(443),
                    username: url.username().to_string(),
                    systems_uri,
                    system: get("system").map(str::to_string),
                    system_uuid,
                    tls,
                    auth,
                }))
            }
            other => Err(bad(s, format!("unknown scheme {other}"))),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ipmi(t) => write!(f, "ipmi://{}@{}:{}", t.username, t.host, t.port),
            Self::Pdu(t) => {
                let outlets: Vec<String> = t.outlets.iter().map(u32::to_string).collect();
                write!(
                    f,
                    "snmp+pdu://{}:{}/outlet/{}?profile={}",
                    t.host,
                    t.port,
                    outlets.join(","),
                    t.profile
                )
            }
            Self::Bridge(t) => write!(f, "bridge://{}:{}/{}", t.host, t.port, t.target_id),
            Self::Redfish(t) => write!(
                f,
                "redfish+https://{}@{}:{}{}",
                t.username,
                t.host,
                t.port,
                t.systems_uri.as_deref().unwrap_or("")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ipmi_urls() {
        let t = Target::parse("ipmi://admin@127.0.0.1:6230?cipher=3").unwrap();
        assert_eq!(
            t,
            Target::Ipmi(IpmiTarget {
                host: "127.0.0.1".into(),
                port: 6230,
                username: "admin".into(),
                cipher: Some(3),
                allow_weak_cipher_suites: false,
                system_guid: None,
            })
        );
        assert_eq!(t.to_string(), "ipmi://admin@127.0.0.1:6230");
        let Target::Ipmi(d) = Target::parse("ipmi://a@bmc?allow_weak_cipher_suites=true").unwrap()
        else {
            panic!()
        };
        assert_eq!(d.port, 623);
        assert!(d.allow_weak_cipher_suites && d.cipher.is_none());
        assert!(Target::parse("ipmi://bmc:623").is_err(), "user required");
        assert!(
            Target::parse("ipmi://a:pw@bmc").is_err(),
            "no password in URLs"
        );
    }

    #[test]
    fn parses_pdu_urls() {
        let Target::Pdu(p) =
            Target::parse("snmp+pdu://127.0.0.1:1161/outlet/1,2?profile=cyberpower&version=3")
                .unwrap()
        else {
            panic!()
        };
        assert_eq!(p.outlets, vec![1, 2]);
        assert_eq!(p.version, SnmpVersion::V3);
        assert_eq!(p.profile, "cyberpower");
        assert_eq!(p.v3_level, SnmpSecurityLevel::AuthPriv);
        let Target::Pdu(p) = Target::parse("snmp+pdu://pdu/outlet/3/outlet/4").unwrap() else {
            panic!()
        };
        assert_eq!(
            (p.port, p.outlets, p.version),
            (161, vec![3, 4], SnmpVersion::V2c)
        );
        assert!(Target::parse("snmp+pdu://pdu/").is_err());
        assert!(Target::parse("snmp+pdu://pdu/outlet/0").is_err());
        assert!(Target::parse("snmp+pdu://pdu/outlet/1?profile=nope").is_err());
        assert!(Target::parse("redfish://x").is_err());
    }

    #[test]
    fn parses_bridge_urls() {
        let t = Target::parse("bridge://127.0.0.1:8443/rack1-m0").unwrap();
        assert_eq!(
            t,
            Target::Bridge(BridgeTarget {
                host: "127.0.0.1".into(),
                port: 8443,
                target_id: "rack1-m0".into(),
            })
        );
        assert_eq!(t.to_string(), "bridge://127.0.0.1:8443/rack1-m0");
        assert!(Target::parse("bridge://rack1-m0").is_err());
        assert!(Target::parse("bridge://h:1/").is_err());
    }

    #[test]
    fn parses_redfish_urls() {
        let fp = "AB:".repeat(31) + "AB";
        let t = Target::parse(&format!(
            "redfish+https://admin@127.0.0.1:8443/redfish/v1/Systems/1?fingerprint={fp}&auth=basic&uuid=11111111-1111-1111-1111-11111111111A"
        ))
        .unwrap();
        assert_eq!(
            t,
            Target::Redfish(RedfishTarget {
                host: "127.0.0.1".into(),
                port: 8443,
                username: "admin".into(),
                systems_uri: Some("/redfish/v1/Systems/1".into()),
                system: None,
                system_uuid: Some("11111111-1111-1111-1111-11111111111a".into()),
                tls: RedfishTls::Fingerprint([0xab; 32]),
                auth: RedfishAuth::Basic,
            })
        );
        assert_eq!(
            t.to_string(),
            "redfish+https://admin@127.0.0.1:8443/redfish/v1/Systems/1"
        );
        let Target::Redfish(r) =
            Target::parse("redfish+https://a@bmc?ca_file=/etc/ca.pem&system=node-a").unwrap()
        else {
            panic!()
        };
        assert_eq!((r.port, r.system.as_deref()), (443, Some("node-a")));
        assert_eq!(r.tls, RedfishTls::CaFile("/etc/ca.pem".into()));
        assert_eq!(r.auth, RedfishAuth::Auto);
        assert!(
            Target::parse("redfish+https://a@bmc").is_err(),
            "no trust given"
        );
        assert!(
            Target::parse("redfish+https://bmc?ssl_insecure=1").is_err(),
            "user required"
        );
        assert!(Target::parse("redfish+https://a:pw@bmc?ssl_insecure=1").is_err());
        assert!(Target::parse("redfish+https://a@bmc/elsewhere?ssl_insecure=1").is_err());
        assert!(
            Target::parse("redfish+https://a@bmc?ssl_insecure=1&fingerprint=00").is_err(),
            "one trust only, and a whole digest"
        );
        assert!(Target::parse("redfish+http://a@bmc?ssl_insecure=1").is_err());
        let Target::Redfish(r) = Target::parse("redfish+https://a@bmc?ca=secret").unwrap() else {
            panic!()
        };
        assert_eq!(r.tls, RedfishTls::CaFromSecret);
        assert!(
            Target::parse("redfish+https://a@bmc?ca=secret&ca_file=/etc/ca.pem").is_err(),
            "ca=secret is one trust among the others"
        );
        assert!(Target::parse("redfish+https://a@bmc?ca=/etc/ca.pem").is_err());
    }

    #[test]
    fn a_misspelt_guid_key_is_an_error_not_a_dropped_pin() {
        let e = Target::parse("ipmi://admin@127.0.0.1:6230?giud=00112233445566778899aabbccddeeff")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown query key of ipmi:// \"giud\""), "{e}");
        assert!(e.contains("did you mean guid?"), "{e}");
        assert!(
            e.contains("valid: allow_weak_cipher_suites, cipher, guid"),
            "{e}"
        );
    }

    #[test]
    fn every_scheme_refuses_unknown_query_keys() {
        for (url, key) in [
            ("ipmi://a@bmc?ciper=3", "ciper"),
            ("snmp+pdu://pdu/outlet/1?profle=apc", "profle"),
            (
                "snmp+pdu://pdu/outlet/1?version=3&security=authPriv",
                "security",
            ),
            ("redfish+https://a@bmc?ssl_insecure=1&uid=x", "uid"),
            ("redfish+https://a@bmc?ca_file=/ca.pem&plug=node-a", "plug"),
        ] {
            let e = Target::parse(url).unwrap_err().to_string();
            assert!(e.contains("unknown query key of"), "{url}: {e}");
            assert!(e.contains(&format!("\"{key}\"")), "{url}: {e}");
            assert!(e.contains("; valid: "), "{url}: {e}");
        }
        assert!(Target::parse("bridge://h:1/m0?guid=x").is_err());
    }

    #[test]
    fn a_key_given_twice_a_fragment_or_a_bad_boolean_is_an_error() {
        let e = Target::parse(
            "ipmi://a@bmc?guid=00112233445566778899aabbccddeeff&guid=ffeeddccbbaa99887766554433221100",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"guid\" given twice"), "{e}");
        assert!(Target::parse("ipmi://a@bmc#guid=x").is_err());
        let e = Target::parse("ipmi://a@bmc?allow_weak_cipher_suites=sure")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a boolean"), "{e}");
        let Target::Ipmi(t) = Target::parse("ipmi://a@bmc?allow_weak_cipher_suites=false").unwrap()
        else {
            panic!()
        };
        assert!(!t.allow_weak_cipher_suites);
        let e = Target::parse("ipmi://a@bmc?cipher=strong")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cipher=strong: not a suite number"), "{e}");
    }
}
