//! A network's socket_vmnet-compatible socket (`socket: true`): many VMs on
//! one stream socket, each connection one interface, through a relay the
//! daemon starts as the connecting user.

use std::io::{IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::socket::{self, ControlMessageOwned, MsgFlags};
use serde_json::Value;

use crate::harness::*;

/// `shared` with its socket; nobody and daemon (uid 1) may attach, so the
/// socket file is open to all and SO_PEERCRED decides.
const CONFIG: &str =
    "networks:\n  shared:\n    socket: true\n    allow: { users: [root, nobody, daemon] }\n";

fn socket_path(world: &World) -> PathBuf {
    world.run_dir().join("shared.sock")
}

pub(crate) fn interfaces(world: &World) -> Vec<Value> {
    let listing: Value = serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).unwrap();
    listing["interfaces"].as_array().unwrap().clone()
}

/// The interface with `mac`, once it is attached.
fn wait_interface(world: &World, mac: &str) -> Value {
    wait_for(
        &format!("the interface of {mac}"),
        Duration::from_secs(10),
        || {
            interfaces(world)
                .into_iter()
                .find(|i| i["mac_address"] == mac)
        },
    )
}

fn wait_gone(world: &World, mac: &str) {
    wait_for(
        &format!("the interface of {mac} to go"),
        Duration::from_secs(10),
        || (!interfaces(world).iter().any(|i| i["mac_address"] == mac)).then_some(()),
    );
}

/// A stand-in VM in a namespace of its own, connected to the network
/// socket with `mac`, as QEMU's `-netdev stream` would be.
pub(crate) fn socket_guest(world: &World, mac: &str) -> Guest {
    let ns = Netns::new("guest");
    let log = world.dir.path().join(format!("{}.vmm", ns.name));
    let path = socket_path(world);
    let mut guest = Guest::on_socket(
        ns,
        "--stream-socket",
        path.to_str().unwrap(),
        serde_json::json!({ "mac_address": mac, "mtu": 1500 }),
        &log,
    );
    let mut info = wait_interface(world, mac);
    info["gateway"] = "192.168.105.1".into();
    guest.info = info;
    guest
}

/// A connection to `path` made by a process of `uid`'s (`setpriv`), which
/// hands it back and stays (as a VMM does: the daemon reads who connected
/// when it gets to the connection, and a process gone by then is no one's
/// to read): the connection, and the process with its pid. None when the
/// connect was refused.
fn connect_as(uid: u32, path: &Path) -> Option<(UnixStream, Connector)> {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let script = "import socket, sys, time\n\
                  s = socket.socket(socket.AF_UNIX)\n\
                  try:\n    s.connect(sys.argv[1])\nexcept OSError:\n    sys.exit(3)\n\
                  back = socket.socket(fileno=int(sys.argv[2]))\n\
                  socket.send_fds(back, [b'c'], [s.fileno()])\n\
                  time.sleep(3600)\n";
    let fd = theirs.as_raw_fd();
    // SAFETY: clears close-on-exec on a descriptor we own, for the child.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    let uid_s = uid.to_string();
    let child = Reaped(
        Command::new("setpriv")
            .args(["--reuid", &uid_s, "--regid", &uid_s, "--clear-groups"])
            .args(["/usr/bin/python3", "-c", script])
            .arg(path)
            .arg(fd.to_string())
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.id();
    drop(theirs);
    let mut buf = [0u8; 1];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = socket::recvmsg::<()>(
        ours.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .unwrap();
    for cmsg in msg.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            // SAFETY: SCM_RIGHTS gave us this descriptor to own.
            let conn = unsafe { OwnedFd::from_raw_fd(fds[0]) };
            return Some((
                UnixStream::from(conn),
                Connector {
                    pid,
                    _process: child,
                },
            ));
        }
    }
    // Its end closed with nothing sent: refused, or it failed.
    let mut child = child;
    let status = child.0.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(3),
        "the connecting process failed: {status}"
    );
    None
}

