//! The storage firewall's state: which nodes are blocked and which nodes may write which
//! volume. Pure decisions plus an atomically replaced, fsynced state file.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::StateError;

/// Why a request from a client address is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The address (or the node it belongs to) is blocked by a storage fence.
    Blocked {
        /// The blocked node.
        node: String,
    },
    /// The address is not granted write access to the volume.
    Denied,
}

/// Blocks and grants. Serialised as the server's state file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessState {
    /// Blocked nodes and their blocked addresses.
    #[serde(default)]
    pub blocked: BTreeMap<String, BTreeSet<IpAddr>>,
    /// Per volume, the nodes allowed to write it and their addresses.
    #[serde(default)]
    pub grants: BTreeMap<String, BTreeMap<String, BTreeSet<IpAddr>>>,
    /// Per blocked node, the holds on it: one per fence that blocked it (the name the fence
    /// gave), `""` for a block that named none. A node is blocked while it has any hold; a
    /// blocked node without an entry (a state file from before holds) has the unnamed one.
    #[serde(default)]
    pub holds: BTreeMap<String, BTreeSet<String>>,
}

impl AccessState {
    /// Nodes that own `peer` (through a block or a grant).
    fn owners(&self, peer: IpAddr) -> BTreeSet<&str> {
        let mut out = BTreeSet::new();
        for (node, addrs) in &self.blocked {
            if addrs.contains(&peer) {
                out.insert(node.as_str());
            }
        }
        for nodes in self.grants.values() {
            for (node, addrs) in nodes {
                if addrs.contains(&peer) {
                    out.insert(node.as_str());
                }
            }
        }
        out
    }

    /// Whether `peer` is fenced: its address is blocked, or it belongs to a blocked node.
    pub fn blocked_node_of(&self, peer: IpAddr) -> Option<String> {
        self.owners(peer)
            .into_iter()
            .find(|n| self.blocked.contains_key(*n))
            .map(str::to_owned)
    }

    /// May `peer` append to `volume`? A fence wins over any grant.
    pub fn check_write(&self, volume: &str, peer: IpAddr) -> Result<(), Refusal> {
        if let Some(node) = self.blocked_node_of(peer) {
            return Err(Refusal::Blocked { node });
        }
        let granted = self
            .grants
            .get(volume)
            .is_some_and(|nodes| nodes.values().any(|a| a.contains(&peer)));
        if granted {
            Ok(())
        } else {
            Err(Refusal::Denied)
        }
    }

    /// May `peer` read? Reads are open to any client that is not fenced.
    pub fn check_read(&self, peer: IpAddr) -> Result<(), Refusal> {
        match self.blocked_node_of(peer) {
            Some(node) => Err(Refusal::Blocked { node }),
            None => Ok(()),
        }
    }

    /// Every address known for `node` from its grants.
    pub fn granted_addresses(&self, node: &str) -> BTreeSet<IpAddr> {
        self.grants
            .values()
            .filter_map(|nodes| nodes.get(node))
            .flatten()
            .copied()
            .collect()
    }

    /// Blocks `node`: the given addresses plus every address its grants name. Returns the
    /// blocked set, or `None` (and changes nothing) when no address is known at all, because
    /// a block that blocks nothing must never be reported as a fence.
    pub fn block(&mut self, node: &str, addresses: &[IpAddr]) -> Option<BTreeSet<IpAddr>> {
        self.block_for(node, addresses, "")
    }

    /// [`AccessState::block`] on behalf of the fence named `hold` (`""`: unnamed): the node
    /// stays blocked until every hold on it is lifted.
    pub fn block_for(
        &mut self,
        node: &str,
        addresses: &[IpAddr],
        hold: &str,
    ) -> Option<BTreeSet<IpAddr>> {
        let mut set = self.granted_addresses(node);
        set.extend(addresses.iter().copied());
        if let Some(existing) = self.blocked.get(node) {
            set.extend(existing.iter().copied());
        }
        if set.is_empty() {
            return None;
        }
        let legacy = !self.holds.contains_key(node) && self.blocked.contains_key(node);
        let holds = self.holds.entry(node.to_owned()).or_default();
        if legacy {
            holds.insert(String::new());
        }
        holds.insert(hold.to_owned());
        self.blocked.insert(node.to_owned(), set.clone());
        Some(set)
    }

