//! The versioned HTTP API (`/v1`), `/healthz` and `/metrics`.
//!
//! Every request arrives with the verified [`ClientIdentity`] of its TLS connection in its
//! extensions (inserted by [`crate::server`]). Mutating requests go through `mutate`:
//! authorize → validate headers and body → take the target's mutex → idempotency lookup →
//! durably raise the token floor → act and verify → durably record the response → audit.
//!
//! A storage request's body may name the fence's hold (`{"hold": "palisade-<uid>"}`,
//! [`ActionBody`]): the block adds it, the unblock lifts only it. A malformed hold, or a hold
//! on a power action, is refused with 400 `invalid_hold` before anything else happens (no key
//! recorded, no floor raised, nothing sent). A held unblock that leaves the target blocked
//! (another hold remains) answers 409 [`STORAGE_STILL_HELD`] with the evidence, and is audited
//! as `still_held`. Without a hold, storage actions are node-wide, and the audit says "no hold".

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::Instrument as _;

use crate::audit::AuditRecord;
use crate::bridge::Bridge;
use crate::config::Target;
use crate::executor::{ExecError, Outcome, PowerAction, StorageAction, StorageHold};
use crate::policy::{ClientIdentity, Decision};
use crate::store::{Begin, IdemEntry, StoredResponse};

/// Header carrying the idempotency key of a mutating request.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Header carrying the fencing token (u64) of a mutating request.
pub const FENCING_TOKEN: &str = "fencing-token";
/// The optional JSON body of a mutating request, shared with the client.
pub use palisade_fence::bridge::wire::ActionBody;
/// Response header set when a response is replayed from the idempotency cache.
pub use palisade_fence::bridge::REPLAYED;
/// The `error` code (HTTP 409) of a held unblock that left the target blocked.
pub use palisade_fence::bridge::STORAGE_STILL_HELD;

/// The `error` code (HTTP 400) of a malformed hold, or of a hold on a power action.
pub const INVALID_HOLD: &str = "invalid_hold";

/// The `error` code of a refused stale fencing token (HTTP 409).
pub const STALE_FENCING_TOKEN: &str = "stale_fencing_token";

/// The body of a `409 stale_fencing_token` refusal:
/// `{"error": "stale_fencing_token", "message": ..., "token": N, "seen_token": F}`.
///
/// Guarantees: `seen_token` is the target's durable token floor when the request was refused,
/// a JSON integer, never only words in `message` (the message is for people and may change);
/// `token` is the refused request's token, and `token < seen_token`.
///
/// Assumptions: a client reads the floor from `seen_token` alone; a refusal without it (a bridge
/// older than this field) says nothing about the floor, and the client treats it as "refused,
/// floor unknown" (the controller steps down without raising its floor), never as a number
/// found in the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleTokenRefusal {
    /// Always [`STALE_FENCING_TOKEN`].
    pub error: String,
    /// Why, for people.
    pub message: String,
    /// The refused request's fencing token.
    pub token: u64,
    /// The highest token the target has seen (its floor).
    pub seen_token: u64,
}

impl StaleTokenRefusal {
    /// The refusal of `token` on `target`, whose floor is `floor`.
    pub fn new(target: &str, token: u64, floor: u64) -> Self {
        Self {
            error: STALE_FENCING_TOKEN.into(),
            message: format!("stale fencing token {token}: target {target} has already seen token {floor} from a newer controller; refusing to act"),
            token,
            seen_token: floor,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| json!({ "error": STALE_FENCING_TOKEN }))
    }
}

/// The authenticated client of a request.
pub type Client = Extension<Arc<ClientIdentity>>;

/// Builds the router for `bridge`.
pub fn router(bridge: Arc<Bridge>) -> Router {
    let v1 = Router::new()
        .route("/targets/{id}/power", get(power_status))
        .route("/targets/{id}/power/{action}", post(power_action))
        .route("/targets/{id}/storage", get(storage_status))
        .route("/targets/{id}/storage/{action}", post(storage_action))
        .route("/targets/{id}/monitor", get(monitor))
        .route("/audit", get(read_audit));
    Router::new()
        .nest("/v1", v1)
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state(bridge.clone(), admit))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(bridge.max_body))
        .with_state(bridge)
}

