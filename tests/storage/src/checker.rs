//! The at-most-one checker: a pure analysis of a volume's log (the order in which the storage
//! accepted writes) and the writers' acknowledgement logs.
//!
//! - **Split-brain**: pods are ordered by their first accepted write. A write of an earlier
//!   pod accepted after the first write of a later pod (its replacement) means two
//!   incarnations of the identity wrote concurrently.
//! - **Data loss**: an acknowledged write whose offset is missing from the log, or holds a
//!   different record.
//! - **Handover gap**: between consecutive pods, the server time from the old pod's last write
//!   before the replacement's first write to that first write.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::protocol::StoredRecord;
use crate::record::{Ack, WriterRecord};

/// One accepted write as the checker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Offset in the volume.
    pub offset: u64,
    /// Server acceptance time (ms since the epoch).
    pub server_ms: u64,
    /// Client address.
    pub client: String,
    /// The writer record, when the payload parses as one.
    pub record: Option<WriterRecord>,
}

/// Converts stored records into log entries.
pub fn entries_from(records: &[StoredRecord]) -> Vec<LogEntry> {
    records
        .iter()
        .map(|r| LogEntry {
            offset: r.offset,
            server_ms: r.server_ms,
            client: r.client.clone(),
            record: serde_json::from_slice(&r.payload).ok(),
        })
        .collect()
}

/// Per-pod summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSummary {
    /// Pod UID.
    pub pod_uid: String,
    /// Node.
    pub node: String,
    /// Offset of its first accepted write.
    pub first_offset: u64,
    /// Offset of its last accepted write.
    pub last_offset: u64,
    /// Accepted writes.
    pub writes: u64,
}

/// A write of an old pod accepted after its replacement had started writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitBrain {
    /// The old pod.
    pub old_pod: String,
    /// Its node.
    pub old_node: String,
    /// Offset of the offending write.
    pub offset: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The replacement that had already written.
    pub replacement_pod: String,
    /// The replacement's first offset.
    pub replacement_first_offset: u64,
}

/// An acknowledged write that the log does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostWrite {
    /// The acknowledgement.
    pub ack: Ack,
    /// What is wrong.
    pub reason: String,
}

/// The handover between two consecutive pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handover {
    /// Old pod.
    pub from_pod: String,
    /// New pod.
    pub to_pod: String,
    /// Old pod's node.
    pub from_node: String,
    /// New pod's node.
    pub to_node: String,
    /// Server-time gap in ms between the old pod's last write before the new pod's first
    /// write and that first write.
    pub gap_ms: i64,
}

/// The checker's findings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Accepted writes in the log.
    pub log_writes: usize,
    /// Entries whose payload is not a writer record.
    pub foreign_entries: usize,
    /// Acknowledgements checked.
    pub acks: usize,
    /// Pods in order of their first write.
    pub pods: Vec<PodSummary>,
    /// Split-brain violations.
    pub split_brain: Vec<SplitBrain>,
    /// Lost acknowledged writes.
    pub lost: Vec<LostWrite>,
    /// Handovers between consecutive pods.
    pub handovers: Vec<Handover>,
}

impl Report {
    /// True when neither split-brain nor data loss was found.
    pub fn passed(&self) -> bool {
        self.split_brain.is_empty() && self.lost.is_empty()
    }

