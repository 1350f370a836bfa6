//! [`BridgeDevice`]: a [`PowerDevice`] that fences through a firmware-bridge
//! (`bridge://host:port/target-id`).
//!
//! The bridge holds the BMC/PDU credentials; this side holds only a client certificate and the
//! pinned CA ([`BridgeIdentity`]). Mutating calls carry the controller's fencing token
//! ([`crate::DeviceOptions::fencing_token`], the leader's Lease token) and an idempotency key:
//! one fresh key per logical operation (one `off`, one `on`), reused on every retry of that
//! operation, so a retried request never acts twice on the device.
//!
//! Guarantees: [`BridgeDevice::off`] returns [`VerifiedOff`] only when the bridge answered
//! `verified: true` with state `off` (see `verify::off_from_bridge`).

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use super::wire::{self, Health};
use super::{BridgeClient, ClientError, ClientSettings, OpResponse};
use crate::device::{DeviceOptions, PowerDevice};
use crate::error::FenceError;
use crate::power::PowerState;
use crate::secret::Secret;
use crate::target::BridgeTarget;
use crate::verify::{self, Commanded, VerifiedOff, VerifiedOn};

/// The TLS identity used to reach a bridge: the only trusted CA, the client certificate and
/// its key, and the timeouts of one request.
#[derive(Debug, Clone)]
pub struct BridgeIdentity {
    /// PEM of the CA that signed the bridge's server certificate (the only trusted root).
    pub ca_pem: Vec<u8>,
    /// PEM of the client certificate chain.
    pub cert_pem: Vec<u8>,
    /// PEM of the client key.
    pub key_pem: Secret,
    /// TCP+TLS connect timeout.
    pub connect_timeout: Duration,
    /// Whole-request timeout; must cover a verified power-off on the bridge side.
    pub request_timeout: Duration,
    /// The trace context sent with every request ([`super::ClientSettings::trace_context`]).
    pub trace_context: Option<super::TraceContext>,
}

impl BridgeIdentity {
    /// Reads the three PEM files, with default timeouts (5 s connect, 150 s request).
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<Self, FenceError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| FenceError::Config(format!("{}: {e}", p.display())))
        };
        let key_pem = String::from_utf8(read(key)?)
            .map_err(|_| FenceError::Config(format!("{}: not UTF-8 PEM", key.display())))?;
        Ok(Self {
            ca_pem: read(ca)?,
            cert_pem: read(cert)?,
            key_pem: Secret::new(key_pem),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(150),
            trace_context: None,
        })
    }
}

/// One target of a firmware-bridge, driven through the bridge's `/v1` API.
#[derive(Debug)]
pub struct BridgeDevice {
    name: String,
    target_id: String,
    client: BridgeClient,
    options: DeviceOptions,
}

/// A fresh idempotency key for one logical operation (`palisade-off-<128 random bits>`).
pub fn fresh_idempotency_key(operation: &str) -> String {
    format!("palisade-{operation}-{:032x}", rand::random::<u128>())
}

impl BridgeDevice {
    /// Builds the client (nothing is sent yet).
    pub fn new(
        target: BridgeTarget,
        identity: &BridgeIdentity,
        options: DeviceOptions,
    ) -> Result<Self, FenceError> {
        let name = format!(
            "bridge://{}:{}/{}",
            target.host, target.port, target.target_id
        );
        let host = if target.host.contains(':') {
            format!("[{}]", target.host)
        } else {
            target.host.clone()
        };
        let base = format!("https://{host}:{}/", target.port)
            .parse()
            .map_err(|e| FenceError::Config(format!("{name}: {e}")))?;
        let mut settings = ClientSettings::new(
            base,
            identity.ca_pem.clone(),
            identity.cert_pem.clone(),
            identity.key_pem.expose().as_bytes().to_vec(),
        );
        settings.connect_timeout = identity.connect_timeout;
        settings.request_timeout = identity.request_timeout;
        settings.trace_context = identity.trace_context;
        let client =
            BridgeClient::new(&settings).map_err(|e| FenceError::Config(format!("{name}: {e}")))?;
        Ok(Self {
            name,
            target_id: target.target_id,
            client,
            options,
        })
    }

