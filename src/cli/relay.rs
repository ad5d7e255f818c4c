//! `linnet-relay`: the process that stays for a VM's lifetime on a socket
//! datapath. `linnet helper` attaches (with everything that takes: the
//! command line, users and privileges, starting a daemon) and then becomes
//! this small executable, passing what it holds: the TAP, the daemon
//! connection it attached on (the interface's lifeline) and the VMM's
//! socket. It relays until SIGTERM/SIGINT/SIGHUP, until the VMM closes a
//! socket it was handed, or until the daemon goes away, and reports the
//! relay's counters meanwhile.
//!
//! The daemon starts it too, for each connection to a network's socket
//! (daemon/network_sockets.rs), as the connecting user: then it attaches
//! itself, once the VM's first frame has named the MAC to attach with.
//!
//! An executable of its own because one runs per VM: it links only the API
//! client and the datapath, so it maps a fraction of `linnet`'s code (the
//! kernel maps a binary's pages around every page touched, so a sparse walk
//! through a large one maps most of it). Its arguments (`RelayArgs`) are an
//! interface between linnet's executables, not one for people.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::socket::{self, MsgFlags};
use tracing::{info, warn};

use super::connector::{Connector, Target};
use super::lifeline::{self, Lifeline};
use super::seccomp;
use super::{DAEMON_GONE, EXIT_LINNET_FAILED, report, spawn_relay};
use crate::api::{AttachRequest, Channel, ErrorKind, InterfaceInfo, Request, Response};
use crate::datapath::FRAME_OVERHEAD;
use crate::datapath::framing::LENGTH_BYTES;
use crate::datapath::port::{self, Endpoint};
use crate::datapath::relay::{Relay, RelayError};
use crate::datapath::vhost_user::{Frontend, VhostUserRelay};
use crate::datapath::vnet::ClientHeader;
use crate::datapath::{Counters, Datapath, RelayCounters};
use crate::types::{InterfaceId, MacAddr};

/// The executable's name; `linnet` finds it in its own directory.
pub const EXECUTABLE: &str = "linnet-relay";

/// Signals that stop the relay (and so detach its interface).
const STOP: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];
/// How often the relay's counters go to the daemon (when they changed).
const REPORT_EVERY: Duration = Duration::from_secs(1);

const USAGE: &str = "\
usage: linnet-relay --tap FD --interface-id UUID --daemon FD --mtu N
                    (--fd N | --socket PATH | --stream-fd N | --stream-socket PATH
                     | --vhost-user-socket PATH)
                    [--vnet-hdr-size BYTES] [--announce FD] [--log FILTER]
                    [--daemon-socket PATH --reclaim-token FD]
       linnet-relay --attach-on-first-frame NETWORK --daemon FD --mtu N --stream-fd N

The per-VM relay of `linnet helper`, which starts it once the interface is
attached, and of the daemon's network sockets; not meant to be run by hand.
--tap is the interface's TAP, --daemon the connection it was attached on
(counters go there; when it closes, the interface is gone). The VMM's socket
is given as for `linnet helper`. --announce: a file whose contents (the
interface JSON) go to stdout once relaying. --daemon-socket and --reclaim-token
(a file holding the token): when the daemon restarts, reconnect there and re-claim
the interface instead of stopping. --attach-on-first-frame: attach
to NETWORK on --daemon once the VM's first frame on --stream-fd gives its MAC.";

/// What `linnet-relay` is given, as `linnet helper` (or the daemon, for a
/// network socket's connection) passes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayArgs {
    pub interface: Interface,
    /// The daemon connection the interface was (or is to be) attached on.
    pub daemon: RawFd,
    pub mtu: u32,
    pub socket: VmmSocket,
    /// The virtio-net header the VMM speaks.
    pub header: ClientHeader,
    /// A file whose contents go to stdout once the relay is ready.
    pub announce: Option<RawFd>,
    /// Where the daemon is, and a file with the token that re-claims the
    /// interface there after a restart.
    pub reclaim: Option<(PathBuf, RawFd)>,
    /// The log filter [default: warn].
    pub log: Option<String>,
}

