//! Persisted safety state: the fencing-token floor per target and the idempotency records.
//!
//! Both live in one append-only journal (`<state_dir>/state.jsonl`), each record written and
//! `fsync`'d before the bridge acts on it. On start the journal is replayed and compacted
//! (written to a temporary file, fsync'd, renamed over, directory fsync'd).
//!
//! # Guarantees
//! - The floor of a target never decreases, across restarts.
//! - The floor is raised *before* the action runs, so a deposed leader's lower token is
//!   rejected even if the bridge crashed mid-action.
//! - An idempotency key is recorded as pending before acting and as done with its response
//!   after; a key found pending after a restart is never acted on again (its outcome is
//!   unknown and the caller must look at status and use a new key).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Errors of the state store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Filesystem error on the journal.
    #[error("state journal {path}")]
    Io {
        /// The journal or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A record in the middle of the journal is unreadable.
    #[error("state journal {path} is corrupt at line {line}")]
    Corrupt {
        /// The journal.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
    },
}

/// A response kept for idempotent replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// JSON body.
    pub body: Value,
}

/// What the store knows about an idempotency key.
#[derive(Debug, Clone, PartialEq)]
pub enum IdemEntry {
    /// The action was started but its result was never recorded (the bridge stopped).
    Pending {
        /// What the request was (`target action token`).
        fingerprint: String,
    },
    /// The action finished with this response.
    Done {
        /// What the request was (`target action token`).
        fingerprint: String,
        /// The first response.
        response: StoredResponse,
        /// When it finished (Unix seconds), for retention.
        at: u64,
    },
}

