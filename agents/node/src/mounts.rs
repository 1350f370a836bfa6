//! Volume mounts at `volumeMounts[].mountPath`, as the kubelet makes them.
//!
//! The agent turns a container's `volumeMounts` into a list of [`Mount`]s with [`plan`]
//! (pure path checks plus a look at the host for the host image), and the [`crate::shim`]
//! applies them with [`apply`] before it chroots: it unshares a mount namespace of its own,
//! makes every mount in it a slave (so nothing it mounts propagates back to the machine),
//! bind-mounts each volume directory onto `<container root>/<mountPath>`, and remounts it
//! read-only when `readOnly` is set. The container's process inherits that namespace; the
//! agent's own namespace never sees these mounts.
//!
//! Mount points are created when missing: inside an image's root filesystem, and on the
//! machine's root for the host image (like the kubelet creating `hostPath` directories), but
//! a mount never covers a non-empty system directory of the host (`/`, `/etc`, `/usr`, ...)
//! nor anything under `/proc`, `/sys` or `/dev`.
//!
//! Every volume a mount names is prepared first ([`crate::volumes::prepare`] refuses the types
//! it does not support, so no container starts without its volume); a mount of a volume with
//! no prepared directory is skipped.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::VolumeMount;

/// Errors planning or applying a mount; the container does not start and waits.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A `mountPath` or `subPath` is not acceptable.
    #[error("volume {volume}: invalid {field} {path:?}: {reason}")]
    InvalidPath {
        /// The volume.
        volume: String,
        /// `mountPath` or `subPath`.
        field: &'static str,
        /// The path as given.
        path: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The mount would cover a system directory of the host.
    #[error(
        "volume {volume}: refusing to mount over the host's system directory {path} \
         (the host image runs on the machine's root filesystem)"
    )]
    Protected {
        /// The volume.
        volume: String,
        /// The mount path.
        path: String,
    },
    /// The mount point escapes the container's root filesystem through a symbolic link.
    #[error(
        "volume {volume}: mount point {path} resolves outside the container's root filesystem"
    )]
    Escapes {
        /// The volume.
        volume: String,
        /// The mount path.
        path: String,
    },
    /// A file system operation failed.
    #[error("volume {volume}: {what} {path}: {source}")]
    Io {
        /// The volume.
        volume: String,
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// One bind mount of a container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mount {
    /// The volume's name (for messages).
    pub volume: String,
    /// The host directory or file to mount (the volume, or a path inside it for `subPath`).
    pub source: PathBuf,
    /// The normalised absolute mount path inside the container.
    pub target: String,
    /// Remount read-only.
    pub read_only: bool,
}

/// System directories of the host that a host-image mount never covers when they exist and
/// are not empty.
const PROTECTED: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/usr/bin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/libexec",
    "/usr/local",
    "/usr/sbin",
    "/usr/share",
    "/var",
    "/var/lib",
    "/var/run",
];

/// Pseudo file systems: nothing is ever mounted under them.
const PSEUDO: &[&str] = &["/proc", "/sys", "/dev"];

