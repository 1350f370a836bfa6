//! Prometheus metrics in the text exposition format, without a metrics library: a few
//! labelled counters and per-phase duration sums.

use std::collections::BTreeMap;
use std::fmt::Write;

use parking_lot::Mutex;

/// The registry.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    fences: BTreeMap<String, u64>,
    held: BTreeMap<String, u64>,
    steps: BTreeMap<String, u64>,
    phase_seconds: BTreeMap<String, Histogram>,
    decisions: BTreeMap<String, u64>,
    ticks: u64,
    leader: bool,
    rejected: BTreeMap<String, u64>,
    denied: BTreeMap<String, u64>,
    untimely: BTreeMap<String, u64>,
    target_ready: BTreeMap<(String, String), bool>,
    without_working_fence: u64,
    check_seconds: Histogram,
}

/// Upper bounds (seconds) of the device-check latency histogram.
const CHECK_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Upper bounds (seconds) of the phase-duration histograms: from a quick step to the longest
/// self-fence wait and recovery.
const PHASE_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// A Prometheus histogram: cumulative counts per upper bound, sum and count.
#[derive(Clone, Debug)]
struct Histogram {
    bounds: &'static [f64],
    cumulative: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            cumulative: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: f64) {
        for (i, le) in self.bounds.iter().enumerate() {
            if value <= *le {
                self.cumulative[i] += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    /// Writes the `_bucket`, `_sum` and `_count` series of `name`; `labels` is empty or
    /// `key="value"` pairs joined by commas.
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let braces = |l: &str| {
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            }
        };
        for (le, n) in self.bounds.iter().zip(&self.cumulative) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{} {}", braces(labels), self.sum);
        let _ = writeln!(out, "{name}_count{} {}", braces(labels), self.count);
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new(CHECK_BUCKETS)
    }
}

impl Metrics {
    /// A fence ended (`released`, `failed`, `done`, `cancelled`).
    pub fn fence(&self, outcome: &str) {
        *self.lock().fences.entry(outcome.into()).or_default() += 1;
    }

    /// A decision held, for this reason label.
    pub fn held(&self, reason: &str) {
        *self.lock().held.entry(reason.into()).or_default() += 1;
    }

    /// A verdict was produced (label as in `Verdict::label`).
    pub fn decision(&self, label: &str) {
        *self.lock().decisions.entry(label.into()).or_default() += 1;
    }

    /// A Lease renewal of `node` was stamped in the future or observed too late (a clock off by
    /// more than the assumed skew): it does not count toward the healthy majority.
    pub fn untimely_renewal(&self, node: &str) {
        *self.lock().untimely.entry(node.into()).or_default() += 1;
    }

    /// A state-machine step was performed.
    pub fn step(&self, label: &str) {
        *self.lock().steps.entry(label.into()).or_default() += 1;
    }

    /// A phase lasted `seconds`.
    pub fn phase_duration(&self, phase: &str, seconds: f64) {
        self.lock()
            .phase_seconds
            .entry(phase.into())
            .or_insert_with(|| Histogram::new(PHASE_BUCKETS))
            .observe(seconds);
    }

    /// How many configuration objects are not accepted now, by `kind/reason` (a gauge,
    /// replaced whole on every report).
    pub fn set_rejected(&self, counts: BTreeMap<String, u64>) {
        self.lock().rejected = counts;
    }

    /// Whether `node`'s fence `level` answered its last readiness check.
    pub fn set_target_ready(&self, node: &str, level: &str, ready: bool) {
        self.lock()
            .target_ready
            .insert((node.to_string(), level.to_string()), ready);
    }

    /// How many covered nodes could not be fenced now.
    pub fn set_without_working_fence(&self, n: u64) {
        self.lock().without_working_fence = n;
    }

    /// One readiness check took `seconds`.
    pub fn check_latency(&self, seconds: f64) {
        self.lock().check_seconds.observe(seconds);
    }

    /// The admission webhook denied an object of `kind`.
    pub fn admission_denied(&self, kind: &str) {
        *self.lock().denied.entry(kind.into()).or_default() += 1;
    }

