//! Optional hardware watchdog petting (`--watchdog /dev/watchdog`).
//!
//! The Linux watchdog reboots the machine unless its device is written to within its timeout.
//! The agent writes to it only while its Lease is being renewed (the last renewal is at most
//! `max_lease_age` old, i.e. `--self-fence-after`). So:
//! - a hung agent (a stuck runtime, a deadlock) stops petting, and the machine reboots;
//! - an agent that lost the API stops petting once it self-fences, and the machine reboots
//!   a watchdog timeout later, which is a hard guarantee that nothing of its pods survives
//!   even if killing them failed;
//! - the one exception is a control-plane outage: while a strict majority of peers excuses the
//!   node (see [`crate::peer`]) and it has not self-fenced, petting goes on. An excuse that
//!   lapses stops it for good (until a renewal), like the self-fence it latches.
//!
//! On a clean shutdown it writes the magic close character `V` before closing the device, so
//! the kernel disarms the watchdog instead of rebooting (unless the driver is `nowayout`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use palisade_model::advertise::Virtualization;
use parking_lot::Mutex;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::watchdog_device::{ArmRequest, Armed, Expiry};

/// The byte written to pet the watchdog (any byte but `V` works).
pub const PET: &[u8] = b"1";
/// The magic close character: disarms the watchdog on close.
pub const MAGIC_CLOSE: &[u8] = b"V";

/// Errors of the watchdog.
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    /// The device could not be opened or written.
    #[error("watchdog {path}: {what}: {source}")]
    Io {
        /// The device.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// How the watchdog is petted.
#[derive(Debug, Clone)]
pub struct WatchdogConfig {
    /// The device (normally `/dev/watchdog`). It must exist: it is never created.
    pub path: PathBuf,
    /// How often to pet it (well below the device's timeout).
    pub interval: Duration,
    /// Pet only while the last Lease renewal is at most this old.
    pub max_lease_age: Duration,
}

/// Whether to pet now: only while the Lease is fresh, or while the peers excuse the node
/// (`excused`: a control-plane outage vouched by a majority) and it has not self-fenced.
pub fn should_pet(lease_age: Duration, max_lease_age: Duration, excused: bool) -> bool {
    lease_age <= max_lease_age || excused
}

/// Whether a starting agent opens its watchdog at once (opening it, and arming it, pet it):
/// only when its last recorded renewal (`last_renewal_age`) is at most `self_fence_after` old,
/// or none was recorded (a first start: no earlier self-fence to postpone).
///
/// Guarantees: after a stale record the agent opens the device only once it has renewed again
/// ([`renewed_since_start`]), so a restart never postpones the reset that the last pet before
/// the self-fence scheduled, which the controller's trust counts on
/// (`palisade_model::advertise::Advertisement::trust`: the death of the agent that held the
/// device adds one pet, which that wait covers; a restart after it adds none).
pub fn opens_at_start(last_renewal_age: Option<Duration>, self_fence_after: Duration) -> bool {
    last_renewal_age.is_none_or(|age| age <= self_fence_after)
}

/// Waits for a renewal after the one `renewed` holds now (the starting value, which a stale
/// record backdates, does not count); `false` if `shutdown` came first or a channel closed.
pub async fn renewed_since_start(
    renewed: &mut watch::Receiver<Instant>,
    mut shutdown: watch::Receiver<bool>,
) -> bool {
    renewed.borrow_and_update();
    tokio::select! {
        r = renewed.changed() => r.is_ok(),
        _ = async {
            while shutdown.changed().await.is_ok() {
                if *shutdown.borrow() {
                    break;
                }
            }
        } => false,
    }
}

/// Opens the device for writing (never creating it).
pub fn open(path: &Path) -> Result<std::fs::File, WatchdogError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|source| WatchdogError::Io {
            path: path.to_path_buf(),
            what: "open",
            source,
        })
}

