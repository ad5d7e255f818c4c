//! Tenant safety: what a hostile VMM (through the fd linnet gave it) or a
//! local user (through the daemon's socket) can do to other tenants.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

/// The bridge's MAC, as the kernel has it.
fn link_mac(ns: &Netns, link: &str) -> String {
    let out = must(&mut ns.cmd(&["ip", "-o", "link", "show", link]));
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("an Ethernet address")
        .to_string()
}

/// `linnet run -- hostile_vmm.py set-mac {fd} MAC`, once the VMM has set it.
fn vmm_setting_its_tap_mac(world: &World, mac: &str) -> (Reaped, Value) {
    let json = world.run_dir().join(format!("{}.json", unique("hostile")));
    let script = repo_file("tests/hostile_vmm.py");
    let mut run = world.linnet(&[
        "run",
        "--network",
        "shared",
        "--json",
        json.to_str().unwrap(),
    ]);
    run.args(["--", "python3", &script, "set-mac", "{fd}", mac]);
    let (child, said) = spawn_until_first_line(run);
    assert_eq!(said, "set", "the VMM set its TAP's MAC");
    let info = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (child, info)
}

#[test]
fn a_vmm_that_changes_its_taps_mac_is_cut_off_and_harms_no_one() {
    let mut world = World::new();
    world.start_daemon();
    let victim = world.guest("shared", &[]);
    assert_eq!(victim.udhcpc(), victim.ip());
    let bridge_mac = link_mac(&world.host, "ln-shared");
    let ping_victim = || world.host.ping(&victim.ip().to_string());
    assert!(victim.ping(&victim.gateway()));
    assert!(ping_victim());

    // One VMM takes the victim's MAC for its TAP, another the lowest MAC
    // there is (a bridge without a MAC of its own would take it).
    let (_thief, thief) = vmm_setting_its_tap_mac(&world, &victim.mac());
    let (_lowest, lowest) = vmm_setting_its_tap_mac(&world, "00:00:00:00:00:01");
    for info in [&thief, &lowest] {
        let tap = info["tap"].as_str().unwrap().to_string();
        let why = wait_for("the TAP to be cut off", Duration::from_secs(5), || {
            world.listed_interface(&info["interface_id"])["cut_off"]
                .as_str()
                .map(String::from)
        });
        assert!(why.contains("changed the TAP's MAC"), "{why}");
        let link = must(&mut world.host.cmd(&["ip", "-o", "link", "show", &tap]));
        assert!(!link.contains("master") && !link.contains(",UP"), "{link}");
        let human = must(&mut world.linnet(&["ls"]));
        assert!(human.contains(&format!("(TAP {tap})")), "{human}");
    }
    assert!(
        world
            .daemon_log_text()
            .contains("the VMM changed its TAP's MAC")
    );
    assert_eq!(
        link_mac(&world.host, "ln-shared"),
        bridge_mac,
        "the gateway's MAC stays"
    );
    let fdb = must(
        &mut world
            .host
            .cmd(&["bridge", "fdb", "show", "br", "ln-shared"]),
    );
    assert!(
        fdb.lines()
            .filter(|l| l.starts_with(&victim.mac()))
            .all(|l| l.contains(&victim.tap())),
        "the victim's MAC leads only to its own port: {fdb}"
    );
    assert!(ping_victim(), "the host still reaches the victim");
    assert!(
        victim.ping(&victim.gateway()),
        "the victim still reaches its gateway"
    );
    victim.assert_reaches_upstream("the victim");
}

