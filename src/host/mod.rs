//! Everything that touches the kernel: links and addresses (netlink), TAP
//! devices (ioctl), the nftables table, sysctls. The daemon decides; this
//! module carries out. Kernel-visible names are defined here, in one place.

pub mod accounts;
pub mod clone_ns;
pub mod conntrack_events;
pub mod docker_user;
pub mod egress;
#[cfg(test)]
pub mod fake;
pub mod firewall;
pub mod frr_vty;
pub mod gate_queue;
pub mod guard;
pub mod kernel;
pub mod legacy;
mod link_deletes;
pub mod listeners;
pub mod macvtap;
pub mod memory;
pub mod netlink;
pub mod netns;
pub mod nfnetlink;
pub mod nfqueue;
pub mod nft;
pub mod packet;
pub mod peer;
pub mod privileges;
pub mod process;
pub mod ruleset;
pub mod seam;
pub mod sysctl;
pub mod systemd;
pub mod tap;
pub mod userns;

use crate::types::MacAddr;

/// Bridges are `ln-<network>` (network names are at most 12 bytes).
pub const BRIDGE_PREFIX: &str = "ln-";
/// TAPs are `lnt` + a number the daemon counts up: no client can choose
/// or predict another's TAP from its own request.
pub const TAP_PREFIX: &str = "lnt";
/// Macvtaps (`mode: bridged`) are `lnv` + a number from the same counter.
pub const MACVTAP_PREFIX: &str = "lnv";
/// A clone's port on its network's bridge: `lnc` + a number from the same
/// counter (the other end is in the clone's namespace, `clone_ns`).
pub const CLONE_PORT_PREFIX: &str = "lnc";
/// A network across hosts' VXLAN device, a port of its bridge:
/// `lx-<network>`.
pub const VXLAN_PREFIX: &str = "lx-";
/// A bridged network's macvlan for the host (`host_access: true`).
pub const HOST_ACCESS_PREFIX: &str = "lh-";
/// The alias (IFLA_IFALIAS) marks links linnet made, so reconcile never
/// touches a look-alike: `linnet:network:<name>`, `linnet:interface:<id>`.
pub const ALIAS_NETWORK: &str = "linnet:network:";
pub const ALIAS_INTERFACE: &str = "linnet:interface:";
/// The alias of a spare TAP (`daemon::spares`), with its network's name.
pub const ALIAS_SPARE: &str = "linnet:spare:";
/// The uid and gid a root daemon's secrets proxies run as
/// (`daemon::secret_proxies`), just below the gate's: linnet's table lets
/// processes of this uid open TCP connections to port 443 of other
/// machines and nothing else (`firewall::secrets_out`).
pub const SECRETS_UID: u32 = 0x7f6b_fffe;
/// linnet's own nftables table (family inet); it never edits another.
pub const NFT_TABLE: &str = "linnet";
/// The table (family bridge) that keeps a network across hosts' gateway,
/// DHCP and router discovery off its VXLAN port (`firewall::fabric`).
pub const FABRIC_TABLE: &str = "linnet_fabric";
pub const TUN_DEVICE: &str = "/dev/net/tun";

pub fn bridge_name(network: &str) -> String {
    format!("{BRIDGE_PREFIX}{network}")
}

pub fn vxlan_name(network: &str) -> String {
    format!("{VXLAN_PREFIX}{network}")
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

pub fn macvtap_name(number: u32) -> String {
    format!("{MACVTAP_PREFIX}{number}")
}

pub fn clone_port_name(number: u32) -> String {
    format!("{CLONE_PORT_PREFIX}{number}")
}

pub fn host_access_name(network: &str) -> String {
    format!("{HOST_ACCESS_PREFIX}{network}")
}

/// The MAC of a bridged network's macvlan for the host: stable per network.
pub fn host_access_mac(network: &str) -> MacAddr {
    MacAddr::derived(format!("linnet host access {network}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_fit_in_ifnamsiz() {
        assert_eq!(bridge_name("abcdefghijkl").len(), 15);
        assert_eq!(tap_name(u32::MAX).len(), 13);
        assert_eq!(macvtap_name(u32::MAX).len(), 13);
        assert_eq!(host_access_name("abcdefghijkl").len(), 15);
    }
}
