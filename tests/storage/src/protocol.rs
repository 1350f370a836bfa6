//! The data-path wire format (sans-IO): length-prefixed binary frames.
//!
//! Every frame is `u32 length (big endian) | body`. A request body is
//! `u8 op | u16 volume length | volume | op fields`:
//! - `op 1` APPEND: `u32 payload length | payload`;
//! - `op 2` READ: `u64 from offset | u32 max records`.
//!
//! A response body is `u8 status | fields`:
//! - `status 0` APPENDED: `u64 offset` (the record's index in the volume);
//! - `status 1` RECORDS: `u32 count | count × (u64 offset | u64 server time ms | u16 client
//!   length | client | u32 payload length | payload)`;
//! - `status ≥ 16` an error (see [`ErrorCode`]): `u16 message length | message`.

use crate::error::ProtocolError;

/// Largest frame either side accepts. Bigger frames are refused and the connection is closed,
/// because the stream cannot be resynchronised without reading the whole frame.
pub const MAX_FRAME: usize = 4 << 20;
/// Largest record payload the server stores; bigger records get [`ErrorCode::TooLarge`].
pub const MAX_RECORD: usize = 64 << 10;
/// Largest number of records returned by one READ.
pub const MAX_READ: u32 = 4096;

const OP_APPEND: u8 = 1;
const OP_READ: u8 = 2;
const ST_APPENDED: u8 = 0;
const ST_RECORDS: u8 = 1;

/// A client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Append one record to a volume.
    Append {
        /// Volume name.
        volume: String,
        /// Opaque record bytes.
        payload: Vec<u8>,
    },
    /// Read records starting at an offset.
    Read {
        /// Volume name.
        volume: String,
        /// First offset to return.
        from: u64,
        /// At most this many records (capped at [`MAX_READ`]).
        max: u32,
    },
}

/// Why the server refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The client's address is not granted write access to the volume.
    Denied = 16,
    /// The client's address is blocked by the storage firewall (fenced).
    Blocked = 17,
    /// The volume does not exist.
    UnknownVolume = 18,
    /// The record is larger than [`MAX_RECORD`] (or the frame larger than [`MAX_FRAME`]).
    TooLarge = 19,
    /// The request could not be decoded.
    Malformed = 20,
    /// The server failed to store the record (I/O error); nothing was acknowledged.
    Internal = 21,
}

impl ErrorCode {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            16 => ErrorCode::Denied,
            17 => ErrorCode::Blocked,
            18 => ErrorCode::UnknownVolume,
            19 => ErrorCode::TooLarge,
            20 => ErrorCode::Malformed,
            21 => ErrorCode::Internal,
            _ => return None,
        })
    }
}

/// A record as stored by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// Index of the record in its volume (0-based, dense).
    pub offset: u64,
    /// Server wall-clock time of acceptance, milliseconds since the Unix epoch.
    pub server_ms: u64,
    /// The client address that wrote it.
    pub client: String,
    /// The record bytes.
    pub payload: Vec<u8>,
}

/// A server response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The record is durable at this offset.
    Appended {
        /// The record's offset.
        offset: u64,
    },
    /// Records read.
    Records(Vec<StoredRecord>),
    /// The request was refused; nothing was stored.
    Error {
        /// Machine-readable reason.
        code: ErrorCode,
        /// Human-readable detail.
        message: String,
    },
}

/// Prefixes a body with its length.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

/// A bounds-checked reader over a frame body.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or(ProtocolError::Truncated { at: self.pos })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, ProtocolError> {
        Ok(u16::from_be_bytes([self.u8()?, self.u8()?]))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, ProtocolError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, ProtocolError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    pub(crate) fn string(&mut self) -> Result<String, ProtocolError> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| ProtocolError::NotUtf8)
    }
    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, ProtocolError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    pub(crate) fn finish(&self) -> Result<(), ProtocolError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(ProtocolError::TrailingBytes {
                extra: self.buf.len() - self.pos,
            })
        }
    }
}

