//! A throwaway PKI (rcgen) for tests and the bench when the lab CA is not at hand.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// A certificate authority able to issue server and client certificates.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A PEM certificate and its PEM private key.
#[derive(Debug, Clone)]
pub struct Issued {
    /// Certificate (PEM).
    pub cert_pem: String,
    /// Private key (PEM).
    pub key_pem: String,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TestCa")
    }
}

impl TestCa {
    /// Creates a new CA named `cn`.
    pub fn new(cn: &str) -> Result<Self, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(TestCa { cert, key })
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// Issues a server certificate for the given names or IP addresses.
    pub fn issue_server(&self, names: &[&str]) -> Result<Issued, rcgen::Error> {
        let params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        self.sign(params)
    }

    /// Issues a client certificate with common name `cn`.
    pub fn issue_client(&self, cn: &str) -> Result<Issued, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<Issued, rcgen::Error> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}
