//! The service manager's side of a daemon, as systemd speaks it (and
//! `systemd-socket-activate`): the listening socket it passes
//! (`LISTEN_FDS`, sd_listen_fds(3)), the readiness it is told of
//! (`NOTIFY_SOCKET`, sd_notify(3)), and whether stderr is the journal
//! (`JOURNAL_STREAM`). Three environment variables and a datagram: no
//! library for it.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The first fd a service manager passes.
const LISTEN_FDS_START: RawFd = 3;

/// How many sockets the environment says were passed to process `pid`:
/// none unless LISTEN_PID is `pid` (they were meant for another process,
/// as when a daemon started by systemd starts one more).
pub fn passed_count(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    pid: u32,
) -> Result<usize, String> {
    let Some(listen_pid) = listen_pid else {
        return Ok(0);
    };
    if listen_pid.trim().parse::<u32>() != Ok(pid) {
        return Ok(0);
    }
    let count = listen_fds.unwrap_or("0");
    count
        .trim()
        .parse()
        .map_err(|_| format!("LISTEN_FDS is \"{count}\", not a number of sockets"))
}

/// The API socket the service manager passed, if it passed one: a unix
/// SOCK_SEQPACKET socket, listening (linnet.socket's
/// ListenSequentialPacket=). The variables are unset, so that no process
/// the daemon starts takes them for its own.
pub fn passed_socket() -> io::Result<Option<OwnedFd>> {
    let var = |name| std::env::var(name).ok();
    let count = passed_count(
        var("LISTEN_PID").as_deref(),
        var("LISTEN_FDS").as_deref(),
        std::process::id(),
    )
    .map_err(io::Error::other)?;
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        // SAFETY: called before the daemon starts any thread.
        unsafe { std::env::remove_var(name) };
    }
    match count {
        0 => return Ok(None),
        1 => {}
        n => {
            return Err(io::Error::other(format!(
                "the service manager passed {n} sockets; linnet's socket unit has one (ListenSequentialPacket=)"
            )));
        }
    }
    // A starter that said LISTEN_FDS=1 but let fd 3 close on exec: an
    // OwnedFd of a closed descriptor would abort the daemon when dropped.
    // SAFETY: F_GETFD only asks about the descriptor number.
    if unsafe { libc::fcntl(LISTEN_FDS_START, libc::F_GETFD) } < 0 {
        return Err(io::Error::other(
            "the service manager said it passed a socket (LISTEN_FDS=1), but fd 3 is not open: was it closed on exec?",
        ));
    }
    // SAFETY: sd_listen_fds(3): fd 3 is ours, passed open (checked just
    // above); nothing else in the process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(LISTEN_FDS_START) };
    let kind = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::SockType)
        .map_err(|e| io::Error::other(format!("the passed fd 3 is not a socket: {e}")))?;
    if kind != nix::sys::socket::SockType::SeqPacket {
        return Err(io::Error::other(format!(
            "the passed socket is {kind:?}, not a unix SOCK_SEQPACKET socket: use ListenSequentialPacket= in linnet's socket unit"
        )));
    }
    // Not for the processes the daemon starts; and never blocking the
    // daemon's one thread in accept (the service manager passes it as it
    // made it, blocking).
    use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
    fcntl(&fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    let flags = OFlag::from_bits_truncate(fcntl(&fd, FcntlArg::F_GETFL)?);
    fcntl(&fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(Some(fd))
}

/// Tells the service manager `state` ("READY=1", "STOPPING=1"); nothing
/// when there is none (NOTIFY_SOCKET unset).
pub fn notify(state: &str) -> io::Result<()> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        }
        None => SocketAddr::from_pathname(&path)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// Whether stderr is a stream to the journal: JOURNAL_STREAM names its
/// device and inode ("DEV:INODE"), which the service manager sets for
/// StandardError=journal.
pub fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let stderr = std::fs::metadata("/proc/self/fd/2");
    stderr.is_ok_and(|m| names_stream(&stream, m.dev(), m.ino()))
}

/// Whether JOURNAL_STREAM's "DEV:INODE" is the file `dev`, `ino`.
fn names_stream(stream: &str, dev: u64, ino: u64) -> bool {
    stream
        .split_once(':')
        .is_some_and(|(d, i)| d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino))
}

/// The syslog priority the journal takes from a line's `<N>` prefix
/// (sd-daemon(3)) for a tracing level.
pub fn priority(level: &tracing::Level) -> u8 {
    match *level {
        tracing::Level::ERROR => 3,
        tracing::Level::WARN => 4,
        tracing::Level::INFO => 6,
        _ => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_are_ours_only_when_listen_pid_is_our_pid() {
        assert_eq!(passed_count(None, Some("1"), 42), Ok(0));
        assert_eq!(passed_count(Some("41"), Some("1"), 42), Ok(0), "another's");
        assert_eq!(passed_count(Some("42"), Some("1"), 42), Ok(1));
        assert_eq!(passed_count(Some("42"), None, 42), Ok(0));
        assert!(passed_count(Some("42"), Some("x"), 42).is_err());
    }

    #[test]
    fn the_journal_stream_is_named_by_device_and_inode() {
        assert!(names_stream("8:1234", 8, 1234));
        assert!(!names_stream("8:1234", 8, 1235));
        assert!(!names_stream("garbage", 8, 1234));
        assert_eq!(priority(&tracing::Level::WARN), 4);
        assert_eq!(priority(&tracing::Level::TRACE), 7);
    }

    #[test]
    fn readiness_reaches_the_notify_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        // SAFETY: this test alone reads NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        notify("READY=1").unwrap();
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        let mut buf = [0u8; 16];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
