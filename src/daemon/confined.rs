//! Starting a confined process of linnet's own (`linnet-gate`,
//! `linnet-secrets`): its environment cleared, as its own uid and gid
//! with no capabilities, the daemon's sockets at the fds it expects, and
//! killed if the daemon dies.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::host::privileges;

/// `name`, installed beside the daemon's own executable; `does` says
/// what it is for, in the error when it is missing.
pub(super) fn beside_me(name: &str, does: &str) -> anyhow::Result<std::path::PathBuf> {
    let me = std::env::current_exe()?;
    let executable = me.with_file_name(name);
    if !executable.is_file() {
        anyhow::bail!(
            "{} is missing: {does}; install it next to {}",
            executable.display(),
            me.display()
        );
    }
    Ok(executable)
}

/// Starts `executable` as `run_as` (None: the daemon's own ids) with
/// each of `fds` at the number given.
pub(super) fn spawn(
    executable: &Path,
    run_as: Option<(u32, u32)>,
    fds: &[(BorrowedFd<'_>, RawFd)],
) -> io::Result<Child> {
    // Copies above every target first, so that placing one never
    // overwrites another still to be placed.
    let above = fds.iter().map(|(_, to)| *to).max().unwrap_or(2) + 1;
    let copies: Vec<(OwnedFd, RawFd)> = fds
        .iter()
        .map(|(fd, to)| {
            let copy = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(above))?;
            // SAFETY: fcntl made this fd, and nothing else holds it.
            Ok((unsafe { OwnedFd::from_raw_fd(copy) }, *to))
        })
        .collect::<Result<_, nix::Error>>()?;
    let placed: Vec<(RawFd, RawFd)> = copies.iter().map(|(c, to)| (c.as_raw_fd(), *to)).collect();
    let mut cmd = Command::new(executable);
    cmd.env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if let Some((uid, gid)) = run_as {
        cmd.uid(uid).gid(gid);
    }
    // SAFETY: between fork and exec only async-signal-safe calls (dup2,
    // prctl, capset) on memory allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for &(from, to) in &placed {
                // dup2 clears close-on-exec on the copy it makes.
                if libc::dup2(from, to) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // It dies with the daemon.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            privileges::clear_capabilities()
        });
    }
    let child = cmd.spawn();
    drop(copies);
    child
}

/// A SOCK_SEQPACKET pair to a confined process: (the daemon's end, with
/// room to send messages of up to `room` bytes at once; the process's).
pub(super) fn pair(room: usize) -> io::Result<(UnixDatagram, UnixDatagram)> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let (ours, theirs) = (UnixDatagram::from(ours), UnixDatagram::from(theirs));
    room_to_send(&ours, room);
    Ok((ours, theirs))
}

/// Gives `socket` room to send messages of up to `size` bytes at once
/// (past wmem_max as root; a rootless daemon gets what it may).
fn room_to_send(socket: &impl AsRawFd, size: usize) {
    let size = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt with an int option of ours.
    let forced = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if forced < 0 {
        // SAFETY: as above, the option a user may set.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
}
