//! What the other firewalls of the namespace do to a linnet network's
//! traffic. A packet dropped by any base chain stays dropped, whatever
//! linnet's own table says, so for each kind of traffic a network needs
//! (its VMs to the internet, the replies, published ports, DHCP and DNS to
//! the gateway, ...) every other table's base chains on its hooks are
//! walked the way the kernel would, with what is known of the packets:
//! interfaces, connection state, protocol and port, addresses. A match that
//! cannot be decided (an xt match, a named set, ...) makes the rule apply to
//! "some" of the traffic: its drops become "may be blocked", its accepts
//! prove nothing. What blocks is named by table, chain and rule, with the
//! command that lets the traffic through. Pure logic, tested on recorded
//! rulesets.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::host::legacy::LegacyChain;
use crate::host::ruleset::{Chain, Owner, Rule, Ruleset};

/// Kinds of traffic a network needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowKind {
    /// New connections from VMs out through the uplink (NAT).
    Outbound,
    /// Replies to them.
    Replies,
    /// Connections from outside to published ports (DNAT).
    Published,
    /// Frames between VMs of one bridge (these pass the IP hooks when
    /// br_netfilter is loaded, as Docker loads it).
    BetweenVms,
    /// DHCP from VMs to the gateway.
    Dhcp,
    /// DNS from VMs to the gateway.
    Dns,
    /// The host's own connections to its VMs (and DHCP/DNS answers).
    FromHost,
}

impl FlowKind {
    pub fn describe(self) -> &'static str {
        match self {
            FlowKind::Outbound => "VMs to the internet",
            FlowKind::Replies => "replies from the internet",
            FlowKind::Published => "connections to published ports",
            FlowKind::BetweenVms => "VM to VM on the bridge",
            FlowKind::Dhcp => "DHCP from VMs to linnet",
            FlowKind::Dns => "DNS from VMs to linnet",
            FlowKind::FromHost => "the host to its VMs",
        }
    }

    /// How a rule names the bridge for this traffic, in iptables and in nft:
    /// as where it comes in, or where it goes.
    fn interface_keys(self) -> (&'static str, &'static str) {
        match self {
            FlowKind::Outbound | FlowKind::BetweenVms | FlowKind::Dhcp | FlowKind::Dns => {
                ("-i", "iifname")
            }
            FlowKind::Replies | FlowKind::Published | FlowKind::FromHost => ("-o", "oifname"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "IPv4",
            Family::Ipv6 => "IPv6",
        })
    }
}

/// An interface as a packet sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Iface {
    Named(String),
    /// Some interface that is not the network's bridge (an uplink whose
    /// name is not known: no default route).
    Other,
}

/// What is known of the packets of one kind of traffic.
#[derive(Debug, Clone)]
pub struct Flow {
    pub kind: FlowKind,
    pub family: Family,
    pub hooks: &'static [&'static str],
    pub iif: Iface,
    pub oif: Iface,
    /// `new` or `established`.
    pub state: &'static str,
    pub dnat: bool,
    /// Transport protocol and destination port, when known.
    pub l4: Option<(&'static str, u16)>,
    pub saddr: Option<IpNet>,
    pub daddr: Option<IpNet>,
}

impl Flow {
    /// The flow as a hook sees it: no output interface yet before routing
    /// (prerouting, input), no input interface on the way out (output,
    /// postrouting).
    fn at_hook(&self, hook: &str) -> Flow {
        let mut f = self.clone();
        let none = Iface::Named(String::new());
        match hook {
            "prerouting" | "input" => f.oif = none,
            "output" | "postrouting" => f.iif = none,
            _ => {}
        }
        f
    }
}

/// What a network is, for the flows it needs.
pub struct NetworkView<'a> {
    pub bridge: &'a str,
    pub shared: bool,
    pub dhcp: bool,
    pub dns: bool,
    pub subnet: IpNet,
    pub gateway: IpAddr,
    /// The network's IPv6 prefix and gateway, when it has IPv6.
    pub ipv6: Option<(IpNet, IpAddr)>,
    /// The uplink of each family (from the default route), if any.
    pub uplink4: Option<&'a str>,
    pub uplink6: Option<&'a str>,
    /// Whether br_netfilter is loaded, so that frames between VMs of one
    /// bridge pass the IP hooks too.
    pub br_netfilter: bool,
}

