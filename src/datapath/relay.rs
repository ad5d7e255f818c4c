//! The relay between a TAP and the VMM's unix socket (datapaths `dgram` and
//! `stream`): one thread, one epoll, both directions.
//!
//! - To the VM: up to a batch of frames is read from the TAP, then sent in
//!   one sendmmsg (dgram) or one sendmsg of many iovecs (stream). For a VMM
//!   that takes bare frames, the TAP's 64 KiB TCP frames are first cut to
//!   size (segment.rs).
//! - From the VM: one recvmmsg takes a batch of datagrams, or one read takes
//!   a large piece of the stream; each whole frame is written to the TAP.
//!   From a VMM that sends bare frames, runs of TCP segments in a batch are
//!   first coalesced into GSO frames (coalesce.rs).
//!
//! Every buffer is allocated in `Relay::new`; the loop allocates nothing and
//! logs only the first frame of each kind it drops (the counters keep the
//! rest). When the VMM's socket is full the relay stops reading the TAP until
//! the socket drains (EPOLLOUT, or a 1 ms timer where the kernel gives no
//! wake-up), so the excess waits in, and overflows from, the kernel's TAP
//! queue: nothing spins, and a slow VMM never ends the relay.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use thiserror::Error;
use tracing::{error, info, warn};

use super::coalesce::Coalescer;
use super::framing::{self, Deframer, FramingError, LENGTH_BYTES};
use super::port::{self, Endpoint, Peer, Port, SockAddr, SocketError};
use super::segment::Splitter;
use super::vnet::{self, ClientHeader};
use super::{Counters, Datapath, FRAME_OVERHEAD};

/// The most frames moved per system call.
const MAX_BATCH: usize = 64;
/// Buffer budget per direction; with 64 KiB frames the batch is smaller.
const BATCH_BYTES: usize = 1 << 20;
/// Room in front of each frame: a virtio-net header and a stream length.
const HEADROOM: usize = 16;
/// The smallest frame: an Ethernet header.
const MIN_FRAME: usize = 14;
/// How long to wait before retrying a send the kernel refused for lack of
/// buffers, when it will not say when there is room.
const RETRY: Duration = Duration::from_millis(1);
/// A stream read takes up to this much at once.
const STREAM_READ: usize = 256 << 10;

// epoll tokens
const TAP: u64 = 0;
const PEER: u64 = 1;
const LISTENER: u64 = 2;

#[derive(Debug, Error)]
pub enum RelayError {
    #[error("cannot set up the TAP for relaying: {0}")]
    TapSetup(io::Error),
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("the TAP failed (was the interface detached?): {0}")]
    Tap(io::Error),
    #[error("the VMM's socket failed: {0}")]
    Peer(io::Error),
    #[error("the VMM sent {0}; the stream cannot be trusted after that")]
    Framing(FramingError),
    #[error("epoll: {0}")]
    Poll(io::Error),
    #[error(transparent)]
    VhostUser(#[from] super::vhost_user::VhostUserError),
}

/// Why the loop stops.
enum Stop {
    /// The VMM closed its end of a socket it was handed (fd modes).
    PeerClosed,
    Failed(RelayError),
}

impl From<RelayError> for Stop {
    fn from(e: RelayError) -> Stop {
        Stop::Failed(e)
    }
}

/// Frames read from the TAP, waiting to go to the VMM. Slot i holds its
/// frame at `i * slot + HEADROOM`, the client's header (if any) just before
/// it, and for streams the length before that.
struct Outbox {
    buf: Box<[u8]>,
    lens: [usize; MAX_BATCH],
    count: usize,
    /// The first frame not yet (fully) sent.
    next: usize,
    /// Stream: bytes of frame `next` already written.
    offset: usize,
    /// Waiting for the socket to drain.
    blocked: Option<Wait>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Writable,
    Timer,
}

/// Frames from the VMM: datagram slots (frame at `i * slot + HEADROOM`), or
/// the stream's reassembly buffer.
enum Inbox {
    Datagrams(Box<[u8]>),
    Stream(Deframer),
}

/// First-occurrence logging of dropped frames, by kind.
#[derive(Default)]
struct Warned {
    oversized: bool,
    refused: bool,
    foreign: bool,
    unbound: bool,
    send: bool,
}

