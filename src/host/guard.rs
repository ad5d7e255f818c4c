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
//!
//! Everything the guard sends nftables is in nft's own syntax: its fixed
//! rules, and each change as elements built from typed values (`Element`,
//! `Script`), never from text edited afterwards. Not nftables' JSON, as the
//! firewall is: the rules that check a DHCP request's chaddr and a
//! neighbour advertisement's target look raw payloads up in sets declared
//! `typeof meta iifname . @th,288,48`, and nft 1.0.6's JSON can declare no
//! such set (it reads back as `ifname . integer`: "can not use variable
//! sized data types (integer) in concat expressions").

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use serde_json::Value;

use self::limits::{EGRESS_PREFIX, HookChain, INGRESS_PREFIX, Limit, hook_chains, limits};
use super::nft::{Nft, NftError};
use super::ruleset::{Shape, linnet_shape};
use crate::forward::Protocol;
use crate::policy::ListenRule;
use crate::rate::RateLimits;
use crate::types::MacAddr;

mod limits;

const BRIDGE: &str = "bridge";
const NETDEV: &str = "netdev";
const TABLE: &str = "linnet";

/// The guard's sets, in nft's own syntax: fixed text of linnet's (the
/// port's key as `hook` names it), nothing from users in it.
fn sets(hook: Hook) -> String {
    let port = hook.port_key();
    format!(
        r#"
    # TAPs whose frames are checked, and those kept apart.
    set guarded {{ type ifname; }}
    set isolated {{ type ifname; }}
    # TAPs whose VM may be a DHCP server: on networks where linnet's is off.
    set dhcp_servers {{ type ifname; }}
    # What each TAP's VM may send from.
    set macs {{ type ifname . ether_addr; }}
    set ipv4 {{ type ifname . ipv4_addr; }}
    # Ranges, for VMs whose address linnet does not know (no DHCP).
    set ipv4ranges {{ type ifname . ipv4_addr; flags interval; }}
    set ipv6 {{ type ifname . ipv6_addr; }}
    # Its MAC as the 48-bit chaddr of a DHCP message (byte 28 of BOOTP,
    # after the 8-byte UDP header), and its IPv6 addresses as the 128-bit
    # target of a neighbour solicitation or advertisement.
    set chaddr {{ typeof meta {port} . @th,288,48; }}
    set ndtarget {{ typeof meta {port} . @th,64,128; }}
    # TAPs whose VM accepts connections only on some ports (a listen
    # policy), and those ports.
    set listen_policed {{ type ifname; }}
    set listen {{ type ifname . inet_proto . inet_service; flags interval; }}
    # TAPs whose VM has a connect policy: it reaches other VMs only as
    # that policy says, and through nothing else (its broadcasts, padding).
    set connect_policed {{ type ifname; }}
    # Frames dropped, per TAP.
    set drops {{ type ifname; flags dynamic; counter; size 65535; }}
{maps}
"#,
        maps = limits::MAPS
    )
}

/// Frames a guarded TAP's VM sends enter here.
fn prerouting() -> String {
    format!(
        r#"
    chain prerouting {{
        type filter hook prerouting priority filter; policy accept;
        {}
        iifname @guarded jump guard
    }}

"#,
        limits::BRIDGE_SENT_RULE
    )
}

