//! Distribution guests: the Debian 12 image of scripts/build-guest-debian
//! through `linnet run`, under emulation, with the network clients users
//! run (systemd-networkd with systemd-resolved, NetworkManager, cloud-init).
//! What each makes of linnet's network (DHCP, router advertisements, DNS,
//! MTU), with the attach JSON as the expected value. The guest prints
//! `RESULT-…` lines on its serial console; boots take minutes here.

use std::time::Duration;

use serde_json::Value;

use crate::harness::*;
use crate::qemu::{Vm, accel_args, built_guest_file, vm_dir};

/// A systemd boot under emulation, the script, and a reboot or two.
const DEBIAN_PATIENCE: Duration = Duration::from_secs(600);

/// Networks of their own: the MTU of a network across hosts (VXLAN takes
/// 50 bytes of the fabric's 1500) and a short lease (renewals within a
/// test); one without DHCP.
const NETWORKS: &str = "networks:
  distro:
    mode: shared
    subnet: 10.61.0.0/24
    mtu: 1450
    dhcp: { lease_time: 20 }
  nodhcp:
    mode: shared
    subnet: 10.63.0.0/24
    dhcp: false
";

fn debian_file(name: &str) -> String {
    built_guest_file("guest-debian", name)
}

/// QEMU booting the Debian guest, which runs `script` once its network is
/// online; `cmdline`: more of its kernel command line (`cloud-init=disabled`
/// where no cloud-init is wanted: without a seed it would still run, with
/// its fallback datasource, and make a network config). Its disk is the
/// cached image, written to nowhere (-snapshot); it powers off at the end
/// (a reboot the script asks for stays inside QEMU).
fn debian_qemu(name: &str, script: &str, cmdline: &str) -> Vec<String> {
    let script = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, script);
    let mut args = vec!["qemu-system-x86_64".to_string()];
    args.extend(accel_args().iter().map(|a| a.to_string()));
    // No getty on the console: its vhangup would cut the script's output.
    let append = format!(
        "console=ttyS0 root=/dev/vda rw quiet systemd.getty_auto=0 linnet.script={script} {cmdline}"
    );
    args.extend(
        [
            "-m",
            "1024",
            "-nographic",
            "-name",
            name,
            "-kernel",
            &debian_file("vmlinuz"),
            "-initrd",
            &debian_file("initrd.img"),
            "-append",
            &append,
            "-drive",
            &format!(
                "file={},if=virtio,format=raw,snapshot=on",
                debian_file("disk.img")
            ),
        ]
        .map(String::from),
    );
    args
}

/// `linnet run [run_opts] -- argv` on `network` as VM `name`.
fn launch(world: &World, network: &str, name: String, run_opts: &[&str], argv: &[String]) -> Vm {
    let json = vm_dir(world).join(format!("{name}.json"));
    let json_s = json.display().to_string();
    let mut args: Vec<&str> = vec!["run", "--network", network, "--json", &json_s];
    args.extend_from_slice(run_opts);
    args.push("--");
    args.extend(argv.iter().map(String::as_str));
    Vm::launch(world, world.linnet_wrapped(&[], &args), name, &json)
}

/// Where each `RESULT-KEY: value` line of `console` says (in order).
fn results(console: &str, key: &str) -> Vec<String> {
    let prefix = format!("RESULT-{key}: ");
    console
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&prefix).map(|v| v.trim().to_string()))
        .collect()
}

