//! RMCP+ cryptography: RAKP HMACs, session key derivation (SIK, K1, K2), the integrity
//! AuthCode and AES-CBC-128 confidentiality (IPMI 2.0 sections 13.28 to 13.32).

use aes::cipher::{block_padding::NoPadding, BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use hmac::{Hmac, Mac};

use crate::cipher_suite::{
    AuthAlgorithm, CipherSuite, ConfidentialityAlgorithm, IntegrityAlgorithm,
};
use crate::error::DecodeError;

/// Maximum length of an IPMI 2.0 password; the user key Kuid is the password zero-padded to it.
pub const MAX_PASSWORD_LEN: usize = 20;

/// HMAC over the concatenation of `parts` with the RAKP hash of `alg`.
///
/// Returns an empty vector for [`AuthAlgorithm::None`].
pub fn rakp_hmac(alg: AuthAlgorithm, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match alg {
        AuthAlgorithm::None => Vec::new(),
        AuthAlgorithm::HmacSha1 => hmac_sha1(key, parts).to_vec(),
        AuthAlgorithm::HmacSha256 => hmac_sha256(key, parts).to_vec(),
    }
}

/// HMAC-SHA1 over the concatenation of `parts`.
pub fn hmac_sha1(key: &[u8], parts: &[&[u8]]) -> [u8; 20] {
    // HMAC accepts keys of any length, so `new_from_slice` cannot fail.
    let mut mac = <Hmac<sha1::Sha1> as Mac>::new_from_slice(key).expect("hmac takes any key");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// HMAC-SHA256 over the concatenation of `parts`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key).expect("hmac takes any key");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// The user key Kuid: the password zero-padded to 20 bytes (longer passwords are cut, as the
/// BMC stores at most 20 bytes).
pub fn user_key(password: &[u8]) -> [u8; MAX_PASSWORD_LEN] {
    let mut k = [0u8; MAX_PASSWORD_LEN];
    let n = password.len().min(MAX_PASSWORD_LEN);
    k[..n].copy_from_slice(&password[..n]);
    k
}

/// Constant-time comparison of two byte strings.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The keys of an established session, derived from the SIK.
#[derive(Clone)]
pub struct SessionKeys {
    suite: CipherSuite,
    k1: Vec<u8>,
    k2: Vec<u8>,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionKeys")
            .field("suite", &self.suite.id)
            .finish_non_exhaustive()
    }
}

impl SessionKeys {
    /// Derives K1 = HMAC(SIK, 0x01 * n) and K2 = HMAC(SIK, 0x02 * n), n being the hash length.
    pub fn derive(suite: CipherSuite, sik: &[u8]) -> Self {
        let n = match suite.auth {
            AuthAlgorithm::HmacSha256 => 32,
            _ => 20,
        };
        let k1 = rakp_hmac(suite.auth, sik, &[&vec![0x01; n]]);
        let k2 = rakp_hmac(suite.auth, sik, &[&vec![0x02; n]]);
        Self { suite, k1, k2 }
    }

    /// The negotiated suite.
    pub fn suite(&self) -> CipherSuite {
        self.suite
    }

    /// K1, the integrity key.
    pub fn k1(&self) -> &[u8] {
        &self.k1
    }

    /// K2, whose first 16 bytes are the AES-128 key.
    pub fn k2(&self) -> &[u8] {
        &self.k2
    }

    /// The AuthCode for `data` (from the session AuthType byte through Next Header).
    pub fn auth_code(&self, data: &[u8]) -> Vec<u8> {
        match self.suite.integrity {
            IntegrityAlgorithm::None => Vec::new(),
            IntegrityAlgorithm::HmacSha1_96 => hmac_sha1(&self.k1, &[data])[..12].to_vec(),
            IntegrityAlgorithm::HmacSha256_128 => hmac_sha256(&self.k1, &[data])[..16].to_vec(),
        }
    }

    /// Encrypts a payload: IV, then AES-CBC-128(payload, pad 1, 2, 3 .., pad length).
    pub fn encrypt(&self, payload: &[u8], iv: [u8; 16]) -> Vec<u8> {
        match self.suite.confidentiality {
            ConfidentialityAlgorithm::None => payload.to_vec(),
            ConfidentialityAlgorithm::AesCbc128 => {
                let pad = (16 - (payload.len() + 1) % 16) % 16;
                let mut plain = Vec::with_capacity(payload.len() + pad + 1);
                plain.extend_from_slice(payload);
                plain.extend((1..=pad).map(|i| i as u8));
                plain.push(pad as u8);
                let enc = cbc::Encryptor::<aes::Aes128>::new(self.k2[..16].into(), &iv.into())
                    .encrypt_padded_vec_mut::<NoPadding>(&plain);
                let mut out = iv.to_vec();
                out.extend_from_slice(&enc);
                out
            }
        }
    }

    /// Decrypts a payload produced by [`SessionKeys::encrypt`] (by us or by the BMC).
    pub fn decrypt(&self, data: &[u8]) -> Result<Vec<u8>, DecodeError> {
        match self.suite.confidentiality {
            ConfidentialityAlgorithm::None => Ok(data.to_vec()),
            ConfidentialityAlgorithm::AesCbc128 => {
                if data.len() < 32 || !data.len().is_multiple_of(16) {
                    return Err(DecodeError::Confidentiality("length not IV + n*16"));
                }
                let (iv, body) = data.split_at(16);
                let iv: [u8; 16] = iv.try_into().expect("split at 16");
                let plain = cbc::Decryptor::<aes::Aes128>::new(self.k2[..16].into(), &iv.into())
                    .decrypt_padded_vec_mut::<NoPadding>(body)
                    .map_err(|_| DecodeError::Confidentiality("decrypt"))?;
                let pad = *plain.last().expect("at least 16 bytes") as usize;
                if pad >= 16 || pad + 1 > plain.len() {
                    return Err(DecodeError::Confidentiality("pad length"));
                }
                let end = plain.len() - 1 - pad;
                if plain[end..plain.len() - 1]
                    .iter()
                    .enumerate()
                    .any(|(i, b)| *b as usize != i + 1)
                {
                    return Err(DecodeError::Confidentiality("pad bytes"));
                }
                Ok(plain[..end].to_vec())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha1_matches_rfc2202_case_2() {
        let mac = hmac_sha1(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            mac.to_vec(),
            hex("effcdf6ae5eb2fa2d27416d5f184df9c259a7c79")
        );
    }

    #[test]
    fn hmac_sha256_matches_rfc4231_case_2() {
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want for nothing?"]);
        assert_eq!(
            mac.to_vec(),
            hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        );
    }

    #[test]
    fn aes_cbc_layout_is_iv_then_cbc_of_payload_pad_and_pad_length() {
        use aes::cipher::{BlockEncrypt, KeyInit};
        // NIST SP 800-38A F.2.1 key and IV; our K2 prefix is the AES key.
        let key = hex("2b7e151628aed2a6abf7158809cf4f3c");
        let keys = SessionKeys {
            suite: CipherSuite::from_id(3).unwrap(),
            k1: vec![],
            k2: key.clone(),
        };
        let iv: [u8; 16] = hex("000102030405060708090a0b0c0d0e0f").try_into().unwrap();
        let payload = [0xaa, 0xbb, 0xcc];
        // Plaintext block: payload, pad 01..0c (12 bytes), pad length 0x0c.
        let mut block = [0u8; 16];
        block[..3].copy_from_slice(&payload);
        for i in 0..12 {
            block[3 + i] = i as u8 + 1;
        }
        block[15] = 12;
        for i in 0..16 {
            block[i] ^= iv[i];
        }
        let mut expected = aes::Block::from(block);
        aes::Aes128::new_from_slice(&key)
            .unwrap()
            .encrypt_block(&mut expected);
        let out = keys.encrypt(&payload, iv);
        assert_eq!(&out[..16], &iv);
        assert_eq!(&out[16..], expected.as_slice());
        assert_eq!(keys.decrypt(&out).unwrap(), payload);
        // The NIST vector itself: F.2.1 block 1.
        let mut b = aes::Block::clone_from_slice(&hex("6bc1bee22e409f96e93d7e117393172a"));
        for i in 0..16 {
            b[i] ^= iv[i];
        }
        aes::Aes128::new_from_slice(&key)
            .unwrap()
            .encrypt_block(&mut b);
        assert_eq!(b.to_vec(), hex("7649abac8119b246cee98e9b12e9197d"));
    }

    #[test]
    fn pad_follows_the_spec_for_every_length() {
        let keys = SessionKeys::derive(CipherSuite::from_id(17).unwrap(), &[7u8; 32]);
        for n in 0..40 {
            let payload: Vec<u8> = (0..n as u8).collect();
            let enc = keys.encrypt(&payload, [9; 16]);
            assert_eq!((enc.len() - 16) % 16, 0);
            assert_eq!(keys.decrypt(&enc).unwrap(), payload);
        }
    }

    #[test]
    fn key_derivation_uses_constant_blocks_of_hash_length() {
        let s3 = CipherSuite::from_id(3).unwrap();
        let keys = SessionKeys::derive(s3, b"sik");
        assert_eq!(keys.k1(), hmac_sha1(b"sik", &[&[1u8; 20]]));
        assert_eq!(keys.k2(), hmac_sha1(b"sik", &[&[2u8; 20]]));
        let s17 = CipherSuite::from_id(17).unwrap();
        let keys = SessionKeys::derive(s17, b"sik");
        assert_eq!(keys.k1(), hmac_sha256(b"sik", &[&[1u8; 32]]));
        assert_eq!(keys.auth_code(b"x").len(), 16);
    }

    pub(crate) fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
