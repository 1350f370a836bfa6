//! The HTTPS admin API: the storage firewall (block, unblock, status) and volume access
//! (create, grant, revoke). Authenticated by bearer token or by a verified client certificate.
//!
//! Routes (JSON in and out; errors are `{"error": "..."}` with a 4xx/5xx status):
//! - `GET /healthz` (no authentication);
//! - `GET /v1/status`: everything blocked, every grant, volumes and connection count;
//! - `GET /v1/nodes/{node}`: `{"node", "blocked", "blocked_addresses", "holds",
//!   "granted_volumes", "granted_addresses"}`;
//! - `POST /v1/nodes/{node}/block` with `{"addresses": [..], "hold": ".."}` (both optional; the
//!   node's granted addresses are always included; `hold` names the fence's own hold). Cuts
//!   the node's open data connections;
//! - `POST /v1/nodes/{node}/unblock` with `{"hold": ".."}`: the explicit unfence, of that hold
//!   only (the node stays blocked while another fence holds it); without a hold (or with an
//!   empty one), every hold: the operator's node-wide unblock;
//! - `GET /v1/volumes`, `PUT /v1/volumes/{volume}`, `GET /v1/volumes/{volume}`;
//! - `PUT /v1/volumes/{volume}/grants/{node}` with `{"addresses": [..]}`;
//! - `DELETE /v1/volumes/{volume}/grants/{node}`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use hyper_util::rt::TokioIo;
use palisade_storagefw::Secret;
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::volume::validate_name;

/// Largest admin request body.
pub const MAX_BODY: usize = 64 << 10;

#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    token: Option<Secret>,
}

/// Whether this TLS connection presented a client certificate that the verifier accepted.
#[derive(Clone, Copy)]
struct PeerCert(bool);

fn err(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn auth(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let cert_ok = req.extensions().get::<PeerCert>().is_some_and(|p| p.0);
    let token_ok = match (&app.token, req.headers().get(header::AUTHORIZATION)) {
        (Some(token), Some(h)) => h
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| ct_eq(t.trim().as_bytes(), token.expose().as_bytes())),
        _ => false,
    };
    if cert_ok || token_ok {
        next.run(req).await
    } else {
        tracing::warn!(path = %req.uri().path(), "admin request refused: not authenticated");
        err(
            StatusCode::UNAUTHORIZED,
            "authentication required: bearer token or client certificate",
        )
    }
}

/// A small error carried through validation helpers and rendered as a JSON error.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        err(self.0, self.1)
    }
}

fn valid_node(node: &str) -> Result<(), ApiError> {
    palisade_storagefw::NodeRef::new(node, vec![])
        .map(|_| ())
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))
}

fn valid_volume(volume: &str) -> Result<(), ApiError> {
    validate_name(volume).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AddressesBody {
    #[serde(default)]
    addresses: Vec<IpAddr>,
    /// The fence's own hold (block and unblock); empty: unnamed.
    #[serde(default)]
    hold: String,
}

/// Parses a block, unblock or grant body (an empty body is an empty one): the canonical
/// addresses and the hold, checked as `palisade_storagefw` checks it.
fn parse_body(body: &Bytes, node: &str) -> Result<(Vec<IpAddr>, String), ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((vec![], String::new()));
    }
    let b = serde_json::from_slice::<AddressesBody>(body)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))?;
    if !b.hold.is_empty() {
        palisade_storagefw::NodeRef::new(node, vec![])
            .and_then(|n| n.with_hold(&b.hold))
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    }
    let addresses = b.addresses.into_iter().map(|a| a.to_canonical()).collect();
    Ok((addresses, b.hold))
}

/// A grant's body: addresses only.
fn parse_addresses(body: &Bytes, node: &str) -> Result<Vec<IpAddr>, ApiError> {
    match parse_body(body, node)? {
        (addresses, hold) if hold.is_empty() => Ok(addresses),
        _ => Err(ApiError(
            StatusCode::BAD_REQUEST,
            "a grant takes no \"hold\"".into(),
        )),
    }
}

fn persist_failed(e: crate::error::StateError) -> Response {
    tracing::error!(error = %e, "persisting firewall state failed");
    err(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("state not persisted: {e}"),
    )
}

fn node_view(state: &crate::state::AccessState, node: &str) -> serde_json::Value {
    let blocked = state.blocked.get(node);
    let granted: Vec<&String> = state
        .grants
        .iter()
        .filter(|(_, nodes)| nodes.contains_key(node))
        .map(|(v, _)| v)
        .collect();
    json!({
        "node": node,
        "blocked": blocked.is_some(),
        "blocked_addresses": blocked.cloned().unwrap_or_default(),
        "holds": state.holds_of(node),
        "granted_volumes": granted,
        "granted_addresses": state.granted_addresses(node),
    })
}

async fn status(State(app): State<AppState>) -> Response {
    let state = app.shared.access.read().await.clone();
    let volumes: Vec<_> = app
        .shared
        .volumes
        .list()
        .into_iter()
        .map(|(name, records)| json!({"name": name, "records": records}))
        .collect();
    Json(json!({
        "blocked": state.blocked,
        "grants": state.grants,
        "volumes": volumes,
        "connections": app.shared.connection_count(),
    }))
    .into_response()
}

async fn node_status(State(app): State<AppState>, Path(node): Path<String>) -> Response {
    if let Err(r) = valid_node(&node) {
        return r.into_response();
    }
    let state = app.shared.access.read().await;
    Json(node_view(&state, &node)).into_response()
}

