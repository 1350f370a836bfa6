//! Arming the kernel's watchdog device: setting its timeout and making it `nowayout`, and
//! reading both back, so that what the agent advertises on its Lease is what the kernel holds.
//!
//! The controller trusts a node's self-fence only when the node advertises an armed `nowayout`
//! watchdog and its timeout (see `palisade_model::advertise`). A driver's default timeout is
//! not good enough (softdog defaults to 60 s), so the agent sets it itself
//! (`WDIOC_SETTIMEOUT`), reads what the driver accepted (`WDIOC_GETTIMEOUT`: drivers round and
//! clamp), and reads `nowayout` from sysfs (`/sys/class/watchdog/watchdogN/nowayout`), setting
//! it there when asked (the kernel lets it be set, never cleared).
//!
//! The kernel interface sits behind [`Control`] so the arming rules are tested with a fake;
//! [`Linux`] is the real one.
//!
//! A watchdog is trusted for what it does, not for what it is called: [`expiry`] determines
//! what the armed watchdog's expiry does to the machine (reset, power off, the hypervisor's
//! choice, nothing) from its driver and the driver's parameters, and only a watchdog on the
//! small allow-list in [`DRIVERS`] is ever reported as resetting the machine.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_model::advertise::{Virtualization, WatchdogAction};

/// Errors of arming a watchdog.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    /// The driver refused the timeout.
    #[error("watchdog {device}: the driver does not accept a {wanted}s timeout: {source}")]
    SetTimeout {
        /// The device.
        device: PathBuf,
        /// The timeout asked for, seconds.
        wanted: u32,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The timeout cannot be read back.
    #[error("watchdog {device}: cannot read the timeout back: {source}")]
    GetTimeout {
        /// The device.
        device: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The driver holds a timeout the agent cannot pet safely (zero, or not above twice the
    /// petting interval).
    #[error(
        "watchdog {device}: the driver holds a {got}s timeout, too short to pet every {interval:?}"
    )]
    TooShort {
        /// The device.
        device: PathBuf,
        /// The timeout the driver holds, seconds.
        got: u32,
        /// The petting interval.
        interval: Duration,
    },
    /// `nowayout` was asked for and could not be set.
    #[error("watchdog {device}: cannot set nowayout: {source}")]
    SetNowayout {
        /// The device.
        device: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The kernel's view of an open watchdog device.
pub trait Control {
    /// The device, for errors and logs.
    fn device(&self) -> &Path;
    /// Asks the driver for a timeout in seconds (`WDIOC_SETTIMEOUT`).
    fn set_timeout(&self, secs: u32) -> std::io::Result<()>;
    /// The timeout the driver holds, seconds (`WDIOC_GETTIMEOUT`).
    fn timeout(&self) -> std::io::Result<u32>;
    /// Whether the driver refuses the magic close.
    fn nowayout(&self) -> std::io::Result<bool>;
    /// Makes the driver refuse the magic close from now on.
    fn set_nowayout(&self) -> std::io::Result<()>;
}

/// What the agent asks of its watchdog.
#[derive(Debug, Clone, Copy)]
pub struct ArmRequest {
    /// The timeout to set.
    pub timeout: Duration,
    /// Make it `nowayout` if it is not.
    pub nowayout: bool,
    /// How often the agent pets it.
    pub interval: Duration,
}

/// A watchdog as the kernel holds it after [`arm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Armed {
    /// The timeout the driver holds (read back, not the one asked for).
    pub timeout: Duration,
    /// Whether the driver refuses the magic close (read back).
    pub nowayout: bool,
}

/// Sets the watchdog's timeout and, when asked, `nowayout`, and reads both back.
///
/// Guarantees: the returned [`Armed`] holds what the kernel reported *after* the changes, never
/// what was asked for: a driver that rounds the timeout is reported with its own value, and
/// `nowayout` is `true` only when the kernel says so. A timeout that is zero or not above
/// twice the petting interval is an error (the agent could not keep such a watchdog fed).
///
/// Assumptions: the device is open (opening it armed it).
pub fn arm(ctl: &dyn Control, req: ArmRequest) -> Result<Armed, ArmError> {
    let device = ctl.device().to_path_buf();
    let wanted = u32::try_from(req.timeout.as_secs() + u64::from(req.timeout.subsec_nanos() > 0))
        .unwrap_or(u32::MAX);
    ctl.set_timeout(wanted)
        .map_err(|source| ArmError::SetTimeout {
            device: device.clone(),
            wanted,
            source,
        })?;
    let got = ctl.timeout().map_err(|source| ArmError::GetTimeout {
        device: device.clone(),
        source,
    })?;
    if got == 0 || Duration::from_secs(u64::from(got)) <= req.interval * 2 {
        return Err(ArmError::TooShort {
            device,
            got,
            interval: req.interval,
        });
    }
    if req.nowayout && !ctl.nowayout().unwrap_or(false) {
        ctl.set_nowayout().map_err(|source| ArmError::SetNowayout {
            device: device.clone(),
            source,
        })?;
    }
    // Unreadable counts as "can be disarmed": never claim what the kernel did not say.
    let nowayout = ctl.nowayout().unwrap_or(false);
    Ok(Armed {
        timeout: Duration::from_secs(u64::from(got)),
        nowayout,
    })
}

/// The real watchdog: ioctls on the open device, `nowayout` in its sysfs directory.
pub struct Linux<'a> {
    fd: BorrowedFd<'a>,
    device: PathBuf,
    sysfs: Option<PathBuf>,
}

