//! The input of [`crate::decide::decide`]: a plain, owned picture of the cluster that the I/O
//! controller assembles from its caches. Nothing here talks to anything.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use palisade_model::nodefence::Overrides;
use palisade_model::policy::FencingPolicySpec;
use palisade_model::target::{FenceTarget, FenceTargetSpec};

use crate::clock::{Clocks, Mono};

/// A part of an object the controller caches (a Node's labels, a FenceTarget's spec), lent to
/// a decision round rather than copied: the round reads it as a `&T`, and the cached object
/// lives as long as the snapshot does. At 10,000 nodes, copies of every node's labels and
/// FenceTarget spec held 12 MB beside the objects they were copied from.
///
/// Guarantees: what a `Lent` reads never changes (the cache replaces an object with a new
/// `Arc` on a watch event, it never changes one in place).
pub struct Lent<T: 'static>(Arc<dyn Part<T>>);

/// An object that holds a `T` (see [`Lent`]); every `T` holds itself.
pub trait Part<T>: Send + Sync {
    /// The part.
    fn part(&self) -> &T;
}

impl<T: Send + Sync> Part<T> for T {
    fn part(&self) -> &T {
        self
    }
}

impl Part<BTreeMap<String, String>> for k8s_openapi::api::core::v1::Node {
    fn part(&self) -> &BTreeMap<String, String> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        self.metadata.labels.as_ref().unwrap_or(&NONE)
    }
}

impl Part<FenceTargetSpec> for FenceTarget {
    fn part(&self) -> &FenceTargetSpec {
        &self.spec
    }
}

impl<T> Lent<T> {
    /// `owner`'s `T`, shared with whoever else holds `owner`.
    pub fn of<O: Part<T> + 'static>(owner: Arc<O>) -> Self {
        Lent(owner)
    }
}

impl<T: Send + Sync + 'static> From<T> for Lent<T> {
    fn from(value: T) -> Self {
        Lent(Arc::new(value))
    }
}

impl<T> std::ops::Deref for Lent<T> {
    type Target = T;
    fn deref(&self) -> &T {
        Part::<T>::part(&*self.0)
    }
}

impl<T> Clone for Lent<T> {
    fn clone(&self) -> Self {
        Lent(self.0.clone())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Lent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: PartialEq> PartialEq for Lent<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Default + Send + Sync + 'static> Default for Lent<T> {
    fn default() -> Self {
        T::default().into()
    }
}

/// Everything a decision round looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Both clocks, read once for the round.
    pub now: Clocks,
    /// Every `FencingPolicy` (name, spec).
    pub policies: Vec<PolicySnapshot>,
    /// Every Node.
    pub nodes: Vec<NodeSnapshot>,
    /// PodDisruptionBudgets (policy/v1 or v1beta1, normalized by the I/O layer).
    pub pdbs: Vec<PdbSnapshot>,
}

/// A `FencingPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySnapshot {
    /// `metadata.name`.
    pub name: String,
    /// The spec.
    pub spec: FencingPolicySpec,
    /// The last round in which this policy's quorum guard held ([`crate::guards_holding`]),
    /// as the caller remembers it across rounds; `None`: not since the caller started.
    ///
    /// A node silent through a control-plane outage is not judged by that silence: once the
    /// guard lets go, it gets the full Unhealthy threshold counted from this instant (its
    /// writes could not land while the API or etcd was out).
    pub guard_held_at: Option<Mono>,
}

