//! A clone's small namespace. Many clones of one snapshot share the
//! guest's MAC and address; each one's TAP is in a network namespace of
//! its own, which stands between that TAP and the network:
//!
//! ```text
//!  guest (MAC M, address G) ── TAP ┃ clone namespace ┃ uplink ── veth port ── linnet bridge
//!                                  ┃  G ⇄ U (NAT)    ┃ (address U, the clone's own)
//! ```
//!
//! - The TAP answers the guest's ARP for any address (the gateway, other
//!   VMs) with its own MAC (proxy ARP), and knows the guest as G → M.
//! - What the guest sends from G leaves the uplink from U; what comes to U
//!   goes to G (conntrack NAT, both ways, ICMP errors included). Nothing
//!   leaves the uplink from any other address, and the TAP accepts only G
//!   (strict reverse-path filter): a clone cannot pass as anyone else.
//! - The uplink's other end is a port on the network's bridge with U's
//!   route on the host, so the host, the other VMs, published ports and
//!   DNS reach each clone at its own U.
//!
//! `plan`-like data (`CloneNetwork`) says what the namespace is; `rules`
//! is its nftables table as text, unit-tested; `make` builds it.

use std::fmt::Write as _;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

use ipnet::Ipv4Net;

use super::netlink::{LinkSettings, Links, Netlink, NetlinkError};
use super::netns::NetNs;
use super::nft::{Nft, NftError};
use super::sysctl;
use super::tap::{self, TapError};
use crate::clone::UPLINK;
use crate::types::MacAddr;

/// What a clone's namespace is.
#[derive(Debug, Clone, PartialEq)]
pub struct CloneNetwork {
    /// The guest as it was snapshotted.
    pub guest_mac: MacAddr,
    pub guest_ip: Ipv4Addr,
    /// The clone's own address, which the network sees.
    pub unique: Ipv4Addr,
    /// Where the network's clones are (the other clones of the guest among
    /// them: the guest's own address would not do toward those).
    pub clone_subnet: Ipv4Net,
    /// The network's gateway (the guest's, and the namespace's way out).
    pub gateway: Ipv4Addr,
    pub mtu: u32,
    /// The TAP's name in the namespace (the snapshotted VM's, so a VMM
    /// restored inside finds it under the name it knew).
    pub tap: String,
    /// The MAC of the TAP's own side, which the guest's ARP gets.
    pub tap_mac: MacAddr,
    /// The clone holds the guest's address on the network too (the VM
    /// that was snapshotted has stopped; `LeaseTable::take_over`):
    /// what it sends goes out as G, so the connections the VM had carry
    /// on, and the namespace answers ARP for G on the network.
    pub holds_guest_address: bool,
    /// The uplink's MAC, which the bridge's guard holds it to.
    pub uplink_mac: MacAddr,
}

/// A clone's namespace as made: the namespace, its TAP's fd (for the VMM)
/// and the veth port on the host's side (index, name).
pub struct MadeClone {
    pub ns: NetNs,
    pub tap: OwnedFd,
    pub port: u32,
    pub port_name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CloneNsError {
    #[error("cannot make a clone's network namespace: {0}")]
    Namespace(io::Error),
    #[error("clone namespace: {0}")]
    Sysctl(io::Error),
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("clone namespace: {0}")]
    Firewall(#[from] NftError),
}

/// The namespace's table: NAT between G and U, and nothing out of the
/// uplink but from U. Addresses are typed values; names are linnet's.
pub fn rules(net: &CloneNetwork) -> String {
    let (g, u, gw, tap) = (net.guest_ip, net.unique, net.gateway, &net.tap);
    // Holding G: nothing is NATed out but to other clones (which are G
    // too), so G or U (replies to what came to U) may leave.
    let (snat, from) = if net.holds_guest_address {
        (
            format!(
                "\n        oifname \"{UPLINK}\" ip saddr {g} ip daddr {} snat to {u}",
                net.clone_subnet
            ),
            format!("{{ {g}, {u} }}"),
        )
    } else {
        (
            format!("\n        oifname \"{UPLINK}\" ip saddr {g} snat to {u}"),
            u.to_string(),
        )
    };
    let mut text = String::new();
    let _ = write!(
        text,
        r#"table ip linnet-clone {{
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "{UPLINK}" ip daddr {u} dnat to {g}
        # A DHCP renewal, sent to the gateway, goes to the clone's own
        # server in the namespace (which answers as the gateway).
        iifname "{tap}" ip daddr {gw} udp dport 67 dnat to {u}
    }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;{snat}
    }}
    # What conntrack cannot place is not NATed: it would leave as the
    # guest's own address, which is every clone's.
    chain leaving {{
        type filter hook postrouting priority 110; policy accept;
        oifname "{UPLINK}" ip saddr != {from} drop
    }}
}}
"#
    );
    text
}

