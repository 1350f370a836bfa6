//! OCI images pulled from a real registry (the lab's `docker-registry`, TLS from the lab CA,
//! htpasswd basic auth): a pod with a registry image runs and reports the image's digest as
//! `imageID`; a missing tag is `ErrImagePull`, then `ImagePullBackOff`; wrong credentials are
//! refused; `Never` runs only an image already on the node; and a pull that failed while the
//! registry was down succeeds once it is back.
//!
//! One lab (1 machine and a registry) is shared by the tests of this file. They take turns
//! (one of them stops the registry); each uses its own namespace and repository.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Client};
use palisade_lab::{ImageFile, Lab, LabConfig, RegistryConfig};
use parking_lot::{Mutex, MutexGuard};
use serde_json::json;

const NODE: &str = "m0";
const USER: &str = "puller";

/// A random password for the lab's registry (never logged).
fn password() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| format!("pw-{:016x}", rand_u64()))
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish()
}

fn lab() -> &'static Lab {
    static LAB: OnceLock<Lab> = OnceLock::new();
    LAB.get_or_init(|| {
        let agents = palisade_scenario::AgentOptions {
            self_fence_seconds: SELF_FENCE_AFTER_S,
            max_restart_backoff_seconds: Some(MAX_BACKOFF_S),
            extra_args: vec!["--registry-ca".into(), "\"$PALISADE_REGISTRY_CA\"".into()],
            ..Default::default()
        };
        let lab = Lab::start(LabConfig {
            machines: 1,
            pdu: false,
            machine_command: palisade_scenario::node_agent_command(&agents).expect("agent command"),
            registry: Some(RegistryConfig {
                basic_auth: Some((USER.into(), password().into())),
            }),
            ..Default::default()
        })
        .expect("lab starts");
        let rt = rt();
        wait_nodes_ready(&lab, &client(&lab, &rt), &rt);
        lab
    })
}

/// The tests take turns: one of them stops the registry.
fn serial() -> MutexGuard<'static, ()> {
    static S: Mutex<()> = Mutex::new(());
    S.lock()
}

/// The host pid of the process whose command line ends in `sleep <arg>` (the images run
/// `/bin/busybox sleep <arg>`; each test gives its own argument).
fn pid_of_image_sleep(arg: &str) -> Option<i32> {
    let want = format!("\0sleep\0{arg}\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .ok()
            .filter(|c| c.ends_with(want.as_bytes()))
            .map(|_| pid)
    })
}

/// Pushes a busybox image whose entrypoint is `sleep <arg>`; returns its digest.
fn push(lab: &Lab, repo: &str, tag: &str, sleep_arg: &str) -> String {
    let busybox = ImageFile {
        path: "bin/busybox".into(),
        source: "/bin/busybox".into(),
        mode: 0o755,
    };
    lab.registry()
        .expect("registry")
        .push(repo, tag, &[busybox], &["/bin/busybox", "sleep", sleep_arg])
        .expect("push")
}

fn pull_secret(c: &Client, rt: &tokio::runtime::Runtime, ns: &str, name: &str, password: &str) {
    let host = lab().registry().expect("registry").host();
    let cfg = json!({"auths": {host: {"username": USER, "password": password}}});
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": cfg.to_string()},
    }))
    .unwrap();
    let api: Api<Secret> = Api::namespaced(c.clone(), ns);
    rt.block_on(api.create(&PostParams::default(), &secret))
        .expect("create secret");
}

fn image_pod(name: &str, image: &str, policy: &str, secret: Option<&str>) -> serde_json::Value {
    let mut p = json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": policy}]
        }
    });
    if let Some(s) = secret {
        p["spec"]["imagePullSecrets"] = json!([{"name": s}]);
    }
    p
}

fn setup(ns: &str) -> (&'static Lab, tokio::runtime::Runtime, Client, String) {
    let lab = lab();
    let rt = rt();
    let c = client(lab, &rt);
    namespace(&c, &rt, ns);
    pull_secret(&c, &rt, ns, "regcred", password());
    let host = lab.registry().expect("registry").host();
    (lab, rt, c, host)
}

/// Waits until container `main` of `pod` runs; returns its imageID.
fn wait_running(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    pod: &str,
    timeout: Duration,
) -> String {
    eventually(&format!("{ns}/{pod} running"), timeout, || {
        let st = container(&get_pod(c, rt, ns, pod)?, "main")?;
        st.state?.running?;
        Some(st.image_id)
    })
}

/// Polls the Waiting reason of `pod` until every reason in `want` was seen (in any order).
fn wait_reasons(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    pod: &str,
    want: &[&str],
) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut messages = Vec::new();
    eventually(
        &format!("{ns}/{pod} waiting with {want:?} (seen {seen:?})"),
        Duration::from_secs(90),
        || {
            if let Some(w) = get_pod(c, rt, ns, pod)
                .and_then(|p| container(&p, "main"))
                .and_then(|s| s.state?.waiting)
            {
                let r = w.reason.unwrap_or_default();
                if !seen.contains(&r) {
                    seen.push(r);
                    messages.push(w.message.unwrap_or_default());
                }
            }
            want.iter()
                .all(|w| seen.iter().any(|s| s == w))
                .then_some(())
        },
    );
    messages
}

