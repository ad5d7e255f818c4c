//! The sysctls linnet needs in its namespace: IPv4 and IPv6 forwarding for
//! NAT and port forwards, and per-link settings of its own bridges. The
//! daemon remembers what it changed so that stopping puts the value back.

use std::io;

use tracing::warn;

const IPV4_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
const IPV6_FORWARD: &str = "/proc/sys/net/ipv6/conf/all/forwarding";
const IPV6_ROUTES: &str = "/proc/net/ipv6_route";
/// RTF_ADDRCONF: a route learned from a router advertisement.
const RTF_ADDRCONF: u32 = 0x0004_0000;

/// A per-link setting: `net.<family>.conf.<link>.<key>` (family "ipv4" or
/// "ipv6"). Only ever called for linnet's own bridges, and for `accept_ra`
/// as `enable_ipv6_forwarding` explains.
pub fn set_link(family: &str, link: &str, key: &str, value: &str) -> io::Result<()> {
    write(&format!("/proc/sys/net/{family}/conf/{link}/{key}"), value)
}

/// Any sysctl of the thread's namespace: `key` as under /proc/sys
/// ("net/ipv4/ip_forward").
pub fn set(key: &str, value: &str) -> io::Result<()> {
    write(&format!("/proc/sys/{key}"), value)
}

fn write(path: &str, value: &str) -> io::Result<()> {
    std::fs::write(path, value).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
}

/// Sets a 0/1 switch to 1; returns whether it was 0 before.
fn switch_on(path: &str) -> io::Result<bool> {
    let before = std::fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    if before.trim() == "1" {
        return Ok(false);
    }
    write(path, "1")?;
    Ok(true)
}

/// Whether IPv4 (or IPv6) forwarding is on now.
pub fn forwarding_on(ipv6: bool) -> bool {
    let path = if ipv6 { IPV6_FORWARD } else { IPV4_FORWARD };
    std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1")
}

/// Whether br_netfilter is loaded: its sysctls are there.
pub fn bridge_netfilter() -> bool {
    std::path::Path::new("/proc/sys/net/bridge").exists()
}

/// Turns IPv4 forwarding on; returns whether it was off before.
pub fn enable_ipv4_forwarding() -> io::Result<bool> {
    switch_on(IPV4_FORWARD)
}

pub fn disable_ipv4_forwarding() -> io::Result<()> {
    write(IPV4_FORWARD, "0")
}

/// What turning IPv6 forwarding on changed, to be put back.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Ipv6Forwarding {
    pub was_off: bool,
    /// Links whose accept_ra went from 1 to 2.
    pub accept_ra_raised: Vec<String>,
}

impl Ipv6Forwarding {
    /// Adds what turning it on again changed.
    pub fn merge(&mut self, again: Ipv6Forwarding) {
        self.was_off |= again.was_off;
        for link in again.accept_ra_raised {
            if !self.accept_ra_raised.contains(&link) {
                self.accept_ra_raised.push(link);
            }
        }
    }
}

/// Turns IPv6 forwarding on. A forwarding host ignores router
/// advertisements on links with accept_ra = 1, so a host whose own default
/// route came from one would lose it when it expires. Those links (and only
/// those) get accept_ra = 2, "accept even when forwarding", first.
pub fn enable_ipv6_forwarding() -> io::Result<Ipv6Forwarding> {
    if std::fs::read_to_string(IPV6_FORWARD)?.trim() == "1" {
        return Ok(Ipv6Forwarding::default());
    }
    let mut raised = Vec::new();
    let routes = std::fs::read_to_string(IPV6_ROUTES).unwrap_or_default();
    for link in ra_default_route_links(&routes) {
        let path = format!("/proc/sys/net/ipv6/conf/{link}/accept_ra");
        if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == "1") {
            write(&path, "2")?;
            warn!(%link, "set net.ipv6.conf.{link}.accept_ra to 2 so the host keeps its default route from router advertisements while linnet forwards IPv6; it goes back to 1 when linnet stops forwarding");
            raised.push(link);
        }
    }
    write(IPV6_FORWARD, "1")?;
    Ok(Ipv6Forwarding {
        was_off: true,
        accept_ra_raised: raised,
    })
}

/// Undoes what `enable_ipv6_forwarding` did.
pub fn disable_ipv6_forwarding(changed: &Ipv6Forwarding) -> io::Result<()> {
    if changed.was_off {
        write(IPV6_FORWARD, "0")?;
    }
    for link in &changed.accept_ra_raised {
        // The link may be gone; nothing to put back then.
        let _ = set_link("ipv6", link, "accept_ra", "1");
    }
    Ok(())
}

/// Links with a default route learned from a router advertisement, from
/// /proc/net/ipv6_route (destination, length, …, flags, device).
fn ra_default_route_links(table: &str) -> Vec<String> {
    let mut links: Vec<String> = table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let default = f.len() == 10 && f[1] == "00" && f[0].bytes().all(|b| b == b'0');
            let flags = u32::from_str_radix(f.get(8)?, 16).ok()?;
            (default && flags & RTF_ADDRCONF != 0).then(|| f[9].to_string())
        })
        .collect();
    links.sort();
    links.dedup();
    links
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_routes_from_router_advertisements_are_found() {
        let table = "\
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe80000000000000021122fffe334455 00000400 00000001 00000000 00450003  wlan0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 20010db8000000000000000000000001 00000400 00000001 00000000 00000003  eth0
20010db8000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00040001  wlan0
";
        assert_eq!(ra_default_route_links(table), vec!["wlan0".to_string()]);
        assert!(ra_default_route_links("garbage\n").is_empty());
    }
}
