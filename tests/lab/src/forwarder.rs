//! The hub's front door to services on the host's loopback (the API server).
//!
//! Machines reach the control plane at the hub address, inside the lab; a relay listening
//! there (a socket created in the hub namespace) forwards to the API server on the host's
//! loopback. Cutting a machine off the control plane makes the relay black-hole that
//! machine's traffic: open connections go silent and new ones never get an answer, as on a
//! real partition, while the machine keeps its link to the other machines and to storage.
//! The relay also impairs a machine's link without cutting it ([`Link`]): every byte late
//! by a fixed delay each way, or a one-way partition in which the machine's requests land
//! and nothing comes back.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the relay does to one machine's traffic (a machine with none passes freely).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Black-holed both ways: open connections go silent, new ones are never answered.
    Cut,
    /// A one-way partition: what the machine sends on the connections it has open is carried
    /// on (its requests land), what comes back is held until the link heals (then delivered,
    /// as TCP's retransmissions would), and new connections are never answered (their
    /// handshake's answer would be lost too).
    Deaf,
    /// Every byte is carried on this much later, each way (a congested or distant link; an
    /// API server slow to answer this machine alone).
    Slow(Duration),
}

/// Which source addresses are cut off or impaired. Cheap to clone.
#[derive(Clone, Debug)]
pub struct CutSet {
    tx: Arc<watch::Sender<HashMap<IpAddr, Link>>>,
}

impl Default for CutSet {
    fn default() -> Self {
        CutSet {
            tx: Arc::new(watch::channel(HashMap::new()).0),
        }
    }
}

impl CutSet {
    /// Cuts `ip` off.
    pub fn cut(&self, ip: IpAddr) {
        self.impair(ip, Link::Cut);
    }

    /// Sets what happens to `ip`'s traffic from now on (replacing any cut or impairment).
    pub fn impair(&self, ip: IpAddr, link: Link) {
        self.tx.send_modify(|s| {
            s.insert(ip, link);
        });
    }

    /// Lets `ip` through again, unimpaired.
    pub fn heal(&self, ip: IpAddr) {
        self.tx.send_modify(|s| {
            s.remove(&ip);
        });
    }

    /// True if `ip` is cut off now.
    pub fn is_cut(&self, ip: IpAddr) -> bool {
        self.link(ip) == Some(Link::Cut)
    }

    /// What happens to `ip`'s traffic now (`None`: it passes freely).
    pub fn link(&self, ip: IpAddr) -> Option<Link> {
        self.tx.borrow().get(&ip).copied()
    }

    async fn wait(&self, ip: IpAddr, until: impl Fn(Option<Link>) -> bool) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|s| until(s.get(&ip).copied())).await;
    }
}

/// New connections from a machine with this link are never answered.
fn unanswered(link: Option<Link>) -> bool {
    matches!(link, Some(Link::Cut | Link::Deaf))
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
    if !unanswered(cuts.link(ip)) {
        let Ok(mut up) = TcpStream::connect(upstream).await else {
            return;
        };
        {
            let (down_rx, down_tx) = down.split();
            let (up_rx, up_tx) = up.split();
            tokio::select! {
                // Both directions to their end, or until either breaks (as
                // `copy_bidirectional`: an error anywhere ends the connection).
                _ = async {
                    tokio::try_join!(
                        carry(down_rx, up_tx, ip, &cuts, false),
                        carry(up_rx, down_tx, ip, &cuts, true),
                    )
                } => return,
                _ = cuts.wait(ip, |l| l == Some(Link::Cut)) => {}
            }
        }
        drop(up);
    }
    // Black hole: keep the machine's end open and silent until the partition heals, then
    // drop it so the machine reconnects.
    cuts.wait(ip, |l| !unanswered(l)).await;
    drop(down);
}

