//! A `palisade_fence::Device` built from `bridge://host:port/target-id`, against a real
//! `firmware-bridge` process (the spawned binary, real executor) in front of the lab's
//! `ipmi_sim`: a verified off through the bridge kills the machine, a stale fencing token is
//! refused with a clear error, and a retried idempotency key acts once.

mod common;

use std::time::Duration;

use common::{install_provider, write_private, BridgeProcess, Ca};
use palisade_fence::bridge::{BridgeDevice, BridgeIdentity};
use palisade_fence::target::BridgeTarget;
use palisade_fence::{Credentials, Device, DeviceOptions, PowerDevice, PowerState, Secret, Target};
use palisade_lab::{Lab, LabConfig};

struct Bridge {
    _proc: BridgeProcess,
    port: u16,
    _dir: tempfile::TempDir,
    ca: Ca,
}

/// Spawns `firmware-bridge` with one target per lab machine (IPMI level only).
fn spawn_bridge(lab: &Lab) -> Bridge {
    install_provider();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("bridge-device-ca");
    let server = ca.server();
    write_private(&d.join("server.key"), &server.1);
    std::fs::write(d.join("server.crt"), &server.0).unwrap();
    std::fs::write(d.join("ca.crt"), ca.pem()).unwrap();
    let mut cfg = String::from(
        "listen = \"127.0.0.1:0\"\nstate_dir = \"state\"\n[tls]\ncert = \"server.crt\"\nkey = \"server.key\"\nclient_ca = \"ca.crt\"\n\
         [[policy]]\nclient = \"cn:palisade-controller\"\ntargets = [\"*\"]\nread_audit = true\n",
    );
    for m in lab.machines() {
        let b = m.bmc();
        let pass = d.join(format!("{}-bmc", m.name()));
        write_private(&pass, &b.password().unwrap());
        cfg.push_str(&format!(
            "[[targets]]\nid = \"{name}\"\n\
             [[targets.levels]]\nname = \"ipmi\"\n[[targets.levels.devices]]\nurl = \"ipmi://{host}:{port}\"\nusername = \"{user}\"\nsecrets = {{ password = {{ file = \"{pass}\" }} }}\n",
            name = m.name(),
            host = b.host,
            port = b.port,
            user = b.user,
            pass = pass.display(),
        ));
    }
    let path = d.join("bridge.toml");
    std::fs::write(&path, cfg).unwrap();
    let proc = BridgeProcess::spawn(&path);
    let port = proc.port;
    Bridge {
        _proc: proc,
        port,
        _dir: dir,
        ca,
    }
}

impl Bridge {
    fn identity(&self) -> BridgeIdentity {
        let (cert, key) = self.ca.client("palisade-controller");
        BridgeIdentity {
            ca_pem: self.ca.pem().into_bytes(),
            cert_pem: cert.into_bytes(),
            key_pem: Secret::new(key),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            trace_context: None,
        }
    }

    /// A device for `target` built from its `bridge://` URL, carrying `token`.
    fn device(&self, target: &str, token: Option<u64>) -> Device {
        let url = format!("bridge://127.0.0.1:{}/{target}", self.port);
        let options = DeviceOptions {
            fencing_token: token,
            ..Default::default()
        };
        Device::with_bridge_identity(
            Target::parse(&url).unwrap(),
            &Credentials::default(),
            Some(&self.identity()),
            options,
        )
        .unwrap()
    }

    fn bridge_device(&self, target: &str, token: u64) -> BridgeDevice {
        let t = BridgeTarget {
            host: "127.0.0.1".into(),
            port: self.port,
            target_id: target.into(),
        };
        let options = DeviceOptions {
            fencing_token: Some(token),
            ..Default::default()
        };
        BridgeDevice::new(t, &self.identity(), options).unwrap()
    }
}

fn lab() -> Lab {
    Lab::start(LabConfig {
        machines: 1,
        control_plane: false,
        pdu: false,
        machine_command: "exec sleep infinity".into(),
        ..Default::default()
    })
    .expect("lab starts")
}