/// A JSON error response.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({ "error": code, "message": message.into() })),
    )
        .into_response()
}

async fn not_found(req: Request) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no such endpoint {} {}: this bridge serves API version v1 under /v1/",
            req.method(),
            req.uri().path()
        ),
    )
}

/// Middleware: require an identity, apply the per-client rate limit, count requests.
async fn admit(State(b): State<Arc<Bridge>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let Some(id) = req.extensions().get::<Arc<ClientIdentity>>().cloned() else {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "no client certificate",
        );
    };
    let resp = if route == "/healthz" {
        next.run(req).await
    } else if let Err(wait) = b.limiter.check(&id.name()) {
        b.metrics.inc(
            "palisade_bridge_rate_limited_total",
            &[("client", &id.name())],
        );
        tracing::warn!(client = %id.name(), route, "rate limited");
        let mut r = error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "client {} exceeded its rate limit; retry in {wait:.2}s",
                id.name()
            ),
        );
        if let Ok(v) = HeaderValue::from_str(&format!("{}", wait.ceil().max(1.0) as u64)) {
            r.headers_mut().insert("retry-after", v);
        }
        r
    } else {
        next.run(req).await
    };
    b.metrics.inc(
        "palisade_bridge_requests_total",
        &[("route", &route), ("status", resp.status().as_str())],
    );
    resp
}

async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

async fn metrics(State(b): State<Arc<Bridge>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        )],
        b.metrics.render(),
    )
        .into_response()
}

/// Resolves and authorizes a target, or produces the error response.
fn authorize<'a>(
    b: &'a Bridge,
    id: &ClientIdentity,
    target: &str,
) -> Result<&'a Target, (StatusCode, &'static str, String)> {
    let Some(t) = b.inventory.targets.get(target) else {
        return Err((
            StatusCode::NOT_FOUND,
            "unknown_target",
            format!("no target {target:?}"),
        ));
    };
    match b.policy().decide(id, target) {
        Decision::Allow => Ok(t),
        Decision::UnknownClient => Err((
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("client {} is not in the bridge policy", id.name()),
        )),
        Decision::TargetNotAllowed => Err((
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "client {} is not allowed to act on target {target}",
                id.name()
            ),
        )),
    }
}

fn outcome_body<S: Serialize>(target: &str, action: &str, o: &Outcome<S>) -> Value {
    json!({
        "target": target,
        "action": action,
        "result": "ok",
        "state": o.state,
        "verified": o.verified,
        "evidence": o.evidence,
    })
}

fn exec_error(target: &str, action: &str, e: &ExecError) -> (StatusCode, Value) {
    let (status, code) = match e {
        ExecError::NoDevice { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "no_device"),
        ExecError::Failed { .. } => (StatusCode::BAD_GATEWAY, "device_failed"),
        ExecError::StillHeld { .. } => (StatusCode::CONFLICT, STORAGE_STILL_HELD),
        ExecError::Timeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
    };
    let body = json!({
        "target": target,
        "action": action,
        "result": "error",
        "error": code,
        "message": e.to_string(),
        "evidence": e.evidence(),
    });
    (status, body)
}

async fn with_timeout<T>(
    b: &Bridge,
    target: &str,
    fut: impl std::future::Future<Output = Result<T, ExecError>>,
) -> Result<T, ExecError> {
    tokio::time::timeout(b.op_timeout, fut)
        .await
        .unwrap_or_else(|_| {
            Err(ExecError::Timeout {
                target: target.into(),
                secs: b.op_timeout.as_secs(),
            })
        })
}

async fn target_lock(b: &Bridge, target: &str) -> Option<tokio::sync::OwnedMutexGuard<()>> {
    Some(b.locks.get(target)?.clone().lock_owned().await)
}

