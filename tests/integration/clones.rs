//! Clones (`--clone-of`, `--like`): many guests with one MAC and address,
//! as VMs restored from one snapshot wake up, each reached at a unique
//! address of its own.

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

/// Sets up a guest as its snapshot left it: the address it had, the
/// network's gateway as its default route, no DHCP client.
pub(crate) fn restore(guest: &Guest, ip: Ipv4Addr, gateway: &str) {
    must(&mut guest.ns.cmd(&["ip", "link", "set", "eth0", "up"]));
    must(
        &mut guest
            .ns
            .cmd(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"]),
    );
    must(
        &mut guest
            .ns
            .cmd(&["ip", "route", "add", "default", "via", gateway]),
    );
    guest
        .ns
        .set_resolv_conf(&format!("nameserver {gateway}\nsearch shared.linnet\n"));
}

fn clone_address(guest: &Guest) -> String {
    guest.info["clone_address"]
        .as_str()
        .expect("a clone's attach JSON has clone_address")
        .to_string()
}

/// The interfaces `linnet ls --json` lists.
fn listed(world: &World) -> Vec<Value> {
    let out = must(&mut world.linnet(&["ls", "--json"]));
    let doc: Value = serde_json::from_str(&out).unwrap();
    doc["interfaces"].as_array().unwrap().clone()
}

#[test]
fn ten_clones_of_one_guest_share_its_address_and_each_is_reached_at_its_own() {
    let mut world = World::new();
    world.start_daemon();
    // The VM that was snapshotted: it leased its address, then stopped.
    let mut original = world.guest("shared", &["--name", "web"]);
    let (ip, mac, gateway) = (original.udhcpc(), original.mac(), original.gateway());
    original.stop();

    let clones: Vec<Guest> = (0..10)
        .map(|n| {
            world.guest(
                "shared",
                &["--clone-of", "web", "--name", &format!("web-{n}")],
            )
        })
        .collect();
    let mut uniques = Vec::new();
    for (n, clone) in clones.iter().enumerate() {
        assert_eq!(clone.ip(), ip, "clone {n} has the guest's address");
        assert_eq!(clone.mac(), mac, "clone {n} has the guest's MAC");
        restore(clone, ip, &gateway);
        uniques.push(clone_address(clone));
    }
    let mut distinct = uniques.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        10,
        "each clone its own address: {uniques:?}"
    );

    // Each reaches the gateway, upstream and the host, all at once.
    let gw = gateway.as_str();
    std::thread::scope(|s| {
        for (n, clone) in clones.iter().enumerate() {
            s.spawn(move || {
                assert!(clone.ping(gw), "clone {n} pings the gateway");
                clone.assert_reaches_upstream(&format!("clone {n}"));
            });
        }
    });
    // The host reaches each at its own address; `ls` shows both.
    let listing = listed(&world);
    for (n, unique) in uniques.iter().enumerate() {
        let ping = run(&mut world
            .host
            .cmd(&["busybox", "ping", "-c", "1", "-W", "2", unique]));
        assert!(
            ping.status.success(),
            "the host pings clone {n} at {unique}"
        );
        let row = listing
            .iter()
            .find(|i| i["name"] == format!("web-{n}"))
            .expect("ls lists the clone");
        assert_eq!(row["ip_address"], ip.to_string());
        assert_eq!(row["clone_address"], unique.as_str());
    }
    // Clones reach each other at their own addresses: the first (which
    // carries on as the stopped VM) and the others alike.
    for (from, to) in [(0, 1), (1, 0), (2, 3)] {
        assert!(
            clones[from].ping(&uniques[to]),
            "clone {from} pings clone {to}"
        );
    }
    // An ordinary VM reaches each clone by name, at its unique address.
    let other = world.guest("shared", &["--name", "other"]);
    other.udhcpc();
    for (n, unique) in uniques.iter().enumerate() {
        let name = format!("web-{n}.shared.linnet");
        assert_eq!(
            other.lookup(&name, &gateway).as_deref(),
            Some(unique.as_str()),
            "{name}"
        );
        assert!(other.ping(unique), "another VM pings clone {n}");
    }
    drop(clones);
}

