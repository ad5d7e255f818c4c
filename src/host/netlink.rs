//! Links, addresses and routes: the `Links` trait the daemon changes them
//! through (`seam`), and `Netlink`, the kernel's over rtnetlink: bridges
//! and TAP ports for the networks, and the address/route dump used to
//! refuse overlapping subnets.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use async_trait::async_trait;
use futures::TryStreamExt;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::packet_route::link::InfoVeth;
use rtnetlink::packet_route::link::{
    BridgeBooleanOptionFlags, InfoBridge, InfoBridgePort, InfoData, InfoKind, InfoVxlan,
    LinkAttribute, LinkInfo, LinkLayerType, LinkMessage, MacVlanMode, MacVtapMode,
};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteScope,
};
use rtnetlink::{
    Handle, LinkBridge, LinkBridgePort, LinkMacVlan, LinkMacVtap, LinkUnspec, LinkVeth, LinkVxlan,
    RouteMessageBuilder,
};
use thiserror::Error;
use tracing::warn;

use super::link_deletes::{Delete, Deletes};
use crate::config::MacvtapMode as Mode;
use crate::types::MacAddr;

#[derive(Debug, Error)]
#[error("{what}: {source}")]
pub struct NetlinkError {
    pub what: String,
    pub source: io::Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    Bridge,
    Tun,
    Macvtap,
    Macvlan,
    Veth,
    Vxlan,
    Loopback,
    Other,
}

/// What makes a VXLAN device the one a network across hosts needs: its
/// VNI and its local (VTEP) address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanId {
    pub vni: u32,
    pub local: Option<Ipv4Addr>,
}

#[derive(Debug, Clone)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// The device group (0 unless someone set one).
    pub group: u32,
    pub kind: LinkKind,
    pub alias: Option<String>,
    pub master: Option<u32>,
    /// Its MAC (IFLA_ADDRESS), for an Ethernet-like link.
    pub address: Option<MacAddr>,
    pub mtu: u32,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// A VXLAN device's VNI and VTEP.
    pub vxlan: Option<VxlanId>,
}

/// A connection to rtnetlink in the daemon's network namespace; links are
/// deleted on a thread of their own (`link_deletes`).
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
    deletes: Deletes,
}

/// VXLAN's IANA port (RFC 7348), which FRR and every VTEP use.
pub const VXLAN_PORT: u16 = 4789;

/// Where `delete_links` starts looking for a free device group ("ln\0\0"),
/// well away from the small numbers people give groups.
const BULK_DELETE_GROUP: u32 = 0x6c6e_0000;

fn to_io(e: rtnetlink::Error) -> io::Error {
    match e {
        rtnetlink::Error::NetlinkError(msg) => msg.to_io(),
        other => io::Error::other(other.to_string()),
    }
}

fn op(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    let what = what.into();
    move |e| NetlinkError {
        what,
        source: to_io(e),
    }
}

impl Netlink {
    /// Opens the sockets, in the calling thread's network namespace; must
    /// be called inside a tokio runtime.
    pub fn connect() -> io::Result<Netlink> {
        let (connection, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(connection);
        let (deletes, _thread) = Deletes::start()?;
        Ok(Netlink { handle, deletes })
    }

    async fn add(&self, msg: LinkMessage, what: String, name: &str) -> Result<u32, NetlinkError> {
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(op(what.clone()))?;
        self.link(name)
            .await?
            .map(|l| l.index)
            .ok_or_else(|| NetlinkError {
                what,
                source: io::Error::from_raw_os_error(libc::ENODEV),
            })
    }

    async fn set(&self, msg: LinkMessage, what: String) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(op(what))
    }

