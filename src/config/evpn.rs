//! `evpn:` — one of linnet's own networks spanning hosts: the same subnet
//! and gateway on every host, joined by kernel VXLAN, with FRR's BGP EVPN
//! telling each host where the others' VMs are (`crate::frr` writes its
//! configuration). What the file alone can say is checked here; whether
//! the VTEP is an address of this host and what MTU the underlay carries,
//! the network's driver checks as it comes up.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use super::{ConfigError, NetworkConfig, Validator};

/// What VXLAN wraps around a VM's frame on an IPv4 underlay: the outer
/// IPv4 (20) and UDP (8) headers, VXLAN's own (8), and the frame's
/// Ethernet header (14), which the VM's MTU does not count.
pub const VXLAN_OVERHEAD: u32 = 50;
/// VNIs are 24 bits; 0 is left out, as FRR and most switches do.
const VNI_RANGE: std::ops::RangeInclusive<u32> = 1..=(1 << 24) - 1;
/// 4-byte ASNs but AS_TRANS (23456, RFC 6793) and the reserved 0 and
/// 4294967295 (RFC 7300).
const AS_TRANS: u32 = 23456;

/// A network across hosts: its VXLAN network identifier, this host's
/// underlay address, and the BGP session FRR runs with the other hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evpn {
    pub vni: u32,
    /// This host's VTEP: the VXLAN source address and the BGP router id.
    pub vtep: Ipv4Addr,
    pub asn: u32,
    /// The other hosts' VTEPs, its iBGP neighbours.
    pub peers: Vec<Ipv4Addr>,
}

/// FRR's vty socket directory when FRR runs with `-N NAME` or
/// `--vty_socket`; FRR's own default otherwise.
const FRR_VTY_SOCKET: &str = "/var/run/frr";

/// Where the FRR that carries this host's networks across hosts answers
/// (`frr:`), for `linnet doctor`. FRR is the admin's: linnet prints its
/// configuration (`linnet frr-config`) and asks it how it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrrConfig {
    /// The directory of FRR's vty sockets (vtysh --vty_socket).
    pub vty_socket: PathBuf,
}

/// `frr:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FrrSpec {
    vty_socket: Option<PathBuf>,
}

impl FrrConfig {
    pub(super) fn from_spec(spec: FrrSpec, file: &str) -> Result<FrrConfig, ConfigError> {
        let vty_socket = spec.vty_socket.unwrap_or_else(|| FRR_VTY_SOCKET.into());
        if !vty_socket.is_absolute() {
            return Err(ConfigError::Syntax {
                file: file.into(),
                message: format!(
                    "frr.vty_socket: {} is not an absolute path; give the directory of FRR's vty sockets (default {FRR_VTY_SOCKET})",
                    vty_socket.display()
                ),
            });
        }
        Ok(FrrConfig { vty_socket })
    }
}

/// `evpn:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EvpnSpec {
    vni: Option<u32>,
    vtep: Option<String>,
    asn: Option<u32>,
    #[serde(default)]
    peers: Vec<String>,
}

