//! The host seam (`seam`) over the real kernel: rtnetlink for links,
//! libnftables (or the nft command) for tables, ioctls, sysctls and
//! namespaces for devices. Each method hands over to the module that
//! knows how; nothing is decided here.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::clone_ns::{self, CloneNetwork, CloneNsError, MadeClone};
use super::docker_user::{self, Changes, Wanted};
use super::firewall::{self, FirewallNetwork};
use super::guard::{self, PortGuard};
use super::legacy::{self, LegacyChain};
use super::macvtap;
use super::netlink::{Link, LinkSettings, Netlink, NetlinkError, Route};
use super::netns::{self, NetNs};
use super::nft::{Nft, NftError};
use super::ruleset::{self, Ruleset, Shape};
use super::seam::{Devices, Host, Links, Tables};
use super::sysctl::{self, Ipv6Forwarding};
use super::tap::{self, TapError};
use crate::config::MacvtapMode;
use crate::types::MacAddr;

impl Host {
    /// The kernel's, through `netlink` (connected in the daemon's
    /// namespace).
    pub fn kernel(netlink: Netlink) -> Host {
        Host {
            links: Arc::new(netlink.clone()),
            tables: Box::new(KernelTables { nft: Nft::open() }),
            devices: Arc::new(KernelDevices { netlink }),
        }
    }
}