#[test]
fn a_listing_of_hundreds_of_interfaces_arrives_whole_and_costs_no_one_their_interfaces() {
    const COUNT: usize = 300;
    let mut world =
        World::with_config("networks:\n  big:\n    mode: host\n    subnet: 10.77.0.0/22\n");
    world.start_daemon();
    let api = crate::api_connect(&world);
    let attached: Vec<_> = (0..COUNT).map(|_| crate::api_attach(&api, "big")).collect();
    let ids: Vec<&Value> = attached.iter().map(|(i, _)| &i["interface_id"]).collect();

    // On the very connection that holds the interfaces: a reply this large
    // once ended the connection, and with it every interface.
    let listing = crate::api_call(&api, r#"{"op": "list"}"#).0;
    assert_eq!(listing["reply"], "listing", "{listing}");
    assert_eq!(listing["interfaces"].as_array().unwrap().len(), COUNT);

    let json: Value = serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).unwrap();
    let listed: Vec<&Value> = json["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["interface_id"])
        .collect();
    assert!(
        ids.iter().all(|id| listed.contains(id)),
        "every interface listed"
    );
    let human = must(&mut world.linnet(&["ls"]));
    assert_eq!(
        human.lines().filter(|l| l.contains("lnt")).count(),
        COUNT,
        "one row per interface"
    );
    let again = crate::api_call(&api, r#"{"op": "list"}"#).0;
    assert_eq!(
        again["interfaces"].as_array().unwrap().len(),
        COUNT,
        "still attached"
    );
    drop(attached);
}

/// The TAP name linnet once derived from an interface id (a 64-bit FNV-1a
/// of its bytes): a client could choose an id to aim at another's TAP.
fn name_once_derived_from(id: &uuid::Uuid) -> String {
    let hash = id
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("lnt{:012x}", hash >> 16)
}

fn link_index(ns: &Netns, name: &str) -> Option<String> {
    let out = run(&mut ns.cmd(&["ip", "-o", "link", "show", name]));
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .split(':')
            .next()
            .unwrap()
            .to_string()
    })
}

#[test]
fn an_attach_never_deletes_or_opens_a_link_it_did_not_make() {
    let mut world = World::new();
    world.start_daemon();
    let id = uuid::Uuid::parse_str("6b1c6b70-1111-4c4c-9c9c-000000000042").unwrap();
    // Someone else's TAPs: under the name the id once led to, and under
    // the first name the daemon counts.
    let theirs = [name_once_derived_from(&id), "lnt0".to_string()];
    let before: Vec<String> = theirs
        .iter()
        .map(|name| {
            must(
                &mut world
                    .host
                    .cmd(&["ip", "tuntap", "add", "dev", name, "mode", "tap"]),
            );
            link_index(&world.host, name).unwrap()
        })
        .collect();
    let g = world.guest("shared", &["--interface-id", &id.to_string()]);
    assert!(!theirs.contains(&g.tap()), "{}", g.tap());
    assert_eq!(g.udhcpc(), g.ip());
    for (name, index) in theirs.iter().zip(&before) {
        assert_eq!(
            link_index(&world.host, name).as_ref(),
            Some(index),
            "{name} untouched"
        );
    }
}

const AS_DAEMON_USER: &[&str] = &["setpriv", "--reuid", "1", "--regid", "1", "--clear-groups"];

#[test]
fn ids_and_names_belong_to_their_user_and_hostnames_take_no_ones_name() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody, daemon] }\n");
    world.start_daemon();
    let id = "6b1c6b70-1111-4c4c-9c9c-000000000077";
    let listed_as_nobody =
        || must(&mut world.linnet(&["ls", "--json"])).contains("\"client_uid\": 65534");
    let mut held = Reaped(
        world
            .linnet_wrapped(
                AS_NOBODY,
                &[
                    "run",
                    "--interface-id",
                    id,
                    "--name",
                    "web",
                    "--",
                    "sleep",
                    "60",
                ],
            )
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("nobody's interface", Duration::from_secs(5), || {
        listed_as_nobody().then_some(())
    });
    let taken = |args: &[&str]| failure(&mut world.linnet_wrapped(AS_DAEMON_USER, args));
    let err = taken(&["run", "--name", "WEB", "--", "true"]);
    assert!(
        err.contains(&format!(
            "the name \"WEB\" is held by interface {id} of uid 65534"
        )),
        "{err}"
    );
    let _ = held.kill();
    let _ = held.wait();
    wait_for("nobody's interface to go", Duration::from_secs(5), || {
        (!listed_as_nobody()).then_some(())
    });
    // Detached, its address held for the lease time: still nobody's.
    let err = taken(&["run", "--interface-id", id, "--", "true"]);
    assert!(
        err.contains(&format!(
            "interface {id} belongs to uid 65534; only it or root may attach it"
        )),
        "{err}"
    );
    let err = taken(&["run", "--name", "web", "--", "true"]);
    assert!(err.contains("is held by interface"), "{err}");
    must(&mut world.linnet_wrapped(
        AS_NOBODY,
        &["run", "--interface-id", id, "--name", "web", "--", "true"],
    ));

    // A guest whose DHCP client sends another's name as its hostname.
    // (The impostor attaches first, so its address sorts first.)
    let other = world.guest("shared", &[]);
    let named = world.guest("shared", &["--name", "db"]);
    assert!(other.ip() < named.ip());
    assert_eq!(named.udhcpc(), named.ip());
    assert_eq!(other.udhcpc_as(Some("db")), other.ip());
    let answer = other.lookup("db.shared.linnet", &other.gateway());
    assert_eq!(
        answer,
        Some(named.ip().to_string()),
        "db is still the VM named db"
    );
}

