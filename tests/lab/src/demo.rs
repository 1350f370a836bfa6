//! The lab tour: bring the lab up, show it, fence a machine through its BMC and another
//! through its PDU outlet with Palisade's `palisade-fence` agent (verified off, then on
//! again), cross-checked with the operators' own tools (`ipmitool`, `snmpget`), and tear it
//! all down, printing a timeline.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use palisade_lab::{Lab, LabConfig, MachineKind, QemuConfig, SnmpCred};

/// Prints the lab's parts and how to reach them.
pub fn print_status(lab: &Lab) {
    println!("lab {} in {}", lab.id(), lab.dir().display());
    if let Some(cp) = lab.control_plane() {
        println!(
            "  control plane   Kubernetes {} at {}",
            cp.version(),
            cp.api_url()
        );
        println!(
            "  admin access    KUBECONFIG={}",
            cp.admin_kubeconfig().display()
        );
        println!("  machines reach  {}", cp.in_lab_api_url());
    }
    if let Some(pdu) = lab.pdu() {
        println!(
            "  PDU             SNMP v2c/v3 at {} (APC rPDU + CyberPower tables)",
            pdu.info().agent()
        );
    }
    println!();
    println!(
        "  {:<6} {:<10} {:<14} {:<18} {:<8} {:<6} {:<6} {:<8}",
        "NAME", "KIND", "ADDRESS", "BMC (IPMI 2.0)", "OUTLETS", "POWER", "PROCS", "BOOT ID"
    );
    for m in lab.machines() {
        let outlets: Vec<String> = m.outlets().iter().map(|o| o.to_string()).collect();
        println!(
            "  {:<6} {:<10} {:<14} {:<18} {:<8} {:<6} {:<6} {:<8}",
            m.name(),
            kind_name(m.kind()),
            m.address().to_string(),
            format!("127.0.0.1:{}", m.bmc().port),
            outlets.join(","),
            if m.is_powered() { "on" } else { "off" },
            m.processes().len(),
            short_boot(m)
        );
    }
}

/// A machine kind as the status table shows it.
fn kind_name(kind: MachineKind) -> &'static str {
    match kind {
        MachineKind::Namespace => "namespace",
        MachineKind::Qemu => "qemu-vm",
    }
}

/// What runs on a machine, as seen from the host: its processes (a namespace machine) or its
/// VM's process (a QEMU machine, whose guest processes only the guest sees).
fn running(m: &palisade_lab::Machine) -> String {
    match (m.kind(), m.power_pid()) {
        (MachineKind::Namespace, _) => format!("{} processes", m.processes().len()),
        (MachineKind::Qemu, Some(pid)) => format!("VM process {pid}"),
        (MachineKind::Qemu, None) => "no VM process".into(),
    }
}

/// The first 8 characters of a machine's boot ID, or `-` (off, or not booted yet).
fn short_boot(m: &palisade_lab::Machine) -> String {
    match (m.is_powered(), m.boot_id()) {
        (true, Some(id)) => id.chars().take(8).collect(),
        _ => "-".into(),
    }
}

struct Timeline(Instant);

impl Timeline {
    fn say(&self, what: &str) {
        println!("[{:>7.3}s] {what}", self.0.elapsed().as_secs_f64());
    }
}

