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

/// How long a UDP client's upstream socket lives without a datagram either way.
const UDP_IDLE: std::time::Duration = std::time::Duration::from_secs(60);
/// At most this many UDP clients at once (each has its own upstream socket); beyond, new
/// clients' datagrams are dropped, as a loaded device would.
const UDP_CLIENTS: usize = 256;

/// Relays UDP datagrams received on `socket` to `upstream`, each client through its own
/// upstream socket (so replies find their way back), dropped after a minute of silence.
/// Never cut: the management network (BMCs) is out of band.
pub async fn relay_udp(socket: std::net::UdpSocket, upstream: SocketAddr) {
    use std::collections::HashMap;
    use tokio::net::UdpSocket;
    let Ok(()) = socket.set_nonblocking(true) else {
        return;
    };
    let Ok(down) = UdpSocket::from_std(socket) else {
        return;
    };
    let down = Arc::new(down);
    let mut clients: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let (gone_tx, mut gone_rx) = tokio::sync::mpsc::unbounded_channel::<SocketAddr>();
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = tokio::select! {
            r = down.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(_) => continue,
            },
            Some(gone) = gone_rx.recv() => {
                clients.remove(&gone);
                continue;
            }
        };
        if !clients.contains_key(&from) {
            if clients.len() >= UDP_CLIENTS {
                continue;
            }
            let bind: SocketAddr = match upstream {
                SocketAddr::V4(_) => (std::net::Ipv4Addr::LOCALHOST, 0).into(),
                SocketAddr::V6(_) => (std::net::Ipv6Addr::LOCALHOST, 0).into(),
            };
            let Ok(up) = UdpSocket::bind(bind).await else {
                continue;
            };
            if up.connect(upstream).await.is_err() {
                continue;
            }
            let up = Arc::new(up);
            clients.insert(from, up.clone());
            let (down, gone) = (down.clone(), gone_tx.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65_536];
                while let Ok(Ok(n)) = tokio::time::timeout(UDP_IDLE, up.recv(&mut buf)).await {
                    let _ = down.send_to(&buf[..n], from).await;
                }
                let _ = gone.send(from);
            });
        }
        if let Some(up) = clients.get(&from) {
            let _ = up.send(&buf[..n]).await;
        }
    }
}
