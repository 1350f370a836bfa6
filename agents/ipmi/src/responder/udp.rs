//! A [`Bmc`] served on a UDP socket with tokio: one task per BMC, so a process can hold a
//! thousand of them.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::UdpSocket;

use super::{Bmc, Record};

/// A BMC answering on a UDP socket until it is dropped.
#[derive(Debug)]
pub struct Responder {
    addr: SocketAddr,
    bmc: Arc<Mutex<Bmc>>,
    task: tokio::task::JoinHandle<()>,
}

impl Responder {
    /// Binds `addr` (port 0: any free port) and answers every datagram on it.
    pub async fn bind(addr: SocketAddr, bmc: Bmc) -> std::io::Result<Self> {
        Self::bind_with_latency(addr, bmc, Duration::ZERO).await
    }

    /// Like [`Responder::bind`], but every answer leaves `latency` after its request arrived
    /// (an emulated distance; the socket answers one request at a time).
    pub async fn bind_with_latency(
        addr: SocketAddr,
        bmc: Bmc,
        latency: Duration,
    ) -> std::io::Result<Self> {
        let socket = UdpSocket::bind(addr).await?;
        let addr = socket.local_addr()?;
        let bmc = Arc::new(Mutex::new(bmc));
        let task = tokio::spawn(serve(socket, bmc.clone(), latency));
        Ok(Self { addr, bmc, task })
    }

    /// The address it answers on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the BMC has seen and done so far (a copy).
    pub fn record(&self) -> Record {
        self.lock().record().clone()
    }

    /// The BMC itself, to read or change (its power) while it serves.
    pub fn lock(&self) -> MutexGuard<'_, Bmc> {
        self.bmc.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(socket: UdpSocket, bmc: Arc<Mutex<Bmc>>, latency: Duration) {
    let mut buf = vec![0u8; 2048];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            // An ICMP error for an earlier answer, or a signal: the socket is still good.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(_) => return,
        };
        let reply = bmc
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .handle(&buf[..n]);
        if let Some(reply) = reply {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            // A lost answer is the console's to retransmit for, as with a real BMC.
            let _ = socket.send_to(&reply, peer).await;
        }
    }
}
