//! lima (v2.2.0, scripts/build-lima) to its shell with a VM on a linnet
//! network's socket (`make compat`: lima is not packaged in Debian). The
//! Debian guest of scripts/build-guest-debian boots as lima's image (its
//! kernel and initrd directly), lima's own NIC carries its ssh, and the
//! second NIC, `networks: [{socket: …}]`, is linnet's: in `limactl shell`
//! it has the address linnet leased to its MAC, fetches the upstream's
//! page through linnet's NAT and pings another linnet VM. docs/lima.md
//! shows the template.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

/// A Debian boot under emulation, lima's cloud-init, its guest agent.
const LIMA_PATIENCE: Duration = Duration::from_secs(900);

/// limactl, as scripts/build-lima links it.
fn limactl() -> PathBuf {
    let bin = repo_file("target/peers/lima/bin/limactl");
    assert!(
        Path::new(&bin).is_file(),
        "no {bin}: run scripts/build-lima (make compat does)"
    );
    PathBuf::from(bin)
}

/// The template docs/lima.md shows: the Debian guest's kernel, initrd and
/// disk (lima copies the disk), no mounts, no containerd, linnet's socket
/// as the second NIC.
fn template(socket: &Path) -> String {
    let image = |name: &str| {
        std::fs::canonicalize(crate::qemu::built_guest_file("guest-debian", name))
            .unwrap()
            .display()
            .to_string()
    };
    format!(
        r#"vmType: qemu
os: Linux
arch: x86_64
cpus: 1
memory: 1GiB
disk: 4GiB
images:
- location: {disk}
  arch: x86_64
  kernel:
    location: {kernel}
    cmdline: root=/dev/vda rw console=ttyS0
  initrd:
    location: {initrd}
firmware:
  legacyBIOS: true
mounts: []
containerd:
  system: false
  user: false
user:
  name: lima
  uid: 1000
ssh:
  loadDotSSHPubKeys: false
networks:
- socket: {socket}
"#,
        disk = image("disk.img"),
        kernel = image("vmlinuz"),
        initrd = image("initrd.img"),
        socket = socket.display()
    )
}

/// limactl as nobody (it refuses root) in the world's namespace, its home
/// in `home`; under emulation when this machine's KVM cannot run guests
/// (lima uses KVM whenever /dev/kvm exists, and takes QEMU's arguments
/// from QEMU_SYSTEM_X86_64).
fn lima(world: &World, home: &Path, args: &[&str]) -> Command {
    let mut argv = AS_NOBODY.to_vec();
    let (home_s, lima_home) = (
        home.join("home").display().to_string(),
        home.join("lima").display().to_string(),
    );
    let path = format!(
        "PATH={}:/usr/local/bin:/usr/bin:/bin",
        limactl().parent().unwrap().display()
    );
    let home_env = format!("HOME={home_s}");
    let lima_env = format!("LIMA_HOME={lima_home}");
    argv.extend(["env", "-i", &home_env, &lima_env, "USER=nobody", &path]);
    let tcg = "QEMU_SYSTEM_X86_64=qemu-system-x86_64 -machine q35,vmport=off,accel=tcg -cpu qemu64";
    if !crate::qemu::accel_args().contains(&"kvm") {
        argv.push(tcg);
    }
    argv.push("limactl");
    argv.extend_from_slice(args);
    world.host.cmd(&argv)
}

/// Stops and deletes the instance, whatever became of the test.
struct Instance<'a> {
    world: &'a World,
    home: PathBuf,
}

impl Drop for Instance<'_> {
    fn drop(&mut self) {
        let _ = run(&mut lima(
            self.world,
            &self.home,
            &["delete", "--force", "linnet"],
        ));
    }
}

#[test]
#[ignore = "make compat: needs lima (scripts/build-lima)"]
fn lima_reaches_its_shell_with_a_vm_on_a_linnet_network_socket() {
    let mut world = World::with_config(
        "networks:\n  shared:\n    socket: true\n    allow: { users: [root, nobody] }\n",
    );
    world.start_daemon();
    let peer = world.guest("shared", &["--name", "peer"]);
    let peer_ip = peer.udhcpc().to_string();
    // lima's home, nobody's, under a short path (its sockets' paths must
    // fit a sockaddr_un).
    let home = PathBuf::from(must(Command::new("mktemp").args(["-d", "/tmp/lnl.XXXX"])).trim());
    for dir in [home.join("home"), home.join("lima")] {
        std::fs::create_dir_all(&dir).unwrap();
    }
    must(Command::new("chown").args(["-R", "65534:65534", home.to_str().unwrap()]));
    std::fs::set_permissions(
        world.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let socket = world.run_dir().join("shared.sock");
    let yaml = home.join("linnet.yaml");
    std::fs::write(&yaml, template(&socket)).unwrap();
    let instance = Instance {
        world: &world,
        home: home.clone(),
    };

    let started = std::time::Instant::now();
    let log = world.dir.path().join("lima-start.log");
    let start = lima(
        &world,
        &home,
        &[
            "start",
            "--tty=false",
            "--timeout",
            "14m",
            "--name",
            "linnet",
            yaml.to_str().unwrap(),
        ],
    );
    let mut start = Helper::start("limactl start", start, &log);
    wait_for("limactl start to end", LIMA_PATIENCE, || start.ended());
    assert!(
        start.wait().unwrap().success(),
        "limactl start failed:\n{}",
        start.tail(60)
    );
    let ready = started.elapsed();

    let script = format!(
        "ip -4 -o addr show dev lima0 | awk '{{print $4}}' | cut -d/ -f1; \
         cat /sys/class/net/lima0/address; \
         curl -s -m 10 http://{UPSTREAM_IP}/; \
         ping -c 3 -W 2 {peer_ip} >/dev/null && echo PING-OK"
    );
    let shell = must(&mut lima(
        &world,
        &home,
        &["shell", "linnet", "--", "sh", "-c", &script],
    ));
    let lines: Vec<&str> = shell.lines().map(str::trim).collect();
    assert!(lines.len() >= 4, "{shell}");
    let (ip, mac) = (lines[0], lines[1]);
    // What linnet lists for that MAC, on the socket's stream datapath.
    let listing: Value = serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).unwrap();
    let listed = (listing["interfaces"].as_array().unwrap().iter())
        .find(|i| i["mac_address"] == mac)
        .unwrap_or_else(|| panic!("no interface of {mac}: {listing}"))
        .clone();
    assert_eq!(
        listed["ip_address"], ip,
        "the lease linnet gave lima0: {listed}"
    );
    assert_eq!(listed["datapath"], "stream", "{listed}");
    assert_eq!(
        lines[2], UPSTREAM_PAGE,
        "the upstream through linnet's NAT: {shell}"
    );
    assert_eq!(lines[3], "PING-OK", "another linnet VM: {shell}");
    eprintln!(
        "lima: ready {:.0} s after limactl start, shell answered at {:.0} s",
        ready.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    drop(instance);
    let _ = std::fs::remove_dir_all(&home);
}
