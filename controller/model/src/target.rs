//! `FenceTarget`: one node's fencing levels, named after the node.
//!
//! Levels are tried in order; every device in a level must succeed (and be verified) for the
//! level to count. Devices are addressed by URL; the scheme picks the agent:
//! `ipmi://`, `snmp+pdu://`, `redfish+https://`, `storagefw+https://`, or `bridge://<host>:<port>/<target-id>` when the
//! firmware-bridge holds the inventory and the credentials.

use std::collections::BTreeMap;

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Spec of a `FenceTarget` (cluster-scoped; `metadata.name` is the node's name).
// kube's `printcolumn(...)` repeats `type_ = ...`, which clippy mistakes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "palisade.dev",
    version = "v1alpha1",
    kind = "FenceTarget",
    plural = "fencetargets",
    shortname = "ftgt",
    status = "crate::acceptance::ConfigStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    printcolumn(name = "Levels", type_ = "string", json_path = ".spec.levels[*].name"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FenceTargetSpec {
    /// Fencing levels, tried in order until one is verified (at most 16).
    #[schemars(length(min = 1, max = 16))]
    pub levels: Vec<FenceLevel>,
}

/// One fencing level: all its devices must succeed, verified.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FenceLevel {
    /// A name for Events and status (for example `ipmi` or `pdu+storage`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 63))]
    pub name: String,
    /// The devices of this level (at most 16).
    #[schemars(length(min = 1, max = 16))]
    pub devices: Vec<FenceDevice>,
    /// Whether this level may turn the machine's power off (default `Allowed`).
    #[serde(default, skip_serializing_if = "PowerOff::is_allowed")]
    pub power_off: PowerOff,
}

/// Whether a level may power the machine off.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum PowerOff {
    /// The level's power devices power the machine off, verified.
    #[default]
    Allowed,
    /// For hosts that lose their BMC when off (a BMC sharing the host's NIC over NC-SI): the
    /// level's storage devices fence first (block, verified), then its power devices restart
    /// the machine without powering it off (IPMI chassis hard reset, Redfish `ForceRestart`).
    ///
    /// Guarantees: the level is verified on its storage blocks alone, so it covers only the
    /// pods that mount a claim; no reset is sent unless every storage block was verified; no
    /// power-off command is ever sent for it, and never a power-on in recovery; the storage
    /// block is lifted only after the node reports a boot ID other than the one it had when
    /// fencing began. Assumptions: the level has at least one storage device, and its power
    /// devices are direct IPMI or Redfish BMCs ([`FenceTargetSpec::validate`] refuses others).
    Disallowed,
}

impl PowerOff {
    /// The default.
    pub fn is_allowed(&self) -> bool {
        *self == PowerOff::Allowed
    }
}

/// One fencing device.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FenceDevice {
    /// Address of the device; its scheme picks the agent. Grammar (a query key not listed for
    /// its scheme, a key given twice, a `#fragment` or a malformed value is refused: a misspelt
    /// key never silently drops a setting; reference: `docs/reference/device-urls.md`):
    ///
    /// - `ipmi://USER@HOST[:PORT][?cipher=17|3|auto][&allow_weak_cipher_suites=true|false][&guid=GUID]`:
    ///   an IPMI 2.0 RMCP+ BMC (UDP 623). `cipher`: a fixed suite (default: negotiate 17, then
    ///   3; suites 0-2 need `allow_weak_cipher_suites=true`). `guid`: the system GUID the BMC
    ///   must report before any command (default: the Node's `systemUUID`, when it has one).
    /// - `snmp+pdu://[V3USER@]HOST[:PORT]/outlet/N[,M...][?profile=auto|apc|apc-rpdu|cyberpower][&version=1|2c|3][&auth=md5|sha|sha256][&sec_level=noAuthNoPriv|authNoPriv|authPriv][&priv=aes]`:
    ///   switched PDU outlets over SNMP (UDP 161); off means every listed outlet off.
    /// - `redfish+https://USER@HOST[:PORT][/redfish/v1/Systems/ID][?system=ID|NAME|UUID][&uuid=UUID][&auth=auto|session|basic]`
    ///   with exactly one TLS trust: `ca=secret` (the Secret's `caBundle`), `ca_file=PATH`,
    ///   `fingerprint=SHA256` or `ssl_insecure=true`. `uuid`: the UUID the system must report
    ///   (default: the Node's `systemUUID`, when it has one).
    /// - `storagefw+https://HOST[:PORT][/PREFIX][?profile=NAME]`: a storage firewall.
    /// - `bridge://HOST:PORT/TARGET-ID`: a firmware-bridge target; no user, no query keys.
    ///
    /// A URL never carries credentials: a `user:password@` part is refused by the schema and by
    /// [`FenceTargetSpec::validate`] (they belong in `credentialsSecretRef`). A bare user name
    /// is allowed where the agent takes one from the URL: `ipmi://user@host`,
    /// `redfish+https://user@host` and an SNMPv3
    /// user (`snmp+pdu://user@host/...?version=3`); anywhere else a `user@` part is refused too
    /// (an SNMP community in that place would be a secret).
    #[schemars(
        regex(
            pattern = r"^(ipmi|snmp\+pdu|redfish\+https|storagefw\+https|bridge)://([^\s/@:]+@)?[^\s/@]+(/[^\s]*)?$"
        ),
        length(max = 2048)
    )]
    pub url: String,
    /// What fencing through this device proves.
    pub kind: DeviceKind,
    /// Secret holding this device's credentials. Not allowed for `bridge://` (the bridge holds them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
    /// Budget for one command-then-verify round on this device. Default 20 s.
    #[serde(default = "default_device_timeout")]
    #[schemars(range(min = 1, max = 600))]
    pub timeout_seconds: i64,
    /// For a `Storage` device, required: the claims whose volumes it cuts off. A pod is
    /// released on this device's block only when every claim it mounts is named here; any
    /// other pod is held, and while a held pod mounts a claim only the volumes of a CSI driver
    /// named here are detached. Not allowed on a `Power` device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fences: Option<StorageScope>,
}

