//! The companion's peer check: the node agent's ([`crate::peer`]), timed on the companion's
//! own writes.
//!
//! A peer vouches only while its last write *attempt* is at least `vouch_after` old, and the
//! controller counts a node healthy only within `vouch_after` minus four clock skews of a
//! write it observed; so no node the controller counts healthy can vouch, and two strict
//! majorities of one member set intersect (see [`crate::peer`] and
//! `palisade_decide::majority`). On a stock node the Lease's `renewTime` is the kubelet's,
//! which the companion neither times nor controls. The companion therefore vouches on its
//! own write clock, and stamps every write ([`palisade_model::advertise::COMPANION_WRITTEN`]),
//! taken just before the write clock records the attempt; the controller feeds a node's
//! healthy streak from that stamp, never from the kubelet's renewals, whenever the Lease
//! carries one (`palisade_decide::memory::Memory::observe`).
//!
//! Guarantees:
//! - every write attempt of a companion with the peer check carries the stamp and the peer
//!   check (its vouch delay, answer validity and the member set offered), and is recorded on
//!   the write clock after the stamp is taken and before it is sent;
//! - every write is conditional on the `resourceVersion` the pass read, so once a write has
//!   succeeded no earlier attempt can land (the member lists the poller must satisfy are those
//!   of [`crate::peer::MemberBook`]);
//! - the companion answers peers only after one of its stamped writes has succeeded: before
//!   that, the Lease may still carry an earlier companion's unstamped advertisement, whose
//!   node the controller counts healthy on the kubelet's renewals.
//!
//! Assumptions: one companion writes a node's Lease annotations (a DaemonSet's pod); an
//! earlier companion without the peer check no longer has a write in flight once this one
//! has written.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use palisade_model::advertise::{Advertisement, PeerCheck};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::peer::{ExcuseRx, MemberBook, Peer, PeerConfig, PeerKey, PeerMetrics, WriteClock};

/// The companion's peer-check settings.
#[derive(Debug, Clone)]
pub struct PeerSetup {
    /// The protocol's settings (vouch delay, answer validity, port, polling).
    pub config: PeerConfig,
    /// The cluster's shared key.
    pub key: Arc<PeerKey>,
    /// The node's address (its InternalIP, where peers reach it): the companion listens on it
    /// at the peer port.
    pub address: IpAddr,
    /// How often the Node list (the peer set) is read regardless of the Node watch.
    pub list_interval: Duration,
}

/// What the writes need from the peer check.
#[derive(Clone)]
pub struct PeerWrites {
    check: PeerCheck,
    book: Arc<MemberBook>,
    peers: watch::Receiver<Vec<Peer>>,
    clock: WriteClock,
}

impl PeerWrites {
    /// The peer check to advertise with the next write attempt, its member set recorded as an
    /// attempt that may land.
    pub fn offer(&self) -> PeerCheck {
        PeerCheck {
            members: self.book.offer(&self.peers.borrow()),
            ..self.check
        }
    }

    /// Records a write attempt about to be sent (after its stamp was taken).
    pub fn sending(&self) {
        self.clock.record_write();
    }

    /// A write that carried `ad` succeeded.
    pub fn written(&self, ad: &Advertisement) {
        if let Some(set) = ad.peer_check.and_then(|p| p.members) {
            self.book.written(set);
        }
    }
}

/// A started peer check: what the writes use, and how long the peers excuse the node.
pub struct Started {
    /// What the writes need.
    pub writes: PeerWrites,
    /// Until when a strict majority excuses the node from its self-fence.
    pub excused: ExcuseRx,
}

/// Starts the peer check: binds its port (an error here stops the companion at its start),
/// keeps the Node list, asks the peers whenever the last successful write (sent at
/// `renewed`) is more than `overdue` old, and answers peers once `renewed` first moves (the
/// first successful write).
pub async fn start(
    client: kube::Client,
    setup: PeerSetup,
    renewed: watch::Receiver<Instant>,
    overdue: Duration,
) -> std::io::Result<Started> {
    let listen = SocketAddr::new(setup.address, setup.config.port);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, vouch_after = ?setup.config.vouch_after, answer_valid = ?setup.config.answer_valid, "peer check enabled: answering peers once a write of ours has landed");
    let clock = WriteClock::new();
    let metrics = Arc::new(PeerMetrics::default());
    {
        let (cfg, key, clock, metrics) = (
            setup.config.clone(),
            setup.key.clone(),
            clock.clone(),
            metrics.clone(),
        );
        let mut first = renewed.clone();
        tokio::spawn(async move {
            if first.changed().await.is_ok() {
                crate::peer::serve(cfg, key, listener, clock, metrics).await;
            }
        });
    }
    let (peers_tx, peers) = watch::channel(Vec::new());
    tokio::spawn(crate::peer::node_list_loop(
        client,
        setup.list_interval,
        peers_tx,
    ));
    let book = Arc::new(MemberBook::new(&setup.config.node));
    let (excused_tx, excused) = watch::channel(None);
    let needed: Arc<dyn Fn() -> bool + Send + Sync> =
        Arc::new(move || renewed.borrow().elapsed() > overdue);
    tokio::spawn(crate::peer::poll(
        setup.config.clone(),
        setup.key,
        book.clone(),
        clock.clone(),
        needed,
        excused_tx,
        metrics,
    ));
    Ok(Started {
        writes: PeerWrites {
            check: PeerCheck {
                vouch_after: setup.config.vouch_after,
                answer_valid: setup.config.answer_valid,
                members: None,
            },
            book,
            peers,
            clock,
        },
        excused,
    })
}
