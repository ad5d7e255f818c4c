//! Living with the host's other firewalls and routes: what blocks the
//! networks' traffic (logged once, shown in attach replies, `linnet ls` and
//! `linnet doctor`), linnet's rules in Docker's DOCKER-USER, putting back
//! linnet's own tables and forwarding sysctls when something removes them,
//! and following the default route.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::IpNet;
use tracing::{info, warn};

use super::guarding::Restore;
use super::state::Daemon;
use crate::api::{DoctorReport, NetworkDoctor, Response};
use crate::coexist::{self, FlowCheck, NetworkView};
use crate::config::{Mode, NetworkConfig};
use crate::host::egress;
use crate::host::guard::{Hook, PortGuard};
use crate::host::legacy::LegacyChain;
use crate::host::netlink::{LinkSettings, Route};
use crate::host::ruleset::{Owner, Ruleset, Shape};
use crate::host::{self, docker_user, firewall, guard};

/// The default routes of both families, the one in use first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Uplinks {
    /// The default routes of the main table (interface, metric).
    pub ipv4: Vec<(String, u32)>,
    pub ipv6: Vec<(String, u32)>,
    /// The interface the kernel routes internet traffic out of (also with
    /// policy routing or a VPN's 0/1 routes); None: no route.
    pub used4: Option<String>,
    pub used6: Option<String>,
}

/// Where the route lookups for "the internet" go: nothing is sent there.
const PROBE4: Ipv4Addr = Ipv4Addr::new(1, 1, 1, 1);
const PROBE6: Ipv6Addr = Ipv6Addr::new(0x2606, 0x4700, 0x4700, 0, 0, 0, 0, 0x1111);

impl Uplinks {
    fn describe(routes: &[(String, u32)]) -> Vec<String> {
        routes
            .iter()
            .map(|(dev, metric)| format!("{dev} (metric {metric})"))
            .collect()
    }
}

/// What was found the last time the host was looked at.
#[derive(Default)]
pub struct HostView {
    pub uplinks: Uplinks,
    /// Per network: its flows' checks.
    pub checks: BTreeMap<String, Vec<FlowCheck>>,
    /// Networks whose rules are in DOCKER-USER (as last read).
    pub docker_rules: BTreeSet<String>,
    pub docker_chain: Vec<&'static str>,
    pub firewalls: Vec<String>,
    pub errors: Vec<String>,
    /// Set when a rebuilt table did not list as expected (see
    /// `check_rebuilt`).
    pub shapes_unreliable: bool,
}

/// How long after a failed restore of the guard table it is tried again.
const GUARD_RETRY: Duration = Duration::from_secs(5);

impl Daemon {
    /// Re-reads the default routes; logs when the uplink changes.
    pub async fn refresh_uplinks(&mut self) {
        let mut uplinks = Uplinks::default();
        let names: BTreeMap<u32, String> = match self.host.links.links().await {
            Ok(links) => links.into_iter().map(|l| (l.index, l.name)).collect(),
            Err(e) => {
                warn!("cannot list links for the uplink: {e}");
                return;
            }
        };
        if self.host_loopback.is_some() {
            // A rootless daemon's way out, made again whenever the egress
            // tool is.
            let egress = names.iter().find(|(_, n)| *n == egress::EGRESS_IFNAME);
            if let Some((&index, _)) = egress.filter(|(i, _)| Some(**i) != self.egress_tuned) {
                let deeper = LinkSettings {
                    txqueuelen: Some(egress::EGRESS_TXQUEUELEN),
                    ..Default::default()
                };
                match self.host.links.configure(index, deeper).await {
                    Ok(()) => self.egress_tuned = Some(index),
                    Err(e) => warn!("cannot deepen the queue of {}: {e}", egress::EGRESS_IFNAME),
                }
            }
        }
        for (ipv6, out) in [(false, &mut uplinks.ipv4), (true, &mut uplinks.ipv6)] {
            match self.host.links.default_routes(ipv6).await {
                Ok(routes) => {
                    *out = routes
                        .iter()
                        .map(|r: &Route| {
                            let dev = r
                                .oif
                                .and_then(|i| names.get(&i).cloned())
                                .unwrap_or_else(|| "multipath".into());
                            (dev, r.metric)
                        })
                        .collect();
                }
                Err(e) => warn!("cannot read the default routes: {e}"),
            }
        }
        for (probe, used) in [
            (IpAddr::V4(PROBE4), &mut uplinks.used4),
            (IpAddr::V6(PROBE6), &mut uplinks.used6),
        ] {
            match self.host.links.route_to(probe).await {
                Ok(oif) => *used = oif.and_then(|i| names.get(&i).cloned()),
                Err(e) => warn!("cannot look up the uplink: {e}"),
            }
        }
        let before = std::mem::take(&mut self.view.uplinks);
        let moved = (&uplinks.used4, &uplinks.used6) != (&before.used4, &before.used6);
        if moved && !self.networks.is_empty() {
            let show = |u: &Option<String>| u.clone().unwrap_or_else(|| "none".into());
            info!(
                ipv4 = %show(&uplinks.used4),
                ipv6 = %show(&uplinks.used6),
                was_ipv4 = %show(&before.used4),
                was_ipv6 = %show(&before.used6),
                "uplink changed: NAT follows the route for new connections"
            );
            let shared = |ipv6: bool| {
                self.networks
                    .values()
                    .any(|n| n.config.mode == Mode::Shared && (!ipv6 || n.config.ipv6.is_some()))
            };
            for (family, used, ipv6) in [
                ("IPv4", &uplinks.used4, false),
                ("IPv6", &uplinks.used6, true),
            ] {
                if used.is_none() && shared(ipv6) {
                    warn!(
                        "no {family} route to the internet: VMs of shared networks cannot reach beyond this host over {family}"
                    );
                }
            }
        }
        self.view.uplinks = uplinks;
    }

