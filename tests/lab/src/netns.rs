//! Network namespaces: the lab's machines, its hub (the bridge that joins them) and sockets
//! created inside a namespace by a process that lives outside it.
//!
//! Addresses used here exist only inside the lab's own namespaces.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::Command;

use nix::sched::{setns, CloneFlags};

use crate::error::{LabError, Result};
use crate::process::run;

/// The lab subnet's prefix length; every lab has its own hub namespace, so labs never clash.
pub const PREFIX: u8 = 24;
/// The hub's address on the lab bridge: the API server's and storage's front door.
pub const HUB_ADDR: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);

/// The address of machine `index` on the lab bridge.
pub fn machine_addr(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 213, 0, 11 + index as u8)
}

/// Runs `ip` with the given arguments.
pub fn ip(args: &[&str]) -> Result<String> {
    run(Command::new("ip").args(args))
}

/// Creates a network namespace with its loopback up.
pub fn add(name: &str) -> Result<()> {
    ip(&["netns", "add", name])?;
    ip(&["-n", name, "link", "set", "lo", "up"])?;
    Ok(())
}

/// Deletes a network namespace if it exists (its links go with it).
pub fn delete(name: &str) {
    let _ = ip(&["netns", "delete", name]);
}

/// True if the named namespace exists.
pub fn exists(name: &str) -> bool {
    std::path::Path::new("/run/netns").join(name).exists()
}

/// Runs `f` on a thread that has entered the network namespace `name`. Sockets created by `f`
/// stay in that namespace after the thread ends, so a process can serve inside a namespace
/// while living in another.
pub fn with_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    let path = std::path::Path::new("/run/netns").join(name);
    let ns = File::open(&path).map_err(LabError::io(&path))?;
    let name = name.to_string();
    std::thread::spawn(move || -> Result<T> {
        setns(&ns, CloneFlags::CLONE_NEWNET)
            .map_err(|e| LabError::Other(format!("setns into {name}: {e}")))?;
        f().map_err(|e| LabError::Other(format!("in netns {name}: {e}")))
    })
    .join()
    .map_err(|_| LabError::Other("netns thread panicked".into()))?
}

/// Binds a TCP listener inside network namespace `name`.
pub fn bind_tcp_in(name: &str, addr: SocketAddr) -> Result<TcpListener> {
    with_netns(name, move || TcpListener::bind(addr))
}

/// Binds a UDP socket inside network namespace `name`.
pub fn bind_udp_in(name: &str, addr: SocketAddr) -> Result<UdpSocket> {
    with_netns(name, move || UdpSocket::bind(addr))
}

/// Connects a TCP stream from inside network namespace `name`.
pub fn connect_tcp_in(name: &str, addr: SocketAddr) -> Result<std::net::TcpStream> {
    with_netns(name, move || {
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))
    })
}
