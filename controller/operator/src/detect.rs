//! The detection and decision tick.
//!
//! A dead node sends no events, so staleness is clocked here, on a periodic tick and at the
//! moment a node's silence reaches a threshold between two ticks, and never only on watch
//! events. Each round:
//!
//! 1. observes every node's heartbeat markers (Lease `renewTime`, Ready `lastHeartbeatTime`)
//!    into the detector, on our own monotonic clock (every replica does this, so a new leader
//!    already has history);
//! 2. if we lead: builds a [`Snapshot`] from the caches and runs [`palisade_decide::decide()`];
//! 3. creates a `NodeFence` for a `Fence` verdict on a node that has none (one unfinished
//!    `NodeFence` per node, checked against the API, not only the cache);
//! 4. reports each held or waiting decision once per change of reason (Event + metric);
//! 5. makes sure every unfinished `NodeFence` has a worker ([`crate::reconcile`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use palisade_decide::detector::{Heartbeat, Observed, Thresholds};
use palisade_decide::snapshot::{
    Exclusion, FenceState, Lent, NodeSnapshot, PdbSnapshot, PodSnapshot, PolicySnapshot, Snapshot,
};
use palisade_decide::{decide, guards_holding, Clocks, Mono, Verdict};
use palisade_model::nodefence::{NodeFenceSpec, Overrides, Phase, RequestedBy};
use palisade_model::{FenceTarget, NodeFence};

use crate::error::Error;
use crate::events::{Kind, Recorder};
use crate::Ctx;

/// The shortest time between the start of two rounds when the second is run for a threshold
/// crossing ([`crossing_wake`]).
const CROSSING_MIN_GAP: Duration = Duration::from_millis(50);

/// What the loop remembers of the round before.
struct LastRound {
    started: Instant,
    took: Duration,
    judged: Mono,
}

