//! Per-client token buckets.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::RateLimitConfig;

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// A token bucket per client name. Uses tokio's clock so tests can pause time.
#[derive(Debug)]
pub struct RateLimiter {
    cfg: Mutex<RateLimitConfig>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    /// A limiter with `cfg` for every client.
    pub fn new(cfg: RateLimitConfig) -> Self {
        Self {
            cfg: Mutex::new(cfg),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Replaces the limits (on reload); existing buckets keep their level, capped.
    pub fn set_config(&self, cfg: RateLimitConfig) {
        *self.cfg.lock() = cfg;
    }

    /// Takes one token for `client`. `Err(secs)` says how long until one is available.
    pub fn check(&self, client: &str) -> Result<(), f64> {
        let cfg = *self.cfg.lock();
        let now = Instant::now();
        let mut buckets = self.buckets.lock();
        let b = buckets.entry(client.to_string()).or_insert(Bucket {
            tokens: f64::from(cfg.burst),
            last: now,
        });
        let elapsed = now.duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * cfg.per_second).min(f64::from(cfg.burst));
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err((1.0 - b.tokens) / cfg.per_second)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn burst_then_refill_per_client() {
        let rl = RateLimiter::new(RateLimitConfig {
            burst: 3,
            per_second: 2.0,
        });
        for _ in 0..3 {
            rl.check("a").unwrap();
        }
        let wait = rl.check("a").unwrap_err();
        assert!((wait - 0.5).abs() < 1e-9, "{wait}");
        rl.check("b").unwrap(); // other clients are unaffected
        tokio::time::advance(Duration::from_millis(500)).await;
        rl.check("a").unwrap();
        assert!(rl.check("a").is_err());
    }
}
