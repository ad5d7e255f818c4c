//! linnet's nftables table (`inet linnet`): forwarding, NAT44/NAT66 and
//! port forwards (DNAT) for its own bridges. The whole table is generated from the active networks and
//! replaced in one atomic transaction, so applying twice (or after a crash)
//! never duplicates a rule. Driven through nft's JSON API with typed values;
//! no user text is ever spliced into an nft command.

mod fabric;
pub mod gate;
pub mod names;

use std::borrow::Cow;

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::NFT_TABLE;
use super::nft::{Nft, NftError};
use super::ruleset::Shape;
use crate::forward::{PortForward, Protocol};
use crate::learned::Element;
use crate::policy::{ConnectRule, Destination, ListenRule, Policy, Ports, Reach};
use crate::types::MacAddr;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use nftables::batch::Batch;
use nftables::expr::{
    CT, Expression, Fib, FibFlag, FibResult, Meta, MetaKey, NamedExpression, Payload, PayloadField,
    Prefix, SetItem,
};
use nftables::schema::{Chain, Counter, NfCmd, NfListObject, NfObject, Nftables, Rule, Table};
use nftables::stmt::{Counter as StmtCounter, Match, NAT, NATFamily, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

const FAMILY: NfFamily = NfFamily::INet;
const FORWARD: &str = "forward";
const POSTROUTING: &str = "postrouting";
const PREROUTING: &str = "prerouting";
const OUTPUT: &str = "output";
const GUARD: &str = "guard";
/// Standard hook priorities: raw (-300), dstnat (-100), filter (0), srcnat (100).
const PRIORITY_RAW: i32 = -300;
const PRIORITY_DSTNAT: i32 = -100;
const PRIORITY_FILTER: i32 = 0;
const PRIORITY_SRCNAT: i32 = 100;

/// What the firewall needs to know about one active network.
#[derive(Debug, Clone)]
pub struct FirewallNetwork {
    pub bridge: String,
    pub subnet: Ipv4Net,
    pub ipv6_prefix: Option<Ipv6Net>,
    /// `mode: host`: nothing forwarded in or out (else `shared`).
    pub host_only: bool,
    pub nat44: bool,
    pub nat66: bool,
    /// VMs of the network may not reach each other, not even routed.
    pub isolation: bool,
    pub forwards: Vec<ForwardRule>,
    /// The gateway's addresses (DNS), always allowed to policy VMs.
    pub gateways: Vec<IpAddr>,
    /// Interfaces with a connect/listen policy.
    pub policies: Vec<InterfacePolicy>,
    /// Where the network's clones are reached (routed to its bridge), once
    /// it has had one: NATed like the subnet.
    pub clone_subnet: Option<Ipv4Net>,
    /// A network across hosts' VXLAN port (`fabric`).
    pub fabric: Option<FabricPort>,
    /// The port of its secrets proxy on its IPv4 gateway, when it runs:
    /// its VMs' connections to port 443 of a secret rule's host are
    /// redirected there (`names::steering`).
    pub secrets_port: Option<u16>,
}

/// A network across hosts' VXLAN port, and its gateway's MAC (the same on
/// every host).
#[derive(Debug, Clone, PartialEq)]
pub struct FabricPort {
    pub port: String,
    pub gateway_mac: MacAddr,
}

/// One interface's policy and the addresses that identify its VM (its own
/// for sure: anti-spoofing keeps others from using them).
#[derive(Debug, Clone, PartialEq)]
pub struct InterfacePolicy {
    pub tap: String,
    pub addrs: Vec<IpAddr>,
    pub policy: Policy,
    /// The addresses the VM learned from linnet's DNS for its policy's
    /// names, with the seconds each has left (`names`).
    pub learned: Vec<Element>,
    /// Connections its egress policy refused so far: its counter starts
    /// there when the table is made anew.
    pub refused: u64,
}

/// A published port and where it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardRule {
    pub forward: PortForward,
    pub guest: Ipv4Addr,
    /// The guest's SLAAC address, when its network has IPv6.
    pub guest6: Option<Ipv6Addr>,
    /// A forward to a user's VM (not root's) captures only that user's
    /// connections from the host itself: another user's connection to
    /// 127.0.0.1:PORT still reaches what listens there.
    pub local_uid: Option<u32>,
}

impl ForwardRule {
    /// Whether it forwards anything over IPv6 (which needs IPv6 forwarding).
    pub fn covers_ipv6(&self) -> bool {
        self.targets().iter().any(|(_, guest)| guest.is_ipv6())
    }

    /// The (host-side match, guest address) pairs: one per address family
    /// the forward covers.
    fn targets(&self) -> Vec<(Option<IpAddr>, IpAddr)> {
        match self.forward.host_addr {
            Some(a @ IpAddr::V4(_)) => vec![(Some(a), IpAddr::V4(self.guest))],
            Some(a @ IpAddr::V6(_)) => self
                .guest6
                .map(|g| vec![(Some(a), IpAddr::V6(g))])
                .unwrap_or_default(),
            None => std::iter::once((None, IpAddr::V4(self.guest)))
                .chain(self.guest6.map(|g| (None, IpAddr::V6(g))))
                .collect(),
        }
    }
}

/// Whether some VM's connections are held for their name (`gate`): then
/// the queue's rule must be there too (`host::gate_queue`).
pub fn any_checked(networks: &[FirewallNetwork]) -> bool {
    (networks.iter())
        .flat_map(|n| &n.policies)
        .any(|p| gate::holds(&p.policy))
}

/// Replaces linnet's table with the rules for `networks` (none: removes it).
pub fn apply(nft: &mut Nft, networks: &[FirewallNetwork]) -> Result<(), NftError> {
    nft.apply(&ruleset(networks))
}

/// The chains of the table `inet linnet` that `ruleset(networks)` makes
/// and how many rules each gets.
pub fn shape(networks: &[FirewallNetwork]) -> Shape {
    shape_of(networks, FAMILY, NFT_TABLE)
}

/// The same of `bridge linnet_fabric`: empty when no network has a
/// fabric port (and the table is not made).
pub fn fabric_shape(networks: &[FirewallNetwork]) -> Shape {
    shape_of(networks, NfFamily::Bridge, super::FABRIC_TABLE)
}

fn shape_of(networks: &[FirewallNetwork], family: NfFamily, table: &str) -> Shape {
    let mut shape = Shape::new();
    for object in ruleset(networks).objects.iter() {
        match object {
            NfObject::CmdObject(NfCmd::Add(NfListObject::Chain(c)))
                if c.family == family && c.table == table =>
            {
                shape.entry(c.name.to_string()).or_default();
            }
            NfObject::CmdObject(NfCmd::Add(NfListObject::Rule(r)))
                if r.family == family && r.table == table =>
            {
                *shape.entry(r.chain.to_string()).or_default() += 1;
            }
            _ => {}
        }
    }
    shape
}

/// The transaction: (re)create the table empty, then fill it. `add` + `delete`
/// first makes the delete valid whether or not the table exists.
pub fn ruleset(networks: &[FirewallNetwork]) -> Nftables<'static> {
    let mut batch = Batch::new();
    add_inet(&mut batch, networks);
    fabric::add(&mut batch, networks);
    batch.to_nftables()
}

