//! Notices a VMM changing its TAP's MAC. The TAP fd linnet hands out
//! accepts SIOCSIFHWADDR without any capability, and a bridge port's MAC
//! becomes a permanent ("local") entry of the bridge's forwarding table:
//! a VMM that gives its TAP a victim's MAC draws the host's frames for the
//! victim to its own port. So each TAP's MAC at attach is recorded, and a
//! TAP whose MAC changes is taken off its bridge and down at once (which
//! also takes its bridge entries away); the interface stays listed, with
//! the reason, until its client detaches. The guard's unicast rule (only
//! frames to the VM's own MAC leave through its port) keeps the thief from
//! the victim's frames in the moment before that. Lost notifications (an
//! overrun) make it compare every TAP at once.

use std::sync::Arc;

use futures::StreamExt;
use rtnetlink::MulticastGroup;
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use tokio::sync::Mutex;
use tracing::{error, warn};

use super::interface::TapAddresses;
use super::state::Daemon;
use crate::events::What;
use crate::types::MacAddr;

/// The index and MAC a link message carries, if it has both.
fn link_address(msg: &LinkMessage) -> Option<(u32, MacAddr)> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(bytes) => <[u8; 6]>::try_from(bytes.as_slice())
            .ok()
            .map(|b| (msg.header.index, MacAddr(b))),
        _ => None,
    })
}

/// Watches link notifications until the daemon stops.
pub fn spawn(daemon: Arc<Mutex<Daemon>>, known: TapAddresses) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (connection, _handle, mut messages) = match rtnetlink::new_multicast_connection(&[
            MulticastGroup::Link,
        ]) {
            Ok(c) => c,
            Err(e) => {
                warn!(
                    "cannot watch links ({e}): a VMM that changes its TAP's MAC will not be cut off"
                );
                return;
            }
        };
        tokio::spawn(connection);
        while let Some((msg, _)) = messages.next().await {
            let link = match msg.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => link,
                // Notifications were lost (the socket's buffer overflowed
                // while the daemon was busy): look at every link instead.
                NetlinkPayload::Overrun(_) => {
                    warn!("link notifications were lost: comparing every TAP's MAC");
                    recheck(&daemon, &known).await;
                    continue;
                }
                _ => continue,
            };
            let Some((index, now)) = link_address(&link) else {
                continue;
            };
            if let Some(was) = known.changed(index, now) {
                daemon.lock().await.tap_address_changed(index, was).await;
            }
        }
        error!("the link watch stopped: a VMM that changes its TAP's MAC will not be cut off");
    })
}

/// Compares every recorded TAP's MAC with what the kernel has now.
async fn recheck(daemon: &Mutex<Daemon>, known: &TapAddresses) {
    let mut daemon = daemon.lock().await;
    let links = match daemon.host.links.links().await {
        Ok(links) => links,
        Err(e) => {
            warn!("cannot list links to compare TAPs' MACs: {e}");
            return;
        }
    };
    for link in links {
        let Some(now) = link.address else { continue };
        if let Some(was) = known.changed(link.index, now) {
            daemon.tap_address_changed(link.index, was).await;
        }
    }
}

impl Daemon {
    /// A VMM changed its TAP's MAC (`tap_watch`): the TAP leaves its bridge
    /// and goes down, which also removes the bridge entry the new MAC made.
    /// A notification can be older than the MAC linnet set at attach (the
    /// kernel's first, random one): only the link as it is now counts.
    pub async fn tap_address_changed(&mut self, index: u32, was: MacAddr) {
        let Some(tap) = self
            .interfaces
            .values()
            .find(|i| i.tap_index == index && i.cut_off.is_none())
            .map(|i| i.tap.clone())
        else {
            return;
        };
        let now = match self.host.links.link(&tap).await {
            Ok(Some(link)) if link.index == index => match link.address {
                Some(now) if now != was => now,
                _ => return,
            },
            // Gone, or the name is another link's now: nothing to cut.
            Ok(_) => return,
            Err(e) => {
                warn!(%tap, "cannot read the TAP's MAC: {e}");
                return;
            }
        };
        self.tap_addresses.forget(index);
        let Some((id, iface)) = self
            .interfaces
            .iter_mut()
            .find(|(_, i)| i.tap_index == index)
        else {
            return;
        };
        warn!(network = %iface.network, interface = %id, tap = %iface.tap, pid = ?iface.pid(), uid = iface.uid, %was, %now,
            "the VMM changed its TAP's MAC, which could take another VM's traffic: the TAP is off the network until detached");
        let reason = format!(
            "its VMM changed the TAP's MAC from {was} to {now}; off the network until detached"
        );
        iface.cut_off = Some(reason.clone());
        let what = What::CutOff {
            interface_id: *id,
            reason,
        };
        self.events.emit(Some(&iface.network), what);
        if let Err(e) = self.host.links.cut_off(index).await {
            warn!(tap = %iface.tap, "cannot take the TAP off its bridge: {e}");
        }
        let id = *id;
        self.save_record(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_recorded_tap_whose_mac_differs_counts() {
        let known = TapAddresses::default();
        let mac = |b| MacAddr([2, 0, 0, 0, 0, b]);
        known.record(7, mac(1));
        assert_eq!(known.changed(7, mac(1)), None, "same MAC");
        assert_eq!(known.changed(8, mac(2)), None, "not a TAP of ours");
        assert_eq!(known.changed(7, mac(2)), Some(mac(1)));
        known.forget(7);
        assert_eq!(known.changed(7, mac(2)), None, "forgotten at detach");
    }
}
