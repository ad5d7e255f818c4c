//! Attaching a clone (`--clone-of`): which guest it is (an interface of
//! the network by name, attached or with its lease still held, or the
//! snapshotted VM's recorded MAC and address), its unique address in the
//! network's `clone_subnet`, and its namespace (`host::clone_ns`) with a
//! veth port on the bridge. From there on a clone is an interface like
//! any other, whose address is its unique one: guarded, published,
//! policed, named in DNS and listed by that address, and detached the same
//! way (its port deleted, its namespace dropped).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;

use tracing::warn;

use crate::api::{AttachRequest, CloneOf, InterfaceInfo};
use crate::clone::{self, Guest};
use crate::daemon::client::Client;
use crate::daemon::errors::DaemonError;
use crate::daemon::interface::CloneState;
use crate::daemon::plan::{self, CloneDecision, Done};
use crate::daemon::state::Daemon;
use crate::datapath::Datapath;
use crate::leases::LeaseTable;
use crate::services::{dhcp, unix_now};
use crate::types::InterfaceId;

impl Daemon {
    /// Attaches a clone of `of` on `network` (up already).
    pub(in crate::daemon) async fn attach_clone(
        &mut self,
        network: &str,
        id: InterfaceId,
        client: &Client,
        req: &AttachRequest,
        of: &CloneOf,
    ) -> Result<(InterfaceInfo, Vec<OwnedFd>), DaemonError> {
        if req.mac.is_some() {
            return Err(DaemonError::CloneImpossible {
                network: network.into(),
                why:
                    "a clone's MAC is its guest's, which --clone-of or --like says: leave --mac out"
                        .into(),
            });
        }
        // A VMM that opens a clone's TAP by name runs in the clone's
        // namespace, which the system daemon names in the file system for
        // root to put it there (`linnet run`, Firecracker's jailer).
        if req.datapath == Some(Datapath::TapName) && self.rootless() {
            return Err(DaemonError::CloneImpossible {
                network: network.into(),
                why: "a clone's TAP is in a namespace of its own, where a VMM that opens it by name must run: a rootless daemon cannot name it for you yet; use --datapath tap (or dgram, stream)".into(),
            });
        }
        // Everything is checked before the host changes.
        let own = self.networks[network].check_clones()?.clone();
        let cfg = self.networks[network].config.clone();
        let guest = self.clone_guest(network, client, of)?;
        clone::check_guest(network, &own, &guest).map_err(|m| DaemonError::CloneImpossible {
            network: network.into(),
            why: format!("cannot clone onto network \"{network}\": {m}"),
        })?;
        let subnet = own.clone_subnet.ok_or_else(|| DaemonError::CloneRange {
            network: network.into(),
            subnet: None,
        })?;
        let taken: BTreeSet<Ipv4Addr> = self
            .interfaces
            .values()
            .filter(|i| i.network == network && i.as_clone.is_some())
            .filter_map(|i| i.ip)
            .collect();
        let unique =
            clone::free_address(subnet, &taken).ok_or_else(|| DaemonError::CloneRange {
                network: network.into(),
                subnet: Some(subnet),
            })?;
        let now = unix_now();
        // Its id and name are its user's as any interface's are, against
        // the leases of stopped VMs too.
        self.network_leases(network).check_claim(
            client.claimant(),
            id,
            req.name.as_deref(),
            now,
        )?;
        if self
            .networks
            .get_mut(network)
            .expect("up")
            .route_clones(&self.host)
            .await?
        {
            // The clone range is NATed like the subnet from now on.
            self.sync_host()?;
        }
        let mut done = Vec::new();
        // The first clone of a stopped VM carries on as it: it takes the
        // VM's lease and sends as its address, so the VM's connections
        // live on. Any other clone is NATed to its unique address alone.
        let taken_over = self.network_leases(network).take_over(
            client.claimant(),
            id,
            (guest.ip, guest.mac),
            now,
        );
        done.extend(taken_over.clone().map(Done::TookOver));
        let decision = CloneDecision {
            guest,
            unique,
            subnet,
            holds_guest_address: taken_over.is_some(),
        };
        let namespaces = std::path::absolute(&self.run_dir)
            .unwrap_or_else(|_| self.run_dir.clone())
            .join(CLONE_NAMESPACES);
        let plan = plan::plan_clone((&cfg, &own), id, req, &decision, &namespaces);
        let carried = self.carry_out(network, &plan, client, done).await?;
        let (ns, dhcp_socket, mount) = carried.clone.expect("a clone's steps make its namespace");
        if let (Some(name), Some(leases)) = (&plan.name, self.networks[network].leases()) {
            leases
                .lock()
                .expect("lease lock")
                .add_clone(id, name.clone(), unique);
        }
        let guest = decision.guest;
        let state = CloneState {
            mount,
            dhcp: dhcp::serve_clone(cfg, (guest.mac, guest.ip), dhcp_socket),
            guest,
            taken_over,
            ns,
            devices: self.host.devices.clone(),
        };
        let port = (carried.port.name, carried.port.index, plan.mac);
        let info = self.record_attached(network, plan, client, req, port, Some(state));
        Ok((info, carried.port.fds))
    }

