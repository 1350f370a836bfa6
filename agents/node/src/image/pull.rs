//! One pull: resolve the reference to a manifest (choosing `linux/amd64` from an index),
//! fetch the config and every layer, verify each against its digest (and each layer's
//! uncompressed content against the config's diff ID), unpack into a new directory, and
//! move it into the store. Nothing unverified is ever stored or run.

use std::io::Write;
use std::path::Path;

use super::digest::{Digest, HashingWriter};
use super::error::PullError;
use super::manifest::{self, Fetched, ImageConfigFile, StoreConfig};
use super::reference::Reference;
use super::registry::RegistryApi;
use super::store::{RefRecord, Store};
use super::unpack::{apply_layer, Compression};

/// Pulls `r` into `store` and records the reference.
pub async fn pull(
    api: &dyn RegistryApi,
    store: &Store,
    r: &Reference,
) -> Result<RefRecord, PullError> {
    let top = api.manifest(r, &r.manifest_reference()).await?;
    let repo_digest = Digest::of(&top.body);
    if let Some(pinned) = &r.digest {
        verify("manifest", pinned, &repo_digest)?;
    }
    let manifest = match manifest::parse(top.content_type.as_deref(), &top.body)? {
        Fetched::Manifest(m) => m,
        Fetched::Index(idx) => {
            let d = manifest::select_platform(&idx)?;
            let want = parse_digest("manifest", &d.digest)?;
            let m = api.manifest(r, &d.digest).await?;
            verify("manifest", &want, &Digest::of(&m.body))?;
            match manifest::parse(m.content_type.as_deref(), &m.body)? {
                Fetched::Manifest(m) => m,
                Fetched::Index(_) => {
                    return Err(PullError::Malformed {
                        what: "index".into(),
                        message: "an index entry is another index".into(),
                    })
                }
            }
        }
    };
    store.put_blob(&repo_digest, &top.body)?;
    let config_digest = parse_digest("config", &manifest.config.digest)?;
    if !store.has_image(&config_digest) {
        let mut raw = HashingWriter::new(Vec::new());
        api.blob(r, &manifest.config.digest, &mut raw).await?;
        let (got, _, raw) = raw.finish();
        verify("config", &config_digest, &got)?;
        let config: ImageConfigFile =
            serde_json::from_slice(&raw).map_err(|e| PullError::Malformed {
                what: "image config".into(),
                message: e.to_string(),
            })?;
        if !config.os.is_empty()
            && (config.os != manifest::OS || config.architecture != manifest::ARCHITECTURE)
        {
            return Err(PullError::NoPlatform {
                available: format!("{}/{}", config.os, config.architecture),
            });
        }
        if config.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(PullError::Malformed {
                what: "image config".into(),
                message: format!(
                    "{} diff IDs for {} layers",
                    config.rootfs.diff_ids.len(),
                    manifest.layers.len()
                ),
            });
        }
        store.put_blob(&config_digest, &raw)?;
        let dir = store.temp_path("unpack");
        let result = unpack_all(api, store, r, &manifest.layers, &config, &dir).await;
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        store.commit_image(&config_digest, &dir)?;
    }
    let rec = RefRecord {
        image_id: r.with_digest(&repo_digest),
        repo_digest: repo_digest.to_string(),
        config_digest: config_digest.to_string(),
    };
    store.put_ref(&r.to_string(), &rec)?;
    Ok(rec)
}

async fn unpack_all(
    api: &dyn RegistryApi,
    store: &Store,
    r: &Reference,
    layers: &[manifest::Descriptor],
    config: &ImageConfigFile,
    dir: &Path,
) -> Result<(), PullError> {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).map_err(PullError::store(&rootfs))?;
    for (layer, diff_id) in layers.iter().zip(&config.rootfs.diff_ids) {
        let want = parse_digest("layer", &layer.digest)?;
        let want_diff = parse_digest("layer diff ID", diff_id)?;
        let blob = store.temp_path("layer");
        let file = std::fs::File::create(&blob).map_err(PullError::store(&blob))?;
        let mut w = HashingWriter::new(std::io::BufWriter::new(file));
        let fetched = api.blob(r, &layer.digest, &mut w).await;
        let (got, _, mut inner) = w.finish();
        let flushed = inner.flush();
        drop(inner);
        let checked = fetched
            .and_then(|()| flushed.map_err(PullError::store(&blob)))
            .and_then(|()| verify(&format!("layer {}", layer.digest), &want, &got));
        if let Err(e) = checked {
            let _ = std::fs::remove_file(&blob);
            return Err(e);
        }
        let compression = Compression::of_media_type(&layer.media_type);
        let (b, root) = (blob.clone(), rootfs.clone());
        let applied = tokio::task::spawn_blocking(move || apply_layer(&b, compression, &root))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        let _ = std::fs::remove_file(&blob);
        let diff = applied.map_err(|source| PullError::Layer {
            digest: layer.digest.clone(),
            source,
        })?;
        verify(
            &format!("layer {} (uncompressed)", layer.digest),
            &want_diff,
            &diff,
        )?;
    }
    let run = config.config.clone().unwrap_or_default();
    let cfg_path = dir.join("config.json");
    let raw = serde_json::to_vec_pretty(&StoreConfig::from(&run)).unwrap_or_default();
    std::fs::write(&cfg_path, raw).map_err(PullError::store(&cfg_path))
}

