//! The bridge with the real executor (`palisade-fence`) against the lab's `ipmi_sim` BMCs and
//! SNMP PDU: fencing through levels, idempotency checked against the BMC, stale tokens.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{install_provider, write_private, Ca};
use palisade_bridge::config::{FileConfig, Inventory};
use palisade_bridge::executor::{PowerAction, PowerState};
use palisade_bridge::fence_executor::FenceExecutor;
use palisade_bridge::Bridge;
use palisade_fence::bridge::{BridgeClient, ClientSettings};
use palisade_fence::{Credentials, Device, DeviceOptions, PowerDevice, Secret};
use palisade_lab::{Lab, LabConfig, PduInfo};

struct Setup {
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    client: BridgeClient,
    audit: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// m0: IPMI level with the right password, then PDU. m1: IPMI with a wrong password, then PDU.
fn start_bridge(lab: &Lab) -> Setup {
    install_provider();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("lab-bridge-ca");
    let server = ca.server();
    write_private(&d.join("server.key"), &server.1);
    std::fs::write(d.join("server.crt"), &server.0).unwrap();
    std::fs::write(d.join("ca.crt"), ca.pem()).unwrap();
    let pdu = lab.pdu().expect("lab has a PDU").info();
    write_private(
        &d.join("community"),
        &PduInfo::secret(&pdu.community_rw_file).unwrap(),
    );
    write_private(&d.join("wrong"), "not-the-password");
    let mut cfg = String::from(
        "listen = \"127.0.0.1:0\"\nstate_dir = \"state\"\n[tls]\ncert = \"server.crt\"\nkey = \"server.key\"\nclient_ca = \"ca.crt\"\n\
         [[policy]]\nclient = \"cn:palisade-controller\"\ntargets = [\"*\"]\nread_audit = true\n",
    );
    for (i, m) in lab.machines().iter().enumerate() {
        let b = m.bmc();
        let pass = d.join(format!("{}-bmc", m.name()));
        write_private(&pass, &b.password().unwrap());
        let ipmi_pass = if i == 0 { pass } else { d.join("wrong") };
        let outlets: Vec<String> = m.outlets().iter().map(u32::to_string).collect();
        cfg.push_str(&format!(
            "[[targets]]\nid = \"{name}\"\n\
             [[targets.levels]]\nname = \"ipmi\"\n[[targets.levels.devices]]\nurl = \"ipmi://{host}:{port}\"\nusername = \"{user}\"\nsecrets = {{ password = {{ file = \"{pass}\" }} }}\n\
             [[targets.levels]]\nname = \"pdu\"\n[[targets.levels.devices]]\nurl = \"snmp+pdu://{phost}:{pport}/outlet/{outlets}?profile=apc&version=2c\"\nsecrets = {{ community = {{ file = \"community\" }} }}\n",
            name = m.name(),
            host = b.host,
            port = b.port,
            user = b.user,
            pass = ipmi_pass.display(),
            phost = pdu.host,
            pport = pdu.port,
            outlets = outlets.join(","),
        ));
    }
    let path = d.join("bridge.toml");
    std::fs::write(&path, cfg).unwrap();
    let cfg = FileConfig::load(&path).unwrap();
    let inv = Inventory::load(&cfg).unwrap();
    let exec = FenceExecutor::new(&inv).unwrap();
    let bridge = Bridge::new(&cfg, inv, Arc::new(exec), Some(path)).unwrap();
    let rt = palisade_bridge::server::runtime().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    rt.spawn(palisade_bridge::server::serve(bridge, listener, async {
        let _ = rx.await;
    }));
    let (cert, key) = ca.client("palisade-controller");
    let settings = ClientSettings::new(
        format!("https://127.0.0.1:{port}/").parse().unwrap(),
        ca.pem().into_bytes(),
        cert.into_bytes(),
        key.into_bytes(),
    );
    Setup {
        audit: d.join("state").join("audit.jsonl"),
        _dir: dir,
        rt,
        client: BridgeClient::new(&settings).unwrap(),
        stop: Some(tx),
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn lab() -> Lab {
    Lab::start(LabConfig {
        machines: 2,
        control_plane: false,
        pdu: true,
        outlets_per_machine: 1,
        machine_command: "exec sleep infinity".into(),
        ..Default::default()
    })
    .expect("lab starts")
}

/// A device talking to machine `i`'s BMC directly, out of band of the bridge.
fn direct_bmc(lab: &Lab, i: usize) -> Device {
    let b = lab.machines()[i].bmc();
    let target =
        palisade_fence::Target::parse(&format!("ipmi://{}@{}:{}", b.user, b.host, b.port)).unwrap();
    let creds = Credentials {
        password: Some(Secret::from_file(&b.password_file).unwrap()),
        ..Default::default()
    };
    Device::new(target, &creds, DeviceOptions::default()).unwrap()
}

/// The machine's processes once the set stops changing (boot helpers have exited).
fn stable_processes(m: &palisade_lab::Machine) -> Vec<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut last = m.processes();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = m.processes();
        if now == last && !now.is_empty() {
            return now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "machine processes never settled: {now:?}"
        );
        last = now;
    }
}

#[test]
fn bridge_fences_through_ipmi_and_a_retried_key_never_acts_twice_on_the_bmc() {
    let lab = lab();
    let m0 = &lab.machines()[0];
    m0.wait_power(true, Duration::from_secs(20))
        .expect("m0 boots");
    let s = start_bridge(&lab);

    let status = s.rt.block_on(s.client.power_status("m0")).unwrap();
    assert_eq!(status.power_state(), Some(PowerState::On), "{status:?}");

    let first =
        s.rt.block_on(s.client.power(
            "m0",
            PowerAction::Off,
            10,
            "fence-m0-1",
            Some("NodeFence m0"),
        ))
        .unwrap();
    assert_eq!(first.power_state(), Some(PowerState::Off));
    assert!(first.verified);
    assert_eq!(first.evidence["outcome"], "fenced");
    assert_eq!(first.evidence["level_name"], "ipmi");
    assert_eq!(
        first.evidence["attempts"][0]["result"], "off_verified",
        "{}",
        first.evidence
    );
    m0.wait_power(false, Duration::from_secs(10))
        .expect("the BMC really powered m0 off");

    // Power m0 back on out of band. If the retry acted again, the BMC would power it off.
    let bmc = direct_bmc(&lab, 0);
    s.rt.block_on(bmc.on()).unwrap();
    m0.wait_power(true, Duration::from_secs(20))
        .expect("m0 back on");
    let pids = stable_processes(m0);
    let retry =
        s.rt.block_on(s.client.power(
            "m0",
            PowerAction::Off,
            10,
            "fence-m0-1",
            Some("NodeFence m0"),
        ))
        .unwrap();
    assert!(retry.replayed);
    assert_eq!(retry.evidence, first.evidence);
    assert_eq!(
        s.rt.block_on(bmc.status()).unwrap(),
        palisade_fence::PowerState::On,
        "the BMC saw no second power-off"
    );
    assert!(m0.is_powered());
    // A power cycle would have killed every one of them. (Other pids may come and go: the BMC
    // runs helpers with the machine's environment to answer status requests.)
    let now = m0.processes();
    assert!(
        pids.iter().all(|p| now.contains(p)),
        "the machine was not power-cycled: {pids:?} -> {now:?}"
    );

    // A deposed controller's lower token is refused and the BMC is untouched.
    let e =
        s.rt.block_on(
            s.client
                .power("m0", PowerAction::Off, 9, "fence-m0-old", None),
        )
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    assert_eq!(
        s.rt.block_on(bmc.status()).unwrap(),
        palisade_fence::PowerState::On
    );
    assert!(m0.is_powered());

    let status = s.rt.block_on(s.client.power_status("m0")).unwrap();
    assert_eq!(status.power_state(), Some(PowerState::On));
    let mon = s.rt.block_on(s.client.monitor("m0")).unwrap();
    assert_eq!(
        mon.health(),
        Some(palisade_bridge::executor::Health::Ok),
        "{mon:?}"
    );
}

#[test]
fn when_ipmi_fails_the_pdu_level_fences_and_the_audit_log_tells_the_story() {
    let lab = lab();
    let m1 = &lab.machines()[1];
    m1.wait_power(true, Duration::from_secs(20))
        .expect("m1 boots");
    let s = start_bridge(&lab);

    let r =
        s.rt.block_on(s.client.power(
            "m1",
            PowerAction::Off,
            3,
            "fence-m1-1",
            Some("NodeFence m1"),
        ))
        .unwrap();
    assert_eq!(r.power_state(), Some(PowerState::Off));
    assert_eq!(r.evidence["level_name"], "pdu", "{}", r.evidence);
    let attempts = r.evidence["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["level_name"], "ipmi");
    assert_eq!(attempts[0]["result"], "failed");
    assert_eq!(attempts[1]["level_name"], "pdu");
    assert_eq!(attempts[1]["result"], "off_verified");
    m1.wait_power(false, Duration::from_secs(10))
        .expect("the PDU really cut m1");

    let recs = s.rt.block_on(s.client.audit(Some("m1"), 10)).unwrap();
    assert_eq!(recs.len(), 1);
    let rec = &recs[0];
    assert_eq!(
        (
            rec.client.as_str(),
            rec.action.as_str(),
            rec.result.as_str()
        ),
        ("palisade-controller", "power.off", "ok")
    );
    assert_eq!(rec.token, Some(3));
    assert_eq!(rec.idempotency_key.as_deref(), Some("fence-m1-1"));
    assert!(rec
        .message
        .as_deref()
        .unwrap_or_default()
        .contains("NodeFence m1"));
    assert_eq!(rec.evidence["attempts"][0]["result"], "failed");
    assert_eq!(rec.evidence["attempts"][1]["result"], "off_verified");
    // No credential in the audit log.
    let text = std::fs::read_to_string(&s.audit).unwrap();
    for m in lab.machines() {
        assert!(!text.contains(&m.bmc().password().unwrap()));
    }
    assert!(!text.contains(&PduInfo::secret(&lab.pdu().unwrap().info().community_rw_file).unwrap()));
}
