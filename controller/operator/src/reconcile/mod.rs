//! The `NodeFence` reconciler: one worker per unfinished fence, driving the persisted state
//! machine of `palisade_decide::phase` one step at a time.
//!
//! Each iteration re-reads the `NodeFence` from the API, reads what the step needs
//! (`observe.rs`), computes the one next step from the persisted status plus those
//! observations, performs its I/O (a start under the gate in `start.rs`, a wait or hold recorded
//! in `wait.rs`, a device command, a release), records what the world answered with the core
//! shared with the simulation ([`palisade_decide::record::apply`]) and persists it with a
//! compare-and-swap (`replace_status` carries the resourceVersion it read) **before** asking
//! for the next step; the Event follows the durable record. A restarted or new leader
//! therefore resumes from the last persisted step; device actions are idempotent (powering off
//! a node that is off is a success), and release steps re-list what is left.
//!
//! Guarantees:
//! - a worker runs only for the token it was started with, and stops as soon as leadership is
//!   lost or the status records a higher token (`Step::Refuse`);
//! - device actions and API mutations re-check leadership against the Lease first;
//! - a level's attempts are persisted only when no attempt reported a stale token;
//! - release steps receive the `VerifiedFence` proof from the state machine itself.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::reflector::ObjectRef as StoreRef;
use kube::{Api, ResourceExt};
use palisade_decide::detector::Thresholds;
use palisade_decide::next_step;
use palisade_decide::phase::{ObjectRef, Step};
use palisade_model::advertise::Advertisement;
use palisade_model::nodefence::{AttemptOutcome, NodeFenceStatus, Phase};
use palisade_model::policy::Detection;
use palisade_model::NodeFence;
use tracing::Instrument as _;

use palisade_decide::record::{self, Answer};

use crate::error::Error;
use crate::events::{Kind, Recorder};
use crate::Ctx;

mod observe;
mod start;
mod wait;

/// Starts a worker for every `NodeFence` that needs one (`needs_worker`) and has none.
pub fn ensure_workers(ctx: &Arc<Ctx>, token: i64) {
    for f in ctx.cache.fences.state() {
        if needs_worker(&f) {
            start_worker(ctx, f.name_any(), token);
        }
    }
}

/// Whether a worker must drive `nf`: it is unfinished, or it finished (or a person deleted it)
/// holding nothing on its node and still carries its finalizer. The worker removes the
/// finalizer in the round after it records the end; a crash or a failed patch in between
/// would otherwise leave it for good, and a later `kubectl delete` of the fence would hang.
fn needs_worker(nf: &NodeFence) -> bool {
    let Some(status) = nf.status.as_ref() else {
        return true; // Pending
    };
    !status.phase.is_terminal()
        || (has_finalizer(nf) && status.finalizer_may_go(nf.metadata.deletion_timestamp.is_some()))
}

/// Starts a worker for the `NodeFence` `name` unless one runs (a fence just created need not
/// wait for the cache and the next tick).
pub fn start_worker(ctx: &Arc<Ctx>, name: String, token: i64) {
    let fresh = ctx.workers.lock().insert(name.clone());
    if !fresh {
        return;
    }
    let ctx = ctx.clone();
    tokio::spawn(async move {
        if let Err(e) = work(&ctx, &name, token).await {
            tracing::warn!(nodefence = %name, error = %e, "worker stopped with an error; retried next tick");
        }
        ctx.workers.lock().remove(&name);
    });
}

fn now_wall() -> Timestamp {
    Timestamp::now()
}

/// The policy covering `node` (exactly one, else `None`).
pub(crate) fn policy_for(ctx: &Ctx, node: &str) -> Option<palisade_model::FencingPolicySpec> {
    let n = ctx.cache.nodes.get(&StoreRef::new(node))?;
    let matching: Vec<_> = ctx
        .cache
        .policies
        .state()
        .into_iter()
        .filter(|p| palisade_decide::selector::matches(&p.spec.node_selector, n.labels()))
        .collect();
    match matching.as_slice() {
        [one] => Some(one.spec.clone()),
        _ => None,
    }
}

/// Healthy, with a heartbeat change observed (not just a first sighting) after `since`.
fn healthy_since(ctx: &Ctx, node: &str, since: Timestamp, detection: &Detection) -> bool {
    ctx.memory.lock().healthy_since(
        node,
        since,
        Thresholds::from(detection),
        REJOIN_SETTLE.max(ctx.settings.tick * 4),
        ctx.now(),
    )
}