    /// Puts the links in a device group no link uses and deletes that group.
    /// Refuses if a link that is not in `indexes` joined the group meanwhile.
    async fn delete_as_group(&self, indexes: &[u32]) -> Result<(), NetlinkError> {
        let used: BTreeSet<u32> = self.links().await?.iter().map(|l| l.group).collect();
        let group = (BULK_DELETE_GROUP..)
            .find(|g| !used.contains(g))
            .expect("a free device group");
        for &index in indexes {
            let set = LinkUnspec::new_with_index(index).link_group(group).build();
            if let Err(e) = self.handle.link().set(set).execute().await {
                let e = to_io(e);
                if e.raw_os_error() != Some(libc::ENODEV) {
                    return Err(NetlinkError {
                        what: format!("put link {index} in device group {group}"),
                        source: e,
                    });
                }
            }
        }
        let ours: BTreeSet<u32> = indexes.iter().copied().collect();
        let members = self.links().await?;
        if let Some(other) = members
            .iter()
            .find(|l| l.group == group && !ours.contains(&l.index))
        {
            return Err(NetlinkError {
                what: format!("delete device group {group}"),
                source: io::Error::other(format!("{} joined it too", other.name)),
            });
        }
        (self.deletes.delete(Delete::Group(group)).await).map_err(|source| NetlinkError {
            what: format!("delete the links of device group {group}"),
            source,
        })
    }

    /// Creates a veth pair, down: `name` here, `peer` in the namespace of
    /// `peer_ns` (an fd), each with its MAC. Returns `name`'s index.
    pub async fn create_veth(
        &self,
        (name, mac): (&str, MacAddr),
        (peer, peer_mac): (&str, MacAddr),
        mtu: u32,
        peer_ns: std::os::fd::RawFd,
    ) -> Result<u32, NetlinkError> {
        let peer_msg = LinkUnspec::new_with_name(peer)
            .address(peer_mac.0.to_vec())
            .mtu(mtu)
            .setns_by_fd(peer_ns)
            .build();
        let msg = LinkVeth::new(name, peer)
            .set_info_data(rtnetlink::packet_route::link::InfoData::Veth(
                InfoVeth::Peer(peer_msg),
            ))
            .address(mac.0.to_vec())
            .mtu(mtu)
            .down()
            .build();
        self.add(msg, format!("create veth {name}"), name).await
    }

    /// The default route via `gateway` out of `index`, which has no
    /// address in the gateway's subnet (onlink).
    pub async fn add_default_route_onlink(
        &self,
        gateway: Ipv4Addr,
        index: u32,
    ) -> Result<(), NetlinkError> {
        let msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .gateway(gateway)
            .output_interface(index)
            .onlink()
            .build();
        self.add_route(msg, format!("add a default route via {gateway}"))
            .await
    }

    async fn add_route(&self, msg: RouteMessage, what: String) -> Result<(), NetlinkError> {
        self.handle
            .route()
            .add(msg)
            .execute()
            .await
            .map_err(op(what))
    }

    /// A proxy entry: `index` answers ARP for `ip` (routed elsewhere).
    pub async fn add_proxy_neighbour(&self, index: u32, ip: Ipv4Addr) -> Result<(), NetlinkError> {
        self.handle
            .neighbours()
            .add(index, IpAddr::V4(ip))
            .flags(NeighbourFlags::Proxy)
            .execute()
            .await
            .map_err(op(format!("answer ARP for {ip} on link {index}")))
    }

    async fn routes(&self, req: RouteMessage) -> Result<Vec<Route>, NetlinkError> {
        let v6 = req.header.address_family == AddressFamily::Inet6;
        let mut stream = self.handle.route().get(req).execute();
        let mut out = Vec::new();
        while let Some(msg) = stream.try_next().await.map_err(op("list routes"))? {
            if msg.header.table != RouteHeader::RT_TABLE_MAIN {
                continue;
            }
            let mut dst = if v6 {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            } else {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            };
            let (mut oif, mut metric) = (None, 0);
            for attr in &msg.attributes {
                match attr {
                    RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = IpAddr::V4(*ip),
                    RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = IpAddr::V6(*ip),
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Priority(p) => metric = *p,
                    _ => {}
                }
            }
            if let Ok(dst) = IpNet::new(dst, msg.header.destination_prefix_length) {
                out.push(Route { dst, oif, metric });
            }
        }
        Ok(out)
    }
}

