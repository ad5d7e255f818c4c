//! `bridge linnet_fabric`: what may cross a network across hosts' VXLAN
//! port (its "fabric port"). Every host's bridge is the same anycast
//! gateway, so each host's gateway, DHCP server and router
//! advertisements serve its own VMs alone:
//!
//! - the host's own frames never leave by the fabric port, and it takes
//!   none from it (its gateway is every host's: a remote VM has its own);
//! - frames from the fabric port with the gateway's MAC as source (another
//!   host's gateway) reach no VM;
//! - DHCP (v4 and v6) and router solicitations and advertisements cross it
//!   in neither direction, so no host answers another host's VM.
//!
//! Made in the same transaction as `inet linnet` (`super::ruleset`).

use std::borrow::Cow;

use nftables::batch::Batch;
use nftables::expr::{Expression, MetaKey, NamedExpression, SetItem};
use nftables::schema::{Chain, NfListObject, Rule, Table};
use nftables::stmt::Statement;
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use super::{FirewallNetwork, drop, eq, meta, payload, string};
use crate::host::FABRIC_TABLE as TABLE;

const FAMILY: NfFamily = NfFamily::Bridge;
const INPUT: &str = "fabric_in";
const FORWARD: &str = "fabric_forward";
const OUTPUT: &str = "fabric_out";
/// DHCPv4's server and client ports, DHCPv6's client and server ports.
const DHCP_PORTS: [u32; 4] = [67, 68, 546, 547];
/// ICMPv6 router solicitation and advertisement.
const ROUTER_DISCOVERY: [u32; 2] = [133, 134];

/// Adds the table (emptied) and, if any network has a fabric port, its
/// rules; without one the table goes.
pub(super) fn add(batch: &mut Batch<'static>, networks: &[FirewallNetwork]) {
    batch.add(table());
    batch.delete(table());
    let ports: Vec<_> = networks.iter().filter_map(|n| n.fabric.as_ref()).collect();
    if ports.is_empty() {
        return;
    }
    batch.add(table());
    for (name, hook) in [
        (INPUT, NfHook::Input),
        (FORWARD, NfHook::Forward),
        (OUTPUT, NfHook::Output),
    ] {
        batch.add(NfListObject::Chain(Chain {
            family: FAMILY,
            table: Cow::Borrowed(TABLE),
            name: Cow::Borrowed(name),
            _type: Some(NfChainType::Filter),
            hook: Some(hook),
            prio: Some(0),
            policy: Some(NfChainPolicy::Accept),
            ..Default::default()
        }));
    }
    for port in ports {
        let from = || eq(meta(MetaKey::Iifname), string(&port.port));
        let to = || eq(meta(MetaKey::Oifname), string(&port.port));
        batch.add(rule(INPUT, vec![from(), drop()]));
        batch.add(rule(OUTPUT, vec![to(), drop()]));
        let gateway = port.gateway_mac.to_string();
        batch.add(rule(
            FORWARD,
            vec![
                from(),
                eq(payload("ether", "saddr"), string(&gateway)),
                drop(),
            ],
        ));
        for way in [from(), to()] {
            let dhcp = eq(payload("udp", "dport"), numbers(&DHCP_PORTS));
            batch.add(rule(FORWARD, vec![way.clone(), dhcp, drop()]));
            let rd = eq(payload("icmpv6", "type"), numbers(&ROUTER_DISCOVERY));
            batch.add(rule(FORWARD, vec![way, rd, drop()]));
        }
    }
}

fn table() -> NfListObject<'static> {
    NfListObject::Table(Table {
        family: FAMILY,
        name: Cow::Borrowed(TABLE),
        handle: None,
    })
}

fn rule(chain: &'static str, expr: Vec<Statement<'static>>) -> NfListObject<'static> {
    NfListObject::Rule(Rule {
        family: FAMILY,
        table: Cow::Borrowed(TABLE),
        chain: Cow::Borrowed(chain),
        expr: Cow::Owned(expr),
        ..Default::default()
    })
}

fn numbers(items: &[u32]) -> Expression<'static> {
    Expression::Named(NamedExpression::Set(
        items
            .iter()
            .map(|n| SetItem::Element(Expression::Number(*n)))
            .collect(),
    ))
}
