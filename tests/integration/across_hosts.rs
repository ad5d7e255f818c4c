//! One network across three hosts: each host a `World` (its own daemon,
//! its own upstream), all on one underlay bridge (192.0.2.11-13), each
//! running FRR's zebra and bgpd with the configuration `linnet
//! frr-config` prints for it, as an admin who runs FRR would. Guests on
//! each host lease from their host's slice, reach one another across the
//! hosts, and go out through their own host's NAT.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::*;

/// The underlay's /24; host i (1-based) is .1i.
const UNDERLAY: &str = "192.0.2";
const VNI: u32 = 7700;

/// One host: its world and the FRR daemons that serve it.
pub struct Site {
    pub world: World,
    pub vtep: String,
    /// FRR's vty sockets, pid files and zebra's socket.
    frr_dir: PathBuf,
    frr: Vec<Reaped>,
}

/// The hosts and the namespace of their underlay bridge.
pub struct Fabric {
    pub sites: Vec<Site>,
    _underlay: Netns,
}

/// Host `i`'s config: `fabric` with VNI `vni` and its own slice of the
/// subnet for DHCP.
fn site_config(i: usize, hosts: usize, vni: u32, subnet: &str) -> String {
    let vtep = format!("{UNDERLAY}.1{i}");
    let peers: Vec<String> = (1..=hosts)
        .filter(|&j| j != i)
        .map(|j| format!("{UNDERLAY}.1{j}"))
        .collect();
    let first = 10 * (i + 1);
    format!(
        "networks:
  fabric:
    mode: shared
    subnet: {subnet}.0/24
    dhcp: {{ range: {subnet}.{first}-{subnet}.{} }}
    evpn: {{ vni: {vni}, vtep: {vtep}, asn: 65000, peers: [{}] }}
",
        first + 9,
        peers.join(", ")
    )
}

impl Fabric {
    /// `hosts` hosts on one underlay, each with its daemon and FRR up.
    pub fn new(hosts: usize) -> Fabric {
        Fabric::with_configs(
            (1..=hosts)
                .map(|i| site_config(i, hosts, VNI, "10.77.0"))
                .collect(),
        )
    }

    /// Hosts with these configs (host i's VTEP is 192.0.2.1i).
    pub fn with_configs(configs: Vec<String>) -> Fabric {
        let underlay = Netns::new("underlay");
        must(&mut underlay.cmd(&["ip", "link", "add", "ub", "type", "bridge"]));
        must(&mut underlay.cmd(&["ip", "link", "set", "ub", "up"]));
        let mut sites = Vec::new();
        for (n, yaml) in configs.into_iter().enumerate() {
            let i = n + 1;
            let mut world = World::with_config(&yaml);
            let port = format!("u{i}");
            must(Command::new("ip").args([
                "link",
                "add",
                &port,
                "netns",
                &underlay.name,
                "type",
                "veth",
                "peer",
                "name",
                "underlay",
                "netns",
                &world.host.name,
            ]));
            must(&mut underlay.cmd(&["ip", "link", "set", &port, "master", "ub", "up"]));
            let vtep = format!("{UNDERLAY}.1{i}");
            let host = &world.host;
            must(&mut host.cmd(&[
                "ip",
                "addr",
                "add",
                &format!("{vtep}/24"),
                "dev",
                "underlay",
            ]));
            must(&mut host.cmd(&["ip", "link", "set", "underlay", "up"]));
            world.start_daemon();
            let mut site = Site {
                world,
                vtep,
                frr_dir: PathBuf::new(),
                frr: Vec::new(),
            };
            site.start_frr();
            sites.push(site);
        }
        Fabric {
            sites,
            _underlay: underlay,
        }
    }
}

