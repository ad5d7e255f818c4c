//! `linnet run [options] -- CMD ARGS…`: attach an interface, start CMD with
//! the TAP fd inherited, wait, detach. The interface lives as long as this
//! process keeps its connection to the daemon.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType};

use super::connector::{Connector, Target};
use super::lifeline::{self, Lifeline};
use super::{AttachArgs, Cli, DAEMON_GONE, VnetArgs, qemu};
use crate::api::{Channel, InterfaceInfo, Request, Response};
use crate::datapath::port::Endpoint;
use crate::datapath::relay::Relay;
use crate::datapath::vhost_user::{Frontend, VhostUserRelay};
use crate::datapath::{Counters, Datapath};
use crate::types::InterfaceId;

#[derive(Args)]
#[command(after_help = "\
CMD gets the datapath's file descriptor: the TAP (--datapath tap), or one end of a unix
socketpair that linnet relays to the TAP (dgram, stream); with tap-name it gets none and
opens the TAP by name ({tap}) as the attaching user, as Firecracker (host_dev_name),
Cloud Hypervisor (--net tap=) and crosvm (--tap-name) do. With vhost-user, linnet's
vhost-user-net back-end listens at {socket} (in a directory only this user may enter)
before CMD starts; CMD connects and shares the guest's memory. On a rootless daemon, CMD
then runs in the daemon's user and network namespaces (where its TAPs are), without
capabilities. For qemu-system-* (unless its
arguments use {fd} or {fds}, or {tap} with tap-name) linnet appends
  tap:      -netdev tap,id=lnet0,fd=FD (--queues N: fds=FD:FD...)
  tap-name: -netdev tap,id=lnet0,ifname=TAP,script=no,downscript=no (--queues N: queues=N)
  dgram:    -netdev dgram,id=lnet0,local.type=fd,local.str=FD
  stream:   -netdev stream,id=lnet0,server=off,addr.type=fd,addr.str=FD
  vhost-user (unless its arguments use {socket}):
            -object memory-backend-memfd,id=lnetmem,size=<-m>,share=on
            -machine memory-backend=lnetmem -chardev socket,id=lnetchr,path=SOCKET
            -netdev vhost-user,id=lnet0,chardev=lnetchr
            (a command line that sets memory up itself is refused with what is needed)
and -device virtio-net-pci,netdev=lnet0,mac=MAC (vhost-user without KVM: vectors=0;
--queues N: mq=on,vectors=2N+2; a network MTU other than 1500: host_mtu=MTU).
For any CMD these placeholders are replaced in its arguments:
  {fd} {fds} {socket} {mac} {ip} {tap} {gateway} {network} {interface_id} {mtu}