impl<'a> Linux<'a> {
    /// Wraps the open `file` (the device at `device`), finding its sysfs directory under
    /// `sys_class` (normally `/sys/class/watchdog`).
    pub fn new(file: &'a std::fs::File, device: &Path, sys_class: &Path) -> Linux<'a> {
        let sysfs = nix::sys::stat::fstat(file.as_raw_fd())
            .ok()
            .and_then(|st| sysfs_dir(sys_class, st.st_rdev));
        Linux {
            fd: std::os::fd::AsFd::as_fd(file),
            device: device.to_path_buf(),
            sysfs,
        }
    }

    /// The device's `/sys/class/watchdog/watchdogN` directory, if found.
    pub fn sysfs_dir(&self) -> Option<&Path> {
        self.sysfs.as_deref()
    }

    fn nowayout_file(&self) -> std::io::Result<PathBuf> {
        self.sysfs
            .as_ref()
            .map(|d| d.join("nowayout"))
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no /sys/class/watchdog entry for this device",
                )
            })
    }
}

/// The sysfs directory of the watchdog whose character device is `rdev`. The legacy
/// `/dev/watchdog` (misc 10:130) is the first watchdog's.
fn sysfs_dir(sys_class: &Path, rdev: u64) -> Option<PathBuf> {
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    if (major, minor) == (10, 130) {
        let d = sys_class.join("watchdog0");
        return d.is_dir().then_some(d);
    }
    let want = format!("{major}:{minor}");
    std::fs::read_dir(sys_class)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|d| std::fs::read_to_string(d.join("dev")).is_ok_and(|s| s.trim() == want.as_str()))
}

/// How a known driver's expiry acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverClass {
    /// The kernel's software watchdog: a timer in the kernel itself, whose action is its
    /// module parameters' (`soft_noboot`, `soft_panic`).
    Softdog,
    /// A hardware watchdog whose expiry the chipset or the firmware turns into a reset.
    Reset,
    /// A device a hypervisor emulates, whose expiry does what the hypervisor was told (QEMU's
    /// `-watchdog-action` may be `reset`, `poweroff`, but also `none` or `pause`). On bare
    /// metal the same chip resets the machine.
    Emulated,
}