#[derive(Clone, Copy)]
enum ReadOp {
    Power,
    Storage,
    Monitor,
}

async fn read_op(b: Arc<Bridge>, id: Arc<ClientIdentity>, target: String, op: ReadOp) -> Response {
    let t = match authorize(&b, &id, &target) {
        Ok(t) => t,
        Err((s, code, msg)) => {
            tracing::warn!(client = %id.name(), target, "{msg}");
            return error(s, code, msg);
        }
    };
    let _guard = target_lock(&b, &target).await;
    let ex = b.executor.clone();
    let (action, res) = match op {
        ReadOp::Power => (
            "power.status",
            with_timeout(&b, &target, ex.power_status(t))
                .await
                .map(|o| outcome_body(&target, "power.status", &o)),
        ),
        ReadOp::Storage => (
            "storage.status",
            with_timeout(&b, &target, ex.storage_status(t))
                .await
                .map(|o| outcome_body(&target, "storage.status", &o)),
        ),
        ReadOp::Monitor => (
            "monitor",
            with_timeout(&b, &target, ex.monitor(t))
                .await
                .map(|o| outcome_body(&target, "monitor", &o)),
        ),
    };
    match res {
        Ok(body) => Json(body).into_response(),
        Err(e) => {
            tracing::warn!(client = %id.name(), target, action, error = %e, "status read failed");
            let (s, body) = exec_error(&target, action, &e);
            (s, Json(body)).into_response()
        }
    }
}

async fn power_status(
    State(b): State<Arc<Bridge>>,
    Extension(id): Client,
    Path(t): Path<String>,
) -> Response {
    read_op(b, id, t, ReadOp::Power).await
}

async fn storage_status(
    State(b): State<Arc<Bridge>>,
    Extension(id): Client,
    Path(t): Path<String>,
) -> Response {
    read_op(b, id, t, ReadOp::Storage).await
}

async fn monitor(
    State(b): State<Arc<Bridge>>,
    Extension(id): Client,
    Path(t): Path<String>,
) -> Response {
    read_op(b, id, t, ReadOp::Monitor).await
}

/// A mutating operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Power(PowerAction),
    Storage(StorageAction),
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Power(PowerAction::Off) => "power.off",
            Op::Power(PowerAction::On) => "power.on",
            Op::Power(PowerAction::Reboot) => "power.reboot",
            Op::Storage(StorageAction::Block) => "storage.block",
            Op::Storage(StorageAction::Unblock) => "storage.unblock",
        }
    }
}

