//! The switched PDU's brain: a Net-SNMP `pass_persist` handler serving outlet tables.
//!
//! snmpd runs `palisade-lab pdu-agent --state FILE` and speaks the `pass_persist` protocol to
//! it on stdin/stdout. The outlet state lives in a JSON file under a file lock, so the two
//! handler processes snmpd starts (one per vendor subtree) and the lab itself agree. Turning
//! an outlet off cuts its machine and the machine's BMC once no outlet feeds it any more;
//! turning it on starts the BMC, which boots the machine.
//!
//! Tables served (numeric OIDs):
//! - APC PowerNet `sPDUOutletCtl` `.1.3.6.1.4.1.318.1.1.4.4.2.1.3.N` (1 on, 2 off, 3 reboot)
//!   and `sPDUOutletCtlName` `.4.N`;
//! - APC `rPDUOutletControlOutletCommand` `.1.3.6.1.4.1.318.1.1.12.3.3.1.1.4.N` with names at
//!   `.2.N`, and `rPDUOutletStatusOutletState` `.1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.N` with names
//!   at `.2.N`;
//! - CyberPower `ePDUOutletControlOutletCommand` `.1.3.6.1.4.1.3808.1.1.3.3.3.1.1.4.N` with
//!   names at `.2.N`, and `ePDUOutletStatusOutletState` `.1.3.6.1.4.1.3808.1.1.3.3.5.1.1.4.N`
//!   with names at `.2.N`.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::error::{LabError, Result};

/// One outlet of the PDU.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Outlet {
    /// The outlet number, from 1.
    pub number: u32,
    /// The outlet's name (`m0-psu1`).
    pub name: String,
    /// The machine it feeds.
    pub machine: String,
    /// Whether it is on.
    pub on: bool,
}

/// How the handler cuts and restores a machine's power.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MachinePower {
    /// The machine's directory (boot.pid, bmc.pid, bmc-start.sh).
    pub dir: PathBuf,
    /// The machine's process marker.
    pub marker: String,
}

/// The PDU's whole state, as kept in its state file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PduState {
    /// The outlets, by number.
    pub outlets: Vec<Outlet>,
    /// The machines, by name.
    pub machines: BTreeMap<String, MachinePower>,
    /// How long a reboot keeps the outlet off.
    pub reboot_delay_ms: u64,
}

/// Reads the state file.
pub fn read_state(path: &Path) -> Result<PduState> {
    let text = fs::read_to_string(path).map_err(LabError::io(path))?;
    serde_json::from_str(&text).map_err(|e| LabError::Other(format!("{}: {e}", path.display())))
}

/// Writes the state file atomically.
pub fn write_state(path: &Path, state: &PduState) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_vec_pretty(state).map_err(|e| LabError::Other(e.to_string()))?;
    fs::write(&tmp, text).map_err(LabError::io(&tmp))?;
    fs::rename(&tmp, path).map_err(LabError::io(path))
}

fn locked<T>(state_file: &Path, f: impl FnOnce(&mut PduState) -> Result<T>) -> Result<T> {
    let lock_path = state_file.with_extension("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(LabError::io(&lock_path))?;
    let _lock = Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, e)| LabError::Other(format!("locking {}: {e}", lock_path.display())))?;
    let mut state = read_state(state_file)?;
    let out = f(&mut state)?;
    write_state(state_file, &state)?;
    Ok(out)
}

/// Switches outlet `number` on or off, cutting or restoring its machine's power when that
/// changes whether any outlet feeds the machine. Returns false for an unknown outlet.
pub fn switch(state_file: &Path, number: u32, on: bool) -> Result<bool> {
    locked(state_file, |state| {
        let Some(idx) = state.outlets.iter().position(|o| o.number == number) else {
            return Ok(false);
        };
        let machine = state.outlets[idx].machine.clone();
        let fed = |s: &PduState| s.outlets.iter().any(|o| o.machine == machine && o.on);
        let was_fed = fed(state);
        state.outlets[idx].on = on;
        let now_fed = fed(state);
        if let Some(power) = state.machines.get(&machine) {
            if was_fed && !now_fed {
                crate::machine::kill_machine_and_bmc(&power.dir, &power.marker);
            } else if !was_fed && now_fed {
                crate::machine::run_script(&power.dir.join("bmc-start.sh"))?;
            }
        }
        Ok(true)
    })
}

/// A column of an outlet table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Column {
    /// Writable control: 1 on, 2 off, 3 reboot; reads back 1 on, 2 off.
    Control,
    /// Read-only state: 1 on, 2 off.
    State,
    /// The outlet name.
    Name,
}

