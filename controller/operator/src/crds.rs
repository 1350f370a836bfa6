//! Installs the Palisade CRDs at start (server-side apply of the types' generated CRDs, the
//! same documents as `controller/manifests/crds.yaml`, or `crds-cel.yaml` on 1.25+) and waits
//! until they are Established.
//!
//! The API server's version decides whether the CEL rules (`x-kubernetes-validations`,
//! `palisade_model::cel`) go in: a 1.20–1.24 server does not know the field and its
//! server-side apply rejects the whole CRD ("field not declared in schema"), so they are
//! applied only from 1.25 on (`palisade_model::crds_for`), or as `--crd-cel` says. An
//! unreadable version counts as old: the CRDs without CEL are accepted everywhere, and the
//! controller and the webhook run the same rules anyway. A server that refuses the rules gets
//! the CRDs without them, and its words are logged ([`ensure`]). On every version the controller also pins what CEL's
//! `self == oldSelf` on a NodeFence's spec would: it records the node's name and Node UID at a
//! fence's first step and fails the fence (`SpecChanged` / `NodeReplaced`) before any action
//! if either changes.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::error::Error;

/// Field manager used for every server-side apply.
pub const FIELD_MANAGER: &str = "palisade-controller";

/// Whether the CRDs carry the CEL rules (`--crd-cel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CelMode {
    /// From Kubernetes 1.25 on, by the API server's reported version (an unreadable version
    /// counts as old).
    Auto,
    /// Whatever the reported version says (a server whose version string is vendor-specific).
    Always,
    /// Never: the controller and the webhook still run the same rules.
    Never,
}

/// Applies every CRD and waits (bounded by `timeout`) until each is Established.
///
/// *Guarantees:* a server that refuses the CRDs with their CEL rules (an older server, a
/// rule over its cost budget) does not stop the controller: the refusal is logged with the
/// server's own words, and the CRDs are applied again without the rules, which loses no
/// check (the controller and the webhook run the same rules, `validate()`). A refusal of the
/// CRDs without CEL is an error, with the server's words.
pub async fn ensure(client: &Client, timeout: Duration, mode: CelMode) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let minor = match client.apiserver_version().await {
        Ok(v) => palisade_model::parse_minor(&v.minor).unwrap_or(0),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the API server's version; applying the CRDs without CEL rules unless --crd-cel=always");
            0
        }
    };
    let cel = match mode {
        CelMode::Auto => minor >= palisade_model::CEL_MINOR,
        CelMode::Always => true,
        CelMode::Never => false,
    };
    let crds = if cel {
        let with_cel = palisade_model::crds_for(palisade_model::CEL_MINOR);
        match apply(&api, &with_cel, minor, true).await {
            Ok(()) => with_cel,
            Err(e) => {
                tracing::error!(
                    error = %e,
                    "the API server refused the CRDs with their CEL rules; applying them without (the controller and the webhook still refuse what the rules would)"
                );
                let plain = palisade_model::crds();
                apply(&api, &plain, minor, false).await?;
                plain
            }
        }
    } else {
        let plain = palisade_model::crds();
        apply(&api, &plain, minor, false).await?;
        plain
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pauses = {
        use backon::BackoffBuilder as _;
        backon::ExponentialBuilder::new()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(2))
            .without_max_times()
            .build()
    };
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
            let pause = pauses.next().unwrap_or(Duration::from_secs(2));
            tokio::time::sleep(
                pause.min(deadline.saturating_duration_since(tokio::time::Instant::now())),
            )
            .await;
        }
    }
    Ok(())
}

/// Server-side applies `crds`.
async fn apply(
    api: &Api<CustomResourceDefinition>,
    crds: &[CustomResourceDefinition],
    minor: u32,
    cel: bool,
) -> Result<(), Error> {
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    tracing::info!(minor, cel, "applying the CRDs for Kubernetes 1.{minor}");
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(crd))
            .await
            .map_err(|e| Error::kube(format!("applying CRD {name}"), e))?;
        tracing::info!(crd = %name, cel, "CRD applied");
    }
    Ok(())
}
