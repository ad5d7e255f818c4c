//! linnet's rules in Docker's `DOCKER-USER` chain: the one place outside its
//! own tables that linnet writes to, and only when Docker made the chain.
//! Docker sets the FORWARD policy of iptables' filter table to DROP, which
//! drops every linnet network's forwarded traffic whatever linnet's own
//! table says; DOCKER-USER is the chain Docker provides, ahead of its own
//! rules, for other software to accept traffic. Each network gets two rules
//! there, `iifname BRIDGE accept` and `oifname BRIDGE accept`, tagged with
//! the comment `linnet network NAME`: linnet's own table still decides what
//! is forwarded. They are written through nftables' JSON in the form
//! iptables-nft reads back (`iptables -S DOCKER-USER` lists them), so Docker
//! keeps managing its chain.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::nft::{Nft, NftError};
use super::ruleset::Ruleset;

pub const CHAIN: &str = "DOCKER-USER";
const TABLE: &str = "filter";
const TAG: &str = "linnet network ";

/// A network that wants its traffic accepted there.
pub struct Wanted<'a> {
    pub network: &'a str,
    pub bridge: &'a str,
}

/// What `sync` changed, for the log.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    /// (family, network) whose rules were (re)added.
    pub added: Vec<(String, String)>,
    /// (family, network) whose rules were removed.
    pub removed: Vec<(String, String)>,
}

/// The families (`ip`, `ip6`) whose filter table has DOCKER-USER.
pub fn present(rs: &Ruleset) -> Vec<&'static str> {
    ["ip", "ip6"]
        .into_iter()
        .filter(|f| rs.chain(f, TABLE, CHAIN).is_some())
        .collect()
}

/// The networks whose rules are in DOCKER-USER, in every family that has
/// the chain.
pub fn tagged(rs: &Ruleset) -> BTreeSet<String> {
    let families = present(rs);
    let mut out: Option<BTreeSet<String>> = None;
    for family in families {
        let here: BTreeSet<String> = rs
            .rules(family, TABLE, CHAIN)
            .iter()
            .filter_map(|r| r.comment.as_deref()?.strip_prefix(TAG))
            .map(str::to_owned)
            .collect();
        out = Some(match out {
            Some(before) => before.intersection(&here).cloned().collect(),
            None => here,
        });
    }
    out.unwrap_or_default()
}

/// Makes DOCKER-USER hold exactly the rules of `wanted` networks (none:
/// removes all of linnet's), in every family that has the chain. One
/// transaction; nothing when all is in place already.
pub fn sync(nft: &mut Nft, rs: &Ruleset, wanted: &[Wanted]) -> Result<Changes, NftError> {
    let mut commands = Vec::new();
    let mut changes = Changes::default();
    for family in present(rs) {
        let rules = rs.rules(family, TABLE, CHAIN);
        let ours = |network: &str| -> Vec<u64> {
            rules
                .iter()
                .filter(|r| r.comment.as_deref().and_then(|c| c.strip_prefix(TAG)) == Some(network))
                .map(|r| r.handle)
                .collect()
        };
        let mut tagged: Vec<&str> = rules
            .iter()
            .filter_map(|r| r.comment.as_deref()?.strip_prefix(TAG))
            .collect();
        tagged.sort_unstable();
        tagged.dedup();
        for network in tagged
            .iter()
            .filter(|n| !wanted.iter().any(|w| w.network == **n))
        {
            commands.extend(ours(network).into_iter().map(|h| delete(family, h)));
            changes.removed.push((family.into(), (*network).into()));
        }
        for w in wanted {
            let handles = ours(w.network);
            if handles.len() == 2 && in_place(rs, family, w) {
                continue;
            }
            commands.extend(handles.into_iter().map(|h| delete(family, h)));
            for key in ["oifname", "iifname"] {
                commands.push(json!({"insert": {"rule": {
                    "family": family, "table": TABLE, "chain": CHAIN,
                    "comment": format!("{TAG}{}", w.network),
                    "expr": [
                        {"match": {"op": "==", "left": {"meta": {"key": key}}, "right": w.bridge}},
                        {"counter": null},
                        {"accept": null},
                    ],
                }}}));
            }
            changes.added.push((family.into(), w.network.into()));
        }
    }
    if !commands.is_empty() {
        nft.run(&json!({ "nftables": commands }).to_string())?;
    }
    Ok(changes)
}

/// Whether the network's two rules still name its bridge.
fn in_place(rs: &Ruleset, family: &str, w: &Wanted) -> bool {
    let tag = format!("{TAG}{}", w.network);
    rs.rules(family, TABLE, CHAIN)
        .iter()
        .filter(|r| r.comment.as_deref() == Some(tag.as_str()))
        .all(|r| r.expr.iter().any(|e| e["match"]["right"] == w.bridge))
}

fn delete(family: &str, handle: u64) -> Value {
    json!({"delete": {"rule": {"family": family, "table": TABLE, "chain": CHAIN, "handle": handle}}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::ruleset::recorded;

    #[test]
    fn tagged_networks_are_read_back() {
        let mut json: Value = serde_json::from_str(&recorded("docker")).unwrap();
        assert!(tagged(&Ruleset::parse(&json.to_string()).unwrap()).is_empty());
        json["nftables"]
            .as_array_mut()
            .unwrap()
            .push(json!({"rule": {
            "family": "ip", "table": TABLE, "chain": CHAIN, "handle": 99,
            "comment": "linnet network shared", "expr": [{"accept": null}]}}));
        let rs = Ruleset::parse(&json.to_string()).unwrap();
        assert_eq!(tagged(&rs), BTreeSet::from(["shared".to_string()]));
    }

    #[test]
    fn finds_the_chain_in_dockers_ruleset_only() {
        let docker = Ruleset::parse(&recorded("docker")).unwrap();
        assert_eq!(present(&docker), vec!["ip"]);
        for other in ["empty", "firewalld", "libvirt", "ufw", "foreign-drop"] {
            let rs = Ruleset::parse(&recorded(other)).unwrap();
            assert!(present(&rs).is_empty(), "{other}");
        }
    }
}
