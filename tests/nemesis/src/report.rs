//! The campaigns' report, generated from their history file rather than written by hand.
//!
//! A finished campaign is one [`CampaignRecord`]: its figures are those of the report the
//! campaign prints ([`Tally`]), never measured anew. `palisade-nemesis --record FILE` appends
//! it to a history file (JSON lines) and rewrites the page; `palisade-nemesis --report FILE`
//! prints the page. `docs/campaign-report.md` is rendered from `docs/data/campaigns.jsonl`, and
//! a test keeps the two current. A line this code does not understand is an error, never
//! skipped; a figure a campaign did not record is `null`, shown as a dash, never as a zero.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use palisade_lab::MachineKind;
use serde::{Deserialize, Serialize};

use crate::campaign::Config;
use crate::check::Violation;
use crate::history::{FenceSnapshot, Record};
use crate::schedule::{self, Fault};

/// The checks whose findings are fences without a cause: a fence that followed no fault that
/// silenced its node, and a fence of a node the API server was hearing.
pub const CAUSELESS: [&str; 2] = ["fence-without-cause", "fence-while-heard"];

/// What a campaign's history adds up to: the figures its printed report and its record share.
#[derive(Debug, Default)]
pub struct Tally<'a> {
    /// The faults applied, each event once, in the order they were applied.
    pub applied: Vec<&'a Fault>,
    /// Events whose fault could not be applied.
    pub skipped: usize,
    /// Applied events by fault class.
    pub by_class: BTreeMap<&'static str, usize>,
    /// Every NodeFence's status at the end of the campaign.
    pub finals: Vec<&'a FenceSnapshot>,
    /// NodeFences by their final phase (`Done`, `Failed`, or where one was left).
    pub phases: BTreeMap<&'a str, usize>,
    /// Pods the final statuses list as released.
    pub released: usize,
    /// NodeFences observed during the campaign and gone by its end (deleted, by a person or
    /// by their own finalizer's end).
    pub gone: usize,
    /// Incarnations that wrote, per writer, in the order of the writers' verdicts.
    pub writer_incarnations: Vec<usize>,
    /// Writes acknowledged to the writers, summed.
    pub acknowledged: usize,
    /// Split-brain writes the storage checker found, summed over the writers.
    pub split_brain: usize,
    /// Acknowledged writes the volumes lost, summed over the writers.
    pub lost: usize,
    /// Incarnations of the volume-less identity the observer saw.
    pub identity_incarnations: usize,
    /// Times two incarnations of the identity were proven alive at once.
    pub overlaps: usize,
}

impl<'a> Tally<'a> {
    /// Adds up a campaign's history.
    pub fn of(history: &'a [Record]) -> Tally<'a> {
        let mut t = Tally::default();
        let mut events = std::collections::BTreeSet::new();
        let mut observed = std::collections::BTreeSet::new();
        for r in history {
            match r {
                Record::Fault { event, fault, .. } if events.insert(*event) => {
                    t.applied.push(fault);
                    *t.by_class.entry(fault.class()).or_default() += 1;
                }
                Record::Skipped { .. } => t.skipped += 1,
                Record::Phase { snapshot, .. } | Record::Release { snapshot, .. } => {
                    observed.insert(snapshot.fence.as_str());
                }
                Record::FenceFinal { snapshot, .. } => {
                    t.finals.push(snapshot);
                    *t.phases.entry(snapshot.phase.as_str()).or_default() += 1;
                    t.released += snapshot.released.len();
                }
                Record::Writer {
                    pods,
                    split_brain,
                    lost,
                    ..
                } => {
                    t.writer_incarnations.push(pods.len());
                    t.acknowledged += pods.iter().map(|p| p.2).sum::<usize>();
                    t.split_brain += split_brain;
                    t.lost += lost;
                }
                Record::Pod { writer, .. } if writer == crate::world::IDENTITY => {
                    t.identity_incarnations += 1;
                }
                Record::TwoIncarnations { .. } => t.overlaps += 1,
                _ => {}
            }
        }
        for f in &t.finals {
            observed.remove(f.fence.as_str());
        }
        t.gone = observed.len();
        t
    }
}

/// How the lab's binaries were built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Build {
    /// The dev profile (`target/debug`): planted bugs can be read.
    Debug,
    /// The release profile: no planted bug exists in it.
    Release,
}

