//! The switched-PDU backend: outlets switched and read back over SNMP v1/v2c/v3 with `snmp2`
//! (async, v3 authPriv SHA + AES). `snmp2` has no timeout or retry of its own: every request
//! here runs under a timeout and is retried a bounded number of times on a fresh socket (so
//! a late reply cannot be mistaken for the next one). v3 sessions run engine discovery
//! (`init`) first and repeat a request once on `AuthUpdated`.

pub mod profile;

use std::time::Duration;

use async_trait::async_trait;
use snmp2::{AsyncSession, Oid, Value};

use self::profile::Profile;
use crate::device::{Credentials, DeviceOptions, PowerDevice};
use crate::error::FenceError;
use crate::power::PowerState;
use crate::target::{PduTarget, SnmpAuthProtocol, SnmpSecurityLevel, SnmpVersion};
use crate::verify::{self, Commanded, StatusProbe, VerifiedOff, VerifiedOn};

/// Outlets of a switched PDU feeding one machine.
pub struct PduDevice {
    target: PduTarget,
    /// The profile named in the target; `None`: detected from `sysObjectID` on first use.
    wanted: Option<Profile>,
    /// The profile in use once known (named, or detected).
    resolved: Box<tokio::sync::OnceCell<Profile>>,
    name: String,
    credentials: Credentials,
    options: DeviceOptions,
}

impl std::fmt::Debug for PduDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PduDevice")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