    /// The guest `of` names: one of the caller's VMs on the network (any
    /// user's, for root) by the name given at attach: attached (a clone's
    /// guest, if it is one) or stopped with its lease still held; or the
    /// MAC and address given.
    fn clone_guest(
        &self,
        network: &str,
        client: &Client,
        of: &CloneOf,
    ) -> Result<Guest, DaemonError> {
        let name = match of {
            CloneOf::Guest {
                mac_address,
                ip_address,
                tap,
            } => {
                return Ok(Guest {
                    mac: *mac_address,
                    ip: *ip_address,
                    tap: tap.clone(),
                });
            }
            CloneOf::Name(name) => name,
        };
        let who = client.claimant();
        let attached = self.interfaces.values().find(|i| {
            i.network == network
                && (who.overrides || i.uid == who.uid)
                && crate::types::names_match(i.name.as_deref(), name)
        });
        if let Some(i) = attached {
            if let Some(c) = &i.as_clone {
                return Ok(c.guest.clone());
            }
            let ip = i.ip.ok_or_else(|| {
                DaemonError::CloneImpossible {
                    network: network.into(),
                    why: format!(
                        "interface \"{name}\" has no address linnet knows (its network has no DHCP): give the snapshotted VM's with --like FILE"
                    ),
                }
            })?;
            return Ok(Guest {
                mac: i.mac,
                ip,
                tap: Some(i.tap.clone()).filter(|t| clone::check_tap_name(t).is_ok()),
            });
        }
        match self
            .network_leases(network)
            .named_for(who, name, unix_now())
        {
            Some(lease) => Ok(Guest {
                mac: lease.mac,
                ip: lease.ip,
                tap: None,
            }),
            None => Err(DaemonError::CloneImpossible {
                network: network.into(),
                why: format!(
                    "network \"{network}\" has no VM of yours named \"{name}\", attached or with its lease still held; name one that `linnet ls` lists, or give the snapshotted VM's interface JSON with --like FILE"
                ),
            }),
        }
    }

    /// The lease table of one of linnet's own networks (checked by
    /// `check_clones`), locked.
    fn network_leases(&self, network: &str) -> std::sync::MutexGuard<'_, LeaseTable> {
        self.networks[network]
            .leases()
            .expect("linnet's own network")
            .lock()
            .expect("lease lock")
    }

    /// A clone whose attach fails after it was carried out (its published
    /// ports refused) gives back the lease it took over: it never ran.
    pub(in crate::daemon) fn give_back_taken_lease(&mut self, id: InterfaceId) {
        let Some(iface) = self.interfaces.get(&id) else {
            return;
        };
        let Some(taken) = iface.as_clone.as_ref().and_then(|c| c.taken_over.as_ref()) else {
            return;
        };
        if let Some(leases) = self.networks.get(&iface.network).and_then(|n| n.leases()) {
            leases.lock().expect("lease lock").give_back(taken);
        }
    }

    /// Takes away the namespace names a daemon before left (start-up).
    pub(in crate::daemon) fn remove_clone_mounts(&self) {
        let Ok(entries) = std::fs::read_dir(self.run_dir.join(CLONE_NAMESPACES)) else {
            return;
        };
        for entry in entries.flatten() {
            if let Err(e) = self.host.devices.unmount_namespace(&entry.path()) {
                warn!(
                    "cannot remove {} a previous daemon left: {e}",
                    entry.path().display()
                );
            }
        }
    }
}

/// Under the run directory: tap-name clones' namespaces by interface id.
const CLONE_NAMESPACES: &str = "netns";
