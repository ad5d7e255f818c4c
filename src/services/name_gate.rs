//! The name gate between linnet's DNS and the firewall, for VMs whose
//! policy names DNS names. The daemon tells it which VMs those are (by
//! their addresses, which anti-spoofing keeps theirs) and their policies
//! (`follow`); the DNS forwarder asks it whether a VM may have a name
//! answered (`ask`) and, before it releases an allowed answer, has it put
//! the answer's addresses into the VM's sets (`learn`). The daemon
//! rebuilds the firewall from what it holds (`elements`), so a rebuild
//! between two answers loses nothing. One gate serves every network.
//! Each decision goes on record as a `name` event (`linnet events`, a
//! network's audit log), within a budget per VM: what it holds back is
//! counted in the next record that goes out.
//!
//! Everything here runs on the daemon's one thread, between awaits: a
//! rebuild and a `learn` never interleave.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hickory_proto::rr::Name;
use tracing::warn;

use super::unix_now;
use crate::budget::{RateLimit, Refusals};
use crate::events::{Bus, Reachable, What};
use crate::host::nft::NftError;
use crate::host::seam::LearnedSets;
use crate::learned::{Element, Learned, LearnedAddress, MAX_LEARNED, TtlBounds};
use crate::names;
use crate::policy::Policy;
use crate::types::InterfaceId;

/// Records of one VM's decisions at most in each window; the rest are
/// counted (`held_back`) in the next that goes out.
const RECORDS_PER_WINDOW: u32 = 100;
const RECORD_WINDOW: Duration = Duration::from_secs(10);

/// A VM with names in its policy, as the daemon describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedVm {
    pub network: String,
    pub interface_id: InterfaceId,
    /// The VM's name, for its records.
    pub name: Option<String>,
    /// Its TAP: the key of its sets.
    pub tap: String,
    /// The addresses its queries come from.
    pub addrs: Vec<IpAddr>,
    pub policy: Policy,
    pub bounds: TtlBounds,
}

/// Who else must know the named VMs and what they learn, before an
/// answer is released: the gate that checks each connection's name
/// (`daemon::gatekeeper`).
pub trait Pins: Send + Sync {
    /// These are the VMs with names in their policy now.
    fn vms(&self, vms: &[NamedVm]);
    /// The VM learned `addrs` (each for so many seconds) for `name`.
    fn learned(&self, interface_id: InterfaceId, name: &Name, addrs: &[(IpAddr, u32)]);
    /// A previous daemon's VM had learned `addrs` (each for so many
    /// seconds) for some name of its policy's reach `reach`: the kernel's
    /// sets keep no names.
    fn restored(&self, interface_id: InterfaceId, reach: usize, addrs: &[(IpAddr, u32)]);
}

/// What the DNS forwarder may do with a query.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The client has no names in its policy: its queries go upstream as
    /// ever.
    Open,
    /// Allowed: forward it, and `learn` what the answer gives the VM of
    /// this TAP.
    Allowed(String),
    /// Not a name the VM may reach: answer it REFUSED.
    Refused,
}

struct Vm {
    spec: NamedVm,
    learned: Learned,
    refused_queries: u64,
    /// When to log refusals: a VM cannot fill the log.
    logged: Refusals,
    /// Its records' budget, and what it held back.
    records: RateLimit<()>,
    held_back: u64,
}

impl Vm {
    /// Puts a decision on record, if this VM's budget allows.
    fn record(&mut self, events: &Bus, asked: &Name, allowed: bool, learned: Vec<Reachable>) {
        if self.records.allow(&(), Instant::now()).is_err() {
            self.held_back += 1;
            return;
        }
        let what = What::Name {
            interface_id: self.spec.interface_id,
            name: self.spec.name.clone(),
            asked: names::shown(&names::normalise(asked)),
            allowed,
            learned,
            held_back: std::mem::take(&mut self.held_back),
        };
        events.emit(Some(&self.spec.network), what);
    }
}

#[derive(Default)]
struct State {
    vms: BTreeMap<String, Vm>,
    by_client: HashMap<(String, IpAddr), String>,
    /// Found in the kernel at start, until the daemon's first `follow`
    /// says whose they are.
    found: Option<Vec<(String, Element)>>,
}

pub struct NameGate {
    sets: Arc<dyn LearnedSets>,
    events: Bus,
    state: Mutex<State>,
    pins: std::sync::RwLock<Vec<Arc<dyn Pins>>>,
}

impl NameGate {
    pub fn new(sets: Arc<dyn LearnedSets>, events: Bus) -> NameGate {
        NameGate {
            sets,
            events,
            state: Mutex::default(),
            pins: std::sync::RwLock::default(),
        }
    }

