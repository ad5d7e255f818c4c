//! `linnet-secrets`'s work: one network's secrets proxy, serving the
//! connections steered to the listening socket the daemon handed it (fd
//! 4), told by the daemon over their socket pair (fd 3, SOCK_SEQPACKET,
//! JSON) what it needs (`ToProxy`) and sending it back its records. The
//! process around it (`cli::secrets`: confined before it reads a byte of
//! a guest's) is started by `daemon::secret_proxies`.
//!
//! One thread: a tokio runtime of the current thread. It ends when the
//! daemon's end closes.

use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::net::{TcpListener, TcpStream};

use super::ca::{Ca, CaFiles};
use super::{MAX_RECORDS, ProxiedVm, Proxy, Record, connection, trust};
use crate::gate::process::send;
use crate::gate::wire::Control;

/// The executable's name; the daemon finds it beside its own.
pub const EXECUTABLE: &str = "linnet-secrets";
/// The socket to the daemon, and the listening socket.
pub const DAEMON_FD: RawFd = 3;
pub const LISTENER_FD: RawFd = 4;
/// The most a message may be (a network's VMs with their grants).
pub const MAX_MESSAGE: usize = 4 << 20;
/// How often expired pins are forgotten.
const TIDY: Duration = Duration::from_secs(10);

/// What the daemon tells the proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToProxy {
    /// First and once: its network, its CA, and the trust store's
    /// bundles (PEM) upstream certificates are checked against.
    Start {
        network: String,
        ca: CaFiles,
        trust: Vec<String>,
    },
    /// The network's VMs with grants, now (rules and secrets' values).
    Vms(Vec<ProxiedVm>),
    /// What a VM learned, as the gate is told it (`Control::Learned`,
    /// `Control::Restored`; the VMs come with `Vms`).
    Pins(Control),
}

/// Reads one message (blocking when `wait`); None at the daemon's end.
fn receive(fd: RawFd, buf: &mut [u8], wait: bool) -> io::Result<Option<usize>> {
    let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
    loop {
        // SAFETY: recv(2) into our buffer.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok((n > 0).then_some(n as usize));
    }
}

fn decode(message: &[u8]) -> io::Result<ToProxy> {
    serde_json::from_slice(message).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The first message: what the proxy is made of. Read before confining
/// (a blocking read), so the rest needs no file.
pub fn start(fd: RawFd) -> io::Result<(String, Proxy, tokio::sync::mpsc::Receiver<Record>)> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let n = receive(fd, &mut buf, true)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the daemon left"))?;
    let ToProxy::Start { network, ca, trust } = decode(&buf[..n])? else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the daemon's first word was not Start",
        ));
    };
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let bundles: Vec<&[u8]> = trust.iter().map(|b| b.as_bytes()).collect();
    let upstream = trust::client_config(provider.clone(), &bundles).map_err(invalid)?;
    let ca = Ca::new(&network, &ca).map_err(|e| invalid(e.to_string()))?;
    let (records, receiver) = tokio::sync::mpsc::channel(MAX_RECORDS);
    Ok((
        network,
        Proxy::new(ca, upstream, provider, records),
        receiver,
    ))
}

/// Serves until the daemon closes its end.
pub async fn serve(
    proxy: Proxy,
    mut records: tokio::sync::mpsc::Receiver<Record>,
    daemon: RawFd,
    listener: std::net::TcpListener,
) -> io::Result<()> {
    let proxy = Arc::new(proxy);
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    // SAFETY: the daemon's socket is this process's fd 3, owned here on
    // and registered once.
    let daemon =
        unsafe { AsyncFd::register(OwnedFd::from_raw_fd(daemon)) }.map_err(|e| e.into_parts().1)?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut tidy = tokio::time::interval(TIDY);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                match original_destination(&stream) {
                    Some(destination) => {
                        tokio::spawn(connection::serve(proxy.clone(), stream, peer, destination));
                    }
                    // Not steered here (no NAT entry): nothing to carry.
                    None => drop(stream),
                }
            }
            ready = daemon.readable() => {
                let mut guard = ready?;
                loop {
                    match receive(daemon.get_ref().as_raw_fd(), &mut buf, false) {
                        Ok(None) => return Ok(()),
                        Ok(Some(n)) => told(&proxy, decode(&buf[..n])?),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            guard.clear_ready();
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Some(record) = records.recv() => {
                let message = serde_json::to_vec(&record).expect("a record serialises");
                // Never waiting: a record the daemon has no room for is dropped.
                match send(daemon.get_ref().as_raw_fd(), &message, libc::MSG_DONTWAIT) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            _ = tidy.tick() => proxy.expire(),
        }
    }
}

fn told(proxy: &Proxy, message: ToProxy) {
    match message {
        ToProxy::Start { .. } | ToProxy::Pins(Control::Vms(_)) => {}
        ToProxy::Vms(vms) => proxy.set_vms(vms),
        ToProxy::Pins(Control::Learned {
            interface_id,
            name,
            addrs,
        }) => proxy.learned(interface_id, &name, &addrs),
        ToProxy::Pins(Control::Restored {
            interface_id,
            reach,
            addrs,
        }) => proxy.restored(interface_id, reach, &addrs),
    }
}

/// Where a steered connection was bound before the redirect.
fn original_destination(stream: &TcpStream) -> Option<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    match stream.local_addr().ok()? {
        SocketAddr::V4(_) => {
            let sin = getsockopt(stream, sockopt::OriginalDst).ok()?;
            Some(SocketAddr::V4(SocketAddrV4::new(
                u32::from_be(sin.sin_addr.s_addr).into(),
                u16::from_be(sin.sin_port),
            )))
        }
        SocketAddr::V6(_) => {
            let sin6 = getsockopt(stream, sockopt::Ip6tOriginalDst).ok()?;
            Some(SocketAddr::V6(SocketAddrV6::new(
                sin6.sin6_addr.s6_addr.into(),
                u16::from_be(sin6.sin6_port),
                0,
                0,
            )))
        }
    }
}
