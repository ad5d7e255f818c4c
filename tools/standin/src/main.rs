//! linnet-standin: plays the VMM in tests and benchmarks.
//!
//! It takes the datapath a VMM would get from linnet — a TAP fd (as QEMU
//! gets from `linnet run`), a unix datagram socket (one frame per datagram)
//! or a unix stream socket (4-byte big-endian length before each frame), as
//! an inherited fd or a path to connect to — creates a TAP inside a guest
//! network namespace, and moves frames between the two, one thread per
//! direction. Datagrams go in batches (recvmmsg, sendmmsg) and a stream is
//! read in large pieces, so that in a benchmark its own cost stays small
//! next to what it measures; a stream is written and a TAP read and written
//! one frame per call. The
//! guest namespace's kernel then acts as the VM: real DHCP clients, ping,
//! iperf3. On a TAP fd, and on a socket with --vnet-hdr,
//! frames carry a virtio-net header and offloads are on, as with a
//! virtio-net VMM, so large TCP segments cross without splitting; on a plain
//! socket the guest TAP has offloads off and frames are bare. Given a
//! multi-queue TAP's fds (--fds), the guest's TAP gets as many queues and
//! each queue pair its own two threads, as a VMM gives each its vCPU.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::process::exit;
use std::sync::Arc;

mod vhost_user;

use linnet_tun::{
    IFF_MULTI_QUEUE, IFF_NO_PI, IFF_TAP, IFF_VNET_HDR, OFFLOAD_CSUM, OFFLOAD_TSO4, OFFLOAD_TSO6,
};

/// The virtio-net header a TAP carries unless told otherwise.
const TAP_HEADER: usize = 10;
/// A GSO frame of up to 64 KiB plus its virtio-net header.
const BUFFER: usize = 65536 + 64;
/// The most frames moved per system call on a socket.
const BATCH: usize = 32;

const USAGE: &str = "usage: linnet-standin DATAPATH --netns PATH [--ifname eth0] [--mac MAC] [--mtu N] [--vnet-hdr N]
DATAPATH is one of:
  --fd N                the TAP fd from linnet (e.g. {fd} under `linnet run`)
  --fds N:N...          a multi-queue TAP's fds (e.g. {fds} under `linnet run --queues`)
  --tap NAME            a TAP opened by name in the current namespace (a
                        persistent TAP, or one made here: the benchmark's
                        baseline without linnet)
  --dgram-fd N          a unix datagram socket (e.g. {fd} under `linnet run --datapath dgram`)
  --stream-fd N         a unix stream socket with length-prefixed frames
  --dgram-socket PATH   bind PATH.client and exchange datagrams with the socket at PATH
  --stream-socket PATH  connect to the stream socket at PATH
  --vhost-user PATH     be the vhost-user front-end (a guest's virtio-net driver,
                        its memory a memfd) of the back-end listening at PATH
  --hostile KIND        with --vhost-user: break the rules once running (outside,
                        loop, direction: a tx buffer outside memory, looping, or
                        device-writable; ring: rings outside memory)
  --netns PATH  the guest network namespace (e.g. /run/netns/guest1)
  --netns own:PIDFILE  as a user without root: make a user and network
                namespace of our own for the guest, and write our pid to
                PIDFILE once its interface is up (root can then enter it)
  --ifname      the guest's interface name (default eth0)
  --mac         the guest's MAC (default: $LINNET_MAC)
  --mtu         the guest's MTU (default: $LINNET_MTU, else 1500)
  --vnet-hdr N  on a socket: a virtio-net header of N bytes (10 or 12) before each frame
  --user UID:GID  make the guest side, then become UID:GID (no groups) before opening
                the datapath: a VMM that runs unprivileged and opens its TAP by name";

enum Datapath {
    /// A TAP's fds, one per queue.
    Tap(Vec<RawFd>),
    TapName(String),
    DgramFd(RawFd),
    StreamFd(RawFd),
    DgramSocket(String),
    StreamSocket(String),
    VhostUser(String),
}

