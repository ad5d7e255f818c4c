//! The sysctls linnet needs in its namespace: IPv4 and IPv6 forwarding for
//! NAT and port forwards, and per-link settings of its own bridges. The
//! daemon remembers what it changed so that stopping puts the value back.

use std::io;

const IPV4_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
const IPV6_FORWARD: &str = "/proc/sys/net/ipv6/conf/all/forwarding";

/// A per-link setting: `net.<family>.conf.<link>.<key>` (family "ipv4" or
/// "ipv6"). Only ever called for linnet's own bridges.
pub fn set_link(family: &str, link: &str, key: &str, value: &str) -> io::Result<()> {
    let path = format!("/proc/sys/net/{family}/conf/{link}/{key}");
    std::fs::write(&path, value).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
}

/// Turns IPv6 forwarding on; returns whether it was off before.
pub fn enable_ipv6_forwarding() -> io::Result<bool> {
    let before = std::fs::read_to_string(IPV6_FORWARD)?;
    if before.trim() == "1" {
        return Ok(false);
    }
    std::fs::write(IPV6_FORWARD, "1")
        .map_err(|e| io::Error::new(e.kind(), format!("{IPV6_FORWARD}: {e}")))?;
    Ok(true)
}

pub fn disable_ipv6_forwarding() -> io::Result<()> {
    std::fs::write(IPV6_FORWARD, "0")
}

/// Turns IPv4 forwarding on; returns whether it was off before.
pub fn enable_ipv4_forwarding() -> io::Result<bool> {
    let before = std::fs::read_to_string(IPV4_FORWARD)?;
    if before.trim() == "1" {
        return Ok(false);
    }
    std::fs::write(IPV4_FORWARD, "1")
        .map_err(|e| io::Error::new(e.kind(), format!("{IPV4_FORWARD}: {e}")))?;
    Ok(true)
}

pub fn disable_ipv4_forwarding() -> io::Result<()> {
    std::fs::write(IPV4_FORWARD, "0")
}