impl IdemEntry {
    /// The request fingerprint this key was first used with.
    pub fn fingerprint(&self) -> &str {
        match self {
            IdemEntry::Pending { fingerprint } | IdemEntry::Done { fingerprint, .. } => fingerprint,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Record {
    Floor {
        target: String,
        token: u64,
    },
    Pending {
        key: String,
        fingerprint: String,
    },
    Done {
        key: String,
        fingerprint: String,
        response: StoredResponse,
        #[serde(default)]
        at: u64,
    },
}

#[derive(Debug)]
struct Inner {
    file: File,
    floors: HashMap<String, u64>,
    idem: HashMap<String, IdemEntry>,
}

/// Outcome of [`Store::begin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The floor was raised (or equal) and the key recorded pending: go ahead.
    Proceed,
    /// The token is below the floor.
    Stale {
        /// The persisted floor.
        floor: u64,
    },
}

/// The persisted store.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    inner: Mutex<Inner>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Store {
    /// Opens (creating if needed) the journal in `dir`, replays and compacts it, dropping
    /// finished idempotency records older than `retention` (token floors and pending records
    /// are always kept).
    pub fn open(dir: &Path, retention: std::time::Duration) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join("state.jsonl");
        let mut floors = HashMap::new();
        let mut idem = HashMap::new();
        if path.exists() {
            let f = File::open(&path).map_err(io(&path))?;
            let lines: Vec<String> = BufReader::new(f)
                .lines()
                .collect::<Result<_, _>>()
                .map_err(io(&path))?;
            let n = lines.len();
            for (i, line) in lines.iter().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Record>(line) {
                    Ok(r) => apply(&mut floors, &mut idem, r),
                    // A torn final line is a write that never completed its fsync: ignore it.
                    Err(_) if i + 1 == n => {
                        tracing::warn!(path = %path.display(), "ignoring torn last journal line")
                    }
                    Err(_) => return Err(StoreError::Corrupt { path, line: i + 1 }),
                }
            }
        }
        let now = unix_now();
        idem.retain(|_, e| match e {
            IdemEntry::Done { at, .. } => at.saturating_add(retention.as_secs()) >= now,
            IdemEntry::Pending { .. } => true,
        });
        // Compact: snapshot to a temp file, fsync, rename, fsync the directory.
        let tmp = dir.join("state.jsonl.tmp");
        {
            let mut f = File::create(&tmp).map_err(io(&tmp))?;
            let mut buf = Vec::new();
            for (target, token) in &floors {
                push(
                    &mut buf,
                    &Record::Floor {
                        target: target.clone(),
                        token: *token,
                    },
                );
            }
            for (key, e) in &idem {
                let r = match e {
                    IdemEntry::Pending { fingerprint } => Record::Pending {
                        key: key.clone(),
                        fingerprint: fingerprint.clone(),
                    },
                    IdemEntry::Done {
                        fingerprint,
                        response,
                        at,
                    } => Record::Done {
                        key: key.clone(),
                        fingerprint: fingerprint.clone(),
                        response: response.clone(),
                        at: *at,
                    },
                };
                push(&mut buf, &r);
            }
            f.write_all(&buf).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        Ok(Self {
            path,
            inner: Mutex::new(Inner { file, floors, idem }),
        })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// The persisted token floor of `target` (0 if none).
    pub fn floor(&self, target: &str) -> u64 {
        self.lock().floors.get(target).copied().unwrap_or(0)
    }

    /// What is known about `key`.
    pub fn lookup(&self, key: &str) -> Option<IdemEntry> {
        self.lock().idem.get(key).cloned()
    }

    /// Checks `token` against the floor of `target`; if it is not lower, durably raises the
    /// floor to it and records `key` as pending, in one fsync'd write.
    pub fn begin(
        &self,
        target: &str,
        token: u64,
        key: &str,
        fingerprint: &str,
    ) -> Result<Begin, StoreError> {
        let mut inner = self.lock();
        let floor = inner.floors.get(target).copied().unwrap_or(0);
        // A negative control (debug builds only): act on a deposed controller's request.
        let planted =
            palisade_fence::planted::active(palisade_fence::planted::Planted::IgnoreStaleTokens);
        if token < floor && !planted {
            return Ok(Begin::Stale { floor });
        }
        let mut buf = Vec::new();
        if token > floor {
            push(
                &mut buf,
                &Record::Floor {
                    target: target.into(),
                    token,
                },
            );
        }
        push(
            &mut buf,
            &Record::Pending {
                key: key.into(),
                fingerprint: fingerprint.into(),
            },
        );
        inner.file.write_all(&buf).map_err(io(&self.path))?;
        inner.file.sync_data().map_err(io(&self.path))?;
        inner.floors.insert(target.into(), token.max(floor));
        inner.idem.insert(
            key.into(),
            IdemEntry::Pending {
                fingerprint: fingerprint.into(),
            },
        );
        Ok(Begin::Proceed)
    }

    /// Durably records the response of `key`.
    pub fn finish(
        &self,
        key: &str,
        fingerprint: &str,
        response: StoredResponse,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let mut buf = Vec::new();
        let at = unix_now();
        let r = Record::Done {
            key: key.into(),
            fingerprint: fingerprint.into(),
            response: response.clone(),
            at,
        };
        push(&mut buf, &r);
        inner.file.write_all(&buf).map_err(io(&self.path))?;
        inner.file.sync_data().map_err(io(&self.path))?;
        inner.idem.insert(
            key.into(),
            IdemEntry::Done {
                fingerprint: fingerprint.into(),
                response,
                at,
            },
        );
        Ok(())
    }
}

fn apply(floors: &mut HashMap<String, u64>, idem: &mut HashMap<String, IdemEntry>, r: Record) {
    match r {
        Record::Floor { target, token } => {
            let f = floors.entry(target).or_insert(0);
            *f = (*f).max(token);
        }
        Record::Pending { key, fingerprint } => {
            idem.insert(key, IdemEntry::Pending { fingerprint });
        }
        Record::Done {
            key,
            fingerprint,
            response,
            at,
        } => {
            idem.insert(
                key,
                IdemEntry::Done {
                    fingerprint,
                    response,
                    at,
                },
            );
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn push(buf: &mut Vec<u8>, r: &Record) {
    // Serializing these plain structs cannot fail.
    if let Ok(line) = serde_json::to_vec(r) {
        buf.extend_from_slice(&line);
        buf.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEEK: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

    #[test]
    fn floor_and_keys_survive_reopen_and_never_decrease() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), WEEK).unwrap();
        assert_eq!(s.begin("m0", 5, "k1", "m0 off 5").unwrap(), Begin::Proceed);
        assert_eq!(
            s.begin("m0", 4, "k2", "m0 off 4").unwrap(),
            Begin::Stale { floor: 5 }
        );
        assert_eq!(s.begin("m0", 5, "k3", "m0 on 5").unwrap(), Begin::Proceed);
        s.finish(
            "k1",
            "m0 off 5",
            StoredResponse {
                status: 200,
                body: Value::Null,
            },
        )
        .unwrap();
        drop(s);
        let s = Store::open(dir.path(), WEEK).unwrap();
        assert_eq!(s.floor("m0"), 5);
        assert!(matches!(s.lookup("k1"), Some(IdemEntry::Done { .. })));
        assert!(matches!(s.lookup("k3"), Some(IdemEntry::Pending { .. })));
        assert_eq!(s.lookup("k2"), None);
    }

    #[test]
    fn finished_keys_expire_after_retention_but_floors_and_pending_stay() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), WEEK).unwrap();
        s.begin("m0", 5, "done", "m0 off 5").unwrap();
        s.finish(
            "done",
            "m0 off 5",
            StoredResponse {
                status: 200,
                body: Value::Null,
            },
        )
        .unwrap();
        s.begin("m0", 5, "pending", "m0 on 5").unwrap();
        drop(s);
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("state.jsonl"))
            .unwrap()
            .write_all(b"{\"kind\":\"done\",\"key\":\"old\",\"fingerprint\":\"f\",\"response\":{\"status\":200,\"body\":null},\"at\":1}\n")
            .unwrap();
        let s = Store::open(dir.path(), WEEK).unwrap();
        assert_eq!(s.lookup("old"), None, "older than the retention");
        assert!(matches!(s.lookup("done"), Some(IdemEntry::Done { .. })));
        assert!(matches!(
            s.lookup("pending"),
            Some(IdemEntry::Pending { .. })
        ));
        assert_eq!(s.floor("m0"), 5);
    }

    #[test]
    fn torn_last_line_is_ignored_but_middle_corruption_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.jsonl");
        std::fs::write(
            &p,
            "{\"kind\":\"floor\",\"target\":\"m0\",\"token\":3}\n{\"kind\":\"flo",
        )
        .unwrap();
        assert_eq!(Store::open(dir.path(), WEEK).unwrap().floor("m0"), 3);
        std::fs::write(
            &p,
            "garbage\n{\"kind\":\"floor\",\"target\":\"m0\",\"token\":3}\n",
        )
        .unwrap();
        assert!(matches!(
            Store::open(dir.path(), WEEK),
            Err(StoreError::Corrupt { line: 1, .. })
        ));
    }
}
