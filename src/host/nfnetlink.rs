//! What linnet's two netfilter netlink sockets share (`nfqueue`, the
//! gate's queue; `conntrack_events`, allowed connections' ends): the
//! socket, a read that never waits, and the attributes of a message
//! (linux/netlink.h, linux/netfilter/nfnetlink.h).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A netlink message's header, and nfnetlink's after it.
pub const NLMSG_HDRLEN: usize = 16;
pub const NFGENMSG_LEN: usize = 4;
pub const NLA_HDRLEN: usize = 4;
/// An attribute's type, without the nested and byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// A NETLINK_NETFILTER socket that never blocks, its receive buffer
/// `rcvbuf` bytes (past rmem_max as root; failing that, the default).
pub fn socket(rcvbuf: usize) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the fd is owned next.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd of ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = libc::c_int::try_from(rcvbuf).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt with an int option of ours.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    Ok(fd)
}

/// Reads what waits on `fd` into `buf`: the bytes read, 0 when nothing
/// did.
pub fn recv(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: recv(2) into `buf`.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(0),
            _ => Err(e),
        };
    }
    Ok(n as usize)
}

/// `n` rounded up to netlink's 4-byte alignment.
pub fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// The attributes in `b`, by type.
pub fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < NLA_HDRLEN {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > b.len() {
            return None;
        }
        let value = &b[NLA_HDRLEN..len];
        b = &b[align(len).min(b.len())..];
        Some((kind, value))
    })
}

/// The value of the first attribute of type `kind` in `b`.
pub fn find(b: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(b).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

pub fn be16(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?))
}

pub fn be32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

pub fn be64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}
