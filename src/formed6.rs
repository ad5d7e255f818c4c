//! The IPv6 addresses a VM forms itself, other than the EUI-64 ones linnet
//! reports at attach: stable-privacy addresses (RFC 7217: NetworkManager's
//! default, systemd-networkd's with `IPv6LinkLocalAddressGenerationMode=
//! stable-privacy`), temporary ones (RFC 4941) and addresses set by hand.
//! A guest checks each for duplicates before it uses it (RFC 4862 5.4): a
//! neighbour solicitation from `::` whose target is the new address. That
//! probe is how linnet learns the address, and this is what it decides
//! about one, as plain data: the frame read (`probe`) and the address
//! judged (`judge`). The daemon (`daemon::formed6`) sees the probes and
//! lets the VM send from what is learned.
//!
//! What a probe cannot teach: an address off the network's prefix, a
//! gateway's, one another VM of the network has, an EUI-64 address of
//! another MAC (linnet reserves it for the VM with that MAC, and names it
//! in DNS), and anything past a few of each kind per VM (the oldest of
//! that kind is forgotten for the new one: temporary addresses come anew
//! every day).
//!
//! Reading the probe is not parsing: the kernel's filter (`host::packet`)
//! passes only ICMPv6 neighbour solicitations from `::` with hop limit 255,
//! and this reads fixed fields at fixed offsets, checking each again.

use std::net::Ipv6Addr;

use ipnet::Ipv6Net;

use crate::addr6;
use crate::types::MacAddr;

/// Link-local addresses a VM may form besides its EUI-64 one.
pub const MAX_LINK_LOCAL: usize = 2;
/// Addresses in the network's prefix a VM may form besides its EUI-64
/// one: a stable one and a few temporary ones (RFC 4941's default keeps
/// a new one a day, each deprecated after a day and gone after a week).
pub const MAX_IN_PREFIX: usize = 6;

/// A duplicate address detection probe a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The Ethernet source.
    pub mac: MacAddr,
    /// The address being checked.
    pub target: Ipv6Addr,
}

const ETHERNET: usize = 14;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ICMPV6: u8 = 58;
const NEIGHBOUR_SOLICITATION: u8 = 135;
/// Ethernet, the IPv6 header, and a solicitation up to its target.
const PROBE_LEN: usize = ETHERNET + 40 + 24;

/// The probe `frame` carries: an untagged IPv6 neighbour solicitation
/// from `::`, hop limit 255, code 0, to the solicited-node group of its
/// target, from a unicast MAC. Anything else is None.
pub fn probe(frame: &[u8]) -> Option<Probe> {
    let frame = frame.get(..PROBE_LEN)?;
    let ip = &frame[ETHERNET..];
    let icmp = &ip[40..];
    let octets = |at: &[u8]| -> [u8; 16] { at[..16].try_into().expect("16 bytes") };
    let source = Ipv6Addr::from(octets(&ip[8..]));
    let destination = Ipv6Addr::from(octets(&ip[24..]));
    let target = Ipv6Addr::from(octets(&icmp[8..]));
    let mac: [u8; 6] = frame[6..12].try_into().expect("6 bytes");
    let is_probe = u16::from_be_bytes([frame[12], frame[13]]) == ETHERTYPE_IPV6
        && ip[0] >> 4 == 6
        && ip[6] == ICMPV6
        && ip[7] == 255
        && source.is_unspecified()
        && destination == solicited_node(target)
        && icmp[0] == NEIGHBOUR_SOLICITATION
        && icmp[1] == 0
        && mac[0] & 1 == 0;
    is_probe.then_some(Probe {
        mac: MacAddr(mac),
        target,
    })
}

/// ff02::1:ffXX:XXXX, the group a solicitation for `target` goes to.
fn solicited_node(target: Ipv6Addr) -> Ipv6Addr {
    let t = target.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15],
    ])
}

/// The network a VM forms addresses on, and the VM.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The network's /64.
    pub prefix: Ipv6Net,
    /// The VM's MAC: its EUI-64 addresses are allowed already.
    pub mac: MacAddr,
    /// What it formed before, oldest first.
    pub formed: &'a [Ipv6Addr],
}

