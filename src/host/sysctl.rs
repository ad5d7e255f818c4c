//! The sysctls linnet needs in its namespace: IPv4 forwarding for NAT.
//! It remembers what it changed so that stopping puts the value back.

use std::io;

const IPV4_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

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
