//! Pod configuration on a real machine: environment from ConfigMaps and Secrets (keys and
//! `envFrom`), probes on named ports and over HTTPS, and bad input (a missing key, a probe
//! naming an unknown port, an unwritable hostPath) that must leave a clear reason and an
//! Event, never start the container, and never disturb the other pods. Volumes are mounted
//! at their `mountPath` (shared between containers, read-only when asked, private to the
//! containers' mount namespaces), and a mount that cannot be made keeps the container waiting.
//!
//! One lab (1 machine) is shared by the tests of this file; each test uses its own namespace.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use palisade_lab::Lab;
use serde_json::json;

const NODE: &str = "m0";
const PYTHON: &str = "/usr/bin/python3";

fn lab() -> &'static Lab {
    static LAB: OnceLock<Lab> = OnceLock::new();
    LAB.get_or_init(|| start_ready_lab(1))
}

/// The shared lab, a runtime, the admin client, and a fresh namespace `ns` with a scratch
/// directory of the same name.
fn setup(
    ns: &str,
) -> (
    &'static Lab,
    tokio::runtime::Runtime,
    Client,
    std::path::PathBuf,
) {
    let lab = lab();
    let rt = rt();
    let c = client(lab, &rt);
    namespace(&c, &rt, ns);
    let dir = scratch(lab, ns);
    (lab, rt, c, dir)
}

fn create_config_map(c: &Client, rt: &tokio::runtime::Runtime, ns: &str, v: serde_json::Value) {
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
    let obj: ConfigMap = serde_json::from_value(v).unwrap();
    rt.block_on(api.create(&PostParams::default(), &obj))
        .expect("create configmap");
}

fn create_secret(c: &Client, rt: &tokio::runtime::Runtime, ns: &str, v: serde_json::Value) {
    let api: Api<Secret> = Api::namespaced(c.clone(), ns);
    let obj: Secret = serde_json::from_value(v).unwrap();
    rt.block_on(api.create(&PostParams::default(), &obj))
        .expect("create secret");
}

/// Waits for an Event about `pod` with `reason` whose message contains `text`; returns it.
fn wait_event(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    pod: &str,
    reason: &str,
    text: &str,
) -> Event {
    let events: Api<Event> = Api::namespaced(c.clone(), ns);
    eventually(
        &format!("{reason} event for {pod} containing {text:?}"),
        Duration::from_secs(60),
        || {
            let l = rt.block_on(events.list(&ListParams::default())).ok()?;
            l.items.into_iter().find(|e| {
                e.involved_object.name.as_deref() == Some(pod)
                    && e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().is_some_and(|m| m.contains(text))
            })
        },
    )
}

/// Waits until container `main` of `pod` is Waiting with `reason` and a message containing
/// `text`; returns the message.
fn wait_waiting(
    c: &Client,
    rt: &tokio::runtime::Runtime,
    ns: &str,
    pod: &str,
    reason: &str,
    text: &str,
) -> String {
    eventually(
        &format!("{pod} waiting with {reason}"),
        Duration::from_secs(60),
        || {
            let p = get_pod(c, rt, ns, pod)?;
            let w = container(&p, "main")?.state?.waiting?;
            let m = w.message.unwrap_or_default();
            (w.reason.as_deref() == Some(reason) && m.contains(text)).then_some(m)
        },
    )
}

fn wait_ready(c: &Client, rt: &tokio::runtime::Runtime, ns: &str, pod: &str) {
    eventually(&format!("{pod} Ready"), Duration::from_secs(90), || {
        let p = get_pod(c, rt, ns, pod)?;
        (condition(&p, "Ready").as_deref() == Some("True")).then_some(())
    });
}

fn pod(name: &str, script: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut main = json!({"name": "main", "image": "host", "command": ["/bin/sh", "-c", script]});
    if let (Some(m), Some(e)) = (main.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            m.insert(k.clone(), v.clone());
        }
    }
    json!({
        "metadata": {"name": name},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1, "containers": [main]}
    })
}

