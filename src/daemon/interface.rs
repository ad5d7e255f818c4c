//! What an attached interface is, as plain data: its network, MAC and
//! address, its port, who holds it, what it published, its policy, and a
//! clone's namespace; and what an attach reply says of it.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as SyncMutex};

use tracing::warn;

use super::drivers::{ActiveNetwork, dns_servers};
use super::holder::Holder;
use crate::addr6;
use crate::api::{ForwardOrigin, InterfaceInfo};
use crate::clone::Guest;
use crate::config::NetworkConfig;
use crate::datapath::{Datapath, RelayCounters};
use crate::forward::PortForward;
use crate::host::netns::NetNs;
use crate::host::seam::Devices;
use crate::leases::TakenOver;
use crate::policy::Policy;
use crate::types::{InterfaceId, MacAddr};

pub(super) struct Interface {
    pub(super) network: String,
    pub(super) mac: MacAddr,
    /// None on a network without DHCP when it has no static lease: the
    /// guest sets its own address, which linnet does not know.
    pub(super) ip: Option<Ipv4Addr>,
    /// The name given at attach.
    pub(super) name: Option<String>,
    pub(super) tap: String,
    pub(super) tap_index: u32,
    /// Why its TAP was taken off the network, if it was.
    pub(super) cut_off: Option<String>,
    /// Who holds it, which decides when it goes.
    pub(super) holder: Holder,
    /// The user it was attached for (a kept one's attacher has gone by
    /// design, and it is still theirs).
    pub(super) uid: u32,
    /// The account its budgets are charged to (`Client::account`).
    pub(super) account: u32,
    pub(super) datapath: Datapath,
    pub(super) relay: Option<RelayCounters>,
    pub(super) forwards: Vec<Published>,
    /// Whether it has elements in the guard table.
    pub(super) guarded: bool,
    pub(super) policy: Policy,
    /// A clone's guest and namespace (`requests::clone`): then `mac` and `ip` are
    /// its namespace's on the network (its unique address), and `tap` its
    /// veth port.
    pub(super) as_clone: Option<CloneState>,
    /// What its client re-claims it with after a daemon restart.
    pub(super) token: String,
    /// The MAC linnet gave its port's host side.
    pub(super) port_mac: MacAddr,
    /// IPv6 addresses its VM formed itself, oldest first (`formed6`).
    pub(super) formed6: Vec<std::net::Ipv6Addr>,
}

impl Interface {
    /// Its client's pid (none when kept past its connection).
    pub(super) fn pid(&self) -> Option<i32> {
        self.holder.process().map(|p| p.pid)
    }

    /// Whether it outlives this daemon, for a next one to adopt: not a
    /// clone (its namespace is this daemon's) nor a network socket's (its
    /// relay ends with this daemon).
    pub(super) fn outlives_daemon(&self) -> bool {
        self.as_clone.is_none() && !matches!(self.holder, Holder::NetworkSocket { .. })
    }

    /// Its SLAAC address; none for a clone, whose IPv6 is not NATed.
    pub(super) fn ipv6_address(&self, cfg: &NetworkConfig) -> Option<std::net::Ipv6Addr> {
        cfg.ipv6()
            .filter(|_| self.as_clone.is_none())
            .map(|v6| addr6::slaac_address(v6.prefix, self.mac))
    }
}

/// A forward an attached interface has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Published {
    pub forward: PortForward,
    pub origin: ForwardOrigin,
}

/// What a clone has that other interfaces have not.
pub(super) struct CloneState {
    /// Its namespace's name in the file system, with tap-name.
    pub(super) mount: Option<PathBuf>,
    /// Its guest's DHCP server, in its namespace; stops with the clone.
    pub(super) dhcp: tokio::task::JoinHandle<()>,
    pub(super) guest: Guest,
    /// It holds the guest's address on the network too, with the lease
    /// its VM had (`LeaseTable::take_over`): what it took.
    pub(super) taken_over: Option<TakenOver>,
    /// Holds the namespace while the clone is attached.
    pub(super) ns: NetNs,
    /// Where its namespace's name and TAP are taken away.
    pub(super) devices: Arc<dyn Devices>,
}

impl Drop for CloneState {
    fn drop(&mut self) {
        self.dhcp.abort();
        if let Some(path) = &self.mount
            && let Err(e) = self.devices.unmount_namespace(path)
        {
            warn!(
                "cannot remove a clone's namespace name {}: {e}",
                path.display()
            );
        }
    }
}

