//! `FencingPolicy`: which nodes Palisade may fence, and under which guards.
//!
//! Every field has a documented default (a serde default function, mirrored in the CRD schema),
//! so `spec: {}` is a complete, conservative policy. [`FencingPolicySpec::validate`] catches the
//! malformed policies the schema cannot express (cross-field rules, percentages, selectors).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The topology label used for per-domain limits and the all-zones-down rule by default.
pub const DEFAULT_TOPOLOGY_KEY: &str = "topology.kubernetes.io/zone";

/// Spec of a `FencingPolicy` (cluster-scoped): the operator's rules for fencing the nodes it selects.
///
/// Without a policy that selects a node, Palisade reports and never fences that node.
// kube's `printcolumn(...)` repeats `type_ = ...`, which clippy mistakes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "palisade.dev",
    version = "v1alpha1",
    kind = "FencingPolicy",
    plural = "fencingpolicies",
    shortname = "fpol",
    status = "crate::acceptance::ConfigStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    printcolumn(name = "Paused", type_ = "boolean", json_path = ".spec.paused"),
    printcolumn(name = "DryRun", type_ = "boolean", json_path = ".spec.dryRun"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FencingPolicySpec {
    /// Nodes this policy covers. The empty selector (the default) selects every node.
    #[serde(default)]
    pub node_selector: LabelSelector,
    /// When a silent node becomes Suspect and then Unhealthy.
    #[serde(default)]
    pub detection: Detection,
    /// Storm and quorum limits.
    #[serde(default)]
    pub limits: Limits,
    /// Pod forgiveness: how long to wait after a node becomes Unhealthy before fencing it.
    #[serde(default)]
    pub forgiveness: Forgiveness,
    /// Urgency when a PodDisruptionBudget covering the node's pods has no disruptions left.
    #[serde(default)]
    pub pdb: PdbRule,
    /// Which silent nodes are worth fencing. Default `StatefulOnly`.
    #[serde(default)]
    pub fence_when: FenceWhen,
    /// Whether a node that advertises self-fencing counts as fenced after its timeout.
    #[serde(default)]
    pub trust_self_fence: TrustSelfFence,
    /// What happens after the node's pods and volumes are released.
    #[serde(default)]
    pub recovery: Recovery,
    /// Cooldown and escalation limits, so a flapping node is not fenced in a loop.
    #[serde(default)]
    pub escalation: Escalation,
    /// Whether a power device that cannot prove which machine it powers (a PDU outlet, or a
    /// `bridge://` device, whose identity pin the controller cannot see) may act on its own.
    /// `Allowed` (the default): it acts when its level's turn comes. `AfterProof`: right
    /// before it acts, a direct IPMI or Redfish BMC of the node's FenceTarget must answer as
    /// the Node's machine (its `systemUUID`); otherwise nothing is sent to it and its level
    /// fails, so a dark BMC leaves the fence to a person. A FenceTarget reached only through
    /// the bridge has no BMC the controller can read: under `AfterProof` its power levels
    /// never act.
    #[serde(default)]
    pub power_without_identity: PowerWithoutIdentity,
    /// Stop starting new fences (fences already under way continue). Default false.
    #[serde(default)]
    pub paused: bool,
    /// Decide and report, but never start a fence. Default false.
    #[serde(default)]
    pub dry_run: bool,
}

/// Detection thresholds, measured on the controller's own monotonic clock from the last time it
/// *observed* the node's Lease `renewTime` or Ready heartbeat change.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Detection {
    /// Silent this long: Suspect. Default 10 s.
    #[serde(default = "default_suspect_after")]
    #[schemars(range(min = 1))]
    pub suspect_after_seconds: i64,
    /// Silent this long: Unhealthy (must exceed `suspectAfterSeconds`). Default 20 s.
    #[serde(default = "default_unhealthy_after")]
    #[schemars(range(min = 1))]
    pub unhealthy_after_seconds: i64,
    /// Power evidence: a node whose own fence device reports its machine off, on every read
    /// for this long, is Unhealthy at once, without waiting for `unhealthyAfterSeconds`
    /// (the controller reads each power device every `--power-watch-interval`). Only a direct
    /// IPMI or Redfish device pinned to the machine's identity gives evidence (a PDU outlet
    /// or a device behind the firmware-bridge does not), and only while the node is silent
    /// longer than one and a quarter of its own recent renewal intervals, with no renewal
    /// observed since the first off read. `0` turns power evidence off; a value at or above
    /// `unhealthyAfterSeconds` has no effect. Default 5 s: set it above the time your
    /// machines stay off in a power cycle (a power-cycled machine is not dead, and is judged
    /// by its silence).
    #[serde(default = "default_power_off_after")]
    #[schemars(range(min = 0))]
    pub power_off_after_seconds: i64,
}