#[test]
fn config_map_and_secret_env_reach_the_process_and_a_missing_key_blocks_the_start() {
    let ns = "envsrc";
    let (_lab, rt, c, dir) = setup(ns);
    create_config_map(
        &c,
        &rt,
        ns,
        json!({"metadata": {"name": "cfg"}, "data": {"mode": "fast", "LEVEL": "3"}}),
    );
    create_secret(
        &c,
        &rt,
        ns,
        json!({"metadata": {"name": "creds"}, "stringData": {"password": "s3cret", "user": "app", "1st": "x"}}),
    );
    let out = dir.join("env.txt");
    let script = format!(
        "printf 'MODE=%s\\nPW=%s\\nOPT=%s\\nCFG_LEVEL=%s\\nuser=%s\\nCOMBINED=%s\\n' \"$MODE\" \"$PW\" \"${{OPT-unset}}\" \"$CFG_LEVEL\" \"$user\" \"$COMBINED\" > {out}.tmp && mv {out}.tmp {out}; exec sleep 100000",
        out = out.display()
    );
    create_pod(
        &c,
        &rt,
        ns,
        pod(
            "envok",
            &script,
            json!({
                "envFrom": [
                    {"configMapRef": {"name": "cfg"}, "prefix": "CFG_"},
                    {"secretRef": {"name": "creds"}},
                    {"secretRef": {"name": "absent", "optional": true}},
                ],
                "env": [
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
                    {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                    {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": true}}},
                    {"name": "COMBINED", "value": "$(MODE)/$(CFG_LEVEL)"},
                ],
            }),
        ),
    );
    let text = eventually("env written", Duration::from_secs(60), || {
        std::fs::read_to_string(&out).ok()
    });
    assert_eq!(
        text,
        "MODE=fast\nPW=s3cret\nOPT=unset\nCFG_LEVEL=3\nuser=app\nCOMBINED=fast/3\n"
    );
    wait_event(
        &c,
        &rt,
        ns,
        "envok",
        "InvalidEnvironmentVariableNames",
        "1st (from secret envsrc/creds)",
    );

    // A required key that does not exist: the container does not start.
    let marker = dir.join("missing-started");
    create_pod(
        &c,
        &rt,
        ns,
        pod(
            "envmissing",
            &format!("touch {}; exec sleep 100000", marker.display()),
            json!({"env": [
                {"name": "LATER", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "later"}}},
            ]}),
        ),
    );
    let msg = wait_waiting(
        &c,
        &rt,
        ns,
        "envmissing",
        "CreateContainerConfigError",
        "couldn't find key later in ConfigMap envsrc/cfg",
    );
    wait_event(&c, &rt, ns, "envmissing", "Failed", &msg);
    assert!(!marker.exists(), "the container must not have started");
    // A missing Secret is reported the same way.
    create_pod(
        &c,
        &rt,
        ns,
        pod(
            "secretmissing",
            "exec sleep 100000",
            json!({"env": [
                {"name": "X", "valueFrom": {"secretKeyRef": {"name": "nosuch", "key": "k"}}},
            ]}),
        ),
    );
    wait_waiting(
        &c,
        &rt,
        ns,
        "secretmissing",
        "CreateContainerConfigError",
        "secret \"nosuch\" not found",
    );

    // Once the key exists, the agent's retry starts the container.
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
    rt.block_on(cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"later": "now"}})),
    ))
    .unwrap();
    eventually("envmissing started", Duration::from_secs(60), || {
        let p = get_pod(&c, &rt, ns, "envmissing")?;
        container(&p, "main")?.state?.running?;
        marker.exists().then_some(())
    });
}

