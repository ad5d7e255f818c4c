//! Firecracker and Cloud Hypervisor on linnet's TAPs, run as an
//! unprivileged user as docs/vmms.md tells users to (`make compat`: they
//! are not packaged in Debian, so the suite finds binaries built by hand,
//! `LINNET_FIRECRACKER` and `LINNET_CLOUD_HYPERVISOR`, else under
//! /var/cache/linnet/vmms; a missing one fails the test, saying so).
//!
//! Each VMM opens its TAP by name (`linnet run --datapath tap-name`) or
//! takes its fd, configures it and starts its guest, and the test sees
//! from outside what it did: the VMM's own fds are on linnet's TAP (`iff:`
//! in their fdinfo), the TAP has as many queues attached as asked for
//! (`numqueues`) and carrier, TUNSETIFF and TUNSETVNETHDRSZ succeeded
//! (strace), and the VMM says its VM started. That is as far as this machine lets a VMM go: it is itself
//! a guest, and its nested KVM fails a guest a minute into its boot
//! (docs/vmms.md says where each VMM stopped).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

const CACHE: &str = "/var/cache/linnet/vmms";

/// The VMM `name`: `$env`, else the newest build under CACHE.
fn vmm(name: &str, env: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(CACHE)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{name}-v"))
        })
        .map(|e| e.path().join(name))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "no {name} binary: build it from its own sources (it is not packaged in Debian) and set {env}, or put it at {CACHE}/{name}-vVERSION/{name}"
        )
    })
}

/// The test guest's kernel as an ELF vmlinux, which Firecracker wants
/// (and Cloud Hypervisor boots by PVH): unpacked from the bzImage's xz.
fn vmlinux(dir: &Path) -> PathBuf {
    let out = dir.join("vmlinux");
    let unpack = r#"
import lzma, sys
data = open(sys.argv[1], "rb").read()
at = data.find(b"\xfd7zXZ\x00")
assert at >= 0, "no xz in the bzImage"
elf = lzma.LZMADecompressor().decompress(data[at:])
assert elf[:4] == b"\x7fELF", "not an ELF kernel"
open(sys.argv[2], "wb").write(elf)
"#;
    let bzimage = crate::qemu::built_guest_file("guest", "vmlinuz");
    must(std::process::Command::new("python3").args([
        "-c",
        unpack,
        &bzimage,
        out.to_str().unwrap(),
    ]));
    out
}

/// A world with a network nobody may use, its directory readable by
/// nobody and a directory nobody writes its VMM's output to.
fn world_for_nobody() -> (World, PathBuf) {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();
    let out = world.dir.path().join("vmm");
    std::fs::create_dir_all(&out).unwrap();
    for (path, mode) in [(out.as_path(), 0o1777), (world.dir.path(), 0o755)] {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    }
    (world, out)
}

/// /dev/net/tun and /dev/kvm open to every user, as distributions ship
/// the one and a user in group kvm has the other: in the command's own
/// mount namespace only.
const OWN_TUN_AND_KVM: &str = "mount -t tmpfs none /dev/net && mknod -m 0666 /dev/net/tun c 10 200 \
     && mkdir -p /run/linnet-kvm && mount -t tmpfs none /run/linnet-kvm \
     && mknod -m 0666 /run/linnet-kvm/kvm c 10 232 && mount --bind /run/linnet-kvm/kvm /dev/kvm";

/// `linnet run RUN_ARGS -- sh -c SCRIPT` as nobody, SCRIPT's `$OUT` the
/// output directory and `$VMM` the binary, in a mount namespace where
/// nobody may open /dev/net/tun and /dev/kvm.
fn run_as_nobody(world: &World, run_args: &[&str], script: &str, vmm: &Path, out: &Path) -> Helper {
    let mut wrapper = own_mounts(OWN_TUN_AND_KVM);
    wrapper.extend(AS_NOBODY.iter().map(|a| a.to_string()));
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let json = out.join("vm.json");
    let mut args = vec!["run", "--json", json.to_str().unwrap()];
    args.extend_from_slice(run_args);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    let mut cmd = world.linnet_wrapped(&wrapper, &args);
    cmd.env("OUT", out).env("VMM", vmm);
    Helper::start("linnet run", cmd, &out.join("run.log"))
}

/// What the VMM did to the TAP, seen from outside, once it says `started`
/// in OUT/vmm.log: its fds on the TAP, the queues attached to the TAP and
/// its carrier, and strace's lines for TUNSETIFF and TUNSETVNETHDRSZ.
struct Seen {
    info: Value,
    pid: i32,
    vmm_fds: usize,
    queues: usize,
    uid: u32,
    carrier: String,
    strace: String,
}

