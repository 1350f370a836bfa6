//! `power-watch-bench`: the firmware-bridge serving the controller's power watch of a thousand
//! BMCs, beside the same watch read directly by the IPMI client, and one read at a time beside
//! `ipmitool`.
//!
//! Everything runs on 127.0.0.1. The BMCs are `palisade_ipmi::responder` BMCs in this process
//! (a UDP socket and a task each), each with a user and password of its own, offering cipher
//! suites 17 and 3, with a real RMCP+ session (RAKP, integrity, encryption) per read; one
//! machine in ten is off. Both routes read with suite 17 (configured, as in the bridge's
//! example inventory). The bridge is the real `firmware-bridge` daemon in its own process (so its
//! memory and CPU are its own, read from `/proc`), with an inventory naming every BMC and each
//! password in a file of its secret store.
//!
//! The watch does what the controller's does (`controller/operator/src/power.rs`): every
//! interval it reads the power of every machine, at most `--concurrency` (the controller's
//! 16) at once, each read bounded by 5 s, and a read still running at the next round is not
//! started again. Rounds alternate between the two routes, through the bridge (one mTLS client,
//! kept-alive connections) and direct (the `palisade-fence` IPMI client, one device per
//! machine, as the bridge's executor holds them), after one warm-up round each. A read that
//! fails, or reads the wrong state, is a failed read. Then `--sample` machines are read one at
//! a time by each route and by `ipmitool -I lanplus -C 17` when it is installed (a process per
//! read, the password in its environment), on the same suite as the two routes
//! (`agents/fence/tests/ipmitool_peer.rs` pins that ipmitool and these BMCs agree on its keys).
//!
//! With `--out FILE.json` the figures are written as a bench document
//! (`palisade_test_support::bench`). Built with the `bench` feature, beside the daemon.

#[path = "common/pki.rs"]
mod pki;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use palisade_fence::bridge::{chain, wire, BridgeClient, ClientSettings};
use palisade_fence::{Credentials, Device, DeviceOptions, PowerDevice, PowerState, Secret, Target};
use palisade_ipmi::responder::udp::Responder;
use palisade_ipmi::responder::{Bmc, BmcConfig};
use palisade_test_support::bench::{self, Figure, Stat};
use pki::Pki;
use serde_json::json;

/// The longest one watch read may take: the controller's `power::READ_BUDGET`.
const READ_BUDGET: Duration = Duration::from_secs(5);

/// Clock ticks per second in `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// The longest one `ipmitool` process may run.
const IPMITOOL_BUDGET: Duration = Duration::from_secs(15);

/// Flags.
#[derive(Debug, Parser)]
#[command(
    name = "power-watch-bench",
    about = "Measure the firmware-bridge serving the power watch of many BMCs (loopback only)"
)]
struct Args {
    /// BMCs, one UDP responder each (1 to 5,000).
    #[arg(long, default_value_t = 1000)]
    bmcs: usize,
    /// Measured watch rounds per route, after one warm-up round each.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// The watch's interval (the controller's `--power-watch-interval`), milliseconds.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Reads in flight at once (the controller's `power::CONCURRENCY`).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Machines read one at a time by each route and by ipmitool; 0: none.
    #[arg(long, default_value_t = 100)]
    sample: usize,
    /// Wall-clock limit of the watch, and again of the one-at-a-time sample, seconds.
    #[arg(long, default_value_t = 300)]
    max_seconds: u64,
    /// The `firmware-bridge` binary (default: the one beside this binary).
    #[arg(long)]
    bridge_bin: Option<PathBuf>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

impl Args {
    fn validate(&self) -> anyhow::Result<()> {
        if !(1..=5000).contains(&self.bmcs) {
            bail!("--bmcs must be 1 to 5000, not {}", self.bmcs);
        }
        if !(1..=1000).contains(&self.rounds) {
            bail!("--rounds must be 1 to 1000, not {}", self.rounds);
        }
        if !(10..=60_000).contains(&self.interval_ms) {
            bail!(
                "--interval-ms must be 10 to 60000, not {}",
                self.interval_ms
            );
        }
        if !(1..=256).contains(&self.concurrency) {
            bail!("--concurrency must be 1 to 256, not {}", self.concurrency);
        }
        if self.sample > self.bmcs {
            bail!(
                "--sample ({}) must not exceed --bmcs ({})",
                self.sample,
                self.bmcs
            );
        }
        if self.max_seconds == 0 {
            bail!("--max-seconds must be positive");
        }
        Ok(())
    }
}

/// How a read reaches the BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Through the firmware-bridge.
    Bridge,
    /// The `palisade-fence` IPMI client, from this process.
    Direct,
}