/// What a VM may send: the same chains for a TAP (checked as its frames
/// enter the bridge: the port is `iifname`) and a macvtap (as they leave
/// it for the NIC: `oifname`).
fn sender_chains(hook: Hook) -> String {
    let port = hook.port_key();
    // What `meta length` counts at the bridge's prerouting: the frame
    // after its Ethernet header (28 bytes of ARP; 46 padded to Ethernet's
    // least). Connect policies hold on linnet's own bridges only, so the
    // set these rules test is empty on a macvtap's egress.
    const ARP_PADDED: u32 = 46;
    // The longest neighbour discovery a VM needs: the IPv6 header, a
    // solicitation or advertisement (24 bytes), a link-layer address
    // option (8) and a nonce option (8, RFC 7527).
    const ND_LONGEST: u32 = 40 + 24 + 8 + 8;
    format!(
        r#"
    # Its own MAC; then by protocol, nothing but IPv4, ARP and IPv6 (no
    # VLAN tags that could carry anything inside).
    chain guard {{
        meta {port} . ether saddr != @macs update @drops {{ meta {port} }} drop
        ether type vmap {{ arp : goto from_arp, ip : goto from_ip, ip6 : goto from_ip6 }}
        update @drops {{ meta {port} }} drop
    }}

    # Its own MAC and IPv4 as sender; 0.0.0.0 for address probes (RFC
    # 5227) of its own address only: a probe for another's address, while
    # that one checks it, would make it decline its lease.
    chain from_arp {{
        meta {port} . arp saddr ether != @macs update @drops {{ meta {port} }} drop
        meta {port} @connect_policed meta length > {ARP_PADDED} update @drops {{ meta {port} }} drop
        meta {port} . arp saddr ip @ipv4 accept
        meta {port} . arp saddr ip @ipv4ranges accept
        arp saddr ip 0.0.0.0 meta {port} . arp daddr ip @ipv4 accept
        arp saddr ip 0.0.0.0 meta {port} . arp daddr ip @ipv4ranges accept
        update @drops {{ meta {port} }} drop
    }}

    # Never a DHCP server (whatever the source port: clients look at the
    # destination), unless its network leaves DHCP to the VMs (linnet's is
    # off there); DHCP requests only for its own MAC; its own address, or
    # 0.0.0.0 as a DHCP client.
    chain from_ip {{
        udp sport 67 {port} != @dhcp_servers update @drops {{ meta {port} }} drop
        udp dport 68 {port} != @dhcp_servers update @drops {{ meta {port} }} drop
        udp dport 67 jump dhcp_request
        meta {port} . ip saddr @ipv4 accept
        meta {port} . ip saddr @ipv4ranges accept
        ip saddr 0.0.0.0 udp sport 68 udp dport 67 accept
        update @drops {{ meta {port} }} drop
    }}

    # A DHCP request only for its own MAC, so it can neither drain the pool
    # nor take another's lease: a request whose chaddr is not there to read
    # (cut short, or a first fragment whose rest would carry it) is dropped.
    chain dhcp_request {{
        ip frag-off & 0x2000 != 0 update @drops {{ meta {port} }} drop
        meta {port} . @th,288,48 @chaddr return
        update @drops {{ meta {port} }} drop
    }}

    # First fragments whole (below); no fragments from link-local addresses
    # or to link-local multicast (RFC 7113); no router advertisements or
    # redirects, no DHCPv6 server; neighbour advertisements only for its own
    # addresses; its own addresses, or :: for duplicate address detection of
    # them and the multicast listener reports that go with it.
    chain from_ip6 {{
        frag frag-off 0 jump first_fragment6
        exthdr frag exists ip6 saddr fe80::/10 update @drops {{ meta {port} }} drop
        exthdr frag exists ip6 daddr ff02::/16 update @drops {{ meta {port} }} drop
        icmpv6 type {{ nd-router-advert, nd-redirect }} update @drops {{ meta {port} }} drop
        udp sport 547 update @drops {{ meta {port} }} drop
        udp dport 546 update @drops {{ meta {port} }} drop
        icmpv6 type nd-neighbor-advert meta {port} . @th,64,128 != @ndtarget update @drops {{ meta {port} }} drop
        meta {port} @connect_policed icmpv6 type {{ nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert }} meta length > {ND_LONGEST} update @drops {{ meta {port} }} drop
        meta {port} . ip6 saddr @ipv6 accept
        ip6 saddr :: icmpv6 type {{ mld-listener-report, mld2-listener-report }} accept
        ip6 saddr :: icmpv6 type nd-neighbor-solicit meta {port} . @th,64,128 @ndtarget accept
        update @drops {{ meta {port} }} drop
    }}

    # A first fragment carries the whole header chain and its transport
    # header (RFC 7112), or the rules above would judge it by what is not
    # there: 20 bytes of TCP, 8 of UDP or ICMPv6, and never a neighbour
    # discovery message (RFC 6980). ESP, GRE and SCTP (tunnels and VPNs
    # from a VM) are not looked into by any rule here, so theirs pass;
    # anything else, a chain cut short included, is dropped.
    chain first_fragment6 {{
        meta l4proto tcp @th,152,8 & 0 == 0 return
        meta l4proto udp @th,56,8 & 0 == 0 return
        icmpv6 type {{ nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect }} update @drops {{ meta {port} }} drop
        meta l4proto ipv6-icmp @th,56,8 & 0 == 0 return
        meta l4proto {{ esp, gre, sctp }} return
        update @drops {{ meta {port} }} drop
    }}

"#
    )
}