impl Validator<'_> {
    /// `evpn:` of a network whose subnet is `subnet`.
    pub(super) fn evpn(&self, spec: EvpnSpec, subnet: Ipv4Net) -> Result<Evpn, ConfigError> {
        let err = |key: &str, message: String| self.err(&format!("evpn.{key}"), message);
        let vni = spec.vni.ok_or_else(|| {
            err(
                "vni",
                "is required: the VXLAN network identifier every host of the network uses (e.g. vni: 7700)".into(),
            )
        })?;
        if !VNI_RANGE.contains(&vni) {
            return Err(err(
                "vni",
                format!(
                    "{vni} is out of range; allowed {} to {} (24 bits)",
                    VNI_RANGE.start(),
                    VNI_RANGE.end()
                ),
            ));
        }
        let vtep_text = spec.vtep.ok_or_else(|| {
            err(
                "vtep",
                "is required: this host's address on the underlay, which the other hosts reach (e.g. vtep: 192.0.2.11)".into(),
            )
        })?;
        let vtep = self.ipv4("evpn.vtep", &vtep_text)?;
        let unusable = |ip: Ipv4Addr| {
            ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback()
        };
        if unusable(vtep) {
            return Err(err(
                "vtep",
                format!(
                    "{vtep} cannot be a VTEP: give this host's unicast address on the underlay"
                ),
            ));
        }
        if subnet.contains(&vtep) {
            return Err(err(
                "vtep",
                format!(
                    "{vtep} is inside the network's own subnet {subnet}: the underlay must be another network, which carries the VXLAN packets between hosts"
                ),
            ));
        }
        let asn = spec.asn.ok_or_else(|| {
            err(
                "asn",
                "is required: the BGP AS number the hosts share (iBGP; e.g. a private one, asn: 65000)".into(),
            )
        })?;
        if asn == 0 || asn == u32::MAX || asn == AS_TRANS {
            return Err(err(
                "asn",
                format!(
                    "{asn} is reserved; use another (private ones: 64512 to 65534, 4200000000 to 4294967294)"
                ),
            ));
        }
        if spec.peers.is_empty() {
            return Err(err(
                "peers",
                "is required: the other hosts' VTEP addresses (e.g. peers: [192.0.2.12, 192.0.2.13])".into(),
            ));
        }
        let mut peers = Vec::with_capacity(spec.peers.len());
        for text in &spec.peers {
            let peer = self.ipv4("evpn.peers", text)?;
            if peer == vtep {
                return Err(err(
                    "peers",
                    format!("{peer} is this host's own VTEP; list only the other hosts"),
                ));
            }
            if unusable(peer) || subnet.contains(&peer) {
                return Err(err(
                    "peers",
                    format!(
                        "{peer} cannot be another host's VTEP: give its unicast address on the underlay"
                    ),
                ));
            }
            if peers.contains(&peer) {
                return Err(err("peers", format!("{peer} is listed twice")));
            }
            peers.push(peer);
        }
        Ok(Evpn {
            vni,
            vtep,
            asn,
            peers,
        })
    }
}

