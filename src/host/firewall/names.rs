//! Connect rules by name, in `inet linnet`: a VM whose policy names DNS
//! names reaches the addresses linnet's DNS gave it for them, each in a
//! set of its own per reach of the policy (`n4-TAP-K`, `n6-TAP-K`: K the
//! index into `Policy::name_reaches`), with a timeout per element, so the
//! kernel forgets an address when its answer's (bounded) TTL has passed.
//! Such a VM asks no resolver but the gateway: DNS (TCP and UDP 53) and
//! DNS over TLS or QUIC (853) to anyone else is refused before any rule
//! of its policy could allow it.
//!
//! The table is rebuilt whole (`super::ruleset`) with every element the
//! daemon holds (`learned::Learned`); between rebuilds the DNS forwarder
//! puts each new element in (`put`) before it releases the answer.

use std::borrow::Cow;
use std::net::IpAddr;

use nftables::batch::Batch;
use nftables::expr::{Elem, Expression, NamedExpression, SetItem};
use nftables::schema::{NfListObject, Set, SetFlag, SetType, SetTypeValue};
use nftables::stmt::{Counter as StmtCounter, Statement};
use serde_json::Value;

use nftables::stmt::NAT;

use super::{
    FAMILY, FirewallNetwork, InterfacePolicy, accept, eq, payload, protocol_match, reach_match,
    refused_counter, set, string,
};
use crate::host::NFT_TABLE;
use crate::host::nft::{Nft, NftError};
use crate::learned::Element;
use crate::policy::SECRET_PORT;

/// DNS, and DNS over TLS (and over QUIC, on UDP).
const RESOLVER_PORTS: [u32; 2] = [53, 853];

/// The set of `tap`'s addresses of `addr`'s family for its policy's reach
/// `reach`.
pub fn set_name(tap: &str, v6: bool, reach: usize) -> String {
    format!("n{}-{tap}-{reach}", if v6 { 6 } else { 4 })
}

/// `set_name` read back: (tap, v6, reach).
fn parse_set_name(name: &str) -> Option<(&str, bool, usize)> {
    let v6 = match name.get(..3)? {
        "n4-" => false,
        "n6-" => true,
        _ => return None,
    };
    let (tap, reach) = name[3..].rsplit_once('-')?;
    Some((tap, v6, reach.parse().ok()?))
}

/// Declares the VM's sets, with the elements it has now.
pub(super) fn add_sets(batch: &mut Batch<'static>, iface: &InterfacePolicy) {
    for reach in 0..iface.policy.learned_sets() {
        for v6 in [false, true] {
            let elements: Vec<Expression<'static>> = iface
                .learned
                .iter()
                .filter(|e| e.reach == reach && e.addr.is_ipv6() == v6)
                .map(element)
                .collect();
            batch.add(NfListObject::Set(Box::new(Set {
                family: FAMILY,
                table: Cow::Borrowed(NFT_TABLE),
                name: Cow::Owned(set_name(&iface.tap, v6, reach)),
                set_type: SetTypeValue::Single(if v6 {
                    SetType::Ipv6Addr
                } else {
                    SetType::Ipv4Addr
                }),
                flags: Some([SetFlag::Timeout].into_iter().collect()),
                elem: (!elements.is_empty()).then_some(Cow::Owned(elements)),
                ..Default::default()
            })));
        }
    }
}

/// The VM's policy chain's first rule for names: other resolvers refused
/// (and counted with the chain's other refusals) before any rule of its
/// policy could allow them. None for a policy without names.
pub(super) fn resolvers(iface: &InterfacePolicy) -> Option<Vec<Statement<'static>>> {
    if !iface.policy.has_names() {
        return None;
    }
    Some(vec![
        protocol_match(None),
        eq(
            payload("th", "dport"),
            Expression::Named(NamedExpression::Set(
                RESOLVER_PORTS
                    .iter()
                    .map(|p| SetItem::Element(Expression::Number(*p)))
                    .collect(),
            )),
        ),
        Statement::Counter(StmtCounter::Named(Cow::Owned(refused_counter(&iface.tap)))),
        Statement::Reject(None),
    ])
}

