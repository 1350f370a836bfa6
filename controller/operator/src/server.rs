//! `/metrics` (Prometheus text), `/healthz` and `/readyz` over axum.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::Router;

use crate::Ctx;

/// Serves until the listener fails.
pub async fn serve(addr: SocketAddr, ctx: Arc<Ctx>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(ctx);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    axum::serve(listener, app).await
}

async fn metrics(State(ctx): State<Arc<Ctx>>) -> String {
    ctx.metrics.render()
}