/// What a storage device fences: the claims whose volumes it can cut off from a node.
///
/// Guarantees: [`StorageScope::includes`] is true only for a claim known to be backed by a
/// named StorageClass or provisioner; an unknown claim (no PersistentVolumeClaim read), or one
/// with neither field named, is never included.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageScope {
    /// StorageClass names (a claim's `spec.storageClassName`). A claim bound to a
    /// PersistentVolume without a class is named by its CSI driver instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub storage_classes: Vec<String>,
    /// CSI driver names: a claim bound to a PersistentVolume of one of these drivers
    /// (`spec.csi.driver`), static or provisioned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub csi_drivers: Vec<String>,
}

impl StorageScope {
    /// Whether the scope names nothing (it then fences no claim).
    pub fn is_empty(&self) -> bool {
        self.storage_classes.is_empty() && self.csi_drivers.is_empty()
    }

    /// Whether a claim backed by `backing` is fenced by this scope.
    pub fn includes(&self, backing: &ClaimBacking) -> bool {
        match backing {
            ClaimBacking::Unknown => false,
            ClaimBacking::Known {
                storage_class,
                driver,
                ..
            } => {
                (!storage_class.is_empty()
                    && self.storage_classes.iter().any(|c| c == storage_class))
                    || driver
                        .as_ref()
                        .is_some_and(|p| self.csi_drivers.iter().any(|d| d == p))
            }
        }
    }

    /// Both scopes' names, each once.
    pub fn union(&self, other: &StorageScope) -> StorageScope {
        let join = |a: &[String], b: &[String]| {
            let mut v: Vec<String> = a.iter().chain(b).cloned().collect();
            v.sort();
            v.dedup();
            v
        };
        StorageScope {
            storage_classes: join(&self.storage_classes, &other.storage_classes),
            csi_drivers: join(&self.csi_drivers, &other.csi_drivers),
        }
    }
}

/// What backs one claim a pod mounts, as release read it (live, not from a cache).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClaimBacking {
    /// The claim could not be read (deleted, or the read failed): no scope includes it.
    Unknown,
    /// The claim as read.
    Known {
        /// `spec.storageClassName` (`""` when unset or empty).
        storage_class: String,
        /// The CSI driver of the PersistentVolume it is bound to (`spec.csi.driver`), if it is
        /// bound to one.
        driver: Option<String>,
        /// `spec.volumeName`: the PersistentVolume it is bound to, if any.
        volume: Option<String>,
    },
}

fn default_device_timeout() -> i64 {
    20
}

/// What a device fences.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum DeviceKind {
    /// Power: verified when the device reports the power off.
    Power,
    /// Storage: verified when the storage reports the node blocked.
    Storage,
}

/// A reference to a Secret and the keys within it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Secret namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Role to key within the Secret, for example `username: user`, `password: pass`,
    /// `community: rw`, `caBundle: ca.crt`. Empty means the agent's conventional key names.
    #[serde(default)]
    pub keys: BTreeMap<String, String>,
}

/// The agent a device URL selects, from its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceScheme {
    /// `ipmi://`: an IPMI 2.0 BMC (power).
    Ipmi,
    /// `snmp+pdu://`: a switched PDU over SNMP (power).
    SnmpPdu,
    /// `redfish+https://`: a Redfish BMC's ComputerSystem (power).
    Redfish,
    /// `storagefw+https://`: the storage firewall's HTTPS API (storage).
    StorageFirewall,
    /// `bridge://`: the firmware-bridge, which holds the inventory and credentials.
    Bridge,
}