impl Build {
    /// The profile of the binaries the lab runs, from the directory `palisade_lab::bin_path`
    /// finds the controller in; `None` when that is neither `debug` nor `release`.
    pub fn of_lab_binaries() -> Option<Build> {
        let path = palisade_lab::bin_path("palisade-controller").ok()?;
        match path.parent()?.file_name()?.to_str()? {
            "debug" => Some(Build::Debug),
            "release" => Some(Build::Release),
            _ => None,
        }
    }
}

/// The lab's kind of machine, in the history file's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Namespace machines (`MachineKind::Namespace`).
    Namespace,
    /// QEMU virtual machines (`MachineKind::Qemu`, `--qemu`).
    Qemu,
}

impl From<MachineKind> for Kind {
    fn from(k: MachineKind) -> Kind {
        match k {
            MachineKind::Namespace => Kind::Namespace,
            MachineKind::Qemu => Kind::Qemu,
        }
    }
}

/// The fault classes a schedule drew from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Draw {
    /// `--only` restricted the draw; `false`: every class the build draws by default on its
    /// kind of machine (opt-in classes excluded).
    pub only: bool,
    /// The classes `--only` named (empty when `only` is false, or when they were not recorded).
    pub names: Vec<String>,
    /// How many classes the draw held, when recorded.
    pub count: Option<usize>,
}

/// One finished campaign, as a line of `docs/data/campaigns.jsonl`.
///
/// Every figure is the campaign's own (its [`Tally`] and its violations); `None` is a figure it
/// did not record (campaigns transcribed from prose state fewer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CampaignRecord {
    /// The day it ended, UTC (`YYYY-MM-DD`).
    pub date: Option<String>,
    /// The commit it was built from (`git rev-parse --short HEAD`; `-dirty` with local
    /// changes).
    pub commit: Option<String>,
    /// How the lab's binaries were built.
    pub build: Option<Build>,
    /// The lab's kind of machine.
    pub machine_kind: Kind,
    /// Machines in the lab.
    pub machines: usize,
    /// StatefulSet writers.
    pub writers: usize,
    /// `--no-fence-devices`: no FenceTarget; watchdog-backed self-fences trusted.
    pub no_fence_devices: bool,
    /// `--no-watchdog`: the QEMU agents left their watchdog unarmed.
    pub no_watchdog: bool,
    /// The schedule's seed.
    pub seed: Option<u64>,
    /// The classes the schedule drew from.
    pub draw: Option<Draw>,
    /// No new event after this many minutes.
    pub minutes: Option<u64>,
    /// Events the schedule held (`--events`).
    pub events_planned: Option<usize>,
    /// Events applied (fewer than planned when the time ran out or a stop was requested).
    pub events_applied: usize,
    /// Applied events by fault class.
    pub events_by_class: Option<BTreeMap<String, usize>>,
    /// NodeFences by final phase (`Done`, `Failed`, ...).
    pub fences: Option<BTreeMap<String, usize>>,
    /// Pods the NodeFences' final statuses list as released.
    pub pods_released: Option<usize>,
    /// Writer incarnations that wrote, summed over the writers.
    pub writer_incarnations: Option<usize>,
    /// The same per writer (`w0` first), when recorded.
    pub incarnations_by_writer: Option<Vec<usize>>,
    /// Writes acknowledged to the writers.
    pub writes_acknowledged: Option<u64>,
    /// Acknowledged writes the volumes lost.
    pub writes_lost: Option<u64>,
    /// Writes the storage checker found from two incarnations at once.
    pub split_brain_writes: Option<u64>,
    /// Incarnations of the volume-less identity.
    pub identity_incarnations: Option<usize>,
    /// Whether every writer was writing again after the last heal.
    pub live: Option<bool>,
    /// Violations by check name (`fence-without-cause` and `fence-while-heard` among them).
    pub violations: Option<BTreeMap<String, usize>>,
    /// Checks known to have fired where `violations` was not recorded (transcribed planted
    /// controls: the checks their test requires); empty otherwise.
    pub found_by: Vec<String>,
    /// Bugs planted in the bridge and controllers (`--plant`; empty: none).
    pub planted: Vec<String>,
    /// Seconds from start to verdict.
    pub wall_s: Option<f64>,
    /// What else ran on the machine, its load, its cores.
    pub conditions: Option<String>,
    /// What the figures need said beside them (why a fence failed, why a finding is false).
    pub remarks: Option<String>,
    /// Where a record not written by `--record` came from.
    pub source: Option<String>,
}

