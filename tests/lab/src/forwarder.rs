//! The hub's front door to services on the host's loopback (the API server).
//!
//! Machines reach the control plane at the hub address, inside the lab; a relay listening
//! there (a socket created in the hub namespace) forwards to the API server on the host's
//! loopback. Cutting a machine off the control plane makes the relay black-hole that
//! machine's traffic: open connections go silent and new ones never get an answer, as on a
//! real partition, while the machine keeps its link to the other machines and to storage.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Which source addresses are cut off. Cheap to clone.
#[derive(Clone, Debug)]
pub struct CutSet {
    tx: Arc<watch::Sender<HashSet<IpAddr>>>,
}

impl Default for CutSet {
    fn default() -> Self {
        CutSet {
            tx: Arc::new(watch::channel(HashSet::new()).0),
        }
    }
}

impl CutSet {
    /// Cuts `ip` off.
    pub fn cut(&self, ip: IpAddr) {
        self.tx.send_modify(|s| {
            s.insert(ip);
        });
    }

    /// Lets `ip` through again.
    pub fn heal(&self, ip: IpAddr) {
        self.tx.send_modify(|s| {
            s.remove(&ip);
        });
    }

    /// True if `ip` is cut off now.
    pub fn is_cut(&self, ip: IpAddr) -> bool {
        self.tx.borrow().contains(&ip)
    }

    async fn wait(&self, ip: IpAddr, cut: bool) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|s| s.contains(&ip) == cut).await;
    }
}

/// Relays every connection accepted on `listener` to `upstream`, honouring `cuts`.
pub async fn relay(listener: std::net::TcpListener, upstream: SocketAddr, cuts: CutSet) {
    let Ok(()) = listener.set_nonblocking(true) else {
        return;
    };
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let Ok((down, peer)) = listener.accept().await else {
            continue;
        };
        let cuts = cuts.clone();
        tokio::spawn(async move { one(down, peer.ip(), upstream, cuts).await });
    }
}

async fn one(mut down: TcpStream, ip: IpAddr, upstream: SocketAddr, cuts: CutSet) {
    if !cuts.is_cut(ip) {
        let Ok(mut up) = TcpStream::connect(upstream).await else {
            return;
        };
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut down, &mut up) => return,
            _ = cuts.wait(ip, true) => {}
        }
        drop(up);
    }
    // Black hole: keep the machine's end open and silent until the partition heals, then
    // drop it so the machine reconnects.
    cuts.wait(ip, false).await;
    drop(down);
}
