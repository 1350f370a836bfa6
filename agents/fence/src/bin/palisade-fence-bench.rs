//! `palisade-fence-bench`: side-by-side medians of palisade-fence and the tools operators use
//! today (`fence_ipmilan`, `ipmitool`, `fence_apc_snmp`, `fence_redfish`), in one run against
//! the same lab simulators (`ipmi_sim` BMCs, the `snmpd` PDU, and `sushy-emulator` on
//! libvirt's in-process test driver, where power changes are immediate).
//!
//! Bounded in count and time: a fixed number of iterations per row, every external command
//! under `timeout`, and the concurrent row limited to the lab's machines (20 by default).
//!
//! Usage: `palisade-fence-bench [ITERATIONS] [MACHINES] [--out FILE.json]` (defaults 15 and
//! 20). With `--out`, every row's p50 and p99 beside the peer's, and the concurrent fence,
//! are written as a bench document (`palisade_test_support::bench`).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use palisade_fence::device::{Credentials, DeviceOptions};
use palisade_fence::target::{
    IpmiTarget, PduTarget, SnmpAuthProtocol, SnmpSecurityLevel, SnmpVersion, Target,
};
use palisade_fence::verify::VerifyPolicy;
use palisade_fence::{Device, PowerDevice, PowerState, Secret};
use palisade_lab::{Lab, LabConfig, PduInfo};
use palisade_test_support::bench::{self, Figure, Stat};
use serde_json::json;

/// Per external command.
const COMMAND_TIMEOUT_S: u32 = 60;

