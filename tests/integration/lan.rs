//! Networks on a LAN: `mode: bridged` (a macvtap per VM on a host NIC) and
//! `mode: bridge` (TAPs on a bridge the test made), both on one "LAN": a
//! namespace with its own DHCP server (dnsmasq) and web server on a bridge,
//! joined to the host namespace by two veths, one the bridged network's
//! uplink, the other a port of the test's bridge.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde_json::Value;

use crate::guard::link_local;
use crate::harness::*;

const LAN_ROUTER: &str = "10.77.0.1";
const LAN_PAGE: &str = "hello from the LAN";
const UPLINK: &str = "lanup";
const BRIDGE: &str = "brlan";

const CONFIG: &str = "networks:
  lan:
    mode: bridged
    uplink: lanup
  br:
    mode: bridge
    bridge: brlan
";

/// The LAN namespace with its servers (they go with it), and the host's
/// side of it.
struct Lan {
    /// Its DHCP server, stopped before its namespace goes.
    dhcp: Helper,
    ns: Netns,
}

impl Lan {
    fn new(world: &World) -> Lan {
        let ns = Netns::new("lan");
        let host = &world.host;
        for (host_side, lan_side) in [(UPLINK, "eth0"), ("lanport", "eth1")] {
            must(&mut host.cmd(&[
                "ip", "link", "add", host_side, "type", "veth", "peer", "name", lan_side, "netns",
                &ns.name,
            ]));
        }
        for argv in [
            &["ip", "link", "add", "br0", "type", "bridge"][..],
            &["ip", "link", "set", "eth0", "master", "br0", "up"],
            &["ip", "link", "set", "eth1", "master", "br0", "up"],
            &["ip", "addr", "add", "10.77.0.1/24", "dev", "br0"],
            &["ip", "link", "set", "br0", "up"],
        ] {
            must(&mut ns.cmd(argv));
        }
        for argv in [
            &["ip", "link", "set", UPLINK, "up"][..],
            &["ip", "link", "add", BRIDGE, "type", "bridge"],
            &["ip", "link", "set", "lanport", "master", BRIDGE, "up"],
            &["ip", "link", "set", BRIDGE, "up"],
        ] {
            must(&mut host.cmd(argv));
        }
        let www = world.dir.path().join("lan-www");
        std::fs::create_dir_all(&www).unwrap();
        std::fs::write(www.join("index.html"), format!("{LAN_PAGE}\n")).unwrap();
        must(&mut ns.cmd(&[
            "busybox",
            "httpd",
            "-p",
            &format!("{LAN_ROUTER}:80"),
            "-h",
            www.to_str().unwrap(),
        ]));
        let log = world.dir.path().join("lan-dnsmasq.log");
        let leases = world.dir.path().join("lan.leases");
        let leases = format!("--dhcp-leasefile={}", leases.display());
        let dhcp = serve_dnsmasq(
            &ns,
            "the LAN's DHCP server (dnsmasq)",
            &[
                "dnsmasq",
                "--no-resolv",
                "--no-hosts",
                "--port=0",
                "--interface=br0",
                "--bind-interfaces",
                "--user=root",
                "--dhcp-range=10.77.0.100,10.77.0.150,12h",
                &format!("--dhcp-option=option:router,{LAN_ROUTER}"),
                &leases,
            ],
            &log,
        );
        Lan { dhcp, ns }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        // A DHCP server that died would pass the checks that a VM gets
        // no lease from the LAN.
        if !std::thread::panicking() {
            self.dhcp.assert_running("the end of the test");
        }
    }
}