/// A Node, with what the controller knows about it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSnapshot {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels` (topology domain, policy selection), lent by the cached Node.
    pub labels: Lent<BTreeMap<String, String>>,
    /// When the detector last observed a heartbeat change ([`crate::detector::Detector::last_change`]).
    pub last_heartbeat_change: crate::clock::Mono,
    /// The node's renewal interval as observed ([`crate::detector::Detector::renewal_gap`]).
    pub renewal_gap: Option<Duration>,
    /// The node's longest recent renewal intervals as observed
    /// ([`crate::detector::Detector::long_gaps`]): a node that renewed late recently.
    pub long_gaps: Vec<crate::detector::LongGap>,
    /// The node's current run of power-off reads from its own identity-pinned fence device
    /// ([`crate::power::PowerWatch::off_run`]).
    pub power_off: Option<crate::power::OffRun>,
    /// The heartbeat marker observed at `last_heartbeat_change` ([`crate::detector::Detector::marker`]).
    pub heartbeat_marker: Option<std::sync::Arc<str>>,
    /// Exclusions read from the node's annotations.
    pub exclusion: Option<Exclusion>,
    /// The self-fence advertisement the node agent wrote with its last renewal the
    /// controller observed (read from the Lease, never from the Node object).
    pub advertisement: palisade_model::advertise::Advertisement,
    /// The node hosts the firmware-bridge (then no level that goes through the bridge may
    /// fence it).
    pub hosts_bridge: bool,
    /// The node's `FenceTarget` spec, if one exists, lent by the cached FenceTarget.
    pub fence_target: Option<Lent<FenceTargetSpec>>,
    /// Non-terminal pods bound to the node.
    pub pods: Vec<PodSnapshot>,
    /// The node's `NodeFence` state.
    pub fence: FenceState,
    /// End times of this node's finished `NodeFence`s (Done or Failed), any order.
    pub past_fences: Vec<Timestamp>,
}

/// Why a node is excluded from fencing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Exclusion {
    /// Annotation `palisade.dev/exclude: "true"`.
    OptOut,
    /// Annotation `palisade.dev/maintenance` present.
    Maintenance,
}

impl Exclusion {
    /// Read the exclusion from node annotations (opt-out wins over maintenance).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Option<Self> {
        if annotations
            .get(palisade_model::ANNOTATION_EXCLUDE)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            Some(Self::OptOut)
        } else if annotations.contains_key(palisade_model::ANNOTATION_MAINTENANCE) {
            Some(Self::Maintenance)
        } else {
            None
        }
    }
}

/// A node's `NodeFence` situation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FenceState {
    /// No unfinished `NodeFence`.
    #[default]
    None,
    /// A `NodeFence` in Pending, waiting for this decision.
    Pending {
        /// Created by a person (with their overrides) or by the controller.
        manual: Option<Overrides>,
    },
    /// A `NodeFence` in Fencing, Fenced or Releasing: counts against the concurrency limits.
    InFlight,
    /// A `NodeFence` in Released or Recovering: the node is fenced; nothing to decide.
    Settled,
}

impl FenceState {
    /// A node's fence state from its `NodeFence`s (`spec`, `status`, creation time), and the
    /// times its finished fences count from toward the cooldown and the escalation limit
    /// ([`crate::escalation::counted_end`]).
    ///
    /// Guarantees: the most advanced unfinished fence wins (`InFlight` over `Settled` over
    /// `Pending`), so a second request beside a running fence never makes the node look
    /// undecided; a fence that ended before fencing began (a cancelled flap) never counts
    /// toward the cooldown or the limit.
    pub fn of<'a>(
        fences: impl IntoIterator<
            Item = (
                &'a palisade_model::NodeFenceSpec,
                Option<&'a palisade_model::nodefence::NodeFenceStatus>,
                Option<Timestamp>,
            ),
        >,
    ) -> (FenceState, Vec<Timestamp>) {
        use palisade_model::nodefence::{Phase, RequestedBy};
        let mut state = FenceState::None;
        let mut past = Vec::new();
        for (spec, status, created) in fences {
            let here = match status.map_or(Phase::Pending, |s| s.phase) {
                Phase::Pending => FenceState::Pending {
                    manual: (spec.requested_by == RequestedBy::Manual).then_some(spec.overrides),
                },
                Phase::Fencing | Phase::Fenced | Phase::Releasing => FenceState::InFlight,
                Phase::Released | Phase::Recovering => FenceState::Settled,
                Phase::Done | Phase::Failed => {
                    past.extend(crate::escalation::counted_end(status, created));
                    continue;
                }
            };
            state = match (state, here) {
                (FenceState::InFlight, _) | (_, FenceState::InFlight) => FenceState::InFlight,
                (FenceState::Settled, _) | (_, FenceState::Settled) => FenceState::Settled,
                (_, h) => h,
            };
        }
        (state, past)
    }
}

