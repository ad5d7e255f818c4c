//! What FRR says of a network across hosts, for `linnet doctor`: the BGP
//! session with each peer, the VNI as zebra sees it, and the MACs it
//! learned from the other hosts; and what is missing, said with what to
//! do. Read from vtysh's JSON (FRR 8.4), which the daemon asks for
//! (`host::frr_vty`); nothing here runs anything.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::Evpn;

/// The commands whose answers `health` reads, for VNI `vni`.
pub fn commands(vni: u32) -> [String; 3] {
    [
        "show bgp l2vpn evpn summary json".into(),
        format!("show evpn vni {vni} json"),
        format!("show evpn mac vni {vni} json"),
    ]
}

/// A network across hosts as FRR sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricHealth {
    pub vni: u32,
    pub vtep: Ipv4Addr,
    /// The BGP session with each configured peer.
    pub sessions: Vec<Session>,
    /// Whether zebra knows the VNI (its VXLAN device on a bridge with an
    /// address).
    pub vni_known: bool,
    /// The other hosts zebra floods the VNI's broadcasts to.
    pub remote_vteps: Vec<Ipv4Addr>,
    /// MACs behind other hosts, from their EVPN routes.
    pub remote_macs: usize,
    /// What is missing or wrong, each with what to do.
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub peer: Ipv4Addr,
    /// BGP's state ("Established", "Active", ...), or "not configured"
    /// when FRR has no such neighbour.
    pub state: String,
}

impl Session {
    pub fn established(&self) -> bool {
        self.state == "Established"
    }
}

/// FRR's answers to `commands(evpn.vni)`, in order, or why there are none
/// (FRR not installed, not answering). `up`: whether the network is up on
/// this host (zebra knows a VNI only while its VXLAN device exists).
pub fn health(evpn: &Evpn, up: bool, answers: Result<[String; 3], String>) -> FabricHealth {
    let mut health = FabricHealth {
        vni: evpn.vni,
        vtep: evpn.vtep,
        sessions: Vec::new(),
        vni_known: false,
        remote_vteps: Vec::new(),
        remote_macs: 0,
        problems: Vec::new(),
    };
    let [summary, vni, macs] = match answers {
        Ok(answers) => answers,
        Err(why) => {
            health.problems.push(why);
            return health;
        }
    };
    let summary: Value = serde_json::from_str(&summary).unwrap_or_default();
    for peer in &evpn.peers {
        let state = summary["peers"][peer.to_string()]["state"]
            .as_str()
            .unwrap_or("not configured");
        health.sessions.push(Session {
            peer: *peer,
            state: state.into(),
        });
        if state == "not configured" {
            health.problems.push(format!(
                "FRR has no BGP neighbour {peer}: load the configuration `linnet frr-config` prints into FRR"
            ));
        } else if state != "Established" {
            health.problems.push(format!(
                "the BGP session with {peer} is {state}: is FRR running there, with TCP port 179 reachable from {}?",
                evpn.vtep
            ));
        }
    }
    let vni: Value = serde_json::from_str(&vni).unwrap_or_default();
    health.vni_known = vni["vni"].as_u64() == Some(u64::from(evpn.vni));
    // FRR 8.4 lists the remote VTEPs under "numRemoteVteps"; later
    // versions under "remoteVteps".
    for key in ["remoteVteps", "numRemoteVteps"] {
        if let Some(list) = vni[key].as_array() {
            health.remote_vteps = list
                .iter()
                .filter_map(|v| v.as_str()?.parse().ok())
                .collect();
            break;
        }
    }
    if up && !health.vni_known {
        health.problems.push(format!(
            "zebra does not know VNI {}: is zebra running in this network namespace, with `advertise-all-vni` (from `linnet frr-config`)?",
            evpn.vni
        ));
    }
    let macs: Value = serde_json::from_str(&macs).unwrap_or_default();
    health.remote_macs = macs["macs"].as_object().map_or(0, |m| {
        m.values().filter(|mac| mac["type"] == "remote").count()
    });
    health
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evpn() -> Evpn {
        Evpn {
            vni: 7700,
            vtep: "192.0.2.11".parse().unwrap(),
            asn: 65000,
            peers: vec!["192.0.2.12".parse().unwrap(), "192.0.2.13".parse().unwrap()],
        }
    }

    /// Answers as FRR 8.4 gives them: 192.0.2.12 up, 192.0.2.13 not.
    fn answers() -> [String; 3] {
        let summary = r#"{"routerId":"192.0.2.11","as":65000,"peers":{
            "192.0.2.12":{"remoteAs":65000,"state":"Established","pfxRcd":2},
            "192.0.2.13":{"remoteAs":65000,"state":"Active","pfxRcd":0}}}"#;
        let vni = r#"{"vni":7700,"type":"L2","vxlanInterface":"lx-fabric",
            "vtepIp":"192.0.2.11","numMacs":3,"numRemoteVteps":["192.0.2.12"]}"#;
        let macs = r#"{"numMacs":3,"macs":{
            "16:0c:af:5f:b8:70":{"type":"remote","remoteVtep":"192.0.2.12"},
            "82:64:0c:77:c7:6b":{"type":"remote","remoteVtep":"192.0.2.12"},
            "0e:73:4c:7a:49:9b":{"type":"local","intf":"lnt0"}}}"#;
        [summary.into(), vni.into(), macs.into()]
    }

    #[test]
    fn sessions_the_vni_and_remote_macs_are_read_and_a_session_down_named() {
        let h = health(&evpn(), true, Ok(answers()));
        assert_eq!(h.sessions.len(), 2);
        assert!(h.sessions[0].established() && !h.sessions[1].established());
        assert!(h.vni_known);
        assert_eq!(h.remote_vteps, ["192.0.2.12".parse::<Ipv4Addr>().unwrap()]);
        assert_eq!(h.remote_macs, 2, "the local one is not counted");
        assert_eq!(h.problems.len(), 1, "{:?}", h.problems);
        assert!(
            h.problems[0].contains("192.0.2.13 is Active"),
            "{:?}",
            h.problems
        );
    }

    #[test]
    fn a_peer_frr_lacks_and_a_vni_zebra_lacks_are_named_with_the_fix() {
        let [summary, _, _] = answers();
        let mut e = evpn();
        e.peers.push("192.0.2.14".parse().unwrap());
        let h = health(&e, true, Ok([summary.clone(), "{\n}".into(), "{}".into()]));
        let all = h.problems.join("\n");
        assert!(all.contains("FRR has no BGP neighbour 192.0.2.14"), "{all}");
        assert!(all.contains("zebra does not know VNI 7700"), "{all}");
        assert_eq!(h.remote_macs, 0);
        // Down on this host, zebra knowing no VNI is no problem.
        let h = health(&evpn(), false, Ok([summary, "{}".into(), "{}".into()]));
        assert!(
            !h.problems.iter().any(|p| p.contains("zebra")),
            "{:?}",
            h.problems
        );
    }

    #[test]
    fn frr_that_does_not_answer_is_the_one_problem() {
        let h = health(&evpn(), true, Err("FRR does not answer".into()));
        assert_eq!(h.problems, ["FRR does not answer"]);
        assert!(h.sessions.is_empty() && !h.vni_known);
    }
}
