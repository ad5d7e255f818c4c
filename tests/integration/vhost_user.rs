//! The vhost-user datapath with real QEMU 7.2 guests: `linnet run
//! --datapath vhost-user` wires QEMU itself (shared memory, chardev,
//! netdev, NIC); the back-end runs in the VM's relay as its user.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::guard::{SPOOFS, ready, send_and_capture};
use crate::harness::*;
use crate::qemu::Vm;

#[test]
fn a_qemu_guest_on_vhost_user_leases_and_reaches_the_gateway_upstream_and_a_tap_guest() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    let tap_vm = Vm::start(&world, "shared", "sleep 40\n", &[]);
    tap_vm.wait_console("linnet-guest: lease");
    let peer = tap_vm.ip();
    let vm = Vm::start_via(
        &world,
        "shared",
        &format!(
            "ping -c 1 -W 3 192.168.105.1 && echo RESULT-PING-GW-OK\n\
             ping -c 1 -W 3 {peer} && echo RESULT-PING-PEER-OK\n\
             wget -q -O - http://{UPSTREAM_IP}/ | sed 's/^/RESULT-PAGE: /'\n\
             sleep 2\n"
        ),
        AS_NOBODY,
        "vhost-user",
    );
    assert_eq!(vm.info["datapath"], "vhost-user");
    vm.wait_console("linnet-guest: lease");
    let ls = must(&mut world.linnet(&["ls", "--json"]));
    assert!(ls.contains("\"datapath\": \"vhost-user\""), "{ls}");
    let ip = vm.ip();
    let console = vm.finish();
    assert!(
        console.contains(&format!("linnet-guest: lease ip={ip} ")),
        "the guest got the reported ip {ip}:\n{console}"
    );
    assert!(console.contains("RESULT-PING-GW-OK"), "{console}");
    assert!(console.contains("RESULT-PING-PEER-OK"), "{console}");
    assert!(
        console.contains(&format!("RESULT-PAGE: {UPSTREAM_PAGE}")),
        "{console}"
    );
    drop(tap_vm);
}

/// `linnet helper --vhost-user PATH` and a stand-in front-end that breaks
/// the rules as `hostile` says, once it has a frame to send.
fn hostile_front_end(world: &World, hostile: &str) -> (Reaped, Reaped, Netns, Value, PathBuf) {
    let name = unique("hostile");
    let socket = world.dir.path().join(format!("{name}.sock"));
    let json = world.dir.path().join(format!("{name}.json"));
    let log = world.dir.path().join(format!("{name}.log"));
    let helper = Reaped(
        world
            .linnet(&["helper", "--vhost-user", socket.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&json).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let info: Value = wait_for("the helper's JSON", Duration::from_secs(15), || {
        serde_json::from_str(&std::fs::read_to_string(&json).ok()?).ok()
    });
    let ns = Netns::new("hostile");
    let standin = Reaped(
        Command::new(standin_bin())
            .args([
                "--vhost-user",
                socket.to_str().unwrap(),
                "--hostile",
                hostile,
            ])
            .args([
                "--netns",
                &ns.path(),
                "--mac",
                info["mac_address"].as_str().unwrap(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (helper, standin, ns, info, log)
}

#[test]
fn a_hostile_vhost_user_front_end_ends_only_its_own_relay() {
    let mut world = World::new();
    world.start_daemon();
    // Another VM, on vhost-user too, that must not notice.
    let bystander = world.guest_via("shared", Via::HelperVhostUser, &[]);
    assert_eq!(bystander.udhcpc(), bystander.ip());
    for (hostile, says) in [
        ("outside", "outside the VM's memory"),
        ("loop", "as long as the ring"),
        ("direction", "may write"),
        ("ring", "vhost-user back-end failed"),
    ] {
        let (mut helper, _standin, ns, info, log) = hostile_front_end(&world, hostile);
        // Frames to send: the guest's own pings.
        if hostile != "ring" {
            wait_for("the guest's eth0", Duration::from_secs(10), || {
                ns.links().contains(&"eth0".to_string()).then_some(())
            });
            let _ = run(&mut ns.cmd(&[
                "ip",
                "addr",
                "add",
                &format!("{}/24", info["ip_address"].as_str().unwrap()),
                "dev",
                "eth0",
            ]));
            let _ = run(&mut ns.cmd(&["busybox", "ping", "-c", "2", "-W", "1", "192.168.105.1"]));
        }
        let status = wait_for(
            "the hostile VM's relay to end",
            Duration::from_secs(15),
            || helper.0.try_wait().unwrap(),
        );
        let said = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(125), "{hostile}: {said}");
        assert!(said.contains(says), "{hostile}: the relay says why: {said}");
        wait_for("its interface to go", Duration::from_secs(5), || {
            let ls = must(&mut world.linnet(&["ls", "--json"]));
            (!ls.contains(info["interface_id"].as_str().unwrap())).then_some(())
        });
        // The daemon and the other VM carry on.
        assert!(
            bystander.ping(&bystander.gateway()),
            "{hostile}: the bystander"
        );
        must(&mut world.linnet(&["ls"]));
    }
}

#[test]
fn a_vhost_user_guest_is_held_to_its_addresses_and_its_policy() {
    let mut world = World::new();
    world.start_daemon();
    let attacker = world.guest_via("shared", Via::RunVhostUser, &[]);
    assert_eq!(attacker.udhcpc(), attacker.ip());
    assert_eq!(attacker.slaac_addresses(), vec![attacker.ipv6()]);
    let victim = ready(&world, &[]);
    // Anti-spoofing: only the honest frames cross, each spoof counted.
    let mut kinds = vec!["honest"];
    kinds.extend(SPOOFS);
    let seen = send_and_capture(&attacker, &victim, &kinds);
    assert_eq!(seen, vec!["LINNET-honest".to_string()]);
    let ls: Value = serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).unwrap();
    let listed = ls["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["interface_id"] == attacker.info["interface_id"])
        .unwrap()
        .clone();
    assert_eq!(listed["spoofed_drops"], SPOOFS.len() as u64, "{listed}");

    // A policy: the web server upstream, and nothing else.
    let held = world.guest_via(
        "shared",
        Via::HelperVhostUser,
        &["--allow-connect", &format!("{UPSTREAM_IP}:80/tcp")],
    );
    assert_eq!(held.udhcpc(), held.ip());
    assert_eq!(
        held.fetch(&format!("http://{UPSTREAM_IP}/")).as_deref().map(str::trim),
        Some(UPSTREAM_PAGE)
    );
    assert!(attacker.ping(UPSTREAM_IP), "a ping reaches upstream unheld");
    assert!(!held.ping(UPSTREAM_IP), "but not past the policy");
}