#[test]
fn detaching_every_clone_leaves_no_namespace_link_rule_or_lease() {
    let mut world = World::new();
    world.start_daemon();
    let before_links = world.host.links();
    let mut original = world.guest("shared", &["--name", "db"]);
    let ip = original.udhcpc();
    let gateway = original.gateway();
    let mut clones: Vec<Guest> = (0..3)
        .map(|n| {
            world.guest(
                "shared",
                &["--clone-of", "db", "--name", &format!("db-{n}")],
            )
        })
        .collect();
    for clone in &clones {
        restore(clone, ip, &gateway);
        assert!(clone.ping(&gateway));
    }
    let daemon = world.daemon_pid();
    let namespaces_held = || {
        std::fs::read_dir(format!("/proc/{daemon}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("net:["))
            .count()
    };
    assert_eq!(
        namespaces_held(),
        3,
        "the daemon holds each clone's namespace"
    );
    for clone in &mut clones {
        clone.stop();
    }
    original.stop();
    wait_for("the clones to go", Duration::from_secs(10), || {
        (listed(&world).is_empty() && namespaces_held() == 0).then_some(())
    });
    let links: Vec<String> = world
        .host
        .links()
        .into_iter()
        .filter(|l| !before_links.contains(l))
        .collect();
    assert!(links.is_empty(), "links left: {links:?}");
    let rules = world.host.nft_ruleset();
    assert!(!rules.contains("lnc"), "guard entries left:\n{rules}");
    assert!(!rules.contains("198.18."), "clone NAT left:\n{rules}");
    let leases =
        std::fs::read_to_string(world.state_dir().join("leases/shared.json")).unwrap_or_default();
    assert_eq!(
        leases.matches("\"ip\"").count(),
        1,
        "only the original's lease, no clone's:\n{leases}"
    );
}

/// Clones of `name` on `shared` (stopped once they are made), each set up
/// as its snapshot left it; `extra[n]` are clone n's own arguments.
fn clones_of(world: &World, name: &str, extra: &[&[&str]]) -> (Vec<Guest>, Ipv4Addr, String) {
    let mut original = world.guest("shared", &["--name", name]);
    let (ip, gateway) = (original.udhcpc(), original.gateway());
    original.stop();
    let clones: Vec<Guest> = extra
        .iter()
        .map(|args| {
            let mut argv = vec!["--clone-of", name];
            argv.extend_from_slice(args);
            let clone = world.guest("shared", &argv);
            restore(&clone, ip, &gateway);
            clone
        })
        .collect();
    (clones, ip, gateway)
}

#[test]
fn each_clones_published_port_answers_from_that_clone() {
    let mut world = World::new();
    world.start_daemon();
    let (clones, _, gateway) = clones_of(
        &world,
        "api",
        &[
            &["--name", "api-a", "--publish", "8081:80"],
            &["--name", "api-b", "-p", "8082:80", "-p", "5301:80/udp"],
        ],
    );
    let _servers = [
        echo_serve(&clones[0].ns, "a", 80),
        echo_serve(&clones[1].ns, "b", 80),
    ];
    let (up, host) = (&world.upstream, &world.host);
    // From outside the guest sees the real client; from the host's
    // 127.0.0.1, the gateway.
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 8081, "tcp"),
        Some(format!("a from {UPSTREAM_IP}"))
    );
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 8082, "tcp"),
        Some(format!("b from {UPSTREAM_IP}"))
    );
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 5301, "udp"),
        Some(format!("b from {UPSTREAM_IP}"))
    );
    assert_eq!(
        echo_ask(host, "127.0.0.1", 8081, "tcp"),
        Some(format!("a from {gateway}"))
    );
    // A forward added at runtime, to a clone by name.
    must(&mut world.linnet(&["forward", "add", "--name", "api-a", "9091:80"]));
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 9091, "tcp"),
        Some(format!("a from {UPSTREAM_IP}"))
    );
    // A clone publishing a port reaches another clone's published port
    // (hairpin through the host).
    assert_eq!(
        echo_ask(&clones[0].ns, UPSTREAM_HOST_SIDE, 8082, "tcp").map(|a| a.starts_with("b from")),
        Some(true)
    );
}

