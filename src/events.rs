//! What happens to networks and VMs, as `linnet events` follows it: one
//! event per change (an attach, a lease, a policy set, ...), from the
//! daemon and its services onto one bus. A subscriber that reads too slowly
//! misses events rather than holding anyone up: the bus keeps the last
//! `CAPACITY` for each, and tells it how many it missed (`Dropped`). The
//! bus also keeps the last `RECENT` events for subscribers that ask for
//! them first (`linnet events --recent`): what a daemon adopted at its
//! start happened before anyone could subscribe.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::datapath::Datapath;
use crate::forward::PortForward;
use crate::policy::Policy;
use crate::types::{InterfaceId, MacAddr};

/// Events a subscriber may fall behind by before it misses some (besides
/// those its socket holds): one ring for all subscribers.
pub const CAPACITY: usize = 256;
/// Events the bus keeps for `--recent`.
pub const RECENT: usize = 256;

/// One change, when it happened and on which network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Unix time, milliseconds.
    pub time_ms: u64,
    /// The network it happened on (none for `dropped`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(flatten)]
    pub what: What,
}

/// An address an answer let a VM reach, for `seconds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reachable {
    pub address: std::net::IpAddr,
    pub seconds: u32,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum What {
    /// An interface was attached.
    Attached {
        interface_id: InterfaceId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        mac_address: MacAddr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ip_address: Option<Ipv4Addr>,
        tap: String,
        datapath: Datapath,
        uid: u32,
    },
    /// An interface went (its client detached or went away).
    Detached {
        interface_id: InterfaceId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        tap: String,
    },
    /// linnet's DHCP gave (or renewed) a lease.
    Lease {
        mac_address: MacAddr,
        ip_address: Ipv4Addr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hostname: Option<String>,
    },
    /// A LAN VM's address, as linnet saw the LAN's DHCP server give it.
    Learned {
        interface_id: InterfaceId,
        ip_address: Ipv4Addr,
    },
    /// An IPv6 address a VM formed itself (not the EUI-64 one its attach
    /// reported), as its duplicate address detection showed it: the VM
    /// may now send from it; it stopped sending from `forgotten`, its
    /// oldest such address, to stay within the limit.
    Ipv6Learned {
        interface_id: InterfaceId,
        ipv6_address: std::net::Ipv6Addr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forgotten: Option<std::net::Ipv6Addr>,
    },
    /// An IPv6 address a VM formed that it may not send from, and why.
    Ipv6Refused {
        interface_id: InterfaceId,
        ipv6_address: std::net::Ipv6Addr,
        reason: String,
    },
    /// A VM's port was taken off its network (its VMM misbehaved).
    CutOff {
        interface_id: InterfaceId,
        reason: String,
    },
    /// An interface's policy changed (`policy set`).
    Policy {
        interface_id: InterfaceId,
        policy: Policy,
    },
    /// A port was published to a VM, or withdrawn.
    Forward {
        interface_id: InterfaceId,
        forward: PortForward,
        added: bool,
    },
    /// A starting daemon took over an interface its predecessor left.
    Adopted {
        interface_id: InterfaceId,
        tap: String,
    },
    /// An adopted interface's client claimed it again.
    Reclaimed {
        interface_id: InterfaceId,
    },
    /// linnet's DNS answered, or refused, a name a VM with names in its
    /// policy asked for: the decision its policy made, on record.
    Name {
        interface_id: InterfaceId,
        /// The VM's name, if it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The name it asked for, as DNS compares names.
        asked: String,
        allowed: bool,
        /// What an allowed answer let it reach, and for how long.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        learned: Vec<Reachable>,
        /// This VM's records not given (over its budget) since its last.
        #[serde(default, skip_serializing_if = "is_zero")]
        held_back: u64,
    },
    /// The gate judged a connection of a VM whose policy names names
    /// (allowed: it showed an allowed name at an address the VM learned
    /// for it; refused, and why).
    Connection {
        interface_id: InterfaceId,
        /// The VM's name, if it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        destination: IpAddr,
        port: u16,
        /// "tcp": the gate holds TCP connections only.
        protocol: String,
        /// The name the connection showed (TLS server name, HTTP Host).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shown: Option<String>,
        allowed: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
        /// Judged by the network's secrets proxy, which decrypted it to put
        /// secrets into its requests (a secret rule names its name).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        decrypted: bool,
        /// This VM's records not given (over its budget) since its last.
        #[serde(default, skip_serializing_if = "is_zero")]
        held_back: u64,
    },
    /// The secrets proxy put a secret into a VM's request to `host`
    /// (`secret`: its name, never its value), or refused a request to it
    /// (`why`), sending nothing upstream.
    Secret {
        interface_id: InterfaceId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        host: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
        substituted: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
        #[serde(default, skip_serializing_if = "is_zero")]
        held_back: u64,
    },
    /// A connection the gate allowed ended (its TCP state said so, or
    /// conntrack forgot it): what it moved each way, and for how long it
    /// ran.
    ConnectionEnd {
        interface_id: InterfaceId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        destination: IpAddr,
        port: u16,
        protocol: String,
        /// The name it showed.
        shown: String,
        /// Bytes from the VM and to it (IP packets whole, as conntrack
        /// counts them); None where conntrack does not count.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sent: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        received: Option<u64>,
        /// From its verdict to its end, in milliseconds.
        duration_ms: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        held_back: u64,
    },
    /// A network came up, or went down.
    NetworkUp,
    NetworkDown,
    /// The subscriber fell behind and missed this many events.
    Dropped {
        count: u64,
    },
}

