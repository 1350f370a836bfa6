//! The peer protocol's wire format: one JSON line each way over TCP, at most [`MAX_LINE`]
//! bytes, each signed with HMAC-SHA256 under the shared [`PeerKey`].
//!
//! Request: `{"v":1,"from":..,"to":..,"nonce":..,"mac":hex(HMAC(key, "palisade-peer-req\n"
//! from "\n" to "\n" nonce))}`. Answer: `{"v":1,"node":..,"to":..,"nonce":..,"vouch":bool,
//! "mac":hex(HMAC(key, "palisade-peer-ans\n" node "\n" to "\n" nonce "\n" ("1"|"0")))}`.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

use super::PeerKey;

/// The longest accepted line, newline excluded.
pub(crate) const MAX_LINE: usize = 1024;

const VERSION: u32 = 1;

/// A peer's question: "can you reach the API?".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Request {
    pub v: u32,
    pub from: String,
    pub to: String,
    pub nonce: String,
    pub mac: String,
}

/// The answer: whether the answering node vouches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Answer {
    pub v: u32,
    pub node: String,
    pub to: String,
    pub nonce: String,
    pub vouch: bool,
    pub mac: String,
}

/// Why a message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Version,
    Nonce,
    Mac,
}

impl Refusal {
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Version => "unknown version",
            Refusal::Nonce => "nonce is not 32 lowercase hex characters",
            Refusal::Mac => "bad MAC",
        }
    }
}

/// A fresh random nonce: 16 bytes, hex.
pub(crate) fn new_nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

fn nonce_ok(n: &str) -> bool {
    n.len() == 32 && n.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn request_text(from: &str, to: &str, nonce: &str) -> Vec<u8> {
    format!("palisade-peer-req\n{from}\n{to}\n{nonce}").into_bytes()
}

fn answer_text(node: &str, to: &str, nonce: &str, vouch: bool) -> Vec<u8> {
    let bit = if vouch { "1" } else { "0" };
    format!("palisade-peer-ans\n{node}\n{to}\n{nonce}\n{bit}").into_bytes()
}

impl Request {
    /// A signed request from `from` to `to`.
    pub fn new(key: &PeerKey, from: &str, to: &str, nonce: String) -> Self {
        let mac = key.sign(&request_text(from, to, &nonce));
        Request {
            v: VERSION,
            from: from.to_string(),
            to: to.to_string(),
            nonce,
            mac,
        }
    }

    /// Checks the version, the nonce's shape and the MAC (in constant time).
    pub fn authenticate(&self, key: &PeerKey) -> Result<(), Refusal> {
        if self.v != VERSION {
            return Err(Refusal::Version);
        }
        if !nonce_ok(&self.nonce) {
            return Err(Refusal::Nonce);
        }
        if !key.verify(&request_text(&self.from, &self.to, &self.nonce), &self.mac) {
            return Err(Refusal::Mac);
        }
        Ok(())
    }
}

impl Answer {
    /// `node`'s signed answer to `to`'s request carrying `nonce`.
    pub fn new(key: &PeerKey, node: &str, to: &str, nonce: String, vouch: bool) -> Self {
        let mac = key.sign(&answer_text(node, to, &nonce, vouch));
        Answer {
            v: VERSION,
            node: node.to_string(),
            to: to.to_string(),
            nonce,
            vouch,
            mac,
        }
    }

    /// Checks the version and the MAC (in constant time).
    pub fn authenticate(&self, key: &PeerKey) -> Result<(), Refusal> {
        if self.v != VERSION {
            return Err(Refusal::Version);
        }
        let text = answer_text(&self.node, &self.to, &self.nonce, self.vouch);
        if !key.verify(&text, &self.mac) {
            return Err(Refusal::Mac);
        }
        Ok(())
    }
}

/// A message as one line, newline included.
pub(crate) fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serializing these plain structs of strings and bools cannot fail.
    let mut line = serde_json::to_vec(msg).unwrap_or_default();
    line.push(b'\n');
    line
}

/// Why a line could not be read.
#[derive(Debug)]
pub(crate) enum LineError {
    Io(std::io::Error),
    Oversize,
    /// The stream ended before a newline.
    Truncated,
}

