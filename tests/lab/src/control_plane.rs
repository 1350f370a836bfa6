//! The real Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler 1.20.2 (built by `hack/install-deps.sh`), on loopback ports of their own.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;

use crate::error::{LabError, Result};
use crate::netns::HUB_ADDR;
use crate::pki::{self, Ca};
use crate::ports::free_port;
use crate::process::Daemon;
use crate::{block, write_secret};

/// How long each component may take to become healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The Kubernetes version the lab runs.
pub const K8S_VERSION: &str = "1.20.2";
/// The cache key of the local build (version plus patch set), as `hack/install-deps.sh` writes it.
pub const K8S_BUILD: &str = "1.20.2-p1";

/// Where `hack/install-deps.sh` caches the control-plane binaries.
pub fn k8s_bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("PALISADE_K8S_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or("/root".into())).join(".cache")
        });
    cache.join("palisade").join(format!("k8s-{K8S_BUILD}"))
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    api_port: u16,
    ca_pem: PathBuf,
    admin_kubeconfig: PathBuf,
    // Stopped in reverse start order by `stop`; the API server is restartable.
    daemons: parking_lot::Mutex<Vec<Daemon>>,
    // For readiness probes after a restart.
    rt: tokio::runtime::Handle,
    admin_http: reqwest::Client,
}

impl ControlPlane {
    /// Starts etcd, the API server, the controller-manager and the scheduler, and waits until
    /// all are healthy and the service-account token controller has done its first work.
    pub(crate) fn start(
        dir: &Path,
        lab_id: &str,
        ca: &Ca,
        rt: &tokio::runtime::Handle,
    ) -> Result<ControlPlane> {
        let bins = k8s_bin_dir();
        for b in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ] {
            if !bins.join(b).exists() {
                return Err(LabError::MissingTool {
                    tool: b.into(),
                    hint: format!("expected in {}", bins.display()),
                });
            }
        }
        crate::require_tool("etcd")?;
        let pki_dir = dir.join("pki");
        let logs = dir.join("logs");
        for d in [&pki_dir, &logs] {
            fs::create_dir_all(d).map_err(LabError::io(d))?;
        }

        let ca_pem = pki_dir.join("ca.crt");
        fs::write(&ca_pem, ca.cert_pem()).map_err(LabError::io(&ca_pem))?;
        let hub = HUB_ADDR.to_string();
        let (api_crt, api_key) = ca
            .issue_server_cert(&[
                "127.0.0.1",
                &hub,
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "10.213.128.1",
            ])?
            .write(&pki_dir, "apiserver")?;
        let sa_key = pki_dir.join("sa.key");
        let sa_pub = pki_dir.join("sa.pub");
        let (sa_private, sa_public) = pki::new_signing_key_pem()?;
        write_secret(&sa_key, sa_private.as_bytes())?;
        fs::write(&sa_pub, sa_public).map_err(LabError::io(&sa_pub))?;

        let etcd_port = free_port();
        let etcd_peer = free_port();
        let api_port = free_port();
        let cm_port = free_port();
        let sched_port = free_port();

        let mut daemons = Vec::new();

