//! QEMU machines: lab machines that are real virtual machines, powered by their BMC.
//!
//! A QEMU machine keeps everything a namespace machine has (its network namespace on the hub
//! bridge, its `ipmi_sim` BMC on loopback, its PDU outlets) but what the BMC powers is a
//! QEMU virtual machine: Debian's kernel (uncompressed, booted through its PVH entry) with the
//! lab's busybox initramfs (`guest/init`). The BMC's `startcmd` execs QEMU, so IPMI power
//! on/off/cycle/reset/soft really start, stop and reset the VM; the BMC is also the VM's own
//! BMC (`ipmi-bmc-extern` + `isa-ipmi-kcs`: the guest sees `/dev/ipmi0`).
//!
//! The VM's NIC is a tap in the machine's network namespace, bridged there with the
//! machine's link to the hub, so partitions cut the VM exactly as they cut a namespace
//! machine, while QEMU itself stays in the host namespace with the BMC (out of band). The
//! machine's guest directory is shared into the VM over 9p at `/machine` (read-write): the
//! command, its environment, the node kubeconfig, and what the guest writes back
//! (`boot_id`, `product_uuid`, `guest-command.log`). The serial console goes to
//! `console.log`. An `i6300esb` watchdog resets or powers off a guest that stops petting it.
//!
//! Like a diskless node booting its image from the network, the guest mounts the host's
//! `/usr` and the directory of the lab's binaries (the suite's `target/<profile>`) read-only
//! over 9p, at the same paths: the very `palisade-node` and workload binaries the suite built
//! run inside the VM, dynamically linked against the host's libraries, with no second build.
//! The lab's shared directory (`Lab::shared_dir`, where workloads write what the suite reads
//! back) is mounted read-write at its own path. Nothing else of the host is visible (the rest
//! of the lab directory, with the BMC credentials, is not).

use std::fs::File;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sched::{setns, CloneFlags};

use crate::error::{LabError, Result};

/// What kind of machine a lab builds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MachineKind {
    /// A set of Linux namespaces (network, PID, mount, UTS): cheap, boots in milliseconds.
    #[default]
    Namespace,
    /// A QEMU virtual machine with its own kernel, boot ID, SMBIOS identity and watchdog.
    Qemu,
}

/// What the VM's i6300esb watchdog does when it expires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WatchdogAction {
    /// Hard reset: the VM reboots in place (new boot ID; the BMC keeps reporting on).
    #[default]
    Reset,
    /// Power off: QEMU exits and the BMC reports the machine off.
    Poweroff,
}

impl WatchdogAction {
    fn qemu_name(self) -> &'static str {
        match self {
            WatchdogAction::Reset => "reset",
            WatchdogAction::Poweroff => "poweroff",
        }
    }
}

/// How QEMU machines are built.
#[derive(Clone, Debug)]
pub struct QemuConfig {
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// The i6300esb heartbeat in seconds; 0 leaves the guest without a watchdog driver.
    /// With a heartbeat the driver is loaded with `nowayout=1`: once the guest's command
    /// opens `/dev/watchdog`, it must keep petting it or the machine is reset or powered off.
    pub watchdog_seconds: u32,
    /// What the watchdog does on expiry.
    pub watchdog_action: WatchdogAction,
    /// How long to wait for a guest to report ready after power on.
    pub boot_timeout: std::time::Duration,
    /// The guest kernel directory; `None` means [`guest_kernel_dir`].
    pub guest_kernel: Option<PathBuf>,
}

impl Default for QemuConfig {
    fn default() -> Self {
        QemuConfig {
            memory_mib: 128,
            watchdog_seconds: 0,
            watchdog_action: WatchdogAction::Reset,
            boot_timeout: std::time::Duration::from_secs(120),
            guest_kernel: None,
        }
    }
}

/// The guest kernel directory that `hack/install-deps.sh` fills: `vmlinux`, `version` and
/// the depmod'ed `lib/modules/<version>`. `$PALISADE_GUEST_KERNEL` overrides it.
pub fn guest_kernel_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PALISADE_GUEST_KERNEL") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/palisade/guest-kernel")
}

