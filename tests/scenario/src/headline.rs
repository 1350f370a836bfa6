//! The headline scenario, shared by `palisade-demo` and the recovery benchmark: a StatefulSet
//! writer with a ReadWriteOnce CSI volume on m0, m0 cut off the network (or, with
//! [`Options::power_off`], switched off at its BMC), and either Palisade (fencing through the
//! firmware-bridge, release, recovery elsewhere, the at-most-one checker) or nothing (the pod
//! stays stuck; what Kubernetes alone does).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use palisade_lab::{Cut, Lab};
use palisade_labstore::admin_client::AdminClient;
use palisade_model::nodefence::Phase;
use serde_json::json;

use crate::*;

/// Prints timestamped lines (unless quiet).
pub struct Timeline {
    start: Instant,
    quiet: bool,
}

impl Timeline {
    /// Starts the clock.
    pub fn new(quiet: bool) -> Timeline {
        Timeline {
            start: Instant::now(),
            quiet,
        }
    }

    /// Prints `[   t.ttts] what`.
    pub fn say(&self, what: impl AsRef<str>) {
        if !self.quiet {
            println!(
                "[{:>8.3}s] {}",
                self.start.elapsed().as_secs_f64(),
                what.as_ref()
            );
        }
    }

    /// Prints a line as is.
    pub fn print(&self, text: impl AsRef<str>) {
        if !self.quiet {
            println!("{}", text.as_ref());
        }
    }
}

/// What one run measured, as offsets from the fault: the instant the cut (or the `chassis
/// power off` command) returned. Observed by polling the API every 200 ms, except where said.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// When each `NodeFence` phase was first observed.
    pub phases: Vec<(Phase, Duration)>,
    /// When each `NodeFence` phase was entered, by the controller's own timestamps (the
    /// transitions' `at`, in microseconds; the controller runs on this host's clock).
    pub stamped: Vec<(Phase, Duration)>,
    /// Why m0 was fenced (the NodeFence's reason: silence, or power evidence).
    pub reason: String,
    /// With [`Options::power_off`]: how long `chassis power off` took, sent → returned (add it
    /// to any offset to count from the command's sending).
    pub power_command: Option<Duration>,
    /// With [`Options::power_off`]: when the controller's power watch first read m0 off (the
    /// answer to that read, by the controller log's timestamp).
    pub first_off_read: Option<Duration>,
    /// When the volume was attached to another machine.
    pub attached: Option<Duration>,
    /// When the replacement pod was Running.
    pub running: Option<Duration>,
    /// When the replacement had acknowledged 20 writes.
    pub writing: Option<Duration>,
    /// The at-most-one checker's verdict (with Palisade).
    pub verdict_pass: bool,
    /// Without Palisade: what the old pod and its node looked like at the end of the wait.
    pub stuck: Option<String>,
}

impl Report {
    /// When `phase` was first observed.
    pub fn phase(&self, phase: Phase) -> Option<Duration> {
        self.phases
            .iter()
            .find(|(p, _)| *p == phase)
            .map(|(_, d)| *d)
    }

    /// When `phase` was entered, by the controller's timestamp.
    pub fn stamped(&self, phase: Phase) -> Option<Duration> {
        self.stamped
            .iter()
            .find(|(p, _)| *p == phase)
            .map(|(_, d)| *d)
    }

    /// Whether m0 was fenced on power evidence (its BMC read it off) rather than its silence.
    pub fn on_power_evidence(&self) -> bool {
        self.reason.contains("on power evidence")
    }
}

/// With [`Options::power_off`]: the policy's `detection.powerOffAfterSeconds`.
pub const POWER_OFF_AFTER_SECONDS: i64 = 1;
/// With [`Options::power_off`]: the controller's `--power-watch-interval`.
pub const POWER_WATCH_INTERVAL: &str = "250ms";

