//! The host seam (`seam`) over the real kernel: libnftables (or the nft
//! command) for tables, ioctls, sysctls and namespaces for devices (links
//! are `Netlink`'s own, in `netlink`). Each method hands over to the
//! module that knows how; nothing is decided here.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use super::clone_ns::{self, CloneNetwork, CloneNsError, MadeClone};
use super::docker_user::{self, Changes, Wanted};
use super::firewall::{self, FirewallNetwork};
use super::gate_queue;
use super::guard::{self, PortGuard, RateDrops};
use super::legacy::{self, LegacyChain};
use super::macvtap;
use super::netlink::Netlink;
use super::netns::{self, NetNs};
use super::nft::{Nft, NftError};
use super::ruleset::{self, Ruleset, Shape};
use super::seam::{Devices, Host, LearnedSets, Tables};
use super::sysctl::{self, Ipv6Forwarding};
use super::tap::{self, TapError};
use crate::learned::Element;

impl Host {
    /// The kernel's, through `netlink` (connected in the daemon's
    /// namespace).
    pub fn kernel(netlink: Netlink) -> Host {
        Host {
            links: Arc::new(netlink.clone()),
            tables: Box::new(KernelTables {
                nft: Nft::open(),
                queue_rule: None,
            }),
            devices: Arc::new(KernelDevices { netlink }),
        }
    }
}

/// linnet's tables through libnftables (or the nft command).
struct KernelTables {
    nft: Nft,
    /// Whether the gate's queue rule is in (`gate_queue`); None until the
    /// first apply has made sure either way.
    queue_rule: Option<bool>,
}

/// The learned sets through the tables' own libnftables context.
struct KernelLearnedSets {
    nft: Nft,
}

impl LearnedSets for KernelLearnedSets {
    fn put(&self, tap: &str, elements: &[Element]) -> Result<(), NftError> {
        firewall::names::put(&self.nft, tap, elements)
    }
    fn read(&self) -> Result<Vec<(String, Element)>, NftError> {
        firewall::names::read(&self.nft)
    }
}

impl Tables for KernelTables {
    fn apply_firewall(&mut self, networks: &[FirewallNetwork]) -> Result<(), NftError> {
        let held = firewall::any_checked(networks);
        if held && self.queue_rule != Some(true) {
            // In before the table marks the first connection held.
            gate_queue::ensure().map_err(|e| NftError::Refused(e.to_string()))?;
            self.queue_rule = Some(true);
        }
        firewall::apply(&mut self.nft, networks)?;
        if !held && self.queue_rule != Some(false) {
            match gate_queue::remove() {
                Ok(()) => self.queue_rule = Some(false),
                // Nothing to take out where iptables is not installed.
                Err(e) if e.kind() == io::ErrorKind::NotFound => self.queue_rule = Some(false),
                Err(e) => tracing::warn!("cannot remove the gate's queue rule: {e}"),
            }
        }
        Ok(())
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
    fn guard_rate_drops(&mut self) -> Result<RateDrops, NftError> {
        guard::rate_drops(&mut self.nft)
    }
    fn policy_refusals(&mut self) -> Result<BTreeMap<String, u64>, NftError> {
        firewall::refusals(&self.nft)
    }
    fn ruleset(&mut self) -> Result<Ruleset, NftError> {
        Ruleset::read(&mut self.nft)
    }
    fn table_shape(&mut self, family: &str, table: &str) -> Result<Option<Shape>, NftError> {
        ruleset::table_shape(&mut self.nft, family, table)
    }
    fn learned_sets(&self) -> Arc<dyn LearnedSets> {
        Arc::new(KernelLearnedSets {
            nft: self.nft.clone(),
        })
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
        queues: u16,
    ) -> Result<(String, Vec<OwnedFd>), TapError> {
        tap::create_numbered(next, uid, gid, queues)
    }
    fn make_persistent(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        tap::set_persistent(fd)
    }
    fn give_tap(&self, fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
        tap::give(fd, uid, gid)
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
    fn bridge_netfilter(&self) -> bool {
        sysctl::bridge_netfilter()
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
