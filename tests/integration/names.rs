//! Egress by name: `--allow-connect allowed.test:8080/tcp/any` (these tests pin addresses; the name each connection shows is tests/integration/gate.rs's). The VM reaches
//! what linnet's DNS answered it for a name its policy allows, while the
//! answer lives, and no resolver but linnet's answers it. The upstream's
//! dnsmasq answers TEST_NAMES with a TTL of 3 s (harness).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;
use crate::rootless::Tenant;

const ALLOWED: &str = "198.51.100.1";
const SVC: &str = "198.51.100.2";
const OTHER: &str = "198.51.100.4";
const EDGE: &str = "198.51.100.5";

/// The test names' addresses on the upstream, echo servers on ports 8080,
/// 8081 and 853 of every address, and one answering lines on 7000.
fn upstream_with_names(world: &World) -> Vec<Reaped> {
    let mut ips: Vec<&str> = TEST_NAMES.iter().map(|(_, ip)| *ip).collect();
    ips.dedup();
    for ip in ips {
        must(
            &mut world
                .upstream
                .cmd(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]),
        );
    }
    must(&mut world.upstream.cmd(&[
        "ip",
        "addr",
        "add",
        &format!("{TEST_NAME6}/128"),
        "dev",
        "eth0",
        "nodad",
    ]));
    let script = repo_file("tests/echo_peer.py");
    let (lines, ready) =
        spawn_until_first_line(
            world
                .upstream
                .cmd(&["python3", &script, "serve-lines", "7000"]),
        );
    assert_eq!(ready, "serving");
    vec![
        echo_serve(&world.upstream, "web", 8080),
        echo_serve(&world.upstream, "other-port", 8081),
        echo_serve(&world.upstream, "dot", 853),
        lines,
    ]
}

fn world_with_names(yaml: Option<&str>) -> (World, Vec<Reaped>) {
    let mut world = match yaml {
        Some(yaml) => World::with_config(yaml),
        None => World::new(),
    };
    let servers = upstream_with_names(&world);
    world.start_daemon();
    (world, servers)
}

/// dig's whole output for `name` asked of `server` (`extra`: +tcp, ...),
/// and whether it got an answer at all.
fn dig(ns: &Netns, server: &str, name: &str, extra: &[&str]) -> (bool, String) {
    let at = format!("@{server}");
    let mut argv = vec!["dig", at.as_str(), "+time=2", "+tries=1"];
    argv.extend_from_slice(extra);
    argv.push(name);
    let out = run(&mut ns.cmd(&argv));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The IPv4 addresses linnet's DNS gives `guest` for `name`; None when it
/// refused the name.
fn resolve(guest: &Guest, name: &str) -> Option<Vec<String>> {
    let (answered, out) = dig(&guest.ns, &guest.gateway(), name, &[]);
    assert!(answered, "linnet's DNS answers every query:\n{out}");
    if out.contains("status: REFUSED") {
        return None;
    }
    assert!(out.contains("status: NOERROR"), "{out}");
    let (_, short) = dig(&guest.ns, &guest.gateway(), name, &["+short"]);
    Some(
        short
            .lines()
            .filter(|l| l.parse::<std::net::Ipv4Addr>().is_ok())
            .map(String::from)
            .collect(),
    )
}

fn web(ns: &Netns, ip: &str) -> Option<String> {
    echo_ask(ns, ip, 8080, "tcp")
}

/// The row of `linnet ls --json` for interface `name`.
fn listed(world: &World, name: &str) -> Value {
    let doc: Value = serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).unwrap();
    doc["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} is not listed"))
}

fn policy_show(world: &World, name: &str) -> Value {
    let out = must(&mut world.linnet(&["policy", "show", "--name", name, "--json"]));
    serde_json::from_str(&out).unwrap()
}

/// A guest named agent that may reach allowed.test:8080/tcp/any, once it has
/// resolved it.
fn agent(world: &World) -> Guest {
    let g = world.guest(
        "shared",
        &[
            "--name",
            "agent",
            "--allow-connect",
            "allowed.test:8080/tcp/any",
        ],
    );
    assert_eq!(g.udhcpc(), g.ip());
    assert_eq!(resolve(&g, "allowed.test"), Some(vec![ALLOWED.to_string()]));
    g
}

