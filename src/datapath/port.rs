//! The VMM's side of a relay: a unix socket the caller hands over as an fd,
//! or one the relay binds at a path and serves its first client on.

use std::fmt;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use nix::sys::socket::{
    self, AddressFamily, Backlog, SockFlag, SockType, UnixAddr, setsockopt, sockopt,
};

use super::Datapath;

/// What is wrong with the VMM's socket: which one, and how.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {message}")]
pub struct SocketError {
    pub what: String,
    pub message: String,
}

/// Where the VMM's frames come and go.
#[derive(Debug)]
pub enum Endpoint {
    /// A connected unix datagram socket (one end of a socketpair).
    DgramFd(OwnedFd),
    /// A unix datagram socket bound at this path; the first client to send
    /// a frame is served, frames from others are dropped.
    DgramPath(PathBuf),
    /// A connected unix stream socket.
    StreamFd(OwnedFd),
    /// A unix stream socket listening at this path, serving one client at
    /// a time.
    StreamPath(PathBuf),
}

impl Endpoint {
    pub fn datapath(&self) -> Datapath {
        match self {
            Endpoint::DgramFd(_) | Endpoint::DgramPath(_) => Datapath::Dgram,
            Endpoint::StreamFd(_) | Endpoint::StreamPath(_) => Datapath::Stream,
        }
    }
}

pub(super) enum Port {
    Dgram {
        sock: OwnedFd,
        peer: Peer,
    },
    Stream {
        conn: Option<OwnedFd>,
        /// Present when the relay listens at a path.
        listener: Option<OwnedFd>,
    },
}

pub(super) enum Peer {
    /// A socketpair end: the kernel knows the peer.
    Connected,
    /// A bound socket, before its first client.
    Awaiting,
    Known(SockAddr),
}

/// A datagram sender's address, as recvmmsg filled it in.
#[derive(Clone, Copy)]
pub(super) struct SockAddr {
    pub addr: libc::sockaddr_un,
    pub len: libc::socklen_t,
}

impl SockAddr {
    pub fn empty() -> SockAddr {
        SockAddr {
            // SAFETY: sockaddr_un is plain old data; all zeroes is valid.
            addr: unsafe { mem::zeroed() },
            len: mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        }
    }

    fn path_bytes(&self) -> &[u8] {
        let n = (self.len as usize).saturating_sub(mem::size_of::<libc::sa_family_t>());
        // SAFETY: sun_path is an array of c_char, the same layout as u8.
        let path: &[u8; 108] = unsafe { &*(&self.addr.sun_path as *const _ as *const [u8; 108]) };
        &path[..n.min(path.len())]
    }

    /// An unbound sender cannot be answered.
    pub fn is_named(&self) -> bool {
        !self.path_bytes().is_empty()
    }

    pub fn same(&self, other: &SockAddr) -> bool {
        self.path_bytes() == other.path_bytes()
    }
}

impl fmt::Display for SockAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.path_bytes();
        match bytes.first() {
            None => f.write_str("(unbound)"),
            Some(0) => write!(f, "@{}", String::from_utf8_lossy(&bytes[1..])),
            Some(_) => {
                let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                f.write_str(&String::from_utf8_lossy(&bytes[..end]))
            }
        }
    }
}

/// Socket buffers as large as the system allows (net.core.{w,r}mem_max):
/// more frames in flight between the relay and the VMM.
const SOCKET_BUFFER: usize = 4 << 20;

pub(super) fn open(endpoint: Endpoint) -> Result<Port, SocketError> {
    Ok(match endpoint {
        Endpoint::DgramFd(fd) => {
            check_type(&fd, SockType::Datagram)?;
            Port::Dgram {
                sock: prepare(fd)?,
                peer: Peer::Connected,
            }
        }
        Endpoint::DgramPath(path) => Port::Dgram {
            sock: prepare(bind(&path, SockType::Datagram)?)?,
            peer: Peer::Awaiting,
        },
        Endpoint::StreamFd(fd) => {
            check_type(&fd, SockType::Stream)?;
            Port::Stream {
                conn: Some(prepare(fd)?),
                listener: None,
            }
        }
        Endpoint::StreamPath(path) => Port::Stream {
            conn: None,
            listener: Some(prepare(listen_at(&path)?.into())?),
        },
    })
}

