//! `/metrics` (OpenMetrics text), `/healthz` and `/readyz` over axum.
//!
//! `/healthz` answers while the process serves. `/readyz` answers 200 only while this replica's
//! leader election reached the API server within one Lease duration (the server starts after
//! the caches synced), else 503 with the reason.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::Ctx;

/// Serves until the listener fails.
pub async fn serve(addr: SocketAddr, ctx: Arc<Ctx>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(ctx);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    axum::serve(listener, app).await
}

async fn readyz(State(ctx): State<Arc<Ctx>>) -> (axum::http::StatusCode, &'static str) {
    if ctx.leader.api_reachable_within(ctx.settings.lease_duration) {
        (axum::http::StatusCode::OK, "ok")
    } else {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the API server was not reached within one leader Lease duration",
        )
    }
}

async fn metrics(State(ctx): State<Arc<Ctx>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        ctx.metrics.render(),
    )
}
