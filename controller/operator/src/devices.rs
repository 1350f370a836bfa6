//! Fencing devices: the controller's hands.
//!
//! A planned device (URL + kind, from the `NodeFence` plan) is matched with its `FenceTarget`
//! entry as listed now for the credential Secret reference (a direct BMC no longer listed, its
//! address edited by a person, is stood in for by the BMC listed now, pinned to the Node's
//! machine: [`palisade_model::target::FenceTargetSpec::acting_for`]), the credentials are read
//! from the Secret (never logged, never in argv), and the action runs through `palisade-fence`
//! (IPMI, SNMP PDU) or `palisade-storagefw` (storage firewall), bounded by the device's timeout.
//! A `bridge://` device is driven through the firmware-bridge instead: the controller presents
//! its client certificate ([`crate::Settings::bridge`]), the leader's fencing token and an
//! idempotency key derived from the `NodeFence` (so a controller resuming an interrupted step
//! gets the bridge's recorded answer instead of a second power action); the bridge holds the
//! credentials.
//!
//! Guarantees: evidence is produced only from `palisade_fence::VerifiedOff` (the device reported
//! the power off after the command) or `palisade_storagefw::VerifiedBlocked` (the storage reported
//! the node blocked); a commanded but unverified action is a failed attempt. Before every device
//! action the leadership is re-checked against the Lease with the fencing token
//! ([`crate::leader::Leadership::check`]), and the term is re-checked on the local monotonic
//! clock once more immediately before a direct (non-bridge) command is sent, after the
//! credentials and the node's addresses were read.
//!
//! Deposed leaders: a direct device (IPMI, SNMP PDU, storage firewall) knows nothing of
//! tokens, so a leader deposed *after* its last check (a process pause between the check and
//! the packet, or a command still in flight when the term ends) can still reach it, however
//! late. What each late command can do:
//! - a power off, a reset or a storage block only fences more;
//! - a power on boots a machine whose processes all ended when it was powered off, and whose
//!   released pods are gone from the API: nothing of the released workload comes back;
//! - a storage unblock is the one that could lift a newer fence. It names the fence's own hold
//!   ([`StepIds::hold`], `palisade-<NodeFence UID>`), directly or through the firmware-bridge:
//!   the firewall lifts that hold only and the node stays blocked while a newer fence holds it
//!   (the lab storage server keeps holds; a vendor profile must put `{hold}` in its unblock
//!   for this, see `palisade_storagefw::profile`).
//!
//! Devices reached through the firmware-bridge are also protected by tokens: every bridge
//! action, fence and recovery alike (power off and on, storage block and unblock), carries the
//! token, and the bridge refuses a token below the highest it has seen
//! ([`AttemptOutcome::StaleToken`]). The deterministic simulation (`palisade-sim`) freezes
//! leaders at their device commands and plants a node-wide unblock (`NodeWideUnblock`) to show
//! the hold is what keeps at-most-one.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use palisade_fence::bridge::wire::StorageAction;
use palisade_fence::bridge::{chain, BridgeDevice};
use palisade_fence::{Credentials, Device, DeviceOptions, PowerDevice, Target};
use palisade_model::nodefence::{
    AttemptOutcome, DeviceAction, DeviceAttempt, Evidence, EvidenceKind, PlannedDevice,
};
use palisade_model::target::{DeviceKind, DeviceScheme, SecretRef};
use palisade_model::FenceTarget;
use tracing::Instrument as _;

use crate::error::Error;
use crate::Ctx;

pub use palisade_decide::record::LevelRun;

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// Reads the Secret values a device needs, keyed by role (`password`, `community`,
/// `authPassword`, `privPassword`, `caBundle`, `token`). A `SecretRef.keys` entry maps a role to
/// another key; otherwise the role name is the key.
pub async fn read_secret(ctx: &Ctx, r: &SecretRef) -> Result<BTreeMap<String, String>, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &r.namespace);
    let secret = api.get(&r.name).await.map_err(|source| Error::Secret {
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        source,
    })?;
    let data = secret.data.unwrap_or_default();
    let mut out = BTreeMap::new();
    for role in [
        "password",
        "community",
        "authPassword",
        "privPassword",
        "caBundle",
        "token",
    ] {
        let key = r.keys.get(role).map(String::as_str).unwrap_or(role);
        if let Some(v) = data.get(key) {
            out.insert(role.to_string(), String::from_utf8_lossy(&v.0).into_owned());
        }
    }
    Ok(out)
}

/// The device of `node`'s FenceTarget a step planned through `url` acts through, and its
/// credentials ([`palisade_model::target::FenceTargetSpec::acting_for`]).
struct Listed {
    /// The address acted through: the planned one, or its stand-in's.
    url: String,
    /// The credentials of the device acted through.
    secret: BTreeMap<String, String>,
    /// For a stand-in, the words that say so (in the attempt's message); `None` when the
    /// planned device is still listed.
    stand_in: Option<String>,
}

impl Listed {
    /// `message` about an action through this device, saying when a stand-in took it.
    fn say(&self, message: String) -> String {
        match &self.stand_in {
            Some(why) => format!("{message} ({why})"),
            None => message,
        }
    }
}

