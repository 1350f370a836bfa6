//! TLS to the BMC: rustls, trusting exactly what the target pins.
//!
//! - a CA ([`RedfishTls::CaFile`]): the usual WebPKI checks (chain to that CA only, host name,
//!   validity);
//! - a certificate fingerprint ([`RedfishTls::Fingerprint`]): the SHA-256 of the end-entity
//!   certificate's DER must match, and the handshake signature must verify with its key. The
//!   host name and dates are not checked: BMCs ship self-signed certificates for names nobody
//!   uses, and the pin already names the one key we accept;
//! - [`RedfishTls::Insecure`] (`ssl_insecure`): any certificate, only when asked for by name,
//!   and said at warning level on every operation.
//!
//! A pin mismatch surfaces as [`crate::FenceError::IdentityMismatch`] with the fingerprint the
//! BMC presented, so an operator can tell a rotated certificate from a wrong address.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::target::RedfishTls;

/// Parses the trust options of a target (URL query or CLI): exactly one of a CA file, a
/// SHA-256 fingerprint, or an explicit `ssl_insecure`.
pub(crate) fn parse_trust(
    ca_file: Option<&str>,
    fingerprint: Option<&str>,
    insecure: Option<&str>,
) -> Result<RedfishTls, String> {
    let insecure = match insecure.map(str::to_ascii_lowercase).as_deref() {
        None | Some("0" | "false" | "no" | "off") => false,
        Some("1" | "true" | "yes" | "on") => true,
        Some(v) => return Err(format!("ssl_insecure: not a boolean: {v}")),
    };
    match (ca_file, fingerprint, insecure) {
        (Some(path), None, false) if !path.is_empty() => Ok(RedfishTls::CaFile(path.into())),
        (None, Some(fp), false) => parse_fingerprint(fp).map(RedfishTls::Fingerprint),
        (None, None, true) => Ok(RedfishTls::Insecure),
        (None, None, false) => Err(
            "no TLS trust: give ca_file (the CA that issued the BMC certificate), fingerprint (the SHA-256 of the BMC certificate) or, explicitly, ssl_insecure".into(),
        ),
        _ => Err("give exactly one of ca_file, fingerprint and ssl_insecure".into()),
    }
}

/// Parses a SHA-256 fingerprint: 64 hex digits, optionally separated by `:` (as `openssl x509
/// -fingerprint -sha256` prints it) and optionally prefixed with `sha256:`.
pub(crate) fn parse_fingerprint(s: &str) -> Result<[u8; 32], String> {
    let t = s.trim();
    let t = t
        .strip_prefix("sha256:")
        .or_else(|| t.strip_prefix("SHA256:"))
        .or_else(|| t.strip_prefix("sha256="))
        .or_else(|| t.strip_prefix("SHA256 Fingerprint="))
        .unwrap_or(t);
    let hex: String = t.chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "fingerprint must be the 64 hex digits of a SHA-256 digest (colons allowed), got {s:?}"
        ));
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex digits");
    }
    Ok(out)
}

/// Formats a digest the way `openssl x509 -fingerprint -sha256` does (`AB:CD:...`).
pub fn format_fingerprint(digest: &[u8; 32]) -> String {
    digest
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What `trust` pins, to complete "pinned ..., the device reports ..." in identity errors.
pub(crate) fn describe(trust: &RedfishTls) -> String {
    match trust {
        RedfishTls::CaFile(path) => format!("the CA in {}", path.display()),
        RedfishTls::CaPem(_) | RedfishTls::CaFromSecret => {
            "the CA in the device Secret's caBundle".into()
        }
        RedfishTls::Fingerprint(fp) => {
            format!("certificate fingerprint {}", format_fingerprint(fp))
        }
        RedfishTls::Insecure => "nothing (ssl_insecure)".into(),
    }
}

/// The SHA-256 fingerprint of a DER certificate.
pub fn fingerprint_of_der(der: &[u8]) -> [u8; 32] {
    Sha256::digest(der).into()
}

/// Why the BMC's certificate was refused by a fingerprint pin; travels inside the rustls error
/// so the caller can report what the BMC presented.
#[derive(Debug)]
pub(crate) struct PinMismatch {
    pub(crate) found: [u8; 32],
}

impl std::fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "certificate fingerprint {} is not the pinned one",
            format_fingerprint(&self.found)
        )
    }
}

impl std::error::Error for PinMismatch {}

/// Accepts exactly one certificate (by digest), or, when `pin` is `None` (`ssl_insecure`), any.
#[derive(Debug)]
struct PinnedVerifier {
    pin: Option<[u8; 32]>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let found = fingerprint_of_der(end_entity);
        match self.pin {
            Some(pin) if pin != found => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Other(rustls::OtherError(Arc::new(PinMismatch {
                    found,
                }))),
            )),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The PEM certificates in `pem` (from `source`); at least one.
fn ca_certificates(pem: &[u8], source: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{source}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{source}: holds no PEM certificate"));
    }
    Ok(certs)
}

/// Trusts the certificates of a CA file (or of a Secret's caBundle) as webpki does: chain to
/// one of them, validity dates and host name checked. And one case webpki refuses: the
/// server presents, byte for byte, a CA certificate of the file as its own certificate. That
/// is a self-signed certificate that is its own CA, what `openssl req -x509` makes and curl
/// accepts; webpki says `CaUsedAsEndEntity`.
///
/// Guarantees: that exception trusts only the exact certificate the operator put in the
/// file (like a fingerprint pin), only after webpki found its validity dates good (it checks
/// them before the CA flag), and still checks the host name; the TLS handshake signature is
/// checked with the certificate's key as always, so the server holds its private key.
#[derive(Debug)]
struct CaVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    anchors: Vec<CertificateDer<'static>>,
}

