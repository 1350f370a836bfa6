//! Durable append-only volumes: one file per volume, each entry checksummed and fsynced before
//! the append returns.
//!
//! On-disk entry: `u32 body length | first 8 bytes of SHA-256(body) | body`, where body is the
//! record's wire encoding ([`StoredRecord`]). On open, a torn or corrupt tail (a crash in the
//! middle of an append, which was therefore never acknowledged) is cut off.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::error::VolumeError;
use crate::protocol::{Cursor, StoredRecord};

/// File name suffix of volume files.
pub const SUFFIX: &str = ".vol";

/// Checks a volume name: 1..=63 characters of `[a-z0-9-]`.
pub fn validate_name(name: &str) -> Result<(), VolumeError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(VolumeError::InvalidName {
            name: name.to_owned(),
        })
    }
}

fn checksum(body: &[u8]) -> [u8; 8] {
    let d = Sha256::digest(body);
    let mut out = [0u8; 8];
    out.copy_from_slice(&d[..8]);
    out
}

/// Parses a volume file's bytes. Returns the records and the length of the valid prefix.
pub fn parse_entries(bytes: &[u8]) -> (Vec<StoredRecord>, usize) {
    let mut records = Vec::new();
    let mut pos = 0usize;
    while bytes.len() - pos >= 12 {
        let len = u32::from_be_bytes([bytes[pos], bytes[pos + 1], bytes[pos + 2], bytes[pos + 3]])
            as usize;
        let Some(end) = (pos + 12).checked_add(len).filter(|e| *e <= bytes.len()) else {
            break;
        };
        let body = &bytes[pos + 12..end];
        if checksum(body) != bytes[pos + 4..pos + 12] {
            break;
        }
        let mut c = Cursor::new(body);
        match StoredRecord::decode_from(&mut c) {
            Ok(r) if c.finish().is_ok() && r.offset == records.len() as u64 => records.push(r),
            _ => break,
        }
        pos = end;
    }
    (records, pos)
}

/// Reads all records of a volume file (for the checker reading a volume directly).
pub fn read_file(path: &Path) -> std::io::Result<Vec<StoredRecord>> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    Ok(parse_entries(&bytes).0)
}

/// One open volume.
#[derive(Debug)]
pub struct Volume {
    name: String,
    path: PathBuf,
    file: File,
    valid_len: u64,
    records: Vec<StoredRecord>,
}

impl Volume {
    fn io(&self, source: std::io::Error) -> VolumeError {
        VolumeError::Io {
            name: self.name.clone(),
            path: self.path.clone(),
            source,
        }
    }

