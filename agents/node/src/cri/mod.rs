//! The container runtime of a stock node, read and stopped through its CRI API
//! (`runtime.v1.RuntimeService` over the runtime's Unix socket, as the kubelet talks to
//! containerd or CRI-O), for the companion that runs beside a stock kubelet.
//!
//! - [`CriClient`] makes one bounded unary call per request (gRPC over HTTP/2 on the socket,
//!   [`crate::grpc::unary`]) and checks that the peer is a CRI `v1` runtime before anything
//!   else is believed ([`CriClient::connect`]).
//! - [`inventory`] lists every pod sandbox and container and names the pods with something
//!   live: what a recovery answer may say about the node.
//! - [`stop`] stops the containers and sandboxes of chosen pods and lists again to confirm:
//!   the companion's self-fence.
//!
//! What the CRI cannot show is said in [`BLIND_SPOT`]: the companion never claims more.

pub mod inventory;
pub mod stop;
pub mod wire;

use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;

use crate::grpc::{self, CallError};

/// What an inventory read from the CRI cannot see. The companion says it with every
/// inventory it advertises, and the controller must not read its silence about these as proof.
pub const BLIND_SPOT: &str = "processes started outside the container runtime's CRI (by hand, \
     by a systemd unit, by another runtime or another containerd namespace) are not seen";

/// The default CRI endpoint of containerd.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// Why the runtime gave no usable answer. None of these is ever read as "nothing runs".
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The endpoint is not a `unix://` URL or an absolute socket path.
    #[error("CRI endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// As given.
        endpoint: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// No socket at the path.
    #[error("CRI socket {path}: not found (is the container runtime running?)")]
    Missing {
        /// The socket.
        path: PathBuf,
    },
    /// The socket refused the connection or HTTP/2.
    #[error("CRI socket {path}: {message}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// No answer within the call's bound.
    #[error("CRI {method}: no answer within {after:?}")]
    Timeout {
        /// The method.
        method: &'static str,
        /// The bound.
        after: Duration,
    },
    /// The runtime answered with a gRPC error.
    #[error("CRI {method}: {message}")]
    Status {
        /// The method.
        method: &'static str,
        /// The gRPC status code.
        code: u32,
        /// The call's error.
        message: String,
    },
    /// The answer is not a well-formed response (garbage, a truncated or foreign message, a
    /// peer that is not a CRI `v1` runtime, a list it says is incomplete).
    #[error("CRI {method}: malformed answer: {detail}")]
    Garbage {
        /// The method.
        method: &'static str,
        /// What was wrong.
        detail: String,
    },
}

/// A client of one runtime's CRI socket.
///
/// Guarantees: every call is bounded by the client's timeout and opens its own connection, so
/// a hung call never blocks the next one; an answer is decoded in full or refused.
#[derive(Debug, Clone)]
pub struct CriClient {
    path: PathBuf,
    timeout: Duration,
    runtime: String,
}

impl CriClient {
    /// Parses `endpoint` (`unix:///path` or `/path`), then asks the runtime its version.
    ///
    /// Guarantees: `Ok` only when the socket answered `Version` and named the `v1` CRI API.
    pub async fn connect(endpoint: &str, timeout: Duration) -> Result<Self, CriError> {
        let path = parse_endpoint(endpoint)?;
        let mut client = CriClient {
            path,
            timeout,
            runtime: String::new(),
        };
        let v: wire::VersionResponse = client
            .call(
                "Version",
                &wire::VersionRequest {
                    version: "v1".into(),
                },
            )
            .await?;
        if v.runtime_api_version != "v1" || v.runtime_name.is_empty() {
            return Err(CriError::Garbage {
                method: "Version",
                detail: format!(
                    "runtime {:?} serves CRI API {:?}, not v1",
                    v.runtime_name, v.runtime_api_version
                ),
            });
        }
        client.runtime = format!("{} {}", v.runtime_name, v.runtime_version);
        Ok(client)
    }

    /// The runtime's name and version, as it answered `Version`.
    pub fn runtime(&self) -> &str {
        &self.runtime
    }

    /// The socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One call of `runtime.v1.RuntimeService/<method>`, bounded by the client's timeout.
    pub async fn call<Q: Message, R: Message + Default>(
        &self,
        method: &'static str,
        req: &Q,
    ) -> Result<R, CriError> {
        let exchange = async {
            let io = tokio::net::UnixStream::connect(&self.path)
                .await
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        CriError::Missing {
                            path: self.path.clone(),
                        }
                    } else {
                        CriError::Connect {
                            path: self.path.clone(),
                            message: e.to_string(),
                        }
                    }
                })?;
            let uri = format!("http://localhost/runtime.v1.RuntimeService/{method}");
            grpc::unary(io, &uri, "palisade-companion", &req.encode_to_vec())
                .await
                .map_err(|e| match e {
                    CallError::Connect(message) => CriError::Connect {
                        path: self.path.clone(),
                        message,
                    },
                    CallError::Status { code, .. } => CriError::Status {
                        method,
                        code,
                        message: e.to_string(),
                    },
                    CallError::Rpc(detail) => CriError::Garbage { method, detail },
                })
        };
        let msg = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| CriError::Timeout {
                method,
                after: self.timeout,
            })??;
        R::decode(msg).map_err(|e| CriError::Garbage {
            method,
            detail: e.to_string(),
        })
    }
}

/// The socket path of a CRI endpoint: `unix:///path` or an absolute path. Anything else
/// (another scheme, a relative path, a query) is refused.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, CriError> {
    let bad = |reason| CriError::Endpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let path = match endpoint.split_once("://") {
        Some(("unix", rest)) => rest,
        Some(_) => return Err(bad("only unix:// endpoints are supported")),
        None => endpoint,
    };
    if !path.starts_with('/') {
        return Err(bad("the socket path must be absolute"));
    }
    if path.contains(['?', '#']) {
        return Err(bad("a socket path takes no query or fragment"));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests;
