//! The HTTPS client: send a profile's request, then read the status back until it confirms.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use tokio::time::Instant;

use crate::error::StorageFwError;
use crate::evidence::{NodeStatus, VerifiedBlocked, VerifiedUnblocked};
use crate::profile::{NodeRef, Profile, RenderedRequest};
use crate::secret::Secret;
use crate::target::Target;

/// How to reach and authenticate to one storage firewall.
#[derive(Debug, Clone)]
pub struct StorageFwConfig {
    /// Where the admin API is.
    pub target: Target,
    /// The request profile (use [`Profile::builtin`] with `target.profile`, or a JSON profile).
    pub profile: Profile,
    /// PEM of the only CA(s) trusted for the admin API's certificate (CA pinning: the system
    /// roots are never consulted).
    pub ca_pem: Vec<u8>,
    /// Optional client certificate chain and key (PEM) for mutual TLS.
    pub client_identity: Option<(Vec<u8>, Secret)>,
    /// Optional bearer token.
    pub token: Option<Secret>,
    /// Timeout of each HTTP request.
    pub request_timeout: Duration,
    /// How long to poll the status for confirmation after a command.
    pub verify_timeout: Duration,
    /// Pause before the second status poll; later pauses double, up to ten times this.
    pub verify_interval: Duration,
}

impl StorageFwConfig {
    /// A config with the target's built-in profile and default timeouts (5 s per request,
    /// 10 s verification, 100 ms poll interval).
    pub fn new(target: Target, ca_pem: Vec<u8>) -> Result<Self, StorageFwError> {
        let profile = Profile::builtin(&target.profile)?;
        Ok(StorageFwConfig {
            target,
            profile,
            ca_pem,
            client_identity: None,
            token: None,
            request_timeout: Duration::from_secs(5),
            verify_timeout: Duration::from_secs(10),
            verify_interval: Duration::from_millis(100),
        })
    }
}

/// A storage firewall fencing agent for one target.
///
/// Fencing is `block` (returns [`VerifiedBlocked`] only when the status confirms it). The
/// storage keeps a block until an explicit `unblock` (Pacemaker's "unfencing"): nothing in this
/// crate or in the lab server lifts a block on its own, not a reboot, not a restart.
#[derive(Debug, Clone)]
pub struct StorageFirewall {
    cfg: StorageFwConfig,
    http: reqwest::Client,
    base: String,
}

