//! The observer: polls the API every half second while the campaign runs and records every
//! NodeFence phase transition and release (with the status they were observed in, and the
//! fenced machine's boot ID sampled just before and just after the status was read), every
//! renewal of a node's Lease the API server took (every fifth of a second, [`run_leases`]) and every writer pod's
//! binding, and scans the processes of volume-less identities ([`crate::presence`]). A poll
//! that fails (the API server is down) is simply retried.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use palisade_model::nodefence::LevelResult;
use palisade_model::NodeFence;
use palisade_scenario::Cluster;

use crate::history::{EvidenceRec, FenceSnapshot, History, Record, ReleasedRec};
use crate::world::APP_NS;

/// What one NodeFence's status says, in the history's terms.
pub fn snapshot(nf: &NodeFence) -> FenceSnapshot {
    let st = nf.status.clone().unwrap_or_default();
    FenceSnapshot {
        fence: nf.name_any(),
        uid: nf.uid().unwrap_or_default(),
        node: nf.spec.node_name.clone(),
        phase: st.phase.as_str().to_string(),
        token: st.fencing_token,
        verified_levels: st
            .levels
            .iter()
            .filter(|l| l.result == LevelResult::Verified)
            .map(|l| l.level)
            .collect(),
        evidence: st
            .evidence
            .iter()
            .map(|e| EvidenceRec {
                level: e.level,
                device: e.device.clone(),
                kind: format!("{:?}", e.kind),
                observed: e.observed.clone(),
                at_us: e.at.0.as_microsecond(),
            })
            .collect(),
        released: st
            .release
            .pods
            .iter()
            .map(|p| ReleasedRec {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
                at_us: p.at.0.as_microsecond(),
            })
            .collect(),
        transitions: st
            .transitions
            .iter()
            .map(|t| {
                (
                    t.phase.as_str().to_string(),
                    t.at.0.as_microsecond(),
                    t.message.clone(),
                )
            })
            .collect(),
        failure: st
            .failure
            .map(|f| format!("{:?} in {}: {}", f.reason, f.phase, f.message)),
        created_us: nf
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_microsecond()),
    }
}

/// What the observer remembers of the node Leases between two lists, to turn each list into
/// the renewals that landed since the last one ([`Record::Renewal`]).
#[derive(Debug, Default)]
pub struct LeaseWatch {
    /// Per node: its Lease's `spec.renewTime` (µs, the machine's stamp, only compared) at the
    /// last successful list.
    renewed: BTreeMap<String, i64>,
    /// When the last successful list was started (host wall clock, µs).
    started_us: Option<i64>,
}

impl LeaseWatch {
    /// One list of the Leases, started at `started_us` and finished at `finished_us`; `listed`
    /// is each node's `renewTime`, or `None` when the list failed. Returns a renewal for each
    /// node whose value changed since the last successful list: that list read the old value
    /// after it was started, so the new one landed after its start and before this list
    /// finished.
    ///
    /// Guarantees: every renewal returned truly landed in `[after_us, seen_us]`. A failed list
    /// changes nothing (the next successful one is compared with the last that succeeded, over
    /// the wider interval). The first list, and a Lease that was absent from the last list,
    /// give nothing: no earlier value to compare with. Two renewals between lists are one.
    pub fn list(
        &mut self,
        t: f64,
        started_us: i64,
        finished_us: i64,
        listed: Option<BTreeMap<String, i64>>,
    ) -> Vec<Record> {
        let Some(listed) = listed else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Some(after_us) = self.started_us {
            for (node, renew) in &listed {
                if self.renewed.get(node).is_some_and(|old| old != renew) {
                    out.push(Record::Renewal {
                        t,
                        node: node.clone(),
                        after_us,
                        seen_us: finished_us,
                    });
                }
            }
        }
        self.renewed = listed;
        self.started_us = Some(started_us);
        out
    }
}

