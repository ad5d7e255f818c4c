//! Published ports as requests: those an interface asks for at attach and
//! those kept for it, `forward add`, `forward rm` and `forward ls`. The
//! checks and the kept forwards are the forwards part's (`forwards`).

use tracing::{info, warn};

use crate::api::{AttachRequest, ForwardOrigin, ForwardRequest, ForwardStatus, Response};
use crate::config::ForwardTarget;
use crate::daemon::client::Client;
use crate::daemon::errors::DaemonError;
use crate::daemon::forwards;
use crate::daemon::leftovers::Leftovers;
use crate::daemon::state::Daemon;
use crate::events::What;
use crate::forward::PortForward;
use crate::leases::Claimant;
use crate::types::InterfaceId;

impl Daemon {
    /// The forwards an interface gets when it attaches: those it asked for
    /// (each must be free, or the attach fails), then those kept for it
    /// (`take_kept_forwards`); and the firewall with them.
    pub(in crate::daemon) fn publish_on_attach(
        &mut self,
        id: InterfaceId,
        client: &Client,
        req: &AttachRequest,
    ) -> Result<Vec<PortForward>, DaemonError> {
        for forward in &req.publish {
            self.take_forward(id, *forward, ForwardOrigin::Publish, client.uid)?;
        }
        self.take_kept_forwards(id, client.claimant());
        let iface = &self.interfaces[&id];
        let forwards: Vec<PortForward> = iface.forwards.iter().map(|p| p.forward).collect();
        let network = iface.network.clone();
        if !forwards.is_empty() || !iface.policy.is_open() {
            self.sync_host()?;
            if !forwards.is_empty() {
                let list: Vec<String> = forwards.iter().map(|f| f.to_string()).collect();
                info!(%network, interface = %id, forwards = %list.join(" "), "ports published");
            }
        }
        Ok(forwards)
    }

    /// Gives interface `id` the forwards kept for its id and those of the
    /// config, each taken when free, else skipped with a warning: the VM
    /// still gets its network. (Those asked for at attach come first,
    /// and each must be free.)
    pub(in crate::daemon) fn take_kept_forwards(&mut self, id: InterfaceId, who: Claimant) {
        let iface = &self.interfaces[&id];
        let network = iface.network.clone();
        let cfg = self.config.network(&network).expect("attached");
        let name = iface.name.clone();
        let kept = self.forwards.kept_for(id, &network, who);
        let restore: Vec<(PortForward, ForwardOrigin)> = kept
            .into_iter()
            .map(|f| (f, ForwardOrigin::Runtime))
            .chain(
                cfg.forwards()
                    .iter()
                    .filter(|f| match &f.target {
                        ForwardTarget::InterfaceId(target) => *target == id,
                        ForwardTarget::Name(n) => name.as_deref() == Some(n.as_str()),
                    })
                    .map(|f| (f.forward, ForwardOrigin::Config)),
            )
            .collect();
        for (forward, origin) in restore {
            if let Err(e) = self.take_forward(id, forward, origin, 0) {
                warn!(%network, interface = %id, %forward, "forward not restored: {e}");
            }
        }
    }

    /// Checks `forward` and gives it to interface `id` (the firewall is
    /// not updated here).
    pub(in crate::daemon) fn take_forward(
        &mut self,
        id: InterfaceId,
        forward: PortForward,
        origin: ForwardOrigin,
        uid: u32,
    ) -> Result<(), DaemonError> {
        let network = &self.interfaces[&id].network;
        let cfg = self.config.network(network).expect("attached");
        forwards::take(
            &mut self.interfaces,
            cfg,
            self.host_ports.as_mut(),
            (id, forward, origin),
            uid,
        )
    }

