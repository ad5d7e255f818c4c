//! Port forwarding: `run --publish`, `forward add|rm|ls` and the config's
//! `forwards:`, exercised with real TCP and UDP clients from the upstream
//! namespace, from the host itself (its own address and 127.0.0.1) and
//! over IPv6; the guest's server reports the address it sees.

use std::process::Stdio;

use serde_json::Value;

use crate::harness::*;

fn guest_with_addresses(world: &World, extra: &[&str]) -> Guest {
    let g = world.guest("shared", extra);
    assert_eq!(g.udhcpc(), g.ip());
    assert_eq!(g.slaac_addresses(), vec![g.ipv6()]);
    g
}

fn forward_ls(world: &World) -> Vec<Value> {
    let out = must(&mut world.linnet(&["forward", "ls", "--json"]));
    serde_json::from_str::<Vec<Value>>(&out).unwrap()
}

#[test]
fn published_ports_reach_the_guest_from_outside_from_the_host_and_over_ipv6() {
    let mut world = World::new();
    world.start_daemon();
    let web = guest_with_addresses(
        &world,
        &["--name", "web", "--publish", "8080:80", "-p", "5353:80/udp"],
    );
    let other = guest_with_addresses(&world, &["--name", "other", "--publish", "8081:80"]);
    let _servers = [
        echo_serve(&web.ns, "web", 80),
        echo_serve(&other.ns, "other", 80),
    ];
    assert_eq!(
        web.info["forwards"],
        serde_json::json!(["8080:80/tcp", "5353:80/udp"])
    );
    let up = &world.upstream;
    let host = &world.host;

    // From outside: the guest sees the real client.
    let from_up = format!("web from {UPSTREAM_IP}");
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 8080, "tcp"),
        Some(from_up.clone())
    );
    assert_eq!(echo_ask(up, UPSTREAM_HOST_SIDE, 5353, "udp"), Some(from_up));
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE6, 8080, "tcp"),
        Some(format!("web from {UPSTREAM_IP6}")),
        "IPv6 host address to the guest's SLAAC address"
    );
    // Two guests publish the same guest port on different host ports.
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 8081, "tcp"),
        Some(format!("other from {UPSTREAM_IP}"))
    );

    // From the host itself: its own address is kept; 127.0.0.1 is
    // masqueraded to the gateway (it cannot leave the host).
    assert_eq!(
        echo_ask(host, UPSTREAM_HOST_SIDE, 8080, "tcp"),
        Some(format!("web from {UPSTREAM_HOST_SIDE}"))
    );
    assert_eq!(
        echo_ask(host, UPSTREAM_HOST_SIDE6, 8080, "tcp"),
        Some(format!("web from {UPSTREAM_HOST_SIDE6}"))
    );
    let from_gateway = format!("web from {}", web.gateway());
    assert_eq!(
        echo_ask(host, "127.0.0.1", 8080, "tcp"),
        Some(from_gateway.clone())
    );
    assert_eq!(
        echo_ask(host, "127.0.0.1", 5353, "udp"),
        Some(from_gateway.clone())
    );
    // Another VM of the network through the gateway (hairpin).
    assert_eq!(
        echo_ask(&other.ns, &web.gateway(), 8080, "tcp"),
        Some(from_gateway)
    );
    // A VM of another network reaches it as it reaches the host.
    let lab = world.guest("host", &[]);
    assert_eq!(lab.udhcpc(), lab.ip());
    assert_eq!(
        echo_ask(&lab.ns, &lab.gateway(), 8080, "tcp"),
        Some(format!("web from {}", lab.ip()))
    );
    // Not published: nothing answers.
    assert_eq!(echo_ask(up, UPSTREAM_HOST_SIDE, 8082, "tcp"), None);

    // One VM detaching takes its ports along while the other keeps its own.
    let mut other = other;
    other.stop();
    wait_for(
        "other's rules to go",
        std::time::Duration::from_secs(5),
        || (!world.host.nft_ruleset().contains("8081")).then_some(()),
    );
    assert_eq!(echo_ask(up, UPSTREAM_HOST_SIDE, 8081, "tcp"), None);
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 8080, "tcp"),
        Some(format!("web from {UPSTREAM_IP}"))
    );
}

