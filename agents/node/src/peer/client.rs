//! The client side: asks the peers, keeps the [`Excuse`], publishes how long it lasts.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::join_all;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{timeout, Instant};

use super::wire::{self, Answer, LineError, Request};
use super::{Excuse, Peer, PeerConfig, PeerError, PeerKey, PeerMetrics, WriteClock};

/// Asks `peer` once whether it vouches. Unbounded in time: the caller applies the timeout.
///
/// Guarantees: `Ok` only for an answer authenticated under `key`, from `peer.name`, to
/// `me`, carrying the fresh nonce this request sent.
pub(crate) async fn ask(
    key: &PeerKey,
    me: &str,
    peer: &Peer,
    port: u16,
) -> Result<bool, PeerError> {
    let who = || peer.name.clone();
    let io = |source| PeerError::Io {
        peer: peer.name.clone(),
        source,
    };
    let nonce = wire::new_nonce();
    let req = Request::new(key, me, &peer.name, nonce.clone());
    let mut stream = TcpStream::connect((peer.addr, port)).await.map_err(io)?;
    let (rd, mut wr) = stream.split();
    wr.write_all(&wire::encode(&req)).await.map_err(io)?;
    let line = match wire::read_line(BufReader::new(rd)).await {
        Ok(line) => line,
        Err(LineError::Io(source)) => return Err(io(source)),
        Err(LineError::Oversize) => return Err(PeerError::Oversize { peer: who() }),
        Err(LineError::Truncated) => {
            return Err(PeerError::Malformed {
                peer: who(),
                reason: "no answer line".into(),
            })
        }
    };
    let ans: Answer = serde_json::from_slice(&line).map_err(|e| PeerError::Malformed {
        peer: who(),
        reason: e.to_string(),
    })?;
    ans.authenticate(key).map_err(|r| match r {
        wire::Refusal::Mac => PeerError::BadMac { peer: who() },
        r => PeerError::Malformed {
            peer: who(),
            reason: r.reason().into(),
        },
    })?;
    let mismatch = |field| PeerError::Mismatch { peer: who(), field };
    if ans.node != peer.name {
        return Err(mismatch("node"));
    }
    if ans.to != me {
        return Err(mismatch("to"));
    }
    if ans.nonce != nonce {
        return Err(mismatch("nonce"));
    }
    Ok(ans.vouch)
}

/// The member count of the peer set `peers` as seen by node `me`: the list's length, plus one
/// when `me` is missing from it; 0 (unknown) for an empty list.
fn members(me: &str, peers: &[Peer]) -> usize {
    match peers.len() {
        0 => 0,
        n if peers.iter().any(|p| p.name == me) => n,
        n => n + 1,
    }
}