/// Pets `dev` every `cfg.interval` while the Lease (last renewal on `renewed`) is fresh, until
/// `shutdown` turns true; then closes the device, disarming it with the magic close only when
/// `may_disarm()` says no fence-eligible container runs any more.
///
/// Guarantees: no write happens while the last renewal is older than `cfg.max_lease_age`,
/// unless `excused` holds at that instant and `fence` is not active;
/// [`MAGIC_CLOSE`] is written only at shutdown and only when `may_disarm()` returned true, so
/// a clean stop with containers still running leaves the watchdog armed (the machine resets
/// at its timeout unless a new agent pets it).
pub async fn run(
    cfg: WatchdogConfig,
    mut dev: std::fs::File,
    renewed: watch::Receiver<Instant>,
    excused: crate::node::Excused,
    fence: watch::Receiver<crate::pod_worker::FenceState>,
    mut shutdown: watch::Receiver<bool>,
    may_disarm: std::sync::Arc<dyn Fn() -> bool + Send + Sync>,
) -> Result<(), WatchdogError> {
    let io = |what| {
        let path = cfg.path.clone();
        move |source| WatchdogError::Io { path, what, source }
    };
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut petting = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = shutdown.changed() => {
                if r.is_err() || *shutdown.borrow() {
                    break;
                }
                continue;
            }
        }
        let age = renewed.borrow().elapsed();
        let ex = crate::node::excused_at(&excused, Instant::now()) && !fence.borrow().active;
        let pet = should_pet(age, cfg.max_lease_age, ex);
        if pet != petting {
            if pet {
                tracing::info!("Lease renewed again: petting the watchdog again");
            } else {
                tracing::warn!(
                    age_ms = age.as_millis() as u64,
                    "Lease not renewed: no longer petting the watchdog (the machine reboots at its timeout)"
                );
            }
            petting = pet;
        }
        if pet {
            dev.write_all(PET).map_err(io("pet"))?;
            dev.flush().map_err(io("pet"))?;
        }
    }
    if !may_disarm() {
        drop(dev);
        tracing::warn!(
            "fence-eligible containers still run: leaving the watchdog armed (no magic close)"
        );
        return Ok(());
    }
    dev.write_all(MAGIC_CLOSE).map_err(io("magic close"))?;
    dev.flush().map_err(io("magic close"))?;
    drop(dev);
    tracing::info!("watchdog disarmed (magic close)");
    Ok(())
}

/// The watchdog as armed, shared by its service (which writes it) and the advertiser (which
/// reads it with every write of the Lease).
#[derive(Debug, Clone, Default)]
pub struct Held {
    armed: Arc<Mutex<Option<Armed>>>,
    expiry: Arc<Mutex<Option<Expiry>>>,
}

impl Held {
    /// The watchdog to advertise: what the kernel reported when it was armed, while its
    /// service pets it (`None`: not armed as asked, or no longer petted).
    pub fn advertised(&self) -> Option<palisade_model::advertise::Watchdog> {
        let armed = (*self.armed.lock())?;
        let expiry = self.expiry.lock();
        Some(palisade_model::advertise::Watchdog {
            timeout: armed.timeout,
            nowayout: armed.nowayout,
            action: expiry.as_ref().map(|e| e.action),
            driver: expiry.as_ref().and_then(|e| e.driver.clone()),
        })
    }
}

/// Everything a watchdog's service needs (see [`serve`]).
pub struct Service {
    /// How it is petted.
    pub cfg: WatchdogConfig,
    /// How it is armed.
    pub request: ArmRequest,
    /// The device, when it was opened at start ([`opens_at_start`]); `None`: it is opened
    /// only after the next renewal.
    pub opened: Option<std::fs::File>,
    /// Whether the machine is virtual (what the expiry does depends on it).
    pub virtualization: Virtualization,
    /// Where the armed state is published.
    pub held: Held,
    /// The send instant of the last successful renewal.
    pub renewed: watch::Receiver<Instant>,
    /// The peers' excuse.
    pub excused: crate::node::Excused,
    /// The self-fence state.
    pub fence: watch::Receiver<crate::pod_worker::FenceState>,
    /// Turns true at shutdown.
    pub shutdown: watch::Receiver<bool>,
    /// Whether a clean stop may disarm it (see [`run`]).
    pub may_disarm: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Told what was armed (`None` once it is no longer petted), for metrics.
    pub on_armed: Arc<dyn Fn(Option<Armed>) + Send + Sync>,
    /// Told when it could not be armed as asked, for metrics.
    pub on_arm_failure: Arc<dyn Fn() + Send + Sync>,
}