    /// Opens (or creates) a volume file, cutting off a torn tail.
    pub fn open(dir: &Path, name: &str) -> Result<Self, VolumeError> {
        validate_name(name)?;
        let path = dir.join(format!("{name}{SUFFIX}"));
        let io = |source| VolumeError::Io {
            name: name.to_owned(),
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let (records, valid) = parse_entries(&bytes);
        if valid < bytes.len() {
            tracing::warn!(
                volume = name,
                cut = bytes.len() - valid,
                "cutting torn tail of volume file (an unacknowledged append)"
            );
            file.set_len(valid as u64).map_err(io)?;
        }
        file.sync_all().map_err(io)?;
        Ok(Volume {
            name: name.to_owned(),
            path,
            file,
            valid_len: valid as u64,
            records,
        })
    }

    /// Appends a record and makes it durable.
    ///
    /// Guarantees: when this returns `Ok(offset)`, the record is written and `fdatasync`ed.
    /// On error nothing is acknowledged and the file is trimmed back to its last valid entry.
    pub fn append(
        &mut self,
        client: &str,
        server_ms: u64,
        payload: Vec<u8>,
    ) -> Result<u64, VolumeError> {
        let record = StoredRecord {
            offset: self.records.len() as u64,
            server_ms,
            client: client.to_owned(),
            payload,
        };
        let mut body = Vec::with_capacity(record.payload.len() + 64);
        record.encode_into(&mut body);
        let mut entry = Vec::with_capacity(body.len() + 12);
        entry.extend_from_slice(&(body.len() as u32).to_be_bytes());
        entry.extend_from_slice(&checksum(&body));
        entry.extend_from_slice(&body);
        let res = self
            .file
            .write_all(&entry)
            .and_then(|_| self.file.sync_data());
        if let Err(e) = res {
            let _ = self.file.set_len(self.valid_len);
            return Err(self.io(e));
        }
        self.valid_len += entry.len() as u64;
        let offset = record.offset;
        self.records.push(record);
        Ok(offset)
    }

    /// Records from `from`, at most `max`.
    pub fn read(&self, from: u64, max: u32) -> Vec<StoredRecord> {
        self.records
            .iter()
            .skip(from.min(usize::MAX as u64) as usize)
            .take(max as usize)
            .cloned()
            .collect()
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.records.len() as u64
    }

    /// True when the volume holds no records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// All volumes under one directory.
#[derive(Debug)]
pub struct VolumeStore {
    dir: PathBuf,
    volumes: Mutex<BTreeMap<String, Arc<Mutex<Volume>>>>,
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl VolumeStore {
    /// Opens every `*.vol` file in `dir` (creating `dir`).
    pub fn open(dir: &Path) -> Result<Self, VolumeError> {
        let io = |source| VolumeError::Io {
            name: "*".into(),
            path: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut volumes = BTreeMap::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let fname = entry.file_name().to_string_lossy().into_owned();
            if let Some(name) = fname.strip_suffix(SUFFIX) {
                if validate_name(name).is_ok() {
                    let v = Volume::open(dir, name)?;
                    volumes.insert(name.to_owned(), Arc::new(Mutex::new(v)));
                }
            }
        }
        Ok(VolumeStore {
            dir: dir.to_owned(),
            volumes: Mutex::new(volumes),
        })
    }

    /// Creates a volume (idempotent); the file and directory entry are fsynced.
    pub fn create(&self, name: &str) -> Result<(), VolumeError> {
        validate_name(name)?;
        let mut vols = self.volumes.lock();
        if vols.contains_key(name) {
            return Ok(());
        }
        let v = Volume::open(&self.dir, name)?;
        sync_dir(&self.dir).map_err(|source| VolumeError::Io {
            name: name.to_owned(),
            path: self.dir.clone(),
            source,
        })?;
        vols.insert(name.to_owned(), Arc::new(Mutex::new(v)));
        Ok(())
    }

    /// Looks a volume up.
    pub fn get(&self, name: &str) -> Result<Arc<Mutex<Volume>>, VolumeError> {
        self.volumes
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| VolumeError::Unknown {
                name: name.to_owned(),
            })
    }

    /// Volume names and record counts.
    pub fn list(&self) -> Vec<(String, u64)> {
        let vols = self.volumes.lock();
        vols.iter()
            .map(|(n, v)| (n.clone(), v.lock().len()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_survive_reopen_and_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut v = Volume::open(dir.path(), "vol-a").unwrap();
            assert_eq!(v.append("10.0.0.1", 1, b"one".to_vec()).unwrap(), 0);
            assert_eq!(v.append("10.0.0.1", 2, b"two".to_vec()).unwrap(), 1);
        }
        // Simulate a crash in the middle of a third append.
        let path = dir.path().join("vol-a.vol");
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[0, 0, 0, 50, 1, 2, 3]).unwrap();
        drop(f);
        let mut v = Volume::open(dir.path(), "vol-a").unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v.read(1, 10)[0].payload, b"two");
        assert_eq!(v.append("10.0.0.2", 3, b"three".to_vec()).unwrap(), 2);
        let all = read_file(&path).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[2].client, "10.0.0.2");
    }

    #[test]
    fn corrupt_checksum_stops_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = Volume::open(dir.path(), "v").unwrap();
        v.append("c", 1, b"aaaa".to_vec()).unwrap();
        v.append("c", 2, b"bbbb".to_vec()).unwrap();
        let mut bytes = std::fs::read(dir.path().join("v.vol")).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        let (records, valid) = parse_entries(&bytes);
        assert_eq!(records.len(), 1);
        assert!(valid < bytes.len());
    }

    #[test]
    fn names_are_validated_and_store_reloads() {
        assert!(validate_name("web-0").is_ok());
        for bad in ["", "Web", "a/b", "..", "a_b", &"x".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let store = VolumeStore::open(dir.path()).unwrap();
        store.create("data").unwrap();
        store.create("data").unwrap();
        assert!(store.get("nope").is_err());
        store
            .get("data")
            .unwrap()
            .lock()
            .append("c", 1, b"x".to_vec())
            .unwrap();
        drop(store);
        let store = VolumeStore::open(dir.path()).unwrap();
        assert_eq!(store.list(), vec![("data".to_owned(), 1)]);
    }
}
