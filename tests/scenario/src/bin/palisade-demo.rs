//! `palisade-demo`: the whole story on the lab, with a printed timeline.
//!
//! A StatefulSet's writer runs on machine m0 and appends to a volume on the lab storage
//! server. m0 is cut off the network. Palisade detects the silence, fences m0 through the
//! firmware-bridge (IPMI power off, or the PDU outlet if IPMI fails, and a storage block, all
//! verified), releases the pod, and the StatefulSet's replacement writes from another machine.
//! The at-most-one checker then reads the volume and the writers' acknowledgements and gives
//! its verdict, and the bridge's audit log shows who did what.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use palisade_lab::{Cut, Lab};
use palisade_labstore::admin_client::AdminClient;
use palisade_model::nodefence::Phase;
use palisade_scenario::*;
use serde_json::json;

struct Timeline(Instant);

impl Timeline {
    fn say(&self, what: impl AsRef<str>) {
        println!(
            "[{:>8.3}s] {}",
            self.0.elapsed().as_secs_f64(),
            what.as_ref()
        );
    }
}

fn main() -> Result<()> {
    let t = Timeline(Instant::now());
    t.say("starting the lab: Kubernetes 1.20.2 control plane, 3 machines running palisade-node, BMCs, a PDU");
    let lab = lab_with_agents(3, true, &AgentOptions::default()).context("starting the lab")?;
    let c = Cluster::connect(&lab)?;
    c.wait_nodes_ready(&lab)?;
    t.say(format!(
        "lab {} up; nodes m0, m1, m2 Ready (lab dir {})",
        lab.id(),
        lab.dir().display()
    ));
    let result = story(&lab, &c, &t);
    if let Err(e) = &result {
        println!("\nthe demo failed: {e:#}\nlogs: {}", lab.dir().display());
        println!("(set PALISADE_KEEP_LAB=1 to keep the lab directory)");
    }
    drop(c);
    drop(lab);
    t.say("lab torn down");
    result
}

fn story(lab: &Lab, c: &Cluster, t: &Timeline) -> Result<()> {
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

    // The management network: the firmware-bridge holds every BMC, PDU and storage credential;
    // the cluster holds none, only the controller's client certificate.
    let bridge = FirmwareBridge::start(
        lab,
        BridgeOptions {
            wrong_bmc_password: &[],
            storage: Some(&storage),
        },
    )?;
    t.say(format!(
        "firmware-bridge up on https://{} (mTLS; inventory: IPMI level, then PDU level, plus the storage firewall, per machine)",
        bridge.addr
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
    ))?;
    let (_controller, _metrics) =
        start_controller_with(lab, "palisade-0", &bridge.controller_env())?;
    policy(
        &c.client,
        &c.rt,
        "lab",
        json!({
            "detection": {"suspectAfterSeconds": 2, "unhealthyAfterSeconds": 4},
            "forgiveness": {"respectTolerations": false, "defaultSeconds": 0},
            "fenceWhen": "Always",
        }),
    )?;
    for m in lab.machines() {
        let url = bridge.url(m.name());
        fence_target(
            &c.client,
            &c.rt,
            m.name(),
            vec![(
                "bridge",
                vec![
                    json!({"url": url, "kind": "Power"}),
                    json!({"url": url, "kind": "Storage"}),
                ],
            )],
        )?;
    }
    t.say("palisade-controller running; FencingPolicy 'lab' (unhealthy after 4 s); FenceTargets: bridge://…/<machine> for power and storage (no credential in the cluster)");

    // The writer StatefulSet, placed on m0.
    let acks = lab.dir().join("acks");
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
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
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
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "app");
    let old = eventually("db-0 Running on m0", Duration::from_secs(120), || {
        let p = c.rt.block_on(pods.get_opt("db-0")).ok().flatten()?;
        (p.spec.as_ref()?.node_name.as_deref() == Some("m0") && pod_phase(&p) == "Running")
            .then_some(p)
    })?;
    let old_uid = old.uid().context("pod uid")?;
    let old_acks = acks.join(format!("acks-{old_uid}.log"));
    eventually(
        "the writer on m0 acknowledged",
        Duration::from_secs(60),
        || (read_or_empty(&old_acks).lines().count() >= 20).then_some(()),
    )?;
    cordon(&c.client, &c.rt, "m1", false)?;
    cordon(&c.client, &c.rt, "m2", false)?;
    t.say(format!("StatefulSet app/db: db-0 (uid {}) Running on m0 with PVC data-db-0 (RWO, CSI volume 'db' attached to m0), writing ({} writes acknowledged)", short(&old_uid), read_or_empty(&old_acks).lines().count()));

    // The partition.
    println!();
    t.say("cutting m0 off the network (its link goes down; its processes keep running)");
    lab.partition(0, Cut::All)?;
    let cut = Instant::now();
    let since = |i: Instant| format!("+{:.2}s", i.duration_since(cut).as_secs_f64());

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
                    "releasing: out-of-service taint, pods force-deleted by UID".into()
                }
                Phase::Released => format!(
                    "released: {} pod(s), {} VolumeAttachment(s), {} volumesInUse record(s)",
                    st.release.pods.len(),
                    st.release.attachments.len(),
                    st.release.attach_records.len()
                ),
                other => format!("{other:?}"),
            };
            t.say(format!("{} {line}", since(Instant::now())));
        }
        (st.phase == Phase::Released).then_some(nf)
    })?;
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
    t.say(format!(
        "{} replacement is writing ({} writes acknowledged)",
        since(Instant::now()),
        read_or_empty(&new_acks).lines().count()
    ));

    // The verdict.
    println!();
    let checker = palisade_lab::bin_path("palisade-checker")?;
    let out = std::process::Command::new(checker)
        .arg("--volume-file")
        .arg(storage.volume_file("db"))
        .arg("--ack-log")
        .arg(&old_acks)
        .arg("--ack-log")
        .arg(&new_acks)
        .output()?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    let st = released.status.unwrap_or_default();
    println!(
        "\nNodeFence {} transitions:",
        released.metadata.name.unwrap_or_default()
    );
    for tr in &st.transitions {
        println!("  {:<10} {}", format!("{:?}", tr.phase), tr.at.0);
    }
    println!(
        "\nfirmware-bridge audit log ({}):",
        bridge.audit_log.display()
    );
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
        println!(
            "  {} {} {} {} token {} -> {} {}ms {}",
            r["time"].as_str().unwrap_or("?"),
            r["client"].as_str().unwrap_or("?"),
            r["action"].as_str().unwrap_or("?"),
            r["target"].as_str().unwrap_or("?"),
            r["token"],
            r["result"].as_str().unwrap_or("?"),
            r["duration_ms"],
            levels.join(" "),
        );
    }
    if !out.status.success() {
        bail!("the at-most-one checker found a violation");
    }
    t.say("at-most-one holds: no write from the old pod after the replacement's first write");
    Ok(())
}

fn short(uid: &str) -> &str {
    &uid[..8.min(uid.len())]
}
