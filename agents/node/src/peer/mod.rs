//! The peer check: a node that cannot renew its Lease asks its peers whether they can reach
//! the API, so that a control-plane outage does not self-fence every stateful pod.
//!
//! A node that cannot renew asks every other node (over the node network, authenticated with a
//! shared [`PeerKey`]) "can you reach the API?". A peer *vouches* at instant `a` only when it
//! has sent no Lease write attempt since `a - vouch_after` ([`may_vouch`], fed by the
//! [`WriteClock`]). When a strict majority of the Node list (this node counting as one voter
//! when it may vouch itself) has vouched, the node is *excused* and neither self-fences nor
//! stops petting its watchdog ([`Excuse`]).
//!
//! Why that is safe: the controller counts a node healthy only on Lease writes it observed
//! recently, within a window smaller than `vouch_after`, so a vouching peer is never one the
//! controller counts healthy at the instant it vouches. The controller trusts a silent node's
//! self-fence only after it has seen a healthy strict majority continuously for
//! `answer_valid` + 2 × watchdog + margin; two strict majorities intersect, so while the node is
//! excused the controller cannot have seen that majority for long enough. Hence an answer is
//! valid for `answer_valid` after its *request was sent* (and no longer, whatever the peer
//! answers later).
//!
//! The members counted are those of the Node list the agent last advertised with a successful
//! renewal ([`members`]), the very set the controller judges the node's excuse against.
//!
//! Modules: [`excuse`] is the pure majority arithmetic; `wire` is the line protocol (one
//! HMAC-signed JSON line each way); `server` answers peers ([`serve`]); `client` asks them
//! ([`poll`]); `nodes` keeps the peer set ([`node_list_loop`]); [`members`] the list counted;
//! [`args`] the flags the node agent and the companion share.

pub mod args;
mod client;
pub mod excuse;
pub mod members;
mod nodes;
mod server;
mod wire;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::Sha256;
use tokio::time::Instant;

pub use client::poll;
pub use excuse::Excuse;
pub use members::MemberBook;
pub use nodes::node_list_loop;
pub use server::serve;

/// The shortest accepted [`PeerKey`], in bytes.
pub const MIN_KEY_LEN: usize = 32;

/// Where the agent reads the [`PeerKey`] when no `--peer-key-file` is given.
pub const DEFAULT_KEY_FILE: &str = "/etc/palisade-node/peer.key";

/// The random bytes in a key that [`generate_key_file`] writes (hex-encoded, so the file holds
/// twice as many key bytes).
pub const GENERATED_KEY_RANDOM_BYTES: usize = 32;

/// Errors of the peer check.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The key file could not be read.
    #[error("reading peer key {path}: {source}")]
    KeyRead {
        /// The key file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A new key file could not be written (it exists already, or its directory does not).
    #[error("writing peer key {path}: {source}")]
    KeyWrite {
        /// The key file.
        path: PathBuf,
        /// The I/O error (`AlreadyExists` when the file was there before).
        #[source]
        source: std::io::Error,
    },
    /// The key is shorter than [`MIN_KEY_LEN`].
    #[error("peer key is {len} bytes; at least {MIN_KEY_LEN} are required")]
    KeyTooShort {
        /// Its length after trimming a trailing newline.
        len: usize,
    },
    /// Connecting, reading or writing failed.
    #[error("peer {peer}: {source}")]
    Io {
        /// The peer (node name, or the remote address on the server side).
        peer: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The exchange took longer than its timeout.
    #[error("peer {peer}: timed out")]
    Timeout {
        /// The peer.
        peer: String,
    },
    /// A line longer than the protocol's limit.
    #[error("peer {peer}: line longer than {} bytes", wire::MAX_LINE)]
    Oversize {
        /// The peer.
        peer: String,
    },
    /// A line that is not a valid message (bad JSON, version, nonce, or no newline).
    #[error("peer {peer}: malformed message: {reason}")]
    Malformed {
        /// The peer.
        peer: String,
        /// What was wrong.
        reason: String,
    },
    /// The MAC did not verify: a different key, or a tampered message.
    #[error("peer {peer}: bad MAC")]
    BadMac {
        /// The peer.
        peer: String,
    },
    /// An authentic message that is not the one expected (names or nonce differ).
    #[error("peer {peer}: unexpected {field}")]
    Mismatch {
        /// The peer.
        peer: String,
        /// The field that differed.
        field: &'static str,
    },
}

/// The shared secret of the peer protocol: every agent of a cluster holds the same one.
///
/// Guarantees: the key is never logged; `Debug` prints `<redacted>`, and only the keyed HMAC
/// state is kept, not the raw bytes.
#[derive(Clone)]
pub struct PeerKey(Hmac<Sha256>);

impl PeerKey {
    /// Reads the key from `path` (one trailing newline is ignored). Warns when the file is
    /// world-readable.
    pub fn from_file(path: &Path) -> Result<PeerKey, PeerError> {
        let read_err = |source| PeerError::KeyRead {
            path: path.to_path_buf(),
            source,
        };
        let bytes = std::fs::read(path).map_err(read_err)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .map_err(read_err)?
                .permissions()
                .mode();
            if mode & 0o004 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "peer key file is world-readable");
            }
        }
        PeerKey::from_bytes(&bytes)
    }

    /// Builds the key from `b` (one trailing `\n` or `\r\n` is ignored). At least
    /// [`MIN_KEY_LEN`] bytes.
    pub fn from_bytes(b: &[u8]) -> Result<PeerKey, PeerError> {
        let b = b.strip_suffix(b"\n").unwrap_or(b);
        let b = b.strip_suffix(b"\r").unwrap_or(b);
        if b.len() < MIN_KEY_LEN {
            return Err(PeerError::KeyTooShort { len: b.len() });
        }
        let mac = Hmac::<Sha256>::new_from_slice(b)
            .map_err(|_| PeerError::KeyTooShort { len: b.len() })?;
        Ok(PeerKey(mac))
    }

    /// HMAC-SHA256 of `msg`, hex-encoded.
    fn sign(&self, msg: &[u8]) -> String {
        let mut m = self.0.clone();
        m.update(msg);
        hex::encode(m.finalize().into_bytes())
    }

    /// Whether `mac_hex` is the MAC of `msg`, compared in constant time.
    fn verify(&self, msg: &[u8], mac_hex: &str) -> bool {
        let Ok(tag) = hex::decode(mac_hex) else {
            return false;
        };
        let mut m = self.0.clone();
        m.update(msg);
        m.verify_slice(&tag).is_ok()
    }
}

