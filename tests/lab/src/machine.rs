//! Simulated bare-metal machines and their BMCs.
//!
//! A machine is a network namespace (its NIC, present whether powered or not) plus what its
//! BMC powers. For a [`MachineKind::Namespace`] machine that is a PID, mount and UTS namespace
//! whose first process is `palisade-lab machine-init` running the caller's command: IPMI power
//! off kills the PID namespace, so every process of the machine dies at once, grandchildren
//! included. For a [`MachineKind::Qemu`] machine it is a QEMU virtual machine ([`crate::qemu`]).
//! Either way the BMC is an OpenIPMI `ipmi_sim` on a loopback UDP port whose `startcmd` boots
//! the machine.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::error::{LabError, Result};
use crate::process::{self, alive, read_pidfile, MACHINE_ENV};
use crate::qemu::{self, GuestAssets, MachineKind, QemuConfig};
use crate::{netns, write_executable, write_secret};

/// How to reach and log in to a machine's BMC. The password is only ever in a file.
#[derive(Clone, Debug)]
pub struct BmcInfo {
    /// The BMC's address (loopback).
    pub host: Ipv4Addr,
    /// The BMC's UDP port (RMCP+).
    pub port: u16,
    /// The administrator user name.
    pub user: String,
    /// A file (mode 0600) holding the password.
    pub password_file: PathBuf,
}

impl BmcInfo {
    /// Reads the password from its file.
    pub fn password(&self) -> Result<String> {
        fs::read_to_string(&self.password_file)
            .map(|s| s.trim_end().to_string())
            .map_err(LabError::io(&self.password_file))
    }

    /// An `ipmitool` command for this BMC (RMCP+ with cipher suite 3, a 1 s exchange timeout,
    /// two retries), logged in from the password file (the password is never an argument).
    /// Append the subcommand, for example `["chassis", "power", "status"]`.
    pub fn ipmitool(&self) -> Command {
        let mut c = Command::new("ipmitool");
        c.args(["-I", "lanplus", "-C", "3", "-N", "1", "-R", "2", "-H"])
            .arg(self.host.to_string())
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-U", &self.user, "-f"])
            .arg(&self.password_file);
        c
    }
}

/// One simulated bare-metal machine.
#[derive(Debug)]
pub struct Machine {
    pub(crate) lab_id: String,
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) netns: String,
    pub(crate) hub_link: String,
    pub(crate) dir: PathBuf,
    pub(crate) bmc: BmcInfo,
    pub(crate) outlets: Vec<u32>,
    pub(crate) kind: MachineKind,
    pub(crate) system_uuid: String,
    pub(crate) bmc_guid: String,
}

impl Machine {
    /// The machine's name, also its Kubernetes node name (`m0`, `m1`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The machine's position in the lab, from 0.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The machine's address on the lab bridge.
    pub fn address(&self) -> Ipv4Addr {
        netns::machine_addr(self.index)
    }

