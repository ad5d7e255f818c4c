//! IPv6: the kernel's own SLAAC in guest namespaces against linnet's router
//! advertisements, NAT66 to the upstream, AAAA for VM names, and DNS
//! answers of every type passed through unchanged (compared with dig).

use std::net::Ipv6Addr;
use std::time::Duration;

use crate::harness::*;

fn rdisc6(guest: &Guest) -> String {
    must(&mut guest.ns.cmd(&["rdisc6", "-1", "-w", "2000", "eth0"]))
}

/// One field of rdisc6's output ("Router lifetime : 1800 (...)" -> "1800").
fn field<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(key))
        .filter_map(|rest| rest.trim_start().strip_prefix(':'))
        .filter_map(|v| v.split_whitespace().next())
        .collect()
}

#[test]
fn guest_forms_its_slaac_address_and_reaches_gateway_peer_and_upstream_over_ipv6() {
    let mut world = World::new();
    world.start_daemon();
    let a = world.guest("shared", &["--name", "six-a"]);
    let b = world.guest("shared", &["--name", "six-b"]);
    let prefix = a.info["ipv6_prefix"].as_str().unwrap().to_string();
    assert_eq!(
        a.info["vmnet_nat66_prefix"].as_str(),
        prefix.strip_suffix("/64")
    );
    assert!(a.ipv6().starts_with(prefix.trim_end_matches(":/64")));

    assert_eq!(
        a.slaac_addresses(),
        vec![a.ipv6()],
        "the kernel's SLAAC forms exactly the ipv6_address of the attach JSON"
    );
    let routes = must(&mut a.ns.cmd(&["ip", "-6", "route", "show", "default"]));
    assert!(
        routes.contains("default via fe80::1 dev eth0 proto ra"),
        "default route via the gateway's link-local address: {routes}"
    );

    let ra = rdisc6(&a);
    assert_eq!(field(&ra, "Prefix"), vec![prefix.as_str()], "{ra}");
    assert_eq!(field(&ra, "Router lifetime"), vec!["1800"], "{ra}");
    assert_eq!(field(&ra, "MTU"), vec!["1500"], "{ra}");
    assert_eq!(
        field(&ra, "Recursive DNS server"),
        vec![a.gateway6().as_str()],
        "RDNSS names the gateway: {ra}"
    );
    assert_eq!(field(&ra, "DNS search list"), vec!["shared.linnet"], "{ra}");
    assert!(ra.contains("from fe80::1"), "{ra}");

    assert!(a.ping(&a.gateway6()), "guest pings the gateway over IPv6");
    assert_eq!(
        a.fetch(&format!("http://[{UPSTREAM_IP6}]/")).as_deref(),
        Some(format!("{UPSTREAM_PAGE}\n").as_str()),
        "NAT66 to the upstream's IPv6 address"
    );
    // AAAA for another VM, asked over IPv6 of the gateway.
    let aaaa = must(&mut a.ns.cmd(&[
        "dig",
        "+short",
        "+time=2",
        "AAAA",
        "six-b.shared.linnet",
        &format!("@{}", a.gateway6()),
    ]));
    assert_eq!(aaaa.trim(), b.ipv6(), "AAAA of another guest");
    assert_eq!(b.slaac_addresses(), vec![b.ipv6()]);
    assert!(a.ping(&b.ipv6()), "VM to VM over IPv6");
    let ls = must(&mut world.linnet(&["ls"]));
    assert!(
        ls.contains(&prefix) && ls.contains(&a.ipv6()) && ls.contains(&b.ipv6()),
        "linnet ls shows the prefix and the guests' addresses: {ls}"
    );
}

