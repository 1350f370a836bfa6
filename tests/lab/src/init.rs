//! PID 1 of a lab machine.
//!
//! A PID namespace's first process must reap orphans, or the machine fills with zombies, and
//! when it dies the kernel kills everything else in the namespace: that is the machine's
//! power switch.

use anyhow::{Context, Result};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{sethostname, Pid};

/// Sets the hostname, starts `command`, reaps every child, and exits with the command's code.
pub fn run(hostname: &str, command: &[String]) -> Result<()> {
    sethostname(hostname).context("setting the machine's hostname")?;
    let (program, args) = command.split_first().context("no command given")?;
    let child = std::process::Command::new(program)
        .args(args)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let main = Pid::from_raw(child.id() as i32);
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::empty())) {
            Ok(WaitStatus::Exited(pid, code)) if pid == main => std::process::exit(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == main => {
                std::process::exit(128 + sig as i32)
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context("waiting for the machine's processes"),
        }
    }
}
