//! The name at the connection (`linnet-gate`): a VM whose policy names
//! `allowed.test:443` reaches it only with connections that show that
//! name (TLS server name, HTTP Host) at an address it learned for that
//! very name. The upstream serves every name on every address
//! (tests/name_peer.py answers with the name it was shown), so a guest
//! without a policy beside each probe shows the same probe succeeding.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;
use crate::names::logged;

const ALLOWED: &str = "198.51.100.1";
const SVC: &str = "198.51.100.2";
/// name_peer.py's HTTP port (the upstream's 80 is its web page's).
const HTTP: u16 = 8000;

/// The upstream with the test names' first two addresses, serving HTTP
/// (HTTP) and TLS (443) on each.
fn world() -> (World, Reaped) {
    world_with(None)
}

/// The same, with networks.yaml `yaml`.
fn world_with(yaml: Option<&str>) -> (World, Reaped) {
    let mut world = match yaml {
        Some(yaml) => World::with_config(yaml),
        None => World::new(),
    };
    for ip in [ALLOWED, SVC] {
        must(
            &mut world
                .upstream
                .cmd(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]),
        );
    }
    let script = repo_file("tests/name_peer.py");
    let pem = repo_file("tests/fixtures/name_peer.pem");
    let (server, ready) =
        spawn_until_first_line(world.upstream.cmd(&["python3", &script, "serve", &pem]));
    assert_eq!(ready, "serving");
    world.start_daemon_with(&[], &["--metrics", "9464"]);
    (world, server)
}

