//! Image resolution: which root filesystem and image configuration a container runs with.
//!
//! [`image_of`] is the only place that knows where images come from. Today that is the local
//! image store (`<image-store>/<sanitized image>/rootfs` and `config.json`), plus the host
//! images that run host binaries without a chroot.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Container;

use super::Ctx;

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

/// Resolves the image of `c`: its root filesystem (`None` for a host image, which runs on the
/// host's) and its configuration (default when the image has no readable `config.json`).
///
/// The error is the message of the `ErrImageNeverPull` waiting reason: the image is neither a
/// host image nor in the local image store.
pub(super) fn image_of(ctx: &Ctx, c: &Container) -> Result<(Option<PathBuf>, ImageConfig), String> {
    let image = c.image.clone().unwrap_or_default();
    if ctx
        .host_images
        .iter()
        .any(|h| *h == image || image.starts_with(&format!("{h}:")))
    {
        return Ok((None, ImageConfig::default()));
    }
    let dir = ctx.image_store.join(sanitize_image(&image));
    let rootfs = dir.join("rootfs");
    if !rootfs.is_dir() {
        return Err(format!(
            "image {image:?} not found in the local image store {}",
            ctx.image_store.display()
        ));
    }
    let cfg = std::fs::read(dir.join("config.json"))
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok())
        .unwrap_or_default();
    Ok((Some(rootfs), cfg))
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