/// Frames from the VMM on their way into the TAP: checked, coalesced (for a
/// VMM that sends bare frames), written and counted.
struct Inlet {
    tap: OwnedFd,
    header: ClientHeader,
    coalescer: Option<Coalescer>,
    counters: Arc<Counters>,
    /// Frames and bytes written since the counters were last updated: they
    /// go to the shared atomics once per batch.
    moved: (u64, u64),
    warned_runt: bool,
    warned_write: bool,
}

pub struct Relay {
    inlet: Inlet,
    port: Port,
    max_frame: usize,
    slot: usize,
    batch: usize,
    outbox: Outbox,
    /// Cuts the TAP's frames for a client that takes bare frames.
    splitter: Option<Splitter>,
    inbox: Inbox,
    epoll: Epoll,
    /// What each token is registered for: (fd, events).
    registered: [Option<(RawFd, EpollFlags)>; 3],
    retry_at: Option<Instant>,
    warned: Warned,
}

impl Relay {
    /// Prepares the TAP (header size, offloads) and the VMM's socket (binds
    /// it, for path endpoints), and allocates every buffer.
    pub fn new(
        tap: OwnedFd,
        endpoint: Endpoint,
        header: ClientHeader,
        mtu: u32,
        counters: Arc<Counters>,
    ) -> Result<Relay, RelayError> {
        vnet::configure_tap(borrow(tap.as_raw_fd()), header).map_err(RelayError::TapSetup)?;
        port::set_nonblocking(tap.as_raw_fd()).map_err(RelayError::TapSetup)?;
        let datapath = endpoint.datapath();
        let port = port::open(endpoint)?;
        let mut max_frame = mtu as usize + FRAME_OVERHEAD;
        if header != ClientHeader::None {
            max_frame = max_frame.max(vnet::GSO_MAX_FRAME + FRAME_OVERHEAD);
        }
        let slot = HEADROOM + max_frame;
        let batch = (BATCH_BYTES / slot).clamp(8, MAX_BATCH);
        let inbox = match datapath {
            Datapath::Stream => Inbox::Stream(Deframer::new(
                header.len() + max_frame,
                STREAM_READ.max(2 * (LENGTH_BYTES + header.len() + max_frame)),
            )),
            _ => Inbox::Datagrams(vec![0; batch * slot].into_boxed_slice()),
        };
        Ok(Relay {
            inlet: Inlet {
                tap,
                header,
                coalescer: (header == ClientHeader::None).then(|| Coalescer::new(header.tap_len())),
                counters,
                moved: (0, 0),
                warned_runt: false,
                warned_write: false,
            },
            port,
            max_frame,
            slot,
            batch,
            outbox: Outbox {
                buf: vec![0; batch * slot].into_boxed_slice(),
                lens: [0; MAX_BATCH],
                count: 0,
                next: 0,
                offset: 0,
                blocked: None,
            },
            splitter: (header == ClientHeader::None).then(|| Splitter::new(header.tap_len())),
            inbox,
            epoll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
                .map_err(|e| RelayError::Poll(e.into()))?,
            registered: [None; 3],
            retry_at: None,
            warned: Warned::default(),
        })
    }

    /// Relays until the VMM closes a socket it was handed (`Ok`) or something
    /// fails for good. A client of a path endpoint may come and go.
    pub fn run(mut self) -> Result<(), RelayError> {
        match self.run_loop() {
            Stop::PeerClosed => Ok(()),
            Stop::Failed(e) => Err(e),
        }
    }

