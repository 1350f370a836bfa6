//! `kubectl palisade`, run as a real binary against the lab's API server and controller:
//! `check` finds the unfenceable node, `status` and `explain` say what Palisade sees, the safe
//! `delete-pod` refuses on an unfenced node (and records who forced it with `--confirm`) and
//! deletes on a fenced one, `timeline` tells a real fence's story (text and SVG, phases in
//! order), `fence`/`cancel` request and withdraw a manual fence, and bad input gets a clear
//! message and exit code. Plain `kubectl get` (Debian's 1.20) shows the fenced NodeFence and,
//! while a node is silent, its pods' STATUS as `NodeSilent` (withdrawn once it renews).
//!
//! It behaves like kubectl: `KUBECONFIG` is a list of files merged first-wins, `--context`
//! picks a context (whose namespace `-n` defaults to), the read commands print `-o json|yaml`,
//! a `fence --wait` that times out exits 5, and a forced deletion records the user the API
//! server names in a SelfSubjectReview (an API server that serves none, as the lab's 1.20 does,
//! gets the local name recorded as unverified; one that refuses to say gets no deletion).

mod common;

use std::time::Duration;

use common::sim::{Sim, SimNode};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use palisade_model::nodefence::Phase;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

use common::PluginOut as Out;

fn plugin(lab: &palisade_lab::Lab, args: &[&str]) -> Out {
    let cp = lab.control_plane().expect("control plane");
    plugin_with(cp.admin_kubeconfig().as_os_str(), args)
}

/// The plugin's standard output as JSON (it was run with `-o json`).
fn json(o: &Out) -> serde_json::Value {
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", o.stdout))
}

/// Whether the API server serves SelfSubjectReview (`authentication.k8s.io/v1`, Kubernetes
/// 1.28 and later), by its discovery document.
fn serves_self_subject_review(c: &kube::Client, rt: &tokio::runtime::Runtime) -> bool {
    rt.block_on(c.list_api_group_resources("authentication.k8s.io/v1"))
        .map(|l| l.resources.iter().any(|r| r.name == "selfsubjectreviews"))
        .unwrap_or(false)
}

