//! The campaign's world: one long-lived lab and everything that runs on it.
//!
//! Machines (namespaces or QEMU virtual machines) running `palisade-node` (under a supervisor
//! loop that restarts it), the
//! real control plane, a BMC per machine and a PDU, the lab storage server with its CSI
//! attacher, the firmware-bridge holding every credential, two controllers (a leader and a
//! standby) and `writers` StatefulSets `w0`, `w1`, ..., each writing to its own ReadWriteOnce
//! CSI volume and logging its acknowledgements under `<lab>/shared/acks/<writer>/` (at least
//! half of the volumes keep a detached node's access, like NFS: see [`writer_detach`]), plus
//! one
//! volume-less identity ([`IDENTITY`]: a StatefulSet whose container only sleeps, or on QEMU
//! machines beats), judged by process presence ([`crate::presence`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::Api;
use palisade_lab::{Lab, MachineKind};
use palisade_scenario::{
    eventually, fence_target, free_port, lab_of_kind, pod_phase, policy, AgentOptions,
    BridgeOptions, Cluster, FirmwareBridge, Proc, Storage, STORAGE_DATA, SYSTEM_NS,
};
use parking_lot::Mutex;
use serde_json::json;

/// How the volume of writer `w{k}` (of `writers`) treats a node it is detached from. The last
/// writer and every second one counting back from it (`w1` of two, `w0` of one: at least half
/// of any campaign's writers) write to volumes that keep a detached node's access, as NFS
/// does and as an array does when it cannot reach the node: nothing but Palisade's fence
/// (power, a storage block, a trusted self-fence) stands between their old writer and its
/// replacement, so a fence that does not hold shows as split-brain writes. The others' volumes
/// revoke access on detach (LUN masking), as the lab did for every writer before.
pub fn writer_detach(k: usize, writers: usize) -> palisade_labstore::kube_objects::Detach {
    use palisade_labstore::kube_objects::Detach;
    if (writers.saturating_sub(1).saturating_sub(k)).is_multiple_of(2) {
        Detach::KeepsAccess
    } else {
        Detach::Revokes
    }
}

/// The namespace the writers run in.
pub const APP_NS: &str = "app";
/// The volume-less identity's StatefulSet (its pod is `<IDENTITY>-0`).
pub const IDENTITY: &str = "v0";
/// The controllers' Lease (in [`SYSTEM_NS`]).
pub const LEADER_LEASE: &str = "palisade-controller";
/// The Lease annotation holding the leader's fencing token.
const TOKEN_ANNOTATION: &str = "palisade.dev/fencing-token";

/// libfaketime (Debian's `faketime` package), the thread-safe build: preloaded into the
/// controllers when their wall clock may be stepped.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The file, in the lab's directory, that names the object whose changes the controllers'
/// watches hold back ([`Controllers::stall_watch`]).
const STALLED_WATCH_FILE: &str = "stalled-watch";

/// The two controller replicas, as child processes the nemesis can kill, freeze, restart and
/// (with [`WorldConfig::controller_clock`]) whose wall clock it can step.
pub struct Controllers {
    lab_id: String,
    lab_dir: PathBuf,
    kubeconfig: PathBuf,
    env: Vec<(&'static str, String)>,
    replicas: Vec<(String, Option<Child>)>,
    /// Whether the replicas run under libfaketime, each reading its wall clock's offset from
    /// its own file ([`Controllers::clock_file`]).
    clock: bool,
}

impl Controllers {
    fn start(
        lab: &Lab,
        bridge: &FirmwareBridge,
        planted: &[String],
        clock: bool,
    ) -> Result<Controllers> {
        if clock && !Path::new(LIBFAKETIME).exists() {
            anyhow::bail!(
                "{LIBFAKETIME} is missing: stepping the controllers' clock needs the faketime \
                 package (hack/install-deps.sh installs it)"
            );
        }
        let cp = lab
            .control_plane()
            .context("the lab has no control plane")?;
        let mut c = Controllers {
            lab_id: lab.id().to_string(),
            lab_dir: lab.dir().to_path_buf(),
            kubeconfig: cp.admin_kubeconfig().to_path_buf(),
            env: {
                let mut env = bridge.controller_env();
                if !planted.is_empty() {
                    env.push(("PALISADE_PLANTED_BUGS", planted.join(",")));
                }
                env.push((
                    "PALISADE_STALLED_WATCH_FILE",
                    lab.dir().join(STALLED_WATCH_FILE).display().to_string(),
                ));
                env
            },
            replicas: vec![("palisade-0".into(), None), ("palisade-1".into(), None)],
            clock,
        };
        for id in ["palisade-0", "palisade-1"] {
            if clock {
                c.step_clock(id, 0)?;
            }
            c.spawn(id)?;
        }
        Ok(c)
    }

