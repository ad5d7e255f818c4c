//! The driver of `mode: bridged`: each VM on a LAN through a macvtap on a
//! host NIC (the uplink), no bridge at all: the VM's MAC is the
//! macvtap's, its fd reads and writes frames like a TAP's, and the LAN's
//! DHCP server gives the addresses.
//!
//! A macvtap's frames go out the NIC and never come back up the host's
//! own stack on it, so in `bridge` mode the host cannot reach its own VMs
//! through the uplink; `host_access: true` gives the host a macvlan on
//! the uplink (`lh-NETWORK`), through which it can.

use std::net::Ipv4Addr;

use std::path::Path;

use async_trait::async_trait;
use tracing::{info, warn};

use super::{Features, NetworkDriver, NetworkKind, Port, PortRequest, TowardVm};
use crate::config::{MacvtapLan, MacvtapMode, NetworkConfig};
use crate::daemon::errors::DaemonError;
use crate::daemon::leftovers::Leftovers;
use crate::host::guard::Hook;
use crate::host::netlink::{LinkKind, LinkSettings};
use crate::host::seam::Host;
use crate::host::{self, ALIAS_INTERFACE, ALIAS_NETWORK};
use crate::services::Starter;
use crate::types::MacAddr;

#[async_trait]
impl NetworkKind for MacvtapLan {
    /// VMs on the LAN, which gives their addresses, and no part in
    /// linnet's firewall. A macvtap's frames never pass a bridge: they
    /// are checked as they leave it, in a netdev hook of its own.
    fn features(&self) -> Features {
        Features {
            nat_uplink: false,
            guard_hook: Hook::Egress,
        }
    }

    fn link(&self, _network: &str) -> String {
        self.uplink.clone()
    }

    fn doctor_notes(&self, network: &str) -> Vec<String> {
        let uplink = &self.uplink;
        let mut notes = vec![format!(
            "VMs are on {uplink}'s LAN through macvtaps ({} mode); their addresses come from the LAN's DHCP server, and `linnet ls` shows each once linnet has seen it",
            self.mode
        )];
        if !self.host_access {
            notes.push(format!(
                "this host cannot reach the network's VMs: a macvtap's frames leave through {uplink} and never come back up to the host; set networks.{network}.host_access: true for a macvlan that can"
            ));
        }
        notes
    }

    async fn bring_up(
        &self,
        cfg: &NetworkConfig,
        host: &Host,
        _services: &dyn Starter,
        _lease_dir: &Path,
    ) -> Result<Box<dyn NetworkDriver>, DaemonError> {
        Ok(Box::new(Macvtap::bring_up(cfg, self, host).await?))
    }
}

pub(in crate::daemon) struct Macvtap {
    uplink: String,
    uplink_index: u32,
    mode: MacvtapMode,
    mtu: u32,
    /// The host's macvlan (`host_access`), when made: a route to each VM
    /// whose address linnet learned goes through it.
    host_access: Option<u32>,
}

impl Macvtap {
    async fn bring_up(
        cfg: &NetworkConfig,
        lan: &MacvtapLan,
        host: &Host,
    ) -> Result<Macvtap, DaemonError> {
        let (uplink, mode, host_access) = (lan.uplink.as_str(), lan.mode, lan.host_access);
        let name = &cfg.name;
        let link = host.links.link(uplink).await?.ok_or_else(|| {
            DaemonError::LanLink {
                network: name.clone(),
                problem: format!("there is no interface {uplink}; set networks.{name}.uplink to the host NIC on the LAN (`ip link` lists them)"),
            }
        })?;
        let linnets = link
            .alias
            .as_deref()
            .is_some_and(|a| a.starts_with(ALIAS_NETWORK) || a.starts_with(ALIAS_INTERFACE));
        if link.kind == LinkKind::Loopback || linnets {
            let what = if linnets {
                "one of linnet's own links"
            } else {
                "the loopback"
            };
            return Err(DaemonError::LanLink {
                network: name.clone(),
                problem: format!(
                    "{uplink} is {what}, not a NIC on a LAN; set networks.{name}.uplink to one"
                ),
            });
        }
        let host_access = if host_access {
            Some(make_host_access(cfg, link.index, link.mtu, host).await?)
        } else {
            None
        };
        info!(network = %name, %uplink, %mode, host_access = host_access.is_some(), "network up on a host NIC");
        Ok(Macvtap {
            uplink: uplink.into(),
            uplink_index: link.index,
            mode,
            mtu: link.mtu,
            host_access,
        })
    }
}

