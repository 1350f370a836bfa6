//! Agent metrics, served on `/metrics` as OpenMetrics text ([`CONTENT_TYPE`]) by
//! `prometheus-client`'s encoder.
//!
//! The counters and gauges are plain atomics that the agent's loops (and the [`peer`] check's)
//! update directly; a scrape reads each into a constant metric of a registry built for it.
//! Container start latencies are a `prometheus-client` histogram.
//!
//! [`peer`]: crate::peer

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub use palisade_telemetry::metrics::CONTENT_TYPE;

/// Upper bounds (seconds) of the container start latency histogram: from a process already
/// unpacked to one whose image is unpacked first.
const START_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The agent's counters and gauges.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Live pod workers.
    pub workers: AtomicU64,
    /// Containers started.
    pub container_starts: AtomicU64,
    /// Pods self-fenced.
    pub self_fences: AtomicU64,
    /// Fence-eligible containers a self-fence could not confirm dead.
    pub self_fence_kill_failures: AtomicU64,
    /// Successful Lease renewals.
    pub lease_renewals: AtomicU64,
    /// Failed Lease renewals.
    pub lease_failures: AtomicU64,
    /// SIGKILLs sent at a grace deadline.
    pub deadline_kills: AtomicU64,
    /// Largest observed lateness of a deadline KILL, microseconds.
    pub kill_lateness_us_max: AtomicU64,
    /// Milliseconds since the last Lease renewal, as last computed.
    pub lease_age_ms: AtomicU64,
    /// Times the watchdog could not be armed as asked (timeout or nowayout refused).
    pub watchdog_arm_failures: AtomicU64,
    /// The armed watchdog's timeout in seconds; 0 while none is armed and petted.
    pub watchdog_timeout_seconds: AtomicU64,
    /// 1 while the armed watchdog is `nowayout`.
    pub watchdog_nowayout: AtomicU64,
    start_seconds: StartSeconds,
    /// The last 1000 start latencies, microseconds, oldest first.
    recent: Mutex<Vec<u64>>,
    /// The peer check's counters (all zero without one).
    pub peer: std::sync::Arc<crate::peer::PeerMetrics>,
}

/// The container start latency histogram, with [`START_BUCKETS`].
#[derive(Debug)]
struct StartSeconds(Histogram);

impl Default for StartSeconds {
    fn default() -> Self {
        Self(Histogram::new(START_BUCKETS))
    }
}

impl Metrics {
    /// Records a container start latency.
    pub fn observe_start(&self, d: Duration) {
        self.container_starts.fetch_add(1, Ordering::Relaxed);
        self.start_seconds.0.observe(d.as_secs_f64());
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let mut v = self.recent.lock();
        v.push(us);
        if v.len() > 1000 {
            v.remove(0);
        }
    }

    /// Records the watchdog the agent holds armed and pets (`None`: none).
    pub fn watchdog_armed(&self, armed: Option<crate::watchdog_device::Armed>) {
        let (t, n) = armed.map_or((0, 0), |a| (a.timeout.as_secs(), u64::from(a.nowayout)));
        self.watchdog_timeout_seconds.store(t, Ordering::Relaxed);
        self.watchdog_nowayout.store(n, Ordering::Relaxed);
    }

    /// Records how late a deadline KILL was.
    pub fn observe_kill_lateness(&self, d: Duration) {
        self.deadline_kills.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.kill_lateness_us_max.fetch_max(us, Ordering::Relaxed);
    }

