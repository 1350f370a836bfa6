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
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use palisade_lab::{Cut, Lab};
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
    let mut cfg = palisade_scenario::in_cluster::lab_config(
        palisade_lab::MachineKind::Namespace,
        3,
        false,
        &Default::default(),
    )
    .expect("lab config");
    cfg.bmc_kill_wait = SLOW_OFF + Duration::from_secs(60);
    Lab::start(cfg).expect("lab starts")
}

#[test]
fn the_controller_installed_from_its_manifests_fences_from_inside_the_cluster() {
    let lab = lab();
    let rt = rt();
    let c = client(&lab, &rt);
    wait_nodes_ready(&lab, &c, &rt);
    namespace(&c, &rt, "app");
    let cluster = palisade_scenario::Cluster::connect(&lab).unwrap();
    // The replicas go to m1 and m2 (the preferred anti-affinity spreads them); m0 will fail.
    let installed = palisade_scenario::in_cluster::install(
        &lab,
        &cluster,
        &palisade_scenario::in_cluster::Install {
            avoid: &["m0"],
            ..Default::default()
        },
    )
    .expect("installed from controller/manifests");
    eprintln!("installed {}; leader {}", installed.image, installed.leader);
    let controllers: Api<Pod> = Api::namespaced(c.clone(), SYSTEM_NS);
    let mut nodes = Vec::new();
    for name in &installed.pods {
        let p = rt.block_on(controllers.get(name)).unwrap();
        nodes.push(p.spec.as_ref().unwrap().node_name.clone().unwrap());
        let image_id = p
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0]
            .image_id
            .clone();
        assert_eq!(image_id, installed.image, "{name} runs the pushed image");
    }
    nodes.sort();
    assert_eq!(nodes, ["m1", "m2"], "one replica per surviving machine");
    let names = installed.pods.clone();

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
    let old = db_on_m0(&c, &rt);
    let old_uid = old.uid().unwrap();

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
            let holder = palisade_scenario::in_cluster::leader(&cluster)?;
            (!names.contains(&holder)).then_some(holder)
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
    let nf = fence_in_phase(&c, &rt, "m0", Phase::Released, Duration::from_secs(240));
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
    assert_each_phase_once(&st);
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
    db_replaced_elsewhere(&c, &rt, &old_uid, Duration::from_secs(120));
    assert!(fences_for(&c, &rt, "m1").is_empty() && fences_for(&c, &rt, "m2").is_empty());
}
