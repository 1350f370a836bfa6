//! Stock machines: namespace machines that run the real kubelet with containerd and runc, as
//! the clusters Palisade must serve run them, instead of `palisade-node`.
//!
//! A stock machine is an ordinary namespace machine ([`crate::machine`]) whose boot command
//! ([`boot_command`]) starts a containerd of its own and then execs the kubelet. Everything
//! either of them writes lives in the machine's directory (`stock/`), as on the machine's own
//! disk, and survives a power cycle like one. The boot command first gives the machine's
//! private mount namespace what a real machine has and the namespace lacks:
//! - the cgroup hierarchies (`ip netns exec` mounts a fresh sysfs without them), mounted again
//!   from the host's hierarchies, as `/proc/self/cgroup` lists them;
//! - its own `/run/containerd` (a tmpfs: the shims' sockets, which containerd puts there
//!   whatever its configuration says), `/run/netns` (a tmpfs: the pods' network namespaces,
//!   which it pins there) and `/var/log` (the kubelet's `/var/log/containers` links), so
//!   nothing of the machine lands on the host;
//! - the kernel tunables the kubelet insists on (`vm.overcommit_memory=1`, `kernel.panic=10`,
//!   `kernel.panic_on_oops=1`): files bind-mounted over `/proc/sys` inside the machine, so
//!   the kubelet reads its values and never writes the host's global settings.
//!
//! The kubelet (1.34, built by `hack/install-deps.sh` from `hack/kube`) registers as the
//! machine's node with the node certificate the lab issued, serves on the machine's lab
//! address only, and keeps no QoS cgroups (`cgroupsPerQOS: false`: several machines share the
//! host's cgroup tree). containerd pulls every image, the sandbox (pause) image included,
//! from the lab's registry over TLS with the lab CA (`hosts.toml`), so a [`StockLab`] always
//! has a registry. Pods on the host network need nothing more; other pods get an address on
//! the machine's own CNI bridge (Debian's CNI plugins), reachable only on that machine.
//!
//! Power off kills the machine's PID namespace: containerd, its shims and every container
//! die with it, and their mounts go with the mount namespace. Only the containers' cgroup
//! directories outlive them; [`StockLab::stop`] removes those (the lab's reaper, which acts
//! when the owner dies without stopping the lab, does not: empty directories stay).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Node;

use crate::control_plane::palisade_cache;
use crate::error::{LabError, Result};
use crate::machine::Machine;
use crate::registry::{ImageFile, RegistryConfig};
use crate::{require_tool, KubeVersion, Lab, LabConfig, MachineKind};

/// The repository and tag of the sandbox (pause) image in the lab's registry.
pub const PAUSE_IMAGE: &str = "lab/pause:1";
/// The repository and tag of a busybox image in the lab's registry, for workloads: its
/// entrypoint is `/bin/busybox sleep 3600`; give a command to run another applet.
pub const BUSYBOX_IMAGE: &str = "lab/busybox:1";

/// The kubelet built for `version`, from the cache `hack/install-deps.sh` fills.
///
/// Fails if that version has no kubelet build (only the current release has one) or the
/// binary is missing.
pub fn kubelet_binary(version: KubeVersion) -> Result<PathBuf> {
    if version != KubeVersion::CURRENT {
        return Err(LabError::Other(format!(
            "stock machines run the kubelet {}; none is built for Kubernetes {}",
            KubeVersion::CURRENT.version(),
            version.version()
        )));
    }
    let bin = palisade_cache()
        .join(format!("kubelet-{}", version.build()))
        .join("kubelet");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(LabError::MissingTool {
            tool: bin.display().to_string(),
            hint: "hack/install-deps.sh builds the kubelet".into(),
        })
    }
}

/// The directory where a stock machine keeps its containerd's and kubelet's state, configs
/// and logs (its "disk").
pub fn stock_dir(m: &Machine) -> PathBuf {
    m.dir().join("stock")
}

/// The CRI endpoint of a stock machine's containerd (`unix://…`), reachable from the host.
pub fn cri_endpoint(m: &Machine) -> String {
    format!("unix://{}", stock_dir(m).join("containerd.sock").display())
}