const GATED: &[&str] = &[
    "--name",
    "gated",
    "--allow-connect",
    "allowed.test:8080/tcp/any",
    "--allow-connect",
    "*.svc.test:8080/tcp/any",
    "--allow-connect",
    "www.alias.test:8080/tcp/any",
    // Every port of the upstream, its resolver's among them.
    "--allow-connect",
    UPSTREAM_IP,
];

#[test]
fn a_guest_reaches_only_the_names_it_may_and_asks_no_other_resolver() {
    let (world, _servers) = world_with_names(None);
    let open = world.guest("shared", &["--name", "open"]);
    let g = world.guest("shared", GATED);
    assert_eq!(open.udhcpc(), open.ip());
    assert_eq!(g.udhcpc(), g.ip());
    // Both guests' connections leave through the host's NAT.
    let web_from = |_: &Guest| format!("web from {UPSTREAM_HOST_SIDE}");
    // A guest without a policy reaches every address, and the upstream's
    // resolver on its ports 53 and 853 (the positive controls).
    assert_eq!(web(&open.ns, ALLOWED), Some(web_from(&open)));
    assert_eq!(web(&open.ns, OTHER), Some(web_from(&open)));
    assert!(
        dig(&open.ns, UPSTREAM_IP, "allowed.test", &[])
            .1
            .contains(ALLOWED)
    );
    assert!(
        dig(&open.ns, UPSTREAM_IP, "allowed.test", &["+tcp"])
            .1
            .contains(ALLOWED)
    );
    assert!(echo_ask(&open.ns, UPSTREAM_IP, 853, "tcp").is_some());
    assert_eq!(resolve(&open, "other.test"), Some(vec![OTHER.to_string()]));

    // The gated guest: nothing by name before it asks.
    assert_ne!(
        echo_try(&g.ns, ALLOWED, 8080, "tcp"),
        Reply::Answer(web_from(&g)),
        "an allowed name's address before the VM resolved it"
    );
    assert_eq!(resolve(&g, "allowed.test"), Some(vec![ALLOWED.to_string()]));
    assert_eq!(web(&g.ns, ALLOWED), Some(web_from(&g)), "once resolved");
    assert!(
        echo_ask(&open.ns, ALLOWED, 8081, "tcp").is_some(),
        "the control: 8081 answers a guest without a policy"
    );
    assert_eq!(
        echo_ask(&g.ns, ALLOWED, 8081, "tcp"),
        None,
        "another port of an allowed address"
    );
    assert_eq!(
        resolve(&g, "a.svc.test"),
        Some(vec![SVC.to_string()]),
        "a wildcard"
    );
    assert_eq!(web(&g.ns, SVC), Some(web_from(&g)));
    assert_eq!(
        resolve(&g, "www.alias.test"),
        Some(vec![EDGE.to_string()]),
        "a CNAME to an unlisted name"
    );
    assert_eq!(web(&g.ns, EDGE), Some(web_from(&g)));
    // Other names get no answer but REFUSED, and their addresses stay shut.
    assert_eq!(resolve(&g, "other.test"), None);
    assert_eq!(
        resolve(&g, "svc.test"),
        None,
        "a wildcard is not its suffix"
    );
    assert_eq!(
        resolve(&g, "sneaky.test"),
        None,
        "an unlisted name whose chain leads to an allowed one"
    );
    assert_eq!(web(&g.ns, OTHER), None);
    // Over TCP alike.
    let (_, out) = dig(&g.ns, &g.gateway(), "a.svc.test", &["+tcp"]);
    assert!(
        out.contains("status: NOERROR") && out.contains(SVC),
        "{out}"
    );
    let (_, out) = dig(&g.ns, &g.gateway(), "other.test", &["+tcp"]);
    assert!(out.contains("status: REFUSED"), "{out}");
    // IPv6: an AAAA answer opens the address in the VM's IPv6 set; the A
    // answer before did not.
    g.slaac_addresses();
    open.slaac_addresses();
    assert_eq!(
        echo_ask(&open.ns, TEST_NAME6, 8080, "tcp"),
        Some(web_from(&open).replace(UPSTREAM_HOST_SIDE, UPSTREAM_HOST_SIDE6)),
        "the positive control over IPv6"
    );
    assert_eq!(
        echo_ask(&g.ns, TEST_NAME6, 8080, "tcp"),
        None,
        "not before its AAAA"
    );
    let (_, out) = dig(&g.ns, &g.gateway(), "allowed.test", &["AAAA"]);
    assert!(out.contains(TEST_NAME6), "{out}");
    assert!(
        echo_ask(&g.ns, TEST_NAME6, 8080, "tcp").is_some(),
        "once asked"
    );
    // No other resolver, even one its policy allows on every port.
    assert_eq!(
        g.fetch(&format!("http://{UPSTREAM_IP}/")).as_deref(),
        Some(format!("{UPSTREAM_PAGE}\n").as_str()),
        "the upstream is allowed on every port"
    );
    let (answered, out) = dig(&g.ns, UPSTREAM_IP, "other.test", &[]);
    assert!(!answered && !out.contains(OTHER), "DNS over UDP:\n{out}");
    let (answered, out) = dig(&g.ns, UPSTREAM_IP, "other.test", &["+tcp"]);
    assert!(!answered && !out.contains(OTHER), "DNS over TCP:\n{out}");
    assert_eq!(
        echo_try(&g.ns, UPSTREAM_IP, 853, "tcp"),
        Reply::Refused,
        "DNS over TLS"
    );
    assert_eq!(
        echo_try(&g.ns, UPSTREAM_IP, 853, "udp"),
        Reply::Refused,
        "DNS over QUIC"
    );
    // What it shows.
    let row = listed(&world, "gated");
    assert_eq!(row["refused_queries"], 4, "{row}");
    // At least one packet of each refused attempt above: the address
    // before it was resolved, 8081, other.test's, 53 over UDP and TCP,
    // 853 over TCP and UDP.
    assert!(row["refused_connections"].as_u64().unwrap() >= 7, "{row}");
    let open_row = listed(&world, "open");
    assert!(
        open_row.get("refused_queries").is_none() && open_row.get("refused_connections").is_none()
    );
    let shown = policy_show(&world, "gated");
    let learned: Vec<(String, String)> = shown["learned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            assert!(l["expires_in"].as_u64().unwrap() > 50, "the floor: {l}");
            (
                l["name"].as_str().unwrap().to_string(),
                l["address"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (name, ip) in [
        ("allowed.test", ALLOWED),
        ("a.svc.test", SVC),
        ("www.alias.test", EDGE),
    ] {
        assert!(
            learned.contains(&(name.to_string(), ip.to_string())),
            "{name}: {learned:?}"
        );
    }
    let text = must(&mut world.linnet(&["policy", "show", "--name", "gated"]));
    assert!(
        text.contains("learned: 198.51.100.1 for allowed.test"),
        "{text}"
    );
}

#[test]
fn a_learned_address_expires_unless_asked_again_and_an_open_connection_carries_on() {
    let (world, _servers) = world_with_names(Some(
        "networks:\n  shared:\n    dns:\n      learned_ttl: { floor: 1, ceiling: 4 }\n",
    ));
    let g = world.guest(
        "shared",
        &[
            "--allow-connect",
            "allowed.test:7000/tcp/any",
            "--allow-connect",
            "allowed.test:8080/tcp/any",
        ],
    );
    assert_eq!(g.udhcpc(), g.ip());
    let (_, out) = dig(&g.ns, &g.gateway(), "allowed.test", &[]);
    assert!(
        out.contains("allowed.test.\t\t3\tIN\tA"),
        "the answer's own TTL, under the ceiling:\n{out}"
    );
    let resolved = Instant::now();
    let mut chat = Chat::open(&g.ns, ALLOWED, 7000);
    let mut ask = |text: &str| chat.ask(text);
    assert_eq!(ask("one"), "echo one");
    assert!(web(&g.ns, ALLOWED).is_some(), "within the TTL");
    // The TTL (3 s) passes with no new query.
    std::thread::sleep(Duration::from_secs(4).saturating_sub(resolved.elapsed()));
    wait_for(
        "the learned address to expire",
        Duration::from_secs(3),
        || (echo_try(&g.ns, ALLOWED, 8080, "tcp") == Reply::Refused).then_some(()),
    );
    assert_eq!(
        ask("two"),
        "echo two",
        "the connection opened before carries on"
    );
    // Asked again, it is the VM's again.
    assert_eq!(resolve(&g, "allowed.test"), Some(vec![ALLOWED.to_string()]));
    assert!(web(&g.ns, ALLOWED).is_some());
}

#[test]
fn policy_set_replaces_the_names_and_drops_what_the_old_ones_taught() {
    let (world, _servers) = world_with_names(None);
    let g = agent(&world);
    assert!(web(&g.ns, ALLOWED).is_some());
    assert_eq!(resolve(&g, "a.svc.test"), None);
    let set = |rule: &str| {
        must(&mut world.linnet(&["policy", "set", "--name", "agent", "--allow-connect", rule]))
    };
    set("*.svc.test:8080/tcp/any");
    assert_eq!(resolve(&g, "allowed.test"), None, "the old name is refused");
    assert_eq!(
        web(&g.ns, ALLOWED),
        None,
        "and its address, learned a minute's floor ago, is gone"
    );
    assert_eq!(resolve(&g, "a.svc.test"), Some(vec![SVC.to_string()]));
    assert!(web(&g.ns, SVC).is_some(), "the new name works");
    // Back to a policy of addresses only: the forwarder is open again.
    set(&format!("{OTHER}:8080/tcp"));
    assert_eq!(resolve(&g, "other.test"), Some(vec![OTHER.to_string()]));
    assert_eq!(resolve(&g, "allowed.test"), Some(vec![ALLOWED.to_string()]));
    assert!(web(&g.ns, OTHER).is_some());
    assert_eq!(web(&g.ns, SVC), None, "nothing by name any more");
}

#[test]
fn learned_addresses_come_back_after_a_daemon_restart() {
    let (mut world, _servers) = world_with_names(None);
    let g = agent(&world);
    world.kill_daemon();
    world.start_daemon();
    assert!(
        web(&g.ns, ALLOWED).is_some(),
        "the address learned before the restart, without asking again"
    );
    let shown = policy_show(&world, "agent");
    assert_eq!(shown["learned"][0]["address"], ALLOWED, "{shown}");
    assert!(shown["learned"][0].get("name").is_none(), "{shown}");
    assert_eq!(resolve(&g, "other.test"), None, "the gate holds after it");
}

#[test]
fn a_query_flood_stays_within_the_budgets_and_the_log_budget() {
    let (world, _servers) = world_with_names(None);
    let g = world.guest(
        "shared",
        &["--name", "flood", "--allow-connect", "allowed.test:8080"],
    );
    let other = world.guest("shared", &["--name", "other"]);
    assert_eq!(g.udhcpc(), g.ip());
    assert_eq!(other.udhcpc(), other.ip());
    // 3000 queries for names made of "data", as a tunnel would send them,
    // and as many for the allowed name, as fast as the guest can.
    let script = "import socket, struct, sys\n\
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        def q(i, name):\n\
        \x20   labels = b''.join(bytes([len(l)]) + l.encode() for l in name.split('.'))\n\
        \x20   s.sendto(struct.pack('!HHHHHH', i, 0x100, 1, 0, 0, 0) + labels + b'\\0' + struct.pack('!HH', 1, 1), (sys.argv[1], 53))\n\
        for i in range(3000):\n\
        \x20   q(i, 'c%06d.exfil.test' % i)\n\
        \x20   q(i + 30000, 'allowed.test')\n";
    let start = Instant::now();
    must(&mut g.ns.cmd(&["python3", "-c", script, &g.gateway()]));
    // The daemon answers at once, and the others' DNS works.
    let listing = Instant::now();
    let row = listed(&world, "flood");
    assert!(listing.elapsed() < Duration::from_secs(2));
    assert_eq!(resolve(&other, "other.test"), Some(vec![OTHER.to_string()]));
    // Every name it may not ask for is refused here (none goes upstream),
    // and what it may ask for goes upstream 32 at a time at most: the
    // rest is dropped, and said so.
    let refused = row["refused_queries"].as_u64().unwrap();
    assert!(refused > 0, "{row}");
    let log = world.daemon_log_text();
    assert!(
        log.contains(&format!(
            "DNS: {} has its most queries at once; dropping more",
            g.ip()
        )),
        "{log}"
    );
    let lines = log
        .lines()
        .filter(|l| l.contains("refused a name the VM's policy does not allow"))
        .count();
    let allowed = 1 + start.elapsed().as_secs() as usize / 10 + 1;
    assert!(
        (1..=allowed).contains(&lines),
        "{lines} log lines of refusals in {:?}",
        start.elapsed()
    );
    assert!(
        web(&g.ns, ALLOWED).is_some(),
        "the allowed name was learned"
    );
}

#[test]
fn a_flushed_ruleset_comes_back_with_what_the_vm_learned() {
    let (world, _servers) = world_with_names(None);
    let g = agent(&world);
    let open = world.guest("shared", &[]);
    assert_eq!(open.udhcpc(), open.ip());
    assert!(
        web(&open.ns, OTHER).is_some(),
        "the control: OTHER is there"
    );
    assert_eq!(web(&g.ns, OTHER), None);
    let refused_before = listed(&world, "agent")["refused_connections"]
        .as_u64()
        .unwrap();
    assert!(refused_before >= 1);
    must(&mut world.host.cmd(&["nft", "flush", "ruleset"]));
    wait_for(
        "the policy and its learned address back",
        Duration::from_secs(10),
        || web(&g.ns, ALLOWED).map(|_| ()),
    );
    assert_eq!(web(&g.ns, OTHER), None, "the policy is back too");
    assert_eq!(resolve(&g, "other.test"), None);
    let refused_after = listed(&world, "agent")["refused_connections"]
        .as_u64()
        .unwrap();
    assert!(
        refused_after > refused_before,
        "the count carried on: {refused_before} -> {refused_after}"
    );
}

#[test]
fn every_datapath_is_gated_alike() {
    let (world, _servers) = world_with_names(None);
    for via in [Via::RunDgram, Via::RunStream, Via::HelperStream] {
        let g = world.guest_via(
            "shared",
            via,
            &["--allow-connect", "allowed.test:8080/tcp/any"],
        );
        assert_eq!(g.udhcpc(), g.ip());
        assert_eq!(web(&g.ns, ALLOWED), None, "{via:?}: not before it asks");
        assert_eq!(resolve(&g, "allowed.test"), Some(vec![ALLOWED.to_string()]));
        assert!(web(&g.ns, ALLOWED).is_some(), "{via:?}: the allowed name");
        assert_eq!(resolve(&g, "other.test"), None, "{via:?}: another name");
    }
}

#[test]
fn a_bad_name_is_refused_with_the_reason() {
    let (world, _servers) = world_with_names(None);
    let refused = world.attach_refused("shared", &["--allow-connect", "www.*.example.com:443"]);
    assert!(
        refused.contains("a wildcard is a whole first label"),
        "{refused}"
    );
    let mut bad = world.linnet(&["run", "--allow-connect", "exa mple.com", "--", "true"]);
    let out = failure(&mut bad);
    assert!(
        out.contains("is neither an IP address or network nor a name"),
        "{out}"
    );
}

#[test]
fn rootless_and_a_clone_pass_the_basic_case() {
    let (world, _servers) = world_with_names(None);
    // A rootless daemon's guest.
    let user = Tenant::new(&world, 4321);
    let r = user.guest(
        &world,
        "shared",
        &["--allow-connect", "allowed.test:8080/tcp/any"],
    );
    assert_eq!(r.udhcpc(), r.ip());
    // The control: a rootless guest without a policy reaches OTHER.
    let open = user.guest(&world, "shared", &[]);
    assert_eq!(open.udhcpc(), open.ip());
    assert!(web(&open.ns, OTHER).is_some(), "rootless: the control");
    assert_eq!(web(&r.ns, ALLOWED), None, "rootless: not before it asks");
    assert_eq!(resolve(&r, "allowed.test"), Some(vec![ALLOWED.to_string()]));
    assert!(web(&r.ns, ALLOWED).is_some(), "rootless: the allowed name");
    assert_eq!(resolve(&r, "other.test"), None, "rootless: another name");
    assert_eq!(web(&r.ns, OTHER), None);
    // A clone of a guest, with a policy of its own.
    let original = world.guest("shared", &["--name", "snap"]);
    let ip = original.udhcpc();
    let gateway = original.gateway();
    let clone = world.guest(
        "shared",
        &[
            "--clone-of",
            "snap",
            "--name",
            "snap-1",
            "--allow-connect",
            "allowed.test:8080/tcp/any",
        ],
    );
    crate::clones::restore(&clone, ip, &gateway);
    assert_eq!(
        web(&clone.ns, ALLOWED),
        None,
        "the clone: not before it asks"
    );
    assert_eq!(
        resolve(&clone, "allowed.test"),
        Some(vec![ALLOWED.to_string()])
    );
    assert!(
        web(&clone.ns, ALLOWED).is_some(),
        "the clone: the allowed name"
    );
    assert_eq!(
        resolve(&clone, "other.test"),
        None,
        "the clone: another name"
    );
}

/// The events of `kind` in the JSON lines of `path` (none while it is
/// not there).
pub(crate) fn logged(path: &std::path::Path, kind: &str) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|e| e["event"] == kind)
        .collect()
}

#[test]
fn every_name_decision_is_in_linnet_events_and_the_audit_log_within_a_budget() {
    let keep = tempfile::tempdir().unwrap();
    let audit = keep.path().join("shared.jsonl");
    let yaml = format!("networks:\n  shared:\n    audit_log: {}\n", audit.display());
    let (world, _servers) = world_with_names(Some(&yaml));
    let follower = crate::events::Follower::start(&world, &["--network", "shared"]);
    let g = agent(&world);
    assert_eq!(resolve(&g, "other.test"), None);
    let id = &g.info["interface_id"];
    // Answered: the name, the address and how long it is the VM's.
    let allowed = follower.next("name");
    assert_eq!(
        (
            &allowed["interface_id"],
            &allowed["name"],
            &allowed["asked"],
            &allowed["allowed"]
        ),
        (
            id,
            &Value::from("agent"),
            &Value::from("allowed.test"),
            &Value::from(true)
        ),
        "{allowed}"
    );
    assert_eq!(allowed["learned"][0]["address"], ALLOWED, "{allowed}");
    assert!(
        allowed["learned"][0]["seconds"].as_u64() >= Some(3),
        "{allowed}"
    );
    // (`resolve` asks twice: the allowed name's second answer comes first.)
    let refused = std::iter::repeat_with(|| follower.next("name"))
        .find(|r| r["allowed"] == false)
        .unwrap();
    assert_eq!(
        (
            &refused["asked"],
            &refused["allowed"],
            refused.get("learned")
        ),
        (&Value::from("other.test"), &Value::from(false), None),
        "{refused}"
    );
    // The same lines in the network's audit log, which only root reads,
    // after the VM's attach.
    wait_for(
        "the records in the audit log",
        Duration::from_secs(5),
        || {
            let names = logged(&audit, "name");
            (names.contains(&allowed) && names.contains(&refused)).then_some(())
        },
    );
    assert_eq!(logged(&audit, "attached")[0]["interface_id"], *id);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&audit).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // A flood of refused names: a budget's worth on record (100 a VM in
    // 10 s), every query counted, the rest said in the next record.
    let batch = keep.path().join("names");
    let names: Vec<String> = (0..300).map(|i| format!("q{i}.exfil.test\n")).collect();
    std::fs::write(&batch, names.concat()).unwrap();
    let at = format!("@{}", g.gateway());
    let start = Instant::now();
    run(&mut g.ns.cmd(&[
        "dig",
        &at,
        "+time=1",
        "+tries=1",
        "-f",
        batch.to_str().unwrap(),
    ]));
    let flood = start.elapsed();
    assert_eq!(listed(&world, "agent")["refused_queries"], 301);
    let refused_records = || {
        logged(&audit, "name")
            .iter()
            .filter(|r| r["allowed"] == false)
            .count()
    };
    let windows = 1 + flood.as_secs() as usize / 10;
    assert!(
        (2..=100 * windows).contains(&refused_records()),
        "{} records of 301 refusals in {flood:?}",
        refused_records()
    );
    // Once its budget is back, its next record says what was held back.
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(resolve(&g, "last.exfil.test"), None);
    let last = wait_for("the next record", Duration::from_secs(5), || {
        logged(&audit, "name")
            .into_iter()
            .find(|r| r["asked"] == "last.exfil.test")
    });
    assert!(last["held_back"].as_u64() > Some(0), "{last}");
    // Each refusal on record or counted in one: 1 before the flood, 300,
    // and the last.
    let accounted: u64 = (logged(&audit, "name").iter())
        .filter(|r| r["allowed"] == false)
        .map(|r| 1 + r["held_back"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(accounted, 302);
}
