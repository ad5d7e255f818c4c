//! What the gate judges by: each VM whose connections are held (known by
//! its addresses), its policy's name rules, and the addresses it learned
//! from linnet's DNS for each name (its pins). A connection passes when
//! the name it shows is one a checked rule allows on its port, and its
//! destination is an address the VM learned for that very name: a CDN
//! address learned for an allowed name does not carry another name's
//! traffic, nor one allowed name's address another allowed name's.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hickory_proto::rr::Name;

use super::wire::GatedVm;
use crate::forward::Protocol;
use crate::learned::MAX_LEARNED;
use crate::names;
use crate::policy::{Destination, Policy};
use crate::types::InterfaceId;

/// Why a connection was refused, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The name it showed is not one its policy allows on that port.
    NotAllowed,
    /// Its destination is not an address the VM learned for the name.
    NotLearned,
    /// TLS without a server name, or HTTP without a Host.
    Nameless,
    /// Neither TLS nor HTTP/1.x.
    Neither,
    /// TLS or HTTP that breaks its format; why.
    Malformed(&'static str),
    /// It showed no name within the time the gate waits.
    TooSlow,
    /// The VM, or all VMs, hold as many connections as the gate keeps.
    TooMany,
    /// Its bytes are no TCP/IP the gate reads, or from no VM it knows.
    Unknown,
    /// The gate did not see it start (it started while no gate ran).
    Unseen,
}

impl Refusal {
    pub fn why(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "the name it showed is not allowed on this port",
            Refusal::NotLearned => {
                "its destination is not an address the VM learned from linnet's DNS for the name it showed"
            }
            Refusal::Nameless => {
                "it showed no name (TLS without a server name, HTTP without a Host)"
            }
            Refusal::Neither => {
                "it is neither TLS nor HTTP, so shows no name (a rule with /tcp/any allows such)"
            }
            Refusal::Malformed(why) => why,
            Refusal::TooSlow => "it showed no name in 5 s",
            Refusal::TooMany => "the VM holds as many unjudged connections as the gate keeps",
            Refusal::Unknown => "its packets are not a connection of a VM the gate knows",
            Refusal::Unseen => "the gate did not see it start (its SYN)",
        }
    }
}

struct Vm {
    interface_id: InterfaceId,
    policy: Policy,
    /// Name (as `names::shown` of its normalised form) → addresses, each
    /// until when.
    pins: HashMap<String, Vec<(IpAddr, Instant)>>,
    pinned: usize,
    /// A previous daemon's pins, by reach (`Control::Restored`): names
    /// unknown.
    restored: HashMap<usize, Vec<(IpAddr, Instant)>>,
}

/// The VMs, by address.
#[derive(Default)]
pub struct Vms {
    vms: Vec<Vm>,
    by_addr: HashMap<IpAddr, usize>,
}

/// A name as both DNS and the gate compare it.
pub fn compared(name: &str) -> Option<String> {
    let parsed = Name::from_ascii(name).ok()?;
    Some(names::shown(&names::normalise(&parsed)))
}

impl Vms {
    /// These are the VMs now; those that stay keep their pins.
    pub fn set(&mut self, vms: Vec<GatedVm>) {
        let mut old: HashMap<InterfaceId, Vm> =
            self.vms.drain(..).map(|vm| (vm.interface_id, vm)).collect();
        self.by_addr.clear();
        for spec in vms {
            let index = self.vms.len();
            for addr in &spec.addrs {
                self.by_addr.insert(*addr, index);
            }
            let (pins, pinned, restored) = match old.remove(&spec.interface_id) {
                // A new policy's reaches are numbered anew: what came
                // back by reach goes (the VM asks again).
                Some(vm) if vm.policy != spec.policy => (vm.pins, vm.pinned, HashMap::new()),
                Some(vm) => (vm.pins, vm.pinned, vm.restored),
                None => Default::default(),
            };
            self.vms.push(Vm {
                interface_id: spec.interface_id,
                policy: spec.policy,
                pins,
                pinned,
                restored,
            });
        }
    }

