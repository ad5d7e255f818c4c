//! Connect/listen policies on the daemon's side: what a policy needs of
//! its network (anti-spoofing, a known IPv4 address, br_netfilter), and
//! each interface's policy as the firewall takes it. The rules are made by
//! `host::firewall`; `requests::policy` shows and sets them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::errors::DaemonError;
use super::guarding::port_guard;
use super::interface::Interface;
use super::secret_proxies::ProxiedNetwork;
use super::secrets::Secrets;
use crate::api::Enforcement;
use crate::config::NetworkConfig;
use crate::gate::wire::GatedVm;
use crate::host::firewall::InterfacePolicy;
use crate::policy::Policy;
use crate::secret_proxy::ProxiedVm;
use crate::services::name_gate::{NameGate, NamedVm};
use crate::types::InterfaceId;

/// A policy is enforced by the VM's addresses; without DHCP and a static
/// lease linnet does not know its IPv4 one.
pub(super) fn no_address_for_policy(network: &str) -> DaemonError {
    DaemonError::PolicyImpossible {
        network: network.into(),
        why: format!(
            "network \"{network}\" has DHCP off and no static lease for this interface, so linnet does not know its IPv4 address and cannot enforce a connect/listen policy: give it a static lease (dhcp.static with its interface_id or MAC)"
        ),
    }
}

/// A policy knows a VM by its addresses, which anti-spoofing keeps its own;
/// and between VMs of one bridge it needs their frames to pass the inet
/// hooks, which only the br_netfilter module does.
pub(super) fn check_policy_possible(
    policy: &Policy,
    cfg: &NetworkConfig,
    bridge_netfilter: bool,
) -> Result<(), DaemonError> {
    if let Some(rule) = (policy.secrets.iter()).find(|r| !policy.reaches_secret_host(&r.host)) {
        return Err(DaemonError::PolicyImpossible {
            network: cfg.name.clone(),
            why: format!(
                "the secret rule {rule} names a host the VM's connect rules do not let it reach by name on port {}/tcp: add --allow-connect {}:{}",
                crate::policy::SECRET_PORT,
                rule.host,
                crate::policy::SECRET_PORT
            ),
        });
    }
    if policy.is_open() {
        return Ok(());
    }
    if cfg.own().is_none() {
        return Err(DaemonError::PolicyImpossible {
            network: cfg.name.clone(),
            why: format!(
                "network \"{}\" is on a LAN ({} mode), where connect/listen policies are not enforced yet: they are rules of linnet's own firewall on linnet's own bridges; attach without --allow-connect/--allow-listen, or use a shared or host network",
                cfg.name,
                cfg.mode()
            ),
        });
    }
    if policy.has_names() && cfg.own().is_some_and(|own| !own.dns.enabled) {
        return Err(DaemonError::PolicyImpossible {
            network: cfg.name.clone(),
            why: format!(
                "network \"{}\": {}",
                cfg.name,
                crate::config::NO_NAMES_WITHOUT_DNS
            ),
        });
    }
    if !cfg.anti_spoofing {
        return Err(DaemonError::PolicyImpossible {
            network: cfg.name.clone(),
            why: format!(
                "network \"{}\": a connect/listen policy {}",
                cfg.name,
                crate::config::NO_POLICY_WITHOUT_ANTI_SPOOFING
            ),
        });
    }
    if bridge_netfilter {
        return Ok(());
    }
    Err(DaemonError::NoBrNetfilter)
}

/// `policy`, a VM's own (given on attach or by `policy set`), with the
/// network's secret rules it gets: those the network's policy has, when
/// the network enforces it and `policy` reaches their hosts; none else (a
/// policy of its own replaces the network's, secret rules and all). What
/// the request said of them is never kept.
pub(super) fn with_network_secrets(mut policy: Policy, cfg: &NetworkConfig) -> Policy {
    let mut rules = match cfg.enforced.policy {
        true => cfg.policy().network_secrets.clone(),
        false => Vec::new(),
    };
    rules.retain(|r| policy.reaches_secret_host(&r.host));
    policy.network_secrets = rules;
    policy
}

/// A policy a restarted daemon adopts, with the network's secret rules
/// as networks.yaml has them now: none it dropped, and under an enforced
/// policy each it added.
pub(super) fn adopted_network_secrets(mut policy: Policy, cfg: &NetworkConfig) -> Policy {
    if cfg.enforced.policy {
        return with_network_secrets(policy, cfg);
    }
    let now = &cfg.policy().network_secrets;
    policy.network_secrets.retain(|r| now.contains(r));
    policy
}

