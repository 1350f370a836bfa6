//! The real Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler of one [`KubeVersion`] (built by `hack/install-deps.sh`), on loopback ports
//! of their own.

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

/// A Kubernetes release the lab can run. `hack/install-deps.sh` builds and caches both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KubeVersion {
    /// 1.20.2, built from Debian's source package, with Debian's etcd 3.4 and kubectl: the
    /// oldest release Palisade supports (`policy/v1beta1` PDBs, no out-of-service handling).
    V1_20,
    /// 1.34.4, built from Go modules (`hack/kube/go.mod`), with etcd 3.6 (`hack/kube/etcd`):
    /// the release the lab runs unless told otherwise (out-of-service taint GA, CEL rules,
    /// ValidatingAdmissionPolicy).
    V1_34,
}

impl KubeVersion {
    /// The release the lab runs by default.
    pub const CURRENT: KubeVersion = KubeVersion::V1_34;
    /// The oldest release Palisade supports.
    pub const OLDEST: KubeVersion = KubeVersion::V1_20;
    /// Every release the lab can run, oldest first.
    pub const ALL: [KubeVersion; 2] = [KubeVersion::V1_20, KubeVersion::V1_34];
    /// The environment variable that chooses the release for a lab whose config leaves it
    /// open (`1.20` or `1.34`).
    pub const ENV: &'static str = "PALISADE_KUBE";

    /// The full version (`1.34.4`).
    pub fn version(self) -> &'static str {
        match self {
            KubeVersion::V1_20 => "1.20.2",
            KubeVersion::V1_34 => "1.34.4",
        }
    }

    /// The minor version (`1.34`), as `PALISADE_KUBE` names it.
    pub fn minor(self) -> &'static str {
        match self {
            KubeVersion::V1_20 => "1.20",
            KubeVersion::V1_34 => "1.34",
        }
    }

    /// The cache key of the local build (version plus build recipe), as
    /// `hack/install-deps.sh` writes it.
    pub fn build(self) -> &'static str {
        match self {
            KubeVersion::V1_20 => "1.20.2-p1",
            KubeVersion::V1_34 => "1.34.4-m1",
        }
    }

    /// Parses a minor (`1.34`) or full (`1.34.4`) version the lab can run.
    pub fn parse(s: &str) -> Option<KubeVersion> {
        let s = s.trim().trim_start_matches('v');
        KubeVersion::ALL
            .into_iter()
            .find(|v| s == v.minor() || s == v.version())
    }

    /// The release `PALISADE_KUBE` names, or [`Self::CURRENT`] when it is unset.
    ///
    /// # Errors
    /// A value the lab cannot run, with the ones it can.
    pub fn from_env() -> Result<KubeVersion> {
        match std::env::var(Self::ENV) {
            Err(_) => Ok(Self::CURRENT),
            Ok(s) if s.trim().is_empty() => Ok(Self::CURRENT),
            Ok(s) => Self::parse(&s).ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|v| v.minor()).collect();
                LabError::Other(format!(
                    "{}={s:?} is not a Kubernetes release the lab runs (it runs {})",
                    Self::ENV,
                    known.join(", ")
                ))
            }),
        }
    }

    /// Where `hack/install-deps.sh` caches this release's binaries.
    pub fn bin_dir(self) -> PathBuf {
        palisade_cache().join(format!("k8s-{}", self.build()))
    }

    /// The etcd this release runs on: Debian's 3.4 on `PATH` for 1.20, the cached 3.6 build
    /// for 1.34.
    pub fn etcd(self) -> PathBuf {
        match self {
            KubeVersion::V1_20 => PathBuf::from("etcd"),
            KubeVersion::V1_34 => self.bin_dir().join("etcd"),
        }
    }

    /// The kubectl of this release, as `hack/install-deps.sh` caches it.
    pub fn kubectl(self) -> PathBuf {
        match self {
            KubeVersion::V1_20 => palisade_cache().join("kubectl-1.20/kubectl"),
            KubeVersion::V1_34 => self.bin_dir().join("kubectl"),
        }
    }

    /// Whether the components still take the `--insecure-port`/`--port` flags (removed in
    /// 1.24).
    fn has_insecure_port_flags(self) -> bool {
        self == KubeVersion::V1_20
    }

    /// Whether a namespace's default ServiceAccount gets a token Secret (until 1.24; later
    /// pods get projected tokens only).
    pub fn service_accounts_get_token_secrets(self) -> bool {
        self == KubeVersion::V1_20
    }
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.version())
    }
}

/// `$XDG_CACHE_HOME/palisade` (or `~/.cache/palisade`), where `hack/install-deps.sh`
/// caches what it builds.
pub fn palisade_cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        })
        .join("palisade")
}