fn main() -> anyhow::Result<()> {
    let run = bench::Run::start("agents");
    let (out, args) = bench::out_flag(std::env::args().skip(1).collect())?;
    let mut args = args.into_iter();
    let iterations: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(15);
    let machines: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(20);
    if !(3..=50).contains(&iterations) || !(4..=40).contains(&machines) {
        bail!("iterations must be 3..=50 and machines 4..=40 (the PDU rows use machine 3)");
    }
    eprintln!("starting a lab with {machines} machines and a PDU ...");
    let lab = Lab::start(LabConfig {
        machines,
        control_plane: false,
        pdu: true,
        outlets_per_machine: 1,
        machine_command: "exec sleep infinity".into(),
        ..Default::default()
    })
    .context("starting the lab")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    wait(&lab, 0..machines, true, Duration::from_secs(60))?;

    let mut rows: Vec<Row> = Vec::new();
    let bin = palisade_lab::bin_path("palisade-fence").context("palisade-fence binary")?;

    // --- IPMI status ------------------------------------------------------------------
    let dev0 = ipmi(&lab, 0, Some(3))?;
    let mut ours_lib = Vec::new();
    let mut ours_cli = Vec::new();
    let mut fence = Vec::new();
    let mut ipmitool = Vec::new();
    for _ in 0..iterations {
        ours_lib.push(time(|| {
            let s = rt.block_on(dev0.status())?;
            ensure(s == PowerState::On, "status on")
        })?);
        ours_cli.push(time(|| {
            stdin_cmd(
                bin.to_str().unwrap_or_default(),
                &ipmi_stdin(&lab, 0, "status"),
                0,
            )
        })?);
        fence.push(time(|| {
            stdin_cmd("fence_ipmilan", &ipmi_stdin(&lab, 0, "status"), 0)
        })?);
        ipmitool.push(time(|| ipmitool_status(&lab, 0))?);
    }
    rows.push(Row::new(
        "IPMI status: palisade (library, session per call)",
        &ours_lib,
        "fence_ipmilan --lanplus --cipher=3",
        &fence,
    ));
    rows.push(Row::new(
        "IPMI status: palisade (library)",
        &ours_lib,
        "ipmitool -I lanplus -C 3",
        &ipmitool,
    ));
    rows.push(Row::new(
        "IPMI status: palisade-fence CLI (process)",
        &ours_cli,
        "fence_ipmilan --lanplus --cipher=3",
        &fence,
    ));

    // --- IPMI verified off ---------------------------------------------------------------
    let dev1 = ipmi(&lab, 1, Some(3))?;
    let off_iters = iterations.min(7);
    let mut ours_off = Vec::new();
    let mut gap = Vec::new();
    let mut fence_off = Vec::new();
    for _ in 0..off_iters {
        wait(&lab, 1..2, true, Duration::from_secs(30))?;
        let watcher = PowerWatcher::start(&lab, 1);
        let t0 = Instant::now();
        let ev = rt.block_on(dev1.off())?;
        let ours = t0.elapsed();
        ours_off.push(ours);
        // How long after the simulated machine actually died did we hold the evidence?
        if let Some(dead_at) = watcher.finish() {
            let verified_at = t0 + ev.command_to_verified();
            gap.push(verified_at.saturating_duration_since(dead_at));
        }
        rt.block_on(dev1.on())?;
        wait(&lab, 2..3, true, Duration::from_secs(30))?;
        fence_off.push(time(|| {
            stdin_cmd("fence_ipmilan", &ipmi_stdin(&lab, 2, "off"), 0)
        })?);
        stdin_cmd("fence_ipmilan", &ipmi_stdin(&lab, 2, "on"), 0)?;
    }
    rows.push(Row::new(
        "IPMI off (verified): palisade",
        &ours_off,
        "fence_ipmilan -o off",
        &fence_off,
    ));
    rows.push(Row::single(
        "IPMI off: evidence after machine death (lab observed)",
        &gap,
    ));

    // --- PDU --------------------------------------------------------------------------
    let plug = lab.machines()[3].outlets()[0];
    let pdu3 = pdu(&lab, &[plug])?;
    let mut pdu_status = Vec::new();
    let mut pdu_cli = Vec::new();
    let mut apc_status = Vec::new();
    for _ in 0..iterations {
        pdu_status.push(time(|| {
            let s = rt.block_on(pdu3.status())?;
            ensure(s == PowerState::On, "pdu status on")
        })?);
        pdu_cli.push(time(|| {
            stdin_cmd(
                bin.to_str().unwrap_or_default(),
                &pdu_stdin(&lab, plug, "status")?,
                0,
            )
        })?);
        apc_status.push(time(|| {
            stdin_cmd("fence_apc_snmp", &pdu_stdin(&lab, plug, "status")?, 0)
        })?);
    }
    rows.push(Row::new(
        "PDU status: palisade (library, v2c)",
        &pdu_status,
        "fence_apc_snmp -o status",
        &apc_status,
    ));
    rows.push(Row::new(
        "PDU status: palisade-fence CLI (process)",
        &pdu_cli,
        "fence_apc_snmp -o status",
        &apc_status,
    ));
    let mut pdu_off = Vec::new();
    let mut apc_off = Vec::new();
    for _ in 0..off_iters {
        wait(&lab, 3..4, true, Duration::from_secs(30))?;
        pdu_off.push(time(|| {
            rt.block_on(pdu3.off()).map(|_| ()).map_err(Into::into)
        })?);
        rt.block_on(pdu3.on())?;
        wait(&lab, 3..4, true, Duration::from_secs(30))?;
        apc_off.push(time(|| {
            stdin_cmd("fence_apc_snmp", &pdu_stdin(&lab, plug, "off")?, 0)
        })?);
        stdin_cmd("fence_apc_snmp", &pdu_stdin(&lab, plug, "on")?, 0)?;
    }
    rows.push(Row::new(
        "PDU off (verified): palisade",
        &pdu_off,
        "fence_apc_snmp -o off",
        &apc_off,
    ));

    // --- Redfish -----------------------------------------------------------------------------
    rows.extend(redfish_rows(&rt, iterations, &bin)?);

    // --- concurrent fencing -----------------------------------------------------------------
    wait(&lab, 0..machines, true, Duration::from_secs(60))?;
    let devices: Vec<Arc<Device>> = (0..machines)
        .map(|i| ipmi(&lab, i, Some(3)).map(Arc::new))
        .collect::<anyhow::Result<_>>()?;
    let rss_before = rss_kib();
    let t0 = Instant::now();
    let results = rt.block_on(futures::future::join_all(devices.iter().map(|d| {
        let d = d.clone();
        async move { d.off().await }
    })));
    let all = t0.elapsed();
    let rss_after = rss_kib();
    let failures = results.iter().filter(|r| r.is_err()).count();
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        eprintln!("concurrent off failed: {r}");
    }
    let dead = (0..machines)
        .filter(|i| !lab.machines()[*i].is_powered())
        .count();
    let _ = rt.block_on(futures::future::join_all(devices.iter().map(|d| {
        let d = d.clone();
        async move { d.on().await }
    })));

    // --- report -----------------------------------------------------------------------------
    println!();
    println!("palisade-fence benchmark: {iterations} iterations ({off_iters} for off), medians (p50), same lab simulators");
    println!(
        "{:<58} {:>10} {:<38} {:>10} {:>8}",
        "operation (ours)", "ours", "peer", "peer", "ratio"
    );
    for r in &rows {
        match &r.peer {
            Some((name, m)) => println!(
                "{:<58} {:>10} {:<38} {:>10} {:>7.1}x",
                r.name,
                ms(r.ours.p50),
                name,
                ms(m.p50),
                m.p50.unwrap_or(0.0) / r.ours.p50.unwrap_or(0.0).max(1e-9)
            ),
            None => println!("{:<58} {:>10}", r.name, ms(r.ours.p50)),
        }
    }
    println!(
        "{machines} BMCs fenced concurrently (verified off): {} total, {failures} failures, {dead}/{machines} machines observed off, RSS {} KiB -> {} KiB",
        ms(Some(all.as_secs_f64() * 1e3)),
        rss_before,
        rss_after
    );
    if let Some(out) = &out {
        let mut figures: Vec<Figure> = rows.iter().map(Row::figure).collect();
        figures.push(Figure::new(
            format!("{machines} BMCs fenced concurrently (verified off), all done"),
            "ms",
            Stat::of([all.as_secs_f64() * 1e3]),
        ));
        figures.push(Figure::new(
            format!("{machines} BMCs fenced concurrently: failures"),
            "fences",
            Stat::of([failures as f64]),
        ));
        figures.push(Figure::new(
            format!("{machines} BMCs fenced concurrently: machines observed off"),
            "machines",
            Stat::of([dead as f64]),
        ));
        figures.push(Figure::new(
            "bench process RSS (the library's devices), after the concurrent fence",
            "MiB",
            Stat::of([rss_after as f64 / 1024.0]),
        ));
        run.write(
            out,
            json!({"iterations": iterations, "off_iterations": off_iters, "machines": machines}),
            &figures,
            json!({"rss_before_concurrent_kib": rss_before}),
        )
        .with_context(|| format!("writing {}", out.display()))?;
        println!("figures written to {}", out.display());
    }
    if failures > 0 {
        bail!("{failures} concurrent fences failed");
    }
    Ok(())
}

