//! The daemon's state: which networks are up (each with its driver,
//! `drivers`), which interfaces are attached and by whom. Every request is
//! decided here; the kernel is changed through the drivers and `host`. The
//! parts with state of their own keep it in their own structs, which only
//! they change: the guard (`guarding::Guard`), port forwards
//! (`forwards::Forwards`), IP forwarding (`Forwarding`, below), the view of
//! the host (`coexist::HostView`), the leases (each linnet network's
//! driver).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use tracing::{info, warn};

use super::client::Client;
use super::coexist::HostView;
use super::drivers::ActiveNetwork;
use super::errors::DaemonError;
use super::forwarding::{Forwarding, forwarding_needs};
use super::forwards::{self, Forwards};
use super::guarding::{self, Guard};
use super::holder::Holder;
use super::host_ports::HostPorts;
use super::interface::TapAddresses;
use super::interface::{CloneState, Interface, interface_info, shown_ip};
use super::leftovers::Leftovers;
use super::plan::{self, AttachPlan, Done};
use super::policies::{self};
use super::records::Records;
use crate::api::{
    AttachRequest, InterfaceInfo, InterfaceRef, InterfaceStatus, NetworkStatus, Response,
};
use crate::config::Config;
use crate::host::firewall;
use crate::host::guard::PortGuard;
use crate::host::seam::{Host, Links};
use crate::services::{Starter, unix_now};
use crate::types::{self, InterfaceId, MacAddr};

pub struct Daemon {
    pub(super) config: Config,
    /// Where the API socket and the networks' default sockets are.
    pub(super) run_dir: PathBuf,
    pub(super) lease_dir: PathBuf,
    pub(super) state_dir: PathBuf,
    /// The attached interfaces as a next daemon adopts them (`records`).
    pub(super) records: Records,
    /// Every kernel effect goes through it (`host::seam`).
    pub(super) host: Host,
    /// Starts the networks' services (DHCP, DNS, RA).
    pub(super) services: Arc<dyn Starter>,
    pub(super) networks: BTreeMap<String, ActiveNetwork>,
    pub(super) interfaces: BTreeMap<InterfaceId, Interface>,
    /// Port forwards' own state (`forwards`).
    pub(super) forwards: Forwards,
    /// Anti-spoofing and isolation (`guarding`).
    pub(super) guard: Guard,
    /// IP forwarding as linnet changed it.
    pub(super) forwarding: Forwarding,
    /// The other firewalls and the routes, as last looked at.
    pub(super) view: HostView,
    /// Each TAP's MAC at attach, which `tap_watch` compares with.
    pub(super) tap_addresses: TapAddresses,
    /// The number in the next TAP's name.
    pub(super) next_tap: u32,
    /// Counts the addresses learned on LAN networks, for their waiters.
    pub(super) learned: tokio::sync::watch::Sender<u64>,
    /// A rootless daemon's published ports on the host (`host_ports`).
    pub(super) host_ports: Option<HostPorts>,
    /// A rootless daemon's address for the host's loopback, which its
    /// networks with NAT reach through the egress tool.
    pub(super) host_loopback: Option<Ipv4Addr>,
    /// The egress interface whose queue was deepened (`refresh_uplinks`).
    pub(super) egress_tuned: Option<u32>,
}

impl Daemon {
    pub fn new(
        config: Config,
        state_dir: PathBuf,
        run_dir: PathBuf,
        host: Host,
        services: Arc<dyn Starter>,
    ) -> Daemon {
        Daemon {
            config,
            // In the run dir, which lasts until the machine stops, as
            // the TAPs they describe do.
            records: Records::new(&run_dir),
            run_dir,
            lease_dir: state_dir.join("leases"),
            state_dir,
            host,
            services,
            networks: BTreeMap::new(),
            interfaces: BTreeMap::new(),
            forwards: Forwards::default(),
            guard: Guard::default(),
            forwarding: Forwarding::default(),
            view: HostView::default(),
            tap_addresses: TapAddresses::default(),
            next_tap: 0,
            learned: tokio::sync::watch::Sender::new(0),
            host_ports: None,
            host_loopback: None,
            egress_tuned: None,
        }
    }

