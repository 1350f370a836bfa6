//! The TLS client set-up of HTTPS clients that trust one CA bundle alone: rustls with the ring
//! provider (the one every Palisade TLS stack uses), the safe default protocol versions, and
//! only the roots given.
//!
//! *Guarantees:* no built-in or system roots are ever added, and verification cannot be turned
//! off through these functions; a bundle that holds no certificate is an error, not "trust
//! nothing" or "trust anything".
//!
//! *Assumptions:* callers hand the result to their HTTP client as a preconfigured TLS back-end
//! (`reqwest::ClientBuilder::tls_backend_preconfigured`); reqwest is built without a crypto
//! provider of its own, so a client left to build its own TLS would not start.

use std::sync::Arc;

use rustls::client::WantsClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, ConfigBuilder, RootCertStore};

/// The roots of a PEM bundle: every certificate in it.
///
/// *Guarantees:* an error names what was wrong (unreadable PEM, a certificate rustls refuses,
/// or no certificate at all).
pub fn roots_from_pem(pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        let c = c.map_err(|e| format!("CA bundle: {e}"))?;
        roots
            .add(c)
            .map_err(|e| format!("CA bundle: a certificate rustls refuses: {e}"))?;
    }
    if roots.is_empty() {
        return Err("CA bundle holds no certificate".into());
    }
    Ok(roots)
}

/// A client configuration, still wanting its client certificate (or none), that verifies
/// servers against `roots` alone.
pub fn verified_by(
    roots: RootCertStore,
) -> Result<ConfigBuilder<ClientConfig, WantsClientCert>, String> {
    Ok(
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS protocol versions: {e}"))?
            .with_root_certificates(roots),
    )
}

/// A client configuration without client certificate that verifies servers against the
/// certificates of the PEM bundle `ca_pem` alone.
pub fn pinned(ca_pem: &[u8]) -> Result<ClientConfig, String> {
    Ok(verified_by(roots_from_pem(ca_pem)?)?.with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_without_a_certificate_is_an_error() {
        assert_eq!(pinned(b"").unwrap_err(), "CA bundle holds no certificate");
        let garbage =
            b"-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n";
        assert!(pinned(garbage).unwrap_err().starts_with("CA bundle"));
    }
}
