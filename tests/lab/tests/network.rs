//! Partitions, teardown and labs side by side.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::*;
use palisade_lab::{netns, Cut, Lab, LabConfig};
use palisade_test_support::eventually;

/// Serves "pong" once per connection on `addr` inside `ns`, from a thread of this process.
fn pong_server(ns: &str, addr: SocketAddr) {
    let listener = netns::bind_tcp_in(ns, addr).expect("bind inside the machine");
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let _ = s.write_all(b"pong");
        }
    });
}

fn reaches(from_ns: &str, to: SocketAddr) -> bool {
    let Ok(mut s) = netns::connect_tcp_in(from_ns, to) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).is_ok() && &buf == b"pong"
}

/// `curl` from inside a machine to the API server through the hub, verifying TLS.
fn api_reachable(lab: &Lab, machine: usize) -> bool {
    let cp = lab.control_plane().unwrap();
    let m = &lab.machines()[machine];
    Command::new("ip")
        .args([
            "netns",
            "exec",
            m.netns(),
            "curl",
            "-sf",
            "--max-time",
            "2",
            "--cacert",
        ])
        .arg(cp.ca_cert_pem())
        .arg(format!("{}/readyz", cp.in_lab_api_url()))
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout) == "ok")
        .unwrap_or(false)
}

#[test]
fn partitions_cut_traffic_both_ways_heal_restores_it_and_processes_keep_running() {
    let lab = Lab::start(LabConfig {
        machines: 2,
        pdu: false,
        machine_command: "exec sleep infinity".into(),
        ..Default::default()
    })
    .expect("lab starts");
    let (m0, m1) = (&lab.machines()[0], &lab.machines()[1]);
    let to_m0: SocketAddr = (m0.address(), 7000).into();
    let to_m1: SocketAddr = (m1.address(), 7000).into();
    pong_server(m0.netns(), to_m0);
    pong_server(m1.netns(), to_m1);
    assert!(reaches(m0.netns(), to_m1) && reaches(m1.netns(), to_m0));
    assert!(
        api_reachable(&lab, 0),
        "machines reach the API server through the hub"
    );
    let procs = m0.processes();
    assert!(!procs.is_empty());

    // Machine from everything.
    lab.partition(0, Cut::All).unwrap();
    assert!(!reaches(m0.netns(), to_m1), "m0 -> m1 must be cut");
    assert!(!reaches(m1.netns(), to_m0), "m1 -> m0 must be cut");
    assert!(!api_reachable(&lab, 0));
    assert!(
        api_reachable(&lab, 1),
        "the other machine still reaches the API"
    );
    assert_eq!(
        m0.processes(),
        procs,
        "a partition never touches the machine's processes"
    );
    lab.heal(0).unwrap();
    eventually("m0 reaches m1 after heal", Duration::from_secs(10), || {
        reaches(m0.netns(), to_m1).then_some(())
    });
    assert!(reaches(m1.netns(), to_m0));
    eventually(
        "m0 reaches the API after heal",
        Duration::from_secs(10),
        || api_reachable(&lab, 0).then_some(()),
    );

    // Machine from the control plane only.
    lab.partition(0, Cut::ControlPlane).unwrap();
    assert!(!api_reachable(&lab, 0));
    assert!(
        reaches(m0.netns(), to_m1) && reaches(m1.netns(), to_m0),
        "node-to-node traffic flows"
    );
    assert_eq!(m0.processes(), procs);
    lab.heal(0).unwrap();
    eventually("API after heal", Duration::from_secs(10), || {
        api_reachable(&lab, 0).then_some(())
    });
}

