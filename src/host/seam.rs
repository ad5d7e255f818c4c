//! The host seam: every kernel effect the daemon makes goes through one of
//! three small traits, so that the daemon's decisions and orchestration
//! run over a recording fake (`fake`, in unit tests, as any user) as well
//! as over the kernel (`kernel`):
//!
//! - `Links`: links, addresses and routes (rtnetlink; `Netlink` is the
//!   kernel's);
//! - `Tables`: linnet's nftables tables — the firewall's batch, the guard
//!   and its elements, and what linnet reads of the other firewalls;
//! - `Devices`: TAP and macvtap devices, sysctls, IP forwarding, and a
//!   clone's namespace.
//!
//! The traits say what is done, not how: the host module keeps the how
//! (netlink messages, nftables text and JSON, ioctls).

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::clone_ns::{CloneNetwork, CloneNsError, MadeClone};
use super::docker_user::{Changes, Wanted};
use super::firewall::FirewallNetwork;
use super::guard::PortGuard;
use super::legacy::LegacyChain;
use super::netlink::{Link, LinkSettings, NetlinkError, Route};
use super::netns::NetNs;
use super::nft::NftError;
use super::ruleset::{Ruleset, Shape};
use super::sysctl::Ipv6Forwarding;
use super::tap::TapError;
use crate::config::MacvtapMode;
use crate::types::MacAddr;

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
        mode: MacvtapMode,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError>;
    async fn create_macvlan(
        &self,
        name: &str,
        uplink: u32,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError>;
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

/// linnet's nftables tables, and what it reads of the others'.
pub trait Tables: Send + Sync {
    /// Replaces the firewall table (`inet linnet`) with the networks'
    /// rules in one transaction; none: the table goes.
    fn apply_firewall(&mut self, networks: &[FirewallNetwork]) -> Result<(), NftError>;
    /// Makes the guard tables anew with `ports` in them, in one
    /// transaction.
    fn create_guard(&mut self, ports: &[PortGuard]) -> Result<(), NftError>;
    /// Removes the guard tables.
    fn remove_guard(&mut self) -> Result<(), NftError>;
    fn add_guard_port(&mut self, port: &PortGuard) -> Result<(), NftError>;
    fn update_guard_port(&mut self, old: &PortGuard, new: &PortGuard) -> Result<(), NftError>;
    /// Removes the macvtaps' hooks of `ports` (before their links go).
    fn unhook_guard_ports(&mut self, ports: &[PortGuard]) -> Result<(), NftError>;
    fn remove_guard_ports(&mut self, ports: &[PortGuard]) -> Result<(), NftError>;
    /// Frames each guarded port's rules dropped so far, by port name.
    fn guard_drops(&mut self) -> Result<BTreeMap<String, u64>, NftError>;
    /// Every table of the namespace, as linnet reads the others'.
    fn ruleset(&mut self) -> Result<Ruleset, NftError>;
    /// The chains and rule counts of linnet's table in `family`; None:
    /// the table is not there.
    fn linnet_shape(&mut self, family: &str) -> Result<Option<Shape>, NftError>;
    /// Makes linnet's rules in Docker's DOCKER-USER chains `wanted`.
    fn sync_docker_user(&mut self, rs: &Ruleset, wanted: &[Wanted]) -> Result<Changes, NftError>;
    /// The chains of legacy iptables (not nftables) that hold rules.
    fn legacy_chains(&mut self) -> io::Result<Vec<LegacyChain>>;
}

/// Devices, sysctls and namespaces.
#[async_trait]
pub trait Devices: Send + Sync {
    /// A TAP named with the next free number from `next`, owned by
    /// `uid`/`gid`; returns its name and fd.
    fn create_tap(&self, next: &mut u32, uid: u32, gid: u32)
    -> Result<(String, OwnedFd), TapError>;
    /// Makes a TAP outlive its fd (for a VMM that opens it by name).
    fn make_persistent(&self, tap: BorrowedFd<'_>) -> io::Result<()>;
    /// Opens macvtap `name`'s character device (`scratch`: a root-only
    /// directory for its node).
    fn open_macvtap(&self, name: &str, index: u32, scratch: &Path) -> io::Result<OwnedFd>;
    /// `net.<family>.conf.<link>.<key>`.
    fn set_link_sysctl(&self, family: &str, link: &str, key: &str, value: &str) -> io::Result<()>;
    fn forwarding_on(&self, ipv6: bool) -> bool;
    fn enable_ipv4_forwarding(&self) -> io::Result<()>;
    fn disable_ipv4_forwarding(&self) -> io::Result<()>;
    /// Turns IPv6 forwarding on; returns what it changed, to put back.
    fn enable_ipv6_forwarding(&self) -> io::Result<Ipv6Forwarding>;
    fn disable_ipv6_forwarding(&self, changed: &Ipv6Forwarding) -> io::Result<()>;
    /// A clone's namespace with its TAP (owned by `owner`: uid, gid) and
    /// its uplink's port on the host.
    async fn make_clone(
        &self,
        spec: &CloneNetwork,
        next: &mut u32,
        owner: (u32, u32),
    ) -> Result<MadeClone, CloneNsError>;
    /// Tells the network that the guest's address is at a clone now.
    fn announce_clone(&self, ns: &NetNs, spec: &CloneNetwork) -> io::Result<()>;
    /// Deletes a clone's TAP in its namespace (its VMM sees it go).
    async fn delete_clone_tap(&self, ns: &NetNs, tap: &str) -> Result<(), CloneNsError>;
    /// Names a namespace at `path` (a bind mount).
    fn mount_namespace(&self, ns: &NetNs, path: &Path) -> io::Result<()>;
    /// Takes a namespace's name away.
    fn unmount_namespace(&self, path: &Path) -> io::Result<()>;
}

/// The host as the daemon sees it: one of each.
pub struct Host {
    pub links: Arc<dyn Links>,
    pub tables: Box<dyn Tables>,
    pub devices: Arc<dyn Devices>,
}