async fn block(State(app): State<AppState>, Path(node): Path<String>, body: Bytes) -> Response {
    if let Err(r) = valid_node(&node) {
        return r.into_response();
    }
    let (addrs, hold) = match parse_body(&body, &node) {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    // The write lock waits for in-flight appends, so after this returns no append from the
    // node can be acknowledged.
    let mut state = app.shared.access.write().await;
    let mut next = state.clone();
    if next.block_for(&node, &addrs, &hold).is_none() {
        return err(
            StatusCode::BAD_REQUEST,
            format!("no address known for node {node}: pass \"addresses\""),
        );
    }
    if let Err(e) = app.shared.state_file.save(&next) {
        return persist_failed(e);
    }
    *state = next;
    let cut = app.shared.cut_fenced(&state);
    tracing::info!(node, cut, hold, "node blocked at the storage firewall");
    Json(node_view(&state, &node)).into_response()
}

async fn unblock(State(app): State<AppState>, Path(node): Path<String>, body: Bytes) -> Response {
    if let Err(r) = valid_node(&node) {
        return r.into_response();
    }
    let hold = match parse_body(&body, &node) {
        Ok((_, hold)) => hold,
        Err(r) => return r.into_response(),
    };
    let mut state = app.shared.access.write().await;
    let mut next = state.clone();
    let changed = if hold.is_empty() {
        next.unblock(&node)
    } else {
        next.release_hold(&node, &hold)
    };
    if changed {
        if let Err(e) = app.shared.state_file.save(&next) {
            return persist_failed(e);
        }
        *state = next;
        let left = state.holds_of(&node);
        tracing::info!(node, hold, ?left, "hold lifted at the storage firewall");
    }
    Json(node_view(&state, &node)).into_response()
}

async fn list_volumes(State(app): State<AppState>) -> Response {
    let v: Vec<_> = app
        .shared
        .volumes
        .list()
        .into_iter()
        .map(|(name, records)| json!({"name": name, "records": records}))
        .collect();
    Json(json!({ "volumes": v })).into_response()
}

async fn create_volume(State(app): State<AppState>, Path(volume): Path<String>) -> Response {
    if let Err(r) = valid_volume(&volume) {
        return r.into_response();
    }
    let shared = app.shared.clone();
    let v = volume.clone();
    match tokio::task::spawn_blocking(move || shared.volumes.create(&v)).await {
        Ok(Ok(())) => Json(json!({"name": volume})).into_response(),
        Ok(Err(e)) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn get_volume(State(app): State<AppState>, Path(volume): Path<String>) -> Response {
    if let Err(r) = valid_volume(&volume) {
        return r.into_response();
    }
    let Ok(v) = app.shared.volumes.get(&volume) else {
        return err(StatusCode::NOT_FOUND, format!("unknown volume {volume:?}"));
    };
    let records = v.lock().len();
    let state = app.shared.access.read().await;
    Json(json!({
        "name": volume,
        "records": records,
        "grants": state.grants.get(&volume).cloned().unwrap_or_default(),
    }))
    .into_response()
}

async fn grant(
    State(app): State<AppState>,
    Path((volume, node)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    if let Err(r) = valid_volume(&volume).and_then(|_| valid_node(&node)) {
        return r.into_response();
    }
    let addrs = match parse_addresses(&body, &node) {
        Ok(a) if !a.is_empty() => a,
        Ok(_) => return err(StatusCode::BAD_REQUEST, "\"addresses\" must not be empty"),
        Err(r) => return r.into_response(),
    };
    if app.shared.volumes.get(&volume).is_err() {
        return err(StatusCode::NOT_FOUND, format!("unknown volume {volume:?}"));
    }
    let mut state = app.shared.access.write().await;
    let mut next = state.clone();
    next.grant(&volume, &node, &addrs);
    if let Err(e) = app.shared.state_file.save(&next) {
        return persist_failed(e);
    }
    *state = next;
    tracing::info!(volume, node, "write access granted");
    Json(node_view(&state, &node)).into_response()
}

async fn revoke(
    State(app): State<AppState>,
    Path((volume, node)): Path<(String, String)>,
) -> Response {
    if let Err(r) = valid_volume(&volume).and_then(|_| valid_node(&node)) {
        return r.into_response();
    }
    if app.shared.volumes.get(&volume).is_err() {
        return err(StatusCode::NOT_FOUND, format!("unknown volume {volume:?}"));
    }
    let mut state = app.shared.access.write().await;
    let mut next = state.clone();
    if next.revoke(&volume, &node) {
        if let Err(e) = app.shared.state_file.save(&next) {
            return persist_failed(e);
        }
        *state = next;
        tracing::info!(volume, node, "write access revoked");
    }
    Json(node_view(&state, &node)).into_response()
}

async fn not_found() -> Response {
    err(StatusCode::NOT_FOUND, "no such route")
}

fn router(shared: Arc<Shared>, token: Option<Secret>) -> Router {
    let app = AppState { shared, token };
    let api = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/nodes/{node}", get(node_status))
        .route("/v1/nodes/{node}/block", post(block))
        .route("/v1/nodes/{node}/unblock", post(unblock))
        .route("/v1/volumes", get(list_volumes))
        .route("/v1/volumes/{volume}", put(create_volume).get(get_volume))
        .route(
            "/v1/volumes/{volume}/grants/{node}",
            put(grant).delete(revoke),
        )
        .route_layer(axum::middleware::from_fn_with_state(app.clone(), auth));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .merge(api)
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(app)
}

/// Serves the admin API over TLS until `shutdown`.
pub async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    token: Option<Secret>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let app = router(shared, token);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let stream =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::info!(%peer, error = %e, "admin TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
            let verified = stream
                .get_ref()
                .1
                .peer_certificates()
                .is_some_and(|c| !c.is_empty());
            let svc = hyper_util::service::TowerToHyperService::new(
                app.layer(Extension(PeerCert(verified))),
            );
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
}