    /// Makes both replicas' watches hold back the changes of `node`'s Lease (`None`: deliver
    /// everything again), through the lab's stalled-watch fault
    /// (`palisade_fence::planted::watch_stalled`, read by debug builds only).
    pub fn stall_watch(&self, node: Option<&str>) -> Result<()> {
        let file = self.lab_dir.join(STALLED_WATCH_FILE);
        let tmp = file.with_extension("tmp");
        let text = node.map(|n| format!("Lease/{n}\n")).unwrap_or_default();
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &file).with_context(|| format!("writing {}", file.display()))
    }

    /// The file replica `identity`'s libfaketime reads its wall clock's offset from.
    fn clock_file(&self, identity: &str) -> PathBuf {
        self.lab_dir.join(format!("clock-{identity}"))
    }

    /// Sets replica `identity`'s wall clock to the true time plus `offset_ms` (negative:
    /// behind), at once and for its later restarts too: libfaketime rereads the file on every
    /// `clock_gettime(CLOCK_REALTIME)` (`FAKETIME_NO_CACHE`), and leaves `CLOCK_MONOTONIC`
    /// alone (`FAKETIME_DONT_FAKE_MONOTONIC`), as a real NTP step does.
    ///
    /// Assumptions: the world was built with [`WorldConfig::controller_clock`]; otherwise the
    /// replicas do not read the file and this is an error.
    pub fn step_clock(&self, identity: &str, offset_ms: i64) -> Result<()> {
        anyhow::ensure!(
            self.clock,
            "the controllers run without libfaketime: their clock cannot be stepped"
        );
        let file = self.clock_file(identity);
        let tmp = file.with_extension("tmp");
        // libfaketime's relative form: a sign and seconds, fractions allowed.
        let spec = format!(
            "{}{}.{:03}\n",
            if offset_ms < 0 { '-' } else { '+' },
            offset_ms.unsigned_abs() / 1_000,
            offset_ms.unsigned_abs() % 1_000
        );
        std::fs::write(&tmp, spec).with_context(|| format!("writing {}", tmp.display()))?;
        // A rename: the replica reads the old offset or the new one, never half a line.
        std::fs::rename(&tmp, &file).with_context(|| format!("writing {}", file.display()))
    }

