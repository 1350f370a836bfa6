//! Process presence for identities without a volume: no storage log can judge them, so the
//! observer looks at the processes themselves. Every container of an identity StatefulSet
//! carries `NEMESIS_IDENTITY=<lab id>/<pod name>` and `POD_UID=<uid>` in its environment; two
//! live processes of one identity with different pod UIDs, at once, are two incarnations. The
//! lab id keeps campaigns that share a host (two test runs) from judging each other's pods.
//!
//! "At once" is proven, not sampled: a scan sees process A at t1 and B at t2; A is then read
//! again at t3 with the same start time. A process never comes back, so A lived through
//! [t1, t3], which contains t2.

use std::collections::BTreeMap;

/// The environment variable naming an identity's pod.
pub const IDENTITY_ENV: &str = "NEMESIS_IDENTITY";

/// One live process of an identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incarnation {
    /// The pid.
    pub pid: i32,
    /// Its start time (clock ticks since boot), to tell a reused pid apart.
    pub start: u64,
    /// The pod UID it belongs to.
    pub pod_uid: String,
    /// The machine it runs on (the lab's machine marker, or the node its pod was bound to).
    pub machine: String,
}

/// Reads one variable of a NUL-separated environment block.
pub fn env_var<'a>(environ: &'a [u8], key: &str) -> Option<&'a str> {
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// The start time (field 22) of a `/proc/<pid>/stat` line, and whether the process is a
/// zombie or dead.
pub fn parse_stat(stat: &str) -> Option<(u64, bool)> {
    // The command name (field 2) is parenthesised and may hold spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = *fields.first()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((start, state == "Z" || state == "X"))
}

fn start_of(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (start, dead) = parse_stat(&stat)?;
    (!dead).then_some(start)
}

/// The value of [`IDENTITY_ENV`] for identity `name` of lab `lab_id`.
pub fn identity_value(lab_id: &str, name: &str) -> String {
    format!("{lab_id}/{name}")
}

/// Every live process of every identity of lab `lab_id`, by identity (its name, without the
/// lab id).
pub fn scan(lab_id: &str) -> BTreeMap<String, Vec<Incarnation>> {
    let prefix = identity_value(lab_id, "");
    let mut out: BTreeMap<String, Vec<Incarnation>> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let Some(identity) =
            env_var(&environ, IDENTITY_ENV).and_then(|v| v.strip_prefix(prefix.as_str()))
        else {
            continue;
        };
        let Some(start) = start_of(pid) else {
            continue;
        };
        out.entry(identity.to_string())
            .or_default()
            .push(Incarnation {
                pid,
                start,
                pod_uid: env_var(&environ, "POD_UID").unwrap_or("").to_string(),
                // The lab's marker where the process carries it; a container started by the
                // node agent has the node its pod was bound to.
                machine: env_var(&environ, palisade_lab::process::MACHINE_ENV)
                    .or_else(|| env_var(&environ, "NODE_NAME"))
                    .unwrap_or("")
                    .to_string(),
            });
    }
    out
}

/// Of the processes found by one [`scan`], those of an identity that prove two incarnations
/// alive at once: the processes of every pod UID but the newest-found one are read again
/// and must still be the same processes. Empty when there is no such proof.
pub fn overlapping(found: &[Incarnation]) -> Vec<Incarnation> {
    let mut uids: Vec<&str> = found.iter().map(|p| p.pod_uid.as_str()).collect();
    uids.sort_unstable();
    uids.dedup();
    if uids.len() < 2 {
        return Vec::new();
    }
    let still: Vec<Incarnation> = found
        .iter()
        .filter(|p| start_of(p.pid) == Some(p.start))
        .cloned()
        .collect();
    let mut alive: Vec<&str> = still.iter().map(|p| p.pod_uid.as_str()).collect();
    alive.sort_unstable();
    alive.dedup();
    if alive.len() >= 2 {
        still
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_variable_is_found_whole() {
        let env = b"POD_UID=abc\0NEMESIS_IDENTITY=v0-0\0NEMESIS_IDENTITY_X=no\0";
        assert_eq!(env_var(env, "NEMESIS_IDENTITY"), Some("v0-0"));
        assert_eq!(env_var(env, "POD_UID"), Some("abc"));
        assert_eq!(env_var(env, "POD"), None);
    }

    #[test]
    fn the_start_time_is_read_past_a_command_name_with_spaces() {
        let stat = "4242 (sleep (x) y) S 1 4242 4242 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 987654 1234 56";
        assert_eq!(parse_stat(stat), Some((987654, false)));
        let zombie = "4242 (sh) Z 1 4242 4242 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat(zombie), Some((5, true)));
    }

    #[test]
    fn this_process_proves_overlap_with_itself_only_under_two_uids() {
        let me = std::process::id() as i32;
        let start = start_of(me).unwrap();
        let p = |uid: &str| Incarnation {
            pid: me,
            start,
            pod_uid: uid.into(),
            machine: "lab/m0".into(),
        };
        assert!(overlapping(&[p("a")]).is_empty());
        assert_eq!(overlapping(&[p("a"), p("b")]).len(), 2);
        // A process read again with another start time is another process: no proof.
        let gone = Incarnation {
            start: start + 1,
            ..p("b")
        };
        assert!(overlapping(&[p("a"), gone]).is_empty());
    }
}
