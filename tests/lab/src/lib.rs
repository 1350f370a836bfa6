//! Palisade's lab: a datacenter on one machine, built from real parts.
//!
//! [`Lab::start`] brings up, as configured:
//! - a real control plane ([`control_plane`]): etcd and kube-apiserver, kube-controller-manager
//!   and kube-scheduler of a [`KubeVersion`] (1.34 unless told otherwise, 1.20 as the oldest
//!   supported) on free loopback ports, with a generated CA ([`pki`]);
//! - simulated bare-metal machines ([`machine`]): each its own network namespace joined to
//!   the lab's hub bridge ([`netns`]), booted by its BMC (OpenIPMI `ipmi_sim`) either into its
//!   own PID, mount and UTS namespace, so that an IPMI power off kills everything on it, or,
//!   with [`MachineKind::Qemu`], as a QEMU virtual machine with its own kernel, boot ID,
//!   SMBIOS identity and watchdog ([`qemu`]);
//! - a switched PDU ([`pdu`]): Net-SNMP `snmpd` with an outlet-table handler
//!   ([`pdu_agent`]); an outlet turned off cuts its machine and the machine's BMC;
//! - an OCI registry ([`registry`], when [`LabConfig::registry`] asks for one): Debian's
//!   `docker-registry` with TLS from the lab CA, reached by machines at the hub address;
//! - stock machines ([`stock`]): namespace machines that run the real kubelet with a
//!   containerd and runc of their own instead of `palisade-node`, pulling from the registry;
//! - the hub's API front door ([`forwarder`]), which lets machines reach the API server and
//!   lets the lab cut one machine off the control plane alone.
//!
//! Partitions ([`Lab::partition`]) cut a machine's link or only its control-plane traffic,
//! without touching its processes. Teardown ([`Lab::stop`], or drop) leaves no process,
//! namespace, link or port behind, and a reaper process does the same if the owner dies.
//!
//! The API is blocking. From async code, call it inside `tokio::task::spawn_blocking`.

pub mod control_plane;
pub mod error;
pub mod forwarder;
pub mod machine;
pub mod netns;
pub mod pdu;
pub mod pdu_agent;
pub mod pki;
pub mod ports;
pub mod process;
pub mod qemu;
pub mod redfish;
pub mod redfish_quirks;
pub mod registry;
pub mod stock;

use std::collections::BTreeMap;
use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub use control_plane::{client_from_kubeconfig, ControlPlane, KubeVersion};
pub use error::{LabError, Result};
pub use machine::{BmcInfo, Machine};
pub use pdu::{Pdu, PduInfo, SnmpCred};
pub use pki::{Ca, Issued};
pub use qemu::{MachineKind, QemuConfig, WatchdogAction};
pub use redfish::{Sushy, SushySystem};
pub use registry::{ImageFile, Registry, RegistryConfig};
pub use stock::StockLab;

/// The port the hub's API front door listens on, inside the lab.
pub const API_HUB_PORT: u16 = 6443;

