//! Process presence for identities without a volume: no storage log can judge them, so the
//! observer looks at the processes themselves. Every container of an identity StatefulSet
//! carries `NEMESIS_IDENTITY=<lab id>/<pod name>` and `POD_UID=<uid>` in its environment; two
//! live processes of one identity with different pod UIDs, at once, are two incarnations. The
//! lab id keeps campaigns that share a host (two test runs) from judging each other's pods.
//!
//! On QEMU machines the host sees no guest process: there the containers beat ([`Beats`]).
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

/// The environment variable naming the directory an identity's container beats in.
pub const BEAT_DIR_ENV: &str = "NEMESIS_BEAT_DIR";

/// What an identity's container runs on machines whose processes the host cannot see (QEMU
/// guests): a counter written five times a second to `<beat dir>/<pod uid>`, with the node,
/// each write a rename (a reader sees one whole line). Only a live process advances it.
pub const BEAT_COMMAND: &str = r#"i=0; f="$NEMESIS_BEAT_DIR/$POD_UID"
while :; do i=$((i+1)); echo "$i $NODE_NAME" > "$f.tmp" && mv "$f.tmp" "$f"; sleep 0.2; done"#;

/// Where the containers of identity `name` beat, under the lab's shared directory.
pub fn beat_dir(shared: &std::path::Path, name: &str) -> std::path::PathBuf {
    shared.join("beats").join(name)
}

/// Presence told by beats rather than by `/proc`: each incarnation (pod UID) advances a
/// counter while it lives. "At once" is proven, as [`overlapping`] proves it: a read that
/// finds a counter changed since the read before proves its process alive at some instant
/// between the start of the earlier read and the end of this one (an *advance window*). A
/// process's life is one interval, so it lived through everything between the end of its
/// first advance window and the start of its last ([`Life::sure`]). Two incarnations
/// overlapped for certain when one's sure interval meets the other's, or holds one of the
/// other's windows whole. Frozen or powered-off guests stop beating and prove nothing;
/// nothing is ever inferred from a counter that did not move.
#[derive(Debug, Default)]
pub struct Beats {
    /// Per identity, per pod UID: the last value read and what the reads proved.
    lives: BTreeMap<String, BTreeMap<String, Life>>,
}

/// What the reads of one incarnation's counter proved.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Life {
    /// The value the last read found, and when that read began.
    last: Option<(String, f64)>,
    /// The first advance window: (earlier read's start, this read's end).
    first: Option<(f64, f64)>,
    /// The latest advance window.
    latest: Option<(f64, f64)>,
    /// The node the counter names.
    pub node: String,
}

impl Life {
    /// Takes one read: `value` read between `start` and `end` (seconds on one clock).
    fn read(&mut self, value: &str, start: f64, end: f64) {
        if let Some((old, old_start)) = &self.last {
            if old != value {
                let w = (*old_start, end);
                self.first.get_or_insert(w);
                self.latest = Some(w);
            }
        }
        self.last = Some((value.to_string(), start));
    }

    /// The interval the process surely lived through (empty before two advances).
    pub fn sure(&self) -> Option<(f64, f64)> {
        let (f, l) = (self.first?, self.latest?);
        (f.1 <= l.0).then_some((f.1, l.0))
    }

    /// True when this life and `other` certainly overlapped in time.
    pub fn overlaps(&self, other: &Life) -> bool {
        let inside =
            |w: Option<(f64, f64)>, s: (f64, f64)| w.is_some_and(|w| s.0 <= w.0 && w.1 <= s.1);
        match (self.sure(), other.sure()) {
            (Some(a), Some(b)) => a.0 <= b.1 && b.0 <= a.1,
            (Some(a), None) => inside(other.first, a),
            (None, Some(b)) => inside(self.first, b),
            (None, None) => false,
        }
    }
}