/// What reaches a VM through its bridge.
const BRIDGE_CHAINS: &str = r#"
    # Frames between two ports of an isolated network (their VMs); frames
    # to and from the host pass.
    chain forward {
        type filter hook forward priority filter; policy accept;
        iifname @isolated oifname @isolated drop
        iifname @connect_policed jump from_policed
        oifname @guarded jump to_port
    }

    # What a VM with a connect policy sends to other VMs: unicast IP, which
    # its policy judges in inet linnet, and of broadcast and multicast (by
    # MAC, or by address inside a frame to one VM's MAC) only ARP and
    # neighbour discovery, which their network needs. (What it sends the
    # host never passes here.)
    chain from_policed {
        ether type arp return
        icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } return
        ether daddr & 01:00:00:00:00:00 != 00:00:00:00:00:00 drop
        ip daddr { 255.255.255.255, 224.0.0.0/4 } drop
        ip6 daddr ff00::/8 drop
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
    let (sets, sender) = (sets(Hook::Bridge), sender_chains(Hook::Bridge));
    let (prerouting, postrouting) = (prerouting(), limits::bridge_received_chain());
    format!("table {BRIDGE} {TABLE} {{\n{sets}{prerouting}{sender}{BRIDGE_CHAINS}{postrouting}}}\n")
}

/// The netdev table of macvtaps (`mode: bridged`): the same sets and
/// checks, hooked per macvtap at its egress (its VM's frames leave
/// through it for the NIC and never pass a bridge), where the port is the
/// output interface.
fn egress_ruleset() -> String {
    let (sets, sender) = (sets(Hook::Egress), sender_chains(Hook::Egress));
    format!("table {NETDEV} {TABLE} {{\n{sets}{sender}}}\n")
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

impl Hook {
    fn family(self) -> &'static str {
        match self {
            Hook::Bridge => BRIDGE,
            Hook::Egress => NETDEV,
        }
    }

    /// How the rules name the port: frames enter a bridge from a TAP and
    /// leave a macvtap for the NIC.
    fn port_key(self) -> &'static str {
        match self {
            Hook::Bridge => "iifname",
            Hook::Egress => "oifname",
        }
    }
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
    /// With a connect policy: none of its broadcast or multicast but ARP
    /// and neighbour discovery reaches another VM, and those carry nothing
    /// past what they need.
    pub connect_policed: bool,
    /// Its rate limits (`limits`).
    pub rate_limit: RateLimits,
}

impl PortGuard {
    /// A macvtap with anti-spoofing or a rate limit has base chains of
    /// its own, hooked on its device.
    pub fn hooked(&self) -> bool {
        !hook_chains(self).is_empty()
    }
}

