//! The daemon's state and its core. The state: which networks are up
//! (each with its driver, `drivers`), which interfaces are attached and
//! who holds them (and which are detaching, their links deleted without
//! the lock: `teardown`), and the parts with state of their own, which only they
//! change: the guard (`guarding::Guard`), port forwards
//! (`forwards::Forwards`), IP forwarding (`forwarding::Forwarding`), the
//! view of the host (`coexist::HostView`), the leases (each linnet
//! network's driver). Every kernel effect goes through the host seam
//! (`host::seam`).
//!
//! The core is what every request shares and what calls itself: networks
//! brought up and down, linnet's tables made to match the state
//! (`sync_host`), interfaces detached, an attach undone, records saved, and
//! the host looked at again and repaired (`check_host`). The requests
//! (`requests/`), start-up and stop (`adoption`) and the watches sit above
//! it; nothing here calls up to them (`scripts/check-layers` checks).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use tracing::{debug, error, info, warn};

use super::apply::{Apply, Carried, Making};
use super::client::Client;
use super::coexist::{GUARD_RETRY, HostView, firewalls, warnings};
use super::drivers::{self, ActiveNetwork};
use super::errors::DaemonError;
use super::forwarding::{Forwarding, forwarding_needs};
use super::forwards::{self, Forwards};
use super::guarding::{self, Guard, Restore};
use super::holder::Holder;
use super::host_ports::HostPorts;
use super::interface::{CloneState, Interface, TapAddresses, interface_info, shown_ip};
use super::leftovers::Leftovers;
use super::plan::{AttachPlan, Done};
use super::policies;
use super::records::{InterfaceRecord, Records};
use super::secrets::Secrets;
use super::teardown::Teardown;
use crate::api::{AttachRequest, ForwardOrigin, InterfaceInfo, InterfaceRef};
use crate::config::Config;
use crate::events::{Bus, What};
use crate::host::guard::{self, Hook, PortGuard};
use crate::host::ruleset::{Ruleset, Shape};
use crate::host::seam::{Host, Links};
use crate::host::{FABRIC_TABLE, NFT_TABLE, docker_user, firewall};
use crate::services::name_gate::{NameGate, NamedVm};
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
    /// What VMs with names in their policy may ask linnet's DNS, and
    /// what they learned (shared with the DNS services).
    pub(super) names: Arc<NameGate>,
    /// What happens, for `linnet events` (shared with the services).
    pub(super) events: Bus,
    /// Connections each VM's egress policy refused, by TAP, as last read:
    /// the firewall's counters start there when the table is made anew.
    pub(super) refused: BTreeMap<String, u64>,
    pub(super) networks: BTreeMap<String, ActiveNetwork>,
    pub(super) interfaces: BTreeMap<InterfaceId, Interface>,
    /// Interfaces whose links are being deleted outside the lock
    /// (`teardown`): what they hold stays theirs until then.
    pub(super) detaching: BTreeMap<InterfaceId, Interface>,
    /// The detaching macvtaps whose guard hooks are gone already (taken
    /// down first): the guard linnet expects, and puts back, has none for
    /// them.
    pub(super) unhooked: BTreeSet<InterfaceId>,
    /// A step of a detach or teardown failed: what it left goes at the
    /// next `tidy`.
    pub(super) untidy: bool,
    /// Told when a detach ends, to the attaches that wait for it.
    pub(super) detached: Arc<tokio::sync::Notify>,
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
    /// The name check's process and queue (`gatekeeper`), for its counts.
    pub(super) gatekeeper: Option<Arc<super::gatekeeper::Gatekeeper>>,
    /// The networks' secrets proxies (`secret_proxies`); None where they
    /// cannot run (then a VM's placeholders go out as written).
    pub(super) secret_proxies: Option<Arc<super::secret_proxies::SecretProxies>>,
    /// The egress interface whose queue was deepened (`refresh_uplinks`).
    pub(super) egress_tuned: Option<u32>,
    /// Told after an attach, to the maker of spare ports (`spares`).
    pub(super) spares_wanted: Arc<tokio::sync::Notify>,
    /// The secrets VMs use without holding them (`secrets`).
    pub(super) secrets: Secrets,
}

