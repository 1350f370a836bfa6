//! A firmware-bridge for the lab: the real `firmware-bridge` binary on loopback, serving every
//! machine as a target, with the controller's client identity issued by the lab CA.
//!
//! Each target has an IPMI level (the machine's BMC; a chosen machine can be given a wrong BMC
//! password to exercise the fall-through), a PDU level when the lab has a PDU, and the lab
//! storage server's firewall when one is given. The credentials exist only in the bridge's
//! 0600 files; the controller holds only its client certificate and the pinned CA.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use palisade_lab::{Lab, PduInfo};
use serde_json::Value;

use crate::{eventually, free_port, Proc, Storage};

/// The certificate CN the bridge's policy allows to act on every target.
pub const CONTROLLER_CN: &str = "palisade-controller";

/// What the lab's bridge serves.
#[derive(Default, Clone, Copy)]
pub struct BridgeOptions<'a> {
    /// Machines (by index) whose IPMI level is given a wrong password, so the bridge falls
    /// through to their PDU level.
    pub wrong_bmc_password: &'a [usize],
    /// The storage server whose firewall the bridge also drives (`storage.block`).
    pub storage: Option<&'a Storage>,
    /// Bugs planted in the bridge (`PALISADE_PLANTED_BUGS`, debug builds only; see
    /// `palisade_fence::planted`): a negative control.
    pub planted: &'a [String],
    /// Where the bridge reaches each machine's BMC, by machine index (for example through
    /// [`Lab::bmc_relay`]); empty: directly.
    pub bmc_addrs: &'a [std::net::SocketAddr],
}

/// A running firmware-bridge and the client identity that may use it.
pub struct FirmwareBridge {
    /// The bridge process (killed on drop).
    pub proc: Proc,
    /// `host:port` of its mTLS API.
    pub addr: String,
    /// Its append-only audit log.
    pub audit_log: PathBuf,
    /// The CA that signed the bridge's certificate (the only root the client trusts).
    pub ca_file: PathBuf,
    /// The controller's client certificate (CN [`CONTROLLER_CN`]).
    pub client_cert: PathBuf,
    /// Its key (0600).
    pub client_key: PathBuf,
}

