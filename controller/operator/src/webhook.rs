//! The validating admission webhook (`POST /validate` over HTTPS): refuses malformed Palisade
//! objects at the door with the very rules the controller applies later
//! ([`palisade_decide::acceptance`]).
//!
//! - `FencingPolicy`, `FenceTarget` (create, update): every problem `validate()` finds
//!   (cross-field rules, credentials in URLs, bridge devices with Secrets, …);
//! - `NodeFence` create: the node must exist and have no unfinished fence;
//! - `NodeFence` update: the spec never changes (status updates are not sent here).
//!
//! Guarantees: a denial lists every problem; credentials in a URL are never echoed (the
//! messages carry the redacted URL); a request the webhook cannot parse is denied, never
//! allowed. Assumptions: the manifests register it with `failurePolicy: Fail` for NodeFence
//! creation only (so a controller outage blocks new manual fences but never edits to policies
//! or targets, which the controller still validates and reports on its own); the serving
//! certificate comes from a Secret mounted as files, read at start.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use palisade_decide::acceptance;
use palisade_model::{FenceTarget, FencingPolicy, NodeFence};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt;

use crate::Ctx;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The serving configuration from a PEM certificate chain and key (for example a mounted
/// `kubernetes.io/tls` Secret's `tls.crt` and `tls.key`).
pub fn tls_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use anyhow::Context as _;
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|c| c.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading the webhook certificate {}", cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{}: no certificate", cert.display());
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the webhook key {}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .context("the webhook certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves the webhook on `addr` until the listener fails.
pub async fn serve(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    ctx: Arc<Ctx>,
) -> std::io::Result<()> {
    let router = Router::new()
        .route("/validate", post(validate))
        .with_state(ctx);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving the validating admission webhook");
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = listener.accept().await?;
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    router.clone().oneshot(req.map(axum::body::Body::new))
                });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .await
            {
                tracing::debug!(%peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
}

async fn validate(
    State(ctx): State<Arc<Ctx>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            return Json(
                AdmissionResponse::invalid(format!("not an AdmissionReview request: {e}"))
                    .into_review(),
            )
        }
    };
    let kind = req.kind.kind.clone();
    let response = AdmissionResponse::from(&req);
    let response = match review_request(&ctx, &req) {
        Ok(()) => response,
        Err(problems) => {
            ctx.metrics.admission_denied(&kind);
            tracing::info!(%kind, name = %req.name, problems = %problems.join("; "), "admission denied");
            response.deny(format!("{kind} {:?}: {}", req.name, problems.join("; ")))
        }
    };
    Json(response.into_review())
}

/// The spec of the reviewed object (`new`) or of the object before the change (`old`).
fn spec<T: serde::de::DeserializeOwned>(obj: Option<&DynamicObject>) -> Result<T, Vec<String>> {
    let spec = obj
        .map(|o| o.data.get("spec").cloned().unwrap_or_default())
        .ok_or_else(|| vec!["the request carries no object".to_string()])?;
    serde_json::from_value(spec).map_err(|e| vec![format!("spec does not parse: {e}")])
}

fn review_request(ctx: &Ctx, req: &AdmissionRequest<DynamicObject>) -> Result<(), Vec<String>> {
    let writes = matches!(req.operation, Operation::Create | Operation::Update);
    match req.kind.kind.as_str() {
        k if k == kind::<FencingPolicy>() && writes => {
            acceptance::admit_policy(&spec(req.object.as_ref())?)
        }
        k if k == kind::<FenceTarget>() && writes => {
            acceptance::admit_target(&spec(req.object.as_ref())?)
        }
        k if k == kind::<NodeFence>() && req.operation == Operation::Create => {
            let new: palisade_model::NodeFenceSpec = spec(req.object.as_ref())?;
            let node_exists = ctx
                .cache
                .nodes
                .get(&ObjectRef::new(&new.node_name))
                .is_some();
            let active: Vec<String> = ctx
                .cache
                .fences
                .state()
                .iter()
                .filter(|f| f.spec.node_name == new.node_name)
                .filter(|f| !f.status.as_ref().is_some_and(|s| s.phase.is_terminal()))
                .map(|f| kube::ResourceExt::name_any(f.as_ref()))
                .filter(|n| *n != req.name)
                .collect();
            acceptance::admit_fence_create(&new, node_exists, &active)
        }
        k if k == kind::<NodeFence>() && req.operation == Operation::Update => {
            acceptance::admit_fence_update(
                &spec(req.old_object.as_ref())?,
                &spec(req.object.as_ref())?,
            )
        }
        _ => Ok(()),
    }
}

fn kind<K: kube::Resource<DynamicType = ()>>() -> String {
    K::kind(&()).into_owned()
}