/// The API server's audit log, in the control plane's `logs` directory.
const AUDIT_LOG: &str = "audit.log";

/// What the API server audits: who deleted a pod or a VolumeAttachment, and who changed a
/// Node object (with the request, so a taint is visible), when. Status updates and reads are
/// not logged.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [create, update, patch, delete]
  resources:
  - group: \"\"
    resources: [nodes]
- level: Metadata
  verbs: [delete, deletecollection]
  resources:
  - group: \"\"
    resources: [pods]
  - group: storage.k8s.io
    resources: [volumeattachments]
- level: None
";

/// One entry of the API server's audit log ([`ControlPlane::audit`]).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// The request's verb (`delete`, `patch`, ...).
    pub verb: String,
    /// Who asked.
    pub user: AuditUser,
    /// What it acted on.
    pub object_ref: Option<AuditObject>,
    /// The answer's status code, when the stage carries one.
    pub response_status: Option<AuditStatus>,
    /// When the request was received (RFC 3339, microseconds).
    pub request_received_timestamp: String,
    /// The request body (Node changes only).
    pub request_object: Option<serde_json::Value>,
    /// The stage this entry records (`ResponseComplete`, ...).
    pub stage: String,
}

/// The user of an [`AuditEvent`].
#[derive(Clone, Debug, serde::Deserialize)]
pub struct AuditUser {
    /// The authenticated user name (`system:serviceaccount:kube-system:pod-garbage-collector`).
    pub username: String,
}

/// The object of an [`AuditEvent`].
#[derive(Clone, Debug, serde::Deserialize)]
pub struct AuditObject {
    /// `pods`, `nodes`, `volumeattachments`.
    pub resource: Option<String>,
    /// Its namespace, if namespaced.
    pub namespace: Option<String>,
    /// Its name.
    pub name: Option<String>,
}

/// The status of an [`AuditEvent`]'s answer.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct AuditStatus {
    /// The HTTP status code.
    pub code: Option<u16>,
}

impl AuditEvent {
    /// Whether the request succeeded (2xx).
    pub fn succeeded(&self) -> bool {
        self.response_status
            .as_ref()
            .and_then(|s| s.code)
            .is_some_and(|c| (200..300).contains(&c))
    }

    /// Whether it acted on `resource` named `name`.
    pub fn on(&self, resource: &str, name: &str) -> bool {
        self.object_ref.as_ref().is_some_and(|o| {
            o.resource.as_deref() == Some(resource) && o.name.as_deref() == Some(name)
        })
    }
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    version: KubeVersion,
    dir: PathBuf,
    api_port: u16,
    ca_pem: PathBuf,
    admin_kubeconfig: PathBuf,
    // Stopped in reverse start order by `stop`; the API server is restartable.
    daemons: parking_lot::Mutex<Vec<Daemon>>,
    // For readiness probes after a restart.
    rt: tokio::runtime::Handle,
    admin_http: reqwest::Client,
    // The API server's link to etcd, when it goes through a relay (`LabConfig::etcd_relay`).
    etcd_link: Option<crate::forwarder::CutSet>,
}

