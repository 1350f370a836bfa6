//! The controller installed in the cluster like a product: its image pushed to the lab's
//! registry, `controller/manifests` applied with `kubectl apply -k` through an overlay that
//! names the image by digest (on 1.20 it also serves the PodDisruptionBudget as
//! `policy/v1beta1`), and the replicas run by `palisade-node` on lab machines (pulled
//! from the registry, with their ServiceAccount token mounted and `KUBERNETES_SERVICE_*` set).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use palisade_lab::{KubeVersion, Lab, LabConfig, MachineKind, RegistryConfig};

use crate::{cordon, eventually, pod_phase, AgentOptions, Cluster, SYSTEM_NS};

/// The controller image's repository in the lab registry.
pub const CONTROLLER_REPO: &str = "palisade/controller";
/// The label of the controller's pods.
pub const CONTROLLER_SELECTOR: &str = "app.kubernetes.io/name=palisade-controller";
/// The controller's election Lease (in [`SYSTEM_NS`]).
pub const ELECTION_LEASE: &str = "palisade-controller";

/// A lab whose machines run `palisade-node` able to pull from the lab's registry (TLS from the
/// lab CA, no credentials), with `agents`' other settings.
pub fn lab_config(
    kind: MachineKind,
    machines: usize,
    pdu: bool,
    agents: &AgentOptions,
) -> Result<LabConfig> {
    let mut agents = agents.clone();
    agents.extra_args.extend([
        "--registry-ca".to_string(),
        "\"$PALISADE_REGISTRY_CA\"".to_string(),
    ]);
    Ok(LabConfig {
        machines,
        control_plane: true,
        kube: agents.kube,
        pdu,
        machine_command: crate::node_agent_command(&agents)?,
        machine_kind: kind,
        registry: Some(RegistryConfig { basic_auth: None }),
        ..Default::default()
    })
}

/// Runs kubectl of the lab's Kubernetes release as the lab's admin.
pub fn kubectl(lab: &Lab, args: &[&str]) -> Result<std::process::Output> {
    let cp = lab
        .control_plane()
        .context("the lab has no control plane")?;
    let bin = cp.version().kubectl();
    Command::new(&bin)
        .arg("--kubeconfig")
        .arg(cp.admin_kubeconfig())
        .args(args)
        .output()
        .with_context(|| format!("run {} (hack/install-deps.sh caches it)", bin.display()))
}

/// Pushes `repo:tag` to the lab registry: `bin` (stripped) as the entrypoint and the
/// libraries it loads, nothing else ([`palisade_lab::Registry::push_binary`]). Returns the
/// manifest digest.
pub fn push_binary_image(lab: &Lab, repo: &str, tag: &str, bin: &Path) -> Result<String> {
    Ok(lab
        .registry()
        .context("the lab has no registry")?
        .push_binary(lab.dir(), repo, tag, bin)?)
}

/// How to install.
#[derive(Debug, Clone, Default)]
pub struct Install<'a> {
    /// Strategic-merge patches of the manifests (YAML documents), e.g. the bridge client
    /// identity mounted into the Deployment.
    pub patches: Vec<String>,
    /// Nodes kept free of the replicas (cordoned while they are placed).
    pub avoid: &'a [&'a str],
}

/// The running install.
#[derive(Debug, Clone)]
pub struct Installed {
    /// The image, `host:port/repo@sha256:…`.
    pub image: String,
    /// The replicas' pod names.
    pub pods: Vec<String>,
    /// The pod that holds the election Lease.
    pub leader: String,
}

