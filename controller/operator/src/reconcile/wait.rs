//! What a fence that waits, or is held, records: a verdict label and message in its status
//! and one Event, each once per label (a wait is re-read every tick, and recorded only when
//! it changes).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use palisade_decide::phase::{IdentityFrom, WaitFor, UNTAINT_SETTLE_MARGIN};
use palisade_decide::record::FENCING_WAIT;
use palisade_decide::{HoldReason, Verdict};
use palisade_model::advertise::Advertisement;
use palisade_model::nodefence::{NodeFenceStatus, VerdictRecord};
use palisade_model::NodeFence;

use super::{event, persist, persist_then_tell};
use crate::error::Error;
use crate::events::Kind;
use crate::Ctx;

/// A fence held by a guard ([`palisade_decide::Step::Hold`]): recorded and told once.
pub(super) async fn record_hold(
    ctx: &Ctx,
    api: &Api<NodeFence>,
    nf: &NodeFence,
    mut status: NodeFenceStatus,
    step: &str,
    reason: &HoldReason,
    at: Timestamp,
) -> Result<(), Error> {
    let held = format!("hold_{}", reason.label());
    if status.verdict.as_ref().map(|v| v.label.as_str()) == Some(held.as_str()) {
        return Ok(());
    }
    let message = reason.to_string();
    status.verdict = Some(VerdictRecord {
        label: held,
        message: message.clone(),
        at: MicroTime(at),
    });
    persist_then_tell(
        ctx,
        api,
        nf,
        status,
        step,
        (
            Kind::Warning,
            &format!("Held{}", crate::detect::camel(reason.label())),
            &message,
        ),
    )
    .await?;
    Ok(())
}

/// What a fence waits for ([`palisade_decide::Step::Wait`]), with what its words are made of.
pub(super) struct Waiting<'a> {
    /// The fenced node.
    pub node: &'a str,
    /// What it waits for.
    pub why: &'a WaitFor,
    /// Until when, if known.
    pub until: Option<Timestamp>,
    /// The node's latest verdict.
    pub verdict: Option<&'a Verdict>,
    /// The node's latest advertisement.
    pub advertised: &'a Advertisement,
    /// Now.
    pub at: Timestamp,
}

/// Records a wait in the status (and tells it, for the waits an operator must see), once per
/// label.
pub(super) async fn record_wait(
    ctx: &Ctx,
    api: &Api<NodeFence>,
    nf: &NodeFence,
    mut status: NodeFenceStatus,
    w: Waiting<'_>,
) -> Result<(), Error> {
    let Waiting {
        node,
        why,
        until,
        verdict,
        advertised,
        at,
    } = w;
    let (label, message, tell): (String, String, Option<(Kind, &str)>) = if let Some((
        label,
        kind,
        reason,
        message,
    )) =
        untaint_wait(node, why, until)
    {
        (label, message, Some((kind, reason)))
    } else if *why == WaitFor::NodeExists {
        let fails_at = until.map(|t| t.to_string()).unwrap_or_default();
        (
                "node_not_found".to_string(),
                format!("no Node named {node} exists; this fence fails with NodeNotFound at {fails_at} unless it registers"),
                Some((Kind::Warning, "NodeNotFound")),
            )
    } else if matches!(why, WaitFor::SelfFence | WaitFor::HealthyMajority) {
        let (label, message) = fencing_wait(ctx, node, why, until, advertised);
        let tell = (*why == WaitFor::HealthyMajority)
            .then_some((Kind::Warning, "WaitingForHealthyMajority"));
        (label, message, tell)
    } else if let (WaitFor::Verdict(label), Some(v)) = (why, verdict) {
        (label.clone(), v.message(), None)
    } else {
        return Ok(());
    };
    if status.verdict.as_ref().map(|r| &r.label) == Some(&label) {
        return Ok(());
    }
    status.verdict = Some(VerdictRecord {
        label: label.clone(),
        message: message.clone(),
        at: MicroTime(at),
    });
    persist(api, nf, status, &label).await?;
    if let Some((kind, reason)) = tell {
        event(ctx, nf, kind, reason, &message).await;
    }
    Ok(())
}