fn seen(world: &World, run: &Helper, out: &Path, started: &str) -> Seen {
    let info: Value = run.wait_for("the attach JSON", Duration::from_secs(15), || {
        serde_json::from_str(&std::fs::read_to_string(out.join("vm.json")).ok()?).ok()
    });
    let tap = info["tap"].as_str().unwrap().to_string();
    let log = out.join("vmm.log");
    run.wait_for(
        &format!("\"{started}\" in the VMM's log"),
        Duration::from_secs(30),
        || {
            (std::fs::read_to_string(&log).ok()?)
                .contains(started)
                .then_some(())
        },
    );
    // The VMM is strace's child.
    let strace_pid = std::fs::read_to_string(out.join("vmm.pid")).unwrap();
    let strace_pid = strace_pid.trim();
    let pid: i32 = run.wait_for("the VMM under strace", Duration::from_secs(5), || {
        let children =
            std::fs::read_to_string(format!("/proc/{strace_pid}/task/{strace_pid}/children"))
                .ok()?;
        children.split_whitespace().next()?.parse().ok()
    });
    // Each fd of the VMM's on linnet's TAP (a queue, or a copy of one).
    let vmm_fds = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter(|info| info.lines().any(|l| l == format!("iff:\t{tap}")))
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = (status.lines())
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let carrier = must(
        &mut world
            .host
            .cmd(&["cat", &format!("/sys/class/net/{tap}/carrier")]),
    )
    .trim()
    .to_string();
    // The kernel's count of the queues attached (IFLA_TUN_NUM_QUEUES),
    // which `ip` shows for a multi-queue TAP; one with a single queue has
    // it attached when it has carrier.
    let details = must(&mut world.host.cmd(&["ip", "-d", "link", "show", &tap]));
    let queues = match details.contains(" multi_queue ") {
        true => (details.split_whitespace())
            .skip_while(|w| *w != "numqueues")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no numqueues in {details}")),
        false => usize::from(carrier == "1"),
    };
    let strace = std::fs::read_to_string(out.join("strace.txt")).unwrap();
    Seen {
        info,
        pid,
        vmm_fds,
        queues,
        uid,
        carrier,
        strace,
    }
}

/// The lines of strace's output for the ioctl `name` on a TAP.
fn ioctls<'a>(strace: &'a str, name: &str) -> Vec<&'a str> {
    strace
        .lines()
        .filter(|l| l.contains("ioctl(") && l.contains(&format!(", {name},")))
        .collect()
}

/// Stops the VMM (strace would leave it running: it is killed itself),
/// then `linnet run`, and checks the TAP went with it.
fn stop(world: &World, mut run: Helper, seen: &Seen) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let _ = kill(Pid::from_raw(seen.pid), Signal::SIGKILL);
    // strace passes the VMM's death on: `linnet run` exits with it.
    run.wait().unwrap();
    let tap = seen.info["tap"].as_str().unwrap().to_string();
    wait_for("the TAP to go", Duration::from_secs(15), || {
        (!world.host.links().contains(&tap)).then_some(())
    });
}

/// Runs VMM with `args`, its pid written first, under strace.
const TRACED: &str =
    r#"echo $$ > "$OUT/vmm.pid"; exec strace -f -e trace=ioctl -o "$OUT/strace.txt" "$VMM""#;