/// The boot command of a stock machine running `kubelet`: the shell text for
/// [`LabConfig::machine_command`]. It needs the lab's registry (`PALISADE_REGISTRY`,
/// `PALISADE_REGISTRY_CA` in the machine's environment). With `companion` (the
/// `palisade-companion` binary), the machine also runs Palisade's companion beside the kubelet,
/// as a systemd unit would: with the node's own credentials, on containerd's CRI socket,
/// writing every second (its log: `stock/companion.log`).
pub fn boot_command(kubelet: &Path, companion: Option<&Path>) -> String {
    let companion = companion
        .map(|bin| {
            format!(
                "\"{}\" --node-name \"$PALISADE_MACHINE_NAME\" --kubeconfig \"$PALISADE_NODE_KUBECONFIG\" \\\n  \
                 --cri-endpoint \"unix://$D/containerd.sock\" --interval 1s --timeout 3s >> \"$D/companion.log\" 2>&1 &\n\
                 echo \"the companion is running beside the kubelet\"",
                bin.display()
            )
        })
        .unwrap_or_default();
    BOOT.replace("@KUBELET@", &kubelet.display().to_string())
        .replace("@PAUSE@", PAUSE_IMAGE)
        .replace("@COMPANION@", &companion)
}

/// The boot command. The machine's environment supplies its name, address, directory, node
/// kubeconfig and the registry; everything is rewritten at every boot, the state is kept.
const BOOT: &str = r#"set -eu
D="$PALISADE_MACHINE_DIR/stock"
echo "stock machine $PALISADE_MACHINE_NAME booting: containerd, then the kubelet (logs in $D)"
mkdir -p "$D/sysctl" "$D/var-log" "$D/cni/conf" "$D/certs.d/$PALISADE_REGISTRY" "$D/kubelet" \
  "$D/pod-logs" "$D/volume-plugins"

# The host's cgroup hierarchies (ip netns exec left a sysfs without them).
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
while IFS=: read -r _ ctrls _; do
  if [ -z "$ctrls" ]; then
    mkdir -p /sys/fs/cgroup/unified; mount -t cgroup2 none /sys/fs/cgroup/unified; continue
  fi
  opts=$ctrls; case $ctrls in name=*) opts="none,$ctrls";; esac
  mkdir -p "/sys/fs/cgroup/${ctrls#name=}"; mount -t cgroup -o "$opts" cgroup "/sys/fs/cgroup/${ctrls#name=}"
done < /proc/self/cgroup
# The machine's own identity, which a namespace machine lacks (the host has no DMI table):
# the kubelet reports /etc/machine-id as the Node's systemUUID when there is no
# /sys/class/dmi/id/product_uuid, and Palisade's companion reads the file named by
# PALISADE_PRODUCT_UUID_FILE instead of that one. Both then name the machine its BMC names.
echo "$PALISADE_MACHINE_UUID" | tr -d - > "$D/machine-id"
mount --bind "$D/machine-id" /etc/machine-id
echo "$PALISADE_MACHINE_UUID" > "$D/product_uuid"
export PALISADE_PRODUCT_UUID_FILE="$D/product_uuid"
# What containerd and the kubelet write outside their configured directories stays here.
mkdir -p /run/containerd
mount -t tmpfs -o mode=0711 tmpfs /run/containerd
mount -t tmpfs -o mode=0755 tmpfs /run/netns
mount --bind "$D/var-log" /var/log
# The kernel tunables the kubelet checks, as it wants them, seen by this machine only.
for kv in vm/overcommit_memory=1 kernel/panic=10 kernel/panic_on_oops=1; do
  f="$D/sysctl/$(echo "${kv%=*}" | tr / .)"
  echo "${kv#*=}" > "$f"
  mount --bind "$f" "/proc/sys/${kv%=*}"
done

cat > "$D/containerd.toml" <<EOF
version = 2
root = "$D/containerd/root"
state = "$D/containerd/state"
[grpc]
  address = "$D/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$D/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PALISADE_REGISTRY/@PAUSE@"
  restrict_oom_score_adj = true
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  Root = "$D/containerd/runc"
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "$D/cni/conf"
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "$D/certs.d"
EOF
cat > "$D/certs.d/$PALISADE_REGISTRY/hosts.toml" <<EOF
server = "https://$PALISADE_REGISTRY"
[host."https://$PALISADE_REGISTRY"]
  capabilities = ["pull", "resolve"]
  ca = "$PALISADE_REGISTRY_CA"
EOF
octet=${PALISADE_MACHINE_ADDRESS##*.}
cat > "$D/cni/conf/10-lab.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "lab", "plugins": [{"type": "bridge", "bridge": "cni0",
 "isGateway": true, "ipMasq": false, "ipam": {"type": "host-local",
 "ranges": [[{"subnet": "10.244.$octet.0/24"}]], "dataDir": "$D/cni/ipam"}}]}