fn parse_digest(what: &str, s: &str) -> Result<Digest, PullError> {
    Digest::parse(s).ok_or_else(|| PullError::Malformed {
        what: what.into(),
        message: format!("unsupported digest {s:?} (only sha256)"),
    })
}

fn verify(what: &str, want: &Digest, got: &Digest) -> Result<(), PullError> {
    if want == got {
        Ok(())
    } else {
        Err(PullError::DigestMismatch {
            what: what.into(),
            expected: want.to_string(),
            actual: got.to_string(),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use parking_lot::Mutex;

    use super::super::manifest::{Descriptor, Index, Manifest, Platform, OCI_INDEX, OCI_MANIFEST};
    use super::super::registry::ManifestResponse;
    use super::super::unpack::tests::{gzip, tar_of};
    use super::*;

    /// An in-memory registry: manifests by tag or digest, blobs by digest.
    #[derive(Default)]
    pub(crate) struct FakeRegistry {
        pub manifests: Mutex<HashMap<String, Vec<u8>>>,
        pub blobs: Mutex<HashMap<String, Vec<u8>>>,
        pub blob_gets: Mutex<usize>,
    }

    #[async_trait::async_trait]
    impl RegistryApi for FakeRegistry {
        async fn manifest(
            &self,
            _: &Reference,
            reference: &str,
        ) -> Result<ManifestResponse, PullError> {
            let body = self.manifests.lock().get(reference).cloned();
            body.map(|body| ManifestResponse {
                body,
                content_type: None,
            })
            .ok_or(PullError::NotFound {
                url: reference.into(),
            })
        }

        async fn blob(
            &self,
            _: &Reference,
            digest: &str,
            sink: &mut (dyn Write + Send),
        ) -> Result<(), PullError> {
            *self.blob_gets.lock() += 1;
            let b = self.blobs.lock().get(digest).cloned();
            let b = b.ok_or(PullError::NotFound { url: digest.into() })?;
            sink.write_all(&b).map_err(PullError::store("sink"))
        }
    }

    impl FakeRegistry {
        fn blob(&self, bytes: Vec<u8>) -> String {
            let d = Digest::of(&bytes).to_string();
            self.blobs.lock().insert(d.clone(), bytes);
            d
        }

        /// Publishes an image of `layers` (uncompressed tars, sent gzipped) under `tag`,
        /// wrapped in an index; returns the index digest.
        pub(crate) fn publish(&self, tag: &str, layers: &[Vec<u8>]) -> String {
            let diff_ids: Vec<String> = layers.iter().map(|l| Digest::of(l).to_string()).collect();
            let config = serde_json::json!({
                "architecture": "amd64", "os": "linux",
                "config": {"Entrypoint": ["/bin/app"], "Env": ["A=1"]},
                "rootfs": {"type": "layers", "diff_ids": diff_ids},
            });
            let config = serde_json::to_vec(&config).unwrap();
            let desc = |mt: &str, bytes: &[u8], d: String| Descriptor {
                media_type: mt.into(),
                digest: d,
                size: bytes.len() as i64,
                platform: None,
            };
            let cd = self.blob(config.clone());
            let layers = layers
                .iter()
                .map(|l| {
                    let gz = gzip(l);
                    desc(
                        "application/vnd.oci.image.layer.v1.tar+gzip",
                        &gz,
                        self.blob(gz.clone()),
                    )
                })
                .collect();
            let m = Manifest {
                schema_version: 2,
                media_type: Some(OCI_MANIFEST.into()),
                config: desc("application/vnd.oci.image.config.v1+json", &config, cd),
                layers,
            };
            let m = serde_json::to_vec(&m).unwrap();
            let md = Digest::of(&m).to_string();
            self.manifests.lock().insert(md.clone(), m.clone());
            let mut entry = desc(OCI_MANIFEST, &m, md);
            entry.platform = Some(Platform {
                architecture: "amd64".into(),
                os: "linux".into(),
                variant: None,
            });
            let idx = Index {
                schema_version: 2,
                media_type: Some(OCI_INDEX.into()),
                manifests: vec![entry],
            };
            let idx = serde_json::to_vec(&idx).unwrap();
            let id = Digest::of(&idx).to_string();
            self.manifests.lock().insert(tag.into(), idx.clone());
            self.manifests.lock().insert(id.clone(), idx);
            id
        }
    }

    fn setup() -> (tempfile::TempDir, Store, FakeRegistry, Reference) {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        (
            tmp,
            store,
            FakeRegistry::default(),
            Reference::parse("reg.example/app:v1").unwrap(),
        )
    }

    #[tokio::test]
    async fn an_image_is_pulled_through_its_index_and_unpacked_with_its_config() {
        let (_t, store, reg, r) = setup();
        let id = reg.publish("v1", &[tar_of(&[("bin/", None), ("bin/app", Some(b"#!"))])]);
        let rec = pull(&reg, &store, &r).await.unwrap();
        assert_eq!(rec.image_id, format!("reg.example/app@{id}"));
        let dir = store.image_dir(&Digest::parse(&rec.config_digest).unwrap());
        assert_eq!(std::fs::read(dir.join("rootfs/bin/app")).unwrap(), b"#!");
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["entrypoint"], serde_json::json!(["/bin/app"]));
        assert_eq!(cfg["env"], serde_json::json!([["A", "1"]]));
        assert_eq!(store.get_ref("reg.example/app:v1").unwrap().0, rec);
        // A second pull of the same content fetches no blob again.
        let before = *reg.blob_gets.lock();
        pull(&reg, &store, &r).await.unwrap();
        assert_eq!(*reg.blob_gets.lock(), before);
    }

    #[tokio::test]
    async fn a_blob_whose_content_does_not_match_its_digest_is_refused() {
        let (_t, store, reg, r) = setup();
        reg.publish("v1", &[tar_of(&[("a", Some(b"1"))])]);
        // The registry (or the path to it) serves other bytes under the layer's digest.
        let layer = {
            let blobs = reg.blobs.lock();
            blobs
                .iter()
                .find(|(_, b)| b.starts_with(&[0x1f, 0x8b]))
                .map(|(d, _)| d.clone())
                .unwrap()
        };
        reg.blobs
            .lock()
            .insert(layer, gzip(&tar_of(&[("a", Some(b"evil"))])));
        let e = pull(&reg, &store, &r).await.unwrap_err();
        assert!(matches!(e, PullError::DigestMismatch { .. }), "{e}");
        assert!(store.get_ref("reg.example/app:v1").is_none());
        assert_eq!(
            std::fs::read_dir(store.root().join("images"))
                .unwrap()
                .count(),
            0
        );
    }

    #[tokio::test]
    async fn a_manifest_that_does_not_match_the_pinned_digest_is_refused() {
        let (_t, store, reg, _) = setup();
        reg.publish("v1", &[tar_of(&[("a", Some(b"1"))])]);
        let other = Digest::of(b"other");
        let v1 = reg.manifests.lock()["v1"].clone();
        reg.manifests.lock().insert(other.to_string(), v1);
        let r = Reference::parse(&format!("reg.example/app@{other}")).unwrap();
        let e = pull(&reg, &store, &r).await.unwrap_err();
        assert!(matches!(e, PullError::DigestMismatch { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_layer_whose_content_does_not_match_its_diff_id_is_refused() {
        let (_t, store, reg, r) = setup();
        reg.publish("v1", &[tar_of(&[("a", Some(b"1"))])]);
        // Rewrite the config so the diff ID names other content; republish the manifest chain.
        let mut blobs = reg.blobs.lock().clone();
        let (cd, cfg) = blobs
            .iter()
            .find(|(_, b)| b.starts_with(b"{"))
            .map(|(d, b)| (d.clone(), b.clone()))
            .unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&cfg).unwrap();
        v["rootfs"]["diff_ids"][0] = serde_json::json!(Digest::of(b"x").to_string());
        let cfg2 = serde_json::to_vec(&v).unwrap();
        let cd2 = Digest::of(&cfg2).to_string();
        blobs.insert(cd2.clone(), cfg2.clone());
        *reg.blobs.lock() = blobs;
        let mut m: Manifest = {
            let ms = reg.manifests.lock();
            let idx: Index = serde_json::from_slice(&ms["v1"]).unwrap();
            serde_json::from_slice(&ms[&idx.manifests[0].digest]).unwrap()
        };
        assert_eq!(m.config.digest, cd);
        m.config.digest = cd2;
        m.config.size = cfg2.len() as i64;
        let raw = serde_json::to_vec(&m).unwrap();
        reg.manifests.lock().insert("v1".into(), raw);
        let e = pull(&reg, &store, &r).await.unwrap_err();
        assert!(
            matches!(e, PullError::DigestMismatch { ref what, .. } if what.contains("uncompressed")),
            "{e}"
        );
    }
}
