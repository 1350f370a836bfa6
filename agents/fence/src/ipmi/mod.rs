//! The IPMI 2.0 RMCP+ backend: [`IpmiDevice`] drives a BMC over async UDP using the sans-IO
//! `palisade-ipmi` crate.
//!
//! - `transport`: UDP exchanges with per-exchange timeout and bounded retransmission;
//! - `session`: negotiation, Open Session + RAKP, commands, Close Session (always).
//!
//! Every session starts, as ipmitool's do, with Get Channel Authentication Capabilities in
//! IPMI v1.5 framing (`session::hello`): it checks the BMC speaks RMCP+, clears a stale
//! session of our address and port on pyghmi-based BMCs, and measures the round trip.
//!
//! Cipher negotiation: ask Get Channel Cipher Suites (`ipmi_sim` never answers) for at least
//! `cipher_probe_timeout` and up to four measured round trips (at most the exchange timeout),
//! prefer 17, accept 3, and refuse 0/1/2 (and the other suites without integrity or
//! confidentiality) unless `allow_weak_cipher_suites` is set. When the BMC does not list its
//! suites, try 17 then 3 (then weak ones only if allowed); a BMC rejects an unsupported suite
//! at Open Session at once, so the fallback costs one round trip. A BMC that accepts Open
//! Session with another suite's algorithms instead of refusing (pyghmi answers with suite 3)
//! is followed only to a suite we would have tried ourselves and only when no suite is
//! configured; anything else is refused with a message that says so. The result is cached
//! per device.

pub(crate) mod session;
pub(crate) mod transport;

use std::time::Duration;

use async_trait::async_trait;
use palisade_ipmi::chassis_control::ChassisControl;
use palisade_ipmi::cipher_suite::PREFERRED;
use palisade_ipmi::get_chassis_status::{ChassisStatus, GetChassisStatus};
use palisade_ipmi::get_system_guid::GetSystemGuid;
use palisade_ipmi::set_session_privilege_level::SetSessionPrivilegeLevel;
use palisade_ipmi::{CipherSuite, Privilege};
use parking_lot::Mutex;

use self::session::{hello, list_cipher_suites, probe_timeout, OpenError, Session, SessionParams};
use self::transport::Transport;
use crate::device::{Credentials, DeviceOptions, PowerDevice};
use crate::error::FenceError;
use crate::power::{PowerState, ResetSent};
use crate::target::IpmiTarget;
use crate::verify::{self, Commanded, StatusProbe, VerifiedOff, VerifiedOn};

/// Weak suites in the order we would try them when explicitly allowed (strongest first).
const WEAK_ORDER: [u8; 5] = [16, 2, 15, 1, 0];

/// A BMC.
pub struct IpmiDevice {
    target: IpmiTarget,
    name: String,
    params: SessionParams,
    options: DeviceOptions,
    negotiated: Mutex<Option<u8>>,
}