EOF
cat > "$D/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $PALISADE_MACHINE_ADDRESS
port: 10250
readOnlyPort: 0
nodeLeaseDurationSeconds: 4
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$D/containerd.sock
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
podLogsDir: $D/pod-logs
volumePluginDir: $D/volume-plugins
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
EOF

# A socket left by the previous boot would pass for a live containerd (the kubelet then
# finds nothing listening and exits, which powers the machine off).
rm -f "$D/containerd.sock"
containerd --config "$D/containerd.toml" >> "$D/containerd.log" 2>&1 &
i=0
until [ -S "$D/containerd.sock" ]; do
  i=$((i + 1))
  if [ "$i" -gt 300 ]; then echo "containerd did not open its socket within 30 s"; exit 1; fi
  sleep 0.1
done
echo "containerd is up; starting the kubelet"
@COMPANION@
exec "@KUBELET@" --config "$D/kubelet.yaml" --kubeconfig "$PALISADE_NODE_KUBECONFIG" \
  --root-dir "$D/kubelet" --hostname-override "$PALISADE_MACHINE_NAME" \
  --node-ip "$PALISADE_MACHINE_ADDRESS" --v=2 >> "$D/kubelet.log" 2>&1
"#;

/// A lab whose machines are stock machines. Dropping it tears it down.
pub struct StockLab {
    lab: Lab,
    stopped: bool,
}

impl std::fmt::Debug for StockLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StockLab").field("lab", &self.lab).finish()
    }
}

impl StockLab {
    /// Starts a lab of `config.machines` stock machines: the control plane and an anonymous
    /// registry are always started (containerd is given no registry credentials),
    /// the machines are namespace machines running [`boot_command`], and the pause and
    /// busybox images are pushed before this returns. It does not wait for the nodes: see
    /// [`StockLab::wait_node_ready`].
    pub fn start(config: LabConfig) -> Result<StockLab> {
        StockLab::start_with(config, false)
    }

    /// [`StockLab::start`], with Palisade's companion running beside each kubelet when
    /// `companion` is set (see [`boot_command`]).
    pub fn start_with(mut config: LabConfig, companion: bool) -> Result<StockLab> {
        for tool in ["containerd", "containerd-shim-runc-v2", "runc", "mount"] {
            require_tool(tool)?;
        }
        if !Path::new("/usr/lib/cni/bridge").is_file() {
            return Err(LabError::MissingTool {
                tool: "/usr/lib/cni/bridge".into(),
                hint: "Debian's containernetworking-plugins (hack/install-deps.sh installs it)"
                    .into(),
            });
        }
        let version = match config.kube {
            Some(v) => v,
            None => KubeVersion::from_env()?,
        };
        let kubelet = kubelet_binary(version)?;
        config.kube = Some(version);
        config.control_plane = true;
        config.machine_kind = MachineKind::Namespace;
        let companion = if companion {
            Some(crate::bin_path("palisade-companion")?)
        } else {
            None
        };
        config.machine_command = boot_command(&kubelet, companion.as_deref());
        if config
            .registry
            .as_ref()
            .is_some_and(|r| r.basic_auth.is_some())
        {
            return Err(LabError::Other(
                "stock machines pull anonymously: give the lab's registry no basic auth".into(),
            ));
        }
        config.registry = Some(RegistryConfig::default());
        let lab = Lab::start(config)?;
        let me = StockLab {
            lab,
            stopped: false,
        };
        me.push_images()?;
        Ok(me)
    }

    fn push_images(&self) -> Result<()> {
        let registry = self
            .lab
            .registry()
            .ok_or(LabError::NotConfigured("registry"))?;
        let files = [ImageFile {
            path: "bin/busybox".into(),
            source: PathBuf::from("/bin/busybox"),
            mode: 0o755,
        }];
        for (image, entrypoint) in [
            (PAUSE_IMAGE, ["/bin/busybox", "sleep", "2147483647"]),
            (BUSYBOX_IMAGE, ["/bin/busybox", "sleep", "3600"]),
        ] {
            let (repository, tag) = image.split_once(':').unwrap_or((image, "latest"));
            registry.push(repository, tag, &files, &entrypoint)?;
        }
        Ok(())
    }

    /// The lab.
    pub fn lab(&self) -> &Lab {
        &self.lab
    }

    /// `image` (for example [`BUSYBOX_IMAGE`]) as the stock machines pull it from the lab's
    /// registry.
    pub fn image(&self, image: &str) -> String {
        let host = self.lab.registry().map(|r| r.host()).unwrap_or_default();
        format!("{host}/{image}")
    }

