//! Pod volumes: emptyDir, hostPath, configMap and secret (projected as files), projected
//! volumes ([`projected`]: ServiceAccount tokens, ConfigMaps, Secrets and the downward API, as
//! in the kubelet's `kube-api-access-*` volume), and PVCs backed by a CSI PersistentVolume.
//!
//! Each prepared volume is a host directory. [`crate::mounts`] bind-mounts it at every
//! `volumeMounts[].mountPath` in the container's own mount namespace; its host path is also
//! in the environment variable [`env_name`] (`PALISADE_VOLUME_<NAME>`).
//! A CSI volume is only usable once the VolumeAttachment of this node says `attached: true`
//! (the attach-detach controller's record); its handle and attributes are written to
//! `volume.json` in its directory and exported as `PALISADE_VOLUME_<NAME>_HANDLE`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::{Api, Client};
use sha2::{Digest, Sha256};

use crate::state::StateStore;

pub mod projected;

/// Pod UID → `kubernetes.io/csi/<driver>^<handle>` of its CSI volumes: what the Node reports
/// in `status.volumesInUse`. [`prepare`] fills it; the pod worker clears it when the pod is
/// gone.
pub type VolumesInUse = parking_lot::Mutex<BTreeMap<String, Vec<String>>>;

/// Errors preparing a volume; the worker reports them and retries.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// An API read failed.
    #[error("volume {volume}: {what}: {source}")]
    Api {
        /// The volume.
        volume: String,
        /// What was read.
        what: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },
    /// A directory or file could not be written.
    #[error("volume {volume}: {path}: {source}")]
    Io {
        /// The volume.
        volume: String,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The volume is not usable yet or is misconfigured.
    #[error("volume {volume}: {message}")]
    NotReady {
        /// The volume.
        volume: String,
        /// Why.
        message: String,
    },
}

/// The prepared volumes of a pod.
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    /// Volume name → host directory (or file for a hostPath file).
    pub dirs: BTreeMap<String, PathBuf>,
    /// Extra environment for every container.
    pub env: Vec<(String, String)>,
    /// `kubernetes.io/csi/<driver>^<volumeHandle>` of each CSI volume, for
    /// `node.status.volumesInUse`.
    pub unique_names: Vec<String>,
    /// The ServiceAccount tokens of projected volumes, to rotate ([`projected::rotate`]).
    pub tokens: Vec<projected::Token>,
}

/// The environment variable that carries a volume's directory.
pub fn env_name(volume: &str) -> String {
    let up: String = volume
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("PALISADE_VOLUME_{up}")
}

/// Whether the pod uses a PersistentVolumeClaim (self-fencing applies to it).
pub fn uses_pvc(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.persistent_volume_claim.is_some()))
}

/// The name the attach-detach controller gives the VolumeAttachment of a CSI volume on a node.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    let mut h = Sha256::new();
    h.update(format!("{volume_handle}{driver}{node}").as_bytes());
    format!("csi-{}", hex::encode(h.finalize()))
}

fn io(volume: &str, path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError {
    let volume = volume.to_string();
    let path = path.to_path_buf();
    move |source| VolumeError::Io {
        volume,
        path,
        source,
    }
}

fn api(volume: &str, what: String) -> impl FnOnce(kube::Error) -> VolumeError {
    let volume = volume.to_string();
    move |source| VolumeError::Api {
        volume,
        what,
        source,
    }
}

/// The files `items` selects from `data` (every key under its own name without `items`), as
/// (path inside the volume, content). A key `items` names that `data` lacks is left out.
fn select(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>,
) -> Vec<(String, Vec<u8>)> {
    match items {
        Some(items) => items
            .iter()
            .filter_map(|i| data.get(&i.key).map(|v| (i.path.clone(), v.clone())))
            .collect(),
        None => data.into_iter().collect(),
    }
}

/// Writes `files` under `dir`, each atomically (a temporary file renamed over the old one, so
/// a container reading a rotated token never sees half of it).
///
/// Guarantees: nothing is written outside `dir`: an absolute path or one with a `..`
/// component is refused before anything is written.
fn write_files(volume: &str, dir: &Path, files: &[(String, Vec<u8>)]) -> Result<(), VolumeError> {
    for (path, _) in files {
        let p = Path::new(path);
        if p.is_absolute()
            || path.is_empty()
            || p.components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(VolumeError::NotReady {
                volume: volume.into(),
                message: format!("path {path:?} escapes the volume"),
            });
        }
    }
    std::fs::create_dir_all(dir).map_err(io(volume, dir))?;
    for (path, v) in files {
        let p = dir.join(path);
        let parent = p.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent).map_err(io(volume, parent))?;
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let tmp = parent.join(format!("..{name}.tmp"));
        std::fs::write(&tmp, v).map_err(io(volume, &tmp))?;
        std::fs::rename(&tmp, &p).map_err(io(volume, &p))?;
    }
    Ok(())
}

