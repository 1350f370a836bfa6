//! Shared test harness: a PKI made with rcgen, a config file, and an in-process bridge with
//! the recording executor on a loopback port.
#![allow(dead_code, missing_docs)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use palisade_bridge::config::{FileConfig, Inventory};
use palisade_bridge::executor::RecordingExecutor;
use palisade_bridge::Bridge;
use palisade_fence::bridge::{BridgeClient, ClientSettings};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The secret values placed in credentials; tests grep logs for them.
pub const BMC_PASSWORD: &str = "bmc-s3cret-9f1c2e";
pub const PDU_COMMUNITY: &str = "pdu-community-77ab31";
pub const PDU_ENV: &str = "PALISADE_BRIDGE_TEST_PDU_COMMUNITY";

pub struct Ca {
    pub cert: rcgen::Certificate,
    pub key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Self { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    fn issue(&self, mut p: CertificateParams, cn: &str) -> (String, String) {
        p.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn server(&self) -> (String, String) {
        let mut p =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(p, "firmware-bridge")
    }

    pub fn client(&self, cn: &str) -> (String, String) {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(p, cn)
    }

    pub fn expired_client(&self, cn: &str) -> (String, String) {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        self.issue(p, cn)
    }
}

pub fn write_private(path: &Path, data: &str) {
    std::fs::write(path, data).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

pub const DEFAULT_POLICY: &str = r#"
[[policy]]
client = "cn:palisade-controller"
targets = ["*"]
read_audit = true

[[policy]]
client = "cn:m0-only"
targets = ["m0"]
read_audit = true
"#;

/// Writes PKI files and `bridge.toml` into `dir`; returns the config path.
pub fn write_config(dir: &Path, ca: &Ca, server: &(String, String), extra: &str) -> PathBuf {
    write_private(&dir.join("server.key"), &server.1);
    std::fs::write(dir.join("server.crt"), &server.0).unwrap();
    std::fs::write(dir.join("clients-ca.crt"), ca.pem()).unwrap();
    write_private(&dir.join("m0-bmc.pass"), &format!("{BMC_PASSWORD}\n"));
    write_private(&dir.join("m1-bmc.pass"), &format!("{BMC_PASSWORD}\n"));
    std::env::set_var(PDU_ENV, PDU_COMMUNITY);
    let cfg = format!(
        r#"
listen = "127.0.0.1:0"
state_dir = "state"
operation_timeout_secs = 30
max_body_bytes = 1024

[tls]
cert = "server.crt"
key = "server.key"
client_ca = "clients-ca.crt"

{{rate}}
{DEFAULT_POLICY}

[[targets]]
id = "m0"
[[targets.levels]]
name = "ipmi"
[[targets.levels.devices]]
url = "ipmi://127.0.0.1:9623"
username = "admin"
secrets = {{ password = {{ file = "m0-bmc.pass" }} }}
[[targets.levels]]
name = "pdu"
[[targets.levels.devices]]
url = "snmp+pdu://127.0.0.1:9161/outlet/1"
secrets = {{ community = {{ env = "{PDU_ENV}" }} }}
[[targets.storage]]
url = "storagefw+https://127.0.0.1:9443/"
ca_bundle = "clients-ca.crt"
node = "m0"

[[targets]]
id = "m1"
[[targets.levels]]
name = "ipmi"
[[targets.levels.devices]]
url = "ipmi://127.0.0.1:9624"
username = "admin"
secrets = {{ password = {{ file = "m1-bmc.pass" }} }}
{extra}
"#
    );
    let path = dir.join("bridge.toml");
    let rate = if extra.contains("[rate_limit]") {
        ""
    } else {
        "[rate_limit]\nburst = 1000\nper_second = 1000.0"
    };
    let cfg = cfg.replace("{rate}", rate);
    std::fs::write(&path, cfg).unwrap();
    path
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub ca: Arc<Ca>,
    pub server_ca_pem: String,
    pub bridge: Arc<Bridge>,
    pub exec: RecordingExecutor,
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Harness {
    pub async fn start(extra: &str) -> Self {
        Self::start_with(extra, RecordingExecutor::new()).await
    }

    pub async fn start_with(extra: &str, exec: RecordingExecutor) -> Self {
        install_provider();
        let dir = tempfile::tempdir().unwrap();
        let ca = Arc::new(Ca::new("palisade-test-ca"));
        let server = ca.server();
        let config = write_config(dir.path(), &ca, &server, extra);
        let server_ca_pem = ca.pem();
        let (bridge, addr, stop, task) = launch(&config, exec.clone()).await;
        Self {
            dir,
            config,
            ca,
            server_ca_pem,
            bridge,
            exec,
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the bridge (draining) and starts a fresh one on the same directory.
    pub async fn restart(&mut self, exec: RecordingExecutor) {
        self.stop().await;
        let (bridge, addr, stop, task) = launch(&self.config, exec.clone()).await;
        self.bridge = bridge;
        self.addr = addr;
        self.exec = exec;
        self.stop = Some(stop);
        self.task = Some(task);
    }

    pub async fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }

    pub fn client_with(&self, pem: &(String, String)) -> BridgeClient {
        let url = format!("https://127.0.0.1:{}/", self.addr.port())
            .parse()
            .unwrap();
        let mut s = ClientSettings::new(
            url,
            self.server_ca_pem.clone().into_bytes(),
            pem.0.clone().into_bytes(),
            pem.1.clone().into_bytes(),
        );
        s.request_timeout = Duration::from_secs(60);
        BridgeClient::new(&s).unwrap()
    }

    pub fn client(&self, cn: &str) -> BridgeClient {
        self.client_with(&self.ca.client(cn))
    }

    pub fn audit_path(&self) -> PathBuf {
        self.dir.path().join("state").join("audit.jsonl")
    }
}

async fn launch(
    config: &Path,
    exec: RecordingExecutor,
) -> (
    Arc<Bridge>,
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let cfg = FileConfig::load(config).unwrap();
    let inv = Inventory::load(&cfg).unwrap();
    let bridge = Bridge::new(&cfg, inv, Arc::new(exec), Some(config.to_path_buf())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let b = bridge.clone();
    let task = tokio::spawn(async move {
        palisade_bridge::server::serve(b, listener, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (bridge, addr, tx, task)
}

/// Makes one HTTPS request with a raw rustls client (optionally without a client cert) and
/// returns the response head, or the error text (which carries the TLS alert).
pub async fn raw_request(
    addr: SocketAddr,
    server_ca_pem: &str,
    client: Option<&(String, String)>,
    request: &str,
) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    install_provider();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(server_ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder().with_root_certificates(roots);
    let cfg = match client {
        None => b.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            b.with_client_auth_cert(certs, key).unwrap()
        }
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    match tls.read_to_end(&mut buf).await {
        Ok(_) => Ok(String::from_utf8_lossy(&buf).into_owned()),
        Err(e) if !buf.is_empty() => Ok(format!("{}\n(then: {e})", String::from_utf8_lossy(&buf))),
        Err(e) => Err(format!("read: {e}")),
    }
}

/// A spawned `firmware-bridge` binary; SIGTERM'd on drop.
pub struct BridgeProcess {
    pub child: std::process::Child,
    pub port: u16,
}

impl BridgeProcess {
    /// Spawns the binary on `config` and waits for it to log its listen address.
    pub fn spawn(config: &Path) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_firmware-bridge"))
            .arg("--config")
            .arg(config)
            .arg("--log-format")
            .arg("json")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if let Some(l) = v["fields"]["listen"].as_str() {
                        let _ = tx.send(l.rsplit(':').next().unwrap().parse::<u16>().unwrap());
                    }
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("firmware-bridge reports its listen address");
        Self { child, port }
    }
}

impl Drop for BridgeProcess {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}