/// The healthy-majority bound on trusting the node's self-fence, from the advertisement it
/// wrote with its last observed renewal and the streaks of the Nodes its peer check counts:
/// the member set it advertised (an older Node list, if it was cut off before Nodes joined or
/// left). A member set it did not advertise, or one this controller never saw, earns no trust.
fn peer_trust(
    ctx: &Ctx,
    advertised: &Advertisement,
    margin: std::time::Duration,
) -> palisade_decide::phase::PeerTrust {
    let names = ctx
        .cache
        .nodes
        .state()
        .iter()
        .map(|n| kube::ResourceExt::name_any(n.as_ref()))
        .collect();
    let mut memory = ctx.memory.lock();
    memory.members.record(names);
    memory.peer_trust(advertised, margin, ctx.now().mono)
}

/// Whether a self-fence may be trusted or released on in this phase: then the node's heartbeat
/// is read fresh from the API rather than from the watch cache.
fn self_fence_pending(status: &NodeFenceStatus) -> bool {
    matches!(
        status.phase,
        Phase::Fencing | Phase::Fenced | Phase::Releasing
    ) && status.plan.as_ref().is_some_and(|p| {
        p.levels
            .iter()
            .any(|l| l.kind == palisade_model::nodefence::LevelKind::SelfFence)
    })
}

/// The node's heartbeat marker read from the API itself (quorum reads, not the watch cache):
/// its Lease's `renewTime`, or without one its Node's Ready heartbeat, as the detector reads
/// them from the caches ([`palisade_decide::convert::heartbeat`]). `None` when the Node is gone.
///
/// Guarantees: a renewal the API server has stored before this read is seen, whatever the
/// watch's lag: without it, a node that renewed (and so restarted the pods its self-fence had
/// killed) a moment before its trust time could be trusted as silent (found by the
/// deterministic simulation, `palisade-sim`, watch lag up to 1.5 s), and a node whose renewals
/// the watch has not delivered yet could be fenced as silent ([`crate::detect`]).
pub(crate) async fn fresh_marker(ctx: &Ctx, node: &str) -> Result<Option<String>, Error> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(ctx.client.clone(), crate::cache::NODE_LEASE_NAMESPACE);
    let lease = leases
        .get_opt(node)
        .await
        .map_err(|e| Error::kube(format!("reading node {node}'s Lease"), e))?;
    let renews = lease
        .as_ref()
        .and_then(|l| l.spec.as_ref())
        .is_some_and(|s| s.renew_time.is_some());
    let n = if renews {
        Some(k8s_openapi::api::core::v1::Node::default())
    } else {
        Api::<k8s_openapi::api::core::v1::Node>::all(ctx.client.clone())
            .get_opt(node)
            .await
            .map_err(|e| Error::kube(format!("reading node {node}"), e))?
    };
    Ok(n.map(|n| crate::detect::lease_heartbeat(&n, lease.as_ref()).marker()))
}

/// The other unfinished `NodeFence` for the same node that acts instead of `nf`, if any: one
/// that has already left `Pending` comes first, then the older by creation time, then by name.
///
/// Guarantees: a fence that has started (it may hold a token and have commanded devices) is
/// never superseded by one still `Pending`. Creation times have one-second resolution, so two
/// fences created in the same second are otherwise ordered by name alone, which must not let a
/// new request displace the one already fencing.
fn older_sibling(ctx: &Ctx, nf: &NodeFence) -> Option<String> {
    start::older_among(ctx.cache.fences.state().iter().map(|f| &**f), nf)
}

pub use palisade_model::nodefence::ANNOTATION_CONFIRM_CLEAN;

/// A person's confirmation that this fence's released pods are gone, as the clean proof's
/// text; `None` unless the annotation names this `NodeFence`'s UID
/// ([`palisade_model::nodefence::confirmed_clean_for`]).
///
/// Guarantees: a confirmation left for another (older) fence of the node, or a bare legacy
/// value, never stands in for this fence's proof; it is logged as ignored.
fn confirmed_clean(nf: &NodeFence) -> Option<String> {
    let value = nf.annotations().get(ANNOTATION_CONFIRM_CLEAN)?;
    let uid = nf.metadata.uid.as_deref().unwrap_or_default();
    match palisade_model::nodefence::confirmed_clean_for(value, uid) {
        Some(_) => Some(format!(
            "confirmed by a person for this fence ({ANNOTATION_CONFIRM_CLEAN}: {value})"
        )),
        None => {
            tracing::warn!(nodefence = %nf.name_any(), uid, value = %value, "{ANNOTATION_CONFIRM_CLEAN} ignored: its value must start with this NodeFence's UID (`<uid>: who checked what`)");
            None
        }
    }
}

