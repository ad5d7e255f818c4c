//! The vhost-user datapath with real QEMU 7.2 guests: `linnet run
//! --datapath vhost-user` wires QEMU itself (shared memory, chardev,
//! netdev, NIC); the back-end runs in the VM's relay as its user.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const BOOT_TIMEOUT_SECS: Duration = Duration::from_secs(90);

use serde_json::Value;

use crate::guard::{SPOOFS, ready, send_and_capture, spoofed_drops};
use crate::harness::*;
use crate::qemu::Vm;

#[test]
fn a_qemu_guest_on_vhost_user_leases_and_reaches_the_gateway_upstream_and_a_tap_guest() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    let tap_vm = Vm::start(&world, "shared", "sleep 40\n", &[]);
    tap_vm.wait_console("linnet-guest: lease");
    let peer = tap_vm.ip();
    let vm = Vm::start_via(
        &world,
        "shared",
        &format!(
            "ping -c 1 -W 3 192.168.105.1 && echo RESULT-PING-GW-OK\n\
             ping -c 1 -W 3 {peer} && echo RESULT-PING-PEER-OK\n\
             wget -q -O - http://{UPSTREAM_IP}/ | sed 's/^/RESULT-PAGE: /'\n\
             sleep 2\n"
        ),
        AS_NOBODY,
        "vhost-user",
    );
    assert_eq!(vm.info["datapath"], "vhost-user");
    vm.wait_console("linnet-guest: lease");
    let listed = world.listed_interface(&vm.info["interface_id"]);
    assert_eq!(listed["datapath"], "vhost-user", "{listed}");
    // The back-end runs in `linnet run`, as the VM's user, with nothing
    // more: no capability, confined.
    let backend = vm.run.id();
    assert_eq!(proc_status(backend, "Uid"), "65534 65534 65534 65534");
    assert_eq!(proc_status(backend, "CapEff"), "0000000000000000");
    assert_eq!(proc_status(backend, "Seccomp"), "2");
    let (ip, interface) = (vm.ip(), vm.info["interface_id"].clone());
    let console = vm.finish();
    // QEMU's exit ended `linnet run`, and with it the interface.
    assert_eq!(world.listed_interface(&interface), Value::Null);
    assert!(
        console.contains(&format!("linnet-guest: lease ip={ip} ")),
        "the guest got the reported ip {ip}:\n{console}"
    );
    assert!(console.contains("RESULT-PING-GW-OK"), "{console}");
    assert!(console.contains("RESULT-PING-PEER-OK"), "{console}");
    assert!(
        console.contains(&format!("RESULT-PAGE: {UPSTREAM_PAGE}")),
        "{console}"
    );
    drop(tap_vm);
}