    fn run_loop(&mut self) -> Stop {
        let mut events = [EpollEvent::empty(); 4];
        loop {
            // Segments of a frame already read from the TAP go on as soon as
            // the outbox has room, a batch per pass so the other direction
            // gets its turn; the TAP may have nothing more to wake us.
            let cutting = |r: &Relay| {
                r.outbox.count == 0 && r.splitter.as_ref().is_some_and(Splitter::pending)
            };
            if cutting(self)
                && let Err(stop) = self.tap_readable()
            {
                return stop;
            }
            if let Err(e) = self.update_interest() {
                return e.into();
            }
            let timeout = match self.retry_at {
                _ if cutting(self) => EpollTimeout::ZERO,
                Some(at) => {
                    let ms = at.saturating_duration_since(Instant::now()).as_millis();
                    EpollTimeout::from(ms.clamp(1, 1000) as u16)
                }
                None => EpollTimeout::NONE,
            };
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => return RelayError::Poll(e.into()).into(),
            };
            for event in &events[..n] {
                let flags = event.events();
                let step = match event.data() {
                    TAP => self.tap_readable(),
                    PEER => {
                        let mut step = Ok(());
                        if flags.contains(EpollFlags::EPOLLOUT) {
                            step = self.flush();
                        }
                        if step.is_ok() && !flags.difference(EpollFlags::EPOLLOUT).is_empty() {
                            step = self.peer_readable();
                        }
                        step
                    }
                    _ => self.accept(),
                };
                if let Err(stop) = step {
                    return stop;
                }
            }
            if self.retry_at.is_some_and(|at| Instant::now() >= at) {
                self.retry_at = None;
                self.outbox.blocked = None;
                if let Err(stop) = self.flush() {
                    return stop;
                }
            }
        }
    }

    // ---- to the VM -----------------------------------------------------------

    fn tap_readable(&mut self) -> Result<(), Stop> {
        if self.outbox.count > 0 {
            return Ok(());
        }
        self.read_tap_batch()?;
        self.flush()
    }

    /// Reads up to a batch of frames from the TAP into the outbox.
    fn read_tap_batch(&mut self) -> Result<(), Stop> {
        let client_hdr = self.inlet.header.len();
        let stream = matches!(self.port, Port::Stream { .. });
        while self.outbox.count < self.batch {
            let i = self.outbox.count;
            let Some(len) = self.next_for_vm(i)? else {
                break;
            };
            if stream {
                let at = i * self.slot + HEADROOM - client_hdr - LENGTH_BYTES;
                self.outbox.buf[at..at + LENGTH_BYTES]
                    .copy_from_slice(&framing::length_prefix(len));
            }
            self.outbox.lens[i] = len;
            self.outbox.count += 1;
        }
        Ok(())
    }

    /// Puts the next frame for the VM into outbox slot `i`, after the room
    /// for the client's header: the frame's length with that header, or
    /// `None` when the TAP has nothing more for now.
    fn next_for_vm(&mut self, i: usize) -> Result<Option<usize>, Stop> {
        let slot = &mut self.outbox.buf[i * self.slot..(i + 1) * self.slot];
        let tap = borrow(self.inlet.tap.as_raw_fd());
        let Some(splitter) = &mut self.splitter else {
            // A client that speaks the header takes the TAP's frames as
            // they are, header included.
            let client_hdr = self.inlet.header.len();
            return loop {
                match nix::unistd::read(tap, &mut slot[HEADROOM - client_hdr..]) {
                    Ok(n) if n >= client_hdr + MIN_FRAME => break Ok(Some(n)),
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(Errno::EAGAIN) => break Ok(None),
                    Err(e) => break Err(RelayError::Tap(e.into()).into()),
                }
            };
        };
        loop {
            if let Some(len) = splitter.next(&mut slot[HEADROOM..]) {
                return Ok(Some(len));
            }
            match nix::unistd::read(tap, splitter.buffer()) {
                Ok(n) if n >= self.inlet.header.tap_len() + MIN_FRAME => {
                    if let Err(refused) = splitter.load(n, self.max_frame) {
                        self.inlet.counters.to_vm.drop_frames(1);
                        warn_once(&mut self.warned.refused, || {
                            format!(
                                "dropping {refused} for the VMM (further ones are only counted)"
                            )
                        });
                    }
                }
                Ok(_) | Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return Ok(None),
                Err(e) => return Err(RelayError::Tap(e.into()).into()),
            }
        }
    }

    /// Sends what the outbox holds; keeps the rest when the socket is full.
    fn flush(&mut self) -> Result<(), Stop> {
        if self.outbox.count == 0 {
            return Ok(());
        }
        let outcome = match &self.port {
            Port::Dgram { .. } => self.send_datagrams(),
            Port::Stream { conn: Some(_), .. } => self.send_stream(),
            Port::Stream { conn: None, .. } => {
                // Nobody to deliver to yet.
                self.drop_outbox();
                Ok(())
            }
        };
        if self.outbox.next == self.outbox.count {
            self.outbox.count = 0;
            self.outbox.next = 0;
            self.outbox.offset = 0;
            self.outbox.blocked = None;
        }
        if self.outbox.blocked == Some(Wait::Timer) && self.retry_at.is_none() {
            self.retry_at = Some(Instant::now() + RETRY);
        }
        outcome
    }

    fn drop_outbox(&mut self) {
        let left = (self.outbox.count - self.outbox.next) as u64;
        self.inlet.counters.to_vm.drop_frames(left);
        self.outbox.next = self.outbox.count;
    }

    fn payload(&self, i: usize) -> (usize, usize) {
        let start = i * self.slot + HEADROOM - self.inlet.header.len();
        (start, start + self.outbox.lens[i])
    }

    fn send_datagrams(&mut self) -> Result<(), Stop> {
        let Port::Dgram { sock, peer } = &self.port else {
            unreachable!("checked by flush")
        };
        let mut to = match peer {
            Peer::Connected => None,
            Peer::Known(addr) => Some(*addr),
            Peer::Awaiting => {
                self.drop_outbox();
                return Ok(());
            }
        };
        let sock = sock.as_raw_fd();
        while self.outbox.next < self.outbox.count {
            let first = self.outbox.next;
            let n = self.outbox.count - first;
            // SAFETY: iovec and mmsghdr are plain old data; zeroes are valid.
            let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { mem::zeroed() };
            let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
            for k in 0..n {
                let (start, end) = self.payload(first + k);
                iovs[k] = libc::iovec {
                    iov_base: self.outbox.buf[start..].as_ptr() as *mut libc::c_void,
                    iov_len: end - start,
                };
                msgs[k].msg_hdr.msg_iov = &mut iovs[k];
                msgs[k].msg_hdr.msg_iovlen = 1;
                if let Some(addr) = to.as_mut() {
                    msgs[k].msg_hdr.msg_name = (&mut addr.addr as *mut libc::sockaddr_un).cast();
                    msgs[k].msg_hdr.msg_namelen = addr.len;
                }
            }
            // SAFETY: every msghdr points into live buffers for the call.
            let sent = unsafe {
                libc::sendmmsg(
                    sock,
                    msgs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if sent > 0 {
                let sent = sent as usize;
                let bytes: usize = (first..first + sent).map(|i| self.outbox.lens[i]).sum();
                self.inlet.counters.to_vm.add(sent as u64, bytes as u64);
                self.outbox.next += sent;
                continue;
            }
            match Errno::last() {
                Errno::EINTR => {}
                Errno::EAGAIN => {
                    // A socketpair's poll follows its peer's queue; a bound
                    // socket sending to an address gets no such wake-up.
                    let wait = if to.is_none() {
                        Wait::Writable
                    } else {
                        Wait::Timer
                    };
                    self.outbox.blocked = Some(wait);
                    return Ok(());
                }
                Errno::ENOBUFS => {
                    self.outbox.blocked = Some(Wait::Timer);
                    return Ok(());
                }
                Errno::EMSGSIZE => {
                    warn_once(&mut self.warned.send, || {
                        format!(
                            "the VMM's socket refused a {}-byte frame as too large; dropping such frames",
                            self.outbox.lens[first]
                        )
                    });
                    self.inlet.counters.to_vm.drop_frames(1);
                    self.outbox.next += 1;
                }
                Errno::ECONNREFUSED | Errno::ENOTCONN | Errno::EPIPE | Errno::ECONNRESET => {
                    if to.is_none() {
                        return Err(Stop::PeerClosed);
                    }
                    self.client_gone();
                    self.drop_outbox();
                    return Ok(());
                }
                Errno::ENOENT => {
                    self.client_gone();
                    self.drop_outbox();
                    return Ok(());
                }
                e => {
                    warn_once(&mut self.warned.send, || {
                        format!("cannot send frames to the VMM: {e}; dropping them")
                    });
                    self.drop_outbox();
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn send_stream(&mut self) -> Result<(), Stop> {
        let Port::Stream {
            conn: Some(conn), ..
        } = &self.port
        else {
            unreachable!("checked by flush")
        };
        let conn = conn.as_raw_fd();
        while self.outbox.next < self.outbox.count {
            let first = self.outbox.next;
            let n = self.outbox.count - first;
            // SAFETY: plain old data; zeroes are valid.
            let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { mem::zeroed() };
            for (k, iov) in iovs.iter_mut().enumerate().take(n) {
                let (start, end) = self.payload(first + k);
                let mut start = start - LENGTH_BYTES;
                if k == 0 {
                    start += self.outbox.offset;
                }
                *iov = libc::iovec {
                    iov_base: self.outbox.buf[start..].as_ptr() as *mut libc::c_void,
                    iov_len: end - start,
                };
            }
            // SAFETY: plain old data; zeroes are valid.
            let mut msg: libc::msghdr = unsafe { mem::zeroed() };
            msg.msg_iov = iovs.as_mut_ptr();
            msg.msg_iovlen = n;
            // SAFETY: the iovecs point into the outbox, live for the call.
            let written =
                unsafe { libc::sendmsg(conn, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            if written >= 0 {
                self.advance_stream(written as usize);
                continue;
            }
            match Errno::last() {
                Errno::EINTR => {}
                Errno::EAGAIN => {
                    self.outbox.blocked = Some(Wait::Writable);
                    return Ok(());
                }
                Errno::ENOBUFS => {
                    self.outbox.blocked = Some(Wait::Timer);
                    return Ok(());
                }
                e => {
                    info!("the VMM's stream closed while sending: {e}");
                    return self.stream_client_gone();
                }
            }
        }
        Ok(())
    }

    /// Accounts `written` bytes of the outbox as sent to the stream.
    fn advance_stream(&mut self, mut written: usize) {
        let mut frames = 0;
        let mut bytes = 0;
        while written > 0 {
            let len = self.outbox.lens[self.outbox.next];
            let left = LENGTH_BYTES + len - self.outbox.offset;
            if written < left {
                self.outbox.offset += written;
                break;
            }
            written -= left;
            self.outbox.offset = 0;
            self.outbox.next += 1;
            frames += 1;
            bytes += len;
        }
        self.inlet.counters.to_vm.add(frames, bytes as u64);
    }

    // ---- from the VM ---------------------------------------------------------

    fn peer_readable(&mut self) -> Result<(), Stop> {
        let received = match self.port {
            Port::Dgram { .. } => self.receive_datagrams(),
            Port::Stream { .. } => self.receive_stream(),
        };
        // A run of segments never outlives the batch it came in.
        self.inlet.write_run()?;
        self.inlet.publish();
        received
    }

    fn receive_datagrams(&mut self) -> Result<(), Stop> {
        let Port::Dgram { sock, .. } = &self.port else {
            unreachable!("called for datagram ports")
        };
        let Inbox::Datagrams(buf) = &mut self.inbox else {
            unreachable!("datagram ports have datagram slots")
        };
        let client_hdr = self.inlet.header.len();
        let capacity = client_hdr + self.max_frame;
        // SAFETY: plain old data; zeroes are valid.
        let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { mem::zeroed() };
        let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
        let mut from = [SockAddr::empty(); MAX_BATCH];
        for k in 0..self.batch {
            let start = k * self.slot + HEADROOM - client_hdr;
            iovs[k] = libc::iovec {
                iov_base: buf[start..].as_mut_ptr().cast(),
                iov_len: capacity,
            };
            msgs[k].msg_hdr.msg_iov = &mut iovs[k];
            msgs[k].msg_hdr.msg_iovlen = 1;
            msgs[k].msg_hdr.msg_name = (&mut from[k].addr as *mut libc::sockaddr_un).cast();
            msgs[k].msg_hdr.msg_namelen = from[k].len;
        }
        // SAFETY: every msghdr points into the inbox and `from`, live for the call.
        let got = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                self.batch as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            return match (Errno::last(), &self.port) {
                (Errno::EAGAIN | Errno::EINTR, _) => Ok(()),
                (
                    Errno::ECONNRESET | Errno::ECONNREFUSED,
                    Port::Dgram {
                        peer: Peer::Connected,
                        ..
                    },
                ) => Err(Stop::PeerClosed),
                (Errno::ECONNRESET | Errno::ECONNREFUSED, _) => Ok(()),
                (e, _) => Err(RelayError::Peer(e.into()).into()),
            };
        }
        for k in 0..got as usize {
            let len = msgs[k].msg_len as usize;
            from[k].len = msgs[k].msg_hdr.msg_namelen;
            if !self.accept_sender(&from[k]) {
                self.inlet.counters.from_vm.drop_frames(1);
                continue;
            }
            if msgs[k].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                self.oversized(len);
                continue;
            }
            let Inbox::Datagrams(buf) = &self.inbox else {
                unreachable!()
            };
            let start = k * self.slot + HEADROOM - client_hdr;
            self.inlet.frame(&buf[start..start + len])?;
        }
        Ok(())
    }

    /// Whether a datagram from `from` is the served client's.
    fn accept_sender(&mut self, from: &SockAddr) -> bool {
        let Port::Dgram { peer, .. } = &mut self.port else {
            return true;
        };
        match peer {
            Peer::Connected => true,
            Peer::Known(served) => {
                let ok = served.same(from);
                if !ok {
                    warn_once(&mut self.warned.foreign, || {
                        format!("ignoring frames from {from}: this socket serves {served}")
                    });
                }
                ok
            }
            Peer::Awaiting if from.is_named() => {
                info!(client = %from, "serving the first client");
                *peer = Peer::Known(*from);
                true
            }
            Peer::Awaiting => {
                warn_once(&mut self.warned.unbound, || {
                    "ignoring frames from a client whose socket has no address: bind it to a path so replies can reach it (QEMU: -netdev dgram,local.type=unix,local.path=...)".to_string()
                });
                false
            }
        }
    }

    fn client_gone(&mut self) {
        if let Port::Dgram { peer, .. } = &mut self.port
            && let Peer::Known(addr) = peer
        {
            info!(client = %addr, "the client's socket is gone; serving the next one to send a frame");
            *peer = Peer::Awaiting;
            self.warned.foreign = false;
        }
    }

    fn receive_stream(&mut self) -> Result<(), Stop> {
        let Port::Stream {
            conn: Some(conn), ..
        } = &self.port
        else {
            return Ok(());
        };
        let conn = conn.as_raw_fd();
        let Inbox::Stream(deframer) = &mut self.inbox else {
            unreachable!("stream ports have a deframer")
        };
        let spare = deframer.spare();
        // SAFETY: `spare` is writable for its length.
        let n = unsafe {
            libc::recv(
                conn,
                spare.as_mut_ptr().cast(),
                spare.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return match Errno::last() {
                Errno::EAGAIN | Errno::EINTR => Ok(()),
                e => {
                    info!("the VMM's stream failed: {e}");
                    self.stream_client_gone()
                }
            };
        }
        if n == 0 {
            if deframer.pending() > 0 {
                warn!(
                    bytes = deframer.pending(),
                    "the VMM closed its stream in the middle of a frame; dropping the partial frame"
                );
                self.inlet.counters.from_vm.drop_frames(1);
            }
            return self.stream_client_gone();
        }
        deframer.filled(n as usize);
        loop {
            let Inbox::Stream(deframer) = &mut self.inbox else {
                unreachable!()
            };
            let range = match deframer.next_frame() {
                None => break,
                Some(Ok(range)) => range,
                Some(Err(e)) => {
                    self.inlet.counters.from_vm.drop_frames(1);
                    return self.bad_stream(e);
                }
            };
            let Inbox::Stream(deframer) = &self.inbox else {
                unreachable!()
            };
            self.inlet.frame(&deframer.buffer()[range])?;
        }
        Ok(())
    }

    /// A stream that broke framing: an fd client ends the relay, a path
    /// client is disconnected and the next one served.
    fn bad_stream(&mut self, e: FramingError) -> Result<(), Stop> {
        match &self.port {
            Port::Stream { listener: None, .. } => Err(RelayError::Framing(e).into()),
            _ => {
                error!("the VMM sent {e}; closing its connection");
                self.stream_client_gone()
            }
        }
    }

    fn stream_client_gone(&mut self) -> Result<(), Stop> {
        let Port::Stream { conn, listener } = &mut self.port else {
            return Ok(());
        };
        if listener.is_none() {
            return Err(Stop::PeerClosed);
        }
        if let Some(old) = conn.take() {
            let _ = self.epoll.delete(&old);
            self.registered[PEER as usize] = None;
            info!("the client disconnected; waiting for the next one");
        }
        if let Inbox::Stream(deframer) = &mut self.inbox {
            deframer.reset();
        }
        self.drop_outbox();
        self.outbox.count = 0;
        self.outbox.next = 0;
        self.outbox.offset = 0;
        self.outbox.blocked = None;
        Ok(())
    }

    fn accept(&mut self) -> Result<(), Stop> {
        let Port::Stream {
            conn: conn @ None,
            listener: Some(listener),
        } = &mut self.port
        else {
            return Ok(());
        };
        match nix::sys::socket::accept4(
            listener.as_raw_fd(),
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        ) {
            Ok(raw) => {
                // SAFETY: accept4 returned a new descriptor that we now own.
                let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
                *conn = Some(port::prepare(fd).map_err(RelayError::from)?);
                info!("a client connected");
                Ok(())
            }
            Err(Errno::EAGAIN | Errno::EINTR | Errno::ECONNABORTED) => Ok(()),
            Err(e) => Err(RelayError::Peer(e.into()).into()),
        }
    }

    // ---- drops -----------------------------------------------------------------

    fn oversized(&mut self, len: usize) {
        self.inlet.counters.from_vm.drop_frames(1);
        let max = self.inlet.header.len() + self.max_frame;
        warn_once(&mut self.warned.oversized, || {
            format!(
                "dropping a frame from the VMM larger than {max} bytes (got at least {len}); is the VM's MTU above the network's? (further ones are only counted)"
            )
        });
    }

    // ---- epoll -------------------------------------------------------------------

    /// Registers what each fd should wake us for now.
    fn update_interest(&mut self) -> Result<(), RelayError> {
        let idle = self.outbox.count == 0;
        let tap = Some((
            self.inlet.tap.as_raw_fd(),
            if idle {
                EpollFlags::EPOLLIN
            } else {
                EpollFlags::empty()
            },
        ));
        let (peer, listener) = match &self.port {
            Port::Dgram { sock, .. } => (Some(sock.as_raw_fd()), None),
            Port::Stream { conn, listener } => (
                conn.as_ref().map(|c| c.as_raw_fd()),
                listener.as_ref().map(|l| {
                    let want = if conn.is_none() {
                        EpollFlags::EPOLLIN
                    } else {
                        EpollFlags::empty()
                    };
                    (l.as_raw_fd(), want)
                }),
            ),
        };
        let mut peer_flags = EpollFlags::EPOLLIN;
        if self.outbox.blocked == Some(Wait::Writable) {
            peer_flags |= EpollFlags::EPOLLOUT;
        }
        self.register(TAP, tap)?;
        self.register(PEER, peer.map(|fd| (fd, peer_flags)))?;
        self.register(LISTENER, listener)
    }

    fn register(
        &mut self,
        token: u64,
        want: Option<(RawFd, EpollFlags)>,
    ) -> Result<(), RelayError> {
        let current = &mut self.registered[token as usize];
        if *current == want {
            return Ok(());
        }
        let result = match (*current, want) {
            (Some((old, _)), None) => self.epoll.delete(borrow(old)),
            (None, Some((fd, flags))) => self.epoll.add(borrow(fd), EpollEvent::new(flags, token)),
            (Some((old, _)), Some((fd, flags))) if old == fd => self
                .epoll
                .modify(borrow(fd), &mut EpollEvent::new(flags, token)),
            (Some((old, _)), Some((fd, flags))) => {
                let _ = self.epoll.delete(borrow(old));
                self.epoll.add(borrow(fd), EpollEvent::new(flags, token))
            }
            (None, None) => Ok(()),
        };
        *current = want;
        result.map_err(|e| RelayError::Poll(e.into()))
    }
}

impl Inlet {
    /// Takes one frame from the VMM (with the client's header, if it speaks
    /// one): a runt is dropped and counted; a TCP segment from a bare client
    /// may join a run; anything else is written to the TAP at once, after
    /// the run it interrupts. `Err`: the TAP is gone.
    fn frame(&mut self, frame: &[u8]) -> Result<(), Stop> {
        if frame.len() < self.header.len() + MIN_FRAME {
            self.counters.from_vm.drop_frames(1);
            warn_once(&mut self.warned_runt, || {
                format!(
                    "dropping a {}-byte frame from the VMM: shorter than {} bytes (further ones are only counted)",
                    frame.len(),
                    self.header.len() + MIN_FRAME
                )
            });
            return Ok(());
        }
        if self.coalescer.as_mut().is_some_and(|c| c.append(frame)) {
            return Ok(());
        }
        self.write_run()?;
        if self.coalescer.as_mut().is_some_and(|c| c.start(frame)) {
            return Ok(());
        }
        let zero = &vnet::ZERO[..self.header.tap_len()];
        let both = [io::IoSlice::new(zero), io::IoSlice::new(frame)];
        let iov: &[io::IoSlice] = match self.header {
            ClientHeader::None => &both,
            ClientHeader::Virtio(_) => &both[1..],
        };
        self.write(iov, 1, frame.len() as u64)
    }

    /// Writes the pending run of segments, if any.
    fn write_run(&mut self) -> Result<(), Stop> {
        let Some(run) = self.coalescer.as_mut().and_then(|c| c.finish()) else {
            return Ok(());
        };
        let (frames, bytes) = (run.frames, run.bytes);
        let data = io::IoSlice::new(run.data);
        write_tap(
            &self.tap,
            &[data],
            frames,
            &self.counters,
            &mut self.warned_write,
        )
        .map(|moved| self.add_moved(moved.then_some((frames, bytes))))
    }

    /// Writes one frame to the TAP, standing for `frames` of the VMM's.
    fn write(&mut self, iov: &[io::IoSlice], frames: u64, bytes: u64) -> Result<(), Stop> {
        let moved = write_tap(
            &self.tap,
            iov,
            frames,
            &self.counters,
            &mut self.warned_write,
        )?;
        self.add_moved(moved.then_some((frames, bytes)));
        Ok(())
    }

    fn add_moved(&mut self, moved: Option<(u64, u64)>) {
        if let Some((frames, bytes)) = moved {
            self.moved.0 += frames;
            self.moved.1 += bytes;
        }
    }

    /// Updates the shared counters with what this batch moved.
    fn publish(&mut self) {
        if self.moved != (0, 0) {
            self.counters.from_vm.add(self.moved.0, self.moved.1);
            self.moved = (0, 0);
        }
    }
}

/// Writes one frame to the TAP: `Ok(true)` if it went, `Ok(false)` if the
/// kernel refused it (the VMM's `frames` it stands for are counted as
/// dropped), `Err` if the TAP is gone.
fn write_tap(
    tap: &OwnedFd,
    iov: &[io::IoSlice],
    frames: u64,
    counters: &Counters,
    warned: &mut bool,
) -> Result<bool, Stop> {
    loop {
        match nix::sys::uio::writev(borrow(tap.as_raw_fd()), iov) {
            Ok(_) => return Ok(true),
            Err(Errno::EINTR) => continue,
            Err(e @ (Errno::EBADFD | Errno::EBADF)) => {
                return Err(RelayError::Tap(e.into()).into());
            }
            Err(e) => {
                counters.from_vm.drop_frames(frames);
                warn_once(warned, || {
                    format!(
                        "the kernel refused a frame from the VMM: {e} (further ones are only counted)"
                    )
                });
                return Ok(false);
            }
        }
    }
}

fn warn_once(flag: &mut bool, message: impl FnOnce() -> String) {
    if !*flag {
        *flag = true;
        warn!("{}", message());
    }
}

fn borrow<'a>(fd: RawFd) -> BorrowedFd<'a> {
    // SAFETY: only used for fds the relay owns, for the duration of a call.
    unsafe { BorrowedFd::borrow_raw(fd) }
}