    /// `forward add`: publishes a port of an attached interface and keeps
    /// it for the interface id.
    pub fn handle_forward_add(
        &mut self,
        client: &Client,
        req: ForwardRequest,
    ) -> Result<(), DaemonError> {
        let id = self
            .interface_named(client, &req.interface(), "change its forwards")?
            .ok_or_else(|| Self::no_such_interface(&req.interface()))?;
        self.take_forward(id, req.forward, ForwardOrigin::Runtime, client.uid)?;
        let undo = |daemon: &mut Daemon| {
            let iface = daemon.interfaces.get_mut(&id).expect("attached");
            iface.forwards.retain(|p| p.forward != req.forward);
        };
        if let Err(e) = self.sync_host() {
            undo(self);
            let mut left = Leftovers::default();
            left.note("put linnet's tables back", self.sync_host());
            left.log(&format!("interface {id}: undoing forward {}", req.forward));
            return Err(e);
        }
        let owner = self.interfaces[&id].uid;
        if let Err(e) = self.forwards.keep(id, &req.network, owner, req.forward) {
            warn!(interface = %id, "cannot save forward {}: {e}; it lasts until detach", req.forward);
        }
        info!(network = %req.network, interface = %id, forward = %req.forward, "port published");
        self.forward_event(&req, id, true);
        self.save_record(id);
        Ok(())
    }

    /// `forward rm`: of an attached interface, or a kept one of a detached id.
    pub fn handle_forward_remove(
        &mut self,
        client: &Client,
        req: ForwardRequest,
    ) -> Result<(), DaemonError> {
        let Some(id) = self.interface_named(client, &req.interface(), "change its forwards")?
        else {
            // Not attached: it may still have a kept forward (root only,
            // as the owner is not known).
            if let (Some(id), 0) = (req.interface_id, client.uid)
                && self
                    .forwards
                    .forget(id, &req.network, &req.forward)
                    .map_err(|source| DaemonError::StateFile {
                        what: "cannot save forwards to",
                        path: self.state_dir.join(forwards::FORWARDS_FILE),
                        source,
                    })?
            {
                info!(network = %req.network, interface = %id, forward = %req.forward, "kept forward removed");
                return Ok(());
            }
            return Err(Self::no_such_interface(&req.interface()));
        };
        let iface = &self.interfaces[&id];
        let Some(found) = iface
            .forwards
            .iter()
            .find(|p| p.forward == req.forward)
            .copied()
        else {
            return Err(DaemonError::NoSuchForward {
                id,
                forward: req.forward,
                has: iface.forwards.iter().map(|p| p.forward).collect(),
            });
        };
        if found.origin == ForwardOrigin::Config {
            return Err(DaemonError::DeclaredForward {
                id,
                forward: req.forward,
                network: req.network.clone(),
            });
        }
        let iface = self.interfaces.get_mut(&id).expect("attached");
        iface.forwards.retain(|p| p.forward != req.forward);
        if let Err(e) = self.sync_host() {
            let iface = self.interfaces.get_mut(&id).expect("attached");
            iface.forwards.push(found);
            return Err(e);
        }
        if let Err(e) = self.forwards.forget(id, &req.network, &req.forward) {
            warn!(interface = %id, "cannot save forwards: {e}; {} may come back at the next attach", req.forward);
        }
        info!(network = %req.network, interface = %id, forward = %req.forward, "port unpublished");
        self.forward_event(&req, id, false);
        self.save_record(id);
        Ok(())
    }

    fn forward_event(&self, req: &ForwardRequest, id: InterfaceId, added: bool) {
        let what = What::Forward {
            interface_id: id,
            forward: req.forward,
            added,
        };
        self.events.emit(Some(&req.network), what);
    }

    pub fn forward_list(&self) -> Response {
        let mut forwards = Vec::new();
        for (id, iface) in &self.interfaces {
            let cfg = self.config.network(&iface.network).expect("attached");
            let v6 = iface.ipv6_address(cfg);
            // Only interfaces with an IPv4 address have forwards.
            let Some(ip) = iface.ip else { continue };
            for p in &iface.forwards {
                let port = p.forward.guest_port;
                forwards.push(ForwardStatus {
                    network: iface.network.clone(),
                    interface_id: *id,
                    name: iface.name.clone(),
                    forward: p.forward,
                    guest: (ip, port).into(),
                    guest6: v6.map(|ip| (ip, port).into()),
                    origin: p.origin,
                });
            }
        }
        Response::Forwards { forwards }
    }
}