/// What becomes of a probed address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The VM may send from it already.
    Known,
    /// Let the VM send from it; forget `forget` (its oldest of the same
    /// kind) to stay within the limit.
    Learn {
        forget: Option<Ipv6Addr>,
    },
    Refuse(Refusal),
}

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Neither link-local nor in the network's prefix.
    OffPrefix,
    /// Not an address one host may hold: the subnet-router anycast (an
    /// interface id of 0) or a reserved anycast one (RFC 2526).
    Anycast,
    /// The gateway's.
    Gateway,
    /// The EUI-64 address of another MAC.
    AnotherMac,
    /// Another VM of the network has it.
    Taken,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::OffPrefix => "neither link-local nor in the network's prefix",
            Refusal::Anycast => "an anycast address",
            Refusal::Gateway => "the gateway's",
            Refusal::AnotherMac => "the EUI-64 address of another MAC",
            Refusal::Taken => "another VM's",
        })
    }
}

const LINK_LOCAL: Ipv6Net = match Ipv6Net::new(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 64) {
    Ok(net) => net,
    Err(_) => panic!("fe80::/64"),
};

/// Judges `target`, probed by the VM of `scope`; `taken` says whether
/// another VM of the network holds an address.
pub fn judge(target: Ipv6Addr, scope: Scope<'_>, taken: impl Fn(Ipv6Addr) -> bool) -> Verdict {
    let link_local = LINK_LOCAL.contains(&target);
    let net = if link_local { LINK_LOCAL } else { scope.prefix };
    let own_eui64 = if link_local {
        addr6::link_local(scope.mac)
    } else {
        addr6::slaac_address(scope.prefix, scope.mac)
    };
    if target == own_eui64 || scope.formed.contains(&target) {
        return Verdict::Known;
    }
    let iid = u128::from(target) as u64;
    let refusal = if !net.contains(&target) {
        Some(Refusal::OffPrefix)
    } else if iid == 0 || (0xfdff_ffff_ffff_ff80..=0xfdff_ffff_ffff_ffff).contains(&iid) {
        Some(Refusal::Anycast)
    } else if target == addr6::GATEWAY_LINK_LOCAL || target == addr6::gateway(scope.prefix) {
        Some(Refusal::Gateway)
    } else if (iid >> 24) & 0xffff == 0xfffe {
        // ff:fe in the middle: a modified EUI-64 id, of another MAC (its own
        // is known above).
        Some(Refusal::AnotherMac)
    } else if taken(target) {
        Some(Refusal::Taken)
    } else {
        None
    };
    if let Some(refusal) = refusal {
        return Verdict::Refuse(refusal);
    }
    let limit = if link_local {
        MAX_LINK_LOCAL
    } else {
        MAX_IN_PREFIX
    };
    let mut same_kind = scope
        .formed
        .iter()
        .filter(|a| LINK_LOCAL.contains(*a) == link_local);
    let forget = (same_kind.clone().count() >= limit)
        .then(|| same_kind.next().copied())
        .flatten();
    Verdict::Learn { forget }
}

