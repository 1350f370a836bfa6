//! The campaign's history: one JSON object per line, in the order the nemesis saw things.
//!
//! Every record carries `t`, seconds since the campaign started on the nemesis' clock. Device
//! and API times (`atUs`) are the controller's own timestamps, in microseconds since the Unix
//! epoch, so the checks compare times that came from one status object.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::schedule::Fault;

/// One piece of fence evidence, as read from a NodeFence's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvidenceRec {
    /// Plan level.
    pub level: i32,
    /// Device URL.
    pub device: String,
    /// `PowerOff`, `StorageBlocked` or `SelfFenceTimeout`.
    pub kind: String,
    /// What the device reported.
    pub observed: String,
    /// When, µs since the epoch.
    pub at_us: i64,
}

/// A released pod, as read from a NodeFence's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleasedRec {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// When, µs since the epoch.
    pub at_us: i64,
}

/// What one observation of a NodeFence's status said (the whole status is one API object, so
/// everything here was true at once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FenceSnapshot {
    /// The NodeFence's name.
    pub fence: String,
    /// Its UID.
    pub uid: String,
    /// The node it fences.
    pub node: String,
    /// Its phase.
    pub phase: String,
    /// Its fencing token.
    pub token: Option<i64>,
    /// Levels recorded as verified.
    pub verified_levels: Vec<i32>,
    /// Evidence recorded.
    pub evidence: Vec<EvidenceRec>,
    /// Pods recorded as released.
    pub released: Vec<ReleasedRec>,
    /// Every phase transition so far: (phase, µs since the epoch, message).
    pub transitions: Vec<(String, i64, String)>,
    /// Why it failed, if it did.
    pub failure: Option<String>,
    /// Its `metadata.creationTimestamp`, µs since the epoch: set by the API server on the
    /// host's clock (which no fault steps), truncated to the whole second, so the NodeFence was
    /// created in `[created_us, created_us + 1 s)`. `None` in histories written before it was
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_us: Option<i64>,
}

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Record {
    /// The campaign's parameters.
    Start {
        /// Seconds since start.
        t: f64,
        /// The seed.
        seed: u64,
        /// Machines in the lab.
        machines: usize,
        /// Writers.
        writers: usize,
        /// Events scheduled.
        events: usize,
    },
    /// A fault was applied.
    Fault {
        /// Seconds since start.
        t: f64,
        /// Event index.
        event: usize,
        /// The fault as scheduled.
        fault: Fault,
        /// The machine it hit, resolved when applied.
        machine: Option<String>,
        /// What was done (pid signalled, controller identity, ...).
        detail: String,
    },
    /// A fault was healed.
    Heal {
        /// Seconds since start.
        t: f64,
        /// Event index.
        event: usize,
        /// What was done.
        detail: String,
    },
    /// A scheduled fault could not be applied (for example, its machine was powered off).
    Skipped {
        /// Seconds since start.
        t: f64,
        /// Event index.
        event: usize,
        /// Why.
        reason: String,
    },
    /// A NodeFence changed phase (one record per transition, with the status at that moment).
    Phase {
        /// Seconds since start.
        t: f64,
        /// The phase entered.
        phase: String,
        /// The transition's message.
        message: String,
        /// The status at the time it was observed.
        snapshot: FenceSnapshot,
        /// The fenced machine's boot ID sampled just *before* the status was read (`None`:
        /// powered off, or not sampled in histories written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        boot_before: Option<String>,
        /// The same, sampled just *after* the status was read. A power cycle always changes
        /// the boot ID, so the two bracket what the status says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        boot_after: Option<String>,
        /// When a list first returned this NodeFence (the host's wall clock, µs since the
        /// epoch): the NodeFence existed by then (its status, only by the poll that recorded
        /// it). `None` in histories written before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seen_us: Option<i64>,
    },
    /// A NodeFence's status listed newly released pods.
    Release {
        /// Seconds since start.
        t: f64,
        /// The pods newly listed.
        pods: Vec<ReleasedRec>,
        /// The status at the time it was observed.
        snapshot: FenceSnapshot,
    },
    /// A writer pod was first seen bound to a node.
    Pod {
        /// Seconds since start.
        t: f64,
        /// The StatefulSet (writer) name.
        writer: String,
        /// Pod name.
        name: String,
        /// Pod UID.
        uid: String,
        /// Node it is bound to.
        node: String,
        /// When the nemesis first saw it, µs since the epoch (the host's clock, which the
        /// controller's timestamps also come from).
        seen_us: i64,
    },
    /// The nemesis itself repaired the lab (a technician's action, outside Palisade).
    Repair {
        /// Seconds since start.
        t: f64,
        /// What was done.
        detail: String,
    },
    /// The nemesis waited for the lab to settle before the next event.
    Settle {
        /// Seconds since start.
        t: f64,
        /// Whether it settled before the deadline.
        settled: bool,
        /// What it was waiting for, if it did not.
        waiting_for: String,
    },
    /// A NodeFence as it was at the end of the campaign.
    FenceFinal {
        /// Seconds since start.
        t: f64,
        /// Its final status.
        snapshot: FenceSnapshot,
    },
    /// A writer's acknowledgements and the storage checker's verdict over its volume.
    Writer {
        /// Seconds since start.
        t: f64,
        /// The writer (StatefulSet) name.
        writer: String,
        /// Per pod: (uid, node, acknowledged writes).
        pods: Vec<(String, String, usize)>,
        /// Writes the volume accepted.
        log_writes: usize,
        /// Split-brain findings.
        split_brain: usize,
        /// Acknowledged writes the volume lost.
        lost: usize,
        /// The checker's rendering.
        report: String,
    },
    /// One record of the firmware-bridge's audit log, verbatim.
    Audit {
        /// Seconds since start.
        t: f64,
        /// The audit record.
        record: serde_json::Value,
    },
    /// The lab saw a machine lose its power or start a new boot (ground truth, from the lab:
    /// the machine's power process and the boot ID its boot reported), whatever made it: a
    /// fence, a watchdog, a PDU.
    Boot {
        /// Seconds since start.
        t: f64,
        /// The machine.
        machine: String,
        /// The new boot ID; `None` when the machine is off.
        boot: Option<String>,
        /// When the observer saw it (the host's wall clock, µs since the epoch), to compare
        /// with the time a NodeFence was requested.
        at_us: i64,
    },
    /// The API server took a new renewal of a node's Lease (`kube-node-lease/<node>`): its
    /// `spec.renewTime` changed between two successful lists (ground truth: the value is only
    /// compared, never read as a time, so the machine's clock does not matter). The write
    /// landed after `after_us` and before `seen_us`, both on the host's wall clock, which is
    /// the API server's.
    Renewal {
        /// Seconds since start.
        t: f64,
        /// The node (and the Lease's name).
        node: String,
        /// When the previous successful list of the Leases was started, µs since the epoch:
        /// that list read the old value, so the write landed after this.
        after_us: i64,
        /// When the list that read the new value had finished, µs since the epoch.
        seen_us: i64,
    },
    /// Two incarnations of a volume-less identity were alive at once (see
    /// [`crate::presence`]).
    TwoIncarnations {
        /// Seconds since start.
        t: f64,
        /// The identity (pod name).
        identity: String,
        /// The processes: (machine marker, pod UID, pid).
        processes: Vec<(String, String, i32)>,
    },
    /// A violation found by a check.
    Violation {
        /// Seconds since start.
        t: f64,
        /// Which check.
        check: String,
        /// What it found.
        detail: String,
    },
}