/// The directory holding `mkinitramfs.sh` and the guest's `init`.
fn guest_src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("guest")
}

/// True if this host can run hardware-accelerated guests. `/dev/kvm` alone proves nothing
/// (paravirtualised KVM hosts expose it, and stock guests hang there), so the CPU must also
/// advertise VMX or SVM.
pub fn kvm_usable() -> bool {
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = flags
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    hw && std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// The guest assets every QEMU machine of a lab boots: the kernel and the initramfs built for
/// this lab.
#[derive(Clone, Debug)]
pub(crate) struct GuestAssets {
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
}

/// Checks the guest kernel and builds the initramfs into `lab_dir`. `machine` and
/// `console_log` name the first machine that needs them, for the error.
pub(crate) fn prepare_assets(
    lab_dir: &Path,
    config: &QemuConfig,
    machine: &str,
    console_log: &Path,
) -> Result<GuestAssets> {
    crate::require_tool("qemu-system-x86_64")?;
    let kdir = config.guest_kernel.clone().unwrap_or_else(guest_kernel_dir);
    let vmlinux = kdir.join("vmlinux");
    if !vmlinux.is_file() || !kdir.join("version").is_file() {
        return Err(LabError::Guest {
            machine: machine.into(),
            console_log: console_log.to_path_buf(),
            reason: format!(
                "no guest kernel at {} (run hack/install-deps.sh, or set PALISADE_GUEST_KERNEL)",
                vmlinux.display()
            ),
        });
    }
    let initramfs = lab_dir.join("initramfs.cpio");
    crate::process::run(
        Command::new("/bin/sh")
            .arg(guest_src_dir().join("mkinitramfs.sh"))
            .arg(&kdir)
            .arg(&initramfs),
    )
    .map_err(|e| LabError::Guest {
        machine: machine.into(),
        console_log: console_log.to_path_buf(),
        reason: format!("building the guest initramfs: {e}"),
    })?;
    Ok(GuestAssets { vmlinux, initramfs })
}

/// Everything the boot command of one VM depends on.
pub(crate) struct VmSpec<'a> {
    pub name: &'a str,
    pub index: usize,
    pub dir: &'a Path,
    pub guest_dir: &'a Path,
    pub address: std::net::Ipv4Addr,
    pub system_uuid: &'a str,
    pub bmc_link_port: u16,
    pub assets: &'a GuestAssets,
    pub config: &'a QemuConfig,
    /// The directory of the lab's binaries, shared read-only at the same path.
    pub bin_dir: Option<&'a Path>,
    /// The lab's shared directory, shared read-write at the same path.
    pub shared_dir: &'a Path,
}

/// The name of the tap that carries a QEMU machine's NIC inside its network namespace.
pub const TAP: &str = "tap0";

/// The placeholder in QEMU's arguments that [`exec_with_tap`] replaces with the tap's fd.
pub const TAP_FD: &str = "{tapfd}";

