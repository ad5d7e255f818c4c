//! Spare ports: each network whose VMs' ports are TAPs on a bridge of
//! linnet's own keeps a few made ahead, on its bridge and down, owned by
//! root and held by the daemon alone, and an attach takes one instead of
//! joining a new TAP to the bridge. (Not on a bridge of someone else's
//! (`mode: bridge`): one whose MAC was not set by hand takes its ports'
//! lowest, which a spare would change.)
//!
//! Joining a bridge costs the kernel a walk over the bridge's ports (its
//! features, MTU, bridge id and the ports' adjacency lists are worked out
//! again, under the lock every link change takes), which made the 1000th
//! attach on a network take twice the 10th (`make bench`, "attach p50
//! with 1000 interfaces vs with 10"). A spare is joined after an attach
//! took one, off the attach's path and outside the daemon's lock.
//!
//! A spare never reaches a VM as it is: down, its bridge port is disabled
//! (nothing is forwarded to it or from it), and an attach that takes it
//! gives it to its user, guards it and sets it up as it would a new TAP
//! (`apply`). It is not taken while guarded ports are held (linnet's
//! tables damaged: a new guarded port waits off its bridge), nor for more
//! than one queue (the kernel's queues are fixed when a TAP is made). It
//! goes with its fd: a spare is never left behind by a daemon that stops
//! or dies, and a network's go before it comes down.

use std::sync::Arc;

use tokio::sync::Notify;
use tracing::{debug, warn};

use super::drivers::{Port, new_tap_port};
use super::errors::DaemonError;
use super::state::Daemon;
use crate::host::ALIAS_SPARE;
use crate::host::netlink::LinkSettings;
use crate::host::seam::{Devices, Links};

/// What making one spare needs, read under the daemon's lock.
struct Order {
    network: String,
    bridge: u32,
    mtu: u32,
    number: u32,
}

impl Daemon {
    /// The next spare a network wants, the number its name starts from
    /// taken from the TAPs' counter.
    fn next_order(&mut self) -> Option<Order> {
        let (name, net) = self
            .networks
            .iter()
            .find(|(_, n)| n.keeps_spares() && n.spares.wanted() > 0)?;
        let (_, bridge) = net.bridge()?;
        let order = Order {
            network: name.clone(),
            bridge,
            mtu: net.mtu(),
            number: self.next_tap,
        };
        self.next_tap = self.next_tap.wrapping_add(1);
        Some(order)
    }

    /// Keeps a spare made for `order` if its network is still up on the
    /// same bridge; otherwise drops it (and its TAP goes).
    fn keep_spare(&mut self, order: &Order, spare: Port, next: u32) {
        self.next_tap = self.next_tap.max(next);
        match self.networks.get(&order.network) {
            Some(net) if net.bridge().map(|(_, i)| i) == Some(order.bridge) => {
                net.spares.keep(spare)
            }
            _ => {
                debug!(tap = %spare.name, network = %order.network, "the network of a spare went: dropped")
            }
        }
    }
}

#[cfg(test)]
impl Daemon {
    /// Makes every spare the networks want, as the task does but holding
    /// the daemon throughout (for the scenarios).
    pub(super) async fn make_spares(&mut self) -> Result<(), DaemonError> {
        while let Some(order) = self.next_order() {
            let (links, devices) = (self.host.links.clone(), self.host.devices.clone());
            let mut next = order.number;
            let spare = make((&*links, &*devices), &order, &mut next).await?;
            self.keep_spare(&order, spare, next);
        }
        Ok(())
    }
}

/// Makes a spare: a TAP owned by root as attaches make them, its network's
/// MTU, marked as a spare and on the bridge, down.
async fn make(
    (links, devices): (&dyn Links, &dyn Devices),
    order: &Order,
    next: &mut u32,
) -> Result<Port, DaemonError> {
    let port = new_tap_port((links, devices), next, (0, 0), 1).await?;
    let alias = format!("{ALIAS_SPARE}{}", order.network);
    let settings = LinkSettings {
        master: Some(order.bridge),
        mtu: Some(order.mtu),
        txqueuelen: None,
        alias: Some(&alias),
        up: false,
    };
    links.configure(port.index, settings).await?;
    Ok(port)
}

/// Makes the spares networks want whenever `wanted` is told (after each
/// attach), until the daemon stops. The daemon's lock is held only to
/// read what to make and to keep what was made.
pub fn spawn(
    daemon: Arc<tokio::sync::Mutex<Daemon>>,
    wanted: Arc<Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            wanted.notified().await;
            loop {
                let (order, host) = {
                    let mut d = daemon.lock().await;
                    let Some(order) = d.next_order() else { break };
                    (order, (d.host.links.clone(), d.host.devices.clone()))
                };
                let mut next = order.number;
                match make((&*host.0, &*host.1), &order, &mut next).await {
                    Ok(spare) => daemon.lock().await.keep_spare(&order, spare, next),
                    Err(e) => {
                        // Attaches make their own TAPs meanwhile; the next
                        // one asks again.
                        warn!(network = %order.network, "cannot make a spare port: {e}");
                        break;
                    }
                }
            }
        }
    })
}
