//! Network namespaces of the daemon's own making (a clone's, `clone_ns`):
//! made and entered by the calling thread alone, which is back in its own
//! namespace before either returns. Nothing but an fd keeps one: when the
//! daemon drops it and no socket or process is left in it, the kernel
//! takes the namespace and its links away.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The namespace the thread is in now.
fn current() -> io::Result<OwnedFd> {
    File::open("/proc/thread-self/ns/net").map(OwnedFd::from)
}

fn set(ns: &OwnedFd) -> io::Result<()> {
    // SAFETY: setns on a namespace fd we own; only this thread moves.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts the thread back in its own namespace, also when the work inside
/// panics.
struct Back(OwnedFd);

impl Drop for Back {
    fn drop(&mut self) {
        if let Err(e) = set(&self.0) {
            // Staying in another namespace would apply the daemon's next
            // change there: nothing it does from here on can be trusted.
            eprintln!("linnet: cannot return to the daemon's network namespace: {e}");
            std::process::abort();
        }
    }
}

/// A network namespace, held open by its fd.
#[derive(Debug)]
pub struct NetNs {
    fd: OwnedFd,
}

impl NetNs {
    /// A stand-in holding any fd, for the fake host (`host::fake`).
    #[cfg(test)]
    pub fn fake(fd: OwnedFd) -> NetNs {
        NetNs { fd }
    }

    /// A new, empty namespace (its loopback down).
    pub fn create() -> io::Result<NetNs> {
        let back = Back(current()?);
        // SAFETY: unshare moves only the calling thread into a new network
        // namespace; `back` returns it.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = current();
        drop(back);
        Ok(NetNs { fd: fd? })
    }

    /// Runs `work` with the calling thread in the namespace: sockets it
    /// opens, devices it creates and sysctls it writes are the namespace's.
    /// `work` must not yield to other tasks of the thread (it is not async).
    pub fn enter<R>(&self, work: impl FnOnce() -> R) -> io::Result<R> {
        let back = Back(current()?);
        set(&self.fd)?;
        let result = work();
        drop(back);
        Ok(result)
    }

    /// The fd, for IFLA_NET_NS_FD (a link made into the namespace).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Gives the namespace a name in the file system, as `ip netns` does:
    /// `path` (a new file) for whoever must enter it (`nsenter --net=PATH`,
    /// Firecracker's jailer `--netns PATH`). Undone by `unmount`.
    pub fn mount_at(&self, path: &Path) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(path)?;
        let source = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        let mounted = nix::mount::mount(
            Some(source.as_str()),
            path,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        );
        if let Err(e) = mounted {
            let _ = std::fs::remove_file(path);
            return Err(e.into());
        }
        Ok(())
    }
}

/// Takes a namespace's name (`NetNs::mount_at`) away; the namespace lives
/// on while anything else holds it. A path that is no mount (left by a
/// daemon that died) is removed all the same.
pub fn unmount(path: &Path) -> io::Result<()> {
    match nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode(path: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn a_made_namespace_is_entered_and_left_by_the_thread_alone() {
        // Making one takes CAP_SYS_ADMIN: `make test` runs as root.
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let ns = NetNs::create().unwrap();
        let home = inode("/proc/thread-self/ns/net");
        let inside = ns.enter(|| inode("/proc/thread-self/ns/net")).unwrap();
        assert_ne!(inside, home);
        assert_eq!(inode("/proc/thread-self/ns/net"), home, "back home");
        let again = ns.enter(|| inode("/proc/thread-self/ns/net")).unwrap();
        assert_eq!(again, inside, "the same namespace each time");
    }
}