/// Reads `node`'s FenceTarget as it is now and resolves the planned device at `url` against it.
///
/// Guarantees: a stand-in for a planned BMC no longer listed acts only when it is pinned to the
/// Node's machine ([`identity_pinned`]: by the Node's `systemUUID`, checked by the fence
/// agent before anything is read or commanded); anything else no longer listed is an error
/// with nothing sent.
async fn listed(ctx: &Ctx, node: &str, url: &str, kind: DeviceKind) -> Result<Listed, Error> {
    use palisade_model::target::{redact_url, Acting};
    let api: Api<FenceTarget> = Api::all(ctx.client.clone());
    let target = api
        .get(node)
        .await
        .map_err(|e| Error::kube(format!("reading FenceTarget {node}"), e))?;
    let unlisted = |why: &str| Error::Device {
        device: url.to_string(),
        message: format!("no longer listed in FenceTarget {node}{why}; nothing sent"),
    };
    let acting = target
        .spec
        .acting_for(url, kind)
        .ok_or_else(|| unlisted(""))?;
    let device = acting.device();
    let stand_in = match acting {
        Acting::Listed(_) => None,
        Acting::StandIn(d) if identity_pinned(ctx, node, &d.url) => Some(format!(
            "through {}, standing in for {} no longer listed in FenceTarget {node}: pinned to the Node's machine",
            redact_url(&d.url),
            redact_url(url)
        )),
        Acting::StandIn(d) => {
            return Err(unlisted(&format!(
                ", and {}, listed now, cannot be pinned to the Node's machine (the Node reports no comparable system UUID and its URL no pin, or its pin names another machine)",
                redact_url(&d.url)
            )))
        }
    };
    let secret = match &device.credentials_secret_ref {
        Some(r) => read_secret(ctx, r).await?,
        None => BTreeMap::new(),
    };
    Ok(Listed {
        url: device.url.clone(),
        secret,
        stand_in,
    })
}

/// A direct power device for `url`, whose verification (status polls after a command) may take
/// the device's whole `budget` (its `timeoutSeconds`): a chassis that is slow to report off is
/// verified within what the operator allowed, not within the fence crate's default.
/// The machine identity the Node `node` reports (its SMBIOS system UUID), when it is one that
/// can be compared ([`palisade_model::identity::normalize_uuid`]); `None` for a Node that
/// reports none, or its name.
fn node_identity(ctx: &Ctx, node: &str) -> Option<String> {
    ctx.cache
        .nodes
        .get(&kube::runtime::reflector::ObjectRef::new(node))
        .and_then(|n| Some(n.status.as_ref()?.node_info.as_ref()?.system_uuid.clone()))
        .and_then(|u| palisade_model::identity::normalize_uuid(&u))
}

/// Pins a direct BMC target to the machine `expected` names (the Node's system UUID): an IPMI
/// BMC must answer Get System GUID, a Redfish system must report `UUID`, with that identity
/// before anything is read or commanded through it (identity by default, DESIGN §5 rule 10).
///
/// Guarantees: with `expected`, the target never acts unpinned: a URL without a pin gets
/// `expected`, and a URL pin that names another machine is refused here, with nothing sent.
/// Without `expected` (a Node that reports no comparable UUID), the target is left as its URL
/// says. PDU outlets have no identity to read and are left as they are.
fn pin_identity(
    url: &str,
    target: &mut Target,
    expected: Option<&str>,
) -> Result<(), AttemptError> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let pin = match target {
        Target::Ipmi(t) => &mut t.system_guid,
        Target::Redfish(r) => &mut r.system_uuid,
        Target::Pdu(_) | Target::Bridge(_) => return Ok(()),
    };
    match pin {
        None => {
            *pin = Some(expected.to_string());
            Ok(())
        }
        Some(p) if palisade_model::identity::same_machine(p, expected) => Ok(()),
        Some(p) => Err(AttemptError::Fence(
            palisade_fence::FenceError::IdentityMismatch {
                device: palisade_model::target::redact_url(url),
                expected: format!("the Node's system UUID {expected}"),
                found: format!("the device URL pins {p}, another machine; nothing sent"),
            },
        )),
    }
}

fn power_device(
    url: &str,
    secret: &BTreeMap<String, String>,
    budget: Duration,
    expected: Option<&str>,
) -> Result<Device, AttemptError> {
    let mut target = Target::parse(url)?;
    pin_identity(url, &mut target, expected)?;
    if let Target::Redfish(r) = &mut target {
        // `ca=secret`: the BMC's CA is the Secret's caBundle, not a file on this host.
        let ca = secret.get("caBundle").map(String::as_str);
        r.tls = r
            .tls
            .clone()
            .with_secret_ca(ca)
            .map_err(|message| Error::Device {
                device: url.to_string(),
                message,
            })?;
    }
    let s = |k: &str| {
        secret
            .get(k)
            .map(|v| palisade_fence::Secret::new(v.trim_end_matches('\n')))
    };
    let creds = Credentials {
        password: s("password"),
        community: s("community"),
        v3_auth_password: s("authPassword"),
        v3_priv_password: s("privPassword"),
    };
    let mut options = DeviceOptions::default();
    options.verify.timeout = budget;
    Ok(Device::new(target, &creds, options)?)
}

fn node_addresses(node: Option<&Node>) -> Vec<IpAddr> {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn storage_client(
    url: &str,
    secret: &BTreeMap<String, String>,
) -> Result<palisade_storagefw::StorageFirewall, AttemptError> {
    let target = palisade_storagefw::Target::parse(url)?;
    let ca = secret.get("caBundle").ok_or_else(|| Error::Device {
        device: url.to_string(),
        message: "credential Secret has no caBundle".into(),
    })?;
    let mut cfg = palisade_storagefw::StorageFwConfig::new(target, ca.as_bytes().to_vec())?;
    cfg.token = secret
        .get("token")
        .map(|t| palisade_storagefw::Secret::new(t.trim_end_matches('\n')));
    Ok(palisade_storagefw::StorageFirewall::new(cfg)?)
}

/// Which way a device is driven: fencing (off, block) or recovering (on, unblock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Fence,
    Recover,
}

fn action_of(kind: DeviceKind, direction: Direction) -> DeviceAction {
    match (kind, direction) {
        (DeviceKind::Power, Direction::Fence) => DeviceAction::PowerOff,
        (DeviceKind::Power, Direction::Recover) => DeviceAction::PowerOn,
        (DeviceKind::Storage, Direction::Fence) => DeviceAction::Block,
        (DeviceKind::Storage, Direction::Recover) => DeviceAction::Unblock,
    }
}