/// What the guest reports of its network: the address DHCP gave (or it
/// was given), its SLAAC address, the link's MTU, the DNS servers and
/// domains its resolver has for the link, and a page fetched (by name)
/// through NAT; with a `Peer`, that peer looked up by its full and bare
/// names and pinged over IPv6.
fn report_script(peer: Option<&Peer>) -> String {
    let mut script = format!(
        r#"nic=$(ls /sys/class/net | grep -v '^lo$' | head -1)
echo "RESULT-BOOT: $(cat /proc/sys/kernel/random/boot_id)"
echo "RESULT-IP4: $(ip -4 -o addr show dev $nic scope global | sed 's/.* inet \([0-9.]*\)\/.*/\1/')"
i=0; while [ $i -lt 100 ] && ! ip -6 addr show dev $nic scope global | grep -v tentative | grep -q inet6; do sleep 0.2; i=$((i+1)); done
ip -6 -o addr show dev $nic scope global | sed 's/.* inet6 \([0-9a-f:]*\)\/.*/RESULT-IP6: \1/'
echo "RESULT-MTU: $(cat /sys/class/net/$nic/mtu)"
echo "RESULT-DNS: $(resolvectl dns $nic | sed 's/^[^:]*: *//')"
echo "RESULT-DOMAIN: $(resolvectl domain $nic | sed 's/^[^:]*: *//')"
echo "RESULT-PAGE: $(curl -s -m 10 http://{UPSTREAM_NAME}/)"
"#
    );
    if let Some(p) = peer {
        script += &format!(
            r#"echo "RESULT-NAME: $(getent ahostsv4 {name}.{network}.linnet | head -1 | cut -d' ' -f1)"
echo "RESULT-BARE: $(getent ahostsv4 {name} | head -1 | cut -d' ' -f1)"
ping -6 -c 1 -W 5 {ipv6} >/dev/null && echo RESULT-PING6: ok
"#,
            name = p.name,
            network = p.network,
            ipv6 = p.guest.ipv6(),
        );
    }
    script
}

/// Another linnet VM on the guest's network, for it to find and reach.
struct Peer {
    guest: Guest,
    name: &'static str,
    network: &'static str,
}

/// A peer on `network` named "peer", with its lease.
fn peer(world: &World, network: &'static str) -> Peer {
    let guest = world.guest(network, &["--name", "peer"]);
    assert_eq!(guest.udhcpc(), guest.ip());
    assert_eq!(guest.slaac_addresses(), [guest.ipv6()]);
    Peer {
        guest,
        name: "peer",
        network,
    }
}

#[test]
fn systemd_networkd_takes_the_reported_addresses_and_dns_keeps_its_lease_across_a_reboot_and_a_daemon_restart()
 {
    let mut world = World::with_config(NETWORKS);
    world.start_daemon();
    let other = peer(&world, "distro");
    let name = unique("debian-networkd");
    // The first boot waits (the daemon restarts meanwhile, and the guest
    // renews its lease from the new one), reports again and reboots; the
    // second reports and powers off.
    let script = format!(
        "{}\nif [ ! -e /var/lib/linnet-rebooted ]; then echo RESULT-WAITING: yes; sleep 45; \
         echo \"RESULT-IP4-LATER: $(ip -4 -o addr show dev $nic scope global | sed 's/.* inet \\([0-9.]*\\)\\/.*/\\1/')\"; fi\n",
        report_script(Some(&other))
    );
    let vm = launch(
        &world,
        "distro",
        name.clone(),
        &[],
        &debian_qemu(&name, &script, "linnet.reboot-once cloud-init=disabled"),
    );
    let (ip, ipv6, mac) = reported(&vm.info);
    vm.wait_console_within("RESULT-WAITING: yes", DEBIAN_PATIENCE);
    let before = world.daemon_log_text().len();
    world.stop_daemon();
    world.start_daemon();
    let info = vm.info.clone();
    let console = vm.finish_within(DEBIAN_PATIENCE);
    // Two boots, each reporting the same.
    let boots = results(&console, "BOOT");
    assert_eq!(boots.len(), 2, "{console}");
    assert_ne!(boots[0], boots[1], "{console}");
    assert_eq!(
        results(&console, "IP4"),
        [ip.clone(), ip.clone()],
        "{console}"
    );
    assert_eq!(
        results(&console, "IP4-LATER"),
        std::slice::from_ref(&ip),
        "{console}"
    );
    assert_eq!(results(&console, "IP6"), [ipv6.clone(), ipv6], "{console}");
    // The new daemon acknowledged a renewal of that lease.
    let log = world.daemon_log_text();
    assert!(
        log[before..]
            .lines()
            .any(|l| l.contains("DHCPACK") && l.contains(&mac) && l.contains(&ip)),
        "no renewal from {mac} after the restart:\n{}",
        &log[before..]
    );
    assert_network_seen(&console, &info, 2, 1450);
    assert_peer_seen(&console, 2, &other);
}

