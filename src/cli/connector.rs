//! The one way a confined process (`linnet run`, `linnet-relay`) reaches
//! a path once it reads a guest's bytes: it may not call `socket`,
//! `connect`, `open` or `rename` at all (a relay taken over through its
//! frames could otherwise reach any unix socket its user can, a session
//! bus, an ssh agent, docker's; or write any file its user can, an
//! `authorized_keys`), so before confining itself it starts its
//! **connector**, a child process that knows the few paths it will ever
//! need and nothing else: the daemon's socket (its lifeline), a
//! vhost-user relay's own back-end socket, the attach JSON that
//! `--wait-ip` writes again. Asked for a socket by its index, the
//! connector connects and hands the connected socket back over their
//! socket pair (SCM_RIGHTS); given a file's new content, it writes it
//! beside the file and renames it over. It reads nothing else, and
//! confines itself too.
//!
//! The child is forked, not executed: it runs only system calls, on
//! memory made before the fork (each path's address, its filter), so a
//! fork of a process with threads is safe in it. It dies with the
//! process (`PR_SET_PDEATHSIG`, and the pair's end-of-file).

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::seccomp;
use crate::host::peer;

/// A path the connector serves.
#[derive(Debug, Clone)]
pub enum Target {
    /// A unix socket it connects to, of this kind.
    Socket { path: PathBuf, kind: libc::c_int },
    /// A file it writes whole (a new file beside it, renamed over it).
    File { path: PathBuf },
}

impl Target {
    /// The daemon's API socket.
    pub fn daemon(path: &Path) -> Target {
        Target::Socket {
            path: path.to_owned(),
            kind: libc::SOCK_SEQPACKET,
        }
    }

    /// A stream socket (a vhost-user back-end's).
    pub fn stream(path: &Path) -> Target {
        Target::Socket {
            path: path.to_owned(),
            kind: libc::SOCK_STREAM,
        }
    }

    fn path(&self) -> &Path {
        match self {
            Target::Socket { path, .. } | Target::File { path } => path,
        }
    }

    /// What the child needs of it, made before the fork.
    fn prepare(&self) -> io::Result<Prepared> {
        match self {
            Target::Socket { path, kind } => {
                let (addr, len) = unix_address(path)?;
                Ok(Prepared::Socket(addr, len, *kind))
            }
            Target::File { path } => {
                let tmp = path.with_extension("linnet-tmp");
                let c = |p: &Path| {
                    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)
                };
                Ok(Prepared::File(c(&tmp)?, c(path)?))
            }
        }
    }
}

/// A file's content as the connector takes it: at most this much.
pub const MAX_FILE: usize = 16 << 10;

/// What the child serves each target with.
enum Prepared {
    /// The socket's address, its length and kind.
    Socket(libc::sockaddr_un, libc::socklen_t, libc::c_int),
    /// The file written, then renamed over the target.
    File(CString, CString),
}

/// The confined process's side: one request at a time.
#[derive(Debug)]
pub struct Connector {
    pair: Mutex<OwnedFd>,
    targets: Vec<Target>,
}