    /// Looks at the namespace's firewalls: puts back linnet's own tables if
    /// they are gone, keeps its DOCKER-USER rules in place, and records
    /// (and logs, when it changes) what blocks each active network.
    pub fn check_host(&mut self) {
        let mut errors = Vec::new();
        let mut rs = match self.host.tables.ruleset() {
            Ok(rs) => rs,
            Err(e) => {
                warn!("cannot read the nftables ruleset: {e}");
                errors.push(format!("nftables: {e}"));
                Ruleset::default()
            }
        };
        // After a repair, read again: the checks see what is now there.
        if errors.is_empty()
            && self.restore_tables()
            && let Ok(again) = self.host.tables.ruleset()
        {
            rs = again;
        }
        if errors.is_empty()
            && self.sync_docker_user(&rs)
            && let Ok(again) = self.host.tables.ruleset()
        {
            rs = again;
        }
        let legacy = self.host.tables.legacy_chains().unwrap_or_else(|e| {
            errors.push(format!("legacy iptables: {e}"));
            Vec::new()
        });
        self.restore_forwarding();
        // Networks on a LAN have nothing in linnet's tables to check.
        let names: Vec<String> = self
            .networks
            .values()
            .filter(|n| n.config.lan.is_none())
            .map(|n| n.config.name.clone())
            .collect();
        let mut checks = BTreeMap::new();
        for name in names {
            let cfg = self.networks[&name].config.clone();
            let found = self.network_checks(&rs, &legacy, &cfg);
            let old = self
                .view
                .checks
                .get(&name)
                .map(|c| warnings(c))
                .unwrap_or_default();
            let new = warnings(&found);
            for w in new.iter().filter(|w| !old.contains(w)) {
                warn!(network = %name, "{w}");
            }
            if !old.is_empty() && new.is_empty() {
                info!(network = %name, "nothing blocks the network's traffic any more");
            }
            checks.insert(name, found);
        }
        self.view.checks = checks;
        self.view.docker_chain = docker_user::present(&rs);
        self.view.docker_rules = docker_user::tagged(&rs);
        self.view.firewalls = firewalls(&rs, &legacy);
        self.view.errors = errors;
    }

    /// The warnings for one network (empty while it is down).
    pub(super) fn network_warnings(&self, network: &str) -> Vec<String> {
        let mut out = self
            .view
            .checks
            .get(network)
            .map(|c| warnings(c))
            .unwrap_or_default();
        out.extend(self.forwards.shadow_warnings(network));
        out
    }

    fn network_checks(
        &self,
        rs: &Ruleset,
        legacy: &[LegacyChain],
        cfg: &NetworkConfig,
    ) -> Vec<FlowCheck> {
        let bridge = host::bridge_name(&cfg.name);
        let (up4, up6) = (&self.view.uplinks.used4, &self.view.uplinks.used6);
        let view = NetworkView {
            bridge: &bridge,
            shared: cfg.mode == Mode::Shared,
            dhcp: cfg.dhcp.enabled,
            dns: cfg.dns.enabled,
            subnet: IpNet::V4(cfg.subnet),
            gateway: cfg.gateway.into(),
            ipv6: cfg
                .ipv6
                .as_ref()
                .map(|v6| (IpNet::V6(v6.prefix), v6.gateway.into())),
            uplink4: up4.as_deref(),
            uplink6: up6.as_deref(),
            br_netfilter: std::path::Path::new("/proc/sys/net/bridge").exists(),
        };
        coexist::flows(&view)
            .iter()
            .map(|flow| {
                let mut c = coexist::check(rs, flow, &bridge);
                coexist::check_legacy(legacy, flow, &bridge, &mut c);
                c
            })
            .collect()
    }