impl ControlPlane {
    /// Starts etcd, the API server, the controller-manager and the scheduler, and waits until
    /// all are healthy and the service-account token controller has done its first work.
    pub(crate) fn start(
        dir: &Path,
        lab_id: &str,
        ca: &Ca,
        rt: &tokio::runtime::Handle,
        version: KubeVersion,
        etcd_relay: bool,
    ) -> Result<ControlPlane> {
        let bins = version.bin_dir();
        for b in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ] {
            if !bins.join(b).exists() {
                return Err(LabError::MissingTool {
                    tool: format!("{b} {version}"),
                    hint: format!("expected in {} (run hack/install-deps.sh)", bins.display()),
                });
            }
        }
        let etcd_bin = version.etcd();
        if version == KubeVersion::V1_20 {
            crate::require_tool("etcd")?;
        } else if !etcd_bin.exists() {
            return Err(LabError::MissingTool {
                tool: format!("etcd for Kubernetes {version}"),
                hint: format!(
                    "expected at {} (run hack/install-deps.sh)",
                    etcd_bin.display()
                ),
            });
        }
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
        let mut etcd = Command::new(&etcd_bin);
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
            .tls_backend_preconfigured(tls_config(ca.cert_pem().as_bytes(), None)?)
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| LabError::Other(e.to_string()))?;
        let health = format!("{etcd_url}/health");
        d.wait_ready(READY_TIMEOUT, || probe(rt, &http, &health, "\"true\""))?;
        daemons.push(d);
        // The API server reaches etcd directly, or through a relay a test can slow.
        let (api_etcd_url, etcd_link) = if etcd_relay {
            let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
                .map_err(|e| LabError::Other(format!("binding the etcd relay: {e}")))?;
            let at = listener
                .local_addr()
                .map_err(|e| LabError::Other(format!("binding the etcd relay: {e}")))?;
            let link = crate::forwarder::CutSet::default();
            rt.spawn(crate::forwarder::relay(
                listener,
                ([127, 0, 0, 1], etcd_port).into(),
                link.clone(),
            ));
            (format!("http://{at}"), Some(link))
        } else {
            (etcd_url.clone(), None)
        };

        // kube-apiserver
        let audit_policy = dir.join("audit-policy.yaml");
        fs::write(&audit_policy, AUDIT_POLICY).map_err(LabError::io(&audit_policy))?;
        let mut api = Command::new(bins.join("kube-apiserver"));
        api.arg(format!("--etcd-servers={api_etcd_url}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={api_port}"))
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
            .arg(format!("--audit-policy-file={}", audit_policy.display()))
            .arg(format!(
                "--audit-log-path={}",
                logs.join(AUDIT_LOG).display()
            ))
            .arg("--audit-log-maxsize=0")
            .arg("--allow-privileged=true")
            .arg("--profiling=false")
            .arg("--v=1");
        if version.has_insecure_port_flags() {
            api.arg("--insecure-port=0");
        }
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
        if version.has_insecure_port_flags() {
            cm.arg("--port=0");
        }
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
            .arg(format!("--tls-cert-file={}", s_crt.display()))
            .arg(format!("--tls-private-key-file={}", s_key.display()))
            .arg("--leader-elect=false")
            .arg("--profiling=false")
            .arg("--v=1");
        if version.has_insecure_port_flags() {
            sched.arg("--port=0");
        }
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
            version,
            dir: dir.to_path_buf(),
            api_port,
            ca_pem,
            admin_kubeconfig,
            daemons: parking_lot::Mutex::new(daemons),
            rt: rt.clone(),
            admin_http,
            etcd_link,
        })
    }

    /// The Kubernetes release this control plane runs.
    pub fn version(&self) -> KubeVersion {
        self.version
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

    /// The API server's audit log so far: completed requests that deleted a pod or a
    /// VolumeAttachment or changed a Node, oldest first. Lines it cannot parse (one being
    /// written) are skipped.
    pub fn audit(&self) -> Vec<AuditEvent> {
        let path = self.dir.join("logs").join(AUDIT_LOG);
        fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<AuditEvent>(l).ok())
            .filter(|e| e.stage == "ResponseComplete")
            .collect()
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

    /// Makes every byte between the API server and etcd `delay` late, each way, from now on
    /// (`None`: on time again). Only with an etcd relay ([`crate::LabConfig::etcd_relay`]).
    pub fn slow_etcd(&self, delay: Option<Duration>) -> Result<()> {
        let link = self.etcd_link.as_ref().ok_or_else(|| {
            LabError::Other("this control plane has no etcd relay (LabConfig::etcd_relay)".into())
        })?;
        let api: std::net::IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
        match delay {
            Some(d) => link.impair(api, crate::forwarder::Link::Slow(d)),
            None => link.heal(api),
        }
        Ok(())
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

/// The TLS set-up of the lab's own HTTPS clients: the lab CA alone, and `identity` (a
/// certificate and its key, PEM) as the client certificate when given.
pub(crate) fn tls_config(
    ca_pem: &[u8],
    identity: Option<&pki::Issued>,
) -> Result<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let other = |what: &str, e: &dyn std::fmt::Display| LabError::Other(format!("{what}: {e}"));
    let roots = palisade_telemetry::tls::roots_from_pem(ca_pem).map_err(|e| other("lab CA", &e))?;
    let builder = palisade_telemetry::tls::verified_by(roots).map_err(|e| other("lab TLS", &e))?;
    let Some(id) = identity else {
        return Ok(builder.with_no_client_auth());
    };
    let certs = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| other("client certificate", &e))?;
    let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())
        .map_err(|e| other("client key", &e))?;
    builder
        .with_client_auth_cert(certs, key)
        .map_err(|e| other("client identity", &e))
}

fn ca_client(ca_pem: &str) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config(ca_pem.as_bytes(), None)?)
        .timeout(Duration::from_secs(3))
        .build()
        .map_err(|e| LabError::Other(e.to_string()))
}

fn admin_client(ca_pem: &str, admin: &pki::Issued) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config(ca_pem.as_bytes(), Some(admin))?)
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