/// Runs the tick forever: a round at every tick, and one more when a node's silence reaches a
/// policy's threshold between two ticks (see `crossing_wake`).
pub async fn run(ctx: Arc<Ctx>) {
    let mut interval = tokio::time::interval(ctx.settings.tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported: HashMap<String, String> = HashMap::new();
    let mut shared = Shared::default();
    let mut last: Option<LastRound> = None;
    loop {
        let wake = last.as_ref().and_then(|l| crossing_wake(&ctx, l));
        tokio::select! {
            _ = interval.tick() => {}
            () = sleep_until(wake) => {}
        }
        let started = Instant::now();
        let judged = round(&ctx, &mut reported, &mut shared).await;
        last = Some(LastRound {
            started,
            took: started.elapsed(),
            judged,
        });
    }
}

/// Sleeps until `wake`, forever if `None`.
async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// When to run a round before the next tick: at the first moment after the last round's
/// judgement at which a node's silence reaches a policy's Suspect or Unhealthy threshold
/// ([`palisade_decide::detector::Detector::next_crossing`]), so that a verdict that depends
/// on it is not late by up to a tick (a quarter of a second at the default resync). `None`
/// when no node has such a moment.
///
/// Guarantees: such a round is an ordinary round (the same observation and decision, at
/// another moment), so it changes when a verdict is reached, never what it is; it starts no
/// sooner than twice the last round's duration after that round's start, and never within
/// [`CROSSING_MIN_GAP`], so crossings, however many, keep the rounds to half a core.
fn crossing_wake(ctx: &Ctx, last: &LastRound) -> Option<Instant> {
    let thresholds: Vec<Duration> = ctx
        .cache
        .policies
        .state()
        .iter()
        .flat_map(|p| {
            let t = Thresholds::from(&p.spec.detection);
            [t.suspect_after, t.unhealthy_after]
        })
        .collect();
    let at = ctx
        .memory
        .lock()
        .detector
        .next_crossing(last.judged, &thresholds)?;
    let earliest = last.started + CROSSING_MIN_GAP.max(last.took * 2);
    Some(ctx.instant_of(at).max(earliest))
}

/// One round (see the module); returns the moment it judged.
async fn round(
    ctx: &Arc<Ctx>,
    reported: &mut HashMap<String, String>,
    shared: &mut Shared,
) -> Mono {
    let now = ctx.now();
    observe(ctx, now);
    // Every replica remembers when a quorum guard held, so a standby that takes over
    // knows what the leader knew.
    let snap = snapshot(ctx, now, shared);
    record_guards(ctx, &snap);
    // Tokens only go up: never act below a token some NodeFence already recorded (the
    // leader Lease may have been deleted with its namespace, or restored from a backup).
    if let Some(highest) = ctx
        .cache
        .fences
        .state()
        .iter()
        .filter_map(|f| f.status.as_ref()?.fencing_token)
        .max()
    {
        ctx.leader.raise_floor(highest);
    }
    let token = ctx.leader.token();
    ctx.metrics.tick(token.is_some());
    let Some(token) = token else {
        reported.clear();
        return now.mono;
    };
    if ctx.cache.sight.blind(Instant::now()) {
        // The caches may lack renewals: no decision until sight returns (and then
        // silence counts from its return, see crate::sight).
        tracing::info!("no decision this round: the API server is out of sight");
        crate::reconcile::ensure_workers(ctx, token);
        return now.mono;
    }
    match decide_round(ctx, snap, reported).await {
        Ok(created) => {
            for name in created {
                crate::reconcile::start_worker(ctx, name, token);
            }
        }
        Err(e) => tracing::warn!(error = %e, "decision round failed"),
    }
    crate::reconcile::ensure_workers(ctx, token);
    now.mono
}

/// Step 1: feed the detector.
pub fn observe(ctx: &Ctx, now: Clocks) {
    let nodes = ctx.cache.nodes.state();
    let mut memory = ctx.memory.lock();
    memory.nodes_now(nodes.iter().filter_map(|n| n.metadata.name.as_deref()));
    if let Some(at) = ctx.cache.sight.restored_at() {
        memory.blind(ctx.mono_of(at));
    }
    for node in &nodes {
        let name = node.name_any();
        let lease = ctx
            .cache
            .leases
            .get(&ObjectRef::new(&name).within(crate::cache::NODE_LEASE_NAMESPACE));
        let renew = lease
            .as_deref()
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
            .map(|t| t.0);
        let heartbeat = lease_heartbeat(node, lease.as_deref());
        let (seen, write) = memory.observe(&name, heartbeat, renew, now, || {
            let mut ad = palisade_decide::convert::advertisement(lease.as_deref(), Some(node));
            planted_watchdog(&mut ad);
            ad
        });
        // A first sighting (a controller start) may carry any old stamp: only a change
        // observed late says something about the node's clock.
        if write == Some(palisade_decide::majority::Write::Untimely) && seen == Observed::Changed {
            ctx.metrics.untimely_renewal(&name);
            tracing::warn!(node = %name, renew_time = ?renew, "a Lease renewal stamped in the future or observed late: the node does not count toward the healthy majority until its next timely renewal (check the clocks)");
        }
    }
}

/// The node's heartbeat markers (see [`palisade_decide::convert::heartbeat`] for which writes
/// count as life), from the cache or from a fresh read alike.
pub(crate) fn lease_heartbeat(
    node: &Node,
    lease: Option<&k8s_openapi::api::coordination::v1::Lease>,
) -> Heartbeat {
    let mut hb = palisade_decide::convert::heartbeat(node, lease);
    if palisade_fence::planted::active(palisade_fence::planted::Planted::IgnoreCompanionWrites) {
        hb.companion_written = None;
    }
    hb
}

/// The phase of a fence (a missing status is Pending).
pub fn phase_of(f: &NodeFence) -> Phase {
    f.status.as_ref().map(|s| s.phase).unwrap_or(Phase::Pending)
}

/// The node's fence state for the decision, and the end times of its finished fences that
/// count toward the cooldown and escalation limit ([`palisade_decide::escalation::counted_end`]).
fn fence_state(
    fences: &[Arc<NodeFence>],
    node: &str,
) -> (FenceState, Vec<k8s_openapi::jiff::Timestamp>) {
    FenceState::of(fences.iter().filter(|f| f.spec.node_name == node).map(|f| {
        (
            &f.spec,
            f.status.as_ref(),
            f.metadata.creation_timestamp.as_ref().map(|t| t.0),
        )
    }))
}

/// The pod as the decision sees it, its claims read from the PVC cache (an unknown claim
/// counts as stateful: see [`palisade_decide::convert::pod_snapshot`]).
fn pod_snapshot(ctx: &Ctx, pod: &Pod) -> PodSnapshot {
    palisade_decide::convert::pod_snapshot(pod, |namespace, claim| {
        ctx.cache.pvcs.get(&ObjectRef::new(claim).within(namespace))
    })
}

/// Unfinished pods by the node they are bound to, indexed once per round (one pass over the
/// pod cache instead of one per node).
pub fn pods_by_node(ctx: &Ctx) -> HashMap<String, Vec<Arc<Pod>>> {
    let mut by_node: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
    for p in ctx.cache.pods.state() {
        let finished = palisade_decide::convert::pod_is_terminal(&p);
        if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            if !finished {
                by_node.entry(node).or_default().push(p);
            }
        }
    }
    by_node
}