impl FenceDevice {
    /// Whether this is a power device reached directly at its BMC (IPMI or Redfish): the only
    /// kind that can prove which machine it acts on (a system GUID or UUID to compare with the
    /// Node's `systemUUID`), read as power evidence, or reset a machine. A PDU outlet or a
    /// `bridge://` device is not.
    pub fn is_direct_bmc(&self) -> bool {
        direct_bmc(&self.url, self.kind)
    }
}

/// Whether a device of `kind` at `url` is a direct BMC ([`FenceDevice::is_direct_bmc`]).
fn direct_bmc(url: &str, kind: DeviceKind) -> bool {
    kind == DeviceKind::Power
        && matches!(
            DeviceScheme::of(url),
            Some(DeviceScheme::Ipmi | DeviceScheme::Redfish)
        )
}

impl DeviceScheme {
    /// Parse the scheme of a device URL; `None` when it is not one Palisade knows or the URL has
    /// nothing after `://`.
    pub fn of(url: &str) -> Option<Self> {
        let (scheme, rest) = url.split_once("://")?;
        if rest.is_empty() || rest.chars().any(char::is_whitespace) {
            return None;
        }
        match scheme {
            "ipmi" => Some(Self::Ipmi),
            "snmp+pdu" => Some(Self::SnmpPdu),
            "redfish+https" => Some(Self::Redfish),
            "storagefw+https" => Some(Self::StorageFirewall),
            "bridge" => Some(Self::Bridge),
            _ => None,
        }
    }

    /// The device kind this scheme implies, if it implies one (`bridge://` serves both).
    pub fn implied_kind(self) -> Option<DeviceKind> {
        match self {
            Self::Ipmi | Self::SnmpPdu | Self::Redfish => Some(DeviceKind::Power),
            Self::StorageFirewall => Some(DeviceKind::Storage),
            Self::Bridge => None,
        }
    }
}

/// A malformed `FenceTarget`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// No levels at all.
    #[error("a FenceTarget needs at least one level")]
    NoLevels,
    /// A level with no devices.
    #[error("levels[{level}] has no devices")]
    EmptyLevel {
        /// Level index.
        level: usize,
    },
    /// A URL whose scheme Palisade does not know.
    #[error("levels[{level}].devices[{device}].url {url:?}: scheme must be ipmi, snmp+pdu, redfish+https, storagefw+https or bridge")]
    UnknownScheme {
        /// Level index.
        level: usize,
        /// Device index.
        device: usize,
        /// The URL.
        url: String,
    },
    /// The kind contradicts the scheme (an IPMI device cannot fence storage).
    #[error("levels[{level}].devices[{device}]: kind {kind:?} contradicts the URL scheme")]
    KindMismatch {
        /// Level index.
        level: usize,
        /// Device index.
        device: usize,
        /// The declared kind.
        kind: DeviceKind,
    },
    /// A `bridge://` URL that is not `bridge://<host>:<port>/<target-id>`.
    #[error("levels[{level}].devices[{device}].url {url:?}: a bridge device is bridge://<host>:<port>/<target-id>")]
    BridgeUrl {
        /// Level index.
        level: usize,
        /// Device index.
        device: usize,
        /// The URL.
        url: String,
    },
    /// A direct device without credentials, or a bridge device with them.
    #[error("levels[{level}].devices[{device}]: {problem}")]
    Credentials {
        /// Level index.
        level: usize,
        /// Device index.
        device: usize,
        /// What is wrong.
        problem: &'static str,
    },
    /// A Storage device that names nothing it fences, or a Power device with `fences`.
    #[error("levels[{level}].devices[{device}]: {problem}")]
    StorageScope {
        /// Level index.
        level: usize,
        /// Device index.
        device: usize,
        /// What is wrong.
        problem: &'static str,
    },
    /// A URL with a `user:password@` part. The URL shown is redacted ([`redact_url`]); the
    /// device is never used.
    #[error("levels[{level}].devices[{device}].url {url:?} carries credentials; put them in a Secret named by credentialsSecretRef")]
    CredentialsInUrl {
        /// Level index.
        level: usize,
        /// Device index.
        device: usize,
        /// The URL, with the credentials replaced by `REDACTED`.
        url: String,
    },
    /// A `powerOff: Disallowed` level without a storage device: nothing would prove the fence.
    #[error("levels[{level}] has powerOff: Disallowed but no Storage device: a reset proves nothing, only a verified storage block can")]
    NoStorageToReset {
        /// Level index.
        level: usize,
    },
    /// A power device in a `powerOff: Disallowed` level that cannot restart without powering
    /// off (a PDU outlet) or whose reset Palisade does not drive (a bridge).
    #[error("levels[{level}].devices[{device}]: a powerOff: Disallowed level restarts through a direct ipmi:// or redfish+https:// BMC only (a PDU outlet can only cut the power; resets through the firmware-bridge are not supported)")]
    CannotReset {
        /// Level index.
        level: usize,
        /// Device index.
        device: usize,
    },
    /// A timeout outside 1..=600 s.
    #[error("levels[{level}].devices[{device}].timeoutSeconds {value} must be in 1..=600")]
    Timeout {
        /// Level index.
        level: usize,
        /// Device index.
        device: usize,
        /// The value.
        value: i64,
    },
}