    fn token(&self, op: &str) -> Result<u64, FenceError> {
        self.options.fencing_token.ok_or_else(|| {
            FenceError::Config(format!(
                "{}: {op} through the bridge needs a fencing token (DeviceOptions::fencing_token, the leader's Lease token)",
                self.name
            ))
        })
    }

    async fn power(&self, action: wire::PowerAction, key: &str) -> Result<OpResponse, FenceError> {
        let token = self.token(&format!("{action:?}").to_lowercase())?;
        let reason = format!("palisade-fence {action:?}").to_lowercase();
        retry_same_key(self.options.retries, key, |k| {
            self.client
                .power(&self.target_id, action, token, k, Some(&reason))
        })
        .await
        .map_err(|e| map_error(&self.name, e))
    }

    /// Powers off through the bridge under the caller's idempotency key: a second call with
    /// the same key (e.g. after a controller restart) is answered from the bridge's record and
    /// does not act again.
    ///
    /// Guarantees: `Ok` only if the bridge reported the target verified off.
    pub async fn off_with_key(&self, key: &str) -> Result<VerifiedOff, FenceError> {
        let commanded = Commanded::now();
        let r = self.power(wire::PowerAction::Off, key).await?;
        verify::off_from_bridge(
            &self.name,
            commanded,
            r.verified,
            r.power_state().map(from_wire),
            &r.evidence,
        )
    }

    /// Powers on through the bridge under the caller's idempotency key.
    pub async fn on_with_key(&self, key: &str) -> Result<VerifiedOn, FenceError> {
        let commanded = Commanded::now();
        let r = self.power(wire::PowerAction::On, key).await?;
        verify::on_from_bridge(
            &self.name,
            commanded,
            r.verified,
            r.power_state().map(from_wire),
        )
    }

    /// Storage-fences the target node-wide (no hold) through the bridge (one logical
    /// operation: a fresh key, reused on retries). `Ok` only when the bridge verified every
    /// storage device blocked; returns the bridge's answer (its evidence names each device).
    pub async fn block_storage(&self) -> Result<OpResponse, FenceError> {
        self.storage(
            wire::StorageAction::Block,
            &fresh_idempotency_key("block"),
            None,
        )
        .await
    }

    /// Lifts the storage fence node-wide (the operator's explicit unfence: every hold) through
    /// the bridge; `Ok` only when the bridge verified every storage device unblocked.
    pub async fn unblock_storage(&self) -> Result<OpResponse, FenceError> {
        self.storage(
            wire::StorageAction::Unblock,
            &fresh_idempotency_key("unblock"),
            None,
        )
        .await
    }

    /// A storage action under the caller's idempotency key and the fence's `hold` (`None`:
    /// node-wide), checked for verification.
    ///
    /// Guarantees: `Ok` only when the bridge answered `verified: true` with the wanted state.
    /// An unblock under a hold that another fence's hold outlives is an error
    /// ([`FenceError::DeviceRefused`] saying so): the target stays blocked.
    pub async fn storage(
        &self,
        action: wire::StorageAction,
        key: &str,
        hold: Option<&wire::StorageHold>,
    ) -> Result<OpResponse, FenceError> {
        let verb = format!("{action:?}").to_lowercase();
        let token = self.token(&verb)?;
        let reason = format!("palisade-fence storage {verb}");
        let r = retry_same_key(self.options.retries, key, |k| {
            self.client
                .storage_with_hold(&self.target_id, action, token, k, Some(&reason), hold)
        })
        .await
        .map_err(|e| map_error(&self.name, e))?;
        let want = match action {
            wire::StorageAction::Block => wire::StorageState::Blocked,
            wire::StorageAction::Unblock => wire::StorageState::Unblocked,
        };
        if r.verified && r.storage_state() == Some(want) {
            Ok(r)
        } else {
            Err(FenceError::DeviceRefused {
                device: self.name.clone(),
                detail: format!(
                    "storage {verb} not verified by the bridge (state {}, verified {})",
                    r.state, r.verified
                ),
            })
        }
    }

    /// Reads the storage state through the bridge.
    pub async fn storage_status(&self) -> Result<wire::StorageState, FenceError> {
        let r = retry_same_key(self.options.retries, "", |_| {
            self.client.storage_status(&self.target_id)
        })
        .await
        .map_err(|e| map_error(&self.name, e))?;
        r.storage_state().ok_or_else(|| FenceError::Protocol {
            device: self.name.clone(),
            detail: format!("storage status without a state: {}", r.state),
        })
    }

