//! Free loopback ports, so that several labs can run side by side.

use std::collections::HashSet;
use std::net::{TcpListener, UdpSocket};

use parking_lot::Mutex;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Returns a loopback port that is free for both TCP and UDP right now and has not been handed
/// out before by this process. Another process may still take it before it is bound; the
/// window is small and the lab's readiness checks notice a clash.
pub fn free_port() -> u16 {
    loop {
        let Ok(tcp) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = tcp.local_addr() else {
            continue;
        };
        let port = addr.port();
        if UdpSocket::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        let mut guard = HANDED_OUT.lock();
        if guard.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice() {
        let ports: HashSet<u16> = (0..200).map(|_| free_port()).collect();
        assert_eq!(ports.len(), 200);
    }
}
