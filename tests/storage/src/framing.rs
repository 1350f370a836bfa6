//! Async reading and writing of length-prefixed frames ([`crate::protocol`]).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::protocol::MAX_FRAME;

/// Outcome of reading one frame.
#[derive(Debug)]
pub enum FrameRead {
    /// A complete frame body.
    Frame(Vec<u8>),
    /// The peer closed the stream cleanly between frames.
    Eof,
    /// The peer announced a frame bigger than [`MAX_FRAME`]; the stream cannot continue.
    TooLarge(usize),
}

/// Reads one frame.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<FrameRead> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(FrameRead::Eof),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Ok(FrameRead::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(FrameRead::Frame(body))
}

/// Writes one frame and flushes.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, body: &[u8]) -> std::io::Result<()> {
    w.write_all(&crate::protocol::frame(body)).await?;
    w.flush().await
}
