//! Projected volumes: several sources in one directory, as the kubelet's `kube-api-access-*`
//! volume (a ServiceAccount token, the cluster CA from `kube-root-ca.crt`, the namespace from
//! the downward API).
//!
//! Sources:
//! - `serviceAccountToken`: a token of the pod's ServiceAccount from the TokenRequest API,
//!   bound to the pod (it dies with the pod), for the source's audience and lifetime, rotated
//!   by [`rotate`] once 80 % of its lifetime has passed (the kubelet's rule);
//! - `configMap`, `secret`: their keys (or `items`), as in plain volumes;
//! - `downwardAPI`: `metadata.name`, `.namespace`, `.uid`, `.labels`, `.annotations` and single
//!   labels or annotations (`metadata.labels['k']`).
//!
//! Assumptions: the agent's credentials may create tokens for the ServiceAccounts of pods bound
//! to its node (the Node authorizer grants exactly that).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, Pod, ProjectedVolumeSource, ServiceAccount,
};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;

use super::{config_map_data, missing, secret_data, select, write_files, VolumeError};

/// The lifetime asked for when a source names none (the API's default).
const DEFAULT_EXPIRATION_S: i64 = 3600;
/// The shortest lifetime the API server grants.
const MIN_EXPIRATION_S: i64 = 600;
/// How long to wait before retrying a rotation that failed.
const ROTATE_RETRY: Duration = Duration::from_secs(30);

/// One ServiceAccount token file of a projected volume, and when to rotate it.
#[derive(Debug, Clone)]
pub struct Token {
    volume: String,
    dir: PathBuf,
    path: String,
    service_account: String,
    audience: Option<String>,
    expiration_s: i64,
    /// When the token is due for rotation (80 % of its lifetime).
    pub rotate_at: Instant,
}

/// The files of projected volume `volume` of `pod` (to be written under `dir`), and its tokens.
pub(super) async fn files(
    client: &Client,
    pod: &Pod,
    ns: &str,
    volume: &str,
    dir: &Path,
    proj: &ProjectedVolumeSource,
) -> Result<(Vec<(String, Vec<u8>)>, Vec<Token>), VolumeError> {
    let mut files = Vec::new();
    let mut tokens = Vec::new();
    for src in proj.sources.as_deref().unwrap_or_default() {
        if let Some(t) = &src.service_account_token {
            let mut token = Token {
                volume: volume.to_string(),
                dir: dir.to_path_buf(),
                path: t.path.clone(),
                service_account: pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.clone())
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "default".into()),
                audience: t.audience.clone().filter(|a| !a.is_empty()),
                expiration_s: t
                    .expiration_seconds
                    .unwrap_or(DEFAULT_EXPIRATION_S)
                    .max(MIN_EXPIRATION_S),
                rotate_at: Instant::now(),
            };
            let jwt = request(client, pod, ns, &mut token).await?;
            files.push((t.path.clone(), jwt.into_bytes()));
            tokens.push(token);
        }
        if let Some(cm) = &src.config_map {
            match config_map_data(client, ns, volume, &cm.name).await? {
                Some(data) => files.extend(select(data, cm.items.as_ref())),
                None => missing(volume, "configmap", &cm.name, cm.optional)?,
            }
        }
        if let Some(sec) = &src.secret {
            match secret_data(client, ns, volume, &sec.name).await? {
                Some(data) => files.extend(select(data, sec.items.as_ref())),
                None => missing(volume, "secret", &sec.name, sec.optional)?,
            }
        }
        if let Some(d) = &src.downward_api {
            for item in d.items.as_deref().unwrap_or_default() {
                files.push((item.path.clone(), downward(volume, pod, item)?.into_bytes()));
            }
        }
    }
    Ok((files, tokens))
}

