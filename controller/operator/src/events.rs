//! Kubernetes Events (`core/v1`), so that `kubectl describe nodefence` / `describe node` tell
//! what happened and why. Event failures are logged and never stop a step.
//!
//! Events written off a hot path ([`Recorder::publish_later`]) go through one bounded queue and
//! a few writers ([`WRITERS`]): a storm (10,000 nodes held at once when the quorum guard holds)
//! writes at the API server's pace, never with one request in flight per Event, and what does
//! not fit in the queue is dropped and counted, as client-go's recorder does. Events are best
//! effort; the NodeFence status and the metrics are the record.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;

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
    /// The queue of [`Recorder::publish_later`], its writers started on first use.
    queue: Arc<OnceLock<tokio::sync::mpsc::Sender<Queued>>>,
    /// Events dropped because the queue was full (`palisade_events_dropped_total`).
    dropped: Counter,
}

/// An Event waiting for the writers.
struct Queued {
    about: ObjectReference,
    kind: Kind,
    reason: String,
    message: String,
}

/// Events waiting for the writers at most (client-go's broadcaster keeps 1,000 too).
pub const QUEUE_CAPACITY: usize = 1000;

/// Event writes in flight at most. One was too few: 500 dry-run decisions at once took 50 s
/// to show on an API server answering in 90 ms; one per Event, 10,000 at once, was the storm.
pub const WRITERS: usize = 16;

/// Component name shown as the Event source.
pub const COMPONENT: &str = "palisade-controller";

impl Recorder {
    /// A recorder for this replica.
    pub fn new(client: Client, instance: String) -> Self {
        Self {
            client,
            instance,
            queue: Arc::default(),
            dropped: Counter::default(),
        }
    }

    /// This recorder, counting the Events it drops in `counter` (a metric's).
    pub fn counting_drops_in(self, counter: Counter) -> Self {
        Self {
            dropped: counter,
            ..self
        }
    }

    /// Queues one Event about `about` for the writers and returns at once (must be called
    /// within the Tokio runtime).
    ///
    /// Guarantees: at most [`QUEUE_CAPACITY`] Events wait, and at most [`WRITERS`] are written
    /// at a time, so a storm of Events never adds more than that many requests to a struggling
    /// API server; an Event that does not fit is dropped, counted ([`Recorder::dropped`]) and
    /// logged (the first of every thousand).
    pub fn publish_later(
        &self,
        about: ObjectReference,
        kind: Kind,
        reason: String,
        message: String,
    ) {
        let queue = self.queue.get_or_init(|| {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Queued>(QUEUE_CAPACITY);
            let writer = Recorder::new(self.client.clone(), self.instance.clone());
            let queued = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
            tokio::spawn(futures::StreamExt::for_each_concurrent(
                queued,
                WRITERS,
                move |q| {
                    let writer = writer.clone();
                    async move {
                        writer.publish(q.about, q.kind, &q.reason, &q.message).await;
                    }
                },
            ));
            tx
        });
        let queued = Queued {
            about,
            kind,
            reason,
            message,
        };
        if let Err(e) = queue.try_send(queued) {
            let n = self.dropped.inc();
            if n.is_multiple_of(1000) {
                let q = e.into_inner();
                tracing::warn!(dropped = n + 1, reason = %q.reason, "Event queue full: Event dropped (the API server is slow, or a storm of Events)");
            }
        }
    }

    /// Events dropped so far because the queue of [`Recorder::publish_later`] was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A client for an API server that accepts connections and never answers.
    async fn silent_server() -> (Client, tokio::net::TcpListener) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let config = kube::Config::new(url.parse().unwrap());
        (Client::try_from(config).unwrap(), listener)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_storm_of_events_waits_in_a_bounded_queue_and_the_rest_is_dropped() {
        let (client, _listener) = silent_server().await;
        let recorder = Recorder::new(client, "test".into());
        let storm = QUEUE_CAPACITY + 10;
        for i in 0..storm {
            recorder.publish_later(
                ObjectReference {
                    name: Some(format!("n{i}")),
                    ..Default::default()
                },
                Kind::Warning,
                "FenceHeldQuorumLost".into(),
                "held".into(),
            );
        }
        // Nothing was written yet (the writer has not run on this thread): the queue holds
        // what fits, the rest was dropped and counted.
        assert_eq!(recorder.dropped(), 10);
        // The writers take WRITERS, which hang on the silent server: that many requests in
        // flight at most, and room for exactly that many more.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        for _ in 0..WRITERS {
            recorder.publish_later(
                ObjectReference::default(),
                Kind::Normal,
                "r".into(),
                "m".into(),
            );
        }
        assert_eq!(recorder.dropped(), 10);
        recorder.publish_later(
            ObjectReference::default(),
            Kind::Normal,
            "r".into(),
            "m".into(),
        );
        assert_eq!(recorder.dropped(), 11);
    }
}