/// Whether machine `i` is on: every tenth is off.
fn is_on(i: usize) -> bool {
    i % 10 != 3
}

/// The machines: their BMCs, credentials and how each route reaches them.
struct Fleet {
    bmcs: Vec<Responder>,
    users: Vec<String>,
    passwords: Vec<String>,
    ids: Vec<String>,
    devices: Vec<Device>,
    client: BridgeClient,
}

impl Fleet {
    /// One read of machine `i` by `route`, bounded by [`READ_BUDGET`]: why it failed, if it
    /// did or read the wrong state.
    async fn read(&self, route: Route, i: usize) -> Result<(), String> {
        let read = async {
            match route {
                Route::Bridge => {
                    let r = self
                        .client
                        .power_status(&self.ids[i])
                        .await
                        .map_err(|e| chain(&e))?;
                    match r.power_state() {
                        Some(wire::PowerState::On) => Ok(true),
                        Some(wire::PowerState::Off) => Ok(false),
                        other => Err(format!("the bridge read {other:?}")),
                    }
                }
                Route::Direct => match self.devices[i].status().await {
                    Ok(PowerState::On) => Ok(true),
                    Ok(PowerState::Off) => Ok(false),
                    Ok(PowerState::Unknown) => Err("read unknown".to_string()),
                    Err(e) => Err(e.to_string()),
                },
            }
        };
        let on = tokio::time::timeout(READ_BUDGET, read)
            .await
            .map_err(|_| format!("no answer within {READ_BUDGET:?}"))??;
        check(i, on)
    }
}

fn check(i: usize, on: bool) -> Result<(), String> {
    if on == is_on(i) {
        Ok(())
    } else {
        Err(format!(
            "machine {i} read {} but is {}",
            word(on),
            word(!on)
        ))
    }
}

