//! `linnet helper`: attach an interface and relay its frames between the TAP
//! and a unix socket, for VMMs that cannot take a TAP fd (QEMU dgram/stream,
//! libkrun/krunkit, vfkit-style clients). In the spirit of vmnet-helper: one
//! JSON line on stdout, logs on stderr, runs until SIGTERM/SIGINT, and holds
//! no privileges once attached.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{ArgGroup, Args};
use nix::sys::signal::{SigSet, Signal};
use tracing::info;

use super::{AttachArgs, Cli, DAEMON_GONE, VnetArgs, report, spawn_relay};
use crate::datapath::port::Endpoint;
use crate::datapath::relay::Relay;
use crate::datapath::{Counters, RelayCounters};
use crate::host::privileges;

#[derive(Args)]
#[command(
    group(ArgGroup::new("endpoint").required(true).args(["fd", "socket", "stream_fd", "stream_socket"])),
    after_help = "\
Examples:
  # QEMU, a datagram socket at a path (QEMU binds its own end, linnet serves it):
  linnet helper --socket /tmp/vm1.sock &
  qemu-system-x86_64 ... -netdev dgram,id=n0,local.type=unix,local.path=/tmp/vm1.qemu,\\
      remote.type=unix,remote.path=/tmp/vm1.sock -device virtio-net-pci,netdev=n0,mac=MAC
  # krunkit with offloads, on a socketpair end inherited as fd 3:
  linnet helper --fd 3 --vnet-hdr

Stops on SIGTERM or SIGINT (the interface is detached), or when the VMM closes a
socket given with --fd/--stream-fd. As root through sudo (or with --user) it becomes
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
    #[command(flatten)]
    pub vnet: VnetArgs,
}

/// Signals that stop the helper (and detach its interface).
const STOP: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];
/// How often the relay's counters go to the daemon (when they changed).
const REPORT_EVERY: Duration = Duration::from_secs(1);

pub fn main(cli: &Cli, args: &HelperArgs) -> anyhow::Result<()> {
    let header = args.vnet.header()?;
    // Claim inherited fds first, so a wrong number fails before anything is attached.
    let inherited = |fd: RawFd| -> anyhow::Result<OwnedFd> {
        // SAFETY: F_GETFD only asks whether the descriptor is open.
        if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            bail!(
                "fd {fd} is not open; pass the socket's descriptor number as inherited by this process"
            );
        }
        // SAFETY: the caller handed this descriptor to us to own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let endpoint = match (args.fd, &args.socket, args.stream_fd, &args.stream_socket) {
        (Some(fd), ..) => Endpoint::DgramFd(inherited(fd)?),
        (_, Some(path), ..) => Endpoint::DgramPath(path.clone()),
        (_, _, Some(fd), _) => Endpoint::StreamFd(inherited(fd)?),
        (_, _, _, Some(path)) => Endpoint::StreamPath(path.clone()),
        _ => unreachable!("clap requires one"),
    };
    let datapath = endpoint.datapath();
    let (channel, mut daemon) = cli.connect_as_user(args.attach.user.as_deref())?;
    // Root without sudo keeps its uid, not its capabilities.
    privileges::become_user(None)?;
    let (info, tap) = super::attach(&channel, &args.attach, datapath)?;
    // Bound as the user, so the socket belongs to it.
    let counters = Arc::new(Counters::default());
    let relay = Relay::new(tap, endpoint, header, info.mtu, counters.clone())?;
    let _socket_file = SocketFile(args.socket.clone().or(args.stream_socket.clone()));
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{}", serde_json::to_string(&info)?)
        .and_then(|()| stdout.flush())
        .context("cannot write the interface JSON to stdout")?;

    let mut signals = SigSet::empty();
    for s in STOP {
        signals.add(s);
    }
    signals.thread_block().context("cannot block signals")?;
    let relay = spawn_relay(relay);
    if let Some(ip) = info.ip_address {
        info!(interface = %info.interface_id, %ip, %datapath, "relaying");
    } else {
        info!(interface = %info.interface_id, %datapath, "relaying");
    }

    let mut reported = RelayCounters::default();
    let mut next_report = Instant::now() + REPORT_EVERY;
    loop {
        if let Some(signal) = wait_signal(&signals, Duration::from_millis(200)) {
            // Exiting closes our connection: the daemon detaches the interface.
            info!("{signal}: stopping");
            return Ok(());
        }
        if relay.is_finished() {
            return match relay.join() {
                Ok(Ok(())) => {
                    info!("the VMM closed its socket: stopping");
                    Ok(())
                }
                Ok(Err(e)) => Err(e.into()),
                Err(_) => bail!("the relay thread panicked"),
            };
        }
        if channel.peer_closed() {
            bail!(DAEMON_GONE);
        }
        if Instant::now() >= next_report {
            next_report += REPORT_EVERY;
            report(&channel, info.interface_id, &counters, &mut reported)?;
            if let Some(child) = daemon.as_mut()
                && child.try_wait().ok().flatten().is_some()
            {
                daemon = None;
            }
        }
    }
}

fn wait_signal(signals: &SigSet, timeout: Duration) -> Option<Signal> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: valid set and timespec; siginfo is not asked for.
    let sig = unsafe { libc::sigtimedwait(signals.as_ref(), std::ptr::null_mut(), &ts) };
    Signal::try_from(sig).ok()
}

/// Removes the socket file the helper bound, when it exits.
struct SocketFile(Option<PathBuf>);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}
