//! What a detach or a network's teardown could not remove, removed later.
//! A step that fails there (the kernel busy, out of memory) cannot refuse
//! the detach half-way: its VM is gone, or going. So the daemon notes
//! that it is untidy (`Daemon::untidy`), and on its next idle tick (`server`) sweeps: the
//! links marked as linnet's (their alias) that no interface and no
//! network of its own holds, as a starting daemon removes what a previous
//! one left (`adoption`), and the guard and the firewall made again from
//! its state, each in one transaction. A sweep that fails is tried again
//! at the next tick.

use std::collections::BTreeSet;

use tracing::{info, warn};

use super::errors::DaemonError;
use super::state::Daemon;
use crate::host::netlink::{Link, LinkKind};
use crate::host::{ALIAS_INTERFACE, ALIAS_NETWORK};

/// Whether `link` is linnet's (by its alias) and held by none of `ports`
/// (interfaces' links, by index) and `networks` (by name).
pub(super) fn stray(link: &Link, ports: &BTreeSet<u32>, networks: &BTreeSet<&str>) -> bool {
    let Some(alias) = link.alias.as_deref() else {
        return false;
    };
    match link.kind {
        LinkKind::Tun | LinkKind::Macvtap | LinkKind::Veth
            if alias.starts_with(ALIAS_INTERFACE) =>
        {
            !ports.contains(&link.index)
        }
        LinkKind::Bridge | LinkKind::Macvlan | LinkKind::Vxlan => alias
            .strip_prefix(ALIAS_NETWORK)
            .is_some_and(|net| !networks.contains(net)),
        _ => false,
    }
}

impl Daemon {
    /// Removes what failed steps left, if any did.
    pub async fn tidy(&mut self) {
        if !self.untidy {
            return;
        }
        self.untidy = false;
        match self.sweep().await {
            Ok(()) => info!("tidied up what a failed step had left"),
            Err(e) => {
                warn!("tidying up what a failed step left failed: {e}; trying again in a moment");
                self.untidy = true;
            }
        }
    }

    async fn sweep(&mut self) -> Result<(), DaemonError> {
        let links = self.host.links.links().await?;
        let ports: BTreeSet<u32> = (self.interfaces.values().chain(self.detaching.values()))
            .map(|i| i.tap_index)
            .collect();
        let networks: BTreeSet<&str> = self.networks.keys().map(String::as_str).collect();
        let strays: Vec<&Link> = links
            .iter()
            .filter(|l| stray(l, &ports, &networks))
            .collect();
        for link in strays {
            info!(link = %link.name, "removing a link a failed step left");
            self.host.links.delete_link(link.index).await?;
        }
        let guarded = self.guarded_ports();
        self.guard.remake(&mut *self.host.tables, &guarded)?;
        self.sync_host()
    }
}
