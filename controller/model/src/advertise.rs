//! The node agent's self-fence advertisement: what it promises about itself, written on its
//! Lease (`kube-node-lease/<node>`) with **every** renewal, in the same write that moves
//! `spec.renewTime`.
//!
//! The controller reads the advertisement it observed with the last renewal *before* a node
//! went silent, and trusts a self-fence only when that advertisement says a hardware watchdog
//! is armed (with `nowayout`, so no clean stop can disarm it), that its expiry resets or powers
//! off the machine, and that the machine is not virtual (a hypervisor can pause a virtual
//! machine, freezing its watchdog and clocks, and resume it beside its pods' replacements),
//! unless the policy accepts virtual machines (see [`Advertisement::trust`]). Because it travels with each
//! renewal, nothing sticky survives a restart: an agent started without a watchdog withdraws
//! the promise at its next renewal.
//!
//! The same write carries the agent's runtime inventory (the UIDs of the pods that still have
//! a container in its runtime) and the machine's boot ID: the positive proofs recovery needs
//! before it lifts a storage fence or the out-of-service taint.
//!
//! Everything here is plain data with no I/O; parsing is strict: a malformed value reads as
//! absent, and an absent promise is never trusted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::policy::VirtualMachines;

/// Lease annotation: seconds without a renewal after which the agent self-fences, counted from
/// the moment the last successful renewal *request was sent*.
pub const SELF_FENCE_AFTER: &str = "palisade.dev/self-fence-after-seconds";
/// Lease annotation: the armed hardware watchdog's timeout in seconds (absent: no watchdog).
pub const WATCHDOG_TIMEOUT: &str = "palisade.dev/watchdog-timeout-seconds";
/// Lease annotation: `"true"` when the watchdog driver is `nowayout` (cannot be disarmed).
pub const WATCHDOG_NOWAYOUT: &str = "palisade.dev/watchdog-nowayout";
/// Lease annotation: what the armed watchdog does when it expires, as the agent determined it
/// (see [`WatchdogAction`]; absent: an agent that does not say, which earns no trust).
pub const WATCHDOG_ACTION: &str = "palisade.dev/watchdog-action";
/// Lease annotation: the armed watchdog's driver (`softdog`, `iTCO_wdt`, `i6300esb`, ...), for
/// the reasons and for the operator; trust never rests on it.
pub const WATCHDOG_DRIVER: &str = "palisade.dev/watchdog-driver";
/// Lease annotation: whether the machine is virtual, as the agent detected it (see
/// [`Virtualization`]; absent: an agent that does not say, which earns no trust).
pub const VIRTUALIZATION: &str = "palisade.dev/virtualization";
/// Lease annotation: which pods a self-fence kills: `all` or `stateful` (pods with a PVC).
pub const SELF_FENCE_SCOPE: &str = "palisade.dev/self-fence-scope";
/// Lease annotation: the agent's version.
pub const AGENT_VERSION: &str = "palisade.dev/agent-version";
/// Lease annotation: the machine's boot ID (`/proc/sys/kernel/random/boot_id`).
pub const BOOT_ID: &str = "palisade.dev/boot-id";
/// Lease annotation: the machine's SMBIOS system UUID as the agent reads it (what the kubelet
/// reports as the Node's `status.nodeInfo.systemUUID`). Recovery counts an answer to its
/// challenge only from the machine the fence pinned (see
/// [`crate::nodefence::PinnedNode::system_uuid`]).
pub const SYSTEM_UUID: &str = "palisade.dev/system-uuid";
/// Lease annotation: comma-separated UIDs of the pods with at least one container (process,
/// or state the agent has not yet confirmed dead) in the agent's runtime at this renewal.
pub const RUNTIME_PODS: &str = "palisade.dev/runtime-pods";
/// Lease annotation: `"true"` once the agent has scanned its runtime since it started, so
/// [`RUNTIME_PODS`] is complete (absent or anything else: the inventory proves nothing).
pub const RUNTIME_COMPLETE: &str = "palisade.dev/runtime-complete";
/// Lease annotation: where [`RUNTIME_PODS`] was read. `cri`: by the companion beside a stock
/// kubelet, from the container runtime's CRI (see [`RuntimeSource::Cri`]); absent: by the node
/// agent, which is the runtime itself. Any other value: the inventory reads as absent.
pub const RUNTIME_SOURCE: &str = "palisade.dev/runtime-source";
/// Lease annotation, written by the companion beside a stock kubelet (never by the node agent):
/// its machine's wall time when it sent this write, RFC 3339. The controller counts each
/// change of it as the node's own write (see `palisade_decide::convert::heartbeat`), and takes
/// the companion's self-fence promise only while it is current (see
/// [`Advertisement::companion_current`]).
pub const COMPANION_WRITTEN: &str = "palisade.dev/companion-written";
/// Node annotation, written by the controller once a fence's release is recorded: the
/// recovery challenge (the `NodeFence`'s UID). The agent reads it from its Node.
pub const RECOVERY_CHALLENGE: &str = "palisade.dev/recovery-challenge";
/// Lease annotation: the [`RECOVERY_CHALLENGE`] the agent had read from its Node *before* it
/// took this renewal's [`RUNTIME_PODS`] (absent: none read yet). It orders the inventory after
/// the release by causality, not by any clock: see [`Advertisement::challenge`].
pub const CHALLENGE_ANSWERED: &str = "palisade.dev/challenge-answered";