/// Links, addresses and routes in the daemon's network namespace.
#[async_trait]
pub trait Links: Send + Sync {
    async fn links(&self) -> Result<Vec<Link>, NetlinkError>;
    async fn link(&self, name: &str) -> Result<Option<Link>, NetlinkError>;
    /// A bridge (down) with the MAC `mac`; returns its index.
    async fn create_bridge(&self, name: &str, mtu: u32, mac: MacAddr) -> Result<u32, NetlinkError>;
    async fn create_macvtap(
        &self,
        name: &str,
        uplink: u32,
        mode: Mode,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError>;
    async fn create_macvlan(
        &self,
        name: &str,
        uplink: u32,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError>;
    /// A VXLAN device (down) for a network across hosts: VNI and VTEP as
    /// `id` says, UDP port 4789, no learning (FRR's EVPN fills its FDB).
    async fn create_vxlan(&self, name: &str, id: VxlanId, mtu: u32) -> Result<u32, NetlinkError>;
    /// Makes bridge port `index` the network's way to the other hosts:
    /// the bridge answers ARP and ND for what is behind it from its
    /// neighbour table (`neigh_suppress`) and learns no MAC from it.
    async fn make_fabric_port(&self, index: u32) -> Result<(), NetlinkError>;
    /// `ip` is at `mac` on link `index`, for good (replacing what was).
    async fn set_neighbour(
        &self,
        index: u32,
        ip: Ipv4Addr,
        mac: MacAddr,
    ) -> Result<(), NetlinkError>;
    /// Removes link `index`'s neighbour entry for `ip`; none is no error.
    async fn delete_neighbour(&self, index: u32, ip: Ipv4Addr) -> Result<(), NetlinkError>;
    /// The IPv4 neighbours of link `index` that something outside the
    /// kernel put there (`extern_learn`: FRR's, from EVPN routes), with
    /// their MACs.
    async fn learned_neighbours(
        &self,
        index: u32,
    ) -> Result<Vec<(Ipv4Addr, MacAddr)>, NetlinkError>;
    /// The MACs the forwarding table of VXLAN device `index` sends to
    /// another VTEP (FRR puts the other hosts' VMs there), with that VTEP.
    async fn remote_macs(&self, index: u32) -> Result<Vec<(MacAddr, IpAddr)>, NetlinkError>;
    async fn configure(&self, index: u32, settings: LinkSettings<'_>) -> Result<(), NetlinkError>;
    /// Takes a link off its bridge and down.
    async fn cut_off(&self, index: u32) -> Result<(), NetlinkError>;
    async fn set_master(&self, index: u32, master: Option<u32>) -> Result<(), NetlinkError>;
    async fn set_address(&self, index: u32, mac: MacAddr) -> Result<(), NetlinkError>;
    async fn add_address(&self, index: u32, net: IpNet) -> Result<(), NetlinkError>;
    /// Deletes a link; one that is gone already is no error.
    async fn delete_link(&self, index: u32) -> Result<(), NetlinkError>;
    /// Deletes many links at once.
    async fn delete_links(&self, indexes: &[u32]) -> Result<(), NetlinkError>;
    async fn ipv4_addresses(&self) -> Result<Vec<(u32, Ipv4Net)>, NetlinkError>;
    async fn ipv4_routes(&self) -> Result<Vec<(Ipv4Net, Option<u32>)>, NetlinkError>;
    async fn ipv6_routes(&self) -> Result<Vec<(Ipv6Net, Option<u32>)>, NetlinkError>;
    async fn add_link_route(&self, net: Ipv4Net, index: u32) -> Result<(), NetlinkError>;
    async fn add_host_route(
        &self,
        ip: Ipv4Addr,
        index: u32,
        src: Ipv4Addr,
    ) -> Result<(), NetlinkError>;
    async fn delete_host_route(&self, ip: Ipv4Addr, index: u32) -> Result<(), NetlinkError>;
    /// The link the kernel would send a packet to `dst` out of.
    async fn route_to(&self, dst: IpAddr) -> Result<Option<u32>, NetlinkError>;
    async fn default_routes(&self, ipv6: bool) -> Result<Vec<Route>, NetlinkError>;
}

#[async_trait]
impl Links for Netlink {
    async fn links(&self) -> Result<Vec<Link>, NetlinkError> {
        let mut stream = self.handle.link().get().execute();
        let mut links = Vec::new();
        while let Some(msg) = stream.try_next().await.map_err(op("list links"))? {
            links.push(parse_link(msg));
        }
        Ok(links)
    }

    async fn link(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match stream.try_next().await {
            Ok(msg) => Ok(msg.map(parse_link)),
            Err(e) => {
                let e = to_io(e);
                if e.raw_os_error() == Some(libc::ENODEV) {
                    Ok(None)
                } else {
                    Err(NetlinkError {
                        what: format!("look up link {name}"),
                        source: e,
                    })
                }
            }
        }
    }

    /// Creates a bridge (down) with the MAC `mac`, returning its index.
    async fn create_bridge(&self, name: &str, mtu: u32, mac: MacAddr) -> Result<u32, NetlinkError> {
        // Frames to 01:80:c2:00:00:0x skip the bridge's prerouting hook (and
        // so the guard) but would still teach it their source MAC: a VM
        // could move another's MAC to its own port. Learn nothing from them.
        // A bridge whose MAC was never set takes the lowest of its ports':
        // a VMM that sets its TAP's MAC (its fd allows that) would move the
        // gateway's MAC under every VM. Set, it stays.
        let msg = LinkBridge::new(name)
            .down()
            .mtu(mtu)
            .address(mac.0.to_vec())
            .set_boolean_opt(BridgeBooleanOptionFlags::NoLinkLocalLearn, true)
            // Bridged IPv4/IPv6 also passes the inet hooks (when the
            // br_netfilter module is there), whatever the namespace's
            // bridge-nf-call sysctls say: connect/listen policies and
            // isolation then hold between VMs of one network too.
            .append_info_data(InfoBridge::NfCallIpTables(true))
            .append_info_data(InfoBridge::NfCallIp6Tables(true))
            // No multicast snooping: with no querier on the link (linnet
            // runs none) the bridge floods every multicast frame anyway
            // (the kernel's br_multicast_querier_exists), so snooping would
            // only cost: a timer set on every port each time any port comes
            // or goes (the 1000th attach paid for 999 of them), and a table
            // of groups that a guest's reports fill.
            .append_info_data(InfoBridge::MulticastSnooping(false))
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(op(format!("create bridge {name}")))?;
        self.link(name)
            .await?
            .map(|l| l.index)
            .ok_or_else(|| NetlinkError {
                what: format!("create bridge {name}"),
                source: io::Error::from_raw_os_error(libc::ENODEV),
            })
    }

    /// Creates a macvtap `name` (down) on the link `uplink` in `mode`, with
    /// the MAC `mac` (its VM's: a macvtap passes only frames to its own
    /// MAC), returning its index.
    async fn create_macvtap(
        &self,
        name: &str,
        uplink: u32,
        mode: Mode,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError> {
        let mode = match mode {
            Mode::Bridge => MacVtapMode::Bridge,
            Mode::Vepa => MacVtapMode::Vepa,
            Mode::Private => MacVtapMode::Private,
            Mode::Passthru => MacVtapMode::Passthrough,
        };
        let msg = LinkMacVtap::new(name, uplink, mode)
            .down()
            .address(mac.0.to_vec())
            .build();
        self.add(msg, format!("create macvtap {name}"), name).await
    }

    /// Creates a macvlan `name` (down) in bridge mode on the link `uplink`,
    /// returning its index: the host's way to its macvtap VMs.
    async fn create_macvlan(
        &self,
        name: &str,
        uplink: u32,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError> {
        let msg = LinkMacVlan::new(name, uplink, MacVlanMode::Bridge)
            .down()
            .address(mac.0.to_vec())
            .build();
        self.add(msg, format!("create macvlan {name}"), name).await
    }

    async fn create_vxlan(&self, name: &str, id: VxlanId, mtu: u32) -> Result<u32, NetlinkError> {
        let mut msg = LinkVxlan::new(name, id.vni)
            .port(VXLAN_PORT)
            .learning(false)
            .mtu(mtu)
            .down();
        if let Some(local) = id.local {
            msg = msg.local(local);
        }
        self.add(msg.build(), format!("create VXLAN device {name}"), name)
            .await
    }

    async fn make_fabric_port(&self, index: u32) -> Result<(), NetlinkError> {
        let msg = LinkBridgePort::new(index)
            .append_info_data(InfoBridgePort::NeighSupress(true))
            .append_info_data(InfoBridgePort::Learning(false))
            .build();
        // A port's settings go in RTM_NEWLINK (`set_port`): RTM_SETLINK
        // ignores them without a word.
        self.handle
            .link()
            .set_port(msg)
            .execute()
            .await
            .map_err(op(format!(
                "turn on neighbour suppression and off learning on bridge port {index}"
            )))
    }

    async fn set_neighbour(
        &self,
        index: u32,
        ip: Ipv4Addr,
        mac: MacAddr,
    ) -> Result<(), NetlinkError> {
        self.handle
            .neighbours()
            .add(index, IpAddr::V4(ip))
            .link_layer_address(&mac.0)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(op(format!("set neighbour {ip} at {mac} on link {index}")))
    }

    async fn delete_neighbour(&self, index: u32, ip: Ipv4Addr) -> Result<(), NetlinkError> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.ifindex = index;
        msg.attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
        match self.handle.neighbours().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) => {
                let e = to_io(e);
                if e.raw_os_error() == Some(libc::ENOENT) {
                    Ok(())
                } else {
                    Err(NetlinkError {
                        what: format!("delete neighbour {ip} on link {index}"),
                        source: e,
                    })
                }
            }
        }
    }

    async fn learned_neighbours(
        &self,
        index: u32,
    ) -> Result<Vec<(Ipv4Addr, MacAddr)>, NetlinkError> {
        let mut stream = (self.handle.neighbours().get())
            .set_address_family(AddressFamily::Inet)
            .execute();
        let mut out = Vec::new();
        let what = || format!("list the neighbours of link {index}");
        while let Some(msg) = stream.try_next().await.map_err(op(what()))? {
            if msg.header.ifindex != index || !msg.header.flags.contains(NeighbourFlags::ExtLearned)
            {
                continue;
            }
            let (mut ip, mut mac) = (None, None);
            for attr in &msg.attributes {
                match attr {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some(*a),
                    NeighbourAttribute::LinkLayerAddress(a) => {
                        mac = <[u8; 6]>::try_from(a.as_slice()).ok().map(MacAddr)
                    }
                    _ => {}
                }
            }
            if let (Some(ip), Some(mac)) = (ip, mac) {
                out.push((ip, mac));
            }
        }
        Ok(out)
    }

    async fn remote_macs(&self, index: u32) -> Result<Vec<(MacAddr, IpAddr)>, NetlinkError> {
        let mut stream = (self.handle.neighbours().get())
            .set_address_family(AddressFamily::Bridge)
            .execute();
        let mut out = Vec::new();
        let what = || format!("list the forwarding table of link {index}");
        while let Some(msg) = stream.try_next().await.map_err(op(what()))? {
            if msg.header.ifindex != index {
                continue;
            }
            let (mut vtep, mut mac) = (None, None);
            for attr in &msg.attributes {
                match attr {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                        vtep = Some(IpAddr::V4(*a))
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                        vtep = Some(IpAddr::V6(*a))
                    }
                    // A forwarding entry's (AF_BRIDGE) destination comes
                    // as bytes: 4 for IPv4, 16 for IPv6.
                    NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                        vtep = match bytes.len() {
                            4 => <[u8; 4]>::try_from(bytes.as_slice()).ok().map(IpAddr::from),
                            16 => <[u8; 16]>::try_from(bytes.as_slice())
                                .ok()
                                .map(IpAddr::from),
                            _ => None,
                        }
                    }
                    NeighbourAttribute::LinkLayerAddress(a) => {
                        mac = <[u8; 6]>::try_from(a.as_slice()).ok().map(MacAddr)
                    }
                    _ => {}
                }
            }
            // The all-zero MAC's entries are where floods go, no VM's.
            if let (Some(vtep), Some(mac)) = (vtep, mac)
                && mac != MacAddr([0; 6])
            {
                out.push((mac, vtep));
            }
        }
        Ok(out)
    }

