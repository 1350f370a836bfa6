//! ClusterLabs fence-agents conventions for the `palisade-fence` binary: options as long
//! flags or as `name=value` lines on stdin (what Pacemaker's `stonithd` sends), the actions
//! on, off, reboot, status, monitor, list, metadata and validate-all, and their exit codes.
//!
//! The backend is chosen by `agent=` (`ipmilan`, `apc_snmp` or `redfish`, also `fence_ipmilan` /
//! `fence_apc_snmp` / `fence_redfish`), or else by the presence of `systems_uri` (Redfish), a
//! plug (PDU) or neither (IPMI). Redfish takes `fence_redfish`'s option names (`ip`, `ipport`,
//! `username`, `password`, `ssl`, `ssl_insecure`, `systems_uri`, `plug`) plus the TLS pin
//! `ssl_ca_file` or `ssl_fingerprint` (one of them, or `ssl_insecure`, is required) and
//! `system_uuid`. Secrets come from
//! stdin (`password=`, `community=`, `snmp_priv_passwd=`), a file (`--password-file`), a
//! script (`--password-script`), or the environment (`PALISADE_FENCE_PASSWORD`,
//! `PALISADE_FENCE_COMMUNITY`, `PALISADE_FENCE_SNMP_PRIV_PASSWD`).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::device::{Credentials, DeviceOptions};
use crate::secret::Secret;
use crate::target::{
    IpmiTarget, PduTarget, RedfishAuth, RedfishTarget, SnmpAuthProtocol, SnmpSecurityLevel,
    SnmpVersion, Target,
};
use crate::verify::VerifyPolicy;

/// Exit code: success (and status "on").
pub const EXIT_OK: i32 = 0;
/// Exit code: failure.
pub const EXIT_ERROR: i32 = 1;
/// Exit code: status "off".
pub const EXIT_OFF: i32 = 2;

/// A CLI action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Power on.
    On,
    /// Power off (verified).
    Off,
    /// Off (verified), then on.
    Reboot,
    /// Print the status; exit 0 for on, 2 for off.
    Status,
    /// Check the device answers and the credentials work.
    Monitor,
    /// List plugs.
    List,
    /// Print the metadata XML.
    Metadata,
    /// Validate the options without contacting the device.
    ValidateAll,
}

impl Action {
    fn parse(s: &str) -> Result<Self, CliError> {
        Ok(match s {
            "on" => Self::On,
            "off" => Self::Off,
            "reboot" => Self::Reboot,
            "status" => Self::Status,
            "monitor" => Self::Monitor,
            "list" | "list-status" => Self::List,
            "metadata" | "meta-data" => Self::Metadata,
            "validate-all" => Self::ValidateAll,
            other => return Err(CliError::Invalid(format!("unknown action {other:?}"))),
        })
    }
}

/// Option parsing errors.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An option is missing or malformed.
    #[error("{0}")]
    Invalid(String),
    /// A secret could not be read.
    #[error("reading {what}: {source}")]
    Secret {
        /// Which secret.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Normalises an option name: `--snmp-priv-passwd` and `snmp_priv_passwd` are the same, and
/// old fence-agents aliases map to the new names.
pub fn normalize(name: &str) -> String {
    let n = name.trim().trim_start_matches("--").replace('-', "_");
    match n.as_str() {
        "ipaddr" => "ip".into(),
        "login" => "username".into(),
        "passwd" => "password".into(),
        "passwd_script" => "password_script".into(),
        "port" => "plug".into(),
        "option" => "action".into(),
        "udpport" => "ipport".into(),
        _ => n,
    }
}

/// Options read but not listed in the metadata: what Pacemaker's fencer adds on its own
/// (`nodename`, `nodeid`), `help` and `version`, and the older names of `shell_timeout` and
/// `retry_on`.
const UNLISTED: [&str; 6] = [
    "nodename",
    "nodeid",
    "help",
    "version",
    "exchange_timeout",
    "retries",
];

/// Every option name `palisade-fence` reads (after [`normalize`]): the metadata's parameters
/// and `UNLISTED`.
pub fn known_options() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = PARAMETERS.iter().map(|p| p.0).collect();
    v.extend_from_slice(&UNLISTED);
    v
}

