//! One driver per kind of network. The daemon keeps what every network
//! has (its config, its interfaces and their guards, forwards and
//! policies); a driver owns what its kind has of its own, and answers the
//! few questions whose answer depends on the kind: how the network comes
//! up and goes down, what a VM's port is (a TAP on a bridge, a macvtap on a
//! NIC), whose addresses the VMs get (linnet's leases, or the LAN's), and
//! what the network needs of linnet's firewall.
//!
//! - `linnet_bridge`: `shared` and `host`, on a bridge of linnet's.
//! - `lan_bridge`: `bridge`, TAPs on a bridge linnet does not own.
//! - `macvtap`: `bridged`, a macvtap per VM on a host NIC.
//!
//! Each kind's config (`Own`, `BridgeLan`, `MacvtapLan`) implements
//! `NetworkKind` in its driver's file: what the kind is and allows, how it
//! comes up (into its `NetworkDriver`), what `doctor` says of it. The
//! config checks what it can from the file alone; what needs the host
//! (the uplink or bridge exists, the subnet is free) the driver checks as
//! it comes up.
//!
//! A new kind is one variant in the config's `Kind` (or `Lan`) with its
//! type and parsing, and one driver file implementing `NetworkKind` and
//! `NetworkDriver`; `kind` below is the one `match` that names each kind.

mod fabric;
mod lan_bridge;
mod linnet_bridge;
mod macvtap;
mod spares;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;
use std::path::Path;

use async_trait::async_trait;
use tracing::debug;

pub(super) use linnet_bridge::dns_servers;
#[cfg(test)]
pub(super) use spares::SPARES;
pub(super) use spares::Spares;

use super::errors::DaemonError;
use crate::config::{Kind, Lan, NetworkConfig, Own};
use crate::host::firewall::{FirewallNetwork, ForwardRule, InterfacePolicy};
use crate::host::guard::Hook;
use crate::host::seam::{Devices, Host, Links};
use crate::host::{self};
use crate::leases::SharedLeases;
use crate::services::{ServiceCounters, Starter};
use crate::types::MacAddr;

/// What the VMs on a network's other hosts hold, as FRR learned it over
/// EVPN: an attach here takes neither.
#[derive(Debug, Default)]
pub struct Elsewhere {
    /// Their addresses, with their MACs.
    pub addresses: BTreeMap<Ipv4Addr, MacAddr>,
    /// Their MACs, with the VTEP of the host each is behind.
    pub macs: BTreeMap<MacAddr, IpAddr>,
}

/// A network that is up: its config and its driver.
pub(super) struct ActiveNetwork {
    pub config: NetworkConfig,
    pub driver: Box<dyn NetworkDriver>,
    /// Its spare ports, if its ports are TAPs on a bridge of linnet's own
    /// (`keeps_spares`).
    pub spares: Spares,
}

impl ActiveNetwork {
    /// Brings the network up with the driver of its kind. On error nothing
    /// it made is left behind.
    pub async fn bring_up(
        cfg: &NetworkConfig,
        host: &Host,
        services: &dyn Starter,
        lease_dir: &Path,
    ) -> Result<ActiveNetwork, DaemonError> {
        let driver = kind(cfg).bring_up(cfg, host, services, lease_dir).await?;
        Ok(ActiveNetwork {
            config: cfg.clone(),
            driver,
            spares: Spares::default(),
        })
    }

    pub async fn bring_down(self, host: &Host) -> Result<(), DaemonError> {
        // Their TAPs go with their fds, before the bridge they are on.
        self.spares.clear();
        self.driver.bring_down(&self.config, host).await
    }

    /// A VM's port: a spare if the network has one that fits
    /// (`spares`), else one its driver makes.
    pub async fn make_port(&self, host: &Host, req: PortRequest<'_>) -> Result<Port, DaemonError> {
        if req.spare_ok
            && req.queues == 1
            && self.keeps_spares()
            && let Some(spare) = self.spares.take(&*host.devices, req.uid, req.gid)
        {
            return Ok(spare);
        }
        self.driver.make_port(host, req).await
    }

    /// Whether the network can have clones (only linnet's own have): what
    /// it has of its own, for them.
    pub fn check_clones(&self) -> Result<&Own, DaemonError> {
        match self.config.own() {
            Some(own) => Ok(own),
            None => Err(DaemonError::CloneImpossible {
                network: self.config.name.clone(),
                why: format!(
                    "network \"{}\" is a {} network on a LAN, whose DHCP server gave the guest its address: clones are for linnet's own networks (mode: shared or host)",
                    self.config.name,
                    self.config.mode()
                ),
            }),
        }
    }

    /// Makes ready for clones (`check_clones` first). Returns whether its
    /// firewall part changed.
    pub async fn route_clones(&mut self, host: &Host) -> Result<bool, DaemonError> {
        self.check_clones()?;
        self.driver.route_clones(&self.config, host).await
    }

    pub fn bridge(&self) -> Option<(&str, u32)> {
        self.driver.bridge()
    }

