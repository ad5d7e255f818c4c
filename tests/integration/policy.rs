//! Per-interface policy, kvmserver-style: `--allow-connect` limits what a
//! VM may connect to, `--allow-listen` on which of its ports it may be
//! connected to.

use crate::harness::*;

const ALLOWED_HOST: &str = "198.51.100.1";

fn tcp(ns: &Netns, host: &str, port: u16) -> Option<String> {
    echo_ask(ns, host, port, "tcp")
}

/// A world whose upstream also holds ALLOWED_HOST, with echo servers on
/// its ports 8080 and 8081, and a daemon.
fn world_with_allowed_host() -> (World, [Reaped; 2]) {
    let mut world = World::new();
    let address = format!("{ALLOWED_HOST}/32");
    must(
        &mut world
            .upstream
            .cmd(&["ip", "addr", "add", &address, "dev", "eth0"]),
    );
    let servers = [
        echo_serve(&world.upstream, "up", 8080),
        echo_serve(&world.upstream, "up", 8081),
    ];
    world.start_daemon();
    (world, servers)
}

#[test]
fn allow_connect_limits_what_the_guest_reaches() {
    let (world, _servers) = world_with_allowed_host();
    let g = world.guest(
        "shared",
        &["--allow-connect", &format!("{ALLOWED_HOST}:8080/tcp")],
    );
    assert_eq!(g.udhcpc(), g.ip());
    assert_eq!(
        g.info["policy"]["egress"],
        serde_json::json!([format!("{ALLOWED_HOST}:8080/tcp")])
    );
    assert_eq!(
        tcp(&g.ns, ALLOWED_HOST, 8080).as_deref(),
        Some(format!("up from {}", UPSTREAM_HOST_SIDE).as_str())
    );
    assert_eq!(
        tcp(&g.ns, ALLOWED_HOST, 8081),
        None,
        "another port of the same host"
    );
    assert_eq!(
        g.fetch(&format!("http://{UPSTREAM_IP}/")),
        None,
        "another address"
    );
    assert_eq!(
        g.lookup(UPSTREAM_NAME, &g.gateway()).as_deref(),
        Some(UPSTREAM_IP),
        "DNS through the gateway always passes"
    );
}

#[test]
fn allow_listen_limits_who_reaches_the_guest() {
    let mut world = World::new();
    world.start_daemon();
    let g = world.guest(
        "shared",
        &[
            "--allow-listen",
            "8000/tcp",
            "-p",
            "9000:8000",
            "-p",
            "9001:8001",
        ],
    );
    let other = world.guest("shared", &[]);
    assert_eq!(g.udhcpc(), g.ip());
    assert_eq!(other.udhcpc(), other.ip());
    let _servers = [echo_serve(&g.ns, "g", 8000), echo_serve(&g.ns, "g", 8001)];
    let ip = g.ip().to_string();
    assert!(
        tcp(&world.host, &ip, 8000).is_some(),
        "the host on an allowed port"
    );
    assert_eq!(
        tcp(&world.host, &ip, 8001),
        None,
        "the host on another port"
    );
    assert!(
        tcp(&other.ns, &ip, 8000).is_some(),
        "another guest on an allowed port"
    );
    assert_eq!(
        tcp(&other.ns, &ip, 8001),
        None,
        "another guest on another port"
    );
    assert!(
        tcp(&world.upstream, UPSTREAM_HOST_SIDE, 9000).is_some(),
        "a port forward to an allowed port"
    );
    assert_eq!(
        tcp(&world.upstream, UPSTREAM_HOST_SIDE, 9001),
        None,
        "a port forward to another port"
    );
    assert_eq!(
        tcp(&world.host, "127.0.0.1", 9001),
        None,
        "from the host through a forward"
    );
}

#[test]
fn policy_set_at_runtime_applies_to_new_connections() {
    let (world, _servers) = world_with_allowed_host();
    let g = world.guest(
        "shared",
        &[
            "--name",
            "pol",
            "--allow-connect",
            &format!("{ALLOWED_HOST}:8080/tcp"),
        ],
    );
    assert_eq!(g.udhcpc(), g.ip());
    assert!(tcp(&g.ns, ALLOWED_HOST, 8080).is_some());
    assert_eq!(tcp(&g.ns, ALLOWED_HOST, 8081), None);
    let ls = must(&mut world.linnet(&["ls"]));
    assert!(ls.contains("connect 1"), "linnet ls shows the policy: {ls}");

    must(&mut world.linnet(&[
        "policy",
        "set",
        "--name",
        "pol",
        "--allow-connect",
        &format!("{ALLOWED_HOST}:8081/tcp"),
    ]));
    let shown: serde_json::Value = serde_json::from_str(&must(
        &mut world.linnet(&["policy", "show", "--name", "pol", "--json"]),
    ))
    .unwrap();
    assert_eq!(
        shown["policy"]["egress"],
        serde_json::json!([format!("{ALLOWED_HOST}:8081/tcp")])
    );
    assert_eq!(tcp(&g.ns, ALLOWED_HOST, 8080), None, "no longer allowed");
    assert!(tcp(&g.ns, ALLOWED_HOST, 8081).is_some(), "now allowed");

    must(&mut world.linnet(&["policy", "set", "--name", "pol"]));
    assert!(
        tcp(&g.ns, ALLOWED_HOST, 8080).is_some(),
        "an empty policy restricts nothing"
    );
    let err = failure(&mut world.linnet(&["policy", "set", "--name", "nosuch"]));
    assert!(
        err.contains("unknown interface: an interface named \"nosuch\""),
        "{err}"
    );
    let err =
        failure(&mut world.linnet(&["policy", "set", "--name", "pol", "--allow-listen", "0"]));
    assert!(err.contains("port 0 is out of range"), "{err}");
}
