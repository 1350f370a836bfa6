//! Fencing devices: the controller's hands.
//!
//! A planned device (URL + kind, from the `NodeFence` plan) is matched with its `FenceTarget`
//! entry for the credential Secret reference, the credentials are read from the Secret (never
//! logged, never in argv), and the action runs through `palisade-fence` (IPMI, SNMP PDU) or
//! `palisade-storagefw` (storage firewall), bounded by the device's timeout.
//!
//! Guarantees: evidence is produced only from `palisade_fence::VerifiedOff` (the device reported
//! the power off after the command) or `palisade_storagefw::VerifiedBlocked` (the storage reported
//! the node blocked); a commanded but unverified action is a failed attempt. Before every device
//! action the leadership is re-checked against the Lease with the fencing token
//! ([`crate::leader::Leadership::check`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use palisade_fence::{Credentials, Device, DeviceOptions, PowerDevice, Target};
use palisade_model::nodefence::{
    AttemptOutcome, DeviceAction, DeviceAttempt, Evidence, EvidenceKind, PlannedDevice,
};
use palisade_model::target::{DeviceKind, DeviceScheme, SecretRef};
use palisade_model::FenceTarget;

use crate::error::Error;
use crate::Ctx;

/// The result of running one level.
#[derive(Debug, Default)]
pub struct LevelRun {
    /// Every attempt, in order.
    pub attempts: Vec<DeviceAttempt>,
    /// Evidence, one per verified device.
    pub evidence: Vec<Evidence>,
    /// `None` when every device was verified; otherwise why the level failed.
    pub failure: Option<String>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// Reads the Secret values a device needs, keyed by role (`password`, `community`,
/// `authPassword`, `privPassword`, `caBundle`, `token`). A `SecretRef.keys` entry maps a role to
/// another key; otherwise the role name is the key.
pub async fn read_secret(ctx: &Ctx, r: &SecretRef) -> Result<BTreeMap<String, String>, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &r.namespace);
    let secret = api.get(&r.name).await.map_err(|e| Error::Secret {
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        message: format!("cannot read: {e}"),
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

async fn secret_for(ctx: &Ctx, node: &str, url: &str) -> Result<BTreeMap<String, String>, Error> {
    let api: Api<FenceTarget> = Api::all(ctx.client.clone());
    let target = api
        .get(node)
        .await
        .map_err(|e| Error::kube(format!("reading FenceTarget {node}"), e))?;
    let device = target
        .spec
        .levels
        .iter()
        .flat_map(|l| &l.devices)
        .find(|d| d.url == url)
        .ok_or_else(|| Error::Device {
            device: url.to_string(),
            message: format!("no longer listed in FenceTarget {node}"),
        })?;
    match &device.credentials_secret_ref {
        Some(r) => read_secret(ctx, r).await,
        None => Ok(BTreeMap::new()),
    }
}

fn power_device(url: &str, secret: &BTreeMap<String, String>) -> Result<Device, Error> {
    let dev = |message: String| Error::Device {
        device: url.to_string(),
        message,
    };
    let target = Target::parse(url).map_err(|e| dev(e.to_string()))?;
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
    Device::new(target, &creds, DeviceOptions::default()).map_err(|e| dev(e.to_string()))
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
) -> Result<palisade_storagefw::StorageFirewall, Error> {
    let dev = |message: String| Error::Device {
        device: url.to_string(),
        message,
    };
    let target = palisade_storagefw::Target::parse(url).map_err(|e| dev(e.to_string()))?;
    let ca = secret
        .get("caBundle")
        .ok_or_else(|| dev("credential Secret has no caBundle".into()))?;
    let mut cfg = palisade_storagefw::StorageFwConfig::new(target, ca.as_bytes().to_vec())
        .map_err(|e| dev(e.to_string()))?;
    cfg.token = secret
        .get("token")
        .map(|t| palisade_storagefw::Secret::new(t.trim_end_matches('\n')));
    palisade_storagefw::StorageFirewall::new(cfg).map_err(|e| dev(e.to_string()))
}

/// What one device did.
struct Outcome {
    action: DeviceAction,
    outcome: AttemptOutcome,
    message: String,
    evidence: Option<(EvidenceKind, String)>,
}

async fn fence_one(ctx: &Ctx, node: &str, d: &PlannedDevice, token: i64) -> Outcome {
    let budget = Duration::from_secs(u64::try_from(d.timeout_seconds).unwrap_or(20).max(1));
    let action = match d.kind {
        DeviceKind::Power => DeviceAction::PowerOff,
        DeviceKind::Storage => DeviceAction::Block,
    };
    let fail = |outcome: AttemptOutcome, message: String| Outcome {
        action,
        outcome,
        message,
        evidence: None,
    };
    if let Err(e) = ctx.leader.check(token).await {
        return fail(AttemptOutcome::StaleToken, e.to_string());
    }
    let secret = match secret_for(ctx, node, &d.url).await {
        Ok(s) => s,
        Err(e) => return fail(AttemptOutcome::Failed, e.to_string()),
    };
    match (d.kind, DeviceScheme::of(&d.url)) {
        (DeviceKind::Power, Some(DeviceScheme::Ipmi | DeviceScheme::SnmpPdu)) => {
            let device = match power_device(&d.url, &secret) {
                Ok(dv) => dv,
                Err(e) => return fail(AttemptOutcome::Failed, e.to_string()),
            };
            match tokio::time::timeout(budget, device.off()).await {
                Err(_) => fail(AttemptOutcome::TimedOut, format!("no verified power off within {budget:?}")),
                Ok(Err(e)) => fail(AttemptOutcome::Failed, format!("{} ({})", e, e.kind())),
                Ok(Ok(v)) => Outcome {
                    action,
                    outcome: AttemptOutcome::Succeeded,
                    message: format!(
                        "power off commanded and verified in {:?}",
                        v.command_to_verified()
                    ),
                    evidence: Some((
                        EvidenceKind::PowerOff,
                        format!(
                            "{} reported chassis power off after {} status poll(s), {:?} after the command",
                            v.device(),
                            v.polls(),
                            v.command_to_verified()
                        ),
                    )),
                },
            }
        }
        (DeviceKind::Storage, Some(DeviceScheme::StorageFirewall)) => {
            let client = match storage_client(&d.url, &secret) {
                Ok(c) => c,
                Err(e) => return fail(AttemptOutcome::Failed, e.to_string()),
            };
            let nodes: Api<Node> = Api::all(ctx.client.clone());
            let n = nodes.get_opt(node).await.ok().flatten();
            let noderef = match palisade_storagefw::NodeRef::new(node, node_addresses(n.as_ref())) {
                Ok(r) => r,
                Err(e) => return fail(AttemptOutcome::Failed, e.to_string()),
            };
            match tokio::time::timeout(budget, client.block(&noderef)).await {
                Err(_) => fail(
                    AttemptOutcome::TimedOut,
                    format!("no verified block within {budget:?}"),
                ),
                Ok(Err(e)) => fail(AttemptOutcome::Failed, e.to_string()),
                Ok(Ok(v)) => Outcome {
                    action,
                    outcome: AttemptOutcome::Succeeded,
                    message: "storage block commanded and verified".into(),
                    evidence: Some((
                        EvidenceKind::StorageBlocked,
                        format!(
                            "{} reports node {} blocked: {}",
                            v.endpoint(),
                            v.node(),
                            v.status()
                        ),
                    )),
                },
            }
        }
        (kind, scheme) => fail(
            AttemptOutcome::Failed,
            format!("no agent for a {kind:?} device with scheme {scheme:?} in this controller"),
        ),
    }
}

/// Runs one level: every device must be commanded and verified. Stops at the first failure.
pub async fn run_level(
    ctx: &Ctx,
    node: &str,
    level: i32,
    devices: &[PlannedDevice],
    token: i64,
) -> LevelRun {
    let mut run = LevelRun::default();
    for d in devices {
        let o = fence_one(ctx, node, d, token).await;
        tracing::info!(node, level, device = %d.url, outcome = ?o.outcome, message = %o.message, "device attempt");
        run.attempts.push(DeviceAttempt {
            level,
            device: d.url.clone(),
            action: o.action,
            outcome: o.outcome,
            token,
            at: now(),
            message: o.message.clone(),
        });
        match o.evidence {
            Some((kind, observed)) => run.evidence.push(Evidence {
                level,
                device: d.url.clone(),
                kind,
                observed,
                at: now(),
            }),
            None => {
                run.failure = Some(format!("{}: {}", d.url, o.message));
                break;
            }
        }
    }
    run
}

/// Recovery: powers on (power devices) or lifts the storage block (storage devices). Returns
/// the attempts; `Err` when any device failed.
pub async fn recover(
    ctx: &Ctx,
    node: &str,
    level: i32,
    devices: &[PlannedDevice],
    token: i64,
) -> (Vec<DeviceAttempt>, Result<(), String>) {
    let mut attempts = Vec::new();
    for d in devices {
        let budget = Duration::from_secs(u64::try_from(d.timeout_seconds).unwrap_or(20).max(1));
        let action = match d.kind {
            DeviceKind::Power => DeviceAction::PowerOn,
            DeviceKind::Storage => DeviceAction::Unblock,
        };
        let result: Result<String, (AttemptOutcome, String)> = async {
            ctx.leader
                .check(token)
                .await
                .map_err(|e| (AttemptOutcome::StaleToken, e.to_string()))?;
            let secret = secret_for(ctx, node, &d.url)
                .await
                .map_err(|e| (AttemptOutcome::Failed, e.to_string()))?;
            match d.kind {
                DeviceKind::Power => {
                    let dev = power_device(&d.url, &secret)
                        .map_err(|e| (AttemptOutcome::Failed, e.to_string()))?;
                    match tokio::time::timeout(budget, dev.on()).await {
                        Err(_) => Err((AttemptOutcome::TimedOut, "no verified power on".into())),
                        Ok(Err(e)) => Err((AttemptOutcome::Failed, e.to_string())),
                        Ok(Ok(v)) => Ok(format!(
                            "power on verified in {:?}",
                            v.command_to_verified()
                        )),
                    }
                }
                DeviceKind::Storage => {
                    let client = storage_client(&d.url, &secret)
                        .map_err(|e| (AttemptOutcome::Failed, e.to_string()))?;
                    let nodes: Api<Node> = Api::all(ctx.client.clone());
                    let n = nodes.get_opt(node).await.ok().flatten();
                    let noderef =
                        palisade_storagefw::NodeRef::new(node, node_addresses(n.as_ref()))
                            .map_err(|e| (AttemptOutcome::Failed, e.to_string()))?;
                    match tokio::time::timeout(budget, client.unblock(&noderef)).await {
                        Err(_) => Err((AttemptOutcome::TimedOut, "no verified unblock".into())),
                        Ok(Err(e)) => Err((AttemptOutcome::Failed, e.to_string())),
                        Ok(Ok(_)) => Ok("storage unblock verified".into()),
                    }
                }
            }
        }
        .await;
        let (outcome, message, ok) = match result {
            Ok(m) => (AttemptOutcome::Succeeded, m, true),
            Err((o, m)) => (o, m, false),
        };
        attempts.push(DeviceAttempt {
            level,
            device: d.url.clone(),
            action,
            outcome,
            token,
            at: now(),
            message: message.clone(),
        });
        if !ok {
            return (attempts, Err(format!("{}: {message}", d.url)));
        }
    }
    (attempts, Ok(()))
}
