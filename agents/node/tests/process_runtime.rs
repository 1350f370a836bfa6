//! The process runtime against the real kernel: sessions, cgroups, exit codes, kill.

use std::path::PathBuf;
use std::time::Duration;

use palisade_node::cgroup::Hierarchies;
use palisade_node::runtime::process::ProcessRuntime;
use palisade_node::runtime::{ContainerConfig, Runtime, RuntimeError};
use palisade_test_support::eventually_async;

fn runtime(dir: &std::path::Path) -> ProcessRuntime {
    let shim = PathBuf::from(env!("CARGO_BIN_EXE_palisade-node"));
    ProcessRuntime::new(
        dir,
        shim,
        Hierarchies::detect(std::path::Path::new("/sys/fs/cgroup")),
    )
    .unwrap()
}

fn cfg(uid: &str, argv: &[&str]) -> ContainerConfig {
    ContainerConfig {
        pod_uid: uid.into(),
        name: "c".into(),
        attempt: 0,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("X".into(), "42".into()),
        ],
        working_dir: Some("/tmp".into()),
        rootfs: None,
    }
}

fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z"))
        .unwrap_or(false)
}

/// How long the kernel gets to start or reap a process.
const PROCESS_WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn exit_code_env_and_working_directory_reach_the_process() {
    let d = tempfile::tempdir().unwrap();
    let rt = runtime(d.path());
    let out = d.path().join("out");
    let script = format!("echo \"$X $(pwd)\" > {}; exit 3", out.display());
    let c = cfg("u1", &["/bin/sh", "-c", &script]);
    rt.start(&c).await.unwrap();
    let st = rt.wait(&c.id()).await.unwrap();
    assert_eq!(st.code, 3);
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "42 /tmp");
    rt.remove(&c.id()).await.unwrap();
    assert!(rt.list().is_empty());
}

#[tokio::test]
async fn kill_all_kills_grandchildren_that_ignore_term() {
    let d = tempfile::tempdir().unwrap();
    let rt = runtime(d.path());
    let pids = d.path().join("pids");
    // A main process that ignores TERM and leaves two grandchildren in new sessions... of
    // its own making (setsid), which a process-group kill alone would miss.
    let script = format!(
        "trap '' TERM; setsid sleep 1000 & echo $! >> {p}; sleep 1000 & echo $! >> {p}; wait",
        p = pids.display()
    );
    let c = cfg("u2", &["/bin/sh", "-c", &script]);
    rt.start(&c).await.unwrap();
    eventually_async("two grandchildren", PROCESS_WAIT, || async {
        std::fs::read_to_string(&pids)
            .is_ok_and(|s| s.lines().count() == 2)
            .then_some(())
    })
    .await;
    let kids: Vec<i32> = std::fs::read_to_string(&pids)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    rt.signal(&c.id(), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        rt.exit_status(&c.id()).unwrap().is_none(),
        "TERM is ignored"
    );
    rt.kill_all(&c.id()).await.unwrap();
    assert!(!rt.any_alive(&c.id()));
    for k in kids {
        eventually_async("grandchild reaped", PROCESS_WAIT, || async {
            (!pid_alive(k)).then_some(())
        })
        .await;
    }
    let st = rt.wait(&c.id()).await.unwrap();
    assert_eq!(st.code, 137);
    rt.remove(&c.id()).await.unwrap();
}

#[tokio::test]
async fn missing_command_is_a_start_error() {
    let d = tempfile::tempdir().unwrap();
    let rt = runtime(d.path());
    let c = cfg("u3", &["/nonexistent/binary"]);
    match rt.start(&c).await {
        Err(RuntimeError::StartFailed { message, .. }) => {
            assert!(message.contains("/nonexistent/binary"), "{message}")
        }
        other => panic!("expected StartFailed, got {other:?}"),
    }
    rt.remove(&c.id()).await.unwrap();
    assert!(rt.list().is_empty());
}

#[tokio::test]
async fn exec_runs_in_the_container_context_with_timeout() {
    let d = tempfile::tempdir().unwrap();
    let rt = runtime(d.path());
    let c = cfg("u4", &["/bin/sleep", "1000"]);
    rt.start(&c).await.unwrap();
    let code = rt
        .exec(
            &c.id(),
            &[
                "/bin/sh".into(),
                "-c".into(),
                "test \"$X\" = 42 && exit 7".into(),
            ],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(code, 7);
    let r = rt
        .exec(
            &c.id(),
            &["/bin/sleep".into(), "100".into()],
            Duration::from_millis(300),
        )
        .await;
    assert!(matches!(r, Err(RuntimeError::ExecTimeout { .. })), "{r:?}");
    rt.remove(&c.id()).await.unwrap();
    assert!(!rt.any_alive(&c.id()));
}

#[tokio::test]
async fn a_new_runtime_adopts_running_containers() {
    let d = tempfile::tempdir().unwrap();
    let c = cfg("u5", &["/bin/sh", "-c", "sleep 0.5; exit 4"]);
    {
        let rt = runtime(d.path());
        rt.start(&c).await.unwrap();
    }
    let rt2 = runtime(d.path());
    assert_eq!(rt2.list().len(), 1);
    let st = rt2.wait(&c.id()).await.unwrap();
    assert_eq!(st.code, 4, "exit code survives via the shim");
    rt2.remove(&c.id()).await.unwrap();
}