impl Beats {
    /// Reads every counter under `shared`'s beat directories for `identities` once; `now`
    /// gives the observer's clock (seconds). Returns, per identity, the incarnations proven
    /// alive together (machine, pod UID) when there are any.
    pub fn read(
        &mut self,
        shared: &std::path::Path,
        identities: &[&str],
        now: impl Fn() -> f64,
    ) -> BTreeMap<String, Vec<(String, String)>> {
        let mut out = BTreeMap::new();
        for name in identities {
            let dir = beat_dir(shared, name);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let lives = self.lives.entry(format!("{name}-0")).or_default();
            for uid in entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|f| !f.ends_with(".tmp"))
            {
                let start = now();
                let Ok(text) = std::fs::read_to_string(dir.join(&uid)) else {
                    continue;
                };
                let end = now();
                let life = lives.entry(uid).or_default();
                life.read(text.trim(), start, end);
                if let Some(node) = text.split_whitespace().nth(1) {
                    life.node = node.to_string();
                }
            }
            let uids: Vec<&String> = lives.keys().collect();
            let mut both = Vec::new();
            for (i, a) in uids.iter().enumerate() {
                for b in &uids[i + 1..] {
                    if lives[*a].overlaps(&lives[*b]) {
                        for u in [*a, *b] {
                            let p = (lives[u].node.clone(), u.clone());
                            if !both.contains(&p) {
                                both.push(p);
                            }
                        }
                    }
                }
            }
            if !both.is_empty() {
                out.insert(format!("{name}-0"), both);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(reads: &[(&str, f64)]) -> Life {
        let mut l = Life::default();
        for (v, t) in reads {
            l.read(v, *t, t + 0.1);
        }
        l
    }

    #[test]
    fn beats_prove_overlap_only_from_advances_that_bracket_the_other() {
        // A advances between 0 and 1.1 and between 4 and 5.1: sure alive over [1.1, 4].
        let a = life(&[("1", 0.0), ("2", 1.0), ("2", 2.0), ("3", 4.0), ("4", 5.0)]);
        assert_eq!(a.sure(), Some((1.1, 4.0)));
        // B advances once between 2 and 3.1: inside A's sure interval.
        let b = life(&[("1", 2.0), ("2", 3.0)]);
        assert!(a.overlaps(&b) && b.overlaps(&a));
        // C advances only after A's last advance began: A may have died first.
        let c = life(&[("1", 4.5), ("2", 6.0), ("3", 7.0)]);
        assert!(!a.overlaps(&c));
        // A counter that never moved proves nothing (a frozen guest, an old file).
        let still = life(&[("9", 0.0), ("9", 2.0), ("9", 3.0)]);
        assert!(!a.overlaps(&still) && still.sure().is_none());
        // Two sure intervals that meet.
        let d = life(&[("1", 3.0), ("2", 3.5), ("3", 8.0), ("4", 9.0)]);
        assert!(a.overlaps(&d));
    }

    #[test]
    fn beats_are_read_from_the_shared_directory_and_judged_per_identity() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().to_path_buf();
        let dir = beat_dir(&shared, "v0");
        std::fs::create_dir_all(&dir).unwrap();
        let clock = std::cell::Cell::new(0.0);
        let now = || {
            clock.set(clock.get() + 0.01);
            clock.get()
        };
        let mut beats = Beats::default();
        let write = |uid: &str, v: u32, node: &str| {
            std::fs::write(dir.join(uid), format!("{v} {node}\n")).unwrap()
        };
        for v in 1..=3 {
            write("uid-a", v, "m0");
            assert!(beats.read(&shared, &["v0"], now).is_empty());
        }
        // B starts while A still beats: B once, A twice more.
        write("uid-b", 1, "m1");
        beats.read(&shared, &["v0"], now);
        write("uid-b", 2, "m1");
        beats.read(&shared, &["v0"], now);
        write("uid-a", 4, "m0");
        beats.read(&shared, &["v0"], now);
        // Only an advance of A read after B's window closed brackets it.
        write("uid-a", 5, "m0");
        let found = beats.read(&shared, &["v0"], now);
        assert_eq!(
            found.get("v0-0").map(Vec::len),
            Some(2),
            "both incarnations named: {found:?}"
        );
    }

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
