//! Socket datapaths: `linnet run --datapath dgram|stream|vhost-user` and `linnet helper`,
//! with the stand-in speaking that datapath, and what the relay does with
//! bad input and privileges.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

const SOCKET_VIAS: [Via; 6] = [
    Via::RunDgram,
    Via::RunStream,
    Via::HelperDgram,
    Via::HelperStream,
    Via::RunVhostUser,
    Via::HelperVhostUser,
];

#[test]
fn socket_datapaths_get_dhcp_nat_dns_and_reach_a_tap_guest() {
    let mut world = World::new();
    world.start_daemon();
    let tap = world.guest("shared", &["--name", "tapvm"]);
    assert_eq!(tap.udhcpc(), tap.ip());
    for via in SOCKET_VIAS {
        let g = world.guest_via("shared", via, &["--name", "sockvm"]);
        let expected = match via {
            Via::RunDgram | Via::HelperDgram => "dgram",
            Via::RunVhostUser | Via::HelperVhostUser => "vhost-user",
            _ => "stream",
        };
        assert_eq!(g.info["datapath"], expected, "{via:?}");
        assert_eq!(g.udhcpc(), g.ip(), "{via:?}: udhcpc gets the reserved IP");
        assert!(g.ping(&g.gateway()), "{via:?}: pings the gateway");
        g.assert_reaches_upstream(&format!("{via:?}"));
        assert_eq!(
            g.lookup("tapvm.shared.linnet", &g.gateway()),
            Some(tap.ip().to_string()),
            "{via:?}: a peer's name"
        );
        assert!(g.ping(&tap.ip().to_string()), "{via:?}: to the TAP guest");
        assert!(tap.ping(&g.ip().to_string()), "{via:?}: from the TAP guest");
        let relay = wait_for("the relay's counters in ls", Duration::from_secs(5), || {
            let counters = relay_counters(&world, &g.info)?;
            (counters["from_vm"]["frames"].as_u64()? > 0).then_some(counters)
        });
        assert!(relay["to_vm"]["bytes"].as_u64().unwrap() > 0, "{relay}");
    }
}

#[test]
fn isc_dhclient_gets_the_reserved_ip_over_dgram_and_stream() {
    let mut world = World::new();
    world.start_daemon();
    for via in [Via::RunDgram, Via::HelperStream] {
        let g = world.guest_via("shared", via, &[]);
        assert_eq!(g.dhclient(), g.ip(), "{via:?}");
    }
}

