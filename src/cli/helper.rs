//! `linnet helper`: attach an interface and relay its frames between the TAP
//! and a unix socket, for VMMs that cannot take a TAP fd (QEMU dgram/stream,
//! libkrun/krunkit, vfkit-style clients). In the spirit of vmnet-helper: one
//! JSON line on stdout, logs on stderr, runs until SIGTERM/SIGINT, and holds
//! no privileges once attached. This file attaches; the relaying, for the
//! VM's lifetime, is `linnet-relay`'s (relay.rs), which this process execs.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use clap::{ArgGroup, Args};
use tracing::info;

use super::relay::{self, Interface, RelayArgs, VmmSocket, claim_fd, inheritable};
use super::{AttachArgs, Cli, VnetArgs};
use crate::host::privileges;

#[derive(Args)]
#[command(
    group(ArgGroup::new("endpoint").required(true).args(["fd", "socket", "stream_fd", "stream_socket", "vhost_user"])),
    after_help = "\
Examples:
  # QEMU, a datagram socket at a path (QEMU binds its own end, linnet serves it):
  linnet helper --socket /tmp/vm1.sock &
  qemu-system-x86_64 ... -netdev dgram,id=n0,local.type=unix,local.path=/tmp/vm1.qemu,\\
      remote.type=unix,remote.path=/tmp/vm1.sock -device virtio-net-pci,netdev=n0,mac=MAC
  # krunkit with offloads, on a socketpair end inherited as fd 3:
  linnet helper --fd 3 --vnet-hdr
  # QEMU on vhost-user (guest memory shared, QEMU reconnects if the helper restarts):
  linnet helper --vhost-user /tmp/vm1.vhost &
  qemu-system-x86_64 -m 1G -object memory-backend-memfd,id=mem,size=1G,share=on \\
      -machine memory-backend=mem -chardev socket,id=c0,path=/tmp/vm1.vhost,reconnect=1 \\
      -netdev vhost-user,id=n0,chardev=c0 -device virtio-net-pci,netdev=n0,mac=MAC ...

Stops on SIGTERM or SIGINT (the interface is detached), or when the VMM closes a
socket given with --fd/--stream-fd; on a socket at a path, a VMM that goes may connect
again. As root through sudo (or with --user) it becomes
SUDO_UID/SUDO_GID (or USER) before it attaches, so the interface is that user's; it keeps
no capabilities either way.")]
pub struct HelperArgs {
    #[command(flatten)]
    pub attach: AttachArgs,
    /// A unix datagram socket inherited as fd N (one end of a socketpair): one frame per datagram.
    #[arg(long, value_name = "N")]
    pub fd: Option<RawFd>,
    /// Create a unix datagram socket at PATH and serve the first client to send a frame.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// A unix stream socket inherited as fd N: each frame after its length (4 bytes, big-endian).
    #[arg(long, value_name = "N")]
    pub stream_fd: Option<RawFd>,
    /// Listen on a unix stream socket at PATH, one client at a time, with the same framing.
    #[arg(long, value_name = "PATH")]
    pub stream_socket: Option<PathBuf>,
    /// Be the vhost-user-net back-end listening at PATH (QEMU -chardev socket,path=PATH
    /// with -netdev vhost-user; the guest's memory shared): one VMM at a time, which may
    /// connect again after it restarts.
    #[arg(long, value_name = "PATH", conflicts_with = "vnet_hdr")]
    pub vhost_user: Option<PathBuf>,
    #[command(flatten)]
    pub vnet: VnetArgs,
}

