//! Anti-spoofing and isolation on the daemon's side: what each interface's
//! VM may send from, and the drops the guard counts. The table is made by
//! `host::guard`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use tracing::{info, warn};

use super::state::{Daemon, Interface, shown_ip};
use crate::addr6;
use crate::config::{Lan, NetworkConfig};
use crate::host::guard::{self, Hook, Ipv4Source, PortGuard};
use crate::policy::Policy;
use crate::types::MacAddr;

impl Daemon {
    /// Frames dropped by each guarded TAP's rules so far.
    pub fn guard_drops(&mut self) -> BTreeMap<String, u64> {
        if !self.guard_ready {
            return BTreeMap::new();
        }
        guard::drops(&mut self.nft).unwrap_or_else(|e| {
            warn!("cannot read the guard's counters: {e}");
            BTreeMap::new()
        })
    }

    /// Logs, per interface, the frames its VM had dropped since the last
    /// report: called every few seconds, so a flood is one line per period.
    pub fn report_drops(&mut self) {
        let drops = self.guard_drops();
        for (id, iface) in &self.interfaces {
            let (Some(&now), Some(cfg)) =
                (drops.get(&iface.tap), self.config.network(&iface.network))
            else {
                continue;
            };
            let before = self
                .drops_reported
                .insert(iface.tap.clone(), now)
                .unwrap_or(0);
            if now > before {
                warn!(network = %iface.network, interface = %id, tap = %iface.tap, ip = %shown_ip(iface.ip, cfg), mac = %iface.mac, dropped = now - before, total = now, "dropped frames from the VM that anti_spoofing forbids (another MAC or address, a DHCP server, a router advertisement, ...); `linnet ls` counts them");
            }
        }
    }

    /// Holds every guarded port — off its bridge: nothing in or out, and
    /// nothing its VMM can undo (putting a link on a bridge needs
    /// CAP_NET_ADMIN) — while linnet's tables are damaged, as after `nft
    /// flush ruleset`: until the guard and the policies are back, a VM could
    /// plant neighbour entries and routes, or reach the host's 127.0.0.1
    /// through route_localnet. Fails closed: a port stays held until they
    /// are back.
    pub async fn hold_guarded_ports(&mut self) {
        if self.ports_held || !self.own_tables_damaged() {
            return;
        }
        let ports = self.live_guarded_ports();
        warn!(
            interfaces = ports.len(),
            "linnet's tables are damaged: guarded interfaces forward nothing until they are back"
        );
        for (tap, index, _) in ports {
            if let Err(e) = self.netlink.set_master(index, None).await {
                warn!(%tap, "cannot hold the port: {e}");
            }
        }
        self.ports_held = true;
    }

    /// Puts held ports back on their bridges once linnet's tables are whole.
    pub async fn release_held_ports(&mut self) {
        if !self.ports_held || self.own_tables_damaged() {
            return;
        }
        let ports = self.live_guarded_ports();
        for (tap, index, bridge) in &ports {
            if let Err(e) = self.netlink.set_master(*index, Some(*bridge)).await {
                warn!(%tap, "cannot put the port back on its bridge: {e}");
            }
        }
        info!(
            interfaces = ports.len(),
            "linnet's tables are back: guarded interfaces forward again"
        );
        self.ports_held = false;
    }

    /// (TAP, its index, its bridge's index) of each guarded interface that
    /// was not cut off.
    fn live_guarded_ports(&self) -> Vec<(String, u32, u32)> {
        self.interfaces
            .values()
            .filter(|i| i.guarded && i.cut_off.is_none())
            .filter_map(|i| {
                let (_, bridge) = self.networks.get(&i.network)?.bridge()?;
                Some((i.tap.clone(), i.tap_index, bridge))
            })
            .collect()
    }

    /// The guard of every guarded interface.
    pub(super) fn guarded_ports(&self) -> Vec<PortGuard> {
        self.interfaces
            .values()
            .filter_map(|i| self.guard_of(i))
            .collect()
    }

