//! The driver of linnet's own networks (`mode: shared` and `host`): a
//! bridge of linnet's with the gateway's addresses, the lease table, and
//! the services (DHCP, DNS, router advertisements); each VM's port a TAP on
//! the bridge, each network's NAT, forwards and policies in linnet's
//! firewall table.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use ipnet::{Ipv4Net, Ipv6Net};
use tracing::info;

use super::fabric::{self, Fabric};
use super::{Elsewhere, Features, NetworkDriver, NetworkKind, TowardVm};
use crate::addr6::GATEWAY_LINK_LOCAL;
use crate::config::{NetworkConfig, Own};
use crate::daemon::errors::DaemonError;
use crate::daemon::leftovers::Leftovers;
use crate::host::firewall::{FabricPort, FirewallNetwork, ForwardRule, InterfacePolicy};
use crate::host::guard::Hook;
use crate::host::netlink::{LinkKind, LinkSettings};
use crate::host::seam::{Host, Links};
use crate::host::{self, ALIAS_NETWORK};
use crate::leases::{LeaseTable, SharedLeases};
use crate::services::{NetworkContext, ServiceCounters, Services, Starter, unix_now};
use crate::types::MacAddr;

#[async_trait]
impl NetworkKind for Own {
    /// NAT out of the uplink in `shared` mode; ports guarded on the
    /// bridge. (Its addresses, its part of the firewall and clones come
    /// with `Own`.)
    fn features(&self) -> Features {
        Features {
            nat_uplink: !self.host_only,
            guard_hook: Hook::Bridge,
        }
    }

    fn link(&self, network: &str) -> String {
        host::bridge_name(network)
    }

    async fn bring_up(
        &self,
        cfg: &NetworkConfig,
        host: &Host,
        services: &dyn Starter,
        lease_dir: &Path,
    ) -> Result<Box<dyn NetworkDriver>, DaemonError> {
        let bridge = LinnetBridge::bring_up(cfg, self, host, services, lease_dir).await?;
        Ok(Box::new(bridge))
    }
}

pub(in crate::daemon) struct LinnetBridge {
    /// The network's own part of its config, as it came up (boxed: the
    /// other drivers are small).
    own: Box<Own>,
    pub bridge: String,
    pub bridge_index: u32,
    pub leases: SharedLeases,
    counters: Arc<ServiceCounters>,
    /// Whether the host routes the network's `clone_subnet` to the bridge
    /// (from the first clone on, while the bridge lives).
    clones_routed: bool,
    /// A network across hosts' VXLAN port (`evpn:`).
    fabric: Option<Fabric>,
    saver: tokio::task::JoinHandle<()>,
    _services: Services,
}