impl Request {
    /// Encodes the request as a frame body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Request::Append { volume, payload } => {
                out.push(OP_APPEND);
                put_str(&mut out, volume);
                put_bytes(&mut out, payload);
            }
            Request::Read { volume, from, max } => {
                out.push(OP_READ);
                put_str(&mut out, volume);
                out.extend_from_slice(&from.to_be_bytes());
                out.extend_from_slice(&max.to_be_bytes());
            }
        }
        out
    }

    /// Decodes a frame body.
    pub fn decode(body: &[u8]) -> Result<Self, ProtocolError> {
        let mut c = Cursor::new(body);
        let req = match c.u8()? {
            OP_APPEND => Request::Append {
                volume: c.string()?,
                payload: c.bytes()?,
            },
            OP_READ => Request::Read {
                volume: c.string()?,
                from: c.u64()?,
                max: c.u32()?,
            },
            op => return Err(ProtocolError::UnknownOp { op }),
        };
        c.finish()?;
        Ok(req)
    }
}

impl StoredRecord {
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.server_ms.to_be_bytes());
        put_str(out, &self.client);
        put_bytes(out, &self.payload);
    }

    pub(crate) fn decode_from(c: &mut Cursor<'_>) -> Result<Self, ProtocolError> {
        Ok(StoredRecord {
            offset: c.u64()?,
            server_ms: c.u64()?,
            client: c.string()?,
            payload: c.bytes()?,
        })
    }
}

impl Response {
    /// Builds an error response.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Response::Error {
            code,
            message: message.into(),
        }
    }

    /// Encodes the response as a frame body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Response::Appended { offset } => {
                out.push(ST_APPENDED);
                out.extend_from_slice(&offset.to_be_bytes());
            }
            Response::Records(records) => {
                out.push(ST_RECORDS);
                out.extend_from_slice(&(records.len() as u32).to_be_bytes());
                for r in records {
                    r.encode_into(&mut out);
                }
            }
            Response::Error { code, message } => {
                out.push(*code as u8);
                let mut m = message.clone();
                m.truncate(1024);
                put_str(&mut out, &m);
            }
        }
        out
    }

    /// Decodes a frame body.
    pub fn decode(body: &[u8]) -> Result<Self, ProtocolError> {
        let mut c = Cursor::new(body);
        let resp = match c.u8()? {
            ST_APPENDED => Response::Appended { offset: c.u64()? },
            ST_RECORDS => {
                let n = c.u32()?;
                let mut records = Vec::with_capacity(n.min(MAX_READ) as usize);
                for _ in 0..n {
                    records.push(StoredRecord::decode_from(&mut c)?);
                }
                Response::Records(records)
            }
            st => {
                let code =
                    ErrorCode::from_u8(st).ok_or(ProtocolError::UnknownStatus { status: st })?;
                Response::Error {
                    code,
                    message: c.string()?,
                }
            }
        };
        c.finish()?;
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_request_golden_bytes() {
        let req = Request::Append {
            volume: "v1".into(),
            payload: b"hi".to_vec(),
        };
        let body = req.encode();
        assert_eq!(body, [1, 0, 2, b'v', b'1', 0, 0, 0, 2, b'h', b'i']);
        assert_eq!(frame(&body)[..4], [0, 0, 0, 11]);
        assert_eq!(Request::decode(&body).unwrap(), req);
    }

    #[test]
    fn responses_round_trip() {
        for resp in [
            Response::Appended { offset: 42 },
            Response::Records(vec![StoredRecord {
                offset: 7,
                server_ms: 1_700_000_000_000,
                client: "10.213.0.11".into(),
                payload: b"{}".to_vec(),
            }]),
            Response::error(ErrorCode::Blocked, "fenced"),
        ] {
            assert_eq!(Response::decode(&resp.encode()).unwrap(), resp);
        }
        assert_eq!(
            Response::Appended { offset: 1 }.encode(),
            [0, 0, 0, 0, 0, 0, 0, 0, 1]
        );
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        assert!(Request::decode(&[]).is_err());
        assert!(Request::decode(&[9]).is_err());
        assert!(Request::decode(&[1, 0, 200, b'a']).is_err());
        assert!(Request::decode(&[1, 0, 1, b'a', 0xff, 0xff, 0xff, 0xff]).is_err());
        let mut body = Request::Read {
            volume: "v".into(),
            from: 0,
            max: 1,
        }
        .encode();
        body.push(0);
        assert!(matches!(
            Request::decode(&body),
            Err(ProtocolError::TrailingBytes { extra: 1 })
        ));
        assert!(Response::decode(&[99]).is_err());
        assert!(Response::decode(&[1, 0xff, 0xff, 0xff, 0xff]).is_err());
    }
}