/// Refuses a policy past what `cfg`'s network enforces (`enforced: true`
/// on its policy or rate limit): a VM's owner may narrow, never widen.
pub(super) fn check_ceiling(policy: &Policy, cfg: &NetworkConfig) -> Result<(), DaemonError> {
    cfg.ceiling()
        .admits(policy)
        .map_err(|widening| DaemonError::AboveCeiling {
            network: cfg.name.clone(),
            widening,
        })
}

/// What `cfg`'s network enforces of its interfaces' policies, said for
/// `policy show`; None when nothing. `by`: the file that enforces it.
pub(super) fn enforcement(cfg: &NetworkConfig, by: &str) -> Option<Enforcement> {
    cfg.ceiling().is_set().then(|| Enforcement {
        policy: cfg.enforced.policy,
        rate_limit: cfg.enforced.rate_limit,
        by: by.to_string(),
    })
}

/// The connect/listen policies of `cfg`'s network's interfaces, with the
/// addresses that identify their VMs and what they learned by name.
pub(super) fn interface_policies<'a>(
    cfg: &NetworkConfig,
    interfaces: impl Iterator<Item = &'a Interface>,
    names: &NameGate,
    refused: &BTreeMap<String, u64>,
) -> Vec<InterfacePolicy> {
    interfaces
        .filter(|i| i.network == cfg.name && !i.policy.is_open())
        .map(|i| InterfacePolicy {
            tap: i.tap.clone(),
            addrs: vm_addresses(cfg, i),
            policy: i.policy.clone(),
            learned: names.elements(&i.tap),
            refused: refused.get(&i.tap).copied().unwrap_or(0),
        })
        .collect()
}

/// The interfaces of `cfg`'s network with names in their policy, as the
/// name gate knows them.
pub(super) fn named_vms<'a>(
    cfg: &NetworkConfig,
    interfaces: impl Iterator<Item = (&'a InterfaceId, &'a Interface)>,
) -> Vec<NamedVm> {
    let Some(own) = cfg.own() else {
        return Vec::new();
    };
    interfaces
        .filter(|(_, i)| i.network == cfg.name && i.policy.has_names())
        .map(|(id, i)| NamedVm {
            network: cfg.name.clone(),
            interface_id: *id,
            name: i.name.clone(),
            tap: i.tap.clone(),
            addrs: vm_addresses(cfg, i),
            policy: i.policy.clone(),
            bounds: own.dns.learned_ttl,
        })
        .collect()
}

/// The networks whose VMs have secret rules, with those VMs as the
/// secrets proxy knows them (as the gate does, with their grants).
pub(super) fn proxied_networks<'a>(
    configs: impl Iterator<Item = &'a NetworkConfig>,
    interfaces: &BTreeMap<InterfaceId, Interface>,
    secrets: &Secrets,
) -> Vec<ProxiedNetwork> {
    configs
        .filter_map(|cfg| {
            let own = cfg.own()?;
            let vms: Vec<(ProxiedVm, Option<String>)> = (interfaces.iter())
                .filter(|(_, i)| i.network == cfg.name && i.policy.has_secrets())
                .map(|(id, i)| {
                    let vm = ProxiedVm {
                        vm: GatedVm {
                            interface_id: *id,
                            addrs: vm_addresses(cfg, i),
                            policy: i.policy.clone(),
                        },
                        grants: secrets.grants(&i.policy, i.uid, &cfg.name),
                    };
                    (vm, i.name.clone())
                })
                .collect();
            (!vms.is_empty()).then(|| ProxiedNetwork {
                network: cfg.name.clone(),
                gateway: own.gateway,
                upstream_ca: cfg.upstream_ca.clone(),
                vms,
            })
        })
        .collect()
}

/// The addresses a VM's packets come from, which anti-spoofing keeps its
/// own: its IPv4 and IPv6 addresses (those it formed itself too), and a
/// clone's on the network.
fn vm_addresses(cfg: &NetworkConfig, i: &Interface) -> Vec<IpAddr> {
    port_guard(cfg, &i.tap, (i.mac, i.ip), &i.policy)
        .ipv6
        .into_iter()
        .chain(i.formed6.iter().copied())
        .map(IpAddr::V6)
        .chain(i.ip.map(IpAddr::V4))
        .chain(
            i.as_clone
                .as_ref()
                .and_then(|c| c.held_address())
                .map(IpAddr::V4),
        )
        .collect()
}