/// The Uid, Gid, CapEff and NoNewPrivs lines of a /proc/PID/status text.
fn identity(status: &str) -> Vec<String> {
    status
        .lines()
        .filter(|l| {
            ["Uid:", "Gid:", "CapEff:", "NoNewPrivs:"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

const NOBODY_NO_CAPS: [&str; 4] = [
    "Uid: 65534 65534 65534 65534",
    "Gid: 65534 65534 65534 65534",
    "CapEff: 0000000000000000",
    "NoNewPrivs: 1",
];

#[test]
fn under_sudo_the_vmm_the_relay_and_the_daemons_view_are_the_invoking_users() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    // `sudo linnet run` as nobody: the VMM prints its own status and that
    // of `linnet run` (its parent, where the relay runs).
    let script = "cat /proc/self/status; echo ---; cat /proc/$PPID/status";
    let out = must(
        world
            .linnet(&["run", "--datapath", "dgram", "--", "sh", "-c", script])
            .env("SUDO_UID", "65534")
            .env("SUDO_GID", "65534"),
    );
    let (vmm, relay) = out.split_once("---").unwrap();
    assert_eq!(identity(vmm), NOBODY_NO_CAPS, "the VMM");
    assert_eq!(identity(relay), NOBODY_NO_CAPS, "linnet run and its relay");
    let log = world.daemon_log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("attached") && l.contains("uid=65534")),
        "the daemon saw the invoking user: {log}"
    );

    // `sudo linnet helper`: its connection is nobody's from the start.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let socket = dir.path().join("vm.sock");
    let mut helper = world.linnet(&["helper", "--socket", socket.to_str().unwrap()]);
    helper
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .stderr(Stdio::null());
    let (helper, line) = spawn_until_first_line(helper);
    let info: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        world.listed_interface(&info["interface_id"])["client_uid"],
        65534
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", helper.id())).unwrap();
    assert_eq!(identity(&status), NOBODY_NO_CAPS, "the helper");
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&socket).unwrap());
    assert_eq!(owner, 65534, "its socket is the user's");
}

/// `api_flood.py` against the world's daemon, behind `wrapper`: its
/// summary line and the process holding the connections.
fn flood(world: &World, wrapper: &[&str], count: usize, wait: &str) -> (String, Reaped) {
    let socket = world.run_dir().join("linnet.sock");
    let mut argv: Vec<&str> = wrapper.to_vec();
    let script = repo_file("tests/api_flood.py");
    let count = count.to_string();
    // Debian's python3: the one on PATH may be root's own (pyenv).
    argv.extend([
        "/usr/bin/python3",
        &script,
        socket.to_str().unwrap(),
        &count,
        wait,
    ]);
    let (child, summary) = spawn_until_first_line(world.host.cmd(&argv));
    (summary, child)
}

#[test]
fn a_connection_flood_from_one_user_leaves_another_users_attach_working() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody, daemon] }\n");
    world.start_daemon_with(&[], &["--max-connections-per-uid", "8"]);
    let (summary, _held) = flood(&world, AS_NOBODY, 40, "5");
    assert_eq!(summary, "answered 8 refused 32 silent 0");
    let log = world.daemon_log_text();
    assert!(
        log.contains("uid 65534 holds 8 connections to the daemon, its limit"),
        "said once: {log}"
    );
    assert_eq!(
        log.matches("its limit (linnet daemon --max-connections-per-uid)")
            .count(),
        1
    );
    let err = failure(&mut world.linnet_wrapped(AS_NOBODY, &["run", "--", "true"]));
    assert!(
        err.contains("uid 65534 holds 8 connections to the linnet daemon"),
        "{err}"
    );
    must(&mut world.linnet_wrapped(AS_DAEMON_USER, &["run", "--", "true"]));
    let g = world.guest("shared", &[]);
    assert_eq!(g.udhcpc(), g.ip(), "root's VM too");
}