/// A UDP listener on the host that prints the source of each datagram.
fn sources_seen(
    world: &World,
    port: u16,
) -> (Reaped, std::io::BufReader<std::process::ChildStdout>) {
    let code = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('0.0.0.0', {port}))\n\
         s.settimeout(3)\n\
         print('ready', flush=True)\n\
         try:\n    while True:\n        print(s.recvfrom(64)[1][0], flush=True)\n\
         except socket.timeout:\n    pass\n"
    );
    let (child, ready, out) = spawn_reading(world.host.cmd(&["python3", "-c", &code]));
    assert_eq!(ready, "ready");
    (child, out)
}

/// Sends a datagram from `src` (an address the guest gives itself) to
/// `dst:port`.
fn send_from(guest: &Guest, src: &str, dst: &str, port: u16) {
    let code = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('{src}', 0))\n\
         s.sendto(b'x', ('{dst}', {port}))\n"
    );
    must(&mut guest.ns.cmd(&["python3", "-c", &code]));
}

#[test]
fn a_clone_sends_only_as_its_own_address_however_it_tries() {
    let mut world = World::new();
    world.start_daemon();
    // The first clone carries on as the stopped VM (it sends as the
    // guest's address); the second is NATed to its own.
    let (clones, ip, gateway) = clones_of(&world, "job", &[&[], &[]]);
    let other = world.guest("shared", &["--name", "bystander"]);
    let other_ip = other.udhcpc().to_string();
    let (a, b) = (clone_address(&clones[0]), clone_address(&clones[1]));
    let cases = [
        (
            &clones[0],
            ip.to_string(),
            [b.as_str(), &other_ip, "192.168.105.200"],
        ),
        (
            &clones[1],
            b.clone(),
            [a.as_str(), &other_ip, "192.168.105.200"],
        ),
    ];
    for (n, (clone, honest, spoofed)) in cases.into_iter().enumerate() {
        for address in spoofed {
            let cidr = format!("{address}/32");
            must(&mut clone.ns.cmd(&["ip", "addr", "add", &cidr, "dev", "eth0"]));
        }
        let (mut listener, out) = sources_seen(&world, 9911);
        send_from(clone, &ip.to_string(), &gateway, 9911);
        for address in spoofed {
            send_from(clone, address, &gateway, 9911);
        }
        listener.wait().unwrap();
        use std::io::BufRead;
        let seen: Vec<String> = out.lines().map(|l| l.unwrap()).collect();
        assert_eq!(seen, vec![honest], "clone {n}: only the honest datagram");
    }
}

#[test]
fn a_real_guest_restored_twice_with_one_static_configuration_reaches_upstream_from_both() {
    use crate::qemu::{Vm, qemu_command_with, vm_dir};
    let mut world = World::new();
    world.start_daemon();
    let mut original = world.guest("shared", &["--name", "snap"]);
    let (ip, gateway) = (original.udhcpc(), original.gateway());
    original.stop();
    // What the snapshot left in the guest: its address and route, set by
    // hand here (no DHCP), then a fetch from upstream.
    let script = format!(
        "ip addr add {ip}/24 dev eth0\n\
         ip route add default via {gateway}\n\
         ping -c 1 -W 3 {gateway} && echo linnet-guest: gateway-ok\n\
         wget -q -O - http://{UPSTREAM_IP}/ | sed 's/^/linnet-guest: upstream=/'\n"
    );
    let vms: Vec<Vm> = (0..2)
        .map(|n| {
            let name = unique("linnet-clone");
            let json = vm_dir(&world).join(format!("{name}.json"));
            let json_s = json.display().to_string();
            let clone_name = format!("snap-{n}");
            let mut args: Vec<String> = [
                "run",
                "--clone-of",
                "snap",
                "--name",
                &clone_name,
                "--json",
                &json_s,
                "--",
            ]
            .map(String::from)
            .to_vec();
            args.extend(qemu_command_with(&name, &script, "linnet.nodhcp"));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Vm::launch(&world, world.linnet(&args), name, &json)
        })
        .collect();
    for vm in &vms {
        assert_eq!(vm.ip(), ip.to_string(), "each has the snapshot's address");
    }
    for vm in vms {
        let console = vm.finish();
        assert!(
            console.contains(&format!("linnet-guest: upstream={UPSTREAM_PAGE}")),
            "{console}"
        );
    }
}