/// Talks to machine 0's BMC directly, out of band of the bridge.
fn direct_bmc(lab: &Lab) -> Device {
    let b = lab.machines()[0].bmc();
    let target = Target::parse(&format!("ipmi://{}@{}:{}", b.user, b.host, b.port)).unwrap();
    let creds = Credentials {
        password: Some(Secret::from_file(&b.password_file).unwrap()),
        ..Default::default()
    };
    Device::new(target, &creds, DeviceOptions::default()).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    // palisade-fence futures are large in debug builds (the bridge does the same).
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_stack_size(16 << 20)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_bridge_device_fences_verified_refuses_stale_tokens_and_acts_once_per_key() {
    let lab = lab();
    let m0 = &lab.machines()[0];
    m0.wait_power(true, Duration::from_secs(20))
        .expect("m0 boots");
    assert!(!m0.processes().is_empty());
    let bridge = spawn_bridge(&lab);
    let rt = runtime();

    let dev = bridge.device("m0", Some(10));
    assert_eq!(dev.name(), format!("bridge://127.0.0.1:{}/m0", bridge.port));
    rt.block_on(dev.monitor())
        .expect("monitor through the bridge");
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::On);

    // Without a token, nothing is sent: a configuration error naming what is missing.
    let e = rt.block_on(bridge.device("m0", None).off()).unwrap_err();
    assert_eq!(e.kind(), "config", "{e}");
    assert!(e.to_string().contains("fencing token"), "{e}");
    assert!(m0.is_powered());

    // Off through the bridge, verified by the bridge, kills the machine.
    let first = bridge.bridge_device("m0", 10);
    let ev = rt
        .block_on(first.off_with_key("nodefence-m0-gen1"))
        .expect("verified off through the bridge");
    let remote: serde_json::Value =
        serde_json::from_str(ev.bridge_evidence().expect("bridge evidence kept")).unwrap();
    assert_eq!(remote["outcome"], "fenced", "{remote}");
    assert_eq!(remote["attempts"][0]["result"], "off_verified", "{remote}");
    assert!(ev.device().starts_with("bridge://"));
    m0.wait_power(false, Duration::from_secs(10))
        .expect("the machine and all its processes are gone");
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::Off);

    // Power on out of band; a retry of the same logical operation (same key) is answered
    // from the bridge's record and does not power the machine off again.
    let bmc = direct_bmc(&lab);
    rt.block_on(bmc.on()).unwrap();
    m0.wait_power(true, Duration::from_secs(20))
        .expect("m0 back on");
    let retry = rt
        .block_on(first.off_with_key("nodefence-m0-gen1"))
        .expect("the retry returns the recorded verified off");
    assert_eq!(retry.bridge_evidence(), ev.bridge_evidence());
    assert_eq!(
        rt.block_on(bmc.status()).unwrap(),
        PowerState::On,
        "the BMC saw no second power-off"
    );
    assert!(m0.is_powered());

    // A deposed leader's lower token is refused, clearly, and the machine is untouched.
    let e = rt.block_on(bridge.device("m0", Some(9)).off()).unwrap_err();
    assert_eq!(e.kind(), "stale_fencing_token", "{e}");
    assert!(!e.is_retryable());
    assert!(e.to_string().contains("stale fencing token"), "{e}");
    assert_eq!(rt.block_on(bmc.status()).unwrap(), PowerState::On);
    assert!(m0.is_powered());

    // Reboot through the bridge: a verified off, then a verified on (two logical operations).
    let before = m0.processes();
    let (off, on) = rt
        .block_on(dev.reboot())
        .expect("reboot through the bridge");
    assert!(off.bridge_evidence().is_some());
    assert!(on.verified_at() >= off.verified_at());
    m0.wait_power(true, Duration::from_secs(20))
        .expect("m0 on after the reboot");
    let after = m0.processes();
    assert!(
        before.iter().all(|p| !after.contains(p)),
        "the machine was power-cycled: {before:?} -> {after:?}"
    );
    assert_eq!(rt.block_on(dev.status()).unwrap(), PowerState::On);
}
