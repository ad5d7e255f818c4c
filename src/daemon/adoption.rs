//! Restarts without loss. A daemon that stops while VMs are attached
//! (SIGTERM for a restart or an upgrade, or a crash) leaves their ports,
//! bridges and nftables tables in the kernel, which keeps forwarding, and
//! their records on disk (`records`). The next daemon adopts each
//! interface whose port and client are still there, removes the rest,
//! and replaces linnet's tables with equal content, each in one
//! transaction; the clients reconnect and re-claim their interfaces
//! (`handle_reclaim`), and an adopted interface whose client exits
//! without doing so goes (`reap_orphans`).

use std::collections::{BTreeMap, BTreeSet};

use tracing::{info, warn};

use super::client::Client;
use super::errors::DaemonError;
use super::forwards::FORWARDS_FILE;
use super::holder::Holder;
use super::interface::Interface;
use super::leftovers::Leftovers;
use super::plan;
use super::policies::{adopted_network_secrets, check_policy_possible};
use super::records::{self, InterfaceRecord, Verdict};
use super::state::Daemon;
use crate::api::ForwardOrigin;
use crate::events::What;
use crate::formed6;
use crate::host::netlink::{Link, LinkSettings};
use crate::host::peer::PeerNamespace;
use crate::host::process::Process;
use crate::leases::{Claimant, Lease, Owner};
use crate::services::unix_now;
use crate::types::InterfaceId;

/// An interface a new daemon adopts: its record, whether its port is cut
/// off (and why), and the bridge its port is on.
struct Adoption {
    record: InterfaceRecord,
    cut_off: Option<String>,
    master: Option<u32>,
}

impl Daemon {
    /// Start-up: adopts what a previous daemon left for interfaces still
    /// in use, removes everything else it left (ports, bridges of
    /// networks not persistent, clone namespaces), brings up the
    /// persistent networks, and replaces linnet's tables in one
    /// transaction each.
    pub async fn reconcile(&mut self) -> Result<(), DaemonError> {
        std::fs::create_dir_all(&self.lease_dir).map_err(|e| DaemonError::StateFile {
            what: "cannot create",
            path: self.lease_dir.clone(),
            source: e,
        })?;
        // What a killed daemon was writing: the files it was replacing
        // are whole (`files::write_atomically`).
        for dir in [&self.state_dir, &self.lease_dir, &self.run_dir] {
            crate::files::remove_temporaries(dir);
        }
        self.remove_clone_mounts();
        // Before the first rebuild of the firewall, which would empty them.
        self.names.recover();
        let path = self.state_dir.join(FORWARDS_FILE);
        self.forwards
            .open(&path)
            .map_err(|source| DaemonError::StateFile {
                what: "cannot read saved forwards",
                path: path.clone(),
                source,
            })?;
        // A rootless daemon's namespace, and its forwarding, end with it.
        if !self.rootless() {
            self.forwarding.open(&self.run_dir);
        }
        let links = self.host.links.links().await?;
        let adopt = self.decide_adoptions(&links);
        let ports: BTreeSet<u32> = adopt.iter().map(|a| a.record.port_index).collect();
        let mut wanted: BTreeSet<String> = adopt.iter().map(|a| a.record.network.clone()).collect();
        wanted.extend(
            self.config
                .networks
                .values()
                .filter(|n| n.persistent)
                .map(|n| n.name.clone()),
        );
        let networks: BTreeSet<&str> = wanted.iter().map(String::as_str).collect();
        for link in &links {
            if super::tidy::stray(link, &ports, &networks) {
                info!(link = %link.name, "removing what a previous daemon left");
                self.host.links.delete_link(link.index).await?;
            }
        }
        // The networks come up without touching the tables: those the last
        // daemon left go on guarding and NATing until replaced, below.
        for name in &wanted {
            let cfg = self.config.network(name).expect("configured").clone();
            match super::drivers::ActiveNetwork::bring_up(
                &cfg,
                &self.host,
                &*self.services,
                &self.lease_dir,
            )
            .await
            {
                Ok(net) => {
                    self.networks.insert(name.clone(), net);
                }
                Err(e) if cfg.persistent && !adopt.iter().any(|a| &a.record.network == name) => {
                    return Err(e);
                }
                Err(e) => {
                    warn!(network = %name, "cannot bring the network up again: {e}; its interfaces are not adopted")
                }
            }
        }
        let mut adopted = 0;
        // Ports to put back on their network once the tables are whole
        // (a daemon before held them off while its tables were damaged).
        let mut held = Vec::new();
        for Adoption {
            record,
            cut_off,
            master,
        } in adopt
        {
            let (id, port, index) = (record.interface_id, record.port.clone(), record.port_index);
            if !self.networks.contains_key(&record.network) {
                self.forget(id, index).await;
                continue;
            }
            match self.adopt(record, cut_off, master).await {
                Ok(back) => {
                    adopted += 1;
                    held.extend(back);
                }
                Err(e) => {
                    warn!(interface = %id, %port, "cannot adopt the interface a previous daemon attached: {e}; removing it");
                    self.forget(id, index).await;
                }
            }
        }
        // A network whose interfaces were not adopted after all goes again.
        for name in &wanted {
            self.release_network_if_unused(name).await;
        }
        self.next_tap = self
            .interfaces
            .values()
            .filter_map(|i| port_number(&i.tap))
            .max()
            .map_or(0, |n| n + 1);
        // Each table in one transaction, with every adopted port in it:
        // never a moment without its guard or its NAT.
        let ports = self.guarded_ports();
        self.guard.remake(&mut *self.host.tables, &ports)?;
        self.sync_host()?;
        for (index, bridge) in held {
            let back = match bridge {
                Some(bridge) => self.host.links.set_master(index, Some(bridge)).await,
                None => {
                    let up = LinkSettings {
                        up: true,
                        ..Default::default()
                    };
                    self.host.links.configure(index, up).await
                }
            };
            if let Err(e) = back {
                warn!(
                    port = index,
                    "cannot put an adopted port back on its network: {e}"
                );
            }
        }
        for net in self.networks.values() {
            if let Some(leases) = net.leases() {
                leases.changed();
            }
        }
        self.release_leases_of_networks_down();
        // Takes out DOCKER-USER rules a previous daemon left, or puts in
        // the networks' own.
        self.refresh_uplinks().await;
        self.check_host();
        if adopted > 0 {
            info!(
                interfaces = adopted,
                "adopted the interfaces a previous daemon attached; their clients re-claim them"
            );
        }
        Ok(())
    }