    /// The replica that is not `identity`.
    pub fn other(identity: &str) -> &'static str {
        if identity == "palisade-0" {
            "palisade-1"
        } else {
            "palisade-0"
        }
    }

    /// Starts (or restarts) replica `identity`; its log is appended to.
    pub fn spawn(&mut self, identity: &str) -> Result<()> {
        let bin = palisade_lab::bin_path("palisade-controller")?;
        let log = self.lab_dir.join(format!("controller-{identity}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let metrics = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(bin);
        if self.clock {
            cmd.env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME_TIMESTAMP_FILE", self.clock_file(identity))
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = cmd
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "--namespace",
                SYSTEM_NS,
                "--lease-name",
                LEADER_LEASE,
                "--identity",
                identity,
                "--metrics-addr",
                &metrics,
                "--lease-duration",
                "4s",
                "--renew-interval",
                "1s",
                "--resync",
                "250ms",
            ])
            .env("RUST_LOG", "info,kube=warn")
            // The lab's marker: its reaper kills the replica if the nemesis dies outright.
            .env(palisade_lab::process::LAB_ENV, &self.lab_id)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .spawn()
            .context("starting palisade-controller")?;
        if let Some(slot) = self.replicas.iter_mut().find(|(id, _)| id == identity) {
            if let Some(mut old) = slot.1.replace(child) {
                reap(&mut old, self.clock);
            }
        }
        Ok(())
    }

    /// The pid of replica `identity`, while it runs.
    pub fn pid(&mut self, identity: &str) -> Option<i32> {
        let (_, slot) = self.replicas.iter_mut().find(|(id, _)| id == identity)?;
        let child = slot.as_mut()?;
        matches!(child.try_wait(), Ok(None)).then(|| child.id() as i32)
    }

    /// SIGKILLs replica `identity` and reaps it.
    pub fn kill(&mut self, identity: &str) {
        if let Some((_, Some(mut child))) = self
            .replicas
            .iter_mut()
            .find(|(id, _)| id == identity)
            .map(|(id, c)| (id.clone(), c.take()))
        {
            reap(&mut child, self.clock);
        }
    }

    /// Replicas that are not running (killed, or exited by themselves).
    pub fn down(&mut self) -> Vec<String> {
        let ids: Vec<String> = self.replicas.iter().map(|(id, _)| id.clone()).collect();
        ids.into_iter()
            .filter(|id| self.pid(id).is_none())
            .collect()
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        for (_, c) in &mut self.replicas {
            if let Some(mut c) = c.take() {
                // SIGKILL also ends a SIGSTOPped replica.
                reap(&mut c, self.clock);
            }
        }
    }
}

