//! OCI images from registries: the pod worker asks [`ImageService::resolve`] for a
//! container's image and gets its directory (`rootfs/` and `config.json`) or the reason it
//! is not there yet, as the kubelet's Waiting reason ([`ImageError::reason`]).
//!
//! `resolve` never blocks: a missing image starts a pull in the background and reports
//! `ContainerCreating` until it lands; the worker asks again on its next attempt. A failed
//! pull is reported once as `ErrImagePull`, then as `ImagePullBackOff` until the back-off
//! (10 s doubling to 300 s, as the kubelet's) lets the next pull start.
//!
//! One file per concern:
//! - [`reference`](mod@reference): parsing and normalising image names;
//! - [`policy`]: `imagePullPolicy`, one pure decision;
//! - [`auth`]: `imagePullSecrets` (dockerconfigjson) and registry challenges;
//! - [`registry`]: the distribution API v2 over HTTPS, behind the [`registry::RegistryApi`] seam;
//! - [`manifest`]: manifests, indexes (choosing `linux/amd64`) and image configs;
//! - [`digest`]: sha256 verification of everything fetched;
//! - [`unpack`]: gzip/zstd layers with whiteouts;
//! - [`pull`]: one pull, start to finish;
//! - [`store`]: the node's content-addressed store and its garbage collection;
//! - [`error`]: the errors and their Waiting reasons.

pub mod auth;
pub mod digest;
pub mod error;
pub mod manifest;
pub mod policy;
pub mod pull;
pub mod reference;
pub mod registry;
pub mod store;
pub mod unpack;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backon::BackoffBuilder as _;
use parking_lot::Mutex;
use tokio::time::Instant;

pub use error::{ImageError, PullError};
pub use policy::PullPolicy;
pub use reference::Reference;

use crate::backoff;
use digest::Digest;
use policy::{Decision, Known};
use registry::RegistryApi;
use store::Store;

/// The kubelet's initial image pull back-off.
pub const PULL_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// The kubelet's maximum image pull back-off.
pub const PULL_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How long one pull (all manifests and layers) may take.
pub const PULL_BUDGET: Duration = Duration::from_secs(600);
/// How long an image no live pod uses is kept after it was last resolved.
pub const GC_GRACE: Duration = Duration::from_secs(600);

/// What the worker asks for.
#[derive(Debug, Clone)]
pub struct ImageRequest<'a> {
    /// The container's `image`.
    pub image: &'a str,
    /// The container's `imagePullPolicy`.
    pub policy: Option<&'a str>,
    /// The pod's namespace (of its pull secrets).
    pub namespace: &'a str,
    /// The pod's `imagePullSecrets` names.
    pub pull_secrets: Vec<String>,
    /// The pod's UID (the image is kept while the pod lives).
    pub pod_uid: &'a str,
}

/// A resolved image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The image directory: `rootfs/` and `config.json`.
    pub dir: PathBuf,
    /// `registry/repository@sha256:…`, the container's `imageID`.
    pub image_id: String,
}

/// Opens a registry for one pull: finds the pod's credentials for it.
#[async_trait::async_trait]
pub trait Connector: Send + Sync {
    /// A registry client for `r`, with the credentials of `secrets` in `namespace`.
    async fn connect(
        &self,
        r: &Reference,
        namespace: &str,
        secrets: &[String],
    ) -> Result<Box<dyn RegistryApi>, PullError>;
}

/// The production [`Connector`]: HTTPS verified against the configured CA, credentials from
/// the pod's `kubernetes.io/dockerconfigjson` secrets.
pub struct HttpConnector {
    https: reqwest::Client,
    kube: kube::Client,
}

impl HttpConnector {
    /// A connector trusting the CAs in `ca_pem`.
    pub fn new(ca_pem: &[u8], kube: kube::Client) -> Result<HttpConnector, String> {
        Ok(HttpConnector {
            https: registry::https_client(ca_pem)?,
            kube,
        })
    }
}

