//! Anti-spoofing and isolation on the bridges, in linnet's own table
//! `bridge linnet`: every frame a VM sends enters the bridge through its
//! TAP, where the `prerouting` chain jumps (one hash lookup in the `ports`
//! verdict map) to that TAP's own chain. There only the VM's own addresses
//! pass; everything else is dropped and counted in the TAP's named counter.
//! No userspace on the datapath. (Frames to the 802.1 link-local group,
//! 01:80:c2:00:00:0x, never pass the bridge's hooks: the bridge does not
//! forward them but hands them to the TAP's own stack, which has no
//! address; the bridges are made not to learn source MACs from them.)
//!
//! Per TAP, added in one transaction before the VM gets its fd and removed
//! at detach: a counter, a chain, an element of `ports` and, on an isolated
//! network, of `isolated` (whose members the `forward` chain keeps apart).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::{Value, json};

use super::nft::{Nft, NftError};
use crate::types::MacAddr;

const FAMILY: &str = "bridge";
const TABLE: &str = "linnet";
const PORTS: &str = "ports";
const ISOLATED: &str = "isolated";
/// The bridge family's filter priority.
const PRIORITY: i32 = -200;

/// What one TAP's VM may send from.
#[derive(Debug, Clone, PartialEq)]
pub struct PortGuard {
    pub tap: String,
    pub mac: MacAddr,
    pub ipv4: Ipv4Addr,
    /// Its link-local address and, on a network with IPv6, its SLAAC one.
    pub ipv6: Vec<Ipv6Addr>,
    /// Anti-spoofing (off: only isolation, if any).
    pub anti_spoofing: bool,
    pub isolated: bool,
}

/// The table with its base chains, map and set (created empty, or emptied).
pub fn create(nft: &mut Nft) -> Result<(), NftError> {
    let table = json!({"family": FAMILY, "name": TABLE});
    let base = |name: &str, hook: &str| {
        json!({"chain": {"family": FAMILY, "table": TABLE, "name": name,
            "type": "filter", "hook": hook, "prio": PRIORITY, "policy": "accept"}})
    };
    let commands = vec![
        json!({"add": {"table": table}}),
        json!({"delete": {"table": table}}),
        json!({"add": {"table": table}}),
        json!({"add": {"map": {"family": FAMILY, "table": TABLE, "name": PORTS,
            "type": "ifname", "map": "verdict"}}}),
        json!({"add": {"set": {"family": FAMILY, "table": TABLE, "name": ISOLATED,
            "type": "ifname"}}}),
        json!({"add": base("prerouting", "prerouting")}),
        json!({"add": base("forward", "forward")}),
        rule(
            "prerouting",
            vec![json!({"vmap": {"key": meta("iifname"), "data": format!("@{PORTS}")}})],
        ),
        // Frames between two ports of an isolated network (their VMs); frames
        // to and from the host pass.
        rule(
            "forward",
            vec![
                json!({"match": {"op": "==", "left": meta("iifname"), "right": format!("@{ISOLATED}")}}),
                json!({"match": {"op": "==", "left": meta("oifname"), "right": format!("@{ISOLATED}")}}),
                json!({"drop": null}),
            ],
        ),
    ];
    run(nft, commands)
}

/// Removes the table, if there is one.
pub fn remove(nft: &mut Nft) -> Result<(), NftError> {
    let table = json!({"family": FAMILY, "name": TABLE});
    run(
        nft,
        vec![
            json!({"add": {"table": table}}),
            json!({"delete": {"table": table}}),
        ],
    )
}

/// Guards one TAP (the table must exist).
pub fn add_port(nft: &mut Nft, port: &PortGuard) -> Result<(), NftError> {
    run(nft, port_commands(port))
}