/// Pushes the controller image, applies `controller/manifests` through an overlay naming it,
/// and waits until both replicas run and one leads.
pub fn install(lab: &Lab, c: &Cluster, o: &Install<'_>) -> Result<Installed> {
    let bin = palisade_lab::bin_path("palisade-controller")?;
    let digest = push_binary_image(lab, CONTROLLER_REPO, "dev", &bin)?;
    let registry = lab.registry().context("the lab has no registry")?.host();
    let dir = overlay(lab, Some((&registry, &digest)), &o.patches)?;
    for n in o.avoid {
        cordon(&c.client, &c.rt, n, true)?;
    }
    let applied = kubectl(lab, &["apply", "-k", &dir.display().to_string()])?;
    if !applied.status.success() {
        bail!(
            "kubectl apply -k {}: {}",
            dir.display(),
            String::from_utf8_lossy(&applied.stderr)
        );
    }
    let pods_api: Api<Pod> = Api::namespaced(c.client.clone(), SYSTEM_NS);
    let pods = eventually(
        "both controller replicas Running",
        Duration::from_secs(300),
        || {
            let l =
                c.rt.block_on(pods_api.list(&ListParams::default().labels(CONTROLLER_SELECTOR)))
                    .ok()?;
            let running: Vec<String> = l
                .items
                .iter()
                .filter(|p| pod_phase(p) == "Running")
                .map(|p| p.name_any())
                .collect();
            (running.len() == 2).then_some(running)
        },
    )?;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), SYSTEM_NS);
    let leader = eventually(
        "a replica holds the election Lease",
        Duration::from_secs(120),
        || {
            let holder =
                c.rt.block_on(leases.get_opt(ELECTION_LEASE))
                    .ok()??
                    .spec?
                    .holder_identity?;
            pods.contains(&holder).then_some(holder)
        },
    )?;
    for n in o.avoid {
        cordon(&c.client, &c.rt, n, false)?;
    }
    Ok(Installed {
        image: format!("{registry}/{CONTROLLER_REPO}@{digest}"),
        pods,
        leader,
    })
}

/// The current holder of the election Lease (`None` when released or unreadable).
pub fn leader(c: &Cluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), SYSTEM_NS);
    c.rt.block_on(leases.get_opt(ELECTION_LEASE))
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// Writes `<lab dir>/overlay/kustomization.yaml`: `controller/manifests` as the base, the image
/// by digest (`image`: the registry's `host:port` and the digest; `None` keeps the manifests'
/// name), `patches`, and what the lab's release needs: on 1.20 the PodDisruptionBudget turned
/// into `policy/v1beta1` (`policy/v1` is served from 1.21), as `controller/manifests/pdb.yaml`
/// tells a 1.20 user to. Returns the directory, for `kubectl apply -k`.
pub fn overlay(lab: &Lab, image: Option<(&str, &str)>, patches: &[String]) -> Result<PathBuf> {
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../controller/manifests")
        .canonicalize()
        .context("controller/manifests")?;
    let dir = lab.dir().join("overlay");
    std::fs::create_dir_all(&dir)?;
    // kustomize 2.0 (kubectl 1.20) takes a base directory by a path relative to the overlay.
    let depth = dir.canonicalize()?.components().count().saturating_sub(1);
    let base = format!(
        "{}{}",
        "../".repeat(depth),
        manifests.display().to_string().trim_start_matches('/')
    );
    let mut k = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n\
         kind: Kustomization\n\
         bases:\n  - {base}\n"
    );
    if let Some((registry, digest)) = image {
        k.push_str(&format!(
            "images:\n  - name: {CONTROLLER_REPO}\n    newName: {registry}/{CONTROLLER_REPO}\n    digest: {digest}\n"
        ));
    }
    if !patches.is_empty() {
        k.push_str("patchesStrategicMerge:\n");
        for (i, p) in patches.iter().enumerate() {
            let f = format!("patch-{i}.yaml");
            std::fs::write(dir.join(&f), p)?;
            k.push_str(&format!("  - {f}\n"));
        }
    }
    let cp = lab
        .control_plane()
        .context("the lab has no control plane")?;
    if cp.version() == KubeVersion::V1_20 {
        // A JSON patch of the apiVersion: kustomize 2.0 has neither components nor
        // `$patch: delete`, and the spec means the same in both versions (its selector is not
        // empty, the one place where they differ).
        std::fs::write(
            dir.join("pdb-v1beta1.yaml"),
            "- op: replace\n  path: /apiVersion\n  value: policy/v1beta1\n",
        )?;
        k.push_str(&format!(
            "patchesJson6902:\n\
             \x20 - target:\n\
             \x20     group: policy\n\
             \x20     version: v1\n\
             \x20     kind: PodDisruptionBudget\n\
             \x20     name: palisade-controller\n\
             \x20     namespace: {SYSTEM_NS}\n\
             \x20   path: pdb-v1beta1.yaml\n"
        ));
    }
    std::fs::write(dir.join("kustomization.yaml"), k)?;
    Ok(dir)
}