fn default_suspect_after() -> i64 {
    10
}
fn default_unhealthy_after() -> i64 {
    20
}
fn default_power_off_after() -> i64 {
    5
}

impl Default for Detection {
    fn default() -> Self {
        Self {
            suspect_after_seconds: default_suspect_after(),
            unhealthy_after_seconds: default_unhealthy_after(),
            power_off_after_seconds: default_power_off_after(),
        }
    }
}

/// Storm and quorum limits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Quorum guard: when more covered nodes than this are silent (Suspect or Unhealthy), the
    /// controller's side is probably the partitioned one, so nothing is fenced. Nodes that
    /// answer but, within the last `unhealthyAfterSeconds`, went longer between two renewals
    /// than halfway from `suspectAfterSeconds` to `unhealthyAfterSeconds` count too: heartbeats arriving late from several nodes
    /// mean a starving API server, not dead nodes. A count (`2`) or a percentage of covered
    /// nodes (`"40%"`, rounded down). Default `"40%"`.
    #[serde(default = "default_max_unhealthy")]
    #[schemars(schema_with = "max_unhealthy_schema")]
    pub max_unhealthy: IntOrString,
    /// Fences in flight at once, cluster-wide. Default 1.
    #[serde(default = "default_max_concurrent")]
    #[schemars(range(min = 1))]
    pub max_concurrent: i32,
    /// Per-topology-domain limit. Default: 1 per `topology.kubernetes.io/zone`.
    #[serde(default)]
    pub per_domain: PerDomain,
}

/// `x-kubernetes-int-or-string` without `nullable` (null would not deserialize): a count
/// (`minimum` applies to numbers only) or a percentage from `0%` to `100%` (`pattern` applies to
/// strings only), the same grammar [`MaxUnhealthy::parse`] accepts.
fn max_unhealthy_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "nullable": false,
        "minimum": 0,
        "pattern": "^(100|[1-9]?[0-9])%$"
    })
}

fn default_max_unhealthy() -> IntOrString {
    IntOrString::String("40%".to_string())
}
fn default_max_concurrent() -> i32 {
    1
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_unhealthy: default_max_unhealthy(),
            max_concurrent: default_max_concurrent(),
            per_domain: PerDomain::default(),
        }
    }
}

/// Limit on concurrent fences within one topology domain (nodes sharing a label value).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PerDomain {
    /// Node label whose value names the domain. Default `topology.kubernetes.io/zone`.
    /// Nodes without the label share the domain `""`.
    #[serde(default = "default_topology_key")]
    #[schemars(length(min = 1))]
    pub topology_key: String,
    /// Fences in flight at once within one domain. Default 1.
    #[serde(default = "default_max_concurrent")]
    #[schemars(range(min = 1))]
    pub max_concurrent: i32,
}

fn default_topology_key() -> String {
    DEFAULT_TOPOLOGY_KEY.to_string()
}

impl Default for PerDomain {
    fn default() -> Self {
        Self {
            topology_key: default_topology_key(),
            max_concurrent: default_max_concurrent(),
        }
    }
}

/// Pod forgiveness.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Forgiveness {
    /// Honour the pods' `tolerationSeconds` for `node.kubernetes.io/unreachable` (the minimum
    /// over the node's pods). Default true.
    #[serde(default = "default_true")]
    pub respect_tolerations: bool,
    /// Forgiveness when no pod on the node states one. Default 0 s.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub default_seconds: i64,
    /// Upper bound on forgiveness, also used when every pod tolerates unreachability forever.
    /// Default 300 s (the admission default for `tolerationSeconds`).
    #[serde(default = "default_max_forgiveness")]
    #[schemars(range(min = 0))]
    pub max_seconds: i64,
}