    /// Whether this is a user's rootless daemon (which publishes ports
    /// through its supervisor).
    pub(super) fn rootless(&self) -> bool {
        self.host_ports.is_some()
    }

    pub fn is_idle(&self) -> bool {
        // A network's socket must be there before its first VM connects.
        self.interfaces.is_empty()
            && self.networks.is_empty()
            && self.config.networks.values().all(|n| n.socket.is_none())
    }

    /// The attached interface a request names, checked against the caller:
    /// its owner or root may change its `what`. None: not attached.
    pub(super) fn interface_named(
        &self,
        client: &Client,
        which: &InterfaceRef,
        what: &str,
    ) -> Result<Option<InterfaceId>, DaemonError> {
        if self.config.network(&which.network).is_none() {
            return Err(self.unknown_network(&which.network));
        }
        let found = match (&which.interface_id, &which.name) {
            (Some(id), None) => self
                .interfaces
                .get_key_value(id)
                .filter(|(_, i)| i.network == which.network)
                .map(|(id, i)| (*id, i)),
            (None, Some(name)) => self.interfaces.iter().find_map(|(id, i)| {
                (i.network == which.network && types::names_match(i.name.as_deref(), name))
                    .then_some((*id, i))
            }),
            _ => {
                return Err(DaemonError::BadRequest(
                    "name the interface with exactly one of --interface-id and --name".into(),
                ));
            }
        };
        let Some((id, iface)) = found else {
            return Ok(None);
        };
        if client.uid != 0 && client.uid != iface.uid {
            return Err(DaemonError::Forbidden(format!(
                "interface {id} belongs to uid {}; only it or root may change its {what}",
                iface.uid
            )));
        }
        Ok(Some(id))
    }

    pub(super) fn no_such_interface(which: &InterfaceRef) -> DaemonError {
        let what = match (&which.interface_id, &which.name) {
            (Some(id), _) => format!("interface {id}"),
            (_, Some(name)) => format!("an interface named \"{name}\""),
            _ => "that interface".into(),
        };
        DaemonError::BadRequest(format!(
            "unknown interface: {what} is not attached to network \"{}\"; `linnet ls` lists the attached interfaces",
            which.network
        ))
    }

