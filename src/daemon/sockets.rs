//! The daemon's unix sockets: binding, accepting (patiently when out of
//! file descriptors), registering with tokio, and who is at the other end
//! (`host::peer`); and the frames a packet socket sees (`Frames`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

use super::client::Client;
use crate::host::accounts;
use crate::host::packet::{self, Seen};
use crate::host::peer::Peer;

/// How long accepting pauses when the daemon is out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The next connection on `listener` (`socket` names it in logs). Out of
/// file descriptors, or on any other failure, it waits a moment and tries
/// again: the connection waits in the backlog, and spinning on it would
/// only burn the CPU the others need. `waited` counts those waits across
/// calls, for one line when they start and one when they end.
pub(super) async fn accept_next(
    listener: &AsyncFd<OwnedFd>,
    socket: &str,
    waited: &mut u64,
) -> AsyncFd<OwnedFd> {
    loop {
        match accept(listener).await {
            Ok(conn) => {
                if *waited > 0 {
                    info!(
                        waited = *waited,
                        "file descriptors free again: accepting on {socket}"
                    );
                    *waited = 0;
                }
                return conn;
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                if *waited == 0 {
                    warn!(
                        "out of file descriptors ({e}): new connections to {socket} wait until some close"
                    );
                }
                *waited += 1;
            }
            Err(e) => warn!("accept on {socket} failed: {e}"),
        }
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    }
}

/// A unix socket of `kind` bound at `path`, close-on-exec and
/// non-blocking; nobody can connect before the caller listens.
pub(super) fn bind_unix(path: &Path, kind: SockType) -> anyhow::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Unix,
        kind,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    let addr = UnixAddr::new(path)?;
    socket::bind(fd.as_raw_fd(), &addr)
        .with_context(|| format!("cannot bind {}", path.display()))?;
    Ok(fd)
}

async fn accept(listener: &AsyncFd<OwnedFd>) -> io::Result<AsyncFd<OwnedFd>> {
    loop {
        let mut ready = listener.readable().await?;
        match ready.try_io(|fd| {
            socket::accept4(
                fd.as_raw_fd(),
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            )
            .map_err(io::Error::from)
        }) {
            Ok(Ok(raw)) => {
                // SAFETY: accept4 returned a new descriptor that we now own.
                let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
                return register(fd);
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// Watches an fd we own exclusively (OwnedFd): nothing else can close it
/// behind tokio's back, which is the safety condition of `register`.
pub(super) fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the OwnedFd moves into the AsyncFd and is closed only by it.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// The frames a packet socket (`host::packet`) passes, one at a time.
pub(super) struct Frames {
    fd: AsyncFd<OwnedFd>,
    buf: Vec<u8>,
    /// What reads them, in logs.
    what: &'static str,
}

impl Frames {
    /// Reads `socket` (the frames' first `len` bytes), for `what`.
    pub fn new(socket: io::Result<OwnedFd>, len: usize, what: &'static str) -> io::Result<Frames> {
        Ok(Frames {
            fd: socket.and_then(register)?,
            buf: vec![0; len],
            what,
        })
    }

    /// The next frame: which port it passed, which way, and its bytes (as
    /// many as the buffer holds). None once the socket has failed.
    pub async fn next(&mut self) -> Option<(Seen, &[u8])> {
        loop {
            let mut ready = match self.fd.readable().await {
                Ok(ready) => ready,
                Err(e) => {
                    warn!("{} stopped: {e}", self.what);
                    return None;
                }
            };
            match packet::recv(self.fd.get_ref(), &mut self.buf) {
                Ok(seen) => {
                    let len = seen.len.min(self.buf.len());
                    return Some((seen, &self.buf[..len]));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready.clear_ready(),
                Err(e) => warn!("{}: {e}", self.what),
            }
        }
    }
}

/// Why a connection has no client.
#[derive(Debug)]
pub(super) enum Unidentified {
    /// The kernel would not say who it is.
    Io(io::Error),
    /// It cannot be charged to an account: it is refused, told why.
    Gone(accounts::PeerGone),
}

impl std::fmt::Display for Unidentified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unidentified::Io(e) => e.fmt(f),
            Unidentified::Gone(gone) => gone.fmt(f),
        }
    }
}

impl std::error::Error for Unidentified {}

/// Who is at the other end of `conn`, in the kernel's word: what they
/// connected as (SO_PEERCRED), whatever they do since, and the user
/// namespace of the very process that connected (through SO_PEERPIDFD),
/// for its account.
pub(super) fn identify(conn: &AsyncFd<OwnedFd>, id: u64) -> Result<Client, Unidentified> {
    let peer = Peer::of(conn.get_ref().as_fd()).map_err(Unidentified::Io)?;
    let account =
        accounts::account_of(peer.uid, &peer.user_namespace()).map_err(Unidentified::Gone)?;
    let (pid, process) = peer.client();
    Ok(Client {
        id,
        pid,
        uid: peer.uid,
        gid: peer.gid,
        account,
        groups: accounts::member_groups(account),
        process,
        network_socket: None,
    })
}