/// A device's answer: a message and, for a verified fence, the evidence; or why it failed.
type Acted = Result<(String, Option<(EvidenceKind, String)>), AttemptError>;

/// Why one device attempt did not succeed.
///
/// Guarantees: the attempt's outcome is decided from the error's type, never from its text (a
/// bridge's refusal of a stale token is [`AttemptOutcome::StaleToken`] because it is
/// `FenceError::StaleFencingToken`); the sources are kept until the attempt is recorded, and the
/// status, the Event and the log get the whole chain ([`AttemptError::message`]).
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    /// A power device, direct or through the firmware-bridge, failed, refused or was not
    /// verified.
    #[error(transparent)]
    Fence(#[from] palisade_fence::FenceError),
    /// A storage firewall failed, refused or was not verified.
    #[error(transparent)]
    Storage(#[from] palisade_storagefw::StorageFwError),
    /// The call could not be prepared (FenceTarget, Secret, device URL): nothing was sent.
    #[error(transparent)]
    Prepare(#[from] Error),
    /// Our leadership could not be confirmed with the token: nothing was sent.
    #[error("leadership not confirmed")]
    Leadership(#[source] Error),
    /// The term ended on our own clock before the command: nothing was sent.
    #[error("term {token} ended before the command was sent")]
    TermEnded {
        /// The term's fencing token.
        token: i64,
    },
    /// The device's budget (its `timeoutSeconds`) ran out before a verified answer.
    #[error("no verified {what} within {budget:?}")]
    TimedOut {
        /// What was awaited.
        what: &'static str,
        /// The device's budget.
        budget: Duration,
    },
    /// This controller cannot drive the device that way: nothing was sent.
    #[error("{0}")]
    Unsupported(String),
    /// Under `powerWithoutIdentity: AfterProof`, no direct BMC answered as the node's machine
    /// before a device without an identity would have acted: nothing was sent to it.
    #[error("{device}: identity unproven (powerWithoutIdentity: AfterProof): {why}; nothing sent")]
    IdentityUnproven {
        /// The device that did not act (redacted).
        device: String,
        /// Which BMCs were asked, and what each said.
        why: String,
    },
}

impl AttemptError {
    /// The outcome recorded for the attempt.
    fn outcome(&self) -> AttemptOutcome {
        use palisade_fence::FenceError;
        match self {
            // No answer at all: the budget ran out, the device's own exchanges timed out, or
            // it could not be reached (a dark BMC: its power cut, or only its network).
            Self::TimedOut { .. }
            | Self::Fence(
                palisade_fence::FenceError::Timeout { .. }
                | palisade_fence::FenceError::Unreachable { .. },
            ) => AttemptOutcome::TimedOut,
            // A bridge that has seen a newer token refuses: that is not a device failure but a
            // deposed (or restarted-from-scratch) leader, and is reported as such.
            Self::Fence(FenceError::StaleFencingToken { .. })
            | Self::Leadership(_)
            | Self::TermEnded { .. } => AttemptOutcome::StaleToken,
            Self::Fence(_)
            | Self::Storage(_)
            | Self::Prepare(_)
            | Self::Unsupported(_)
            | Self::IdentityUnproven { .. } => AttemptOutcome::Failed,
        }
    }

    /// The bridge's token floor, from the typed field of its stale-token refusal (`None`
    /// otherwise, and when the bridge did not send it).
    fn seen_token(&self) -> Option<i64> {
        match self {
            Self::Fence(palisade_fence::FenceError::StaleFencingToken { seen_token, .. }) => {
                seen_token.and_then(|t| i64::try_from(t).ok())
            }
            _ => None,
        }
    }

    /// The message for the status, the Event and the log: the whole source chain, and for a
    /// power device the kind of failure (`auth_refused`, `stale_fencing_token` …).
    fn message(&self) -> String {
        match self {
            Self::Fence(e) => format!("{} ({})", chain(e), e.kind()),
            e => chain(e),
        }
    }
}

/// Awaits `f` within `budget`: a timeout is [`AttemptError::TimedOut`].
async fn bounded<T, E: Into<AttemptError>>(
    budget: Duration,
    what: &'static str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, AttemptError> {
    match tokio::time::timeout(budget, f).await {
        Err(_) => Err(AttemptError::TimedOut { what, budget }),
        Ok(r) => r.map_err(Into::into),
    }
}

/// The bridge's evidence, shortened for the `NodeFence` status (the bridge's audit log keeps
/// all of it).
fn short(evidence: &str) -> String {
    const MAX: usize = 600;
    match evidence.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &evidence[..i]),
        None => evidence.to_string(),
    }
}

fn bridge_device(ctx: &Ctx, url: &str, token: i64) -> Result<BridgeDevice, AttemptError> {
    let identity = ctx.settings.bridge.as_ref().ok_or_else(|| {
        AttemptError::Unsupported(format!("{url}: this controller has no firmware-bridge client identity (--bridge-ca, --bridge-cert, --bridge-key)"))
    })?;
    let Target::Bridge(target) = Target::parse(url)? else {
        return Err(AttemptError::Unsupported(format!(
            "{url}: not a bridge:// URL"
        )));
    };
    let token = u64::try_from(token)
        .map_err(|_| AttemptError::Unsupported(format!("fencing token {token} is negative")))?;
    let options = DeviceOptions {
        fencing_token: Some(token),
        ..DeviceOptions::default()
    };
    Ok(BridgeDevice::new(target, identity, options)?)
}

/// The firmware-bridge target of the planned device `d`, only while `node`'s FenceTarget still
/// lists it: a person who removed a bridge target from the FenceTarget has withdrawn it, as a
/// direct device ([`listed`]); nothing stands in for it.
async fn listed_bridge(
    ctx: &Ctx,
    node: &str,
    d: &PlannedDevice,
    token: i64,
) -> Result<BridgeDevice, AttemptError> {
    listed(ctx, node, &d.url, d.kind).await?;
    bridge_device(ctx, &d.url, token)
}

async fn storage_node(
    ctx: &Ctx,
    node: &str,
) -> Result<palisade_storagefw::NodeRef, palisade_storagefw::StorageFwError> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let n = nodes.get_opt(node).await.ok().flatten();
    palisade_storagefw::NodeRef::new(node, node_addresses(n.as_ref()))
}