    /// A detection tick ran.
    pub fn tick(&self, leader: bool) {
        let mut g = self.lock();
        g.ticks += 1;
        g.leader = leader;
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Renders the text exposition format.
    pub fn render(&self) -> String {
        let g = self.lock();
        let mut out = String::new();
        let counter =
            |out: &mut String, name: &str, help: &str, label: &str, m: &BTreeMap<String, u64>| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
                for (k, v) in m {
                    let _ = writeln!(out, "{name}{{{label}=\"{k}\"}} {v}");
                }
            };
        counter(
            &mut out,
            "palisade_fences_total",
            "Fencing operations by outcome.",
            "outcome",
            &g.fences,
        );
        counter(
            &mut out,
            "palisade_untimely_renewals_total",
            "Lease renewals stamped in the future or observed late (check the node's clock), by node.",
            "node",
            &g.untimely,
        );
        counter(
            &mut out,
            "palisade_held_decisions_total",
            "Decisions that held, by reason.",
            "reason",
            &g.held,
        );
        counter(
            &mut out,
            "palisade_decisions_total",
            "Verdicts produced, by label.",
            "verdict",
            &g.decisions,
        );
        counter(
            &mut out,
            "palisade_admission_denied_total",
            "Objects the admission webhook refused, by kind.",
            "kind",
            &g.denied,
        );
        counter(
            &mut out,
            "palisade_steps_total",
            "NodeFence state-machine steps performed.",
            "step",
            &g.steps,
        );
        let _ = writeln!(
            out,
            "# HELP palisade_phase_duration_seconds Time spent in each NodeFence phase.\n# TYPE palisade_phase_duration_seconds histogram"
        );
        for (phase, h) in &g.phase_seconds {
            h.render(
                &mut out,
                "palisade_phase_duration_seconds",
                &format!("phase=\"{phase}\""),
            );
        }
        let _ = writeln!(
            out,
            "# HELP palisade_config_rejected Configuration objects not accepted now, by kind and reason.\n# TYPE palisade_config_rejected gauge"
        );
        for (key, v) in &g.rejected {
            let (kind, reason) = key.split_once('/').unwrap_or((key.as_str(), ""));
            let _ = writeln!(
                out,
                "palisade_config_rejected{{kind=\"{kind}\",reason=\"{reason}\"}} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP palisade_fence_target_ready Whether every device of a node's fence level answered its last read-only check.\n# TYPE palisade_fence_target_ready gauge"
        );
        for ((node, level), ready) in &g.target_ready {
            let _ = writeln!(
                out,
                "palisade_fence_target_ready{{node=\"{node}\",level=\"{level}\"}} {}",
                u8::from(*ready)
            );
        }
        let _ = writeln!(
            out,
            "# HELP palisade_nodes_without_working_fence Covered nodes that could not be fenced now.\n# TYPE palisade_nodes_without_working_fence gauge\npalisade_nodes_without_working_fence {}",
            g.without_working_fence
        );
        let _ = writeln!(
            out,
            "# HELP palisade_fence_check_seconds Latency of read-only device checks.\n# TYPE palisade_fence_check_seconds histogram"
        );
        g.check_seconds
            .render(&mut out, "palisade_fence_check_seconds", "");
        let _ = writeln!(
            out,
            "# HELP palisade_ticks_total Detection ticks.\n# TYPE palisade_ticks_total counter\npalisade_ticks_total {}",
            g.ticks
        );
        let _ = writeln!(
            out,
            "# HELP palisade_leader Whether this replica leads.\n# TYPE palisade_leader gauge\npalisade_leader {}",
            u8::from(g.leader)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lists_counters_with_labels_and_phase_sums() {
        let m = Metrics::default();
        m.fence("released");
        m.fence("released");
        m.held("quorum_lost");
        m.phase_duration("Fencing", 1.5);
        m.phase_duration("Fencing", 0.5);
        m.set_rejected([("FenceTarget/CredentialsInUrl".to_string(), 1)].into());
        let text = m.render();
        assert!(
            text.contains(
                "palisade_config_rejected{kind=\"FenceTarget\",reason=\"CredentialsInUrl\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("palisade_fences_total{outcome=\"released\"} 2"),
            "{text}"
        );
        assert!(text.contains("palisade_held_decisions_total{reason=\"quorum_lost\"} 1"));
        assert!(text.contains("palisade_phase_duration_seconds_sum{phase=\"Fencing\"} 2"));
        assert!(text.contains("palisade_phase_duration_seconds_count{phase=\"Fencing\"} 2"));
        assert!(text.contains("# TYPE palisade_phase_duration_seconds histogram"));
        for (le, n) in [
            ("0.1", 0),
            ("0.5", 1),
            ("1", 1),
            ("2.5", 2),
            ("600", 2),
            ("+Inf", 2),
        ] {
            let line = format!(
                "palisade_phase_duration_seconds_bucket{{phase=\"Fencing\",le=\"{le}\"}} {n}"
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        m.check_latency(0.2);
        let text = m.render();
        assert!(
            text.contains("palisade_fence_check_seconds_bucket{le=\"0.1\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("palisade_fence_check_seconds_bucket{le=\"0.25\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("palisade_fence_check_seconds_count 1"),
            "{text}"
        );
    }
}
