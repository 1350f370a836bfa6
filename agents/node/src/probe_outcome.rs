//! The outcome of one probe run, shared by every probe action: the exec probes run by the pod
//! workers, the network probes of [`crate::probe`] and the gRPC health check of
//! [`crate::grpc_health`]. It sits below all of them so that they depend on it, not on each
//! other.

/// The outcome of one probe run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Succeeded.
    Success,
    /// Failed, with the reason.
    Failure(String),
    /// Could not be run at all (a bad probe spec such as an unknown named port); counts as a
    /// failure, reported as "errored" as the kubelet does.
    Error(String),
}

impl ProbeOutcome {
    /// The failure or error message, if any.
    pub fn message(&self) -> Option<&str> {
        match self {
            ProbeOutcome::Success => None,
            ProbeOutcome::Failure(m) | ProbeOutcome::Error(m) => Some(m),
        }
    }
}