/// Normalizes a PDB of either API version: `policy/v1beta1` treats an empty selector as
/// selecting nothing (`None`), `policy/v1` as selecting every pod of the namespace.
pub fn pdb_snapshot(
    v1: bool,
    namespace: String,
    name: String,
    data: &serde_json::Value,
) -> PdbSnapshot {
    let selector = data
        .get("spec")
        .and_then(|s| s.get("selector"))
        .filter(|s| !s.is_null())
        .and_then(|s| {
            serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>(
                s.clone(),
            )
            .ok()
        })
        .filter(|s| {
            v1 || s.match_labels.as_ref().is_some_and(|m| !m.is_empty())
                || s.match_expressions.as_ref().is_some_and(|m| !m.is_empty())
        });
    // Unknown (None) until the disruption controller has computed this generation's status.
    let generation = data
        .get("metadata")
        .and_then(|m| m.get("generation"))
        .and_then(serde_json::Value::as_i64);
    let status = data.get("status").filter(|s| {
        s.get("observedGeneration")
            .and_then(serde_json::Value::as_i64)
            >= generation
    });
    let disruptions_allowed = status
        .and_then(|s| s.get("disruptionsAllowed"))
        .and_then(|v| v.as_i64())
        .and_then(|v| i32::try_from(v).ok());
    PdbSnapshot {
        namespace,
        name,
        selector,
        disruptions_allowed,
    }
}

fn pdb_snapshots(ctx: &Ctx) -> Vec<PdbSnapshot> {
    let v1 = ctx.cache.pdb_version == "policy/v1";
    ctx.cache
        .pdbs
        .state()
        .iter()
        .map(|p| pdb_snapshot(v1, p.namespace().unwrap_or_default(), p.name_any(), &p.data))
        .collect()
}

/// What each node's snapshot takes from the previous round's: its exclusion, read from the
/// annotations again only when the cache holds a new Node (a watch event replaces the cached
/// `Arc`). Labels and FenceTarget specs are lent by the cached objects ([`Lent`]): at 10,000
/// nodes, copying them four times a second was a third of the controller's CPU, and keeping
/// copies of them 12 MB.
///
/// Guarantees: a round's snapshot carries exactly what the cached objects say (a changed
/// object is a new `Arc`, never one changed in place); nodes gone from the cache are dropped.
#[derive(Default)]
pub struct Shared {
    nodes: HashMap<String, SharedNode>,
    /// The round whose nodes are kept (see [`Shared::sweep`]).
    round: u64,
}

struct SharedNode {
    node: Arc<Node>,
    exclusion: Option<Exclusion>,
    seen: u64,
}

impl Shared {
    /// The node's exclusion, read from its annotations again only when the Node changed.
    fn exclusion(&mut self, name: &str, node: &Arc<Node>) -> Option<Exclusion> {
        let round = self.round;
        let entry = match self.nodes.get_mut(name) {
            Some(e) if Arc::ptr_eq(&e.node, node) => e,
            _ => {
                let fresh = SharedNode {
                    node: node.clone(),
                    exclusion: Exclusion::from_annotations(node.annotations()),
                    seen: round,
                };
                self.nodes.insert(name.to_string(), fresh);
                self.nodes.get_mut(name).expect("inserted")
            }
        };
        entry.seen = round;
        entry.exclusion
    }

    /// Ends a round: forgets the nodes it did not see.
    fn sweep(&mut self) {
        let round = self.round;
        self.nodes.retain(|_, e| e.seen == round);
        self.round += 1;
    }
}