impl LinnetBridge {
    /// Creates (or adopts, after a restart) the bridge, loads the leases and
    /// starts the services. On error nothing it made is left behind.
    pub async fn bring_up(
        cfg: &NetworkConfig,
        own: &Own,
        host: &Host,
        services: &dyn Starter,
        lease_dir: &Path,
    ) -> Result<LinnetBridge, DaemonError> {
        let netlink = &*host.links;
        let bridge = host::bridge_name(&cfg.name);
        let alias = format!("{ALIAS_NETWORK}{}", cfg.name);
        let existing = netlink.link(&bridge).await?;
        let adopted = match &existing {
            // Ours: marked with our alias, or — a daemon that died between
            // creating it and marking it — unmarked but with the MAC linnet
            // gives that network's bridge at creation.
            Some(link)
                if link.kind == LinkKind::Bridge
                    && (link.alias.as_deref() == Some(alias.as_str())
                        || (link.alias.is_none()
                            && link.address == Some(host::bridge_mac(&cfg.name)))) =>
            {
                Some(link.index)
            }
            Some(_) => {
                return Err(DaemonError::ForeignLink {
                    network: cfg.name.clone(),
                    link: bridge,
                });
            }
            None => None,
        };
        check_overlap(&cfg.name, own, netlink, adopted).await?;
        let index = match adopted {
            Some(index) => index,
            None => {
                netlink
                    .create_bridge(&bridge, own.mtu, host::bridge_mac(&cfg.name))
                    .await?
            }
        };
        let result = async {
            if adopted.is_some() {
                // One made before bridges' MACs were pinned.
                netlink
                    .set_address(index, host::bridge_mac(&cfg.name))
                    .await?;
            }
            let gateway =
                Ipv4Net::new(own.gateway, own.subnet.prefix_len()).expect("validated prefix");
            netlink
                .configure(
                    index,
                    LinkSettings {
                        mtu: Some(own.mtu),
                        alias: Some(&alias),
                        ..Default::default()
                    },
                )
                .await?;
            netlink.add_address(index, gateway.into()).await?;
            // So the host's own 127.0.0.1 reaches published ports (the
            // firewall's guard chain keeps loopback addresses from VMs out).
            host.devices
                .set_link_sysctl("ipv4", &bridge, "route_localnet", "1")
                .map_err(|source| DaemonError::HostStep {
                    what: format!(
                        "network \"{}\": cannot set route_localnet on {bridge}",
                        cfg.name
                    ),
                    source,
                })?;
            prepare_ipv6(&cfg.name, own, &bridge, index, host).await?;
            netlink
                .configure(
                    index,
                    LinkSettings {
                        up: true,
                        ..Default::default()
                    },
                )
                .await?;
            let path = lease_dir.join(format!("{}.json", cfg.name));
            let table = LeaseTable::open(&cfg.name, own, &path, unix_now()).map_err(|source| {
                DaemonError::StateFile {
                    what: "cannot read leases",
                    path: path.clone(),
                    source,
                }
            })?;
            let leases = SharedLeases::new(table);
            let counters = Arc::new(ServiceCounters::default());
            let ctx = NetworkContext::new(
                cfg.clone(),
                bridge.clone(),
                index,
                leases.clone(),
                counters.clone(),
            )
            .ok_or_else(|| {
                DaemonError::Internal(format!(
                    "network \"{}\" is not one of linnet's own: no services for it",
                    cfg.name
                ))
            })?;
            let ctx = Arc::new(ctx);
            let services = services.start(ctx).await?;
            // Last: nothing after it can fail, so nothing undoes it here
            // (on its own error it leaves nothing; the services stop and
            // the bridge goes below).
            let fabric = match &own.evpn {
                Some(evpn) => Some(Fabric::join(&cfg.name, evpn, own.mtu, host, index).await?),
                None => None,
            };
            Ok::<_, DaemonError>((leases, counters, services, fabric))
        }
        .await;
        match result {
            Ok((leases, counters, services, fabric)) => {
                let saver = leases.spawn_saver(cfg.name.clone());
                info!(network = %cfg.name, %bridge, subnet = %own.subnet, adopted = adopted.is_some(), "network up");
                Ok(LinnetBridge {
                    own: Box::new(own.clone()),
                    bridge,
                    bridge_index: index,
                    leases,
                    counters,
                    clones_routed: false,
                    fabric,
                    saver,
                    _services: services,
                })
            }
            Err(e) => {
                let mut left = Leftovers::default();
                let deleted = netlink.delete_link(index).await;
                left.note(format_args!("delete {bridge}"), deleted);
                left.log(&format!("network \"{}\": undoing a bring-up", cfg.name));
                Err(e)
            }
        }
    }
}

#[async_trait]
impl NetworkDriver for LinnetBridge {
    fn bridge(&self) -> Option<(&str, u32)> {
        Some((&self.bridge, self.bridge_index))
    }

    fn leases(&self) -> Option<&SharedLeases> {
        Some(&self.leases)
    }

    fn service_counters(&self) -> Option<&ServiceCounters> {
        Some(&self.counters)
    }

    fn mtu(&self) -> u32 {
        self.own.mtu
    }

    fn toward_vm(&self) -> TowardVm {
        TowardVm::Sent
    }