/// Whether `url` is `bridge://<host>:<port>/<target-id>` (host a name, an IPv4 address or a
/// bracketed IPv6 address; port 1-65535; target id of letters, digits, `.`, `_`, `-`).
/// The part of a URL between `://` and the first `/` (host, port and any userinfo).
fn authority(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    Some(rest.split_once('/').map_or(rest, |(a, _)| a))
}

/// True when the URL carries a userinfo part (`user@` or `user:password@`) before its host.
pub fn has_userinfo(url: &str) -> bool {
    authority(url).is_some_and(|a| a.contains('@'))
}

/// True when the URL carries credentials: a password (`user:password@`), or a user part where
/// the scheme takes no user name from the URL (only `ipmi://user@`, `redfish+https://user@`
/// and an SNMPv3 `snmp+pdu://user@…?version=3` do), or a user part with no `://` at all.
pub fn has_credentials(url: &str) -> bool {
    let Some(auth) = authority(url) else {
        return url.contains('@');
    };
    let Some((userinfo, _)) = auth.rsplit_once('@') else {
        return false;
    };
    if userinfo.contains(':') || userinfo.contains('@') {
        return true;
    }
    let snmp_v3 = url.starts_with("snmp+pdu://")
        && url
            .split_once('?')
            .is_some_and(|(_, q)| q.split('&').any(|kv| kv == "version=3"));
    !(url.starts_with("ipmi://") || url.starts_with("redfish+https://") || snmp_v3)
}

/// The URL with any userinfo replaced by `REDACTED`, safe for logs, Events and status.
///
/// Guarantees: nothing between `://` and the last `@` of the authority survives; a URL without
/// `://` that contains `@` is replaced whole.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (auth, path) = match rest.split_once('/') {
                Some((a, p)) => (a, Some(p)),
                None => (rest, None),
            };
            let host = match auth.rsplit_once('@') {
                Some((_, host)) => format!("REDACTED@{host}"),
                None => auth.to_string(),
            };
            match path {
                Some(p) => format!("{scheme}://{host}/{p}"),
                None => format!("{scheme}://{host}"),
            }
        }
        None if url.contains('@') => "REDACTED".to_string(),
        None => url.to_string(),
    }
}

fn is_bridge_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("bridge://") else {
        return false;
    };
    let Some((authority, id)) = rest.split_once('/') else {
        return false;
    };
    let Some((host, port)) = authority.rsplit_once(':') else {
        return false;
    };
    let host_ok = !host.is_empty()
        && (host.starts_with('[') && host.ends_with(']')
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'));
    let port_ok = port.parse::<u16>().is_ok_and(|p| p > 0);
    let id_ok = !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    host_ok && port_ok && id_ok
}

/// The device of a node's FenceTarget that a step planned through `url` acts through now
/// ([`FenceTargetSpec::acting_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acting<'a> {
    /// The FenceTarget still lists the planned device.
    Listed(&'a FenceDevice),
    /// The planned direct BMC is no longer listed (a person edited its address): the first
    /// direct BMC the FenceTarget lists now stands in for it.
    StandIn(&'a FenceDevice),
}

impl<'a> Acting<'a> {
    /// The device acted through.
    pub fn device(self) -> &'a FenceDevice {
        match self {
            Acting::Listed(d) | Acting::StandIn(d) => d,
        }
    }
}

