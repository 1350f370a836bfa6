//! One unary gRPC call over HTTP/2 cleartext with prior knowledge, on any byte stream: a TCP
//! connection (gRPC probes, [`crate::grpc_health`]) or a Unix socket (the container runtime's
//! CRI API, [`crate::cri`]).
//!
//! Each gRPC message travels in a 5-byte frame (compressed flag, big-endian length); the
//! call's outcome is the `grpc-status` trailer (or header, for a trailers-only response).

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

/// Why a call has no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The HTTP/2 connection could not be set up.
    Connect(String),
    /// The exchange broke or the response is not gRPC (HTTP status, missing `grpc-status`,
    /// a truncated or compressed frame).
    Rpc(String),
    /// The server answered with a non-zero `grpc-status`.
    Status {
        /// The gRPC status code.
        code: u32,
        /// `grpc-message`.
        message: String,
    },
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Connect(e) | CallError::Rpc(e) => f.write_str(e),
            CallError::Status { code, message } => {
                write!(f, "rpc error: code = {} desc = {message}", code_name(*code))
            }
        }
    }
}

/// Wraps a protobuf message in a gRPC frame (uncompressed).
pub fn frame(msg: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + msg.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(msg.len()).unwrap_or(u32::MAX));
    out.put_slice(msg);
    out.freeze()
}

/// Parses one gRPC frame; returns the message and the bytes after it.
pub fn unframe(b: &[u8]) -> Result<(&[u8], &[u8]), String> {
    if b.len() < 5 {
        return Err(format!("truncated gRPC frame ({} bytes)", b.len()));
    }
    if b[0] != 0 {
        return Err("compressed gRPC messages are not supported".into());
    }
    let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
    let rest = &b[5..];
    if rest.len() < len {
        return Err(format!(
            "truncated gRPC message ({} of {len} bytes)",
            rest.len()
        ));
    }
    Ok(rest.split_at(len))
}

/// The gRPC status code names the kubelet prints.
pub fn code_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    NAMES.get(code as usize).copied().unwrap_or("Unknown")
}

fn grpc_status(h: &http::HeaderMap) -> Option<(u32, String)> {
    let code = h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()?;
    let msg = h
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    Some((code, msg))
}

/// The largest response this client reads (the CRI's own limit is 16 MiB).
pub const MAX_RESPONSE: usize = 16 << 20;

/// Sends `msg` (one protobuf message, not framed) to `uri` (`http://authority/service/Method`)
/// over `io` and returns the single response message (not framed).
///
/// Guarantees: an answer is returned only for `grpc-status: 0` and one complete frame; a
/// response larger than [`MAX_RESPONSE`] is an error, never truncated. The call holds the
/// connection only while it runs.
///
/// Assumptions: the caller bounds the call in time (a server that never answers is not
/// detected here).
pub async fn unary<T>(io: T, uri: &str, user_agent: &str, msg: &[u8]) -> Result<Bytes, CallError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client, conn) = h2::client::handshake(io)
        .await
        .map_err(|e| CallError::Connect(format!("HTTP/2 handshake: {e}")))?;
    // The connection future does the I/O; it ends once the client side is dropped.
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let res = async {
        let rpc = |e: h2::Error| CallError::Rpc(e.to_string());
        let mut client = client.ready().await.map_err(rpc)?;
        let req = http::Request::builder()
            .method("POST")
            .uri(uri)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", user_agent)
            .body(())
            .map_err(|e| CallError::Rpc(e.to_string()))?;
        let (resp, mut send) = client.send_request(req, false).map_err(rpc)?;
        send.send_data(frame(msg), true).map_err(rpc)?;
        let resp = resp.await.map_err(rpc)?;
        if resp.status() != http::StatusCode::OK {
            return Err(CallError::Rpc(format!("HTTP status {}", resp.status())));
        }
        let (parts, mut body) = resp.into_parts();
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(rpc)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if buf.len() + chunk.len() > MAX_RESPONSE + 5 {
                return Err(CallError::Rpc(format!(
                    "response larger than {MAX_RESPONSE} bytes"
                )));
            }
            buf.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.map_err(rpc)?;
        let (code, message) = trailers
            .as_ref()
            .and_then(grpc_status)
            .or_else(|| grpc_status(&parts.headers))
            .ok_or_else(|| CallError::Rpc("response without grpc-status".into()))?;
        if code != 0 {
            return Err(CallError::Status { code, message });
        }
        let (msg, rest) = unframe(&buf).map_err(CallError::Rpc)?;
        if !rest.is_empty() {
            return Err(CallError::Rpc(format!(
                "{} bytes after the response message of a unary call",
                rest.len()
            )));
        }
        Ok(Bytes::copy_from_slice(msg))
    }
    .await;
    conn.abort();
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        let b = frame(b"abc");
        assert_eq!(&b[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(unframe(&b).unwrap(), (&b"abc"[..], &b""[..]));
        assert!(unframe(&[0, 0, 0, 0, 9, 1]).is_err());
        assert!(unframe(&[1, 0, 0, 0, 0]).is_err());
        assert!(unframe(&[0, 0]).is_err());
        assert_eq!(code_name(12), "Unimplemented");
        assert_eq!(code_name(99), "Unknown");
    }
}
