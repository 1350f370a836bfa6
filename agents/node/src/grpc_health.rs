//! gRPC probes: the `grpc.health.v1.Health/Check` call over HTTP/2 cleartext (h2c with prior
//! knowledge, as the kubelet's gRPC prober dials with insecure credentials).
//!
//! The protobuf messages are tiny, so they are encoded by hand rather than pulling in a
//! protobuf and gRPC stack:
//! - `HealthCheckRequest { string service = 1; }`
//! - `HealthCheckResponse { ServingStatus status = 1; }` with `UNKNOWN = 0, SERVING = 1,
//!   NOT_SERVING = 2, SERVICE_UNKNOWN = 3`.
//!
//! The call itself (framing, trailers) is [`crate::grpc::unary`].

use std::net::IpAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::grpc::{self, CallError};
pub use crate::grpc::{frame, unframe};

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

/// The `HealthCheckRequest` message for `service`, not framed (an empty service asks about
/// the server).
fn request_message(service: &str) -> BytesMut {
    let mut msg = BytesMut::new();
    if !service.is_empty() {
        msg.put_u8(0x0a); // field 1, length-delimited
        put_varint(&mut msg, service.len() as u64);
        msg.put_slice(service.as_bytes());
    }
    msg
}

/// The framed `HealthCheckRequest` for `service` (an empty service asks about the server).
pub fn encode_request(service: &str) -> Bytes {
    frame(&request_message(service))
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

/// One Check call; the status, or why there is none.
async fn call(host: IpAddr, port: u16, service: &str) -> Result<ServingStatus, CallError> {
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| CallError::Connect(e.to_string()))?;
    let uri = format!("http://{host}:{port}{CHECK_PATH}");
    let msg = match grpc::unary(tcp, &uri, "kube-probe/palisade", &request_message(service)).await {
        Err(CallError::Status { code: 12, message }) => {
            return Err(CallError::Rpc(format!(
                "this server does not implement the grpc health protocol (grpc.health.v1.Health): {message}"
            )))
        }
        r => r?,
    };
    decode_response(&msg).map_err(CallError::Rpc)
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
        Ok(Err(e)) => ProbeOutcome::Failure(e.to_string()),
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