    /// The machine's network namespace.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The machine's directory: `console.log`, its BMC's config and logs, `node.kubeconfig`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The machine's console log (what its command prints).
    pub fn console_log(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// The machine's node kubeconfig (exists when the lab has a control plane). A QEMU
    /// machine's is in its guest directory, where the guest reads it as
    /// `/machine/node.kubeconfig`.
    pub fn node_kubeconfig(&self) -> PathBuf {
        match self.kind {
            MachineKind::Namespace => self.dir.join("node.kubeconfig"),
            MachineKind::Qemu => self.guest_dir().join("node.kubeconfig"),
        }
    }

    /// What kind of machine this is.
    pub fn kind(&self) -> MachineKind {
        self.kind
    }

    /// The directory a QEMU machine's guest sees at `/machine` (over 9p, read-write): its
    /// command and environment, its node kubeconfig, and what the guest writes back
    /// (`boot_id`, `product_uuid`, `guest-command.log`). It holds no BMC credentials.
    pub fn guest_dir(&self) -> PathBuf {
        self.dir.join("guest")
    }

    /// The host path of the directory the machine's command sees as `$PALISADE_MACHINE_DIR`:
    /// the machine's directory for a namespace machine, its guest directory (mounted at
    /// `/machine`) for a QEMU machine. Where a command's own files (a supervisor's log, a key
    /// it waits for) are put and read from the host.
    pub fn command_dir(&self) -> PathBuf {
        match self.kind {
            MachineKind::Namespace => self.dir.clone(),
            MachineKind::Qemu => self.guest_dir(),
        }
    }

    /// The SMBIOS system UUID the lab gave this machine (lower case). A QEMU guest reads it
    /// in `/sys/class/dmi/id/product_uuid`.
    pub fn system_uuid(&self) -> &str {
        &self.system_uuid
    }

    /// The GUID the lab configured in this machine's BMC: its SMBIOS UUID in the SMBIOS byte order
    /// (lower case, 8-4-4-4-12 hex, see [`crate::smbios_swapped`]), as a
    /// fencer reads it over IPMI.
    pub fn bmc_guid(&self) -> &str {
        &self.bmc_guid
    }

    /// The boot ID of the machine's current (or last) boot, once the boot has reported it: a
    /// namespace machine's is written by its boot script, a QEMU guest writes its kernel's
    /// `/proc/sys/kernel/random/boot_id`. Every boot has a new one.
    pub fn boot_id(&self) -> Option<String> {
        let file = match self.kind {
            MachineKind::Namespace => self.dir.join("boot_id"),
            MachineKind::Qemu => self.guest_dir().join("boot_id"),
        };
        let id = fs::read_to_string(file).ok()?.trim().to_string();
        (!id.is_empty()).then_some(id)
    }

    /// The process that is the machine's power: QEMU for a QEMU machine, the boot script
    /// for a namespace machine. `None` while off.
    pub fn power_pid(&self) -> Option<i32> {
        read_pidfile(&self.dir.join("boot.pid")).filter(|p| alive(*p))
    }

    /// Waits until the machine has booted with a boot ID other than `previous` (any, if
    /// `None`) and returns it. A QEMU machine has booted once its guest's init has brought up
    /// the network and the 9p share and written its boot ID.
    ///
    /// Fails, naming the machine and its console log, if the machine stays without power for
    /// 15 s or has not booted within `timeout`.
    pub fn wait_booted(&self, previous: Option<&str>, timeout: Duration) -> Result<String> {
        let start = Instant::now();
        let mut last_powered = start;
        loop {
            if let Some(id) = self.boot_id() {
                if previous != Some(id.as_str()) && self.is_powered() {
                    return Ok(id);
                }
            }
            let now = Instant::now();
            if self.is_powered() {
                last_powered = now;
            }
            let reason = if now.duration_since(last_powered) > Duration::from_secs(15) {
                Some(format!(
                    "is not running (QEMU or the boot script exited); its log:\n{}",
                    process::log_tail(&self.dir.join("qemu.log"), 10)
                ))
            } else if now.duration_since(start) > timeout {
                Some(format!(
                    "did not report a new boot within {timeout:?}; console:\n{}",
                    process::log_tail(&self.console_log(), 10)
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(LabError::Guest {
                    machine: self.name.clone(),
                    console_log: self.console_log(),
                    reason,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How to reach the machine's BMC.
    pub fn bmc(&self) -> &BmcInfo {
        &self.bmc
    }

    /// The PDU outlets feeding this machine (1-based).
    pub fn outlets(&self) -> &[u32] {
        &self.outlets
    }

    /// The marker value every process of this machine carries in [`MACHINE_ENV`].
    pub fn marker(&self) -> String {
        format!("{}/{}", self.lab_id, self.name)
    }

    /// True while the machine is powered (its boot process is alive).
    pub fn is_powered(&self) -> bool {
        read_pidfile(&self.dir.join("boot.pid")).is_some_and(alive)
    }

    /// Pauses the whole QEMU machine, as its hypervisor would (QMP `stop`): its vCPU and
    /// every device timer stop, the watchdog's included, and its guest clocks stand still
    /// until [`Machine::resume`]. Its QEMU process lives on, and its BMC reports it on.
    ///
    /// Guarantees: returns once QEMU reports the VM paused (`query-status`), or an error.
    ///
    /// Assumptions: a QEMU machine, powered. A namespace machine has no hypervisor: an error.
    pub fn pause(&self) -> Result<()> {
        self.set_running(false)
    }

    /// Resumes a machine [`Machine::pause`] paused (QMP `cont`): its guest carries on where it
    /// stopped, its timers and clocks from where they stood.
    ///
    /// Guarantees: returns once QEMU reports the VM running, or an error.
    pub fn resume(&self) -> Result<()> {
        self.set_running(true)
    }

    fn set_running(&self, running: bool) -> Result<()> {
        if self.kind != MachineKind::Qemu {
            return Err(LabError::Other(format!(
                "{}: only a QEMU machine has a hypervisor to pause it",
                self.name
            )));
        }
        let socket = self.dir.join(qemu::QMP_SOCKET);
        qemu::qmp(&socket, if running { "cont" } else { "stop" })?;
        let status = qemu::qmp(&socket, "query-status")?;
        if status.get("running").and_then(|r| r.as_bool()) != Some(running) {
            return Err(LabError::Other(format!(
                "{}: QEMU reports {status} after {}",
                self.name,
                if running { "cont" } else { "stop" }
            )));
        }
        Ok(())
    }

    /// Makes every later power off through the BMC take `delay` before the machine stops: a
    /// slow chassis (the BMC reports the machine on until then). `Duration::ZERO` restores
    /// the prompt power off. The delay must stay below [`crate::LabConfig::bmc_kill_wait`]:
    /// the BMC SIGKILLs the boot script after that, which would report off while the
    /// machine's processes live.
    ///
    /// Namespace machines only: a QEMU machine powers off through QEMU.
    pub fn set_power_off_delay(&self, delay: Duration) -> Result<()> {
        let path = self.dir.join("power-off-delay");
        if delay.is_zero() {
            return match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(LabError::io(&path)(e)),
                _ => Ok(()),
            };
        }
        fs::write(&path, format!("{:.3}\n", delay.as_secs_f64())).map_err(LabError::io(&path))
    }

    /// True once the BMC asked the running machine to stop (a namespace machine's boot script
    /// got its SIGTERM), until the machine boots again.
    pub fn power_off_requested(&self) -> bool {
        self.dir.join("off-requested").exists()
    }

    /// True while the machine's BMC process is alive.
    pub fn bmc_running(&self) -> bool {
        read_pidfile(&self.dir.join("bmc.pid")).is_some_and(alive)
    }

    /// Every live process of the machine, as seen from the host.
    pub fn processes(&self) -> Vec<i32> {
        process::pids_with_env(MACHINE_ENV, &self.marker())
    }

    /// Polls until the machine's power matches `on`, for at most `timeout`.
    pub fn wait_power(&self, on: bool, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.is_powered() != on || (!on && !self.processes().is_empty()) {
            if Instant::now() > deadline {
                return Err(LabError::Other(format!(
                    "machine {} did not power {} within {timeout:?}",
                    self.name,
                    if on { "on" } else { "off" }
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Sends `signal` to every process of the machine whose command name is `comm` (as
    /// `/proc/<pid>/comm` reads it) and whose arguments include the word `word` (a service
    /// itself, not the helpers it runs from its own binary with other arguments), and returns
    /// their pids (empty: none ran). A namespace machine's processes are signalled from the
    /// host; a QEMU machine's live in its guest's kernel, so the guest's control loop sends
    /// the signal ([`Machine::guest_control`]) and the pids are the guest's.
    pub fn signal(&self, comm: &str, word: &str, signal: Signal) -> Result<Vec<i32>> {
        match self.kind {
            MachineKind::Namespace => Ok(self
                .processes()
                .into_iter()
                .filter(|p| {
                    fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
                        && fs::read(format!("/proc/{p}/cmdline"))
                            .is_ok_and(|a| a.split(|b| *b == 0).any(|w| w == word.as_bytes()))
                })
                .filter(|p| kill(Pid::from_raw(*p), signal).is_ok())
                .collect()),
            MachineKind::Qemu => {
                if [comm, word]
                    .iter()
                    .any(|w| w.is_empty() || w.contains(char::is_whitespace))
                {
                    return Err(LabError::Other(format!(
                        "{}: a process name and argument to signal are single words: {comm:?} {word:?}",
                        self.name
                    )));
                }
                let name = signal.as_str().trim_start_matches("SIG");
                let reply = self.guest_control(&format!("signal {name} {comm} {word}"))?;
                parse_signalled(&reply).ok_or_else(|| self.guest_refused("signal", &reply))
            }
        }
    }

    /// Steps the machine's wall clock (`CLOCK_REALTIME`) to the host's plus `offset_s`
    /// (negative: behind), as a bad NTP step would; its monotonic clock is untouched. An
    /// offset of 0 puts it back on the true time. Returns the machine's wall clock right
    /// after the step, in whole seconds since the epoch.
    ///
    /// Guarantees: only the guest's kernel clock moves; the host's and the other machines'
    /// do not. The target is absolute (the host's time when the request is written, plus the
    /// offset), so steps never accumulate error: each lands within about a second of what was
    /// asked (whole seconds, as the guest's `date -s` and its RTC at boot, plus the request's
    /// delivery).
    ///
    /// Assumptions: a QEMU machine, powered and booted. A namespace machine shares the host's
    /// kernel clock, which cannot be stepped for one machine: that is an error.
    pub fn set_clock_offset(&self, offset_s: i64) -> Result<i64> {
        if self.kind != MachineKind::Qemu {
            return Err(LabError::Other(format!(
                "{}: only a QEMU machine has a clock of its own to step (a namespace machine \
                 shares the host's)",
                self.name
            )));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| LabError::Other(format!("the host's clock is before 1970: {e}")))?;
        // Rounded to the nearest second: the guest sets whole seconds.
        let target = (now.as_millis() as i64 + 500) / 1_000 + offset_s;
        let reply = self.guest_control(&format!("clock {target}"))?;
        reply
            .strip_prefix("stepped ")
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| self.guest_refused("clock step", &reply))
    }

    fn guest_refused(&self, what: &str, reply: &str) -> LabError {
        LabError::Other(format!(
            "{}: the guest refused the {what}: {reply:?}",
            self.name
        ))
    }

    /// Hands one request to a QEMU guest's control loop (`tests/lab/guest/init`) and waits
    /// for its one-line reply, for at most [`GUEST_CONTROL_TIMEOUT`]. The request travels
    /// over the machine's 9p share (`ctl-request` in [`Machine::guest_dir`]), never over the
    /// network, so a cut machine is still reachable, as through a serial console.
    ///
    /// Guarantees: a request is acted on at most once. On a timeout the request is withdrawn
    /// if the guest had not taken it yet (then it never acts: [`LabError::Guest`] says "not
    /// taken"); if the guest took it but did not answer (frozen, powered off meanwhile) the
    /// error says so, and the request may have been carried out.
    ///
    /// Assumptions: one caller at a time per machine (the nemesis applies one fault per
    /// machine at a time); a second concurrent request waits its turn or times out.
    pub fn guest_control(&self, request: &str) -> Result<String> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.guest_dir();
        let pending = dir.join("ctl-request");
        let reply = dir.join(format!("ctl-reply-{seq}"));
        let deadline = Instant::now() + GUEST_CONTROL_TIMEOUT;
        let fail = |reason: String| LabError::Guest {
            machine: self.name.clone(),
            console_log: self.console_log(),
            reason,
        };
        // One request at a time: wait for the guest to take an earlier one.
        while pending.exists() {
            if Instant::now() > deadline {
                return Err(fail(format!(
                    "an earlier control request is still pending: {request:?} not sent"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let tmp = dir.join(format!("ctl-request.{seq}.tmp"));
        fs::write(&tmp, format!("{seq} {request}\n")).map_err(LabError::io(&tmp))?;
        fs::rename(&tmp, &pending).map_err(LabError::io(&pending))?;
        loop {
            if let Ok(text) = fs::read_to_string(&reply) {
                if text.ends_with('\n') {
                    let _ = fs::remove_file(&reply);
                    return Ok(text.trim().to_string());
                }
            }
            if Instant::now() > deadline {
                let withdrawn = dir.join(format!("ctl-withdrawn-{seq}"));
                // The guest takes a request by renaming it: whoever renames first wins.
                return Err(match fs::rename(&pending, &withdrawn) {
                    Ok(()) => {
                        let _ = fs::remove_file(&withdrawn);
                        fail(format!(
                            "no guest took {request:?} within {GUEST_CONTROL_TIMEOUT:?} (not \
                             taken: nothing was done)"
                        ))
                    }
                    Err(_) => fail(format!(
                        "the guest took {request:?} but did not answer within \
                         {GUEST_CONTROL_TIMEOUT:?} (it may have been carried out)"
                    )),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs a command inside the machine's network namespace (not its PID namespace) and
    /// returns its stdout.
    pub fn exec_in_netns(&self, program: &str, args: &[&str]) -> Result<String> {
        process::run(
            Command::new("ip")
                .args(["netns", "exec", &self.netns, program])
                .args(args),
        )
    }

    /// Starts the BMC; with the machine's outlets on, it boots the machine.
    pub(crate) fn start_bmc(&self) -> Result<()> {
        run_script(&self.dir.join("bmc-start.sh"))?;
        Ok(())
    }

    /// Cuts power the hard way (as a pulled plug): kills the machine, then its BMC.
    pub(crate) fn kill_all(&self) {
        kill_machine_and_bmc(&self.dir, &self.marker());
    }
}

/// How long [`Machine::guest_control`] waits for a guest's answer. The guest polls every
/// 200 ms; a TCG guest on a loaded 2-core host may take a few seconds to be scheduled.
pub const GUEST_CONTROL_TIMEOUT: Duration = Duration::from_secs(15);

/// The pids of a guest's `signalled <pid> ...` reply; `none` is no pid.
fn parse_signalled(reply: &str) -> Option<Vec<i32>> {
    if reply == "none" {
        return Some(Vec::new());
    }
    reply
        .strip_prefix("signalled ")?
        .split_whitespace()
        .map(|p| p.parse().ok())
        .collect()
}

/// Runs a lab shell script through `/bin/sh` rather than executing the file itself: another
/// thread's fork may briefly hold a just-written script open for writing, and executing it
/// then fails with "Text file busy"; reading it does not.
pub fn run_script(path: &Path) -> Result<String> {
    process::run(Command::new("/bin/sh").arg(path))
}

/// Kills a machine (its boot process and everything marked as its) and then its BMC, as a
/// pulled plug does. Shared by the lab's teardown and the PDU handler.
pub fn kill_machine_and_bmc(machine_dir: &Path, marker: &str) {
    if let Some(pid) = read_pidfile(&machine_dir.join("boot.pid")) {
        if alive(pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    process::kill_marked(MACHINE_ENV, marker, Duration::from_secs(5));
    if let Some(pid) = read_pidfile(&machine_dir.join("bmc.pid")) {
        if alive(pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Everything needed to write a machine's files.
pub(crate) struct MachineFiles<'a> {
    pub lab_id: &'a str,
    pub lab_bin: &'a Path,
    /// The lab's shared directory ([`crate::Lab::shared_dir`]).
    pub shared_dir: &'a Path,
    pub machine: &'a Machine,
    pub password: &'a str,
    pub command: &'a str,
    pub extra_env: &'a [(String, String)],
    /// For a QEMU machine: the guest assets and the VM's settings.
    pub qemu: Option<(&'a GuestAssets, &'a QemuConfig)>,
    /// How long the BMC waits after SIGTERM before it SIGKILLs a namespace machine's boot
    /// script.
    pub kill_wait: Duration,
}

/// Writes the BMC config (`lan.conf`, mode 0600: it holds the password), the emulator
/// commands, the boot script that `ipmi_sim` runs as `startcmd`, and the BMC start script.
pub(crate) fn write_files(f: &MachineFiles<'_>) -> Result<()> {
    let m = f.machine;
    let dir = &m.dir;
    fs::create_dir_all(dir.join("bmc-state")).map_err(LabError::io(dir))?;
    let guid: String = m.bmc_guid.replace('-', "");
    let serial_port = crate::ports::free_port();
    let lan = format!(
        "name \"{name}\"\n\
         set_working_mc 0x20\n\
         \x20 startlan 1\n\
         \x20   addr {host} {port}\n\
         \x20   priv_limit admin\n\
         \x20   allowed_auths_callback none md2 md5 straight\n\
         \x20   allowed_auths_user none md2 md5 straight\n\
         \x20   allowed_auths_operator none md2 md5 straight\n\
         \x20   allowed_auths_admin none md2 md5 straight\n\
         \x20   guid {guid}\n\
         \x20 endlan\n\
         \x20 serial 15 127.0.0.1 {serial_port} codec VM\n\
         \x20 startcmd \"/bin/sh {boot}\"\n\
         \x20 startnow true\n\
         \x20 poweroff_wait {poweroff_wait}\n\
         \x20 kill_wait {kill_wait}\n\
         \x20 user 1 true \"\" \"\" user 10 none md2 md5 straight\n\
         \x20 user 2 true \"{user}\" \"{password}\" admin 10 none md2 md5 straight\n\
         \x20 user 3 true \"operator\" \"{password}\" operator 10 none md2 md5 straight\n",
        name = m.name,
        host = m.bmc.host,
        port = m.bmc.port,
        boot = dir.join("boot.sh").display(),
        user = m.bmc.user,
        password = f.password,
        // A VM powers off through the BMC's link to QEMU at once; the waits only matter if
        // that link is down (then the BMC sends SIGTERM, then SIGKILL).
        poweroff_wait = if f.qemu.is_some() { 2 } else { 1 },
        kill_wait = if f.qemu.is_some() {
            5
        } else {
            f.kill_wait.as_secs().max(1)
        },
    );
    write_secret(&dir.join("lan.conf"), lan.as_bytes())?;
    write_secret(&m.bmc.password_file, format!("{}\n", f.password).as_bytes())?;
    let emu = "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n";
    fs::write(dir.join("emu.cmds"), emu).map_err(LabError::io(dir.join("emu.cmds")))?;
    fs::write(dir.join("command.sh"), format!("{}\n", f.command))
        .map_err(LabError::io(dir.join("command.sh")))?;

    let mut env = format!(
        "export {lab_env}='{lab}'\nexport {machine_env}='{marker}'\nexport PALISADE_MACHINE_NAME='{name}'\nexport PALISADE_MACHINE_ADDRESS='{addr}'\nexport PALISADE_MACHINE_DIR='{dir}'\nexport PALISADE_NODE_KUBECONFIG='{kc}'\nexport PALISADE_MACHINE_UUID='{uuid}'\n",
        uuid = m.system_uuid,
        lab_env = process::LAB_ENV,
        lab = f.lab_id,
        machine_env = MACHINE_ENV,
        marker = m.marker(),
        name = m.name,
        addr = m.address(),
        dir = dir.display(),
        kc = m.node_kubeconfig().display(),
    );
    for (k, v) in f.extra_env {
        env.push_str(&format!("export {k}='{v}'\n"));
    }
    if let Some((assets, config)) = f.qemu {
        write_qemu_files(f, assets, config, serial_port)?;
        return write_bmc_start(f);
    }
    // The BMC watches this script's process: it reports the power off once the script exits.
    // On SIGTERM (IPMI power off) the script kills the machine's PID 1 and waits for `unshare`,
    // which returns only once the kernel has reaped every process of the PID namespace, so
    // "off" is never reported while a process of the machine lives (ipmi_sim's kill_wait, the
    // delay before its SIGKILL, leaves 20 s for that; a power-off delay set with
    // `set_power_off_delay` sleeps first, as a slow chassis). Every boot gets a new boot ID.
    let boot = format!(
        "#!/bin/sh\n\
         # Boots lab machine {name}: started by its BMC (ipmi_sim startcmd).\n\
         echo $$ > '{dir}/boot.pid'\n\
         rm -f '{dir}/off-requested'\n\
         cat /proc/sys/kernel/random/uuid > '{dir}/boot_id'\n\
         {env}\
         export PALISADE_BOOT_ID_FILE='{dir}/boot_id'\n\
         ip netns exec '{netns}' unshare --pid --fork --kill-child --mount-proc --uts \\\n\
         \x20 '{bin}' machine-init --hostname '{name}' -- /bin/sh '{dir}/command.sh' >> '{dir}/console.log' 2>&1 &\n\
         child=$!\n\
         off() {{ : > '{dir}/off-requested'; if [ -f '{dir}/power-off-delay' ]; then sleep \"$(cat '{dir}/power-off-delay')\"; fi; init=$(pgrep -P \"$child\" | head -n1); if [ -n \"$init\" ]; then kill -KILL \"$init\"; else kill -KILL \"$child\"; fi; wait \"$child\"; exit 0; }}\n\
         trap off TERM INT\n\
         wait \"$child\"\n",
        name = m.name,
        dir = dir.display(),
        netns = m.netns,
        bin = f.lab_bin.display(),
    );
    write_executable(&dir.join("boot.sh"), &boot)?;
    write_bmc_start(f)
}

/// Writes the script that starts the machine's BMC.
fn write_bmc_start(f: &MachineFiles<'_>) -> Result<()> {
    let m = f.machine;
    let dir = &m.dir;
    let start = format!(
        "#!/bin/sh\n\
         # Starts the BMC of lab machine {name}; it boots the machine (startnow).\n\
         set -e\n\
         cd '{dir}'\n\
         export {lab_env}='{lab}'\n\
         setsid ipmi_sim -c lan.conf -f emu.cmds -s bmc-state -n >> bmc.log 2>&1 < /dev/null &\n\
         echo $! > bmc.pid\n",
        name = m.name,
        dir = dir.display(),
        lab_env = process::LAB_ENV,
        lab = f.lab_id,
    );
    write_executable(&dir.join("bmc-start.sh"), &start)?;
    Ok(())
}

/// Writes a QEMU machine's guest directory (command, environment) and its boot script, which
/// execs QEMU through `palisade-lab qemu-exec` (the tap is opened in the machine's namespace).
fn write_qemu_files(
    f: &MachineFiles<'_>,
    assets: &GuestAssets,
    config: &QemuConfig,
    bmc_link_port: u16,
) -> Result<()> {
    let m = f.machine;
    let dir = &m.dir;
    let guest = m.guest_dir();
    fs::create_dir_all(&guest).map_err(LabError::io(&guest))?;
    let mut env = format!(
        "export PALISADE_MACHINE_NAME='{name}'\nexport PALISADE_MACHINE_ADDRESS='{addr}'\nexport PALISADE_MACHINE_DIR=/machine\nexport PALISADE_NODE_KUBECONFIG=/machine/node.kubeconfig\nexport PALISADE_BOOT_ID_FILE=/proc/sys/kernel/random/boot_id\n",
        name = m.name,
        addr = m.address(),
    );
    for (k, v) in f.extra_env {
        env.push_str(&format!("export {k}='{v}'\n"));
    }
    let env_file = guest.join("guest-env.sh");
    fs::write(&env_file, env).map_err(LabError::io(&env_file))?;
    let cmd_file = guest.join("guest-command.sh");
    fs::write(&cmd_file, format!("{}\n", f.command)).map_err(LabError::io(&cmd_file))?;

    let args = qemu::qemu_args(&qemu::VmSpec {
        name: &m.name,
        index: m.index,
        dir,
        guest_dir: &guest,
        address: m.address(),
        system_uuid: &m.system_uuid,
        bmc_link_port,
        assets,
        config,
        bin_dir: f.lab_bin.parent(),
        shared_dir: f.shared_dir,
    });
    let quoted: Vec<String> = args.iter().map(|a| qemu::sh_quote(a)).collect();
    // `exec` all the way down: the BMC tracks this script's PID, which becomes QEMU's, so
    // "off" means QEMU is gone. The guest rewrites its boot ID once it has booted.
    let boot = format!(
        "#!/bin/sh\n\
         # Boots QEMU lab machine {name}: started by its BMC (ipmi_sim startcmd).\n\
         echo $$ > '{dir}/boot.pid'\n\
         rm -f '{guest}/boot_id' '{guest}/product_uuid'\n\
         export {lab_env}='{lab}'\n\
         export {machine_env}='{marker}'\n\
         exec >> '{dir}/qemu.log' 2>&1 < /dev/null\n\
         exec '{bin}' qemu-exec --netns '{netns}' --tap {tap} -- {args}\n",
        name = m.name,
        dir = dir.display(),
        guest = guest.display(),
        lab_env = process::LAB_ENV,
        lab = f.lab_id,
        machine_env = MACHINE_ENV,
        marker = m.marker(),
        bin = f.lab_bin.display(),
        netns = m.netns,
        tap = qemu::TAP,
        args = quoted.join(" "),
    );
    write_executable(&dir.join("boot.sh"), &boot)
}

#[cfg(test)]
mod tests {
    use super::parse_signalled;

    #[test]
    fn a_guest_reply_names_the_signalled_pids_or_none() {
        assert_eq!(parse_signalled("none"), Some(vec![]));
        assert_eq!(parse_signalled("signalled 41 97"), Some(vec![41, 97]));
        assert_eq!(parse_signalled("signalled 41 x"), None);
        assert_eq!(parse_signalled("failed"), None);
    }
}
