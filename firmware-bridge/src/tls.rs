//! TLS: the server configuration with mandatory client-certificate authentication against a
//! configured CA, and extraction of a [`ClientIdentity`] from a verified peer certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
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
        /// The I/O or PEM parse error.
        #[source]
        source: pem::Error,
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
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
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
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::Empty {
            path: path.to_path_buf(),
            what: "private key",
        },
        other => pem_err(other),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(e: &TlsError) -> String {
        let mut s = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            s.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        s
    }

    #[test]
    fn missing_garbage_and_empty_pem_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\n!!not base64!!\n-----END CERTIFICATE-----\n\
             -----BEGIN PRIVATE KEY-----\n!!not base64!!\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let text = dir.path().join("text.pem");
        std::fs::write(&text, "just some text, no PEM section\n").unwrap();

        for path in [&missing, &garbage] {
            let name = path.display().to_string();
            let e = read_certs(path).unwrap_err();
            assert!(matches!(e, TlsError::Pem { .. }), "{}", message(&e));
            assert!(message(&e).contains(&name), "{}", message(&e));
            let e = read_key(path).unwrap_err();
            assert!(matches!(e, TlsError::Pem { .. }), "{}", message(&e));
            assert!(message(&e).contains(&name), "{}", message(&e));
        }
        let name = text.display().to_string();
        let e = read_certs(&text).unwrap_err();
        assert!(
            matches!(
                e,
                TlsError::Empty {
                    what: "certificate",
                    ..
                }
            ),
            "{}",
            message(&e)
        );
        assert!(message(&e).contains(&name));
        let e = read_key(&text).unwrap_err();
        assert!(
            matches!(
                e,
                TlsError::Empty {
                    what: "private key",
                    ..
                }
            ),
            "{}",
            message(&e)
        );
        assert!(message(&e).contains(&name));
    }
}
