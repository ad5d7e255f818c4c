//! What `linnet run` adds to a QEMU command line: the NIC on the datapath,
//! and for vhost-user the guest memory the back-end must share. Plain data
//! from the command line; run.rs applies it.

use std::path::Path;

use crate::api::InterfaceInfo;
use crate::datapath::Datapath;

/// The memory backend linnet adds for vhost-user.
const MEMORY_ID: &str = "lnetmem";
/// QEMU's memory without `-m` (MiB).
const DEFAULT_MEMORY_MIB: u64 = 128;
/// A virtio NIC's MTU when the device names none.
const DEFAULT_MTU: u32 = 1500;

pub fn is_qemu(program: &str) -> bool {
    Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("qemu-system-"))
}

/// The placeholders that say a command wires its own NIC.
pub fn own_nic_placeholders(datapath: Datapath) -> &'static [&'static str] {
    match datapath {
        Datapath::TapName => &["{tap}"],
        Datapath::VhostUser => &["{socket}"],
        Datapath::Tap => &["{fd}", "{fds}"],
        _ => &["{fd}"],
    }
}

/// Whether linnet adds the NIC to `argv`: QEMU, not wiring its own.
pub fn adds_nic(argv: &[String], datapath: Datapath) -> bool {
    let own = own_nic_placeholders(datapath);
    is_qemu(&argv[0]) && !argv.iter().any(|a| own.iter().any(|p| a.contains(p)))
}

/// The arguments that give QEMU its NIC on `fds` (the TAP's, one per
/// queue, colon-separated; the relay's socket; none with tap-name), or on
/// vhost-user's `socket`.
pub fn nic_args(
    argv: &[String],
    info: &InterfaceInfo,
    fds: &str,
    socket: &str,
    datapath: Datapath,
) -> Result<Vec<String>, String> {
    let queues = info.queues;
    // QEMU reads IFF_VNET_HDR from the TAP itself (and refuses vnet_hdr= with fd=).
    let netdev = match datapath {
        Datapath::Tap if queues > 1 => format!("tap,id=lnet0,fds={fds}"),
        Datapath::Tap => format!("tap,id=lnet0,fd={fds}"),
        Datapath::TapName if queues > 1 => format!(
            "tap,id=lnet0,ifname={},queues={queues},script=no,downscript=no",
            info.tap
        ),
        Datapath::TapName => format!("tap,id=lnet0,ifname={},script=no,downscript=no", info.tap),
        Datapath::Dgram => format!("dgram,id=lnet0,local.type=fd,local.str={fds}"),
        Datapath::Stream => format!("stream,id=lnet0,server=off,addr.type=fd,addr.str={fds}"),
        Datapath::VhostUser => "vhost-user,id=lnet0,chardev=lnetchr".into(),
    };
    let mut device = format!("virtio-net-pci,netdev=lnet0,mac={}", info.mac_address);
    // The network's MTU as the device's (virtio's MTU feature): the guest's
    // link has it from the start, whatever its DHCP client does with DHCP's
    // MTU option (systemd-networkd ignores it by default), so a guest on a
    // network across hosts (1450) sends no frame the fabric would drop.
    if info.mtu != DEFAULT_MTU {
        device.push_str(&format!(",host_mtu={}", info.mtu));
    }
    // A queue pair per TAP queue, and an MSI-X vector for each queue, one
    // for the control queue and one for configuration changes.
    if queues > 1 {
        device.push_str(&format!(",mq=on,vectors={}", 2 * queues + 2));
    }
    let mut args = Vec::new();
    if datapath == Datapath::VhostUser {
        args.extend(shared_memory(argv)?);
        args.extend([
            "-chardev".into(),
            format!("socket,id=lnetchr,path={socket}"),
        ]);
        // QEMU 7.2 without KVM dies (a null pointer in
        // msix_set_vector_notifiers) as a vhost-user NIC with MSI-X
        // starts: legacy interrupts there.
        if !asks_for_kvm(argv) {
            device.push_str(",vectors=0");
        }
    }
    args.extend(["-netdev".into(), netdev, "-device".into(), device]);
    Ok(args)
}

/// Whether the command line asks for KVM (QEMU's x86 default is TCG).
fn asks_for_kvm(argv: &[String]) -> bool {
    argv.iter().zip(argv.iter().skip(1)).any(|(arg, next)| {
        (arg == "-accel" && next.starts_with("kvm")) || next.contains("accel=kvm")
    }) || argv
        .iter()
        .any(|a| a == "-enable-kvm" || a.contains("accel=kvm"))
}

