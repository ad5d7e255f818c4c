//! A VM with a connect policy has no way out through its neighbours: what
//! it broadcasts (DHCP, UDP, padded ARP and neighbour discovery, a DHCP
//! request in a frame to one VM) reaches none of them, and none of them connects to it unless it
//! listens on that port; its plain ARP still reaches them, and its
//! published ports and the host still reach it. Each check beside the same
//! probe from a VM without a policy, which gets through.

use crate::guard::{ready, send_and_capture};
use crate::harness::*;

/// A connect policy a sandbox might have: one service, nothing else.
const SANDBOX: [&str; 2] = ["--allow-connect", "198.51.100.1:443/tcp"];

/// Frames that carry data to whoever receives them, and one (an address
/// probe for its own address) that a network needs.
const CARRIERS: [&str; 5] = [
    "honest",
    "dhcp-discover",
    "dhcp-in-unicast",
    "arp-padded",
    "ns-padded",
];
const NEEDED: &str = "arp-probe-own";

fn markers(kinds: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = kinds.iter().map(|k| format!("LINNET-{k}")).collect();
    out.sort();
    out
}

#[test]
fn a_policed_vms_broadcasts_and_padding_reach_no_neighbour_while_its_plain_arp_does() {
    let mut world = World::new();
    world.start_daemon();
    let sandbox = ready(&world, &SANDBOX);
    let plain = ready(&world, &[]);
    let neighbour = ready(&world, &[]);
    let mut kinds = CARRIERS.to_vec();
    kinds.push(NEEDED);
    // The positive control: from a VM without a policy, every one arrives.
    assert_eq!(
        send_and_capture(&plain, &neighbour, &kinds),
        markers(&kinds)
    );
    // From the sandbox, only what the network needs.
    assert_eq!(
        send_and_capture(&sandbox, &neighbour, &kinds),
        markers(&[NEEDED])
    );
    // What it needs of the host still works: DHCP and DNS.
    assert_eq!(sandbox.udhcpc(), sandbox.ip());
    assert_eq!(
        sandbox.lookup(UPSTREAM_NAME, &sandbox.gateway()).as_deref(),
        Some(UPSTREAM_IP)
    );
}

#[test]
fn no_neighbour_connects_to_a_policed_vm_unless_it_listens_but_its_published_port_and_the_host_do()
{
    let mut world = World::new();
    world.start_daemon();
    let mut published = SANDBOX.to_vec();
    published.extend(["-p", "9000:8000"]);
    let sandbox = ready(&world, &published);
    let mut listening = SANDBOX.to_vec();
    listening.extend(["--allow-listen", "8000/tcp"]);
    let listener = ready(&world, &listening);
    let plain = ready(&world, &[]);
    let neighbour = ready(&world, &[]);
    let _servers = [
        echo_serve(&sandbox.ns, "sandbox", 8000),
        echo_serve(&listener.ns, "listener", 8000),
        echo_serve(&plain.ns, "plain", 8000),
    ];
    let answer = |tag: &str, from: &str| Reply::Answer(format!("{tag} from {from}"));
    let asks = |ns: &Netns, guest: &Guest| echo_try(ns, &guest.ip().to_string(), 8000, "tcp");
    let from = neighbour.ip().to_string();
    // The positive control: a VM without a policy is reached.
    assert_eq!(asks(&neighbour.ns, &plain), answer("plain", &from));
    // The sandbox: not by a neighbour, over TCP or by ping...
    assert_eq!(asks(&neighbour.ns, &sandbox), Reply::Refused);
    assert!(neighbour.ping(&plain.ip().to_string()));
    assert!(!neighbour.ping(&sandbox.ip().to_string()));
    // ...unless it listens on that port.
    assert_eq!(asks(&neighbour.ns, &listener), answer("listener", &from));
    assert!(
        !neighbour.ping(&listener.ip().to_string()),
        "a neighbour's echo request to a VM with a connect policy"
    );
    // The host reaches it, and so does its published port.
    let gateway = sandbox.gateway();
    assert_eq!(asks(&world.host, &sandbox), answer("sandbox", &gateway));
    assert!(world.host.ping(&sandbox.ip().to_string()));
    assert!(world.host.ping(&listener.ip().to_string()));
    assert_eq!(
        echo_try(&world.upstream, UPSTREAM_HOST_SIDE, 9000, "tcp"),
        answer("sandbox", UPSTREAM_IP)
    );
}
