//! Manifests, indexes and image configs (OCI and Docker schema 2), and the choice of this
//! node's platform (`linux/amd64`) from an index.
//!
//! Only the fields the agent uses are modelled: what to fetch (descriptors) and how to run it
//! (the config's `Entrypoint`, `Cmd`, `Env`, `WorkingDir`, `StopSignal`).

use serde::{Deserialize, Serialize};

use super::error::PullError;

/// OCI image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Docker manifest list.
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker image manifest, schema 2.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The `Accept` header of manifest requests.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// The platform this agent runs images for.
pub const OS: &str = "linux";
/// The platform this agent runs images for.
pub const ARCHITECTURE: &str = "amd64";

/// A content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the content.
    #[serde(default)]
    pub media_type: String,
    /// Digest of the content.
    pub digest: String,
    /// Size in bytes.
    pub size: i64,
    /// Platform (index entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

/// An index entry's platform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// e.g. `amd64`.
    pub architecture: String,
    /// e.g. `linux`.
    pub os: String,
    /// e.g. `v8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// An image manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Schema version (2).
    pub schema_version: u32,
    /// Media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The image config.
    pub config: Descriptor,
    /// The layers, lowest first.
    pub layers: Vec<Descriptor>,
}

/// An index (manifest list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    /// Schema version (2).
    pub schema_version: u32,
    /// Media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// One manifest per platform.
    pub manifests: Vec<Descriptor>,
}

/// What a manifest request returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// An image manifest.
    Manifest(Manifest),
    /// An index to choose a platform from.
    Index(Index),
}

/// Parses a manifest response by its `Content-Type`, falling back to the body's `mediaType`
/// and shape (registries serve OCI documents without one).
pub fn parse(content_type: Option<&str>, body: &[u8]) -> Result<Fetched, PullError> {
    let malformed = |e: serde_json::Error| PullError::Malformed {
        what: "manifest".into(),
        message: e.to_string(),
    };
    let v: serde_json::Value = serde_json::from_slice(body).map_err(malformed)?;
    let media_type = content_type
        .map(|c| c.split(';').next().unwrap_or_default().trim().to_string())
        .filter(|c| [OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST].contains(&c.as_str()))
        .or_else(|| {
            v.get("mediaType")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        });
    let is_index = match media_type.as_deref() {
        Some(OCI_INDEX | DOCKER_LIST) => true,
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => false,
        _ => v.get("manifests").is_some(),
    };
    if is_index {
        serde_json::from_value(v)
            .map(Fetched::Index)
            .map_err(malformed)
    } else {
        let m: Manifest = serde_json::from_value(v).map_err(malformed)?;
        if m.schema_version != 2 {
            return Err(PullError::Malformed {
                what: "manifest".into(),
                message: format!("schema version {} (only 2)", m.schema_version),
            });
        }
        Ok(Fetched::Manifest(m))
    }
}

/// The index entry for `linux/amd64`.
pub fn select_platform(index: &Index) -> Result<&Descriptor, PullError> {
    index
        .manifests
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == OS && p.architecture == ARCHITECTURE)
        })
        .ok_or_else(|| PullError::NoPlatform {
            available: index
                .manifests
                .iter()
                .map(|d| match &d.platform {
                    Some(p) => format!("{}/{}", p.os, p.architecture),
                    None => "unknown".into(),
                })
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The image config document (`application/vnd.oci.image.config.v1+json`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImageConfigFile {
    /// Platform.
    #[serde(default)]
    pub architecture: String,
    /// Platform.
    #[serde(default)]
    pub os: String,
    /// How to run it.
    #[serde(default)]
    pub config: Option<RunConfig>,
    /// The layers' uncompressed digests.
    pub rootfs: RootFs,
}

/// The `rootfs` of a config.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RootFs {
    /// The uncompressed digests of the layers, in order.
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// The `config` of a config: how to run the image.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    /// ENTRYPOINT.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// CMD.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// ENV, `K=V`.
    #[serde(default)]
    pub env: Option<Vec<String>>,
    /// WORKDIR.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// STOPSIGNAL.
    #[serde(default)]
    pub stop_signal: Option<String>,
    /// USER.
    #[serde(default)]
    pub user: Option<String>,
}

/// The run configuration in the directory store's `config.json` format (what the pod worker
/// reads for every image, pulled or not).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreConfig {
    /// ENTRYPOINT.
    pub entrypoint: Vec<String>,
    /// CMD.
    pub cmd: Vec<String>,
    /// ENV.
    pub env: Vec<(String, String)>,
    /// WORKDIR.
    pub working_dir: Option<String>,
    /// STOPSIGNAL.
    pub stop_signal: Option<String>,
}

impl From<&RunConfig> for StoreConfig {
    fn from(c: &RunConfig) -> Self {
        StoreConfig {
            entrypoint: c.entrypoint.clone().unwrap_or_default(),
            cmd: c.cmd.clone().unwrap_or_default(),
            env: c
                .env
                .iter()
                .flatten()
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) => (k.to_string(), v.to_string()),
                    None => (kv.clone(), String::new()),
                })
                .collect(),
            working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
            stop_signal: c.stop_signal.clone().filter(|s| !s.is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(os: &str, arch: &str) -> Descriptor {
        Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            size: 1,
            platform: Some(Platform {
                architecture: arch.into(),
                os: os.into(),
                variant: None,
            }),
        }
    }

    #[test]
    fn the_index_entry_for_linux_amd64_is_chosen() {
        let idx = Index {
            schema_version: 2,
            media_type: Some(OCI_INDEX.into()),
            manifests: vec![
                desc("linux", "arm64"),
                desc("linux", "amd64"),
                desc("windows", "amd64"),
            ],
        };
        assert_eq!(select_platform(&idx).unwrap(), &idx.manifests[1]);
        let none = Index {
            manifests: vec![desc("linux", "arm64")],
            ..idx
        };
        let e = select_platform(&none).unwrap_err().to_string();
        assert!(e.contains("linux/arm64"), "{e}");
    }

    #[test]
    fn documents_are_told_apart_by_content_type_media_type_or_shape() {
        let idx = br#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(matches!(parse(None, idx), Ok(Fetched::Index(_))));
        let m =
            br#"{"schemaVersion":2,"config":{"mediaType":"x","digest":"d","size":1},"layers":[]}"#;
        assert!(matches!(
            parse(Some(DOCKER_MANIFEST), m),
            Ok(Fetched::Manifest(_))
        ));
        assert!(matches!(
            parse(Some("text/plain"), m),
            Ok(Fetched::Manifest(_))
        ));
        assert!(parse(None, b"not json").is_err());
        let v1 = br#"{"schemaVersion":1,"config":{"digest":"d","size":1},"layers":[]}"#;
        assert!(parse(None, v1).is_err());
    }

    #[test]
    fn run_config_becomes_the_store_format() {
        let rc: RunConfig = serde_json::from_str(
            r#"{"Entrypoint":["/writer"],"Cmd":null,"Env":["PATH=/bin","EMPTY="],"WorkingDir":"","StopSignal":"SIGINT"}"#,
        )
        .unwrap();
        let sc = StoreConfig::from(&rc);
        assert_eq!(sc.entrypoint, vec!["/writer"]);
        assert_eq!(
            sc.env,
            vec![
                ("PATH".into(), "/bin".into()),
                ("EMPTY".into(), String::new())
            ]
        );
        assert_eq!(sc.working_dir, None);
        assert_eq!(
            serde_json::to_value(&sc).unwrap()["stopSignal"],
            serde_json::json!("SIGINT")
        );
    }
}
