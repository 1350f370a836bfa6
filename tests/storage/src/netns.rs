//! Binding a listener inside a named network namespace (`/run/netns/NAME`, as `ip netns`
//! creates them) from a process that lives outside it.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};

/// Creates a TCP listener inside network namespace `name`. A short-lived thread enters the
/// namespace, binds and exits; the socket keeps belonging to that namespace.
pub fn bind_tcp_in(name: &str, addr: SocketAddr) -> std::io::Result<TcpListener> {
    if name.contains('/') || name.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("invalid netns name {name:?}"),
        ));
    }
    let ns = File::open(std::path::Path::new("/run/netns").join(name))?;
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        TcpListener::bind(addr)
    })
    .join()
    .map_err(|_| std::io::Error::other("netns bind thread panicked"))?
}
