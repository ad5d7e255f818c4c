//! Clones (`--clone-of`, `--like`): many guests with one MAC and address,
//! as VMs restored from one snapshot wake up, each reached at a unique
//! address of its own.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

/// Sets up a guest as its snapshot left it: the address it had, the
/// network's gateway as its default route, no DHCP client.
fn restore(guest: &Guest, ip: Ipv4Addr, gateway: &str) {
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