async fn power_action(
    State(b): State<Arc<Bridge>>,
    Extension(id): Client,
    Path((target, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let op = match action.as_str() {
        "off" => Op::Power(PowerAction::Off),
        "on" => Op::Power(PowerAction::On),
        "reboot" => Op::Power(PowerAction::Reboot),
        other => {
            return error(
                StatusCode::NOT_FOUND,
                "unknown_action",
                format!("no power action {other:?} (off, on, reboot)"),
            )
        }
    };
    mutate_in_span(b, id, target, op, headers, body).await
}

async fn storage_action(
    State(b): State<Arc<Bridge>>,
    Extension(id): Client,
    Path((target, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let op = match action.as_str() {
        "block" => Op::Storage(StorageAction::Block),
        "unblock" => Op::Storage(StorageAction::Unblock),
        other => {
            return error(
                StatusCode::NOT_FOUND,
                "unknown_action",
                format!("no storage action {other:?} (block, unblock)"),
            )
        }
    };
    mutate_in_span(b, id, target, op, headers, body).await
}

/// Why a body that did not parse as an [`ActionBody`] was refused: `Some` (for 400
/// `invalid_hold`) when its `hold` is present and malformed, `None` (400 `bad_json`) otherwise.
fn malformed_hold(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    match v.get("hold")? {
        Value::Null => None,
        Value::String(h) => StorageHold::new(h).err().map(|e| e.to_string()),
        other => Some(format!("hold must be a string, not {other}")),
    }
}

struct AuditCtx<'a> {
    b: &'a Bridge,
    id: &'a ClientIdentity,
    op: Op,
    target: &'a str,
    token: Option<u64>,
    key: Option<&'a str>,
    started: Instant,
    reason: Option<String>,
    /// The storage hold of the request, once its body was read: `Some(None)` for a node-wide
    /// storage action. `None` before the body was read and for power actions.
    hold: Option<Option<StorageHold>>,
}

impl AuditCtx<'_> {
    /// Appends an audit record (fsync'd, off the async threads) and finishes the response.
    async fn record(
        &self,
        result: &str,
        status: StatusCode,
        body: &Value,
        mut resp: Response,
    ) -> Response {
        let message = [
            body.get("message")
                .and_then(Value::as_str)
                .map(str::to_string),
            self.hold.as_ref().map(|h| match h {
                Some(h) => format!("hold {h}"),
                None => "no hold: node-wide".to_string(),
            }),
            self.reason.clone().map(|r| format!("reason: {r}")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ");
        let rec = AuditRecord {
            time: crate::fence_executor::rfc3339(std::time::SystemTime::now()),
            client: self.id.name(),
            action: self.op.name().into(),
            target: self.target.into(),
            token: self.token,
            idempotency_key: self.key.map(str::to_string),
            hold: self.hold.clone().flatten().map(String::from),
            result: result.into(),
            status: status.as_u16(),
            message: (!message.is_empty()).then_some(message),
            evidence: body.get("evidence").cloned().unwrap_or(Value::Null),
            duration_ms: self.started.elapsed().as_millis() as u64,
        };
        let audit = self.b.audit.clone();
        let res = tokio::task::spawn_blocking(move || audit.append(&rec)).await;
        if !matches!(res, Ok(Ok(()))) {
            tracing::error!(
                target = self.target,
                "audit log append failed; refusing to report success"
            );
            resp = error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "audit_failed",
                "the audit record could not be written; check the bridge host",
            );
        }
        tracing::info!(client = %self.id.name(), target = self.target, action = self.op.name(), result, status = status.as_u16(), "request");
        resp
    }

    async fn reject(&self, status: StatusCode, code: &str, message: String) -> Response {
        self.reject_with(status, code, json!({ "error": code, "message": message }))
            .await
    }

    /// [`Self::reject`] with a body that carries typed fields beside `error` and `message`.
    async fn reject_with(&self, status: StatusCode, code: &str, body: Value) -> Response {
        let resp = (status, Json(body.clone())).into_response();
        self.record(code, status, &body, resp).await
    }
}

/// [`mutate`] inside a span that names the target, the action, the client and (once read)
/// the fencing token; the device commands it sends are its children.
async fn mutate_in_span(
    b: Arc<Bridge>,
    id: Arc<ClientIdentity>,
    target: String,
    op: Op,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let span = tracing::info_span!(
        "bridge_action",
        target = %target,
        action = op.name(),
        client = %id.name(),
        token = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    // The controller's trace context: the action is a child of the fence step that sent it.
    if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        palisade_telemetry::set_remote_parent(&span, tp);
    }
    let response = mutate(b, id, target, op, headers, body)
        .instrument(span.clone())
        .await;
    span.record("status", response.status().as_u16());
    response
}

async fn mutate(
    b: Arc<Bridge>,
    id: Arc<ClientIdentity>,
    target: String,
    op: Op,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let mut ctx = AuditCtx {
        b: &b,
        id: &id,
        op,
        target: &target,
        token: None,
        key: None,
        started,
        reason: None,
        hold: None,
    };
    let t = match authorize(&b, &id, &target) {
        Ok(t) => t,
        Err((s, code, msg)) if s == StatusCode::FORBIDDEN => {
            tracing::warn!(client = %id.name(), target, "{msg}");
            return ctx.reject(s, code, msg).await;
        }
        Err((s, code, msg)) => return error(s, code, msg),
    };
    let body = match body {
        Ok(b) => b,
        Err(rej) => {
            let status = rej.status();
            let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "body_too_large"
            } else {
                "bad_body"
            };
            return error(
                status,
                code,
                format!("request body refused: {rej} (limit {} bytes)", b.max_body),
            );
        }
    };
    let mut action_body = ActionBody::default();
    if !body.iter().all(u8::is_ascii_whitespace) {
        match serde_json::from_slice::<ActionBody>(&body) {
            Ok(a) => action_body = a,
            Err(e) => {
                return match malformed_hold(&body) {
                    Some(why) => error(
                        StatusCode::BAD_REQUEST,
                        INVALID_HOLD,
                        format!("refusing the request, nothing done: {why}"),
                    ),
                    None => error(
                        StatusCode::BAD_REQUEST,
                        "bad_json",
                        format!("request body is not valid JSON for this endpoint: {e}"),
                    ),
                }
            }
        }
    }
    let ActionBody { reason, hold } = action_body;
    ctx.reason = reason;
    match op {
        Op::Storage(_) => ctx.hold = Some(hold.clone()),
        Op::Power(_) if hold.is_some() => {
            return error(
                StatusCode::BAD_REQUEST,
                INVALID_HOLD,
                "a hold applies to storage actions only; refusing the request, nothing done",
            )
        }
        Op::Power(_) => {}
    }
    let key = match headers.get(IDEMPOTENCY_KEY).and_then(|v| v.to_str().ok()) {
        Some(k) if !k.is_empty() && k.len() <= 128 && k.bytes().all(|c| c.is_ascii_graphic()) => {
            k.to_string()
        }
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "missing_idempotency_key",
                "header Idempotency-Key (1-128 visible ASCII characters) is required",
            )
        }
    };
    let token = match headers
        .get(FENCING_TOKEN)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().parse::<u64>())
    {
        Some(Ok(t)) => t,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "missing_fencing_token",
                "header Fencing-Token (an unsigned 64-bit integer) is required",
            )
        }
    };
    ctx.key = Some(&key);
    ctx.token = Some(token);
    tracing::Span::current().record("token", token);
    if matches!(op, Op::Storage(_)) && t.storage.is_empty() {
        return ctx
            .reject(
                StatusCode::UNPROCESSABLE_ENTITY,
                "no_device",
                format!("target {target} has no storage device"),
            )
            .await;
    }
    // The hold is part of the request: a key reused under another hold is refused, not
    // replayed. Without one the fingerprint is what bridges before holds recorded.
    let fingerprint = match &hold {
        None => format!("{target} {} {token}", op.name()),
        Some(h) => format!("{target} {} {token} hold {h}", op.name()),
    };

    // Everything below runs with the target's mutex held: one operation per device at a time.
    let _guard = target_lock(&b, &target).await;
    match b.store.lookup(&key) {
        Some(IdemEntry::Done {
            fingerprint: fp,
            response,
            ..
        }) if fp == fingerprint => {
            b.metrics
                .inc("palisade_bridge_idempotent_replays_total", &[]);
            let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::OK);
            let mut resp = (status, Json(response.body.clone())).into_response();
            resp.headers_mut()
                .insert(REPLAYED, HeaderValue::from_static("true"));
            return ctx.record("replayed", status, &response.body, resp).await;
        }
        Some(e) if e.fingerprint() != fingerprint => {
            let msg = format!("Idempotency-Key {key} was already used for a different request ({}); use a new key", e.fingerprint());
            return ctx
                .reject(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency_key_reused",
                    msg,
                )
                .await;
        }
        Some(_) => {
            let msg = format!("an earlier attempt with Idempotency-Key {key} was interrupted before its result was recorded; its outcome is unknown, so it is not repeated: read the status and retry with a new key");
            return ctx
                .reject(StatusCode::CONFLICT, "outcome_unknown", msg)
                .await;
        }
        None => {}
    }
    let store = b.store.clone();
    let (tg, k, fp) = (target.clone(), key.clone(), fingerprint.clone());
    match tokio::task::spawn_blocking(move || store.begin(&tg, token, &k, &fp)).await {
        Ok(Ok(Begin::Proceed)) => {}
        Ok(Ok(Begin::Stale { floor })) => {
            b.metrics.inc(
                "palisade_bridge_stale_token_rejections_total",
                &[("target", &target)],
            );
            let refusal = StaleTokenRefusal::new(&target, token, floor);
            tracing::warn!(client = %id.name(), target, token, floor, "stale fencing token refused");
            return ctx
                .reject_with(StatusCode::CONFLICT, STALE_FENCING_TOKEN, refusal.body())
                .await;
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "state store write failed");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "state_store_failed",
                "the fencing-token floor could not be persisted; not acting",
            );
        }
        Err(_) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "state store task failed",
            )
        }
    }

    let hold_name = hold.as_ref().map(StorageHold::as_str);
    tracing::info!(client = %id.name(), target, action = op.name(), token, hold = hold_name, "acting");
    let ex = b.executor.clone();
    let res = match op {
        Op::Power(a) => with_timeout(&b, &target, ex.power(t, a))
            .await
            .map(|o| outcome_body(&target, op.name(), &o)),
        Op::Storage(a) => with_timeout(&b, &target, ex.storage(t, a, hold.as_ref()))
            .await
            .map(|o| outcome_body(&target, op.name(), &o)),
    };
    let secs = started.elapsed().as_secs_f64();
    b.metrics.action_duration(secs);
    let (status, mut body, result) = match res {
        Ok(body) => (StatusCode::OK, body, "ok"),
        Err(e) => {
            tracing::warn!(client = %id.name(), target, action = op.name(), error = %e, "action failed");
            let (s, body) = exec_error(&target, op.name(), &e);
            let result = match e {
                ExecError::StillHeld { .. } => "still_held",
                _ => "error",
            };
            (s, body, result)
        }
    };
    b.metrics.inc(
        "palisade_bridge_actions_total",
        &[("action", op.name()), ("result", result)],
    );
    body["token"] = json!(token);
    body["idempotency_key"] = json!(key);
    body["duration_ms"] = json!(started.elapsed().as_millis() as u64);
    let store = b.store.clone();
    let stored = StoredResponse {
        status: status.as_u16(),
        body: body.clone(),
    };
    let (k, fp) = (key.clone(), fingerprint.clone());
    if !matches!(
        tokio::task::spawn_blocking(move || store.finish(&k, &fp, stored)).await,
        Ok(Ok(()))
    ) {
        tracing::error!(target, "idempotency record could not be persisted");
    }
    let resp = (status, Json(body.clone())).into_response();
    ctx.record(result, status, &body, resp).await
}

/// Query of `GET /v1/audit`.
#[derive(Debug, Deserialize)]
struct AuditQuery {
    target: Option<String>,
    limit: Option<usize>,
}

async fn read_audit(
    State(b): State<Arc<Bridge>>,
    Extension(id): Client,
    q: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_query",
            "query parameters are target=<id> and limit=<n>",
        );
    };
    let Some(scope) = b.policy().audit_scope(&id) else {
        return error(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("client {} may not read the audit log", id.name()),
        );
    };
    if let Some(t) = &q.target {
        if !scope.contains("*") && !scope.contains(t) {
            return error(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "client {} may not read the audit log of target {t}",
                    id.name()
                ),
            );
        }
    }
    let limit = q.limit.unwrap_or(100).min(1000);
    let audit = b.audit.clone();
    let scope: BTreeSet<String> = scope;
    let target = q.target.clone();
    match tokio::task::spawn_blocking(move || audit.read(&scope, target.as_deref(), limit)).await {
        Ok(Ok(records)) => Json(json!({ "records": records })).into_response(),
        _ => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "audit_read_failed",
            "the audit log could not be read",
        ),
    }
}