/// How long after a fence (or a request) a heartbeat change must be observed to count as the
/// node being alive again (covers watch latency for markers written before the power-off).
pub const REJOIN_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether `nf` carries [`palisade_model::NODEFENCE_FINALIZER`].
fn has_finalizer(nf: &NodeFence) -> bool {
    nf.finalizers()
        .iter()
        .any(|f| f == palisade_model::NODEFENCE_FINALIZER)
}

/// Adds (`on`) or removes the fence's finalizer, leaving any other finalizer in place. The
/// merge patch names `nf`'s resourceVersion, so it fails with a conflict (and the loop reads
/// the fence again) if anything changed the fence since it was read.
async fn set_finalizer(api: &Api<NodeFence>, nf: &NodeFence, on: bool) -> Result<(), Error> {
    let mut finalizers: Vec<String> = nf
        .finalizers()
        .iter()
        .filter(|f| *f != palisade_model::NODEFENCE_FINALIZER)
        .cloned()
        .collect();
    if on {
        finalizers.push(palisade_model::NODEFENCE_FINALIZER.to_string());
    }
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": nf.resource_version(),
            "finalizers": finalizers,
        }
    });
    api.patch(
        &nf.name_any(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map(drop)
    .map_err(|e| {
        let what = if on { "adding" } else { "removing" };
        Error::kube(
            format!("{what} the finalizer of NodeFence {}", nf.name_any()),
            e,
        )
    })
}

/// The UIDs of deleted fences whose "deletion waits" Event this process already sent.
fn told_deletion_waits(uid: &str) -> bool {
    static TOLD: std::sync::OnceLock<parking_lot::Mutex<HashSet<String>>> =
        std::sync::OnceLock::new();
    !TOLD
        .get_or_init(Default::default)
        .lock()
        .insert(uid.to_string())
}

/// Persists `status` as the outcome of `step` (a [`Step::label`]), with the crash points of
/// [`crate::crashpoint`] on either side of the write.
async fn persist(
    api: &Api<NodeFence>,
    nf: &NodeFence,
    status: NodeFenceStatus,
    step: &str,
) -> Result<NodeFence, Error> {
    crate::crashpoint::reached(step, crate::crashpoint::When::BeforePersist);
    let done = persist_now(api, nf, status).await;
    crate::crashpoint::reached(step, crate::crashpoint::When::AfterPersist);
    done
}

async fn persist_now(
    api: &Api<NodeFence>,
    nf: &NodeFence,
    status: NodeFenceStatus,
) -> Result<NodeFence, Error> {
    let mut obj = nf.clone();
    obj.status = Some(status);
    api.replace_status(&nf.name_any(), &PostParams::default(), &obj)
        .await
        .map_err(|e| Error::kube(format!("persisting NodeFence {} status", nf.name_any()), e))
}

/// Persists the status, then records the Event: an Event is only ever sent for a step that is
/// durable.
async fn persist_then_tell(
    ctx: &Ctx,
    api: &Api<NodeFence>,
    nf: &NodeFence,
    status: NodeFenceStatus,
    step: &str,
    (kind, reason, message): (Kind, &str, &str),
) -> Result<NodeFence, Error> {
    let stored = persist(api, nf, status, step).await?;
    event(ctx, nf, kind, reason, message).await;
    Ok(stored)
}

async fn event(ctx: &Ctx, nf: &NodeFence, kind: Kind, reason: &str, message: &str) {
    ctx.events
        .publish(Recorder::reference(nf), kind, reason, message)
        .await;
}

/// The planted bug `ReleaseUnverified` ([`palisade_fence::planted`], debug builds only): deletes the
/// node's pods (grace 0, UID precondition) as fencing starts, before any level is verified,
/// and records them released. It bypasses [`crate::release::release_pod`], which takes a
/// `VerifiedFence` no unverified fence can produce.
async fn planted_release_unverified(
    ctx: &Ctx,
    api: &Api<NodeFence>,
    nf: &NodeFence,
    node: &str,
) -> Result<(), Error> {
    let pods = crate::release::pods_on_node(&ctx.client, node).await?;
    let mut status = nf.status.clone().unwrap_or_default();
    for p in pods {
        tracing::error!(pod = %p.pod.name, node, "planted bug ReleaseUnverified: deleting a pod before the fence is verified");
        planted_force_delete(ctx, &p.pod).await;
        status
            .release
            .pods
            .push(record::released(&p.pod, now_wall()));
    }
    persist(api, nf, status, "planted_release_unverified").await?;
    Ok(())
}

/// The planted bug `ReleaseUncovered` (debug builds only): a pod the verified fence does not
/// cover (no PersistentVolumeClaim behind a storage-only fence) is released anyway.
async fn planted_release_uncovered(
    ctx: &Ctx,
    api: &Api<NodeFence>,
    nf: &NodeFence,
    mut status: NodeFenceStatus,
    pod: &ObjectRef,
) -> Result<(), Error> {
    tracing::error!(pod = %pod.name, "planted bug ReleaseUncovered: deleting a pod the fence does not cover");
    planted_force_delete(ctx, pod).await;
    status.release.pods.push(record::released(pod, now_wall()));
    persist(api, nf, status, "planted_release_uncovered").await?;
    Ok(())
}

/// Deletes `pod` with grace 0 and its UID as precondition, ignoring errors (planted bugs only).
async fn planted_force_delete(ctx: &Ctx, pod: &ObjectRef) {
    use k8s_openapi::api::core::v1::Pod;
    let dp = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace);
    let _ = pods_api.delete(&pod.name, &dp).await;
}