#[test]
#[ignore = "make compat: needs Firecracker, built by hand (tests/integration/vmms.rs)"]
fn firecracker_as_a_user_opens_its_tap_by_name_and_starts_its_guest() {
    let (world, out) = world_for_nobody();
    let kernel = vmlinux(&out);
    std::fs::set_permissions(&kernel, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    // The configuration docs/vmms.md gives, with the TAP and MAC of the
    // attach; Firecracker starts the VM at once (--no-api).
    let script = format!(
        r#"cat > "$OUT/fc.json" <<JSON
{{ "boot-source": {{ "kernel_image_path": "{kernel}", "boot_args": "console=ttyS0 reboot=k panic=1" }},
  "drives": [],
  "machine-config": {{ "vcpu_count": 1, "mem_size_mib": 256 }},
  "network-interfaces": [ {{ "iface_id": "eth0", "host_dev_name": "$LINNET_TAP", "guest_mac": "$LINNET_MAC" }} ] }}
JSON
{TRACED} --no-api --config-file "$OUT/fc.json" --level Info > "$OUT/vmm.log" 2>&1"#,
        kernel = kernel.display()
    );
    let fc = vmm("firecracker", "LINNET_FIRECRACKER");
    let run = run_as_nobody(&world, &["--datapath", "tap-name"], &script, &fc, &out);
    let seen = seen(
        &world,
        &run,
        &out,
        "Successfully started microvm that was configured from one single json",
    );
    assert_eq!(seen.uid, 65534, "Firecracker ran as nobody");
    assert_eq!(
        seen.vmm_fds, 1,
        "one fd of Firecracker's is on linnet's TAP"
    );
    assert_eq!(seen.queues, 1, "its one queue");
    assert_eq!(seen.carrier, "1", "the TAP has its reader");
    for ioctl in ["TUNSETIFF", "TUNSETVNETHDRSZ"] {
        let lines = ioctls(&seen.strace, ioctl);
        assert!(
            !lines.is_empty() && lines.iter().all(|l| l.ends_with("= 0")),
            "{ioctl}: {lines:?}\n{}",
            seen.strace
        );
    }
    stop(&world, run, &seen);
}

/// Cloud Hypervisor's command line for a TAP (`net`), booting the test
/// kernel on `cpus` vCPUs.
fn cloud_hypervisor_script(kernel: &Path, cpus: u32, net: &str) -> String {
    format!(
        r#"{TRACED} --kernel {kernel} --cmdline "console=ttyS0 reboot=k panic=1" --cpus boot={cpus} --memory size=256M --serial tty --console off --net "{net}" -v > "$OUT/vmm.log" 2>&1"#,
        kernel = kernel.display()
    )
}

#[test]
#[ignore = "make compat: needs Cloud Hypervisor, built by hand (tests/integration/vmms.rs)"]
fn cloud_hypervisor_as_a_user_opens_its_tap_by_name_or_by_fd_with_one_queue_or_two() {
    let (world, out) = world_for_nobody();
    let kernel = vmlinux(&out);
    std::fs::set_permissions(&kernel, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let ch = vmm("cloud-hypervisor", "LINNET_CLOUD_HYPERVISOR");
    // By name with one queue pair, by name with two (num_queues counts
    // each direction: 4 is two pairs, on two vCPUs), and by fd.
    let cases: [(&[&str], u32, &str, usize); 3] = [
        (
            &["--datapath", "tap-name"],
            1,
            "tap=$LINNET_TAP,mac=$LINNET_MAC",
            1,
        ),
        (
            &["--datapath", "tap-name", "--queues", "2"],
            2,
            "tap=$LINNET_TAP,mac=$LINNET_MAC,num_queues=4",
            2,
        ),
        (
            &["--datapath", "tap"],
            1,
            "fd=$LINNET_FD,mac=$LINNET_MAC",
            1,
        ),
    ];
    for (run_args, cpus, net, queues) in cases {
        for f in ["vmm.log", "vmm.pid", "strace.txt", "vm.json"] {
            let _ = std::fs::remove_file(out.join(f));
        }
        let script = cloud_hypervisor_script(&kernel, cpus, net);
        let run = run_as_nobody(&world, run_args, &script, &ch, &out);
        // Its devices made (the NIC among them) once its ACPI tables are.
        let seen = seen(&world, &run, &out, "Generated ACPI tables");
        let case = format!("{run_args:?} --net {net}");
        assert_eq!(seen.uid, 65534, "{case}: Cloud Hypervisor ran as nobody");
        assert!(
            seen.vmm_fds >= queues,
            "{case}: {} fds on linnet's TAP",
            seen.vmm_fds
        );
        assert_eq!(seen.queues, queues, "{case}: the TAP's queues attached");
        assert_eq!(seen.carrier, "1", "{case}: the TAP has its reader");
        let log = std::fs::read_to_string(out.join("vmm.log")).unwrap();
        assert!(log.contains("Creating virtio-net device"), "{case}: {log}");
        // By name it attaches each queue itself; given the fd, it asks
        // TUNSETIFF again of a TAP already set (EEXIST, which it ignores).
        let setiff = ioctls(&seen.strace, "TUNSETIFF");
        let header = ioctls(&seen.strace, "TUNSETVNETHDRSZ");
        if run_args.contains(&"tap-name") {
            assert_eq!(setiff.len(), queues, "{case}: {setiff:?}");
            assert!(
                setiff.iter().all(|l| l.ends_with("= 0")),
                "{case}: {setiff:?}"
            );
        }
        assert_eq!(header.len(), queues, "{case}: {header:?}");
        assert!(
            header.iter().all(|l| l.ends_with("= 0")),
            "{case}: {header:?}"
        );
        stop(&world, run, &seen);
    }
}