        // etcd
        let mut etcd = Command::new("etcd");
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        etcd.arg("--name=lab")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=lab={peer_url}"))
            .arg("--log-level=warn")
            .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH);
        let mut d = Daemon::spawn("etcd", etcd, lab_id, &logs.join("etcd.log"))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| LabError::Other(e.to_string()))?;
        let health = format!("{etcd_url}/health");
        d.wait_ready(READY_TIMEOUT, || probe(rt, &http, &health, "\"true\""))?;
        daemons.push(d);

        // kube-apiserver
        let mut api = Command::new(bins.join("kube-apiserver"));
        api.arg(format!("--etcd-servers={etcd_url}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={api_port}"))
            .arg("--insecure-port=0")
            .arg(format!("--advertise-address={hub}"))
            .arg(format!("--cert-dir={}", pki_dir.display()))
            .arg(format!("--tls-cert-file={}", api_crt.display()))
            .arg(format!("--tls-private-key-file={}", api_key.display()))
            .arg(format!("--client-ca-file={}", ca_pem.display()))
            .arg(format!("--service-account-key-file={}", sa_pub.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa_key.display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg("--authorization-mode=Node,RBAC")
            .arg("--enable-admission-plugins=NodeRestriction")
            .arg("--service-cluster-ip-range=10.213.128.0/20")
            .arg("--allow-privileged=true")
            .arg("--profiling=false")
            .arg("--v=1");
        let mut d = Daemon::spawn(
            "kube-apiserver",
            api,
            lab_id,
            &logs.join("kube-apiserver.log"),
        )?;

        let admin = ca.issue_client_cert("palisade-admin", Some("system:masters"))?;
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        let api_url = format!("https://127.0.0.1:{api_port}");
        write_kubeconfig(&admin_kubeconfig, &api_url, &ca.cert_pem(), &admin)?;
        let admin_http = admin_client(&ca.cert_pem(), &admin)?;
        let readyz = format!("{api_url}/readyz");
        d.wait_ready(READY_TIMEOUT, || probe(rt, &admin_http, &readyz, "ok"))?;
        daemons.push(d);

        // kube-controller-manager
        let cm_cfg = dir.join("controller-manager.kubeconfig");
        write_kubeconfig(
            &cm_cfg,
            &api_url,
            &ca.cert_pem(),
            &ca.issue_client_cert("system:kube-controller-manager", None)?,
        )?;
        let (cm_crt, cm_key) = ca
            .issue_server_cert(&["127.0.0.1", "localhost"])?
            .write(&pki_dir, "controller-manager-serving")?;
        let mut cm = Command::new(bins.join("kube-controller-manager"));
        cm.arg(format!("--kubeconfig={}", cm_cfg.display()))
            .arg(format!("--authentication-kubeconfig={}", cm_cfg.display()))
            .arg(format!("--authorization-kubeconfig={}", cm_cfg.display()))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={cm_port}"))
            .arg("--port=0")
            .arg(format!("--tls-cert-file={}", cm_crt.display()))
            .arg(format!("--tls-private-key-file={}", cm_key.display()))
            .arg("--leader-elect=false")
            .arg(format!(
                "--service-account-private-key-file={}",
                sa_key.display()
            ))
            .arg(format!("--root-ca-file={}", ca_pem.display()))
            .arg("--use-service-account-credentials=true")
            .arg("--controllers=*")
            .arg("--profiling=false")
            .arg("--v=1");
        let mut d = Daemon::spawn(
            "kube-controller-manager",
            cm,
            lab_id,
            &logs.join("kube-controller-manager.log"),
        )?;
        let ca_http = ca_client(&ca.cert_pem())?;
        let cm_health = format!("https://127.0.0.1:{cm_port}/healthz");
        d.wait_ready(READY_TIMEOUT, || probe(rt, &ca_http, &cm_health, "ok"))?;
        // The token controller has run once the default namespace's ServiceAccount exists.
        let sa = format!("{api_url}/api/v1/namespaces/default/serviceaccounts/default");
        d.wait_ready(READY_TIMEOUT, || probe(rt, &admin_http, &sa, "\"default\""))?;
        daemons.push(d);

        // kube-scheduler
        let sched_cfg = dir.join("scheduler.kubeconfig");
        write_kubeconfig(
            &sched_cfg,
            &api_url,
            &ca.cert_pem(),
            &ca.issue_client_cert("system:kube-scheduler", None)?,
        )?;
        let (s_crt, s_key) = ca
            .issue_server_cert(&["127.0.0.1", "localhost"])?
            .write(&pki_dir, "scheduler-serving")?;
        let mut sched = Command::new(bins.join("kube-scheduler"));
        sched
            .arg(format!("--kubeconfig={}", sched_cfg.display()))
            .arg(format!(
                "--authentication-kubeconfig={}",
                sched_cfg.display()
            ))
            .arg(format!(
                "--authorization-kubeconfig={}",
                sched_cfg.display()
            ))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={sched_port}"))
            .arg("--port=0")
            .arg(format!("--tls-cert-file={}", s_crt.display()))
            .arg(format!("--tls-private-key-file={}", s_key.display()))
            .arg("--leader-elect=false")
            .arg("--profiling=false")
            .arg("--v=1");
        let mut d = Daemon::spawn(
            "kube-scheduler",
            sched,
            lab_id,
            &logs.join("kube-scheduler.log"),
        )?;
        let s_health = format!("https://127.0.0.1:{sched_port}/healthz");
        d.wait_ready(READY_TIMEOUT, || probe(rt, &ca_http, &s_health, "ok"))?;
        daemons.push(d);

        Ok(ControlPlane {
            dir: dir.to_path_buf(),
            api_port,
            ca_pem,
            admin_kubeconfig,
            daemons: parking_lot::Mutex::new(daemons),
            rt: rt.clone(),
            admin_http,
        })
    }

    /// The admin kubeconfig (group `system:masters`), server on the host's loopback.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The API server's URL on the host's loopback.
    pub fn api_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// The API server's URL as machines reach it, through the hub.
    pub fn in_lab_api_url(&self) -> String {
        format!("https://{HUB_ADDR}:{}", crate::API_HUB_PORT)
    }

    /// The API server's port on the host's loopback.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// The lab CA certificate (PEM file) that signs the API server's certificate.
    pub fn ca_cert_pem(&self) -> &Path {
        &self.ca_pem
    }

    /// Every component's log file.
    pub fn logs(&self) -> Vec<PathBuf> {
        self.daemons()
            .iter()
            .map(|d| d.log().to_path_buf())
            .collect()
    }

    fn daemons(&self) -> parking_lot::MutexGuard<'_, Vec<Daemon>> {
        self.daemons.lock()
    }

    /// Restarts kube-apiserver: TERM (KILL after 3 s), `down` with no API server at all, then
    /// the same command again; returns once `/readyz` says ok. etcd and every other component
    /// keep running, as in a rolling restart of the API tier.
    pub fn restart_api_server(&self, down: Duration) -> Result<()> {
        self.restart("kube-apiserver", down)
    }

    /// Restarts one component (`etcd`, `kube-apiserver`, `kube-controller-manager`,
    /// `kube-scheduler`): TERM (KILL after 3 s), `down` without it, then the same command
    /// again (etcd keeps its data directory); returns once the API server's `/readyz` says ok,
    /// which covers its etcd.
    pub fn restart(&self, component: &str, down: Duration) -> Result<()> {
        let mut daemons = self.daemons();
        let d = daemons
            .iter_mut()
            .find(|d| d.name() == component)
            .ok_or_else(|| LabError::Other(format!("no {component} in this control plane")))?;
        d.stop(Duration::from_secs(3));
        std::thread::sleep(down);
        d.restart(Duration::from_secs(3))?;
        let readyz = format!("{}/readyz", self.api_url());
        d.wait_ready(READY_TIMEOUT, || {
            probe(&self.rt, &self.admin_http, &readyz, "ok")
        })
    }

    /// The process id of a running component (for a fault that freezes it), if it runs.
    pub fn pid(&self, component: &str) -> Option<u32> {
        let mut daemons = self.daemons();
        let d = daemons.iter_mut().find(|d| d.name() == component)?;
        d.check_alive().ok().map(|()| d.pid())
    }

    /// The directory holding the control plane's state.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes a kubeconfig for node `node` (user `system:node:<node>`, group
    /// `system:nodes`) that reaches the API server through the hub, for use inside a machine.
    pub(crate) fn write_node_kubeconfig(&self, ca: &Ca, node: &str, path: &Path) -> Result<()> {
        let cert = ca.issue_client_cert(&format!("system:node:{node}"), Some("system:nodes"))?;
        write_kubeconfig(path, &self.in_lab_api_url(), &ca.cert_pem(), &cert)
    }

    /// Builds a kube client with the admin credentials.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.admin_kubeconfig).await
    }

    /// Stops every component, newest first.
    pub fn stop(&mut self) {
        let daemons = self.daemons.get_mut();
        while let Some(mut d) = daemons.pop() {
            d.stop(Duration::from_secs(3));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Builds a kube client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| LabError::Other(format!("reading {}: {e}", path.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| LabError::Other(format!("kubeconfig {}: {e}", path.display())))?;
    kube::Client::try_from(config).map_err(|e| LabError::Other(format!("kube client: {e}")))
}

fn write_kubeconfig(path: &Path, server: &str, ca_pem: &str, cert: &pki::Issued) -> Result<()> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: lab\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\ncurrent-context: lab\n",
        b64(ca_pem),
        b64(&cert.cert_pem),
        b64(&cert.key_pem)
    );
    write_secret(path, text.as_bytes())
}

