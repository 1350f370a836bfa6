//! Shared helpers for the storage integration tests: a throwaway PKI, the real server binary
//! as a child process.

#![allow(dead_code, missing_docs)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use palisade_labstore::admin_client::AdminClient;
use palisade_labstore::pki::TestCa;
use palisade_storagefw::{Secret, StorageFirewall, StorageFwConfig, Target};

pub const TOKEN: &str = "test-token-5f1c0a";

/// Picks a free loopback port (bind to 0, read, release).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Certificates and token files for one server.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: TestCa,
    pub ca_pem: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub token_file: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("storage test CA").unwrap();
        let srv = ca.issue_server(&["127.0.0.1"]).unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("ca.pem"), ca.cert_pem()).unwrap();
        std::fs::write(p("server.pem"), &srv.cert_pem).unwrap();
        std::fs::write(p("server.key"), &srv.key_pem).unwrap();
        std::fs::write(p("token"), format!("{TOKEN}\n")).unwrap();
        Pki {
            ca_pem: p("ca.pem"),
            cert: p("server.pem"),
            key: p("server.key"),
            token_file: p("token"),
            ca,
            dir,
        }
    }
}

/// The real `palisade-storage-server` binary running as a child.
pub struct ServerProc {
    pub child: Child,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    pub state_dir: PathBuf,
}

pub struct ServerOpts<'a> {
    pub pki: &'a Pki,
    pub state_dir: &'a Path,
    pub data_port: u16,
    pub admin_port: u16,
    pub client_ca: bool,
    pub token: bool,
    pub volumes: &'a [&'a str],
}

impl<'a> ServerOpts<'a> {
    /// Free ports, token authentication, no client CA: what most tests want. Kept to restart
    /// the server on the same ports.
    pub fn usual(pki: &'a Pki, state_dir: &'a Path, volumes: &'a [&'a str]) -> Self {
        ServerOpts {
            pki,
            state_dir,
            data_port: free_port(),
            admin_port: free_port(),
            client_ca: false,
            token: true,
            volumes,
        }
    }
}

impl ServerProc {
    pub fn start(o: &ServerOpts<'_>) -> ServerProc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_palisade-storage-server"));
        cmd.arg("--data-listen")
            .arg(format!("127.0.0.1:{}", o.data_port))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{}", o.admin_port))
            .arg("--state-dir")
            .arg(o.state_dir)
            .arg("--tls-cert")
            .arg(&o.pki.cert)
            .arg("--tls-key")
            .arg(&o.pki.key);
        if o.token {
            cmd.arg("--token-file").arg(&o.pki.token_file);
        }
        if o.client_ca {
            cmd.arg("--client-ca").arg(&o.pki.ca_pem);
        }
        for v in o.volumes {
            cmd.arg("--volume").arg(v);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn palisade-storage-server (cargo build -p palisade-labstore --bins)");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        assert!(
            line.starts_with("ready "),
            "server did not become ready: {line:?}"
        );
        ServerProc {
            child,
            data: format!("127.0.0.1:{}", o.data_port).parse().unwrap(),
            admin: format!("127.0.0.1:{}", o.admin_port).parse().unwrap(),
            state_dir: o.state_dir.to_owned(),
        }
    }

    /// Starts on fresh ports with a token.
    pub fn start_default(pki: &Pki, state_dir: &Path, volumes: &[&str]) -> ServerProc {
        ServerProc::start(&ServerOpts::usual(pki, state_dir, volumes))
    }

    pub fn sigkill(&mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        self.child.wait().unwrap();
    }

    pub fn admin_client(&self, pki: &Pki) -> AdminClient {
        AdminClient::new(
            &format!("https://{}", self.admin),
            pki.ca.cert_pem().as_bytes(),
            Secret::new(TOKEN),
        )
        .unwrap()
    }

    pub fn agent_config(&self, ca_pem: &str, token: Option<&str>) -> StorageFwConfig {
        let target =
            Target::parse(&format!("storagefw+https://{}/?profile=lab", self.admin)).unwrap();
        let mut cfg = StorageFwConfig::new(target, ca_pem.as_bytes().to_vec()).unwrap();
        cfg.token = token.map(Secret::new);
        cfg.verify_timeout = Duration::from_secs(5);
        cfg.verify_interval = Duration::from_millis(20);
        cfg
    }

    pub fn agent(&self, pki: &Pki) -> StorageFirewall {
        StorageFirewall::new(self.agent_config(&pki.ca.cert_pem(), Some(TOKEN))).unwrap()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The volume file of `volume` under a server state dir.
pub fn volume_file(state_dir: &Path, volume: &str) -> PathBuf {
    state_dir.join("volumes").join(format!("{volume}.vol"))
}

/// Spawns the real writer binary.
pub fn spawn_writer(
    server: SocketAddr,
    volume: &str,
    pod_uid: &str,
    node: &str,
    source: &str,
    ack_log: &Path,
    interval_ms: u64,
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_palisade-writer"))
        .env("STORAGE_SERVER", server.to_string())
        .env("STORAGE_VOLUME", volume)
        .env("POD_UID", pod_uid)
        .env("POD_NAME", "web-0")
        .env("NODE_NAME", node)
        .env("ACK_LOG", ack_log)
        .env("WRITE_INTERVAL_MS", interval_ms.to_string())
        .env("WRITE_SOURCE", source)
        .env("WRITE_SECONDS", "120")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn palisade-writer")
}

/// Stops a writer with SIGTERM and waits for it.
pub fn stop(child: &mut Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

/// Number of acknowledgements in an ack log.
pub fn ack_count(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| {
            palisade_labstore::record::parse_ack_log(&t)
                .map(|a| a.len())
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Runs the real checker binary; returns (exit code, stdout).
pub fn run_checker(volume_file: &Path, ack_logs: &[&Path]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_palisade-checker"));
    cmd.arg("--volume-file").arg(volume_file);
    for a in ack_logs {
        cmd.arg("--ack-log").arg(a);
    }
    let out = cmd.output().expect("run palisade-checker");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}
