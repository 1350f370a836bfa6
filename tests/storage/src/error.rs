//! Error enums of the library modules, one per module, with context.

use std::path::PathBuf;

/// A data-path frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The body ended early.
    #[error("frame truncated at byte {at}")]
    Truncated {
        /// Position where more bytes were expected.
        at: usize,
    },
    /// The body has bytes after the last field.
    #[error("{extra} trailing bytes after the message")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// Unknown request opcode.
    #[error("unknown request op {op}")]
    UnknownOp {
        /// The opcode.
        op: u8,
    },
    /// Unknown response status.
    #[error("unknown response status {status}")]
    UnknownStatus {
        /// The status byte.
        status: u8,
    },
    /// A string field is not UTF-8.
    #[error("string field is not UTF-8")]
    NotUtf8,
    /// A frame is larger than allowed.
    #[error("frame of {len} bytes exceeds the {max} byte limit")]
    FrameTooLarge {
        /// Announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Storing or loading a volume failed.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The volume name is not acceptable.
    #[error("invalid volume name {name:?}: must be 1..=63 of [a-z0-9-]")]
    InvalidName {
        /// The name.
        name: String,
    },
    /// No such volume.
    #[error("unknown volume {name:?}")]
    Unknown {
        /// The name.
        name: String,
    },
    /// File I/O failed.
    #[error("volume {name}: I/O on {path}")]
    Io {
        /// Volume name.
        name: String,
        /// File involved.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Loading or persisting the firewall state failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// File I/O failed.
    #[error("state file {path}: I/O")]
    Io {
        /// File involved.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The state file is not valid JSON of the expected shape.
    #[error("state file {path}: corrupt")]
    Corrupt {
        /// File involved.
        path: PathBuf,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
}

/// Starting or running the server failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The state directory could not be prepared.
    #[error(transparent)]
    State(#[from] StateError),
    /// A volume could not be loaded.
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// TLS material is unusable.
    #[error("TLS {what}: {reason}")]
    Tls {
        /// Which material.
        what: String,
        /// Why.
        reason: String,
    },
    /// Binding or accepting failed.
    #[error("listener {addr}: I/O")]
    Listen {
        /// The address.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A data-path client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting, sending or receiving failed (the write may or may not have been stored,
    /// but it was not acknowledged).
    #[error("data path to {server}: I/O")]
    Io {
        /// Server address.
        server: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The server closed the connection (for example because the client was fenced).
    #[error("data path to {server}: connection closed by server")]
    Closed {
        /// Server address.
        server: String,
    },
    /// The response could not be decoded.
    #[error("data path to {server}: bad response")]
    Protocol {
        /// Server address.
        server: String,
        /// Cause.
        #[source]
        source: ProtocolError,
    },
    /// The server refused the request.
    #[error("server refused: {code:?}: {message}")]
    Refused {
        /// Reason code.
        code: crate::protocol::ErrorCode,
        /// Detail.
        message: String,
    },
    /// The server answered with a response of the wrong kind.
    #[error("data path to {server}: unexpected response")]
    Unexpected {
        /// Server address.
        server: String,
    },
}

/// An admin API client call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// TLS or client construction failed.
    #[error("admin client setup: {reason}")]
    Setup {
        /// Why.
        reason: String,
    },
    /// The request failed in transport.
    #[error("admin {op}: transport")]
    Transport {
        /// Operation.
        op: String,
        /// Cause.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("admin {op}: HTTP {status}: {body}")]
    Http {
        /// Operation.
        op: String,
        /// HTTP status.
        status: u16,
        /// Body.
        body: String,
    },
}

/// Reading logs for the checker failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// File I/O.
    #[error("log {path}: I/O")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A line of an ack log is not valid.
    #[error("ack log {path} line {line}: invalid")]
    BadAck {
        /// File.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
}

/// The lab attacher failed to reconcile a VolumeAttachment.
#[derive(Debug, thiserror::Error)]
pub enum AttacherError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {context}")]
    Kube {
        /// What was being done.
        context: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The storage admin API call failed.
    #[error("storage admin API: {context}")]
    Storage {
        /// What was being done.
        context: String,
        /// Cause.
        #[source]
        source: AdminError,
    },
    /// The attachment or PV is not one this attacher can handle.
    #[error("attachment {name}: {reason}")]
    Invalid {
        /// VolumeAttachment name.
        name: String,
        /// Why.
        reason: String,
    },
}