fn ca_client(ca_pem: &str) -> Result<reqwest::Client> {
    let root = reqwest::Certificate::from_pem(ca_pem.as_bytes())
        .map_err(|e| LabError::Other(format!("lab CA: {e}")))?;
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(root)
        .timeout(Duration::from_secs(3))
        .build()
        .map_err(|e| LabError::Other(e.to_string()))
}

fn admin_client(ca_pem: &str, admin: &pki::Issued) -> Result<reqwest::Client> {
    let root = reqwest::Certificate::from_pem(ca_pem.as_bytes())
        .map_err(|e| LabError::Other(format!("lab CA: {e}")))?;
    let id = reqwest::Identity::from_pem(format!("{}{}", admin.cert_pem, admin.key_pem).as_bytes())
        .map_err(|e| LabError::Other(format!("admin identity: {e}")))?;
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(root)
        .identity(id)
        .timeout(Duration::from_secs(3))
        .build()
        .map_err(|e| LabError::Other(e.to_string()))
}

fn probe(
    rt: &tokio::runtime::Handle,
    http: &reqwest::Client,
    url: &str,
    expect: &str,
) -> std::result::Result<(), String> {
    let (http, url, expect) = (http.clone(), url.to_string(), expect.to_string());
    block(rt, async move {
        // reqwest arms its timeout when the request is sent, so send on the lab's runtime.
        let resp = http.get(&url).send().await.map_err(|e| format!("{e:#}"))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| e.to_string())?;
        if status.is_success() && body.contains(&expect) {
            Ok(())
        } else {
            Err(format!(
                "{status}: {}",
                body.chars().take(300).collect::<String>()
            ))
        }
    })
}