/// An append-only history file, shared by the runner and the observer.
pub struct History {
    start: Instant,
    path: PathBuf,
    file: Mutex<File>,
    records: Mutex<Vec<Record>>,
}

impl History {
    /// Creates (truncates) the history file.
    pub fn create(path: &Path) -> std::io::Result<History> {
        Ok(History {
            start: Instant::now(),
            path: path.to_path_buf(),
            file: Mutex::new(File::create(path)?),
            records: Mutex::new(Vec::new()),
        })
    }

    /// Now, µs since the Unix epoch.
    pub fn now_us() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0)
    }

    /// Seconds since the history was created.
    pub fn t(&self) -> f64 {
        (self.start.elapsed().as_millis() as f64) / 1000.0
    }

    /// Appends a record (and flushes it, so a killed campaign keeps its history).
    pub fn push(&self, r: Record) {
        if let Ok(line) = serde_json::to_string(&r) {
            let mut f = self.file.lock();
            let _ = writeln!(f, "{line}");
            let _ = f.flush();
        }
        self.records.lock().push(r);
    }

    /// Every record so far.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().clone()
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads a history file back (lines that do not parse are reported as errors with their
/// number).
pub fn read(path: &Path) -> Result<Vec<Record>, String> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&line)
                .map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Target;

    #[test]
    fn a_history_reads_back_as_it_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let h = History::create(&path).unwrap();
        h.push(Record::Fault {
            t: 1.5,
            event: 0,
            fault: Fault::CutAll {
                target: Target::WriterHost(1),
                hold_ms: 8_000,
            },
            machine: Some("m2".into()),
            detail: "All for 8000 ms".into(),
        });
        h.push(Record::Heal {
            t: 9.5,
            event: 0,
            detail: "healed".into(),
        });
        assert_eq!(read(&path).unwrap(), h.records());
    }
}
