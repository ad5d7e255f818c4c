//! IPv6 router advertisements on a network's bridge (RFC 4861 section 4.2),
//! with the prefix for SLAAC, the link MTU, and the gateway as DNS server
//! and the network's domain as search list (RDNSS/DNSSL, RFC 8106).
//!
//! Sent from fe80::1 to all nodes at start and every 20-60 s, and in answer
//! to each router solicitation: at once to its sender, or to all nodes when
//! it comes from `::` (at most one multicast per 3 s, RFC 4861 6.2.6).
//!
//! The encoding is written here: no maintained crate has typed RDNSS and
//! DNSSL options (smoltcp's NDISC stops at the RFC 4861 options), the
//! message is fixed-layout, and the kernel fills in the ICMPv6 checksum.

use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::rr::Name;
use hickory_proto::serialize::binary::BinEncodable;
use ipnet::Ipv6Net;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{NetworkContext, ServiceError};
use crate::addr6::GATEWAY_LINK_LOCAL;

const ROUTER_SOLICITATION: u8 = 133;
const ROUTER_ADVERTISEMENT: u8 = 134;
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);

/// Unsolicited advertisements: a random interval in this range (RFC 4861
/// MinRtrAdvInterval = 0.33 * MaxRtrAdvInterval). Guests ask (RS) when
/// they come up and are answered at once, so these only refresh lifetimes.
pub const MIN_INTERVAL: Duration = Duration::from_secs(20);
pub const MAX_INTERVAL: Duration = Duration::from_secs(60);
/// Router lifetime: 30 min, well over MaxRtrAdvInterval (RFC 4861 6.2.1).
const ROUTER_LIFETIME: u16 = 1800;
/// RDNSS/DNSSL lifetime: 3 x MaxRtrAdvInterval (RFC 8106 5.1).
const DNS_LIFETIME: u32 = 3 * 60;
const PREFIX_VALID: u32 = 86_400;
const PREFIX_PREFERRED: u32 = 14_400;
/// Advertisements to all nodes: at most one per MIN_DELAY_BETWEEN_RAS
/// (RFC 4861 10).
const MIN_MULTICAST_GAP: Duration = Duration::from_secs(3);

/// What one network advertises.
#[derive(Debug, Clone, PartialEq)]
pub struct Advert {
    /// 0: "not a default router" (host networks, or no NAT66): guests still
    /// form addresses and reach the gateway on-link.
    pub router_lifetime: u16,
    pub mtu: u32,
    pub prefix: Ipv6Net,
    /// Seconds guests prefer their addresses in the prefix for new connections.
    pub prefix_preferred: u32,
    /// The DNS server and the search domain, when the network has DNS.
    pub dns: Option<(Ipv6Addr, String)>,
}

impl Advert {
    pub fn for_network(ctx: &NetworkContext) -> Option<Advert> {
        let cfg = ctx.own();
        let v6 = cfg.ipv6.as_ref()?;
        let default_router = !cfg.host_only && v6.nat66;
        Some(Advert {
            router_lifetime: if default_router { ROUTER_LIFETIME } else { 0 },
            mtu: cfg.mtu,
            prefix: v6.prefix,
            prefix_preferred: PREFIX_PREFERRED,
            dns: cfg
                .dns
                .enabled
                .then(|| (v6.gateway, cfg.dns.domain.clone())),
        })
    }

    /// What is sent when the network goes down: not a router any more, the
    /// prefix deprecated (addresses stay until their valid lifetime, which
    /// hosts never shorten below 2 h, RFC 4862 5.5.3).
    pub fn farewell(&self) -> Advert {
        Advert {
            router_lifetime: 0,
            prefix_preferred: 0,
            ..self.clone()
        }
    }