fn default_true() -> bool {
    true
}
fn default_max_forgiveness() -> i64 {
    300
}

impl Default for Forgiveness {
    fn default() -> Self {
        Self {
            respect_tolerations: true,
            default_seconds: 0,
            max_seconds: default_max_forgiveness(),
        }
    }
}

/// The PDB urgency rule: a workload already at `disruptionsAllowed == 0` is hurting, so fence sooner.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PdbRule {
    /// Shorten forgiveness when a PDB covering one of the node's pods allows no disruption.
    /// Default true.
    #[serde(default = "default_true")]
    pub urgent_when_exhausted: bool,
    /// Forgiveness (an upper bound) in that case. Default 0 s.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub urgent_forgiveness_seconds: i64,
}

impl Default for PdbRule {
    fn default() -> Self {
        Self {
            urgent_when_exhausted: true,
            urgent_forgiveness_seconds: 0,
        }
    }
}

/// Which silent nodes are worth fencing.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum FenceWhen {
    /// Only nodes running a stateful pod: one that mounts a claim that is ReadWriteOnce or
    /// ReadWriteOncePod (read from the claim's status once bound, else its spec). Those are the
    /// pods Kubernetes cannot move without proof that the node is fenced.
    ///
    /// Fail safe: a claim the controller cannot read (not in its cache, deleted, or listing no
    /// access modes) counts as ReadWriteOnce, so its pod is stateful: its node is fenced, and
    /// the pod is released only by a fence that covers storage users.
    #[default]
    StatefulOnly,
    /// Every silent node.
    Always,
}

/// The trust rule for nodes whose agent advertises self-fencing.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustSelfFence {
    /// When the node has no hardware fencing level, count it as fenced once its advertised
    /// self-fence timeout plus twice its watchdog timeout plus `marginSeconds` has passed since
    /// it went silent. Default false.
    #[serde(default)]
    pub enabled: bool,
    /// Safety margin on top of the advertised timeout. Default 10 s.
    #[serde(default = "default_self_fence_margin")]
    #[schemars(range(min = 0))]
    pub margin_seconds: i64,
    /// Whether a self-fence of a virtual machine may be trusted. Default `Refuse`.
    ///
    /// A hypervisor can pause a virtual machine (live migration, a snapshot, `werror=stop`, a
    /// suspended host): its watchdog and its clocks freeze with it, and once resumed its pods
    /// run beside their replacements. So by default (`Refuse`) only a machine the agent detects
    /// as bare metal, with a watchdog known to reset or power it off, earns trust.
    ///
    /// `Accept` trusts virtual machines too, and a watchdog whose expiry action the hypervisor
    /// decides (an emulated i6300esb): the operator asserts that every VM the policy selects is
    /// reset or powered off by its hypervisor when the watchdog expires (never `none` or
    /// `pause`) and is never paused, or that a hypervisor-side fence is what it relies on. A
    /// watchdog known not to reset (softdog with `soft_noboot`) or unclassified is refused
    /// either way, and so is an agent that does not advertise the action or the machine.
    #[serde(default)]
    pub virtual_machines: VirtualMachines,
}

/// Whether a power device without an identity of its own may act
/// (`powerWithoutIdentity`).
///
/// A direct IPMI or Redfish BMC proves, before anything is commanded through it, that it
/// answers for the Node's machine (its system GUID or UUID against the Node's `systemUUID`).
/// A PDU outlet has nothing to read: a mis-patched outlet switches another machine off.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PowerWithoutIdentity {
    /// The device acts when its level's turn comes, as the FenceTarget says. The default,
    /// because a PDU level exists for the machine whose BMC is dark, and a dark BMC proves
    /// nothing.
    #[default]
    Allowed,
    /// Right before such a device acts, the controller reads a direct BMC of the node's
    /// FenceTarget (any level) pinned to the Node's `systemUUID`; only if one answers as that
    /// machine does the device act. Otherwise nothing is sent to it and its level fails
    /// (a dark BMC then leaves the fence to a person).
    ///
    /// Guarantees: no power-off reaches a device without an identity unless, within the same
    /// attempt and before it, a BMC answered with the Node's machine identity (the recovery's
    /// power-on follows a power-off proven so, and is not asked again: the BMC of a machine
    /// whose outlet is off is dark).
    /// Assumptions: the outlet powers the machine whose BMC answered (the proof is of the
    /// FenceTarget, not of the outlet's cabling: a PDU still cannot say what it powers).
    AfterProof,
}

