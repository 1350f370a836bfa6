//! Redfish BMCs for the lab: [`Sushy`] runs sushy-tools' `sushy-emulator` with its fake
//! driver, over HTTPS (a certificate from a fresh CA), with HTTP Basic auth from a bcrypt
//! htpasswd file, bound to 127.0.0.1 only.
//!
//! The fake driver keeps its systems' power in sqlite under the emulator's directory (fresh for
//! every start, so no state leaks between runs) and applies a power change 0–11 s after it
//! was requested, lazily, on a later read: clients must poll.
//!
//! [`Sushy::start_libvirt`] runs the libvirt backend on libvirt's in-process test driver
//! (`test:///default`, Debian's python3-libvirt) instead: power changes land at once, and the
//! driver also has its own `test` domain (so there are always several systems).
//!
//! Tying a system to a real machine ([`Sushy::start_with_power_hook`]): every system gets
//! sushy's `external_notifier`, which PUTs the system's JSON to a listener of this module
//! when a change is requested and again when it is applied. Sushy applies a change inside the
//! GET that first observes it and sends the PUT before answering that GET, so the listener
//! runs the hook (e.g. "power the lab machine off through its BMC and wait until its processes
//! are gone") *before* any client can read the new `PowerState`: a Redfish read of `Off` then
//! means the machine really is off. `hack/install-deps.sh` installs the emulator into a
//! virtualenv (`~/.cache/palisade/sushy-tools-<version>`; `PALISADE_SUSHY_VENV` overrides).

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{LabError, Result};
use crate::pki::Ca;
use crate::process::Daemon;

/// The hook that ties a sushy system to lab machine `m` ([`Sushy::start_with_power_hook`]):
/// each applied power change is carried out through the machine's IPMI BMC (`ipmitool`), and
/// the hook returns only once the machine's boot process runs (on) or every process of it is
/// gone (off), so sushy's read of the new `PowerState` comes after the machine really changed.
/// Bounded: at most three `ipmitool` calls, then at most 600 polls 50 ms apart.
pub fn machine_power_hook(m: &crate::Machine) -> Arc<PowerHook> {
    use crate::process::{alive, pids_with_env, read_pidfile, MACHINE_ENV};
    let bmc = m.bmc().clone();
    let boot_pid = m.dir().join("boot.pid");
    let marker = m.marker();
    Arc::new(
        move |_uuid: &str, on: bool| -> std::result::Result<(), String> {
            // Sushy reads the new state even when the hook fails: on a loaded host one
            // exchange's retries were not enough (a CI rehearsal), so the command is sent up
            // to three times.
            let mut failed = None;
            for _ in 0..3 {
                let out = Command::new("ipmitool")
                    .args(["-I", "lanplus", "-C", "3", "-N", "1", "-R", "3", "-H"])
                    .arg(bmc.host.to_string())
                    .arg("-p")
                    .arg(bmc.port.to_string())
                    .args(["-U", &bmc.user, "-f"])
                    .arg(&bmc.password_file)
                    .args(["chassis", "power", if on { "on" } else { "off" }])
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| e.to_string())?;
                if out.status.success() {
                    failed = None;
                    break;
                }
                failed = Some(String::from_utf8_lossy(&out.stderr).into_owned());
                std::thread::sleep(Duration::from_millis(500));
            }
            if let Some(e) = failed {
                return Err(e);
            }
            for _ in 0..600 {
                let powered = read_pidfile(&boot_pid).is_some_and(alive);
                if powered == on && (on || pids_with_env(MACHINE_ENV, &marker).is_empty()) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(format!(
                "the machine did not power {}",
                if on { "on" } else { "off" }
            ))
        },
    )
}

/// The sushy-tools version `hack/install-deps.sh` installs.
pub const SUSHY_VERSION: &str = "2.2.0";

/// One ComputerSystem of the emulator.
#[derive(Debug, Clone)]
pub struct SushySystem {
    /// Its `Name` (sushy also answers `/redfish/v1/Systems/<name>` with a redirect).
    pub name: String,
    /// Its `UUID` (and the last segment of its URI).
    pub uuid: String,
    /// Its power at start.
    pub power_on: bool,
}

