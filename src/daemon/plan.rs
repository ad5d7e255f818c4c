//! An attach as plain data: `admit` decides whether the client may make
//! it at all; `plan` decides what the interface will be (its lease, MAC,
//! name, policy, whether it is guarded, its link settings) from the
//! request, the network and its leases, before the kernel is touched, down
//! to the kernel's steps (`Step`); `apply` carries them out, recording
//! each in `Done`, and on a failure undoes exactly what was done, newest
//! first. The decisions are unit-tested here without a kernel.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;

use super::errors::DaemonError;

use super::client::{Client, attach_refusal};
use super::guarding::port_guard;
use super::interface::Interface;
use super::policies::{check_ceiling, check_policy_possible, no_address_for_policy};
use crate::api::AttachRequest;
use crate::clone::Guest;
use crate::config::{Config, DEFAULT_NETWORK, Mode, NetworkConfig, Own};
use crate::datapath::Datapath;
use crate::host::clone_ns::CloneNetwork;
use crate::host::guard::PortGuard;
use crate::host::netlink::LinkSettings;
use crate::host::tap::MAX_QUEUES;
use crate::leases::{Claimant, LeaseChange, LeaseTable, TakenOver};
use crate::policy::Policy;
use crate::types::{self, InterfaceId, MacAddr};

/// What an interface will be.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct AttachPlan {
    pub id: InterfaceId,
    pub mac: MacAddr,
    /// None on a network without DHCP and without a static lease for it.
    pub ip: Option<Ipv4Addr>,
    pub name: Option<String>,
    pub datapath: Datapath,
    pub policy: Policy,
    /// Anti-spoofing or isolation: guard entries before the port joins
    /// its bridge, and before the VM has its fd.
    pub guarded: bool,
    pub mtu: u32,
    /// Its TAP's queues (`check_queues`).
    pub queues: u16,
    /// The kernel's part, in order (`apply`).
    pub steps: Vec<Step>,
    /// What taking its lease changed (undone if the attach fails).
    pub lease: LeaseChange,
}

/// A step of an attach in the kernel, which `apply` carries out. Steps
/// after the first use what the first made: the port, and a clone's
/// namespace.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    /// The VM's port as the network's driver makes it: a TAP (for a
    /// bridge), or a macvtap.
    Port,
    /// A clone's namespace, its TAP in there (the VMM's) and a veth port
    /// on the network.
    ClonePort(Box<CloneNetwork>),
    /// The socket of the guest's DHCP server, in the clone's namespace.
    CloneDhcp,
    /// The clone's namespace named at this path, where a VMM that opens
    /// its TAP by name runs.
    NameNamespace(PathBuf),
    /// The port's guard entries, before it joins its bridge and before
    /// the VM has its fd; a clone that holds its guest's address is held
    /// to it too (`guest`).
    Guard { guest: Option<Ipv4Addr> },
    /// The port's MTU, alias, place on its bridge and state
    /// (`AttachPlan::link`).
    Link,
    /// The VM's address and MAC in the bridge's neighbour table, which
    /// FRR advertises to the other hosts of a network across hosts.
    Advertise { ip: Ipv4Addr },
    /// The VMM's TAP made to outlive its fd, for `--datapath tap-name`:
    /// last, so that a failure before drops a TAP that goes with its fd.
    Persist,
    /// A clone that carries on as its guest announces the guest's address
    /// from its new MAC.
    Announce,
}

/// The steps of a port once made (by `made`'s steps): guarded (when the
/// network guards its ports) before it joins, set up, made persistent
/// for tap-name.
fn port_steps(
    mut steps: Vec<Step>,
    guarded: bool,
    guest: Option<Ipv4Addr>,
    datapath: Datapath,
) -> Vec<Step> {
    if guarded {
        steps.push(Step::Guard { guest });
    }
    steps.push(Step::Link);
    if datapath == Datapath::TapName {
        steps.push(Step::Persist);
    }
    steps
}

/// The interfaces attached now, by id.
pub(super) type Interfaces = BTreeMap<InterfaceId, Interface>;

/// Decides whether `client` may make this attach, before anything changes:
/// the network is known and allows the user, a network socket's relay
/// asks only for its VM's port, `keep` is for a TAP opened by name, the
/// name is free, the network's limits hold, the network can hold the
/// policy (`bridge_netfilter`: the host has br_netfilter) and it is no
/// more than the network enforces, and the id is not attached. Returns
/// the interface's id (the request's, or a new one).
/// Whether the attach may have the queues it asks for: more than one on a
/// TAP the VMM reads itself (by fd or by name), up to `tap::MAX_QUEUES`.
fn check_queues(cfg: &NetworkConfig, req: &AttachRequest) -> Result<(), DaemonError> {
    let queues = req.queues.unwrap_or(1);
    let why = if queues == 0 {
        Some(format!("a TAP has 1 to {MAX_QUEUES}"))
    } else if queues > MAX_QUEUES {
        Some(format!(
            "at most {MAX_QUEUES} (a VM has no use for more queues than vCPUs)"
        ))
    } else if queues == 1 {
        None
    } else if !matches!(req.datapath, None | Some(Datapath::Tap | Datapath::TapName)) {
        Some(format!(
            "multi-queue is for a TAP the VMM reads itself (--datapath tap or tap-name); with {} linnet relays one queue",
            req.datapath.map_or("tap".into(), |d| d.to_string())
        ))
    } else if cfg.mode() == Mode::Bridged {
        Some(format!(
            "network \"{}\" gives each VM a macvtap, which linnet opens with one queue",
            cfg.name
        ))
    } else if req.clone_of.is_some() {
        Some("a clone's TAP has one queue".into())
    } else {
        None
    };
    match why {
        Some(why) => Err(DaemonError::Queues { queues, why }),
        None => Ok(()),
    }
}

