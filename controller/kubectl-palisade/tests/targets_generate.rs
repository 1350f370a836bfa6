//! `kubectl palisade targets generate`, run as the built binary on inventory files: good rows
//! give one pinned FenceTarget each on stdout (a YAML stream, or a JSON List); one bad row gives
//! every problem on stderr, exit 1 and nothing at all on stdout. It needs no cluster.

use std::path::Path;
use std::process::Command;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn generate(dir: &Path, inventory: &str, extra: &[&str]) -> Out {
    let file = dir.join("nodes.csv");
    std::fs::write(&file, inventory).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-palisade"))
        // No cluster is read: a kubeconfig that does not exist must not matter.
        .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
        .args(["targets", "generate", "--inventory"])
        .arg(&file)
        .args(extra)
        .output()
        .expect("run kubectl-palisade");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

const GOOD: &str = "\
node,bmc,system_uuid,pdu,secret
m1,admin@10.0.20.11,4c4c4544-0037-3010-8052-b4c04f4d3231,pdu-a.mgmt/7,
m2,admin@10.0.20.12:6230,4C4C4544-0037-3010-8052-B4C04F4D3232,,bmc-m2
";

#[test]
fn an_inventory_becomes_one_pinned_fence_target_per_node_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let out = generate(dir.path(), GOOD, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stderr, "");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&out.stdout).unwrap();
    assert_eq!(docs.len(), 2, "{}", out.stdout);
    assert_eq!(docs[0]["kind"], "FenceTarget");
    assert_eq!(docs[0]["metadata"]["name"], "m1");
    assert_eq!(
        docs[0]["spec"]["levels"][0]["devices"][0]["url"],
        "ipmi://admin@10.0.20.11?guid=4c4c4544-0037-3010-8052-b4c04f4d3231"
    );
    assert_eq!(
        docs[1]["spec"]["levels"][0]["devices"][0]["url"],
        "ipmi://admin@10.0.20.12:6230?guid=4c4c4544-0037-3010-8052-b4c04f4d3232"
    );
    let json = generate(dir.path(), GOOD, &["-o", "json"]);
    assert_eq!(json.code, 0, "{}", json.stderr);
    let list: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert_eq!(list["items"][1]["metadata"]["name"], "m2");
}

#[test]
fn one_bad_row_prints_every_problem_and_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let bad = format!(
        "{GOOD}m3,ipmi://admin@10.0.20.13?giud=x,4c4c4544-0037-3010-8052-b4c04f4d3233,,\n\
         m4,admin@10.0.20.14,not-a-uuid,,\n"
    );
    let out = generate(dir.path(), &bad, &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(out.stdout, "", "no partial output");
    for needle in [
        "line 4 (node m3), column bmc",
        "did you mean guid?",
        "line 5 (node m4), column system_uuid",
        "2 problem(s)",
        "nothing was generated",
    ] {
        assert!(out.stderr.contains(needle), "{needle} in:\n{}", out.stderr);
    }
    // A misspelt column is refused, not dropped with the pin it carries.
    let out = generate(
        dir.path(),
        "node,bmc,sytem_uuid\nm1,admin@bmc,4c4c4544-0037-3010-8052-b4c04f4d3231\n",
        &[],
    );
    assert_eq!((out.code, out.stdout.as_str()), (1, ""));
    assert!(
        out.stderr.contains("column sytem_uuid")
            && out.stderr.contains("did you mean system_uuid?"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_help_documents_the_inventory_and_the_placeholders() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-palisade"))
        .args(["targets", "generate", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "node,bmc,system_uuid,pdu",
        "{system_uuid}",
        "{pdu_outlet}",
        "guid=",
        "--template",
        "kubectl apply -f -",
    ] {
        assert!(help.contains(word), "{word} in:\n{help}");
    }
}
