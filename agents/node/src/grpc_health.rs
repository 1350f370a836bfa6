//! gRPC probes: the `grpc.health.v1.Health/Check` call over HTTP/2 cleartext (h2c with prior
//! knowledge, as the kubelet's gRPC prober dials with insecure credentials).
//!
//! The protobuf messages are tiny, so they are encoded by hand rather than pulling in a
//! protobuf and gRPC stack:
//! - `HealthCheckRequest { string service = 1; }`
//! - `HealthCheckResponse { ServingStatus status = 1; }` with `UNKNOWN = 0, SERVING = 1,
//!   NOT_SERVING = 2, SERVICE_UNKNOWN = 3`.
//!
//! Each gRPC message travels in a 5-byte frame (compressed flag, big-endian length); the
//! call's outcome is the `grpc-status` trailer (or header, for a trailers-only response).

use std::net::IpAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::probe_outcome::ProbeOutcome;

/// The path of the health check method.
pub const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// `HealthCheckResponse.ServingStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServingStatus {
    /// `UNKNOWN` (0).
    Unknown,
    /// `SERVING` (1).
    Serving,
    /// `NOT_SERVING` (2).
    NotServing,
    /// `SERVICE_UNKNOWN` (3).
    ServiceUnknown,
    /// A value this agent does not know.
    Other(u64),
}

impl ServingStatus {
    fn from_u64(v: u64) -> Self {
        match v {
            0 => ServingStatus::Unknown,
            1 => ServingStatus::Serving,
            2 => ServingStatus::NotServing,
            3 => ServingStatus::ServiceUnknown,
            v => ServingStatus::Other(v),
        }
    }

    /// The enum's name in the proto.
    pub fn name(self) -> String {
        match self {
            ServingStatus::Unknown => "UNKNOWN".into(),
            ServingStatus::Serving => "SERVING".into(),
            ServingStatus::NotServing => "NOT_SERVING".into(),
            ServingStatus::ServiceUnknown => "SERVICE_UNKNOWN".into(),
            ServingStatus::Other(v) => v.to_string(),
        }
    }

    /// The wire value.
    pub fn value(self) -> u64 {
        match self {
            ServingStatus::Unknown => 0,
            ServingStatus::Serving => 1,
            ServingStatus::NotServing => 2,
            ServingStatus::ServiceUnknown => 3,
            ServingStatus::Other(v) => v,
        }
    }
}

fn put_varint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

fn get_varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Wraps a protobuf message in a gRPC frame (uncompressed).
pub fn frame(msg: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + msg.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(msg.len()).unwrap_or(u32::MAX));
    out.put_slice(msg);
    out.freeze()
}

/// The framed `HealthCheckRequest` for `service` (an empty service asks about the server).
pub fn encode_request(service: &str) -> Bytes {
    let mut msg = BytesMut::new();
    if !service.is_empty() {
        msg.put_u8(0x0a); // field 1, length-delimited
        put_varint(&mut msg, service.len() as u64);
        msg.put_slice(service.as_bytes());
    }
    frame(&msg)
}