({fds}: every queue's fd, colon-separated) and these are set in its environment:
  LINNET_FD LINNET_FDS LINNET_SOCKET LINNET_MAC LINNET_IP LINNET_TAP LINNET_GATEWAY
  LINNET_NETWORK LINNET_INTERFACE_ID LINNET_MTU

Examples:
  linnet run -- qemu-system-x86_64 -m 512 -nographic -kernel vmlinuz -initrd initrd.img
  linnet run --network host --name db -- cloud-hypervisor --net fd={fd},mac={mac} ...
  linnet run --datapath tap-name -- cloud-hypervisor --net tap={tap},mac={mac} ...
  linnet run --datapath dgram --vnet-hdr -- krunkit ... --device virtio-net,type=unixgram,fd={fd},offloading=on
  linnet run --datapath vhost-user -- qemu-system-x86_64 -m 1G -nographic ...

As root through sudo (or with --user), linnet makes sure a daemon runs, then becomes the
invoking user (SUDO_UID/SUDO_GID) before it attaches: the interface and its TAP are that
user's, and CMD and the relay run as that user with no capabilities (no_new_privs).
Without sudo, root stays root.

Exit status: CMD's, or 125 when linnet itself failed.")]
pub struct RunArgs {
    #[command(flatten)]
    pub attach: AttachArgs,
    /// How CMD gets frames: the TAP fd, a unix socket (one frame per datagram, or
    /// length-prefixed on a stream) that linnet relays, or vhost-user (the guest's
    /// memory shared with linnet's back-end).
    #[arg(long, value_enum, default_value_t = Datapath::Tap)]
    pub datapath: Datapath,
    // --vnet-hdr: dgram/stream only (a TAP fd always carries the header).
    #[command(flatten)]
    pub vnet: VnetArgs,
    /// Write the interface JSON here (default: one line on stderr).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Once CMD runs, wait up to SECONDS for the VM's IPv4 address (on a LAN network:
    /// until linnet sees the LAN's DHCP server give it), then print it on stderr and
    /// write the interface JSON again with ip_address.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "120")]
    pub wait_ip: Option<u64>,
    /// The command to run, usually a VMM.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

/// Signals for CMD: delivered to it when sent to `linnet run`.
const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

pub fn main(cli: &Cli, args: &RunArgs) -> anyhow::Result<u8> {
    if matches!(
        args.datapath,
        Datapath::Tap | Datapath::TapName | Datapath::VhostUser
    ) && args.vnet.vnet_hdr
    {
        bail!(
            "--vnet-hdr is for --datapath dgram or stream; a TAP fd and vhost-user always carry the header"
        );
    }
    // What QEMU needs for vhost-user, checked before anything is attached.
    if args.datapath == Datapath::VhostUser && qemu::adds_nic(&args.command, args.datapath) {
        qemu::shared_memory(&args.command).map_err(anyhow::Error::msg)?;
    }
    let header = args.vnet.header()?;
    // Blocked before any thread starts, so every thread leaves them to us.
    let mut signals = SigSet::empty();
    for s in FORWARDED {
        signals.add(s);
    }
    signals.thread_block().context("cannot block signals")?;

    // Before any thread starts: becoming the user is per process, but
    // capabilities are per thread.
    let (channel, daemon) = cli.connect_as_user(args.attach.user.as_deref())?;
    if let Some(mut daemon) = daemon {
        // Reap it whenever it exits, so it never lingers as a zombie of ours.
        std::thread::spawn(move || daemon.wait());
    }
    let attached = super::attach(&channel, &args.attach, args.datapath, false)?;
    // What this process reaches by path once confined, through its
    // connector: the daemon's socket (the lifeline), the JSON written
    // again with the address.
    let reclaim = cli.reclaim_token(&attached);
    let republish = args.wait_ip.and(args.json.clone());
    let mut targets = Vec::new();
    if reclaim.is_some() {
        targets.push(Target::daemon(&cli.socket_path()));
    }
    if let Some(path) = &republish {
        targets.push(Target::File { path: path.clone() });
    }
    let connector = match targets.is_empty() {
        true => None,
        false => Some(Arc::new(
            Connector::start(&targets).context("cannot start linnet run's connector")?,
        )),
    };
    let lifeline = reclaim.map(|token| Lifeline {
        connector: connector.clone().expect("a connector for the lifeline"),
        daemon: 0,
        interface_id: attached.info.interface_id,
        token,
    });
    let republish = republish.map(|_| (connector.clone().expect("a connector"), targets.len() - 1));
    let super::Attached { info, taps, .. } = attached;
    publish(&info, args.json.as_deref())?;

    // What CMD gets: the TAP itself (an fd per queue), or its end of a
    // socketpair we relay; with tap-name nothing (it opens the TAP by
    // name; the daemon sent us no fd of it, so that it is free for the
    // VMM). A relayed datapath has one queue (the daemon refuses more).
    let tap = |taps: Vec<_>| (taps.into_iter().next()).expect("a TAP's fd for a relayed datapath");
    let (mut vhost_user_socket, mut vhost_user_leftovers) = (None, None);
    let (vmm_fds, counters): (Vec<std::os::fd::OwnedFd>, _) = match args.datapath {
        Datapath::Tap => (taps, None),
        // The VMM opens it by name.
        Datapath::TapName => (Vec::new(), None),
        // The back-end listens before the VMM starts (QEMU connects to it
        // at start and waits for its answers), on a socket in a directory
        // of this user's: the VMM's only.
        Datapath::VhostUser => {
            let counters = Arc::new(Counters::default());
            let relay =
                VhostUserRelay::new(tap(taps), Frontend::OneVmm, info.mtu, counters.clone())?;
            vhost_user_socket = relay.vmm_socket();
            vhost_user_leftovers = Some(relay.leftovers());
            super::spawn_relay(move || Ok(relay.run()?));
            (Vec::new(), Some(counters))
        }
        datapath => {
            let kind = if datapath == Datapath::Dgram {
                SockType::Datagram
            } else {
                SockType::Stream
            };
            let (ours, theirs) =
                socket::socketpair(AddressFamily::Unix, kind, None, SockFlag::SOCK_CLOEXEC)
                    .context("cannot create a socketpair")?;
            let endpoint = match kind {
                SockType::Datagram => Endpoint::DgramFd(ours),
                _ => Endpoint::StreamFd(ours),
            };
            let counters = Arc::new(Counters::default());
            let relay = Relay::new(tap(taps), endpoint, header, info.mtu, counters.clone())?;
            super::spawn_relay(move || relay.run());
            (vec![theirs], Some(counters))
        }
    };

    let fds: Vec<RawFd> = vmm_fds.iter().map(AsRawFd::as_raw_fd).collect();
    let socket = vhost_user_socket.as_deref();
    let mut command = build_command(&args.command, &info, &fds, socket, args.datapath)?;
    // A TAP of a rootless daemon is in its network namespace, where a VMM
    // must be to open it by name.
    let namespaces = if args.datapath == Datapath::TapName && cli.place().rootless {
        Some(super::rootless_namespaces(cli)?)
    } else {
        None
    };
    // A clone's TAP is in the clone's own namespace, which only root
    // enters.
    let clone_netns: Option<std::os::fd::OwnedFd> = match (&info.netns, args.datapath) {
        (Some(path), Datapath::TapName) if !nix::unistd::geteuid().is_root() => bail!(
            "a clone's TAP is in its namespace {}, which only root can enter: run this as root (without --user), or `linnet attach` it and start the VMM there as root does (Firecracker's jailer --netns {})",
            path.display(),
            path.display()
        ),
        (Some(path), Datapath::TapName) => Some(
            std::fs::File::open(path)
                .with_context(|| format!("cannot open the clone's namespace {}", path.display()))?
                .into(),
        ),
        _ => None,
    };
    // SAFETY: only async-signal-safe calls (setns, prctl, capset, fcntl,
    // sigprocmask) run in the child.
    unsafe {
        command.pre_exec(move || {
            if let Some(ns) = &namespaces {
                ns.enter()?;
            }
            if let Some(ns) = &clone_netns
                && libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) < 0
            {
                return Err(io::Error::last_os_error());
            }
            for &fd in &fds {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            eprintln!("linnet: cannot start {}: {e}", args.command[0]);
            return Ok(code);
        }
    };
    drop(vmm_fds);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    std::thread::spawn(move || forward_signals(signals, pid));
    if let Some(seconds) = args.wait_ip {
        // Connected now: once confined, this process makes no socket.
        let asking = Channel::connect(&cli.socket_path());
        let info = info.clone();
        std::thread::spawn(move || wait_ip(asking, info, seconds, republish));
    }
    let interface_id = info.interface_id;
    let needs = super::seccomp::Needs {
        signals_to: Some(pid.as_raw()),
        vhost_user: args.datapath == Datapath::VhostUser,
        ..Default::default()
    };
    std::thread::spawn(move || match counters {
        None => watch_daemon(channel, lifeline),
        Some(counters) => report_until_daemon_gone(channel, lifeline, interface_id, &counters),
    });
    // The VMM runs (unconfined: it is a process of its own); from here on
    // this process relays, holds the interface and passes signals on.
    super::seccomp::confine("linnet run", needs).context("cannot confine linnet run")?;

    let status = child.wait().context("waiting for the command")?;
    drop(vhost_user_leftovers);
    // Exiting closes the connection, which detaches the interface.
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128 + sig as u8,
        _ => 1,
    })
}

/// `--wait-ip`: asks the daemon (on a connection of its own, `asking`)
/// for the VM's address, says it, and has the JSON written again with it
/// (by the connector, target `index`, given `json`).
fn wait_ip(
    asking: io::Result<Channel>,
    mut info: InterfaceInfo,
    seconds: u64,
    json: Option<(Arc<Connector>, usize)>,
) {
    let request = Request::WaitAddress {
        network: info.network.clone(),
        interface_id: info.interface_id,
        timeout_ms: seconds.saturating_mul(1000),
    };
    let reply = asking.and_then(|channel| channel.call(&request));
    match reply {
        Ok((Response::Address { ip_address, .. }, _)) => {
            eprintln!(
                "linnet: interface {} on network \"{}\" has address {ip_address}",
                info.interface_id, info.network
            );
            info.ip_address = Some(ip_address);
            let published = match json {
                Some((connector, index)) => serde_json::to_string(&info)
                    .map_err(anyhow::Error::from)
                    .and_then(|json| {
                        connector
                            .write_file(index, format!("{json}\n").as_bytes())
                            .context("cannot write the JSON again with the address")
                    }),
                None => publish(&info, None),
            };
            if let Err(e) = published {
                eprintln!("linnet: {e:#}");
            }
        }
        Ok((Response::Error { message, .. }, _)) => eprintln!("linnet: --wait-ip: {message}"),
        Ok((other, _)) => eprintln!("linnet: --wait-ip: unexpected reply {other:?}"),
        Err(e) => eprintln!("linnet: --wait-ip: {e}"),
    }
}

fn publish(info: &InterfaceInfo, path: Option<&Path>) -> anyhow::Result<()> {
    let json = serde_json::to_string(info)?;
    match path {
        // Whole or not at all, for whoever reads it meanwhile.
        Some(path) => {
            let tmp = path.with_extension("linnet-tmp");
            std::fs::write(&tmp, format!("{json}\n"))
                .and_then(|()| std::fs::rename(&tmp, path))
                .with_context(|| format!("cannot write {}", path.display()))
        }
        None => writeln!(io::stderr(), "{json}").context("cannot write the interface JSON"),
    }
}

/// Replaces placeholders, sets LINNET_* and, for QEMU, adds the NIC. `fds`:
/// the TAP's (one per queue) or the relay's socket; none with tap-name and
/// vhost-user (`{fd}` is then empty); `socket`: vhost-user's (`{socket}`).
fn build_command(
    argv: &[String],
    info: &InterfaceInfo,
    fds: &[RawFd],
    socket: Option<&Path>,
    datapath: Datapath,
) -> anyhow::Result<Command> {
    let listed: Vec<String> = fds.iter().map(ToString::to_string).collect();
    let values = [
        (
            "{fd}",
            fds.first().map(|fd| fd.to_string()).unwrap_or_default(),
        ),
        // Every queue's, as QEMU's `-netdev tap,fds=` takes them.
        ("{fds}", listed.join(":")),
        (
            "{socket}",
            socket.map(|s| s.display().to_string()).unwrap_or_default(),
        ),
        ("{mac}", info.mac_address.to_string()),
        // Empty without an address linnet knows (no DHCP on the network).
        (
            "{ip}",
            info.ip_address.map(|ip| ip.to_string()).unwrap_or_default(),
        ),
        ("{tap}", info.tap.clone()),
        // Empty on a LAN: its router is the LAN's.
        (
            "{gateway}",
            info.gateway.map(|g| g.to_string()).unwrap_or_default(),
        ),
        ("{network}", info.network.clone()),
        ("{interface_id}", info.interface_id.to_string()),
        ("{mtu}", info.mtu.to_string()),
    ];
    let substitute = |arg: &str| {
        values
            .iter()
            .fold(arg.to_string(), |a, (k, v)| a.replace(k, v))
    };
    let mut args: Vec<String> = argv[1..].iter().map(|a| substitute(a)).collect();
    if qemu::adds_nic(argv, datapath) {
        let nic = qemu::nic_args(argv, info, &values[1].1, &values[2].1, datapath);
        args.extend(nic.map_err(anyhow::Error::msg)?);
    }
    let mut cmd = Command::new(&argv[0]);
    cmd.args(args);
    for (key, (_, value)) in [
        "LINNET_FD",
        "LINNET_FDS",
        "LINNET_SOCKET",
        "LINNET_MAC",
        "LINNET_IP",
        "LINNET_TAP",
        "LINNET_GATEWAY",
        "LINNET_NETWORK",
        "LINNET_INTERFACE_ID",
        "LINNET_MTU",
    ]
    .iter()
    .zip(&values)
    {
        cmd.env(key, value);
    }
    Ok(cmd)
}

/// Passes on signals that someone sent to `linnet run`. Signals from the
/// terminal (Ctrl-C) already reach CMD, which shares our process group.
fn forward_signals(signals: SigSet, child: nix::unistd::Pid) {
    loop {
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `signals` is a valid set and `info` a writable siginfo_t.
        let sig = unsafe { libc::sigwaitinfo(signals.as_ref(), &mut info) };
        if sig < 0 {
            continue;
        }
        if info.si_code == libc::SI_KERNEL {
            continue;
        }
        if let Ok(sig) = Signal::try_from(sig) {
            let _ = nix::sys::signal::kill(child, sig);
        }
    }
}

/// Holds the connection (our interface's lifeline); when the daemon goes,
/// waits for the next one and re-claims the interface there.
fn watch_daemon(mut channel: Channel, lifeline: Option<Lifeline>) {
    loop {
        while let Ok(Some(_)) = channel.recv::<Response>() {}
        channel = reconnect(channel, lifeline.as_ref());
    }
}

/// For a relayed datapath: sends the relay's counters each second (when
/// they changed), and re-claims the interface when the daemon restarted.
fn report_until_daemon_gone(
    mut channel: Channel,
    lifeline: Option<Lifeline>,
    interface_id: InterfaceId,
    counters: &Counters,
) {
    let mut last = Default::default();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if !channel.peer_closed() {
            match super::report(&channel, interface_id, counters, &mut last) {
                // A daemon going away meanwhile is seen below.
                Err(_) if lifeline.is_some() && channel.peer_closed() => {}
                Err(e) => daemon_gone(Some(channel), e.to_string()),
                Ok(()) => continue,
            }
        }
        channel = reconnect(channel, lifeline.as_ref());
        // The new daemon has not heard them.
        last = Default::default();
    }
}