/// A server in `ns` on `addr:port` answering each line of one connection
/// with "got LINE from PEER"; ready when returned.
fn line_server(ns: &Netns, addr: &str, port: u16) -> Reaped {
    let code = format!(
        "import socket\n\
         s = socket.socket()\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('{addr}', {port})); s.listen()\n\
         print('ready', flush=True)\n\
         c, peer = s.accept()\n\
         for line in c.makefile():\n    c.sendall(f'got {{line.strip()}} from {{peer[0]}}\\n'.encode())\n"
    );
    let (server, ready) = spawn_until_first_line(ns.cmd(&["python3", "-c", &code]));
    assert_eq!(ready, "ready");
    server
}

/// A connection from `guest` to a `line_server`: it says "before" at once
/// (the answer is returned) and "after" once the file `go` exists (the
/// answer is the reader's next line).
fn held_connection(
    guest: &Guest,
    addr: &str,
    port: u16,
    go: &std::path::Path,
) -> (
    Reaped,
    String,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let code = format!(
        "import os, socket, time\n\
         c = socket.create_connection(('{addr}', {port}), timeout=30)\n\
         f = c.makefile()\n\
         c.sendall(b'before\\n'); print(f.readline().strip(), flush=True)\n\
         while not os.path.exists('{}'): time.sleep(0.05)\n\
         c.sendall(b'after\\n'); print(f.readline().strip(), flush=True)\n",
        go.display()
    );
    spawn_reading(guest.ns.cmd(&["python3", "-c", &code]))
}

#[test]
fn the_first_clone_of_a_stopped_vm_carries_on_its_connections_and_later_ones_get_their_own_address()
{
    let mut world = World::new();
    world.start_daemon();
    let original = world.guest("shared", &["--name", "web"]);
    let (ip, gateway) = (original.udhcpc(), original.gateway());
    // Servers on the host and upstream, and a connection to each that the
    // VM opened.
    let go = world.dir.path().join("restored");
    let _servers = [
        line_server(&world.host, &gateway, 7000),
        line_server(&world.upstream, UPSTREAM_IP, 7002),
    ];
    let (_to_host, before, mut host_rest) = held_connection(&original, &gateway, 7000, &go);
    assert_eq!(before, format!("got before from {ip}"));
    let (_to_upstream, before, mut upstream_rest) =
        held_connection(&original, UPSTREAM_IP, 7002, &go);
    assert_eq!(before, format!("got before from {UPSTREAM_HOST_SIDE}"));

    // The snapshot: the VM stops with its connection open; restored into
    // the same state, as the first clone.
    let ns = original.into_ns();
    let first = world.guest_in(ns, "shared", &["--clone-of", "web", "--name", "web-0"]);
    restore(&first, ip, &gateway);
    std::fs::write(&go, "").unwrap();
    use std::io::BufRead;
    let mut after = String::new();
    host_rest.read_line(&mut after).unwrap();
    assert_eq!(
        after.trim(),
        format!("got after from {ip}"),
        "the connection to the host carries on, from the guest's own address"
    );
    let mut after = String::new();
    upstream_rest.read_line(&mut after).unwrap();
    assert_eq!(
        after.trim(),
        format!("got after from {UPSTREAM_HOST_SIDE}"),
        "the connection upstream carries on through the host's NAT"
    );
    // The host and other VMs still reach it at the address it had, and at
    // its own; `web` still names it.
    let ping = |target: &str| {
        run(&mut world
            .host
            .cmd(&["busybox", "ping", "-c", "1", "-W", "2", target]))
        .status
        .success()
    };
    assert!(
        ping(&ip.to_string()),
        "the host reaches the first clone at {ip}"
    );
    assert!(ping(&clone_address(&first)));
    // A second clone is not the VM carrying on: it is NATed to its own
    // address, and reaches upstream and the host all the same.
    let second = world.guest("shared", &["--clone-of", "web", "--name", "web-1"]);
    restore(&second, ip, &gateway);
    second.assert_reaches_upstream("the second clone");
    let _echo = echo_serve(&world.host, "host", 7001);
    assert_eq!(
        echo_ask(&second.ns, &gateway, 7001, "tcp"),
        Some(format!("host from {}", clone_address(&second)))
    );
    assert_eq!(
        echo_ask(&first.ns, &gateway, 7001, "tcp"),
        Some(format!("host from {ip}")),
        "the first clone sends as the VM did"
    );
}