    /// The VM of `interface_id` learned `addrs` for `name`.
    pub fn learned(
        &mut self,
        interface_id: InterfaceId,
        name: &str,
        addrs: &[(IpAddr, u32)],
        now: Instant,
    ) {
        let Some(vm) = self
            .vms
            .iter_mut()
            .find(|vm| vm.interface_id == interface_id)
        else {
            return;
        };
        let Some(name) = compared(name) else {
            return;
        };
        if vm.pinned >= MAX_LEARNED {
            vm.expire(now);
        }
        let pins = vm.pins.entry(name).or_default();
        for &(addr, seconds) in addrs {
            let until = now + Duration::from_secs(seconds.into());
            match pins.iter_mut().find(|(a, _)| *a == addr) {
                Some(pin) => pin.1 = pin.1.max(until),
                // The daemon holds at most as many; so does the gate.
                None if vm.pinned < MAX_LEARNED => {
                    pins.push((addr, until));
                    vm.pinned += 1;
                }
                None => {}
            }
        }
    }

    /// A previous daemon's VM of `interface_id` had learned `addrs` for
    /// some name of reach `reach`.
    pub fn restored(
        &mut self,
        interface_id: InterfaceId,
        reach: usize,
        addrs: &[(IpAddr, u32)],
        now: Instant,
    ) {
        let Some(vm) = self
            .vms
            .iter_mut()
            .find(|vm| vm.interface_id == interface_id)
        else {
            return;
        };
        let pins = vm.restored.entry(reach).or_default();
        for &(addr, seconds) in addrs.iter().take(MAX_LEARNED.saturating_sub(pins.len())) {
            pins.push((addr, now + Duration::from_secs(seconds.into())));
        }
    }

    /// The VM whose address `source` is.
    pub fn of(&self, source: IpAddr) -> Option<VmRef> {
        self.by_addr.get(&source).map(|&index| VmRef(index))
    }

    pub fn interface_id(&self, vm: VmRef) -> InterfaceId {
        self.vms[vm.0].interface_id
    }

    /// Whether the VM may open this connection, showing `name`.
    pub fn judge(
        &self,
        vm: VmRef,
        destination: IpAddr,
        port: u16,
        name: &str,
        now: Instant,
    ) -> Result<(), Refusal> {
        let vm = &self.vms[vm.0];
        let Some(compared) = compared(name) else {
            return Err(Refusal::NotAllowed);
        };
        let Ok(parsed) = Name::from_ascii(&compared) else {
            return Err(Refusal::NotAllowed);
        };
        let parsed = names::normalise(&parsed);
        let allowed = vm.policy.egress.iter().any(|rule| {
            matches!(&rule.to, Destination::Name(p) if p.allows(&parsed))
                && rule.reach().allows(Protocol::Tcp, port)
        });
        if !allowed {
            return Err(Refusal::NotAllowed);
        }
        let live = |pins: &Vec<(IpAddr, Instant)>| {
            pins.iter()
                .any(|(a, until)| *a == destination && *until > now)
        };
        // Learned for this name; or, after a restart, read back from the
        // kernel for a reach whose rules allow it (names unknown there).
        let learned = vm.pins.get(&compared).is_some_and(live)
            || (vm.policy.reaches_of(&parsed).iter()).any(|k| vm.restored.get(k).is_some_and(live));
        if learned {
            Ok(())
        } else {
            Err(Refusal::NotLearned)
        }
    }

    /// Forgets the pins expired by `now`.
    pub fn expire(&mut self, now: Instant) {
        for vm in &mut self.vms {
            vm.expire(now);
        }
    }
}

impl Vm {
    fn expire(&mut self, now: Instant) {
        let live = |pins: &mut Vec<(IpAddr, Instant)>| {
            pins.retain(|(_, until)| *until > now);
            !pins.is_empty()
        };
        self.pins.retain(|_, pins| live(pins));
        self.restored.retain(|_, pins| live(pins));
        self.pinned = self.pins.values().map(Vec::len).sum();
    }
}