fn word(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// One watch round.
#[derive(Debug)]
struct Round {
    route: Route,
    warm_up: bool,
    /// From the tick until every read it started answered.
    duration: Duration,
    /// How long each answered read took, from its permit to its answer.
    reads: Vec<Duration>,
    /// Why each failed read failed.
    failed: Vec<String>,
    /// Machines not read because their read of an earlier round was still running.
    skipped: usize,
    /// The bridge's CPU time during the round (bridge rounds only).
    bridge_cpu: Option<Duration>,
    /// The bridge's resident memory at the end of the round, MiB (bridge rounds only).
    bridge_rss_mib: Option<f64>,
}

/// One round by `route`: every machine not still being read, at most `limit` at once.
async fn round(
    fleet: Arc<Fleet>,
    route: Route,
    warm_up: bool,
    limit: Arc<tokio::sync::Semaphore>,
    reading: Arc<Vec<AtomicBool>>,
    bridge_pid: u32,
) -> Round {
    let started = Instant::now();
    let cpu_before = (route == Route::Bridge)
        .then(|| cpu_time(bridge_pid))
        .flatten();
    let mut reads = tokio::task::JoinSet::new();
    let mut skipped = 0;
    for i in 0..fleet.ids.len() {
        if reading[i].swap(true, Ordering::SeqCst) {
            skipped += 1;
            continue;
        }
        let (fleet, limit, reading) = (fleet.clone(), limit.clone(), reading.clone());
        reads.spawn(async move {
            let r = {
                let _permit = limit
                    .acquire()
                    .await
                    .expect("the semaphore is never closed");
                let sent = Instant::now();
                let r = fleet.read(route, i).await;
                (sent.elapsed(), r)
            };
            reading[i].store(false, Ordering::SeqCst);
            r
        });
    }
    let mut r = Round {
        route,
        warm_up,
        duration: Duration::ZERO,
        reads: Vec::with_capacity(fleet.ids.len()),
        failed: Vec::new(),
        skipped,
        bridge_cpu: None,
        bridge_rss_mib: None,
    };
    while let Some(done) = reads.join_next().await {
        match done {
            Ok((took, Ok(()))) => r.reads.push(took),
            Ok((_, Err(why))) => r.failed.push(why),
            Err(e) => r.failed.push(format!("read task: {e}")),
        }
    }
    r.duration = started.elapsed();
    if route == Route::Bridge {
        r.bridge_cpu = cpu_before
            .zip(cpu_time(bridge_pid))
            .map(|(a, b)| b.saturating_sub(a));
        r.bridge_rss_mib = status_kib(bridge_pid, "VmRSS").map(|k| k as f64 / 1024.0);
    }
    r
}

/// `n` flags, all down: which machines a route is reading.
fn flags(n: usize) -> Arc<Vec<AtomicBool>> {
    Arc::new((0..n).map(|_| AtomicBool::new(false)).collect())
}

/// The CPU time (user and system) process `pid` has used.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: count fields after its closing parenthesis, which
    // start at field 3 (state); utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / USER_HZ))
}

/// A `kB` line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The soft limit of open files of this process.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// 64 random bits as 16 hex digits (a password: nothing here needs it to be strong).
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    // Every RandomState has fresh keys: the hash of anything is a random number.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    format!("{:016x}", h.finish())
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `data` to `path`, readable by its owner only.
fn write_private(path: &Path, data: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(data.as_bytes())?;
    Ok(())
}

/// The `firmware-bridge` daemon, in its own process.
struct BridgeProcess {
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
}

impl BridgeProcess {
    fn start(bin: &Path, config: &Path, log: PathBuf) -> anyhow::Result<Self> {
        let out = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(bin)
            .arg("--config")
            .arg(config)
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("the bridge exited at once")?;
        Ok(Self { child, pid, log })
    }

    /// The last lines of its log.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Waits until it answers `/healthz` (at most 60 s).
    async fn ready(&mut self, client: &BridgeClient) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the bridge exited ({status}):\n{}", self.log_tail());
            }
            match client.healthz().await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    bail!(
                        "the bridge is not ready after 60 s: {}\n{}",
                        chain(&e),
                        self.log_tail()
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Stops it with SIGTERM (its one shutdown path), killing it after 40 s.
    async fn stop(mut self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        match tokio::time::timeout(Duration::from_secs(40), self.child.wait()).await {
            Ok(status) if status.as_ref().is_ok_and(|s| s.success()) => Ok(()),
            Ok(status) => bail!("the bridge stopped with {status:?}:\n{}", self.log_tail()),
            Err(_) => {
                self.child.kill().await?;
                bail!("the bridge did not stop within 40 s of SIGTERM")
            }
        }
    }
}

/// Where `name` is on `PATH`, if anywhere.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|f| f.is_file())
}

