//! Installed like a product: the controller runs *in* the cluster, from its own manifests and
//! an image pulled from the lab's registry, and fences.
//!
//! The controller's image (the binary and the libraries it loads, nothing else) is pushed to
//! the lab's `docker-registry`; an overlay names it by digest, and `kubectl apply -k` installs
//! `controller/manifests` (namespace, CRDs, least-privilege RBAC, the 2-replica Deployment).
//! `palisade-node` pulls the image on two machines and runs the replicas with their
//! ServiceAccount token mounted and `KUBERNETES_SERVICE_*` set, so they use the in-cluster
//! configuration. One leads (the election Lease names its pod); when the third machine goes
//! silent, the leader fences it through its BMC (reached over the lab's management network).
//!
//! The chassis is slow to power off (150 s, within the device's `timeoutSeconds`), and while
//! the leader waits for it the Deployment is rolled (`kubectl rollout restart`): a replica of
//! the new ReplicaSet takes the lead mid-fence, resumes the NodeFence under a higher fencing
//! token and completes it once — one NodeFence, phases in order, nothing failed — and the
//! StatefulSet pod runs elsewhere.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use palisade_lab::{Cut, ImageFile, Lab, LabConfig, RegistryConfig};
use palisade_model::nodefence::{EvidenceKind, Phase};
use serde_json::json;

/// The first hub port the machines reach the BMCs at (machine `i` at `BMC_HUB_PORT + i`).
const BMC_HUB_PORT: u16 = 16_230;
/// How long m0's chassis takes to power off: far longer than a rolling update of the
/// controller, so the update lands mid-fence. The update may take a minute: the first new
/// replica can be scheduled onto m0 itself (still Ready when the update starts), and waits
/// there until m0 is NotReady and the replica's 10 s toleration has passed.
const SLOW_OFF: Duration = Duration::from_secs(150);

fn lab() -> Lab {
    let agents = palisade_scenario::AgentOptions {
        extra_args: vec!["--registry-ca".into(), "\"$PALISADE_REGISTRY_CA\"".into()],
        ..Default::default()
    };
    Lab::start(LabConfig {
        machines: 3,
        pdu: false,
        machine_command: palisade_scenario::node_agent_command(&agents).expect("agent command"),
        registry: Some(RegistryConfig { basic_auth: None }),
        bmc_kill_wait: SLOW_OFF + Duration::from_secs(60),
        ..Default::default()
    })
    .expect("lab starts")
}

/// The shared libraries `bin` loads, as `ldd` lists them (absolute paths).
fn libraries(bin: &std::path::Path) -> Vec<std::path::PathBuf> {
    let out = std::process::Command::new("ldd")
        .arg(bin)
        .output()
        .expect("run ldd");
    assert!(out.status.success(), "ldd {}", bin.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(std::path::PathBuf::from)
        .collect()
}

/// Pushes `palisade/controller`: the controller binary, stripped, and its libraries; returns
/// the manifest digest.
fn push_controller_image(lab: &Lab) -> String {
    let bin = palisade_lab::bin_path("palisade-controller")
        .expect("build the controller first: cargo build -p palisade-controller --bins");
    let stripped = lab.dir().join("palisade-controller");
    let ok = std::process::Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&bin)
        .status()
        .expect("run strip");
    assert!(ok.success(), "strip the controller");
    let mut files = vec![ImageFile {
        path: "palisade-controller".into(),
        source: stripped,
        mode: 0o755,
    }];
    for lib in libraries(&bin) {
        files.push(ImageFile {
            path: lib.strip_prefix("/").unwrap().display().to_string(),
            source: lib,
            mode: 0o755,
        });
    }
    lab.registry()
        .expect("registry")
        .push(
            "palisade/controller",
            "dev",
            &files,
            &["/palisade-controller"],
        )
        .expect("push the controller image")
}