/// Removes the TAPs' chains, counters and elements, in one transaction.
pub fn remove_ports(nft: &mut Nft, taps: &[&str]) -> Result<(), NftError> {
    // Adding before deleting makes each delete valid whether or not the
    // port had that chain or element (isolation only, say); the chain that
    // jumps to the others goes first.
    let mut commands = Vec::new();
    for tap in taps {
        let chains =
            chain_names(tap).map(|name| json!({"family": FAMILY, "table": TABLE, "name": name}));
        for chain in &chains {
            commands.push(json!({"add": {"chain": chain}}));
        }
        let ports = json!({"family": FAMILY, "table": TABLE, "name": PORTS,
            "elem": [[tap, {"jump": {"target": tap}}]]});
        let isolated = json!({"family": FAMILY, "table": TABLE, "name": ISOLATED, "elem": [tap]});
        for elem in [ports, isolated] {
            commands.push(json!({"add": {"element": elem.clone()}}));
            commands.push(json!({"delete": {"element": elem}}));
        }
        for chain in chains {
            commands.push(json!({"delete": {"chain": chain}}));
        }
        let counter = json!({"family": FAMILY, "table": TABLE, "name": tap});
        commands.push(json!({"add": {"counter": counter.clone()}}));
        commands.push(json!({"delete": {"counter": counter}}));
    }
    run(nft, commands)
}

/// Frames dropped so far, by TAP.
pub fn drops(nft: &mut Nft) -> Result<BTreeMap<String, u64>, NftError> {
    let out = nft.run(&format!("list counters table {FAMILY} {TABLE}"))?;
    Ok(parse_counters(&out))
}

fn parse_counters(json: &str) -> BTreeMap<String, u64> {
    let doc: Value = serde_json::from_str(json).unwrap_or_else(|e| {
        tracing::warn!("cannot read nft's counters ({e}): {json}");
        Value::Null
    });
    doc["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| {
            let c = o.get("counter")?;
            Some((c["name"].as_str()?.to_string(), c["packets"].as_u64()?))
        })
        .collect()
}

fn run(nft: &mut Nft, commands: Vec<Value>) -> Result<(), NftError> {
    nft.run(&json!({ "nftables": commands }).to_string())
        .map(|_| ())
}

fn meta(key: &str) -> Value {
    json!({"meta": {"key": key}})
}

fn payload(protocol: &str, field: &str) -> Value {
    json!({"payload": {"protocol": protocol, "field": field}})
}

fn matches(op: &str, left: Value, right: Value) -> Value {
    json!({"match": {"op": op, "left": left, "right": right}})
}

fn set(items: Vec<Value>) -> Value {
    json!({ "set": items })
}

fn rule(chain: &str, expr: Vec<Value>) -> Value {
    json!({"add": {"rule": {"family": FAMILY, "table": TABLE, "chain": chain, "expr": expr}}})
}

/// The target address of a neighbour solicitation or advertisement: 128
/// bits at offset 8 of the ICMPv6 header (nft names no field for it).
fn nd_target() -> Value {
    json!({"payload": {"base": "th", "offset": 64, "len": 128}})
}

/// The client hardware address of a DHCP message: 48 bits at byte 28 of
/// the BOOTP header, after the 8-byte UDP header.
fn dhcp_chaddr() -> Value {
    json!({"payload": {"base": "th", "offset": (8 + 28) * 8, "len": 48}})
}

fn mac_number(mac: &MacAddr) -> u64 {
    mac.0.iter().fold(0, |n, b| (n << 8) | u64::from(*b))
}

fn fragment() -> Value {
    matches("==", json!({"exthdr": {"name": "frag"}}), json!(true))
}

fn prefix(addr: &str, len: u8) -> Value {
    json!({"prefix": {"addr": addr, "len": len}})
}

/// An IPv6 address as the 128-bit number a raw payload compares with.
fn as_number(ip: &Ipv6Addr) -> Value {
    Value::String(format!("0x{:032x}", u128::from(*ip)))
}