/// Builds the decision input from the caches (`shared`: what the previous round's snapshot
/// can lend this one).
pub fn snapshot(ctx: &Ctx, now: Clocks, shared: &mut Shared) -> Snapshot {
    let mut fences_by_node: HashMap<String, Vec<Arc<NodeFence>>> = HashMap::new();
    for f in ctx.cache.fences.state() {
        fences_by_node
            .entry(f.spec.node_name.clone())
            .or_default()
            .push(f);
    }
    let pods = pods_by_node(ctx);
    let targets = ctx.cache.targets.state();
    let target_of: HashMap<&str, &Arc<FenceTarget>> = targets
        .iter()
        .filter_map(|t| Some((t.metadata.name.as_deref()?, t)))
        .collect();
    let memory = ctx.memory.lock();
    let power = ctx.power.lock();
    let nodes = ctx
        .cache
        .nodes
        .state()
        .iter()
        .map(|n| {
            let name = n.name_any();
            let exclusion = shared.exclusion(&name, n);
            let fence_target = target_of
                .get(name.as_str())
                .map(|t| Lent::of(Arc::clone(t)));
            let (fence, past_fences) =
                fence_state(fences_by_node.get(&name).map_or(&[], Vec::as_slice), &name);
            let seen = memory.detector.sighting(&name);
            NodeSnapshot {
                labels: Lent::of(n.clone()),
                last_heartbeat_change: seen.as_ref().map_or(now.mono, |s| s.last_change),
                renewal_gap: seen.as_ref().and_then(|s| s.renewal_gap),
                heartbeat_marker: seen.as_ref().map(|s| s.marker.clone()),
                long_gaps: seen.map(|s| s.long_gaps).unwrap_or_default(),
                power_off: power.off_run(&name),
                hosts_bridge: ctx.settings.bridge_node.as_deref() == Some(name.as_str()),
                exclusion,
                advertisement: memory.advertised_by(&name),
                fence_target,
                pods: pods
                    .get(&name)
                    .map(|ps| ps.iter().map(|p| pod_snapshot(ctx, p)).collect())
                    .unwrap_or_default(),
                fence,
                past_fences,
                name,
            }
        })
        .collect();
    drop(power);
    shared.sweep();
    let restored = ctx.cache.sight.restored_at().map(|at| ctx.mono_of(at));
    Snapshot {
        now,
        policies: ctx
            .cache
            .policies
            .state()
            .iter()
            .map(|p| {
                let name = p.name_any();
                // Silence during this replica's blind spell is no evidence either: the end
                // of its last blind spell counts as a hold (crate::sight).
                let held = memory.guard_held.get(&name).copied();
                PolicySnapshot {
                    guard_held_at: held.max(restored),
                    name,
                    spec: p.spec.clone(),
                }
            })
            .collect(),
        nodes,
        pdbs: pdb_snapshots(ctx),
    }
}

/// Remembers, per policy, that its quorum guard holds in `snap` (every replica, every tick).
fn record_guards(ctx: &Ctx, snap: &Snapshot) {
    let mut memory = ctx.memory.lock();
    for policy in guards_holding(snap) {
        memory.guard_held(&policy, snap.now.mono);
    }
}