fn ipmitool(lab: &Lab, machine: usize, args: &[&str]) -> Result<String> {
    let out = lab.machines()[machine]
        .bmc()
        .ipmitool()
        .args(args)
        .output()
        .context("running ipmitool")?;
    if !out.status.success() {
        bail!(
            "ipmitool {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn snmp(lab: &Lab, tool: &str, args: &[&str]) -> Result<String> {
    let pdu = lab.pdu().context("the lab has no PDU")?;
    let out = Command::new(tool)
        .env("SNMPCONFPATH", pdu.info().client_conf_dir(SnmpCred::V3))
        .env("MIBS", "")
        .arg("-On")
        .arg(pdu.info().agent())
        .args(args)
        .output()
        .with_context(|| format!("running {tool}"))?;
    if !out.status.success() {
        bail!("{tool}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs `palisade-fence <action>` with its options as `name=value` lines on stdin, as
/// Pacemaker does (secrets never on the command line). Returns the exit code and output.
fn fence(options: &[(&str, String)], action: &str) -> Result<(i32, String)> {
    use std::io::Write;
    let bin = palisade_lab::bin_path("palisade-fence")?;
    let mut child = Command::new(bin)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running palisade-fence")?;
    let mut input = format!("action={action}\n");
    for (k, v) in options {
        input.push_str(&format!("{k}={v}\n"));
    }
    child
        .stdin
        .take()
        .context("palisade-fence stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((
        out.status.code().unwrap_or(-1),
        text.trim().replace('\n', "; "),
    ))
}

/// How long a machine may take to boot again after power on (a TCG guest under load).
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the demo on machines of the given kind.
pub fn run(kind: MachineKind) -> Result<()> {
    let t = Timeline(Instant::now());
    let machines = match kind {
        MachineKind::Qemu => "3 QEMU VMs whose BMCs are ipmi_sim",
        MachineKind::Namespace => "3 namespace machines whose BMCs are ipmi_sim",
    };
    let kube = palisade_lab::KubeVersion::from_env()?;
    t.say(&format!("starting the lab: etcd, kube-apiserver, kube-controller-manager, kube-scheduler {kube}, {machines}, a PDU"));
    // Every machine runs a process tree (a child and a grandchild) that power cuts must kill.
    let lab = Lab::start(LabConfig {
        kube: Some(kube),
        machine_command: "sh -c 'sleep infinity & wait' & exec sleep infinity".into(),
        machine_kind: kind,
        qemu: QemuConfig::default(),
        ..Default::default()
    })
    .context("starting the lab")?;
    t.say("lab is up");
    print_status(&lab);
    println!();

    let m = &lab.machines()[1];
    t.say(&format!(
        "{}: BMC says \"{}\"; {} running",
        m.name(),
        ipmitool(&lab, 1, &["chassis", "power", "status"])?,
        running(m)
    ));
    let before = m.boot_id();
    let bmc = m.bmc();
    let ipmi = [
        ("agent", "ipmilan".to_string()),
        ("ip", bmc.host.to_string()),
        ("ipport", bmc.port.to_string()),
        ("username", bmc.user.clone()),
        ("password", bmc.password()?),
        ("lanplus", "1".to_string()),
    ];
    t.say(&format!(
        "{}: palisade-fence off through the BMC (IPMI 2.0, RMCP+)",
        m.name()
    ));
    let (code, out) = fence(&ipmi, "off")?;
    if code != 0 {
        bail!("palisade-fence off failed ({code}): {out}");
    }
    m.wait_power(false, Duration::from_secs(15))?;
    t.say(&format!("{}: {out}", m.name()));
    t.say(&format!(
        "{}: {} left; ipmitool says \"{}\"",
        m.name(),
        running(m),
        ipmitool(&lab, 1, &["chassis", "power", "status"])?
    ));
    let (code, out) = fence(&ipmi, "on")?;
    if code != 0 {
        bail!("palisade-fence on failed ({code}): {out}");
    }
    m.wait_power(true, Duration::from_secs(15))?;
    let boot = m.wait_booted(before.as_deref(), BOOT_TIMEOUT)?;
    t.say(&format!(
        "{}: palisade-fence on: {out}; booted again with a new boot ID {} (was {}), {}",
        m.name(),
        &boot[..8.min(boot.len())],
        before.as_deref().map_or("-", |b| &b[..8.min(b.len())]),
        running(m)
    ));

    let m = &lab.machines()[2];
    let before = m.boot_id();
    let outlet = m.outlets()[0];
    let state = format!(".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.{outlet}");
    t.say(&format!(
        "{}: PDU outlet {outlet} reads {} (SNMPv3 authPriv)",
        m.name(),
        snmp(&lab, "snmpget", &[&state])?
    ));
    let info = lab.pdu().context("the lab has no PDU")?.info();
    let pdu = [
        ("agent", "apc_snmp".to_string()),
        ("ip", info.host.to_string()),
        ("ipport", info.port.to_string()),
        ("plug", outlet.to_string()),
        ("snmp_version", "2c".to_string()),
        (
            "community",
            palisade_lab::PduInfo::secret(&info.community_rw_file)?,
        ),
    ];
    t.say(&format!(
        "{}: palisade-fence off through PDU outlet {outlet} (SNMP v2c, APC profile)",
        m.name()
    ));
    let (code, out) = fence(&pdu, "off")?;
    if code != 0 {
        bail!("palisade-fence off (PDU) failed ({code}): {out}");
    }
    m.wait_power(false, Duration::from_secs(15))?;
    t.say(&format!("{}: {out}", m.name()));
    t.say(&format!(
        "{}: machine down ({}), its BMC lost power too (running: {}); outlet reads {}",
        m.name(),
        running(m),
        m.bmc_running(),
        snmp(&lab, "snmpget", &[&state])?
    ));
    let (code, out) = fence(&pdu, "on")?;
    if code != 0 {
        bail!("palisade-fence on (PDU) failed ({code}): {out}");
    }
    m.wait_power(true, Duration::from_secs(15))?;
    lab.wait_bmc(m)?;
    let boot = m.wait_booted(before.as_deref(), BOOT_TIMEOUT)?;
    t.say(&format!(
        "{}: palisade-fence on: {out}; BMC back, machine booted with a new boot ID {} ({})",
        m.name(),
        &boot[..8.min(boot.len())],
        running(m)
    ));
    println!();
    print_status(&lab);
    drop(lab);
    t.say("lab torn down");
    Ok(())
}
