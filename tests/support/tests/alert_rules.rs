//! The shipped alerts (`controller/manifests/prometheus-rules.yaml`), each proven by the real
//! Prometheus rule engine and each with a runbook:
//! - `promtool test rules` passes `controller/manifests/prometheus-rules.test.yaml`, which
//!   raises each alert from the series that should fire it, with its labels and rendered
//!   annotations, and checks it is quiet before;
//! - every alert has such a test, and a `runbook_url` that is its section of
//!   `docs/operations.md` (a `### Name` heading there).
//!
//! - every node-agent and bridge metric an alert queries is one that component exports (its
//!   reference page, generated from its registry and checked current by its own test).
//!
//! What would make it fail: an alert added without a unit test or a runbook, an expression or
//! annotation changed without its test, a runbook heading renamed.

use std::process::Command;

use palisade_test_support::reference::{repo_path, shipped_alerts};

const TESTS: &str = "controller/manifests/prometheus-rules.test.yaml";
const RUNBOOKS: &str = "docs/operations.md";
const RUNBOOK_BASE: &str = "https://palisade.dev/docs/operations.html#";

#[test]
fn every_alert_fires_under_promtool_on_the_series_that_should_raise_it() {
    let tests = std::fs::read_to_string(repo_path(TESTS)).expect("the rules' unit tests");
    let tested: serde_json::Value = serde_saphyr::from_str(&tests).expect("YAML");
    let named: Vec<&str> = tested["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .filter(|t| !t["exp_alerts"].as_array().is_none_or(Vec::is_empty))
        .filter_map(|t| t["alertname"].as_str())
        .collect();
    let alerts = shipped_alerts();
    assert!(!alerts.is_empty());
    for a in &alerts {
        assert!(
            named.contains(&a.name.as_str()),
            "{TESTS} never raises {}: add a test group for it",
            a.name
        );
    }
    let out = Command::new("promtool")
        .args(["test", "rules", TESTS])
        .current_dir(repo_path(""))
        .output()
        .expect("promtool (hack/install-deps.sh installs Debian's prometheus)");
    assert!(
        out.status.success(),
        "promtool test rules {TESTS}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_alert_links_its_runbook_section() {
    let book = std::fs::read_to_string(repo_path(RUNBOOKS)).expect("the runbooks");
    for a in shipped_alerts() {
        assert_eq!(
            a.runbook,
            format!("{RUNBOOK_BASE}{}", a.name.to_lowercase()),
            "{}: runbook_url",
            a.name
        );
        assert!(
            book.lines().any(|l| l == format!("### {}", a.name)),
            "{RUNBOOKS} has no `### {}` section",
            a.name
        );
    }
}

#[test]
fn every_node_agent_and_bridge_metric_an_alert_queries_is_exported() {
    let page = |p: &str| std::fs::read_to_string(repo_path(p)).expect("a reference page");
    let pages = [
        ("palisade_node_", page("docs/reference/node-agent.md")),
        (
            "palisade_bridge_",
            page("docs/reference/firmware-bridge.md"),
        ),
    ];
    let mut checked = 0;
    for a in shipped_alerts() {
        for series in a
            .expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        {
            let Some((_, text)) = pages.iter().find(|(p, _)| series.starts_with(p)) else {
                continue;
            };
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| series.strip_suffix(s))
                .unwrap_or(series);
            assert!(
                text.contains(&format!("| `{series}` |"))
                    || text.contains(&format!("| `{family}` |")),
                "{}: {series} is not exported (not in its reference page)",
                a.name
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "the node agent's and bridge's alerts were read"
    );
}

/// The shipped Grafana dashboard (`controller/manifests/grafana-dashboard.json`): every panel
/// says its unit, and the 0/1 gauges say what 0 and 1 mean.
#[test]
fn every_dashboard_panel_has_a_unit() {
    let path = repo_path("controller/manifests/grafana-dashboard.json");
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("JSON");
    let panels = d["panels"].as_array().expect("panels");
    assert!(panels.len() >= 5);
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        let defaults = &p["fieldConfig"]["defaults"];
        assert!(
            defaults["unit"].as_str().is_some_and(|u| !u.is_empty()),
            "panel {title:?} has no unit"
        );
        let exprs: Vec<&str> = p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["expr"].as_str())
            .collect();
        let boolean = exprs
            .iter()
            .any(|e| e.contains("palisade_fence_target_ready") || e.contains("palisade_leader"));
        if boolean && !exprs.iter().any(|e| e.contains("changes(")) {
            let options = &defaults["mappings"][0]["options"];
            assert!(
                options["0"]["text"].is_string() && options["1"]["text"].is_string(),
                "panel {title:?} shows a 0/1 gauge without saying what 0 and 1 mean"
            );
        }
    }
}