/// A macvtap's VM is limited at the macvtap's own hooks: what it sends at
/// egress, what reaches it at ingress; beside a VM without a limit on the
/// same LAN.
#[test]
fn a_macvtap_vm_holds_to_its_rate_each_way() {
    use crate::rate_limits::{holds, iperf_server, mbits};
    let mut world = World::with_config(CONFIG);
    let lan = Lan::new(&world);
    world.start_daemon();
    let limited = world.guest(
        "lan",
        &["--rate-limit-out", "20mbit", "--rate-limit-in", "40mbit"],
    );
    let open = world.guest("lan", &[]);
    assert!(in_lan_pool(limited.udhcpc()) && in_lan_pool(open.udhcpc()));
    let _server = iperf_server(&lan.ns, 5305);
    let control = mbits(&open.ns, LAN_ROUTER, 5305, false);
    assert!(control > 200.0, "an unlimited VM: {control} Mbit/s");
    let out = mbits(&limited.ns, LAN_ROUTER, 5305, false);
    assert!(holds(out, 20.0), "what the VM sends: {out} Mbit/s");
    let into = mbits(&limited.ns, LAN_ROUTER, 5305, true);
    assert!(holds(into, 40.0), "what it receives: {into} Mbit/s");
}

fn in_lan_pool(ip: Ipv4Addr) -> bool {
    ip.octets()[..3] == [10, 77, 0] && (100..=150).contains(&ip.octets()[3])
}

/// The bridge's settings and addresses as `ip` shows them, without its
/// timers and address states: what linnet must leave as it found it.
fn bridge_as_made(world: &World) -> String {
    let link = must(&mut world.host.cmd(&["ip", "-d", "-o", "link", "show", BRIDGE]));
    let addr = must(&mut world.host.cmd(&["ip", "-o", "addr", "show", "dev", BRIDGE]));
    let mut kept = Vec::new();
    let mut words = link.split_whitespace().chain(addr.split_whitespace());
    while let Some(word) = words.next() {
        if word.ends_with("_timer") {
            words.next();
        } else if word != "tentative" {
            kept.push(word);
        }
    }
    kept.join(" ")
}

fn listed(world: &World) -> Value {
    serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).unwrap()
}

fn listed_ip(world: &World, g: &Guest) -> Option<String> {
    let ls = listed(world);
    ls["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["interface_id"] == g.info["interface_id"])
        .and_then(|i| i["ip_address"].as_str().map(String::from))
}

#[test]
fn guests_on_bridged_and_bridge_lease_from_the_lan_reach_it_and_each_other() {
    let mut world = World::with_config(CONFIG);
    let lan = Lan::new(&world);
    let before = bridge_as_made(&world);
    world.start_daemon();
    let mut mv = world.guest("lan", &["--name", "mv"]);
    let mut tp = world.guest("br", &["--name", "tp", "--wait-ip", "30"]);
    assert!(mv.tap().starts_with("lnv"), "a macvtap: {}", mv.info);
    assert_eq!(mv.info["mode"], "bridged");
    assert!(
        mv.info.get("ip_address").is_none() && mv.info.get("gateway").is_none(),
        "the LAN's addresses are not known at attach: {}",
        mv.info
    );
    let links = must(
        &mut world
            .host
            .cmd(&["ip", "-d", "-o", "link", "show", &mv.tap()]),
    );
    assert!(
        links.contains(&format!("@{UPLINK}"))
            && links.contains("macvtap mode bridge")
            && links.contains(&mv.mac()),
        "the VM's MAC is the macvtap's, on the uplink: {links}"
    );

    let ip_mv = mv.udhcpc();
    let ip_tp = tp.udhcpc();
    assert!(in_lan_pool(ip_mv) && in_lan_pool(ip_tp), "{ip_mv} {ip_tp}");
    assert_ne!(ip_mv, ip_tp);

    // linnet saw the LAN's server give them.
    for (g, ip) in [(&mv, ip_mv), (&tp, ip_tp)] {
        wait_for("the learned address in ls", Duration::from_secs(5), || {
            (listed_ip(&world, g) == Some(ip.to_string())).then_some(())
        });
    }
    let ls = listed(&world);
    let lan_net = ls["networks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "lan")
        .unwrap();
    assert_eq!(lan_net["lan"], UPLINK, "{lan_net}");
    let table = must(&mut world.linnet(&["ls"]));
    assert!(
        table.contains(&ip_mv.to_string()) && table.contains("LAN of lanup"),
        "{table}"
    );
    // --wait-ip wrote the JSON again, with the address.
    let json = world.dir.path().join(format!("{}.json", tp.ns.name));
    let again: Value = wait_for("--wait-ip's JSON", Duration::from_secs(10), || {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).ok()?).ok()?;
        v.get("ip_address").is_some().then_some(v)
    });
    assert_eq!(again["ip_address"], ip_tp.to_string());

    for g in [&mv, &tp] {
        assert_eq!(
            g.fetch(&format!("http://{LAN_ROUTER}/")).as_deref(),
            Some(format!("{LAN_PAGE}\n").as_str()),
            "{} reaches the LAN's web server",
            g.tap()
        );
    }
    assert!(mv.ping(&ip_tp.to_string()), "macvtap VM to bridge VM");
    assert!(tp.ping(&ip_mv.to_string()), "bridge VM to macvtap VM");

    let (mv_tap, tp_tap) = (mv.tap(), tp.tap());
    mv.stop();
    tp.stop();
    wait_for("the ports to go", Duration::from_secs(5), || {
        let links = world.host.links();
        (!links.contains(&mv_tap) && !links.contains(&tp_tap)).then_some(())
    });
    assert_eq!(
        bridge_as_made(&world),
        before,
        "the bridge is as the test made it"
    );
    world.stop_daemon();
    let links = world.host.links();
    assert!(
        links.contains(&BRIDGE.to_string()) && links.contains(&UPLINK.to_string()),
        "linnet deleted what it did not make: {links:?}"
    );
    assert!(!world.host.nft_ruleset().contains("linnet"));
    drop(lan);
}