pub(super) fn admit(
    config: &Config,
    interfaces: &Interfaces,
    client: &Client,
    req: &AttachRequest,
    bridge_netfilter: bool,
) -> Result<InterfaceId, DaemonError> {
    let network = req.network.as_deref().unwrap_or(DEFAULT_NETWORK);
    let cfg = config
        .network(network)
        .ok_or_else(|| DaemonError::unknown_network(config, network))?;
    client.may_use(cfg)?;
    if let Some(bound) = &client.network_socket {
        let refuse = |why: &str| {
            Err(DaemonError::RelayRefused {
                network: bound.clone(),
                why: why.into(),
            })
        };
        if let Some(why) = attach_refusal(bound, req) {
            return refuse(&why);
        }
        if interfaces.values().any(|i| i.holder.is(client.id)) {
            return refuse("has attached its interface already");
        }
    } else if let Some(id) = req.interface_id
        && types::is_socket_interface_id(id)
    {
        return Err(DaemonError::SocketInterfaceId { id });
    }
    if req.keep && req.datapath != Some(Datapath::TapName) {
        return Err(DaemonError::KeepNeedsTapName);
    }
    check_queues(cfg, req)?;
    if let Some(name) = &req.name {
        types::validate_hostname(name)?;
        if let Some((holder, other)) = interfaces
            .iter()
            .find(|(_, i)| i.network == network && types::names_match(i.name.as_deref(), name))
        {
            return Err(DaemonError::NameHeld {
                network: network.into(),
                name: name.clone(),
                holder: *holder,
                uid: other.uid,
            });
        }
    }
    check_limits(cfg, interfaces, client)?;
    let policy = attach_policy(req.policy.as_ref(), cfg);
    check_policy_possible(&policy, cfg, bridge_netfilter)?;
    check_ceiling(&policy, cfg)?;
    let id = match (&client.network_socket, req.mac) {
        (Some(bound), Some(mac)) => types::socket_interface_id(bound, mac, client.uid),
        _ => req.interface_id.unwrap_or_else(InterfaceId::new_v4),
    };
    if let Some(other) = interfaces.get(&id) {
        return Err(DaemonError::Attached {
            id,
            network: other.network.clone(),
            pid: other.pid(),
        });
    }
    Ok(id)
}

/// Refuses an attach past the network's `max_interfaces` or
/// `max_interfaces_per_uid` (counted by account: a user's subordinate
/// uids are the user's).
fn check_limits(
    cfg: &NetworkConfig,
    interfaces: &Interfaces,
    client: &Client,
) -> Result<(), DaemonError> {
    let on_network = || interfaces.values().filter(|i| i.network == cfg.name);
    if let Some(max) = cfg.max_interfaces
        && on_network().count() >= max as usize
    {
        return Err(DaemonError::Limit {
            network: cfg.name.clone(),
            limit: max,
            per_uid: None,
        });
    }
    if let Some(max) = cfg.max_interfaces_per_uid
        && on_network().filter(|i| i.account == client.account).count() >= max as usize
    {
        return Err(DaemonError::Limit {
            network: cfg.name.clone(),
            limit: max,
            per_uid: Some(client.account),
        });
    }
    Ok(())
}

/// Decides an attach on a LAN network (`mode: bridged` or `bridge`): the
/// LAN's DHCP server gives the address, which linnet learns later, so
/// there is no lease; the MAC is the request's, or one that follows from
/// the interface id (a VM attached again under its id keeps its MAC, and
/// with it what the LAN's DHCP server gave it). Refused: the MAC is taken
/// on the network (`in_use`).
pub(super) fn plan_on_lan(
    cfg: &NetworkConfig,
    id: InterfaceId,
    req: &AttachRequest,
    mtu: u32,
    in_use: impl Fn(MacAddr) -> bool,
) -> Result<AttachPlan, DaemonError> {
    let mac = req.mac.unwrap_or_else(|| lan_mac(id));
    if mac.is_multicast() {
        return Err(DaemonError::MulticastMac { mac });
    }
    // A universally administered MAC is some vendor's NIC's: on a LAN,
    // maybe its router's or another host's, whose traffic the VM's port
    // would then receive (and whose lease it would be given).
    if mac.0[0] & 0x02 == 0 {
        return Err(DaemonError::VendorMac {
            network: cfg.name.clone(),
            mac,
        });
    }
    if in_use(mac) {
        return Err(DaemonError::MacTaken {
            network: cfg.name.clone(),
            mac,
        });
    }
    let datapath = req.datapath.unwrap_or_default();
    let policy = attach_policy(req.policy.as_ref(), cfg);
    Ok(AttachPlan {
        id,
        mac,
        ip: None,
        name: req.name.clone(),
        datapath,
        steps: port_steps(vec![Step::Port], has_guard(cfg, &policy), None, datapath),
        policy,
        guarded: guarded(cfg),
        mtu,
        queues: req.queues.unwrap_or(1),
        lease: LeaseChange::default(),
    })
}

/// Whether a network's ports get guard entries: for anti-spoofing, or
/// (on linnet's own networks) isolation.
pub(super) fn guarded(cfg: &NetworkConfig) -> bool {
    cfg.anti_spoofing || cfg.isolation()
}

/// Whether a port gets guard entries: its network's are guarded, or its
/// policy limits its rate (the limits are the guard tables').
fn has_guard(cfg: &NetworkConfig, policy: &Policy) -> bool {
    guarded(cfg) || !policy.rate_limit.is_none()
}