/// The process that connected, kept running while the test looks.
struct Connector {
    pid: u32,
    _process: Reaped,
}

/// A broadcast ARP-typed frame from `mac`, with its 4-byte length.
fn framed_from(mac: [u8; 6]) -> Vec<u8> {
    let mut frame = vec![0u8; 60];
    frame[..6].copy_from_slice(&[0xff; 6]);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&[0x08, 0x06]);
    let mut out = (frame.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&frame);
    out
}

/// The relays the daemon started, by pid.
pub(crate) fn relay_pids(world: &World) -> Vec<String> {
    let out = run(Command::new("pgrep").args([
        "-P",
        &world.daemon_pid().to_string(),
        "-f",
        "attach-on-first-frame",
    ]));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn ten_vms_on_one_network_socket_each_get_an_interface_an_address_and_the_network() {
    let mut world = World::with_config(CONFIG);
    world.start_daemon();
    let path = socket_path(&world);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (meta.permissions().mode() & 0o777, meta.uid()),
        (0o666, 0),
        "two users besides root: the file is open, SO_PEERCRED decides"
    );
    let macs: Vec<String> = (1..=10)
        .map(|i| format!("52:54:00:00:01:{i:02x}"))
        .collect();
    let mut guests: Vec<Guest> = macs.iter().map(|m| socket_guest(&world, m)).collect();
    for g in &guests {
        assert_eq!(
            g.udhcpc(),
            g.ip(),
            "the VM leases the address linnet reserved for its MAC"
        );
    }
    let listed = interfaces(&world);
    assert_eq!(listed.len(), 10, "{listed:?}");
    for info in &listed {
        assert_eq!(info["datapath"], "stream", "{info}");
        assert_eq!(info["client_uid"], 0, "{info}");
    }
    for g in &guests {
        let vmm = g.vmm.as_ref().unwrap().id();
        assert!(
            listed.iter().any(|i| i["client_pid"] == vmm),
            "the VMM's pid {vmm} is shown: {listed:?}"
        );
    }
    // Each relay runs with nothing of the daemon's: root connected, so a
    // uid of the relay's own (0x7f6c0000 + n), without capabilities, and
    // out of reach of any process of that uid (not dumpable: its /proc
    // files are root's).
    let relays = relay_pids(&world);
    assert_eq!(relays.len(), 10, "one relay per connection: {relays:?}");
    let mut uids = Vec::new();
    for pid in &relays {
        let uid: u32 = proc_status(pid, "Uid")
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let all = [uid.to_string().as_str(); 4].join(" ");
        assert_eq!(proc_status(pid, "Uid"), all);
        assert_eq!(uid >> 16, 0x7f6c, "uid {uid}");
        assert_eq!(proc_status(pid, "Gid"), all);
        assert_eq!(proc_status(pid, "Groups"), "");
        assert_eq!(proc_status(pid, "CapEff"), "0000000000000000");
        assert_eq!(proc_status(pid, "CapPrm"), "0000000000000000");
        assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
        let fd_dir = std::fs::metadata(format!("/proc/{pid}/fd")).unwrap();
        assert_eq!(fd_dir.uid(), 0, "relay {pid} is not dumpable");
        uids.push(uid);
    }
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), 10, "a uid per relay: {uids:?}");
    let (first, last) = (&guests[0], &guests[9]);
    assert!(first.ping(&first.gateway()), "a VM pings the gateway");
    assert!(first.ping(&last.ip().to_string()), "and another VM");
    last.assert_reaches_upstream("a VM on the network socket");

    // Closing a connection removes its interface, and only that one.
    guests[3].vmm.take().unwrap().kill().unwrap();
    wait_gone(&world, &macs[3]);
    assert_eq!(interfaces(&world).len(), 9);
    wait_for("its relay to exit", Duration::from_secs(5), || {
        (relay_pids(&world).len() == 9).then_some(())
    });
    let (first, last) = (&guests[0], &guests[9]);
    assert!(first.ping(&last.ip().to_string()), "the others carry on");
}

