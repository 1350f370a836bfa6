//! The bridge's configuration file (TOML): listener, TLS material, client policy, rate limits
//! and the inventory of targets with their fencing levels and devices.
//!
//! [`FileConfig`] is the file as written; [`FileConfig::load`] reads and validates it, and
//! [`Inventory::load`] resolves every credential reference (refusing loose files).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;
use url::Url;

use crate::policy::PolicyRule;
use crate::secret::{Secret, SecretError, SecretRef};

/// Device URL schemes the bridge knows how to drive.
pub const KNOWN_SCHEMES: &[&str] = &["ipmi", "snmp+pdu", "redfish+https", "storagefw+https"];

/// Errors reading or validating the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("config file {path} is invalid")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A semantic problem, described in `reason`.
    #[error("config file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A credential of a device could not be loaded.
    #[error("target {target}, device {url}: credential {name:?}")]
    Credential {
        /// The target id.
        target: String,
        /// The device URL (credentials are never part of it).
        url: String,
        /// The credential's name (e.g. `password`).
        name: String,
        /// Why.
        #[source]
        source: SecretError,
    },
}

/// TLS material for the server.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM). Must not be group- or world-accessible.
    pub key: PathBuf,
    /// CA bundle (PEM) that client certificates must chain to.
    pub client_ca: PathBuf,
}

/// Per-client token bucket.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Bucket size: requests a client may send in a burst. Default 20.
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// Refill rate in requests per second. Default 10.
    #[serde(default = "default_rate")]
    pub per_second: f64,
}

fn default_burst() -> u32 {
    20
}
fn default_rate() -> f64 {
    10.0
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            burst: default_burst(),
            per_second: default_rate(),
        }
    }
}

/// One device in a fencing level, as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// Device URL: `ipmi://host:port`, `snmp+pdu://host:port/outlet`, `storagefw+https://...`.
    /// Must not embed credentials.
    pub url: String,
    /// User name (not secret), e.g. the BMC user or SNMPv3 user.
    #[serde(default)]
    pub username: Option<String>,
    /// Named credentials (`password`, `community`, `auth_password`, `priv_password`, `token`).
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretRef>,
    /// `storagefw+https`: PEM file of the only CA trusted for the storage admin API (required).
    #[serde(default)]
    pub ca_bundle: Option<PathBuf>,
    /// `storagefw+https`: the node name the storage knows this target by (required).
    #[serde(default)]
    pub node: Option<String>,
    /// `storagefw+https`: the node's addresses to block at the storage.
    #[serde(default)]
    pub addresses: Vec<std::net::IpAddr>,
}

/// One fencing level, as written: every device must succeed.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LevelConfig {
    /// A name for logs and evidence (e.g. `ipmi`, `pdu`).
    #[serde(default)]
    pub name: Option<String>,
    /// The devices of this level.
    pub devices: Vec<DeviceConfig>,
}

/// One target (a machine), as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// The target id used in the API (`bridge://host:port/<id>`).
    pub id: String,
    /// Power fencing levels, tried in order.
    #[serde(default)]
    pub levels: Vec<LevelConfig>,
    /// Storage firewall devices (`storagefw+https://`); all must succeed.
    #[serde(default)]
    pub storage: Vec<DeviceConfig>,
}

/// The configuration file as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Listen address, e.g. `127.0.0.1:8443`.
    pub listen: SocketAddr,
    /// Directory for persisted state (fencing-token floors, idempotency records).
    pub state_dir: PathBuf,
    /// Audit log path. Default `<state_dir>/audit.jsonl`.
    #[serde(default)]
    pub audit_log: Option<PathBuf>,
    /// Maximum request body in bytes. Default 16 KiB.
    #[serde(default = "default_body")]
    pub max_body_bytes: usize,
    /// Budget for one device operation (command and verify), seconds. Default 120.
    #[serde(default = "default_op_timeout")]
    pub operation_timeout_secs: u64,
    /// How long finished idempotency records are kept (seconds; pruned at start). A retry
    /// older than this acts again. Default 7 days.
    #[serde(default = "default_retention")]
    pub idempotency_retention_secs: u64,
    /// TLS material.
    pub tls: TlsFiles,
    /// Per-client rate limit.
    #[serde(default)]
    pub rate_limit: RateLimitConfig,
    /// Who may act on what. Deny by default.
    #[serde(default)]
    pub policy: Vec<PolicyRule>,
    /// The inventory.
    #[serde(default)]
    pub targets: Vec<TargetConfig>,
}

fn default_body() -> usize {
    16 * 1024
}
fn default_op_timeout() -> u64 {
    120
}
fn default_retention() -> u64 {
    7 * 24 * 3600
}