#[test]
fn network_manager_takes_the_reported_address_dns_names_a_fabric_s_mtu_and_its_own_ipv6_addresses()
{
    let mut world = World::with_config(NETWORKS);
    world.start_daemon();
    let other = peer(&world, "distro");
    let events = crate::events::Follower::start(&world, &["--network", "distro"]);
    let name = unique("debian-nm");
    let vm = launch(
        &world,
        "distro",
        name.clone(),
        &[],
        &debian_qemu(
            &name,
            &report_script(Some(&other)),
            "linnet.net=nm cloud-init=disabled",
        ),
    );
    let (ip, eui64, _) = reported(&vm.info);
    let info = vm.info.clone();
    let console = vm.finish_within(DEBIAN_PATIENCE);
    assert_eq!(results(&console, "IP4"), [ip], "{console}");
    assert_network_seen(&console, &info, 1, 1450);
    assert_peer_seen(&console, 1, &other);
    // NetworkManager's profiles form IPv6 addresses by RFC 7217
    // (stable-privacy), not from the MAC: not the address the attach
    // reported, but one linnet learned from the guest's duplicate address
    // detection (or anti_spoofing would have dropped the ping above).
    let ip6 = results(&console, "IP6");
    assert_eq!(ip6.len(), 1, "{console}");
    assert_ne!(ip6[0], eui64, "NetworkManager's own address: {console}");
    let learned: Vec<Value> = events
        .drain(std::time::Duration::from_millis(500))
        .into_iter()
        .filter(|e| e["event"] == "ipv6_learned" && e["interface_id"] == info["interface_id"])
        .collect();
    let address = |e: &Value| e["ipv6_address"].as_str().unwrap_or_default().to_string();
    assert!(
        learned.iter().any(|e| address(e) == ip6[0]),
        "{ip6:?} not learned: {learned:?}"
    );
    assert!(
        learned.iter().any(|e| address(e).starts_with("fe80:")),
        "its link-local address learned too: {learned:?}"
    );
}

/// What a guest with two vCPUs makes of a TAP with two queues: the
/// channels its driver runs, each queue's packets after fetches from each
/// CPU (which the driver maps to its own transmit queue, and the TAP
/// answers each flow on the queue it came on), a connection its policy
/// forbids and frames from an address not its own, each from each CPU.
fn queues_script(subnet_spoof: &str) -> String {
    format!(
        r#"nic=$(ls /sys/class/net | grep -v '^lo$' | head -1)
gw=$(ip -4 route show default | awk '{{print $3; exit}}')
q() {{ ethtool -S $nic | awk -v k="$1_queue_$2_packets:" '$1 == k {{print $2}}'; }}
echo "RESULT-CHANNELS: $(ethtool -l $nic | awk '/Current hardware/ {{c = 1}} c && /^Combined/ {{print $2; exit}}')"
for cpu in 0 1; do
  taskset -c $cpu curl -s -m 10 -o /dev/null http://{UPSTREAM_NAME}/ && echo "RESULT-FETCH-$cpu: ok"
done
for cpu in 0 1; do echo "RESULT-RX-$cpu: $(q rx $cpu)"; echo "RESULT-TX-$cpu: $(q tx $cpu)"; done
echo "RESULT-FORBIDDEN: soon"
sleep 5
for cpu in 0 1; do
  taskset -c $cpu curl -s -m 5 -o /dev/null http://{UPSTREAM_IP}:81/
  echo "RESULT-FORBIDDEN-$cpu: $?"
done
ip addr add {subnet_spoof}/32 dev $nic
echo "RESULT-SPOOFING: soon"
sleep 5
for cpu in 0 1; do
  before=$(q tx $cpu)
  taskset -c $cpu ping -c 3 -W 1 -I {subnet_spoof} $gw >/dev/null 2>&1
  echo "RESULT-SPOOF-TX-$cpu: $(( $(q tx $cpu) - before ))"
done
echo "RESULT-SPOOFED: done"
sleep 20
"#
    )
}