    /// The ICMPv6 message, checksum left zero for the kernel.
    pub fn encode(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(128);
        m.extend_from_slice(&[ROUTER_ADVERTISEMENT, 0, 0, 0]);
        m.push(64); // cur hop limit
        m.push(0); // no M, no O: no DHCPv6
        m.extend_from_slice(&self.router_lifetime.to_be_bytes());
        m.extend_from_slice(&0u32.to_be_bytes()); // reachable time: unspecified
        m.extend_from_slice(&0u32.to_be_bytes()); // retrans timer: unspecified

        // Prefix information (type 3): on-link, autonomous.
        option(&mut m, 3, |o| {
            o.push(self.prefix.prefix_len());
            o.push(0b1100_0000);
            o.extend_from_slice(&PREFIX_VALID.to_be_bytes());
            o.extend_from_slice(&self.prefix_preferred.to_be_bytes());
            o.extend_from_slice(&[0; 4]);
            o.extend_from_slice(&self.prefix.network().octets());
        });
        // MTU (type 5).
        option(&mut m, 5, |o| {
            o.extend_from_slice(&[0; 2]);
            o.extend_from_slice(&self.mtu.to_be_bytes());
        });
        if let Some((server, domain)) = &self.dns {
            // RDNSS (type 25).
            option(&mut m, 25, |o| {
                o.extend_from_slice(&[0; 2]);
                o.extend_from_slice(&DNS_LIFETIME.to_be_bytes());
                o.extend_from_slice(&server.octets());
            });
            // DNSSL (type 31): the domain as uncompressed DNS labels.
            if let Some(labels) = Name::from_ascii(format!("{domain}."))
                .ok()
                .and_then(|n| n.to_bytes().ok())
            {
                option(&mut m, 31, |o| {
                    o.extend_from_slice(&[0; 2]);
                    o.extend_from_slice(&DNS_LIFETIME.to_be_bytes());
                    o.extend_from_slice(&labels);
                });
            }
        }
        m
    }
}

/// Appends one option: type, length in units of 8 bytes, the body padded
/// with zeros to that length.
fn option(m: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Vec<u8>)) {
    let start = m.len();
    m.extend_from_slice(&[kind, 0]);
    body(m);
    let padded = (m.len() - start).div_ceil(8) * 8;
    m.resize(start + padded, 0);
    m[start + 1] = (padded / 8) as u8;
}

/// The last word of a network's advertiser: when dropped (the network
/// goes down), it tells the guests that the gateway is no longer their
/// router and its prefix no longer preferred (RFC 4861 6.2.5), so they
/// stop sending there at once instead of when the lifetimes run out.
pub struct Farewell {
    socket: Socket,
    message: Vec<u8>,
    to: SockAddr,
}

impl Drop for Farewell {
    fn drop(&mut self) {
        let _ = self.socket.send_to(&self.message, &self.to);
    }
}

pub fn start(ctx: Arc<NetworkContext>) -> Result<Option<(JoinHandle<()>, Farewell)>, ServiceError> {
    let Some(advert) = Advert::for_network(&ctx) else {
        return Ok(None);
    };
    let bind_err = |source| ServiceError::Bind {
        network: ctx.name().into(),
        service: "router advertisements",
        addr: format!("[{GATEWAY_LINK_LOCAL}%{}]", ctx.bridge),
        source,
    };
    let socket = open(&ctx).map_err(bind_err)?;
    let farewell = Farewell {
        socket: socket.try_clone().map_err(bind_err)?,
        message: advert.farewell().encode(),
        to: all_nodes(ctx.bridge_index),
    };
    let socket = watch(socket).map_err(bind_err)?;
    let network = ctx.name().to_string();
    let task = super::spawn_service(
        "router advertisement",
        &network,
        serve(ctx, socket, advert.encode()),
    );
    Ok(Some((task, farewell)))
}

fn all_nodes(bridge_index: u32) -> SockAddr {
    SockAddr::from(SocketAddrV6::new(ALL_NODES, 0, 0, bridge_index))
}