/// A DHCPREQUEST renewing `ip`, sent by unicast from `ip`:68 to the
/// gateway as a guest in RENEWING state does (RFC 2131 4.4.5); the
/// message type of the reply and who sent it, or "no reply".
fn renew(guest: &Guest, ip: Ipv4Addr, gateway: &str) -> String {
    let mac = guest.mac().replace(':', "");
    let code = format!(
        "import socket, struct\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('{ip}', 68)); s.settimeout(3)\n\
         m = bytearray(240)\n\
         m[0], m[1], m[2] = 1, 1, 6\n\
         m[4:8] = b'lnnt'\n\
         m[12:16] = socket.inet_aton('{ip}')\n\
         m[28:34] = bytes.fromhex('{mac}')\n\
         m[236:240] = b'\\x63\\x82\\x53\\x63'\n\
         m += bytes([53, 1, 3, 255])\n\
         s.sendto(bytes(m), ('{gateway}', 67))\n\
         try:\n    r, peer = s.recvfrom(1500)\n\
         except socket.timeout:\n    print('no reply'); raise SystemExit\n\
         i, kind = 240, None\n\
         while i < len(r) and r[i] != 255:\n    \
             kind = r[i + 2] if r[i] == 53 else kind\n    \
             i += 2 + r[i + 1]\n\
         print({{2: 'offer', 5: 'ack', 6: 'nak'}}.get(kind), socket.inet_ntoa(r[16:20]), 'from', peer[0])\n"
    );
    must(&mut guest.ns.cmd(&["python3", "-c", &code]))
        .trim()
        .to_string()
}

#[test]
fn a_clone_configured_by_dhcp_is_given_and_renews_its_guests_address() {
    let mut world = World::new();
    world.start_daemon();
    let (clones, ip, gateway) = clones_of(&world, "dyn", &[&[], &[]]);
    for (n, clone) in clones.iter().enumerate() {
        must(&mut clone.ns.cmd(&["ip", "addr", "flush", "dev", "eth0"]));
        assert_eq!(
            clone.udhcpc(),
            ip,
            "clone {n} asks again and gets its address"
        );
        assert_eq!(
            renew(clone, ip, &gateway),
            format!("ack {ip} from {gateway}"),
            "clone {n}'s renewal, answered in its namespace as the gateway"
        );
        clone.assert_reaches_upstream(&format!("clone {n} after DHCP"));
    }
}