/// The flows a network needs, in both of its families.
pub fn flows(net: &NetworkView) -> Vec<Flow> {
    let mut out = Vec::new();
    let families = [
        (Family::Ipv4, Some((net.subnet, net.gateway)), net.uplink4),
        (Family::Ipv6, net.ipv6, net.uplink6),
    ];
    for (family, addrs, uplink) in families {
        let Some((subnet, gateway)) = addrs else {
            continue;
        };
        let bridge = || Iface::Named(net.bridge.into());
        let none = || Iface::Named(String::new());
        let uplink = || uplink.map_or(Iface::Other, |u| Iface::Named(u.into()));
        let vm_net = Some(subnet);
        let gw = Some(IpNet::from(gateway));
        let flow = |kind, hooks, iif, oif, state, l4, saddr, daddr| Flow {
            kind,
            family,
            hooks,
            iif,
            oif,
            state,
            dnat: kind == FlowKind::Published,
            l4,
            saddr,
            daddr,
        };
        if net.shared {
            out.push(flow(
                FlowKind::Outbound,
                &["prerouting", "forward", "postrouting"],
                bridge(),
                uplink(),
                "new",
                None,
                vm_net,
                None,
            ));
            out.push(flow(
                FlowKind::Replies,
                &["prerouting", "forward", "postrouting"],
                uplink(),
                bridge(),
                "established",
                None,
                None,
                vm_net,
            ));
        }
        out.push(flow(
            FlowKind::Published,
            &["forward", "postrouting"],
            uplink(),
            bridge(),
            "new",
            None,
            None,
            vm_net,
        ));
        if net.br_netfilter {
            out.push(flow(
                FlowKind::BetweenVms,
                &["forward"],
                bridge(),
                bridge(),
                "new",
                None,
                vm_net,
                vm_net,
            ));
        }
        if net.dhcp && family == Family::Ipv4 {
            out.push(flow(
                FlowKind::Dhcp,
                &["prerouting", "input"],
                bridge(),
                none(),
                "new",
                Some(("udp", 67)),
                None,
                None,
            ));
        }
        if net.dns {
            out.push(flow(
                FlowKind::Dns,
                &["prerouting", "input"],
                bridge(),
                none(),
                "new",
                Some(("udp", 53)),
                vm_net,
                gw,
            ));
        }
        out.push(flow(
            FlowKind::FromHost,
            &["output", "postrouting"],
            none(),
            bridge(),
            "new",
            None,
            None,
            vm_net,
        ));
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passes,
    /// Some of the traffic may be dropped (a rule with matches linnet
    /// cannot decide).
    MayBeBlocked,
    Blocked,
}

/// A chain that drops a network's traffic, and how to let it through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocker {
    /// "ip filter", "inet firewalld", "iptables-legacy filter", ...
    pub table: String,
    /// The base chain the traffic enters.
    pub base_chain: String,
    pub hook: String,
    /// The chain that drops it (the base chain or one it jumps to).
    pub chain: String,
    /// "policy drop", or the rule: "rule 12: reject with icmpx ...".
    pub verdict: String,
    /// Who made the table: docker, firewalld, libvirt, iptables-nft,
    /// iptables-legacy, nft.
    pub owner: String,
    /// A command that lets the traffic through.
    pub fix: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowCheck {
    pub flow: FlowKind,
    pub family: Family,
    pub status: Status,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blockers: Vec<Blocker>,
}

impl FlowCheck {
    /// One line for logs, `linnet ls` and attach replies.
    pub fn warning(&self) -> Option<String> {
        let first = self.blockers.first()?;
        let how = match self.status {
            Status::Passes => return None,
            Status::MayBeBlocked => "may be dropped",
            Status::Blocked => "is dropped",
        };
        Some(format!(
            "{} ({}) {how} by {} chain {} ({}, {}); fix: {}",
            self.flow.describe(),
            self.family,
            first.table,
            first.chain,
            first.verdict,
            first.owner,
            first.fix
        ))
    }
}

/// Walks every base chain (other than linnet's) on the flow's hooks.
pub fn check(rs: &Ruleset, flow: &Flow, bridge: &str) -> FlowCheck {
    let families: &[&str] = match flow.family {
        Family::Ipv4 => &["ip", "inet"],
        Family::Ipv6 => &["ip6", "inet"],
    };
    let mut maybe = Vec::new();
    let mut blocked = Vec::new();
    for hook in flow.hooks {
        let at_hook = flow.at_hook(hook);
        let mut walk = Walk {
            rs,
            flow: &at_hook,
            bridge,
            maybe: Vec::new(),
        };
        for base in rs.base_chains(families, hook) {
            if rs.owner(&base.family, &base.table) == Owner::Linnet {
                continue;
            }
            match walk.chain(base, base, true, 0) {
                End::Drop(b) => blocked.push(b),
                End::Fall { left } if base.policy.as_deref() == Some("drop") => {
                    let b = walk.blocker(base, base, "policy drop".into());
                    if left {
                        walk.note(b);
                    } else {
                        blocked.push(b);
                    }
                }
                _ => {}
            }
        }
        for b in walk.maybe {
            if !maybe.contains(&b) {
                maybe.push(b);
            }
        }
    }
    let (status, blockers) = if !blocked.is_empty() {
        (Status::Blocked, blocked)
    } else if !maybe.is_empty() {
        (Status::MayBeBlocked, maybe)
    } else {
        (Status::Passes, Vec::new())
    };
    FlowCheck {
        flow: flow.kind,
        family: flow.family,
        status,
        blockers,
    }
}

/// Legacy iptables: linnet reads only each built-in chain's policy and how
/// many rules it has (the rules' matches are binary structures of each
/// match module). A DROP policy with no rules blocks for sure; with rules,
/// maybe.
pub fn check_legacy(legacy: &[LegacyChain], flow: &Flow, bridge: &str, check: &mut FlowCheck) {
    let family = match flow.family {
        Family::Ipv4 => "ip",
        Family::Ipv6 => "ip6",
    };
    for chain in legacy.iter().filter(|c| c.family == family) {
        let hook = chain.name.to_ascii_lowercase();
        if !flow.hooks.contains(&hook.as_str()) || chain.policy_accepts {
            continue;
        }
        let sure = chain.rules == 0;
        let verdict = if sure {
            "policy DROP".to_string()
        } else {
            format!("policy DROP after {} rules linnet cannot read", chain.rules)
        };
        let tool = iptables_tool(flow.family, "-legacy");
        let blocker = Blocker {
            table: format!("iptables-legacy {}", chain.table),
            base_chain: chain.name.clone(),
            hook,
            chain: chain.name.clone(),
            verdict,
            owner: "iptables-legacy".into(),
            fix: format!(
                "`{}`",
                iptables_fix(&tool, &chain.table, &chain.name, flow.kind, bridge)
            ),
        };
        match (sure, check.status) {
            (true, Status::Blocked) => check.blockers.push(blocker),
            (true, _) => {
                check.status = Status::Blocked;
                check.blockers = vec![blocker];
            }
            (false, Status::Blocked) => {}
            (false, _) => {
                check.status = Status::MayBeBlocked;
                check.blockers.push(blocker);
            }
        }
    }
}

enum End {
    Accept,
    Drop(Blocker),
    /// The end of the chain, or `return`; `left`: some of the packets may
    /// have been accepted on the way (by a rule that only maybe applied).
    Fall {
        left: bool,
    },
}

/// Statements that let only some packets on (rate limits, quotas, ...).
const MAYBE_STATEMENTS: [&str; 6] = ["limit", "quota", "meter", "ct count", "synproxy", "fwd"];

/// Chains jumped through deeper than this are not followed (nft itself
/// refuses loops; this only bounds the work).
const MAX_DEPTH: usize = 16;

/// Where a walk through a chain is: whether every packet of the flow that
/// entered is still here, and whether some may have been accepted.
struct Place {
    sure: bool,
    left: bool,
}

struct Walk<'a> {
    rs: &'a Ruleset,
    flow: &'a Flow,
    bridge: &'a str,
    /// Drops that apply to some of the traffic.
    maybe: Vec<Blocker>,
}