/// The table made anew with `ports` guarded, in one transaction: there is
/// no moment with the rules in place but a port's elements missing (its
/// frames would pass unchecked).
pub fn create_with(nft: &mut Nft, ports: &[PortGuard]) -> Result<(), NftError> {
    check_names(ports)?;
    let mut script = Script::default();
    script.remake_table(Hook::Bridge, Some(&ruleset()));
    let egress = ports.iter().any(|p| p.hook == Hook::Egress);
    // With no macvtap to guard, a table left from before goes.
    script.remake_table(Hook::Egress, egress.then(egress_ruleset).as_deref());
    for port in ports {
        script.add_port(port);
    }
    nft.run(&script.0)?;
    if egress
        && EGRESS_SHAPE.get().is_none()
        && let Ok(Some(mut shape)) = linnet_shape(nft, NETDEV)
    {
        shape.retain(|chain, _| {
            !chain.starts_with(EGRESS_PREFIX) && !chain.starts_with(INGRESS_PREFIX)
        });
        let _ = EGRESS_SHAPE.set(shape);
    }
    if SHAPE.get().is_none()
        && let Ok(Some(shape)) = linnet_shape(nft, BRIDGE)
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
/// guarded or limited macvtap adds its hook chains.
static EGRESS_SHAPE: OnceLock<Shape> = OnceLock::new();

/// The macvtaps' table's shape with `ports` guarded (known once the
/// table was made).
pub fn expected_egress_shape(ports: &[PortGuard]) -> Option<Shape> {
    let mut shape = EGRESS_SHAPE.get()?.clone();
    for chain in ports.iter().flat_map(hook_chains) {
        shape.insert(chain.name, chain.rules.len());
    }
    Some(shape)
}

/// Makes the macvtaps' table (empty of ports), recording its shape.
fn create_egress(nft: &mut Nft) -> Result<(), NftError> {
    nft.run(&egress_ruleset())?;
    if EGRESS_SHAPE.get().is_none()
        && let Ok(Some(shape)) = linnet_shape(nft, NETDEV)
    {
        let _ = EGRESS_SHAPE.set(shape);
    }
    Ok(())
}

/// Removes the tables, if there are any.
pub fn remove(nft: &mut Nft) -> Result<(), NftError> {
    let mut script = Script::default();
    script.remake_table(Hook::Bridge, None);
    script.remake_table(Hook::Egress, None);
    nft.run(&script.0).map(|_| ())
}

/// Guards one TAP (the table must exist).
pub fn add_port(nft: &mut Nft, port: &PortGuard) -> Result<(), NftError> {
    add_ports(nft, std::slice::from_ref(port))
}

/// Guards several ports in one transaction (all or none); macvtaps'
/// elements go in before their hooks.
pub fn add_ports(nft: &mut Nft, ports: &[PortGuard]) -> Result<(), NftError> {
    check_names(ports)?;
    if ports.iter().any(|p| p.hook == Hook::Egress) && !egress_table_exists(nft) {
        create_egress(nft)?;
    }
    let mut script = Script::default();
    for port in ports {
        script.add_port(port);
    }
    nft.run(&script.0).map(|_| ())
}

fn egress_table_exists(nft: &mut Nft) -> bool {
    nft.run(&format!("list table {NETDEV} {TABLE}")).is_ok()
}

/// Deletes the hooks of macvtaps about to go (a hook on a device that is
/// gone is the kernel's to drop, and older kernels drop its chain).
pub fn unhook(nft: &mut Nft, ports: &[PortGuard]) -> Result<(), NftError> {
    check_names(ports)?;
    let mut script = Script::default();
    for chain in ports.iter().flat_map(hook_chains) {
        script.unhook(&chain);
    }
    if script.0.is_empty() {
        return Ok(());
    }
    nft.run(&script.0).map(|_| ())
}

/// Changes a guarded port from `old` to `new` in one transaction: no
/// moment with neither in place.
pub fn update_port(nft: &mut Nft, old: &PortGuard, new: &PortGuard) -> Result<(), NftError> {
    check_names([old, new])?;
    let (before, after) = (elements(old), elements(new));
    let mut script = Script::default();
    for elem in before.iter().filter(|e| !after.contains(e)) {
        script.delete(elem);
    }
    for elem in after.iter().filter(|e| !before.contains(e)) {
        script.add(elem);
    }
    let (limits_before, limits_after) = (limits(old), limits(new));
    for limit in limits_before.iter().filter(|l| !limits_after.contains(l)) {
        script.delete_limit(limit);
    }
    for limit in limits_after.iter().filter(|l| !limits_before.contains(l)) {
        script.add_limit(limit);
    }
    let (hooks_before, hooks_after) = (hook_chains(old), hook_chains(new));
    for chain in hooks_before.iter().filter(|c| !hooks_after.contains(c)) {
        script.unhook(chain);
    }
    for chain in hooks_after.iter().filter(|c| !hooks_before.contains(c)) {
        script.hook(chain);
    }
    if script.0.is_empty() {
        return Ok(());
    }
    nft.run(&script.0).map(|_| ())
}

/// Removes the TAPs' elements and drop counts, each batch of ports in one
/// transaction. Each element is deleted whether or not it was there.
pub fn remove_ports(nft: &mut Nft, ports: &[PortGuard]) -> Result<(), NftError> {
    check_names(ports)?;
    // In batches: nftables takes far more memory to read one batch for a
    // thousand ports than ten for a hundred (measured: 160 MiB of heap).
    for batch in ports.chunks(REMOVE_BATCH) {
        let mut script = Script::default();
        for port in batch {
            let every = PortGuard {
                anti_spoofing: true,
                isolated: true,
                dhcp_server: true,
                connect_policed: true,
                ..port.clone()
            };
            let mut all = elements(&every);
            for counts in [Set::Drops, Set::LimitedSent, Set::LimitedReceived] {
                all.push(Element::of(port, counts, Key::Port));
            }
            for elem in &all {
                script.delete(elem);
            }
            for limit in limits(port) {
                script.add_limit(&limit);
                script.delete_limit(&limit);
            }
        }
        nft.run(&script.0)?;
    }
    Ok(())
}

/// Ports whose elements one transaction removes.
const REMOVE_BATCH: usize = 100;

/// Frames dropped so far, by TAP or macvtap.
pub fn drops(nft: &mut Nft) -> Result<BTreeMap<String, u64>, NftError> {
    counted(nft, Set::Drops)
}

/// Frames past their rate dropped so far, by TAP or macvtap: what they
/// sent, and what was on its way to them.
pub fn rate_drops(nft: &mut Nft) -> Result<RateDrops, NftError> {
    Ok(RateDrops {
        sent: counted(nft, Set::LimitedSent)?,
        received: counted(nft, Set::LimitedReceived)?,
    })
}

/// Frames a port's rate limits dropped, by port and way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateDrops {
    pub sent: BTreeMap<String, u64>,
    pub received: BTreeMap<String, u64>,
}

