//! What conntrack tells of the connections the name check allowed
//! (ctnetlink's update and destroy events, linux/netfilter/nfnetlink_conntrack.h):
//! when each ended (its TCP state reached TIME_WAIT or CLOSE), and the
//! bytes it moved each way (asked of conntrack then: `counted`; or told
//! when conntrack forgets a connection that never said it ended). The kernel filters
//! the events (a socket filter on the conntrack mark's gate bits:
//! `firewall::gate::ALLOWED`), so the host's other connections never
//! reach the daemon. Bytes need conntrack's accounting
//! (`net.netfilter.nf_conntrack_acct`), which `enable_accounting` turns on
//! in the daemon's namespace.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use super::nfnetlink::{self, NFGENMSG_LEN, NLMSG_HDRLEN, be16, be64, find};

use super::firewall::gate::{ALLOWED, MASK};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NFNLGRP_CONNTRACK_UPDATE: u32 = 2;
const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_PROTOINFO: u16 = 4;
const CTA_MARK: u16 = 8;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;
/// TCP states, as conntrack numbers them.
const TCP_TIME_WAIT: u8 = 7;
const TCP_CLOSE: u8 = 8;

/// A connection, by its original direction (as the VM sent it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub source: IpAddr,
    pub destination: IpAddr,
    pub source_port: u16,
    pub port: u16,
}

/// What an event says of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Told {
    /// It ended (its TCP state is TIME_WAIT or CLOSE).
    Ended(Tuple),
    /// Conntrack forgot it, having counted these bytes each way (from the
    /// VM, to it; None without accounting).
    Forgotten(Tuple, Option<(u64, u64)>),
}

pub struct Events {
    fd: OwnedFd,
    /// For asking conntrack about one connection (`counted`): apart from
    /// the events' socket, whose multicast would interleave.
    ask: OwnedFd,
}

/// Turns conntrack's byte counts on in the daemon's namespace (new
/// connections only); whether they were on before.
pub fn enable_accounting() -> io::Result<bool> {
    const KEY: &str = "/proc/sys/net/netfilter/nf_conntrack_acct";
    let was = std::fs::read_to_string(KEY)?.trim() == "1";
    if !was {
        std::fs::write(KEY, "1")?;
    }
    Ok(was)
}

impl Events {
    /// Subscribes to the update and destroy events of connections the
    /// name check allowed.
    pub fn open() -> io::Result<Events> {
        let fd = nfnetlink::socket(4 << 20)?;
        attach_filter(&fd)?;
        let ask = nfnetlink::socket(64 << 10)?;
        // SAFETY: a zeroed sockaddr_nl, then its family and groups.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = 1 << (NFNLGRP_CONNTRACK_UPDATE - 1) | 1 << (NFNLGRP_CONNTRACK_DESTROY - 1);
        // SAFETY: bind(2) with our address.
        let bound = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if bound < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Events { fd, ask })
    }

    /// Reads one event's message into `buf`: its length, 0 when none
    /// waits.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        nfnetlink::recv(&self.fd, buf)
    }
}