fn budget_of(d: &PlannedDevice) -> Duration {
    Duration::from_secs(u64::try_from(d.timeout_seconds).unwrap_or(20).max(1))
}

/// The last check before a direct command, after the API reads that precede it: our term
/// must still be valid on our own clock (no round trip, so the window stays small).
fn still_leading(ctx: &Ctx, token: i64) -> Result<(), AttemptError> {
    if ctx.leader.token() == Some(token) {
        Ok(())
    } else {
        Err(AttemptError::TermEnded { token })
    }
}

/// Restarts the machine through a direct IPMI or Redfish BMC without powering it off (a level
/// with `powerOff: Disallowed`).
///
/// Guarantees: never evidence (a reset proves nothing; the restart shows only as a new boot
/// ID); never a power-off command; leadership with `token` is checked first and the term once
/// more before the command. A device of another scheme is refused with nothing sent.
async fn warm_reset(ctx: &Ctx, node: &str, d: &PlannedDevice, token: i64) -> Acted {
    use palisade_fence::PowerDevice as _;
    ctx.leader
        .check(token)
        .await
        .map_err(AttemptError::Leadership)?;
    match DeviceScheme::of(&d.url) {
        Some(DeviceScheme::Ipmi | DeviceScheme::Redfish) if d.kind == DeviceKind::Power => {
            let listed = listed(ctx, node, &d.url, d.kind).await?;
            let expected = node_identity(ctx, node);
            let device = power_device(
                &listed.url,
                &listed.secret,
                budget_of(d),
                expected.as_deref(),
            )?;
            still_leading(ctx, token)?;
            let sent = bounded(budget_of(d), "reset acknowledgement", async {
                device.warm_reset().await
            })
            .await?;
            Ok((
                listed.say(format!(
                    "{} accepted by {} (not evidence: the restart is proven only by a new boot ID)",
                    sent.command, sent.device
                )),
                None,
            ))
        }
        scheme => Err(AttemptError::Unsupported(format!(
            "a {:?} device with scheme {scheme:?} cannot restart the machine without powering it off; nothing sent",
            d.kind
        ))),
    }
}

/// The names of one device step of a `NodeFence`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepIds {
    /// Names the step for idempotency keys (`nf-<uid>-t<token>-a<attempts so far>`): the same
    /// when an interrupted step is resumed, new for a new step or a new leader.
    pub step: String,
    /// The fence's own hold at a storage firewall (`palisade-<NodeFence UID>`), the same for
    /// every leader and step of the fence: its block adds it and its unblock lifts only it.
    pub hold: String,
}