/// QEMU's command line for one VM (program first). The NIC is `-netdev tap,fd=` [`TAP_FD`].
pub(crate) fn qemu_args(v: &VmSpec<'_>) -> Vec<String> {
    let accel = if kvm_usable() { "kvm" } else { "tcg" };
    let append = format!(
        "console=ttyS0 panic=-1 quiet no_timer_check pl_name={name} pl_ip={ip}/{prefix} pl_gw={gw} pl_wdt={wdt} pl_9p=machine pl_shared={shared}{bin}",
        name = v.name,
        ip = v.address,
        prefix = crate::netns::PREFIX,
        gw = crate::netns::HUB_ADDR,
        wdt = v.config.watchdog_seconds,
        shared = v.shared_dir.display(),
        bin = v
            .bin_dir
            .map(|d| format!(" pl_bin={}", d.display()))
            .unwrap_or_default(),
    );
    let mut a: Vec<String> = vec![
        "qemu-system-x86_64".into(),
        "-accel".into(),
        accel.into(),
        "-machine".into(),
        "pc".into(),
        "-m".into(),
        v.config.memory_mib.to_string(),
        "-smp".into(),
        "1".into(),
        "-name".into(),
        v.name.into(),
        "-uuid".into(),
        v.system_uuid.into(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-monitor".into(),
        "none".into(),
        // The hypervisor's control socket (QMP): the lab pauses and resumes the whole VM
        // through it, as a hypervisor does (`Machine::pause`).
        "-qmp".into(),
        format!(
            "unix:{},server=on,wait=off",
            v.dir.join(QMP_SOCKET).display()
        ),
        "-kernel".into(),
        v.assets.vmlinux.display().to_string(),
        "-initrd".into(),
        v.assets.initramfs.display().to_string(),
        "-append".into(),
        append,
        "-chardev".into(),
        format!(
            "file,id=con0,path={},append=on",
            v.dir.join("console.log").display()
        ),
        "-serial".into(),
        "chardev:con0".into(),
        "-netdev".into(),
        format!("tap,id=net0,fd={TAP_FD}"),
        "-device".into(),
        format!(
            "virtio-net-pci,netdev=net0,mac=52:54:00:13:{:02x}:{:02x},romfile=",
            (v.index >> 8) & 0xff,
            v.index & 0xff
        ),
        "-chardev".into(),
        format!(
            "socket,id=ipmi0,host=127.0.0.1,port={},reconnect=1",
            v.bmc_link_port
        ),
        "-device".into(),
        "ipmi-bmc-extern,id=bmc0,chardev=ipmi0".into(),
        "-device".into(),
        "isa-ipmi-kcs,bmc=bmc0".into(),
        "-virtfs".into(),
        format!(
            "local,path={},mount_tag=machine,security_model=none,id=machine",
            v.guest_dir.display()
        ),
    ];
    a.extend([
        "-virtfs".into(),
        "local,path=/usr,mount_tag=usr,security_model=none,readonly=on,id=usr".into(),
        "-virtfs".into(),
        format!(
            "local,path={},mount_tag=shared,security_model=none,id=shared",
            v.shared_dir.display()
        ),
    ]);
    if let Some(d) = v.bin_dir {
        a.extend([
            "-virtfs".into(),
            format!(
                "local,path={},mount_tag=bin,security_model=none,readonly=on,id=bin",
                d.display()
            ),
        ]);
    }
    if v.config.watchdog_seconds > 0 {
        a.extend([
            "-device".into(),
            "i6300esb".into(),
            "-action".into(),
            format!("watchdog={}", v.config.watchdog_action.qemu_name()),
        ]);
    }
    a
}

/// The QMP socket's file name in the machine's directory.
pub(crate) const QMP_SOCKET: &str = "qmp.sock";

/// How long one QMP exchange may take (QEMU answers from its main loop, also while paused).
const QMP_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one QMP command (`execute`, no arguments) on the VM behind `socket` and returns its
/// `return` value: the greeting is read, capabilities negotiated, events skipped.
///
/// Guarantees: an `error` answer, a closed socket or a silence of [`QMP_TIMEOUT`] is an
/// error naming the command; nothing is retried (a pause is not sent twice).
pub(crate) fn qmp(socket: &Path, execute: &str) -> Result<serde_json::Value> {
    use std::io::{BufRead, BufReader, Write};
    let fail =
        |why: String| LabError::Other(format!("QMP {execute} on {}: {why}", socket.display()));
    let stream =
        std::os::unix::net::UnixStream::connect(socket).map_err(|e| fail(e.to_string()))?;
    stream
        .set_read_timeout(Some(QMP_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(QMP_TIMEOUT)))
        .map_err(|e| fail(e.to_string()))?;
    let mut writer = stream.try_clone().map_err(|e| fail(e.to_string()))?;
    let mut reader = BufReader::new(stream);
    // The next answer to a command: events (`{"event": ...}`) arrive in between.
    let answer =
        |reader: &mut BufReader<std::os::unix::net::UnixStream>| -> Result<serde_json::Value> {
            loop {
                let mut line = String::new();
                if reader
                    .read_line(&mut line)
                    .map_err(|e| fail(e.to_string()))?
                    == 0
                {
                    return Err(fail("QEMU closed the socket".into()));
                }
                let v: serde_json::Value =
                    serde_json::from_str(&line).map_err(|e| fail(format!("{e}: {line:?}")))?;
                if let Some(r) = v.get("return") {
                    return Ok(r.clone());
                }
                if let Some(e) = v.get("error") {
                    return Err(fail(e.to_string()));
                }
                if v.get("QMP").is_some() {
                    return Ok(v);
                }
            }
        };
    answer(&mut reader)?;
    let mut send = |cmd: &str| -> Result<()> {
        writeln!(writer, "{}", serde_json::json!({ "execute": cmd }))
            .map_err(|e| fail(e.to_string()))
    };
    send("qmp_capabilities")?;
    answer(&mut reader)?;
    send(execute)?;
    answer(&mut reader)
}

/// Quotes a word for `/bin/sh`.
pub(crate) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

// TUNSETIFF = _IOW('T', 202, int); it takes a `struct ifreq`. The one ioctl the lab needs
// that no safe wrapper offers: QEMU's own helper would need a host-wide ACL file instead.
#[allow(unsafe_code)]
mod tun {
    nix::ioctl_write_ptr_bad!(set_iff, 0x400454ca, super::IfReq);
}

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: i16,
    _pad: [u8; 22],
}