/// The counts of one of the counting sets, from both tables.
fn counted(nft: &mut Nft, set: Set) -> Result<BTreeMap<String, u64>, NftError> {
    let name = set.name();
    let out = nft.run(&format!("list set {BRIDGE} {TABLE} {name}"))?;
    let mut counts = parse_drops(&out);
    // Only while a macvtap is guarded.
    if let Ok(out) = nft.run(&format!("list set {NETDEV} {TABLE} {name}")) {
        counts.extend(parse_drops(&out));
    }
    Ok(counts)
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

/// A port's name goes into nft's syntax between quotes: only the names
/// linnet gives (letters, digits, '-', '_') may.
fn check_names<'a>(ports: impl IntoIterator<Item = &'a PortGuard>) -> Result<(), NftError> {
    match ports.into_iter().map(|p| &p.tap).find(|name| {
        name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }) {
        Some(name) => Err(NftError::Refused(format!(
            "{name:?} is not a name linnet gives a port: the guard takes only letters, digits, '-' and '_'"
        ))),
        None => Ok(()),
    }
}

/// One transaction in nft's syntax, made only of linnet's fixed text and
/// typed values (port names checked by `check_names`, addresses, MACs,
/// numbers).
#[derive(Default)]
struct Script(String);

impl Script {
    fn line(&mut self, line: fmt::Arguments) {
        use fmt::Write;
        writeln!(self.0, "{line}").expect("a String takes any text");
    }

    /// The table deleted, whether or not it was there, and made as
    /// `text` says.
    fn remake_table(&mut self, hook: Hook, text: Option<&str>) {
        let family = hook.family();
        self.line(format_args!("add table {family} {TABLE}"));
        self.line(format_args!("delete table {family} {TABLE}"));
        if let Some(text) = text {
            self.0.push_str(text);
        }
    }

    /// An element of a set or map, in nft's syntax.
    fn add(&mut self, elem: &dyn fmt::Display) {
        self.line(format_args!("add element {elem}"));
    }

    /// Added first, so the delete is valid whether or not it was there.
    fn delete(&mut self, elem: &Element) {
        self.line(format_args!("add element {elem}"));
        self.line(format_args!("delete element {elem}"));
    }

    /// Its elements and limits, then a macvtap's hooks: no moment with a
    /// macvtap's frames sent through the checks before its elements are
    /// there.
    fn add_port(&mut self, port: &PortGuard) {
        for elem in elements(port) {
            self.add(&elem);
        }
        for limit in limits(port) {
            self.add_limit(&limit);
        }
        for chain in hook_chains(port) {
            self.hook(&chain);
        }
    }

    /// The limit's object, then its element (which names the object).
    fn add_limit(&mut self, limit: &Limit) {
        self.line(format_args!("{}", limit.add_object()));
        self.add(limit);
    }

    /// Its element, then its object (no longer named by any).
    fn delete_limit(&mut self, limit: &Limit) {
        self.line(format_args!("delete element {limit}"));
        self.line(format_args!("{}", limit.delete_object()));
    }

    /// A macvtap's base chain (its device checked by `check_names`: a
    /// port's name is its device's).
    fn hook(&mut self, chain: &HookChain) {
        let HookChain {
            name, hook, device, ..
        } = chain;
        self.line(format_args!(
            "add chain {NETDEV} {TABLE} {name} {{ type filter hook {hook} device \"{device}\" priority filter; policy accept; }}"
        ));
        for rule in &chain.rules {
            self.line(format_args!("add rule {NETDEV} {TABLE} {name} {rule}"));
        }
    }

    fn unhook(&mut self, chain: &HookChain) {
        self.line(format_args!("delete chain {NETDEV} {TABLE} {}", chain.name));
    }
}

