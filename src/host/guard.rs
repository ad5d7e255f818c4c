//! Anti-spoofing and isolation on the bridges, in linnet's own table
//! `bridge linnet`. Every frame a VM sends enters its bridge through its
//! TAP, where the `prerouting` hook sends frames of guarded TAPs through one
//! fixed set of rules; what is each TAP's own (its MAC, its IPv4, its IPv6
//! addresses) lives in sets keyed by the TAP's name, looked up as
//! `iifname . address`. Drops are counted per TAP in a dynamic set with
//! counters. No userspace on the datapath.
//!
//! Guarding a TAP is adding its set elements (one transaction, before the
//! VM gets its fd) and unguarding is deleting them: the rules never change,
//! so an attach costs the same with 1 or 1000 interfaces. (Chains or rules
//! per TAP would make nftables re-read them all at every change: measured
//! at 32 s for 1000 attaches.)
//!
//! Frames to the 802.1 link-local group, 01:80:c2:00:00:0x, never pass the
//! bridge's hooks: the bridge does not forward them but hands them to the
//! TAP's own stack, which has no address; the bridges are made not to learn
//! source MACs from them.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use serde_json::{Value, json};

use super::nft::{Nft, NftError};
use super::ruleset::{Shape, linnet_shape};
use crate::forward::Protocol;
use crate::policy::ListenRule;
use crate::types::MacAddr;

const FAMILY: &str = "bridge";
const EGRESS_FAMILY: &str = "netdev";
const TABLE: &str = "linnet";

/// The table, in nft's own syntax: fixed text of linnet's, nothing from
/// users in it. Every drop also counts the frame for its TAP in `drops`.
const SETS: &str = r#"
    # TAPs whose frames are checked, and those kept apart.
    set guarded { type ifname; }
    set isolated { type ifname; }
    # TAPs whose VM may be a DHCP server: on networks where linnet's is off.
    set dhcp_servers { type ifname; }
    # What each TAP's VM may send from.
    set macs { type ifname . ether_addr; }
    set ipv4 { type ifname . ipv4_addr; }
    # Ranges, for VMs whose address linnet does not know (no DHCP).
    set ipv4ranges { type ifname . ipv4_addr; flags interval; }
    set ipv6 { type ifname . ipv6_addr; }
    # Its MAC as the 48-bit chaddr of a DHCP message (byte 28 of BOOTP,
    # after the 8-byte UDP header), and its IPv6 addresses as the 128-bit
    # target of a neighbour solicitation or advertisement.
    set chaddr { typeof meta iifname . @th,288,48; }
    set ndtarget { typeof meta iifname . @th,64,128; }
    # TAPs whose VM accepts connections only on some ports (a listen
    # policy), and those ports.
    set listen_policed { type ifname; }
    set listen { type ifname . inet_proto . inet_service; flags interval; }
    # Frames dropped, per TAP.
    set drops { type ifname; flags dynamic; counter; size 65535; }

"#;

/// Frames a guarded TAP's VM sends enter here.
const PREROUTING: &str = r#"
    chain prerouting {
        type filter hook prerouting priority filter; policy accept;
        iifname @guarded jump guard
    }

"#;