/// Refuses an option name that is not in [`known_options`]: a misspelt `power_timout` must
/// not leave the default in force.
fn check_known(name: &str, given_as: &str) -> Result<(), CliError> {
    let known = known_options();
    if known.contains(&name) {
        return Ok(());
    }
    Err(CliError::Invalid(format!(
        "{} (see -o metadata)",
        crate::spelling::unknown_as("option", given_as, name, &known)
    )))
}

/// Parses `name=value` lines (stdin). Blank lines and `#` comments are skipped; an unknown
/// option name is an error (fence-agents only warns; a typo here would change what a fence
/// does).
pub fn parse_stdin(text: &str) -> Result<BTreeMap<String, String>, CliError> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (raw, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim().to_string()),
            None => (line, "1".to_string()),
        };
        let name = normalize(raw);
        check_known(&name, raw)?;
        out.insert(name, value);
    }
    Ok(out)
}

/// Parses long options (`--name=value`, `--name value`, or `--flag`) and the short options
/// fence-agents use most (`-o`, `-a`, `-l`, `-n`, `-P`, `-C`, `-u`).
pub fn parse_args(args: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    const FLAGS: [&str; 7] = [
        "lanplus",
        "verbose",
        "allow_weak_cipher_suites",
        "help",
        "version",
        "ssl",
        "ssl_insecure",
    ];
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let (name, inline) = if let Some(rest) = a.strip_prefix("--") {
            match rest.split_once('=') {
                Some((k, v)) => (normalize(k), Some(v.to_string())),
                None => (normalize(rest), None),
            }
        } else if let Some(short) = a.strip_prefix('-') {
            let long = match short {
                "o" => "action",
                "a" => "ip",
                "l" => "username",
                "n" => "plug",
                "P" => "lanplus",
                "C" => "cipher",
                "u" => "ipport",
                "c" => "community",
                "d" => "snmp_version",
                "v" => "verbose",
                "S" => "password_script",
                _ => return Err(CliError::Invalid(format!("unknown option {a}"))),
            };
            (long.to_string(), None)
        } else {
            return Err(CliError::Invalid(format!("unexpected argument {a}")));
        };
        check_known(&name, a.split('=').next().unwrap_or(a))?;
        let value = match inline {
            Some(v) => v,
            None if FLAGS.contains(&name.as_str()) => "1".to_string(),
            None => {
                i += 1;
                args.get(i)
                    .cloned()
                    .ok_or_else(|| CliError::Invalid(format!("option {a} needs a value")))?
            }
        };
        out.insert(name, value);
        i += 1;
    }
    Ok(out)
}

/// Fully resolved invocation.
#[derive(Debug)]
pub struct Invocation {
    /// What to do.
    pub action: Action,
    /// The target (None for metadata).
    pub target: Option<Target>,
    /// Credentials.
    pub credentials: Credentials,
    /// Timeouts.
    pub options: DeviceOptions,
    /// `method=cycle` for IPMI reboot (default `onoff`).
    pub cycle: bool,
    /// Verbose logging.
    pub verbose: bool,
}

fn truthy(v: Option<&String>) -> bool {
    matches!(
        v.map(|s| s.to_ascii_lowercase()).as_deref(),
        Some("1" | "true" | "yes" | "on")
    )
}

fn secs(v: Option<&String>, default: f64, what: &str) -> Result<Duration, CliError> {
    match v {
        None => Ok(Duration::from_secs_f64(default)),
        Some(s) => s
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0 && *x < 86_400.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| CliError::Invalid(format!("{what}: not a number of seconds: {s}"))),
    }
}