/// What `fetch ADDRESS PORT ARGS` of tests/name_peer.py got from `ns`:
/// the answer's first line, or "refused" (a reset) or "silent".
pub fn fetch(ns: &Netns, address: &str, port: u16, args: &[&str]) -> String {
    let script = repo_file("tests/name_peer.py");
    let port = port.to_string();
    let mut argv = vec!["python3", script.as_str(), "fetch", address, port.as_str()];
    argv.extend_from_slice(args);
    let out = run(&mut ns.cmd(&argv));
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match out.status.code() {
        Some(0 | 3 | 4) => said,
        _ => panic!(
            "the probe itself failed ({:?}): {said} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

const SANDBOX: &[&str] = &[
    "--name",
    "sandbox",
    "--allow-connect",
    "allowed.test:443",
    "--allow-connect",
    "allowed.test:8000",
    "--allow-connect",
    "*.svc.test:443",
];

/// The sandbox, with both its names resolved through linnet's DNS.
fn sandbox(world: &World) -> Guest {
    let g = world.guest("shared", SANDBOX);
    assert_eq!(g.udhcpc(), g.ip());
    assert_eq!(g.lookup("allowed.test", &g.gateway()), Some(ALLOWED.into()));
    assert_eq!(g.lookup("a.svc.test", &g.gateway()), Some(SVC.into()));
    g
}

/// Each probe: (what, address, port, arguments, what the sandbox gets);
/// the open guest gets the name it showed every time.
const PROBES: &[(&str, &str, u16, &[&str], &str)] = &[
    (
        "its name over TLS",
        ALLOWED,
        443,
        &["--sni", "allowed.test"],
        "sni=allowed.test host=allowed.test",
    ),
    (
        "its name over HTTP",
        ALLOWED,
        HTTP,
        &["--plain", "--host", "allowed.test"],
        "host=allowed.test",
    ),
    (
        "a ClientHello in two TCP segments",
        ALLOWED,
        443,
        &["--sni", "allowed.test", "--split", "segments"],
        "sni=allowed.test host=allowed.test",
    ),
    (
        "a ClientHello in two TLS records",
        ALLOWED,
        443,
        &["--sni", "allowed.test", "--split", "records"],
        "sni=allowed.test host=allowed.test",
    ),
    (
        "the other allowed name at its own address",
        SVC,
        443,
        &["--sni", "a.svc.test"],
        "sni=a.svc.test host=a.svc.test",
    ),
    (
        "another name by SNI at the same address",
        ALLOWED,
        443,
        &["--sni", "other.test"],
        "refused",
    ),
    (
        "another name by Host at the same address",
        ALLOWED,
        HTTP,
        &["--plain", "--host", "other.test"],
        "refused",
    ),
    (
        "TLS without a server name",
        ALLOWED,
        443,
        &["--no-sni", "--host", "allowed.test"],
        "refused",
    ),
    (
        "bytes that are neither TLS nor HTTP",
        ALLOWED,
        HTTP,
        &["--raw"],
        "refused",
    ),
    (
        "an allowed name at the other allowed name's address",
        ALLOWED,
        443,
        &["--sni", "a.svc.test"],
        "refused",
    ),
];

fn answer_of(args: &[&str]) -> String {
    let shown = |flag: &str| {
        args.iter()
            .position(|a| *a == flag)
            .map(|i| args[i + 1].to_string())
    };
    if args.contains(&"--raw") {
        return "bad".into();
    }
    let host = shown("--host").or(shown("--sni")).unwrap();
    if args.contains(&"--plain") {
        format!("host={host}")
    } else {
        format!("sni={} host={host}", shown("--sni").unwrap_or("-".into()))
    }
}

#[test]
fn a_sandbox_reaches_its_names_only_by_showing_them_at_their_own_addresses() {
    let (world, _server) = world();
    let follower = crate::events::Follower::start(&world, &["--network", "shared"]);
    let g = sandbox(&world);
    let open = world.guest("shared", &["--name", "open"]);
    assert_eq!(open.udhcpc(), open.ip());
    for (what, address, port, args, sandbox_gets) in PROBES {
        assert_eq!(
            fetch(&open.ns, address, *port, args),
            answer_of(args),
            "the open guest: {what}"
        );
        assert_eq!(
            fetch(&g.ns, address, *port, args),
            *sandbox_gets,
            "the sandbox: {what}"
        );
    }
    // Each judged connection on record: the allowed ones with their name,
    // the refused with what they showed and why.
    let id = &g.info["interface_id"];
    let mut records: Vec<Value> = Vec::new();
    while records.len() < PROBES.len() {
        let r = follower.next("connection");
        assert_eq!(r["interface_id"], *id, "{r}");
        records.push(r);
    }
    let allowed: Vec<&Value> = records.iter().filter(|r| r["allowed"] == true).collect();
    assert_eq!(allowed.len(), 5, "{records:#?}");
    assert_eq!(
        (
            &allowed[0]["shown"],
            &allowed[0]["destination"],
            &allowed[0]["port"],
            &allowed[0]["name"]
        ),
        (
            &Value::from("allowed.test"),
            &Value::from(ALLOWED),
            &Value::from(443),
            &Value::from("sandbox")
        )
    );
    let refused: Vec<(&Value, &str)> = records
        .iter()
        .filter(|r| r["allowed"] == false)
        .map(|r| (&r["shown"], r["why"].as_str().unwrap()))
        .collect();
    assert_eq!(refused.len(), 5, "{records:#?}");
    assert_eq!(refused[0].0, "other.test");
    assert!(
        refused[0].1.contains("not allowed on this port"),
        "{refused:?}"
    );
    assert_eq!(refused[1].0, "other.test");
    assert_eq!(*refused[2].0, Value::Null);
    assert!(refused[2].1.contains("showed no name"), "{refused:?}");
    assert!(refused[3].1.contains("neither TLS nor HTTP"), "{refused:?}");
    assert_eq!(refused[4].0, "a.svc.test");
    assert!(
        refused[4].1.contains("not an address the VM learned"),
        "{refused:?}"
    );
    // And counted per VM.
    let metrics = crate::metrics::scrape(&world);
    for (verdict, n) in [("allowed", 5), ("refused", 5)] {
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with("linnet_vm_gate_connections_total")
                    && l.contains("name=\"sandbox\"")
                    && l.contains(&format!("verdict=\"{verdict}\""))
            })
            .unwrap_or_else(|| panic!("no {verdict} count:\n{metrics}"));
        assert!(line.ends_with(&format!(" {n}")), "{line}");
    }
}

#[test]
fn a_rule_with_any_lets_nameless_connections_through_to_its_addresses_only() {
    let (world, _server) = world();
    let g = world.guest(
        "shared",
        &[
            "--allow-connect",
            "allowed.test:8000/tcp/any",
            "--allow-connect",
            "a.svc.test:443",
        ],
    );
    assert_eq!(g.udhcpc(), g.ip());
    assert_eq!(g.lookup("allowed.test", &g.gateway()), Some(ALLOWED.into()));
    assert_eq!(
        fetch(&g.ns, ALLOWED, HTTP, &["--raw"]),
        "bad",
        "nameless, allowed by /any"
    );
    assert_eq!(
        fetch(&g.ns, SVC, 443, &["--no-sni", "--host", "a.svc.test"]),
        "refused",
        "not learned (a.svc.test not asked for yet)"
    );
    assert_eq!(g.lookup("a.svc.test", &g.gateway()), Some(SVC.into()));
    assert_eq!(
        fetch(&g.ns, SVC, 443, &["--no-sni", "--host", "a.svc.test"]),
        "refused",
        "a rule without /any: a name must be shown"
    );
    assert_eq!(
        fetch(&g.ns, SVC, 443, &["--sni", "a.svc.test"]),
        "sni=a.svc.test host=a.svc.test"
    );
}

/// The daemon's `linnet-gate`: its pid, once it runs.
fn gate_pid(world: &World) -> u32 {
    child_named(world, "linnet-gate", None)
}

/// The daemon's child called `comm` (other than `not`): its pid, once it
/// runs.
pub(crate) fn child_named(world: &World, comm: &str, not: Option<u32>) -> u32 {
    let daemon = world.daemon_pid().to_string();
    wait_for(&format!("{comm} to run"), Duration::from_secs(5), || {
        std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let named = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (named.trim() == comm && proc_status(pid, "PPid") == daemon && Some(pid) != not)
                .then_some(pid)
        })
    })
}

