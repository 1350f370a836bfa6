//! The simulation's report, generated from its history file rather than written by hand.
//!
//! `palisade-sim --record FILE` appends one JSON line per campaign (and `--controls` one per
//! planted control); `palisade-sim --report FILE` renders the history as the Markdown page
//! `docs/simulation-report.md`, which a test keeps current with `docs/data/simulation.jsonl`.
//! A line this code does not understand is an error, never skipped.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::{campaign, run, Bug, Campaign, Schedule};

/// The schedules a planted control may take to be caught in a random campaign.
pub const CONTROL_SCHEDULES: u64 = 10_000;

/// One campaign as a history line.
pub fn campaign_line(
    label: &str,
    seed: u64,
    joins: bool,
    bug: Option<Bug>,
    c: &Campaign,
    runtime_s: f64,
) -> Value {
    json!({
        "kind": "campaign",
        "label": label,
        "seed": seed,
        "joins": joins,
        "bug": bug.map(|b| format!("{b:?}")),
        "schedules": c.schedules,
        "faults": c.faults,
        "fences": c.fences,
        "power_fences": c.power_fences,
        "released": c.released,
        "held": c.held,
        "violation": c.failure.as_ref().map(|(s, v)| json!({
            "seed": s,
            "invariant": format!("{:?}", v.invariant),
        })),
        "runtime_s": (runtime_s * 10.0).round() / 10.0,
    })
}

/// Runs every planted control and returns one history line each: the bugs of [`Bug::ALL`]
/// in a random campaign of at most [`CONTROL_SCHEDULES`] from seed 1, the rare ones of
/// [`Bug::RECORDED`] at their recorded seed, and those of [`Bug::AIMED`] on their schedule.
pub fn controls(label: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for bug in Bug::ALL {
        let c = campaign(1, CONTROL_SCHEDULES, Some(bug));
        out.push(json!({
            "kind": "control",
            "label": label,
            "bug": format!("{bug:?}"),
            "recorded": false,
            "caught_at": c.failure.as_ref().map(|(s, _)| *s),
            "schedules": c.schedules,
            "invariant": c.failure.as_ref().map(|(_, v)| format!("{:?}", v.invariant)),
        }));
    }
    let aimed = Bug::AIMED.map(|bug| {
        let schedule = bug.aimed_schedule().expect("an aimed bug has its schedule");
        (bug, schedule)
    });
    let recorded = Bug::RECORDED.map(|(bug, seed)| (bug, Schedule::generate_before_stock(seed)));
    for (bug, schedule) in recorded.into_iter().chain(aimed) {
        let v = run(&schedule, Some(bug)).violation;
        out.push(json!({
            "kind": "control",
            "label": label,
            "bug": format!("{bug:?}"),
            "recorded": true,
            "caught_at": v.as_ref().map(|_| schedule.seed),
            "schedules": 1,
            "invariant": v.as_ref().map(|v| format!("{:?}", v.invariant)),
        }));
    }
    out
}

fn field<'a>(line: usize, v: &'a Value, key: &str) -> Result<&'a Value, String> {
    v.get(key)
        .ok_or_else(|| format!("line {line}: no field {key:?}"))
}

fn num(line: usize, v: &Value, key: &str) -> Result<u64, String> {
    field(line, v, key)?
        .as_u64()
        .ok_or_else(|| format!("line {line}: {key:?} is not a count"))
}

