//! TLS: the server configuration with mandatory client-certificate authentication against a
//! configured CA, and extraction of a [`ClientIdentity`] from a verified peer certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use crate::config::TlsFiles;
use crate::policy::ClientIdentity;
use crate::secret::{check_permissions, SecretError};

/// Errors building the TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("cannot read PEM file {path}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A PEM file held nothing usable.
    #[error("PEM file {path} contains no {what}")]
    Empty {
        /// The file.
        path: PathBuf,
        /// What was expected.
        what: &'static str,
    },
    /// The server key file is too open.
    #[error("server key")]
    KeyPermissions(#[source] SecretError),
    /// The client CA bundle was rejected.
    #[error("client CA bundle {path} rejected: {reason}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration rejected")]
    Rustls(#[source] rustls::Error),
}

/// The crypto provider used everywhere in the bridge (ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads all certificates of a PEM file.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |source| TlsError::Pem {
        path: path.to_path_buf(),
        source,
    };
    let data = std::fs::read(path).map_err(pem_err)?;
    let certs = rustls_pemfile::certs(&mut data.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err)?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// Reads the first private key of a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem_err = |source| TlsError::Pem {
        path: path.to_path_buf(),
        source,
    };
    let data = std::fs::read(path).map_err(pem_err)?;
    rustls_pemfile::private_key(&mut data.as_slice())
        .map_err(pem_err)?
        .ok_or(TlsError::Empty {
            path: path.to_path_buf(),
            what: "private key",
        })
}

/// Reads a CA bundle into a root store.
pub fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(path)? {
        roots.add(c).map_err(|e| TlsError::ClientCa {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// Builds the server configuration: TLS 1.2/1.3, HTTP/1.1, and a client certificate that
/// chains to `files.client_ca` is **required** (no anonymous clients).
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    check_permissions(&files.key).map_err(TlsError::KeyPermissions)?;
    let certs = read_certs(&files.cert)?;
    let key = read_key(&files.key)?;
    let roots = read_roots(&files.client_ca)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| TlsError::ClientCa {
            path: files.client_ca.clone(),
            reason: e.to_string(),
        })?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(TlsError::Rustls)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Extracts the identity (CN, DNS and URI SANs) from a DER certificate that rustls has
/// already verified. Returns `None` if the certificate cannot be parsed.
pub fn identity_from_cert(der: &[u8]) -> Option<ClientIdentity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .map(str::to_string);
    let mut id = ClientIdentity {
        cn,
        ..Default::default()
    };
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(d) => id.dns.push(d.to_string()),
                x509_parser::extensions::GeneralName::URI(u) => id.uris.push(u.to_string()),
                _ => {}
            }
        }
    }
    Some(id)
}