/// The policy an attach gets: the request's rules, or the network's when
/// it gives none (a request with rate limits alone keeps them); the
/// request's rate limit each way, or else the network's `rate_limit`.
pub(super) fn attach_policy(asked: Option<&Policy>, cfg: &NetworkConfig) -> Policy {
    let mut policy = match asked {
        Some(p) if !p.is_open() || !p.secrets.is_empty() || p.rate_limit.is_none() => {
            super::policies::with_network_secrets(p.clone(), cfg)
        }
        Some(p) => Policy {
            rate_limit: p.rate_limit,
            ..cfg.policy().clone()
        },
        None => cfg.policy().clone(),
    };
    policy.rate_limit = policy.rate_limit.or(cfg.rate_limit);
    policy
}

/// The MAC of a LAN network's VM that asked for none: stable per id.
pub(super) fn lan_mac(id: InterfaceId) -> MacAddr {
    let mut seed = b"linnet lan vm ".to_vec();
    seed.extend_from_slice(id.as_bytes());
    MacAddr::derived(&seed)
}

/// Decides an attach on `cfg`'s network and takes its lease in `leases`
/// (`Done::Lease` gives it back). Refused: the id or name is another
/// user's, the MAC another interface's, or a policy needs an address
/// linnet cannot know.
pub(super) fn plan(
    (cfg, own): (&NetworkConfig, &Own),
    leases: &mut LeaseTable,
    who: Claimant,
    id: InterfaceId,
    req: &AttachRequest,
    now: u64,
) -> Result<AttachPlan, DaemonError> {
    let policy = attach_policy(req.policy.as_ref(), cfg);
    // Without DHCP only a static lease gives an address linnet knows.
    let addressed = own.dhcp.enabled || leases.has_static(id, req.mac);
    if !addressed && !policy.is_open() {
        return Err(no_address_for_policy(&cfg.name));
    }
    let mut lease = LeaseChange::default();
    let (mac, ip) = if addressed {
        let taken = leases.attach_noting(who, id, req.mac, req.name.clone(), now, &mut lease)?;
        (taken.mac, Some(taken.ip))
    } else {
        leases.check_claim(who, id, req.name.as_deref(), now)?;
        (
            leases.attach_without_address(id, req.mac, now, &mut lease)?,
            None,
        )
    };
    let datapath = req.datapath.unwrap_or_default();
    let mut steps = port_steps(vec![Step::Port], has_guard(cfg, &policy), None, datapath);
    if let (Some(_), Some(ip)) = (&own.evpn, ip) {
        // Before making a TAP persistent, the last step that can fail.
        let at = (steps.iter().position(|s| *s == Step::Persist)).unwrap_or(steps.len());
        steps.insert(at, Step::Advertise { ip });
    }
    Ok(AttachPlan {
        id,
        mac,
        ip,
        name: req.name.clone(),
        datapath,
        policy,
        guarded: guarded(cfg),
        mtu: own.mtu,
        queues: req.queues.unwrap_or(1),
        steps,
        lease,
    })
}

/// Refuses a plan whose address a VM with another MAC holds on another
/// host (`elsewhere`: address to MAC, as FRR learned them). The same MAC
/// there is the same VM, moving here.
pub(super) fn check_elsewhere(
    network: &str,
    plan: &AttachPlan,
    addresses: &BTreeMap<Ipv4Addr, MacAddr>,
    macs: &BTreeMap<MacAddr, IpAddr>,
) -> Result<(), DaemonError> {
    if let Some(vtep) = macs.get(&plan.mac) {
        return Err(DaemonError::MacElsewhere {
            network: network.into(),
            mac: plan.mac,
            vtep: *vtep,
        });
    }
    match plan.ip.and_then(|ip| Some((ip, *addresses.get(&ip)?))) {
        Some((ip, other)) if other != plan.mac => Err(DaemonError::AddressElsewhere {
            network: network.into(),
            ip,
            mac: plan.mac,
            other,
        }),
        _ => Ok(()),
    }
}

/// A clone as decided (`requests::clone`): the guest it is, its unique
/// address in `subnet`, and whether it carries on as the guest (it took
/// over the stopped VM's lease, and so holds the guest's address).
pub(super) struct CloneDecision {
    pub guest: Guest,
    pub unique: Ipv4Addr,
    pub subnet: Ipv4Net,
    pub holds_guest_address: bool,
}

/// Decides a clone's attach: its port on the network is its namespace's
/// uplink, with the uplink's MAC and the clone's unique address; it takes
/// no lease; the rest is as for any interface. A VMM that opens its TAP
/// by name finds its namespace named under `namespaces`.
pub(super) fn plan_clone(
    (cfg, own): (&NetworkConfig, &Own),
    id: InterfaceId,
    req: &AttachRequest,
    clone: &CloneDecision,
    namespaces: &Path,
) -> AttachPlan {
    let datapath = req.datapath.unwrap_or_default();
    let mac = crate::clone::uplink_mac(id);
    let spec = CloneNetwork {
        guest_mac: clone.guest.mac,
        guest_ip: clone.guest.ip,
        unique: clone.unique,
        clone_subnet: clone.subnet,
        gateway: own.gateway,
        mtu: own.mtu,
        tap: clone.guest.tap_name().into(),
        tap_mac: crate::clone::tap_mac(id),
        uplink_mac: mac,
        holds_guest_address: clone.holds_guest_address,
    };
    let mut made = vec![Step::ClonePort(Box::new(spec)), Step::CloneDhcp];
    if datapath == Datapath::TapName {
        made.push(Step::NameNamespace(namespaces.join(id.to_string())));
    }
    let guest = Some(clone.guest.ip).filter(|_| clone.holds_guest_address);
    let policy = attach_policy(req.policy.as_ref(), cfg);
    let mut steps = port_steps(made, has_guard(cfg, &policy), guest, datapath);
    if clone.holds_guest_address {
        steps.push(Step::Announce);
    }
    AttachPlan {
        id,
        mac,
        ip: Some(clone.unique),
        name: req.name.clone(),
        datapath,
        policy,
        guarded: guarded(cfg),
        mtu: own.mtu,
        queues: 1,
        steps,
        lease: LeaseChange::default(),
    }
}

