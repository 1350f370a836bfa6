//! Benchmark figures as data, written once for every benchmark `hack/bench.sh` runs.
//!
//! A benchmark measures samples, summarises each measured quantity with [`Stat`] (nearest-rank
//! percentiles, the one definition every bench uses), puts it beside the peer tool's figure
//! where there is one ([`Figure::beside`]), and writes the lot with [`Run::write`]: a JSON
//! document that also records when, where and how it was measured ([`provenance`]: the date,
//! the commit, the build profile, the machine's core count and load average, and the command
//! line). `hack/bench.sh` passes `--out target/bench/<name>.json` ([`out_flag`] reads it for the
//! benches without clap), and with `RECORD=1` copies the document to
//! `docs/data/bench-<name>.json`, from which [`page`] renders `docs/benchmarks.md`.

pub mod page;

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

/// The nearest-rank percentile `p` (in `(0, 1]`) of `sorted` (ascending): the smallest value
/// with at least a fraction `p` of the sample at or below it. Below 100 values the p99 is the
/// largest. `None` for an empty sample.
pub fn nearest_rank(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
    Some(sorted[rank - 1])
}

/// A sample's size, extremes and nearest-rank p50 and p99 ([`nearest_rank`]), in the sample's
/// unit. Every field but `count` is `None` for an empty sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stat {
    /// How many values the sample has.
    pub count: usize,
    /// The smallest value.
    pub min: Option<f64>,
    /// The median (nearest rank).
    pub p50: Option<f64>,
    /// The 99th percentile (nearest rank: the largest value below 100 values).
    pub p99: Option<f64>,
    /// The largest value.
    pub max: Option<f64>,
}

impl Stat {
    /// The statistics of `values` (in any order).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Stat {
        let mut v: Vec<f64> = values.into_iter().collect();
        v.sort_by(f64::total_cmp);
        Stat {
            count: v.len(),
            min: v.first().copied(),
            p50: nearest_rank(&v, 0.5),
            p99: nearest_rank(&v, 0.99),
            max: v.last().copied(),
        }
    }

    /// `{"count", "min", "p50", "p99", "max"}`, absent values as `null`.
    pub fn json(&self) -> Value {
        json!({"count": self.count, "min": self.min, "p50": self.p50, "p99": self.p99, "max": self.max})
    }

    /// The statistics [`Stat::json`] wrote, read back; `None` unless `v` has a whole `count`
    /// (a missing or non-numeric figure reads as absent).
    pub fn from_json(v: &Value) -> Option<Stat> {
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        Some(Stat {
            count: usize::try_from(v.get("count")?.as_u64()?).ok()?,
            min: f("min"),
            p50: f("p50"),
            p99: f("p99"),
            max: f("max"),
        })
    }
}

/// The same quantity measured with the peer tool (or the baseline) in the same run.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// The tool and how it was run (`fence_ipmilan --lanplus --cipher=3`).
    pub tool: String,
    /// Its figures, in the quantity's unit.
    pub stat: Stat,
}

/// One measured quantity: its statistics and, where there is one, the peer's beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// What was measured, including whose figure it is (`IPMI status: palisade (library)`).
    pub quantity: String,
    /// The unit of every value (`ms`, `s`, `MiB`, `records/s`).
    pub unit: &'static str,
    /// The statistics of the measured samples.
    pub stat: Stat,
    /// The peer's statistics of the same quantity, measured in the same run.
    pub peer: Option<Peer>,
}

impl Figure {
    /// A figure without a peer.
    pub fn new(quantity: impl Into<String>, unit: &'static str, stat: Stat) -> Figure {
        Figure {
            quantity: quantity.into(),
            unit,
            stat,
            peer: None,
        }
    }

    /// The figure with `tool`'s statistics beside it.
    pub fn beside(self, tool: impl Into<String>, stat: Stat) -> Figure {
        Figure {
            peer: Some(Peer {
                tool: tool.into(),
                stat,
            }),
            ..self
        }
    }

