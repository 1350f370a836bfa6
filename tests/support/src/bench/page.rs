//! The benchmark page, `docs/benchmarks.md`, rendered from the data in `docs/data/` alone: each
//! bench's document (`bench-<name>.json`, see [`super`]) and the recovery bench's
//! (`recovery.json`). The prose here carries no figure; every number on the page is read from
//! a document written by the program that measured it. A bench without a recorded document
//! gets a section saying so, with the command that records it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The page, from the repository root.
pub const PATH: &str = "docs/benchmarks.md";

/// The command whose test renders and checks the page (with `PALISADE_WRITE_REPORTS=1`, it
/// rewrites it).
pub const TEST: &str = "cargo test -p palisade-test-support --test benchmarks_page";

/// A bench's section: its name in `hack/bench.sh` (its document is `bench-<name>.json`), the
/// section's title and what the bench does, in words without figures.
struct Section {
    name: &'static str,
    title: &'static str,
    about: &'static str,
}

/// The benches with a document of the common form, in the page's order (after recovery).
const SECTIONS: [Section; 7] = [
    Section {
        name: "scale",
        title: "Scale",
        about: "`palisade-scale-bench` creates simulated nodes (a Node, its Lease and a \
                FenceTarget each) against the lab's real API server, renews every live node's \
                Lease at the kubelet's period from a load generator (creation pauses while a \
                live node's last renewal is more than 16 s old, so that setting up nodes never \
                silences those already renewing), and runs the real \
                `palisade-controller` with its policy in dry run, so that a decision to fence \
                is an Event and nothing is ever fenced. Once every node has renewed within 1.5 \
                periods (two periods at least) it measures \
                the controller's and kube-controller-manager's memory and CPU, then silences \
                nodes one after another and measures, for each, the time from its threshold \
                (last renewal plus `unhealthyAfterSeconds`) to Palisade's decision, and from \
                its last renewal to the node lifecycle controller marking it Unknown (after \
                its own grace period). A decision about a node that was never silenced is a \
                false alarm.",
    },
    Section {
        name: "scale10k",
        title: "Scale: 10,000 nodes",
        about: "The same bench at the size of a large cluster: 10,000 simulated nodes against \
                the lab's real API server on the same 2-core machine, 500 of them silenced \
                within a second (one every 2 ms). The API server, etcd, the load generator \
                renewing 10,000 Leases, kube-controller-manager and the controller share the \
                two cores, so the figures carry the machine's saturation: compare them with \
                the peer's in the same run.",
    },
    Section {
        name: "node",
        title: "The node agent",
        about: "`node-bench` runs `palisade-node` on one lab machine (the real API server, \
                real processes). Pods are bound one at a time and each container writes the \
                time it started (bind → process start); the agent's memory is read with all \
                of them Running. TERM-ignoring pods with several grace periods and preStop \
                hooks are then deleted at once, and each death, seen from the host, is \
                compared with the kubelet's deadline. Last, the controller's image is pushed \
                under a fresh tag per run (cold for both tools) and pulled by the agent, \
                beside `buildah pull` into a fresh vfs root, over loopback and through the \
                hub relay the agent itself goes through.",
    },
    Section {
        name: "agents",
        title: "The fencing agents",
        about: "`palisade-fence-bench` times Palisade's fencing library and its fence-agents \
                compatible CLI beside the tools operators use today, in the same run and \
                against the same lab simulators: `ipmi_sim` BMCs beside `fence_ipmilan` and \
                `ipmitool`, the `snmpd` PDU beside `fence_apc_snmp`, and one `sushy-emulator` \
                (Redfish, on libvirt's test driver, where power changes are immediate) beside \
                `fence_redfish`. A verified off is timed until the device reads off. Last, \
                every BMC of the lab is fenced at once.",
    },
    Section {
        name: "bridge",
        title: "The firmware-bridge",
        about: "`bridge-bench` measures what the firmware-bridge adds on top of its executor, \
                in process on loopback with the recording executor (so the figures are the \
                bridge's own, not a device's): power-status calls made on the executor \
                directly, then through the bridge (mutual TLS on a kept-alive connection, \
                policy, rate limit, metrics), then throughput with concurrent clients, each \
                with its own connection and certificate.",
    },
    Section {
        name: "powerwatch",
        title: "The firmware-bridge serving the power watch",
        about: "`power-watch-bench` runs the real `firmware-bridge` daemon in its own process \
                in front of 1,000 of the project's lightweight BMCs (`palisade_ipmi::responder`, \
                one UDP socket each on loopback, a user and password of their own in the \
                bridge's secret store, a real RMCP+ session with cipher suite 17 per read, one \
                machine in ten off), and reads every machine's power the way the controller's \
                power watch does: every second, 16 reads at once, each bounded by 5 s, a read \
                still running not started again. Rounds through the bridge (one mTLS client, \
                kept-alive connections) alternate with rounds of the same reads made directly \
                by the `palisade-fence` IPMI client, the peer, after a warm-up round each; a \
                read that fails or reads the wrong state is a failed read. The bridge's CPU \
                time and resident memory are read from `/proc`. Last, machines are read one at \
                a time through the bridge and directly, beside `ipmitool` (a process per read, \
                with cipher suite 3: its suite 17 keys are derived otherwise than \
                `palisade-ipmi`'s, and so these BMCs').",
    },
    Section {
        name: "storage",
        title: "The lab storage",
        about: "`palisade-storage-bench` measures the lab's storage server in process on \
                loopback: the latency of a verified block through the storage firewall agent \
                (blocked, then read back until the server reports it), and the data path's \
                throughput with concurrent writers, each on its own volume, with an fsync per \
                record. It has no peer tool.",
    },
];

