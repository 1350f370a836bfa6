//! The start of a fence: the last checks before anything is fenced, made under the start
//! gate from the API itself.
//!
//! Guarantees:
//! - the leader never fences the node it runs on: it hands leadership over first;
//! - the finalizer is on the `NodeFence` before anything is fenced;
//! - two workers never both start past `maxConcurrent` or a per-domain limit, and a fence
//!   never starts beside an older unfinished fence of its node, counted from a fresh LIST
//!   (the decision read the watch cache, which may lag behind a fence created a moment ago).

use kube::runtime::reflector::ObjectRef as StoreRef;
use kube::{Api, ResourceExt};
use palisade_model::nodefence::Phase;
use palisade_model::NodeFence;

use super::{event, has_finalizer, set_finalizer};
use crate::error::Error;
use crate::events::Kind;
use crate::Ctx;

/// Whether a fence may start now.
pub(super) enum Start<'a> {
    /// Yes: hold the gate until the start is persisted.
    Go(tokio::sync::MutexGuard<'a, ()>),
    /// Not in this activation.
    Stop,
    /// The fence changed (its finalizer was added): decide again.
    Again,
}

/// The checks before fence `nf` starts under fencing token `token` (see the module).
pub(super) async fn may_start<'a>(
    ctx: &'a Ctx,
    api: &Api<NodeFence>,
    nf: &NodeFence,
    token: i64,
    policy: Option<&palisade_model::FencingPolicySpec>,
) -> Result<Start<'a>, Error> {
    let node = &nf.spec.node_name;
    let name = nf.name_any();
    if palisade_decide::guard::own_node(node, ctx.settings.node_name.as_deref())
        == palisade_decide::guard::OwnNode::HandOver
    {
        let msg = format!(
            "node {node} runs this leader ({}): handing leadership over before anything is fenced",
            ctx.settings.identity
        );
        tracing::warn!(nodefence = name, "{msg}");
        event(ctx, nf, Kind::Warning, "LeaderOnTarget", &msg).await;
        ctx.leader
            .hand_over(token, ctx.settings.lease_duration.saturating_mul(2))
            .await?;
        return Ok(Start::Stop);
    }
    if !has_finalizer(nf) {
        // Before anything is fenced: from here on the fence holds the node.
        set_finalizer(api, nf, true).await?;
        return Ok(Start::Again);
    }
    let gate = ctx.start_gate.lock().await;
    // Under the gate, from the API: an older unfinished fence of this node, or a limit
    // reached, and this one does not start. The next round, once the cache holds the
    // sibling, supersedes it.
    let fresh = fresh_fences(api).await?;
    if let Some(older) = older_among(&fresh, nf) {
        tracing::info!(nodefence = name, %older, "not starting: an older unfinished fence of the node exists (read from the API)");
        return Ok(Start::Stop);
    }
    if let Some(why) = policy.and_then(|p| at_limit(ctx, &fresh, nf, p)) {
        tracing::info!(nodefence = name, %why, "not starting: limit reached (counted from the API)");
        return Ok(Start::Stop);
    }
    Ok(Start::Go(gate))
}

/// Whether starting `nf` now would exceed the policy's `maxConcurrent` or its per-domain
/// limit, counted from a fresh LIST of NodeFences (the decision counted from the cache, which
/// can lag behind fences another worker just started).
fn at_limit(
    ctx: &Ctx,
    all: &[NodeFence],
    nf: &NodeFence,
    policy: &palisade_model::FencingPolicySpec,
) -> Option<String> {
    let in_flight: Vec<&NodeFence> = all
        .iter()
        .filter(|f| f.name_any() != nf.name_any())
        .filter(|f| {
            matches!(
                crate::detect::phase_of(f),
                Phase::Fencing | Phase::Fenced | Phase::Releasing
            )
        })
        .collect();
    let max = usize::try_from(policy.limits.max_concurrent).unwrap_or(0);
    let key = &policy.limits.per_domain.topology_key;
    let domain_of = |node: &str| {
        ctx.cache
            .nodes
            .get(&StoreRef::new(node))
            .and_then(|n| n.labels().get(key).cloned())
            .unwrap_or_default()
    };
    let ours = domain_of(&nf.spec.node_name);
    let in_domain = in_flight
        .iter()
        .filter(|f| domain_of(&f.spec.node_name) == ours)
        .count();
    let per = usize::try_from(policy.limits.per_domain.max_concurrent).unwrap_or(0);
    palisade_decide::guard::start_limit(in_flight.len(), max, &ours, in_domain, per)
        .map(|why| why.to_string())
}

/// Every `NodeFence`, read from the API server (not the watch cache), for the start gate.
async fn fresh_fences(api: &Api<NodeFence>) -> Result<Vec<NodeFence>, Error> {
    Ok(api
        .list(&Default::default())
        .await
        .map_err(|e| Error::kube("listing NodeFences before starting a fence", e))?
        .items)
}

/// The sibling of `nf` among `fences` that acts instead of it, by the order of
/// [`super::older_sibling`]. The decision reads the watch cache; the start gate reads the API again
/// ([`fresh_fences`]) so that a sibling the cache has not seen yet cannot start beside this one.
pub(super) fn older_among<'a>(
    fences: impl IntoIterator<Item = &'a NodeFence>,
    nf: &NodeFence,
) -> Option<String> {
    let ours = sibling(nf);
    palisade_decide::guard::older_sibling(fences.into_iter().map(sibling), &ours)
}

/// A `NodeFence` as the sibling rule sees it.
fn sibling(f: &NodeFence) -> palisade_decide::guard::Sibling<'_> {
    palisade_decide::guard::Sibling {
        name: f.metadata.name.as_deref().unwrap_or_default(),
        node: &f.spec.node_name,
        phase: crate::detect::phase_of(f),
        created: f.metadata.creation_timestamp.as_ref().map(|t| t.0),
    }
}
