//! The driver of `mode: bridge`: each VM's port a TAP on a bridge that
//! someone else made (libvirt's `<interface type='bridge'>`), on a LAN
//! whose DHCP server gives the addresses. linnet adds and removes its own
//! TAPs and never changes the bridge itself: not its addresses, MTU,
//! settings, or whether it exists.

use std::path::Path;

use async_trait::async_trait;
use tracing::info;

use super::{Features, NetworkDriver, NetworkKind, TowardVm};
use crate::config::{BridgeLan, NetworkConfig};
use crate::daemon::errors::DaemonError;
use crate::host::guard::Hook;
use crate::host::netlink::LinkKind;
use crate::host::seam::Host;
use crate::host::{self, ALIAS_NETWORK};
use crate::services::Starter;

#[async_trait]
impl NetworkKind for BridgeLan {
    /// VMs on the LAN, which gives their addresses, and no part in
    /// linnet's firewall; their TAPs are guarded on the bridge.
    fn features(&self) -> Features {
        Features {
            nat_uplink: false,
            guard_hook: Hook::Bridge,
        }
    }

    fn link(&self, _network: &str) -> String {
        self.bridge.clone()
    }

    fn doctor_notes(&self, _network: &str) -> Vec<String> {
        vec![format!(
            "VMs are on bridge {}, which linnet never changes; their addresses come from the LAN's DHCP server, and `linnet ls` shows each once linnet has seen it",
            self.bridge
        )]
    }

    async fn bring_up(
        &self,
        cfg: &NetworkConfig,
        host: &Host,
        _services: &dyn Starter,
        _lease_dir: &Path,
    ) -> Result<Box<dyn NetworkDriver>, DaemonError> {
        Ok(Box::new(
            LanBridge::bring_up(cfg, &self.bridge, host).await?,
        ))
    }
}

pub(in crate::daemon) struct LanBridge {
    bridge: String,
    index: u32,
    /// The bridge's: a port with a smaller one would lower the bridge's.
    mtu: u32,
}

impl LanBridge {
    /// Finds the bridge; refuses a link that is no bridge, or one of
    /// linnet's own networks'.
    async fn bring_up(
        cfg: &NetworkConfig,
        bridge: &str,
        host: &Host,
    ) -> Result<LanBridge, DaemonError> {
        let name = &cfg.name;
        let link = host.links.link(bridge).await?.ok_or_else(|| {
            DaemonError::LanLink {
                network: name.clone(),
                problem: format!("there is no bridge {bridge}; create it (ip link add {bridge} type bridge) or set networks.{name}.bridge to an existing one"),
            }
        })?;
        if link.kind != LinkKind::Bridge {
            return Err(DaemonError::LanLink {
                network: name.clone(),
                problem: format!(
                    "{bridge} is not a bridge; set networks.{name}.bridge to a bridge, or use mode: bridged with uplink: {bridge}"
                ),
            });
        }
        let owner = link
            .alias
            .as_deref()
            .and_then(|a| a.strip_prefix(ALIAS_NETWORK));
        if owner.is_some() || bridge.starts_with(host::BRIDGE_PREFIX) {
            return Err(DaemonError::LinnetsBridge {
                network: name.clone(),
                bridge: bridge.into(),
                owner: owner.unwrap_or("?").into(),
            });
        }
        info!(network = %name, %bridge, mtu = link.mtu, "network up on an existing bridge");
        Ok(LanBridge {
            bridge: bridge.into(),
            index: link.index,
            mtu: link.mtu,
        })
    }
}

#[async_trait]
impl NetworkDriver for LanBridge {
    fn bridge(&self) -> Option<(&str, u32)> {
        Some((&self.bridge, self.index))
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn toward_vm(&self) -> TowardVm {
        TowardVm::Sent
    }

    /// The bridge stays as it was found.
    async fn bring_down(self: Box<Self>, cfg: &NetworkConfig, _: &Host) -> Result<(), DaemonError> {
        info!(network = %cfg.name, bridge = %self.bridge, "network down; the bridge stays");
        Ok(())
    }
}
