//! Content digests (`sha256:<hex>`): parsing, computing, and hashing readers and writers that
//! verify what a registry sent against what the manifest promised.

use std::io::{Read, Write};

use sha2::{Digest as _, Sha256};

/// A SHA-256 content digest, the only algorithm the agent accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// Parses `sha256:<64 lowercase hex digits>`.
    pub fn parse(s: &str) -> Option<Digest> {
        let hex = s.strip_prefix("sha256:")?;
        (hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| Digest {
            hex: hex.to_string(),
        })
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest {
            hex: hex::encode(Sha256::digest(bytes)),
        }
    }

    /// The 64 hex digits (a file name in the store).
    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// A writer that hashes what passes through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// The digest and length of everything written, and the inner writer.
    pub fn finish(self) -> (Digest, u64, W) {
        let hex = hex::encode(self.hasher.finalize());
        (Digest { hex }, self.written, self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes what is read through it (the uncompressed layer, for its diff ID).
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
        }
    }

    /// Reads the rest of the stream (a tar archive may end before its padding), then returns
    /// the digest of everything.
    pub fn finish(mut self) -> std::io::Result<Digest> {
        std::io::copy(&mut self, &mut std::io::sink())?;
        Ok(Digest {
            hex: hex::encode(self.hasher.finalize()),
        })
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_with_lowercase_hex_only() {
        let d = Digest::of(b"");
        assert_eq!(
            d.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(&d.to_string()), Some(d.clone()));
        assert_eq!(Digest::parse(&d.to_string().to_uppercase()), None);
        assert_eq!(Digest::parse("sha512:00"), None);
        assert_eq!(Digest::parse("sha256:abc"), None);
    }

    #[test]
    fn hashing_writer_and_reader_agree_with_the_digest_of_the_bytes() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"layer bytes").unwrap();
        let (d, n, inner) = w.finish();
        assert_eq!(
            (d, n, inner.as_slice()),
            (Digest::of(b"layer bytes"), 11, &b"layer bytes"[..])
        );
        let r = HashingReader::new(&b"layer bytes"[..]);
        assert_eq!(r.finish().unwrap(), Digest::of(b"layer bytes"));
    }
}
