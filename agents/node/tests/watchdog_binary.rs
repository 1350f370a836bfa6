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

/// A kubeconfig whose API server is an address on loopback where nothing listens: every
/// renewal fails.
fn unreachable_kubeconfig(dir: &Path) -> std::path::PathBuf {
    let kubeconfig = dir.join("kubeconfig");
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
    kubeconfig
}

/// Starts `palisade-node` as `node` with `--watchdog wd`: a 4 s Lease renewed every second, a
/// self-fence after 2 s, petting every 100 ms, no peer check (it would need a key and peers);
/// its log goes to `stderr`.
fn spawn_agent(
    node: &str,
    kubeconfig: &Path,
    state: &Path,
    wd: &Path,
    stderr: Stdio,
) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_palisade-node"))
        .args(["--node-name", node, "--address", "127.0.0.1"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--state-dir")
        .arg(state)
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
            "--no-peer-check",
        ])
        .arg("--watchdog")
        .arg(wd)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

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
    let kubeconfig = unreachable_kubeconfig(dir.path());
    let wd = dir.path().join("watchdog");
    std::fs::write(&wd, b"").unwrap();
    let node = format!("wd-test-{}", std::process::id());
    let mut child = spawn_agent(
        &node,
        &kubeconfig,
        &dir.path().join("state"),
        &wd,
        Stdio::null(),
    );

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

/// An agent restarted after its Lease went stale (its self-fence under way) must not open the
/// watchdog: opening and arming a running watchdog pet it, which would move the reset the
/// controller's trust counts on later. A FIFO stands in for the device, so that the test sees
/// the agent hold it open (a read answers "would block") without any byte written; the API
/// server cannot be reached, so the agent never renews and never opens it.
#[test]
fn an_agent_restarted_with_a_stale_lease_does_not_open_the_watchdog() {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = unreachable_kubeconfig(dir.path());
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // The last renewal was an hour ago.
    let hour_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        - 3_600_000;
    std::fs::write(state.join("lease-renewed"), hour_ago.to_string()).unwrap();
    let wd = dir.path().join("watchdog");
    nix::unistd::mkfifo(&wd, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&wd)
        .unwrap();
    let log = dir.path().join("agent.log");
    let node = format!("wd-stale-{}", std::process::id());
    let mut child = spawn_agent(
        &node,
        &kubeconfig,
        &state,
        &wd,
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let held = |reader: &mut std::fs::File| {
        let mut buf = [0u8; 16];
        match reader.read(&mut buf) {
            Ok(0) => false,
            Ok(n) => panic!("the agent wrote {n} byte(s) to the watchdog"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
            Err(e) => panic!("reading the FIFO: {e}"),
        }
    };
    // It starts with the stale record's kill sweep, then sets the watchdog up.
    eventually("the stale-start sweep", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("stale Lease at start: killed the containers")
            .then_some(())
    });
    // Renewals keep failing: for a while (tens of watchdog intervals, several renew
    // intervals) the device is never held open.
    for _ in 0..30 {
        assert!(
            !held(&mut reader),
            "the agent opened the watchdog with a stale Lease"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the agent keeps running"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("the watchdog is opened (which pets it) only once the Lease is renewed"),
        "the agent says why: {text}"
    );
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = eventually("agent exits", Duration::from_secs(20), || {
        child.try_wait().unwrap()
    });
    assert!(status.success(), "{status:?}");
    assert!(!held(&mut reader), "never opened, not even to disarm");
}