#[test]
fn a_peer_cut_separates_machines_only_and_heals_without_undoing_another() {
    let lab = Lab::start(LabConfig {
        machines: 3,
        pdu: false,
        machine_command: "exec sleep infinity".into(),
        ..Default::default()
    })
    .expect("lab starts");
    let ms = lab.machines();
    let to: Vec<SocketAddr> = ms.iter().map(|m| (m.address(), 7000).into()).collect();
    for (m, addr) in ms.iter().zip(&to) {
        pong_server(m.netns(), *addr);
    }
    // A service in the hub, where the storage's data path lives.
    let hub: SocketAddr = (netns::HUB_ADDR, 7001).into();
    pong_server(lab.hub_netns(), hub);
    let link = |a: usize, b: usize| reaches(ms[a].netns(), to[b]) && reaches(ms[b].netns(), to[a]);
    let cut_both_ways =
        |a: usize, b: usize| !reaches(ms[a].netns(), to[b]) && !reaches(ms[b].netns(), to[a]);
    assert!(link(0, 1) && link(0, 2) && link(1, 2));

    // m0 from its peers: both directions to each peer; the hub and the API still answer.
    lab.partition(0, Cut::Peers).unwrap();
    assert!(cut_both_ways(0, 1) && cut_both_ways(0, 2));
    assert!(link(1, 2), "the other machines still reach each other");
    assert!(
        reaches(ms[0].netns(), hub),
        "m0 still reaches the hub (storage)"
    );
    assert!(api_reachable(&lab, 0), "m0 still reaches the API server");

    // Also from the control plane: only the hub's other services are left.
    lab.partition(0, Cut::ControlPlane).unwrap();
    assert!(!api_reachable(&lab, 0));
    assert!(reaches(ms[0].netns(), hub));
    assert!(cut_both_ways(0, 1));

    // m1 from its peers too; healing m0 must not reopen m1's cut.
    lab.partition(1, Cut::Peers).unwrap();
    lab.heal(0).unwrap();
    eventually("m0 reaches m2 after heal", Duration::from_secs(10), || {
        link(0, 2).then_some(())
    });
    assert!(cut_both_ways(0, 1), "m1's peer cut still holds m0 -> m1");
    assert!(cut_both_ways(1, 2), "m1's peer cut still holds m1 -> m2");
    eventually(
        "m0 reaches the API after heal",
        Duration::from_secs(10),
        || api_reachable(&lab, 0).then_some(()),
    );
    lab.heal(1).unwrap();
    eventually(
        "every link after the last heal",
        Duration::from_secs(10),
        || (link(0, 1) && link(0, 2) && link(1, 2)).then_some(()),
    );
    // Healing a machine that was never cut from its peers changes nothing.
    lab.heal(2).unwrap();
    assert!(link(0, 1) && link(1, 2));
}

fn netns_with_prefix(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn two_labs_run_side_by_side_and_teardown_leaves_nothing_behind() {
    let cfg = LabConfig {
        machines: 1,
        control_plane: false,
        machine_command: "sh -c 'sleep infinity & wait' & exec sleep infinity".into(),
        ..Default::default()
    };
    let mut a = Lab::start(cfg.clone()).expect("lab a");
    let b = Lab::start(cfg).expect("lab b");
    assert_ne!(a.machines()[0].bmc().port, b.machines()[0].bmc().port);
    // Both labs' machines sit at the same address, each in its own namespaces.
    assert_eq!(a.machines()[0].address(), b.machines()[0].address());
    assert!(a.machines()[0].is_powered() && b.machines()[0].is_powered());

    let (a_id, a_dir) = (a.id().to_string(), a.dir().to_path_buf());
    let a_bmc_port = a.machines()[0].bmc().port;
    a.stop();
    assert!(
        palisade_lab::process::pids_with_env(palisade_lab::process::LAB_ENV, &a_id).is_empty(),
        "no process of lab a is left"
    );
    assert!(
        netns_with_prefix(&format!("pl{a_id}-")).is_empty(),
        "no namespace of lab a is left"
    );
    assert!(!a_dir.exists(), "lab a's directory is removed");
    assert!(
        std::net::UdpSocket::bind(("127.0.0.1", a_bmc_port)).is_ok(),
        "lab a's BMC port is free again"
    );
    assert!(b.machines()[0].is_powered(), "lab b is untouched");
    assert!(ipmitool(&b, 0, &["chassis", "power", "status"])
        .status
        .success());
}

#[test]
fn a_lab_whose_owner_is_killed_is_reaped() {
    let bin = palisade_lab::bin_path("palisade-lab").expect("build the palisade-lab binary first");
    let mut child = Command::new(bin)
        .args(["up", "--no-control-plane", "--machines", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 256];
    while !text.contains("lab is up") {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "palisade-lab up exited early: {text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let id = text.split_whitespace().nth(1).expect("lab id").to_string();
    assert!(!palisade_lab::process::pids_with_env(palisade_lab::process::LAB_ENV, &id).is_empty());
    child.kill().unwrap(); // SIGKILL: no chance to tear down by itself
    child.wait().unwrap();
    eventually("the reaper cleans up", Duration::from_secs(20), || {
        (palisade_lab::process::pids_with_env(palisade_lab::process::LAB_ENV, &id).is_empty()
            && netns_with_prefix(&format!("pl{id}-")).is_empty())
        .then_some(())
    });
}