/// `inet linnet`, emptied, and its chains and rules if there are networks.
fn add_inet(batch: &mut Batch<'static>, networks: &[FirewallNetwork]) {
    batch.add(table());
    batch.delete(table());
    if networks.is_empty() {
        return;
    }
    batch.add(table());
    batch.add(base_chain(
        FORWARD,
        NfChainType::Filter,
        NfHook::Forward,
        PRIORITY_FILTER,
    ));
    batch.add(base_chain(
        POSTROUTING,
        NfChainType::NAT,
        NfHook::Postrouting,
        PRIORITY_SRCNAT,
    ));
    batch.add(base_chain(
        PREROUTING,
        NfChainType::NAT,
        NfHook::Prerouting,
        PRIORITY_DSTNAT,
    ));
    batch.add(base_chain(
        OUTPUT,
        NfChainType::NAT,
        NfHook::Output,
        PRIORITY_DSTNAT,
    ));
    batch.add(base_chain(
        GUARD,
        NfChainType::Filter,
        NfHook::Prerouting,
        PRIORITY_RAW,
    ));
    if any_checked(networks) {
        batch.add(NfListObject::Counter(Counter {
            family: FAMILY,
            table: Cow::Borrowed(NFT_TABLE),
            name: Cow::Borrowed(gate::REFUSED_COUNTER),
            handle: None,
            packets: None,
            bytes: None,
        }));
        batch.add(base_chain(
            gate::CHAIN,
            NfChainType::Filter,
            NfHook::Forward,
            gate::PRIORITY,
        ));
        for statements in gate::rules() {
            batch.add(rule(gate::CHAIN, statements));
        }
    }

    // The bridges accept loopback addresses (route_localnet, so that the
    // host's own 127.0.0.1 can reach a published port): never from a VM,
    // which could otherwise reach the host's loopback services. Checked
    // before NAT, so replies to forwarded loopback connections still pass.
    for net in networks {
        for field in ["saddr", "daddr"] {
            batch.add(rule(
                GUARD,
                vec![
                    eq(meta(MetaKey::Iifname), string(&net.bridge)),
                    eq(payload("ip", field), prefix(loopback4())),
                    drop(),
                ],
            ));
        }
    }

    add_policies(batch, networks);
    for net in networks {
        for steering in names::steering(net) {
            batch.add(rule(PREROUTING, steering));
        }
    }
    if networks.iter().any(|n| n.secrets_port.is_some()) {
        secrets_out(batch);
    }

    // Published ports: connections DNATed to a VM pass into its network
    // (whatever its mode), and only their replies come out.
    for net in networks.iter().filter(|n| !n.forwards.is_empty()) {
        for (dir, way) in [(MetaKey::Oifname, "original"), (MetaKey::Iifname, "reply")] {
            batch.add(rule(
                FORWARD,
                vec![
                    eq(meta(dir), string(&net.bridge)),
                    dnated(),
                    eq(ct("direction"), string(way)),
                    accept(),
                ],
            ));
        }
    }

    // Frames between VMs of one network are bridged, not routed, but with
    // br_netfilter loaded (as on Docker hosts) they still pass this hook,
    // in and out of the bridge itself: let them through first. On an
    // isolated network, drop them: that is also a VM routing to another
    // through the gateway (its bridge-level isolation is in the guard table).
    for net in networks {
        batch.add(rule(
            FORWARD,
            vec![
                eq(meta(MetaKey::Iifname), string(&net.bridge)),
                eq(meta(MetaKey::Oifname), string(&net.bridge)),
                if net.isolation { drop() } else { accept() },
            ],
        ));
    }
    // linnet networks never route into one another.
    for net in networks {
        let others: Vec<String> = networks
            .iter()
            .filter(|o| o.bridge != net.bridge)
            .map(|o| o.bridge.clone())
            .collect();
        if !others.is_empty() {
            batch.add(rule(
                FORWARD,
                vec![
                    eq(meta(MetaKey::Iifname), string(&net.bridge)),
                    eq(meta(MetaKey::Oifname), set(&others)),
                    drop(),
                ],
            ));
        }
    }

    // Host-only networks first: nothing in or out.
    for net in networks.iter().filter(|n| n.host_only) {
        batch.add(rule(
            FORWARD,
            vec![eq(meta(MetaKey::Iifname), string(&net.bridge)), drop()],
        ));
        batch.add(rule(
            FORWARD,
            vec![eq(meta(MetaKey::Oifname), string(&net.bridge)), drop()],
        ));
    }
    for net in networks.iter().filter(|n| !n.host_only) {
        // Out: anything. In: only replies.
        batch.add(rule(
            FORWARD,
            vec![eq(meta(MetaKey::Iifname), string(&net.bridge)), accept()],
        ));
        batch.add(rule(
            FORWARD,
            vec![
                eq(meta(MetaKey::Oifname), string(&net.bridge)),
                Statement::Match(Match {
                    left: ct("state"),
                    right: list(&["established", "related"]),
                    op: Operator::IN,
                }),
                accept(),
            ],
        ));
        batch.add(rule(
            FORWARD,
            vec![eq(meta(MetaKey::Oifname), string(&net.bridge)), drop()],
        ));
        let nat = [
            (net.nat44, "ip", Some(IpNet::V4(net.subnet))),
            (net.nat44, "ip", net.clone_subnet.map(IpNet::V4)),
            (net.nat66, "ip6", net.ipv6_prefix.map(IpNet::V6)),
        ];
        for (on, family, source) in nat {
            let Some(source) = source.filter(|_| on) else {
                continue;
            };
            batch.add(rule(
                POSTROUTING,
                vec![
                    eq(payload(family, "saddr"), prefix(source)),
                    not_eq(meta(MetaKey::Oifname), string(&net.bridge)),
                    Statement::Masquerade(None),
                ],
            ));
        }
    }
    for net in networks {
        add_forwards(batch, net);
    }
}

/// DNAT for each published port, in prerouting (from outside) and output
/// (from the host itself), and the masquerades that make the replies come
/// back: for a VM of the same network using the published port (hairpin)
/// and for connections from the host's 127.0.0.1.
fn add_forwards(batch: &mut Batch<'static>, net: &FirewallNetwork) {
    if net.forwards.is_empty() {
        return;
    }
    for fwd in &net.forwards {
        let f = fwd.forward;
        for (host, guest) in fwd.targets() {
            let family = ip_family(guest);
            // Only the host's own addresses: a forward never captures
            // traffic to other machines that passes through or leaves it.
            let mut matches = vec![match host {
                Some(addr) => eq(payload(family, "daddr"), string(&addr.to_string())),
                None => eq(meta(MetaKey::Nfproto), string(family_name(guest))),
            }];
            matches.push(eq(fib_daddr_type(), string("local")));
            matches.push(eq(meta(MetaKey::L4proto), string(f.protocol.as_str())));
            matches.push(eq(payload("th", "dport"), number(f.host_port)));
            let dnat = Statement::DNAT(Some(NAT {
                addr: Some(string(&guest.to_string())),
                family: Some(if guest.is_ipv4() {
                    NATFamily::IP
                } else {
                    NATFamily::IP6
                }),
                port: Some(number(f.guest_port)),
                flags: None::<HashSet<_>>,
            }));
            // From outside: never to a loopback address. The kernel drops
            // such packets only when it routes them, after this hook, so a
            // DNAT here would open 127.0.0.1 forwards to the LAN. (IPv6 to
            // ::1 from outside is dropped before any hook.)
            if !host.is_some_and(|a| a.is_loopback()) {
                let mut from_outside = matches.clone();
                if host.is_none() && guest.is_ipv4() {
                    from_outside.insert(1, not_eq(payload("ip", "daddr"), prefix(loopback4())));
                }
                from_outside.push(dnat.clone());
                batch.add(rule(PREROUTING, from_outside));
            }
            let mut from_host = matches;
            if let Some(uid) = fwd.local_uid {
                from_host.insert(1, eq(meta(MetaKey::Skuid), Expression::Number(uid)));
            }
            if host.is_none() && guest.is_ipv6() {
                // ::1 cannot leave the loopback device (IPv6 has no
                // route_localnet): leave it to be refused, not black-holed.
                from_host.insert(1, not_eq(payload("ip6", "daddr"), string("::1")));
            }
            from_host.push(dnat);
            batch.add(rule(OUTPUT, from_host));
        }
    }
    // Hairpin: the input interface is not known in postrouting, so a VM's
    // own connection is told by its source address.
    let sources = std::iter::once(("ip", IpNet::V4(net.subnet)))
        .chain(net.clone_subnet.map(|c| ("ip", IpNet::V4(c))))
        .chain(net.ipv6_prefix.map(|p| ("ip6", IpNet::V6(p))));
    for (family, source) in sources {
        batch.add(rule(
            POSTROUTING,
            vec![
                eq(meta(MetaKey::Oifname), string(&net.bridge)),
                eq(payload(family, "saddr"), prefix(source)),
                dnated(),
                Statement::Masquerade(None),
            ],
        ));
    }
    batch.add(rule(
        POSTROUTING,
        vec![
            eq(meta(MetaKey::Oifname), string(&net.bridge)),
            eq(payload("ip", "saddr"), prefix(loopback4())),
            Statement::Masquerade(None),
        ],
    ));
}