    /// Sets the attributes given; `up` brings the link up.
    async fn configure(&self, index: u32, settings: LinkSettings<'_>) -> Result<(), NetlinkError> {
        let mut b = LinkUnspec::new_with_index(index);
        if let Some(m) = settings.master {
            b = b.controller(m);
        }
        if let Some(mtu) = settings.mtu {
            b = b.mtu(mtu);
        }
        if let Some(len) = settings.txqueuelen {
            b = b.txqueuelen(len);
        }
        if let Some(alias) = settings.alias {
            b = b.alias(alias);
        }
        if settings.up {
            b = b.up();
        }
        self.handle
            .link()
            .set(b.build())
            .execute()
            .await
            .map_err(op(format!("configure link {index}")))
    }

    /// Takes a link off its bridge and down, for good: what a TAP whose VMM
    /// misbehaved gets. Its owner cannot undo either without CAP_NET_ADMIN.
    async fn cut_off(&self, index: u32) -> Result<(), NetlinkError> {
        let msg = LinkUnspec::new_with_index(index).nocontroller().down();
        self.set(msg.build(), format!("take link {index} off its bridge"))
            .await
    }

    /// Puts a link on a bridge (`Some(index)`), or takes it off (`None`).
    async fn set_master(&self, index: u32, master: Option<u32>) -> Result<(), NetlinkError> {
        let msg = LinkUnspec::new_with_index(index);
        let msg = match master {
            Some(bridge) => msg.controller(bridge),
            None => msg.nocontroller(),
        };
        self.set(msg.build(), format!("set the bridge of link {index}"))
            .await
    }