/// Called with a system's UUID and its new power (`true`: on) when sushy applies a change
/// (and, with the current power, after any other update of the system: it must be
/// idempotent); sushy's read of the new state waits until it returns. An `Err` is logged by
/// sushy.
pub type PowerHook = dyn Fn(&str, bool) -> std::result::Result<(), String> + Send + Sync;

/// A running sushy-emulator. Dropping it stops the emulator.
#[derive(Debug)]
pub struct Sushy {
    daemon: Daemon,
    // Held for its Drop, after the emulator's (fields drop in order): stops the listener.
    _notifier: Option<Notifier>,
    dir: PathBuf,
    port: u16,
    ca_pem: String,
    cert_pem: String,
    user: String,
}

/// The virtualenv holding sushy-tools.
pub fn sushy_venv() -> PathBuf {
    if let Some(v) = std::env::var_os("PALISADE_SUSHY_VENV") {
        return PathBuf::from(v);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache
        .join("palisade")
        .join(format!("sushy-tools-{SUSHY_VERSION}"))
}

fn python_str(s: &str) -> String {
    // repr-style single-quoted Python string literal.
    let mut out = String::from("'");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

impl Sushy {
    /// Starts an emulator in `dir` (created; holds certificates, config, state and log) with
    /// `systems`, one account `user`/`password`, and a serving certificate for 127.0.0.1 from a
    /// fresh CA. Waits until it answers.
    pub fn start(dir: &Path, systems: &[SushySystem], user: &str, password: &str) -> Result<Sushy> {
        Self::start_inner(dir, systems, user, password, Backend::Fake(None))
    }

    /// Like [`Sushy::start`] with the libvirt backend on libvirt's in-process test driver: the
    /// systems are test-driver domains (running when `power_on`), and power changes are
    /// immediate.
    pub fn start_libvirt(
        dir: &Path,
        systems: &[SushySystem],
        user: &str,
        password: &str,
    ) -> Result<Sushy> {
        Self::start_inner(dir, systems, user, password, Backend::LibvirtTest)
    }

    /// Like [`Sushy::start`], and every applied power change of a system runs `hook` before
    /// the emulator answers the read that applies it (see the module docs).
    pub fn start_with_power_hook(
        dir: &Path,
        systems: &[SushySystem],
        user: &str,
        password: &str,
        hook: Arc<PowerHook>,
    ) -> Result<Sushy> {
        Self::start_inner(dir, systems, user, password, Backend::Fake(Some(hook)))
    }

    /// One system standing for lab machine `m` (its name and SMBIOS UUID, on at start) whose
    /// power is the machine's ([`machine_power_hook`]).
    pub fn for_machine(
        dir: &Path,
        m: &crate::Machine,
        user: &str,
        password: &str,
    ) -> Result<Sushy> {
        Self::start_with_power_hook(
            dir,
            &[SushySystem {
                name: m.name().into(),
                uuid: m.system_uuid().into(),
                power_on: true,
            }],
            user,
            password,
            machine_power_hook(m),
        )
    }

    fn start_inner(
        dir: &Path,
        systems: &[SushySystem],
        user: &str,
        password: &str,
        backend: Backend,
    ) -> Result<Sushy> {
        let (hook, libvirt) = match backend {
            Backend::Fake(hook) => (hook, false),
            Backend::LibvirtTest => (None, true),
        };
        let venv = sushy_venv();
        let emulator = venv.join("bin").join("sushy-emulator");
        let python = venv.join("bin").join("python");
        if !emulator.is_file() {
            return Err(LabError::MissingTool {
                tool: "sushy-emulator".into(),
                hint: format!("no {}", emulator.display()),
            });
        }
        std::fs::create_dir_all(dir).map_err(LabError::io(dir))?;
        let state = dir.join("state");
        let _ = std::fs::remove_dir_all(&state);

        let ca = Ca::new("palisade-lab-redfish-ca")?;
        let issued = ca.issue_server_cert(&["127.0.0.1", "localhost"])?;
        let (cert, key) = issued.write(dir, "sushy")?;
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, ca.cert_pem()).map_err(LabError::io(&ca_path))?;

        // bcrypt cost 4: the emulator checks the file on every request (cost 12 costs ~0.5 s
        // per request on a loaded 2-core machine). The password goes through stdin, never argv.
        let htpasswd = dir.join("htpasswd");
        let mut child = Command::new(&python)
            .args([
                "-c",
                "import bcrypt,sys; u=sys.argv[1]; p=sys.stdin.buffer.read(); \
                 sys.stdout.write(u+':'+bcrypt.hashpw(p, bcrypt.gensalt(rounds=4)).decode()+'\\n')",
                user,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| LabError::Command {
                command: format!("{} -c <bcrypt>", python.display()),
                stderr: e.to_string(),
            })?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(password.as_bytes())
            .map_err(LabError::io(&htpasswd))?;
        let out = child.wait_with_output().map_err(LabError::io(&htpasswd))?;
        if !out.status.success() {
            return Err(LabError::Command {
                command: "bcrypt htpasswd".into(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        crate::write_secret(&htpasswd, &out.stdout)?;

        let port = crate::ports::free_port();
        let notifier = hook.map(Notifier::start).transpose()?;
        let mut conf = String::new();
        if let Some(n) = &notifier {
            let _ = writeln!(
                conf,
                "EXTERNAL_NOTIFICATION_URL = 'http://127.0.0.1:{}/'",
                n.port
            );
        }
        let _ = writeln!(conf, "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'");
        let _ = writeln!(conf, "SUSHY_EMULATOR_LISTEN_PORT = {port}");
        for (k, p) in [
            ("SSL_CERT", &cert),
            ("SSL_KEY", &key),
            ("AUTH_FILE", &htpasswd),
            ("STATE_DIR", &state),
        ] {
            let _ = writeln!(
                conf,
                "SUSHY_EMULATOR_{k} = {}",
                python_str(&p.display().to_string())
            );
        }
        if !libvirt {
            let _ = writeln!(conf, "SUSHY_EMULATOR_FAKE_DRIVER = True");
        }
        let _ = writeln!(conf, "SUSHY_EMULATOR_FAKE_SYSTEMS = [");
        for s in systems {
            let _ = writeln!(
                conf,
                "  {{'uuid': {}, 'name': {}, 'power_state': {}, 'external_notifier': {}, 'nics': []}},",
                python_str(&s.uuid),
                python_str(&s.name),
                if s.power_on { "'On'" } else { "'Off'" },
                if notifier.is_some() { "True" } else { "False" },
            );
        }
        let _ = writeln!(conf, "]");
        let conf_path = dir.join("emulator.conf");
        std::fs::write(&conf_path, conf).map_err(LabError::io(&conf_path))?;

        let mut cmd = Command::new("nice");
        cmd.arg("-n").arg("10");
        if libvirt {
            let launcher = libvirt_launcher(dir, systems)?;
            cmd.env("PYTHONPATH", dir.join("libvirt-py"))
                .arg(&python)
                .arg(&launcher)
                .arg("--config")
                .arg(&conf_path)
                .args(["--libvirt-uri", "test:///default"]);
        } else {
            cmd.arg(&emulator)
                .arg("--config")
                .arg(&conf_path)
                .arg("--fake");
        }
        let lab_id = format!("sushy-{:08x}", rand::random::<u32>());
        let mut daemon = Daemon::spawn("sushy-emulator", cmd, &lab_id, &dir.join("sushy.log"))?;
        daemon.wait_ready(Duration::from_secs(90), || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .map(drop)
                .map_err(|e| e.to_string())
        })?;
        Ok(Sushy {
            daemon,
            _notifier: notifier,
            dir: dir.to_path_buf(),
            port,
            ca_pem: ca.cert_pem(),
            cert_pem: issued.cert_pem,
            user: user.to_string(),
        })
    }

    /// The HTTPS port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The account name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// PEM of the CA that issued the emulator's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Path of the CA certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// PEM of the emulator's serving certificate.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The emulator's log.
    pub fn log(&self) -> &Path {
        self.daemon.log()
    }

    /// Fails with the end of the log if the emulator has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.daemon.check_alive()
    }
}

enum Backend {
    Fake(Option<Arc<PowerHook>>),
    LibvirtTest,
}

/// Exposes Debian's libvirt module to the virtualenv (`<dir>/libvirt-py`) and writes a
/// launcher that defines the systems as domains of the shared in-process test driver, keeps
/// that connection open (the driver's state lives as long as one connection does), and runs
/// sushy's own `main()`.
fn libvirt_launcher(dir: &Path, systems: &[SushySystem]) -> Result<PathBuf> {
    let dist = Path::new("/usr/lib/python3/dist-packages");
    let py = dir.join("libvirt-py");
    std::fs::create_dir_all(&py).map_err(LabError::io(&py))?;
    let entries = std::fs::read_dir(dist).map_err(LabError::io(dist))?;
    let mut found = false;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "libvirt.py" || name == "libvirtaio.py" || name.starts_with("libvirtmod.") {
            found |= name == "libvirt.py";
            let link = py.join(&name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(e.path(), &link).map_err(LabError::io(&link))?;
        }
    }
    if !found {
        return Err(LabError::MissingTool {
            tool: "python3-libvirt".into(),
            hint: format!("no libvirt.py in {}", dist.display()),
        });
    }
    let mut domains = String::new();
    for s in systems {
        let _ = writeln!(
            domains,
            "    ({}, {}, {}),",
            python_str(&s.name),
            python_str(&s.uuid),
            if s.power_on { "True" } else { "False" }
        );
    }
    let script = format!(
        r#"import sys, libvirt
conn = libvirt.open("test:///default")  # kept open: it holds the shared test driver alive
for name, uu, on in [
{domains}]:
    d = conn.defineXML(f"""<domain type="test"><name>{{name}}</name><uuid>{{uu}}</uuid>
      <memory>1048576</memory><vcpu>1</vcpu><os><type arch="x86_64">hvm</type><boot dev="hd"/></os></domain>""")
    if on:
        d.create()
from sushy_tools.emulator.main import main
sys.argv[0] = "sushy-emulator"
sys.exit(main())
"#
    );
    let path = dir.join("sushy_libvirt_test.py");
    std::fs::write(&path, script).map_err(LabError::io(&path))?;
    Ok(path)
}

/// The listener of sushy's external notifications (plain HTTP on 127.0.0.1: it carries no
/// secret, only a system's JSON).
struct Notifier {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("port", &self.port)
            .finish()
    }
}

impl Notifier {
    fn start(hook: Arc<PowerHook>) -> Result<Notifier> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| LabError::Other(format!("notification listener: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| LabError::Other(format!("notification listener: {e}")))?
            .port();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(conn) = conn {
                    serve_notification(conn, &*hook);
                }
            }
        });
        Ok(Notifier {
            port,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The new power of an *applied* change (`pending_power` gone), from a notification body.
fn applied_power(body: &serde_json::Value) -> Option<(String, bool)> {
    if body.get("pending_power").is_some_and(|p| !p.is_null()) {
        return None; // a change requested, not yet applied
    }
    let uuid = body.get("uuid")?.as_str()?.to_string();
    match body.get("power_state")?.as_str()? {
        "On" => Some((uuid, true)),
        "Off" => Some((uuid, false)),
        _ => None,
    }
}

fn serve_notification(mut conn: TcpStream, hook: &PowerHook) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 1 << 20 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
        .min(1 << 20);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let status = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v) => match applied_power(&v) {
            Some((uuid, on)) => match hook(&uuid, on) {
                Ok(()) => "200 OK",
                Err(e) => {
                    tracing::warn!(system = %uuid, error = %e, "sushy power hook failed");
                    "500 Internal Server Error"
                }
            },
            None => "200 OK",
        },
        Err(_) => "400 Bad Request",
    };
    let _ = conn.write_all(
        format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_strings_are_quoted() {
        assert_eq!(python_str("/a/b"), "'/a/b'");
        assert_eq!(python_str("it's\\"), "'it\\'s\\\\'");
        assert_eq!(python_str("a\nb"), "'a\\x0ab'");
    }

    #[test]
    fn only_applied_power_changes_reach_the_hook() {
        let requested = serde_json::json!({"uuid": "u", "power_state": "On",
            "pending_power": {"power_state": "Off", "apply_time": 1}});
        assert_eq!(applied_power(&requested), None);
        let applied = serde_json::json!({"uuid": "u", "power_state": "Off", "pending_power": null});
        assert_eq!(applied_power(&applied), Some(("u".into(), false)));
        let first = serde_json::json!({"uuid": "u", "power_state": "On"});
        assert_eq!(applied_power(&first), Some(("u".into(), true)));
    }
}
