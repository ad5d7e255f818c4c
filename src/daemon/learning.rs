//! Learning the addresses of LAN networks' VMs, as libvirt's DHCP snooping
//! does: one packet socket (`host::packet`) sees every DHCP reply in the
//! namespace; an ACK on its way to a VM's port (the direction its driver
//! names: a VM can send itself any ACK it likes) gives that VM its
//! address. The guard then lets the VM send from it, `linnet ls` and the
//! API show it, and `WaitAddress` returns it. A later ACK (a renewal, a
//! new lease) replaces it.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::client::Client;
use super::drivers::TowardVm;
use super::errors::DaemonError;
use super::sockets::Frames;
use super::state::Daemon;
use crate::events::What;
use crate::host::packet::{self, Seen};
use crate::services::snoop::{self, Acked};
use crate::types::InterfaceId;

/// The longest `WaitAddress` may wait.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// Starts the learning, if any network is on a LAN.
pub fn spawn(daemon: Arc<Mutex<Daemon>>, any_lan: bool) -> Option<JoinHandle<()>> {
    if !any_lan {
        return None;
    }
    let mut frames = match Frames::new(packet::dhcp_replies(), 4096, "DHCP snooping") {
        Ok(frames) => frames,
        Err(e) => {
            warn!(
                "cannot open a packet socket for DHCP snooping: {e}; LAN networks' addresses will not be known (nor let through anti_spoofing)"
            );
            return None;
        }
    };
    Some(tokio::spawn(async move {
        while let Some((seen, frame)) = frames.next().await {
            if let Some(acked) = snoop::dhcp_ack(frame) {
                daemon.lock().await.address_learned(seen, acked).await;
            }
        }
    }))
}

impl Daemon {
    /// An ACK passed the port `seen.index`: if it went toward the VM of a
    /// LAN interface there, for that VM's MAC, the VM has that address.
    pub async fn address_learned(&mut self, seen: Seen, acked: Acked) {
        let Some((&id, iface)) = self
            .interfaces
            .iter()
            .find(|(_, i)| i.tap_index == seen.index && i.cut_off.is_none())
        else {
            return;
        };
        let Some(net) = self.networks.get(&iface.network) else {
            return;
        };
        let toward_vm = match net.toward_vm() {
            TowardVm::Sent => seen.outgoing,
            TowardVm::Received => !seen.outgoing,
        };
        if net.config.own().is_some()
            || !toward_vm
            || acked.mac != iface.mac
            || iface.ip == Some(acked.ip)
        {
            return;
        }
        let before = self.guard_of(iface);
        let iface = self.interfaces.get_mut(&id).expect("found above");
        let was = iface.ip.replace(acked.ip);
        let after = self.guard_of(&self.interfaces[&id]);
        if let (Some(before), Some(after)) = (before, after)
            && let Err(e) = self.host.tables.update_guard_port(&before, &after)
        {
            // Not learned: the next ACK (a retry, a renewal) tries again.
            warn!(interface = %id, "cannot let the VM send from {}: {e}", acked.ip);
            self.interfaces.get_mut(&id).expect("found above").ip = was;
            return;
        }
        let iface = &self.interfaces[&id];
        info!(network = %iface.network, interface = %id, name = ?iface.name, mac = %iface.mac, ip = %acked.ip, ?was, "learned the VM's address from the LAN's DHCP server");
        let what = What::Learned {
            interface_id: id,
            ip_address: acked.ip,
        };
        self.events.emit(Some(&iface.network), what);
        let (network, net) = (
            &self.interfaces[&id].network,
            &self.networks[&self.interfaces[&id].network],
        );
        if let Err(e) = net
            .vm_address(&self.host, acked.mac, was, Some(acked.ip))
            .await
        {
            warn!(%network, interface = %id, "{e}");
        }
        self.learned.send_modify(|n| *n += 1);
        // A daemon after this one adopts it with the address.
        self.save_record(id);
    }

    /// The address of `id` on `network` if known yet, for its owner or
    /// root; and what to wait on for news.
    pub fn address_of(
        &self,
        client: &Client,
        network: &str,
        id: InterfaceId,
    ) -> Result<Result<Ipv4Addr, tokio::sync::watch::Receiver<u64>>, DaemonError> {
        let iface = self
            .interfaces
            .get(&id)
            .filter(|i| i.network == network)
            .ok_or_else(|| DaemonError::NotAttached {
                which: format!("interface {id}"),
                network: Some(network.into()),
            })?;
        if client.uid != 0 && client.uid != iface.uid {
            return Err(DaemonError::NotOwner {
                id,
                owner: iface.uid,
                what: "wait for its address",
            });
        }
        // A connection that waits is not watched for closing meanwhile: one
        // that holds interfaces would keep them past its client's end.
        if self.interfaces.values().any(|i| i.holder.is(client.id)) {
            return Err(DaemonError::WaitHolds);
        }
        // A clone's: the guest's own, as its attach said.
        let guest = iface.as_clone.as_ref().map(|c| c.guest.ip);
        Ok(guest.or(iface.ip).ok_or_else(|| self.learned.subscribe()))
    }
}
