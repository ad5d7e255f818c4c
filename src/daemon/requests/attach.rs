//! Attach and detach as requests: every check (allow list, a network
//! socket's relay, keep, the name, limits, policy, the id), the network
//! brought up, the plan (`plan`, or a clone's, `clone`) carried out
//! (`apply`), the ports published; and a client's detach and relay
//! counters.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};
use tracing::{info, warn};

use crate::api::{AttachRequest, InterfaceInfo};
use crate::config::DEFAULT_NETWORK;
use crate::daemon::client::Client;
use crate::daemon::errors::DaemonError;
use crate::daemon::holder::Holder;
use crate::daemon::leftovers::Leftovers;
use crate::daemon::plan::{self, Done};
use crate::daemon::state::Daemon;
use crate::daemon::teardown::Teardown;
use crate::datapath::{Datapath, RelayCounters};
use crate::leases::LeaseError;
use crate::services::unix_now;
use crate::types::InterfaceId;

impl Daemon {
    /// Attaches an interface: what the VMM's side needs to know, the port's
    /// fd, and (for an interface a client holds) the token it re-claims the
    /// interface with after a daemon restart.
    pub async fn handle_attach(
        &mut self,
        client: &Client,
        req: AttachRequest,
    ) -> Result<(InterfaceInfo, Vec<OwnedFd>, Option<String>), DaemonError> {
        let network = req
            .network
            .clone()
            .unwrap_or_else(|| DEFAULT_NETWORK.into());
        // An adopted interface its client did not re-claim (one that
        // attaches again instead, as an API client may) goes for the new
        // attach, when it is the same user's.
        if let Some(id) = req.interface_id
            && let Some(other) = self.interfaces.get(&id)
            && matches!(other.holder, Holder::Adopted { .. })
            && client.network_socket.is_none()
            && (client.uid == other.uid || client.uid == 0)
        {
            info!(network = %other.network, interface = %id, uid = client.uid, "attached again instead of re-claimed: the adopted interface goes first");
            self.detach(&[id]).await?;
        }
        let bridge_netfilter = self.host.devices.bridge_netfilter();
        let id = plan::admit(
            &self.config,
            &self.interfaces,
            client,
            &req,
            bridge_netfilter,
        )?;
        self.ensure_network(&network).await?;
        let attached = match &req.clone_of {
            Some(of) => self.attach_clone(&network, id, client, &req, of).await,
            None => self.attach_on(&network, id, client, &req).await,
        };
        let result = match attached {
            Ok((mut info, fd)) => match self.publish_on_attach(id, client, &req) {
                Ok(forwards) => {
                    info.forwards = forwards;
                    // Written before the reply: a daemon killed after it
                    // leaves an interface the next one adopts.
                    self.save_record(id);
                    let iface = &self.interfaces[&id];
                    // A kept one has no client to re-claim it.
                    let token = (iface.outlives_daemon()
                        && !matches!(iface.holder, Holder::Kept { .. })
                        && !self.rootless())
                    .then(|| iface.token.clone());
                    Ok((info, fd, token))
                }
                Err(e) => {
                    self.give_back_taken_lease(id);
                    let mut left = Leftovers::default();
                    left.note("detach it", self.detach(&[id]).await);
                    left.log(&format!("interface {id}: undoing an attach"));
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.release_network_if_unused(&network).await;
        }
        result
    }
    /// Plans the attach (`plan::plan`) and carries it out (`apply`).
    async fn attach_on(
        &mut self,
        network: &str,
        id: InterfaceId,
        client: &Client,
        req: &AttachRequest,
    ) -> Result<(InterfaceInfo, Vec<OwnedFd>), DaemonError> {
        let now = unix_now();
        let net = &self.networks[network];
        if req.datapath == Some(Datapath::TapName) && !net.ports_open_by_name() {
            return Err(DaemonError::NotOpenedByName {
                network: network.into(),
                mode: net.config.mode(),
            });
        }
        let mut done = Vec::new();
        let elsewhere = net.elsewhere(&self.host).await?;
        let plan = match (net.config.own(), net.leases()) {
            (Some(own), Some(leases)) => {
                let mut leases = leases.lock().expect("lease lock");
                let cfg = (&net.config, own);
                let plan = plan::plan(cfg, &mut leases, client.claimant(), id, req, now)
                    .map_err(|e| for_a_socket_client(client, e))?;
                let (addresses, macs) = (&elsewhere.addresses, &elsewhere.macs);
                if let Err(e) = plan::check_elsewhere(network, &plan, addresses, macs) {
                    leases.undo(plan.lease.clone());
                    return Err(e);
                }
                done.push(Done::Lease(plan.lease.clone()));
                plan
            }
            _ => plan::plan_on_lan(&net.config, id, req, net.mtu(), |mac| {
                self.interfaces
                    .values()
                    .any(|i| i.network == network && i.mac == mac)
            })?,
        };
        let carried = self.carry_out(network, &plan, client, done).await?;
        let port = carried.port;
        // Recorded before the VMM has the fd, so any change is its.
        self.tap_addresses.record(port.index, port.mac);
        let made = (port.name, port.index, port.mac);
        let info = self.record_attached(network, plan, client, req, made, None);
        Ok((info, port.fds))
    }
    /// Records what a client's relay moved for one of its interfaces.
    pub fn handle_counters(
        &mut self,
        client: &Client,
        id: InterfaceId,
        counters: RelayCounters,
    ) -> Result<(), DaemonError> {
        match self.interfaces.get_mut(&id) {
            Some(i) if i.holder.is(client.id) => {
                i.relay = Some(counters);
                Ok(())
            }
            _ => Err(DaemonError::NotThisConnections { id }),
        }
    }
    /// A client's detach, checked, and begun: what is left to do of it
    /// (`finish_unlocked`).
    pub fn detach_request(
        &mut self,
        client: &Client,
        id: InterfaceId,
    ) -> Result<Teardown, DaemonError> {
        match self.interfaces.get(&id) {
            None => Err(DaemonError::NotAttached {
                which: format!("interface {id}"),
                network: None,
            }),
            Some(i) if i.holder.is_unheld() && client.uid != 0 && client.uid != i.uid => {
                Err(DaemonError::NotOwner {
                    id,
                    owner: i.uid,
                    what: "detach it",
                })
            }
            Some(i) if !i.holder.is(client.id) && !i.holder.is_unheld() => {
                Err(DaemonError::HeldByAnother { id, pid: i.pid() })
            }
            Some(_) => Ok(self.begin_detach(&[id])),
        }
    }

    /// A client's detach, all under the lock.
    pub async fn handle_detach(
        &mut self,
        client: &Client,
        id: InterfaceId,
    ) -> Result<(), DaemonError> {
        let teardown = self.detach_request(client, id)?;
        self.run_teardown(teardown).await
    }

    /// A client's connection closed: everything it attached goes, its TAPs
    /// deleted in one go. What is left to do (`finish_unlocked`).
    pub fn client_going(&mut self, client: u64) -> Teardown {
        let ids: Vec<InterfaceId> = self
            .interfaces
            .iter()
            .filter(|(_, i)| i.holder.is(client))
            .map(|(id, _)| *id)
            .collect();
        if !ids.is_empty() {
            info!(client, interfaces = ids.len(), "client went away");
        }
        self.begin_detach(&ids)
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
            } else if let Some(own) = net.config.own()
                && now.duration_since(*since).as_secs() >= u64::from(own.dhcp.lease_time)
            {
                info!(network = %iface.network, interface = %id, tap = %iface.tap, lease_time = own.dhcp.lease_time, "a kept interface's VM sent nothing for the network's lease_time: detaching it");
                expired.push(*id);
            }
        }
        if !expired.is_empty()
            && let Err(e) = self.detach(&expired).await
        {
            warn!("detaching expired kept interfaces failed: {e}");
        }
    }
    /// Whether any interface is kept past its client (`linnet attach`).
    pub fn any_kept(&self) -> bool {
        self.interfaces
            .values()
            .any(|i| matches!(i.holder, Holder::Kept { .. }))
    }
}