#[test]
fn the_gate_runs_unprivileged_and_confined_and_nothing_passes_while_it_is_down() {
    let (world, _server) = world();
    let g = sandbox(&world);
    let pid = gate_pid(&world);
    assert_eq!(
        proc_status(pid, "Uid").split_whitespace().next(),
        Some("2137784319")
    );
    assert_eq!(proc_status(pid, "CapEff"), "0000000000000000");
    assert_eq!(proc_status(pid, "CapPrm"), "0000000000000000");
    assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
    assert_eq!(proc_status(pid, "Seccomp"), "2", "confined");
    let allowed = ["--sni", "allowed.test"];
    let other = ["--sni", "other.test"];
    assert_eq!(
        fetch(&g.ns, ALLOWED, 443, &allowed),
        "sni=allowed.test host=allowed.test"
    );
    // Killed: until another runs, held connections are refused, the
    // other name's as ever; then the allowed name passes again.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = Instant::now();
    assert_eq!(fetch(&g.ns, ALLOWED, 443, &other), "refused");
    let again = gate_pid(&world);
    assert_ne!(again, pid);
    assert!(
        killed.elapsed() < Duration::from_secs(3),
        "{:?}",
        killed.elapsed()
    );
    wait_for(
        "the allowed name to pass again",
        Duration::from_secs(5),
        || {
            (fetch(&g.ns, ALLOWED, 443, &allowed) == "sni=allowed.test host=allowed.test")
                .then_some(())
        },
    );
    assert_eq!(fetch(&g.ns, ALLOWED, 443, &other), "refused");
    assert!(
        world.daemon_log_text().contains("linnet-gate stopped"),
        "the daemon says so"
    );
}

