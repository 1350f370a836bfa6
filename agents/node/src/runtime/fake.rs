//! A recording fake of [`Runtime`] for unit tests.
//!
//! Containers are rows in a table. Each one behaves as its [`Script`] (looked up by container
//! name) says: it exits by itself after a while or runs until it is signalled, it obeys TERM
//! or ignores it, and KILL kills it, leaves it alive or fails. Exec commands (probes, hooks) answer as their [`ExecScript`] (looked up by
//! the command's first word) says. Every call is recorded with the tokio clock, so tests run
//! with paused time and assert exact instants.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use jiff::Timestamp;
use nix::sys::signal::Signal;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{ContainerConfig, ContainerInfo, ExitStatus, Runtime, RuntimeError};

/// How every container with a given name behaves, at every attempt.
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// The main process exits by itself this long after the start, with this code.
    pub exits_after: Option<(Duration, i32)>,
    /// TERM (or any signal but KILL) does nothing; only KILL stops it.
    pub ignores_term: bool,
    /// `kill_all` returns success but leaves the container alive (a process stuck in the
    /// kernel).
    pub survives_kill: bool,
    /// `kill_all` fails and leaves the container alive.
    pub kill_fails: bool,
}

/// How an exec command behaves.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExecScript {
    /// Its exit code.
    pub code: i32,
    /// How long it runs (cut off at the exec's timeout, which is then an error).
    pub takes: Duration,
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// A container started.
    Start {
        /// Container name.
        name: String,
        /// Restart attempt.
        attempt: u32,
    },
    /// A signal was sent to the main process.
    Signal {
        /// Container name.
        name: String,
        /// The signal.
        signal: Signal,
        /// Whether the main process was still running when it was sent.
        alive: bool,
    },
    /// Every process of the container was SIGKILLed.
    KillAll {
        /// Container name.
        name: String,
        /// Whether the main process was still running before the kill.
        alive: bool,
    },
    /// A command ran in the container.
    Exec {
        /// Container name.
        name: String,
        /// The command.
        argv: Vec<String>,
    },
}

struct Fake {
    info: ContainerInfo,
    exit_at: Option<(Instant, i32)>,
    script: Script,
    exited: Option<ExitStatus>,
}

impl Fake {
    /// Applies a scripted exit that is due.
    fn settle(&mut self) {
        if self.exited.is_none() {
            if let Some((_, code)) = self.exit_at.filter(|(at, _)| *at <= Instant::now()) {
                self.exited = Some(ExitStatus {
                    code,
                    signal: None,
                    finished_at: Timestamp::now(),
                });
            }
        }
    }

    fn end(&mut self, signal: Signal) {
        if self.exited.is_none() {
            self.exited = Some(ExitStatus {
                code: 128 + signal as i32,
                signal: Some(signal as i32),
                finished_at: Timestamp::now(),
            });
        }
    }
}

#[derive(Default)]
struct State {
    scripts: HashMap<String, Script>,
    execs: HashMap<String, ExecScript>,
    containers: BTreeMap<String, Fake>,
    calls: Vec<(Instant, Call)>,
}

/// The fake runtime. See the module documentation.
#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
    changed: Notify,
}

impl FakeRuntime {
    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Sets how containers named `name` behave from their next start on.
    pub fn script(&self, name: &str, script: Script) {
        self.lock().scripts.insert(name.into(), script);
    }

    /// Sets how the exec command whose first word is `command` behaves from now on.
    pub fn exec_script(&self, command: &str, script: ExecScript) {
        self.lock().execs.insert(command.into(), script);
    }

    /// Every call so far, with its instant.
    pub fn calls(&self) -> Vec<(Instant, Call)> {
        self.lock().calls.clone()
    }

    /// The instants at which containers named `name` started.
    pub fn starts(&self, name: &str) -> Vec<Instant> {
        self.calls()
            .into_iter()
            .filter_map(|(at, c)| {
                matches!(c, Call::Start { name: n, .. } if n == name).then_some(at)
            })
            .collect()
    }

    /// The instants at which `signal` reached a running container named `name`.
    pub fn signals(&self, name: &str, signal: Signal) -> Vec<Instant> {
        self.calls()
            .into_iter()
            .filter_map(|(at, c)| {
                matches!(c, Call::Signal { name: n, signal: s, alive: true } if n == name && s == signal)
                    .then_some(at)
            })
            .collect()
    }

    /// The instants at which a running container named `name` was SIGKILLed (not the cleanup
    /// kills of containers that had already exited).
    pub fn kills(&self, name: &str) -> Vec<Instant> {
        self.calls()
            .into_iter()
            .filter_map(|(at, c)| {
                matches!(c, Call::KillAll { name: n, alive: true } if n == name).then_some(at)
            })
            .collect()
    }