/// What a VM may send: the same chains for a TAP (checked as its frames
/// enter the bridge, `iifname`) and a macvtap (as they leave it for the
/// NIC, where the same text reads `oifname`).
const SENDER_CHAINS: &str = r#"
    # Its own MAC; then by protocol, nothing but IPv4, ARP and IPv6 (no
    # VLAN tags that could carry anything inside).
    chain guard {
        meta iifname . ether saddr != @macs update @drops { meta iifname } drop
        ether type vmap { arp : goto from_arp, ip : goto from_ip, ip6 : goto from_ip6 }
        update @drops { meta iifname } drop
    }

    # Its own MAC and IPv4 as sender; 0.0.0.0 for address probes (RFC
    # 5227) of its own address only: a probe for another's address, while
    # that one checks it, would make it decline its lease.
    chain from_arp {
        meta iifname . arp saddr ether != @macs update @drops { meta iifname } drop
        meta iifname . arp saddr ip @ipv4 accept
        meta iifname . arp saddr ip @ipv4ranges accept
        arp saddr ip 0.0.0.0 meta iifname . arp daddr ip @ipv4 accept
        arp saddr ip 0.0.0.0 meta iifname . arp daddr ip @ipv4ranges accept
        update @drops { meta iifname } drop
    }

    # Never a DHCP server (whatever the source port: clients look at the
    # destination), unless its network leaves DHCP to the VMs (linnet's is
    # off there); DHCP requests only for its own MAC; its own address, or
    # 0.0.0.0 as a DHCP client.
    chain from_ip {
        udp sport 67 iifname != @dhcp_servers update @drops { meta iifname } drop
        udp dport 68 iifname != @dhcp_servers update @drops { meta iifname } drop
        udp dport 67 jump dhcp_request
        meta iifname . ip saddr @ipv4 accept
        meta iifname . ip saddr @ipv4ranges accept
        ip saddr 0.0.0.0 udp sport 68 udp dport 67 accept
        update @drops { meta iifname } drop
    }

    # A DHCP request only for its own MAC, so it can neither drain the pool
    # nor take another's lease: a request whose chaddr is not there to read
    # (cut short, or a first fragment whose rest would carry it) is dropped.
    chain dhcp_request {
        ip frag-off & 0x2000 != 0 update @drops { meta iifname } drop
        meta iifname . @th,288,48 @chaddr return
        update @drops { meta iifname } drop
    }

    # First fragments whole (below); no fragments from link-local addresses
    # or to link-local multicast (RFC 7113); no router advertisements or
    # redirects, no DHCPv6 server; neighbour advertisements only for its own
    # addresses; its own addresses, or :: for duplicate address detection of
    # them and the multicast listener reports that go with it.
    chain from_ip6 {
        frag frag-off 0 jump first_fragment6
        exthdr frag exists ip6 saddr fe80::/10 update @drops { meta iifname } drop
        exthdr frag exists ip6 daddr ff02::/16 update @drops { meta iifname } drop
        icmpv6 type { nd-router-advert, nd-redirect } update @drops { meta iifname } drop
        udp sport 547 update @drops { meta iifname } drop
        udp dport 546 update @drops { meta iifname } drop
        icmpv6 type nd-neighbor-advert meta iifname . @th,64,128 != @ndtarget update @drops { meta iifname } drop
        meta iifname . ip6 saddr @ipv6 accept
        ip6 saddr :: icmpv6 type { mld-listener-report, mld2-listener-report } accept
        ip6 saddr :: icmpv6 type nd-neighbor-solicit meta iifname . @th,64,128 @ndtarget accept
        update @drops { meta iifname } drop
    }

    # A first fragment carries the whole header chain and its transport
    # header (RFC 7112), or the rules above would judge it by what is not
    # there: 20 bytes of TCP, 8 of UDP or ICMPv6, and never a neighbour
    # discovery message (RFC 6980). ESP, GRE and SCTP (tunnels and VPNs
    # from a VM) are not looked into by any rule here, so theirs pass;
    # anything else, a chain cut short included, is dropped.
    chain first_fragment6 {
        meta l4proto tcp @th,152,8 & 0 == 0 return
        meta l4proto udp @th,56,8 & 0 == 0 return
        icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect } update @drops { meta iifname } drop
        meta l4proto ipv6-icmp @th,56,8 & 0 == 0 return
        meta l4proto { esp, gre, sctp } return
        update @drops { meta iifname } drop
    }

"#;

