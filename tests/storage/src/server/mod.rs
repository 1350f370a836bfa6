//! The lab storage server: a data path ([`data`]) serving durable volumes to the machines, and
//! an HTTPS admin API ([`admin`]) acting as the storage firewall.
//!
//! Consistency rule between the two: an append holds the access state's read lock from the
//! access check until the record is fsynced; a block takes the write lock. So once a block
//! request has returned, no append from the blocked node can be accepted any more, and every
//! append acknowledged before it was checked against the earlier state.

pub mod admin;
pub mod data;
pub mod tls;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use palisade_storagefw::Secret;
use parking_lot::Mutex;
use tokio::sync::RwLock;
use tokio_util::sync::CancellationToken;

use crate::error::ServerError;
use crate::state::{AccessState, StateFile};
use crate::volume::VolumeStore;

/// Everything the server needs to start.
#[derive(Debug)]
pub struct ServerConfig {
    /// Directory holding `state.json` and `volumes/`.
    pub state_dir: PathBuf,
    /// Already bound data listener (possibly created inside a network namespace).
    pub data_listener: std::net::TcpListener,
    /// Already bound admin listener.
    pub admin_listener: std::net::TcpListener,
    /// Admin API certificate chain (PEM).
    pub tls_cert_pem: Vec<u8>,
    /// Admin API key (PEM).
    pub tls_key_pem: Secret,
    /// Bearer token accepted by the admin API.
    pub token: Option<Secret>,
    /// CA whose client certificates the admin API accepts instead of a token.
    pub client_ca_pem: Option<Vec<u8>>,
    /// Volumes to create at start (idempotent).
    pub volumes: Vec<String>,
}

/// State shared by the data path and the admin API.
#[derive(Debug)]
pub struct Shared {
    pub(crate) access: RwLock<AccessState>,
    pub(crate) state_file: StateFile,
    pub(crate) volumes: VolumeStore,
    conns: Mutex<HashMap<u64, (IpAddr, CancellationToken)>>,
    next_conn: AtomicU64,
}

impl Shared {
    /// Registers a data connection so that a block can cut it.
    pub(crate) fn register(&self, peer: IpAddr) -> (u64, CancellationToken) {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.conns.lock().insert(id, (peer, token.clone()));
        (id, token)
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.conns.lock().remove(&id);
    }

    /// Cuts every data connection whose peer is fenced in `state`. Returns how many.
    pub(crate) fn cut_fenced(&self, state: &AccessState) -> usize {
        let conns = self.conns.lock();
        let mut n = 0;
        for (peer, token) in conns.values() {
            if state.blocked_node_of(*peer).is_some() {
                token.cancel();
                n += 1;
            }
        }
        n
    }

    /// Number of open data connections.
    pub(crate) fn connection_count(&self) -> usize {
        self.conns.lock().len()
    }
}

/// A running server.
#[derive(Debug)]
pub struct RunningServer {
    /// Where the data path listens.
    pub data_addr: SocketAddr,
    /// Where the admin API listens.
    pub admin_addr: SocketAddr,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningServer {
    /// Stops accepting, cuts connections and waits for the listener tasks.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Normalises IPv4-mapped IPv6 peers to IPv4 so that ACLs written with IPv4 addresses match.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Loads state and volumes and starts both listeners.
pub async fn start(cfg: ServerConfig) -> Result<RunningServer, ServerError> {
    let listen_err = |addr: String| move |source| ServerError::Listen { addr, source };
    std::fs::create_dir_all(&cfg.state_dir).map_err(|source| {
        ServerError::State(crate::error::StateError::Io {
            path: cfg.state_dir.clone(),
            source,
        })
    })?;
    let state_file = StateFile::in_dir(&cfg.state_dir);
    let access = state_file.load()?;
    let volumes = VolumeStore::open(&cfg.state_dir.join("volumes"))?;
    for v in &cfg.volumes {
        volumes.create(v)?;
    }
    if cfg.token.is_none() && cfg.client_ca_pem.is_none() {
        return Err(ServerError::Tls {
            what: "admin authentication".into(),
            reason: "configure a token file or a client CA".into(),
        });
    }
    let tls = tls::server_config(
        &cfg.tls_cert_pem,
        cfg.tls_key_pem.expose().as_bytes(),
        cfg.client_ca_pem.as_deref(),
    )?;
    let shared = Arc::new(Shared {
        access: RwLock::new(access),
        state_file,
        volumes,
        conns: Mutex::new(HashMap::new()),
        next_conn: AtomicU64::new(0),
    });
    let data_addr = cfg
        .data_listener
        .local_addr()
        .map_err(listen_err("data".into()))?;
    let admin_addr = cfg
        .admin_listener
        .local_addr()
        .map_err(listen_err("admin".into()))?;
    cfg.data_listener
        .set_nonblocking(true)
        .map_err(listen_err(data_addr.to_string()))?;
    cfg.admin_listener
        .set_nonblocking(true)
        .map_err(listen_err(admin_addr.to_string()))?;
    let data_listener = tokio::net::TcpListener::from_std(cfg.data_listener)
        .map_err(listen_err(data_addr.to_string()))?;
    let admin_listener = tokio::net::TcpListener::from_std(cfg.admin_listener)
        .map_err(listen_err(admin_addr.to_string()))?;
    let shutdown = CancellationToken::new();
    let tasks = vec![
        tokio::spawn(data::serve(shared.clone(), data_listener, shutdown.clone())),
        tokio::spawn(admin::serve(
            shared,
            admin_listener,
            Arc::new(tls),
            cfg.token,
            shutdown.clone(),
        )),
    ];
    tracing::info!(%data_addr, %admin_addr, "storage server started");
    Ok(RunningServer {
        data_addr,
        admin_addr,
        shutdown,
        tasks,
    })
}
