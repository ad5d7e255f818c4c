//! Connect/listen policies on the daemon's side: what each interface's
//! policy is, who may change it, and what a policy needs (anti-spoofing,
//! a known IPv4 address, br_netfilter). The rules are made by
//! `host::firewall`.

use std::net::IpAddr;

use tracing::info;

use super::client::Client;
use super::errors::DaemonError;
use super::guarding::port_guard;
use super::state::Daemon;
use crate::api::{InterfaceRef, PolicySetRequest, Response};
use crate::config::NetworkConfig;
use crate::host::firewall::InterfacePolicy;
use crate::policy::Policy;

impl Daemon {
    /// `policy show`.
    pub fn policy_show(
        &self,
        client: &Client,
        which: &InterfaceRef,
    ) -> Result<Response, DaemonError> {
        let id = self
            .interface_named(client, which, "policy")?
            .ok_or_else(|| Self::no_such_interface(which))?;
        Ok(Response::Policy {
            interface_id: id,
            policy: self.interfaces[&id].policy.clone(),
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
        check_policy_possible(&req.policy, cfg)?;
        let which = req.interface();
        let id = self
            .interface_named(client, &which, "policy")?
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
            if let (Some(old), Some(new)) = (&guard_before, &guard_after) {
                let _ = self.host.tables.update_guard_port(new, old);
            }
            self.interfaces.get_mut(&id).expect("attached").policy = before;
            let _ = self.sync_host();
            return Err(e);
        }
        info!(network = %req.network, interface = %id, policy = ?req.policy, "policy set");
        self.save_record(id);
        Ok(Response::Policy {
            interface_id: id,
            policy: req.policy,
        })
    }
    /// The connect/listen policies of a network's interfaces, with the
    /// addresses that identify their VMs.
    pub(super) fn policies(&self, cfg: &NetworkConfig) -> Vec<InterfacePolicy> {
        self.interfaces
            .values()
            .filter(|i| i.network == cfg.name && !i.policy.is_open())
            .map(|i| InterfacePolicy {
                tap: i.tap.clone(),
                addrs: port_guard(cfg, &i.tap, (i.mac, i.ip), &i.policy)
                    .ipv6
                    .into_iter()
                    .map(IpAddr::V6)
                    .chain(i.ip.map(IpAddr::V4))
                    .chain(
                        i.as_clone
                            .as_ref()
                            .and_then(|c| c.held_address())
                            .map(IpAddr::V4),
                    )
                    .collect(),
                policy: i.policy.clone(),
            })
            .collect()
    }
}

/// A policy is enforced by the VM's addresses; without DHCP and a static
/// lease linnet does not know its IPv4 one.
pub(super) fn no_address_for_policy(network: &str) -> DaemonError {
    DaemonError::BadRequest(format!(
        "network \"{network}\" has DHCP off and no static lease for this interface, so linnet does not know its IPv4 address and cannot enforce a connect/listen policy: give it a static lease (dhcp.static with its interface_id or MAC)"
    ))
}

/// A policy knows a VM by its addresses, which anti-spoofing keeps its own;
/// and between VMs of one bridge it needs their frames to pass the inet
/// hooks, which only the br_netfilter module does.
pub(super) fn check_policy_possible(
    policy: &Policy,
    cfg: &NetworkConfig,
) -> Result<(), DaemonError> {
    if policy.is_open() {
        return Ok(());
    }
    if cfg.lan.is_some() {
        return Err(DaemonError::BadRequest(format!(
            "network \"{}\" is on a LAN ({} mode), where connect/listen policies are not enforced yet: they are rules of linnet's own firewall on linnet's own bridges; attach without --allow-connect/--allow-listen, or use a shared or host network",
            cfg.name, cfg.mode
        )));
    }
    if !cfg.anti_spoofing {
        return Err(DaemonError::BadRequest(format!(
            "network \"{}\": a connect/listen policy {}",
            cfg.name,
            crate::config::NO_POLICY_WITHOUT_ANTI_SPOOFING
        )));
    }
    if std::path::Path::new("/proc/sys/net/bridge").exists() {
        return Ok(());
    }
    Err(DaemonError::HostSetup(
        "a connect/listen policy needs the br_netfilter module, so that traffic between VMs of one network passes linnet's firewall: run `modprobe br_netfilter` (and add it to /etc/modules-load.d)".into(),
    ))
}