/// Whether a trusted self-fence may rest on a virtual machine (`trustSelfFence.virtualMachines`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum VirtualMachines {
    /// Never trust the self-fence of a machine the agent detects as virtual, or cannot tell
    /// from a virtual one, nor a watchdog whose expiry action a hypervisor decides.
    #[default]
    Refuse,
    /// Trust the self-fence of virtual machines too, and a watchdog whose expiry action the
    /// hypervisor decides (an emulated `i6300esb`, `ib700`, `diag288`, `xen_wdt`).
    ///
    /// By choosing this the operator asserts, for every virtual machine the policy selects,
    /// that its hypervisor resets or powers it off when the watchdog expires (QEMU
    /// `-watchdog-action reset` or `poweroff`, never `none` or `pause`) and never pauses it
    /// (no live migration, snapshot, `werror=stop`/`rerror=stop` or suspended host), or that
    /// a hypervisor-side fence (a `FenceTarget` level that powers the VM off through its
    /// hypervisor) is what the policy really relies on. A watchdog the agent knows does not
    /// reset (softdog with `soft_noboot`) or cannot classify is still refused.
    Accept,
}

fn default_self_fence_margin() -> i64 {
    10
}

impl Default for TrustSelfFence {
    fn default() -> Self {
        Self {
            enabled: false,
            margin_seconds: default_self_fence_margin(),
            virtual_machines: VirtualMachines::Refuse,
        }
    }
}

/// Recovery behaviour after release.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Recovery {
    /// Power the node back on after its pods and volumes are released. Default false (leave it off).
    #[serde(default)]
    pub power_on: bool,
    /// When the release taints (`palisade.dev/fenced`, and out-of-service if applied) are
    /// removed. Default `NodeReady`.
    #[serde(default)]
    pub untaint_when: UntaintWhen,
}

/// When the release taints are lifted from a recovered node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UntaintWhen {
    /// When the node agent renews its Lease again and reports no stale pods.
    #[default]
    NodeReady,
    /// Never automatically: an operator removes the taints.
    Manual,
}

/// Cooldown and escalation limits against flapping nodes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Escalation {
    /// After a fence of a node ends, do not fence it again for this long. Default 600 s.
    #[serde(default = "default_cooldown")]
    #[schemars(range(min = 0))]
    pub cooldown_seconds: i64,
    /// At most this many fences of one node within `windowSeconds`; beyond that a person must
    /// act (create a manual `NodeFence`). Default 3.
    #[serde(default = "default_max_fences")]
    #[schemars(range(min = 1))]
    pub max_fences_per_window: i32,
    /// The escalation window. Default 86400 s (one day).
    #[serde(default = "default_window")]
    #[schemars(range(min = 1))]
    pub window_seconds: i64,
}

fn default_cooldown() -> i64 {
    600
}
fn default_max_fences() -> i32 {
    3
}
fn default_window() -> i64 {
    86_400
}

impl Default for Escalation {
    fn default() -> Self {
        Self {
            cooldown_seconds: default_cooldown(),
            max_fences_per_window: default_max_fences(),
            window_seconds: default_window(),
        }
    }
}