/// What reaches a VM through its bridge.
const BRIDGE_CHAINS: &str = r#"
    # Frames between two ports of an isolated network (their VMs); frames
    # to and from the host pass.
    chain forward {
        type filter hook forward priority filter; policy accept;
        iifname @isolated oifname @isolated drop
        oifname @guarded jump to_port
    }

    chain output {
        type filter hook output priority filter; policy accept;
        oifname @guarded jump to_port
    }

    # Unicast leaves through a guarded port only for its VM's own MAC:
    # never another VM's frames, whatever the bridge's table says (a VMM
    # that gave its TAP another VM's MAC, in the moment before linnet takes
    # that TAP off; unknown unicast, which the bridge floods to every port).
    chain to_port {
        oifname @listen_policed goto to_policed_port
        ether daddr & 01:00:00:00:00:00 != 00:00:00:00:00:00 return
        meta oifname . ether daddr != @macs drop
    }

    # The same for a VM with a listen policy, whose broadcast and multicast
    # (by MAC, or by address inside a frame to its own MAC) are sorted.
    chain to_policed_port {
        meta oifname . ip daddr != @ipv4 goto to_policed_group
        meta oifname . ip6 daddr != @ipv6 goto to_policed_group
        ether daddr & 01:00:00:00:00:00 != 00:00:00:00:00:00 goto to_policed_group
        meta oifname . ether daddr != @macs drop
    }

    # Broadcast and multicast to a VM with a listen policy (by MAC, or by
    # address inside a frame to its own MAC): what keeps its network
    # working (ARP, neighbour discovery, router advertisements, MLD, DHCP
    # replies, pings), and its allowed ports; nothing else. (Packets to its
    # own addresses are judged by the policy chains of inet linnet.)
    chain to_policed_group {
        ether type arp return
        icmpv6 type { nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, mld-listener-query, echo-request } return
        icmp type echo-request return
        udp sport 67 udp dport 68 return
        meta oifname . meta l4proto . th dport @listen return
        drop
    }
"#;

/// The bridge table, in nft's own syntax.
fn ruleset() -> String {
    format!("table {FAMILY} {TABLE} {{\n{SETS}{PREROUTING}{SENDER_CHAINS}{BRIDGE_CHAINS}}}\n")
}

/// The netdev table of macvtaps (`mode: bridged`): the same sets and
/// checks, hooked per macvtap at its egress (its VM's frames leave
/// through it for the NIC and never pass a bridge), where the port is the
/// output interface.
fn egress_ruleset() -> String {
    format!("table {EGRESS_FAMILY} {TABLE} {{\n{SETS}{SENDER_CHAINS}}}\n")
        .replace("iifname", "oifname")
}

/// The IPv4 sources a VM may use.
#[derive(Debug, Clone, PartialEq)]
pub enum Ipv4Source {
    /// Its lease.
    Address(Ipv4Addr),
    /// Inclusive ranges: its network's, when linnet does not know which
    /// address the guest set itself.
    Ranges(Vec<(Ipv4Addr, Ipv4Addr)>),
}

/// Where a port's frames are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// A TAP: as its frames enter its bridge (table `bridge linnet`).
    Bridge,
    /// A macvtap: as its frames leave it for the NIC (table `netdev
    /// linnet`, a base chain per macvtap).
    Egress,
}

/// What one TAP's (or macvtap's) VM may send from.
#[derive(Debug, Clone, PartialEq)]
pub struct PortGuard {
    pub tap: String,
    pub hook: Hook,
    pub mac: MacAddr,
    pub ipv4: Ipv4Source,
    /// Its link-local address and, on a network with IPv6, its SLAAC one.
    pub ipv6: Vec<Ipv6Addr>,
    /// Anti-spoofing (off: only isolation, if any).
    pub anti_spoofing: bool,
    pub isolated: bool,
    /// May answer DHCP (its network has linnet's DHCP off).
    pub dhcp_server: bool,
    /// With a listen policy: the only ports its VM gets broadcast and
    /// multicast on (beyond what its network needs).
    pub listen: Option<Vec<ListenRule>>,
}