/// Reads a secret from, in order: the option itself (stdin), `<name>_file`, `<name>_script`,
/// or the environment variable.
fn secret(
    o: &BTreeMap<String, String>,
    name: &str,
    env: &str,
    env_lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Secret>, CliError> {
    if let Some(v) = o.get(name) {
        return Ok(Some(Secret::new(v.clone())));
    }
    if let Some(path) = o.get(&format!("{name}_file")) {
        return Secret::from_file(std::path::Path::new(path))
            .map(Some)
            .map_err(|source| CliError::Secret {
                what: format!("{name}_file {path}"),
                source,
            });
    }
    if let Some(script) = o.get(&format!("{name}_script")) {
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|source| CliError::Secret {
                what: format!("{name}_script"),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        return Ok(Some(Secret::new(
            text.lines().next().unwrap_or("").to_string(),
        )));
    }
    Ok(env_lookup(env).map(Secret::new))
}

impl Invocation {
    /// Resolves options (argv merged over stdin) into an invocation.
    pub fn resolve(
        o: &BTreeMap<String, String>,
        env_lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, CliError> {
        let action = Action::parse(o.get("action").map(String::as_str).unwrap_or("reboot"))?;
        let verbose = truthy(o.get("verbose"));
        let power_timeout = secs(o.get("power_timeout"), 20.0, "power_timeout")?;
        let exchange = secs(
            o.get("shell_timeout").or(o.get("exchange_timeout")),
            0.5,
            "shell_timeout",
        )?;
        let retries: u32 = match o.get("retry_on").or(o.get("retries")) {
            None => 3,
            Some(s) => s
                .parse()
                .ok()
                .filter(|n| *n <= 10)
                .ok_or_else(|| CliError::Invalid(format!("retries: {s}")))?,
        };
        let options = DeviceOptions {
            exchange_timeout: exchange,
            retries,
            cipher_probe_timeout: secs(o.get("cipher_probe_timeout"), 0.1, "cipher_probe_timeout")?,
            verify: VerifyPolicy {
                timeout: power_timeout,
                interval: Duration::from_millis(20),
            },
            fencing_token: None,
        };
        if action == Action::Metadata {
            return Ok(Self {
                action,
                target: None,
                credentials: Credentials::default(),
                options,
                cycle: false,
                verbose,
            });
        }
        let agent = o
            .get("agent")
            .map(|a| a.trim_start_matches("fence_").to_string());
        let (is_pdu, is_redfish) = match agent.as_deref() {
            Some("ipmilan" | "ipmi" | "ipmilanplus") => (false, false),
            Some("apc_snmp" | "pdu" | "snmp") => (true, false),
            Some("redfish") => (false, true),
            Some(other) => return Err(CliError::Invalid(format!("unknown agent {other}"))),
            None if o.contains_key("systems_uri") => (false, true),
            None => (o.contains_key("plug"), false),
        };
        let ip = o
            .get("ip")
            .cloned()
            .ok_or_else(|| CliError::Invalid("missing ip (--ip or ip= on stdin)".into()))?;
        let port_of = |default: u16| -> Result<u16, CliError> {
            match o.get("ipport") {
                None => Ok(default),
                Some(p) => p
                    .parse()
                    .map_err(|_| CliError::Invalid(format!("bad ipport {p}"))),
            }
        };
        let mut credentials = Credentials::default();
        let target = if is_redfish {
            let username = o.get("username").cloned().ok_or_else(|| {
                CliError::Invalid("missing username (--username or login=)".into())
            })?;
            credentials.password = secret(o, "password", "PALISADE_FENCE_PASSWORD", env_lookup)?;
            if credentials.password.is_none() {
                return Err(CliError::Invalid(
                    "missing password (password= on stdin, --password-file, --password-script or PALISADE_FENCE_PASSWORD)".into(),
                ));
            }
            if o.contains_key("ssl") && !truthy(o.get("ssl")) {
                return Err(CliError::Invalid(
                    "Redfish over plain HTTP (ssl=0) is not supported".into(),
                ));
            }
            let tls = crate::redfish::tls::parse_trust(
                o.get("ssl_ca_file").map(String::as_str),
                o.get("ssl_fingerprint").map(String::as_str),
                o.get("ssl_insecure").map(String::as_str),
            )
            .map_err(CliError::Invalid)?;
            let systems_uri = o
                .get("systems_uri")
                .map(|u| crate::redfish::discovery::check_systems_uri(u))
                .transpose()
                .map_err(CliError::Invalid)?;
            let system_uuid = o
                .get("system_uuid")
                .map(|u| crate::redfish::discovery::check_uuid(u))
                .transpose()
                .map_err(CliError::Invalid)?;
            let auth = match o.get("redfish_auth").map(String::as_str).unwrap_or("auto") {
                "auto" => RedfishAuth::Auto,
                "session" => RedfishAuth::Session,
                "basic" => RedfishAuth::Basic,
                v => return Err(CliError::Invalid(format!("bad redfish_auth {v}"))),
            };
            Target::Redfish(RedfishTarget {
                host: ip,
                port: port_of(443)?,
                username,
                systems_uri,
                system: o.get("plug").cloned(),
                system_uuid,
                tls,
                auth,
            })
        } else if is_pdu {
            let plug = o
                .get("plug")
                .ok_or_else(|| CliError::Invalid("missing plug (--plug or port=)".into()))?;
            let mut outlets = Vec::new();
            for p in plug.split(',') {
                let n: u32 = p
                    .trim()
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| CliError::Invalid(format!("bad plug {p}")))?;
                outlets.push(n);
            }
            let version = match o.get("snmp_version").map(String::as_str).unwrap_or("1") {
                "1" => SnmpVersion::V1,
                "2c" | "2" => SnmpVersion::V2c,
                "3" => SnmpVersion::V3,
                v => return Err(CliError::Invalid(format!("bad snmp_version {v}"))),
            };
            let v3_auth = match o.get("snmp_auth_prot").map(String::as_str).unwrap_or("MD5") {
                "MD5" | "md5" => SnmpAuthProtocol::Md5,
                "SHA" | "sha" | "SHA1" => SnmpAuthProtocol::Sha1,
                "SHA256" | "sha256" => SnmpAuthProtocol::Sha256,
                v => return Err(CliError::Invalid(format!("bad snmp_auth_prot {v}"))),
            };
            let v3_level = match o
                .get("snmp_sec_level")
                .map(String::as_str)
                .unwrap_or("noAuthNoPriv")
            {
                "noAuthNoPriv" => SnmpSecurityLevel::NoAuthNoPriv,
                "authNoPriv" => SnmpSecurityLevel::AuthNoPriv,
                "authPriv" => SnmpSecurityLevel::AuthPriv,
                v => return Err(CliError::Invalid(format!("bad snmp_sec_level {v}"))),
            };
            if let Some(p) = o.get("snmp_priv_prot") {
                if !p.eq_ignore_ascii_case("AES") {
                    return Err(CliError::Invalid(
                        "only snmp_priv_prot=AES is supported".into(),
                    ));
                }
            }
            let profile = o
                .get("pdu_profile")
                .cloned()
                .unwrap_or_else(|| crate::pdu::profile::AUTO.into());
            if profile != crate::pdu::profile::AUTO {
                crate::pdu::profile::Profile::by_name(&profile)
                    .map_err(|e| CliError::Invalid(e.to_string()))?;
            }
            if version == SnmpVersion::V3 {
                credentials.v3_auth_password =
                    secret(o, "password", "PALISADE_FENCE_PASSWORD", env_lookup)?;
                credentials.v3_priv_password = secret(
                    o,
                    "snmp_priv_passwd",
                    "PALISADE_FENCE_SNMP_PRIV_PASSWD",
                    env_lookup,
                )?;
            } else {
                credentials.community =
                    secret(o, "community", "PALISADE_FENCE_COMMUNITY", env_lookup)?
                        .or_else(|| Some(Secret::new("private")));
            }
            Target::Pdu(PduTarget {
                host: ip,
                port: port_of(161)?,
                outlets,
                profile,
                version,
                v3_user: o.get("username").cloned(),
                v3_auth,
                v3_level,
            })
        } else {
            let username = o.get("username").cloned().ok_or_else(|| {
                CliError::Invalid("missing username (--username or login=)".into())
            })?;
            credentials.password = secret(o, "password", "PALISADE_FENCE_PASSWORD", env_lookup)?;
            if credentials.password.is_none() {
                return Err(CliError::Invalid(
                    "missing password (password= on stdin, --password-file, --password-script or PALISADE_FENCE_PASSWORD)".into(),
                ));
            }
            let cipher = match o.get("cipher") {
                None => None,
                Some(c) => Some(
                    c.parse::<u8>()
                        .map_err(|_| CliError::Invalid(format!("bad cipher {c}")))?,
                ),
            };
            if o.contains_key("lanplus") && !truthy(o.get("lanplus")) {
                return Err(CliError::Invalid(
                    "IPMI 1.5 (lanplus=0) is not supported: RMCP+ only".into(),
                ));
            }
            Target::Ipmi(IpmiTarget {
                host: ip,
                port: port_of(623)?,
                username,
                cipher,
                allow_weak_cipher_suites: truthy(o.get("allow_weak_cipher_suites")),
                system_guid: o.get("system_guid").map(|g| g.to_ascii_lowercase()),
            })
        };
        Ok(Self {
            action,
            target: Some(target),
            credentials,
            options,
            cycle: match o.get("method").map(String::as_str) {
                None | Some("onoff") => false,
                Some("cycle") => true,
                Some(m) => {
                    return Err(CliError::Invalid(format!(
                        "bad method {m} (onoff or cycle)"
                    )))
                }
            },
            verbose,
        })
    }
}

/// The parameters of the metadata: name, type, default, description. Every option
/// `palisade-fence` reads is here or in [`UNLISTED`].
const PARAMETERS: &[(&str, &str, &str, &str)] = &[
    ("action", "string", "reboot", "Fencing action"),
    (
        "agent",
        "string",
        "",
        "Backend: ipmilan, apc_snmp or redfish (default: redfish if systems_uri is given, apc_snmp if a plug is given)",
    ),
    (
        "ip",
        "string",
        "",
        "IP address or hostname of the fencing device",
    ),
    (
        "ipport",
        "integer",
        "623",
        "Port (UDP 623 for IPMI, UDP 161 for SNMP, TCP 443 for Redfish)",
    ),
    (
        "username",
        "string",
        "",
        "Login name (IPMI user, or SNMPv3 user)",
    ),
    (
        "password",
        "string",
        "",
        "Login password or SNMPv3 auth passphrase (stdin only)",
    ),
    ("password_file", "string", "", "File holding the password"),
    (
        "password_script",
        "string",
        "",
        "Script that prints the password",
    ),
    ("lanplus", "boolean", "1", "Use IPMI 2.0 RMCP+ (always on)"),
    (
        "cipher",
        "string",
        "",
        "IPMI cipher suite (default: negotiate 17, then 3)",
    ),
    (
        "allow_weak_cipher_suites",
        "boolean",
        "0",
        "Allow IPMI cipher suites 0, 1, 2",
    ),
    (
        "system_guid",
        "string",
        "",
        "IPMI: refuse to act unless the BMC reports this system GUID (Get System GUID)",
    ),
    (
        "cipher_probe_timeout",
        "second",
        "0.1",
        "IPMI: the least time to wait for Get Channel Cipher Suites; the wait grows with the BMC's measured round trip, up to shell_timeout",
    ),
    ("method", "string", "onoff", "Reboot method: onoff or cycle"),
    (
        "plug",
        "string",
        "",
        "PDU outlet number(s), comma separated; Redfish: the system's Id, Name or UUID",
    ),
    ("ssl", "boolean", "1", "Redfish: use HTTPS (always on)"),
    (
        "ssl_insecure",
        "boolean",
        "0",
        "Redfish: do not verify the BMC certificate (insecure; logged)",
    ),
    (
        "ssl_ca_file",
        "string",
        "",
        "Redfish: PEM file of the CA that issued the BMC certificate",
    ),
    (
        "ssl_fingerprint",
        "string",
        "",
        "Redfish: SHA-256 fingerprint of the BMC certificate",
    ),
    (
        "systems_uri",
        "string",
        "",
        "Redfish: URI of the ComputerSystem (default: the only one)",
    ),
    (
        "system_uuid",
        "string",
        "",
        "Redfish: refuse to act unless the system reports this UUID",
    ),
    (
        "redfish_auth",
        "string",
        "auto",
        "Redfish: auto (a session when offered, else Basic), session or basic",
    ),
    (
        "pdu_profile",
        "string",
        "auto",
        "PDU profile: auto (from sysObjectID, the default), apc, apc-rpdu, cyberpower",
    ),
    ("community", "string", "private", "SNMP community"),
    ("community_file", "string", "", "File holding the SNMP community"),
    (
        "community_script",
        "string",
        "",
        "Script that prints the SNMP community",
    ),
    ("snmp_version", "string", "1", "SNMP version: 1, 2c, 3"),
    (
        "snmp_auth_prot",
        "string",
        "MD5",
        "SNMPv3 auth protocol: MD5, SHA, SHA256",
    ),
    (
        "snmp_sec_level",
        "string",
        "noAuthNoPriv",
        "SNMPv3 security level",
    ),
    (
        "snmp_priv_prot",
        "string",
        "AES",
        "SNMPv3 privacy protocol: AES",
    ),
    (
        "snmp_priv_passwd",
        "string",
        "",
        "SNMPv3 privacy passphrase",
    ),
    (
        "snmp_priv_passwd_file",
        "string",
        "",
        "File holding the SNMPv3 privacy passphrase",
    ),
    (
        "snmp_priv_passwd_script",
        "string",
        "",
        "Script that prints the SNMPv3 privacy passphrase",
    ),
    (
        "power_timeout",
        "second",
        "20",
        "Seconds to wait for the device to report the new state",
    ),
    (
        "shell_timeout",
        "second",
        "0.5",
        "Seconds to wait for one answer before retransmitting",
    ),
    ("retry_on", "integer", "3", "Retransmissions per exchange"),
    ("verbose", "boolean", "0", "Verbose mode"),
];

/// The metadata XML (`-o metadata`), in the fence-agents format.
pub fn metadata() -> String {
    let params = PARAMETERS;
    let mut x = String::from(
        "<?xml version=\"1.0\" ?>\n<resource-agent name=\"palisade-fence\" shortdesc=\"Fence agent for IPMI 2.0 (RMCP+) and Redfish BMCs and SNMP switched PDUs\">\n<longdesc>palisade-fence powers machines off through their IPMI or Redfish BMC or switched PDU outlets and reports a fence only after the device reports the power off.</longdesc>\n<vendor-url>https://palisade.dev</vendor-url>\n<parameters>\n",
    );
    for (name, ty, default, desc) in params {
        let required = matches!(*name, "ip");
        x.push_str(&format!(
            "\t<parameter name=\"{name}\" unique=\"0\" required=\"{}\">\n\t\t<getopt mixed=\"--{}\" />\n\t\t<content type=\"{ty}\"{} />\n\t\t<shortdesc lang=\"en\">{desc}</shortdesc>\n\t</parameter>\n",
            u8::from(required),
            name.replace('_', "-"),
            if default.is_empty() { String::new() } else { format!(" default=\"{default}\"") },
        ));
    }
    x.push_str("</parameters>\n<actions>\n");
    for a in [
        "on",
        "off",
        "reboot",
        "status",
        "monitor",
        "list",
        "metadata",
        "validate-all",
    ] {
        x.push_str(&format!("\t<action name=\"{a}\" />\n"));
    }
    x.push_str("</actions>\n</resource-agent>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn stdin_in_fence_ipmilan_style_resolves_to_an_ipmi_target() {
        let o = parse_stdin(
            "# from stonithd\naction=status\nipaddr=127.0.0.1\nipport=6230\nlogin=admin\npasswd=s3cret\nlanplus=1\ncipher=3\n",
        ).unwrap();
        let inv = Invocation::resolve(&o, &no_env).unwrap();
        assert_eq!(inv.action, Action::Status);
        let Some(Target::Ipmi(t)) = inv.target else {
            panic!()
        };
        assert_eq!(
            (t.port, t.cipher, t.username.as_str()),
            (6230, Some(3), "admin")
        );
        assert_eq!(inv.credentials.password.unwrap().expose(), "s3cret");
    }

    #[test]
    fn stdin_in_fence_apc_snmp_style_resolves_to_a_pdu_target() {
        let o = parse_stdin(
            "action=off\nip=127.0.0.1\nipport=1161\nport=2,3\ncommunity=private\nsnmp_version=2c\n",
        )
        .unwrap();
        let inv = Invocation::resolve(&o, &no_env).unwrap();
        let Some(Target::Pdu(t)) = inv.target else {
            panic!()
        };
        assert_eq!(t.outlets, vec![2, 3]);
        assert_eq!(t.version, SnmpVersion::V2c);
        assert_eq!(inv.credentials.community.unwrap().expose(), "private");
    }

    #[test]
    fn long_options_and_env_secrets() {
        let args: Vec<String> = [
            "--ip",
            "10.0.0.1",
            "--username=admin",
            "--lanplus",
            "-o",
            "off",
            "--cipher",
            "17",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let o = parse_args(&args).unwrap();
        let env = |k: &str| (k == "PALISADE_FENCE_PASSWORD").then(|| "pw".to_string());
        let inv = Invocation::resolve(&o, &env).unwrap();
        assert_eq!(inv.action, Action::Off);
        assert_eq!(inv.credentials.password.unwrap().expose(), "pw");
        assert!(Invocation::resolve(&o, &no_env).is_err(), "no password");
        assert!(parse_args(&["--ip".to_string()]).is_err());
        assert!(parse_args(&["-x".to_string()]).is_err());
    }

    #[test]
    fn stdin_in_fence_redfish_style_resolves_to_a_redfish_target() {
        let fp = "ab".repeat(32);
        let o = parse_stdin(&format!(
            "agent=fence_redfish\naction=off\nip=127.0.0.1\nipport=8443\nusername=admin\npassword=pw\nssl=1\nssl_fingerprint={fp}\nsystems_uri=/redfish/v1/Systems/1\nplug=node-a\n"
        )).unwrap();
        let inv = Invocation::resolve(&o, &no_env).unwrap();
        let Some(Target::Redfish(t)) = inv.target else {
            panic!()
        };
        assert_eq!((t.port, t.username.as_str()), (8443, "admin"));
        assert_eq!(t.systems_uri.as_deref(), Some("/redfish/v1/Systems/1"));
        assert_eq!(t.system.as_deref(), Some("node-a"));
        assert_eq!(t.tls, crate::target::RedfishTls::Fingerprint([0xab; 32]));
        assert_eq!(inv.credentials.password.unwrap().expose(), "pw");
        // No pin and no explicit ssl_insecure: refused, never an insecure default.
        let o = parse_stdin("agent=redfish\nip=bmc\nusername=a\npassword=p\n").unwrap();
        assert!(Invocation::resolve(&o, &no_env).is_err());
        let o =
            parse_stdin("agent=redfish\nip=bmc\nusername=a\npassword=p\nssl_insecure\n").unwrap();
        let inv = Invocation::resolve(&o, &no_env).unwrap();
        let Some(Target::Redfish(t)) = inv.target else {
            panic!()
        };
        assert_eq!((t.port, t.tls), (443, crate::target::RedfishTls::Insecure));
        let o =
            parse_stdin("agent=redfish\nip=bmc\nusername=a\npassword=p\nssl=0\nssl_insecure=1\n")
                .unwrap();
        assert!(Invocation::resolve(&o, &no_env).is_err(), "no plain HTTP");
        let o = parse_stdin(
            "ip=bmc\nusername=a\npassword=p\nsystems_uri=/redfish/v1/Systems/x\nssl_ca_file=/ca.pem\n",
        ).unwrap();
        assert!(matches!(
            Invocation::resolve(&o, &no_env).unwrap().target,
            Some(Target::Redfish(_))
        ));
    }

    #[test]
    fn metadata_lists_actions_and_parameters() {
        let m = metadata();
        assert!(m.contains("<action name=\"validate-all\" />"));
        assert!(m.contains("name=\"snmp_priv_passwd\""));
        assert!(m.starts_with("<?xml"));
    }

    #[test]
    fn a_misspelt_long_option_is_an_error_naming_it() {
        let args: Vec<String> = ["--ip", "bmc", "--power-timout", "60"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let e = parse_args(&args).unwrap_err().to_string();
        assert!(e.contains("unknown option \"--power-timout\""), "{e}");
        assert!(e.contains("did you mean power_timeout?"), "{e}");
        assert!(e.contains("valid: "), "{e}");
        assert!(e.contains("shell_timeout"), "the list: {e}");
        let e = parse_args(&["--power-timout=60".to_string()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"--power-timout\""), "{e}");
    }

    #[test]
    fn a_misspelt_stdin_option_is_an_error_naming_it() {
        let e = parse_stdin(
            "action=off
ip=bmc
power_timout=60
",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown option \"power_timout\""), "{e}");
        assert!(e.contains("did you mean power_timeout?"), "{e}");
        let e = parse_stdin(
            "action=off
ip=bmc
system_giud=x
",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("did you mean system_guid?"), "{e}");
        let e = parse_stdin(
            "ip=bmc
ssl_secure
",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown option \"ssl_secure\""), "{e}");
    }

    #[test]
    fn what_pacemaker_sends_and_the_old_aliases_are_accepted() {
        let o = parse_stdin(
            "action=off
nodename=node-a
nodeid=3
port=node-a
ipaddr=bmc
login=a
passwd=p
udpport=623
agent=ipmilan
exchange_timeout=1
retries=2
",
        )
        .unwrap();
        assert!(Invocation::resolve(&o, &no_env).is_ok());
        for name in known_options() {
            assert!(parse_stdin(&format!("{name}=1\n")).is_ok(), "{name}");
        }
    }

    #[test]
    fn every_option_read_is_in_the_metadata_or_the_unlisted_few() {
        let m = metadata();
        for (name, ..) in PARAMETERS {
            assert!(m.contains(&format!("name=\"{name}\"")), "{name}");
        }
        assert!(m.contains("name=\"cipher_probe_timeout\""));
        let names: Vec<&str> = known_options();
        let mut dedup = names.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len(), "no name listed twice");
    }

    #[test]
    fn a_misspelt_reboot_method_is_an_error() {
        let o = parse_stdin(
            "ip=bmc
login=a
passwd=p
method=cylce
",
        )
        .unwrap();
        let e = Invocation::resolve(&o, &no_env).unwrap_err().to_string();
        assert!(e.contains("bad method cylce"), "{e}");
    }
}