#[test]
fn runtime_forwards_are_added_removed_listed_and_follow_the_interface() {
    let mut world = World::new();
    world.start_daemon();
    let id = "6f1c1e8a-7d2b-4c55-9a43-1d0c2b3a4f5e";
    let mut web = guest_with_addresses(&world, &["--name", "web", "--interface-id", id]);
    let server = echo_serve(&web.ns, "web", 80);
    let up = &world.upstream;

    must(&mut world.linnet(&["forward", "add", "--name", "web", "9090:80"]));
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 9090, "tcp"),
        Some(format!("web from {UPSTREAM_IP}"))
    );
    let ls = forward_ls(&world);
    assert_eq!(ls.len(), 1, "{ls:?}");
    assert_eq!(ls[0]["forward"], "9090:80/tcp");
    assert_eq!(ls[0]["origin"], "runtime");
    assert_eq!(ls[0]["interface_id"], id);
    assert_eq!(ls[0]["guest"], format!("{}:80", web.ip()));
    let table = must(&mut world.linnet(&["forward", "ls"]));
    assert!(
        table.contains("*:9090/tcp") && table.contains("web"),
        "{table}"
    );
    let listing = must(&mut world.linnet(&["ls"]));
    assert!(
        listing.contains("9090:80/tcp"),
        "linnet ls shows forwards: {listing}"
    );

    must(&mut world.linnet(&["forward", "rm", "--name", "web", "9090:80"]));
    assert_eq!(
        echo_ask(up, UPSTREAM_HOST_SIDE, 9090, "tcp"),
        None,
        "removed"
    );
    assert!(forward_ls(&world).is_empty());

    // Kept for the interface id: gone at detach, back at the next attach,
    // also after a daemon restart.
    must(&mut world.linnet(&["forward", "add", "--interface-id", id, "9091:80"]));
    drop(server);
    web.stop();
    drop(web);
    wait_for("the detach", std::time::Duration::from_secs(5), || {
        forward_ls(&world).is_empty().then_some(())
    });
    assert!(
        !world.host.nft_ruleset().contains("9091"),
        "no rule left for a detached interface"
    );
    for restart in [false, true] {
        if restart {
            world.stop_daemon();
            world.start_daemon();
        }
        let web = guest_with_addresses(&world, &["--interface-id", id]);
        let _server = echo_serve(&web.ns, "again", 80);
        assert_eq!(web.info["forwards"], serde_json::json!(["9091:80/tcp"]));
        assert_eq!(
            echo_ask(&world.upstream, UPSTREAM_HOST_SIDE, 9091, "tcp"),
            Some(format!("again from {UPSTREAM_IP}")),
            "restored (daemon restarted: {restart})"
        );
    }
    must(&mut world.linnet(&["forward", "rm", "--interface-id", id, "9091:80"]));
    let kept = std::fs::read_to_string(world.state_dir().join("forwards.json")).unwrap();
    assert!(!kept.contains("9091"), "{kept}");
}

#[test]
fn config_forwards_go_to_the_named_vm_and_stay_in_the_config() {
    let mut world = World::with_config(
        "networks:\n  shared:\n    forwards:\n      - { name: cfgvm, publish: '7070:80' }\n",
    );
    world.start_daemon();
    let g = guest_with_addresses(&world, &["--name", "cfgvm"]);
    let _server = echo_serve(&g.ns, "cfg", 80);
    assert_eq!(g.info["forwards"], serde_json::json!(["7070:80/tcp"]));
    assert_eq!(
        echo_ask(&world.upstream, UPSTREAM_HOST_SIDE, 7070, "tcp"),
        Some(format!("cfg from {UPSTREAM_IP}"))
    );
    assert_eq!(forward_ls(&world)[0]["origin"], "config");
    let err = failure(&mut world.linnet(&["forward", "rm", "--name", "cfgvm", "7070:80"]));
    assert!(
        err.contains("is declared in networks.shared.forwards"),
        "{err}"
    );
}

#[test]
fn forward_errors_name_the_conflict() {
    let mut world = World::new();
    world.start_daemon();
    let web = world.guest("shared", &["--name", "web", "--publish", "8080:80"]);
    let _b = world.guest("shared", &["--name", "b"]);
    let web_id = web.info["interface_id"].as_str().unwrap();

    let err = failure(&mut world.linnet(&["forward", "add", "--name", "b", "8080:81"]));
    assert!(
        err.contains(&format!(
            "host port 8080/tcp is already forwarded to interface {web_id} (web)"
        )),
        "{err}"
    );
    let err = failure(&mut world.linnet(&["run", "--publish", "8080:80", "--", "true"]));
    assert!(err.contains("already forwarded to interface"), "{err}");

    let listener = Reaped(
        world
            .host
            .cmd(&[
                "python3",
                &repo_file("tests/echo_peer.py"),
                "serve",
                "host",
                "7071",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_for(
        "the host's listener",
        std::time::Duration::from_secs(5),
        || echo_ask(&world.host, "127.0.0.1", 7071, "tcp").map(|_| ()),
    );
    let err = failure(&mut world.linnet(&["forward", "add", "--name", "b", "7071:80"]));
    assert!(
        err.contains("host port 7071/tcp is already bound by a listening socket on [::]:7071")
            && err.contains("python3"),
        "{err}"
    );
    drop(listener);
    let err = failure(&mut world.linnet(&["forward", "add", "--name", "b", "53:53/udp"]));
    assert!(
        err.contains(&format!("listening socket on {}:53", web.gateway())),
        "linnet's own DNS holds port 53: {err}"
    );

    let err = failure(&mut world.linnet(&["forward", "add", "--name", "b", "70000:80"]));
    assert!(
        err.contains("host port 70000 is out of range; allowed 1 to 65535"),
        "{err}"
    );
    let err = failure(&mut world.linnet(&["forward", "add", "--name", "nosuch", "1234:80"]));
    assert!(
        err.contains(
            "unknown interface: an interface named \"nosuch\" is not attached to network \"shared\""
        ),
        "{err}"
    );
    let err = failure(&mut world.linnet(&[
        "forward",
        "add",
        "--network",
        "nope",
        "--name",
        "b",
        "1234:80",
    ]));
    assert!(err.contains("unknown network \"nope\""), "{err}");
    assert_eq!(forward_ls(&world).len(), 1, "only web's forward");
}