impl std::fmt::Debug for IpmiDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpmiDevice")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl IpmiDevice {
    /// Creates the device; nothing is sent until an operation runs.
    pub fn new(
        target: IpmiTarget,
        credentials: &Credentials,
        options: DeviceOptions,
    ) -> Result<Self, FenceError> {
        let name = format!("ipmi://{}@{}:{}", target.username, target.host, target.port);
        let password = credentials
            .password
            .clone()
            .ok_or_else(|| FenceError::Config(format!("{name}: no password given")))?;
        if let Some(id) = target.cipher {
            let suite = CipherSuite::from_id(id)
                .ok_or_else(|| FenceError::Config(format!("{name}: unknown cipher suite {id}")))?;
            if suite.is_weak() && !target.allow_weak_cipher_suites {
                return Err(FenceError::Config(format!(
                    "{name}: cipher suite {id} is weak; set allow_weak_cipher_suites to use it"
                )));
            }
        }
        Ok(Self {
            params: SessionParams {
                username: target.username.clone(),
                password,
                exchange_timeout: options.exchange_timeout,
                attempts: options.retries + 1,
            },
            negotiated: Mutex::new(target.cipher),
            target,
            name,
            options,
        })
    }

    /// The cipher suite negotiated so far (or configured).
    pub fn negotiated_suite(&self) -> Option<u8> {
        *self.negotiated.lock()
    }

    fn acceptable(&self, id: u8) -> bool {
        CipherSuite::from_id(id)
            .is_some_and(|s| !s.is_weak() || self.target.allow_weak_cipher_suites)
    }

    /// The suites we try, in order of preference: 17, 3, then the weak ones when allowed.
    fn order(&self) -> Vec<u8> {
        let mut order: Vec<u8> = PREFERRED.to_vec();
        if self.target.allow_weak_cipher_suites {
            order.extend_from_slice(&WEAK_ORDER);
        }
        order
    }

    /// Whether a BMC that answers Open Session with `suite`'s algorithms may be followed:
    /// only when no suite is configured, and only to a suite we would try ourselves.
    fn may_substitute(&self, suite: CipherSuite) -> bool {
        self.target.cipher.is_none()
            && self.order().contains(&suite.id)
            && self.acceptable(suite.id)
    }

    /// Opens a session, negotiating the suite the first time.
    async fn open(&self, privilege: Privilege) -> Result<Session, FenceError> {
        let t = Transport::connect(&self.target.host, self.target.port, &self.name).await?;
        let rtt = hello(
            &t,
            privilege,
            self.params.exchange_timeout,
            self.params.attempts,
        )
        .await?;
        let candidates: Vec<u8> = match self.negotiated_suite() {
            Some(id) => vec![id],
            None => {
                let wait = probe_timeout(
                    self.options.cipher_probe_timeout,
                    rtt,
                    self.params.exchange_timeout,
                );
                let offered = list_cipher_suites(&t, wait).await?;
                let order = self.order();
                match offered {
                    Some(offered) => {
                        let c: Vec<u8> = order
                            .into_iter()
                            .filter(|id| offered.contains(id) && self.acceptable(*id))
                            .collect();
                        if c.is_empty() {
                            return Err(FenceError::NoAcceptableCipherSuite {
                                device: self.name.clone(),
                                offered,
                            });
                        }
                        c
                    }
                    None => order,
                }
            }
        };
        let mut rejected = Vec::new();
        for id in candidates {
            let suite = CipherSuite::from_id(id).expect("candidates are known suites");
            match Session::open(&t, suite, &self.params, &|s| self.may_substitute(s)).await {
                Ok(mut s) => {
                    *self.negotiated.lock() = Some(s.suite());
                    if privilege > Privilege::User {
                        let r = s
                            .command_ok(
                                &SetSessionPrivilegeLevel(privilege),
                                "Set Session Privilege Level",
                            )
                            .await;
                        if let Err(e) = r {
                            s.close().await;
                            return Err(e);
                        }
                    }
                    return Ok(s);
                }
                Err(OpenError::SuiteRejected) => rejected.push(id),
                Err(OpenError::SuiteSubstituted { answered }) => {
                    return Err(self.substitution_refused(id, answered))
                }
                Err(OpenError::Fatal(e)) => return Err(e),
            }
        }
        Err(FenceError::NoAcceptableCipherSuite {
            device: self.name.clone(),
            offered: rejected,
        })
    }

    /// The error for a BMC that answered a proposal of suite `proposed` with the algorithms
    /// of `answered` instead of refusing, when we may not follow it: says which and why.
    fn substitution_refused(&self, proposed: u8, answered: Option<u8>) -> FenceError {
        let why = match (answered, self.target.cipher) {
            (None, _) => "its algorithms form no known suite".to_string(),
            (Some(a), Some(c)) => format!("suite {a} is not the configured cipher={c}"),
            (Some(a), None) if !self.acceptable(a) => format!(
                "suite {a} is weak (no integrity or confidentiality); set allow_weak_cipher_suites to use it"
            ),
            (Some(a), None) => format!("suite {a} is not one Palisade negotiates"),
        };
        let answered = answered.map_or("an unknown suite".to_string(), |a| format!("suite {a}"));
        FenceError::DeviceRefused {
            device: self.name.clone(),
            detail: format!(
                "Open Session: proposed cipher suite {proposed}, the BMC answered with the algorithms of {answered} instead of refusing; not used: {why}"
            ),
        }
    }

    /// When the target pins a system GUID: reads it in session `s` and refuses on a mismatch.
    ///
    /// Guarantees: with a pin, nothing is commanded or reported through a BMC that does not
    /// answer Get System GUID with the pinned GUID (in either byte order).
    async fn check_identity(&self, s: &mut Session) -> Result<(), FenceError> {
        let Some(pinned) = &self.target.system_guid else {
            return Ok(());
        };
        let found = s.command_ok(&GetSystemGuid, "Get System GUID").await?;
        if found.matches(pinned) {
            Ok(())
        } else {
            Err(FenceError::IdentityMismatch {
                device: self.name.clone(),
                expected: pinned.clone(),
                found: found.wire_order(),
            })
        }
    }

    /// Reads the chassis status in a fresh session (after the identity check, when pinned).
    pub async fn chassis_status(&self) -> Result<ChassisStatus, FenceError> {
        let mut s = self.open(Privilege::User).await?;
        let r = match self.check_identity(&mut s).await {
            Ok(()) => s.command_ok(&GetChassisStatus, "Get Chassis Status").await,
            Err(e) => Err(e),
        };
        s.close().await;
        r
    }

    /// Sends one Chassis Control command (no verification) in a fresh session, after the
    /// identity check when pinned.
    pub async fn chassis_control(&self, action: ChassisControl) -> Result<(), FenceError> {
        let mut s = self.open(Privilege::Administrator).await?;
        let r = match self.check_identity(&mut s).await {
            Ok(()) => s.command_ok(&action, "Chassis Control").await,
            Err(e) => Err(e),
        };
        s.close().await;
        r
    }

    async fn control_and_verify(
        &self,
        action: ChassisControl,
        want: PowerState,
    ) -> Result<Evidence, FenceError> {
        let mut s = self.open(Privilege::Administrator).await?;
        if let Err(e) = self.check_identity(&mut s).await {
            s.close().await;
            return Err(e);
        }
        let commanded = Commanded::now();
        if let Err(e) = s.command_ok(&action, "Chassis Control").await {
            s.close().await;
            return Err(e);
        }
        let mut probe = SessionProbe(&mut s);
        let r = if want == PowerState::Off {
            verify::verify_off(&self.name, commanded, &mut probe, self.options.verify)
                .await
                .map(Evidence::Off)
        } else {
            verify::verify_on(&self.name, commanded, &mut probe, self.options.verify)
                .await
                .map(Evidence::On)
        };
        s.close().await;
        r
    }
}

