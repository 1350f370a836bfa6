//! The project's BMC (`palisade_ipmi::responder`) against a console no one here wrote:
//! `ipmitool -I lanplus` (installed by `hack/install-deps.sh`), on cipher suites 17 and 3.
//!
//! The responder and the `palisade-fence` IPMI client derive their session keys with the same
//! `palisade_ipmi::crypto`, so tests between the two agree whatever that code does: suite 17
//! keys derived from 32-byte constants logged in and worked between them, and failed every
//! in-session command against real BMCs. Here ipmitool's own keys must verify at the
//! responder (and the responder's at ipmitool) for the commands to be answered, and the
//! client then reads the same BMC on the same suite, which ties the client to ipmitool too.
//!
//! The password reaches ipmitool through `IPMI_PASSWORD` (`-E`), never its command line.

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use palisade_fence::device::{Credentials, DeviceOptions, PowerDevice};
use palisade_fence::target::{IpmiTarget, Target};
use palisade_fence::{Device, PowerState, Secret};
use palisade_ipmi::responder::udp::Responder;
use palisade_ipmi::responder::{Bmc, BmcConfig, Event};

const USER: &str = "admin";
const PASSWORD: &str = "ipmitool-s3cret";
/// Get Chassis Status and Chassis Control (NetFn Chassis, 0x00).
const GET_CHASSIS_STATUS: Event = Event::Command { netfn: 0, cmd: 1 };
const CHASSIS_CONTROL: Event = Event::Command { netfn: 0, cmd: 2 };
/// A bound on one ipmitool run against a hang (its own retries end well before).
const IPMITOOL_BOUND: Duration = Duration::from_secs(60);

/// The `ipmitool` on `PATH`; a missing peer fails the test rather than skipping it.
fn ipmitool_bin() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("ipmitool"))
        .find(|f| f.is_file())
        .expect(
            "ipmitool is not on PATH: this test needs the real peer (hack/install-deps.sh installs it)",
        )
}

/// A BMC that lists and accepts only `suite`, with the chassis on and every event kept.
async fn bmc(suite: u8) -> Responder {
    let mut config = BmcConfig::suite_17(USER, PASSWORD);
    config.suites = vec![suite];
    config.keep_events = true;
    Responder::bind("127.0.0.1:0".parse().unwrap(), Bmc::new(config))
        .await
        .unwrap()
}

/// One `ipmitool -I lanplus -C <suite> … <args>` run against `bmc`, asserted successful;
/// returns its standard output.
async fn ipmitool(bmc: &Responder, suite: u8, args: &[&str]) -> String {
    let port = bmc.addr().port().to_string();
    let suite = suite.to_string();
    let mut cmd = tokio::process::Command::new(ipmitool_bin());
    cmd.args([
        "-I",
        "lanplus",
        "-C",
        &suite,
        "-H",
        "127.0.0.1",
        "-p",
        &port,
    ])
    .args(["-U", USER, "-E", "-N", "1", "-R", "3"])
    .args(args)
    .env("IPMI_PASSWORD", PASSWORD)
    .stdin(Stdio::null())
    .kill_on_drop(true);
    let out: Output = tokio::time::timeout(IPMITOOL_BOUND, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("ipmitool {args:?} ran longer than {IPMITOOL_BOUND:?}"))
        .expect("ipmitool runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ipmitool -C {suite} {args:?} failed ({}): {stdout} {}\nBMC saw: {:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        bmc.record()
    );
    stdout
}

/// The `palisade-fence` IPMI device for `bmc`, configured with `suite`.
fn device(bmc: &Responder, suite: u8) -> Device {
    Device::new(
        Target::Ipmi(IpmiTarget {
            host: "127.0.0.1".into(),
            port: bmc.addr().port(),
            username: USER.into(),
            cipher: Some(suite),
            allow_weak_cipher_suites: false,
            system_guid: None,
        }),
        &Credentials {
            password: Some(Secret::new(PASSWORD)),
            ..Default::default()
        },
        DeviceOptions {
            exchange_timeout: Duration::from_millis(500),
            retries: 2,
            ..Default::default()
        },
    )
    .unwrap()
}

/// ipmitool reads the power, powers the chassis off and reads it again, each in a session
/// of `suite` that the BMC established and whose commands it answered; then the project's
/// client reads the same BMC on the same suite and powers it back on, which ipmitool reads.
async fn ipmitool_and_the_client_share_a_bmc_on(suite: u8) {
    let bmc = bmc(suite).await;

    let before = ipmitool(&bmc, suite, &["chassis", "power", "status"]).await;
    assert!(before.contains("Chassis Power is on"), "{before}");
    let off = ipmitool(&bmc, suite, &["chassis", "power", "off"]).await;
    assert!(off.contains("Chassis Power Control: Down/Off"), "{off}");
    assert!(!bmc.lock().power_on(), "the BMC carried out the Power Down");
    let after = ipmitool(&bmc, suite, &["chassis", "power", "status"]).await;
    assert!(after.contains("Chassis Power is off"), "{after}");

    let seen = bmc.record();
    assert_eq!(
        seen.open_session_suites(),
        vec![suite; 3],
        "{:?}",
        seen.events
    );
    assert_eq!(seen.sessions_established, 3, "{seen:?}");
    assert_eq!(
        seen.events
            .iter()
            .filter(|e| **e == CHASSIS_CONTROL)
            .count(),
        1,
        "{:?}",
        seen.events
    );
    assert!(
        seen.events
            .iter()
            .filter(|e| **e == GET_CHASSIS_STATUS)
            .count()
            >= 2,
        "{:?}",
        seen.events
    );
    // Keys that differ from ipmitool's show here first: its packets fail the integrity check
    // and are dropped unanswered.
    assert_eq!(seen.dropped, 0, "{seen:?}");

    // The project's client, on the same suite, against the BMC ipmitool just used.
    let d = device(&bmc, suite);
    assert_eq!(d.status().await.unwrap(), PowerState::Off);
    d.on().await.expect("on is verified");
    let Device::Ipmi(i) = &d else {
        panic!("an IPMI device")
    };
    assert_eq!(i.negotiated_suite(), Some(suite));
    let on = ipmitool(&bmc, suite, &["chassis", "power", "status"]).await;
    assert!(on.contains("Chassis Power is on"), "{on}");
    let seen = bmc.record();
    assert_eq!(seen.dropped, 0, "{seen:?}");
    assert_eq!(bmc.lock().open_sessions(), 0, "every session was closed");
}

#[tokio::test]
async fn ipmitool_and_the_client_agree_with_the_responder_on_suite_17_keys() {
    ipmitool_and_the_client_share_a_bmc_on(17).await;
}

#[tokio::test]
async fn ipmitool_and_the_client_agree_with_the_responder_on_suite_3_keys() {
    ipmitool_and_the_client_share_a_bmc_on(3).await;
}