    /// Whether `inet linnet` or `bridge linnet` is gone or lost rules
    /// while linnet needs it.
    /// One that cannot even be read counts as damaged: held ports fail
    /// closed.
    pub(super) fn own_tables_damaged(&mut self) -> bool {
        let unreliable = self.view.shapes_unreliable;
        let inet_shape = firewall::shape(&self.firewall_networks());
        let has_firewall = self.has_firewall();
        let mut damaged =
            |family: &str, expected: Option<&Shape>| match self.host.tables.linnet_shape(family) {
                Ok(Some(actual)) => expected.is_some_and(|e| *e != actual),
                Ok(None) | Err(_) => true,
            };
        let inet = has_firewall && damaged("inet", (!unreliable).then_some(&inet_shape));
        let expected = guard::expected_shape().filter(|_| !unreliable);
        inet || (self.guard.ready() && damaged("bridge", expected))
            || self.egress_damage().is_some()
    }

    /// Puts back `inet linnet` and `bridge linnet` (with every guarded
    /// port) if they are gone. Returns whether it did.
    fn restore_tables(&mut self) -> bool {
        let mut restored = false;
        if self.has_firewall() {
            let expected = firewall::shape(&self.firewall_networks());
            let expected = (!self.view.shapes_unreliable).then_some(&expected);
            if let Some(damage) = self.damage("inet", expected) {
                warn!("linnet's table inet linnet {damage}: putting it back");
                match self.sync_host() {
                    Ok(()) => {
                        info!("restored table inet linnet");
                        restored = true;
                        self.check_rebuilt("inet", expected);
                    }
                    Err(e) => warn!("cannot restore table inet linnet: {e}"),
                }
            }
        }
        let expected = guard::expected_shape().filter(|_| !self.view.shapes_unreliable);
        let damage = match self.guard.restore() {
            Restore::Wait => None,
            Restore::Retry => Some(("bridge linnet", "could not be put back last time")),
            Restore::Check => self
                .damage("bridge", expected)
                .map(|d| ("bridge linnet", d))
                .or_else(|| self.egress_damage().map(|d| ("netdev linnet", d))),
        };
        if let Some((table, damage)) = damage {
            warn!(
                "linnet's table {table} {damage}: putting the guard back with every guarded interface"
            );
            let ports = self.guarded_ports();
            let result = self.host.tables.create_guard(&ports);
            self.guard
                .restored(result.as_ref().map(|_| ()).map_err(|_| GUARD_RETRY));
            match result {
                Ok(()) => {
                    info!(interfaces = ports.len(), "restored table bridge linnet");
                    restored = true;
                    self.check_rebuilt("bridge", expected);
                }
                Err(e) => {
                    warn!(
                        "cannot restore table bridge linnet, so anti-spoofing and isolation are off (tried again in {}s or at the next change after that): {e}",
                        GUARD_RETRY.as_secs()
                    );
                }
            }
        }
        restored
    }

    /// If a table just rebuilt still does not list as expected, nft shows
    /// some rule otherwise than linnet counts it: comparing again would
    /// rebuild for ever (each rebuild wakes the watch), so from then on only
    /// a table that is gone is put back. (A table deleted again meanwhile
    /// says nothing about that.)
    fn check_rebuilt(&mut self, family: &str, expected: Option<&Shape>) {
        if let Ok(Some(actual)) = self.host.tables.linnet_shape(family)
            && expected.is_some_and(|e| *e != actual)
        {
            warn!(
                "table {family} linnet lists otherwise than linnet made it; from now on linnet puts back only tables that are gone, not lost rules"
            );
            self.view.shapes_unreliable = true;
        }
    }