    /// The lease files of networks that did not come up (nothing of theirs
    /// was adopted) as a previous daemon may have left them: an interface
    /// still attached in the file, its client gone since (the daemon was
    /// killed before it wrote the detach down), held from now for the
    /// lease time, as opening the file makes it, and written so.
    fn release_leases_of_networks_down(&self) {
        let now = unix_now();
        for cfg in self.config.networks.values() {
            let Some(own) = cfg.own() else { continue };
            let path = self.lease_dir.join(format!("{}.json", cfg.name));
            if self.networks.contains_key(&cfg.name) || !path.exists() {
                continue;
            }
            // Opening holds what was attached; what was held stays as it was.
            let written =
                crate::leases::LeaseTable::open(&cfg.name, own, &path, now).and_then(|table| {
                    match table.snapshot() {
                        Some((path, bytes)) => crate::files::write_atomically(&path, &bytes),
                        None => Ok(()),
                    }
                });
            if let Err(e) = written {
                warn!(network = %cfg.name, "cannot write its leases down as released: {e}");
            }
        }
    }

    /// The records to adopt; the others' records go.
    fn decide_adoptions(&mut self, links: &[Link]) -> Vec<Adoption> {
        let by_index: BTreeMap<u32, &Link> = links.iter().map(|l| (l.index, l)).collect();
        let mut adopt = Vec::new();
        for record in self.records.load() {
            let network = match self.config.network(&record.network) {
                None => Err(format!(
                    "network \"{}\" is no longer configured",
                    record.network
                )),
                Some(cfg) if cfg.mode() != record.mode => Err(format!(
                    "network \"{}\" is mode {} now, not {}",
                    record.network,
                    cfg.mode(),
                    record.mode
                )),
                // A rootless daemon's namespace went with the last one.
                Some(_) if self.rootless() => Err("a rootless daemon starts anew".into()),
                Some(_) => Ok(()),
            };
            let running = record.client.is_some_and(|p| p.is_running());
            let port = by_index.get(&record.port_index).copied();
            match records::verdict(&record, port, running, network) {
                Verdict::Adopt { cut_off } => adopt.push(Adoption {
                    master: port.and_then(|l| l.master),
                    record,
                    cut_off,
                }),
                Verdict::Remove(why) => {
                    info!(network = %record.network, interface = %record.interface_id, port = %record.port, "removing an interface a previous daemon attached: {why}");
                    self.records.remove(record.interface_id);
                }
            }
        }
        adopt
    }

