//! Kubernetes Events (`core/v1`), so that `kubectl describe nodefence` / `describe node` tell
//! what happened and why. Event failures are logged and never stop a step.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client, Resource, ResourceExt};

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Informational.
    Normal,
    /// Something an operator should look at.
    Warning,
}

/// Writes Events on behalf of the controller.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    instance: String,
}

/// Component name shown as the Event source.
pub const COMPONENT: &str = "palisade-controller";

impl Recorder {
    /// A recorder for this replica.
    pub fn new(client: Client, instance: String) -> Self {
        Self { client, instance }
    }

    /// The reference for any object (cluster-scoped or namespaced).
    pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
        ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: Some(obj.name_any()),
            namespace: obj.namespace(),
            uid: obj.meta().uid.clone(),
            ..Default::default()
        }
    }

    /// Records one Event about `about`. Cluster-scoped objects get their Events in `default`.
    pub async fn publish(&self, about: ObjectReference, kind: Kind, reason: &str, message: &str) {
        let ns = about.namespace.clone().unwrap_or_else(|| "default".into());
        let now = Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!(
                    "{}.",
                    about.name.clone().unwrap_or_else(|| "palisade".into())
                )),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: about,
            reason: Some(reason.to_string()),
            message: Some(message.chars().take(1024).collect()),
            type_: Some(
                match kind {
                    Kind::Normal => "Normal",
                    Kind::Warning => "Warning",
                }
                .into(),
            ),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            // A "legacy" Event (no eventTime): the only kind the 1.20 API server accepts in
            // `default` for cluster-scoped objects such as Nodes and NodeFences.
            count: Some(1),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: Some(self.instance.clone()),
            }),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = api.create(&PostParams::default(), &ev).await {
            tracing::warn!(error = %e, reason, "could not record Event");
        }
    }
}