    /// Tells `pins` the VMs from now on, and what each learns (the gate,
    /// the secrets proxies).
    pub fn tell(&self, pins: Arc<dyn Pins>) {
        self.pins.write().expect("pins lock").push(pins);
    }

    fn pins(&self) -> Vec<Arc<dyn Pins>> {
        self.pins.read().expect("pins lock").clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("name gate lock")
    }

    /// Reads what a previous daemon's VMs had learned, from the kernel's
    /// sets: given back to those VMs at the first `follow`, until it
    /// expires.
    pub fn recover(&self) {
        match self.sets.read() {
            Ok(found) => self.state().found = Some(found),
            Err(e) => warn!(
                "cannot read the addresses VMs had learned by name ({e}): they learn them again at their next query"
            ),
        }
    }

    /// The VMs with names in their policy are now `vms`: those gone are
    /// forgotten, and each keeps of what it learned what its policy
    /// still allows.
    pub fn follow(&self, vms: Vec<NamedVm>) {
        for pins in self.pins() {
            pins.vms(&vms);
        }
        let now = unix_now();
        let mut state = self.state();
        let found = state.found.take().unwrap_or_default();
        let mut old = std::mem::take(&mut state.vms);
        state.by_client.clear();
        for spec in vms {
            let vm = match old.remove(&spec.tap) {
                Some(mut vm) => {
                    if vm.spec.policy != spec.policy {
                        vm.learned.follow(&spec.policy);
                    }
                    vm.spec = spec;
                    vm
                }
                None => {
                    let mut learned = Learned::default();
                    let reaches = spec.policy.learned_sets();
                    let mut restored: BTreeMap<usize, Vec<(IpAddr, u32)>> = BTreeMap::new();
                    for (_, e) in found
                        .iter()
                        .filter(|(tap, e)| *tap == spec.tap && e.reach < reaches)
                    {
                        learned.restore(*e, now);
                        restored
                            .entry(e.reach)
                            .or_default()
                            .push((e.addr, e.seconds));
                    }
                    for pins in self.pins() {
                        for (reach, addrs) in &restored {
                            pins.restored(spec.interface_id, *reach, addrs);
                        }
                    }
                    Vm {
                        spec,
                        learned,
                        refused_queries: 0,
                        logged: Refusals::default(),
                        records: RateLimit::new(RECORDS_PER_WINDOW, RECORD_WINDOW),
                        held_back: 0,
                    }
                }
            };
            for addr in &vm.spec.addrs {
                state
                    .by_client
                    .insert((vm.spec.network.clone(), *addr), vm.spec.tap.clone());
            }
            state.vms.insert(vm.spec.tap.clone(), vm);
        }
    }

    /// Whether `client` of `network` may have `name` answered.
    pub fn ask(&self, network: &str, client: IpAddr, name: &Name) -> Verdict {
        let mut state = self.state();
        let Some(tap) = state.by_client.get(&(network.to_string(), client)).cloned() else {
            return Verdict::Open;
        };
        let vm = state.vms.get_mut(&tap).expect("by_client names known VMs");
        if !vm.spec.policy.reaches_of(name).is_empty() {
            // On record once answered (`learn`), with what it gave.
            return Verdict::Allowed(tap);
        }
        vm.refused_queries += 1;
        vm.record(&self.events, name, false, Vec::new());
        if let Some(count) = vm.logged.one_more(Instant::now()) {
            warn!(network, tap, %client, name = %names::shown(name), refused = count, "DNS: refused a name the VM's policy does not allow (one line per VM every 10 s at most; `linnet ls` counts them all)");
        }
        Verdict::Refused
    }

    /// Learns the addresses of an allowed answer about `name` for the VM
    /// of `tap`, and puts them into its sets. Returns the TTL the answer
    /// may carry at most (the ceiling), so the VM's cache does not outlive
    /// the rule. An error: the answer must not be released.
    pub fn learn(
        &self,
        tap: &str,
        name: &Name,
        answers: &[(IpAddr, u32)],
    ) -> Result<u32, NftError> {
        let mut state = self.state();
        // Gone (detached) or no longer named since the query: nothing to learn.
        let Some(vm) = state.vms.get_mut(tap) else {
            return Ok(u32::MAX);
        };
        let bounds = vm.spec.bounds;
        let over = vm.learned.over_limit;
        let elements = (vm.learned).learn(&vm.spec.policy, name, answers, bounds, unix_now());
        let reachable: Vec<Reachable> = answers
            .iter()
            .map(|&(address, ttl)| Reachable {
                address,
                seconds: bounds.clamp(ttl),
            })
            .collect();
        let addrs: Vec<(IpAddr, u32)> = reachable.iter().map(|r| (r.address, r.seconds)).collect();
        for pins in self.pins() {
            pins.learned(vm.spec.interface_id, name, &addrs);
        }
        vm.record(&self.events, name, true, reachable);
        if vm.learned.over_limit > over
            && let Some(count) = vm.logged.one_more(Instant::now())
        {
            warn!(tap, name = %names::shown(name), refused = count, "DNS: the VM holds its most addresses learned by name ({MAX_LEARNED}); the answer's new ones are not reachable until others expire");
        }
        self.sets.put(tap, &elements)?;
        Ok(bounds.ceiling)
    }

