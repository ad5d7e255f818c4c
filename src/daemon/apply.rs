//! The one executor of attaches: `apply` carries out a plan's steps
//! (`plan::Step`) in order through the host seam, recording each in
//! `Done` once it is done, and `undo` undoes the done ones, newest first,
//! when a later step fails. An interface's attach and a clone's differ
//! only in their steps, which the plan decides (`plan::plan`,
//! `plan::plan_clone`); neither carries out anything of its own.
//!
//! Both take what they use of the daemon as borrowed parts (`Apply`), not
//! the daemon itself, so they depend on nothing above the parts.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use tokio::net::UdpSocket;
use tracing::warn;

use super::drivers::{ActiveNetwork, Port, PortRequest};
use super::errors::DaemonError;
use super::guarding::{Guard, clone_guard};
use super::leftovers::Leftovers;
use super::plan::{self, AttachPlan, Done, Step};
use crate::host::ALIAS_INTERFACE;
use crate::host::clone_ns::CloneNetwork;
use crate::host::netns::NetNs;
use crate::host::seam::Host;
use crate::services::Starter;
use crate::types::InterfaceId;

/// What carrying out or undoing an attach uses of the daemon.
pub(super) struct Apply<'a> {
    pub host: &'a mut Host,
    pub guard: &'a mut Guard,
    /// The network the interface joins.
    pub network: &'a ActiveNetwork,
}

/// What the steps made: the port on the network, and a clone's own.
pub(super) struct Carried {
    /// The port on the network; for a clone, its veth port, whose fd is
    /// the TAP in its namespace.
    pub port: Port,
    /// A clone's namespace, the socket of its guest's DHCP server in
    /// there, and its name in the file system (tap-name).
    pub clone: Option<(NetNs, UdpSocket, Option<PathBuf>)>,
}

/// What making an interface's devices needs besides the host: whose they
/// are, what names and scratch space they take, what serves a clone.
pub(super) struct Making<'a> {
    pub uid: u32,
    pub gid: u32,
    /// The number in the next TAP's name.
    pub next_tap: &'a mut u32,
    /// Root-only, for device nodes of the moment.
    pub scratch: &'a Path,
    /// Makes the socket of a clone's DHCP server.
    pub services: &'a dyn Starter,
}

