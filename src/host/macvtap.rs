//! Opening a macvtap's character device. A macvtap is a link (made over
//! netlink) and a character device, /dev/tapN, whose fd reads and writes
//! the VM's frames like a TAP fd. The device's minor is the kernel's to
//! choose and only sysfs tells it, and udev (which would make /dev/tapN)
//! may not run: the daemon makes the node itself, root's alone, opens it
//! and removes it, so the fd is the only way in.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use linnet_tun::{IFF_NO_PI, IFF_TAP, IFF_VNET_HDR, IfReq};

/// The fd of the macvtap `name` (index `index`), with the virtio-net header
/// on, as a TAP fd from linnet has it. `scratch` is a root-only directory
/// where the device node lives for the moment it takes to open it.
pub fn open(name: &str, index: u32, scratch: &Path) -> io::Result<OwnedFd> {
    let sys = format!("/sys/class/net/{name}/macvtap/tap{index}/dev");
    let dev = std::fs::read_to_string(&sys)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read {sys}: {e}")))?;
    let (major, minor) = parse_dev(&dev).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{sys} holds \"{}\", not MAJOR:MINOR", dev.trim()),
        )
    })?;
    std::fs::create_dir_all(scratch)?;
    let node = scratch.join(format!("tap{index}"));
    let _ = std::fs::remove_file(&node);
    let c_node = std::ffi::CString::new(node.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated path; mknod reads nothing else.
    let made = unsafe {
        libc::mknod(
            c_node.as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(major, minor),
        )
    };
    if made < 0 {
        return Err(io::Error::last_os_error());
    }
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&node);
    let _ = std::fs::remove_file(&node);
    let file = opened?;
    // A macvtap's TUNSETIFF reads only the flags: its name is its own.
    let mut req = IfReq::new("", IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)?;
    linnet_tun::set_iff(file.as_fd(), &mut req)?;
    Ok(file.into())
}

/// "MAJOR:MINOR\n" as sysfs writes a device number.
fn parse_dev(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_are_read_as_sysfs_writes_them() {
        assert_eq!(parse_dev("236:1\n"), Some((236, 1)));
        assert_eq!(parse_dev("236"), None);
        assert_eq!(parse_dev("a:1"), None);
    }
}