    /// Sets a link's MAC.
    async fn set_address(&self, index: u32, mac: MacAddr) -> Result<(), NetlinkError> {
        let msg = LinkUnspec::new_with_index(index).address(mac.0.to_vec());
        self.set(msg.build(), format!("set the MAC of link {index}"))
            .await
    }

    /// Adds an address (IPv4 or IPv6); one already there is fine. IPv6
    /// addresses skip duplicate address detection: they are the gateway's on
    /// linnet's own bridge, and must be usable (bindable) at once, even
    /// before the bridge has a port.
    async fn add_address(&self, index: u32, net: IpNet) -> Result<(), NetlinkError> {
        let mut request = self
            .handle
            .address()
            .add(index, net.addr(), net.prefix_len());
        if net.addr().is_ipv6() {
            request
                .message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        match request.execute().await {
            Err(e) => {
                let e = to_io(e);
                if e.raw_os_error() == Some(libc::EEXIST) {
                    return Ok(());
                }
                Err(NetlinkError {
                    what: format!("add {net} to link {index}"),
                    source: e,
                })
            }
            Ok(()) => Ok(()),
        }
    }

    /// Deletes a link; a link already gone is not an error.
    async fn delete_link(&self, index: u32) -> Result<(), NetlinkError> {
        match self.deletes.delete(Delete::Link(index)).await {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
            Err(source) => Err(NetlinkError {
                what: format!("delete link {index}"),
                source,
            }),
            Ok(()) => Ok(()),
        }
    }

    /// Deletes many links at once. The kernel waits for a grace period after
    /// each deletion (~15 ms), so one by one, a thousand TAPs take 15 s;
    /// put in one device group and deleted as a group, they share one wait.
    /// Whatever the group delete leaves, or when it cannot be used, goes one
    /// by one.
    async fn delete_links(&self, indexes: &[u32]) -> Result<(), NetlinkError> {
        if indexes.len() > 1 {
            match self.delete_as_group(indexes).await {
                Ok(()) => return Ok(()),
                Err(e) => warn!(
                    "deleting {} links at once failed, so one by one: {e}",
                    indexes.len()
                ),
            }
        }
        let mut failed = Ok(());
        for &index in indexes {
            if let Err(e) = self.delete_link(index).await {
                warn!("{e}");
                failed = Err(e);
            }
        }
        failed
    }

    /// Every IPv4 address in the namespace, with its link index.
    async fn ipv4_addresses(&self) -> Result<Vec<(u32, Ipv4Net)>, NetlinkError> {
        let mut stream = self.handle.address().get().execute();
        let mut out = Vec::new();
        while let Some(msg) = stream.try_next().await.map_err(op("list addresses"))? {
            for attr in &msg.attributes {
                if let AddressAttribute::Local(IpAddr::V4(ip)) = attr
                    && let Ok(net) = Ipv4Net::new(*ip, msg.header.prefix_len)
                {
                    out.push((msg.header.index, net));
                }
            }
        }
        Ok(out)
    }

    /// The IPv4 routes of the main table (destination, outgoing link).
    async fn ipv4_routes(&self) -> Result<Vec<(Ipv4Net, Option<u32>)>, NetlinkError> {
        let req = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let routes = self.routes(req).await?;
        Ok(routes
            .into_iter()
            .filter_map(|r| match r.dst {
                IpNet::V4(net) => Some((net, r.oif)),
                IpNet::V6(_) => None,
            })
            .collect())
    }

    /// The IPv6 routes of the main table (destination, outgoing link).
    async fn ipv6_routes(&self) -> Result<Vec<(Ipv6Net, Option<u32>)>, NetlinkError> {
        let req = RouteMessageBuilder::<Ipv6Addr>::new().build();
        let routes = self.routes(req).await?;
        Ok(routes
            .into_iter()
            .filter_map(|r| match r.dst {
                IpNet::V6(net) => Some((net, r.oif)),
                IpNet::V4(_) => None,
            })
            .collect())
    }

    /// A route to `net` straight out of the link `index` (scope link); one
    /// already there is fine.
    async fn add_link_route(&self, net: Ipv4Net, index: u32) -> Result<(), NetlinkError> {
        let msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(net.network(), net.prefix_len())
            .output_interface(index)
            .scope(RouteScope::Link)
            .build();
        match self.handle.route().add(msg).execute().await.map_err(to_io) {
            Err(e) if e.raw_os_error() != Some(libc::EEXIST) => Err(NetlinkError {
                what: format!("add a route to {net} through link {index}"),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// A route to one address through the link `index`, sent from `src`:
    /// how the host reaches a macvtap VM through its macvlan.
    async fn add_host_route(
        &self,
        ip: Ipv4Addr,
        index: u32,
        src: Ipv4Addr,
    ) -> Result<(), NetlinkError> {
        let msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(ip, 32)
            .output_interface(index)
            .scope(RouteScope::Link)
            .pref_source(src)
            .build();
        // Never over another route to that address (the host's own, say).
        self.add_route(msg, format!("add a route to {ip} through link {index}"))
            .await
    }

    /// Removes what `add_host_route` added; one already gone is no error.
    async fn delete_host_route(&self, ip: Ipv4Addr, index: u32) -> Result<(), NetlinkError> {
        let msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(ip, 32)
            .output_interface(index)
            .scope(RouteScope::Link)
            .build();
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) => {
                let e = to_io(e);
                if matches!(e.raw_os_error(), Some(libc::ESRCH | libc::ENODEV)) {
                    Ok(())
                } else {
                    Err(NetlinkError {
                        what: format!("delete the route to {ip} through link {index}"),
                        source: e,
                    })
                }
            }
        }
    }

    /// The interface the kernel would send a packet to `dst` out of (a
    /// route lookup like `ip route get`: policy routing and VPNs' 0/1
    /// routes included; nothing is sent). None: no route.
    async fn route_to(&self, dst: IpAddr) -> Result<Option<u32>, NetlinkError> {
        let req = match dst {
            IpAddr::V4(a) => RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(a, 32)
                .build(),
            IpAddr::V6(a) => RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(a, 128)
                .build(),
        };
        let mut stream = self.handle.route().get(req).execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(msg.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            })),
            Ok(None) => Ok(None),
            Err(e) => {
                let e = to_io(e);
                match e.raw_os_error() {
                    // No route (unreachable, blackhole, prohibit), or no
                    // IPv6 on this host at all.
                    Some(
                        libc::ENETUNREACH
                        | libc::EHOSTUNREACH
                        | libc::EINVAL
                        | libc::EACCES
                        | libc::EOPNOTSUPP
                        | libc::EAFNOSUPPORT,
                    ) => Ok(None),
                    _ => Err(NetlinkError {
                        what: format!("look up the route to {dst}"),
                        source: e,
                    }),
                }
            }
        }
    }

