//! Continuous fence readiness and the shipped alerts, against a real BMC, the real controller
//! and a real Prometheus (Debian's) evaluating `controller/manifests/prometheus-rules.yaml`:
//! - `promtool check rules` accepts the shipped rules;
//! - the controller reads the node's IPMI BMC (status only) and reports the FenceTarget ready;
//! - the BMC stops answering (its `ipmi_sim` is frozen): the target becomes not ready (status,
//!   `FenceNotReady` Event), `palisade_fence_target_ready` drops, and Prometheus fires
//!   `PalisadeNodeWithoutWorkingFence` for the node; the BMC answers again: ready, resolved;
//! - no check ever powered the machine off;
//! - every controller metric the shipped Grafana dashboard and rules query is exported by the
//!   controller.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::sim::{Sim, SimNode};
use common::*;
use kube::Api;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_model::FenceTarget;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Resumes a frozen process even when the test fails half-way.
struct Frozen(i32);

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGCONT);
    }
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The alerts Prometheus has firing now, as (name, node) pairs.
fn firing(addr: &str) -> Option<Vec<(String, String)>> {
    let body = http_get(addr, "/api/v1/alerts")?;
    let json: serde_json::Value = serde_json::from_str(body.split("\r\n\r\n").nth(1)?).ok()?;
    Some(
        json["data"]["alerts"]
            .as_array()?
            .iter()
            .filter(|a| a["state"] == "firing")
            .map(|a| {
                (
                    a["labels"]["alertname"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    a["labels"]["node"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
    )
}

#[test]
fn a_bmc_that_stops_answering_makes_the_target_not_ready_and_fires_the_alert() {
    let rules = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../controller/manifests/prometheus-rules.yaml"
    );
    let check = Command::new("promtool")
        .args(["check", "rules", rules])
        .output()
        .expect("promtool (hack/install-deps.sh installs prometheus)");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    let lab = common::sim::bare_lab(1);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    let cp = lab.control_plane().expect("control plane");
    let ctl = start_controller_as(
        &lab,
        "ctl-ready",
        cp.admin_kubeconfig(),
        &[],
        &["--readiness-interval".into(), "1s".into()],
    );
    ctl.wait_ticks(2);
    let labels = [("palisade.test/scenario", "ready")];
    sim.nodes(&[SimNode {
        labels: &labels,
        ..SimNode::new("rd-m0", Some(0))
    }]);
    sim.policy("ready", common::sim::spec("ready", json!({})));
    let targets: Api<FenceTarget> = Api::all(sim.c.clone());
    let readiness = |want: bool| {
        eventually(&format!("rd-m0 readiness {want}"), WAIT, || {
            let t = rt.block_on(targets.get("rd-m0")).ok()?;
            let r = t.status?.readiness?;
            (r.ready == want).then_some(r)
        })
    };
    let r = readiness(true);
    assert_eq!(r.levels.len(), 1);
    assert!(r.levels[0].devices[0].reported.contains("On"), "{r:?}");
    assert!(r.levels[0].devices[0].url.starts_with("ipmi://"), "{r:?}");

    // A real Prometheus scrapes the controller and evaluates the shipped rules (their `for:`
    // waits shortened to 0s for the test; the expressions are the shipped ones).
    let dir = lab.dir().join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(rules).unwrap();
    let fast: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("for:") {
                l.split("for:").next().unwrap().to_string() + "for: 0s"
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(dir.join("rules.yaml"), fast).unwrap();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [rules.yaml]\nscrape_configs:\n  - job_name: palisade-controller\n    static_configs: [{{targets: ['{}']}}]\n",
            ctl.metrics_addr
        ),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _prom = Prometheus(
        Command::new("prometheus")
            .current_dir(&dir)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start prometheus"),
    );
    eventually(
        "Prometheus evaluates the rules, nothing firing for rd-m0",
        WAIT,
        || {
            let f = firing(&web)?;
            (!f.iter()
                .any(|(a, n)| a == "PalisadeNodeWithoutWorkingFence" && n == "rd-m0"))
            .then_some(())
        },
    );

    // The BMC stops answering.
    let m = &lab.machines()[0];
    let pid: i32 = std::fs::read_to_string(m.dir().join("bmc.pid"))
        .expect("the BMC's pid file")
        .trim()
        .parse()
        .unwrap();
    kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("freeze ipmi_sim");
    let frozen = Frozen(pid);
    let r = readiness(false);
    assert!(!r.levels[0].devices[0].last_error.is_empty(), "{r:?}");
    sim.wait_event("rd-m0", "FenceNotReady", WAIT);
    eventually(
        "PalisadeNodeWithoutWorkingFence fires for rd-m0",
        WAIT,
        || {
            firing(&web)?
                .iter()
                .any(|(a, n)| a == "PalisadeNodeWithoutWorkingFence" && n == "rd-m0")
                .then_some(())
        },
    );
    assert!(
        ctl.metrics()
            .unwrap_or_default()
            .contains("palisade_fence_target_ready{node=\"rd-m0\",level=\"ipmi\"} 0"),
        "{:?}",
        ctl.metrics()
    );

    // It answers again.
    drop(frozen);
    readiness(true);
    sim.wait_event("rd-m0", "FenceReady", WAIT);
    eventually("the alert resolves", WAIT, || {
        (!firing(&web)?
            .iter()
            .any(|(a, n)| a == "PalisadeNodeWithoutWorkingFence" && n == "rd-m0"))
        .then_some(())
    });
    assert!(
        m.is_powered(),
        "a readiness check never powers a machine off"
    );
    assert!(sim.fences("rd-m0").is_empty(), "nothing was fenced");

    // Every metric the shipped dashboard and rules query is one the controller exports (a
    // histogram's `_bucket`, `_sum` and `_count` series under its `# TYPE` line).
    let exported = ctl.metrics().expect("the controller's /metrics");
    let manifests = concat!(env!("CARGO_MANIFEST_DIR"), "/../../controller/manifests");
    let mut queried = std::collections::BTreeSet::new();
    for file in ["grafana-dashboard.json", "prometheus-rules.yaml"] {
        let text = std::fs::read_to_string(format!("{manifests}/{file}")).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("palisade_") {
            rest = &rest[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(rest.len());
            queried.insert(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    assert!(queried.len() >= 10, "the manifests query {queried:?}");
    // The node agent's and the bridge's metrics are checked against their reference pages,
    // generated from their registries (tests/support/tests/alert_rules.rs).
    for metric in queried
        .iter()
        .filter(|m| !m.starts_with("palisade_node_") && !m.starts_with("palisade_bridge_"))
    {
        // A histogram's series and a counter's `_total` sample are declared under their
        // family's name (OpenMetrics).
        let base = [
            ("_bucket", "histogram"),
            ("_sum", "histogram"),
            ("_count", "histogram"),
            ("_total", "counter"),
        ]
        .iter()
        .find_map(|(suffix, kind)| {
            metric
                .strip_suffix(suffix)
                .filter(|b| exported.contains(&format!("# TYPE {b} {kind}\n")))
        })
        .unwrap_or(metric);
        assert!(
            exported.contains(&format!("# TYPE {base} ")),
            "{metric} is queried by the manifests but not exported:\n{exported}"
        );
    }
}