/// Which interface the relay serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interface {
    /// One that `linnet helper` attached.
    Attached {
        tap: RawFd,
        interface_id: InterfaceId,
    },
    /// One to attach on this network once the VM's first frame names its
    /// MAC: a connection to the network's socket.
    OnFirstFrame { network: String },
}

/// The VMM's socket, as `linnet helper` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmmSocket {
    DgramFd(RawFd),
    DgramPath(PathBuf),
    StreamFd(RawFd),
    StreamPath(PathBuf),
    /// vhost-user's, listening at the path for the VMM to connect (again).
    VhostUserPath(PathBuf),
}

impl VmmSocket {
    pub fn datapath(&self) -> Datapath {
        match self {
            VmmSocket::DgramFd(_) | VmmSocket::DgramPath(_) => Datapath::Dgram,
            VmmSocket::StreamFd(_) | VmmSocket::StreamPath(_) => Datapath::Stream,
            VmmSocket::VhostUserPath(_) => Datapath::VhostUser,
        }
    }

    /// The socket file the relay binds, if any.
    fn path(&self) -> Option<&PathBuf> {
        match self {
            VmmSocket::DgramPath(path)
            | VmmSocket::StreamPath(path)
            | VmmSocket::VhostUserPath(path) => Some(path),
            VmmSocket::DgramFd(_) | VmmSocket::StreamFd(_) => None,
        }
    }
}

