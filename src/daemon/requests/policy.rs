//! `policy show` and `policy set`: an interface's connect/listen policy,
//! changed for new connections at once, its guard and the firewall with it
//! (and what it learned by name, of names the new policy still allows);
//! and its rate limits, which its guard holds.

use tracing::info;

use crate::api::{Enforcement, InterfaceRef, PolicyPart, PolicySetRequest, Response};
use crate::daemon::client::Client;
use crate::daemon::errors::DaemonError;
use crate::daemon::leftovers::Leftovers;
use crate::daemon::policies::{
    check_ceiling, check_policy_possible, enforcement, no_address_for_policy, with_network_secrets,
};
use crate::daemon::state::Daemon;
use crate::events::What;
use crate::host::guard::PortGuard;
use crate::policy::Policy;

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
            enforced: self.enforcement_of(&iface.network),
        })
    }

    /// What the network enforces of its interfaces' policies.
    fn enforcement_of(&self, network: &str) -> Option<Enforcement> {
        let cfg = self.config.network(network)?;
        let by = (self.config.source.as_ref())
            .map_or(crate::config::DEFAULT_CONFIG_PATH.into(), |p| {
                p.display().to_string()
            });
        enforcement(cfg, &by)
    }

    /// `policy set`: the new policy holds for new connections at once, a
    /// new rate limit for every frame from then on.
    pub fn policy_set(
        &mut self,
        client: &Client,
        req: PolicySetRequest,
    ) -> Result<Response, DaemonError> {
        let cfg = self
            .config
            .network(&req.network)
            .ok_or_else(|| self.unknown_network(&req.network))?;
        let which = req.interface();
        let id = self
            .interface_named(client, &which, "change its policy")?
            .ok_or_else(|| Self::no_such_interface(&which))?;
        let iface = &self.interfaces[&id];
        let policy = match req.only {
            Some(PolicyPart::RateLimit) => changed(&iface.policy, &req),
            _ => with_network_secrets(changed(&iface.policy, &req), cfg),
        };
        check_policy_possible(&policy, cfg, self.host.devices.bridge_netfilter())?;
        check_ceiling(&policy, cfg)?;
        if iface.ip.is_none() && !policy.is_open() {
            return Err(no_address_for_policy(&req.network));
        }
        let guard_before = self.guard_of(iface);
        let iface = self.interfaces.get_mut(&id).expect("attached");
        let before = std::mem::replace(&mut iface.policy, policy.clone());
        let guard_after = self.guard_of(&self.interfaces[&id]);
        let guarded = self.change_guard(guard_before.as_ref(), guard_after.as_ref());
        if let Err(e) = guarded.and_then(|()| self.sync_host()) {
            let mut left = Leftovers::default();
            let back = self.change_guard(guard_after.as_ref(), guard_before.as_ref());
            left.note("put its guard back", back);
            self.interfaces.get_mut(&id).expect("attached").policy = before;
            left.note("put linnet's tables back", self.sync_host());
            left.log(&format!("interface {id}: undoing a policy"));
            return Err(e);
        }
        info!(network = %req.network, interface = %id, policy = ?policy, "policy set");
        let what = What::Policy {
            interface_id: id,
            policy: policy.clone(),
        };
        self.events.emit(Some(&req.network), what);
        self.save_record(id);
        Ok(Response::Policy {
            interface_id: id,
            policy,
            learned: self.names.shown(&self.interfaces[&id].tap),
            enforced: self.enforcement_of(&req.network),
        })
    }

    /// A port's guard from `old` to `new`: changed, added (a rate limit
    /// on a port its network does not guard) or removed.
    fn change_guard(
        &mut self,
        old: Option<&PortGuard>,
        new: Option<&PortGuard>,
    ) -> Result<(), DaemonError> {
        let tables = &mut *self.host.tables;
        match (old, new) {
            (Some(old), Some(new)) => tables.update_guard_port(old, new)?,
            (None, Some(new)) => self.guard.add(tables, new)?,
            (Some(old), None) => tables.remove_guard_ports(std::slice::from_ref(old))?,
            (None, None) => {}
        }
        Ok(())
    }
}

/// The policy `req` leaves: the one it gives, or `current` with only the
/// part it names changed.
fn changed(current: &Policy, req: &PolicySetRequest) -> Policy {
    match req.only {
        None => req.policy.clone(),
        Some(PolicyPart::Rules) => Policy {
            rate_limit: current.rate_limit,
            ..req.policy.clone()
        },
        Some(PolicyPart::RateLimit) => Policy {
            rate_limit: req.policy.rate_limit,
            ..current.clone()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::RateLimits;

    #[test]
    fn policy_set_changes_the_part_it_names_and_keeps_the_other() {
        let current = Policy {
            egress: vec!["10.0.0.0/8".parse().unwrap()],
            rate_limit: RateLimits::both("10mbit".parse().unwrap()),
            ..Policy::default()
        };
        let given = Policy {
            ingress: vec!["22/tcp".parse().unwrap()],
            rate_limit: RateLimits::both("1mbit".parse().unwrap()),
            ..Policy::default()
        };
        let req = |only| PolicySetRequest {
            network: "shared".into(),
            interface_id: None,
            name: Some("vm".into()),
            policy: given.clone(),
            only,
        };
        assert_eq!(changed(&current, &req(None)), given);
        let rules = changed(&current, &req(Some(PolicyPart::Rules)));
        assert_eq!((rules.egress.len(), rules.ingress.len()), (0, 1));
        assert_eq!(rules.rate_limit, current.rate_limit);
        let rate = changed(&current, &req(Some(PolicyPart::RateLimit)));
        assert_eq!(
            (rate.egress, rate.ingress),
            (current.egress.clone(), vec![])
        );
        assert_eq!(rate.rate_limit, given.rate_limit);
    }
}
