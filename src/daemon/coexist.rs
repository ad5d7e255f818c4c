//! Living with the host's other firewalls and routes, as a part of the
//! daemon: the view of the host as last looked at (the uplinks, what blocks
//! each network's traffic, the other firewalls), following the default
//! route, and each network's checks. The core (`state`) looks again and
//! puts back linnet's own tables, DOCKER-USER rules and forwarding when
//! something removes them; `requests::doctor` shows the view.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::IpNet;
use tracing::{info, warn};

use crate::coexist::{self, FlowCheck, NetworkView};
use crate::config::Own;
use crate::host::legacy::LegacyChain;
use crate::host::netlink::{LinkSettings, Route};
use crate::host::ruleset::{Owner, Ruleset};
use crate::host::seam::Links;
use crate::host::{self, egress};

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
    pub fn describe(routes: &[(String, u32)]) -> Vec<String> {
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
pub(super) const GUARD_RETRY: Duration = Duration::from_secs(5);

impl HostView {
    /// Re-reads the default routes; logs when the uplink changes. A
    /// rootless daemon deepens its egress link's queue (`egress_tuned`:
    /// the link it did last). `up`: whether any network is up, and
    /// whether shared ones are, with IPv4 and with IPv6.
    pub async fn refresh_uplinks(
        &mut self,
        links: &dyn Links,
        egress_tuned: Option<&mut Option<u32>>,
        (up, shared4, shared6): (bool, bool, bool),
    ) {
        let mut uplinks = Uplinks::default();
        let names: BTreeMap<u32, String> = match links.links().await {
            Ok(links) => links.into_iter().map(|l| (l.index, l.name)).collect(),
            Err(e) => {
                warn!("cannot list links for the uplink: {e}");
                return;
            }
        };
        if let Some(tuned) = egress_tuned {
            // A rootless daemon's way out, made again whenever the egress
            // tool is.
            let egress = names.iter().find(|(_, n)| *n == egress::EGRESS_IFNAME);
            if let Some((&index, _)) = egress.filter(|(i, _)| Some(**i) != *tuned) {
                let deeper = LinkSettings {
                    txqueuelen: Some(egress::EGRESS_TXQUEUELEN),
                    ..Default::default()
                };
                match links.configure(index, deeper).await {
                    Ok(()) => *tuned = Some(index),
                    Err(e) => warn!("cannot deepen the queue of {}: {e}", egress::EGRESS_IFNAME),
                }
            }
        }
        for (ipv6, out) in [(false, &mut uplinks.ipv4), (true, &mut uplinks.ipv6)] {
            match links.default_routes(ipv6).await {
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
            match links.route_to(probe).await {
                Ok(oif) => *used = oif.and_then(|i| names.get(&i).cloned()),
                Err(e) => warn!("cannot look up the uplink: {e}"),
            }
        }
        let before = std::mem::take(&mut self.uplinks);
        let moved = (&uplinks.used4, &uplinks.used6) != (&before.used4, &before.used6);
        if moved && up {
            let show = |u: &Option<String>| u.clone().unwrap_or_else(|| "none".into());
            info!(
                ipv4 = %show(&uplinks.used4),
                ipv6 = %show(&uplinks.used6),
                was_ipv4 = %show(&before.used4),
                was_ipv6 = %show(&before.used6),
                "uplink changed: NAT follows the route for new connections"
            );
            for (family, used, shared) in [
                ("IPv4", &uplinks.used4, shared4),
                ("IPv6", &uplinks.used6, shared6),
            ] {
                if used.is_none() && shared {
                    warn!(
                        "no {family} route to the internet: VMs of shared networks cannot reach beyond this host over {family}"
                    );
                }
            }
        }
        self.uplinks = uplinks;
    }

    /// What blocks the flows of `cfg`'s network, from the ruleset `rs` and
    /// the legacy chains.
    /// `nat_uplink`: whether it NATs out of the uplink (its driver says);
    /// `br_netfilter`: whether bridged frames pass the inet hooks.
    pub fn network_checks(
        &self,
        rs: &Ruleset,
        legacy: &[LegacyChain],
        (name, own, nat_uplink): (&str, &Own, bool),
        br_netfilter: bool,
    ) -> Vec<FlowCheck> {
        let bridge = host::bridge_name(name);
        let (up4, up6) = (&self.uplinks.used4, &self.uplinks.used6);
        let view = NetworkView {
            bridge: &bridge,
            shared: nat_uplink,
            dhcp: own.dhcp.enabled,
            dns: own.dns.enabled,
            subnet: IpNet::V4(own.subnet),
            gateway: own.gateway.into(),
            ipv6: own
                .ipv6
                .as_ref()
                .map(|v6| (IpNet::V6(v6.prefix), v6.gateway.into())),
            uplink4: up4.as_deref(),
            uplink6: up6.as_deref(),
            br_netfilter,
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

    /// What blocks `network`'s traffic, as last looked at (nothing while
    /// it is down).
    pub fn warnings(&self, network: &str) -> Vec<String> {
        self.checks
            .get(network)
            .map(|c| warnings(c))
            .unwrap_or_default()
    }
}

pub(super) fn warnings(checks: &[FlowCheck]) -> Vec<String> {
    checks.iter().filter_map(FlowCheck::warning).collect()
}

/// The other firewalls, one line each.
pub(super) fn firewalls(rs: &Ruleset, legacy: &[LegacyChain]) -> Vec<String> {
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