#[test]
fn a_network_mtu_of_65520_carries_64k_frames_over_every_socket_datapath() {
    let mut world = World::with_config(
        "networks:\n  jumbo:\n    mode: host\n    subnet: 10.88.0.0/24\n    mtu: 65520\n",
    );
    world.start_daemon();
    for via in SOCKET_VIAS {
        let g = world.guest_via("jumbo", via, &[]);
        assert_eq!(g.info["mtu"], 65520);
        assert_eq!(g.udhcpc(), g.ip(), "{via:?}");
        let link = must(&mut g.ns.cmd(&["ip", "link", "show", "eth0"]));
        assert!(
            link.contains("mtu 65520"),
            "{via:?}: the guest's MTU, so the ping below is one frame: {link}"
        );
        let out = run(&mut g.ns.cmd(&[
            "busybox",
            "ping",
            "-c",
            "1",
            "-W",
            "3",
            "-s",
            "65000",
            &g.gateway(),
        ]));
        assert!(
            out.status.success(),
            "{via:?}: a 65000-byte ping crosses unfragmented: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// The interface's `relay` counters from `linnet ls --json`.
fn relay_counters(world: &World, info: &Value) -> Option<Value> {
    let listing: Value = serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).ok()?;
    listing["interfaces"]
        .as_array()?
        .iter()
        .find(|i| i["interface_id"] == info["interface_id"])
        .map(|i| i["relay"].clone())
        .filter(|r| !r.is_null())
}

/// `linnet helper ARGS` behind `wrapper`, with `env` and, if given, `fd3`
/// as its fd 3; waits for its JSON. Returns it, the JSON and its log.
fn helper(
    world: &World,
    wrapper: &[&str],
    env: &[(&str, &str)],
    args: &[&str],
    fd3: Option<RawFd>,
) -> (Reaped, Value, std::path::PathBuf) {
    let name = unique("helper");
    let json = world.dir.path().join(format!("{name}.json"));
    let log = world.dir.path().join(format!("{name}.log"));
    let mut argv = vec!["helper"];
    argv.extend_from_slice(args);
    let mut cmd = world.linnet_wrapped(wrapper, &argv);
    cmd.env_remove("SUDO_UID").env_remove("SUDO_GID");
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(fd) = fd3 {
        // SAFETY: dup2 is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    // Reaped at once, so a helper that never answers is killed too.
    let mut child = Reaped(
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&json).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let info = wait_for("the helper's JSON", Duration::from_secs(15), || {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "linnet helper exited with {status}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        serde_json::from_str::<Value>(&std::fs::read_to_string(&json).ok()?).ok()
    });
    (child, info, log)
}

/// A directory anyone may create sockets in (the helper may be nobody).
fn shared_dir(world: &World) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = world.dir.path().join("sockets");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::set_permissions(world.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn helper_holds_no_capabilities_and_runs_as_the_caller_or_the_sudo_user() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    let dir = shared_dir(&world);
    let nobody_sock = dir.join("nobody.sock");
    let sudo_sock = dir.join("sudo.sock");
    let root_sock = dir.join("root.sock");
    type Case<'a> = (
        &'a str,
        &'a [&'a str],
        &'a [(&'a str, &'a str)],
        &'a std::path::Path,
        &'a str,
    );
    let cases: [Case; 3] = [
        ("run by nobody", AS_NOBODY, &[], &nobody_sock, "65534"),
        (
            "root through sudo",
            &[],
            &[("SUDO_UID", "65534"), ("SUDO_GID", "65534")],
            &sudo_sock,
            "65534",
        ),
        ("root without sudo", &[], &[], &root_sock, "0"),
    ];
    for (what, wrapper, env, sock, uid) in cases {
        let (mut child, info, log) = helper(
            &world,
            wrapper,
            env,
            &["--socket", sock.to_str().unwrap()],
            None,
        );
        let pid = child.id();
        assert_eq!(proc_status(pid, "CapEff"), "0000000000000000", "{what}");
        assert_eq!(proc_status(pid, "CapPrm"), "0000000000000000", "{what}");
        assert_eq!(proc_status(pid, "Uid"), [uid; 4].join(" "), "{what}: uid");
        assert_eq!(proc_status(pid, "NoNewPrivs"), "1", "{what}");
        assert_eq!(
            std::fs::metadata(sock).unwrap().uid().to_string(),
            uid,
            "{what}: the socket belongs to the user"
        );
        // And it still relays: a guest gets its address through it.
        let vmm_log = log.with_extension("vmm");
        let guest = Guest::on_socket(
            Netns::new("guest"),
            "--dgram-socket",
            sock.to_str().unwrap(),
            info,
            &vmm_log,
        );
        assert_eq!(
            guest.udhcpc(),
            guest.ip(),
            "{what}: relays after dropping privileges"
        );
        // SIGTERM: a clean stop that detaches and removes the socket file.
        let status = terminate(&mut child);
        assert!(
            status.success(),
            "{what}: helper exited with {status}: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(!sock.exists(), "{what}: socket file removed");
    }
    wait_for("every interface detached", Duration::from_secs(5), || {
        must(&mut world.linnet(&["ls", "--json"]))
            .contains("\"interfaces\": []")
            .then_some(())
    });
}

/// An Ethernet broadcast frame of `len` bytes (an ARP-ish payload of
/// zeroes), or its first `len` bytes when shorter than a header.
fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(14)];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x99]);
    f[12..14].copy_from_slice(&[0x08, 0x06]);
    f.truncate(len);
    f
}

