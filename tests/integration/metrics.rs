//! `linnet daemon --metrics`: Prometheus' text format, scraped with curl
//! and checked against the traffic, lookups, spoofed frames, refusals and
//! attaches the test made.

use std::time::Duration;

use crate::harness::*;
use crate::rate_limits::iperf_server;

const SCRAPE: &str = "http://127.0.0.1:9464/metrics";

/// A scrape, from the daemon's namespace.
pub(crate) fn scrape(world: &World) -> String {
    must(&mut world.host.cmd(&["curl", "-sS", "--max-time", "5", SCRAPE]))
}

/// The value of the first sample of `name` with every one of `labels`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let metric = l.split(['{', ' ']).next().unwrap_or("");
            metric == name
                && labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

fn must_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(text, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{text}"))
}

/// TCP bytes from `guest` to the host's iperf3 server: `bytes` sent, and
/// what the server says it received.
fn send(guest: &Guest, port: u16, bytes: u64) -> u64 {
    let out = must(&mut guest.ns.cmd(&[
        "iperf3",
        "-c",
        &guest.gateway(),
        "-p",
        &port.to_string(),
        "-n",
        &bytes.to_string(),
        "-J",
    ]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    report["end"]["sum_received"]["bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("iperf3's report: {out}"))
}

#[test]
fn a_scrape_counts_what_the_vms_did() {
    let mut world = World::new();
    world.start_daemon_with(&[], &["--metrics", "9464"]);
    let listening = must(&mut world.host.cmd(&["ss", "-Htln"]));
    assert!(
        listening.contains("127.0.0.1:9464"),
        "a port alone binds loopback: {listening}"
    );
    let a = world.guest("shared", &["--name", "m1"]);
    let b = world.guest("shared", &["--name", "m2", "--rate-limit-out", "5mbit"]);
    assert_eq!((a.udhcpc(), b.udhcpc()), (a.ip(), b.ip()));
    let id = a.info["interface_id"].as_str().unwrap().to_string();
    let labels = [
        ("network", "shared"),
        ("interface_id", id.as_str()),
        ("name", "m1"),
    ];

    let before = scrape(&world);
    assert!(
        before.contains("# TYPE linnet_vm_sent_bytes_total counter"),
        "{before}"
    );
    let sent_before = must_value(&before, "linnet_vm_sent_bytes_total", &labels);
    let queries_before = must_value(
        &before,
        "linnet_network_dns_queries_total",
        &[("network", "shared")],
    );
    let _server = iperf_server(&world.host, 5310);
    let received = send(&a, 5310, 20_000_000);
    for _ in 0..3 {
        assert!(a.lookup("m2.shared.linnet", &a.gateway()).is_some());
    }
    // A frame from an address that is not its own.
    assert!(!a.ping_from("192.168.105.200/24", &a.gateway()));
    // An attach refused: an unknown network.
    let refused = world.attach_refused("nope", &[]);
    assert!(refused.contains("unknown network"), "{refused}");
    // The limited VM past its rate.
    send(&b, 5310, 4_000_000);

    let after = wait_for("the spoofed frame counted", Duration::from_secs(5), || {
        let text = scrape(&world);
        (value(&text, "linnet_vm_spoofed_drops_total", &labels) >= Some(1.0)).then_some(text)
    });
    let sent = must_value(&after, "linnet_vm_sent_bytes_total", &labels) - sent_before;
    // What the server received crossed the TAP, and no more than what the
    // client sent (-n) with the headers of the (mostly 64 KiB) frames that
    // carried it and a few retransmits. (iperf3's server may count less
    // than crossed: under load it read 16.5 MB of 18.1 MB.)
    let (received, sent_at_most) = (received as f64, 20_000_000.0 * 1.08 + 100_000.0);
    assert!(
        (received..=sent_at_most).contains(&sent),
        "the server received {received} bytes of TCP payload, the client sent 20000000; the metric grew by {sent}"
    );
    assert!(must_value(&after, "linnet_vm_sent_packets_total", &labels) >= received / 65536.0);
    assert!(must_value(&after, "linnet_vm_received_bytes_total", &labels) > 0.0);
    let queries = must_value(
        &after,
        "linnet_network_dns_queries_total",
        &[("network", "shared")],
    ) - queries_before;
    assert!(queries >= 3.0, "3 lookups, {queries} queries counted");
    assert_eq!(
        must_value(
            &after,
            "linnet_network_dhcp_leases",
            &[("network", "shared")]
        ),
        2.0
    );
    assert_eq!(
        must_value(
            &after,
            "linnet_network_interfaces",
            &[("network", "shared")]
        ),
        2.0
    );
    assert_eq!(
        must_value(
            &after,
            "linnet_errors_total",
            &[("kind", "unknown_network")]
        ),
        1.0
    );
    assert_eq!(
        must_value(&after, "linnet_attach_duration_seconds_count", &[]),
        2.0,
        "two attaches succeeded"
    );
    assert_eq!(
        must_value(
            &after,
            "linnet_attach_duration_seconds_bucket",
            &[("le", "+Inf")]
        ),
        2.0
    );
    assert!(must_value(&after, "linnet_connections", &[]) >= 2.0);
    let m2 = [("name", "m2"), ("way", "sent")];
    assert!(
        must_value(&after, "linnet_vm_rate_limited_drops_total", &m2) > 0.0,
        "4 MB at once past a 5 Mbit/s limit"
    );
    assert_eq!(
        value(
            &after,
            "linnet_vm_rate_limited_drops_total",
            &[("name", "m1")]
        ),
        None,
        "no limit, no sample"
    );

    // Only GET /metrics.
    let status = |argv: &[&str]| {
        let mut cmd = vec!["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"];
        cmd.extend_from_slice(argv);
        must(&mut world.host.cmd(&cmd))
    };
    assert_eq!(status(&["http://127.0.0.1:9464/"]), "404");
    assert_eq!(status(&["-X", "POST", SCRAPE]), "405");
    // Scrapers that say nothing do not hold up the next one: fifty of
    // them, each connected before the scrape, which is answered at once
    // (it waited 5 s for every four before). Up to three hundred, so the
    // oldest are dropped as new ones come.
    for silent in [50, 300] {
        let mut holder = Reaped(
            world
                .host
                .cmd(&["python3", "-c", SILENT, &silent.to_string()])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(holder.0.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), format!("connected {silent}"));
        let started = std::time::Instant::now();
        assert!(scrape(&world).contains("linnet_connections"));
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "{took:?} beside {silent} silent connections"
        );
    }
}

/// Opens argv[1] connections to the metrics address, says nothing on
/// them, and holds them.
const SILENT: &str = "import socket, sys, time\n\
                      held = [socket.create_connection(('127.0.0.1', 9464)) for _ in range(int(sys.argv[1]))]\n\
                      print('connected', len(held), flush=True)\n\
                      time.sleep(30)\n";

#[test]
fn metrics_on_a_port_in_use_fail_the_start_saying_so() {
    let world = World::new();
    let _holder = Reaped(
        world
            .host
            .cmd(&["busybox", "nc", "-l", "-p", "9464"])
            .spawn()
            .unwrap(),
    );
    wait_for("nc to listen", Duration::from_secs(5), || {
        must(&mut world.host.cmd(&["ss", "-Htln"]))
            .contains(":9464 ")
            .then_some(())
    });
    let err = failure(&mut world.linnet(&["daemon", "--metrics", "9464"]));
    assert!(
        err.contains("cannot serve metrics on 127.0.0.1:9464 (--metrics): is the port in use?"),
        "{err}"
    );
    assert!(
        !world.run_dir().join("linnet.sock").exists(),
        "nothing left"
    );
    let err = failure(&mut world.linnet(&["daemon", "--metrics", "localhost"]));
    assert!(err.contains("is not PORT or ADDR:PORT"), "{err}");
}