impl RelayArgs {
    /// The command line that gives `linnet-relay` these arguments.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut add = |flag: &str, value: OsString| {
            args.push(flag.into());
            args.push(value);
        };
        match &self.interface {
            Interface::Attached { tap, interface_id } => {
                add("--tap", tap.to_string().into());
                add("--interface-id", interface_id.to_string().into());
            }
            Interface::OnFirstFrame { network } => {
                add("--attach-on-first-frame", network.into());
            }
        }
        add("--daemon", self.daemon.to_string().into());
        add("--mtu", self.mtu.to_string().into());
        match &self.socket {
            VmmSocket::DgramFd(fd) => add("--fd", fd.to_string().into()),
            VmmSocket::DgramPath(path) => add("--socket", path.into()),
            VmmSocket::StreamFd(fd) => add("--stream-fd", fd.to_string().into()),
            VmmSocket::StreamPath(path) => add("--stream-socket", path.into()),
            VmmSocket::VhostUserPath(path) => add("--vhost-user-socket", path.into()),
        }
        if let ClientHeader::Virtio(len) = self.header {
            add("--vnet-hdr-size", len.to_string().into());
        }
        if let Some(fd) = self.announce {
            add("--announce", fd.to_string().into());
        }
        if let Some((socket, token)) = &self.reclaim {
            add("--daemon-socket", socket.into());
            add("--reclaim-token", token.to_string().into());
        }
        if let Some(log) = &self.log {
            add("--log", log.into());
        }
        args
    }

    /// Reads a command line made by `to_args` (without the program name).
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<RelayArgs, String> {
        let (mut tap, mut daemon, mut interface_id, mut mtu) = (None, None, None, None);
        let mut first_frame = None;
        let (mut socket, mut header, mut announce, mut log) =
            (None, ClientHeader::None, None, None);
        let (mut daemon_socket, mut reclaim_token) = (None, None);
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let flag = flag.to_string_lossy().into_owned();
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let text = || {
                value
                    .to_str()
                    .ok_or_else(|| format!("{flag}: not UTF-8: {}", value.to_string_lossy()))
            };
            let number = || -> Result<u32, String> {
                text()?
                    .parse()
                    .map_err(|_| format!("{flag}: not a number: {}", value.to_string_lossy()))
            };
            let fd = || {
                number().and_then(|n| {
                    RawFd::try_from(n).map_err(|_| format!("{flag}: not a descriptor: {n}"))
                })
            };
            let mut set_socket = |s: VmmSocket| match socket.replace(s) {
                None => Ok(()),
                Some(_) => Err(
                    "give one of --fd, --socket, --stream-fd, --stream-socket, --vhost-user-socket",
                ),
            };
            match flag.as_str() {
                "--tap" => tap = Some(fd()?),
                "--daemon" => daemon = Some(fd()?),
                "--interface-id" => {
                    interface_id = Some(
                        text()?
                            .parse::<InterfaceId>()
                            .map_err(|e| format!("{flag}: {e}"))?,
                    )
                }
                "--attach-on-first-frame" => first_frame = Some(text()?.to_owned()),
                "--mtu" => mtu = Some(number()?),
                "--fd" => set_socket(VmmSocket::DgramFd(fd()?))?,
                "--socket" => set_socket(VmmSocket::DgramPath(value.clone().into()))?,
                "--stream-fd" => set_socket(VmmSocket::StreamFd(fd()?))?,
                "--stream-socket" => set_socket(VmmSocket::StreamPath(value.clone().into()))?,
                "--vhost-user-socket" => {
                    set_socket(VmmSocket::VhostUserPath(value.clone().into()))?
                }
                "--vnet-hdr-size" => {
                    header = ClientHeader::parse(number()? as usize)
                        .map_err(|e| format!("{flag}: {e}"))?
                }
                "--announce" => announce = Some(fd()?),
                "--daemon-socket" => daemon_socket = Some(PathBuf::from(value.clone())),
                "--reclaim-token" => reclaim_token = Some(fd()?),
                "--log" => log = Some(text()?.to_owned()),
                _ => return Err(format!("unknown argument {flag}")),
            }
        }
        let missing = |what: &str| format!("{what} is missing");
        let interface = match (first_frame, tap, interface_id) {
            (Some(network), None, None) => {
                if !matches!(socket, Some(VmmSocket::StreamFd(_))) {
                    return Err(
                        "--attach-on-first-frame takes the VM's stream as --stream-fd".into(),
                    );
                }
                Interface::OnFirstFrame { network }
            }
            (Some(_), ..) => {
                return Err("give --attach-on-first-frame or --tap and --interface-id".into());
            }
            (None, tap, id) => Interface::Attached {
                tap: tap.ok_or_else(|| missing("--tap"))?,
                interface_id: id.ok_or_else(|| missing("--interface-id"))?,
            },
        };
        Ok(RelayArgs {
            interface,
            daemon: daemon.ok_or_else(|| missing("--daemon"))?,
            mtu: mtu.ok_or_else(|| missing("--mtu"))?,
            socket: socket.ok_or_else(|| {
                missing("the VMM's socket (--fd, --socket, --stream-fd, --stream-socket or --vhost-user-socket)")
            })?,
            header,
            announce,
            reclaim: match (daemon_socket, reclaim_token) {
                (Some(socket), Some(token)) => Some((socket, token)),
                (None, None) => None,
                _ => return Err("give --daemon-socket and --reclaim-token together".into()),
            },
            log,
        })
    }
}

/// `linnet-relay`'s main.
pub fn main() -> ExitCode {
    let mut argv = std::env::args_os().skip(1).peekable();
    if argv
        .peek()
        .is_some_and(|a| a == OsStr::new("--help") || a == OsStr::new("-h"))
    {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match RelayArgs::parse(argv) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{EXECUTABLE}: {e}\n\n{USAGE}");
            return ExitCode::from(EXIT_LINNET_FAILED);
        }
    };
    match args.interface {
        Interface::Attached { .. } => super::log_to_stderr(args.log.as_deref(), "warn"),
        Interface::OnFirstFrame { .. } => {
            // Nothing that runs as this user may reach into the relay (its
            // daemon connection speaks for the VM's owner): no ptrace, no
            // /proc/PID/fd, no core dump.
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
            // The daemon logs these lines with the connection's network,
            // uid and pid, and its own time.
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
                .with_writer(std::io::stderr)
                .log_internal_errors(false)
                .without_time()
                .with_level(false)
                .with_ansi(false)
                .with_target(false)
                .init();
        }
    }
    match relay(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match args.interface {
                // Errors read as `linnet helper`'s: that is what its user ran.
                Interface::Attached { .. } => eprintln!("linnet: {e:#}"),
                // A network socket's relay writes to the daemon's log.
                Interface::OnFirstFrame { .. } => tracing::warn!("{e:#}"),
            }
            ExitCode::from(EXIT_LINNET_FAILED)
        }
    }
}