/// The memory backend, shared with the vhost-user back-end, for the guest's
/// RAM as `-m` sizes it. An error (for the user) when the command line sets
/// up memory itself: linnet cannot tell whether that is shared.
pub fn shared_memory(argv: &[String]) -> Result<Vec<String>, String> {
    let theirs = argv[1..].iter().enumerate().find_map(|(i, arg)| {
        let next = argv.get(i + 2).map(String::as_str).unwrap_or("");
        match arg.as_str() {
            "-numa" | "-mem-path" | "-mem-prealloc" => Some(arg.clone()),
            "-object" if next.starts_with("memory-backend") => Some(format!("-object {next}")),
            "-machine" | "-M" if next.contains("memory-backend=") => Some(format!("{arg} {next}")),
            _ => None,
        }
    });
    if let Some(theirs) = theirs {
        return Err(format!(
            "--datapath vhost-user: the guest's memory must be shared with linnet's back-end, and this command line sets its memory up itself ({theirs}); \
             either leave that to linnet, which adds -object memory-backend-memfd,id={MEMORY_ID},size=SIZE,share=on -machine memory-backend={MEMORY_ID}, \
             or make every memory backend share=on (memory-backend-memfd or memory-backend-file) and add the NIC yourself: \
             -chardev socket,id=lnetchr,path={{socket}} -netdev vhost-user,id=lnet0,chardev=lnetchr -device virtio-net-pci,netdev=lnet0,mac={{mac}}"
        ));
    }
    let mib = memory_mib(argv)?;
    Ok(vec![
        "-object".into(),
        format!("memory-backend-memfd,id={MEMORY_ID},size={mib}M,share=on"),
        "-machine".into(),
        format!("memory-backend={MEMORY_ID}"),
    ])
}

/// The guest's RAM in MiB, as QEMU reads `-m` (the last one counts).
fn memory_mib(argv: &[String]) -> Result<u64, String> {
    let Some(value) = argv
        .windows(2)
        .rev()
        .find(|w| w[0] == "-m")
        .map(|w| w[1].as_str())
    else {
        return Ok(DEFAULT_MEMORY_MIB);
    };
    let mut size = None;
    for part in value.split(',') {
        match part.split_once('=') {
            None | Some(("size", _)) => size = Some(part.trim_start_matches("size=")),
            Some(("slots" | "maxmem", _)) => {
                return Err(format!(
                    "--datapath vhost-user: -m {value}: memory hotplug (slots, maxmem) needs hotplugged memory shared with linnet's back-end too, which linnet does not add; \
                     add the NIC and shared memory yourself (see `linnet run --help`)"
                ));
            }
            Some(_) => {}
        }
    }
    let size = size.ok_or_else(|| format!("-m {value}: no size"))?;
    parse_mib(size).ok_or_else(|| {
        format!("-m {value}: linnet cannot read this size; give it as a number of MiB, or with a K, M, G or T suffix")
    })
}

