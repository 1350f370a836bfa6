//! The process runtime: each container is a shim-launched process tree with its own session
//! (process group) and per-container cgroups; its state lives in
//! `<state-dir>/containers/<id>/` so a restarted agent can adopt it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use jiff::Timestamp;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use super::{ContainerConfig, ContainerInfo, ExitStatus, Runtime, RuntimeError};
use crate::cgroup::{self, Hierarchies};
use crate::shim::{ExitRecord, Launch, SHIM_ARG, SHIM_EXEC_ARG};

/// What the runtime records about a container.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Meta {
    info: ContainerInfo,
    shim_pid: i32,
    shim_start_ticks: u64,
    cgroups: Vec<PathBuf>,
}

/// The process runtime.
#[derive(Debug, Clone)]
pub struct ProcessRuntime {
    root: PathBuf,
    shim: PathBuf,
    cgroups: Hierarchies,
}

/// The state and start time (clock ticks) of a process, from `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

fn alive(pid: i32, start_ticks: u64) -> bool {
    matches!(proc_stat(pid), Some((st, t)) if st != 'Z' && st != 'X' && t == start_ticks)
}

impl ProcessRuntime {
    /// A runtime keeping its state under `state_dir/containers`, launching containers
    /// through `shim` (the `palisade-node` binary), with cgroups in `cgroups`.
    pub fn new(
        state_dir: &Path,
        shim: PathBuf,
        cgroups: Hierarchies,
    ) -> Result<Self, RuntimeError> {
        let root = state_dir.join("containers");
        std::fs::create_dir_all(&root).map_err(|source| RuntimeError::Io {
            id: String::new(),
            context: "create containers directory",
            source,
        })?;
        Ok(Self {
            root,
            shim,
            cgroups,
        })
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    fn meta(&self, id: &str) -> Result<Meta, RuntimeError> {
        let raw = std::fs::read(self.dir(id).join("meta.json"))
            .map_err(|_| RuntimeError::NotFound { id: id.to_string() })?;
        serde_json::from_slice(&raw).map_err(|e| RuntimeError::Io {
            id: id.to_string(),
            context: "parse meta.json",
            source: std::io::Error::other(e),
        })
    }

    fn exit_record(&self, id: &str) -> Option<ExitRecord> {
        let raw = std::fs::read(self.dir(id).join("exit.json")).ok()?;
        serde_json::from_slice(&raw).ok()
    }

    fn main_pid(&self, id: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir(id).join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The path of a container's log (stdout and stderr).
    pub fn log_path(&self, id: &str) -> PathBuf {
        self.dir(id).join("log")
    }
}

fn io<'a>(id: &'a str, context: &'static str) -> impl FnOnce(std::io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Io {
        id: id.to_string(),
        context,
        source,
    }
}