    pub(super) fn unknown_network(&self, name: &str) -> DaemonError {
        DaemonError::UnknownNetwork {
            name: name.into(),
            known: self
                .config
                .networks
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            file: self
                .config
                .source
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| crate::config::DEFAULT_CONFIG_PATH.into()),
        }
    }

    /// Records an interface whose attach was carried out, and says what it
    /// is: what the attach reply carries.
    pub(super) fn record_attached(
        &mut self,
        network: &str,
        plan: AttachPlan,
        client: &Client,
        req: &AttachRequest,
        (tap_name, tap_index, port_mac): (String, u32, MacAddr),
        clone: Option<CloneState>,
    ) -> InterfaceInfo {
        let net = &self.networks[network];
        if let Some(leases) = net.leases() {
            leases.changed();
        }
        let id = plan.id;
        let mut info = interface_info(
            net,
            id,
            (plan.mac, plan.ip, plan.name.clone()),
            &tap_name,
            plan.datapath,
            &plan.policy,
        );
        info.warnings = self.network_warnings(network);
        info.host_loopback = self.host_loopback.filter(|_| net.config.nat44);
        if let Some(clone) = &clone {
            // The guest's own, which it was snapshotted with.
            info.mac_address = clone.guest.mac;
            info.vmnet_mac_address = clone.guest.mac;
            info.ip_address = Some(clone.guest.ip);
            info.tap = clone.guest.tap_name().into();
            // Its IPv6 is not NATed: the namespace has none.
            (info.ipv6_address, info.ipv6_prefix, info.gateway6) = (None, None, None);
            info.vmnet_nat66_prefix = None;
            info.clone_address = plan.ip;
            info.netns = clone.netns_path();
            info!(network, interface = %id, guest_ip = %clone.guest.ip, guest_mac = %clone.guest.mac, unique = %shown_ip(plan.ip, &net.config), port = %tap_name, datapath = %plan.datapath, pid = ?client.pid, uid = client.uid, "attached a clone");
        } else {
            info!(network, interface = %id, ip = %shown_ip(plan.ip, &net.config), mac = %plan.mac, tap = %tap_name, datapath = %plan.datapath, pid = ?client.pid, uid = client.uid, "attached");
        }
        self.interfaces.insert(
            id,
            Interface {
                network: network.into(),
                mac: plan.mac,
                ip: plan.ip,
                name: plan.name,
                tap: tap_name,
                tap_index,
                cut_off: None,
                holder: client.holder(req.keep),
                uid: client.uid,
                datapath: plan.datapath,
                relay: None,
                forwards: Vec::new(),
                guarded: plan.guarded,
                policy: plan.policy,
                as_clone: clone,
                token: uuid::Uuid::new_v4().simple().to_string(),
                port_mac,
            },
        );
        info
    }

    /// Undoes the steps of a failed attach, newest first.
    pub(super) async fn undo(&mut self, network: &str, id: InterfaceId, done: Vec<Done>, now: u64) {
        let mut left = Leftovers::default();
        for step in plan::undo_order(done) {
            match step {
                Done::Guard(port) => {
                    let tables = &mut self.host.tables;
                    let unhooked = tables.unhook_guard_ports(std::slice::from_ref(&port));
                    left.note(format_args!("unhook the guard of {}", port.tap), unhooked);
                    let removed = tables.remove_guard_ports(std::slice::from_ref(&port));
                    left.note(format_args!("remove the guard of {}", port.tap), removed);
                }
                // Its fd was dropped with the step that failed: a TAP that is
                // not persistent goes with it; a macvtap is a link of its own.
                Done::Port(index) => {
                    if self.networks[network].bridge().is_none() {
                        let deleted = self.host.links.delete_link(index).await;
                        left.note(format_args!("delete link {index}"), deleted);
                    }
                }
                Done::ClonePort(index) => {
                    let deleted = self.host.links.delete_link(index).await;
                    left.note(format_args!("delete the clone's port {index}"), deleted);
                }
                Done::TookOver(taken) => {
                    if let Some(leases) = self.networks[network].leases() {
                        leases.lock().expect("lease lock").give_back(&taken);
                    }
                }
                Done::Mount(path) => {
                    let unmounted = self.host.devices.unmount_namespace(&path);
                    left.note(format_args!("unmount {}", path.display()), unmounted);
                }
                Done::Lease => {
                    if let Some(leases) = self.networks[network].leases() {
                        leases.lock().expect("lease lock").detach(id, now);
                    }
                }
            }
        }
        // The guard's tables were made for this port, if no other is
        // guarded: they go with it.
        let guarded = self.interfaces.values().any(|i| i.guarded);
        self.guard.remove(&mut *self.host.tables, &[], guarded);
        left.log(&format!(
            "network \"{network}\": undoing the attach of {id}"
        ));
    }

    /// A VMM changed its TAP's MAC (`tap_watch`): the TAP leaves its bridge
    /// and goes down, which also removes the bridge entry the new MAC made.
    /// A notification can be older than the MAC linnet set at attach (the
    /// kernel's first, random one): only the link as it is now counts.
    pub async fn tap_address_changed(&mut self, index: u32, was: MacAddr) {
        let Some(tap) = self
            .interfaces
            .values()
            .find(|i| i.tap_index == index && i.cut_off.is_none())
            .map(|i| i.tap.clone())
        else {
            return;
        };
        let now = match self.host.links.link(&tap).await {
            Ok(Some(link)) if link.index == index => match link.address {
                Some(now) if now != was => now,
                _ => return,
            },
            // Gone, or the name is another link's now: nothing to cut.
            Ok(_) => return,
            Err(e) => {
                warn!(%tap, "cannot read the TAP's MAC: {e}");
                return;
            }
        };
        self.tap_addresses.forget(index);
        let Some((id, iface)) = self
            .interfaces
            .iter_mut()
            .find(|(_, i)| i.tap_index == index)
        else {
            return;
        };
        warn!(network = %iface.network, interface = %id, tap = %iface.tap, pid = ?iface.pid(), uid = iface.uid, %was, %now,
            "the VMM changed its TAP's MAC, which could take another VM's traffic: the TAP is off the network until detached");
        iface.cut_off = Some(format!(
            "its VMM changed the TAP's MAC from {was} to {now}; off the network until detached"
        ));
        if let Err(e) = self.host.links.cut_off(index).await {
            warn!(tap = %iface.tap, "cannot take the TAP off its bridge: {e}");
        }
        let id = *id;
        self.save_record(id);
    }

    /// Whether any interface is kept past its client (`linnet attach`).
    pub fn any_kept(&self) -> bool {
        self.interfaces
            .values()
            .any(|i| matches!(i.holder, Holder::Kept { .. }))
    }

    /// Detaches the kept interfaces (`linnet attach`) on linnet's own
    /// networks whose VM has sent nothing for the network's lease_time (a
    /// DHCP client renews in half of it): the daemon's lease on them has
    /// run out. `stats` is every link's (rx, tx) by index.
    pub async fn expire_kept(&mut self, stats: &BTreeMap<u32, (u64, u64)>) {
        let now = std::time::Instant::now();
        let mut expired = Vec::new();
        for (id, iface) in &mut self.interfaces {
            let (Holder::Kept { rx: seen, since }, Some(net)) =
                (&mut iface.holder, self.networks.get(&iface.network))
            else {
                continue;
            };
            let Some(&(rx, _)) = stats.get(&iface.tap_index) else {
                continue;
            };
            if rx != *seen {
                (*seen, *since) = (rx, now);
            } else if net.leases().is_some()
                && now.duration_since(*since).as_secs() >= u64::from(net.config.dhcp.lease_time)
            {
                info!(network = %iface.network, interface = %id, tap = %iface.tap, lease_time = net.config.dhcp.lease_time, "a kept interface's VM sent nothing for the network's lease_time: detaching it");
                expired.push(*id);
            }
        }
        if !expired.is_empty()
            && let Err(e) = self.detach(&expired).await
        {
            warn!("detaching expired kept interfaces failed: {e}");
        }
    }

    /// A client's connection closed: everything it attached goes, its TAPs
    /// deleted in one go.
    pub async fn client_gone(&mut self, client: u64) {
        let ids: Vec<InterfaceId> = self
            .interfaces
            .iter()
            .filter(|(_, i)| i.holder.is(client))
            .map(|(id, _)| *id)
            .collect();
        if !ids.is_empty() {
            info!(client, interfaces = ids.len(), "client went away");
        }
        if let Err(e) = self.detach(&ids).await {
            warn!(client, "detaching its interfaces failed: {e}");
        }
    }

    /// Deletes the interfaces' TAPs, returns their addresses to the leases
    /// (kept for the network's lease time) and stops networks left unused.
    pub(super) async fn detach(&mut self, ids: &[InterfaceId]) -> Result<(), DaemonError> {
        let gone: Vec<(InterfaceId, Interface)> = ids
            .iter()
            .filter_map(|id| self.interfaces.remove(id).map(|i| (*id, i)))
            .collect();
        // Their published ports go first, so nothing is sent to addresses
        // that are about to be free.
        if gone
            .iter()
            .any(|(_, i)| !i.forwards.is_empty() || !i.policy.is_open())
            && let Err(e) = self.sync_host()
        {
            warn!("removing published ports of detached interfaces failed: {e}");
        }
        for (id, _) in &gone {
            self.records.remove(*id);
        }
        let taps: Vec<u32> = gone.iter().map(|(_, i)| i.tap_index).collect();
        for &index in &taps {
            self.tap_addresses.forget(index);
        }
        let guarded: Vec<PortGuard> = gone.iter().filter_map(|(_, i)| self.guard_of(i)).collect();
        // A macvtap's hook goes before the macvtap does, so the macvtap
        // goes down first: its VMM may still hold the fd.
        let macvtaps = gone.iter().filter(|(_, i)| {
            self.networks
                .get(&i.network)
                .is_some_and(|n| n.bridge().is_none())
        });
        for (_, iface) in macvtaps {
            if let Err(e) = self.host.links.cut_off(iface.tap_index).await {
                warn!(macvtap = %iface.tap, "cannot take the macvtap down before it goes: {e}");
            }
        }
        if let Err(e) = self.host.tables.unhook_guard_ports(&guarded) {
            warn!("removing the hooks of detached macvtaps failed: {e}");
        }
        let deleted = self.host.links.delete_links(&taps).await;
        for clone in gone.iter().filter_map(|(_, i)| i.as_clone.as_ref()) {
            clone.delete_tap().await;
        }
        // A TAP that could not be deleted keeps its guard: its client may
        // still hold the fd.
        if deleted.is_ok() {
            let left = self.interfaces.values().any(|i| i.guarded);
            self.guard.remove(&mut *self.host.tables, &guarded, left);
        }
        if deleted.is_err() {
            let names: Vec<&str> = gone.iter().map(|(_, i)| i.tap.as_str()).collect();
            warn!("some of these TAPs may be left: {}", names.join(" "));
        }
        let now = unix_now();
        let mut networks: Vec<&str> = gone.iter().map(|(_, i)| i.network.as_str()).collect();
        networks.sort_unstable();
        networks.dedup();
        for (id, iface) in &gone {
            let Some(net) = self.networks.get(&iface.network) else {
                continue;
            };
            if let Some(leases) = net.leases() {
                leases.lock().expect("lease lock").detach(*id, now);
            } else if let Err(e) = net.vm_address(&self.host, iface.ip, None).await {
                warn!(network = %iface.network, interface = %id, "{e}");
            }
            info!(network = %iface.network, interface = %id, tap = %iface.tap, "detached");
        }
        for network in networks {
            if let Some(leases) = self.networks.get(network).and_then(|n| n.leases()) {
                leases.changed();
            }
            self.release_network_if_unused(network).await;
        }
        if gone.len() >= MANY_AT_ONCE {
            // Removing many guards at once has nftables build and parse a
            // large batch; hand that memory back rather than keep it.
            // SAFETY: malloc_trim only releases free heap memory.
            unsafe { libc::malloc_trim(0) };
        }
        deleted.map_err(Into::into)
    }

    pub fn list(
        &self,
        stats: &BTreeMap<u32, (u64, u64)>,
        drops: &BTreeMap<String, u64>,
    ) -> Response {
        let networks = self
            .config
            .networks
            .values()
            .map(|cfg| NetworkStatus {
                name: cfg.name.clone(),
                mode: cfg.mode,
                subnet: cfg.lan.is_none().then_some(cfg.subnet),
                gateway: cfg.lan.is_none().then_some(cfg.gateway),
                lan: cfg.lan.as_ref().map(|lan| lan.link().to_string()),
                ipv6_prefix: cfg.ipv6.as_ref().map(|v6| v6.prefix),
                bridge: self
                    .networks
                    .get(&cfg.name)
                    .and_then(|n| n.bridge())
                    .map(|(name, _)| name.to_string()),
                interfaces: self
                    .interfaces
                    .values()
                    .filter(|i| i.network == cfg.name)
                    .count(),
                persistent: cfg.persistent,
                socket: cfg
                    .socket
                    .as_ref()
                    .map(|s| s.path(&cfg.name, &self.run_dir)),
                warnings: self.network_warnings(&cfg.name),
            })
            .collect();
        let interfaces = self
            .interfaces
            .iter()
            .map(|(id, i)| {
                let (rx, tx) = stats.get(&i.tap_index).copied().unwrap_or_default();
                let cfg = self.config.network(&i.network).expect("attached");
                let guest = i.as_clone.as_ref().map(|c| &c.guest);
                InterfaceStatus {
                    interface_id: *id,
                    name: i.name.clone(),
                    network: i.network.clone(),
                    mac_address: guest.map_or(i.mac, |g| g.mac),
                    ip_address: guest.map_or(i.ip, |g| Some(g.ip)),
                    ipv6_address: i.ipv6_address(cfg),
                    tap: i.tap.clone(),
                    forwards: i.forwards.iter().map(|p| p.forward).collect(),
                    client_pid: i.pid(),
                    client_uid: i.uid,
                    datapath: i.datapath,
                    relay: i.relay,
                    // The TAP's tx is what the VM received.
                    vm_rx_bytes: tx,
                    vm_tx_bytes: rx,
                    policy: i.policy.clone(),
                    spoofed_drops: if i.guarded && cfg.anti_spoofing {
                        Some(drops.get(&i.tap).copied().unwrap_or(0))
                    } else {
                        None
                    },
                    cut_off: i.cut_off.clone(),
                    clone_address: i.ip.filter(|_| guest.is_some()),
                    netns: i.as_clone.as_ref().and_then(|c| c.netns_path()),
                }
            })
            .collect();
        Response::Listing {
            networks,
            interfaces,
        }
    }

    /// Removes every interface and network; leases stay on disk.
    pub async fn shutdown(&mut self) {
        let ids: Vec<InterfaceId> = self.interfaces.keys().copied().collect();
        if let Err(e) = self.detach(&ids).await {
            warn!("detaching the interfaces failed: {e}");
        }
        let names: Vec<String> = self.networks.keys().cloned().collect();
        for name in names {
            if let Some(net) = self.networks.remove(&name)
                && let Err(e) = net.bring_down(&self.host).await
            {
                warn!(network = %name, "bring down failed: {e}");
            }
        }
        if let Err(e) = self.sync_host() {
            warn!("cleaning up the firewall failed: {e}");
        }
        if let Err(e) = self.host.tables.remove_guard() {
            warn!("cleaning up the guard table failed: {e}");
        }
        self.clear_docker_user();
    }

    pub(super) async fn ensure_network(&mut self, name: &str) -> Result<(), DaemonError> {
        if self.networks.contains_key(name) {
            return Ok(());
        }
        let cfg = self
            .config
            .network(name)
            .expect("checked by caller")
            .clone();
        let net =
            ActiveNetwork::bring_up(&cfg, &self.host, &*self.services, &self.lease_dir).await?;
        self.networks.insert(name.into(), net);
        if let Err(e) = self.sync_host() {
            if let Some(net) = self.networks.remove(name) {
                let _ = net.bring_down(&self.host).await;
            }
            let _ = self.sync_host();
            return Err(e);
        }
        self.refresh_uplinks().await;
        self.check_host();
        Ok(())
    }

    pub(super) async fn release_network_if_unused(&mut self, name: &str) {
        let in_use = self.interfaces.values().any(|i| i.network == name);
        let persistent = self.networks.get(name).is_some_and(|n| n.config.persistent);
        if in_use || persistent {
            return;
        }
        if let Some(net) = self.networks.remove(name) {
            if let Err(e) = net.bring_down(&self.host).await {
                warn!(network = %name, "bring down failed: {e}");
            }
            if let Err(e) = self.sync_host() {
                warn!("updating the firewall failed: {e}");
            }
            self.check_host();
        }
    }

    /// Makes the firewall table and the forwarding sysctls match the active
    /// networks and their interfaces' forwards.
    pub(super) fn sync_host(&mut self) -> Result<(), DaemonError> {
        let rules = self.firewall_networks();
        let (needs4, needs6) = forwarding_needs(&rules);
        self.forwarding
            .turn_on(&*self.host.devices, needs4, needs6)?;
        self.host.tables.apply_firewall(&rules)?;
        if let Some(ports) = &mut self.host_ports {
            let forwards: Vec<firewall::ForwardRule> = rules
                .iter()
                .flat_map(|n| n.forwards.iter().cloned())
                .collect();
            ports.sync(&forwards);
        }
        self.check_shadowed_forwards();
        self.forwarding
            .turn_off_unneeded(&*self.host.devices, needs4, needs6);
        Ok(())
    }
}