    /// A human-readable report ending in a one-line verdict.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "log: {} accepted writes ({} foreign), {} acknowledgements checked",
            self.log_writes, self.foreign_entries, self.acks
        );
        for p in &self.pods {
            let _ = writeln!(
                s,
                "pod {} on {}: {} writes, offsets {}..={}",
                p.pod_uid, p.node, p.writes, p.first_offset, p.last_offset
            );
        }
        for h in &self.handovers {
            let _ = writeln!(
                s,
                "handover {} ({}) -> {} ({}): gap {} ms",
                h.from_pod, h.from_node, h.to_pod, h.to_node, h.gap_ms
            );
        }
        for v in self.split_brain.iter().take(20) {
            let _ = writeln!(
                s,
                "SPLIT-BRAIN: old pod {} on {} wrote seq {} at offset {} after replacement {} first wrote at offset {}",
                v.old_pod, v.old_node, v.seq, v.offset, v.replacement_pod, v.replacement_first_offset
            );
        }
        for l in self.lost.iter().take(20) {
            let _ = writeln!(
                s,
                "DATA LOSS: pod {} seq {} acknowledged at offset {}: {}",
                l.ack.pod_uid, l.ack.seq, l.ack.offset, l.reason
            );
        }
        let _ = if self.passed() {
            writeln!(
                s,
                "VERDICT: PASS (at-most-one held, no acknowledged write lost)"
            )
        } else {
            writeln!(
                s,
                "VERDICT: FAIL ({} split-brain writes, {} lost acknowledged writes)",
                self.split_brain.len(),
                self.lost.len()
            )
        };
        s
    }
}