impl FileConfig {
    /// Reads, parses and validates the file (credentials are not loaded here).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and validates `text`; `path` is used in messages and to resolve relative paths.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let mut cfg: FileConfig = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
        let invalid = |reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.resolve_relative(base);
        let mut ids = BTreeSet::new();
        for t in &cfg.targets {
            if !valid_id(&t.id) {
                return Err(invalid(format!(
                    "target id {:?} must be 1-63 characters of [A-Za-z0-9._-]",
                    t.id
                )));
            }
            if !ids.insert(t.id.clone()) {
                return Err(invalid(format!("target id {:?} appears twice", t.id)));
            }
            if t.levels.is_empty() && t.storage.is_empty() {
                return Err(invalid(format!(
                    "target {:?} has no fencing level or storage",
                    t.id
                )));
            }
            for (i, l) in t.levels.iter().enumerate() {
                if l.devices.is_empty() {
                    return Err(invalid(format!(
                        "target {:?} level {} has no device",
                        t.id, i
                    )));
                }
                for d in &l.devices {
                    check_device(
                        &t.id,
                        d,
                        &["ipmi", "snmp+pdu", "redfish+https", "storagefw+https"],
                    )
                    .map_err(&invalid)?;
                }
            }
            for d in &t.storage {
                check_device(&t.id, d, &["storagefw+https"]).map_err(&invalid)?;
            }
        }
        for rule in &cfg.policy {
            for t in &rule.targets {
                if t != "*" && !ids.contains(t) {
                    return Err(invalid(format!(
                        "policy for client {:?} names unknown target {:?}",
                        rule.client, t
                    )));
                }
            }
        }
        if cfg.max_body_bytes == 0 || cfg.rate_limit.burst == 0 || cfg.rate_limit.per_second <= 0.0
        {
            return Err(invalid(
                "max_body_bytes, rate_limit.burst and rate_limit.per_second must be positive"
                    .into(),
            ));
        }
        Ok(cfg)
    }

    fn resolve_relative(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.state_dir);
        if let Some(a) = self.audit_log.as_mut() {
            fix(a);
        }
        fix(&mut self.tls.cert);
        fix(&mut self.tls.key);
        fix(&mut self.tls.client_ca);
        for t in &mut self.targets {
            let devs = t.levels.iter_mut().flat_map(|l| l.devices.iter_mut());
            for d in devs.chain(t.storage.iter_mut()) {
                for s in d.secrets.values_mut() {
                    if let Some(f) = s.file.as_mut() {
                        fix(f);
                    }
                }
                if let Some(f) = d.ca_bundle.as_mut() {
                    fix(f);
                }
            }
        }
    }

    /// The audit log path.
    pub fn audit_path(&self) -> PathBuf {
        self.audit_log
            .clone()
            .unwrap_or_else(|| self.state_dir.join("audit.jsonl"))
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn check_device(target: &str, d: &DeviceConfig, schemes: &[&str]) -> Result<(), String> {
    let url = Url::parse(&d.url)
        .map_err(|e| format!("target {target:?}: device URL {:?} is invalid: {e}", d.url))?;
    if !schemes.contains(&url.scheme()) {
        return Err(format!(
            "target {target:?}: device URL scheme {:?} not allowed here (expected one of {schemes:?})",
            url.scheme()
        ));
    }
    if url.password().is_some() {
        return Err(format!(
            "target {target:?}: device URL must not embed credentials; use `secrets`"
        ));
    }
    if url.scheme() == "storagefw+https" && (d.ca_bundle.is_none() || d.node.is_none()) {
        return Err(format!(
            "target {target:?}: storage device {:?} needs `ca_bundle` and `node`",
            d.url
        ));
    }
    for (name, r) in &d.secrets {
        if r.file.is_none() && r.env.is_none() {
            return Err(format!(
                "target {target:?}: secret {name:?} needs `file` or `env`"
            ));
        }
    }
    Ok(())
}

/// A device with its credentials loaded.
#[derive(Debug, Clone)]
pub struct Device {
    /// The device URL (no credentials in it).
    pub url: Url,
    /// User name, if any.
    pub username: Option<String>,
    /// Loaded credentials by name.
    pub secrets: BTreeMap<String, Secret>,
    /// Storage devices: the CA bundle file (PEM).
    pub ca_bundle: Option<PathBuf>,
    /// Storage devices: the node name at the storage.
    pub node: Option<String>,
    /// Storage devices: the node's addresses.
    pub addresses: Vec<std::net::IpAddr>,
}

/// A fencing level with loaded devices.
#[derive(Debug, Clone)]
pub struct Level {
    /// Level name for evidence.
    pub name: String,
    /// Devices; all must succeed.
    pub devices: Vec<Device>,
}

/// A target with loaded devices.
#[derive(Debug, Clone)]
pub struct Target {
    /// Target id.
    pub id: String,
    /// Power fencing levels in order.
    pub levels: Vec<Level>,
    /// Storage firewall devices.
    pub storage: Vec<Device>,
}

/// All targets, with credentials loaded.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Targets by id.
    pub targets: BTreeMap<String, Target>,
}

