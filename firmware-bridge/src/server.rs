//! The TLS accept loop: mutual TLS on every connection, the verified identity handed to the
//! router, SIGHUP reloads and a single graceful shutdown path.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::bridge::Bridge;
use crate::policy::ClientIdentity;
use crate::tls::identity_from_cert;

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests get to finish at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Stack size of the runtime's threads: device futures (IPMI sessions, SNMP) are deep and
/// large in debug builds, more than tokio's 2 MiB default holds.
pub const THREAD_STACK: usize = 16 << 20;

/// The multi-threaded runtime the bridge runs on (larger thread stacks, see [`THREAD_STACK`]).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(THREAD_STACK)
        .thread_name("firmware-bridge")
        .build()
}

/// A short reason for a failed handshake, for logs and metric labels.
fn handshake_reason(e: &std::io::Error) -> &'static str {
    let s = e.to_string().to_lowercase();
    if s.contains("no certificates") {
        "no_client_certificate"
    } else if s.contains("unknownissuer")
        || s.contains("unknown issuer")
        || s.contains("badsignature")
    {
        "unknown_ca"
    } else if s.contains("expired") || s.contains("notvalidyet") || s.contains("not valid yet") {
        "certificate_expired"
    } else if s.contains("revoked") {
        "certificate_revoked"
    } else {
        "other"
    }
}

/// Serves `bridge` on `listener` until `shutdown` resolves, then stops accepting and drains
/// in-flight connections for up to 30 s.
pub async fn serve(
    bridge: Arc<Bridge>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let router = crate::api::router(bridge.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Each connection uses the TLS config current at accept time; a reload swaps the Arc
        // for later connections and leaves this one alone.
        let acceptor = tokio_rustls::TlsAcceptor::from(bridge.tls_config());
        let (bridge, router, mut stop_rx) = (bridge.clone(), router.clone(), stop_rx.clone());
        while conns.try_join_next().is_some() {}
        conns.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    let reason = handshake_reason(&e);
                    bridge.metrics.inc(
                        "palisade_bridge_tls_handshake_failures_total",
                        &[("reason", reason)],
                    );
                    tracing::warn!(%peer, reason, error = %e, "TLS handshake refused");
                    return;
                }
                Err(_) => {
                    bridge.metrics.inc(
                        "palisade_bridge_tls_handshake_failures_total",
                        &[("reason", "timeout")],
                    );
                    return;
                }
            };
            let identity = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| identity_from_cert(c.as_ref()));
            let Some(identity) = identity else {
                tracing::warn!(%peer, "verified client certificate could not be parsed");
                return;
            };
            let identity = Arc::new(identity);
            serve_conn(tls, peer, identity, router, &mut stop_rx).await;
        });
    }
    tracing::info!("shutting down: no new connections, draining in-flight requests");
    let _ = stop_tx.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        tracing::warn!("shutdown grace period over; aborting remaining connections");
        conns.abort_all();
    }
    Ok(())
}

async fn serve_conn(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: SocketAddr,
    identity: Arc<ClientIdentity>,
    router: axum::Router,
    stop: &mut watch::Receiver<bool>,
) {
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(identity.clone());
        router.clone().oneshot(req.map(axum::body::Body::new))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .serve_connection(TokioIo::new(tls), svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "connection ended with error");
            }
        }
        _ = stopped(stop) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Resolves once the shutdown flag is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Reloads `bridge` on every SIGHUP, forever. Errors are logged; the old config stays.
pub async fn reload_on_sighup(bridge: Arc<Bridge>) -> std::io::Result<()> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    while hup.recv().await.is_some() {
        match bridge.reload() {
            Ok(()) => tracing::info!("SIGHUP: reloaded certificates and policy"),
            Err(e) => {
                tracing::error!(error = %crate::error_chain(&e), "SIGHUP: reload failed; keeping the running configuration")
            }
        }
    }
    Ok(())
}