const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;

/// Opens tap `tap` inside network namespace `netns`, returns to this process's namespace and
/// execs `command` (QEMU) with the tap's fd in place of every [`TAP_FD`] placeholder. Only
/// returns on error. The exec keeps the PID, so the BMC that started this process tracks
/// QEMU itself.
///
/// Guarantees: the tap is opened in the machine's namespace (where it is bridged to the
/// machine's link), while QEMU runs in the caller's (where the BMC's loopback is).
pub fn exec_with_tap(netns: &str, tap: &str, command: &[String]) -> Result<()> {
    let own_path = "/proc/self/ns/net";
    let own = File::open(own_path).map_err(LabError::io(own_path))?;
    let target_path = Path::new("/run/netns").join(netns);
    let target = File::open(&target_path).map_err(LabError::io(&target_path))?;
    setns(&target, CloneFlags::CLONE_NEWNET)
        .map_err(|e| LabError::Other(format!("setns into {netns}: {e}")))?;
    let opened = open_tap(tap);
    setns(&own, CloneFlags::CLONE_NEWNET)
        .map_err(|e| LabError::Other(format!("setns back from {netns}: {e}")))?;
    let tun = opened?;
    let fd = tun.into_raw_fd().to_string();
    let (program, args) = command
        .split_first()
        .ok_or_else(|| LabError::Other("no QEMU command given".into()))?;
    let args: Vec<String> = args.iter().map(|a| a.replace(TAP_FD, &fd)).collect();
    let err = Command::new(program).args(&args).exec();
    Err(LabError::Command {
        command: program.clone(),
        stderr: err.to_string(),
    })
}

/// Attaches to tap `tap` in the current network namespace; the fd survives exec.
fn open_tap(tap: &str) -> Result<File> {
    if tap.len() >= 16 {
        return Err(LabError::Other(format!("tap name too long: {tap}")));
    }
    // std opens with O_CLOEXEC; the flag is cleared below so that QEMU inherits the fd.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(LabError::io("/dev/net/tun"))?;
    let mut req = IfReq {
        name: [0; 16],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        _pad: [0; 22],
    };
    req.name[..tap.len()].copy_from_slice(tap.as_bytes());
    // SAFETY: `f` is an open /dev/net/tun and `req` a valid, initialised `struct ifreq`
    // that outlives the call; the kernel only reads it.
    #[allow(unsafe_code)]
    let set = unsafe { tun::set_iff(f.as_raw_fd(), &req) };
    set.map_err(|e| LabError::Other(format!("TUNSETIFF {tap}: {e}")))?;
    nix::fcntl::fcntl(
        f.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map_err(|e| LabError::Other(format!("clearing FD_CLOEXEC on the tap: {e}")))?;
    Ok(f)
}