/// Drives one device one way. `key` is the idempotency key of this step (used by `bridge://`);
/// `hold` is the fence's hold at a storage firewall (direct, or behind the bridge).
///
/// Guarantees: evidence is returned only for a verified fence; leadership with `token` is
/// checked first. A storage block and unblock, direct or through the bridge, name the fence's
/// hold, so a deposed leader's late unblock lifts only its own fence's hold, never a newer
/// fence's block.
async fn act(
    ctx: &Ctx,
    node: &str,
    d: &PlannedDevice,
    direction: Direction,
    token: i64,
    (key, hold): (&str, &str),
) -> Acted {
    ctx.leader
        .check(token)
        .await
        .map_err(AttemptError::Leadership)?;
    let budget = budget_of(d);
    let fence = direction == Direction::Fence;
    let still_leading = || still_leading(ctx, token);
    let scheme = DeviceScheme::of(&d.url);
    match (d.kind, scheme) {
        (
            DeviceKind::Power,
            Some(DeviceScheme::Ipmi | DeviceScheme::SnmpPdu | DeviceScheme::Redfish),
        ) => {
            if fence {
                prove_identity(ctx, node, d).await?;
            }
            let listed = listed(ctx, node, &d.url, d.kind).await?;
            let expected = node_identity(ctx, node);
            let device = power_device(&listed.url, &listed.secret, budget, expected.as_deref())?;
            still_leading()?;
            if !fence {
                let v = bounded(budget, "power on", async { device.on().await }).await?;
                return Ok((
                    listed.say(format!(
                        "power on verified in {:?}",
                        v.command_to_verified()
                    )),
                    None,
                ));
            }
            let v = bounded(budget, "power off", async { device.off().await }).await?;
            Ok((
                listed.say(match v.refusal() {
                    None => format!(
                        "power off commanded and verified in {:?}",
                        v.command_to_verified()
                    ),
                    Some(r) => format!(
                        "power off refused by the device ({r}), and the machine already read off: verified in {:?}",
                        v.command_to_verified()
                    ),
                }),
                Some((
                    EvidenceKind::PowerOff,
                    format!(
                        "{} reported power off after {} status poll(s), {:?} after the command",
                        v.device(),
                        v.polls(),
                        v.command_to_verified()
                    ),
                )),
            ))
        }
        (DeviceKind::Power, Some(DeviceScheme::Bridge)) => {
            let device = listed_bridge(ctx, node, d, token).await?;
            if fence {
                prove_identity(ctx, node, d).await?;
                still_leading()?;
            }
            if !fence {
                let v =
                    bounded(budget, "power on", async { device.on_with_key(key).await }).await?;
                return Ok((
                    format!(
                        "power on verified by the bridge in {:?}",
                        v.command_to_verified()
                    ),
                    None,
                ));
            }
            let v = bounded(budget, "power off", async {
                device.off_with_key(key).await
            })
            .await?;
            Ok((
                format!(
                    "power off verified by the bridge in {:?} (idempotency key {key})",
                    v.command_to_verified()
                ),
                Some((
                    EvidenceKind::PowerOff,
                    format!(
                        "{} reported target {} verified off under token {token}: {}",
                        d.url,
                        device.target_id(),
                        short(v.bridge_evidence().unwrap_or("{}"))
                    ),
                )),
            ))
        }
        (DeviceKind::Storage, Some(DeviceScheme::StorageFirewall)) => {
            let listed = listed(ctx, node, &d.url, d.kind).await?;
            let client = storage_client(&listed.url, &listed.secret)?;
            let noderef = storage_node(ctx, node)
                .await
                .and_then(|n| n.with_hold(hold))?;
            still_leading()?;
            if !fence {
                bounded(budget, "unblock", async { client.unblock(&noderef).await }).await?;
                return Ok(("storage unblock verified".into(), None));
            }
            let v = bounded(budget, "block", async { client.block(&noderef).await }).await?;
            Ok((
                "storage block commanded and verified".into(),
                Some((
                    EvidenceKind::StorageBlocked,
                    format!(
                        "{} reports node {} blocked: {}",
                        v.endpoint(),
                        v.node(),
                        v.status()
                    ),
                )),
            ))
        }
        (DeviceKind::Storage, Some(DeviceScheme::Bridge)) => {
            // The fence's own hold, as for a direct storage firewall: the bridge's block adds
            // it and its unblock lifts only it, so a late unblock (also refused by the token)
            // cannot lift a newer fence's block. A hold another fence outlives is refused by
            // the bridge (`storage_still_held`): the unblock fails, the node stays blocked.
            let hold = palisade_fence::bridge::wire::StorageHold::new(hold)
                .map_err(|e| palisade_fence::FenceError::Config(format!("{}: {e}", d.url)))?;
            let device = listed_bridge(ctx, node, d, token).await?;
            let (verb, action) = if fence {
                ("block", StorageAction::Block)
            } else {
                ("unblock", StorageAction::Unblock)
            };
            let r = bounded(budget, verb, async {
                device.storage(action, key, Some(&hold)).await
            })
            .await?;
            let message = format!(
                "storage {verb} verified by the bridge (idempotency key {key}, hold {hold})"
            );
            let evidence = fence.then(|| {
                (
                    EvidenceKind::StorageBlocked,
                    format!(
                        "{} reported target {} storage blocked under token {token} and hold {hold}: {}",
                        d.url,
                        r.target,
                        short(&r.evidence.to_string())
                    ),
                )
            });
            Ok((message, evidence))
        }
        (kind, scheme) => Err(AttemptError::Unsupported(format!(
            "no agent for a {kind:?} device with scheme {scheme:?} in this controller"
        ))),
    }
}

/// The idempotency key of one device step: unique per `NodeFence` step (`step` names it, e.g.
/// `nf-<uid>-t<token>-a<attempts so far>`), level, device and action, and the same when an
/// interrupted step is resumed.
fn step_key(step: &str, level: i32, index: usize, action: DeviceAction) -> String {
    format!("{step}-l{level}-d{index}-{action:?}")
}

/// Runs the devices of one level one way, recording an attempt per device; stops at the first
/// failure.
///
/// With `reset` (fencing a level that must not power off): every storage device runs first
/// (whatever the plan's order), and the power devices are reset, not powered off, only once
/// every storage block was verified; a reset that fails is recorded and does not fail the
/// level.
#[allow(clippy::too_many_arguments)]
async fn drive(
    ctx: &Ctx,
    node: &str,
    level: i32,
    devices: &[PlannedDevice],
    direction: Direction,
    reset: bool,
    token: i64,
    ids: &StepIds,
) -> LevelRun {
    let mut run = LevelRun::default();
    let mut order: Vec<(usize, &PlannedDevice)> = devices.iter().enumerate().collect();
    if reset {
        order.sort_by_key(|(_, d)| d.kind != DeviceKind::Storage);
    }
    for (index, d) in order {
        let resetting = reset && direction == Direction::Fence && d.kind == DeviceKind::Power;
        let action = if resetting {
            DeviceAction::Reset
        } else {
            action_of(d.kind, direction)
        };
        let key = step_key(&ids.step, level, index, action);
        let span = tracing::info_span!(
            "device",
            node,
            level,
            device = %palisade_model::target::redact_url(&d.url),
            ?action,
            token,
            outcome = tracing::field::Empty,
        );
        let acted = if resetting {
            warm_reset(ctx, node, d, token)
                .instrument(span.clone())
                .await
        } else {
            act(ctx, node, d, direction, token, (&key, &ids.hold))
                .instrument(span.clone())
                .await
        };
        let (outcome, message, evidence, seen_token) = match acted {
            Ok((m, e)) => (AttemptOutcome::Succeeded, m, e, None),
            Err(e) => (e.outcome(), e.message(), None, e.seen_token()),
        };
        span.record("outcome", tracing::field::debug(outcome));
        tracing::info!(node, level, device = %d.url, ?action, ?outcome, %message, "device attempt");
        run.attempts.push(DeviceAttempt {
            level,
            device: d.url.clone(),
            action,
            outcome,
            token,
            at: now(),
            message: message.clone(),
            seen_token,
        });
        if resetting {
            if outcome == AttemptOutcome::StaleToken {
                run.failure = Some(about(&d.url, &message));
                break;
            }
            if outcome != AttemptOutcome::Succeeded {
                run.resets_failed.push(about(&d.url, &message));
            }
            continue;
        }
        let verified = match (direction, evidence) {
            (Direction::Fence, Some((kind, observed))) => {
                run.evidence.push(Evidence {
                    level,
                    device: d.url.clone(),
                    kind,
                    observed,
                    at: now(),
                });
                true
            }
            (Direction::Recover, _) => outcome == AttemptOutcome::Succeeded,
            (Direction::Fence, None) => false,
        };
        if !verified {
            run.failure = Some(about(&d.url, &message));
            break;
        }
    }
    run
}

