//! The generated reference pages (`docs/reference/*.md` for the controller, the node agent and
//! the firmware-bridge), written once for all three: each binary's own test module renders its
//! page from its clap definition ([`flags_tables`]), its metrics registry's OpenMetrics text
//! ([`metrics`], [`metrics_table`]) and the shipped alerts ([`shipped_alerts`],
//! [`alerts_table`]; [`alerts_naming`] for those that name its metrics), then checks the page
//! on disk with [`Page::check`].

use std::fmt::Write as _;
use std::path::PathBuf;

/// The variable that makes [`Page::check`] rewrite the page instead of only comparing it.
pub const WRITE_VAR: &str = "PALISADE_WRITE_REFERENCE";

/// The shipped Prometheus alerting rules, from the repository root.
pub const RULES: &str = "controller/manifests/prometheus-rules.yaml";

/// A generated page, and the test that regenerates it.
#[derive(Clone, Copy, Debug)]
pub struct Page {
    /// The page, from the repository root (e.g. `docs/reference/controller.md`).
    pub path: &'static str,
    /// The `cargo test` command whose test renders and checks the page.
    pub test: &'static str,
}

impl Page {
    /// The command that rewrites the page: [`Page::test`] with [`WRITE_VAR`] set.
    pub fn regenerate(&self) -> String {
        format!("{WRITE_VAR}=1 {}", self.test)
    }

    /// Panics, naming [`Page::regenerate`], unless the file on disk is `markdown`; with
    /// [`WRITE_VAR`]`=1`, writes `markdown` to it first.
    #[track_caller]
    pub fn check(&self, markdown: &str) {
        let path = repo_path(self.path);
        if std::env::var(WRITE_VAR).is_ok_and(|v| v == "1") {
            std::fs::write(&path, markdown)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == markdown,
            "{} is out of date; run `{}`",
            self.path,
            self.regenerate()
        );
    }
}

/// `rel` (a path from the repository root) as a path this process can open.
pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(rel)
}

/// Markdown-safe as one table cell: on one line, pipes escaped.
fn cell(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// One section per command that takes arguments, `cmd` first, then its subcommands (depth
/// first), a blank line between two: a `## Flags of `name`` heading (`Arguments of` when it has no flag), the about text
/// of a subcommand, and a table with one row per argument that is not hidden (a positional one
/// shown as `<NAME>`): its environment variable, default and help.
pub fn flags_tables(cmd: &clap::Command) -> String {
    let mut sections = Vec::new();
    flags_sections(cmd, cmd.get_name(), true, &mut sections);
    sections.join("\n")
}

fn flags_sections(cmd: &clap::Command, name: &str, top: bool, sections: &mut Vec<String>) {
    let args: Vec<&clap::Arg> = cmd.get_arguments().filter(|a| !a.is_hide_set()).collect();
    if !args.is_empty() {
        let mut out = String::new();
        let noun = if args.iter().any(|a| a.get_long().is_some()) {
            "Flags"
        } else {
            "Arguments"
        };
        let _ = write!(out, "## {noun} of `{name}`\n\n");
        if !top {
            if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
                let _ = write!(out, "{}\n\n", cell(&about.to_string()));
            }
        }
        out.push_str("| Flag | Environment | Default | Description |\n|---|---|---|---|\n");
        for a in args {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                flag(a),
                a.get_env()
                    .map(|e| format!("`{}`", e.to_string_lossy()))
                    .unwrap_or_default(),
                default(a),
                cell(
                    &a.get_long_help()
                        .or(a.get_help())
                        .map(|h| h.to_string())
                        .unwrap_or_default()
                )
            );
        }
        sections.push(out);
    }
    for sub in cmd.get_subcommands() {
        flags_sections(sub, &format!("{name} {}", sub.get_name()), false, sections);
    }
}

/// `--long`, `-s` for a flag with only a short name, or `<NAME>` for a positional argument.
fn flag(a: &clap::Arg) -> String {
    if let Some(long) = a.get_long() {
        return format!("--{long}");
    }
    if let Some(short) = a.get_short() {
        return format!("-{short}");
    }
    let name = a
        .get_value_names()
        .and_then(|v| v.first())
        .map(|v| v.to_string())
        .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
    format!("<{name}>")
}

/// The default value(s) in backticks, or nothing.
fn default(a: &clap::Arg) -> String {
    let values: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if values.is_empty() {
        String::new()
    } else {
        format!("`{}`", values.join(","))
    }
}

/// One metric family of an OpenMetrics exposition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metric {
    /// The family's name (a counter's without `_total`).
    pub family: String,
    /// The type: `counter`, `gauge`, `histogram`, …
    pub kind: String,
    /// The help text.
    pub help: String,
}

impl Metric {
    /// The name as scraped and queried: a counter's with `_total`.
    pub fn shown(&self) -> String {
        if self.kind == "counter" {
            format!("{}_total", self.family)
        } else {
            self.family.clone()
        }
    }

    /// Whether `series` (a name in a PromQL expression) is one of this family's series.
    fn exposes(&self, series: &str) -> bool {
        series == self.family
            || series.strip_prefix(self.family.as_str()).is_some_and(|s| {
                ["_total", "_created", "_bucket", "_sum", "_count", "_info"].contains(&s)
            })
    }
}

/// Every metric family of an OpenMetrics text (`# HELP` and `# TYPE` lines), in the order of
/// their `# HELP` lines.
pub fn metrics(text: &str) -> Vec<Metric> {
    let kind = |family: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
            .find(|(name, _)| *name == family)
            .map(|(_, kind)| kind.to_string())
            .unwrap_or_default()
    };
    text.lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .map(|rest| {
            let (family, help) = rest.split_once(' ').unwrap_or((rest, ""));
            Metric {
                family: family.to_string(),
                kind: kind(family),
                help: help.to_string(),
            }
        })
        .collect()
}

