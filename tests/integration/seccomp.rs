//! linnet's per-VM processes under seccomp (docs/security.md, "Relays
//! under seccomp"): `linnet run` on every datapath once its VMM runs,
//! `linnet helper`'s relay and a network socket's relay, each relaying
//! while confined, re-claiming its interface after a daemon restart; and
//! a forbidden call stops the process, saying which.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;
use crate::network_sockets::{interfaces, relay_pids, socket_guest};

const CONFIG: &str = "networks:\n  shared:\n    socket: true\n";

/// The debug build's hook (`cli::seccomp::TEST_FORBIDDEN_CALL`).
const FORBIDDEN_CALL: &str = "LINNET_TEST_FORBIDDEN_CALL";

/// The calls the hook makes: socket(2) (to the world, or a unix one) and
/// connect(2).
const SOCKET_CALL: i64 = libc::SYS_socket;
const CONNECT_CALL: i64 = libc::SYS_connect;

fn confined(pid: u32, what: &str) {
    assert_eq!(proc_status(pid, "Seccomp"), "2", "{what} is not confined");
}

/// A guest whose VMM opens its TAP by name (`--datapath tap-name`).
fn tap_name_guest(world: &World) -> Guest {
    let ns = Netns::new("guest");
    let json = world.dir.path().join(format!("{}.json", ns.name));
    let stderr = world.dir.path().join(format!("{}.stderr", ns.name));
    let standin = standin_bin();
    let run = world
        .linnet(&[
            "run",
            "--datapath",
            "tap-name",
            "--json",
            json.to_str().unwrap(),
            "--",
            standin.to_str().unwrap(),
            "--tap",
            "{tap}",
            "--netns",
            &ns.path(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let info: Value = wait_for("the attach JSON", Duration::from_secs(15), || {
        serde_json::from_str(&std::fs::read_to_string(&json).ok()?).ok()
    });
    let mut run = Some(run);
    wait_for("eth0 in the guest", Duration::from_secs(10), || {
        if let Some(status) = run.as_mut().unwrap().try_wait().unwrap() {
            let said = std::fs::read_to_string(&stderr).unwrap_or_default();
            panic!("linnet run (and its VMM) exited with {status}: {said}");
        }
        ns.links().contains(&"eth0".to_string()).then_some(())
    });
    Guest::started(ns, run, None, info)
}

#[test]
fn every_relay_and_linnet_run_relay_under_seccomp() {
    let mut world = World::with_config(CONFIG);
    world.start_daemon();
    let mut guests: Vec<(String, Guest)> = Vec::new();
    for via in [
        Via::Tap,
        Via::RunDgram,
        Via::RunStream,
        Via::HelperDgram,
        Via::HelperStream,
        Via::RunVhostUser,
        Via::HelperVhostUser,
    ] {
        guests.push((format!("{via:?}"), world.guest_via("shared", via, &[])));
    }
    guests.push(("tap-name".into(), tap_name_guest(&world)));
    for (what, guest) in &guests {
        let gateway = guest.gateway();
        guest.udhcpc();
        assert!(guest.ping(&gateway), "{what}: the gateway answers");
        // `linnet run`, or the helper that became `linnet-relay`.
        confined(guest.run.as_ref().unwrap().id(), what);
    }
    let socket_vm = socket_guest(&world, "52:54:00:5e:cc:01");
    let relay: u32 = relay_pids(&world)[0].parse().unwrap();
    socket_vm.udhcpc();
    assert!(socket_vm.ping("192.168.105.1"), "the socket VM relays");
    confined(relay, "a network socket's relay");
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{relay}/comm"))
            .unwrap()
            .trim(),
        "linnet-relay"
    );

    // A daemon restart: each re-claims its interface on a new connection
    // (a thread, a unix socket: what the filter leaves it) and relays on.
    world.stop_daemon();
    world.start_daemon();
    for (what, guest) in &guests {
        let stderr = world.dir.path().join(format!("{}.stderr", guest.ns.name));
        wait_for(
            &format!("{what} to re-claim its interface"),
            Duration::from_secs(15),
            || {
                std::fs::read_to_string(&stderr)
                    .ok()?
                    .contains("re-claimed")
                    .then_some(())
            },
        );
        assert!(
            guest.ping(&guest.gateway()),
            "{what} relays after the restart"
        );
        confined(guest.run.as_ref().unwrap().id(), what);
    }
    assert!(
        !world.daemon_log_text().contains("seccomp"),
        "no process was stopped:\n{}",
        world.daemon_log_text()
    );
}

/// `linnet ARGS` with the test hook set: it must stop with SIGSYS's
/// status and say which call; its interface goes.
fn stopped_by_the_filter(world: &World, args: &[&str], who: &str) {
    stopped_by(world, args, who, "1", SOCKET_CALL);
}

/// As `stopped_by_the_filter`, the hook set to `hook`, stopped at `call`.
fn stopped_by(world: &World, args: &[&str], who: &str, hook: &str, call: i64) {
    let out = world
        .linnet(args)
        .env(FORBIDDEN_CALL, hook)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(159), "{who}: {err}");
    assert!(
        err.contains(&format!(
            "{who}: stopped: it made system call {call}, which its seccomp filter does not allow"
        )),
        "{who} said: {err}"
    );
    wait_for(
        &format!("{who}'s interface to go"),
        Duration::from_secs(10),
        || interfaces(world).is_empty().then_some(()),
    );
}

#[test]
fn a_forbidden_call_stops_the_process_and_says_which() {
    let mut world = World::with_config(CONFIG);
    world.start_daemon();
    // Without the hook, the same command runs its VMM to the end,
    // confined all the while.
    let mut run = world
        .linnet(&["run", "--", "sleep", "2"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        "linnet run to confine itself",
        Duration::from_secs(10),
        || (proc_status(run.id(), "Seccomp") == "2").then_some(()),
    );
    assert!(run.wait().unwrap().success(), "the VMM's own status");

    for datapath in ["tap", "dgram", "stream", "tap-name"] {
        stopped_by_the_filter(
            &world,
            &["run", "--datapath", datapath, "--", "sleep", "5"],
            "linnet run",
        );
    }
    let socket = world.dir.path().join("vm.sock");
    stopped_by_the_filter(
        &world,
        &["helper", "--socket", socket.to_str().unwrap()],
        "linnet-relay",
    );
}

#[test]
fn no_confined_process_makes_a_socket_or_connects_to_a_path() {
    let mut world = World::with_config(CONFIG);
    world.start_daemon();
    // A socket anyone here may connect to (root's, as the processes are):
    // the positive control connects to it.
    let target = world.dir.path().join("users-bus.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&target).unwrap();
    let target = target.to_str().unwrap();
    must(&mut world.host.cmd(&[
        "python3",
        "-c",
        "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])",
        target,
    ]));
    let connect = format!("connect:{target}");
    let vm_socket = world.dir.path().join("vm.sock");
    let vhost_socket = world.dir.path().join("vhost.sock");
    let mut cases: Vec<(Vec<&str>, &str)> = ["tap", "dgram", "stream", "tap-name", "vhost-user"]
        .iter()
        .map(|datapath| {
            (
                vec!["run", "--datapath", datapath, "--", "sleep", "5"],
                "linnet run",
            )
        })
        .collect();
    cases.push((
        vec!["helper", "--socket", vm_socket.to_str().unwrap()],
        "linnet-relay",
    ));
    cases.push((
        vec!["helper", "--vhost-user", vhost_socket.to_str().unwrap()],
        "linnet-relay",
    ));
    for (args, who) in &cases {
        // Each has a lifeline to the daemon (and a vhost-user relay its
        // own back-end to reach again), which once took both calls.
        stopped_by(&world, args, who, "socket", SOCKET_CALL);
        stopped_by(&world, args, who, &connect, CONNECT_CALL);
    }
}