/// `message` naming the device `url` once: a device's errors usually begin with it already.
fn about(url: &str, message: &str) -> String {
    if message.starts_with(url) {
        message.to_string()
    } else {
        format!("{url}: {message}")
    }
}

/// Runs one fencing level: every device must be commanded and verified. Stops at the first
/// failure. `ids` names this step of the `NodeFence` (its idempotency key is derived from it) and
/// the fence's storage hold.
pub async fn run_level(
    ctx: &Ctx,
    node: &str,
    level: i32,
    devices: &[PlannedDevice],
    token: i64,
    reset: bool,
    ids: &StepIds,
) -> LevelRun {
    drive(
        ctx,
        node,
        level,
        devices,
        Direction::Fence,
        reset,
        token,
        ids,
    )
    .await
}

/// Recovery: powers on (power devices) or lifts the storage block (storage devices). Returns
/// the attempts; `Err` when any device failed.
pub async fn recover(
    ctx: &Ctx,
    node: &str,
    level: i32,
    devices: &[PlannedDevice],
    token: i64,
    ids: &StepIds,
) -> (Vec<DeviceAttempt>, Result<(), String>) {
    let run = drive(
        ctx,
        node,
        level,
        devices,
        Direction::Recover,
        false,
        token,
        ids,
    )
    .await;
    (run.attempts, run.failure.map_or(Ok(()), Err))
}

/// Re-reads the power state of a power device that proved a fence off, before a release
/// ([`palisade_decide::phase::Step::RecheckPower`]): what it read, and the device's answer (or
/// why it could not be read) in words.
///
/// Guarantees: a read only, never a power command; a direct BMC is pinned to the Node's system
/// UUID as for the fence; the read is bounded by the device's budget, and anything but a
/// clean `off` or `on` (no answer, an error, a state neither on nor off, a device that is not
/// a power device) is `Unknown`. The caller's leadership (`token`) is checked before the read.
pub async fn read_power(
    ctx: &Ctx,
    node: &str,
    d: &PlannedDevice,
    token: i64,
) -> (palisade_model::nodefence::RecheckedPower, String) {
    use palisade_fence::PowerState;
    use palisade_model::nodefence::RecheckedPower;
    let budget = budget_of(d);
    // A stand-in's words, for the answer (the read itself is bounded as one future).
    let stand_in = std::sync::OnceLock::new();
    let read = async {
        ctx.leader
            .check(token)
            .await
            .map_err(AttemptError::Leadership)?;
        match (d.kind, DeviceScheme::of(&d.url)) {
            (DeviceKind::Power, Some(DeviceScheme::Bridge)) => {
                Ok(listed_bridge(ctx, node, d, token).await?.status().await?)
            }
            (
                DeviceKind::Power,
                Some(DeviceScheme::Ipmi | DeviceScheme::SnmpPdu | DeviceScheme::Redfish),
            ) => {
                let listed = listed(ctx, node, &d.url, d.kind).await?;
                let expected = node_identity(ctx, node);
                let device =
                    power_device(&listed.url, &listed.secret, budget, expected.as_deref())?;
                if let Some(why) = listed.stand_in {
                    let _ = stand_in.set(why);
                }
                Ok(device.status().await?)
            }
            (kind, scheme) => Err(AttemptError::Unsupported(format!(
                "no power read for a {kind:?} device with scheme {scheme:?}"
            ))),
        }
    };
    let (state, words) = bounded_power_read(&d.url, budget, read).await;
    let words = match stand_in.into_inner() {
        Some(why) => format!("{words} ({why})"),
        None => words,
    };
    let read = match state {
        PowerState::Off => RecheckedPower::Off,
        PowerState::On => RecheckedPower::On,
        PowerState::Unknown => RecheckedPower::Unknown,
    };
    (read, words)
}

/// Runs a power read within `budget`: the state read, in words naming the device (redacted),
/// and [`palisade_fence::PowerState::Unknown`] for anything but a clean answer (no answer, an
/// error, a state neither on nor off).
async fn bounded_power_read(
    url: &str,
    budget: Duration,
    read: impl std::future::Future<Output = Result<palisade_fence::PowerState, AttemptError>>,
) -> (palisade_fence::PowerState, String) {
    use palisade_fence::PowerState;
    let url = palisade_model::target::redact_url(url);
    match tokio::time::timeout(budget, read).await {
        Ok(Ok(PowerState::Off)) => (PowerState::Off, format!("{url} reads power off")),
        Ok(Ok(PowerState::On)) => (PowerState::On, format!("{url} reads power ON")),
        Ok(Ok(PowerState::Unknown)) => (
            PowerState::Unknown,
            format!("{url} reads a power state neither on nor off"),
        ),
        Ok(Err(e)) => (
            PowerState::Unknown,
            format!("{url} could not be read: {}", e.message()),
        ),
        Err(_) => (
            PowerState::Unknown,
            format!("{url} could not be read: no answer within {budget:?}"),
        ),
    }
}