    /// Whether it keeps spare ports: on a bridge of linnet's own. Not on a
    /// bridge of someone else's, whose MAC follows its ports' when it was
    /// not set by hand: a spare would change it.
    pub fn keeps_spares(&self) -> bool {
        self.bridge().is_some() && self.config.own().is_some()
    }

    pub fn leases(&self) -> Option<&SharedLeases> {
        self.driver.leases()
    }

    pub fn service_counters(&self) -> Option<&ServiceCounters> {
        self.driver.service_counters()
    }

    pub fn mtu(&self) -> u32 {
        self.driver.mtu()
    }

    pub fn toward_vm(&self) -> TowardVm {
        self.driver.toward_vm()
    }

    /// A VM's address changed: known at attach, learned, replaced, or
    /// gone at detach.
    pub async fn vm_address(
        &self,
        host: &Host,
        mac: MacAddr,
        was: Option<Ipv4Addr>,
        now: Option<Ipv4Addr>,
    ) -> Result<(), DaemonError> {
        self.driver.vm_address(host, mac, was, now).await
    }

    /// Whether a VMM may open the network's ports by name (tap-name).
    pub fn ports_open_by_name(&self) -> bool {
        self.driver.ports_open_by_name()
    }

    /// What VMs on other hosts hold.
    pub async fn elsewhere(&self, host: &Host) -> Result<Elsewhere, DaemonError> {
        self.driver.elsewhere(host).await
    }

    pub fn firewall(
        &self,
        forwards: Vec<ForwardRule>,
        policies: Vec<InterfacePolicy>,
    ) -> Option<FirewallNetwork> {
        self.driver.firewall(forwards, policies)
    }
}

/// What a kind of network is and allows: the questions whose answer
/// depends on the kind, answered by its driver from the config alone, so
/// also while the network is down. The daemon asks these rather than
/// looking at the kind itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Features {
    /// It NATs its VMs out of the host's uplink (`shared`).
    pub nat_uplink: bool,
    /// Where its ports are guarded.
    pub guard_hook: Hook,
}

/// A kind of network as its config says: what it is and allows, how it
/// comes up, what `doctor` says of it. Answered from the config alone, so
/// also while the network is down. Each kind's config type implements it
/// in its driver's file.
#[async_trait]
pub(super) trait NetworkKind: Sync {
    fn features(&self) -> Features;

    /// The link network `network`'s VMs join it through, by name:
    /// linnet's bridge, a bridge of the LAN's, or a NIC.
    fn link(&self, network: &str) -> String;

    /// What `linnet doctor` says of network `network` for its kind.
    fn doctor_notes(&self, _network: &str) -> Vec<String> {
        Vec::new()
    }

    /// Brings network `cfg` up: its driver. On error nothing it made is
    /// left behind.
    async fn bring_up(
        &self,
        cfg: &NetworkConfig,
        host: &Host,
        services: &dyn Starter,
        lease_dir: &Path,
    ) -> Result<Box<dyn NetworkDriver>, DaemonError>;
}

/// The kind of `cfg`'s network: the one place that names every kind.
pub(super) fn kind(cfg: &NetworkConfig) -> &dyn NetworkKind {
    match &cfg.kind {
        Kind::Own(own) => own,
        Kind::Lan(Lan::Bridge(lan)) => lan,
        Kind::Lan(Lan::Macvtap(lan)) => lan,
    }
}

/// What `cfg`'s kind of network is and allows.
pub(super) fn features(cfg: &NetworkConfig) -> Features {
    kind(cfg).features()
}

/// The link its VMs join it through, by name.
pub(super) fn link_of(cfg: &NetworkConfig) -> String {
    kind(cfg).link(&cfg.name)
}

/// What `linnet doctor` says of the kind of `cfg`'s network.
pub(super) fn doctor_notes(cfg: &NetworkConfig) -> Vec<String> {
    kind(cfg).doctor_notes(&cfg.name)
}

/// What each kind of network does its own way once it is up.
#[async_trait]
pub(super) trait NetworkDriver: Send + Sync {
    /// Makes a VM's port: its link (down, on no bridge yet) and the fd its
    /// VMM gets. A TAP unless the kind says otherwise.
    async fn make_port(&self, host: &Host, req: PortRequest<'_>) -> Result<Port, DaemonError> {
        tap_port(host, req).await
    }

    /// The bridge ports join (name, index); None: a port is on the
    /// network as made.
    fn bridge(&self) -> Option<(&str, u32)> {
        None
    }

    /// linnet's leases of the network's addresses; None: the LAN's DHCP
    /// server gives them, and linnet learns them.
    fn leases(&self) -> Option<&SharedLeases> {
        None
    }

    /// What its DHCP and DNS counted; None: it has none of linnet's.
    fn service_counters(&self) -> Option<&ServiceCounters> {
        None
    }

    /// The MTU of the network's ports.
    fn mtu(&self) -> u32;