/// Names the next device step of `nf` for idempotency keys: the `NodeFence` UID, the token and
/// the number of attempts already persisted. A step resumed after a crash (its attempts were
/// never persisted) gets the same name, so a bridge answers it from its record instead of
/// acting twice; a new step, or a new leader, gets a new one. The fence's storage hold is
/// `palisade-<UID>` for every step and leader.
fn step_name(nf: &NodeFence, token: i64, status: &NodeFenceStatus) -> crate::devices::StepIds {
    let uid = nf.metadata.uid.as_deref().unwrap_or("no-uid");
    crate::devices::StepIds {
        step: format!("nf-{uid}-t{token}-a{}", status.attempts.len()),
        hold: format!("palisade-{uid}"),
    }
}

/// The node's boot ID as last known: the one its agent advertised with its latest observed
/// renewal, else the Node's `status.nodeInfo.bootID`.
fn boot_id(ctx: &Ctx, node: &str) -> Option<String> {
    let ad = ctx.memory.lock().advertised_by(node);
    ad.boot_id.or_else(|| {
        ctx.cache
            .nodes
            .get(&StoreRef::new(node))
            .and_then(|n| {
                n.status
                    .as_ref()?
                    .node_info
                    .as_ref()
                    .map(|i| i.boot_id.clone())
            })
            .filter(|b| !b.is_empty())
    })
}

/// Whether an attempt was refused for a stale token. If so, nothing of the step is persisted;
/// the refusal raises the leader's token floor (to the bridge's floor when its refusal carries
/// it as a typed field, [`palisade_model::nodefence::DeviceAttempt::token_floor`]), so this
/// replica steps down and the next term starts above every token already used: a controller
/// that restarted from scratch (its leader Lease deleted) recovers on its own instead of
/// failing every fence against the bridge. A refusal without a typed floor (an older bridge)
/// counts as "refused, no floor": the replica steps down, its floor raised to its own token
/// only, and no number is ever read from the refusal's words.
async fn stale_token(
    ctx: &Ctx,
    nf: &NodeFence,
    token: i64,
    attempts: &[palisade_model::nodefence::DeviceAttempt],
) -> bool {
    let Some(refused) = attempts
        .iter()
        .find(|a| a.outcome == AttemptOutcome::StaleToken)
    else {
        return false;
    };
    let floor = refused.token_floor().unwrap_or(token).max(token);
    tracing::warn!(nodefence = %nf.name_any(), token, floor, message = %refused.message, "fencing token refused as stale; persisting nothing, re-electing above it");
    event(
        ctx,
        nf,
        Kind::Warning,
        "StaleFencingToken",
        &format!(
            "token {token} refused ({}); this controller steps down and the next term starts above token {floor}",
            refused.message
        ),
    )
    .await;
    ctx.leader.raise_floor(floor);
    ctx.leader.resign();
    true
}