    /// The client, for audit reads and raw calls.
    pub fn client(&self) -> &BridgeClient {
        &self.client
    }

    /// The bridge's id of the target.
    pub fn target_id(&self) -> &str {
        &self.target_id
    }
}

fn from_wire(s: wire::PowerState) -> PowerState {
    match s {
        wire::PowerState::On => PowerState::On,
        wire::PowerState::Off => PowerState::Off,
        wire::PowerState::Unknown => PowerState::Unknown,
    }
}

/// Calls `f` with the same `key` up to `1 + retries` times while the error is retryable,
/// waiting 200 ms, 400 ms … (at most 2 s) between calls.
///
/// Guarantees: every call carries the same idempotency key, so the bridge performs the
/// action at most once however many of the calls reached it.
async fn retry_same_key<'k, T, F, Fut>(
    retries: u32,
    key: &'k str,
    mut f: F,
) -> Result<T, ClientError>
where
    F: FnMut(&'k str) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    use backon::Retryable as _;
    let policy = backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(2))
        .with_max_times(retries as usize);
    (|| f(key))
        .retry(policy)
        .sleep(tokio::time::sleep)
        .when(ClientError::is_retryable)
        .notify(|e, wait| {
            tracing::debug!(key, error = %e, retry_in_ms = wait.as_millis() as u64, "retrying bridge call with the same key");
        })
        .await
}

/// Maps a client error to the agents' error, keeping the bridge's reason visible.
fn map_error(device: &str, e: ClientError) -> FenceError {
    let device = device.to_string();
    match e {
        ClientError::Api {
            status,
            code,
            message,
            body,
            ..
        } => match (status, code.as_str()) {
            (409, "stale_fencing_token") => FenceError::StaleFencingToken {
                device,
                detail: message,
                seen_token: body.get("seen_token").and_then(serde_json::Value::as_u64),
            },
            (409, super::STORAGE_STILL_HELD) => FenceError::DeviceRefused {
                device,
                detail: format!(
                    "storage not unblocked: another fence still holds the node ({code}: {message})"
                ),
            },
            (401 | 403, _) => FenceError::AuthRefused {
                device,
                detail: format!("HTTP {status} {code}: {message}"),
            },
            (504, _) => FenceError::Timeout {
                device,
                operation: format!("bridge request ({code}: {message})"),
                after: Duration::ZERO,
            },
            _ => FenceError::DeviceRefused {
                device,
                detail: format!("HTTP {status} {code}: {message}"),
            },
        },
        ClientError::Transport { source, chain, .. } if source.is_timeout() => {
            FenceError::Timeout {
                device,
                operation: format!("bridge request ({chain})"),
                after: Duration::ZERO,
            }
        }
        ClientError::Transport { chain, .. } => FenceError::Unreachable {
            device,
            source: std::io::Error::other(chain),
        },
        e @ (ClientError::Setup(_) | ClientError::Url { .. }) => {
            FenceError::Config(format!("{device}: {e}"))
        }
    }
}

#[async_trait]
impl PowerDevice for BridgeDevice {
    fn name(&self) -> &str {
        &self.name
    }

    async fn status(&self) -> Result<PowerState, FenceError> {
        let r = retry_same_key(self.options.retries, "", |_| {
            self.client.power_status(&self.target_id)
        })
        .await
        .map_err(|e| map_error(&self.name, e))?;
        r.power_state()
            .map(from_wire)
            .ok_or_else(|| FenceError::Protocol {
                device: self.name.clone(),
                detail: format!("power status without a state: {}", r.state),
            })
    }

    /// One logical off: a fresh idempotency key, reused on every retry.
    async fn off(&self) -> Result<VerifiedOff, FenceError> {
        self.off_with_key(&fresh_idempotency_key("off")).await
    }

    /// One logical on: a fresh idempotency key, reused on every retry.
    async fn on(&self) -> Result<VerifiedOn, FenceError> {
        self.on_with_key(&fresh_idempotency_key("on")).await
    }