/// Writes a fresh key file at `path`: [`GENERATED_KEY_RANDOM_BYTES`] bytes from the operating
/// system's random source, hex-encoded, and a newline (what `openssl rand -hex 32` writes).
///
/// Guarantees: never replaces or follows an existing file or symlink at `path` (it is created
/// with `O_EXCL`; an existing one is [`PeerError::KeyWrite`] with `AlreadyExists`, left as it
/// was); the file is created with mode 0600 (the umask can only narrow it) and synced before
/// this returns; a file whose write failed is removed, so no short key is left behind; the key
/// reads back with [`PeerKey::from_file`].
///
/// Assumptions: the directory exists. Every node must get a copy of this one file: keys
/// generated separately on each node differ, and peers with different keys never vouch for
/// each other.
pub fn generate_key_file(path: &Path) -> Result<(), PeerError> {
    use rand::TryRng;
    use std::io::Write;
    let write_err = |source| PeerError::KeyWrite {
        path: path.to_path_buf(),
        source,
    };
    let mut secret = [0u8; GENERATED_KEY_RANDOM_BYTES];
    rand::rngs::SysRng
        .try_fill_bytes(&mut secret)
        .map_err(|e| write_err(std::io::Error::other(e)))?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(write_err)?;
    let written = f
        .write_all(format!("{}\n", hex::encode(secret)).as_bytes())
        .and_then(|()| f.sync_all());
    if let Err(e) = written {
        drop(f);
        let _ = std::fs::remove_file(path);
        return Err(write_err(e));
    }
    Ok(())
}

impl fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The peer check's settings.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// This node's name.
    pub node: String,
    /// Every agent listens on `<its InternalIP>:port`; peers are reached on
    /// `<their InternalIP>:port`.
    pub port: u16,
    /// A: a peer vouches only when it has sent no Lease write attempt for this long.
    pub vouch_after: Duration,
    /// C: how long an answer counts, measured from when its request was sent.
    pub answer_valid: Duration,
    /// How often to ask the peers while asking is needed.
    pub poll_interval: Duration,
    /// The budget of one request to one peer (connect, write and read).
    pub request_timeout: Duration,
}

/// One peer from the last Node list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The Node's name.
    pub name: String,
    /// Its InternalIP; [`Peer::NO_ADDR`] (`0.0.0.0`) when the Node has none: it then counts as
    /// a member but is never asked.
    pub addr: IpAddr,
}

impl Peer {
    /// The address of a Node without an InternalIP.
    pub const NO_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

    /// Whether the peer has an address to ask.
    pub fn reachable(&self) -> bool {
        !self.addr.is_unspecified()
    }
}

/// The write clock: the instant of the last Lease write attempt this agent *sent*, whatever
/// its outcome.
///
/// Assumptions: the lease loop calls [`WriteClock::record_write`] immediately before sending
/// each PUT or POST of its Lease. The clock starts at "now" because a previous incarnation of
/// the agent may have written just before this one started.
#[derive(Clone, Debug)]
pub struct WriteClock(Arc<Mutex<Instant>>);

impl WriteClock {
    /// A clock whose last write is now.
    pub fn new() -> Self {
        WriteClock(Arc::new(Mutex::new(Instant::now())))
    }

    /// A clock whose last write was at `at` (tests only: real agents start at now).
    #[cfg(test)]
    pub(crate) fn starting_at(at: Instant) -> Self {
        WriteClock(Arc::new(Mutex::new(at)))
    }