/// How long this process has seen `nf` in `phase`, on its monotonic clock: since the first
/// call for the fence's UID in that phase (a new phase starts the count again); `None` for a
/// fence without a UID. The phase's budget runs on it as well as on the wall clock
/// ([`palisade_decide::budget::exceeded`]), so a wall-clock step never fails a fence.
///
/// Guarantees: never longer than the time since this process first read the fence in
/// `phase`, hence never longer than the fence has truly been in it. A restarted process or a
/// new leader starts from zero (a longer budget, never a shorter one).
fn phase_seen_for(ctx: &Ctx, nf: &NodeFence, phase: Phase) -> Option<std::time::Duration> {
    static FIRST_SEEN: std::sync::LazyLock<
        parking_lot::Mutex<std::collections::HashMap<String, (Phase, palisade_decide::Mono)>>,
    > = std::sync::LazyLock::new(Default::default);
    let uid = nf.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    let now = ctx.now().mono;
    let mut seen = FIRST_SEEN.lock();
    if phase.is_terminal() {
        seen.remove(uid);
        return Some(std::time::Duration::ZERO);
    }
    let entry = seen.entry(uid.to_string()).or_insert((phase, now));
    if entry.0 != phase {
        *entry = (phase, now);
    }
    Some(now.since(entry.1))
}

/// How long this process has watched `nf`'s Node, while the fence is Recovering, carry
/// neither a release taint the fence added nor an out-of-service taint (`untainted`: it does
/// now), on its monotonic clock: since the first such observation, counted again from zero
/// whenever the Node is seen with such a taint again. `None` when it is not `untainted` now
/// or the fence has no UID. The untaint margin runs on it
/// ([`palisade_decide::phase::UNTAINT_SETTLE_MARGIN`]).
///
/// Guarantees: never longer than this process has watched the Node without such a taint; a
/// restarted process or a new leader starts from zero (a longer margin, never a shorter one).
fn untainted_for(ctx: &Ctx, nf: &NodeFence, untainted: bool) -> Option<std::time::Duration> {
    static SINCE: std::sync::LazyLock<
        parking_lot::Mutex<std::collections::HashMap<String, palisade_decide::Mono>>,
    > = std::sync::LazyLock::new(Default::default);
    let uid = nf.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    let mut since = SINCE.lock();
    if !untainted {
        since.remove(uid);
        return None;
    }
    let now = ctx.now().mono;
    Some(now.since(*since.entry(uid.to_string()).or_insert(now)))
}

