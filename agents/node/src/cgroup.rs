//! Per-container cgroups, on cgroup v2, v1, or both (hybrid).
//!
//! A cgroup is used here for *tracking*: every process of a container, grandchildren
//! included, is in the container's cgroup, so killing the container means killing every pid
//! the cgroup lists until it is empty (or writing `cgroup.kill` on v2).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Errors of cgroup handling.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup file or directory could not be used.
    #[error("cgroup {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Processes survived repeated SIGKILLs.
    #[error("cgroup {path} still has processes after killing: {pids:?}")]
    Survivors {
        /// The cgroup.
        path: PathBuf,
        /// The surviving pids.
        pids: Vec<i32>,
    },
}

/// The kind of one hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Version {
    /// cgroup v1 (one controller per hierarchy).
    V1,
    /// cgroup v2 (unified).
    V2,
}

/// The hierarchies the agent puts containers in: parent directories under which each
/// container gets `palisade/<id>`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Hierarchies {
    /// (kind, parent directory).
    pub parents: Vec<(Version, PathBuf)>,
}

fn own_path(proc_self_cgroup: &str, v1_controller: Option<&str>) -> Option<String> {
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        match v1_controller {
            None if ctrls.is_empty() => return Some(path.to_string()),
            Some(c) if ctrls.split(',').any(|x| x == c) => return Some(path.to_string()),
            _ => {}
        }
    }
    None
}

impl Hierarchies {
    /// Detects the hierarchies under `root` (normally `/sys/fs/cgroup`): pure v2, or the
    /// hybrid layout's `unified` plus the v1 `pids` and `memory` hierarchies. Each container
    /// cgroup is nested below the agent's own cgroup in that hierarchy.
    pub fn detect(root: &Path) -> Self {
        let selfcg = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut parents = Vec::new();
        let join = |base: PathBuf, own: Option<String>| {
            let own = own.unwrap_or_else(|| "/".into());
            base.join(own.trim_start_matches('/')).join("palisade")
        };
        if root.join("cgroup.controllers").exists() {
            parents.push((
                Version::V2,
                join(root.to_path_buf(), own_path(&selfcg, None)),
            ));
        } else {
            let unified = root.join("unified");
            if unified.join("cgroup.procs").exists() {
                parents.push((Version::V2, join(unified, own_path(&selfcg, None))));
            }
            for c in ["pids", "memory"] {
                let dir = root.join(c);
                if dir.join("cgroup.procs").exists() {
                    parents.push((Version::V1, join(dir, own_path(&selfcg, Some(c)))));
                }
            }
        }
        Self { parents }
    }

    /// Nests every parent one level deeper (one directory per node, so several agents on
    /// one kernel never touch each other's cgroups).
    pub fn nested(self, name: &str) -> Self {
        Self {
            parents: self
                .parents
                .into_iter()
                .map(|(v, p)| (v, p.join(name)))
                .collect(),
        }
    }