/// Decides, creates the NodeFences decided, reports holds; returns the names created.
async fn decide_round(
    ctx: &Ctx,
    snap: Snapshot,
    reported: &mut HashMap<String, String>,
) -> Result<Vec<String>, Error> {
    let mut created = Vec::new();
    let decisions = decide(&snap);
    {
        let v = &mut ctx.memory.lock().verdicts;
        v.clear();
        for d in &decisions {
            v.insert(d.node.clone(), d.verdict.clone());
        }
    }
    let decided: HashSet<&str> = decisions.iter().map(|d| d.node.as_str()).collect();
    reported.retain(|n, _| decided.contains(n.as_str()));
    let fence_of: HashMap<&str, FenceState> = snap
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.fence))
        .collect();
    for d in &decisions {
        let label = d.verdict.label();
        let changed = reported.get(&d.node) != Some(&label);
        if changed {
            reported.insert(d.node.clone(), label.clone());
            ctx.metrics.decision(&label);
            tracing::info!(node = %d.node, verdict = %label, message = %d.verdict.message(), "decision");
        }
        let node_ref = fence_of.get(d.node.as_str()).copied();
        match &d.verdict {
            Verdict::Fence(plan) if node_ref == Some(FenceState::None) => {
                let mut message = d.verdict.message();
                if matches!(plan.cause, palisade_decide::Cause::PowerOff { .. }) {
                    if let Some(said) = ctx.power_said.lock().get(&d.node) {
                        message.push_str(&format!(" ({said})"));
                    }
                }
                created.extend(create_fence(ctx, &d.node, &message).await?);
            }
            Verdict::Hold(reason) if changed => {
                ctx.metrics.held(reason.label());
                let node = ctx.cache.nodes.get(&ObjectRef::new(&d.node));
                if let Some(node) = node {
                    let kind = match reason {
                        palisade_decide::HoldReason::NoPolicy
                        | palisade_decide::HoldReason::DryRun { .. }
                        | palisade_decide::HoldReason::Excluded(_)
                        | palisade_decide::HoldReason::Paused { .. } => Kind::Normal,
                        _ => Kind::Warning,
                    };
                    // Off the decision path: a storm of holds must not delay the next node's
                    // decision by one API round trip each, nor put one request per node on
                    // the API server at once (a bounded queue and a few writers, see events).
                    ctx.events.publish_later(
                        Recorder::reference(node.as_ref()),
                        kind,
                        format!("FenceHeld{}", camel(reason.label())),
                        d.verdict.message(),
                    );
                }
            }
            _ => {}
        }
    }
    Ok(created)
}

/// `quorum_lost` → `QuorumLost`.
pub fn camel(label: &str) -> String {
    label
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The node's fence readiness history, when its last check found it not ready (the fence is
/// tried all the same: the device may have recovered).
fn readiness_note(ctx: &Ctx, node: &str) -> String {
    let readiness = ctx
        .cache
        .targets
        .get(&ObjectRef::new(node))
        .and_then(|t| t.status.as_ref()?.readiness.clone());
    match readiness {
        Some(r) if !r.ready => format!(
            "; its fence looked NOT ready since {}: {} (trying every level anyway)",
            r.since
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            crate::readiness::summary(&r)
        ),
        _ => String::new(),
    }
}

/// Creates a NodeFence for `node` unless one is unfinished; returns its name if created.
async fn create_fence(ctx: &Ctx, node: &str, message: &str) -> Result<Option<String>, Error> {
    let api: Api<NodeFence> = Api::all(ctx.client.clone());
    // The cache may lag behind our own create: ask the API whether one is unfinished.
    let existing = api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("listing NodeFences", e))?;
    if existing
        .items
        .iter()
        .any(|f| f.spec.node_name == node && !phase_of(f).is_terminal())
    {
        return Ok(None);
    }
    // The watch may lag behind the node (a slow or stalled informer): fence only if the API
    // itself still holds the heartbeat the detector judged silent. A renewal the watch has not
    // delivered yet is not silence.
    let watched = ctx.memory.lock().detector.marker(node);
    let stored = crate::reconcile::fresh_marker(ctx, node).await?;
    if stored != watched
        && !palisade_fence::planted::active(palisade_fence::planted::Planted::FenceOnWatchedSilence)
    {
        tracing::warn!(
            node,
            ?watched,
            ?stored,
            "not fencing: the node's heartbeat changed since the watch last delivered it (the watch is behind); judged again at the next tick"
        );
        ctx.metrics.held("watch_behind");
        return Ok(None);
    }
    let mut nf = NodeFence::new(
        "",
        NodeFenceSpec {
            node_name: node.to_string(),
            reason: message.to_string(),
            requested_by: RequestedBy::Controller,
            overrides: Overrides::default(),
        },
    );
    nf.metadata.name = None;
    nf.metadata.generate_name = Some(format!("{node}-"));
    nf.metadata.labels = Some(BTreeMap::from([(
        "palisade.dev/node".to_string(),
        node.to_string(),
    )]));
    let created = api
        .create(&PostParams::default(), &nf)
        .await
        .map_err(|e| Error::kube(format!("creating NodeFence for {node}"), e))?;
    tracing::info!(node, nodefence = %created.name_any(), "NodeFence created");
    ctx.events
        .publish(
            Recorder::reference(&created),
            Kind::Normal,
            "FenceRequested",
            &format!("node {node}: {message}{}", readiness_note(ctx, node)),
        )
        .await;
    Ok(Some(created.name_any()))
}