impl Daemon {
    pub fn new(
        config: Config,
        state_dir: PathBuf,
        run_dir: PathBuf,
        host: Host,
        services: Arc<dyn Starter>,
        names: Arc<NameGate>,
        events: Bus,
    ) -> Daemon {
        let secrets = Secrets::load(&state_dir);
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
            names,
            events,
            refused: BTreeMap::new(),
            networks: BTreeMap::new(),
            interfaces: BTreeMap::new(),
            detaching: BTreeMap::new(),
            unhooked: BTreeSet::new(),
            untidy: false,
            detached: Arc::default(),
            forwards: Forwards::default(),
            guard: Guard::default(),
            forwarding: Forwarding::default(),
            view: HostView::default(),
            tap_addresses: TapAddresses::default(),
            next_tap: 0,
            learned: tokio::sync::watch::Sender::new(0),
            host_ports: None,
            host_loopback: None,
            gatekeeper: None,
            secret_proxies: None,
            egress_tuned: None,
            spares_wanted: Arc::default(),
            secrets,
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
    /// its owner or root may `what` ("change its policy"). None: not attached.
    pub(super) fn interface_named(
        &self,
        client: &Client,
        which: &InterfaceRef,
        what: &'static str,
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
                return Err(DaemonError::WhichInterface);
            }
        };
        let Some((id, iface)) = found else {
            return Ok(None);
        };
        if client.uid != 0 && client.uid != iface.uid {
            return Err(DaemonError::NotOwner {
                id,
                owner: iface.uid,
                what,
            });
        }
        Ok(Some(id))
    }

    pub(super) fn no_such_interface(which: &InterfaceRef) -> DaemonError {
        let what = match (&which.interface_id, &which.name) {
            (Some(id), _) => format!("interface {id}"),
            (_, Some(name)) => format!("an interface named \"{name}\""),
            _ => "that interface".into(),
        };
        DaemonError::NotAttached {
            which: what,
            network: Some(which.network.clone()),
        }
    }

    pub(super) fn unknown_network(&self, name: &str) -> DaemonError {
        DaemonError::unknown_network(&self.config, name)
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
        if net.keeps_spares() && net.spares.wanted() > 0 {
            self.spares_wanted.notify_one();
        }
        info.queues = plan.queues;
        info.host_loopback =
            (self.host_loopback).filter(|_| net.config.own().is_some_and(|own| own.nat44));
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
        self.events.emit(
            Some(network),
            What::Attached {
                interface_id: id,
                name: plan.name.clone(),
                mac_address: info.mac_address,
                ip_address: info.ip_address,
                tap: info.tap.clone(),
                datapath: plan.datapath,
                uid: client.uid,
            },
        );
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
                account: client.account,
                datapath: plan.datapath,
                relay: None,
                forwards: Vec::new(),
                guarded: plan.guarded,
                policy: plan.policy,
                as_clone: clone,
                token: uuid::Uuid::new_v4().simple().to_string(),
                port_mac,
                formed6: Vec::new(),
            },
        );
        info
    }

    /// Carries out `plan`'s steps on `network` (`apply`), with `done`
    /// what was done already (its lease), and undoes all of it if a step
    /// fails.
    pub(super) async fn carry_out(
        &mut self,
        network: &str,
        plan: &AttachPlan,
        client: &Client,
        mut done: Vec<Done>,
    ) -> Result<Carried, DaemonError> {
        let guarded_left = self.any_guarded();
        let scratch = self.run_dir.join("devices");
        let mut apply = Apply {
            host: &mut self.host,
            guard: &mut self.guard,
            network: &self.networks[network],
        };
        let who = Making {
            uid: client.uid,
            gid: client.gid,
            next_tap: &mut self.next_tap,
            scratch: &scratch,
            services: &*self.services,
        };
        match apply.apply(plan, who, &mut done).await {
            Ok(carried) => Ok(carried),
            Err(e) => {
                apply.undo(plan.id, done, guarded_left).await;
                Err(e)
            }
        }
    }

    /// Deletes the interfaces' TAPs, returns their addresses to the leases
    /// (kept for the network's lease time) and stops networks left unused:
    /// all of it under the lock, for the daemon's own detaches (undoing,
    /// expiry, adoption, stop). A client's goes through `teardown`.
    pub(super) async fn detach(&mut self, ids: &[InterfaceId]) -> Result<(), DaemonError> {
        let teardown = self.begin_detach(ids);
        self.run_teardown(teardown).await
    }

    /// The rest of a detach begun with `begin_detach`, under the lock.
    pub(super) async fn run_teardown(&mut self, mut teardown: Teardown) -> Result<(), DaemonError> {
        if teardown.has_macvtaps() {
            teardown.cut_off().await;
            self.unhook_detaching(&teardown);
        }
        teardown.delete().await;
        self.finish_detach(teardown).await
    }

    /// The first step of a detach (`teardown`): the interfaces are taken
    /// out of the attached ones and their published ports go first, so
    /// nothing is sent to addresses that are about to be free. Until
    /// `finish_detach` they are detaching: they hold their leases, ids,
    /// names, MACs and guard, and keep their network up.
    pub(super) fn begin_detach(&mut self, ids: &[InterfaceId]) -> Teardown {
        let mut teardown = Teardown::new(self.host.links.clone());
        let mut published = false;
        for id in ids {
            let Some(mut iface) = self.interfaces.remove(id) else {
                continue;
            };
            published |= !iface.forwards.is_empty() || !iface.policy.is_open();
            self.records.remove(*id);
            self.tap_addresses.forget(iface.tap_index);
            let macvtap = (self.networks.get(&iface.network)).is_some_and(|n| n.bridge().is_none());
            let link = (iface.tap_index, iface.tap.as_str());
            teardown.add(*id, link, macvtap, iface.as_clone.take());
            self.detaching.insert(*id, iface);
        }
        if published && let Err(e) = self.sync_host() {
            warn!("removing published ports of detached interfaces failed: {e}");
            self.untidy = true;
        }
        teardown
    }

    /// Between taking the macvtaps down and deleting them: their hooks go
    /// while the devices are there.
    pub(super) fn unhook_detaching(&mut self, teardown: &Teardown) {
        let guarded = self.detaching_guards(teardown);
        if let Err(e) = self.host.tables.unhook_guard_ports(&guarded) {
            warn!("removing the hooks of detached macvtaps failed: {e}");
            self.untidy = true;
        }
        // Whether or not that worked: a look at the tables before the
        // detach ends must not take a hook missing for damage.
        let hooked: Vec<InterfaceId> = (teardown.ids.iter())
            .filter(|id| {
                (self.detaching.get(id))
                    .and_then(|i| self.guard_of(i))
                    .is_some_and(|p| p.hook == Hook::Egress)
            })
            .copied()
            .collect();
        self.unhooked.extend(hooked);
    }

    fn detaching_guards(&self, teardown: &Teardown) -> Vec<PortGuard> {
        (teardown.ids.iter())
            .filter_map(|id| self.guard_of(self.detaching.get(id)?))
            .collect()
    }

    /// The last step of a detach, its links deleted: their guard goes, their
    /// leases are given back, and networks left unused go down.
    pub(super) async fn finish_detach(&mut self, teardown: Teardown) -> Result<(), DaemonError> {
        let guarded = self.detaching_guards(&teardown);
        let gone: Vec<(InterfaceId, Interface)> = (teardown.ids.iter())
            .filter_map(|id| self.detaching.remove(id).map(|i| (*id, i)))
            .collect();
        for (id, _) in &gone {
            self.unhooked.remove(id);
        }
        let Teardown { deleted, .. } = teardown;
        // A TAP that could not be deleted keeps its guard: its client may
        // still hold the fd.
        match &deleted {
            Ok(()) => {
                let left = self.any_guarded();
                if !self.guard.remove(&mut *self.host.tables, &guarded, left) {
                    self.untidy = true;
                }
            }
            Err(_) => {
                let names: Vec<&str> = gone.iter().map(|(_, i)| i.tap.as_str()).collect();
                warn!(
                    "some of these TAPs may be left (removed at the next tidy-up): {}",
                    names.join(" ")
                );
                self.untidy = true;
            }
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
            }
            if let Err(e) = net.vm_address(&self.host, iface.mac, iface.ip, None).await {
                warn!(network = %iface.network, interface = %id, "{e}");
            }
            info!(network = %iface.network, interface = %id, tap = %iface.tap, "detached");
            self.events.emit(
                Some(&iface.network),
                What::Detached {
                    interface_id: *id,
                    name: iface.name.clone(),
                    tap: iface.tap.clone(),
                },
            );
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
        self.detached.notify_waiters();
        deleted.map_err(Into::into)
    }

    /// Whether an attach asks for what a detaching interface still holds
    /// (its id, its name on its network, its MAC): it waits for the detach
    /// to end (`detached`) rather than fail or take it half-freed.
    pub fn waits_for_detach(&self, req: &AttachRequest) -> bool {
        let network = req
            .network
            .as_deref()
            .unwrap_or(crate::config::DEFAULT_NETWORK);
        self.detaching.iter().any(|(id, i)| {
            req.interface_id == Some(*id)
                || req.mac == Some(i.mac)
                || (i.network == network
                    && req
                        .name
                        .as_deref()
                        .is_some_and(|n| types::names_match(i.name.as_deref(), n)))
        })
    }

    /// Whether any interface, attached or detaching, is guarded.
    pub(super) fn any_guarded(&self) -> bool {
        (self.interfaces.values().chain(self.detaching.values()))
            .any(|i| i.guarded || !i.policy.rate_limit.is_none())
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
            let mut left = Leftovers::default();
            if let Some(net) = self.networks.remove(name) {
                left.note("take the network down", net.bring_down(&self.host).await);
            }
            left.note("put linnet's tables back", self.sync_host());
            left.log(&format!("network \"{name}\": undoing a bring-up"));
            return Err(e);
        }
        self.refresh_uplinks().await;
        self.check_host();
        self.events.emit(Some(name), What::NetworkUp);
        Ok(())
    }

    pub(super) async fn release_network_if_unused(&mut self, name: &str) {
        let in_use =
            (self.interfaces.values().chain(self.detaching.values())).any(|i| i.network == name);
        let persistent = self.networks.get(name).is_some_and(|n| n.config.persistent);
        if in_use || persistent {
            return;
        }
        if let Some(net) = self.networks.remove(name) {
            if let Err(e) = net.bring_down(&self.host).await {
                warn!(network = %name, "bring down failed: {e}");
                self.untidy = true;
            }
            self.events.emit(Some(name), What::NetworkDown);
            if let Err(e) = self.sync_host() {
                warn!("updating the firewall failed: {e}");
                self.untidy = true;
            }
            self.check_host();
        }
    }

    /// Makes the firewall table and the forwarding sysctls match the active
    /// networks and their interfaces' forwards.
    pub(super) fn sync_host(&mut self) -> Result<(), DaemonError> {
        self.names.follow(self.named_vms());
        self.sync_secret_proxies();
        self.policy_refusals();
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
        if !self
            .forwarding
            .turn_off_unneeded(&*self.host.devices, needs4, needs6)
        {
            self.untidy = true;
        }
        Ok(())
    }

    pub(super) fn forwarding_needs(&self) -> (bool, bool) {
        forwarding_needs(&self.firewall_networks())
    }

    /// Looks for host services listening on published ports (`forwards`).
    pub fn check_shadowed_forwards(&mut self) {
        self.forwards.check_shadowed(&self.interfaces);
    }

    /// Whether any network up has a part in linnet's firewall table.
    pub(super) fn has_firewall(&self) -> bool {
        self.networks.values().any(|n| n.config.own().is_some())
    }

    pub(super) fn firewall_networks(&self) -> Vec<firewall::FirewallNetwork> {
        self.networks
            .values()
            .filter_map(|n| {
                let mut rules = n.firewall(
                    forwards::rules(&n.config, self.interfaces.values()),
                    policies::interface_policies(
                        &n.config,
                        self.interfaces.values(),
                        &self.names,
                        &self.refused,
                    ),
                )?;
                rules.secrets_port =
                    (self.secret_proxies.as_ref()).and_then(|p| p.port(&n.config.name));
                Some(rules)
            })
            .collect()
    }

    /// Tells the secrets proxies the networks' VMs with secret rules and
    /// their grants now (starting or stopping proxies as networks gain or
    /// lose such VMs).
    pub(super) fn sync_secret_proxies(&mut self) {
        let Some(proxies) = self.secret_proxies.clone() else {
            return;
        };
        let wanted = policies::proxied_networks(
            self.networks.values().map(|n| &n.config),
            &self.interfaces,
            &self.secrets,
        );
        for (network, why) in proxies.sync(wanted) {
            error!(
                network,
                "the network's secrets proxy cannot run: {why}; its VMs' placeholders go out as they wrote them"
            );
        }
    }

    /// Connections each VM's egress policy refused so far, by TAP: read
    /// from the firewall's counters (kept when they cannot be read, as
    /// after `nft flush ruleset`), for VMs attached with one.
    pub(super) fn policy_refusals(&mut self) -> &BTreeMap<String, u64> {
        let policed: BTreeSet<&str> = (self.interfaces.values())
            .filter(|i| !i.policy.egress.is_empty())
            .map(|i| i.tap.as_str())
            .collect();
        if !policed.is_empty() {
            match self.host.tables.policy_refusals() {
                Ok(now) => {
                    for (tap, n) in now {
                        let kept = self.refused.entry(tap).or_default();
                        *kept = (*kept).max(n);
                    }
                }
                Err(e) => debug!("cannot read the policies' counters: {e}"),
            }
        }
        self.refused.retain(|tap, _| policed.contains(tap.as_str()));
        &self.refused
    }

    /// The VMs with names in their policy, for the name gate.
    pub(super) fn named_vms(&self) -> Vec<NamedVm> {
        (self.networks.values())
            .flat_map(|n| policies::named_vms(&n.config, self.interfaces.iter()))
            .collect()
    }

    /// Frames dropped by each guarded TAP's rules so far.
    pub fn guard_drops(&mut self) -> BTreeMap<String, u64> {
        self.guard.drops(&mut *self.host.tables)
    }

    /// Frames each rate-limited port's limits dropped so far.
    pub(super) fn rate_drops(&mut self) -> crate::host::guard::RateDrops {
        self.guard.rate_drops(&mut *self.host.tables)
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
    /// The guard of every guarded interface, as linnet's tables should
    /// have it now: without the detaching macvtaps already unhooked (taken
    /// down, their links about to go).
    pub(super) fn guarded_ports(&self) -> Vec<PortGuard> {
        let detaching = (self.detaching.iter()).filter(|(id, _)| !self.unhooked.contains(id));
        (self.interfaces.values().chain(detaching.map(|(_, i)| i)))
            .filter_map(|i| self.guard_of(i))
            .collect()
    }
    /// An interface's guard, if it has one.
    pub(super) fn guard_of(&self, i: &Interface) -> Option<PortGuard> {
        guarding::guard_of(self.config.network(&i.network)?, i)
    }

    /// Writes interface `id`'s record, if it outlives the daemon (not a
    /// clone's, nor any of a rootless daemon, whose namespace ends with it).
    pub(super) fn save_record(&self, id: InterfaceId) {
        if self.rootless() {
            return;
        }
        let Some(i) = self.interfaces.get(&id).filter(|i| i.outlives_daemon()) else {
            return;
        };
        let record = InterfaceRecord {
            interface_id: id,
            network: i.network.clone(),
            mode: self.config.network(&i.network).expect("attached").mode(),
            mac: i.mac,
            ip: i.ip,
            name: i.name.clone(),
            port: i.tap.clone(),
            port_index: i.tap_index,
            port_mac: i.port_mac,
            uid: i.uid,
            kept: matches!(i.holder, Holder::Kept { .. }),
            client: i.holder.process(),
            datapath: i.datapath,
            policy: i.policy.clone(),
            publish: i
                .forwards
                .iter()
                .filter(|p| p.origin == ForwardOrigin::Publish)
                .map(|p| p.forward)
                .collect(),
            token: i.token.clone(),
            cut_off: i.cut_off.clone(),
            formed6: i.formed6.clone(),
        };
        if let Err(e) = self.records.save(&record) {
            warn!(network = %i.network, interface = %id, "cannot write the interface's record: {e}; a daemon restart would cut its VM off");
        }
    }

    /// Re-reads the default routes (`coexist`).
    pub async fn refresh_uplinks(&mut self) {
        let shared = |ipv6: bool| {
            self.networks.values().any(|n| {
                drivers::features(&n.config).nat_uplink && (!ipv6 || n.config.ipv6().is_some())
            })
        };
        let up = (!self.networks.is_empty(), shared(false), shared(true));
        let tuned = self
            .host_loopback
            .is_some()
            .then_some(&mut self.egress_tuned);
        self.view
            .refresh_uplinks(&*self.host.links, tuned, up)
            .await;
    }

    /// The warnings for one network (empty while it is down).
    pub(super) fn network_warnings(&self, network: &str) -> Vec<String> {
        let mut out = self.view.warnings(network);
        out.extend(self.forwards.shadow_warnings(network));
        out
    }

    /// Looks at the namespace's firewalls: puts back linnet's own tables if
    /// they are gone, keeps its DOCKER-USER rules in place, and records
    /// (and logs, when it changes) what blocks each active network.
    pub fn check_host(&mut self) {
        let mut errors = Vec::new();
        let mut rs = match self.host.tables.ruleset() {
            Ok(rs) => rs,
            Err(e) => {
                warn!("cannot read the nftables ruleset: {e}");
                errors.push(format!("nftables: {e}"));
                Ruleset::default()
            }
        };
        // After a repair, read again: the checks see what is now there.
        if errors.is_empty()
            && self.restore_tables()
            && let Ok(again) = self.host.tables.ruleset()
        {
            rs = again;
        }
        if errors.is_empty()
            && self.sync_docker_user(&rs)
            && let Ok(again) = self.host.tables.ruleset()
        {
            rs = again;
        }
        let legacy = self.host.tables.legacy_chains().unwrap_or_else(|e| {
            errors.push(format!("legacy iptables: {e}"));
            Vec::new()
        });
        self.restore_forwarding();
        // Networks on a LAN have nothing in linnet's tables to check.
        let names: Vec<String> = self
            .networks
            .values()
            .filter(|n| n.config.own().is_some())
            .map(|n| n.config.name.clone())
            .collect();
        let mut checks = BTreeMap::new();
        for name in names {
            let cfg = &self.networks[&name].config;
            let Some(own) = cfg.own() else { continue };
            let nat_uplink = drivers::features(cfg).nat_uplink;
            let found = self.view.network_checks(
                &rs,
                &legacy,
                (&name, own, nat_uplink),
                self.host.devices.bridge_netfilter(),
            );
            let old = self
                .view
                .checks
                .get(&name)
                .map(|c| warnings(c))
                .unwrap_or_default();
            let new = warnings(&found);
            for w in new.iter().filter(|w| !old.contains(w)) {
                warn!(network = %name, "{w}");
            }
            if !old.is_empty() && new.is_empty() {
                info!(network = %name, "nothing blocks the network's traffic any more");
            }
            checks.insert(name, found);
        }
        self.view.checks = checks;
        self.view.docker_chain = docker_user::present(&rs);
        self.view.docker_rules = docker_user::tagged(&rs);
        self.view.firewalls = firewalls(&rs, &legacy);
        self.view.errors = errors;
    }
    /// Whether `inet linnet` or `bridge linnet` is gone or lost rules
    /// while linnet needs it.
    /// One that cannot even be read counts as damaged: held ports fail
    /// closed.
    pub(super) fn own_tables_damaged(&mut self) -> bool {
        let unreliable = self.view.shapes_unreliable;
        let inet_shape = firewall::shape(&self.firewall_networks());
        let has_firewall = self.has_firewall();
        let mut damaged =
            |family: &str, expected: Option<&Shape>| match self.host.tables.linnet_shape(family) {
                Ok(Some(actual)) => expected.is_some_and(|e| *e != actual),
                Ok(None) | Err(_) => true,
            };
        let inet = has_firewall && damaged("inet", (!unreliable).then_some(&inet_shape));
        let expected = guard::expected_shape().filter(|_| !unreliable);
        inet || (self.guard.ready() && damaged("bridge", expected))
            || self.egress_damage().is_some()
            || self.fabric_damage().is_some()
    }
    /// Puts back `inet linnet` and `bridge linnet` (with every guarded
    /// port) if they are gone. Returns whether it did.
    fn restore_tables(&mut self) -> bool {
        let mut restored = false;
        if self.has_firewall() {
            let expected = firewall::shape(&self.firewall_networks());
            let expected = (!self.view.shapes_unreliable).then_some(&expected);
            let damage = (self.damage("inet", expected).map(|d| ("inet linnet", d)))
                .or_else(|| self.fabric_damage().map(|d| ("bridge linnet_fabric", d)));
            if let Some((table, damage)) = damage {
                warn!("linnet's table {table} {damage}: putting it back");
                match self.sync_host() {
                    Ok(()) => {
                        info!("restored table {table}");
                        restored = true;
                        self.check_rebuilt("inet", NFT_TABLE, expected);
                        let fabric = firewall::fabric_shape(&self.firewall_networks());
                        if !fabric.is_empty() {
                            self.check_rebuilt("bridge", FABRIC_TABLE, Some(&fabric));
                        }
                    }
                    Err(e) => warn!("cannot restore table {table}: {e}"),
                }
            }
        }
        let expected = guard::expected_shape().filter(|_| !self.view.shapes_unreliable);
        let damage = match self.guard.restore() {
            Restore::Wait => None,
            Restore::Retry => Some(("bridge linnet", "could not be put back last time")),
            Restore::Check => self
                .damage("bridge", expected)
                .map(|d| ("bridge linnet", d))
                .or_else(|| self.egress_damage().map(|d| ("netdev linnet", d))),
        };
        if let Some((table, damage)) = damage {
            warn!(
                "linnet's table {table} {damage}: putting the guard back with every guarded interface"
            );
            let ports = self.guarded_ports();
            let result = self.host.tables.create_guard(&ports);
            self.guard
                .restored(result.as_ref().map(|_| ()).map_err(|_| GUARD_RETRY));
            match result {
                Ok(()) => {
                    info!(interfaces = ports.len(), "restored table bridge linnet");
                    restored = true;
                    self.check_rebuilt("bridge", NFT_TABLE, expected);
                }
                Err(e) => {
                    warn!(
                        "cannot restore table bridge linnet, so anti-spoofing and isolation are off (tried again in {}s or at the next change after that): {e}",
                        GUARD_RETRY.as_secs()
                    );
                }
            }
        }
        restored
    }
    /// If a table just rebuilt still does not list as expected, nft shows
    /// some rule otherwise than linnet counts it: comparing again would
    /// rebuild for ever (each rebuild wakes the watch), so from then on only
    /// a table that is gone is put back. (A table deleted again meanwhile
    /// says nothing about that.)
    fn check_rebuilt(&mut self, family: &str, table: &str, expected: Option<&Shape>) {
        if let Ok(Some(actual)) = self.host.tables.table_shape(family, table)
            && expected.is_some_and(|e| *e != actual)
        {
            warn!(
                "table {family} {table} lists otherwise than linnet made it; from now on linnet puts back only tables that are gone, not lost rules"
            );
            self.view.shapes_unreliable = true;
        }
    }
    /// What happened to the macvtaps' table `netdev linnet`, while a
    /// macvtap is guarded, if it is not as linnet made it.
    fn egress_damage(&mut self) -> Option<&'static str> {
        let ports: Vec<PortGuard> = self
            .guarded_ports()
            .into_iter()
            .filter(|p| p.hooked())
            .collect();
        if ports.is_empty() || !self.guard.ready() {
            return None;
        }
        let expected =
            guard::expected_egress_shape(&ports).filter(|_| !self.view.shapes_unreliable);
        self.damage("netdev", expected.as_ref())
    }
    /// What happened to `bridge linnet_fabric`, while a network has a
    /// fabric port, if it is not as linnet made it. (It is made and put
    /// back with `inet linnet`, in one transaction.)
    fn fabric_damage(&mut self) -> Option<&'static str> {
        let expected = firewall::fabric_shape(&self.firewall_networks());
        if expected.is_empty() {
            return None;
        }
        let expected = (!self.view.shapes_unreliable).then_some(&expected);
        self.table_damage("bridge", FABRIC_TABLE, expected)
    }
    /// What happened to linnet's table `family linnet`, if it is not as
    /// linnet made it (`expected`; None: only whether it is there).
    fn damage(&mut self, family: &str, expected: Option<&Shape>) -> Option<&'static str> {
        self.table_damage(family, NFT_TABLE, expected)
    }
    /// The same of the table `family table`.
    fn table_damage(
        &mut self,
        family: &str,
        table: &str,
        expected: Option<&Shape>,
    ) -> Option<&'static str> {
        match self.host.tables.table_shape(family, table) {
            Ok(None) => Some("is gone (nft flush ruleset, or a firewall reload?)"),
            Ok(Some(actual)) if expected.is_some_and(|e| *e != actual) => {
                Some("lost rules or chains (nft flush table or delete rule?)")
            }
            Ok(Some(_)) => None,
            Err(e) => {
                warn!("cannot read table {family} {table}: {e}");
                None
            }
        }
    }
    /// Keeps linnet's accept rules in DOCKER-USER for every active network
    /// (none when `firewall.docker_user` is off). Returns whether it changed
    /// anything.
    fn sync_docker_user(&mut self, rs: &Ruleset) -> bool {
        let wanted: Vec<docker_user::Wanted> = self
            .networks
            .values()
            .filter(|_| self.config.firewall.docker_user)
            .filter_map(|n| {
                n.firewall(Vec::new(), Vec::new())?;
                Some(docker_user::Wanted {
                    network: &n.config.name,
                    bridge: n.bridge()?.0,
                })
            })
            .collect();
        match self.host.tables.sync_docker_user(rs, &wanted) {
            Ok(changes) => {
                for (family, network) in &changes.added {
                    info!(network = %network, family = %family, "added accept rules for the network's bridge to Docker's DOCKER-USER chain");
                }
                for (family, network) in &changes.removed {
                    info!(network = %network, family = %family, "removed linnet's rules from DOCKER-USER");
                }
                !changes.added.is_empty() || !changes.removed.is_empty()
            }
            Err(e) => {
                warn!("cannot update linnet's rules in DOCKER-USER: {e}");
                false
            }
        }
    }
    /// Removes linnet's DOCKER-USER rules (at shutdown).
    pub(super) fn clear_docker_user(&mut self) {
        match self.host.tables.ruleset() {
            Ok(rs) => {
                if let Err(e) = self.host.tables.sync_docker_user(&rs, &[]) {
                    warn!("cannot remove linnet's rules from DOCKER-USER: {e}");
                }
            }
            Err(e) => warn!("cannot read the ruleset to clean DOCKER-USER: {e}"),
        }
    }
    /// Turns forwarding back on if the networks need it and something
    /// turned it off; what that changes is put back when linnet stops
    /// forwarding, as when it turned forwarding on in the first place.
    pub fn restore_forwarding(&mut self) {
        let (needs4, needs6) = self.forwarding_needs();
        match self.forwarding.turn_on(&*self.host.devices, needs4, needs6) {
            Ok(turned) => {
                for family in turned {
                    warn!(
                        "{family} forwarding was turned off behind linnet's back: turned it on again (its networks need it)"
                    );
                }
            }
            Err(e) => warn!("{e}"),
        }
    }
}

/// How many interfaces leaving at once make the daemon give freed memory
/// back to the system.
const MANY_AT_ONCE: usize = 16;

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