    /// Across hosts: the other hosts' VMs as FRR put them in the kernel,
    /// their addresses in the bridge's neighbour table and their MACs in
    /// the VXLAN device's forwarding table, with their hosts' VTEPs.
    async fn elsewhere(&self, host: &Host) -> Result<Elsewhere, DaemonError> {
        let Some(fabric) = &self.fabric else {
            return Ok(Elsewhere::default());
        };
        let addresses = host.links.learned_neighbours(self.bridge_index).await?;
        let macs = host.links.remote_macs(fabric.index).await?;
        Ok(Elsewhere {
            addresses: addresses.into_iter().collect(),
            macs: macs.into_iter().collect(),
        })
    }

    /// Across hosts, the VM's address goes into the bridge's neighbour
    /// table, for FRR to advertise with its MAC.
    async fn vm_address(
        &self,
        host: &Host,
        mac: MacAddr,
        was: Option<Ipv4Addr>,
        now: Option<Ipv4Addr>,
    ) -> Result<(), DaemonError> {
        if self.fabric.is_none() {
            return Ok(());
        }
        fabric::advertise(host, self.bridge_index, mac, was, now).await
    }

    fn firewall(
        &self,
        forwards: Vec<ForwardRule>,
        policies: Vec<InterfacePolicy>,
    ) -> Option<FirewallNetwork> {
        let own = &self.own;
        let v6 = own.ipv6.as_ref();
        Some(FirewallNetwork {
            bridge: self.bridge.clone(),
            subnet: own.subnet,
            ipv6_prefix: v6.map(|v6| v6.prefix),
            host_only: own.host_only,
            nat44: own.nat44,
            nat66: v6.is_some_and(|v6| v6.nat66),
            isolation: own.isolation,
            forwards,
            gateways: dns_servers(own),
            policies,
            clone_subnet: own.clone_subnet.filter(|_| self.clones_routed),
            fabric: self.fabric.as_ref().map(|f| FabricPort {
                port: f.port.clone(),
                gateway_mac: f.gateway_mac,
            }),
            // The daemon's to say (`Daemon::firewall_networks`).
            secrets_port: None,
        })
    }

    /// Routes the network's `clone_subnet` to the bridge, where each
    /// clone's namespace answers for its own address; refused when the
    /// range meets a route or address the host has. Returns whether it
    /// was not routed before (its firewall part changed).
    async fn route_clones(
        &mut self,
        cfg: &NetworkConfig,
        host: &Host,
    ) -> Result<bool, DaemonError> {
        let netlink = &*host.links;
        if self.clones_routed {
            return Ok(false);
        }
        let Some(clones) = self.own.clone_subnet else {
            return Err(DaemonError::CloneRange {
                network: cfg.name.clone(),
                subnet: None,
            });
        };
        // The bridge's own route is no conflict: a persistent bridge
        // adopted after a restart keeps the route it had.
        if let Some((what, link)) = find_overlap(clones, netlink, Some(self.bridge_index)).await? {
            return Err(DaemonError::Overlap {
                network: cfg.name.clone(),
                key: "clone_subnet",
                range: clones.to_string(),
                found: what,
                link,
            });
        }
        netlink.add_link_route(clones, self.bridge_index).await?;
        self.clones_routed = true;
        info!(network = %cfg.name, %clones, bridge = %self.bridge, "clone addresses routed to the bridge");
        Ok(true)
    }

    /// Stops the services and removes the bridge.
    async fn bring_down(
        self: Box<Self>,
        cfg: &NetworkConfig,
        host: &Host,
    ) -> Result<(), DaemonError> {
        let LinnetBridge {
            bridge,
            bridge_index,
            leases,
            fabric,
            saver,
            _services,
            ..
        } = *self;
        drop(_services);
        saver.abort();
        // On a blocking thread: it may wait for a background save's fsyncs.
        match tokio::task::spawn_blocking(move || leases.save_now()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(network = %cfg.name, "cannot save leases: {e}"),
            Err(e) => tracing::warn!(network = %cfg.name, "saving leases failed: {e}"),
        }
        let left = match fabric {
            Some(fabric) => fabric.leave(&cfg.name, host).await,
            None => Ok(()),
        };
        host.links.delete_link(bridge_index).await?;
        info!(network = %cfg.name, %bridge, "network down");
        left
    }
}