#[test]
fn no_set_of_users_holds_more_than_max_connections_and_root_is_still_served() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody, daemon] }\n");
    world.start_daemon_with(
        &[],
        &["--max-connections-per-uid", "8", "--max-connections", "10"],
    );
    let (first, _held) = flood(&world, AS_NOBODY, 8, "5");
    assert_eq!(first, "answered 8 refused 0 silent 0", "within both limits");
    let (second, _held_too) = flood(&world, AS_DAEMON_USER, 8, "5");
    assert_eq!(second, "answered 2 refused 6 silent 0", "ten in all");
    let log = world.daemon_log_text();
    assert!(
        log.contains("users other than root hold the daemon's most connections in all"),
        "{log}"
    );
    let g = world.guest("shared", &[]);
    assert_eq!(g.udhcpc(), g.ip(), "root's VM is served");
}

#[test]
fn out_of_file_descriptors_the_daemon_waits_instead_of_spinning_and_recovers() {
    let mut world = World::new();
    // Room for the daemon's own (the gate's queue and socket among them)
    // and an attach's, far short of the flood's 80.
    world.start_daemon_with(&["prlimit", "--nofile=72:72", "--"], &[]);
    let pid = world.daemon_pid();
    let (summary, held) = flood(&world, &[], 80, "0.2");
    assert!(summary.contains(" silent "), "{summary}");
    let silent: usize = summary.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(silent > 0, "the flood ran the daemon out of fds: {summary}");
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    assert!(
        used < 50,
        "the daemon burnt {used} ticks in 2 s waiting for fds"
    );
    assert!(world.daemon_log_text().contains("out of file descriptors"));
    drop(held);
    let g = world.guest("shared", &[]);
    assert_eq!(g.udhcpc(), g.ip(), "attaches work again once fds are free");
}

#[test]
fn a_damaged_lease_file_or_an_unmarked_bridge_left_by_a_crash_cost_no_network() {
    let mut world = World::new();
    world.start_daemon();
    let g = world.guest("shared", &[]);
    let bridge_mac = link_mac(&world.host, "ln-shared");
    drop(g);
    world.stop_daemon();
    // What a daemon killed at the wrong moment could leave: a lease file
    // cut short, and its bridge made but not yet marked as linnet's.
    let leases = world.state_dir().join("leases/shared.json");
    std::fs::write(&leases, "{\"leases\": [{\"ip\": \"192.168").unwrap();
    must(&mut world.host.cmd(&[
        "ip",
        "link",
        "add",
        "ln-shared",
        "address",
        &bridge_mac,
        "type",
        "bridge",
    ]));
    world.start_daemon();
    let g = world.guest("shared", &[]);
    assert_eq!(g.udhcpc(), g.ip());
    let log = world.daemon_log_text();
    assert!(
        log.contains("moved to") && log.contains("starting with no leases"),
        "{log}"
    );
    assert!(
        log.contains("adopted=true"),
        "the unmarked bridge is adopted: {log}"
    );
    let kept = std::fs::read_dir(world.state_dir().join("leases"))
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("shared.json.broken-")
        });
    assert!(kept, "the damaged file is kept for a look");
}

#[test]
fn dns_answers_only_the_vms_of_its_own_bridge() {
    let mut world = World::new();
    world.start_daemon();
    let shared = world.guest("shared", &[]);
    let hostonly = world.guest("host", &[]);
    assert_eq!(shared.udhcpc(), shared.ip());
    assert_eq!(hostonly.udhcpc(), hostonly.ip());
    assert_eq!(
        shared.lookup(UPSTREAM_NAME, &shared.gateway()).as_deref(),
        Some(UPSTREAM_IP)
    );
    // The host network's VM reaches the shared gateway's address (the
    // host's own), but not a resolver there.
    must(
        &mut hostonly
            .ns
            .cmd(&["ip", "route", "add", "default", "via", &hostonly.gateway()]),
    );
    assert!(hostonly.ping(&shared.gateway()), "the address is reachable");
    assert_eq!(hostonly.lookup(UPSTREAM_NAME, &shared.gateway()), None);
    assert_eq!(
        hostonly
            .lookup(UPSTREAM_NAME, &hostonly.gateway())
            .as_deref(),
        Some(UPSTREAM_IP),
        "its own gateway answers"
    );
}

