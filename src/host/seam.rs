//! The host seam: every kernel effect the daemon makes goes through one of
//! three small traits, so that the daemon's decisions and orchestration
//! run over a recording fake (`fake`, in unit tests, as any user) as well
//! as over the kernel (`kernel`):
//!
//! - `Links`: links, addresses and routes (defined beside `Netlink`, the
//!   kernel's, in `netlink`);
//! - `Tables`: linnet's nftables tables — the firewall's batch, the guard
//!   and its elements, and what linnet reads of the other firewalls; and
//!   `LearnedSets`, its handle for the DNS forwarder's learned addresses;
//! - `Devices`: TAP and macvtap devices, sysctls, IP forwarding, and a
//!   clone's namespace.
//!
//! The traits say what is done, not how: the host module keeps the how
//! (netlink messages, nftables text and JSON, ioctls).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use super::clone_ns::{CloneNetwork, CloneNsError, MadeClone};
use super::docker_user::{Changes, Wanted};
use super::firewall::FirewallNetwork;
use super::guard::{PortGuard, RateDrops};
use super::legacy::LegacyChain;
pub use super::netlink::Links;
use super::netns::NetNs;
use super::nft::NftError;
use super::ruleset::{Ruleset, Shape};
use super::sysctl::Ipv6Forwarding;
use super::tap::TapError;
use crate::learned::Element;

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
    /// Frames each rate-limited port's limits dropped so far, by way.
    fn guard_rate_drops(&mut self) -> Result<RateDrops, NftError>;
    /// Connections each VM's egress policy refused so far, by TAP.
    fn policy_refusals(&mut self) -> Result<BTreeMap<String, u64>, NftError>;
    /// Every table of the namespace, as linnet reads the others'.
    fn ruleset(&mut self) -> Result<Ruleset, NftError>;
    /// The way to the sets of addresses VMs learn through linnet's DNS,
    /// which the DNS forwarder uses without the daemon's lock.
    fn learned_sets(&self) -> Arc<dyn LearnedSets>;
    /// The chains and rule counts of the table `family table`; None: the
    /// table is not there.
    fn table_shape(&mut self, family: &str, table: &str) -> Result<Option<Shape>, NftError>;
    /// The same of linnet's table in `family` (`family linnet`).
    fn linnet_shape(&mut self, family: &str) -> Result<Option<Shape>, NftError> {
        self.table_shape(family, super::NFT_TABLE)
    }
    /// Makes linnet's rules in Docker's DOCKER-USER chains `wanted`.
    fn sync_docker_user(&mut self, rs: &Ruleset, wanted: &[Wanted]) -> Result<Changes, NftError>;
    /// The chains of legacy iptables (not nftables) that hold rules.
    fn legacy_chains(&mut self) -> io::Result<Vec<LegacyChain>>;
}

/// Puts addresses a VM learned for its policy's names into its sets in
/// linnet's firewall table (`firewall::names`).
pub trait LearnedSets: Send + Sync {
    /// Puts `elements` into `tap`'s sets, each with the lifetime given.
    fn put(&self, tap: &str, elements: &[Element]) -> Result<(), NftError>;
    /// What the sets hold now, by TAP: a starting daemon's predecessor's.
    fn read(&self) -> Result<Vec<(String, Element)>, NftError>;
}

/// Devices, sysctls and namespaces.
#[async_trait]
pub trait Devices: Send + Sync {
    /// A TAP named with the next free number from `next`, owned by
    /// `uid`/`gid`, with `queues` queues; returns its name and an fd per
    /// queue.
    fn create_tap(
        &self,
        next: &mut u32,
        uid: u32,
        gid: u32,
        queues: u16,
    ) -> Result<(String, Vec<OwnedFd>), TapError>;
    /// Makes a TAP outlive its fd (for a VMM that opens it by name).
    fn make_persistent(&self, tap: BorrowedFd<'_>) -> io::Result<()>;
    /// Gives a TAP made for root (a spare) to `uid`/`gid`.
    fn give_tap(&self, tap: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()>;
    /// Opens macvtap `name`'s character device (`scratch`: a root-only
    /// directory for its node).
    fn open_macvtap(&self, name: &str, index: u32, scratch: &Path) -> io::Result<OwnedFd>;
    /// `net.<family>.conf.<link>.<key>`.
    fn set_link_sysctl(&self, family: &str, link: &str, key: &str, value: &str) -> io::Result<()>;
    fn forwarding_on(&self, ipv6: bool) -> bool;
    /// Whether frames a bridge forwards pass nftables' inet hooks
    /// (`br_netfilter` loaded), as connect/listen policies between VMs of
    /// one network need.
    fn bridge_netfilter(&self) -> bool;
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
