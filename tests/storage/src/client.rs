//! Data-path client used by the writer, the checker and the tests.

use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpSocket, TcpStream};

use crate::error::ClientError;
use crate::framing::{read_frame, write_frame, FrameRead};
use crate::protocol::{Request, Response, StoredRecord, MAX_READ};

/// One connection to the data path.
#[derive(Debug)]
pub struct DataClient {
    server: SocketAddr,
    stream: TcpStream,
}

impl DataClient {
    /// Connects, optionally from a given local address (a loopback alias stands for a node in
    /// tests that run without network namespaces).
    pub async fn connect(server: SocketAddr, source: Option<IpAddr>) -> Result<Self, ClientError> {
        let io = |source| ClientError::Io {
            server: server.to_string(),
            source,
        };
        let stream = match source {
            None => TcpStream::connect(server).await.map_err(io)?,
            Some(src) => {
                let sock = if src.is_ipv4() {
                    TcpSocket::new_v4()
                } else {
                    TcpSocket::new_v6()
                }
                .map_err(io)?;
                sock.bind(SocketAddr::new(src, 0)).map_err(io)?;
                sock.connect(server).await.map_err(io)?
            }
        };
        let _ = stream.set_nodelay(true);
        Ok(DataClient { server, stream })
    }

    async fn call(&mut self, req: &Request) -> Result<Response, ClientError> {
        let server = self.server.to_string();
        write_frame(&mut self.stream, &req.encode())
            .await
            .map_err(|source| ClientError::Io {
                server: server.clone(),
                source,
            })?;
        match read_frame(&mut self.stream).await {
            Ok(FrameRead::Frame(body)) => {
                Response::decode(&body).map_err(|source| ClientError::Protocol { server, source })
            }
            Ok(FrameRead::Eof) => Err(ClientError::Closed { server }),
            Ok(FrameRead::TooLarge(len)) => Err(ClientError::Protocol {
                server,
                source: crate::error::ProtocolError::FrameTooLarge {
                    len,
                    max: crate::protocol::MAX_FRAME,
                },
            }),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                Err(ClientError::Closed { server })
            }
            Err(source) => Err(ClientError::Io { server, source }),
        }
    }

    /// Appends a record; `Ok(offset)` means it is durable on the server.
    pub async fn append(&mut self, volume: &str, payload: Vec<u8>) -> Result<u64, ClientError> {
        let req = Request::Append {
            volume: volume.to_owned(),
            payload,
        };
        match self.call(&req).await? {
            Response::Appended { offset } => Ok(offset),
            Response::Error { code, message } => Err(ClientError::Refused { code, message }),
            Response::Records(_) => Err(ClientError::Unexpected {
                server: self.server.to_string(),
            }),
        }
    }

    /// Reads up to `max` records from `from`.
    pub async fn read(
        &mut self,
        volume: &str,
        from: u64,
        max: u32,
    ) -> Result<Vec<StoredRecord>, ClientError> {
        let req = Request::Read {
            volume: volume.to_owned(),
            from,
            max,
        };
        match self.call(&req).await? {
            Response::Records(r) => Ok(r),
            Response::Error { code, message } => Err(ClientError::Refused { code, message }),
            Response::Appended { .. } => Err(ClientError::Unexpected {
                server: self.server.to_string(),
            }),
        }
    }

    /// Reads a whole volume.
    pub async fn read_all(&mut self, volume: &str) -> Result<Vec<StoredRecord>, ClientError> {
        let mut out = Vec::new();
        loop {
            let batch = self.read(volume, out.len() as u64, MAX_READ).await?;
            if batch.is_empty() {
                return Ok(out);
            }
            out.extend(batch);
        }
    }

    /// Sends raw bytes (for malformed-input tests) and reads one response frame.
    pub async fn raw(&mut self, bytes: &[u8]) -> Result<FrameRead, ClientError> {
        use tokio::io::AsyncWriteExt;
        let io = |source| ClientError::Io {
            server: self.server.to_string(),
            source,
        };
        self.stream.write_all(bytes).await.map_err(io)?;
        read_frame(&mut self.stream).await.map_err(io)
    }
}