/// SIGKILLs a replica and reaps it. Under libfaketime (`clock`), also removes the shared
/// memory and semaphore libfaketime created for the replica's pid: it removes them itself only
/// at a normal exit, and while they remain, a later process given the same pid under
/// libfaketime (a restarted replica, once pids wrap) fails to start (`shm_open failed: File
/// exists`).
fn reap(child: &mut Child, clock: bool) {
    let _ = child.kill();
    let _ = child.wait();
    if clock {
        let pid = child.id();
        for f in [
            format!("/dev/shm/faketime_shm_{pid}"),
            format!("/dev/shm/sem.faketime_sem_{pid}"),
        ] {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// What to build.
#[derive(Clone, Debug)]
pub struct WorldConfig {
    /// Machines (namespace kind).
    pub machines: usize,
    /// StatefulSet writers.
    pub writers: usize,
    /// Bugs planted in the controllers (`PALISADE_PLANTED_BUGS`; empty: none).
    pub planted: Vec<String>,
    /// No machine has a FenceTarget, and the policy trusts a self-fence that an armed
    /// `nowayout` watchdog backs. Namespace machines advertise no watchdog, so nothing may
    /// ever be released: every silent node's pods must stay where they are. QEMU machines'
    /// agents arm a real one: their self-fences are trusted, and the watchdog must make them
    /// true.
    pub no_fence_devices: bool,
    /// The controllers run under libfaketime ([`LIBFAKETIME`]), their wall clock at the true
    /// time until a fault steps it ([`Controllers::step_clock`]). Off, they run as they are.
    pub controller_clock: bool,
    /// What the machines are: namespaces sharing the host's kernel, or QEMU virtual machines
    /// (their own kernel, clock and i6300esb watchdog; the agents and pods run in the guests).
    pub machine_kind: MachineKind,
    /// QEMU machines' agents leave their guest's watchdog unarmed (a negative control's
    /// world: a hung agent is not reset, and advertises no watchdog). No effect on namespace
    /// machines, which have none.
    pub agents_without_watchdog: bool,
}

/// The running world. Dropping it tears everything down (the lab last).
pub struct World {
    /// The controllers (locked by the fault that kills, freezes or restarts one).
    pub controllers: Mutex<Controllers>,
    /// The firmware-bridge (locked by the fault that crashes and restarts it).
    pub bridge: Mutex<FirmwareBridge>,
    _attacher: Proc,
    /// The storage server. Its `admin` address is a relay in front of the real admin API,
    /// which the bridge and the CSI attacher use.
    pub storage: Storage,
    /// Black-holes the storage admin API's relay for the clients it names (all on loopback).
    pub storage_admin: palisade_lab::forwarder::CutSet,
    /// What the relay between the bridge and machine `i`'s BMC does to the BMC's replies.
    pub bmc_replies: Vec<palisade_lab::forwarder::ReplyFault>,
    /// API access.
    pub cluster: Cluster,
    /// Writer names (`w0`, `w1`, ...).
    pub writers: Vec<String>,
    /// Where the writers' acknowledgement logs are (`<acks>/<writer>/acks-<pod uid>.log`).
    pub acks: PathBuf,
    /// The lab.
    pub lab: Lab,
}

/// The campaign policy's `unhealthyAfterSeconds`: how long a node must be silent before it may
/// be fenced (the checks that judge a fence from the Leases' ground truth read it here).
pub const UNHEALTHY_AFTER_S: i64 = 4;

/// The campaign's FencingPolicy: fast detection, no forgiveness, nodes powered back on after
/// release, no cooldown or escalation limit (the nemesis fences the same nodes many times).
/// With `trust_self_fence`, a watchdog-backed self-fence is trusted 1 s after its advertised
/// timeout (for the world without fence devices), on virtual machines too: the lab's machines
/// are QEMU guests whose i6300esb the lab sets to reset them and which it never pauses.
pub fn policy_spec(trust_self_fence: bool) -> serde_json::Value {
    json!({
        "detection": {"suspectAfterSeconds": 2, "unhealthyAfterSeconds": UNHEALTHY_AFTER_S},
        "forgiveness": {"respectTolerations": false, "defaultSeconds": 0},
        "fenceWhen": "Always",
        "recovery": {"powerOn": true},
        "escalation": {"cooldownSeconds": 0, "maxFencesPerWindow": 100000, "windowSeconds": 86400},
        "trustSelfFence": {"enabled": trust_self_fence, "marginSeconds": 1, "virtualMachines": "Accept"},
    })
}

impl World {
    /// Brings the world up and waits until every writer is writing.
    pub fn start(cfg: &WorldConfig, say: &dyn Fn(&str)) -> Result<World> {
        say(&format!(
            "starting a lab of {} machines, each {} (control plane, BMCs, PDU)",
            cfg.machines,
            palisade_scenario::kind_phrase(cfg.machine_kind)
        ));
        // Without fence devices the agents' self-fence covers every pod (the volume-less
        // identity included), so a trusted self-fence would release all of them.
        let agents = AgentOptions {
            extra_args: if cfg.no_fence_devices {
                vec!["--self-fence-all-pods".into()]
            } else {
                Vec::new()
            },
            // A QEMU machine has a real watchdog, and its agent arms it, as in production: a
            // hung agent gets its machine reset.
            watchdog: cfg.machine_kind == MachineKind::Qemu && !cfg.agents_without_watchdog,
            // With the watchdog, the peer check (docs/install.md): an API server outage must
            // not reset every machine.
            peer_check: cfg.machine_kind == MachineKind::Qemu && !cfg.agents_without_watchdog,
            // The peer check needs a vouch delay of at least 4 s plus two renew intervals
            // (the controller's clock-skew allowance), and the self-fence after it.
            self_fence_seconds: if cfg.machine_kind == MachineKind::Qemu
                && !cfg.agents_without_watchdog
            {
                8.0
            } else {
                AgentOptions::default().self_fence_seconds
            },
            // The slow-etcd class slows the API server's etcd through it.
            etcd_relay: true,
            ..AgentOptions::default()
        };
        let lab = lab_of_kind(cfg.machine_kind, cfg.machines, true, &agents)?;
        let cluster = Cluster::connect(&lab)?;
        cluster.wait_nodes_ready(&lab)?;
        if agents.peer_check {
            palisade_scenario::wait_full_peer_sets(&lab, &cluster.client, &cluster.rt)?;
        }
        let writers: Vec<String> = (0..cfg.writers).map(|k| format!("w{k}")).collect();
        let volumes: Vec<&str> = writers.iter().map(String::as_str).collect();
        let mut storage = Storage::start(&lab, &volumes)?;
        // Everything that drives the storage firewall goes through a relay the nemesis can
        // black-hole (the data path is not relayed: the writers keep writing).
        let storage_admin = palisade_lab::forwarder::CutSet::default();
        let relay = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
            .context("binding the storage admin relay")?;
        let upstream: std::net::SocketAddr = storage.admin.parse()?;
        storage.admin = relay.local_addr()?.to_string();
        lab.handle().spawn(palisade_lab::forwarder::relay(
            relay,
            upstream,
            storage_admin.clone(),
        ));
        let attacher = storage.start_attacher(&lab)?;
        cluster.namespace(SYSTEM_NS)?;
        cluster.namespace(APP_NS)?;
        // The bridge reaches each BMC through a relay the nemesis can make slow or garbled.
        let (bmc_addrs, bmc_replies): (Vec<_>, Vec<_>) = (0..lab.machines().len())
            .map(|i| lab.bmc_relay(i))
            .collect::<palisade_lab::Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let bridge = FirmwareBridge::start(
            &lab,
            BridgeOptions {
                wrong_bmc_password: &[],
                storage: Some(&storage),
                planted: &cfg.planted,
                bmc_addrs: &bmc_addrs,
            },
        )?;
        let controllers = Controllers::start(&lab, &bridge, &cfg.planted, cfg.controller_clock)?;
        policy(
            &cluster.client,
            &cluster.rt,
            "lab",
            policy_spec(cfg.no_fence_devices),
        )?;
        let targets = if cfg.no_fence_devices {
            &[][..]
        } else {
            lab.machines()
        };
        for m in targets {
            let url = bridge.url(m.name());
            fence_target(
                &cluster.client,
                &cluster.rt,
                m.name(),
                // Power and storage first; when no power device answers, storage alone
                // (what it verifies covers only the pods behind the blocked volumes).
                vec![
                    (
                        "bridge",
                        vec![
                            json!({"url": url, "kind": "Power"}),
                            json!({"url": url, "kind": "Storage", "fences": palisade_scenario::lab_storage_scope()}),
                        ],
                    ),
                    (
                        "storage-only",
                        vec![
                            json!({"url": url, "kind": "Storage", "fences": palisade_scenario::lab_storage_scope()}),
                        ],
                    ),
                ],
            )?;
        }
        say("storage, CSI attacher, firmware-bridge and two controllers running");
        // Where every machine writes, whatever its kind (a QEMU guest mounts it over 9p).
        let acks = lab.shared_dir().join("acks");
        let world = World {
            controllers: Mutex::new(controllers),
            bridge: Mutex::new(bridge),
            _attacher: attacher,
            storage,
            storage_admin,
            bmc_replies,
            cluster,
            writers,
            acks,
            lab,
        };
        for (k, w) in world.writers.iter().enumerate() {
            let detach = writer_detach(k, world.writers.len());
            say(&format!("writer {w}: its volume {detach:?} on detach"));
            world.create_writer(w, detach)?;
        }
        world.create_identity()?;
        // A pod's first start on a QEMU machine waits for its guest to boot and register and
        // for the image to be pulled under TCG: minutes when the suite's other lab runs beside
        // it (a 180 s wait once ran out in a clean-clone run). A bound on setup, not a check.
        let first_start = match world.lab.machines().first().map(|m| m.kind()) {
            Some(MachineKind::Qemu) => Duration::from_secs(420),
            _ => Duration::from_secs(180),
        };
        for w in &world.writers {
            let pod = eventually(&format!("writer {w} Running"), first_start, || {
                world.writer_pod(w).filter(|p| pod_phase(p) == "Running")
            })
            .with_context(|| {
                format!(
                    "writer {w}'s pod as the API has it: {}",
                    world
                        .writer_pod(w)
                        .map_or("none".to_string(), |p| pod_summary(&p))
                )
            })?;
            let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
            eventually(
                &format!("writer {w} acknowledging writes"),
                Duration::from_secs(120),
                || (world.ack_count(w) >= 10).then_some(()),
            )?;
            say(&format!("writer {w} Running on {node} and writing"));
        }
        let pod = eventually(&format!("identity {IDENTITY} Running"), first_start, || {
            world.identity_pod().filter(|p| pod_phase(p) == "Running")
        })?;
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        say(&format!(
            "volume-less identity {IDENTITY}-0 Running on {node}"
        ));
        Ok(world)
    }

    /// The volume-less identity: one replica whose container sleeps (on QEMU machines: beats),
    /// marked with [`crate::presence::IDENTITY_ENV`] and its pod UID.
    fn create_identity(&self) -> Result<()> {
        let c = &self.cluster;
        // A namespace machine's processes are the host's: the observer reads them in /proc.
        // A QEMU guest's are not, so there the container beats ([`crate::presence::Beats`]).
        let beats = crate::presence::beat_dir(&self.lab.shared_dir(), IDENTITY);
        std::fs::create_dir_all(&beats)?;
        let command = match self.lab.machines()[0].kind() {
            MachineKind::Namespace => "exec sleep 864000",
            MachineKind::Qemu => crate::presence::BEAT_COMMAND,
        };
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": IDENTITY, "namespace": APP_NS},
            "spec": {
                "replicas": 1, "serviceName": IDENTITY,
                "selector": {"matchLabels": {"app": IDENTITY}},
                "template": {
                    "metadata": {"labels": {"app": IDENTITY}},
                    "spec": {
                        "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": 5,
                        // Beside writer w0 when it can be: a fault on w0's machine then
                        // fences a volume-backed and a volume-less pod together, which a
                        // storage-only fence must tell apart.
                        "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": {"matchLabels": {"app": "w0"}},
                                "topologyKey": "kubernetes.io/hostname"
                            }
                        }]}},
                        "containers": [{
                            "name": "app", "image": "host",
                            "command": ["/bin/sh", "-c", command],
                            "env": [
                                {"name": crate::presence::BEAT_DIR_ENV, "value": beats.display().to_string()},
                                {"name": crate::presence::IDENTITY_ENV, "value": crate::presence::identity_value(self.lab.id(), &format!("{IDENTITY}-0"))},
                                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                            ]
                        }]
                    }
                }
            }
        }))?;
        c.rt.block_on(
            Api::<StatefulSet>::namespaced(c.client.clone(), APP_NS)
                .create(&PostParams::default(), &sts),
        )?;
        Ok(())
    }

    /// The volume-less identity's pod, if it exists.
    pub fn identity_pod(&self) -> Option<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.cluster.client.clone(), APP_NS);
        self.cluster
            .rt
            .block_on(pods.get_opt(&format!("{IDENTITY}-0")))
            .ok()
            .flatten()
    }

    fn create_writer(
        &self,
        w: &str,
        detach: palisade_labstore::kube_objects::Detach,
    ) -> Result<()> {
        let c = &self.cluster;
        let claim = format!("data-{w}-0");
        c.rt.block_on(palisade_labstore::kube_objects::ensure_volume(
            &c.client,
            &format!("pv-{w}"),
            w,
            STORAGE_DATA,
            APP_NS,
            &claim,
            detach,
        ))?;
        let dir = self.acks.join(w);
        std::fs::create_dir_all(&dir)?;
        let writer = palisade_lab::bin_path("palisade-writer")?;
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": w, "namespace": APP_NS},
            "spec": {
                "replicas": 1, "serviceName": w,
                "selector": {"matchLabels": {"app": w}},
                "template": {
                    "metadata": {"labels": {"app": w, "palisade.dev/nemesis-writer": "true"}},
                    "spec": {
                        "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": 5,
                        "containers": [{
                            "name": "writer", "image": "host", "command": [writer.display().to_string()],
                            "env": [
                                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                                {"name": "STORAGE_SERVER", "value": STORAGE_DATA},
                                {"name": "STORAGE_VOLUME", "value": w},
                                {"name": "ACK_LOG", "value": format!("{}/acks-$(POD_UID).log", dir.display())},
                                {"name": "WRITE_INTERVAL_MS", "value": "50"},
                                // Longer than any campaign: a writer never stops by itself.
                                {"name": "WRITE_SECONDS", "value": "864000"}
                            ],
                            "volumeMounts": [{"name": "data", "mountPath": self.lab.dir().join(format!("mnt-{w}")).display().to_string()}]
                        }]
                    }
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                             "resources": {"requests": {"storage": "1Gi"}}}
                }]
            }
        }))?;
        c.rt.block_on(
            Api::<StatefulSet>::namespaced(c.client.clone(), APP_NS)
                .create(&PostParams::default(), &sts),
        )?;
        Ok(())
    }

    /// Writer `w`'s pod (`<w>-0`), if it exists.
    pub fn writer_pod(&self, w: &str) -> Option<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.cluster.client.clone(), APP_NS);
        self.cluster
            .rt
            .block_on(pods.get_opt(&format!("{w}-0")))
            .ok()
            .flatten()
    }

    /// Acknowledgement logs of writer `w`, one per pod incarnation.
    pub fn ack_logs(&self, w: &str) -> Vec<PathBuf> {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.acks.join(w))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        logs.sort();
        logs
    }

    /// Acknowledged writes of writer `w` so far (every incarnation).
    pub fn ack_count(&self, w: &str) -> usize {
        self.ack_logs(w).iter().map(|p| count_lines(p)).sum()
    }

    /// The machine index of node `name` (`m<i>`).
    pub fn machine_index(&self, name: &str) -> Option<usize> {
        self.lab.machines().iter().position(|m| m.name() == name)
    }

    /// The controllers' Lease, if it can be read.
    fn leader_lease(&self) -> Option<Lease> {
        let leases: Api<Lease> = Api::namespaced(self.cluster.client.clone(), SYSTEM_NS);
        self.cluster
            .rt
            .block_on(leases.get_opt(LEADER_LEASE))
            .ok()
            .flatten()
    }

    /// The identity holding the controllers' Lease, if any.
    pub fn leader(&self) -> Option<String> {
        self.leader_lease()?
            .spec?
            .holder_identity
            .filter(|h| !h.is_empty())
    }

    /// The fencing token the controllers' Lease carries now (what its holder acts with).
    pub fn leader_token(&self) -> Option<u64> {
        self.leader_lease()?
            .metadata
            .annotations?
            .get(TOKEN_ANNOTATION)?
            .parse()
            .ok()
    }

    /// Sends the firmware-bridge a power off for `target` with fencing token `token`, as the
    /// controllers would (their client identity, a fresh idempotency key): what a deposed
    /// leader's request looks like when it arrives late. Returns how the bridge answered.
    pub fn late_power_off(&self, target: &str, token: u64) -> Result<String> {
        let settings = {
            let b = self.bridge();
            palisade_fence::bridge::ClientSettings::new(
                format!("https://{}/", b.addr).parse()?,
                std::fs::read(&b.ca_file)?,
                std::fs::read(&b.client_cert)?,
                std::fs::read(&b.client_key)?,
            )
        };
        let client = palisade_fence::bridge::BridgeClient::new(&settings)?;
        let key = palisade_fence::bridge::device::fresh_idempotency_key("late-off");
        let answer = self.cluster.rt.block_on(client.power(
            target,
            palisade_fence::bridge::wire::PowerAction::Off,
            token,
            &key,
            Some("the nemesis: a deposed leader's late request"),
        ));
        Ok(match answer {
            Ok(r) => format!("ACTED ON: {} {} (state {})", r.action, r.result, r.state),
            Err(e) => format!("refused: {}", palisade_fence::bridge::chain(&e)),
        })
    }

    /// The pid of machine `i`'s BMC (`ipmi_sim`), if it runs.
    pub fn bmc_pid(&self, i: usize) -> Option<i32> {
        let m = &self.lab.machines()[i];
        if !m.bmc_running() {
            return None;
        }
        std::fs::read_to_string(m.dir().join("bmc.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Copies the logs worth reading after a failed campaign into `out`.
    pub fn save_logs(&self, out: &Path) {
        let dir = out.join("logs");
        let _ = std::fs::create_dir_all(&dir);
        // One guard: the lock is not reentrant.
        let (bridge_log, audit_log) = {
            let b = self.bridge();
            (b.proc.log.clone(), b.audit_log.clone())
        };
        let mut files = vec![
            self.lab.dir().join("controller-palisade-0.log"),
            self.lab.dir().join("controller-palisade-1.log"),
            bridge_log,
            audit_log,
            self.storage.proc.log.clone(),
        ];
        for m in self.lab.machines() {
            // The supervisor writes its log in the machine's command directory.
            let _ = std::fs::copy(
                m.command_dir().join("agent.log"),
                dir.join(format!("{}-agent.log", m.name())),
            );
            if m.kind() == MachineKind::Qemu {
                let _ = std::fs::copy(
                    m.console_log(),
                    dir.join(format!("{}-console.log", m.name())),
                );
            }
        }
        for f in files.drain(..) {
            if let Some(name) = f.file_name() {
                let _ = std::fs::copy(&f, dir.join(name));
            }
        }
    }
}

fn count_lines(p: &Path) -> usize {
    std::fs::read(p)
        .map(|b| b.iter().filter(|c| **c == b'\n').count())
        .unwrap_or(0)
}

impl World {
    /// The controllers, locked.
    pub fn controllers(&self) -> parking_lot::MutexGuard<'_, Controllers> {
        self.controllers.lock()
    }

    /// The firmware-bridge, locked.
    pub fn bridge(&self) -> parking_lot::MutexGuard<'_, FirmwareBridge> {
        self.bridge.lock()
    }
}

/// A pod's node, phase, conditions and container states on one line (why it is not Running).
fn pod_summary(p: &Pod) -> String {
    let node = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let status = p.status.clone().unwrap_or_default();
    let conditions: Vec<String> = status
        .conditions
        .unwrap_or_default()
        .iter()
        .map(|c| {
            format!(
                "{}={} {}",
                c.type_,
                c.status,
                c.message.clone().unwrap_or_default()
            )
        })
        .collect();
    let containers: Vec<String> = status
        .container_statuses
        .unwrap_or_default()
        .iter()
        .map(|c| format!("{}: {:?}", c.name, c.state))
        .collect();
    format!(
        "node {node:?}, phase {:?}, conditions [{}], containers [{}]",
        status.phase.unwrap_or_default(),
        conditions.join("; "),
        containers.join("; ")
    )
}