#[test]
fn a_registry_image_runs_with_its_digest_as_image_id() {
    let _turn = serial();
    let (lab, rt, c, host) = setup("pull-ok");
    let digest = push(lab, "lab/sleeper", "v1", "100001");
    let image = format!("{host}/lab/sleeper:v1");
    create_pod(
        &c,
        &rt,
        "pull-ok",
        image_pod("p", &image, "IfNotPresent", Some("regcred")),
    );
    let id = wait_running(&c, &rt, "pull-ok", "p", Duration::from_secs(90));
    assert_eq!(id, format!("{host}/lab/sleeper@{digest}"));
    // The kubelet's Events: Pulling, then Pulled with the time it took; no failure.
    let pulling = event_messages(&c, &rt, "pull-ok", "p", "Pulling");
    assert_eq!(pulling, [format!("Pulling image \"{image}\"")]);
    let pulled = eventually("the Pulled Event", Duration::from_secs(30), || {
        let m = event_messages(&c, &rt, "pull-ok", "p", "Pulled");
        (!m.is_empty()).then_some(m)
    });
    assert!(
        pulled[0].starts_with(&format!("Successfully pulled image \"{image}\" in ")),
        "{pulled:?}"
    );
    let failed = event_messages(&c, &rt, "pull-ok", "p", "Failed");
    assert!(
        failed.is_empty(),
        "a pull under way is no failure: {failed:?}"
    );
    assert!(
        pid_of_image_sleep("100001").is_some(),
        "the image's entrypoint runs"
    );
}

#[test]
fn a_missing_tag_is_err_image_pull_then_image_pull_back_off() {
    let _turn = serial();
    let (_lab, rt, c, host) = setup("pull-missing");
    let image = format!("{host}/lab/sleeper:no-such-tag");
    create_pod(
        &c,
        &rt,
        "pull-missing",
        image_pod("p", &image, "IfNotPresent", Some("regcred")),
    );
    let msgs = wait_reasons(
        &c,
        &rt,
        "pull-missing",
        "p",
        &["ErrImagePull", "ImagePullBackOff"],
    );
    assert!(msgs.iter().any(|m| m.contains("not found")), "{msgs:?}");
    let failed = eventually("the Failed Events", Duration::from_secs(30), || {
        let m = event_messages(&c, &rt, "pull-missing", "p", "Failed");
        (m.iter().any(|m| m.starts_with("Error: ImagePullBackOff"))).then_some(m)
    });
    assert!(
        failed
            .iter()
            .any(|m| m.starts_with(&format!("Failed to pull image \"{image}\": "))),
        "{failed:?}"
    );
    assert_eq!(
        event_messages(&c, &rt, "pull-missing", "p", "BackOff")[..1],
        [format!("Back-off pulling image \"{image}\"")]
    );
}

#[test]
fn wrong_credentials_are_refused() {
    let _turn = serial();
    let (lab, rt, c, host) = setup("pull-creds");
    push(lab, "lab/private", "v1", "100002");
    pull_secret(&c, &rt, "pull-creds", "wrong", "not-the-password");
    let image = format!("{host}/lab/private:v1");
    create_pod(
        &c,
        &rt,
        "pull-creds",
        image_pod("wrong", &image, "IfNotPresent", Some("wrong")),
    );
    create_pod(
        &c,
        &rt,
        "pull-creds",
        image_pod("none", &image, "IfNotPresent", None),
    );
    for pod in ["wrong", "none"] {
        let msgs = wait_reasons(&c, &rt, "pull-creds", pod, &["ErrImagePull"]);
        assert!(
            msgs.iter().any(|m| m.contains("unauthorized")),
            "{pod}: {msgs:?}"
        );
    }
    assert!(pid_of_image_sleep("100002").is_none());
}

#[test]
fn never_runs_an_image_only_once_it_is_on_the_node() {
    let _turn = serial();
    let (lab, rt, c, host) = setup("pull-never");
    push(lab, "lab/never", "v1", "100003");
    let image = format!("{host}/lab/never:v1");
    create_pod(
        &c,
        &rt,
        "pull-never",
        image_pod("never1", &image, "Never", Some("regcred")),
    );
    let msgs = wait_reasons(&c, &rt, "pull-never", "never1", &["ErrImageNeverPull"]);
    assert!(msgs.iter().any(|m| m.contains("Never")), "{msgs:?}");
    // Another pod pulls it; then a Never pod runs it from the node's store.
    create_pod(
        &c,
        &rt,
        "pull-never",
        image_pod("puller", &image, "IfNotPresent", Some("regcred")),
    );
    wait_running(&c, &rt, "pull-never", "puller", Duration::from_secs(90));
    create_pod(
        &c,
        &rt,
        "pull-never",
        image_pod("never2", &image, "Never", None),
    );
    wait_running(&c, &rt, "pull-never", "never2", Duration::from_secs(30));
    let pulled = eventually("never2's Pulled Event", Duration::from_secs(30), || {
        let m = event_messages(&c, &rt, "pull-never", "never2", "Pulled");
        (!m.is_empty()).then_some(m)
    });
    assert_eq!(
        pulled,
        [format!(
            "Container image \"{image}\" already present on machine"
        )]
    );
    assert!(event_messages(&c, &rt, "pull-never", "never2", "Pulling").is_empty());
}

#[test]
fn a_pull_that_failed_while_the_registry_was_down_succeeds_once_it_is_back() {
    let _turn = serial();
    let (lab, rt, c, host) = setup("pull-down");
    push(lab, "lab/late", "v1", "100004");
    lab.registry().expect("registry").stop();
    let image = format!("{host}/lab/late:v1");
    create_pod(
        &c,
        &rt,
        "pull-down",
        image_pod("p", &image, "IfNotPresent", Some("regcred")),
    );
    wait_reasons(&c, &rt, "pull-down", "p", &["ErrImagePull"]);
    lab.registry()
        .expect("registry")
        .start_again()
        .expect("registry back");
    // Within the back-off (10 s, 20 s, …) after the registry returns.
    wait_running(&c, &rt, "pull-down", "p", Duration::from_secs(120));
}
