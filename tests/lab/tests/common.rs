//! Helpers shared by the lab's tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use palisade_lab::{Lab, SnmpCred};

/// Runs ipmitool against machine `i`'s BMC with the lab credentials (password from a file).
pub fn ipmitool(lab: &Lab, i: usize, args: &[&str]) -> Output {
    let m = &lab.machines()[i];
    ipmitool_with(m.bmc().port, &m.bmc().user, &m.bmc().password_file, args)
}

/// Runs ipmitool against a BMC port with the given user and password file.
pub fn ipmitool_with(port: u16, user: &str, password_file: &Path, args: &[&str]) -> Output {
    palisade_lab::BmcInfo {
        host: std::net::Ipv4Addr::LOCALHOST,
        port,
        user: user.into(),
        password_file: password_file.into(),
    }
    .ipmitool()
    .args(args)
    .output()
    .expect("ipmitool runs")
}

/// Runs a Net-SNMP tool against the lab PDU with the credentials in `conf_dir`'s snmp.conf.
pub fn snmp(lab: &Lab, conf_dir: &Path, tool: &str, args: &[&str]) -> Output {
    Command::new(tool)
        .env("SNMPCONFPATH", conf_dir)
        .env("MIBS", "")
        .args(["-On", "-t", "1", "-r", "1"])
        .arg(lab.pdu().expect("lab has a PDU").info().agent())
        .args(args)
        .output()
        .expect("snmp tool runs")
}

/// The credential directory for `cred`.
pub fn cred_dir(lab: &Lab, cred: SnmpCred) -> std::path::PathBuf {
    lab.pdu()
        .expect("lab has a PDU")
        .info()
        .client_conf_dir(cred)
}

/// stdout as a trimmed string.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}