/// A malformed `FencingPolicy`: what [`FencingPolicySpec::validate`] rejects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A duration or count that must be positive (or non-negative) is not.
    #[error("{field} must be {bound}, got {value}")]
    OutOfRange {
        /// JSON path of the field.
        field: &'static str,
        /// The bound it violates, in words.
        bound: &'static str,
        /// The value given.
        value: i64,
    },
    /// `unhealthyAfterSeconds` does not exceed `suspectAfterSeconds`.
    #[error("detection.unhealthyAfterSeconds ({unhealthy}) must exceed detection.suspectAfterSeconds ({suspect})")]
    ThresholdsOutOfOrder {
        /// suspectAfterSeconds.
        suspect: i64,
        /// unhealthyAfterSeconds.
        unhealthy: i64,
    },
    /// `maxUnhealthy` is neither a non-negative count nor a percentage in 0%..=100%.
    #[error("limits.maxUnhealthy {value:?} must be a non-negative count or a percentage like \"40%\" (0%..100%)")]
    BadMaxUnhealthy {
        /// The value given, as text.
        value: String,
    },
    /// `perDomain.topologyKey` is empty.
    #[error("limits.perDomain.topologyKey must not be empty")]
    EmptyTopologyKey,
    /// A node selector requirement is malformed.
    #[error("nodeSelector.matchExpressions[{index}] (key {key:?}): {problem}")]
    BadSelector {
        /// Index of the requirement.
        index: usize,
        /// Its key.
        key: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// The escalation window is shorter than the cooldown, so the escalation limit could never trip.
    #[error("escalation.windowSeconds ({window}) must be at least escalation.cooldownSeconds ({cooldown})")]
    WindowShorterThanCooldown {
        /// windowSeconds.
        window: i64,
        /// cooldownSeconds.
        cooldown: i64,
    },
}

/// How `maxUnhealthy` is expressed, once parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnhealthy {
    /// At most this many silent nodes.
    Count(u32),
    /// At most this percentage of covered nodes, rounded down.
    Percent(u32),
}

impl MaxUnhealthy {
    /// Parse the `IntOrString` form.
    pub fn parse(value: &IntOrString) -> Result<Self, PolicyError> {
        let bad = || PolicyError::BadMaxUnhealthy {
            value: match value {
                IntOrString::Int(i) => i.to_string(),
                IntOrString::String(s) => s.clone(),
            },
        };
        match value {
            IntOrString::Int(i) => u32::try_from(*i).map(Self::Count).map_err(|_| bad()),
            IntOrString::String(s) => {
                let digits = s.strip_suffix('%').ok_or_else(bad)?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                match digits.parse::<u32>() {
                    Ok(p) if p <= 100 => Ok(Self::Percent(p)),
                    _ => Err(bad()),
                }
            }
        }
    }

    /// How many of `total` covered nodes may be silent before the quorum guard holds.
    pub fn allowed_silent(self, total: usize) -> usize {
        match self {
            Self::Count(c) => c as usize,
            Self::Percent(p) => total.saturating_mul(p as usize) / 100,
        }
    }
}

