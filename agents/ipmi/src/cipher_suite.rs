//! The RMCP+ cipher suite table (IPMI 2.0 table 22-20) restricted to the suites we implement.

/// Authentication (RAKP) algorithm numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AuthAlgorithm {
    /// RAKP-none: no key exchange authentication at all.
    None = 0,
    /// RAKP-HMAC-SHA1.
    HmacSha1 = 1,
    /// RAKP-HMAC-SHA256.
    HmacSha256 = 3,
}

/// Integrity algorithm numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum IntegrityAlgorithm {
    /// No integrity protection.
    None = 0,
    /// HMAC-SHA1-96 (12-byte AuthCode).
    HmacSha1_96 = 1,
    /// HMAC-SHA256-128 (16-byte AuthCode).
    HmacSha256_128 = 4,
}

/// Confidentiality algorithm numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ConfidentialityAlgorithm {
    /// No encryption.
    None = 0,
    /// AES-CBC-128.
    AesCbc128 = 1,
}

impl AuthAlgorithm {
    /// Parses an algorithm number (low 6 bits).
    pub fn from_u8(v: u8) -> Option<Self> {
        match v & 0x3f {
            0 => Some(Self::None),
            1 => Some(Self::HmacSha1),
            3 => Some(Self::HmacSha256),
            _ => None,
        }
    }
}

impl IntegrityAlgorithm {
    /// Parses an algorithm number (low 6 bits).
    pub fn from_u8(v: u8) -> Option<Self> {
        match v & 0x3f {
            0 => Some(Self::None),
            1 => Some(Self::HmacSha1_96),
            4 => Some(Self::HmacSha256_128),
            _ => None,
        }
    }

    /// Length of the AuthCode this algorithm appends to each packet.
    pub fn auth_code_len(self) -> usize {
        match self {
            Self::None => 0,
            Self::HmacSha1_96 => 12,
            Self::HmacSha256_128 => 16,
        }
    }
}

impl ConfidentialityAlgorithm {
    /// Parses an algorithm number (low 6 bits).
    pub fn from_u8(v: u8) -> Option<Self> {
        match v & 0x3f {
            0 => Some(Self::None),
            1 => Some(Self::AesCbc128),
            _ => None,
        }
    }
}

/// A cipher suite: the three algorithms negotiated by Open Session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CipherSuite {
    /// The suite number.
    pub id: u8,
    /// Key exchange authentication.
    pub auth: AuthAlgorithm,
    /// Per-packet integrity.
    pub integrity: IntegrityAlgorithm,
    /// Per-packet confidentiality.
    pub confidentiality: ConfidentialityAlgorithm,
}

const fn suite(
    id: u8,
    auth: AuthAlgorithm,
    integrity: IntegrityAlgorithm,
    confidentiality: ConfidentialityAlgorithm,
) -> CipherSuite {
    CipherSuite {
        id,
        auth,
        integrity,
        confidentiality,
    }
}

use AuthAlgorithm as A;
use ConfidentialityAlgorithm as C;
use IntegrityAlgorithm as I;

/// Every suite this crate can speak.
pub const SUITES: [CipherSuite; 7] = [
    suite(0, A::None, I::None, C::None),
    suite(1, A::HmacSha1, I::None, C::None),
    suite(2, A::HmacSha1, I::HmacSha1_96, C::None),
    suite(3, A::HmacSha1, I::HmacSha1_96, C::AesCbc128),
    suite(15, A::HmacSha256, I::None, C::None),
    suite(16, A::HmacSha256, I::HmacSha256_128, C::None),
    suite(17, A::HmacSha256, I::HmacSha256_128, C::AesCbc128),
];

/// The strong suites in order of preference: 17 (SHA-256) first, then 3 (SHA-1).
pub const PREFERRED: [u8; 2] = [17, 3];

impl CipherSuite {
    /// Looks up a suite by number.
    pub fn from_id(id: u8) -> Option<Self> {
        SUITES.iter().copied().find(|s| s.id == id)
    }

    /// Looks up the suite that uses exactly these three algorithms.
    pub fn from_algorithms(
        auth: AuthAlgorithm,
        integrity: IntegrityAlgorithm,
        confidentiality: ConfidentialityAlgorithm,
    ) -> Option<Self> {
        SUITES.iter().copied().find(|s| {
            s.auth == auth && s.integrity == integrity && s.confidentiality == confidentiality
        })
    }

    /// A weak suite lacks authentication, integrity or confidentiality. Suites 0, 1, 2, 15 and
    /// 16 are weak; a fencing agent refuses them unless explicitly allowed.
    pub fn is_weak(&self) -> bool {
        self.auth == A::None || self.integrity == I::None || self.confidentiality == C::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suites_3_and_17_are_strong_and_0_1_2_are_weak() {
        for id in [3, 17] {
            assert!(!CipherSuite::from_id(id).unwrap().is_weak(), "suite {id}");
        }
        for id in [0, 1, 2, 15, 16] {
            assert!(CipherSuite::from_id(id).unwrap().is_weak(), "suite {id}");
        }
        assert_eq!(CipherSuite::from_id(4), None);
        let s17 = CipherSuite::from_id(17).unwrap();
        assert_eq!(s17.auth, A::HmacSha256);
        assert_eq!(s17.integrity.auth_code_len(), 16);
        assert_eq!(
            CipherSuite::from_algorithms(A::HmacSha1, I::HmacSha1_96, C::AesCbc128).map(|s| s.id),
            Some(3)
        );
    }
}