#[test]
fn host_network_has_ipv6_inside_but_no_default_route_and_no_way_out() {
    let mut world = World::new();
    world.start_daemon();
    let g = world.guest("host", &[]);
    assert!(g.info.get("vmnet_nat66_prefix").is_none(), "{}", g.info);
    assert_eq!(g.slaac_addresses(), vec![g.ipv6()]);
    let ra = rdisc6(&g);
    assert_eq!(
        field(&ra, "Router lifetime"),
        vec!["0"],
        "not a default router: {ra}"
    );
    let routes = must(&mut g.ns.cmd(&["ip", "-6", "route", "show", "default"]));
    assert_eq!(routes.trim(), "", "no default route on a host network");
    assert!(g.ping(&g.gateway6()), "the host is on-link");
    // A guest on shared beside it turns IPv6 forwarding on, and upstream
    // routes the host network's prefix back: were it not for linnet's
    // rule, the host guest's packets would go out and their answers come
    // back.
    let s = world.guest("shared", &[]);
    assert_eq!(s.slaac_addresses(), vec![s.ipv6()]);
    assert_eq!(
        must(
            &mut world
                .host
                .cmd(&["cat", "/proc/sys/net/ipv6/conf/all/forwarding"])
        )
        .trim(),
        "1",
        "IPv6 forwarding is on"
    );
    world.route_back(g.info["ipv6_prefix"].as_str().unwrap());
    // The route back works: the host's own address on the host network
    // hears upstream's answer.
    must(&mut world.host.cmd(&[
        "busybox",
        "ping",
        "-6",
        "-c",
        "1",
        "-W",
        "2",
        "-I",
        &g.gateway6(),
        UPSTREAM_IP6,
    ]));
    // Even with a route put in by hand, nothing is forwarded out.
    must(&mut g.ns.cmd(&[
        "ip", "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
    ]));
    // What upstream's link carries meanwhile: the shared guest's datagram
    // shows that the capture sees what gets out.
    let capture = Capture::start(&world.upstream, "eth0", 3);
    g.send_marker(UPSTREAM_IP6, "LINNET-host");
    s.send_marker(UPSTREAM_IP6, "LINNET-shared");
    assert_eq!(g.fetch(&format!("http://[{UPSTREAM_IP6}]/")), None);
    assert_eq!(
        capture.finish(),
        vec!["LINNET-shared"],
        "upstream's link carries the shared guest's datagram, never the host guest's"
    );
}