fn tls_err(what: &str, reason: impl ToString) -> StorageFwError {
    StorageFwError::Tls {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

fn build_tls(cfg: &StorageFwConfig) -> Result<rustls::ClientConfig, StorageFwError> {
    let mut roots = rustls::RootCertStore::empty();
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(&cfg.ca_pem) {
        let cert = cert.map_err(|e| tls_err("CA bundle", e))?;
        roots.add(cert).map_err(|e| tls_err("CA bundle", e))?;
        n += 1;
    }
    if n == 0 {
        return Err(tls_err("CA bundle", "no certificate in PEM"));
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| tls_err("protocol versions", e))?
    .with_root_certificates(roots);
    let mut config = match &cfg.client_identity {
        None => builder.with_no_client_auth(),
        Some((chain_pem, key_pem)) => {
            let chain = CertificateDer::pem_slice_iter(chain_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| tls_err("client certificate", e))?;
            let key =
                PrivateKeyDer::from_pem_slice(key_pem.expose().as_bytes()).map_err(
                    |e| match e {
                        pem::Error::NoItemsFound => tls_err("client key", "no private key in PEM"),
                        other => tls_err("client key", other),
                    },
                )?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_err("client certificate", e))?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl StorageFirewall {
    /// Builds the agent. Fails on unusable TLS material or an invalid profile.
    pub fn new(cfg: StorageFwConfig) -> Result<Self, StorageFwError> {
        cfg.profile.validate()?;
        let tls = build_tls(&cfg)?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .https_only(true)
            .no_proxy()
            .timeout(cfg.request_timeout)
            .build()
            .map_err(|e| tls_err("HTTP client", e))?;
        let base = cfg.target.base_url();
        Ok(StorageFirewall { cfg, http, base })
    }

    /// The admin endpoint base URL.
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    async fn send(
        &self,
        action: &'static str,
        node: &NodeRef,
        req: RenderedRequest,
    ) -> Result<Value, StorageFwError> {
        let method = reqwest::Method::from_bytes(req.method.as_bytes()).map_err(|e| {
            StorageFwError::InvalidProfile {
                name: self.cfg.profile.name.clone(),
                reason: e.to_string(),
            }
        })?;
        let url = format!("{}{}", self.base, req.path);
        let mut rb = self.http.request(method, &url);
        if let Some(token) = &self.cfg.token {
            rb = rb.bearer_auth(token.expose());
        }
        if let Some(body) = &req.body {
            rb = rb.json(body);
        }
        let transport = |source| StorageFwError::Transport {
            action,
            node: node.name().to_owned(),
            endpoint: self.base.clone(),
            source,
        };
        let resp = rb.send().await.map_err(transport)?;
        let status = resp.status();
        let text = resp.text().await.map_err(transport)?;
        if !status.is_success() {
            let mut body = text;
            body.truncate(512);
            return Err(StorageFwError::Http {
                action,
                node: node.name().to_owned(),
                status: status.as_u16(),
                body,
            });
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).or(Ok(Value::String(text)))
    }

    /// Reads the node's status.
    pub async fn status(&self, node: &NodeRef) -> Result<NodeStatus, StorageFwError> {
        let req = self.cfg.profile.status.render(node);
        let raw = self.send("status", node, req).await?;
        let blocked = self.cfg.profile.is_blocked(node.name(), &raw)?;
        Ok(NodeStatus {
            node: node.name().to_owned(),
            blocked,
            raw,
        })
    }

    /// Polls the status until `blocked == want`, bounded by the verify timeout.
    async fn verify(
        &self,
        action: &'static str,
        node: &NodeRef,
        want: bool,
    ) -> Result<NodeStatus, StorageFwError> {
        use backon::BackoffBuilder as _;
        let started = Instant::now();
        let deadline = started + self.cfg.verify_timeout;
        let base = self.cfg.verify_interval;
        let mut pauses = backon::ExponentialBuilder::new()
            .with_min_delay(base)
            .with_max_delay(base * 10)
            .without_max_times()
            .build();
        loop {
            let status = self.status(node).await?;
            if status.blocked == want {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(StorageFwError::NotVerified {
                    action,
                    node: node.name().to_owned(),
                    waited_ms: started.elapsed().as_millis() as u64,
                });
            }
            let pause = pauses.next().unwrap_or(base * 10);
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }

    /// Fences the node at the storage: sends the block command, then reads the status back.
    ///
    /// Guarantees: `Ok` only when a status read *after* the command reported the node blocked.
    /// Idempotent: blocking an already blocked node succeeds.
    pub async fn block(&self, node: &NodeRef) -> Result<VerifiedBlocked, StorageFwError> {
        let span =
            tracing::info_span!("storagefw_block", node = node.name(), endpoint = %self.base);
        let _e = span.enter();
        let req = self.cfg.profile.block.render(node);
        self.send("block", node, req).await?;
        let status = self.verify("block", node, true).await?;
        tracing::info!(node = node.name(), "storage fence verified: node blocked");
        Ok(VerifiedBlocked {
            node: node.name().to_owned(),
            addresses: node.addresses().to_vec(),
            endpoint: self.base.clone(),
            profile: self.cfg.profile.name.clone(),
            verified_at: SystemTime::now(),
            status: status.raw,
            hold: node.hold().map(str::to_owned),
        })
    }

    /// Unfences a node fenced earlier, consuming the fence evidence: the explicit step
    /// required before the node may write again (see [`crate::WriteAccess`]).
    pub async fn unfence(
        &self,
        fenced: VerifiedBlocked,
    ) -> Result<VerifiedUnblocked, StorageFwError> {
        let mut node = NodeRef::new(&fenced.node, fenced.addresses.clone())?;
        if let Some(hold) = &fenced.hold {
            node = node.with_hold(hold)?;
        }
        self.unblock(&node).await
    }

    /// Unfences the node: the explicit step required before the node may write again. Sends
    /// the unblock command, then reads the status back until it no longer reports "blocked".
    ///
    /// With a hold ([`NodeRef::with_hold`]) and a profile that sends it, the firewall lifts
    /// only that hold: if another fence still holds the node, the read-back reports it blocked
    /// and this fails (the node stays fenced).
    pub async fn unblock(&self, node: &NodeRef) -> Result<VerifiedUnblocked, StorageFwError> {
        let req = self.cfg.profile.unblock.render(node);
        self.send("unblock", node, req).await?;
        self.verify("unblock", node, false).await?;
        tracing::info!(
            node = node.name(),
            "storage unfence verified: node unblocked"
        );
        Ok(VerifiedUnblocked {
            node: node.name().to_owned(),
            endpoint: self.base.clone(),
            verified_at: SystemTime::now(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_without_a_ca_is_refused() {
        let target = Target::parse("storagefw+https://127.0.0.1:1/").unwrap();
        let cfg = StorageFwConfig::new(target, b"not a pem".to_vec()).unwrap();
        let err = StorageFirewall::new(cfg).unwrap_err();
        assert!(matches!(err, StorageFwError::Tls { .. }), "{err}");
        assert!(!err.is_retryable());
    }

    #[test]
    fn unknown_builtin_profile_is_refused() {
        let target = Target::parse("storagefw+https://127.0.0.1:1/?profile=acme").unwrap();
        assert!(StorageFwConfig::new(target, vec![]).is_err());
    }
}