/// Sends `kinds` with spoof.py from `attacker` (whose LAN address is
/// `ip`) while `victim` captures: the markers that arrived.
fn spoof(
    attacker: &Guest,
    ip: Ipv4Addr,
    victim: &Guest,
    victim_ip: Ipv4Addr,
    kinds: &[&str],
) -> Vec<String> {
    let script = repo_file("tests/spoof.py");
    let capture = Capture::start(&victim.ns, "eth0", 3);
    let keys = [
        format!("mac={}", attacker.mac()),
        format!("ip={ip}"),
        format!("ll={}", link_local(attacker)),
        format!("gw={LAN_ROUTER}"),
        format!("other_ip={victim_ip}"),
        format!("other_mac={}", victim.mac()),
    ];
    for kind in kinds {
        let mut argv = vec!["python3", script.as_str(), "send", "eth0", kind];
        argv.extend(keys.iter().map(String::as_str));
        must(&mut attacker.ns.cmd(&argv));
    }
    capture.finish()
}

#[test]
fn anti_spoofing_holds_on_macvtaps_and_on_a_bridge_linnet_does_not_own() {
    let mut world = World::with_config(CONFIG);
    let _lan = Lan::new(&world);
    world.start_daemon();
    let mv = world.guest("lan", &[]);
    let tp = world.guest("br", &[]);
    // Before the LAN's DHCP server gave it an address, a VM sends nothing
    // but DHCP: not even from an address it chose itself.
    for g in [&mv, &tp] {
        must(
            &mut g
                .ns
                .cmd(&["ip", "addr", "add", "10.77.0.201/24", "dev", "eth0"]),
        );
        assert!(
            !g.ping(LAN_ROUTER),
            "{}: a self-chosen address passes",
            g.tap()
        );
        must(&mut g.ns.cmd(&["ip", "-4", "addr", "flush", "dev", "eth0"]));
    }
    let (ip_mv, ip_tp) = (mv.udhcpc(), tp.udhcpc());
    assert!(
        mv.ping(LAN_ROUTER) && tp.ping(LAN_ROUTER),
        "leased: they pass"
    );
    let kinds = [
        "honest",
        "other-mac",
        "other-ip",
        "garp-gateway",
        "arp-reply-other",
        "arp-probe-other",
        "dhcp-offer",
        "dhcp-offer-port",
        "dhcp-other-mac",
        "ra",
        "vlan",
        "qinq",
    ];
    for (attacker, ip, victim, victim_ip) in [(&mv, ip_mv, &tp, ip_tp), (&tp, ip_tp, &mv, ip_mv)] {
        assert_eq!(
            spoof(attacker, ip, victim, victim_ip, &kinds),
            ["LINNET-honest"],
            "from {} only the honest frame arrives",
            attacker.tap()
        );
        let ls = listed(&world);
        let me = ls["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["interface_id"] == attacker.info["interface_id"])
            .unwrap()
            .clone();
        assert!(
            me["spoofed_drops"].as_u64().unwrap() >= (kinds.len() - 1) as u64,
            "counted: {me}"
        );
    }
}

#[test]
fn host_access_lets_the_host_reach_its_macvtap_vms_and_doctor_says_why_it_is_needed() {
    let mut world = World::with_config(
        "networks:
  lan:
    mode: bridged
    uplink: lanup
  lan2:
    mode: bridged
    uplink: lanup
    host_access: true
",
    );
    let _lan = Lan::new(&world);
    // The host's own address on the LAN, on its NIC.
    must(
        &mut world
            .host
            .cmd(&["ip", "addr", "add", "10.77.0.2/24", "dev", UPLINK]),
    );
    world.start_daemon();
    let doctor = must(&mut world.linnet(&["doctor"]));
    assert!(
        doctor.contains("this host cannot reach the network's VMs")
            && doctor.contains("networks.lan.host_access: true")
            && !doctor.contains("networks.lan2.host_access"),
        "{doctor}"
    );
    let mut plain = world.guest("lan", &[]);
    let mut reachable = world.guest("lan2", &[]);
    assert!(world.host.links().contains(&"lh-lan2".to_string()));
    let (ip_plain, ip_reachable) = (plain.udhcpc(), reachable.udhcpc());
    let host_pings = |ip: Ipv4Addr| {
        run(&mut world
            .host
            .cmd(&["busybox", "ping", "-c", "1", "-W", "2", &ip.to_string()]))
        .status
        .success()
    };
    wait_for(
        "the host to reach its VM through lh-lan2",
        Duration::from_secs(10),
        || host_pings(ip_reachable).then_some(()),
    );
    assert!(
        !host_pings(ip_plain),
        "a macvtap's frames never come back up the uplink"
    );
    assert!(
        plain.ping(&ip_reachable.to_string()),
        "the VMs reach each other"
    );

    let route = |ip: Ipv4Addr| {
        must(
            &mut world
                .host
                .cmd(&["ip", "route", "show", &format!("{ip}/32")]),
        )
    };
    assert!(
        route(ip_reachable).contains("dev lh-lan2"),
        "{}",
        route(ip_reachable)
    );
    reachable.stop();
    wait_for(
        "the VM's route to go with it",
        Duration::from_secs(5),
        || route(ip_reachable).trim().is_empty().then_some(()),
    );
    plain.stop();
    world.stop_daemon();
    let links = world.host.links();
    assert!(
        !links
            .iter()
            .any(|l| l.starts_with("lh-") || l.starts_with("lnv")),
        "{links:?}"
    );
    assert!(links.contains(&UPLINK.to_string()));
}

#[test]
fn a_qemu_guest_on_a_macvtap_leases_from_the_lan_and_reaches_its_web_server() {
    let mut world = World::with_config(CONFIG);
    let _lan = Lan::new(&world);
    world.start_daemon();
    let vm = crate::qemu::Vm::start(
        &world,
        "lan",
        &format!("wget -q -O - http://{LAN_ROUTER}/ | sed 's/^/RESULT-PAGE: /'\n"),
        &[],
    );
    assert!(
        vm.info["tap"].as_str().unwrap().starts_with("lnv"),
        "{}",
        vm.info
    );
    let console = vm.finish();
    let ip: Ipv4Addr = console
        .lines()
        .find_map(|l| l.trim().strip_prefix("linnet-guest: lease ip="))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("no lease on the console:\n{console}"));
    assert!(in_lan_pool(ip), "the LAN's DHCP server gave {ip}");
    assert!(
        console.contains(&format!("RESULT-PAGE: {LAN_PAGE}")),
        "{console}"
    );
    let log = world.daemon_log_text();
    assert!(
        log.contains("learned the VM's address") && log.contains(&format!("ip={ip}")),
        "{log}"
    );
}

