//! One NFQUEUE queue over netfilter's netlink (`nfnetlink_queue`): the
//! packets of held connections (`gate_queue`'s rule), each with its id,
//! mark and bytes, and the verdicts that release them. Only what linnet
//! uses of the protocol (linux/netfilter/nfnetlink_queue.h): bind, whole
//! packets (GSO ones as they are), the queue's length, per-packet
//! verdicts with a mark; read into one buffer, without allocating.
//!
//! Both ends of the exchange must be privileged: the kernel checks
//! CAP_NET_ADMIN of the socket's opener and of whoever sends a verdict,
//! so the daemon holds the queue and the unprivileged gate only judges.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use super::nfnetlink::{self, NFGENMSG_LEN, NLA_HDRLEN, NLMSG_HDRLEN, align, attrs, be32};

/// nfnetlink's subsystem of queues, and its messages.
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
/// Attributes of a packet and of a verdict.
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_MARK: u16 = 3;
const NFQA_PAYLOAD: u16 = 10;
/// Attributes of a configuration.
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
/// Packets as they came (a GSO one whole), not segmented for us.
const NFQA_CFG_F_GSO: u32 = 4;
const NFQA_CFG_F_FAIL_OPEN: u32 = 1;

/// What becomes of a queued packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// On through the hook, with this mark.
    Accept(u32),
    /// Through the same hook's chain (the queue's rule) again, with this
    /// mark.
    Repeat(u32),
    Drop,
}

/// A queued packet, borrowed from the receive buffer.
#[derive(Debug)]
pub struct Packet<'a> {
    pub id: u32,
    pub mark: u32,
    /// From its network header on.
    pub bytes: &'a [u8],
}

pub struct Queue {
    fd: OwnedFd,
    number: u16,
    seq: u32,
}

/// Appends a netlink attribute.
fn put_attr(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = NLA_HDRLEN + value.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(align(buf.len()), 0);
}

impl Queue {
    /// Binds queue `number`: whole packets, at most `max_len` waiting in
    /// the kernel (past them it drops new ones: never fails open).
    pub fn open(number: u16, max_len: u32) -> io::Result<Queue> {
        // Room for many held packets between two reads.
        let mut queue = Queue {
            fd: nfnetlink::socket(8 << 20)?,
            number,
            seq: 0,
        };
        let cmd = [NFQNL_CFG_CMD_BIND, 0, 0, 0];
        queue.configure(&[(NFQA_CFG_CMD, &cmd)])?;
        let mut params = 0xffffu32.to_be_bytes().to_vec();
        params.push(NFQNL_COPY_PACKET);
        let flags = NFQA_CFG_F_GSO.to_be_bytes();
        let mask = (NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN).to_be_bytes();
        queue.configure(&[
            (NFQA_CFG_PARAMS, &params),
            (NFQA_CFG_QUEUE_MAXLEN, &max_len.to_be_bytes()),
            (NFQA_CFG_MASK, &mask),
            (NFQA_CFG_FLAGS, &flags),
        ])?;
        Ok(queue)
    }

