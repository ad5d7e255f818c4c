//! The kernel's TUN/TAP interface (`<linux/if_tun.h>`), defined once for
//! linnet (its TAPs and macvtaps, its relays) and its stand-in VMM: the
//! ioctl numbers, built by nix's ioctl macros from the header's `_IOW`
//! definitions; the flags; `struct ifreq` as TUNSETIFF reads it; and a
//! safe function per ioctl.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};

use libc::{c_int, c_short, c_uint, c_ulong};

/// `_IOW('T', 202, int)`: attach the fd to a device, by `struct ifreq`.
pub const TUNSETIFF: c_ulong = nix::request_code_write!(b'T', 202, size_of::<c_int>()) as c_ulong;
/// `_IOW('T', 203, int)`: keep the device when its last fd closes.
pub const TUNSETPERSIST: c_ulong =
    nix::request_code_write!(b'T', 203, size_of::<c_int>()) as c_ulong;
/// `_IOW('T', 204, int)`: the uid that may open it.
pub const TUNSETOWNER: c_ulong = nix::request_code_write!(b'T', 204, size_of::<c_int>()) as c_ulong;
/// `_IOW('T', 206, int)`: the gid that may open it.
pub const TUNSETGROUP: c_ulong = nix::request_code_write!(b'T', 206, size_of::<c_int>()) as c_ulong;
/// `_IOW('T', 208, unsigned int)`: the offloads the reader accepts.
pub const TUNSETOFFLOAD: c_ulong =
    nix::request_code_write!(b'T', 208, size_of::<c_uint>()) as c_ulong;
/// `_IOW('T', 216, int)`: the size of the virtio-net header.
pub const TUNSETVNETHDRSZ: c_ulong =
    nix::request_code_write!(b'T', 216, size_of::<c_int>()) as c_ulong;

/// A TAP device (Ethernet frames), not a TUN (IP packets).
pub const IFF_TAP: c_short = 0x0002;
/// No packet information before each frame.
pub const IFF_NO_PI: c_short = 0x1000;
/// A virtio-net header before each frame.
pub const IFF_VNET_HDR: c_short = 0x4000;
/// A device with a queue per fd: each fd that sets it on the name is
/// another queue (virtio-net's multi-queue).
pub const IFF_MULTI_QUEUE: c_short = 0x0100;
/// Fail with EBUSY rather than attach to a device that has the name.
pub const IFF_TUN_EXCL: c_short = 0x8000_u16 as c_short;

/// Checksums may be left to the reader.
pub const OFFLOAD_CSUM: c_uint = 0x01;
/// TCP segmentation over IPv4 may be left to the reader.
pub const OFFLOAD_TSO4: c_uint = 0x02;
/// TCP segmentation over IPv6 may be left to the reader.
pub const OFFLOAD_TSO6: c_uint = 0x04;
/// TCP segments with ECN's congestion bit may be left to the reader too.
pub const OFFLOAD_TSO_ECN: c_uint = 0x08;

/// `struct ifreq` as TUNSETIFF reads it: a name and the flags.
#[repr(C)]
pub struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: c_short,
    _pad: [u8; 22],
}

impl IfReq {
    /// For the device `name` ("" for a macvtap's, whose name is its own),
    /// with `flags`; EINVAL for a name that does not fit.
    pub fn new(name: &str, flags: c_short) -> io::Result<IfReq> {
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags,
            _pad: [0; 22],
        };
        let bytes = name.as_bytes();
        if bytes.len() >= libc::IFNAMSIZ {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        req.name[..bytes.len()].copy_from_slice(bytes);
        Ok(req)
    }
}

fn done(rc: c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// TUNSETIFF: attaches `fd` (an open /dev/net/tun or macvtap device) to
/// the device `req` names, with its flags.
pub fn set_iff(fd: BorrowedFd<'_>, req: &mut IfReq) -> io::Result<()> {
    // SAFETY: `req` is a properly sized struct ifreq that outlives the call.
    done(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, req as *mut IfReq) })
}

/// TUNSETPERSIST.
pub fn set_persist(fd: BorrowedFd<'_>, persist: bool) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes an integer argument.
    done(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETPERSIST as _, persist as c_ulong) })
}

/// TUNSETOWNER.
pub fn set_owner(fd: BorrowedFd<'_>, uid: u32) -> io::Result<()> {
    // SAFETY: TUNSETOWNER takes an integer argument.
    done(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOWNER as _, uid as c_ulong) })
}

/// TUNSETGROUP.
pub fn set_group(fd: BorrowedFd<'_>, gid: u32) -> io::Result<()> {
    // SAFETY: TUNSETGROUP takes an integer argument.
    done(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETGROUP as _, gid as c_ulong) })
}

/// TUNSETOFFLOAD: the offloads (`OFFLOAD_*`) the reader accepts.
pub fn set_offload(fd: BorrowedFd<'_>, offloads: c_uint) -> io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes an integer argument.
    done(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD as _, offloads as c_ulong) })
}

/// TUNSETVNETHDRSZ: the size of the virtio-net header (at least 10).
pub fn set_vnet_header_len(fd: BorrowedFd<'_>, len: c_int) -> io::Result<()> {
    // SAFETY: TUNSETVNETHDRSZ reads an int through the pointer.
    done(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETVNETHDRSZ as _, &len as *const c_int) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_numbers_are_the_headers() {
        // As <linux/if_tun.h> gives them on x86_64 and aarch64.
        assert_eq!(TUNSETIFF, 0x4004_54ca);
        assert_eq!(TUNSETPERSIST, 0x4004_54cb);
        assert_eq!(TUNSETOWNER, 0x4004_54cc);
        assert_eq!(TUNSETGROUP, 0x4004_54ce);
        assert_eq!(TUNSETOFFLOAD, 0x4004_54d0);
        assert_eq!(TUNSETVNETHDRSZ, 0x4004_54d8);
        assert_eq!(IFF_TUN_EXCL as u16, 0x8000);
        assert_eq!(size_of::<IfReq>(), 40, "struct ifreq");
    }

    #[test]
    fn a_name_must_fit() {
        assert!(IfReq::new("lnt4294967295", IFF_TAP).is_ok());
        let long = IfReq::new("a-name-too-long!", IFF_TAP).err().unwrap();
        assert_eq!(long.raw_os_error(), Some(libc::EINVAL));
    }
}