/// How many interfaces leaving at once make the daemon give freed memory
/// back to the system.
const MANY_AT_ONCE: usize = 16;

impl Daemon {
    pub(super) fn forwarding_needs(&self) -> (bool, bool) {
        forwarding_needs(&self.firewall_networks())
    }

    /// Looks for host services listening on published ports (`forwards`).
    pub fn check_shadowed_forwards(&mut self) {
        self.forwards.check_shadowed(&self.interfaces);
    }

    /// Whether any network up has a part in linnet's firewall table.
    pub(super) fn has_firewall(&self) -> bool {
        self.networks.values().any(|n| n.config.lan.is_none())
    }

    pub(super) fn firewall_networks(&self) -> Vec<firewall::FirewallNetwork> {
        self.networks
            .values()
            .filter_map(|n| {
                n.firewall(
                    forwards::rules(&n.config, self.interfaces.values()),
                    policies::interface_policies(&n.config, self.interfaces.values()),
                )
            })
            .collect()
    }
}

/// Every link's byte counters (rx, tx) by index, for `list`.
pub async fn link_stats(netlink: &dyn Links) -> BTreeMap<u32, (u64, u64)> {
    match netlink.links().await {
        Ok(links) => links
            .into_iter()
            .map(|l| (l.index, (l.rx_bytes, l.tx_bytes)))
            .collect(),
        Err(e) => {
            warn!("cannot read link counters: {e}");
            BTreeMap::new()
        }
    }
}

