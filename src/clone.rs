//! Clones: VMs restored from one snapshot, each waking up as the VM that
//! was snapshotted (its MAC, its address, its TAP's name). What a clone is
//! decided here, without a kernel: which guest it is, that the guest fits
//! its network, and the unique address the network reaches it at. The
//! namespace that makes it so is `host::clone_ns`; the daemon's part is
//! `daemon::requests::clone`.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::config::Own;
use crate::types::{InterfaceId, MacAddr};

/// The uplink's name inside every clone's namespace.
pub const UPLINK: &str = "uplink";
/// The TAP's name inside a clone's namespace when the snapshotted VM's is
/// not known.
pub const DEFAULT_TAP: &str = "tap0";

/// The guest as it was snapshotted.
#[derive(Debug, Clone, PartialEq)]
pub struct Guest {
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
    /// Its TAP's name, when known: the clone's TAP gets it, inside the
    /// clone's namespace.
    pub tap: Option<String>,
}

impl Guest {
    /// The name of the clone's TAP inside its namespace.
    pub fn tap_name(&self) -> &str {
        self.tap.as_deref().unwrap_or(DEFAULT_TAP)
    }
}

/// Why a guest cannot be cloned onto a network: it would not find its
/// gateway, or the name would not do for a TAP.
pub fn check_guest(name: &str, net: &Own, guest: &Guest) -> Result<(), String> {
    let subnet = net.subnet;
    if !subnet.contains(&guest.ip) || guest.ip == subnet.network() || guest.ip == subnet.broadcast()
    {
        return Err(format!(
            "the guest's address {} is not a host address of network \"{name}\"'s subnet {subnet}: a clone must be restored onto the network its VM was on",
            guest.ip
        ));
    }
    if guest.ip == net.gateway {
        return Err(format!(
            "the guest's address {} is network \"{name}\"'s gateway",
            guest.ip
        ));
    }
    if guest.mac.is_multicast() {
        return Err(format!(
            "the guest's MAC {} is a multicast MAC; a VM's is unicast",
            guest.mac
        ));
    }
    if let Some(tap) = &guest.tap {
        check_tap_name(tap)?;
    }
    Ok(())
}

/// A TAP name for inside a clone's namespace: 1 to 15 letters, digits,
/// '-' or '_' (it also names the TAP's sysctls), and not the uplink's,
/// loopback's, or a sysctl directory's (`all`, `default`).
pub fn check_tap_name(tap: &str) -> Result<(), String> {
    let fits = (1..=15).contains(&tap.len())
        && tap
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !fits || [UPLINK, "lo", "all", "default"].contains(&tap) {
        return Err(format!(
            "\"{tap}\" will not do as the clone's TAP name: use 1 to 15 letters, digits, '-' or '_', other than \"{UPLINK}\", \"lo\", \"all\" and \"default\""
        ));
    }
    Ok(())
}

/// The first host address of `subnet` that no clone holds.
pub fn free_address(subnet: Ipv4Net, taken: &BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    subnet.hosts().find(|ip| !taken.contains(ip))
}

/// The MAC of a clone namespace's uplink, which the bridge's guard holds
/// it to: stable per interface id.
pub fn uplink_mac(id: InterfaceId) -> MacAddr {
    derived_mac("uplink", id)
}

/// The MAC of the TAP's own side in a clone's namespace: what the guest's
/// ARP for its gateway (or any address) gets.
pub fn tap_mac(id: InterfaceId) -> MacAddr {
    derived_mac("tap", id)
}

fn derived_mac(what: &str, id: InterfaceId) -> MacAddr {
    let mut seed = format!("linnet clone {what} ").into_bytes();
    seed.extend_from_slice(id.as_bytes());
    MacAddr::derived(&seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn shared() -> Own {
        let cfg = Config::builtin();
        cfg.network("shared").unwrap().own().unwrap().clone()
    }

    fn guest(ip: &str) -> Guest {
        Guest {
            mac: "52:54:00:12:34:56".parse().unwrap(),
            ip: ip.parse().unwrap(),
            tap: None,
        }
    }

    #[test]
    fn a_guest_must_be_a_host_of_the_network_and_not_its_gateway() {
        let cfg = shared();
        assert_eq!(check_guest("shared", &cfg, &guest("192.168.105.7")), Ok(()));
        for bad in ["10.0.0.5", "192.168.105.0", "192.168.105.255"] {
            let m = check_guest("shared", &cfg, &guest(bad)).unwrap_err();
            assert!(m.contains("not a host address"), "{m}");
        }
        let m = check_guest("shared", &cfg, &guest("192.168.105.1")).unwrap_err();
        assert!(m.contains("gateway"), "{m}");
        let mut multicast = guest("192.168.105.7");
        multicast.mac = MacAddr([0x01, 0x00, 0x5e, 0, 0, 1]);
        assert!(check_guest("shared", &cfg, &multicast).is_err());
    }

    #[test]
    fn a_clones_tap_name_is_plain_and_not_the_uplinks() {
        for good in ["lnt3", "tap0", "fc-tap_1"] {
            assert_eq!(check_tap_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "all",
            "default",
            "uplink",
            "lo",
            "../all",
            "a b",
            "sixteen-letters!",
            "x".repeat(16).as_str(),
        ] {
            assert!(check_tap_name(bad).is_err(), "{bad:?}");
        }
        let mut named = guest("192.168.105.7");
        assert_eq!(named.tap_name(), DEFAULT_TAP);
        named.tap = Some("lnt9".into());
        assert_eq!(named.tap_name(), "lnt9");
    }

    #[test]
    fn clones_take_the_first_free_address_of_the_range() {
        let subnet: Ipv4Net = "198.18.105.0/30".parse().unwrap();
        let mut taken = BTreeSet::new();
        let first = free_address(subnet, &taken).unwrap();
        assert_eq!(first.to_string(), "198.18.105.1");
        taken.insert(first);
        assert_eq!(
            free_address(subnet, &taken).unwrap().to_string(),
            "198.18.105.2"
        );
        taken.insert("198.18.105.2".parse().unwrap());
        assert_eq!(free_address(subnet, &taken), None, "a /30 has two");
    }

    #[test]
    fn the_builtin_networks_get_clone_ranges_of_their_own() {
        let cfg = Config::builtin();
        let range = |n: &str| {
            let own = cfg.network(n).unwrap().own().unwrap();
            own.clone_subnet.unwrap().to_string()
        };
        assert_eq!(range("shared"), "198.18.105.0/24");
        assert_eq!(range("host"), "198.18.106.0/24");
        let id = InterfaceId::from_bytes([1; 16]);
        assert_eq!(uplink_mac(id), uplink_mac(id), "stable");
        assert_ne!(uplink_mac(id), tap_mac(id));
    }
}
