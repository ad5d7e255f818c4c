//! `linnet ls`: every network and interface as the daemon knows them,
//! with the links' counters and the guard's drops.

use std::collections::BTreeMap;

use crate::api::{InterfaceStatus, NetworkStatus, Response};
use crate::daemon::drivers::{self, TowardVm};
use crate::daemon::state::Daemon;

impl Daemon {
    pub fn list(
        &self,
        stats: &BTreeMap<u32, (u64, u64)>,
        drops: &BTreeMap<String, u64>,
    ) -> Response {
        let networks = self
            .config
            .networks
            .values()
            .map(|cfg| NetworkStatus {
                name: cfg.name.clone(),
                mode: cfg.mode(),
                subnet: cfg.own().map(|own| own.subnet),
                gateway: cfg.own().map(|own| own.gateway),
                lan: cfg.lan().map(|_| drivers::link_of(cfg)),
                ipv6_prefix: cfg.ipv6().map(|v6| v6.prefix),
                bridge: self
                    .networks
                    .get(&cfg.name)
                    .and_then(|n| n.bridge())
                    .map(|(name, _)| name.to_string()),
                interfaces: self
                    .interfaces
                    .values()
                    .filter(|i| i.network == cfg.name)
                    .count(),
                persistent: cfg.persistent,
                socket: cfg
                    .socket
                    .as_ref()
                    .map(|s| s.path(&cfg.name, &self.run_dir)),
                warnings: self.network_warnings(&cfg.name),
            })
            .collect();
        let refused = self.names.refused_queries();
        let refused_connections = self.refused.clone();
        let interfaces = self
            .interfaces
            .iter()
            .map(|(id, i)| {
                let counters = stats.get(&i.tap_index).copied().unwrap_or_default();
                let toward =
                    (self.networks.get(&i.network)).map_or(TowardVm::Sent, |n| n.toward_vm());
                let (received, sent) = toward.vm_ways(counters);
                let cfg = self.config.network(&i.network).expect("attached");
                let guest = i.as_clone.as_ref().map(|c| &c.guest);
                InterfaceStatus {
                    interface_id: *id,
                    name: i.name.clone(),
                    network: i.network.clone(),
                    mac_address: guest.map_or(i.mac, |g| g.mac),
                    ip_address: guest.map_or(i.ip, |g| Some(g.ip)),
                    ipv6_address: i.ipv6_address(cfg),
                    ipv6_formed: i.formed6.clone(),
                    tap: i.tap.clone(),
                    forwards: i.forwards.iter().map(|p| p.forward).collect(),
                    client_pid: i.pid(),
                    client_uid: i.uid,
                    datapath: i.datapath,
                    relay: i.relay,
                    vm_rx_bytes: received,
                    vm_tx_bytes: sent,
                    policy: i.policy.clone(),
                    spoofed_drops: if i.guarded && cfg.anti_spoofing {
                        Some(drops.get(&i.tap).copied().unwrap_or(0))
                    } else {
                        None
                    },
                    refused_queries: i
                        .policy
                        .has_names()
                        .then(|| refused.get(&i.tap).copied().unwrap_or(0)),
                    refused_connections: (!i.policy.egress.is_empty())
                        .then(|| refused_connections.get(&i.tap).copied().unwrap_or(0)),
                    cut_off: i.cut_off.clone(),
                    clone_address: i.ip.filter(|_| guest.is_some()),
                    netns: i.as_clone.as_ref().and_then(|c| c.netns_path()),
                }
            })
            .collect();
        Response::Listing {
            networks,
            interfaces,
        }
    }
}