    /// Waits until machine `index`'s node is `Ready`, as its kubelet reports it since the
    /// machine's current boot, and returns the time from that boot (its boot script's start)
    /// to the moment this saw the node Ready (polled every 100 ms). After a power cycle a
    /// `Ready` left from the previous boot does not count: the condition's heartbeat must be
    /// no older than the boot (to the second, the API's resolution).
    ///
    /// Fails with the end of the kubelet's log if the machine powers off (the kubelet or
    /// containerd failed to start) or the node is not Ready within `timeout`.
    pub fn wait_node_ready(&self, index: usize, timeout: Duration) -> Result<Duration> {
        let m = self
            .lab
            .machines()
            .get(index)
            .ok_or_else(|| LabError::NoSuchMachine(index.to_string()))?;
        let cp = self
            .lab
            .control_plane()
            .ok_or(LabError::NotConfigured("control plane"))?;
        let kubeconfig = cp.admin_kubeconfig().to_path_buf();
        let client = crate::block(self.lab.handle(), async move {
            crate::client_from_kubeconfig(&kubeconfig).await
        })?;
        let nodes: kube::Api<Node> = kube::Api::all(client);
        let name = m.name().to_string();
        let kubelet_log = stock_dir(m).join("kubelet.log");
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no node registered yet");
        let boot_id = m.dir().join("boot_id");
        let booted = || {
            fs::metadata(&boot_id)
                .and_then(|md| md.modified())
                .map_err(LabError::io(&boot_id))
        };
        loop {
            let boot_second = booted()?
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let (api, n) = (nodes.clone(), name.clone());
            let got = crate::block(self.lab.handle(), async move {
                tokio::time::timeout(Duration::from_secs(5), api.get_opt(&n)).await
            });
            if let Ok(Ok(Some(node))) = got {
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "Ready");
                match ready {
                    Some(c)
                        if c.status == "True"
                            && c.last_heartbeat_time
                                .as_ref()
                                .is_some_and(|t| t.0.as_second() >= boot_second) =>
                    {
                        break
                    }
                    Some(c) => {
                        last = format!(
                            "Ready={} (heartbeat {:?}; {}: {})",
                            c.status,
                            c.last_heartbeat_time.map(|t| t.0.to_string()),
                            c.reason.unwrap_or_default(),
                            c.message.unwrap_or_default()
                        )
                    }
                    None => last = "registered, no Ready condition yet".into(),
                }
            }
            let failed = if !m.is_powered() {
                Some("powered off: its kubelet or containerd exited".to_string())
            } else if Instant::now() > deadline {
                Some(format!("not Ready within {timeout:?}: {last}"))
            } else {
                None
            };
            if let Some(reason) = failed {
                return Err(LabError::Guest {
                    machine: name,
                    console_log: m.console_log(),
                    reason: format!(
                        "{reason}; kubelet log ({}):\n{}",
                        kubelet_log.display(),
                        crate::process::log_tail(&kubelet_log, 15)
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(SystemTime::now()
            .duration_since(booted()?)
            .unwrap_or(Duration::ZERO))
    }

    /// Tears the lab down (every machine's processes, containers included, die with its PID
    /// namespace), then removes the cgroup directories its containers left on the host.
    /// Idempotent.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let ids: Vec<String> = self
            .lab
            .machines()
            .iter()
            .flat_map(|m| task_ids(&stock_dir(m)))
            .collect();
        self.lab.stop();
        remove_cgroups(&ids);
    }
}

impl Drop for StockLab {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The IDs of every sandbox and container task a stock machine's containerd has or had
/// running (its shims' state directories, which stay after a power off).
fn task_ids(stock: &Path) -> Vec<String> {
    let dir = stock.join("containerd/state/io.containerd.runtime.v2.task/k8s.io");
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Removes, in every cgroup hierarchy of the host, the directories named by `ids` (runc
/// creates one per container), deepest first. The processes in them are gone or going: a
/// busy directory is retried for up to 5 s.
fn remove_cgroups(ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    let mut found = Vec::new();
    let mut stack = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = e.path();
            if ids.iter().any(|id| e.file_name() == id.as_str()) {
                found.push(path);
            } else if depth < 6 {
                stack.push((path, depth + 1));
            }
        }
    }
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    let deadline = Instant::now() + Duration::from_secs(5);
    for dir in found {
        while fs::remove_dir(&dir).is_err() && dir.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