#[test]
fn a_network_socket_admits_only_allowed_users_and_drops_bad_framing_and_foreign_macs() {
    let mut world = World::with_config(CONFIG);
    world.start_daemon();
    let path = socket_path(&world);
    let bystander = socket_guest(&world, "52:54:00:00:02:01");
    assert_eq!(bystander.udhcpc(), bystander.ip());

    // A VM that sends part of a frame's length and header, then nothing:
    // closed after a while (checked at the end).
    let (mut partial, _partial) = connect_as(65534, &path).unwrap();
    partial.write_all(&[0, 0, 0, 60, 0xff]).unwrap();
    let partial_since = std::time::Instant::now();

    // A user outside `allow` connects (the file lets them) and is closed.
    let (mut refused, _refused) = connect_as(4242, &path).expect("the file admits anyone");
    let _ = refused.write_all(&framed_from([0x02, 0, 0, 0, 0x42, 0x42]));
    assert!(
        closed_by_peer(&mut refused, Duration::from_secs(5)),
        "a user outside allow is closed"
    );
    let log = world.daemon_log_text();
    assert!(
        log.contains("refused a connection to the network socket: uid 4242 is not allowed on network \"shared\""),
        "{log}"
    );

    // An allowed user's VM: an interface of that uid and pid, its MAC the
    // first frame's, its relay running as that user without capabilities.
    let vm_mac = [0x02, 0, 0, 0, 0x65, 0x34];
    let (mut vm, connector) = connect_as(65534, &path).unwrap();
    let pid = connector.pid;
    vm.write_all(&framed_from(vm_mac)).unwrap();
    let info = wait_interface(&world, "02:00:00:00:65:34");
    assert_eq!(
        (info["client_uid"].as_u64(), info["client_pid"].as_u64()),
        (Some(65534), Some(pid as u64)),
        "{info}"
    );
    // The bystander's (root's), the stuck one's and this VM's.
    let relays = relay_pids(&world);
    assert_eq!(relays.len(), 3, "{relays:?}");
    let theirs: Vec<&String> = relays
        .iter()
        .filter(|pid| proc_status(pid, "Uid") == "65534 65534 65534 65534")
        .collect();
    assert_eq!(theirs.len(), 2, "the user's relays run as the user");
    for pid in theirs {
        assert_eq!(proc_status(pid, "CapEff"), "0000000000000000");
        assert_eq!(proc_status(pid, "Groups"), "");
    }

    // A frame from a second MAC is dropped by anti-spoofing; the VM stays.
    vm.write_all(&framed_from([0x02, 0, 0, 0, 0x66, 0x66]))
        .unwrap();
    wait_for(
        "the foreign frame to be dropped",
        Duration::from_secs(10),
        || {
            interfaces(&world)
                .into_iter()
                .find(|i| i["mac_address"] == "02:00:00:00:65:34")
                .and_then(|i| i["spoofed_drops"].as_u64())
                .filter(|&n| n >= 1)
        },
    );
    assert!(
        !interfaces(&world)
            .iter()
            .any(|i| i["mac_address"] == "02:00:00:00:66:66"),
        "a second MAC is no second interface"
    );

    // A bogus length closes that connection and removes its interface.
    vm.write_all(&0u32.to_be_bytes()).unwrap();
    assert!(
        closed_by_peer(&mut vm, Duration::from_secs(5)),
        "a zero length closes the connection"
    );
    wait_gone(&world, "02:00:00:00:65:34");

    // So does one before any frame: no interface at all.
    let (mut bogus, _bogus) = connect_as(65534, &path).unwrap();
    bogus
        .write_all(&[
            0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 1,
        ])
        .unwrap();
    assert!(
        closed_by_peer(&mut bogus, Duration::from_secs(5)),
        "a bogus first length closes the connection"
    );
    // The relay says why as it exits, just after the close.
    wait_for(
        "the relay's reason in the log",
        Duration::from_secs(5),
        || {
            world
                .daemon_log_text()
                .contains(
                    "the VM's first frame has a length of 4294967295 bytes, not one of 14 to 1518",
                )
                .then_some(())
        },
    );
    // And a first frame from a multicast MAC.
    let (mut multicast, _multicast) = connect_as(65534, &path).unwrap();
    multicast
        .write_all(&framed_from([0x01, 0, 0x5e, 0, 0, 1]))
        .unwrap();
    assert!(closed_by_peer(&mut multicast, Duration::from_secs(5)));

    assert!(
        closed_by_peer(&mut partial, Duration::from_secs(30)),
        "a VM stuck in its first frame's header is closed (waited {:?})",
        partial_since.elapsed()
    );
    assert!(
        partial_since.elapsed() >= Duration::from_secs(10),
        "after 10 s"
    );
    wait_for(
        "the stuck VM's line in the log",
        Duration::from_secs(5),
        || {
            world
            .daemon_log_text()
            .contains("the VM sent 5 bytes of its first frame's length and header and nothing more for 10 s")
            .then_some(())
        },
    );

    let listed = interfaces(&world);
    assert_eq!(listed.len(), 1, "only the bystander is left: {listed:?}");
    assert!(
        bystander.ping(&bystander.gateway()),
        "the bystander carried on"
    );
    assert_eq!(bystander.udhcpc(), bystander.ip());
}

