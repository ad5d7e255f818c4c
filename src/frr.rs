//! FRR's configuration for this host's networks across hosts (`evpn:`),
//! as `linnet frr-config` prints it: zebra learns the VMs' MACs and
//! addresses from the kernel (the VXLAN devices on linnet's bridges), and
//! one `router bgp` advertises them to the other hosts as EVPN type-2
//! routes and installs theirs. linnet writes the configuration; FRR speaks
//! BGP.
//!
//! Every host's bridge carries the same gateway address (the anycast
//! gateway), so the router id is set to the VTEP, which is the host's
//! own. The hosts share one AS (iBGP) and each lists the others; route
//! distinguishers and targets are FRR's automatic ones (AS:VNI), the same
//! on every host.

pub mod health;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use thiserror::Error;

use crate::config::{Config, Evpn};

/// The peer group of linnet's iBGP neighbours.
const PEER_GROUP: &str = "linnet";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrrError {
    #[error(
        "{file}: no network has an evpn: section, so there is nothing for FRR to carry; give a network one (docs/multihost.md)"
    )]
    NoEvpn { file: String },
}

/// The configuration for zebra and bgpd (one `frr.conf`), for `cfg`'s
/// networks across hosts. `Config` has checked that they agree on the AS
/// and the VTEP.
pub fn config(cfg: &Config) -> Result<String, FrrError> {
    let networks: Vec<(&str, &Evpn)> = cfg
        .networks
        .values()
        .filter_map(|n| Some((n.name.as_str(), n.own()?.evpn.as_ref()?)))
        .collect();
    let Some((_, first)) = networks.first() else {
        return Err(FrrError::NoEvpn {
            file: cfg.source_name(),
        });
    };
    let (asn, vtep) = (first.asn, first.vtep);
    let peers: BTreeSet<Ipv4Addr> = networks
        .iter()
        .flat_map(|(_, e)| e.peers.iter().copied())
        .collect();
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!(
        "! FRR for linnet's networks across hosts on this host (VTEP {vtep}),"
    ));
    line(format!(
        "! from `linnet frr-config` ({}). zebra and bgpd.",
        cfg.source_name()
    ));
    for (name, e) in &networks {
        line(format!("!   network \"{name}\": VNI {}", e.vni));
    }
    line("frr defaults datacenter".into());
    line("log syslog informational".into());
    line("!".into());
    line(format!("router bgp {asn}"));
    line(format!(" bgp router-id {vtep}"));
    line(" no bgp default ipv4-unicast".into());
    line(format!(" neighbor {PEER_GROUP} peer-group"));
    line(format!(" neighbor {PEER_GROUP} remote-as internal"));
    line(format!(" neighbor {PEER_GROUP} update-source {vtep}"));
    for peer in &peers {
        line(format!(" neighbor {peer} peer-group {PEER_GROUP}"));
    }
    line(" !".into());
    line(" address-family l2vpn evpn".into());
    line(format!("  neighbor {PEER_GROUP} activate"));
    line("  advertise-all-vni".into());
    line(" exit-address-family".into());
    line("exit".into());
    line("!".into());
    // As vtysh ends what it writes.
    line("end".into());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = include_str!("../tests/networks/across-hosts.yaml");

    #[test]
    fn one_bgp_speaker_carries_every_network_with_their_peers_combined() {
        let cfg = Config::from_yaml(TWO, "networks.yaml").unwrap();
        let text = config(&cfg).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let count = |prefix: &str| lines.iter().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(count("router bgp "), 1, "{text}");
        assert!(lines.contains(&"router bgp 65000"), "{text}");
        assert!(lines.contains(&" bgp router-id 192.0.2.11"), "{text}");
        assert!(lines.contains(&" neighbor linnet update-source 192.0.2.11"));
        let peers: Vec<&str> = lines
            .iter()
            .filter_map(|l| {
                l.strip_prefix(" neighbor ")?
                    .strip_suffix(" peer-group linnet")
            })
            .collect();
        assert_eq!(peers, ["192.0.2.12", "192.0.2.13", "192.0.2.14"], "{text}");
        assert!(lines.contains(&"  neighbor linnet activate"));
        assert!(lines.contains(&"  advertise-all-vni"));
        assert!(text.contains("network \"fabric\": VNI 7700"));
        assert!(text.contains("network \"lab\": VNI 7800"));
        assert_eq!(lines.last(), Some(&"end"));
    }

    #[test]
    fn a_host_without_networks_across_hosts_is_told_so() {
        let cfg = Config::from_yaml("", "networks.yaml").unwrap();
        let refused = config(&cfg).unwrap_err();
        assert!(matches!(refused, FrrError::NoEvpn { .. }), "{refused:?}");
    }
}