#[test]
fn the_plugin_explains_fences_and_force_deletes_only_what_is_fenced() {
    let lab = common::sim::bare_lab(1);
    let rt = rt();
    let sim = Sim::new(&lab, &rt);
    namespace(&sim.c, &rt, SYSTEM_NS);
    namespace(&sim.c, &rt, "kp");
    let ctl = start_controller(&lab, "ctl-plugin");
    ctl.wait_ticks(2);
    let labels = [("palisade.test/scenario", "kp")];
    sim.nodes(&[
        SimNode {
            labels: &labels,
            ..SimNode::new("kp-a", Some(0))
        },
        SimNode {
            labels: &labels,
            ..SimNode::new("kp-b", None)
        },
    ]);
    sim.policy("kp", common::sim::spec("kp", json!({})));
    sim.claim("kp", "data-db-0", "ReadWriteOnce");
    sim.pod_with_claim("kp", "db-0", "kp-a", "data-db-0");
    sim.pod("kp", "web-0", "kp-b", &[], None);

    // Bad input: clear messages, exit 1, nothing changed.
    let o = plugin(&lab, &["explain", "no-such-node"]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("no Node named"), "{}", o.stderr);
    let o = plugin(&lab, &["fence", "no-such-node", "--reason", "x"]);
    assert_eq!(o.code, 1);
    assert!(sim.fences("no-such-node").is_empty());
    let o = plugin(&lab, &["delete-pod", "kp/nope"]);
    assert_eq!(o.code, 1);
    assert_eq!(plugin(&lab, &["timeline", "nope"]).code, 1);
    let o = plugin(&lab, &["status", "-o", "xml"]);
    assert_eq!(o.code, 2, "an unknown output format is bad usage");
    assert!(
        o.stderr.contains("[possible values: json, yaml]"),
        "{}",
        o.stderr
    );
    let o = plugin(&lab, &["status", "--context", "nope"]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .contains("no context \"nope\" in the kubeconfig (contexts: lab)"),
        "{}",
        o.stderr
    );

    // KUBECONFIG as kubectl reads it: a list, missing files skipped, the first file to set a
    // key wins. The first file adds a context `kp` on the admin's cluster and user, with
    // namespace kp, and makes it current; the admin file's `current-context: lab` loses.
    let admin = lab
        .control_plane()
        .unwrap()
        .admin_kubeconfig()
        .to_path_buf();
    let extra = lab.dir().join("kp.kubeconfig");
    std::fs::write(
        &extra,
        "apiVersion: v1\nkind: Config\ncontexts:\n- name: kp\n  context:\n    cluster: lab\n    user: lab\n    namespace: kp\ncurrent-context: kp\n",
    )
    .unwrap();
    let list = std::env::join_paths([lab.dir().join("missing.kubeconfig"), extra, admin]).unwrap();

    // check: kp-b cannot be fenced (no target, no trusted self-fence).
    let o = plugin(&lab, &["check"]);
    assert_eq!(o.code, 4, "check reports problems with exit 4");
    assert!(
        o.stdout
            .contains("node kp-b: no FenceTarget and self-fencing is not trusted"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("controller leader ctl-plugin"),
        "{}",
        o.stdout
    );
    let o = plugin(&lab, &["check", "-o", "json"]);
    assert_eq!(o.code, 4, "the same exit code with -o");
    let report = json(&o);
    let problems = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["level"] == "problem")
        .count();
    assert!(problems >= 1 && report["problems"] == problems, "{report}");
    assert!(report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["message"]
            .as_str()
            .unwrap()
            .starts_with("node kp-b: no FenceTarget and self-fencing is not trusted")));

    let o = plugin(&lab, &["status"]);
    assert_eq!(o.code, 0);
    assert!(
        o.stdout.contains("kp-a") && o.stdout.contains("Healthy"),
        "{}",
        o.stdout
    );
    let o = plugin(&lab, &["status", "-o", "json"]);
    assert_eq!(o.code, 0);
    let report = json(&o);
    let kp_a = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "kp-a")
        .unwrap_or_else(|| panic!("kp-a in {report}"));
    assert_eq!(kp_a["health"], "Healthy");
    assert_eq!(kp_a["policies"], json!(["kp"]));
    assert!(report["nodeFences"].is_array() && report["podsOnSilentNodes"].is_array());
    let o = plugin(&lab, &["status", "-o", "yaml"]);
    assert_eq!(o.code, 0);
    let yaml: serde_json::Value = serde_saphyr::from_str(&o.stdout).expect("YAML");
    assert!(yaml["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["name"] == "kp-a"));
    let o = plugin(&lab, &["explain", "kp-b"]);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("policy:      kp "), "{}", o.stdout);
    assert!(
        o.stdout.contains("does not trust self-fencing"),
        "{}",
        o.stdout
    );
    // The pods of one node, read with a field selector: db-0 (with its RWO claim) on kp-a,
    // web-0 on kp-b.
    let o = plugin(&lab, &["explain", "kp-a", "-o", "json"]);
    assert_eq!(o.code, 0);
    let e = json(&o);
    assert_eq!(e["policy"]["verdict"], "selected");
    assert_eq!(e["policy"]["name"], "kp");
    assert_eq!(
        e["pods"],
        json!({"total": 1, "stateful": 1, "nothingCallsForFence": false})
    );
    assert_eq!(e["heartbeat"]["health"], "Healthy");
    let o = plugin(&lab, &["explain", "kp-b", "-o", "json"]);
    assert_eq!(json(&o)["pods"]["total"], 1);
    assert_eq!(json(&o)["fencing"]["verdict"], "noFencingLevel");

    // The safe force deletion refuses on an unfenced node and deletes nothing.
    let pods: Api<Pod> = Api::namespaced(sim.c.clone(), "kp");
    let o = plugin(&lab, &["delete-pod", "kp/web-0"]);
    assert_eq!(o.code, 3, "refused");
    assert!(o.stderr.contains("two copies of kp/web-0"), "{}", o.stderr);
    // kubectl's spelling: refused the same way; without --force it is a usage error.
    let o = plugin(&lab, &["delete", "pod", "web-0", "-n", "kp", "--force"]);
    assert_eq!(o.code, 3, "refused: {}", o.stderr);
    assert!(o.stderr.contains("two copies of kp/web-0"), "{}", o.stderr);
    let o = plugin(&lab, &["delete", "pod", "web-0", "-n", "kp"]);
    assert_eq!(o.code, 2, "--force is required: {}", o.stderr);
    // Without -n, the namespace is the context's: kp by the merged KUBECONFIG list's current
    // context, `default` with --context lab (whose context names none).
    let o = plugin_with(&list, &["delete", "pod", "web-0", "--force"]);
    assert_eq!(
        o.code, 3,
        "refused in the context's namespace: {}",
        o.stderr
    );
    assert!(o.stderr.contains("two copies of kp/web-0"), "{}", o.stderr);
    let o = plugin_with(&list, &["delete-pod", "web-0", "--context", "lab"]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("no pod default/web-0"), "{}", o.stderr);
    let o = plugin_with(&list, &["--context", "nope", "check"]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .contains("no context \"nope\" in the kubeconfig (contexts: kp, lab)"),
        "{}",
        o.stderr
    );
    assert!(
        rt.block_on(pods.get_opt("web-0")).unwrap().is_some(),
        "nothing deleted"
    );
    // With --confirm it deletes and records who did it, as the API server names them (or, on
    // an API server with no SelfSubjectReview, the local name marked unverified).
    let whoami = serves_self_subject_review(&sim.c, &rt);
    let o = plugin(&lab, &["delete-pod", "kp/web-0", "--confirm"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    eventually("web-0 gone", WAIT, || {
        rt.block_on(pods.get_opt("web-0"))
            .unwrap()
            .is_none()
            .then_some(())
    });
    let ev = common::events(&sim.c, &rt, "kp", "web-0", "ForceDeletedUnfenced");
    assert_eq!(ev.len(), 1, "the forced deletion is recorded");
    let message = ev[0].message.as_deref().unwrap_or_default();
    // An API server too old to name anyone: the local name, recorded as unverified.
    let who = if whoami {
        "palisade-admin (groups: system:masters"
    } else {
        "unverified local user "
    };
    assert!(
        message.starts_with(who) && message.contains("via kubectl-palisade"),
        "{message}"
    );

    // A manual fence of a healthy node waits (held); it can be cancelled while Pending.
    // `--wait` follows it; still Pending at --timeout, it exits 5.
    let o = plugin(
        &lab,
        &[
            "fence",
            "kp-b",
            "--reason",
            "suspected",
            "--wait",
            "--timeout",
            "2",
        ],
    );
    assert_eq!(o.code, 5, "a --wait that timed out");
    assert!(
        o.stdout.contains("still in progress after 2s"),
        "{}",
        o.stdout
    );
    let manual = eventually("the manual fence", WAIT, || {
        sim.fences("kp-b").into_iter().next()
    });
    let name = manual.metadata.name.clone().unwrap();
    let o = plugin(&lab, &["cancel", &name]);
    assert_eq!(o.code, 0, "a Pending fence is cancelled");
    eventually("the manual fence deleted", WAIT, || {
        sim.fences("kp-b").is_empty().then_some(())
    });

    // kp-a goes silent: the controller fences it through its BMC and releases db-0.
    sim.silence("kp-a");
    let fenced = sim.wait_fence_phase("kp-a", Phase::Released, WAIT);
    let fence_name = fenced.metadata.name.clone().unwrap();
    let o = plugin(&lab, &["cancel", &fence_name]);
    assert_eq!(o.code, 3, "too late to cancel: fencing has begun");
    let o = plugin(&lab, &["explain", "kp-a"]);
    assert!(o.stdout.contains(&fence_name), "{}", o.stdout);
    assert!(o.stdout.contains("Unhealthy"), "{}", o.stdout);

    // A pod still bound to the fenced node is force-deleted without --confirm.
    sim.pod("kp", "late-0", "kp-a", &[], None);
    let o = plugin(&lab, &["delete-pod", "kp/late-0"]);
    assert_eq!(
        o.code, 0,
        "the node is fenced (verified): deleted: {}",
        o.stderr
    );
    assert!(o.stdout.contains(&fence_name), "{}", o.stdout);
    eventually("late-0 gone", WAIT, || {
        rt.block_on(pods.get_opt("late-0"))
            .unwrap()
            .is_none()
            .then_some(())
    });

    // The timeline tells the story in order, as text and as a picture.
    let svg = lab.dir().join("timeline.svg");
    let png = lab.dir().join("timeline.png");
    let o = plugin(
        &lab,
        &[
            "timeline",
            &fence_name,
            "--svg",
            svg.to_str().unwrap(),
            "--png",
            png.to_str().unwrap(),
        ],
    );
    assert_eq!(o.code, 0);
    let at = |text: &str, what: &str| {
        text.find(what)
            .unwrap_or_else(|| panic!("{what} missing from:\n{text}"))
    };
    let t = &o.stdout;
    assert!(at(t, "Pending") < at(t, "Fencing") && at(t, "Fencing") < at(t, "Fenced —"));
    assert!(at(t, "Fenced —") < at(t, "Releasing") && at(t, "Releasing") < at(t, "Released —"));
    assert!(
        t.contains("evidence") && t.contains("released pod kp/db-0"),
        "{t}"
    );
    // The same story as JSON: the marks in time order, with the picture noted on stderr only.
    let o = plugin(
        &lab,
        &[
            "timeline",
            &fence_name,
            "-o",
            "json",
            "--svg",
            svg.to_str().unwrap(),
        ],
    );
    assert_eq!(o.code, 0);
    let story = json(&o);
    assert_eq!(story["name"], fence_name.as_str());
    assert_eq!(story["node"], "kp-a");
    let marks = story["marks"].as_array().unwrap();
    let offsets: Vec<f64> = marks
        .iter()
        .map(|m| m["offsetSeconds"].as_f64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    assert!(marks
        .iter()
        .any(|m| m["lane"] == "release" && m["text"] == "released pod kp/db-0"));
    let text_marks = t
        .lines()
        .filter(|l| l.trim_start().starts_with('+'))
        .count();
    assert_eq!(marks.len(), text_marks, "one mark per line of text: {t}");
    assert!(o.stderr.contains("picture:"), "{}", o.stderr);
    // Plain `kubectl get` (Debian's kubectl 1.20) shows the fenced state...
    let o = kubectl(&lab, &["get", "nodefences"]);
    let row = o
        .lines()
        .find(|l| l.starts_with(&fence_name))
        .unwrap_or_default();
    assert!(row.contains("kp-a") && row.contains("Released"), "{o}");
    // ...and a silent node's pods: STATUS NodeSilent while kp-b is silent, gone once it renews.
    sim.pod("kp", "web-1", "kp-b", &[], None);
    sim.silence("kp-b");
    let status_of = |pod: &str| {
        let o = kubectl(&lab, &["get", "pods", "-n", "kp", pod, "--no-headers"]);
        o.split_whitespace().nth(2).unwrap_or_default().to_string()
    };
    eventually("kubectl shows web-1 NodeSilent", WAIT, || {
        (status_of("web-1") == "NodeSilent").then_some(())
    });
    // The plugin's status lists it too: the pods of each silent node, read by field selector.
    eventually("status lists web-1 on silent kp-b", WAIT, || {
        let o = plugin(&lab, &["status", "-o", "json"]);
        let report = json(&o);
        let listed = report["podsOnSilentNodes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            listed
                .iter()
                .all(|p| p["node"] == "kp-a" || p["node"] == "kp-b"),
            "only pods of silent nodes: {report}"
        );
        listed
            .iter()
            .any(|p| {
                p["namespace"] == "kp"
                    && p["name"] == "web-1"
                    && p["node"] == "kp-b"
                    && p["stateful"] == false
            })
            .then_some(())
    });
    sim.revive("kp-b");
    eventually("kubectl shows web-1 without NodeSilent", WAIT, || {
        (status_of("web-1") == "Pending").then_some(())
    });
    let raster = std::fs::read(&png).expect("the PNG was written");
    assert!(
        raster.starts_with(b"\x89PNG\r\n\x1a\n") && raster.len() > 2000,
        "a PNG picture"
    );
    if let Ok(keep) = std::env::var("PALISADE_KEEP_TIMELINE") {
        let _ = std::fs::copy(&png, format!("{keep}.png"));
        let _ = std::fs::copy(&svg, format!("{keep}.svg"));
    }
    let pic = std::fs::read_to_string(&svg).expect("the SVG was written");
    assert!(pic.starts_with("<svg"));
    let p = |phase: &str| at(&pic, &format!("data-phase=\"{phase}\""));
    assert!(
        p("Pending") < p("Fencing") && p("Fencing") < p("Fenced") && p("Fenced") < p("Released")
    );
}