/// What a missing ConfigMap or Secret means: `None` (an empty source) when it is optional, an
/// error otherwise.
fn missing(
    volume: &str,
    kind: &str,
    name: &str,
    optional: Option<bool>,
) -> Result<(), VolumeError> {
    if optional == Some(true) {
        Ok(())
    } else {
        Err(VolumeError::NotReady {
            volume: volume.into(),
            message: format!("{kind} {name:?} not found"),
        })
    }
}

/// The data of ConfigMap `name` (`data` and `binaryData`); `None` when it does not exist.
async fn config_map_data(
    client: &Client,
    ns: &str,
    volume: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, VolumeError> {
    let api_: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let obj = api_
        .get_opt(name)
        .await
        .map_err(api(volume, format!("configmap {name}")))?;
    Ok(obj.map(|obj| {
        let mut data: BTreeMap<String, Vec<u8>> = obj
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        data.extend(
            obj.binary_data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0)),
        );
        data
    }))
}

/// The data of Secret `name` (`data` and `stringData`); `None` when it does not exist.
async fn secret_data(
    client: &Client,
    ns: &str,
    volume: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, VolumeError> {
    let api_: Api<Secret> = Api::namespaced(client.clone(), ns);
    let obj = api_
        .get_opt(name)
        .await
        .map_err(api(volume, format!("secret {name}")))?;
    Ok(obj.map(|obj| {
        let mut data: BTreeMap<String, Vec<u8>> = obj
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        data.extend(
            obj.string_data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes())),
        );
        data
    }))
}

/// Prepares every volume of the pod under its directory in `store`, reading ConfigMaps,
/// Secrets, PVCs, PVs and VolumeAttachments through `client`, and records its CSI volumes in
/// `in_use` for node `node_name`.
pub async fn prepare(
    client: &Client,
    store: &StateStore,
    node_name: &str,
    in_use: &VolumesInUse,
    pod: &Pod,
) -> Result<Prepared, VolumeError> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let base = store.pod_dir(&uid).join("volumes");
    let mut out = Prepared::default();
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default()
    {
        let name = v.name.clone();
        let dir = base.join(&name);
        if v.empty_dir.is_some() {
            std::fs::create_dir_all(&dir).map_err(io(&name, &dir))?;
            out.dirs.insert(name, dir);
        } else if let Some(h) = &v.host_path {
            let p = PathBuf::from(&h.path);
            match h.type_.as_deref().unwrap_or("") {
                "DirectoryOrCreate" => std::fs::create_dir_all(&p).map_err(io(&name, &p))?,
                "FileOrCreate" => {
                    // As the kubelet: the file is created, its parent directory is not.
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&p)
                        .map_err(io(&name, &p))?;
                }
                "Directory" | "File" | "Socket" if !p.exists() => {
                    return Err(VolumeError::NotReady {
                        volume: name,
                        message: format!("hostPath {} does not exist", p.display()),
                    })
                }
                _ => {}
            }
            out.dirs.insert(name, p);
        } else if let Some(cm) = &v.config_map {
            match config_map_data(client, &ns, &name, &cm.name).await? {
                Some(data) => write_files(&name, &dir, &select(data, cm.items.as_ref()))?,
                None => {
                    missing(&name, "configmap", &cm.name, cm.optional)?;
                    std::fs::create_dir_all(&dir).map_err(io(&name, &dir))?
                }
            }
            out.dirs.insert(name, dir);
        } else if let Some(sec) = &v.secret {
            let s_name = sec.secret_name.clone().unwrap_or_default();
            match secret_data(client, &ns, &name, &s_name).await? {
                Some(data) => write_files(&name, &dir, &select(data, sec.items.as_ref()))?,
                None => {
                    missing(&name, "secret", &s_name, sec.optional)?;
                    std::fs::create_dir_all(&dir).map_err(io(&name, &dir))?
                }
            }
            out.dirs.insert(name, dir);
        } else if let Some(d) = &v.downward_api {
            let files = d
                .items
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(|i| {
                    Ok((
                        i.path.clone(),
                        projected::downward(&name, pod, i)?.into_bytes(),
                    ))
                })
                .collect::<Result<Vec<_>, VolumeError>>()?;
            write_files(&name, &dir, &files)?;
            out.dirs.insert(name, dir);
        } else if let Some(proj) = &v.projected {
            let (files, tokens) = projected::files(client, pod, &ns, &name, &dir, proj).await?;
            write_files(&name, &dir, &files)?;
            out.tokens.extend(tokens);
            out.dirs.insert(name, dir);
        } else if let Some(claim) = &v.persistent_volume_claim {
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
            let c = claim.claim_name.clone();
            let pvc = pvcs.get(&c).await.map_err(api(&name, format!("pvc {c}")))?;
            let Some(pv_name) = pvc
                .spec
                .and_then(|s| s.volume_name)
                .filter(|s| !s.is_empty())
            else {
                return Err(VolumeError::NotReady {
                    volume: name,
                    message: format!("pvc {c:?} is not bound yet"),
                });
            };
            let pvs: Api<PersistentVolume> = Api::all(client.clone());
            let pv = pvs
                .get(&pv_name)
                .await
                .map_err(api(&name, format!("pv {pv_name}")))?;
            let Some(csi) = pv.spec.and_then(|s| s.csi) else {
                // Not CSI: treat it like a node-local directory.
                std::fs::create_dir_all(&dir).map_err(io(&name, &dir))?;
                out.dirs.insert(name, dir);
                continue;
            };
            let va_name = attachment_name(&csi.volume_handle, &csi.driver, node_name);
            let vas: Api<VolumeAttachment> = Api::all(client.clone());
            let attached = vas
                .get_opt(&va_name)
                .await
                .map_err(api(&name, format!("volumeattachment {va_name}")))?
                .and_then(|va| va.status)
                .is_some_and(|s| s.attached);
            // Report the volume in use before it is attached, as the kubelet does, so the
            // controller never detaches under us.
            let unique = format!("kubernetes.io/csi/{}^{}", csi.driver, csi.volume_handle);
            in_use.lock().insert(uid.clone(), vec![unique.clone()]);
            if !attached {
                return Err(VolumeError::NotReady {
                    volume: name,
                    message: format!(
                        "waiting for VolumeAttachment {va_name} to be attached to this node"
                    ),
                });
            }
            std::fs::create_dir_all(&dir).map_err(io(&name, &dir))?;
            let info = serde_json::json!({
                "driver": csi.driver,
                "volumeHandle": csi.volume_handle,
                "volumeAttributes": csi.volume_attributes.clone().unwrap_or_default(),
                "persistentVolume": pv_name,
                "claim": c,
            });
            let f = dir.join("volume.json");
            std::fs::write(&f, info.to_string()).map_err(io(&name, &f))?;
            out.env.push((
                format!("{}_HANDLE", env_name(&name)),
                csi.volume_handle.clone(),
            ));
            for (k, val) in csi.volume_attributes.unwrap_or_default() {
                out.env.push((
                    format!(
                        "{}_ATTR_{}",
                        env_name(&name),
                        env_name(&k).trim_start_matches("PALISADE_VOLUME_")
                    ),
                    val,
                ));
            }
            out.unique_names.push(unique);
            out.dirs.insert(name, dir);
        } else {
            // Starting without it would send the container's writes to its own root
            // filesystem instead of the volume: refuse, as the kubelet does.
            return Err(VolumeError::NotReady {
                volume: name,
                message: "this volume type is not supported by palisade-node".into(),
            });
        }
    }
    {
        let mut m = in_use.lock();
        if out.unique_names.is_empty() {
            m.remove(&uid);
        } else {
            m.insert(uid, out.unique_names.clone());
        }
    }
    Ok(out)
}

