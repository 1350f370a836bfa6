//! Free loopback ports, so that several labs can run side by side.
//!
//! A port is chosen outside the kernel's ephemeral range (`net.ipv4.ip_local_port_range`),
//! so no outgoing connection of any process takes it as its source port between the choice
//! and the bind, and it is held with a lock file for the life of the process that chose it,
//! so no other lab process on the machine chooses it too. (Ports taken from the ephemeral
//! range with a bind to port 0 could be taken by either before the component bound them: a
//! kube-controller-manager once failed to start, "bind: address already in use", beside a
//! second lab.)

use std::collections::HashSet;
use std::fs::File;
use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;

use parking_lot::Mutex;

/// A port this process chose, with the lock file that holds it (`None`: no lock directory).
type Held = (u16, Option<File>);

/// The ports this process chose.
static HANDED_OUT: Mutex<Option<Vec<Held>>> = Mutex::new(None);

/// Where the lock files live: one per port chosen by a running process.
fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("palisade-lab-ports")
}

/// The kernel's ephemeral port range (inclusive), or Linux's default when it cannot be read.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|w| w.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// The ports a lab may choose from: 10000 up to 65535, without the ephemeral range.
fn candidates() -> Vec<u16> {
    let (lo, hi) = ephemeral_range();
    (10_000..=65_535).filter(|p| *p < lo || *p > hi).collect()
}

/// A small random number (for the starting point of the search), without a dependency.
fn random() -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as usize
}

/// Takes the lock file of `port`: `Some` when this process now holds it, `None` when another
/// does. A lock directory that cannot be written leaves only the bind check (`Some(None)`).
fn lock(port: u16) -> Option<Option<File>> {
    let dir = lock_dir();
    if std::fs::create_dir_all(&dir).is_err() {
        return Some(None);
    }
    let Ok(file) = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return Some(None);
    };
    file.try_lock().ok().map(|()| Some(file))
}

/// Returns a loopback port that is free for both TCP and UDP right now, outside the kernel's
/// ephemeral range, and held for this process (a lock file) until it exits.
///
/// Guarantees: never the same port twice in one process, nor a port another running process
/// chose with this function; never a port the kernel hands out as a connection's source port.
///
/// Assumptions: other software on the machine does not listen on the chosen range's ports
/// later (a port bound by anyone is skipped at the choice).
///
/// Panics when every candidate port is taken, which would need tens of thousands of labs.
pub fn free_port() -> u16 {
    let ports = candidates();
    let start = random();
    let mut guard = HANDED_OUT.lock();
    let mine = guard.get_or_insert_with(Vec::new);
    let taken: HashSet<u16> = mine.iter().map(|(p, _)| *p).collect();
    for i in 0..ports.len() {
        let port = ports[(start + i) % ports.len()];
        if taken.contains(&port) {
            continue;
        }
        let Some(held) = lock(port) else {
            continue;
        };
        let free = TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if free {
            mine.push((port, held));
            return port;
        }
    }
    panic!("no free loopback port outside the ephemeral range");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice_nor_from_the_ephemeral_range() {
        let (lo, hi) = ephemeral_range();
        let ports: HashSet<u16> = (0..200).map(|_| free_port()).collect();
        assert_eq!(ports.len(), 200);
        assert!(ports.iter().all(|p| *p < lo || *p > hi), "{ports:?}");
    }

    #[test]
    fn a_port_held_by_another_process_is_not_chosen() {
        let port = free_port();
        // The lock is per open file description: a second open (as another process makes)
        // cannot take it while this process holds it.
        let other = File::options()
            .write(true)
            .open(lock_dir().join(port.to_string()))
            .unwrap();
        assert!(other.try_lock().is_err());
    }
}