/// One `ipmitool -I lanplus -C 17 … chassis power status` of machine `i`, its password in the
/// environment (`-E`), never on the command line.
async fn ipmitool_read(bin: &Path, fleet: &Fleet, i: usize) -> Result<(), String> {
    let port = fleet.bmcs[i].addr().port().to_string();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["-I", "lanplus", "-C", "17", "-H", "127.0.0.1", "-p", &port])
        .args(["-U", &fleet.users[i], "-E", "-N", "1", "-R", "3"])
        .args(["chassis", "power", "status"])
        .env("IPMI_PASSWORD", &fleet.passwords[i])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(IPMITOOL_BUDGET, cmd.output())
        .await
        .map_err(|_| format!("ipmitool: no answer within {IPMITOOL_BUDGET:?}"))?
        .map_err(|e| format!("ipmitool: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let on = if text.contains("Chassis Power is on") {
        true
    } else if text.contains("Chassis Power is off") {
        false
    } else {
        return Err(format!(
            "ipmitool ({}): {} {}",
            out.status,
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    };
    check(i, on)
}

/// The statistics of `v`, in milliseconds.
fn millis(v: impl IntoIterator<Item = Duration>) -> Stat {
    Stat::of(v.into_iter().map(|d| d.as_secs_f64() * 1e3))
}

fn ms(v: Option<f64>) -> String {
    format!("{:.2} ms", v.unwrap_or(f64::NAN))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.validate()?;
    let need = args.bmcs as u64 + 4 * args.concurrency as u64 + 256;
    match open_files_limit() {
        Some(limit) if limit < need => bail!(
            "{} BMCs need about {need} open files and the limit is {limit}: run `ulimit -n {need}` first",
            args.bmcs
        ),
        _ => {}
    }
    let bridge_bin = match &args.bridge_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("firmware-bridge"),
    };
    if !bridge_bin.is_file() {
        bail!(
            "no firmware-bridge binary at {}: build it (`cargo build --release -p palisade-bridge --features bench`) or pass --bridge-bin",
            bridge_bin.display()
        );
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = palisade_bridge::server::runtime().context("tokio runtime")?;
    rt.block_on(run(args, bridge_bin))
}

async fn run(args: Args, bridge_bin: PathBuf) -> anyhow::Result<()> {
    let bench_run = bench::Run::start("powerwatch");
    let n = args.bmcs;
    let dir = std::env::temp_dir().join(format!("power-watch-bench-{}", std::process::id()));
    // A leftover of an earlier run with the same process ID would refuse the new secrets.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("secrets"))?;
    let scratch = Scratch(dir.clone());

    // The BMCs, and the bridge's inventory of them with a password file each.
    let pki = Pki::new()?;
    let server = pki.issue(vec!["127.0.0.1".into()], "firmware-bridge", true)?;
    let client_cert = pki.issue(vec![], "watch", false)?;
    write_private(&dir.join("server.key"), &server.1)?;
    std::fs::write(dir.join("server.crt"), &server.0)?;
    std::fs::write(dir.join("ca.crt"), pki.ca.pem())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut cfg = format!(
        "listen = \"127.0.0.1:{port}\"\nstate_dir = \"state\"\n\
         [tls]\ncert = \"server.crt\"\nkey = \"server.key\"\nclient_ca = \"ca.crt\"\n\
         # One client reads every machine every round: a rate limit sized for it.\n\
         [rate_limit]\nburst = 1000000\nper_second = 1000000.0\n\
         [[policy]]\nclient = \"cn:watch\"\ntargets = [\"*\"]\n"
    );
    let (mut bmcs, mut users, mut passwords, mut ids, mut devices) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    for i in 0..n {
        let (user, password, id) = (format!("bmc{i}"), random_hex(), format!("m{i}"));
        let mut config = BmcConfig::suite_17(&user, &password);
        config.suites = vec![17, 3];
        config.power_on = is_on(i);
        let bmc = Responder::bind(any, Bmc::new(config))
            .await
            .with_context(|| format!("binding BMC {i}"))?;
        let url = format!("ipmi://127.0.0.1:{}?cipher=17", bmc.addr().port());
        let secret = dir.join("secrets").join(format!("{id}.pass"));
        write_private(&secret, &password)?;
        cfg.push_str(&format!(
            "[[targets]]\nid = \"{id}\"\n[[targets.levels]]\nname = \"ipmi\"\n\
             [[targets.levels.devices]]\nurl = \"{url}\"\nusername = \"{user}\"\n\
             secrets = {{ password = {{ file = \"{}\" }} }}\n",
            secret.display()
        ));
        let target = Target::parse(&url.replacen("ipmi://", &format!("ipmi://{user}@"), 1))?;
        let creds = Credentials {
            password: Some(Secret::new(password.as_str())),
            ..Default::default()
        };
        devices.push(Device::new(target, &creds, DeviceOptions::default())?);
        bmcs.push(bmc);
        users.push(user);
        passwords.push(password);
        ids.push(id);
    }
    let config_path = dir.join("bridge.toml");
    std::fs::write(&config_path, cfg)?;

    let url: url::Url = format!("https://127.0.0.1:{port}/").parse()?;
    let client = BridgeClient::new(&ClientSettings::new(
        url,
        pki.ca.pem().into_bytes(),
        client_cert.0.into_bytes(),
        client_cert.1.into_bytes(),
    ))?;
    let mut bridge = BridgeProcess::start(&bridge_bin, &config_path, dir.join("bridge.log"))?;
    bridge.ready(&client).await?;
    let pid = bridge.pid;
    let rss_idle = status_kib(pid, "VmRSS").map(|k| k as f64 / 1024.0);
    println!(
        "{n} BMCs (suites 17 and 3, one in ten off) on 127.0.0.1; firmware-bridge pid {pid} ready, {:.1} MiB resident",
        rss_idle.unwrap_or(f64::NAN)
    );
    let fleet = Arc::new(Fleet {
        bmcs,
        users,
        passwords,
        ids,
        devices,
        client,
    });

    // The watch: one warm-up round per route, then the routes alternately.
    let every = Duration::from_millis(args.interval_ms);
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let limit = Arc::new(tokio::sync::Semaphore::new(args.concurrency));
    let (reading_bridge, reading_direct) = (flags(n), flags(n));
    let plan = [(Route::Bridge, true), (Route::Direct, true)]
        .into_iter()
        .chain((0..args.rounds).flat_map(|_| [(Route::Bridge, false), (Route::Direct, false)]));
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut running = tokio::task::JoinSet::new();
    let mut limited = false;
    for (k, (route, warm_up)) in plan.enumerate() {
        interval.tick().await;
        if Instant::now() > deadline {
            limited = true;
            println!(
                "wall-clock limit of {} s reached: no more rounds",
                args.max_seconds
            );
            break;
        }
        let reading = match route {
            Route::Bridge => reading_bridge.clone(),
            Route::Direct => reading_direct.clone(),
        };
        let r = round(fleet.clone(), route, warm_up, limit.clone(), reading, pid);
        running.spawn(async move { (k, r.await) });
    }
    let mut rounds = Vec::new();
    while let Some(r) = running.join_next().await {
        rounds.push(r?);
    }
    rounds.sort_by_key(|(k, _)| *k);
    let rounds: Vec<Round> = rounds.into_iter().map(|(_, r)| r).collect();
    let measured = |route| {
        rounds
            .iter()
            .filter(move |r| r.route == route && !r.warm_up)
    };
    let reads = |route| millis(measured(route).flat_map(|r| r.reads.iter().copied()));
    let round_times = |route| millis(measured(route).map(|r| r.duration));
    let failed = |route| measured(route).map(|r| r.failed.len()).sum::<usize>();
    let skipped = |route| measured(route).map(|r| r.skipped).sum::<usize>();
    let (bridge_reads, direct_reads) = (reads(Route::Bridge), reads(Route::Direct));
    let (bridge_rounds, direct_rounds) = (round_times(Route::Bridge), round_times(Route::Direct));
    let (bridge_failed, direct_failed) = (failed(Route::Bridge), failed(Route::Direct));
    let bridge_cpu = millis(measured(Route::Bridge).filter_map(|r| r.bridge_cpu));
    let bridge_rss = Stat::of(measured(Route::Bridge).filter_map(|r| r.bridge_rss_mib));
    let rounds_done = measured(Route::Bridge)
        .count()
        .min(measured(Route::Direct).count());
    println!(
        "watch of {n} machines every {} ms, {} reads at once, {rounds_done} measured rounds per route:",
        args.interval_ms, args.concurrency
    );
    for (name, r, t, f) in [
        (
            "through the bridge",
            &bridge_reads,
            &bridge_rounds,
            bridge_failed,
        ),
        (
            "direct IPMI client",
            &direct_reads,
            &direct_rounds,
            direct_failed,
        ),
    ] {
        println!(
            "  {name:<19}: read p50 {} p99 {}; round p50 {} p99 {}; {f} failed",
            ms(r.p50),
            ms(r.p99),
            ms(t.p50),
            ms(t.p99)
        );
    }
    println!(
        "  firmware-bridge    : CPU per round p50 {} p99 {}; resident p50 {:.1} MiB, p99 {:.1} MiB",
        ms(bridge_cpu.p50),
        ms(bridge_cpu.p99),
        bridge_rss.p50.unwrap_or(f64::NAN),
        bridge_rss.p99.unwrap_or(f64::NAN)
    );

    // One read at a time: each route, and ipmitool.
    let ipmitool = on_path("ipmitool");
    let ipmitool_version = match &ipmitool {
        Some(bin) => tokio::process::Command::new(bin)
            .arg("-V")
            .output()
            .await
            .ok()
            .map(|o| {
                let v = String::from_utf8_lossy(&o.stdout);
                v.trim().replacen("ipmitool version", "ipmitool", 1)
            }),
        None => None,
    };
    let (mut one_bridge, mut one_direct, mut one_ipmitool) = (Vec::new(), Vec::new(), Vec::new());
    let mut sample_failed: Vec<String> = Vec::new();
    let sample_deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    for k in 0..args.sample {
        if Instant::now() > sample_deadline {
            limited = true;
            println!(
                "wall-clock limit of {} s reached: sample stopped at {k}",
                args.max_seconds
            );
            break;
        }
        let i = k * n / args.sample;
        for route in [Route::Bridge, Route::Direct] {
            let t = Instant::now();
            match fleet.read(route, i).await {
                Ok(()) => match route {
                    Route::Bridge => one_bridge.push(t.elapsed()),
                    Route::Direct => one_direct.push(t.elapsed()),
                },
                Err(e) => sample_failed.push(format!("{route:?}: {e}")),
            }
        }
        if let Some(bin) = &ipmitool {
            let t = Instant::now();
            match ipmitool_read(bin, &fleet, i).await {
                Ok(()) => one_ipmitool.push(t.elapsed()),
                Err(e) => sample_failed.push(e),
            }
        }
    }
    let (one_bridge, one_direct, one_ipmitool) =
        (millis(one_bridge), millis(one_direct), millis(one_ipmitool));
    if args.sample > 0 {
        println!("one read at a time, {} machines:", args.sample);
        for (name, s) in [
            ("through the bridge", &one_bridge),
            ("direct IPMI client", &one_direct),
            ("ipmitool", &one_ipmitool),
        ] {
            println!(
                "  {name:<19}: p50 {} p99 {} ({} reads)",
                ms(s.p50),
                ms(s.p99),
                s.count
            );
        }
        if ipmitool.is_none() {
            println!("  (ipmitool is not installed: no peer)");
        }
    }

    // The BMCs' side: every session opened was closed.
    let (mut established, mut closed, mut open, mut dropped) = (0u64, 0u64, 0usize, 0u64);
    for b in &fleet.bmcs {
        let bmc = b.lock();
        let r = bmc.record();
        established += r.sessions_established;
        closed += r.sessions_closed;
        dropped += r.dropped;
        open += bmc.open_sessions();
    }
    let peak_mib = status_kib(pid, "VmHWM").map(|k| k as f64 / 1024.0);
    let stopped = bridge.stop().await;
    drop(scratch);
    stopped?;

    // Warm-up rounds included: no failed read is hidden.
    let failures = rounds.iter().map(|r| r.failed.len()).sum::<usize>() + sample_failed.len();
    let first_errors: Vec<&String> = rounds
        .iter()
        .flat_map(|r| r.failed.iter())
        .chain(sample_failed.iter())
        .take(10)
        .collect();
    for e in &first_errors {
        println!("failed read: {e}");
    }
    println!(
        "BMC sessions: {established} established, {closed} closed, {open} open at the end; {dropped} datagrams dropped"
    );
    if let Some(out) = &args.out {
        let watch = format!("{n} machines, {} at once", args.concurrency);
        let ipmitool_peer = format!(
            "{} -I lanplus -C 17 (a process per read)",
            ipmitool_version
                .clone()
                .unwrap_or_else(|| "ipmitool (not installed)".into())
        );
        let figures = [
            Figure::new(
                format!("watch read through the firmware-bridge ({watch})"),
                "ms",
                bridge_reads,
            )
            .beside(
                "palisade-fence IPMI client directly, same watch",
                direct_reads,
            ),
            Figure::new(
                format!("watch round through the firmware-bridge ({watch}, all read)"),
                "ms",
                bridge_rounds,
            )
            .beside("palisade-fence IPMI client directly", direct_rounds),
            Figure::new(
                "watch: failed reads through the firmware-bridge",
                "reads",
                Stat::of([bridge_failed as f64]),
            )
            .beside(
                "palisade-fence IPMI client directly",
                Stat::of([direct_failed as f64]),
            ),
            Figure::new(
                "one read at a time through the firmware-bridge",
                "ms",
                one_bridge,
            )
            .beside(ipmitool_peer.clone(), one_ipmitool),
            Figure::new(
                "one read at a time, palisade-fence IPMI client directly",
                "ms",
                one_direct,
            )
            .beside(ipmitool_peer, one_ipmitool),
            Figure::new(
                format!("firmware-bridge CPU per watch round ({n} reads)"),
                "ms",
                bridge_cpu,
            ),
            Figure::new(
                "firmware-bridge resident memory during the watch",
                "MiB",
                bridge_rss,
            ),
        ];
        let round_rows: Vec<_> = rounds
            .iter()
            .map(|r| {
                json!({
                    "route": format!("{:?}", r.route).to_lowercase(),
                    "warm_up": r.warm_up,
                    "duration_ms": r.duration.as_secs_f64() * 1e3,
                    "reads": r.reads.len(),
                    "failed": r.failed.len(),
                    "skipped": r.skipped,
                    "bridge_cpu_ms": r.bridge_cpu.map(|d| d.as_secs_f64() * 1e3),
                    "bridge_rss_mib": r.bridge_rss_mib,
                })
            })
            .collect();
        bench_run
            .write(
                out,
                json!({"bmcs": n, "rounds": args.rounds, "interval_ms": args.interval_ms,
                    "concurrency": args.concurrency, "read_budget_s": READ_BUDGET.as_secs(),
                    "sample": args.sample, "max_seconds": args.max_seconds,
                    "cipher_suite": 17, "ipmitool_cipher_suite": 17,
                    "ipmitool": ipmitool_version}),
                &figures,
                json!({"rounds": round_rows, "skipped_bridge": skipped(Route::Bridge),
                    "skipped_direct": skipped(Route::Direct), "wall_clock_limited": limited,
                    "bridge_rss_idle_mib": rss_idle, "bridge_rss_peak_mib": peak_mib,
                    "bmc_sessions": {"established": established, "closed": closed,
                        "open_at_end": open, "datagrams_dropped": dropped},
                    "first_errors": first_errors}),
            )
            .with_context(|| format!("writing {}", out.display()))?;
        println!("figures written to {}", out.display());
    }
    if failures > 0 {
        bail!("{failures} failed reads (the figures are written, but a run with failures is not a result)");
    }
    if open > 0 {
        bail!("{open} BMC sessions were left open");
    }
    Ok(())
}