const INPUT: &str = "input";
const LOCAL_OUT: &str = "local-out";
const SECRETS_OUT: &str = "secrets-out";

/// Connect/listen policies, enforced with conntrack on what is routed or
/// reaches the host: the first packet of each connection from a policy VM
/// jumps to its `out-TAP` chain, of each to it to its `in-TAP` chain, from
/// the forward hook (the outside, other networks, port forwards), the input
/// hook (the host's services) and the output hook (the host itself).
/// Traffic between two VMs of one bridge is not routed and not seen here.
fn add_policies(batch: &mut Batch<'static>, networks: &[FirewallNetwork]) {
    let all: Vec<(&FirewallNetwork, &InterfacePolicy)> = networks
        .iter()
        .flat_map(|n| n.policies.iter().map(move |p| (n, p)))
        .filter(|(_, p)| !p.policy.is_open())
        .collect();
    if all.is_empty() {
        return;
    }
    batch.add(base_chain(
        INPUT,
        NfChainType::Filter,
        NfHook::Input,
        PRIORITY_FILTER,
    ));
    batch.add(base_chain(
        LOCAL_OUT,
        NfChainType::Filter,
        NfHook::Output,
        PRIORITY_FILTER,
    ));
    for (net, iface) in all {
        if !iface.policy.egress.is_empty() {
            // DHCP and DNS to the gateway always pass, and DHCP broadcast
            // from a client's port (a lease rebinding); nothing else on
            // port 67 does.
            let mut allowed = vec![vec![
                eq(payload("ip", "daddr"), string("255.255.255.255")),
                eq(payload("udp", "sport"), number(68)),
                eq(payload("udp", "dport"), number(67)),
                accept(),
            ]];
            for gw in net.gateways.iter().filter(|gw| gw.is_ipv4()) {
                allowed.push(vec![
                    eq(payload("ip", "daddr"), string(&gw.to_string())),
                    eq(payload("udp", "dport"), number(67)),
                    accept(),
                ]);
            }
            for gw in &net.gateways {
                allowed.push(vec![
                    eq(payload(ip_family(*gw), "daddr"), string(&gw.to_string())),
                    protocol_match(None),
                    eq(payload("th", "dport"), number(53)),
                    accept(),
                ]);
            }
            allowed.extend(names::resolvers(iface));
            allowed.extend(names::steered_in(net, iface));
            allowed.extend(iface.policy.egress.iter().filter_map(connect_match));
            allowed.extend(names::reaches(iface));
            names::add_sets(batch, iface);
            let counter = refused_counter(&iface.tap);
            batch.add(NfListObject::Counter(Counter {
                family: FAMILY,
                table: Cow::Borrowed(NFT_TABLE),
                name: Cow::Owned(counter.clone()),
                handle: None,
                packets: Some(u32::try_from(iface.refused).unwrap_or(u32::MAX)),
                bytes: Some(0),
            }));
            let chain = format!("out-{}", iface.tap);
            let reject = Some(counter.as_str());
            add_policy_chain(
                batch,
                iface,
                &chain,
                allowed,
                &[FORWARD, INPUT],
                "saddr",
                reject,
            );
        }
        let chain = format!("in-{}", iface.tap);
        if !iface.policy.ingress.is_empty() {
            let mut allowed = pings(net, iface);
            allowed.extend(iface.policy.ingress.iter().map(listen_match));
            add_policy_chain(
                batch,
                iface,
                &chain,
                allowed,
                &[FORWARD, LOCAL_OUT],
                "daddr",
                None,
            );
        } else if !iface.policy.egress.is_empty() {
            // A VM with a connect policy and no listen rule: no other VM
            // (nor anything routed) connects to it, lest a neighbour pull
            // out what its policy keeps in; its published ports do, and
            // the host's own connections (output) never come here.
            add_policy_chain(
                batch,
                iface,
                &chain,
                vec![vec![dnated(), accept()]],
                &[FORWARD],
                "daddr",
                None,
            );
        }
    }
}

/// What a secrets proxy may send (its uid, `SECRETS_UID`): on the
/// connections it has (the guests' steered to it among them), and new
/// TCP connections to port 443 of other machines, the upstreams it was
/// made to reach; nothing to the host's own addresses, nothing else. A
/// proxy taken over through what a guest sent reaches no more.
fn secrets_out(batch: &mut Batch<'static>) {
    batch.add(base_chain(
        SECRETS_OUT,
        NfChainType::Filter,
        NfHook::Output,
        PRIORITY_FILTER,
    ));
    let uid = || {
        eq(
            meta(MetaKey::Skuid),
            Expression::Number(crate::host::SECRETS_UID),
        )
    };
    let known = Statement::Match(Match {
        left: ct("state"),
        right: set(&["established".into(), "related".into()]),
        op: Operator::IN,
    });
    for statements in [
        vec![uid(), known, accept()],
        vec![
            uid(),
            eq(fib_daddr_type(), string("local")),
            Statement::Reject(None),
        ],
        vec![
            uid(),
            eq(meta(MetaKey::L4proto), string("tcp")),
            eq(payload("th", "dport"), number(crate::policy::SECRET_PORT)),
            accept(),
        ],
        vec![uid(), Statement::Reject(None)],
    ] {
        batch.add(rule(SECRETS_OUT, statements));
    }
}

/// The pings a VM with a listen policy answers: anyone's, or with a
/// connect policy too only the host's (from its gateways), since an echo
/// reply carries whatever the VM puts in it.
fn pings(net: &FirewallNetwork, iface: &InterfacePolicy) -> Vec<Vec<Statement<'static>>> {
    let mut out = Vec::new();
    for (proto, family, v6) in [("icmp", "ip", false), ("icmpv6", "ip6", true)] {
        let mut ping = vec![eq(payload(proto, "type"), string("echo-request"))];
        if !iface.policy.egress.is_empty() {
            let gateways: Vec<String> = (net.gateways.iter())
                .filter(|gw| gw.is_ipv6() == v6)
                .map(|gw| gw.to_string())
                .collect();
            if gateways.is_empty() {
                continue;
            }
            ping.push(eq(payload(family, "saddr"), set(&gateways)));
        }
        ping.push(accept());
        out.push(ping);
    }
    out
}