#[test]
fn a_clone_of_a_recorded_interface_json_and_the_mistakes_a_user_can_make() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    let mut original = world.guest("shared", &["--name", "rec"]);
    let (ip, gateway) = (original.udhcpc(), original.gateway());
    // Where another user can read it too.
    let recorded = crate::qemu::vm_dir(&world).join("rec.json");
    std::fs::write(&recorded, original.info.to_string()).unwrap();
    original.stop();
    let like = recorded.to_str().unwrap();
    let clone = world.guest("shared", &["--like", like, "--name", "rec-0"]);
    assert_eq!((clone.ip(), clone.mac()), (ip, original.mac()));
    assert_eq!(clone.tap(), original.tap(), "its TAP has the VM's name");
    restore(&clone, ip, &gateway);
    clone.assert_reaches_upstream("a clone from --like");

    let refused = |args: &[&str]| {
        let mut argv = vec!["run"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["--", "true"]);
        failure(&mut world.linnet(&argv))
    };
    let m = refused(&["--like", like, "--network", "host"]);
    assert!(m.contains("the VM was on network \"shared\""), "{m}");
    let m = refused(&["--clone-of", "nosuch"]);
    assert!(m.contains("has no VM of yours named \"nosuch\""), "{m}");
    let m = refused(&["--clone-of", "rec", "--mac", "52:54:00:00:00:01"]);
    assert!(m.contains("cannot be used with"), "{m}");
    // --wait-ip says the guest's address, which the JSON had.
    let waited = world.dir.path().join("waited.json");
    must(&mut world.linnet(&[
        "run",
        "--like",
        like,
        "--wait-ip",
        "5",
        "--json",
        waited.to_str().unwrap(),
        "--",
        "sleep",
        "1",
    ]));
    let waited: Value = serde_json::from_str(&std::fs::read_to_string(&waited).unwrap()).unwrap();
    assert_eq!(waited["ip_address"], ip.to_string(), "{waited}");
    // Another user finds no VM of root's by name, and cannot take the
    // name root's stopped VM still holds.
    let m = refused(&["--user", "nobody", "--clone-of", "rec"]);
    assert!(m.contains("has no VM of yours named \"rec\""), "{m}");
    let m = refused(&["--user", "nobody", "--like", like, "--name", "rec"]);
    assert!(m.contains("the name \"rec\" is held by interface"), "{m}");
    std::fs::write(&recorded, "{}").unwrap();
    let m = refused(&["--like", like]);
    assert!(m.contains("not an interface JSON"), "{m}");
}

/// A stand-in opening a clone's TAP `tap` by name in the clone's
/// namespace `netns` (as Firecracker's jailer --netns puts Firecracker
/// there), its guest side in a new namespace.
fn vmm_in_clone_namespace(world: &World, info: &Value) -> Guest {
    let netns = info["netns"].as_str().unwrap();
    let (tap, mac) = (
        info["tap"].as_str().unwrap(),
        info["mac_address"].as_str().unwrap(),
    );
    let ns = Netns::new("guest");
    let standin = standin_bin();
    let vmm = world
        .host
        .cmd(&[
            "nsenter",
            &format!("--net={netns}"),
            standin.to_str().unwrap(),
            "--tap",
            tap,
            "--netns",
            &ns.path(),
            "--mac",
            mac,
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    Guest::started(ns, None, Some(vmm), info.clone())
}

#[test]
fn a_vmm_opens_a_clones_tap_by_name_in_the_clones_namespace() {
    let mut world = World::new();
    world.start_daemon();
    let mut original = world.guest("shared", &["--name", "fc"]);
    let (ip, gateway) = (original.udhcpc(), original.gateway());
    let tap = original.tap();
    let recorded = world.dir.path().join("fc.json");
    std::fs::write(&recorded, original.info.to_string()).unwrap();
    original.stop();

    // `linnet run` puts the VMM in the clone's namespace itself; the TAP
    // has the name the snapshot's JSON recorded, as a restored
    // Firecracker expects (host_dev_name).
    let ns = Netns::new("guest");
    let json = world.dir.path().join("fc-0.json");
    let standin = standin_bin();
    let (json_s, guest_ns) = (json.to_str().unwrap(), ns.path());
    let run = world
        .linnet(&[
            "run",
            "--like",
            recorded.to_str().unwrap(),
            "--name",
            "fc-0",
            "--datapath",
            "tap-name",
            "--json",
            json_s,
            "--",
            standin.to_str().unwrap(),
            "--tap",
            "{tap}",
            "--netns",
            &guest_ns,
        ])
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let info: Value = wait_for("the attach JSON", Duration::from_secs(15), || {
        serde_json::from_str(&std::fs::read_to_string(&json).ok()?).ok()
    });
    assert_eq!(
        info["tap"],
        tap.as_str(),
        "the clone's TAP has the VM's name"
    );
    assert!(info["netns"].as_str().is_some(), "{info}");
    let first = Guest::started(ns, Some(run), None, info);
    restore(&first, ip, &gateway);
    first.assert_reaches_upstream("a clone whose VMM opened its TAP by name");

    // `linnet attach` keeps one for a VMM started on its own, in the
    // namespace the JSON names; `linnet detach` takes it all away.
    let out = must(&mut world.linnet(&["attach", "--clone-of", "fc", "--name", "fc-1"]));
    let info: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(info["tap"], "tap0", "a stopped VM's TAP name is not kept");
    let netns = info["netns"].as_str().unwrap().to_string();
    assert!(std::path::Path::new(&netns).exists());
    // Root's alone: a user who could open the name could hold the
    // namespace, and the TAP in it, past detach.
    let as_nobody = |path: &str| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "cat",
                path,
            ])
            .output()
            .unwrap()
    };
    let denied = as_nobody(&netns);
    assert!(
        !denied.status.success()
            && String::from_utf8_lossy(&denied.stderr).contains("Permission denied"),
        "another user opened the clone's namespace: {denied:?}"
    );
    assert!(
        as_nobody("/proc/self/status").status.success(),
        "the same user reads what it may"
    );
    let mut second = vmm_in_clone_namespace(&world, &info);
    restore(&second, ip, &gateway);
    second.assert_reaches_upstream("a kept clone's VMM started on its own");
    must(&mut world.linnet(&["detach", "--name", "fc-1"]));
    let vmm = second.vmm.as_mut().unwrap();
    wait_for("the VMM to lose its TAP", Duration::from_secs(10), || {
        vmm.try_wait().unwrap()
    });
    assert!(
        !std::path::Path::new(&netns).exists(),
        "the namespace's name goes at detach"
    );
}