/// Analyses a volume log and acknowledgement logs.
pub fn analyze(log: &[LogEntry], acks: &[Ack]) -> Report {
    let mut report = Report {
        log_writes: log.len(),
        acks: acks.len(),
        ..Report::default()
    };
    // Pods in order of first write.
    let mut order: Vec<String> = Vec::new();
    let mut pods: BTreeMap<String, PodSummary> = BTreeMap::new();
    for e in log {
        let Some(r) = &e.record else {
            report.foreign_entries += 1;
            continue;
        };
        let p = pods.entry(r.pod_uid.clone()).or_insert_with(|| {
            order.push(r.pod_uid.clone());
            PodSummary {
                pod_uid: r.pod_uid.clone(),
                node: r.node.clone(),
                first_offset: e.offset,
                last_offset: e.offset,
                writes: 0,
            }
        });
        p.last_offset = e.offset;
        p.writes += 1;
    }
    let rank: BTreeMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, u)| (u.as_str(), i))
        .collect();
    let firsts: Vec<u64> = order.iter().map(|u| pods[u].first_offset).collect();
    let by_offset: BTreeMap<u64, &LogEntry> = log.iter().map(|e| (e.offset, e)).collect();

    for e in log {
        let Some(r) = &e.record else { continue };
        let i = rank[r.pod_uid.as_str()];
        // The latest later pod that had started writing before this entry.
        if let Some(j) = (i + 1..order.len()).rev().find(|&j| firsts[j] < e.offset) {
            report.split_brain.push(SplitBrain {
                old_pod: r.pod_uid.clone(),
                old_node: r.node.clone(),
                offset: e.offset,
                seq: r.seq,
                replacement_pod: order[j].clone(),
                replacement_first_offset: firsts[j],
            });
        }
    }

    for k in 1..order.len() {
        let (old, new) = (&pods[&order[k - 1]], &pods[&order[k]]);
        let first_new = by_offset[&new.first_offset];
        let last_old = log
            .iter()
            .filter(|e| e.offset < new.first_offset)
            .rfind(|e| e.record.as_ref().is_some_and(|r| r.pod_uid == old.pod_uid));
        if let Some(last_old) = last_old {
            report.handovers.push(Handover {
                from_pod: old.pod_uid.clone(),
                to_pod: new.pod_uid.clone(),
                from_node: old.node.clone(),
                to_node: new.node.clone(),
                gap_ms: first_new.server_ms as i64 - last_old.server_ms as i64,
            });
        }
    }

    for a in acks {
        let reason = match by_offset.get(&a.offset).map(|e| &e.record) {
            None => Some("offset missing from the volume log".to_owned()),
            Some(None) => Some("offset holds a foreign record".to_owned()),
            Some(Some(r)) if r.pod_uid != a.pod_uid || r.seq != a.seq => Some(format!(
                "offset holds pod {} seq {} instead",
                r.pod_uid, r.seq
            )),
            Some(Some(_)) => None,
        };
        if let Some(reason) = reason {
            report.lost.push(LostWrite {
                ack: a.clone(),
                reason,
            });
        }
    }
    report.pods = order.iter().map(|u| pods[u].clone()).collect();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: u64, pod: &str, seq: u64, ms: u64) -> LogEntry {
        LogEntry {
            offset,
            server_ms: ms,
            client: "c".into(),
            record: Some(WriterRecord {
                pod_uid: pod.into(),
                pod: "web-0".into(),
                node: format!("node-of-{pod}"),
                seq,
                ts_ms: ms,
            }),
        }
    }

    fn ack(pod: &str, seq: u64, offset: u64) -> Ack {
        Ack {
            pod_uid: pod.into(),
            node: format!("node-of-{pod}"),
            seq,
            offset,
            ack_ms: 0,
        }
    }

    #[test]
    fn clean_handover_passes_and_reports_the_gap() {
        let log = vec![
            entry(0, "a", 0, 1000),
            entry(1, "a", 1, 1100),
            entry(2, "b", 0, 5100),
            entry(3, "b", 1, 5200),
        ];
        let acks = vec![ack("a", 0, 0), ack("a", 1, 1), ack("b", 0, 2)];
        let r = analyze(&log, &acks);
        assert!(r.passed(), "{}", r.render());
        assert_eq!(r.handovers.len(), 1);
        assert_eq!(r.handovers[0].gap_ms, 4000);
        assert_eq!(r.pods.len(), 2);
        assert!(r.render().contains("VERDICT: PASS"));
    }

    #[test]
    fn old_pod_write_after_replacement_is_split_brain() {
        let log = vec![
            entry(0, "a", 0, 1000),
            entry(1, "b", 0, 2000),
            entry(2, "a", 1, 2100),
            entry(3, "b", 1, 2200),
        ];
        let r = analyze(&log, &[]);
        assert!(!r.passed());
        assert_eq!(r.split_brain.len(), 1);
        let v = &r.split_brain[0];
        assert_eq!((v.old_pod.as_str(), v.offset, v.seq), ("a", 2, 1));
        assert_eq!(v.replacement_pod, "b");
        assert!(r.render().contains("VERDICT: FAIL"));
    }

    #[test]
    fn split_brain_across_three_incarnations_names_the_latest_replacement() {
        let log = vec![
            entry(0, "a", 0, 1),
            entry(1, "b", 0, 2),
            entry(2, "c", 0, 3),
            entry(3, "a", 1, 4),
            entry(4, "b", 1, 5),
        ];
        let r = analyze(&log, &[]);
        assert_eq!(r.split_brain.len(), 2);
        assert_eq!(r.split_brain[0].replacement_pod, "c");
        assert_eq!(r.split_brain[1].old_pod, "b");
    }

    #[test]
    fn missing_or_mismatched_acknowledged_write_is_data_loss() {
        let log = vec![entry(0, "a", 0, 1), entry(1, "a", 1, 2)];
        let acks = vec![
            ack("a", 0, 0),
            ack("a", 1, 1),
            ack("a", 2, 2),
            ack("a", 5, 1),
        ];
        let r = analyze(&log, &acks);
        assert!(!r.passed());
        assert_eq!(r.lost.len(), 2);
        assert!(r.lost[0].reason.contains("missing"));
        assert!(r.lost[1].reason.contains("instead"));
        assert!(r.split_brain.is_empty());
    }

    #[test]
    fn retried_duplicates_and_foreign_entries_are_not_violations() {
        let mut log = vec![
            entry(0, "a", 0, 1),
            entry(1, "a", 0, 2),
            entry(2, "a", 1, 3),
        ];
        log.push(LogEntry {
            offset: 3,
            server_ms: 4,
            client: "c".into(),
            record: None,
        });
        let r = analyze(&log, &[ack("a", 0, 1)]);
        assert!(r.passed());
        assert_eq!(r.foreign_entries, 1);
    }

    #[test]
    fn empty_log_passes() {
        assert!(analyze(&[], &[]).passed());
    }
}