#[test]
fn named_ports_and_https_probes_make_pods_ready() {
    let ns = "probes";
    let (_lab, rt, c, dir) = setup(ns);
    // Plain HTTP on a named port: startup over tcpSocket, readiness over httpGet, both named.
    create_pod(
        &c,
        &rt,
        ns,
        pod(
            "named",
            &format!("exec {PYTHON} -m http.server 8080"),
            json!({
                "workingDir": dir.display().to_string(),
                "ports": [{"name": "web", "containerPort": 8080}],
                "startupProbe": {"tcpSocket": {"port": "web"}, "periodSeconds": 1, "failureThreshold": 30},
                "readinessProbe": {"httpGet": {"port": "web", "path": "/"}, "periodSeconds": 1},
            }),
        ),
    );
    // HTTPS with a self-signed certificate, on a named port.
    let https = format!(
        r#"cd {dir} && openssl req -x509 -newkey rsa:2048 -nodes -keyout k.pem -out c.pem -days 1 -subj /CN=probe-test 2>/dev/null && exec {PYTHON} -c '
import http.server, ssl
s = http.server.HTTPServer(("0.0.0.0", 8443), http.server.SimpleHTTPRequestHandler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("c.pem", "k.pem")
s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()'"#,
        dir = dir.display()
    );
    create_pod(
        &c,
        &rt,
        ns,
        pod(
            "https",
            &https,
            json!({
                "ports": [{"name": "tls", "containerPort": 8443}],
                "readinessProbe": {"httpGet": {"scheme": "HTTPS", "port": "tls", "path": "/"}, "periodSeconds": 1},
            }),
        ),
    );
    wait_ready(&c, &rt, ns, "named");
    wait_ready(&c, &rt, ns, "https");
    for name in ["named", "https"] {
        let p = get_pod(&c, &rt, ns, name).unwrap();
        assert_eq!(container(&p, "main").unwrap().restart_count, 0, "{name}");
    }
}

#[test]
fn a_probe_on_an_unknown_named_port_is_reported_and_the_agent_keeps_serving() {
    let ns = "badprobe";
    let (_lab, rt, c, _dir) = setup(ns);
    create_pod(
        &c,
        &rt,
        ns,
        pod(
            "badport",
            "exec sleep 100000",
            json!({
                "ports": [{"name": "web", "containerPort": 8081}],
                "readinessProbe": {"httpGet": {"port": "nope"}, "periodSeconds": 1},
            }),
        ),
    );
    let ev = wait_event(
        &c,
        &rt,
        ns,
        "badport",
        "Unhealthy",
        "Readiness probe errored: couldn't find port \"nope\"",
    );
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    // The Event and the status are separate writes: the status may land after the Event. It
    // must show the pod not Ready while its container runs.
    eventually(
        "badport running and not Ready",
        Duration::from_secs(60),
        || {
            let p = get_pod(&c, &rt, ns, "badport")?;
            let running = container(&p, "main")?.state?.running.is_some();
            (running && condition(&p, "Ready").as_deref() == Some("False")).then_some(())
        },
    );
    // The agent is alive and serves other pods.
    create_pod(&c, &rt, ns, pod("good", "exec sleep 100000", json!({})));
    wait_ready(&c, &rt, ns, "good");
}

#[test]
fn an_unwritable_host_path_blocks_the_container_with_failed_mount() {
    let ns = "badvol";
    let (_lab, rt, c, dir) = setup(ns);
    // A directory cannot be created below a regular file, not even by root.
    let file = dir.join("a-file");
    std::fs::write(&file, b"").unwrap();
    let target = file.join("sub");
    let marker = dir.join("started");
    let mut spec = pod(
        "badvol",
        &format!("touch {}; exec sleep 100000", marker.display()),
        json!({}),
    );
    spec["spec"]["volumes"] = json!([{"name": "data", "hostPath": {"path": target.display().to_string(), "type": "DirectoryOrCreate"}}]);
    create_pod(&c, &rt, ns, spec);
    let msg = wait_waiting(
        &c,
        &rt,
        ns,
        "badvol",
        "ContainerCreating",
        "MountVolume.SetUp failed",
    );
    assert!(msg.contains("volume data"), "{msg}");
    assert!(msg.contains(&target.display().to_string()), "{msg}");
    wait_event(&c, &rt, ns, "badvol", "FailedMount", "volume data");
    let p = get_pod(&c, &rt, ns, "badvol").unwrap();
    assert_eq!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert!(!marker.exists(), "the container must not have started");
    create_pod(&c, &rt, ns, pod("good", "exec sleep 100000", json!({})));
    wait_ready(&c, &rt, ns, "good");
}

/// Builds a store image `palisade-test/sh:1` on machine `m0`: a root filesystem with only
/// `/bin/sh`, `/bin/sleep` and their shared libraries (from `ldd`), plus a symbolic link
/// `/escape` pointing out of the root filesystem. Returns the image name.
fn sh_image(lab: &Lab) -> &'static str {
    let rootfs = lab.machines()[0]
        .dir()
        .join("images/palisade-test_sh_1/rootfs");
    for bin in ["/bin/sh", "/bin/sleep"] {
        let out = std::process::Command::new("ldd").arg(bin).output().unwrap();
        let libs: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let p = l.split_once("=> ").map_or(l, |(_, r)| r);
                let p = p.split(" (").next()?.trim();
                p.starts_with('/').then(|| p.to_string())
            })
            .collect();
        for f in libs.iter().map(String::as_str).chain([bin]) {
            let dst = rootfs.join(f.trim_start_matches('/'));
            std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
            std::fs::copy(f, &dst).unwrap_or_else(|e| panic!("copy {f}: {e}"));
        }
    }
    let escape = rootfs.join("escape");
    if !escape.exists() {
        std::os::unix::fs::symlink(lab.dir(), escape).unwrap();
    }
    "palisade-test/sh:1"
}