/// Normalises an absolute `mountPath`: collapses `//` and `.`, drops a trailing `/`, and
/// refuses relative paths and `..`.
pub fn normalize_mount_path(volume: &str, path: &str) -> Result<String, MountError> {
    let bad = |reason| MountError::InvalidPath {
        volume: volume.into(),
        field: "mountPath",
        path: path.into(),
        reason,
    };
    if !path.starts_with('/') {
        return Err(bad("must be an absolute path"));
    }
    let mut parts = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::ParentDir => return Err(bad("must not contain '..'")),
            Component::Prefix(_) => return Err(bad("unsupported path prefix")),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Checks a `subPath`: relative, without `..`. Returns it normalised (empty for none).
pub fn check_sub_path(volume: &str, sub: &str) -> Result<PathBuf, MountError> {
    let bad = |reason| MountError::InvalidPath {
        volume: volume.into(),
        field: "subPath",
        path: sub.into(),
        reason,
    };
    let mut out = PathBuf::new();
    for c in Path::new(sub).components() {
        match c {
            Component::CurDir => {}
            Component::Normal(s) => out.push(s),
            Component::ParentDir => return Err(bad("must not contain '..'")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(bad("must be a relative path"))
            }
        }
    }
    Ok(out)
}

/// Whether a normalised host path must never be mounted over (see the module doc):
/// anything under a pseudo file system, or a protected system directory that exists and is
/// not empty.
pub fn is_protected_host_path(path: &str) -> bool {
    if PSEUDO
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")))
    {
        return true;
    }
    PROTECTED.contains(&path) && std::fs::read_dir(path).map_or(true, |mut d| d.next().is_some())
}

/// Turns a container's `volumeMounts` into mounts of the prepared volume directories `dirs`.
/// `host_root` says the container runs on the machine's root (the host image), where system
/// directories are refused. Mounts of volumes without a prepared directory are skipped.
pub fn plan(
    volume_mounts: &[VolumeMount],
    dirs: &BTreeMap<String, PathBuf>,
    host_root: bool,
) -> Result<Vec<Mount>, MountError> {
    let mut out = Vec::new();
    for vm in volume_mounts {
        let volume = vm.name.clone();
        let target = normalize_mount_path(&volume, &vm.mount_path)?;
        let sub = check_sub_path(&volume, vm.sub_path.as_deref().unwrap_or(""))?;
        if host_root && is_protected_host_path(&target) {
            return Err(MountError::Protected {
                volume,
                path: target,
            });
        }
        let Some(dir) = dirs.get(&volume) else {
            tracing::debug!(volume, "volume not prepared by this agent; mount skipped");
            continue;
        };
        let source = if sub.as_os_str().is_empty() {
            dir.clone()
        } else {
            dir.join(sub)
        };
        out.push(Mount {
            volume,
            source,
            target,
            read_only: vm.read_only == Some(true),
        });
    }
    // Parents before children, so a mount inside another mount is not hidden by it.
    out.sort_by_key(|m| m.target.matches('/').count());
    Ok(out)
}

fn io_err(
    volume: &str,
    what: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> MountError {
    let volume = volume.to_string();
    let path = path.to_path_buf();
    move |source| MountError::Io {
        volume,
        what,
        path,
        source,
    }
}

fn nix_err(volume: &str, what: &'static str, path: &Path) -> impl FnOnce(nix::Error) -> MountError {
    let f = io_err(volume, what, path);
    move |e| f(std::io::Error::from(e))
}

/// Creates the `subPath` source (a directory) when missing, and checks it stays inside the
/// volume.
fn prepare_source(m: &Mount) -> Result<(), MountError> {
    if !m.source.exists() {
        std::fs::create_dir_all(&m.source).map_err(io_err(
            &m.volume,
            "create subPath",
            &m.source,
        ))?;
    }
    Ok(())
}

/// Creates the mount point `target` (a directory, or an empty file when the source is a
/// file) and checks that it resolves inside `root`.
fn prepare_target(m: &Mount, root: &Path, target: &Path) -> Result<PathBuf, MountError> {
    let real_root = root
        .canonicalize()
        .map_err(io_err(&m.volume, "resolve root", root))?;
    let inside = |p: &Path| -> Result<PathBuf, MountError> {
        let real = p
            .canonicalize()
            .map_err(io_err(&m.volume, "resolve mount point", p))?;
        if real.starts_with(&real_root) {
            Ok(real)
        } else {
            Err(MountError::Escapes {
                volume: m.volume.clone(),
                path: m.target.clone(),
            })
        }
    };
    // Check the deepest existing ancestor first, so nothing is created outside the root.
    if let Some(existing) = target.ancestors().find(|a| a.exists()) {
        inside(existing)?;
    }
    let is_file = m.source.is_file();
    if !target.exists() {
        if is_file {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(io_err(
                    &m.volume,
                    "create mount point",
                    parent,
                ))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(target)
                .map_err(io_err(&m.volume, "create mount point", target))?;
        } else {
            std::fs::create_dir_all(target).map_err(io_err(
                &m.volume,
                "create mount point",
                target,
            ))?;
        }
    }
    inside(target)
}

/// Applies `mounts` in a new mount namespace of the calling process (the shim), under
/// `rootfs` or the machine's root. Does nothing (and keeps the machine's namespace) when
/// there is no mount.
pub fn apply(mounts: &[Mount], rootfs: Option<&Path>) -> Result<(), MountError> {
    use nix::mount::{mount, MsFlags};
    if mounts.is_empty() {
        return Ok(());
    }
    let slash = Path::new("/");
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(nix_err(
        "",
        "unshare mount namespace",
        slash,
    ))?;
    // Nothing mounted from here on propagates back to the machine's namespace.
    mount(
        None::<&str>,
        slash,
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(nix_err("", "make mounts slave", slash))?;
    let root = rootfs.unwrap_or(slash);
    for m in mounts {
        if rootfs.is_none() && is_protected_host_path(&m.target) {
            return Err(MountError::Protected {
                volume: m.volume.clone(),
                path: m.target.clone(),
            });
        }
        prepare_source(m)?;
        let target = root.join(m.target.trim_start_matches('/'));
        let target = prepare_target(m, root, &target)?;
        mount(
            Some(&m.source),
            &target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(nix_err(&m.volume, "bind mount onto", &target))?;
        if m.read_only {
            mount(
                None::<&str>,
                &target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(nix_err(&m.volume, "remount read-only", &target))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(name: &str, path: &str, sub: Option<&str>, ro: bool) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            sub_path: sub.map(Into::into),
            read_only: Some(ro),
            ..Default::default()
        }
    }

    #[test]
    fn mount_paths_are_normalised_and_relative_or_dotdot_refused() {
        assert_eq!(normalize_mount_path("v", "/data/").unwrap(), "/data");
        assert_eq!(
            normalize_mount_path("v", "//etc/./app//x").unwrap(),
            "/etc/app/x"
        );
        assert_eq!(normalize_mount_path("v", "/").unwrap(), "/");
        assert!(normalize_mount_path("v", "data").is_err());
        assert!(normalize_mount_path("v", "").is_err());
        let e = normalize_mount_path("v", "/data/../etc").unwrap_err();
        assert!(e.to_string().contains("'..'"), "{e}");
    }

    #[test]
    fn sub_paths_must_stay_inside_the_volume() {
        assert_eq!(check_sub_path("v", "a/./b").unwrap(), PathBuf::from("a/b"));
        assert_eq!(check_sub_path("v", "").unwrap(), PathBuf::new());
        assert!(check_sub_path("v", "../x").is_err());
        assert!(check_sub_path("v", "a/../../x").is_err());
        assert!(check_sub_path("v", "/abs").is_err());
    }

    #[test]
    fn system_directories_of_the_host_are_protected() {
        for p in [
            "/", "/etc", "/usr", "/bin", "/proc", "/proc/1", "/sys/fs", "/dev/shm",
        ] {
            assert!(is_protected_host_path(p), "{p} must be protected");
        }
        let d = tempfile::tempdir().unwrap();
        let free = d.path().join("not-there");
        assert!(!is_protected_host_path(&free.display().to_string()));
        assert!(!is_protected_host_path("/palisade-does-not-exist/x"));
        // Under a protected directory is fine: only the directory itself is refused.
        assert!(!is_protected_host_path("/etc/palisade-does-not-exist"));
    }

    #[test]
    fn plan_maps_volumes_refuses_system_dirs_and_skips_unprepared_volumes() {
        let mut dirs = BTreeMap::new();
        dirs.insert("data".to_string(), PathBuf::from("/v/data"));
        dirs.insert("cfg".to_string(), PathBuf::from("/v/cfg"));
        let mounts = [
            vm("cfg", "/etc/app/config", None, true),
            vm("data", "/data/", Some("sub"), false),
            vm(
                "kube-api-access",
                "/var/run/secrets/kubernetes.io/serviceaccount",
                None,
                true,
            ),
        ];
        let p = plan(&mounts, &dirs, false).unwrap();
        assert_eq!(
            p,
            vec![
                Mount {
                    volume: "data".into(),
                    source: "/v/data/sub".into(),
                    target: "/data".into(),
                    read_only: false,
                },
                Mount {
                    volume: "cfg".into(),
                    source: "/v/cfg".into(),
                    target: "/etc/app/config".into(),
                    read_only: true,
                },
            ]
        );
        // An image may mount over its own /etc; the host image may not.
        assert!(plan(&[vm("cfg", "/etc", None, false)], &dirs, false).is_ok());
        let e = plan(&[vm("cfg", "/etc/", None, false)], &dirs, true).unwrap_err();
        assert!(matches!(e, MountError::Protected { .. }), "{e}");
        assert!(e.to_string().contains("/etc"), "{e}");
        assert!(plan(&[vm("data", "/x", Some("../y"), false)], &dirs, false).is_err());
    }

    #[test]
    fn mount_points_are_created_inside_the_root_and_symlink_escapes_refused() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("rootfs");
        std::fs::create_dir_all(&root).unwrap();
        let src = d.path().join("vol");
        std::fs::create_dir_all(&src).unwrap();
        let m = Mount {
            volume: "v".into(),
            source: src.clone(),
            target: "/a/b".into(),
            read_only: false,
        };
        let t = prepare_target(&m, &root, &root.join("a/b")).unwrap();
        assert!(t.is_dir() && t.ends_with("a/b"));
        std::os::unix::fs::symlink(d.path(), root.join("out")).unwrap();
        let e = prepare_target(&m, &root, &root.join("out/x")).unwrap_err();
        assert!(matches!(e, MountError::Escapes { .. }), "{e}");
        assert!(
            !d.path().join("x").exists(),
            "nothing created outside the root"
        );
        // A file volume gets a file mount point.
        let f = d.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        let mf = Mount { source: f, ..m };
        let t = prepare_target(&mf, &root, &root.join("etc/f")).unwrap();
        assert!(t.is_file());
    }
}