/// What to build.
#[derive(Clone, Debug)]
pub struct LabConfig {
    /// How many machines.
    pub machines: usize,
    /// Whether to start the Kubernetes control plane.
    pub control_plane: bool,
    /// Which Kubernetes release it runs: `None` takes `PALISADE_KUBE`, else
    /// [`KubeVersion::CURRENT`] ([`KubeVersion::from_env`]).
    pub kube: Option<KubeVersion>,
    /// Whether to start the PDU.
    pub pdu: bool,
    /// How many PDU outlets feed each machine (2 for dual power supplies).
    pub outlets_per_machine: usize,
    /// The shell command each machine runs when it boots (`/bin/sh` script text). The lab
    /// exports `PALISADE_MACHINE_NAME`, `PALISADE_MACHINE_ADDRESS`, `PALISADE_MACHINE_DIR`
    /// and `PALISADE_NODE_KUBECONFIG` to it.
    pub machine_command: String,
    /// Extra environment for every machine's command.
    pub machine_env: Vec<(String, String)>,
    /// The BMC administrator's user name.
    pub bmc_user: String,
    /// How long a PDU reboot keeps the outlet off.
    pub pdu_reboot_delay: Duration,
    /// How long a BMC waits, after asking a namespace machine to stop, before it kills the
    /// machine's boot script outright (default 20 s). Raise it above any power-off delay a
    /// test sets ([`Machine::set_power_off_delay`]).
    pub bmc_kill_wait: Duration,
    /// Keep the lab directory after teardown (also: `PALISADE_KEEP_LAB=1`).
    pub keep_dir: bool,
    /// What the machines are: namespaces (the default) or QEMU virtual machines. A QEMU
    /// machine runs `machine_command` inside the guest (busybox `sh`), where the exported
    /// paths are the guest's (`/machine/...`).
    pub machine_kind: MachineKind,
    /// How QEMU machines are built (ignored for namespace machines).
    pub qemu: QemuConfig,
    /// Start an OCI registry (before the machines, which get `PALISADE_REGISTRY`, its
    /// `host:port`, and `PALISADE_REGISTRY_CA`, the CA file, in their environment).
    pub registry: Option<RegistryConfig>,
    /// Put a relay between the API server and etcd, so that a test can make every etcd round
    /// trip late ([`ControlPlane::slow_etcd`]: a slow disk or a distant etcd member). Off by
    /// default: the relay costs a hop on every request.
    pub etcd_relay: bool,
}

impl Default for LabConfig {
    fn default() -> Self {
        LabConfig {
            machines: 3,
            control_plane: true,
            kube: None,
            pdu: true,
            outlets_per_machine: 1,
            machine_command: "exec sleep infinity".into(),
            machine_env: Vec::new(),
            bmc_user: "admin".into(),
            pdu_reboot_delay: Duration::from_secs(1),
            bmc_kill_wait: Duration::from_secs(20),
            keep_dir: false,
            machine_kind: MachineKind::Namespace,
            qemu: QemuConfig::default(),
            registry: None,
            etcd_relay: false,
        }
    }
}

/// The nftables table (bridge family) in a QEMU machine's namespace that holds its peer cuts.
const PEER_TABLE: &str = "palisade_peers";

/// Which links a partition cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The machine's link: it reaches nothing (control plane, other machines, storage).
    All,
    /// Only the machine's traffic to the control plane.
    ControlPlane,
    /// Only the machine's traffic to and from the other machines (a node–node partition):
    /// the control plane and storage stay reachable (a route for a namespace machine, an
    /// nftables bridge filter for a QEMU machine, whose traffic is bridged). It combines with
    /// [`Cut::ControlPlane`] (partition twice) to isolate a machine from everything but
    /// storage.
    Peers,
}

/// A running lab. Dropping it tears it down.
pub struct Lab {
    id: String,
    dir: PathBuf,
    rt: Option<tokio::runtime::Runtime>,
    ca: Ca,
    control_plane: Option<ControlPlane>,
    machines: Vec<Machine>,
    pdu: Option<Pdu>,
    registry: Option<parking_lot::Mutex<Registry>>,
    hub_ns: String,
    cuts: forwarder::CutSet,
    /// Machines (by index) cut from their peers ([`Cut::Peers`]).
    peer_cuts: parking_lot::Mutex<std::collections::BTreeSet<usize>>,
    reaper: Option<Child>,
    keep_dir: bool,
    stopped: bool,
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lab")
            .field("id", &self.id)
            .field("dir", &self.dir)
            .finish()
    }
}