    /// An interface's guard, if it has one.
    pub(super) fn guard_of(&self, i: &Interface) -> Option<PortGuard> {
        let cfg = self.config.network(&i.network).filter(|_| i.guarded)?;
        Some(port_guard(cfg, &i.tap, (i.mac, i.ip), &i.policy))
    }
}

/// What an interface's VM may send from: its MAC, its leased IPv4 (without
/// one, any address of the subnet but the gateway's; on a LAN, only DHCP
/// until linnet has learned its address), its link-local and
/// SLAAC IPv6 addresses; and with a listen policy, the ports it gets
/// broadcast and multicast on.
pub(super) fn port_guard(
    cfg: &NetworkConfig,
    tap: &str,
    (mac, ip): (MacAddr, Option<Ipv4Addr>),
    policy: &Policy,
) -> PortGuard {
    let mut ipv6 = vec![addr6::link_local(mac)];
    ipv6.extend(
        cfg.ipv6
            .as_ref()
            .map(|v6| addr6::slaac_address(v6.prefix, mac)),
    );
    let ipv4 = match ip {
        Some(ip) => Ipv4Source::Address(ip),
        // On a LAN, nothing but DHCP until the LAN's server gave one.
        None if cfg.lan.is_some() => Ipv4Source::Ranges(Vec::new()),
        // Not the gateway's, nor those of VMs with static leases.
        None => {
            let taken: Vec<Ipv4Addr> = std::iter::once(cfg.gateway)
                .chain(cfg.dhcp.static_leases.iter().map(|s| s.ip))
                .collect();
            Ipv4Source::Ranges(subnet_except(cfg.subnet, &taken))
        }
    };
    PortGuard {
        tap: tap.into(),
        hook: match cfg.lan {
            Some(Lan::Macvtap { .. }) => Hook::Egress,
            _ => Hook::Bridge,
        },
        mac,
        ipv4,
        ipv6,
        anti_spoofing: cfg.anti_spoofing,
        isolated: cfg.isolation,
        // A LAN has its own DHCP server: a VM's would be a rogue one.
        dhcp_server: !cfg.dhcp.enabled && cfg.lan.is_none(),
        listen: (!policy.ingress.is_empty()).then(|| policy.ingress.clone()),
    }
}

/// The host addresses of `subnet` but `taken`, as inclusive ranges.
fn subnet_except(subnet: ipnet::Ipv4Net, taken: &[Ipv4Addr]) -> Vec<(Ipv4Addr, Ipv4Addr)> {
    let (first, last) = (
        u32::from(subnet.network()) + 1,
        u32::from(subnet.broadcast()) - 1,
    );
    let mut taken: Vec<u32> = taken.iter().map(|&a| u32::from(a)).collect();
    taken.sort_unstable();
    let mut out = Vec::new();
    let mut from = first;
    for t in taken.into_iter().filter(|t| (first..=last).contains(t)) {
        if t > from {
            out.push((from, t - 1));
        }
        from = from.max(t + 1);
    }
    if from <= last {
        out.push((from, last));
    }
    out.into_iter()
        .map(|(a, b)| (Ipv4Addr::from(a), Ipv4Addr::from(b)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_leave_out_the_gateway_and_static_addresses() {
        let ip = |s: &str| -> Ipv4Addr { s.parse().unwrap() };
        let net = "10.0.0.0/24".parse().unwrap();
        assert_eq!(
            subnet_except(net, &[ip("10.0.0.1")]),
            [(ip("10.0.0.2"), ip("10.0.0.254"))]
        );
        assert_eq!(
            subnet_except(
                net,
                &[
                    ip("10.0.0.7"),
                    ip("10.0.0.1"),
                    ip("10.0.0.8"),
                    ip("10.0.0.254")
                ]
            ),
            [
                (ip("10.0.0.2"), ip("10.0.0.6")),
                (ip("10.0.0.9"), ip("10.0.0.253"))
            ]
        );
        assert!(
            subnet_except(
                "10.0.0.0/30".parse().unwrap(),
                &[ip("10.0.0.1"), ip("10.0.0.2")]
            )
            .is_empty()
        );
    }
}
