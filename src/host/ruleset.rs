//! The namespace's nftables ruleset as data: every table's chains and rules,
//! read from `nft -j list ruleset` (nftables' JSON API, which also shows
//! what iptables-nft made). Nothing here runs anything: `coexist` decides
//! what the rules do to linnet's traffic.

use std::collections::BTreeMap;

use serde_json::Value;

use super::nft::{Nft, NftError};

/// Who made a table, as far as its names tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// linnet's own tables (`inet linnet`, `bridge linnet`, `bridge
    /// linnet_fabric`).
    Linnet,
    /// iptables-nft's `filter` table with Docker's `DOCKER-USER` chain.
    Docker,
    /// firewalld's `firewalld` table.
    Firewalld,
    /// libvirt's nftables backend (`libvirt_network`).
    Libvirt,
    /// Another iptables-nft table (`filter`, `nat`, ... with upper-case
    /// built-in chains).
    IptablesNft,
    /// Anything else written with nft.
    Nft,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    pub family: String,
    pub table: String,
    pub name: String,
    /// Set on base chains: the hook, its priority and policy.
    pub hook: Option<String>,
    pub priority: i64,
    pub policy: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub handle: u64,
    pub comment: Option<String>,
    pub expr: Vec<Value>,
}

/// A table's chains and how many rules each has: enough to tell that
/// something was deleted from it.
pub type Shape = BTreeMap<String, usize>;

/// The shape of linnet's own table `family linnet` as it is now (None: there
/// is no such table).
pub fn linnet_shape(nft: &mut Nft, family: &str) -> Result<Option<Shape>, NftError> {
    table_shape(nft, family, "linnet")
}

/// The shape of the table `family table` as it is now (None: there is no
/// such table).
pub fn table_shape(nft: &mut Nft, family: &str, table: &str) -> Result<Option<Shape>, NftError> {
    let tables = nft.list_terse("list tables")?;
    let present = table_names(&tables)
        .map_err(NftError::Refused)?
        .iter()
        .any(|t| t.family == family && t.name == table);
    if !present {
        return Ok(None);
    }
    let json = nft.list_terse(&format!("list table {family} {table}"))?;
    let mut rs = Ruleset::default();
    rs.add(&json).map_err(NftError::Refused)?;
    Ok(Some(
        rs.chains
            .iter()
            .map(|c| (c.name.clone(), rs.rules(family, table, &c.name).len()))
            .collect(),
    ))
}

/// One table's address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TableId {
    pub family: String,
    pub name: String,
}

#[derive(Debug, Default, Clone)]
pub struct Ruleset {
    pub chains: Vec<Chain>,
    rules: BTreeMap<(String, String, String), Vec<Rule>>,
}

impl Ruleset {
    /// Reads every table but linnet's own (whose sets can be large, and
    /// whose rules linnet knows).
    pub fn read(nft: &mut Nft) -> Result<Ruleset, NftError> {
        let tables = nft.list_terse("list tables")?;
        let mut out = Ruleset::default();
        for table in table_names(&tables).map_err(NftError::Refused)? {
            if table.name == "linnet" && matches!(table.family.as_str(), "inet" | "bridge") {
                continue;
            }
            // It may be gone already: read what is there.
            match nft.list_terse(&format!("list table {} {}", table.family, table.name)) {
                Ok(json) => out.add(&json).map_err(NftError::Refused)?,
                Err(e) => tracing::debug!("table {} {} not read: {e}", table.family, table.name),
            }
        }
        Ok(out)
    }

    /// Parses nft's JSON output. An error names what was wrong with it.
    #[cfg(test)]
    pub fn parse(json: &str) -> Result<Ruleset, String> {
        let mut out = Ruleset::default();
        out.add(json)?;
        Ok(out)
    }

    fn add(&mut self, json: &str) -> Result<(), String> {
        let items = items(json)?;
        let out = self;
        for item in &items {
            if let Some(c) = item.get("chain") {
                out.chains.push(Chain {
                    family: text(c, "family")?,
                    table: text(c, "table")?,
                    name: text(c, "name")?,
                    hook: c.get("hook").and_then(Value::as_str).map(str::to_owned),
                    priority: c.get("prio").and_then(Value::as_i64).unwrap_or(0),
                    policy: c.get("policy").and_then(Value::as_str).map(str::to_owned),
                });
            } else if let Some(r) = item.get("rule") {
                let key = (text(r, "family")?, text(r, "table")?, text(r, "chain")?);
                out.rules.entry(key).or_default().push(Rule {
                    handle: r.get("handle").and_then(Value::as_u64).unwrap_or(0),
                    comment: r.get("comment").and_then(Value::as_str).map(str::to_owned),
                    expr: r
                        .get("expr")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                });
            }
        }
        Ok(())
    }

