//! End-to-end with real VMs: QEMU (KVM when it works, else software
//! emulation) booting the tiny guest
//! of scripts/build-guest through `linnet run`. Assertions read what the guest
//! prints on its serial console.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use crate::harness::*;

const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

/// `-accel kvm -accel tcg` when KVM really boots the guest here (QEMU falls
/// back to tcg if the VM's user cannot open /dev/kvm), else `-accel tcg`.
/// scripts/qemu-accel decides, once per test run.
pub(crate) fn accel_args() -> &'static [&'static str] {
    static ACCEL: std::sync::OnceLock<&'static [&'static str]> = std::sync::OnceLock::new();
    ACCEL.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/qemu-accel");
        let out = Command::new(script).stderr(Stdio::inherit()).output();
        let out = out.unwrap_or_else(|e| panic!("{script}: {e}"));
        assert!(out.status.success(), "{script} failed: {}", out.status);
        match String::from_utf8_lossy(&out.stdout).trim() {
            "kvm" => &["-accel", "kvm", "-accel", "tcg"],
            _ => &["-accel", "tcg"],
        }
    })
}

pub(crate) fn guest_file(name: &str) -> String {
    built_guest_file("guest", name)
}

/// `name` of the guest that scripts/build-`dir` builds into target/`dir`.
pub(crate) fn built_guest_file(dir: &str, name: &str) -> String {
    let path = linnet_bin()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join(dir)
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/build-{dir} (make test does)",
        path.display()
    );
    path.display().to_string()
}

/// A directory for VMs' files that the VM's user, maybe not root, can use.
pub(crate) fn vm_dir(world: &World) -> std::path::PathBuf {
    // A sticky world-writable directory: the VM may run as another user.
    let dir = world.dir.path().join("vms");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    std::fs::set_permissions(
        world.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    dir
}

/// QEMU booting the test guest, which runs `script` after DHCP and powers
/// off; no NIC (the caller adds one, or `linnet run` does).
pub(crate) fn qemu_command(name: &str, script: &str) -> Vec<String> {
    qemu_command_with(name, script, "")
}

/// As `qemu_command`, with more of the guest's kernel command line (e.g.
/// `linnet.nodhcp`: the script configures the NIC).
pub(crate) fn qemu_command_with(name: &str, script: &str, cmdline: &str) -> Vec<String> {
    let append = guest_cmdline(script, cmdline);
    let mut args = vec!["qemu-system-x86_64".to_string()];
    args.extend(accel_args().iter().map(|a| a.to_string()));
    args.extend(
        [
            "-m",
            "256",
            "-nographic",
            "-no-reboot",
            "-name",
            name,
            "-kernel",
            &guest_file("vmlinuz"),
            "-initrd",
            &guest_file("initrd.img"),
            "-append",
            &append,
        ]
        .map(String::from),
    );
    args
}

/// The test guest's kernel command line: its console on the first serial
/// port, `script` to run after DHCP, and `more`.
pub(crate) fn guest_cmdline(script: &str, more: &str) -> String {
    let script = base64::engine::general_purpose::STANDARD.encode(script);
    format!("console=ttyS0 quiet linnet.script={script} {more}")
}

/// A VM started with `linnet run -- qemu-system-x86_64 …`, running `script`
/// after DHCP and powering off.
pub struct Vm {
    pub info: Value,
    /// `linnet run` (QEMU its child), or QEMU started on its own.
    pub run: Helper,
    console: std::path::PathBuf,
    pub name: String,
}

impl Vm {
    pub fn start(world: &World, network: &str, script: &str, prefix: &[&str]) -> Vm {
        Vm::start_via(world, network, script, prefix, "tap")
    }

    /// As `start`, with `linnet run --datapath DATAPATH`.
    pub fn start_via(
        world: &World,
        network: &str,
        script: &str,
        prefix: &[&str],
        datapath: &str,
    ) -> Vm {
        let name = unique("linnet-vm");
        let dir = vm_dir(world);
        let json = dir.join(format!("{name}.json"));
        let json_s = json.display().to_string();
        let mut args: Vec<String> = [
            "run",
            "--network",
            network,
            "--datapath",
            datapath,
            "--json",
            &json_s,
            "--",
        ]
        .map(String::from)
        .to_vec();
        args.extend(qemu_command(&name, script));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Vm::launch(world, world.linnet_wrapped(prefix, &args), name, &json)
    }

    /// `cmd` (a `linnet run … -- QEMU` writing its JSON to `json`) as VM
    /// `name`, its console captured.
    pub fn launch(world: &World, cmd: Command, name: String, json: &std::path::Path) -> Vm {
        let (console, run) = Vm::spawn(world, &name, "linnet run", cmd);
        let info = run.wait_for("the attach JSON", Duration::from_secs(15), || {
            serde_json::from_str::<Value>(&std::fs::read_to_string(json).ok()?).ok()
        });
        Vm {
            info,
            run,
            console,
            name,
        }
    }

    /// QEMU started on its own (no `linnet run`) with `nic` (its -netdev
    /// and -device), through `wrapper` when given; `info` is the interface
    /// `linnet ls` shows for `mac` once QEMU's first frame has attached it.
    pub fn start_on_socket(
        world: &World,
        wrapper: &[&str],
        nic: &[&str],
        mac: &str,
        script: &str,
    ) -> Vm {
        let name = unique("linnet-vm");
        let qemu = qemu_command(&name, script);
        let mut argv: Vec<&str> = wrapper.to_vec();
        argv.extend(qemu.iter().map(String::as_str));
        argv.extend_from_slice(nic);
        let (console, run) = Vm::spawn(world, &name, "QEMU", world.host.cmd(&argv));
        let info = run.wait_for(&format!("{mac} on the network"), BOOT_TIMEOUT, || {
            let listing: Value =
                serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).ok()?;
            listing["interfaces"]
                .as_array()?
                .iter()
                .find(|i| i["mac_address"] == mac)
                .cloned()
        });
        Vm {
            info,
            run,
            console,
            name,
        }
    }

    /// `cmd` as VM `name`'s `what`: its stdout (the serial console) to
    /// NAME.console, its stderr to NAME.stderr.
    fn spawn(world: &World, name: &str, what: &str, mut cmd: Command) -> (PathBuf, Helper) {
        let console = world.dir.path().join(format!("{name}.console"));
        let stderr = world.dir.path().join(format!("{name}.stderr"));
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&console).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        let run = Helper::spawn(&format!("{name}'s {what}"), cmd, &[&stderr, &console]);
        (console, run)
    }

    pub fn ip(&self) -> String {
        self.info["ip_address"].as_str().unwrap().to_string()
    }

    pub fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console).unwrap_or_default()).into_owned()
    }

    pub fn wait_console(&self, marker: &str) -> String {
        self.wait_console_within(marker, BOOT_TIMEOUT)
    }

    /// As `wait_console`, for a guest that takes `patience` (a systemd
    /// boot under emulation).
    pub fn wait_console_within(&self, marker: &str, patience: Duration) -> String {
        self.run.wait_for(
            &format!("\"{marker}\" on {}'s console", self.name),
            patience,
            || {
                let text = self.console();
                text.contains(marker).then_some(text)
            },
        )
    }

    /// Waits for the guest to power off; returns the console.
    pub fn finish(self) -> String {
        self.finish_within(BOOT_TIMEOUT)
    }

    /// As `finish`, for a guest that takes `patience`.
    pub fn finish_within(mut self, patience: Duration) -> String {
        let text = self.wait_console_within("linnet-guest: powering off", patience);
        let status = wait_for("QEMU to exit", patience, || self.run.try_wait().unwrap());
        assert!(status.success(), "linnet run exited with {status}\n{text}");
        text
    }

    pub fn qemu_pid(&self) -> String {
        // QEMU's own command line, not linnet run's (which holds the same words).
        must(
            Command::new("pgrep")
                .args(["-f", &format!("^qemu-system-x86_64 .*-name {}", self.name)]),
        )
        .trim()
        .to_string()
    }
}

