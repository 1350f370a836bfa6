//! The container shim: a tiny mode of the `palisade-node` binary that sets a container up and
//! runs it, so that no `unsafe` pre-exec hook is needed.
//!
//! `palisade-node __shim <dir>` reads `<dir>/launch.json`, starts a new session (its own
//! process group), joins the container's cgroups, mounts the container's volumes at their
//! `mountPath` in a mount namespace of its own ([`crate::mounts::apply`]), chroots into the
//! image's root filesystem, enters the working directory and spawns the container's main
//! process, which inherits all of that. It writes the main pid to `<dir>/pid`, waits, and writes the exit status to
//! `<dir>/exit.json`. Because the shim outlives an agent restart, the exit code survives it.
//!
//! `palisade-node __shim-exec <dir> <argv...>` does the same setup (mounts included, in a
//! namespace of its own) for a probe or hook command and exits with the command's code.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use jiff::Timestamp;

/// The first argument that selects the container shim.
pub const SHIM_ARG: &str = "__shim";
/// The first argument that selects the exec shim.
pub const SHIM_EXEC_ARG: &str = "__shim-exec";

/// What the shim is told to run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Launch {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Environment (the process gets nothing else).
    pub env: Vec<(String, String)>,
    /// Working directory inside the root filesystem.
    pub working_dir: Option<String>,
    /// Root filesystem to chroot into.
    pub rootfs: Option<PathBuf>,
    /// Volumes to mount before the chroot (absent in launch files of older agents).
    #[serde(default)]
    pub mounts: Vec<crate::mounts::Mount>,
    /// cgroup directories to join.
    pub cgroups: Vec<PathBuf>,
}

/// What the shim writes when the main process ends or cannot start.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ExitRecord {
    /// Exit code (128 + signal when killed by a signal).
    pub code: i32,
    /// The signal, if any.
    pub signal: Option<i32>,
    /// When the shim saw the exit.
    pub finished_at: Timestamp,
    /// Set when the process could not be started at all.
    pub start_error: Option<String>,
    /// Set when it could not start because its volumes could not be mounted.
    #[serde(default)]
    pub mount_failed: bool,
}

/// Why the shim could not set a container up.
enum SetupError {
    /// Mounting the volumes failed.
    Mount(String),
    /// Anything else.
    Other(String),
}

impl SetupError {
    fn message(self) -> String {
        match self {
            SetupError::Mount(m) | SetupError::Other(m) => m,
        }
    }
}

fn setup(launch: &Launch) -> Result<(), SetupError> {
    crate::cgroup::join(&launch.cgroups, std::process::id())
        .map_err(|e| SetupError::Other(e.to_string()))?;
    crate::mounts::apply(&launch.mounts, launch.rootfs.as_deref())
        .map_err(|e| SetupError::Mount(e.to_string()))?;
    if let Some(root) = &launch.rootfs {
        nix::unistd::chroot(root)
            .map_err(|e| SetupError::Other(format!("chroot {}: {e}", root.display())))?;
        std::env::set_current_dir("/").map_err(|e| SetupError::Other(format!("chdir /: {e}")))?;
    }
    if let Some(wd) = &launch.working_dir {
        std::env::set_current_dir(wd)
            .map_err(|e| SetupError::Other(format!("working directory {wd}: {e}")))?;
    }
    Ok(())
}

fn command(launch: &Launch, argv: &[String]) -> Result<Command, String> {
    let Some((prog, args)) = argv.split_first() else {
        return Err("no command given and the image has no entrypoint".into());
    };
    let mut cmd = Command::new(prog);
    cmd.args(args).env_clear().envs(launch.env.iter().cloned());
    Ok(cmd)
}

fn write_exit(file: &mut std::fs::File, rec: &ExitRecord) {
    if let Ok(s) = serde_json::to_vec(rec) {
        let _ = file.write_all(&s);
        let _ = file.sync_all();
    }
}

fn read_launch(dir: &Path) -> Result<Launch, String> {
    let raw =
        std::fs::read(dir.join("launch.json")).map_err(|e| format!("read launch.json: {e}"))?;
    serde_json::from_slice(&raw).map_err(|e| format!("parse launch.json: {e}"))
}

/// Runs the container shim; returns the process exit code.
pub fn run_container(dir: &Path) -> i32 {
    // A new session: the container has its own process group and no controlling terminal.
    let _ = nix::unistd::setsid();
    let (Ok(mut pid_file), Ok(mut exit_file)) = (
        std::fs::File::create(dir.join("pid")),
        std::fs::File::create(dir.join("exit.json")),
    ) else {
        return 120;
    };
    let fail_with = |exit_file: &mut std::fs::File, msg: String, mount_failed: bool| {
        write_exit(
            exit_file,
            &ExitRecord {
                code: 128,
                signal: None,
                finished_at: Timestamp::now(),
                start_error: Some(msg),
                mount_failed,
            },
        );
        128
    };
    let fail = |exit_file: &mut std::fs::File, msg: String| fail_with(exit_file, msg, false);
    let launch = match read_launch(dir) {
        Ok(l) => l,
        Err(e) => return fail(&mut exit_file, e),
    };
    // Opened before the chroot: an image's root filesystem need not have a /dev/null.
    let null = match std::fs::File::open("/dev/null") {
        Ok(f) => f,
        Err(e) => return fail(&mut exit_file, format!("open /dev/null: {e}")),
    };
    match setup(&launch) {
        Ok(()) => {}
        Err(SetupError::Mount(m)) => return fail_with(&mut exit_file, m, true),
        Err(SetupError::Other(m)) => return fail(&mut exit_file, m),
    }
    let mut cmd = match command(&launch, &launch.argv) {
        Ok(c) => c,
        Err(e) => return fail(&mut exit_file, e),
    };
    cmd.stdin(Stdio::from(null));
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let prog = launch.argv.first().cloned().unwrap_or_default();
            return fail(&mut exit_file, format!("exec {prog:?}: {e}"));
        }
    };
    let _ = pid_file.write_all(child.id().to_string().as_bytes());
    let _ = pid_file.sync_all();
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return 121,
        }
    };
    let signal = status.signal();
    let code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
    write_exit(
        &mut exit_file,
        &ExitRecord {
            code,
            signal,
            finished_at: Timestamp::now(),
            start_error: None,
            mount_failed: false,
        },
    );
    0
}

/// Runs the exec shim; returns the command's exit code (126 when it cannot start).
pub fn run_exec(dir: &Path, argv: &[String]) -> i32 {
    let launch = match read_launch(dir) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return 126;
        }
    };
    if let Err(e) = setup(&launch) {
        eprintln!("{}", e.message());
        return 126;
    }
    let mut cmd = match command(&launch, argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 126;
        }
    };
    match cmd.status() {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(e) => {
            eprintln!("exec: {e}");
            127
        }
    }
}