/// A raw ICMPv6 socket on the bridge that hears only router solicitations
/// and sends from fe80::1 with hop limit 255 (RFC 4861 requires it: a
/// receiver drops any advertisement that crossed a router).
fn open(ctx: &NetworkContext) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    only_solicitations(&socket)?;
    socket.bind_device(Some(ctx.bridge.as_bytes()))?;
    socket.set_multicast_if_v6(ctx.bridge_index)?;
    socket.set_multicast_hops_v6(255)?;
    socket.set_unicast_hops_v6(255)?;
    socket.set_multicast_loop_v6(false)?;
    socket.join_multicast_v6(&ALL_ROUTERS, ctx.bridge_index)?;
    let source = SocketAddrV6::new(GATEWAY_LINK_LOCAL, 0, 0, ctx.bridge_index);
    socket.bind(&source.into())?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn watch(socket: Socket) -> std::io::Result<AsyncFd<Socket>> {
    // SAFETY: the AsyncFd owns the socket, so the fd stays open while it
    // is registered.
    unsafe { AsyncFd::register(socket) }.map_err(|e| e.into_parts().1)
}

/// ICMP6_FILTER (RFC 3542): a bitmap of types to block; all but RS.
fn only_solicitations(socket: &Socket) -> std::io::Result<()> {
    const ICMP6_FILTER: libc::c_int = 1;
    let mut filter = [u32::MAX; 8];
    let t = ROUTER_SOLICITATION as usize;
    filter[t >> 5] &= !(1 << (t & 31));
    // SAFETY: the option value is the 32-byte bitmap, valid for the call.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_ICMPV6,
            ICMP6_FILTER,
            filter.as_ptr().cast(),
            std::mem::size_of_val(&filter) as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

async fn serve(ctx: Arc<NetworkContext>, socket: AsyncFd<Socket>, advert: Vec<u8>) {
    let network = &ctx.name();
    let all_nodes = all_nodes(ctx.bridge_index);
    let mut last_multicast: Option<Instant> = None;
    let mut next_multicast = Instant::now();
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1500];
    loop {
        let solicited_by = tokio::select! {
            _ = tokio::time::sleep_until(next_multicast) => None,
            ready = socket.readable() => {
                let mut guard = match ready {
                    Ok(guard) => guard,
                    Err(e) => {
                        warn!(%network, "router advertisements stop: {e}");
                        return;
                    }
                };
                match guard.try_io(|s| s.get_ref().recv_from(&mut buf)) {
                    Ok(Ok((len, from))) => {
                        // SAFETY: recv_from initialised the first `len` bytes.
                        let msg: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), len) };
                        if msg.len() < 8 || msg[0] != ROUTER_SOLICITATION || msg[1] != 0 {
                            continue;
                        }
                        Some(from.as_socket_ipv6().map(|a| *a.ip()).unwrap_or(Ipv6Addr::UNSPECIFIED))
                    }
                    Ok(Err(e)) => {
                        warn!(%network, "router solicitation receive failed: {e}");
                        continue;
                    }
                    Err(_would_block) => continue,
                }
            }
        };
        let dest = match solicited_by {
            // A solicitation from an address: answered to it, at once.
            Some(from) if !from.is_unspecified() => {
                SockAddr::from(SocketAddrV6::new(from, 0, 0, ctx.bridge_index))
            }
            // From `::` (no address yet): the answer goes to all nodes,
            // which RFC 4861 6.2.6 allows once per MIN_MULTICAST_GAP; a
            // later one is sent when the gap is over.
            Some(_) => {
                let earliest = last_multicast.map_or(Instant::now(), |t| t + MIN_MULTICAST_GAP);
                next_multicast = next_multicast.min(earliest);
                continue;
            }
            None => {
                if let Some(t) = last_multicast
                    && t.elapsed() < MIN_MULTICAST_GAP
                {
                    next_multicast = t + MIN_MULTICAST_GAP;
                    continue;
                }
                last_multicast = Some(Instant::now());
                next_multicast = Instant::now() + periodic_interval();
                all_nodes.clone()
            }
        };
        match socket.get_ref().send_to(&advert, &dest) {
            Ok(_) => debug!(%network, to = ?dest.as_socket(), "router advertisement sent"),
            Err(e) => debug!(%network, "router advertisement not sent: {e}"),
        }
    }
}

