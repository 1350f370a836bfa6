//! Agent metrics, rendered in the Prometheus text format on `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// The agent's counters and gauges.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Live pod workers.
    pub workers: AtomicU64,
    /// Containers started.
    pub container_starts: AtomicU64,
    /// Sum of container start latencies, microseconds.
    pub start_latency_us_sum: AtomicU64,
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
    /// Seconds since the last Lease renewal, as last computed.
    pub lease_age_ms: AtomicU64,
    /// Times the watchdog could not be armed as asked (timeout or nowayout refused).
    pub watchdog_arm_failures: AtomicU64,
    /// The armed watchdog's timeout in seconds; 0 while none is armed and petted.
    pub watchdog_timeout_seconds: AtomicU64,
    /// 1 while the armed watchdog is `nowayout`.
    pub watchdog_nowayout: AtomicU64,
    recent: Mutex<Vec<u64>>,
    /// The peer check's counters (all zero without one).
    pub peer: std::sync::Arc<crate::peer::PeerMetrics>,
}

impl Metrics {
    /// Records a container start latency.
    pub fn observe_start(&self, d: Duration) {
        self.container_starts.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.start_latency_us_sum.fetch_add(us, Ordering::Relaxed);
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

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let p50 = {
            let mut v = self.recent.lock().clone();
            v.sort_unstable();
            v.get(v.len() / 2).copied().unwrap_or(0)
        };
        let mut s = String::new();
        let mut line = |name: &str, kind: &str, help: &str, value: String| {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        };
        line(
            "palisade_node_pod_workers",
            "gauge",
            "Live pod workers.",
            g(&self.workers).to_string(),
        );
        line(
            "palisade_node_container_starts_total",
            "counter",
            "Containers started.",
            g(&self.container_starts).to_string(),
        );
        line(
            "palisade_node_container_start_seconds_sum",
            "counter",
            "Sum of container start latencies.",
            format!("{:.6}", g(&self.start_latency_us_sum) as f64 / 1e6),
        );
        line(
            "palisade_node_container_start_p50_seconds",
            "gauge",
            "Median start latency of the last 1000 starts.",
            format!("{:.6}", p50 as f64 / 1e6),
        );
        line(
            "palisade_node_self_fences_total",
            "counter",
            "Pods self-fenced.",
            g(&self.self_fences).to_string(),
        );
        line(
            "palisade_node_self_fence_kill_failures_total",
            "counter",
            "Fence-eligible containers a self-fence could not confirm dead.",
            g(&self.self_fence_kill_failures).to_string(),
        );
        line(
            "palisade_node_lease_renewals_total",
            "counter",
            "Lease renewals.",
            g(&self.lease_renewals).to_string(),
        );
        line(
            "palisade_node_lease_failures_total",
            "counter",
            "Failed Lease renewals.",
            g(&self.lease_failures).to_string(),
        );
        line(
            "palisade_node_deadline_kills_total",
            "counter",
            "SIGKILLs at a grace deadline.",
            g(&self.deadline_kills).to_string(),
        );
        line(
            "palisade_node_kill_lateness_max_seconds",
            "gauge",
            "Largest lateness of a deadline SIGKILL.",
            format!("{:.6}", g(&self.kill_lateness_us_max) as f64 / 1e6),
        );
        line(
            "palisade_node_lease_age_seconds",
            "gauge",
            "Time since the last successful Lease renewal.",
            format!("{:.3}", g(&self.lease_age_ms) as f64 / 1e3),
        );
        line(
            "palisade_node_watchdog_timeout_seconds",
            "gauge",
            "The armed watchdog's timeout as the driver holds it; 0 while none is armed and petted.",
            g(&self.watchdog_timeout_seconds).to_string(),
        );
        line(
            "palisade_node_watchdog_nowayout",
            "gauge",
            "1 while the armed watchdog refuses the magic close.",
            g(&self.watchdog_nowayout).to_string(),
        );
        line(
            "palisade_node_watchdog_arm_failures_total",
            "counter",
            "Times the watchdog could not be armed as asked.",
            g(&self.watchdog_arm_failures).to_string(),
        );
        self.peer.render(&mut s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lists_every_metric_with_type() {
        let m = Metrics::default();
        m.observe_start(Duration::from_millis(30));
        m.observe_kill_lateness(Duration::from_millis(5));
        let out = m.render();
        assert!(out.contains("palisade_node_container_starts_total 1\n"));
        assert!(out.contains("# TYPE palisade_node_deadline_kills_total counter"));
        assert!(out.contains("palisade_node_kill_lateness_max_seconds 0.005000"));
        assert!(out.contains("palisade_node_container_start_p50_seconds 0.030000"));
    }
}