/// `linnet helper --vhost-user PATH` and a stand-in front-end that breaks
/// the rules as `hostile` says, once it has a frame to send.
fn hostile_front_end(world: &World, hostile: &str) -> (Reaped, Reaped, Netns, Value, PathBuf) {
    let name = unique("hostile");
    let socket = world.dir.path().join(format!("{name}.sock"));
    let json = world.dir.path().join(format!("{name}.json"));
    let log = world.dir.path().join(format!("{name}.log"));
    let helper = Reaped(
        world
            .linnet(&["helper", "--vhost-user", socket.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&json).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let info: Value = wait_for("the helper's JSON", Duration::from_secs(15), || {
        serde_json::from_str(&std::fs::read_to_string(&json).ok()?).ok()
    });
    let ns = Netns::new("hostile");
    let standin = Reaped(
        Command::new(standin_bin())
            .args([
                "--vhost-user",
                socket.to_str().unwrap(),
                "--hostile",
                hostile,
            ])
            .args([
                "--netns",
                &ns.path(),
                "--mac",
                info["mac_address"].as_str().unwrap(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (helper, standin, ns, info, log)
}

#[test]
fn a_hostile_vhost_user_front_end_ends_only_its_own_relay() {
    let mut world = World::new();
    world.start_daemon();
    // Another VM, on vhost-user too, that must not notice.
    let bystander = world.guest_via("shared", Via::HelperVhostUser, &[]);
    assert_eq!(bystander.udhcpc(), bystander.ip());
    for (hostile, says) in [
        ("outside", "outside the VM's memory"),
        ("loop", "as long as the ring"),
        ("direction", "may write"),
        ("ring", "vhost-user back-end failed"),
    ] {
        let (mut helper, _standin, ns, info, log) = hostile_front_end(&world, hostile);
        // Frames to send: the guest's own pings.
        if hostile != "ring" {
            wait_for("the guest's eth0", Duration::from_secs(10), || {
                ns.links().contains(&"eth0".to_string()).then_some(())
            });
            let _ = run(&mut ns.cmd(&[
                "ip",
                "addr",
                "add",
                &format!("{}/24", info["ip_address"].as_str().unwrap()),
                "dev",
                "eth0",
            ]));
            let _ = run(&mut ns.cmd(&["busybox", "ping", "-c", "2", "-W", "1", "192.168.105.1"]));
        }
        let status = wait_for(
            "the hostile VM's relay to end",
            Duration::from_secs(15),
            || helper.0.try_wait().unwrap(),
        );
        let said = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(125), "{hostile}: {said}");
        assert!(said.contains(says), "{hostile}: the relay says why: {said}");
        wait_for("its interface to go", Duration::from_secs(5), || {
            world
                .listed_interface(&info["interface_id"])
                .is_null()
                .then_some(())
        });
        // The daemon and the other VM carry on.
        assert!(
            bystander.ping(&bystander.gateway()),
            "{hostile}: the bystander"
        );
        must(&mut world.linnet(&["ls"]));
    }
}

#[test]
fn a_vhost_user_guest_is_held_to_its_addresses_and_its_policy() {
    let mut world = World::new();
    world.start_daemon();
    let attacker = world.guest_via("shared", Via::RunVhostUser, &[]);
    assert_eq!(attacker.udhcpc(), attacker.ip());
    assert_eq!(attacker.slaac_addresses(), vec![attacker.ipv6()]);
    let victim = ready(&world, &[]);
    // Anti-spoofing: only the honest frames cross, each spoof counted.
    let mut kinds = vec!["honest"];
    kinds.extend(SPOOFS);
    let seen = send_and_capture(&attacker, &victim, &kinds);
    assert_eq!(seen, vec!["LINNET-honest".to_string()]);
    assert_eq!(spoofed_drops(&world, &attacker), Some(SPOOFS.len() as u64));

    // A policy: the web server upstream, and nothing else.
    let held = world.guest_via(
        "shared",
        Via::HelperVhostUser,
        &["--allow-connect", &format!("{UPSTREAM_IP}:80/tcp")],
    );
    assert_eq!(held.udhcpc(), held.ip());
    assert_eq!(
        held.fetch(&format!("http://{UPSTREAM_IP}/"))
            .as_deref()
            .map(str::trim),
        Some(UPSTREAM_PAGE)
    );
    assert!(attacker.ping(UPSTREAM_IP), "a ping reaches upstream unheld");
    assert!(!held.ping(UPSTREAM_IP), "but not past the policy");
}

#[test]
fn qemu_started_on_its_own_reconnects_to_a_restarted_helper_and_its_guest_pings_on() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    let dir = crate::qemu::vm_dir(&world);
    let socket = dir.join("vm.vhost");
    let socket_s = socket.to_str().unwrap().to_string();
    let mac = "52:54:00:76:68:01";
    // The same interface (and so its lease) for each helper: as a user
    // restarts one, with the id from its JSON.
    const INTERFACE: &str = "6b1c6b70-7668-4c4c-9c9c-000000000001";
    let helper =
        |n: usize| vhost_user_helper(&world, &socket, mac, INTERFACE, &format!("helper{n}"));
    let (mut first, info) = helper(1);
    assert_eq!(info["datapath"], "vhost-user");
    let nic = [
        "-object",
        "memory-backend-memfd,id=mem,size=256M,share=on",
        "-machine",
        "memory-backend=mem",
        "-chardev",
        &format!("socket,id=vu,path={socket_s},reconnect=1"),
        "-netdev",
        "vhost-user,id=n0,chardev=vu",
        "-device",
        &format!("virtio-net-pci,netdev=n0,mac={mac},vectors=0"),
    ];
    // Pings the gateway twice a second, saying which answered.
    let script = "i=0; while [ $i -lt 240 ]; do ping -c 1 -W 1 192.168.105.1 >/dev/null && echo PING-OK-$i; i=$((i+1)); sleep 0.5; done\n";
    let mut vm = Vm::start_on_socket(&world, AS_NOBODY, &nic, mac, script);
    vm.wait_console("PING-OK");
    // The back-end (the helper's relay) is the user's, with nothing more.
    let relay = first.0.id();
    assert_eq!(proc_status(relay, "Uid"), "65534 65534 65534 65534");
    assert_eq!(proc_status(relay, "CapEff"), "0000000000000000");

    // The helper goes (its interface with it) and another takes its place
    // on the same socket: QEMU connects again, the guest pings on.
    terminate(&mut first.0);
    wait_for(
        "the first helper's interface to go",
        Duration::from_secs(5),
        || {
            world
                .listed_interface(&info["interface_id"])
                .is_null()
                .then_some(())
        },
    );
    let answered = |console: &str| console.matches("PING-OK").count();
    let before = answered(&vm.console());
    let (_second, again) = helper(2);
    assert_eq!(
        (&again["mac_address"], &again["ip_address"]),
        (&info["mac_address"], &info["ip_address"])
    );
    wait_for("pings through the new helper", BOOT_TIMEOUT_SECS, || {
        (answered(&vm.console()) >= before + 3).then_some(())
    });
    let _ = vm.run.kill();
    let _ = vm.run.wait();
}

/// `linnet helper --vhost-user SOCKET` as nobody, for `interface` with
/// `mac`, once it has printed its JSON; `name` names its files.
fn vhost_user_helper(
    world: &World,
    socket: &std::path::Path,
    mac: &str,
    interface: &str,
    name: &str,
) -> (Reaped, Value) {
    let json = socket.with_file_name(format!("{name}.json"));
    let log = world.dir.path().join(format!("{name}.log"));
    let mut child = world
        .linnet_wrapped(
            AS_NOBODY,
            &[
                "helper",
                "--interface-id",
                interface,
                "--mac",
                mac,
                "--vhost-user",
                socket.to_str().unwrap(),
            ],
        )
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&json).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let info: Value = wait_for("the helper's JSON", Duration::from_secs(15), || {
        if let Some(status) = child.try_wait().unwrap() {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            let ls = must(&mut world.linnet(&["ls", "--json"]));
            panic!("{name} exited with {status}: {said}\n{ls}");
        }
        serde_json::from_str(&std::fs::read_to_string(&json).ok()?).ok()
    });
    (Reaped(child), info)
}

#[test]
fn linnet_attach_vhost_user_serves_in_the_background_until_linnet_detach_stops_it() {
    let mut world = World::new();
    world.start_daemon();
    let socket = world.dir.path().join("vu1.vhost");
    let socket_s = socket.to_str().unwrap();
    let out = run(&mut world.linnet(&["attach", "--name", "vu1", "--vhost-user", socket_s]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The command returned; its back-end serves on, a session of its own.
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["datapath"], "vhost-user");
    let listed = |world: &World| world.listed_interface(&info["interface_id"]);
    let backend = listed(&world)["client_pid"].as_i64().unwrap();
    // Stopped however the test ends: it is nobody's child here.
    let _stop = StopOnDrop(backend);
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{backend}/comm"))
            .unwrap()
            .trim(),
        "linnet-relay"
    );
    assert_eq!(proc_status(backend, "Seccomp"), "2");
    let log = world.dir.path().join("vu1.vmm");
    let guest = Guest::on_socket(
        Netns::new("guest"),
        "--vhost-user",
        socket_s,
        info.clone(),
        &log,
    );
    assert_eq!(guest.udhcpc(), guest.ip());
    assert!(guest.ping(&guest.gateway()));

    // Another user may not stop it; its own (root here) may.
    let refused = run(&mut world.linnet_wrapped(AS_NOBODY, &["detach", "--name", "vu1"]));
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("another user's vhost-user back-end"),
        "{said}"
    );
    assert!(guest.ping(&guest.gateway()), "still served");
    must(&mut world.linnet(&["detach", "--name", "vu1"]));
    assert_eq!(listed(&world), Value::Null, "detached");
    // Gone, or a zombie until the sandbox's PID 1 reaps it (its parent
    // exited).
    wait_for("the back-end to exit", Duration::from_secs(5), || {
        let status = std::fs::read_to_string(format!("/proc/{backend}/status")).unwrap_or_default();
        (status.is_empty() || status.contains("State:\tZ")).then_some(())
    });
    assert!(!socket.exists(), "its socket removed");
}

/// Kills a process this test started but does not own as a child.
struct StopOnDrop(i64);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// libvirt's session daemon of the VM's user (no root anywhere) runs a
/// domain with docs/vmms.md's `<interface type='vhostuser'>` and shared
/// memory, on `linnet helper --vhost-user`: the guest leases the address
/// the helper reported and pings the gateway, and so does a second domain
/// once the first has gone.
#[test]
fn a_libvirt_session_domain_on_linnet_helper_vhost_user_leases_and_pings() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    let dir = crate::qemu::vm_dir(&world);
    let socket = dir.join("lv.vhost");
    let mac = "52:54:00:76:68:02";
    let (_helper, info) = vhost_user_helper(
        &world,
        &socket,
        mac,
        "6b1c6b70-7668-4c4c-9c9c-000000000002",
        "lv-helper",
    );
    let session = LibvirtSession::new(&dir);
    let ip = info["ip_address"].as_str().unwrap().to_string();
    let script = "ping -c 1 -W 3 192.168.105.1 && echo RESULT-PING-GW-OK\n";
    // Twice: the helper serves the next domain once one has gone.
    for round in 1..=2 {
        let name = unique("linnet-lv");
        let console = dir.join(format!("{name}.console"));
        let xml = dir.join(format!("{name}.xml"));
        std::fs::write(&xml, libvirt_domain(&name, mac, &socket, &console, script)).unwrap();
        let created = session.virsh(&["create", xml.to_str().unwrap()]);
        assert!(
            created.status.success(),
            "virsh create: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        let deadline = std::time::Instant::now() + BOOT_TIMEOUT_SECS;
        let text = loop {
            let text = std::fs::read_to_string(&console).unwrap_or_default();
            if text.contains("RESULT-PING-GW-OK") || text.contains("powering off") {
                break text;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: no ping from the libvirt guest in {BOOT_TIMEOUT_SECS:?}; its console:\n{text}\nlibvirt's log of it:\n{}",
                session.log(&name)
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(
            text.contains(&format!("linnet-guest: lease ip={ip} ")),
            "round {round}: the guest got the helper's address {ip}:\n{text}"
        );
        assert!(text.contains("RESULT-PING-GW-OK"), "round {round}: {text}");
        // The guest powers off and the domain goes, QEMU with it; the
        // helper serves on, its interface listed.
        wait_for("the domain to end", BOOT_TIMEOUT_SECS, || {
            let listed = session.virsh(&["list", "--name"]);
            (!String::from_utf8_lossy(&listed.stdout).contains(&name)).then_some(())
        });
        assert_eq!(
            world.listed_interface(&info["interface_id"])["mac_address"],
            mac
        );
    }
}

/// A transient libvirt domain booting the test guest, which runs `script`
/// and powers off; its NIC docs/vmms.md's `<interface type='vhostuser'>`
/// on `socket`, its memory shared, its serial console to `console`.
/// Under TCG QEMU 7.2 crashes starting a vhost-user NIC with MSI-X, so
/// the NIC has no vectors (as `linnet run` gives it without KVM).
fn libvirt_domain(
    name: &str,
    mac: &str,
    socket: &std::path::Path,
    console: &std::path::Path,
    script: &str,
) -> String {
    format!(
        "<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <memoryBacking>
    <source type='memfd'/>
    <access mode='shared'/>
  </memoryBacking>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>{cmdline}</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <interface type='vhostuser'>
      <mac address='{mac}'/>
      <source type='unix' path='{socket}' mode='client'>
        <reconnect enabled='yes' timeout='1'/>
      </source>
      <model type='virtio'/>
      <alias name='ua-lnet'/>
    </interface>
  </devices>
  <qemu:override>
    <qemu:device alias='ua-lnet'>
      <qemu:frontend>
        <qemu:property name='vectors' type='unsigned' value='0'/>
      </qemu:frontend>
    </qemu:device>
  </qemu:override>
</domain>
",
        kernel = crate::qemu::guest_file("vmlinuz"),
        initrd = crate::qemu::guest_file("initrd.img"),
        cmdline = crate::qemu::guest_cmdline(script, ""),
        console = console.display(),
        socket = socket.display(),
    )
}

/// libvirt's per-user daemon (`qemu:///session`) for nobody, started by
/// the test (not by virsh, whose own start of it holds virsh's output open
/// until the daemon's idle timeout), its home and runtime directories
/// under `dir`; stopped, with its domains, on drop.
struct LibvirtSession {
    home: PathBuf,
    runtime: PathBuf,
    daemon: Option<Helper>,
}

impl LibvirtSession {
    fn new(dir: &std::path::Path) -> LibvirtSession {
        use std::os::unix::fs::PermissionsExt;
        let (home, runtime) = (dir.join("lv-home"), dir.join("lv-run"));
        for d in [&home, &runtime] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
        }
        // QEMU's output to a file of its own, not through virtlogd (a
        // daemon more, which would outlive the test).
        let config = home.join(".config/libvirt");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("qemu.conf"), "stdio_handler = \"file\"\n").unwrap();
        for d in [
            home.join(".config"),
            config.clone(),
            config.join("qemu.conf"),
        ] {
            std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
        }
        let mut session = LibvirtSession {
            home,
            runtime,
            daemon: None,
        };
        let log = dir.join("libvirtd.log");
        let daemon = Helper::start("libvirtd", session.as_nobody("libvirtd"), &log);
        let socket = session.runtime.join("libvirt/libvirt-sock");
        daemon.wait_for("libvirtd's session socket", Duration::from_secs(30), || {
            socket.exists().then_some(())
        });
        session.daemon = Some(daemon);
        session
    }

    /// `program` as nobody, in this session's environment.
    fn as_nobody(&self, program: &str) -> Command {
        let mut cmd = Command::new(AS_NOBODY[0]);
        cmd.args(&AS_NOBODY[1..])
            .arg(program)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .stdin(Stdio::null());
        cmd
    }

    /// `virsh -c qemu:///session ARGS`.
    fn virsh(&self, args: &[&str]) -> std::process::Output {
        self.as_nobody("virsh")
            .args(["-q", "-c", "qemu:///session"])
            .args(args)
            .output()
            .unwrap()
    }

    /// libvirt's log of a domain: QEMU's command line and what it said.
    fn log(&self, domain: &str) -> String {
        let path = self
            .home
            .join(format!(".cache/libvirt/qemu/log/{domain}.log"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| format!("{}: {e}", path.display()))
    }
}

impl Drop for LibvirtSession {
    fn drop(&mut self) {
        // A session whose daemon never served has no domains; virsh
        // would only try (for seconds) to start a daemon of its own.
        if self.daemon.is_none() {
            return;
        }
        let listed = self.virsh(&["list", "--name"]);
        for domain in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
            let _ = self.virsh(&["destroy", domain]);
        }
    }
}