/// One interface's policy chain: the `allowed` rules, then a reject
/// (counted by the named counter `counted`, if given); new connections
/// whose `field` (saddr: from the VM, daddr: to it) is one of the VM's
/// addresses jump to it from `hooks`.
fn add_policy_chain(
    batch: &mut Batch<'static>,
    iface: &InterfacePolicy,
    chain: &str,
    allowed: Vec<Vec<Statement<'static>>>,
    hooks: &[&'static str],
    field: &'static str,
    counted: Option<&str>,
) {
    batch.add(chain_object(chain));
    for statements in allowed {
        batch.add(rule(chain.to_string(), statements));
    }
    // Neighbour discovery and MLD, which conntrack does not track (so they
    // come here as `untracked`): a VM's link needs them either way.
    let link: Vec<String> = [
        "nd-router-solicit",
        "nd-router-advert",
        "nd-neighbor-solicit",
        "nd-neighbor-advert",
        "mld-listener-query",
        "mld-listener-report",
        "mld-listener-done",
        "mld2-listener-report",
    ]
    .map(String::from)
    .to_vec();
    batch.add(rule(
        chain.to_string(),
        vec![eq(payload("icmpv6", "type"), set(&link)), accept()],
    ));
    let mut reject: Vec<Statement<'static>> = counted
        .map(|name| Statement::Counter(StmtCounter::Named(Cow::Owned(name.to_string()))))
        .into_iter()
        .collect();
    reject.push(Statement::Reject(None));
    batch.add(rule(chain.to_string(), reject));
    let state = |which: &[&str]| {
        let which: Vec<String> = which.iter().map(|s| s.to_string()).collect();
        Statement::Match(Match {
            left: ct("state"),
            right: if which.len() == 1 {
                string(&which[0])
            } else {
                set(&which)
            },
            op: Operator::IN,
        })
    };
    for (family, v6) in [("ip", false), ("ip6", true)] {
        let addrs: Vec<String> = iface
            .addrs
            .iter()
            .filter(|a| a.is_ipv6() == v6)
            .map(|a| a.to_string())
            .collect();
        if addrs.is_empty() {
            continue;
        }
        for &hook in hooks {
            // What conntrack cannot place (a segment of no connection, odd
            // flags) would skip the `new` match below: it is dropped.
            batch.add(rule(
                hook,
                vec![
                    eq(payload(family, field), set(&addrs)),
                    state(&["invalid"]),
                    drop(),
                ],
            ));
            batch.add(rule(
                hook,
                vec![
                    eq(payload(family, field), set(&addrs)),
                    // New, or not tracked at all (another table's notrack).
                    state(&["new", "untracked"]),
                    jump(chain),
                ],
            ));
            if field == "saddr" && hook == FORWARD && gate::holds(&iface.policy) {
                // A SYN on the address and port of a connection conntrack
                // still keeps (closed by a reset) reuses its entry, which
                // is not `new`: judged as a new connection all the same,
                // lest it pass with the old one's verdict (`gate`).
                batch.add(rule(
                    hook,
                    vec![
                        eq(payload(family, field), set(&addrs)),
                        gate::syn_alone(),
                        jump(chain),
                    ],
                ));
            }
        }
    }
}

/// The counter of the connections `tap`'s egress policy refused.
fn refused_counter(tap: &str) -> String {
    format!("refused-{tap}")
}

/// The connections each VM's egress policy refused so far, by TAP (the
/// counters of `inet linnet`; none when the table is not there).
pub fn refusals(nft: &Nft) -> Result<BTreeMap<String, u64>, NftError> {
    let listing = match nft.run(&format!("list counters table inet {NFT_TABLE}")) {
        Ok(text) => text,
        Err(NftError::Refused(_)) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    Ok(refusals_in(&listing))
}

fn refusals_in(listing: &str) -> BTreeMap<String, u64> {
    let doc: serde_json::Value = serde_json::from_str(listing).unwrap_or_default();
    let objects = doc["nftables"].as_array().cloned().unwrap_or_default();
    objects
        .iter()
        .filter_map(|o| o.get("counter"))
        .filter_map(|c| {
            let tap = c["name"].as_str()?.strip_prefix("refused-")?;
            Some((tap.to_string(), c["packets"].as_u64()?))
        })
        .collect()
}

fn protocol_match(protocol: Option<Protocol>) -> Statement<'static> {
    match protocol {
        Some(p) => eq(meta(MetaKey::L4proto), string(p.as_str())),
        None => eq(
            meta(MetaKey::L4proto),
            set(&["tcp".to_string(), "udp".to_string()]),
        ),
    }
}

fn ports_match(ports: Ports) -> Statement<'static> {
    let right = if ports.first == ports.last {
        number(ports.first)
    } else {
        Expression::Range(Box::new(nftables::expr::Range {
            range: [number(ports.first), number(ports.last)],
        }))
    };
    eq(payload("th", "dport"), right)
}

/// `ip daddr NET [meta l4proto P th dport PORTS] accept`; None for a
/// rule by name (`names::reaches`).
fn connect_match(r: &ConnectRule) -> Option<Vec<Statement<'static>>> {
    let Destination::Net(net) = r.to else {
        return None;
    };
    let mut out = vec![eq(payload(ip_family(net.addr()), "daddr"), prefix(net))];
    out.extend(reach_match(r.reach()));
    out.push(accept());
    Some(out)
}

/// `[meta l4proto P] [th dport PORTS]`: nothing for any traffic.
fn reach_match(reach: Reach) -> Vec<Statement<'static>> {
    match (reach.ports, reach.protocol) {
        (None, None) => vec![],
        (None, Some(p)) => vec![protocol_match(Some(p))],
        (Some(ports), p) => vec![protocol_match(p), ports_match(ports)],
    }
}

/// `meta l4proto P th dport PORTS accept`.
fn listen_match(r: &ListenRule) -> Vec<Statement<'static>> {
    vec![protocol_match(r.protocol), ports_match(r.ports), accept()]
}

fn chain_object(name: &str) -> NfListObject<'static> {
    NfListObject::Chain(Chain {
        family: FAMILY,
        table: Cow::Borrowed(NFT_TABLE),
        name: Cow::Owned(name.to_string()),
        ..Default::default()
    })
}

fn jump(chain: &str) -> Statement<'static> {
    Statement::Jump(nftables::stmt::JumpTarget {
        target: Cow::Owned(chain.to_string()),
    })
}

fn loopback4() -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::LOCALHOST, 8).expect("8 is a valid prefix length")
}

/// The payload protocol of an address: "ip" or "ip6".
fn ip_family(addr: IpAddr) -> &'static str {
    if addr.is_ipv4() { "ip" } else { "ip6" }
}

fn family_name(addr: IpAddr) -> &'static str {
    if addr.is_ipv4() { "ipv4" } else { "ipv6" }
}

fn fib_daddr_type() -> Expression<'static> {
    Expression::Named(NamedExpression::Fib(Fib {
        result: FibResult::Type,
        flags: HashSet::from([FibFlag::Daddr]),
    }))
}

fn number(n: u16) -> Expression<'static> {
    Expression::Number(n as u32)
}