/// One row of the table: our samples' statistics (ms), and the peer's beside them.
struct Row {
    name: String,
    ours: Stat,
    peer: Option<(String, Stat)>,
}

impl Row {
    fn new(name: &str, ours: &[Duration], peer: &str, theirs: &[Duration]) -> Self {
        Self {
            name: name.into(),
            ours: millis(ours),
            peer: Some((peer.into(), millis(theirs))),
        }
    }
    fn single(name: &str, ours: &[Duration]) -> Self {
        Self {
            name: name.into(),
            ours: millis(ours),
            peer: None,
        }
    }
    fn figure(&self) -> Figure {
        let f = Figure::new(&self.name, "ms", self.ours);
        match &self.peer {
            Some((tool, theirs)) => f.beside(tool, *theirs),
            None => f,
        }
    }
}

/// The statistics of `v`, in milliseconds.
fn millis(v: &[Duration]) -> Stat {
    Stat::of(v.iter().map(|d| d.as_secs_f64() * 1e3))
}

fn ms(v: Option<f64>) -> String {
    format!("{:.1} ms", v.unwrap_or(0.0))
}

fn time(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    f()?;
    Ok(t0.elapsed())
}

fn ensure(ok: bool, what: &str) -> anyhow::Result<()> {
    if ok {
        Ok(())
    } else {
        bail!("unexpected result: {what}")
    }
}

