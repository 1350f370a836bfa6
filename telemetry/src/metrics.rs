//! What every Palisade process shares to serve its metrics: the OpenMetrics text of a
//! `prometheus-client` registry and the `Content-Type` it goes out with, and [`Listed`]
//! families that are exposed before their first sample.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A family whose `# HELP` and `# TYPE` lines are exposed before its first sample too:
/// prometheus-client leaves empty families out, and every metric that rules, dashboards and
/// the reference pages name should be listed from a process's start.
#[derive(Debug)]
pub struct Listed<M>(pub M);

impl<M: EncodeMetric> EncodeMetric for Listed<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// The OpenMetrics text exposition of every metric in `registry`, ending in `# EOF`; serve it
/// as [`CONTENT_TYPE`].
///
/// Guarantees: a complete exposition ends in `# EOF`. Encoding into a `String` is not expected
/// to fail; if it does, the error is logged and the text is returned without `# EOF`, so a
/// scraper refuses it rather than keeping part of it.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::error!(error = %e, "encoding the metrics failed");
    }
    out
}

/// Registers `palisade_build_info{component, version} 1`, the conventional constant series
/// that says which build of which component a scrape came from (join other series on it).
pub fn register_build_info(registry: &mut Registry, component: &str, version: &str) {
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    let info: Family<Vec<(String, String)>, Gauge> = Family::default();
    info.get_or_create(&vec![
        ("component".to_string(), component.to_string()),
        ("version".to_string(), version.to_string()),
    ])
    .set(1);
    registry.register(
        "palisade_build_info",
        "Which build of which Palisade component this is (always 1)",
        info,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn a_registry_encodes_to_openmetrics_ending_in_eof() {
        let mut r = Registry::default();
        let c: Counter = Counter::default();
        r.register("palisade_example", "An example", c.clone());
        c.inc();
        let text = encode(&r);
        assert!(text.contains("# TYPE palisade_example counter\n"), "{text}");
        assert!(text.contains("palisade_example_total 1\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_listed_family_is_exposed_before_its_first_sample() {
        use prometheus_client::metrics::family::Family;
        let mut r = Registry::default();
        let plain = Family::<Vec<(String, String)>, Counter>::default();
        let listed = Family::<Vec<(String, String)>, Counter>::default();
        r.register("palisade_plain", "Left out while empty", plain);
        r.register("palisade_listed", "Shown while empty", Listed(listed));
        let text = encode(&r);
        assert!(!text.contains("palisade_plain"), "{text}");
        assert!(text.contains("# TYPE palisade_listed counter\n"), "{text}");
    }

    #[test]
    fn build_info_is_one_series_at_one() {
        let mut r = Registry::default();
        register_build_info(&mut r, "controller", "1.2.3");
        let text = encode(&r);
        assert!(
            text.contains("palisade_build_info{component=\"controller\",version=\"1.2.3\"} 1\n"),
            "{text}"
        );
    }
}