/// Attaches, then becomes `linnet-relay` (src/cli/relay.rs), which binds
/// the VMM's socket, prints the interface JSON and relays: the process that
/// stays for the VM's lifetime is the small one.
pub fn main(cli: &Cli, args: &HelperArgs) -> anyhow::Result<()> {
    let header = args.vnet.header()?;
    // Claim inherited fds first, so a wrong number fails before anything is attached.
    let (socket, vmm_fd) = match (args.fd, &args.socket, args.stream_fd, &args.stream_socket) {
        (Some(fd), ..) => (VmmSocket::DgramFd(fd), Some(claim_fd(fd)?)),
        (_, Some(path), ..) => (VmmSocket::DgramPath(path.clone()), None),
        (_, _, Some(fd), _) => (VmmSocket::StreamFd(fd), Some(claim_fd(fd)?)),
        (_, _, _, Some(path)) => (VmmSocket::StreamPath(path.clone()), None),
        _ => match &args.vhost_user {
            Some(path) => (VmmSocket::VhostUserPath(path.clone()), None),
            None => unreachable!("clap requires one"),
        },
    };
    serve(cli, &args.attach, socket, vmm_fd, header)
}

/// Attaches as `attach` says, then becomes `linnet-relay` serving the
/// VMM on `socket` (`vmm_fd`: its inherited descriptor, if it is one).
/// `linnet attach --vhost-user` runs this in a process of its own.
pub fn serve(
    cli: &Cli,
    attach: &AttachArgs,
    socket: VmmSocket,
    vmm_fd: Option<std::os::fd::OwnedFd>,
    header: crate::datapath::vnet::ClientHeader,
) -> anyhow::Result<()> {
    let datapath = socket.datapath();
    let relay = relay_executable()?;
    // A daemon started here stays this process's child; the relay reaps it.
    let (channel, _daemon) = cli.connect_as_user(attach.user.as_deref())?;
    // Root without sudo keeps its uid, not its capabilities.
    privileges::become_user(None)?;
    let attached = super::attach(&channel, attach, datapath, false)?;
    let token = cli.reclaim_token(&attached);
    let super::Attached { info, taps, .. } = attached;
    // One: a relayed datapath has one queue (the daemon refuses more).
    let tap = (taps.into_iter().next()).expect("a TAP's fd for a socket datapath");
    let announce = relay::announcement(&serde_json::to_string(&info)?)
        .context("cannot keep the interface JSON for the relay")?;
    // The token crosses the exec in a file of its own, not in the command
    // line, which every user can read.
    let reclaim = match &token {
        Some(token) => Some((
            cli.socket_path(),
            relay::announcement(token).context("cannot keep the token for the relay")?,
        )),
        None => None,
    };
    let relay_args = RelayArgs {
        interface: Interface::Attached {
            tap: tap.as_raw_fd(),
            interface_id: info.interface_id,
        },
        daemon: channel.as_fd().as_raw_fd(),
        mtu: info.mtu,
        socket,
        header,
        announce: Some(announce.as_raw_fd()),
        reclaim: reclaim
            .as_ref()
            .map(|(socket, token)| (socket.clone(), token.as_raw_fd())),
        log: cli.log.clone(),
    };
    // What the relay is handed must cross the exec.
    let passed = [
        Some(tap.as_raw_fd()),
        Some(relay_args.daemon),
        relay_args.announce,
        relay_args.reclaim.as_ref().map(|(_, fd)| *fd),
        vmm_fd.as_ref().map(AsRawFd::as_raw_fd),
    ];
    for fd in passed.into_iter().flatten() {
        inheritable(fd).context("cannot pass descriptors to the relay")?;
    }
    if let Some(ip) = info.ip_address {
        info!(interface = %info.interface_id, %ip, %datapath, "attached; starting the relay");
    } else {
        info!(interface = %info.interface_id, %datapath, "attached; starting the relay");
    }
    // Only returns if it failed; exiting then closes our connection, and
    // the daemon detaches the interface.
    let e = Command::new(&relay).args(relay_args.to_args()).exec();
    Err(e).with_context(|| format!("cannot start {}", relay.display()))
}

/// `linnet-relay`, next to this executable (as `cargo build` and an
/// installation put them).
fn relay_executable() -> anyhow::Result<PathBuf> {
    let linnet = std::env::current_exe().context("cannot find the linnet executable")?;
    let relay = linnet.with_file_name(relay::EXECUTABLE);
    if !relay.is_file() {
        anyhow::bail!(
            "{} is missing: linnet helper relays through it; install it next to {}",
            relay.display(),
            linnet.display()
        );
    }
    Ok(relay)
}