/// A VM of `Vms`, valid until its next `set`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmRef(usize);

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn vms(rules: &[&str]) -> (Vms, VmRef) {
        let mut vms = Vms::default();
        vms.set(vec![GatedVm {
            interface_id: InterfaceId::from_u128(1),
            addrs: vec![ip("10.0.0.2")],
            policy: Policy {
                egress: rules.iter().map(|r| r.parse().unwrap()).collect(),
                ..Default::default()
            },
        }]);
        let vm = vms.of(ip("10.0.0.2")).unwrap();
        (vms, vm)
    }

    #[test]
    fn a_name_passes_only_at_an_address_learned_for_it_on_its_port() {
        let (mut vms, vm) = vms(&["a.test:443", "*.b.test:443"]);
        let now = Instant::now();
        let id = InterfaceId::from_u128(1);
        vms.learned(id, "a.test", &[(ip("192.0.2.1"), 60)], now);
        vms.learned(id, "x.b.test", &[(ip("192.0.2.2"), 60)], now);
        assert_eq!(vms.judge(vm, ip("192.0.2.1"), 443, "A.Test.", now), Ok(()));
        assert_eq!(vms.judge(vm, ip("192.0.2.2"), 443, "x.b.test", now), Ok(()));
        assert_eq!(
            vms.judge(vm, ip("192.0.2.1"), 443, "other.test", now),
            Err(Refusal::NotAllowed),
            "another name at the same address"
        );
        assert_eq!(
            vms.judge(vm, ip("192.0.2.2"), 443, "a.test", now),
            Err(Refusal::NotLearned),
            "an allowed name at the other allowed name's address"
        );
        assert_eq!(
            vms.judge(vm, ip("192.0.2.1"), 80, "a.test", now),
            Err(Refusal::NotAllowed),
            "another port"
        );
        assert_eq!(
            vms.judge(
                vm,
                ip("192.0.2.1"),
                443,
                "a.test",
                now + Duration::from_secs(61)
            ),
            Err(Refusal::NotLearned),
            "expired"
        );
        assert!(vms.of(ip("10.0.0.3")).is_none());
    }

    #[test]
    fn after_a_restart_an_address_read_back_serves_the_names_of_its_reach_until_asked_again() {
        let (mut vms, vm) = vms(&["a.test:443", "*.b.test:443", "c.test:80"]);
        let now = Instant::now();
        let id = InterfaceId::from_u128(1);
        // Reach 0 is port 443's (both names), reach 1 port 80's.
        vms.restored(id, 0, &[(ip("192.0.2.1"), 60)], now);
        assert_eq!(vms.judge(vm, ip("192.0.2.1"), 443, "a.test", now), Ok(()));
        assert_eq!(vms.judge(vm, ip("192.0.2.1"), 443, "x.b.test", now), Ok(()));
        assert_eq!(
            vms.judge(vm, ip("192.0.2.1"), 443, "other.test", now),
            Err(Refusal::NotAllowed),
            "a name no rule allows, as ever"
        );
        assert_eq!(
            vms.judge(vm, ip("192.0.2.1"), 80, "c.test", now),
            Err(Refusal::NotLearned),
            "another reach's name"
        );
        assert_eq!(
            vms.judge(
                vm,
                ip("192.0.2.1"),
                443,
                "a.test",
                now + Duration::from_secs(61)
            ),
            Err(Refusal::NotLearned),
            "expired"
        );
    }

    #[test]
    fn a_vm_keeps_its_pins_across_a_new_list_and_loses_them_when_gone() {
        let (mut vms, _) = vms(&["a.test:443"]);
        let now = Instant::now();
        let id = InterfaceId::from_u128(1);
        vms.learned(id, "a.test", &[(ip("192.0.2.1"), 60)], now);
        let spec = GatedVm {
            interface_id: id,
            addrs: vec![ip("10.0.0.9")],
            policy: Policy {
                egress: vec!["a.test:443".parse().unwrap()],
                ..Default::default()
            },
        };
        vms.set(vec![spec.clone()]);
        let vm = vms.of(ip("10.0.0.9")).unwrap();
        assert_eq!(vms.judge(vm, ip("192.0.2.1"), 443, "a.test", now), Ok(()));
        vms.set(vec![]);
        vms.set(vec![spec]);
        let vm = vms.of(ip("10.0.0.9")).unwrap();
        assert_eq!(
            vms.judge(vm, ip("192.0.2.1"), 443, "a.test", now),
            Err(Refusal::NotLearned)
        );
    }
}