fn relay(args: &RelayArgs) -> anyhow::Result<()> {
    // Blocked before the relay's thread starts, so it inherits the mask and
    // only this thread takes them.
    let mut signals = SigSet::empty();
    for s in STOP {
        signals.add(s);
    }
    signals.thread_block().context("cannot block signals")?;
    let mut channel = Some(Channel::from_fd(claim_fd(args.daemon)?));
    let lifeline = match &args.reclaim {
        Some((_, token)) => {
            let mut text = String::new();
            File::from(claim_fd(*token)?)
                .read_to_string(&mut text)
                .context("cannot read the interface's token")?;
            Some(text.trim().to_owned())
        }
        None => None,
    };
    // What the relay will connect to once confined, through its connector
    // (started just before it confines itself).
    let daemon_target = args
        .reclaim
        .as_ref()
        .map(|(socket, _)| Target::daemon(socket));
    let mut connector: Option<Arc<Connector>> = None;
    let (tap, interface_id, serves, mtu) = match &args.interface {
        Interface::Attached { tap, interface_id } => {
            let tap = claim_fd(*tap)?;
            let serves = match &args.socket {
                VmmSocket::DgramFd(fd) => Serves::Frames(Endpoint::DgramFd(claim_fd(*fd)?)),
                VmmSocket::DgramPath(path) => Serves::Frames(Endpoint::DgramPath(path.clone())),
                VmmSocket::StreamFd(fd) => Serves::Frames(Endpoint::StreamFd(claim_fd(*fd)?)),
                VmmSocket::StreamPath(path) => Serves::Frames(Endpoint::StreamPath(path.clone())),
                VmmSocket::VhostUserPath(path) => Serves::VhostUser(path.clone()),
            };
            (tap, *interface_id, serves, args.mtu)
        }
        Interface::OnFirstFrame { network } => {
            let VmmSocket::StreamFd(fd) = args.socket else {
                bail!("--attach-on-first-frame takes the VM's stream as --stream-fd");
            };
            let vm = claim_fd(fd)?;
            // Before the first of the VM's bytes is read.
            connector = start_connector(&daemon_target, None)?;
            confine(args)?;
            let max_frame = args.mtu as usize + FRAME_OVERHEAD;
            let attaching = channel.as_ref().expect("connected");
            let Some(mac) = first_frame_mac(&vm, attaching, &signals, network, max_frame)? else {
                return Ok(());
            };
            let Some((info, tap)) = attach_on_first_frame(attaching, &vm, &signals, network, mac)?
            else {
                return Ok(());
            };
            let serves = Serves::Frames(Endpoint::StreamFd(vm));
            (tap, info.interface_id, serves, info.mtu)
        }
    };
    let datapath = args.socket.datapath();
    let counters = Arc::new(Counters::default());
    // A vhost-user relay's private directory goes as this function
    // returns, whichever way (`_leftovers`).
    type Run = Box<dyn FnOnce() -> Result<(), RelayError> + Send>;
    let (relay, _leftovers): (Run, _) = match serves {
        Serves::Frames(endpoint) => {
            let relay = Relay::new(tap, endpoint, args.header, mtu, counters.clone())?;
            if connector.is_none() {
                connector = start_connector(&daemon_target, None)?;
            }
            (Box::new(move || relay.run()), None)
        }
        Serves::VhostUser(path) => {
            let listener = port::listen_at(&path)?;
            let frontend = Frontend::Listening(listener);
            let mut relay = VhostUserRelay::new(tap, frontend, mtu, counters.clone())?;
            // Each VMM connection gets a back-end of its own, reached
            // through the relay's own socket: by the connector.
            let backend = Target::stream(&relay.backend_socket());
            connector = start_connector(&daemon_target, Some(backend))?;
            let through = connector.clone().expect("a connector with a target");
            let index = usize::from(daemon_target.is_some());
            relay.connect_backend_with(Box::new(move || {
                through.connect(index).map(UnixStream::from)
            }));
            let leftovers = relay.leftovers();
            (Box::new(move || Ok(relay.run()?)), Some(leftovers))
        }
    };
    let _socket_file = SocketFile(args.socket.path().cloned());
    if let Some(fd) = args.announce {
        let mut text = Vec::new();
        File::from(claim_fd(fd)?)
            .read_to_end(&mut text)
            .context("cannot read the interface JSON to announce")?;
        let mut stdout = std::io::stdout();
        stdout
            .write_all(&text)
            .and_then(|()| stdout.flush())
            .context("cannot write the interface JSON to stdout")?;
    }
    if matches!(args.interface, Interface::Attached { .. }) {
        // Set up (the VMM's socket bound), and nothing of the VM's read.
        confine(args)?;
    }
    let relay = spawn_relay(relay);
    info!(interface = %interface_id, %datapath, "relaying");
    let lifeline = lifeline.map(|token| Lifeline {
        connector: connector.clone().expect("a connector for the lifeline"),
        daemon: DAEMON,
        interface_id,
        token,
    });

    let mut reported = RelayCounters::default();
    let mut next_report = Instant::now() + REPORT_EVERY;
    let mut reclaiming: Option<std::thread::JoinHandle<anyhow::Result<Channel>>> = None;
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
        // The daemon went away: with a lifeline, the relay goes on and a
        // thread of its own re-claims the interface from the next daemon,
        // while this one watches signals and the VMM.
        match (&channel, &lifeline) {
            (Some(c), None) if c.peer_closed() => bail!(DAEMON_GONE),
            (Some(c), Some(lifeline)) if c.peer_closed() => {
                warn!("{}", lifeline::WAITING);
                channel = None;
                let lifeline = lifeline.clone();
                reclaiming = Some(std::thread::spawn(move || lifeline.reclaim()));
            }
            _ => {}
        }
        if reclaiming.as_ref().is_some_and(|t| t.is_finished()) {
            let result = reclaiming.take().expect("finished").join();
            let back = result.map_err(|_| anyhow::anyhow!("the re-claiming thread panicked"))??;
            warn!(interface = %interface_id, "re-claimed the interface from the daemon that is back");
            channel = Some(back);
            // The new daemon has not heard them.
            reported = RelayCounters::default();
            next_report = Instant::now();
        }
        if Instant::now() >= next_report {
            next_report += REPORT_EVERY;
            if let Some(c) = &channel
                && let Err(e) = report(c, interface_id, &counters, &mut reported)
                // A daemon going away meanwhile is seen above, next time.
                && !(lifeline.is_some() && c.peer_closed())
            {
                return Err(e);
            }
            reap_children();
        }
    }
}

