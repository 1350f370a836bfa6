//! The controller's Prometheus metrics, kept and encoded by `prometheus-client`: labelled
//! counters, gauges, and histograms of phase durations and device-check latency, served on
//! `/metrics` as OpenMetrics text ([`CONTENT_TYPE`]).
//!
//! The exposed names are what the shipped alert rules and dashboard (`controller/manifests/`)
//! query. A counter registered here as `palisade_fences` is scraped as `palisade_fences_total`:
//! the encoder appends the suffix.

use std::collections::{BTreeMap, BTreeSet};

use palisade_telemetry::metrics::Listed;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub use palisade_telemetry::metrics::CONTENT_TYPE;

/// Upper bounds (seconds) of the device-check latency histogram.
const CHECK_BUCKETS: [f64; 8] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Upper bounds (seconds) of the phase-duration histograms: from a quick step to the longest
/// self-fence wait and recovery.
const PHASE_BUCKETS: [f64; 11] = [
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// A label set: the names are fixed per family, the values come with each observation.
type Labels<const N: usize> = [(&'static str, String); N];

/// Counters by the value of one label.
type Counters = Family<Labels<1>, Counter>;

/// Phase-duration histograms by phase.
type PhaseHistograms = Family<Labels<1>, Histogram, fn() -> Histogram>;

/// The registry, and a handle on each metric registered in it.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    fences: Counters,
    untimely: Counters,
    held: Counters,
    decisions: Counters,
    denied: Counters,
    steps: Counters,
    phase_seconds: PhaseHistograms,
    rejected: Family<Labels<2>, Gauge>,
    /// The label sets of `rejected` that the last report set: the next report removes those
    /// it lacks.
    rejected_shown: Mutex<BTreeSet<Labels<2>>>,
    target_ready: Family<Labels<2>, Gauge>,
    without_working_fence: Gauge,
    check_seconds: Histogram,
    power_reads: Counters,
    ticks: Counter,
    leader: Gauge,
    events_dropped: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let phase_seconds: PhaseHistograms =
            Family::new_with_constructor(|| Histogram::new(PHASE_BUCKETS));
        let m = Self {
            registry: Registry::default(),
            fences: Counters::default(),
            untimely: Counters::default(),
            held: Counters::default(),
            decisions: Counters::default(),
            denied: Counters::default(),
            steps: Counters::default(),
            phase_seconds,
            rejected: Family::default(),
            rejected_shown: Mutex::default(),
            target_ready: Family::default(),
            without_working_fence: Gauge::default(),
            check_seconds: Histogram::new(CHECK_BUCKETS),
            power_reads: Counters::default(),
            ticks: Counter::default(),
            leader: Gauge::default(),
            events_dropped: Counter::default(),
        };
        let mut r = Registry::default();
        palisade_telemetry::metrics::register_build_info(
            &mut r,
            "controller",
            env!("CARGO_PKG_VERSION"),
        );
        // Help texts end without a full stop: the encoder appends one.
        r.register(
            "palisade_fences",
            "Fencing operations by outcome",
            Listed(m.fences.clone()),
        );
        r.register(
            "palisade_untimely_renewals",
            "Lease renewals stamped in the future or observed late (check the node's clock), by node",
            Listed(m.untimely.clone()),
        );
        r.register(
            "palisade_held_decisions",
            "Decisions that held, by reason",
            Listed(m.held.clone()),
        );
        r.register(
            "palisade_decisions",
            "Verdicts produced, by label",
            Listed(m.decisions.clone()),
        );
        r.register(
            "palisade_admission_denied",
            "Objects the admission webhook refused, by kind",
            Listed(m.denied.clone()),
        );
        r.register(
            "palisade_steps",
            "NodeFence state-machine steps performed",
            Listed(m.steps.clone()),
        );
        r.register(
            "palisade_phase_duration_seconds",
            "Time spent in each NodeFence phase",
            Listed(m.phase_seconds.clone()),
        );
        r.register(
            "palisade_config_rejected",
            "Configuration objects not accepted now, by kind and reason",
            Listed(m.rejected.clone()),
        );
        r.register(
            "palisade_fence_target_ready",
            "Whether every device of a node's fence level answered its last read-only check",
            Listed(m.target_ready.clone()),
        );
        r.register(
            "palisade_nodes_without_working_fence",
            "Covered nodes that could not be fenced now",
            m.without_working_fence.clone(),
        );
        r.register(
            "palisade_fence_check_seconds",
            "Latency of read-only device checks",
            m.check_seconds.clone(),
        );
        r.register(
            "palisade_power_reads",
            "Power watch reads, by what the node read (off, on, unknown)",
            Listed(m.power_reads.clone()),
        );
        r.register("palisade_ticks", "Detection ticks", m.ticks.clone());
        r.register(
            "palisade_events_dropped",
            "Kubernetes Events dropped because the queue to the API server was full",
            m.events_dropped.clone(),
        );
        r.register(
            "palisade_leader",
            "Whether this replica leads",
            m.leader.clone(),
        );
        Self { registry: r, ..m }
    }
}

/// Increments the counter of `family` whose one label `name` is `value`.
fn inc(family: &Counters, name: &'static str, value: &str) {
    family.get_or_create(&[(name, value.to_owned())]).inc();
}

/// `n` as a gauge value (gauges are signed; no count here comes near the limit).
fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    /// A fence ended (`released`, `failed`, `done`, `cancelled`).
    pub fn fence(&self, outcome: &str) {
        inc(&self.fences, "outcome", outcome);
    }

    /// A decision held, for this reason label.
    pub fn held(&self, reason: &str) {
        inc(&self.held, "reason", reason);
    }

    /// A verdict was produced (label as in `Verdict::label`).
    pub fn decision(&self, label: &str) {
        inc(&self.decisions, "verdict", label);
    }

    /// A Lease renewal of `node` was stamped in the future or observed too late (a clock off by
    /// more than the assumed skew): it does not count toward the healthy majority.
    pub fn untimely_renewal(&self, node: &str) {
        inc(&self.untimely, "node", node);
    }

    /// A state-machine step was performed.
    pub fn step(&self, label: &str) {
        inc(&self.steps, "step", label);
    }

    /// A phase lasted `seconds`.
    pub fn phase_duration(&self, phase: &str, seconds: f64) {
        self.phase_seconds
            .get_or_create(&[("phase", phase.to_owned())])
            .observe(seconds);
    }

    /// How many configuration objects are not accepted now, by `kind/reason` (a gauge,
    /// replaced whole on every report: a pair missing from `counts` is no longer exposed).
    pub fn set_rejected(&self, counts: BTreeMap<String, u64>) {
        let mut shown = self.rejected_shown.lock();
        let now: BTreeSet<Labels<2>> = counts
            .iter()
            .map(|(key, n)| {
                let (kind, reason) = key.split_once('/').unwrap_or((key.as_str(), ""));
                let labels = [("kind", kind.to_owned()), ("reason", reason.to_owned())];
                self.rejected.get_or_create(&labels).set(gauge(*n));
                labels
            })
            .collect();
        // Set first, remove after: a scrape in between never misses a pair still rejected.
        for gone in shown.difference(&now) {
            self.rejected.remove(gone);
        }
        *shown = now;
    }

    /// Whether `node`'s fence `level` answered its last readiness check.
    pub fn set_target_ready(&self, node: &str, level: &str, ready: bool) {
        self.target_ready
            .get_or_create(&[("node", node.to_owned()), ("level", level.to_owned())])
            .set(i64::from(ready));
    }

    /// How many covered nodes could not be fenced now.
    pub fn set_without_working_fence(&self, n: u64) {
        self.without_working_fence.set(gauge(n));
    }

    /// One readiness check took `seconds`.
    pub fn check_latency(&self, seconds: f64) {
        self.check_seconds.observe(seconds);
    }

    /// The power watch read a node's power as `state`.
    pub fn power_read(&self, state: &str) {
        inc(&self.power_reads, "state", state);
    }

    /// The admission webhook denied an object of `kind`.
    pub fn admission_denied(&self, kind: &str) {
        inc(&self.denied, "kind", kind);
    }

    /// A detection tick ran.
    pub fn tick(&self, leader: bool) {
        self.ticks.inc();
        self.leader.set(i64::from(leader));
    }

    /// The counter of Events dropped, for [`crate::events::Recorder::counting_drops_in`].
    pub fn events_dropped(&self) -> Counter {
        self.events_dropped.clone()
    }

    /// The OpenMetrics text exposition of every metric, ending in `# EOF`; serve it as
    /// [`CONTENT_TYPE`].
    pub fn render(&self) -> String {
        palisade_telemetry::metrics::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use palisade_test_support::samples;

    #[test]
    fn render_lists_counters_with_labels_and_phase_histograms() {
        let m = Metrics::default();
        m.fence("released");
        m.fence("released");
        m.held("quorum_lost");
        m.phase_duration("Fencing", 1.5);
        m.phase_duration("Fencing", 0.5);
        m.set_rejected([("FenceTarget/CredentialsInUrl".to_string(), 1)].into());
        let text = m.render();
        assert!(text.ends_with("# EOF\n"), "{text}");
        let s = samples(&text);
        assert_eq!(
            s.get(r#"palisade_config_rejected{kind="FenceTarget",reason="CredentialsInUrl"}"#),
            Some(&1.0),
            "{text}"
        );
        assert_eq!(
            s.get(r#"palisade_fences_total{outcome="released"}"#),
            Some(&2.0)
        );
        assert_eq!(
            s.get(r#"palisade_held_decisions_total{reason="quorum_lost"}"#),
            Some(&1.0)
        );
        assert_eq!(
            s.get(r#"palisade_phase_duration_seconds_sum{phase="Fencing"}"#),
            Some(&2.0)
        );
        assert_eq!(
            s.get(r#"palisade_phase_duration_seconds_count{phase="Fencing"}"#),
            Some(&2.0)
        );
        assert!(text.contains("# TYPE palisade_phase_duration_seconds histogram"));
        for (le, n) in [
            ("0.1", 0.0),
            ("0.5", 1.0),
            ("1.0", 1.0),
            ("2.5", 2.0),
            ("600.0", 2.0),
            ("+Inf", 2.0),
        ] {
            let series =
                format!(r#"palisade_phase_duration_seconds_bucket{{le="{le}",phase="Fencing"}}"#);
            assert_eq!(s.get(series.as_str()), Some(&n), "{series} in {text}");
        }
        m.check_latency(0.2);
        let text = m.render();
        let s = samples(&text);
        assert_eq!(
            s.get(r#"palisade_fence_check_seconds_bucket{le="0.1"}"#),
            Some(&0.0),
            "{text}"
        );
        assert_eq!(
            s.get(r#"palisade_fence_check_seconds_bucket{le="0.25"}"#),
            Some(&1.0)
        );
        assert_eq!(s.get("palisade_fence_check_seconds_count"), Some(&1.0));
    }

    #[test]
    fn known_observations_parse_back_to_their_counts_sums_and_buckets() {
        let m = Metrics::default();
        m.fence("released");
        m.fence("failed");
        m.fence("released");
        m.decision("wait_forgiveness");
        m.untimely_renewal("w1");
        m.step("PowerOff");
        m.admission_denied("NodeFence");
        for seconds in [0.2, 1.0, 12.0] {
            m.check_latency(seconds);
        }
        m.set_target_ready("w0", "ipmi", true);
        m.set_target_ready("w1", "pdu", false);
        m.set_without_working_fence(1);
        m.tick(false);
        m.tick(true);
        let text = m.render();
        let s = samples(&text);
        let expected = [
            (r#"palisade_fences_total{outcome="released"}"#, 2.0),
            (r#"palisade_fences_total{outcome="failed"}"#, 1.0),
            (
                r#"palisade_decisions_total{verdict="wait_forgiveness"}"#,
                1.0,
            ),
            (r#"palisade_untimely_renewals_total{node="w1"}"#, 1.0),
            (r#"palisade_steps_total{step="PowerOff"}"#, 1.0),
            (r#"palisade_admission_denied_total{kind="NodeFence"}"#, 1.0),
            (r#"palisade_fence_check_seconds_bucket{le="0.05"}"#, 0.0),
            (r#"palisade_fence_check_seconds_bucket{le="0.25"}"#, 1.0),
            (r#"palisade_fence_check_seconds_bucket{le="1.0"}"#, 2.0),
            (r#"palisade_fence_check_seconds_bucket{le="10.0"}"#, 2.0),
            (r#"palisade_fence_check_seconds_bucket{le="+Inf"}"#, 3.0),
            ("palisade_fence_check_seconds_sum", 13.2),
            ("palisade_fence_check_seconds_count", 3.0),
            (
                r#"palisade_fence_target_ready{node="w0",level="ipmi"}"#,
                1.0,
            ),
            (r#"palisade_fence_target_ready{node="w1",level="pdu"}"#, 0.0),
            ("palisade_nodes_without_working_fence", 1.0),
            ("palisade_ticks_total", 2.0),
            ("palisade_leader", 1.0),
        ];
        for (series, value) in expected {
            assert_eq!(s.get(series), Some(&value), "{series} in {text}");
        }
        // Nothing was held, no phase ended and nothing is rejected: no samples, but the
        // families are listed for the rules and the dashboard.
        for family in [
            "palisade_held_decisions counter",
            "palisade_phase_duration_seconds histogram",
            "palisade_config_rejected gauge",
        ] {
            assert!(text.contains(&format!("# TYPE {family}\n")), "{family}");
        }
        assert!(!text.contains("palisade_held_decisions_total{"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_rejection_report_replaces_the_previous_one() {
        let m = Metrics::default();
        m.set_rejected(
            [
                ("FenceTarget/CredentialsInUrl".to_string(), 1),
                ("FencingPolicy/Invalid".to_string(), 2),
            ]
            .into(),
        );
        m.set_rejected([("FencingPolicy/Invalid".to_string(), 1)].into());
        let text = m.render();
        let s = samples(&text);
        assert_eq!(
            s.get(r#"palisade_config_rejected{kind="FencingPolicy",reason="Invalid"}"#),
            Some(&1.0),
            "{text}"
        );
        assert!(!text.contains("CredentialsInUrl"), "{text}");
    }
}
