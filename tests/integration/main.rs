//! Integration scenarios for the core: real kernel, real clients, each in
//! throwaway namespaces (see harness.rs). Run with `make test`.

mod across_hosts;
mod clients;
mod clones;
mod coexist;
mod distro;
mod events;
mod forwarding;
mod frr;
mod gate;
mod guard;
mod harness;
mod instruments;
mod ipv6;
mod kill_storm;
mod lan;
mod lima;
mod metrics;
mod names;
mod neighbours;
mod network_sockets;
mod policy;
mod qemu;
mod rate_limits;
mod restart;
mod rootless;
mod seccomp;
mod secret_proxy;
mod secrets;
mod service;
mod sockets;
mod tap_name;
mod tenant;
mod vhost_user;
mod vmms;

use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;
use std::time::Duration;

use nix::sys::socket::{
    self, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use serde_json::Value;

use harness::*;

#[test]
fn guest_on_shared_gets_reserved_ip_and_reaches_gateway_upstream_names_and_peer() {
    let mut world = World::new();
    world.start_daemon();
    let a = world.guest("shared", &["--name", "alpha"]);
    let b = world.guest("shared", &["--name", "beta"]);
    assert_eq!(
        a.udhcpc(),
        a.ip(),
        "udhcpc gets exactly the ip_address of the attach JSON"
    );
    assert_eq!(b.udhcpc(), b.ip());
    assert!(a.ping(&a.gateway()), "guest pings its gateway");
    a.assert_reaches_upstream("a TAP guest");
    assert_eq!(
        a.lookup("beta.shared.linnet", &a.gateway()),
        Some(b.ip().to_string()),
        "another guest's name"
    );
    assert_eq!(
        a.lookup("beta", &a.gateway()),
        Some(b.ip().to_string()),
        "bare name (search domain)"
    );
    assert!(a.ping(&b.ip().to_string()), "VM to VM");
}

#[test]
fn isc_dhclient_gets_the_reserved_ip() {
    let mut world = World::new();
    world.start_daemon();
    let g = world.guest("shared", &[]);
    assert_eq!(g.dhclient(), g.ip());
}

#[test]
fn host_network_reaches_the_host_and_peers_but_not_upstream() {
    let mut world = World::new();
    world.start_daemon();
    let a = world.guest("host", &["--name", "h1"]);
    let b = world.guest("host", &[]);
    assert_eq!(a.udhcpc(), a.ip());
    assert_eq!(b.udhcpc(), b.ip());
    assert_eq!(a.ip().octets()[..3], [192, 168, 106]);
    assert!(a.ping(&a.gateway()), "host-only guests reach the host");
    assert!(a.ping(&b.ip().to_string()), "and each other");
    // A guest on shared beside them turns forwarding on, and upstream
    // routes the host network back: were it not for linnet's rule, a host
    // guest's packets would go out and their answers come back.
    let s = world.guest("shared", &[]);
    assert_eq!(s.udhcpc(), s.ip());
    assert_eq!(
        must(&mut world.host.cmd(&["cat", "/proc/sys/net/ipv4/ip_forward"])).trim(),
        "1",
        "forwarding is on"
    );
    world.route_back("192.168.106.0/24");
    // The route back works: the host's own address on the host network
    // hears upstream's answer.
    must(&mut world.host.cmd(&[
        "busybox",
        "ping",
        "-c",
        "1",
        "-W",
        "2",
        "-I",
        &a.gateway(),
        UPSTREAM_IP,
    ]));
    // DHCP gives a host network no router; a guest that routes to the
    // gateway anyway must still not get out (the firewall stops it, not the
    // missing route).
    must(
        &mut a
            .ns
            .cmd(&["ip", "route", "replace", "default", "via", &a.gateway()]),
    );
    // What upstream's link carries meanwhile: the shared guest's datagram
    // shows that the capture sees what gets out.
    let capture = Capture::start(&world.upstream, "eth0", 3);
    a.send_marker(UPSTREAM_IP, "LINNET-host");
    s.send_marker(UPSTREAM_IP, "LINNET-shared");
    assert!(!a.ping(UPSTREAM_IP), "but not the outside");
    assert_eq!(
        capture.finish(),
        vec!["LINNET-shared"],
        "upstream's link carries the shared guest's datagram, never the host guest's"
    );
    assert_eq!(
        a.fetch(&format!("http://{UPSTREAM_IP}/")),
        None,
        "no forwarding outward from a host network"
    );
    assert_eq!(
        a.lookup("h1.host.linnet", &a.gateway()),
        Some(a.ip().to_string())
    );
}

#[test]
fn same_interface_id_keeps_mac_and_ip_across_detach_attach_and_daemon_restart() {
    // Three addresses to hand out: once the others hold the rest, the
    // detached interface's address is the only one not in use, and only its
    // reservation keeps a newcomer from getting it.
    let mut world = World::with_config(
        "networks:\n  shared:\n    dhcp: { range: 192.168.105.2-192.168.105.4 }\n",
    );
    world.start_daemon();
    let id = "4f0e5c2a-3d6b-4c1e-9a7f-1b2c3d4e5f60";
    let _other = world.guest("shared", &[]); // takes the first address
    let mut first = world.guest("shared", &["--interface-id", id]);
    let (mac, ip) = (first.mac(), first.ip());
    assert_eq!(first.udhcpc(), ip);
    first.stop();
    drop(first);
    let _squatter = world.guest("shared", &[]); // must not get the reserved address
    assert_ne!(
        _squatter.ip(),
        ip,
        "a detached interface keeps its reservation for lease_time"
    );
    // The squatter took the last address never handed out: a second
    // newcomer could only have the reserved one, and is refused.
    let refused = world.attach_refused("shared", &[]);
    assert!(
        refused.contains("no free address left in 192.168.105.2-192.168.105.4"),
        "{refused}"
    );
    let again = world.guest("shared", &["--interface-id", id]);
    assert_eq!(
        (again.mac(), again.ip()),
        (mac.clone(), ip),
        "detach/attach"
    );
    drop(again);
    drop(_squatter);
    drop(_other);
    world.stop_daemon();
    world.start_daemon();
    // The reservations outlive the daemon: all three addresses are still
    // held for the interfaces that left, so a newcomer is refused again.
    let refused = world.attach_refused("shared", &[]);
    assert!(refused.contains("no free address left"), "{refused}");
    let after_restart = world.guest("shared", &["--interface-id", id]);
    assert_eq!(
        (after_restart.mac(), after_restart.ip()),
        (mac, ip),
        "daemon restart"
    );
    assert_eq!(after_restart.udhcpc(), ip);
}

#[test]
fn killing_run_or_the_vmm_leaves_nothing_and_attach_still_works() {
    let mut world = World::new();
    world.start_daemon();
    // SIGKILL of `linnet run`: the daemon sees its connection close.
    let mut g = world.guest("shared", &[]);
    let tap = g.tap();
    assert!(world.host.links().contains(&tap));
    g.kill_run();
    wait_for(
        "the TAP to go after SIGKILL of linnet run",
        Duration::from_secs(5),
        || (!world.host.links().contains(&tap)).then_some(()),
    );
    wait_for("the network to go down", Duration::from_secs(5), || {
        (!world.host.links().contains(&"ln-shared".into())).then_some(())
    });
    let listing = must(&mut world.linnet(&["ls", "--json"]));
    assert!(
        listing.contains("\"interfaces\": []"),
        "no stale client: {listing}"
    );
    drop(g);

    // SIGKILL of the VMM (the stand-in): `linnet run` exits with 137, the interface goes.
    let mut g = world.guest("shared", &[]);
    let tap = g.tap();
    // The stand-in is the only process inside the guest's namespace.
    let pids = must(Command::new("ip").args(["netns", "pids", &g.ns.name]));
    assert_eq!(pids.split_whitespace().count(), 1, "{pids}");
    must(Command::new("kill").args(["-KILL", pids.trim()]));
    let status = g.run.as_mut().unwrap().wait().unwrap();
    g.run = None;
    assert_eq!(
        status.code(),
        Some(137),
        "linnet run passes on the VMM's fate"
    );
    wait_for(
        "the TAP to go after SIGKILL of the VMM",
        Duration::from_secs(5),
        || (!world.host.links().contains(&tap)).then_some(()),
    );
    drop(g);

    let fresh = world.guest("shared", &[]);
    assert_eq!(fresh.udhcpc(), fresh.ip(), "a new attach works");
}

/// A connection to the daemon's API (docs/api.md), as a program would
/// open it without the CLI.
fn api_connect(world: &World) -> OwnedFd {
    let sock = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let path = world.run_dir().join("linnet.sock");
    socket::connect(sock.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    // A daemon that never answers fails the test (the read's error)
    // rather than hanging it.
    let patience = nix::sys::time::TimeVal::new(API_PATIENCE.as_secs() as i64, 0);
    socket::setsockopt(&sock, socket::sockopt::ReceiveTimeout, &patience).unwrap();
    sock
}

/// How long a test's own API connection waits for a reply or an event.
const API_PATIENCE: Duration = Duration::from_secs(30);

/// Sends one raw request over `api` and reads its reply and the fds that
/// came with it; a reply above one packet is put together from the
/// packets that follow its announcement (docs/api.md).
fn api_call(api: &OwnedFd, request: &str) -> (Value, Vec<OwnedFd>) {
    socket::send(api.as_raw_fd(), request.as_bytes(), MsgFlags::empty()).unwrap();
    api_read(api)
}

/// Reads one reply (or event) from `api`, with the fds that came with it.
/// A read a stop and a continue of this process cut short (EINTR, which a
/// socket with a receive timeout gets even without a handler) is made
/// again; any other error fails the test.
fn api_read(api: &OwnedFd) -> (Value, Vec<OwnedFd>) {
    loop {
        match api_read_once(api) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => panic!("no reply from the daemon within {API_PATIENCE:?}: {e}"),
            Ok(read) => return read,
        }
    }
}

fn api_read_once(api: &OwnedFd) -> nix::Result<(Value, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; 65536];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = socket::recvmsg::<()>(
        api.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = vec![];
    for cmsg in msg.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(got) = cmsg {
            // SAFETY: SCM_RIGHTS gave us these descriptors to own.
            fds.extend(
                got.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let len = msg.bytes;
    let reply: Value = serde_json::from_slice(&buf[..len]).unwrap();
    let Some(total) = reply["large_message"].as_u64() else {
        return Ok((reply, fds));
    };
    let mut bytes = Vec::new();
    while bytes.len() < total as usize {
        let n = match socket::recv(api.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Err(nix::errno::Errno::EINTR) => continue,
            n => n.unwrap(),
        };
        assert!(n > 0, "the daemon closed in the middle of a reply");
        bytes.extend_from_slice(&buf[..n]);
    }
    Ok((serde_json::from_slice(&bytes).unwrap(), fds))
}

/// Attaches an interface over `api`: its info and TAP fd.
fn api_attach(api: &OwnedFd, network: &str) -> (Value, OwnedFd) {
    let request = format!(r#"{{"op": "attach", "network": "{network}"}}"#);
    let (reply, mut fds) = api_call(api, &request);
    assert_eq!(reply["reply"], "attached", "{reply}");
    assert_eq!(fds.len(), 1, "one TAP fd");
    (reply["interface"].clone(), fds.remove(0))
}

#[test]
fn a_client_that_goes_away_takes_all_its_interfaces_with_it_at_once() {
    let mut world = World::new();
    world.start_daemon();
    let api = api_connect(&world);
    let attached: Vec<(Value, OwnedFd)> = (0..20).map(|_| api_attach(&api, "host")).collect();
    let taps: Vec<String> = attached
        .iter()
        .map(|(info, _)| info["tap"].as_str().unwrap().to_string())
        .collect();
    let links = world.host.links();
    assert!(taps.iter().all(|t| links.contains(t)), "{links:?}");
    // The connection closes while the TAP fds stay open, as a VMM's would:
    // the daemon itself must remove the TAPs.
    drop(api);
    wait_for("the client's TAPs to go", Duration::from_secs(5), || {
        let links = world.host.links();
        (!taps.iter().any(|t| links.contains(t))).then_some(())
    });
    let listing = must(&mut world.linnet(&["ls", "--json"]));
    assert!(listing.contains("\"interfaces\": []"), "{listing}");
    // The links vanish before the kernel answers their delete, and the
    // daemon serves requests meanwhile: the detach ends after that.
    wait_for("the detach to end", Duration::from_secs(5), || {
        let log = world.daemon_log_text();
        (log.matches("detached").count() >= taps.len()).then_some(())
    });
    let log = world.daemon_log_text();
    assert_eq!(log.matches("detached").count(), taps.len(), "{log}");
    drop(attached);
}

#[test]
fn a_daemon_stop_keeps_attached_vms_and_removes_everything_once_they_left() {
    let mut world = World::new();
    world.start_daemon();
    let g = world.guest("shared", &[]);
    let h = world.guest("host", &[]);
    assert_eq!((g.udhcpc(), h.udhcpc()), (g.ip(), h.ip()));
    assert!(world.host.links().contains(&"ln-shared".to_string()));
    assert!(world.host.nft_ruleset().contains("table inet linnet"));
    // With VMs attached a stop leaves it all for the next daemon
    // (restart.rs), which puts forwarding back as it was once it is done.
    world.stop_daemon();
    let links = world.host.links();
    assert!(
        links.contains(&"ln-shared".to_string()) && links.contains(&g.tap()),
        "{links:?}"
    );
    assert!(world.host.nft_ruleset().contains("table inet linnet"));
    world.start_daemon();
    assert!(g.ping(&g.gateway()) && h.ping(&h.gateway()));
    drop((g, h));
    wait_for("the detach", Duration::from_secs(10), || {
        (!must(&mut world.linnet(&["ls"])).contains("lnt")).then_some(())
    });
    world.stop_daemon();
    world.assert_linnet_gone();
    assert!(
        !world.run_dir().join("interfaces").exists(),
        "no record, nor their directory, is left"
    );
    assert_eq!(
        must(&mut world.host.cmd(&["cat", "/proc/sys/net/ipv4/ip_forward"])).trim(),
        "0",
        "forwarding restored"
    );
}

#[test]
fn root_run_starts_a_daemon_on_demand_which_exits_when_idle() {
    let world = World::new();
    let mut g = world.guest("shared", &[]);
    assert_eq!(g.udhcpc(), g.ip());
    assert!(world.run_dir().join("daemon.log").exists());
    g.stop();
    // The on-demand daemon exits 10 s after the last interface left.
    // (Watched through its socket file: polling with `linnet ls` would keep it busy.)
    let socket = world.run_dir().join("linnet.sock");
    wait_for(
        "the on-demand daemon to exit",
        Duration::from_secs(20),
        || (!socket.exists()).then_some(()),
    );
    assert!(!world.host.links().iter().any(|l| l.starts_with("ln-")));
}

// ---- errors: one line that names the thing and the fix, non-zero exit ------------

fn run_true(world: &World, args: &[&str]) -> Command {
    let mut a = vec!["run"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--", "true"]);
    world.linnet(&a)
}

#[test]
fn errors_name_the_problem_and_the_fix() {
    let mut world =
        World::with_config("networks:\n  lab:\n    mode: host\n    subnet: 10.77.0.0/24\n");
    let err = failure(&mut world.linnet(&["ls"]));
    assert!(
        err.contains("cannot reach the linnet daemon at") && err.contains("sudo linnet daemon"),
        "{err}"
    );
    world.start_daemon();

    let err = failure(&mut run_true(&world, &["--network", "nope"]));
    assert!(
        err.contains("unknown network \"nope\"; known networks: host, lab, shared"),
        "{err}"
    );

    let err = failure(&mut run_true(&world, &["--name", "bad name"]));
    assert!(
        err.contains("name \"bad name\" has the character ' '"),
        "{err}"
    );

    let err = failure(&mut run_true(&world, &["--mac", "01:00:5e:00:00:01"]));
    assert!(err.contains("multicast"), "{err}");

    // A subnet that overlaps an address already in the namespace.
    must(
        &mut world
            .host
            .cmd(&["ip", "link", "add", "taken0", "type", "bridge"]),
    );
    must(
        &mut world
            .host
            .cmd(&["ip", "addr", "add", "10.77.0.9/16", "dev", "taken0"]),
    );
    let err = failure(&mut run_true(&world, &["--network", "lab"]));
    assert!(
        err.contains(
            "network \"lab\": subnet 10.77.0.0/24 overlaps address 10.77.0.9/16 on interface taken0"
        ),
        "{err}"
    );
    assert!(
        !world.host.links().contains(&"ln-lab".to_string()),
        "nothing left from the failed start"
    );

    // A caller that is not in the allow list.
    let mut as_nobody = world.linnet_wrapped(AS_NOBODY, &["run", "--", "true"]);
    let err = failure(&mut as_nobody);
    assert!(
        err.contains("uid 65534 may not attach to network \"shared\": it allows user root"),
        "{err}"
    );

    // The same interface twice.
    let g = world.guest(
        "shared",
        &["--interface-id", "11111111-2222-4333-8444-555555555555"],
    );
    let err = failure(&mut run_true(
        &world,
        &["--interface-id", "11111111-2222-4333-8444-555555555555"],
    ));
    assert!(
        err.contains("is already attached to network \"shared\""),
        "{err}"
    );
    drop(g);
}

#[test]
fn invalid_config_is_refused_with_file_network_and_key() {
    let mut world = World::with_config("networks:\n  shared:\n    subnet: 10.0.0.1/24\n");
    let err = failure(&mut world.linnet(&["daemon"]));
    assert!(err.contains("networks.yaml: network \"shared\": subnet: \"10.0.0.1/24\" has host bits set; did you mean 10.0.0.0/24?"), "{err}");
    world.config = Some(world.dir.path().join("long.yaml"));
    std::fs::write(
        world.config.as_ref().unwrap(),
        "networks:\n  averyveryverylongnet:\n    subnet: 10.1.0.0/24\n",
    )
    .unwrap();
    let err = failure(&mut world.linnet(&["daemon"]));
    assert!(
        err.contains("network \"averyveryverylongnet\": name:") && err.contains("at most 12"),
        "{err}"
    );
    std::fs::write(
        world.config.as_ref().unwrap(),
        "networks:\n  \"a/b\":\n    subnet: 10.1.0.0/24\n",
    )
    .unwrap();
    let err = failure(&mut world.linnet(&["daemon"]));
    assert!(err.contains("has the character '/'"), "{err}");
    world.config = Some(world.dir.path().join("missing.yaml"));
    let err = failure(&mut world.linnet(&["daemon"]));
    assert!(err.contains("missing.yaml: cannot read"), "{err}");
    assert!(world.host.links().iter().all(|l| !l.starts_with("ln-")));
}

#[test]
fn missing_dev_net_tun_is_reported() {
    let world = World::new();
    // The daemon in a mount namespace where /dev/net is empty.
    let mut cmd = with_own_dev_net(
        &world.host,
        false,
        &[linnet_bin().to_str().unwrap(), "daemon"],
    );
    cmd.env("LINNET_RUN_DIR", world.run_dir())
        .env("LINNET_STATE_DIR", world.state_dir());
    let mut daemon = cmd.stderr(std::process::Stdio::null()).spawn().unwrap();
    wait_for("the daemon", Duration::from_secs(10), || {
        run(&mut world.linnet(&["ls"]))
            .status
            .success()
            .then_some(())
    });
    let err = failure(&mut run_true(&world, &[]));
    assert!(
        err.contains("/dev/net/tun is missing: load the tun module (modprobe tun)"),
        "{err}"
    );
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

#[test]
fn check_config_says_whether_the_networks_file_is_valid_and_starts_nothing() {
    let world = World::with_config("networks:\n  lab:\n    subnet: 10.9.0.0/24\n");
    let out = must(&mut world.linnet(&["daemon", "--check-config"]));
    assert!(out.contains("networks.yaml: valid"), "{out}");
    assert!(
        out.contains("  lab: shared 10.9.0.0/24 (gateway 10.9.0.1)"),
        "{out}"
    );
    std::fs::write(
        world.config.as_ref().unwrap(),
        "networks:\n  lab:\n    subnet: 10.9.0.1/24\n",
    )
    .unwrap();
    let err = failure(&mut world.linnet(&["daemon", "--check-config"]));
    assert!(
        err.contains("network \"lab\": subnet: \"10.9.0.1/24\" has host bits set"),
        "{err}"
    );
    assert!(
        !world.run_dir().join("linnet.sock").exists(),
        "nothing was started"
    );
    assert!(world.host.links().iter().all(|l| !l.starts_with("ln-")));
}