/// Each node Lease's `spec.renewTime` (µs since the epoch), if the API answers; a Lease without
/// one is left out.
fn list_renewals(c: &Cluster) -> Option<BTreeMap<String, i64>> {
    let api: Api<Lease> = Api::namespaced(c.client.clone(), NODE_LEASE_NS);
    let list = c.rt.block_on(api.list(&ListParams::default())).ok()?;
    Some(
        list.items
            .into_iter()
            .filter_map(|l| {
                let renew = l.spec.as_ref()?.renew_time.as_ref()?.0.as_microsecond();
                Some((l.name_any(), renew))
            })
            .collect(),
    )
}

/// Where the nodes' heartbeat Leases are.
const NODE_LEASE_NS: &str = "kube-node-lease";

/// Each machine's boot ID if it is powered (`None` when off).
fn boots(lab: &palisade_lab::Lab) -> BTreeMap<String, Option<String>> {
    lab.machines()
        .iter()
        .map(|m| {
            let boot = m.is_powered().then(|| m.boot_id()).flatten();
            (m.name().to_string(), boot)
        })
        .collect()
}

/// Every NodeFence, if the API answers.
pub fn list_fences(c: &Cluster) -> Option<Vec<NodeFence>> {
    let api: Api<NodeFence> = Api::all(c.client.clone());
    c.rt.block_on(api.list(&ListParams::default()))
        .ok()
        .map(|l| l.items)
}