impl CampaignRecord {
    /// The record of a campaign run with `cfg`, whose schedule held `planned` events, from
    /// its history and verdict. The date, commit, build and conditions are left for the caller.
    pub fn of(
        cfg: &Config,
        planned: usize,
        history: &[Record],
        violations: &[Violation],
        live: bool,
        wall_s: f64,
    ) -> CampaignRecord {
        let t = Tally::of(history);
        let mut names: Vec<String> = cfg.only.clone();
        names.sort();
        names.dedup();
        let mut by_check: BTreeMap<String, usize> = BTreeMap::new();
        for v in violations {
            *by_check.entry(v.check.to_string()).or_default() += 1;
        }
        let count = |m: &BTreeMap<&str, usize>| -> BTreeMap<String, usize> {
            m.iter().map(|(k, n)| (k.to_string(), *n)).collect()
        };
        CampaignRecord {
            date: None,
            commit: None,
            build: None,
            machine_kind: cfg.machine_kind.into(),
            machines: cfg.machines,
            writers: cfg.writers,
            no_fence_devices: cfg.no_fence_devices,
            no_watchdog: cfg.agents_without_watchdog,
            seed: Some(cfg.seed),
            draw: Some(Draw {
                only: !names.is_empty(),
                count: (!names.is_empty()).then_some(names.len()),
                names,
            }),
            minutes: Some(cfg.minutes),
            events_planned: Some(planned),
            events_applied: t.applied.len(),
            events_by_class: Some(
                t.by_class
                    .iter()
                    .map(|(k, n)| (k.to_string(), *n))
                    .collect(),
            ),
            fences: Some(count(&t.phases)),
            pods_released: Some(t.released),
            writer_incarnations: Some(t.writer_incarnations.iter().sum()),
            incarnations_by_writer: Some(t.writer_incarnations.clone()),
            writes_acknowledged: Some(t.acknowledged as u64),
            writes_lost: Some(t.lost as u64),
            split_brain_writes: Some(t.split_brain as u64),
            identity_incarnations: Some(t.identity_incarnations),
            live: Some(live),
            violations: Some(by_check),
            found_by: Vec::new(),
            planted: cfg.planted.clone(),
            wall_s: Some((wall_s * 10.0).round() / 10.0),
            conditions: None,
            remarks: None,
            source: None,
        }
    }

    /// The checks that found something: those with violations, else those in `found_by`.
    pub fn checks_fired(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .violations
            .iter()
            .flat_map(|v| v.iter().filter(|(_, n)| **n > 0).map(|(c, _)| c.clone()))
            .collect();
        for c in &self.found_by {
            if !out.contains(c) {
                out.push(c.clone());
            }
        }
        out
    }

    /// Violations summed over the checks, when recorded.
    pub fn violation_count(&self) -> Option<usize> {
        self.violations.as_ref().map(|v| v.values().sum())
    }

    /// Fences without a cause ([`CAUSELESS`]), when violations were recorded.
    pub fn causeless(&self) -> Option<usize> {
        self.violations.as_ref().map(|v| {
            CAUSELESS
                .iter()
                .map(|c| v.get(*c).copied().unwrap_or(0))
                .sum()
        })
    }

    /// NodeFences summed over their phases, when recorded.
    pub fn fence_count(&self) -> Option<usize> {
        self.fences.as_ref().map(|f| f.values().sum())
    }

    /// Whether its figures agree with each other and name only known fault classes.
    fn validate(&self) -> Result<(), String> {
        let known = |c: &str| schedule::classes().any(|k| k == c);
        if let Some(by_class) = &self.events_by_class {
            if let Some(bad) = by_class.keys().find(|c| !known(c)) {
                return Err(format!("events_by_class: no fault class {bad:?}"));
            }
            let sum: usize = by_class.values().sum();
            if sum != self.events_applied {
                return Err(format!(
                    "events_by_class sums to {sum}, events_applied is {}",
                    self.events_applied
                ));
            }
        }
        if let Some(planned) = self.events_planned {
            if self.events_applied > planned {
                return Err(format!(
                    "{} events applied of {planned} planned",
                    self.events_applied
                ));
            }
        }
        if let Some(draw) = &self.draw {
            if let Some(bad) = draw.names.iter().find(|c| !known(c)) {
                return Err(format!("draw.names: no fault class {bad:?}"));
            }
            if !draw.only && !draw.names.is_empty() {
                return Err("draw.names without draw.only".into());
            }
            if draw
                .count
                .is_some_and(|n| !draw.names.is_empty() && n != draw.names.len())
            {
                return Err("draw.count is not the number of draw.names".into());
            }
        }
        if let Some(each) = &self.incarnations_by_writer {
            if each.len() != self.writers {
                return Err(format!(
                    "incarnations_by_writer has {} writers, writers is {}",
                    each.len(),
                    self.writers
                ));
            }
            if self
                .writer_incarnations
                .is_some_and(|n| n != each.iter().sum::<usize>())
            {
                return Err("incarnations_by_writer does not sum to writer_incarnations".into());
            }
        }
        Ok(())
    }
}