#[test]
fn a_guest_with_two_vcpus_runs_two_queues_and_its_policy_and_anti_spoofing_hold_on_each() {
    let mut world = World::with_config(NETWORKS);
    world.start_daemon();
    let name = unique("debian-queues");
    let mut argv = debian_qemu(&name, &queues_script("10.61.0.250"), "cloud-init=disabled");
    argv.extend(["-smp".to_string(), "2".to_string()]);
    // It may connect to the upstream's web server and nowhere else.
    let allowed = format!("{UPSTREAM_IP}:80/tcp");
    let run_opts = ["--queues", "2", "--allow-connect", &allowed];
    let vm = launch(&world, "distro", name, &run_opts, &argv);
    assert_eq!(vm.info["queues"], 2, "{}", vm.info);
    let listed = |key: &str| {
        world.listed_interface(&vm.info["interface_id"])[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} of a guarded, policed interface"))
    };
    vm.wait_console_within("RESULT-FORBIDDEN: soon", DEBIAN_PATIENCE);
    let refused_before = listed("refused_connections");
    vm.wait_console_within("RESULT-SPOOFING: soon", DEBIAN_PATIENCE);
    let refused = listed("refused_connections") - refused_before;
    let drops = || listed("spoofed_drops");
    let before = drops();
    vm.wait_console_within("RESULT-SPOOFED: done", DEBIAN_PATIENCE);
    let drops = drops() - before;
    let console = vm.finish_within(DEBIAN_PATIENCE);
    let count = |key: &str| -> u64 {
        let values = results(&console, key);
        assert_eq!(values.len(), 1, "{key}: {console}");
        values[0]
            .parse()
            .unwrap_or_else(|_| panic!("{key}: {console}"))
    };
    assert_eq!(count("CHANNELS"), 2, "two combined channels: {console}");
    for cpu in 0..2 {
        assert_ne!(
            results(&console, &format!("FORBIDDEN-{cpu}")),
            ["0"],
            "a connection the policy forbids, from CPU {cpu}: {console}"
        );
        assert_eq!(
            results(&console, &format!("FETCH-{cpu}")),
            ["ok"],
            "{console}"
        );
        for way in ["RX", "TX"] {
            assert!(
                count(&format!("{way}-{cpu}")) > 0,
                "{way} queue {cpu} unused: {console}"
            );
        }
        assert!(count(&format!("SPOOF-TX-{cpu}")) >= 3, "{console}");
    }
    // Six frames from another address, three on each queue: dropped.
    assert!(drops >= 6, "{drops} spoofed frames dropped: {console}");
    // A connection to a port the policy does not allow, from each CPU:
    // refused, and counted, beside the fetches it allows from each.
    assert!(refused >= 2, "{refused} connections refused: {console}");
}

/// The interface's address, IPv6 address and MAC from its attach JSON.
fn reported(info: &Value) -> (String, String, String) {
    let field = |k: &str| {
        info[k]
            .as_str()
            .unwrap_or_else(|| panic!("no {k} in {info}"))
            .to_string()
    };
    (
        field("ip_address"),
        field("ipv6_address"),
        field("mac_address"),
    )
}

/// What every boot of the guest saw of its network: the MTU, linnet's DNS
/// server and search domain, the upstream page.
fn assert_network_seen(console: &str, info: &Value, boots: usize, mtu: u32) {
    let each = |v: &str| vec![v.to_string(); boots];
    let gateway = info["gateway"]
        .as_str()
        .unwrap_or_else(|| panic!("no gateway in {info}"));
    let domain = info["domain"]
        .as_str()
        .unwrap_or_else(|| panic!("no domain in {info}"));
    assert_eq!(results(console, "MTU"), each(&mtu.to_string()), "{console}");
    for dns in results(console, "DNS") {
        assert!(
            dns.split_whitespace().any(|s| s == gateway),
            "DNS {dns}, gateway {gateway}:\n{console}"
        );
    }
    assert_eq!(results(console, "DOMAIN"), each(domain), "{console}");
    assert_eq!(results(console, "PAGE"), each(UPSTREAM_PAGE), "{console}");
}

/// Every boot found the peer by its full and bare names and pinged it
/// over IPv6.
fn assert_peer_seen(console: &str, boots: usize, peer: &Peer) {
    let ip = peer.guest.ip().to_string();
    assert_eq!(
        results(console, "NAME"),
        vec![ip.clone(); boots],
        "{console}"
    );
    assert_eq!(results(console, "BARE"), vec![ip; boots], "{console}");
    assert_eq!(
        results(console, "PING6"),
        vec!["ok".to_string(); boots],
        "{console}"
    );
}

