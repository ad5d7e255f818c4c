//! A network across hosts' way to the other hosts (`evpn:`): its VXLAN
//! device — one VNI, this host's VTEP as its source, UDP port 4789, no
//! learning — as a port of the network's bridge with neighbour suppression
//! on and learning off. FRR's zebra sees the device, advertises the VNI
//! and the MACs and addresses behind the bridge's other ports, and fills
//! the device's FDB and the bridge's neighbour table with the other
//! hosts'; the bridge then answers ARP and ND for those itself.
//!
//! Every host's bridge has the same gateway address and MAC (an anycast
//! gateway: the bridge's MAC comes from the network's name), so a VM's
//! gateway is always its own host; the firewall keeps the gateway, DHCP
//! and router advertisements off the fabric port (`host::firewall`).

use std::net::{IpAddr, Ipv4Addr};

use tracing::info;

use crate::config::Evpn;
use crate::config::VXLAN_OVERHEAD;
use crate::daemon::errors::DaemonError;
use crate::daemon::leftovers::Leftovers;
use crate::host::netlink::{LinkKind, LinkSettings, VxlanId};
use crate::host::seam::Host;
use crate::host::{self, ALIAS_NETWORK};
use crate::types::MacAddr;

/// The VXLAN port of a network's bridge.
pub(super) struct Fabric {
    pub port: String,
    pub index: u32,
    /// The network's gateway MAC, every host's.
    pub gateway_mac: MacAddr,
}

impl Fabric {
    /// Checks the VTEP and the underlay's MTU, then makes (or adopts) the
    /// network's VXLAN device as a port of `bridge`. On error nothing it
    /// made is left behind.
    pub async fn join(
        network: &str,
        evpn: &Evpn,
        mtu: u32,
        host: &Host,
        bridge: u32,
    ) -> Result<Fabric, DaemonError> {
        let links = &*host.links;
        check_underlay(network, evpn, mtu, host).await?;
        let port = host::vxlan_name(network);
        let alias = format!("{ALIAS_NETWORK}{network}");
        let id = VxlanId {
            vni: evpn.vni,
            local: Some(evpn.vtep),
        };
        let adopted = match links.link(&port).await? {
            // Ours: marked with our alias, or — a daemon that died between
            // making it and marking it — unmarked with the VNI and VTEP
            // linnet gives it.
            Some(link)
                if link.kind == LinkKind::Vxlan
                    && (link.alias.as_deref() == Some(&alias)
                        || (link.alias.is_none() && link.vxlan == Some(id))) =>
            {
                if link.vxlan == Some(id) {
                    Some(link.index)
                } else {
                    // Made for another VNI or VTEP: the config changed.
                    info!(%network, %port, was = ?link.vxlan, "VXLAN device made anew for the VNI and VTEP the config now gives");
                    links.delete_link(link.index).await?;
                    None
                }
            }
            Some(_) => {
                return Err(DaemonError::ForeignLink {
                    network: network.into(),
                    link: port,
                });
            }
            None => None,
        };
        let index = match adopted {
            Some(index) => index,
            None => links.create_vxlan(&port, id, mtu).await?,
        };
        let set_up = async {
            links
                .configure(
                    index,
                    LinkSettings {
                        mtu: Some(mtu),
                        alias: Some(&alias),
                        master: Some(bridge),
                        ..Default::default()
                    },
                )
                .await?;
            links.make_fabric_port(index).await?;
            links
                .configure(
                    index,
                    LinkSettings {
                        up: true,
                        ..Default::default()
                    },
                )
                .await
        };
        if let Err(e) = set_up.await {
            if adopted.is_none() {
                let mut left = Leftovers::default();
                let deleted = links.delete_link(index).await;
                left.note(format_args!("delete {port}"), deleted);
                left.log(&format!("network \"{network}\": undoing its VXLAN device"));
            }
            return Err(e.into());
        }
        info!(%network, %port, vni = evpn.vni, vtep = %evpn.vtep, adopted = adopted.is_some(), "joined the fabric");
        Ok(Fabric {
            port,
            index,
            gateway_mac: host::bridge_mac(network),
        })
    }

    /// Removes the VXLAN device: the other hosts' VMs are gone from the
    /// network here.
    pub async fn leave(self, network: &str, host: &Host) -> Result<(), DaemonError> {
        host.links.delete_link(self.index).await?;
        info!(%network, port = %self.port, "left the fabric");
        Ok(())
    }
}

/// Refuses a VTEP that is no address of this host, and an MTU that with
/// VXLAN's headers is more than the link toward the peers carries (the
/// VTEP's own link when no peer is routed yet).
async fn check_underlay(
    network: &str,
    evpn: &Evpn,
    mtu: u32,
    host: &Host,
) -> Result<(), DaemonError> {
    let links = host.links.links().await?;
    let name_of = |index: u32| {
        links
            .iter()
            .find(|l| l.index == index)
            .map_or_else(|| format!("link {index}"), |l| l.name.clone())
    };
    let addresses = host.links.ipv4_addresses().await?;
    let Some(&(vtep_link, _)) = addresses.iter().find(|(_, net)| net.addr() == evpn.vtep) else {
        let have: Vec<String> = addresses
            .iter()
            .filter(|(_, net)| !net.addr().is_loopback())
            .map(|(index, net)| format!("{} on {}", net.addr(), name_of(*index)))
            .collect();
        return Err(DaemonError::VtepNotHere {
            network: network.into(),
            vtep: evpn.vtep,
            have: if have.is_empty() {
                "it has no IPv4 address but loopback's".into()
            } else {
                format!("it has {}", have.join(", "))
            },
        });
    };
    let mut toward = Vec::new();
    for peer in &evpn.peers {
        if let Some(index) = host.links.route_to(IpAddr::V4(*peer)).await? {
            toward.push(index);
        }
    }
    if toward.is_empty() {
        toward.push(vtep_link);
    }
    let narrowest = toward
        .iter()
        .filter_map(|index| links.iter().find(|l| l.index == *index))
        .min_by_key(|l| l.mtu);
    if let Some(link) = narrowest
        && mtu + VXLAN_OVERHEAD > link.mtu
    {
        return Err(DaemonError::UnderlayMtu {
            network: network.into(),
            mtu,
            link: link.name.clone(),
            link_mtu: link.mtu,
            overhead: VXLAN_OVERHEAD,
        });
    }
    Ok(())
}

/// A VM's address in the bridge's neighbour table, which FRR advertises
/// with its MAC to the other hosts (`now`), or taken out (`was`).
pub(super) async fn advertise(
    host: &Host,
    bridge: u32,
    mac: MacAddr,
    was: Option<Ipv4Addr>,
    now: Option<Ipv4Addr>,
) -> Result<(), DaemonError> {
    if let Some(was) = was.filter(|w| Some(*w) != now) {
        host.links.delete_neighbour(bridge, was).await?;
    }
    if let Some(now) = now {
        host.links.set_neighbour(bridge, now, mac).await?;
    }
    Ok(())
}