impl AttachPlan {
    /// The port's guard entries, once its TAP has a name.
    pub fn guard(&self, cfg: &NetworkConfig, tap: &str) -> PortGuard {
        port_guard(cfg, tap, (self.mac, self.ip), &self.policy)
    }

    /// The port's link settings: on `bridge` (if its network has one) and
    /// up, unless guarded ports are held (linnet's tables damaged), when a
    /// new one waits with them: off its bridge, or a macvtap down.
    pub fn link<'a>(
        &self,
        bridge: Option<u32>,
        ports_held: bool,
        alias: &'a str,
    ) -> LinkSettings<'a> {
        LinkSettings {
            master: bridge.filter(|_| !(self.guarded && ports_held)),
            mtu: Some(self.mtu),
            txqueuelen: None,
            alias: Some(alias),
            up: bridge.is_some() || !(self.guarded && ports_held),
        }
    }
}

/// A step of an attach that was carried out, and so is undone if a later
/// one fails.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Done {
    /// The lease was taken (undo: the lease table as it was before).
    Lease(LeaseChange),
    /// The port (its link index) was made (undo: a TAP goes with its fd,
    /// as making it persistent for tap-name is the last step that can
    /// fail; a macvtap is deleted).
    Port(u32),
    /// A clone's namespace and veth port were made (undo: delete the
    /// port, its other end with it; the namespace goes with its fd).
    ClonePort(u32),
    /// A clone took over its stopped VM's lease (undo: give it back).
    TookOver(TakenOver),
    /// The port's guard entries were added (undo: remove them).
    Guard(PortGuard),
    /// The VM's address went into the network's neighbour table (undo:
    /// take it out).
    Advertised(MacAddr, Ipv4Addr),
    /// A clone's namespace was given this name (undo: take it away).
    Mount(std::path::PathBuf),
}

