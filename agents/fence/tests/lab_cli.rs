//! The `palisade-fence` CLI against the lab, side by side with the real ClusterLabs
//! `fence_ipmilan` and `fence_apc_snmp` given the same stdin arguments.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use palisade_lab::{Lab, PduInfo};
use palisade_test_support::eventually;

fn run(program: &str, stdin: &str) -> Output {
    let mut child = Command::new(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn ours(stdin: &str) -> Output {
    run(env!("CARGO_BIN_EXE_palisade-fence"), stdin)
}

fn have(tool: &str) -> bool {
    std::path::Path::new(tool).exists()
}

fn ipmi_args(lab: &Lab, action: &str, password_script: &str) -> String {
    let b = lab.machines()[0].bmc();
    format!(
        "action={action}\nip={}\nipport={}\nusername={}\npassword_script={password_script}\nlanplus=1\ncipher=3\n",
        b.host, b.port, b.user
    )
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

#[test]
fn fence_ipmilan_style_stdin_gives_the_same_exit_codes_as_fence_ipmilan() {
    let lab = lab(1, false, 1);
    let m = &lab.machines()[0];
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
    let pw = format!("cat {}", m.bmc().password_file.display());
    let peer = have("/usr/sbin/fence_ipmilan").then_some("/usr/sbin/fence_ipmilan");

    let o = ours(&ipmi_args(&lab, "status", &pw));
    assert_eq!(code(&o), 0, "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("Status: ON"));
    if let Some(p) = peer {
        assert_eq!(code(&run(p, &ipmi_args(&lab, "status", &pw))), 0);
    }

    let o = ours(&ipmi_args(&lab, "off", &pw));
    assert_eq!(code(&o), 0, "{o:?}");
    m.wait_power(false, Duration::from_secs(10))
        .expect("machine is off");
    let o = ours(&ipmi_args(&lab, "status", &pw));
    assert_eq!(code(&o), 2, "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("Status: OFF"));
    if let Some(p) = peer {
        assert_eq!(code(&run(p, &ipmi_args(&lab, "status", &pw))), 2);
        // The peer powers it on; we see it.
        assert_eq!(code(&run(p, &ipmi_args(&lab, "on", &pw))), 0);
        m.wait_power(true, Duration::from_secs(20))
            .expect("machine boots");
        assert_eq!(code(&ours(&ipmi_args(&lab, "status", &pw))), 0);
    } else {
        assert_eq!(code(&ours(&ipmi_args(&lab, "on", &pw))), 0);
    }

    // Wrong password: both fail with 1, and nothing is switched.
    let bad = "echo Zq9-not-it";
    let o = ours(&ipmi_args(&lab, "off", bad));
    assert_eq!(code(&o), 1, "{o:?}");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("Zq9-not-it"));
    if let Some(p) = peer {
        assert_eq!(code(&run(p, &ipmi_args(&lab, "status", bad))), 1);
    }
    assert!(m.is_powered());
    assert_eq!(code(&ours(&ipmi_args(&lab, "monitor", &pw))), 0);
}

fn pdu_args(lab: &Lab, action: &str, plug: u32) -> String {
    let info = lab.pdu().unwrap().info();
    let community = PduInfo::secret(&info.community_rw_file).unwrap();
    format!(
        "action={action}\nip={}\nipport={}\nplug={plug}\ncommunity={community}\nsnmp_version=2c\n",
        info.host, info.port
    )
}

#[test]
fn fence_apc_snmp_style_stdin_gives_the_same_exit_codes_as_fence_apc_snmp() {
    let lab = lab(1, true, 1);
    let m = &lab.machines()[0];
    let plug = m.outlets()[0];
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
    let peer = have("/usr/sbin/fence_apc_snmp").then_some("/usr/sbin/fence_apc_snmp");

    assert_eq!(code(&ours(&pdu_args(&lab, "status", plug))), 0);
    if let Some(p) = peer {
        let o = run(p, &pdu_args(&lab, "status", plug));
        assert_eq!(code(&o), 0, "{o:?}");
    }
    let o = ours(&pdu_args(&lab, "off", plug));
    assert_eq!(code(&o), 0, "{o:?}");
    m.wait_power(false, Duration::from_secs(10))
        .expect("machine is off");
    assert_eq!(code(&ours(&pdu_args(&lab, "status", plug))), 2);
    if let Some(p) = peer {
        assert_eq!(code(&run(p, &pdu_args(&lab, "status", plug))), 2);
        assert_eq!(code(&run(p, &pdu_args(&lab, "on", plug))), 0);
    } else {
        assert_eq!(code(&ours(&pdu_args(&lab, "on", plug))), 0);
    }
    m.wait_power(true, Duration::from_secs(20))
        .expect("machine boots");
    assert_eq!(code(&ours(&pdu_args(&lab, "status", plug))), 0);
    let o = ours(&pdu_args(&lab, "list", plug));
    assert_eq!(code(&o), 0, "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("{plug},")));
}

fn pdu_v3_args(lab: &Lab, action: &str, plug: u32) -> String {
    let info = lab.pdu().unwrap().info();
    format!(
        "action={action}\nip={}\nipport={}\nplug={plug}\nsnmp_version=3\nusername={}\npassword={}\nsnmp_sec_level=authPriv\nsnmp_auth_prot=SHA\nsnmp_priv_prot=AES\nsnmp_priv_passwd={}\n",
        info.host,
        info.port,
        info.v3_user,
        PduInfo::secret(&info.v3_auth_file).unwrap(),
        PduInfo::secret(&info.v3_priv_file).unwrap(),
    )
}

#[test]
fn fence_apc_snmp_style_v3_stdin_switches_and_reads_like_fence_apc_snmp() {
    let lab = lab(1, true, 1);
    let m = &lab.machines()[0];
    let plug = m.outlets()[0];
    eventually("machine boots", Duration::from_secs(20), || {
        m.is_powered().then_some(())
    });
    let peer = have("/usr/sbin/fence_apc_snmp").then_some("/usr/sbin/fence_apc_snmp");
    let o = ours(&pdu_v3_args(&lab, "status", plug));
    assert_eq!(code(&o), 0, "{o:?}");
    if let Some(p) = peer {
        let o = run(p, &pdu_v3_args(&lab, "status", plug));
        assert_eq!(code(&o), 0, "{o:?}");
    }
    let o = ours(&pdu_v3_args(&lab, "off", plug));
    assert_eq!(code(&o), 0, "{o:?}");
    m.wait_power(false, Duration::from_secs(10))
        .expect("machine is off");
    if let Some(p) = peer {
        assert_eq!(code(&run(p, &pdu_v3_args(&lab, "status", plug))), 2);
    }
    assert_eq!(code(&ours(&pdu_v3_args(&lab, "status", plug))), 2);
    assert_eq!(code(&ours(&pdu_v3_args(&lab, "on", plug))), 0);
    m.wait_power(true, Duration::from_secs(20))
        .expect("machine boots");
}

#[test]
fn metadata_and_validate_all_follow_the_conventions() {
    let o = ours("action=metadata\n");
    assert_eq!(code(&o), 0);
    let xml = String::from_utf8_lossy(&o.stdout);
    assert!(xml.contains("<resource-agent name=\"palisade-fence\""));
    assert!(xml.contains("<action name=\"monitor\" />"));
    // validate-all checks options without contacting anything.
    assert_eq!(
        code(&ours(
            "action=validate-all\nip=127.0.0.1\nipport=9\nusername=a\npassword=b\n"
        )),
        0
    );
    assert_eq!(
        code(&ours("action=validate-all\nusername=a\npassword=b\n")),
        1
    );
    assert_eq!(
        code(&ours(
            "action=validate-all\nip=127.0.0.1\nusername=a\npassword=b\ncipher=1\n"
        )),
        1,
        "weak cipher suites are refused unless allowed"
    );
}

#[test]
fn a_misspelt_option_fails_before_anything_is_sent_and_names_the_option() {
    // No device listens here: the typo must be refused before any exchange is attempted.
    let out = ours("action=status\nip=127.0.0.1\nipport=9\nlogin=a\npasswd=p\npower_timout=60\n");
    assert_eq!(code(&out), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown option \"power_timout\""), "{err}");
    assert!(err.contains("did you mean power_timeout?"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_palisade-fence"))
        .args(["-o", "status", "--ip", "127.0.0.1", "--power-timout", "60"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown option \"--power-timout\""), "{err}");
}

#[test]
fn the_metadata_documents_every_option_the_cli_reads() {
    let out = ours("action=metadata\n");
    assert_eq!(code(&out), 0);
    let xml = String::from_utf8_lossy(&out.stdout);
    assert!(xml.contains("name=\"cipher_probe_timeout\""), "{xml}");
    assert!(xml.contains("name=\"community_file\""), "{xml}");
}
