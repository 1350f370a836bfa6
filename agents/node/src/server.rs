//! `/metrics`, `/healthz` and `/readyz` over HTTP (axum).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header;
use axum::routing::get;
use axum::Router;

use crate::metrics::Metrics;

/// Errors of the HTTP server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listener could not be bound or served.
    #[error("metrics server on {addr}: {source}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The router.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || async move {
                (
                    [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
                    metrics.render(),
                )
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
}

/// Serves until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<(), ServerError> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Io { addr, source })?;
    axum::serve(l, router(metrics))
        .await
        .map_err(|source| ServerError::Io { addr, source })
}