#[async_trait::async_trait]
impl Connector for HttpConnector {
    async fn connect(
        &self,
        r: &Reference,
        namespace: &str,
        secrets: &[String],
    ) -> Result<Box<dyn RegistryApi>, PullError> {
        use k8s_openapi::api::core::v1::Secret;
        let api: kube::Api<Secret> = kube::Api::namespaced(self.kube.clone(), namespace);
        let mut creds = None;
        for name in secrets {
            let err = |message: String| PullError::Secret {
                namespace: namespace.into(),
                name: name.clone(),
                message,
            };
            let got = tokio::time::timeout(Duration::from_secs(10), api.get_opt(name))
                .await
                .map_err(|_| err("timed out reading the secret".into()))?
                .map_err(|e| err(e.to_string()))?;
            // As the kubelet: a missing pull secret is skipped (the image may be public).
            let Some(secret) = got else {
                tracing::warn!(namespace, secret = %name, "image pull secret not found; pulling without it");
                continue;
            };
            let Some(raw) = secret
                .data
                .as_ref()
                .and_then(|d| d.get(".dockerconfigjson"))
            else {
                continue;
            };
            let found = auth::parse_docker_config(&raw.0).map_err(err)?;
            if let Some(c) = found.get(&r.registry) {
                creds = Some(c.clone());
                break;
            }
        }
        Ok(Box::new(registry::HttpRegistry::new(
            self.https.clone(),
            creds,
        )))
    }
}

#[derive(Default)]
struct PullState {
    pulling: bool,
    failure: Option<Failure>,
    /// The pull retry backoff (kubelet: 10 s doubling to 300 s); dropped on success.
    backoff: Option<backon::ExponentialBackoff>,
}

struct Failure {
    error: Arc<PullError>,
    reported: bool,
    retry_at: Instant,
}

struct Inner {
    store: Store,
    connector: Arc<dyn Connector>,
    /// Per reference, namespace and pull secrets (so one pod's bad credentials do not back
    /// off another's good ones).
    pulls: Mutex<HashMap<String, PullState>>,
    /// Image reference → the `imageID` it last resolved to.
    ids: Mutex<HashMap<String, String>>,
}

/// The node's images: resolution, background pulls with back-off, garbage collection.
#[derive(Clone)]
pub struct ImageService {
    /// `None`: registry pulls are off (no `--registry-ca`); only the directory store and
    /// host images exist.
    inner: Option<Arc<Inner>>,
    dir_store: PathBuf,
}

impl ImageService {
    /// Registry pulls off: every image must be in the directory store `dir_store`.
    pub fn disabled(dir_store: PathBuf) -> ImageService {
        ImageService {
            inner: None,
            dir_store,
        }
    }

    /// Registry pulls into the store at `root`, through `connector`.
    pub fn new(
        root: &std::path::Path,
        connector: Arc<dyn Connector>,
        dir_store: PathBuf,
    ) -> std::io::Result<ImageService> {
        Ok(ImageService {
            inner: Some(Arc::new(Inner {
                store: Store::open(root)?,
                connector,
                pulls: Mutex::default(),
                ids: Mutex::default(),
            })),
            dir_store,
        })
    }

    /// The image directory for `req`, or why it is not available yet. Starts a pull when the
    /// policy calls for one; never waits for it.
    pub fn resolve(&self, req: &ImageRequest<'_>) -> Result<Resolved, ImageError> {
        let image = req.image.to_string();
        let Some(inner) = &self.inner else {
            return Err(ImageError::NotPresent {
                image,
                store: self.dir_store.clone(),
            });
        };
        let r = Reference::parse(req.image).map_err(|reason| ImageError::InvalidName {
            image: image.clone(),
            reason,
        })?;
        let policy = PullPolicy::of(req.policy, &r);
        let canonical = r.to_string();
        let local = inner.store.get_ref(&canonical);
        let key = format!(
            "{}/{}/{canonical}",
            req.namespace,
            req.pull_secrets.join(",")
        );
        let now = Instant::now();
        let mut pulls = inner.pulls.lock();
        let state = pulls.entry(key.clone()).or_default();
        let known = Known {
            local_age: local
                .as_ref()
                .map(|(_, at)| SystemTime::now().duration_since(*at).unwrap_or_default()),
            pulling: state.pulling,
            failed: state
                .failure
                .as_ref()
                .map(|f| (f.reported, f.retry_at.saturating_duration_since(now))),
        };
        match policy::decide(policy, known) {
            Decision::UseLocal => {
                let (rec, _) = local.expect("decide uses a local image only when there is one");
                let config =
                    Digest::parse(&rec.config_digest).expect("store records hold valid digests");
                inner.store.add_user(&config, req.pod_uid);
                inner.ids.lock().insert(image, rec.image_id.clone());
                Ok(Resolved {
                    dir: inner.store.image_dir(&config),
                    image_id: rec.image_id,
                })
            }
            Decision::NeverPull => Err(ImageError::NeverPull { image }),
            Decision::Wait => Err(ImageError::Pulling { image }),
            Decision::ReportFailure => {
                let f = state
                    .failure
                    .as_mut()
                    .expect("decide reports a failure only when there is one");
                f.reported = true;
                Err(ImageError::Pull {
                    image,
                    source: f.error.clone(),
                })
            }
            Decision::BackOff(retry_in) => {
                let f = state
                    .failure
                    .as_ref()
                    .expect("decide backs off only after a failure");
                Err(ImageError::BackOff {
                    image,
                    retry_in,
                    source: f.error.clone(),
                })
            }
            Decision::Pull => {
                state.pulling = true;
                drop(pulls);
                self.spawn_pull(inner.clone(), key, r, req);
                Err(ImageError::Pulling { image })
            }
        }
    }

