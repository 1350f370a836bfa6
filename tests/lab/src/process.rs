//! Starting and stopping the lab's daemons, and finding every process a lab owns.
//!
//! Every process the lab starts carries the environment variable [`LAB_ENV`] set to the lab's
//! id, and children inherit it: the BMC's machine, the PDU's handler and whatever they start.
//! Teardown and the reaper sweep `/proc` for that marker, so nothing is left behind even when
//! a process was started by another process (snmpd starting the PDU handler, `ipmi_sim`
//! booting a machine).

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::error::{LabError, Result};

/// The environment variable that marks a process as belonging to a lab.
pub const LAB_ENV: &str = "PALISADE_LAB_ID";
/// The environment variable that marks a process as running on a lab machine.
pub const MACHINE_ENV: &str = "PALISADE_MACHINE";

/// A long-running process started by the lab, with its output in a log file.
#[derive(Debug)]
pub struct Daemon {
    name: String,
    child: Child,
    log: PathBuf,
    // What it was started with, for `restart`.
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
    envs: Vec<(std::ffi::OsString, Option<std::ffi::OsString>)>,
    lab_id: String,
}

impl Daemon {
    /// Starts `cmd` with its stdout and stderr in `log`, marked with the lab id.
    pub fn spawn(name: &str, mut cmd: Command, lab_id: &str, log: &Path) -> Result<Daemon> {
        let program_os = cmd.get_program().to_os_string();
        let args = cmd.get_args().map(|a| a.to_os_string()).collect();
        let envs = cmd
            .get_envs()
            .map(|(k, v)| (k.to_os_string(), v.map(|v| v.to_os_string())))
            .collect();
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(LabError::io(log))?;
        let err = out.try_clone().map_err(LabError::io(log))?;
        cmd.env(LAB_ENV, lab_id)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let program = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd.spawn().map_err(|e| LabError::Command {
            command: program,
            stderr: e.to_string(),
        })?;
        Ok(Daemon {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            program: program_os,
            args,
            envs,
            lab_id: lab_id.to_string(),
        })
    }

    /// Stops the daemon (TERM, then KILL after `grace`) and starts it again with the same
    /// command line, environment and log (appended).
    pub fn restart(&mut self, grace: Duration) -> Result<()> {
        self.stop(grace);
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, v) in &self.envs {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let fresh = Daemon::spawn(&self.name, cmd, &self.lab_id, &self.log)?;
        *self = fresh;
        Ok(())
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The daemon's log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Fails with the end of the log if the daemon has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(LabError::Exited {
                component: self.name.clone(),
                status: status.to_string(),
                tail: log_tail(&self.log, 20),
            }),
            _ => Ok(()),
        }
    }

    /// Polls `probe` until it returns `Ok`, failing early if the daemon exits.
    pub fn wait_ready(
        &mut self,
        timeout: Duration,
        mut probe: impl FnMut() -> std::result::Result<(), String>,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let last = match probe() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(LabError::NotReady {
                    component: self.name.clone(),
                    seconds: timeout.as_secs(),
                    detail: last,
                    log: self.log.display().to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends TERM, waits up to `grace`, then KILL; reaps the process.
    pub fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// A memory figure of a process, in KiB: `field` (for example `"VmRSS"`, `"VmHWM"`) of
/// `/proc/<pid>/status`, or `"Pss"` of `/proc/<pid>/smaps_rollup`. `None` once the process is
/// gone or if the kernel does not report the field.
pub fn memory_kib(pid: i32, field: &str) -> Option<u64> {
    let file = if field == "Pss" {
        "smaps_rollup"
    } else {
        "status"
    };
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The last `lines` lines of a log file, for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
    let mut buf = String::new();
    let _ = f.read_to_string(&mut buf);
    let all: Vec<&str> = buf.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs a short command to completion and fails with its stderr if it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<String> {
    let described = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Command {
            command: described.clone(),
            stderr: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(LabError::Command {
            command: described,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Reads one variable from a process's environment, if the process still exists.
fn environ_var(pid: i32, key: &str) -> Option<String> {
    let data = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{key}=");
    data.split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix(&prefix).map(str::to_string))
}

/// All processes whose environment has `key=value`, except this process.
pub fn pids_with_env(key: &str, value: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| environ_var(*pid, key).as_deref() == Some(value))
        .filter(|pid| !is_zombie(*pid))
        .collect()
}

/// True if the process is gone or a zombie.
pub fn is_zombie(pid: i32) -> bool {
    let Ok(f) = File::open(format!("/proc/{pid}/status")) else {
        return true;
    };
    BufReader::new(f)
        .lines()
        .map_while(|l| l.ok())
        .find(|l| l.starts_with("State:"))
        .is_some_and(|l| l.contains("Z (zombie)") || l.contains("X (dead)"))
}

/// True if `pid` names a live (non-zombie) process.
pub fn alive(pid: i32) -> bool {
    pid > 0 && kill(Pid::from_raw(pid), None).is_ok() && !is_zombie(pid)
}

/// SIGKILLs every process marked with `key=value`, repeating until none is left (a process
/// may fork while the sweep runs), for at most `timeout`.
pub fn kill_marked(key: &str, value: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let pids = pids_with_env(key, value);
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads a pid from a pid file.
pub fn read_pidfile(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}