struct Options {
    datapath: Datapath,
    netns: String,
    ifname: String,
    mac: Option<[u8; 6]>,
    mtu: u32,
    vnet_hdr: Option<usize>,
    /// Who opens the datapath, after the guest side is made.
    user: Option<(u32, u32)>,
    hostile: Option<vhost_user::Hostile>,
}

fn main() {
    let opts = parse_args().unwrap_or_else(|e| {
        eprintln!("linnet-standin: {e}\n{USAGE}");
        exit(2)
    });
    // A stream peer that closes must show up as an error, not kill us.
    // SAFETY: setting a signal disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    if let Err(e) = run(opts) {
        eprintln!("linnet-standin: {e}");
        exit(1);
    }
}

fn parse_args() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mut datapath = None;
    let mut vnet_hdr = None;
    let mut netns = None;
    let mut user = None;
    let mut hostile = None;
    let mut ifname = "eth0".to_string();
    let mut mac = std::env::var("LINNET_MAC").ok();
    let mut mtu = std::env::var("LINNET_MTU")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(1500);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{arg}: {e}"));
        match arg.as_str() {
            "--fd" => datapath = Some(Datapath::Tap(vec![number(value()?)? as RawFd])),
            "--fds" => {
                let fds = value()?
                    .split(':')
                    .map(|fd| number(fd.into()).map(|fd| fd as RawFd))
                    .collect::<Result<Vec<_>, _>>()?;
                datapath = Some(Datapath::Tap(fds));
            }
            "--tap" => datapath = Some(Datapath::TapName(value()?)),
            "--dgram-fd" => datapath = Some(Datapath::DgramFd(number(value()?)? as RawFd)),
            "--stream-fd" => datapath = Some(Datapath::StreamFd(number(value()?)? as RawFd)),
            "--dgram-socket" => datapath = Some(Datapath::DgramSocket(value()?)),
            "--stream-socket" => datapath = Some(Datapath::StreamSocket(value()?)),
            "--vhost-user" => datapath = Some(Datapath::VhostUser(value()?)),
            "--hostile" => hostile = Some(vhost_user::Hostile::parse(&value()?)?),
            "--vnet-hdr" => vnet_hdr = Some(number(value()?)?),
            "--netns" => netns = Some(value()?),
            "--ifname" => ifname = value()?,
            "--mac" => mac = Some(value()?),
            "--mtu" => mtu = number(value()?)? as u32,
            "--user" => {
                let v = value()?;
                let (u, g) = v
                    .split_once(':')
                    .ok_or(format!("--user {v}: give UID:GID"))?;
                user = Some((number(u.into())? as u32, number(g.into())? as u32));
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                exit(0)
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let mac = match mac {
        None => None,
        Some(m) => Some(parse_mac(&m).ok_or(format!("bad MAC {m}"))?),
    };
    Ok(Options {
        datapath: datapath.ok_or("a datapath (--fd, --dgram-fd, ...) is required")?,
        netns: netns.ok_or("--netns is required")?,
        ifname,
        mac,
        mtu,
        vnet_hdr,
        user,
        hostile,
    })
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    parts.try_into().ok()
}

/// The VMM's side of the datapath, and how frames look on it.
struct Link {
    fd: OwnedFd,
    kind: LinkKind,
    /// Bytes of virtio-net header in front of each frame (0: bare frames).
    header: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum LinkKind {
    Tap,
    Dgram,
    Stream,
}

/// The VMM's side: a link per queue (one but on a multi-queue TAP).
fn open_links(datapath: &Datapath, vnet_hdr: Option<usize>) -> io::Result<Vec<Link>> {
    // SAFETY: the caller handed us these descriptors to own.
    let owned = |fd: RawFd| unsafe { OwnedFd::from_raw_fd(fd) };
    let tap = |fd: OwnedFd| -> io::Result<Link> {
        set_offload(&fd, true)?;
        Ok(Link {
            fd,
            kind: LinkKind::Tap,
            header: TAP_HEADER,
        })
    };
    match datapath {
        Datapath::Tap(fds) => fds.iter().map(|&fd| tap(owned(fd))).collect(),
        Datapath::TapName(name) => Ok(vec![tap(create_tap(name, 1)?.swap_remove(0))?]),
        _ => Ok(vec![open_link(datapath, vnet_hdr)?]),
    }
}

/// The VMM's side of a socket datapath.
fn open_link(datapath: &Datapath, vnet_hdr: Option<usize>) -> io::Result<Link> {
    // SAFETY: the caller handed us these descriptors to own.
    let owned = |fd: RawFd| unsafe { OwnedFd::from_raw_fd(fd) };
    let link = |fd, kind, header| Link { fd, kind, header };
    let header = vnet_hdr.unwrap_or(0);
    Ok(match datapath {
        Datapath::Tap(_) | Datapath::TapName(_) => unreachable!("open_links opens TAPs"),
        Datapath::DgramFd(fd) => link(owned(*fd), LinkKind::Dgram, header),
        Datapath::StreamFd(fd) => link(owned(*fd), LinkKind::Stream, header),
        Datapath::DgramSocket(path) => {
            let local = format!("{path}.client");
            let _ = std::fs::remove_file(&local);
            let sock = std::os::unix::net::UnixDatagram::bind(&local)
                .map_err(|e| with_context(e, &local))?;
            // The helper may run as another user; it must be able to answer.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&local, std::fs::Permissions::from_mode(0o666))?;
            sock.connect(path).map_err(|e| with_context(e, path))?;
            link(sock.into(), LinkKind::Dgram, header)
        }
        Datapath::StreamSocket(path) => {
            let sock =
                std::os::unix::net::UnixStream::connect(path).map_err(|e| with_context(e, path))?;
            link(sock.into(), LinkKind::Stream, header)
        }
        Datapath::VhostUser(_) => unreachable!("run_vhost_user has its own way"),
    })
}

fn run(opts: Options) -> io::Result<()> {
    if let Datapath::VhostUser(path) = &opts.datapath {
        return run_vhost_user(path, &opts);
    }
    if let Some(pid_file) = opts.netns.strip_prefix("own:") {
        let links = open_links(&opts.datapath, opts.vnet_hdr)?;
        own_namespaces()?;
        let (guest, guest_header) = make_guest(&opts, links[0].header, links.len())?;
        std::fs::write(pid_file, format!("{}\n", std::process::id()))
            .map_err(|e| with_context(e, pid_file))?;
        return relay(links, guest, guest_header, &opts);
    }
    let ns = File::open(&opts.netns).map_err(|e| with_context(e, &opts.netns))?;
    let (guest, links, guest_header) = match opts.user {
        None => {
            let links = open_links(&opts.datapath, opts.vnet_hdr)?;
            enter(&ns, "the guest's namespace")?;
            let (guest, guest_header) = make_guest(&opts, links[0].header, links.len())?;
            (guest, links, guest_header)
        }
        // The guest side needs privilege; the datapath, opened by name in
        // our own namespace, must not have it (as a VMM run as a user).
        Some((uid, gid)) => {
            let home = File::open("/proc/self/ns/net")?;
            enter(&ns, "the guest's namespace")?;
            let header = match opts.datapath {
                Datapath::Tap(_) | Datapath::TapName(_) => TAP_HEADER,
                _ => opts.vnet_hdr.unwrap_or(0),
            };
            let (guest, guest_header) = make_guest(&opts, header, 1)?;
            enter(&home, "our own namespace")?;
            become_user(uid, gid)?;
            (
                guest,
                open_links(&opts.datapath, opts.vnet_hdr)?,
                guest_header,
            )
        }
    };
    relay(links, guest, guest_header, &opts)
}

/// Two threads per queue pair: the link's queue to the guest's, and back.
fn relay(
    links: Vec<Link>,
    guests: Vec<OwnedFd>,
    guest_header: usize,
    opts: &Options,
) -> io::Result<()> {
    let fds: Vec<String> = links.iter().map(|l| l.fd.as_raw_fd().to_string()).collect();
    eprintln!(
        "linnet-standin: relaying fd {} <-> {} in {}",
        fds.join(":"),
        opts.ifname,
        opts.netns
    );
    let mut last = None;
    for (link, guest) in links.into_iter().zip(guests) {
        let (link, guest) = (Arc::new(link), Arc::new(guest));
        let (l, g) = (link.clone(), guest.clone());
        std::thread::spawn(move || to_guest(&l, &g, guest_header));
        if let Some((l, g)) = last.replace((link, guest)) {
            std::thread::spawn(move || from_guest(&g, &l, guest_header));
        }
    }
    let (link, guest) = last.expect("a link at least");
    from_guest(&guest, &link, guest_header);
    Ok(())
}

/// As a guest's virtio-net driver on the vhost-user back-end at `path`:
/// the guest's TAP made in its namespace, then (as `--user`, if given) the
/// device set up and bridged to it.
fn run_vhost_user(path: &str, opts: &Options) -> io::Result<()> {
    if let Some(pid_file) = opts.netns.strip_prefix("own:") {
        // Connected first: making namespaces of our own needs a process
        // with one thread, and the device starts none until it bridges.
        let device = vhost_user::Device::connect(path, opts.hostile)?;
        own_namespaces()?;
        let guest = make_guest(opts, vhost_user::HEADER, 1)?.0.swap_remove(0);
        set_nonblocking(&guest);
        std::fs::write(pid_file, format!("{}\n", std::process::id()))
            .map_err(|e| with_context(e, pid_file))?;
        return device.bridge(guest);
    }
    let ns = File::open(&opts.netns).map_err(|e| with_context(e, &opts.netns))?;
    let home = File::open("/proc/self/ns/net")?;
    enter(&ns, "the guest's namespace")?;
    let guest = make_guest(opts, vhost_user::HEADER, 1)?.0.swap_remove(0);
    set_nonblocking(&guest);
    enter(&home, "our own namespace")?;
    if let Some((uid, gid)) = opts.user {
        become_user(uid, gid)?;
    }
    let device = vhost_user::Device::connect(path, opts.hostile)?;
    eprintln!(
        "linnet-standin: vhost-user front-end of {path} <-> {} in {}",
        opts.ifname, opts.netns
    );
    device.bridge(guest)
}

/// A user namespace (where we are root) and a network namespace of our
/// own: the guest of a user without root.
fn own_namespaces() -> io::Result<()> {
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: plain syscall; we are single-threaded here.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) } < 0 {
        return Err(with_context(io::Error::last_os_error(), "unshare"));
    }
    for (file, text) in [
        ("setgroups", "deny".to_string()),
        ("uid_map", format!("0 {uid} 1")),
        ("gid_map", format!("0 {gid} 1")),
    ] {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| with_context(e, &format!("/proc/self/{file}")))?;
    }
    Ok(())
}