/// The page could not be rendered from the data.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// A data file exists but could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A data file is not JSON.
    #[error("{path} is not JSON")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A document lacks a field the page shows.
    #[error("{file} has no {field:?}")]
    Missing {
        /// The document's file name.
        file: String,
        /// The field, as a path of keys.
        field: String,
    },
}

/// The documents of the page, by file name, as read from the data directory.
struct Data<'a> {
    dir: &'a Path,
}

impl Data<'_> {
    /// The document `file`, or `None` if it was never recorded.
    fn read(&self, file: &str) -> Result<Option<Doc>, PageError> {
        let path = self.dir.join(file);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(PageError::Read { path, source }),
        };
        let value = serde_json::from_str(&text).map_err(|source| PageError::Parse {
            path: path.clone(),
            source,
        })?;
        Ok(Some(Doc {
            file: file.to_string(),
            value,
        }))
    }
}

/// One document, named for the errors it reports.
struct Doc {
    file: String,
    value: Value,
}

impl Doc {
    /// The value at `path` (keys from the root) in `v`, which must be present (`null` counts as
    /// present: a figure the bench could not measure).
    fn at<'v>(&self, v: &'v Value, path: &[&str]) -> Result<&'v Value, PageError> {
        path.iter().try_fold(v, |v, k| {
            v.get(k).ok_or_else(|| PageError::Missing {
                file: self.file.clone(),
                field: path.join("."),
            })
        })
    }

    fn get(&self, path: &[&str]) -> Result<&Value, PageError> {
        self.at(&self.value, path)
    }

    /// The value at `path` as text: strings as they are, `null` as `-`.
    fn text(&self, path: &[&str]) -> Result<String, PageError> {
        Ok(text(self.get(path)?))
    }

    /// "Measured … at commit … (… build, N CPUs, load average …)".
    fn measured(&self) -> Result<String, PageError> {
        let commit = match self.get(&["commit"])? {
            Value::Null => "an unknown commit".to_string(),
            c => format!("commit {}", text(c)),
        };
        let dirty = match self.value.get("uncommitted_changes") {
            Some(Value::Bool(true)) => " with uncommitted changes",
            _ => "",
        };
        let load = match self.value.get("load_average_start") {
            Some(start) => format!(
                "load average {} at the start and {} at the end",
                text(start),
                self.text(&["load_average"])?
            ),
            None => format!("load average {} at the end", self.text(&["load_average"])?),
        };
        Ok(format!(
            "Measured {} at {commit}{dirty} ({} build, {} CPUs, {load})",
            when(&self.text(&["measured_at"])?),
            self.text(&["build"])?,
            self.text(&["cpus"])?,
        ))
    }
}

/// A JSON value as a table cell or in a sentence: strings as they are, `null` as `-`.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), number),
        other => other.to_string(),
    }
}

/// An RFC 3339 timestamp to the minute (`2026-11-29 13:37 UTC`); anything else as it is.
fn when(t: &str) -> String {
    match (t.get(..10), t.get(11..16), t.ends_with('Z')) {
        (Some(day), Some(time), true) if t.as_bytes().get(10) == Some(&b'T') => {
            format!("{day} {time} UTC")
        }
        _ => t.to_string(),
    }
}