/// Removes a pod's volume directories (never hostPath targets, which live elsewhere).
pub fn cleanup(pod_dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(pod_dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %pod_dir.display(), error = %e, "cannot remove pod directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachment_name_matches_the_attach_detach_controller() {
        // sha256("vol-1" + "csi.example.com" + "m0")
        let n = attachment_name("vol-1", "csi.example.com", "m0");
        assert!(n.starts_with("csi-") && n.len() == 4 + 64);
        let mut h = Sha256::new();
        h.update(b"vol-1csi.example.comm0");
        assert_eq!(n, format!("csi-{}", hex::encode(h.finalize())));
    }

    #[test]
    fn env_names_are_shell_safe() {
        assert_eq!(env_name("data-0"), "PALISADE_VOLUME_DATA_0");
    }

    #[test]
    fn projected_items_are_written_and_escapes_refused() {
        // The volume sits one level inside a directory this test owns, so an escape would
        // land where only this test looks (never in the shared /tmp).
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("volume");
        std::fs::create_dir(&d).unwrap();
        let d = d.as_path();
        let mut data = BTreeMap::new();
        data.insert("a".to_string(), b"1".to_vec());
        data.insert("b".to_string(), b"2".to_vec());
        write_files("v", d, &select(data.clone(), None)).unwrap();
        assert_eq!(std::fs::read(d.join("b")).unwrap(), b"2");
        let item = |path: &str| {
            vec![k8s_openapi::api::core::v1::KeyToPath {
                key: "a".into(),
                path: path.into(),
                mode: None,
            }]
        };
        write_files("v", d, &select(data.clone(), Some(&item("sub/x")))).unwrap();
        assert_eq!(std::fs::read(d.join("sub/x")).unwrap(), b"1");
        // Rewritten in place (a rotated token): the new content, no temporary file left.
        let mut newer = data.clone();
        newer.insert("a".into(), b"3".to_vec());
        write_files("v", d, &select(newer, Some(&item("sub/x")))).unwrap();
        assert_eq!(std::fs::read(d.join("sub/x")).unwrap(), b"3");
        assert_eq!(std::fs::read_dir(d.join("sub")).unwrap().count(), 1);
        for bad in ["../x", "/etc/passwd", "a/../../x", "./", ""] {
            let e = write_files("v", d, &select(data.clone(), Some(&item(bad))));
            assert!(e.is_err(), "{bad:?} refused");
        }
        let escaped: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(escaped, ["volume"], "nothing written beside the volume");
    }
}