/// The sysctls of a new clone namespace, before its links exist: it
/// routes; IPv6 is off (its guests' addresses are not NATed); a new link
/// has no reverse-path filter (the uplink: replies to U come back to G).
const NAMESPACE_SYSCTLS: [(&str, &str); 5] = [
    ("net/ipv4/ip_forward", "1"),
    ("net/ipv6/conf/all/disable_ipv6", "1"),
    ("net/ipv6/conf/default/disable_ipv6", "1"),
    ("net/ipv4/conf/all/rp_filter", "0"),
    ("net/ipv4/conf/default/rp_filter", "0"),
];

/// The TAP's: proxy ARP (the guest's gateway and every other address is
/// the namespace's), and only G in (strict reverse-path filter).
fn tap_sysctls(tap: &str) -> [(String, &'static str); 3] {
    [
        (format!("net/ipv4/conf/{tap}/proxy_arp"), "1"),
        proxy_at_once(tap),
        (format!("net/ipv4/conf/{tap}/rp_filter"), "1"),
    ]
}

/// Proxy ARP on `link` answers at once, not after a random delay of up
/// to 0.8 s. (A new namespace has no `neigh/default` to set it for all.)
fn proxy_at_once(link: &str) -> (String, &'static str) {
    (format!("net/ipv4/neigh/{link}/proxy_delay"), "0")
}

fn write_sysctl(key: &str, value: &str) -> Result<(), CloneNsError> {
    sysctl::set(key, value).map_err(CloneNsError::Sysctl)
}

/// Makes the namespace of `net`, its TAP (owned by `uid`/`gid`) and its
/// veth port on the host's side (`lnc<N>`, the first free name from `next`
/// on; down and on no bridge yet). On error nothing is left: the port is
/// deleted, the namespace dropped.
pub async fn make(
    netlink: &Netlink,
    net: &CloneNetwork,
    next: &mut u32,
    (uid, gid): (u32, u32),
) -> Result<MadeClone, CloneNsError> {
    let ns = NetNs::create().map_err(CloneNsError::Namespace)?;
    let inside = ns
        .enter(|| -> Result<(OwnedFd, Netlink), CloneNsError> {
            for (key, value) in NAMESPACE_SYSCTLS {
                write_sysctl(key, value)?;
            }
            let fd = tap::create(&net.tap, uid, gid, 1)?.swap_remove(0);
            for (key, value) in tap_sysctls(&net.tap) {
                write_sysctl(&key, value)?;
            }
            // A context of its own, opened in here: a libnftables context
            // talks to the namespace it was made in. (One at a time, on
            // this thread, as the daemon's own.)
            Nft::open().run(&rules(net))?;
            let netlink = Netlink::connect().map_err(CloneNsError::Namespace)?;
            Ok((fd, netlink))
        })
        .map_err(CloneNsError::Namespace)??;
    let (tap_fd, inner) = inside;
    let mut tries = 0;
    let (port_name, index) = loop {
        let name = super::clone_port_name(*next);
        *next = next.wrapping_add(1);
        let made = netlink
            .create_veth(
                (&name, super::tap_mac(&name)),
                (UPLINK, net.uplink_mac),
                net.mtu,
                ns.fd().as_raw_fd(),
            )
            .await;
        match made {
            // A link of that name is someone else's: pass it over.
            Err(e) if e.source.raw_os_error() == Some(libc::EEXIST) && tries < 4096 => tries += 1,
            Err(e) => return Err(e.into()),
            Ok(index) => break (name, index),
        }
    };
    // The host's end needs no IPv6 of its own (no DAD or MLD into the
    // network), as a TAP port's.
    if let Err(e) = sysctl::set_link("ipv6", &port_name, "disable_ipv6", "1") {
        tracing::debug!(port = %port_name, "IPv6 stays on: {e}");
    }
    let inside = configure_inside(&inner, net).await;
    let inside = inside.and_then(|()| {
        if !net.holds_guest_address {
            return Ok(());
        }
        let (key, value) = proxy_at_once(UPLINK);
        ns.enter(|| write_sysctl(&key, value))
            .map_err(CloneNsError::Namespace)?
    });
    if let Err(e) = inside {
        let _ = netlink.delete_link(index).await;
        return Err(e);
    }
    Ok(MadeClone {
        ns,
        tap: tap_fd,
        port: index,
        port_name,
    })
}

/// Deletes the TAP `tap` in the clone's namespace `ns` (at detach: its VMM,
/// holding the TAP, sees it go, as with any interface's).
pub async fn delete_tap(ns: &NetNs, tap: &str) -> Result<(), CloneNsError> {
    let inner = ns
        .enter(Netlink::connect)
        .and_then(|connected| connected)
        .map_err(CloneNsError::Namespace)?;
    if let Some(link) = inner.link(tap).await? {
        inner.delete_link(link.index).await?;
    }
    Ok(())
}

/// A clone that holds its guest's address tells the network that the
/// address is at its uplink now (the VM before it had its own MAC there).
/// Called once the port is up.
pub fn announce(ns: &NetNs, net: &CloneNetwork) -> io::Result<()> {
    ns.enter(|| {
        let name = std::ffi::CString::new(UPLINK).expect("no NUL");
        // SAFETY: if_nametoindex reads a NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(io::Error::last_os_error());
        }
        super::packet::announce(index, net.uplink_mac.0, net.guest_ip)
    })?
}