    /// Records a write attempt about to be sent.
    pub fn record_write(&self) {
        let now = Instant::now();
        let mut last = self.0.lock();
        *last = (*last).max(now);
    }

    /// The instant of the last write attempt.
    pub fn last_write(&self) -> Instant {
        *self.0.lock()
    }
}

impl Default for WriteClock {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether this agent may vouch at `now`: it has sent no Lease write attempt since
/// `now - vouch_after`.
///
/// Guarantees: true only when `now - last_write` is strictly greater than `vouch_after` (a
/// write exactly `vouch_after` ago still forbids vouching, and a `last_write` after `now`
/// forbids it too).
pub fn may_vouch(last_write: Instant, now: Instant, vouch_after: Duration) -> bool {
    now.checked_duration_since(last_write)
        .is_some_and(|d| d > vouch_after)
}

/// The poller's output: the instant until which the node is excused (`None`: not excused).
/// The fence monitor and the watchdog loop read it on every tick and compare it with now.
pub type ExcuseRx = tokio::sync::watch::Receiver<Option<Instant>>;

/// Counters of the peer check.
#[derive(Debug, Default)]
pub struct PeerMetrics {
    /// Requests to peers answered with a vouch.
    pub requests_vouch: AtomicU64,
    /// Requests to peers answered without a vouch.
    pub requests_no_vouch: AtomicU64,
    /// Requests to peers that failed (I/O, timeout, bad or unexpected answer).
    pub requests_error: AtomicU64,
    /// Answers this agent gave with a vouch.
    pub answers_vouch: AtomicU64,
    /// Answers this agent gave without a vouch.
    pub answers_no_vouch: AtomicU64,
    /// Requests this agent refused to answer (bad MAC, garbage, oversize, wrong node, slow).
    pub rejected: AtomicU64,
    /// 1 while the poller last published an excuse, else 0.
    pub excused: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_generated_key_file_is_private_loadable_fresh_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.key"), dir.path().join("b.key"));
        generate_key_file(&a).unwrap();
        generate_key_file(&b).unwrap();
        let text = std::fs::read_to_string(&a).unwrap();
        assert_eq!(text.len(), 2 * GENERATED_KEY_RANDOM_BYTES + 1, "{text:?}");
        assert!(text.ends_with('\n') && text.trim_end().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(text, std::fs::read_to_string(&b).unwrap());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&a).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        }
        PeerKey::from_file(&a).unwrap();
        // An existing file, whatever it holds, is left as it was.
        match generate_key_file(&a) {
            Err(PeerError::KeyWrite { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists)
            }
            other => panic!("overwrote an existing key: {other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&a).unwrap(), text);
        assert!(generate_key_file(&dir.path().join("missing/c.key")).is_err());
    }

    #[test]
    fn may_vouch_only_strictly_after_vouch_after_without_writes() {
        let t0 = Instant::now();
        let a = 10 * S;
        for (since, want) in [
            (Duration::ZERO, false),
            (5 * S, false),
            (a, false),
            (a + Duration::from_nanos(1), true),
            (30 * S, true),
        ] {
            assert_eq!(may_vouch(t0, t0 + since, a), want, "since {since:?}");
        }
        // A write "after" now (clock races) forbids vouching.
        assert!(!may_vouch(t0 + S, t0, a));
    }

    #[test]
    fn key_is_at_least_32_bytes_after_trimming_one_newline() {
        assert!(matches!(
            PeerKey::from_bytes(&[b'k'; 31]),
            Err(PeerError::KeyTooShort { len: 31 })
        ));
        let mut b = vec![b'k'; 31];
        b.push(b'\n');
        assert!(PeerKey::from_bytes(&b).is_err());
        assert!(PeerKey::from_bytes(&[b'k'; 32]).is_ok());
        // The trailing newline is not part of the key.
        let a = PeerKey::from_bytes(&[b'k'; 32]).unwrap();
        let mut b = vec![b'k'; 32];
        b.extend_from_slice(b"\r\n");
        let b = PeerKey::from_bytes(&b).unwrap();
        assert_eq!(a.sign(b"m"), b.sign(b"m"));
    }

    #[test]
    fn key_debug_is_redacted_and_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let secret = "s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr3t";
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        let key = PeerKey::from_file(&path).unwrap();
        assert_eq!(format!("{key:?}"), "<redacted>");
        assert_eq!(
            key.sign(b"m"),
            PeerKey::from_bytes(secret.as_bytes()).unwrap().sign(b"m")
        );
        assert!(matches!(
            PeerKey::from_file(&dir.path().join("missing")),
            Err(PeerError::KeyRead { .. })
        ));
    }

    #[test]
    fn write_clock_records_the_latest_attempt() {
        let c = WriteClock::starting_at(Instant::now() - 60 * S);
        assert!(may_vouch(c.last_write(), Instant::now(), 10 * S));
        c.record_write();
        assert!(!may_vouch(c.last_write(), Instant::now(), 10 * S));
    }
}