/// Drives one `NodeFence` until it waits, finishes, or we lose leadership.
async fn work(ctx: &Ctx, name: &str, token: i64) -> Result<(), Error> {
    let api: Api<NodeFence> = Api::all(ctx.client.clone());
    // Bound the number of steps per activation; the next tick resumes.
    for _ in 0..64 {
        if ctx.leader.token() != Some(token) {
            return Ok(());
        }
        let Some(nf) = api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("reading NodeFence {name}"), e))?
        else {
            return Ok(());
        };
        let mut status = nf.status.clone().unwrap_or_default();
        let node = nf.spec.node_name.clone();
        if status.transitions.is_empty() {
            status
                .transition(
                    Phase::Pending,
                    now_wall(),
                    format!("requested: {}", nf.spec.reason),
                )
                .map_err(|source| Error::Status {
                    name: name.into(),
                    source,
                })?;
            persist(&api, &nf, status, "record_request").await?;
            event(
                ctx,
                &nf,
                Kind::Normal,
                "Pending",
                &format!("fence of node {node} requested: {}", nf.spec.reason),
            )
            .await;
            continue;
        }
        // The finalizer: a fence that holds something on its node (from Fencing on) keeps its
        // record until its recovery lifted it, even when a person deletes it.
        let deleting = nf.metadata.deletion_timestamp.is_some();
        let holds = status.holds_node();
        if has_finalizer(&nf) && status.finalizer_may_go(deleting) {
            set_finalizer(&api, &nf, false).await?;
            continue;
        }
        if deleting && status.phase == Phase::Pending {
            // Deleted before it did anything: it never starts.
            return Ok(());
        }
        if holds && !has_finalizer(&nf) && !deleting {
            set_finalizer(&api, &nf, true).await?;
            continue;
        }
        if deleting && holds && !told_deletion_waits(nf.metadata.uid.as_deref().unwrap_or(name)) {
            let msg = format!(
                "deletion requested, but this fence still holds node {node} (phase {}): it is removed once its recovery lifted the storage block and the taints it added, after positive proof that the pods it released are gone. To abandon it, lift those by hand and remove the finalizer {}",
                status.phase,
                palisade_model::NODEFENCE_FINALIZER
            );
            tracing::warn!(nodefence = name, "{msg}");
            event(ctx, &nf, Kind::Warning, "DeletionWaitsForRecovery", &msg).await;
        }
        let seen = observe::observe(ctx, &nf, &status, token).await?;
        let obs = seen.observations();
        let observe::Seen {
            policy,
            verdict,
            advertised,
            foreign_kept,
            uid,
            ..
        } = &seen;
        let step = next_step(&nf.spec, &status, &obs);
        let label = step.label();
        tracing::debug!(nodefence = name, node = %node, phase = %status.phase.as_str(), step = step.label(), "step");
        if !matches!(step, Step::Wait { .. } | Step::Nothing) {
            ctx.metrics.step(step.label());
        }
        let wall = now_wall();
        // Every acting step runs in its own span (exported over OTLP when enabled): the
        // device commands, releases and status writes it makes are its children.
        let span = if matches!(step, Step::Wait { .. } | Step::Nothing) {
            tracing::Span::none()
        } else {
            tracing::info_span!("step", nodefence = name, node = %node, phase = status.phase.as_str(), step = label, token)
        };
        let mut latest: Option<NodeFence> = None;
        let done = async {
            // Held from the count of fences in flight to the persisted start (StartFencing).
            let mut _gate = None;
            // The step's I/O; its answer is recorded below by the shared core.
            let answer = match &step {
                Step::Nothing => return Ok(true),
                Step::Refuse { ours, recorded } => {
                    tracing::warn!(
                        nodefence = name,
                        ours,
                        recorded,
                        "a newer leader recorded a higher fencing token; acting on nothing"
                    );
                    return Ok(true);
                }
                Step::Hold(reason) => {
                    wait::record_hold(ctx, &api, &nf, status, label, reason, wall).await?;
                    return Ok(true);
                }
                Step::Wait { why, until } => {
                    wait::record_wait(
                        ctx,
                        &api,
                        &nf,
                        status,
                        wait::Waiting {
                            node: &node,
                            why,
                            until: *until,
                            verdict: verdict.as_ref(),
                            advertised,
                            at: wall,
                        },
                    )
                    .await?;
                    return Ok(true);
                }
                Step::StartFencing { token: t, .. } => {
                    match start::may_start(ctx, &api, &nf, *t, policy.as_ref()).await? {
                        start::Start::Go(gate) => _gate = Some(gate),
                        start::Start::Stop => return Ok(true),
                        start::Start::Again => return Ok(false),
                    }
                    Answer::Started {
                        boot_id: boot_id(ctx, &node),
                        verdict: verdict.as_ref().map(|v| (v.label(), v.message())),
                    }
                }
                Step::RunLevel {
                    level,
                    devices,
                    reset,
                } => {
                    let ids = step_name(&nf, token, &status);
                    let run = crate::devices::run_level(
                        ctx, &node, *level, devices, token, *reset, &ids,
                    )
                    .await;
                    if stale_token(ctx, &nf, token, &run.attempts).await {
                        return Ok(true);
                    }
                    Answer::Level(run)
                }
                Step::HoldPod(pod)
                    if palisade_fence::planted::active(
                        palisade_fence::planted::Planted::ReleaseUncovered,
                    ) =>
                {
                    planted_release_uncovered(ctx, &api, &nf, status, pod).await?;
                    return Ok(false);
                }
                Step::ApplyTaint(proof, which) => {
                    ctx.leader.check(token).await?;
                    crate::release::apply_taint(&ctx.client, &node, uid, proof, *which).await?;
                    Answer::Nothing
                }
                Step::ReleasePod(proof, pod) => {
                    ctx.leader.check(token).await?;
                    // Write-ahead: the status names the pod before its deletion is sent, so a
                    // leader that dies after the deletion leaves a record the next one completes.
                    if !record::release_intended(&status, pod) {
                        record::intend_release(&mut status, pod, now_wall());
                        latest = Some(persist(&api, &nf, status.clone(), "release_pod_intent").await?);
                    }
                    ctx.leader.check(token).await?;
                    crate::release::release_pod(&ctx.client, &node, pod, proof).await?;
                    Answer::Nothing
                }
                Step::DeleteAttachment(proof, va) => {
                    ctx.leader.check(token).await?;
                    crate::release::delete_attachment(&ctx.client, va, proof).await?;
                    Answer::Nothing
                }
                Step::ClearAttachRecord(proof, record) => {
                    ctx.leader.check(token).await?;
                    crate::release::clear_attach_record(&ctx.client, &node, record, proof).await?;
                    Answer::Nothing
                }
                Step::PowerOn(devices) | Step::Unfence(devices) => {
                    let level = status.verified_fence().map(|v| v.level()).unwrap_or(0);
                    let ids = step_name(&nf, token, &status);
                    let (attempts, result) =
                        crate::devices::recover(ctx, &node, level, devices, token, &ids).await;
                    if stale_token(ctx, &nf, token, &attempts).await {
                        return Ok(true);
                    }
                    Answer::Recovery { attempts, result }
                }
                Step::RecheckPower(devices) => {
                    let mut read = Vec::new();
                    for d in devices {
                        let (state, observed) =
                            crate::devices::read_power(ctx, &node, d, token).await;
                        tracing::info!(nodefence = name, node = %node, device = %palisade_model::target::redact_url(&d.url), ?state, %observed, "power re-read before release");
                        read.push(palisade_model::nodefence::PowerRecheck {
                            device: d.url.clone(),
                            token,
                            state,
                            observed,
                            at: MicroTime(now_wall()),
                        });
                    }
                    Answer::Power(read)
                }
                Step::PostChallenge => {
                    ctx.leader.check(token).await?;
                    crate::release::post_challenge(&ctx.client, &node, uid).await?;
                    Answer::Nothing
                }
                Step::RemoveTaint => {
                    ctx.leader.check(token).await?;
                    let left = crate::release::remove_taint(&ctx.client, &node, uid).await?;
                    Answer::Untainted { left }
                }
                _ => Answer::Nothing,
            };
            // A recovery action that failed is tried again on a later tick, after its delay.
            let recovery_failed = matches!(
                answer,
                Answer::Recovery {
                    result: Err(_),
                    ..
                }
            );
            // The step concludes now, after the world answered (not when it began).
            let at = now_wall();
            let record = record::apply(
                &mut status,
                &step,
                answer,
                record::Facts {
                    node: &node,
                    at,
                    token,
                    leader: &ctx.settings.identity,
                    challenge: uid,
                    kept_taints: foreign_kept,
                },
            )
            .map_err(|source| Error::Status {
                name: name.into(),
                source,
            })?;
            if !record.changed && record.note.is_none() {
                return Ok(true);
            }
            if let Some((from, entered)) = record.left {
                let secs = at.duration_since(entered).as_secs_f64();
                ctx.metrics.phase_duration(from.as_str(), secs.max(0.0));
            }
            let stored = if record.changed {
                Some(persist(&api, latest.as_ref().unwrap_or(&nf), status, label).await?)
            } else {
                None
            };
            if let Some(outcome) = record.outcome {
                ctx.metrics.fence(outcome);
            }
            if let Some(note) = &record.note {
                let kind = if note.warning { Kind::Warning } else { Kind::Normal };
                event(ctx, &nf, kind, note.reason, &note.message).await;
            }
            if recovery_failed {
                return Ok(true);
            }
            if let (Step::StartFencing { .. }, Some(stored)) = (&step, stored) {
                if palisade_fence::planted::active(palisade_fence::planted::Planted::ReleaseUnverified) {
                    planted_release_unverified(ctx, &api, &stored, &node).await?;
                }
            }
            Ok::<bool, Error>(false)
        }
        .instrument(span)
        .await?;
        if done {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod confirmed_clean_tests {
    use super::*;

    fn fence(uid: &str, confirm: Option<&str>) -> NodeFence {
        let spec = palisade_model::nodefence::NodeFenceSpec {
            node_name: "m0".into(),
            reason: String::new(),
            requested_by: Default::default(),
            overrides: Default::default(),
        };
        let mut nf = NodeFence::new("m0-1", spec);
        nf.metadata.uid = Some(uid.to_string());
        if let Some(v) = confirm {
            nf.annotations_mut()
                .insert(ANNOTATION_CONFIRM_CLEAN.to_string(), v.to_string());
        }
        nf
    }

    #[test]
    fn only_a_confirmation_naming_this_fence_stands_in_for_its_clean_proof() {
        let uid = "3f6c1a52-8d0e-4b1f-9a57-0c2de1b1a001";
        assert!(confirmed_clean(&fence(uid, Some(&format!("{uid}: alice")))).is_some());
        assert!(confirmed_clean(&fence(uid, Some(uid))).is_some());
        // An older fence's confirmation, a legacy bare value, nothing.
        let older = "0b9e77aa-1c42-4d1d-8f0f-55e3c2d7b002: alice";
        assert_eq!(confirmed_clean(&fence(uid, Some(older))), None);
        assert_eq!(confirmed_clean(&fence(uid, Some("checked by alice"))), None);
        assert_eq!(confirmed_clean(&fence(uid, None)), None);
        assert_eq!(confirmed_clean(&fence("", Some(": alice"))), None);
    }
}

#[cfg(test)]
mod start_gate_tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn fence(name: &str, node: &str, created: i64, phase: Option<Phase>) -> NodeFence {
        let spec = palisade_model::nodefence::NodeFenceSpec {
            node_name: node.into(),
            reason: String::new(),
            requested_by: Default::default(),
            overrides: Default::default(),
        };
        let mut nf = NodeFence::new(name, spec);
        nf.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).expect("a valid time"),
        ));
        if let Some(p) = phase {
            nf.status = Some(NodeFenceStatus {
                phase: p,
                ..Default::default()
            });
        }
        nf
    }

    #[test]
    fn the_gate_finds_an_older_sibling_the_cache_did_not_hold() {
        let ours = fence("m0-b", "m0", 200, None);
        // The cache held only this fence; the API holds an older one of the same node.
        assert_eq!(start::older_among([&ours], &ours), None);
        let older = fence("m0-a", "m0", 100, None);
        let fresh = vec![older.clone(), ours.clone()];
        assert_eq!(start::older_among(&fresh, &ours).as_deref(), Some("m0-a"));
        // One that started already comes first, even if younger; finished ones and other
        // nodes' fences never count.
        let started = fence("m0-c", "m0", 300, Some(Phase::Fencing));
        assert_eq!(
            start::older_among([&older, &started], &ours).as_deref(),
            Some("m0-c")
        );
        let done = fence("m0-d", "m0", 50, Some(Phase::Done));
        let other = fence("m1-a", "m1", 10, Some(Phase::Fencing));
        assert_eq!(start::older_among([&done, &other, &ours], &ours), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// A finished fence whose finalizer stayed (the worker crashed between the persisted end
    /// and the removal) gets a worker again, which removes it; one that still holds its node
    /// keeps it, and a finished fence without it needs nothing.
    #[test]
    fn a_finished_fence_that_kept_its_finalizer_gets_a_worker_to_remove_it() {
        let spec = palisade_model::nodefence::NodeFenceSpec {
            node_name: "m0".into(),
            reason: String::new(),
            requested_by: Default::default(),
            overrides: Default::default(),
        };
        let fence = |phase: Phase, finalizer: bool, released: bool| {
            let mut nf = NodeFence::new("f", spec.clone());
            if finalizer {
                nf.metadata.finalizers = Some(vec![palisade_model::NODEFENCE_FINALIZER.into()]);
            }
            let mut st = NodeFenceStatus {
                phase,
                ..Default::default()
            };
            if released {
                st.release.tainted_at = Some(MicroTime(Timestamp::from_second(1_000).unwrap()));
            }
            nf.status = Some(st);
            nf
        };
        assert!(needs_worker(&NodeFence::new("new", spec.clone())));
        assert!(needs_worker(&fence(Phase::Releasing, true, true)));
        assert!(needs_worker(&fence(Phase::Done, true, false)));
        assert!(needs_worker(&fence(Phase::Failed, true, false)));
        assert!(!needs_worker(&fence(Phase::Done, false, false)));
        // A Failed fence that tainted the node holds it: its finalizer stays for a person.
        assert!(!needs_worker(&fence(Phase::Failed, true, true)));
    }

    #[test]
    fn dark_advice_names_every_dark_device_and_never_claims_proof() {
        assert_eq!(record::dark_advice("m0", &[]), "");
        let a = record::dark_advice("m0", &["ipmi://admin@10.0.0.1", "redfish+https://bmc"]);
        for want in [
            "ipmi://",
            "redfish+https://bmc",
            "no proof that node m0 is off",
            "PDU or storage level",
        ] {
            assert!(a.contains(want), "{want}: {a}");
        }
    }
}
