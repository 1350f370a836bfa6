//! The lab's switched PDU: Net-SNMP `snmpd` on a loopback port, serving outlet tables through
//! the [`crate::pdu_agent`] `pass_persist` handler, over SNMP v1/v2c (communities) and v3
//! (an authPriv user with SHA and AES).

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::{LabError, Result};
use crate::pdu_agent::{self, Outlet, PduState};
use crate::process::Daemon;
use crate::{write_executable, write_secret};

/// APC Rack PDU's sysObjectID, so `fence_apc_snmp` picks the rPDU tables.
pub const SYS_OBJECT_ID: &str = ".1.3.6.1.4.1.318.1.3.4.5";

/// Which credentials a client configuration carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnmpCred {
    /// v2c with the read-write community.
    V2cWrite,
    /// v2c with the read-only community.
    V2cRead,
    /// v3 authPriv (SHA, AES) with the lab user.
    V3,
}

/// How to reach and log in to the PDU. Secrets are only ever in files.
#[derive(Clone, Debug)]
pub struct PduInfo {
    /// The agent's address (loopback).
    pub host: Ipv4Addr,
    /// The agent's UDP port.
    pub port: u16,
    /// The v3 user name.
    pub v3_user: String,
    /// Files holding, in order: the read-write community, the read-only community, the v3 auth
    /// passphrase and the v3 privacy passphrase (each mode 0600).
    pub community_rw_file: PathBuf,
    /// See `community_rw_file`.
    pub community_ro_file: PathBuf,
    /// See `community_rw_file`.
    pub v3_auth_file: PathBuf,
    /// See `community_rw_file`.
    pub v3_priv_file: PathBuf,
    dir: PathBuf,
}

impl PduInfo {
    /// Reads a secret file.
    pub fn secret(path: &Path) -> Result<String> {
        fs::read_to_string(path)
            .map(|s| s.trim_end().to_string())
            .map_err(LabError::io(path))
    }

    /// A directory holding an `snmp.conf` with the given credentials, for Net-SNMP tools run
    /// with `SNMPCONFPATH=<dir>`, so no secret appears on a command line.
    pub fn client_conf_dir(&self, cred: SnmpCred) -> PathBuf {
        self.dir.join(match cred {
            SnmpCred::V2cWrite => "client-v2c-rw",
            SnmpCred::V2cRead => "client-v2c-ro",
            SnmpCred::V3 => "client-v3",
        })
    }

    /// `udp:127.0.0.1:<port>`, as Net-SNMP tools take it.
    pub fn agent(&self) -> String {
        format!("udp:{}:{}", self.host, self.port)
    }
}

/// A running PDU.
#[derive(Debug)]
pub struct Pdu {
    info: PduInfo,
    state_file: PathBuf,
    daemon: Daemon,
}