fn wait(
    lab: &Lab,
    range: std::ops::Range<usize>,
    on: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    for i in range {
        lab.machines()[i].wait_power(on, timeout)?;
    }
    Ok(())
}

/// The Redfish rows: status (library and CLI) and verified off against `fence_redfish`, on one
/// sushy-emulator system each side (the test driver applies power changes at once).
fn redfish_rows(
    rt: &tokio::runtime::Runtime,
    iterations: usize,
    bin: &std::path::Path,
) -> anyhow::Result<Vec<Row>> {
    use palisade_fence::target::{RedfishAuth, RedfishTarget, RedfishTls};
    use palisade_lab::redfish::{Sushy, SushySystem};
    const OURS: &str = "6b8a4d1e-0c7f-4b0a-9a51-7d3c2e1f0a01";
    const THEIRS: &str = "6b8a4d1e-0c7f-4b0a-9a51-7d3c2e1f0a02";
    let dir = tempfile_dir("palisade-bench-sushy")?;
    let password = format!("bench-{}", std::process::id());
    let systems =
        [("bench-ours", OURS), ("bench-theirs", THEIRS)].map(|(name, uuid)| SushySystem {
            name: name.into(),
            uuid: uuid.into(),
            power_on: true,
        });
    eprintln!("starting sushy-emulator (libvirt test driver) ...");
    let sushy = Sushy::start_libvirt(&dir.join("sushy"), &systems, "admin", &password)
        .context("sushy-emulator (hack/install-deps.sh installs it)")?;
    let device = |uuid: &str| -> anyhow::Result<Device> {
        Ok(Device::new(
            Target::Redfish(RedfishTarget {
                host: "127.0.0.1".into(),
                port: sushy.port(),
                username: "admin".into(),
                systems_uri: None,
                system: None,
                system_uuid: Some(uuid.into()),
                tls: RedfishTls::CaFile(sushy.ca_file()),
                auth: RedfishAuth::Auto,
            }),
            &Credentials {
                password: Some(Secret::new(password.clone())),
                ..Default::default()
            },
            options(),
        )?)
    };
    let ours = device(OURS)?;
    // fence_redfish has no CA option: it verifies against the system store or not at all.
    let theirs = |action: &str| {
        format!(
            "action={action}\nip=127.0.0.1\nipport={}\nusername=admin\npassword={password}\nssl=1\nssl_insecure=1\nsystems_uri=/redfish/v1/Systems/{THEIRS}\npower_timeout=30\n",
            sushy.port()
        )
    };
    let ours_cli_opts = format!(
        "agent=fence_redfish\naction=status\nip=127.0.0.1\nipport={}\nusername=admin\npassword={password}\nssl=1\nssl_ca_file={}\nplug=bench-ours\npower_timeout=30\n",
        sushy.port(),
        sushy.ca_file().display()
    );
    let (mut lib, mut cli, mut peer) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iterations {
        lib.push(time(|| {
            let s = rt.block_on(ours.status())?;
            ensure(s == PowerState::On, "redfish status on")
        })?);
        cli.push(time(|| {
            stdin_cmd(bin.to_str().unwrap_or_default(), &ours_cli_opts, 0)
        })?);
        peer.push(time(|| stdin_cmd("fence_redfish", &theirs("status"), 0))?);
    }
    let (mut off, mut peer_off) = (Vec::new(), Vec::new());
    for _ in 0..iterations.min(7) {
        off.push(time(|| {
            rt.block_on(ours.off())?;
            Ok(())
        })?);
        rt.block_on(ours.on())?;
        peer_off.push(time(|| stdin_cmd("fence_redfish", &theirs("off"), 0))?);
        stdin_cmd("fence_redfish", &theirs("on"), 0)?;
    }
    drop(sushy);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(vec![
        Row::new(
            "Redfish status: palisade (library, session per call)",
            &lib,
            "fence_redfish -o status",
            &peer,
        ),
        Row::new(
            "Redfish status: palisade-fence CLI (process)",
            &cli,
            "fence_redfish -o status",
            &peer,
        ),
        Row::new(
            "Redfish off (verified): palisade",
            &off,
            "fence_redfish -o off",
            &peer_off,
        ),
    ])
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir(prefix: &str) -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    Ok(d)
}

