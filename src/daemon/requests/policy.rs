//! `policy show` and `policy set`: an interface's connect/listen policy,
//! changed for new connections at once, its guard and the firewall with it
//! (and what it learned by name, of names the new policy still allows).

use tracing::info;

use crate::api::{InterfaceRef, PolicySetRequest, Response};
use crate::daemon::client::Client;
use crate::daemon::errors::DaemonError;
use crate::daemon::leftovers::Leftovers;
use crate::daemon::policies::{check_policy_possible, no_address_for_policy};
use crate::daemon::state::Daemon;

impl Daemon {
    /// `policy show`.
    pub fn policy_show(
        &self,
        client: &Client,
        which: &InterfaceRef,
    ) -> Result<Response, DaemonError> {
        let id = self
            .interface_named(client, which, "change its policy")?
            .ok_or_else(|| Self::no_such_interface(which))?;
        let iface = &self.interfaces[&id];
        Ok(Response::Policy {
            interface_id: id,
            policy: iface.policy.clone(),
            learned: self.names.shown(&iface.tap),
        })
    }

    /// `policy set`: the new policy holds for new connections at once.
    pub fn policy_set(
        &mut self,
        client: &Client,
        req: PolicySetRequest,
    ) -> Result<Response, DaemonError> {
        let cfg = self
            .config
            .network(&req.network)
            .ok_or_else(|| self.unknown_network(&req.network))?;
        check_policy_possible(&req.policy, cfg, self.host.devices.bridge_netfilter())?;
        let which = req.interface();
        let id = self
            .interface_named(client, &which, "change its policy")?
            .ok_or_else(|| Self::no_such_interface(&which))?;
        let iface = self.interfaces.get_mut(&id).expect("attached");
        if iface.ip.is_none() && !req.policy.is_open() {
            return Err(no_address_for_policy(&req.network));
        }
        let guard_before = self.guard_of(&self.interfaces[&id]);
        let iface = self.interfaces.get_mut(&id).expect("attached");
        let before = std::mem::replace(&mut iface.policy, req.policy.clone());
        let guard_after = self.guard_of(&self.interfaces[&id]);
        let guarded = match (&guard_before, &guard_after) {
            (Some(old), Some(new)) => self.host.tables.update_guard_port(old, new),
            _ => Ok(()),
        };
        if let Err(e) = guarded
            .map_err(DaemonError::from)
            .and_then(|()| self.sync_host())
        {
            let mut left = Leftovers::default();
            if let (Some(old), Some(new)) = (&guard_before, &guard_after) {
                let back = self.host.tables.update_guard_port(new, old);
                left.note("put its guard back", back);
            }
            self.interfaces.get_mut(&id).expect("attached").policy = before;
            left.note("put linnet's tables back", self.sync_host());
            left.log(&format!("interface {id}: undoing a policy"));
            return Err(e);
        }
        info!(network = %req.network, interface = %id, policy = ?req.policy, "policy set");
        self.save_record(id);
        Ok(Response::Policy {
            interface_id: id,
            policy: req.policy,
            learned: self.names.shown(&self.interfaces[&id].tap),
        })
    }
}
