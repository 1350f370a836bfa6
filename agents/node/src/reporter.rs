//! The status reporter and event recorder: everything the pod workers tell the API server.
//!
//! The pod workers see it through the [`StatusSink`] trait, so their lifecycle can be tested
//! against a recording fake; [`Reporter`] is the implementation that talks to the API server.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};

/// Every API call is bounded by this timeout.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the reporter.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The API call failed.
    #[error("{what} {namespace}/{name}: {source}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },
    /// The API call timed out.
    #[error("{what} {namespace}/{name}: timed out")]
    Timeout {
        /// What was being done.
        what: &'static str,
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
    },
}

impl ReportError {
    /// Whether the pod is gone (404) or was replaced (UID precondition failed, 409).
    pub fn is_gone(&self) -> bool {
        matches!(self, ReportError::Api { source: kube::Error::Api(s), .. } if s.code == 404 || s.code == 409)
    }
}

/// Identifies one pod (by UID).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl PodRef {
    /// The reference of a pod object.
    pub fn of(pod: &Pod) -> Self {
        Self {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Talks to the API server on behalf of the pod workers.
#[derive(Clone)]
pub struct Reporter {
    client: Client,
    node_name: String,
}

impl Reporter {
    /// A reporter for `node_name`.
    pub fn new(client: Client, node_name: String) -> Self {
        Self { client, node_name }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn bounded<T>(
        what: &'static str,
        pod: &PodRef,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ReportError> {
        match tokio::time::timeout(API_TIMEOUT, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(ReportError::Api {
                what,
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                source,
            }),
            Err(_) => Err(ReportError::Timeout {
                what,
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            }),
        }
    }

    /// Patches the pod's status; the UID in the patch makes it fail on a replaced pod.
    pub async fn patch_status(&self, pod: &PodRef, status: &PodStatus) -> Result<(), ReportError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let patch = serde_json::json!({
            "metadata": { "uid": pod.uid },
            "status": status,
        });
        Self::bounded(
            "patch status of",
            pod,
            api.patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map(|_| ())
    }

    /// Fetches the pod with a quorum read (no `resourceVersion`): the answer reflects every
    /// write the API server completed before the request was sent.
    pub async fn get(&self, pod: &PodRef) -> Result<Pod, ReportError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        Self::bounded("get", pod, api.get(&pod.name)).await
    }

    /// Deletes the pod object with grace 0 and a UID precondition: the final step, once every
    /// process of the pod is confirmed dead.
    pub async fn delete_pod(&self, pod: &PodRef) -> Result<(), ReportError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match Self::bounded("delete", pod, api.delete(&pod.name, &dp)).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_gone() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Records an Event about the pod (best effort: failures are logged).
    pub async fn event(&self, pod: &PodRef, warning: bool, reason: &str, message: &str) {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &pod.namespace);
        let now = jiff::Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{:x}", pod.name, now.as_nanosecond())),
                namespace: Some(pod.namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.clone()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            source: Some(EventSource {
                component: Some("palisade-node".into()),
                host: Some(self.node_name.clone()),
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            ..Default::default()
        };
        if warning {
            tracing::warn!(pod = %pod, reason, message, "event");
        } else {
            tracing::info!(pod = %pod, reason, message, "event");
        }
        if let Err(e) = Self::bounded(
            "record event for",
            pod,
            api.create(&PostParams::default(), &ev),
        )
        .await
        {
            tracing::debug!(pod = %pod, error = %e, "cannot record event");
        }
    }
}

/// Everything a pod worker tells the API server about its pod, or asks it: status patches,
/// Events, the check that a self-fenced pod still belongs to this node, and the final
/// deletion. [`Reporter`] implements it against the API server.
#[async_trait::async_trait]
pub trait StatusSink: Send + Sync + 'static {
    /// Patches the pod's status; fails on a replaced pod (UID mismatch).
    async fn patch_status(&self, pod: &PodRef, status: &PodStatus) -> Result<(), ReportError>;
    /// Records an Event about the pod (best effort).
    async fn event(&self, pod: &PodRef, warning: bool, reason: &str, message: &str);
    /// Fetches the pod object, reflecting every write completed before the request was sent
    /// (a quorum read): what a worker's confirmation relies on.
    async fn get(&self, pod: &PodRef) -> Result<Pod, ReportError>;
    /// Deletes the pod object with grace 0 and a UID precondition; a pod that is already gone
    /// counts as deleted.
    async fn delete_pod(&self, pod: &PodRef) -> Result<(), ReportError>;
}

#[async_trait::async_trait]
impl StatusSink for Reporter {
    async fn patch_status(&self, pod: &PodRef, status: &PodStatus) -> Result<(), ReportError> {
        Reporter::patch_status(self, pod, status).await
    }

    async fn event(&self, pod: &PodRef, warning: bool, reason: &str, message: &str) {
        Reporter::event(self, pod, warning, reason, message).await
    }

    async fn get(&self, pod: &PodRef) -> Result<Pod, ReportError> {
        Reporter::get(self, pod).await
    }

    async fn delete_pod(&self, pod: &PodRef) -> Result<(), ReportError> {
        Reporter::delete_pod(self, pod).await
    }
}