    /// Takes on one interface a previous daemon attached: its lease at
    /// its address, its guard, forwards and policy, as they were. `master`:
    /// the bridge its port is on. Returns the port to put back on its
    /// network (its bridge's index; none: a macvtap to bring up) once the
    /// tables are whole, if it was held off.
    async fn adopt(
        &mut self,
        mut r: InterfaceRecord,
        cut_off: Option<String>,
        master: Option<u32>,
    ) -> Result<Option<(u32, Option<u32>)>, DaemonError> {
        let id = r.interface_id;
        let net = &self.networks[&r.network];
        let cfg = &net.config;
        // What the config says now holds for it as at an attach; a
        // ceiling it now goes past holds it to the network's own policy
        // (root tightened networks.yaml and restarted the daemon).
        if let Err(widening) = cfg.ceiling().admits(&r.policy) {
            warn!(network = %r.network, interface = %id, %widening, "its policy goes past what the network now enforces: it gets the network's");
            r.policy = plan::attach_policy(None, cfg);
        }
        r.policy = adopted_network_secrets(r.policy, cfg);
        check_policy_possible(&r.policy, cfg, self.host.devices.bridge_netfilter())?;
        let bridge = net.bridge().map(|(_, index)| index);
        let held = match (bridge, master) {
            (Some(b), Some(m)) if b != m => {
                return Err(DaemonError::PortElsewhere {
                    network: r.network.clone(),
                });
            }
            _ if cut_off.is_some() => None,
            (Some(b), None) => Some((r.port_index, Some(b))),
            (Some(_), Some(_)) => None,
            (None, _) => Some((r.port_index, None)),
        };
        if let Some(leases) = net.leases() {
            let mut leases = leases.lock().expect("lease lock");
            match r.ip {
                Some(ip) => leases.readopt(
                    Lease {
                        ip,
                        mac: r.mac,
                        owner: Owner::Interface { id },
                        name: r.name.clone(),
                        hostname: None,
                        uid: Some(r.uid),
                        held_until: None,
                    },
                    unix_now(),
                ),
                None => leases
                    .attach_without_address(id, Some(r.mac), unix_now(), &mut Default::default())
                    .map(drop)
                    .map_err(|e| e.to_string()),
            }
            .map_err(|why| DaemonError::LeaseNotReadopted { id, why })?;
        }
        // A kept one's idle time starts again: the daemon did not see it.
        let holder = if r.kept {
            Holder::Kept {
                rx: 0,
                since: std::time::Instant::now(),
            }
        } else {
            Holder::Adopted { process: r.client }
        };
        // What its VM formed, judged again (the prefix may have changed).
        let formed6 = match cfg.ipv6() {
            Some(v6) => formed6::readopt(&r.formed6, v6.prefix, r.mac, |t| {
                self.ipv6_taken(&r.network, id, v6.prefix, t)
            }),
            None => Vec::new(),
        };
        self.interfaces.insert(
            id,
            Interface {
                network: r.network.clone(),
                mac: r.mac,
                ip: r.ip,
                name: r.name.clone(),
                tap: r.port.clone(),
                tap_index: r.port_index,
                cut_off: cut_off.clone(),
                holder,
                uid: r.uid,
                account: adopted_account(r.uid, r.client.as_ref()),
                datapath: r.datapath,
                relay: None,
                forwards: Vec::new(),
                guarded: plan::guarded(cfg),
                policy: r.policy.clone(),
                as_clone: None,
                token: r.token.clone(),
                port_mac: r.port_mac,
                formed6,
            },
        );
        // Checked again, as the user's, against the config as it is now.
        for forward in &r.publish {
            if let Err(e) = self.take_forward(id, *forward, ForwardOrigin::Publish, r.uid) {
                warn!(network = %r.network, interface = %id, %forward, "forward not restored: {e}");
            }
        }
        self.take_kept_forwards(id, Claimant::from(r.uid));
        match &cut_off {
            Some(why) if r.cut_off.is_none() => {
                warn!(network = %r.network, interface = %id, tap = %r.port, "{why}");
                if let Err(e) = self.host.links.cut_off(r.port_index).await {
                    warn!(tap = %r.port, "cannot take the TAP off its bridge: {e}");
                }
                self.save_record(id);
            }
            Some(_) => {}
            None => self.tap_addresses.record(r.port_index, r.port_mac),
        }
        // What the network does with a VM's address: on a LAN, the host's
        // route to the address linnet had learned; across hosts, the
        // neighbour entry FRR advertises.
        let net = &self.networks[&r.network];
        if r.ip.is_some()
            && let Err(e) = net.vm_address(&self.host, r.mac, None, r.ip).await
        {
            warn!(network = %r.network, interface = %id, "{e}");
        }
        info!(network = %r.network, interface = %id, ip = ?r.ip, mac = %r.mac, tap = %r.port, pid = ?r.client.map(|p| p.pid), uid = r.uid, "adopted");
        let what = What::Adopted {
            interface_id: id,
            tap: r.port.clone(),
        };
        self.events.emit(Some(&r.network), what);
        Ok(held)
    }

