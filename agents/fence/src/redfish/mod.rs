//! The Redfish backend: [`RedfishDevice`] fences a ComputerSystem through its BMC's Redfish
//! service over HTTPS (`redfish+https://`, see [`crate::target`]).
//!
//! One file per step of an operation:
//! - `tls`: rustls trusting exactly the pinned CA or certificate fingerprint (no default trust;
//!   `ssl_insecure` only when asked for, and logged as a warning on every operation);
//! - `transport`: bounded HTTPS exchanges (time, body size, same-origin redirects) and the
//!   mapping of HTTP answers to [`FenceError`], with the Redfish error message;
//! - `session`: the service root, a `SessionService` session (`X-Auth-Token`) or HTTP Basic,
//!   and logout on every path;
//! - `discovery`: choosing the ComputerSystem (by `systems_uri`, by `Id`/`Name`/`UUID`, or the
//!   only one; several and none named is refused) and checking a pinned UUID;
//! - `reset`: `ComputerSystem.Reset` with a `ResetType` the system allows;
//! - `task`: following a 202 task monitor;
//! - `power_state`: the `PowerState` read that verification polls.
//!
//! An off is: open a session, find the system, take the command timestamp, POST `ForceOff`
//! (follow its task), then poll `PowerState` through `verify::verify_off` until it reads `Off`
//! within [`crate::verify::VerifyPolicy::timeout`], then log out. A BMC that answers the POST
//! with an error is only forgiven when the system then reads as already in the wanted state
//! (repeating an off is a success); one that says OK and stays on gets
//! [`FenceError::NotVerified`].
//!
//! Timing: each HTTP request is bounded by `exchange_timeout × (retries + 1)`, but never less
//! than [`MIN_REQUEST_TIMEOUT`] (a BMC's web server is slow to handshake) and never more than
//! `power_timeout`, which also bounds the retries of a read; status polls are at
//! least [`MIN_POLL_INTERVAL`] apart, whatever the verify policy says, so as not to hammer the
//! BMC.

pub mod discovery;
pub(crate) mod power_state;
pub mod reset;
pub(crate) mod session;
pub(crate) mod task;
pub mod tls;
pub(crate) mod transport;

use std::time::Duration;

use async_trait::async_trait;

use self::discovery::SystemInfo;
use self::power_state::{parse_power_state, PowerProbe};
use self::reset::{ResetError, ResetType};
use self::session::Session;
use self::transport::Http;
use crate::device::{Credentials, DeviceOptions, PowerDevice};
use crate::error::FenceError;
use crate::power::{PowerState, ResetSent};
use crate::secret::Secret;
use crate::target::{RedfishTarget, RedfishTls};
use crate::verify::{self, Commanded, VerifiedOff, VerifiedOn, VerifyPolicy};

/// The least time one HTTP request to a BMC is given.
pub const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The least pause between two `PowerState` reads while verifying.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// A ComputerSystem behind a Redfish service.
pub struct RedfishDevice {
    target: RedfishTarget,
    name: String,
    http: Http,
    password: Secret,
    options: DeviceOptions,
}

impl std::fmt::Debug for RedfishDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishDevice")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Renders an error and all its sources (TLS alerts sit deep in the chain).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    crate::bridge::chain(e)
}

impl RedfishDevice {
    /// Creates the device; nothing is sent until an operation runs.
    pub fn new(
        target: RedfishTarget,
        credentials: &Credentials,
        options: DeviceOptions,
    ) -> Result<Self, FenceError> {
        let mut name = format!(
            "redfish+https://{}@{}:{}{}",
            target.username,
            target.host,
            target.port,
            target.systems_uri.as_deref().unwrap_or("")
        );
        if let Some(s) = &target.system {
            name.push_str(&format!("?system={s}"));
        } else if let Some(u) = &target.system_uuid {
            name.push_str(&format!("?uuid={u}"));
        }
        let password = credentials
            .password
            .clone()
            .ok_or_else(|| FenceError::Config(format!("{name}: no password given")))?;
        // power_timeout bounds every request and the retries of each read, so a hung BMC
        // fails in the time the operator gave, not in (retries + 1) x MIN_REQUEST_TIMEOUT.
        let budget = options.verify.timeout.max(Duration::from_millis(1));
        let request_timeout = options
            .exchange_timeout
            .saturating_mul(options.retries.saturating_add(1))
            .max(MIN_REQUEST_TIMEOUT)
            .min(budget);
        let http = Http::new(
            &name,
            &target.host,
            target.port,
            &target.tls,
            request_timeout,
            options.retries,
            budget,
        )?;
        if target.tls == RedfishTls::Insecure {
            tracing::warn!(device = %name, "ssl_insecure: this BMC's TLS certificate will NOT be verified");
        }
        Ok(Self {
            target,
            name,
            http,
            password,
            options,
        })
    }

    /// Opens a session and finds the system; the session is closed again on error.
    async fn open(&self) -> Result<(Session, SystemInfo), FenceError> {
        let s = Session::open(
            &self.http,
            &self.target.username,
            &self.password,
            self.target.auth,
        )
        .await?;
        match discovery::discover(&self.http, &s, &self.target).await {
            Ok(sys) => Ok((s, sys)),
            Err(e) => {
                s.close().await;
                Err(e)
            }
        }
    }

    /// The URI of the system this device acts on (discovered; the session is closed again).
    pub async fn system_uri(&self) -> Result<String, FenceError> {
        let (s, sys) = self.open().await?;
        s.close().await;
        Ok(sys.uri)
    }

    /// The `UUID` the system reports, if any (for identity checks and readiness reports).
    pub async fn system_uuid(&self) -> Result<Option<String>, FenceError> {
        let (s, sys) = self.open().await?;
        s.close().await;
        Ok(sys.uuid)
    }