fn enter(ns: &File, what: &str) -> io::Result<()> {
    // SAFETY: plain syscall on a namespace fd; we are single-threaded here.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(with_context(
            io::Error::last_os_error(),
            &format!("setns to {what}"),
        ));
    }
    Ok(())
}

/// The guest's TAP in the current namespace, speaking a link with
/// `link_header` bytes of header, with `queues` queues (an fd each); and
/// the header its frames carry.
fn make_guest(
    opts: &Options,
    link_header: usize,
    queues: usize,
) -> io::Result<(Vec<OwnedFd>, usize)> {
    let guests = create_tap(&opts.ifname, queues)?;
    // The guest TAP speaks the link's header; a bare link gets a zeroed
    // legacy header with offloads off, so the guest's frames are complete.
    let guest_header = if link_header == 0 {
        TAP_HEADER
    } else {
        link_header
    };
    for guest in &guests {
        set_header_len(guest, guest_header)?;
        set_offload(guest, link_header != 0)?;
    }
    configure_link(&opts.ifname, opts.mac, opts.mtu)?;
    Ok((guests, guest_header))
}

fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain syscalls with integer arguments; single-threaded here.
    let failed = unsafe {
        libc::setgroups(0, std::ptr::null()) < 0
            || libc::setresgid(gid, gid, gid) < 0
            || libc::setresuid(uid, uid, uid) < 0
    };
    if failed {
        return Err(with_context(
            io::Error::last_os_error(),
            &format!("become {uid}:{gid}"),
        ));
    }
    Ok(())
}