/// Addresses, routes and the guest's neighbour entry, through a netlink
/// socket of the namespace's.
async fn configure_inside(inner: &Netlink, net: &CloneNetwork) -> Result<(), CloneNsError> {
    let index_of = async |name: &str| {
        inner.link(name).await?.map(|l| l.index).ok_or_else(|| {
            CloneNsError::Netlink(NetlinkError {
                what: format!("find {name} in a clone's namespace"),
                source: io::Error::from_raw_os_error(libc::ENODEV),
            })
        })
    };
    let tap = index_of(&net.tap).await?;
    let uplink = index_of(UPLINK).await?;
    inner.set_address(tap, net.tap_mac).await?;
    let up = |mtu| LinkSettings {
        mtu: Some(mtu),
        up: true,
        ..Default::default()
    };
    inner.configure(tap, up(net.mtu)).await?;
    inner.configure(uplink, up(net.mtu)).await?;
    inner
        .add_address(uplink, Ipv4Net::from(net.unique).into())
        .await?;
    inner
        .add_link_route(Ipv4Net::from(net.guest_ip), tap)
        .await?;
    inner.add_default_route_onlink(net.gateway, uplink).await?;
    inner
        .set_neighbour(tap, net.guest_ip, net.guest_mac)
        .await?;
    if net.holds_guest_address {
        inner.add_proxy_neighbour(uplink, net.guest_ip).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network() -> CloneNetwork {
        CloneNetwork {
            guest_mac: "52:54:00:12:34:56".parse().unwrap(),
            guest_ip: "192.168.105.5".parse().unwrap(),
            unique: "198.18.105.3".parse().unwrap(),
            clone_subnet: "198.18.105.0/24".parse().unwrap(),
            gateway: "192.168.105.1".parse().unwrap(),
            mtu: 1500,
            tap: "lnt4".into(),
            tap_mac: "02:00:00:00:00:01".parse().unwrap(),
            uplink_mac: "02:00:00:00:00:02".parse().unwrap(),
            holds_guest_address: false,
        }
    }

    #[test]
    fn the_namespace_nats_the_guest_to_its_unique_address_and_lets_nothing_else_out() {
        let text = rules(&network());
        for line in [
            r#"iifname "uplink" ip daddr 198.18.105.3 dnat to 192.168.105.5"#,
            r#"oifname "uplink" ip saddr 192.168.105.5 snat to 198.18.105.3"#,
            r#"oifname "uplink" ip saddr != 198.18.105.3 drop"#,
            r#"iifname "lnt4" ip daddr 192.168.105.1 udp dport 67 dnat to 198.18.105.3"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        // The drop comes after the source NAT (priority 100).
        assert!(text.contains("hook postrouting priority 110"));
    }

    #[test]
    fn a_clone_holding_the_guests_address_sends_as_it_and_still_answers_at_its_own() {
        let mut net = network();
        net.holds_guest_address = true;
        let text = rules(&net);
        assert_eq!(text.matches("snat").count(), 1, "{text}");
        for line in [
            r#"oifname "uplink" ip saddr 192.168.105.5 ip daddr 198.18.105.0/24 snat to 198.18.105.3"#,
            r#"iifname "uplink" ip daddr 198.18.105.3 dnat to 192.168.105.5"#,
            r#"oifname "uplink" ip saddr != { 192.168.105.5, 198.18.105.3 } drop"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn the_tap_answers_arp_at_once_and_takes_only_the_guests_address() {
        let keys: Vec<String> = tap_sysctls("lnt4").iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(
            keys,
            [
                "net/ipv4/conf/lnt4/proxy_arp",
                "net/ipv4/neigh/lnt4/proxy_delay",
                "net/ipv4/conf/lnt4/rp_filter"
            ]
        );
        assert!(
            NAMESPACE_SYSCTLS.contains(&("net/ipv6/conf/default/disable_ipv6", "1")),
            "links made later have no IPv6"
        );
    }
}
