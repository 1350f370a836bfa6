//! The shared state of a running bridge and its reload path.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::ServerConfig;

use crate::audit::{AuditError, AuditLog};
use crate::config::{ConfigError, FileConfig, Inventory};
use crate::executor::Executor;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::ratelimit::RateLimiter;
use crate::store::{Store, StoreError};
use crate::tls::{server_config, TlsError};

/// Errors building or reloading a bridge.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The config file is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// TLS material is invalid.
    #[error("TLS setup failed")]
    Tls(#[from] TlsError),
    /// The state store could not be opened.
    #[error("state store")]
    Store(#[from] StoreError),
    /// The audit log could not be opened.
    #[error("audit log")]
    Audit(#[from] AuditError),
    /// Reload was asked for a bridge built without a config path.
    #[error("this bridge has no config file to reload")]
    NoConfigPath,
}

/// Everything a running bridge shares between connections.
pub struct Bridge {
    pub(crate) config_path: Option<PathBuf>,
    pub(crate) tls: RwLock<Arc<ServerConfig>>,
    pub(crate) policy: RwLock<Arc<Policy>>,
    pub(crate) inventory: Arc<Inventory>,
    pub(crate) executor: Arc<dyn Executor>,
    pub(crate) store: Arc<Store>,
    pub(crate) audit: Arc<AuditLog>,
    pub(crate) limiter: RateLimiter,
    pub(crate) metrics: Metrics,
    pub(crate) locks: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
    pub(crate) op_timeout: Duration,
    pub(crate) max_body: usize,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge")
            .field("config_path", &self.config_path)
            .field(
                "targets",
                &self.inventory.targets.keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Bridge {
    /// Builds a bridge: TLS config, policy, persisted store and audit log.
    ///
    /// `inventory` must have been loaded from `cfg` (credentials resolved); `executor` drives
    /// its devices. `config_path` enables [`Bridge::reload`].
    pub fn new(
        cfg: &FileConfig,
        inventory: Inventory,
        executor: Arc<dyn Executor>,
        config_path: Option<PathBuf>,
    ) -> Result<Arc<Self>, BridgeError> {
        let tls = server_config(&cfg.tls)?;
        let store = Store::open(
            &cfg.state_dir,
            Duration::from_secs(cfg.idempotency_retention_secs),
        )?;
        let audit = AuditLog::open(&cfg.audit_path())?;
        let locks = inventory
            .targets
            .keys()
            .map(|k| (k.clone(), Arc::new(tokio::sync::Mutex::new(()))))
            .collect();
        Ok(Arc::new(Self {
            config_path,
            tls: RwLock::new(tls),
            policy: RwLock::new(Arc::new(Policy::new(cfg.policy.clone()))),
            inventory: Arc::new(inventory),
            executor,
            store: Arc::new(store),
            audit: Arc::new(audit),
            limiter: RateLimiter::new(cfg.rate_limit),
            metrics: Metrics::default(),
            locks,
            op_timeout: Duration::from_secs(cfg.operation_timeout_secs),
            max_body: cfg.max_body_bytes,
        }))
    }

    /// Re-reads the config file and swaps in new TLS material, policy and rate limits.
    ///
    /// # Guarantees
    /// Either everything is swapped or nothing is (a bad file leaves the running config in
    /// place). Established connections keep the TLS session they have; new connections use
    /// the new certificates; every request after the swap is authorized by the new policy.
    /// Inventory changes (targets, devices, credentials) need a restart and are reported.
    pub fn reload(&self) -> Result<(), BridgeError> {
        let path = self.config_path.as_ref().ok_or(BridgeError::NoConfigPath)?;
        let result = (|| {
            let cfg = FileConfig::load(path)?;
            let tls = server_config(&cfg.tls)?;
            let new_ids: Vec<&String> = cfg.targets.iter().map(|t| &t.id).collect();
            let old_ids: Vec<&String> = self.inventory.targets.keys().collect();
            let mut sorted = new_ids.clone();
            sorted.sort();
            if sorted != old_ids {
                tracing::warn!("inventory targets changed in the config file; restart to apply");
            }
            *self.tls.write() = tls;
            *self.policy.write() = Arc::new(Policy::new(cfg.policy.clone()));
            self.limiter.set_config(cfg.rate_limit);
            Ok::<_, BridgeError>(())
        })();
        let label = if result.is_ok() { "ok" } else { "error" };
        self.metrics
            .inc("palisade_bridge_reloads_total", &[("result", label)]);
        result
    }

    /// The current TLS server configuration.
    pub fn tls_config(&self) -> Arc<ServerConfig> {
        self.tls.read().clone()
    }

    /// The current policy.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().clone()
    }

    /// The persisted token floor of a target.
    pub fn token_floor(&self, target: &str) -> u64 {
        self.store.floor(target)
    }
}