    /// The default routes of the main table of one family, the one the
    /// kernel uses (lowest metric) first.
    async fn default_routes(&self, ipv6: bool) -> Result<Vec<Route>, NetlinkError> {
        let req = if ipv6 {
            RouteMessageBuilder::<Ipv6Addr>::new().build()
        } else {
            RouteMessageBuilder::<Ipv4Addr>::new().build()
        };
        let mut routes: Vec<Route> = self
            .routes(req)
            .await?
            .into_iter()
            .filter(|r| r.dst.prefix_len() == 0)
            .collect();
        routes.sort_by_key(|r| r.metric);
        Ok(routes)
    }
}

/// A route of the main table.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub dst: IpNet,
    /// None for a multipath route.
    pub oif: Option<u32>,
    pub metric: u32,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct LinkSettings<'a> {
    pub master: Option<u32>,
    pub mtu: Option<u32>,
    pub txqueuelen: Option<u32>,
    pub alias: Option<&'a str>,
    pub up: bool,
}

fn parse_link(msg: LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        group: 0,
        kind: LinkKind::Other,
        alias: None,
        master: None,
        address: None,
        mtu: 0,
        rx_bytes: 0,
        tx_bytes: 0,
        rx_packets: 0,
        tx_packets: 0,
        vxlan: None,
    };
    if msg.header.link_layer_type == LinkLayerType::Loopback {
        link.kind = LinkKind::Loopback;
    }
    for attr in msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n,
            LinkAttribute::Group(g) => link.group = g,
            LinkAttribute::IfAlias(a) => link.alias = Some(a),
            LinkAttribute::Controller(m) => link.master = Some(m),
            LinkAttribute::Mtu(m) => link.mtu = m,
            LinkAttribute::Address(a) => link.address = <[u8; 6]>::try_from(a).ok().map(MacAddr),
            LinkAttribute::Stats64(s) => {
                (link.rx_bytes, link.tx_bytes) = (s.rx_bytes, s.tx_bytes);
                (link.rx_packets, link.tx_packets) = (s.rx_packets, s.tx_packets);
            }
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(kind) => {
                            link.kind = match kind {
                                InfoKind::Bridge => LinkKind::Bridge,
                                InfoKind::Tun => LinkKind::Tun,
                                InfoKind::MacVtap => LinkKind::Macvtap,
                                InfoKind::MacVlan => LinkKind::Macvlan,
                                InfoKind::Veth => LinkKind::Veth,
                                InfoKind::Vxlan => LinkKind::Vxlan,
                                _ => LinkKind::Other,
                            }
                        }
                        LinkInfo::Data(InfoData::Vxlan(data)) => {
                            let mut id = VxlanId {
                                vni: 0,
                                local: None,
                            };
                            for d in data {
                                match d {
                                    InfoVxlan::Id(vni) => id.vni = vni,
                                    InfoVxlan::Local(ip) => id.local = Some(ip),
                                    _ => {}
                                }
                            }
                            link.vxlan = Some(id);
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    link
}
