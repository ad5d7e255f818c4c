//! TAP devices: created through /dev/net/tun, owned by the VM's user, with a
//! virtio-net header so guests can use checksum and segmentation offloads.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use thiserror::Error;

use super::TUN_DEVICE;

use linnet_tun::{IFF_MULTI_QUEUE, IFF_NO_PI, IFF_TAP, IFF_TUN_EXCL, IFF_VNET_HDR, IfReq};
/// The offloads a reader of a TAP may accept (`set_offload`).
pub use linnet_tun::{OFFLOAD_CSUM, OFFLOAD_TSO_ECN, OFFLOAD_TSO4, OFFLOAD_TSO6};

#[derive(Debug, Error)]
pub enum TapError {
    #[error(
        "{TUN_DEVICE} is missing: load the tun module (modprobe tun) or create it (mknod {TUN_DEVICE} c 10 200)"
    )]
    TunMissing,
    #[error("cannot open {TUN_DEVICE}: {0}")]
    TunOpen(io::Error),
    #[error("cannot create TAP {name}: {source}")]
    Create { name: String, source: io::Error },
    #[error("a link named {0} exists already")]
    NameTaken(String),
    #[error("cannot give TAP {name} to uid {uid} gid {gid}: {source}")]
    Owner {
        name: String,
        uid: u32,
        gid: u32,
        source: io::Error,
    },
}

/// The most queues a TAP may have here (the kernel allows 256; a VM has
/// no use for more queues than vCPUs).
pub const MAX_QUEUES: u16 = 16;

/// The flags of linnet's TAPs: Ethernet frames with a virtio-net header,
/// and a queue per fd when it has more than one. A VMM that opens one by
/// name must ask for the same `IFF_MULTI_QUEUE` (the kernel refuses a
/// mismatch), so a tap-name TAP is made with it exactly when the attach
/// asked for more than one queue.
fn flags(queues: u16) -> libc::c_short {
    let multi = if queues > 1 { IFF_MULTI_QUEUE } else { 0 };
    IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | multi
}

fn open_tun() -> Result<std::fs::File, TapError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(TUN_DEVICE)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                TapError::TunMissing
            } else {
                TapError::TunOpen(e)
            }
        })
}

/// Creates the TAP `name` (non-persistent: it disappears when the last fd
/// to it closes) owned by `uid`/`gid`, with `queues` queues, and returns
/// an fd for each. Never opens a TAP that exists already: that is
/// `NameTaken`.
pub fn create(name: &str, uid: u32, gid: u32, queues: u16) -> Result<Vec<OwnedFd>, TapError> {
    let file = open_tun()?;
    let created = IfReq::new(name, flags(queues) | IFF_TUN_EXCL)
        .and_then(|mut req| linnet_tun::set_iff(file.as_fd(), &mut req));
    if let Err(source) = created {
        if source.raw_os_error() == Some(libc::EBUSY) {
            return Err(TapError::NameTaken(name.into()));
        }
        return Err(TapError::Create {
            name: name.into(),
            source,
        });
    }
    let owner_err = |source| TapError::Owner {
        name: name.into(),
        uid,
        gid,
        source,
    };
    linnet_tun::set_owner(file.as_fd(), uid).map_err(owner_err)?;
    linnet_tun::set_group(file.as_fd(), gid).map_err(owner_err)?;
    let mut fds = vec![OwnedFd::from(file)];
    // The other queues: the device is ours (made above, owned by the
    // user, whom alone besides root the kernel lets attach a queue).
    for _ in 1..queues {
        let queue = open_tun()?;
        IfReq::new(name, flags(queues))
            .and_then(|mut req| linnet_tun::set_iff(queue.as_fd(), &mut req))
            .map_err(|source| TapError::Create {
                name: name.into(),
                source,
            })?;
        fds.push(queue.into());
    }
    Ok(fds)
}

/// A new TAP owned by `uid`/`gid`, named `lnt<N>` by the daemon's counter:
/// the first free name from `next` on. A link that has a name already is
/// never opened or deleted (whoever made it), only passed over.
pub fn create_numbered(
    next: &mut u32,
    uid: u32,
    gid: u32,
    queues: u16,
) -> Result<(String, Vec<OwnedFd>), TapError> {
    let mut tries = 0;
    loop {
        let name = super::tap_name(*next);
        *next = next.wrapping_add(1);
        match create(&name, uid, gid, queues) {
            Err(TapError::NameTaken(_)) if tries < 4096 => tries += 1,
            Err(e) => return Err(e),
            Ok(fd) => return Ok((name, fd)),
        }
    }
}

/// Gives a TAP to `uid`/`gid`: only they (and root) may open it by name or
/// attach a queue to it. A TAP whose link was deleted is `EBADFD`.
pub fn give(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    linnet_tun::set_owner(fd, uid)?;
    linnet_tun::set_group(fd, gid)
}

/// Keeps the TAP when its last fd closes, for a VMM to open by name (only
/// its owner may: TUNSETOWNER/TUNSETGROUP); linnet deletes it at detach.
pub fn set_persistent(fd: BorrowedFd<'_>) -> io::Result<()> {
    linnet_tun::set_persist(fd, true)
}

/// The size of the virtio-net header in front of each frame (at least 10).
pub fn set_vnet_header_len(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
    linnet_tun::set_vnet_header_len(fd, len as libc::c_int)
}

/// The offloads (OFFLOAD_*) the reader of this TAP accepts: what the kernel
/// may leave undone in the frames it hands over.
pub fn set_offload(fd: BorrowedFd<'_>, offloads: u32) -> io::Result<()> {
    linnet_tun::set_offload(fd, offloads)
}