#[test]
fn router_advertisement_false_sends_none() {
    let mut world = World::with_config("networks:\n  shared:\n    router_advertisement: false\n");
    world.start_daemon();
    let g = world.guest("shared", &[]);
    let out = run(&mut g.ns.cmd(&["rdisc6", "-1", "-w", "1000", "-r", "2", "eth0"]));
    assert!(
        !out.status.success(),
        "no advertisement: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The gateway still holds its addresses; a guest configured by hand works.
    must(&mut g.ns.cmd(&[
        "ip",
        "addr",
        "add",
        &format!("{}/64", g.ipv6()),
        "dev",
        "eth0",
        "nodad",
    ]));
    assert!(g.ping(&g.gateway6()));
}

/// dig's view of an answer, without what differs between two servers
/// asked the same question (the message id, timings, the server line).
fn dig(guest: &Guest, server: &str, port: u16, args: &[&str]) -> String {
    let out = must(
        guest
            .ns
            .cmd(&[
                "dig",
                "+time=3",
                "+tries=1",
                "+noall",
                "+comments",
                "+answer",
                "+authority",
            ])
            .args(["-p", &port.to_string(), &format!("@{server}")])
            .args(args),
    );
    let mut lines: Vec<String> = Vec::new();
    for line in out.lines() {
        if let Some(status) = line.split("status: ").nth(1) {
            lines.push(format!("status {}", status.split(',').next().unwrap()));
        } else if !line.starts_with(';') && !line.trim().is_empty() {
            lines.push(line.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    lines.join("\n")
}

#[test]
fn dns_passes_every_record_type_and_error_through_unchanged() {
    let mut world = World::with_config(&format!(
        "networks:\n  shared:\n    dns: {{ upstream: ['{UPSTREAM_IP}:5353'] }}\n"
    ));
    let _dns = world.start_testdns(5353);
    world.start_daemon();
    let g = world.guest("shared", &[]);
    assert_eq!(g.udhcpc(), g.ip());
    g.slaac_addresses();
    let questions: &[&[&str]] = &[
        &["A", "web.upstream.test"],
        &["AAAA", "web.upstream.test"],
        &["SOA", "upstream.test"],
        &["SRV", "_http._tcp.upstream.test"],
        &["PTR", "254.113.0.203.in-addr.arpa"],
        &["TXT", "txt.upstream.test"],
        &["MX", "mail.upstream.test"],
        &["A", "alias.upstream.test"],
        &["A", "nope.upstream.test"],
        &["MX", "web.upstream.test"],
        &["A", "fail.upstream.test"],
        &["+tcp", "TXT", "txt.upstream.test"],
    ];
    let expected_status = [
        "NOERROR", "NOERROR", "NOERROR", "NOERROR", "NOERROR", "NOERROR", "NOERROR", "NOERROR",
        "NXDOMAIN", "NOERROR", "SERVFAIL", "NOERROR",
    ];
    for (q, status) in questions.iter().zip(expected_status) {
        let direct = dig(&g, UPSTREAM_IP, 5353, q);
        assert!(
            direct.starts_with(&format!("status {status}")),
            "{q:?} upstream: {direct}"
        );
        assert!(
            status != "NOERROR" || direct.lines().count() > 1,
            "{q:?} has records: {direct}"
        );
        for server in [g.gateway(), g.gateway6()] {
            assert_eq!(
                dig(&g, &server, 53, q),
                direct,
                "{q:?} through linnet's DNS on {server}"
            );
        }
    }
    let chain = dig(&g, &g.gateway(), 53, &["A", "alias.upstream.test"]);
    assert_eq!(chain.matches("CNAME").count(), 2, "{chain}");
}

#[test]
fn ipv6_prefix_that_overlaps_a_route_is_refused() {
    let mut world =
        World::with_config("networks:\n  shared:\n    ipv6_prefix: '2001:db8:113::/64'\n");
    world.start_daemon();
    let out = run(&mut world.linnet(&["run", "--", "true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("ipv6_prefix 2001:db8:113::/64 overlaps route 2001:db8:113::/64 on interface"),
        "{err}"
    );
}

/// eth0's IPv6 addresses of `scope` (global, link) that are past their
/// duplicate address detection.
fn usable6(g: &Guest, scope: &str) -> Vec<Ipv6Addr> {
    must(&mut g.ns.cmd(&[
        "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", scope,
    ]))
    .lines()
    .filter(|l| !l.contains("tentative"))
    .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet6").nth(1))
    .map(|a| a.split('/').next().unwrap().parse().unwrap())
    .collect()
}

/// Gives eth0 `addr` (/64; `nodad`: without its probe) and waits until it
/// may be used.
fn add6(g: &Guest, addr: Ipv6Addr, nodad: bool) {
    let cidr = format!("{addr}/64");
    let mut args = vec!["ip", "-6", "addr", "add", &cidr, "dev", "eth0"];
    if nodad {
        args.push("nodad");
    }
    must(&mut g.ns.cmd(&args));
    wait_for(&format!("{addr} past DAD"), Duration::from_secs(10), || {
        (usable6(g, "global").iter().chain(&usable6(g, "link")))
            .any(|a| *a == addr)
            .then_some(())
    });
}

fn ping_from(g: &Guest, source: Ipv6Addr, target: &str) -> bool {
    run(&mut g.ns.cmd(&[
        "busybox",
        "ping",
        "-6",
        "-c",
        "1",
        "-W",
        "2",
        "-I",
        &source.to_string(),
        target,
    ]))
    .status
    .success()
}

/// The addresses the daemon lists as formed by `g`'s VM.
fn formed(world: &World, g: &Guest) -> Vec<Ipv6Addr> {
    let listed = world.listed_interface(&g.info["interface_id"]);
    (listed["ipv6_formed"]
        .as_array()
        .cloned()
        .unwrap_or_default())
    .iter()
    .map(|a| a.as_str().unwrap().parse().unwrap())
    .collect()
}

#[test]
fn addresses_a_guest_forms_itself_are_learned_from_its_duplicate_address_detection() {
    let mut world = World::new();
    world.start_daemon();
    let events = crate::events::Follower::start(&world, &["--network", "shared"]);
    let a = world.guest("shared", &["--name", "formed-a"]);
    let b = world.guest("shared", &["--name", "formed-b"]);
    let prefix: ipnet::Ipv6Net = a.info["ipv6_prefix"].as_str().unwrap().parse().unwrap();
    let in_prefix = |iid: u64| Ipv6Addr::from(u128::from(prefix.network()) | u128::from(iid));
    let eui64: Ipv6Addr = a.ipv6().parse().unwrap();
    assert_eq!(a.slaac_addresses(), vec![a.ipv6()]);
    assert!(formed(&world, &a).is_empty(), "nothing formed yet");

    // Stable-privacy addresses (RFC 7217), as NetworkManager has the
    // kernel form them: link-local and in the prefix, neither EUI-64.
    must(&mut a.ns.cmd(&[
        "sysctl",
        "-qw",
        "net.ipv6.conf.eth0.stable_secret=2001:db8:1:2:3:4:5:6",
    ]));
    must(&mut a.ns.cmd(&["ip", "link", "set", "eth0", "down"]));
    must(
        &mut a
            .ns
            .cmd(&["ip", "link", "set", "eth0", "addrgenmode", "stable_secret"]),
    );
    must(&mut a.ns.cmd(&["ip", "link", "set", "eth0", "up"]));
    let stable = wait_for("a stable-privacy address", Duration::from_secs(15), || {
        let global = usable6(&a, "global");
        let link = usable6(&a, "link");
        (global.len() == 1 && link.len() == 1).then(|| (global[0], link[0]))
    });
    assert_ne!(stable.0, eui64, "not the EUI-64 address");
    assert!(prefix.contains(&stable.0), "{stable:?}");
    let learned = events.next("ipv6_learned");
    assert_eq!(learned["interface_id"], a.info["interface_id"], "{learned}");
    let mut listed = formed(&world, &a);
    listed.sort();
    let mut expected = vec![stable.0, stable.1];
    expected.sort();
    assert_eq!(listed, expected, "linnet ls lists what the guest formed");
    assert!(
        a.ping(&a.gateway6()),
        "the gateway, from the stable address"
    );
    assert!(a.ping(&b.ipv6()), "another VM");
    assert_eq!(
        a.fetch(&format!("http://[{UPSTREAM_IP6}]/")).as_deref(),
        Some(format!("{UPSTREAM_PAGE}\n").as_str()),
        "upstream through NAT66"
    );

    // An address set by hand is probed, then learned; one set without
    // its probe (nodad) is not, and its packets are dropped: the same
    // probe from each.
    let by_hand = in_prefix(0xab_00cd_00ef_0001);
    let unprobed = in_prefix(0xab_00cd_00ef_0002);
    add6(&a, by_hand, false);
    assert!(ping_from(&a, by_hand, &a.gateway6()), "a probed address");
    add6(&a, unprobed, true);
    let drops = crate::guard::spoofed_drops(&world, &a).unwrap();
    assert!(
        !ping_from(&a, unprobed, &a.gateway6()),
        "no probe, not learned"
    );
    assert!(crate::guard::spoofed_drops(&world, &a).unwrap() > drops);
    assert!(formed(&world, &a).contains(&by_hand) && !formed(&world, &a).contains(&unprobed));

    // What a probe cannot claim: another MAC's EUI-64 address, another
    // VM's address.
    let others_eui64 = in_prefix(0x5054_00ff_fe00_4242);
    add6(&a, others_eui64, false);
    let refused = events.next("ipv6_refused");
    assert_eq!(
        refused["ipv6_address"],
        others_eui64.to_string(),
        "{refused}"
    );
    assert_eq!(refused["reason"], "the EUI-64 address of another MAC");
    assert!(!ping_from(&a, others_eui64, &a.gateway6()));
    add6(&b, by_hand, false);
    let refused = events.next("ipv6_refused");
    assert_eq!(refused["interface_id"], b.info["interface_id"], "{refused}");
    assert_eq!(refused["reason"], "another VM's");
    assert!(
        !ping_from(&b, by_hand, &b.gateway6()),
        "a's address, from b"
    );
    let b_own: Ipv6Addr = b.ipv6().parse().unwrap();
    assert!(ping_from(&b, b_own, &b.gateway6()), "b's own, from b");

    // A daemon after this one keeps what a learned.
    drop(events);
    world.stop_daemon();
    world.start_daemon();
    assert!(formed(&world, &a).contains(&by_hand));
    assert!(ping_from(&a, by_hand, &a.gateway6()), "after a restart");
}
