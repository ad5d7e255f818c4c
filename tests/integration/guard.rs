//! Guard: anti-spoofing (raw frames from a guest, a capture in another) and
//! network isolation.

use std::io::BufRead;
use std::process::Stdio;

use serde_json::Value;

use crate::harness::*;

const SPOOFS: [&str; 8] = [
    "other-mac",
    "other-ip",
    "garp-gateway",
    "arp-reply-other",
    "other-ip6",
    "na-gateway",
    "ra",
    "dhcp-offer",
];

fn ready(world: &World, extra: &[&str]) -> Guest {
    let g = world.guest("shared", extra);
    assert_eq!(g.udhcpc(), g.ip());
    assert_eq!(g.slaac_addresses(), vec![g.ipv6()]);
    g
}

fn link_local(g: &Guest) -> String {
    let out = must(&mut g.ns.cmd(&[
        "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link",
    ]));
    out.split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .expect("a link-local address")
        .to_string()
}

/// The victim's neighbour entry for `ip` (its link-layer address).
fn neighbour(g: &Guest, ip: &str) -> String {
    let out = must(&mut g.ns.cmd(&["ip", "neigh", "show", ip, "dev", "eth0"]));
    out.split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .unwrap_or("none")
        .to_string()
}

/// Sends `kinds` from `attacker` while `victim` captures; the markers seen.
fn send_and_capture(attacker: &Guest, victim: &Guest, kinds: &[&str]) -> Vec<String> {
    let script = repo_file("tests/spoof.py");
    let mut capture = Reaped(
        victim
            .ns
            .cmd(&["python3", &script, "capture", "eth0", "3"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = std::io::BufReader::new(capture.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "capturing");
    let keys = [
        format!("mac={}", attacker.mac()),
        format!("ip={}", attacker.ip()),
        format!("ll={}", link_local(attacker)),
        format!("gw={}", attacker.gateway()),
        format!("gw6={}", attacker.gateway6()),
        format!("other_ip={}", victim.ip()),
        format!("other_mac={}", victim.mac()),
        format!("other_ip6={}", victim.ipv6()),
    ];
    for kind in kinds {
        let mut argv = vec!["python3", script.as_str(), "send", "eth0", kind];
        argv.extend(keys.iter().map(String::as_str));
        must(&mut attacker.ns.cmd(&argv));
    }
    capture.wait().unwrap();
    out.lines().map(|l| l.unwrap()).collect()
}

fn spoofed_drops(world: &World, g: &Guest) -> Option<u64> {
    let ls: Value = serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).unwrap();
    let me = ls["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["interface_id"] == g.info["interface_id"])
        .expect("listed");
    me["spoofed_drops"].as_u64()
}

#[test]
fn spoofed_frames_are_dropped_and_counted_while_honest_ones_pass() {
    let mut world = World::new();
    world.start_daemon();
    let attacker = ready(&world, &[]);
    let victim = ready(&world, &[]);
    assert!(victim.ping(&victim.gateway()) && victim.ping(&victim.gateway6()));
    let gateway_mac = neighbour(&victim, &victim.gateway());
    let gateway6_mac = neighbour(&victim, &victim.gateway6());
    assert_ne!(gateway_mac, "none");
    assert_eq!(spoofed_drops(&world, &attacker), Some(0));

    let mut kinds = vec!["honest"];
    kinds.extend(SPOOFS);
    let seen = send_and_capture(&attacker, &victim, &kinds);
    assert_eq!(
        seen,
        vec!["LINNET-honest".to_string()],
        "only the honest frame crosses the bridge"
    );
    assert_eq!(
        spoofed_drops(&world, &attacker),
        Some(SPOOFS.len() as u64),
        "each spoof counted once"
    );
    assert_eq!(spoofed_drops(&world, &victim), Some(0));

    // The victim is unharmed: same neighbour entries, no rogue prefix,
    // still reaches the gateway and the upstream.
    assert_eq!(neighbour(&victim, &victim.gateway()), gateway_mac);
    assert_eq!(neighbour(&victim, &victim.gateway6()), gateway6_mac);
    assert_eq!(
        victim.slaac_addresses(),
        vec![victim.ipv6()],
        "no address from a rogue RA"
    );
    victim.assert_reaches_upstream("the victim after the spoofs");
    // The drops are logged, per interface.
    wait_for("the drop report", std::time::Duration::from_secs(8), || {
        let log = world.daemon_log_text();
        log.lines()
            .any(|l| {
                l.contains("anti_spoofing")
                    && l.contains(&format!("tap={}", attacker.tap()))
                    && l.contains("dropped=8")
            })
            .then_some(())
    });
}

#[test]
fn without_anti_spoofing_the_same_frames_get_through() {
    let mut world = World::with_config("networks:\n  shared:\n    anti_spoofing: false\n");
    world.start_daemon();
    let attacker = ready(&world, &[]);
    let victim = ready(&world, &[]);
    let seen = send_and_capture(
        &attacker,
        &victim,
        &["honest", "other-mac", "other-ip", "na-gateway"],
    );
    assert_eq!(
        seen,
        vec![
            "LINNET-honest",
            "LINNET-na-gateway",
            "LINNET-other-ip",
            "LINNET-other-mac"
        ],
        "the capture sees spoofs when nothing stops them"
    );
    assert_eq!(
        spoofed_drops(&world, &attacker),
        None,
        "not counted: not guarded"
    );
}

#[test]
fn isolated_guests_reach_gateway_and_upstream_but_not_each_other() {
    let mut world = World::with_config("networks:\n  shared:\n    isolation: true\n");
    world.start_daemon();
    let a = ready(&world, &[]);
    let b = ready(&world, &[]);
    for g in [&a, &b] {
        assert!(g.ping(&g.gateway()) && g.ping(&g.gateway6()));
        g.assert_reaches_upstream("an isolated guest");
    }
    assert!(
        !a.ping(&b.ip().to_string()),
        "no IPv4 between isolated guests"
    );
    assert!(!a.ping(&b.ipv6()), "no IPv6 between isolated guests");
    // Not through the gateway either (routed, L3).
    must(&mut a.ns.cmd(&[
        "ip",
        "route",
        "add",
        &format!("{}/32", b.ip()),
        "via",
        &a.gateway(),
    ]));
    assert!(
        !a.ping(&b.ip().to_string()),
        "nor routed through the gateway"
    );
}
