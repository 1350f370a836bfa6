//! The lab's certificate authority: serving certificates for the control plane and any lab
//! service, and client certificates whose subject carries a Kubernetes identity.

use std::fs;
use std::path::Path;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::error::{LabError, Result};

/// A PEM certificate and its PEM private key.
#[derive(Clone)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key (PKCS#8), PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl Issued {
    /// Writes `<stem>.crt` and `<stem>.key` (mode 0600) into `dir`.
    pub fn write(
        &self,
        dir: &Path,
        stem: &str,
    ) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
        let crt = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        fs::write(&crt, &self.cert_pem).map_err(LabError::io(&crt))?;
        crate::write_secret(&key, self.key_pem.as_bytes())?;
        Ok((crt, key))
    }
}

/// A certificate authority held in memory for the life of a lab.
pub struct Ca {
    key: KeyPair,
    cert: Certificate,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// Creates a new CA named `common_name`.
    pub fn new(common_name: &str) -> Result<Ca> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = dn(common_name, None);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(Ca { key, cert })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// Issues a serving certificate for the given IP addresses and DNS names.
    pub fn issue_server_cert(&self, names: &[&str]) -> Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = dn(names.first().copied().unwrap_or("palisade-lab"), None);
        params.subject_alt_names = names.iter().map(|n| san(n)).collect::<Result<_>>()?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// Issues a client certificate with subject `CN=<common_name>` and, if given,
    /// `O=<organization>` (Kubernetes reads the user from CN and a group from O).
    pub fn issue_client_cert(
        &self,
        common_name: &str,
        organization: Option<&str>,
    ) -> Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = dn(common_name, organization);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    /// Issues a certificate good for both serving (on `names`) and client authentication as
    /// `common_name`, as Kubernetes components use.
    pub fn issue_dual_cert(&self, common_name: &str, names: &[&str]) -> Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = dn(common_name, None);
        params.subject_alt_names = names.iter().map(|n| san(n)).collect::<Result<_>>()?;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.sign(params)
    }

    fn sign(&self, mut params: CertificateParams) -> Result<Issued> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A fresh ECDSA P-256 key pair for service-account token signing: (private key in PKCS#8
/// PEM, public key PEM).
pub fn new_signing_key_pem() -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

fn dn(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(o) = organization {
        dn.push(DnType::OrganizationName, o);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

fn san(name: &str) -> Result<SanType> {
    Ok(match name.parse::<std::net::IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(name.to_string().try_into()?),
    })
}