enum Evidence {
    Off(VerifiedOff),
    On(VerifiedOn),
}

struct SessionProbe<'a>(&'a mut Session);

#[async_trait]
impl StatusProbe for SessionProbe<'_> {
    async fn probe(&mut self) -> Result<PowerState, FenceError> {
        let st = self
            .0
            .command_ok(&GetChassisStatus, "Get Chassis Status")
            .await?;
        Ok(if st.power_on {
            PowerState::On
        } else {
            PowerState::Off
        })
    }
}

#[async_trait]
impl PowerDevice for IpmiDevice {
    fn name(&self) -> &str {
        &self.name
    }

    async fn status(&self) -> Result<PowerState, FenceError> {
        let st = self.chassis_status().await?;
        Ok(if st.power_on {
            PowerState::On
        } else {
            PowerState::Off
        })
    }

    async fn off(&self) -> Result<VerifiedOff, FenceError> {
        match self
            .control_and_verify(ChassisControl::PowerDown, PowerState::Off)
            .await?
        {
            Evidence::Off(e) => Ok(e),
            Evidence::On(_) => unreachable_evidence(&self.name),
        }
    }

    async fn on(&self) -> Result<VerifiedOn, FenceError> {
        match self
            .control_and_verify(ChassisControl::PowerUp, PowerState::On)
            .await?
        {
            Evidence::On(e) => Ok(e),
            Evidence::Off(_) => Err(FenceError::Protocol {
                device: self.name.clone(),
                detail: "internal: off evidence for on".into(),
            }),
        }
    }

    /// Chassis Control `hard reset`, in one session with a status read first: a chassis that
    /// reports off is not reset (a reset would not start it, and the command's meaning on an
    /// off chassis varies between BMCs).
    async fn warm_reset(&self) -> Result<ResetSent, FenceError> {
        let mut s = self.open(Privilege::Administrator).await?;
        let r = async {
            self.check_identity(&mut s).await?;
            let st = s
                .command_ok(&GetChassisStatus, "Get Chassis Status")
                .await?;
            if !st.power_on {
                return Err(FenceError::DeviceRefused {
                    device: self.name.clone(),
                    detail:
                        "the chassis reports power off: a hard reset would not start it; not sent"
                            .into(),
                });
            }
            s.command_ok(&ChassisControl::HardReset, "Chassis Control")
                .await?;
            Ok(ResetSent {
                device: self.name.clone(),
                command: "chassis hard reset".into(),
            })
        }
        .await;
        s.close().await;
        r
    }

    async fn monitor(&self) -> Result<(), FenceError> {
        // Reachable, credentials good and the account may raise itself to Administrator.
        let s = self.open(Privilege::Administrator).await?;
        s.close().await;
        Ok(())
    }
}

fn unreachable_evidence(name: &str) -> Result<VerifiedOff, FenceError> {
    Err(FenceError::Protocol {
        device: name.to_string(),
        detail: "internal: on evidence for off".into(),
    })
}

/// Default least wait for the Get Channel Cipher Suites probe (`cipher_probe_timeout`); the
/// wait grows to four measured round trips, up to the exchange timeout.
pub const CIPHER_PROBE_TIMEOUT: Duration = Duration::from_millis(100);
