//! Anti-spoofing and isolation on the daemon's side: what each interface's
//! VM may send from, and the drops the guard counts. The table is made by
//! `host::guard`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tracing::warn;

use super::interface::Interface;
use crate::addr6;
use crate::config::NetworkConfig;
use crate::host::guard::{Ipv4Source, PortGuard, RateDrops};
use crate::host::nft::NftError;
use crate::host::seam::Tables;
use crate::policy::Policy;
use crate::types::MacAddr;

/// See `Guard::restore`.
pub(super) enum Restore {
    Check,
    Wait,
    Retry,
}

/// The guard's own state, which only it changes: whether its tables
/// exist, the drops last reported per port, whether guarded ports are held
/// off their bridges, and when a failed restore is tried again.
#[derive(Default)]
pub(super) struct Guard {
    ready: bool,
    reported: BTreeMap<String, u64>,
    held: bool,
    retry_at: Option<Instant>,
}

impl Guard {
    /// Whether the tables exist (made with the first guarded port).
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Whether guarded ports are held off their bridges.
    pub fn held(&self) -> bool {
        self.held
    }

    /// Guarded ports are held off their bridges (`true`), or back on.
    pub fn set_held(&mut self, held: bool) {
        self.held = held;
    }

    /// Guards a port, making the tables first if they are not there.
    pub fn add(&mut self, tables: &mut dyn Tables, port: &PortGuard) -> Result<(), NftError> {
        if !self.ready {
            tables.create_guard(&[])?;
            self.ready = true;
        }
        tables.add_guard_port(port)
    }

    /// Removes the guard of ports whose links are gone, and the tables
    /// once no guarded port is `left`. False: some of it failed (and is
    /// logged), for the daemon to tidy up.
    pub fn remove(&mut self, tables: &mut dyn Tables, ports: &[PortGuard], left: bool) -> bool {
        let mut done = true;
        if !ports.is_empty() {
            if let Err(e) = tables.remove_guard_ports(ports) {
                let taps: Vec<&str> = ports.iter().map(|p| p.tap.as_str()).collect();
                warn!("removing the guard of {} failed: {e}", taps.join(" "));
                done = false;
            }
            for port in ports {
                self.reported.remove(&port.tap);
            }
        }
        if self.ready && !left {
            match tables.remove_guard() {
                Ok(()) => {
                    self.ready = false;
                    self.retry_at = None;
                }
                Err(e) => {
                    warn!("removing the guard table failed: {e}");
                    done = false;
                }
            }
        }
        done
    }

    /// Makes the tables anew with exactly `ports`, or removes them when
    /// there are none, each in one transaction: at start-up (what a
    /// previous daemon left, replaced) and when tidying up after a failed
    /// step.
    pub fn remake(&mut self, tables: &mut dyn Tables, ports: &[PortGuard]) -> Result<(), NftError> {
        if ports.is_empty() {
            tables.remove_guard()?;
            self.ready = false;
            self.retry_at = None;
        } else {
            tables.create_guard(ports)?;
            self.ready = true;
        }
        Ok(())
    }

    /// Frames dropped by each guarded port's rules so far.
    pub fn drops(&self, tables: &mut dyn Tables) -> BTreeMap<String, u64> {
        if !self.ready {
            return BTreeMap::new();
        }
        tables.guard_drops().unwrap_or_else(|e| {
            warn!("cannot read the guard's counters: {e}");
            BTreeMap::new()
        })
    }

    /// Frames each rate-limited port's limits dropped so far.
    pub fn rate_drops(&self, tables: &mut dyn Tables) -> RateDrops {
        if !self.ready {
            return RateDrops::default();
        }
        tables.guard_rate_drops().unwrap_or_else(|e| {
            warn!("cannot read the rate limits' counters: {e}");
            RateDrops::default()
        })
    }

    /// The frames `tap` dropped since it was last asked (`total` now), if
    /// any.
    pub fn newly_dropped(&mut self, tap: &str, total: u64) -> Option<u64> {
        let before = self.reported.insert(tap.into(), total).unwrap_or(0);
        (total > before).then(|| total - before)
    }

    /// What to do about the tables being damaged: look (nothing failed),
    /// wait (a failed restore's pause lasts: each attempt's own changes
    /// wake the watch), or try again.
    pub fn restore(&self) -> Restore {
        match self.retry_at {
            _ if !self.ready => Restore::Wait,
            Some(at) if Instant::now() < at => Restore::Wait,
            Some(_) => Restore::Retry,
            None => Restore::Check,
        }
    }

    /// The tables were made anew with every guarded port (`Ok`), or that
    /// failed and is tried again after `retry` (`Err`); the counters start
    /// again at 0 either way.
    pub fn restored(&mut self, result: Result<(), Duration>) {
        self.reported.clear();
        self.retry_at = result.err().map(|retry| Instant::now() + retry);
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
    let kind = super::drivers::features(cfg);
    let mut ipv6 = vec![addr6::link_local(mac)];
    ipv6.extend(cfg.ipv6().map(|v6| addr6::slaac_address(v6.prefix, mac)));
    let ipv4 = match (ip, cfg.own()) {
        (Some(ip), _) => Ipv4Source::Address(ip),
        // On a LAN, nothing but DHCP until the LAN's server gave one.
        (None, None) => Ipv4Source::Ranges(Vec::new()),
        // Not the gateway's, nor those of VMs with static leases.
        (None, Some(own)) => {
            let taken: Vec<Ipv4Addr> = std::iter::once(own.gateway)
                .chain(own.dhcp.static_leases.iter().map(|s| s.ip))
                .collect();
            Ipv4Source::Ranges(subnet_except(own.subnet, &taken))
        }
    };
    PortGuard {
        tap: tap.into(),
        hook: kind.guard_hook,
        mac,
        ipv4,
        ipv6,
        anti_spoofing: cfg.anti_spoofing,
        isolated: cfg.isolation(),
        // A LAN has its own DHCP server: a VM's would be a rogue one.
        dhcp_server: cfg.own().is_some_and(|own| !own.dhcp.enabled),
        listen: (!policy.ingress.is_empty()).then(|| policy.ingress.clone()),
        connect_policed: !policy.egress.is_empty(),
        rate_limit: policy.rate_limit,
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

/// A clone port's guard: its unique address, and the guest's when it
/// holds that (`guest`).
pub(super) fn clone_guard(mut guard: PortGuard, guest: Option<Ipv4Addr>) -> PortGuard {
    if let (Some(g), Ipv4Source::Address(u)) = (guest, &guard.ipv4) {
        guard.ipv4 = Ipv4Source::Ranges(vec![(g, g), (*u, *u)]);
    }
    guard
}

/// An interface's guard on `cfg`'s network, if it has one: its network
/// guards its ports, or it has a rate limit.
pub(super) fn guard_of(cfg: &NetworkConfig, i: &Interface) -> Option<PortGuard> {
    if !i.guarded && i.policy.rate_limit.is_none() {
        return None;
    }
    let mut guard = port_guard(cfg, &i.tap, (i.mac, i.ip), &i.policy);
    guard.ipv6.extend(&i.formed6);
    let held = i.as_clone.as_ref().and_then(|c| c.held_address());
    Some(clone_guard(guard, held))
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
