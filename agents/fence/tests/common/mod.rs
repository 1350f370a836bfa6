//! Helpers shared by the lab tests: start a lab, build devices for its BMCs and PDU.
#![allow(dead_code)]

use std::time::Duration;

use palisade_fence::device::{Credentials, DeviceOptions};
use palisade_fence::target::{
    IpmiTarget, PduTarget, SnmpAuthProtocol, SnmpSecurityLevel, SnmpVersion, Target,
};
use palisade_fence::verify::VerifyPolicy;
use palisade_fence::{Device, Secret};
use palisade_lab::{Lab, LabConfig, PduInfo};

/// Starts a lab without a control plane.
pub fn lab(machines: usize, pdu: bool, outlets_per_machine: usize) -> Lab {
    Lab::start(LabConfig {
        machines,
        control_plane: false,
        pdu,
        outlets_per_machine,
        machine_command: "exec sleep infinity".into(),
        ..Default::default()
    })
    .expect("lab starts")
}

/// A current-thread runtime for driving the async API from a plain test.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Options for tests: short exchanges, bounded verification.
pub fn options() -> DeviceOptions {
    DeviceOptions {
        exchange_timeout: Duration::from_millis(300),
        retries: 2,
        cipher_probe_timeout: Duration::from_millis(100),
        verify: VerifyPolicy {
            timeout: Duration::from_secs(15),
            interval: Duration::from_millis(20),
        },
        fencing_token: None,
    }
}

/// The IPMI target of machine `i`.
pub fn ipmi_target(lab: &Lab, i: usize, cipher: Option<u8>) -> Target {
    let b = lab.machines()[i].bmc();
    Target::Ipmi(IpmiTarget {
        host: b.host.to_string(),
        port: b.port,
        username: b.user.clone(),
        cipher,
        allow_weak_cipher_suites: false,
        system_guid: None,
    })
}

/// A device for machine `i`'s BMC with the lab password (or `password` instead).
pub fn ipmi(lab: &Lab, i: usize, password: Option<&str>) -> Device {
    let b = lab.machines()[i].bmc();
    let password = match password {
        Some(p) => Secret::new(p),
        None => Secret::from_file(&b.password_file).unwrap(),
    };
    Device::new(
        ipmi_target(lab, i, None),
        &Credentials {
            password: Some(password),
            ..Default::default()
        },
        options(),
    )
    .unwrap()
}

/// Which SNMP credentials to use.
#[derive(Clone, Copy, Debug)]
pub enum Snmp {
    /// v2c, read-write community.
    V2c,
    /// v2c, read-only community.
    V2cReadOnly,
    /// v2c, a wrong community.
    V2cWrong,
    /// v3 authPriv SHA/AES.
    V3,
    /// v3 with a wrong auth passphrase.
    V3WrongKey,
}

/// A PDU device switching `outlets` with `profile`.
pub fn pdu(lab: &Lab, outlets: &[u32], profile: &str, snmp: Snmp) -> Device {
    let info = lab.pdu().expect("lab has a PDU").info();
    let secret = |p: &std::path::Path| Secret::new(PduInfo::secret(p).unwrap());
    let mut creds = Credentials::default();
    let version = match snmp {
        Snmp::V2c => {
            creds.community = Some(secret(&info.community_rw_file));
            SnmpVersion::V2c
        }
        Snmp::V2cReadOnly => {
            creds.community = Some(secret(&info.community_ro_file));
            SnmpVersion::V2c
        }
        Snmp::V2cWrong => {
            creds.community = Some(Secret::new("not-the-community"));
            SnmpVersion::V2c
        }
        Snmp::V3 | Snmp::V3WrongKey => {
            creds.v3_auth_password = Some(if matches!(snmp, Snmp::V3) {
                secret(&info.v3_auth_file)
            } else {
                Secret::new("wrong-auth-passphrase")
            });
            creds.v3_priv_password = Some(secret(&info.v3_priv_file));
            SnmpVersion::V3
        }
    };
    Device::new(
        Target::Pdu(PduTarget {
            host: info.host.to_string(),
            port: info.port,
            outlets: outlets.to_vec(),
            profile: profile.into(),
            version,
            v3_user: Some(info.v3_user.clone()),
            v3_auth: SnmpAuthProtocol::Sha1,
            v3_level: SnmpSecurityLevel::AuthPriv,
        }),
        &creds,
        options(),
    )
    .unwrap()
}

/// The machine's boot pid (changes on every boot).
pub fn boot_pid(lab: &Lab, i: usize) -> Option<String> {
    std::fs::read_to_string(lab.machines()[i].dir().join("boot.pid"))
        .ok()
        .map(|s| s.trim().to_string())
}