impl CloneState {
    /// Deletes its TAP, at detach.
    pub async fn delete_tap(&self) {
        if let Err(e) = self
            .devices
            .delete_clone_tap(&self.ns, self.guest.tap_name())
            .await
        {
            warn!(
                tap = self.guest.tap_name(),
                "cannot delete a clone's TAP: {e}"
            );
        }
    }

    /// Where a VMM's helper (root) finds the namespace, whatever mount
    /// namespace it is in: through the daemon's own root, in which the
    /// name was mounted. (A systemd unit's daemon, or one started by `ip
    /// netns exec`, has a mount namespace of its own, whose mounts the
    /// rest of the host does not see.)
    pub fn netns_path(&self) -> Option<PathBuf> {
        let mount = self.mount.as_ref()?;
        Some(PathBuf::from(format!(
            "/proc/{}/root{}",
            std::process::id(),
            mount.display()
        )))
    }

    /// The guest's address, when the clone holds it on the network.
    pub fn held_address(&self) -> Option<Ipv4Addr> {
        self.taken_over.as_ref().map(|_| self.guest.ip)
    }
}

pub(super) fn interface_info(
    net: &ActiveNetwork,
    id: InterfaceId,
    (mac, ip, name): (MacAddr, Option<Ipv4Addr>, Option<String>),
    tap: &str,
    datapath: Datapath,
    policy: &Policy,
) -> InterfaceInfo {
    let cfg = &net.config;
    let v6 = cfg.ipv6();
    let own = cfg.own();
    let mtu = net.mtu();
    InterfaceInfo {
        vmnet_interface_id: id,
        vmnet_mac_address: mac,
        vmnet_mtu: mtu,
        vmnet_max_packet_size: mtu + 14,
        vmnet_start_address: own.map(|own| own.dhcp.range_start),
        vmnet_end_address: own.map(|own| own.dhcp.range_end),
        vmnet_subnet_mask: own.map(|own| own.subnet.netmask()),
        vmnet_nat66_prefix: v6.filter(|v6| v6.nat66).map(|v6| v6.prefix.network()),
        network: cfg.name.clone(),
        mode: cfg.mode(),
        datapath,
        interface_id: id,
        name,
        mac_address: mac,
        ip_address: ip,
        gateway: own.map(|own| own.gateway),
        dns: own.map(dns_servers).unwrap_or_default(),
        domain: own.map(|own| own.dns.domain.clone()).unwrap_or_default(),
        subnet: own.map(|own| own.subnet),
        ipv6_prefix: v6.map(|v6| v6.prefix),
        ipv6_address: v6.map(|v6| addr6::slaac_address(v6.prefix, mac)),
        gateway6: v6.map(|v6| v6.gateway),
        tap: tap.into(),
        queues: 1,
        mtu,
        forwards: Vec::new(),
        host_loopback: None,
        clone_address: None,
        netns: None,
        policy: policy.clone(),
        warnings: Vec::new(),
    }
}

/// An interface's IPv4 address for logs: "none" without DHCP, and on a
/// LAN until linnet has seen the LAN's DHCP server give it.
pub(super) fn shown_ip(ip: Option<Ipv4Addr>, cfg: &NetworkConfig) -> String {
    match ip {
        Some(ip) => ip.to_string(),
        None if cfg.own().is_none() => "not known yet (the LAN's DHCP server gives it)".into(),
        None => "none (no DHCP)".into(),
    }
}

/// Each attached TAP's MAC as it was at attach, by link index. Shared by
/// the daemon (which records and forgets) and the watch (which compares),
/// so the watch takes the daemon's lock only when a notification differs
/// (the daemon then reads the link as it is now).
#[derive(Clone, Default)]
pub struct TapAddresses(Arc<SyncMutex<HashMap<u32, MacAddr>>>);

impl TapAddresses {
    pub fn record(&self, index: u32, mac: MacAddr) {
        self.0.lock().expect("tap addresses").insert(index, mac);
    }

    pub fn forget(&self, index: u32) {
        self.0.lock().expect("tap addresses").remove(&index);
    }

    /// The MAC recorded for `index` when `now` differs from it.
    pub(super) fn changed(&self, index: u32, now: MacAddr) -> Option<MacAddr> {
        let known = self.0.lock().expect("tap addresses");
        known.get(&index).copied().filter(|&was| was != now)
    }
}