fn table() -> NfListObject<'static> {
    NfListObject::Table(Table {
        family: FAMILY,
        name: Cow::Borrowed(NFT_TABLE),
        handle: None,
    })
}

fn base_chain(
    name: &'static str,
    kind: NfChainType,
    hook: NfHook,
    prio: i32,
) -> NfListObject<'static> {
    NfListObject::Chain(Chain {
        family: FAMILY,
        table: Cow::Borrowed(NFT_TABLE),
        name: Cow::Borrowed(name),
        _type: Some(kind),
        hook: Some(hook),
        prio: Some(prio),
        policy: Some(NfChainPolicy::Accept),
        ..Default::default()
    })
}

fn rule(
    chain: impl Into<Cow<'static, str>>,
    expr: Vec<Statement<'static>>,
) -> NfListObject<'static> {
    NfListObject::Rule(Rule {
        family: FAMILY,
        table: Cow::Borrowed(NFT_TABLE),
        chain: chain.into(),
        expr: Cow::Owned(expr),
        ..Default::default()
    })
}

fn eq(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::EQ,
    })
}

fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

fn ct(key: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::CT(CT {
        key: Cow::Borrowed(key),
        family: None,
        dir: None,
    }))
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: Cow::Borrowed(protocol),
            field: Cow::Borrowed(field),
        },
    )))
}

fn prefix(net: impl Into<IpNet>) -> Expression<'static> {
    let net: IpNet = net.into();
    Expression::Named(NamedExpression::Prefix(Prefix {
        addr: Box::new(Expression::String(Cow::Owned(net.network().to_string()))),
        len: net.prefix_len() as u32,
    }))
}

fn string(s: &str) -> Expression<'static> {
    Expression::String(Cow::Owned(s.to_string()))
}

fn set(items: &[String]) -> Expression<'static> {
    Expression::Named(NamedExpression::Set(
        items.iter().map(|s| SetItem::Element(string(s))).collect(),
    ))
}

fn list(items: &[&'static str]) -> Expression<'static> {
    Expression::List(
        items
            .iter()
            .map(|s| Expression::String(Cow::Borrowed(*s)))
            .collect(),
    )
}

/// `ct status dnat`: a connection some DNAT rule redirected.
fn dnated() -> Statement<'static> {
    Statement::Match(Match {
        left: ct("status"),
        right: string("dnat"),
        op: Operator::IN,
    })
}

fn not_eq(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::NEQ,
    })
}

fn accept() -> Statement<'static> {
    Statement::Accept(None)
}