/// An overlay of `controller/manifests` that names the pushed image by digest.
fn overlay(lab: &Lab, registry: &str, digest: &str) -> std::path::PathBuf {
    let manifests = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../controller/manifests")
        .canonicalize()
        .expect("controller/manifests");
    let dir = lab.dir().join("overlay");
    std::fs::create_dir_all(&dir).unwrap();
    // kustomize 2.0 (kubectl 1.20) takes a base directory by a path relative to the overlay.
    let up = dir
        .canonicalize()
        .unwrap()
        .components()
        .count()
        .saturating_sub(1);
    let base = format!("{}{}", "../".repeat(up), manifests.display()).replace("//", "/");
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\n\
             kind: Kustomization\n\
             bases:\n  - {base}\n\
             images:\n  - name: palisade/controller\n    newName: {registry}/palisade/controller\n    digest: {digest}\n"
        ),
    )
    .unwrap();
    dir
}

#[test]
fn the_controller_installed_from_its_manifests_fences_from_inside_the_cluster() {
    let lab = lab();
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, "app");
    let registry = lab.registry().expect("registry").host();
    let digest = push_controller_image(&lab);
    eprintln!("pushed {registry}/palisade/controller@{digest}");

    // The replicas go to m1 and m2 (the preferred anti-affinity spreads them); m0 will fail.
    cordon(&c, &rt, "m0", true);
    let dir = overlay(&lab, &registry, &digest);
    let applied = kubectl_output(&lab, &["apply", "-k", &dir.display().to_string()]);
    assert!(
        applied.ok,
        "kubectl apply -k: {}{}",
        applied.stdout, applied.stderr
    );
    let controllers: Api<Pod> = Api::namespaced(c.clone(), SYSTEM_NS);
    let running = eventually(
        "both controller replicas Running",
        Duration::from_secs(240),
        || {
            let pods = rt
                .block_on(controllers.list(
                    &ListParams::default().labels("app.kubernetes.io/name=palisade-controller"),
                ))
                .ok()?;
            let running: Vec<Pod> = pods
                .items
                .into_iter()
                .filter(|p| pod_phase(p) == "Running")
                .collect();
            (running.len() == 2).then_some(running)
        },
    );
    let mut nodes: Vec<String> = running
        .iter()
        .map(|p| p.spec.as_ref().unwrap().node_name.clone().unwrap())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["m1", "m2"], "one replica per surviving machine");
    for p in &running {
        let image_id = p
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0]
            .image_id
            .clone();
        assert!(
            image_id.ends_with(&digest),
            "{} runs the pushed image: {image_id}",
            p.name_any()
        );
    }
    // One leads, under its pod's name: it reached the API with its mounted token.
    let leases: Api<Lease> = Api::namespaced(c.clone(), SYSTEM_NS);
    let names: Vec<String> = running.iter().map(|p| p.name_any()).collect();
    let leader = eventually(
        "a replica holds the election Lease",
        Duration::from_secs(120),
        || {
            let l = rt.block_on(leases.get_opt("palisade-controller")).ok()??;
            let holder = l.spec?.holder_identity?;
            names.contains(&holder).then_some(holder)
        },
    );
    eprintln!("leader: {leader}");
    cordon(&c, &rt, "m0", false);

    // Devices: every BMC reachable from the machines over the management network.
    policy(&c, &rt);
    for (i, m) in lab.machines().iter().enumerate() {
        let b = m.bmc();
        let at = lab
            .expose_udp_on_hub(
                BMC_HUB_PORT + i as u16,
                std::net::SocketAddr::new(b.host.into(), b.port),
            )
            .expect("BMC on the hub");
        let name = format!("bmc-{}", m.name());
        secret(&c, &rt, &name, &[("password", &b.password().unwrap())]);
        let url = format!("ipmi://{}@{at}?cipher=3", b.user);
        let mut dev = device(&url, &name);
        // The operator allows for the slow chassis.
        dev["timeoutSeconds"] = json!(SLOW_OFF.as_secs() * 2);
        fence_target(&c, &rt, m.name(), vec![("ipmi", vec![dev])]);
    }

    // The StatefulSet's pod on m0.
    cordon(&c, &rt, "m1", true);
    cordon(&c, &rt, "m2", true);
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "app"},
        "spec": {
            "replicas": 1, "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "app", "image": "host",
                                    "command": ["/bin/sh", "-c", "exec sleep 100000"]}]
                }
            }
        }
    }))
    .unwrap();
    rt.block_on(
        Api::<StatefulSet>::namespaced(c.clone(), "app").create(&PostParams::default(), &sts),
    )
    .expect("create StatefulSet");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "app");
    let old = eventually("db-0 Running on m0", Duration::from_secs(90), || {
        let p = rt.block_on(pods.get_opt("db-0")).ok().flatten()?;
        let on_m0 = p.spec.as_ref()?.node_name.as_deref() == Some("m0");
        (on_m0 && pod_phase(&p) == "Running").then_some(p)
    });
    let old_uid = old.uid().unwrap();
    cordon(&c, &rt, "m1", false);
    cordon(&c, &rt, "m2", false);

    lab.machines()[0].set_power_off_delay(SLOW_OFF).unwrap();
    lab.partition(0, Cut::All).unwrap();
    eventually(
        "the leader's power off reached m0's BMC",
        Duration::from_secs(120),
        || lab.machines()[0].power_off_requested().then_some(()),
    );
    let requested = std::time::Instant::now();
    let first = fences_for(&c, &rt, "m0");
    assert_eq!(first.len(), 1, "one NodeFence for m0");
    let old_token = first[0]
        .status
        .as_ref()
        .and_then(|s| s.fencing_token)
        .expect("the fencing leader recorded its token");
    let rolled = kubectl_output(
        &lab,
        &[
            "rollout",
            "restart",
            "deployment/palisade-controller",
            "-n",
            SYSTEM_NS,
        ],
    );
    assert!(rolled.ok, "kubectl rollout restart: {}", rolled.stderr);
    let successor = eventually(
        "a replica of the new ReplicaSet leads",
        Duration::from_secs(180),
        || {
            let l = rt.block_on(leases.get_opt("palisade-controller")).ok()??;
            let holder = l.spec?.holder_identity?;
            (!holder.is_empty() && !names.contains(&holder)).then_some(holder)
        },
    );
    // The precondition of this test: the update replaced the leader while m0 was still
    // powering off (the slow chassis leaves far more time than the update takes).
    let mid = fences_for(&c, &rt, "m0");
    let powered = lab.machines()[0].is_powered();
    let phases: Vec<_> = mid
        .iter()
        .map(|f| f.status.as_ref().map(|s| s.phase))
        .collect();
    assert!(
        powered && phases == [Some(Phase::Fencing)],
        "{successor} took the lead mid-fence, {:?} after the power off reached m0's BMC \
         (m0 powered: {powered}; m0's NodeFences: {phases:?})",
        requested.elapsed()
    );
    eprintln!("{successor} leads mid-fence (the fence began under token {old_token})");
    let nf = eventually("m0's NodeFence Released", Duration::from_secs(240), || {
        fences_for(&c, &rt, "m0").into_iter().find(|f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Released)
        })
    });
    let st = nf.status.clone().unwrap();
    assert!(!lab.machines()[0].is_powered(), "m0 is powered off");
    // Completed once, by the successor: one NodeFence, every phase once and in order.
    assert_eq!(
        fences_for(&c, &rt, "m0").len(),
        1,
        "still one NodeFence for m0"
    );
    assert!(
        st.fencing_token.is_some_and(|t| t > old_token),
        "the successor's term ({:?}) finished what {old_token} began",
        st.fencing_token
    );
    let phases: Vec<Phase> = st.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(
        phases,
        vec![
            Phase::Pending,
            Phase::Fencing,
            Phase::Fenced,
            Phase::Releasing,
            Phase::Released
        ]
    );
    assert!(
        st.evidence
            .iter()
            .any(|e| e.kind == EvidenceKind::PowerOff
                && e.device.contains(&format!(":{BMC_HUB_PORT}"))),
        "power-off evidence from m0's BMC, reached over the hub: {:?}",
        st.evidence
    );
    assert!(
        st.release.pods.iter().any(|p| p.uid == old_uid),
        "{:?}",
        st.release.pods
    );
    eventually(
        "db-0 recreated and Running elsewhere",
        Duration::from_secs(120),
        || {
            let p = rt.block_on(pods.get_opt("db-0")).ok().flatten()?;
            let node = p.spec.as_ref()?.node_name.clone()?;
            (p.uid().as_deref() != Some(old_uid.as_str())
                && node != "m0"
                && pod_phase(&p) == "Running")
                .then_some(())
        },
    );
    assert!(fences_for(&c, &rt, "m1").is_empty() && fences_for(&c, &rt, "m2").is_empty());
}