#[test]
fn a_network_socket_file_follows_allow_and_goes_with_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vms").join("host.sock");
    let mut world = World::with_config(&format!(
        "networks:\n  shared:\n    socket: true\n    allow: {{ users: [root], groups: [daemon] }}\n  host:\n    socket: {}\n    allow: {{ users: [root] }}\n",
        host.display()
    ));
    world.start_daemon();
    let meta = std::fs::metadata(socket_path(&world)).unwrap();
    assert_eq!(
        (meta.permissions().mode() & 0o777, meta.uid(), meta.gid()),
        (0o660, 0, 1),
        "root and one group: root:daemon 0660"
    );
    assert_eq!(
        std::fs::metadata(&host).unwrap().permissions().mode() & 0o777,
        0o600,
        "root only; the path's directory made"
    );
    let listing = must(&mut world.linnet(&["ls"]));
    assert!(
        listing.contains(&format!(
            "network shared: VMs connect to {} (socket_vmnet protocol)",
            socket_path(&world).display()
        )) && listing.contains(&format!("network host: VMs connect to {}", host.display())),
        "{listing}"
    );
    // Nobody is not in the group: the file itself keeps them out.
    assert!(connect_as(65534, &socket_path(&world)).is_none());
    world.stop_daemon();
    assert!(
        !socket_path(&world).exists() && !host.exists(),
        "the sockets go with the daemon"
    );
    // A directory others may change, or one under it: the socket could be
    // swapped for a link.
    let open_dir = world.dir.path().join("open");
    std::fs::create_dir_all(open_dir.join("sub")).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    for dir in [open_dir.clone(), open_dir.join("sub")] {
        std::fs::write(
            world.config.as_ref().unwrap(),
            format!(
                "networks:\n  shared:\n    socket: {}/shared.sock\n",
                dir.display()
            ),
        )
        .unwrap();
        let err = failure(&mut world.linnet(&["daemon"]));
        assert!(
            err.contains(&format!(
                "{} may be changed by users other than root: the socket there could be swapped for a link",
                open_dir.display()
            )),
            "{err}"
        );
    }
}

#[test]
fn linnet_connect_says_what_is_missing() {
    let mut world = World::with_config("networks:\n  shared:\n    socket: true\n");
    world.start_daemon();
    let err = failure(&mut world.linnet(&["connect", "host", "--", "true"]));
    assert!(
        err.contains("network \"host\" has no socket; set `socket: true` for it in networks.yaml"),
        "{err}"
    );
    let err = failure(&mut world.linnet(&["connect", "nope", "--", "true"]));
    assert!(
        err.contains("unknown network \"nope\"; known networks: host, shared"),
        "{err}"
    );
    let missing = world.dir.path().join("missing.sock");
    let err = failure(&mut world.linnet(&["connect", missing.to_str().unwrap(), "--", "true"]));
    assert!(
        err.contains("is the daemon running, with `socket:` set"),
        "{err}"
    );
    // The command gets the connection as fd 3, and its status is passed on.
    let out = run(&mut world.linnet(&[
        "connect",
        "shared",
        "--",
        "sh",
        "-c",
        "readlink /proc/self/fd/3; exit 7",
    ]));
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("socket:"),
        "{out:?}"
    );
}