/// Lease annotation: the agent's peer check: whole seconds (rounded *down*) without any Lease
/// write attempt after which the agent vouches to its peers that it cannot reach the API
/// (absent: the agent runs no peer check and never excuses itself from self-fencing).
pub const PEER_VOUCH_AFTER: &str = "palisade.dev/peer-vouch-after-seconds";
/// Lease annotation: whole seconds (rounded *up*) a peer's vouch counts, from the moment the
/// agent sent the request it answers.
pub const PEER_ANSWER_VALID: &str = "palisade.dev/peer-answer-valid-seconds";
/// Lease annotation: the Node list the agent's peer check counts, as `<count>:<digest>` (see
/// [`MemberSet`]). The agent counts, for its excuse, the list of its last successful renewal,
/// which is this value (absent: the controller gives the node no peer trust).
pub const PEER_MEMBERS: &str = "palisade.dev/peer-members";

/// A set of Node names, by size and digest: what the agent's peer check counts as the members,
/// written with each renewal so that the controller judges a silent node's excuse against the
/// same members (two strict majorities intersect only within one set).
///
/// Guarantees: equal sets give equal values, whatever their order or repetitions; the digest
/// is FNV-1a (64 bit) over the sorted, distinct names, each followed by a newline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemberSet {
    /// How many distinct names.
    pub count: u32,
    /// The digest of the sorted, distinct names.
    pub digest: u64,
}

impl MemberSet {
    /// The set of `names`.
    pub fn of<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> MemberSet {
        let names: BTreeSet<String> = names.into_iter().map(|n| n.as_ref().to_string()).collect();
        Self::of_sorted(names.iter().map(String::as_str))
    }

    /// The set of `names`, which are sorted and distinct (as a `BTreeSet` iterates them): the
    /// same value as [`MemberSet::of`] without copying the names.
    ///
    /// Assumptions: the caller sorted the names and removed duplicates; otherwise the value
    /// names no set anyone else computes.
    pub fn of_sorted<'a>(names: impl IntoIterator<Item = &'a str>) -> MemberSet {
        let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
        let mut count = 0usize;
        for n in names {
            count += 1;
            for b in n.bytes().chain(std::iter::once(b'\n')) {
                digest ^= u64::from(b);
                digest = digest.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        MemberSet {
            count: u32::try_from(count).unwrap_or(u32::MAX),
            digest,
        }
    }

    /// Parses `<count>:<digest in hex>`.
    pub fn parse(s: &str) -> Option<MemberSet> {
        let (count, digest) = s.trim().split_once(':')?;
        Some(MemberSet {
            count: count.parse().ok()?,
            digest: u64::from_str_radix(digest, 16).ok()?,
        })
    }
}

impl std::fmt::Display for MemberSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{:016x}", self.count, self.digest)
    }
}

/// Which pods a self-fence kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelfFenceScope {
    /// Every pod on the node.
    All,
    /// Only pods that mount a PersistentVolumeClaim.
    Stateful,
}

impl SelfFenceScope {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            SelfFenceScope::All => "all",
            SelfFenceScope::Stateful => "stateful",
        }
    }

    /// Parses an annotation value (`None` for anything unknown).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "all" => Some(SelfFenceScope::All),
            "stateful" => Some(SelfFenceScope::Stateful),
            _ => None,
        }
    }
}

/// An armed hardware watchdog, as advertised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watchdog {
    /// The timeout set on the device.
    pub timeout: Duration,
    /// Whether the driver refuses the magic close.
    pub nowayout: bool,
    /// What its expiry does (`None`: not advertised, as by an agent older than this field).
    pub action: Option<WatchdogAction>,
    /// Its driver, for reasons and operators (`None`: not advertised or not identified).
    pub driver: Option<String>,
}

/// What a watchdog's expiry does to the machine, as the node agent determined it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchdogAction {
    /// The machine resets (a hardware watchdog on the allow-list, softdog without
    /// `soft_noboot`).
    Reset,
    /// The machine powers off.
    PowerOff,
    /// An emulated watchdog on a virtual machine: the hypervisor decides (reset, power off,
    /// but also `none` or `pause`).
    Hypervisor,
    /// The expiry is known not to reset the machine (softdog with `soft_noboot`, or with
    /// `soft_panic` and `kernel.panic` 0: the machine hangs in a panic).
    None,
    /// The agent cannot tell (a driver not on its allow-list, an unreadable parameter).
    Unknown,
}

impl WatchdogAction {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchdogAction::Reset => "reset",
            WatchdogAction::PowerOff => "power-off",
            WatchdogAction::Hypervisor => "hypervisor",
            WatchdogAction::None => "none",
            WatchdogAction::Unknown => "unknown",
        }
    }

    /// Parses an annotation value (`None` for anything else, which reads as not advertised).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.trim() {
            "reset" => WatchdogAction::Reset,
            "power-off" => WatchdogAction::PowerOff,
            "hypervisor" => WatchdogAction::Hypervisor,
            "none" => WatchdogAction::None,
            "unknown" => WatchdogAction::Unknown,
            _ => return None,
        })
    }
}

/// Whether the machine is virtual, as the node agent detected it (in the manner of
/// `systemd-detect-virt`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Virtualization {
    /// Bare metal: no source the agent reads names a hypervisor (annotation `none`).
    None,
    /// A virtual machine, by the hypervisor's name (`kvm`, `qemu`, `vmware`, `xen`,
    /// `microsoft`, `oracle`, `amazon`, `google`, `other`, ...).
    Virtual(String),
    /// The agent could read none of its sources (annotation `unknown`): it may be virtual.
    Unknown,
}

impl Virtualization {
    /// The annotation value.
    pub fn as_str(&self) -> &str {
        match self {
            Virtualization::None => "none",
            Virtualization::Virtual(kind) => kind,
            Virtualization::Unknown => "unknown",
        }
    }

