//! Installs the Palisade CRDs at start (server-side apply of the types' generated CRDs, the
//! same documents as `controller/manifests/crds.yaml`) and waits until they are Established.
//!
//! `NodeFence.spec.nodeName` carries no `x-kubernetes-validations: self == oldSelf` rule: the
//! API servers Palisade supports (1.20) do not know the field, and their server-side apply
//! rejects the whole CRD ("field not declared in schema"; a plain create silently drops it),
//! so the rule would either break installation or protect nothing. The controller enforces the
//! pin itself instead: it records the node's name and Node UID at a fence's first step and
//! fails the fence (`SpecChanged` / `NodeReplaced`) before any action if either changes. On a
//! 1.25+ server the rule can be added to the manifests by hand as a second line of defence.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::error::Error;

/// Field manager used for every server-side apply.
pub const FIELD_MANAGER: &str = "palisade-controller";

/// Applies every CRD and waits (bounded by `timeout`) until each is Established.
pub async fn ensure(client: &Client, timeout: Duration) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let crds = palisade_model::crds();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(crd))
            .await
            .map_err(|e| Error::kube(format!("applying CRD {name}"), e))?;
        tracing::info!(crd = %name, "CRD applied");
    }
    let deadline = tokio::time::Instant::now() + timeout;
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let got = api
                .get(&name)
                .await
                .map_err(|e| Error::kube(format!("reading CRD {name}"), e))?;
            let established = got
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Config(format!(
                    "CRD {name} not Established after {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}