/// The guard's sets (declared by `sets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Set {
    Guarded,
    Isolated,
    DhcpServers,
    Macs,
    Ipv4,
    Ipv4Ranges,
    Ipv6,
    Chaddr,
    Ndtarget,
    ListenPoliced,
    Listen,
    ConnectPoliced,
    Drops,
    LimitedSent,
    LimitedReceived,
}

impl Set {
    #[cfg(test)]
    const ALL: [Set; 15] = [
        Set::Guarded,
        Set::Isolated,
        Set::DhcpServers,
        Set::Macs,
        Set::Ipv4,
        Set::Ipv4Ranges,
        Set::Ipv6,
        Set::Chaddr,
        Set::Ndtarget,
        Set::ListenPoliced,
        Set::Listen,
        Set::ConnectPoliced,
        Set::Drops,
        Set::LimitedSent,
        Set::LimitedReceived,
    ];

    fn name(self) -> &'static str {
        match self {
            Set::Guarded => "guarded",
            Set::Isolated => "isolated",
            Set::DhcpServers => "dhcp_servers",
            Set::Macs => "macs",
            Set::Ipv4 => "ipv4",
            Set::Ipv4Ranges => "ipv4ranges",
            Set::Ipv6 => "ipv6",
            Set::Chaddr => "chaddr",
            Set::Ndtarget => "ndtarget",
            Set::ListenPoliced => "listen_policed",
            Set::Listen => "listen",
            Set::ConnectPoliced => "connect_policed",
            Set::Drops => "drops",
            Set::LimitedSent => "limited_sent",
            Set::LimitedReceived => "limited_received",
        }
    }
}

/// What follows the port's name in an element's key.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Key {
    /// The port alone.
    Port,
    Mac(MacAddr),
    Ipv4(Ipv4Addr),
    /// Inclusive.
    Ipv4Range(Ipv4Addr, Ipv4Addr),
    Ipv6(Ipv6Addr),
    /// A raw payload's value (`chaddr`, `ndtarget`).
    Bits(u128),
    /// A protocol and an inclusive range of its ports.
    Ports(Protocol, u16, u16),
}

/// One element of one of the guard's sets, keyed by its port.
#[derive(Debug, Clone, PartialEq)]
struct Element<'a> {
    hook: Hook,
    set: Set,
    port: &'a str,
    key: Key,
}

impl<'a> Element<'a> {
    fn of(port: &'a PortGuard, set: Set, key: Key) -> Element<'a> {
        Element {
            hook: port.hook,
            set,
            port: &port.tap,
            key,
        }
    }
}

/// As nft's syntax writes it: `bridge linnet macs { "lnt7" . 52:54:… }`.
impl fmt::Display for Element<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (family, set, port) = (self.hook.family(), self.set.name(), self.port);
        write!(f, "{family} {TABLE} {set} {{ \"{port}\"")?;
        match self.key {
            Key::Port => Ok(()),
            Key::Mac(mac) => write!(f, " . {mac}"),
            Key::Ipv4(ip) => write!(f, " . {ip}"),
            Key::Ipv4Range(a, b) => write!(f, " . {a}-{b}"),
            Key::Ipv6(ip) => write!(f, " . {ip}"),
            Key::Bits(n) => write!(f, " . {n:#x}"),
            Key::Ports(protocol, first, last) => {
                write!(f, " . {} . {first}-{last}", protocol.as_str())
            }
        }?;
        f.write_str(" }")
    }
}

fn mac_number(mac: &MacAddr) -> u128 {
    mac.0.iter().fold(0, |n, b| (n << 8) | u128::from(*b))
}