/// Whether a direct BMC at `url` would be pinned to a machine's identity for `node`: by a
/// `guid=`/`uuid=` in the URL, or by the Node's system UUID (and the two agree).
pub fn identity_pinned(ctx: &Ctx, node: &str, url: &str) -> bool {
    let expected = node_identity(ctx, node);
    Target::parse(url).ok().is_some_and(|mut t| {
        pin_identity(url, &mut t, expected.as_deref()).is_ok()
            && match &t {
                Target::Ipmi(i) => i.system_guid.is_some(),
                Target::Redfish(r) => r.system_uuid.is_some(),
                _ => false,
            }
    })
}

/// One read of a power device for the power watch ([`crate::power`]): `Off` or `On` only from
/// a direct IPMI or Redfish device pinned to the machine's identity (by its URL or by the
/// Node's system UUID), with the device's answer in words.
///
/// Guarantees: a read only, never a power command, bounded by `budget`; a PDU outlet, a
/// `bridge://` device (the controller cannot see the bridge's identity pin), an unpinned BMC,
/// a storage device, no answer, an error or a state neither on nor off all read
/// [`palisade_decide::power::PowerReading::Unknown`], which is never evidence.
pub async fn watch_read(
    ctx: &Ctx,
    node: &str,
    d: &palisade_model::target::FenceDevice,
    secret: &BTreeMap<String, String>,
    budget: Duration,
) -> (palisade_decide::power::PowerReading, String) {
    use palisade_decide::power::PowerReading;
    let url = palisade_model::target::redact_url(&d.url);
    if !d.is_direct_bmc() {
        return (
            PowerReading::Unknown,
            format!("{url}: not a direct BMC (no identity to pin): never power evidence"),
        );
    }
    pinned_read(ctx, node, &d.url, secret, budget).await
}

/// One read of the direct BMC at `url` pinned to the machine's identity (by the URL or by the
/// Node's system UUID): `Off` or `On` only when it answered as that machine.
///
/// Guarantees: a read only, bounded by `budget`; a BMC that cannot be pinned reads
/// [`palisade_decide::power::PowerReading::Unknown`] without being asked anything.
async fn pinned_read(
    ctx: &Ctx,
    node: &str,
    url: &str,
    secret: &BTreeMap<String, String>,
    budget: Duration,
) -> (palisade_decide::power::PowerReading, String) {
    use palisade_decide::power::PowerReading;
    use palisade_fence::PowerState;
    let expected = node_identity(ctx, node);
    if !identity_pinned(ctx, node, url) {
        return (
            PowerReading::Unknown,
            format!("{}: not pinned to the machine's identity (no Node system UUID, no pin in the URL): never power evidence", palisade_model::target::redact_url(url)),
        );
    }
    let read = async {
        let device = power_device(url, secret, budget, expected.as_deref())?;
        Ok::<_, AttemptError>(device.status().await?)
    };
    let (state, words) = bounded_power_read(url, budget, read).await;
    let reading = match state {
        PowerState::Off => PowerReading::Off,
        PowerState::On => PowerReading::On,
        PowerState::Unknown => PowerReading::Unknown,
    };
    (reading, words)
}

/// Under `powerWithoutIdentity: AfterProof`: before the device `d`, which cannot prove which
/// machine it powers, acts, one of the direct BMCs it names
/// ([`PlannedDevice::identity_from`]) must answer as the node's machine.
///
/// Guarantees: `Ok` only after a BMC pinned to the machine's identity answered a read (the
/// fence crate checks the pin before reading); with no requirement, `Ok` without reading.
/// Nothing is commanded here. Asked before a power-off only: the recovery's power-on follows a
/// power-off this fence proved, and the BMC of a machine whose outlet is off is dark.
/// A `bridge://` device is checked the same way; the bridge's own pin, if it has one, is
/// checked by the bridge.
async fn prove_identity(ctx: &Ctx, node: &str, d: &PlannedDevice) -> Result<(), AttemptError> {
    let Some(provers) = &d.identity_from else {
        return Ok(());
    };
    let budget = budget_of(d);
    let mut tried = Vec::new();
    for url in provers {
        let listed = match listed(ctx, node, url, DeviceKind::Power).await {
            Ok(l) => l,
            Err(e) => {
                tried.push(format!("{}: {e}", palisade_model::target::redact_url(url)));
                continue;
            }
        };
        let (reading, words) = pinned_read(ctx, node, &listed.url, &listed.secret, budget).await;
        let words = listed.say(words);
        if reading != palisade_decide::power::PowerReading::Unknown {
            tracing::info!(node, device = %palisade_model::target::redact_url(&d.url), proof = %words, "identity proven before a device without one acts");
            return Ok(());
        }
        tried.push(words);
    }
    Err(AttemptError::IdentityUnproven {
        device: palisade_model::target::redact_url(&d.url),
        why: if tried.is_empty() {
            "the FenceTarget names no direct IPMI or Redfish BMC to prove the machine".into()
        } else {
            format!(
                "no BMC answered as the Node's machine ({})",
                tried.join("; ")
            )
        },
    })
}