impl Lab {
    /// Builds and starts a lab, waiting until every part is healthy. On failure everything
    /// started so far is torn down.
    pub fn start(config: LabConfig) -> Result<Lab> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        for tool in ["ip", "unshare", "ipmi_sim", "ipmitool", "setsid"] {
            require_tool(tool)?;
        }
        if config.machines > 200 {
            return Err(LabError::Other("a lab holds at most 200 machines".into()));
        }
        let id = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        let base = std::env::var_os("PALISADE_LAB_ROOT")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("palisade-lab-{id}"));
        fs::create_dir_all(&dir).map_err(LabError::io(&dir))?;
        let shared = dir.join("shared");
        fs::create_dir_all(&shared).map_err(LabError::io(&shared))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("lab-{id}"))
            .enable_all()
            .build()
            .map_err(|e| LabError::Other(format!("lab runtime: {e}")))?;
        let keep_dir =
            config.keep_dir || std::env::var("PALISADE_KEEP_LAB").is_ok_and(|v| v == "1");
        let mut lab = Lab {
            hub_ns: format!("pl{id}-hub"),
            ca: Ca::new(&format!("palisade-lab-{id}-ca"))?,
            id,
            dir,
            rt: Some(rt),
            control_plane: None,
            machines: Vec::new(),
            pdu: None,
            registry: None,
            cuts: forwarder::CutSet::default(),
            peer_cuts: Default::default(),
            reaper: None,
            keep_dir,
            stopped: false,
        };
        match lab.bring_up(&config) {
            Ok(()) => Ok(lab),
            Err(e) => {
                lab.stop();
                Err(e)
            }
        }
    }

    fn bring_up(&mut self, config: &LabConfig) -> Result<()> {
        self.reaper = Some(self.start_reaper()?);
        let lab_bin = bin_path("palisade-lab")?;

        // The hub: a namespace holding the bridge every machine plugs into.
        netns::add(&self.hub_ns)?;
        netns::ip(&["-n", &self.hub_ns, "link", "add", "br0", "type", "bridge"])?;
        netns::ip(&[
            "-n",
            &self.hub_ns,
            "addr",
            "add",
            &format!("{}/{}", netns::HUB_ADDR, netns::PREFIX),
            "dev",
            "br0",
        ])?;
        netns::ip(&["-n", &self.hub_ns, "link", "set", "br0", "up"])?;

        if config.control_plane {
            let version = match config.kube {
                Some(v) => v,
                None => KubeVersion::from_env()?,
            };
            let cp = ControlPlane::start(
                &self.dir.join("control-plane"),
                &self.id,
                &self.ca,
                self.handle(),
                version,
                config.etcd_relay,
            )?;
            let listener = netns::bind_tcp_in(
                &self.hub_ns,
                SocketAddr::new(IpAddr::V4(netns::HUB_ADDR), API_HUB_PORT),
            )?;
            let upstream: SocketAddr = ([127, 0, 0, 1], cp.api_port()).into();
            self.handle()
                .spawn(forwarder::relay(listener, upstream, self.cuts.clone()));
            self.control_plane = Some(cp);
        }

        let mut machine_env = config.machine_env.clone();
        if let Some(rc) = &config.registry {
            let reg = Registry::start(
                &self.dir.join("registry"),
                &self.id,
                &self.ca,
                rc,
                self.handle().clone(),
            )?;
            // Its own cut set: partitions from the control plane leave the registry reachable.
            let listener = netns::bind_tcp_in(
                &self.hub_ns,
                SocketAddr::new(IpAddr::V4(netns::HUB_ADDR), registry::REGISTRY_HUB_PORT),
            )?;
            self.handle().spawn(forwarder::relay(
                listener,
                reg.local_addr(),
                forwarder::CutSet::default(),
            ));
            machine_env.push(("PALISADE_REGISTRY".into(), reg.host()));
            machine_env.push((
                "PALISADE_REGISTRY_CA".into(),
                reg.ca_file().display().to_string(),
            ));
            self.registry = Some(parking_lot::Mutex::new(reg));
        }

        // ipmi_sim keeps at most 16 password bytes (the IPMI 1.5 limit).
        let password = format!("bmc-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let assets = match config.machine_kind {
            MachineKind::Qemu if config.machines > 0 => {
                let first = self.dir.join("machines").join("m0");
                Some(qemu::prepare_assets(
                    &self.dir,
                    &config.qemu,
                    "m0",
                    &first.join("console.log"),
                )?)
            }
            _ => None,
        };
        for index in 0..config.machines {
            let name = format!("m{index}");
            // As on real hardware, the BMC reports the machine's own SMBIOS UUID as its system
            // GUID, in the SMBIOS byte order (first three fields little-endian); a fencer
            // compares it with the Node's systemUUID before any power action.
            let system_uuid = random_uuid();
            let bmc_guid = smbios_swapped(&system_uuid);
            let machine = Machine {
                kind: config.machine_kind,
                system_uuid,
                bmc_guid,
                lab_id: self.id.clone(),
                index,
                netns: format!("pl{}-{name}", self.id),
                hub_link: format!("h{}m{index}", self.id),
                dir: self.dir.join("machines").join(&name),
                bmc: BmcInfo {
                    host: std::net::Ipv4Addr::LOCALHOST,
                    port: ports::free_port(),
                    user: config.bmc_user.clone(),
                    password_file: self.dir.join("machines").join(&name).join("bmc-password"),
                },
                outlets: (0..config.outlets_per_machine)
                    .map(|k| (index * config.outlets_per_machine + k + 1) as u32)
                    .collect(),
                name,
            };
            self.plug(&machine)?;
            machine::write_files(&machine::MachineFiles {
                lab_id: &self.id,
                lab_bin: &lab_bin,
                shared_dir: &self.shared_dir(),
                machine: &machine,
                password: &password,
                command: &config.machine_command,
                extra_env: &machine_env,
                qemu: assets.as_ref().map(|a| (a, &config.qemu)),
                kill_wait: config.bmc_kill_wait,
            })?;
            if let Some(cp) = &self.control_plane {
                cp.write_node_kubeconfig(&self.ca, &machine.name, &machine.node_kubeconfig())?;
            }
            self.machines.push(machine);
        }
        match config.machine_kind {
            // Boot every machine through its BMC, then wait for all of them.
            MachineKind::Namespace => {
                for m in &self.machines {
                    m.start_bmc()?;
                }
                for m in &self.machines {
                    m.wait_power(true, Duration::from_secs(30))?;
                    self.wait_bmc(m)?;
                }
            }
            // One at a time: a TCG boot takes most of a core for seconds, and boots that
            // compete for the CPU all take longer.
            MachineKind::Qemu => {
                for m in &self.machines {
                    m.start_bmc()?;
                    m.wait_booted(None, config.qemu.boot_timeout)?;
                    self.wait_bmc(m)?;
                }
            }
        }

        if config.pdu {
            let mut outlets = Vec::new();
            let mut machines = BTreeMap::new();
            for m in &self.machines {
                for (k, n) in m.outlets.iter().enumerate() {
                    outlets.push(pdu_agent::Outlet {
                        number: *n,
                        name: format!("{}-psu{}", m.name, k + 1),
                        machine: m.name.clone(),
                        on: true,
                    });
                }
                machines.insert(
                    m.name.clone(),
                    pdu_agent::MachinePower {
                        dir: m.dir.clone(),
                        marker: m.marker(),
                    },
                );
            }
            let state = pdu_agent::PduState {
                outlets,
                machines,
                reboot_delay_ms: config.pdu_reboot_delay.as_millis() as u64,
            };
            self.pdu = Some(Pdu::start(
                &self.dir.join("pdu"),
                &self.id,
                &lab_bin,
                state,
            )?);
        }
        Ok(())
    }

    /// Connects a machine's namespace to the hub: a veth whose hub end joins the lab bridge.
    /// A namespace machine's end is its NIC (with its address and default route); a QEMU
    /// machine's end is bridged with the tap that QEMU attaches to, and the address lives in
    /// the guest.
    fn plug(&self, m: &Machine) -> Result<()> {
        netns::add(&m.netns)?;
        netns::ip(&[
            "-n",
            &self.hub_ns,
            "link",
            "add",
            &m.hub_link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &m.netns,
        ])?;
        netns::ip(&[
            "-n",
            &self.hub_ns,
            "link",
            "set",
            &m.hub_link,
            "master",
            "br0",
            "up",
        ])?;
        if m.kind == MachineKind::Qemu {
            let ns = m.netns.as_str();
            netns::ip(&["-n", ns, "link", "add", "br0", "type", "bridge"])?;
            netns::ip(&["-n", ns, "tuntap", "add", qemu::TAP, "mode", "tap"])?;
            netns::ip(&["-n", ns, "link", "set", qemu::TAP, "master", "br0", "up"])?;
            netns::ip(&["-n", ns, "link", "set", "eth0", "master", "br0", "up"])?;
            netns::ip(&["-n", ns, "link", "set", "br0", "up"])?;
            return Ok(());
        }
        netns::ip(&[
            "-n",
            &m.netns,
            "addr",
            "add",
            &format!("{}/{}", m.address(), netns::PREFIX),
            "dev",
            "eth0",
        ])?;
        netns::ip(&["-n", &m.netns, "link", "set", "eth0", "up"])?;
        netns::ip(&[
            "-n",
            &m.netns,
            "route",
            "add",
            "default",
            "via",
            &netns::HUB_ADDR.to_string(),
        ])?;
        Ok(())
    }

    /// Waits until a machine's BMC answers an authenticated IPMI request.
    pub fn wait_bmc(&self, m: &Machine) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let out = m
                .bmc
                .ipmitool()
                .args(["chassis", "power", "status"])
                .stdin(Stdio::null())
                .output();
            match out {
                Ok(o) if o.status.success() => return Ok(()),
                Ok(o) if std::time::Instant::now() > deadline => {
                    return Err(LabError::NotReady {
                        component: format!("BMC of {}", m.name),
                        seconds: 30,
                        detail: String::from_utf8_lossy(&o.stderr).into_owned(),
                        log: m.dir.join("bmc.log").display().to_string(),
                    })
                }
                Err(e) => return Err(LabError::Other(format!("ipmitool: {e}"))),
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn start_reaper(&self) -> Result<Child> {
        let script = self.dir.join("reaper.sh");
        write_executable(
            &script,
            &format!(
                r#"#!/bin/bash
# Tears lab {id} down if the process that started it dies without doing so.
owner=$1
while kill -0 "$owner" 2>/dev/null; do sleep 1; done
for round in 1 2 3; do
  for p in /proc/[0-9]*; do
    if tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qx '{env}={id}'; then kill -9 "${{p#/proc/}}" 2>/dev/null; fi
  done
  sleep 0.2
done
for ns in $(ip netns list 2>/dev/null | awk '{{print $1}}' | grep '^pl{id}-'); do ip netns delete "$ns"; done
{rm}
"#,
                id = self.id,
                env = process::LAB_ENV,
                rm = if self.keep_dir {
                    String::new()
                } else {
                    format!("rm -rf '{}'", self.dir.display())
                },
            ),
        )?;
        Command::new("/bin/bash")
            .arg(&script)
            .arg(std::process::id().to_string())
            .env_remove(process::LAB_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| LabError::Other(format!("starting the reaper: {e}")))
    }

    /// The lab's id (part of every namespace's name).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The lab's directory: certificates, logs and state of every part.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A directory every machine sees at this same path, read-write, whatever its kind (a
    /// namespace machine sees the host's file system; a QEMU guest mounts this directory over
    /// 9p): where workloads write what the suite reads back, such as a writer's
    /// acknowledgements. It holds nothing secret; the rest of the lab directory (BMC
    /// credentials, keys) stays invisible to QEMU guests.
    pub fn shared_dir(&self) -> PathBuf {
        self.dir.join("shared")
    }

    /// The lab's certificate authority, to issue certificates for lab services.
    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// The control plane, if the lab has one.
    pub fn control_plane(&self) -> Option<&ControlPlane> {
        self.control_plane.as_ref()
    }

    /// The machines.
    pub fn machines(&self) -> &[Machine] {
        &self.machines
    }

    /// A machine by name.
    pub fn machine(&self, name: &str) -> Result<&Machine> {
        self.machines
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| LabError::NoSuchMachine(name.into()))
    }

    /// The PDU, if the lab has one.
    pub fn pdu(&self) -> Option<&Pdu> {
        self.pdu.as_ref()
    }

    /// The OCI registry, if [`LabConfig::registry`] asked for one (behind a lock: tests
    /// stop and restart it).
    pub fn registry(&self) -> Option<parking_lot::MutexGuard<'_, Registry>> {
        self.registry.as_ref().map(|r| r.lock())
    }

    /// The namespace that holds the lab bridge; [`netns::HUB_ADDR`] lives there.
    pub fn hub_netns(&self) -> &str {
        &self.hub_ns
    }

    /// Makes a service on the host's loopback (`upstream`) reachable from every machine at
    /// [`netns::HUB_ADDR`]`:hub_port`, like the control plane is, but never cut by a
    /// partition (an out-of-band collector, for example an OTLP receiver).
    pub fn expose_on_hub(&self, hub_port: u16, upstream: SocketAddr) -> Result<SocketAddr> {
        let at = SocketAddr::new(IpAddr::V4(netns::HUB_ADDR), hub_port);
        let listener = netns::bind_tcp_in(&self.hub_ns, at)?;
        self.handle().spawn(forwarder::relay(
            listener,
            upstream,
            forwarder::CutSet::default(),
        ));
        Ok(at)
    }

    /// Makes a UDP service on the host's loopback (`upstream`, for example a BMC's RMCP+
    /// port) reachable from every machine at [`netns::HUB_ADDR`]`:hub_port`, never cut by a
    /// partition (the management network is out of band): what a controller running *on* a
    /// machine needs to reach the other machines' BMCs.
    pub fn expose_udp_on_hub(&self, hub_port: u16, upstream: SocketAddr) -> Result<SocketAddr> {
        let at = SocketAddr::new(IpAddr::V4(netns::HUB_ADDR), hub_port);
        let socket = netns::bind_udp_in(&self.hub_ns, at)?;
        self.handle().spawn(forwarder::relay_udp(
            socket,
            upstream,
            forwarder::ReplyFault::default(),
        ));
        Ok(at)
    }

    /// A relay on the host's loopback in front of machine `index`'s BMC: clients that use the
    /// returned address reach the BMC as before, until the returned [`forwarder::ReplyFault`]
    /// makes its answers slow, garbage or absent (a failing or lying management network,
    /// while the BMC itself and the machine are untouched).
    pub fn bmc_relay(&self, index: usize) -> Result<(SocketAddr, forwarder::ReplyFault)> {
        let m = self
            .machines
            .get(index)
            .ok_or_else(|| LabError::NoSuchMachine(index.to_string()))?;
        let b = m.bmc();
        let upstream = SocketAddr::new(IpAddr::V4(b.host), b.port);
        let socket = std::net::UdpSocket::bind((std::net::Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| LabError::Other(format!("binding a BMC relay: {e}")))?;
        let at = socket
            .local_addr()
            .map_err(|e| LabError::Other(format!("binding a BMC relay: {e}")))?;
        let fault = forwarder::ReplyFault::default();
        self.handle()
            .spawn(forwarder::relay_udp(socket, upstream, fault.clone()));
        Ok((at, fault))
    }

    /// Cuts machine `index` off, as `cut` says. Its processes keep running.
    pub fn partition(&self, index: usize, cut: Cut) -> Result<()> {
        let m = self
            .machines
            .get(index)
            .ok_or_else(|| LabError::NoSuchMachine(index.to_string()))?;
        match cut {
            Cut::Peers => return self.cut_peers(m),
            // Control-plane traffic goes silent either way, so a cut never lets a request
            // through.
            Cut::All | Cut::ControlPlane => self.cuts.cut(IpAddr::V4(m.address())),
        }
        if cut == Cut::All {
            netns::ip(&["-n", &self.hub_ns, "link", "set", &m.hub_link, "down"])?;
        }
        Ok(())
    }

    /// Impairs machine `index`'s link to the control plane without cutting it: a one-way
    /// partition ([`forwarder::Link::Deaf`]: its requests land, nothing comes back) or a
    /// delay each way ([`forwarder::Link::Slow`]). Its other links are untouched; [`Lab::heal`]
    /// ends it.
    pub fn impair_control_plane(&self, index: usize, link: forwarder::Link) -> Result<()> {
        let m = self
            .machines
            .get(index)
            .ok_or_else(|| LabError::NoSuchMachine(index.to_string()))?;
        self.cuts.impair(IpAddr::V4(m.address()), link);
        Ok(())
    }

    /// Drops traffic between `m` and every other machine, both ways, on each side (see
    /// [`Lab::block_peer`]), so neither side's packets arrive.
    fn cut_peers(&self, m: &Machine) -> Result<()> {
        self.peer_cuts.lock().insert(m.index);
        for other in self.machines.iter().filter(|o| o.index != m.index) {
            for (from, to) in [(m, other), (other, m)] {
                Self::block_peer(from, to, true)?;
            }
        }
        Ok(())
    }

    /// Removes `m`'s peer cut, keeping any other machine's peer cut in place.
    fn heal_peers(&self, m: &Machine) -> Result<()> {
        let mut cut = self.peer_cuts.lock();
        if !cut.remove(&m.index) {
            return Ok(());
        }
        for other in self.machines.iter().filter(|o| o.index != m.index) {
            if cut.contains(&other.index) {
                continue;
            }
            for (from, to) in [(m, other), (other, m)] {
                Self::block_peer(from, to, false)?;
            }
        }
        Ok(())
    }

    /// Drops (`block`) or lets through again what `from`'s namespace passes to or from `to`.
    /// A namespace machine routes its own traffic: a blackhole route to `to`. A QEMU
    /// machine's NIC is a tap bridged to its link inside its namespace, so its traffic is
    /// bridged, never routed there: an nftables bridge-family filter in that namespace drops
    /// frames carrying `to`'s address either way (set `cut` of table `palisade_peers`).
    fn block_peer(from: &Machine, to: &Machine, block: bool) -> Result<()> {
        let addr = to.address().to_string();
        match from.kind {
            MachineKind::Namespace => {
                let dest = format!("{addr}/32");
                if block {
                    // `replace`: a second cut of the same pair is not an error.
                    netns::ip(&["-n", &from.netns, "route", "replace", "blackhole", &dest])
                } else {
                    netns::ip(&["-n", &from.netns, "route", "del", "blackhole", &dest])
                }
            }
            MachineKind::Qemu => {
                require_tool("nft")?;
                let nft = |args: &[&str]| {
                    process::run(
                        Command::new("ip")
                            .args(["netns", "exec", &from.netns, "nft"])
                            .args(args),
                    )
                };
                // Built once per namespace (a rule `add`ed twice would be there twice).
                if nft(&["list", "table", "bridge", PEER_TABLE]).is_err() {
                    nft(&["add", "table", "bridge", PEER_TABLE])?;
                    nft(&[
                        "add",
                        "set",
                        "bridge",
                        PEER_TABLE,
                        "cut",
                        "{ type ipv4_addr; }",
                    ])?;
                    nft(&[
                        "add",
                        "chain",
                        "bridge",
                        PEER_TABLE,
                        "forward",
                        "{ type filter hook forward priority 0; policy accept; }",
                    ])?;
                    for dir in ["saddr", "daddr"] {
                        nft(&[
                            "add", "rule", "bridge", PEER_TABLE, "forward", "ip", dir, "@cut",
                            "drop",
                        ])?;
                    }
                }
                let element = format!("{{ {addr} }}");
                // `add` of a present element and `delete` of an absent one are both fine
                // here: the lab's own bookkeeping decides which pairs are cut.
                let verb = if block { "add" } else { "delete" };
                nft(&[verb, "element", "bridge", PEER_TABLE, "cut", &element]).or_else(|e| {
                    if block {
                        Err(e)
                    } else {
                        Ok(String::new())
                    }
                })
            }
        }
        .map(|_| ())
    }

    /// Heals every cut of machine `index`.
    pub fn heal(&self, index: usize) -> Result<()> {
        let m = self
            .machines
            .get(index)
            .ok_or_else(|| LabError::NoSuchMachine(index.to_string()))?;
        netns::ip(&["-n", &self.hub_ns, "link", "set", &m.hub_link, "up"])?;
        self.cuts.heal(IpAddr::V4(m.address()));
        self.heal_peers(m)
    }

    /// The runtime the lab's own tasks (the API front door) run on.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.rt
            .as_ref()
            .expect("the lab has been stopped; its runtime is gone")
            .handle()
    }

    /// Tears everything down: machines and BMCs, the PDU, the control plane, every process
    /// marked as the lab's, the namespaces and (unless kept) the directory. Idempotent.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        for m in &self.machines {
            m.kill_all();
        }
        if let Some(mut pdu) = self.pdu.take() {
            pdu.stop();
        }
        if let Some(mut cp) = self.control_plane.take() {
            cp.stop();
        }
        if let Some(reg) = self.registry.take() {
            reg.into_inner().stop();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        process::kill_marked(process::LAB_ENV, &self.id, Duration::from_secs(10));
        for m in &self.machines {
            netns::delete(&m.netns);
        }
        netns::delete(&self.hub_ns);
        if !self.keep_dir {
            let _ = fs::remove_dir_all(&self.dir);
        }
        if let Some(mut reaper) = self.reaper.take() {
            let _ = reaper.kill();
            let _ = reaper.wait();
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `f` on the lab's runtime and waits for it from a plain thread (works even when the
/// caller is itself inside another tokio runtime).
pub(crate) fn block<F>(rt: &tokio::runtime::Handle, f: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .expect("the lab runtime stopped while a task was running")
}

/// `uuid` (8-4-4-4-12) with its first three fields byte-swapped: the other encoding of the
/// same 16 bytes, which BMCs use for the system GUID.
pub fn smbios_swapped(uuid: &str) -> String {
    palisade_model::identity::swapped(uuid)
}

/// A random (version 4) UUID, lower case, 8-4-4-4-12.
fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    // Never all zeros or all ones: the version and variant bits are set.
    palisade_model::identity::normalize_uuid(&hex).unwrap_or(hex)
}

/// Fails with a clear message if `tool` is not on the PATH.
pub fn require_tool(tool: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    if found {
        Ok(())
    } else {
        Err(LabError::MissingTool {
            tool: tool.into(),
            hint: "not on PATH".into(),
        })
    }
}

/// Writes a file readable by its owner only (secrets, keys, configs holding passwords).
pub fn write_secret(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(LabError::io(path))?;
    f.write_all(data).map_err(LabError::io(path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(LabError::io(path))
}

/// Writes an executable script.
pub fn write_executable(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).map_err(LabError::io(path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).map_err(LabError::io(path))
}

/// Locates a binary of this workspace: `$PALISADE_BIN_DIR/<name>`, else next to the running
/// executable or one level up (test executables live in `target/<profile>/deps`).
pub fn bin_path(name: &str) -> Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("PALISADE_BIN_DIR") {
        candidates.push(PathBuf::from(dir).join(name));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join(name));
            if let Some(up) = dir.parent() {
                candidates.push(up.join(name));
            }
        }
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        // Absolute: the path is written into machines' boot scripts, which run elsewhere (a
        // relative PALISADE_BIN_DIR made every namespace machine fail to boot).
        .and_then(|p| std::path::absolute(&p).ok())
        .ok_or_else(|| LabError::MissingTool {
            tool: name.into(),
            hint: "build it first: cargo build --workspace --bins".into(),
        })
}