/// A listen policy's ports per protocol, overlapping and adjacent ranges
/// merged: an interval set refuses elements that overlap.
fn listen_ranges(rules: &[ListenRule]) -> Vec<(Protocol, u16, u16)> {
    let mut ranges: Vec<(Protocol, u16, u16)> = rules
        .iter()
        .flat_map(|rule| {
            let protocols = match rule.protocol {
                Some(p) => vec![p],
                None => vec![Protocol::Tcp, Protocol::Udp],
            };
            protocols
                .into_iter()
                .map(move |p| (p, rule.ports.first, rule.ports.last))
        })
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(Protocol, u16, u16)> = Vec::new();
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
fn elements(port: &PortGuard) -> Vec<Element<'_>> {
    let element = |set, key| Element::of(port, set, key);
    let mut out = Vec::new();
    if port.anti_spoofing {
        out.push(element(Set::Guarded, Key::Port));
        out.push(element(Set::Macs, Key::Mac(port.mac)));
        match &port.ipv4 {
            Ipv4Source::Address(ip) => out.push(element(Set::Ipv4, Key::Ipv4(*ip))),
            Ipv4Source::Ranges(ranges) => {
                for &(a, b) in ranges {
                    out.push(element(Set::Ipv4Ranges, Key::Ipv4Range(a, b)));
                }
            }
        }
        out.push(element(Set::Chaddr, Key::Bits(mac_number(&port.mac))));
        for ip in &port.ipv6 {
            out.push(element(Set::Ipv6, Key::Ipv6(*ip)));
            out.push(element(Set::Ndtarget, Key::Bits(u128::from(*ip))));
        }
        if let Some(rules) = &port.listen {
            out.push(element(Set::ListenPoliced, Key::Port));
            for (protocol, first, last) in listen_ranges(rules) {
                out.push(element(Set::Listen, Key::Ports(protocol, first, last)));
            }
        }
        if port.connect_policed {
            out.push(element(Set::ConnectPoliced, Key::Port));
        }
        if port.dhcp_server {
            out.push(element(Set::DhcpServers, Key::Port));
        }
    }
    if port.isolated {
        out.push(element(Set::Isolated, Key::Port));
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::host::guard) fn port() -> PortGuard {
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
            connect_policed: false,
            rate_limit: RateLimits::default(),
        }
    }

    /// The port's elements in nft's syntax, by set.
    fn by_set(port: &PortGuard) -> BTreeMap<&'static str, Vec<String>> {
        let mut out: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        for e in elements(port) {
            out.entry(e.set.name()).or_default().push(e.to_string());
        }
        out
    }

    #[test]
    fn a_port_is_its_elements_keyed_by_its_tap() {
        let sets = by_set(&port());
        let set =
            |name: &str, key: &str| format!("bridge linnet {name} {{ \"lnt0123456789ab\"{key} }}");
        assert_eq!(sets["guarded"], [set("guarded", "")]);
        assert_eq!(sets["macs"], [set("macs", " . 52:54:00:12:34:56")]);
        assert_eq!(sets["ipv4"], [set("ipv4", " . 192.168.105.2")]);
        assert_eq!(sets["chaddr"], [set("chaddr", " . 0x525400123456")]);
        assert_eq!(
            sets["ndtarget"],
            [
                set("ndtarget", " . 0xfe80000000000000505400fffe123456"),
                set("ndtarget", " . 0xfd00000000000000505400fffe123456"),
            ]
        );
        assert_eq!(
            sets["ipv6"],
            [
                set("ipv6", " . fe80::5054:ff:fe12:3456"),
                set("ipv6", " . fd00::5054:ff:fe12:3456"),
            ]
        );
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
        let sets = by_set(&p);
        assert!(!sets.contains_key("ipv4"));
        assert_eq!(
            sets["ipv4ranges"],
            ["bridge linnet ipv4ranges { \"lnt0123456789ab\" . 192.168.105.2-192.168.105.254 }"]
        );
    }

    #[test]
    fn without_linnets_dhcp_a_vm_may_serve_dhcp() {
        assert!(!by_set(&port()).contains_key("dhcp_servers"));
        let mut p = port();
        p.dhcp_server = true;
        assert_eq!(
            by_set(&p)["dhcp_servers"],
            ["bridge linnet dhcp_servers { \"lnt0123456789ab\" }"]
        );
    }

    #[test]
    fn without_anti_spoofing_only_isolation_remains() {
        let mut p = port();
        p.anti_spoofing = false;
        p.isolated = true;
        p.dhcp_server = true;
        p.listen = Some(vec!["22/tcp".parse().unwrap()]);
        assert_eq!(by_set(&p).keys().collect::<Vec<_>>(), [&"isolated"]);
    }

    #[test]
    fn a_listen_policy_is_its_ports_per_protocol() {
        let mut p = port();
        p.listen = Some(vec!["22/tcp".parse().unwrap(), "53".parse().unwrap()]);
        let sets = by_set(&p);
        assert_eq!(
            sets["listen_policed"],
            ["bridge linnet listen_policed { \"lnt0123456789ab\" }"]
        );
        assert_eq!(
            sets["listen"],
            [
                "bridge linnet listen { \"lnt0123456789ab\" . tcp . 22-22 }",
                "bridge linnet listen { \"lnt0123456789ab\" . tcp . 53-53 }",
                "bridge linnet listen { \"lnt0123456789ab\" . udp . 53-53 }",
            ]
        );
        assert!(!by_set(&p).contains_key("connect_policed"));
        p.connect_policed = true;
        assert_eq!(
            by_set(&p)["connect_policed"],
            ["bridge linnet connect_policed { \"lnt0123456789ab\" }"]
        );
        // What it sends other VMs is sorted before anything else of theirs.
        let forward = ruleset();
        let forward = &forward[forward.find("chain forward").unwrap()..];
        assert!(
            forward.find("iifname @connect_policed jump from_policed")
                < forward.find("oifname @guarded jump to_port")
        );
    }

    #[test]
    fn the_ruleset_counts_every_drop_and_declares_and_uses_every_set() {
        for (hook, ruleset) in [(Hook::Bridge, ruleset()), (Hook::Egress, egress_ruleset())] {
            let port = hook.port_key();
            let sender = sender_chains(hook);
            for line in sender.lines().map(str::trim) {
                if line.ends_with(" drop") {
                    assert!(
                        line.ends_with(&format!("update @drops {{ meta {port} }} drop")),
                        "{line}"
                    );
                }
            }
            for set in Set::ALL.map(Set::name) {
                assert!(ruleset.contains(&format!("set {set} {{")), "{set}");
            }
            for set in [Set::Macs, Set::Ipv4, Set::Chaddr, Set::Ndtarget, Set::Drops] {
                assert!(sender.contains(&format!("@{}", set.name())), "{set:?}");
            }
        }
        let ruleset = ruleset();
        for set in Set::ALL.map(Set::name) {
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
        assert_eq!(
            sender_chains(Hook::Egress),
            sender_chains(Hook::Bridge).replace("iifname", "oifname"),
            "the same checks, of the port frames leave by"
        );
        let mut p = port();
        p.tap = "lnv7".into();
        p.hook = Hook::Egress;
        let mut script = Script::default();
        script.add_port(&p);
        let lines: Vec<&str> = script.0.lines().collect();
        assert!(lines.contains(&"add element netdev linnet macs { \"lnv7\" . 52:54:00:12:34:56 }"));
        let hook = lines
            .iter()
            .position(|l| l.starts_with("add chain"))
            .unwrap();
        assert_eq!(
            &lines[hook..],
            [
                "add chain netdev linnet port_lnv7 { type filter hook egress device \"lnv7\" priority filter; policy accept; }",
                "add rule netdev linnet port_lnv7 limit name oifname map @sent update @limited_sent { oifname } drop",
                "add rule netdev linnet port_lnv7 jump guard",
            ],
            "hooked last, once its elements are there"
        );
        let mut script = Script::default();
        script.add_port(&port());
        assert!(!script.0.contains("chain"), "a TAP has no hook of its own");
    }

    #[test]
    fn removing_a_port_deletes_every_element_it_may_have() {
        let mut p = port();
        p.listen = Some(vec!["80/tcp".parse().unwrap()]);
        let mut script = Script::default();
        script.delete(&elements(&p)[0]);
        assert_eq!(
            script.0,
            "add element bridge linnet guarded { \"lnt0123456789ab\" }\ndelete element bridge linnet guarded { \"lnt0123456789ab\" }\n"
        );
    }

    #[test]
    fn only_names_linnet_gives_go_into_a_script() {
        let mut p = port();
        assert!(check_names([&p]).is_ok());
        for name in ["", "a\"b", "a b", "x}; flush ruleset"] {
            p.tap = name.into();
            assert!(check_names([&p]).is_err(), "{name:?}");
        }
    }

    #[test]
    fn overlapping_listen_ports_become_one_range_per_protocol() {
        let rules: Vec<ListenRule> = ["1-65535", "80/tcp", "8000", "8000-8010/tcp", "9000/udp"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        assert_eq!(
            listen_ranges(&rules),
            [(Protocol::Tcp, 1, 65535), (Protocol::Udp, 1, 65535)]
        );
        let rules: Vec<ListenRule> = ["22/tcp", "23/tcp", "8000-8010", "8005/udp"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        assert_eq!(
            listen_ranges(&rules),
            [
                (Protocol::Tcp, 22, 23),
                (Protocol::Tcp, 8000, 8010),
                (Protocol::Udp, 8000, 8010)
            ]
        );
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