    /// The ratio of the figure's p50 to the peer's, and of the p99s ([`RATIO`]); `None` where
    /// either is missing or the peer's is zero.
    pub fn ratio(&self) -> (Option<f64>, Option<f64>) {
        let Some(peer) = &self.peer else {
            return (None, None);
        };
        let of = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b != 0.0 => Some(a / b),
            _ => None,
        };
        (
            of(self.stat.p50, peer.stat.p50),
            of(self.stat.p99, peer.stat.p99),
        )
    }

    /// The figure as written in a bench document: the quantity, its unit, its statistics and,
    /// with a peer, `"peer"` (the tool and its statistics) and `"ratio"` (`p50`, `p99`).
    pub fn json(&self) -> Value {
        let mut v = self.stat.json();
        v["quantity"] = json!(self.quantity);
        v["unit"] = json!(self.unit);
        if let Some(peer) = &self.peer {
            let mut p = peer.stat.json();
            p["tool"] = json!(peer.tool);
            v["peer"] = p;
            let (p50, p99) = self.ratio();
            v["ratio"] = json!({"p50": p50, "p99": p99});
        }
        v
    }
}

/// What every ratio in a bench document is.
pub const RATIO: &str = "the figure / the peer's (below 1: the figure is smaller)";

/// The machine's load average (1, 5 and 15 minutes), as `/proc/loadavg` gives it.
pub fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// When, where and how figures were measured, as every bench document (and the recovery
/// bench's) records it: `measured_at` (now, UTC), `commit` and `uncommitted_changes` (as far
/// as `git` in the working directory tells; `null` outside a checkout), `build` (`debug` or
/// `release`), `cpus` and `load_average` (now, so noise from other work on the machine is on
/// record beside the figures).
///
/// Assumptions: the bench is built with the same profile as this crate (the workspace's
/// profiles override only optimisation levels per package, never debug assertions).
pub fn provenance() -> Map<String, Value> {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty());
    let v = json!({
        "measured_at": jiff::Timestamp::now().to_string(),
        "commit": git(&["rev-parse", "--short", "HEAD"]),
        "uncommitted_changes": dirty,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "cpus": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "load_average": load_average(),
    });
    match v {
        Value::Object(m) => m,
        _ => unreachable!("json!({{…}}) is an object"),
    }
}

/// One run of a benchmark, from its start: what it is and the load the machine had when it
/// began.
#[derive(Debug, Clone)]
pub struct Run {
    bench: &'static str,
    load_average_start: Option<String>,
    command: Vec<String>,
}

impl Run {
    /// A run of the bench `bench` (its name in `hack/bench.sh`), starting now.
    pub fn start(bench: &'static str) -> Run {
        Run {
            bench,
            load_average_start: load_average(),
            command: std::env::args()
                .enumerate()
                .map(|(i, a)| match i {
                    // The program's name, not where it was built.
                    0 => Path::new(&a)
                        .file_name()
                        .map_or(a.clone(), |f| f.to_string_lossy().into_owned()),
                    _ => a,
                })
                .collect(),
        }
    }

    /// The bench document: the run's [`provenance`] (the load average at the start and now),
    /// its command line, `parameters` (every setting, defaults included), the `figures`, and
    /// `details` (whatever else the bench keeps: samples, per-run rows; `null` for none).
    pub fn document(&self, parameters: Value, figures: &[Figure], details: Value) -> Value {
        let mut doc = provenance();
        doc.insert("bench".into(), json!(self.bench));
        doc.insert("load_average_start".into(), json!(self.load_average_start));
        doc.insert("command".into(), json!(self.command.join(" ")));
        doc.insert("parameters".into(), parameters);
        doc.insert("percentiles".into(), json!("nearest rank"));
        doc.insert("ratio".into(), json!(RATIO));
        doc.insert(
            "figures".into(),
            Value::Array(figures.iter().map(Figure::json).collect()),
        );
        doc.insert("details".into(), details);
        Value::Object(doc)
    }

    /// Writes [`Run::document`] to `path` (creating its directory).
    pub fn write(
        &self,
        path: &Path,
        parameters: Value,
        figures: &[Figure],
        details: Value,
    ) -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let doc = self.document(parameters, figures, details);
        let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    }
}

/// A command line's `--out` flag was malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OutFlagError {
    /// `--out` was the last argument.
    #[error("--out needs a value (a .json file)")]
    Missing,
    /// `--out` names something other than a `.json` file.
    #[error("--out names a .json file, not {0:?}")]
    NotJson(PathBuf),
}