/// A figure with the digits that mean something at its size: a whole number as one, at
/// least three significant digits below 100 (two below 0.1), none from 100 up.
fn number(v: f64) -> String {
    let a = v.abs();
    if (v.fract() == 0.0 && a < 1e15) || a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        // 0.0019 keeps its two significant digits rather than reading 0.00.
        let digits = (1 - a.log10().floor() as i32).clamp(2, 9) as usize;
        format!("{v:.digits$}")
    }
}

/// A cell of a figure: the number, or `-` where there is none.
fn cell(v: &Value) -> String {
    v.as_f64().map_or_else(|| "-".to_string(), number)
}

/// The sentence for a bench never recorded.
fn not_recorded(bench: &str) -> String {
    format!(
        "Not recorded yet: no `docs/data/{}` exists. `RECORD=1 hack/bench.sh {bench}` (as root) \
         measures and records it, and rewrites this page.\n",
        if bench == "recovery" {
            "recovery.json".to_string()
        } else {
            format!("bench-{bench}.json")
        }
    )
}

/// The whole page, from the documents in `data_dir` (`docs/data/`).
///
/// Guarantees: every figure on the page is read from a document; a document without a field
/// the page shows is an error, never a page with holes; a bench without a document gets a
/// section that says it has not been recorded.
pub fn render(data_dir: &Path) -> Result<String, PageError> {
    let data = Data { dir: data_dir };
    let mut md = String::new();
    md.push_str(&format!(
        "# Benchmarks and measured figures\n\n\
         Generated from the data in `docs/data/` (`bench-<name>.json` and `recovery.json`, each \
         written by the benchmark that measured it; `RECORD=1 hack/bench.sh <name>` records \
         them) by `palisade-test-support`; do not edit: `PALISADE_WRITE_REPORTS=1 {TEST}` \
         rewrites it. Every figure was measured on the machine, at the date and with the \
         build stated with it, with the machine's core count and load average at the time \
         (the lab machines are shared: a loaded machine gives slower and noisier figures); \
         none is a promise for your hardware. `hack/bench.sh` runs the benchmarks (they are \
         not part of the tests); each measures Palisade beside the peer tool, where there is \
         one, in the same run and against the same lab simulators. Percentiles are nearest \
         rank (below 100 samples the p99 is the worst sample), and a ratio is the figure over \
         the peer's (below 1, the figure is the smaller). The simulation's and the campaigns' figures are in their own \
         chapters: [the simulation](simulation.md) and [the nemesis campaigns](campaigns.md).\n\n\
         ## The suite and the first install\n\n\
         No figure of them is recorded as data. The suite is `hack/test.sh` (fmt, clippy, \
         the build, then every test against the real parts), which CI runs through `.ci/run` \
         on a clean clone: the CI job's log times it, and `hack/test.sh` prints the disk its \
         build uses. `hack/install-deps.sh`, which the suite runs first, builds the lab's \
         Kubernetes releases the first time and finds them cached afterwards.\n\n\
         ## The demo\n\n\
         `hack/demo.sh` prints its own timeline: every step (the cut, the decision, the \
         verified fence, the release, the replacement writing) with its offset from the start \
         and from the cut. One run's output, line by line, is in [the demo](demo.md); no \
         figure of it is recorded as data.\n"
    ));
    recovery(&data, &mut md)?;
    for s in &SECTIONS {
        write!(
            md,
            "\n## {} (`hack/bench.sh {}`)\n\n{}\n\n",
            s.title, s.name, s.about
        )
        .expect("writing to a String");
        match data.read(&format!("bench-{}.json", s.name))? {
            None => md.push_str(&not_recorded(s.name)),
            Some(doc) => bench(s.name, &doc, &mut md)?,
        }
    }
    Ok(md)
}