/// The table made anew with `ports` guarded, in one transaction: there is
/// no moment with the rules in place but a port's elements missing (its
/// frames would pass unchecked).
pub fn create_with(nft: &mut Nft, ports: &[PortGuard]) -> Result<(), NftError> {
    let mut script = format!(
        "add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n{}",
        ruleset()
    );
    let egress: Vec<&PortGuard> = ports.iter().filter(|p| p.hook == Hook::Egress).collect();
    if !egress.is_empty() {
        script.push_str(&format!(
            "add table {EGRESS_FAMILY} {TABLE}\ndelete table {EGRESS_FAMILY} {TABLE}\n{}",
            egress_ruleset()
        ));
    } else {
        // None left to guard: a table left from before goes.
        script.push_str(&format!(
            "add table {EGRESS_FAMILY} {TABLE}\ndelete table {EGRESS_FAMILY} {TABLE}\n"
        ));
    }
    for port in ports {
        for elem in elements(port) {
            script.push_str(&element_text(&elem));
        }
    }
    // The macvtaps' hooks in the same transaction: no moment with the
    // table back but a macvtap's frames unchecked.
    for port in egress.iter().filter(|p| p.anti_spoofing) {
        let (tap, chain) = (&port.tap, format!("port_{}", port.tap));
        script.push_str(&format!(
            "add chain {EGRESS_FAMILY} {TABLE} {chain} {{ type filter hook egress device \"{tap}\" priority filter; policy accept; }}\nadd rule {EGRESS_FAMILY} {TABLE} {chain} jump guard\n"
        ));
    }
    nft.run(&script)?;
    if !egress.is_empty()
        && EGRESS_SHAPE.get().is_none()
        && let Ok(Some(mut shape)) = linnet_shape(nft, EGRESS_FAMILY)
    {
        shape.retain(|chain, _| !chain.starts_with("port_"));
        let _ = EGRESS_SHAPE.set(shape);
    }
    if SHAPE.get().is_none()
        && let Ok(Some(shape)) = linnet_shape(nft, FAMILY)
    {
        let _ = SHAPE.set(shape);
    }
    Ok(())
}

/// The table's chains and rule counts as the first `create` made them
/// (the same text every time), to tell later that something was deleted.
static SHAPE: OnceLock<Shape> = OnceLock::new();

/// The table's shape as `create` makes it (known once it has).
pub fn expected_shape() -> Option<&'static Shape> {
    SHAPE.get()
}

/// The macvtaps' table's fixed chains as it was first made, to which each
/// guarded macvtap adds its chain of one rule.
static EGRESS_SHAPE: OnceLock<Shape> = OnceLock::new();

/// The macvtaps' table's shape with `ports` guarded (known once the
/// table was made).
pub fn expected_egress_shape(ports: &[PortGuard]) -> Option<Shape> {
    let mut shape = EGRESS_SHAPE.get()?.clone();
    for port in ports
        .iter()
        .filter(|p| p.hook == Hook::Egress && p.anti_spoofing)
    {
        shape.insert(format!("port_{}", port.tap), 1);
    }
    Some(shape)
}

/// Makes the macvtaps' table (empty of ports), recording its shape.
fn create_egress(nft: &mut Nft) -> Result<(), NftError> {
    nft.run(&egress_ruleset())?;
    if EGRESS_SHAPE.get().is_none()
        && let Ok(Some(shape)) = linnet_shape(nft, EGRESS_FAMILY)
    {
        let _ = EGRESS_SHAPE.set(shape);
    }
    Ok(())
}

/// Removes the tables, if there are any.
pub fn remove(nft: &mut Nft) -> Result<(), NftError> {
    let commands = [FAMILY, EGRESS_FAMILY]
        .into_iter()
        .flat_map(|family| {
            let table = json!({"family": family, "name": TABLE});
            [
                json!({"add": {"table": table}}),
                json!({"delete": {"table": table}}),
            ]
        })
        .collect();
    run(nft, commands)
}

/// Guards one TAP (the table must exist).
pub fn add_port(nft: &mut Nft, port: &PortGuard) -> Result<(), NftError> {
    add_ports(nft, std::slice::from_ref(port))
}

/// Guards several ports in one transaction (all or none); macvtaps'
/// elements go in before their hooks.
pub fn add_ports(nft: &mut Nft, ports: &[PortGuard]) -> Result<(), NftError> {
    if ports.iter().any(|p| p.hook == Hook::Egress) && !egress_table_exists(nft) {
        create_egress(nft)?;
    }
    let mut commands: Vec<Value> = ports
        .iter()
        .flat_map(elements)
        .map(|elem| json!({"add": {"element": elem}}))
        .collect();
    commands.extend(ports.iter().flat_map(egress_hook));
    run(nft, commands)
}

fn egress_table_exists(nft: &mut Nft) -> bool {
    nft.run(&format!("list table {EGRESS_FAMILY} {TABLE}"))
        .is_ok()
}