fn stream_frame(len_field: u32, body: usize) -> Vec<u8> {
    let mut out = len_field.to_be_bytes().to_vec();
    out.extend_from_slice(&frame(body));
    out
}

#[test]
fn bad_frames_and_clients_are_dropped_logged_and_counted_without_harm() {
    let mut world = World::new();
    world.start_daemon();
    let bystander = world.guest("shared", &[]);
    assert_eq!(bystander.udhcpc(), bystander.ip());
    let dir = shared_dir(&world);

    // Datagrams at a path: runt, oversized, then a good frame; a second client is ignored.
    let path = dir.join("dgram.sock");
    let (mut dgram_helper, dgram_info, dgram_log) = helper(
        &world,
        &[],
        &[],
        &["--socket", path.to_str().unwrap()],
        None,
    );
    let first = UnixDatagram::bind(dir.join("first.client")).unwrap();
    first.send_to(&frame(5), &path).unwrap(); // a runt: the first client is still served
    first.send_to(&frame(9000), &path).unwrap();
    first.send_to(&frame(60), &path).unwrap();
    let second = UnixDatagram::bind(dir.join("second.client")).unwrap();
    for _ in 0..3 {
        second.send_to(&frame(60), &path).unwrap();
    }
    let counters = wait_for("5 drops counted", Duration::from_secs(5), || {
        let c = relay_counters(&world, &dgram_info)?;
        (c["from_vm"]["drops"].as_u64()? >= 5).then_some(c)
    });
    assert_eq!(counters["from_vm"]["frames"], 1, "{counters}");
    let log = std::fs::read_to_string(&dgram_log).unwrap();
    assert!(log.contains("shorter than"), "{log}");
    assert!(log.contains("larger than"), "{log}");
    assert_eq!(
        log.matches("ignoring frames from").count(),
        1,
        "logged once: {log}"
    );
    assert!(
        dgram_helper.try_wait().unwrap().is_none(),
        "the helper lives on"
    );

    // A stream at a path: length 0, a huge length, and a client vanishing
    // mid-frame each cost that client only; the next one is served.
    let path = dir.join("stream.sock");
    let (mut stream_helper, stream_info, stream_log) = helper(
        &world,
        &[],
        &[],
        &["--stream-socket", path.to_str().unwrap()],
        None,
    );
    let mut c = UnixStream::connect(&path).unwrap();
    c.write_all(&0u32.to_be_bytes()).unwrap();
    assert!(
        closed_by_peer(&mut c, Duration::from_secs(5)),
        "length 0 closes the client"
    );
    let mut c = UnixStream::connect(&path).unwrap();
    c.write_all(&stream_frame(1 << 20, 60)).unwrap();
    assert!(
        closed_by_peer(&mut c, Duration::from_secs(5)),
        "a huge length closes the client"
    );
    let mut c = UnixStream::connect(&path).unwrap();
    c.write_all(&stream_frame(100, 50)).unwrap();
    drop(c);
    let stream_guest = Guest::on_socket(
        Netns::new("guest"),
        "--stream-socket",
        path.to_str().unwrap(),
        stream_info.clone(),
        &dir.join("stream-vmm.log"),
    );
    assert_eq!(
        stream_guest.udhcpc(),
        stream_guest.ip(),
        "the next client is served"
    );
    let log = std::fs::read_to_string(&stream_log).unwrap();
    assert!(log.contains("a frame length of 0"), "{log}");
    assert!(log.contains("above the maximum"), "{log}");
    assert!(log.contains("in the middle of a frame"), "{log}");
    wait_for(
        "the stream's 3 drops counted",
        Duration::from_secs(5),
        || {
            let c = relay_counters(&world, &stream_info)?;
            (c["from_vm"]["drops"].as_u64()? >= 3).then_some(())
        },
    );
    assert!(
        stream_helper.try_wait().unwrap().is_none(),
        "the helper lives on"
    );

    // A stream handed over as an fd: bad framing ends the helper, with a clear error.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (mut fd_helper, _, log) = helper(
        &world,
        &[],
        &[],
        &["--stream-fd", "3"],
        Some(theirs.as_raw_fd()),
    );
    drop(theirs);
    (&ours).write_all(&0u32.to_be_bytes()).unwrap();
    let status = wait_for("the fd helper to exit", Duration::from_secs(10), || {
        fd_helper.try_wait().unwrap()
    });
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(125), "{err}");
    assert!(err.contains("the VMM sent a frame length of 0"), "{err}");

    // Through all of it, the other interfaces were fine.
    assert!(bystander.ping(&bystander.gateway()));

    // A helper whose daemon went away relays on and waits for the next.
    world.kill_daemon();
    wait_for("the helper to notice", Duration::from_secs(5), || {
        std::fs::read_to_string(&dgram_log)
            .unwrap()
            .contains("the linnet daemon went away; the VM keeps its network")
            .then_some(())
    });
    assert!(dgram_helper.try_wait().unwrap().is_none());
    drop(stream_helper);
}