/// How to run the scenario.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Run Palisade (bridge and controller). Without it, nothing fences m0.
    pub palisade: bool,
    /// Without Palisade: how long to watch the stuck pod after the cut.
    pub watch_without: Duration,
    /// Fence through the storage firewall only (no power level): m0 keeps running, its old
    /// writer cut off from the volume.
    pub storage_only: bool,
    /// How m0 is cut off.
    pub cut: Cut,
    /// Switch m0 off at its BMC (`ipmitool chassis power off`) instead of cutting it off
    /// (`cut` is then unused), with power evidence on: the policy's
    /// `detection.powerOffAfterSeconds` is [`POWER_OFF_AFTER_SECONDS`], the controller reads
    /// the BMCs every [`POWER_WATCH_INTERVAL`], and each FenceTarget gets a second level, its
    /// machine's BMC directly, pinned to the machine's identity (`guid=`), with its password in
    /// a Secret: the power watch reads only direct, pinned BMCs. The fence itself still goes
    /// through the bridge (the first level), as after a cut. Not with `in_cluster` or `recover`.
    pub power_off: bool,
    /// After the replacement writes: heal m0 and wait until the fence is lifted (which needs
    /// the positive proof that the old writer is gone), then judge the writes again.
    pub recover: bool,
    /// Run the controller in the cluster, installed from `controller/manifests` with its image
    /// pulled from the lab registry ([`crate::in_cluster`]), reaching the bridge over the
    /// lab's hub; the lab must have a registry ([`crate::in_cluster::lab_config`]).
    pub in_cluster: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            palisade: true,
            watch_without: Duration::ZERO,
            storage_only: false,
            cut: Cut::All,
            power_off: false,
            recover: false,
            in_cluster: false,
        }
    }
}

fn short(uid: &str) -> &str {
    &uid[..8.min(uid.len())]
}