/// Opens (if [`Service::opened`] is `None`, once a renewal follows the start), arms and pets
/// the watchdog until shutdown, publishing what is armed in [`Service::held`].
///
/// Guarantees: [`Held::advertised`] is `Some` only between a successful
/// [`crate::watchdog_device::arm`] (what the kernel reported back, with the expiry action read
/// from the driver) and the end of the petting loop; a watchdog that cannot be armed as asked
/// is still petted (opening it started it) but never advertised. Petting follows [`run`].
pub async fn serve(s: Service) -> Result<(), WatchdogError> {
    let Service {
        cfg,
        request,
        opened,
        virtualization,
        held,
        mut renewed,
        excused,
        fence,
        shutdown,
        may_disarm,
        on_armed,
        on_arm_failure,
    } = s;
    let path = cfg.path.clone();
    let dev = match opened {
        Some(dev) => dev,
        None => {
            if !renewed_since_start(&mut renewed, shutdown.clone()).await {
                return Ok(());
            }
            tracing::info!(device = %path.display(), "Lease renewed: opening the watchdog");
            open(&path).inspect_err(|e| {
                tracing::error!(error = %e, "the watchdog cannot be opened: the self-fence is not advertised as trustworthy");
            })?
        }
    };
    // Opening armed it. Set its timeout and nowayout, and advertise only what the kernel
    // reports back.
    let ctl = crate::watchdog_device::Linux::new(&dev, &path, Path::new("/sys/class/watchdog"));
    let read = crate::watchdog_device::expiry(
        &crate::watchdog_device::ExpiryRoots {
            device: ctl.sysfs_dir(),
            sys: Path::new("/sys"),
            proc: Path::new("/proc"),
        },
        &virtualization,
    );
    tracing::info!(device = %path.display(), driver = ?read.driver, action = read.action.as_str(), "watchdog expiry action");
    *held.expiry.lock() = Some(read);
    match crate::watchdog_device::arm(&ctl, request) {
        Ok(armed) => {
            tracing::info!(device = %path.display(), timeout = ?armed.timeout, nowayout = armed.nowayout, "watchdog armed");
            on_armed(Some(armed));
            *held.armed.lock() = Some(armed);
        }
        Err(e) => {
            tracing::error!(error = %e, "watchdog not armed as asked: the self-fence is not advertised as trustworthy");
            on_arm_failure();
        }
    }
    tracing::info!(device = %path.display(), interval = ?cfg.interval, "petting the watchdog while the Lease is renewed");
    let r = run(cfg, dev, renewed, excused, fence, shutdown, may_disarm).await;
    // The petting loop is gone: stop advertising the watchdog (the machine still resets at
    // its timeout; what is withdrawn is only the claim).
    *held.armed.lock() = None;
    on_armed(None);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pets(path: &Path) -> usize {
        std::fs::read(path)
            .unwrap()
            .iter()
            .filter(|b| **b == PET[0])
            .count()
    }

    #[test]
    fn fresh_leases_are_petted_stale_ones_not() {
        let max = Duration::from_secs(4);
        assert!(should_pet(Duration::ZERO, max, false));
        assert!(should_pet(max, max, false));
        assert!(!should_pet(max + Duration::from_millis(1), max, false));
        assert!(should_pet(max + Duration::from_secs(60), max, true));
    }

    #[test]
    fn a_stale_renewal_record_defers_opening_the_watchdog() {
        let after = Duration::from_secs(8);
        assert!(opens_at_start(None, after), "a first start opens it");
        assert!(opens_at_start(Some(after), after));
        assert!(!opens_at_start(
            Some(after + Duration::from_millis(1)),
            after
        ));
        assert!(!opens_at_start(Some(Duration::MAX), after));
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_renewal_after_the_start_opens_a_deferred_watchdog() {
        // The starting value (fresh-looking or not) is not a renewal.
        let (renew_tx, mut renew_rx) = watch::channel(Instant::now());
        let (_stop_tx, stop_rx) = watch::channel(false);
        let waiting =
            tokio::spawn(async move { renewed_since_start(&mut renew_rx, stop_rx).await });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!waiting.is_finished(), "no renewal yet: not opened");
        renew_tx.send_replace(Instant::now());
        assert!(waiting.await.unwrap(), "renewed: opened");

        // Shutdown first: never opened.
        let (_renew_tx, mut renew_rx) = watch::channel(Instant::now());
        let (stop_tx, stop_rx) = watch::channel(false);
        let waiting =
            tokio::spawn(async move { renewed_since_start(&mut renew_rx, stop_rx).await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop_tx.send_replace(true);
        assert!(!waiting.await.unwrap());
    }

    #[test]
    fn the_device_is_never_created() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("watchdog");
        assert!(open(&p).is_err());
        assert!(!p.exists());
    }

    /// An empty file standing in for the device, and petting every second while the Lease is
    /// at most 2.5 s old.
    fn fake_device() -> (tempfile::TempDir, std::path::PathBuf, WatchdogConfig) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("watchdog");
        std::fs::write(&path, b"").unwrap();
        let cfg = WatchdogConfig {
            path: path.clone(),
            interval: Duration::from_secs(1),
            max_lease_age: Duration::from_millis(2_500),
        };
        (d, path, cfg)
    }

    #[tokio::test(start_paused = true)]
    async fn pets_only_while_the_lease_is_renewed_and_disarms_on_shutdown() {
        let (_d, path, cfg) = fake_device();
        let (renew_tx, renew_rx) = watch::channel(Instant::now());
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(
            cfg,
            open(&path).unwrap(),
            renew_rx,
            watch::channel(None).1,
            watch::channel(Default::default()).1,
            stop_rx,
            std::sync::Arc::new(|| true),
        ));

        // Renewed at t=0: pets at t=0, 1, 2; at t=3 the Lease is 3 s old (> 2.5 s).
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        assert_eq!(pets(&path), 3, "petting stops once the Lease is stale");

        // Renewals resume: so does petting.
        renew_tx.send_replace(Instant::now());
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let resumed = pets(&path);
        assert!(resumed > 3, "petting resumes after a renewal ({resumed})");

        stop_tx.send_replace(true);
        task.await.unwrap().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.last(), Some(&MAGIC_CLOSE[0]), "{bytes:?}");
        assert_eq!(bytes.iter().filter(|b| **b == MAGIC_CLOSE[0]).count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_excuse_keeps_petting_until_it_lapses_or_the_node_self_fences() {
        let (_d, path, cfg) = fake_device();
        let (_renew_tx, renew_rx) = watch::channel(Instant::now());
        let (ex_tx, ex_rx) = watch::channel(Some(Instant::now() + Duration::from_millis(6_500)));
        let (fence_tx, fence_rx) = watch::channel(crate::pod_worker::FenceState::default());
        let (_stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(run(
            cfg,
            open(&path).unwrap(),
            renew_rx,
            ex_rx,
            fence_rx,
            stop_rx,
            std::sync::Arc::new(|| true),
        ));
        // Stale from 2.5 s, excused until 6.5 s: pets at 0..=6 s.
        tokio::time::sleep(Duration::from_millis(9_500)).await;
        assert_eq!(pets(&path), 7, "petted while excused, not after");
        // Excused again, but the node self-fenced meanwhile: no petting.
        fence_tx.send_replace(crate::pod_worker::FenceState {
            active: true,
            all_pods: false,
        });
        ex_tx.send_replace(Some(Instant::now() + Duration::from_secs(60)));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            pets(&path),
            7,
            "a self-fenced node is never petted on an excuse"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_stop_with_containers_running_leaves_the_watchdog_armed() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("watchdog");
        std::fs::write(&path, b"").unwrap();
        let cfg = WatchdogConfig {
            path: path.clone(),
            interval: Duration::from_secs(1),
            max_lease_age: Duration::from_secs(5),
        };
        let (_renew_tx, renew_rx) = watch::channel(Instant::now());
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(
            cfg,
            open(&path).unwrap(),
            renew_rx,
            watch::channel(None).1,
            watch::channel(Default::default()).1,
            stop_rx,
            std::sync::Arc::new(|| false),
        ));
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        stop_tx.send_replace(true);
        task.await.unwrap().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(pets(&path) > 0, "{bytes:?}");
        assert!(
            !bytes.contains(&MAGIC_CLOSE[0]),
            "never disarmed while containers run: {bytes:?}"
        );
    }
}