/// Prints each violation found during the campaign the first time it is found.
fn report_online(
    h: &History,
    reported: &mut BTreeSet<(&'static str, String)>,
    found: Vec<crate::check::Violation>,
) {
    for v in found {
        if reported.insert((v.check, v.detail.clone())) {
            println!(
                "[{:>8.1}s] VIOLATION (seen online) [{}] {}",
                h.t(),
                v.check,
                v.detail
            );
        }
    }
}

/// Every how many polls (of about half a second) the multi-status checks run over the history
/// so far.
const ONLINE_EVERY: u64 = 20;
/// How long a pod must have been seen before the online checks judge its replacement.
const PODS_SETTLE_US: i64 = 5_000_000;

/// How often [`run_leases`] lists the node Leases.
pub const LEASE_POLL: Duration = Duration::from_millis(200);

/// Lists the node Leases every [`LEASE_POLL`] until `stop` is set and records each renewal
/// with its bounds ([`LeaseWatch`]). Its own thread, beside [`run`], so the bounds stay narrow
/// (one poll plus one list, about a quarter of a second) whatever else the observer reads.
///
/// Guarantees: with renewals a second apart and the campaign's Unhealthy threshold of 4 s, a
/// fence created on a node that kept renewing has a renewal whose bounds fit the window of
/// `fence-while-heard` (at least 1.5 s wide: the threshold less the margin and the second the
/// `creationTimestamp` is truncated to), so the check's verdict does not depend on where the
/// polls fell. Bounded by the campaign, as [`run`].
pub fn run_leases(c: &Cluster, h: &History, stop: &AtomicBool) {
    let mut leases = LeaseWatch::default();
    while !stop.load(Ordering::Relaxed) {
        let started_us = History::now_us();
        let listed = list_renewals(c);
        for r in leases.list(h.t(), started_us, History::now_us(), listed) {
            h.push(r);
        }
        std::thread::sleep(LEASE_POLL);
    }
}

/// Polls until `stop` is set. Bounded by the campaign: the runner sets `stop` before it
/// judges the history.
/// `skew`: the offsets the schedule gives the controllers' clocks
/// ([`crate::check::ClockSkew`]).
pub fn run(
    c: &Cluster,
    lab: &palisade_lab::Lab,
    h: &History,
    stop: &AtomicBool,
    skew: crate::check::ClockSkew,
) {
    // Per NodeFence UID: transitions and released pods already recorded.
    let mut seen: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut pods_seen: BTreeSet<String> = BTreeSet::new();
    let mut overlaps_seen: BTreeSet<(String, Vec<String>)> = BTreeSet::new();
    // The online part of the checks: what one status shows on its own (a release without
    // verified evidence, outside the fence, not covered; an illegal transition) is reported
    // as soon as it is observed, and what spans several records (a replacement before its old
    // node was fenced, a token going down, a fence without a cause or of a node still heard,
    // two live incarnations)
    // every ONLINE_EVERY polls, so a long campaign shows a finding when it happens. The
    // history is still judged whole at the end.
    let mut pod_nodes: BTreeMap<String, String> = BTreeMap::new();
    let mut reported: BTreeSet<(&'static str, String)> = BTreeSet::new();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), APP_NS);
    let mut polls: u64 = 0;
    let mut beats = crate::presence::Beats::default();
    // Each machine's boot at the last poll: a change is recorded (`Record::Boot`).
    let mut last_boots: BTreeMap<String, Option<String>> = BTreeMap::new();
    let started = std::time::Instant::now();
    // When each NodeFence was first listed (by UID), from a list made before the machines'
    // boots are sampled (see below).
    let mut first_seen: BTreeMap<String, i64> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        // A fence created and already powering its machine off within one poll would
        // otherwise be first seen after the boot change it caused, and `fence-while-heard`
        // would take its own power-off for the machine going down before it: listed first,
        // a fence is seen before any boot change it causes in the same poll.
        if let Some(fences) = list_fences(c) {
            let at = History::now_us();
            for uid in fences.iter().filter_map(|f| f.metadata.uid.clone()) {
                first_seen.entry(uid).or_insert(at);
            }
        }
        // The ground truth beside what the statuses claim, sampled before and after they are
        // read, so that the two samples bracket the status.
        let before = boots(lab);
        for (m, boot) in &before {
            if last_boots.get(m).is_some_and(|b| b != boot) {
                h.push(Record::Boot {
                    t: h.t(),
                    machine: m.clone(),
                    boot: boot.clone(),
                    at_us: History::now_us(),
                });
            }
        }
        last_boots.clone_from(&before);
        if let Some(fences) = list_fences(c) {
            let seen_us = History::now_us();
            let after = boots(lab);
            for nf in &fences {
                let s = snapshot(nf);
                let (t_seen, r_seen) = seen.entry(s.uid.clone()).or_default();
                for (phase, _, message) in s.transitions.iter().skip(*t_seen) {
                    h.push(Record::Phase {
                        t: h.t(),
                        phase: phase.clone(),
                        message: message.clone(),
                        snapshot: s.clone(),
                        boot_before: before.get(&s.node).cloned().flatten(),
                        boot_after: after.get(&s.node).cloned().flatten(),
                        seen_us: Some(
                            first_seen
                                .get(&s.uid)
                                .map_or(seen_us, |f| (*f).min(seen_us)),
                        ),
                    });
                }
                *t_seen = (*t_seen).max(s.transitions.len());
                if s.released.len() > *r_seen {
                    h.push(Record::Release {
                        t: h.t(),
                        pods: s.released[*r_seen..].to_vec(),
                        snapshot: s.clone(),
                    });
                    *r_seen = s.released.len();
                }
                report_online(
                    h,
                    &mut reported,
                    crate::check::check_snapshot(&s, &pod_nodes, skew),
                );
            }
        }
        if let Ok(list) = c.rt.block_on(pods.list(&ListParams::default())) {
            for p in list.items {
                let (Some(uid), Some(node)) =
                    (p.uid(), p.spec.as_ref().and_then(|s| s.node_name.clone()))
                else {
                    continue;
                };
                if pods_seen.insert(uid.clone()) {
                    pod_nodes.insert(uid.clone(), node.clone());
                    h.push(Record::Pod {
                        t: h.t(),
                        writer: p.labels().get("app").cloned().unwrap_or_default(),
                        name: p.name_any(),
                        uid,
                        node,
                        seen_us: History::now_us(),
                    });
                }
            }
        }
        polls += 1;
        if polls.is_multiple_of(ONLINE_EVERY) {
            // The checks that span several statuses, over the history so far; a pod seen in
            // the last few seconds waits for the next round (its fence may not be read yet).
            let cutoff = History::now_us() - PODS_SETTLE_US;
            let so_far: Vec<Record> = h
                .records()
                .into_iter()
                .filter(|r| !matches!(r, Record::Pod { seen_us, .. } if *seen_us > cutoff))
                .collect();
            report_online(h, &mut reported, crate::check::check_so_far(&so_far));
        }
        // A QEMU guest's processes are invisible here: its identities beat instead.
        for (identity, both) in beats.read(&lab.shared_dir(), &[crate::world::IDENTITY], || {
            started.elapsed().as_secs_f64()
        }) {
            let uids: Vec<String> = both.iter().map(|(_, uid)| uid.clone()).collect();
            if overlaps_seen.insert((identity.clone(), uids)) {
                h.push(Record::TwoIncarnations {
                    t: h.t(),
                    identity,
                    // No host pid: the guest's own, unknown here.
                    processes: both.into_iter().map(|(m, uid)| (m, uid, 0)).collect(),
                });
            }
        }
        for (identity, found) in crate::presence::scan(lab.id()) {
            let both = crate::presence::overlapping(&found);
            if both.is_empty() {
                continue;
            }
            let mut uids: Vec<String> = both.iter().map(|p| p.pod_uid.clone()).collect();
            uids.sort();
            uids.dedup();
            // One record per pair of incarnations, however long they overlap.
            if overlaps_seen.insert((identity.clone(), uids)) {
                h.push(Record::TwoIncarnations {
                    t: h.t(),
                    identity,
                    processes: both
                        .into_iter()
                        .map(|p| (p.machine, p.pod_uid, p.pid))
                        .collect(),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(renewed: &[(&str, i64)]) -> Option<BTreeMap<String, i64>> {
        Some(renewed.iter().map(|(n, r)| (n.to_string(), *r)).collect())
    }

    /// (node, after_us, seen_us) of each renewal.
    fn landed(records: Vec<Record>) -> Vec<(String, i64, i64)> {
        records
            .into_iter()
            .map(|r| match r {
                Record::Renewal {
                    node,
                    after_us,
                    seen_us,
                    ..
                } => (node, after_us, seen_us),
                other => panic!("not a renewal: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_first_list_records_no_renewal() {
        let mut w = LeaseWatch::default();
        assert!(w
            .list(0.0, 100, 110, listed(&[("m0", 1), ("m1", 1)]))
            .is_empty());
    }

    #[test]
    fn a_changed_renew_time_landed_after_the_previous_list_was_started() {
        let mut w = LeaseWatch::default();
        w.list(0.0, 100, 110, listed(&[("m0", 1), ("m1", 1)]));
        // m0 renewed (its stamp may go back: a machine clock step; only a change counts), m1
        // did not.
        assert_eq!(
            landed(w.list(0.5, 600, 620, listed(&[("m0", -7), ("m1", 1)]))),
            [("m0".to_string(), 100, 620)]
        );
        assert_eq!(
            landed(w.list(1.0, 1_100, 1_130, listed(&[("m0", -7), ("m1", 2)]))),
            [("m1".to_string(), 600, 1_130)]
        );
    }

    #[test]
    fn a_failed_list_keeps_the_older_lower_bound() {
        let mut w = LeaseWatch::default();
        w.list(0.0, 100, 110, listed(&[("m0", 1)]));
        assert!(w.list(0.5, 600, 5_000, None).is_empty());
        assert_eq!(
            landed(w.list(5.0, 5_100, 5_120, listed(&[("m0", 2)]))),
            [("m0".to_string(), 100, 5_120)]
        );
    }

    #[test]
    fn a_lease_absent_from_the_last_list_records_no_renewal() {
        let mut w = LeaseWatch::default();
        w.list(0.0, 100, 110, listed(&[("m0", 1)]));
        assert!(w
            .list(0.5, 600, 620, listed(&[("m0", 1), ("m1", 5)]))
            .is_empty());
        // Once seen, it counts.
        assert_eq!(
            landed(w.list(1.0, 1_100, 1_120, listed(&[("m0", 1), ("m1", 6)]))),
            [("m1".to_string(), 600, 1_120)]
        );
    }
}