impl Connector {
    /// Starts the connector for `targets` (asked for by their index).
    /// Call it before confining the process.
    pub fn start(targets: &[Target]) -> io::Result<Connector> {
        let prepared = targets
            .iter()
            .map(Target::prepare)
            .collect::<io::Result<Vec<_>>>()?;
        let filter = seccomp::connector_filter().map_err(io::Error::other)?;
        let mut pair = [0; 2];
        // SAFETY: `pair` has room for the two new fds.
        if unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the fds are new and ours alone.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the child runs only `serve`, which makes system calls on
        // memory made before the fork and never returns.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => serve(theirs.as_raw_fd(), parent, &prepared, &filter),
            _ => Ok(Connector {
                pair: Mutex::new(ours),
                targets: targets.to_vec(),
            }),
        }
    }

    /// A socket connected to target `index` (a socket's).
    pub fn connect(&self, index: usize) -> io::Result<OwnedFd> {
        if !matches!(self.targets.get(index), Some(Target::Socket { .. })) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("target {index} is no socket"),
            ));
        }
        match self.ask(index, &[])? {
            (_, Some(fd)) => Ok(fd),
            (0, None) => Err(io::Error::other(format!(
                "no socket came for {}",
                self.path(index)
            ))),
            (errno, None) => Err(io::Error::from_raw_os_error(errno)),
        }
    }

    /// Writes `content` as target `index` (a file's), whole.
    pub fn write_file(&self, index: usize, content: &[u8]) -> io::Result<()> {
        if !matches!(self.targets.get(index), Some(Target::File { .. })) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("target {index} is no file"),
            ));
        }
        if content.len() > MAX_FILE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "more than a connector writes",
            ));
        }
        match self.ask(index, content)? {
            (0, _) => Ok(()),
            (errno, _) => Err(io::Error::from_raw_os_error(errno)),
        }
    }

    /// Sends the request for `index` (with `content`); its answer.
    fn ask(&self, index: usize, content: &[u8]) -> io::Result<(i32, Option<OwnedFd>)> {
        let pair = self.pair.lock().expect("connector lock");
        let mut request = Vec::with_capacity(1 + content.len());
        request.push(u8::try_from(index).map_err(|_| io::ErrorKind::InvalidInput)?);
        request.extend_from_slice(content);
        // SAFETY: a live buffer of its length.
        let sent = unsafe {
            libc::send(
                pair.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        match receive(pair.as_raw_fd())? {
            Some(answer) => Ok(answer),
            None => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("the connector for {} is gone", self.path(index)),
            )),
        }
    }

    fn path(&self, index: usize) -> String {
        self.targets.get(index).map_or_else(
            || format!("target {index}"),
            |t| t.path().display().to_string(),
        )
    }
}

/// The connector's answer: an errno (0: none), and the socket if it
/// connected one. None: it is gone.
fn receive(pair: RawFd) -> io::Result<Option<(i32, Option<OwnedFd>)>> {
    let mut errno = [0u8; 4];
    let mut iov = libc::iovec {
        iov_base: errno.as_mut_ptr().cast(),
        iov_len: errno.len(),
    };
    let mut control = [0u64; 4];
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<[u64; 4]>();
    // SAFETY: `msg` points at live buffers of the lengths it says.
    let n = unsafe { libc::recvmsg(pair, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        return Ok(None);
    }
    // SAFETY: walking the control buffer the kernel filled.
    let fd = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (!cmsg.is_null()
            && (*cmsg).cmsg_level == libc::SOL_SOCKET
            && (*cmsg).cmsg_type == libc::SCM_RIGHTS)
            .then(|| {
                OwnedFd::from_raw_fd(std::ptr::read_unaligned(
                    libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                ))
            })
    };
    Ok(Some((i32::from_ne_bytes(errno), fd)))
}

fn unix_address(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is too long for a unix socket's path", path.display()),
        ));
    }
    for (to, from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// The connector itself, in the child: system calls only, on what was
/// made before the fork.
fn serve(
    pair: RawFd,
    parent: libc::pid_t,
    targets: &[Prepared],
    filter: &seccompiler::BpfProgram,
) -> ! {
    const PAIR: RawFd = 3;
    // SAFETY: system calls on our own fds and memory; `_exit` ends it.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(0);
        }
        if pair != PAIR && libc::dup2(pair, PAIR) < 0 {
            libc::_exit(1);
        }
        // Nothing of the process's but the pair: not its TAP, not its
        // VMM's socket, not its stdio.
        libc::syscall(libc::SYS_close_range, PAIR + 1, u32::MAX, 0);
        libc::syscall(libc::SYS_close_range, 0, PAIR - 1, 0);
        // The name the daemon knows a connector by.
        libc::prctl(libc::PR_SET_NAME, peer::CONNECTOR.as_ptr());
        if seccompiler::apply_filter(filter).is_err() {
            libc::_exit(1);
        }
        let mut request = [0u8; 1 + MAX_FILE];
        loop {
            let n = libc::recv(PAIR, request.as_mut_ptr().cast(), request.len(), 0);
            if n < 1 {
                libc::_exit(0);
            }
            let content = &request[1..n as usize];
            let (errno, fd) = match targets.get(request[0] as usize) {
                Some(Prepared::Socket(addr, len, kind)) => connect(addr, *len, *kind),
                Some(Prepared::File(tmp, path)) => (write_file(tmp, path, content), -1),
                None => libc::_exit(1),
            };
            answer(PAIR, errno, fd);
            if fd >= 0 {
                libc::close(fd);
            }
        }
    }
}