impl Pdu {
    pub(crate) fn start(dir: &Path, lab_id: &str, lab_bin: &Path, state: PduState) -> Result<Pdu> {
        crate::require_tool("snmpd")?;
        fs::create_dir_all(dir.join("persist")).map_err(LabError::io(dir))?;
        let port = crate::ports::free_port();
        let rw = random_secret("rw");
        let ro = random_secret("ro");
        let auth = random_secret("auth");
        let privacy = random_secret("priv");
        let info = PduInfo {
            host: Ipv4Addr::LOCALHOST,
            port,
            v3_user: "fenceuser".into(),
            community_rw_file: dir.join("community-rw"),
            community_ro_file: dir.join("community-ro"),
            v3_auth_file: dir.join("v3-auth"),
            v3_priv_file: dir.join("v3-priv"),
            dir: dir.to_path_buf(),
        };
        for (path, value) in [
            (&info.community_rw_file, &rw),
            (&info.community_ro_file, &ro),
            (&info.v3_auth_file, &auth),
            (&info.v3_priv_file, &privacy),
        ] {
            write_secret(path, format!("{value}\n").as_bytes())?;
        }

        let state_file = dir.join("pdu.json");
        pdu_agent::write_state(&state_file, &state)?;
        let handler = dir.join("pdu-agent.sh");
        write_executable(
            &handler,
            &format!(
                "#!/bin/sh\nexec '{}' pdu-agent --state '{}' 2>>'{}'\n",
                lab_bin.display(),
                state_file.display(),
                dir.join("pdu-agent.log").display()
            ),
        )?;
        let conf = format!(
            "agentaddress udp:127.0.0.1:{port}\n\
             sysobjectid {SYS_OBJECT_ID}\n\
             sysdescr APC Web/SNMP Management Card (MB:v4.1.0 PF:v6.9.6 PN:apc_hw05_aos_696.bin AN1:apc_hw05_rpdu2g_696.bin) (palisade lab)\n\
             sysname palisade-lab-pdu\n\
             syslocation lab\n\
             rocommunity {ro} 127.0.0.1\n\
             rwcommunity {rw} 127.0.0.1\n\
             createUser {user} SHA \"{auth}\" AES \"{privacy}\"\n\
             rwuser {user} priv\n\
             pass_persist .1.3.6.1.4.1.318.1.1 {handler}\n\
             pass_persist .1.3.6.1.4.1.3808.1.1.3 {handler}\n",
            user = info.v3_user,
            handler = handler.display(),
        );
        let conf_file = dir.join("snmpd.conf");
        write_secret(&conf_file, conf.as_bytes())?;

        write_client_conf(
            &info.client_conf_dir(SnmpCred::V2cWrite),
            &format!("defVersion 2c\ndefCommunity {rw}\n"),
        )?;
        write_client_conf(
            &info.client_conf_dir(SnmpCred::V2cRead),
            &format!("defVersion 2c\ndefCommunity {ro}\n"),
        )?;
        write_client_conf(
            &info.client_conf_dir(SnmpCred::V3),
            &format!(
                "defVersion 3\ndefSecurityName {user}\ndefSecurityLevel authPriv\ndefAuthType SHA\ndefPrivType AES\ndefAuthPassphrase {auth}\ndefPrivPassphrase {privacy}\n",
                user = info.v3_user
            ),
        )?;

        let mut cmd = Command::new("snmpd");
        cmd.args(["-f", "-C", "-Lo", "-c"])
            .arg(&conf_file)
            .arg("-p")
            .arg(dir.join("snmpd.pid"))
            .env("SNMP_PERSISTENT_DIR", dir.join("persist"))
            .env("MIBS", "");
        let mut daemon = Daemon::spawn("snmpd", cmd, lab_id, &dir.join("snmpd.log"))?;
        let probe_conf = info.client_conf_dir(SnmpCred::V2cRead);
        let agent = info.agent();
        daemon.wait_ready(Duration::from_secs(30), || {
            let out = Command::new("snmpget")
                .env("SNMPCONFPATH", &probe_conf)
                .env("MIBS", "")
                .args(["-On", "-t", "1", "-r", "0", &agent, ".1.3.6.1.2.1.1.2.0"])
                .output()
                .map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        })?;
        Ok(Pdu {
            info,
            state_file,
            daemon,
        })
    }

    /// How to reach the PDU.
    pub fn info(&self) -> &PduInfo {
        &self.info
    }

    /// The outlets and whether each is on, as the PDU itself records them.
    pub fn outlets(&self) -> Result<Vec<Outlet>> {
        Ok(pdu_agent::read_state(&self.state_file)?.outlets)
    }

    /// Switches an outlet directly (as a person at the PDU's front panel would).
    pub fn switch(&self, outlet: u32, on: bool) -> Result<()> {
        if pdu_agent::switch(&self.state_file, outlet, on)? {
            Ok(())
        } else {
            Err(LabError::Other(format!("the PDU has no outlet {outlet}")))
        }
    }

    /// The process id of the PDU's agent (`snmpd`), for a fault that freezes it.
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    pub(crate) fn stop(&mut self) {
        self.daemon.stop(Duration::from_secs(2));
    }
}

fn write_client_conf(dir: &Path, text: &str) -> Result<()> {
    fs::create_dir_all(dir).map_err(LabError::io(dir))?;
    write_secret(&dir.join("snmp.conf"), text.as_bytes())
}

fn random_secret(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}
