//! `kubectl palisade delete-pod NAMESPACE/POD` (or `delete pod POD -n NAMESPACE --force`): the
//! safe force deletion.
//!
//! Guarantees: without `--confirm`, a pod is force-deleted only when a NodeFence for its node
//! holds a verified fence (power off, trusted self-fence, or a storage block) that covers the
//! pod (a storage block covers only pods with a claim); otherwise it refuses and says what may
//! run twice. Either way, who forced it (the user and groups the API server reports in a
//! SelfSubjectReview) is recorded on the pod (annotation) and in an Event before the delete,
//! which carries the pod's UID as a precondition; when the API server does not say who the
//! user is, nothing is deleted.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use palisade_model::nodefence::Coverage;
use palisade_model::NodeFence;

use crate::identity::{self, Identity};

/// Annotation naming who force-deleted a pod through this command, and on what grounds.
pub const FORCED_BY: &str = "palisade.dev/force-deleted-by";

/// The namespace and name of the pod: `NAMESPACE/NAME`, or `NAME` in `-n NAMESPACE` (default:
/// the context's namespace). A `NAMESPACE/` prefix that contradicts `-n` is an error.
pub fn pod_ref<'a>(
    arg: &'a str,
    namespace: Option<&'a str>,
    default_ns: &'a str,
) -> anyhow::Result<(&'a str, &'a str)> {
    let (ns, name) = match arg.split_once('/') {
        Some((ns, _)) if namespace.is_some_and(|n| n != ns) => anyhow::bail!(
            "the pod {arg:?} names namespace {ns:?}, but -n says {:?}",
            namespace.unwrap_or_default()
        ),
        Some((ns, name)) => (ns, name),
        None => (namespace.unwrap_or(default_ns), arg),
    };
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        anyhow::bail!("give the pod as NAMESPACE/NAME or NAME with -n NAMESPACE, got {arg:?}");
    }
    Ok((ns, name))
}

/// What is recorded on the pod and in the Event: who (as the API server authenticated them),
/// when, and on what grounds.
pub fn record(who: &Identity, at: Timestamp, grounds: &str) -> String {
    format!("{} via kubectl-palisade at {at}: {grounds}", who.describe())
}

/// Runs the command on pod `name` in namespace `ns`.
pub async fn run(c: &Client, ns: &str, name: &str, confirm: bool) -> anyhow::Result<u8> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let Some(pod) = pods.get_opt(name).await? else {
        anyhow::bail!("no pod {ns}/{name}");
    };
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let mounts_claim = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.persistent_volume_claim.is_some()));
    let fences: Api<NodeFence> = Api::all(c.clone());
    let covering = match &node {
        None => None,
        Some(node) => fences
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|f| f.spec.node_name == *node)
            .find_map(|f| {
                let proof = f.status.as_ref()?.verified_fence()?;
                let covers = match proof.coverage() {
                    Coverage::All => true,
                    Coverage::Stateful => mounts_claim,
                };
                covers.then(|| (f.name_any(), proof.coverage()))
            }),
    };
    let grounds = match (&covering, &node) {
        (Some((fence, coverage)), Some(node)) => {
            format!(
                "node {node} is fenced (verified by nodefence/{fence}, covering {coverage:?} pods)"
            )
        }
        _ => {
            let claims: Vec<String> = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .map(|c| c.claim_name.clone())
                })
                .collect();
            let warning = format!(
                "WARNING: node {} is not fenced with a verified fence that covers {ns}/{name}. Its containers may still be running. \
                 Deleting the pod lets its controller start a replacement at once: two copies of {ns}/{name} may then run together{}.",
                node.as_deref().unwrap_or("(none)"),
                if claims.is_empty() { String::new() } else { format!(", both writing to claim(s) {}", claims.join(", ")) }
            );
            eprintln!("{warning}");
            if !confirm {
                eprintln!("refused: fence the node first (`kubectl palisade fence NODE --reason ...`), or pass --confirm to accept the risk");
                return Ok(crate::REFUSED);
            }
            "confirmed by a person without a verified fence".to_string()
        }
    };
    // The record names the user the API server authenticated. An API server too old to say
    // (no SelfSubjectReview before Kubernetes 1.26) gets the local name, recorded as
    // unverified; one that refuses to say, or names nobody, gets no deletion.
    let who = match identity::whoami(c).await {
        Ok(who) => who,
        Err(identity::Unknown::NotServed) => {
            let who = Identity::unverified_local();
            eprintln!(
                "note: this API server cannot say who you are; the record names {}",
                who.describe()
            );
            who
        }
        Err(why) => {
            eprintln!(
                "refused: a forced deletion records who forced it, and the API server did not say who you \
                 are: {why}. Nothing was deleted"
            );
            return Ok(crate::REFUSED);
        }
    };
    let record = record(&who, Timestamp::now(), &grounds);
    pods.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"annotations": {FORCED_BY: record}}})),
    )
    .await?;
    let events: Api<Event> = Api::namespaced(c.clone(), ns);
    let now = Timestamp::now();
    let ev = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}.")),
            namespace: Some(ns.to_string()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        reason: Some(if covering.is_some() {
            "ForceDeletedFenced".into()
        } else {
            "ForceDeletedUnfenced".into()
        }),
        message: Some(record.clone()),
        type_: Some(if covering.is_some() {
            "Normal".into()
        } else {
            "Warning".into()
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        source: Some(EventSource {
            component: Some("kubectl-palisade".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Err(e) = events.create(&PostParams::default(), &ev).await {
        eprintln!("note: could not record the Event: {e}");
    }
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    pods.delete(name, &dp).await?;
    println!("pod {ns}/{name} force-deleted: {grounds}");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_is_named_with_its_namespace_or_in_the_given_one() {
        assert_eq!(pod_ref("kp/db-0", None, "default").unwrap(), ("kp", "db-0"));
        assert_eq!(pod_ref("kp/db-0", Some("kp"), "x").unwrap(), ("kp", "db-0"));
        assert_eq!(pod_ref("db-0", Some("kp"), "x").unwrap(), ("kp", "db-0"));
        assert_eq!(pod_ref("db-0", None, "ctx-ns").unwrap(), ("ctx-ns", "db-0"));
        for (arg, ns) in [
            ("kp/db-0", Some("other")),
            ("/db-0", None),
            ("kp/", None),
            ("a/b/c", None),
        ] {
            assert!(pod_ref(arg, ns, "default").is_err(), "{arg} -n {ns:?}");
        }
    }

    #[test]
    fn the_record_names_the_authenticated_user_and_groups() {
        let who = Identity {
            username: "palisade-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            verified: true,
        };
        let at: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        assert_eq!(
            record(&who, at, "node m1 is fenced"),
            "palisade-admin (groups: system:masters, system:authenticated) via kubectl-palisade at 2026-01-02T03:04:05Z: node m1 is fenced"
        );
        let local = Identity {
            username: "alice".into(),
            groups: vec![],
            verified: false,
        };
        assert!(record(&local, at, "confirmed").starts_with(
            "unverified local user alice (the API server serves no SelfSubjectReview"
        ));
    }
}
