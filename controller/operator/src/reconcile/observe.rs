//! What one step of a fence reads before it is decided: the fence's node as the API server,
//! the watch caches and this replica's memory show it, as [`Observations`] for
//! [`palisade_decide::next_step`].
//!
//! Guarantees: while a self-fence may be trusted or released on, the node's heartbeat is read
//! fresh from the API (a quorum read), and the observed renewal times count only when the
//! watch has caught up with it; the clean proof is per node (a live container of any pod the
//! API does not bind to the node keeps it away); the pods and attachments left to release
//! are read live while releasing.

use std::collections::{BTreeSet, HashSet};

use kube::runtime::reflector::ObjectRef as StoreRef;
use kube::ResourceExt;
use palisade_decide::phase::{NodePod, NodeVolume, Observations};
use palisade_decide::Verdict;
use palisade_model::advertise::Advertisement;
use palisade_model::nodefence::{NodeFenceStatus, Phase};
use palisade_model::policy::Recovery;
use palisade_model::NodeFence;

use super::{
    confirmed_clean, fresh_marker, healthy_since, now_wall, older_sibling, peer_trust,
    phase_seen_for, policy_for, self_fence_pending, untainted_for,
};
use crate::error::Error;
use crate::Ctx;

/// What a fence's step reads (see the module), and what its I/O needs besides.
pub(super) struct Seen {
    /// The node's policy.
    pub policy: Option<palisade_model::FencingPolicySpec>,
    /// The node's latest verdict.
    pub verdict: Option<Verdict>,
    /// The policy's recovery settings.
    pub recovery: Option<Recovery>,
    /// The advertisement observed with the node's latest observed renewal.
    pub advertised: Advertisement,
    /// The release taints on the node that this fence did not add.
    pub foreign_kept: Vec<String>,
    /// The fence's UID (its recovery challenge and taint record).
    pub uid: String,
    /// The observations, without the verdict and recovery ([`Seen::observations`] lends them).
    observations: Observations<'static>,
}

impl Seen {
    /// The observations for [`palisade_decide::next_step`].
    pub fn observations(&self) -> Observations<'_> {
        Observations {
            verdict: self.verdict.as_ref(),
            recovery: self.recovery.as_ref(),
            ..self.observations.clone()
        }
    }
}

