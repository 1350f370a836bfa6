//! The server side: answers peers' "can you reach the API?" requests.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{timeout, Instant};

use super::wire::{self, Answer, LineError, Request};
use super::{may_vouch, PeerConfig, PeerError, PeerKey, PeerMetrics, WriteClock};

/// How long a client may take to send its request, and the server to write its answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// The most connections served at once; further ones wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;

/// Serves peer requests on `listener` forever: each TCP connection carries one request line
/// and gets at most one answer line.
///
/// Guarantees: an answer vouches only when [`may_vouch`] holds for `writes` at the instant the
/// answer is composed. Requests with a bad MAC, a `to` other than `cfg.node`, garbage, or a
/// line over the limit are counted as rejected and closed unanswered. A slow client is cut
/// off after 2 s, and at most 64 connections are served at once.
///
/// Assumptions: `writes` is the clock the lease loop records every Lease write attempt on.
pub async fn serve(
    cfg: PeerConfig,
    key: Arc<PeerKey>,
    listener: TcpListener,
    writes: WriteClock,
    metrics: Arc<PeerMetrics>,
) {
    let cfg = Arc::new(cfg);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, remote) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "peer accept failed");
                // Accept errors (e.g. out of file descriptors) persist; do not spin on them.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (cfg, key, writes, metrics) =
            (cfg.clone(), key.clone(), writes.clone(), metrics.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match answer_one(&cfg, &key, stream, remote, &writes).await {
                Ok(true) => metrics.answers_vouch.fetch_add(1, Ordering::Relaxed),
                Ok(false) => metrics.answers_no_vouch.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "peer request rejected");
                    metrics.rejected.fetch_add(1, Ordering::Relaxed)
                }
            };
        });
    }
}

/// Reads one request and answers it; returns the vouch given.
async fn answer_one(
    cfg: &PeerConfig,
    key: &PeerKey,
    mut stream: TcpStream,
    remote: SocketAddr,
    writes: &WriteClock,
) -> Result<bool, PeerError> {
    let peer = || remote.to_string();
    let (rd, mut wr) = stream.split();
    let line = match timeout(IO_TIMEOUT, wire::read_line(BufReader::new(rd))).await {
        Err(_) => return Err(PeerError::Timeout { peer: peer() }),
        Ok(Err(LineError::Io(source))) => {
            return Err(PeerError::Io {
                peer: peer(),
                source,
            })
        }
        Ok(Err(LineError::Oversize)) => return Err(PeerError::Oversize { peer: peer() }),
        Ok(Err(LineError::Truncated)) => {
            return Err(PeerError::Malformed {
                peer: peer(),
                reason: "no newline".into(),
            })
        }
        Ok(Ok(line)) => line,
    };
    let req: Request = serde_json::from_slice(&line).map_err(|e| PeerError::Malformed {
        peer: peer(),
        reason: e.to_string(),
    })?;
    req.authenticate(key).map_err(|r| match r {
        wire::Refusal::Mac => PeerError::BadMac { peer: peer() },
        r => PeerError::Malformed {
            peer: peer(),
            reason: r.reason().into(),
        },
    })?;
    if req.to != cfg.node {
        return Err(PeerError::Mismatch {
            peer: format!("{} ({remote})", req.from),
            field: "to",
        });
    }
    let vouch = may_vouch(writes.last_write(), Instant::now(), cfg.vouch_after);
    let answer = Answer::new(key, &cfg.node, &req.from, req.nonce, vouch);
    match timeout(IO_TIMEOUT, wr.write_all(&wire::encode(&answer))).await {
        Ok(Ok(())) => {}
        Ok(Err(source)) => {
            return Err(PeerError::Io {
                peer: peer(),
                source,
            })
        }
        Err(_) => return Err(PeerError::Timeout { peer: peer() }),
    }
    tracing::debug!(from = %req.from, vouch, "answered peer");
    let _ = wr.shutdown().await;
    Ok(vouch)
}
