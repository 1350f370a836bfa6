//! The controller's error type: which object or device, and whether a retry may help.

/// An error of one controller operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API server request failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done (object and verb).
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A fencing device could not be built or used.
    #[error("device {device}: {message}")]
    Device {
        /// Device URL.
        device: String,
        /// What went wrong (never contains a credential).
        message: String,
    },
    /// A credential Secret could not be read.
    #[error("secret {namespace}/{name}: cannot read")]
    Secret {
        /// Secret namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// We are not the leader (or our token is stale): nothing may be done.
    #[error("not the leader (token {token:?}): refusing to act")]
    NotLeader {
        /// Our token, if any.
        token: Option<i64>,
    },
    /// The `NodeFence` status refused a mutation (a bug or a hand-edited status).
    #[error("nodefence {name}: {source}")]
    Status {
        /// NodeFence name.
        name: String,
        /// The refused mutation.
        #[source]
        source: palisade_model::nodefence::StatusError,
    },
    /// Anything else that is a configuration problem.
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// Wraps a kube error with context.
    pub fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            what: what.into(),
            source,
        }
    }

    /// Whether the error is an HTTP 409 Conflict (someone else wrote first).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Kube { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// Whether a kube error is a 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}