    /// Whether a container named `name` is running now.
    pub fn running(&self, name: &str) -> bool {
        let mut st = self.lock();
        st.containers.values_mut().any(|f| {
            f.settle();
            f.info.name == name && f.exited.is_none()
        })
    }

    fn record(st: &mut State, call: Call) {
        st.calls.push((Instant::now(), call));
    }
}

#[async_trait::async_trait]
impl Runtime for FakeRuntime {
    async fn start_with_mounts(
        &self,
        config: &ContainerConfig,
        _mounts: &[crate::mounts::Mount],
    ) -> Result<ContainerInfo, RuntimeError> {
        let mut st = self.lock();
        let script = st.scripts.get(&config.name).cloned().unwrap_or_default();
        let info = ContainerInfo {
            id: config.id(),
            pod_uid: config.pod_uid.clone(),
            name: config.name.clone(),
            attempt: config.attempt,
            started_at: Timestamp::now(),
        };
        Self::record(
            &mut st,
            Call::Start {
                name: config.name.clone(),
                attempt: config.attempt,
            },
        );
        st.containers.insert(
            info.id.clone(),
            Fake {
                info: info.clone(),
                exit_at: script
                    .exits_after
                    .map(|(after, code)| (Instant::now() + after, code)),
                script,
                exited: None,
            },
        );
        Ok(info)
    }

    fn signal(&self, id: &str, signal: Signal) -> Result<(), RuntimeError> {
        let mut st = self.lock();
        let f = st
            .containers
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound { id: id.into() })?;
        f.settle();
        let alive = f.exited.is_none();
        if signal == Signal::SIGKILL || !f.script.ignores_term {
            f.end(signal);
        }
        let name = f.info.name.clone();
        Self::record(
            &mut st,
            Call::Signal {
                name,
                signal,
                alive,
            },
        );
        drop(st);
        self.changed.notify_waiters();
        Ok(())
    }

    async fn kill_all(&self, id: &str) -> Result<(), RuntimeError> {
        let mut st = self.lock();
        let f = st
            .containers
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound { id: id.into() })?;
        f.settle();
        let alive = f.exited.is_none();
        let (survives, fails) = (f.script.survives_kill, f.script.kill_fails);
        if !survives && !fails {
            f.end(Signal::SIGKILL);
        }
        let name = f.info.name.clone();
        Self::record(&mut st, Call::KillAll { name, alive });
        drop(st);
        self.changed.notify_waiters();
        if fails {
            return Err(RuntimeError::Io {
                id: id.into(),
                context: "kill",
                source: std::io::Error::other("scripted kill failure"),
            });
        }
        Ok(())
    }

    fn exit_status(&self, id: &str) -> Result<Option<ExitStatus>, RuntimeError> {
        let mut st = self.lock();
        let f = st
            .containers
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound { id: id.into() })?;
        f.settle();
        Ok(f.exited.clone())
    }

    async fn wait(&self, id: &str) -> Result<ExitStatus, RuntimeError> {
        loop {
            // Registered before the check, so a kill in between is not missed.
            let changed = self.changed.notified();
            let exit_at = {
                let mut st = self.lock();
                let f = st
                    .containers
                    .get_mut(id)
                    .ok_or_else(|| RuntimeError::NotFound { id: id.into() })?;
                f.settle();
                if let Some(e) = &f.exited {
                    return Ok(e.clone());
                }
                f.exit_at.map(|(at, _)| at)
            };
            match exit_at {
                Some(at) => tokio::select! {
                    _ = changed => {}
                    _ = tokio::time::sleep_until(at) => {}
                },
                None => changed.await,
            }
        }
    }

    fn any_alive(&self, id: &str) -> bool {
        let mut st = self.lock();
        st.containers.get_mut(id).is_some_and(|f| {
            f.settle();
            f.exited.is_none()
        })
    }

    async fn exec(
        &self,
        id: &str,
        argv: &[String],
        timeout: Duration,
    ) -> Result<i32, RuntimeError> {
        let script = {
            let mut st = self.lock();
            let name = st
                .containers
                .get(id)
                .map(|f| f.info.name.clone())
                .ok_or_else(|| RuntimeError::NotFound { id: id.into() })?;
            Self::record(
                &mut st,
                Call::Exec {
                    name,
                    argv: argv.to_vec(),
                },
            );
            let command = argv.first().cloned().unwrap_or_default();
            st.execs.get(&command).copied().unwrap_or_default()
        };
        if script.takes > timeout {
            tokio::time::sleep(timeout).await;
            return Err(RuntimeError::ExecTimeout {
                id: id.into(),
                timeout,
            });
        }
        tokio::time::sleep(script.takes).await;
        Ok(script.code)
    }

    fn list(&self) -> Vec<ContainerInfo> {
        self.lock()
            .containers
            .values()
            .map(|f| f.info.clone())
            .collect()
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        self.lock().containers.remove(id);
        Ok(())
    }
}