#[async_trait]
impl Links for Netlink {
    async fn links(&self) -> Result<Vec<Link>, NetlinkError> {
        Netlink::links(self).await
    }
    async fn link(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        Netlink::link(self, name).await
    }
    async fn create_bridge(&self, name: &str, mtu: u32, mac: MacAddr) -> Result<u32, NetlinkError> {
        Netlink::create_bridge(self, name, mtu, mac).await
    }
    async fn create_macvtap(
        &self,
        name: &str,
        uplink: u32,
        mode: MacvtapMode,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError> {
        Netlink::create_macvtap(self, name, uplink, mode, mac).await
    }
    async fn create_macvlan(
        &self,
        name: &str,
        uplink: u32,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError> {
        Netlink::create_macvlan(self, name, uplink, mac).await
    }
    async fn configure(&self, index: u32, settings: LinkSettings<'_>) -> Result<(), NetlinkError> {
        Netlink::configure(self, index, settings).await
    }
    async fn cut_off(&self, index: u32) -> Result<(), NetlinkError> {
        Netlink::cut_off(self, index).await
    }
    async fn set_master(&self, index: u32, master: Option<u32>) -> Result<(), NetlinkError> {
        Netlink::set_master(self, index, master).await
    }
    async fn set_address(&self, index: u32, mac: MacAddr) -> Result<(), NetlinkError> {
        Netlink::set_address(self, index, mac).await
    }
    async fn add_address(&self, index: u32, net: IpNet) -> Result<(), NetlinkError> {
        Netlink::add_address(self, index, net).await
    }
    async fn delete_link(&self, index: u32) -> Result<(), NetlinkError> {
        Netlink::delete_link(self, index).await
    }
    async fn delete_links(&self, indexes: &[u32]) -> Result<(), NetlinkError> {
        Netlink::delete_links(self, indexes).await
    }
    async fn ipv4_addresses(&self) -> Result<Vec<(u32, Ipv4Net)>, NetlinkError> {
        Netlink::ipv4_addresses(self).await
    }
    async fn ipv4_routes(&self) -> Result<Vec<(Ipv4Net, Option<u32>)>, NetlinkError> {
        Netlink::ipv4_routes(self).await
    }
    async fn ipv6_routes(&self) -> Result<Vec<(Ipv6Net, Option<u32>)>, NetlinkError> {
        Netlink::ipv6_routes(self).await
    }
    async fn add_link_route(&self, net: Ipv4Net, index: u32) -> Result<(), NetlinkError> {
        Netlink::add_link_route(self, net, index).await
    }
    async fn add_host_route(
        &self,
        ip: Ipv4Addr,
        index: u32,
        src: Ipv4Addr,
    ) -> Result<(), NetlinkError> {
        Netlink::add_host_route(self, ip, index, src).await
    }
    async fn delete_host_route(&self, ip: Ipv4Addr, index: u32) -> Result<(), NetlinkError> {
        Netlink::delete_host_route(self, ip, index).await
    }
    async fn route_to(&self, dst: IpAddr) -> Result<Option<u32>, NetlinkError> {
        Netlink::route_to(self, dst).await
    }
    async fn default_routes(&self, ipv6: bool) -> Result<Vec<Route>, NetlinkError> {
        Netlink::default_routes(self, ipv6).await
    }
}

/// linnet's tables through libnftables (or the nft command).
struct KernelTables {
    nft: Nft,
}

impl Tables for KernelTables {
    fn apply_firewall(&mut self, networks: &[FirewallNetwork]) -> Result<(), NftError> {
        firewall::apply(&mut self.nft, networks)
    }
    fn create_guard(&mut self, ports: &[PortGuard]) -> Result<(), NftError> {
        guard::create_with(&mut self.nft, ports)
    }
    fn remove_guard(&mut self) -> Result<(), NftError> {
        guard::remove(&mut self.nft)
    }
    fn add_guard_port(&mut self, port: &PortGuard) -> Result<(), NftError> {
        guard::add_port(&mut self.nft, port)
    }
    fn update_guard_port(&mut self, old: &PortGuard, new: &PortGuard) -> Result<(), NftError> {
        guard::update_port(&mut self.nft, old, new)
    }
    fn unhook_guard_ports(&mut self, ports: &[PortGuard]) -> Result<(), NftError> {
        guard::unhook(&mut self.nft, ports)
    }
    fn remove_guard_ports(&mut self, ports: &[PortGuard]) -> Result<(), NftError> {
        guard::remove_ports(&mut self.nft, ports)
    }
    fn guard_drops(&mut self) -> Result<BTreeMap<String, u64>, NftError> {
        guard::drops(&mut self.nft)
    }
    fn ruleset(&mut self) -> Result<Ruleset, NftError> {
        Ruleset::read(&mut self.nft)
    }
    fn linnet_shape(&mut self, family: &str) -> Result<Option<Shape>, NftError> {
        ruleset::linnet_shape(&mut self.nft, family)
    }
    fn sync_docker_user(&mut self, rs: &Ruleset, wanted: &[Wanted]) -> Result<Changes, NftError> {
        docker_user::sync(&mut self.nft, rs, wanted)
    }
    fn legacy_chains(&mut self) -> io::Result<Vec<LegacyChain>> {
        legacy::chains()
    }
}

/// Devices through ioctls, sysctls through /proc/sys, namespaces through
/// setns and mounts; a clone's host side through `netlink`.
struct KernelDevices {
    netlink: Netlink,
}

#[async_trait]
impl Devices for KernelDevices {
    fn create_tap(
        &self,
        next: &mut u32,
        uid: u32,
        gid: u32,
    ) -> Result<(String, OwnedFd), TapError> {
        tap::create_numbered(next, uid, gid)
    }
    fn make_persistent(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        tap::set_persistent(fd)
    }
    fn open_macvtap(&self, name: &str, index: u32, scratch: &Path) -> io::Result<OwnedFd> {
        macvtap::open(name, index, scratch)
    }
    fn set_link_sysctl(&self, family: &str, link: &str, key: &str, value: &str) -> io::Result<()> {
        sysctl::set_link(family, link, key, value)
    }
    fn forwarding_on(&self, ipv6: bool) -> bool {
        sysctl::forwarding_on(ipv6)
    }
    fn enable_ipv4_forwarding(&self) -> io::Result<()> {
        sysctl::enable_ipv4_forwarding().map(drop)
    }
    fn disable_ipv4_forwarding(&self) -> io::Result<()> {
        sysctl::disable_ipv4_forwarding()
    }
    fn enable_ipv6_forwarding(&self) -> io::Result<Ipv6Forwarding> {
        sysctl::enable_ipv6_forwarding()
    }
    fn disable_ipv6_forwarding(&self, changed: &Ipv6Forwarding) -> io::Result<()> {
        sysctl::disable_ipv6_forwarding(changed)
    }
    async fn make_clone(
        &self,
        spec: &CloneNetwork,
        next: &mut u32,
        owner: (u32, u32),
    ) -> Result<MadeClone, CloneNsError> {
        clone_ns::make(&self.netlink, spec, next, owner).await
    }
    fn announce_clone(&self, ns: &NetNs, spec: &CloneNetwork) -> io::Result<()> {
        clone_ns::announce(ns, spec)
    }
    async fn delete_clone_tap(&self, ns: &NetNs, tap: &str) -> Result<(), CloneNsError> {
        clone_ns::delete_tap(ns, tap).await
    }
    fn mount_namespace(&self, ns: &NetNs, path: &Path) -> io::Result<()> {
        ns.mount_at(path)
    }
    fn unmount_namespace(&self, path: &Path) -> io::Result<()> {
        netns::unmount(path)
    }
}