/// The host's macvlan on the uplink, up, with no address of its own and
/// no IPv6 (the host's address stays on the uplink; routes to the VMs go
/// through this link).
async fn make_host_access(
    cfg: &NetworkConfig,
    uplink: u32,
    mtu: u32,
    host: &Host,
) -> Result<u32, DaemonError> {
    let name = host::host_access_name(&cfg.name);
    let netlink = &host.links;
    if let Some(old) = netlink.link(&name).await? {
        let alias = format!("{ALIAS_NETWORK}{}", cfg.name);
        if old.kind != LinkKind::Macvlan || old.alias.as_deref() != Some(alias.as_str()) {
            return Err(DaemonError::ForeignLink {
                network: cfg.name.clone(),
                link: name,
            });
        }
        netlink.delete_link(old.index).await?;
    }
    let index = netlink
        .create_macvlan(&name, uplink, host::host_access_mac(&cfg.name))
        .await?;
    let alias = format!("{ALIAS_NETWORK}{}", cfg.name);
    let made = async {
        if let Err(e) = host
            .devices
            .set_link_sysctl("ipv6", &name, "disable_ipv6", "1")
        {
            warn!(link = %name, "IPv6 stays on: {e}");
        }
        netlink
            .configure(
                index,
                LinkSettings {
                    mtu: Some(mtu),
                    alias: Some(&alias),
                    up: true,
                    ..Default::default()
                },
            )
            .await
    }
    .await;
    if let Err(e) = made {
        let mut left = Leftovers::default();
        let deleted = netlink.delete_link(index).await;
        left.note(format_args!("delete {name}"), deleted);
        left.log(&format!(
            "network \"{}\": undoing the host's macvlan",
            cfg.name
        ));
        return Err(e.into());
    }
    Ok(index)
}

#[async_trait]
impl NetworkDriver for Macvtap {
    async fn make_port(&self, host: &Host, req: PortRequest<'_>) -> Result<Port, DaemonError> {
        let netlink = &host.links;
        let mut tries = 0;
        let (name, index) = loop {
            let name = host::macvtap_name(*req.next);
            *req.next = req.next.wrapping_add(1);
            if netlink.link(&name).await?.is_some() && tries < 4096 {
                tries += 1;
                continue;
            }
            let made = netlink
                .create_macvtap(&name, self.uplink_index, self.mode, req.mac)
                .await
                .map_err(|e| DaemonError::HostStep {
                    what: format!(
                        "cannot put a macvtap for MAC {} on {}",
                        req.mac, self.uplink
                    ),
                    source: e.source,
                })?;
            break (name, made);
        };
        // The host's side of a macvtap is the VM's MAC: its own IPv6 would
        // announce that MAC (DAD, MLD) as if the VM had.
        if let Err(e) = host
            .devices
            .set_link_sysctl("ipv6", &name, "disable_ipv6", "1")
        {
            warn!(macvtap = %name, "IPv6 stays on: {e}");
        }
        match host.devices.open_macvtap(&name, index, req.scratch) {
            Ok(fd) => Ok(Port {
                name,
                index,
                mac: req.mac,
                fds: vec![fd],
            }),
            Err(e) => {
                let mut left = Leftovers::default();
                let deleted = netlink.delete_link(index).await;
                left.note(format_args!("delete {name}"), deleted);
                left.log("undoing a macvtap whose device did not open");
                Err(DaemonError::HostStep {
                    what: format!("cannot open macvtap {name}'s device"),
                    source: e,
                })
            }
        }
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn toward_vm(&self) -> TowardVm {
        TowardVm::Received
    }

    /// With `host_access`, the host reaches the VM at its address through
    /// the macvlan, from the uplink's own address (which the VM's LAN
    /// knows): the macvtap's frames never come back up the uplink.
    async fn vm_address(
        &self,
        host: &Host,
        _mac: MacAddr,
        was: Option<Ipv4Addr>,
        now: Option<Ipv4Addr>,
    ) -> Result<(), DaemonError> {
        let netlink = &host.links;
        let Some(index) = self.host_access else {
            return Ok(());
        };
        if let Some(was) = was.filter(|&w| Some(w) != now) {
            netlink.delete_host_route(was, index).await?;
        }
        let Some(now) = now else {
            return Ok(());
        };
        let src = netlink
            .ipv4_addresses()
            .await?
            .into_iter()
            .find(|(i, _)| *i == self.uplink_index)
            .map(|(_, net)| net.addr())
            .ok_or_else(|| DaemonError::NoUplinkAddress {
                uplink: self.uplink.clone(),
                vm: now,
            })?;
        netlink.add_host_route(now, index, src).await?;
        Ok(())
    }

    fn ports_open_by_name(&self) -> bool {
        false
    }

    /// Removes the host's macvlan; the uplink stays as it was.
    async fn bring_down(
        self: Box<Self>,
        cfg: &NetworkConfig,
        host: &Host,
    ) -> Result<(), DaemonError> {
        if let Some(index) = self.host_access {
            host.links.delete_link(index).await?;
        }
        info!(network = %cfg.name, uplink = %self.uplink, "network down; the uplink stays");
        Ok(())
    }
}