#[test]
fn a_daemon_restart_cuts_no_allowed_connection_and_the_check_holds_after_it() {
    let (mut world, _server) = world();
    let g = sandbox(&world);
    // An allowed download, paused mid-way while the daemon restarts.
    let script = repo_file("tests/name_peer.py");
    let mut download = Reaped(
        g.ns.cmd(&[
            "python3",
            &script,
            "fetch",
            ALLOWED,
            "443",
            "--sni",
            "allowed.test",
            "--path",
            "/bytes/4000000",
            "--pause",
            "4",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(1));
    world.kill_daemon();
    world.start_daemon_with(&[], &["--metrics", "9464"]);
    let follower = crate::events::Follower::start(&world, &["--network", "shared"]);
    let mut said = String::new();
    std::io::Read::read_to_string(&mut download.stdout.take().unwrap(), &mut said).unwrap();
    download.wait().unwrap();
    assert_eq!(
        said.trim(),
        "bytes=4000000",
        "the connection allowed before the restart carried on"
    );
    // Checked as before: the addresses read back from the kernel serve
    // the names their rule allows, without the VM asking again.
    let allowed = fetch(&g.ns, ALLOWED, 443, &["--sni", "allowed.test"]);
    let judged = follower.next("connection");
    assert_eq!(allowed, "sni=allowed.test host=allowed.test", "{judged}");
    assert_eq!(judged["allowed"], true, "{judged}");
    assert_eq!(
        fetch(&g.ns, ALLOWED, 443, &["--sni", "other.test"]),
        "refused"
    );
    let judged = follower.next("connection");
    assert_eq!(judged["shown"], "other.test", "{judged}");
}

/// `g`, its address configured, resolves allowed.test through linnet's
/// DNS, reaches it by its name and is refused under another name at the
/// same address.
fn holds_the_name(what: &str, g: &Guest) {
    assert_eq!(g.udhcpc(), g.ip(), "{what}");
    reaches_only_its_name(what, g, &g.gateway());
}

fn reaches_only_its_name(what: &str, g: &Guest, gateway: &str) {
    assert_eq!(
        g.lookup("allowed.test", gateway),
        Some(ALLOWED.into()),
        "{what}"
    );
    assert_eq!(
        fetch(&g.ns, ALLOWED, 443, &["--sni", "allowed.test"]),
        "sni=allowed.test host=allowed.test",
        "{what}: its name"
    );
    assert_eq!(
        fetch(&g.ns, ALLOWED, 443, &["--sni", "other.test"]),
        "refused",
        "{what}: another name"
    );
}

#[test]
fn the_check_holds_on_every_datapath_a_network_socket_a_clone_and_in_a_rootless_daemon() {
    // The network's own policy is what a socket's VM gets.
    let (world, _server) = world_with(Some(
        "networks:\n  shared:\n    socket: true\n    allow: { users: [root] }\n    policy: { egress: [\"allowed.test:443\"] }\n",
    ));
    // The control: a guest open by address gets the other name answered.
    let open = world.guest("shared", &["--allow-connect", "0.0.0.0/0"]);
    assert_eq!(open.udhcpc(), open.ip());
    assert_eq!(
        fetch(&open.ns, ALLOWED, 443, &["--sni", "other.test"]),
        "sni=other.test host=other.test"
    );
    let rule = ["--allow-connect", "allowed.test:443"];
    for via in [
        Via::RunDgram,
        Via::RunStream,
        Via::HelperStream,
        Via::RunVhostUser,
    ] {
        holds_the_name(&format!("{via:?}"), &world.guest_via("shared", via, &rule));
    }
    holds_the_name(
        "a network socket's VM",
        &crate::network_sockets::socket_guest(&world, "52:54:00:aa:bb:01"),
    );
    // A clone of a guest (the same address in a namespace of its own).
    let original = world.guest("shared", &["--name", "snap"]);
    let ip = original.udhcpc();
    let gateway = original.gateway();
    let clone = world.guest("shared", &["--clone-of", "snap", "--name", "snap-1"]);
    crate::clones::restore(&clone, ip, &gateway);
    reaches_only_its_name("the clone", &clone, &gateway);
    // A user's own daemon, with its own gate.
    let user = crate::rootless::Tenant::new(&world, 4321);
    let open = user.guest(&world, "shared", &[]);
    assert_eq!(open.udhcpc(), open.ip());
    assert_eq!(
        fetch(&open.ns, ALLOWED, 443, &["--sni", "other.test"]),
        "sni=other.test host=other.test",
        "rootless: the control"
    );
    holds_the_name("rootless", &user.guest(&world, "shared", &rule));
}

#[test]
fn judged_connections_are_in_the_audit_log_and_a_flood_of_refusals_leaves_it_bounded() {
    let keep = tempfile::tempdir().unwrap();
    let audit = keep.path().join("shared.jsonl");
    let yaml = format!("networks:\n  shared:\n    audit_log: {}\n", audit.display());
    let (world, _server) = world_with(Some(&yaml));
    let g = sandbox(&world);
    assert_eq!(
        fetch(
            &g.ns,
            ALLOWED,
            443,
            &["--sni", "allowed.test", "--path", "/bytes/300000"]
        ),
        "bytes=300000"
    );
    let ended = wait_for(
        "the allowed connection's end",
        Duration::from_secs(30),
        || logged(&audit, "connection_end").into_iter().next(),
    );
    assert_eq!(
        (
            &ended["shown"],
            &ended["destination"],
            &ended["port"],
            &ended["name"]
        ),
        (
            &Value::from("allowed.test"),
            &Value::from(ALLOWED),
            &Value::from(443),
            &Value::from("sandbox")
        ),
        "{ended}"
    );
    let (sent, received) = (
        ended["sent"].as_u64().unwrap(),
        ended["received"].as_u64().unwrap(),
    );
    assert!(received > 300_000 && received < 400_000, "{ended}");
    assert!(sent > 300 && sent < 100_000, "{ended}");
    assert!(ended["duration_ms"].as_u64().unwrap() < 10_000, "{ended}");
    // 5000 connections under another name, one after another.
    let script = repo_file("tests/name_peer.py");
    let start = Instant::now();
    let flood = must(&mut g.ns.cmd(&[
        "python3",
        &script,
        "flood",
        ALLOWED,
        "443",
        "5000",
        "other.test",
    ]));
    let took = start.elapsed();
    assert_eq!(flood.trim(), "refused=5000 answered=0 silent=0");
    // The next window's first refusal says how many were held back: a
    // refusal each half second until one is on record saying so (the
    // budget's window is 10 s; one that is held back is counted too).
    let mut probes = 0u64;
    let mut last_probe = Instant::now() - Duration::from_secs(1);
    wait_for(
        "a refusal on record saying how many were held back",
        Duration::from_secs(30),
        || {
            if last_probe.elapsed() >= Duration::from_millis(500) {
                let said = fetch(&g.ns, ALLOWED, 443, &["--sni", "other.test"]);
                assert_eq!(said, "refused");
                probes += 1;
                last_probe = Instant::now();
            }
            let records = logged(&audit, "connection");
            (records.len() > 1 && records.last().unwrap()["held_back"].as_u64() > Some(0))
                .then_some(())
        },
    );
    // The last probes' records may still be on their way.
    let counted = |records: &[Value]| -> u64 {
        let held_back: u64 = records.iter().filter_map(|r| r["held_back"].as_u64()).sum();
        records.iter().filter(|r| r["allowed"] == false).count() as u64 + held_back
    };
    let settled = Instant::now() + Duration::from_secs(5);
    let mut records = logged(&audit, "connection");
    while counted(&records) < 5000 + probes && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(50));
        records = logged(&audit, "connection");
    }
    let allowed: Vec<&Value> = records.iter().filter(|r| r["allowed"] == true).collect();
    assert_eq!(allowed.len(), 1, "the allowed one on record");
    assert_eq!(allowed[0]["shown"], "allowed.test");
    let refused: Vec<&Value> = records.iter().filter(|r| r["allowed"] == false).collect();
    let windows = took.as_secs() / 10 + 2;
    assert!(
        refused.len() as u64 <= 100 * windows,
        "{} refusal records in {took:?}",
        refused.len()
    );
    let held_back: u64 = records.iter().filter_map(|r| r["held_back"].as_u64()).sum();
    let dropped = logged(&audit, "dropped");
    let metrics = crate::metrics::scrape(&world);
    let counted: Vec<&str> = (metrics.lines())
        .filter(|l| l.starts_with("linnet_vm_gate_connections_total"))
        .collect();
    assert_eq!(
        refused.len() as u64 + held_back,
        5000 + probes,
        "each refusal on record or counted in a later record (audit log's dropped lines: {dropped:?}; counted: {counted:?})"
    );
    assert!(refused.iter().all(|r| r["shown"] == "other.test"));
}

