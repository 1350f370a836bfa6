//! The bridge's Prometheus metrics, kept and encoded by `prometheus-client`: labelled counters
//! and a histogram of device-action durations, served on `/metrics` as OpenMetrics text
//! ([`CONTENT_TYPE`]).

use std::collections::BTreeMap;

use palisade_telemetry::metrics::Listed;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub use palisade_telemetry::metrics::CONTENT_TYPE;

/// The counters: the name as scraped (the encoder appends `_total` to the registered name),
/// the label names [`Metrics::inc`] takes, in order, and the help text.
const COUNTERS: &[(&str, &[&str], &str)] = &[
    (
        "palisade_bridge_requests_total",
        &["route", "status"],
        "API requests by route and HTTP status",
    ),
    (
        "palisade_bridge_actions_total",
        &["action", "result"],
        "Device actions by action and result",
    ),
    (
        "palisade_bridge_stale_token_rejections_total",
        &["target"],
        "Requests refused for a stale fencing token",
    ),
    (
        "palisade_bridge_idempotent_replays_total",
        &[],
        "Requests answered from the idempotency cache",
    ),
    (
        "palisade_bridge_rate_limited_total",
        &["client"],
        "Requests refused by the per-client rate limit",
    ),
    (
        "palisade_bridge_tls_handshake_failures_total",
        &["reason"],
        "TLS handshakes that failed, by reason",
    ),
    (
        "palisade_bridge_reloads_total",
        &["result"],
        "Configuration reloads by result",
    ),
];

/// Upper bounds (seconds) of the device-action histogram: from a quick status read to the
/// default operation timeout (120 s).
const ACTION_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Counters by their label values (the label names are fixed per counter).
type Counters = Family<Vec<(&'static str, String)>, Counter>;

/// The registry, and a handle on each metric registered in it.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// By the name as scraped: the label names, and the family.
    counters: BTreeMap<&'static str, (&'static [&'static str], Counters)>,
    action_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let mut counters = BTreeMap::new();
        for &(name, labels, help) in COUNTERS {
            let family = Counters::default();
            if labels.is_empty() {
                // The one series of an unlabelled counter is exposed from the start, at 0.
                drop(family.get_or_create(&Vec::new()));
            }
            let registered = name.strip_suffix("_total").unwrap_or(name);
            // Help texts end without a full stop: the encoder appends one.
            registry.register(registered, help, Listed(family.clone()));
            counters.insert(name, (labels, family));
        }
        palisade_telemetry::metrics::register_build_info(
            &mut registry,
            "firmware-bridge",
            env!("CARGO_PKG_VERSION"),
        );
        let action_seconds = Histogram::new(ACTION_BUCKETS);
        registry.register(
            "palisade_bridge_action_seconds",
            "Time spent in device actions",
            action_seconds.clone(),
        );
        Self {
            registry,
            counters,
            action_seconds,
        }
    }
}

impl Metrics {
    /// Increments the counter `name` (as scraped, e.g. `palisade_bridge_requests_total`) for these
    /// `(label, value)` pairs; the labels are the counter's, in its order. Anything else is
    /// logged and not counted.
    pub fn inc(&self, name: &str, labels: &[(&str, &str)]) {
        let Some((names, family)) = self.counters.get(name) else {
            tracing::warn!(metric = name, "not a bridge counter; not counted");
            return;
        };
        if !labels.iter().map(|(k, _)| k).eq(names.iter()) {
            tracing::warn!(metric = name, ?labels, expected = ?names, "wrong labels; not counted");
            return;
        }
        let set = names
            .iter()
            .zip(labels)
            .map(|(k, (_, v))| (*k, (*v).to_owned()))
            .collect();
        family.get_or_create(&set).inc();
    }

    /// A device action took `seconds`.
    pub fn action_duration(&self, seconds: f64) {
        self.action_seconds.observe(seconds);
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
    fn known_observations_parse_back_to_their_counts_sums_and_buckets() {
        let m = Metrics::default();
        let route = [
            ("route", "/v1/targets/{id}/power/{action}"),
            ("status", "200"),
        ];
        m.inc("palisade_bridge_requests_total", &route);
        m.inc("palisade_bridge_requests_total", &route);
        m.inc(
            "palisade_bridge_actions_total",
            &[("action", "power.off"), ("result", "ok")],
        );
        m.inc(
            "palisade_bridge_tls_handshake_failures_total",
            &[("reason", "unknown_ca")],
        );
        m.inc(
            "palisade_bridge_rate_limited_total",
            &[("client", "ctl \"x\"")],
        );
        for seconds in [0.3, 1.2, 45.0] {
            m.action_duration(seconds);
        }
        let text = m.render();
        let s = samples(&text);
        let expected = [
            (
                r#"palisade_bridge_requests_total{route="/v1/targets/{id}/power/{action}",status="200"}"#,
                2.0,
            ),
            (
                r#"palisade_bridge_actions_total{action="power.off",result="ok"}"#,
                1.0,
            ),
            (
                r#"palisade_bridge_tls_handshake_failures_total{reason="unknown_ca"}"#,
                1.0,
            ),
            (
                r#"palisade_bridge_rate_limited_total{client="ctl \"x\""}"#,
                1.0,
            ),
            ("palisade_bridge_idempotent_replays_total", 0.0),
            (r#"palisade_bridge_action_seconds_bucket{le="0.25"}"#, 0.0),
            (r#"palisade_bridge_action_seconds_bucket{le="0.5"}"#, 1.0),
            (r#"palisade_bridge_action_seconds_bucket{le="2.5"}"#, 2.0),
            (r#"palisade_bridge_action_seconds_bucket{le="30.0"}"#, 2.0),
            (r#"palisade_bridge_action_seconds_bucket{le="60.0"}"#, 3.0),
            (r#"palisade_bridge_action_seconds_bucket{le="+Inf"}"#, 3.0),
            ("palisade_bridge_action_seconds_sum", 46.5),
            ("palisade_bridge_action_seconds_count", 3.0),
        ];
        for (series, value) in expected {
            assert_eq!(s.get(series), Some(&value), "{series} in {text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn counters_are_scraped_with_their_total_names() {
        for (name, _, _) in COUNTERS {
            assert!(name.ends_with("_total"), "{name}");
        }
        let m = Metrics::default();
        m.inc("palisade_bridge_reloads_total", &[("result", "ok")]);
        let text = m.render();
        assert!(
            text.contains("# TYPE palisade_bridge_reloads counter\n"),
            "{text}"
        );
        assert!(
            text.contains("\npalisade_bridge_reloads_total{result=\"ok\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn unknown_counters_and_wrong_labels_are_not_counted() {
        let m = Metrics::default();
        m.inc("palisade_bridge_nonsense_total", &[]);
        m.inc("palisade_bridge_reloads_total", &[("outcome", "ok")]);
        m.inc("palisade_bridge_reloads_total", &[]);
        let text = m.render();
        assert!(!text.contains("nonsense"), "{text}");
        assert!(
            !samples(&text)
                .keys()
                .any(|s| s.starts_with("palisade_bridge_reloads")),
            "{text}"
        );
    }

    #[test]
    fn every_counter_is_listed_before_its_first_sample() {
        let text = Metrics::default().render();
        for (name, _, _) in COUNTERS {
            let family = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                text.contains(&format!("# TYPE {family} counter\n")),
                "{family} in {text}"
            );
        }
    }
}