/// A unix socket of `kind` connected to `addr`: (0, its fd), or (the
/// errno, -1).
///
/// # Safety
/// Only system calls: safe in a forked child.
unsafe fn connect(
    addr: &libc::sockaddr_un,
    len: libc::socklen_t,
    kind: libc::c_int,
) -> (i32, RawFd) {
    // SAFETY: system calls on live memory.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, kind | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return (*libc::__errno_location(), -1);
        }
        if libc::connect(fd, (addr as *const libc::sockaddr_un).cast(), len) != 0 {
            let errno = *libc::__errno_location();
            libc::close(fd);
            return (errno, -1);
        }
        (0, fd)
    }
}

/// Writes `content` to `tmp` and renames it over `path`: 0, or the errno.
///
/// # Safety
/// Only system calls: safe in a forked child.
unsafe fn write_file(tmp: &CString, path: &CString, content: &[u8]) -> i32 {
    // SAFETY: system calls on live memory.
    unsafe {
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW;
        let fd = libc::open(tmp.as_ptr(), flags, 0o644);
        if fd < 0 {
            return *libc::__errno_location();
        }
        let mut written = 0;
        while written < content.len() {
            let n = libc::write(
                fd,
                content[written..].as_ptr().cast(),
                content.len() - written,
            );
            if n <= 0 {
                let errno = *libc::__errno_location();
                libc::close(fd);
                return errno;
            }
            written += n as usize;
        }
        libc::close(fd);
        if libc::rename(tmp.as_ptr(), path.as_ptr()) != 0 {
            return *libc::__errno_location();
        }
        0
    }
}

/// Sends `errno`, and `fd` if there is one, over `pair`.
///
/// # Safety
/// Only system calls: safe in a forked child.
unsafe fn answer(pair: RawFd, errno: i32, fd: RawFd) {
    // SAFETY: system calls on live memory.
    unsafe {
        let mut errno = errno;
        let mut iov = libc::iovec {
            iov_base: (&raw mut errno).cast(),
            iov_len: size_of::<i32>(),
        };
        let mut control = [0u64; 4];
        let mut msg: libc::msghdr = zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if fd >= 0 {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        }
        libc::sendmsg(pair, &msg, libc::MSG_NOSIGNAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn it_connects_to_its_targets_only_and_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let (a, missing) = (dir.path().join("a.sock"), dir.path().join("missing.sock"));
        let listener = UnixListener::bind(&a).unwrap();
        let json = dir.path().join("vm.json");
        std::fs::write(&json, "old\n").unwrap();
        let targets = [
            Target::stream(&a),
            Target::stream(&missing),
            Target::File { path: json.clone() },
        ];
        let connector = Connector::start(&targets).unwrap();
        let fd = connector.connect(0).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        // The same connection, each end.
        let ours = std::os::unix::net::UnixStream::from(fd);
        std::io::Write::write_all(&mut &ours, b"x").unwrap();
        let mut got = [0u8; 1];
        std::io::Read::read_exact(&mut &accepted, &mut got).unwrap();
        assert_eq!(&got, b"x");
        let refused = connector.connect(1).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::NotFound, "{refused}");
        connector.write_file(2, b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&json).unwrap(), "new\n");
        assert!(
            !json.with_extension("linnet-tmp").exists(),
            "renamed over it"
        );
        assert!(connector.connect(2).is_err(), "a file is no socket");
        // An index it was not given ends it: no target of the process's
        // choosing, and no more answers.
        let gone = connector.ask(7, &[]).unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::BrokenPipe, "{gone}");
        assert!(connector.connect(0).is_err());
    }
}