/// Its rules for the learned sets, after its rules by address (an address
/// a rule allows by itself is not held for its name): each reach's sets
/// accepted, a checked reach's connections marked to be held
/// (`super::gate`).
pub(super) fn reaches(iface: &InterfacePolicy) -> Vec<Vec<Statement<'static>>> {
    let mut out = Vec::new();
    for (k, reach) in iface.policy.name_reaches().iter().enumerate() {
        for (family, v6) in [("ip", false), ("ip6", true)] {
            let mut rule = vec![eq(
                payload(family, "daddr"),
                string(&format!("@{}", set_name(&iface.tap, v6, k))),
            )];
            rule.extend(reach_match(*reach));
            if reach.checked() {
                rule.push(super::gate::pending());
            }
            rule.push(accept());
            out.push(rule);
        }
    }
    out
}

/// The network's rules that steer its VMs' connections to port 443 of an
/// address learned for a secret rule's host (the VM's steered set) to its
/// secrets proxy: a redirect to the proxy's port on the gateway, before
/// any filter sees them (dstnat). IPv4 only: the proxy listens on the
/// IPv4 gateway, and a VM's IPv6 connections go on unsteered (their
/// placeholders unreplaced).
pub(super) fn steering(net: &FirewallNetwork) -> Vec<Vec<Statement<'static>>> {
    let Some(port) = net.secrets_port else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for iface in &net.policies {
        let Some(steered) = iface.policy.steered() else {
            continue;
        };
        let addrs: Vec<String> = (iface.addrs.iter())
            .filter(|a| a.is_ipv4())
            .map(IpAddr::to_string)
            .collect();
        if addrs.is_empty() {
            continue;
        }
        out.push(vec![
            eq(payload("ip", "saddr"), set(&addrs)),
            eq(
                payload("ip", "daddr"),
                string(&format!("@{}", set_name(&iface.tap, false, steered))),
            ),
            protocol_match(Some(crate::forward::Protocol::Tcp)),
            eq(
                payload("tcp", "dport"),
                Expression::Number(SECRET_PORT.into()),
            ),
            Statement::Redirect(Some(NAT {
                addr: None,
                family: None,
                port: Some(Expression::Number(port.into())),
                flags: None,
            })),
        ]);
    }
    out
}

/// The rule of a VM's policy chain that lets its steered connections reach
/// the secrets proxy (redirected there: `steering`); None where none are.
pub(super) fn steered_in(
    net: &FirewallNetwork,
    iface: &InterfacePolicy,
) -> Option<Vec<Statement<'static>>> {
    let (Some(port), Some(_)) = (net.secrets_port, iface.policy.steered()) else {
        return None;
    };
    let gateway = net.gateways.iter().find(|g| g.is_ipv4())?;
    Some(vec![
        eq(payload("ip", "daddr"), string(&gateway.to_string())),
        protocol_match(Some(crate::forward::Protocol::Tcp)),
        eq(payload("tcp", "dport"), Expression::Number(port.into())),
        super::dnated(),
        accept(),
    ])
}

fn element(e: &Element) -> Expression<'static> {
    Expression::Named(NamedExpression::Elem(Elem {
        val: Box::new(string(&e.addr.to_string())),
        timeout: Some(e.seconds.max(1)),
        expires: None,
        comment: None,
        counter: None,
    }))
}