impl Site {
    /// zebra and bgpd in the host's namespace with `linnet frr-config`'s
    /// configuration; their sockets in a directory of this site's.
    pub fn start_frr(&mut self) {
        let dir = self.world.dir.path().join("frr");
        std::fs::create_dir_all(&dir).unwrap();
        let out = must(&mut self.world.linnet(&["frr-config"]));
        let conf = dir.join("frr.conf");
        std::fs::write(&conf, out).unwrap();
        // FRR's daemons drop to the frr user.
        must(Command::new("chown").args(["-R", "frr:frr", dir.to_str().unwrap()]));
        let zserv = dir.join("zserv.api");
        let (d, c, z) = (
            dir.to_str().unwrap(),
            conf.to_str().unwrap(),
            zserv.to_str().unwrap(),
        );
        for daemon in ["zebra", "bgpd"] {
            let pid = format!("{d}/{daemon}.pid");
            let log = std::fs::File::create(dir.join(format!("{daemon}.log"))).unwrap();
            let bin = format!("/usr/lib/frr/{daemon}");
            let mut args = vec![
                bin.as_str(),
                "-f",
                c,
                "-i",
                &pid,
                "-z",
                z,
                "--vty_socket",
                d,
                "-P",
                "0",
                "--log",
                "stdout",
            ];
            if daemon == "bgpd" {
                args.extend_from_slice(&["-l", &self.vtep]);
            }
            let child = self
                .world
                .host
                .cmd(&args)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            self.frr.push(Reaped(child));
            if daemon == "zebra" {
                wait_for("zebra's socket", Duration::from_secs(10), || {
                    zserv.exists().then_some(())
                });
            }
        }
        self.frr_dir = dir;
    }

    /// What vtysh says to `command` of this site's FRR.
    pub fn vtysh(&self, command: &str) -> String {
        let out = run(&mut self.world.host.cmd(&[
            "vtysh",
            "--vty_socket",
            self.frr_dir.to_str().unwrap(),
            "-c",
            command,
        ]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn frr_log(&self) -> String {
        ["zebra", "bgpd"]
            .iter()
            .map(|d| {
                std::fs::read_to_string(self.frr_dir.join(format!("{d}.log"))).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A guest on `site`'s `fabric` with its address from DHCP.
fn guest_on(site: &Site) -> (Guest, String) {
    let guest = site.world.guest("fabric", &[]);
    let ip = guest.udhcpc().to_string();
    (guest, ip)
}

fn in_slice(ip: &str, i: usize) -> bool {
    let last: usize = ip.rsplit('.').next().unwrap().parse().unwrap();
    ip.starts_with("10.77.0.") && (10 * (i + 1)..=10 * (i + 1) + 9).contains(&last)
}

/// Pings `target` from `guest` until one answers (BGP and EVPN converge
/// meanwhile), within `within`.
fn reaches(guest: &Guest, target: &str, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if guest.ping(target) {
            return true;
        }
    }
    false
}

fn dump(fabric: &Fabric) -> String {
    fabric
        .sites
        .iter()
        .map(|s| {
            format!(
                "== {} ==\n{}\n{}\n{}",
                s.vtep,
                s.vtysh("show bgp l2vpn evpn summary"),
                s.vtysh("show evpn mac vni all"),
                s.frr_log()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn guests_on_three_hosts_reach_one_another_and_go_out_through_their_own_host() {
    let fabric = Fabric::new(3);
    let guests: Vec<(Guest, String)> = fabric.sites.iter().map(guest_on).collect();
    for (i, (_, ip)) in guests.iter().enumerate() {
        assert!(
            in_slice(ip, i + 1),
            "host {}'s guest got {ip}, outside its slice",
            i + 1
        );
    }
    let (first, _) = &guests[0];
    for (_, ip) in &guests[1..] {
        assert!(
            reaches(first, ip, Duration::from_secs(30)),
            "host 1's guest cannot reach {ip}\n{}",
            dump(&fabric)
        );
    }
    for (guest, _) in &guests {
        guest.assert_reaches_upstream("through its own host's NAT");
    }
    // Host 1's FRR has the other hosts' guests' MACs as type-2 routes,
    // with their addresses.
    let routes = fabric.sites[0].vtysh("show bgp l2vpn evpn route type macip");
    for (guest, ip) in &guests[1..] {
        let mac = guest.mac().to_lowercase();
        assert!(routes.contains(&mac), "no route for {mac}:\n{routes}");
        assert!(routes.contains(ip.as_str()), "no route for {ip}:\n{routes}");
    }
    // Each host's bridge is the same gateway: the guests' gateway is the
    // same address and MAC everywhere, and each answers locally.
    let gateway = guests[0].0.gateway();
    for (guest, _) in &guests {
        assert_eq!(guest.gateway(), gateway);
        assert!(guest.ping(&gateway));
    }
}
