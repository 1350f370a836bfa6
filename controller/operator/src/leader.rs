//! Leader election on a `coordination.k8s.io/v1` Lease, with a fencing token.
//!
//! The token is a monotonic counter kept in the Lease annotation [`TOKEN_ANNOTATION`]. Every
//! acquisition (a new holder, or this replica starting again) increments it with a
//! compare-and-swap on the Lease's `resourceVersion`, so two terms never share a token and a
//! later term always has a higher one. The `NodeFence` state machine records the token and
//! refuses to act with a lower one.
//!
//! Another holder's Lease is judged expired on *our* monotonic clock: from the moment we last
//! saw its record change, never by comparing its `renewTime` with our wall clock.
//!
//! Guarantees: [`Leadership::token`] returns a token only while our last successful renewal
//! (measured from *before* the request was sent) is younger than the lease duration;
//! [`Leadership::check`] additionally re-reads the Lease and requires it to name us with that
//! token. Device actions call `check` first, so a deposed leader that wakes up acts on nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::Error;

/// Lease annotation holding the fencing token of the current term.
pub const TOKEN_ANNOTATION: &str = "palisade.dev/fencing-token";

#[derive(Debug, Clone, Copy, Default)]
struct State {
    token: Option<i64>,
    valid_until: Option<Instant>,
}

/// This replica's view of its leadership, shared with every loop.
#[derive(Clone)]
pub struct Leadership {
    state: Arc<watch::Sender<State>>,
    /// The highest token known to have been used anywhere (NodeFence statuses, a bridge's
    /// refusal): every new term starts above it, so tokens only go up even when the leader
    /// Lease was deleted (namespace removed, reinstall).
    floor: Arc<std::sync::atomic::AtomicI64>,
    /// Until when this replica does not take the Lease (it handed leadership over).
    yield_until: Arc<parking_lot::Mutex<Option<Instant>>>,
    /// When an election round last reached the API server.
    api_ok_at: Arc<parking_lot::Mutex<Option<Instant>>>,
    client: Client,
    namespace: String,
    name: String,
    identity: String,
}