/// The order in which the steps done are undone: newest first.
pub(super) fn undo_order(done: Vec<Done>) -> impl Iterator<Item = Done> {
    done.into_iter().rev()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::leases::LeaseError;
    use crate::rate::RateLimits;

    fn network(yaml: &str) -> NetworkConfig {
        network_named(yaml, "shared")
    }

    fn network_named(yaml: &str, name: &str) -> NetworkConfig {
        Config::from_yaml(yaml, "t.yaml")
            .unwrap()
            .network(name)
            .unwrap()
            .clone()
    }

    fn id(n: u8) -> InterfaceId {
        InterfaceId::from_bytes([n; 16])
    }

    /// `yaml`'s `shared` network, and a plan for root's interface 1 on it.
    fn planned(yaml: &str) -> (NetworkConfig, LeaseTable, AttachPlan) {
        let cfg = network(yaml);
        let mut leases = LeaseTable::new(&cfg.name, cfg.own().unwrap());
        let plan = plan(
            (&cfg, cfg.own().unwrap()),
            &mut leases,
            0.into(),
            id(1),
            &request(None),
            0,
        )
        .unwrap();
        (cfg, leases, plan)
    }

    fn request(name: Option<&str>) -> AttachRequest {
        AttachRequest {
            name: name.map(String::from),
            ..AttachRequest::default()
        }
    }

    #[test]
    fn a_plan_takes_a_lease_and_says_what_the_interface_will_be() {
        let cfg = network("");
        let mut leases = LeaseTable::new(&cfg.name, cfg.own().unwrap());
        let web = |leases: &mut LeaseTable, now| {
            plan(
                (&cfg, cfg.own().unwrap()),
                leases,
                1000.into(),
                id(1),
                &request(Some("web")),
                now,
            )
            .unwrap()
        };
        let plan = web(&mut leases, 0);
        assert_eq!(plan.ip, Some("192.168.105.2".parse().unwrap()));
        assert_eq!(
            (plan.name.as_deref(), plan.datapath),
            (Some("web"), Datapath::Tap)
        );
        assert!(plan.guarded, "anti-spoofing is on by default");
        assert_eq!(plan.mtu, 1500);
        // The same id gets the same MAC and address again.
        leases.detach(id(1), 1);
        let again = web(&mut leases, 2);
        assert_eq!((again.mac, again.ip), (plan.mac, plan.ip));
        // Another user's VM cannot take its name while it is attached.
        let taken = super::plan(
            (&cfg, cfg.own().unwrap()),
            &mut leases,
            1001.into(),
            id(2),
            &request(Some("WEB")),
            3,
        );
        assert!(
            matches!(taken, Err(DaemonError::Lease(LeaseError::NameTaken { .. }))),
            "{taken:?}"
        );
    }

    #[test]
    fn a_network_without_dhcp_plans_no_address_and_refuses_a_policy_it_cannot_hold() {
        let (cfg, mut leases, open) = planned("networks:\n  shared:\n    dhcp: false\n");
        assert_eq!(open.ip, None);
        let mut policed = request(None);
        policed.policy = Some(Policy {
            egress: vec!["10.0.0.0/8".parse().unwrap()],
            ingress: vec![],
            ..Default::default()
        });
        let refused = plan(
            (&cfg, cfg.own().unwrap()),
            &mut leases,
            0.into(),
            id(2),
            &policed,
            0,
        )
        .unwrap_err();
        assert!(
            matches!(&refused, DaemonError::PolicyImpossible { network, .. } if network == "shared"),
            "{refused:?}"
        );
        assert!(refused.to_string().contains("has DHCP off"), "{refused}");
    }

    #[test]
    fn guard_entries_and_link_settings_follow_the_plan() {
        let (cfg, _, plan) = planned("networks:\n  shared:\n    isolation: true\n");
        let guard = plan.guard(&cfg, "lnt7");
        assert_eq!(
            (guard.tap.as_str(), guard.mac, guard.isolated),
            ("lnt7", plan.mac, true)
        );
        let on = plan.link(Some(42), false, "alias");
        assert_eq!((on.master, on.mtu, on.up), (Some(42), Some(1500), true));
        assert_eq!(plan.link(None, false, "alias").master, None, "a macvtap");
        assert!(plan.link(None, false, "alias").up);
        assert!(
            !plan.link(None, true, "alias").up,
            "a held macvtap stays down"
        );
        assert_eq!(
            plan.link(Some(42), true, "alias").master,
            None,
            "held off its bridge"
        );
        let (_, _, unguarded) = planned(
            "networks:
  shared:
    anti_spoofing: false
",
        );
        assert!(!unguarded.guarded);
        assert_eq!(
            unguarded.link(Some(42), true, "a").master,
            Some(42),
            "only guarded ports wait"
        );
    }

    #[test]
    fn a_lan_plan_has_no_lease_and_a_mac_that_follows_from_the_id() {
        let cfg = network_named(
            "networks:\n  lan:\n    mode: bridged\n    uplink: eth0\n",
            "lan",
        );
        let free = |_| false;
        let plan = plan_on_lan(&cfg, id(1), &request(Some("web")), 9000, free).unwrap();
        assert_eq!((plan.ip, plan.mtu, plan.guarded), (None, 9000, true));
        assert_eq!(plan.mac, lan_mac(id(1)));
        assert_eq!(
            plan_on_lan(&cfg, id(1), &request(None), 1500, free)
                .unwrap()
                .mac,
            plan.mac,
            "the same id, the same MAC"
        );
        assert_ne!(lan_mac(id(2)), plan.mac);
        let mut chosen = request(None);
        chosen.mac = Some("00:11:22:33:44:55".parse().unwrap());
        let vendors = plan_on_lan(&cfg, id(3), &chosen, 1500, free);
        assert!(
            matches!(&vendors, Err(DaemonError::VendorMac { mac, .. }) if Some(*mac) == chosen.mac),
            "{vendors:?}"
        );
        chosen.mac = Some("52:54:00:00:00:07".parse().unwrap());
        let taken = plan_on_lan(&cfg, id(3), &chosen, 1500, |m| m == chosen.mac.unwrap());
        assert!(
            matches!(&taken, Err(DaemonError::MacTaken { mac, .. }) if Some(*mac) == chosen.mac),
            "{taken:?}"
        );
    }

    fn clone_of(holds_guest_address: bool) -> CloneDecision {
        CloneDecision {
            guest: Guest {
                mac: "52:54:00:00:00:09".parse().unwrap(),
                ip: "10.0.2.9".parse().unwrap(),
                tap: Some("vm-tap".into()),
            },
            unique: "198.18.105.7".parse().unwrap(),
            subnet: "198.18.105.0/24".parse().unwrap(),
            holds_guest_address,
        }
    }

    #[test]
    fn a_clones_plan_is_its_uplink_at_its_unique_address_with_no_lease() {
        let cfg = network("networks:\n  shared:\n    isolation: true\n    mtu: 9000\n");
        let clone = clone_of(false);
        let at = Path::new("/run/linnet/netns");
        let plan = plan_clone(
            (&cfg, cfg.own().unwrap()),
            id(4),
            &request(Some("web-1")),
            &clone,
            at,
        );
        assert_eq!(
            (plan.mac, plan.ip, plan.name.as_deref()),
            (
                crate::clone::uplink_mac(id(4)),
                Some(clone.unique),
                Some("web-1")
            )
        );
        assert_eq!((plan.guarded, plan.mtu), (true, 9000));
        let Step::ClonePort(spec) = &plan.steps[0] else {
            panic!("a clone's port first: {:?}", plan.steps);
        };
        assert_eq!(
            (
                spec.tap.as_str(),
                spec.guest_ip,
                spec.unique,
                spec.uplink_mac,
                spec.mtu
            ),
            ("vm-tap", clone.guest.ip, clone.unique, plan.mac, 9000)
        );
        assert_eq!(
            plan.steps[1..],
            [Step::CloneDhcp, Step::Guard { guest: None }, Step::Link]
        );
    }

    #[test]
    fn a_clone_that_carries_on_as_its_guest_is_guarded_to_its_address_and_announces_it() {
        let cfg = network("networks:\n  shared:\n    isolation: true\n");
        let mut req = request(None);
        req.datapath = Some(Datapath::TapName);
        let clone = clone_of(true);
        let at = Path::new("/run/linnet/netns");
        let plan = plan_clone((&cfg, cfg.own().unwrap()), id(4), &req, &clone, at);
        let named = at.join(id(4).to_string());
        assert_eq!(
            plan.steps[1..],
            [
                Step::CloneDhcp,
                Step::NameNamespace(named),
                Step::Guard {
                    guest: Some(clone.guest.ip)
                },
                Step::Link,
                Step::Persist,
                Step::Announce,
            ]
        );
    }

    #[test]
    fn an_attach_takes_the_networks_rules_and_rate_where_it_gives_none() {
        let cfg = network(
            "networks:\n  shared:\n    rate_limit: { in: 50mbit }\n    policy: { egress: ['10.0.0.0/8'] }\n",
        );
        let rate = |t: &str| Some(t.parse().unwrap());
        let none = attach_policy(None, &cfg);
        assert_eq!(none.egress, cfg.policy().egress);
        assert_eq!(
            (none.rate_limit.received, none.rate_limit.sent),
            (rate("50mbit"), None)
        );
        // A rate alone keeps the network's rules; the network's fills the
        // way it leaves out.
        let asked = Policy {
            rate_limit: RateLimits {
                received: None,
                sent: rate("5mbit"),
            },
            ..Policy::default()
        };
        let got = attach_policy(Some(&asked), &cfg);
        assert_eq!(got.egress, cfg.policy().egress);
        assert_eq!(
            (got.rate_limit.received, got.rate_limit.sent),
            (rate("50mbit"), rate("5mbit"))
        );
        // Rules of its own replace the network's.
        let own = Policy {
            ingress: vec!["22/tcp".parse().unwrap()],
            ..Policy::default()
        };
        let got = attach_policy(Some(&own), &cfg);
        assert!(got.egress.is_empty() && got.ingress.len() == 1);
        // A port with a rate is guarded even where its network guards none.
        let (open_cfg, mut leases, _) = planned("networks:\n  shared:\n    anti_spoofing: false\n");
        let mut req = request(None);
        req.policy = Some(asked);
        let limited = plan(
            (&open_cfg, open_cfg.own().unwrap()),
            &mut leases,
            0.into(),
            id(2),
            &req,
            0,
        )
        .unwrap();
        assert!(!limited.guarded, "its link is never held");
        assert_eq!(
            limited.steps,
            [Step::Port, Step::Guard { guest: None }, Step::Link]
        );
    }

    #[test]
    fn a_port_is_made_then_guarded_before_it_joins_then_made_persistent_last() {
        let (_, _, open) = planned("networks:\n  shared:\n    anti_spoofing: false\n");
        assert_eq!(open.steps, [Step::Port, Step::Link]);
        let yaml = "networks:\n  shared:\n    anti_spoofing: true\n";
        let cfg = network(yaml);
        let mut leases = LeaseTable::new(&cfg.name, cfg.own().unwrap());
        let mut req = request(None);
        req.datapath = Some(Datapath::TapName);
        let own = cfg.own().unwrap();
        let guarded = plan((&cfg, own), &mut leases, 0.into(), id(1), &req, 0).unwrap();
        assert_eq!(
            guarded.steps,
            [
                Step::Port,
                Step::Guard { guest: None },
                Step::Link,
                Step::Persist
            ]
        );
        let lan = network_named(
            "networks:\n  lan:\n    mode: bridge\n    bridge: br0\n",
            "lan",
        );
        let on_lan = plan_on_lan(&lan, id(2), &request(None), 1500, |_| false).unwrap();
        // A LAN's ports are guarded unless it says otherwise.
        assert_eq!(
            on_lan.steps,
            [Step::Port, Step::Guard { guest: None }, Step::Link]
        );
    }

    /// Across hosts, the VM's address is advertised once its port is on
    /// the bridge, and before a TAP is made persistent; an address another
    /// host's VM holds with another MAC is refused, with the same MAC not.
    #[test]
    fn across_hosts_the_address_is_advertised_after_the_link_and_one_held_elsewhere_refused() {
        let yaml = "networks:\n  shared:\n    subnet: 10.77.0.0/24\n    evpn: { vni: 7700, vtep: 192.0.2.11, asn: 65000, peers: [192.0.2.12] }\n";
        let cfg = network(yaml);
        let mut leases = LeaseTable::new(&cfg.name, cfg.own().unwrap());
        let mut req = request(None);
        req.datapath = Some(Datapath::TapName);
        let plan = plan(
            (&cfg, cfg.own().unwrap()),
            &mut leases,
            0.into(),
            id(1),
            &req,
            0,
        )
        .unwrap();
        let ip = plan.ip.expect("an address");
        assert_eq!(
            plan.steps,
            [
                Step::Port,
                Step::Guard { guest: None },
                Step::Link,
                Step::Advertise { ip },
                Step::Persist
            ]
        );
        let other: MacAddr = "02:99:00:00:00:01".parse().unwrap();
        let no_macs = BTreeMap::new();
        let held = BTreeMap::from([(ip, other)]);
        let refused = check_elsewhere("shared", &plan, &held, &no_macs).unwrap_err();
        assert!(matches!(refused, DaemonError::AddressElsewhere { other: o, .. } if o == other));
        let moving = BTreeMap::from([(ip, plan.mac)]);
        assert!(check_elsewhere("shared", &plan, &moving, &no_macs).is_ok());
        assert!(check_elsewhere("shared", &plan, &BTreeMap::new(), &no_macs).is_ok());
        // Its MAC behind another host's VTEP: refused, naming the VTEP,
        // whatever the addresses say.
        let vtep: IpAddr = "192.0.2.2".parse().unwrap();
        let behind = BTreeMap::from([(plan.mac, vtep)]);
        let refused = check_elsewhere("shared", &plan, &BTreeMap::new(), &behind).unwrap_err();
        assert!(matches!(refused, DaemonError::MacElsewhere { vtep: v, .. } if v == vtep));
        assert!(
            refused.to_string().contains("behind VTEP 192.0.2.2"),
            "{refused}"
        );
        let others = BTreeMap::from([(other, vtep)]);
        assert!(check_elsewhere("shared", &plan, &BTreeMap::new(), &others).is_ok());
    }

    #[test]
    fn steps_are_undone_newest_first() {
        let (cfg, _, plan) = planned("");
        let guard = plan.guard(&cfg, "lnt0");
        let undone: Vec<Done> = undo_order(vec![
            Done::Lease(plan.lease.clone()),
            Done::Port(7),
            Done::Guard(guard.clone()),
        ])
        .collect();
        assert_eq!(
            undone,
            vec![Done::Guard(guard), Done::Port(7), Done::Lease(plan.lease)]
        );
    }

    /// An interface of `uid` attached to `network` as `name`.
    fn attached(network: &str, uid: u32, name: Option<&str>, connection: u64) -> Interface {
        Interface {
            network: network.into(),
            mac: MacAddr([0x52, 0x54, 0, 0, 0, connection as u8]),
            ip: None,
            name: name.map(String::from),
            tap: format!("lnt{connection}"),
            tap_index: connection as u32,
            cut_off: None,
            holder: crate::daemon::holder::Holder::Client {
                connection,
                process: None,
            },
            uid,
            account: uid,
            datapath: Datapath::Tap,
            relay: None,
            forwards: Vec::new(),
            guarded: true,
            policy: Policy::default(),
            as_clone: None,
            token: String::new(),
            port_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            formed6: Vec::new(),
        }
    }

    fn client(uid: u32, connection: u64) -> Client {
        Client {
            id: connection,
            pid: Some(4242),
            uid,
            gid: uid,
            account: uid,
            groups: vec![uid],
            process: None,
            network_socket: None,
        }
    }

    const USERS: &str = "networks:
  shared:
    allow: { users: [root, '1000', '1001'] }
    max_interfaces: 3
    max_interfaces_per_uid: 2
  lan:
    mode: bridged
    uplink: eth0
";

    fn admitted(
        interfaces: &Interfaces,
        who: &Client,
        req: &AttachRequest,
    ) -> Result<InterfaceId, DaemonError> {
        admit(
            &Config::from_yaml(USERS, "t.yaml").unwrap(),
            interfaces,
            who,
            req,
            true,
        )
    }

    #[test]
    fn admit_refuses_an_unknown_network_and_a_user_it_does_not_allow() {
        let none = Interfaces::new();
        let elsewhere = AttachRequest {
            network: Some("nope".into()),
            ..request(None)
        };
        match admitted(&none, &client(0, 1), &elsewhere) {
            Err(DaemonError::UnknownNetwork { name, known, file }) => {
                assert_eq!(name, "nope");
                assert!(file.ends_with("networks.yaml"), "where to add it: {file}");
                assert!(known.contains("shared") && known.contains("lan"), "{known}");
            }
            other => panic!("{other:?}"),
        }
        let refused = admitted(&none, &client(2000, 1), &request(None));
        assert!(
            matches!(&refused, Err(DaemonError::NotAllowed { uid: 2000, network, .. }) if network == "shared"),
            "{refused:?}"
        );
        assert!(admitted(&none, &client(1000, 1), &request(None)).is_ok());
    }

    #[test]
    fn admit_gives_the_requests_id_or_a_new_one_and_refuses_an_attached_one() {
        let mut interfaces = Interfaces::new();
        let asked = AttachRequest {
            interface_id: Some(id(1)),
            ..request(None)
        };
        assert_eq!(
            admitted(&interfaces, &client(1000, 1), &asked).unwrap(),
            id(1)
        );
        let fresh = admitted(&interfaces, &client(1000, 1), &request(None)).unwrap();
        assert_ne!(fresh, id(1));
        interfaces.insert(id(1), attached("shared", 1000, None, 7));
        let refused = admitted(&interfaces, &client(1001, 2), &asked);
        assert!(
            matches!(&refused, Err(DaemonError::Attached { id: held, network, .. }) if *held == id(1) && network == "shared"),
            "{refused:?}"
        );
    }

    #[test]
    fn a_held_name_is_refused_naming_its_holder_and_their_uid() {
        let mut interfaces = Interfaces::new();
        interfaces.insert(id(1), attached("shared", 1000, Some("web"), 7));
        let refused = admitted(&interfaces, &client(1001, 2), &request(Some("WEB")));
        assert!(
            matches!(&refused, Err(DaemonError::NameHeld { holder, uid: 1000, name, .. }) if *holder == id(1) && name == "WEB"),
            "{refused:?}"
        );
        // The same name on another network is another name.
        let lan = AttachRequest {
            network: Some("lan".into()),
            ..request(Some("web"))
        };
        assert!(admitted(&interfaces, &client(0, 3), &lan).is_ok());
        let bad = admitted(&interfaces, &client(1001, 2), &request(Some("no spaces")));
        assert!(matches!(bad, Err(DaemonError::BadName(_))), "{bad:?}");
    }

    #[test]
    fn the_networks_limits_hold_per_network_and_per_user() {
        let mut interfaces = Interfaces::new();
        interfaces.insert(id(1), attached("shared", 1000, None, 1));
        interfaces.insert(id(2), attached("shared", 1000, None, 2));
        let per_uid = admitted(&interfaces, &client(1000, 3), &request(None));
        assert!(
            matches!(
                per_uid,
                Err(DaemonError::Limit {
                    limit: 2,
                    per_uid: Some(1000),
                    ..
                })
            ),
            "{per_uid:?}"
        );
        assert!(admitted(&interfaces, &client(1001, 3), &request(None)).is_ok());
        interfaces.insert(id(3), attached("shared", 1001, None, 3));
        let full = admitted(&interfaces, &client(1001, 4), &request(None));
        assert!(
            matches!(
                full,
                Err(DaemonError::Limit {
                    limit: 3,
                    per_uid: None,
                    ..
                })
            ),
            "{full:?}"
        );
    }

    #[test]
    fn a_users_subordinate_uids_share_its_limit_and_are_allowed_only_as_its_account() {
        // uid 1000's subordinate uids 200000 and 200001 (host::accounts
        // charges them to 1000).
        let sub = |uid, connection| Client {
            account: 1000,
            ..client(uid, connection)
        };
        let mut interfaces = Interfaces::new();
        let mut one = attached("shared", 200000, None, 1);
        one.account = 1000;
        interfaces.insert(id(1), one);
        assert!(admitted(&interfaces, &sub(200001, 2), &request(None)).is_ok());
        let mut two = attached("shared", 200001, None, 2);
        two.account = 1000;
        interfaces.insert(id(2), two);
        let refused = admitted(&interfaces, &sub(200002, 3), &request(None));
        assert!(
            matches!(
                refused,
                Err(DaemonError::Limit {
                    limit: 2,
                    per_uid: Some(1000),
                    ..
                })
            ),
            "a third uid of the same user: {refused:?}"
        );
        assert!(
            admitted(&interfaces, &client(1000, 3), &request(None)).is_err(),
            "and the user itself"
        );
        // A uid that is no account, whatever groups its process carries,
        // is allowed by nothing (groups come from the group database).
        let stray = Client {
            groups: vec![],
            ..client(300000, 4)
        };
        assert!(matches!(
            admitted(&Interfaces::new(), &stray, &request(None)),
            Err(DaemonError::NotAllowed { uid: 300000, .. })
        ));
    }

    #[test]
    fn more_than_one_queue_is_for_a_tap_the_vmm_reads_on_a_bridge() {
        let none = Interfaces::new();
        let queues = |n: u16, datapath: Datapath, network: &str| {
            let req = AttachRequest {
                queues: Some(n),
                datapath: Some(datapath),
                network: Some(network.into()),
                ..request(None)
            };
            match admitted(&none, &client(0, 1), &req) {
                Ok(_) => None,
                Err(DaemonError::Queues { queues, why }) => {
                    assert_eq!(queues, n);
                    Some(why)
                }
                Err(e) => panic!("{e:?}"),
            }
        };
        for datapath in [Datapath::Tap, Datapath::TapName] {
            assert_eq!(queues(1, datapath, "shared"), None);
            assert_eq!(queues(MAX_QUEUES, datapath, "shared"), None);
        }
        assert!(queues(0, Datapath::Tap, "shared").is_some());
        assert!(queues(MAX_QUEUES + 1, Datapath::Tap, "shared").is_some());
        for relayed in [Datapath::Dgram, Datapath::Stream, Datapath::VhostUser] {
            let why = queues(2, relayed, "shared").expect("refused");
            assert!(why.contains("linnet relays one queue"), "{why}");
            assert_eq!(queues(1, relayed, "shared"), None);
        }
        let why = queues(2, Datapath::Tap, "lan").expect("refused on a macvtap");
        assert!(why.contains("macvtap"), "{why}");
    }

    #[test]
    fn keep_is_for_a_tap_opened_by_name_and_a_lan_holds_no_policy() {
        let none = Interfaces::new();
        let kept = AttachRequest {
            keep: true,
            ..request(None)
        };
        assert!(matches!(
            admitted(&none, &client(1000, 1), &kept),
            Err(DaemonError::KeepNeedsTapName)
        ));
        let by_name = AttachRequest {
            datapath: Some(Datapath::TapName),
            ..kept
        };
        assert!(admitted(&none, &client(1000, 1), &by_name).is_ok());
        let policed = AttachRequest {
            network: Some("lan".into()),
            policy: Some(Policy {
                egress: vec!["10.0.0.0/8".parse().unwrap()],
                ingress: vec![],
                ..Default::default()
            }),
            ..request(None)
        };
        let refused = admitted(&none, &client(0, 1), &policed);
        assert!(
            matches!(&refused, Err(DaemonError::PolicyImpossible { network, why }) if network == "lan" && why.contains("on a LAN")),
            "{refused:?}"
        );
        // On linnet's own network it holds, where bridged frames pass
        // the firewall: not on a host without br_netfilter.
        let on_own = AttachRequest {
            network: Some("shared".into()),
            ..policed
        };
        let config = Config::from_yaml(USERS, "t.yaml").unwrap();
        let root = client(0, 1);
        assert!(admit(&config, &none, &root, &on_own, true).is_ok());
        assert!(matches!(
            admit(&config, &none, &root, &on_own, false),
            Err(DaemonError::NoBrNetfilter)
        ));
    }

    #[test]
    fn a_network_sockets_relay_attaches_its_vm_once_and_nothing_else() {
        let mac: MacAddr = "52:55:55:00:00:01".parse().unwrap();
        let relay = Client {
            network_socket: Some("shared".into()),
            ..client(1000, 9)
        };
        let its_vm = AttachRequest {
            network: Some("shared".into()),
            interface_id: None,
            mac: Some(mac),
            datapath: Some(Datapath::Stream),
            ..AttachRequest::default()
        };
        let mut interfaces = Interfaces::new();
        assert_eq!(
            admitted(&interfaces, &relay, &its_vm).ok(),
            Some(types::socket_interface_id("shared", mac, 1000)),
            "the id the daemon gives: the network's, the MAC's and the owner's"
        );
        // Nobody takes it through the ordinary API before the VM comes.
        let squat = AttachRequest {
            interface_id: Some(types::socket_interface_id("shared", mac, 1000)),
            ..request(None)
        };
        assert!(matches!(
            admitted(&interfaces, &client(1001, 8), &squat),
            Err(DaemonError::SocketInterfaceId { .. })
        ));
        assert!(
            admitted(&interfaces, &client(0, 8), &squat).is_err(),
            "not even root"
        );
        let named = AttachRequest {
            name: Some("web".into()),
            ..its_vm.clone()
        };
        assert!(matches!(
            admitted(&interfaces, &relay, &named),
            Err(DaemonError::RelayRefused { .. })
        ));
        interfaces.insert(id(1), attached("shared", 1000, None, 9));
        let again = admitted(&interfaces, &relay, &its_vm);
        assert!(
            matches!(&again, Err(DaemonError::RelayRefused { why, .. }) if why == "has attached its interface already"),
            "{again:?}"
        );
    }
}