#[test]
fn a_vmm_that_stops_reading_neither_kills_nor_spins_the_helper() {
    let mut world = World::new();
    world.start_daemon();
    let (ours, theirs) = UnixDatagram::pair().unwrap();
    let (mut slow, info, _) = helper(&world, &[], &[], &["--fd", "3"], Some(theirs.as_raw_fd()));
    drop(theirs);
    let (ip, mac) = (
        info["ip_address"].as_str().unwrap(),
        info["mac_address"].as_str().unwrap(),
    );
    // Traffic to the VM, which never reads: far more than any buffer holds.
    must(&mut world.host.cmd(&[
        "ip",
        "neigh",
        "replace",
        ip,
        "lladdr",
        mac,
        "dev",
        "ln-shared",
    ]));
    let flood = format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         for _ in range(40000): s.sendto(b'x' * 1000, ('{ip}', 9))\n"
    );
    must(&mut world.host.cmd(&["python3", "-c", &flood]));
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(slow.id());
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_ticks(slow.id()) - before;
    assert!(slow.try_wait().unwrap().is_none(), "the helper lives on");
    assert!(
        spent < 20,
        "a blocked helper waits instead of spinning: {spent} ticks in 1 s"
    );
    // Once the VMM reads again, frames flow again.
    ours.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    let mut drained = 0;
    while ours.recv(&mut buf).is_ok() {
        drained += 1;
    }
    assert!(drained > 0, "frames were queued for the VMM");
    must(
        &mut world
            .host
            .cmd(&["python3", "-c", &flood.replace("40000", "5")]),
    );
    ours.set_nonblocking(false).unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The flood's frames again (not just the bridge's own chatter).
    loop {
        let n = ours
            .recv(&mut buf)
            .expect("frames flow again after the VMM drained its socket");
        if n > 1000 {
            break;
        }
    }
}

/// `send HOST PORT BYTES`: sends BYTES of seeded random data over TCP and
/// prints the count and their sha256. `receive PORT`: prints "listening",
/// takes one connection to its end and prints the count and sha256.
const PY_TRANSFER: &str = r#"
import hashlib, random, socket, sys
if sys.argv[1] == "send":
    data = random.Random(7).randbytes(int(sys.argv[4]))
    s = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=30)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    print(len(data), hashlib.sha256(data).hexdigest())
else:
    l = socket.socket()
    l.bind(("0.0.0.0", int(sys.argv[2])))
    l.listen(1)
    l.settimeout(30)
    print("listening", flush=True)
    c, _ = l.accept()
    c.settimeout(30)
    h, n = hashlib.sha256(), 0
    while b := c.recv(1 << 20):
        h.update(b)
        n += len(b)
    print(n, h.hexdigest())
"#;