    async fn monitor(&self) -> Result<(), FenceError> {
        let r = retry_same_key(self.options.retries, "", |_| {
            self.client.monitor(&self.target_id)
        })
        .await
        .map_err(|e| map_error(&self.name, e))?;
        match r.health() {
            Some(Health::Ok) => Ok(()),
            _ => Err(FenceError::DeviceRefused {
                device: self.name.clone(),
                detail: format!(
                    "bridge reports the target's devices degraded: {}",
                    r.evidence
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    fn api(status: u16, code: &str) -> ClientError {
        ClientError::Api {
            url: "u".into(),
            status,
            code: code.into(),
            message: "m".into(),
            body: serde_json::Value::Null,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_reuse_the_same_idempotency_key_and_stop_on_terminal_errors() {
        let seen = Mutex::new(Vec::new());
        let r: Result<(), _> = retry_same_key(3, "k1", |k| {
            seen.lock().push(k.to_string());
            let n = seen.lock().len();
            async move {
                if n < 3 {
                    Err(api(503, "busy"))
                } else {
                    Ok(())
                }
            }
        })
        .await;
        assert!(r.is_ok());
        assert_eq!(*seen.lock(), vec!["k1", "k1", "k1"]);

        let calls = Mutex::new(0);
        let r: Result<(), _> = retry_same_key(3, "k2", |_| {
            *calls.lock() += 1;
            async { Err(api(409, "stale_fencing_token")) }
        })
        .await;
        assert_eq!(r.unwrap_err().status(), Some(409));
        assert_eq!(*calls.lock(), 1, "a stale token is never retried");

        let calls = Mutex::new(0);
        let r: Result<(), _> = retry_same_key(2, "k3", |_| {
            *calls.lock() += 1;
            async { Err(api(429, "rate_limited")) }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(*calls.lock(), 3, "bounded by 1 + retries");
    }

    #[test]
    fn keys_are_fresh_per_operation() {
        let a = fresh_idempotency_key("off");
        let b = fresh_idempotency_key("off");
        assert_ne!(a, b);
        assert!(a.starts_with("palisade-off-") && a.len() <= 128);
    }

    #[test]
    fn a_stale_token_refusal_carries_the_bridge_floor_only_from_its_typed_field() {
        let refusal = |body: serde_json::Value| {
            ClientError::Api {
            url: "u".into(),
            status: 409,
            code: "stale_fencing_token".into(),
            message: "stale fencing token 6: target m0 has already seen token 99 from a newer controller; refusing to act".into(),
            body,
        }
        };
        let floor = |e: FenceError| match e {
            FenceError::StaleFencingToken { seen_token, .. } => seen_token,
            other => panic!("not a stale token: {other}"),
        };
        let typed =
            serde_json::json!({"error": "stale_fencing_token", "token": 6, "seen_token": 7});
        assert_eq!(floor(map_error("d", refusal(typed))), Some(7));
        // An older bridge says the floor only in words: unknown, never the number in the text.
        let english = serde_json::json!({"error": "stale_fencing_token", "message": "... already seen token 99 ..."});
        assert_eq!(floor(map_error("d", refusal(english))), None);
        let garbage = serde_json::json!({"error": "stale_fencing_token", "seen_token": "99"});
        assert_eq!(floor(map_error("d", refusal(garbage))), None);
        assert_eq!(
            floor(map_error("d", refusal(serde_json::Value::Null))),
            None
        );
    }

    #[test]
    fn a_hold_another_fence_outlives_maps_to_a_terminal_not_unblocked_error() {
        let e = map_error(
            "bridge://h:1/m0",
            api(409, super::super::STORAGE_STILL_HELD),
        );
        assert!(!e.is_retryable());
        assert_eq!(e.kind(), "device_refused");
        assert!(
            e.to_string().contains("another fence still holds the node"),
            "{e}"
        );
    }

    #[test]
    fn stale_tokens_map_to_a_clear_terminal_error() {
        let e = map_error("bridge://h:1/m0", api(409, "stale_fencing_token"));
        assert!(!e.is_retryable());
        assert_eq!(e.kind(), "stale_fencing_token");
        assert!(e.to_string().contains("stale fencing token"), "{e}");
        assert_eq!(map_error("d", api(403, "forbidden")).kind(), "auth_refused");
    }
}
