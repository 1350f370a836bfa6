//! What the pod worker's unit tests share: a [`Harness`] that runs workers against the
//! [`FakeRuntime`], a recording [`FakeStatusSink`] and an in-process fake API server, and
//! builders for pods.
//!
//! Tests run with paused time: every instant they assert is exact on the tokio clock.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{spawn, Ctx, FenceState, WorkerHandle};
use crate::metrics::Metrics;
use crate::reporter::{PodRef, ReportError, StatusSink};
use crate::runtime::fake::FakeRuntime;
use crate::state::{PodRecord, StateStore};

/// The UID of every test pod.
pub const UID: &str = "uid-1";
/// The name of every test pod.
pub const NAME: &str = "p";
/// The node the workers run on.
pub const NODE: &str = "node-a";
/// The claim that [`Harness`]'s fake API server knows, bound to a node-local volume.
pub const CLAIM: &str = "data";

/// A recording [`StatusSink`]: keeps every status patch and Event, answers `get` with the pod
/// it was given (or an error, see [`FakeStatusSink::fail_gets`]), and records reads and
/// deletions.
#[derive(Default)]
pub struct FakeStatusSink {
    inner: Mutex<SinkState>,
}

#[derive(Default)]
struct SinkState {
    statuses: Vec<(Instant, PodStatus)>,
    events: Vec<(Instant, String, String)>,
    deleted: Vec<(Instant, PodRef)>,
    pod: Option<Pod>,
    gets: Vec<Instant>,
    get_error: Option<u16>,
}

impl FakeStatusSink {
    fn lock(&self) -> parking_lot::MutexGuard<'_, SinkState> {
        self.inner.lock()
    }

    /// The latest status patch.
    pub fn last_status(&self) -> Option<PodStatus> {
        self.lock().statuses.last().map(|(_, s)| s.clone())
    }

    /// Every Event so far, as `(reason, message)`.
    pub fn events(&self) -> Vec<(String, String)> {
        self.lock()
            .events
            .iter()
            .map(|(_, r, m)| (r.clone(), m.clone()))
            .collect()
    }

    /// The pods deleted so far.
    pub fn deleted(&self) -> Vec<(Instant, PodRef)> {
        self.lock().deleted.clone()
    }

    /// What `get` answers from now on (`None`: the pod is gone).
    pub fn set_pod(&self, pod: Option<Pod>) {
        self.lock().pod = pod;
    }

    /// From now on, `get` fails with this HTTP status code (`None`: answers again).
    pub fn fail_gets(&self, code: Option<u16>) {
        self.lock().get_error = code;
    }

    /// The instants of every `get` so far.
    pub fn gets(&self) -> Vec<Instant> {
        self.lock().gets.clone()
    }
}

#[async_trait::async_trait]
impl StatusSink for FakeStatusSink {
    async fn patch_status(&self, _: &PodRef, status: &PodStatus) -> Result<(), ReportError> {
        self.lock().statuses.push((Instant::now(), status.clone()));
        Ok(())
    }

    async fn event(&self, _: &PodRef, _warning: bool, reason: &str, message: &str) {
        self.lock()
            .events
            .push((Instant::now(), reason.into(), message.into()));
    }

    async fn get(&self, pod: &PodRef) -> Result<Pod, ReportError> {
        let mut st = self.lock();
        st.gets.push(Instant::now());
        let error = |code: u16, reason: &str| ReportError::Api {
            what: "get",
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            source: kube::Error::Api(Box::new(
                kube::core::Status::failure(reason, reason).with_code(code),
            )),
        };
        if let Some(code) = st.get_error {
            return Err(error(code, "ServiceUnavailable"));
        }
        st.pod.clone().ok_or_else(|| error(404, "NotFound"))
    }

    async fn delete_pod(&self, pod: &PodRef) -> Result<(), ReportError> {
        self.lock().deleted.push((Instant::now(), pod.clone()));
        Ok(())
    }
}

