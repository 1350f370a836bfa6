//! Durable agent state: one JSON record per pod worker under `<state-dir>/pods/`, written
//! atomically (temp file + rename), so a restarted agent knows what it was doing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Errors of the state store.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file could not be read or written.
    #[error("state {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// What a pod worker was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WorkerPhase {
    /// Running the pod's containers.
    Syncing,
    /// Stopping the pod's containers. A restarted agent starts termination over with the
    /// full grace period.
    Terminating,
    /// Every container is stopped; only the final status and delete may remain.
    Terminated,
}

/// One container of a pod, as recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerRecord {
    /// The current runtime container id, if any.
    pub id: Option<String>,
    /// Restart count.
    pub restart_count: i32,
    /// The next attempt number.
    pub next_attempt: u32,
    /// For a regular init container: it completed successfully.
    pub init_done: bool,
}

/// One pod, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodRecord {
    /// Pod UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Worker phase.
    pub phase: WorkerPhase,
    /// The pod's containers were SIGKILLed by self-fencing and must not restart until the
    /// API confirms the pod still belongs here.
    pub fenced: bool,
    /// Containers by name.
    pub containers: BTreeMap<String, ContainerRecord>,
    /// Whether the pod uses a PersistentVolumeClaim (what puts it in a `Stateful` self-fence's
    /// scope), as its worker read it from the pod; `None` in records written before the field
    /// existed. The runtime-level self-fence sweep ([`crate::self_fence`]) reads it for
    /// containers no worker fences; anything but `Some(false)` counts as in scope.
    #[serde(default)]
    pub uses_pvc: Option<bool>,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    /// Opens (creating) `<state_dir>/pods`.
    pub fn open(state_dir: &Path) -> Result<Self, StateError> {
        let dir = state_dir.join("pods");
        std::fs::create_dir_all(&dir).map_err(|source| StateError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Self { dir })
    }

    fn path(&self, uid: &str) -> PathBuf {
        self.dir.join(format!("{uid}.json"))
    }

    /// Writes a record atomically.
    pub fn save(&self, rec: &PodRecord) -> Result<(), StateError> {
        let path = self.path(&rec.uid);
        let tmp = path.with_extension("tmp");
        let raw = serde_json::to_vec_pretty(rec).map_err(|e| StateError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(&tmp, raw).map_err(|source| StateError::Io {
            path: tmp.clone(),
            source,
        })?;
        std::fs::rename(&tmp, &path).map_err(|source| StateError::Io { path, source })
    }

    /// Deletes a record.
    pub fn remove(&self, uid: &str) -> Result<(), StateError> {
        match std::fs::remove_file(self.path(uid)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StateError::Io {
                path: self.path(uid),
                source,
            }),
        }
    }

    /// Reads one record.
    pub fn load(&self, uid: &str) -> Option<PodRecord> {
        let raw = std::fs::read(self.path(uid)).ok()?;
        serde_json::from_slice(&raw).ok()
    }

    /// Every record.
    pub fn all(&self) -> Vec<PodRecord> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        rd.flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
            .collect()
    }

    /// The directory of a pod's volumes.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.dir.join(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let s = StateStore::open(d.path()).unwrap();
        let mut rec = PodRecord {
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "p".into(),
            phase: WorkerPhase::Terminating,
            fenced: true,
            containers: BTreeMap::new(),
            uses_pvc: Some(true),
        };
        rec.containers.insert(
            "c".into(),
            ContainerRecord {
                id: Some("u1_c_0".into()),
                restart_count: 2,
                next_attempt: 3,
                init_done: false,
            },
        );
        s.save(&rec).unwrap();
        assert_eq!(s.load("u1"), Some(rec.clone()));
        assert_eq!(s.all(), vec![rec]);
        s.remove("u1").unwrap();
        assert!(s.all().is_empty());
        s.remove("u1").unwrap();
    }

    #[test]
    fn a_record_written_before_uses_pvc_existed_reads_as_unknown() {
        let old = r#"{"uid":"u1","namespace":"ns","name":"p","phase":"Syncing","fenced":false,"containers":{}}"#;
        let rec: PodRecord = serde_json::from_str(old).unwrap();
        assert_eq!(rec.uses_pvc, None);
    }
}