impl FencingPolicySpec {
    /// Reject policies the schema cannot catch. Returns every problem found, in field order.
    pub fn validate(&self) -> Result<(), Vec<PolicyError>> {
        let mut errors = Vec::new();
        let mut at_least = |field, bound, min: i64, value: i64| {
            if value < min {
                errors.push(PolicyError::OutOfRange {
                    field,
                    bound,
                    value,
                });
            }
        };
        let d = &self.detection;
        at_least(
            "detection.suspectAfterSeconds",
            "at least 1",
            1,
            d.suspect_after_seconds,
        );
        at_least(
            "detection.unhealthyAfterSeconds",
            "at least 1",
            1,
            d.unhealthy_after_seconds,
        );
        at_least(
            "detection.powerOffAfterSeconds",
            "at least 0",
            0,
            d.power_off_after_seconds,
        );
        at_least(
            "limits.maxConcurrent",
            "at least 1",
            1,
            i64::from(self.limits.max_concurrent),
        );
        at_least(
            "limits.perDomain.maxConcurrent",
            "at least 1",
            1,
            i64::from(self.limits.per_domain.max_concurrent),
        );
        at_least(
            "forgiveness.defaultSeconds",
            "at least 0",
            0,
            self.forgiveness.default_seconds,
        );
        at_least(
            "forgiveness.maxSeconds",
            "at least 0",
            0,
            self.forgiveness.max_seconds,
        );
        at_least(
            "pdb.urgentForgivenessSeconds",
            "at least 0",
            0,
            self.pdb.urgent_forgiveness_seconds,
        );
        at_least(
            "trustSelfFence.marginSeconds",
            "at least 0",
            0,
            self.trust_self_fence.margin_seconds,
        );
        at_least(
            "escalation.cooldownSeconds",
            "at least 0",
            0,
            self.escalation.cooldown_seconds,
        );
        at_least(
            "escalation.maxFencesPerWindow",
            "at least 1",
            1,
            i64::from(self.escalation.max_fences_per_window),
        );
        at_least(
            "escalation.windowSeconds",
            "at least 1",
            1,
            self.escalation.window_seconds,
        );
        if d.unhealthy_after_seconds <= d.suspect_after_seconds {
            errors.push(PolicyError::ThresholdsOutOfOrder {
                suspect: d.suspect_after_seconds,
                unhealthy: d.unhealthy_after_seconds,
            });
        }
        if let Err(e) = MaxUnhealthy::parse(&self.limits.max_unhealthy) {
            errors.push(e);
        }
        if self.limits.per_domain.topology_key.trim().is_empty() {
            errors.push(PolicyError::EmptyTopologyKey);
        }
        for (index, req) in self
            .node_selector
            .match_expressions
            .iter()
            .flatten()
            .enumerate()
        {
            let has_values = req.values.as_ref().is_some_and(|v| !v.is_empty());
            let problem = match req.operator.as_str() {
                "In" | "NotIn" if !has_values => Some("operator In/NotIn needs values"),
                "Exists" | "DoesNotExist" if has_values => {
                    Some("operator Exists/DoesNotExist takes no values")
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => None,
                _ => Some("operator must be In, NotIn, Exists or DoesNotExist"),
            };
            let problem = if req.key.is_empty() {
                Some("key must not be empty")
            } else {
                problem
            };
            if let Some(problem) = problem {
                errors.push(PolicyError::BadSelector {
                    index,
                    key: req.key.clone(),
                    problem,
                });
            }
        }
        if self.escalation.window_seconds < self.escalation.cooldown_seconds {
            errors.push(PolicyError::WindowShorterThanCooldown {
                window: self.escalation.window_seconds,
                cooldown: self.escalation.cooldown_seconds,
            });
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// The parsed quorum limit. Falls back to the most conservative limit (0 silent nodes) if
    /// the policy is malformed; callers should have rejected it with [`Self::validate`] already.
    pub fn max_unhealthy(&self) -> MaxUnhealthy {
        MaxUnhealthy::parse(&self.limits.max_unhealthy).unwrap_or(MaxUnhealthy::Count(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn empty_spec_deserializes_to_documented_defaults() {
        let spec: FencingPolicySpec = serde_json::from_str("{}").unwrap();
        assert_eq!(spec, FencingPolicySpec::default());
        assert_eq!(spec.detection.suspect_after_seconds, 10);
        assert_eq!(spec.detection.unhealthy_after_seconds, 20);
        assert_eq!(spec.limits.max_unhealthy, IntOrString::String("40%".into()));
        assert_eq!(spec.limits.max_concurrent, 1);
        assert_eq!(spec.limits.per_domain.topology_key, DEFAULT_TOPOLOGY_KEY);
        assert_eq!(spec.fence_when, FenceWhen::StatefulOnly);
        assert!(!spec.trust_self_fence.enabled);
        assert_eq!(
            spec.trust_self_fence.virtual_machines,
            VirtualMachines::Refuse
        );
        let accept: TrustSelfFence =
            serde_json::from_str(r#"{"enabled": true, "virtualMachines": "Accept"}"#).unwrap();
        assert_eq!(accept.virtual_machines, VirtualMachines::Accept);
        assert_eq!(accept.margin_seconds, 10);
        assert!(!spec.recovery.power_on);
        assert_eq!(spec.recovery.untaint_when, UntaintWhen::NodeReady);
        assert!(!spec.paused && !spec.dry_run);
        assert_eq!(spec.validate(), Ok(()));
    }

    #[test]
    fn partial_nested_objects_keep_other_defaults() {
        let spec: FencingPolicySpec = serde_json::from_str(
            r#"{"detection":{"unhealthyAfterSeconds":4},"limits":{"maxUnhealthy":2}}"#,
        )
        .unwrap();
        assert_eq!(spec.detection.suspect_after_seconds, 10);
        assert_eq!(spec.detection.unhealthy_after_seconds, 4);
        assert_eq!(spec.limits.max_concurrent, 1);
        assert_eq!(spec.max_unhealthy(), MaxUnhealthy::Count(2));
        // 4 <= 10: out of order, so the policy is rejected.
        assert_eq!(
            spec.validate(),
            Err(vec![PolicyError::ThresholdsOutOfOrder {
                suspect: 10,
                unhealthy: 4
            }])
        );
    }

    #[test]
    fn max_unhealthy_parsing_table() {
        let cases: &[(IntOrString, Option<MaxUnhealthy>)] = &[
            (IntOrString::Int(0), Some(MaxUnhealthy::Count(0))),
            (IntOrString::Int(3), Some(MaxUnhealthy::Count(3))),
            (IntOrString::Int(-1), None),
            (
                IntOrString::String("0%".into()),
                Some(MaxUnhealthy::Percent(0)),
            ),
            (
                IntOrString::String("40%".into()),
                Some(MaxUnhealthy::Percent(40)),
            ),
            (
                IntOrString::String("100%".into()),
                Some(MaxUnhealthy::Percent(100)),
            ),
            (IntOrString::String("101%".into()), None),
            (IntOrString::String("40".into()), None),
            (IntOrString::String("%".into()), None),
            (IntOrString::String("-5%".into()), None),
            (IntOrString::String("4 0%".into()), None),
            (IntOrString::String("abc%".into()), None),
        ];
        for (input, want) in cases {
            assert_eq!(MaxUnhealthy::parse(input).ok(), *want, "{input:?}");
        }
    }

    #[test]
    fn percentages_round_down() {
        assert_eq!(MaxUnhealthy::Percent(40).allowed_silent(3), 1);
        assert_eq!(MaxUnhealthy::Percent(40).allowed_silent(2), 0);
        assert_eq!(MaxUnhealthy::Percent(50).allowed_silent(10), 5);
        assert_eq!(MaxUnhealthy::Percent(100).allowed_silent(7), 7);
        assert_eq!(MaxUnhealthy::Count(2).allowed_silent(0), 2);
    }

    #[test]
    fn validate_reports_every_problem() {
        let mut spec = FencingPolicySpec::default();
        spec.detection.suspect_after_seconds = 0;
        spec.limits.max_concurrent = 0;
        spec.limits.max_unhealthy = IntOrString::String("lots".into());
        spec.limits.per_domain.topology_key = " ".into();
        spec.node_selector.match_expressions = Some(vec![
            LabelSelectorRequirement {
                key: "a".into(),
                operator: "In".into(),
                values: None,
            },
            LabelSelectorRequirement {
                key: "b".into(),
                operator: "Exists".into(),
                values: Some(vec!["x".into()]),
            },
            LabelSelectorRequirement {
                key: "c".into(),
                operator: "Gt".into(),
                values: Some(vec!["1".into()]),
            },
            LabelSelectorRequirement {
                key: "d".into(),
                operator: "NotIn".into(),
                values: Some(vec!["x".into()]),
            },
        ]);
        let errors = spec.validate().unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 7, "{text:#?}");
        assert!(matches!(
            errors[0],
            PolicyError::OutOfRange {
                field: "detection.suspectAfterSeconds",
                ..
            }
        ));
        assert!(matches!(
            errors[1],
            PolicyError::OutOfRange {
                field: "limits.maxConcurrent",
                ..
            }
        ));
        assert!(matches!(errors[2], PolicyError::BadMaxUnhealthy { .. }));
        assert_eq!(errors[3], PolicyError::EmptyTopologyKey);
        assert!(matches!(
            errors[4],
            PolicyError::BadSelector { index: 0, .. }
        ));
        assert!(matches!(
            errors[5],
            PolicyError::BadSelector { index: 1, .. }
        ));
        assert!(matches!(
            errors[6],
            PolicyError::BadSelector { index: 2, .. }
        ));
        // Fixing the cooldown/window order is also caught.
        let mut spec = FencingPolicySpec::default();
        spec.escalation.window_seconds = 10;
        assert_eq!(
            spec.validate(),
            Err(vec![PolicyError::WindowShorterThanCooldown {
                window: 10,
                cooldown: 600
            }])
        );
    }
}