/// The chains of one TAP: `TAP` checks the source MAC and sends each
/// frame by its ether type to `TAP-arp`, `TAP-ip` or `TAP-ip6` (any other
/// type is dropped), so a frame meets only the few rules of its protocol;
/// the common case, a packet from the VM's own address, passes after two.
/// Each protocol chain ends in a verdict of its own.
fn chain_names(tap: &str) -> [String; 4] {
    [
        tap.to_string(),
        format!("{tap}-arp"),
        format!("{tap}-ip"),
        format!("{tap}-ip6"),
    ]
}

fn port_commands(port: &PortGuard) -> Vec<Value> {
    let tap = port.tap.as_str();
    let mut commands =
        vec![json!({"add": {"counter": {"family": FAMILY, "table": TABLE, "name": tap}}})];
    if port.anti_spoofing {
        let [main, arp, ip4, ip6] = chain_names(tap);
        for chain in [&main, &arp, &ip4, &ip6] {
            let chain = json!({"family": FAMILY, "table": TABLE, "name": chain});
            // Flushed, in case a failed removal left the chain of an earlier
            // interface with this TAP name: its rules must not come first.
            commands.push(json!({"add": {"chain": chain.clone()}}));
            commands.push(json!({"flush": {"chain": chain}}));
        }
        let drop = |chain: &str, mut expr: Vec<Value>| {
            expr.push(json!({"counter": tap}));
            expr.push(json!({"drop": null}));
            rule(chain, expr)
        };
        let accept = |chain: &str, mut expr: Vec<Value>| {
            expr.push(json!({"accept": null}));
            rule(chain, expr)
        };
        let mac = Value::String(port.mac.to_string());
        let ip = Value::String(port.ipv4.to_string());
        let own6: Vec<Value> = port.ipv6.iter().map(|a| json!(a.to_string())).collect();
        let own6_numbers: Vec<Value> = port.ipv6.iter().map(as_number).collect();
        let icmpv6 = |t: Value| matches("==", payload("icmpv6", "type"), t);
        let udp_sport = |port: u16| matches("==", payload("udp", "sport"), json!(port));
        let udp_dport = |port: u16| matches("==", payload("udp", "dport"), json!(port));
        // goto, not jump: a protocol chain's verdict is final, nothing after
        // the dispatch runs for a frame that was dispatched.
        let goto = |chain: &str| json!({"goto": {"target": chain}});
        commands.extend([
            // Its own MAC; then by protocol. Nothing but IPv4, ARP and IPv6
            // (no VLAN tags that could carry anything inside).
            drop(
                &main,
                vec![matches("!=", payload("ether", "saddr"), mac.clone())],
            ),
            rule(
                &main,
                vec![
                    json!({"vmap": {"key": payload("ether", "type"), "data": {"set": [
                        ["arp", goto(&arp)], ["ip", goto(&ip4)], ["ip6", goto(&ip6)],
                    ]}}}),
                ],
            ),
            drop(&main, vec![]),
            // ARP: its own MAC and IPv4 as sender (0.0.0.0 for probes,
            // RFC 5227).
            drop(
                &arp,
                vec![matches("!=", payload("arp", "saddr ether"), mac)],
            ),
            drop(
                &arp,
                vec![matches(
                    "!=",
                    payload("arp", "saddr ip"),
                    set(vec![ip.clone(), json!("0.0.0.0")]),
                )],
            ),
            accept(&arp, vec![]),
            // IPv4: never a DHCP server (whatever its source port: clients
            // look at the destination); as a client, only for its own MAC
            // (chaddr, 28 bytes into the message), so it cannot drain the
            // pool or take another's lease; its own address, or 0.0.0.0 as
            // a DHCP client.
            drop(&ip4, vec![udp_sport(67)]),
            drop(&ip4, vec![udp_dport(68)]),
            drop(
                &ip4,
                vec![
                    udp_dport(67),
                    matches("!=", dhcp_chaddr(), json!(mac_number(&port.mac))),
                ],
            ),
            accept(&ip4, vec![matches("==", payload("ip", "saddr"), ip)]),
            accept(
                &ip4,
                vec![
                    matches("==", payload("ip", "saddr"), json!("0.0.0.0")),
                    udp_sport(68),
                    matches("==", payload("udp", "dport"), json!(67)),
                ],
            ),
            drop(&ip4, vec![]),
            // IPv6: no fragments from link-local addresses or to link-local
            // multicast (RFC 7113: a first fragment without the ICMPv6
            // header would slip an RA past the next rules); no router
            // advertisements or redirects, no DHCPv6 server, neighbour
            // advertisements only for its own addresses.
            drop(
                &ip6,
                vec![
                    fragment(),
                    matches("==", payload("ip6", "saddr"), prefix("fe80::", 10)),
                ],
            ),
            drop(
                &ip6,
                vec![
                    fragment(),
                    matches("==", payload("ip6", "daddr"), prefix("ff02::", 16)),
                ],
            ),
            drop(
                &ip6,
                vec![icmpv6(set(vec![
                    json!("nd-router-advert"),
                    json!("nd-redirect"),
                ]))],
            ),
            drop(&ip6, vec![udp_sport(547)]),
            drop(&ip6, vec![udp_dport(546)]),
            drop(
                &ip6,
                vec![
                    icmpv6(json!("nd-neighbor-advert")),
                    matches("!=", nd_target(), set(own6_numbers.clone())),
                ],
            ),
            accept(
                &ip6,
                vec![matches("==", payload("ip6", "saddr"), set(own6))],
            ),
            // `::` only for duplicate address detection of its own
            // addresses, and the multicast listener reports that go with it.
            accept(
                &ip6,
                vec![
                    matches("==", payload("ip6", "saddr"), json!("::")),
                    icmpv6(set(vec![
                        json!("mld-listener-report"),
                        json!("mld2-listener-report"),
                    ])),
                ],
            ),
            accept(
                &ip6,
                vec![
                    matches("==", payload("ip6", "saddr"), json!("::")),
                    icmpv6(json!("nd-neighbor-solicit")),
                    matches("==", nd_target(), set(own6_numbers)),
                ],
            ),
            drop(&ip6, vec![]),
        ]);
        let elem = json!({"family": FAMILY, "table": TABLE, "name": PORTS,
            "elem": [[tap, {"jump": {"target": tap}}]]});
        commands.push(json!({"add": {"element": elem}}));
    }
    if port.isolated {
        let elem = json!({"family": FAMILY, "table": TABLE, "name": ISOLATED, "elem": [tap]});
        commands.push(json!({"add": {"element": elem}}));
    }
    commands
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port() -> PortGuard {
        PortGuard {
            tap: "lnt0123456789ab".into(),
            mac: "52:54:00:12:34:56".parse().unwrap(),
            ipv4: "192.168.105.2".parse().unwrap(),
            ipv6: vec![
                "fe80::5054:ff:fe12:3456".parse().unwrap(),
                "fd00::5054:ff:fe12:3456".parse().unwrap(),
            ],
            anti_spoofing: true,
            isolated: false,
        }
    }

    /// The rules of `chain`, as their expression arrays.
    fn rules(commands: &[Value], chain: &str) -> Vec<Value> {
        commands
            .iter()
            .filter_map(|c| c["add"].get("rule"))
            .filter(|r| r["chain"] == chain)
            .map(|r| r["expr"].clone())
            .collect()
    }

    #[test]
    fn a_port_gets_its_counter_chains_rules_and_map_element() {
        let cmds = port_commands(&port());
        assert_eq!(cmds[0]["add"]["counter"]["name"], "lnt0123456789ab");
        let chains: Vec<&Value> = cmds
            .iter()
            .filter_map(|c| c["add"]["chain"].get("name"))
            .collect();
        assert_eq!(
            chains,
            [
                "lnt0123456789ab",
                "lnt0123456789ab-arp",
                "lnt0123456789ab-ip",
                "lnt0123456789ab-ip6"
            ]
        );
        let last = cmds.last().unwrap();
        assert_eq!(
            last["add"]["element"]["elem"],
            json!([["lnt0123456789ab", {"jump": {"target": "lnt0123456789ab"}}]])
        );
        let main = rules(&cmds, "lnt0123456789ab");
        assert_eq!(main.len(), 3);
        assert_eq!(main[0][0]["match"]["right"], "52:54:00:12:34:56");
        assert_eq!(
            main[1][0]["vmap"]["data"]["set"][1],
            json!(["ip", {"goto": {"target": "lnt0123456789ab-ip"}}])
        );
        assert_eq!(
            main[2],
            json!([{"counter": "lnt0123456789ab"}, {"drop": null}]),
            "other ether types"
        );
        for chain in chains {
            for r in rules(&cmds, chain.as_str().unwrap()) {
                let last = r.as_array().unwrap().last().unwrap();
                if last == &json!({"drop": null}) {
                    let n = r.as_array().unwrap().len();
                    assert_eq!(
                        r[n - 2],
                        json!({"counter": "lnt0123456789ab"}),
                        "every drop is counted: {r}"
                    );
                }
            }
        }
        let arp = rules(&cmds, "lnt0123456789ab-arp");
        assert_eq!(
            arp[1][0]["match"]["right"],
            json!({"set": ["192.168.105.2", "0.0.0.0"]})
        );
        let ip = rules(&cmds, "lnt0123456789ab-ip");
        assert_eq!(
            ip[0][0]["match"]["left"]["payload"]["field"], "sport",
            "no DHCP server"
        );
        assert_eq!(ip[1][0]["match"]["right"], 68, "nothing to DHCP clients");
        assert_eq!(
            ip[2][1]["match"],
            json!({"op": "!=", "left": {"payload": {"base": "th", "offset": 288, "len": 48}}, "right": 0x5254_0012_3456u64}),
            "DHCP requests only for its own MAC"
        );
        assert_eq!(
            ip[3][0]["match"]["right"], "192.168.105.2",
            "then its own address passes"
        );
        let ip6 = rules(&cmds, "lnt0123456789ab-ip6");
        assert_eq!(
            ip6[0][0],
            json!({"match": {"op": "==", "left": {"exthdr": {"name": "frag"}}, "right": true}})
        );
        assert_eq!(
            ip6[2][0]["match"]["right"],
            json!({"set": ["nd-router-advert", "nd-redirect"]})
        );
        assert_eq!(
            ip6[4][0]["match"]["right"], 546,
            "nothing to DHCPv6 clients"
        );
        assert_eq!(
            ip6[5][1]["match"]["right"],
            json!({"set": ["0xfe80000000000000505400fffe123456", "0xfd00000000000000505400fffe123456"]}),
            "neighbour advertisements only for its own addresses"
        );
        assert_eq!(ip6.last().unwrap()[1], json!({"drop": null}));
    }

    #[test]
    fn without_anti_spoofing_only_isolation_remains() {
        let mut p = port();
        p.anti_spoofing = false;
        p.isolated = true;
        let cmds = port_commands(&p);
        assert!(
            cmds.iter()
                .all(|c| c["add"].get("rule").is_none() && c["add"].get("chain").is_none())
        );
        assert_eq!(cmds[cmds.len() - 1]["add"]["element"]["name"], "isolated");
    }

    #[test]
    fn counters_are_read_from_nft_json() {
        let out = r#"{"nftables": [{"metainfo": {}}, {"counter": {"family": "bridge", "name": "lnta", "table": "linnet", "handle": 3, "packets": 7, "bytes": 420}}]}"#;
        assert_eq!(
            parse_counters(out),
            BTreeMap::from([("lnta".to_string(), 7)])
        );
        assert!(parse_counters("garbage").is_empty());
    }
}