/// Asks the API for a token as `t` describes, bound to `pod`; sets `t.rotate_at`.
async fn request(
    client: &Client,
    pod: &Pod,
    ns: &str,
    t: &mut Token,
) -> Result<String, VolumeError> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: t.audience.iter().cloned().collect(),
            expiration_seconds: Some(t.expiration_s),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let asked = Instant::now();
    let got = api
        .create_token_request(&t.service_account, &PostParams::default(), &req)
        .await
        .map_err(|source| VolumeError::Api {
            volume: t.volume.clone(),
            what: format!("token of serviceaccount {}", t.service_account),
            source,
        })?;
    let status = got.status.ok_or_else(|| VolumeError::NotReady {
        volume: t.volume.clone(),
        message: "the TokenRequest came back without a token".into(),
    })?;
    // The lifetime granted (the server may shorten it), counted from when we asked.
    let lifetime = Duration::from_secs(
        u64::try_from(
            status
                .expiration_timestamp
                .0
                .duration_since(k8s_openapi::jiff::Timestamp::now())
                .as_secs(),
        )
        .unwrap_or(0),
    );
    t.rotate_at = asked + lifetime.mul_f64(0.8);
    Ok(status.token)
}

/// Rotates every token of `tokens` that is due, rewriting its file in place (atomically).
/// A failed rotation keeps the old token (valid until it expires) and is retried later; the
/// error is returned for the worker to report.
pub async fn rotate(client: &Client, pod: &Pod, tokens: &mut [Token]) -> Result<(), VolumeError> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let mut first_error = None;
    for t in tokens.iter_mut().filter(|t| t.rotate_at <= Instant::now()) {
        let written = match request(client, pod, &ns, t).await {
            Ok(jwt) => write_files(&t.volume, &t.dir, &[(t.path.clone(), jwt.into_bytes())]),
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            t.rotate_at = Instant::now() + ROTATE_RETRY;
            first_error.get_or_insert(e);
        } else {
            tracing::debug!(volume = %t.volume, path = %t.path, "rotated a ServiceAccount token");
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The content of one downward API file.
pub(super) fn downward(
    volume: &str,
    pod: &Pod,
    item: &DownwardAPIVolumeFile,
) -> Result<String, VolumeError> {
    let unsupported = |what: String| VolumeError::NotReady {
        volume: volume.into(),
        message: format!("downwardAPI {what} is not supported by this agent"),
    };
    let Some(f) = &item.field_ref else {
        return Err(unsupported(format!("{:?} (only fieldRef)", item.path)));
    };
    let m = &pod.metadata;
    let one = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref()
            .and_then(|m| m.get(key).cloned())
            .unwrap_or_default()
    };
    Ok(match f.field_path.as_str() {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(m.labels.as_ref()),
        "metadata.annotations" => format_map(m.annotations.as_ref()),
        p => match p
            .strip_prefix("metadata.labels['")
            .map(|k| (true, k))
            .or_else(|| p.strip_prefix("metadata.annotations['").map(|k| (false, k)))
            .and_then(|(labels, k)| Some((labels, k.strip_suffix("']")?)))
        {
            Some((true, k)) => one(&m.labels, k),
            Some((false, k)) => one(&m.annotations, k),
            None => return Err(unsupported(format!("fieldPath {p:?}"))),
        },
    })
}

/// `key="value"` lines, sorted by key, values quoted as Go's `%q` does for printable text.
fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectFieldSelector;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                         "labels": {"b": "2", "a": "x\"y"}, "annotations": {"k": "v"}},
        }))
        .unwrap()
    }

    fn item(path: &str) -> DownwardAPIVolumeFile {
        DownwardAPIVolumeFile {
            path: "f".into(),
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_downward_api_gives_the_pods_metadata_and_refuses_the_rest() {
        let p = pod();
        let get = |path: &str| downward("v", &p, &item(path));
        assert_eq!(get("metadata.namespace").unwrap(), "ns");
        assert_eq!(get("metadata.name").unwrap(), "p");
        assert_eq!(get("metadata.uid").unwrap(), "u-1");
        assert_eq!(get("metadata.labels").unwrap(), "a=\"x\\\"y\"\nb=\"2\"");
        assert_eq!(get("metadata.labels['b']").unwrap(), "2");
        assert_eq!(get("metadata.annotations['k']").unwrap(), "v");
        assert_eq!(get("metadata.annotations['none']").unwrap(), "");
        let e = get("spec.nodeName").unwrap_err();
        assert!(e.to_string().contains("not supported"), "{e}");
        let no_field = DownwardAPIVolumeFile {
            path: "f".into(),
            ..Default::default()
        };
        assert!(downward("v", &p, &no_field).is_err());
    }
}
