//! Prometheus text-format counters for `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;

use parking_lot::Mutex;

/// Counters keyed by metric name and label set.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<(&'static str, String), f64>>,
}

/// Metric names and their help text.
const HELP: &[(&str, &str, &str)] = &[
    (
        "bridge_requests_total",
        "counter",
        "API requests by route and HTTP status.",
    ),
    (
        "bridge_actions_total",
        "counter",
        "Device actions by action and result.",
    ),
    (
        "bridge_action_seconds_sum",
        "counter",
        "Total seconds spent in device actions.",
    ),
    (
        "bridge_action_seconds_count",
        "counter",
        "Number of timed device actions.",
    ),
    (
        "bridge_stale_token_rejections_total",
        "counter",
        "Requests refused for a stale fencing token.",
    ),
    (
        "bridge_idempotent_replays_total",
        "counter",
        "Requests answered from the idempotency cache.",
    ),
    (
        "bridge_rate_limited_total",
        "counter",
        "Requests refused by the per-client rate limit.",
    ),
    (
        "bridge_tls_handshake_failures_total",
        "counter",
        "TLS handshakes that failed, by reason.",
    ),
    (
        "bridge_reloads_total",
        "counter",
        "Configuration reloads by result.",
    ),
];

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// Adds `v` to `name{labels}`; `labels` are `(key, value)` pairs.
    pub fn add(&self, name: &'static str, labels: &[(&str, &str)], v: f64) {
        let l = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = self.counters.lock();
        *c.entry((name, l)).or_insert(0.0) += v;
    }

    /// Increments `name{labels}`.
    pub fn inc(&self, name: &'static str, labels: &[(&str, &str)]) {
        self.add(name, labels, 1.0);
    }

    /// Renders the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let c = self.counters.lock();
        let mut out = String::new();
        for (name, kind, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            let mut any = false;
            for ((n, l), v) in c.iter().filter(|((n, _), _)| n == name) {
                any = true;
                if l.is_empty() {
                    let _ = writeln!(out, "{n} {v}");
                } else {
                    let _ = writeln!(out, "{n}{{{l}}} {v}");
                }
            }
            if !any && !name.contains('{') {
                let _ = writeln!(out, "{name} 0");
            }
        }
        out
    }
}