/// An in-process API server that knows one bound claim, [`CLAIM`], whose volume is a plain
/// (not CSI) PersistentVolume; everything else is 404.
fn fake_api() -> kube::Client {
    let svc = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
        let path = req.uri().path().to_string();
        let (code, body) = match path.as_str() {
            "/api/v1/namespaces/default/persistentvolumeclaims/data" => (
                200,
                serde_json::json!({
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": CLAIM, "namespace": "default"},
                    "spec": {"volumeName": "pv-data"},
                }),
            ),
            "/api/v1/persistentvolumes/pv-data" => (
                200,
                serde_json::json!({
                    "apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": "pv-data"},
                    "spec": {"hostPath": {"path": "/srv/data"}},
                }),
            ),
            _ => (
                404,
                serde_json::json!({
                    "apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "reason": "NotFound", "message": format!("{path} not found"), "code": 404,
                }),
            ),
        };
        let resp = http::Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(body.to_string().into_bytes()))
            .expect("valid response");
        Ok::<_, Infallible>(resp)
    });
    kube::Client::new(svc, "default")
}

/// Runs pod workers against fakes.
pub struct Harness {
    /// The container runtime.
    pub runtime: Arc<FakeRuntime>,
    /// Where status and Events go.
    pub sink: Arc<FakeStatusSink>,
    /// The self-fencing state the workers follow.
    pub fence: watch::Sender<FenceState>,
    /// What the workers share.
    pub ctx: Arc<Ctx>,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// A harness with nothing running and self-fencing inactive.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let runtime = Arc::new(FakeRuntime::default());
        let sink = Arc::new(FakeStatusSink::default());
        let (fence, fence_rx) = watch::channel(FenceState::default());
        let ctx = Arc::new(Ctx {
            client: fake_api(),
            status: sink.clone(),
            runtime: runtime.clone(),
            store: StateStore::open(dir.path()).expect("state store"),
            node_name: NODE.into(),
            address: "127.0.0.1".parse().expect("address"),
            api_service: crate::env::ApiService::parse("10.213.0.1:6443").expect("address"),
            image_store: dir.path().join("images"),
            images: crate::image::ImageService::disabled(dir.path().join("images")),
            host_images: vec!["host".into()],
            max_restart_backoff: Duration::from_secs(300),
            fence: fence_rx,
            metrics: Arc::new(Metrics::default()),
            volumes_in_use: Default::default(),
            managed: Default::default(),
        });
        Self {
            runtime,
            sink,
            fence,
            ctx,
            _dir: dir,
        }
    }

    /// Starts the worker of `pod`, which the API shows as it is (what `get` answers).
    pub fn spawn(&self, pod: &Pod) -> WorkerHandle {
        self.spawn_with(pod, None, Some(pod.clone()))
    }

    /// Starts the worker of `pod` resuming `record`, while the API shows `api` (`None`: no
    /// such pod).
    pub fn spawn_with(
        &self,
        pod: &Pod,
        record: Option<PodRecord>,
        api: Option<Pod>,
    ) -> WorkerHandle {
        self.sink.set_pod(api);
        spawn(self.ctx.clone(), pod.clone(), record)
    }
}

/// A host-image container named `name` (the fake runtime runs anything).
pub fn container(name: &str) -> serde_json::Value {
    serde_json::json!({"name": name, "image": "host", "command": ["run", name]})
}

/// Pod [`NAME`] in `default` with [`UID`] and `spec`, bound to [`NODE`].
pub fn pod(mut spec: serde_json::Value) -> Pod {
    spec["nodeName"] = serde_json::json!(NODE);
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": NAME, "namespace": "default", "uid": UID},
        "spec": spec,
    }))
    .expect("valid pod")
}

/// `pod` as the API server shows it after a graceful DELETE with `grace_seconds`.
pub fn deleted(pod: &Pod, grace_seconds: i64) -> Pod {
    let mut p = pod.clone();
    p.metadata.deletion_timestamp = Some(crate::ktime::now());
    p.metadata.deletion_grace_period_seconds = Some(grace_seconds);
    p
}

/// Waits (on the paused clock) until `cond` holds; fails after an hour of virtual time.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3600);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `ready` flag of each container status in `s`, by name.
pub fn ready_flags(s: &PodStatus) -> BTreeMap<String, bool> {
    s.container_statuses
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.ready))
        .collect()
}

/// The status of condition `type_` in `s` (`"True"`, `"False"`), if present.
pub fn condition(s: &PodStatus, type_: &str) -> Option<String> {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}