/// Takes `--out FILE.json` out of `args` (the arguments after the program's name), for the
/// benches whose other arguments are positional: the file, if given, and the rest in order.
pub fn out_flag(args: Vec<String>) -> Result<(Option<PathBuf>, Vec<String>), OutFlagError> {
    let mut out = None;
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--out" {
            let path = PathBuf::from(it.next().ok_or(OutFlagError::Missing)?);
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                return Err(OutFlagError::NotJson(path));
            }
            out = Some(path);
        } else {
            rest.push(a);
        }
    }
    Ok((out, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_the_p99_of_a_small_sample_is_its_worst() {
        let s = Stat::of((1..=100).rev().map(f64::from));
        assert_eq!(
            (s.count, s.min, s.p50, s.p99, s.max),
            (100, Some(1.0), Some(50.0), Some(99.0), Some(100.0))
        );
        let small = Stat::of([3.0, 1.0, 2.0, 9.0]);
        assert_eq!((small.p50, small.p99), (Some(2.0), Some(9.0)));
        assert_eq!(Stat::of([3.0]).p99, Some(3.0));
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.9), Some(5.0));
    }

    #[test]
    fn statistics_read_back_are_those_written() {
        let s = Stat::of([0.5, 2.0, 7.25]);
        assert_eq!(Stat::from_json(&s.json()), Some(s));
        assert_eq!(Stat::from_json(&json!({"p50": 1.0})), None);
    }

    #[test]
    fn an_empty_sample_has_a_count_and_no_figures() {
        assert_eq!(Stat::of([]), Stat::default());
        assert_eq!(
            Stat::of([]).json(),
            json!({"count": 0, "min": null, "p50": null, "p99": null, "max": null})
        );
    }

    #[test]
    fn a_figure_beside_its_peer_carries_the_ratio_of_each_percentile() {
        let f = Figure::new("status", "ms", Stat::of([1.0, 2.0, 4.0]))
            .beside("fence_ipmilan", Stat::of([8.0, 8.0, 16.0]));
        assert_eq!(f.ratio(), (Some(0.25), Some(0.25)));
        let v = f.json();
        assert_eq!(v["peer"]["tool"], json!("fence_ipmilan"));
        assert_eq!(v["ratio"], json!({"p50": 0.25, "p99": 0.25}));
        assert_eq!(v["p50"], json!(2.0));
        let alone = Figure::new("rss", "MiB", Stat::of([23.0])).json();
        assert!(alone.get("peer").is_none() && alone.get("ratio").is_none());
    }

    #[test]
    fn a_ratio_against_a_missing_or_zero_peer_figure_is_absent() {
        let f = Figure::new("x", "ms", Stat::of([1.0])).beside("y", Stat::of([0.0]));
        assert_eq!(f.ratio(), (None, None));
        let f = Figure::new("x", "ms", Stat::of([1.0])).beside("y", Stat::of([]));
        assert_eq!(f.ratio(), (None, None));
    }

    #[test]
    fn a_document_records_where_and_how_it_was_measured() {
        let doc = Run::start("storage").document(
            json!({"rounds": 50}),
            &[Figure::new("block", "ms", Stat::of([1.0]))],
            Value::Null,
        );
        for key in [
            "measured_at",
            "build",
            "cpus",
            "load_average",
            "load_average_start",
            "command",
        ] {
            assert!(doc.get(key).is_some(), "{key} missing from {doc}");
        }
        assert_eq!(doc["bench"], json!("storage"));
        assert_eq!(doc["figures"][0]["quantity"], json!("block"));
    }

    #[test]
    fn the_out_flag_is_taken_from_positional_arguments() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            out_flag(args(&["100", "--out", "t/node.json", "6"])),
            Ok((Some(PathBuf::from("t/node.json")), args(&["100", "6"])))
        );
        assert_eq!(out_flag(args(&["15"])), Ok((None, args(&["15"]))));
        assert_eq!(out_flag(args(&["--out"])), Err(OutFlagError::Missing));
        assert_eq!(
            out_flag(args(&["--out", "x.md"])),
            Err(OutFlagError::NotJson("x.md".into()))
        );
    }
}