    /// Removes empty container cgroups left behind (an agent that died with its machine)
    /// except those in `keep`. Non-empty cgroups are never removed.
    pub fn remove_stale(&self, keep: &[String]) {
        for (_, parent) in &self.parents {
            let Ok(rd) = std::fs::read_dir(parent) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if e.path().is_dir() && !keep.contains(&name) && pids(&e.path()).is_empty() {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
    }

    /// Whether no hierarchy was found.
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// Mounts a private view of the cgroup v2 hierarchy at `mount_point` and uses it. This is
    /// for machines whose `/sys/fs/cgroup` is not visible (a fresh sysfs in a namespace); the
    /// v2 hierarchy is one per kernel, so the view is the real thing. Reuses an existing mount.
    pub fn mount_private_v2(mount_point: &Path) -> Result<Self, CgroupError> {
        let io = |source| CgroupError::Io {
            path: mount_point.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(mount_point).map_err(io)?;
        if !mount_point.join("cgroup.procs").exists() {
            nix::mount::mount(
                Some("cgroup2"),
                mount_point,
                Some("cgroup2"),
                nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .map_err(|e| io(std::io::Error::from(e)))?;
        }
        let selfcg = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let own = own_path(&selfcg, None).unwrap_or_else(|| "/".into());
        Ok(Self {
            parents: vec![(
                Version::V2,
                mount_point
                    .join(own.trim_start_matches('/'))
                    .join("palisade"),
            )],
        })
    }

    /// Creates the cgroups of one container and returns their directories. A hierarchy that
    /// cannot be used (read-only, delegated elsewhere) is skipped with a warning.
    pub fn create(&self, id: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for (_, parent) in &self.parents {
            let dir = parent.join(id);
            match std::fs::create_dir_all(&dir) {
                Ok(()) => out.push(dir),
                Err(e) => {
                    tracing::warn!(cgroup = %dir.display(), error = %e, "cannot create cgroup")
                }
            }
        }
        out
    }
}

/// Moves process `pid` into each cgroup directory.
pub fn join(dirs: &[PathBuf], pid: u32) -> Result<(), CgroupError> {
    for d in dirs {
        let f = d.join("cgroup.procs");
        std::fs::write(&f, pid.to_string())
            .map_err(|source| CgroupError::Io { path: f, source })?;
    }
    Ok(())
}

/// The pids in a cgroup directory (missing directory: none).
pub fn pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The union of the pids of several cgroups.
pub fn all_pids(dirs: &[PathBuf]) -> Vec<i32> {
    let mut v: Vec<i32> = dirs.iter().flat_map(|d| pids(d)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// SIGKILLs every process in the cgroups until they are all empty.
///
/// Guarantees: on `Ok`, no process is left in any of the cgroups (a process forking while
/// being killed is caught by the next round).
pub async fn kill_all(dirs: &[PathBuf]) -> Result<(), CgroupError> {
    for d in dirs {
        let k = d.join("cgroup.kill");
        if k.exists() {
            let _ = std::fs::write(&k, "1");
        }
    }
    for _ in 0..250 {
        let pids = all_pids(dirs);
        if pids.is_empty() {
            return Ok(());
        }
        for p in pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pids = all_pids(dirs);
    if pids.is_empty() {
        return Ok(());
    }
    Err(CgroupError::Survivors {
        path: dirs.first().cloned().unwrap_or_default(),
        pids,
    })
}

/// Removes the (empty) cgroup directories.
pub fn remove(dirs: &[PathBuf]) {
    for d in dirs {
        if let Err(e) = std::fs::remove_dir(d) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::debug!(cgroup = %d.display(), error = %e, "cannot remove cgroup");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_cleanup_removes_only_empty_unknown_cgroups_of_this_node() {
        let d = tempfile::tempdir().unwrap();
        let h = Hierarchies {
            parents: vec![(Version::V2, d.path().to_path_buf())],
        }
        .nested("m0");
        let parent = d.path().join("m0");
        for c in ["stale", "known", "busy"] {
            std::fs::create_dir_all(parent.join(c)).unwrap();
        }
        std::fs::write(parent.join("busy/cgroup.procs"), "1\n").unwrap();
        h.remove_stale(&["known".to_string()]);
        assert!(!parent.join("stale").exists());
        assert!(parent.join("known").exists());
        assert!(
            parent.join("busy").exists(),
            "a cgroup with processes is never removed"
        );
    }

    #[test]
    fn own_path_parses_v1_and_v2_lines() {
        let s = "9:name=systemd:/\n8:pids:/a\n4:memory:/process_api/x\n0::/u\n";
        assert_eq!(own_path(s, None).as_deref(), Some("/u"));
        assert_eq!(own_path(s, Some("pids")).as_deref(), Some("/a"));
        assert_eq!(
            own_path(s, Some("memory")).as_deref(),
            Some("/process_api/x")
        );
        assert_eq!(own_path(s, Some("cpu")), None);
    }
}