impl Walk<'_> {
    /// Walks `chain`; `sure` is whether every packet of the flow gets here.
    /// Once a rule that only maybe applies accepts, returns or jumps away,
    /// the rest of the chain sees only some of the packets: from then on
    /// nothing is sure.
    fn chain(&mut self, base: &Chain, chain: &Chain, sure: bool, depth: usize) -> End {
        let mut at = Place { sure, left: false };
        for rule in self.rs.rules(&chain.family, &chain.table, &chain.name) {
            let holds = self.matches(rule);
            if holds == Tri::No {
                continue;
            }
            for (verdict, holds) in self.verdicts(rule, holds) {
                if let Some(end) = self.take(base, chain, rule, verdict, holds, &mut at, depth) {
                    return end;
                }
            }
        }
        End::Fall { left: at.left }
    }

    /// The rule's verdicts and for which packets each holds: one, or one
    /// per entry of a verdict map (the entry whose key is the packets'
    /// surely, others maybe or not at all).
    fn verdicts(&self, rule: &Rule, holds: Tri) -> Vec<(Verdict, Tri)> {
        let Some(vmap) = rule.expr.iter().find_map(|e| e.get("vmap")) else {
            return rule
                .expr
                .iter()
                .find_map(verdict)
                .map(|v| vec![(v, holds)])
                .unwrap_or_default();
        };
        let Some(entries) = vmap["data"]["set"].as_array() else {
            // A named map: any verdict, for any of the packets.
            return vec![(Verdict::Unknown, Tri::Maybe)];
        };
        entries
            .iter()
            .filter_map(|entry| {
                let (key, target) = (entry.get(0)?, entry.get(1)?);
                let key_match = serde_json::json!({"op": "==", "left": vmap["key"], "right": key});
                let holds = holds.and(self.one_match(&key_match));
                (holds != Tri::No).then(|| (verdict(target).unwrap_or(Verdict::Unknown), holds))
            })
            .collect()
    }

    /// Follows one verdict that holds for all of the packets at `at`
    /// (`holds` Yes) or some; returns how the chain ends, if it does here.
    #[allow(clippy::too_many_arguments)]
    fn take(
        &mut self,
        base: &Chain,
        chain: &Chain,
        rule: &Rule,
        verdict: Verdict,
        holds: Tri,
        at: &mut Place,
        depth: usize,
    ) -> Option<End> {
        let applies = holds == Tri::Yes && at.sure;
        match verdict {
            Verdict::Accept if applies => return Some(End::Accept),
            Verdict::Accept => (at.sure, at.left) = (false, true),
            Verdict::Drop => {
                let b = self.blocker(base, chain, describe_rule(rule));
                if applies {
                    return Some(End::Drop(b));
                }
                self.note(b);
            }
            Verdict::Return if applies => return Some(End::Fall { left: at.left }),
            Verdict::Return => at.sure = false,
            Verdict::Unknown => {
                self.note(self.blocker(base, chain, describe_rule(rule)));
                (at.sure, at.left) = (false, true);
            }
            Verdict::Jump(target, goto) => {
                let next = self.rs.chain(&chain.family, &chain.table, &target);
                let Some(next) = next.filter(|_| depth < MAX_DEPTH) else {
                    // Not followed: anything may happen there.
                    (at.sure, at.left) = (false, true);
                    return None;
                };
                match self.chain(base, next, applies, depth + 1) {
                    End::Fall { left } if goto && applies => {
                        return Some(End::Fall {
                            left: at.left || left,
                        });
                    }
                    // Back from a jump, unless some were accepted; not
                    // back from a goto that only some packets took.
                    End::Fall { left } => {
                        at.left |= left;
                        if left || goto {
                            at.sure = false;
                        }
                    }
                    end if applies => return Some(end),
                    _ => (at.sure, at.left) = (false, true),
                }
            }
        }
        None
    }

    /// A drop that applies to some of the traffic (once).
    fn note(&mut self, b: Blocker) {
        if !self.maybe.contains(&b) {
            self.maybe.push(b);
        }
    }

    fn blocker(&self, base: &Chain, chain: &Chain, verdict: String) -> Blocker {
        let owner = self.rs.owner(&base.family, &base.table);
        let table = format!("{} {}", base.family, base.table);
        let fix = fix(owner, base, self.flow.kind, self.flow.family, self.bridge);
        Blocker {
            table,
            base_chain: base.name.clone(),
            hook: base.hook.clone().unwrap_or_default(),
            chain: chain.name.clone(),
            verdict,
            owner: owner_name(owner).into(),
            fix,
        }
    }

    /// Whether all of the rule's matches hold for the flow.
    fn matches(&self, rule: &Rule) -> Tri {
        let mut all = Tri::Yes;
        for e in &rule.expr {
            let t = if let Some(m) = e.get("match") {
                self.one_match(m)
            } else if e["xt"]["type"] == "match"
                || MAYBE_STATEMENTS.iter().any(|k| e.get(*k).is_some())
            {
                Tri::Maybe
            } else {
                continue;
            };
            all = all.and(t);
            if all == Tri::No {
                break;
            }
        }
        all
    }

    fn one_match(&self, m: &Value) -> Tri {
        let op = m.get("op").and_then(Value::as_str).unwrap_or("==");
        if !matches!(op, "==" | "!=" | "in") {
            return Tri::Maybe; // <, >, ranges of ports, ...
        }
        let (left, right) = (&m["left"], &m["right"]);
        let flow = self.flow;
        let t = if let Some(meta) = left.get("meta") {
            match meta.get("key").and_then(Value::as_str) {
                Some("iifname") => iface_match(&flow.iif, right, self.bridge),
                Some("oifname") => iface_match(&flow.oif, right, self.bridge),
                Some("l4proto") => match flow.l4 {
                    Some((proto, _)) => any_is(right, proto),
                    None => Tri::Maybe,
                },
                Some("nfproto") => any_is(
                    right,
                    match flow.family {
                        Family::Ipv4 => "ipv4",
                        Family::Ipv6 => "ipv6",
                    },
                ),
                _ => Tri::Maybe,
            }
        } else if let Some(ct) = left.get("ct") {
            match ct.get("key").and_then(Value::as_str) {
                Some("state") => any_is(right, flow.state),
                Some("status") if any_is(right, "dnat") == Tri::Yes => Tri::from(flow.dnat),
                _ => Tri::Maybe,
            }
        } else if let Some(p) = left.get("payload") {
            self.payload_match(p, right)
        } else {
            Tri::Maybe
        };
        match op {
            "!=" => t.not(),
            _ => t,
        }
    }

    fn payload_match(&self, p: &Value, right: &Value) -> Tri {
        let flow = self.flow;
        let protocol = p.get("protocol").and_then(Value::as_str).unwrap_or("");
        let field = p.get("field").and_then(Value::as_str).unwrap_or("");
        match protocol {
            "ip" | "ip6" => {
                let own = matches!(
                    (protocol, flow.family),
                    ("ip", Family::Ipv4) | ("ip6", Family::Ipv6)
                );
                if !own {
                    return Tri::No;
                }
                let addr = match field {
                    "saddr" => flow.saddr,
                    "daddr" => flow.daddr,
                    _ => None,
                };
                addr.map_or(Tri::Maybe, |a| addr_match(a, right))
            }
            "tcp" | "udp" | "th" => {
                let Some((proto, port)) = flow.l4 else {
                    return Tri::Maybe;
                };
                if protocol != "th" && protocol != proto {
                    return Tri::No;
                }
                if field == "dport" {
                    any_is(right, &port.to_string())
                } else {
                    Tri::Maybe
                }
            }
            "icmp" | "icmpv6" if flow.l4.is_some() => Tri::No,
            _ => Tri::Maybe,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tri {
    Yes,
    No,
    Maybe,
}

impl Tri {
    fn and(self, other: Tri) -> Tri {
        match (self, other) {
            (Tri::No, _) | (_, Tri::No) => Tri::No,
            (Tri::Yes, Tri::Yes) => Tri::Yes,
            _ => Tri::Maybe,
        }
    }

    fn not(self) -> Tri {
        match self {
            Tri::Yes => Tri::No,
            Tri::No => Tri::Yes,
            Tri::Maybe => Tri::Maybe,
        }
    }
}

impl From<bool> for Tri {
    fn from(b: bool) -> Tri {
        if b { Tri::Yes } else { Tri::No }
    }
}

enum Verdict {
    Accept,
    Drop,
    Return,
    /// Any of them (a named verdict map, `queue` to a program).
    Unknown,
    /// Target chain; true for goto.
    Jump(String, bool),
}

fn verdict(e: &Value) -> Option<Verdict> {
    let obj = e.as_object()?;
    let (key, body) = obj.iter().next()?;
    Some(match key.as_str() {
        "accept" => Verdict::Accept,
        "drop" | "reject" => Verdict::Drop,
        // iptables-nft's `-j REJECT` (other xt targets do not end the walk).
        "xt" if body["type"] == "target" && body["name"] == "REJECT" => Verdict::Drop,
        "queue" => Verdict::Unknown,
        "return" => Verdict::Return,
        "jump" | "goto" => Verdict::Jump(body.get("target")?.as_str()?.to_owned(), key == "goto"),
        _ => return None,
    })
}

/// A rule's right-hand side as strings: one value, a list or an anonymous
/// set of them. None when it cannot be known here: a named set (`@name`),
/// a range, a map.
fn values(right: &Value) -> Option<Vec<String>> {
    let list = match right {
        Value::Array(items) => items.as_slice(),
        Value::Object(o) => match o.get("set") {
            Some(Value::Array(items)) if o.len() == 1 => items.as_slice(),
            _ => return None,
        },
        other => std::slice::from_ref(other),
    };
    list.iter()
        .map(|v| match v {
            Value::String(s) if !s.starts_with('@') => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .collect()
}

/// Whether `value` is among the rule's right-hand side.
fn any_is(right: &Value, value: &str) -> Tri {
    values(right).map_or(Tri::Maybe, |vs| Tri::from(vs.iter().any(|v| v == value)))
}

/// An interface name against one or more names, `*` as a trailing wildcard.
fn iface_match(iface: &Iface, right: &Value, bridge: &str) -> Tri {
    let Some(names) = values(right) else {
        return Tri::Maybe; // a named set, a map, ...
    };
    let fits = |name: &str, pattern: &str| match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    };
    match iface {
        Iface::Named(name) => Tri::from(names.iter().any(|p| fits(name, p))),
        // Not the bridge; any other name might be it.
        Iface::Other => {
            if names.iter().all(|p| fits(bridge, p) && !p.ends_with('*')) {
                Tri::No
            } else {
                Tri::Maybe
            }
        }
    }
}

/// An address range of the flow against a rule's prefixes and addresses.
fn addr_match(addr: IpNet, right: &Value) -> Tri {
    let nets: Vec<Option<IpNet>> = match right {
        Value::Object(o) if o.contains_key("set") => o["set"]
            .as_array()
            .map(|items| items.iter().map(net_of).collect())
            .unwrap_or_default(),
        other => vec![net_of(other)],
    };
    let mut result = Tri::No;
    for net in nets {
        // Two prefixes are nested or disjoint.
        let t = match net {
            Some(n) if n.contains(&addr) => Tri::Yes,
            Some(n) if !addr.contains(&n) => Tri::No,
            _ => Tri::Maybe,
        };
        result = match (result, t) {
            (Tri::Yes, _) | (_, Tri::Yes) => Tri::Yes,
            (Tri::Maybe, _) | (_, Tri::Maybe) => Tri::Maybe,
            _ => Tri::No,
        };
    }
    result
}

fn net_of(v: &Value) -> Option<IpNet> {
    match v {
        Value::String(s) => s.parse::<IpAddr>().ok().map(IpNet::from),
        Value::Object(o) => {
            let p = o.get("prefix")?;
            let addr: IpAddr = p.get("addr")?.as_str()?.parse().ok()?;
            IpNet::new(addr, p.get("len")?.as_u64()? as u8).ok()
        }
        _ => None,
    }
}

/// A rule in a few words: "rule 12: iifname lo, reject".
fn describe_rule(rule: &Rule) -> String {
    let parts: Vec<String> = rule
        .expr
        .iter()
        .filter_map(|e| {
            let (key, body) = e.as_object()?.iter().next()?;
            Some(match key.as_str() {
                "match" => {
                    let left = body["left"]
                        .as_object()
                        .and_then(|o| o.values().next())
                        .and_then(|l| {
                            l.get("key")
                                .or_else(|| l.get("field"))
                                .and_then(Value::as_str)
                        })
                        .unwrap_or("?");
                    let op = body["op"].as_str().unwrap_or("==");
                    let right = values(&body["right"]).map_or("…".into(), |v| v.join(","));
                    format!("{left} {op} {right}")
                }
                "xt" => format!("xt {}", body["name"].as_str().unwrap_or("?")),
                "counter" => return None,
                "jump" | "goto" => format!("{key} {}", body["target"].as_str().unwrap_or("?")),
                other => other.to_string(),
            })
        })
        .collect();
    format!("rule {}: {}", rule.handle, parts.join(", "))
}

pub fn owner_name(owner: Owner) -> &'static str {
    match owner {
        Owner::Linnet => "linnet",
        Owner::Docker => "docker",
        Owner::Firewalld => "firewalld",
        Owner::Libvirt => "libvirt",
        Owner::IptablesNft => "iptables-nft",
        Owner::Nft => "nft",
    }
}

fn iptables_tool(family: Family, suffix: &str) -> String {
    match family {
        Family::Ipv4 => format!("iptables{suffix}"),
        Family::Ipv6 => format!("ip6tables{suffix}"),
    }
}

/// `iptables -I CHAIN -i BRIDGE -j ACCEPT`, with `-t TABLE` but for filter
/// and `-o` for traffic into the bridge.
fn iptables_fix(tool: &str, table: &str, chain: &str, kind: FlowKind, bridge: &str) -> String {
    let (dir, _) = kind.interface_keys();
    let table = if table == "filter" {
        String::new()
    } else {
        format!("-t {table} ")
    };
    format!("{tool} {table}-I {chain} {dir} {bridge} -j ACCEPT")
}

/// The command that lets `kind` through the table's base chain `base`.
fn fix(owner: Owner, base: &Chain, kind: FlowKind, family: Family, bridge: &str) -> String {
    let tool = iptables_tool(family, "");
    match owner {
        Owner::Docker if base.name == "FORWARD" => format!(
            "let linnet add its accept rules to DOCKER-USER (the default; remove `docker_user: false` from the config's `firewall:`), or run `{}`",
            iptables_fix(&tool, "filter", "DOCKER-USER", kind, bridge)
        ),
        Owner::Firewalld => format!(
            "`firewall-cmd --zone=trusted --change-interface={bridge}` (and again with --permanent)"
        ),
        Owner::Docker | Owner::IptablesNft => {
            format!(
                "`{}`",
                iptables_fix(&tool, &base.table, &base.name, kind, bridge)
            )
        }
        _ => {
            let (_, dir) = kind.interface_keys();
            format!(
                "`nft insert rule {} {} {} {dir} {bridge} accept`",
                base.family, base.table, base.name
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::ruleset::recorded;

    const BRIDGE: &str = "lnbr-shared";

    fn view(uplink: Option<&'static str>) -> NetworkView<'static> {
        NetworkView {
            bridge: BRIDGE,
            shared: true,
            dhcp: true,
            dns: true,
            subnet: "192.168.105.0/24".parse().unwrap(),
            gateway: "192.168.105.1".parse().unwrap(),
            ipv6: Some((
                "fd12:3456:789a:1::/64".parse().unwrap(),
                "fd12:3456:789a:1::1".parse().unwrap(),
            )),
            uplink4: uplink,
            uplink6: uplink,
            br_netfilter: true,
        }
    }

    fn checks(name: &str, uplink: Option<&'static str>) -> Vec<FlowCheck> {
        let rs = Ruleset::parse(&recorded(name)).unwrap();
        flows(&view(uplink))
            .iter()
            .map(|f| check(&rs, f, BRIDGE))
            .collect()
    }

    fn status(checks: &[FlowCheck], kind: FlowKind, family: Family) -> &FlowCheck {
        checks
            .iter()
            .find(|c| c.flow == kind && c.family == family)
            .unwrap_or_else(|| panic!("no {kind:?} {family:?}"))
    }

    fn assert_all_pass(recording: &str) {
        for c in checks(recording, Some("eth0")) {
            assert_eq!(c.status, Status::Passes, "{recording}: {c:?}");
        }
    }

    #[test]
    fn empty_ruleset_blocks_nothing() {
        assert_all_pass("empty");
    }

    #[test]
    fn docker_forward_policy_blocks_forwarding_only() {
        let c = checks("docker", Some("eth0"));
        for kind in [
            FlowKind::Outbound,
            FlowKind::Replies,
            FlowKind::Published,
            FlowKind::BetweenVms,
        ] {
            let v4 = status(&c, kind, Family::Ipv4);
            assert_eq!(v4.status, Status::Blocked, "{v4:?}");
            let b = &v4.blockers[0];
            assert_eq!(
                (b.table.as_str(), b.chain.as_str(), b.verdict.as_str()),
                ("ip filter", "FORWARD", "policy drop")
            );
            assert_eq!(b.owner, "docker");
            assert!(b.fix.contains("DOCKER-USER"), "{}", b.fix);
            // No ip6tables rules in this recording.
            assert_eq!(status(&c, kind, Family::Ipv6).status, Status::Passes);
        }
        let out = status(&c, FlowKind::Outbound, Family::Ipv4);
        assert!(out.blockers[0].fix.contains("-i lnbr-shared"));
        let replies = status(&c, FlowKind::Replies, Family::Ipv4);
        assert!(replies.blockers[0].fix.contains("-o lnbr-shared"));
        for kind in [FlowKind::Dhcp, FlowKind::Dns, FlowKind::FromHost] {
            assert_eq!(status(&c, kind, Family::Ipv4).status, Status::Passes);
        }
        let warning = out.warning().unwrap();
        assert!(
            warning.starts_with("VMs to the internet (IPv4) is dropped by ip filter chain FORWARD (policy drop, docker)"),
            "{warning}"
        );
    }

    #[test]
    fn docker_user_accept_lets_it_pass() {
        let mut json: Value = serde_json::from_str(&recorded("docker")).unwrap();
        let items = json["nftables"].as_array_mut().unwrap();
        for (handle, key) in [(100, "iifname"), (101, "oifname")] {
            items.push(serde_json::json!({"rule": {
                "family": "ip", "table": "filter", "chain": "DOCKER-USER", "handle": handle,
                "comment": "linnet network shared",
                "expr": [{"match": {"op": "==", "left": {"meta": {"key": key}}, "right": BRIDGE}}, {"accept": null}]
            }}));
        }
        // Inserted rules come first.
        let user: Vec<Value> = items.drain(items.len() - 2..).collect();
        let at = items
            .iter()
            .position(|i| i["rule"]["chain"] == "DOCKER-USER")
            .unwrap();
        for (k, r) in user.into_iter().enumerate() {
            items.insert(at + k, r);
        }
        let rs = Ruleset::parse(&json.to_string()).unwrap();
        for f in flows(&view(Some("eth0"))) {
            assert_eq!(check(&rs, &f, BRIDGE).status, Status::Passes, "{f:?}");
        }
    }

    #[test]
    fn ufw_input_policy_may_block_dhcp_and_dns() {
        let c = checks("ufw", Some("eth0"));
        let dhcp = status(&c, FlowKind::Dhcp, Family::Ipv4);
        // Before the DROP policy, iptables' `-m conntrack --ctstate
        // RELATED,ESTABLISHED -j ACCEPT` is an xt match nft cannot show:
        // it may accept some of the traffic, so the policy "may" block.
        assert_eq!(dhcp.status, Status::MayBeBlocked, "{dhcp:?}");
        assert_eq!(dhcp.blockers[0].verdict, "policy drop");
        assert_eq!(dhcp.blockers[0].chain, "INPUT");
        assert_eq!(dhcp.blockers[0].owner, "iptables-nft");
        assert_eq!(
            dhcp.blockers[0].fix,
            "`iptables -I INPUT -i lnbr-shared -j ACCEPT`"
        );
        // FORWARD: policy drop and no rules.
        assert_eq!(
            status(&c, FlowKind::Outbound, Family::Ipv4).status,
            Status::Blocked
        );
        assert_eq!(
            status(&c, FlowKind::FromHost, Family::Ipv4).status,
            Status::Passes
        );
    }

    #[test]
    fn firewalld_rejects_unzoned_forwarding_and_input() {
        let c = checks("firewalld", Some("eth1"));
        let out = status(&c, FlowKind::Outbound, Family::Ipv4);
        assert_eq!(out.status, Status::Blocked, "{out:?}");
        let b = &out.blockers[0];
        assert_eq!(b.table, "inet firewalld");
        assert_eq!(b.base_chain, "filter_FORWARD");
        assert!(b.verdict.contains("reject"), "{}", b.verdict);
        assert!(b.fix.contains("firewall-cmd --zone=trusted"), "{}", b.fix);
        // Established replies and DNATed connections are accepted first.
        for kind in [FlowKind::Replies, FlowKind::Published] {
            assert_eq!(status(&c, kind, Family::Ipv4).status, Status::Passes);
        }
        assert_eq!(
            status(&c, FlowKind::Dns, Family::Ipv6).status,
            Status::Blocked
        );
        // With the default zone's uplink, forwarding out is allowed.
        let c = checks("firewalld", Some("eth0"));
        assert_eq!(
            status(&c, FlowKind::Outbound, Family::Ipv4).status,
            Status::Passes
        );
    }

    #[test]
    fn libvirt_rules_leave_other_bridges_alone() {
        assert_all_pass("libvirt");
    }

    #[test]
    fn foreign_drop_policy_and_unknown_uplink() {
        let c = checks("foreign-drop", None);
        let out = status(&c, FlowKind::Outbound, Family::Ipv6);
        assert_eq!(out.status, Status::Blocked);
        assert_eq!(out.blockers[0].owner, "nft");
        assert_eq!(
            out.blockers[0].fix,
            "`nft insert rule inet filter forward iifname lnbr-shared accept`"
        );
        assert_eq!(
            status(&c, FlowKind::Dhcp, Family::Ipv4).status,
            Status::Passes
        );
    }

    #[test]
    fn undecidable_matches_make_maybe() {
        let rs = Ruleset::parse(
            r#"{"nftables": [
            {"chain": {"family": "inet", "table": "t", "name": "fwd", "hook": "forward", "prio": 0, "policy": "accept"}},
            {"rule": {"family": "inet", "table": "t", "chain": "fwd", "handle": 4, "expr": [
                {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 25}},
                {"drop": null}]}},
            {"rule": {"family": "inet", "table": "t", "chain": "fwd", "handle": 5, "expr": [
                {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": "eth9"}},
                {"drop": null}]}}
        ]}"#,
        )
        .unwrap();
        let c: Vec<FlowCheck> = flows(&view(Some("eth0")))
            .iter()
            .map(|f| check(&rs, f, BRIDGE))
            .collect();
        let out = status(&c, FlowKind::Outbound, Family::Ipv4);
        assert_eq!(out.status, Status::MayBeBlocked);
        assert_eq!(out.blockers.len(), 1, "eth9 is not the uplink: {out:?}");
        assert_eq!(out.blockers[0].verdict, "rule 4: dport == 25, drop");
        // Unknown uplink: the eth9 rule might apply too.
        let c: Vec<FlowCheck> = flows(&view(None))
            .iter()
            .map(|f| check(&rs, f, BRIDGE))
            .collect();
        assert_eq!(
            status(&c, FlowKind::Outbound, Family::Ipv4).blockers.len(),
            2
        );
    }

    /// A forward base chain with `rules` before a drop policy.
    fn forward_chain(rules: &[Value]) -> Ruleset {
        let mut items = vec![serde_json::json!({"chain": {"family": "inet", "table": "t",
            "name": "fwd", "hook": "forward", "prio": 0, "policy": "drop"}})];
        for (i, expr) in rules.iter().enumerate() {
            items.push(serde_json::json!({"rule": {"family": "inet", "table": "t",
                "chain": "fwd", "handle": i + 2, "expr": expr}}));
        }
        Ruleset::parse(&serde_json::json!({ "nftables": items }).to_string()).unwrap()
    }

    fn outbound(rs: &Ruleset) -> FlowCheck {
        flow_check(rs, FlowKind::Outbound)
    }

    #[test]
    fn named_sets_ranges_and_comparisons_are_undecidable() {
        let iif = |right: Value, op: &str| serde_json::json!([{"match": {"op": op, "left": {"meta": {"key": "iifname"}}, "right": right}}, {"accept": null}]);
        for (right, op) in [
            (serde_json::json!("@trusted"), "=="),
            (serde_json::json!("@trusted"), "!="),
            (serde_json::json!({"range": ["a", "z"]}), "=="),
            (serde_json::json!("eth0"), "<"),
        ] {
            let c = outbound(&forward_chain(&[iif(right.clone(), op)]));
            assert_eq!(c.status, Status::MayBeBlocked, "{right} {op}: {c:?}");
        }
        // Decidable: the bridge by name accepts all of it.
        let c = outbound(&forward_chain(&[iif(serde_json::json!(BRIDGE), "==")]));
        assert_eq!(c.status, Status::Passes);
        let c = outbound(&forward_chain(&[iif(
            serde_json::json!({"set": ["x", BRIDGE]}),
            "==",
        )]));
        assert_eq!(c.status, Status::Passes);
    }

    #[test]
    fn an_xt_reject_target_drops_and_other_targets_do_not_decide() {
        let reject = serde_json::json!([{"xt": {"type": "target", "name": "REJECT"}}]);
        let log = serde_json::json!([{"xt": {"type": "target", "name": "LOG"}}, {"accept": null}]);
        let c = outbound(&forward_chain(&[log]));
        assert_eq!(c.status, Status::Passes, "LOG then accept: {c:?}");
        let rs = forward_chain(&[reject]);
        let c = outbound(&rs);
        assert_eq!(c.status, Status::Blocked);
        assert_eq!(c.blockers[0].verdict, "rule 2: xt REJECT");
    }

    #[test]
    fn what_a_maybe_rule_lets_go_is_not_surely_dropped_later() {
        let maybe_accept =
            serde_json::json!([{"xt": {"type": "match", "name": "conntrack"}}, {"accept": null}]);
        let c = outbound(&forward_chain(&[maybe_accept]));
        assert_eq!(c.status, Status::MayBeBlocked);
        // The same through a jumped-to chain.
        let rs = Ruleset::parse(&serde_json::json!({"nftables": [
            {"chain": {"family": "inet", "table": "t", "name": "fwd", "hook": "forward", "prio": 0, "policy": "drop"}},
            {"chain": {"family": "inet", "table": "t", "name": "sub"}},
            {"rule": {"family": "inet", "table": "t", "chain": "fwd", "handle": 2, "expr": [{"jump": {"target": "sub"}}]}},
            {"rule": {"family": "inet", "table": "t", "chain": "sub", "handle": 3, "expr": [
                {"xt": {"type": "match", "name": "conntrack"}}, {"accept": null}]}}
        ]}).to_string()).unwrap();
        assert_eq!(outbound(&rs).status, Status::MayBeBlocked);
        // A sure accept in the jumped-to chain passes all of it.
        let rs = Ruleset::parse(&serde_json::json!({"nftables": [
            {"chain": {"family": "inet", "table": "t", "name": "fwd", "hook": "forward", "prio": 0, "policy": "drop"}},
            {"chain": {"family": "inet", "table": "t", "name": "sub"}},
            {"rule": {"family": "inet", "table": "t", "chain": "fwd", "handle": 2, "expr": [{"jump": {"target": "sub"}}]}},
            {"rule": {"family": "inet", "table": "t", "chain": "sub", "handle": 3, "expr": [{"accept": null}]}}
        ]}).to_string()).unwrap();
        assert_eq!(outbound(&rs).status, Status::Passes);
    }

    fn flow_check(rs: &Ruleset, kind: FlowKind) -> FlowCheck {
        let flow = flows(&view(Some("eth0")))
            .into_iter()
            .find(|f| f.kind == kind && f.family == Family::Ipv4)
            .unwrap();
        check(rs, &flow, BRIDGE)
    }

    #[test]
    fn verdict_maps_pick_the_flows_entry() {
        let vmap = |key: Value, entries: Value| serde_json::json!([{"vmap": {"key": key, "data": {"set": entries}}}]);
        let ct_state = vmap(
            serde_json::json!({"ct": {"key": "state"}}),
            serde_json::json!([["established", {"accept": null}], ["related", {"accept": null}], ["invalid", {"drop": null}]]),
        );
        let rs = forward_chain(&[ct_state]);
        assert_eq!(flow_check(&rs, FlowKind::Replies).status, Status::Passes);
        let out = flow_check(&rs, FlowKind::Outbound);
        assert_eq!(
            out.status,
            Status::Blocked,
            "new connections reach the policy"
        );
        assert_eq!(out.blockers[0].verdict, "policy drop");
        let by_iface = vmap(
            serde_json::json!({"meta": {"key": "iifname"}}),
            serde_json::json!([[BRIDGE, {"drop": null}], ["eth0", {"accept": null}]]),
        );
        let rs = forward_chain(&[by_iface]);
        let out = flow_check(&rs, FlowKind::Outbound);
        assert_eq!(out.status, Status::Blocked);
        assert!(
            out.blockers[0].verdict.starts_with("rule 2: vmap"),
            "{out:?}"
        );
        assert_eq!(flow_check(&rs, FlowKind::Replies).status, Status::Passes);
        // A named map: anything may happen.
        let named = serde_json::json!([{"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@by_iface"}}]);
        let c = outbound(&forward_chain(&[named]));
        assert_eq!(c.status, Status::MayBeBlocked, "{c:?}");
    }

    #[test]
    fn rate_limits_make_a_drop_maybe() {
        let limited = serde_json::json!([{"limit": {"rate": 50, "per": "second", "inv": true}}, {"drop": null}]);
        let rs = Ruleset::parse(&serde_json::json!({"nftables": [
            {"chain": {"family": "inet", "table": "t", "name": "fwd", "hook": "forward", "prio": 0, "policy": "accept"}},
            {"rule": {"family": "inet", "table": "t", "chain": "fwd", "handle": 2, "expr": limited}}
        ]}).to_string()).unwrap();
        assert_eq!(outbound(&rs).status, Status::MayBeBlocked);
    }

    #[test]
    fn fixes_name_the_table_and_between_vms_needs_br_netfilter() {
        let rs = Ruleset::parse(&serde_json::json!({"nftables": [
            {"chain": {"family": "ip", "table": "raw", "name": "PREROUTING", "hook": "prerouting", "prio": -300, "policy": "drop"}}
        ]}).to_string()).unwrap();
        let c = outbound(&rs);
        assert_eq!(c.blockers[0].owner, "iptables-nft");
        assert_eq!(
            c.blockers[0].fix,
            "`iptables -t raw -I PREROUTING -i lnbr-shared -j ACCEPT`"
        );
        let mut v = view(Some("eth0"));
        v.br_netfilter = false;
        assert!(flows(&v).iter().all(|f| f.kind != FlowKind::BetweenVms));
        assert!(
            flows(&view(None))
                .iter()
                .any(|f| f.kind == FlowKind::BetweenVms)
        );
    }

    #[test]
    fn legacy_policy() {
        let flow = flows(&view(Some("eth0")))
            .into_iter()
            .find(|f| f.kind == FlowKind::Outbound && f.family == Family::Ipv4)
            .unwrap();
        let chain = |rules| LegacyChain {
            family: "ip",
            table: "filter".into(),
            name: "FORWARD".into(),
            policy_accepts: false,
            rules,
        };
        let mut c = check(&Ruleset::default(), &flow, BRIDGE);
        check_legacy(&[chain(0)], &flow, BRIDGE, &mut c);
        assert_eq!(c.status, Status::Blocked);
        assert_eq!(
            c.blockers[0].fix,
            "`iptables-legacy -I FORWARD -i lnbr-shared -j ACCEPT`"
        );
        let mut c = check(&Ruleset::default(), &flow, BRIDGE);
        check_legacy(&[chain(3)], &flow, BRIDGE, &mut c);
        assert_eq!(c.status, Status::MayBeBlocked);
        assert!(c.blockers[0].verdict.contains("3 rules"));
    }
}