/// (table prefix, column) for every table served; the outlet number is appended.
const TABLES: &[(&[u32], Column)] = &[
    (
        &[1, 3, 6, 1, 4, 1, 318, 1, 1, 4, 4, 2, 1, 3],
        Column::Control,
    ),
    (&[1, 3, 6, 1, 4, 1, 318, 1, 1, 4, 4, 2, 1, 4], Column::Name),
    (
        &[1, 3, 6, 1, 4, 1, 318, 1, 1, 12, 3, 3, 1, 1, 2],
        Column::Name,
    ),
    (
        &[1, 3, 6, 1, 4, 1, 318, 1, 1, 12, 3, 3, 1, 1, 4],
        Column::Control,
    ),
    (
        &[1, 3, 6, 1, 4, 1, 318, 1, 1, 12, 3, 5, 1, 1, 2],
        Column::Name,
    ),
    (
        &[1, 3, 6, 1, 4, 1, 318, 1, 1, 12, 3, 5, 1, 1, 4],
        Column::State,
    ),
    (
        &[1, 3, 6, 1, 4, 1, 3808, 1, 1, 3, 3, 3, 1, 1, 2],
        Column::Name,
    ),
    (
        &[1, 3, 6, 1, 4, 1, 3808, 1, 1, 3, 3, 3, 1, 1, 4],
        Column::Control,
    ),
    (
        &[1, 3, 6, 1, 4, 1, 3808, 1, 1, 3, 3, 5, 1, 1, 2],
        Column::Name,
    ),
    (
        &[1, 3, 6, 1, 4, 1, 3808, 1, 1, 3, 3, 5, 1, 1, 4],
        Column::State,
    ),
];

fn parse_oid(s: &str) -> Option<Vec<u32>> {
    s.trim()
        .trim_start_matches('.')
        .split('.')
        .map(|p| p.parse().ok())
        .collect()
}

fn oid_string(oid: &[u32]) -> String {
    oid.iter().map(|n| format!(".{n}")).collect()
}

/// Every (OID, column, outlet) the PDU serves, in OID order.
fn all_oids(state: &PduState) -> Vec<(Vec<u32>, Column, u32)> {
    let mut v: Vec<_> = TABLES
        .iter()
        .flat_map(|(prefix, col)| {
            state.outlets.iter().map(move |o| {
                let mut oid = prefix.to_vec();
                oid.push(o.number);
                (oid, *col, o.number)
            })
        })
        .collect();
    v.sort();
    v
}

fn render(state: &PduState, oid: &[u32], col: Column, number: u32) -> Option<String> {
    let outlet = state.outlets.iter().find(|o| o.number == number)?;
    Some(match col {
        Column::Name => format!("{}\nstring\n{}\n", oid_string(oid), outlet.name),
        Column::Control | Column::State => {
            format!(
                "{}\ninteger\n{}\n",
                oid_string(oid),
                if outlet.on { 1 } else { 2 }
            )
        }
    })
}

/// Answers one `pass_persist` request. `lines` yields the request's remaining lines.
pub fn answer(
    state_file: &Path,
    command: &str,
    lines: &mut dyn Iterator<Item = String>,
) -> Result<String> {
    match command {
        "PING" => Ok("PONG\n".into()),
        "get" | "getnext" => {
            let requested = lines.next().unwrap_or_default();
            let Some(oid) = parse_oid(&requested) else {
                return Ok("NONE\n".into());
            };
            let state = read_state(state_file)?;
            let oids = all_oids(&state);
            let hit = if command == "get" {
                oids.iter().find(|(o, _, _)| *o == oid)
            } else {
                oids.iter().find(|(o, _, _)| *o > oid)
            };
            Ok(hit
                .and_then(|(o, c, n)| render(&state, o, *c, *n))
                .unwrap_or_else(|| "NONE\n".into()))
        }
        "set" => {
            let requested = lines.next().unwrap_or_default();
            let value = lines.next().unwrap_or_default();
            let Some(oid) = parse_oid(&requested) else {
                return Ok("not-writable\n".into());
            };
            let state = read_state(state_file)?;
            let Some((_, col, number)) = all_oids(&state).into_iter().find(|(o, _, _)| *o == oid)
            else {
                return Ok("not-writable\n".into());
            };
            if col != Column::Control {
                return Ok("not-writable\n".into());
            }
            let mut parts = value.split_whitespace();
            if parts.next() != Some("integer") {
                return Ok("wrong-type\n".into());
            }
            match parts.next().and_then(|v| v.parse::<i64>().ok()) {
                Some(1) => {
                    switch(state_file, number, true)?;
                }
                Some(2) => {
                    switch(state_file, number, false)?;
                }
                Some(3) => {
                    switch(state_file, number, false)?;
                    let file = state_file.to_path_buf();
                    let delay = Duration::from_millis(state.reboot_delay_ms);
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        let _ = switch(&file, number, true);
                    });
                }
                _ => return Ok("wrong-value\n".into()),
            }
            Ok("DONE\n".into())
        }
        _ => Ok("NONE\n".into()),
    }
}

