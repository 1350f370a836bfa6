//! The [`PowerDevice`] trait and [`Device`], the enum that dispatches over the backends.

use std::time::Duration;

use async_trait::async_trait;

use crate::bridge::{BridgeDevice, BridgeIdentity};
use crate::error::FenceError;
use crate::ipmi::IpmiDevice;
use crate::pdu::PduDevice;
use crate::power::{PowerState, ResetSent};
use crate::redfish::RedfishDevice;
use crate::secret::Secret;
use crate::target::Target;
use crate::verify::{VerifiedOff, VerifiedOn, VerifyPolicy};

/// Credentials, kept apart from the target URL.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// IPMI or Redfish password.
    pub password: Option<Secret>,
    /// SNMP v1/v2c community.
    pub community: Option<Secret>,
    /// SNMPv3 authentication passphrase.
    pub v3_auth_password: Option<Secret>,
    /// SNMPv3 privacy passphrase.
    pub v3_priv_password: Option<Secret>,
}

/// Timeouts and retry bounds of a device.
#[derive(Debug, Clone, Copy)]
pub struct DeviceOptions {
    /// Wait for one answer before retransmitting.
    pub exchange_timeout: Duration,
    /// Retransmissions after the first send.
    pub retries: u32,
    /// How long to wait for Get Channel Cipher Suites (IPMI) before falling back.
    pub cipher_probe_timeout: Duration,
    /// How to verify a power change.
    pub verify: VerifyPolicy,
    /// The fencing token carried by mutating calls through a firmware-bridge
    /// (`bridge://`): the controller passes its leader Lease token here, and the bridge
    /// refuses tokens older than the newest it has seen. Required for off/on/reboot through a
    /// bridge; ignored by direct devices. Default `None`.
    pub fencing_token: Option<u64>,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            exchange_timeout: Duration::from_millis(500),
            retries: 3,
            cipher_probe_timeout: crate::ipmi::CIPHER_PROBE_TIMEOUT,
            verify: VerifyPolicy::default(),
            fencing_token: None,
        }
    }
}

/// A device that can switch a machine's power and report it.
#[async_trait]
pub trait PowerDevice: Send + Sync {
    /// A description for logs and attempt records (never contains a secret).
    fn name(&self) -> &str;

    /// Reads the power state.
    async fn status(&self) -> Result<PowerState, FenceError>;

    /// Powers off and verifies: returns only once the device reported off.
    async fn off(&self) -> Result<VerifiedOff, FenceError>;

    /// Powers on and waits until the device reports on.
    async fn on(&self) -> Result<VerifiedOn, FenceError>;

    /// Off (verified), then on.
    async fn reboot(&self) -> Result<(VerifiedOff, VerifiedOn), FenceError> {
        let off = self.off().await?;
        let on = self.on().await?;
        Ok((off, on))
    }

    /// Restarts the machine without ever turning its power off (IPMI chassis hard reset,
    /// Redfish `ForceRestart`), for hosts that lose their BMC when off. Returns once the device
    /// accepted the command.
    ///
    /// Guarantees: no power-off command is sent; a device that cannot restart without one (a
    /// PDU outlet, a bridge) refuses with [`FenceError::Config`] and sends nothing. The receipt
    /// proves nothing about the machine ([`ResetSent`]).
    async fn warm_reset(&self) -> Result<ResetSent, FenceError> {
        Err(FenceError::Config(format!(
            "{}: this device cannot restart a machine without powering it off",
            self.name()
        )))
    }

    /// Checks that the device is reachable and the credentials are good.
    async fn monitor(&self) -> Result<(), FenceError>;

    /// Lists plugs (outlet number and name) where the device has several.
    async fn list(&self) -> Result<Vec<(String, String)>, FenceError> {
        Ok(Vec::new())
    }
}

/// Enum dispatch over the backends.
#[derive(Debug)]
pub enum Device {
    /// An IPMI BMC.
    Ipmi(IpmiDevice),
    /// Outlets of a switched PDU.
    Pdu(PduDevice),
    /// A target behind a firmware-bridge.
    Bridge(BridgeDevice),
    /// A Redfish BMC.
    Redfish(RedfishDevice),
}

impl Device {
    /// Builds the backend for a direct `target` (`bridge://` needs
    /// [`Device::with_bridge_identity`]).
    pub fn new(
        target: Target,
        credentials: &Credentials,
        options: DeviceOptions,
    ) -> Result<Self, FenceError> {
        Self::with_bridge_identity(target, credentials, None, options)
    }

    /// Builds the backend for `target`; `bridge` is the TLS identity used for `bridge://`
    /// targets (required for them, ignored otherwise). Mutating calls through a bridge also
    /// need [`DeviceOptions::fencing_token`].
    pub fn with_bridge_identity(
        target: Target,
        credentials: &Credentials,
        bridge: Option<&BridgeIdentity>,
        options: DeviceOptions,
    ) -> Result<Self, FenceError> {
        Ok(match target {
            Target::Ipmi(t) => Self::Ipmi(IpmiDevice::new(t, credentials, options)?),
            Target::Pdu(t) => Self::Pdu(PduDevice::new(t, credentials, options)?),
            Target::Redfish(t) => Self::Redfish(RedfishDevice::new(t, credentials, options)?),
            Target::Bridge(t) => {
                let identity = bridge.ok_or_else(|| {
                    FenceError::Config(format!(
                        "bridge://{}:{}/{} needs a client certificate and CA (BridgeIdentity)",
                        t.host, t.port, t.target_id
                    ))
                })?;
                Self::Bridge(BridgeDevice::new(t, identity, options)?)
            }
        })
    }

    fn inner(&self) -> &dyn PowerDevice {
        match self {
            Self::Ipmi(d) => d,
            Self::Pdu(d) => d,
            Self::Bridge(d) => d,
            Self::Redfish(d) => d,
        }
    }
}

#[async_trait]
impl PowerDevice for Device {
    fn name(&self) -> &str {
        self.inner().name()
    }
    async fn status(&self) -> Result<PowerState, FenceError> {
        self.inner().status().await
    }
    async fn off(&self) -> Result<VerifiedOff, FenceError> {
        self.inner().off().await
    }
    async fn on(&self) -> Result<VerifiedOn, FenceError> {
        self.inner().on().await
    }
    async fn reboot(&self) -> Result<(VerifiedOff, VerifiedOn), FenceError> {
        self.inner().reboot().await
    }
    async fn warm_reset(&self) -> Result<ResetSent, FenceError> {
        self.inner().warm_reset().await
    }
    async fn monitor(&self) -> Result<(), FenceError> {
        self.inner().monitor().await
    }
    async fn list(&self) -> Result<Vec<(String, String)>, FenceError> {
        self.inner().list().await
    }
}