/// A macvtap's base chain, hooked at its egress, that sends what it
/// carries through the checks: made with its guard, deleted (`unhook`)
/// before the macvtap is.
fn egress_hook(port: &PortGuard) -> Vec<Value> {
    if port.hook != Hook::Egress || !port.anti_spoofing {
        return Vec::new();
    }
    let name = format!("port_{}", port.tap);
    vec![
        json!({"add": {"chain": {
            "family": EGRESS_FAMILY, "table": TABLE, "name": name,
            "type": "filter", "hook": "egress", "dev": port.tap, "prio": 0, "policy": "accept"
        }}}),
        json!({"add": {"rule": {
            "family": EGRESS_FAMILY, "table": TABLE, "chain": name,
            "expr": [{"jump": {"target": "guard"}}]
        }}}),
    ]
}

/// Deletes the hooks of macvtaps about to go (a hook on a device that is
/// gone is the kernel's to drop, and older kernels drop its chain).
pub fn unhook(nft: &mut Nft, ports: &[PortGuard]) -> Result<(), NftError> {
    let commands: Vec<Value> = ports
        .iter()
        .filter(|p| p.hook == Hook::Egress && p.anti_spoofing)
        .map(|p| {
            json!({"delete": {"chain": {
                "family": EGRESS_FAMILY, "table": TABLE, "name": format!("port_{}", p.tap)
            }}})
        })
        .collect();
    if commands.is_empty() {
        return Ok(());
    }
    run(nft, commands)
}

/// Changes a guarded port from `old` to `new` in one transaction: no
/// moment with neither in place.
pub fn update_port(nft: &mut Nft, old: &PortGuard, new: &PortGuard) -> Result<(), NftError> {
    let (before, after) = (elements(old), elements(new));
    let mut commands = Vec::new();
    for elem in before.iter().filter(|e| !after.contains(e)) {
        commands.push(json!({"add": {"element": elem.clone()}}));
        commands.push(json!({"delete": {"element": elem.clone()}}));
    }
    for elem in after.iter().filter(|e| !before.contains(e)) {
        commands.push(json!({"add": {"element": elem.clone()}}));
    }
    if commands.is_empty() {
        return Ok(());
    }
    run(nft, commands)
}

/// Removes the TAPs' elements and drop counts, each batch of ports in one
/// transaction. Each element is added before it is deleted, so the delete
/// is valid whether or not it was there.
pub fn remove_ports(nft: &mut Nft, ports: &[PortGuard]) -> Result<(), NftError> {
    // In batches: nftables takes far more memory to read one batch for a
    // thousand ports than ten for a hundred (measured: 160 MiB of heap).
    for batch in ports.chunks(REMOVE_BATCH) {
        remove_batch(nft, batch)?;
    }
    Ok(())
}

/// Ports whose elements one transaction removes.
const REMOVE_BATCH: usize = 100;

fn remove_batch(nft: &mut Nft, ports: &[PortGuard]) -> Result<(), NftError> {
    let mut commands = Vec::new();
    for port in ports {
        let mut all = elements(&PortGuard {
            anti_spoofing: true,
            isolated: true,
            dhcp_server: true,
            ..port.clone()
        });
        all.push(element(port.hook, "drops", json!(port.tap)));
        for elem in all {
            commands.push(json!({"add": {"element": elem.clone()}}));
            commands.push(json!({"delete": {"element": elem}}));
        }
    }
    run(nft, commands)
}

/// A set element (as `elements` makes it in JSON) as an nft command. Its
/// parts are linnet's own: TAP names it chose, addresses, MACs, numbers.
fn element_text(elem: &Value) -> String {
    let part = |v: &Value| match v {
        Value::String(s) if s.starts_with("0x") => s.clone(),
        Value::String(s)
            if s.starts_with(super::TAP_PREFIX) || s.starts_with(super::MACVTAP_PREFIX) =>
        {
            format!("\"{s}\"")
        }
        Value::String(s) => s.clone(),
        Value::Object(o) if o.contains_key("range") => {
            let end = |v: &Value| {
                v.as_str()
                    .map(String::from)
                    .unwrap_or_else(|| v.to_string())
            };
            format!("{}-{}", end(&o["range"][0]), end(&o["range"][1]))
        }
        other => other.to_string(),
    };
    let value = &elem["elem"][0];
    let text = match value.get("concat").and_then(Value::as_array) {
        Some(parts) => parts.iter().map(part).collect::<Vec<_>>().join(" . "),
        None => part(value),
    };
    format!(
        "add element {} {TABLE} {} {{ {text} }}\n",
        elem["family"].as_str().unwrap_or(FAMILY),
        elem["name"].as_str().unwrap_or_default()
    )
}

