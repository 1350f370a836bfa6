//! The peer check's flags, shared by the node agent and the companion: both ask and answer on
//! the same port with the same protocol, so a cluster may mix them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use palisade_model::advertise::PeerCheck;

use super::{PeerConfig, PeerKey, DEFAULT_KEY_FILE};

fn parse_duration(s: &str) -> Result<Duration, String> {
    palisade_model::duration::parse(s)
}

/// The peer check's command-line flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PeerArgs {
    /// The peer check's shared key (a file of at least 32 secret bytes, the same on every
    /// node; default /etc/palisade-node/peer.key; create it with `palisade-node peer-key
    /// generate <file>`): when this node's writes stop reaching the API, ask the other nodes
    /// whether they cannot reach it either, and keep the pods (and pet the watchdog) only
    /// while a strict majority vouches so (a control-plane outage). Refused at start without
    /// a usable key unless --no-peer-check is given.
    #[arg(long)]
    pub peer_key_file: Option<PathBuf>,
    /// Run without the peer check: every lost write self-fences, so an API-server outage
    /// longer than --self-fence-after stops every stateful pod of the cluster.
    #[arg(long, conflicts_with = "peer_key_file")]
    pub no_peer_check: bool,
    /// The peer-check port, on the node's address, the same on every node.
    #[arg(long, default_value_t = 10260)]
    pub peer_port: u16,
    /// Vouch to a peer only after this long without a write of our own (at least 4 s plus two
    /// write intervals, and shorter than --self-fence-after; default: a third of the way from
    /// the write interval to --self-fence-after, raised to that floor). The controller counts
    /// a node healthy only within this minus 4 s of its writes.
    #[arg(long, value_parser = parse_duration)]
    pub peer_vouch_after: Option<Duration>,
    /// How long a peer's vouch excuses us, from when we asked (the controller waits this out
    /// before it trusts our self-fence). Also the time a node has, after an outage, to write
    /// once its peers write again (they stop vouching then).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub peer_answer_valid: Duration,
    /// How often to ask the peers while our writes are not getting through.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub peer_poll_interval: Duration,
    /// How often to LIST the Nodes (the peer set) regardless of the Node watch, which relists
    /// at once when a Node is added or deleted (at least 1s).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub peer_list_interval: Duration,
}

impl PeerArgs {
    /// The key file, or `None` when the peer check is off (`--no-peer-check`).
    pub fn key_path(&self) -> Option<PathBuf> {
        if self.no_peer_check {
            return None;
        }
        Some(
            self.peer_key_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_KEY_FILE)),
        )
    }

    /// Reads the key, or `None` when the peer check is off. A missing, unreadable or short
    /// key is an error that says how to create the key and how to opt out: a node must not
    /// quietly run without the peer check.
    pub fn key(&self) -> anyhow::Result<Option<PeerKey>> {
        let Some(path) = self.key_path() else {
            return Ok(None);
        };
        match PeerKey::from_file(&path) {
            Ok(key) => Ok(Some(key)),
            Err(e) => {
                let given = if self.peer_key_file.is_some() {
                    "--peer-key-file"
                } else {
                    "the peer check is on by default and needs its key (default path)"
                };
                bail!(
                    "{given}: {e}.\n\
                     Create the key ONCE, on one machine: palisade-node peer-key generate {p}\n\
                     then copy that same file (mode 0600) to {p} on every node: every node must hold the SAME key (keys generated on each node differ, and peers with different keys never vouch for each other).\n\
                     Or opt out with --no-peer-check: then every lost write self-fences, so an API-server outage longer than --self-fence-after stops every stateful pod of the cluster.",
                    p = path.display()
                )
            }
        }
    }

    /// The vouch delay of a node that writes every `write_interval` and self-fences after
    /// `self_fence_after`: as given, or a third of the way from one to the other, and never
    /// below [`PeerCheck::min_vouch_after`] (the shortest one the controller can count healthy
    /// nodes with: a shorter default made every peer-checked self-fence wait for a healthy
    /// majority that the controller could never see).
    pub fn vouch_after(&self, write_interval: Duration, self_fence_after: Duration) -> Duration {
        self.peer_vouch_after.unwrap_or_else(|| {
            let third = write_interval + (self_fence_after.saturating_sub(write_interval)) / 3;
            third.max(PeerCheck::min_vouch_after(write_interval))
        })
    }

    /// Why these flags cannot work for a node that writes every `write_interval` and
    /// self-fences after `self_fence_after` (`Ok`: they can, or the peer check is off).
    pub fn validate(
        &self,
        write_interval: Duration,
        self_fence_after: Duration,
    ) -> anyhow::Result<()> {
        if self.key_path().is_none() {
            return Ok(());
        }
        let a = self.vouch_after(write_interval, self_fence_after);
        let floor = PeerCheck::min_vouch_after(write_interval);
        if a < floor {
            bail!(
                "--peer-vouch-after {a:?} is too short: the controller counts a node healthy only within --peer-vouch-after minus four clock skews of its writes, so below {floor:?} (4s plus two write intervals) it could never see a healthy majority and would never trust a self-fence"
            );
        }
        if a >= self_fence_after {
            bail!(
                "--peer-vouch-after {a:?} must be shorter than --self-fence-after {self_fence_after:?} (peers must be able to vouch before this node self-fences); with the peer check, --self-fence-after must be above {floor:?}"
            );
        }
        if self.peer_answer_valid <= self.peer_poll_interval {
            bail!("--peer-answer-valid must be longer than --peer-poll-interval");
        }
        if self.peer_list_interval < Duration::from_secs(1) {
            bail!("--peer-list-interval must be at least 1s");
        }
        Ok(())
    }

    /// The peer check's settings for node `node`.
    pub fn config(
        &self,
        node: &str,
        write_interval: Duration,
        self_fence_after: Duration,
    ) -> PeerConfig {
        PeerConfig {
            node: node.to_string(),
            port: self.peer_port,
            vouch_after: self.vouch_after(write_interval, self_fence_after),
            answer_valid: self.peer_answer_valid,
            poll_interval: self.peer_poll_interval,
            request_timeout: self.peer_poll_interval.mul_f32(0.8),
        }
    }
}