/// Polls the peers while `needed()` holds, and publishes on `out` the instant until which
/// this node is excused from self-fencing.
///
/// Every `poll_interval` while needed, asks every reachable peer of the list the last
/// successful renewal advertised ([`super::MemberBook::advertised`]; skipping
/// this node by name) in parallel, each bounded by `request_timeout`, feeds the answers to an
/// [`Excuse`] (a failed request adds nothing; earlier vouches lapse on their own), and publishes
/// [`Excuse::excused_until`] after the round. While not needed it publishes `None` and forgets
/// every answer.
///
/// Guarantees: what is published is `Some(t)` only when, at the end of the round, a strict
/// majority of the members vouched with answers to requests sent no earlier than
/// `t - answer_valid`. Without an advertised list (never listed, or never renewed with one) the
/// node is never excused.
///
/// Assumptions: `writes` is this agent's own write clock (its vote); consumers treat the
/// published instant as expired once now reaches it, and check `needed` themselves no more
/// often than every `poll_interval` would reset it.
pub async fn poll(
    cfg: PeerConfig,
    key: Arc<PeerKey>,
    peers: Arc<super::MemberBook>,
    writes: WriteClock,
    needed: Arc<dyn Fn() -> bool + Send + Sync>,
    out: watch::Sender<Option<Instant>>,
    metrics: Arc<PeerMetrics>,
) {
    let mut excuse = Excuse::new(cfg.vouch_after, cfg.answer_valid);
    let mut was_excused = false;
    loop {
        let round = Instant::now();
        let until = if needed() {
            // The lists the controller may judge us against (the last successful renewal's
            // and every later attempt's): a strict majority of each must vouch.
            let lists = peers.advertised().unwrap_or_default();
            let mut union: Vec<&Peer> = Vec::new();
            for p in lists.iter().flatten() {
                if !union.iter().any(|q| q.name == p.name) {
                    union.push(p);
                }
            }
            excuse.retain(|name| union.iter().any(|p| p.name == name));
            let asks = union
                .iter()
                .copied()
                .filter(|p| p.name != cfg.node && p.reachable())
                .map(|p| {
                    let key = &key;
                    let cfg = &cfg;
                    async move {
                        let sent = Instant::now();
                        let res =
                            match timeout(cfg.request_timeout, ask(key, &cfg.node, p, cfg.port))
                                .await
                            {
                                Ok(r) => r,
                                Err(_) => Err(PeerError::Timeout {
                                    peer: p.name.clone(),
                                }),
                            };
                        (p, sent, res)
                    }
                });
            for (p, sent, res) in join_all(asks).await {
                match res {
                    Ok(vouch) => {
                        let c = if vouch {
                            &metrics.requests_vouch
                        } else {
                            &metrics.requests_no_vouch
                        };
                        c.fetch_add(1, Ordering::Relaxed);
                        excuse.answer(&p.name, sent, vouch);
                    }
                    Err(e) => {
                        metrics.requests_error.fetch_add(1, Ordering::Relaxed);
                        // Adds nothing; an earlier vouch lapses on its own.
                        tracing::debug!(peer = %p.name, error = %e, "peer check failed");
                    }
                }
            }
            // `needed` may have turned false while the round ran.
            if needed() {
                let now = Instant::now();
                let each: Option<Vec<Instant>> = lists
                    .iter()
                    .map(|list| {
                        let mut e = excuse.clone();
                        e.set_members(members(&cfg.node, list));
                        e.retain(|name| list.iter().any(|p| p.name == name));
                        e.excused_until(writes.last_write(), now)
                    })
                    .collect();
                each.and_then(|u| u.into_iter().min())
            } else {
                excuse.clear();
                None
            }
        } else {
            excuse.clear();
            None
        };
        let excused = until.is_some();
        if excused != was_excused {
            if excused {
                tracing::warn!(node = %cfg.node, "a majority of peers cannot reach the API either: excused from self-fencing");
            } else {
                tracing::info!(node = %cfg.node, "no longer excused from self-fencing by peers");
            }
            was_excused = excused;
        }
        metrics.excused.store(u64::from(excused), Ordering::Relaxed);
        out.send_replace(until);
        if out.is_closed() {
            return;
        }
        tokio::time::sleep_until(round + cfg.poll_interval).await;
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::super::serve;
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn key(b: u8) -> Arc<PeerKey> {
        Arc::new(PeerKey::from_bytes(&[b; 32]).unwrap())
    }

    fn cfg(node: &str, port: u16) -> PeerConfig {
        PeerConfig {
            node: node.into(),
            port,
            vouch_after: 10 * S,
            answer_valid: 20 * S,
            poll_interval: Duration::from_millis(50),
            request_timeout: 2 * S,
        }
    }

    /// A write clock that last wrote long ago: its owner vouches.
    fn quiet() -> WriteClock {
        WriteClock::starting_at(Instant::now() - 60 * S)
    }

    /// Starts a server for `node` on `ip` (port 0 picks one) and returns its port.
    async fn server(
        node: &str,
        key: Arc<PeerKey>,
        ip: Ipv4Addr,
        port: u16,
        writes: WriteClock,
    ) -> std::io::Result<(u16, Arc<PeerMetrics>)> {
        let listener = TcpListener::bind((ip, port)).await?;
        let port = listener.local_addr()?.port();
        let metrics = Arc::new(PeerMetrics::default());
        tokio::spawn(serve(
            cfg(node, port),
            key,
            listener,
            writes,
            metrics.clone(),
        ));
        Ok((port, metrics))
    }

    fn peer(name: &str, ip: Ipv4Addr) -> Peer {
        Peer {
            name: name.into(),
            addr: IpAddr::V4(ip),
        }
    }

    #[tokio::test]
    async fn server_vouches_when_quiet_and_not_right_after_a_write() {
        let writes = quiet();
        let (port, m) = server("b", key(1), Ipv4Addr::LOCALHOST, 0, writes.clone())
            .await
            .unwrap();
        let b = peer("b", Ipv4Addr::LOCALHOST);
        assert!(ask(&key(1), "a", &b, port).await.unwrap());
        writes.record_write();
        assert!(!ask(&key(1), "a", &b, port).await.unwrap());
        assert_eq!(m.answers_vouch.load(Ordering::Relaxed), 1);
        assert_eq!(m.answers_no_vouch.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_client_with_another_key_gets_no_answer_and_is_counted_rejected() {
        let (port, m) = server("b", key(1), Ipv4Addr::LOCALHOST, 0, quiet())
            .await
            .unwrap();
        let b = peer("b", Ipv4Addr::LOCALHOST);
        assert!(ask(&key(2), "a", &b, port).await.is_err());
        assert_eq!(m.rejected.load(Ordering::Relaxed), 1);
        assert_eq!(m.answers_vouch.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_request_for_another_node_is_rejected() {
        let (port, m) = server("b", key(1), Ipv4Addr::LOCALHOST, 0, quiet())
            .await
            .unwrap();
        // The client believes the node at this address is "c".
        let c = peer("c", Ipv4Addr::LOCALHOST);
        assert!(ask(&key(1), "a", &c, port).await.is_err());
        assert_eq!(m.rejected.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn an_oversize_line_is_rejected_unanswered() {
        let (port, m) = server("b", key(1), Ipv4Addr::LOCALHOST, 0, quiet())
            .await
            .unwrap();
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .unwrap();
        s.write_all(&vec![b'{'; 4096]).await.unwrap();
        let mut rest = Vec::new();
        // The server closes without answering (a reset is as good as an EOF).
        let _ = s.read_to_end(&mut rest).await;
        assert!(rest.is_empty());
        assert_eq!(m.rejected.load(Ordering::Relaxed), 1);
    }

    /// A server that answers every request with `tamper` applied to a correctly signed answer.
    async fn rogue(key: Arc<PeerKey>, tamper: fn(&mut Answer, &PeerKey)) -> u16 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (rd, mut wr) = s.split();
                let Ok(line) = wire::read_line(BufReader::new(rd)).await else {
                    continue;
                };
                let req: Request = serde_json::from_slice(&line).unwrap();
                let mut ans = Answer::new(&key, &req.to, &req.from, req.nonce, false);
                tamper(&mut ans, &key);
                let _ = wr.write_all(&wire::encode(&ans)).await;
            }
        });
        port
    }

    #[tokio::test]
    async fn answers_that_are_tampered_or_for_someone_else_are_errors() {
        let b = peer("b", Ipv4Addr::LOCALHOST);
        let honest = rogue(key(1), |_, _| {}).await;
        assert!(!ask(&key(1), "a", &b, honest).await.unwrap());

        let flipped = rogue(key(1), |a, _| a.vouch = true).await;
        assert!(matches!(
            ask(&key(1), "a", &b, flipped).await,
            Err(PeerError::BadMac { .. })
        ));
        let wrong_node = rogue(key(1), |a, k| {
            *a = Answer::new(k, "z", &a.to, a.nonce.clone(), true);
        })
        .await;
        assert!(matches!(
            ask(&key(1), "a", &b, wrong_node).await,
            Err(PeerError::Mismatch { field: "node", .. })
        ));
        let wrong_to = rogue(key(1), |a, k| {
            *a = Answer::new(k, &a.node, "z", a.nonce.clone(), true);
        })
        .await;
        assert!(matches!(
            ask(&key(1), "a", &b, wrong_to).await,
            Err(PeerError::Mismatch { field: "to", .. })
        ));
        let replayed = rogue(key(1), |a, k| {
            *a = Answer::new(k, &a.node, &a.to, "0".repeat(32), true);
        })
        .await;
        assert!(matches!(
            ask(&key(1), "a", &b, replayed).await,
            Err(PeerError::Mismatch { field: "nonce", .. })
        ));
    }

    #[test]
    fn members_count_self_once_and_an_empty_list_is_unknown() {
        let l = Ipv4Addr::LOCALHOST;
        assert_eq!(members("a", &[]), 0);
        assert_eq!(members("a", &[peer("a", l), peer("b", l), peer("c", l)]), 3);
        assert_eq!(members("a", &[peer("b", l), peer("c", l)]), 3);
    }

    /// Two servers on 127.0.0.2 and 127.0.0.3 sharing one port (all of 127/8 is loopback).
    async fn two_servers(k: Arc<PeerKey>) -> (u16, WriteClock, WriteClock) {
        let (wb, wc) = (quiet(), quiet());
        for _ in 0..20 {
            let Ok((port, _)) =
                server("b", k.clone(), Ipv4Addr::new(127, 0, 0, 2), 0, wb.clone()).await
            else {
                continue;
            };
            if server(
                "c",
                k.clone(),
                Ipv4Addr::new(127, 0, 0, 3),
                port,
                wc.clone(),
            )
            .await
            .is_ok()
            {
                return (port, wb, wc);
            }
        }
        panic!("no common free port on 127.0.0.2 and 127.0.0.3");
    }

    #[tokio::test]
    async fn poll_excuses_while_both_quiet_peers_vouch_and_stops_when_not_needed() {
        let k = key(7);
        let (port, _wb, wc) = two_servers(k.clone()).await;
        let list = vec![
            peer("a", Ipv4Addr::LOCALHOST),
            peer("b", Ipv4Addr::new(127, 0, 0, 2)),
            peer("c", Ipv4Addr::new(127, 0, 0, 3)),
        ];
        // The list as a successful renewal advertised it.
        let peers = Arc::new(crate::peer::MemberBook::new("a"));
        let set = peers.offer(&list).unwrap();
        peers.written(set);
        let need = Arc::new(AtomicBool::new(true));
        let needed = {
            let need = need.clone();
            Arc::new(move || need.load(Ordering::SeqCst)) as Arc<dyn Fn() -> bool + Send + Sync>
        };
        let (out_tx, mut out_rx) = watch::channel(None);
        let metrics = Arc::new(PeerMetrics::default());
        // This node just wrote: it does not vote, so both peers must vouch.
        // Vouches stand for 2 s here, so the last one lapses well within the deadline.
        let mut a = cfg("a", port);
        a.answer_valid = 2 * S;
        tokio::spawn(poll(
            a,
            k,
            peers,
            WriteClock::new(),
            needed,
            out_tx,
            metrics.clone(),
        ));
        let deadline = 10 * S;
        let until = timeout(deadline, out_rx.wait_for(|v| v.is_some()))
            .await
            .expect("excused within the deadline")
            .unwrap()
            .unwrap();
        assert!(until > Instant::now());
        assert_eq!(metrics.excused.load(Ordering::Relaxed), 1);

        // Not needed: None at once, and the answers are forgotten.
        need.store(false, Ordering::SeqCst);
        timeout(deadline, out_rx.wait_for(|v| v.is_none()))
            .await
            .expect("not excused once not needed")
            .unwrap();
        assert_eq!(metrics.excused.load(Ordering::Relaxed), 0);

        // Needed again: excused again.
        need.store(true, Ordering::SeqCst);
        timeout(deadline, out_rx.wait_for(|v| v.is_some()))
            .await
            .expect("excused again")
            .unwrap();

        // Peer c writes: it answers "no" from now on, its last vouch lapses `answer_valid`
        // after its request, and without it there is no majority.
        wc.record_write();
        timeout(deadline, out_rx.wait_for(|v| v.is_none()))
            .await
            .expect("lapsed within the deadline")
            .unwrap();
        assert_eq!(*out_rx.borrow(), None);
        assert_eq!(metrics.excused.load(Ordering::Relaxed), 0);
    }
}
