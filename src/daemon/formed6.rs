//! Learning the IPv6 addresses VMs form themselves (`formed6`): one packet
//! socket (`host::packet::dad_probes`) sees every duplicate address
//! detection probe in the namespace; a probe that enters linnet's bridge
//! from a VM's port, from that VM's MAC, for an address `formed6::judge`
//! lets it have, teaches the daemon that address. The guard then lets the
//! VM send from it (before the VM does: a guest waits a second after its
//! probe), its policy holds on it, `linnet ls` and the API show it, an
//! event says so, and its record keeps it for a daemon after this one.
//!
//! Only networks with anti-spoofing need this: elsewhere every address of
//! the prefix passes already. A clone's port is left out (its IPv6 is not
//! routed), as is a port cut off.

use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::Ipv6Net;

use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::drivers::TowardVm;
use super::sockets::Frames;
use super::state::Daemon;
use crate::addr6;
use crate::budget::RateLimit;
use crate::events::What;
use crate::formed6::{self, Probe, Scope, Verdict};
use crate::host::packet::{self, Seen};
use crate::types::InterfaceId;

/// Probes one port may have judged per second: a guest probes each
/// address once (`dad_transmits`), a few at a time; more is a VM trying
/// addresses in a loop, and each learned one is a change to the tables.
const PROBES_PER_SECOND: u32 = 8;

/// Starts the learning, if any network has IPv6 behind anti-spoofing.
pub fn spawn(daemon: Arc<Mutex<Daemon>>, any_guarded_ipv6: bool) -> Option<JoinHandle<()>> {
    if !any_guarded_ipv6 {
        return None;
    }
    let what = "learning VMs' IPv6 addresses";
    let mut frames = match Frames::new(packet::dad_probes(), 128, what) {
        Ok(frames) => frames,
        Err(e) => {
            warn!(
                "cannot open a packet socket for duplicate address detection: {e}; VMs may send only from the IPv6 addresses linnet reports (EUI-64)"
            );
            return None;
        }
    };
    Some(tokio::spawn(async move {
        let mut rate: RateLimit<u32> = RateLimit::new(PROBES_PER_SECOND, Duration::from_secs(1));
        while let Some((seen, frame)) = frames.next().await {
            let Some(probe) = formed6::probe(frame) else {
                continue;
            };
            if let Err(refused) = rate.allow(&seen.index, Instant::now()) {
                if let Some(count) = refused.report {
                    warn!(
                        port = seen.index,
                        refused = count,
                        "a VM sent more than {PROBES_PER_SECOND} duplicate address probes in a second; ignoring the rest"
                    );
                }
                continue;
            }
            daemon.lock().await.address6_probed(seen, probe);
        }
    }))
}

impl Daemon {
    /// A VM's port `seen.index` passed `probe`: learn its address if it
    /// came from the VM, is the VM's, and may be had.
    pub fn address6_probed(&mut self, seen: Seen, probe: Probe) {
        let Some((&id, iface)) = self
            .interfaces
            .iter()
            .find(|(_, i)| i.tap_index == seen.index && i.cut_off.is_none())
        else {
            return;
        };
        let (Some(net), Some(cfg)) = (
            self.networks.get(&iface.network),
            self.config.network(&iface.network),
        ) else {
            return;
        };
        let from_vm = match net.toward_vm() {
            TowardVm::Sent => !seen.outgoing,
            TowardVm::Received => seen.outgoing,
        };
        let Some(v6) = cfg.ipv6() else { return };
        if !from_vm
            || probe.mac != iface.mac
            || !iface.guarded
            || !cfg.anti_spoofing
            || iface.as_clone.is_some()
        {
            return;
        }
        let prefix = v6.prefix;
        let scope = Scope {
            prefix,
            mac: iface.mac,
            formed: &iface.formed6,
        };
        let network = iface.network.clone();
        let taken = |t| self.ipv6_taken(&network, id, prefix, t);
        let target = probe.target;
        let forget = match formed6::judge(target, scope, taken) {
            Verdict::Known => return,
            Verdict::Refuse(why) => {
                info!(%network, interface = %id, mac = %probe.mac, address = %target, "not letting the VM send from an IPv6 address it formed: {why}");
                let what = What::Ipv6Refused {
                    interface_id: id,
                    ipv6_address: target,
                    reason: why.to_string(),
                };
                self.events.emit(Some(&network), what);
                return;
            }
            Verdict::Learn { forget } => forget,
        };
        if let Err(e) = self.learn6(id, target, forget) {
            // Not learned: the VM's next probe of it (a reboot, a new
            // attempt) tries again.
            warn!(%network, interface = %id, address = %target, "cannot let the VM send from an IPv6 address it formed: {e}");
            return;
        }
        info!(%network, interface = %id, mac = %probe.mac, address = %target, forgotten = ?forget, "learned an IPv6 address the VM formed");
        let what = What::Ipv6Learned {
            interface_id: id,
            ipv6_address: target,
            forgotten: forget,
        };
        self.events.emit(Some(&network), what);
        self.save_record(id);
    }

    /// Whether a VM of `network` but `id` has IPv6 address `t` (on
    /// `prefix`, or link-local).
    pub(super) fn ipv6_taken(
        &self,
        network: &str,
        id: InterfaceId,
        prefix: Ipv6Net,
        t: Ipv6Addr,
    ) -> bool {
        self.interfaces.iter().any(|(&other, i)| {
            other != id
                && i.network == network
                && (i.formed6.contains(&t)
                    || t == addr6::link_local(i.mac)
                    || t == addr6::slaac_address(prefix, i.mac))
        })
    }

    /// Gives interface `id` the address `add` in place of `forget`: its
    /// policy first (a policed VM's rules name its addresses: the address
    /// is never let through before they hold on it), then its guard.
    /// Undone on a failure.
    fn learn6(
        &mut self,
        id: InterfaceId,
        add: Ipv6Addr,
        forget: Option<Ipv6Addr>,
    ) -> Result<(), super::errors::DaemonError> {
        let before = self.guard_of(&self.interfaces[&id]);
        let swap = |formed: &mut Vec<Ipv6Addr>, add: Ipv6Addr, remove: Option<Ipv6Addr>| {
            formed.retain(|a| Some(*a) != remove);
            formed.push(add);
        };
        let iface = self.interfaces.get_mut(&id).expect("found by the caller");
        swap(&mut iface.formed6, add, forget);
        let policed = !iface.policy.is_empty();
        let after = self.guard_of(&self.interfaces[&id]);
        let result = (|| {
            if policed {
                self.sync_host()?;
            }
            if let (Some(before), Some(after)) = (&before, &after) {
                self.host.tables.update_guard_port(before, after)?;
            }
            Ok(())
        })();
        if result.is_err() {
            let iface = self.interfaces.get_mut(&id).expect("found by the caller");
            iface.formed6.retain(|a| *a != add);
            if let Some(old) = forget {
                iface.formed6.insert(0, old);
            }
            if policed && let Err(e) = self.sync_host() {
                warn!(interface = %id, "cannot put the policy back as it was: {e}");
            }
        }
        result
    }
}