/// IPv6 on the bridge: PREFIX::1 and fe80::1 and no address of the
/// kernel's making (the guests' router is fe80::1); or no IPv6 at all.
async fn prepare_ipv6(
    network: &str,
    own: &Own,
    bridge: &str,
    index: u32,
    host: &Host,
) -> Result<(), DaemonError> {
    let setting = |key: &str, value: &str| {
        host.devices
            .set_link_sysctl("ipv6", bridge, key, value)
            .map_err(|source| DaemonError::HostStep {
                what: format!("network \"{network}\": cannot set {key} on {bridge}"),
                source,
            })
    };
    let Some(v6) = &own.ipv6 else {
        return setting("disable_ipv6", "1");
    };
    setting("disable_ipv6", "0")?;
    setting("addr_gen_mode", "1")?;
    setting("accept_ra", "0")?;
    let global = Ipv6Net::new(v6.gateway, v6.prefix.prefix_len()).expect("validated prefix");
    let link_local = Ipv6Net::new(GATEWAY_LINK_LOCAL, 64).expect("64 is a valid length");
    for net in [global, link_local] {
        host.links.add_address(index, net.into()).await?;
    }
    Ok(())
}

/// An address or route of the namespace that overlaps `subnet`, other than
/// `own_bridge`'s: what it is ("address …", "route …") and the name of its
/// interface.
async fn find_overlap(
    subnet: Ipv4Net,
    netlink: &dyn Links,
    own_bridge: Option<u32>,
) -> Result<Option<(String, String)>, DaemonError> {
    let overlaps = |net: &Ipv4Net| crate::types::subnets_overlap(&subnet, net);
    let mut conflict = None;
    for (index, net) in netlink.ipv4_addresses().await? {
        if Some(index) != own_bridge && overlaps(&net.trunc()) {
            conflict = Some((format!("address {net}"), Some(index)));
            break;
        }
    }
    if conflict.is_none() {
        for (net, oif) in netlink.ipv4_routes().await? {
            if net.prefix_len() > 0 && (oif.is_none() || oif != own_bridge) && overlaps(&net) {
                conflict = Some((format!("route {net}"), oif));
                break;
            }
        }
    }
    let Some((what, index)) = conflict else {
        return Ok(None);
    };
    Ok(Some((what, link_name(netlink, index).await?)))
}

/// The name of link `index`, for a message.
async fn link_name(netlink: &dyn Links, index: Option<u32>) -> Result<String, DaemonError> {
    let links = netlink.links().await?;
    Ok(index
        .and_then(|i| links.iter().find(|l| l.index == i))
        .map(|l| l.name.clone())
        .unwrap_or_else(|| "(no interface)".into()))
}

/// Refuses a subnet that overlaps an address or route already in the
/// namespace, naming the interface that holds it.
async fn check_overlap(
    network: &str,
    own: &Own,
    netlink: &dyn Links,
    own_bridge: Option<u32>,
) -> Result<(), DaemonError> {
    if let Some((what, link)) = find_overlap(own.subnet, netlink, own_bridge).await? {
        return Err(DaemonError::Overlap {
            network: network.into(),
            key: "subnet",
            range: own.subnet.to_string(),
            found: what,
            link,
        });
    }
    let Some(v6) = &own.ipv6 else {
        return Ok(());
    };
    let prefix = v6.prefix;
    for (net, oif) in netlink.ipv6_routes().await? {
        let meets = prefix.contains(&net.network()) || net.contains(&prefix.network());
        if net.prefix_len() > 0 && (oif.is_none() || oif != own_bridge) && meets {
            return Err(DaemonError::Overlap {
                network: network.into(),
                key: "ipv6_prefix",
                range: prefix.to_string(),
                found: format!("route {net}"),
                link: link_name(netlink, oif).await?,
            });
        }
    }
    Ok(())
}

/// The DNS servers an attach reply names: the gateway's addresses, when
/// DNS is on.
pub fn dns_servers(own: &Own) -> Vec<IpAddr> {
    if !own.dns.enabled {
        return Vec::new();
    }
    let v6 = own.ipv6.as_ref().map(|v6| IpAddr::V6(v6.gateway));
    std::iter::once(IpAddr::V4(own.gateway)).chain(v6).collect()
}