/// Runs the scenario on a lab whose three machines run `palisade-node` and which has a PDU.
pub fn run(lab: &Lab, c: &Cluster, t: &Timeline, opts: Options) -> Result<Report> {
    if opts.power_off && (opts.in_cluster || opts.recover) {
        bail!("power_off runs the controller beside the lab and never powers m0 on again: not with in_cluster or recover");
    }
    let mut report = Report::default();
    // Storage: the writer's volume on the lab array, attached through CSI by the real
    // attach-detach controller and the lab attacher (an attach grants the node the volume).
    let storage = Storage::start(lab, &["db"])?;
    let _attacher = storage.start_attacher(lab)?;
    let admin = AdminClient::new(
        &format!("https://{}", storage.admin),
        storage.ca_pem.as_bytes(),
        palisade_storagefw::Secret::new(storage.token.clone()),
    )?;
    t.say(format!(
        "storage server up: data path {STORAGE_DATA} in the lab, admin API https://{} (TLS, token); CSI attacher running",
        storage.admin
    ));
    c.namespace(SYSTEM_NS)?;
    c.namespace("app")?;
    c.rt.block_on(palisade_labstore::kube_objects::ensure_volume(
        &c.client,
        "pv-db",
        "db",
        STORAGE_DATA,
        "app",
        "data-db-0",
        palisade_labstore::kube_objects::Detach::Revokes,
    ))?;
    let palisade = if opts.palisade {
        Some(start_palisade(lab, c, t, &storage, opts)?)
    } else {
        t.say("no Palisade in this run: nothing fences m0");
        None
    };

    // The writer StatefulSet, placed on m0.
    // Acknowledgements go to the lab's shared directory: QEMU guests see it too.
    let acks = lab.shared_dir().join("acks");
    std::fs::create_dir_all(&acks)?;
    let writer = palisade_lab::bin_path("palisade-writer")?;
    cordon(&c.client, &c.rt, "m1", true)?;
    cordon(&c.client, &c.rt, "m2", true)?;
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "app"},
        "spec": {
            "replicas": 1, "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
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
                            {"name": "STORAGE_VOLUME", "value": "db"},
                            {"name": "ACK_LOG", "value": format!("{}/acks-$(POD_UID).log", acks.display())},
                            {"name": "WRITE_INTERVAL_MS", "value": "50"},
                            {"name": "WRITE_SECONDS", "value": "600"}
                        ],
                        // Host-image containers: the mount point lives in the lab directory.
                        "volumeMounts": [{"name": "data", "mountPath": lab.dir().join("mnt-data").display().to_string()}]
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
        Api::<StatefulSet>::namespaced(c.client.clone(), "app")
            .create(&PostParams::default(), &sts),
    )?;
    // Where the start's time goes: scheduled, volume attached, Running, writing.
    let created = Instant::now();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "app");
    eventually("db-0 scheduled to m0", Duration::from_secs(120), || {
        let p = c.rt.block_on(pods.get_opt("db-0")).ok().flatten()?;
        (p.spec.as_ref()?.node_name.as_deref() == Some("m0")).then_some(())
    })?;
    let scheduled = created.elapsed();
    let vas: Api<VolumeAttachment> = Api::all(c.client.clone());
    let old_va = eventually("volume db attached to m0", Duration::from_secs(120), || {
        let list = c.rt.block_on(vas.list(&Default::default())).ok()?;
        list.items.into_iter().find_map(|va| {
            (va.spec.node_name == "m0"
                && va.spec.source.persistent_volume_name.as_deref() == Some("pv-db")
                && va.status.as_ref().is_some_and(|s| s.attached))
            .then(|| va.name_any())
        })
    })?;
    let attached = created.elapsed();
    let old = eventually("db-0 Running on m0", Duration::from_secs(120), || {
        let p = c.rt.block_on(pods.get_opt("db-0")).ok().flatten()?;
        (p.spec.as_ref()?.node_name.as_deref() == Some("m0") && pod_phase(&p) == "Running")
            .then_some(p)
    })?;
    let running = created.elapsed();
    let old_uid = old.uid().context("pod uid")?;
    let old_acks = acks.join(format!("acks-{old_uid}.log"));
    eventually(
        "the writer on m0 acknowledged",
        Duration::from_secs(60),
        || (read_or_empty(&old_acks).lines().count() >= 20).then_some(()),
    )?;
    t.say(format!(
        "db-0 started: scheduled to m0 after {:.1} s, volume attached after {:.1} s, Running after {:.1} s, 20 writes after {:.1} s",
        scheduled.as_secs_f64(),
        attached.as_secs_f64(),
        running.as_secs_f64(),
        created.elapsed().as_secs_f64()
    ));
    cordon(&c.client, &c.rt, "m1", false)?;
    cordon(&c.client, &c.rt, "m2", false)?;
    t.say(format!("StatefulSet app/db: db-0 (uid {}) Running on m0 with PVC data-db-0 (RWO, CSI volume 'db' attached to m0), writing ({} writes acknowledged)", short(&old_uid), read_or_empty(&old_acks).lines().count()));

    // The fault: the partition, or the power switched off at the BMC.
    t.print("");
    let (cut, cut_at) = if opts.power_off {
        t.say(format!("switching m0 off at its BMC (ipmitool chassis power off); the controller reads every pinned BMC every {POWER_WATCH_INTERVAL}"));
        let (took, returned) = power_off(&lab.machines()[0])?;
        report.power_command = Some(took);
        t.say(format!(
            "+0.00s chassis power off returned after {:.3} s",
            took.as_secs_f64()
        ));
        returned
    } else {
        t.say(match opts.cut {
            Cut::All => "cutting m0 off the network (its link goes down; its processes keep running)",
            Cut::ControlPlane => "cutting m0 off the control plane only (it still reaches the storage and its peers; its processes keep running)",
            Cut::Peers => "cutting m0 off its peers only (it still reaches the control plane and the storage)",
        });
        lab.partition(0, opts.cut)?;
        (Instant::now(), Timestamp::now())
    };
    let since = |i: Instant| format!("+{:.2}s", i.duration_since(cut).as_secs_f64());

    let Some(palisade) = palisade else {
        report.stuck = Some(watch_stuck(c, t, &pods, &old_uid, cut, opts.watch_without)?);
        return Ok(report);
    };

    let mut seen = 0;
    let released = eventually("m0 fenced and released", Duration::from_secs(180), || {
        let nf = fences_for(&c.client, &c.rt, "m0").into_iter().next()?;
        let st = nf.status.clone()?;
        for tr in st.transitions.iter().skip(seen) {
            seen += 1;
            let line = match tr.phase {
                Phase::Pending => format!(
                    "detected and decided: NodeFence {} created ({})",
                    nf.name_any(),
                    nf.spec.reason
                ),
                Phase::Fencing => format!(
                    "fencing m0 with token {}",
                    st.fencing_token.unwrap_or_default()
                ),
                Phase::Fenced => {
                    let ev: Vec<String> = st
                        .evidence
                        .iter()
                        .map(|e| {
                            format!(
                                "{:?} by {}",
                                e.kind,
                                e.device.split('?').next().unwrap_or("")
                            )
                        })
                        .collect();
                    format!("fenced, verified: {}", ev.join("; "))
                }
                Phase::Releasing => {
                    "releasing: node tainted NoSchedule, pods force-deleted by UID, then out-of-service".into()
                }
                Phase::Released => format!(
                    "released: {} pod(s), {} VolumeAttachment(s), {} volumesInUse record(s)",
                    st.release.pods.len(),
                    st.release.attachments.len(),
                    st.release.attach_records.len()
                ),
                other => format!("{other:?}"),
            };
            report.phases.push((tr.phase, cut.elapsed()));
            t.say(format!("{} {line}", since(Instant::now())));
        }
        (st.phase == Phase::Released).then_some(nf)
    })?;
    let st = released.status.clone().unwrap_or_default();
    report.reason = released.spec.reason.clone();
    report.stamped = st
        .transitions
        .iter()
        .map(|tr| (tr.phase, after(cut_at, tr.at.0)))
        .collect();
    if opts.power_off {
        report.first_off_read = palisade
            .controller
            .as_ref()
            .and_then(|p| first_off_read(&p.log, "m0", cut_at))
            .map(|at| after(cut_at, at));
        if let Some(read) = report.first_off_read {
            t.say(format!(
                "+{:.2}s (by the controller's log) the power watch first read m0 off",
                read.as_secs_f64()
            ));
        }
    }
    // On Kubernetes 1.26 and later the out-of-service taint lets the attach-detach controller
    // detach the volume itself once the pod is gone: it may delete m0's VolumeAttachment
    // before Palisade does. The API server's audit log says who did.
    if !st.release.attachments.iter().any(|a| a.name == old_va) {
        let by = lab
            .control_plane()
            .map(|cp| cp.audit())
            .unwrap_or_default()
            .into_iter()
            .find(|e| e.verb == "delete" && e.succeeded() && e.on("volumeattachments", &old_va))
            .map(|e| e.user.username);
        t.say(format!(
            "{} m0's VolumeAttachment {old_va} was deleted by {} (Kubernetes acting on the out-of-service taint), before Palisade reached it",
            since(Instant::now()),
            by.as_deref().unwrap_or("someone the audit log does not name yet")
        ));
    }
    let m0 = &lab.machines()[0];
    let blocked = c.rt.block_on(admin.node("m0"))?;
    t.say(format!(
        "{} m0 is powered {} with {} processes left; the storage server says m0: {}",
        since(Instant::now()),
        if m0.is_powered() { "ON" } else { "off" },
        m0.processes().len(),
        blocked
    ));

    let vas: Api<VolumeAttachment> = Api::all(c.client.clone());
    let (va, va_node) = eventually(
        "volume db attached to another machine",
        Duration::from_secs(180),
        || {
            let list = c.rt.block_on(vas.list(&Default::default())).ok()?;
            list.items.into_iter().find_map(|va| {
                let attached = va.status.as_ref().is_some_and(|s| s.attached);
                (attached
                    && va.spec.node_name != "m0"
                    && va.spec.source.persistent_volume_name.as_deref() == Some("pv-db"))
                .then(|| (va.name_any(), va.spec.node_name.clone()))
            })
        },
    )?;
    report.attached = Some(cut.elapsed());
    t.say(format!(
        "{} volume db attached to {va_node} by the attach-detach controller (VolumeAttachment {va})",
        since(Instant::now())
    ));
    let new = eventually(
        "db-0 replaced and Running elsewhere",
        Duration::from_secs(180),
        || {
            let p = c.rt.block_on(pods.get_opt("db-0")).ok().flatten()?;
            let node = p.spec.as_ref()?.node_name.clone()?;
            (p.uid().as_deref() != Some(old_uid.as_str())
                && node != "m0"
                && pod_phase(&p) == "Running")
                .then_some(p)
        },
    )?;
    report.running = Some(cut.elapsed());
    let new_uid = new.uid().context("pod uid")?;
    let node = new
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    t.say(format!(
        "{} replacement db-0 (uid {}) Running on {node}",
        since(Instant::now()),
        short(&new_uid)
    ));
    let new_acks = acks.join(format!("acks-{new_uid}.log"));
    eventually(
        "the replacement acknowledged writes",
        Duration::from_secs(60),
        || (read_or_empty(&new_acks).lines().count() >= 20).then_some(()),
    )?;
    report.writing = Some(cut.elapsed());
    t.say(format!(
        "{} replacement is writing ({} writes acknowledged)",
        since(Instant::now()),
        read_or_empty(&new_acks).lines().count()
    ));

    if opts.recover {
        recover(lab, c, t, &new_acks, cut)?;
    }

    // The verdict.
    t.print("");
    let checker = palisade_lab::bin_path("palisade-checker")?;
    let out = std::process::Command::new(checker)
        .arg("--volume-file")
        .arg(storage.volume_file("db"))
        .arg("--ack-log")
        .arg(&old_acks)
        .arg("--ack-log")
        .arg(&new_acks)
        .output()?;
    t.print(String::from_utf8_lossy(&out.stdout).trim_end());
    report.verdict_pass = out.status.success();
    let st = released.status.unwrap_or_default();
    t.print(format!(
        "\nNodeFence {} transitions:",
        released.metadata.name.unwrap_or_default()
    ));
    for tr in &st.transitions {
        t.print(format!("  {:<10} {}", format!("{:?}", tr.phase), tr.at.0));
    }
    let bridge = &palisade.bridge;
    t.print(format!(
        "\nfirmware-bridge audit log ({}):",
        bridge.audit_log.display()
    ));
    for r in bridge.audit() {
        let ev = &r["evidence"];
        let levels: Vec<String> = ev["attempts"]
            .as_array()
            .or_else(|| ev["devices"].as_array())
            .map(|a| {
                a.iter()
                    .map(|x| {
                        let name = x["level_name"].as_str().or_else(|| x["device"].as_str());
                        format!(
                            "{}:{}",
                            name.unwrap_or("?").split('?').next().unwrap_or("?"),
                            x["result"].as_str().unwrap_or("?")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        t.print(format!(
            "  {} {} {} {} token {} -> {} {}ms {}",
            r["time"].as_str().unwrap_or("?"),
            r["client"].as_str().unwrap_or("?"),
            r["action"].as_str().unwrap_or("?"),
            r["target"].as_str().unwrap_or("?"),
            r["token"],
            r["result"].as_str().unwrap_or("?"),
            r["duration_ms"],
            levels.join(" "),
        ));
    }

    if !report.verdict_pass {
        bail!("the at-most-one checker found a violation");
    }
    t.say("at-most-one holds: no write from the old pod after the replacement's first write");
    Ok(report)
}

/// Sends `chassis power off` to `m`'s BMC. Returns how long the command took (sent →
/// returned) and the instant it returned, on the monotonic and the wall clock.
fn power_off(m: &palisade_lab::Machine) -> Result<(Duration, (Instant, Timestamp))> {
    let sent = Instant::now();
    let out = m
        .bmc()
        .ipmitool()
        .args(["chassis", "power", "off"])
        .output()
        .context("running ipmitool")?;
    let returned = (Instant::now(), Timestamp::now());
    if !out.status.success() {
        bail!(
            "ipmitool chassis power off on {}: {}",
            m.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((returned.0.duration_since(sent), returned))
}

/// `at` as an offset from `origin` (zero if earlier).
fn after(origin: Timestamp, at: Timestamp) -> Duration {
    Duration::from_secs_f64(at.duration_since(origin).as_secs_f64().max(0.0))
}

/// When the controller's log (at `log`) first says, at or after `since`, that its power watch
/// read `node` off: the log line's own timestamp (the controller runs on this host's clock).
fn first_off_read(log: &Path, node: &str, since: Timestamp) -> Option<Timestamp> {
    let field = format!("node={node}");
    read_or_empty(log).lines().find_map(|line| {
        let plain = palisade_test_support::strip_ansi(line);
        if !plain.contains("power watch: the machine reads off")
            || !plain.split_whitespace().any(|w| w == field)
        {
            return None;
        }
        let at: Timestamp = plain.split_whitespace().next()?.parse().ok()?;
        (at >= since).then_some(at)
    })
}

/// Heals m0 and waits until its fence is lifted: the storage block and the taint go only after
/// positive proof that the released writer's container is gone from m0 (a new boot ID, or the
/// node agent's runtime inventory), and the replacement keeps writing meanwhile.
fn recover(lab: &Lab, c: &Cluster, t: &Timeline, new_acks: &Path, cut: Instant) -> Result<()> {
    t.say("healing m0 (its old writer may still run: the fence stays until that is disproved)");
    lab.heal(0)?;
    let done = eventually("m0's NodeFence Done", Duration::from_secs(240), || {
        fences_for(&c.client, &c.rt, "m0")
            .into_iter()
            .find(|f| f.status.as_ref().is_some_and(|s| s.phase == Phase::Done))
    })?;
    let st = done.status.unwrap_or_default();
    let proof = st
        .recovery
        .clean_proof
        .clone()
        .context("recovery recorded no positive proof")?;
    t.say(format!(
        "+{:.2}s fence lifted after proof: {proof}",
        cut.elapsed().as_secs_f64()
    ));
    let before = read_or_empty(new_acks).lines().count();
    eventually(
        "the replacement keeps writing after the fence is lifted",
        Duration::from_secs(60),
        || (read_or_empty(new_acks).lines().count() >= before + 20).then_some(()),
    )?;
    Ok(())
}

/// The management network and the controller: a running bridge and controller (a process
/// beside the lab, or `None` when it runs in the cluster).
struct Palisade {
    bridge: FirmwareBridge,
    controller: Option<Proc>,
}

/// The hub port machines reach the firmware-bridge at (an in-cluster controller).
const BRIDGE_HUB_PORT: u16 = 7443;
/// Where the in-cluster controller finds its bridge client identity.
const BRIDGE_CLIENT_DIR: &str = "/etc/palisade/bridge";

/// The Deployment patch that mounts the bridge client identity (Secret
/// `palisade-bridge-client`) and points the controller at it.
fn bridge_client_patch() -> String {
    format!(
        "apiVersion: apps/v1\n\
         kind: Deployment\n\
         metadata:\n  name: palisade-controller\n  namespace: {SYSTEM_NS}\n\
         spec:\n  template:\n    spec:\n\
         \x20     volumes:\n        - name: bridge-client\n          secret:\n            secretName: palisade-bridge-client\n\
         \x20     containers:\n        - name: controller\n\
         \x20         volumeMounts:\n            - name: bridge-client\n              mountPath: {BRIDGE_CLIENT_DIR}\n              readOnly: true\n\
         \x20         env:\n\
         \x20           - name: PALISADE_BRIDGE_CA\n              value: {BRIDGE_CLIENT_DIR}/ca.crt\n\
         \x20           - name: PALISADE_BRIDGE_CERT\n              value: {BRIDGE_CLIENT_DIR}/tls.crt\n\
         \x20           - name: PALISADE_BRIDGE_KEY\n              value: {BRIDGE_CLIENT_DIR}/tls.key\n"
    )
}

/// Installs the controller in the cluster (replicas kept off m0, which will fail), with the
/// bridge reachable at the hub and its client identity in a Secret.
fn install_in_cluster(
    lab: &Lab,
    c: &Cluster,
    t: &Timeline,
    bridge: &FirmwareBridge,
) -> Result<String> {
    let at = lab.expose_on_hub(BRIDGE_HUB_PORT, bridge.addr.parse()?)?;
    let read =
        |p: &std::path::Path| std::fs::read_to_string(p).with_context(|| p.display().to_string());
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "palisade-bridge-client", "namespace": SYSTEM_NS},
        "stringData": {
            "ca.crt": read(&bridge.ca_file)?,
            "tls.crt": read(&bridge.client_cert)?,
            "tls.key": read(&bridge.client_key)?,
        }
    }))?;
    c.rt.block_on(
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.client.clone(), SYSTEM_NS)
            .create(&PostParams::default(), &secret),
    )?;
    let installed = crate::in_cluster::install(
        lab,
        c,
        &crate::in_cluster::Install {
            patches: vec![bridge_client_patch()],
            avoid: &["m0"],
        },
    )?;
    t.say(format!(
        "palisade-controller installed in the cluster: kubectl apply -k (controller/manifests, image {}); replicas {} on m1 and m2, pulled from the lab registry; leader {}",
        installed.image,
        installed.pods.join(", "),
        installed.leader
    ));
    Ok(at.to_string())
}

fn start_palisade(
    lab: &Lab,
    c: &Cluster,
    t: &Timeline,
    storage: &Storage,
    opts: Options,
) -> Result<Palisade> {
    // The firmware-bridge holds every BMC, PDU and storage credential; the cluster holds
    // none, only the controller's client certificate.
    let bridge = FirmwareBridge::start(
        lab,
        BridgeOptions {
            wrong_bmc_password: &[],
            storage: Some(storage),
            ..Default::default()
        },
    )?;
    t.say(format!(
        "firmware-bridge up on https://{} (mTLS; inventory: IPMI level, then PDU level, plus the storage firewall, per machine)",
        bridge.addr
    ));
    let (controller, bridge_addr) = if opts.in_cluster {
        (None, install_in_cluster(lab, c, t, &bridge)?)
    } else if opts.power_off {
        let (p, _metrics) = start_controller_with_args(
            lab,
            "palisade-0",
            &bridge.controller_env(),
            &["--power-watch-interval", POWER_WATCH_INTERVAL],
        )?;
        (Some(p), bridge.addr.clone())
    } else {
        let (p, _metrics) = start_controller_with(lab, "palisade-0", &bridge.controller_env())?;
        (Some(p), bridge.addr.clone())
    };
    let mut detection = json!({"suspectAfterSeconds": 2, "unhealthyAfterSeconds": 4});
    if opts.power_off {
        detection["powerOffAfterSeconds"] = json!(POWER_OFF_AFTER_SECONDS);
    }
    policy(
        &c.client,
        &c.rt,
        "lab",
        json!({
            "detection": detection,
            "forgiveness": {"respectTolerations": false, "defaultSeconds": 0},
            "fenceWhen": "Always",
        }),
    )?;
    for (i, m) in lab.machines().iter().enumerate() {
        let url = crate::bridge::url(&bridge_addr, m.name());
        let mut devices =
            vec![json!({"url": url, "kind": "Storage", "fences": crate::lab_storage_scope()})];
        if !opts.storage_only {
            devices.insert(0, json!({"url": url, "kind": "Power"}));
        }
        let mut levels = vec![("bridge", devices)];
        if opts.power_off {
            // A namespace machine's Node reports no SMBIOS UUID: the pin comes from the
            // inventory (a QEMU machine's Node reports the same UUID).
            let secret_name = format!("bmc-{}", m.name());
            secret(
                &c.client,
                &c.rt,
                &secret_name,
                &[("password", &m.bmc().password()?)],
            )?;
            let pinned = format!("{}&guid={}", ipmi_url(lab, i), m.system_uuid());
            levels.push(("bmc", vec![device(&pinned, "Power", &secret_name)]));
        }
        fence_target(&c.client, &c.rt, m.name(), levels)?;
    }
    t.say(if opts.power_off {
        format!("palisade-controller running (power watch every {POWER_WATCH_INTERVAL}); FencingPolicy 'lab' (unhealthy after 4 s, or on power evidence after {POWER_OFF_AFTER_SECONDS} s off); FenceTargets: bridge://…/<machine> for power and storage, then each machine's BMC directly, pinned to its identity (read by the power watch; its password in a Secret)")
    } else {
        "palisade-controller running; FencingPolicy 'lab' (unhealthy after 4 s); FenceTargets: bridge://…/<machine> for power and storage (no credential in the cluster)".to_string()
    });
    Ok(Palisade { bridge, controller })
}

/// Without Palisade: watches for `watch` after the cut and describes what Kubernetes did. A
/// replacement that runs while the old pod's machine is merely partitioned is an error (it
/// would be unsafe; Kubernetes does not do it).
fn watch_stuck(
    c: &Cluster,
    t: &Timeline,
    pods: &Api<Pod>,
    old_uid: &str,
    cut: Instant,
    watch: Duration,
) -> Result<String> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let mut last = String::new();
    while cut.elapsed() < watch {
        std::thread::sleep(Duration::from_secs(1));
        let pod = c.rt.block_on(pods.get_opt("db-0"))?;
        let node = c.rt.block_on(nodes.get("m0"))?;
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status)
            .unwrap_or_default();
        let state = match &pod {
            Some(p) if p.uid().as_deref() == Some(old_uid) => format!(
                "db-0 is the old pod on m0: phase {}{}; node m0 Ready={ready}",
                pod_phase(p),
                if p.metadata.deletion_timestamp.is_some() {
                    ", Terminating"
                } else {
                    ""
                }
            ),
            Some(p) => {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                if node.as_deref().is_some_and(|n| n != "m0") && pod_phase(p) == "Running" {
                    bail!("a replacement ran on {node:?} while m0 was only partitioned");
                }
                format!("db-0 replaced but not running (phase {})", pod_phase(p))
            }
            None => "db-0 deleted, no replacement yet".to_string(),
        };
        if state != last {
            t.say(format!("+{:.2}s {state}", cut.elapsed().as_secs_f64()));
            last = state;
        }
    }
    Ok(last)
}