    fn spawn_pull(&self, inner: Arc<Inner>, key: String, r: Reference, req: &ImageRequest<'_>) {
        let namespace = req.namespace.to_string();
        let secrets = req.pull_secrets.clone();
        let span = tracing::info_span!("pull", image = %r, namespace = %namespace);
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                tracing::info!("pulling image");
                let started = Instant::now();
                let work = async {
                    let api = inner.connector.connect(&r, &namespace, &secrets).await?;
                    pull::pull(api.as_ref(), &inner.store, &r).await
                };
                let result = tokio::time::timeout(PULL_BUDGET, work)
                    .await
                    .unwrap_or(Err(PullError::Timeout(PULL_BUDGET)));
                let mut pulls = inner.pulls.lock();
                let state = pulls.entry(key).or_default();
                state.pulling = false;
                match result {
                    Ok(rec) => {
                        tracing::info!(image_id = %rec.image_id, took_ms = started.elapsed().as_millis() as u64, "pulled image");
                        state.backoff = None;
                        state.failure = None;
                    }
                    Err(e) => {
                        let retries = state.backoff.get_or_insert_with(|| {
                            backoff::retry(PULL_BACKOFF_INITIAL, PULL_BACKOFF_MAX).build()
                        });
                        let delay = backoff::next_delay(retries, PULL_BACKOFF_MAX);
                        tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "image pull failed");
                        state.failure = Some(Failure {
                            error: Arc::new(e),
                            reported: false,
                            retry_at: Instant::now() + delay,
                        });
                    }
                }
            },
            span,
        ));
    }

    /// The directory of `image` if it is already in the registry store, without pulling,
    /// checking the pull policy or recording a user (for the stop signal at kill time).
    pub fn local_dir(&self, image: &str) -> Option<PathBuf> {
        let inner = self.inner.as_ref()?;
        let r = Reference::parse(image).ok()?;
        let (rec, _) = inner.store.get_ref(&r.to_string())?;
        let config = Digest::parse(&rec.config_digest)?;
        Some(inner.store.image_dir(&config))
    }

    /// The `imageID` `image` last resolved to on this node (no I/O: for status reports).
    pub fn image_id(&self, image: &str) -> Option<String> {
        let inner = self.inner.as_ref()?;
        inner.ids.lock().get(image).cloned()
    }

    /// Removes the images no pod in `live` uses (after [`GC_GRACE`]); returns their config
    /// digests.
    pub fn collect_garbage(&self, live: &HashSet<String>) -> Vec<String> {
        match &self.inner {
            Some(inner) => inner
                .store
                .collect_garbage(live, GC_GRACE, SystemTime::now()),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pull::tests::FakeRegistry;
    use super::unpack::tests::tar_of;
    use super::*;

    struct FakeConnector(Arc<FakeRegistry>);

    struct Shared(Arc<FakeRegistry>);

    #[async_trait::async_trait]
    impl RegistryApi for Shared {
        async fn manifest(
            &self,
            r: &Reference,
            reference: &str,
        ) -> Result<registry::ManifestResponse, PullError> {
            self.0.manifest(r, reference).await
        }
        async fn blob(
            &self,
            r: &Reference,
            d: &str,
            sink: &mut (dyn std::io::Write + Send),
        ) -> Result<(), PullError> {
            self.0.blob(r, d, sink).await
        }
    }

    #[async_trait::async_trait]
    impl Connector for FakeConnector {
        async fn connect(
            &self,
            _: &Reference,
            _: &str,
            _: &[String],
        ) -> Result<Box<dyn RegistryApi>, PullError> {
            Ok(Box::new(Shared(self.0.clone())))
        }
    }

    fn service() -> (tempfile::TempDir, ImageService, Arc<FakeRegistry>) {
        let tmp = tempfile::tempdir().unwrap();
        let reg = Arc::new(FakeRegistry::default());
        let svc = ImageService::new(
            &tmp.path().join("oci"),
            Arc::new(FakeConnector(reg.clone())),
            tmp.path().join("dirs"),
        )
        .unwrap();
        (tmp, svc, reg)
    }

    fn req<'a>(image: &'a str, policy: &'a str) -> ImageRequest<'a> {
        ImageRequest {
            image,
            policy: Some(policy),
            namespace: "ns",
            pull_secrets: vec![],
            pod_uid: "uid-1",
        }
    }

    /// Resolves until the answer is not `ContainerCreating` (the background pull finished).
    async fn settle(svc: &ImageService, r: &ImageRequest<'_>) -> Result<Resolved, ImageError> {
        for _ in 0..500 {
            match svc.resolve(r) {
                Err(ImageError::Pulling { .. }) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                other => return other,
            }
        }
        panic!("pull did not finish");
    }

    #[tokio::test]
    async fn a_missing_image_is_pulled_in_the_background_then_resolved_with_its_digest() {
        let (_t, svc, reg) = service();
        let id = reg.publish("v1", &[tar_of(&[("bin/", None), ("bin/app", Some(b"x"))])]);
        let r = req("reg.example/app:v1", "IfNotPresent");
        assert_eq!(svc.resolve(&r).unwrap_err().reason(), "ContainerCreating");
        let got = settle(&svc, &r).await.unwrap();
        assert_eq!(got.image_id, format!("reg.example/app@{id}"));
        assert!(got.dir.join("rootfs/bin/app").is_file());
        assert_eq!(svc.image_id("reg.example/app:v1"), Some(got.image_id));
    }

    #[tokio::test]
    async fn a_failed_pull_is_reported_once_then_backs_off() {
        let (_t, svc, reg) = service();
        let r = req("reg.example/app:missing", "IfNotPresent");
        let first = settle(&svc, &r).await.unwrap_err();
        assert_eq!(first.reason(), "ErrImagePull", "{first}");
        let second = svc.resolve(&r).unwrap_err();
        assert_eq!(second.reason(), "ImagePullBackOff", "{second}");
        // Publishing the tag does not cut the back-off short...
        reg.publish("missing", &[tar_of(&[("a", Some(b"1"))])]);
        assert_eq!(svc.resolve(&r).unwrap_err().reason(), "ImagePullBackOff");
    }

    #[tokio::test]
    async fn never_runs_only_what_is_already_here() {
        let (_t, svc, reg) = service();
        reg.publish("v1", &[tar_of(&[("a", Some(b"1"))])]);
        let never = req("reg.example/app:v1", "Never");
        assert_eq!(
            svc.resolve(&never).unwrap_err().reason(),
            "ErrImageNeverPull"
        );
        settle(&svc, &req("reg.example/app:v1", "IfNotPresent"))
            .await
            .unwrap();
        assert!(svc.resolve(&never).is_ok());
    }

    #[tokio::test]
    async fn invalid_names_and_disabled_pulls_have_their_own_reasons() {
        let (_t, svc, _) = service();
        assert_eq!(
            svc.resolve(&req("Bad Name", "Always"))
                .unwrap_err()
                .reason(),
            "InvalidImageName"
        );
        let off = ImageService::disabled(PathBuf::from("/images"));
        assert_eq!(
            off.resolve(&req("reg.example/app:v1", "Always"))
                .unwrap_err()
                .reason(),
            "ErrImageNeverPull"
        );
    }
}
