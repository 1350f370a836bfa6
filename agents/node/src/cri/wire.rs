//! The messages of the CRI (`runtime.v1.RuntimeService`, `k8s.io/cri-api`) that the companion
//! sends and reads, with the CRI's own field numbers. Only the fields Palisade reads are
//! declared; protobuf skips the others, so a newer runtime's additions are harmless.
//!
//! Enumerations are kept as their wire value (`i32`): a value this code does not know is
//! judged by the caller (as live, for a state), never mapped to a default.

use std::collections::HashMap;

/// `VersionRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    /// The kubelet's CRI API version.
    #[prost(string, tag = "1")]
    pub version: String,
}

/// `VersionResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    /// The runtime's version of the kubelet API.
    #[prost(string, tag = "1")]
    pub version: String,
    /// Name of the runtime (`containerd`).
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    /// Version of the runtime.
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    /// The CRI API version the runtime serves (`v1`).
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

/// `PodSandboxMetadata`: the pod a sandbox belongs to.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Pod UID.
    #[prost(string, tag = "2")]
    pub uid: String,
    /// Pod namespace.
    #[prost(string, tag = "3")]
    pub namespace: String,
    /// Attempt number of the sandbox.
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

/// `PodSandboxState`: `SANDBOX_READY`.
pub const SANDBOX_READY: i32 = 0;
/// `PodSandboxState`: `SANDBOX_NOTREADY`.
pub const SANDBOX_NOTREADY: i32 = 1;

/// `PodSandbox`, as listed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    /// Sandbox ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The pod.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    /// `PodSandboxState`.
    #[prost(int32, tag = "3")]
    pub state: i32,
    /// Labels (the kubelet's `io.kubernetes.pod.uid` among them).
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
}

/// `ListPodSandboxRequest` (no filter: every sandbox).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {}

/// `ListPodSandboxResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    /// The sandboxes.
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
    /// A page token from a runtime that paginates (a proposal; Palisade never asks for
    /// pages, so a non-empty token means the runtime left sandboxes out).
    #[prost(string, tag = "2")]
    pub next_page_token: String,
}

/// `ContainerMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    /// Container name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Attempt number.
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

/// `ContainerState`: `CONTAINER_CREATED`.
pub const CONTAINER_CREATED: i32 = 0;
/// `ContainerState`: `CONTAINER_RUNNING`.
pub const CONTAINER_RUNNING: i32 = 1;
/// `ContainerState`: `CONTAINER_EXITED`.
pub const CONTAINER_EXITED: i32 = 2;
/// `ContainerState`: `CONTAINER_UNKNOWN`.
pub const CONTAINER_UNKNOWN: i32 = 3;

/// `Container`, as listed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    /// Container ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The sandbox it runs in.
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    /// Name and attempt.
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<ContainerMetadata>,
    /// `ContainerState`.
    #[prost(int32, tag = "6")]
    pub state: i32,
    /// Labels (the kubelet's `io.kubernetes.pod.uid` among them).
    #[prost(map = "string, string", tag = "8")]
    pub labels: HashMap<String, String>,
}

/// `ListContainersRequest` (no filter: every container).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersRequest {}

/// `ListContainersResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    /// The containers.
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
    /// As [`ListPodSandboxResponse::next_page_token`].
    #[prost(string, tag = "2")]
    pub next_page_token: String,
}

/// `StopContainerRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StopContainerRequest {
    /// Container ID.
    #[prost(string, tag = "1")]
    pub container_id: String,
    /// Seconds to wait after the stop signal before `SIGKILL`; 0 kills at once.
    #[prost(int64, tag = "2")]
    pub timeout: i64,
}

/// `StopPodSandboxRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StopPodSandboxRequest {
    /// Sandbox ID.
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// `StopContainerResponse`, `StopPodSandboxResponse` and other empty responses.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}