/// The drivers whose expiry action is known: the driver's name (as advertised), the
/// `identity` strings its watchdog reports, and its class. Any other driver's action is
/// [`WatchdogAction::Unknown`].
///
/// The hardware allow-list is kept small on purpose: a driver belongs there only when its
/// expiry resets the machine without any configuration the agent cannot read. The IPMI
/// watchdog (`ipmi_watchdog`) is not listed: it registers no `/sys/class/watchdog` entry and
/// its action is a module parameter that may be `none`.
pub const DRIVERS: &[(&str, &[&str], DriverClass)] = &[
    ("softdog", &["Software Watchdog"], DriverClass::Softdog),
    ("iTCO_wdt", &["iTCO_wdt"], DriverClass::Reset),
    ("sp5100_tco", &["SP5100 TCO timer"], DriverClass::Reset),
    ("wdat_wdt", &["wdat_wdt"], DriverClass::Reset),
    ("sbsa_gwdt", &["SBSA Generic Watchdog"], DriverClass::Reset),
    ("i6300esb", &["i6300ESB timer"], DriverClass::Emulated),
    ("ib700wdt", &["IB700 WDT"], DriverClass::Emulated),
    (
        "diag288_wdt",
        &["z Watchdog timer", "z/VM Watchdog Timer"],
        DriverClass::Emulated,
    ),
    ("xen_wdt", &["Xen WatchDog"], DriverClass::Emulated),
];

/// What the armed watchdog's expiry does, and its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    /// The driver's name from [`DRIVERS`], else its raw `identity` (`None`: unreadable).
    pub driver: Option<String>,
    /// What its expiry does.
    pub action: WatchdogAction,
}

/// Where [`expiry`] reads: the watchdog's sysfs directory and the sysfs and procfs roots.
#[derive(Debug, Clone)]
pub struct ExpiryRoots<'a> {
    /// The watchdog's `/sys/class/watchdog/watchdogN` (`None`: not found).
    pub device: Option<&'a Path>,
    /// The sysfs root (normally `/sys`), for module parameters.
    pub sys: &'a Path,
    /// The procfs root (normally `/proc`), for `sys/kernel/panic`.
    pub proc: &'a Path,
}

fn same_name(a: &str, b: &str) -> bool {
    let norm = |s: &str| s.trim().to_ascii_lowercase().replace('-', "_");
    norm(a) == norm(b)
}

/// What the watchdog's expiry does on this machine (`virtualization` as detected by
/// [`crate::virt::detect`]).
///
/// Guarantees: [`WatchdogAction::Reset`] only for a driver in [`DRIVERS`], identified by its
/// `identity` or by its device's driver (`device/driver`), that is either a hardware watchdog
/// of class [`DriverClass::Reset`], an emulated chip on a machine detected as bare metal, or
/// softdog whose `soft_noboot` reads 0 and whose `soft_panic` reads 0 (or is absent) or
/// `kernel.panic` is non-zero; softdog with `soft_noboot` 1 is [`WatchdogAction::None`]; an
/// emulated chip on a machine that is or may be virtual is [`WatchdogAction::Hypervisor`];
/// anything unreadable or unlisted is [`WatchdogAction::Unknown`]. Never
/// [`WatchdogAction::PowerOff`] today: no listed driver powers off.
///
/// Assumptions: the module parameters are not changed after the agent read them (softdog's
/// are read-only at runtime: `0444`).
pub fn expiry(roots: &ExpiryRoots<'_>, virtualization: &Virtualization) -> Expiry {
    let read = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let identity = roots.device.and_then(|d| read(d.join("identity")));
    let bound = roots.device.and_then(|d| {
        std::fs::read_link(d.join("device/driver"))
            .ok()
            .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
    });
    let known = DRIVERS.iter().find(|(name, ids, _)| {
        let named = |s: &String| same_name(s, name) || ids.iter().any(|id| same_name(s, id));
        identity.as_ref().is_some_and(named) || bound.as_ref().is_some_and(named)
    });
    let Some((name, _, class)) = known else {
        return Expiry {
            driver: identity.or(bound).filter(|s| !s.is_empty()),
            action: WatchdogAction::Unknown,
        };
    };
    let action = match class {
        DriverClass::Reset => WatchdogAction::Reset,
        DriverClass::Emulated if crate::virt::maybe_virtual(virtualization) => {
            WatchdogAction::Hypervisor
        }
        DriverClass::Emulated => WatchdogAction::Reset,
        DriverClass::Softdog => {
            let params = roots.sys.join("module/softdog/parameters");
            let flag = |p: &str| read(params.join(p)).map(|v| v == "1" || v == "Y");
            match (flag("soft_noboot"), flag("soft_panic")) {
                (Some(true), _) => WatchdogAction::None,
                (Some(false), None | Some(false)) => WatchdogAction::Reset,
                (Some(false), Some(true)) => {
                    // A panic reboots only when kernel.panic is non-zero (negative: at once).
                    match read(roots.proc.join("sys/kernel/panic")).map(|v| v.parse::<i64>()) {
                        Some(Ok(0)) | Some(Err(_)) | None => WatchdogAction::Unknown,
                        Some(Ok(_)) => WatchdogAction::Reset,
                    }
                }
                (None, _) => WatchdogAction::Unknown,
            }
        }
    };
    Expiry {
        driver: Some((*name).to_string()),
        action,
    }
}