/// Runs the handler loop on stdin/stdout until snmpd closes the pipe.
pub fn serve(state_file: &Path) -> Result<()> {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines().map_while(|l| l.ok());
    let stdout = std::io::stdout();
    while let Some(command) = lines.next() {
        // snmpd follows a set's value with an empty line; it expects no answer to it.
        if command.trim().is_empty() {
            continue;
        }
        let reply = match answer(state_file, command.trim(), &mut lines) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("pdu-agent: {e}");
                if command.trim() == "set" {
                    "commit-failed\n".into()
                } else {
                    "NONE\n".into()
                }
            }
        };
        let mut out = stdout.lock();
        out.write_all(reply.as_bytes())
            .and_then(|_| out.flush())
            .map_err(|e| LabError::Other(format!("pdu-agent stdout: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_file(dir: &Path) -> PathBuf {
        let path = dir.join("pdu.json");
        let state = PduState {
            outlets: vec![
                Outlet {
                    number: 1,
                    name: "m0-psu1".into(),
                    machine: "m0".into(),
                    on: true,
                },
                Outlet {
                    number: 2,
                    name: "m0-psu2".into(),
                    machine: "m0".into(),
                    on: true,
                },
            ],
            machines: BTreeMap::new(),
            reboot_delay_ms: 10,
        };
        write_state(&path, &state).unwrap();
        path
    }

    fn ask(file: &Path, cmd: &str, rest: &[&str]) -> String {
        let mut it = rest.iter().map(|s| s.to_string());
        answer(file, cmd, &mut it).unwrap()
    }

    #[test]
    fn get_reads_outlet_state_and_names() {
        let dir = tempdir();
        let f = state_file(&dir);
        assert_eq!(ask(&f, "PING", &[]), "PONG\n");
        assert_eq!(
            ask(&f, "get", &[".1.3.6.1.4.1.318.1.1.4.4.2.1.3.2"]),
            ".1.3.6.1.4.1.318.1.1.4.4.2.1.3.2\ninteger\n1\n"
        );
        assert_eq!(
            ask(&f, "get", &[".1.3.6.1.4.1.318.1.1.4.4.2.1.4.1"]),
            ".1.3.6.1.4.1.318.1.1.4.4.2.1.4.1\nstring\nm0-psu1\n"
        );
        assert_eq!(
            ask(&f, "get", &[".1.3.6.1.4.1.318.1.1.4.4.2.1.3.9"]),
            "NONE\n"
        );
    }

    #[test]
    fn getnext_walks_tables_in_oid_order() {
        let dir = tempdir();
        let f = state_file(&dir);
        let first = ask(&f, "getnext", &[".1.3.6.1.4.1.318.1.1.12.3.5.1.1.2"]);
        assert!(
            first.starts_with(".1.3.6.1.4.1.318.1.1.12.3.5.1.1.2.1\nstring\n"),
            "{first}"
        );
        let next = ask(&f, "getnext", &[".1.3.6.1.4.1.318.1.1.12.3.5.1.1.2.2"]);
        assert!(
            next.starts_with(".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.1\ninteger\n"),
            "{next}"
        );
        assert_eq!(
            ask(&f, "getnext", &[".1.3.6.1.4.1.3808.1.1.3.3.5.1.1.4.2"]),
            "NONE\n"
        );
    }

    #[test]
    fn set_switches_outlets_and_rejects_bad_writes() {
        let dir = tempdir();
        let f = state_file(&dir);
        assert_eq!(
            ask(
                &f,
                "set",
                &[".1.3.6.1.4.1.318.1.1.12.3.3.1.1.4.1", "integer 2"]
            ),
            "DONE\n"
        );
        assert!(!read_state(&f).unwrap().outlets[0].on);
        assert_eq!(
            ask(&f, "get", &[".1.3.6.1.4.1.3808.1.1.3.3.5.1.1.4.1"]),
            ".1.3.6.1.4.1.3808.1.1.3.3.5.1.1.4.1\ninteger\n2\n"
        );
        assert_eq!(
            ask(
                &f,
                "set",
                &[".1.3.6.1.4.1.318.1.1.4.4.2.1.3.1", "integer 7"]
            ),
            "wrong-value\n"
        );
        assert_eq!(
            ask(
                &f,
                "set",
                &[".1.3.6.1.4.1.318.1.1.4.4.2.1.3.1", "string on"]
            ),
            "wrong-type\n"
        );
        assert_eq!(
            ask(
                &f,
                "set",
                &[".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.1", "integer 1"]
            ),
            "not-writable\n"
        );
        assert!(
            !read_state(&f).unwrap().outlets[0].on,
            "rejected writes change nothing"
        );
        assert_eq!(
            ask(
                &f,
                "set",
                &[".1.3.6.1.4.1.318.1.1.4.4.2.1.3.1", "integer 1"]
            ),
            "DONE\n"
        );
        assert!(read_state(&f).unwrap().outlets[0].on);
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("pdu-test-{}", rand::random::<u64>()));
        fs::create_dir_all(&d).unwrap();
        d
    }
}