/// The mount points of the agent's mount namespace (from its mountinfo).
fn agent_mounts(lab: &Lab) -> String {
    let pid = agent_pid(lab, 0).expect("agent runs");
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap()
}

#[test]
fn volumes_are_mounted_at_their_mount_path_shared_between_containers_and_read_only_enforced() {
    let ns = "mounts";
    let (lab, rt, c, dir) = setup(ns);
    let image = sh_image(lab);
    create_config_map(
        &c,
        &rt,
        ns,
        json!({"metadata": {"name": "app"}, "data": {"greeting": "hello"}}),
    );
    let out = dir.display().to_string();
    let writer = r#"read -r g < /etc/app/config/greeting
echo "writer:$g" > /data/msg
echo "$PALISADE_VOLUME_DATA" > /out/writer-env
exec sleep 1000"#;
    let reader = r#"while [ ! -s /shared/msg ]; do sleep 0.1; done
read -r m < /shared/msg
echo "$m" > /out/reader-saw
if (echo x > /ro/try) 2>/dev/null; then echo writable > /out/ro; else echo denied > /out/ro; fi
exec sleep 1000"#;
    create_pod(
        &c,
        &rt,
        ns,
        json!({
            "metadata": {"name": "shared"},
            "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 1,
                "volumes": [
                    {"name": "data", "emptyDir": {}},
                    {"name": "cfg", "configMap": {"name": "app"}},
                    {"name": "out", "hostPath": {"path": out, "type": "Directory"}}
                ],
                "containers": [
                    {"name": "writer", "image": image, "command": ["/bin/sh", "-c", writer],
                     "readinessProbe": {"exec": {"command": ["/bin/sh", "-c", "[ -s /data/msg ]"]},
                                        "periodSeconds": 1},
                     "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": "cfg", "mountPath": "/etc/app/config", "readOnly": true},
                        {"name": "out", "mountPath": "/out"}
                     ]},
                    {"name": "reader", "image": image, "command": ["/bin/sh", "-c", reader],
                     "volumeMounts": [
                        {"name": "data", "mountPath": "/shared"},
                        {"name": "data", "mountPath": "/ro", "readOnly": true},
                        {"name": "out", "mountPath": "/out"}
                     ]}
                ]
            }
        }),
    );
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    // The reader saw, through its own mount, what the writer wrote with the ConfigMap's key.
    let saw = eventually(
        "reader saw the writer's file",
        Duration::from_secs(60),
        || read("reader-saw"),
    );
    assert_eq!(saw, "writer:hello");
    let ro = eventually("read-only result", Duration::from_secs(30), || read("ro"));
    assert_eq!(ro, "denied", "a readOnly mount must refuse writes");
    // The variable still names the volume's host directory, which holds what was written.
    let host_dir = eventually("writer env", Duration::from_secs(30), || read("writer-env"));
    assert_eq!(
        std::fs::read_to_string(std::path::Path::new(&host_dir).join("msg")).unwrap(),
        "writer:hello\n"
    );
    assert!(!std::path::Path::new(&host_dir).join("try").exists());
    // Exec probes run with the same mounts: the writer turns Ready on its own file.
    eventually("writer Ready", Duration::from_secs(60), || {
        let p = get_pod(&c, &rt, ns, "shared")?;
        container(&p, "writer")?.ready.then_some(())
    });
    // The mounts live in the containers' namespaces only, not in the agent's.
    let mounts = agent_mounts(lab);
    assert!(
        !mounts.contains("palisade-test_sh_1") && !mounts.contains(&host_dir),
        "container mounts leaked into the agent's namespace:\n{mounts}"
    );

    // The host image: a missing mount point is created, and the mount stays private.
    let mnt = dir.join("mnt/data");
    let script = format!(
        "echo in > {m}/f && [ -e \"$PALISADE_VOLUME_DATA/f\" ] && echo ok > {out}/host-result; exec sleep 1000",
        m = mnt.display()
    );
    let mut p = pod(
        "hostimage",
        &script,
        json!({"volumeMounts": [{"name": "data", "mountPath": mnt.display().to_string()}]}),
    );
    p["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    create_pod(&c, &rt, ns, p);
    let r = eventually(
        "host image wrote through its mount",
        Duration::from_secs(60),
        || read("host-result"),
    );
    assert_eq!(r, "ok");
    assert!(mnt.is_dir(), "the mount point was created on the host");
    assert!(
        !mnt.join("f").exists(),
        "the host sees the empty mount point, not the volume"
    );

    // The host image may not mount over a system directory: Waiting, an Event, no start.
    let mut p = pod(
        "overusr",
        &format!("echo started > {out}/overusr; exec sleep 1000"),
        json!({"volumeMounts": [{"name": "data", "mountPath": "/usr"}]}),
    );
    p["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    create_pod(&c, &rt, ns, p);
    let m = wait_waiting(&c, &rt, ns, "overusr", "CreateContainerError", "/usr");
    assert!(m.contains("system directory"), "{m}");
    wait_event(&c, &rt, ns, "overusr", "Failed", "system directory /usr");

    // A mount point escaping the image's root through a symlink fails in the shim: the
    // container waits with the reason and never runs.
    create_pod(
        &c,
        &rt,
        ns,
        json!({
            "metadata": {"name": "escape"},
            "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [{"name": "main", "image": image,
                    "command": ["/bin/sh", "-c", "exec sleep 1000"],
                    "volumeMounts": [{"name": "data", "mountPath": "/escape/x"}]}]
            }
        }),
    );
    let m = wait_waiting(&c, &rt, ns, "escape", "CreateContainerError", "/escape/x");
    assert!(m.contains("outside the container's root"), "{m}");
    wait_event(
        &c,
        &rt,
        ns,
        "escape",
        "Failed",
        "outside the container's root",
    );
    assert!(
        !lab.dir().join("x").exists(),
        "nothing created outside the root"
    );
    let p = get_pod(&c, &rt, ns, "escape").unwrap();
    assert_eq!(container(&p, "main").unwrap().restart_count, 0);
    assert!(
        !dir.join("overusr").exists(),
        "the refused container never ran"
    );
    // The agent is still serving: the first pod's containers still run.
    let p = get_pod(&c, &rt, ns, "shared").unwrap();
    assert!(container(&p, "reader")
        .unwrap()
        .state
        .unwrap()
        .running
        .is_some());
}

