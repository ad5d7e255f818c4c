//! Which sockets listen on a port in the daemon's namespace (from
//! /proc/net/{tcp,tcp6,udp,udp6}), so a port forward never silently
//! shadows a service of the host.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::forward::Protocol;

/// TCP sockets in LISTEN, UDP sockets bound and unconnected (st 07, "CLOSE").
const TCP_LISTEN: &str = "0A";
const UDP_UNCONNECTED: &str = "07";

/// A socket that holds `port`, and who owns it when that can be found.
#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    pub addr: SocketAddr,
    pub owner: Option<String>,
}

/// Sockets of `protocol` on `port` that traffic to `host_addr` (None: any
/// address) would reach, with their owners.
pub fn on_port(protocol: Protocol, port: u16, host_addr: Option<IpAddr>) -> Vec<Listener> {
    Listening::read()
        .on_port(protocol, port, host_addr)
        .map(|(addr, inode)| Listener {
            addr,
            owner: owner_of(inode),
        })
        .collect()
}

/// Every listening socket of the namespace, read once: to look up many
/// ports without reading the tables again for each.
pub struct Listening {
    tcp: Vec<(SocketAddr, u64)>,
    udp: Vec<(SocketAddr, u64)>,
}

impl Listening {
    pub fn read() -> Listening {
        let table = |files: [&str; 2], state| -> Vec<(SocketAddr, u64)> {
            files
                .iter()
                .filter_map(|f| std::fs::read_to_string(f).ok())
                .flat_map(|text| parse_table(&text, state))
                .collect()
        };
        Listening {
            tcp: table(["/proc/net/tcp", "/proc/net/tcp6"], TCP_LISTEN),
            udp: table(["/proc/net/udp", "/proc/net/udp6"], UDP_UNCONNECTED),
        }
    }

    /// (address, inode) of the sockets on `port` that traffic to
    /// `host_addr` (None: any address) would reach.
    pub fn on_port(
        &self,
        protocol: Protocol,
        port: u16,
        host_addr: Option<IpAddr>,
    ) -> impl Iterator<Item = (SocketAddr, u64)> + '_ {
        let rows = match protocol {
            Protocol::Tcp => &self.tcp,
            Protocol::Udp => &self.udp,
        };
        rows.iter()
            .filter(move |(addr, _)| addr.port() == port)
            .filter(move |(addr, _)| match host_addr {
                None => true,
                Some(want) => addr.ip() == want || addr.ip().is_unspecified(),
            })
            .copied()
    }
}

/// (local address, inode) of each row in `state`.
fn parse_table(text: &str, state: &str) -> Vec<(SocketAddr, u64)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != state {
                return None;
            }
            Some((parse_addr(f[1])?, f[9].parse().ok()?))
        })
        .collect()
}

/// The kernel prints addresses as hex of the in-memory words: an IPv4
/// address is one host-endian u32, an IPv6 address four of them.
fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// "name (pid N)" of a process holding the socket, by its fds.
fn owner_of(inode: u64) -> Option<String> {
    let target = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let holds = fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == &*target));
        if holds {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            return Some(format!("{} (pid {pid})", name.trim()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_rows_are_read_as_the_kernel_writes_them() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F91 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 100 0 0 10 0
";
        let rows = parse_table(v4, TCP_LISTEN);
        assert_eq!(rows, vec![("127.0.0.1:8080".parse().unwrap(), 4242)]);
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 77 2 0000000000000000 0
";
        let rows = parse_table(v6, UDP_UNCONNECTED);
        assert_eq!(rows, vec![("[::1]:53".parse().unwrap(), 77)]);
        assert!(parse_table("header\n garbage\n", TCP_LISTEN).is_empty());
    }

    #[test]
    fn a_listening_socket_of_this_process_is_found_with_its_owner() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let found = on_port(Protocol::Tcp, port, None);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].addr, l.local_addr().unwrap());
        assert!(
            found[0]
                .owner
                .as_deref()
                .is_some_and(|o| o.contains(&format!("pid {}", std::process::id()))),
            "{found:?}"
        );
        assert!(on_port(Protocol::Udp, port, None).is_empty());
        assert!(on_port(Protocol::Tcp, port, Some("10.9.9.9".parse().unwrap())).is_empty());
    }
}