/// What a self-fence level waits for, as a verdict label and a message an operator can act on
/// (recorded in the status once per label, and named when the fence's budget runs out).
fn fencing_wait(
    ctx: &Ctx,
    node: &str,
    why: &WaitFor,
    until: Option<Timestamp>,
    advertised: &Advertisement,
) -> (String, String) {
    if *why == WaitFor::SelfFence {
        let at = until.map_or_else(|| "an unknown time".to_string(), |t| t.to_string());
        return (
            format!("{FENCING_WAIT}self_fence"),
            format!("waiting out node {node}'s self-fence: trusted at {at} (its self-fence timeout, watchdog timeout and the policy's margin after the last renewal this controller saw, on its own clock)"),
        );
    }
    let label = format!("{FENCING_WAIT}healthy_majority");
    let Some(peer) = advertised.peer_check else {
        return (
            label,
            format!("waiting for a healthy majority for node {node}'s self-fence"),
        );
    };
    let members = peer
        .members
        .and_then(|m| ctx.memory.lock().members.get(m).cloned());
    let Some(members) = members else {
        return (label, format!("waiting for a healthy majority: node {node}'s peer check counts a Node set this controller never saw, so its self-fence earns no trust (fence it through a FenceTarget level, or confirm it is off and create a NodeFence by hand)"));
    };
    let healthy: Vec<String> = ctx
        .memory
        .lock()
        .streaks
        .healthy_among(&members, ctx.now().mono)
        .into_iter()
        .map(str::to_string)
        .collect();
    let window = palisade_model::advertise::PeerCheck::healthy_window(peer.vouch_after);
    (
        label,
        format!(
            "waiting for a healthy majority: node {node} runs a peer check, so its self-fence is trusted only after this controller has seen a strict majority of the {n} Nodes it counts ({all}) renew without a break (need {need}; healthy now: [{healthy}]); a node counts healthy only while its Lease writes follow each other within {window:?} (--peer-vouch-after minus 4 s)",
            n = members.len(),
            all = members.iter().collect::<Vec<_>>().join(", "),
            need = members.len() / 2 + 1,
            healthy = healthy.join(", "),
        ),
    )
}

/// The status label and Event (reason, message) of a recovery wait on the untaint or on the
/// machine identity (recorded and told once per label), or `None` for any other wait.
fn untaint_wait(
    node: &str,
    why: &WaitFor,
    until: Option<Timestamp>,
) -> Option<(String, Kind, &'static str, String)> {
    let (label, kind, reason, message) = match why {
        WaitFor::Untaint => ("recovery_untaint", Kind::Normal, "WaitingForUntaint", format!("node {node}: the release taints this fence removed are still on the observed Node; the storage block stays")),
        WaitFor::ForeignOutOfService(key) => ("recovery_foreign_out_of_service", Kind::Warning, "ForeignOutOfServiceTaint", format!("node {node} carries taint {key}, which this fence did not add and never removes; Kubernetes may still force-delete pods and force-detach volumes because of it, so the storage block stays until it is gone (its owner removes it)")),
        WaitFor::AttachmentsSettle(names) => ("recovery_attachments_settle", Kind::Normal, "WaitingForAttachments", format!("node {node}: VolumeAttachment(s) {} are being deleted or detached; the storage block stays until they settle", names.join(", "))),
        WaitFor::IdentityMismatch { pinned, found, from } => ("recovery_identity_mismatch", Kind::Warning, "IdentityMismatch", format!("node {node}: this fence pinned machine {pinned} (the Node's systemUUID when it started), but {} {}; no recovery answer counts until machine {pinned} answers (or a person confirms the node clean), so the storage block and the taints stay", match from { IdentityFrom::Node => "the Node now reports systemUUID", IdentityFrom::Answer => "the renewal that answered the recovery challenge advertises machine" }, found.as_deref().unwrap_or("none (an agent that does not advertise its machine)"))),
        WaitFor::UntaintMargin => ("recovery_untaint_margin", Kind::Normal, "UntaintSettling", format!("node {node}: untaint observed; the storage block stays until {} ({} s margin for lagging pod-GC and attach-detach caches)", until.map(|t| t.to_string()).unwrap_or_default(), UNTAINT_SETTLE_MARGIN.as_secs())),
        _ => return None,
    };
    Some((label.to_string(), kind, reason, message))
}