/// A negative control (debug builds only, `PALISADE_PLANTED_BUGS=TrustWithoutWatchdog`): a
/// node that advertises a self-fence timeout but no armed watchdog is taken to have a
/// `nowayout` one that resets the machine, so its self-fence is trusted although nothing would
/// reset a hung node.
fn planted_watchdog(ad: &mut palisade_model::advertise::Advertisement) {
    use palisade_fence::planted::{active, Planted};
    if ad.watchdog.is_none()
        && ad.self_fence_after.is_some()
        && active(Planted::TrustWithoutWatchdog)
    {
        ad.watchdog = Some(palisade_model::advertise::Watchdog {
            timeout: std::time::Duration::ZERO,
            nowayout: true,
            action: Some(palisade_model::advertise::WatchdogAction::Reset),
            driver: Some("planted".into()),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_pdb_selector_selects_nothing_in_v1beta1_and_everything_in_v1() {
        let data =
            serde_json::json!({"spec": {"selector": {}}, "status": {"disruptionsAllowed": 0}});
        let old = pdb_snapshot(false, "ns".into(), "p".into(), &data);
        assert_eq!(old.selector, None);
        let new = pdb_snapshot(true, "ns".into(), "p".into(), &data);
        assert_eq!(new.selector, Some(Default::default()));
        let labelled = serde_json::json!({"spec": {"selector": {"matchLabels": {"app": "db"}}},
                                         "status": {"disruptionsAllowed": 1}});
        let p = pdb_snapshot(false, "ns".into(), "p".into(), &labelled);
        assert!(p.selector.is_some());
        assert_eq!(p.disruptions_allowed, Some(1));
    }

    #[test]
    fn camel_case_of_labels() {
        assert_eq!(camel("quorum_lost"), "QuorumLost");
        assert_eq!(camel("no_policy"), "NoPolicy");
    }

    #[test]
    fn most_advanced_unfinished_fence_wins_and_finished_ones_are_past() {
        let mk = |phase: Option<Phase>| {
            let mut f = NodeFence::new(
                "x",
                NodeFenceSpec {
                    node_name: "n".into(),
                    reason: String::new(),
                    requested_by: RequestedBy::Controller,
                    overrides: Overrides::default(),
                },
            );
            if let Some(p) = phase {
                f.status = Some(palisade_model::NodeFenceStatus {
                    phase: p,
                    ..Default::default()
                });
            }
            Arc::new(f)
        };
        let (s, past) = fence_state(&[mk(None), mk(Some(Phase::Fencing))], "n");
        assert_eq!(s, FenceState::InFlight);
        assert!(past.is_empty());
        let (s, _) = fence_state(&[mk(None)], "n");
        assert_eq!(s, FenceState::Pending { manual: None });
        let (s, _) = fence_state(&[mk(Some(Phase::Released))], "other");
        assert_eq!(s, FenceState::None);
    }

    #[test]
    fn fences_that_ended_before_fencing_began_are_not_past_fences() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let at = |s: i64| k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mk = |path: &[Phase]| {
            let mut f = NodeFence::new(
                "x",
                NodeFenceSpec {
                    node_name: "n".into(),
                    reason: String::new(),
                    requested_by: RequestedBy::Controller,
                    overrides: Overrides::default(),
                },
            );
            f.status = Some(palisade_model::NodeFenceStatus {
                phase: *path.last().unwrap(),
                transitions: path
                    .iter()
                    .enumerate()
                    .map(|(i, p)| palisade_model::nodefence::Transition {
                        phase: *p,
                        at: MicroTime(at(i as i64)),
                        message: String::new(),
                    })
                    .collect(),
                ..Default::default()
            });
            Arc::new(f)
        };
        use Phase::*;
        // Benign flaps: requests cancelled because the node renewed again, one superseded.
        let flaps = [
            mk(&[Pending, Done]),
            mk(&[Pending, Done]),
            mk(&[Pending, Failed]),
        ];
        let (s, past) = fence_state(&flaps, "n");
        assert_eq!(s, FenceState::None);
        assert!(past.is_empty(), "cancelled fences count: {past:?}");
        // A real fence counts, from when it ended.
        let real = mk(&[
            Pending, Fencing, Fenced, Releasing, Released, Recovering, Done,
        ]);
        let (_, past) = fence_state(&[flaps[0].clone(), real], "n");
        assert_eq!(past, vec![at(6)]);
    }
}