    /// Parses an annotation value: `none`, `unknown`, or a hypervisor's name (lowercase ASCII
    /// letters, digits, `-` and `_`); anything else reads as not advertised.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "none" => Some(Virtualization::None),
            "unknown" => Some(Virtualization::Unknown),
            kind if !kind.is_empty()
                && kind.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                }) =>
            {
                Some(Virtualization::Virtual(kind.to_string()))
            }
            _ => None,
        }
    }
}

/// Why an advertisement earns no trust, in words an operator can act on (its `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Distrust {
    /// No self-fence timeout.
    NoSelfFenceTimeout,
    /// No armed watchdog.
    NoWatchdog,
    /// The watchdog can be disarmed by a clean stop.
    NotNowayout,
    /// No known scope.
    NoScope,
    /// The watchdog's expiry action is not advertised (an agent older than this rule).
    NoAction,
    /// Whether the machine is virtual is not advertised (an agent older than this rule).
    NoVirtualization,
    /// The watchdog is known not to reset the machine.
    NoReset {
        /// The driver, if advertised.
        driver: Option<String>,
    },
    /// The agent cannot tell what the watchdog's expiry does.
    UnknownAction {
        /// The driver, if advertised.
        driver: Option<String>,
    },
    /// The machine is virtual (or may be) and the policy does not accept virtual machines.
    VirtualMachine {
        /// What the agent detected.
        virtualization: Virtualization,
    },
    /// The watchdog's expiry action is the hypervisor's and the policy does not accept
    /// virtual machines.
    HypervisorAction {
        /// The driver, if advertised.
        driver: Option<String>,
    },
    /// A companion's promise that is not current (see [`Advertisement::companion_current`]).
    CompanionNotCurrent {
        /// Why.
        why: String,
    },
}

impl std::fmt::Display for Distrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let wd = |d: &Option<String>| match d {
            Some(d) => format!("watchdog {d}"),
            None => "its watchdog".to_string(),
        };
        match self {
            Distrust::NoSelfFenceTimeout => write!(f, "its last renewal advertised no self-fence timeout"),
            Distrust::NoWatchdog => write!(f, "its last renewal advertised no armed hardware watchdog"),
            Distrust::NotNowayout => write!(f, "its watchdog is not nowayout (a clean stop could disarm it)"),
            Distrust::NoScope => write!(f, "its last renewal advertised no self-fence scope"),
            Distrust::NoAction => write!(
                f,
                "its last renewal advertised no watchdog expiry action (an agent older than the rule that a watchdog must be known to reset the machine): upgrade the node agent"
            ),
            Distrust::NoVirtualization => write!(
                f,
                "its last renewal did not say whether the machine is virtual (an agent older than the rule that a pausable machine is not trusted): upgrade the node agent"
            ),
            Distrust::NoReset { driver } => write!(
                f,
                "{}'s expiry does not reset the machine (softdog with soft_noboot, or soft_panic with kernel.panic 0)",
                wd(driver)
            ),
            Distrust::UnknownAction { driver } => write!(
                f,
                "{}'s expiry action is unknown (not a driver known to reset or power off the machine)",
                wd(driver)
            ),
            Distrust::VirtualMachine { virtualization } => match virtualization {
                Virtualization::Unknown => write!(
                    f,
                    "the agent cannot tell whether the machine is virtual (a hypervisor could pause it, freezing its watchdog while its pods live on); set trustSelfFence.virtualMachines: Accept only if its hypervisor never pauses it"
                ),
                v => write!(
                    f,
                    "machine is a {} virtual machine (a hypervisor can pause it, freezing its watchdog while its pods live on); the policy does not accept virtual machines (trustSelfFence.virtualMachines)",
                    v.as_str()
                ),
            },
            Distrust::HypervisorAction { driver } => write!(
                f,
                "{}'s expiry action is decided by the hypervisor; the policy does not accept virtual machines (trustSelfFence.virtualMachines)",
                wd(driver)
            ),
            Distrust::CompanionNotCurrent { why } => write!(
                f,
                "its companion's self-fence promise is not current: {why}"
            ),
        }
    }
}

/// The agent's peer check, as advertised: while its Lease cannot be renewed, the agent keeps
/// its pods and keeps petting its watchdog only while a strict majority of the cluster's nodes
/// (itself included) vouch, each within [`PeerCheck::answer_valid`] of being asked, that they
/// have not sent a Lease write for [`PeerCheck::vouch_after`] (a control-plane outage, not a
/// partition of this node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCheck {
    /// No Lease write attempt for this long before a vouch (a lower bound of the agent's).
    pub vouch_after: Duration,
    /// How long a vouch excuses the asking node (an upper bound of the agent's).
    pub answer_valid: Duration,
    /// The members the agent counts for its excuse (`None`: unknown, which earns no trust).
    pub members: Option<MemberSet>,
}

/// The largest wall-clock difference assumed between any node and the controller. The
/// controller's healthy-majority arithmetic (`palisade_decide::majority`) and the node agent's
/// peer-check configuration both read it here, so the two can never disagree on it.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(1);

impl PeerCheck {
    /// The window within which the controller counts a node that vouches after `vouch_after`
    /// healthy between two of its Lease writes: `vouch_after` minus four clock skews (see
    /// `palisade_decide::majority`). Zero when `vouch_after` is within the skews: then no write
    /// ever extends a streak and such a node is never counted healthy.
    pub fn healthy_window(vouch_after: Duration) -> Duration {
        vouch_after.saturating_sub(MAX_CLOCK_SKEW * 4)
    }