/// Frames the guest sends go to the VMM's side; exits when either end is
/// finished. On a socket, whatever the guest's TAP holds goes in one
/// sendmmsg or writev; a TAP link takes one frame per write.
fn from_guest(guest: &OwnedFd, link: &Link, guest_header: usize) {
    // The guest's header is read to `buf[4..]`; a bare link skips it, a
    // stream puts the length in the 4 bytes before the frame.
    let skip = 4 + guest_header - link.header;
    let batch = if link.kind == LinkKind::Tap { 1 } else { BATCH };
    let mut bufs = vec![vec![0u8; BUFFER + 4]; batch];
    let mut ends = vec![0usize; batch];
    if batch > 1 {
        set_nonblocking(guest);
    }
    loop {
        let mut n = 0;
        while n < batch {
            match read_now(guest, &mut bufs[n][4..]) {
                Ok(Some(len)) => {
                    ends[n] = 4 + len;
                    n += 1;
                }
                Ok(None) if n == 0 => wait_for(guest, libc::POLLIN),
                Ok(None) => break,
                Err(()) => exit(0),
            }
        }
        let frames = bufs.iter_mut().zip(&ends).take(n).map(|(buf, &end)| {
            if link.kind == LinkKind::Stream {
                let len = ((end - skip) as u32).to_be_bytes();
                buf[skip - 4..skip].copy_from_slice(&len);
                io::IoSlice::new(&buf[skip - 4..end])
            } else {
                io::IoSlice::new(&buf[skip..end])
            }
        });
        let frames: Vec<io::IoSlice> = frames.collect();
        let sent = match link.kind {
            // One write per frame, as QEMU's netdev stream does: passt
            // (2023) loses frames when a read brings it several 64 KiB ones.
            LinkKind::Stream => frames
                .iter()
                .try_for_each(|f| writev_all(&link.fd, &mut [*f])),
            LinkKind::Dgram => send_datagrams(&link.fd, &frames),
            LinkKind::Tap => write_all(&link.fd, &frames[0], false),
        };
        if let Err(e) = sent {
            // A broken stream or a vanished datagram peer ends us; a full
            // socket drops the frames, as a NIC would.
            if link.kind == LinkKind::Stream || e.raw_os_error() == Some(libc::ECONNREFUSED) {
                exit(0);
            }
        }
    }
}