impl Apply<'_> {
    /// Carries out `plan`'s steps in order; each that needs undoing goes
    /// into `done` once done. On an error the caller undoes `done`.
    pub async fn apply(
        &mut self,
        plan: &AttachPlan,
        who: Making<'_>,
        done: &mut Vec<Done>,
    ) -> Result<Carried, DaemonError> {
        let mut port: Option<Port> = None;
        let mut tap = None;
        let mut clone: Option<(&CloneNetwork, NetNs)> = None;
        let mut dhcp = None;
        let mut mount = None;
        let alias = format!("{ALIAS_INTERFACE}{}", plan.id);
        for step in &plan.steps {
            match step {
                Step::Port => {
                    let request = PortRequest {
                        mac: plan.mac,
                        uid: who.uid,
                        gid: who.gid,
                        next: &mut *who.next_tap,
                        queues: plan.queues,
                        scratch: who.scratch,
                        spare_ok: !(plan.guarded && self.guard.held()),
                    };
                    let made = self.network.make_port(self.host, request).await?;
                    done.push(Done::Port(made.index));
                    tap = Some(made.name.clone());
                    port = Some(made);
                }
                Step::ClonePort(spec) => {
                    let made = (self.host.devices)
                        .make_clone(spec, &mut *who.next_tap, (who.uid, who.gid))
                        .await?;
                    done.push(Done::ClonePort(made.port));
                    tap = Some(spec.tap.clone());
                    port = Some(Port {
                        name: made.port_name,
                        index: made.port,
                        mac: plan.mac,
                        fds: vec![made.tap],
                    });
                    clone = Some((spec, made.ns));
                }
                Step::CloneDhcp => {
                    let (spec, ns) = made_before(clone.as_ref(), step)?;
                    let socket = (who.services)
                        .clone_dhcp_socket(ns, &spec.tap)
                        .map_err(|e| DaemonError::HostStep {
                            what: "cannot serve DHCP in a clone's namespace".into(),
                            source: e,
                        })?;
                    dhcp = Some(socket);
                }
                Step::NameNamespace(path) => {
                    let (spec, ns) = made_before(clone.as_ref(), step)?;
                    // Open to root alone: anyone who could open the name
                    // could hold the namespace (and its TAP) past detach.
                    crate::files::private_dir(path.parent().expect("a file in a directory"))
                        .and_then(|()| self.host.devices.mount_namespace(ns, path))
                        .map_err(|e| DaemonError::HostStep {
                            what: format!(
                                "cannot name the namespace of the clone's TAP {} in {}, for its VMM to open it by name",
                                spec.tap,
                                path.display()
                            ),
                            source: e,
                        })?;
                    done.push(Done::Mount(path.clone()));
                    mount = Some(path.clone());
                }
                Step::Guard { guest } => {
                    let port = made_before(port.as_ref(), step)?;
                    let entries = plan.guard(&self.network.config, &port.name);
                    let entries = clone_guard(entries, *guest);
                    self.guard.add(&mut *self.host.tables, &entries)?;
                    done.push(Done::Guard(entries));
                }
                Step::Link => {
                    let port = made_before(port.as_ref(), step)?;
                    let bridge = self.network.bridge().map(|(_, index)| index);
                    let settings = plan.link(bridge, self.guard.held(), &alias);
                    self.host.links.configure(port.index, settings).await?;
                }
                Step::Advertise { ip } => {
                    let (host, mac) = (&*self.host, plan.mac);
                    self.network.vm_address(host, mac, None, Some(*ip)).await?;
                    done.push(Done::Advertised(mac, *ip));
                }
                Step::Persist => {
                    let port = made_before(port.as_ref(), step)?;
                    let tap = made_before(tap.as_ref(), step)?;
                    (self.host.devices)
                        .make_persistent(port.fds[0].as_fd())
                        .map_err(|e| DaemonError::HostStep {
                            what: format!(
                                "cannot make TAP {tap} persistent for --datapath tap-name"
                            ),
                            source: e,
                        })?;
                }
                Step::Announce => {
                    let (spec, ns) = made_before(clone.as_ref(), step)?;
                    if let Err(e) = self.host.devices.announce_clone(ns, spec) {
                        // Neighbours learn the new MAC when their entry
                        // goes stale.
                        warn!(tap = %spec.tap, "cannot announce the guest's address: {e}");
                    }
                }
            }
        }
        let port = made_before(port, &Step::Port)?;
        let clone = match clone {
            Some((_, ns)) => Some((ns, made_before(dhcp, &Step::CloneDhcp)?, mount)),
            None => None,
        };
        Ok(Carried { port, clone })
    }

    /// Undoes the steps of interface `id`'s attach that were done, newest
    /// first. What cannot be undone is logged with what it concerns.
    /// `guarded_left`: whether any other port is guarded (if none, the
    /// guard's tables go too).
    pub async fn undo(&mut self, id: InterfaceId, done: Vec<Done>, guarded_left: bool) {
        let mut left = Leftovers::default();
        let leases = self.network.leases();
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
                    if self.network.bridge().is_none() {
                        let deleted = self.host.links.delete_link(index).await;
                        left.note(format_args!("delete link {index}"), deleted);
                    }
                }
                Done::ClonePort(index) => {
                    let deleted = self.host.links.delete_link(index).await;
                    left.note(format_args!("delete the clone's port {index}"), deleted);
                }
                Done::TookOver(taken) => {
                    if let Some(leases) = leases {
                        leases.lock().expect("lease lock").give_back(&taken);
                    }
                }
                Done::Advertised(mac, ip) => {
                    let taken = (self.network.vm_address(self.host, mac, Some(ip), None)).await;
                    left.note(format_args!("take {ip} out of the neighbour table"), taken);
                }
                Done::Mount(path) => {
                    let unmounted = self.host.devices.unmount_namespace(&path);
                    left.note(format_args!("unmount {}", path.display()), unmounted);
                }
                Done::Lease(change) => {
                    if let Some(leases) = leases {
                        leases.lock().expect("lease lock").undo(change);
                    }
                }
            }
        }
        // The guard's tables were made for this port, if no other is
        // guarded: they go with it.
        self.guard.remove(&mut *self.host.tables, &[], guarded_left);
        left.log(&format!(
            "network \"{}\": undoing the attach of {id}",
            self.network.config.name
        ));
    }
}

/// What an earlier step made, which `step` needs: a plan whose steps are
/// out of order is linnet's bug, said as such rather than a panic.
fn made_before<T>(made: Option<T>, step: &Step) -> Result<T, DaemonError> {
    made.ok_or_else(|| {
        DaemonError::Internal(format!(
            "an attach's step {step:?} came before the step that makes what it needs"
        ))
    })
}
