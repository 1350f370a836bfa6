//! Image resolution: which root filesystem and image configuration a container runs with.
//!
//! [`image_of`] and [`local_config_of`] are the only places that know where images come from:
//! the local directory store (`<image-store>/<sanitized image>/rootfs` and `config.json`), the
//! images pulled from registries ([`crate::image::ImageService`]), and the host images that
//! run host binaries without a chroot.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::Ctx;
use crate::image::{ImageError, ImageRequest};
use crate::reporter::PodRef;

/// Image configuration read from `<image-store>/<image>/config.json`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ImageConfig {
    /// ENTRYPOINT.
    pub entrypoint: Vec<String>,
    /// CMD.
    pub cmd: Vec<String>,
    /// ENV.
    pub env: Vec<(String, String)>,
    /// WORKDIR.
    pub working_dir: Option<String>,
    /// STOPSIGNAL (e.g. `SIGINT`).
    pub stop_signal: Option<String>,
}

/// The directory name of an image in the store (`/` and `:` become `_`).
pub fn sanitize_image(image: &str) -> String {
    image.replace(['/', ':', '@'], "_")
}

/// The pod a container's image is resolved for: where its pull secrets live and who keeps
/// a pulled image alive.
pub(super) struct PodImages<'a> {
    /// The pod's namespace (of its pull secrets).
    pub namespace: &'a str,
    /// The pod's UID.
    pub uid: &'a str,
    /// The pod's `imagePullSecrets` names.
    pub pull_secrets: Vec<String>,
}

impl<'a> PodImages<'a> {
    /// The image context of `pod` (identified by `pref`).
    pub fn of(pod: &Pod, pref: &'a PodRef) -> Self {
        PodImages {
            namespace: &pref.namespace,
            uid: &pref.uid,
            pull_secrets: pod
                .spec
                .as_ref()
                .and_then(|s| s.image_pull_secrets.as_ref())
                .into_iter()
                .flatten()
                .map(|r| r.name.clone())
                .collect(),
        }
    }
}

fn is_host_image(ctx: &Ctx, image: &str) -> bool {
    ctx.host_images
        .iter()
        .any(|h| *h == image || image.starts_with(&format!("{h}:")))
}

fn read_config(dir: &Path) -> ImageConfig {
    std::fs::read(dir.join("config.json"))
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok())
        .unwrap_or_default()
}

/// Resolves the image of `c`: its root filesystem (`None` for a host image, which runs on the
/// host's) and its configuration (default when the image has no readable `config.json`).
///
/// The directory store comes first (the lab's fast path), then the registry's images through
/// [`crate::image::ImageService::resolve`], which may start a pull in the background; the
/// error's [`crate::image::ImageError::reason`] is the container's Waiting reason.
pub(super) fn image_of(
    ctx: &Ctx,
    pod: &PodImages<'_>,
    c: &Container,
) -> Result<(Option<PathBuf>, ImageConfig), ImageError> {
    let image = c.image.clone().unwrap_or_default();
    if is_host_image(ctx, &image) {
        return Ok((None, ImageConfig::default()));
    }
    let mut dir = ctx.image_store.join(sanitize_image(&image));
    if !dir.join("rootfs").is_dir() {
        let req = ImageRequest {
            image: &image,
            policy: c.image_pull_policy.as_deref(),
            namespace: pod.namespace,
            pull_secrets: pod.pull_secrets.clone(),
            pod_uid: pod.uid,
        };
        dir = ctx.images.resolve(&req)?.dir;
    }
    let cfg = read_config(&dir);
    Ok((Some(dir.join("rootfs")), cfg))
}

/// The configuration of `c`'s image from what is already on the node (the directory store,
/// then the registry store), default otherwise. Never starts a pull: for kill time, which
/// only needs the stop signal.
pub(super) fn local_config_of(ctx: &Ctx, c: &Container) -> ImageConfig {
    let image = c.image.clone().unwrap_or_default();
    if is_host_image(ctx, &image) {
        return ImageConfig::default();
    }
    let dir = ctx.image_store.join(sanitize_image(&image));
    if dir.join("rootfs").is_dir() {
        return read_config(&dir);
    }
    ctx.images
        .local_dir(&image)
        .map(|d| read_config(&d))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_map_to_directories() {
        assert_eq!(
            sanitize_image("registry.local/app:1.0"),
            "registry.local_app_1.0"
        );
    }
}