/// Whether `tap` is on a bridge.
fn on_a_bridge(world: &World, tap: &str) -> bool {
    must(&mut world.host.cmd(&["ip", "-o", "link", "show", tap])).contains(" master ")
}

#[test]
fn while_the_guard_cannot_be_put_back_guarded_vms_forward_nothing() {
    let mut world = World::new();
    world.start_daemon();
    let g = world.guest("shared", &[]);
    assert_eq!(g.udhcpc(), g.ip());
    assert!(g.ping(&g.gateway()));
    assert!(on_a_bridge(&world, &g.tap()));
    // Someone flushes the ruleset and takes the guard's table name with a
    // table only its own nft process may change (`flags owner`), so linnet
    // cannot put its guard back while that process lives.
    let mut squatter = Reaped(
        world
            .host
            .cmd(&["nft", "-i"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    {
        use std::io::Write;
        let stdin = squatter.stdin.as_mut().unwrap();
        stdin
            .write_all(b"flush ruleset\nadd table bridge linnet { flags owner; }\n")
            .unwrap();
        stdin.flush().unwrap();
    }
    wait_for("the guest's port held", Duration::from_secs(3), || {
        (!on_a_bridge(&world, &g.tap())).then_some(())
    });
    assert!(!g.ping(&g.gateway()), "no frame in or out while unguarded");
    let log = world.daemon_log_text();
    assert!(
        log.contains("guarded interfaces forward nothing until they are back"),
        "{log}"
    );
    // The squatter goes, and its table with it: the guard comes back and
    // the port forwards again.
    let _ = squatter.kill();
    let _ = squatter.wait();
    wait_for(
        "the port back on its bridge",
        Duration::from_secs(10),
        || on_a_bridge(&world, &g.tap()).then_some(()),
    );
    assert!(g.ping(&g.gateway()));
    let macs = must(
        &mut world
            .host
            .cmd(&["nft", "list", "set", "bridge", "linnet", "macs"]),
    );
    assert!(
        macs.contains(&g.mac()),
        "the guard holds the guest again: {macs}"
    );
    g.assert_reaches_upstream("after the guard came back");
}

#[test]
fn a_users_forward_captures_no_one_elses_loopback_and_a_service_started_later_is_named() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    // nobody publishes host port 9100 to its VM (no VMM needed for that).
    let _vm = Reaped(
        world
            .linnet_wrapped(AS_NOBODY, &["run", "-p", "9100:8000", "--", "sleep", "60"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("nobody's forward", Duration::from_secs(5), || {
        must(&mut world.linnet(&["forward", "ls"]))
            .contains("9100")
            .then_some(())
    });
    // Then a host service starts on that port.
    let _service = echo_serve(&world.host, "svc", 9100);
    let said = wait_for(
        "the daemon to name the clash",
        Duration::from_secs(8),
        || {
            let log = world.daemon_log_text();
            log.lines()
                .find(|l| l.contains("host port 9100 is published") && l.contains("now listens"))
                .map(String::from)
        },
    );
    assert!(said.contains("its owner's local connections"), "{said}");
    let ls = must(&mut world.linnet(&["ls"]));
    assert!(ls.contains("a host service now listens on"), "{ls}");
    // root's connection to 127.0.0.1:9100 reaches the service; nobody's own
    // goes to its VM (which has no VMM here, so nothing answers).
    assert_eq!(
        echo_try(&world.host, "127.0.0.1", 9100, "tcp"),
        Reply::Answer("svc from 127.0.0.1".into())
    );
    let script = repo_file("tests/echo_peer.py");
    let mut argv: Vec<&str> = AS_NOBODY.to_vec();
    argv.extend([
        "/usr/bin/python3",
        &script,
        "ask",
        "127.0.0.1",
        "9100",
        "tcp",
    ]);
    let out = run(&mut world.host.cmd(&argv));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("svc"),
        "the forward's owner is sent to its VM"
    );
}

/// Sends `count` DNS queries for `name` to `server` from `ns`, as fast as
/// it can, without waiting for answers.
const DNS_FLOOD: &str = r#"
import socket, struct, sys
server, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(count):
    s.sendto(struct.pack("!HHHHHH", i, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", 1, 1), (server, 53))
"#;

#[test]
fn a_vm_flooding_dns_gets_its_share_and_the_others_still_get_answers() {
    // An upstream that never answers, so every forwarded query waits 2 s.
    let mut world =
        World::with_config("networks:\n  shared:\n    dns: { upstream: [203.0.113.99] }\n");
    world.start_daemon();
    let flooder = world.guest("shared", &[]);
    let other = world.guest("shared", &["--name", "calm"]);
    assert_eq!(flooder.udhcpc(), flooder.ip());
    assert_eq!(other.udhcpc(), other.ip());
    must(&mut flooder.ns.cmd(&[
        "python3",
        "-c",
        DNS_FLOOD,
        &flooder.gateway(),
        "nowhere.example",
        "500",
    ]));
    let said = wait_for("the DNS budget to bite", Duration::from_secs(5), || {
        world
            .daemon_log_text()
            .lines()
            .find(|l| l.contains("DNS:") && l.contains("most queries at once"))
            .map(String::from)
    });
    assert!(
        said.contains(&format!("{} has its most", flooder.ip())),
        "{said}"
    );
    // Meanwhile another VM's question is answered at once.
    assert_eq!(
        other.lookup("calm.shared.linnet", &other.gateway()),
        Some(other.ip().to_string())
    );
}

#[test]
fn a_daemon_out_of_descriptors_still_lists_hundreds_of_interfaces_to_their_connection() {
    let mut world =
        World::with_config("networks:\n  big:\n    mode: host\n    subnet: 10.77.0.0/22\n");
    world.start_daemon_with(&["prlimit", "--nofile=64:64", "--"], &[]);
    let api = crate::api_connect(&world);
    let attached: Vec<_> = (0..200).map(|_| crate::api_attach(&api, "big")).collect();
    // Others take every descriptor the daemon has left: a large reply
    // needs none of its own.
    let (summary, _flood) = flood(&world, &[], 80, "0.2");
    assert!(!summary.ends_with("silent 0"), "{summary}");
    let (reply, _) = crate::api_call(&api, r#"{"op": "list"}"#);
    assert_eq!(reply["reply"], "listing", "{reply}");
    assert_eq!(
        reply["interfaces"].as_array().unwrap().len(),
        attached.len(),
        "the connection kept every interface"
    );
}

/// A daemon whose /etc (in its own mount namespace) knows `alice` (4401),
/// a member of `lnt-people` (4501) with subordinate uids 200000-265535,
/// on `shared` allowed to that group with `yaml_extra`, and `daemon_args`.
fn world_with_alice(yaml_extra: &str, daemon_args: &[&str]) -> World {
    let yaml = format!("networks:\n  shared:\n    allow: {{ groups: [lnt-people] }}\n{yaml_extra}");
    let mut world = World::with_config(&yaml);
    let setup = etc_with(
        world.dir.path(),
        &[
            ("passwd", "alice:x:4401:4401::/nonexistent:/bin/sh\n"),
            ("group", "alice:x:4401:\nlnt-people:x:4501:alice\n"),
            ("subuid", "alice:200000:65536\n"),
        ],
    );
    let wrapper = own_mounts(&setup);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    world.start_daemon_with(&wrapper, daemon_args);
    world
}

/// As `uid`, with the group lnt-people among its supplementary groups
/// (as a process in a user namespace keeps its creator's).
fn as_uid_in_the_group(uid: u32) -> Vec<String> {
    let uid = uid.to_string();
    [
        "setpriv", "--reuid", &uid, "--regid", &uid, "--groups", "4501",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn a_users_subordinate_uids_share_its_budgets_and_a_stray_uid_is_no_member() {
    let world = world_with_alice(
        "    max_interfaces_per_uid: 2\n",
        &["--max-connections-per-uid", "8"],
    );
    // Connections: five of alice's subordinate uids try four each.
    let mut answered = 0;
    let mut held = Vec::new();
    for uid in 200000..200005 {
        let wrapper = as_uid_in_the_group(uid);
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let (summary, child) = flood(&world, &wrapper, 4, "3");
        answered += summary
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u32>()
            .unwrap();
        held.push(child);
    }
    assert_eq!(
        answered, 8,
        "the limit is alice's, not each uid's (20 answered before)"
    );
    let log = world.daemon_log_text();
    assert!(
        log.contains("uid 200002's account 4401 (whose subordinate or namespaced uid it is) holds 8 connections"),
        "{log}"
    );
    drop(held);
    // Interfaces: two of alice's uids hold one each, a third is refused.
    let run_as = |uid: u32, args: &[&str]| {
        let wrapper = as_uid_in_the_group(uid);
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        world.linnet_wrapped(&wrapper, args)
    };
    // A positive control first: a subordinate uid of alice is allowed as
    // alice, a member of the group.
    must(&mut run_as(200010, &["run", "--", "true"]));
    let _vms: Vec<Reaped> = [200011, 200012]
        .into_iter()
        .map(|uid| {
            Reaped(
                run_as(uid, &["run", "--", "sleep", "30"])
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    wait_for("alice's two interfaces", Duration::from_secs(10), || {
        let ls = must(&mut world.linnet(&["ls", "--json"]));
        (ls.matches("\"client_uid\": 2000").count() == 2).then_some(())
    });
    let err = failure(&mut run_as(200013, &["run", "--", "true"]));
    assert!(
        err.contains("uid 4401 has 2 interfaces on network \"shared\", its limit"),
        "{err}"
    );
    // A uid that is no account and no one's subordinate, with the group
    // among its supplementary groups, is no member of it.
    let err = failure(&mut run_as(300000, &["run", "--", "true"]));
    assert!(
        err.contains("uid 300000 may not attach to network \"shared\": it allows group lnt-people"),
        "{err}"
    );
}

/// tests/gone_peer.py with `args`: its first line, and it (to read on).
fn gone_peer(
    world: &World,
    args: &[&str],
) -> (
    Reaped,
    String,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let socket = world.run_dir().join("linnet.sock");
    let script = repo_file("tests/gone_peer.py");
    let mut argv = vec![
        "/usr/bin/python3",
        script.as_str(),
        socket.to_str().unwrap(),
    ];
    argv.extend_from_slice(args);
    spawn_reading(world.host.cmd(&argv))
}

#[test]
fn a_peer_gone_before_the_daemon_looks_is_charged_to_no_stray_uid() {
    // alice's budget of connections is full; 300000 is a subordinate uid
    // of hers from no /etc/subuid (as NSS's sssd gives them), seen only
    // through the user namespace she owns.
    let world = world_with_alice("", &["--max-connections-per-uid", "2"]);
    let (summary, _alice) = flood(
        &world,
        &as_uid_in_the_group(4401)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        2,
        "3",
    );
    assert_eq!(summary, "answered 2 refused 0 silent 0");
    // A positive control: connecting and staying, it is alice's, and
    // refused as hers.
    let (_live, said, _) = gone_peer(&world, &["4401", "--userns", "300000", "live"]);
    assert!(
        said.contains("uid 300000's account 4401 (whose subordinate or namespaced uid it is) holds 2 connections"),
        "{said}"
    );
    // The same, gone before the daemon looks: its namespace cannot be
    // read, and 300000 is no account, so it is refused (it was served as
    // an account of its own: 4 more connections per inner uid).
    let daemon = world.daemon_pid().to_string();
    let stop = |signal: &str| must(&mut world.host.cmd(&["kill", signal, &daemon]));
    stop("-STOP");
    let (_gone, line, mut rest) = gone_peer(&world, &["4401", "--userns", "300000", "gone"]);
    stop("-CONT");
    assert_eq!(line, "gone");
    let mut said = String::new();
    std::io::BufRead::read_line(&mut rest, &mut said).unwrap();
    assert!(
        said.contains("error: the process that connected as uid 300000 exited before the daemon could tell whose account it is"),
        "{said}"
    );
    // And a uid that is an account is that account, gone or not: nobody,
    // outside any namespace, is served.
    stop("-STOP");
    let (_nobody, line, mut rest) = gone_peer(&world, &["65534", "gone"]);
    stop("-CONT");
    assert_eq!(line, "gone");
    let mut said = String::new();
    std::io::BufRead::read_line(&mut rest, &mut said).unwrap();
    assert_eq!(said.trim(), "listing");
    let log = world.daemon_log_text();
    assert!(
        log.contains("refused a connection: the process that connected as uid 300000 exited"),
        "{log}"
    );
}

#[test]
fn a_users_subordinate_uids_share_its_relays_per_second_on_a_network_socket() {
    let world = world_with_alice("    socket: true\n", &[]);
    let socket = world.run_dir().join("shared.sock");
    wait_for("the network's socket", Duration::from_secs(5), || {
        socket.exists().then_some(())
    });
    // Thirty of alice's subordinate uids connect at once and hold on.
    let hold = "import socket, sys, time\n\
                s = socket.socket(socket.AF_UNIX)\n\
                s.connect(sys.argv[1])\n\
                time.sleep(10)\n";
    let _held: Vec<Reaped> = (200000..200030)
        .map(|uid| {
            let mut argv = as_uid_in_the_group(uid);
            argv.extend(
                ["/usr/bin/python3", "-c", hold, socket.to_str().unwrap()].map(String::from),
            );
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            Reaped(world.host.cmd(&argv).stderr(Stdio::null()).spawn().unwrap())
        })
        .collect();
    // Every connection taken by the daemon (none left in the socket's
    // backlog: its Recv-Q), and the refusal said.
    wait_for(
        "the daemon to take the thirty connections",
        Duration::from_secs(10),
        || {
            let listening =
                must(
                    &mut world
                        .host
                        .cmd(&["ss", "-Hlx", "src", socket.to_str().unwrap()]),
                );
            let queued: u32 = listening.split_whitespace().nth(2)?.parse().ok()?;
            (queued == 0
                && world
                    .daemon_log_text()
                    .contains("connected more than 10 times in a second"))
            .then_some(())
        },
    );
    let relays = run(Command::new("pgrep").args([
        "-P",
        &world.daemon_pid().to_string(),
        "-f",
        "attach-on-first-frame",
    ]));
    let relays = String::from_utf8_lossy(&relays.stdout)
        .split_whitespace()
        .count();
    // Ten a second for alice in all (the spawning may span a second
    // boundary): 30 before, one per uid.
    assert!((10..=20).contains(&relays), "{relays} relays started");
    let log = world.daemon_log_text();
    assert!(
        log.contains("(account 4401) connected more than 10 times in a second"),
        "{log}"
    );
}

#[test]
fn a_user_who_makes_the_daemon_complain_in_a_loop_cannot_grow_its_log() {
    let mut world = World::new();
    world.start_daemon();
    let socket = world.run_dir().join("linnet.sock");
    // Nobody may not attach: 2000 attaches on one connection, each refused
    // (and each answered).
    let script = "import json, socket, sys\n\
                  s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
                  s.connect(sys.argv[1])\n\
                  answered = 0\n\
                  for _ in range(2000):\n\
                  \x20   s.send(b'{\"op\": \"attach\", \"network\": \"shared\"}')\n\
                  \x20   answered += json.loads(s.recv(65536))['reply'] == 'error'\n\
                  print(answered)\n";
    let mut argv: Vec<&str> = AS_NOBODY.to_vec();
    argv.extend(["/usr/bin/python3", "-c", script, socket.to_str().unwrap()]);
    assert_eq!(
        must(&mut world.host.cmd(&argv)).trim(),
        "2000",
        "every one answered"
    );
    let refusals = |log: &str| log.matches("attach refused").count();
    let log = world.daemon_log_text();
    assert!(
        (1..=40).contains(&refusals(&log)),
        "{} lines for 2000 refusals",
        refusals(&log)
    );
    // Root's next refusal says how many were held back.
    let _ = failure(&mut world.linnet(&["run", "--network", "nope", "--", "true"]));
    let log = world.daemon_log_text();
    let last = log.lines().rfind(|l| l.contains("attach refused")).unwrap();
    assert!(
        last.contains("messages about clients suppressed before this"),
        "{last}"
    );
}