/// What the host's networks across hosts must agree on: a VNI each of
/// their own, and one BGP speaker (one AS, one VTEP, which is its router
/// id) for all of them.
pub(super) fn check_across(
    networks: &BTreeMap<String, NetworkConfig>,
    file: &str,
) -> Result<(), ConfigError> {
    let evpn: Vec<(&str, &Evpn)> = networks
        .values()
        .filter_map(|n| Some((n.name.as_str(), n.own()?.evpn.as_ref()?)))
        .collect();
    let refuse = |network: &str, key: &str, message: String| ConfigError::Invalid {
        file: file.into(),
        network: network.into(),
        key: format!("evpn.{key}"),
        message,
    };
    let Some((first, one)) = evpn.first() else {
        return Ok(());
    };
    for (i, (name, e)) in evpn.iter().enumerate() {
        if let Some((other, _)) = evpn[..i].iter().find(|(_, o)| o.vni == e.vni) {
            return Err(refuse(
                name,
                "vni",
                format!(
                    "{} is also the VNI of network \"{other}\"; give each network its own",
                    e.vni
                ),
            ));
        }
        if e.asn != one.asn {
            return Err(refuse(
                name,
                "asn",
                format!(
                    "{} differs from network \"{first}\"'s {}: one BGP speaker carries all of this host's networks across hosts, so they share one AS",
                    e.asn, one.asn
                ),
            ));
        }
        if e.vtep != one.vtep {
            return Err(refuse(
                name,
                "vtep",
                format!(
                    "{} differs from network \"{first}\"'s {}: this host has one VTEP, its BGP router id, for all its networks across hosts",
                    e.vtep, one.vtep
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};

    const FABRIC: &str = "networks:
  fabric:
    mode: shared
    subnet: 10.77.0.0/24
    gateway: 10.77.0.1
    dhcp: { range: 10.77.0.10-10.77.0.29 }
    evpn:
      vni: 7700
      vtep: 192.0.2.11
      asn: 65000
      peers: [192.0.2.12, 192.0.2.13]
";

    /// A refusal as an invalid value: (network, key, message).
    fn invalid(result: Result<Config, ConfigError>) -> (String, String, String) {
        match result {
            Err(ConfigError::Invalid {
                network,
                key,
                message,
                ..
            }) => (network, key, message),
            other => panic!("refused as invalid: {other:?}"),
        }
    }

    /// Two hosts' configs of one network across hosts give it the same
    /// IPv6 prefix (not one per machine), so each host's bridge is the
    /// same router for it.
    #[test]
    fn a_network_across_hosts_has_the_same_ipv6_prefix_on_every_host() {
        let host2 = FABRIC
            .replace("vtep: 192.0.2.11", "vtep: 192.0.2.12")
            .replace(
                "peers: [192.0.2.12, 192.0.2.13]",
                "peers: [192.0.2.11, 192.0.2.13]",
            );
        let prefix = |yaml: &str| {
            let cfg = Config::from_yaml(yaml, "networks.yaml").unwrap();
            cfg.network("fabric").unwrap().ipv6().unwrap().prefix
        };
        assert_eq!(prefix(FABRIC), prefix(&host2));
        assert_eq!(
            prefix(FABRIC),
            crate::addr6::ula_prefix_across_hosts("fabric", 7700)
        );
    }

    #[test]
    fn frr_answers_at_its_default_sockets_or_where_the_file_says() {
        let cfg = Config::from_yaml(FABRIC, "networks.yaml").unwrap();
        assert_eq!(cfg.frr.vty_socket, std::path::Path::new("/var/run/frr"));
        let named = format!("{FABRIC}frr:\n  vty_socket: /var/run/frr/lab\n");
        let cfg = Config::from_yaml(&named, "networks.yaml").unwrap();
        assert_eq!(cfg.frr.vty_socket, std::path::Path::new("/var/run/frr/lab"));
        let relative = format!("{FABRIC}frr:\n  vty_socket: frr\n");
        let refused = Config::from_yaml(&relative, "networks.yaml").unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("frr.vty_socket: frr is not an absolute path"),
            "{refused}"
        );
    }

    #[test]
    fn a_network_across_hosts_has_its_vni_vtep_as_and_peers_and_a_vxlan_mtu() {
        let cfg = Config::from_yaml(FABRIC, "networks.yaml").unwrap();
        let own = cfg.network("fabric").unwrap().own().unwrap();
        let evpn = own.evpn.as_ref().expect("evpn");
        assert_eq!(evpn.vni, 7700);
        assert_eq!(
            evpn.vtep,
            "192.0.2.11".parse::<std::net::Ipv4Addr>().unwrap()
        );
        assert_eq!(evpn.asn, 65000);
        assert_eq!(evpn.peers.len(), 2);
        assert_eq!(own.mtu, 1450, "room for VXLAN on a 1500 underlay");
        let shared = cfg.network("shared").unwrap().own().unwrap();
        assert_eq!((shared.mtu, shared.evpn.as_ref()), (1500, None));
        let told = FABRIC.replace("    evpn:", "    mtu: 8950\n    evpn:");
        let cfg = Config::from_yaml(&told, "networks.yaml").unwrap();
        assert_eq!(cfg.network("fabric").unwrap().own().unwrap().mtu, 8950);
    }

    #[test]
    fn each_mistake_in_evpn_is_refused_with_its_key_and_reason() {
        let cases = [
            ("vni: 7700", "vni: 16777216", "evpn.vni", "out of range"),
            ("vni: 7700", "vni: 0", "evpn.vni", "out of range"),
            ("      vni: 7700\n", "", "evpn.vni", "is required"),
            (
                "vtep: 192.0.2.11",
                "vtep: 10.77.0.5",
                "evpn.vtep",
                "inside the network's own subnet",
            ),
            (
                "vtep: 192.0.2.11",
                "vtep: 224.0.0.1",
                "evpn.vtep",
                "unicast",
            ),
            (
                "vtep: 192.0.2.11",
                "vtep: host1",
                "evpn.vtep",
                "not an IPv4 address",
            ),
            ("asn: 65000", "asn: 23456", "evpn.asn", "reserved"),
            ("asn: 65000", "asn: 0", "evpn.asn", "reserved"),
            (
                "[192.0.2.12, 192.0.2.13]",
                "[]",
                "evpn.peers",
                "is required",
            ),
            (
                "[192.0.2.12, 192.0.2.13]",
                "[192.0.2.11]",
                "evpn.peers",
                "own VTEP",
            ),
            (
                "[192.0.2.12, 192.0.2.13]",
                "[192.0.2.12, 192.0.2.12]",
                "evpn.peers",
                "twice",
            ),
            (
                "dhcp: { range: 10.77.0.10-10.77.0.29 }",
                "dhcp: { range: 10.78.0.10-10.78.0.29 }",
                "dhcp",
                "",
            ),
        ];
        for (from, to, key, reason) in cases {
            let yaml = FABRIC.replace(from, to);
            assert_ne!(yaml, FABRIC, "{from} is in the example");
            let (_, k, message) = invalid(Config::from_yaml(&yaml, "networks.yaml"));
            assert!(k.starts_with(key), "{to}: key {k}, not {key}: {message}");
            assert!(message.contains(reason), "{to}: {message}");
        }
        let unknown = FABRIC.replace("      asn: 65000\n", "      asn: 65000\n      port: 8472\n");
        match Config::from_yaml(&unknown, "networks.yaml") {
            Err(ConfigError::Syntax { message, .. }) => {
                assert!(message.contains("unknown field"), "{message}")
            }
            other => panic!("an unknown key is refused: {other:?}"),
        }
    }

    #[test]
    fn evpn_on_a_lan_network_or_a_rootless_daemon_is_refused() {
        let lan = "networks:
  lan:
    mode: bridged
    uplink: eth0
    evpn: { vni: 1, vtep: 192.0.2.11, asn: 65000, peers: [192.0.2.12] }
";
        let (_, key, message) = invalid(Config::from_yaml(lan, "networks.yaml"));
        assert_eq!(key, "evpn");
        assert!(message.contains("mode: shared or host"), "{message}");
        let cfg = Config::from_yaml(FABRIC, "networks.yaml").unwrap();
        let (_, key, message) = invalid(cfg.for_rootless("10.0.2.3".parse().unwrap()));
        assert_eq!(key, "evpn");
        assert!(message.contains("system daemon"), "{message}");
    }

    #[test]
    fn the_hosts_networks_across_hosts_share_an_as_and_a_vtep_and_not_a_vni() {
        let second = |vni: u32, vtep: &str, asn: u32| {
            format!(
                "{FABRIC}  lab:
    mode: host
    subnet: 10.78.0.0/24
    evpn: {{ vni: {vni}, vtep: {vtep}, asn: {asn}, peers: [192.0.2.12] }}
"
            )
        };
        let ok = second(7800, "192.0.2.11", 65000);
        assert!(Config::from_yaml(&ok, "networks.yaml").is_ok());
        for (yaml, key, reason) in [
            (
                second(7700, "192.0.2.11", 65000),
                "evpn.vni",
                "also the VNI of network \"fabric\"",
            ),
            (second(7800, "192.0.2.99", 65000), "evpn.vtep", "one VTEP"),
            (second(7800, "192.0.2.11", 65001), "evpn.asn", "one AS"),
        ] {
            let (network, k, message) = invalid(Config::from_yaml(&yaml, "networks.yaml"));
            assert_eq!((network.as_str(), k.as_str()), ("lab", key), "{message}");
            assert!(message.contains(reason), "{message}");
        }
    }
}