    /// The shortest vouch delay an agent renewing every `renew_interval` may use: one that
    /// leaves the controller a window of two renew intervals, so that a healthy node (one late
    /// renewal included) keeps counting toward the healthy majority a peer-checked self-fence
    /// is trusted against.
    ///
    /// Guarantees: for any `vouch_after` at least this, [`PeerCheck::healthy_window`] is at
    /// least twice `renew_interval`. Below it, the controller could rarely or never see a
    /// healthy majority, and a trusted self-fence would wait until its budget ran out.
    pub fn min_vouch_after(renew_interval: Duration) -> Duration {
        MAX_CLOCK_SKEW * 4 + renew_interval * 2
    }

    /// Why the controller can never count a node with this peer check healthy between its
    /// writes (its window is zero), in words an operator can act on; `None` when it can.
    pub fn unusable_window(&self) -> Option<String> {
        Self::healthy_window(self.vouch_after).is_zero().then(|| {
            format!(
                "its peer check vouches after {:.1}s, within the controller's allowance of four clock skews ({}s): \
                 no node running it can ever be counted healthy, so no peer-checked self-fence could be trusted; \
                 run the node agents with --peer-vouch-after of at least 4s plus two renew intervals \
                 (and --self-fence-after above it)",
                self.vouch_after.as_secs_f64(),
                (MAX_CLOCK_SKEW * 4).as_secs()
            )
        })
    }
}

/// Where a runtime inventory ([`Advertisement::runtime_pods`]) was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuntimeSource {
    /// The node agent, which runs the node's pods itself: it names every pod it manages, and
    /// starts a pod only after a read of it that follows the challenge it answered.
    #[default]
    NodeAgent,
    /// The companion beside a stock kubelet, from the container runtime's CRI: every pod with
    /// any sandbox or container record (live or exited; the kubelet keeps a record of each pod
    /// it manages). It cannot see processes started outside the CRI, and it does not start
    /// pods: the kubelet does, from its own view of the API, which may lag the challenge.
    Cri,
}