/// Ends a detach begun under `lock` (`detach_request`, `client_going`)
/// with the lock free while the kernel takes links down and deletes them,
/// so that other clients' requests go on meanwhile (`teardown`).
pub async fn finish_unlocked(
    lock: &Mutex<Daemon>,
    mut teardown: Teardown,
) -> Result<(), DaemonError> {
    if teardown.is_empty() {
        return Ok(());
    }
    if teardown.has_macvtaps() {
        teardown.cut_off().await;
        lock.lock().await.unhook_detaching(&teardown);
    }
    teardown.delete().await;
    lock.lock().await.finish_detach(teardown).await
}

/// The daemon's lock, for an attach: one that asks for what a detaching
/// interface still holds (`Daemon::waits_for_detach`) waits for its
/// detach to end first.
pub async fn lock_for_attach<'a>(
    lock: &'a Mutex<Daemon>,
    req: &AttachRequest,
) -> MutexGuard<'a, Daemon> {
    lock_after_detaches(lock, |daemon| daemon.waits_for_detach(req), None).await
}

/// The daemon's lock once no detach is under way (or `within` has
/// passed): a daemon that stops lets its clients' detaches end first.
pub async fn lock_when_detached(lock: &Mutex<Daemon>, within: Duration) -> MutexGuard<'_, Daemon> {
    let deadline = tokio::time::Instant::now() + within;
    let busy = |daemon: &Daemon| !daemon.detaching.is_empty();
    let daemon = lock_after_detaches(lock, busy, Some(deadline)).await;
    if busy(&daemon) {
        warn!(
            interfaces = daemon.detaching.len(),
            "stopping with detaches not ended: their links may be left, for the next daemon to delete"
        );
    }
    daemon
}

/// The daemon's lock once `busy` no longer holds, waking at each detach's
/// end (`Daemon::detached`), or at `deadline`.
async fn lock_after_detaches(
    lock: &Mutex<Daemon>,
    busy: impl Fn(&Daemon) -> bool,
    deadline: Option<tokio::time::Instant>,
) -> MutexGuard<'_, Daemon> {
    let mut daemon = lock.lock().await;
    while busy(&daemon) && deadline.is_none_or(|at| tokio::time::Instant::now() < at) {
        let detached = daemon.detached.clone();
        let ended = detached.notified();
        drop(daemon);
        match deadline {
            Some(at) => {
                // Past it, the caller goes on with what is under way.
                let _ = tokio::time::timeout_at(at, ended).await;
            }
            None => ended.await,
        }
        daemon = lock.lock().await;
    }
    daemon
}

/// A refusal said as a network socket's client can act on it: it chooses
/// no `--mac`, its VMM does.
fn for_a_socket_client(client: &Client, e: DaemonError) -> DaemonError {
    match (&client.network_socket, e) {
        (Some(network), DaemonError::Lease(LeaseError::MacInUse { mac, other, .. })) => {
            DaemonError::RelayRefused {
                network: network.clone(),
                why: format!(
                    "may not use MAC {mac}: it is already used by interface {other}, maybe another user's VM; give this VM another MAC in its VMM's settings (a lima VM's follows from its instance's name)"
                ),
            }
        }
        (_, e) => e,
    }
}