#[test]
fn a_new_connection_on_a_closed_ones_address_and_port_is_judged_anew() {
    let (world, _server) = world();
    let g = sandbox(&world);
    let from = |port: &'static str, args: &[&'static str]| {
        let mut argv = args.to_vec();
        argv.extend(["--source-port", port]);
        fetch(&g.ns, ALLOWED, 443, &argv)
    };
    // An allowed connection the server resets: conntrack keeps its entry,
    // which a new SYN from the same port reuses.
    let allowed_reset = ["--sni", "allowed.test", "--path", "/reset"];
    assert_eq!(
        from("40001", &allowed_reset),
        "refused",
        "the server's reset"
    );
    assert_eq!(
        from("40001", &["--sni", "other.test"]),
        "refused",
        "another name on the allowed one's entry"
    );
    assert_eq!(from("40002", &allowed_reset), "refused");
    assert_eq!(
        from("40002", &["--sni", "allowed.test"]),
        "sni=allowed.test host=allowed.test",
        "the control: the allowed name on such an entry"
    );
    // And a refused connection's entry holds no later one back.
    assert_eq!(from("40003", &["--sni", "other.test"]), "refused");
    assert_eq!(
        from("40003", &["--sni", "allowed.test"]),
        "sni=allowed.test host=allowed.test"
    );
}

