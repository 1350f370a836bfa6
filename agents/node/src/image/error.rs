//! The image errors, and the one place that maps them to the kubelet's Waiting reasons.

use std::path::PathBuf;
use std::time::Duration;

/// Why a container's image is not available (yet).
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The reference cannot be parsed (`InvalidImageName`, terminal until the spec changes).
    #[error("failed to parse image name {image:?}: {reason}")]
    InvalidName {
        /// The image as written in the pod.
        image: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `imagePullPolicy: Never` and the image is not on the node (`ErrImageNeverPull`).
    #[error("container image {image:?} is not present with pull policy of Never")]
    NeverPull {
        /// The image.
        image: String,
    },
    /// Registry pulls are off (no `--registry-ca`) and the image is in no local store.
    #[error("image {image:?} not found in the local image store {} (registry pulls are disabled: no --registry-ca)", store.display())]
    NotPresent {
        /// The image.
        image: String,
        /// The directory store searched.
        store: PathBuf,
    },
    /// A pull is under way (`ContainerCreating`, as while the kubelet pulls).
    #[error("pulling image {image:?}")]
    Pulling {
        /// The image.
        image: String,
    },
    /// The last pull failed (`ErrImagePull`), reported once before the back-off.
    #[error("failed to pull image {image:?}: {source}")]
    Pull {
        /// The image.
        image: String,
        /// What went wrong.
        #[source]
        source: std::sync::Arc<PullError>,
    },
    /// Waiting before the next pull after a failure (`ImagePullBackOff`).
    #[error("Back-off pulling image {image:?} (next attempt in {}s): {source}", retry_in.as_secs())]
    BackOff {
        /// The image.
        image: String,
        /// Until the next attempt.
        retry_in: Duration,
        /// The failure that started the back-off.
        #[source]
        source: std::sync::Arc<PullError>,
    },
}

impl ImageError {
    /// The Waiting reason while the image is being pulled (the worker looks again soon).
    pub const PULLING_REASON: &'static str = "ContainerCreating";

    /// The container's Waiting reason, as the kubelet reports it.
    pub fn reason(&self) -> &'static str {
        match self {
            ImageError::InvalidName { .. } => "InvalidImageName",
            ImageError::NeverPull { .. } | ImageError::NotPresent { .. } => "ErrImageNeverPull",
            ImageError::Pulling { .. } => Self::PULLING_REASON,
            ImageError::Pull { .. } => "ErrImagePull",
            ImageError::BackOff { .. } => "ImagePullBackOff",
        }
    }
}

/// Why one pull failed. Every pull error is retried with back-off: a registry that is down,
/// a tag pushed later and credentials fixed later all heal without touching the pod.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The registry could not be reached or the connection broke.
    #[error("{url}: {source}")]
    Http {
        /// The request.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The registry refused the credentials (or there were none).
    #[error("{url}: unauthorized: {message}")]
    Unauthorized {
        /// The request.
        url: String,
        /// What the registry said.
        message: String,
    },
    /// The manifest or blob does not exist.
    #[error("{url}: not found")]
    NotFound {
        /// The request.
        url: String,
    },
    /// Any other HTTP status.
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        /// The request.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// Content does not match the digest that named it: refused, never stored.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// Which manifest, config or layer.
        what: String,
        /// The digest that named it.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// The manifest, index or config cannot be used.
    #[error("bad {what}: {message}")]
    Malformed {
        /// Which document.
        what: String,
        /// What is wrong.
        message: String,
    },
    /// The index lists no image for this node's platform.
    #[error("no linux/amd64 image in the index (it has: {available})")]
    NoPlatform {
        /// The platforms it has.
        available: String,
    },
    /// A layer could not be decompressed or unpacked.
    #[error("layer {digest}: {source}")]
    Layer {
        /// The layer.
        digest: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The `imagePullSecrets` could not be read.
    #[error("image pull secret {namespace}/{name}: {message}")]
    Secret {
        /// The pod's namespace.
        namespace: String,
        /// The secret.
        name: String,
        /// What failed.
        message: String,
    },
    /// The local store could not be written.
    #[error("image store {}: {source}", path.display())]
    Store {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The whole pull took longer than its budget.
    #[error("pull did not finish within {}s", .0.as_secs())]
    Timeout(Duration),
}

impl PullError {
    /// A store error at `path`.
    pub fn store(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> PullError {
        let path = path.into();
        move |source| PullError::Store { path, source }
    }
}
