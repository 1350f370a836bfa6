//! The companion's CRI client against the real containerd (Debian's, with runc): the
//! inventory it reads, the self-fence it does, and what it says when containerd goes away.
//!
//! The test plays the kubelet's part through the same CRI (`RunPodSandbox`,
//! `CreateContainer`, `StartContainer`) on a containerd of its own (its own root, state and
//! socket in a temporary directory), with a sandbox image imported from an OCI archive built
//! here (busybox). Whether a container's process is gone is checked in `/proc`, not by asking
//! containerd.

use std::collections::{BTreeSet, HashMap};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use palisade_node::cri::inventory::inventory;
use palisade_node::cri::stop::stop_pods;
use palisade_node::cri::{CriClient, CriError};
use sha2::{Digest, Sha256};

const IMAGE: &str = "palisade.test/pause:1";
const CALL: Duration = Duration::from_secs(10);

/// The kubelet's side of the CRI, as far as this test needs it (field numbers of
/// `k8s.io/cri-api` `runtime/v1`).
mod kubelet {
    use std::collections::HashMap;

    pub use palisade_node::cri::wire::{ContainerMetadata, PodSandboxMetadata};

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NamespaceOption {
        /// `NamespaceMode`: 2 is `NODE` (the host's network: no CNI needed).
        #[prost(int32, tag = "1")]
        pub network: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LinuxSandboxSecurityContext {
        #[prost(message, optional, tag = "1")]
        pub namespace_options: Option<NamespaceOption>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LinuxPodSandboxConfig {
        #[prost(message, optional, tag = "2")]
        pub security_context: Option<LinuxSandboxSecurityContext>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxConfig {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<PodSandboxMetadata>,
        #[prost(string, tag = "3")]
        pub log_directory: String,
        #[prost(map = "string, string", tag = "6")]
        pub labels: HashMap<String, String>,
        #[prost(message, optional, tag = "8")]
        pub linux: Option<LinuxPodSandboxConfig>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunPodSandboxRequest {
        #[prost(message, optional, tag = "1")]
        pub config: Option<PodSandboxConfig>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunPodSandboxResponse {
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImageSpec {
        #[prost(string, tag = "1")]
        pub image: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerConfig {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ContainerMetadata>,
        #[prost(message, optional, tag = "2")]
        pub image: Option<ImageSpec>,
        #[prost(string, repeated, tag = "3")]
        pub command: Vec<String>,
        #[prost(map = "string, string", tag = "9")]
        pub labels: HashMap<String, String>,
        #[prost(string, tag = "11")]
        pub log_path: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateContainerRequest {
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
        #[prost(message, optional, tag = "2")]
        pub config: Option<ContainerConfig>,
        #[prost(message, optional, tag = "3")]
        pub sandbox_config: Option<PodSandboxConfig>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateContainerResponse {
        #[prost(string, tag = "1")]
        pub container_id: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerId {
        #[prost(string, tag = "1")]
        pub id: String,
    }
}

/// A containerd of the test's own, killed (with its shims and containers) on drop.
struct Containerd {
    dir: tempfile::TempDir,
    child: Child,
    /// The IDs of the sandboxes and containers it created (their processes' cgroups name them).
    ids: Vec<String>,
}

fn need(bin: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{bin} is not installed: run hack/install-deps.sh (it installs containerd and runc)"
    );
}

impl Containerd {
    async fn start() -> (Self, CriClient) {
        for bin in [
            "containerd",
            "ctr",
            "containerd-shim-runc-v2",
            "runc",
            "unshare",
        ] {
            need(bin);
        }
        let dir = tempfile::Builder::new()
            .prefix("palisade-cri-")
            .tempdir()
            .unwrap();
        let d = dir.path().display();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
                 [grpc]\n  address = \"{d}/containerd.sock\"\n\
                 [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{d}/opt\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{IMAGE}\"\n\
                 restrict_oom_score_adj = true\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  Root = \"{d}/runc\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"{d}/cni/bin\"\n  conf_dir = \"{d}/cni/conf\"\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("containerd.log")).unwrap();
        // In a mount namespace of its own with a private /run/containerd, where containerd
        // 1.6 puts its shims' sockets whatever its state directory: nothing is left on the host.
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mkdir -p /run/containerd && mount -t tmpfs tmpfs /run/containerd && exec containerd --config \"$0\"")
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let me = Containerd {
            dir,
            child,
            ids: Vec::new(),
        };
        let endpoint = format!("unix://{}", me.socket().display());
        let deadline = Instant::now() + Duration::from_secs(60);
        let cri = loop {
            match CriClient::connect(&endpoint, CALL).await {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => {
                    panic!("containerd did not answer: {e}\n{}", me.log())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        me.import_image();
        (me, cri)
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Imports an OCI archive of one busybox layer as the sandbox image.
    fn import_image(&self) {
        let archive = self.dir.path().join("pause.tar");
        std::fs::write(&archive, oci_archive()).unwrap();
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&archive)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ctr images import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts a pod with one container running `busybox sleep <marker>`; returns its UID.
    async fn run_pod(&mut self, cri: &CriClient, name: &str, marker: u32) -> String {
        use kubelet::*;
        let uid = format!("{name}-{:08x}", rand_u32());
        let logs = self.dir.path().join("logs").join(&uid);
        std::fs::create_dir_all(&logs).unwrap();
        let sandbox_config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: uid.clone(),
                namespace: "default".into(),
                attempt: 0,
            }),
            log_directory: logs.display().to_string(),
            labels: HashMap::from([("io.kubernetes.pod.uid".into(), uid.clone())]),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption { network: 2 }),
                }),
            }),
        };
        let sandbox: RunPodSandboxResponse = cri
            .call(
                "RunPodSandbox",
                &RunPodSandboxRequest {
                    config: Some(sandbox_config.clone()),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", self.log()));
        self.ids.push(sandbox.pod_sandbox_id.clone());
        let created: CreateContainerResponse = cri
            .call(
                "CreateContainer",
                &CreateContainerRequest {
                    pod_sandbox_id: sandbox.pod_sandbox_id,
                    config: Some(ContainerConfig {
                        metadata: Some(ContainerMetadata {
                            name: "main".into(),
                            attempt: 0,
                        }),
                        image: Some(ImageSpec {
                            image: IMAGE.into(),
                        }),
                        command: vec!["/bin/busybox".into(), "sleep".into(), marker.to_string()],
                        labels: HashMap::from([("io.kubernetes.pod.uid".into(), uid.clone())]),
                        log_path: "main.log".into(),
                    }),
                    sandbox_config: Some(sandbox_config),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", self.log()));
        self.ids.push(created.container_id.clone());
        cri.call::<_, ()>(
            "StartContainer",
            &ContainerId {
                id: created.container_id,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", self.log()));
        uid
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // containerd, its shims (their command lines name the socket) and the processes of the
        // sandboxes and containers (their cgroups name them), then the mounts left behind.
        let dir = self.dir.path().display().to_string();
        for pid in pids(|cmd| cmd.contains(&dir)) {
            let _ = nix_kill(pid);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cgroup = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
            if self.ids.iter().any(|id| cgroup.contains(id.as_str())) {
                if let Ok(pid) = e.file_name().to_string_lossy().parse() {
                    let _ = nix_kill(pid);
                }
            }
        }
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| m.starts_with(&dir))
            .collect();
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in under {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
    }
}

fn nix_kill(pid: u32) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
}

fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.subsec_nanos() ^ std::process::id()
}

fn is_sleep(cmdline: &str, marker: &str) -> bool {
    cmdline == format!("/bin/busybox sleep {marker}")
}

/// The PIDs whose command line (arguments joined by spaces) satisfies `f`.
fn pids(f: impl Fn(&str) -> bool) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        if f(&cmd) {
            out.push(pid);
        }
    }
    out
}

/// Whether a container's `busybox sleep <marker>` process lives on the machine.
fn runs(marker: u32) -> bool {
    !pids(|cmd| is_sleep(cmd, &marker.to_string())).is_empty()
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// An OCI image archive (`oci-layout`, `index.json`, blobs) of one uncompressed layer with
/// `/bin/busybox`, named [`IMAGE`].
fn oci_archive() -> Vec<u8> {
    let mut layer = tar::Builder::new(Vec::new());
    let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static)");
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o755);
    h.set_size(0);
    layer.append_data(&mut h, "bin/", std::io::empty()).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o755);
    h.set_size(busybox.len() as u64);
    layer
        .append_data(&mut h, "bin/busybox", &busybox[..])
        .unwrap();
    let layer = layer.into_inner().unwrap();
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Entrypoint": ["/bin/busybox", "sleep", "3599"] },
        "rootfs": { "type": "layers", "diff_ids": [sha256(&layer)] },
    })
    .to_string()
    .into_bytes();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": sha256(&config), "size": config.len() },
        "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar",
                     "digest": sha256(&layer), "size": layer.len() }],
    })
    .to_string()
    .into_bytes();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(&manifest), "size": manifest.len(),
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": { "io.containerd.image.name": IMAGE,
                             "org.opencontainers.image.ref.name": "1" },
        }],
    })
    .to_string()
    .into_bytes();
    let mut out = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        out.append_data(&mut h, path, data).unwrap();
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json", &index);
    for blob in [&layer, &config, &manifest] {
        let digest = sha256(blob);
        add(&format!("blobs/sha256/{}", &digest[7..]), blob);
    }
    let mut tar = out.into_inner().unwrap();
    tar.flush().unwrap();
    tar
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_fence_through_containerd_stops_the_chosen_pods_and_only_those() {
    let (mut ctd, cri) = Containerd::start().await;
    assert!(
        cri.runtime().starts_with("containerd "),
        "{}",
        cri.runtime()
    );
    let a = ctd.run_pod(&cri, "stateful-0", 3601).await;
    let b = ctd.run_pod(&cri, "web-0", 3602).await;
    assert!(runs(3601) && runs(3602), "the pods' processes run");

    let inv = inventory(&cri).await.unwrap();
    assert_eq!(inv.live_pods(), BTreeSet::from([a.clone(), b.clone()]));
    assert_eq!(inv.pods[&a].name, "default/stateful-0");
    assert_eq!(inv.pods[&a].containers.len(), 1);

    let report = stop_pods(&cri, |uid| uid == a).await.unwrap();
    assert!(report.confirmed(), "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.targeted, BTreeSet::from([a.clone()]));
    // Ground truth, not containerd's word: the stopped pod's process is gone, the other runs.
    assert!(!runs(3601), "the stopped pod's process still runs");
    assert!(runs(3602), "a pod that was not chosen was stopped");
    let inv = inventory(&cri).await.unwrap();
    assert_eq!(inv.live_pods(), BTreeSet::from([b.clone()]));
    assert!(
        !inv.pods[&a].live(),
        "the stopped pod is still listed, dead"
    );

    // A second stop of the same pod has nothing to do and still confirms.
    let again = stop_pods(&cri, |uid| uid == a).await.unwrap();
    assert!(again.confirmed() && again.targeted.is_empty(), "{again:?}");
    // Every live pod, as the companion's self-fence chooses (its own pod aside).
    let all = stop_pods(&cri, |_| true).await.unwrap();
    assert!(all.confirmed(), "{all:?}");
    assert_eq!(all.targeted, BTreeSet::from([b]));
    assert!(!runs(3602));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_gone_is_an_error_never_an_empty_inventory() {
    let (mut ctd, cri) = Containerd::start().await;
    let a = ctd.run_pod(&cri, "stateful-0", 3611).await;
    assert_eq!(
        inventory(&cri).await.unwrap().live_pods(),
        BTreeSet::from([a.clone()])
    );
    ctd.child.kill().unwrap();
    ctd.child.wait().unwrap();
    // Its container lives on under its shim: the runtime's silence proves nothing.
    assert!(runs(3611));
    let err = inventory(&cri).await.unwrap_err();
    assert!(
        matches!(err, CriError::Connect { .. } | CriError::Missing { .. }),
        "{err}"
    );
    let err = stop_pods(&cri, |uid| uid == a).await.unwrap_err();
    assert!(
        matches!(err, CriError::Connect { .. } | CriError::Missing { .. }),
        "{err}"
    );
}