impl FenceTargetSpec {
    /// The device a fence step planned through the device at `url` (of kind `kind`) acts
    /// through now: the device listed at `url`; or, when `url` names a direct BMC (IPMI or
    /// Redfish) that the FenceTarget no longer lists, the first direct BMC it lists now, in
    /// level order. `None`: nothing stands in, the step sends nothing.
    ///
    /// Guarantees: a stand-in is only ever a direct BMC for a direct BMC: a PDU outlet, a
    /// storage firewall or a `bridge://` device no longer listed has none (nothing tells which
    /// outlet, array or bridge target the edit meant).
    ///
    /// Assumptions: the caller acts through a stand-in only pinned to the machine the Node
    /// reports (its `systemUUID`): a BMC is named by the machine it answers as, not by its
    /// address, so a person's correction of an address is followed by the fences planned
    /// before it, and a typo reaches a BMC that is refused by identity with nothing sent.
    pub fn acting_for(&self, url: &str, kind: DeviceKind) -> Option<Acting<'_>> {
        let mut devices = self.levels.iter().flat_map(|l| &l.devices);
        if let Some(d) = devices.clone().find(|d| d.url == url && d.kind == kind) {
            return Some(Acting::Listed(d));
        }
        if !direct_bmc(url, kind) {
            return None;
        }
        devices.find(|d| d.is_direct_bmc()).map(Acting::StandIn)
    }

    /// Reject targets the schema cannot catch. Returns every problem found.
    pub fn validate(&self) -> Result<(), Vec<TargetError>> {
        let mut errors = Vec::new();
        if self.levels.is_empty() {
            errors.push(TargetError::NoLevels);
        }
        for (level, l) in self.levels.iter().enumerate() {
            if l.devices.is_empty() {
                errors.push(TargetError::EmptyLevel { level });
            }
            if l.power_off == PowerOff::Disallowed {
                if !l.devices.iter().any(|d| d.kind == DeviceKind::Storage) {
                    errors.push(TargetError::NoStorageToReset { level });
                }
                for (device, d) in l.devices.iter().enumerate() {
                    if d.kind == DeviceKind::Power && !d.is_direct_bmc() {
                        errors.push(TargetError::CannotReset { level, device });
                    }
                }
            }
            for (device, d) in l.devices.iter().enumerate() {
                if has_credentials(&d.url) {
                    errors.push(TargetError::CredentialsInUrl {
                        level,
                        device,
                        url: redact_url(&d.url),
                    });
                    continue;
                }
                let Some(scheme) = DeviceScheme::of(&d.url) else {
                    errors.push(TargetError::UnknownScheme {
                        level,
                        device,
                        url: redact_url(&d.url),
                    });
                    continue;
                };
                if scheme.implied_kind().is_some_and(|k| k != d.kind) {
                    errors.push(TargetError::KindMismatch {
                        level,
                        device,
                        kind: d.kind,
                    });
                }
                if scheme == DeviceScheme::Bridge && !is_bridge_url(&d.url) {
                    errors.push(TargetError::BridgeUrl {
                        level,
                        device,
                        url: redact_url(&d.url),
                    });
                }
                match (scheme, &d.credentials_secret_ref) {
                    (DeviceScheme::Bridge, Some(_)) => errors.push(TargetError::Credentials {
                        level,
                        device,
                        problem: "bridge:// devices take no credentials (the bridge holds them)",
                    }),
                    (DeviceScheme::Bridge, None) | (_, Some(_)) => {}
                    (_, None) => errors.push(TargetError::Credentials {
                        level,
                        device,
                        problem: "direct devices need credentialsSecretRef",
                    }),
                }
                match (d.kind, &d.fences) {
                    (DeviceKind::Storage, Some(f)) if !f.is_empty() => {}
                    (DeviceKind::Storage, _) => errors.push(TargetError::StorageScope {
                        level,
                        device,
                        problem: "a Storage device must name what it fences (fences.storageClasses or fences.csiDrivers): a pod is released on its block only when every claim it mounts is named there",
                    }),
                    (DeviceKind::Power, Some(_)) => errors.push(TargetError::StorageScope {
                        level,
                        device,
                        problem: "fences is for Storage devices: a power device fences the whole machine",
                    }),
                    (DeviceKind::Power, None) => {}
                }
                if !(1..=600).contains(&d.timeout_seconds) {
                    errors.push(TargetError::Timeout {
                        level,
                        device,
                        value: d.timeout_seconds,
                    });
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Option<SecretRef> {
        Some(SecretRef {
            name: "bmc-m0".into(),
            namespace: "palisade-system".into(),
            keys: BTreeMap::new(),
        })
    }

    fn device(url: &str, kind: DeviceKind, creds: Option<SecretRef>) -> FenceDevice {
        FenceDevice {
            url: url.into(),
            kind,
            credentials_secret_ref: creds,
            timeout_seconds: 20,
            fences: (kind == DeviceKind::Storage).then(|| StorageScope {
                storage_classes: vec!["fast".into()],
                csi_drivers: vec![],
            }),
        }
    }

    /// A fence planned before a person edited its node's FenceTarget: a step through a planned
    /// device still listed acts through it; a planned direct BMC no longer listed is stood in
    /// for by the first direct BMC listed now (a re-addressed BMC, pinned to the Node's
    /// machine by the caller); a PDU outlet, a storage firewall or a bridge target no longer
    /// listed has no stand-in, nor has a BMC when no direct BMC is listed.
    #[test]
    fn a_planned_bmc_no_longer_listed_is_stood_in_for_by_a_listed_bmc_and_nothing_else_is() {
        let spec = |devices: Vec<FenceDevice>| FenceTargetSpec {
            levels: devices
                .into_iter()
                .map(|d| FenceLevel {
                    name: "l".into(),
                    devices: vec![d],
                    power_off: PowerOff::Allowed,
                })
                .collect(),
        };
        let pdu = device("snmp+pdu://pdu/outlet/3", DeviceKind::Power, secret());
        let fw = device("storagefw+https://fw:8443", DeviceKind::Storage, secret());
        let moved = device(
            "redfish+https://admin@10.0.0.7?ca=secret",
            DeviceKind::Power,
            secret(),
        );
        let now = spec(vec![pdu.clone(), fw.clone(), moved.clone()]);
        let ipmi = DeviceKind::Power;
        assert_eq!(
            now.acting_for(&pdu.url, ipmi),
            Some(Acting::Listed(&now.levels[0].devices[0]))
        );
        assert_eq!(
            now.acting_for(&moved.url, ipmi),
            Some(Acting::Listed(&now.levels[2].devices[0]))
        );
        // The BMC planned at its old address, of either scheme: the one listed now stands in.
        for old in [
            "ipmi://admin@bmc-old:623",
            "redfish+https://admin@bmc-old?ca=secret",
        ] {
            let acting = now.acting_for(old, ipmi).expect("a stand-in");
            assert_eq!(acting, Acting::StandIn(&now.levels[2].devices[0]));
            assert_eq!(acting.device().url, moved.url);
        }
        // A planned URL listed under another kind is not that device.
        assert_eq!(now.acting_for(&fw.url, DeviceKind::Power), None);
        for (old, kind) in [
            ("snmp+pdu://pdu/outlet/4", DeviceKind::Power),
            ("storagefw+https://fw2:8443", DeviceKind::Storage),
            ("bridge://bridge:9443/m0", DeviceKind::Power),
        ] {
            assert_eq!(now.acting_for(old, kind), None, "{old}");
        }
        let no_bmc = spec(vec![pdu, fw]);
        assert_eq!(no_bmc.acting_for("ipmi://admin@bmc-old:623", ipmi), None);
    }

    #[test]
    fn a_storage_device_names_what_it_fences_and_a_power_device_does_not() {
        let spec = |d: FenceDevice| FenceTargetSpec {
            levels: vec![FenceLevel {
                name: "l".into(),
                devices: vec![d],
                power_off: PowerOff::Allowed,
            }],
        };
        let storage = device("storagefw+https://fw:8443", DeviceKind::Storage, secret());
        assert_eq!(spec(storage.clone()).validate(), Ok(()));
        for fences in [None, Some(StorageScope::default())] {
            let e = spec(FenceDevice {
                fences,
                ..storage.clone()
            })
            .validate()
            .unwrap_err();
            assert!(
                matches!(
                    e[..],
                    [TargetError::StorageScope {
                        level: 0,
                        device: 0,
                        ..
                    }]
                ),
                "{e:?}"
            );
            assert!(
                e[0].to_string().contains("must name what it fences"),
                "{}",
                e[0]
            );
        }
        let power = FenceDevice {
            fences: storage.fences.clone(),
            ..device("ipmi://admin@bmc", DeviceKind::Power, secret())
        };
        let e = spec(power).validate().unwrap_err();
        assert!(matches!(e[..], [TargetError::StorageScope { .. }]), "{e:?}");
    }

    #[test]
    fn a_scope_includes_only_claims_known_to_be_backed_by_what_it_names() {
        let scope = StorageScope {
            storage_classes: vec!["".into(), "fast".into()],
            csi_drivers: vec!["csi.array.example".into()],
        };
        let claim = |class: &str, driver: Option<&str>| ClaimBacking::Known {
            storage_class: class.into(),
            driver: driver.map(String::from),
            volume: None,
        };
        assert!(scope.includes(&claim("fast", None)));
        // A claim without a class is named by its driver, never by an empty class name.
        assert!(!scope.includes(&claim("", None)));
        assert!(scope.includes(&claim("", Some("csi.array.example"))));
        assert!(scope.includes(&claim("slow", Some("csi.array.example"))));
        assert!(!scope.includes(&claim("slow", None)));
        assert!(!scope.includes(&claim("slow", Some("nfs.csi.k8s.io"))));
        assert!(!scope.includes(&ClaimBacking::Unknown));
        assert!(!StorageScope::default().includes(&claim("fast", None)));
        let u = scope.union(&StorageScope {
            storage_classes: vec!["fast".into(), "gold".into()],
            csi_drivers: vec![],
        });
        assert_eq!(u.storage_classes, vec!["", "fast", "gold"]);
        assert_eq!(u.csi_drivers, vec!["csi.array.example"]);
    }

    #[test]
    fn scheme_table() {
        let cases = [
            ("ipmi://127.0.0.1:6230", Some(DeviceScheme::Ipmi)),
            (
                "snmp+pdu://127.0.0.1:1161/outlets/1",
                Some(DeviceScheme::SnmpPdu),
            ),
            (
                "storagefw+https://127.0.0.1:8443/nodes/m0",
                Some(DeviceScheme::StorageFirewall),
            ),
            ("bridge://m0", Some(DeviceScheme::Bridge)),
            ("bridge://", None),
            (
                "redfish+https://admin@bmc:8443/redfish/v1/Systems/1?fingerprint=ab",
                Some(DeviceScheme::Redfish),
            ),
            ("redfish://bmc", None),
            ("ipmi:/x", None),
            ("ipmi://a b", None),
            ("", None),
        ];
        for (url, want) in cases {
            assert_eq!(DeviceScheme::of(url), want, "{url}");
        }
    }

    #[test]
    fn bridge_urls_name_host_port_and_target() {
        for ok in [
            "bridge://127.0.0.1:9443/m0",
            "bridge://fw-bridge.mgmt:8443/rack1_m0.a",
            "bridge://[::1]:9443/m0",
        ] {
            assert!(is_bridge_url(ok), "{ok}");
        }
        for bad in [
            "bridge://m0",
            "bridge://host/m0",
            "bridge://host:0/m0",
            "bridge://host:70000/m0",
            "bridge://host:9443/",
            "bridge://host:9443/a/b",
            "bridge://:9443/m0",
            "ipmi://host:9443/m0",
        ] {
            assert!(!is_bridge_url(bad), "{bad}");
        }
    }

    #[test]
    fn credentials_in_urls_are_refused_and_never_echoed() {
        let secret_word = "s3cr3t-pw";
        for url in [
            format!("ipmi://admin:{secret_word}@127.0.0.1:623"),
            format!("snmp+pdu://{secret_word}@pdu:161/outlets/1"),
            format!("snmp+pdu://{secret_word}@pdu:161/outlets/1?version=2c"),
            format!("storagefw+https://{secret_word}@fw:8443/nodes/m0"),
            format!("bridge://x:{secret_word}@h:9443/m0"),
            format!("ftp://u:{secret_word}@host/x"),
            format!("u:{secret_word}@host"),
        ] {
            assert!(redact_url(&url).contains("REDACTED"), "{url}");
            assert!(!redact_url(&url).contains(secret_word), "{url}");
            let spec = FenceTargetSpec {
                levels: vec![FenceLevel {
                    name: "a".into(),
                    devices: vec![device(&url, DeviceKind::Power, secret())],
                    power_off: PowerOff::Allowed,
                }],
            };
            let errors = spec.validate().unwrap_err();
            assert!(
                matches!(errors[..], [TargetError::CredentialsInUrl { .. }]),
                "{url}: {errors:?}"
            );
            let shown: String = errors.iter().map(|e| format!("{e} {e:?}")).collect();
            assert!(!shown.contains(secret_word), "{shown}");
        }
        // A user name where the agent takes one is not a credential.
        for ok in [
            "ipmi://admin@127.0.0.1:623?cipher=3",
            "snmp+pdu://fencer@pdu:161/outlets/1?version=3",
            "redfish+https://admin@bmc:8443/redfish/v1/Systems/1",
        ] {
            assert!(!has_credentials(ok), "{ok}");
        }
        // An `@` in the path is not userinfo.
        assert!(!has_userinfo("storagefw+https://fw:8443/nodes/a@b"));
        assert_eq!(
            redact_url("storagefw+https://fw:8443/nodes/a@b"),
            "storagefw+https://fw:8443/nodes/a@b"
        );
        assert_eq!(redact_url("ipmi://127.0.0.1:623"), "ipmi://127.0.0.1:623");
    }

    #[test]
    fn well_formed_target_validates_and_defaults_timeout() {
        let spec: FenceTargetSpec = serde_json::from_value(serde_json::json!({
            "levels": [
                {"name": "ipmi", "devices": [{"url": "ipmi://127.0.0.1:6230", "kind": "Power",
                  "credentialsSecretRef": {"name": "bmc", "namespace": "ns", "keys": {"password": "pw"}}}]},
                {"name": "bridge", "devices": [{"url": "bridge://127.0.0.1:9443/m0", "kind": "Storage",
                  "fences": {"storageClasses": ["fast"]}}]}
            ]
        }))
        .unwrap();
        assert_eq!(spec.levels[0].devices[0].timeout_seconds, 20);
        assert_eq!(spec.validate(), Ok(()));
    }

    fn no_power_off(devices: Vec<FenceDevice>) -> FenceTargetSpec {
        FenceTargetSpec {
            levels: vec![FenceLevel {
                name: "storage+reset".into(),
                devices,
                power_off: PowerOff::Disallowed,
            }],
        }
    }

    #[test]
    fn a_level_that_must_not_power_off_needs_storage_and_a_direct_bmc() {
        let storage = || {
            device(
                "storagefw+https://fw:8443/nodes/m0",
                DeviceKind::Storage,
                secret(),
            )
        };
        // Storage plus a direct IPMI or Redfish BMC, or storage alone, or storage via a bridge.
        for ok in [
            vec![
                storage(),
                device("ipmi://bmc:623", DeviceKind::Power, secret()),
            ],
            vec![
                storage(),
                device("redfish+https://bmc/", DeviceKind::Power, secret()),
            ],
            vec![storage()],
            vec![device("bridge://b:8443/m0", DeviceKind::Storage, None)],
        ] {
            assert_eq!(no_power_off(ok.clone()).validate(), Ok(()), "{ok:?}");
        }
        // No storage device: a reset proves nothing.
        let errors = no_power_off(vec![device("ipmi://bmc", DeviceKind::Power, secret())])
            .validate()
            .unwrap_err();
        assert_eq!(errors, vec![TargetError::NoStorageToReset { level: 0 }]);
        assert!(errors[0].to_string().contains("no Storage device"));
        // A PDU outlet can only cut the power; a bridge's reset is not driven.
        let errors = no_power_off(vec![
            storage(),
            device("snmp+pdu://pdu/outlets/1", DeviceKind::Power, secret()),
            device("bridge://b:8443/m0", DeviceKind::Power, None),
        ])
        .validate()
        .unwrap_err();
        assert_eq!(
            errors,
            vec![
                TargetError::CannotReset {
                    level: 0,
                    device: 1
                },
                TargetError::CannotReset {
                    level: 0,
                    device: 2
                },
            ]
        );
        // The field round-trips, and `Allowed` is the default that is not written.
        let json = serde_json::to_value(no_power_off(vec![storage()])).unwrap();
        assert_eq!(json["levels"][0]["powerOff"], "Disallowed");
        let back: FenceTargetSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back.levels[0].power_off, PowerOff::Disallowed);
        let mut allowed = no_power_off(vec![storage()]);
        allowed.levels[0].power_off = PowerOff::Allowed;
        let json = serde_json::to_value(&allowed).unwrap();
        assert!(json["levels"][0].get("powerOff").is_none());
    }

    #[test]
    fn malformed_targets_are_rejected_with_positions() {
        let spec = FenceTargetSpec {
            levels: vec![
                FenceLevel {
                    name: "a".into(),
                    devices: vec![
                        device("ipmi://bmc", DeviceKind::Storage, secret()),
                        device("bridge://x:1/m0", DeviceKind::Power, secret()),
                        device("snmp+pdu://pdu/1", DeviceKind::Power, None),
                        device("ftp://x", DeviceKind::Power, secret()),
                        device("bridge://m0", DeviceKind::Power, None),
                    ],
                    power_off: PowerOff::Allowed,
                },
                FenceLevel {
                    name: "b".into(),
                    devices: vec![],
                    power_off: PowerOff::Allowed,
                },
            ],
        };
        let errors = spec.validate().unwrap_err();
        assert_eq!(
            errors,
            vec![
                TargetError::KindMismatch {
                    level: 0,
                    device: 0,
                    kind: DeviceKind::Storage
                },
                TargetError::Credentials {
                    level: 0,
                    device: 1,
                    problem: "bridge:// devices take no credentials (the bridge holds them)"
                },
                TargetError::Credentials {
                    level: 0,
                    device: 2,
                    problem: "direct devices need credentialsSecretRef"
                },
                TargetError::UnknownScheme {
                    level: 0,
                    device: 3,
                    url: "ftp://x".into()
                },
                TargetError::BridgeUrl {
                    level: 0,
                    device: 4,
                    url: "bridge://m0".into()
                },
                TargetError::EmptyLevel { level: 1 },
            ]
        );
        assert_eq!(
            FenceTargetSpec { levels: vec![] }.validate(),
            Err(vec![TargetError::NoLevels])
        );
    }
}