/// `256`, `256M`, `2G`, `524288k`: MiB (QEMU's unit without a suffix).
fn parse_mib(size: &str) -> Option<u64> {
    let split = size
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(size.len());
    let (number, suffix) = size.split_at(split);
    let number: u64 = number.parse().ok()?;
    let kib = match suffix.to_ascii_uppercase().as_str() {
        "" | "M" | "MB" | "MIB" => number.checked_mul(1024)?,
        "K" | "KB" | "KIB" => number,
        "G" | "GB" | "GIB" => number.checked_mul(1024 * 1024)?,
        "T" | "TB" | "TIB" => number.checked_mul(1024 * 1024 * 1024)?,
        _ => return None,
    };
    // QEMU rounds RAM up to whole MiB (and more), never below.
    Some(kib.div_ceil(1024)).filter(|&mib| mib > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        std::iter::once("qemu-system-x86_64")
            .chain(line.split_whitespace())
            .map(String::from)
            .collect()
    }

    #[test]
    fn vhost_user_memory_is_sized_from_the_last_dash_m() {
        let memory = shared_memory(&args("-m 256 -nographic -m size=2G")).unwrap();
        assert_eq!(
            memory,
            [
                "-object",
                "memory-backend-memfd,id=lnetmem,size=2048M,share=on",
                "-machine",
                "memory-backend=lnetmem"
            ]
        );
        assert_eq!(memory_mib(&args("-nographic")).unwrap(), 128);
        assert_eq!(memory_mib(&args("-m 512")).unwrap(), 512);
        assert_eq!(memory_mib(&args("-m 1536k")).unwrap(), 2);
        assert_eq!(memory_mib(&args("-m 1g")).unwrap(), 1024);
    }

    #[test]
    fn the_nic_has_the_network_mtu_when_it_is_not_ethernet_s() {
        let info = |mtu: u32| -> InterfaceInfo {
            serde_json::from_value(serde_json::json!({
                "vmnet_interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001",
                "vmnet_mac_address": "02:00:00:00:00:01", "vmnet_mtu": mtu, "vmnet_max_packet_size": mtu + 14,
                "vmnet_start_address": "10.9.0.2", "vmnet_end_address": "10.9.0.254",
                "vmnet_subnet_mask": "255.255.255.0", "network": "fabric", "mode": "shared",
                "datapath": "tap", "interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001",
                "mac_address": "02:00:00:00:00:01", "subnet": "10.9.0.0/24", "tap": "lnt0",
                "dns": [], "domain": "fabric.linnet", "mtu": mtu, "forwards": []
            }))
            .unwrap()
        };
        let device = |mtu: u32| {
            let nic = nic_args(&args("-m 256"), &info(mtu), "3", "", Datapath::Tap).unwrap();
            nic.last().unwrap().clone()
        };
        assert_eq!(
            device(1450),
            "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01,host_mtu=1450"
        );
        assert_eq!(
            device(65520),
            "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01,host_mtu=65520"
        );
        assert_eq!(
            device(1500),
            "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01"
        );
    }

    #[test]
    fn a_multi_queue_tap_is_wired_with_every_queue_s_fd_and_mq() {
        let info = |queues: u16, datapath: &str| -> InterfaceInfo {
            serde_json::from_value(serde_json::json!({
                "vmnet_interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001",
                "vmnet_mac_address": "02:00:00:00:00:01", "vmnet_mtu": 1500, "vmnet_max_packet_size": 1514,
                "network": "shared", "mode": "shared", "datapath": datapath,
                "interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001",
                "mac_address": "02:00:00:00:00:01", "tap": "lnt0", "queues": queues,
                "dns": [], "domain": "shared.linnet", "mtu": 1500, "forwards": []
            }))
            .unwrap()
        };
        let nic = |queues, datapath, fds| {
            let d = if datapath == Datapath::Tap {
                "tap"
            } else {
                "tap-name"
            };
            nic_args(&args("-m 256"), &info(queues, d), fds, "", datapath).unwrap()
        };
        assert_eq!(
            nic(4, Datapath::Tap, "5:6:7:8"),
            [
                "-netdev",
                "tap,id=lnet0,fds=5:6:7:8",
                "-device",
                "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01,mq=on,vectors=10"
            ]
        );
        assert_eq!(
            nic(2, Datapath::TapName, ""),
            [
                "-netdev",
                "tap,id=lnet0,ifname=lnt0,queues=2,script=no,downscript=no",
                "-device",
                "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01,mq=on,vectors=6"
            ]
        );
        assert_eq!(
            nic(1, Datapath::Tap, "5"),
            [
                "-netdev",
                "tap,id=lnet0,fd=5",
                "-device",
                "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01"
            ]
        );
        let own = |arg: &str| !adds_nic(&args(&format!("-m 256 -netdev {arg}")), Datapath::Tap);
        assert!(own("tap,id=n0,fds={fds}") && own("tap,id=n0,fd={fd}"));
        assert!(!own("user,id=n0"));
    }

    #[test]
    fn vhost_user_nic_gets_legacy_interrupts_unless_kvm_is_asked_for() {
        let info: InterfaceInfo = serde_json::from_value(serde_json::json!({
            "vmnet_interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001",
            "vmnet_mac_address": "02:00:00:00:00:01", "vmnet_mtu": 1500, "vmnet_max_packet_size": 1514,
            "vmnet_start_address": "192.168.105.2", "vmnet_end_address": "192.168.105.254",
            "vmnet_subnet_mask": "255.255.255.0", "network": "shared", "mode": "shared",
            "datapath": "vhost-user", "interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001",
            "mac_address": "02:00:00:00:00:01", "subnet": "192.168.105.0/24", "tap": "lnt0",
            "dns": [], "domain": "shared.linnet",
            "mtu": 1500, "forwards": []
        }))
        .unwrap();
        let nic = |line: &str| nic_args(&args(line), &info, "", "/tmp/d/vmm", Datapath::VhostUser);
        let tcg = nic("-m 512 -accel tcg").unwrap();
        assert_eq!(
            tcg[4..],
            [
                "-chardev",
                "socket,id=lnetchr,path=/tmp/d/vmm",
                "-netdev",
                "vhost-user,id=lnet0,chardev=lnetchr",
                "-device",
                "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01,vectors=0"
            ]
        );
        for line in ["-accel kvm -m 512", "-enable-kvm", "-machine q35,accel=kvm"] {
            let kvm = nic(line).unwrap();
            assert_eq!(
                kvm.last().unwrap(),
                "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01",
                "{line}"
            );
        }
    }

    #[test]
    fn a_command_line_that_sets_memory_up_itself_is_told_what_linnet_needs() {
        for line in [
            "-m 1G -numa node,memdev=m0",
            "-object memory-backend-ram,id=m0,size=1G -machine memory-backend=m0",
            "-M q35,memory-backend=m0",
            "-mem-path /dev/hugepages",
        ] {
            let e = shared_memory(&args(line)).unwrap_err();
            assert!(
                e.contains("share=on") && e.contains("path={socket}"),
                "{line}: {e}"
            );
        }
        let e = shared_memory(&args("-m 1G,slots=2,maxmem=4G")).unwrap_err();
        assert!(e.contains("hotplug"), "{e}");
        let e = shared_memory(&args("-m lots")).unwrap_err();
        assert!(e.contains("cannot read this size"), "{e}");
        // Another machine option is merged by QEMU, not in the way.
        assert!(shared_memory(&args("-machine q35,accel=tcg")).is_ok());
    }
}