/// What the relay serves the VMM on: frames on a socket, or vhost-user.
enum Serves {
    Frames(Endpoint),
    VhostUser(PathBuf),
}

/// The daemon's socket's index among the connector's targets, when it
/// has a lifeline: the first.
const DAEMON: usize = 0;

/// The relay's connector (`cli::connector`) for its lifeline to the
/// daemon and its vhost-user `backend`, if it has either: the daemon's
/// socket first (DAEMON), the back-end's after it.
fn start_connector(
    daemon: &Option<Target>,
    backend: Option<Target>,
) -> anyhow::Result<Option<Arc<Connector>>> {
    let targets: Vec<Target> = daemon.iter().cloned().chain(backend).collect();
    if targets.is_empty() {
        return Ok(None);
    }
    let connector = Connector::start(&targets).context("cannot start the relay's connector")?;
    Ok(Some(Arc::new(connector)))
}

/// Gives up every system call relaying does not need (`seccomp`).
fn confine(args: &RelayArgs) -> anyhow::Result<()> {
    let needs = seccomp::Needs {
        socket_file: args.socket.path().is_some(),
        vhost_user: matches!(args.socket, VmmSocket::VhostUserPath(_)),
        ..seccomp::Needs::default()
    };
    seccomp::confine(EXECUTABLE, needs).context("cannot confine the relay")
}