#[test]
fn a_vm_that_reconnects_at_once_gets_its_address_back_and_another_users_vm_cannot_take_its_mac() {
    let mut world = World::with_config(CONFIG);
    world.start_daemon();
    let mac = "52:54:00:00:03:01";
    let mut first = socket_guest(&world, mac);
    let ip = first.udhcpc();
    // Another user's connection sending from that MAC gets another id
    // (the owner is in it) and is refused at once, with advice a socket's
    // client can act on...
    let refused = |twin: &mut std::os::unix::net::UnixStream, times: usize| {
        twin.write_all(&framed_from([0x52, 0x54, 0, 0, 3, 1]))
            .unwrap();
        assert!(
            closed_by_peer(twin, Duration::from_secs(5)),
            "the other user's connection is closed"
        );
        wait_for("the refusal in the log", Duration::from_secs(5), || {
            let log = world.daemon_log_text();
            (log.matches(&format!("cannot attach the VM with MAC {mac}: the relay of a connection to network \"shared\"'s socket may not use MAC {mac}: it is already used by interface")).count() >= times
                && log.contains("give this VM another MAC in its VMM's settings"))
            .then_some(())
        });
    };
    let (mut twin, _twin) = connect_as(65534, &socket_path(&world)).unwrap();
    refused(&mut twin, 1);
    assert_eq!(interfaces(&world).len(), 1);
    // ...and so while the first user's reservation of it lasts.
    first.vmm.take().unwrap().kill().unwrap();
    drop(first);
    let (mut twin, _twin) = connect_as(65534, &socket_path(&world)).unwrap();
    refused(&mut twin, 2);
    // The VM comes back at once, its old connection maybe still closing:
    // same interface, same address.
    let again = socket_guest(&world, mac);
    assert_eq!(again.udhcpc(), ip, "the same MAC gets the same address");
    let mut back = socket_guest(&world, "52:54:00:00:03:02");
    back.vmm.take().unwrap().kill().unwrap();
    drop(back);
    let quick = socket_guest(&world, "52:54:00:00:03:02");
    assert_eq!(quick.udhcpc(), quick.ip());
    assert_eq!(interfaces(&world).len(), 2);
}

#[test]
fn a_socket_vms_id_cannot_be_taken_through_the_ordinary_api() {
    let mut world = World::with_config(CONFIG);
    world.start_daemon();
    let mac = "52:54:00:00:04:01";
    let mut vm = socket_guest(&world, mac);
    let ip = vm.udhcpc();
    let id = vm.info["interface_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("6c6e736b"), "a socket VM's id: {id}");
    vm.vmm.take().unwrap().kill().unwrap();
    drop(vm);
    wait_gone(&world, mac);
    // While its reservation lasts, another user, and root too, try its id
    // through the ordinary API; a positive control attaches with an id of
    // its own.
    for wrapper in [AS_NOBODY, &[]] {
        let err = failure(
            &mut world.linnet_wrapped(wrapper, &["run", "--interface-id", &id, "--", "true"]),
        );
        assert!(
            err.contains("is of the kind linnet derives for a VM on a network's socket"),
            "{err}"
        );
    }
    must(&mut world.linnet_wrapped(
        AS_NOBODY,
        &[
            "run",
            "--interface-id",
            "6b1c6b70-1111-4c4c-9c9c-000000000401",
            "--",
            "true",
        ],
    ));
    // The VM comes back to its interface and its address.
    let again = socket_guest(&world, mac);
    assert_eq!(again.info["interface_id"], id.as_str());
    assert_eq!(again.udhcpc(), ip);
}