    pub fn rules(&self, family: &str, table: &str, chain: &str) -> &[Rule] {
        self.rules
            .get(&(family.into(), table.into(), chain.into()))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    pub fn chain(&self, family: &str, table: &str, name: &str) -> Option<&Chain> {
        self.chains
            .iter()
            .find(|c| c.family == family && c.table == table && c.name == name)
    }

    /// The base chains on `hook` of tables in `families`.
    pub fn base_chains<'a>(
        &'a self,
        families: &'a [&str],
        hook: &'a str,
    ) -> impl Iterator<Item = &'a Chain> + 'a {
        self.chains.iter().filter(move |c| {
            c.hook.as_deref() == Some(hook) && families.contains(&c.family.as_str())
        })
    }

    /// Who made the table `family table`.
    pub fn owner(&self, family: &str, table: &str) -> Owner {
        if (table == "linnet" && matches!(family, "inet" | "bridge"))
            || (table == super::FABRIC_TABLE && family == "bridge")
        {
            Owner::Linnet
        } else if table == "firewalld" {
            Owner::Firewalld
        } else if table.starts_with("libvirt") {
            Owner::Libvirt
        } else if self.chain(family, table, "DOCKER-USER").is_some() {
            Owner::Docker
        } else if matches!(family, "ip" | "ip6")
            && matches!(table, "filter" | "nat" | "mangle" | "raw" | "security")
            && self.chains.iter().any(|c| {
                c.family == family
                    && c.table == table
                    && c.hook.is_some()
                    && c.name.chars().all(|ch| ch.is_ascii_uppercase())
            })
        {
            Owner::IptablesNft
        } else {
            Owner::Nft
        }
    }
}

fn items(json: &str) -> Result<Vec<Value>, String> {
    let mut doc: Value =
        serde_json::from_str(json).map_err(|e| format!("nft's JSON does not parse: {e}"))?;
    match doc.get_mut("nftables").map(Value::take) {
        Some(Value::Array(items)) => Ok(items),
        _ => Err("nft's JSON has no \"nftables\" list".into()),
    }
}

/// The tables in `nft -j list tables`.
fn table_names(json: &str) -> Result<Vec<TableId>, String> {
    items(json)?
        .iter()
        .filter_map(|i| i.get("table"))
        .map(|t| {
            Ok(TableId {
                family: text(t, "family")?,
                name: text(t, "name")?,
            })
        })
        .collect()
}

fn text(v: &Value, key: &str) -> Result<String, String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("nft's JSON has an object without \"{key}\": {v}"))
}

/// A ruleset recorded from nft (tests/rulesets/NAME.json).
#[cfg(test)]
pub fn recorded(name: &str) -> String {
    let path = format!("{}/tests/rulesets/{name}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_docker_rules() {
        let r = Ruleset::parse(&recorded("docker")).unwrap();
        let forward = r.chain("ip", "filter", "FORWARD").unwrap();
        assert_eq!(forward.hook.as_deref(), Some("forward"));
        assert_eq!(forward.policy.as_deref(), Some("drop"));
        assert_eq!(r.rules("ip", "filter", "FORWARD").len(), 6);
        assert_eq!(r.owner("ip", "filter"), Owner::Docker);
        assert_eq!(r.owner("ip", "nat"), Owner::IptablesNft);
    }

    #[test]
    fn knows_owners() {
        let fw = Ruleset::parse(&recorded("firewalld")).unwrap();
        assert_eq!(fw.owner("inet", "firewalld"), Owner::Firewalld);
        let lv = Ruleset::parse(&recorded("libvirt")).unwrap();
        assert_eq!(lv.owner("ip", "libvirt_network"), Owner::Libvirt);
        let other = Ruleset::parse(&recorded("foreign-drop")).unwrap();
        assert_eq!(other.owner("inet", "filter"), Owner::Nft);
        assert_eq!(other.owner("inet", "linnet"), Owner::Linnet);
    }

    #[test]
    fn empty_and_malformed() {
        let empty = Ruleset::parse(&recorded("empty")).unwrap();
        assert!(empty.chains.is_empty());
        let err = Ruleset::parse(&recorded("malformed")).unwrap_err();
        assert!(err.contains("does not parse"), "{err}");
        let err = Ruleset::parse("{\"x\": 1}").unwrap_err();
        assert!(err.contains("no \"nftables\""), "{err}");
        let err =
            Ruleset::parse("{\"nftables\": [{\"chain\": {\"family\": \"ip\"}}]}").unwrap_err();
        assert!(err.contains("\"table\""), "{err}");
    }
}