/// Uniform in [MIN_INTERVAL, MAX_INTERVAL], so routers on one link do not
/// fall into step (RFC 4861 6.2.4). The randomness of std's hasher seed is
/// plenty for jitter.
fn periodic_interval() -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let spread = (MAX_INTERVAL - MIN_INTERVAL).as_millis() as u64;
    let r = RandomState::new().hash_one(Instant::now()) % (spread + 1);
    MIN_INTERVAL + Duration::from_millis(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert(dns: bool) -> Advert {
        Advert {
            router_lifetime: ROUTER_LIFETIME,
            mtu: 1500,
            prefix: "fd00:1:2::/64".parse().unwrap(),
            prefix_preferred: PREFIX_PREFERRED,
            dns: dns.then(|| ("fd00:1:2::1".parse().unwrap(), "shared.linnet".into())),
        }
    }

    /// The options as (type, body) pairs, checking each length field.
    fn options(msg: &[u8]) -> Vec<(u8, &[u8])> {
        let mut out = Vec::new();
        let mut rest = &msg[16..];
        while !rest.is_empty() {
            let len = rest[1] as usize * 8;
            assert!(len >= 8 && len <= rest.len(), "bad option length");
            out.push((rest[0], &rest[2..len]));
            rest = &rest[len..];
        }
        out
    }

    #[test]
    fn header_says_router_for_thirty_minutes_without_dhcpv6() {
        let m = advert(true).encode();
        assert_eq!(
            &m[..4],
            &[134, 0, 0, 0],
            "type, code, checksum for the kernel"
        );
        assert_eq!(m[4], 64);
        assert_eq!(m[5], 0, "no managed or other-config flag");
        assert_eq!(u16::from_be_bytes([m[6], m[7]]), 1800);
        assert_eq!(&m[8..16], &[0; 8]);
        assert_eq!(m.len() % 8, 0);
    }

    #[test]
    fn prefix_mtu_rdnss_and_dnssl_options() {
        let m = advert(true).encode();
        let opts = options(&m);
        assert_eq!(
            opts.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            [3, 5, 25, 31]
        );
        let pio = opts[0].1;
        assert_eq!(pio.len(), 30, "prefix information is 32 bytes");
        assert_eq!(pio[0], 64);
        assert_eq!(pio[1], 0xc0, "on-link and autonomous");
        assert_eq!(&pio[2..6], &86_400u32.to_be_bytes());
        assert_eq!(&pio[6..10], &14_400u32.to_be_bytes());
        assert_eq!(
            &pio[14..30],
            &"fd00:1:2::".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(&opts[1].1[2..6], &1500u32.to_be_bytes());
        let rdnss = opts[2].1;
        assert_eq!(rdnss.len(), 22, "RDNSS with one address is 24 bytes");
        assert_eq!(&rdnss[2..6], &180u32.to_be_bytes());
        assert_eq!(
            &rdnss[6..22],
            &"fd00:1:2::1".parse::<Ipv6Addr>().unwrap().octets()
        );
        let dnssl = opts[3].1;
        assert_eq!(&dnssl[2..6], &180u32.to_be_bytes());
        assert_eq!(&dnssl[6..21], b"\x06shared\x06linnet\x00");
        assert!(dnssl[21..].iter().all(|b| *b == 0), "zero padding");
    }

    #[test]
    fn no_dns_options_without_dns_and_no_default_route_when_told() {
        let mut a = advert(false);
        a.router_lifetime = 0;
        let m = a.encode();
        assert_eq!(&m[6..8], &[0, 0]);
        let kinds: Vec<u8> = options(&m).iter().map(|(t, _)| *t).collect();
        assert_eq!(kinds, [3, 5]);
    }

    #[test]
    fn farewell_ends_the_default_route_and_deprecates_the_prefix() {
        let m = advert(true).farewell().encode();
        assert_eq!(&m[6..8], &[0, 0], "router lifetime 0");
        let pio = options(&m)[0].1;
        assert_eq!(&pio[2..6], &86_400u32.to_be_bytes(), "still valid");
        assert_eq!(&pio[6..10], &[0; 4], "no longer preferred");
    }

    #[test]
    fn periodic_interval_stays_in_range() {
        for _ in 0..100 {
            let i = periodic_interval();
            assert!((MIN_INTERVAL..=MAX_INTERVAL).contains(&i), "{i:?}");
        }
    }
}
