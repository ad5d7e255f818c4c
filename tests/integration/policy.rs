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
    world_with_allowed_host_and(World::new())
}

/// `world_with_allowed_host` on `world` (its own networks.yaml).
fn world_with_allowed_host_and(mut world: World) -> (World, [Reaped; 2]) {
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

#[test]
fn allow_connect_holds_for_udp_icmp_ipv6_dhcp_port_and_invalid_packets() {
    let (world, _servers) = world_with_allowed_host();
    let _dhcp_port = echo_serve(&world.upstream, "up", 67);
    let g = world.guest(
        "shared",
        &[
            "--allow-connect",
            &format!("{ALLOWED_HOST}:8080/tcp"),
            "--allow-connect",
            &format!("[{UPSTREAM_IP6}]:8081/tcp"),
        ],
    );
    assert_eq!(g.udhcpc(), g.ip(), "DHCP with the gateway passes");
    g.slaac_addresses();
    let answer = |host: &str| Reply::Answer(format!("up from {host}"));
    assert_eq!(
        echo_try(&g.ns, ALLOWED_HOST, 8080, "tcp"),
        answer(UPSTREAM_HOST_SIDE)
    );
    assert_eq!(
        echo_try(&g.ns, ALLOWED_HOST, 8080, "udp"),
        Reply::Refused,
        "UDP to a port allowed for TCP"
    );
    assert_eq!(
        echo_try_as(&g.ns, UPSTREAM_IP, 67, "udp", Some(&g.mac())),
        Reply::Refused,
        "UDP to port 67 of a host that is not the gateway"
    );
    assert!(!g.ping(UPSTREAM_IP), "ICMP to a host not allowed");
    assert_eq!(
        echo_try(&g.ns, UPSTREAM_IP6, 8081, "tcp"),
        answer(UPSTREAM_HOST_SIDE6),
        "IPv6 to the allowed port"
    );
    assert_eq!(
        echo_try(&g.ns, UPSTREAM_IP6, 8080, "tcp"),
        Reply::Refused,
        "IPv6 to another port"
    );

    // A segment conntrack cannot place never reaches the upstream.
    let capture = Capture::start(&world.upstream, "eth0", 2);
    let echo = repo_file("tests/echo_peer.py");
    let ip = g.ip().to_string();
    must(
        &mut g
            .ns
            .cmd(&["python3", &echo, "invalid", &ip, UPSTREAM_IP, "8081"]),
    );
    let seen = capture.finish();
    assert!(seen.is_empty(), "an invalid segment got out: {seen:?}");
}

#[test]
fn allow_listen_holds_for_broadcast_and_multicast_too() {
    let mut world = World::new();
    world.start_daemon();
    let g = crate::guard::ready(&world, &["--allow-listen", "8000"]);
    let sender = crate::guard::ready(&world, &[]);
    let bystander = crate::guard::ready(&world, &[]);
    let kinds = ["honest", "honest-8000", "honest6"];
    let everything: Vec<String> = kinds.iter().map(|k| format!("LINNET-{k}")).collect();
    assert_eq!(
        crate::guard::send_and_capture(&sender, &bystander, &kinds),
        everything,
        "a VM without a listen policy gets them all"
    );
    assert_eq!(
        crate::guard::send_and_capture(&sender, &g, &kinds),
        vec!["LINNET-honest-8000".to_string()],
        "a listen policy of 8000 lets only port 8000 in"
    );
    assert_eq!(
        crate::guard::send_and_capture(&sender, &g, &["bcast-in-unicast"]),
        Vec::<String>::new(),
        "nor a broadcast address in a frame to the VM's own MAC"
    );
    assert_eq!(
        crate::guard::send_and_capture(&sender, &bystander, &["bcast-in-unicast"]),
        vec!["LINNET-bcast-in-unicast".to_string()],
        "(the same to a VM without a policy arrives)"
    );
    // What its network needs still arrives: DHCP (broadcast offers), the
    // router's advertisements (multicast), neighbour discovery.
    assert_eq!(g.udhcpc(), g.ip());
    assert!(sender.ping(&g.ip().to_string()), "ARP and ping");
    assert!(sender.ping(&g.ipv6()), "neighbour discovery");
    let ls = must(&mut world.linnet(&[
        "policy",
        "set",
        "--interface-id",
        g.info["interface_id"].as_str().unwrap(),
        "--allow-listen",
        "9999/udp",
    ]));
    assert!(ls.contains("9999"), "{ls}");
    assert_eq!(
        crate::guard::send_and_capture(&sender, &g, &kinds),
        vec!["LINNET-honest".to_string(), "LINNET-honest6".to_string()],
        "policy set changes the ports at once"
    );
}

#[test]
fn a_policy_applies_to_new_connections_and_one_opened_before_carries_on() {
    let (world, _servers) = world_with_allowed_host();
    let script = repo_file("tests/echo_peer.py");
    let (_server, ready) =
        spawn_until_first_line(
            world
                .upstream
                .cmd(&["python3", &script, "serve-lines", "7000"]),
        );
    assert_eq!(ready, "serving");
    let g = world.guest("shared", &["--name", "early"]);
    assert_eq!(g.udhcpc(), g.ip());
    let mut chat = Chat::open(&g.ns, UPSTREAM_IP, 7000);
    let mut ask = |text: &str| chat.ask(text);
    assert_eq!(ask("one"), "echo one");
    must(&mut world.linnet(&[
        "policy",
        "set",
        "--name",
        "early",
        "--allow-connect",
        &format!("{ALLOWED_HOST}:8080/tcp"),
    ]));
    assert_eq!(
        ask("two"),
        "echo two",
        "the connection opened before the policy carries on"
    );
    assert_eq!(
        echo_try(&g.ns, UPSTREAM_IP, 7000, "tcp"),
        Reply::Refused,
        "a new one meets the policy"
    );
}

/// Two networks with the same default policy, enforced on `shared` only.
fn enforced_and_not() -> String {
    format!(
        "networks:
  shared:
    allow: {{ users: [root, nobody] }}
    policy: {{ egress: ['{ALLOWED_HOST}:8080/tcp'], enforced: true }}
    rate_limit: {{ out: 100mbit, enforced: true }}
  open:
    subnet: 10.61.0.0/24
    policy: {{ egress: ['{ALLOWED_HOST}:8080/tcp'] }}
"
    )
}

#[test]
fn an_enforced_policy_cannot_be_widened_by_attach_or_policy_set_and_an_unenforced_one_can() {
    let (world, _servers) = world_with_allowed_host_and(World::with_config(&enforced_and_not()));
    let within = |what: &str| format!("network \"shared\" holds its VMs to its {what}");
    // An attach that asks for more, by its owner: refused, naming why.
    let err = failure(&mut world.linnet_wrapped(
        AS_NOBODY,
        &[
            "run",
            "--network",
            "shared",
            "--allow-connect",
            "0.0.0.0/0",
            "--",
            "true",
        ],
    ));
    assert!(
        err.contains(&format!(
            "{} (networks.yaml: policy.enforced): connecting to 0.0.0.0/0 is not within its connect rules ({ALLOWED_HOST}:8080/tcp)",
            within("policy")
        )),
        "{err}"
    );
    let err = failure(&mut world.linnet(&[
        "run",
        "--network",
        "shared",
        "--rate-limit-out",
        "1gbit",
        "--",
        "true",
    ]));
    assert!(err.contains(&within("rate_limit")), "{err}");
    // A VM with the network's policy reaches what it allows and nothing else.
    let g = world.guest("shared", &["--name", "held"]);
    assert_eq!(g.udhcpc(), g.ip());
    let reaches = |ns: &Netns, port| echo_try(ns, ALLOWED_HOST, port, "tcp");
    let answer = Reply::Answer(format!("up from {UPSTREAM_HOST_SIDE}"));
    assert_eq!(reaches(&g.ns, 8080), answer);
    assert_eq!(reaches(&g.ns, 8081), Reply::Refused);
    let shown = must(&mut world.linnet(&["policy", "show", "--name", "held"]));
    assert!(
        shown.contains(
            "enforced: its connect and listen rules and its rate are the most it may have"
        ),
        "{shown}"
    );
    // `policy set` that widens, or lifts everything: refused, nothing changed.
    for widen in [
        &["--allow-connect", &format!("{ALLOWED_HOST}:8081/tcp")][..],
        &[],
    ] {
        let mut argv = vec!["policy", "set", "--name", "held"];
        argv.extend_from_slice(widen);
        let err = failure(&mut world.linnet(&argv));
        assert!(err.contains(&within("policy")), "{widen:?}: {err}");
    }
    assert_eq!(reaches(&g.ns, 8080), answer);
    assert_eq!(reaches(&g.ns, 8081), Reply::Refused, "still held");
    // Narrowing is the owner's: the rate lower, the rules the same.
    must(&mut world.linnet(&[
        "policy",
        "set",
        "--name",
        "held",
        "--allow-connect",
        &format!("{ALLOWED_HOST}:8080/tcp"),
        "--rate-limit",
        "50mbit",
    ]));
    // On `open`, the same default, not enforced: the same change is made.
    let o = world.guest("open", &["--name", "loose"]);
    assert_eq!(o.udhcpc(), o.ip());
    assert_eq!(reaches(&o.ns, 8081), Reply::Refused, "its default holds");
    must(&mut world.linnet(&[
        "policy",
        "set",
        "--network",
        "open",
        "--name",
        "loose",
        "--allow-connect",
        &format!("{ALLOWED_HOST}:8081/tcp"),
    ]));
    assert_eq!(reaches(&o.ns, 8081), answer, "widened where not enforced");
    let shown =
        must(&mut world.linnet(&["policy", "show", "--network", "open", "--name", "loose"]));
    assert!(!shown.contains("enforced"), "{shown}");
}