impl FirmwareBridge {
    /// Writes the configuration and credentials, starts `firmware-bridge` and waits for its
    /// listener.
    pub fn start(lab: &Lab, opts: BridgeOptions<'_>) -> Result<FirmwareBridge> {
        let dir = lab.dir().join("bridge");
        std::fs::create_dir_all(&dir)?;
        let (server_cert, server_key) = lab
            .ca()
            // Loopback for a controller beside the lab, the hub for one in the cluster.
            .issue_server_cert(&["127.0.0.1", &palisade_lab::netns::HUB_ADDR.to_string()])?
            .write(&dir, "server")?;
        let (client_cert, client_key) = lab
            .ca()
            .issue_client_cert(CONTROLLER_CN, None)?
            .write(&dir, "controller")?;
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, lab.ca().cert_pem())?;
        palisade_lab::write_secret(&dir.join("wrong-bmc-password"), b"not-the-password")?;
        let pdu = lab.pdu().map(|p| p.info().clone());
        if let Some(p) = &pdu {
            palisade_lab::write_secret(
                &dir.join("pdu-community"),
                PduInfo::secret(&p.community_rw_file)?.as_bytes(),
            )?;
        }
        if let Some(s) = opts.storage {
            palisade_lab::write_secret(&dir.join("storage-token"), s.token.as_bytes())?;
        }
        let addr = format!("127.0.0.1:{}", free_port());
        let audit_log = dir.join("audit.jsonl");
        let mut cfg = format!(
            "listen = \"{addr}\"\nstate_dir = \"state\"\naudit_log = \"audit.jsonl\"\n\
             operation_timeout_secs = 30\n\
             [tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"ca.crt\"\n\
             [rate_limit]\nburst = 50\nper_second = 20.0\n\
             [[policy]]\nclient = \"cn:{CONTROLLER_CN}\"\ntargets = [\"*\"]\nread_audit = true\n",
            server_cert.display(),
            server_key.display(),
        );
        for (i, m) in lab.machines().iter().enumerate() {
            let b = m.bmc();
            let password = if opts.wrong_bmc_password.contains(&i) {
                dir.join("wrong-bmc-password")
            } else {
                let p = dir.join(format!("{}-bmc-password", m.name()));
                palisade_lab::write_secret(&p, b.password()?.as_bytes())?;
                p
            };
            let bmc = opts
                .bmc_addrs
                .get(i)
                .copied()
                .unwrap_or_else(|| std::net::SocketAddr::new(b.host.into(), b.port));
            cfg.push_str(&format!(
                "[[targets]]\nid = \"{name}\"\n\
                 [[targets.levels]]\nname = \"ipmi\"\n[[targets.levels.devices]]\n\
                 url = \"ipmi://{bmc}\"\nusername = \"{user}\"\n\
                 secrets = {{ password = {{ file = \"{password}\" }} }}\n",
                name = m.name(),
                user = b.user,
                password = password.display(),
            ));
            if let Some(p) = &pdu {
                let outlets: Vec<String> = m.outlets().iter().map(u32::to_string).collect();
                cfg.push_str(&format!(
                    "[[targets.levels]]\nname = \"pdu\"\n[[targets.levels.devices]]\n\
                     url = \"snmp+pdu://{}:{}/outlet/{}?profile=apc&version=2c\"\n\
                     secrets = {{ community = {{ file = \"pdu-community\" }} }}\n",
                    p.host,
                    p.port,
                    outlets.join(","),
                ));
            }
            if let Some(s) = opts.storage {
                cfg.push_str(&format!(
                    "[[targets.storage]]\nurl = \"storagefw+https://{}/?profile=lab\"\n\
                     ca_bundle = \"{}\"\nnode = \"{}\"\naddresses = [\"{}\"]\n\
                     secrets = {{ token = {{ file = \"storage-token\" }} }}\n",
                    s.admin,
                    s.ca_file.display(),
                    m.name(),
                    m.address(),
                ));
            }
        }
        let config = dir.join("bridge.toml");
        std::fs::write(&config, cfg)?;
        let config_arg = config.display().to_string();
        let planted = opts.planted.join(",");
        let mut env = vec![("RUST_LOG", "info")];
        if !planted.is_empty() {
            env.push(("PALISADE_PLANTED_BUGS", planted.as_str()));
        }
        let proc = Proc::spawn(
            lab,
            "firmware-bridge",
            "firmware-bridge",
            &["--config", &config_arg],
            &env,
        )?;
        eventually("firmware-bridge listening", Duration::from_secs(30), || {
            std::net::TcpStream::connect(&addr).ok().map(|_| ())
        })
        .with_context(|| format!("firmware-bridge did not start; see {}", proc.log.display()))?;
        Ok(FirmwareBridge {
            proc,
            addr,
            audit_log,
            ca_file,
            client_cert,
            client_key,
        })
    }

    /// Starts the bridge again after a crash ([`Proc::kill`]) with the same configuration,
    /// state directory and audit log, and waits for its listener.
    pub fn start_again(&mut self) -> Result<()> {
        self.proc.start_again()?;
        let addr = self.addr.clone();
        eventually(
            "firmware-bridge listening again",
            Duration::from_secs(30),
            || std::net::TcpStream::connect(&addr).ok().map(|_| ()),
        )
        .with_context(|| {
            format!(
                "firmware-bridge did not start again; see {}",
                self.proc.log.display()
            )
        })
    }

    /// The `bridge://` device URL of a target (a machine name).
    pub fn url(&self, target: &str) -> String {
        url(&self.addr, target)
    }

    /// The environment that gives `palisade-controller` its bridge client identity.
    pub fn controller_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PALISADE_BRIDGE_CA", self.ca_file.display().to_string()),
            (
                "PALISADE_BRIDGE_CERT",
                self.client_cert.display().to_string(),
            ),
            ("PALISADE_BRIDGE_KEY", self.client_key.display().to_string()),
        ]
    }

    /// The audit log's records, oldest first (lines that do not parse are skipped).
    pub fn audit(&self) -> Vec<Value> {
        crate::read_or_empty(&self.audit_log)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// The `bridge://` device URL of `target` on the bridge at `addr` (`host:port`).
pub fn url(addr: &str, target: &str) -> String {
    format!("bridge://{addr}/{target}")
}
