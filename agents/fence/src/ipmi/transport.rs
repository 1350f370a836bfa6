//! UDP exchanges with a BMC: send, wait for a matching datagram, retransmit a bounded number
//! of times. Garbage is skipped but remembered, so a responder that only sends garbage gives a
//! protocol error rather than a timeout.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;

use crate::error::FenceError;

/// What the acceptor thinks of a received datagram.
pub(crate) enum Verdict<T> {
    /// The answer we were waiting for.
    Accept(T),
    /// A valid datagram for something else (a late reply to a retransmission): ignore.
    Ignore,
    /// Undecodable: ignore, but report if nothing valid arrives.
    Garbage(String),
}

/// A connected UDP socket to one BMC.
#[derive(Clone)]
pub(crate) struct Transport {
    socket: Arc<UdpSocket>,
    device: String,
}

impl Transport {
    /// Binds an ephemeral port and connects it to the BMC.
    pub(crate) async fn connect(host: &str, port: u16, device: &str) -> Result<Self, FenceError> {
        let unreachable = |source| FenceError::Unreachable {
            device: device.to_string(),
            source,
        };
        let addr = tokio::net::lookup_host((host, port))
            .await
            .map_err(unreachable)?
            .next()
            .ok_or_else(|| {
                unreachable(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no address",
                ))
            })?;
        let bind: std::net::SocketAddr = if addr.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        let socket = UdpSocket::bind(bind).await.map_err(unreachable)?;
        socket.connect(addr).await.map_err(unreachable)?;
        Ok(Self {
            socket: Arc::new(socket),
            device: device.to_string(),
        })
    }

    /// Device description, for errors.
    pub(crate) fn device(&self) -> &str {
        &self.device
    }

    /// Sends one datagram without waiting for an answer.
    pub(crate) async fn send_only(&self, datagram: &[u8]) {
        let _ = self.socket.send(datagram).await;
    }

    /// Sends `build()` and waits up to `timeout` for a datagram `accept` takes, `attempts`
    /// times in total. `build` is called once per attempt (so it can bump sequence numbers).
    pub(crate) async fn exchange<T>(
        &self,
        operation: &str,
        timeout: Duration,
        attempts: u32,
        mut build: impl FnMut() -> Vec<u8>,
        mut accept: impl FnMut(&[u8]) -> Verdict<T>,
    ) -> Result<T, FenceError> {
        let mut buf = vec![0u8; 2048];
        let mut garbage: Option<String> = None;
        let started = tokio::time::Instant::now();
        for _ in 0..attempts.max(1) {
            let datagram = build();
            // A send error (e.g. ECONNREFUSED from an earlier ICMP port unreachable) is a lost
            // datagram from our point of view: retransmit, and time out if it persists.
            let _ = self.socket.send(&datagram).await;
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let recv = tokio::time::timeout_at(deadline, self.socket.recv(&mut buf)).await;
                match recv {
                    Err(_) => break,
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        // ICMP port unreachable: nobody listens. Wait out this attempt.
                        tokio::time::sleep_until(deadline).await;
                        break;
                    }
                    Ok(Err(e)) => {
                        return Err(FenceError::Unreachable {
                            device: self.device.clone(),
                            source: e,
                        })
                    }
                    Ok(Ok(n)) => match accept(&buf[..n]) {
                        Verdict::Accept(t) => return Ok(t),
                        Verdict::Ignore => {}
                        Verdict::Garbage(why) => garbage = Some(why),
                    },
                }
            }
        }
        match garbage {
            Some(detail) => Err(FenceError::Protocol {
                device: self.device.clone(),
                detail: format!("{operation}: no valid answer, last datagram: {detail}"),
            }),
            None => Err(FenceError::Timeout {
                device: self.device.clone(),
                operation: operation.to_string(),
                after: started.elapsed(),
            }),
        }
    }
}