/// A readiness probe of one device: a read only (power state, storage state), never an action.
/// Returns what the device reported, or why it could not be read.
///
/// Guarantees: no power or storage action is ever sent; credentials are read from the
/// device's Secret as for a fence, and the returned text never contains them.
pub async fn probe(
    ctx: &Ctx,
    node: &str,
    d: &palisade_model::target::FenceDevice,
) -> Result<String, String> {
    use palisade_fence::PowerDevice;
    let budget = Duration::from_secs(u64::try_from(d.timeout_seconds).unwrap_or(20).clamp(1, 600));
    let read = async {
        let secret = match &d.credentials_secret_ref {
            Some(r) => read_secret(ctx, r).await?,
            None => BTreeMap::new(),
        };
        let scheme = palisade_model::target::DeviceScheme::of(&d.url);
        Ok::<_, AttemptError>(match (scheme, d.kind) {
            (Some(DeviceScheme::Bridge), DeviceKind::Power) => {
                let dev = bridge_device(ctx, &d.url, 0)?;
                format!("power {:?}", dev.status().await?)
            }
            (Some(DeviceScheme::Bridge), DeviceKind::Storage) => {
                let dev = bridge_device(ctx, &d.url, 0)?;
                format!("storage {:?}", dev.storage_status().await?)
            }
            (Some(DeviceScheme::StorageFirewall), _) => {
                let fw = storage_client(&d.url, &secret)?;
                let n = storage_node(ctx, node).await?;
                format!("storage {:?}", fw.status(&n).await?)
            }
            (Some(DeviceScheme::SnmpPdu), _) => {
                let dev = power_device(&d.url, &secret, budget, None)?;
                format!(
                    "power {:?} (a PDU outlet has no identity to read: nothing proves which machine it powers)",
                    dev.status().await?
                )
            }
            _ => {
                let expected = node_identity(ctx, node);
                let dev = power_device(&d.url, &secret, budget, expected.as_deref())?;
                format!("power {:?}", dev.status().await?)
            }
        })
    };
    match tokio::time::timeout(budget, read).await {
        Ok(r) => r.map_err(|e| e.message()),
        Err(_) => Err(format!("no answer within {budget:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_its_device_once() {
        let url = "bridge://127.0.0.1:44881/m0";
        assert_eq!(
            about(
                url,
                "bridge://127.0.0.1:44881/m0: unreachable: connection refused"
            ),
            "bridge://127.0.0.1:44881/m0: unreachable: connection refused"
        );
        assert_eq!(
            about(url, "power off timed out after 20s"),
            "bridge://127.0.0.1:44881/m0: power off timed out after 20s"
        );
    }

    #[test]
    fn the_outcome_of_a_failed_attempt_comes_from_the_error_type_not_its_text() {
        use palisade_fence::FenceError;
        let stale = AttemptError::from(FenceError::StaleFencingToken {
            device: "bridge://127.0.0.1:1/m0".into(),
            detail: "token 1 is below 2".into(),
            seen_token: Some(2),
        });
        assert_eq!(stale.outcome(), AttemptOutcome::StaleToken);
        assert_eq!(stale.seen_token(), Some(2));
        let old_bridge = AttemptError::from(FenceError::StaleFencingToken {
            device: "bridge://127.0.0.1:1/m0".into(),
            detail: "stale fencing token 1: target m0 has already seen token 2".into(),
            seen_token: None,
        });
        assert_eq!(old_bridge.seen_token(), None, "never read from the words");
        assert!(
            stale.message().ends_with("(stale_fencing_token)"),
            "{}",
            stale.message()
        );
        // A device whose refusal merely reads like a stale token is a failed attempt.
        let lookalike = AttemptError::from(FenceError::DeviceRefused {
            device: "ipmi://127.0.0.1:1".into(),
            detail: "(stale_fencing_token)".into(),
        });
        assert_eq!(lookalike.outcome(), AttemptOutcome::Failed);
        assert_eq!(
            AttemptError::TermEnded { token: 3 }.outcome(),
            AttemptOutcome::StaleToken
        );
        assert_eq!(
            AttemptError::Leadership(Error::NotLeader { token: Some(4) }).outcome(),
            AttemptOutcome::StaleToken
        );
        let late = AttemptError::TimedOut {
            what: "power off",
            budget: Duration::from_secs(20),
        };
        assert_eq!(late.outcome(), AttemptOutcome::TimedOut);
        let dark = AttemptError::from(FenceError::Timeout {
            device: "ipmi://127.0.0.1:1".into(),
            operation: "get channel authentication capabilities".into(),
            after: Duration::from_secs(5),
        });
        assert_eq!(dark.outcome(), AttemptOutcome::TimedOut);
        let unreachable = AttemptError::from(FenceError::Unreachable {
            device: "redfish://127.0.0.1:1".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        });
        assert_eq!(unreachable.outcome(), AttemptOutcome::TimedOut);
        assert_eq!(late.message(), "no verified power off within 20s");
    }

    #[test]
    fn an_attempt_message_keeps_the_whole_source_chain() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "code": 403,
            "reason": "Forbidden",
            "message": "secrets \"bmc-m0\" is forbidden: User \"palisade\" cannot get resource"
        }))
        .expect("a Status");
        let e = AttemptError::from(Error::Secret {
            namespace: "palisade-system".into(),
            name: "bmc-m0".into(),
            source: kube::Error::Api(Box::new(status)),
        });
        assert_eq!(e.outcome(), AttemptOutcome::Failed);
        let m = e.message();
        assert!(
            m.starts_with("secret palisade-system/bmc-m0: cannot read: "),
            "{m}"
        );
        assert!(
            m.contains("is forbidden"),
            "the API server's reason is kept: {m}"
        );
    }

    #[test]
    fn step_keys_fit_the_bridge_header_and_differ_per_action() {
        let step = format!(
            "nf-{}-t{}-a{}",
            "0f8d3a52-5b1e-4c4a-9d7e-6a1b2c3d4e5f",
            i64::MAX,
            99
        );
        let off = step_key(&step, 9, 7, DeviceAction::PowerOff);
        let on = step_key(&step, 9, 7, DeviceAction::PowerOn);
        assert_ne!(off, on);
        assert!(off.len() <= 128, "{} characters: {off}", off.len());
        assert!(off.bytes().all(|c| c.is_ascii_graphic()), "{off}");
    }

    #[test]
    fn long_bridge_evidence_is_shortened_on_a_char_boundary() {
        let long = "é".repeat(700);
        let s = short(&long);
        assert_eq!(s.chars().count(), 601);
        assert!(s.ends_with('…'));
        assert_eq!(short("{}"), "{}");
    }
}
