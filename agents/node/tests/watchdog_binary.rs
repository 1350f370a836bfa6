//! The `palisade-node` binary's `--watchdog` wiring, end to end on the real binary: with an
//! API server that cannot be reached, the agent pets the device only until its (never
//! renewed) Lease is older than `--self-fence-after`, and on SIGTERM it writes the magic close
//! `V` before exiting. A regular file stands in for `/dev/watchdog`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_test_support::eventually;

fn pets(path: &Path) -> usize {
    std::fs::read(path)
        .unwrap_or_default()
        .iter()
        .filter(|b| **b == b'1')
        .count()
}

#[test]
fn agent_pets_only_while_the_lease_is_fresh_and_disarms_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // An API server address on loopback where nothing listens: every renewal fails.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        r#"apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:1
    insecure-skip-tls-verify: true
users:
- name: u
  user: {}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"#,
    )
    .unwrap();
    let wd = dir.path().join("watchdog");
    std::fs::write(&wd, b"").unwrap();
    let node = format!("wd-test-{}", std::process::id());
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade-node"))
        .args(["--node-name", &node, "--address", "127.0.0.1"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args([
            "--lease-duration",
            "4s",
            "--renew-interval",
            "1s",
            "--self-fence-after",
            "2s",
            "--metrics-addr",
            "127.0.0.1:0",
            "--watchdog-interval",
            "100ms",
            // The watchdog alone: the peer check would need a key (and peers).
            "--no-peer-check",
        ])
        .arg("--watchdog")
        .arg(&wd)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    eventually("first pets", Duration::from_secs(20), || {
        (pets(&wd) > 0).then_some(())
    });
    // The Lease is never renewed: petting must stop (the count stays put for a whole second,
    // ten intervals).
    let stopped_at = eventually("petting stops", Duration::from_secs(30), || {
        let a = pets(&wd);
        std::thread::sleep(Duration::from_secs(1));
        (pets(&wd) == a).then_some(a)
    });
    assert!(stopped_at > 0);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the agent keeps running"
    );

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = eventually("agent exits", Duration::from_secs(20), || {
        child.try_wait().unwrap()
    });
    assert!(status.success(), "{status:?}");
    let bytes = std::fs::read(&wd).unwrap();
    assert_eq!(bytes.last(), Some(&b'V'), "magic close last: {bytes:?}");
    assert_eq!(pets(&wd), stopped_at, "no pet after the Lease went stale");
}