#[test]
fn qemu_vm_gets_reported_ip_pings_gateway_fetches_through_nat_and_resolves() {
    let mut world = World::new();
    world.start_daemon();
    let vm = Vm::start(
        &world,
        "shared",
        &format!(
            "ping -c 1 -W 3 192.168.105.1 && echo RESULT-PING-GW-OK\n\
             wget -q -O - http://{UPSTREAM_IP}/ | sed 's/^/RESULT-PAGE: /'\n\
             nslookup {UPSTREAM_NAME} 192.168.105.1 | sed -n 's/^Address: /RESULT-DNS: /p'\n\
             i=0; while [ $i -lt 50 ] && ! ip -6 addr show dev eth0 | grep 'scope global' | grep -qv tentative; do sleep 0.2; i=$((i+1)); done\n\
             ip -6 addr show dev eth0 | sed -n 's/.*inet6 \\([^/]*\\)\\/64 scope global.*/RESULT-IPV6: \\1/p'\n\
             ip -6 route | grep -q '^default via fe80::1' && echo RESULT-ROUTE6-OK\n"
        ),
        &[],
    );
    let ip = vm.ip();
    let ipv6 = vm.info["ipv6_address"].as_str().unwrap().to_string();
    let console = vm.finish();
    assert!(
        console.contains(&format!("linnet-guest: lease ip={ip} ")),
        "the guest got the reported ip {ip}:\n{console}"
    );
    assert!(console.contains("RESULT-PING-GW-OK"), "{console}");
    assert!(
        console.contains(&format!("RESULT-PAGE: {UPSTREAM_PAGE}")),
        "{console}"
    );
    assert!(
        console.contains(&format!("RESULT-DNS: {UPSTREAM_IP}")),
        "{console}"
    );
    let formed: Vec<&str> = console
        .lines()
        .filter_map(|l| l.trim().strip_prefix("RESULT-IPV6: "))
        .collect();
    assert_eq!(
        formed,
        vec![ipv6.as_str()],
        "the guest formed exactly the reported IPv6 address by SLAAC:\n{console}"
    );
    assert!(console.contains("RESULT-ROUTE6-OK"), "{console}");
}

