//! The container runtime behind a small trait, so the lifecycle code never touches the
//! kernel directly and a CRI backend can come later. [`process`] is the implementation used
//! today: each container is a real process tree in its own session and cgroup.

#[cfg(test)]
pub mod fake;
pub mod process;

use std::path::PathBuf;
use std::time::Duration;

use jiff::Timestamp;

/// Errors of a runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The container could not be started (bad command, bad image, ...).
    #[error("container {id}: start failed: {message}")]
    StartFailed {
        /// The container.
        id: String,
        /// Why.
        message: String,
    },
    /// The container's volumes could not be mounted; it did not start.
    #[error("container {id}: {message}")]
    MountFailed {
        /// The container.
        id: String,
        /// Why.
        message: String,
    },
    /// No such container.
    #[error("container {id} not found")]
    NotFound {
        /// The container.
        id: String,
    },
    /// An I/O error on the container's state.
    #[error("container {id}: {context}: {source}")]
    Io {
        /// The container.
        id: String,
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A cgroup operation failed.
    #[error("container {id}: {source}")]
    Cgroup {
        /// The container.
        id: String,
        /// The underlying error.
        #[source]
        source: crate::cgroup::CgroupError,
    },
    /// An exec in the container timed out.
    #[error("container {id}: exec timed out after {timeout:?}")]
    ExecTimeout {
        /// The container.
        id: String,
        /// The timeout.
        timeout: Duration,
    },
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerConfig {
    /// Pod UID.
    pub pod_uid: String,
    /// Container name.
    pub name: String,
    /// Restart attempt (0 for the first start).
    pub attempt: u32,
    /// Program and arguments (command + args).
    pub argv: Vec<String>,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// Working directory (inside the root filesystem).
    pub working_dir: Option<String>,
    /// Root filesystem to chroot into; `None` runs on the host's.
    pub rootfs: Option<PathBuf>,
}

impl ContainerConfig {
    /// The container id: unique per pod UID, container and attempt.
    pub fn id(&self) -> String {
        format!("{}_{}_{}", self.pod_uid, self.name, self.attempt)
    }
}

/// A known container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerInfo {
    /// Container id.
    pub id: String,
    /// Pod UID.
    pub pod_uid: String,
    /// Container name.
    pub name: String,
    /// Restart attempt.
    pub attempt: u32,
    /// When the main process started.
    pub started_at: Timestamp,
}

/// How a container's main process ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitStatus {
    /// Exit code (128 + signal for a signal).
    pub code: i32,
    /// The signal that killed it, if any.
    pub signal: Option<i32>,
    /// When the exit was observed.
    pub finished_at: Timestamp,
}

/// The runtime interface the pod workers use.
#[async_trait::async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// Starts a container without volume mounts; returns once its main process runs (or
    /// fails to start).
    async fn start(&self, config: &ContainerConfig) -> Result<ContainerInfo, RuntimeError> {
        self.start_with_mounts(config, &[]).await
    }
    /// Starts a container whose `mounts` are bind-mounted in a mount namespace of its own
    /// ([`crate::mounts`]); [`RuntimeError::MountFailed`] when they cannot be (it did not
    /// start).
    async fn start_with_mounts(
        &self,
        config: &ContainerConfig,
        mounts: &[crate::mounts::Mount],
    ) -> Result<ContainerInfo, RuntimeError>;
    /// Sends `signal` to the container's main process.
    fn signal(&self, id: &str, signal: nix::sys::signal::Signal) -> Result<(), RuntimeError>;
    /// SIGKILLs every process of the container (grandchildren included) and returns once
    /// none is left.
    async fn kill_all(&self, id: &str) -> Result<(), RuntimeError>;
    /// The exit status if the main process has exited, without blocking.
    fn exit_status(&self, id: &str) -> Result<Option<ExitStatus>, RuntimeError>;
    /// Waits for the main process to exit.
    async fn wait(&self, id: &str) -> Result<ExitStatus, RuntimeError>;
    /// Whether any process of the container is still alive.
    fn any_alive(&self, id: &str) -> bool;
    /// Runs a command in the container's context (root filesystem, env, cgroup); returns its
    /// exit code.
    async fn exec(&self, id: &str, argv: &[String], timeout: Duration)
        -> Result<i32, RuntimeError>;
    /// Every container the runtime knows (including exited ones not yet removed).
    fn list(&self) -> Vec<ContainerInfo>;
    /// Forgets an exited container (cgroups and state removed).
    async fn remove(&self, id: &str) -> Result<(), RuntimeError>;
}