impl Inventory {
    /// Loads every credential of every device.
    ///
    /// # Guarantees
    /// Fails (naming target, device, credential and file mode) if any credentials file is
    /// group- or world-accessible, so the bridge refuses to start.
    pub fn load(cfg: &FileConfig) -> Result<Self, ConfigError> {
        let mut targets = BTreeMap::new();
        for t in &cfg.targets {
            let load_dev = |d: &DeviceConfig| -> Result<Device, ConfigError> {
                let mut secrets = BTreeMap::new();
                for (name, r) in &d.secrets {
                    let s = r.load().map_err(|source| ConfigError::Credential {
                        target: t.id.clone(),
                        url: d.url.clone(),
                        name: name.clone(),
                        source,
                    })?;
                    secrets.insert(name.clone(), s);
                }
                Ok(Device {
                    // Validated in FileConfig::parse.
                    url: Url::parse(&d.url).map_err(|e| ConfigError::Invalid {
                        path: PathBuf::new(),
                        reason: format!("device URL {:?}: {e}", d.url),
                    })?,
                    username: d.username.clone(),
                    secrets,
                    ca_bundle: d.ca_bundle.clone(),
                    node: d.node.clone(),
                    addresses: d.addresses.clone(),
                })
            };
            let mut levels = Vec::new();
            for (i, l) in t.levels.iter().enumerate() {
                let devices = l
                    .devices
                    .iter()
                    .map(load_dev)
                    .collect::<Result<Vec<_>, _>>()?;
                levels.push(Level {
                    name: l.name.clone().unwrap_or_else(|| format!("level{i}")),
                    devices,
                });
            }
            let storage = t
                .storage
                .iter()
                .map(load_dev)
                .collect::<Result<Vec<_>, _>>()?;
            targets.insert(
                t.id.clone(),
                Target {
                    id: t.id.clone(),
                    levels,
                    storage,
                },
            );
        }
        Ok(Self { targets })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
listen = "127.0.0.1:8443"
state_dir = "state"
[tls]
cert = "s.crt"
key = "s.key"
client_ca = "ca.crt"
"#;

    #[test]
    fn relative_paths_resolve_against_config_dir() {
        let cfg = FileConfig::parse(Path::new("/etc/fb/bridge.toml"), BASE).unwrap();
        assert_eq!(cfg.state_dir, Path::new("/etc/fb/state"));
        assert_eq!(cfg.audit_path(), Path::new("/etc/fb/state/audit.jsonl"));
    }

    #[test]
    fn the_shipped_example_config_is_valid() {
        let text = include_str!("../dist/bridge.example.toml");
        let cfg = FileConfig::parse(Path::new("/etc/firmware-bridge/bridge.toml"), text).unwrap();
        assert_eq!(cfg.targets.len(), 1);
        assert_eq!(cfg.targets[0].levels.len(), 2);
        assert_eq!(cfg.policy.len(), 2);
    }

    #[test]
    fn invalid_inventories_are_refused_with_reasons() {
        let cases = [
            (
                "[[targets]]\nid = \"m 0\"\n[[targets.levels]]\ndevices=[{url=\"ipmi://h\"}]",
                "target id",
            ),
            ("[[targets]]\nid = \"m0\"", "no fencing level"),
            (
                "[[targets]]\nid = \"m0\"\n[[targets.levels]]\ndevices=[{url=\"http://h\"}]",
                "scheme",
            ),
            (
                "[[targets]]\nid = \"m0\"\n[[targets.levels]]\ndevices=[{url=\"ipmi://u:p@h\"}]",
                "embed credentials",
            ),
            (
                "[[targets]]\nid = \"m0\"\nstorage=[{url=\"storagefw+https://s:1/\"}]",
                "needs `ca_bundle` and `node`",
            ),
            (
                "[[policy]]\nclient = \"c\"\ntargets = [\"nope\"]",
                "unknown target",
            ),
        ];
        for (extra, want) in cases {
            let err = FileConfig::parse(Path::new("/x.toml"), &format!("{BASE}{extra}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{extra}: {err}");
        }
    }
}