/// Sends `bytes` over TCP from `from` to `to` (at `to_ip`); returns what
/// the sender sent and what the receiver got, as "COUNT SHA256".
fn transfer(from: &Netns, to: &Netns, to_ip: &str, bytes: usize) -> (String, String) {
    let mut receiver = Reaped(
        to.cmd(&["python3", "-c", PY_TRANSFER, "receive", "5001"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = receiver.stdout.take().unwrap();
    let mut line = [0u8; 10];
    out.read_exact(&mut line).expect("the receiver listens");
    let sent = must(&mut from.cmd(&[
        "python3",
        "-c",
        PY_TRANSFER,
        "send",
        to_ip,
        "5001",
        &bytes.to_string(),
    ]));
    let mut got = String::new();
    out.read_to_string(&mut got).unwrap();
    assert!(receiver.wait().unwrap().success(), "the receiver failed");
    (sent.trim().to_string(), got.trim().to_string())
}

/// Packets the host's side of a TAP counted: [from the VM, to the VM].
fn tap_packets(world: &World, tap: &str) -> [u64; 2] {
    let out = must(
        &mut world
            .host
            .cmd(&["ip", "-j", "-s", "link", "show", "dev", tap]),
    );
    let link: Value = serde_json::from_str(&out).unwrap();
    let stats = &link[0]["stats64"];
    [
        stats["rx"]["packets"].as_u64().unwrap(),
        stats["tx"]["packets"].as_u64().unwrap(),
    ]
}

/// The relay's counters as `linnet ls` shows them: (frames, bytes) from
/// the VM and to it; zeros before its first report.
fn relay_flows(world: &World, info: &Value) -> [(u64, u64); 2] {
    let r = relay_counters(world, info).unwrap_or(Value::Null);
    let flow = |way: &str| {
        let n = |what: &str| r[way][what].as_u64().unwrap_or(0);
        (n("frames"), n("bytes"))
    };
    [flow("from_vm"), flow("to_vm")]
}

/// Sends `bytes` over TCP through a relay one `way` (0: from the VM, 1: to
/// it), checks it arrived intact, and returns the frames the relay moved
/// that way and the packets the TAP's host side counted for them.
fn relayed(world: &World, g: &Guest, peer: &Guest, way: usize, bytes: usize) -> (u64, u64) {
    let frames_before = relay_flows(world, &g.info)[way];
    let packets_before = tap_packets(world, &g.tap())[way];
    let (sent, got) = if way == 0 {
        transfer(&g.ns, &peer.ns, &peer.ip().to_string(), bytes)
    } else {
        transfer(&peer.ns, &g.ns, &g.ip().to_string(), bytes)
    };
    assert_eq!(sent, got, "what arrived is what was sent");
    let frames = wait_for("the relay's report", Duration::from_secs(10), || {
        let (frames, moved) = relay_flows(world, &g.info)[way];
        (moved >= frames_before.1 + bytes as u64).then_some(frames)
    });
    (
        frames - frames_before.0,
        tap_packets(world, &g.tap())[way] - packets_before,
    )
}

#[test]
fn bulk_tcp_over_bare_frames_crosses_the_relay_in_large_packets_and_arrives_intact() {
    const BYTES: usize = 8 << 20;
    let mut world = World::new();
    world.start_daemon();
    let peer = world.guest("shared", &[]);
    peer.udhcpc();
    for via in [Via::RunDgram, Via::RunStream] {
        let g = world.guest_via("shared", via, &[]);
        g.udhcpc();
        // From the VM, its MTU-sized segments reach the host's stack
        // coalesced; to it, the host's large TCP frames are cut to size.
        let (frames, packets) = relayed(&world, &g, &peer, 0, BYTES);
        assert!(
            frames >= 3 * packets,
            "{via:?}: {frames} frames from the VM became {packets} packets on the TAP"
        );
        let (frames, packets) = relayed(&world, &g, &peer, 1, BYTES);
        assert!(
            frames >= 3 * packets,
            "{via:?}: {packets} packets from the TAP became {frames} frames to the VM"
        );
    }
}
