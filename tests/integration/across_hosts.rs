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
    frr: Vec<Helper>,
}

/// The hosts and the namespace of their underlay bridge.
pub struct Fabric {
    pub sites: Vec<Site>,
    pub underlay: Netns,
}

/// One network across hosts: its name, VNI and /24 (as "10.77.0").
#[derive(Clone, Copy)]
struct Net {
    name: &'static str,
    vni: u32,
    subnet: &'static str,
}

const FABRIC: Net = Net {
    name: "fabric",
    vni: VNI,
    subnet: "10.77.0",
};

/// Host `i`'s config of `nets` among `hosts` hosts: each network with the
/// host's own slice of its subnet for DHCP, and `extra` lines (indented
/// as the network's keys) in each.
fn site_config(i: usize, hosts: usize, nets: &[Net], extra: &str) -> String {
    let vtep = format!("{UNDERLAY}.1{i}");
    let peers: Vec<String> = (1..=hosts)
        .filter(|&j| j != i)
        .map(|j| format!("{UNDERLAY}.1{j}"))
        .collect();
    let first = 10 * (i + 1);
    let mut yaml = String::from("networks:\n");
    for net in nets {
        let Net { name, vni, subnet } = net;
        yaml += &format!(
            "  {name}:
    mode: shared
    subnet: {subnet}.0/24
    dhcp: {{ range: {subnet}.{first}-{subnet}.{}{extra} }}
    evpn: {{ vni: {vni}, vtep: {vtep}, asn: 65000, peers: [{}] }}
",
            first + 9,
            peers.join(", ")
        );
    }
    yaml
}

impl Fabric {
    /// `hosts` hosts on one underlay, each with its daemon and FRR up.
    pub fn new(hosts: usize) -> Fabric {
        Fabric::of(hosts, &[FABRIC], "")
    }

    /// `hosts` hosts, each with `nets` (and `dhcp` keys `extra`).
    fn of(hosts: usize, nets: &[Net], extra: &str) -> Fabric {
        Fabric::with_configs(
            (1..=hosts)
                .map(|i| site_config(i, hosts, nets, extra))
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
            let world = World::with_config(&yaml);
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
            // linnet's doctor asks this site's FRR, at its sockets.
            let frr_dir = world.dir.path().join("frr");
            let config = world.config.clone().expect("a config");
            let yaml = std::fs::read_to_string(&config).unwrap();
            let yaml = format!("{yaml}frr:\n  vty_socket: {}\n", frr_dir.display());
            std::fs::write(&config, yaml).unwrap();
            let mut site = Site {
                world,
                vtep,
                frr_dir,
                frr: Vec::new(),
            };
            site.start_frr();
            // Each host its own machine id, as real hosts have: what a
            // network across hosts shares must not come from it.
            let machine_id = site.world.dir.path().join("machine-id");
            std::fs::write(&machine_id, format!("{:032x}\n", 0x5eed_0000 + i)).unwrap();
            let wrapper = own_mounts(&format!(
                "mount --bind {} /etc/machine-id",
                machine_id.display()
            ));
            let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
            site.world.start_daemon_with(&wrapper, &[]);
            sites.push(site);
        }
        Fabric { sites, underlay }
    }
}