/// A unix stream socket listening at `path` (see `bind`).
pub fn listen_at(path: &Path) -> Result<std::os::unix::net::UnixListener, SocketError> {
    let listener = bind(path, SockType::Stream)?;
    socket::listen(&listener, Backlog::new(8).expect("valid backlog")).map_err(|e| {
        SocketError {
            what: path.display().to_string(),
            message: format!("cannot listen: {e}"),
        }
    })?;
    Ok(listener.into())
}

/// A client socket: non-blocking, large buffers.
pub(super) fn prepare(fd: OwnedFd) -> Result<OwnedFd, SocketError> {
    set_nonblocking(fd.as_raw_fd()).map_err(|e| SocketError {
        what: format!("fd {}", fd.as_raw_fd()),
        message: format!("cannot make it non-blocking: {e}"),
    })?;
    // Best effort: beyond the system's maximum the kernel clamps.
    let _ = setsockopt(&fd, sockopt::SndBuf, &SOCKET_BUFFER);
    let _ = setsockopt(&fd, sockopt::RcvBuf, &SOCKET_BUFFER);
    Ok(fd)
}

pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain fcntl on a descriptor we hold.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn type_name(t: libc::c_int) -> &'static str {
    match t {
        libc::SOCK_DGRAM => "a datagram socket",
        libc::SOCK_STREAM => "a stream socket",
        libc::SOCK_SEQPACKET => "a seqpacket socket",
        _ => "another kind of socket",
    }
}

fn check_type(fd: &OwnedFd, want: SockType) -> Result<(), SocketError> {
    let raw = fd.as_raw_fd();
    let wrong = |message: String| SocketError {
        what: format!("fd {raw}"),
        message,
    };
    let hint = match want {
        SockType::Datagram => "pass one end of socketpair(AF_UNIX, SOCK_DGRAM)",
        _ => "pass one end of socketpair(AF_UNIX, SOCK_STREAM)",
    };
    match socket::getsockopt(fd, sockopt::SockType) {
        Ok(t) if t == want => Ok(()),
        Ok(t) => Err(wrong(format!(
            "is {}, not {}; {hint}",
            type_name(t as libc::c_int),
            type_name(want as libc::c_int)
        ))),
        Err(nix::Error::ENOTSOCK) => Err(wrong(format!("is not a socket; {hint}"))),
        Err(nix::Error::EBADF) => Err(wrong(format!("is not open; {hint}"))),
        Err(e) => Err(wrong(format!("{e}; {hint}"))),
    }
}

/// Binds a unix socket at `path`, replacing a stale socket file (nobody
/// listening) but never a live one or another kind of file.
fn bind(path: &Path, kind: SockType) -> Result<OwnedFd, SocketError> {
    let err = |message: String| SocketError {
        what: path.display().to_string(),
        message,
    };
    let addr = UnixAddr::new(path).map_err(|e| err(format!("not a usable socket path: {e}")))?;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(err(
                "exists and is not a socket; remove it or choose another path".into(),
            ));
        }
        let probe = socket::socket(AddressFamily::Unix, kind, SockFlag::SOCK_CLOEXEC, None)
            .map_err(|e| err(format!("cannot create a socket: {e}")))?;
        match socket::connect(probe.as_raw_fd(), &addr) {
            Err(nix::Error::ECONNREFUSED) => std::fs::remove_file(path)
                .map_err(|e| err(format!("cannot remove the stale socket: {e}")))?,
            Ok(()) => {
                return Err(err(
                    "is in use by another process; stop it or choose another path".into(),
                ));
            }
            Err(e) => return Err(err(format!("exists and cannot be checked: {e}"))),
        }
    }
    let fd = socket::socket(AddressFamily::Unix, kind, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| err(format!("cannot create a socket: {e}")))?;
    socket::bind(fd.as_raw_fd(), &addr).map_err(|e| err(format!("cannot bind: {e}")))?;
    Ok(fd)
}