#[test]
fn what_needs_linnets_own_network_is_refused_on_a_lan_with_the_reason() {
    let mut world = World::with_config(CONFIG);
    let _lan = Lan::new(&world);
    world.start_daemon();
    let refused = |world: &World, args: &[&str]| {
        let mut argv = vec!["run"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["--", "true"]);
        failure(&mut world.linnet(&argv))
    };
    let err = refused(&world, &["--network", "lan", "-p", "8080:80"]);
    assert!(
        err.contains("network \"lan\" is on a LAN") && err.contains("published"),
        "{err}"
    );
    let err = refused(
        &world,
        &["--network", "br", "--allow-connect", "10.0.0.0/8"],
    );
    assert!(err.contains("policies are not enforced yet"), "{err}");
    let err = refused(&world, &["--network", "lan", "--mac", "00:11:22:33:44:55"]);
    assert!(err.contains("locally administered"), "{err}");
    let err = refused(&world, &["--network", "lan", "--datapath", "tap-name"]);
    assert!(
        err.contains("opened through their fd, not by name"),
        "{err}"
    );
    for network in ["lan", "br"] {
        let err = refused(&world, &["--network", network, "--clone-of", "web"]);
        assert!(
            err.contains("clones are for linnet's own networks"),
            "{err}"
        );
    }
    let links = world.host.links();
    assert!(
        !links
            .iter()
            .any(|l| l.starts_with("lnv") || l.starts_with("lnt")),
        "{links:?}"
    );
    // A bridge that is not there, or not a bridge.
    std::fs::write(
        world.config.as_ref().unwrap(),
        "networks:\n  gone:\n    mode: bridge\n    bridge: nosuchbr\n  veth:\n    mode: bridge\n    bridge: lanup\n",
    )
    .unwrap();
    world.stop_daemon();
    world.start_daemon();
    let err = refused(&world, &["--network", "gone"]);
    assert!(err.contains("there is no bridge nosuchbr"), "{err}");
    let err = refused(&world, &["--network", "veth"]);
    assert!(
        err.contains("lanup is not a bridge") && err.contains("mode: bridged"),
        "{err}"
    );
}