/// Reads what fence `nf` (whose status is `status`) needs for its next step under `token`.
pub(super) async fn observe(
    ctx: &Ctx,
    nf: &NodeFence,
    status: &NodeFenceStatus,
    token: i64,
) -> Result<Seen, Error> {
    let node = nf.spec.node_name.clone();
    let policy = policy_for(ctx, &node);
    let detection = policy
        .as_ref()
        .map(|p| p.detection.clone())
        .unwrap_or_default();
    let recovery: Option<Recovery> = policy.as_ref().map(|p| p.recovery.clone());
    let verdict: Option<Verdict> = ctx.memory.lock().verdicts.get(&node).cloned();
    let since = match status.verified_fence() {
        Some(v) => v.at(),
        None => nf
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or_else(now_wall),
    };
    let node_healthy = healthy_since(ctx, &node, since, &detection);
    let releasing = status.phase == Phase::Releasing;
    let released_pods: HashSet<String> =
        status.release.pods.iter().map(|p| p.uid.clone()).collect();
    let released_vas: HashSet<String> = status
        .release
        .attachments
        .iter()
        .map(|p| p.uid.clone())
        .collect();
    let pods_on_node: Vec<NodePod> = if releasing {
        crate::release::pods_on_node(&ctx.client, &node)
            .await?
            .into_iter()
            .filter(|p| !released_pods.contains(&p.pod.uid))
            .collect()
    } else {
        Vec::new()
    };
    let advertised = ctx.memory.lock().advertised_by(&node);
    let heartbeat_marker = if self_fence_pending(status) {
        fresh_marker(ctx, &node).await?
    } else {
        ctx.memory.lock().detector.marker(&node)
    };
    // The observed times belong to the marker only when the watch has caught up with the
    // fresh read.
    let (last_renewal, watched_silence) =
        ctx.memory
            .lock()
            .renewal_seen(&node, heartbeat_marker.as_deref(), ctx.now());
    let margin = std::time::Duration::from_secs(
        policy
            .as_ref()
            .map(|p| u64::try_from(p.trust_self_fence.margin_seconds).unwrap_or(0))
            .unwrap_or(0),
    );
    // The same rule as `decide` (VMs refused unless the policy accepts them): trust is
    // re-earned from each renewal the fence observes, never carried over from the plan.
    let self_fence_wait = advertised.trust_wait(
        margin,
        policy
            .as_ref()
            .map(|p| p.trust_self_fence.virtual_machines)
            .unwrap_or_default(),
    );
    let peer_trust = peer_trust(ctx, &advertised, margin);
    let challenge = nf.metadata.uid.clone().unwrap_or_default();
    let recovering = status.phase == Phase::Recovering;
    let challenge_posted = recovering
        && status.recovery.clean_proof.is_none()
        && !challenge.is_empty()
        && crate::release::challenge_on_node(&ctx.client, &node)
            .await?
            .is_some_and(|c| c == challenge);
    let confirmed = if recovering {
        confirmed_clean(nf)
    } else {
        None
    };
    let proof_from = if confirmed.is_some() {
        palisade_decide::phase::ProofFrom::Person
    } else {
        palisade_decide::phase::ProofFrom::Agent(advertised.system_uuid.clone())
    };
    // The pods the API binds to the node, read live after the advertisement was observed:
    // the proof is per node, so a live container of any other pod blocks it.
    let answered = advertised.challenge.as_deref() == Some(challenge.as_str());
    let bound: BTreeSet<String> = if recovering && confirmed.is_none() && answered {
        crate::release::pods_on_node(&ctx.client, &node)
            .await?
            .into_iter()
            .map(|p| p.pod.uid)
            .collect()
    } else {
        BTreeSet::new()
    };
    let clean_proof = if recovering {
        confirmed.or_else(|| {
            let proof =
                palisade_decide::phase::clean_proof(status, &advertised, &challenge, &bound)
                    .filter(|_| !challenge.is_empty());
            let unbound = palisade_decide::phase::unbound_in_inventory(&advertised, &bound);
            if proof.is_none() && answered && !unbound.is_empty() {
                tracing::info!(
                    fence = %nf.name_any(),
                    %node,
                    ?unbound,
                    "the node's runtime inventory lists pods the API does not bind to it: their containers keep the fence"
                );
            }
            proof
        })
    } else {
        None
    };
    let attachments: Vec<NodeVolume> = if releasing {
        crate::release::attachments_on_node(&ctx.client, &node)
            .await?
            .into_iter()
            .filter(|v| !released_vas.contains(&v.object.uid))
            .collect()
    } else {
        Vec::new()
    };
    let released_records: HashSet<String> = status
        .release
        .attach_records
        .iter()
        .map(|r| r.name.clone())
        .collect();
    let attach_records: Vec<NodeVolume> = if releasing {
        crate::release::attach_records(&ctx.client, &node)
            .await?
            .into_iter()
            .filter(|r| !released_records.contains(&r.object.name))
            .collect()
    } else {
        Vec::new()
    };
    // The release taints on the observed Node, this fence's (its record on the Node says
    // it added them) apart from the others'; and, while Recovering, how long this process
    // has watched the Node carry neither kind that matters, and the attachments in flux.
    let uid = nf.metadata.uid.clone().unwrap_or_default();
    let observed_node = ctx.cache.nodes.get(&StoreRef::new(&node));
    let (taints_added, taints_foreign) = observed_node
        .as_deref()
        .map(|n| crate::release::release_taints_on(n, &uid))
        .unwrap_or_default();
    let untainted = recovering
        && observed_node.is_some()
        && taints_added.is_empty()
        && !taints_foreign
            .iter()
            .any(|k| k == palisade_model::OUT_OF_SERVICE_TAINT_KEY);
    let untainted_for = untainted_for(ctx, nf, untainted);
    let unsettled_attachments = if recovering && status.recovery.untaint_observed_at.is_some() {
        crate::release::unsettled_attachments(&ctx.client, &node).await?
    } else {
        Vec::new()
    };
    let foreign_kept = taints_foreign.clone();
    let observations = Observations {
        now: ctx.now(),
        token,
        verdict: None,
        recovery: None,
        pods_on_node,
        attachments,
        attach_records,
        node_healthy,
        last_renewal,
        watched_silence,
        heartbeat_marker,
        self_fence_wait,
        peer_trust,
        clean_proof,
        challenge_posted,
        taints_added,
        taints_foreign,
        unsettled_attachments,
        untainted_for,
        node_uid: ctx
            .cache
            .nodes
            .get(&StoreRef::new(&node))
            .and_then(|n| n.metadata.uid.clone()),
        node_system_uuid: observed_node
            .as_deref()
            .and_then(|n| n.status.as_ref()?.node_info.as_ref())
            .map(|i| i.system_uuid.clone())
            .filter(|u| !u.is_empty()),
        advertised_system_uuid: advertised.system_uuid.clone(),
        proof_from,
        older_sibling: older_sibling(ctx, nf),
        phase_seen_for: phase_seen_for(ctx, nf, status.phase),
    };
    Ok(Seen {
        policy,
        verdict,
        recovery,
        advertised,
        foreign_kept,
        uid,
        observations,
    })
}