    /// Which way a frame to the VM passes its port, as a packet socket on
    /// the port sees it.
    fn toward_vm(&self) -> TowardVm;

    /// The address of the VM with MAC `mac` changed: known at attach or
    /// learned (`now`), replaced, or gone with its interface (`now` None).
    async fn vm_address(
        &self,
        _host: &Host,
        _mac: MacAddr,
        _was: Option<Ipv4Addr>,
        _now: Option<Ipv4Addr>,
    ) -> Result<(), DaemonError> {
        Ok(())
    }

    /// What VMs on other hosts hold (a network across hosts: as FRR
    /// learned it from EVPN); nothing elsewhere.
    async fn elsewhere(&self, _host: &Host) -> Result<Elsewhere, DaemonError> {
        Ok(Elsewhere::default())
    }

    /// Whether a VMM may open a port by its name (`--datapath tap-name`):
    /// a TAP's, not a macvtap's (whose device has no name to open).
    fn ports_open_by_name(&self) -> bool {
        true
    }

    /// The network's part of linnet's firewall table, if it has one.
    fn firewall(
        &self,
        _forwards: Vec<ForwardRule>,
        _policies: Vec<InterfacePolicy>,
    ) -> Option<FirewallNetwork> {
        None
    }

    /// Makes the network ready for clones (its kind has them: `Own`);
    /// returns whether its firewall part changed.
    async fn route_clones(
        &mut self,
        _cfg: &NetworkConfig,
        _host: &Host,
    ) -> Result<bool, DaemonError> {
        Ok(false)
    }

    /// Takes down what the driver made; what it found stays as it was.
    async fn bring_down(
        self: Box<Self>,
        cfg: &NetworkConfig,
        host: &Host,
    ) -> Result<(), DaemonError>;
}

/// A VM's port as made: its link, the MAC of the link's host side (which
/// `tap_watch` holds it to), and the fds its VMM gets (one per queue).
pub(super) struct Port {
    pub name: String,
    pub index: u32,
    pub mac: MacAddr,
    pub fds: Vec<OwnedFd>,
}

/// What making a port needs from the daemon.
pub(super) struct PortRequest<'a> {
    /// The VM's MAC.
    pub mac: MacAddr,
    /// Who the port's fd is for.
    pub uid: u32,
    pub gid: u32,
    /// The number in the next port's name.
    pub next: &'a mut u32,
    /// Queues of a TAP (a macvtap has one).
    pub queues: u16,
    /// A root-only directory for device nodes of the moment.
    pub scratch: &'a Path,
    /// Whether a spare may be taken: not for a guarded port while guarded
    /// ports are held (a spare is on its bridge already).
    pub spare_ok: bool,
}

/// Which way a frame to the VM passes its port as a packet socket sees
/// it: a TAP sends it (the host's side transmits to the VM), a macvtap
/// receives it (from the NIC, for the VM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TowardVm {
    Sent,
    Received,
}

impl TowardVm {
    /// A port's counters, `(rx, tx)` as the kernel keeps them, as what its
    /// VM received and what it sent.
    pub fn vm_ways<T>(self, (rx, tx): (T, T)) -> (T, T) {
        match self {
            TowardVm::Sent => (tx, rx),
            TowardVm::Received => (rx, tx),
        }
    }
}

/// A TAP for a VM, owned by its user, with a MAC of linnet's choosing on
/// the host's side: what ports on bridges are.
async fn tap_port(host: &Host, req: PortRequest<'_>) -> Result<Port, DaemonError> {
    let owner = (req.uid, req.gid);
    new_tap_port((&*host.links, &*host.devices), req.next, owner, req.queues).await
}

/// A new TAP owned by `owner` (uid, gid), named from the counter `next`,
/// with `queues` queues: `tap_port`'s, and a spare's (`spares`).
pub(super) async fn new_tap_port(
    (links, devices): (&dyn Links, &dyn Devices),
    next: &mut u32,
    (uid, gid): (u32, u32),
    queues: u16,
) -> Result<Port, DaemonError> {
    let (name, fds) = devices.create_tap(next, uid, gid, queues)?;
    // A bridge port needs no IPv6 of its own: without this the host's
    // end of each TAP would do DAD and MLD into the VM network.
    if let Err(e) = devices.set_link_sysctl("ipv6", &name, "disable_ipv6", "1") {
        debug!(tap = %name, "IPv6 stays on: {e}");
    }
    let index = links
        .link(&name)
        .await?
        .ok_or_else(|| DaemonError::Vanished {
            what: "TAP",
            link: name.clone(),
        })?
        .index;
    // A MAC of linnet's choosing, set before anyone watches it: the
    // kernel's random one is what udev's MACAddressPolicy replaces
    // (systemd 242+ does so for TAPs), which would look like the VMM
    // changing it.
    let mac = host::tap_mac(&name);
    links.set_address(index, mac).await?;
    Ok(Port {
        name,
        index,
        mac,
        fds,
    })
}