    /// Lifts every block of `node` (the operator's node-wide unfence). Returns whether it was
    /// blocked.
    pub fn unblock(&mut self, node: &str) -> bool {
        self.holds.remove(node);
        self.blocked.remove(node).is_some()
    }

    /// Lifts the hold `hold` of one fence on `node`; the node stays blocked while any other
    /// hold remains. Returns whether the node had that hold.
    ///
    /// Guarantees: a fence's unblock never lifts another fence's block, so a late unblock from
    /// a deposed controller cannot unfence a node that a newer fence blocked.
    pub fn release_hold(&mut self, node: &str, hold: &str) -> bool {
        if !self.blocked.contains_key(node) {
            return false;
        }
        let holds = self
            .holds
            .entry(node.to_owned())
            .or_insert_with(|| BTreeSet::from([String::new()]));
        let had = holds.remove(hold);
        if holds.is_empty() {
            self.holds.remove(node);
            self.blocked.remove(node);
        }
        had
    }

    /// The holds on `node` (empty when it is not blocked).
    pub fn holds_of(&self, node: &str) -> Vec<String> {
        match (self.blocked.contains_key(node), self.holds.get(node)) {
            (false, _) => Vec::new(),
            (true, Some(h)) => h.iter().cloned().collect(),
            (true, None) => vec![String::new()],
        }
    }

    /// Allows `node` (with `addresses`) to write `volume`; replaces the node's previous
    /// addresses for that volume.
    pub fn grant(&mut self, volume: &str, node: &str, addresses: &[IpAddr]) {
        self.grants
            .entry(volume.to_owned())
            .or_default()
            .insert(node.to_owned(), addresses.iter().copied().collect());
    }

    /// Removes `node`'s write access to `volume`. Returns whether it had any.
    pub fn revoke(&mut self, volume: &str, node: &str) -> bool {
        let Some(nodes) = self.grants.get_mut(volume) else {
            return false;
        };
        let had = nodes.remove(node).is_some();
        if nodes.is_empty() {
            self.grants.remove(volume);
        }
        had
    }
}

