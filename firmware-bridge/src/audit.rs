//! The append-only audit log: one JSON object per line, `fsync`'d per record.
//!
//! Records say who (client identity), what (action), which target, the fencing token and
//! idempotency key, the result, the evidence and the duration. They are built only from
//! request metadata and executor evidence; credentials never reach this module.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// Errors of the audit log.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// Filesystem error.
    #[error("audit log {path}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

pub use palisade_fence::bridge::AuditRecord;

/// The audit log file.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    /// Opens `path` for appending (mode 0600 when created; existing content is kept).
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        let err = |source| AuditError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        })
    }

    /// Appends one record and fsyncs it.
    pub fn append(&self, rec: &AuditRecord) -> Result<(), AuditError> {
        let err = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        let mut line = serde_json::to_vec(rec)
            .map_err(|e| err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        line.push(b'\n');
        let mut f = self.file.lock();
        f.write_all(&line).map_err(err)?;
        f.sync_data().map_err(err)
    }

    /// Reads the most recent `limit` records whose target is in `scope` (`"*"` = all) and,
    /// if given, equal to `target`. Unparseable lines are skipped.
    pub fn read(
        &self,
        scope: &BTreeSet<String>,
        target: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, AuditError> {
        let err = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        let f = File::open(&self.path).map_err(err)?;
        let all = scope.contains("*");
        let mut out: Vec<AuditRecord> = BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str::<AuditRecord>(&l).ok())
            .filter(|r| all || scope.contains(&r.target))
            .filter(|r| target.is_none_or(|t| r.target == t))
            .collect();
        let skip = out.len().saturating_sub(limit);
        out.drain(..skip);
        Ok(out)
    }
}
