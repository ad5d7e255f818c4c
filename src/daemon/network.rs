//! One active network: its bridge with the gateway address, its lease table
//! and its running services. Brought up on first attach, down after the last
//! detach (unless persistent).

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use ipnet::Ipv4Net;
use tracing::info;

use super::leases::LeaseTable;
use super::state::DaemonError;
use crate::config::NetworkConfig;
use crate::host::netlink::{LinkKind, LinkSettings, Netlink};
use crate::host::{self, ALIAS_NETWORK, firewall::FirewallNetwork};
use crate::services::{NetworkContext, Services, unix_now};

pub struct ActiveNetwork {
    pub config: NetworkConfig,
    pub bridge: String,
    pub bridge_index: u32,
    pub leases: Arc<Mutex<LeaseTable>>,
    _services: Services,
}

impl ActiveNetwork {
    /// Creates (or adopts, after a restart) the bridge, loads the leases and
    /// starts the services. On error nothing it made is left behind.
    pub async fn bring_up(
        cfg: &NetworkConfig,
        netlink: &Netlink,
        lease_dir: &Path,
    ) -> Result<ActiveNetwork, DaemonError> {
        let bridge = host::bridge_name(&cfg.name);
        let alias = format!("{ALIAS_NETWORK}{}", cfg.name);
        let existing = netlink.link(&bridge).await?;
        let adopted = match &existing {
            Some(link)
                if link.kind == LinkKind::Bridge
                    && link.alias.as_deref() == Some(alias.as_str()) =>
            {
                Some(link.index)
            }
            Some(_) => {
                return Err(DaemonError::Conflict(format!(
                    "network \"{}\": a link named {bridge} exists and was not made by linnet; rename or delete it (ip link del {bridge})",
                    cfg.name
                )));
            }
            None => None,
        };
        check_overlap(cfg, netlink, adopted).await?;
        let index = match adopted {
            Some(index) => index,
            None => netlink.create_bridge(&bridge, cfg.mtu).await?,
        };
        let result = async {
            let gateway =
                Ipv4Net::new(cfg.gateway, cfg.subnet.prefix_len()).expect("validated prefix");
            netlink
                .configure(
                    index,
                    LinkSettings {
                        mtu: Some(cfg.mtu),
                        alias: Some(&alias),
                        ..Default::default()
                    },
                )
                .await?;
            netlink.add_address(index, gateway).await?;
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
            let table = LeaseTable::open(cfg, &path, unix_now()).map_err(|e| {
                DaemonError::Internal(format!("cannot read leases {}: {e}", path.display()))
            })?;
            let leases = Arc::new(Mutex::new(table));
            let ctx = Arc::new(NetworkContext {
                config: cfg.clone(),
                bridge: bridge.clone(),
                leases: leases.clone(),
            });
            let services = Services::start(ctx).await?;
            Ok::<_, DaemonError>((leases, services))
        }
        .await;
        match result {
            Ok((leases, services)) => {
                info!(network = %cfg.name, %bridge, subnet = %cfg.subnet, adopted = adopted.is_some(), "network up");
                Ok(ActiveNetwork {
                    config: cfg.clone(),
                    bridge,
                    bridge_index: index,
                    leases,
                    _services: services,
                })
            }
            Err(e) => {
                let _ = netlink.delete_link(index).await;
                Err(e)
            }
        }
    }

    /// Stops the services and removes the bridge.
    pub async fn bring_down(self, netlink: &Netlink) -> Result<(), DaemonError> {
        let ActiveNetwork {
            config,
            bridge,
            bridge_index,
            _services,
            ..
        } = self;
        drop(_services);
        netlink.delete_link(bridge_index).await?;
        info!(network = %config.name, %bridge, "network down");
        Ok(())
    }

    pub fn firewall(&self) -> FirewallNetwork {
        FirewallNetwork {
            bridge: self.bridge.clone(),
            subnet: self.config.subnet,
            mode: self.config.mode,
            nat44: self.config.nat44,
        }
    }
}

/// Refuses a subnet that overlaps an address or route already in the
/// namespace, naming the interface that holds it.
async fn check_overlap(
    cfg: &NetworkConfig,
    netlink: &Netlink,
    own_bridge: Option<u32>,
) -> Result<(), DaemonError> {
    let overlaps =
        |net: &Ipv4Net| cfg.subnet.contains(&net.network()) || net.contains(&cfg.subnet.network());
    let links = netlink.links().await?;
    let name_of = |index: Option<u32>| {
        index
            .and_then(|i| links.iter().find(|l| l.index == i))
            .map(|l| l.name.clone())
            .unwrap_or_else(|| "(no interface)".into())
    };
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
    match conflict {
        None => Ok(()),
        Some((what, index)) => Err(DaemonError::Conflict(format!(
            "network \"{}\": subnet {} overlaps {what} on interface {}; set networks.{}.subnet to a free range in {}",
            cfg.name,
            cfg.subnet,
            name_of(index),
            cfg.name,
            crate::config::DEFAULT_CONFIG_PATH
        ))),
    }
}

/// The DNS servers an attach reply names: the gateway, when DNS is on.
pub fn dns_servers(cfg: &NetworkConfig) -> Vec<Ipv4Addr> {
    if cfg.dns.enabled {
        vec![cfg.gateway]
    } else {
        Vec::new()
    }
}