/// Reads one line of at most [`MAX_LINE`] bytes (newline excluded), never buffering more
/// than one byte past the limit. Returns it without its newline.
pub(crate) async fn read_line<R: AsyncBufRead + Unpin>(r: R) -> Result<Vec<u8>, LineError> {
    let mut buf = Vec::with_capacity(256);
    let mut limited = r.take(MAX_LINE as u64 + 1);
    limited
        .read_until(b'\n', &mut buf)
        .await
        .map_err(LineError::Io)?;
    match buf.pop() {
        Some(b'\n') => Ok(buf),
        _ if buf.len() >= MAX_LINE => Err(LineError::Oversize),
        _ => Err(LineError::Truncated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "000102030405060708090a0b0c0d0e0f";

    fn key() -> PeerKey {
        PeerKey::from_bytes(&[b'k'; 32]).unwrap()
    }

    #[test]
    fn request_golden_bytes() {
        // MAC computed independently: python3 hmac.new(b"k"*32, msg, sha256).
        let r = Request::new(&key(), "node-a", "node-b", NONCE.to_string());
        assert_eq!(
            String::from_utf8(encode(&r)).unwrap(),
            "{\"v\":1,\"from\":\"node-a\",\"to\":\"node-b\",\
             \"nonce\":\"000102030405060708090a0b0c0d0e0f\",\
             \"mac\":\"8031d920f3cdb7a63c11e91df331a867b2ccdc748d66829dee98a69a232117b7\"}\n"
        );
        assert_eq!(r.authenticate(&key()), Ok(()));
    }

    #[test]
    fn answer_golden_bytes() {
        let a = Answer::new(&key(), "node-b", "node-a", NONCE.to_string(), true);
        assert_eq!(
            String::from_utf8(encode(&a)).unwrap(),
            "{\"v\":1,\"node\":\"node-b\",\"to\":\"node-a\",\
             \"nonce\":\"000102030405060708090a0b0c0d0e0f\",\"vouch\":true,\
             \"mac\":\"7f9771ebca11f63e20d4a6d41c0f85c4074c897d701bf787d4862c7ef841dd2a\"}\n"
        );
        assert_eq!(a.authenticate(&key()), Ok(()));
    }

    #[test]
    fn tampering_any_field_breaks_the_mac() {
        let r = Request::new(&key(), "node-a", "node-b", NONCE.to_string());
        let other = PeerKey::from_bytes(&[b'x'; 32]).unwrap();
        assert_eq!(r.authenticate(&other), Err(Refusal::Mac));
        let mut t = r.clone();
        t.to = "node-c".into();
        assert_eq!(t.authenticate(&key()), Err(Refusal::Mac));
        let mut t = r.clone();
        t.nonce = "f".repeat(32);
        assert_eq!(t.authenticate(&key()), Err(Refusal::Mac));
        let mut t = r.clone();
        t.nonce = "short".into();
        assert_eq!(t.authenticate(&key()), Err(Refusal::Nonce));
        let mut t = r;
        t.v = 2;
        assert_eq!(t.authenticate(&key()), Err(Refusal::Version));

        let a = Answer::new(&key(), "node-b", "node-a", NONCE.to_string(), false);
        let mut t = a.clone();
        t.vouch = true;
        assert_eq!(t.authenticate(&key()), Err(Refusal::Mac));
        let mut t = a;
        t.mac = "zz".into();
        assert_eq!(t.authenticate(&key()), Err(Refusal::Mac));
    }

    #[test]
    fn nonces_are_fresh_and_well_formed() {
        let (a, b) = (new_nonce(), new_nonce());
        assert!(nonce_ok(&a) && nonce_ok(&b));
        assert_ne!(a, b);
    }

    #[tokio::test]
    async fn lines_are_bounded() {
        let exact = [vec![b'a'; MAX_LINE], b"\n".to_vec()].concat();
        assert_eq!(read_line(&exact[..]).await.unwrap().len(), MAX_LINE);
        let over = [vec![b'a'; MAX_LINE + 1], b"\n".to_vec()].concat();
        assert!(matches!(
            read_line(&over[..]).await,
            Err(LineError::Oversize)
        ));
        assert!(matches!(
            read_line(&b"no newline"[..]).await,
            Err(LineError::Truncated)
        ));
        assert!(matches!(
            read_line(&b""[..]).await,
            Err(LineError::Truncated)
        ));
    }
}