#[test]
fn two_qemu_vms_on_shared_ping_each_other_and_a_host_vm_cannot_reach_upstream() {
    let mut world = World::new();
    world.start_daemon();
    // Upstream routes the host network back, and a guest on shared keeps
    // forwarding on whatever the VMs' pace: were it not for linnet's rule,
    // the host VM's packets would go out and their answers come back. A
    // capture on upstream's link sees what gets out (a DNS query carries
    // each VM's marker).
    world.route_back("192.168.106.0/24");
    let _forwarding = world.guest("shared", &[]);
    let capture = Capture::start(&world.upstream, "eth0", 600);
    let a = Vm::start(&world, "shared", "sleep 20\n", &[]);
    let peer = a.ip();
    let b = Vm::start(
        &world,
        "shared",
        &format!(
            "for i in $(seq 30); do ping -c 1 -W 1 {peer} >/dev/null && echo RESULT-PEER-OK && break; sleep 0.5; done\n\
             nslookup LINNET-shared-vm {UPSTREAM_IP} >/dev/null 2>&1; echo RESULT-MARKER-SENT\n"
        ),
        &[],
    );
    // DHCP gives a host network no router: the VM routes to the gateway
    // itself, so that only the firewall can stop it.
    let h = Vm::start(
        &world,
        "host",
        &format!(
            "ping -c 1 -W 2 192.168.106.1 && echo RESULT-HOST-OK\n\
             ip route add default via 192.168.106.1\n\
             ping -c 1 -W 2 {UPSTREAM_IP} || echo RESULT-UPSTREAM-BLOCKED\n\
             nslookup LINNET-host-vm {UPSTREAM_IP} >/dev/null 2>&1; echo RESULT-MARKER-SENT\n"
        ),
        &[],
    );
    let console_b = b.finish();
    assert!(
        console_b.contains("RESULT-PEER-OK"),
        "VM to VM:\n{console_b}"
    );
    let console_h = h.finish();
    assert!(
        console_h.contains("RESULT-HOST-OK"),
        "host-only VM reaches the host:\n{console_h}"
    );
    assert!(
        console_h.contains("RESULT-UPSTREAM-BLOCKED"),
        "host-only VM cannot reach upstream:\n{console_h}"
    );
    for console in [&console_b, &console_h] {
        assert!(console.contains("RESULT-MARKER-SENT"), "{console}");
    }
    assert_eq!(
        must(&mut world.host.cmd(&["cat", "/proc/sys/net/ipv4/ip_forward"])).trim(),
        "1",
        "forwarding was on all along"
    );
    assert_eq!(
        capture.stop(),
        vec!["LINNET-shared-vm"],
        "upstream's link carried the shared VM's query, never the host VM's"
    );
    drop(a);
}

#[test]
fn qemu_runs_unprivileged_with_the_tap_fd_from_linnet_run() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    let vm = Vm::start(
        &world,
        "shared",
        "ping -c 1 -W 3 192.168.105.1 && echo RESULT-PING-GW-OK\nsleep 2\n",
        AS_NOBODY,
    );
    vm.wait_console("linnet-guest: lease");
    let status = must(Command::new("cat").arg(format!("/proc/{}/status", vm.qemu_pid())));
    let uid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap()
        .to_string();
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65534"),
        "QEMU runs as nobody: {uid}"
    );
    let ip = vm.ip();
    let console = vm.finish();
    assert!(
        console.contains(&format!("lease ip={ip} ")) && console.contains("RESULT-PING-GW-OK"),
        "{console}"
    );
}

#[test]
fn sigkill_of_qemu_leaves_nothing_behind() {
    let mut world = World::new();
    world.start_daemon();
    let mut vm = Vm::start(&world, "shared", "sleep 60\n", &[]);
    let tap = vm.info["tap"].as_str().unwrap().to_string();
    vm.wait_console("linnet-guest: lease");
    assert!(world.host.links().contains(&tap));
    must(Command::new("kill").args(["-KILL", &vm.qemu_pid()]));
    let status = wait_for("linnet run to exit", Duration::from_secs(10), || {
        vm.run.try_wait().unwrap()
    });
    assert_eq!(
        status.code(),
        Some(137),
        "linnet run reports the VMM's SIGKILL"
    );
    wait_for("the TAP and bridge to go", Duration::from_secs(5), || {
        let links = world.host.links();
        (!links.contains(&tap) && !links.iter().any(|l| l.starts_with("ln-"))).then_some(())
    });
    assert!(must(&mut world.linnet(&["ls", "--json"])).contains("\"interfaces\": []"));
}

