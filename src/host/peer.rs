//! The process at the other end of a unix socket, as the kernel saw it
//! connect: its credentials (`SO_PEERCRED`) and a pidfd for that very
//! process (`SO_PEERPIDFD`, Linux 6.5), which names it even once its pid
//! is another process's. Its user namespace comes through the pidfd
//! (`PIDFD_GET_USER_NAMESPACE`, Linux 6.11); on a kernel without that,
//! through `/proc/PID`, and the read counts only if the pidfd says the
//! process still ran after it (so the pid was still its). A process that
//! connected and exited before the daemon looked is `Gone`: what it was
//! cannot be read any more, and a caller must not guess.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::sys::socket::{self, sockopt};

use super::process::{self, Process};

/// The name a confined client's connector runs as (`cli::connector`).
pub const CONNECTOR: &std::ffi::CStr = c"linnet-connect";

/// Who connected.
#[derive(Debug)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    /// Its pid in the daemon's pid namespace; None when it has none there.
    pub pid: Option<i32>,
    pidfd: Pidfd,
}

#[derive(Debug)]
enum Pidfd {
    Open(OwnedFd),
    /// A kernel without `SO_PEERPIDFD`, or a peer without a pid.
    Unsupported,
    /// The kernel could make none: the peer was reaped (before Linux
    /// 6.16, which makes one for a reaped peer too).
    PeerGone,
}

/// The user namespace a peer was in.
#[derive(Debug)]
pub enum PeerNamespace {
    /// The daemon's own.
    Ours,
    /// Another: its nsfs file.
    Other(File),
    /// The process has exited, or its pid names another process now.
    Gone,
}

impl Peer {
    /// The peer of the connected unix socket `fd`.
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<Peer> {
        let cred = socket::getsockopt(&fd, sockopt::PeerCredentials)?;
        let mut pidfd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: SO_PEERPIDFD writes one int (a new fd) to `pidfd`.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERPIDFD,
                (&raw mut pidfd).cast(),
                &mut len,
            )
        };
        let pidfd = if rc == 0 && pidfd >= 0 {
            // SAFETY: the kernel made this descriptor for us alone.
            Pidfd::Open(unsafe { OwnedFd::from_raw_fd(pidfd) })
        } else {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINVAL) | Some(libc::ESRCH) => Pidfd::PeerGone,
                Some(libc::ENOPROTOOPT) | Some(libc::ENODATA) => Pidfd::Unsupported,
                // A daemon out of descriptors serves on as without one
                // (and connections wait in the backlog once accept fails).
                Some(libc::EMFILE) | Some(libc::ENFILE) => Pidfd::Unsupported,
                _ => return Err(io::Error::last_os_error()),
            }
        };
        Ok(Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            pid: (cred.pid() > 0).then_some(cred.pid()),
            pidfd,
        })
    }

    /// Whether the process that connected still runs (a zombie counts:
    /// it keeps its credentials until it is reaped). Without a pidfd,
    /// whether its pid still names a process, whichever.
    pub fn lives(&self) -> bool {
        match &self.pidfd {
            Pidfd::Open(pidfd) => {
                // SAFETY: signal 0 checks the process is there, sends nothing.
                let rc = unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        pidfd.as_raw_fd(),
                        0,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                };
                rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
            }
            Pidfd::Unsupported => self
                .pid
                .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists()),
            Pidfd::PeerGone => false,
        }
    }

    /// The user namespace the peer is in.
    pub fn user_namespace(&self) -> PeerNamespace {
        let ns = match &self.pidfd {
            Pidfd::Open(pidfd) => {
                // SAFETY: the ioctl takes no argument and returns a new fd.
                let fd = unsafe {
                    libc::ioctl(pidfd.as_raw_fd(), libc::PIDFD_GET_USER_NAMESPACE as _, 0)
                };
                if fd >= 0 {
                    // SAFETY: a new descriptor that nothing else owns.
                    Some(unsafe { File::from_raw_fd(fd) })
                } else if io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                    None
                } else {
                    // A kernel before 6.11.
                    self.read_in_proc(|pid| File::open(format!("/proc/{pid}/ns/user")).ok())
                }
            }
            Pidfd::Unsupported => {
                self.read_in_proc(|pid| File::open(format!("/proc/{pid}/ns/user")).ok())
            }
            Pidfd::PeerGone => None,
        };
        ns.map_or(PeerNamespace::Gone, PeerNamespace::of_file)
    }

    /// The client: the process as a next daemon can check it is still the
    /// same one. A confined client reconnects through its connector
    /// (`linnet-connect`, a child of its own: `cli::connector`), so for a
    /// peer of that name whose parent is of the same uid, the client is
    /// the parent. (A process that takes the name can only have its own
    /// parent of its own uid taken for it.)
    pub fn client(&self) -> (Option<i32>, Option<Process>) {
        let parent = self
            .read_in_proc(process::name_and_parent)
            .and_then(|(name, parent)| {
                (name.as_bytes() == CONNECTOR.to_bytes()
                    && process::uid_of(parent) == Some(self.uid))
                .then_some(parent)
            });
        match parent {
            Some(parent) => (Some(parent), Process::of(parent)),
            None => (self.pid, self.read_in_proc(Process::of)),
        }
    }

    /// What `read` reads of the peer's pid, if the peer still ran after
    /// the read (so the pid was still its).
    fn read_in_proc<T>(&self, read: impl FnOnce(i32) -> Option<T>) -> Option<T> {
        let value = read(self.pid?)?;
        self.lives().then_some(value)
    }
}

impl PeerNamespace {
    /// The user namespace of `process` (a client a next daemon adopts),
    /// if it is still that process.
    pub fn of_process(process: &Process) -> PeerNamespace {
        match File::open(format!("/proc/{}/ns/user", process.pid)) {
            Ok(ns) if process.is_running() => PeerNamespace::of_file(ns),
            _ => PeerNamespace::Gone,
        }
    }

    fn of_file(ns: File) -> PeerNamespace {
        if same_file(&ns, "/proc/self/ns/user") {
            PeerNamespace::Ours
        } else {
            PeerNamespace::Other(ns)
        }
    }
}

fn same_file(file: &File, path: &str) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_peer_in_this_process_is_in_our_namespace_and_lives() {
        let (a, _b) = UnixStream::pair().unwrap();
        let peer = Peer::of(a.as_fd()).unwrap();
        assert_eq!(peer.pid, Some(std::process::id() as i32));
        assert!(
            matches!(peer.pidfd, Pidfd::Open(_)),
            "this kernel has SO_PEERPIDFD"
        );
        assert!(peer.lives());
        assert!(matches!(peer.user_namespace(), PeerNamespace::Ours));
        assert_eq!(peer.client().1.map(|p| p.pid), Some(peer.pid.unwrap()));
    }

    #[test]
    fn a_peer_that_exited_and_was_reaped_is_gone_even_if_its_pid_is_read() {
        // A child connects, and exits; reaped before we look.
        let path = std::env::temp_dir().join(format!("linnet-peer-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])",
                path.to_str().unwrap(),
            ])
            .spawn()
            .unwrap();
        assert!(child.wait().unwrap().success());
        let (conn, _) = listener.accept().unwrap();
        std::fs::remove_file(&path).unwrap();
        let peer = Peer::of(conn.as_fd()).unwrap();
        assert!(!peer.lives());
        assert!(matches!(peer.user_namespace(), PeerNamespace::Gone));
        assert!(peer.client().1.is_none());
    }
}