/// Reads a history: one [`CampaignRecord`] per non-blank line, in the file's order.
///
/// Guarantees: every line parses with no field the record does not have, and its figures agree
/// with each other (events by class sum to the events applied, incarnations per writer to
/// their total, every class is one the nemesis knows); otherwise the error names the line.
pub fn parse(history: &str) -> Result<Vec<CampaignRecord>, String> {
    let mut out = Vec::new();
    for (i, raw) in history.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let r: CampaignRecord =
            serde_json::from_str(raw).map_err(|e| format!("line {}: {e}", i + 1))?;
        r.validate().map_err(|e| format!("line {}: {e}", i + 1))?;
        out.push(r);
    }
    Ok(out)
}

/// Appends `record` to the history at `path` (one JSON line).
pub fn append(path: &Path, record: &CampaignRecord) -> Result<(), String> {
    let line = serde_json::to_string(record).map_err(|e| e.to_string())?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{line}").map_err(|e| format!("{}: {e}", path.display()))
}

/// One fault class summed over campaigns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassTotal {
    /// Campaigns that applied it at least once.
    pub campaigns: usize,
    /// Events applied.
    pub events: usize,
    /// NodeFences of campaigns that applied this class alone (where they recorded them): the
    /// only fences a class can be credited with, since a campaign does not attribute its
    /// fences to its events.
    pub fences_alone: Option<usize>,
}

/// Every fault class the nemesis knows, summed over the campaigns without a planted bug.
pub fn by_class(records: &[CampaignRecord]) -> BTreeMap<String, ClassTotal> {
    let mut out: BTreeMap<String, ClassTotal> = schedule::classes()
        .map(|c| (c.to_string(), ClassTotal::default()))
        .collect();
    for r in records.iter().filter(|r| r.planted.is_empty()) {
        let Some(classes) = &r.events_by_class else {
            continue;
        };
        for (class, n) in classes.iter().filter(|(_, n)| **n > 0) {
            let t = out.entry(class.clone()).or_default();
            t.campaigns += 1;
            t.events += n;
        }
        if let ([(class, _)], Some(fences)) = (
            classes
                .iter()
                .filter(|(_, n)| **n > 0)
                .collect::<Vec<_>>()
                .as_slice(),
            r.fence_count(),
        ) {
            let t = out.entry((*class).clone()).or_default();
            t.fences_alone = Some(t.fences_alone.unwrap_or(0) + fences);
        }
    }
    out
}

fn dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "—".to_string(), |v| v.to_string())
}