#[test]
fn a_rootless_daemons_clones_reach_upstream_the_host_and_each_other() {
    let world = World::new();
    let user = crate::rootless::Tenant::new(&world, 4330);
    let mut original = user.guest(&world, "shared", &["--name", "web"]);
    let (ip, gateway) = (original.udhcpc(), original.gateway());
    original.stop();
    let clones: Vec<Guest> = (0..2)
        .map(|n| {
            let clone = user.guest(
                &world,
                "shared",
                &["--clone-of", "web", "--name", &format!("web-{n}")],
            );
            restore(&clone, ip, &gateway);
            clone
        })
        .collect();
    for (n, clone) in clones.iter().enumerate() {
        assert_eq!(clone.ip(), ip);
        clone.assert_reaches_upstream(&format!("rootless clone {n}"));
    }
    assert!(clones[0].ping(&clone_address(&clones[1])));
    assert!(clones[1].ping(&clone_address(&clones[0])));
    assert_eq!(
        clones[1].lookup("web-0.shared.linnet", &gateway),
        Some(clone_address(&clones[0]))
    );
}

#[test]
fn a_persistent_networks_clones_come_back_after_a_daemon_restart() {
    let mut world = World::with_config("networks:\n  shared:\n    persistent: true\n");
    world.start_daemon();
    let (clones, ip, gateway) = clones_of(&world, "keep", &[&[]]);
    clones[0].assert_reaches_upstream("a clone before the restart");
    drop(clones);
    // The bridge is adopted with the clone range's route on it.
    world.stop_daemon();
    world.start_daemon();
    let clone = world.guest("shared", &["--like", &{
        let json = world.dir.path().join("keep.json");
        std::fs::write(&json, format!(
            "{{\"network\":\"shared\",\"mac_address\":\"52:54:00:00:00:42\",\"ip_address\":\"{ip}\"}}"
        ))
        .unwrap();
        json.display().to_string()
    }]);
    restore(&clone, ip, &gateway);
    clone.assert_reaches_upstream("a clone after the restart");
}

#[test]
fn a_clone_refused_for_its_published_port_gives_the_vms_address_back() {
    let mut world = World::new();
    world.start_daemon();
    let original = world.guest("shared", &["--name", "gb"]);
    let ip = original.udhcpc();
    let id = original.info["interface_id"].as_str().unwrap().to_string();
    drop(original);
    let _holder_of_the_port = world.guest("shared", &["--name", "x", "-p", "8090:80"]);
    // It would have carried on as the stopped VM, but its port is another's.
    let refused = world.try_guest_via("shared", Via::Tap, &["--clone-of", "gb", "-p", "8090:80"]);
    assert!(refused.is_err(), "the port is taken");
    // The VM, back under its own id, has its address again.
    let back = world.guest("shared", &["--interface-id", &id]);
    assert_eq!(back.ip(), ip);
}