/// Frames from the VMM's side go to the guest: a batch of datagrams per
/// recvmmsg, or as much of the stream as one read gets.
fn to_guest(link: &Link, guest: &OwnedFd, guest_header: usize) {
    // A bare link's frames go behind a zeroed header.
    let zero = [0u8; 16];
    let zero = &zero[..guest_header - link.header];
    let deliver = |frame: &[u8]| {
        // A write that fails drops the frame, as a NIC would.
        let _ = writev_all(
            guest,
            &mut [io::IoSlice::new(zero), io::IoSlice::new(frame)],
        );
    };
    match link.kind {
        LinkKind::Stream => {
            let mut buf = vec![0u8; 4 * BUFFER];
            let (mut start, mut end) = (0, 0);
            loop {
                while end - start >= 4 {
                    let len =
                        u32::from_be_bytes(buf[start..start + 4].try_into().unwrap()) as usize;
                    if len == 0 || zero.len() + len > BUFFER {
                        eprintln!("linnet-standin: a frame length of {len} on the stream");
                        exit(1);
                    }
                    if end - start < 4 + len {
                        break;
                    }
                    deliver(&buf[start + 4..start + 4 + len]);
                    start += 4 + len;
                }
                buf.copy_within(start..end, 0);
                (start, end) = (0, end - start);
                let Some(n) = read(&link.fd, &mut buf[end..]) else {
                    exit(0)
                };
                end += n;
            }
        }
        LinkKind::Dgram => {
            let mut bufs = vec![vec![0u8; BUFFER]; BATCH];
            loop {
                let Some(lens) = receive_datagrams(&link.fd, &mut bufs) else {
                    exit(0)
                };
                for (buf, len) in bufs.iter().zip(lens) {
                    deliver(&buf[..len]);
                }
            }
        }
        LinkKind::Tap => {
            let mut buf = vec![0u8; BUFFER];
            loop {
                let Some(n) = read(&link.fd, &mut buf) else {
                    exit(0)
                };
                deliver(&buf[..n]);
            }
        }
    }
}