#[test]
fn a_vmm_that_changes_its_macvtaps_mac_is_cut_off() {
    let mut world = World::with_config(CONFIG);
    let lan = Lan::new(&world);
    world.start_daemon();
    let events = crate::events::Follower::start(&world, &["--network", "lan"]);
    let honest = world.guest("lan", &[]);
    let ip = honest.udhcpc();
    let learned = events.next("learned");
    assert_eq!(
        (&learned["interface_id"], &learned["ip_address"]),
        (&honest.info["interface_id"], &Value::from(ip.to_string())),
        "the address the LAN's server gave, as an event"
    );
    // The LAN router's MAC: frames for it that the uplink sees (flooded)
    // would go to a macvtap that took it.
    let router_mac = must(&mut lan.ns.cmd(&["cat", "/sys/class/net/br0/address"]));
    let json = world.dir.path().join("thief.json");
    let mut run = world.linnet(&["run", "--network", "lan", "--json", json.to_str().unwrap()]);
    let script = repo_file("tests/hostile_vmm.py");
    run.args([
        "--",
        "python3",
        &script,
        "set-mac",
        "{fd}",
        router_mac.trim(),
    ]);
    let (_thief, said) = spawn_until_first_line(run);
    assert_eq!(said, "set", "a macvtap's fd allows SIOCSIFHWADDR too");
    let info: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let why = wait_for("the macvtap to be cut off", Duration::from_secs(5), || {
        let ls = listed(&world);
        ls["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["interface_id"] == info["interface_id"])
            .and_then(|i| i["cut_off"].as_str().map(String::from))
    });
    assert!(why.contains("changed the TAP's MAC"), "{why}");
    let cut = events.next("cut_off");
    assert_eq!(cut["interface_id"], info["interface_id"]);
    assert_eq!(cut["reason"].as_str(), Some(why.as_str()));
    let tap = info["tap"].as_str().unwrap();
    let link = must(&mut world.host.cmd(&["ip", "-o", "link", "show", tap]));
    assert!(!link.contains(",UP"), "{link}");
    assert_eq!(
        honest.fetch(&format!("http://{LAN_ROUTER}/")).as_deref(),
        Some(format!("{LAN_PAGE}\n").as_str()),
        "the honest VM still reaches the router"
    );
}

#[test]
fn while_the_guard_cannot_be_put_back_guarded_macvtaps_forward_nothing() {
    let mut world = World::with_config(CONFIG);
    let _lan = Lan::new(&world);
    world.start_daemon();
    let g = world.guest("lan", &[]);
    g.udhcpc();
    assert!(g.ping(LAN_ROUTER));
    let up = |world: &World| {
        must(&mut world.host.cmd(&["ip", "-o", "link", "show", &g.tap()])).contains(",UP")
    };
    assert!(up(&world));
    // Someone flushes the ruleset and takes the macvtaps' table name with a
    // table only its own nft process may change, so linnet cannot put the
    // guard back while that process lives.
    let mut squatter = Reaped(
        world
            .host
            .cmd(&["nft", "-i"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    {
        use std::io::Write;
        let stdin = squatter.stdin.as_mut().unwrap();
        stdin
            .write_all(b"flush ruleset\nadd table netdev linnet { flags owner; }\n")
            .unwrap();
        stdin.flush().unwrap();
    }
    wait_for("the macvtap held down", Duration::from_secs(3), || {
        (!up(&world)).then_some(())
    });
    assert!(!g.ping(LAN_ROUTER), "no frame in or out while unguarded");
    let _ = squatter.kill();
    let _ = squatter.wait();
    wait_for("the macvtap back up", Duration::from_secs(10), || {
        up(&world).then_some(())
    });
    let macs = must(
        &mut world
            .host
            .cmd(&["nft", "list", "set", "netdev", "linnet", "macs"]),
    );
    assert!(
        macs.contains(&g.mac()),
        "the guard holds the guest again: {macs}"
    );
    wait_for(
        "the guest to reach the router again",
        Duration::from_secs(10),
        || g.ping(LAN_ROUTER).then_some(()),
    );
}

#[test]
fn a_vm_on_a_bridged_networks_socket_gets_a_macvtap_and_leases_from_the_lan() {
    let mut world = World::with_config(
        "networks:\n  lan:\n    mode: bridged\n    uplink: lanup\n    socket: true\n",
    );
    let _lan = Lan::new(&world);
    world.start_daemon();
    let socket = world.run_dir().join("lan.sock");
    let ns = Netns::new("guest");
    let log = world.dir.path().join(format!("{}.vmm", ns.name));
    let mac = "52:54:00:7a:00:01";
    let guest = Guest::on_socket(
        ns,
        "--stream-socket",
        socket.to_str().unwrap(),
        serde_json::json!({ "mac_address": mac, "mtu": 1500 }),
        &log,
    );
    // Attached on its first frame, with its own MAC, on a macvtap.
    let listed_mac = wait_for(
        "the interface on lan's socket",
        Duration::from_secs(10),
        || {
            listed(&world)["interfaces"]
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["mac_address"] == mac)
                .cloned()
        },
    );
    assert!(
        listed_mac["tap"].as_str().unwrap().starts_with("lnv"),
        "{listed_mac}"
    );
    assert_eq!(listed_mac["datapath"], "stream");
    let ip = guest.udhcpc();
    assert!(in_lan_pool(ip), "{ip}");
    assert_eq!(
        guest.fetch(&format!("http://{LAN_ROUTER}/")).as_deref(),
        Some(format!("{LAN_PAGE}\n").as_str())
    );
}

/// A DHCPACK for `mac` giving `yiaddr`, sent by a local user (nobody) from
/// an unprivileged port to `to`:68, as any user on the host could.
fn forged_ack_from_a_local_user(world: &World, to: Ipv4Addr, mac: &str, yiaddr: &str) {
    ack_from_port(world, AS_NOBODY, 6868, to, mac, yiaddr);
}

/// The same DHCPACK sent by root from port 67, as a DHCP server on the
/// host would.
fn ack_from_a_server_on_the_host(world: &World, to: Ipv4Addr, mac: &str, yiaddr: &str) {
    ack_from_port(world, &[], 67, to, mac, yiaddr);
}

/// A DHCPACK for `mac` giving `yiaddr` (mask /24), from UDP port `port` to
/// `to`:68, sent through `wrapper` in the host namespace.
fn ack_from_port(
    world: &World,
    wrapper: &[&str],
    port: u16,
    to: Ipv4Addr,
    mac: &str,
    yiaddr: &str,
) {
    let script = "import socket, struct, sys\n\
                  to, mac, yi, port = sys.argv[1], bytes.fromhex(sys.argv[2].replace(':', '')), sys.argv[3], int(sys.argv[4])\n\
                  bootp = struct.pack('!BBBBIHH4s4s4s4s16s64s128s', 2, 1, 6, 0, 7, 0, 0, bytes(4),\n\
                      socket.inet_aton(yi), bytes(4), bytes(4), mac.ljust(16, b'\\0'), b'', b'')\n\
                  opts = bytes([99, 130, 83, 99, 53, 1, 5, 1, 4, 255, 255, 255, 0, 255])\n\
                  s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                  s.bind(('', port))\n\
                  s.sendto(bootp + opts, (to, 68))\n";
    let mut argv: Vec<&str> = wrapper.to_vec();
    let (to, port) = (to.to_string(), port.to_string());
    argv.extend(["/usr/bin/python3", "-c", script, &to, mac, yiaddr, &port]);
    must(&mut world.host.cmd(&argv));
}

#[test]
fn a_dhcp_ack_forged_by_a_local_user_teaches_linnet_nothing() {
    let mut world = World::with_config(CONFIG);
    let _lan = Lan::new(&world);
    // The host on the bridge's LAN, so that its users reach the VM.
    must(
        &mut world
            .host
            .cmd(&["ip", "addr", "add", "10.77.0.3/24", "dev", BRIDGE]),
    );
    world.start_daemon();
    let tp = world.guest("br", &[]);
    let ip = tp.udhcpc();
    wait_for("the learned address", Duration::from_secs(5), || {
        (listed_ip(&world, &tp) == Some(ip.to_string())).then_some(())
    });
    forged_ack_from_a_local_user(&world, ip, &tp.mac(), LAN_ROUTER);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        listed_ip(&world, &tp),
        Some(ip.to_string()),
        "the VM keeps the address the LAN's server gave it"
    );
    // The same ACK from port 67, which only root may send from, is
    // believed: the forged one took the same way to the VM's port past
    // linnet's snooping, and was refused for its port alone. Snooping reads
    // frames in order, so once this one is learned the forged one was read.
    let believed = "10.77.0.42";
    ack_from_a_server_on_the_host(&world, ip, &tp.mac(), believed);
    wait_for(
        "the ACK from port 67 learned",
        Duration::from_secs(5),
        || (listed_ip(&world, &tp).as_deref() == Some(believed)).then_some(()),
    );
    let log = world.daemon_log_text();
    assert!(log.contains(&format!("ip={believed} ")), "{log}");
    assert!(!log.contains(&format!("ip={LAN_ROUTER} ")), "{log}");
}
