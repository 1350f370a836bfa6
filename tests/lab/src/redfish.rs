//! Redfish BMCs for the lab: [`Sushy`] runs sushy-tools' `sushy-emulator` with its fake
//! driver, over HTTPS (a certificate from a fresh CA), with HTTP Basic auth from a bcrypt
//! htpasswd file, bound to 127.0.0.1 only.
//!
//! The fake driver keeps its systems' power in sqlite under the emulator's directory (fresh for
//! every start, so no state leaks between runs) and applies a power change 0–11 s after it
//! was requested, lazily, on a later read: clients must poll. Facts and measurements:
//! `../shared/notes/redfish-sushy.md`. `hack/install-deps.sh` installs the emulator into a
//! virtualenv (`~/.cache/palisade/sushy-tools-<version>`; `PALISADE_SUSHY_VENV` overrides).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::error::{LabError, Result};
use crate::pki::Ca;
use crate::process::Daemon;

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

/// A running sushy-emulator. Dropping it stops the emulator.
#[derive(Debug)]
pub struct Sushy {
    daemon: Daemon,
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
        let mut conf = String::new();
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
        let _ = writeln!(conf, "SUSHY_EMULATOR_FAKE_DRIVER = True");
        let _ = writeln!(conf, "SUSHY_EMULATOR_FAKE_SYSTEMS = [");
        for s in systems {
            let _ = writeln!(
                conf,
                "  {{'uuid': {}, 'name': {}, 'power_state': {}, 'external_notifier': False, 'nics': []}},",
                python_str(&s.uuid),
                python_str(&s.name),
                if s.power_on { "'On'" } else { "'Off'" },
            );
        }
        let _ = writeln!(conf, "]");
        let conf_path = dir.join("emulator.conf");
        std::fs::write(&conf_path, conf).map_err(LabError::io(&conf_path))?;

        let mut cmd = Command::new("nice");
        cmd.arg("-n")
            .arg("10")
            .arg(&emulator)
            .arg("--config")
            .arg(&conf_path)
            .arg("--fake");
        let lab_id = format!("sushy-{:08x}", rand::random::<u32>());
        let mut daemon = Daemon::spawn("sushy-emulator", cmd, &lab_id, &dir.join("sushy.log"))?;
        daemon.wait_ready(Duration::from_secs(90), || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .map(drop)
                .map_err(|e| e.to_string())
        })?;
        Ok(Sushy {
            daemon,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_strings_are_quoted() {
        assert_eq!(python_str("/a/b"), "'/a/b'");
        assert_eq!(python_str("it's\\"), "'it\\'s\\\\'");
        assert_eq!(python_str("a\nb"), "'a\\x0ab'");
    }
}