enum Op<'a> {
    Get(&'a [u64]),
    GetNext(&'a [u64]),
    Set(&'a [u64], i64),
}

/// A decoded answer, detached from the session buffer.
enum Answer {
    Int(i64),
    Oid(Vec<u64>),
    Other,
    Next(Vec<u64>, Option<String>),
    Done,
}

impl PduDevice {
    /// Creates the device; nothing is sent until an operation runs.
    pub fn new(
        target: PduTarget,
        credentials: &Credentials,
        options: DeviceOptions,
    ) -> Result<Self, FenceError> {
        let wanted = if target.profile == profile::AUTO {
            None
        } else {
            Some(Profile::by_name(&target.profile)?)
        };
        let outlets: Vec<String> = target.outlets.iter().map(u32::to_string).collect();
        let name = format!(
            "snmp+pdu://{}:{}/outlet/{}",
            target.host,
            target.port,
            outlets.join(",")
        );
        match target.version {
            SnmpVersion::V1 | SnmpVersion::V2c if credentials.community.is_none() => {
                return Err(FenceError::Config(format!("{name}: no community given")))
            }
            SnmpVersion::V3 => {
                if target.v3_user.is_none() {
                    return Err(FenceError::Config(format!("{name}: no SNMPv3 user")));
                }
                if target.v3_level != SnmpSecurityLevel::NoAuthNoPriv
                    && credentials.v3_auth_password.is_none()
                {
                    return Err(FenceError::Config(format!("{name}: no v3 auth passphrase")));
                }
                if target.v3_level == SnmpSecurityLevel::AuthPriv
                    && credentials.v3_priv_password.is_none()
                {
                    return Err(FenceError::Config(format!("{name}: no v3 priv passphrase")));
                }
            }
            _ => {}
        }
        Ok(Self {
            target,
            wanted,
            resolved: Box::default(),
            name,
            credentials: credentials.clone(),
            options,
        })
    }

    /// The outlets this device switches.
    pub fn outlets(&self) -> &[u32] {
        &self.target.outlets
    }

    async fn session(&self) -> Result<AsyncSession, FenceError> {
        let addr = (self.target.host.as_str(), self.target.port);
        let req_id = (rand::random::<u32>() >> 2) as i32;
        let unreachable = |source| FenceError::Unreachable {
            device: self.name.clone(),
            source,
        };
        let community = || {
            self.credentials
                .community
                .as_ref()
                .map(|c| c.expose().as_bytes().to_vec())
                .unwrap_or_default()
        };
        match self.target.version {
            SnmpVersion::V1 => AsyncSession::new_v1(addr, &community(), req_id)
                .await
                .map_err(unreachable),
            SnmpVersion::V2c => AsyncSession::new_v2c(addr, &community(), req_id)
                .await
                .map_err(unreachable),
            SnmpVersion::V3 => {
                use snmp2::v3;
                let user = self.target.v3_user.clone().unwrap_or_default();
                let auth_pw = self
                    .credentials
                    .v3_auth_password
                    .as_ref()
                    .map(|s| s.expose().as_bytes().to_vec())
                    .unwrap_or_default();
                let mut sec = v3::Security::new(user.as_bytes(), &auth_pw).with_auth_protocol(
                    match self.target.v3_auth {
                        SnmpAuthProtocol::Md5 => v3::AuthProtocol::Md5,
                        SnmpAuthProtocol::Sha1 => v3::AuthProtocol::Sha1,
                        SnmpAuthProtocol::Sha256 => v3::AuthProtocol::Sha256,
                    },
                );
                sec = match self.target.v3_level {
                    SnmpSecurityLevel::NoAuthNoPriv => sec.with_auth(v3::Auth::NoAuthNoPriv),
                    SnmpSecurityLevel::AuthNoPriv => sec.with_auth(v3::Auth::AuthNoPriv),
                    SnmpSecurityLevel::AuthPriv => sec.with_auth(v3::Auth::AuthPriv {
                        cipher: v3::Cipher::Aes128,
                        privacy_password: self
                            .credentials
                            .v3_priv_password
                            .as_ref()
                            .map(|s| s.expose().as_bytes().to_vec())
                            .unwrap_or_default(),
                    }),
                };
                let mut s = AsyncSession::new_v3(addr, req_id, sec)
                    .await
                    .map_err(unreachable)?;
                match tokio::time::timeout(self.options.exchange_timeout, s.init()).await {
                    Ok(Ok(())) => Ok(s),
                    Ok(Err(e)) => Err(self.snmp_error("v3 engine discovery", e)),
                    Err(_) => Err(FenceError::Timeout {
                        device: self.name.clone(),
                        operation: "SNMPv3 engine discovery".into(),
                        after: self.options.exchange_timeout,
                    }),
                }
            }
        }
    }

    fn snmp_error(&self, what: &str, e: snmp2::Error) -> FenceError {
        match e {
            snmp2::Error::AuthFailure(kind) => FenceError::AuthRefused {
                device: self.name.clone(),
                detail: format!("{what}: SNMPv3 {kind:?}"),
            },
            snmp2::Error::CommunityMismatch => FenceError::AuthRefused {
                device: self.name.clone(),
                detail: format!("{what}: community mismatch"),
            },
            snmp2::Error::Send | snmp2::Error::Receive => FenceError::Unreachable {
                device: self.name.clone(),
                source: std::io::Error::other(format!("{what}: {e:?}")),
            },
            // An agent that refuses our security level answers with an unencrypted Report
            // (usmStatsUnsupportedSecLevels), which the decoder, expecting our level, cannot
            // read: say what that usually means instead of the decoder's word.
            snmp2::Error::AsnWrongType if self.target.version == SnmpVersion::V3 => {
                FenceError::DeviceRefused {
                    device: self.name.clone(),
                    detail: format!(
                        "{what}: the agent's SNMPv3 answer is not at security level {:?}: it refuses that level for user {:?} (usmStatsUnsupportedSecLevels); check snmp_sec_level / sec_level against the agent's user",
                        self.target.v3_level,
                        self.target.v3_user.as_deref().unwrap_or(""),
                    ),
                }
            }
            other => FenceError::Protocol {
                device: self.name.clone(),
                detail: format!("{what}: {other:?}"),
            },
        }
    }

    /// One request with timeout, bounded retries (fresh session each time) and the v3
    /// `AuthUpdated` repeat.
    async fn request(&self, op: Op<'_>) -> Result<Answer, FenceError> {
        let what = match op {
            Op::Get(_) => "get",
            Op::GetNext(_) => "getnext",
            Op::Set(..) => "set",
        };
        let attempts = self.options.retries + 1;
        let started = tokio::time::Instant::now();
        let mut last_err = None;
        for _ in 0..attempts {
            let mut s = match self.session().await {
                Ok(s) => s,
                Err(e) if e.is_retryable() => {
                    last_err = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            for _auth_retry in 0..2 {
                match tokio::time::timeout(self.options.exchange_timeout, self.once(&mut s, &op))
                    .await
                {
                    Err(_) => {
                        last_err = None;
                        break;
                    }
                    Ok(Err(snmp2::Error::AuthUpdated)) => continue,
                    Ok(Err(e)) => {
                        let e = self.snmp_error(what, e);
                        if e.is_retryable() {
                            last_err = Some(e);
                            break;
                        }
                        return Err(e);
                    }
                    Ok(Ok(Err(e))) => return Err(e),
                    Ok(Ok(Ok(a))) => return Ok(a),
                }
            }
        }
        Err(last_err.unwrap_or(FenceError::Timeout {
            device: self.name.clone(),
            operation: format!("SNMP {what}"),
            after: started.elapsed(),
        }))
    }

    async fn once(
        &self,
        s: &mut AsyncSession,
        op: &Op<'_>,
    ) -> Result<Result<Answer, FenceError>, snmp2::Error> {
        let oid_of = |v: &[u64]| Oid::from(v).map_err(|_| snmp2::Error::ValueOutOfRange);
        let pdu = match op {
            Op::Get(o) => {
                let oid = oid_of(o)?;
                s.get(&oid).await?
            }
            Op::GetNext(o) => {
                let oid = oid_of(o)?;
                s.getnext(&oid).await?
            }
            Op::Set(o, v) => {
                let oid = oid_of(o)?;
                s.set(&[(&oid, Value::Integer(*v))]).await?
            }
        };
        if pdu.error_status != 0 {
            let detail = format!(
                "SNMP error status {} ({})",
                pdu.error_status,
                snmp_status_text(pdu.error_status)
            );
            return Ok(Err(if matches!(pdu.error_status, 6 | 16) {
                FenceError::AuthRefused {
                    device: self.name.clone(),
                    detail,
                }
            } else {
                FenceError::DeviceRefused {
                    device: self.name.clone(),
                    detail,
                }
            }));
        }
        let mut vbs = pdu.varbinds;
        let Some((oid, value)) = vbs.next() else {
            return Ok(Err(FenceError::Protocol {
                device: self.name.clone(),
                detail: "response without varbind".into(),
            }));
        };
        let answer = match (op, value) {
            (Op::GetNext(_), Value::EndOfMibView) => Answer::Done,
            (Op::GetNext(_), v) => {
                let arcs: Vec<u64> = oid.iter().map(|i| i.collect()).unwrap_or_default();
                let text = match v {
                    Value::OctetString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                };
                Answer::Next(arcs, text)
            }
            (_, Value::Integer(n)) => Answer::Int(n),
            (_, Value::ObjectIdentifier(o)) => {
                Answer::Oid(o.iter().map(|i| i.collect()).unwrap_or_default())
            }
            (_, Value::OctetString(_)) => Answer::Other,
            (_, Value::NoSuchObject | Value::NoSuchInstance) => {
                return Ok(Err(FenceError::DeviceRefused {
                    device: self.name.clone(),
                    detail: "no such outlet object".into(),
                }))
            }
            (_, other) => {
                return Ok(Err(FenceError::Protocol {
                    device: self.name.clone(),
                    detail: format!("unexpected value {other:?}"),
                }))
            }
        };
        Ok(Ok(answer))
    }

    /// The profile in use: the one the target names, or the one `sysObjectID` selects (read
    /// once, logged with the rule that chose it).
    pub async fn profile(&self) -> Result<Profile, FenceError> {
        if let Some(p) = self.wanted {
            return Ok(p);
        }
        self.resolved
            .get_or_try_init(|| async {
                let oid = match self.request(Op::Get(profile::SYS_OBJECT_ID)).await? {
                    Answer::Oid(arcs) => arcs,
                    _ => Vec::new(),
                };
                let (p, why) = Profile::detect(&oid);
                let dotted: Vec<String> = oid.iter().map(u64::to_string).collect();
                tracing::info!(device = %self.name, sys_object_id = %dotted.join("."), profile = p.name, "PDU profile detected: {why}");
                Ok(p)
            })
            .await
            .copied()
    }

    /// Reads one outlet.
    pub async fn outlet_state(&self, outlet: u32) -> Result<PowerState, FenceError> {
        let profile = self.profile().await?;
        let oid = Profile::oid(profile.status, outlet);
        match self.request(Op::Get(&oid)).await? {
            Answer::Int(n) if n == profile.state_on => Ok(PowerState::On),
            Answer::Int(n) if n == profile.state_off => Ok(PowerState::Off),
            Answer::Int(_) => Ok(PowerState::Unknown),
            _ => Err(FenceError::Protocol {
                device: self.name.clone(),
                detail: "outlet state is not an INTEGER".into(),
            }),
        }
    }

    /// Sets every outlet to `value`.
    async fn set_all(&self, value: i64) -> Result<(), FenceError> {
        let profile = self.profile().await?;
        for outlet in &self.target.outlets {
            let oid = Profile::oid(profile.control, *outlet);
            self.request(Op::Set(&oid, value)).await?;
        }
        Ok(())
    }

    /// Combined state: On if any outlet is on (the machine may still have power), Off only if
    /// every outlet is off, Unknown otherwise.
    async fn combined_state(&self) -> Result<PowerState, FenceError> {
        let mut states = Vec::new();
        for outlet in &self.target.outlets {
            states.push(self.outlet_state(*outlet).await?);
        }
        Ok(if states.iter().all(|s| *s == PowerState::Off) {
            PowerState::Off
        } else if states.contains(&PowerState::On) {
            PowerState::On
        } else {
            PowerState::Unknown
        })
    }
}

struct PduProbe<'a>(&'a PduDevice, PowerState);

#[async_trait]
impl StatusProbe for PduProbe<'_> {
    async fn probe(&mut self) -> Result<PowerState, FenceError> {
        let st = self.0.combined_state().await?;
        // For "on", every outlet must be on, not just one.
        if self.1 == PowerState::On && st == PowerState::On {
            for outlet in &self.0.target.outlets {
                if self.0.outlet_state(*outlet).await? != PowerState::On {
                    return Ok(PowerState::Unknown);
                }
            }
        }
        Ok(st)
    }
}

#[async_trait]
impl PowerDevice for PduDevice {
    fn name(&self) -> &str {
        &self.name
    }

    async fn status(&self) -> Result<PowerState, FenceError> {
        self.combined_state().await
    }

    async fn off(&self) -> Result<VerifiedOff, FenceError> {
        let commanded = Commanded::now();
        self.set_all(self.profile().await?.cmd_off).await?;
        let mut probe = PduProbe(self, PowerState::Off);
        verify::verify_off(&self.name, commanded, &mut probe, self.options.verify).await
    }

    async fn on(&self) -> Result<VerifiedOn, FenceError> {
        let commanded = Commanded::now();
        self.set_all(self.profile().await?.cmd_on).await?;
        let mut probe = PduProbe(self, PowerState::On);
        verify::verify_on(&self.name, commanded, &mut probe, self.options.verify).await
    }

    async fn monitor(&self) -> Result<(), FenceError> {
        self.outlet_state(self.target.outlets[0]).await.map(|_| ())
    }

    /// The outlets the PDU exposes: a walk of the profile's name column, or of its status
    /// column (named "Outlet N") when the MIB has no names. Only a PDU that answers neither
    /// walk gets the configured outlets back.
    async fn list(&self) -> Result<Vec<(String, String)>, FenceError> {
        let profile = self.profile().await?;
        let (column, named) = match profile.names {
            Some(names) => (names, true),
            None => (profile.status, false),
        };
        let mut out = Vec::new();
        let mut cursor = column.to_vec();
        // Bounded walk of the column.
        for _ in 0..256 {
            match self.request(Op::GetNext(&cursor)).await? {
                Answer::Next(oid, text)
                    if oid.len() == column.len() + 1 && oid.starts_with(column) =>
                {
                    let n = oid[column.len()];
                    let name = match text {
                        Some(t) if named && !t.is_empty() => t,
                        _ => format!("Outlet {n}"),
                    };
                    out.push((n.to_string(), name));
                    cursor = oid;
                }
                _ => break,
            }
        }
        if out.is_empty() {
            return Ok(self
                .target
                .outlets
                .iter()
                .map(|o| (o.to_string(), format!("Outlet {o}")))
                .collect());
        }
        Ok(out)
    }
}

fn snmp_status_text(s: u32) -> &'static str {
    match s {
        1 => "tooBig",
        2 => "noSuchName",
        3 => "badValue",
        4 => "readOnly",
        5 => "genErr",
        6 => "noAccess",
        7 => "wrongType",
        10 => "wrongValue",
        11 => "noCreation",
        12 => "inconsistentValue",
        16 => "authorizationError",
        17 => "notWritable",
        _ => "other",
    }
}

/// Default SNMP exchange timeout used by the CLI.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    fn device(version: SnmpVersion) -> PduDevice {
        let target = PduTarget {
            host: "127.0.0.1".into(),
            port: 161,
            outlets: vec![1],
            profile: "apc".into(),
            version,
            v3_user: Some("fencer".into()),
            v3_auth: SnmpAuthProtocol::Sha1,
            v3_level: SnmpSecurityLevel::AuthPriv,
        };
        let creds = Credentials {
            community: Some(crate::Secret::new("c")),
            v3_auth_password: Some(crate::Secret::new("a-long-passphrase")),
            v3_priv_password: Some(crate::Secret::new("a-long-passphrase")),
            ..Default::default()
        };
        PduDevice::new(target, &creds, DeviceOptions::default()).unwrap()
    }

    #[test]
    fn an_snmpv3_security_level_refusal_is_named_as_such() {
        let e = device(SnmpVersion::V3).snmp_error("get", snmp2::Error::AsnWrongType);
        assert_eq!(e.kind(), "device_refused", "{e}");
        let m = e.to_string();
        assert!(m.contains("refuses that level for user \"fencer\""), "{m}");
        assert!(m.contains("AuthPriv"), "{m}");
        assert!(!m.contains("AsnWrongType"), "{m}");
        // In v2c the decoder's word stays: no security level is involved.
        let e = device(SnmpVersion::V2c).snmp_error("get", snmp2::Error::AsnWrongType);
        assert_eq!(e.kind(), "protocol", "{e}");
    }
}