/// A pod bound to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSnapshot {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels (PDB selection).
    pub labels: BTreeMap<String, String>,
    /// `spec.priority` (0 when unset).
    pub priority: i32,
    /// The pod's tolerations of the `node.kubernetes.io/unreachable:NoExecute` taint.
    pub unreachable: Tolerance,
    /// Whether the pod uses a PVC whose volume is ReadWriteOnce (or ReadWriteOncePod).
    pub uses_rwo_volume: bool,
}

/// How long a pod tolerates `node.kubernetes.io/unreachable:NoExecute`, computed as the taint
/// manager does ([`Tolerance::from_tolerations`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tolerance {
    /// No matching toleration: evicted at once.
    None,
    /// Tolerated for this long.
    For(Duration),
    /// Tolerated forever (a matching toleration without `tolerationSeconds`, as DaemonSets have).
    Forever,
}

/// One toleration, reduced to the fields that matter here.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TolerationSnapshot {
    /// `key` (empty with operator Exists matches every taint).
    pub key: String,
    /// `operator`: `Exists` or `Equal` (the default).
    pub operator: String,
    /// `effect` (empty matches every effect).
    pub effect: String,
    /// `tolerationSeconds`.
    pub toleration_seconds: Option<i64>,
}

impl Tolerance {
    /// The taint manager's rule (`getMinTolerationTime`) over the tolerations matching
    /// `node.kubernetes.io/unreachable:NoExecute`: none match → evict now; any non-positive
    /// seconds → now; otherwise the minimum seconds; only unbounded ones → forever.
    pub fn from_tolerations(tolerations: &[TolerationSnapshot]) -> Self {
        let matching: Vec<&TolerationSnapshot> = tolerations
            .iter()
            .filter(|t| {
                let key_ok = (t.key.is_empty() && t.operator == "Exists")
                    || t.key == palisade_model::UNREACHABLE_TAINT_KEY;
                let effect_ok = t.effect.is_empty() || t.effect == "NoExecute";
                key_ok && effect_ok
            })
            .collect();
        if matching.is_empty() {
            return Tolerance::None;
        }
        let mut min: Option<i64> = None;
        for t in &matching {
            if let Some(s) = t.toleration_seconds {
                if s <= 0 {
                    return Tolerance::For(Duration::ZERO);
                }
                min = Some(min.map_or(s, |m| m.min(s)));
            }
        }
        match min {
            Some(s) => Tolerance::For(Duration::from_secs(s.unsigned_abs())),
            None => Tolerance::Forever,
        }
    }
}

/// A PodDisruptionBudget.
#[derive(Debug, Clone, PartialEq)]
pub struct PdbSnapshot {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Pod selector. `None` selects no pod: the I/O layer maps a policy/v1beta1 empty selector
    /// to `None` and a policy/v1 empty selector to `Some(empty)` (which selects every pod in the
    /// namespace), matching each API version's semantics.
    pub selector: Option<LabelSelector>,
    /// `status.disruptionsAllowed`, or `None` while the disruption controller has not computed
    /// the status of the PDB's current generation (a new or edited PDB): unknown, so it never
    /// makes a fence urgent.
    pub disruptions_allowed: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tol(key: &str, op: &str, effect: &str, secs: Option<i64>) -> TolerationSnapshot {
        TolerationSnapshot {
            key: key.into(),
            operator: op.into(),
            effect: effect.into(),
            toleration_seconds: secs,
        }
    }

    const U: &str = "node.kubernetes.io/unreachable";

