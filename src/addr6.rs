//! IPv6 addressing of a network: its ULA /64 derived from the network's
//! name, the gateway's addresses, and the SLAAC address (EUI-64) a guest
//! forms from its MAC.

use std::net::Ipv6Addr;
use std::sync::OnceLock;

use ipnet::Ipv6Net;

use crate::types::{MacAddr, stable_hash};

/// The gateway's link-local address on every bridge: guests' default route.
pub const GATEWAY_LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// A unique local /64 (RFC 4193: fd00::/8, a 40-bit global id, subnet 0)
/// whose global id is a hash of the network's name and this host's
/// machine id: the same after every restart, and different on another host
/// (RFC 4193 wants global ids that do not collide when sites are joined).
/// Set `ipv6_prefix` to choose another.
pub fn ula_prefix(network: &str) -> Ipv6Net {
    ula_prefix_for(network, host_id())
}

/// The ULA /64 of a network across hosts (`evpn:`), the same on every
/// host: its global id a hash of the network's name and VNI, which every
/// host's config gives alike, and not of any one host's machine id.
pub fn ula_prefix_across_hosts(network: &str, vni: u32) -> Ipv6Net {
    ula_prefix_for(network, &format!("across hosts, VNI {vni}"))
}

/// /etc/machine-id (systemd, dbus), read once; empty on a host without one.
fn host_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        ["/etc/machine-id", "/var/lib/dbus/machine-id"]
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .map(|id| id.trim().to_string())
            .unwrap_or_default()
    })
}

fn ula_prefix_for(network: &str, host: &str) -> Ipv6Net {
    let h = stable_hash(format!("linnet ula {host} {network}").as_bytes()).to_be_bytes();
    let mut octets = [0u8; 16];
    octets[0] = 0xfd;
    octets[1..6].copy_from_slice(&h[..5]);
    Ipv6Net::new(Ipv6Addr::from(octets), 64).expect("64 is a valid prefix length")
}

/// The gateway's address in the prefix: PREFIX::1.
pub fn gateway(prefix: Ipv6Net) -> Ipv6Addr {
    with_interface_id(prefix, 1)
}

/// The address a guest forms by SLAAC with a modified EUI-64 interface id
/// (RFC 4291 appendix A): the MAC split by ff:fe, universal/local bit flipped.
pub fn slaac_address(prefix: Ipv6Net, mac: MacAddr) -> Ipv6Addr {
    let m = mac.0;
    let iid = u64::from_be_bytes([m[0] ^ 0x02, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]);
    with_interface_id(prefix, iid)
}

/// The link-local address a guest forms from its MAC (fe80::/64, EUI-64).
pub fn link_local(mac: MacAddr) -> Ipv6Addr {
    let fe80 = Ipv6Net::new(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 64).expect("valid");
    slaac_address(fe80, mac)
}

fn with_interface_id(prefix: Ipv6Net, iid: u64) -> Ipv6Addr {
    let net = u128::from(prefix.network());
    Ipv6Addr::from(net | u128::from(iid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ula_prefix_is_stable_unique_local_per_name_and_per_host() {
        assert_eq!(ula_prefix("shared"), ula_prefix("shared"), "stable");
        let host = "0123456789abcdef0123456789abcdef";
        let p = ula_prefix_for("shared", host);
        assert_ne!(p, ula_prefix_for("host", host));
        assert_ne!(p, ula_prefix_for("shared", "another host"));
        assert_eq!(p.prefix_len(), 64);
        assert_eq!(p.network().octets()[0], 0xfd, "in fd00::/8");
        assert_eq!(&p.network().octets()[6..], &[0u8; 10], "subnet id 0");
        // Pinned: a prefix that changed between releases would renumber VMs.
        assert_eq!(p.to_string(), "fd38:9085:884::/64");
        assert_eq!(gateway(p), {
            let mut o = p.network().octets();
            o[15] = 1;
            Ipv6Addr::from(o)
        });
    }

    #[test]
    fn a_network_across_hosts_has_one_prefix_on_every_host() {
        let across = ula_prefix_across_hosts("fabric", 7700);
        assert_eq!(across, ula_prefix_across_hosts("fabric", 7700));
        assert_eq!(across.addr().octets()[0], 0xfd);
        assert_ne!(across, ula_prefix_across_hosts("fabric", 7800));
        assert_ne!(across, ula_prefix_across_hosts("lab", 7700));
        assert_ne!(across, ula_prefix_for("fabric", "a host's machine id"));
    }

    #[test]
    fn slaac_address_is_modified_eui64() {
        let prefix: Ipv6Net = "fd12:3456:789a::/64".parse().unwrap();
        let mac: MacAddr = "52:54:00:12:34:56".parse().unwrap();
        assert_eq!(
            slaac_address(prefix, mac),
            "fd12:3456:789a::5054:ff:fe12:3456"
                .parse::<Ipv6Addr>()
                .unwrap()
        );
        assert_eq!(
            link_local(mac),
            "fe80::5054:ff:fe12:3456".parse::<Ipv6Addr>().unwrap()
        );
        let local: MacAddr = "02:00:00:00:00:01".parse().unwrap();
        assert_eq!(
            slaac_address(prefix, local),
            "fd12:3456:789a::ff:fe00:1".parse::<Ipv6Addr>().unwrap()
        );
    }
}
