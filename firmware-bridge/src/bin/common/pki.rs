//! A throwaway PKI for the bench binaries: one CA, and certificates it signs for the bridge
//! (server) and its clients.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// A CA and its key.
pub struct Pki {
    /// The CA certificate.
    pub ca: rcgen::Certificate,
    key: KeyPair,
}

impl Pki {
    /// A fresh CA (`bench-ca`).
    pub fn new() -> anyhow::Result<Self> {
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name.push(DnType::CommonName, "bench-ca");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate()?;
        let ca = p.self_signed(&key)?;
        Ok(Self { ca, key })
    }

    /// A certificate for `cn` with the subject alternative names `sans`, for a server or a
    /// client: its PEM and its key's PEM.
    pub fn issue(
        &self,
        sans: Vec<String>,
        cn: &str,
        server: bool,
    ) -> anyhow::Result<(String, String)> {
        let mut p = CertificateParams::new(sans)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &self.ca, &self.key)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}