impl Site {
    /// zebra and bgpd in the host's namespace with `linnet frr-config`'s
    /// configuration; their sockets in a directory of this site's.
    pub fn start_frr(&mut self) {
        let dir = self.frr_dir.clone();
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
            let log = dir.join(format!("{daemon}.log"));
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
            self.frr
                .push(Helper::start(daemon, self.world.host.cmd(&args), &log));
            // Each serves once its vty socket is there (zebra's API
            // socket too, which bgpd connects to).
            let vty = dir.join(format!("{daemon}.vty"));
            let frr: Vec<&Helper> = self.frr.iter().collect();
            wait_while_running(
                &frr,
                &format!("{daemon}'s sockets"),
                Duration::from_secs(10),
                || (vty.exists() && zserv.exists()).then_some(()),
            );
        }
    }

    /// Fails at once, saying why, if this site's zebra or bgpd has ended
    /// (a test that waits on FRR's state would otherwise time out).
    pub fn assert_frr_running(&self, what: &str) {
        for daemon in &self.frr {
            daemon.assert_running(what);
        }
    }

    /// Kills this site's FRR (zebra and bgpd), as a crash would.
    pub fn kill_frr(&mut self) {
        for mut daemon in self.frr.drain(..) {
            daemon.kill().unwrap();
            daemon.wait().unwrap();
        }
    }

    /// `linnet doctor --json` here: its exit status and the report of
    /// network `fabric`'s FRR part.
    pub fn doctor(&self) -> (bool, serde_json::Value) {
        let out = run(&mut self.world.linnet(&["doctor", "--json"]));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        let fabric = report["networks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "fabric")
            .expect("network fabric in the report")["fabric"]
            .clone();
        (out.status.success(), fabric)
    }

    /// What vtysh says to `command` of this site's FRR.
    pub fn vtysh(&self, command: &str) -> String {
        self.assert_frr_running(&format!("vtysh -c '{command}'"));
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
    guest_of(site, "fabric", &[])
}

/// A guest on `site`'s network `network` (`linnet run` options `extra`)
/// with its address from DHCP.
fn guest_of(site: &Site, network: &str, extra: &[&str]) -> (Guest, String) {
    let guest = site.world.guest(network, extra);
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
    // The VXLAN port as linnet set it: the kernel's own word.
    for site in &fabric.sites {
        let port =
            must(
                &mut site
                    .world
                    .host
                    .cmd(&["bridge", "-d", "link", "show", "dev", "lx-fabric"]),
            );
        assert!(
            port.contains("learning off")
                && port.contains("neigh_suppress on")
                && port.contains("master ln-fabric"),
            "{port}"
        );
        let vxlan = must(
            &mut site
                .world
                .host
                .cmd(&["ip", "-d", "link", "show", "lx-fabric"]),
        );
        let wanted = format!("vxlan id {VNI} local {} ", site.vtep);
        assert!(
            vxlan.contains(&wanted)
                && vxlan.contains("dstport 4789")
                && vxlan.contains("nolearning"),
            "{vxlan}"
        );
    }
    // Each host's bridge is the same gateway: the guests' gateway is the
    // same address and MAC everywhere, and each answers locally.
    let gateway = guests[0].0.gateway();
    for (guest, _) in &guests {
        assert_eq!(guest.gateway(), gateway);
        assert!(guest.ping(&gateway));
    }
}

/// A counter, in `ns`'s own table `bridge probe`, of the broadcast ARP
/// frames the bridge sends into the VXLAN port `port`: what crosses the
/// underlay to every other host.
fn count_broadcast_arp(ns: &Netns, port: &str) -> impl Fn() -> u64 {
    let counts = nft_probe(
        ns,
        format!(
            "table bridge probe {{\n  set asked {{ type ipv4_addr; flags dynamic; }}\n  \
             chain out {{\n    type filter hook forward priority -200;\n    \
             oifname \"{port}\" ether daddr ff:ff:ff:ff:ff:ff ether type arp \
             add @asked {{ arp daddr ip }} counter\n  }}\n}}\n"
        ),
    );
    move || counts()[0]
}

/// Loads `rules`, the test's own table `bridge probe`, into `ns`: a
/// reader of its counters' packets, in the order of its rules. The table
/// goes with the namespace.
fn nft_probe(ns: &Netns, rules: String) -> impl Fn() -> Vec<u64> {
    let mut load = ns
        .cmd(&["nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    load.stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    assert!(
        load.wait().unwrap().success(),
        "nft took the probe:\n{rules}"
    );
    let name = ns.name.clone();
    move || {
        let text = must(Command::new("ip").args([
            "netns", "exec", &name, "nft", "list", "table", "bridge", "probe",
        ]));
        text.split("counter packets ")
            .skip(1)
            .map(|c| c.split_whitespace().next().unwrap().parse().unwrap())
            .collect()
    }
}

#[test]
fn once_warm_no_broadcast_arp_for_a_remote_guest_crosses_the_underlay() {
    let fabric = Fabric::new(2);
    let (a, _) = guest_on(&fabric.sites[0]);
    let (_b, b_ip) = guest_on(&fabric.sites[1]);
    assert!(
        reaches(&a, &b_ip, Duration::from_secs(30)),
        "{}",
        dump(&fabric)
    );
    let crossed = count_broadcast_arp(&fabric.sites[0].world.host, "lx-fabric");
    must(&mut a.ns.cmd(&["ip", "neigh", "flush", "all"]));
    assert!(a.ping(&b_ip), "after the flush");
    let host1 = &fabric.sites[0].world.host;
    assert_eq!(
        crossed(),
        0,
        "host 1's bridge answered the ARP from what EVPN told it\n{}\n{}\n{}\n{}\n{}",
        must(&mut host1.cmd(&["ip", "neigh", "show", "dev", "ln-fabric"])),
        must(&mut host1.cmd(&["bridge", "fdb", "show", "br", "ln-fabric"])),
        must(&mut a.ns.cmd(&["ip", "neigh"])),
        must(&mut host1.cmd(&["nft", "list", "set", "bridge", "probe", "asked"])),
        must(&mut host1.cmd(&["bridge", "-d", "link", "show", "dev", "lx-fabric"])),
    );
    // The same probe counts an ARP that EVPN cannot answer: an address
    // no guest has.
    assert!(!a.ping("10.77.0.99"));
    assert!(
        crossed() > 0,
        "an unanswerable ARP crossed, and was counted"
    );
}

#[test]
fn full_size_frames_cross_unfragmented_and_an_mtu_that_does_not_fit_is_refused() {
    let fabric = Fabric::new(2);
    let (a, _) = guest_on(&fabric.sites[0]);
    let (_b, b_ip) = guest_on(&fabric.sites[1]);
    assert!(
        reaches(&a, &b_ip, Duration::from_secs(30)),
        "{}",
        dump(&fabric)
    );
    let mtu = must(&mut a.ns.cmd(&["cat", "/sys/class/net/eth0/mtu"]));
    assert_eq!(mtu.trim(), "1450", "1500 on the underlay less VXLAN's 50");
    let frag_creates = |site: &Site| -> u64 {
        let snmp = must(&mut site.world.host.cmd(&["cat", "/proc/net/snmp"]));
        let mut ip = snmp.lines().filter(|l| l.starts_with("Ip:"));
        let (names, values) = (ip.next().unwrap(), ip.next().unwrap());
        let at = names
            .split_whitespace()
            .position(|n| n == "FragCreates")
            .unwrap();
        values.split_whitespace().nth(at).unwrap().parse().unwrap()
    };
    let before: Vec<u64> = fabric.sites.iter().map(frag_creates).collect();
    // 1422 bytes of ICMP data: a 1450-byte packet, the guest's MTU.
    let out = run(&mut a
        .ns
        .cmd(&["busybox", "ping", "-c", "3", "-W", "2", "-s", "1422", &b_ip]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("3 packets received"), "{said}");
    let after: Vec<u64> = fabric.sites.iter().map(frag_creates).collect();
    assert_eq!(before, after, "no host fragmented a VXLAN packet");
    // The control: a host that does fragment is counted.
    let peer = &fabric.sites[1].vtep;
    must(
        &mut fabric.sites[0]
            .world
            .host
            .cmd(&["busybox", "ping", "-c", "1", "-W", "2", "-s", "3000", peer]),
    );
    assert!(
        frag_creates(&fabric.sites[0]) > after[0],
        "the counter counts"
    );

    // A host whose config asks more than its underlay carries refuses the
    // network with the MTU that fits.
    let yaml =
        site_config(1, 2, &[FABRIC], "").replace("mode: shared", "mode: shared\n    mtu: 1480");
    let mut world = World::with_config(&yaml);
    must(
        &mut world
            .host
            .cmd(&["ip", "addr", "add", "192.0.2.11/32", "dev", "lo"]),
    );
    world.start_daemon();
    let refused = world.attach_refused("fabric", &[]);
    assert!(
        refused.contains("mtu 1480 does not fit the underlay")
            && refused.contains("set networks.fabric.mtu to"),
        "{refused}"
    );
    // A VTEP that is none of the host's addresses.
    let mut world = World::with_config(&site_config(1, 2, &[FABRIC], ""));
    world.start_daemon();
    let refused = world.attach_refused("fabric", &[]);
    assert!(
        refused.contains("evpn.vtep 192.0.2.11 is no address of this host"),
        "{refused}"
    );
    assert!(
        refused.contains("203.0.113.1 on"),
        "names what the host has: {refused}"
    );
}

#[test]
fn two_networks_across_hosts_do_not_reach_each_other_routed_or_on_link() {
    let other = Net {
        name: "other",
        vni: 7800,
        subnet: "10.78.0",
    };
    // Without anti-spoofing, so that only the VNI keeps a guest with an
    // address of the other subnet off the other network.
    let configs = (1..=2)
        .map(|i| {
            site_config(i, 2, &[FABRIC, other], "")
                .replace("mode: shared", "mode: shared\n    anti_spoofing: false")
        })
        .collect();
    let fabric = Fabric::with_configs(configs);
    let (a1, _) = guest_of(&fabric.sites[0], "fabric", &[]);
    let (_a2, a2_ip) = guest_of(&fabric.sites[1], "fabric", &[]);
    let (b1, _) = guest_of(&fabric.sites[0], "other", &[]);
    let (_b2, b2_ip) = guest_of(&fabric.sites[1], "other", &[]);
    // Each network works between its hosts.
    assert!(
        reaches(&a1, &a2_ip, Duration::from_secs(30)),
        "{}",
        dump(&fabric)
    );
    assert!(
        reaches(&b1, &b2_ip, Duration::from_secs(30)),
        "{}",
        dump(&fabric)
    );
    // Not through the gateways (while the same guest's way out through
    // its gateway works: to its host's own address)...
    assert!(a1.ping(&fabric.sites[0].vtep), "the routed control");
    assert!(
        !a1.ping(&b2_ip),
        "fabric reached other's guest through the gateway"
    );
    // ...nor on-link, with an address from the other's subnet: another
    // VNI is another wire.
    assert!(
        !a1.ping_from("10.78.0.200/24", &b2_ip),
        "fabric reached other's guest on-link"
    );
    // The same on-link probe works where the wire is shared: b1 with an
    // address of its own subnet.
    assert!(
        b1.ping_from("10.78.0.201/24", &b2_ip),
        "the on-link control"
    );
}

#[test]
fn a_guest_that_moves_hosts_with_its_mac_is_reachable_again_within_seconds_and_nothing_stale_is_left()
 {
    const MAC: &str = "02:77:00:00:00:05";
    const IP: &str = "10.77.0.5";
    let reservation = format!(", static: [{{ ip: {IP}, mac: \"{MAC}\" }}]");
    let fabric = Fabric::of(3, &[FABRIC], &reservation);
    let (watcher, _) = guest_on(&fabric.sites[0]);
    // A guest that stays keeps the network up on host 2.
    let (_stays, _) = guest_on(&fabric.sites[1]);
    let (mut moving, ip) = guest_of(&fabric.sites[1], "fabric", &["--mac", MAC]);
    assert_eq!(ip, IP, "the reservation on host 2");
    assert!(
        reaches(&watcher, IP, Duration::from_secs(30)),
        "{}",
        dump(&fabric)
    );
    // Its host's neighbour entry of it is linnet's own while it is there.
    let host2 = &fabric.sites[1].world.host;
    let neigh = must(&mut host2.cmd(&["ip", "neigh", "show", IP, "dev", "ln-fabric"]));
    assert!(neigh.contains("PERMANENT"), "the control: {neigh}");
    moving.stop();
    let ns = moving.into_ns();
    // Host 3 takes the MAC once FRR there no longer knows it behind host
    // 2 (until then an attach with it is refused: a MAC another host
    // holds is never taken). Host 3's network is down (no VM there yet),
    // so its forwarding table says nothing: what its FRR still has from
    // host 2 is in its BGP table, and host 1 (up) shows the withdrawal.
    wait_for(
        "host 2's route to the MAC withdrawn on hosts 1 and 3",
        Duration::from_secs(10),
        || {
            let on_host1 = remote_fdb(&fabric.sites[0], MAC);
            let on_host3 = fabric.sites[2].vtysh("show bgp l2vpn evpn route");
            (!on_host1.contains(&fabric.sites[1].vtep) && !on_host3.contains(MAC)).then_some(())
        },
    );
    let start = std::time::Instant::now();
    let moved = fabric.sites[2]
        .world
        .guest_in(ns, "fabric", &["--mac", MAC]);
    assert_eq!(moved.udhcpc().to_string(), IP, "the reservation on host 3");
    assert!(
        reaches(&watcher, IP, Duration::from_secs(5)),
        "not reachable on host 3 within 5 s\n{}",
        dump(&fabric)
    );
    eprintln!("reachable on host 3 {:?} after its attach", start.elapsed());
    // Host 2 keeps nothing of it as its own: no neighbour entry of
    // linnet's, and its MAC is behind the VXLAN port, at host 3.
    let neigh = must(&mut host2.cmd(&["ip", "neigh", "show", IP, "dev", "ln-fabric"]));
    assert!(!neigh.contains("PERMANENT"), "{neigh}");
    let fdb = must(&mut host2.cmd(&["bridge", "fdb", "show", "br", "ln-fabric"]));
    let entries: Vec<&str> = fdb.lines().filter(|l| l.contains(MAC)).collect();
    assert!(
        !entries.is_empty() && entries.iter().all(|l| l.contains("lx-fabric")),
        "{fdb}"
    );
}

#[test]
fn a_daemon_restart_on_one_host_loses_at_most_two_of_twenty_pings_to_its_guest() {
    let mut fabric = Fabric::new(2);
    let (a, _) = guest_on(&fabric.sites[0]);
    let (_b, b_ip) = guest_on(&fabric.sites[1]);
    assert!(
        reaches(&a, &b_ip, Duration::from_secs(30)),
        "{}",
        dump(&fabric)
    );
    let mut ping =
        a.ns.cmd(&["busybox", "ping", "-c", "20", "-i", "0.2", "-W", "1", &b_ip])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
    // The restart once the pings are answered.
    let mut out = std::io::BufReader::new(ping.stdout.take().unwrap());
    let mut said = String::new();
    while !said.contains("bytes from") {
        let before = said.len();
        std::io::BufRead::read_line(&mut out, &mut said).unwrap();
        assert!(said.len() > before, "ping ended before an answer: {said}");
    }
    let world = &mut fabric.sites[1].world;
    world.stop_daemon();
    world.start_daemon();
    std::io::Read::read_to_string(&mut out, &mut said).unwrap();
    assert!(ping.wait().unwrap().code().is_some());
    let received: u32 = said
        .split(" packets received")
        .next()
        .and_then(|s| s.rsplit(", ").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        received >= 18,
        "{received} of 20 answered across the restart:\n{said}"
    );
    assert!(a.ping(&b_ip), "and after it");
}

#[test]
fn a_qemu_guest_on_one_host_and_a_stand_in_on_another_reach_each_other() {
    let fabric = Fabric::new(2);
    let (standin, standin_ip) = guest_on(&fabric.sites[1]);
    let vm = crate::qemu::Vm::start(
        &fabric.sites[0].world,
        "fabric",
        &format!(
            "i=0; while [ $i -lt 30 ] && ! ping -c 1 -W 1 {standin_ip} >/dev/null; do i=$((i+1)); done\n\
             ping -c 3 -W 2 {standin_ip} && echo RESULT-PING-OK\n\
             sleep 10\n"
        ),
        &[],
    );
    let console = vm.wait_console("RESULT-PING");
    assert!(
        console.contains("RESULT-PING-OK"),
        "{console}\n{}",
        dump(&fabric)
    );
    assert!(
        standin.ping(&vm.ip()),
        "the stand-in reaches the VM on host 1"
    );
    vm.finish();
}

#[test]
fn doctor_reports_sessions_vni_and_remote_macs_and_a_dead_frr_cuts_only_its_host() {
    let mut fabric = Fabric::new(3);
    let guests: Vec<(Guest, String)> = fabric.sites.iter().map(guest_on).collect();
    let (first, _) = &guests[0];
    for (_, ip) in &guests[1..] {
        assert!(
            reaches(first, ip, Duration::from_secs(30)),
            "{}",
            dump(&fabric)
        );
    }
    let (healthy, report) = fabric.sites[0].doctor();
    assert!(healthy, "{report:#}");
    assert_eq!(report["problems"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["vni_known"], true);
    assert!(report["remote_macs"].as_u64().unwrap() >= 2, "{report:#}");
    let sessions = report["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2);
    assert!(
        sessions.iter().all(|s| s["state"] == "Established"),
        "{report:#}"
    );

    // Host 3's FRR dies: its own doctor says so...
    fabric.sites[2].kill_frr();
    let (healthy, report) = fabric.sites[2].doctor();
    assert!(!healthy);
    let problems = report["problems"].to_string();
    assert!(problems.contains("FRR does not answer"), "{report:#}");
    // ...host 1's sees the session with it down...
    let problem = wait_for(
        "host 1 to see host 3's session down",
        Duration::from_secs(20),
        || {
            let (healthy, report) = fabric.sites[0].doctor();
            let problems = report["problems"].to_string();
            (!healthy && problems.contains("192.0.2.13 is")).then_some(problems)
        },
    );
    assert!(problem.contains("is FRR running there"), "{problem}");
    // ...and only host 3's guest is cut off: host 2's is still reached.
    assert!(first.ping(&guests[1].1), "host 2's guest, still");
    assert!(
        !reaches(first, &guests[2].1, Duration::from_secs(3)),
        "host 3's guest is out of the fabric without its FRR"
    );
}

/// What `site`'s VXLAN device's forwarding table says of `mac`: nothing
/// where the network is not up (no VXLAN device).
fn remote_fdb(site: &Site, mac: &str) -> String {
    if !site.world.host.links().iter().any(|l| l == "lx-fabric") {
        return String::new();
    }
    let fdb = must(
        &mut site
            .world
            .host
            .cmd(&["bridge", "fdb", "show", "dev", "lx-fabric"]),
    );
    fdb.lines()
        .filter(|l| l.contains(mac))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_mac_a_vm_on_another_host_holds_is_refused_naming_that_host() {
    const MAC: &str = "02:77:00:00:00:09";
    let fabric = Fabric::new(2);
    let (_holder, _) = guest_of(&fabric.sites[0], "fabric", &["--mac", MAC]);
    // Host 2's network is up, and FRR there has learned the MAC behind
    // host 1's VTEP.
    let (_other, _) = guest_on(&fabric.sites[1]);
    wait_for("host 2 to learn the MAC", Duration::from_secs(30), || {
        remote_fdb(&fabric.sites[1], MAC)
            .contains(&fabric.sites[0].vtep)
            .then_some(())
    });
    let refused = fabric.sites[1]
        .world
        .attach_refused("fabric", &["--mac", MAC]);
    assert!(
        refused.contains(&format!(
            "MAC {MAC} is a VM's on another host (FRR learned it over EVPN behind VTEP {})",
            fabric.sites[0].vtep
        )),
        "{refused}"
    );
    // A positive control: the same attach with a MAC of its own is taken.
    let (_mine, ip) = guest_of(&fabric.sites[1], "fabric", &["--mac", "02:77:00:00:00:0a"]);
    assert!(in_slice(&ip, 2), "{ip}");
}

#[test]
fn an_address_a_vm_on_another_host_holds_is_refused_with_the_reason() {
    const IP: &str = "10.77.0.5";
    let (mac1, mac2) = ("02:77:00:00:00:01", "02:77:00:00:00:02");
    // Each host reserves the same address, for a MAC of its own: a mistake.
    let configs = [(1, mac1), (2, mac2)]
        .iter()
        .map(|(i, mac)| {
            site_config(
                *i,
                2,
                &[FABRIC],
                &format!(", static: [{{ ip: {IP}, mac: \"{mac}\" }}]"),
            )
        })
        .collect();
    let fabric = Fabric::with_configs(configs);
    let (_holder, ip) = guest_of(&fabric.sites[0], "fabric", &["--mac", mac1]);
    assert_eq!(ip, IP);
    // Host 2's network is up, and has learned host 1's VM.
    let (other, _) = guest_on(&fabric.sites[1]);
    assert!(
        reaches(&other, IP, Duration::from_secs(30)),
        "{}",
        dump(&fabric)
    );
    let refused = fabric.sites[1]
        .world
        .attach_refused("fabric", &["--mac", mac2]);
    assert!(
        refused.contains(&format!(
            "{IP} is taken on another host by the VM with MAC {mac1}"
        )),
        "{refused}"
    );
    // Still host 1's VM there.
    assert!(other.ping(IP));
}

/// What crossed the underlay inside VXLAN packets, as counted on its
/// bridge: DHCP (IPv4 UDP to port 67 or 68), IPv6 router solicitations and
/// advertisements; and ICMP and ICMPv6 echoes (the controls: the probe
/// sees inside, at both families' offsets).
struct Crossed {
    dhcp: u64,
    router_discovery: u64,
    icmp: u64,
    icmp6_echo: u64,
}

/// Counters on the underlay bridge of what crosses inside VXLAN packets.
/// The inner headers' offsets, from the outer UDP header: UDP (8) + VXLAN
/// (8) + Ethernet (14), then IPv4's protocol at 9 and (with no options, as
/// DHCP's and ping's have none) UDP's port at 22; IPv6's next header at
/// 6 and ICMPv6's type at 40.
fn count_inner(underlay: &Netns) -> impl Fn() -> Crossed {
    let inner = 8 + 8 + 14;
    let bits = |bytes: u32| bytes * 8;
    let (proto, dport) = (bits(inner + 9), bits(inner + 22));
    let (next, icmp6) = (bits(inner + 6), bits(inner + 40));
    let counts = nft_probe(
        underlay,
        format!(
            "table bridge probe {{\n  chain watch {{\n    type filter hook forward priority 0;\n    \
             udp dport 4789 @th,{proto},8 17 @th,{dport},16 {{ 67, 68 }} counter\n    \
             udp dport 4789 @th,{next},8 58 @th,{icmp6},8 {{ 133, 134 }} counter\n    \
             udp dport 4789 @th,{proto},8 1 counter\n    \
             udp dport 4789 @th,{next},8 58 @th,{icmp6},8 {{ 128, 129 }} counter\n  }}\n}}\n"
        ),
    );
    move || {
        let counts = counts();
        Crossed {
            dhcp: counts[0],
            router_discovery: counts[1],
            icmp: counts[2],
            icmp6_echo: counts[3],
        }
    }
}

#[test]
fn dhcp_and_router_discovery_stay_on_their_host_ipv6_crosses_and_anti_spoofing_holds() {
    // Beside the network across hosts, one of each host's own.
    let local = "  local:\n    mode: shared\n    subnet: 10.79.0.0/24\n";
    let fabric = Fabric::with_configs(
        (1..=2)
            .map(|i| site_config(i, 2, &[FABRIC], "") + local)
            .collect(),
    );
    let counted = count_inner(&fabric.underlay);
    let (a, a_ip) = guest_on(&fabric.sites[0]);
    let (b, b_ip) = guest_on(&fabric.sites[1]);
    assert!(in_slice(&a_ip, 1) && in_slice(&b_ip, 2), "{a_ip} {b_ip}");
    assert!(
        reaches(&a, &b_ip, Duration::from_secs(30)),
        "{}",
        dump(&fabric)
    );
    // Renewals broadcast too: ask again.
    a.udhcpc();
    b.udhcpc();
    // IPv6: one prefix on every host (each with its own machine id),
    // each guest's router its own host; a network of each host's own
    // has a prefix of that host's.
    assert_eq!(
        a.info["ipv6_prefix"], b.info["ipv6_prefix"],
        "one prefix across hosts"
    );
    let prefix_of = |site: &Site| site.world.guest("local", &[]).info["ipv6_prefix"].clone();
    let (local_a, local_b) = (prefix_of(&fabric.sites[0]), prefix_of(&fabric.sites[1]));
    assert!(
        local_a.is_string() && local_b.is_string(),
        "{local_a} {local_b}"
    );
    assert_ne!(local_a, local_b, "from each host's machine id");
    assert_eq!(a.slaac_addresses(), vec![a.ipv6()]);
    assert_eq!(b.slaac_addresses(), vec![b.ipv6()]);
    assert!(
        reaches(&a, &b.ipv6(), Duration::from_secs(10)),
        "VM to VM over IPv6 across hosts"
    );
    let crossed = counted();
    assert!(
        crossed.icmp > 0 && crossed.icmp6_echo > 0,
        "the probe sees inside what crosses, IPv4 and IPv6"
    );
    assert_eq!(crossed.dhcp, 0, "no DHCP crossed the underlay");
    assert_eq!(
        crossed.router_discovery, 0,
        "no router solicitation or advertisement crossed"
    );
    // A guest that sends from an address not its own is stopped at its
    // port; from its own, it passes (above).
    assert!(
        !a.ping_from("10.77.0.201/24", &b_ip),
        "a spoofed source crossed the fabric"
    );
    assert!(a.ping(&b_ip), "its own address still does");
}

#[test]
fn a_port_published_on_the_host_that_runs_the_vm_reaches_it_there() {
    let fabric = Fabric::new(2);
    let (web, _) = guest_of(&fabric.sites[0], "fabric", &["--publish", "8080:80"]);
    let _server = echo_serve(&web.ns, "web", 80);
    let (other, _) = guest_on(&fabric.sites[1]);
    assert!(
        reaches(&other, &web.ip().to_string(), Duration::from_secs(30)),
        "{}",
        dump(&fabric)
    );
    // From host 1's upstream, through host 1's published port.
    let up = &fabric.sites[0].world.upstream;
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 8080, "tcp"),
        Some(format!("web from {UPSTREAM_IP}"))
    );
    // Host 2 runs no such VM and publishes nothing for it.
    let up2 = &fabric.sites[1].world.upstream;
    assert_eq!(echo_ask(up2, UPSTREAM_HOST_SIDE, 8080, "tcp"), None);
}

#[test]
fn a_deleted_or_emptied_fabric_table_is_put_back() {
    let fabric = Fabric::new(2);
    let (_a, _) = guest_on(&fabric.sites[0]);
    let world = &fabric.sites[0].world;
    let nft = |args: &[&str]| {
        let mut argv = vec!["nft"];
        argv.extend_from_slice(args);
        run(&mut world.host.cmd(&argv))
    };
    let forward_rules = || {
        let out = nft(&["list", "chain", "bridge", "linnet_fabric", "fabric_forward"]);
        String::from_utf8_lossy(&out.stdout).matches("drop").count()
    };
    assert_eq!(forward_rules(), 5, "made with the network");
    assert!(
        nft(&["delete", "table", "bridge", "linnet_fabric"])
            .status
            .success()
    );
    wait_for("the fabric table back", Duration::from_secs(10), || {
        (forward_rules() == 5).then_some(())
    });
    assert!(
        world
            .daemon_log_text()
            .contains("linnet's table bridge linnet_fabric is gone")
    );
    // Rebuilt, it lists as linnet counts it: lost rules are seen too (a
    // table that listed otherwise would from then on be put back only
    // when gone).
    assert!(
        nft(&[
            "flush",
            "chain",
            "bridge",
            "linnet_fabric",
            "fabric_forward"
        ])
        .status
        .success()
    );
    wait_for(
        "the fabric table's rules back",
        Duration::from_secs(10),
        || (forward_rules() == 5).then_some(()),
    );
    let log = world.daemon_log_text();
    assert!(
        log.contains("linnet's table bridge linnet_fabric lost rules"),
        "{log}"
    );
    assert!(
        !log.contains("lists otherwise than linnet made it"),
        "{log}"
    );
}