    #[test]
    fn the_most_advanced_unfinished_fence_is_the_nodes_state() {
        use palisade_model::nodefence::{NodeFenceStatus, Phase, RequestedBy};
        use palisade_model::NodeFenceSpec;
        let spec = |by| NodeFenceSpec {
            node_name: "m0".into(),
            reason: "silent".into(),
            requested_by: by,
            overrides: Overrides::default(),
        };
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).expect("a valid time");
        let status = |path: &[Phase]| {
            let mut st = NodeFenceStatus::default();
            for (k, p) in path.iter().enumerate() {
                st.transition(*p, at(k as i64), "test")
                    .expect("a legal transition");
            }
            st
        };
        let controller = spec(RequestedBy::Controller);
        let manual = spec(RequestedBy::Manual);
        let fencing = status(&[Phase::Pending, Phase::Fencing]);
        let cancelled = status(&[Phase::Pending, Phase::Done]);
        let failed = status(&[Phase::Pending, Phase::Fencing, Phase::Failed]);
        // A person's request beside a running fence: the node is in flight, whatever the order.
        for order in [[0, 1], [1, 0]] {
            let fences = [
                (&manual, None, Some(at(5))),
                (&controller, Some(&fencing), Some(at(0))),
            ];
            let (state, past) = FenceState::of(order.map(|k| fences[k]));
            assert_eq!(state, FenceState::InFlight);
            assert!(past.is_empty());
        }
        let (state, _) = FenceState::of([(&manual, None, Some(at(5)))]);
        assert_eq!(
            state,
            FenceState::Pending {
                manual: Some(Overrides::default())
            }
        );
        // A cancelled fence never counts toward the cooldown; one that began fencing does.
        let (state, past) = FenceState::of([
            (&controller, Some(&cancelled), Some(at(0))),
            (&controller, Some(&failed), Some(at(0))),
        ]);
        assert_eq!(state, FenceState::None);
        assert_eq!(past, vec![at(2)]);
    }

    #[test]
    fn tolerance_follows_the_taint_manager() {
        let s = |n| Tolerance::For(Duration::from_secs(n));
        let cases: Vec<(Vec<TolerationSnapshot>, Tolerance)> = vec![
            (vec![], Tolerance::None),
            (
                vec![tol(
                    "node.kubernetes.io/not-ready",
                    "Exists",
                    "NoExecute",
                    Some(300),
                )],
                Tolerance::None,
            ),
            (vec![tol(U, "Exists", "NoExecute", Some(300))], s(300)),
            (
                vec![tol(U, "Exists", "NoSchedule", Some(300))],
                Tolerance::None,
            ),
            (vec![tol(U, "Exists", "", Some(30))], s(30)),
            (
                vec![tol(U, "Exists", "NoExecute", None)],
                Tolerance::Forever,
            ),
            (vec![tol("", "Exists", "", None)], Tolerance::Forever),
            (
                vec![
                    tol(U, "Exists", "NoExecute", None),
                    tol(U, "Exists", "NoExecute", Some(60)),
                ],
                s(60),
            ),
            (
                vec![
                    tol(U, "Exists", "NoExecute", Some(60)),
                    tol(U, "Exists", "NoExecute", Some(20)),
                ],
                s(20),
            ),
            (
                vec![
                    tol(U, "Exists", "NoExecute", Some(60)),
                    tol(U, "Exists", "NoExecute", Some(-5)),
                ],
                s(0),
            ),
        ];
        for (i, (tols, want)) in cases.iter().enumerate() {
            assert_eq!(Tolerance::from_tolerations(tols), *want, "case {i}");
        }
    }

    #[test]
    fn annotations_give_exclusions_and_self_fence() {
        let a = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(Exclusion::from_annotations(&a(&[])), None);
        assert_eq!(
            Exclusion::from_annotations(&a(&[("palisade.dev/exclude", "true")])),
            Some(Exclusion::OptOut)
        );
        assert_eq!(
            Exclusion::from_annotations(&a(&[("palisade.dev/exclude", "false")])),
            None
        );
        assert_eq!(
            Exclusion::from_annotations(&a(&[
                ("palisade.dev/maintenance", ""),
                ("palisade.dev/exclude", "TRUE")
            ])),
            Some(Exclusion::OptOut)
        );
        assert_eq!(
            Exclusion::from_annotations(&a(&[("palisade.dev/maintenance", "kernel")])),
            Some(Exclusion::Maintenance)
        );
    }
}
