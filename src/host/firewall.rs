//! linnet's nftables table (`inet linnet`): forwarding and NAT for its own
//! bridges. The whole table is generated from the active networks and
//! replaced in one atomic transaction, so applying twice (or after a crash)
//! never duplicates a rule. Driven through nft's JSON API with typed values;
//! no user text is ever spliced into an nft command.

use std::borrow::Cow;

use ipnet::Ipv4Net;
use nftables::batch::Batch;
use nftables::expr::{
    CT, Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, Prefix, SetItem,
};
use nftables::schema::{Chain, NfListObject, Nftables, Rule, Table};
use nftables::stmt::{Match, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use thiserror::Error;

use super::NFT_TABLE;
use crate::config::Mode;

const FAMILY: NfFamily = NfFamily::INet;
const FORWARD: &str = "forward";
const POSTROUTING: &str = "postrouting";
/// Standard hook priorities: filter (0) and srcnat (100).
const PRIORITY_FILTER: i32 = 0;
const PRIORITY_SRCNAT: i32 = 100;

#[derive(Debug, Error)]
pub enum FirewallError {
    #[error("nft is not installed: install the nftables package (apt-get install nftables)")]
    NftMissing,
    #[error("nftables refused linnet's table: {0}")]
    Apply(String),
}

/// What the firewall needs to know about one active network.
#[derive(Debug, Clone)]
pub struct FirewallNetwork {
    pub bridge: String,
    pub subnet: Ipv4Net,
    pub mode: Mode,
    pub nat44: bool,
}

/// Replaces linnet's table with the rules for `networks` (none: removes it).
pub fn apply(networks: &[FirewallNetwork]) -> Result<(), FirewallError> {
    run(&ruleset(networks))
}

/// Removes linnet's table, if there is one.
pub fn remove() -> Result<(), FirewallError> {
    run(&ruleset(&[]))
}

fn run(doc: &Nftables) -> Result<(), FirewallError> {
    nftables::helper::apply_ruleset(doc).map_err(|e| match e {
        nftables::helper::NftablesError::NftExecution { inner, .. }
            if inner.kind() == std::io::ErrorKind::NotFound =>
        {
            FirewallError::NftMissing
        }
        other => FirewallError::Apply(other.to_string()),
    })
}

/// The transaction: (re)create the table empty, then fill it. `add` + `delete`
/// first makes the delete valid whether or not the table exists.
pub fn ruleset(networks: &[FirewallNetwork]) -> Nftables<'static> {
    let mut batch = Batch::new();
    batch.add(table());
    batch.delete(table());
    if networks.is_empty() {
        return batch.to_nftables();
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

    // Frames between VMs of one network are bridged, not routed, but with
    // br_netfilter loaded (as on Docker hosts) they still pass this hook,
    // in and out of the bridge itself: let them through first.
    for net in networks {
        batch.add(rule(
            FORWARD,
            vec![
                eq(meta(MetaKey::Iifname), string(&net.bridge)),
                eq(meta(MetaKey::Oifname), string(&net.bridge)),
                accept(),
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
    for net in networks.iter().filter(|n| n.mode == Mode::Host) {
        batch.add(rule(
            FORWARD,
            vec![eq(meta(MetaKey::Iifname), string(&net.bridge)), drop()],
        ));
        batch.add(rule(
            FORWARD,
            vec![eq(meta(MetaKey::Oifname), string(&net.bridge)), drop()],
        ));
    }
    for net in networks.iter().filter(|n| n.mode == Mode::Shared) {
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
        if net.nat44 {
            batch.add(rule(
                POSTROUTING,
                vec![
                    eq(payload("ip", "saddr"), prefix(net.subnet)),
                    Statement::Match(Match {
                        left: meta(MetaKey::Oifname),
                        right: string(&net.bridge),
                        op: Operator::NEQ,
                    }),
                    Statement::Masquerade(None),
                ],
            ));
        }
    }
    batch.to_nftables()
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

fn rule(chain: &'static str, expr: Vec<Statement<'static>>) -> NfListObject<'static> {
    NfListObject::Rule(Rule {
        family: FAMILY,
        table: Cow::Borrowed(NFT_TABLE),
        chain: Cow::Borrowed(chain),
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

fn prefix(net: Ipv4Net) -> Expression<'static> {
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
                mode: Mode::Shared,
                nat44: true,
            },
            FirewallNetwork {
                bridge: "ln-host".into(),
                subnet: "192.168.106.0/24".parse().unwrap(),
                mode: Mode::Host,
                nat44: false,
            },
        ]
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

    #[test]
    fn empty_ruleset_only_removes_the_table() {
        let cmds = commands(&ruleset(&[]));
        assert_eq!(cmds.len(), 2);
        assert_eq!(cmds[0]["add"]["table"]["name"], "linnet");
        assert_eq!(cmds[1]["delete"]["table"]["family"], "inet");
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
        assert_eq!(nat.len(), 1, "only the shared network is masqueraded");
        assert_eq!(
            nat[0][0]["match"]["right"],
            json!({"prefix": {"addr": "192.168.105.0", "len": 24}})
        );
        assert_eq!(nat[0][1]["match"]["op"], "!=");
        assert_eq!(nat[0][2], json!({"masquerade": null}));
    }
}