impl Leadership {
    /// A replica that is not (yet) the leader.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            state: Arc::new(watch::channel(State::default()).0),
            floor: Arc::new(std::sync::atomic::AtomicI64::new(0)),
            yield_until: Arc::new(parking_lot::Mutex::new(None)),
            api_ok_at: Arc::new(parking_lot::Mutex::new(None)),
            client,
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
        }
    }

    /// Whether an election round reached the API server within `within` (what `/readyz`
    /// reports: a replica that cannot reach the API server can neither lead nor take over).
    pub fn api_reachable_within(&self, within: Duration) -> bool {
        self.api_ok_at
            .lock()
            .is_some_and(|at| at.elapsed() <= within)
    }

    /// Our fencing token while we are the (unexpired) leader.
    pub fn token(&self) -> Option<i64> {
        let s = *self.state.borrow();
        match (s.token, s.valid_until) {
            (Some(t), Some(until)) if Instant::now() < until => Some(t),
            _ => None,
        }
    }

    /// Before a device or API action: we must be the unexpired leader with `token`, and the
    /// Lease in the API must still name us with that token.
    pub async fn check(&self, token: i64) -> Result<(), Error> {
        if self.token() != Some(token) {
            return Err(Error::NotLeader {
                token: self.token(),
            });
        }
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let lease = api
            .get(&self.name)
            .await
            .map_err(|e| Error::kube(format!("reading leader lease {}", self.name), e))?;
        let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
        if holder.as_deref() != Some(self.identity.as_str()) || token_of(&lease) != token {
            self.step_down();
            return Err(Error::NotLeader { token: Some(token) });
        }
        Ok(())
    }

    /// Waits until we lead; returns the token.
    pub async fn wait_leading(&self) -> i64 {
        let mut rx = self.state.subscribe();
        loop {
            if let Some(t) = self.token() {
                return t;
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), rx.changed()).await;
        }
    }

    fn step_down(&self) {
        self.state.send_replace(State::default());
    }

    /// Gives up the current term now (a device refused our token as stale); the next round
    /// re-elects this replica, if the Lease allows, with a higher token.
    pub fn resign(&self) {
        if self.state.borrow().token.is_some() {
            tracing::warn!(identity = %self.identity, "resigning the current term");
        }
        self.step_down();
    }

    /// Records that `token` was used somewhere. If our term's token is below it, we step down
    /// at once; the next election round takes a token above it.
    ///
    /// Guarantees: after `raise_floor(t)`, no term of this replica acts with a token below
    /// `t`, and every term it starts from then on has a token above `t`.
    pub fn raise_floor(&self, token: i64) {
        let before = self
            .floor
            .fetch_max(token, std::sync::atomic::Ordering::SeqCst);
        if token > before {
            tracing::info!(floor = token, "fencing token floor raised");
        }
        if self.state.borrow().token.is_some_and(|t| t < token) {
            tracing::warn!(
                floor = token,
                "our fencing token is not above one already used: stepping down to re-elect with a higher one"
            );
            self.step_down();
        }
    }

    /// Hands leadership over: steps down at once, releases the Lease (empty holder, the token
    /// annotation kept so the next term's token is higher), and does not take the Lease again
    /// for `pause`, so a replica on another node becomes the leader.
    ///
    /// Guarantees: when this returns, this replica acts on nothing under `token` (it stepped
    /// down before the release was sent); the Lease is released only if it still named us with
    /// `token` (compare-and-swap on its `resourceVersion`).
    /// Assumptions: another replica runs elsewhere; if none does, this replica takes the Lease
    /// again after `pause` (with a higher token) and the caller hands over again.
    pub async fn hand_over(&self, token: i64, pause: Duration) -> Result<(), Error> {
        *self.yield_until.lock() = Some(Instant::now() + pause);
        self.step_down();
        tracing::warn!(identity = %self.identity, token, "handing leadership over");
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let Some(mut lease) = api
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::kube(format!("reading leader lease {}", self.name), e))?
        else {
            return Ok(());
        };
        let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
        if holder.as_deref() != Some(self.identity.as_str()) || token_of(&lease) != token {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = None;
            spec.acquire_time = None;
        }
        match api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(Error::kube("releasing leader lease", e)),
        }
    }

    /// Whether this replica is still leaving the Lease to others after [`Self::hand_over`].
    fn yielding(&self) -> bool {
        self.yield_until
            .lock()
            .is_some_and(|until| Instant::now() < until)
    }

    fn next_token(&self, after: i64) -> i64 {
        after
            .max(self.floor.load(std::sync::atomic::Ordering::SeqCst))
            .saturating_add(1)
    }

    /// Runs the election forever: acquire, renew every `renew_interval`, step down when a
    /// renewal fails for longer than `lease_duration`. Every round that reaches the API server
    /// is a contact for `sight` (a gap between them is a blind spell).
    pub async fn run(
        self,
        lease_duration: Duration,
        renew_interval: Duration,
        sight: Arc<crate::sight::Sight>,
    ) {
        let mut observed: Option<(String, Instant)> = None;
        loop {
            let started = Instant::now();
            let result = self.round(lease_duration, &mut observed).await;
            if result.is_ok() {
                *self.api_ok_at.lock() = Some(started);
                sight.contact(std::time::Instant::now());
            }
            match result {
                Ok(Some(token)) => {
                    let was = self.state.borrow().token;
                    if was != Some(token) {
                        tracing::info!(identity = %self.identity, token, "became leader");
                    }
                    self.state.send_replace(State {
                        token: Some(token),
                        valid_until: Some(started + lease_duration),
                    });
                }
                Ok(None) => {
                    if self.state.borrow().token.is_some() {
                        tracing::warn!(identity = %self.identity, "lost leadership");
                    }
                    self.step_down();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader election round failed");
                    // Keep the term only while the last renewal is still valid (see `token`).
                }
            }
            tokio::time::sleep(renew_interval).await;
        }
    }

    async fn round(
        &self,
        lease_duration: Duration,
        observed: &mut Option<(String, Instant)>,
    ) -> Result<Option<i64>, Error> {
        if self.yielding() {
            return Ok(None);
        }
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let now = MicroTime(Timestamp::now());
        let secs = i32::try_from(lease_duration.as_secs())
            .unwrap_or(i32::MAX)
            .max(1);
        let Some(mut lease) = api
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::kube(format!("reading leader lease {}", self.name), e))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    annotations: Some(BTreeMap::from([(
                        TOKEN_ANNOTATION.to_string(),
                        self.next_token(0).to_string(),
                    )])),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            let first = token_of(&lease);
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Some(first)),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
                Err(e) => Err(Error::kube("creating leader lease", e)),
            };
        };
        let token = token_of(&lease);
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = self.state.borrow().token;
        let mut spec_new = spec.clone();
        let new_token;
        if holder == self.identity && ours == Some(token) {
            // Renew our own term.
            spec_new.renew_time = Some(now);
            spec_new.lease_duration_seconds = Some(secs);
            new_token = token;
        } else {
            // Someone else's (or a previous incarnation's) term: take it over only once it has
            // expired on our clock, or at once if it is our own identity or nobody's.
            let record = format!(
                "{holder}|{:?}|{token}",
                spec.renew_time.as_ref().map(|t| t.0)
            );
            let since = match observed {
                Some((r, at)) if *r == record => *at,
                _ => {
                    let at = Instant::now();
                    *observed = Some((record, at));
                    at
                }
            };
            let their = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(secs)).unwrap_or(0),
            );
            let expired = since.elapsed() > their;
            if !(holder.is_empty() || holder == self.identity || expired) {
                return Ok(None);
            }
            new_token = self.next_token(token);
            spec_new.holder_identity = Some(self.identity.clone());
            spec_new.acquire_time = Some(now.clone());
            spec_new.renew_time = Some(now);
            spec_new.lease_duration_seconds = Some(secs);
            spec_new.lease_transitions =
                Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            lease
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(TOKEN_ANNOTATION.to_string(), new_token.to_string());
        }
        lease.spec = Some(spec_new);
        // `replace` carries the resourceVersion we read: a compare-and-swap.
        match api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Some(new_token)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => Err(Error::kube("updating leader lease", e)),
        }
    }
}

/// The fencing token recorded in a leader Lease (0 when absent or malformed).
pub fn token_of(lease: &Lease) -> i64 {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TOKEN_ANNOTATION))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