    /// What happened to the macvtaps' table `netdev linnet`, while a
    /// macvtap is guarded, if it is not as linnet made it.
    fn egress_damage(&mut self) -> Option<&'static str> {
        let ports: Vec<PortGuard> = self
            .guarded_ports()
            .into_iter()
            .filter(|p| p.hook == Hook::Egress && p.anti_spoofing)
            .collect();
        if ports.is_empty() || !self.guard.ready() {
            return None;
        }
        let expected =
            guard::expected_egress_shape(&ports).filter(|_| !self.view.shapes_unreliable);
        self.damage("netdev", expected.as_ref())
    }

    /// What happened to linnet's table `family linnet`, if it is not as
    /// linnet made it (`expected`; None: only whether it is there).
    fn damage(&mut self, family: &str, expected: Option<&Shape>) -> Option<&'static str> {
        match self.host.tables.linnet_shape(family) {
            Ok(None) => Some("is gone (nft flush ruleset, or a firewall reload?)"),
            Ok(Some(actual)) if expected.is_some_and(|e| *e != actual) => {
                Some("lost rules or chains (nft flush table or delete rule?)")
            }
            Ok(Some(_)) => None,
            Err(e) => {
                warn!("cannot read table {family} linnet: {e}");
                None
            }
        }
    }

    /// Keeps linnet's accept rules in DOCKER-USER for every active network
    /// (none when `firewall.docker_user` is off). Returns whether it changed
    /// anything.
    fn sync_docker_user(&mut self, rs: &Ruleset) -> bool {
        let wanted: Vec<docker_user::Wanted> = self
            .networks
            .values()
            .filter(|_| self.config.firewall.docker_user)
            .filter_map(|n| {
                n.firewall(Vec::new(), Vec::new())?;
                Some(docker_user::Wanted {
                    network: &n.config.name,
                    bridge: n.bridge()?.0,
                })
            })
            .collect();
        match self.host.tables.sync_docker_user(rs, &wanted) {
            Ok(changes) => {
                for (family, network) in &changes.added {
                    info!(network = %network, family = %family, "added accept rules for the network's bridge to Docker's DOCKER-USER chain");
                }
                for (family, network) in &changes.removed {
                    info!(network = %network, family = %family, "removed linnet's rules from DOCKER-USER");
                }
                !changes.added.is_empty() || !changes.removed.is_empty()
            }
            Err(e) => {
                warn!("cannot update linnet's rules in DOCKER-USER: {e}");
                false
            }
        }
    }

    /// Removes linnet's DOCKER-USER rules (at shutdown).
    pub(super) fn clear_docker_user(&mut self) {
        match self.host.tables.ruleset() {
            Ok(rs) => {
                if let Err(e) = self.host.tables.sync_docker_user(&rs, &[]) {
                    warn!("cannot remove linnet's rules from DOCKER-USER: {e}");
                }
            }
            Err(e) => warn!("cannot read the ruleset to clean DOCKER-USER: {e}"),
        }
    }

    /// Turns forwarding back on if the networks need it and something
    /// turned it off; what that changes is put back when linnet stops
    /// forwarding, as when it turned forwarding on in the first place.
    pub fn restore_forwarding(&mut self) {
        let (needs4, needs6) = self.forwarding_needs();
        match self.forwarding.turn_on(&*self.host.devices, needs4, needs6) {
            Ok(turned) => {
                for family in turned {
                    warn!(
                        "{family} forwarding was turned off behind linnet's back: turned it on again (its networks need it)"
                    );
                }
            }
            Err(e) => warn!("{e}"),
        }
    }

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
                let mut notes = Vec::new();
                if !up {
                    notes.push("down: checked when it comes up (at its first attach)".into());
                }
                let uplinks = &self.view.uplinks;
                let families = [
                    ("IPv4", true, &uplinks.used4, &uplinks.ipv4),
                    ("IPv6", cfg.ipv6.is_some(), &uplinks.used6, &uplinks.ipv6),
                ];
                for (family, on, used, defaults) in families {
                    if cfg.mode == Mode::Shared && on && used.is_none() {
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
                notes.extend(super::drivers::doctor_notes(cfg));
                if !cfg.dhcp.enabled && cfg.lan.is_none() {
                    notes.push("DHCP is off: guests set their own IPv4 address; interfaces without a static lease have no ip_address".into());
                }
                if !self.config.firewall.docker_user && !docker_chain.is_empty() {
                    notes.push("firewall.docker_user is false: linnet adds no rules to DOCKER-USER".into());
                }
                NetworkDoctor {
                    name: cfg.name.clone(),
                    mode: cfg.mode,
                    bridge: match &cfg.lan {
                        Some(lan) => lan.link().to_string(),
                        None => host::bridge_name(&cfg.name),
                    },
                    up,
                    uplink_ipv4: (cfg.mode == Mode::Shared).then(|| self.view.uplinks.used4.clone()).flatten(),
                    uplink_ipv6: (cfg.mode == Mode::Shared && cfg.ipv6.is_some())
                        .then(|| self.view.uplinks.used6.clone())
                        .flatten(),
                    docker_user_rules: self.view.docker_rules.contains(&cfg.name),
                    checks,
                    notes,
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

fn warnings(checks: &[FlowCheck]) -> Vec<String> {
    checks.iter().filter_map(FlowCheck::warning).collect()
}

/// The other firewalls, one line each.
fn firewalls(rs: &Ruleset, legacy: &[LegacyChain]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in &rs.chains {
        let owner = rs.owner(&c.family, &c.table);
        if owner == Owner::Linnet {
            continue;
        }
        let line = format!("{} {} ({})", c.family, c.table, coexist::owner_name(owner));
        if !out.contains(&line) {
            out.push(line);
        }
    }
    for c in legacy {
        let line = format!("iptables-legacy {} {}", c.family, c.table);
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}