/// A bench's section from its document: when and how it was measured, and its figures.
fn bench(name: &str, doc: &Doc, md: &mut String) -> Result<(), PageError> {
    let parameters = match doc.get(&["parameters"])? {
        Value::Object(m) if !m.is_empty() => format!(
            "; parameters: {}",
            m.iter()
                .map(|(k, v)| format!("{k} {}", text(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => String::new(),
    };
    writeln!(
        md,
        "{}: `{}`{parameters}. Data: [`docs/data/bench-{name}.json`](data/bench-{name}.json).\n",
        doc.measured()?,
        doc.text(&["command"])?,
    )
    .expect("writing to a String");
    let figures = doc.get(&["figures"])?;
    let figures = figures.as_array().ok_or_else(|| PageError::Missing {
        file: doc.file.clone(),
        field: "figures (a list)".into(),
    })?;
    // The peer's columns only for a bench that has a peer.
    let peers = figures.iter().any(|f| f.get("peer").is_some());
    if peers {
        md.push_str("| | unit | n | p50 | p99 | peer | n | p50 | p99 | ratio p50 | ratio p99 |\n");
        md.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    } else {
        md.push_str("| | unit | n | p50 | p99 |\n|---|---|---|---|---|\n");
    }
    for f in figures {
        let mut row = vec![
            doc.at(f, &["quantity"]).map(text)?,
            doc.at(f, &["unit"]).map(text)?,
            doc.at(f, &["count"]).map(text)?,
            doc.at(f, &["p50"]).map(cell)?,
            doc.at(f, &["p99"]).map(cell)?,
        ];
        match f.get("peer") {
            Some(p) => row.extend([
                doc.at(p, &["tool"]).map(text)?,
                doc.at(p, &["count"]).map(text)?,
                doc.at(p, &["p50"]).map(cell)?,
                doc.at(p, &["p99"]).map(cell)?,
                doc.at(f, &["ratio", "p50"]).map(cell)?,
                doc.at(f, &["ratio", "p99"]).map(cell)?,
            ]),
            None if peers => row.extend(std::iter::repeat_n(String::new(), 6)),
            None => {}
        }
        let row: Vec<String> = row.iter().map(|c| c.replace('|', "\\|")).collect();
        writeln!(md, "| {} |", row.join(" | ")).expect("writing to a String");
    }
    Ok(())
}

/// The recovery figures the page shows (the recovery report has them all), by their key in
/// `recovery.json`.
const RECOVERY_STEPS: [(&str, &str); 5] = [
    ("decided", "decided"),
    ("fenced", "fenced (verified)"),
    ("released", "released"),
    ("running", "replacement Running"),
    ("writing", "replacement writing"),
];

/// The recovery section, from `recovery.json` (the recovery bench's own document).
fn recovery(data: &Data, md: &mut String) -> Result<(), PageError> {
    md.push_str(
        "\n## Recovery time (`hack/bench.sh recovery`)\n\n\
         `palisade-recovery-bench` runs the headline scenario (a StatefulSet writer with a \
         ReadWriteOnce volume on m0) on a fresh lab per run, for two faults, alternately: m0 \
         **cut** off the network, judged by its silence, and m0 **switched off at its BMC** \
         (`ipmitool chassis power off`), judged on [power evidence](concepts.md#detection) \
         (the fence itself goes through the firmware-bridge, as after a cut), for each machine \
         kind on each Kubernetes release the lab builds. Offsets count from the instant the \
         fault returned (the partition, or the `chassis power off` command); the phases are \
         polled from the API. The binary takes `--kind`, `--kube`, `--fault` and `--runs`, \
         and renders the [recovery report](recovery-report.md) (every step, p50, p99 and \
         max, per series and fault) from the same data.\n\n",
    );
    let Some(doc) = data.read("recovery.json")? else {
        md.push_str(&not_recorded("recovery"));
        return Ok(());
    };
    let c = |k: &[&str]| -> Result<String, PageError> {
        let mut path = vec!["conditions"];
        path.extend_from_slice(k);
        doc.text(&path)
    };
    writeln!(
        md,
        "{}; {} runs per fault. Conditions: node Lease {} s renewed every {} s, Suspect after \
         {} s, Unhealthy after {} s, power evidence after {} s read off (the power watch \
         every {}), the API polled every {} ms. Data: \
         [`docs/data/recovery.json`](data/recovery.json). Seconds after the fault returned:\n",
        doc.measured()?,
        doc.text(&["runs_per_fault"])?,
        c(&["node_lease_seconds"])?,
        c(&["node_renew_seconds"])?,
        c(&["suspect_after_seconds"])?,
        c(&["unhealthy_after_seconds"])?,
        c(&["power", "power_off_after_seconds"])?,
        c(&["power", "power_watch_interval"])?,
        c(&["poll_ms"])?,
    )
    .expect("writing to a String");
    md.push_str("| machines | Kubernetes | fault | runs |");
    for (_, name) in RECOVERY_STEPS {
        write!(md, " → {name} p50 | p99 |").expect("writing to a String");
    }
    md.push_str("\n|---|---|---|---|");
    md.push_str(&"---|---|".repeat(RECOVERY_STEPS.len()));
    md.push('\n');
    let series = doc
        .get(&["series"])?
        .as_array()
        .cloned()
        .unwrap_or_default();
    for s in &series {
        let kind = match doc.at(s, &["kind"]).map(text)?.as_str() {
            "netns" => "namespace".to_string(),
            "qemu" => "QEMU".to_string(),
            other => other.to_string(),
        };
        let kube = doc.at(s, &["kube"]).map(text)?;
        let faults = doc
            .at(s, &["faults"])?
            .as_array()
            .cloned()
            .unwrap_or_default();
        for f in &faults {
            write!(
                md,
                "| {kind} | {kube} | {} | {} |",
                doc.at(f, &["fault"]).map(text)?,
                doc.at(f, &["stats", "running", "count"]).map(text)?,
            )
            .expect("writing to a String");
            for (key, _) in RECOVERY_STEPS {
                write!(
                    md,
                    " {} | {} |",
                    doc.at(f, &["stats", key, "p50"]).map(cell)?,
                    doc.at(f, &["stats", key, "p99"]).map(cell)?,
                )
                .expect("writing to a String");
            }
            md.push('\n');
        }
    }
    if let Some(w) = doc.value.get("without_palisade").filter(|w| !w.is_null()) {
        writeln!(
            md,
            "\nWithout Palisade (kube-controller-manager alone, one cut, watched {} s), at the \
             end: {}.",
            doc.at(w, &["watched_seconds"]).map(text)?,
            doc.at(w, &["stuck"]).map(text)?,
        )
        .expect("writing to a String");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::bench::{Figure, Run, Stat};

    fn dir_with(files: &[(&str, &Value)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "palisade-bench-page-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, v) in files {
            std::fs::write(dir.join(name), v.to_string()).unwrap();
        }
        dir
    }

    #[test]
    fn a_bench_without_data_is_said_not_recorded_with_its_command() {
        let dir = dir_with(&[]);
        let page = render(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        for name in [
            "recovery",
            "scale",
            "scale10k",
            "node",
            "agents",
            "bridge",
            "powerwatch",
            "storage",
        ] {
            assert!(
                page.contains(&format!("`RECORD=1 hack/bench.sh {name}`")),
                "{name}: {page}"
            );
        }
        assert!(!page.contains("| p50 |"), "no table without data: {page}");
    }

    #[test]
    fn a_bench_document_becomes_its_table_with_the_peer_and_the_ratio() {
        let doc = Run::start("agents").document(
            json!({"iterations": 15}),
            &[
                Figure::new("IPMI status: palisade", "ms", Stat::of([2.0, 4.0]))
                    .beside("fence_ipmilan", Stat::of([8.0, 16.0])),
                Figure::new("RSS", "MiB", Stat::of([23.5])),
            ],
            Value::Null,
        );
        let dir = dir_with(&[("bench-agents.json", &doc)]);
        let page = render(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            page.contains("| IPMI status: palisade | ms | 2 | 2 | 4 | fence_ipmilan | 2 | 8 | 16 | 0.25 | 0.25 |"),
            "{page}"
        );
        assert!(
            page.contains("| RSS | MiB | 1 | 23.5 | 23.5 |  |  |  |  |  |  |"),
            "{page}"
        );
        assert!(page.contains("parameters: iterations 15"), "{page}");
        assert!(page.contains("load average"), "{page}");
        assert!(page.contains("`RECORD=1 hack/bench.sh storage`"), "{page}");
    }

    #[test]
    fn a_bench_without_a_peer_has_no_peer_columns() {
        let doc = Run::start("storage").document(
            json!({}),
            &[Figure::new("block", "ms", Stat::of([8.0, 12.5]))],
            Value::Null,
        );
        let dir = dir_with(&[("bench-storage.json", &doc)]);
        let page = render(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            page.contains("| | unit | n | p50 | p99 |\n|---|---|---|---|---|\n| block | ms | 2 | 8 | 12.5 |\n"),
            "{page}"
        );
    }

    #[test]
    fn a_document_without_a_field_the_page_shows_is_an_error() {
        let mut doc = Run::start("storage").document(json!({}), &[], Value::Null);
        doc.as_object_mut().unwrap().remove("build");
        let dir = dir_with(&[("bench-storage.json", &doc)]);
        let err = render(&dir).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.contains("build"), "{err}");
    }

    #[test]
    fn timestamps_are_shown_to_the_minute() {
        assert_eq!(
            when("2026-11-29T13:37:14.731248279Z"),
            "2026-11-29 13:37 UTC"
        );
        assert_eq!(when("yesterday"), "yesterday");
        assert_eq!(number(0.123456), "0.12");
        assert_eq!(number(12.345), "12.3");
        assert_eq!(number(1234.4), "1234");
        assert_eq!(number(100.0), "100");
        assert_eq!(number(0.0019357), "0.0019");
        assert_eq!(number(0.035), "0.035");
        assert_eq!(number(-42.42), "-42.4");
    }
}
