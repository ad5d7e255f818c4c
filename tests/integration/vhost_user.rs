//! The vhost-user datapath with real QEMU 7.2 guests: `linnet run
//! --datapath vhost-user` wires QEMU itself (shared memory, chardev,
//! netdev, NIC); the back-end runs in the VM's relay as its user.

use std::process::Command;

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
    let _ = Command::new("true");
}
