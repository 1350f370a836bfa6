//! The data path: append and read records over length-prefixed TCP frames.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{canonical, Shared};
use crate::framing::{read_frame, write_frame, FrameRead};
use crate::protocol::{ErrorCode, Request, Response, MAX_FRAME, MAX_READ, MAX_RECORD};
use crate::state::Refusal;

/// Accepts data connections until `shutdown`.
pub async fn serve(shared: Arc<Shared>, listener: TcpListener, shutdown: CancellationToken) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "data accept failed");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let ip = canonical(peer.ip());
            let (id, cut) = shared.register(ip);
            connection(&shared, stream, peer, ip, cut, shutdown).await;
            shared.unregister(id);
        });
    }
}

async fn connection(
    shared: &Shared,
    stream: TcpStream,
    peer: SocketAddr,
    ip: IpAddr,
    cut: CancellationToken,
    shutdown: CancellationToken,
) {
    // A connection from an already fenced client is cut at once, like an array refusing a
    // fenced initiator's login.
    if shared.access.read().await.blocked_node_of(ip).is_some() {
        tracing::info!(%peer, "refusing data connection from a fenced client");
        return;
    }
    let (mut rd, mut wr) = stream.into_split();
    loop {
        let frame = tokio::select! {
            _ = cut.cancelled() => {
                tracing::info!(%peer, "cutting data connection of a fenced client");
                return;
            }
            _ = shutdown.cancelled() => return,
            f = read_frame(&mut rd) => f,
        };
        let body = match frame {
            Ok(FrameRead::Frame(b)) => b,
            Ok(FrameRead::Eof) => return,
            Ok(FrameRead::TooLarge(len)) => {
                let msg = format!("frame of {len} bytes exceeds the {MAX_FRAME} byte limit");
                let _ =
                    write_frame(&mut wr, &Response::error(ErrorCode::TooLarge, msg).encode()).await;
                return;
            }
            Err(_) => return,
        };
        let resp = handle(shared, ip, &body).await;
        if write_frame(&mut wr, &resp.encode()).await.is_err() {
            return;
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn refusal(r: Refusal, volume: &str, ip: IpAddr) -> Response {
    match r {
        Refusal::Blocked { node } => Response::error(
            ErrorCode::Blocked,
            format!("client {ip} belongs to node {node}, which is fenced"),
        ),
        Refusal::Denied => Response::error(
            ErrorCode::Denied,
            format!("client {ip} has no write access to volume {volume}"),
        ),
    }
}

/// Handles one request. Public for in-process tests.
pub(crate) async fn handle(shared: &Shared, ip: IpAddr, body: &[u8]) -> Response {
    let req = match Request::decode(body) {
        Ok(r) => r,
        Err(e) => return Response::error(ErrorCode::Malformed, e.to_string()),
    };
    match req {
        Request::Append { volume, payload } => {
            if payload.len() > MAX_RECORD {
                return Response::error(
                    ErrorCode::TooLarge,
                    format!(
                        "record of {} bytes exceeds the {MAX_RECORD} byte limit",
                        payload.len()
                    ),
                );
            }
            // Held until the record is durable: a concurrent block waits for this append.
            let vol = match shared.volumes.get(&volume) {
                Ok(v) => v,
                Err(e) => return Response::error(ErrorCode::UnknownVolume, e.to_string()),
            };
            let access = shared.access.read().await;
            if let Err(r) = access.check_write(&volume, ip) {
                return refusal(r, &volume, ip);
            }
            let client = ip.to_string();
            let res =
                tokio::task::spawn_blocking(move || vol.lock().append(&client, now_ms(), payload))
                    .await;
            drop(access);
            match res {
                Ok(Ok(offset)) => Response::Appended { offset },
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "append failed");
                    Response::error(ErrorCode::Internal, e.to_string())
                }
                Err(e) => Response::error(ErrorCode::Internal, e.to_string()),
            }
        }
        Request::Read { volume, from, max } => {
            if let Err(r) = shared.access.read().await.check_read(ip) {
                return refusal(r, &volume, ip);
            }
            match shared.volumes.get(&volume) {
                Ok(v) => Response::Records(v.lock().read(from, max.min(MAX_READ))),
                Err(e) => Response::error(ErrorCode::UnknownVolume, e.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU64;

    use parking_lot::Mutex;
    use tokio::sync::RwLock;

    use super::*;
    use crate::state::{AccessState, StateFile};
    use crate::volume::VolumeStore;

    fn shared(dir: &std::path::Path) -> Shared {
        let volumes = VolumeStore::open(&dir.join("volumes")).unwrap();
        volumes.create("vol").unwrap();
        Shared {
            access: RwLock::new(AccessState::default()),
            state_file: StateFile::in_dir(dir),
            volumes,
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
        }
    }

    fn append(volume: &str, payload: &[u8]) -> Vec<u8> {
        Request::Append {
            volume: volume.into(),
            payload: payload.to_vec(),
        }
        .encode()
    }

    fn code(r: Response) -> Option<ErrorCode> {
        match r {
            Response::Error { code, .. } => Some(code),
            _ => None,
        }
    }

    #[tokio::test]
    async fn append_is_checked_against_volume_grant_and_fence() {
        let dir = tempfile::tempdir().unwrap();
        let s = shared(dir.path());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let h = |b: Vec<u8>| {
            let s = &s;
            async move { handle(s, a, &b).await }
        };
        assert_eq!(
            code(h(append("nope", b"x")).await),
            Some(ErrorCode::UnknownVolume)
        );
        assert_eq!(code(h(append("vol", b"x")).await), Some(ErrorCode::Denied));
        s.access.write().await.grant("vol", "m0", &[a]);
        assert_eq!(
            h(append("vol", b"x")).await,
            Response::Appended { offset: 0 }
        );
        assert_eq!(
            code(h(append("vol", &vec![0; MAX_RECORD + 1])).await),
            Some(ErrorCode::TooLarge)
        );
        assert_eq!(code(h(vec![7, 7]).await), Some(ErrorCode::Malformed));
        s.access.write().await.block("m0", &[]).unwrap();
        assert_eq!(code(h(append("vol", b"y")).await), Some(ErrorCode::Blocked));
        let read = Request::Read {
            volume: "vol".into(),
            from: 0,
            max: 10,
        }
        .encode();
        assert_eq!(code(h(read.clone()).await), Some(ErrorCode::Blocked));
        s.access.write().await.unblock("m0");
        match h(read).await {
            Response::Records(r) => assert_eq!(r.len(), 1),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn cut_fenced_cancels_only_the_fenced_peers_connections() {
        let dir = tempfile::tempdir().unwrap();
        let s = shared(dir.path());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (_, ta) = s.register(a);
        let (id_b, tb) = s.register(b);
        let mut st = AccessState::default();
        st.block("m0", &[a]).unwrap();
        assert_eq!(s.cut_fenced(&st), 1);
        assert!(ta.is_cancelled());
        assert!(!tb.is_cancelled());
        s.unregister(id_b);
        assert_eq!(s.connection_count(), 1);
    }
}