    /// A registry of every metric, with the atomics' values as of now.
    fn registry(&self) -> Registry {
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let counter = |v: &AtomicU64| ConstCounter::new(g(v));
        let gauge = |v: &AtomicU64| ConstGauge::new(g(v));
        let p50_us = {
            let mut v = self.recent.lock().clone();
            v.sort_unstable();
            v.get(v.len() / 2).copied().unwrap_or(0)
        };
        let mut r = Registry::default();
        // Counters are registered without their `_total` (the encoder appends it), and help
        // texts without a full stop (the encoder appends one).
        r.register(
            "palisade_node_pod_workers",
            "Live pod workers",
            gauge(&self.workers),
        );
        r.register(
            "palisade_node_container_starts",
            "Containers started",
            counter(&self.container_starts),
        );
        r.register(
            "palisade_node_container_start_seconds",
            "Container start latencies",
            self.start_seconds.0.clone(),
        );
        r.register(
            "palisade_node_container_start_p50_seconds",
            "Median start latency of the last 1000 starts",
            ConstGauge::new(p50_us as f64 / 1e6),
        );
        r.register(
            "palisade_node_self_fences",
            "Pods self-fenced",
            counter(&self.self_fences),
        );
        r.register(
            "palisade_node_self_fence_kill_failures",
            "Fence-eligible containers a self-fence could not confirm dead",
            counter(&self.self_fence_kill_failures),
        );
        r.register(
            "palisade_node_lease_renewals",
            "Lease renewals",
            counter(&self.lease_renewals),
        );
        r.register(
            "palisade_node_lease_failures",
            "Failed Lease renewals",
            counter(&self.lease_failures),
        );
        r.register(
            "palisade_node_deadline_kills",
            "SIGKILLs at a grace deadline",
            counter(&self.deadline_kills),
        );
        r.register(
            "palisade_node_kill_lateness_max_seconds",
            "Largest lateness of a deadline SIGKILL",
            ConstGauge::new(g(&self.kill_lateness_us_max) as f64 / 1e6),
        );
        r.register(
            "palisade_node_lease_age_seconds",
            "Time since the last successful Lease renewal",
            ConstGauge::new(g(&self.lease_age_ms) as f64 / 1e3),
        );
        r.register(
            "palisade_node_watchdog_timeout_seconds",
            "The armed watchdog's timeout as the driver holds it; 0 while none is armed and petted",
            gauge(&self.watchdog_timeout_seconds),
        );
        r.register(
            "palisade_node_watchdog_nowayout",
            "1 while the armed watchdog refuses the magic close",
            gauge(&self.watchdog_nowayout),
        );
        r.register(
            "palisade_node_watchdog_arm_failures",
            "Times the watchdog could not be armed as asked",
            counter(&self.watchdog_arm_failures),
        );
        let p = &*self.peer;
        let by = |label: &'static str, values: &[(&'static str, &AtomicU64)]| {
            let family = Family::<[(&'static str, &'static str); 1], Counter>::default();
            for &(value, n) in values {
                family.get_or_create(&[(label, value)]).inc_by(g(n));
            }
            family
        };
        r.register(
            "palisade_node_peer_requests",
            "Peer-check requests this agent sent, by result",
            by(
                "result",
                &[
                    ("vouch", &p.requests_vouch),
                    ("no_vouch", &p.requests_no_vouch),
                    ("error", &p.requests_error),
                ],
            ),
        );
        r.register(
            "palisade_node_peer_answers",
            "Peer-check answers this agent gave, by answer",
            by(
                "answer",
                &[
                    ("vouch", &p.answers_vouch),
                    ("no_vouch", &p.answers_no_vouch),
                ],
            ),
        );
        r.register(
            "palisade_node_peer_rejected",
            "Peer-check requests refused unanswered (bad MAC, garbage, oversize)",
            counter(&p.rejected),
        );
        r.register(
            "palisade_node_peer_excused",
            "1 while a majority of peers excuses this node from self-fencing",
            gauge(&p.excused),
        );
        r
    }

    /// The OpenMetrics text exposition of every metric, ending in `# EOF`; serve it as
    /// [`CONTENT_TYPE`].
    pub fn render(&self) -> String {
        palisade_telemetry::metrics::encode(&self.registry())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use palisade_test_support::samples;

    #[test]
    fn render_lists_every_metric_with_type() {
        let m = Metrics::default();
        m.observe_start(Duration::from_millis(30));
        m.observe_kill_lateness(Duration::from_millis(5));
        let out = m.render();
        assert!(out.contains("\npalisade_node_container_starts_total 1\n"));
        assert!(out.contains("# TYPE palisade_node_deadline_kills counter\n"));
        assert!(out.contains("\npalisade_node_deadline_kills_total 1\n"));
        assert!(out.contains("\npalisade_node_kill_lateness_max_seconds 0.005\n"));
        assert!(out.contains("\npalisade_node_container_start_p50_seconds 0.03\n"));
        assert!(out.ends_with("# EOF\n"), "{out}");
    }

    #[test]
    fn known_observations_parse_back_to_their_counts_sums_and_buckets() {
        let m = Metrics::default();
        m.workers.store(3, Ordering::Relaxed);
        for ms in [30, 120, 2500] {
            m.observe_start(Duration::from_millis(ms));
        }
        m.self_fences.fetch_add(1, Ordering::Relaxed);
        m.lease_renewals.fetch_add(10, Ordering::Relaxed);
        m.observe_kill_lateness(Duration::from_millis(12));
        m.observe_kill_lateness(Duration::from_millis(5));
        m.lease_age_ms.store(1234, Ordering::Relaxed);
        m.watchdog_armed(Some(crate::watchdog_device::Armed {
            timeout: Duration::from_secs(30),
            nowayout: true,
        }));
        m.peer.requests_vouch.fetch_add(4, Ordering::Relaxed);
        m.peer.requests_error.fetch_add(2, Ordering::Relaxed);
        m.peer.answers_vouch.fetch_add(3, Ordering::Relaxed);
        m.peer.excused.store(1, Ordering::Relaxed);
        let text = m.render();
        let s = samples(&text);
        let expected = [
            ("palisade_node_pod_workers", 3.0),
            ("palisade_node_container_starts_total", 3.0),
            (
                r#"palisade_node_container_start_seconds_bucket{le="0.025"}"#,
                0.0,
            ),
            (
                r#"palisade_node_container_start_seconds_bucket{le="0.05"}"#,
                1.0,
            ),
            (
                r#"palisade_node_container_start_seconds_bucket{le="0.25"}"#,
                2.0,
            ),
            (
                r#"palisade_node_container_start_seconds_bucket{le="2.5"}"#,
                3.0,
            ),
            (
                r#"palisade_node_container_start_seconds_bucket{le="+Inf"}"#,
                3.0,
            ),
            ("palisade_node_container_start_seconds_sum", 2.65),
            ("palisade_node_container_start_seconds_count", 3.0),
            ("palisade_node_container_start_p50_seconds", 0.12),
            ("palisade_node_self_fences_total", 1.0),
            ("palisade_node_self_fence_kill_failures_total", 0.0),
            ("palisade_node_lease_renewals_total", 10.0),
            ("palisade_node_lease_failures_total", 0.0),
            ("palisade_node_deadline_kills_total", 2.0),
            ("palisade_node_kill_lateness_max_seconds", 0.012),
            ("palisade_node_lease_age_seconds", 1.234),
            ("palisade_node_watchdog_timeout_seconds", 30.0),
            ("palisade_node_watchdog_nowayout", 1.0),
            ("palisade_node_watchdog_arm_failures_total", 0.0),
            (r#"palisade_node_peer_requests_total{result="vouch"}"#, 4.0),
            (
                r#"palisade_node_peer_requests_total{result="no_vouch"}"#,
                0.0,
            ),
            (r#"palisade_node_peer_requests_total{result="error"}"#, 2.0),
            (r#"palisade_node_peer_answers_total{answer="vouch"}"#, 3.0),
            (
                r#"palisade_node_peer_answers_total{answer="no_vouch"}"#,
                0.0,
            ),
            ("palisade_node_peer_rejected_total", 0.0),
            ("palisade_node_peer_excused", 1.0),
        ];
        for (series, value) in expected {
            let got = s.get(series).copied();
            assert!(
                got.is_some_and(|v| (v - value).abs() < 1e-9),
                "{series}: {got:?}, not {value}, in {text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