/// Of `formed` (a record's, from a daemon before), what the VM with `mac`
/// may still send from on `prefix`, judged again in order.
pub fn readopt(
    formed: &[Ipv6Addr],
    prefix: Ipv6Net,
    mac: MacAddr,
    taken: impl Fn(Ipv6Addr) -> bool,
) -> Vec<Ipv6Addr> {
    let mut kept = Vec::new();
    for &a in formed {
        let scope = Scope {
            prefix,
            mac,
            formed: &kept,
        };
        if judge(a, scope, &taken) == (Verdict::Learn { forget: None }) {
            kept.push(a);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);

    fn prefix() -> Ipv6Net {
        "fd00:1:2:3::/64".parse().unwrap()
    }

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// A probe as Linux sends it (no options).
    fn frame(mac: [u8; 6], target: Ipv6Addr) -> Vec<u8> {
        let mut f = Vec::new();
        let group = solicited_node(target);
        f.extend_from_slice(&[0x33, 0x33]);
        f.extend_from_slice(&group.octets()[12..]);
        f.extend_from_slice(&mac);
        f.extend_from_slice(&[0x86, 0xdd]);
        f.extend_from_slice(&[0x60, 0, 0, 0, 0, 24, ICMPV6, 255]);
        f.extend_from_slice(&[0; 16]);
        f.extend_from_slice(&group.octets());
        f.extend_from_slice(&[NEIGHBOUR_SOLICITATION, 0, 0x12, 0x34, 0, 0, 0, 0]);
        f.extend_from_slice(&target.octets());
        f
    }

    #[test]
    fn a_probe_names_its_sender_and_target() {
        let t = a("fe80::1c2d:3e4f:5a6b:7c8d");
        assert_eq!(
            probe(&frame(MAC.0, t)),
            Some(Probe {
                mac: MAC,
                target: t
            })
        );
    }

    #[test]
    fn anything_but_a_probe_is_none() {
        let t = a("fd00:1:2:3:1c2d:3e4f:5a6b:7c8d");
        let good = frame(MAC.0, t);
        let broken = |at: usize, value: u8| {
            let mut f = good.clone();
            f[at] = value;
            probe(&f)
        };
        assert!(probe(&good).is_some());
        for cut in 0..good.len() {
            assert_eq!(probe(&good[..cut]), None, "cut short at {cut}");
        }
        assert_eq!(broken(12, 0x08), None, "not IPv6");
        assert_eq!(broken(14, 0x40), None, "version 4");
        assert_eq!(broken(20, 17), None, "not ICMPv6");
        assert_eq!(broken(21, 254), None, "routed: hop limit below 255");
        assert_eq!(broken(22 + 15, 1), None, "from an address: not a probe");
        assert_eq!(broken(38 + 15, 0), None, "not to the target's group");
        assert_eq!(broken(54, 136), None, "an advertisement");
        assert_eq!(broken(55, 1), None, "code 1");
        assert_eq!(broken(6, 0x53), None, "from a group MAC");
    }

    fn scope(formed: &[Ipv6Addr]) -> Scope<'_> {
        Scope {
            prefix: prefix(),
            mac: MAC,
            formed,
        }
    }

    #[test]
    fn stable_privacy_addresses_are_learned_and_the_eui64_ones_known() {
        let nobody = |_| false;
        for t in [
            "fe80::1c2d:3e4f:5a6b:7c8d",
            "fd00:1:2:3:1c2d:3e4f:5a6b:7c8d",
        ] {
            assert_eq!(
                judge(a(t), scope(&[]), nobody),
                Verdict::Learn { forget: None }
            );
            assert_eq!(judge(a(t), scope(&[a(t)]), nobody), Verdict::Known);
        }
        assert_eq!(
            judge(addr6::link_local(MAC), scope(&[]), nobody),
            Verdict::Known
        );
        assert_eq!(
            judge(addr6::slaac_address(prefix(), MAC), scope(&[]), nobody),
            Verdict::Known
        );
    }

    #[test]
    fn what_a_probe_cannot_claim() {
        let nobody = |_| false;
        let refused = |t: &str| match judge(a(t), scope(&[]), nobody) {
            Verdict::Refuse(r) => Some(r),
            _ => None,
        };
        assert_eq!(refused("fd00:9::1234"), Some(Refusal::OffPrefix));
        assert_eq!(refused("fe80:0:0:1::1234"), Some(Refusal::OffPrefix));
        assert_eq!(refused("2001:db8::1234"), Some(Refusal::OffPrefix));
        assert_eq!(refused("fd00:1:2:3::"), Some(Refusal::Anycast));
        assert_eq!(
            refused("fd00:1:2:3:fdff:ffff:ffff:ff80"),
            Some(Refusal::Anycast)
        );
        assert_eq!(refused("fe80::1"), Some(Refusal::Gateway));
        assert_eq!(refused("fd00:1:2:3::1"), Some(Refusal::Gateway));
        let other = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x57]);
        assert_eq!(
            refused(&addr6::slaac_address(prefix(), other).to_string()),
            Some(Refusal::AnotherMac)
        );
        assert_eq!(
            refused(&addr6::link_local(other).to_string()),
            Some(Refusal::AnotherMac)
        );
        let theirs = a("fd00:1:2:3:aaaa:bbbb:cccc:dddd");
        assert_eq!(
            judge(theirs, scope(&[]), |t| t == theirs),
            Verdict::Refuse(Refusal::Taken)
        );
        assert_eq!(
            judge(theirs, scope(&[]), nobody),
            Verdict::Learn { forget: None }
        );
    }

    #[test]
    fn past_the_limit_the_oldest_of_the_same_kind_is_forgotten() {
        let nobody = |_| false;
        let global = |n: u16| Ipv6Addr::new(0xfd00, 1, 2, 3, 0x1000, 0, 0, n);
        let local = |n: u16| Ipv6Addr::new(0xfe80, 0, 0, 0, 0x1000, 0, 0, n);
        let mut formed = vec![local(1)];
        formed.extend((1..=MAX_IN_PREFIX as u16).map(global));
        assert_eq!(
            judge(global(99), scope(&formed), nobody),
            Verdict::Learn {
                forget: Some(global(1))
            },
            "the oldest in the prefix, not the link-local one"
        );
        assert_eq!(
            judge(local(2), scope(&formed), nobody),
            Verdict::Learn { forget: None }
        );
        formed.push(local(2));
        assert_eq!(
            judge(local(3), scope(&formed), nobody),
            Verdict::Learn {
                forget: Some(local(1))
            }
        );
    }
}