/// Carries one direction of a connection (`to_machine`: the upstream's answers), each chunk
/// as `ip`'s link says when it was read: late by a [`Link::Slow`] delay, or, toward a
/// [`Link::Deaf`] machine, held until its link heals. Order is kept; on end of stream the
/// writing side is shut down, as `copy_bidirectional` does. An error reading or writing ends
/// it at once with that error.
async fn carry(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    ip: IpAddr,
    cuts: &CutSet,
    to_machine: bool,
) -> std::io::Result<()> {
    let (tx, mut rx) =
        tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, bool, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await? {
                0 => break,
                n => n,
            };
            let link = cuts.link(ip);
            let late = match link {
                Some(Link::Slow(d)) => d,
                _ => Duration::ZERO,
            };
            let held = to_machine && link == Some(Link::Deaf);
            let due = tokio::time::Instant::now() + late;
            if tx.send((due, held, buf[..n].to_vec())).is_err() {
                break;
            }
        }
        Ok::<(), std::io::Error>(())
    };
    let write = async move {
        while let Some((due, held, bytes)) = rx.recv().await {
            if held {
                cuts.wait(ip, |l| l != Some(Link::Deaf)).await;
            }
            tokio::time::sleep_until(due).await;
            to.write_all(&bytes).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// How long a UDP client's upstream socket lives without a datagram either way.
const UDP_IDLE: std::time::Duration = std::time::Duration::from_secs(60);
/// At most this many UDP clients at once (each has its own upstream socket); beyond, new
/// clients' datagrams are dropped, as a loaded device would.
const UDP_CLIENTS: usize = 256;

/// What a UDP relay does to the replies it carries back: a fault a test turns on and off
/// while the relay runs (a BMC that answers slowly, garbage, or not at all). Cheap to clone;
/// every clone controls the same relay.
#[derive(Clone, Debug, Default)]
pub struct ReplyFault {
    // 0 pass, 1 drop, 2 delay, 3 garbage.
    mode: Arc<std::sync::atomic::AtomicU8>,
    delay_ms: Arc<std::sync::atomic::AtomicU64>,
}

/// One reply fault, as [`ReplyFault::set`] takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replies {
    /// Carried back unchanged.
    Pass,
    /// Never carried back (the device looks unreachable).
    Drop,
    /// Carried back after this long (a slow device).
    Delay(std::time::Duration),
    /// Replaced by bytes of the same length that mean nothing (a device answering garbage).
    Garbage,
}

impl ReplyFault {
    /// Sets what happens to the replies from now on.
    pub fn set(&self, r: Replies) {
        use std::sync::atomic::Ordering::SeqCst;
        let (mode, delay) = match r {
            Replies::Pass => (0, 0),
            Replies::Drop => (1, 0),
            Replies::Delay(d) => (2, u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            Replies::Garbage => (3, 0),
        };
        self.delay_ms.store(delay, SeqCst);
        self.mode.store(mode, SeqCst);
    }

    /// What happens to the replies now.
    pub fn get(&self) -> Replies {
        use std::sync::atomic::Ordering::SeqCst;
        match self.mode.load(SeqCst) {
            1 => Replies::Drop,
            2 => Replies::Delay(std::time::Duration::from_millis(self.delay_ms.load(SeqCst))),
            3 => Replies::Garbage,
            _ => Replies::Pass,
        }
    }
}

/// Garbage of `len` bytes, different on every call (xorshift over a counter: no meaning, no
/// valid checksum, not a constant a parser could special-case).
fn garbage(len: usize) -> Vec<u8> {
    static SEED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0x9e37_79b9);
    let mut x = SEED.fetch_add(0x9e37_79b9_7f4a_7c15, std::sync::atomic::Ordering::Relaxed) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Relays UDP datagrams received on `socket` to `upstream`, each client through its own
/// upstream socket (so replies find their way back), dropped after a minute of silence.
/// Never cut: the management network (BMCs) is out of band. Replies go through `fault`.
pub async fn relay_udp(socket: std::net::UdpSocket, upstream: SocketAddr, fault: ReplyFault) {
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
            let (down, gone, fault) = (down.clone(), gone_tx.clone(), fault.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65_536];
                while let Ok(Ok(n)) = tokio::time::timeout(UDP_IDLE, up.recv(&mut buf)).await {
                    match fault.get() {
                        Replies::Pass => {
                            let _ = down.send_to(&buf[..n], from).await;
                        }
                        Replies::Drop => {}
                        Replies::Garbage => {
                            let _ = down.send_to(&garbage(n), from).await;
                        }
                        Replies::Delay(d) => {
                            let (down, reply) = (down.clone(), buf[..n].to_vec());
                            tokio::spawn(async move {
                                tokio::time::sleep(d).await;
                                let _ = down.send_to(&reply, from).await;
                            });
                        }
                    }
                }
                let _ = gone.send(from);
            });
        }
        if let Some(up) = clients.get(&from) {
            let _ = up.send(&buf[..n]).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::net::UdpSocket;

    /// An echo "device" on loopback and a relay in front of it, under `fault`.
    async fn relayed(fault: ReplyFault) -> (UdpSocket, SocketAddr) {
        let device = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let upstream = device.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = device.recv_from(&mut buf).await {
                let _ = device.send_to(&buf[..n], from).await;
            }
        });
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let relay = socket.local_addr().unwrap();
        tokio::spawn(relay_udp(socket, upstream, fault));
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        (client, relay)
    }

    async fn ask(client: &UdpSocket, relay: SocketAddr, wait: Duration) -> Option<Vec<u8>> {
        client.send_to(b"get chassis status", relay).await.unwrap();
        let mut buf = [0u8; 1500];
        let (n, _) = tokio::time::timeout(wait, client.recv_from(&mut buf))
            .await
            .ok()?
            .ok()?;
        Some(buf[..n].to_vec())
    }

    #[tokio::test]
    async fn replies_pass_drop_arrive_late_or_turn_to_garbage_as_set() {
        let fault = ReplyFault::default();
        let (client, relay) = relayed(fault.clone()).await;
        let long = Duration::from_secs(10);
        assert_eq!(
            ask(&client, relay, long).await.unwrap(),
            b"get chassis status"
        );

        fault.set(Replies::Garbage);
        let g = ask(&client, relay, long).await.unwrap();
        assert_eq!(
            g.len(),
            b"get chassis status".len(),
            "garbage keeps the length"
        );
        assert_ne!(g, b"get chassis status");

        fault.set(Replies::Drop);
        assert_eq!(ask(&client, relay, Duration::from_millis(300)).await, None);

        // Late: not there when a short wait ends, there after the delay.
        fault.set(Replies::Delay(Duration::from_secs(3)));
        assert_eq!(fault.get(), Replies::Delay(Duration::from_secs(3)));
        assert_eq!(ask(&client, relay, Duration::from_millis(200)).await, None);
        let mut buf = [0u8; 1500];
        let (n, _) = tokio::time::timeout(long, client.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"get chassis status");

        fault.set(Replies::Pass);
        assert_eq!(
            ask(&client, relay, long).await.unwrap(),
            b"get chassis status"
        );
    }

    /// A TCP "API server" on loopback that records what reaches it and echoes it back, and a
    /// relay in front of it under `cuts` (the client comes from 127.0.0.1).
    async fn tcp_relayed(cuts: CutSet) -> (TcpStream, Arc<parking_lot::Mutex<Vec<u8>>>) {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = server.local_addr().unwrap();
        let landed = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let seen = landed.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = server.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1500];
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        seen.lock().extend_from_slice(&buf[..n]);
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        tokio::spawn(relay(listener, upstream, cuts));
        (TcpStream::connect(at).await.unwrap(), landed)
    }

    async fn answer(c: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
        let mut buf = [0u8; 1500];
        match tokio::time::timeout(wait, c.read(&mut buf)).await {
            Ok(Ok(n @ 1..)) => Some(buf[..n].to_vec()),
            _ => None,
        }
    }

    /// A one-way partition: the request lands, its answer is held until the link heals and
    /// then delivered; a connection opened meanwhile is never answered.
    #[tokio::test]
    async fn a_deaf_machine_is_heard_but_hears_nothing_until_its_link_heals() {
        let cuts = CutSet::default();
        let ip: IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
        let (mut c, landed) = tcp_relayed(cuts.clone()).await;
        let long = Duration::from_secs(10);
        c.write_all(b"renew 1").await.unwrap();
        assert_eq!(answer(&mut c, long).await.unwrap(), b"renew 1");

        cuts.impair(ip, Link::Deaf);
        c.write_all(b"renew 2").await.unwrap();
        assert_eq!(answer(&mut c, Duration::from_millis(500)).await, None);
        assert_eq!(
            landed.lock().as_slice(),
            b"renew 1renew 2",
            "the request landed"
        );
        let (mut fresh, _) = tcp_relayed(cuts.clone()).await;
        fresh.write_all(b"renew 3").await.unwrap();
        assert_eq!(answer(&mut fresh, Duration::from_millis(300)).await, None);

        cuts.heal(ip);
        assert_eq!(answer(&mut c, long).await.unwrap(), b"renew 2");
    }

    /// A slow link carries every byte, each way, no sooner than its delay.
    #[tokio::test]
    async fn a_slow_link_delivers_everything_late_each_way() {
        let cuts = CutSet::default();
        let ip: IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
        let (mut c, _) = tcp_relayed(cuts.clone()).await;
        cuts.impair(ip, Link::Slow(Duration::from_millis(300)));
        let sent = tokio::time::Instant::now();
        c.write_all(b"renew").await.unwrap();
        assert_eq!(
            answer(&mut c, Duration::from_secs(10)).await.unwrap(),
            b"renew"
        );
        assert!(
            sent.elapsed() >= Duration::from_millis(600),
            "late both ways"
        );
        cuts.heal(ip);
        assert_eq!(cuts.link(ip), None);
    }
}