#[async_trait::async_trait]
impl Runtime for ProcessRuntime {
    async fn start_with_mounts(
        &self,
        config: &ContainerConfig,
        mounts: &[crate::mounts::Mount],
    ) -> Result<ContainerInfo, RuntimeError> {
        let id = config.id();
        let dir = self.dir(&id);
        if dir.exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        std::fs::create_dir_all(&dir).map_err(io(&id, "create container directory"))?;
        let cgroups = self.cgroups.create(&id);
        let launch = Launch {
            argv: config.argv.clone(),
            env: config.env.clone(),
            working_dir: config.working_dir.clone(),
            rootfs: config.rootfs.clone(),
            mounts: mounts.to_vec(),
            cgroups: cgroups.clone(),
        };
        let launch_json = serde_json::to_vec(&launch)
            .map_err(|e| io(&id, "encode launch.json")(std::io::Error::other(e)))?;
        std::fs::write(dir.join("launch.json"), launch_json)
            .map_err(io(&id, "write launch.json"))?;
        let log = std::fs::File::create(dir.join("log")).map_err(io(&id, "create log"))?;
        let log2 = log.try_clone().map_err(io(&id, "clone log"))?;
        let mut child = tokio::process::Command::new(&self.shim)
            .arg(SHIM_ARG)
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(io(&id, "spawn shim"))?;
        let shim_pid = child.id().map(|p| p as i32).unwrap_or(0);
        // Reap the shim when it exits; the exit status itself is in exit.json.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        let shim_start_ticks = proc_stat(shim_pid).map(|(_, t)| t).unwrap_or(0);
        let info = ContainerInfo {
            id: id.clone(),
            pod_uid: config.pod_uid.clone(),
            name: config.name.clone(),
            attempt: config.attempt,
            started_at: Timestamp::now(),
        };
        let meta = Meta {
            info: info.clone(),
            shim_pid,
            shim_start_ticks,
            cgroups,
        };
        let meta_json = serde_json::to_vec(&meta)
            .map_err(|e| io(&id, "encode meta.json")(std::io::Error::other(e)))?;
        std::fs::write(dir.join("meta.json"), meta_json).map_err(io(&id, "write meta.json"))?;
        // Wait until the main process runs, or the shim reports it could not start it.
        for _ in 0..500 {
            if self.main_pid(&id).is_some() {
                return Ok(info);
            }
            if let Some(rec) = self.exit_record(&id) {
                return match rec.start_error {
                    Some(message) if rec.mount_failed => {
                        Err(RuntimeError::MountFailed { id, message })
                    }
                    Some(message) => Err(RuntimeError::StartFailed { id, message }),
                    None => Ok(info),
                };
            }
            if !alive(shim_pid, shim_start_ticks)
                && self.exit_record(&id).is_none()
                && self.main_pid(&id).is_none()
            {
                return Err(RuntimeError::StartFailed {
                    id,
                    message: "shim exited before starting the container".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(RuntimeError::StartFailed {
            id,
            message: "container did not start within 5s".into(),
        })
    }

    fn signal(&self, id: &str, signal: Signal) -> Result<(), RuntimeError> {
        if let Some(pid) = self.main_pid(id) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
        Ok(())
    }

    async fn kill_all(&self, id: &str) -> Result<(), RuntimeError> {
        let meta = self.meta(id)?;
        if alive(meta.shim_pid, meta.shim_start_ticks) {
            // The shim leads the container's session: its process group covers the container
            // even where no cgroup could be created.
            let _ = killpg(Pid::from_raw(meta.shim_pid), Signal::SIGKILL);
        }
        cgroup::kill_all(&meta.cgroups)
            .await
            .map_err(|source| RuntimeError::Cgroup {
                id: id.to_string(),
                source,
            })?;
        for _ in 0..250 {
            if !alive(meta.shim_pid, meta.shim_start_ticks) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    fn exit_status(&self, id: &str) -> Result<Option<ExitStatus>, RuntimeError> {
        if let Some(rec) = self.exit_record(id) {
            return Ok(Some(ExitStatus {
                code: rec.code,
                signal: rec.signal,
                finished_at: rec.finished_at,
            }));
        }
        let meta = self.meta(id)?;
        if alive(meta.shim_pid, meta.shim_start_ticks) {
            return Ok(None);
        }
        if let Some(rec) = self.exit_record(id) {
            // Written just before the shim exited.
            return Ok(Some(ExitStatus {
                code: rec.code,
                signal: rec.signal,
                finished_at: rec.finished_at,
            }));
        }
        // The shim died without writing: it was SIGKILLed together with the container.
        let rec = ExitRecord {
            code: 137,
            signal: Some(9),
            finished_at: Timestamp::now(),
            start_error: None,
            mount_failed: false,
        };
        if let Ok(raw) = serde_json::to_vec(&rec) {
            let _ = std::fs::write(self.dir(id).join("exit.json"), raw);
        }
        Ok(Some(ExitStatus {
            code: rec.code,
            signal: rec.signal,
            finished_at: rec.finished_at,
        }))
    }

    async fn wait(&self, id: &str) -> Result<ExitStatus, RuntimeError> {
        loop {
            if let Some(s) = self.exit_status(id)? {
                return Ok(s);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn any_alive(&self, id: &str) -> bool {
        let Ok(meta) = self.meta(id) else {
            return false;
        };
        alive(meta.shim_pid, meta.shim_start_ticks) || !cgroup::all_pids(&meta.cgroups).is_empty()
    }

    async fn exec(
        &self,
        id: &str,
        argv: &[String],
        timeout: Duration,
    ) -> Result<i32, RuntimeError> {
        let dir = self.dir(id);
        let mut child = tokio::process::Command::new(&self.shim)
            .arg(SHIM_EXEC_ARG)
            .arg(&dir)
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(id, "spawn exec shim"))?;
        let pgid = child.id().map(|p| p as i32);
        // Declared after `child`, so dropped before it: the group leader is not reaped yet
        // when its group is killed.
        let mut group = KillGroupOnDrop(pgid);
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(status)) => {
                group.0 = None;
                Ok(status.code().unwrap_or(128))
            }
            Ok(Err(e)) => Err(io(id, "wait exec")(e)),
            Err(_) => {
                if let Some(p) = group.0.take() {
                    let _ = killpg(Pid::from_raw(p), Signal::SIGKILL);
                }
                let _ = child.wait().await;
                Err(RuntimeError::ExecTimeout {
                    id: id.to_string(),
                    timeout,
                })
            }
        }
    }

    fn list(&self) -> Vec<ContainerInfo> {
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| self.meta(&e.file_name().to_string_lossy()).ok())
            .map(|m| m.info)
            .collect()
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        if let Ok(meta) = self.meta(id) {
            if self.any_alive(id) {
                self.kill_all(id).await?;
            }
            cgroup::remove(&meta.cgroups);
        }
        match std::fs::remove_dir_all(self.dir(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(id, "remove container directory")(e)),
        }
    }
}

/// SIGKILLs an exec's process group when the exec is abandoned (its future dropped, e.g. a
/// preStop hook cut short by a self-fence) or fails, unless disarmed (`.0 = None`).
struct KillGroupOnDrop(Option<i32>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = killpg(Pid::from_raw(p), Signal::SIGKILL);
        }
    }
}