/// `a 3, b 2`: counts by name, the largest first.
fn counts(m: &BTreeMap<String, usize>) -> String {
    let mut v: Vec<(&String, &usize)> = m.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn machines(r: &CampaignRecord) -> String {
    let mut s = match r.machine_kind {
        Kind::Namespace => r.machines.to_string(),
        Kind::Qemu => format!("{} QEMU", r.machines),
    };
    if r.no_fence_devices {
        s.push_str(", no fence devices");
    }
    if r.no_watchdog {
        s.push_str(", watchdog unarmed");
    }
    s
}

fn classes(r: &CampaignRecord) -> String {
    match &r.draw {
        None => "—".into(),
        Some(d) if !d.only => d.count.map_or("all".into(), |n| format!("all {n}")),
        Some(d) => match (d.count, d.names.as_slice()) {
            (_, [one]) => format!("`{one}`"),
            (Some(n), _) => format!("{n} (`--only`)"),
            (None, names) => format!("{} (`--only`)", names.len()),
        },
    }
}

fn planted(r: &CampaignRecord) -> String {
    if r.planted.is_empty() {
        "—".into()
    } else {
        r.planted
            .iter()
            .map(|b| format!("`{b}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn events(r: &CampaignRecord) -> String {
    match r.events_planned {
        Some(p) if p != r.events_applied => format!("{} of {p}", r.events_applied),
        _ => r.events_applied.to_string(),
    }
}

fn fences(r: &CampaignRecord) -> String {
    match &r.fences {
        None => "—".into(),
        Some(f) if f.is_empty() => "0".into(),
        Some(f) => counts(f),
    }
}

/// Renders the history (JSON lines of [`CampaignRecord`]s) as Markdown.
///
/// Guarantees: as [`parse`]; campaigns are numbered in the file's order.
pub fn render(history: &str) -> Result<String, String> {
    Ok(page(&parse(history)?))
}

fn page(records: &[CampaignRecord]) -> String {
    let mut out = String::from(
        "# Nemesis campaign report\n\n\
         Generated from `docs/data/campaigns.jsonl` by `palisade-nemesis --report`; do not edit. \
         Record a campaign with `hack/chaos.sh --lab ... --record` (it appends the campaign to \
         the history and regenerates this page); \
         `PALISADE_WRITE_REPORTS=1 cargo test -p palisade-nemesis --test report` rewrites it. \
         What the campaigns do, what each check means and what they found: \
         [the nemesis campaigns](campaigns.md). Campaigns whose source is given were measured \
         before they were recorded, and transcribed from that chapter; a dash is a figure their \
         source does not state.\n\n",
    );
    let clean: Vec<&CampaignRecord> = records.iter().filter(|r| r.planted.is_empty()).collect();
    let controls: Vec<(usize, &CampaignRecord)> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.planted.is_empty())
        .map(|(i, r)| (i + 1, r))
        .collect();
    let sum = |f: &dyn Fn(&CampaignRecord) -> Option<u64>| -> u64 {
        clean.iter().filter_map(|r| f(r)).sum()
    };
    let violations = sum(&|r| r.violation_count().map(|n| n as u64));
    let caught = controls
        .iter()
        .filter(|(_, r)| !r.checks_fired().is_empty())
        .count();
    let _ = writeln!(
        out,
        "**{} campaigns without a planted bug: {} fault events applied, {} NodeFences, {} \
         writes acknowledged; {} split-brain and {} lost writes where recorded; {} {} by the \
         checks, {} of them fences without a cause.** {caught} of {} planted controls caught.\n",
        clean.len(),
        sum(&|r| Some(r.events_applied as u64)),
        sum(&|r| r.fence_count().map(|n| n as u64)),
        sum(&|r| r.writes_acknowledged),
        sum(&|r| r.split_brain_writes),
        sum(&|r| r.writes_lost),
        violations,
        if violations == 1 {
            "violation"
        } else {
            "violations"
        },
        sum(&|r| r.causeless().map(|n| n as u64)),
        controls.len(),
    );

    out.push_str(
        "## Campaigns\n\n\
         Events: applied, of those planned where the time ran out. Causeless fences are the \
         violations of `fence-without-cause` and `fence-while-heard`, counted among the \
         violations too. Details, conditions and remarks below the tables.\n\n\
         | # | Date | Commit | Build | Machines | Writers | Seed | Classes | Planted | Events | NodeFences | Released | Writer incarnations | Writes acknowledged | Lost | Split-brain | Identity incarnations | Violations | Causeless fences | Wall (s) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (i, r) in records.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            dash(r.date.as_deref()),
            dash(r.commit.as_deref()),
            dash(r.build.map(|b| match b {
                Build::Debug => "debug",
                Build::Release => "release",
            })),
            machines(r),
            r.writers,
            dash(r.seed),
            classes(r),
            planted(r),
            events(r),
            fences(r),
            dash(r.pods_released),
            dash(r.writer_incarnations),
            dash(r.writes_acknowledged),
            dash(r.writes_lost),
            dash(r.split_brain_writes),
            dash(r.identity_incarnations),
            dash(r.violation_count()),
            dash(r.causeless()),
            dash(r.wall_s),
        );
    }

    out.push_str(
        "\n## By fault class\n\n\
         Summed over the campaigns without a planted bug. A campaign does not attribute its \
         fences to its events, so a class is credited only with the NodeFences of campaigns \
         that drew it alone. A class with no events has not run on the lab without a planted \
         bug.\n\n\
         | Fault class | Campaigns | Events | NodeFences (campaigns of this class alone) |\n\
         |---|---|---|---|\n",
    );
    let mut totals: Vec<(String, ClassTotal)> = by_class(records).into_iter().collect();
    totals.sort_by(|a, b| b.1.events.cmp(&a.1.events).then(a.0.cmp(&b.0)));
    for (class, t) in &totals {
        let _ = writeln!(
            out,
            "| `{class}` | {} | {} | {} |",
            t.campaigns,
            t.events,
            dash(t.fences_alone)
        );
    }

    out.push_str(
        "\n## Violations and causeless fences\n\n\
         Every finding of a campaign without a planted bug, by check. Whether a finding was a \
         safety violation or a false one (a check since corrected, a lab that really lost a \
         machine) is in the campaign's remarks below.\n\n\
         | Campaign | Seed | Check | Findings |\n|---|---|---|---|\n",
    );
    let mut any = false;
    for (i, r) in records.iter().enumerate() {
        if !r.planted.is_empty() {
            continue;
        }
        for (check, n) in r.violations.iter().flatten().filter(|(_, n)| **n > 0) {
            any = true;
            let causeless = if CAUSELESS.contains(&check.as_str()) {
                " (causeless fence)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "| #{} | {} | `{check}`{causeless} | {n} |",
                i + 1,
                dash(r.seed)
            );
        }
    }
    if !any {
        out.push_str("| — | — | none | 0 |\n");
    }

    out.push_str(
        "\n## Planted controls\n\n\
         Each plants a known mistake in the (debug) bridge or controllers \
         (`hack/chaos.sh --lab --plant NAME`); its campaign must then report a violation.\n\n\
         | Campaign | Planted bug | Machines | Faults | Caught by |\n|---|---|---|---|---|\n",
    );
    for (n, r) in &controls {
        let fired = r.checks_fired();
        let caught = if fired.is_empty() {
            "**not caught**".to_string()
        } else {
            fired
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "| #{n} | {} | {} | {} | {caught} |",
            planted(r),
            machines(r),
            r.events_by_class.as_ref().map_or("—".into(), counts),
        );
    }
    if controls.is_empty() {
        out.push_str("| — | none recorded | — | — | — |\n");
    }

    out.push_str("\n## Details\n\n");
    for (i, r) in records.iter().enumerate() {
        let mut parts = Vec::new();
        if let Some(d) = &r.draw {
            if !d.names.is_empty() {
                parts.push(format!("`--only` {}", d.names.join(", ")));
            }
        }
        if let Some(m) = r.minutes {
            parts.push(format!("no new event after {m} minutes"));
        }
        if let Some(c) = &r.events_by_class {
            parts.push(format!("events: {}", counts(c)));
        }
        if let Some(each) = &r.incarnations_by_writer {
            let each: Vec<String> = each.iter().map(|n| n.to_string()).collect();
            parts.push(format!(
                "writer incarnations per writer: {}",
                each.join(", ")
            ));
        }
        if let Some(live) = r.live {
            parts.push(
                if live {
                    "every writer writing again after the last heal"
                } else {
                    "NOT every writer writing again after the last heal"
                }
                .to_string(),
            );
        }
        if !r.found_by.is_empty() {
            parts.push(format!(
                "found by {} (counts not recorded)",
                r.found_by
                    .iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for (label, text) in [
            ("conditions", &r.conditions),
            ("remarks", &r.remarks),
            ("source", &r.source),
        ] {
            if let Some(t) = text {
                parts.push(format!("{label}: {t}"));
            }
        }
        let _ = writeln!(
            out,
            "- **#{}** (seed {}): {}.",
            i + 1,
            dash(r.seed),
            parts.join("; ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seed: u64, classes: &[(&str, usize)], fences: &[(&str, usize)]) -> CampaignRecord {
        CampaignRecord {
            date: Some("2026-12-01".into()),
            commit: Some("abc1234".into()),
            build: Some(Build::Debug),
            machine_kind: Kind::Namespace,
            machines: 5,
            writers: 2,
            no_fence_devices: false,
            no_watchdog: false,
            seed: Some(seed),
            draw: Some(Draw::default()),
            minutes: Some(60),
            events_planned: Some(20),
            events_applied: classes.iter().map(|c| c.1).sum(),
            events_by_class: Some(classes.iter().map(|(c, n)| (c.to_string(), *n)).collect()),
            fences: Some(fences.iter().map(|(p, n)| (p.to_string(), *n)).collect()),
            pods_released: Some(3),
            writer_incarnations: Some(4),
            incarnations_by_writer: Some(vec![1, 3]),
            writes_acknowledged: Some(1_000),
            writes_lost: Some(0),
            split_brain_writes: Some(0),
            identity_incarnations: Some(2),
            live: Some(true),
            violations: Some(BTreeMap::new()),
            found_by: Vec::new(),
            planted: Vec::new(),
            wall_s: Some(123.4),
            conditions: None,
            remarks: None,
            source: None,
        }
    }

    fn line(r: &CampaignRecord) -> String {
        serde_json::to_string(r).unwrap()
    }

    #[test]
    fn a_campaign_s_record_takes_its_figures_from_its_history_and_verdict() {
        use crate::history::ReleasedRec;
        use crate::schedule::Target;
        let fault = Fault::CutAll {
            target: Target::WriterHost(0),
            hold_ms: 8_000,
        };
        let fence = |phase: &str, released: usize| FenceSnapshot {
            fence: format!("m0-{phase}"),
            uid: phase.into(),
            node: "m0".into(),
            phase: phase.into(),
            token: Some(1),
            verified_levels: vec![],
            evidence: vec![],
            released: (0..released)
                .map(|i| ReleasedRec {
                    namespace: "app".into(),
                    name: format!("w0-{i}"),
                    uid: format!("pod-{i}"),
                    at_us: 0,
                })
                .collect(),
            transitions: vec![],
            failure: None,
            created_us: None,
        };
        let history = vec![
            Record::Fault {
                t: 1.0,
                event: 0,
                fault: fault.clone(),
                machine: Some("m0".into()),
                detail: String::new(),
            },
            // Recorded again when it begins, as some faults are: still one event.
            Record::Fault {
                t: 2.0,
                event: 0,
                fault,
                machine: Some("m0".into()),
                detail: String::new(),
            },
            Record::Skipped {
                t: 3.0,
                event: 1,
                reason: "powered off".into(),
            },
            Record::Pod {
                t: 4.0,
                writer: crate::world::IDENTITY.into(),
                name: "v0-0".into(),
                uid: "v".into(),
                node: "m1".into(),
                seen_us: 0,
            },
            Record::FenceFinal {
                t: 5.0,
                snapshot: fence("Done", 2),
            },
            Record::FenceFinal {
                t: 5.0,
                snapshot: fence("Failed", 0),
            },
            Record::Writer {
                t: 6.0,
                writer: "w0".into(),
                pods: vec![("a".into(), "m0".into(), 10), ("b".into(), "m1".into(), 5)],
                log_writes: 15,
                split_brain: 0,
                lost: 1,
                report: String::new(),
            },
        ];
        let cfg = Config {
            seed: 9,
            events: 2,
            minutes: 5,
            machines: 4,
            writers: 1,
            out: "unused".into(),
            settle_timeout: std::time::Duration::from_secs(1),
            planted: vec![],
            only: vec!["cut-all".into(), "cut-all".into()],
            no_fence_devices: false,
            machine_kind: MachineKind::Qemu,
            agents_without_watchdog: false,
        };
        let lost = Violation {
            check: "acknowledged-write-lost",
            detail: String::new(),
        };
        let r = CampaignRecord::of(&cfg, 2, &history, &[lost], true, 61.26);
        assert_eq!(
            (r.events_planned, r.events_applied, r.machine_kind),
            (Some(2), 1, Kind::Qemu)
        );
        assert_eq!(r.events_by_class, Some([("cut-all".to_string(), 1)].into()));
        assert_eq!(
            r.draw,
            Some(Draw {
                only: true,
                names: vec!["cut-all".into()],
                count: Some(1)
            })
        );
        assert_eq!(
            r.fences,
            Some([("Done".to_string(), 1), ("Failed".to_string(), 1)].into())
        );
        assert_eq!(
            (r.pods_released, r.incarnations_by_writer.as_deref()),
            (Some(2), Some(&[2][..]))
        );
        assert_eq!(
            (r.writes_acknowledged, r.writes_lost, r.split_brain_writes),
            (Some(15), Some(1), Some(0))
        );
        assert_eq!(r.identity_incarnations, Some(1));
        assert_eq!(r.violation_count(), Some(1));
        assert_eq!(r.wall_s, Some(61.3));
        assert_eq!(parse(&line(&r)).unwrap(), vec![r]);
    }

    #[test]
    fn a_record_reads_back_as_it_was_written() {
        let mut r = record(7, &[("cut-all", 2), ("flap", 1)], &[("Done", 2)]);
        r.violations = Some([("fence-without-cause".to_string(), 1)].into());
        r.remarks = Some("a remark".into());
        assert_eq!(parse(&line(&r)).unwrap(), vec![r]);
    }

    #[test]
    fn a_field_the_record_does_not_have_is_an_error_naming_its_line() {
        let mut v: serde_json::Value = serde_json::to_value(record(1, &[], &[])).unwrap();
        v["surprise"] = 1.into();
        let err = parse(&format!("\n{v}")).unwrap_err();
        assert!(err.contains("line 2") && err.contains("surprise"), "{err}");
        assert!(parse("not json").is_err());
    }

    #[test]
    fn figures_that_disagree_or_an_unknown_class_are_errors() {
        let mut r = record(1, &[("cut-all", 2)], &[]);
        r.events_applied = 3;
        assert!(parse(&line(&r)).unwrap_err().contains("sums to 2"));
        let r = record(1, &[("cut-everything", 2)], &[]);
        assert!(parse(&line(&r)).unwrap_err().contains("cut-everything"));
        let mut r = record(1, &[], &[]);
        r.writer_incarnations = Some(5);
        assert!(parse(&line(&r))
            .unwrap_err()
            .contains("incarnations_by_writer"));
    }

    #[test]
    fn totals_by_class_sum_the_campaigns_without_a_planted_bug() {
        let a = record(1, &[("cut-all", 2), ("flap", 1)], &[("Done", 3)]);
        let b = record(2, &[("cut-all", 5)], &[("Done", 4), ("Failed", 1)]);
        let c = record(3, &[("flap", 0), ("vm-pause", 6)], &[("Done", 3)]);
        let mut planted = record(4, &[("cut-all", 9)], &[("Done", 9)]);
        planted.planted = vec!["TrustCommand".into()];
        let t = by_class(&[a, b, c, planted]);
        assert_eq!(
            t["cut-all"],
            ClassTotal {
                campaigns: 2,
                events: 7,
                fences_alone: Some(5)
            }
        );
        assert_eq!(
            t["flap"],
            ClassTotal {
                campaigns: 1,
                events: 1,
                fences_alone: None
            }
        );
        assert_eq!(t["vm-pause"].fences_alone, Some(3));
        assert_eq!(t["watch-stall"], ClassTotal::default());
    }

    #[test]
    fn the_page_adds_up_and_shows_a_missed_control() {
        let a = record(1, &[("cut-all", 2)], &[("Done", 2)]);
        let mut b = record(2, &[("flap", 3)], &[("Done", 1), ("Failed", 1)]);
        b.violations = Some([("fence-while-heard".to_string(), 2)].into());
        b.writes_lost = None;
        let mut missed = record(3, &[("cut-all", 1)], &[]);
        missed.planted = vec!["TrustCommand".into()];
        let mut transcribed = record(4, &[("cut-all", 1)], &[]);
        transcribed.planted = vec!["IgnoreStaleTokens".into()];
        transcribed.violations = None;
        transcribed.found_by = vec!["token-regressed".into()];
        let history = [a, b, missed, transcribed]
            .iter()
            .map(line)
            .collect::<Vec<_>>()
            .join("\n");
        let page = render(&history).unwrap();
        assert!(
            page.contains(
                "**2 campaigns without a planted bug: 5 fault events applied, 4 NodeFences, \
                 2000 writes acknowledged; 0 split-brain and 0 lost writes where recorded; \
                 2 violations by the checks, 2 of them fences without a cause.** \
                 1 of 2 planted controls caught."
            ),
            "{page}"
        );
        assert!(page.contains("| #3 | `TrustCommand` | 5 | cut-all 1 | **not caught** |"));
        assert!(page.contains("| #4 | `IgnoreStaleTokens` | 5 | cut-all 1 | `token-regressed` |"));
        assert!(page.contains("| #2 | 2 | `fence-while-heard` (causeless fence) | 2 |"));
        assert!(page.contains("| Done 1, Failed 1 |"), "{page}");
    }
}