/// The daemon went away: a connection to the next one, with the
/// interface re-claimed. Without a lifeline, or refused, it is gone.
fn reconnect(channel: Channel, lifeline: Option<&Lifeline>) -> Channel {
    let Some(lifeline) = lifeline else {
        daemon_gone(Some(channel), DAEMON_GONE.into())
    };
    drop(channel);
    eprintln!("linnet: {}", lifeline::WAITING);
    match lifeline.reclaim() {
        Ok(channel) => {
            eprintln!(
                "linnet: re-claimed interface {} from the daemon that is back",
                lifeline.interface_id
            );
            channel
        }
        Err(e) => daemon_gone(None, format!("{e:#}")),
    }
}

/// Says why the interface is gone, and keeps a connection that is still
/// open (closing it would detach the interface) until we exit.
fn daemon_gone(channel: Option<Channel>, message: String) -> ! {
    eprintln!("linnet: {message}");
    let _channel = channel;
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> InterfaceInfo {
        serde_json::from_value(serde_json::json!({
            "vmnet_interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001",
            "vmnet_mac_address": "02:00:00:00:00:01", "vmnet_mtu": 1500, "vmnet_max_packet_size": 1514,
            "vmnet_start_address": "192.168.105.2", "vmnet_end_address": "192.168.105.254",
            "vmnet_subnet_mask": "255.255.255.0", "network": "shared", "mode": "shared", "datapath": "tap",
            "interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001", "mac_address": "02:00:00:00:00:01",
            "ip_address": "192.168.105.2", "gateway": "192.168.105.1", "dns": ["192.168.105.1"],
            "domain": "shared.linnet", "subnet": "192.168.105.0/24", "tap": "lnt0123456789ab", "mtu": 1500,
            "forwards": []
        }))
        .unwrap()
    }

    fn argv(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn qemu_opens_a_tap_by_name_with_tap_name() {
        let cmd = build_command(
            &["qemu-system-x86_64".into(), "-name".into(), "vm{fd}".into()],
            &info(),
            &[],
            None,
            Datapath::TapName,
        )
        .unwrap();
        assert_eq!(
            argv(&cmd),
            [
                "-name",
                "vm",
                "-netdev",
                "tap,id=lnet0,ifname=lnt0123456789ab,script=no,downscript=no",
                "-device",
                "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01"
            ]
        );
    }

    #[test]
    fn qemu_gets_a_virtio_nic_on_the_fd() {
        let cmd = build_command(
            &[
                "/usr/bin/qemu-system-x86_64".into(),
                "-m".into(),
                "256".into(),
            ],
            &info(),
            &[7],
            None,
            Datapath::Tap,
        )
        .unwrap();
        assert_eq!(
            argv(&cmd),
            [
                "-m",
                "256",
                "-netdev",
                "tap,id=lnet0,fd=7",
                "-device",
                "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01"
            ]
        );
    }

    #[test]
    fn placeholders_are_replaced_and_env_set_for_any_command() {
        let cmd = build_command(
            &[
                "vmm".into(),
                "--net".into(),
                "fd={fd},mac={mac}".into(),
                "{ip}/{tap}@{gateway}".into(),
            ],
            &info(),
            &[9],
            None,
            Datapath::Tap,
        )
        .unwrap();
        assert_eq!(
            argv(&cmd),
            [
                "--net",
                "fd=9,mac=02:00:00:00:00:01",
                "192.168.105.2/lnt0123456789ab@192.168.105.1"
            ]
        );
        let env: Vec<_> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.unwrap().to_string_lossy().into_owned(),
                )
            })
            .collect();
        assert!(env.contains(&("LINNET_FD".into(), "9".into())));
        assert!(env.contains(&("LINNET_NETWORK".into(), "shared".into())));
    }

    #[test]
    fn qemu_with_its_own_fd_placeholder_is_left_alone() {
        let cmd = build_command(
            &[
                "qemu-system-aarch64".into(),
                "-netdev".into(),
                "tap,id=n,fd={fd}".into(),
            ],
            &info(),
            &[5],
            None,
            Datapath::Tap,
        )
        .unwrap();
        assert_eq!(argv(&cmd), ["-netdev", "tap,id=n,fd=5"]);
    }
}