    /// Sends one `ComputerSystem.Reset` (the first of `preferences` the system allows) and
    /// waits for the BMC to accept it, without verifying any power state: for a policy that
    /// reboots with `PowerCycle` or `ForceRestart`. Returns what was sent.
    pub async fn reset(&self, preferences: &[ResetType]) -> Result<ResetType, FenceError> {
        let (s, sys) = self.open().await?;
        let deadline = tokio::time::Instant::now() + self.options.verify.timeout;
        let r = reset::reset(&self.http, &s, &sys, preferences, deadline).await;
        s.close().await;
        Ok(r?)
    }

    fn policy(&self) -> VerifyPolicy {
        VerifyPolicy {
            timeout: self.options.verify.timeout,
            interval: self.options.verify.interval.max(MIN_POLL_INTERVAL),
        }
    }

    /// Commands `preferences` and polls until the system reads `want`.
    async fn command_and_verify(
        &self,
        session: &Session,
        system: &SystemInfo,
        preferences: &[ResetType],
        want: PowerState,
    ) -> Result<Evidence, FenceError> {
        let policy = self.policy();
        let commanded = Commanded::now();
        let deadline = tokio::time::Instant::now() + policy.timeout;
        let mut refusal = None;
        match reset::reset(&self.http, session, system, preferences, deadline).await {
            Ok(_) => {}
            Err(ResetError::NotSent(e)) => return Err(e),
            Err(ResetError::Refused(e)) => {
                // Some BMCs refuse ForceOff on a system that is off (409). That is a success
                // only if the system now reads as off: verification below decides, and a
                // system that is not already there gets the BMC's refusal.
                let now = power_state::read_power_state(&self.http, session, &system.uri).await;
                if now.as_ref().ok() != Some(&want) {
                    return Err(e);
                }
                tracing::info!(device = %self.name, error = %e, "reset refused, but the system already reads {want}");
                refusal = Some(e.to_string());
            }
        }
        let mut probe = PowerProbe {
            http: &self.http,
            session,
            uri: &system.uri,
        };
        if want == PowerState::Off {
            verify::verify_off(&self.name, commanded, &mut probe, policy)
                .await
                .map(|v| {
                    Evidence::Off(match refusal {
                        Some(r) => v.refused(r),
                        None => v,
                    })
                })
        } else {
            verify::verify_on(&self.name, commanded, &mut probe, policy)
                .await
                .map(Evidence::On)
        }
    }

    async fn act(
        &self,
        preferences: &[ResetType],
        want: PowerState,
    ) -> Result<Evidence, FenceError> {
        let (s, sys) = self.open().await?;
        if s.is_token() {
            tracing::debug!(device = %self.name, system = %sys.uri, "acting in a redfish session");
        }
        let r = self.command_and_verify(&s, &sys, preferences, want).await;
        s.close().await;
        r
    }
}

enum Evidence {
    Off(VerifiedOff),
    On(VerifiedOn),
}

#[async_trait]
impl PowerDevice for RedfishDevice {
    fn name(&self) -> &str {
        &self.name
    }

    async fn status(&self) -> Result<PowerState, FenceError> {
        let (s, sys) = self.open().await?;
        s.close().await;
        match sys.power_state.as_deref() {
            Some(p) => Ok(parse_power_state(p)),
            None => Err(FenceError::Protocol {
                device: self.name.clone(),
                detail: format!("{} reports no PowerState", sys.uri),
            }),
        }
    }

    async fn off(&self) -> Result<VerifiedOff, FenceError> {
        match self.act(&[ResetType::ForceOff], PowerState::Off).await? {
            Evidence::Off(e) => Ok(e),
            Evidence::On(_) => Err(FenceError::Protocol {
                device: self.name.clone(),
                detail: "internal: on evidence for off".into(),
            }),
        }
    }

    async fn on(&self) -> Result<VerifiedOn, FenceError> {
        match self
            .act(&[ResetType::On, ResetType::ForceOn], PowerState::On)
            .await?
        {
            Evidence::On(e) => Ok(e),
            Evidence::Off(_) => Err(FenceError::Protocol {
                device: self.name.clone(),
                detail: "internal: off evidence for on".into(),
            }),
        }
    }

    /// `ComputerSystem.Reset` with `ForceRestart` only (never `PowerCycle`, which turns the
    /// power off), when the system allows it.
    async fn warm_reset(&self) -> Result<ResetSent, FenceError> {
        let sent = self.reset(&[ResetType::ForceRestart]).await?;
        Ok(ResetSent {
            device: self.name.clone(),
            command: format!("ComputerSystem.Reset {}", sent.as_str()),
        })
    }

    /// The systems of the BMC, as (`Id`, `Name` or else `UUID`): what `plug` may name.
    async fn list(&self) -> Result<Vec<(String, String)>, FenceError> {
        let s = Session::open(
            &self.http,
            &self.target.username,
            &self.password,
            self.target.auth,
        )
        .await?;
        let r = discovery::list_systems(&self.http, &s).await;
        s.close().await;
        Ok(r?
            .into_iter()
            .map(|sys| {
                let id = sys.id.clone().unwrap_or_else(|| sys.uri.clone());
                let label = sys.name.or(sys.uuid).unwrap_or_default();
                (id, label)
            })
            .collect())
    }

    async fn monitor(&self) -> Result<(), FenceError> {
        // Reachable, the certificate is the pinned one, the credentials work, and the system
        // exists (and has the pinned UUID).
        let (s, _) = self.open().await?;
        s.close().await;
        Ok(())
    }
}
