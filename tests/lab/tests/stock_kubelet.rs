//! A stock machine: the real kubelet 1.34 with containerd and runc, in the lab.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use palisade_lab::stock::{self, StockLab, BUSYBOX_IMAGE};
use palisade_lab::LabConfig;
use palisade_node::cri::{inventory::inventory, CriClient};
use palisade_test_support::eventually;

/// The PIDs of host processes whose command line is exactly `cmdline` (arguments joined by
/// spaces): the ground truth about a container's process, whatever the runtime says.
fn pids_running(cmdline: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let words: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|w| !w.is_empty())
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        if words.join(" ") == cmdline {
            out.push(pid);
        }
    }
    out
}

/// Runs `f` to completion on `rt`, for at most 10 s (every call to the API server or the CRI).
fn within<T>(rt: &tokio::runtime::Runtime, what: &str, f: impl Future<Output = T>) -> T {
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), f).await })
        .unwrap_or_else(|_| panic!("{what} took more than 10 s"))
}

/// The cgroup directories on the host named by `ids` (runc makes one per container, in every
/// hierarchy).
fn cgroups_named(ids: &[String]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = e.path();
            if ids.iter().any(|id| e.file_name() == id.as_str()) {
                found.push(path);
            } else if depth < 6 && e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((path, depth + 1));
            }
        }
    }
    found
}

/// The pod network namespaces containerd pinned on the host (`/run/netns/cni-*`).
fn pinned_pod_netns() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cni-"))
        .collect()
}

/// A pod pinned to `node` running `/bin/busybox sleep <marker>`, on the host's network or the
/// pod network.
fn sleeper(name: &str, node: &str, image: &str, host_network: bool, marker: u32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "hostNetwork": host_network,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": image,
                "command": ["/bin/busybox", "sleep", marker.to_string()],
            }],
        },
    }))
    .unwrap()
}

/// The mount points on the host under `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| Path::new(m).starts_with(dir))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_stock_kubelet_registers_its_node_and_runs_pinned_pods_that_containerd_lists_by_uid() {
    let netns_before = pinned_pod_netns();
    let lab = StockLab::start(LabConfig {
        machines: 1,
        pdu: false,
        ..Default::default()
    })
    .expect("a lab with one stock machine starts");
    let m = &lab.lab().machines()[0];
    let boot_to_ready = lab
        .wait_node_ready(0, Duration::from_secs(180))
        .expect("the stock machine's kubelet registers its node and reports it Ready");
    println!(
        "stock machine {}: boot-to-Ready {:.2} s",
        m.name(),
        boot_to_ready.as_secs_f64()
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = within(
        &rt,
        "an admin client",
        lab.lab().control_plane().unwrap().client(),
    )
    .expect("admin client");
    let pods: kube::Api<Pod> = kube::Api::namespaced(client, "default");
    // Markers no other process on the host carries: the containers' own command lines.
    let marker = 3000 + 2 * (std::process::id() % 500);
    let image = lab.image(BUSYBOX_IMAGE);
    let mut uids = BTreeMap::new();
    for (name, host_network, marker) in
        [("on-host", true, marker), ("on-pod-net", false, marker + 1)]
    {
        let pod = sleeper(name, m.name(), &image, host_network, marker);
        let created = within(
            &rt,
            "creating a pod",
            pods.create(&PostParams::default(), &pod),
        )
        .expect("pod created");
        uids.insert(created.metadata.uid.expect("a UID"), (name, marker));
    }

    let mut pids = Vec::new();
    for (name, marker) in uids.values() {
        let ip = eventually("the pod Running", Duration::from_secs(120), || {
            let p = within(&rt, "reading the pod", pods.get(name)).ok()?;
            let status = p.status?;
            (status.phase.as_deref() == Some("Running")).then_some(status.pod_ip)
        });
        println!("pod {name} Running at {ip:?}");
        if *name == "on-host" {
            assert_eq!(
                ip,
                Some(m.address().to_string()),
                "on the machine's address"
            );
        } else {
            let ip = ip.unwrap_or_default();
            assert!(
                ip.starts_with("10.244."),
                "on the machine's CNI bridge: {ip}"
            );
        }
        let cmdline = format!("/bin/busybox sleep {marker}");
        let found = pids_running(&cmdline);
        assert_eq!(found.len(), 1, "one `{cmdline}` process runs on the host");
        pids.extend(found);
    }

    // The companion's view: each pod's sandbox and container, listed by the pod's UID.
    let inv = within(&rt, "the CRI inventory", async {
        let cri = CriClient::connect(&stock::cri_endpoint(m), Duration::from_secs(5))
            .await
            .expect("the stock machine's containerd answers the CRI");
        assert!(
            cri.runtime().starts_with("containerd "),
            "{}",
            cri.runtime()
        );
        inventory(&cri).await.expect("an inventory")
    });
    assert_eq!(
        inv.live_pods(),
        uids.keys().cloned().collect(),
        "containerd runs these pods and nothing else: {inv:?}"
    );
    let mut ids = Vec::new();
    for (uid, (name, _)) in &uids {
        let listed = &inv.pods[uid];
        assert_eq!(listed.name, format!("default/{name}"));
        assert!(
            listed.containers.iter().any(|(_, live)| *live),
            "the pod's container is live in containerd: {listed:?}"
        );
        ids.extend(
            listed
                .sandboxes
                .iter()
                .chain(&listed.containers)
                .map(|(id, _)| id.clone()),
        );
    }
    for (what, comm) in [("kubelet", "kubelet"), ("containerd", "containerd")] {
        let rss: u64 = m
            .processes()
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
            })
            .filter_map(|p| palisade_lab::process::memory_kib(p, "VmRSS"))
            .sum();
        println!("stock machine {}: {what} RSS {} MiB", m.name(), rss / 1024);
    }

    // Teardown leaves nothing of the machine on the host: no container process, no cgroup
    // of a sandbox or container, no mount, no pinned pod network namespace.
    assert!(
        !cgroups_named(&ids).is_empty(),
        "runc made the pods' cgroups"
    );
    let dir = lab.lab().dir().to_path_buf();
    drop(lab);
    for pid in pids {
        assert!(
            !palisade_lab::process::alive(pid),
            "the container's process {pid} outlived the lab"
        );
    }
    assert_eq!(cgroups_named(&ids), Vec::<PathBuf>::new(), "cgroups left");
    assert_eq!(mounts_under(&dir), Vec::<String>::new(), "mounts left");
    assert_eq!(
        pinned_pod_netns(),
        netns_before,
        "pod network namespaces left"
    );
}