    fn header(&mut self, buf: &mut Vec<u8>, msg: u16, flags: u16) {
        self.seq = self.seq.wrapping_add(1);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set once known
        buf.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | msg).to_ne_bytes());
        buf.extend_from_slice(&(libc::NLM_F_REQUEST as u16 | flags).to_ne_bytes());
        buf.extend_from_slice(&self.seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: AF_UNSPEC, version 0, the queue (big-endian).
        buf.extend_from_slice(&[0, 0]);
        buf.extend_from_slice(&self.number.to_be_bytes());
    }

    fn finish(buf: &mut [u8], start: usize) {
        let len = (buf.len() - start) as u32;
        buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    fn send(&self, buf: &[u8]) -> io::Result<()> {
        // SAFETY: send(2) of our buffer on our socket (to the kernel: the
        // socket is bound to no one else).
        let n = unsafe { libc::send(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends one configuration and waits for its acknowledgement.
    fn configure(&mut self, attributes: &[(u16, &[u8])]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(64);
        self.header(&mut buf, NFQNL_MSG_CONFIG, libc::NLM_F_ACK as u16);
        for (kind, value) in attributes {
            put_attr(&mut buf, *kind, value);
        }
        Self::finish(&mut buf, 0);
        self.send(&buf)?;
        let mut reply = [0u8; 512];
        loop {
            let mut poll = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) of one pollfd of ours.
            if unsafe { libc::poll(&mut poll, 1, 1000) } == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel did not answer a queue configuration",
                ));
            }
            // SAFETY: recv(2) into our buffer.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    reply.as_mut_ptr().cast(),
                    reply.len(),
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    continue;
                }
                return Err(e);
            }
            let reply = &reply[..n as usize];
            if reply.len() >= NLMSG_HDRLEN + 4
                && u16::from_ne_bytes([reply[4], reply[5]]) == libc::NLMSG_ERROR as u16
            {
                let errno = i32::from_ne_bytes(reply[16..20].try_into().expect("4 bytes"));
                return match errno {
                    0 => Ok(()),
                    e => Err(io::Error::from_raw_os_error(-e)),
                };
            }
        }
    }

    /// Reads what is waiting into `buf`: the bytes read (`packets` finds
    /// the packets in them), 0 when nothing was.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        nfnetlink::recv(&self.fd, buf)
    }

    /// Appends the verdict on packet `id` to `batch` (sent by `send_batch`).
    pub fn verdict(&mut self, batch: &mut Vec<u8>, id: u32, verdict: Verdict) {
        let start = batch.len();
        self.header(batch, NFQNL_MSG_VERDICT, 0);
        let (code, mark) = match verdict {
            Verdict::Accept(mark) => (libc::NF_ACCEPT as u32, Some(mark)),
            Verdict::Repeat(mark) => (libc::NF_REPEAT as u32, Some(mark)),
            Verdict::Drop => (libc::NF_DROP as u32, None),
        };
        let mut header = [0u8; 8];
        header[..4].copy_from_slice(&code.to_be_bytes());
        header[4..].copy_from_slice(&id.to_be_bytes());
        put_attr(batch, NFQA_VERDICT_HDR, &header);
        if let Some(mark) = mark {
            put_attr(batch, NFQA_MARK, &mark.to_be_bytes());
        }
        Self::finish(batch, start);
    }

    /// Sends the verdicts in `batch` in one write, and empties it.
    pub fn send_batch(&self, batch: &mut Vec<u8>) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let sent = self.send(batch);
        batch.clear();
        sent
    }
}

/// The packets in what `Queue::recv` read.
pub fn packets(mut rest: &[u8]) -> impl Iterator<Item = Packet<'_>> {
    std::iter::from_fn(move || {
        while rest.len() >= NLMSG_HDRLEN {
            let len = u32::from_ne_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            if len < NLMSG_HDRLEN || len > rest.len() {
                return None;
            }
            let message = &rest[..len];
            rest = &rest[align(len).min(rest.len())..];
            let kind = u16::from_ne_bytes([message[4], message[5]]);
            if kind != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET
                || len < NLMSG_HDRLEN + NFGENMSG_LEN
            {
                continue;
            }
            let (mut id, mut mark, mut bytes) = (None, 0, &[][..]);
            for (attr, value) in attrs(&message[NLMSG_HDRLEN + NFGENMSG_LEN..]) {
                match attr {
                    NFQA_PACKET_HDR => id = be32(value),
                    NFQA_MARK => mark = be32(value).unwrap_or(0),
                    NFQA_PAYLOAD => bytes = value,
                    _ => {}
                }
            }
            if let Some(id) = id {
                return Some(Packet { id, mark, bytes });
            }
        }
        None
    })
}

impl AsFd for Queue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
