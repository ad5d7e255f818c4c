//! `linnet doctor`: per network, what blocks its traffic, its uplinks, and
//! what its kind says of itself; for a network across hosts, what FRR
//! says of it.

use std::path::Path;

use crate::api::{DoctorReport, NetworkDoctor, Response};
use crate::config::Evpn;
use crate::daemon::coexist::Uplinks;
use crate::daemon::drivers;
use crate::daemon::state::Daemon;
use crate::frr::health;
use crate::host::frr_vty;

impl Daemon {
    pub fn doctor(&self, network: Option<&str>) -> Response {
        if let Some(name) = network
            && self.config.network(name).is_none()
        {
            return self.unknown_network(name).into_response();
        }
        let docker_chain: Vec<String> = self
            .view
            .docker_chain
            .iter()
            .map(|f| f.to_string())
            .collect();
        let networks = self
            .config
            .networks
            .values()
            .filter(|c| network.is_none_or(|n| n == c.name))
            .map(|cfg| {
                let up = self.networks.contains_key(&cfg.name);
                let checks = self.view.checks.get(&cfg.name).cloned().unwrap_or_default();
                let kind = drivers::features(cfg);
                let mut notes = Vec::new();
                if !up {
                    notes.push("down: checked when it comes up (at its first attach)".into());
                }
                let uplinks = &self.view.uplinks;
                let families = [
                    ("IPv4", true, &uplinks.used4, &uplinks.ipv4),
                    ("IPv6", cfg.ipv6().is_some(), &uplinks.used6, &uplinks.ipv6),
                ];
                for (family, on, used, defaults) in families {
                    if kind.nat_uplink && on && used.is_none() {
                        notes.push(format!(
                            "no {family} route to the internet: VMs cannot reach beyond this host over {family}"
                        ));
                    }
                    if defaults.len() > 1 {
                        notes.push(format!(
                            "several {family} default routes: {} (the lowest metric is used)",
                            Uplinks::describe(defaults).join(", ")
                        ));
                    }
                }
                notes.extend(drivers::doctor_notes(cfg));
                if cfg.own().is_some_and(|own| !own.dhcp.enabled) {
                    notes.push("DHCP is off: guests set their own IPv4 address; interfaces without a static lease have no ip_address".into());
                }
                if !self.config.firewall.docker_user && !docker_chain.is_empty() {
                    notes.push("firewall.docker_user is false: linnet adds no rules to DOCKER-USER".into());
                }
                NetworkDoctor {
                    name: cfg.name.clone(),
                    mode: cfg.mode(),
                    bridge: drivers::link_of(cfg),
                    up,
                    uplink_ipv4: kind.nat_uplink.then(|| self.view.uplinks.used4.clone()).flatten(),
                    uplink_ipv6: (kind.nat_uplink && cfg.ipv6().is_some())
                        .then(|| self.view.uplinks.used6.clone())
                        .flatten(),
                    docker_user_rules: self.view.docker_rules.contains(&cfg.name),
                    checks,
                    notes,
                    fabric: None,
                }
            })
            .collect();
        Response::Doctor {
            report: Box::new(DoctorReport {
                uplinks_ipv4: Uplinks::describe(&self.view.uplinks.ipv4),
                uplinks_ipv6: Uplinks::describe(&self.view.uplinks.ipv6),
                firewalls: self.view.firewalls.clone(),
                docker_user_chain: docker_chain,
                docker_user_enabled: self.config.firewall.docker_user,
                ipv4_forwarding: self.host.devices.forwarding_on(false),
                ipv6_forwarding: self.host.devices.forwarding_on(true),
                errors: self.view.errors.clone(),
                networks,
            }),
        }
    }
}

/// A network across hosts `linnet doctor` asks FRR about: its name, its
/// `evpn:`, and whether it is up here.
pub struct AcrossHosts {
    pub network: String,
    pub evpn: Evpn,
    pub up: bool,
}

impl Daemon {
    /// The networks across hosts a doctor's report covers.
    pub fn across_hosts(&self, network: Option<&str>) -> Vec<AcrossHosts> {
        self.config
            .networks
            .values()
            .filter(|c| network.is_none_or(|n| n == c.name))
            .filter_map(|c| {
                Some(AcrossHosts {
                    network: c.name.clone(),
                    evpn: c.own()?.evpn.clone()?,
                    up: self.networks.contains_key(&c.name),
                })
            })
            .collect()
    }
}

/// Adds what FRR (at `vty_socket`) says of each network across hosts to a
/// doctor's report. Run without the daemon's lock: FRR may take seconds.
pub async fn add_fabric_health(
    response: &mut Response,
    across: Vec<AcrossHosts>,
    vty_socket: &Path,
) {
    let Response::Doctor { report } = response else {
        return;
    };
    for a in across {
        let answers = frr_vty::ask(vty_socket, &health::commands(a.evpn.vni)).await;
        if let Some(n) = report.networks.iter_mut().find(|n| n.name == a.network) {
            n.fabric = Some(health::health(&a.evpn, a.up, answers));
        }
    }
}
