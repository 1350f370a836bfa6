//! What runs on the node, as the CRI lists it: every pod sandbox and container, by pod UID.

use std::collections::{BTreeMap, BTreeSet};

use super::wire::{self, Container, PodSandbox};
use super::{CriClient, CriError};

/// The label the kubelet puts on every sandbox and container it creates: the pod's UID.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// One pod's sandboxes and containers in the runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInRuntime {
    /// `namespace/name`, as the sandbox names it (empty when only containers were seen).
    pub name: String,
    /// Sandbox IDs, with whether each is live (`SANDBOX_READY`).
    pub sandboxes: Vec<(String, bool)>,
    /// Container IDs, with whether each is live (any state but `CONTAINER_EXITED`).
    pub containers: Vec<(String, bool)>,
}

impl PodInRuntime {
    /// Whether anything of the pod may still run.
    pub fn live(&self) -> bool {
        self.sandboxes
            .iter()
            .chain(&self.containers)
            .any(|(_, l)| *l)
    }
}

/// Every pod the runtime knows, by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The pods.
    pub pods: BTreeMap<String, PodInRuntime>,
}

impl Inventory {
    /// The UIDs of the pods with a live sandbox or container.
    pub fn live_pods(&self) -> BTreeSet<String> {
        self.pods
            .iter()
            .filter(|(_, p)| p.live())
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// Builds the inventory from one listing of sandboxes and one of containers.
    ///
    /// Guarantees: a container counts as live unless the runtime says it exited (a state this
    /// code does not know is live); a sandbox counts as live unless it is `SANDBOX_NOTREADY`.
    /// A live sandbox or container that names no pod UID makes the whole inventory an error:
    /// an inventory that leaves out something live would be read as proof that it is gone.
    ///
    /// Assumptions: the kubelet labels its containers with [`POD_UID_LABEL`], so a container
    /// whose sandbox was listed before it was created is still attributed.
    pub fn from_lists(sandboxes: &[PodSandbox], containers: &[Container]) -> Result<Self, String> {
        let mut pods: BTreeMap<String, PodInRuntime> = BTreeMap::new();
        let mut owner = BTreeMap::new();
        for s in sandboxes {
            let live = s.state != wire::SANDBOX_NOTREADY;
            let meta = s.metadata.clone().unwrap_or_default();
            let uid = Some(meta.uid.clone())
                .filter(|u| !u.is_empty())
                .or_else(|| s.labels.get(POD_UID_LABEL).cloned());
            let Some(uid) = uid else {
                if live {
                    return Err(format!("live pod sandbox {} names no pod UID", s.id));
                }
                continue;
            };
            owner.insert(s.id.clone(), uid.clone());
            let pod = pods.entry(uid).or_default();
            pod.name = format!("{}/{}", meta.namespace, meta.name);
            pod.sandboxes.push((s.id.clone(), live));
        }
        for c in containers {
            let live = c.state != wire::CONTAINER_EXITED;
            let uid = owner
                .get(&c.pod_sandbox_id)
                .cloned()
                .or_else(|| c.labels.get(POD_UID_LABEL).cloned())
                .filter(|u| !u.is_empty());
            let Some(uid) = uid else {
                if live {
                    return Err(format!(
                        "live container {} (sandbox {}) names no pod UID",
                        c.id, c.pod_sandbox_id
                    ));
                }
                continue;
            };
            pods.entry(uid)
                .or_default()
                .containers
                .push((c.id.clone(), live));
        }
        Ok(Inventory { pods })
    }
}

/// Lists every sandbox and container of the runtime behind `cri`.
///
/// Guarantees: `Ok` only for two complete listings (a runtime that says it paginated is an
/// error) that [`Inventory::from_lists`] accepts.
pub async fn inventory(cri: &CriClient) -> Result<Inventory, CriError> {
    let sandboxes: wire::ListPodSandboxResponse = cri
        .call("ListPodSandbox", &wire::ListPodSandboxRequest {})
        .await?;
    let containers: wire::ListContainersResponse = cri
        .call("ListContainers", &wire::ListContainersRequest {})
        .await?;
    for (method, token) in [
        ("ListPodSandbox", &sandboxes.next_page_token),
        ("ListContainers", &containers.next_page_token),
    ] {
        if !token.is_empty() {
            return Err(CriError::Garbage {
                method,
                detail: "the runtime returned one page of a list Palisade asked for whole".into(),
            });
        }
    }
    Inventory::from_lists(&sandboxes.items, &containers.containers).map_err(|detail| {
        CriError::Garbage {
            method: "ListContainers",
            detail,
        }
    })
}