/// Puts `elements` into `tap`'s sets, each with its whole lifetime, in
/// one transaction: added (if it was not there), deleted and added again,
/// so its timeout is the one given on every kernel (a kernel before 6.10
/// keeps an element's timeout when it is added again).
pub fn put(nft: &Nft, tap: &str, elements: &[Element]) -> Result<(), NftError> {
    if elements.is_empty() {
        return Ok(());
    }
    let mut batch = Batch::new();
    for e in elements {
        let set = |timeout: Option<u32>| {
            NfListObject::Element(nftables::schema::Element {
                family: FAMILY,
                table: Cow::Borrowed(NFT_TABLE),
                name: Cow::Owned(set_name(tap, e.addr.is_ipv6(), e.reach)),
                elem: Cow::Owned(vec![match timeout {
                    Some(_) => element(e),
                    None => string(&e.addr.to_string()),
                }]),
            })
        };
        batch.add(set(Some(e.seconds)));
        batch.delete(set(None));
        batch.add(set(Some(e.seconds)));
    }
    nft.apply(&batch.to_nftables())
}

/// The elements in linnet's name sets now, by TAP: what a daemon that
/// starts finds of its predecessor's (read before it rebuilds the table).
pub fn read(nft: &Nft) -> Result<Vec<(String, Element)>, NftError> {
    let listing = match nft.run(&format!(
        r#"{{"nftables": [{{"list": {{"table": {{"family": "inet", "name": "{NFT_TABLE}"}}}}}}]}}"#
    )) {
        Ok(text) => text,
        // No table: nothing was learned.
        Err(NftError::Refused(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(elements_in(&listing))
}

fn elements_in(listing: &str) -> Vec<(String, Element)> {
    let Ok(doc) = serde_json::from_str::<Value>(listing) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let objects = doc["nftables"].as_array().cloned().unwrap_or_default();
    for set in objects.iter().filter_map(|o| o.get("set")) {
        let Some((tap, _, reach)) = set["name"].as_str().and_then(parse_set_name) else {
            continue;
        };
        for elem in set["elem"].as_array().into_iter().flatten() {
            let (val, left) = match elem.get("elem") {
                Some(e) => (&e["val"], e["expires"].as_u64()),
                None => (elem, None),
            };
            let (Some(addr), Some(seconds)) = (
                val.as_str().and_then(|v| v.parse::<IpAddr>().ok()),
                left.and_then(|s| u32::try_from(s).ok()),
            ) else {
                continue;
            };
            out.push((
                tap.to_string(),
                Element {
                    reach,
                    addr,
                    seconds,
                },
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_names_read_back() {
        let name = set_name("lnt-a-1", true, 3);
        assert_eq!(name, "n6-lnt-a-1-3");
        assert_eq!(parse_set_name(&name), Some(("lnt-a-1", true, 3)));
        assert_eq!(parse_set_name("n4-x"), None);
        assert_eq!(parse_set_name("macs"), None);
    }

    #[test]
    fn elements_come_back_from_a_listing_with_what_they_have_left() {
        let listing = r#"{"nftables": [{"metainfo": {}},
            {"set": {"family": "inet", "name": "n4-lnt3-1", "table": "linnet", "type": "ipv4_addr",
                     "flags": ["timeout"], "elem": [{"elem": {"val": "192.0.2.1", "timeout": 100, "expires": 99}}]}},
            {"set": {"family": "inet", "name": "n6-lnt3-0", "table": "linnet", "type": "ipv6_addr",
                     "flags": ["timeout"], "elem": [{"elem": {"val": "2001:db8::1", "timeout": 60, "expires": 7}}]}},
            {"set": {"family": "inet", "name": "other", "table": "linnet", "type": "ipv4_addr", "elem": ["192.0.2.9"]}}]}"#;
        assert_eq!(
            elements_in(listing),
            vec![
                (
                    "lnt3".to_string(),
                    Element {
                        reach: 1,
                        addr: "192.0.2.1".parse().unwrap(),
                        seconds: 99
                    }
                ),
                (
                    "lnt3".to_string(),
                    Element {
                        reach: 0,
                        addr: "2001:db8::1".parse().unwrap(),
                        seconds: 7
                    }
                ),
            ]
        );
    }
}