#[test]
fn qemu_boots_with_netdev_dgram_and_stream_through_linnet_run_and_gets_its_address() {
    let mut world = World::new();
    world.start_daemon();
    let script = "ping -c 1 -W 3 192.168.105.1 && echo RESULT-PING-GW-OK\n";
    let vms: Vec<Vm> = ["dgram", "stream"]
        .iter()
        .map(|datapath| Vm::start_via(&world, "shared", script, &[], datapath))
        .collect();
    for vm in vms {
        assert_ne!(vm.info["datapath"], "tap");
        let (ip, datapath) = (vm.ip(), vm.info["datapath"].clone());
        let console = vm.finish();
        assert!(
            console.contains(&format!("linnet-guest: lease ip={ip} ")),
            "{datapath}: the guest got the reported ip {ip}:\n{console}"
        );
        assert!(
            console.contains("RESULT-PING-GW-OK"),
            "{datapath}: {console}"
        );
    }
}

#[test]
fn two_qemu_guests_on_the_network_socket_by_netdev_stream_and_socket_fd_lease_and_reach_all() {
    // B as lima makes it: its NIC net1, a MAC of lima's 52:55:55 prefix.
    let (a_mac, b_mac) = ("52:54:00:17:00:01", "52:55:55:17:00:02");
    let (a_ip, b_ip) = ("192.168.105.50", "192.168.105.51");
    let mut world = World::with_config(&format!(
        "networks:\n  shared:\n    socket: true\n    dhcp:\n      static:\n        - {{ ip: {a_ip}, mac: \"{a_mac}\" }}\n        - {{ ip: {b_ip}, mac: \"{b_mac}\" }}\n"
    ));
    world.start_daemon();
    let socket = world.run_dir().join("shared.sock");
    let socket = socket.to_str().unwrap();
    let script = |peer: &str| {
        format!(
            "ping -c 1 -W 3 192.168.105.1 && echo RESULT-PING-GW-OK\n\
             for i in $(seq 60); do ping -c 1 -W 1 {peer} >/dev/null && echo RESULT-PEER-OK && break; sleep 0.5; done\n\
             wget -q -O - http://{UPSTREAM_IP}/ | sed 's/^/RESULT-PAGE: /'\n\
             sleep 10\n"
        )
    };
    let stream = format!("stream,id=n0,server=off,addr.type=unix,addr.path={socket}");
    let a_device = format!("virtio-net-pci,netdev=n0,mac={a_mac}");
    let a = Vm::start_on_socket(
        &world,
        &[],
        &["-netdev", &stream, "-device", &a_device],
        a_mac,
        &script(b_ip),
    );
    // `linnet connect` connects and hands QEMU the connection as fd 3, as
    // lima's `fd_connect` and socket_vmnet_client do.
    let b_device = format!("virtio-net-pci,netdev=net1,mac={b_mac}");
    let linnet = linnet_bin();
    let env_run_dir = format!("LINNET_RUN_DIR={}", world.run_dir().display());
    let b = Vm::start_on_socket(
        &world,
        &[
            "env",
            &env_run_dir,
            linnet.to_str().unwrap(),
            "connect",
            "shared",
            "--",
        ],
        &["-netdev", "socket,id=net1,fd=3", "-device", &b_device],
        b_mac,
        &script(a_ip),
    );
    assert_eq!((a.ip(), b.ip()), (a_ip.to_string(), b_ip.to_string()));
    for (vm, what) in [
        (a, "-netdev stream"),
        (b, "linnet connect, -netdev socket,fd=3"),
    ] {
        assert_eq!(vm.info["datapath"], "stream");
        let ip = vm.ip();
        let console = vm.finish();
        assert!(
            console.contains(&format!("linnet-guest: lease ip={ip} ")),
            "{what}: leases its address:\n{console}"
        );
        for result in ["RESULT-PING-GW-OK", "RESULT-PEER-OK"] {
            assert!(console.contains(result), "{what}: {result}:\n{console}");
        }
        assert!(
            console.contains(&format!("RESULT-PAGE: {UPSTREAM_PAGE}")),
            "{what}: upstream through NAT:\n{console}"
        );
    }
    wait_for(
        "both interfaces to go with QEMU",
        Duration::from_secs(10),
        || {
            must(&mut world.linnet(&["ls", "--json"]))
                .contains("\"interfaces\": []")
                .then_some(())
        },
    );
}