/// A table with one row per metric: its name as scraped, type and help.
pub fn metrics_table(metrics: &[Metric]) -> String {
    let mut out = String::from("| Metric | Type | Help |\n|---|---|---|\n");
    for m in metrics {
        let _ = writeln!(out, "| `{}` | {} | {} |", m.shown(), m.kind, cell(&m.help));
    }
    out
}

/// One alerting rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    /// The alert's name.
    pub name: String,
    /// Its `severity` label.
    pub severity: String,
    /// Its `for` duration, if any.
    pub for_: String,
    /// Its PromQL expression.
    pub expr: String,
    /// Its `summary` annotation.
    pub summary: String,
    /// Its `runbook_url` annotation.
    pub runbook: String,
}

impl Alert {
    /// Whether the expression names a series of one of `metrics`.
    pub fn names_any(&self, metrics: &[Metric]) -> bool {
        self.expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .any(|series| metrics.iter().any(|m| m.exposes(series)))
    }
}

/// Every alert of a Prometheus rules file (a `PrometheusRule`'s spec or a plain rules file:
/// `groups[].rules[]` with an `alert`), in file order; panics on YAML that does not parse.
pub fn alerts(rules_yaml: &str) -> Vec<Alert> {
    let rules: serde_json::Value =
        serde_saphyr::from_str(rules_yaml).expect("alerting rules that parse as YAML");
    let rules = rules.get("spec").unwrap_or(&rules);
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| {
            Some(Alert {
                name: r["alert"].as_str()?.to_string(),
                severity: text(&r["labels"]["severity"]),
                for_: text(&r["for"]),
                expr: text(&r["expr"]),
                summary: text(&r["annotations"]["summary"]),
                runbook: text(&r["annotations"]["runbook_url"]),
            })
        })
        .collect()
}

/// The alerts shipped in [`RULES`].
pub fn shipped_alerts() -> Vec<Alert> {
    let path = repo_path(RULES);
    alerts(
        &std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display())),
    )
}

/// The shipped alerts whose expression names one of `metrics`, as a table, or a sentence saying
/// that none does (`who` names the component, e.g. `the node agent`).
pub fn alerts_naming(metrics: &[Metric], who: &str) -> String {
    let alerts: Vec<Alert> = shipped_alerts()
        .into_iter()
        .filter(|a| a.names_any(metrics))
        .collect();
    if alerts.is_empty() {
        format!("No alert in `{RULES}` names a metric of {who}.\n")
    } else {
        alerts_table(&alerts)
    }
}

/// A table with one row per alert: name (linked to its runbook in the book), severity, `for`,
/// expression and summary.
pub fn alerts_table(alerts: &[Alert]) -> String {
    let mut out =
        String::from("| Alert | Severity | For | Expression | Summary |\n|---|---|---|---|---|\n");
    for a in alerts {
        let name = match a.runbook.split_once('#') {
            Some((_, anchor)) => format!("[`{}`](../operations.md#{anchor})", a.name),
            None => format!("`{}`", a.name),
        };
        let _ = writeln!(
            out,
            "| {name} | {} | {} | `{}` | {} |",
            a.severity,
            a.for_,
            cell(&a.expr),
            cell(&a.summary)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x_ops Operations.\n# TYPE x_ops counter\nx_ops_total 3\n\
                        # HELP x_up Whether | up.\n# TYPE x_up gauge\nx_up 1\n\
                        # HELP x_seconds Latency.\n# TYPE x_seconds histogram\n# EOF\n";

    #[test]
    fn counters_are_listed_as_scraped_with_their_total() {
        let table = metrics_table(&metrics(TEXT));
        assert_eq!(
            table,
            "| Metric | Type | Help |\n|---|---|---|\n\
             | `x_ops_total` | counter | Operations. |\n\
             | `x_up` | gauge | Whether \\| up. |\n\
             | `x_seconds` | histogram | Latency. |\n"
        );
    }

    #[test]
    fn an_alert_belongs_to_the_metrics_its_expression_names() {
        let rules = "groups:\n- rules:\n  - alert: A\n    expr: rate(x_ops_total[5m]) > 0\n  \
                     - alert: B\n    expr: histogram_quantile(0.9, x_seconds_bucket) > 1\n  \
                     - alert: C\n    expr: x_opsy > 0\n  - record: r\n    expr: x_up\n";
        let m = metrics(TEXT);
        let named: Vec<String> = alerts(rules)
            .into_iter()
            .filter(|a| a.names_any(&m))
            .map(|a| a.name)
            .collect();
        assert_eq!(named, ["A", "B"]);
    }

    #[test]
    fn subcommands_get_their_own_table_and_positionals_their_value_name() {
        let cmd = clap::Command::new("tool")
            .arg(
                clap::Arg::new("level")
                    .long("level")
                    .env("TOOL_LEVEL")
                    .default_value("3")
                    .help("How much\n  to do."),
            )
            .arg(clap::Arg::new("secret").long("secret").hide(true))
            .subcommand(
                clap::Command::new("key").subcommand(
                    clap::Command::new("make")
                        .about("Makes a key.")
                        .arg(clap::Arg::new("file").value_name("FILE").help("Where.")),
                ),
            );
        assert_eq!(
            flags_tables(&cmd),
            "## Flags of `tool`\n\n\
             | Flag | Environment | Default | Description |\n|---|---|---|---|\n\
             | `--level` | `TOOL_LEVEL` | `3` | How much to do. |\n\n\
             ## Arguments of `tool key make`\n\nMakes a key.\n\n\
             | Flag | Environment | Default | Description |\n|---|---|---|---|\n\
             | `<FILE>` |  |  | Where. |\n"
        );
    }
}
