//! Everything that touches the kernel: links and addresses (netlink), TAP
//! devices (ioctl), the nftables table, sysctls. The daemon decides; this
//! module carries out. Kernel-visible names are defined here, in one place.

pub mod docker_user;
pub mod firewall;
pub mod guard;
pub mod legacy;
pub mod listeners;
pub mod netlink;
pub mod nft;
pub mod privileges;
pub mod ruleset;
pub mod sysctl;
pub mod tap;

use crate::types::MacAddr;

/// Bridges are `ln-<network>` (network names are at most 12 bytes).
pub const BRIDGE_PREFIX: &str = "ln-";
/// TAPs are `lnt` + a number the daemon counts up: no client can choose
/// or predict another's TAP from its own request.
pub const TAP_PREFIX: &str = "lnt";
/// The alias (IFLA_IFALIAS) marks links linnet made, so reconcile never
/// touches a look-alike: `linnet:network:<name>`, `linnet:interface:<id>`.
pub const ALIAS_NETWORK: &str = "linnet:network:";
pub const ALIAS_INTERFACE: &str = "linnet:interface:";
/// linnet's own nftables table (family inet); it never edits another.
pub const NFT_TABLE: &str = "linnet";
pub const TUN_DEVICE: &str = "/dev/net/tun";

pub fn bridge_name(network: &str) -> String {
    format!("{BRIDGE_PREFIX}{network}")
}

/// The bridge's own MAC, which is the gateway's: stable per network name
/// (guests' neighbour caches survive a restart) and set explicitly, so the
/// bridge never takes a port's.
pub fn bridge_mac(network: &str) -> MacAddr {
    MacAddr::derived(format!("linnet bridge {network}").as_bytes())
}

/// The host side's MAC of a TAP (not its VM's): set explicitly, so udev
/// leaves it alone, and never multicast.
pub fn tap_mac(tap: &str) -> MacAddr {
    MacAddr::derived(format!("linnet tap {tap}").as_bytes())
}

pub fn tap_name(number: u32) -> String {
    format!("{TAP_PREFIX}{number}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_fit_in_ifnamsiz() {
        assert_eq!(bridge_name("abcdefghijkl").len(), 15);
        assert_eq!(tap_name(u32::MAX).len(), 13);
    }
}
