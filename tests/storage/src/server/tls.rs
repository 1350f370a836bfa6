//! The admin API's rustls server configuration.

use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ServerError;

fn tls(what: &str, reason: impl ToString) -> ServerError {
    ServerError::Tls {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

/// Builds the server config: certificate chain and key from PEM; when `client_ca_pem` is
/// given, client certificates signed by it are verified (but optional, so bearer-token clients
/// still connect).
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<rustls::ServerConfig, ServerError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls("server certificate", e))?;
    if chain.is_empty() {
        return Err(tls("server certificate", "no certificate in PEM"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| match e {
        pem::Error::NoItemsFound => tls("server key", "no private key in PEM"),
        other => tls("server key", other),
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls("protocol versions", e))?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca) {
                roots
                    .add(c.map_err(|e| tls("client CA", e))?)
                    .map_err(|e| tls("client CA", e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| tls("client CA", e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder
        .with_single_cert(chain, key)
        .map_err(|e| tls("server certificate", e))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}