/// The kubelet's `kube-api-access` volume, by hand: a projected volume with a ServiceAccount
/// token (TokenRequest, bound to the pod), the cluster CA from `kube-root-ca.crt` and the
/// namespace from the downward API, at the in-cluster client's path. The container calls the
/// API with them at `KUBERNETES_SERVICE_HOST:PORT` as its ServiceAccount, which may only read
/// pods in its namespace.
#[test]
fn a_projected_token_lets_the_container_call_the_api_as_its_service_account() {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let ns = "sa-token";
    let (_lab, rt, c, dir) = setup(ns);
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    }))
    .unwrap();
    rt.block_on(Api::<Role>::namespaced(c.clone(), ns).create(&PostParams::default(), &role))
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "pod-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}]
    }))
    .unwrap();
    rt.block_on(
        Api::<RoleBinding>::namespaced(c.clone(), ns).create(&PostParams::default(), &binding),
    )
    .unwrap();
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    let out = dir.join("pod.json");
    let script = format!(
        "set -e; curl -sS --fail --cacert {sa}/ca.crt -H \"Authorization: Bearer $(cat {sa}/token)\" \
         \"https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/$(cat {sa}/namespace)/pods/$HOSTNAME\" \
         > {out}.tmp; mv {out}.tmp {out}; \
         curl -sS -o /dev/null -w '%{{http_code}}' --cacert {sa}/ca.crt -H \"Authorization: Bearer $(cat {sa}/token)\" \
         \"https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/$(cat {sa}/namespace)/secrets\" \
         > {codes}.tmp; mv {codes}.tmp {codes}; exec sleep 100000",
        out = out.display(),
        codes = dir.join("secrets.code").display()
    );
    let mut spec = pod(
        "caller",
        &script,
        json!({"volumeMounts": [{"name": "kube-api-access", "mountPath": sa, "readOnly": true}]}),
    );
    spec["spec"]["automountServiceAccountToken"] = json!(false);
    spec["spec"]["volumes"] = json!([{"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
    ]}}]);
    create_pod(&c, &rt, ns, spec);
    let answer = eventually(
        "the container's API answer",
        Duration::from_secs(90),
        || {
            let raw = std::fs::read(&out).ok()?;
            serde_json::from_slice::<serde_json::Value>(&raw).ok()
        },
    );
    let uid = get_pod(&c, &rt, ns, "caller")
        .and_then(|p| p.metadata.uid)
        .unwrap();
    assert_eq!(
        answer["metadata"]["uid"],
        json!(uid),
        "the API answered about the pod itself"
    );
    // The same token may not list Secrets: it is the ServiceAccount's, not the agent's.
    let code = eventually("the Secrets answer", Duration::from_secs(30), || {
        std::fs::read_to_string(dir.join("secrets.code")).ok()
    });
    assert_eq!(code, "403");
}

/// A volume type the agent cannot provide keeps the pod waiting with `FailedMount`: started
/// without it, the container would write to its own root filesystem instead of the volume.
#[test]
fn a_volume_type_the_agent_does_not_support_keeps_the_container_waiting() {
    let ns = "nfsvol";
    let (_lab, rt, c, dir) = setup(ns);
    let marker = dir.join("started");
    let mut spec = pod(
        "nfs",
        &format!("touch {}; exec sleep 100000", marker.display()),
        json!({"volumeMounts": [{"name": "share", "mountPath": "/share"}]}),
    );
    spec["spec"]["volumes"] =
        json!([{"name": "share", "nfs": {"server": "192.0.2.1", "path": "/exports"}}]);
    create_pod(&c, &rt, ns, spec);
    let msg = wait_waiting(&c, &rt, ns, "nfs", "ContainerCreating", "not supported");
    assert!(msg.contains("volume share"), "{msg}");
    wait_event(&c, &rt, ns, "nfs", "FailedMount", "not supported");
    assert!(!marker.exists(), "the container must not have started");
}
