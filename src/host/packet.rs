//! Packet sockets that see a few kinds of frame on every link of the
//! namespace, in both directions: DHCP replies, for DHCP snooping on LAN
//! networks, and IPv6 duplicate address detection probes, for the
//! addresses VMs form themselves (`formed6`). A classic BPF filter in the
//! kernel passes only those, so the rest of the host's traffic never
//! reaches linnet.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The link a frame passed and which way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub index: u32,
    /// The host sent it out of the link (PACKET_OUTGOING); otherwise the
    /// link received it.
    pub outgoing: bool,
    pub len: usize,
}

// <linux/filter.h> classic BPF opcodes.
const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_H_IND: u16 = 0x48;
const LDX_B_MSH: u16 = 0xb1;
const JEQ_K: u16 = 0x15;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;

/// IPv4 (ethertype at 12), UDP (protocol at 23), no fragment (offset and
/// MF at 20), source port 67 and destination port 68 (at 14 + header
/// length, and + 2). Port 67 is privileged: a local user without it cannot
/// send a reply that passes.
const DHCP_FILTER: [libc::sock_filter; 13] = [
    op(LD_H_ABS, 0, 0, 12),
    op(JEQ_K, 0, 10, 0x0800),
    op(LD_B_ABS, 0, 0, 23),
    op(JEQ_K, 0, 8, 17),
    op(LD_H_ABS, 0, 0, 20),
    op(JSET_K, 6, 0, 0x3fff),
    op(LDX_B_MSH, 0, 0, 14),
    op(LD_H_IND, 0, 0, 14),
    op(JEQ_K, 0, 3, 67),
    op(LD_H_IND, 0, 0, 16),
    op(JEQ_K, 0, 1, 68),
    op(RET_K, 0, 0, 0xffff),
    op(RET_K, 0, 0, 0),
];

/// IPv6 (ethertype at 12), ICMPv6 (next header at 20), hop limit 255 (at
/// 21), from :: (16 bytes at 22), a neighbour solicitation (type 135 at
/// 54): a duplicate address detection probe, or one that looks like it
/// (`formed6::probe` checks the rest). The first 78 bytes are enough.
const DAD_FILTER: [libc::sock_filter; 18] = [
    op(LD_H_ABS, 0, 0, 12),
    op(JEQ_K, 0, 15, 0x86dd),
    op(LD_B_ABS, 0, 0, 20),
    op(JEQ_K, 0, 13, 58),
    op(LD_B_ABS, 0, 0, 21),
    op(JEQ_K, 0, 11, 255),
    op(LD_W_ABS, 0, 0, 22),
    op(JEQ_K, 0, 9, 0),
    op(LD_W_ABS, 0, 0, 26),
    op(JEQ_K, 0, 7, 0),
    op(LD_W_ABS, 0, 0, 30),
    op(JEQ_K, 0, 5, 0),
    op(LD_W_ABS, 0, 0, 34),
    op(JEQ_K, 0, 3, 0),
    op(LD_B_ABS, 0, 0, 54),
    op(JEQ_K, 0, 1, 135),
    op(RET_K, 0, 0, 78),
    op(RET_K, 0, 0, 0),
];

const fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The DHCP replies' socket.
pub fn dhcp_replies() -> io::Result<OwnedFd> {
    filtered(&DHCP_FILTER)
}

/// The duplicate address detection probes' socket.
/// It hears only frames links receive (a probe enters from the VM's
/// port): a socket that hears what links send costs every frame sent in
/// the namespace a copy for it, before its filter runs.
pub fn dad_probes() -> io::Result<OwnedFd> {
    let fd = filtered(&DAD_FILTER)?;
    let on: libc::c_int = 1;
    set_option(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &on)?;
    Ok(fd)
}

/// setsockopt(2) of `value` (the type the option takes) on `fd`.
fn set_option<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: value is a T of the size given, on a socket we own; the
    // kernel copies it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens a socket: made with no protocol (it hears nothing), filtered,
/// then bound to every protocol, so no unfiltered frame is ever queued.
fn filtered(filter: &[libc::sock_filter]) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2) and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // The program outlives the call; the kernel copies it.
    set_option(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)?;
    // SAFETY: an all-zero sockaddr_ll is valid; the fields set below.
    let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: addr is a sockaddr_ll of the size given.
    if unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Reads one frame into `buf`: which link, which way, how long (cut to
/// the buffer). WouldBlock when there is none.
pub fn recv(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Seen> {
    // SAFETY: an all-zero sockaddr_ll is valid for the kernel to fill.
    let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
    let mut addr_len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: buf and addr are valid for the lengths given.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&mut addr as *mut libc::sockaddr_ll).cast(),
            &mut addr_len,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Seen {
        index: addr.sll_ifindex as u32,
        outgoing: addr.sll_pkttype == libc::PACKET_OUTGOING,
        len: n as usize,
    })
}

/// Announces that `ip` is at `mac` on link `index` of the thread's
/// namespace: one gratuitous ARP request, broadcast, so that neighbours
/// holding an older MAC for `ip` take the new one at once rather than
/// after their entry goes stale (a clone taking over its VM's address).
pub fn announce(index: u32, mac: [u8; 6], ip: std::net::Ipv4Addr) -> io::Result<()> {
    const ARP: u16 = 0x0806;
    let mut frame = [0u8; 42];
    frame[..6].fill(0xff);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&ARP.to_be_bytes());
    // Ethernet, IPv4, 6- and 4-byte addresses, a request.
    frame[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    frame[22..28].copy_from_slice(&mac);
    frame[28..32].copy_from_slice(&ip.octets());
    frame[38..42].copy_from_slice(&ip.octets());
    // SAFETY: plain socket(2) with no protocol (it receives nothing); the
    // fd is owned at once.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; all-zero is valid.
    let mut to: libc::sockaddr_ll = unsafe { zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_protocol = ARP.to_be();
    to.sll_ifindex = index as i32;
    to.sll_halen = 6;
    to.sll_addr[..6].fill(0xff);
    // SAFETY: the frame and address outlive the call; sizes are theirs.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&to as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