impl Daemon {
    /// Frames dropped by each guarded TAP's rules so far.
    pub fn guard_drops(&mut self) -> BTreeMap<String, u64> {
        self.guard.drops(&mut *self.host.tables)
    }
    /// Logs, per interface, the frames its VM had dropped since the last
    /// report: called every few seconds, so a flood is one line per period.
    pub fn report_drops(&mut self) {
        let drops = self.guard_drops();
        for (id, iface) in &self.interfaces {
            let (Some(&now), Some(cfg)) =
                (drops.get(&iface.tap), self.config.network(&iface.network))
            else {
                continue;
            };
            if let Some(dropped) = self.guard.newly_dropped(&iface.tap, now) {
                warn!(network = %iface.network, interface = %id, tap = %iface.tap, ip = %shown_ip(iface.ip, cfg), mac = %iface.mac, dropped, total = now, "dropped frames from the VM that anti_spoofing forbids (another MAC or address, a DHCP server, a router advertisement, ...); `linnet ls` counts them");
            }
        }
    }
    /// The guard of every guarded interface.
    pub(super) fn guarded_ports(&self) -> Vec<PortGuard> {
        self.interfaces
            .values()
            .filter_map(|i| self.guard_of(i))
            .collect()
    }
    /// An interface's guard, if it has one.
    pub(super) fn guard_of(&self, i: &Interface) -> Option<PortGuard> {
        guarding::guard_of(self.config.network(&i.network)?, i)
    }
}