fn set_nonblocking(fd: &OwnedFd) {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

fn wait_for(fd: &OwnedFd, events: libc::c_short) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, -1) };
}

/// A read that does not wait: `Ok(None)` when nothing is there, `Err` when
/// the fd is finished.
fn read_now(fd: &OwnedFd, buf: &mut [u8]) -> Result<Option<usize>, ()> {
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return Ok(Some(n as usize));
        }
        match io::Error::last_os_error().kind() {
            _ if n == 0 => return Err(()),
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(()),
        }
    }
}

/// An mmsghdr per iovec, for sendmmsg/recvmmsg: one datagram each.
fn one_message_each(iovs: &mut [libc::iovec]) -> Vec<libc::mmsghdr> {
    iovs.iter_mut()
        .map(|iov| {
            // SAFETY: mmsghdr is plain old data; zeroes are valid.
            let mut msg: libc::mmsghdr = unsafe { std::mem::zeroed() };
            msg.msg_hdr.msg_iov = iov;
            msg.msg_hdr.msg_iovlen = 1;
            msg
        })
        .collect()
}

/// Sends each slice as one datagram, as few calls as it takes.
fn send_datagrams(fd: &OwnedFd, frames: &[io::IoSlice]) -> io::Result<()> {
    let mut iovs: Vec<libc::iovec> = frames
        .iter()
        .map(|f| libc::iovec {
            iov_base: f.as_ptr() as *mut libc::c_void,
            iov_len: f.len(),
        })
        .collect();
    let mut msgs = one_message_each(&mut iovs);
    let mut done = 0;
    while done < msgs.len() {
        let rest = &mut msgs[done..];
        // SAFETY: every mmsghdr points at a live iovec and buffer.
        let n = unsafe { libc::sendmmsg(fd.as_raw_fd(), rest.as_mut_ptr(), rest.len() as u32, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

/// Receives up to one datagram per buffer, waiting for the first; `None`
/// when the socket is finished.
fn receive_datagrams(fd: &OwnedFd, bufs: &mut [Vec<u8>]) -> Option<Vec<usize>> {
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let mut msgs = one_message_each(&mut iovs);
    loop {
        // SAFETY: every mmsghdr points at a live iovec and buffer.
        let n = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                msgs.len() as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n > 0 {
            return Some(
                msgs[..n as usize]
                    .iter()
                    .map(|m| m.msg_len as usize)
                    .collect(),
            );
        }
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

/// Writes all of `slices` (one frame, or a stream's many).
fn writev_all(fd: &OwnedFd, mut slices: &mut [io::IoSlice]) -> io::Result<()> {
    while !slices.is_empty() {
        // SAFETY: IoSlice is ABI-compatible with iovec; the slices are live.
        let n = unsafe {
            libc::writev(
                fd.as_raw_fd(),
                slices.as_ptr().cast(),
                slices.len().min(1024) as libc::c_int,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                // The guest's TAP is non-blocking for the reading thread;
                // a write waits as it would on a blocking fd.
                io::ErrorKind::WouldBlock => {
                    wait_for(fd, libc::POLLOUT);
                    continue;
                }
                _ => return Err(e),
            }
        }
        io::IoSlice::advance_slices(&mut slices, n as usize);
    }
    Ok(())
}

/// One read; `None` when the fd is finished (EOF, an error, a deleted TAP).
fn read(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return Some(n as usize);
        }
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

/// Writes one frame, or for a stream all of `buf`.
fn write_all(fd: &OwnedFd, mut buf: &[u8], stream: bool) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if !stream {
            break;
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

fn with_context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

fn ifreq(name: &str) -> io::Result<IfReq> {
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: [0; 24],
    };
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name} too long"),
        ));
    }
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    Ok(req)
}

/// TAP `name` (made, or opened by name), with an fd per queue.
fn create_tap(name: &str, queues: usize) -> io::Result<Vec<OwnedFd>> {
    let multi = if queues > 1 { IFF_MULTI_QUEUE } else { 0 };
    (0..queues)
        .map(|_| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open("/dev/net/tun")
                .map_err(|e| with_context(e, "/dev/net/tun"))?;
            linnet_tun::IfReq::new(name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | multi)
                .and_then(|mut req| linnet_tun::set_iff(file.as_fd(), &mut req))
                .map_err(|e| with_context(e, &format!("create TAP {name}")))?;
            Ok(file.into())
        })
        .collect()
}

fn set_offload(fd: &OwnedFd, on: bool) -> io::Result<()> {
    let flags = if on {
        OFFLOAD_CSUM | OFFLOAD_TSO4 | OFFLOAD_TSO6
    } else {
        0
    };
    linnet_tun::set_offload(fd.as_fd(), flags).map_err(|e| with_context(e, "TUNSETOFFLOAD"))
}

fn set_header_len(fd: &OwnedFd, len: usize) -> io::Result<()> {
    linnet_tun::set_vnet_header_len(fd.as_fd(), len as libc::c_int)
        .map_err(|e| with_context(e, "TUNSETVNETHDRSZ"))
}

/// Sets MAC and MTU and brings the guest interface up.
fn configure_link(name: &str, mac: Option<[u8; 6]>, mtu: u32) -> io::Result<()> {
    // SAFETY: a plain datagram socket used only for interface ioctls.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: we own the new socket.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    let ioctl = |request: libc::c_ulong, req: &mut IfReq, what: &str| {
        // SAFETY: req is a valid struct ifreq for these requests.
        if unsafe { libc::ioctl(sock.as_raw_fd(), request as _, req as *mut IfReq) } < 0 {
            return Err(with_context(io::Error::last_os_error(), what));
        }
        Ok(())
    };
    if let Some(mac) = mac {
        let mut req = ifreq(name)?;
        req.data[..2].copy_from_slice(&libc::ARPHRD_ETHER.to_ne_bytes());
        req.data[2..8].copy_from_slice(&mac);
        ioctl(libc::SIOCSIFHWADDR, &mut req, "set MAC")?;
    }
    let mut req = ifreq(name)?;
    req.data[..4].copy_from_slice(&(mtu as i32).to_ne_bytes());
    ioctl(libc::SIOCSIFMTU, &mut req, "set MTU")?;
    let mut req = ifreq(name)?;
    ioctl(libc::SIOCGIFFLAGS, &mut req, "get flags")?;
    let flags = i16::from_ne_bytes([req.data[0], req.data[1]]) | libc::IFF_UP as i16;
    req.data[..2].copy_from_slice(&flags.to_ne_bytes());
    ioctl(libc::SIOCSIFFLAGS, &mut req, "bring up")
}
