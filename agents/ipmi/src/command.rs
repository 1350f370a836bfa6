//! The [`Command`] trait: one IPMI command is a request encoder plus a response parser.

use crate::error::DecodeError;
use crate::message::{Request, Response};

/// An IPMI command sent inside a session.
pub trait Command {
    /// What a successful response decodes to.
    type Output;
    /// Network function.
    const NETFN: u8;
    /// Command number.
    const CMD: u8;
    /// Request data bytes.
    fn request_data(&self) -> Vec<u8>;
    /// Parses response data (after a zero completion code).
    fn parse(data: &[u8]) -> Result<Self::Output, DecodeError>;

    /// Builds the IPMI request with sequence number `rq_seq`.
    fn request(&self, rq_seq: u8) -> Request {
        Request {
            netfn: Self::NETFN,
            cmd: Self::CMD,
            rq_seq,
            data: self.request_data(),
        }
    }
}

/// A response parsed for a command: either its output or a non-zero completion code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// Completion code 0 and parsed data.
    Ok(T),
    /// The BMC answered with a non-zero completion code (e.g. 0xD4 insufficient privilege).
    CompletionCode(u8),
}

/// Parses `resp` as the answer to `cmd`.
pub fn parse_response<C: Command>(resp: &Response) -> Result<Outcome<C::Output>, DecodeError> {
    if resp.netfn != C::NETFN | 1 || resp.cmd != C::CMD {
        return Err(DecodeError::Mismatch("netfn/cmd"));
    }
    if resp.completion_code != 0 {
        return Ok(Outcome::CompletionCode(resp.completion_code));
    }
    C::parse(&resp.data).map(Outcome::Ok)
}