/// The state file: `state.json` replaced atomically (write temp, fsync, rename, fsync dir).
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file inside `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        StateFile {
            path: dir.join("state.json"),
        }
    }

    /// Loads the state; a missing file is the empty state.
    pub fn load(&self) -> Result<AccessState, StateError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| StateError::Corrupt {
                path: self.path.clone(),
                source,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(AccessState::default()),
            Err(source) => Err(StateError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Persists the state durably.
    ///
    /// Guarantees: on `Ok`, a crash at any later point reloads exactly `state`; on `Err`, the
    /// previous state file is intact.
    pub fn save(&self, state: &AccessState) -> Result<(), StateError> {
        let io = |source| StateError::Io {
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(state).map_err(|source| StateError::Corrupt {
            path: self.path.clone(),
            source,
        })?;
        let mut f = File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn writes_need_a_grant_and_a_block_wins_over_a_grant() {
        let mut s = AccessState::default();
        assert_eq!(s.check_write("v", ip("10.0.0.1")), Err(Refusal::Denied));
        s.grant("v", "m0", &[ip("10.0.0.1")]);
        assert_eq!(s.check_write("v", ip("10.0.0.1")), Ok(()));
        assert_eq!(s.check_write("other", ip("10.0.0.1")), Err(Refusal::Denied));
        assert_eq!(s.check_write("v", ip("10.0.0.2")), Err(Refusal::Denied));
        // Block by name only: the addresses come from the grants.
        let set = s.block("m0", &[]).unwrap();
        assert!(set.contains(&ip("10.0.0.1")));
        assert_eq!(
            s.check_write("v", ip("10.0.0.1")),
            Err(Refusal::Blocked { node: "m0".into() })
        );
        assert!(s.check_read(ip("10.0.0.1")).is_err());
        // A grant with a new address for a blocked node is still fenced.
        s.grant("w", "m0", &[ip("10.0.0.9")]);
        assert!(matches!(
            s.check_write("w", ip("10.0.0.9")),
            Err(Refusal::Blocked { .. })
        ));
        assert!(s.unblock("m0"));
        assert!(!s.unblock("m0"));
        assert_eq!(s.check_write("v", ip("10.0.0.1")), Ok(()));
    }

    #[test]
    fn a_fences_unblock_lifts_only_its_own_hold() {
        let mut s = AccessState::default();
        s.grant("db", "m0", &[ip("10.0.0.1")]);
        s.block_for("m0", &[], "palisade-old").unwrap();
        // The old fence's recovery lifted its hold; a newer fence blocks the node again.
        assert!(s.release_hold("m0", "palisade-old"));
        assert!(s.blocked.is_empty());
        s.block_for("m0", &[], "palisade-new").unwrap();
        // A deposed controller's late unblock of the old fence changes nothing.
        assert!(!s.release_hold("m0", "palisade-old"));
        assert_eq!(
            s.check_write("db", ip("10.0.0.1")),
            Err(Refusal::Blocked { node: "m0".into() })
        );
        assert_eq!(s.holds_of("m0"), vec!["palisade-new".to_string()]);
        // Two holds: the node is blocked until both are lifted.
        s.block_for("m0", &[], "palisade-other").unwrap();
        assert!(s.release_hold("m0", "palisade-new"));
        assert!(s.blocked_node_of(ip("10.0.0.1")).is_some());
        assert!(s.release_hold("m0", "palisade-other"));
        assert_eq!(s.check_write("db", ip("10.0.0.1")), Ok(()));
        // An unnamed block (or one from a state file before holds) survives a named unblock;
        // the operator's node-wide unblock lifts everything.
        s.block("m0", &[]).unwrap();
        s.holds.clear();
        assert!(!s.release_hold("m0", "palisade-new"));
        assert!(s.blocked_node_of(ip("10.0.0.1")).is_some());
        s.block_for("m0", &[], "palisade-x").unwrap();
        assert_eq!(
            s.holds_of("m0"),
            vec![String::new(), "palisade-x".to_string()]
        );
        assert!(s.unblock("m0"));
        assert!(s.holds_of("m0").is_empty());
        assert_eq!(s.check_write("db", ip("10.0.0.1")), Ok(()));
    }

    #[test]
    fn block_without_any_known_address_is_refused() {
        let mut s = AccessState::default();
        assert_eq!(s.block("ghost", &[]), None);
        assert!(s.blocked.is_empty());
        let set = s.block("m1", &[ip("10.0.0.5")]).unwrap();
        assert_eq!(set.len(), 1);
        assert!(matches!(
            s.check_write("v", ip("10.0.0.5")),
            Err(Refusal::Blocked { .. })
        ));
    }

    #[test]
    fn revoke_removes_access() {
        let mut s = AccessState::default();
        s.grant("v", "m0", &[ip("10.0.0.1")]);
        assert!(s.revoke("v", "m0"));
        assert!(!s.revoke("v", "m0"));
        assert_eq!(s.check_write("v", ip("10.0.0.1")), Err(Refusal::Denied));
        assert!(s.grants.is_empty());
    }

    #[test]
    fn state_file_round_trips_and_missing_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::in_dir(dir.path());
        assert_eq!(f.load().unwrap(), AccessState::default());
        let mut s = AccessState::default();
        s.grant("v", "m0", &[ip("10.0.0.1")]);
        s.block("m0", &[]).unwrap();
        f.save(&s).unwrap();
        assert_eq!(f.load().unwrap(), s);
        std::fs::write(dir.path().join("state.json"), b"{not json").unwrap();
        assert!(f.load().is_err());
    }
}
