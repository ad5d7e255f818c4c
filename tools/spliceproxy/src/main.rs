//! The name check's alternative design, measured beside it by the
//! benchmark (bench/linnet_bench/gate.py; docs/architecture.md, "The name
//! check"): a transparent proxy a guest's connections are redirected to
//! (nftables `redirect`), which reads each connection's first bytes with
//! linnet's own reader (`linnet::gate::shown`), judges the name it shows
//! and the connection's original destination as the gate does, then
//! connects on, writes what it read and splices both ways: splice(2)
//! through a pipe, so the bytes stay in the kernel as far as a proxy can
//! keep them. One epoll loop per core, each with its own listening socket
//! (SO_REUSEPORT); pipes are kept for the next connection.
//!
//! Benchmark tooling, not a product: no timeout for a client that never
//! shows a name, no cap on connections, names pinned to one address each
//! on the command line.
//!
//!     linnet-spliceproxy PORT NAME=ADDRESS...

use std::collections::HashMap;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;

use linnet::name_reader::{MAX_BYTES, Shown, compared, shown};

/// The most spliced into a pipe at once: its default size.
const CHUNK: usize = 64 << 10;
const KEPT_PIPES: usize = 1024;
const LISTENER: u64 = u64::MAX;

/// Each allowed name (as compared) and the one address it may be reached at.
type Allowed = HashMap<String, Ipv4Addr>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse(&args) {
        Ok((port, allowed)) => {
            let allowed = Arc::new(allowed);
            let workers = thread::available_parallelism().map_or(1, |n| n.get());
            let mut threads = Vec::new();
            for _ in 0..workers {
                let allowed = allowed.clone();
                let listener = match listen(port) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("linnet-spliceproxy: listening on port {port}: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                threads.push(thread::spawn(move || {
                    Worker::new(listener, allowed)?.serve()
                }));
            }
            for t in threads {
                if let Ok(Err(e)) = t.join() {
                    eprintln!("linnet-spliceproxy: {e}");
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("linnet-spliceproxy: {e}\nusage: linnet-spliceproxy PORT NAME=ADDRESS...");
            ExitCode::from(2)
        }
    }
}

fn parse(args: &[String]) -> Result<(u16, Allowed), String> {
    let (port, pins) = args.split_first().ok_or("no port")?;
    let port = port
        .parse()
        .map_err(|_| format!("{port:?} is not a port"))?;
    if pins.is_empty() {
        return Err("no NAME=ADDRESS".into());
    }
    let mut allowed = Allowed::new();
    for pin in pins {
        let (name, addr) = pin
            .split_once('=')
            .ok_or(format!("{pin:?} is not NAME=ADDRESS"))?;
        let name = compared(name).ok_or(format!("{name:?} is not a DNS name"))?;
        let addr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
        allowed.insert(name, addr);
    }
    Ok((port, allowed))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

fn socket() -> io::Result<OwnedFd> {
    let flags = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: a new fd, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(cvt(libc::socket(libc::AF_INET, flags, 0))?) })
}

fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut sin: libc::sockaddr_in = unsafe { zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = addr.port().to_be();
    sin.sin_addr.s_addr = u32::from(*addr.ip()).to_be();
    sin
}

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    let len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` outlives the call and is `len` bytes.
    cvt(unsafe { libc::setsockopt(fd, level, name, (&raw const value).cast(), len) }).map(drop)
}

fn listen(port: u16) -> io::Result<OwnedFd> {
    let fd = socket()?;
    set_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    set_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    let sin = sockaddr(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
    let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `sin` is a sockaddr_in of `len` bytes.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&raw const sin).cast(), len) })?;
    // SAFETY: a plain call on an fd of ours.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 4096) })?;
    Ok(fd)
}

/// Where the client meant to connect before the redirect.
fn original_destination(fd: RawFd) -> io::Result<SocketAddrV4> {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut sin: libc::sockaddr_in = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `sin` is `len` bytes and outlives the call.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&raw mut sin).cast(),
            &mut len,
        )
    })?;
    let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
    Ok(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)))
}

/// Closes `fd` with a reset rather than a FIN.
fn reset(fd: OwnedFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let len = size_of::<libc::linger>() as libc::socklen_t;
    // SAFETY: `linger` outlives the call and is `len` bytes.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            len,
        )
    };
}

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

fn pipe() -> io::Result<Pipe> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds, owned from here on.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
    // SAFETY: as above.
    Ok(unsafe {
        Pipe {
            read: OwnedFd::from_raw_fd(fds[0]),
            write: OwnedFd::from_raw_fd(fds[1]),
        }
    })
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    // SAFETY: no offsets; the kernel checks the fds.
    cvt_size(unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            flags,
        )
    })
}

/// One way of a spliced connection.
#[derive(Default)]
struct Way {
    pipe: Option<Pipe>,
    /// Bytes in the pipe not yet spliced out.
    queued: usize,
    /// The source has sent its FIN.
    ended: bool,
    /// The FIN was passed on.
    shut: bool,
}

impl Way {
    /// Moves what `from` has to `to` until one of them would block.
    fn pump(&mut self, from: RawFd, to: RawFd, pipes: &mut Vec<Pipe>) -> io::Result<()> {
        loop {
            if self.queued > 0 {
                let pipe = self.pipe.as_ref().expect("bytes queued in a pipe");
                match splice(pipe.read.as_raw_fd(), to, self.queued) {
                    Ok(n) => self.queued -= n,
                    Err(e) if would_block(&e) => return Ok(()),
                    Err(e) => return Err(e),
                }
                continue;
            }
            if self.ended {
                if !self.shut {
                    // SAFETY: a plain call on an fd of ours.
                    cvt(unsafe { libc::shutdown(to, libc::SHUT_WR) })?;
                    self.shut = true;
                }
                return Ok(());
            }
            if self.pipe.is_none() {
                self.pipe = Some(match pipes.pop() {
                    Some(p) => p,
                    None => pipe()?,
                });
            }
            let pipe = self.pipe.as_ref().expect("a pipe");
            match splice(from, pipe.write.as_raw_fd(), CHUNK) {
                Ok(0) => self.ended = true,
                Ok(n) => self.queued += n,
                Err(e) if would_block(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

enum Stage {
    /// Reading the client's first bytes for its name.
    Reading,
    /// Connecting on and writing what was read (`head[written..]`).
    Writing { upstream: OwnedFd, written: usize },
    /// Both ways spliced: client to upstream, upstream to client.
    Splicing { upstream: OwnedFd, ways: [Way; 2] },
}

struct Conn {
    client: OwnedFd,
    head: Vec<u8>,
    stage: Stage,
}

enum Next {
    Wait,
    Done,
    Refuse,
}

struct Worker {
    epoll: OwnedFd,
    listener: OwnedFd,
    allowed: Arc<Allowed>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    pipes: Vec<Pipe>,
    scratch: Vec<u8>,
}

impl Worker {
    fn new(listener: OwnedFd, allowed: Arc<Allowed>) -> io::Result<Self> {
        // SAFETY: a new fd, owned from here on.
        let epoll = unsafe { OwnedFd::from_raw_fd(cvt(libc::epoll_create1(libc::EPOLL_CLOEXEC))?) };
        let worker = Worker {
            epoll,
            listener,
            allowed,
            conns: Vec::new(),
            free: Vec::new(),
            pipes: Vec::new(),
            scratch: Vec::new(),
        };
        worker.watch(worker.listener.as_raw_fd(), LISTENER, libc::EPOLLIN as u32)?;
        Ok(worker)
    }

    fn watch(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut event = libc::epoll_event { events, u64: token };
        // SAFETY: `event` outlives the call.
        cvt(unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) })
            .map(drop)
    }

    fn serve(mut self) -> io::Result<()> {
        // SAFETY: all-zero is a valid epoll_event.
        let mut events: Vec<libc::epoll_event> = vec![unsafe { zeroed() }; 256];
        loop {
            // SAFETY: `events` has room for its length.
            let n = match cvt(unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    -1,
                )
            }) {
                Ok(n) => n as usize,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for event in &events[..n] {
                match event.u64 {
                    LISTENER => self.accept_all()?,
                    slot => self.advance(slot as usize),
                }
            }
        }
    }

    fn accept_all(&mut self) -> io::Result<()> {
        loop {
            let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
            // SAFETY: no address asked for; a new fd, owned from here on.
            let fd = match cvt(unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    flags,
                )
            }) {
                Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
                Err(e) if would_block(&e) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) => return Err(e),
            };
            set_int(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
            let slot = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            let edge = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
            self.watch(fd.as_raw_fd(), slot as u64, edge)?;
            self.conns[slot] = Some(Conn {
                client: fd,
                head: Vec::new(),
                stage: Stage::Reading,
            });
            self.advance(slot);
        }
    }

    /// Does all a connection can do now (its fds are edge-triggered, so
    /// every step goes on until it would block), then closes it when it
    /// is over.
    fn advance(&mut self, slot: usize) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let next = self.step(&mut conn, slot).unwrap_or(Next::Refuse);
        match next {
            Next::Wait => self.conns[slot] = Some(conn),
            Next::Done | Next::Refuse => {
                let refuse = matches!(next, Next::Refuse);
                let Conn { client, stage, .. } = conn;
                match stage {
                    Stage::Reading => {}
                    Stage::Writing { upstream, .. } => close(upstream, refuse),
                    Stage::Splicing { upstream, ways } => {
                        for way in ways {
                            if let (Some(pipe), 0) = (way.pipe, way.queued)
                                && self.pipes.len() < KEPT_PIPES
                            {
                                self.pipes.push(pipe);
                            }
                        }
                        close(upstream, refuse);
                    }
                }
                close(client, refuse);
                self.free.push(slot);
            }
        }
    }

    fn step(&mut self, conn: &mut Conn, slot: usize) -> io::Result<Next> {
        let client = conn.client.as_raw_fd();
        if let Stage::Reading = conn.stage {
            let mut buf = [0u8; 4096];
            loop {
                let room = buf.len().min(MAX_BYTES + 1 - conn.head.len());
                // SAFETY: `buf` has room for `room` bytes.
                match cvt_size(unsafe { libc::read(client, buf.as_mut_ptr().cast(), room) }) {
                    Ok(0) => return Ok(Next::Done),
                    Ok(n) => conn.head.extend_from_slice(&buf[..n]),
                    Err(e) if would_block(&e) => return Ok(Next::Wait),
                    Err(e) => return Err(e),
                }
                match shown(&conn.head, &mut self.scratch) {
                    Shown::More => continue,
                    Shown::Name(name) => {
                        let to = original_destination(client)?;
                        if compared(name).and_then(|n| self.allowed.get(&n)) != Some(to.ip()) {
                            return Ok(Next::Refuse);
                        }
                        let upstream = socket()?;
                        set_int(
                            upstream.as_raw_fd(),
                            libc::IPPROTO_TCP,
                            libc::TCP_NODELAY,
                            1,
                        )?;
                        let sin = sockaddr(to);
                        let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
                        // SAFETY: `sin` is a sockaddr_in of `len` bytes.
                        match cvt(unsafe {
                            libc::connect(upstream.as_raw_fd(), (&raw const sin).cast(), len)
                        }) {
                            Ok(_) => {}
                            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                            Err(e) => return Err(e),
                        }
                        let edge =
                            (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET)
                                as u32;
                        self.watch(upstream.as_raw_fd(), slot as u64, edge)?;
                        conn.stage = Stage::Writing {
                            upstream,
                            written: 0,
                        };
                        break;
                    }
                    Shown::Nameless | Shown::Neither | Shown::Malformed(_) => {
                        return Ok(Next::Refuse);
                    }
                }
            }
        }
        if let Stage::Writing { upstream, written } = &mut conn.stage {
            while *written < conn.head.len() {
                let rest = &conn.head[*written..];
                // SAFETY: `rest` is valid for its length. A connect still
                // under way answers EAGAIN.
                let sent = unsafe {
                    libc::send(
                        upstream.as_raw_fd(),
                        rest.as_ptr().cast(),
                        rest.len(),
                        libc::MSG_NOSIGNAL,
                    )
                };
                match cvt_size(sent) {
                    Ok(n) => *written += n,
                    Err(e) if would_block(&e) => return Ok(Next::Wait),
                    Err(e) => return Err(e),
                }
            }
            let Stage::Writing { upstream, .. } =
                std::mem::replace(&mut conn.stage, Stage::Reading)
            else {
                unreachable!()
            };
            conn.head = Vec::new();
            conn.stage = Stage::Splicing {
                upstream,
                ways: Default::default(),
            };
        }
        if let Stage::Splicing { upstream, ways } = &mut conn.stage {
            let upstream = upstream.as_raw_fd();
            let [out, back] = ways;
            out.pump(client, upstream, &mut self.pipes)?;
            back.pump(upstream, client, &mut self.pipes)?;
            let over = |w: &Way| w.shut && w.queued == 0;
            return Ok(if over(out) && over(back) {
                Next::Done
            } else {
                Next::Wait
            });
        }
        Ok(Next::Wait)
    }
}

fn close(fd: OwnedFd, refuse: bool) {
    if refuse {
        reset(fd);
    }
}