impl CaVerifier {
    fn new(
        anchors: Vec<CertificateDer<'static>>,
        source: &str,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        for c in &anchors {
            roots.add(c.clone()).map_err(|e| format!("{source}: {e}"))?;
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("{source}: {e}"))?;
        Ok(Self { webpki, anchors })
    }
}

/// Whether rustls' refusal is webpki's `CaUsedAsEndEntity` (rustls has no variant of its own
/// for it and carries webpki's error inside `Other`).
fn is_ca_used_as_end_entity(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(o))
            if format!("{o:?}").contains("CaUsedAsEndEntity")
    )
}

impl ServerCertVerifier for CaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(e)
                if is_ca_used_as_end_entity(&e)
                    && self
                        .anchors
                        .iter()
                        .any(|a| a.as_ref() == end_entity.as_ref()) =>
            {
                let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_name(&cert, server_name)?;
                tracing::debug!(
                    "the server presents a self-signed CA certificate of the CA file: trusted as that exact certificate"
                );
                Ok(ServerCertVerified::assertion())
            }
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Builds the rustls configuration for `trust`. TLS 1.2 stays enabled: most BMCs (and
/// sushy-emulator) speak nothing newer.
pub(crate) fn client_config(trust: &RedfishTls) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS protocol versions: {e}"))?;
    let ca = |pem: &[u8], source: &str| -> Result<Arc<CaVerifier>, String> {
        let anchors = ca_certificates(pem, source)?;
        Ok(Arc::new(CaVerifier::new(
            anchors,
            source,
            provider.clone(),
        )?))
    };
    let mut cfg = match trust {
        RedfishTls::CaFile(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(ca(&pem, &path.display().to_string())?)
                .with_no_client_auth()
        }
        RedfishTls::CaPem(pem) => builder
            .dangerous()
            .with_custom_certificate_verifier(ca(pem.as_bytes(), "the Secret's caBundle")?)
            .with_no_client_auth(),
        RedfishTls::CaFromSecret => return Err(
            "ca=secret: the caBundle of the device's Secret was not supplied (a bug in the caller)"
                .into(),
        ),
        RedfishTls::Fingerprint(pin) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                pin: Some(*pin),
                provider,
            }))
            .with_no_client_auth(),
        RedfishTls::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                pin: None,
                provider,
            }))
            .with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Finds a certificate refusal in an error chain (reqwest → hyper → io → rustls): the
/// presented fingerprint for a pin mismatch, or rustls' reason for a CA refusal.
pub(crate) fn certificate_refusal(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(rustls::Error::InvalidCertificate(ce)) = err.downcast_ref::<rustls::Error>() {
            if let rustls::CertificateError::Other(other) = ce {
                if let Some(m) = other.0.downcast_ref::<PinMismatch>() {
                    return Some(format_fingerprint(&m.found));
                }
            }
            return Some(format!("a certificate rustls refused: {ce}"));
        }
        // io::Error's `source` skips the error it wraps (and tokio-rustls wraps twice).
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            cur = Some(inner as &(dyn std::error::Error + 'static));
            continue;
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_parse_in_openssl_and_plain_forms() {
        let plain = "ab".repeat(32);
        let colons = "AB:".repeat(31) + "AB";
        for s in [
            plain.clone(),
            colons.clone(),
            format!("sha256:{plain}"),
            format!("SHA256 Fingerprint={colons}"),
        ] {
            assert_eq!(parse_fingerprint(&s).unwrap(), [0xab; 32], "{s}");
        }
        assert_eq!(format_fingerprint(&[0xab; 32]), colons);
        assert!(parse_fingerprint(&"ab".repeat(31)).is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn a_ca_from_the_secret_must_be_supplied_and_hold_a_certificate() {
        let e = client_config(&RedfishTls::CaFromSecret).unwrap_err();
        assert!(e.contains("was not supplied"), "{e}");
        let e = client_config(&RedfishTls::CaPem("not a certificate".into())).unwrap_err();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        let ca = rcgen::generate_simple_self_signed(vec!["bmc".into()]).unwrap();
        assert!(client_config(&RedfishTls::CaPem(ca.cert.pem())).is_ok());
        assert_eq!(
            RedfishTls::CaFromSecret
                .with_secret_ca(Some("PEM"))
                .unwrap(),
            RedfishTls::CaPem("PEM".into())
        );
        let e = RedfishTls::CaFromSecret.with_secret_ca(None).unwrap_err();
        assert!(e.contains("has no caBundle"), "{e}");
        assert_eq!(
            RedfishTls::Insecure.with_secret_ca(Some("PEM")).unwrap(),
            RedfishTls::Insecure,
            "a Secret's caBundle never replaces the trust a URL names"
        );
    }

    #[test]
    fn trust_must_be_named_exactly_once() {
        let fp = "00".repeat(32);
        assert_eq!(
            parse_trust(Some("/ca.pem"), None, None).unwrap(),
            RedfishTls::CaFile("/ca.pem".into())
        );
        assert_eq!(
            parse_trust(None, Some(&fp), Some("0")).unwrap(),
            RedfishTls::Fingerprint([0; 32])
        );
        assert_eq!(
            parse_trust(None, None, Some("true")).unwrap(),
            RedfishTls::Insecure
        );
        assert!(
            parse_trust(None, None, None).is_err(),
            "no insecure default"
        );
        assert!(parse_trust(None, None, Some("false")).is_err());
        assert!(parse_trust(Some("/ca.pem"), Some(&fp), None).is_err());
        assert!(parse_trust(Some("/ca.pem"), None, Some("1")).is_err());
        assert!(parse_trust(None, None, Some("maybe")).is_err());
    }
}