#[test]
fn udp_to_a_name_passes_only_where_a_rule_says_udp() {
    let (world, _server) = world();
    // Bound to the name's address itself, so that its answers come from
    // there (an echo on every address answers from the interface's own).
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('{ALLOWED}', 8443))\n\
         print('serving', flush=True)\n\
         while True:\n    _, peer = s.recvfrom(2048)\n    s.sendto(b'quic from ' + peer[0].encode() + b'\\n', peer)\n"
    );
    let (_quic, ready) = spawn_until_first_line(world.upstream.cmd(&["python3", "-c", &script]));
    assert_eq!(ready, "serving");
    let open = world.guest("shared", &[]);
    assert_eq!(open.udhcpc(), open.ip());
    let answer = |g: &Guest| echo_try(&g.ns, ALLOWED, 8443, "udp");
    let control = answer(&open);
    assert!(
        matches!(control, Reply::Answer(_)),
        "the control: UDP to the address: {control:?}"
    );
    for (rule, passes) in [
        ("allowed.test:8443", false),
        ("allowed.test:8443/udp", true),
    ] {
        let g = world.guest("shared", &["--allow-connect", rule]);
        assert_eq!(g.udhcpc(), g.ip());
        assert_eq!(g.lookup("allowed.test", &g.gateway()), Some(ALLOWED.into()));
        let got = answer(&g);
        if passes {
            assert!(
                matches!(&got, Reply::Answer(a) if a.starts_with("quic from")),
                "{rule}: {got:?}"
            );
        } else {
            assert_eq!(got, Reply::Refused, "{rule}");
        }
        if passes {
            // A rule for UDP allows no TCP.
            assert_eq!(
                echo_try(&g.ns, ALLOWED, 8443, "tcp"),
                Reply::Refused,
                "{rule}"
            );
        }
    }
}

#[test]
fn the_check_holds_on_a_tap_its_vmm_opens_by_name() {
    let (world, _server) = world_with(Some(
        "networks:\n  shared:\n    allow: { users: [root, nobody] }\n",
    ));
    // `linnet attach` makes the TAP for a VMM started on its own, as
    // nobody (Firecracker's host_dev_name).
    let out = must(&mut world.linnet(&[
        "attach",
        "--name",
        "fc1",
        "--user",
        "nobody",
        "--allow-connect",
        "allowed.test:443",
    ]));
    let info: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(info["datapath"], "tap-name", "{info}");
    let guest = crate::tap_name::guest_of_nobody(&world, &info);
    holds_the_name("tap-name", &guest);
}

#[test]
fn each_host_of_a_network_across_hosts_checks_its_own_vms() {
    let fabric = crate::across_hosts::Fabric::new(2);
    let script = repo_file("tests/name_peer.py");
    let pem = repo_file("tests/fixtures/name_peer.pem");
    let mut servers = Vec::new();
    for site in &fabric.sites {
        let upstream = &site.world.upstream;
        must(&mut upstream.cmd(&["ip", "addr", "add", &format!("{ALLOWED}/32"), "dev", "eth0"]));
        let (server, ready) =
            spawn_until_first_line(upstream.cmd(&["python3", &script, "serve", &pem]));
        assert_eq!(ready, "serving", "{}", site.vtep);
        servers.push(server);
    }
    // The control: a VM without a policy gets the other name answered.
    let open = fabric.sites[0].world.guest("fabric", &[]);
    open.udhcpc();
    assert_eq!(
        fetch(&open.ns, ALLOWED, 443, &["--sni", "other.test"]),
        "sni=other.test host=other.test"
    );
    for site in &fabric.sites {
        let g = site
            .world
            .guest("fabric", &["--allow-connect", "allowed.test:443"]);
        g.udhcpc();
        let what = format!("a VM on {}", site.vtep);
        // Its own host's gateway is its resolver and its way out.
        reaches_only_its_name(&what, &g, &g.gateway());
    }
}