#[allow(unsafe_code)]
mod ioctl {
    // The watchdog API of linux/watchdog.h.
    nix::ioctl_readwrite!(set_timeout, b'W', 6, nix::libc::c_int);
    nix::ioctl_read!(get_timeout, b'W', 7, nix::libc::c_int);

    /// `WDIOC_SETTIMEOUT`. Safety: `fd` is an open descriptor and `v` lives through the call.
    pub(super) fn set(fd: i32, secs: i32) -> std::io::Result<()> {
        let mut v = secs;
        // SAFETY: a valid fd and a pointer to a live c_int, as the ioctl expects.
        unsafe { set_timeout(fd, &mut v) }.map_err(std::io::Error::from)?;
        Ok(())
    }

    /// `WDIOC_GETTIMEOUT`.
    pub(super) fn get(fd: i32) -> std::io::Result<i32> {
        let mut v = 0;
        // SAFETY: a valid fd and a pointer to a live c_int, as the ioctl expects.
        unsafe { get_timeout(fd, &mut v) }.map_err(std::io::Error::from)?;
        Ok(v)
    }
}

impl Control for Linux<'_> {
    fn device(&self) -> &Path {
        &self.device
    }

    fn set_timeout(&self, secs: u32) -> std::io::Result<()> {
        let secs = i32::try_from(secs).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        ioctl::set(self.fd.as_raw_fd(), secs)
    }

    fn timeout(&self) -> std::io::Result<u32> {
        let v = ioctl::get(self.fd.as_raw_fd())?;
        u32::try_from(v).map_err(|_| std::io::ErrorKind::InvalidData.into())
    }

    fn nowayout(&self) -> std::io::Result<bool> {
        let s = std::fs::read_to_string(self.nowayout_file()?)?;
        match s.trim() {
            "1" => Ok(true),
            "0" => Ok(false),
            other => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("nowayout reads {other:?}"),
            )),
        }
    }

    fn set_nowayout(&self) -> std::io::Result<()> {
        std::fs::write(self.nowayout_file()?, "1")
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A driver that rounds timeouts up to `step`, may refuse them, and may keep nowayout off.
    struct Fake {
        step: u32,
        refuse_timeout: bool,
        timeout: Cell<u32>,
        nowayout: Cell<bool>,
        nowayout_settable: bool,
        nowayout_readable: bool,
    }

    impl Default for Fake {
        fn default() -> Self {
            Fake {
                step: 1,
                refuse_timeout: false,
                timeout: Cell::new(60),
                nowayout: Cell::new(false),
                nowayout_settable: true,
                nowayout_readable: true,
            }
        }
    }

    impl Control for Fake {
        fn device(&self) -> &Path {
            Path::new("/dev/fake-watchdog")
        }
        fn set_timeout(&self, secs: u32) -> std::io::Result<()> {
            if self.refuse_timeout {
                return Err(std::io::ErrorKind::InvalidInput.into());
            }
            self.timeout.set(secs.div_ceil(self.step) * self.step);
            Ok(())
        }
        fn timeout(&self) -> std::io::Result<u32> {
            Ok(self.timeout.get())
        }
        fn nowayout(&self) -> std::io::Result<bool> {
            if !self.nowayout_readable {
                return Err(std::io::ErrorKind::NotFound.into());
            }
            Ok(self.nowayout.get())
        }
        fn set_nowayout(&self) -> std::io::Result<()> {
            if !self.nowayout_settable {
                return Err(std::io::ErrorKind::PermissionDenied.into());
            }
            self.nowayout.set(true);
            Ok(())
        }
    }

    fn req(timeout: u64, nowayout: bool) -> ArmRequest {
        ArmRequest {
            timeout: Duration::from_secs(timeout),
            nowayout,
            interval: Duration::from_secs(2),
        }
    }

    #[test]
    fn the_timeout_advertised_is_the_one_the_driver_holds() {
        let f = Fake {
            step: 4,
            ..Default::default()
        };
        let a = arm(&f, req(10, true)).unwrap();
        assert_eq!(a.timeout, Duration::from_secs(12), "rounded by the driver");
        assert!(a.nowayout);
    }

    #[test]
    fn a_fractional_timeout_is_asked_for_rounded_up() {
        let f = Fake::default();
        let a = arm(
            &f,
            ArmRequest {
                timeout: Duration::from_millis(9_500),
                ..req(0, false)
            },
        )
        .unwrap();
        assert_eq!(a.timeout, Duration::from_secs(10));
    }

    #[test]
    fn a_refused_timeout_is_an_error_not_the_default() {
        let f = Fake {
            refuse_timeout: true,
            ..Default::default()
        };
        assert!(matches!(
            arm(&f, req(10, true)),
            Err(ArmError::SetTimeout { wanted: 10, .. })
        ));
    }

    #[test]
    fn a_timeout_too_short_to_pet_is_refused() {
        let f = Fake::default();
        assert!(matches!(
            arm(&f, req(4, false)),
            Err(ArmError::TooShort { got: 4, .. })
        ));
    }

    #[test]
    fn nowayout_is_set_when_asked_and_only_reported_when_the_kernel_says_so() {
        let f = Fake::default();
        assert!(!arm(&f, req(10, false)).unwrap().nowayout, "not asked");
        assert!(arm(&f, req(10, true)).unwrap().nowayout, "set when asked");

        let f = Fake {
            nowayout_settable: false,
            ..Default::default()
        };
        assert!(matches!(
            arm(&f, req(10, true)),
            Err(ArmError::SetNowayout { .. })
        ));

        let f = Fake {
            nowayout: Cell::new(true),
            nowayout_readable: false,
            ..Default::default()
        };
        assert!(
            !arm(&f, req(10, false)).unwrap().nowayout,
            "an unreadable nowayout is never claimed"
        );
    }

    use crate::fake_tree::Tree;

    impl Tree {
        fn expiry(&self, virt: &Virtualization) -> Expiry {
            let dev = self.0.path().join("sys/class/watchdog/watchdog0");
            let (sys, proc) = (self.0.path().join("sys"), self.0.path().join("proc"));
            expiry(
                &ExpiryRoots {
                    device: Some(&dev),
                    sys: &sys,
                    proc: &proc,
                },
                virt,
            )
        }
    }

    const WD: &str = "sys/class/watchdog/watchdog0";
    const SOFTDOG: &str = "sys/module/softdog/parameters";

    fn kvm() -> Virtualization {
        Virtualization::Virtual("kvm".into())
    }

    #[test]
    fn softdog_resets_unless_soft_noboot() {
        let t = Tree::new();
        t.put(&format!("{WD}/identity"), "Software Watchdog\n")
            .put(&format!("{SOFTDOG}/soft_noboot"), "0\n")
            .put(&format!("{SOFTDOG}/soft_panic"), "0\n");
        let e = t.expiry(&Virtualization::None);
        assert_eq!(e.driver.as_deref(), Some("softdog"));
        assert_eq!(e.action, WatchdogAction::Reset);
        // Inside a VM softdog still resets the guest (the machine is judged separately).
        assert_eq!(t.expiry(&kvm()).action, WatchdogAction::Reset);
        t.put(&format!("{SOFTDOG}/soft_noboot"), "1\n");
        assert_eq!(t.expiry(&Virtualization::None).action, WatchdogAction::None);
    }

    #[test]
    fn softdog_that_panics_resets_only_when_the_kernel_reboots_on_panic() {
        let t = Tree::new();
        t.put(&format!("{WD}/identity"), "Software Watchdog")
            .put(&format!("{SOFTDOG}/soft_noboot"), "0")
            .put(&format!("{SOFTDOG}/soft_panic"), "1");
        assert_eq!(
            t.expiry(&Virtualization::None).action,
            WatchdogAction::Unknown
        );
        t.put("proc/sys/kernel/panic", "0\n");
        assert_eq!(
            t.expiry(&Virtualization::None).action,
            WatchdogAction::Unknown
        );
        t.put("proc/sys/kernel/panic", "10\n");
        assert_eq!(
            t.expiry(&Virtualization::None).action,
            WatchdogAction::Reset
        );
        t.put("proc/sys/kernel/panic", "-1\n");
        assert_eq!(
            t.expiry(&Virtualization::None).action,
            WatchdogAction::Reset
        );
    }

    #[test]
    fn softdog_with_unreadable_parameters_is_unknown() {
        let t = Tree::new();
        t.put(&format!("{WD}/identity"), "Software Watchdog");
        assert_eq!(
            t.expiry(&Virtualization::None).action,
            WatchdogAction::Unknown
        );
    }

    #[test]
    fn an_emulated_watchdog_is_the_hypervisors_on_a_virtual_machine() {
        let t = Tree::new();
        t.put(&format!("{WD}/identity"), "i6300ESB timer\n");
        let e = t.expiry(&kvm());
        assert_eq!(e.driver.as_deref(), Some("i6300esb"));
        assert_eq!(e.action, WatchdogAction::Hypervisor);
        assert_eq!(
            t.expiry(&Virtualization::Unknown).action,
            WatchdogAction::Hypervisor,
            "a machine that may be virtual"
        );
        assert_eq!(
            t.expiry(&Virtualization::None).action,
            WatchdogAction::Reset
        );
    }

    #[test]
    fn hardware_on_the_allow_list_resets_and_anything_else_is_unknown() {
        let t = Tree::new();
        t.put(&format!("{WD}/identity"), "iTCO_wdt");
        let e = t.expiry(&Virtualization::None);
        assert_eq!(
            (e.driver.as_deref(), e.action),
            (Some("iTCO_wdt"), WatchdogAction::Reset)
        );
        let t = Tree::new();
        t.put(&format!("{WD}/identity"), "Acme Watchdog 9000");
        let e = t.expiry(&Virtualization::None);
        assert_eq!(
            (e.driver.as_deref(), e.action),
            (Some("Acme Watchdog 9000"), WatchdogAction::Unknown)
        );
        let t = Tree::new();
        std::fs::create_dir_all(t.0.path().join(WD)).unwrap();
        let e = t.expiry(&Virtualization::None);
        assert_eq!((e.driver, e.action), (None, WatchdogAction::Unknown));
    }

    #[test]
    fn the_driver_is_also_recognised_by_its_bound_device() {
        let t = Tree::new();
        let drv = t.0.path().join("sys/bus/pci/drivers/sp5100-tco");
        std::fs::create_dir_all(&drv).unwrap();
        std::fs::create_dir_all(t.0.path().join(WD).join("device")).unwrap();
        std::os::unix::fs::symlink(&drv, t.0.path().join(WD).join("device/driver")).unwrap();
        t.put(&format!("{WD}/identity"), "SB800 TCO");
        let e = t.expiry(&Virtualization::None);
        assert_eq!(
            (e.driver.as_deref(), e.action),
            (Some("sp5100_tco"), WatchdogAction::Reset)
        );
    }

    #[test]
    fn the_sysfs_entry_is_found_by_device_number() {
        let d = tempfile::tempdir().unwrap();
        for (n, dev) in [("watchdog0", "249:0"), ("watchdog1", "249:1")] {
            std::fs::create_dir(d.path().join(n)).unwrap();
            std::fs::write(d.path().join(n).join("dev"), format!("{dev}\n")).unwrap();
        }
        let rdev = nix::sys::stat::makedev(249, 1);
        assert_eq!(sysfs_dir(d.path(), rdev), Some(d.path().join("watchdog1")));
        let legacy = nix::sys::stat::makedev(10, 130);
        assert_eq!(
            sysfs_dir(d.path(), legacy),
            Some(d.path().join("watchdog0"))
        );
        assert_eq!(sysfs_dir(d.path(), nix::sys::stat::makedev(1, 3)), None);
    }
}