/// Frames dropped so far, by TAP or macvtap.
pub fn drops(nft: &mut Nft) -> Result<BTreeMap<String, u64>, NftError> {
    let out = nft.run(&format!("list set {FAMILY} {TABLE} drops"))?;
    let mut drops = parse_drops(&out);
    // Only while a macvtap is guarded.
    if let Ok(out) = nft.run(&format!("list set {EGRESS_FAMILY} {TABLE} drops")) {
        drops.extend(parse_drops(&out));
    }
    Ok(drops)
}

/// The `drops` set as nft lists it: elements with their counters.
fn parse_drops(json: &str) -> BTreeMap<String, u64> {
    let doc: Value = serde_json::from_str(json).unwrap_or_else(|e| {
        tracing::warn!("cannot read nft's drop counts ({e}): {json}");
        Value::Null
    });
    doc["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.get("set")?.get("elem")?.as_array())
        .flatten()
        .filter_map(|e| {
            let e = e.get("elem")?;
            Some((
                e["val"].as_str()?.to_string(),
                e["counter"]["packets"].as_u64()?,
            ))
        })
        .collect()
}

fn run(nft: &mut Nft, commands: Vec<Value>) -> Result<(), NftError> {
    nft.run(&json!({ "nftables": commands }).to_string())
        .map(|_| ())
}

fn element(hook: Hook, set: &str, elem: Value) -> Value {
    let family = match hook {
        Hook::Bridge => FAMILY,
        Hook::Egress => EGRESS_FAMILY,
    };
    json!({"family": family, "table": TABLE, "name": set, "elem": [elem]})
}

fn concat(tap: &str, value: Value) -> Value {
    json!({"concat": [tap, value]})
}

/// A number as the hex string nft takes for a raw payload's value.
fn hex(n: u128) -> Value {
    Value::String(format!("{n:#x}"))
}

fn mac_number(mac: &MacAddr) -> u128 {
    mac.0.iter().fold(0, |n, b| (n << 8) | u128::from(*b))
}

/// A listen policy's ports per protocol, overlapping and adjacent ranges
/// merged: an interval set refuses elements that overlap.
fn listen_ranges(rules: &[ListenRule]) -> Vec<(&'static str, u16, u16)> {
    let mut ranges: Vec<(&'static str, u16, u16)> = rules
        .iter()
        .flat_map(|rule| {
            let protocols = match rule.protocol {
                Some(p) => vec![p],
                None => vec![Protocol::Tcp, Protocol::Udp],
            };
            protocols
                .into_iter()
                .map(move |p| (p.as_str(), rule.ports.first, rule.ports.last))
        })
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(&'static str, u16, u16)> = Vec::new();
    for (protocol, first, last) in ranges {
        match merged.last_mut() {
            Some((p, _, end)) if *p == protocol && u32::from(first) <= u32::from(*end) + 1 => {
                *end = (*end).max(last);
            }
            _ => merged.push((protocol, first, last)),
        }
    }
    merged
}

/// The set elements that guard `port`.
fn elements(port: &PortGuard) -> Vec<Value> {
    let tap = port.tap.as_str();
    let element = |set: &str, elem: Value| element(port.hook, set, elem);
    let mut out = Vec::new();
    if port.anti_spoofing {
        out.push(element("guarded", json!(tap)));
        out.push(element("macs", concat(tap, json!(port.mac.to_string()))));
        match &port.ipv4 {
            Ipv4Source::Address(ip) => {
                out.push(element("ipv4", concat(tap, json!(ip.to_string()))));
            }
            Ipv4Source::Ranges(ranges) => {
                for (a, b) in ranges {
                    let range = json!({"range": [a.to_string(), b.to_string()]});
                    out.push(element("ipv4ranges", concat(tap, range)));
                }
            }
        }
        out.push(element("chaddr", concat(tap, hex(mac_number(&port.mac)))));
        for ip in &port.ipv6 {
            out.push(element("ipv6", concat(tap, json!(ip.to_string()))));
            out.push(element("ndtarget", concat(tap, hex(u128::from(*ip)))));
        }
    }
    if port.anti_spoofing
        && let Some(rules) = &port.listen
    {
        out.push(element("listen_policed", json!(tap)));
        for (protocol, first, last) in listen_ranges(rules) {
            let key = json!({"concat": [tap, protocol, {"range": [first, last]}]});
            out.push(element("listen", key));
        }
    }
    if port.anti_spoofing && port.dhcp_server {
        out.push(element("dhcp_servers", json!(tap)));
    }
    if port.isolated {
        out.push(element("isolated", json!(tap)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port() -> PortGuard {
        PortGuard {
            tap: "lnt0123456789ab".into(),
            hook: Hook::Bridge,
            mac: "52:54:00:12:34:56".parse().unwrap(),
            ipv4: Ipv4Source::Address("192.168.105.2".parse().unwrap()),
            ipv6: vec![
                "fe80::5054:ff:fe12:3456".parse().unwrap(),
                "fd00::5054:ff:fe12:3456".parse().unwrap(),
            ],
            anti_spoofing: true,
            isolated: false,
            dhcp_server: false,
            listen: None,
        }
    }

    fn by_set(elements: &[Value]) -> BTreeMap<String, Vec<Value>> {
        let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for e in elements {
            out.entry(e["name"].as_str().unwrap().into())
                .or_default()
                .push(e["elem"][0].clone());
        }
        out
    }

    #[test]
    fn a_port_is_its_elements_keyed_by_its_tap() {
        let sets = by_set(&elements(&port()));
        let tap = "lnt0123456789ab";
        assert_eq!(sets["guarded"], [json!(tap)]);
        assert_eq!(
            sets["macs"],
            [json!({"concat": [tap, "52:54:00:12:34:56"]})]
        );
        assert_eq!(sets["ipv4"], [json!({"concat": [tap, "192.168.105.2"]})]);
        assert_eq!(sets["chaddr"], [json!({"concat": [tap, "0x525400123456"]})]);
        assert_eq!(
            sets["ndtarget"],
            [
                json!({"concat": [tap, "0xfe80000000000000505400fffe123456"]}),
                json!({"concat": [tap, "0xfd00000000000000505400fffe123456"]})
            ]
        );
        assert_eq!(sets["ipv6"].len(), 2);
        assert!(!sets.contains_key("isolated"));
    }

    #[test]
    fn an_unknown_ipv4_address_is_any_of_the_ranges() {
        let mut p = port();
        let (a, b) = (
            "192.168.105.2".parse().unwrap(),
            "192.168.105.254".parse().unwrap(),
        );
        p.ipv4 = Ipv4Source::Ranges(vec![(a, b)]);
        let sets = by_set(&elements(&p));
        assert!(!sets.contains_key("ipv4"));
        assert_eq!(
            sets["ipv4ranges"],
            [
                json!({"concat": ["lnt0123456789ab", {"range": ["192.168.105.2", "192.168.105.254"]}]})
            ]
        );
    }

    #[test]
    fn without_linnets_dhcp_a_vm_may_serve_dhcp() {
        assert!(!by_set(&elements(&port())).contains_key("dhcp_servers"));
        let mut p = port();
        p.dhcp_server = true;
        assert_eq!(
            by_set(&elements(&p))["dhcp_servers"],
            [json!("lnt0123456789ab")]
        );
    }

    #[test]
    fn without_anti_spoofing_only_isolation_remains() {
        let mut p = port();
        p.anti_spoofing = false;
        p.isolated = true;
        let sets = by_set(&elements(&p));
        assert_eq!(sets.keys().collect::<Vec<_>>(), ["isolated"]);
    }

    #[test]
    fn the_ruleset_counts_every_drop_and_names_every_set_it_uses() {
        let ruleset = ruleset();
        for line in ruleset.lines().map(str::trim) {
            if line.ends_with(" drop") && !line.contains("oifname") {
                assert!(
                    line.contains("update @drops { meta iifname } drop"),
                    "{line}"
                );
            }
        }
        for set in [
            "guarded",
            "isolated",
            "macs",
            "ipv4",
            "ipv4ranges",
            "ipv6",
            "chaddr",
            "ndtarget",
            "drops",
        ] {
            assert!(ruleset.contains(&format!("set {set} {{")), "{set}");
            assert!(ruleset.contains(&format!("@{set}")), "{set} is used");
        }
    }

    #[test]
    fn a_macvtap_is_checked_as_its_frames_leave_it_by_the_same_rules() {
        let egress = egress_ruleset();
        assert!(egress.starts_with("table netdev linnet {"), "{egress}");
        assert!(!egress.contains("iifname") && !egress.contains("hook prerouting"));
        assert!(
            egress.contains(
                "meta oifname . ether saddr != @macs update @drops { meta oifname } drop"
            )
        );
        assert!(egress.contains("chain dhcp_request {") && egress.contains("chain from_ip6 {"));
        let mut p = port();
        p.tap = "lnv7".into();
        p.hook = Hook::Egress;
        assert!(elements(&p).iter().all(|e| e["family"] == "netdev"));
        let hook = egress_hook(&p);
        assert_eq!(hook[0]["add"]["chain"]["dev"], "lnv7");
        assert_eq!(hook[0]["add"]["chain"]["hook"], "egress");
        assert_eq!(hook[1]["add"]["rule"]["expr"][0]["jump"]["target"], "guard");
        assert!(
            egress_hook(&port()).is_empty(),
            "a TAP has no hook of its own"
        );
        let text: String = elements(&p).iter().map(element_text).collect();
        assert!(text.contains("add element netdev linnet macs { \"lnv7\" . 52:54:00:12:34:56 }"));
    }

    #[test]
    fn overlapping_listen_ports_become_one_range_per_protocol() {
        let rules: Vec<ListenRule> = ["1-65535", "80/tcp", "8000", "8000-8010/tcp", "9000/udp"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        assert_eq!(
            listen_ranges(&rules),
            [("tcp", 1, 65535), ("udp", 1, 65535)]
        );
        let rules: Vec<ListenRule> = ["22/tcp", "23/tcp", "8000-8010", "8005/udp"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        assert_eq!(
            listen_ranges(&rules),
            [("tcp", 22, 23), ("tcp", 8000, 8010), ("udp", 8000, 8010)]
        );
    }

    #[test]
    fn a_port_in_nft_syntax_is_its_json_elements() {
        let mut p = port();
        p.ipv4 = Ipv4Source::Ranges(vec![(
            "192.168.105.2".parse().unwrap(),
            "192.168.105.254".parse().unwrap(),
        )]);
        let text: String = elements(&p).iter().map(element_text).collect();
        assert!(
            text.contains("add element bridge linnet guarded { \"lnt0123456789ab\" }\n"),
            "{text}"
        );
        assert!(text.contains(
            "add element bridge linnet macs { \"lnt0123456789ab\" . 52:54:00:12:34:56 }"
        ));
        assert!(text.contains("add element bridge linnet ipv4ranges { \"lnt0123456789ab\" . 192.168.105.2-192.168.105.254 }"));
        assert!(
            text.contains(
                "add element bridge linnet chaddr { \"lnt0123456789ab\" . 0x525400123456 }"
            )
        );
        assert!(text.contains(
            "add element bridge linnet ipv6 { \"lnt0123456789ab\" . fd00::5054:ff:fe12:3456 }"
        ));
    }

    #[test]
    fn drop_counts_are_read_from_the_set_listing() {
        let out = r#"{"nftables": [{"metainfo": {}}, {"set": {"family": "bridge", "name": "drops", "table": "linnet", "type": "ifname",
            "elem": [{"elem": {"val": "lnta", "counter": {"packets": 7, "bytes": 420}}}, {"elem": {"val": "lntb", "counter": {"packets": 0, "bytes": 0}}}]}}]}"#;
        assert_eq!(
            parse_drops(out),
            BTreeMap::from([("lnta".to_string(), 7), ("lntb".to_string(), 0)])
        );
        assert!(parse_drops("garbage").is_empty());
    }
}