    /// The elements of `tap`'s sets now, for the firewall's rebuild.
    pub fn elements(&self, tap: &str) -> Vec<Element> {
        let now = unix_now();
        let mut state = self.state();
        match state.vms.get_mut(tap) {
            Some(vm) => {
                vm.learned.expire(now);
                vm.learned.elements(now)
            }
            None => Vec::new(),
        }
    }

    /// What `tap`'s VM learned, for `linnet policy show`.
    pub fn shown(&self, tap: &str) -> Vec<LearnedAddress> {
        let state = self.state();
        (state.vms.get(tap))
            .map(|vm| vm.learned.shown(unix_now()))
            .unwrap_or_default()
    }

    /// The queries `tap`'s VM had refused, by TAP.
    pub fn refused_queries(&self) -> BTreeMap<String, u64> {
        let state = self.state();
        (state.vms.iter())
            .map(|(tap, vm)| (tap.clone(), vm.refused_queries))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;

    fn vm(tap: &str, addr: &str, rules: &[&str]) -> NamedVm {
        NamedVm {
            network: "shared".into(),
            interface_id: InterfaceId::from_u128(tap.len() as u128),
            name: Some(format!("vm-{tap}")),
            tap: tap.into(),
            addrs: vec![addr.parse().unwrap()],
            policy: Policy {
                egress: rules.iter().map(|r| r.parse().unwrap()).collect(),
                ingress: vec![],
                ..Default::default()
            },
            bounds: TtlBounds {
                floor: 5,
                ceiling: 60,
            },
        }
    }

    fn name(s: &str) -> Name {
        Name::from_utf8(s).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// What the gate's side (`Pins`) is told.
    #[derive(Default)]
    struct Told(Mutex<Vec<String>>);

    impl Pins for Told {
        fn vms(&self, vms: &[NamedVm]) {
            self.0.lock().unwrap().push(format!("vms {}", vms.len()));
        }
        fn learned(&self, _: InterfaceId, name: &Name, addrs: &[(IpAddr, u32)]) {
            self.0
                .lock()
                .unwrap()
                .push(format!("learned {name} {addrs:?}"));
        }
        fn restored(&self, _: InterfaceId, reach: usize, addrs: &[(IpAddr, u32)]) {
            self.0
                .lock()
                .unwrap()
                .push(format!("restored {reach} {addrs:?}"));
        }
    }

    #[test]
    fn the_gate_is_told_the_vms_what_they_learn_and_what_a_restart_read_back() {
        let host = FakeHost::new();
        let told = Arc::new(Told::default());
        let gate = NameGate::new(Arc::new(host.clone()), Bus::default());
        gate.tell(told.clone());
        gate.follow(vec![vm("lnt0", "10.0.0.2", &["a.test:443"])]);
        gate.learn("lnt0", &name("a.test"), &[(ip("192.0.2.1"), 30)])
            .unwrap();
        // A new daemon reads the kernel's sets back.
        let again = NameGate::new(Arc::new(host.clone()), Bus::default());
        let told_again = Arc::new(Told::default());
        again.tell(told_again.clone());
        again.recover();
        again.follow(vec![vm("lnt0", "10.0.0.2", &["a.test:443"])]);
        assert_eq!(
            *told.0.lock().unwrap(),
            vec!["vms 1", "learned a.test [(192.0.2.1, 30)]"]
        );
        let restored = told_again.0.lock().unwrap().clone();
        assert_eq!(restored.len(), 2, "{restored:?}");
        assert!(
            restored[1].starts_with("restored 0 [(192.0.2.1, "),
            "{restored:?}"
        );
    }

    #[test]
    fn only_named_vms_are_gated_and_only_for_their_names() {
        let host = FakeHost::new();
        let gate = NameGate::new(Arc::new(host.clone()), Bus::default());
        gate.follow(vec![vm("lnt0", "10.0.0.2", &["a.test:443"])]);
        assert_eq!(
            gate.ask("shared", ip("10.0.0.3"), &name("x.test")),
            Verdict::Open
        );
        assert_eq!(
            gate.ask("other", ip("10.0.0.2"), &name("x.test")),
            Verdict::Open
        );
        assert_eq!(
            gate.ask("shared", ip("10.0.0.2"), &name("A.test.")),
            Verdict::Allowed("lnt0".into())
        );
        assert_eq!(
            gate.ask("shared", ip("10.0.0.2"), &name("x.test")),
            Verdict::Refused
        );
        assert_eq!(gate.refused_queries()["lnt0"], 1);
    }

    #[test]
    fn every_decision_is_on_record_within_a_budget_per_vm() {
        let host = FakeHost::new();
        let bus = Bus::default();
        let (_, mut records) = bus.subscribe(false);
        let gate = NameGate::new(Arc::new(host.clone()), bus.clone());
        let agent = vm("lnt0", "10.0.0.2", &["a.test:443"]);
        let (id, vm_name) = (agent.interface_id, agent.name.clone());
        gate.follow(vec![agent]);
        assert_eq!(
            gate.ask("shared", ip("10.0.0.2"), &name("Evil.test.")),
            Verdict::Refused
        );
        gate.learn(
            "lnt0",
            &name("A.test"),
            &[(ip("192.0.2.1"), 3), (ip("192.0.2.2"), 600)],
        )
        .unwrap();
        let next = |records: &mut tokio::sync::broadcast::Receiver<crate::events::Event>| {
            records.try_recv().expect("a record")
        };
        let refused = next(&mut records);
        assert_eq!(refused.network.as_deref(), Some("shared"));
        assert_eq!(
            refused.what,
            What::Name {
                interface_id: id,
                name: vm_name.clone(),
                asked: "evil.test".into(),
                allowed: false,
                learned: vec![],
                held_back: 0,
            }
        );
        assert_eq!(
            next(&mut records).what,
            What::Name {
                interface_id: id,
                name: vm_name,
                asked: "a.test".into(),
                allowed: true,
                // As long as the VM may reach each: its TTL within 5..=60.
                learned: vec![
                    Reachable {
                        address: ip("192.0.2.1"),
                        seconds: 5
                    },
                    Reachable {
                        address: ip("192.0.2.2"),
                        seconds: 60
                    },
                ],
                held_back: 0,
            }
        );
        // A flood: the budget's worth on record, the rest counted.
        for _ in 0..RECORDS_PER_WINDOW + 50 {
            gate.ask("shared", ip("10.0.0.2"), &name("evil.test"));
        }
        let mut flood = 0;
        while records.try_recv().is_ok() {
            flood += 1;
        }
        assert_eq!(flood, RECORDS_PER_WINDOW - 2, "two went on record before");
        assert_eq!(gate.state().vms["lnt0"].held_back, 52);
        assert_eq!(
            gate.refused_queries()["lnt0"],
            u64::from(RECORDS_PER_WINDOW) + 51
        );
    }

    #[test]
    fn an_answer_is_in_the_sets_when_learn_returns_and_a_new_policy_drops_it() {
        let host = FakeHost::new();
        let gate = NameGate::new(Arc::new(host.clone()), Bus::default());
        gate.follow(vec![vm("lnt0", "10.0.0.2", &["a.test:443"])]);
        let ceiling = gate
            .learn("lnt0", &name("a.test"), &[(ip("192.0.2.1"), 3)])
            .unwrap();
        assert_eq!(ceiling, 60);
        let put = host.read().unwrap();
        assert_eq!(put.len(), 1);
        assert_eq!(
            (put[0].0.as_str(), put[0].1.addr, put[0].1.seconds),
            ("lnt0", ip("192.0.2.1"), 5)
        );
        assert_eq!(gate.elements("lnt0").len(), 1);
        assert_eq!(gate.shown("lnt0")[0].name.as_deref(), Some("a.test"));
        gate.follow(vec![vm("lnt0", "10.0.0.2", &["b.test:443"])]);
        assert!(
            gate.elements("lnt0").is_empty(),
            "a.test is no longer allowed"
        );
        gate.follow(vec![]);
        assert_eq!(
            gate.ask("shared", ip("10.0.0.2"), &name("x.test")),
            Verdict::Open
        );
    }

    #[test]
    fn what_a_previous_daemon_learned_comes_back_to_its_vm() {
        let host = FakeHost::new();
        LearnedSets::put(
            &host,
            "lnt0",
            &[Element {
                reach: 0,
                addr: ip("192.0.2.1"),
                seconds: 30,
            }],
        )
        .unwrap();
        let gate = NameGate::new(Arc::new(host.clone()), Bus::default());
        gate.recover();
        gate.follow(vec![vm("lnt0", "10.0.0.2", &["a.test:443"])]);
        let back = gate.elements("lnt0");
        assert_eq!(back.len(), 1);
        assert!(back[0].seconds <= 30 && back[0].seconds >= 29);
        assert_eq!(gate.shown("lnt0")[0].name, None);
    }
}