/// What one renewal advertises.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Advertisement {
    /// The self-fence timeout, if the agent self-fences at all.
    pub self_fence_after: Option<Duration>,
    /// The armed watchdog, if any.
    pub watchdog: Option<Watchdog>,
    /// What a self-fence kills (`None`: unknown, which covers nothing).
    pub scope: Option<SelfFenceScope>,
    /// The agent's version.
    pub version: Option<String>,
    /// The machine's boot ID.
    pub boot_id: Option<String>,
    /// The machine's system UUID ([`SYSTEM_UUID`]; `None`: not advertised, as by an older
    /// agent, which then never answers a fence that pinned one).
    pub system_uuid: Option<String>,
    /// The runtime inventory, only when complete: every pod UID with a live container, and
    /// every pod the agent manages (it may start or restart its containers).
    pub runtime_pods: Option<BTreeSet<String>>,
    /// Where [`Self::runtime_pods`] was read ([`RUNTIME_SOURCE`]).
    pub runtime_source: RuntimeSource,
    /// The recovery challenge the agent had read from its Node before it took
    /// [`Self::runtime_pods`].
    ///
    /// Guarantees (of an agent that writes it): the inventory was taken after the agent read
    /// this value from the API server, and every pod the agent starts after taking it was
    /// first confirmed by a read of the pod (same UID, bound to this node) made after that
    /// moment. So when the controller wrote the challenge only after deleting the released
    /// pods, an inventory that answers it and names none of them stays true: those pods are
    /// not running and will never be started here again.
    pub challenge: Option<String>,
    /// The peer check, if the agent runs one.
    pub peer_check: Option<PeerCheck>,
    /// Whether the machine is virtual (`None`: not advertised, as by an older agent).
    pub virtualization: Option<Virtualization>,
    /// The companion's write stamp ([`COMPANION_WRITTEN`]; `None`: not a companion's write).
    pub companion_written: Option<Timestamp>,
    /// Why a companion's self-fence promise is not current: set by the controller when it
    /// reads the advertisement with the rest of the Lease and the Node
    /// ([`Advertisement::companion_current`]), never read from or written to annotations.
    pub companion_stale: Option<String>,
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn secs(annotations: &BTreeMap<String, String>, key: &str) -> Option<Duration> {
    annotations
        .get(key)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

impl Advertisement {
    /// Reads an advertisement from Lease annotations. Malformed values read as absent.
    pub fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        let watchdog = secs(a, WATCHDOG_TIMEOUT).map(|timeout| Watchdog {
            timeout,
            nowayout: a.get(WATCHDOG_NOWAYOUT).is_some_and(|v| v.trim() == "true"),
            action: a
                .get(WATCHDOG_ACTION)
                .and_then(|v| WatchdogAction::parse(v)),
            driver: a
                .get(WATCHDOG_DRIVER)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty()),
        });
        let runtime_source = match a.get(RUNTIME_SOURCE).map(|v| v.trim()) {
            None => Some(RuntimeSource::NodeAgent),
            Some("cri") => Some(RuntimeSource::Cri),
            Some(_) => None,
        };
        let complete = a.get(RUNTIME_COMPLETE).map(|v| v.trim()) == Some("true");
        let runtime_pods = (complete && runtime_source.is_some()).then(|| {
            a.get(RUNTIME_PODS)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        });
        Advertisement {
            self_fence_after: secs(a, SELF_FENCE_AFTER),
            watchdog,
            scope: a
                .get(SELF_FENCE_SCOPE)
                .and_then(|v| SelfFenceScope::parse(v)),
            version: a.get(AGENT_VERSION).cloned(),
            boot_id: a
                .get(BOOT_ID)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty()),
            system_uuid: a
                .get(SYSTEM_UUID)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty()),
            runtime_pods,
            runtime_source: runtime_source.unwrap_or(RuntimeSource::Cri),
            challenge: a
                .get(CHALLENGE_ANSWERED)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty()),
            peer_check: secs(a, PEER_VOUCH_AFTER)
                .zip(secs(a, PEER_ANSWER_VALID))
                .map(|(vouch_after, answer_valid)| PeerCheck {
                    vouch_after,
                    answer_valid,
                    members: a.get(PEER_MEMBERS).and_then(|v| MemberSet::parse(v)),
                }),
            virtualization: a.get(VIRTUALIZATION).and_then(|v| Virtualization::parse(v)),
            companion_written: a
                .get(COMPANION_WRITTEN)
                .and_then(|v| v.trim().parse::<Timestamp>().ok()),
            companion_stale: None,
        }
    }

    /// The annotations this advertisement writes (every key of this module, so a renewal that
    /// no longer has a watchdog removes the old value: absent keys map to `None`, which a
    /// JSON merge patch turns into a deletion).
    pub fn to_annotations(&self) -> BTreeMap<String, Option<String>> {
        let mut out = BTreeMap::new();
        let mut put = |k: &str, v: Option<String>| {
            out.insert(k.to_string(), v);
        };
        // Whole seconds, rounded up: a promise may only be advertised longer than it is.
        put(
            SELF_FENCE_AFTER,
            self.self_fence_after.map(|d| ceil_secs(d).to_string()),
        );
        put(
            WATCHDOG_TIMEOUT,
            self.watchdog
                .as_ref()
                .map(|w| ceil_secs(w.timeout).to_string()),
        );
        put(
            WATCHDOG_NOWAYOUT,
            self.watchdog.as_ref().map(|w| w.nowayout.to_string()),
        );
        put(
            WATCHDOG_ACTION,
            self.watchdog
                .as_ref()
                .and_then(|w| w.action)
                .map(|a| a.as_str().to_string()),
        );
        put(
            WATCHDOG_DRIVER,
            self.watchdog.as_ref().and_then(|w| w.driver.clone()),
        );
        put(
            VIRTUALIZATION,
            self.virtualization.as_ref().map(|v| v.as_str().to_string()),
        );
        put(SELF_FENCE_SCOPE, self.scope.map(|s| s.as_str().to_string()));
        put(AGENT_VERSION, self.version.clone());
        put(BOOT_ID, self.boot_id.clone());
        put(SYSTEM_UUID, self.system_uuid.clone());
        put(
            RUNTIME_PODS,
            self.runtime_pods
                .as_ref()
                .map(|p| p.iter().cloned().collect::<Vec<_>>().join(",")),
        );
        put(
            RUNTIME_COMPLETE,
            self.runtime_pods.as_ref().map(|_| "true".to_string()),
        );
        put(
            RUNTIME_SOURCE,
            (self.runtime_source == RuntimeSource::Cri).then(|| "cri".to_string()),
        );
        put(CHALLENGE_ANSWERED, self.challenge.clone());
        put(
            COMPANION_WRITTEN,
            self.companion_written.map(|t| t.to_string()),
        );
        // Rounded so that what the controller reads is never more generous than the agent:
        // a shorter vouch delay and a longer answer validity both shrink what it trusts.
        put(
            PEER_VOUCH_AFTER,
            self.peer_check
                .map(|p| p.vouch_after.as_secs())
                .filter(|s| *s > 0)
                .map(|s| s.to_string()),
        );
        put(
            PEER_ANSWER_VALID,
            self.peer_check
                .map(|p| ceil_secs(p.answer_valid).to_string()),
        );
        put(
            PEER_MEMBERS,
            self.peer_check
                .and_then(|p| p.members)
                .map(|m| m.to_string()),
        );
        out
    }

    /// How long after the last renewal the controller may count the node as self-fenced, or
    /// why the advertisement does not earn trust under a policy whose
    /// `trustSelfFence.virtualMachines` is `vms`.
    ///
    /// Guarantees: `Ok` only with a self-fence timeout, an armed `nowayout` watchdog, a known
    /// scope, a watchdog whose expiry action is advertised as reset or power off and a machine
    /// advertised as bare metal; or, when `vms` is [`VirtualMachines::Accept`], on a machine
    /// advertised as virtual or undetermined, also with a watchdog whose action is the
    /// hypervisor's. Never for an advertisement that says nothing about the action or the
    /// machine (an older agent), nor for a watchdog known not to reset or not classified. The
    /// wait is the self-fence timeout plus **twice** the watchdog timeout plus `margin`, so
    /// that the watchdog has reset the machine before the wait ends even when the agent's
    /// kills did not end its containers (processes in uninterruptible sleep on a hung device
    /// ignore SIGKILL), and even when the agent died after its last pet: the kernel pets a
    /// running watchdog once more when the process that held it open dies (an unexpected
    /// close, `nowayout` or not), at any instant up to the reset the last pet scheduled. One
    /// timeout covers the last pet, the second that final one.
    ///
    /// Assumptions: the agent stops petting the watchdog no later than its self-fence timeout
    /// after the last renewal it sent, and a restarted agent whose last renewal is older than
    /// that does not open the watchdog (opening and arming pet it) until it renewed again
    /// (`palisade-node`'s `watchdog::opens_at_start`), so that only the death of the agent
    /// that last petted adds a pet; the watchdog resets (or powers off) the machine within
    /// its timeout of the last pet, which the agent's advertised action stands for on bare
    /// metal; the machine's clocks and watchdog are never frozen while its processes survive
    /// (true of bare metal; for a virtual machine, the operator's assertion when it accepts
    /// them: its hypervisor never pauses it and resets it on expiry).
    pub fn trust(&self, margin: Duration, vms: VirtualMachines) -> Result<Duration, Distrust> {
        if let Some(why) = &self.companion_stale {
            return Err(Distrust::CompanionNotCurrent { why: why.clone() });
        }
        let after = self.self_fence_after.ok_or(Distrust::NoSelfFenceTimeout)?;
        let wd = self.watchdog.as_ref().ok_or(Distrust::NoWatchdog)?;
        if !wd.nowayout {
            return Err(Distrust::NotNowayout);
        }
        self.scope.ok_or(Distrust::NoScope)?;
        let action = wd.action.ok_or(Distrust::NoAction)?;
        let virtualization = self
            .virtualization
            .as_ref()
            .ok_or(Distrust::NoVirtualization)?;
        let driver = || wd.driver.clone();
        match action {
            WatchdogAction::Reset | WatchdogAction::PowerOff => {}
            WatchdogAction::None => return Err(Distrust::NoReset { driver: driver() }),
            WatchdogAction::Unknown => return Err(Distrust::UnknownAction { driver: driver() }),
            WatchdogAction::Hypervisor => {}
        }
        if vms != VirtualMachines::Accept {
            if *virtualization != Virtualization::None {
                return Err(Distrust::VirtualMachine {
                    virtualization: virtualization.clone(),
                });
            }
            if action == WatchdogAction::Hypervisor {
                return Err(Distrust::HypervisorAction { driver: driver() });
            }
        }
        Ok(after + wd.timeout * 2 + margin)
    }

    /// Whether a companion's self-fence promise, read from a Lease whose `renewTime` (the
    /// kubelet's) is `renew_time`, on a Node that reports boot `node_boot_id`, is still the
    /// promise of a companion that runs on this boot of the machine. `Ok` for anything that is
    /// not a companion's promise (the node agent writes its promise with each renewal).
    ///
    /// The companion's advertisement sits on the kubelet's Lease, and the kubelet's renewals
    /// keep it: it outlives a companion that died, whose watchdog then reset the machine,
    /// and a kubelet that came back on the new boot without it renews under a promise nobody
    /// keeps. So the promise is current only when its stamp ([`COMPANION_WRITTEN`], the
    /// companion's clock) is at most half the advertised watchdog timeout older than the
    /// kubelet's `renewTime` (the same machine's clock) and, when the Node reports a boot ID,
    /// the advertisement names that boot.
    ///
    /// Guarantees: `Err` for a companion's promise (runtime source [`RuntimeSource::Cri`] with
    /// a self-fence timeout) without a stamp, without a watchdog, with a stamp older than
    /// that bound, or from another boot than the Node's.
    ///
    /// Assumptions: the watchdog resets the machine no sooner than one timeout after the last
    /// pet, and a companion pets and writes at most a quarter of the timeout apart (enforced
    /// at its start), so a machine whose companion died resets no sooner than three quarters
    /// of a timeout after its last write, and no renewal of a later boot is stamped within
    /// half a timeout of it; while the companion runs, the kubelet's renewals are stamped
    /// within a quarter timeout of its last write plus the write's latency. Either check alone
    /// suffices; both fail only together: a step of the machine's clock *and* a Node status
    /// the new boot's kubelet has not updated yet.
    pub fn companion_current(
        &self,
        renew_time: Option<Timestamp>,
        node_boot_id: Option<&str>,
    ) -> Result<(), String> {
        if self.runtime_source != RuntimeSource::Cri || self.self_fence_after.is_none() {
            return Ok(());
        }
        let Some(written) = self.companion_written else {
            return Err("it carries no write stamp".into());
        };
        let Some(wd) = &self.watchdog else {
            return Err("it advertises no watchdog".into());
        };
        if let (Some(node), Some(ours)) = (node_boot_id, self.boot_id.as_deref()) {
            if !node.is_empty() && node != ours {
                return Err(format!(
                    "it was written on boot {ours}, and the Node reports boot {node} (the machine restarted since the companion last wrote)"
                ));
            }
        }
        let bound = SignedDuration::try_from(wd.timeout / 2).unwrap_or(SignedDuration::MAX);
        if let Some(renewed) = renew_time {
            let behind = renewed.duration_since(written);
            if behind > bound {
                return Err(format!(
                    "the companion last wrote at {written}, {:.1}s before the kubelet's renewal at {renewed}; \
                     a current companion writes within half its watchdog timeout ({:.1}s) of it",
                    behind.as_secs_f64(),
                    bound.as_secs_f64()
                ));
            }
        }
        Ok(())
    }

    /// [`Advertisement::trust`]'s wait, or `None` when the advertisement earns no trust.
    pub fn trust_wait(&self, margin: Duration, vms: VirtualMachines) -> Option<Duration> {
        self.trust(margin, vms).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_vouch_delay_within_the_clock_skews_leaves_no_healthy_window() {
        let pc = |s: f64| PeerCheck {
            vouch_after: Duration::from_secs_f64(s),
            answer_valid: Duration::from_secs(10),
            members: None,
        };
        // The agent's old default with --self-fence-after 8s and --renew-interval 1s.
        assert!(pc(1.0 + 7.0 / 3.0).unusable_window().is_some());
        assert!(pc(4.0).unusable_window().is_some());
        assert!(pc(4.5).unusable_window().is_none());
        let min = PeerCheck::min_vouch_after(Duration::from_secs(1));
        assert_eq!(min, Duration::from_secs(6));
        assert_eq!(PeerCheck::healthy_window(min), Duration::from_secs(2));
    }

    const REFUSE: VirtualMachines = VirtualMachines::Refuse;
    const ACCEPT: VirtualMachines = VirtualMachines::Accept;

    fn bare_metal() -> BTreeMap<String, String> {
        a(&[
            (SELF_FENCE_AFTER, "10"),
            (WATCHDOG_TIMEOUT, "5"),
            (WATCHDOG_NOWAYOUT, "true"),
            (WATCHDOG_ACTION, "reset"),
            (WATCHDOG_DRIVER, "iTCO_wdt"),
            (VIRTUALIZATION, "none"),
            (SELF_FENCE_SCOPE, "all"),
        ])
    }

    #[test]
    fn trust_needs_a_nowayout_watchdog_a_timeout_and_a_scope() {
        let full = bare_metal();
        let ad = Advertisement::from_annotations(&full);
        assert_eq!(
            ad.trust_wait(Duration::from_secs(2), REFUSE),
            Some(Duration::from_secs(22))
        );
        for missing in [
            SELF_FENCE_AFTER,
            WATCHDOG_TIMEOUT,
            WATCHDOG_NOWAYOUT,
            SELF_FENCE_SCOPE,
            WATCHDOG_ACTION,
            VIRTUALIZATION,
        ] {
            let mut m = full.clone();
            m.remove(missing);
            for vms in [REFUSE, ACCEPT] {
                assert_eq!(
                    Advertisement::from_annotations(&m).trust_wait(Duration::ZERO, vms),
                    None,
                    "{missing} missing must withdraw trust"
                );
            }
        }
        let mut bad = full.clone();
        bad.insert(WATCHDOG_TIMEOUT.into(), "soon".into());
        assert_eq!(
            Advertisement::from_annotations(&bad).trust_wait(Duration::ZERO, REFUSE),
            None
        );
        let mut off = full;
        off.insert(WATCHDOG_NOWAYOUT.into(), "false".into());
        assert_eq!(
            Advertisement::from_annotations(&off).trust_wait(Duration::ZERO, REFUSE),
            None
        );
    }

    #[test]
    fn an_older_agent_that_says_nothing_of_action_or_machine_is_not_trusted_and_told_why() {
        let mut m = bare_metal();
        m.remove(WATCHDOG_ACTION);
        let why = Advertisement::from_annotations(&m)
            .trust(Duration::ZERO, ACCEPT)
            .unwrap_err();
        assert_eq!(why, Distrust::NoAction);
        assert!(why.to_string().contains("older"), "{why}");
        let mut m = bare_metal();
        m.remove(VIRTUALIZATION);
        let why = Advertisement::from_annotations(&m)
            .trust(Duration::ZERO, ACCEPT)
            .unwrap_err();
        assert_eq!(why, Distrust::NoVirtualization);
        assert!(why.to_string().contains("older"), "{why}");
    }

    /// The trust table: (action, virtualization) → trusted under Refuse, under Accept.
    #[test]
    fn only_a_watchdog_known_to_reset_on_bare_metal_is_trusted_unless_virtual_machines_are_accepted(
    ) {
        let table = [
            ("reset", "none", true, true),
            ("power-off", "none", true, true),
            ("reset", "kvm", false, true),
            ("power-off", "vmware", false, true),
            ("reset", "unknown", false, true),
            ("hypervisor", "kvm", false, true),
            ("hypervisor", "none", false, true),
            ("none", "none", false, false),
            ("none", "kvm", false, false),
            ("unknown", "none", false, false),
            ("unknown", "qemu", false, false),
        ];
        for (action, virt, refuse, accept) in table {
            let mut m = bare_metal();
            m.insert(WATCHDOG_ACTION.into(), action.into());
            m.insert(VIRTUALIZATION.into(), virt.into());
            let ad = Advertisement::from_annotations(&m);
            assert_eq!(
                ad.trust(Duration::ZERO, REFUSE).is_ok(),
                refuse,
                "{action} on {virt}, Refuse: {:?}",
                ad.trust(Duration::ZERO, REFUSE)
            );
            assert_eq!(
                ad.trust(Duration::ZERO, ACCEPT).is_ok(),
                accept,
                "{action} on {virt}, Accept: {:?}",
                ad.trust(Duration::ZERO, ACCEPT)
            );
        }
    }

    #[test]
    fn the_reason_names_the_driver_and_the_hypervisor() {
        let mut m = bare_metal();
        m.insert(WATCHDOG_ACTION.into(), "hypervisor".into());
        m.insert(WATCHDOG_DRIVER.into(), "i6300esb".into());
        let why = Advertisement::from_annotations(&m)
            .trust(Duration::ZERO, REFUSE)
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("watchdog i6300esb's expiry action is decided by the hypervisor"),
            "{why}"
        );
        m.insert(VIRTUALIZATION.into(), "kvm".into());
        let why = Advertisement::from_annotations(&m)
            .trust(Duration::ZERO, REFUSE)
            .unwrap_err()
            .to_string();
        assert!(why.contains("machine is a kvm virtual machine"), "{why}");
        m.insert(WATCHDOG_ACTION.into(), "none".into());
        m.insert(WATCHDOG_DRIVER.into(), "softdog".into());
        let why = Advertisement::from_annotations(&m)
            .trust(Duration::ZERO, ACCEPT)
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("watchdog softdog's expiry does not reset"),
            "{why}"
        );
    }

    #[test]
    fn malformed_action_and_virtualization_read_as_absent() {
        for bad in ["", "reboot", "Reset"] {
            assert_eq!(WatchdogAction::parse(bad), None, "{bad:?}");
        }
        for bad in ["", "KVM", "k vm", "x/y"] {
            assert_eq!(Virtualization::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            Virtualization::parse(" kvm "),
            Some(Virtualization::Virtual("kvm".into()))
        );
    }

    #[test]
    fn inventory_counts_only_when_complete() {
        let inc = a(&[(RUNTIME_PODS, "u1,u2")]);
        assert_eq!(Advertisement::from_annotations(&inc).runtime_pods, None);
        let done = a(&[(RUNTIME_PODS, "u1, u2,"), (RUNTIME_COMPLETE, "true")]);
        let pods = Advertisement::from_annotations(&done).runtime_pods.unwrap();
        assert_eq!(pods.len(), 2);
        let empty = a(&[(RUNTIME_COMPLETE, "true")]);
        assert_eq!(
            Advertisement::from_annotations(&empty).runtime_pods,
            Some(BTreeSet::new())
        );
    }

    #[test]
    fn an_inventory_says_where_it_was_read_and_an_unknown_source_proves_nothing() {
        let agent = a(&[(RUNTIME_PODS, "u1"), (RUNTIME_COMPLETE, "true")]);
        let ad = Advertisement::from_annotations(&agent);
        assert_eq!(ad.runtime_source, RuntimeSource::NodeAgent);
        assert!(ad.runtime_pods.is_some());
        let cri = a(&[
            (RUNTIME_PODS, "u1"),
            (RUNTIME_COMPLETE, "true"),
            (RUNTIME_SOURCE, " cri "),
        ]);
        let ad = Advertisement::from_annotations(&cri);
        assert_eq!(ad.runtime_source, RuntimeSource::Cri);
        assert_eq!(ad.to_annotations()[RUNTIME_SOURCE].as_deref(), Some("cri"));
        for bad in ["", "CRI", "agent", "crio"] {
            let odd = a(&[
                (RUNTIME_PODS, "u1"),
                (RUNTIME_COMPLETE, "true"),
                (RUNTIME_SOURCE, bad),
            ]);
            let ad = Advertisement::from_annotations(&odd);
            assert_eq!(ad.runtime_pods, None, "{bad:?}");
            assert_eq!(ad.runtime_source, RuntimeSource::Cri, "{bad:?}");
        }
    }

    #[test]
    fn annotations_round_trip_and_withdraw() {
        let ad = Advertisement {
            self_fence_after: Some(Duration::from_secs(10)),
            watchdog: Some(Watchdog {
                timeout: Duration::from_secs(6),
                nowayout: true,
                action: Some(WatchdogAction::Hypervisor),
                driver: Some("i6300esb".into()),
            }),
            scope: Some(SelfFenceScope::All),
            version: Some("0.1.0".into()),
            boot_id: Some("b".into()),
            system_uuid: Some("4c4c4544-0042-3510-8056-b4c04f335331".into()),
            runtime_pods: Some(["x".to_string()].into_iter().collect()),
            runtime_source: RuntimeSource::Cri,
            challenge: Some("c-1".into()),
            peer_check: Some(PeerCheck {
                vouch_after: Duration::from_secs(6),
                answer_valid: Duration::from_secs(3),
                members: Some(MemberSet::of(["m0", "m1", "m2"])),
            }),
            virtualization: Some(Virtualization::Virtual("kvm".into())),
            // Millisecond precision survives the round trip.
            companion_written: Some("2026-11-30T12:00:00.125Z".parse().unwrap()),
            companion_stale: None,
        };
        let written: BTreeMap<String, String> = ad
            .to_annotations()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        assert_eq!(Advertisement::from_annotations(&written), ad);
        // A fractional timeout is advertised rounded up, never down.
        let half = Advertisement {
            self_fence_after: Some(Duration::from_millis(4_500)),
            ..Default::default()
        }
        .to_annotations();
        assert_eq!(half[SELF_FENCE_AFTER].as_deref(), Some("5"));
        // The vouch delay is advertised rounded down, the answer validity up.
        let peer = Advertisement {
            peer_check: Some(PeerCheck {
                vouch_after: Duration::from_millis(6_900),
                answer_valid: Duration::from_millis(2_100),
                members: None,
            }),
            ..Default::default()
        }
        .to_annotations();
        assert_eq!(peer[PEER_VOUCH_AFTER].as_deref(), Some("6"));
        assert_eq!(peer[PEER_ANSWER_VALID].as_deref(), Some("3"));
        let none = Advertisement::default().to_annotations();
        assert!(none.get(WATCHDOG_TIMEOUT).is_some_and(|v| v.is_none()));
        assert!(none.get(PEER_MEMBERS).is_some_and(|v| v.is_none()));
    }

    #[test]
    fn member_sets_are_equal_for_equal_name_sets_only() {
        let a = MemberSet::of(["m1", "m0", "m2", "m0"]);
        assert_eq!(a, MemberSet::of(["m0", "m1", "m2"]));
        assert_eq!(a.count, 3);
        assert_ne!(a, MemberSet::of(["m0", "m1"]));
        assert_ne!(a, MemberSet::of(["m0", "m1", "m3"]));
        // Names are separated: "ab" + "c" is not "a" + "bc".
        assert_ne!(MemberSet::of(["ab", "c"]), MemberSet::of(["a", "bc"]));
        assert_eq!(MemberSet::parse(&a.to_string()), Some(a));
        for bad in ["", "3", "x:1", "3:zz", "3:"] {
            assert_eq!(MemberSet::parse(bad), None, "{bad:?}");
        }
    }
}