/// Waits for the VM's first frame on `vm` and reads its source MAC without
/// taking it off the stream (the relay reads it again as usual). `None`:
/// the VM closed its connection first, or a signal came.
fn first_frame_mac(
    vm: &OwnedFd,
    channel: &Channel,
    signals: &SigSet,
    network: &str,
    max_frame: usize,
) -> anyhow::Result<Option<MacAddr>> {
    let mut head = [0u8; FIRST_FRAME_HEAD];
    // Part of the head so far: waits that grow (a peer may send the rest
    // in a moment, or never), up to a limit.
    let mut partial: Option<(Instant, Duration)> = None;
    loop {
        if let Some(signal) = wait_signal(signals, Duration::ZERO) {
            info!("{signal} before the VM's first frame: stopping");
            return Ok(None);
        }
        if channel.peer_closed() {
            bail!(DAEMON_GONE);
        }
        let mut fds = [PollFd::new(vm.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(200u16))? == 0 {
            continue;
        }
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        match socket::recv(vm.as_raw_fd(), &mut head, flags) {
            Ok(0) => {
                info!("the VM closed its connection before its first frame");
                return Ok(None);
            }
            Ok(n) if n < head.len() => {
                let (since, wait) =
                    partial.get_or_insert((Instant::now(), Duration::from_millis(10)));
                if since.elapsed() > PARTIAL_HEAD_LIMIT {
                    bail!(
                        "network \"{network}\": the VM sent {n} bytes of its first frame's length and header and nothing more for {} s; closing its connection",
                        PARTIAL_HEAD_LIMIT.as_secs()
                    );
                }
                std::thread::sleep(*wait);
                *wait = (*wait * 2).min(Duration::from_millis(500));
            }
            Ok(_) => {
                return first_frame_source(&head, max_frame).map(Some).map_err(|e| {
                    anyhow::anyhow!(
                        "network \"{network}\": the VM's first frame {e}; closing its connection"
                    )
                });
            }
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(e) => bail!("network \"{network}\": the VM's connection failed: {e}"),
        }
    }
}

/// How long a VM may take to send the first bytes of its first frame once
/// it has sent some.
const PARTIAL_HEAD_LIMIT: Duration = Duration::from_secs(10);

/// Whether the VM has closed (or shut down writing on) its connection.
fn vm_closed(vm: &OwnedFd) -> bool {
    let mut fd = libc::pollfd {
        fd: vm.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd, which outlives the call; no waiting.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready > 0 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// The length and the Ethernet header up to the source MAC.
const FIRST_FRAME_HEAD: usize = LENGTH_BYTES + 12;

/// The source MAC of the first frame on a stream, from its first bytes; or
/// what is wrong with them (a length no frame has, a source no VM can be).
fn first_frame_source(head: &[u8; FIRST_FRAME_HEAD], max_frame: usize) -> Result<MacAddr, String> {
    let len = u32::from_be_bytes(head[..LENGTH_BYTES].try_into().expect("4 bytes")) as usize;
    if !(ETHERNET_HEADER..=max_frame).contains(&len) {
        return Err(format!(
            "has a length of {len} bytes, not one of {ETHERNET_HEADER} to {max_frame} (is it speaking the 4-byte big-endian length of -netdev stream?)"
        ));
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&head[LENGTH_BYTES + 6..]);
    let mac = MacAddr(mac);
    if mac.is_multicast() || mac.0 == [0; 6] {
        return Err(format!("comes from {mac}, which is not a unicast MAC"));
    }
    Ok(mac)
}

const ETHERNET_HEADER: usize = 14;

/// Attaches the VM's interface on `network` with the MAC it sends from.
/// While another connection holds that interface (the VM's last one,
/// still closing, or another VM sending from the same MAC), it waits for
/// it as long as the VM stays connected. `None`: the VM left, or a signal
/// came, first.
fn attach_on_first_frame(
    channel: &Channel,
    vm: &OwnedFd,
    signals: &SigSet,
    network: &str,
    mac: MacAddr,
) -> anyhow::Result<Option<(InterfaceInfo, OwnedFd)>> {
    let request = AttachRequest {
        network: Some(network.into()),
        // The daemon gives it, from the MAC and the VM's owner.
        interface_id: None,
        mac: Some(mac),
        datapath: Some(Datapath::Stream),
        ..AttachRequest::default()
    };
    let refused = |why: String| {
        anyhow::anyhow!(
            "network \"{network}\": cannot attach the VM with MAC {mac}: {why}; closing its connection"
        )
    };
    let mut said = false;
    loop {
        let (response, fds) = channel
            .call(&Request::Attach(request.clone()))
            .map_err(|e| refused(e.to_string()))?;
        let message = match response {
            Response::Attached { interface, .. } => {
                let tap = fds
                    .into_iter()
                    .next()
                    .ok_or_else(|| refused("the daemon sent no TAP".into()))?;
                info!(interface = %interface.interface_id, %mac, ip = ?interface.ip_address, "attached on the VM's first frame");
                return Ok(Some((*interface, tap)));
            }
            Response::Error {
                kind: ErrorKind::Busy,
                message,
            } => message,
            Response::Error { message, .. } => return Err(refused(message)),
            other => return Err(refused(format!("unexpected reply {other:?}"))),
        };
        if !said {
            // The daemon's words up to its advice, which is for `linnet run`.
            let what = message.split(';').next().unwrap_or(&message);
            warn!(
                "network \"{network}\": MAC {mac} is another connection's ({what}); waiting for it to close. Give each VM its own MAC (QEMU: -device virtio-net-pci,...,mac=)"
            );
            said = true;
        }
        for _ in 0..BUSY_RETRY_TICKS {
            if let Some(signal) = wait_signal(signals, BUSY_RETRY_TICK) {
                info!("{signal} while waiting for MAC {mac}: stopping");
                return Ok(None);
            }
            if vm_closed(vm) {
                info!("the VM closed its connection while waiting for MAC {mac}");
                return Ok(None);
            }
        }
    }
}

/// How often a relay asks again for an interface another connection holds.
const BUSY_RETRY_TICK: Duration = Duration::from_millis(50);
const BUSY_RETRY_TICKS: u32 = 4;

/// Takes ownership of an inherited descriptor, if it is open.
pub fn claim_fd(fd: RawFd) -> anyhow::Result<OwnedFd> {
    // SAFETY: F_GETFD only asks whether the descriptor is open.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        bail!(
            "fd {fd} is not open; pass the socket's descriptor number as inherited by this process"
        );
    }
    // SAFETY: the caller handed this descriptor to us to own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Lets `fd` pass to the executable that replaces this process.
pub fn inheritable(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller holds.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The interface JSON in an anonymous file, for `--announce`.
pub fn announcement(line: &str) -> std::io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name and no flags; the fd is checked.
    let fd = unsafe { libc::memfd_create(c"linnet-interface".as_ptr(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(line.as_bytes())?;
    file.write_all(b"\n")?;
    file.seek(SeekFrom::Start(0))?;
    Ok(file.into())
}

/// Collects children that exited: a daemon `linnet helper` started before
/// it became the relay is this process's child now.
fn reap_children() {
    // SAFETY: waitpid with no status pointer; it never blocks with WNOHANG.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
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

/// Removes the socket file the relay bound, when it exits.
struct SocketFile(Option<PathBuf>);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    fn args() -> RelayArgs {
        RelayArgs {
            interface: Interface::Attached {
                tap: 5,
                interface_id: "6b1c6b70-1111-4c4c-9c9c-000000000001".parse().unwrap(),
            },
            daemon: 4,
            mtu: 1500,
            socket: VmmSocket::DgramPath(PathBuf::from(OsStr::from_bytes(b"/tmp/vm\xff.sock"))),
            header: ClientHeader::Virtio(12),
            announce: Some(6),
            reclaim: Some(("/run/linnet/linnet.sock".into(), 7)),
            log: Some("linnet=debug".into()),
        }
    }

    #[test]
    fn what_helper_passes_is_what_the_relay_reads() {
        for socket in [
            VmmSocket::DgramFd(3),
            VmmSocket::DgramPath("/tmp/vm.sock".into()),
            VmmSocket::StreamFd(3),
            VmmSocket::StreamPath("/tmp/vm.sock".into()),
            VmmSocket::VhostUserPath("/tmp/vm.vhost".into()),
        ] {
            let bare = RelayArgs {
                socket,
                header: ClientHeader::None,
                announce: None,
                reclaim: None,
                log: None,
                ..args()
            };
            assert_eq!(RelayArgs::parse(bare.to_args()), Ok(bare.clone()));
        }
        // A path need not be UTF-8.
        assert_eq!(RelayArgs::parse(args().to_args()), Ok(args()));
        // What the daemon passes for a network socket's connection.
        let network_socket = RelayArgs {
            interface: Interface::OnFirstFrame {
                network: "shared".into(),
            },
            socket: VmmSocket::StreamFd(3),
            header: ClientHeader::None,
            announce: None,
            log: None,
            ..args()
        };
        assert_eq!(
            RelayArgs::parse(network_socket.to_args()),
            Ok(network_socket)
        );
    }

    #[test]
    fn a_first_frame_gives_its_source_mac_or_what_is_wrong_with_it() {
        let head = |len: u32, src: [u8; 6]| {
            let mut h = [0u8; FIRST_FRAME_HEAD];
            h[..4].copy_from_slice(&len.to_be_bytes());
            h[4..10].copy_from_slice(&[0xff; 6]);
            h[10..].copy_from_slice(&src);
            h
        };
        let vm = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        assert_eq!(
            first_frame_source(&head(342, vm), 1518).map(|m| m.to_string()),
            Ok("52:54:00:12:34:56".into())
        );
        assert_eq!(first_frame_source(&head(1518, vm), 1518), Ok(MacAddr(vm)));
        for len in [0, 13, 1519, u32::MAX] {
            let e = first_frame_source(&head(len, vm), 1518).unwrap_err();
            assert!(
                e.starts_with(&format!(
                    "has a length of {len} bytes, not one of 14 to 1518"
                )),
                "{e}"
            );
        }
        for src in [[0; 6], [0x01, 0x00, 0x5e, 0, 0, 1], [0xff; 6]] {
            let e = first_frame_source(&head(60, src), 1518).unwrap_err();
            assert!(e.ends_with("which is not a unicast MAC"), "{e}");
        }
    }

    #[test]
    fn a_wrong_command_line_is_refused_with_what_is_wrong() {
        let parse = |args: &[&str]| RelayArgs::parse(args.iter().map(OsString::from));
        let mut line: Vec<OsString> = args().to_args();
        line.extend(["--stream-fd".into(), "3".into()]);
        assert_eq!(
            RelayArgs::parse(line),
            Err(
                "give one of --fd, --socket, --stream-fd, --stream-socket, --vhost-user-socket"
                    .into()
            )
        );
        assert_eq!(
            parse(&["--tap", "3", "--daemon", "4", "--mtu", "1500", "--fd", "5"]),
            Err("--interface-id is missing".into())
        );
        assert_eq!(
            parse(&[
                "--attach-on-first-frame",
                "shared",
                "--tap",
                "3",
                "--daemon",
                "4",
                "--mtu",
                "1500",
                "--stream-fd",
                "5"
            ]),
            Err("give --attach-on-first-frame or --tap and --interface-id".into())
        );
        assert_eq!(
            parse(&[
                "--attach-on-first-frame",
                "shared",
                "--daemon",
                "4",
                "--mtu",
                "1500",
                "--fd",
                "5"
            ]),
            Err("--attach-on-first-frame takes the VM's stream as --stream-fd".into())
        );
        assert_eq!(parse(&["--tap"]), Err("--tap needs a value".into()));
        assert_eq!(
            parse(&["--tap", "three"]),
            Err("--tap: not a number: three".into())
        );
        assert_eq!(
            parse(&["--vnet-hdr-size", "11"]),
            Err("--vnet-hdr-size: a virtio-net header is 10 or 12 bytes, not 11".into())
        );
        assert_eq!(
            parse(&["--verbose", "1"]),
            Err("unknown argument --verbose".into())
        );
    }
}