/// `linnet run` of a shell that makes the VM's NoCloud seed (a CIDATA
/// disk whose network-config (v2) gives the address linnet put in
/// LINNET_IP, as `{ip}`, and the gateway as its route and DNS server) and
/// then execs QEMU with the NIC on linnet's TAP: a VM that never asks DHCP.
fn cloud_init_vm(world: &World, network: &str, run_opts: &[&str], script: &str) -> Vm {
    let name = unique("debian-cloud-init");
    let seed = vm_dir(world).join(format!("{name}-seed"));
    // Each argument quoted for the shell (the kernel command line has spaces).
    let qemu = debian_qemu(&name, script, "")
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let shell = format!(
        r#"set -e
d={seed}
mkdir -p $d
printf 'instance-id: %s\nlocal-hostname: %s\n' {name} {name} > $d/meta-data
printf '#cloud-config\nlocale: C.UTF-8\n' > $d/user-data
cat > $d/network-config <<NETWORK
version: 2
ethernets:
  nic:
    match:
      macaddress: "$LINNET_MAC"
    set-name: eth0
    addresses: [$LINNET_IP/24]
    gateway4: $LINNET_GATEWAY
    nameservers:
      addresses: [$LINNET_GATEWAY]
NETWORK
mkfs.vfat -n CIDATA -C $d/seed.img 2048 >/dev/null
mcopy -i $d/seed.img $d/meta-data $d/user-data $d/network-config ::
exec {qemu} -drive file=$d/seed.img,if=virtio,format=raw,readonly=on -netdev tap,id=n0,fd=$LINNET_FD -device virtio-net-pci,netdev=n0,mac=$LINNET_MAC,host_mtu=$LINNET_MTU
"#,
        seed = seed.display(),
    );
    launch(
        world,
        network,
        name,
        run_opts,
        &["sh".into(), "-c".into(), shell],
    )
}

#[test]
fn cloud_init_gives_a_vm_that_never_asks_dhcp_the_address_linnet_reported_on_networks_with_and_without_dhcp()
 {
    let static_id = "6b1c6b70-5555-4c4c-9c9c-0000000000c1";
    let mut world = World::with_config(&NETWORKS.replace(
        "    dhcp: false\n",
        &format!("    dhcp:\n      enabled: false\n      static:\n        - {{ ip: 10.63.0.9, interface_id: {static_id} }}\n"),
    ));
    world.start_daemon();
    let script = format!(
        "{}\nping -c 1 -W 5 $(ip -4 route show default | cut -d' ' -f3) >/dev/null && echo RESULT-GATEWAY: ok\n\
         echo \"RESULT-CLOUD-INIT: $(ls /etc/systemd/network | grep cloud-init)\"\n",
        report_script(None)
    );
    let with_dhcp = cloud_init_vm(&world, "distro", &[], &script);
    let without = cloud_init_vm(&world, "nodhcp", &["--interface-id", static_id], &script);
    for vm in [with_dhcp, without] {
        let (ip, _, mac) = reported(&vm.info);
        let mtu = vm.info["mtu"].to_string();
        let console = vm.finish_within(DEBIAN_PATIENCE);
        // cloud-init gave the NIC its config (the network-config, for
        // systemd-networkd: its file comes before the image's DHCP one).
        assert_eq!(
            results(&console, "CLOUD-INIT"),
            ["10-cloud-init-eth0.network"],
            "{console}"
        );
        assert_eq!(results(&console, "MTU"), [mtu], "{console}");
        assert_eq!(results(&console, "IP4"), [ip], "{console}");
        assert_eq!(results(&console, "GATEWAY"), ["ok"], "{console}");
        assert_eq!(results(&console, "PAGE"), [UPSTREAM_PAGE], "{console}");
        // It never asked (the networkd test's guest is seen asking).
        let log = world.daemon_log_text();
        assert!(
            !log.lines().any(|l| l.contains("DHCP") && l.contains(&mac)),
            "{mac} asked DHCP:\n{log}"
        );
    }
}