fn options() -> DeviceOptions {
    DeviceOptions {
        exchange_timeout: Duration::from_millis(500),
        retries: 3,
        cipher_probe_timeout: Duration::from_millis(100),
        verify: VerifyPolicy {
            timeout: Duration::from_secs(20),
            interval: Duration::from_millis(20),
        },
        fencing_token: None,
    }
}

fn ipmi(lab: &Lab, i: usize, cipher: Option<u8>) -> anyhow::Result<Device> {
    let b = lab.machines()[i].bmc();
    Ok(Device::new(
        Target::Ipmi(IpmiTarget {
            host: b.host.to_string(),
            port: b.port,
            username: b.user.clone(),
            cipher,
            allow_weak_cipher_suites: false,
            system_guid: None,
        }),
        &Credentials {
            password: Some(Secret::from_file(&b.password_file)?),
            ..Default::default()
        },
        options(),
    )?)
}

fn pdu(lab: &Lab, outlets: &[u32]) -> anyhow::Result<Device> {
    let info = lab.pdu().context("no PDU")?.info();
    Ok(Device::new(
        Target::Pdu(PduTarget {
            host: info.host.to_string(),
            port: info.port,
            outlets: outlets.to_vec(),
            profile: "apc".into(),
            version: SnmpVersion::V2c,
            v3_user: None,
            v3_auth: SnmpAuthProtocol::Sha1,
            v3_level: SnmpSecurityLevel::AuthPriv,
        }),
        &Credentials {
            community: Some(Secret::new(PduInfo::secret(&info.community_rw_file)?)),
            ..Default::default()
        },
        options(),
    )?)
}

fn ipmi_stdin(lab: &Lab, i: usize, action: &str) -> String {
    let b = lab.machines()[i].bmc();
    format!(
        "action={action}\nip={}\nipport={}\nusername={}\npassword_script=cat {}\nlanplus=1\ncipher=3\n",
        b.host,
        b.port,
        b.user,
        b.password_file.display()
    )
}

fn pdu_stdin(lab: &Lab, plug: u32, action: &str) -> anyhow::Result<String> {
    let info = lab.pdu().context("no PDU")?.info();
    Ok(format!(
        "action={action}\nip={}\nipport={}\nplug={plug}\ncommunity={}\nsnmp_version=2c\n",
        info.host,
        info.port,
        PduInfo::secret(&info.community_rw_file)?
    ))
}

/// Runs `program` with options on stdin (secrets never on argv), bounded by `timeout`.
fn stdin_cmd(program: &str, stdin: &str, expect: i32) -> anyhow::Result<()> {
    let mut child = Command::new("timeout")
        .arg(COMMAND_TIMEOUT_S.to_string())
        .arg(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    if out.status.code() != Some(expect) {
        bail!(
            "{program} exited {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn ipmitool_status(lab: &Lab, i: usize) -> anyhow::Result<()> {
    let b = lab.machines()[i].bmc();
    let out = Command::new("timeout")
        .arg(COMMAND_TIMEOUT_S.to_string())
        .args(["ipmitool", "-I", "lanplus", "-C", "3", "-H"])
        .arg(b.host.to_string())
        .arg("-p")
        .arg(b.port.to_string())
        .args(["-U", &b.user, "-f"])
        .arg(&b.password_file)
        .args(["chassis", "power", "status"])
        .output()?;
    ensure(out.status.success(), "ipmitool status")
}

/// Watches a machine's power from the lab side and records when it died.
struct PowerWatcher {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Option<Instant>>,
}

impl PowerWatcher {
    fn start(lab: &Lab, i: usize) -> Self {
        let pidfile = lab.machines()[i].dir().join("boot.pid");
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = std::thread::spawn(move || {
            let pid = std::fs::read_to_string(&pidfile).ok()?.trim().to_string();
            let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop2.load(Ordering::SeqCst) && Instant::now() < deadline {
                if !proc_dir.exists() {
                    return Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            None
        });
        Self { stop, handle }
    }

    fn finish(self) -> Option<Instant> {
        // Give the watcher a moment to see the death it may be racing with.
        std::thread::sleep(Duration::from_millis(5));
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().ok().flatten()
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}
