//! The node's content-addressed image store, shared by every pod:
//!
//! ```text
//! <root>/blobs/sha256/<hex>         verified manifests and configs
//! <root>/images/<config hex>/       one unpacked image: rootfs/ and config.json (the
//!                                   directory store's format, so the pod worker reads both alike)
//! <root>/refs/<reference>.json      what a reference resolved to (RefRecord)
//! <root>/users/<config hex>/<uid>   the pods that resolved the image (for garbage collection)
//! ```
//!
//! Every write goes to a temporary name and is renamed into place, so a crash leaves either
//! the old or the new state, and two pulls of the same image cannot corrupt each other.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::digest::Digest;
use super::error::PullError;

/// What a reference resolved to on its last pull.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefRecord {
    /// The digest the registry served for the reference (index or manifest): the `imageID`.
    pub repo_digest: String,
    /// `registry/repository@<repo_digest>`.
    pub image_id: String,
    /// The config digest: the image's directory in the store.
    pub config_digest: String,
}

/// The store at a root directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// Opens (creating) the store.
    pub fn open(root: &Path) -> std::io::Result<Store> {
        for d in ["blobs/sha256", "images", "refs", "users", "tmp"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        Ok(Store {
            root: root.to_path_buf(),
        })
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of an image (holding `rootfs/` and `config.json`).
    pub fn image_dir(&self, config: &Digest) -> PathBuf {
        self.root.join("images").join(config.hex())
    }

    /// Whether the image is unpacked.
    pub fn has_image(&self, config: &Digest) -> bool {
        self.image_dir(config).join("rootfs").is_dir()
    }

    /// A fresh temporary path inside the store (same file system as its targets).
    pub fn temp_path(&self, what: &str) -> PathBuf {
        self.root
            .join("tmp")
            .join(format!("{what}-{:016x}", rand::random::<u64>()))
    }

    /// Stores a verified small blob (manifest, config).
    pub fn put_blob(&self, digest: &Digest, bytes: &[u8]) -> Result<(), PullError> {
        let path = self.root.join("blobs/sha256").join(digest.hex());
        let tmp = self.temp_path("blob");
        std::fs::write(&tmp, bytes).map_err(PullError::store(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(PullError::store(&path))
    }

    /// Moves an unpacked image (`dir` with `rootfs/` and `config.json`) into place; keeps the
    /// existing one if another pull got there first.
    pub fn commit_image(&self, config: &Digest, dir: &Path) -> Result<(), PullError> {
        let target = self.image_dir(config);
        if self.has_image(config) {
            let _ = std::fs::remove_dir_all(dir);
            return Ok(());
        }
        std::fs::rename(dir, &target).map_err(PullError::store(&target))
    }

    fn ref_path(&self, reference: &str) -> PathBuf {
        self.root
            .join("refs")
            .join(format!("{}.json", reference.replace(['/', ':', '@'], "_")))
    }

    /// Records what `reference` resolved to.
    pub fn put_ref(&self, reference: &str, rec: &RefRecord) -> Result<(), PullError> {
        let path = self.ref_path(reference);
        let tmp = self.temp_path("ref");
        let raw = serde_json::to_vec(rec).unwrap_or_default();
        std::fs::write(&tmp, raw).map_err(PullError::store(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(PullError::store(&path))
    }

    /// What `reference` resolved to, if its image is still in the store, with when it was
    /// recorded.
    pub fn get_ref(&self, reference: &str) -> Option<(RefRecord, SystemTime)> {
        let path = self.ref_path(reference);
        let raw = std::fs::read(&path).ok()?;
        let rec: RefRecord = serde_json::from_slice(&raw).ok()?;
        let config = Digest::parse(&rec.config_digest)?;
        let at = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
        self.has_image(&config).then_some((rec, at))
    }

    /// Records that pod `uid` uses the image.
    pub fn add_user(&self, config: &Digest, uid: &str) {
        let dir = self.root.join("users").join(config.hex());
        if std::fs::create_dir_all(&dir).is_ok() {
            let _ = std::fs::write(dir.join(uid), b"");
        }
    }

    /// Removes every image that no live pod uses and that was not resolved within `grace`
    /// (a pull for a pod whose record is not written yet must survive), with its refs.
    /// Returns the removed config digests.
    pub fn collect_garbage(
        &self,
        live: &HashSet<String>,
        grace: Duration,
        now: SystemTime,
    ) -> Vec<String> {
        let Ok(images) = std::fs::read_dir(self.root.join("images")) else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        for img in images.flatten() {
            let hex = img.file_name().to_string_lossy().to_string();
            let users_dir = self.root.join("users").join(&hex);
            let mut newest = img.metadata().and_then(|m| m.modified()).unwrap_or(now);
            let mut used = false;
            for u in std::fs::read_dir(&users_dir)
                .into_iter()
                .flatten()
                .flatten()
            {
                let uid = u.file_name().to_string_lossy().to_string();
                if live.contains(&uid) {
                    used = true;
                } else {
                    if let Ok(t) = u.metadata().and_then(|m| m.modified()) {
                        newest = newest.max(t);
                    }
                    let _ = std::fs::remove_file(u.path());
                }
            }
            let recent = now.duration_since(newest).unwrap_or_default() < grace;
            if used || recent {
                continue;
            }
            // Refs first: a reader that finds no ref pulls again instead of using a half-removed image.
            let config = format!("sha256:{hex}");
            for r in std::fs::read_dir(self.root.join("refs"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let points_here = std::fs::read(r.path())
                    .ok()
                    .and_then(|raw| serde_json::from_slice::<RefRecord>(&raw).ok())
                    .is_some_and(|rec| rec.config_digest == config);
                if points_here {
                    let _ = std::fs::remove_file(r.path());
                }
            }
            let doomed = self.temp_path("gc");
            if std::fs::rename(img.path(), &doomed).is_ok() {
                let _ = std::fs::remove_dir_all(&doomed);
                let _ = std::fs::remove_dir_all(&users_dir);
                let _ = std::fs::remove_file(self.root.join("blobs/sha256").join(&hex));
                removed.push(config);
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(store: &Store, tag: &str) -> Digest {
        let config = Digest::of(tag.as_bytes());
        let dir = store.temp_path("img");
        std::fs::create_dir_all(dir.join("rootfs")).unwrap();
        store.commit_image(&config, &dir).unwrap();
        let rec = RefRecord {
            repo_digest: config.to_string(),
            image_id: format!("r/a@{config}"),
            config_digest: config.to_string(),
        };
        store.put_ref(tag, &rec).unwrap();
        config
    }

    #[test]
    fn garbage_collection_keeps_images_live_pods_use_and_recent_pulls() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let used = image(&store, "r/a:used");
        let unused = image(&store, "r/a:unused");
        store.add_user(&used, "pod-live");
        store.add_user(&unused, "pod-gone");
        let live: HashSet<String> = ["pod-live".to_string()].into();
        let now = SystemTime::now();
        // Within the grace period nothing goes.
        assert!(store
            .collect_garbage(&live, Duration::from_secs(600), now)
            .is_empty());
        let later = now + Duration::from_secs(3600);
        assert_eq!(
            store.collect_garbage(&live, Duration::from_secs(600), later),
            vec![unused.to_string()]
        );
        assert!(store.get_ref("r/a:used").is_some());
        assert!(store.get_ref("r/a:unused").is_none());
        assert!(!store.has_image(&unused));
    }
}
