//! The fence-agents contract, proven by Pacemaker itself. The `palisade-fence` CLI is put in
//! place as `/usr/sbin/fence_palisade`; its metadata validates against fence-agents'
//! `metadata.rng`; Debian's `pacemaker-fenced --stand-alone` registers IPMI, Redfish and PDU
//! devices with `stonith_admin -R`, validates good and bad options, fences (`-F`) and unfences
//! (`-U`) a lab machine through its IPMI BMC, fences it again through a Redfish BMC
//! (sushy-emulator, tied to the machine's power), and registers a two-level topology whose
//! first level (a BMC with a wrong password) can only fail and whose second (the PDU) fences
//! (stand-alone Pacemaker does not always try level 1 first: see the check below). The machines really go off.
//! Secrets reach the agent through files (`password_file`, `community_file`), never argv.

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::*;
use palisade_lab::redfish::Sushy;
use palisade_lab::Lab;
use palisade_test_support::eventually;

const FENCED: &str = "/usr/lib/pacemaker/pacemaker-fenced";
const AGENT: &str = "/usr/sbin/fence_palisade";
const RNG: &str = "/usr/share/cluster/relaxng/metadata.rng";

struct Fenced(Child);

impl Drop for Fenced {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn admin(args: &[&str]) -> Output {
    let out = Command::new("stonith_admin")
        .args(args)
        .output()
        .expect("stonith_admin (hack/install-deps.sh installs pacemaker-cli-utils)");
    eprintln!(
        "$ stonith_admin {}\n{}{}(exit {:?})",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        out.status.code()
    );
    out
}

fn ipmi_params(lab: &Lab, i: usize, password_file: &str) -> Vec<String> {
    let b = lab.machines()[i].bmc();
    [
        "agent=ipmilan".to_string(),
        format!("ip={}", b.host),
        format!("ipport={}", b.port),
        format!("username={}", b.user),
        format!("password_file={password_file}"),
        "lanplus=1".into(),
        "cipher=3".into(),
        format!("pcmk_host_list={}", lab.machines()[i].name()),
    ]
    .to_vec()
}

/// The results Pacemaker logged for its attempts on `target` with `device` ("... targeting
/// <target> using <device> returned <rc>"), in order.
fn results(log: &str, target: &str, device: &str) -> Vec<i64> {
    let marker = format!("targeting {target} using {device} returned ");
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find(&marker)? + marker.len()..];
            let end = rest
                .find(|c: char| c != '-' && !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
        .collect()
}

fn register(id: &str, params: &[String]) -> Output {
    let mut args = vec!["-R", id, "-a", "fence_palisade"];
    for p in params {
        args.push("-o");
        args.push(p);
    }
    admin(&args)
}

#[test]
fn pacemaker_registers_fences_unfences_and_falls_through_levels_with_palisade_fence() {
    for tool in [FENCED, RNG, "/usr/sbin/stonith_admin", "/usr/bin/xmllint"] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} is missing: hack/install-deps.sh installs pacemaker, pacemaker-cli-utils, libxml2-utils and fence-agents"
        );
    }
    // The CLI in place as a fence agent, and its metadata valid for Pacemaker.
    let _ = std::fs::remove_file(AGENT);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_palisade-fence"), AGENT)
        .expect("install fence_palisade");
    let meta = Command::new(AGENT)
        .args(["-o", "metadata"])
        .output()
        .unwrap();
    assert!(meta.status.success());
    let dir = tempfile::tempdir().unwrap();
    let meta_file = dir.path().join("metadata.xml");
    std::fs::write(&meta_file, &meta.stdout).unwrap();
    let check = Command::new("xmllint")
        .args(["--noout", "--relaxng", RNG])
        .arg(&meta_file)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let lab = lab(2, true, 1);
    for m in lab.machines() {
        m.wait_power(true, Duration::from_secs(30))
            .expect("machine boots");
    }
    assert!(
        Command::new("pgrep")
            .args(["-f", FENCED])
            .output()
            .unwrap()
            .stdout
            .is_empty(),
        "another pacemaker-fenced is running: stop it first"
    );
    let log = std::fs::File::create(lab.dir().join("pacemaker-fenced.out")).unwrap();
    let detail_log = lab.dir().join("pacemaker-fenced.log");
    let _fenced = Fenced(
        Command::new(FENCED)
            .arg("--stand-alone")
            .env("PCMK_logfile", &detail_log)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start pacemaker-fenced"),
    );
    eventually("pacemaker-fenced answers", Duration::from_secs(30), || {
        admin(&["--list-registered"]).status.success().then_some(())
    });

    // --validate: good options pass, a missing ip fails.
    let pw0 = lab.machines()[0].bmc().password_file.display().to_string();
    let good = ipmi_params(&lab, 0, &pw0);
    let mut args = vec!["--validate", "-a", "fence_palisade"];
    for p in &good {
        args.extend(["-o", p.as_str()]);
    }
    assert!(admin(&args).status.success(), "valid options validate");
    let bad: Vec<String> = good
        .iter()
        .filter(|p| !p.starts_with("ip="))
        .cloned()
        .collect();
    let mut args = vec!["--validate", "-a", "fence_palisade"];
    for p in &bad {
        args.extend(["-o", p.as_str()]);
    }
    assert!(
        !admin(&args).status.success(),
        "a missing ip does not validate"
    );

    // m0 through its BMC: fence, then unfence.
    assert!(register("ipmi-m0", &good).status.success());
    assert!(
        admin(&["-F", "m0", "--timeout", "60"]).status.success(),
        "fence m0"
    );
    lab.machines()[0]
        .wait_power(false, Duration::from_secs(30))
        .expect("m0 really went off");
    assert!(
        admin(&["-U", "m0", "--timeout", "60"]).status.success(),
        "unfence m0"
    );
    lab.machines()[0]
        .wait_power(true, Duration::from_secs(30))
        .expect("m0 is on again");

    // m0 again, through Redfish: a sushy-emulator system whose power is m0's (a change is
    // applied to the machine through its BMC before sushy reads it back), chosen by its UUID,
    // its certificate trusted through the CA file; the only level of m0's topology.
    let m0 = &lab.machines()[0];
    let redfish_password = format!("redfish-{}", std::process::id());
    let sushy = Sushy::for_machine(&lab.dir().join("sushy"), m0, "admin", &redfish_password)
        .expect("sushy-emulator starts (hack/install-deps.sh installs it)");
    let redfish_password_file = dir.path().join("redfish-password");
    std::fs::write(&redfish_password_file, format!("{redfish_password}\n")).unwrap();
    let redfish_params = vec![
        "agent=redfish".to_string(),
        "ip=127.0.0.1".into(),
        format!("ipport={}", sushy.port()),
        "username=admin".into(),
        format!("password_file={}", redfish_password_file.display()),
        "ssl=1".into(),
        format!("ssl_ca_file={}", sushy.ca_file().display()),
        format!("plug={}", m0.system_uuid()),
        "pcmk_host_list=m0".into(),
    ];
    // Only the Redfish device may fence m0 now (stand-alone Pacemaker picks any capable
    // device, whatever the topology says).
    assert!(
        admin(&["-D", "ipmi-m0"]).status.success(),
        "deregister ipmi-m0"
    );
    assert!(register("redfish-m0", &redfish_params).status.success());
    assert!(admin(&["-r", "m0", "-i", "1", "-v", "redfish-m0"])
        .status
        .success());
    assert!(
        admin(&["-F", "m0", "--timeout", "90"]).status.success(),
        "fence m0 through Redfish"
    );
    m0.wait_power(false, Duration::from_secs(30))
        .expect("m0 really went off through Redfish");
    // (Unfencing is proven through the BMC above. Through Redfish it once reported success
    // while m0 stayed off for 30 s on a loaded machine, cause not pinned: not claimed here.)
    let log = std::fs::read_to_string(&detail_log).unwrap_or_default();
    assert!(
        results(&log, "m0", "redfish-m0").contains(&0),
        "Pacemaker logged no success of redfish-m0 on m0:\n{}",
        log.lines()
            .filter(|l| l.contains("m0"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // m1: level 1 is its BMC with a wrong password (fails), level 2 the PDU outlet (succeeds).
    let wrong = dir.path().join("wrong-password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    assert!(register(
        "ipmi-m1-wrong",
        &ipmi_params(&lab, 1, &wrong.display().to_string())
    )
    .status
    .success());
    let pdu = lab.pdu().expect("pdu").info();
    let outlet = lab.machines()[1].outlets()[0];
    let pdu_params = vec![
        "agent=apc_snmp".to_string(),
        format!("ip={}", pdu.host),
        format!("ipport={}", pdu.port),
        format!("community_file={}", pdu.community_rw_file.display()),
        "snmp_version=2c".into(),
        format!("pcmk_host_map=m1:{outlet}"),
    ];
    assert!(register("pdu-m1", &pdu_params).status.success());
    assert!(admin(&["-r", "m1", "-i", "1", "-v", "ipmi-m1-wrong"])
        .status
        .success());
    assert!(admin(&["-r", "m1", "-i", "2", "-v", "pdu-m1"])
        .status
        .success());
    assert!(
        admin(&["-F", "m1", "--timeout", "90"]).status.success(),
        "fence m1 through level 2"
    );
    lab.machines()[1]
        .wait_power(false, Duration::from_secs(30))
        .expect("m1 really went off");
    // Pacemaker's own log: the PDU (level 2) fenced m1, and the BMC with the wrong password
    // (level 1) never succeeded. Stand-alone `pacemaker-fenced` does not always try level 1
    // first: it sometimes finds both devices able to fence m1 and runs the PDU at once ("Found
    // 2 matching devices", then "using pdu-m1 returned 0 (1 device remaining)"), so whether
    // level 1 was tried is printed, not required.
    let fell_through = |log: &str| {
        results(log, "m1", "ipmi-m1-wrong").iter().all(|r| *r != 0)
            && results(log, "m1", "pdu-m1").contains(&0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&detail_log).unwrap_or_default();
        if fell_through(&log) {
            eprintln!(
                "level 1 (the wrong password) was tried {} time(s) before the PDU",
                results(&log, "m1", "ipmi-m1-wrong").len()
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pacemaker did not log the PDU fencing m1 (and the wrong BMC never succeeding) within 30 s; what it logged about m1:\n{}",
            log.lines()
                .filter(|l| l.contains("m1"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // No secret ever went through argv: the registered parameters name files only.
    let listed = String::from_utf8_lossy(&admin(&["--list-registered"]).stdout).to_string();
    let community = palisade_lab::PduInfo::secret(&pdu.community_rw_file).unwrap();
    assert!(!listed.contains(&community));
    assert!(!listed.contains(&redfish_password));
}
