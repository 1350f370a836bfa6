//! The `firmware-bridge` binary refuses unsafe configurations at start, saying why.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::{write_config, Ca};

fn run_check(dir: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_firmware-bridge"))
        .arg("--config")
        .arg(dir.join("bridge.toml"))
        .arg("--check")
        .env("RUST_LOG", "trace")
        .output()
        .unwrap()
}

#[test]
fn group_or_world_readable_credentials_file_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    write_config(dir.path(), &ca, &ca.server(), "");
    let pass = dir.path().join("m1-bmc.pass");
    for mode in [0o644, 0o640, 0o604] {
        std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = run_check(dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "mode {mode:o} must be refused");
        assert!(
            stderr.contains(&pass.display().to_string()),
            "names the file: {stderr}"
        );
        assert!(
            stderr.contains(&format!("mode {mode:04o}")),
            "says the mode: {stderr}"
        );
        assert!(stderr.contains("target m1"), "says which target: {stderr}");
        assert!(
            !stderr.contains(common::BMC_PASSWORD),
            "never prints the secret"
        );
    }
}

#[test]
fn loose_server_key_and_missing_env_credential_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    write_config(dir.path(), &ca, &ca.server(), "");
    let key = dir.path().join("server.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_firmware-bridge"))
        .arg("--config")
        .arg(dir.path().join("bridge.toml"))
        .arg("--check")
        .env(common::PDU_ENV, common::PDU_COMMUNITY)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("server.key") && stderr.contains("0644"),
        "{stderr}"
    );

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_firmware-bridge"))
        .arg("--config")
        .arg(dir.path().join("bridge.toml"))
        .arg("--check")
        .env_remove(common::PDU_ENV)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(common::PDU_ENV), "{stderr}");
}