fn drop() -> Statement<'static> {
    Statement::Drop(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn nets() -> Vec<FirewallNetwork> {
        vec![
            FirewallNetwork {
                bridge: "ln-shared".into(),
                subnet: "192.168.105.0/24".parse().unwrap(),
                ipv6_prefix: Some("fd00:5::/64".parse().unwrap()),
                host_only: false,
                nat44: true,
                nat66: true,
                isolation: false,
                forwards: Vec::new(),
                gateways: Vec::new(),
                policies: Vec::new(),
                clone_subnet: None,
                fabric: None,
                secrets_port: None,
            },
            FirewallNetwork {
                bridge: "ln-host".into(),
                subnet: "192.168.106.0/24".parse().unwrap(),
                ipv6_prefix: Some("fd00:6::/64".parse().unwrap()),
                host_only: true,
                nat44: false,
                nat66: false,
                isolation: false,
                forwards: Vec::new(),
                gateways: Vec::new(),
                policies: Vec::new(),
                clone_subnet: None,
                fabric: None,
                secrets_port: None,
            },
        ]
    }

    #[test]
    fn the_shape_counts_each_chains_rules() {
        assert!(shape(&[]).is_empty(), "no networks, no table");
        let doc = ruleset(&nets());
        let shape = shape(&nets());
        for chain in [FORWARD, POSTROUTING, PREROUTING, OUTPUT, GUARD] {
            assert_eq!(shape[chain], rules(&doc, chain).len(), "{chain}");
        }
        assert_eq!(shape[GUARD], 4, "loopback from two bridges, both ways");
    }

    fn commands(doc: &Nftables) -> Vec<Value> {
        serde_json::to_value(doc).unwrap()["nftables"]
            .as_array()
            .unwrap()
            .clone()
    }

    fn rules(doc: &Nftables, chain: &str) -> Vec<Value> {
        commands(doc)
            .into_iter()
            .filter_map(|c| c["add"]["rule"].as_object().cloned())
            .filter(|r| r["chain"] == chain)
            .map(|r| r["expr"].clone())
            .collect()
    }

    /// A fabric port: the host neither sends by it nor takes from it,
    /// another host's gateway reaches no VM, and DHCP and router
    /// discovery cross it in neither direction; none of it is in `inet
    /// linnet`'s shape.
    #[test]
    fn a_fabric_port_keeps_gateway_dhcp_and_router_discovery_on_their_host() {
        let mut with = nets();
        with[0].fabric = Some(FabricPort {
            port: "lx-shared".into(),
            gateway_mac: "02:aa:bb:cc:dd:ee".parse().unwrap(),
        });
        let doc = ruleset(&with);
        let port = json!({"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lx-shared"}});
        let input = rules(&doc, "fabric_in");
        assert_eq!(input, [json!([port, {"drop": null}])]);
        assert_eq!(rules(&doc, "fabric_out").len(), 1);
        let forward = rules(&doc, "fabric_forward");
        let text = serde_json::to_string(&forward).unwrap();
        assert_eq!(forward.len(), 5, "{text}");
        assert!(text.contains("02:aa:bb:cc:dd:ee") && text.contains("546") && text.contains("134"));
        assert_eq!(shape(&with), shape(&nets()));
        let fabric_tables = commands(&ruleset(&nets()))
            .iter()
            .filter(|c| c["add"]["table"]["name"] == "linnet_fabric")
            .count();
        assert_eq!(
            fabric_tables, 1,
            "without a fabric port, the table only goes"
        );
    }

    #[test]
    fn empty_ruleset_only_removes_the_table() {
        let cmds = commands(&ruleset(&[]));
        assert_eq!(cmds.len(), 4);
        assert_eq!(cmds[0]["add"]["table"]["name"], "linnet");
        assert_eq!(cmds[1]["delete"]["table"]["family"], "inet");
        assert_eq!(cmds[3]["delete"]["table"]["family"], "bridge");
        assert_eq!(cmds[3]["delete"]["table"]["name"], "linnet_fabric");
    }

    #[test]
    fn table_is_replaced_atomically_with_forward_and_nat() {
        let doc = ruleset(&nets());
        let cmds = commands(&doc);
        assert!(cmds[1]["delete"]["table"].is_object() && cmds[2]["add"]["table"].is_object());
        let chains: Vec<&Value> = cmds.iter().filter_map(|c| c["add"].get("chain")).collect();
        assert_eq!(chains[0]["hook"], "forward");
        assert_eq!(
            chains[0]["policy"], "accept",
            "linnet never drops traffic that is not its own"
        );
        assert_eq!(chains[1]["type"], "nat");
        assert_eq!(chains[1]["prio"], 100);
    }

    #[test]
    fn a_networks_clone_range_is_masqueraded_like_its_subnet() {
        let mut networks = nets();
        networks[0].clone_subnet = Some("198.18.105.0/24".parse().unwrap());
        let nat = rules(&ruleset(&networks), "postrouting");
        assert_eq!(nat.len(), 3);
        assert_eq!(
            nat[1][0]["match"]["right"],
            json!({"prefix": {"addr": "198.18.105.0", "len": 24}})
        );
        assert_eq!(nat[1][2], json!({"masquerade": null}));
    }

    #[test]
    fn a_single_network_has_no_cross_network_rule() {
        let doc = ruleset(&nets()[..1]);
        let fwd = rules(&doc, "forward");
        assert_eq!(fwd.len(), 4);
        assert_eq!(fwd[1][1], json!({"accept": null}));
    }

    #[test]
    fn host_network_is_closed_before_shared_rules_and_shared_is_masqueraded() {
        let doc = ruleset(&nets());
        let fwd = rules(&doc, "forward");
        let (bridged, fwd) = fwd.split_at(2);
        assert_eq!(
            bridged[1][0]["match"]["right"], "ln-host",
            "bridged traffic within a network passes (br_netfilter)"
        );
        assert_eq!(bridged[1][1]["match"]["right"], "ln-host");
        assert_eq!(bridged[1][2], json!({"accept": null}));
        assert_eq!(fwd[0][0]["match"]["right"], "ln-shared");
        assert_eq!(
            fwd[0][1]["match"]["right"],
            json!({"set": ["ln-host"]}),
            "no routing between networks"
        );
        assert_eq!(fwd[1][1]["match"]["right"], json!({"set": ["ln-shared"]}));
        assert_eq!(
            fwd[2],
            json!([{"match": {"left": {"meta": {"key": "iifname"}}, "right": "ln-host", "op": "=="}}, {"drop": null}])
        );
        assert_eq!(fwd[3][0]["match"]["right"], "ln-host");
        assert_eq!(fwd[4][0]["match"]["right"], "ln-shared");
        assert_eq!(fwd[4][1], json!({"accept": null}));
        assert_eq!(
            fwd[5][1]["match"]["right"],
            json!(["established", "related"])
        );
        let nat = rules(&doc, "postrouting");
        assert_eq!(nat.len(), 2, "only the shared network is masqueraded");
        assert_eq!(
            nat[0][0]["match"]["right"],
            json!({"prefix": {"addr": "192.168.105.0", "len": 24}})
        );
        assert_eq!(nat[0][1]["match"]["op"], "!=");
        assert_eq!(nat[0][2], json!({"masquerade": null}));
        assert_eq!(
            nat[1][0]["match"],
            json!({"left": {"payload": {"protocol": "ip6", "field": "saddr"}}, "right": {"prefix": {"addr": "fd00:5::", "len": 64}}, "op": "=="}),
            "NAT66 from the network's prefix"
        );
        assert!(rules(&doc, "prerouting").is_empty() && rules(&doc, "output").is_empty());
    }

    #[test]
    fn loopback_addresses_from_vms_are_dropped_before_nat() {
        let doc = ruleset(&nets());
        let chains: Vec<Value> = commands(&doc)
            .into_iter()
            .filter_map(|c| c["add"]["chain"].as_object().cloned().map(Value::Object))
            .collect();
        let guard = chains.iter().find(|c| c["name"] == "guard").unwrap();
        assert_eq!(guard["hook"], "prerouting");
        assert_eq!(
            guard["prio"], -300,
            "raw: before NAT undoes a reply's address"
        );
        let rules = rules(&doc, "guard");
        assert_eq!(rules.len(), 4, "saddr and daddr, on each bridge");
        assert_eq!(
            rules[1][1]["match"]["right"],
            json!({"prefix": {"addr": "127.0.0.0", "len": 8}})
        );
        assert_eq!(rules[1][1]["match"]["left"]["payload"]["field"], "daddr");
        assert_eq!(rules[1][2], json!({"drop": null}));
    }

    fn forward(spec: &str) -> ForwardRule {
        ForwardRule {
            forward: spec.parse().unwrap(),
            guest: "192.168.105.2".parse().unwrap(),
            guest6: Some("fd00:5::2".parse().unwrap()),
            local_uid: None,
        }
    }

    #[test]
    fn a_users_forward_captures_only_that_users_connections_from_the_host() {
        let mut nets = nets();
        nets[0].forwards = vec![ForwardRule {
            local_uid: Some(1000),
            ..forward("8080:80")
        }];
        let doc = ruleset(&nets);
        let out = rules(&doc, "output");
        assert!(!out.is_empty());
        let skuid =
            json!({"match": {"left": {"meta": {"key": "skuid"}}, "right": 1000, "op": "=="}});
        for rule in &out {
            assert!(rule.as_array().unwrap().contains(&skuid), "{rule}");
        }
        for rule in rules(&doc, "prerouting") {
            assert!(!rule.to_string().contains("skuid"), "from outside: anyone");
        }
    }

    #[test]
    fn a_forward_on_all_addresses_is_dnat_for_both_families_from_outside_and_host() {
        let mut nets = nets();
        nets[0].forwards = vec![forward("8080:80")];
        let doc = ruleset(&nets);
        let pre = rules(&doc, "prerouting");
        assert_eq!(pre.len(), 2, "IPv4 and IPv6");
        assert_eq!(
            pre[0],
            json!([
                {"match": {"left": {"meta": {"key": "nfproto"}}, "right": "ipv4", "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "127.0.0.0", "len": 8}}, "op": "!="}},
                {"match": {"left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local", "op": "=="}},
                {"match": {"left": {"meta": {"key": "l4proto"}}, "right": "tcp", "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "th", "field": "dport"}}, "right": 8080, "op": "=="}},
                {"dnat": {"addr": "192.168.105.2", "family": "ip", "port": 80}}
            ]),
            "from outside: any local address but loopback"
        );
        assert_eq!(
            pre[1][4],
            json!({"dnat": {"addr": "fd00:5::2", "family": "ip6", "port": 80}})
        );
        let out = rules(&doc, "output");
        assert_eq!(out.len(), 2);
        let mut from_host = pre[0].as_array().unwrap().clone();
        from_host.remove(1);
        assert_eq!(
            out[0],
            json!(from_host),
            "the host itself, loopback included"
        );
        assert_eq!(
            out[1][1],
            json!({"match": {"left": {"payload": {"protocol": "ip6", "field": "daddr"}}, "right": "::1", "op": "!="}}),
            "::1 cannot be forwarded (no route_localnet in IPv6)"
        );
        let fwd = rules(&doc, "forward");
        assert_eq!(
            &fwd[..2],
            &[
                json!([
                    {"match": {"left": {"meta": {"key": "oifname"}}, "right": "ln-shared", "op": "=="}},
                    {"match": {"left": {"ct": {"key": "status"}}, "right": "dnat", "op": "in"}},
                    {"match": {"left": {"ct": {"key": "direction"}}, "right": "original", "op": "=="}},
                    {"accept": null}
                ]),
                json!([
                    {"match": {"left": {"meta": {"key": "iifname"}}, "right": "ln-shared", "op": "=="}},
                    {"match": {"left": {"ct": {"key": "status"}}, "right": "dnat", "op": "in"}},
                    {"match": {"left": {"ct": {"key": "direction"}}, "right": "reply", "op": "=="}},
                    {"accept": null}
                ])
            ],
            "forwarded connections pass into the network, only their replies out"
        );
        let nat = rules(&doc, "postrouting");
        let hairpin = &nat[nat.len() - 3];
        assert_eq!(hairpin[0]["match"]["right"], "ln-shared");
        assert_eq!(
            hairpin[1]["match"]["right"],
            json!({"prefix": {"addr": "192.168.105.0", "len": 24}}),
            "a VM of the network reaching another through a published port"
        );
        assert_eq!(hairpin[3], json!({"masquerade": null}));
        assert_eq!(
            nat[nat.len() - 2][1]["match"]["left"]["payload"]["protocol"],
            "ip6"
        );
        let localnet = &nat[nat.len() - 1];
        assert_eq!(
            localnet[1]["match"]["right"],
            json!({"prefix": {"addr": "127.0.0.0", "len": 8}})
        );
    }

    /// `nets()` with the gateway 192.168.105.1 on the first, and one VM
    /// there, lnta, at `addrs` with `policy` and `refused` refusals so far.
    fn with_vm(addrs: &[&str], policy: Policy, refused: u64) -> Vec<FirewallNetwork> {
        let mut nets = nets();
        nets[0].gateways = vec!["192.168.105.1".parse().unwrap()];
        nets[0].policies = vec![InterfacePolicy {
            tap: "lnta".into(),
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            policy,
            learned: vec![],
            refused,
        }];
        nets
    }

    #[test]
    fn a_policy_jumps_new_connections_to_its_chains() {
        let policy = Policy {
            egress: vec![
                "198.51.100.1:8080/tcp".parse().unwrap(),
                "10.0.0.0/8".parse().unwrap(),
            ],
            ingress: vec!["8000-8010".parse().unwrap()],
            ..Default::default()
        };
        let mut nets = with_vm(&["192.168.105.2", "fd00:5::2"], policy, 7);
        let doc = ruleset(&nets);
        let fwd = rules(&doc, "forward");
        let vm = json!({"match": {"left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"set": ["192.168.105.2"]}, "op": "=="}});
        assert_eq!(
            fwd[0],
            json!([vm, {"match": {"left": {"ct": {"key": "state"}}, "right": "invalid", "op": "in"}}, {"drop": null}]),
            "first what conntrack cannot place is dropped"
        );
        assert_eq!(
            fwd[1],
            json!([vm, {"match": {"left": {"ct": {"key": "state"}}, "right": {"set": ["new", "untracked"]}, "op": "in"}}, {"jump": {"target": "out-lnta"}}]),
            "then new connections jump to the policy"
        );
        assert_eq!(fwd[3][0]["match"]["left"]["payload"]["protocol"], "ip6");
        assert_eq!(fwd[5][2], json!({"jump": {"target": "in-lnta"}}));
        assert_eq!(rules(&doc, "input").len(), 4, "VM to host: egress");
        assert_eq!(rules(&doc, "local-out").len(), 4, "host to VM: ingress");
        let out = rules(&doc, "out-lnta");
        assert_eq!(
            out[0],
            json!([
                {"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "255.255.255.255", "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "udp", "field": "sport"}}, "right": 68, "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 67, "op": "=="}},
                {"accept": null}
            ]),
            "DHCP broadcast from a client's port"
        );
        assert_eq!(
            out[1][0]["match"]["right"], "192.168.105.1",
            "DHCP to the gateway, and no other host"
        );
        assert_eq!(out[1][1]["match"]["right"], 67);
        assert_eq!(
            out[2][0]["match"]["right"], "192.168.105.1",
            "DNS to the gateway always"
        );
        assert_eq!(
            out[3],
            json!([
                {"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "198.51.100.1", "len": 32}}, "op": "=="}},
                {"match": {"left": {"meta": {"key": "l4proto"}}, "right": "tcp", "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "th", "field": "dport"}}, "right": 8080, "op": "=="}},
                {"accept": null}
            ])
        );
        assert_eq!(
            out[4].as_array().unwrap().len(),
            2,
            "a whole network, any traffic"
        );
        assert_eq!(
            out[5][0]["match"]["left"]["payload"]["protocol"], "icmpv6",
            "ND and MLD"
        );
        assert_eq!(
            out[6],
            json!([{"counter": "refused-lnta"}, {"reject": null}]),
            "refusals counted"
        );
        let counter = commands(&doc)
            .into_iter()
            .find_map(|c| c["add"].get("counter").cloned())
            .unwrap();
        assert_eq!(
            (counter["name"].clone(), counter["packets"].clone()),
            (json!("refused-lnta"), json!(7)),
            "the count carried over"
        );
        let inn = rules(&doc, "in-lnta");
        assert_eq!(
            inn[0],
            json!([
                {"match": {"left": {"payload": {"protocol": "icmp", "field": "type"}}, "right": "echo-request", "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"set": ["192.168.105.1"]}, "op": "=="}},
                {"accept": null}
            ]),
            "with a connect policy, pings from the host only (no IPv6 gateway here: none over IPv6)"
        );
        assert_eq!(
            inn[1][1],
            json!({"match": {"left": {"payload": {"protocol": "th", "field": "dport"}}, "right": {"range": [8000, 8010]}, "op": "=="}})
        );
        assert_eq!(inn[3], json!([{"reject": null}]));
        // A VM that only listens answers anyone's pings.
        nets[0].policies[0].policy.egress.clear();
        let inn = rules(&ruleset(&nets), "in-lnta");
        assert_eq!(inn[0].as_array().unwrap().len(), 2, "{}", inn[0]);
        assert_eq!(inn[1][0]["match"]["right"], "echo-request");
        // Without policies there are no input/output filter chains at all.
        assert!(rules(&ruleset(&super::tests::nets()), "input").is_empty());
    }

    #[test]
    fn a_vm_with_a_connect_policy_and_no_listen_rule_is_reached_only_by_its_published_ports_and_the_host()
     {
        let policy = Policy {
            egress: vec!["198.51.100.1:443/tcp".parse().unwrap()],
            ..Default::default()
        };
        let doc = ruleset(&with_vm(&["192.168.105.2"], policy, 0));
        let inn = rules(&doc, "in-lnta");
        assert_eq!(
            inn[0],
            json!([{"match": {"left": {"ct": {"key": "status"}}, "right": "dnat", "op": "in"}}, {"accept": null}]),
            "its published ports"
        );
        assert_eq!(inn.last().unwrap(), &json!([{"reject": null}]));
        let jumps = |chain: &str| {
            rules(&doc, chain)
                .iter()
                .filter(|r| r.to_string().contains("in-lnta"))
                .count()
        };
        assert_eq!(jumps("forward"), 1, "from other VMs and anything routed");
        assert_eq!(jumps("local-out"), 0, "the host's own connections pass");
    }

    #[test]
    fn refusals_are_read_from_the_counters() {
        let listing = r#"{"nftables": [{"metainfo": {}},
            {"counter": {"family": "inet", "name": "refused-lnt4", "table": "linnet", "handle": 3, "packets": 12, "bytes": 720}},
            {"counter": {"family": "inet", "name": "other", "table": "linnet", "handle": 4, "packets": 1, "bytes": 60}}]}"#;
        assert_eq!(
            refusals_in(listing),
            BTreeMap::from([("lnt4".to_string(), 12)])
        );
    }

    #[test]
    fn names_refuse_other_resolvers_and_accept_their_sets_with_the_learned_elements() {
        let mut nets = nets();
        nets[0].gateways = vec!["192.168.105.1".parse().unwrap()];
        nets[0].policies = vec![InterfacePolicy {
            tap: "lnta".into(),
            addrs: vec!["192.168.105.2".parse().unwrap()],
            policy: Policy {
                egress: vec![
                    "api.example.com:443/tcp".parse().unwrap(),
                    "10.0.0.0/8".parse().unwrap(),
                    "*.cdn.example.net:443/tcp".parse().unwrap(),
                ],
                ingress: vec![],
                ..Default::default()
            },
            learned: vec![Element {
                reach: 0,
                addr: "192.0.2.7".parse().unwrap(),
                seconds: 42,
            }],
            refused: 0,
        }];
        let doc = ruleset(&nets);
        let out = rules(&doc, "out-lnta");
        assert_eq!(
            out[2][0]["match"]["right"], "192.168.105.1",
            "DNS to the gateway first"
        );
        assert_eq!(
            out[3],
            json!([
                {"match": {"left": {"meta": {"key": "l4proto"}}, "right": {"set": ["tcp", "udp"]}, "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "th", "field": "dport"}}, "right": {"set": [53, 853]}, "op": "=="}},
                {"counter": "refused-lnta"},
                {"reject": null}
            ]),
            "then no other resolver, before any rule that could allow one"
        );
        assert_eq!(
            out[4][0]["match"]["right"]["prefix"]["addr"], "10.0.0.0",
            "rules by address before the names': an address they allow is not held"
        );
        assert_eq!(
            out[5],
            json!([
                {"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@n4-lnta-0", "op": "=="}},
                {"match": {"left": {"meta": {"key": "l4proto"}}, "right": "tcp", "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "th", "field": "dport"}}, "right": 443, "op": "=="}},
                {"mangle": {"key": {"ct": {"key": "mark"}}, "value": {"|": [{"&": [{"ct": {"key": "mark"}}, !gate::MASK]}, gate::PENDING]}}},
                {"accept": null}
            ]),
            "one set per family for both 443/tcp names, its connections held for their name"
        );
        assert_eq!(out[6][0]["match"]["right"], "@n6-lnta-0");
        assert_eq!(out.len(), 9, "two set rules, the network, ND, reject");
        let sets: Vec<Value> = commands(&doc)
            .into_iter()
            .filter_map(|c| c["add"].get("set").cloned())
            .collect();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0]["name"], "n4-lnta-0");
        assert_eq!(sets[0]["flags"], json!(["timeout"]));
        assert_eq!(sets[0]["elem"][0]["elem"]["val"], "192.0.2.7");
        assert_eq!(sets[0]["elem"][0]["elem"]["timeout"], 42);
        assert!(sets[1].get("elem").is_none(), "no IPv6 address learned");
    }

    #[test]
    fn a_secret_hosts_connections_on_443_are_redirected_to_the_proxy_and_let_in() {
        let mut nets = nets();
        nets[0].gateways = vec!["192.168.105.1".parse().unwrap()];
        let policy = |secrets: &[&str]| Policy {
            egress: vec!["*.example.com:443/tcp".parse().unwrap()],
            secrets: secrets.iter().map(|r| r.parse().unwrap()).collect(),
            ..Default::default()
        };
        nets[0].policies = vec![
            InterfacePolicy {
                tap: "lnta".into(),
                addrs: vec![
                    "192.168.105.2".parse().unwrap(),
                    "fd00:5::2".parse().unwrap(),
                ],
                policy: policy(&["TOKEN@api.example.com"]),
                learned: vec![Element {
                    reach: 1,
                    addr: "192.0.2.7".parse().unwrap(),
                    seconds: 42,
                }],
                refused: 0,
            },
            InterfacePolicy {
                tap: "lntb".into(),
                addrs: vec!["192.168.105.3".parse().unwrap()],
                policy: policy(&[]),
                learned: vec![],
                refused: 0,
            },
        ];
        // No proxy running: nothing steered, the set is there all the same.
        let doc = ruleset(&nets);
        assert!(
            !serde_json::to_string(&rules(&doc, "prerouting"))
                .unwrap()
                .contains("redirect")
        );
        nets[0].secrets_port = Some(40443);
        let doc = ruleset(&nets);
        let steered: Vec<Value> = rules(&doc, "prerouting")
            .into_iter()
            .filter(|r| r.to_string().contains("redirect"))
            .collect();
        assert_eq!(
            steered,
            [json!([
                {"match": {"left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"set": ["192.168.105.2"]}, "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@n4-lnta-1", "op": "=="}},
                {"match": {"left": {"meta": {"key": "l4proto"}}, "right": "tcp", "op": "=="}},
                {"match": {"left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 443, "op": "=="}},
                {"redirect": {"port": 40443}}
            ])],
            "the VM with a secret rule alone, to its steered set's addresses"
        );
        let let_in = json!([
            {"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "192.168.105.1", "op": "=="}},
            {"match": {"left": {"meta": {"key": "l4proto"}}, "right": "tcp", "op": "=="}},
            {"match": {"left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 40443, "op": "=="}},
            {"match": {"left": {"ct": {"key": "status"}}, "right": "dnat", "op": "in"}},
            {"accept": null}
        ]);
        assert!(
            rules(&doc, "out-lnta").contains(&let_in),
            "redirected, let in"
        );
        assert!(
            !rules(&doc, "out-lntb").contains(&let_in),
            "not the other's"
        );
        let sets: Vec<Value> = commands(&doc)
            .into_iter()
            .filter_map(|c| c["add"].get("set").cloned())
            .filter(|s| s["name"].as_str().unwrap().contains("lnta"))
            .collect();
        let names: Vec<&str> = sets.iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["n4-lnta-0", "n6-lnta-0", "n4-lnta-1", "n6-lnta-1"]);
        assert_eq!(sets[2]["elem"][0]["elem"]["val"], "192.0.2.7");
        // The proxy's uid: its connections, and HTTPS to other machines.
        let out = rules(&doc, "secrets-out");
        let uid = json!({"match": {"left": {"meta": {"key": "skuid"}}, "right": crate::host::SECRETS_UID, "op": "=="}});
        assert_eq!(out.len(), 4, "{out:#?}");
        assert!(out.iter().all(|r| r[0] == uid), "{out:#?}");
        assert_eq!(out[0][2], json!({"accept": null}));
        assert_eq!(out[1][1]["match"]["right"], "local");
        assert_eq!(out[2][2]["match"]["right"], 443);
        assert_eq!(out[3][1], json!({"reject": null}));
    }

    #[test]
    fn a_forward_on_one_address_covers_only_its_family() {
        let mut nets = nets();
        nets[0].forwards = vec![
            forward("127.0.0.1:2222:22/udp"),
            forward("[2001:db8::1]:8443:443"),
        ];
        let doc = ruleset(&nets);
        let out = rules(&doc, "output");
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0][0],
            json!({"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "127.0.0.1", "op": "=="}})
        );
        assert_eq!(
            out[0][1]["match"]["right"], "local",
            "only while the address is the host's"
        );
        assert_eq!(out[0][2]["match"]["right"], "udp");
        assert_eq!(out[0][4]["dnat"]["port"], 22);
        let pre = rules(&doc, "prerouting");
        assert_eq!(pre.len(), 1, "127.0.0.1 is never forwarded from outside");
        assert_eq!(pre[0][0]["match"]["right"], "2001:db8::1");
        assert_eq!(pre[0][1]["match"]["right"], "local");
        assert_eq!(pre[0][4]["dnat"]["family"], "ip6");

        // Without IPv6 on the network, an IPv6 address has nothing to go to.
        let mut v4_only = forward("[2001:db8::1]:8443:443");
        v4_only.guest6 = None;
        assert!(v4_only.targets().is_empty());
        let mut all = forward("8080:80");
        all.guest6 = None;
        assert_eq!(all.targets().len(), 1);
    }
}