/// The framed `HealthCheckResponse` with `status` (used by test servers).
pub fn encode_response(status: ServingStatus) -> Bytes {
    let mut msg = BytesMut::new();
    if status.value() != 0 {
        msg.put_u8(0x08); // field 1, varint
        put_varint(&mut msg, status.value());
    }
    frame(&msg)
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

/// Decodes a `HealthCheckRequest` message (not framed): the service name.
pub fn decode_request(msg: &[u8]) -> Result<String, String> {
    let mut service = String::new();
    walk(msg, |field, value| {
        if let (1, Field::Bytes(b)) = (field, value) {
            service = String::from_utf8_lossy(b).into_owned();
        }
    })?;
    Ok(service)
}

/// Decodes a `HealthCheckResponse` message (not framed), skipping unknown fields.
pub fn decode_response(msg: &[u8]) -> Result<ServingStatus, String> {
    let mut status = 0;
    walk(msg, |field, value| {
        if let (1, Field::Varint(v)) = (field, value) {
            status = v;
        }
    })?;
    Ok(ServingStatus::from_u64(status))
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn walk<'a>(msg: &'a [u8], mut f: impl FnMut(u64, Field<'a>)) -> Result<(), String> {
    let bad = || "malformed protobuf message".to_string();
    let mut i = 0;
    while i < msg.len() {
        let key = get_varint(msg, &mut i).ok_or_else(bad)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => f(
                field,
                Field::Varint(get_varint(msg, &mut i).ok_or_else(bad)?),
            ),
            1 | 5 => {
                i += if wire == 1 { 8 } else { 4 };
                if i > msg.len() {
                    return Err(bad());
                }
                f(field, Field::Fixed);
            }
            2 => {
                let len =
                    usize::try_from(get_varint(msg, &mut i).ok_or_else(bad)?).map_err(|_| bad())?;
                let end = i
                    .checked_add(len)
                    .filter(|e| *e <= msg.len())
                    .ok_or_else(bad)?;
                f(field, Field::Bytes(&msg[i..end]));
                i = end;
            }
            _ => return Err(bad()),
        }
    }
    Ok(())
}

/// The gRPC status code names the kubelet prints.
fn code_name(code: u32) -> &'static str {
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

enum CallError {
    Connect(String),
    Rpc(String),
}

/// One Check call; the status, or why there is none.
async fn call(host: IpAddr, port: u16, service: &str) -> Result<ServingStatus, CallError> {
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| CallError::Connect(e.to_string()))?;
    let (client, conn) = h2::client::handshake(tcp)
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
            .uri(format!("http://{host}:{port}{CHECK_PATH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", "kube-probe/palisade")
            .body(())
            .map_err(|e| CallError::Rpc(e.to_string()))?;
        let (resp, mut send) = client.send_request(req, false).map_err(rpc)?;
        send.send_data(encode_request(service), true).map_err(rpc)?;
        let resp = resp.await.map_err(rpc)?;
        if resp.status() != http::StatusCode::OK {
            return Err(CallError::Rpc(format!("HTTP status {}", resp.status())));
        }
        let (parts, mut body) = resp.into_parts();
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(rpc)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            buf.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.map_err(rpc)?;
        let (code, msg) = trailers
            .as_ref()
            .and_then(grpc_status)
            .or_else(|| grpc_status(&parts.headers))
            .ok_or_else(|| CallError::Rpc("response without grpc-status".into()))?;
        if code != 0 {
            return Err(CallError::Rpc(if code == 12 {
                format!(
                    "this server does not implement the grpc health protocol (grpc.health.v1.Health): {msg}"
                )
            } else {
                format!("rpc error: code = {} desc = {msg}", code_name(code))
            }));
        }
        let (msg, _) = unframe(&buf).map_err(CallError::Rpc)?;
        decode_response(msg).map_err(CallError::Rpc)
    }
    .await;
    conn.abort();
    res
}

/// Runs a grpc probe: success when `Check(service)` answers `SERVING` within `timeout`.
pub async fn check(
    host: IpAddr,
    port: u16,
    service: Option<&str>,
    timeout: Duration,
) -> ProbeOutcome {
    let service = service.unwrap_or_default();
    match tokio::time::timeout(timeout, call(host, port, service)).await {
        Ok(Ok(ServingStatus::Serving)) => ProbeOutcome::Success,
        Ok(Ok(s)) => {
            ProbeOutcome::Failure(format!("service unhealthy (responded with {:?})", s.name()))
        }
        Ok(Err(CallError::Connect(e))) => ProbeOutcome::Failure(format!(
            "failed to connect service \"{host}:{port}\" within {timeout:?}: {e}"
        )),
        Ok(Err(CallError::Rpc(e))) => ProbeOutcome::Failure(e),
        Err(_) => ProbeOutcome::Failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_response_golden_bytes() {
        assert_eq!(&encode_request("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(
            &encode_request("svc")[..],
            &[0, 0, 0, 0, 5, 0x0a, 3, b's', b'v', b'c']
        );
        assert_eq!(
            &encode_response(ServingStatus::Serving)[..],
            &[0, 0, 0, 0, 2, 0x08, 1]
        );
        assert_eq!(
            &encode_response(ServingStatus::NotServing)[..],
            &[0, 0, 0, 0, 2, 0x08, 2]
        );
        // A long service name needs a two-byte length varint.
        let long = "s".repeat(200);
        let b = encode_request(&long);
        assert_eq!(&b[5..8], &[0x0a, 0xc8, 0x01]);
        let (msg, rest) = unframe(&b).unwrap();
        assert!(rest.is_empty());
        assert_eq!(decode_request(msg).unwrap(), long);
    }

    #[test]
    fn decoding_skips_unknown_fields_and_rejects_garbage() {
        // field 2 (bytes "x"), field 3 (fixed32), then field 1 = 2.
        let msg = [0x12, 1, b'x', 0x1d, 0, 0, 0, 0, 0x08, 2];
        assert_eq!(decode_response(&msg).unwrap(), ServingStatus::NotServing);
        assert_eq!(decode_response(&[]).unwrap(), ServingStatus::Unknown);
        assert!(decode_response(&[0x08]).is_err());
        assert!(decode_response(&[0x12, 5, 1]).is_err());
        assert!(unframe(&[0, 0, 0, 0, 9, 1]).is_err());
        assert!(unframe(&[1, 0, 0, 0, 0]).is_err());
    }
}