impl Events {
    /// The bytes conntrack counted so far of `tuple`'s connection, each
    /// way (None: it has none, or no longer knows the connection).
    pub fn counted(&self, tuple: &Tuple) -> io::Result<Option<(u64, u64)>> {
        let request = get(tuple);
        // SAFETY: send(2) of our buffer to the kernel.
        let sent = unsafe {
            libc::send(
                self.ask.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut reply = [0u8; 4096];
        let mut poll = libc::pollfd {
            fd: self.ask.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) of one pollfd of ours; the kernel answers at
        // once, so this waits no longer than that.
        if unsafe { libc::poll(&mut poll, 1, 100) } <= 0 {
            return Ok(None);
        }
        let n = nfnetlink::recv(&self.ask, &mut reply)?;
        let message = &reply[..n];
        if message.len() < NLMSG_HDRLEN + NFGENMSG_LEN
            || u16::from_ne_bytes([message[4], message[5]])
                != (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW
        {
            // NLMSG_ERROR: not (or no longer) there.
            return Ok(None);
        }
        Ok(counters(&message[NLMSG_HDRLEN + NFGENMSG_LEN..]))
    }
}

/// A request for the conntrack entry of `tuple` (IPCTNL_MSG_CT_GET).
fn get(tuple: &Tuple) -> Vec<u8> {
    let attr = |kind: u16, value: &[u8]| -> Vec<u8> {
        let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        out.extend(kind.to_ne_bytes());
        out.extend(value);
        out.resize(nfnetlink::align(out.len()), 0);
        out
    };
    const NESTED: u16 = 0x8000;
    let (family, ip) = match (tuple.source, tuple.destination) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (
            libc::AF_INET,
            [
                attr(CTA_IP_V4_SRC, &s.octets()),
                attr(CTA_IP_V4_DST, &d.octets()),
            ]
            .concat(),
        ),
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(a) => a.octets(),
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            };
            (
                libc::AF_INET6,
                [attr(CTA_IP_V6_SRC, &v6(s)), attr(CTA_IP_V6_DST, &v6(d))].concat(),
            )
        }
    };
    let proto = [
        attr(CTA_PROTO_NUM, &[libc::IPPROTO_TCP as u8]),
        attr(CTA_PROTO_SRC_PORT, &tuple.source_port.to_be_bytes()),
        attr(CTA_PROTO_DST_PORT, &tuple.port.to_be_bytes()),
    ]
    .concat();
    let orig = attr(
        CTA_TUPLE_ORIG | NESTED,
        &[
            attr(CTA_TUPLE_IP | NESTED, &ip),
            attr(CTA_TUPLE_PROTO | NESTED, &proto),
        ]
        .concat(),
    );
    let mut out = ((NLMSG_HDRLEN + NFGENMSG_LEN + orig.len()) as u32)
        .to_ne_bytes()
        .to_vec();
    out.extend(((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET).to_ne_bytes());
    out.extend((libc::NLM_F_REQUEST as u16).to_ne_bytes());
    out.extend([0; 8]); // sequence, port
    out.extend([family as u8, 0, 0, 0]);
    out.extend(orig);
    out
}

/// The byte counts of an entry's attributes, each way.
fn counters(body: &[u8]) -> Option<(u64, u64)> {
    let bytes = |kind| find(find(body, kind)?, CTA_COUNTERS_BYTES).and_then(be64);
    bytes(CTA_COUNTERS_ORIG).zip(bytes(CTA_COUNTERS_REPLY))
}

impl AsFd for Events {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The kernel keeps only events whose conntrack mark says the name check
/// allowed the connection: find CTA_MARK among the attributes after the
/// headers, its gate bits equal to ALLOWED.
fn attach_filter(fd: &OwnedFd) -> io::Result<()> {
    const SKF_AD_NLATTR: u32 = 12;
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let program = [
        // A = where the attributes start; X = the attribute looked for.
        op(
            (libc::BPF_LD | libc::BPF_IMM) as u16,
            0,
            0,
            (NLMSG_HDRLEN + NFGENMSG_LEN) as u32,
        ),
        op(
            (libc::BPF_LDX | libc::BPF_IMM) as u16,
            0,
            0,
            CTA_MARK.into(),
        ),
        // A = its offset, 0 if there is none.
        op(
            (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            0,
            0,
            (libc::SKF_AD_OFF as u32).wrapping_add(SKF_AD_NLATTR),
        ),
        op(
            (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            5,
            0,
            0,
        ),
        op((libc::BPF_MISC | libc::BPF_TAX) as u16, 0, 0, 0),
        // A = the mark (network order, as the attribute holds it).
        op((libc::BPF_LD | libc::BPF_W | libc::BPF_IND) as u16, 0, 0, 4),
        op(
            (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16,
            0,
            0,
            MASK,
        ),
        op(
            (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            0,
            1,
            ALLOWED,
        ),
        op((libc::BPF_RET | libc::BPF_K) as u16, 0, 0, u32::MAX),
        op((libc::BPF_RET | libc::BPF_K) as u16, 0, 0, 0),
    ];
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: setsockopt with a program that outlives the call (the
    // kernel copies it).
    let attached = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if attached < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn tuple(b: &[u8]) -> Option<Tuple> {
    let ip = find(b, CTA_TUPLE_IP)?;
    let proto = find(b, CTA_TUPLE_PROTO)?;
    if find(proto, CTA_PROTO_NUM)?.first() != Some(&(libc::IPPROTO_TCP as u8)) {
        return None;
    }
    let v4 = |kind| -> Option<IpAddr> {
        let b: [u8; 4] = find(ip, kind)?.get(..4)?.try_into().ok()?;
        Some(IpAddr::V4(Ipv4Addr::from(b)))
    };
    let v6 = |kind| -> Option<IpAddr> {
        let b: [u8; 16] = find(ip, kind)?.get(..16)?.try_into().ok()?;
        Some(IpAddr::V6(Ipv6Addr::from(b)))
    };
    let (source, destination) = match (v4(CTA_IP_V4_SRC), v4(CTA_IP_V4_DST)) {
        (Some(s), Some(d)) => (s, d),
        _ => (v6(CTA_IP_V6_SRC)?, v6(CTA_IP_V6_DST)?),
    };
    Some(Tuple {
        source,
        destination,
        source_port: be16(find(proto, CTA_PROTO_SRC_PORT)?)?,
        port: be16(find(proto, CTA_PROTO_DST_PORT)?)?,
    })
}

/// What the event in `message` (one netlink message) tells, if anything.
pub fn told(message: &[u8]) -> Option<Told> {
    if message.len() < NLMSG_HDRLEN + NFGENMSG_LEN {
        return None;
    }
    let kind = u16::from_ne_bytes([message[4], message[5]]);
    let body = &message[NLMSG_HDRLEN + NFGENMSG_LEN..];
    let orig = tuple(find(body, CTA_TUPLE_ORIG)?)?;
    match kind {
        k if k == (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE => {
            Some(Told::Forgotten(orig, counters(body)))
        }
        k if k == (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW => {
            let tcp = find(find(body, CTA_PROTOINFO)?, CTA_PROTOINFO_TCP)?;
            let state = *find(tcp, CTA_PROTOINFO_TCP_STATE)?.first()?;
            matches!(state, TCP_TIME_WAIT | TCP_CLOSE).then_some(Told::Ended(orig))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        out.extend(kind.to_ne_bytes());
        out.extend(value);
        out.resize((out.len() + 3) & !3, 0);
        out
    }

    fn nested(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        attr(kind | 0x8000, &parts.concat())
    }

    fn message(msg: u16, body: &[Vec<u8>]) -> Vec<u8> {
        let body = body.concat();
        let mut out = ((NLMSG_HDRLEN + NFGENMSG_LEN + body.len()) as u32)
            .to_ne_bytes()
            .to_vec();
        out.extend(((NFNL_SUBSYS_CTNETLINK << 8) | msg).to_ne_bytes());
        out.extend([0; 10]);
        out.extend([libc::AF_INET as u8, 0, 0, 0]);
        out.extend(body);
        out
    }

    fn orig() -> Vec<u8> {
        nested(
            CTA_TUPLE_ORIG,
            &[
                nested(
                    CTA_TUPLE_IP,
                    &[
                        attr(CTA_IP_V4_SRC, &[10, 0, 0, 2]),
                        attr(CTA_IP_V4_DST, &[192, 0, 2, 1]),
                    ],
                ),
                nested(
                    CTA_TUPLE_PROTO,
                    &[
                        attr(CTA_PROTO_NUM, &[6]),
                        attr(CTA_PROTO_SRC_PORT, &40000u16.to_be_bytes()),
                        attr(CTA_PROTO_DST_PORT, &443u16.to_be_bytes()),
                    ],
                ),
            ],
        )
    }

    fn counters(kind: u16, bytes: u64) -> Vec<u8> {
        nested(
            kind,
            &[
                attr(1, &3u64.to_be_bytes()),
                attr(CTA_COUNTERS_BYTES, &bytes.to_be_bytes()),
            ],
        )
    }

    #[test]
    fn an_end_and_a_forgetting_are_read_with_their_connection_and_bytes() {
        let conn = Tuple {
            source: "10.0.0.2".parse().unwrap(),
            destination: "192.0.2.1".parse().unwrap(),
            source_port: 40000,
            port: 443,
        };
        let state = |s: u8| {
            nested(
                CTA_PROTOINFO,
                &[nested(
                    CTA_PROTOINFO_TCP,
                    &[attr(CTA_PROTOINFO_TCP_STATE, &[s])],
                )],
            )
        };
        let ended = message(IPCTNL_MSG_CT_NEW, &[orig(), state(TCP_TIME_WAIT)]);
        assert_eq!(told(&ended), Some(Told::Ended(conn)));
        let established = message(IPCTNL_MSG_CT_NEW, &[orig(), state(3)]);
        assert_eq!(told(&established), None);
        let gone = message(
            IPCTNL_MSG_CT_DELETE,
            &[
                orig(),
                counters(CTA_COUNTERS_ORIG, 517),
                counters(CTA_COUNTERS_REPLY, 4_000_000),
            ],
        );
        assert_eq!(
            told(&gone),
            Some(Told::Forgotten(conn, Some((517, 4_000_000))))
        );
        let uncounted = message(IPCTNL_MSG_CT_DELETE, &[orig()]);
        assert_eq!(told(&uncounted), Some(Told::Forgotten(conn, None)));
        assert_eq!(told(&ended[..20]), None, "cut short");
    }
}