    /// Removes an interface that is not adopted after all: its port and
    /// its record (its lease runs out like a detached one's).
    async fn forget(&mut self, id: InterfaceId, port: u32) {
        let mut left = Leftovers::default();
        let deleted = self.host.links.delete_link(port).await;
        left.note(format_args!("delete its port {port}"), deleted);
        left.log(&format!("interface {id}, not adopted"));
        self.records.remove(id);
    }

    /// A client back after a restart re-claims its interface with the
    /// token it got at attach; from then on the interface lives as long
    /// as this connection.
    pub fn handle_reclaim(
        &mut self,
        client: &Client,
        id: InterfaceId,
        token: &str,
    ) -> Result<(), DaemonError> {
        let Some(iface) = self.interfaces.get_mut(&id) else {
            return Err(DaemonError::NotAdopted { id });
        };
        if !same_token(&iface.token, token) || (client.uid != iface.uid && client.uid != 0) {
            return Err(DaemonError::NotReclaimable { id });
        }
        if !matches!(iface.holder, Holder::Adopted { .. }) {
            return Err(DaemonError::AlreadyReclaimed { id });
        }
        iface.holder = client.holder(false);
        info!(network = %iface.network, interface = %id, tap = %iface.tap, pid = ?client.pid, uid = client.uid, "re-claimed by its client");
        (self.events).emit(Some(&iface.network), What::Reclaimed { interface_id: id });
        self.save_record(id);
        Ok(())
    }

    /// Detaches adopted interfaces whose client exited before it
    /// re-claimed them.
    pub async fn reap_orphans(&mut self) {
        let gone: Vec<InterfaceId> = self
            .interfaces
            .iter()
            .filter(|(_, i)| matches!(i.holder, Holder::Adopted { .. }) && i.holder.client_exited())
            .map(|(id, _)| *id)
            .collect();
        if gone.is_empty() {
            return;
        }
        info!(
            interfaces = gone.len(),
            "the client of an adopted interface exited before it re-claimed it: detaching"
        );
        if let Err(e) = self.detach(&gone).await {
            warn!("detaching them failed: {e}");
        }
    }

    /// Stopping (a signal, or idle). With VMs attached their ports,
    /// bridges and tables stay, with their records, for the next daemon
    /// to adopt: a restart or an upgrade does not cut them off. Clones go
    /// (their namespaces are this daemon's), interfaces whose client has
    /// exited go, and so does everything of a rootless daemon, whose
    /// namespace ends with it.
    pub async fn stop(&mut self) {
        // Those whose client has exited go now, even if their connection's
        // end was not seen yet.
        let going: Vec<InterfaceId> = self
            .interfaces
            .iter()
            .filter(|(_, i)| !i.outlives_daemon() || i.holder.client_exited())
            .map(|(id, _)| *id)
            .collect();
        if !going.is_empty()
            && let Err(e) = self.detach(&going).await
        {
            warn!("detaching clones and interfaces whose client exited failed: {e}");
        }
        if self.interfaces.is_empty() || self.rootless() {
            self.shutdown().await;
            self.records.remove_dir_if_empty();
            return;
        }
        for (name, net) in &self.networks {
            if let Some(leases) = net.leases()
                && let Err(e) = leases.save_now()
            {
                warn!(network = %name, "cannot save leases: {e}");
            }
        }
        info!(
            interfaces = self.interfaces.len(),
            "VMs are attached: their ports, bridges and rules stay for the next daemon, which adopts them"
        );
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
}

/// The number in a port's name (`lnt7`, `lnv7`), which the next ports'
/// names count on from.
/// The account an adopted interface's user is charged to, read again of
/// its client's process: a client gone since counts as its uid (the
/// interface is an orphan, reaped or kept as any other).
fn adopted_account(uid: u32, client: Option<&Process>) -> u32 {
    let namespace = client.map_or(PeerNamespace::Gone, PeerNamespace::of_process);
    crate::host::accounts::account_of(uid, &namespace).unwrap_or(uid)
}

fn port_number(name: &str) -> Option<u32> {
    [crate::host::TAP_PREFIX, crate::host::MACVTAP_PREFIX]
        .iter()
        .find_map(|p| name.strip_prefix(p)?.parse().ok())
}

/// Compares tokens in time that does not depend on where they differ.
fn same_token(ours: &str, theirs: &str) -> bool {
    ours.len() == theirs.len()
        && ours
            .bytes()
            .zip(theirs.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_count_on_from_the_adopted_ones_and_tokens_compare_whole() {
        assert_eq!(port_number("lnt12"), Some(12));
        assert_eq!(port_number("lnv3"), Some(3));
        assert_eq!(port_number("lnc4"), None, "clone ports are never adopted");
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd"));
        assert!(!same_token("abc", "ab"));
        assert!(!same_token("", "a"));
    }
}