impl Event {
    pub fn now(network: Option<&str>, what: What) -> Event {
        let time_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Event {
            time_ms,
            network: network.map(str::to_string),
            what,
        }
    }
}

/// Where events go: to every subscriber, and the last `RECENT` kept.
#[derive(Clone)]
pub struct Bus {
    sender: broadcast::Sender<Event>,
    recent: Arc<Mutex<VecDeque<Event>>>,
}

impl Default for Bus {
    fn default() -> Bus {
        Bus {
            sender: broadcast::channel(CAPACITY).0,
            recent: Arc::new(Mutex::new(VecDeque::with_capacity(RECENT))),
        }
    }
}

impl Bus {
    /// Sends `what` on `network` to whoever follows; never waits.
    pub fn emit(&self, network: Option<&str>, what: What) {
        let event = Event::now(network, what);
        {
            let mut recent = self.recent.lock().expect("recent events lock");
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(event.clone());
        }
        // None following is no error.
        let _ = self.sender.send(event);
    }

    /// From now on, and (`recent`) what was kept first.
    pub fn subscribe(&self, recent: bool) -> (Vec<Event>, broadcast::Receiver<Event>) {
        // Under the lock: no event both in the kept ones and received.
        let kept = self.recent.lock().expect("recent events lock");
        let receiver = self.sender.subscribe();
        let first = if recent {
            kept.iter().cloned().collect()
        } else {
            Vec::new()
        };
        (first, receiver)
    }
}

/// Whether a subscriber to `network` (all: None) gets `event`.
pub fn wanted(event: &Event, network: Option<&str>) -> bool {
    match (network, &event.network) {
        (None, _) => true,
        (Some(_), None) => true,
        (Some(want), Some(got)) => want == got,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> InterfaceId {
        "4f0e5c2a-3d6b-4c1e-9a7f-1b2c3d4e5f60".parse().unwrap()
    }

    #[test]
    fn an_event_is_one_json_object_named_by_its_kind() {
        let e = Event {
            time_ms: 7,
            network: Some("shared".into()),
            what: What::Detached {
                interface_id: id(),
                name: None,
                tap: "lnt0".into(),
            },
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"time_ms": 7, "network": "shared", "event": "detached",
                "interface_id": "4f0e5c2a-3d6b-4c1e-9a7f-1b2c3d4e5f60", "tap": "lnt0"})
        );
        let back: Event = serde_json::from_value(serde_json::to_value(&e).unwrap()).unwrap();
        assert_eq!(back, e);
        let dropped = Event::now(None, What::Dropped { count: 3 });
        let v = serde_json::to_value(&dropped).unwrap();
        assert_eq!(
            (v["event"].as_str(), v["count"].as_u64()),
            (Some("dropped"), Some(3))
        );
        assert!(v.get("network").is_none());
    }

    #[test]
    fn a_slow_subscriber_misses_events_and_is_told_how_many() {
        let bus = Bus::default();
        let (_, mut slow) = bus.subscribe(false);
        for _ in 0..CAPACITY + 10 {
            bus.emit(Some("shared"), What::NetworkUp);
        }
        match slow.try_recv() {
            Err(broadcast::error::TryRecvError::Lagged(n)) => assert_eq!(n, 10),
            other => panic!("{other:?}"),
        }
        assert!(slow.try_recv().is_ok(), "then the events it still can have");
    }

    #[test]
    fn the_recent_events_are_kept_for_those_who_ask() {
        let bus = Bus::default();
        for i in 0..RECENT + 5 {
            bus.emit(Some(&format!("n{i}")), What::NetworkUp);
        }
        let (first, _) = bus.subscribe(true);
        assert_eq!(first.len(), RECENT);
        assert_eq!(first[0].network.as_deref(), Some("n5"));
        assert!(bus.subscribe(false).0.is_empty());
    }

    #[test]
    fn a_subscriber_to_one_network_gets_its_events_and_the_daemons() {
        let on = |n: Option<&str>| Event::now(n, What::NetworkUp);
        assert!(wanted(&on(Some("a")), Some("a")));
        assert!(!wanted(&on(Some("b")), Some("a")));
        assert!(wanted(&on(None), Some("a")));
        assert!(wanted(&on(Some("b")), None));
    }
}
