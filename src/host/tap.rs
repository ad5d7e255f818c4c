//! TAP devices: created through /dev/net/tun, owned by the VM's user, with a
//! virtio-net header so guests can use checksum and segmentation offloads.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use thiserror::Error;

use super::TUN_DEVICE;

// From <linux/if_tun.h>.
pub(super) const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const TUNSETOWNER: libc::c_ulong = 0x4004_54cc;
const TUNSETGROUP: libc::c_ulong = 0x4004_54ce;
pub(super) const IFF_TAP: libc::c_short = 0x0002;
pub(super) const IFF_NO_PI: libc::c_short = 0x1000;
pub(super) const IFF_VNET_HDR: libc::c_short = 0x4000;
/// Fail with EBUSY rather than attach to a TAP that already has the name.
const IFF_TUN_EXCL: libc::c_short = -0x8000;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
pub const OFFLOAD_CSUM: u32 = 0x01;
pub const OFFLOAD_TSO4: u32 = 0x02;
pub const OFFLOAD_TSO6: u32 = 0x04;

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

#[repr(C)]
pub(super) struct IfReq {
    pub(super) name: [u8; libc::IFNAMSIZ],
    pub(super) flags: libc::c_short,
    pub(super) _pad: [u8; 22],
}

/// Creates the TAP `name` (non-persistent: it disappears when the last fd
/// to it closes) owned by `uid`/`gid`, and returns its fd. Never opens a
/// TAP that exists already: that is `NameTaken`.
pub fn create(name: &str, uid: u32, gid: u32) -> Result<OwnedFd, TapError> {
    let file = OpenOptions::new()
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
        })?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_TUN_EXCL,
        _pad: [0; 22],
    };
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return Err(TapError::Create {
            name: name.into(),
            source: io::Error::from_raw_os_error(libc::EINVAL),
        });
    }
    req.name[..bytes.len()].copy_from_slice(bytes);
    let fd = file.as_raw_fd();
    // SAFETY: `req` is a properly sized struct ifreq that outlives the call.
    if unsafe { libc::ioctl(fd, TUNSETIFF as _, &mut req) } < 0 {
        let source = io::Error::last_os_error();
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
    // SAFETY: both ioctls take an integer argument.
    if unsafe { libc::ioctl(fd, TUNSETOWNER as _, uid as libc::c_ulong) } < 0 {
        return Err(owner_err(io::Error::last_os_error()));
    }
    if unsafe { libc::ioctl(fd, TUNSETGROUP as _, gid as libc::c_ulong) } < 0 {
        return Err(owner_err(io::Error::last_os_error()));
    }
    Ok(file.into())
}

/// A new TAP owned by `uid`/`gid`, named `lnt<N>` by the daemon's counter:
/// the first free name from `next` on. A link that has a name already is
/// never opened or deleted (whoever made it), only passed over.
pub fn create_numbered(next: &mut u32, uid: u32, gid: u32) -> Result<(String, OwnedFd), TapError> {
    let mut tries = 0;
    loop {
        let name = super::tap_name(*next);
        *next = next.wrapping_add(1);
        match create(&name, uid, gid) {
            Err(TapError::NameTaken(_)) if tries < 4096 => tries += 1,
            Err(e) => return Err(e),
            Ok(fd) => return Ok((name, fd)),
        }
    }
}

/// Keeps the TAP when its last fd closes, for a VMM to open by name (only
/// its owner may: TUNSETOWNER/TUNSETGROUP); linnet deletes it at detach.
pub fn set_persistent(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes an integer argument.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETPERSIST as _, 1 as libc::c_ulong) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The size of the virtio-net header in front of each frame (at least 10).
pub fn set_vnet_header_len(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
    let len = len as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads an int through the pointer.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETVNETHDRSZ as _, &len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The offloads (OFFLOAD_*) the reader of this TAP accepts: what the kernel
/// may leave undone in the frames it hands over.
pub fn set_offload(fd: BorrowedFd<'_>, offloads: u32) -> io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes an integer argument.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            TUNSETOFFLOAD as _,
            offloads as libc::c_ulong,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