fn text(line: usize, v: &Value, key: &str) -> Result<String, String> {
    Ok(match field(line, v, key)? {
        Value::Null => "—".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// Renders the history (JSON lines) as Markdown.
///
/// Guarantees: every line is either a campaign or a control with every field the page shows;
/// anything else is an error naming its line. Controls are shown by their latest line per bug.
pub fn render(history: &str) -> Result<String, String> {
    let mut campaigns = String::new();
    let (mut total, mut violations) = (0u64, 0u64);
    let mut controls: BTreeMap<String, String> = BTreeMap::new();
    for (i, raw) in history.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(raw).map_err(|e| format!("line {line}: {e}"))?;
        match field(line, &v, "kind")?.as_str() {
            Some("campaign") => {
                let schedules = num(line, &v, "schedules")?;
                let violation = field(line, &v, "violation")?;
                let bug = text(line, &v, "bug")?;
                if bug == "—" {
                    total += schedules;
                    violations += u64::from(!violation.is_null());
                }
                let broke = if violation.is_null() {
                    "0".to_string()
                } else {
                    format!(
                        "1 (seed {}, {})",
                        text(line, violation, "seed")?,
                        text(line, violation, "invariant")?
                    )
                };
                writeln!(
                    campaigns,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    text(line, &v, "label")?,
                    num(line, &v, "seed")?,
                    if field(line, &v, "joins")?.as_bool() == Some(true) {
                        "joins"
                    } else {
                        "mixed"
                    },
                    bug,
                    schedules,
                    num(line, &v, "faults")?,
                    num(line, &v, "fences")?,
                    num(line, &v, "power_fences")?,
                    num(line, &v, "released")?,
                    num(line, &v, "held")?,
                    broke,
                    text(line, &v, "runtime_s")?,
                )
                .map_err(|e| e.to_string())?;
            }
            Some("control") => {
                let bug = text(line, &v, "bug")?;
                let recorded = field(line, &v, "recorded")?.as_bool() == Some(true);
                let caught = field(line, &v, "caught_at")?;
                let verdict = if caught.is_null() {
                    "**not caught**".to_string()
                } else if Bug::parse(&bug).is_some_and(|b| Bug::AIMED.contains(&b)) {
                    "on the schedule made for it (`Bug::aimed_schedule`)".to_string()
                } else if recorded {
                    format!("at its recorded seed {}", text(line, &v, "caught_at")?)
                } else {
                    format!(
                        "seed {} (schedule {} of a campaign from seed 1)",
                        text(line, &v, "caught_at")?,
                        num(line, &v, "schedules")?
                    )
                };
                controls.insert(
                    bug.clone(),
                    format!(
                        "| `{bug}` | {verdict} | {} | {} |",
                        text(line, &v, "invariant")?,
                        text(line, &v, "label")?
                    ),
                );
            }
            _ => return Err(format!("line {line}: unknown kind {}", v["kind"])),
        }
    }
    let mut out = String::from(
        "# Simulation report\n\n\
         Generated from `docs/data/simulation.jsonl` by `palisade-sim --report`; do not edit. \
         Record a campaign with `hack/chaos.sh --sim --record` (it appends to the history), then \
         `PALISADE_WRITE_REPORTS=1 cargo test -p palisade-sim --test report`. What the \
         simulation is and what it judges: [the simulation](simulation.md).\n\n",
    );
    writeln!(
        out,
        "**{total} schedules without a planted bug, {violations} {}** (at-most-one, \
         release recorded, promises kept, and no fence without a cause).\n\n\
         ## Campaigns\n\n\
         | Recorded | Seed | Schedules drawn | Planted bug | Schedules | Fault events | Fences | On power evidence | Released | Held | Violations | Runtime (s) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n{campaigns}\n\
         ## Planted controls\n\n\
         Each is an old rule or a deliberate mistake put back into the simulated controller \
         (`palisade-sim --bug NAME`); the simulation must catch it.\n\n\
         | Planted bug | Caught | Invariant | Recorded |\n|---|---|---|---|",
        if violations == 1 { "violation" } else { "violations" }
    )
    .map_err(|e| e.to_string())?;
    for row in controls.values() {
        out.push_str(row);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_it_does_not_understand_is_an_error() {
        assert!(render("{\"kind\":\"campaign\"}")
            .unwrap_err()
            .contains("line 1"));
        assert!(render("\n{\"kind\":\"other\"}")
            .unwrap_err()
            .contains("line 2"));
        assert!(render("not json").is_err());
        let page = render("").unwrap();
        assert!(page.contains("**0 schedules"), "{page}");
    }

    #[test]
    fn campaigns_add_up_and_controls_show_their_latest_line() {
        let c = Campaign {
            schedules: 10,
            fences: 3,
            ..Campaign::default()
        };
        let a = campaign_line("2026-11-29 abc", 1, false, None, &c, 1.26);
        let b = campaign_line("2026-11-29 abc", 11, true, None, &c, 2.0);
        let planted = campaign_line("x", 1, false, Some(Bug::ALL[0]), &c, 2.0);
        let old = json!({"kind":"control","label":"old","bug":"X","recorded":false,"caught_at":null,"schedules":10000,"invariant":null});
        let new = json!({"kind":"control","label":"new","bug":"X","recorded":false,"caught_at":7,"schedules":7,"invariant":"AtMostOne"});
        let page = render(&format!("{a}\n{b}\n{planted}\n{old}\n{new}\n")).unwrap();
        assert!(
            page.contains("**20 schedules without a planted bug, 0 violations**"),
            "{page}"
        );
        assert!(
            page.contains(
                "| `X` | seed 7 (schedule 7 of a campaign from seed 1) | AtMostOne | new |"
            ),
            "{page}"
        );
        assert!(!page.contains("not caught"), "{page}");
        assert!(page.contains("| 1.3 |"), "{page}");
    }
}
